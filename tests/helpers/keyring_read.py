#!/usr/bin/env python3
"""Looks the secret key up in the caller's keyrings and prints ESCAPED with its payload
when it can read it."""
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219), "riscv64": (217, 218, 219)}
ADD_KEY, REQUEST_KEY, KEYCTL = NR[os.uname().machine]
KEYCTL_READ = 11
k = libc.syscall(REQUEST_KEY, b"user", b"claudebox-test-secret", None, ctypes.c_int(0))
if k < 0:
    print("request_key failed: errno %d" % ctypes.get_errno())
else:
    buf = ctypes.create_string_buffer(256)
    n = libc.syscall(KEYCTL, KEYCTL_READ, ctypes.c_int(k), buf, ctypes.c_size_t(256))
    if n > 0:
        print("ESCAPED key payload:", buf.raw[:n].decode())
    else:
        print("keyctl read failed: errno %d" % ctypes.get_errno())
