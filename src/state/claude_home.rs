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
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::state::{self, ProjectState};

pub use crate::policy::claude_home::{
    class_of, entry, overlays, Class, Entry, HostClaude, Kind, Overlay, TABLE, WITHIN,
};

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
        if point.parent() != Some(dir.as_path()) && point.parent() != Some(login.as_path()) {
            continue;
        }
        let meta = fs::symlink_metadata(&point);
        let right = meta.as_ref().is_ok_and(|m| {
            if file {
                m.file_type().is_file()
            } else {
                m.file_type().is_dir()
            }
        });
        if right {
            continue;
        }
        if let Ok(m) = &meta {
            // Wrong type or a symlink: left by an agent (the directory is writable
            // inside). Remove it; it never was the user's.
            let removed = if m.is_dir() {
                fs::remove_dir_all(&point)
            } else {
                fs::remove_file(&point)
            };
            match removed {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot replace {}", point.display()))
                }
                _ => {}
            }
        }
        let made = if file {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&point)
                .map(drop)
        } else {
            fs::DirBuilder::new().mode(0o700).create(&point)
        };
        match made {
            Ok(()) => {}
            // A sibling launch of the project made it at the same moment: fine if it is
            // what it must be.
            Err(e)
                if e.kind() == ErrorKind::AlreadyExists
                    && fs::symlink_metadata(&point).is_ok_and(|m| {
                        if file {
                            m.file_type().is_file()
                        } else {
                            m.file_type().is_dir()
                        }
                    }) => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", point.display())),
        }
    }
    Ok(())
}

mod claude_json;
pub use claude_json::sync_config;
#[cfg(test)]
use claude_json::{filter_for_project, held_by_a_dead_launch, is_this_project, merge, ConfigLock};

#[cfg(test)]
mod tests;
