//! `~/.claude` and `~/.claude.json` inside the sandbox: which entries of the user's real
//! Claude Code directory the agent sees, which are this project's or this launch's own,
//! and how the project's copy of `.claude.json` follows the host's.
//!
//! The table ([`TABLE`]) and the pure `overlays` are data in `policy::claude_home`;
//! here the I/O. One table, one row per entry of `~/.claude`, each with its class and why.
//! It was taken from `strace -f -e trace=file` of claude 2.1.330 and 2.1.197 (`-p` with a
//! Bash tool call, `mcp add`, plugin commands), not from memory. An entry of the real
//! directory that no row names is [`Class::Setup`]: visible, read-only; unless its name
//! says it is data (a hook's `*.log`, see `policy::claude_home::is_data`): the project's.
//!
//! Inside, `~/.claude` is the project's own directory in claudebox's state
//! (`projects/<id>/claude-config/`, read-write, shared by the project's sandboxes), with
//! over it: the Setup entries of the real directory read-only, the project's
//! conversations and prompt history (kept where earlier claudebox versions kept them),
//! an empty tmpfs per Launch entry, and the login's credentials file read-write.
//! `CLAUDE_CONFIG_DIR=$HOME/.claude` makes claude keep its config at
//! `~/.claude/.claude.json` there, with its lock directory beside it: one lock for every
//! sandbox of the project, and an atomic rename that works (a directory bind).

use std::ffi::OsString;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::policy::escape::Shown;
use crate::state::{self, beneath, ProjectState};

use crate::policy::claude_home::{HostClaude, Overlay, WITHIN};

impl HostClaude {
    /// Reads the real config dir's entry names (one `readdir`).
    pub fn probe(home: &Path) -> HostClaude {
        let (dir, json) = match std::env::var_os("CLAUDE_CONFIG_DIR") {
            Some(d) if Path::new(&d).is_absolute() => {
                let d = PathBuf::from(d);
                let json = d.join(".claude.json");
                (d, json)
            }
            _ => (home.join(".claude"), home.join(".claude.json")),
        };
        let mut entries: Vec<(OsString, bool)> = fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let ft = e.file_type().ok()?;
                // A symlink counts as what it leads to (bwrap binds its target).
                let is_dir = if ft.is_symlink() {
                    fs::metadata(e.path()).ok()?.is_dir()
                } else {
                    ft.is_dir()
                };
                Some((e.file_name(), is_dir))
            })
            .collect();
        entries.sort();
        let secure = std::env::var_os("CLAUDE_SECURESTORAGE_CONFIG_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute())
            .unwrap_or_else(|| dir.clone());
        let credentials = Some(secure.join(".credentials.json")).filter(|c| c.is_file());
        // A WITHIN row's mount point: its parent a directory (through a symlink, as bwrap
        // binds it), the entry a real directory or absent; anything else gets no mount.
        let within = WITHIN
            .iter()
            .filter(|w| entries.iter().any(|(n, d)| *d && n == w.parent))
            .map(|w| dir.join(w.parent).join(w.name))
            .filter(|p| match fs::symlink_metadata(p) {
                Ok(m) => m.file_type().is_dir(),
                Err(e) => e.kind() == ErrorKind::NotFound,
            })
            .collect();
        HostClaude {
            dir,
            json,
            entries,
            credentials,
            within,
        }
    }
}

/// Makes the mount points of the group exist as what they must be (never a symlink an
/// earlier sandbox left to redirect a mount), so bwrap does not create them and no mount
/// lands elsewhere. Inside claudebox's state: the project's directory (seen at
/// `~/.claude`) and the login directory; in the host's setup only the mount point of a
/// [`WITHIN`] row (`~/.claude/plugins/data`, an empty directory, as claude itself makes it
/// at the first plugin hook), and never through a symlink.
pub fn prepare_mount_points(
    home: &Path,
    host: &HostClaude,
    st: &ProjectState,
    overlays: &[Overlay],
) -> Result<()> {
    let dir = st.claude_config();
    let login = st.login_dir();
    state::mkdir_private(&dir)?;
    state::mkdir_private(&login)?;
    let inside = home.join(".claude");
    for w in WITHIN {
        let target = inside.join(w.parent).join(w.name);
        let mounted = overlays
            .iter()
            .any(|o| matches!(o, Overlay::Bind { target: t, .. } if *t == target));
        if mounted {
            state::mkdir_private(&st.dir.join(w.state))?;
            state::mkdir_private(&host.dir.join(w.parent).join(w.name))?;
        }
    }
    // Both roots are written by sandboxes: every call below is beneath their descriptors.
    let roots = [
        (dir.as_path(), open_root(&dir)?),
        (login.as_path(), open_root(&login)?),
    ];
    for o in overlays {
        let (target, file) = match o {
            Overlay::Bind { target, file, .. } => (target, *file),
            Overlay::EmptyDir { target, .. } | Overlay::Tmpfs { target, .. } => (target, false),
        };
        let point = if let Ok(rel) = target.strip_prefix(&inside) {
            dir.join(rel)
        } else {
            target.clone()
        };
        // Only the entries directly in one of the two roots are mount points.
        let Some((_, root)) = roots.iter().find(|(r, _)| point.parent() == Some(*r)) else {
            continue;
        };
        let Some(name) = point.file_name().map(Path::new) else {
            continue;
        };
        let want = if file {
            beneath::FileType::RegularFile
        } else {
            beneath::FileType::Directory
        };
        let kind = root.kind(name);
        if kind == Some(want) {
            continue;
        }
        if kind.is_some() {
            // Wrong type or a symlink: left by an agent (the directory is writable
            // inside). Remove it; it never was the user's.
            match root.remove_all(name) {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot replace {}", point.display()))
                }
                _ => {}
            }
        }
        let made = if file {
            root.create_new(name, 0o600).map(drop)
        } else {
            root.mkdir(name, 0o700)
        };
        match made {
            Ok(()) => {}
            // A sibling launch of the project made it at the same moment: fine if it is
            // what it must be.
            Err(e) if e.kind() == ErrorKind::AlreadyExists && root.kind(name) == Some(want) => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", point.display())),
        }
    }
    // Locks an agent planted in the login directory (shared by every project's sandboxes)
    // or in the project's: dated in the future, claude would never take them over.
    let (config, login_dir) = (&roots[0].1, &roots[1].1);
    for name in LOGIN_LOCKS {
        beneath::clear_planted_lock(login_dir, Path::new(name));
    }
    for name in PROJECT_LOCKS {
        beneath::clear_planted_lock(config, Path::new(name));
    }
    Ok(())
}

/// claude's lock directories in the login directory (its `CLAUDE_SECURESTORAGE_CONFIG_DIR`),
/// made by any claude of any project (measured, claude 2.1.330).
pub const LOGIN_LOCKS: &[&str] = &[
    ".oauth_refresh.lock",
    ".hybrid_oauth_refresh.lock",
    ".storage-write.lock",
];
/// claude's lock directories in the project's `~/.claude`, shared by its sandboxes.
pub const PROJECT_LOCKS: &[&str] = &[
    ".claude.json.lock",
    ".oauth_refresh.lock",
    ".hybrid_oauth_refresh.lock",
    ".storage-write.lock",
];

fn open_root(p: &Path) -> Result<beneath::Dir> {
    beneath::Dir::open(p).with_context(|| format!("cannot open {}", p.display()))
}

mod claude_json;
// `claude_json` is a private file of this module: its one entry point is named here.
pub use claude_json::sync_config;
#[cfg(test)]
use claude_json::{filter_for_project, held_by_a_dead_launch, is_this_project, merge, ConfigLock};

#[cfg(test)]
mod tests;

/// What the user's own `settings.json` gives the login broker to lend (each field its
/// path, `None` when it does not): an `apiKeyHelper` (run on the host), an
/// `ANTHROPIC_API_KEY` in its `env` block (claude applies it over its environment).
#[derive(Debug, Default)]
pub struct SettingsKeys {
    pub api_key_helper: Option<PathBuf>,
    pub api_key: Option<PathBuf>,
}

/// Reads the user's own `settings.json` once for [`SettingsKeys`]. Its helper is refused
/// when the file lies in the project (a symlink into a dotfiles project, say): the agent
/// could write the command the host would run.
pub fn settings_keys(host: &HostClaude, work_tree: &Path) -> Result<SettingsKeys> {
    if !host.entries.iter().any(|(n, _)| n == "settings.json") {
        return Ok(SettingsKeys::default());
    }
    let path = host.dir.join("settings.json");
    let Some(v) = fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
    else {
        return Ok(SettingsKeys::default());
    };
    let helper = v["apiKeyHelper"]
        .as_str()
        .is_some_and(|c| !c.trim().is_empty());
    let key = v["env"][crate::policy::network::SETTINGS_KEY_ENV]
        .as_str()
        .is_some_and(|k| !k.is_empty());
    if helper {
        let real = fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        let tree = fs::canonicalize(work_tree).unwrap_or_else(|_| work_tree.to_path_buf());
        if real.starts_with(&tree) {
            anyhow::bail!(
                "your apiKeyHelper is in {}, which lies in the project (the agent can write \
                 it) and the login broker would run it on the host; move it, or use \
                 --no-login-broker",
                real.shown()
            );
        }
    }
    Ok(SettingsKeys {
        api_key_helper: helper.then(|| path.clone()),
        api_key: key.then_some(path),
    })
}

/// Writes the project's copy of the user's `settings.json` for a launch whose broker
/// runs the user's `apiKeyHelper` on the host or lends the key of its `env` block: the
/// same settings, the helper (when `helper`) replaced by one printing the sandbox's
/// stand-in key (see `network::inside_api_key_helper`), the `env` block's key removed
/// (the stand-in is in claude's environment).
pub fn write_broker_settings(settings: &Path, st: &ProjectState, helper: bool) -> Result<()> {
    let text = fs::read_to_string(settings)
        .with_context(|| format!("cannot read {}", settings.shown()))?;
    let mut v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", settings.shown()))?;
    if helper {
        let login = st.login_dir();
        let helper = crate::policy::network::inside_api_key_helper(&login).with_context(|| {
            format!(
                "the login broker's apiKeyHelper: {} is no UTF-8",
                login.shown()
            )
        })?;
        v["apiKeyHelper"] = helper.into();
    }
    if let Some(env) = v.get_mut("env").and_then(|e| e.as_object_mut()) {
        env.remove(crate::policy::network::SETTINGS_KEY_ENV);
    }
    // The Bypass Permissions answer given in an earlier sandbox (this file is read-only
    // inside, so none is given here).
    crate::state::keep_bypass_consent(st);
    if fs::symlink_metadata(st.bypass_consent()).is_ok() {
        if let Some(m) = v.as_object_mut() {
            m.insert(
                crate::policy::claude_home::BYPASS_KEY.into(),
                serde_json::Value::Bool(true),
            );
        }
    }
    let path = st.broker_settings();
    let dir =
        beneath::Dir::open(&st.dir).with_context(|| format!("cannot open {}", st.dir.shown()))?;
    let name = Path::new(path.file_name().unwrap_or_default());
    dir.write_atomic(name, v.to_string().as_bytes(), 0o600, false)
        .with_context(|| format!("cannot write {}", path.shown()))
}
