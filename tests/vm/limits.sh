#!/usr/bin/env bash
# Boots Ubuntu's kernel (cgroup v2 with the memory, pids and cpu controllers) in qemu with
# the harness of tests/vm/lib.sh, once for both ways claudebox applies limits (the guest's
# console on stdout, each result a line `RESULT <step> <what> <value>`).
#
# The delegated cgroup: root delegates the cgroup /u1000 to uid 1000 (the directory and its
# cgroup.procs, cgroup.subtree_control, cgroup.threads, as systemd does for a user manager;
# the user's shell in /u1000/shell), leaves uid 1001 none, and runs as those users:
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
# Then the systemd mechanism (`systemd-run --user --scope`), when this machine has systemd:
# its manager binary, systemd-run, systemctl and their libraries are copied into the guest
# root; root lays out the cgroups systemd's system manager would
# (user.slice/user-1000.slice/user@1000.service delegated to uid 1000, controllers enabled
# down to it) and starts `systemd --user` for uid 1000 there, with
# XDG_RUNTIME_DIR=/run/user/1000, as user@1000.service would. No system manager, no D-Bus:
# `systemd-run --user --scope` talks to the user manager on its private socket. The
# user's shell runs in a leaf of the delegated subtree (so the manager may move it into a
# scope). Steps (without systemd: `RESULT sd-manager absent yes` and none of these):
#   sd-manager  the user manager's private socket appeared; a plain scope starts
#   sd-check    claudebox --check's limits row (systemd)
#   sd-dry      --dry-run's argv prefix with --memory/--pids (systemd-run ...)
#   sd-tree     the fork tree with --pids 64, and with --pids max (control)
#   sd-mem      300 MB allocated with --memory 64M, and with --memory max (control)
#   sd-left     scopes of claudebox left in the manager's tree, and units
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

# This machine's systemd, when it has one: the manager, systemd-run and systemctl.
sd=/usr/lib/systemd/systemd
if [[ -x "$sd" ]] && command -v systemd-run >/dev/null && command -v systemctl >/dev/null; then
    mkdir -p "$p/usr/lib/systemd/user" "$p/etc/systemd/user"
    cp "$sd" "$p/usr/lib/systemd/systemd"
    cp "$(command -v systemd-run)" "$p/usr/bin/systemd-run"
    cp "$(command -v systemctl)" "$p/usr/bin/systemctl"
    for lib in $(ldd "$sd" "$(command -v systemd-run)" "$(command -v systemctl)" | awk '/=>/ {print $3}' | sort -u); do
        cp -L "$lib" "$p/usr/lib/x86_64-linux-gnu/"
    done
    printf '[Unit]\nDescription=Default\n' >"$p/usr/lib/systemd/user/default.target"
    printf '0123456789abcdef0123456789abcdef\n' >"$p/etc/machine-id"
else
    log "no systemd here: the systemd steps are left out"
fi

cat >"$p/test.sh" <<'TEST'
#!/bin/busybox sh
. /vm.sh
mount -t tmpfs -o mode=755 run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
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

# A bounded fork tree: 2^9 shells that each sleep; the most tasks seen from inside (300
# looks, or until 600 are seen: that is far past the limit, which is what the control shows).
TREE='f() { if [ $1 -gt 0 ]; then f $(($1-1)) & f $(($1-1)); fi; sleep 3; }; f 9 2>/dev/null & m=0; i=0; while [ $i -lt 300 ] && [ $m -lt 600 ]; do set -- /proc/[0-9]*; [ $# -gt $m ] && m=$#; i=$((i+1)); done; echo $m'
# 300 MB, dd's one block, filled from /dev/zero: "1+0 records in" when the whole block was
# read into it. (Built up in a shell variable instead, the two runs took 90 of the VM's 150 s.)
ALLOC='dd if=/dev/zero of=/dev/null bs=314572800 count=1 iflag=fullblock 2>&1 | head -n 1'

u claudebox --check 2>&1 | grep -E '^(ok|warn|fail) +limits ' | sed 's/^/RESULT check u1000 /'
o claudebox --check 2>&1 | grep -E '^(ok|warn|fail) +limits ' | sed 's/^/RESULT check u1001 /'
u claudebox --memory 256M --cpu 1.5 --dry-run --exec true 2>/dev/null | sed -n '/^# limits/,/^#/p' | grep -v '^#' | cut -f1,2,3 | tr '\t' ' ' | sed 's/^/RESULT dry row /'

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

# The systemd mechanism: uid 1000's user manager in user@1000.service, delegated.
if [ ! -x /usr/lib/systemd/systemd ]; then
    r sd-manager absent yes
    r done all yes
    poweroff -f
fi
S=$C/user.slice/user-1000.slice/user@1000.service
mkdir -p $S/shell $S/init.scope
for d in $C/user.slice $C/user.slice/user-1000.slice; do
    echo "+pids +memory +cpu" >$d/cgroup.subtree_control
done
chown -R 1000:1000 $S
mkdir -p /run/user/1000 /run/systemd/system; chown 1000:1000 /run/user/1000; chmod 700 /run/user/1000
RT=/run/user/1000
# sd CMD...: runs CMD as uid 1000 from the delegated leaf, in the project, plain environment
# with the manager's XDG_RUNTIME_DIR (without it, claudebox uses the delegated cgroup).
sd() {
    sh -c 'echo $$ >"$1/cgroup.procs" && cd /home/user/proj && shift && exec "$@"' sh "$S/shell" \
        /usr/bin/setpriv --reuid=1000 --regid=1000 --clear-groups env -i HOME=/home/user \
        PATH=/usr/local/bin:/usr/bin:/opt/bb TMPDIR=/tmp XDG_RUNTIME_DIR=$RT "$@"
}
# The user manager, as user@1000.service runs it (in the service's own cgroup).
sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$S/init.scope" \
    /usr/bin/setpriv --reuid=1000 --regid=1000 --clear-groups env -i HOME=/home/user \
    XDG_RUNTIME_DIR=$RT PATH=/usr/bin:/opt/bb SYSTEMD_LOG_LEVEL=notice \
    /usr/lib/systemd/systemd --user >/tmp/manager.log 2>&1 &
i=0; while [ $i -lt 150 ] && [ ! -S $RT/systemd/private ]; do sleep 0.2; i=$((i+1)); done
r sd-manager socket "$([ -S $RT/systemd/private ] && echo yes || echo no)"
[ -S $RT/systemd/private ] || { sed 's/^/MANAGER /' /tmp/manager.log | head -n 30; }
sd systemd-run --user --scope --quiet true; r sd-manager plain-scope-rc $?
sd claudebox --check 2>&1 | grep -E '^(ok|warn|fail) +limits ' | sed 's/^/RESULT sd-check row /'
sd claudebox --memory 256M --pids 64 --dry-run --exec true 2>/dev/null | grep -o 'systemd-run[^\\]*' | head -n 3 | sed 's/^/RESULT sd-dry argv /'

r sd-tree limited "$(sd claudebox --pids 64 --exec sh -c "$TREE" 2>/tmp/tree.err)"
r sd-tree limited-err "$(head -c 300 /tmp/tree.err | tr '\n' '|')"
r sd-tree unlimited "$(sd claudebox --pids max --exec sh -c "$TREE" 2>/tmp/tree2.err)"
r sd-tree unlimited-err "$(head -c 300 /tmp/tree2.err | tr '\n' '|')"
sleep 3

sd claudebox --memory 64M --exec sh -c "$ALLOC" >/tmp/mem.out 2>/tmp/mem.err; r sd-mem limited-rc $?
r sd-mem limited-out "$(cat /tmp/mem.out)"
r sd-mem limited-err "$(head -c 600 /tmp/mem.err | tr '\n' '|')"
sd claudebox --memory max --exec sh -c "$ALLOC" >/tmp/mem.out 2>/tmp/mem.err; r sd-mem unlimited-rc $?
r sd-mem unlimited-out "$(cat /tmp/mem.out)"
r sd-mem unlimited-err "$(head -c 300 /tmp/mem.err | tr '\n' '|')"
sleep 1
r sd-left scopes "$(find $S -name 'claudebox-*' -type d 2>/dev/null | wc -l)"
r sd-left units "$(sd systemctl --user list-units --all --no-legend 'claudebox-*' 2>&1 | wc -l)"
r done all yes
poweroff -f
TEST
chmod 755 "$p/test.sh"

vm_boot "$work" "$p"
