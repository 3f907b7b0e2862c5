//! What state exists: one record per `projects/<id>/` directory, read without following
//! symlinks and without changing anything. Shared by `--list` and `--gc`.

use std::ffi::CStr;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, FileStat, SFlag};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};

use crate::policy::escape::Shown;
use crate::policy::facts::project_id;
use crate::state::inuse;
use crate::state::{self, StateHome};

/// Longest `project-root` accepted (Linux's PATH_MAX).
const MAX_ROOT_LEN: usize = 4096;

/// Prefix of a directory `--gc` is removing (renamed first, so no launch can use it).
pub const TRASH_PREFIX: &str = ".gc-";

/// What `project-root` says, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Root {
    /// A valid root that hashes to the directory's name.
    Recorded { path: PathBuf, exists: Exists },
    /// Missing, unreadable, invalid or not matching the directory: never removed.
    Problem(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exists {
    Yes,
    No,
    /// lstat failed for another reason than "not there" (permissions, I/O).
    Unknown(String),
}

/// One project's state directory.
#[derive(Debug, Clone)]
pub struct ProjectEntry {
    pub id: String,
    pub dir: PathBuf,
    pub root: Root,
    /// Bytes used on disk (st_blocks * 512), symlinks not followed, hard links once,
    /// however deep (see `du`); only when asked for (`Detail::size`).
    pub size: Option<u64>,
    /// When a launch last registered (mtime of `lock`, else of the directory).
    pub last_used: Option<SystemTime>,
    /// Sandboxes running on it now.
    pub running: Option<usize>,
    /// Slots of `running/` held by bwraps stuck at start, with their pids (with
    /// `Detail::running`; found by the same look as `running`).
    pub stuck: Vec<(PathBuf, Vec<i32>)>,
    /// Named sessions (issue 4 fills this in; see [`sessions`]).
    pub sessions: Vec<serde_json::Value>,
    /// When `--gc` first found the root missing (`root-missing-since`), if it did.
    pub missing_since: Option<SystemTime>,
    /// The newest conversation: a regular file `<uuid>.jsonl` in a directory of the
    /// project's conversations, and when it was last written (found by the same walk as
    /// the size; only a UUID is kept, never a name the agent chose).
    pub last_conversation: Option<(SystemTime, String)>,
    /// Entries the exit review moved aside (`quarantine/<ID>/`), each restorable with
    /// `claudebox --restore ID` while the project exists.
    pub quarantined: usize,
    /// The agents whose state the project holds (`policy::agent` names): claude when its
    /// conversations directory holds any, codex when it has its own `~/.codex`.
    pub agents: Vec<&'static str>,
}

/// Something in `projects/` that is not a project directory: left alone.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub path: PathBuf,
    pub why: &'static str,
}

#[derive(Debug, Default)]
pub struct Inventory {
    pub entries: Vec<ProjectEntry>,
    pub skipped: Vec<Skipped>,
    /// Directories left by an interrupted `--gc`.
    pub trash: Vec<PathBuf>,
    /// Project directories being made (`.new-*`), or left by a first launch killed
    /// while it made one.
    pub unfinished: Vec<PathBuf>,
}

/// How much to find out about each entry (`--gc` needs only the root).
#[derive(Debug, Clone, Copy)]
pub struct Detail {
    /// Walk the whole state for its size (`--list --sizes`): 10,000 projects made by real
    /// launches hold ~400,000 entries.
    pub size: bool,
    pub running: bool,
}

/// The projects directory, refusing a symlink (the launch refuses one too).
pub fn projects_dir(home: &StateHome) -> Result<Option<PathBuf>> {
    let dir = home.projects();
    match fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(Some(dir)),
        Ok(_) => bail!(
            "{} is not a directory (a symlink or a file); claudebox leaves it alone",
            dir.shown()
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", dir.shown())),
    }
}

pub fn scan(home: &StateHome, detail: Detail) -> Result<Inventory> {
    let mut inv = Inventory::default();
    let Some(dir) = projects_dir(home)? else {
        return Ok(inv);
    };
    let rd = fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.shown()))?;
    let mut found = Vec::new();
    for entry in rd {
        let entry = entry.with_context(|| format!("cannot read {}", dir.shown()))?;
        let name = entry.file_name();
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if name.as_bytes().starts_with(TRASH_PREFIX.as_bytes()) && is_dir {
            inv.trash.push(path);
            continue;
        }
        if name.as_bytes().starts_with(state::NEW_PREFIX.as_bytes()) && is_dir {
            inv.unfinished.push(path);
            continue;
        }
        let Some(id) = project_name(&name) else {
            inv.skipped.push(Skipped {
                path,
                why: "not a claudebox project directory name",
            });
            continue;
        };
        if !is_dir {
            inv.skipped.push(Skipped {
                path,
                why: "not a directory (a symlink or a file)",
            });
            continue;
        }
        found.push((id, path));
    }
    inv.entries = read_entries(found, detail);
    inv.entries.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(inv)
}

/// 16 lowercase hex characters, as `project::project_id` makes them.
fn project_name(name: &OsStr) -> Option<String> {
    let b = name.as_bytes();
    (b.len() == 16 && b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| String::from_utf8_lossy(b).into_owned())
}

/// Reads the entries on a few threads: the work is independent syscalls per directory.
fn read_entries(found: Vec<(String, PathBuf)>, detail: Detail) -> Vec<ProjectEntry> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    if threads < 2 || found.len() < 64 {
        return found
            .into_iter()
            .map(|(id, p)| read_entry(id, p, detail))
            .collect();
    }
    let chunk = found.len().div_ceil(threads);
    let mut out = Vec::with_capacity(found.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = found
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|(id, p)| read_entry(id.clone(), p.clone(), detail))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(part) => out.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    out
}

pub fn read_entry(id: String, dir: PathBuf, detail: Detail) -> ProjectEntry {
    let root = read_root(&id, &dir);
    let mut e = ProjectEntry {
        id,
        root,
        size: None,
        last_used: None,
        running: None,
        stuck: Vec::new(),
        sessions: Vec::new(),
        missing_since: read_missing_since(&dir),
        last_conversation: None,
        quarantined: 0,
        agents: Vec::new(),
        dir,
    };
    e.quarantined = quarantined(&e.dir);
    e.agents = agents(&e.dir);
    if !(detail.size || detail.running) {
        e.last_used = fs::symlink_metadata(e.dir.join(state::LOCK_FILE))
            .or_else(|_| fs::symlink_metadata(&e.dir))
            .and_then(|m| m.modified())
            .ok();
    }
    if detail.size {
        e.size = Some(crate::state::du::usage(&e.dir).bytes);
    }
    if detail.size || detail.running {
        let u = shallow(&e.dir, detail.running);
        e.last_used = u
            .lock_mtime
            .or_else(|| fs::symlink_metadata(&e.dir).and_then(|m| m.modified()).ok());
        e.running = detail.running.then_some(u.running);
        e.stuck = u.stuck;
        e.last_conversation = u.last_conversation;
    }
    e.sessions = sessions(&e.dir);
    e
}

/// The agents whose state the project holds (read beneath the state directory).
pub fn agents(dir: &Path) -> Vec<&'static str> {
    let Ok(d) = crate::state::beneath::Dir::open(dir) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    let conversations = Path::new(crate::policy::layout::CONVERSATIONS_DIR);
    if d.entries(conversations).is_ok_and(|e| !e.is_empty()) {
        v.push(crate::policy::agent::AgentId::Claude.name());
    }
    if d.is_dir(Path::new(crate::policy::layout::CODEX_HOME_DIR)) {
        v.push(crate::policy::agent::AgentId::Codex.name());
    }
    v
}

/// How many entries the exit review moved aside in the project's state (its
/// `quarantine/<ID>/` directories; read beneath the state directory, never followed).
pub fn quarantined(dir: &Path) -> usize {
    let q = Path::new(crate::policy::layout::QUARANTINE_DIR);
    crate::state::beneath::Dir::open(dir)
        .and_then(|d| d.entries(q))
        .map_or(0, |l| {
            l.iter()
                .filter(|(n, t)| t.is_dir() && !n.as_bytes().starts_with(b"."))
                .count()
        })
}

/// The project's named sessions, for `--list`: name, conversation uuid, whether it runs
/// now, who started it last, and why its record is unreadable (if it is).
pub fn sessions(dir: &Path) -> Vec<serde_json::Value> {
    let state = crate::state::ProjectState {
        dir: dir.to_path_buf(),
    };
    match crate::state::sessions::list::list(&state) {
        Ok(list) => list
            .into_iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name,
                    "uuid": s.uuid,
                    "running": s.running,
                    "last_started": s.last_run.as_ref().map(|r| &r.started),
                    "last_cwd": s.last_run.as_ref().map(|r| &r.cwd),
                    "problem": s.problem,
                })
            })
            .collect(),
        Err(e) => vec![serde_json::json!({ "problem": format!("{e:#}") })],
    }
}

/// Reads and checks `project-root`: a regular file (never through a symlink) holding an
/// absolute path that hashes to the directory's name.
pub fn read_root(id: &str, dir: &Path) -> Root {
    let path = dir.join(state::ROOT_FILE);
    let bytes = match read_small(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Root::Problem(format!("{} is missing", state::ROOT_FILE))
        }
        Err(e) => return Root::Problem(format!("{} is unreadable: {e}", state::ROOT_FILE)),
    };
    if bytes.len() > MAX_ROOT_LEN {
        return Root::Problem(format!("{} is too long for a path", state::ROOT_FILE));
    }
    if bytes.first() != Some(&b'/') || bytes.contains(&0) {
        return Root::Problem(format!(
            "{} does not hold an absolute path",
            state::ROOT_FILE
        ));
    }
    let root = PathBuf::from(OsString::from_vec(bytes));
    if project_id(&root) != id {
        return Root::Problem(format!(
            "{} names a project whose id is {}, not {id}",
            state::ROOT_FILE,
            project_id(&root)
        ));
    }
    let exists = exists_recorded(&root, || {
        read_small(&dir.join(state::ROOT_MOUNT_FILE))
            .ok()
            .filter(|b| b.first() == Some(&b'/') && !b.contains(&0) && b.len() <= MAX_ROOT_LEN)
            .map(|b| PathBuf::from(OsString::from_vec(b)))
    });
    Root::Recorded { path: root, exists }
}

/// `root-missing-since`: seconds since the epoch, written by `--gc`.
fn read_missing_since(dir: &Path) -> Option<SystemTime> {
    let bytes = read_small(&dir.join(state::MISSING_FILE)).ok()?;
    let secs: u64 = std::str::from_utf8(&bytes).ok()?.trim().parse().ok()?;
    Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// A path for a one-line message: tabs, newlines and non-UTF-8 bytes escaped.
pub fn show(path: &Path) -> String {
    crate::policy::escape::shown(path)
}

/// Whether a path exists, without following a final symlink.
pub fn exists(path: &Path) -> Exists {
    exists_recorded(path, || None)
}

/// [`exists`] for a project root whose file system was mounted at `mount()` at the
/// project's last launch (`root-mount`; read only when the root is missing).
pub fn exists_recorded(path: &Path, mount: impl FnOnce() -> Option<PathBuf>) -> Exists {
    match fs::symlink_metadata(path) {
        Ok(_) => Exists::Yes,
        Err(e)
            if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(nix::libc::ENOTDIR) =>
        {
            // Missing, unless the file system it lives on is not there right now.
            match crate::host::mounts::why_unknown(path, mount().as_deref()) {
                Some(why) => Exists::Unknown(why),
                None => Exists::No,
            }
        }
        Err(e) => Exists::Unknown(e.to_string()),
    }
}

/// Reads at most MAX_ROOT_LEN + 1 bytes of a regular file, never through a symlink and
/// never blocking on a FIFO.
fn read_small(path: &Path) -> std::io::Result<Vec<u8>> {
    let f: File = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)?;
    // One read() normally returns the whole file; read on only if it filled the buffer.
    let mut buf = vec![0u8; 1024];
    let mut len = 0;
    loop {
        let n = match (&f).read(&mut buf[len..]) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        len += n;
        if n == 0 || len < buf.len() || len > MAX_ROOT_LEN {
            break;
        }
        buf.resize(buf.len() * 2, 0);
    }
    buf.truncate(len);
    Ok(buf)
}

struct Usage {
    lock_mtime: Option<SystemTime>,
    running: usize,
    stuck: Vec<(PathBuf, Vec<i32>)>,
    last_conversation: Option<(SystemTime, String)>,
}

/// Reads what `--list` shows of a project besides its size, from the few places that
/// hold it (not a walk of the whole state): the mtime of its `lock`, (with `running`)
/// how many of its `running/` registrations are held, and its newest transcript (a
/// `<uuid>.jsonl` in a directory of `claude-projects/`). A project made by a real launch
/// has ~40 entries in its state; this looks at about 10 of them.
fn shallow(dir: &Path, running: bool) -> Usage {
    let mut u = Usage {
        lock_mtime: fs::symlink_metadata(dir.join(state::LOCK_FILE))
            .and_then(|m| m.modified())
            .ok(),
        running: 0,
        stuck: Vec::new(),
        last_conversation: None,
    };
    use crate::state::du::{self, DT_DIR, DT_REG, DT_UNKNOWN};
    // The kind of an entry: `d_type`, or an lstat where the file system does not say.
    let kind = |d: RawFd, name: &CStr, t: u8| -> Option<FileStat> {
        (t == DT_UNKNOWN)
            .then(|| fstatat(Some(d), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok())
            .flatten()
    };
    let is = |d: RawFd, name: &CStr, t: u8, want: SFlag| -> bool {
        if t != DT_UNKNOWN {
            return (t == DT_DIR && want == SFlag::S_IFDIR)
                || (t == DT_REG && want == SFlag::S_IFREG);
        }
        kind(d, name, t)
            .is_some_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == want)
    };
    if running {
        let slots = dir.join(inuse::RUNNING_DIR);
        if let Some(fd) = du::open_dir(None, &slots) {
            for (name, t) in du::entries(&fd).unwrap_or_default() {
                if !is(fd.as_raw_fd(), &name, t, SFlag::S_IFREG) {
                    continue;
                }
                let path = slots.join(OsStr::from_bytes(name.as_bytes()));
                match inuse::holder(&path) {
                    crate::host::holders::Holder::Running => u.running += 1,
                    crate::host::holders::Holder::Stuck(pids) => u.stuck.push((path, pids)),
                    _ => {}
                }
            }
        }
    }
    let Some(conv) = du::open_dir(None, &dir.join(state::CONVERSATIONS_DIR)) else {
        return u;
    };
    for (d, t) in du::entries(&conv).unwrap_or_default() {
        if !is(conv.as_raw_fd(), &d, t, SFlag::S_IFDIR) {
            continue;
        }
        let Some(sub) = du::open_dir(Some(conv.as_raw_fd()), d.as_c_str()) else {
            continue;
        };
        for (f, _) in du::entries(&sub).unwrap_or_default() {
            let name = OsStr::from_bytes(f.as_bytes());
            if transcript_uuid(name).is_none() {
                continue;
            }
            let Ok(st) = fstatat(
                Some(sub.as_raw_fd()),
                f.as_c_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) else {
                continue;
            };
            if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG {
                let t = SystemTime::UNIX_EPOCH
                    + std::time::Duration::new(
                        u64::try_from(st.st_mtime).unwrap_or(0),
                        u32::try_from(st.st_mtime_nsec).unwrap_or(0),
                    );
                newer_transcript(&mut u.last_conversation, name, t);
            }
        }
    }
    u
}

/// The UUID of a transcript's file name (`<uuid>.jsonl`).
fn transcript_uuid(file: &OsStr) -> Option<&str> {
    file.to_str()
        .and_then(|n| n.strip_suffix(".jsonl"))
        .filter(|u| crate::state::sessions::is_uuid(u))
}

/// Keeps `file` as the newest conversation if it is a `<uuid>.jsonl` newer than `best`.
fn newer_transcript(best: &mut Option<(SystemTime, String)>, file: &OsStr, t: SystemTime) {
    let Some(uuid) = transcript_uuid(file) else {
        return;
    };
    if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
        *best = Some((t, uuid.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_names_are_16_lowercase_hex() {
        assert!(project_name(OsStr::new("0123456789abcdef")).is_some());
        assert!(project_name(OsStr::new("0123456789ABCDEF")).is_none());
        assert!(project_name(OsStr::new("0123456789abcde")).is_none());
        assert!(project_name(OsStr::new("../../etc/passwd")).is_none());
        assert!(project_name(OsStr::new(".gc-0123456789abcdef")).is_none());
    }
}
