#!/usr/bin/env bash
# Installs claudebox's packages on fresh distribution roots as a user with only apt would,
# runs `claudebox --check` and a real launch as an ordinary user, then removes them and
# checks that nothing is left but the user's state (issue 38). As root:
#
#   tests/vm/package-install.sh [debian12|debian13|ubuntu2404|ubuntu2604|tarball ...]
#       (default: all five, or the words of PACKAGE_ROOTS)
#
# The packages come from `scripts/release deb tarball` on this working tree
# (CLAUDEBOX_RELEASE_DIRTY=1), or from CLAUDEBOX_PACKAGES=DIR holding a made .deb and
# tarball. Each root (tests/vm/roots.sh: debootstrap minbase with apparmor, as an installed
# machine has it, plus its updates; cached in $CLAUDEBOX_CI_CACHE/package-install) is
# unpacked fresh and entered with bwrap as root, as tests/vm/readme-install.sh does. In it:
#   - `apt-get update`, then `apt install ./claudebox_*.deb`, which must pull bubblewrap
#     and git (neither is in the root);
#   - the files: binary, man page, completions (bash's loaded by bash), and the AppArmor
#     profile where the table PROFILE below says it belongs (compiled with the root's own
#     apparmor_parser, -Q -K: the kernel here has no AppArmor to load it into), and
#     the dpkg trigger: a package bringing another profile for /usr/bin/bwrap makes it
#     step aside, and it comes back when that package is purged;
#   - as `user` (uid 1000): `claudebox --check` (ok with Claude Code, the CI's cached one
#     bound read-only as readme-install does) and `claudebox --exec true`, and a write
#     from inside reaching the project;
#   - `apt remove` (the binary and the profile go), `apt purge` (the user's state stays);
#     then once more with the dependencies in place, `apt install` and `apt purge`: the
#     root's file list must be the one before (but for the user's home, apt's and dpkg's
#     records, logs and caches).
# `tarball` does the same on a Debian 12 root with the tarball's install.sh: as root into
# /usr/local (bubblewrap and git from apt first), then as the user into ~/.local, each
# followed by install.sh --uninstall. A root whose archive cannot be reached is skipped
# (said at the end); exits 75 when all were (the caller reports a skip).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
log() { printf 'package-install: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
unreachable() { log "cannot reach $*: skipping"; exit 75; }

[[ "$(id -u)" -eq 0 ]] || die "run as root (debootstrap, and the root's user)"
command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
command -v bwrap >/dev/null || die "bwrap not found"
source "$ROOT/tests/vm/roots.sh"

cache="${CLAUDEBOX_CI_CACHE:-/var/cache/claudebox-ci}/package-install"
mkdir -p "$cache"
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    # shellcheck disable=SC2206 # words
    targets=(${PACKAGE_ROOTS:-debian12 ubuntu2404 debian13 ubuntu2604 tarball})
fi

# Whether the package installs its AppArmor profile on each root, and why.
declare -A PROFILE=(
    [debian12]="no: AppArmor 3 (no abi/4.0) restricts no user namespaces and rejects the profile"
    [debian13]="yes: AppArmor 4.1, and no profile of the distribution names /usr/bin/bwrap"
    [ubuntu2404]="yes: AppArmor 4.0; bwrap-userns-restrict is only an extra there (apparmor-profiles)"
    [ubuntu2604]="no: the distribution's bwrap-userns-restrict names /usr/bin/bwrap (two profiles: neither attaches); compiled with the other parser"
)

# The packages.
if [[ -n "${CLAUDEBOX_PACKAGES:-}" ]]; then
    dist="$(cd "$CLAUDEBOX_PACKAGES" && pwd -P)"
else
    log "scripts/release deb tarball (this working tree)"
    t0=$SECONDS
    (cd "$ROOT" && CLAUDEBOX_RELEASE_DIRTY=1 bash scripts/release deb tarball) >&2
    log "the packages took $((SECONDS - t0)) s"
    dist="$ROOT/dist"
fi
deb="$(cd "$dist" && ls claudebox_*_amd64.deb | tail -n 1)"
tarball="$(cd "$dist" && ls claudebox-*-x86_64-unknown-linux-gnu.tar.gz | tail -n 1)"
[[ -n "$deb" && -n "$tarball" ]] || die "no .deb or tarball in $dist"
log "testing $deb and $tarball"

# Claude Code as the user would have it (npm's): the CI's cached one, read-only at the same
# path, its bin dir on the user's PATH (without it --check fails its claude row).
claude_bin="" claude=()
if [[ -n "${CLAUDEBOX_TEST_CLAUDE_LATEST:-}" && -x "$CLAUDEBOX_TEST_CLAUDE_LATEST" ]]; then
    claude_bin="$(dirname "$CLAUDEBOX_TEST_CLAUDE_LATEST")"
    modules="$(dirname "$claude_bin")"
    claude=(--ro-bind "$modules" "$modules")
fi

# What runs inside a root (bash, as root there; `as_user` runs as uid 1000).
common='set -e
export DEBIAN_FRONTEND=noninteractive
as_user() { runuser -u user -- env -i HOME=/home/user USER=user LOGNAME=user LANG=C.UTF-8 \
    TERM=dumb PATH=/home/user/.local/bin:${CLAUDE_BIN:+$CLAUDE_BIN:}/usr/local/bin:/usr/bin:/bin \
    bash -ec "$1"; }
# The file list of the root, less what may change: the kernel-made mounts, apt and dpkg
# records, logs, caches, the user home and the packages dir.
files() {
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tmp -o -path /run \
        -o -path /var/cache -o -path /var/lib/apt -o -path /var/lib/dpkg -o -path /var/log \
        -o -path /home -o -path /pkg -o -path /var/tmp -o -path /etc/ld.so.cache \) -prune -o -print | sort
}
launch() {
    as_user "cd ~/proj && git init -q . 2>/dev/null || true"
    echo "--- claudebox --check (as user)"
    if as_user "cd ~/proj && claudebox --check"; then echo CHECK-OK; else echo "CHECK-RC=$?"; fi
    echo "--- claudebox --exec true (as user)"
    as_user "cd ~/proj && claudebox --exec true" && echo LAUNCH-OK
    rm -f /home/user/proj/made-inside
    as_user "cd ~/proj && claudebox --exec sh -c \"touch made-inside && id -un\""
    [ -f /home/user/proj/made-inside ] && echo WRITE-OK
}
leftovers() {
    files >/var/tmp/after
    if comm -3 /var/tmp/before /var/tmp/after | grep .; then echo "LEFTOVERS above"; else echo NOTHING-LEFT; fi
}
'

# A deb root: install, look, launch, remove, purge.
deb_script='
t0=$(date +%s)
apt-get update -q >/dev/null
for p in bubblewrap git; do ! dpkg -s "$p" >/dev/null 2>&1 || { echo "$p is in the fresh root already"; exit 1; }; done
echo "\$ apt install ./$DEB"
(cd /pkg && apt-get install -y -q "./$DEB") 2>&1 | grep -E "^(Setting up|claudebox:|The following NEW)|NEW packages|^E:" || true
dpkg -s claudebox >/dev/null && echo INSTALLED
echo "installed in $(( $(date +%s) - t0 )) s: bubblewrap $(dpkg-query -W -f "\${Version}" bubblewrap), git $(dpkg-query -W -f "\${Version}" git)"
for f in /usr/bin/claudebox /usr/share/man/man1/claudebox.1.gz /usr/share/bash-completion/completions/claudebox \
    /usr/share/zsh/vendor-completions/_claudebox /usr/share/fish/vendor_completions.d/claudebox.fish \
    /usr/share/claudebox/apparmor/claudebox-bwrap /usr/lib/claudebox/claudebox-apparmor; do
    [ -s "$f" ] || { echo "MISSING $f"; exit 1; }
done
zcat /usr/share/man/man1/claudebox.1.gz | grep -q "^\.SH EXAMPLES" && echo MAN-OK
as_user "source /usr/share/bash-completion/completions/claudebox && complete -p claudebox" | grep -q claudebox && echo BASH-COMPLETION-OK
if [ -e /etc/apparmor.d/claudebox-bwrap ]; then
    echo PROFILE-INSTALLED
    cmp /etc/apparmor.d/claudebox-bwrap /usr/share/claudebox/apparmor/claudebox-bwrap
    apparmor_parser --version | head -n 1
    apparmor_parser -Q -K /etc/apparmor.d/claudebox-bwrap && echo PROFILE-COMPILES
    # The trigger: a package that brings a profile naming /usr/bin/bwrap makes ours step
    # aside (two would attach neither); purged, ours comes back.
    mkdir -p /var/tmp/other/DEBIAN /var/tmp/other/etc/apparmor.d
    printf "%s\n" "Package: other-bwrap-profile" "Version: 1" "Architecture: all" \
        "Maintainer: test <test@example.invalid>" "Description: a profile naming /usr/bin/bwrap" >/var/tmp/other/DEBIAN/control
    printf "%s\n" "abi <abi/4.0>," "profile other /usr/bin/bwrap flags=(unconfined) {" "  userns," "}" \
        >/var/tmp/other/etc/apparmor.d/other-bwrap
    dpkg-deb -b /var/tmp/other /var/tmp/other.deb >/dev/null
    dpkg -i /var/tmp/other.deb 2>&1 | grep "^claudebox:" || true
    [ ! -e /etc/apparmor.d/claudebox-bwrap ] && echo TRIGGER-STEPPED-ASIDE
    dpkg --purge other-bwrap-profile >/dev/null 2>&1
    [ -e /etc/apparmor.d/claudebox-bwrap ] && echo TRIGGER-CAME-BACK
else
    echo PROFILE-ABSENT
    ls /etc/apparmor.d/ | tr "\n" " "; echo
    # Where another profile names bwrap, ours is what `dpkg-reconfigure` installs once that
    # one is disabled: the parser of the root must take it.
    if [ -e /etc/apparmor.d/abi/4.0 ]; then
        apparmor_parser --version | head -n 1
        apparmor_parser -Q -K /usr/share/claudebox/apparmor/claudebox-bwrap && echo PROFILE-COMPILES
    fi
fi
launch
echo "\$ apt remove claudebox"
apt-get remove -y -q claudebox >/dev/null
[ ! -e /usr/bin/claudebox ] && [ ! -e /etc/apparmor.d/claudebox-bwrap ] && echo REMOVED
echo "\$ apt purge claudebox"
apt-get purge -y -q claudebox >/dev/null
dpkg -s claudebox >/dev/null 2>&1 || echo PURGED
[ -d /home/user/.claudebox ] && echo STATE-KEPT
# Again with the dependencies in place, for the file lists: everything the package and its
# maintainer scripts add, purge takes away (the first round cannot tell the files of
# claudebox from what the scripts of its dependencies made).
files >/var/tmp/before
(cd /pkg && apt-get install -y -q "./$DEB" >/dev/null 2>&1)
dpkg -s claudebox >/dev/null && apt-get purge -y -q claudebox >/dev/null
leftovers
echo "took $(( $(date +%s) - t0 )) s"
'

# The tarball on a root: as root into /usr/local, then as the user into ~/.local.
tarball_script='
t0=$(date +%s)
apt-get update -q >/dev/null
apt-get install -y -q bubblewrap git >/dev/null
files >/var/tmp/before
mkdir -p /var/tmp/unpack && tar -C /var/tmp/unpack -xzf "/pkg/$TARBALL"
dir=$(echo /var/tmp/unpack/claudebox-*)
echo "\$ sudo ./install.sh"
"$dir/install.sh"
[ -x /usr/local/bin/claudebox ] && [ -s /usr/local/share/man/man1/claudebox.1.gz ] && echo ROOT-INSTALLED
launch
"$dir/install.sh" --uninstall
leftovers
echo "\$ ./install.sh (as user, into ~/.local)"
chmod -R a+rX /var/tmp/unpack
as_user "$dir/install.sh"
as_user "cd ~/proj && command -v claudebox && claudebox --exec true" && echo USER-LAUNCH-OK
as_user "$dir/install.sh --uninstall"
[ ! -e /home/user/.local/bin/claudebox ] && [ ! -e /home/user/.local/share/claudebox ] && echo USER-UNINSTALLED
[ -d /home/user/.claudebox ] && echo STATE-KEPT
echo "took $(( $(date +%s) - t0 )) s"
'

work=""
trap '[[ -n "$work" ]] && rm -rf "$work"' EXIT

# run_in NAME SCRIPT: a fresh copy of NAME's root, the script run in it; output in $work/out.
run_in() {
    local name="$1" body="$2" tar r rc ca=()
    tar="$(root_tar "$cache" "$name" apparmor)"
    work="$(mktemp -d /var/tmp/package-install-XXXXXX)"
    r="$work/r"
    mkdir "$r"
    tar -C "$r" -xzf "$tar"
    chroot "$r" useradd -m -u 1000 -s /bin/bash user
    mkdir -p "$r/home/user/proj" "$r/pkg"
    chroot "$r" chown -R user:user /home/user
    cp -L /etc/resolv.conf "$r/etc/resolv.conf"
    [[ ${#claude[@]} -eq 0 ]] || mkdir -p "$r${claude[1]}"
    [[ -f /etc/ssl/certs/ca-certificates.crt ]] &&
        ca=(--ro-bind /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt)
    [[ -d "$r/etc/ssl/certs" ]] || ca=()
    set +e
    bwrap --bind "$r" / --dev /dev --dev-bind /proc /proc --perms 1777 --tmpfs /tmp \
        "${ca[@]}" "${claude[@]}" --ro-bind "$dist" /pkg \
        --die-with-parent --chdir / --setenv PATH /usr/sbin:/usr/bin:/sbin:/bin \
        --setenv CLAUDE_BIN "$claude_bin" --setenv DEB "$deb" --setenv TARBALL "$tarball" \
        bash -c "$common$body" </dev/null 2>&1 | tee "$work/out" | sed -u "s/^/[$name] /" >&2
    rc=${PIPESTATUS[0]}
    set -e
    return "$rc"
}

expect() {
    local name="$1" what
    shift
    for what in "$@"; do
        grep -qx "$what" "$work/out" || die "$name: no $what (see the lines above)"
    done
}

check_deb() {
    local name="$1" rc=0
    log "$name: apt install ./$deb, --check and a launch as user, remove, purge"
    run_in "$name" "$deb_script" || rc=$?
    if [[ $rc -ne 0 ]] && grep -qE 'Could not resolve|Temporary failure|Failed to fetch|Unable to fetch' "$work/out" &&
        ! grep -qx INSTALLED "$work/out"; then
        unreachable "$name's archive"
    fi
    [[ $rc -eq 0 ]] || die "$name: exit $rc"
    expect "$name" INSTALLED MAN-OK BASH-COMPLETION-OK LAUNCH-OK WRITE-OK REMOVED PURGED STATE-KEPT NOTHING-LEFT
    [[ -z "$claude_bin" ]] || expect "$name" CHECK-OK
    case "${PROFILE[$name]}" in
        yes*) expect "$name" PROFILE-INSTALLED PROFILE-COMPILES TRIGGER-STEPPED-ASIDE TRIGGER-CAME-BACK ;;
        no*) expect "$name" PROFILE-ABSENT ;;&
        *"compiled with"*) expect "$name" PROFILE-COMPILES ;;
    esac
    log "$name: ok, AppArmor profile ${PROFILE[$name]} ($(grep -E '^took' "$work/out"))"
    echo "RESULT $name ok"
    rm -rf "$work"
    work=""
}

check_tarball() {
    local rc=0
    log "tarball (Debian 12): sudo ./install.sh and ./install.sh, launches, --uninstall"
    run_in debian12 "$tarball_script" || rc=$?
    [[ $rc -eq 0 ]] || die "tarball: exit $rc"
    expect tarball ROOT-INSTALLED LAUNCH-OK WRITE-OK NOTHING-LEFT USER-LAUNCH-OK USER-UNINSTALLED STATE-KEPT
    [[ -z "$claude_bin" ]] || expect tarball CHECK-OK
    log "tarball: ok ($(grep -E '^took' "$work/out"))"
    echo "RESULT tarball ok"
    rm -rf "$work"
    work=""
}

# Each target on its own: one whose archive is out of reach is skipped (exit 75), the
# others still run; the script exits 75 only when every one was skipped.
failed=() skipped=() passed=()
for t in "${targets[@]}"; do
    # Not `( ... ) || rc=$?`: bash ignores set -e inside a subshell tested that way.
    set +e
    (
        set -e
        trap '[[ -n "$work" ]] && rm -rf "$work"' EXIT
        case "$t" in
            tarball) check_tarball ;;
            *) [[ -n "${PROFILE[$t]:-}" ]] || die "unknown target $t"; check_deb "$t" ;;
        esac
    )
    rc=$?
    set -e
    case $rc in
        0) passed+=("$t") ;;
        75) skipped+=("$t") ;;
        *) failed+=("$t") ;;
    esac
done
log "passed: ${passed[*]:-none}; skipped (archive out of reach): ${skipped[*]:-none}; failed: ${failed[*]:-none}"
[[ ${#failed[@]} -eq 0 ]] || exit 1
[[ ${#passed[@]} -gt 0 ]] || exit 75
