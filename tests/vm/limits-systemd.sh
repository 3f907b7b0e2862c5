#!/usr/bin/env bash
# The systemd mechanism of the limits (`systemd-run --user --scope`), for real: boots the
# kernel of tests/vm/lib.sh with this machine's systemd (its manager binary, systemd-run
# and their libraries) copied into the guest root; root lays out the cgroups systemd's
# system manager would (user.slice/user-1000.slice/user@1000.service delegated to uid
# 1000, controllers enabled down to it) and starts `systemd --user` for uid 1000 there,
# with XDG_RUNTIME_DIR=/run/user/1000, as user@1000.service would. No system manager, no
# D-Bus: `systemd-run --user --scope` talks to the user manager on its private socket.
# The user's shell runs in a leaf of the delegated subtree (so the manager may move it
# into a scope). Each result a line `RESULT <step> <what> <value>`:
#   manager  the user manager's private socket appeared
#   check    claudebox --check's limits row (systemd)
#   dry      --dry-run's argv prefix with --memory/--pids (systemd-run ...)
#   tree     a bounded fork tree (2^9 shells) with --pids 64, and with --pids max (control)
#   mem      300 MB allocated with --memory 64M, and with --memory max (control)
#   scopes   scopes of claudebox left in the manager's tree afterwards
#
#   tests/vm/limits-systemd.sh CLAUDEBOX_BINARY
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
claudebox="$(realpath "${1:?usage: tests/vm/limits-systemd.sh CLAUDEBOX_BINARY}")"
log() { printf 'limits-systemd-vm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found (apt install qemu-system-x86)"
sd=/usr/lib/systemd/systemd
[[ -x "$sd" ]] && command -v systemd-run >/dev/null || die "systemd and systemd-run not found (apt install systemd)"

source "$ROOT/tests/vm/lib.sh"
cache="${CLAUDEBOX_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci}"
mkdir -p "$cache"
vm_fetch "$cache" "${UBUNTU_SUITE:-noble-updates}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
p="$work/p"
vm_root "$p" "$claudebox"
mkdir -p "$p/usr/lib/systemd/user" "$p/etc/systemd/user"
cp "$sd" "$p/usr/lib/systemd/systemd"
cp "$(command -v systemd-run)" "$p/usr/bin/systemd-run"
cp "$(command -v systemctl)" "$p/usr/bin/systemctl"
for lib in $(ldd "$sd" "$(command -v systemd-run)" "$(command -v systemctl)" | awk '/=>/ {print $3}' | sort -u); do
    cp -L "$lib" "$p/usr/lib/x86_64-linux-gnu/"
done
printf '[Unit]\nDescription=Default\n' >"$p/usr/lib/systemd/user/default.target"
: >"$p/etc/machine-id"
printf '0123456789abcdef0123456789abcdef\n' >"$p/etc/machine-id"

cat >"$p/test.sh" <<'TEST'
#!/bin/busybox sh
/bin/busybox mkdir -p /opt/bb
/bin/busybox --install -s /opt/bb
export PATH=/usr/local/bin:/usr/bin:/opt/bb
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t tmpfs -o mode=755 run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
r() { echo "RESULT $1 $2 $3"; }
C=/sys/fs/cgroup
S=$C/user.slice/user-1000.slice/user@1000.service
r kernel version "$(uname -r)"
mkdir -p $S/shell
for d in $C $C/user.slice $C/user.slice/user-1000.slice; do
    echo "+pids +memory +cpu" >$d/cgroup.subtree_control
done
chown -R 1000:1000 $S
mkdir -p /run/user/1000 /run/systemd/system; chown 1000:1000 /run/user/1000; chmod 700 /run/user/1000
RT=/run/user/1000
# as CMD...: runs CMD as uid 1000 from the delegated leaf, in the project, plain environment.
u() {
    sh -c 'echo $$ >"$1/cgroup.procs" && cd /home/user/proj && shift && exec "$@"' sh "$S/shell" \
        /usr/bin/setpriv --reuid=1000 --regid=1000 --clear-groups env -i HOME=/home/user \
        PATH=/usr/local/bin:/usr/bin:/opt/bb TMPDIR=/tmp XDG_RUNTIME_DIR=$RT "$@"
}
# The user manager, as user@1000.service runs it (in the service's own cgroup).
mkdir -p $S/init.scope; chown -R 1000:1000 $S/init.scope
sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$S/init.scope" \
    /usr/bin/setpriv --reuid=1000 --regid=1000 --clear-groups env -i HOME=/home/user \
    XDG_RUNTIME_DIR=$RT PATH=/usr/bin:/opt/bb SYSTEMD_LOG_LEVEL=notice \
    /usr/lib/systemd/systemd --user >/tmp/manager.log 2>&1 &
i=0; while [ $i -lt 150 ] && [ ! -S $RT/systemd/private ]; do sleep 0.2; i=$((i+1)); done
r manager socket "$([ -S $RT/systemd/private ] && echo yes || echo no)"
[ -S $RT/systemd/private ] || { sed 's/^/MANAGER /' /tmp/manager.log | head -n 30; }
u systemd-run --user --scope --quiet true; r manager plain-scope-rc $?
u claudebox --check 2>&1 | grep -E '^(ok|warn|fail) +limits ' | sed 's/^/RESULT check row /'
u claudebox --memory 256M --pids 64 --dry-run --exec true 2>/dev/null | grep -o 'systemd-run[^\\]*' | head -n 3 | sed 's/^/RESULT dry argv /'

TREE='f() { if [ $1 -gt 0 ]; then f $(($1-1)) & f $(($1-1)); fi; sleep 3; }; f 9 2>/dev/null & m=0; i=0; while [ $i -lt 300 ]; do set -- /proc/[0-9]*; [ $# -gt $m ] && m=$#; i=$((i+1)); done; echo $m'
r tree limited "$(u claudebox --pids 64 --exec sh -c "$TREE" 2>/tmp/tree.err)"
r tree limited-err "$(head -c 300 /tmp/tree.err | tr '\n' '|')"
r tree unlimited "$(u claudebox --pids max --exec sh -c "$TREE" 2>/tmp/tree2.err)"
r tree unlimited-err "$(head -c 300 /tmp/tree2.err | tr '\n' '|')"
sleep 3

ALLOC='x=$(head -c 314572800 /dev/zero | tr "\0" a); echo ${#x}'
u claudebox --memory 64M --exec sh -c "$ALLOC" >/tmp/mem.out 2>/tmp/mem.err; r mem limited-rc $?
r mem limited-out "$(cat /tmp/mem.out)"
r mem limited-err "$(head -c 600 /tmp/mem.err | tr '\n' '|')"
u claudebox --memory max --exec sh -c "$ALLOC" >/tmp/mem.out 2>/tmp/mem.err; r mem unlimited-rc $?
r mem unlimited-out "$(cat /tmp/mem.out)"
r mem unlimited-err "$(head -c 300 /tmp/mem.err | tr '\n' '|')"
sleep 1
r scopes left "$(find $S -name 'claudebox-*' -type d 2>/dev/null | wc -l)"
r units left "$(u systemctl --user list-units --all --no-legend 'claudebox-*' 2>&1 | wc -l)"
r done all yes
poweroff -f
TEST
chmod 755 "$p/test.sh"

vm_boot "$work" "$p"
