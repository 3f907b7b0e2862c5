#!/usr/bin/env python3
"""Joins a new session keyring, puts a secret 'user' key in it, then execs the command:
a process started by the user's shell has its session keyring the same way.
usage: keyring_run.py SECRET -- CMD..."""
import ctypes, os, sys

libc = ctypes.CDLL(None, use_errno=True)
# (add_key, request_key, keyctl) syscall numbers; glibc has no wrappers for them.
NR = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219), "riscv64": (217, 218, 219)}
ADD_KEY, REQUEST_KEY, KEYCTL = NR[os.uname().machine]
KEYCTL_JOIN_SESSION_KEYRING = 1
KEY_SPEC_SESSION_KEYRING = -3
if libc.syscall(KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
    sys.exit("keyctl join failed: errno %d" % ctypes.get_errno())
secret = sys.argv[1].encode()
if libc.syscall(ADD_KEY, b"user", b"claudebox-test-secret", secret, ctypes.c_size_t(len(secret)),
                ctypes.c_int(KEY_SPEC_SESSION_KEYRING)) < 0:
    sys.exit("add_key failed: errno %d" % ctypes.get_errno())
assert sys.argv[2] == "--"
os.execvp(sys.argv[3], sys.argv[3:])
