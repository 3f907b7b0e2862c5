#!/usr/bin/env bash
# Boots a real Ubuntu kernel (24.04's, from noble-updates: the user namespace restriction is
# Ubuntu's own kernel patch; Debian's kernels have AppArmor but not it) in qemu, with an initramfs holding this machine's bwrap, claudebox and AppArmor 4.1.0's
# parser, turns on Ubuntu's restriction (kernel.apparmor_restrict_unprivileged_userns=1
# with an enforcing `unprivileged_userns` profile), and as an ordinary user (uid 1000)
# runs bwrap, a bwrap inside bwrap, a launch (`claudebox --exec true`) and `claudebox
# --check` in four states:
#   A  no profile for bwrap            (the restriction refuses bwrap)
#   B  claudebox-bwrap loaded           (bwrap and the nested bwrap start)
#   C  B + Debian/Ubuntu's bwrap-userns-restrict loaded (two profiles name /usr/bin/bwrap)
#   D  bwrap-userns-restrict alone     (bwrap starts, the nested bwrap does not: #87680)
# The guest's console goes to stdout; each result is a line `RESULT <step> <what> <value>`.
#
#   tests/vm/apparmor.sh CLAUDEBOX_BINARY
#   UBUNTU_SUITE=resolute-updates RESTRICT_UNCONFINED=1 tests/vm/apparmor.sh CLAUDEBOX_BINARY
#
# Needs: qemu-system-x86_64 (Debian: qemu-system-x86), apt-get and dpkg-deb. It fetches
# the kernel and busybox as tests/vm/lib.sh says, and scripts/install-apparmor-parser.sh's
# parser. No KVM needed
# (TCG on one emulated CPU; about 40 s of one core). amd64 only.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
claudebox="$(realpath "${1:?usage: tests/vm/apparmor.sh CLAUDEBOX_BINARY}")"
log() { printf 'apparmor-vm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found (apt install qemu-system-x86)"
[[ "$(dpkg --print-architecture)" == amd64 ]] || die "amd64 only"

# A fetch that fails (an archive out of reach) exits 75, which the test reports as a skip:
# the machine could not get the kernel, which says nothing about claudebox.
parser="$(bash "$ROOT/scripts/install-apparmor-parser.sh")" || { log "cannot fetch AppArmor 4's parser"; exit 75; }
aa_dir="$(dirname "$parser")"
cache="$(dirname "$aa_dir")"
# UBUNTU_SUITE picks the kernel: noble-updates (24.04, the default) or e.g. resolute-updates.
suite="${UBUNTU_SUITE:-noble-updates}"
source "$ROOT/tests/vm/lib.sh"
vm_fetch "$cache" "$suite"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
p="$work/p"   # the guest's root
vm_root "$p" "$claudebox"
mkdir -p "$p/etc/apparmor.d"
mkdir -p "$p$aa_dir"
cp -a "$aa_dir/." "$p$aa_dir/"
# Debian's unprivileged_userns ships in complain mode; Ubuntu's enforces.
sed 's/flags=(complain)/flags=(enforce)/' "$aa_dir/root/etc/apparmor.d/unprivileged_userns" >"$p/opt/unprivileged_userns"
cp "$vm_cache/bwrap-userns-restrict" "$p/opt/bwrap-userns-restrict"

cat >"$p/test.sh" <<TEST
#!/bin/busybox sh
. /vm.sh
mount -t securityfs securityfs /sys/kernel/security
P=$parser
RESTRICT_UNCONFINED=${RESTRICT_UNCONFINED:-}
U="/usr/bin/setpriv --reuid=1000 --regid=1000 --clear-groups env -i HOME=/home/user USER=user PATH=/usr/local/bin:/usr/bin:/bin TMPDIR=/tmp"
B="bwrap --unshare-all --die-with-parent --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp"
r kernel apparmor-enabled "\$(cat /sys/module/apparmor/parameters/enabled)"
echo 1 >/proc/sys/kernel/apparmor_restrict_unprivileged_userns
r kernel restrict "\$(cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns)"
if [ -n "\$RESTRICT_UNCONFINED" ] && [ -e /proc/sys/kernel/apparmor_restrict_unprivileged_unconfined ]; then
    echo "\$RESTRICT_UNCONFINED" >/proc/sys/kernel/apparmor_restrict_unprivileged_unconfined
fi
r kernel restrict-unconfined "\$(cat /proc/sys/kernel/apparmor_restrict_unprivileged_unconfined 2>/dev/null)"
load() { \$P -K "\$@" 2>/tmp/perr; rc=\$?; [ \$rc = 0 ] || sed 's/^/RESULT parser-error /' /tmp/perr; return \$rc; }
load -r /opt/unprivileged_userns && r kernel unprivileged_userns-loaded yes
step() {
    s=\$1
    \$U \$B true 2>/tmp/err; r \$s bwrap-rc \$?; r \$s bwrap-err "\$(head -n1 /tmp/err)"
    \$U \$B cat /proc/self/attr/apparmor/current 2>/dev/null | sed "s/^/RESULT \$s label-inside /"
    \$U \$B \$B true 2>/tmp/err; r \$s nested-rc \$?; r \$s nested-err "\$(head -n1 /tmp/err)"
    (cd /home/user/proj && \$U claudebox --exec true) 2>/tmp/lerr; r \$s launch-rc \$?
    sed 's/^/RESULT '\$s' launch-err /' /tmp/lerr | head -n 3
    \$U claudebox --check >/tmp/check 2>&1
    grep -E '^(ok|warn|fail) +(apparmor|sandbox|nested sandbox) ' /tmp/check | sed "s/^/RESULT \$s check /"
    grep -A1 -E '^(ok|warn|fail) +(apparmor|sandbox) ' /tmp/check | grep -E '^ +fix:' | sed "s/^/RESULT \$s check-fix /"
}
step A
\$U claudebox --apparmor-profile >/etc/apparmor.d/claudebox-bwrap 2>/dev/null
load -r /etc/apparmor.d/claudebox-bwrap && r B loaded claudebox-bwrap
step B
# The file supervisor under Yama's ptrace_scope 1 (the kernel's default, Ubuntu's too): it
# reads the agent's paths as the agent's ancestor. A git dir made by hand (claudebox finds
# projects in-process; the guest has no git): a file made inside keeps working, a
# commondir renamed into the main git dir is refused and never appears on the host.
r B yama "\$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null)"
mkdir -p /home/user/proj/.git/objects /home/user/proj/.git/refs
echo 'ref: refs/heads/main' >/home/user/proj/.git/HEAD
chown -R 1000:1000 /home/user/proj
(cd /home/user/proj && \$U claudebox --exec sh -c 'echo made >made; cat made; echo x >.git/x; busybox mv .git/x .git/commondir; echo "mv-rc \$?"') 2>/tmp/serr | sed 's/^/RESULT B supervised /'
sed 's/^/RESULT B supervised-err /' /tmp/serr | head -n 3
r B commondir "\$([ -e /home/user/proj/.git/commondir ] && echo present || echo absent)"
\$U claudebox --check 2>&1 | grep -E '^(ok|warn|fail) +file supervisor ' | sed 's/^/RESULT B supervisor-check /'
cp /opt/bwrap-userns-restrict /etc/apparmor.d/bwrap-userns-restrict
load -r /etc/apparmor.d/bwrap-userns-restrict && r C loaded bwrap-userns-restrict
step C
load -R /etc/apparmor.d/claudebox-bwrap && rm /etc/apparmor.d/claudebox-bwrap && r D removed claudebox-bwrap
step D
r done all yes
poweroff -f
TEST
chmod 755 "$p/test.sh"

vm_boot "$work" "$p" apparmor=1
