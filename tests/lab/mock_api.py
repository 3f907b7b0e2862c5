#!/usr/bin/env python3
"""A mock of the Anthropic Messages API for running the real Claude Code offline.

Python 3 standard library only. Listens on 127.0.0.1 only (never another address).

    python3 tests/lab/mock_api.py [--port N] [--port-file F] [--script F] [--log F]
                                  [--final-text T]

  --port N        port to listen on (default 0: the kernel picks a free one)
  --port-file F   write the port there (atomically, with a newline) once listening
  --script F      the conversation to play, a JSON file (format below)
  --log F         append one JSON line per request: id (1, 2, ...), time, method, path,
                  headers (credentials shown as length and last 4 characters), body (parsed JSON, or text), kind and, for the conversation,
                  turn; and after each answer to a POST /v1/messages a line
                  {"kind": "end", "request_id": ID, "complete": BOOL} (false when the
                  client went away mid-answer)
  --final-text T  what to answer once the script is used up (default below)
  --oauth DIR     also play Claude Code's OAuth server (token refresh, profile, roles)
                  behind an HTTPS proxy on the same port: makes DIR/cert.pem (a
                  certificate authority, with the openssl command) and a certificate
                  for the OAuth hosts below signed by it, then answers CONNECT to those hosts with TLS under that
                  certificate and serves the same routes inside; CONNECT to any other
                  host gets 403, so nothing leaves the machine. Point claude at it with
                  HTTPS_PROXY=http://127.0.0.1:PORT NO_PROXY=127.0.0.1,localhost
                  NODE_EXTRA_CA_CERTS=DIR/cert.pem (claude's token URL is fixed at
                  https://platform.claude.com/v1/oauth/token; CLAUDE_CODE_CUSTOM_OAUTH_URL
                  only takes three approved https origins).
  --refresh-token T  with --oauth, the login's refresh token (the seeded one); others
                  the mock did not issue are refused
  --access-token T   with --oauth, an access token taken as issued (a live login);
                  a plain POST /mock/revoke {"access": T} (not through a tunnel) stops
                  taking it, as a revoked token
  --api-key K     the API key the Messages API takes (repeatable): a POST with another
                  x-api-key, or a bearer `sk-ant-api...` (claude sends an apiKeyHelper's
                  key as both) not among them, gets 401; without it any key goes

OAuth (with --oauth), modelled on Anthropic's: refresh tokens are single-use. POST
/v1/oauth/token {"grant_type": "refresh_token", "refresh_token": R} answers a new pair
(access sk-ant-oat01-mock-aNNNN, refresh sk-ant-ort01-mock-rNNNN, expires_in 28800) when
R is live, and spends R; a spent or unknown R gets 400 {"error": "invalid_grant"}. Each
is logged as kind "oauth_refresh" with "old" (R's last 4), "new" (the new refresh
token's last 4, null when refused). GET /api/oauth/profile and
/api/oauth/claude_cli/roles answer a Max account. A POST /v1/messages carrying
`Authorization: Bearer T` gets 401 unless the mock issued T.

It also prints `mock-api listening on http://127.0.0.1:PORT` on stdout. Point claude
at it with ANTHROPIC_BASE_URL=http://127.0.0.1:PORT ANTHROPIC_API_KEY=anything.

Script format: a JSON list of turns, or an object {"turns": [...], "final_text": "...",
"chunk_delay_ms": N, "token_delay_ms": N, "token_expires_in": S, "token_dies_after": S}
(the last three, with --oauth: how long the token endpoint waits before answering, the
expires_in it answers (28800 unless set), and how many seconds after the answer the
access token it issued is refused as expired (never unless set)). Each request of the conversation itself (a POST /v1/messages that
offers tools) takes the next turn; when none is left it gets the final text. A turn is

  "some text"                                      an answer in text
  {"text": "...", "chunks": N, "chunk_delay_ms": M} the same, streamed in N pieces with
                                                   M ms between them (so a test can
                                                   interrupt it mid-answer)
  {"bash": {"command": "...", "description": "..."}}   a tool_use of claude's Bash tool
  {"write": {"file_path": "/abs/path", "content": "..."}} a tool_use of its Write tool
  {"tool": "Name", "input": {...}}                 a tool_use of any other tool

A tool turn may also carry "text" (said before the call) and "chunk_delay_ms". After a
tool turn claude runs the tool and sends its result in the next request, which takes the
next turn: [{"bash": ...}, "done"] is a tool call followed by a closing answer.

Side calls never take a turn: requests without tools are claude's own helpers (session
titles ask for JSON through output_config.format -> a JSON title; the auto-mode
classifier of 2.1.330 is stream false -> "<block>no</block>", which lets a tool call
through; anything else -> a short text). POST /v1/messages/count_tokens answers
{"input_tokens": 100}; HEAD / and HEAD /api/hello answer 200; any other path answers
404 with an error body.
"""

import argparse
import json
import os
import socketserver
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_FINAL_TEXT = "MOCK: the script is over."
MODEL = "claude-mock-1"

# The hosts Claude Code's OAuth code calls (TOKEN_URL, BASE_API_URL's profile and roles,
# the authorize pages), the only ones the --oauth proxy terminates.
OAUTH_HOSTS = ("platform.claude.com", "api.anthropic.com", "claude.ai",
               "console.anthropic.com", "claude.com")


class OAuth:
    """The token server's state: which refresh tokens are live, which access tokens
    were issued. Single-use refresh tokens, as Anthropic rotates them."""

    def __init__(self, seed):
        self.live = {seed} if seed else set()
        self.spent = set()
        self.access = set()
        self.n = 0
        # With "token_dies_after" in the script: when each issued access token dies.
        self.dies = {}
        self.lock = threading.Lock()

    def refresh(self, old, dies_after=None):
        """(access, refresh) for a live `old` (which is spent), or None."""
        with self.lock:
            if old not in self.live:
                return None
            self.live.discard(old)
            self.spent.add(old)
            self.n += 1
            access = "sk-ant-oat01-mock-a%04d" % self.n
            new = "sk-ant-ort01-mock-r%04d" % self.n
            self.live.add(new)
            self.access.add(access)
            if dies_after is not None:
                self.dies[access] = time.time() + dies_after
            return access, new

    def issued(self, access):
        with self.lock:
            return access in self.access and time.time() < self.dies.get(access, float("inf"))


def make_cert(d):
    """A certificate authority (d/cert.pem, what clients trust) and a certificate for
    OAUTH_HOSTS signed by it (d/leaf.pem with the chain, d/leaf-key.pem): a client that
    refuses a CA certificate as a server's own (rustls, the login broker's upstream)
    accepts it too."""
    os.makedirs(d, exist_ok=True)
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    leaf, leaf_key = os.path.join(d, "leaf.pem"), os.path.join(d, "leaf-key.pem")
    csr, ext = os.path.join(d, "leaf.csr"), os.path.join(d, "leaf.ext")
    san = ",".join("DNS:" + h for h in OAUTH_HOSTS)

    def openssl(*args):
        subprocess.run(["openssl"] + list(args), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)

    # P-256 keys: each RSA-2048 pair took ~0.07 s of CPU, and a CI run starts ~200 OAuth
    # mocks per user (56 s of openssl in all, measured with process accounting).
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
    openssl("req", "-x509", *ec, "-nodes", "-days", "2",
            "-subj", "/CN=claudebox lab mock CA", "-keyout", key, "-out", cert,
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-new", *ec, "-nodes", "-subj",
            "/CN=claudebox lab mock OAuth", "-keyout", leaf_key, "-out", csr)
    with open(ext, "w") as f:
        f.write("subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\n"
                "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n" % san)
    openssl("x509", "-req", "-in", csr, "-CA", cert, "-CAkey", key, "-CAcreateserial",
            "-days", "2", "-out", leaf, "-extfile", ext)
    with open(leaf, "a") as out, open(cert) as ca:
        out.write(ca.read())
    return leaf, leaf_key


class Script:
    def __init__(self, turns, final_text, chunk_delay_ms):
        self.turns = list(turns)
        self.final_text = final_text
        self.chunk_delay_ms = chunk_delay_ms
        self.next = 0
        self.lock = threading.Lock()

    @staticmethod
    def load(path, final_text):
        turns, delay, token_delay, expires_in, dies_after = [], 0, 0, 28800, None
        if path:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if isinstance(data, dict):
                turns = data.get("turns", [])
                final_text = data.get("final_text", final_text)
                delay = int(data.get("chunk_delay_ms", 0))
                token_delay = int(data.get("token_delay_ms", 0))
                expires_in = int(data.get("token_expires_in", expires_in))
                dies_after = data.get("token_dies_after")
            else:
                turns = data
        script = Script(turns, final_text, delay)
        script.token_delay_ms = token_delay
        script.token_expires_in = expires_in
        script.token_dies_after = dies_after
        return script

    def take(self):
        """The next turn (and its index), or the final text (index None)."""
        with self.lock:
            if self.next < len(self.turns):
                i = self.next
                self.next += 1
                return i, self.turns[i]
        return None, self.final_text


def blocks_of(turn):
    """(content blocks, stop_reason, chunks, delay) of a script turn."""
    if isinstance(turn, str):
        turn = {"text": turn}
    blocks = []
    if turn.get("text"):
        blocks.append({"type": "text", "text": turn["text"]})
    tool = None
    if "bash" in turn:
        tool = ("Bash", turn["bash"])
    elif "write" in turn:
        tool = ("Write", turn["write"])
    elif "tool" in turn:
        tool = (turn["tool"], turn.get("input", {}))
    if tool:
        blocks.append({"type": "tool_use", "id": "toolu_mock_%d_%d" % (os.getpid(), next_id()),
                       "name": tool[0], "input": tool[1]})
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    stop = "tool_use" if tool else "end_turn"
    return blocks, stop, max(1, int(turn.get("chunks", 1))), turn.get("chunk_delay_ms")


_ids = [0]
_ids_lock = threading.Lock()


def next_id():
    with _ids_lock:
        _ids[0] += 1
        return _ids[0]


def split(s, n):
    n = max(1, min(n, len(s))) if s else 1
    size = -(-len(s) // n) if s else 1
    return [s[i:i + size] for i in range(0, len(s), size)] or [""]


SECRET_HEADERS = ("x-api-key", "authorization", "proxy-authorization", "cookie")


def redact(name, value):
    """Credentials are logged as their length and last 4 characters only: a user who
    points a logged-in claude at the mock should be able to share the log."""
    if name.lower() in SECRET_HEADERS:
        return "<redacted: %d chars, ends %r>" % (len(value), value[-4:])
    return value


def usage():
    return {"input_tokens": 10, "output_tokens": 10,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mock-anthropic/1"

    def log_message(self, fmt, *args):  # quiet: the JSON log is the record
        pass

    def record(self, body, kind, turn=None):
        srv = self.server
        with srv.log_lock:
            srv.count += 1
            self.request_id = srv.count
        entry = {
            "id": self.request_id,
            "time": time.time(),
            "method": self.command,
            "path": self.path,
            "host": getattr(self, "tunnel_host", None),
            "headers": {k.lower(): redact(k, v) for k, v in self.headers.items()},
            "body": body,
            "kind": kind,
        }
        if turn is not None:
            entry["turn"] = turn
        self.write_log(entry)

    def write_log(self, entry):
        srv = self.server
        if srv.log_path:
            line = json.dumps(entry) + "\n"
            with srv.log_lock, open(srv.log_path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()

    def reply(self, status, payload, ctype="application/json"):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_HEAD(self):
        self.record(None, "head")
        path = self.path.split("?")[0]
        self.reply(200 if path in ("/", "/api/hello") else 404, b"", "text/plain")

    def do_GET(self):
        path = self.path.split("?")[0]
        if self.server.oauth and path == "/api/oauth/profile":
            self.record(None, "oauth_profile")
            self.reply(200, {
                "account": {"uuid": "00000000-0000-4000-8000-00000000a001",
                            "email_address": "lab@example.invalid", "full_name": "Lab",
                            "display_name": "Lab", "has_claude_max": True,
                            "has_claude_pro": False, "created_at": "2025-01-01T00:00:00Z"},
                "organization": {"uuid": "00000000-0000-4000-8000-00000000b001",
                                 "name": "Lab", "organization_type": "claude_max",
                                 "billing_type": "stripe_subscription",
                                 "rate_limit_tier": "default_claude_max_20x",
                                 "has_extra_usage_enabled": False,
                                 "subscription_created_at": "2025-01-01T00:00:00Z"}})
            return
        if self.server.oauth and path == "/api/oauth/claude_cli/roles":
            self.record(None, "oauth_roles")
            self.reply(200, {"organization_role": "admin", "workspace_role": None,
                             "organization_name": "Lab"})
            return
        self.record(None, "other")
        self.not_found()

    def do_CONNECT(self):
        host, _, port = self.path.rpartition(":")
        self.record(None, "connect")
        if not self.server.tls or host not in OAUTH_HOSTS or port != "443":
            self.reply(403, b"mock: CONNECT only to the OAuth hosts\n", "text/plain")
            self.close_connection = True
            return
        self.send_response(200, "Connection Established")
        self.end_headers()
        self.wfile.flush()
        try:
            tls = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            self.close_connection = True
            return
        # The rest of this connection is HTTP inside the tunnel, served by the same routes.
        self.connection = self.request = tls
        self.rfile = tls.makefile("rb", self.rbufsize)
        self.wfile = socketserver._SocketWriter(tls)
        self.tunnel_host = host
        self.close_connection = False

    def token(self, body):
        body = body if isinstance(body, dict) else {}
        old = body.get("refresh_token") or ""
        time.sleep(self.server.script.token_delay_ms / 1000.0)
        got = self.server.oauth.refresh(old, self.server.script.token_dies_after) \
            if body.get("grant_type") == "refresh_token" else None
        self.write_log({"kind": "oauth_refresh", "time": time.time(), "old": old[-4:],
                        "new": got[1][-4:] if got else None})
        if not got:
            self.reply(400, {"error": "invalid_grant",
                             "error_description": "mock: refresh token not found or spent"})
            return
        self.reply(200, {"token_type": "Bearer", "access_token": got[0], "refresh_token": got[1],
                         "expires_in": self.server.script.token_expires_in, "scope": body.get("scope")
                         or "user:inference user:profile",
                         "account": {"uuid": "00000000-0000-4000-8000-00000000a001",
                                     "email_address": "lab@example.invalid"},
                         "organization": {"uuid": "00000000-0000-4000-8000-00000000b001",
                                          "name": "Lab"}})

    def do_other(self):
        self.record(self.read_body(), "other")
        self.not_found()

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_other

    def not_found(self):
        self.reply(404, {"type": "error",
                         "error": {"type": "not_found_error", "message": "mock: no such route"}})

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode("utf-8", "replace")

    def do_POST(self):
        body = self.read_body()
        path = self.path.split("?")[0]
        if self.server.oauth and path == "/mock/revoke" \
                and getattr(self, "tunnel_host", None) is None and isinstance(body, dict):
            # The test's own control (plain HTTP, never through a tunnel): the access
            # token named stops being taken, as when Anthropic revokes it.
            with self.server.oauth.lock:
                self.server.oauth.access.discard(body.get("access"))
            self.write_log({"kind": "revoke", "time": time.time(),
                            "access": str(body.get("access"))[-4:]})
            self.reply(200, {})
            return
        if self.server.oauth and path == "/v1/oauth/token":
            self.record({k: (redact("authorization", v) if "token" in k else v)
                         for k, v in body.items()} if isinstance(body, dict) else body,
                        "oauth_token")
            self.token(body)
            return
        auth = self.headers.get("Authorization") or ""
        keys = self.server.api_keys
        key = self.headers.get("x-api-key")
        if keys and ((key is not None and key not in keys)
                     or (auth.startswith("Bearer sk-ant-api") and auth[7:] not in keys)):
            self.record(body, "unauthorized")
            self.reply(401, {"type": "error", "error": {
                "type": "authentication_error", "message": "mock: invalid x-api-key"}})
            return
        if self.server.oauth and auth.startswith("Bearer ") and auth[7:] not in keys \
                and not self.server.oauth.issued(auth[7:]):
            self.record(body, "unauthorized")
            self.reply(401, {"type": "error", "error": {
                "type": "authentication_error",
                "message": "mock: OAuth token has expired or was not issued by the mock"}})
            return
        if path == "/v1/messages/count_tokens":
            self.record(body, "count_tokens")
            self.reply(200, {"input_tokens": 100})
            return
        if path != "/v1/messages" or not isinstance(body, dict):
            self.record(body, "other")
            self.not_found()
            return
        stream = bool(body.get("stream"))
        fmt = (body.get("output_config") or {}).get("format") or {}
        if body.get("tools"):
            turn_index, turn = self.server.script.take()
            self.record(body, "conversation", turn_index)
            delay = self.server.script.chunk_delay_ms
        elif fmt.get("type") == "json_schema":
            self.record(body, "title")
            turn, delay, turn_index = {"text": json.dumps({"title": "Mock session"})}, 0, None
        elif not stream:
            self.record(body, "classifier")
            turn, delay, turn_index = "<block>no</block>", 0, None
        else:
            self.record(body, "side")
            turn, delay, turn_index = "Mock side answer", 0, None
        blocks, stop, chunks, turn_delay = blocks_of(turn)
        if turn_delay is not None:
            delay = turn_delay
        complete = False
        try:
            if stream:
                self.stream(blocks, stop, chunks, delay / 1000.0)
            else:
                self.reply(200, self.message(blocks, stop))
            complete = True
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-answer (Ctrl-C): fine
        self.write_log({"kind": "end", "request_id": self.request_id, "time": time.time(),
                        "complete": complete})

    def message(self, blocks, stop):
        return {"id": "msg_mock_%d" % next_id(), "type": "message", "role": "assistant",
                "model": MODEL, "content": blocks, "stop_reason": stop,
                "stop_sequence": None, "usage": usage()}

    def event(self, name, data):
        self.wfile.write(("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode())
        self.wfile.flush()

    def stream(self, blocks, stop, chunks, delay):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        start = self.message([], None)
        self.event("message_start", {"type": "message_start", "message": start})
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                self.event("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": {"type": "text", "text": ""}})
                for piece in split(b["text"], chunks):
                    if delay:
                        time.sleep(delay)
                    self.event("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "text_delta",
                                                                 "text": piece}})
            else:
                self.event("content_block_start", {
                    "type": "content_block_start", "index": i,
                    "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"],
                                      "input": {}}})
                for piece in split(json.dumps(b["input"]), chunks):
                    if delay:
                        time.sleep(delay)
                    self.event("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "input_json_delta",
                                                                 "partial_json": piece}})
            self.event("content_block_stop", {"type": "content_block_stop", "index": i})
        self.event("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"output_tokens": 10}})
        self.event("message_stop", {"type": "message_stop"})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--script")
    ap.add_argument("--log")
    ap.add_argument("--final-text", default=DEFAULT_FINAL_TEXT)
    ap.add_argument("--oauth")
    ap.add_argument("--refresh-token")
    ap.add_argument("--access-token")
    ap.add_argument("--api-key", action="append", default=[])
    a = ap.parse_args()

    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.daemon_threads = True
    srv.script = Script.load(a.script, a.final_text)
    srv.log_path = a.log
    srv.log_lock = threading.Lock()
    srv.count = 0
    srv.oauth = srv.tls = None
    srv.api_keys = set(a.api_key)
    if a.oauth:
        srv.oauth = OAuth(a.refresh_token)
        if a.access_token:
            srv.oauth.access.add(a.access_token)
        srv.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        srv.tls.load_cert_chain(*make_cert(a.oauth))
    port = srv.server_address[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.rename(tmp, a.port_file)
    print("mock-api listening on http://127.0.0.1:%d" % port, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
