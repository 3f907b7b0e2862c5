#!/usr/bin/env bash
# Follows the README's install as an ordinary user on fresh roots of Debian 12 (bookworm)
# and Ubuntu 24.04 (noble), then runs `claudebox --check` and `claudebox --exec true` there
# (issue 24 item 1). As root:
#
#   tests/vm/readme-install.sh [debian12|ubuntu2404 ...]     (default: both)
#
# Each root is made once with debootstrap (minbase plus what the README's apt-get line
# installs, sudo and ca-certificates; then the release's updates and security updates, as
# an installed machine has them) and kept as a tarball in the CI cache
# ($CLAUDEBOX_CI_CACHE, default /var/cache/claudebox-ci, dir readme-install/); every run
# unpacks a fresh copy. Ubuntu's keyring comes from Debian's archive (signature checked),
# as tests/vm/lib.sh fetches it. The README's install block (the lines marked `# install`,
# read from README.md) runs as written, in order, in one shell of `user` (uid 1000, with
# sudo): its `sudo` lines first as root, then the rest as one script, so that `. ~/.cargo/env`
# and `cd` carry on as in the user's terminal. Two endpoints it names are out of reach
# here and get local stand-ins, each said in the log: rustup's installer (a `curl` first
# on PATH answers https://sh.rustup.rs alone, with a script that links the host's
# toolchain, rustc --print sysroot bound read-only at /opt/rust, into ~/.cargo/bin and
# writes ~/.cargo/env as rustup does; any other URL goes to the real curl), and the
# repository (`$REPO` is a git repository of the checkout's files, cloned by the README's
# own `git clone`). The block's order is checked too: git and curl installed before the
# lines that use them.
# crates.io's downloads and each root's build are cached beside the tarballs, so a second
# run does not rebuild. The root is entered with bwrap as root (a mount namespace and
# pivot_root, not chroot(2): the kernel refuses a user namespace to a chrooted process, and
# claudebox's bwrap needs one). Exits 75 when an archive or crates.io cannot be reached
# (the caller reports a skip); any other failure is the README's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
log() { printf 'readme-install: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
unreachable() { log "cannot reach $*: skipping"; exit 75; }

[[ "$(id -u)" -eq 0 ]] || die "run as root (debootstrap, and the root's user)"
command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
command -v bwrap >/dev/null || die "bwrap not found"
sysroot="$(rustc --print sysroot)" || die "rustc not found"
[[ -x "$sysroot/bin/cargo" ]] || die "no cargo in $sysroot/bin (a rustup toolchain has one)"

cache="${CLAUDEBOX_CI_CACHE:-/var/cache/claudebox-ci}/readme-install"
mkdir -p "$cache"
distros=("$@")
[[ ${#distros[@]} -gt 0 ]] || distros=(debian12 ubuntu2404)

# The README's install lines: the shell block under "## Install", lines ending `# install`.
mapfile -t readme < <(sed -n '/^## Install/,/^## /p' "$ROOT/README.md" |
    sed -n '/^```sh$/,/^```$/p' | grep -E '# install$' | sed 's/ *# install$//')
[[ ${#readme[@]} -ge 2 ]] || die "README.md's install block has no '# install' lines"
log "the README's commands: $(printf '[%s] ' "${readme[@]}")"
# The block runs top to bottom on a fresh machine: root's lines first, git and curl
# installed before any line uses them, rustup's env read before cargo.
seen_user=0 have=""
for c in "${readme[@]}"; do
    case "$c" in
        "sudo "*) [[ $seen_user -eq 0 ]] || die "README: a sudo line after a user's line: $c"
            have="$have $c" ;;
        *) seen_user=1
            for tool in git curl; do
                [[ "$c" != "$tool "* && "$c" != *"| $tool "* ]] || [[ "$have" == *" $tool"* ]] ||
                    die "README: '$c' uses $tool before the block installs it"
            done
            [[ "$c" != cargo* ]] || [[ "$have" == *".cargo/env"* ]] ||
                die "README: '$c' runs before rustup's ~/.cargo/env is read"
            have="$have $c" ;;
    esac
done

# Ubuntu's archive keyring, from Debian's archive (its own signature checked by apt).
ubuntu_keyring() {
    local k="$cache/ubuntu-archive-keyring.gpg" tmp
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

# make_root NAME -> $cache/NAME.tar.gz (once)
make_root() {
    local name="$1" tar="$cache/$1-updated.tar.gz" suite mirror keyring script=() tmp
    [[ -s "$tar" ]] && return
    case "$name" in
        debian12) suite=bookworm mirror=http://deb.debian.org/debian
            keyring=/usr/share/keyrings/debian-archive-keyring.gpg ;;
        ubuntu2404) suite=noble mirror=http://archive.ubuntu.com/ubuntu
            keyring="$(ubuntu_keyring)"
            # Debian 12's debootstrap has no noble script; Ubuntu's all follow gutsy's.
            [[ -e /usr/share/debootstrap/scripts/noble ]] || script=(/usr/share/debootstrap/scripts/gutsy) ;;
        *) die "unknown distribution $name (debian12, ubuntu2404)" ;;
    esac
    tmp="$(mktemp -d "$cache/.root-XXXXXX")"
    log "$name: debootstrap $suite from $mirror (once; cached in $tar)"
    if ! debootstrap --variant=minbase --components=main,universe --keyring="$keyring" \
        --include=bubblewrap,git,build-essential,sudo,ca-certificates \
        "$suite" "$tmp/r" "$mirror" "${script[@]}" >"$tmp/log" 2>&1; then
        tail -n 20 "$tmp/log" >&2
        if grep -qE 'Failed getting release file|Couldn.t download|Temporary failure|Could not resolve' "$tmp/log"; then
            rm -rf "$tmp"; unreachable "$mirror"
        fi
        rm -rf "$tmp"; die "debootstrap of $suite failed"
    fi
    # A machine as installed: with its release's updates and security updates (Ubuntu
    # 24.04's bubblewrap gained --bind-fd in 0.9.0-1ubuntu0.1, Debian 12's in +deb12u1).
    case "$name" in
        debian12) printf '%s\n' "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
            "deb http://security.debian.org/debian-security bookworm-security main" ;;
        ubuntu2404) printf '%s\n' "deb $mirror noble main universe" \
            "deb $mirror noble-updates main universe" "deb $mirror noble-security main universe" ;;
    esac >"$tmp/r/etc/apt/sources.list"
    rm -f "$tmp/r/etc/apt/sources.list.d/"*.sources
    cp -L /etc/resolv.conf "$tmp/r/etc/resolv.conf"
    if ! chroot "$tmp/r" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get -y -q dist-upgrade' >>"$tmp/log" 2>&1; then
        tail -n 20 "$tmp/log" >&2
        rm -rf "$tmp"; unreachable "$mirror's updates"
    fi
    tar -C "$tmp/r" -czf "$tmp/root.tar.gz" .
    mv "$tmp/root.tar.gz" "$tar"
    rm -rf "$tmp"
}

# The fresh root being checked, removed however the script ends.
work=""
trap '[[ -n "$work" ]] && rm -rf "$work"' EXIT

# Runs the README's commands as `user` in a fresh copy of NAME's root.
check_one() {
    local name="$1" r rc
    make_root "$name"
    work="$(mktemp -d /var/tmp/readme-install-XXXXXX)"
    r="$work/r"
    mkdir "$r"
    tar -C "$r" -xzf "$cache/$name-updated.tar.gz"
    chroot "$r" useradd -m -u 1000 -s /bin/bash user
    printf 'user ALL=(ALL) NOPASSWD: ALL\n' >"$r/etc/sudoers.d/user"
    # The repository the README's `git clone "$REPO"` clones: the checkout's files (tracked
    # and new, as they are now) committed into a repository of their own.
    mkdir -p "$r/srv/claudebox"
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
        tar --null -T - -cf -) | tar -C "$r/srv/claudebox" -xf -
    git -C "$r/srv/claudebox" init -q -b main
    git -C "$r/srv/claudebox" add -A
    git -C "$r/srv/claudebox" -c user.name=t -c user.email=t@t commit -q -m checkout
    # rustup's stand-in: a curl that answers the installer's URL alone.
    mkdir -p "$r/usr/local/bin"
    cat >"$r/usr/local/bin/curl" <<'CURL'
#!/bin/sh
case " $* " in
*" https://sh.rustup.rs "*)
    echo "readme-install: stand-in for rustup's installer (the host's toolchain)" >&2
    cat <<'RUSTUP'
set -e
[ "$1 $2" = "-- -y" ] || [ "$1" = "-y" ] || { echo "rustup stand-in: expected -y" >&2; exit 1; }
mkdir -p "$HOME/.cargo/bin"
for t in cargo rustc rustdoc; do ln -sf /opt/rust/bin/$t "$HOME/.cargo/bin/$t"; done
printf '%s\n' 'export PATH="$HOME/.cargo/bin:$PATH"' >"$HOME/.cargo/env"
echo "Rust is installed now (stand-in)."
RUSTUP
    ;;
*) exec /usr/bin/curl "$@" ;;
esac
CURL
    chmod 755 "$r/usr/local/bin/curl"
    mkdir -p "$r/home/user/proj" "$r/opt/rust"
    chroot "$r" chown -R user:user /home/user /srv/claudebox
    # Caches: crates.io's downloads (shared) and this root's build.
    mkdir -p "$cache/cargo-registry" "$cache/target-$name"
    chown 1000:1000 "$cache/cargo-registry" "$cache/target-$name"
    mkdir -p "$r/home/user/.cargo/registry" "$r/var/tmp/target"
    chown 1000:1000 "$r/home/user/.cargo" "$r/home/user/.cargo/registry" "$r/var/tmp/target"
    cp -L /etc/resolv.conf "$r/etc/resolv.conf"

    # bwrap sets no_new_privs, so sudo cannot gain root inside: the block's `sudo ` lines
    # (all before any other, checked above) run as root without it (the root is the
    # test's own); the rest is one script the user runs from the home, each line as
    # written, timed.
    local c q root_lines=()
    {
        echo 'set -e'
        for c in "${readme[@]}"; do
            [[ "$c" == "sudo "* ]] && continue
            printf -v q '%q' "$c"
            printf 'printf "$ %%s\n" %s; start=$(date +%%s)\n%s\necho "took $(( $(date +%%s) - start )) s"\n' "$q" "$c"
        done
        echo 'command -v claudebox'
    } >"$r/home/user/.readme-block.sh"
    for c in "${readme[@]}"; do [[ "$c" == "sudo "* ]] && root_lines+=("$c"); done
    local script='set -e
as_user() { runuser -u user -- env -i HOME=/home/user USER=user LOGNAME=user LANG=C.UTF-8 \
    TERM=dumb PATH=${CLAUDE_BIN:+$CLAUDE_BIN:}/usr/local/bin:/usr/bin:/bin \
    REPO=/srv/claudebox CARGO_TARGET_DIR=/var/tmp/target bash -ec "$1"; }
for c in "$@"; do
    printf "\$ %s\n" "$c"; start=$(date +%s)
    (cd /home/user && DEBIAN_FRONTEND=noninteractive bash -ec "${c#sudo }")
    echo "took $(( $(date +%s) - start )) s"
done
as_user "cd ~ && bash -e ~/.readme-block.sh"
as_user ". ~/.cargo/env && cd ~/proj && git init -q ."
echo "--- claudebox --check (as user)"; as_user ". ~/.cargo/env && cd ~/proj && claudebox --check" && echo CHECK-OK || echo "CHECK-RC=$?"
echo "--- claudebox --exec true (as user)"; as_user ". ~/.cargo/env && cd ~/proj && claudebox --exec true" && echo LAUNCH-OK
as_user ". ~/.cargo/env && cd ~/proj && claudebox --exec sh -c \"touch made-inside && id -un\""
# The release build has no test switches (issue 34): no CLAUDEBOX_TEST_ name is in the
# installed binary, and a launch with every switch src/ names set (from the checkout, so
# a new one is in) goes as without them; the broker upstream CA switch naming a missing
# file fails a debug build launch (its control: the test_switches_are_debug_only test).
echo "--- test switches (release build)"
as_user ". ~/.cargo/env && ! grep -aq CLAUDEBOX_TEST_ \"\$(command -v claudebox)\"" && echo NO-TEST-SWITCH-NAMES
switches=$(grep -rhoE "CLAUDEBOX_TEST_[A-Z0-9_]+" /home/user/claudebox/src | sort -u | sed "s/\$/=1/" | tr "\n" " ")
echo "switches: $switches"
as_user ". ~/.cargo/env && cd ~/proj && env $switches CLAUDEBOX_TEST_BROKER_UPSTREAM_CA=/nonexistent ANTHROPIC_API_KEY=sk-ant-api03-x \
    claudebox --login-broker --network none --exec sh -c \"touch switched-inside\"" && echo SWITCHES-IGNORED'
    log "$name: the README's install as user, then --check and --exec true"
    # The host's trust store, so that an egress proxy's CA this machine trusts holds inside.
    local ca=()
    [[ -f /etc/ssl/certs/ca-certificates.crt ]] &&
        ca=(--ro-bind /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt)
    set +e
    # Claude Code as the user would have it installed (npm's): the CI's cached one,
    # read-only at the same path, its bin dir on the user's PATH.
    local claude_bin="" claude=()
    if [[ -n "${CLAUDEBOX_TEST_CLAUDE_LATEST:-}" && -x "$CLAUDEBOX_TEST_CLAUDE_LATEST" ]]; then
        claude_bin="$(dirname "$CLAUDEBOX_TEST_CLAUDE_LATEST")"
        local modules
        modules="$(dirname "$claude_bin")"
        mkdir -p "$r$modules"
        claude=(--ro-bind "$modules" "$modules")
    fi
    # /proc is the host's, bound: bwrap's own --proc covers parts of it read-only, and the
    # kernel then refuses the nested bwrap a proc of its own (not fully visible).
    bwrap --bind "$r" / --dev /dev --dev-bind /proc /proc --perms 1777 --tmpfs /tmp \
        "${ca[@]}" "${claude[@]}" \
        --ro-bind "$sysroot" /opt/rust \
        --bind "$cache/cargo-registry" /home/user/.cargo/registry \
        --bind "$cache/target-$name" /var/tmp/target \
        --die-with-parent --chdir / --setenv PATH /usr/sbin:/usr/bin:/sbin:/bin \
        --setenv CLAUDE_BIN "$claude_bin" \
        bash -c "$script" sh "${root_lines[@]}" </dev/null 2>&1 | tee "$work/out" | sed -u "s/^/[$name] /" >&2
    rc=${PIPESTATUS[0]}
    set -e
    if [[ $rc -ne 0 ]] && grep -qE 'failed to (download|fetch|get)|Could not resolve host|index.crates.io' "$work/out" &&
        ! grep -q LAUNCH-OK "$work/out"; then
        rm -rf "$work"; unreachable crates.io
    fi
    grep -q '^LAUNCH-OK$' "$work/out" || { rm -rf "$work"; die "$name: the README's install did not reach a launch (exit $rc)"; }
    # Without Claude Code (no CLAUDEBOX_TEST_CLAUDE_LATEST) --check fails its claude row.
    if [[ -n "$claude_bin" ]] && ! grep -q '^CHECK-OK$' "$work/out"; then
        rm -rf "$work"; die "$name: claudebox --check failed"
    fi
    [[ -f "$r/home/user/proj/made-inside" ]] || { rm -rf "$work"; die "$name: a write inside the project did not reach it"; }
    grep -q '^NO-TEST-SWITCH-NAMES$' "$work/out" || { rm -rf "$work"; die "$name: the release binary holds a CLAUDEBOX_TEST_ name"; }
    { grep -q '^SWITCHES-IGNORED$' "$work/out" && [[ -f "$r/home/user/proj/switched-inside" ]]; } ||
        { rm -rf "$work"; die "$name: the release binary heeds a test switch (its launch failed)"; }
    [[ $rc -eq 0 ]] || { rm -rf "$work"; die "$name: exit $rc"; }
    log "$name: ok ($(grep -E '^took' "$work/out" | tr '\n' ' '))"
    echo "RESULT $name ok"
    rm -rf "$work"
    work=""
}

for d in "${distros[@]}"; do check_one "$d"; done
