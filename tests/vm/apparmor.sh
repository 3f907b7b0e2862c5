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
# with apt, each index's signature checked: trixie's apparmor-profiles, busybox-static and
# ubuntu-keyring (Debian's keyring vouches for it), then with that keyring Ubuntu noble's
# kernel; and scripts/install-apparmor-parser.sh's parser. No KVM needed
# (TCG; about a minute on two cores). amd64 only.
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
vm_cache="$cache/apparmor-vm-$suite"
mkdir -p "$vm_cache"

# The packages, fetched once (the same apt setup as install-apparmor-parser.sh).
apt_in() { # DIR SOURCES-LINE: a private apt state in DIR for one source
    mkdir -p "$1/lists/partial" "$1/cache/archives/partial"
    : >"$1/status"
    printf '%s\n' "$2" >"$1/sources.list"
    o=(-o "Dir::Etc::SourceList=$1/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
       -o "Dir::State::Lists=$1/lists" -o "Dir::State::Status=$1/status"
       -o "Dir::Cache=$1/cache" -o "APT::Architecture=amd64" -o "Acquire::Languages=none"
       -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false")
    apt-get "${o[@]}" -q update </dev/null >&2
}
set +e
(
set -e
if [[ ! -f "$vm_cache/ok" ]]; then
    tmp="$(mktemp -d "$cache/.apparmor-vm-XXXXXX")"
    mkdir -p "$tmp/debs" "$tmp/x"
    apt_in "$tmp/debian" "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main"
    (cd "$tmp/debs" && apt-get "${o[@]}" -q download apparmor-profiles busybox-static ubuntu-keyring </dev/null >&2)
    for d in "$tmp"/debs/*.deb; do dpkg-deb -x "$d" "$tmp/x"; done
    apt_in "$tmp/ubuntu" "deb [signed-by=$tmp/x/usr/share/keyrings/ubuntu-archive-keyring.gpg] http://archive.ubuntu.com/ubuntu $suite main"
    kernel_pkg="$(apt-cache "${o[@]}" depends linux-image-generic | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n1)"
    [[ -n "$kernel_pkg" ]] || die "no linux-image-generic in $suite's index"
    (cd "$tmp/debs" && apt-get "${o[@]}" -q download "$kernel_pkg" </dev/null >&2)
    dpkg-deb -x "$tmp"/debs/linux-image-*.deb "$tmp/x"
    cp "$tmp"/x/boot/vmlinuz-* "$vm_cache/vmlinuz"
    basename "$tmp"/x/boot/vmlinuz-* >"$vm_cache/kernel-version"
    cp "$tmp/x/usr/bin/busybox" "$vm_cache/busybox"
    cp "$tmp/x/usr/share/apparmor/extra-profiles/bwrap-userns-restrict" "$vm_cache/bwrap-userns-restrict"
    chmod -R a+rX "$vm_cache"
    rm -rf "$tmp"
    touch "$vm_cache/ok"
fi
)
fetched=$?
set -e
[[ $fetched -eq 0 ]] || {
    rm -rf "$cache"/.apparmor-vm-*
    rmdir "$vm_cache" 2>/dev/null
    log "cannot fetch the packages for the VM (exit $fetched)"
    exit 75
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
p="$work/p"   # the guest's root
mkdir -p "$p"/{usr/bin,usr/sbin,usr/local/bin,usr/lib/x86_64-linux-gnu,usr/lib64,etc/apparmor.d,opt,home/user,tmp,proc,sys,dev,run,var/tmp,root}
for l in bin sbin lib lib64; do ln -s "usr/$l" "$p/$l"; done
cp "$vm_cache/busybox" "$p/usr/bin/busybox"
for a in sh true cat echo id; do ln -s busybox "$p/usr/bin/$a"; done
cp /usr/bin/bwrap /usr/bin/setpriv "$p/usr/bin/"
if command -v strip >/dev/null; then strip -o "$p/usr/local/bin/claudebox" "$claudebox"; else cp "$claudebox" "$p/usr/local/bin/claudebox"; fi
for lib in $(ldd /usr/bin/bwrap /usr/bin/setpriv "$claudebox" | awk '/=>/ {print $3}' | sort -u); do
    cp -L "$lib" "$p/usr/lib/x86_64-linux-gnu/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$p/usr/lib/x86_64-linux-gnu/"
ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$p/usr/lib64/ld-linux-x86-64.so.2"
mkdir -p "$p$aa_dir"
cp -a "$aa_dir/." "$p$aa_dir/"
# Debian's unprivileged_userns ships in complain mode; Ubuntu's enforces.
sed 's/flags=(complain)/flags=(enforce)/' "$aa_dir/root/etc/apparmor.d/unprivileged_userns" >"$p/opt/unprivileged_userns"
cp "$vm_cache/bwrap-userns-restrict" "$p/opt/bwrap-userns-restrict"
printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n' >"$p/etc/passwd"
printf 'root:x:0:\nuser:x:1000:\n' >"$p/etc/group"
: >"$p/etc/resolv.conf"
printf '127.0.0.1 localhost\n' >"$p/etc/hosts"
mkdir -p "$p/home/user/proj"
chown -R 1000:1000 "$p/home/user"
chmod 1777 "$p/tmp" "$p/var/tmp"

cat >"$p/test.sh" <<TEST
#!/bin/busybox sh
/bin/busybox mkdir -p /opt/bb
/bin/busybox --install -s /opt/bb
export PATH=/usr/local/bin:/usr/bin:/opt/bb
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t securityfs securityfs /sys/kernel/security
mount -t devtmpfs dev /dev
mount -t tmpfs -o mode=1777 tmp /tmp
P=$parser
RESTRICT_UNCONFINED=${RESTRICT_UNCONFINED:-}
r() { echo "RESULT \$1 \$2 \$3"; }
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
cp /opt/bwrap-userns-restrict /etc/apparmor.d/bwrap-userns-restrict
load -r /etc/apparmor.d/bwrap-userns-restrict && r C loaded bwrap-userns-restrict
step C
load -R /etc/apparmor.d/claudebox-bwrap && rm /etc/apparmor.d/claudebox-bwrap && r D removed claudebox-bwrap
step D
r done all yes
poweroff -f
TEST
chmod 755 "$p/test.sh"

# The initramfs: busybox copies the payload onto a tmpfs (bwrap cannot pivot_root out of
# the initial rootfs) and switches to it.
i="$work/i"
mkdir -p "$i/bin" "$i/newroot"
cp "$vm_cache/busybox" "$i/bin/busybox"
cat >"$i/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox mount -t tmpfs -o size=600m root /newroot
/bin/busybox cp -a /payload/. /newroot/
exec /bin/busybox switch_root /newroot /test.sh
INIT
chmod 755 "$i/init"
mv "$p" "$i/payload"
(cd "$i" && find . | "$vm_cache/busybox" cpio -o -H newc 2>/dev/null) >"$work/initrd"
log "booting $(cat "$vm_cache/kernel-version") (TCG)"
timeout 600 qemu-system-x86_64 -nographic -no-reboot -m 1536 -smp 2 \
    -kernel "$vm_cache/vmlinuz" -initrd "$work/initrd" \
    -append "console=ttyS0 quiet panic=-1 apparmor=1" </dev/null
