#!/usr/bin/env bash
# Put AppArmor 4's apparmor_parser into a cache directory outside the repository, and
# print the absolute path of a wrapper that runs it, on stdout.
#
#   scripts/install-apparmor-parser.sh   # -> /…/apparmor-4.1.0-1/apparmor_parser
#
# Why: claudebox ships an AppArmor profile (packaging/apparmor/claudebox-bwrap) with the
# `userns` rule and `abi <abi/4.0>`, which only AppArmor 4 knows; Debian 12's parser
# (3.0.8) rejects both. Debian 13 (trixie) has apparmor 4.1.0-1, which needs a newer glibc
# (>= 2.38) than Debian 12's: so this fetches trixie's `apparmor` and `libc6` packages
# with apt (a temporary sources list; apt checks the index's signature with Debian's
# archive keyring and each package's SHA256 against the index), unpacks them with
# dpkg-deb -x (nothing is installed), and the wrapper runs that apparmor_parser through
# trixie's own dynamic loader with its own config file (trixie's policy features) and its
# own base and include directory (abi/4.0, tunables). The wrapper only compiles: pass -Q (skip the kernel
# load) and -K (no cache); the test machine's kernel has no AppArmor.
#
# Environment:
#   CLAUDEBOX_CI_CACHE   cache base directory
#                        (default: ${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci)
#
# Idempotent: a cache holding a working parser of the pinned version is used as is. A
# fresh install goes into a temporary directory and is renamed into place only once the
# parser runs. Only the wrapper's path goes to stdout; progress goes to stderr.
set -euo pipefail

readonly APPARMOR_VERSION="4.1.0-1"
readonly SUITE="trixie"
readonly MIRROR="${CLAUDEBOX_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
readonly KEYRING="/usr/share/keyrings/debian-archive-keyring.gpg"

log() { printf 'install-apparmor-parser: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v apt-get >/dev/null 2>&1 || die "apt-get not found (this fetches Debian packages)"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb not found"
[[ -r "$KEYRING" ]] || die "$KEYRING missing (Debian package debian-archive-keyring)"

arch="$(dpkg --print-architecture)"
case "$arch" in
    amd64) triplet=x86_64-linux-gnu loader=ld-linux-x86-64.so.2 ;;
    arm64) triplet=aarch64-linux-gnu loader=ld-linux-aarch64.so.1 ;;
    *) die "architecture $arch is not handled (amd64, arm64)" ;;
esac

cache_base="${CLAUDEBOX_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci}"
mkdir -p "$cache_base"
cache_base="$(cd "$cache_base" && pwd -P)"
chmod a+rx "$cache_base" 2>/dev/null || true
final_dir="$cache_base/apparmor-$APPARMOR_VERSION"
wrapper="$final_dir/apparmor_parser"

works() {
    grep -q "$final_dir/parser.conf" "$1" 2>/dev/null &&
        "$1" --version 2>/dev/null | head -n1 | grep -q "version ${APPARMOR_VERSION%-*}\$"
}

if [[ -x "$wrapper" ]] && works "$wrapper"; then
    log "using the cached $wrapper"
    printf '%s\n' "$wrapper"
    exit 0
fi

tmp="$(mktemp -d "$cache_base/.apparmor-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/apt/lists/partial" "$tmp/apt/cache/archives/partial" "$tmp/debs" "$tmp/root"
: >"$tmp/apt/status"
printf 'deb [signed-by=%s] %s %s main\n' "$KEYRING" "$MIRROR" "$SUITE" >"$tmp/apt/sources.list"
apt_opts=(
    -o "Dir::Etc::SourceList=$tmp/apt/sources.list"
    -o "Dir::Etc::SourceParts=/nonexistent"
    -o "Dir::State::Lists=$tmp/apt/lists"
    -o "Dir::State::Status=$tmp/apt/status"
    -o "Dir::Cache=$tmp/apt/cache"
    -o "APT::Architecture=$arch"
    -o "Acquire::Languages=none"
    -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false"
)
log "fetching Debian $SUITE's package index (signature checked with $KEYRING)"
apt-get "${apt_opts[@]}" -q update </dev/null >&2
log "fetching apparmor=$APPARMOR_VERSION and libc6 from $SUITE"
(cd "$tmp/debs" && apt-get "${apt_opts[@]}" -q download "apparmor=$APPARMOR_VERSION" libc6 </dev/null >&2)
for deb in "$tmp"/debs/*.deb; do
    dpkg-deb -x "$deb" "$tmp/root"
done

root="$final_dir/root"
lib="$root/usr/lib/$triplet"
# Its own config: trixie's names /usr/share/apparmor-features/features, which on this
# machine would be Debian 12's (AppArmor 3) policy features.
printf 'policy-features=%s\n' "$root/usr/share/apparmor-features/features" >"$tmp/parser.conf"
cat >"$tmp/apparmor_parser" <<WRAPPER
#!/bin/sh
# Debian $SUITE's apparmor_parser $APPARMOR_VERSION, run through its own loader, config
# file and policy directory (made by scripts/install-apparmor-parser.sh).
exec "$lib/$loader" --library-path "$lib" "$root/usr/sbin/apparmor_parser" \\
    --config-file "$final_dir/parser.conf" \\
    -b "$root/etc/apparmor.d" -I "$root/etc/apparmor.d" "\$@"
WRAPPER
chmod 755 "$tmp/apparmor_parser"
mkdir -p "$tmp/final"
mv "$tmp/root" "$tmp/apparmor_parser" "$tmp/parser.conf" "$tmp/final/"
chmod -R a+rX "$tmp/final"
rm -rf "$final_dir"
mv "$tmp/final" "$final_dir"
works "$wrapper" || die "$wrapper does not run (see: $wrapper --version)"
log "installed $wrapper"
printf '%s\n' "$wrapper"
