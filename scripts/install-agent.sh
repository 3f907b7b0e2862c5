#!/usr/bin/env bash
# Install an agent's CLI from npm into a cache directory outside the repository, and
# print the absolute path of its binary on stdout.
#
#   scripts/install-agent.sh claude             # Claude Code, the pinned version
#   scripts/install-agent.sh claude pinned      # -> /…/claude-code-2.1.197/node_modules/.bin/claude
#   scripts/install-agent.sh claude latest      # -> /…/claude-code-2.1.330/node_modules/.bin/claude
#   scripts/install-agent.sh claude 2.1.300     # any named version
#   scripts/install-agent.sh codex [pinned|latest|VERSION]
#                                               # OpenAI's Codex CLI: /…/codex-0.169.0/…/codex
#
# The tests run with two of each: the pinned version (for Codex, the one
# docs/codex-facts measured), and the newest on npm when it was last checked (the
# table below; claude changes weekly and users have the newest). The latest is always
# named: npm on node 20 otherwise picks an older release (the newest ones declare a
# newer node engine, and install with only a warning when named).
#
# Environment:
#   CLAUDEBOX_CI_CACHE            cache base directory
#                                 (default: ${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci)
#   CLAUDEBOX_CLAUDE_CODE_VERSION, CLAUDEBOX_CODEX_VERSION
#                                 version to install when no version is given
#                                 (default: the pinned one below)
#
# The install is idempotent: when the cache already holds a working binary of the
# version nothing is downloaded. A fresh install goes into a temporary directory next
# to the final one and is renamed into place only once it works, so an interrupted
# install never leaves a half-populated cache.
#
# Only the binary path goes to stdout; all progress goes to stderr.
set -euo pipefail

usage='usage: install-agent.sh claude|codex [pinned|latest|VERSION]'

# The agents: npm package, pinned and latest versions, the variable naming the default
# version, the cache directory's prefix, the binary, and the name in messages.
case "${1:-}" in
    claude)
        PACKAGE="@anthropic-ai/claude-code" PINNED_VERSION="2.1.197" LATEST_VERSION="2.1.330"
        version_var=CLAUDEBOX_CLAUDE_CODE_VERSION dir_prefix=claude-code bin=claude
        what="Claude Code"
        ;;
    codex)
        PACKAGE="@openai/codex" PINNED_VERSION="0.169.0" LATEST_VERSION="0.171.0"
        version_var=CLAUDEBOX_CODEX_VERSION dir_prefix=codex bin=codex
        what="Codex"
        ;;
    *) printf 'install-agent: error: unknown agent %q\n%s\n' "${1:-}" "$usage" >&2; exit 2 ;;
esac
readonly PACKAGE PINNED_VERSION LATEST_VERSION

case "${2:-}" in
    "") version="${!version_var:-$PINNED_VERSION}" ;;
    pinned) version="$PINNED_VERSION" ;;
    latest) version="$LATEST_VERSION" ;;
    [0-9]*.[0-9]*.[0-9]*) version="$2" ;;
    *) printf 'install-agent: error: unknown version %q (pinned, latest or a version)\n' "$2" >&2; exit 2 ;;
esac
cache_base="${CLAUDEBOX_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci}"

log() { printf 'install-agent: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v npm >/dev/null 2>&1 || die "npm not found on PATH"

mkdir -p "$cache_base"
cache_base="$(cd "$cache_base" && pwd -P)"
# The cache is also used by an unprivileged test user: keep it traversable.
chmod a+rx "$cache_base" 2>/dev/null || true

final_dir="$cache_base/$dir_prefix-$version"
bin_rel="node_modules/.bin/$bin"
pkg_rel="node_modules/$PACKAGE"

# Runs `BIN --version` with a throwaway HOME and CODEX_HOME (so nothing touches the
# caller's real ~/.claude or ~/.codex) and checks it reports the expected version
# (claude: "2.1.197 (Claude Code)", codex: "codex-cli 0.169.0").
check_binary() {
    local exe="$1" home out
    [[ -x "$exe" ]] || return 1
    home="$(mktemp -d)"
    out="$(HOME="$home" CODEX_HOME="$home" "$exe" --version 2>/dev/null </dev/null)" || { rm -rf "$home"; return 1; }
    rm -rf "$home"
    [[ "$out" == "$version"* || "$out" == *" $version" ]]
}

if check_binary "$final_dir/$bin_rel"; then
    log "using cached $what $version in $final_dir"
    printf '%s\n' "$final_dir/$bin_rel"
    exit 0
fi

if [[ -e "$final_dir" ]]; then
    log "removing broken cache $final_dir"
    rm -rf "$final_dir"
fi

# Leftovers of installs that were killed outright (SIGKILL, power loss).
find "$cache_base" -mindepth 1 -maxdepth 1 -name ".$dir_prefix-*.tmp.*" -mmin +60 \
    -exec rm -rf {} + 2>/dev/null || true

tmp_dir="$(mktemp -d "$cache_base/.$dir_prefix-$version.tmp.XXXXXX")"
cleanup() { if [[ -n "${tmp_dir:-}" ]]; then rm -rf "$tmp_dir"; fi; }
trap cleanup EXIT

log "installing $PACKAGE@$version into $final_dir (via $tmp_dir)"
start=$(date +%s)
# npm's own output goes to stderr: stdout is reserved for the result path.
# --ignore-scripts=false / --include=optional: the native binary is the platform's
# optional dependency (Claude Code's postinstall copies it over a stub launcher).
npm install \
    --prefix "$tmp_dir" \
    --no-audit --no-fund --no-update-notifier --no-save --no-package-lock \
    --loglevel=warn \
    --ignore-scripts=false --include=optional \
    "$PACKAGE@$version" >&2

if [[ "$bin" == claude ]]; then
    exe="$tmp_dir/$pkg_rel/bin/claude.exe"
    [[ -e "$exe" ]] || die "npm did not install $pkg_rel/bin/claude.exe"
    # If npm skipped the postinstall (npm configs that block install scripts),
    # bin/claude.exe is still a shell stub: run the postinstall ourselves.
    if [[ "$(head -c 4 "$exe" | od -An -c | tr -d ' ')" != '177ELF' ]]; then
        log "native binary not in place (postinstall skipped?); running install.cjs"
        (cd "$tmp_dir/$pkg_rel" && node install.cjs) >&2 \
            || die "postinstall of $PACKAGE failed (is the platform package available?)"
    fi
fi

chmod -R a+rX "$tmp_dir"
check_binary "$tmp_dir/$bin_rel" || die "installed $bin does not report version $version"

# Atomic publish. If a concurrent install won the race, keep its result.
if mv -T "$tmp_dir" "$final_dir" 2>/dev/null; then
    tmp_dir=""
    log "installed $what $version in $(( $(date +%s) - start ))s"
else
    check_binary "$final_dir/$bin_rel" || die "could not move $tmp_dir to $final_dir"
    log "another install finished first; using $final_dir"
fi

printf '%s\n' "$final_dir/$bin_rel"
