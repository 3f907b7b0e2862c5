#!/usr/bin/env python3
"""Runs a command on a new pseudo-terminal that becomes its controlling terminal, as a
user's terminal would be. usage: pty_run.py ROWS COLS [--resize ROWS COLS] -- CMD...
With --resize, once the command prints READY-FOR-RESIZE the terminal is resized (the
kernel then sends SIGWINCH to the foreground process group). Prints what the command
wrote and exits with its status."""
import fcntl, os, pty, struct, sys, termios

args = sys.argv[1:]
rows, cols = int(args[0]), int(args[1])
resize = None
if args[2] == "--resize":
    resize = (int(args[3]), int(args[4]))
    args = args[5:]
else:
    args = args[2:]
assert args[0] == "--"
cmd = args[1:]

pid, master = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    os.execvp(cmd[0], cmd)

out = b""
while True:
    try:
        chunk = os.read(master, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
    if resize and b"READY-FOR-RESIZE" in out:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", resize[0], resize[1], 0, 0))
        resize = None
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode("utf-8", "replace"))
sys.stdout.flush()
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
