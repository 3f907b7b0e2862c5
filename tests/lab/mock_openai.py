#!/usr/bin/env python3
"""A mock of OpenAI's Responses API (streamed) for running the real Codex CLI offline.

Python 3 standard library only. Listens on 127.0.0.1 only (never another address).

    python3 tests/lab/mock_openai.py [--port N] [--port-file F] [--script F] [--log F]
                                     [--final-text T]

  --port N        port to listen on (default 0: the kernel picks a free one)
  --port-file F   write the port there (atomically, with a newline) once listening
  --script F      the conversation to play: a JSON list of turns (format below)
  --log F         append one JSON line per request: id, time, method, path, headers
                  (credentials shown as length and last 4 characters), body (parsed
                  JSON, or text), kind and, for the conversation, turn
  --final-text T  what to answer once the script is used up (default below)

Point Codex at it with a model provider in its config.toml:

    model = "mock-model"
    model_provider = "mock"
    [model_providers.mock]
    name = "mock"
    base_url = "http://127.0.0.1:PORT/v1"
    env_key = "MOCK_OPENAI_KEY"
    wire_api = "responses"

A turn is
  "some text"                         an assistant message
  {"shell": "COMMAND"}                a call of Codex's shell tool running COMMAND with
                                      bash -lc (whichever shell tool the request offers:
                                      shell, shell_command or exec_command)

After a tool turn Codex runs the command and sends its output in the next request,
which takes the next turn. Each POST .../responses is answered as server-sent events:
response.created, response.output_item.added, response.output_text.delta (text),
response.output_item.done, response.completed. Requests that offer no tools (Codex's
side calls: titles, compaction) get a short text and take no turn. GET .../models
answers an empty list; other paths 404.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_FINAL_TEXT = "MOCK: the script is over."

LOCK = threading.Lock()
STATE = {"next": 0, "id": 0}
ARGS = None
TURNS = []


def next_id():
    with LOCK:
        STATE["id"] += 1
        return STATE["id"]


def take():
    with LOCK:
        i = STATE["next"]
        if i < len(TURNS):
            STATE["next"] += 1
            return i, TURNS[i]
        return None, ARGS.final_text


def redact(name, value):
    if name.lower() in ("authorization", "x-api-key", "cookie"):
        return "<%d chars, ...%s>" % (len(value), value[-4:])
    return value


def tool_names(body):
    names = []
    for t in body.get("tools") or []:
        if isinstance(t, dict):
            names.append(t.get("name") or (t.get("function") or {}).get("name") or t.get("type"))
    return [n for n in names if n]


def shell_call(command, offered, n):
    """A function_call item for whichever shell tool Codex offered."""
    if "shell" in offered:
        name, args = "shell", {"command": ["bash", "-lc", command], "timeout_ms": 60000}
    elif "shell_command" in offered:
        name, args = "shell_command", {"command": command, "timeout_ms": 60000}
    elif "exec_command" in offered:
        name, args = "exec_command", {"cmd": command}
    else:
        name, args = "shell", {"command": ["bash", "-lc", command]}
    return {"type": "function_call", "id": "fc_%d" % n, "call_id": "call_%d" % n,
            "name": name, "arguments": json.dumps(args), "status": "completed"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the JSON log is the record
        pass

    def record(self, body, kind, turn=None):
        if not ARGS.log:
            return
        entry = {"id": next_id(), "time": time.time(), "method": self.command,
                 "path": self.path,
                 "headers": {k: redact(k, v) for k, v in self.headers.items()},
                 "body": body, "kind": kind}
        if turn is not None:
            entry["turn"] = turn
        with LOCK:
            with open(ARGS.log, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.split("?")[0].endswith("/models"):
            self.record(None, "models")
            return self.reply(200, {"object": "list", "data": [], "models": []})
        self.record(None, "other")
        self.reply(404, {"error": {"message": "not found", "type": "not_found"}})

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def do_POST(self):
        body = self.read_body()
        if not self.path.split("?")[0].endswith("/responses") or not isinstance(body, dict):
            self.record(body, "other")
            return self.reply(404, {"error": {"message": "not found", "type": "not_found"}})
        offered = tool_names(body)
        if not offered:
            self.record(body, "side")
            return self.stream([self.message("MOCK: side answer.", 0)])
        turn, t = take()
        self.record(body, "conversation", turn)
        n = next_id() * 1000
        if isinstance(t, dict) and "shell" in t:
            items = []
            if t.get("text"):
                items.append(self.message(t["text"], n))
            items.append(shell_call(t["shell"], offered, n + 1))
        else:
            items = [self.message(t if isinstance(t, str) else json.dumps(t), n)]
        self.stream(items)

    @staticmethod
    def message(text, n):
        return {"type": "message", "id": "msg_%d" % n, "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    def event(self, name, data):
        data = dict(data, type=name)
        self.wfile.write(("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode())
        self.wfile.flush()

    def stream(self, items):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        rid = "resp_%d" % next_id()
        resp = {"id": rid, "object": "response", "status": "in_progress", "output": []}
        try:
            self.event("response.created", {"response": resp})
            for i, item in enumerate(items):
                self.event("response.output_item.added", {"output_index": i, "item": dict(
                    item, status="in_progress",
                    **({"content": []} if item["type"] == "message" else {}))})
                if item["type"] == "message":
                    text = item["content"][0]["text"]
                    half = len(text) // 2
                    for piece in (text[:half], text[half:]):
                        if piece:
                            self.event("response.output_text.delta", {
                                "item_id": item["id"], "output_index": i,
                                "content_index": 0, "delta": piece})
                self.event("response.output_item.done", {"output_index": i, "item": item})
            done = dict(resp, status="completed", output=items, usage={
                "input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 10, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 110})
            self.event("response.completed", {"response": done})
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


def main():
    global ARGS, TURNS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--script")
    p.add_argument("--log")
    p.add_argument("--final-text", default=DEFAULT_FINAL_TEXT)
    ARGS = p.parse_args()
    if ARGS.script:
        with open(ARGS.script) as f:
            TURNS = json.load(f)
    srv = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    srv.daemon_threads = True
    port = srv.server_address[1]
    if ARGS.port_file:
        tmp = ARGS.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.rename(tmp, ARGS.port_file)
    print("mock-openai listening on http://127.0.0.1:%d" % port, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
