//! `~/.codex` inside a Codex sandbox (`--agent codex`): the I/O of `policy::codex_home`.
//! What the host has ([`HostCodex::probe`]), and before each launch ([`prepare`]): the
//! project's own Codex directory with a mount point of the right type for every entry
//! bound over it, the login's directory, and `auth.json` in the project's directory a
//! symlink to the login's (made again at each launch: an agent may have replaced it, and
//! Codex's `logout` deletes it). Both directories are written by sandboxes: every call here
//! goes through `state::beneath`, never following a name.

use std::ffi::OsString;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::state::{self, beneath, ProjectState};

use crate::policy::claude_home::Overlay;
use crate::policy::codex_home::{HostCodex, LOGIN_FILE};

impl HostCodex {
    /// Reads the real Codex directory's entry names (one `readdir`).
    pub fn probe(home: &Path) -> HostCodex {
        let dir = match std::env::var_os("CODEX_HOME") {
            Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d),
            _ => home.join(".codex"),
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
        HostCodex { dir, entries }
    }
}

/// Makes the project's `~/.codex`, the login's directory, the mount points of `overlays`
/// and the login's symlink; seeds the login from the host's `auth.json` when it has none.
pub fn prepare(
    home: &Path,
    host: &HostCodex,
    st: &ProjectState,
    overlays: &[Overlay],
) -> Result<()> {
    let dir_path = st.codex_home();
    let login_path = st.codex_login_dir();
    state::mkdir_private(&dir_path)?;
    state::mkdir_private(&login_path)?;
    let dir = open_root(&dir_path)?;
    let login = open_root(&login_path)?;
    let inside = home.join(".codex");
    for o in overlays {
        let (target, file) = match o {
            Overlay::Bind { target, file, .. } => (target, *file),
            Overlay::EmptyDir { target, .. } | Overlay::Tmpfs { target, .. } => (target, false),
        };
        // Only the entries directly in the project's directory are mount points here.
        let Ok(rel) = target.strip_prefix(&inside) else {
            continue;
        };
        if rel.as_os_str().is_empty() || rel.components().count() != 1 {
            continue;
        }
        let want = if file {
            beneath::FileType::RegularFile
        } else {
            beneath::FileType::Directory
        };
        ensure(&dir, rel, want, || {
            if file {
                dir.create_new(rel, 0o600).map(drop)
            } else {
                dir.mkdir(rel, 0o700)
            }
        })
        .with_context(|| format!("cannot create {}", dir_path.join(rel).display()))?;
    }
    // The login: the host's auth.json copied in once, when the login has none.
    let name = Path::new(LOGIN_FILE);
    if login.kind(name).is_none() {
        if let Ok(bytes) = fs::read(host.dir.join(LOGIN_FILE)) {
            match login.create_new(name, 0o600) {
                Ok(mut f) => {
                    use std::io::Write;
                    f.write_all(&bytes).with_context(|| {
                        format!("cannot write {}", login_path.join(name).display())
                    })?;
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot create {}", login_path.join(name).display())
                    })
                }
            }
        }
    }
    let target = login_path.join(LOGIN_FILE);
    if dir.read_link(name).ok().as_deref() != Some(target.as_path()) {
        if dir.kind(name).is_some() {
            // Left by an agent (the directory is writable inside), or Codex's own file
            // after a logout and login inside: never the user's.
            dir.remove_all(name)
                .with_context(|| format!("cannot replace {}", dir_path.join(name).display()))?;
        }
        match dir.symlink(&target, name) {
            Err(e)
                if e.kind() == ErrorKind::AlreadyExists
                    && dir.read_link(name).ok().as_deref() == Some(target.as_path()) => {}
            r => r.with_context(|| format!("cannot create {}", dir_path.join(name).display()))?,
        }
    }
    Ok(())
}

/// `rel` is a `want` in `dir`: anything else there (a symlink, the wrong type) is removed
/// and `make` makes it.
fn ensure(
    dir: &beneath::Dir,
    rel: &Path,
    want: beneath::FileType,
    make: impl Fn() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let kind = dir.kind(rel);
    if kind == Some(want) {
        return Ok(());
    }
    if kind.is_some() {
        match dir.remove_all(rel) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    match make() {
        Err(e) if e.kind() == ErrorKind::AlreadyExists && dir.kind(rel) == Some(want) => Ok(()),
        r => r,
    }
}

fn open_root(p: &Path) -> Result<beneath::Dir> {
    beneath::Dir::open(p).with_context(|| format!("cannot open {}", p.display()))
}

/// Codex's threads in the project's own `~/.codex`: the ids of its rollout files,
/// `sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl` and `archived_sessions/rollout-*.jsonl`
/// (regular files only; every lookup beneath the directory's descriptor, as a sandbox
/// writes there).
pub fn threads(st: &ProjectState) -> Vec<String> {
    let mut out: Vec<String> = rollouts(st).into_iter().map(|(id, _)| id).collect();
    out.sort();
    out.dedup();
    out
}

/// Every rollout file: its thread id and its path relative to the project's `~/.codex`.
fn rollouts(st: &ProjectState) -> Vec<(String, PathBuf)> {
    let Ok(dir) = beneath::Dir::open(&st.codex_home()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let subdirs = |rel: &Path| -> Vec<PathBuf> {
        dir.entries(rel)
            .unwrap_or_default()
            .into_iter()
            .filter(|(n, _)| {
                n.len() <= 4
                    && n.to_str()
                        .is_some_and(|s| s.bytes().all(|c| c.is_ascii_digit()))
            })
            .map(|(n, _)| rel.join(n))
            .filter(|p| dir.is_dir(p))
            .collect()
    };
    let mut leaves = vec![PathBuf::from("archived_sessions")];
    for y in subdirs(Path::new("sessions")) {
        for m in subdirs(&y) {
            leaves.extend(subdirs(&m));
        }
    }
    for leaf in leaves {
        for (name, _) in dir.entries(&leaf).unwrap_or_default() {
            if let Some(id) = rollout_id(&name) {
                let rel = leaf.join(&name);
                if dir.is_file(&rel) {
                    out.push((id, rel));
                }
            }
        }
    }
    out
}

/// The directory a thread was started in: `payload.cwd` of its rollout's first line (the
/// `session_meta` record), read beneath the project's `~/.codex`. `None` when unreadable.
pub fn thread_cwd(st: &ProjectState, id: &str) -> Option<PathBuf> {
    use std::io::{BufRead, BufReader, Read};
    let dir = beneath::Dir::open(&st.codex_home()).ok()?;
    let (_, rel) = rollouts(st).into_iter().find(|(i, _)| i == id)?;
    let f = dir.open_read(&rel).ok()?;
    let mut line = Vec::new();
    // The first line holds Codex's instructions too: a few hundred KiB at most.
    BufReader::new(f.take(4 << 20))
        .read_until(b'\n', &mut line)
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&line).ok()?;
    v["payload"]["cwd"].as_str().map(PathBuf::from)
}

/// The thread id in a rollout file's name, `rollout-<time>-<uuid>.jsonl`.
pub fn rollout_id(name: &std::ffi::OsStr) -> Option<String> {
    let s = name.to_str()?;
    let stem = s.strip_prefix("rollout-")?.strip_suffix(".jsonl")?;
    let id = stem.get(stem.len().checked_sub(36)?..)?;
    crate::state::sessions::is_uuid(id).then(|| id.to_ascii_lowercase())
}

/// When a thread was made, from its id: Codex's ids are UUID v7, whose first 48 bits are
/// the Unix time in milliseconds. `None` for another kind of UUID.
pub fn thread_time(id: &str) -> Option<std::time::SystemTime> {
    if id.len() != 36 || id.as_bytes()[14] != b'7' {
        return None;
    }
    let hex: String = id[..13].chars().filter(|c| *c != '-').collect();
    let ms = u64::from_str_radix(&hex, 16).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
}

#[cfg(test)]
mod thread_tests {
    use super::*;

    #[test]
    fn ids_and_times_come_from_rollout_names() {
        let n = "rollout-2026-11-28T03-20-01-019ac8d1-2f3a-7b4c-9d5e-0123456789ab.jsonl";
        let id = rollout_id(std::ffi::OsStr::new(n)).unwrap();
        assert_eq!(id, "019ac8d1-2f3a-7b4c-9d5e-0123456789ab");
        let t = thread_time(&id).unwrap();
        let ms = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
        assert_eq!(ms, 0x019ac8d12f3a);
        assert!(rollout_id(std::ffi::OsStr::new("rollout-x.jsonl")).is_none());
        assert!(rollout_id(std::ffi::OsStr::new(
            "x-019ac8d1-2f3a-7b4c-9d5e-0123456789ab.jsonl"
        ))
        .is_none());
        assert!(thread_time("019ac8d1-2f3a-4b4c-9d5e-0123456789ab").is_none());
    }
}
