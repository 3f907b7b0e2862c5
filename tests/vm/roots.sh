# shellcheck shell=bash
# Fresh distribution roots for the package tests (sourced, not run; tests/vm/package-install.sh):
#
#   source tests/vm/roots.sh        # needs $ROOT, log, die and unreachable (exit 75)
#   root_tar CACHE NAME [PKG,...]   # -> prints CACHE/NAME.tar.gz, made once
#
# NAME: debian12 (bookworm), debian13 (trixie), ubuntu2404 (noble), ubuntu2604 (resolute).
# A root is debootstrap's minbase with PKG,... (comma-separated) included, then its
# release's updates and security updates, as an installed machine has them; it is kept as
# a tarball and every test unpacks a fresh copy. Ubuntu's keyring comes from Debian's
# archive (its signature checked by apt), as tests/vm/lib.sh fetches it. Debian 12's
# debootstrap has no script for noble or resolute; Ubuntu's all follow gutsy's. The same
# steps as tests/vm/readme-install.sh's make_root, for more releases.

# Ubuntu's archive keyring, from Debian's archive.
roots_ubuntu_keyring() {
    local cache="$1" k="$1/ubuntu-archive-keyring.gpg" tmp
    [[ -s "$k" ]] && { echo "$k"; return; }
    source "$ROOT/tests/vm/lib.sh"
    tmp="$(mktemp -d)"
    apt_in "$tmp/apt" "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" ||
        { rm -rf "$tmp"; unreachable deb.debian.org; }
    (cd "$tmp" && apt-get "${o[@]}" -q download ubuntu-keyring </dev/null >&2) ||
        { rm -rf "$tmp"; unreachable deb.debian.org; }
    dpkg-deb -x "$tmp"/ubuntu-keyring_*.deb "$tmp/x"
    cp "$tmp/x/usr/share/keyrings/ubuntu-archive-keyring.gpg" "$k"
    rm -rf "$tmp"
    echo "$k"
}

root_tar() {
    local cache="$1" name="$2" include="${3:-}" suite mirror keyring script=() tmp sources tar
    tar="$cache/$name.tar.gz"
    [[ -s "$tar" ]] && { echo "$tar"; return; }
    case "$name" in
        debian12) suite=bookworm ;;
        debian13) suite=trixie ;;
        ubuntu2404) suite=noble ;;
        ubuntu2604) suite=resolute ;;
        *) die "unknown distribution $name (debian12, debian13, ubuntu2404, ubuntu2604)" ;;
    esac
    case "$name" in
        debian*) mirror=http://deb.debian.org/debian
            keyring=/usr/share/keyrings/debian-archive-keyring.gpg
            sources="deb $mirror $suite main
deb $mirror $suite-updates main
deb http://security.debian.org/debian-security $suite-security main" ;;
        ubuntu*) mirror=http://archive.ubuntu.com/ubuntu
            keyring="$(roots_ubuntu_keyring "$cache")"
            [[ -e "/usr/share/debootstrap/scripts/$suite" ]] || script=(/usr/share/debootstrap/scripts/gutsy)
            sources="deb $mirror $suite main universe
deb $mirror $suite-updates main universe
deb $mirror $suite-security main universe" ;;
    esac
    [[ -e "/usr/share/debootstrap/scripts/$suite" || ${#script[@]} -gt 0 ]] ||
        script=(/usr/share/debootstrap/scripts/sid)
    mkdir -p "$cache"
    tmp="$(mktemp -d "$cache/.root-XXXXXX")"
    log "$name: debootstrap $suite from $mirror (once; cached in $tar)"
    local t0=$SECONDS
    if ! debootstrap --variant=minbase --components=main,universe --keyring="$keyring" \
        ${include:+--include="$include"} "$suite" "$tmp/r" "$mirror" "${script[@]}" >"$tmp/log" 2>&1; then
        tail -n 20 "$tmp/log" >&2
        if grep -qE 'Failed getting release file|Couldn.t download|Temporary failure|Could not resolve|Release signed by unknown key|NO_PUBKEY' "$tmp/log"; then
            rm -rf "$tmp"; unreachable "$mirror ($suite)"
        fi
        rm -rf "$tmp"; die "debootstrap of $suite failed"
    fi
    printf '%s\n' "$sources" >"$tmp/r/etc/apt/sources.list"
    rm -f "$tmp/r/etc/apt/sources.list.d/"*.sources
    cp -L /etc/resolv.conf "$tmp/r/etc/resolv.conf"
    if ! chroot "$tmp/r" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get -y -q dist-upgrade' >>"$tmp/log" 2>&1; then
        tail -n 20 "$tmp/log" >&2
        rm -rf "$tmp"; unreachable "$mirror's updates ($suite)"
    fi
    chroot "$tmp/r" apt-get clean
    tar -C "$tmp/r" -czf "$tmp/root.tar.gz" .
    mv "$tmp/root.tar.gz" "$tar"
    rm -rf "$tmp"
    log "$name: made in $((SECONDS - t0)) s"
    echo "$tar"
}
