//! Package managers' download caches inside the sandbox, as data: one row per cache with
//! where it lives in the home, the variable that names it, and why ([`TABLE`]). The home
//! inside is an empty tmpfs, so without them every session downloads every package again
//! and `npm ci --offline` fails (ENOTCACHED). Each cache is the project's own, kept in the
//! state (`<state>/projects/<id>/caches/<name>`) and shared by the project's sandboxes:
//! never the host's (another project's agent could put a poisoned package there that
//! this project, or the host, then installs without a download; see docs/security.md).
//! Sharing the host's is your opt-in: `--rw ~/.npm` (an extra mount, after these).

use std::path::{Path, PathBuf};

/// One package cache.
pub struct Cache {
    /// Its directory in the state (`caches/<name>`).
    pub name: &'static str,
    /// Where the tool keeps it by default, relative to the home.
    pub path: &'static str,
    /// The variable that moves it, set inside to `path` (so that a host value pointing
    /// elsewhere does not lead to a path that is not there); none where setting it would
    /// move more than the cache (`CARGO_HOME` holds the installed binaries and config).
    pub var: Option<&'static str>,
    pub why: &'static str,
}

const fn row(
    name: &'static str,
    path: &'static str,
    var: Option<&'static str>,
    why: &'static str,
) -> Cache {
    Cache {
        name,
        path,
        var,
        why,
    }
}

/// Every cache claudebox keeps per project. A new one is one line.
#[rustfmt::skip]
pub const TABLE: &[Cache] = &[
    row("npm", ".npm", Some("npm_config_cache"), "npm's tarballs and metadata (_cacache): npm ci --offline, and installs without downloading again"),
    row("cargo-registry", ".cargo/registry", None, "cargo's crates.io index and .crate files (CARGO_HOME moves the installed binaries too)"),
    row("cargo-git", ".cargo/git", None, "cargo's git dependencies' checkouts"),
    row("pip", ".cache/pip", Some("PIP_CACHE_DIR"), "pip's wheels and HTTP cache"),
    row("uv", ".cache/uv", Some("UV_CACHE_DIR"), "uv's wheels and sources"),
    row("go-mod", "go/pkg/mod", Some("GOMODCACHE"), "Go's module downloads"),
    row("go-build", ".cache/go-build", Some("GOCACHE"), "Go's build cache"),
    row("maven", ".m2/repository", None, "Maven's local repository (not ~/.m2 whole: settings.xml there holds credentials; the path is set in settings.xml or -Dmaven.repo.local)"),
    row("gradle", ".gradle/caches", None, "Gradle's dependency and build caches (GRADLE_USER_HOME moves its properties and credentials too)"),
    row("yarn", ".cache/yarn", Some("YARN_CACHE_FOLDER"), "yarn 1's package cache"),
    row("yarn-berry", ".yarn/berry/cache", None, "yarn 2+'s global cache"),
    row("pnpm", ".local/share/pnpm/store", Some("npm_config_store_dir"), "pnpm's content-addressed store"),
];

/// Where a cache is mounted inside.
pub fn target(home: &Path, c: &Cache) -> PathBuf {
    home.join(c.path)
}
