#!/usr/bin/env python3
"""Host-side IPC endpoints for the escape suite: unix sockets at the paths given and
abstract sockets (names given with a leading '@'). Prints READY once all listen; for every
accepted connection it creates MARKER_DIR/<index>. Runs until killed."""
import os, selectors, socket, sys

marker_dir = sys.argv[1]
sel = selectors.DefaultSelector()
for i, addr in enumerate(sys.argv[2:]):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0" + addr[1:] if addr.startswith("@") else addr)
    s.listen(8)
    sel.register(s, selectors.EVENT_READ, i)
print("READY", flush=True)
while True:
    for key, _ in sel.select():
        conn, _ = key.fileobj.accept()
        open(os.path.join(marker_dir, str(key.data)), "w").close()
        conn.close()
