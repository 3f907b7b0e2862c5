#!/usr/bin/env bash
# Fetches what the VM tests (tests/vm/apparmor.sh, tests/vm/limits.sh) boot, Ubuntu's kernel
# and Debian's busybox, into the cache they read (tests/vm/lib.sh's vm_fetch), so that
# scripts/test can do it beside the build instead of inside the first VM test. Exits 75
# when the archives are out of reach, as the tests do.
#
#   tests/vm/fetch.sh            # CLAUDEBOX_CI_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/claudebox-ci
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
log() { printf 'vm-fetch: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
source "$ROOT/tests/vm/lib.sh"
cache="${CLAUDEBOX_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/claudebox-ci}"
mkdir -p "$cache"
vm_fetch "$cache" "${UBUNTU_SUITE:-noble-updates}"
log "$vm_cache ready"
