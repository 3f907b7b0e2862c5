#!/usr/bin/env bash
# Boots Ubuntu's kernel (cgroup v2 with the memory, pids and cpu controllers) in qemu with
# the harness of tests/vm/lib.sh; root delegates the cgroup /u1000 to uid 1000 (the
# directory and its cgroup.procs, cgroup.subtree_control, cgroup.threads, as systemd does
# for a user manager; the user's shell in /u1000/shell), leaves uid 1001 none, and runs as
# those users (the guest's console on stdout, each result a line `RESULT <step> <what> <value>`):
#   check   claudebox --check's limits row, for both users
#   dry     --dry-run's limits with --memory/--cpu, for uid 1000
#   tree    a bounded fork tree (2^9 shells) with --pids 64, and without a limit (control)
#   bomb    an endless fork bomb with --pids 64: a process outside starts meanwhile; ended
#           by killing the sandbox; the line that names the limit; the cgroup removed
#   mem     300 MB allocated with --memory 64M (the sandbox ends, status 137, the line),
#           and with --memory max (control: the allocation succeeds)
#   default the default process limit in the sandbox's cgroup during a plain launch
#   nodeleg uid 1001: --memory refused with one line; the default warns once
#
#   tests/vm/limits.sh CLAUDEBOX_BINARY
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
claudebox="$(realpath "${1:?usage: tests/vm/limits.sh CLAUDEBOX_BINARY}")"
log() { printf 'limits-vm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found (apt install qemu-system-x86)"
[[ "$(dpkg --print-architecture)" == amd64 ]] || die "amd64 only"

source "$ROOT/tests/vm/lib.sh"
cache="${CLAUDEBOX_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci}"
mkdir -p "$cache"
vm_fetch "$cache" "${UBUNTU_SUITE:-noble-updates}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
p="$work/p"
vm_root "$p" "$claudebox"

cat >"$p/test.sh" <<'TEST'
#!/bin/busybox sh
/bin/busybox mkdir -p /opt/bb
/bin/busybox --install -s /opt/bb
export PATH=/usr/local/bin:/usr/bin:/opt/bb
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
r() { echo "RESULT $1 $2 $3"; }
C=/sys/fs/cgroup
r kernel version "$(uname -r)"
r kernel controllers "$(cat $C/cgroup.controllers)"
echo "+pids +memory +cpu" >$C/cgroup.subtree_control
# uid 1000: /u1000 delegated (as systemd delegates user@1000.service), its shell in a leaf.
mkdir $C/u1000 $C/u1000/shell $C/nodeleg
echo "+pids +memory +cpu" >$C/u1000/cgroup.subtree_control
chown 1000:1000 $C/u1000 $C/u1000/cgroup.procs $C/u1000/cgroup.subtree_control $C/u1000/cgroup.threads
chown -R 1000:1000 $C/u1000/shell
# as UID CGROUP DIR CMD...: runs CMD as UID from CGROUP, in DIR, with a plain environment.
as() {
    uid=$1 cg=$2 dir=$3; shift 3
    home=/home/user; [ "$uid" = 1001 ] && home=/home/other
    sh -c 'echo $$ >"$1/cgroup.procs" && cd "$2" && shift 2 && exec "$@"' sh "$cg" "$dir" \
        /usr/bin/setpriv --reuid=$uid --regid=$uid --clear-groups env -i HOME=$home PATH=/usr/local/bin:/usr/bin:/opt/bb TMPDIR=/tmp "$@"
}
u() { as 1000 $C/u1000/shell /home/user/proj "$@"; }
o() { as 1001 $C/nodeleg /home/other/proj "$@"; }
# line FILE: claudebox's line after the sandbox (printed once the cgroup empties).
line() {
    for i in 1 2 3 4 5 6 7 8 9 10; do grep -q '^claudebox: the sandbox' "$1" && break; sleep 0.3; done
    grep '^claudebox: the sandbox' "$1" | head -n1
}
cgroups() { ls -d $C/u1000/claudebox-* 2>/dev/null | wc -l; }

u claudebox --check 2>&1 | grep -E '^(ok|warn|fail) +limits ' | sed 's/^/RESULT check u1000 /'
o claudebox --check 2>&1 | grep -E '^(ok|warn|fail) +limits ' | sed 's/^/RESULT check u1001 /'
u claudebox --memory 256M --cpu 1.5 --dry-run --exec true 2>/dev/null | sed -n '/^# limits/,/^#/p' | grep -v '^#' | cut -f1,2,3 | tr '\t' ' ' | sed 's/^/RESULT dry row /'

# A bounded fork tree: 2^9 shells that each sleep; the most tasks seen from inside.
TREE='f() { if [ $1 -gt 0 ]; then f $(($1-1)) & f $(($1-1)); fi; sleep 3; }; f 9 2>/dev/null & m=0; i=0; while [ $i -lt 300 ]; do set -- /proc/[0-9]*; [ $# -gt $m ] && m=$#; i=$((i+1)); done; echo $m'
r tree limited "$(u claudebox --pids 64 --exec sh -c "$TREE" 2>/tmp/tree.err)"
r tree limited-line "$(line /tmp/tree.err)"
r tree unlimited "$(u claudebox --pids max --exec sh -c "$TREE" 2>/dev/null)"
sleep 3

# An endless fork bomb (bash's, which retries a fork that fails) under --pids 64, in the
# background; the agent then waits without forking.
u claudebox --pids 64 --exec bash -c 'b() { b | b & }; b 2>/dev/null; exec sleep 600' 2>/tmp/bomb.err &
bomb=$!
i=0; n=0
while [ $i -lt 200 ]; do
    n=$(cat $C/u1000/claudebox-*/pids.current 2>/dev/null || echo 0)
    [ "${n:-0}" -ge 60 ] && break
    sleep 0.2; i=$((i+1))
done
peak=0; i=0
while [ $i -lt 20 ]; do
    n=$(cat $C/u1000/claudebox-*/pids.current 2>/dev/null || echo 0)
    [ "${n:-0}" -gt $peak ] && peak=$n
    sleep 0.1; i=$((i+1))
done
r bomb cgroup-peak $peak
r bomb cgroup-max "$(cat $C/u1000/claudebox-*/pids.max)"
r bomb cgroup-hits "$(cat $C/u1000/claudebox-*/pids.events)"
true; r bomb outside-root-rc $?
u sh -c 'id -u' >/tmp/out 2>&1; r bomb outside-user-rc $?
r bomb outside-user "$(cat /tmp/out)"
r bomb running "$(kill -0 $bomb && echo yes)"
kill -KILL $bomb
wait $bomb; r bomb rc $?
r bomb line "$(line /tmp/bomb.err)"
sleep 1
r bomb cgroups-left "$(cgroups)"

# Memory: 300 MB, dd's one block, filled from /dev/zero: "1+0 records in" when the whole
# block was read into it. (Built up in a shell variable instead, the two runs took 90 of
# the VM's 150 s under TCG.)
ALLOC='dd if=/dev/zero of=/dev/null bs=314572800 count=1 iflag=fullblock 2>&1 | head -n 1'
u claudebox --memory 64M --exec sh -c "$ALLOC" >/tmp/mem.out 2>/tmp/mem.err; r mem limited-rc $?
r mem limited-out "$(cat /tmp/mem.out)"
r mem limited-line "$(line /tmp/mem.err)"
u claudebox --memory max --exec sh -c "$ALLOC" >/tmp/mem.out 2>/tmp/mem.err; r mem unlimited-rc $?
r mem unlimited-out "$(cat /tmp/mem.out)"
r mem unlimited-line "$(line /tmp/mem.err)"

# The default: a plain launch gets the default process limit; no line after it.
u claudebox --exec sh -c 'sleep 4; exit 7' 2>/tmp/def.err &
d=$!
i=0
while [ $i -lt 100 ] && ! cat $C/u1000/claudebox-*/pids.max >/dev/null 2>&1; do sleep 0.1; i=$((i+1)); done
r default pids-max "$(cat $C/u1000/claudebox-*/pids.max)"
r default memory-max "$(cat $C/u1000/claudebox-*/memory.max)"
wait $d; r default rc $?
r default stderr "$(cat /tmp/def.err | head -n 1)"
sleep 1
r default cgroups-left "$(cgroups)"

# uid 1001, nothing delegated: a requested limit refuses, the default warns once.
o claudebox --memory 256M --exec true 2>/tmp/o.err; r nodeleg requested-rc $?
r nodeleg requested-lines "$(wc -l </tmp/o.err)"
r nodeleg requested-err "$(cat /tmp/o.err)"
o claudebox --exec true 2>/tmp/o.err; r nodeleg default-rc $?
r nodeleg default-err "$(cat /tmp/o.err)"
o claudebox --exec true 2>/tmp/o.err; r nodeleg again-rc $?
r nodeleg again-lines "$(wc -l </tmp/o.err)"
r done all yes
poweroff -f
TEST
chmod 755 "$p/test.sh"

vm_boot "$work" "$p"
