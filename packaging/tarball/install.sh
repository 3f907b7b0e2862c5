#!/bin/sh
# Installs claudebox from this unpacked release tarball (docs/packages.md):
#
#   sudo ./install.sh                 into /usr/local (root's default)
#   ./install.sh                      into ~/.local, for you alone (no root)
#   ./install.sh --prefix DIR         into DIR
#   [sudo] ./install.sh --uninstall   removes what an install put there (same prefix)
#
# It copies bin/claudebox, the man page, the completions (bash, zsh, fish) and, as root,
# the AppArmor profile for the bwrap claudebox finds, where AppArmor 4 restricts user
# namespaces and no other profile names that bwrap (lib/claudebox/claudebox-apparmor says
# why each way). It installs no dependencies: bubblewrap with --ro-bind-fd (0.10, or
# Debian 12's 0.8.0-2+deb12u1, Ubuntu 24.04's 0.9.0-1ubuntu0.1) and git come from the
# distribution. What it installed is listed in PREFIX/share/claudebox/installed-files,
# which --uninstall reads; each user's state (~/.claudebox) stays.
set -eu

here="$(cd "$(dirname "$0")" && pwd -P)"
say() { printf 'install.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

prefix=""
uninstall=false
while [ $# -gt 0 ]; do
    case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --uninstall) uninstall=true; shift ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (--prefix DIR, --uninstall)" ;;
    esac
done
root=false
[ "$(id -u)" -eq 0 ] && root=true
if [ -z "$prefix" ]; then
    if $root; then prefix=/usr/local; else prefix="$HOME/.local"; fi
fi
case "$prefix" in /*) ;; *) die "--prefix must be absolute: $prefix" ;; esac
manifest="$prefix/share/claudebox/installed-files"
helper="$prefix/lib/claudebox/claudebox-apparmor"

if $uninstall; then
    [ -f "$manifest" ] || die "nothing to uninstall: no $manifest"
    if $root && [ -x "$helper" ] && [ -e /etc/apparmor.d/claudebox-bwrap ]; then
        # Removes the profile only when it is the text this install put there.
        if [ -f "$prefix/share/claudebox/apparmor/installed" ]; then
            "$helper" remove "$prefix/share/claudebox/apparmor/installed" || true
        fi
    fi
    dirs=""
    [ -f "$prefix/share/claudebox/installed-dirs" ] && dirs="$(sed '1!G;h;$!d' "$prefix/share/claudebox/installed-dirs")"
    while IFS= read -r f; do
        rm -f "$prefix/$f"
    done <"$manifest"
    rm -f "$manifest" "$prefix/share/claudebox/apparmor/installed"
    # The directories the install made, deepest first, when nothing else is in them.
    for d in $dirs share/claudebox/apparmor share/claudebox lib/claudebox; do
        rmdir "$prefix/$d" 2>/dev/null || true
    done
    say "removed claudebox from $prefix (your state in ~/.claudebox stays)"
    exit 0
fi

files="bin/claudebox
share/man/man1/claudebox.1.gz
share/bash-completion/completions/claudebox
share/zsh/site-functions/_claudebox
share/fish/vendor_completions.d/claudebox.fish
share/claudebox/apparmor/claudebox-bwrap
lib/claudebox/claudebox-apparmor"
for f in $files; do
    [ -f "$here/$f" ] || die "$here/$f is missing: unpack the whole tarball"
done
# The directories this install creates, parents first, for --uninstall to remove when empty.
made_dirs=""
[ -f "$prefix/share/claudebox/installed-dirs" ] && made_dirs="$(cat "$prefix/share/claudebox/installed-dirs")"
mkdirs() {
    d=""
    for part in $(printf '%s\n' "$1" | tr '/' ' '); do
        d="${d:+$d/}$part"
        if [ ! -d "$prefix/$d" ]; then
            mkdir -p "$prefix/$d"
            made_dirs="$made_dirs
$d"
        fi
    done
}
for f in $files; do
    mode=644
    case "$f" in bin/* | lib/*) mode=755 ;; esac
    mkdirs "$(dirname "$f")"
    # A new file beside the old, then renamed: a running claudebox keeps its binary.
    cp "$here/$f" "$prefix/$f.new"
    chmod "$mode" "$prefix/$f.new"
    mv -f "$prefix/$f.new" "$prefix/$f"
done
printf '%s\n' "$files" share/claudebox/installed-files share/claudebox/installed-dirs >"$manifest"
printf '%s\n' "$made_dirs" | sed '/^$/d' >"$prefix/share/claudebox/installed-dirs"
say "installed claudebox ($(basename "$here")) into $prefix"

if $root; then
    # The profile names the bwrap this claudebox runs (symlinks resolved), as
    # `claudebox --apparmor-profile` prints it; the copy is kept for --uninstall.
    if "$prefix/bin/claudebox" --apparmor-profile >"$prefix/share/claudebox/apparmor/installed" 2>/dev/null; then
        CLAUDEBOX_APPARMOR_RERUN="sudo $here/install.sh" \
            "$helper" install "$prefix/share/claudebox/apparmor/installed" || true
    else
        rm -f "$prefix/share/claudebox/apparmor/installed"
        say "no bwrap found: install bubblewrap, then run this again for the AppArmor profile (where needed)"
    fi
else
    say "not root: no AppArmor profile (where AppArmor restricts user namespaces, 'claudebox --check' gives the one step)"
fi
command -v bwrap >/dev/null 2>&1 || say "bubblewrap is not installed: install it (and git) with your package manager"
case ":$PATH:" in *":$prefix/bin:"*) ;; *) say "$prefix/bin is not on your PATH: add it (export PATH=\"$prefix/bin:\$PATH\")" ;; esac
say "next: claudebox --check"
