#!/usr/bin/env python3
"""A user's own HTTP proxy for the login broker's tests: answers CONNECT only, counts
each tunnel, and sends every tunnel on to one fixed address (the lab's mock, itself a
TLS-terminating proxy), so nothing leaves the machine. Python 3 standard library only.

    python3 tests/lab/connect_proxy.py --port-file F --log F --next HOST:PORT [--auth B64]

  --log F      one line per CONNECT: `<target> <proxy-authorization or ->`
  --next A     where each tunnel goes: the same CONNECT line is sent there and its
               answer passed back, then bytes both ways
  --auth B64   require `Proxy-Authorization: Basic B64` (407 otherwise)
"""

import argparse
import os
import socket
import socketserver
import threading


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        s = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            b = s.recv(4096)
            if not b or len(head) > 65536:
                return
            head += b
        lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
        parts = lines[0].split()
        auth = "-"
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == "proxy-authorization":
                auth = v.strip()
        srv = self.server
        with srv.lock:
            with open(srv.log, "a") as f:
                f.write("%s %s\n" % (parts[1] if len(parts) > 1 else "?", auth))
        if len(parts) < 2 or parts[0] != "CONNECT":
            s.sendall(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
            return
        if srv.auth and auth != "Basic " + srv.auth:
            s.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
            return
        host, port = srv.next.rsplit(":", 1)
        up = socket.create_connection((host, int(port)))
        up.sendall(("CONNECT %s HTTP/1.1\r\nhost: %s\r\n\r\n" % (parts[1], parts[1])).encode())

        def pump(a, b):
            try:
                while True:
                    d = a.recv(65536)
                    if not d:
                        break
                    b.sendall(d)
            except OSError:
                pass
            try:
                b.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        t = threading.Thread(target=pump, args=(up, s), daemon=True)
        t.start()
        pump(s, up)
        t.join()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--next", required=True)
    ap.add_argument("--auth")
    a = ap.parse_args()
    srv = Server(("127.0.0.1", 0), Handler)
    srv.lock = threading.Lock()
    srv.log, srv.next, srv.auth = a.log, a.next, a.auth
    open(a.log, "a").close()
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(tmp, a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
