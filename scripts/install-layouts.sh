#!/usr/bin/env bash
# Lay out Claude Code and Codex the way their installers do, each in its own tree under a
# cache directory, for tests/integration/layouts.rs (issue 35: every common install
# launches). Prints the directory on stdout; all progress goes to stderr.
#
#   scripts/install-layouts.sh     # -> /…/layouts-claude-2.1.197-codex-0.169.0
#
# Run as root (scripts/test does, in its download phase): the trees are root-owned, as a
# `sudo npm install -g` or a Homebrew or Nix install is. The tests never install into the
# machine's own /usr/local, /home/linuxbrew or /nix: each runs claudebox in a private
# mount namespace whose root shows the machine's own directories with these trees laid
# over them (tests/lab/layout-root.sh), so the machine and the other tests see nothing.
#
# The trees, by the installer that made them:
#   npm-prefix/    `npm install -g --prefix` (the real npm, offline from its cache when it
#                  can): the layout of `sudo npm install -g` in /usr/local and of a user
#                  prefix (`npm config set prefix ~/.npm-global`); an npm prefix holds
#                  only relative links, so the same tree serves both places.
#   project-local/ `npm install --prefix` (not -g): a project's own node_modules, with
#                  node_modules/.bin on PATH (direnv's PATH_add, an npm script).
#   nvm/           nvm's ~/.nvm: versions/node/vNODE/ is that npm prefix (hard-linked
#                  copy, which is what `npm --prefix` into that path makes) plus bin/node,
#                  the machine's node (nvm downloads nodejs.org's build; not reachable).
#   linuxbrew-home/linuxbrew/.linuxbrew
#                  /home/linuxbrew/.linuxbrew: Cellar/node/VER/bin/node with bin/node
#                  linked to it (the machine's node standing in for brew's bottle), claude
#                  through brew's npm (its global prefix is the brew prefix; Homebrew's
#                  claude-code is a macOS cask), codex as brew's formula lays it out
#                  (Cellar/codex/VER/bin/codex, the native binary, bin/codex -> it).
#   pnpm/          `pnpm add -g` (the real pnpm, from npm) with PNPM_HOME its default,
#                  ~/.local/share/pnpm, for a home at /home/claudebox-layouts (pnpm writes
#                  absolute paths: it runs in a private root where that home exists).
#   bun/           `bun add -g` with BUN_INSTALL=bun/ (the real bun, from npm's `bun`).
#   native/        the native installer's layout, reproduced: share/claude/versions/VER is
#                  the native binary (its download host is not reachable here; the npm
#                  package's platform binary is the same build), bin/claude -> it, as
#                  ~/.local/share and ~/.local/bin.
#   nix/           a Nix profile's chain, reproduced: store/HASH-claude-code-VER/bin/claude
#                  is a makeWrapper-style script (its shell in the store) exec'ing
#                  .claude-wrapped, the native binary; store/HASH-codex-VER/bin/codex the
#                  native codex; store/HASH-user-environment/bin/* links to them;
#                  var/nix/profiles/per-user/USER/profile -> profile-1-link -> that.
#
# Idempotent: nothing is done when the directory is complete (its `done` stamp); it is
# built beside the final one and renamed into place. About 2 minutes and 2.3 GB.
set -euo pipefail

CLAUDE_VERSION=2.1.197 CODEX_VERSION=0.169.0 PNPM_VERSION=12.25.1 BUN_VERSION=1.4.5
# The home the layout tests show their world's home at (tests/integration/layouts.rs).
LAYOUT_HOME=/home/claudebox-layouts
lab="$(cd "$(dirname "$0")/../tests/lab" && pwd -P)"
command -v unshare >/dev/null 2>&1 || die "unshare not found (Debian package util-linux)"
[[ "$(id -u)" == 0 ]] || die "run as root: the trees are root-owned, as system installs are"
cache_base="${CLAUDEBOX_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci}"
log() { printf 'install-layouts: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
command -v npm >/dev/null 2>&1 || die "npm not found on PATH"
command -v node >/dev/null 2>&1 || die "node not found on PATH"

mkdir -p "$cache_base"
cache_base="$(cd "$cache_base" && pwd -P)"
final="$cache_base/layouts-claude-$CLAUDE_VERSION-codex-$CODEX_VERSION"
if [[ -e "$final/done" ]]; then
    log "using cached layouts in $final"
    printf '%s\n' "$final"
    exit 0
fi
rm -rf "$final"
find "$cache_base" -mindepth 1 -maxdepth 1 -name ".layouts-*.tmp.*" -mmin +60 \
    -exec rm -rf {} + 2>/dev/null || true
tmp="$(mktemp -d "$cache_base/.layouts-$CLAUDE_VERSION.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
node_version="$(node --version)"
node_bin="$(readlink -f "$(command -v node)")"
claude_pkg="@anthropic-ai/claude-code@$CLAUDE_VERSION"
codex_pkg="@openai/codex@$CODEX_VERSION"
npm_flags=(--no-audit --no-fund --no-update-notifier --loglevel=warn
    --ignore-scripts=false --include=optional)

# npm install -g into PREFIX, from npm's cache when it holds the packages.
npm_global() {
    local prefix="$1"
    shift
    npm install -g --prefix "$prefix" --offline "${npm_flags[@]}" "$@" >&2 2>/dev/null ||
        npm install -g --prefix "$prefix" "${npm_flags[@]}" "$@" >&2
}
# Whether FILE is an ELF binary (Claude Code's postinstall put the native binary in place).
is_elf() { [[ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" == '177ELF' ]]; }
claude_native() { printf '%s\n' "$1/lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe"; }
codex_native() {
    find "$1" -path '*codex-linux-x64*/vendor/*' -name codex -type f | head -n1
}

log "npm install -g (the /usr/local and ~/.npm-global layout)"
npm_global "$tmp/npm-prefix" "$claude_pkg" "$codex_pkg"
is_elf "$(claude_native "$tmp/npm-prefix")" || die "npm left claude.exe a stub (postinstall skipped)"
native_claude="$(claude_native "$tmp/npm-prefix")"
native_codex="$(codex_native "$tmp/npm-prefix")"
[[ -n "$native_codex" ]] || die "no native codex in the npm install"

log "a project-local install (npm install in a project)"
mkdir -p "$tmp/project-local"
npm install --prefix "$tmp/project-local" --offline --no-save --no-package-lock "${npm_flags[@]}" \
    "$claude_pkg" "$codex_pkg" >&2 2>/dev/null ||
    npm install --prefix "$tmp/project-local" --no-save --no-package-lock "${npm_flags[@]}" \
        "$claude_pkg" "$codex_pkg" >&2
is_elf "$tmp/project-local/node_modules/@anthropic-ai/claude-code/bin/claude.exe" ||
    die "npm left the project's claude.exe a stub"

log "nvm's layout (~/.nvm/versions/node/$node_version)"
mkdir -p "$tmp/nvm/versions/node"
cp -al "$tmp/npm-prefix" "$tmp/nvm/versions/node/$node_version"
cp "$node_bin" "$tmp/nvm/versions/node/$node_version/bin/node"
printf '%s\n' "$node_version" >"$tmp/nvm/alias-default"

log "Homebrew on Linux's layout (/home/linuxbrew/.linuxbrew)"
brew="$tmp/linuxbrew-home/linuxbrew/.linuxbrew"
node_ver="${node_version#v}"
mkdir -p "$brew/Cellar/node/$node_ver/bin" "$brew/Cellar/codex/$CODEX_VERSION/bin" "$brew/bin"
cp "$node_bin" "$brew/Cellar/node/$node_ver/bin/node"
ln -s "../Cellar/node/$node_ver/bin/node" "$brew/bin/node"
npm_global "$brew" "$claude_pkg"
is_elf "$(claude_native "$brew")" || die "brew's npm left claude.exe a stub"
cp -l "$native_codex" "$brew/Cellar/codex/$CODEX_VERSION/bin/codex"
ln -s "../Cellar/codex/$CODEX_VERSION/bin/codex" "$brew/bin/codex"

log "pnpm's global layout (pnpm $PNPM_VERSION)"
npm_global "$tmp/tools" "pnpm@$PNPM_VERSION"
# pnpm writes absolute paths (its shims' NODE_PATH and target, its store's links): it
# installs where the tests' home shows it, $LAYOUT_HOME/.local/share/pnpm, in a private
# root where that home is this tree (tests/lab/layout-root.sh, as the tests do).
mkdir -p "$tmp/pnpm" "$tmp/homes/${LAYOUT_HOME#/home/}/.local/share/pnpm" "$tmp/root"
pnpm_home="$LAYOUT_HOME/.local/share/pnpm"
unshare --mount --propagation private sh "$lab/layout-root.sh" "$tmp/root" 0 0 / \
    "over:$tmp/homes:/home" "bind:$tmp/pnpm:$pnpm_home" -- \
    env PNPM_HOME="$pnpm_home" PATH="$pnpm_home/bin:$pnpm_home:$tmp/tools/bin:$PATH" \
    "$tmp/tools/bin/pnpm" add -g --allow-build=@anthropic-ai/claude-code \
    "$claude_pkg" "$codex_pkg" >&2
pnpm_claude="$(find "$tmp/pnpm" -path '*/@anthropic-ai/claude-code/bin/claude.exe' | head -n1)"
is_elf "$pnpm_claude" || die "pnpm left claude.exe a stub ($pnpm_claude)"

log "bun's global layout (bun $BUN_VERSION)"
npm_global "$tmp/tools" "bun@$BUN_VERSION"
mkdir -p "$tmp/bun"
BUN_INSTALL="$tmp/bun" "$tmp/tools/bin/bun" add -g "$claude_pkg" "$codex_pkg" >&2
# bun links ~/.bun/bin/claude to the platform package's binary itself (it skips the
# postinstall of packages it does not trust, and needs it not).
is_elf "$(readlink -f "$tmp/bun/bin/claude")" || die "bun's bin/claude is not the native binary"

log "the native installer's layout (~/.local/share/claude/versions/$CLAUDE_VERSION)"
mkdir -p "$tmp/native/share/claude/versions" "$tmp/native/bin"
cp -l "$native_claude" "$tmp/native/share/claude/versions/$CLAUDE_VERSION"

log "a Nix profile's chain (/nix/store)"
# Files go into $tmp/nix/store; what they name is /nix/store, where the tests show them.
store=/nix/store
bash_drv="$store/0q9wy8l1zfrbj0mkx3dqjq0v1sm7gk3c-bash-5.2p37"
cc_drv="$store/7xq5l1y9sdarjh8whcg2b7n0m0bbb2cd-claude-code-$CLAUDE_VERSION"
cx_drv="$store/3mf8d6n1b9xvyh5ri7zq2a0f4mwl0c1k-codex-$CODEX_VERSION"
env_drv="$store/kk2x8l3h1pwd4f0j6c9n5s7bq1yrz0av-user-environment"
t="$tmp"
[[ -n "$t" && "$t" != / ]] || die "no build directory"
mkdir -p "$t$bash_drv/bin" "$t$cc_drv/bin" "$t$cx_drv/bin" "$t$env_drv/bin"
cp "$(readlink -f /bin/bash)" "$t$bash_drv/bin/bash"
cp -l "$native_claude" "$t$cc_drv/bin/.claude-wrapped"
cat >"$t$cc_drv/bin/claude" <<EOF
#! $bash_drv/bin/bash -e
export DISABLE_AUTOUPDATER='1'
export DISABLE_INSTALLATION_CHECKS='1'
unset DEV
exec -a "\$0" "$cc_drv/bin/.claude-wrapped"  "\$@"
EOF
chmod 555 "$t$cc_drv/bin/claude"
cp -l "$native_codex" "$t$cx_drv/bin/codex"
ln -s "$cc_drv/bin/claude" "$t$env_drv/bin/claude"
ln -s "$cx_drv/bin/codex" "$t$env_drv/bin/codex"
mkdir -p "$t/nix/var/nix/profiles/per-user/user"
ln -s "$env_drv" "$t/nix/var/nix/profiles/per-user/user/profile-1-link"
ln -s profile-1-link "$t/nix/var/nix/profiles/per-user/user/profile"

rm -rf "$tmp/tools" "$tmp/homes" "$tmp/root"
chmod -R a+rX "$tmp"
touch "$tmp/done"
if mv -T "$tmp" "$final" 2>/dev/null; then
    log "laid out in $(($(date +%s) - start))s: $(du -sh "$final" | cut -f1) in $final"
else
    [[ -e "$final/done" ]] || die "could not move $tmp to $final"
fi
printf '%s\n' "$final"
