# The qemu harness shared by tests/vm/*.sh (sourced, not run): fetches Ubuntu's kernel and
# Debian's busybox once into a cache, lays out a guest root holding this machine's bwrap,
# setpriv and the claudebox under test, and boots it from an initramfs under TCG.
#
#   source tests/vm/lib.sh          # needs $ROOT, log and die defined by the caller
#   vm_fetch CACHE SUITE            # -> $vm_cache with vmlinuz, kernel-version, busybox,
#                                   #    bwrap-userns-restrict; exit 75 when out of reach
#   vm_root DIR CLAUDEBOX           # a guest root in DIR (/test.sh is the caller's), with
#                                   #    /vm.sh for /test.sh to source (mounts, `r`)
#   vm_boot WORK DIR                # boots DIR as / and runs /test.sh; console on stdout
#
# Fetching: apt with a private state, each index's signature checked: trixie's
# apparmor-profiles, busybox-static and ubuntu-keyring (Debian's keyring vouches for it),
# then with that keyring Ubuntu's kernel for SUITE (noble-updates: 24.04's).

# apt_in DIR SOURCES-LINE: a private apt state in DIR for one source; sets o=(apt options).
apt_in() {
    mkdir -p "$1/lists/partial" "$1/cache/archives/partial"
    : >"$1/status"
    printf '%s\n' "$2" >"$1/sources.list"
    o=(-o "Dir::Etc::SourceList=$1/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
       -o "Dir::State::Lists=$1/lists" -o "Dir::State::Status=$1/status"
       -o "Dir::Cache=$1/cache" -o "APT::Architecture=amd64" -o "Acquire::Languages=none"
       -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false")
    apt-get "${o[@]}" -q update </dev/null >&2
}

vm_fetch() {
    local cache="$1" suite="$2" fetched
    vm_cache="$cache/apparmor-vm-$suite"
    mkdir -p "$vm_cache"
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
}

# vm_root DIR CLAUDEBOX: busybox, bash, bwrap, setpriv, claudebox and their libraries, a user
# (uid 1000, home /home/user with a project at /home/user/proj) and a second one (uid 1001,
# /home/other/proj).
vm_root() {
    local p="$1" claudebox="$2" lib
    # From here on the script and all it starts (strip, cpio, qemu) run at the idle
    # scheduling class (vm_boot says why).
    if command -v chrt >/dev/null; then chrt --idle -p 0 $$ >/dev/null; fi
    mkdir -p "$p"/{usr/bin,usr/sbin,usr/local/bin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,opt,home/user,home/other,tmp,proc,sys,dev,run,var/tmp,root}
    for l in bin sbin lib lib64; do ln -s "usr/$l" "$p/$l"; done
    cp "$vm_cache/busybox" "$p/usr/bin/busybox"
    for a in sh true cat echo id; do ln -s busybox "$p/usr/bin/$a"; done
    cp /usr/bin/bwrap /usr/bin/setpriv /bin/bash "$p/usr/bin/"
    if command -v strip >/dev/null; then strip -o "$p/usr/local/bin/claudebox" "$claudebox"; else cp "$claudebox" "$p/usr/local/bin/claudebox"; fi
    for lib in $(ldd /usr/bin/bwrap /usr/bin/setpriv /bin/bash "$claudebox" | awk '/=>/ {print $3}' | sort -u); do
        cp -L "$lib" "$p/usr/lib/x86_64-linux-gnu/"
    done
    cp -L /lib64/ld-linux-x86-64.so.2 "$p/usr/lib/x86_64-linux-gnu/"
    ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$p/usr/lib64/ld-linux-x86-64.so.2"
    printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nother:x:1001:1001:other:/home/other:/bin/sh\n' >"$p/etc/passwd"
    printf 'root:x:0:\nuser:x:1000:\nother:x:1001:\n' >"$p/etc/group"
    : >"$p/etc/resolv.conf"
    printf '127.0.0.1 localhost\n' >"$p/etc/hosts"
    mkdir -p "$p/home/user/proj" "$p/home/other/proj"
    chown -R 1000:1000 "$p/home/user"
    chown -R 1001:1001 "$p/home/other"
    chmod 1777 "$p/tmp" "$p/var/tmp"
    vm_guest "$p"
}

# vm_guest DIR (called by vm_root): /vm.sh in the guest root, which the guest's /test.sh
# sources first: busybox's applets on PATH, /proc, /sys, /dev and /tmp mounted, and
# `r STEP WHAT VALUE` printing a result line, `RESULT STEP WHAT VALUE` (the tests read them
# from the console).
vm_guest() {
    cat >"$1/vm.sh" <<'GUEST'
/bin/busybox mkdir -p /opt/bb
/bin/busybox --install -s /opt/bb
export PATH=/usr/local/bin:/usr/bin:/opt/bb
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs -o mode=1777 tmp /tmp
r() { echo "RESULT $1 $2 $3"; }
GUEST
}

# vm_boot WORK DIR [KERNEL-ARGS]: the initramfs (busybox copies DIR onto a tmpfs, since
# bwrap cannot pivot_root out of the initial rootfs, and switches to it), booted under TCG;
# DIR/test.sh runs as init and powers off.
#
# The guest keeps its own time: one CPU with -icount (each guest instruction 4 ns of the
# guest's clock, and an idle guest jumps straight to its next timer, so its sleeps cost
# nothing), so what it measures does not depend on how much of the host's CPU qemu gets.
# qemu, and the laying out of its root before it, run at the idle scheduling class
# (SCHED_IDLE, set by vm_root): they take only CPU time that nothing else wants, and the
# time-bound tests beside them are not slowed down by them.
vm_boot() {
    local work="$1" p="$2" args="${3:-}" i="$1/i"
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
    log "booting $(cat "$vm_cache/kernel-version") (TCG, -icount, SCHED_IDLE)"
    timeout 1200 qemu-system-x86_64 -nographic -no-reboot -nic none -m 1024 -smp 1 \
        -icount shift=2,sleep=off \
        -kernel "$vm_cache/vmlinuz" -initrd "$work/initrd" \
        -append "console=ttyS0 quiet panic=-1 $args" </dev/null
}
