#!/usr/bin/env python3
"""Starts a setuid-root program that waits (su asking for a password, or running `sleep`) and
prints ELEVATED when it runs with an effective uid of 0 while the caller is not root, or
with any effective capability. usage: setuid_probe.py PROGRAM [ARGS...]"""
import os, subprocess, sys, time

p = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
want = os.path.basename(sys.argv[1])[:15]
status = None
for _ in range(4000):  # wait until the child has exec'd the program (or exited)
    try:
        # /proc/PID/status stays readable for a setuid process (exe does not).
        st = open(f"/proc/{p.pid}/status").read()
        # Sleeping under the program's name: exec (and its credential change) is done
        # and it waits (for the password or for its command).
        if st.startswith(f"Name:\t{want}\n") and "\nState:\tS" in st:
            status = st
            break
    except OSError:
        pass
    if p.poll() is not None:
        break
    time.sleep(0.005)
p.kill()
p.wait()
if status is None:
    print("NOT-STARTED")
    sys.exit(0)
fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
euid = int(fields["Uid"].split()[1])
capeff = int(fields["CapEff"].strip(), 16)
print(f"euid={euid} capeff={capeff:x}")
if (euid == 0 and os.getuid() != 0) or capeff != 0:
    print("ELEVATED")
