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
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
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
/// and the login's symlink; checks the login ([`check_login`]). Returns the lines to show
/// the user (a login replaced or removed).
pub fn prepare(
    home: &Path,
    host: &HostCodex,
    st: &ProjectState,
    overlays: &[Overlay],
) -> Result<Vec<String>> {
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
    // The login: checked at each launch (every Codex sandbox can write it), seeded from
    // or replaced by the host's auth.json.
    let name = Path::new(LOGIN_FILE);
    let notes = check_login(&login, host)?;
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
    Ok(notes)
}

/// What is at the login's name, judged without following it or blocking on it.
#[derive(Debug, PartialEq, Eq)]
pub enum Login {
    Missing,
    Usable,
    /// Anything else, with what it is (for the user's line).
    Unusable(&'static str),
}

/// The largest `auth.json` read (Codex's holds a few tokens: a few KiB).
const LOGIN_MAX: u64 = 1 << 20;

/// Judges `auth.json` in the login's directory: usable when it is a regular file with one
/// link, owned by this user, opened without following a link or blocking on a FIFO
/// (`O_NOFOLLOW|O_NONBLOCK`, then `fstat`), whose content is a JSON object. Any Codex
/// sandbox can write the directory: a FIFO there hung `codex` in every project, a dangling
/// symlink logged every one out silently (issue 34).
pub fn judge_login(login: &beneath::Dir) -> Login {
    use std::io::Read;
    let name = Path::new(LOGIN_FILE);
    let Some(kind) = login.kind(name) else {
        return Login::Missing;
    };
    match kind {
        beneath::FileType::RegularFile => {}
        beneath::FileType::Symlink => return Login::Unusable("a symlink"),
        beneath::FileType::Fifo => return Login::Unusable("a FIFO"),
        beneath::FileType::Directory => return Login::Unusable("a directory"),
        _ => return Login::Unusable("not a regular file"),
    }
    // open_read: O_NOFOLLOW|O_NONBLOCK beneath the directory, then fstat (a regular file).
    let Ok(f) = login.open_read(name) else {
        return Login::Unusable("not a regular file");
    };
    let Ok(m) = f.metadata() else {
        return Login::Unusable("unreadable");
    };
    if m.uid() != rustix::process::geteuid().as_raw() {
        return Login::Unusable("owned by another user");
    }
    if m.nlink() != 1 {
        return Login::Unusable("a file with more than one link");
    }
    let mut bytes = Vec::new();
    if f.take(LOGIN_MAX + 1).read_to_end(&mut bytes).is_err() || bytes.len() as u64 > LOGIN_MAX {
        return Login::Unusable("unreadable or too large");
    }
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(v) if v.is_object() => Login::Usable,
        _ => Login::Unusable("not a JSON object"),
    }
}

/// The host's own `auth.json` when it is a JSON object (read `O_NONBLOCK`: never waits on
/// a FIFO the user has there).
fn host_login(host: &HostCodex) -> Option<Vec<u8>> {
    use std::io::Read;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_nonblock())
        .open(host.dir.join(LOGIN_FILE))
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    f.take(LOGIN_MAX + 1).read_to_end(&mut bytes).ok()?;
    let ok = bytes.len() as u64 <= LOGIN_MAX
        && serde_json::from_slice::<serde_json::Value>(&bytes).is_ok_and(|v| v.is_object());
    ok.then_some(bytes)
}

fn libc_nonblock() -> i32 {
    nix::libc::O_NONBLOCK
}

/// The debug builds' control for the escape attempts (tests/integration/escape/codex_login.rs):
/// `CLAUDEBOX_TEST_NO_LOGIN_CHECK=1` skips the check, as before issue 34 (the login seeded
/// only when nothing is at its name). A release build never reads it.
fn login_check_off() -> bool {
    crate::host::test_switch::on("CLAUDEBOX_TEST_NO_LOGIN_CHECK")
}

/// Checks the login at a Codex launch ([`judge_login`]): a missing one is seeded from the
/// host's `auth.json`; an unusable one is replaced by it atomically (a new file renamed over
/// the name, which never follows or opens what is there), or removed when the host has
/// none (Codex then asks for a login, and the user is told why). A usable one is kept: it
/// may be a login made inside, or a refreshed token newer than the host's.
pub fn check_login(login: &beneath::Dir, host: &HostCodex) -> Result<Vec<String>> {
    let name = Path::new(LOGIN_FILE);
    let shown = login.shown(name);
    let judged = if login_check_off() {
        match login.kind(name) {
            None => Login::Missing,
            Some(_) => Login::Usable,
        }
    } else {
        judge_login(login)
    };
    let what = match judged {
        Login::Usable => return Ok(Vec::new()),
        Login::Missing => {
            if let Some(bytes) = host_login(host) {
                match login.create_new(name, 0o600) {
                    Ok(mut f) => {
                        use std::io::Write;
                        f.write_all(&bytes)
                            .with_context(|| format!("cannot write {}", shown.display()))?;
                    }
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(e).with_context(|| format!("cannot create {}", shown.display()))
                    }
                }
            }
            return Ok(Vec::new());
        }
        Login::Unusable(what) => what,
    };
    if login.kind(name) == Some(beneath::FileType::Directory) {
        login
            .remove_all(name)
            .with_context(|| format!("cannot remove {}", shown.display()))?;
    }
    let host_file = host.dir.join(LOGIN_FILE);
    match host_login(host) {
        Some(bytes) => {
            login
                .write_atomic(name, &bytes, 0o600, true)
                .with_context(|| format!("cannot replace {}", shown.display()))?;
            Ok(vec![format!(
                "Codex's login {} was {what} (a sandbox can write it); replaced by your {}",
                shown.display(),
                host_file.display()
            )])
        }
        None => {
            match login.remove_all(name) {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot remove {}", shown.display()))
                }
                _ => {}
            }
            Ok(vec![format!(
                "Codex's login {} was {what} (a sandbox can write it); removed, and {} \
                 has none to put in its place: log in to Codex again",
                shown.display(),
                host_file.display()
            )])
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> (tempfile::TempDir, beneath::Dir, HostCodex) {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("login")).unwrap();
        fs::create_dir(t.path().join("host")).unwrap();
        let login = beneath::Dir::open(&t.path().join("login")).unwrap();
        let host = HostCodex {
            dir: t.path().join("host"),
            entries: Vec::new(),
        };
        (t, login, host)
    }

    const GOOD: &str = "{\"auth_mode\":\"apikey\",\"OPENAI_API_KEY\":\"sk-host\"}";

    #[test]
    fn a_login_is_judged_without_following_or_blocking() {
        let (t, login, _) = dirs();
        let p = t.path().join("login/auth.json");
        assert_eq!(judge_login(&login), Login::Missing);
        fs::write(&p, GOOD).unwrap();
        assert_eq!(judge_login(&login), Login::Usable);
        fs::write(&p, "{\"trunc").unwrap();
        assert_eq!(judge_login(&login), Login::Unusable("not a JSON object"));
        fs::write(&p, "[1]").unwrap();
        assert_eq!(judge_login(&login), Login::Unusable("not a JSON object"));
        fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(judge_login(&login), Login::Unusable("a FIFO"));
        fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/nonexistent", &p).unwrap();
        assert_eq!(judge_login(&login), Login::Unusable("a symlink"));
        fs::remove_file(&p).unwrap();
        fs::write(t.path().join("other"), GOOD).unwrap();
        fs::hard_link(t.path().join("other"), &p).unwrap();
        assert_eq!(
            judge_login(&login),
            Login::Unusable("a file with more than one link")
        );
    }

    #[test]
    fn an_unusable_login_is_replaced_from_the_host_or_removed() {
        let (t, login, host) = dirs();
        let p = t.path().join("login/auth.json");
        // Missing: seeded from the host's.
        fs::write(host.dir.join("auth.json"), GOOD).unwrap();
        assert!(check_login(&login, &host).unwrap().is_empty());
        assert_eq!(fs::read_to_string(&p).unwrap(), GOOD);
        // A usable login (made inside, or refreshed) is kept.
        fs::write(&p, "{\"mine\":1}").unwrap();
        assert!(check_login(&login, &host).unwrap().is_empty());
        assert_eq!(fs::read_to_string(&p).unwrap(), "{\"mine\":1}");
        // A FIFO, a dangling symlink, a directory: replaced, with a line.
        for plant in ["fifo", "link", "dir"] {
            let _ = fs::remove_file(&p);
            match plant {
                "fifo" => nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600))
                    .unwrap(),
                "link" => std::os::unix::fs::symlink("/nonexistent", &p).unwrap(),
                _ => fs::create_dir_all(p.join("x")).unwrap(),
            }
            let notes = check_login(&login, &host).unwrap();
            assert_eq!(notes.len(), 1, "{plant}");
            assert!(notes[0].contains("replaced"), "{notes:?}");
            let m = fs::symlink_metadata(&p).unwrap();
            assert!(m.is_file(), "{plant}");
            assert_eq!(fs::read_to_string(&p).unwrap(), GOOD);
        }
        // No host login: removed, with a line.
        fs::remove_file(host.dir.join("auth.json")).unwrap();
        fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/nonexistent", &p).unwrap();
        let notes = check_login(&login, &host).unwrap();
        assert!(notes[0].contains("removed"), "{notes:?}");
        assert!(fs::symlink_metadata(&p).is_err());
    }
}
