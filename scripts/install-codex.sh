#!/usr/bin/env bash
# Install OpenAI's Codex CLI from npm into a cache directory outside the repository,
# and print the absolute path of its `codex` binary on stdout (the same shape as
# scripts/install-claude-code.sh).
#
#   scripts/install-codex.sh            # the pinned version
#   scripts/install-codex.sh pinned     # -> /…/codex-0.169.0/node_modules/.bin/codex
#   scripts/install-codex.sh latest     # -> /…/codex-0.171.0/node_modules/.bin/codex
#   scripts/install-codex.sh 0.170.0    # any named version
#
# The tests run with two: the pinned version (the one docs/codex-facts measured) and the
# newest on npm when it was last checked (LATEST_VERSION below).
#
# Environment:
#   CLAUDEBOX_CI_CACHE            cache base directory
#                                 (default: ${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci)
#   CLAUDEBOX_CODEX_VERSION version to install when no argument is given
#                                 (default: the pinned one below)
#
# The install is idempotent: when the cache already holds a working binary of
# the pinned version nothing is downloaded. A fresh install goes into a temporary
# directory next to the final one and is renamed into place only once it works,
# so an interrupted install never leaves a half-populated cache.
#
# Only the binary path goes to stdout; all progress goes to stderr.
set -euo pipefail

readonly PINNED_VERSION="0.169.0"
readonly LATEST_VERSION="0.171.0"
readonly PACKAGE="@openai/codex"

case "${1:-}" in
    "") version="${CLAUDEBOX_CODEX_VERSION:-$PINNED_VERSION}" ;;
    pinned) version="$PINNED_VERSION" ;;
    latest) version="$LATEST_VERSION" ;;
    [0-9]*.[0-9]*.[0-9]*) version="$1" ;;
    *) printf 'install-codex: error: unknown argument %q (pinned, latest or a version)\n' "$1" >&2; exit 2 ;;
esac
cache_base="${CLAUDEBOX_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci}"

log() { printf 'install-codex: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v npm >/dev/null 2>&1 || die "npm not found on PATH"

mkdir -p "$cache_base"
cache_base="$(cd "$cache_base" && pwd -P)"
# The cache is also used by an unprivileged test user: keep it traversable.
chmod a+rx "$cache_base" 2>/dev/null || true

final_dir="$cache_base/codex-$version"
bin_rel="node_modules/.bin/codex"
pkg_rel="node_modules/$PACKAGE"

# Runs `codex --version` with a throwaway HOME and CODEX_HOME (so nothing touches the
# caller's real ~/.codex) and checks it reports the expected version.
check_binary() {
    local codex="$1" home out
    [[ -x "$codex" ]] || return 1
    home="$(mktemp -d)"
    out="$(HOME="$home" CODEX_HOME="$home" "$codex" --version 2>/dev/null </dev/null)" || { rm -rf "$home"; return 1; }
    rm -rf "$home"
    [[ "$out" == *" $version" ]]
}

if check_binary "$final_dir/$bin_rel"; then
    log "using cached Codex $version in $final_dir"
    printf '%s\n' "$final_dir/$bin_rel"
    exit 0
fi

if [[ -e "$final_dir" ]]; then
    log "removing broken cache $final_dir"
    rm -rf "$final_dir"
fi

# Leftovers of installs that were killed outright (SIGKILL, power loss).
find "$cache_base" -mindepth 1 -maxdepth 1 -name '.codex-*.tmp.*' -mmin +60 \
    -exec rm -rf {} + 2>/dev/null || true

tmp_dir="$(mktemp -d "$cache_base/.codex-$version.tmp.XXXXXX")"
cleanup() { if [[ -n "${tmp_dir:-}" ]]; then rm -rf "$tmp_dir"; fi; }
trap cleanup EXIT

log "installing $PACKAGE@$version into $final_dir (via $tmp_dir)"
start=$(date +%s)
# npm's own output goes to stderr: stdout is reserved for the result path.
# --include=optional: the native binary is the platform's optional dependency.
npm install \
    --prefix "$tmp_dir" \
    --no-audit --no-fund --no-update-notifier --no-save --no-package-lock \
    --loglevel=warn \
    --include=optional \
    "$PACKAGE@$version" >&2

chmod -R a+rX "$tmp_dir"
check_binary "$tmp_dir/$bin_rel" || die "installed codex does not report version $version"

# Atomic publish. If a concurrent install won the race, keep its result.
if mv -T "$tmp_dir" "$final_dir" 2>/dev/null; then
    tmp_dir=""
    log "installed Codex $version in $(( $(date +%s) - start ))s"
else
    check_binary "$final_dir/$bin_rel" || die "could not move $tmp_dir to $final_dir"
    log "another install finished first; using $final_dir"
fi

printf '%s\n' "$final_dir/$bin_rel"
