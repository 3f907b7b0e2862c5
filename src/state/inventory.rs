//! What state exists: one record per `projects/<id>/` directory, read without following
//! symlinks and without changing anything. Shared by `--list` and `--gc`.

use std::collections::HashSet;
use std::ffi::CStr;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, FileStat, SFlag};
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
    /// `review-pending/` holds a record: an exit review may have been missed (a killed
    /// claudebox) and `state::review::missed` has something to look at.
    pub review_pending: bool,
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
    // The projects are opened relative to this directory's descriptor (one lookup each).
    let parent = crate::state::du::open_dir(None, &dir);
    let locks = if detail.running {
        parent.as_ref().and_then(locked_inodes)
    } else {
        None
    };
    inv.entries = read_entries(
        found,
        detail,
        parent.as_ref().map(AsRawFd::as_raw_fd),
        locks.as_ref(),
    );
    inv.entries.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(inv)
}

/// The inodes `/proc/locks` shows locked ([`crate::host::holders::locked_inodes`]), for
/// the projects directory open at `dir`, when its file system is one whose directory
/// entries carry the inode numbers `/proc/locks` shows (ext4, xfs, btrfs, tmpfs): then a
/// running slot whose inode is not among them is free without opening it (4 system calls
/// per project of 10,000). Elsewhere (`None`) every slot is tried, as before.
fn locked_inodes(dir: &std::os::fd::OwnedFd) -> Option<std::collections::HashSet<u64>> {
    use nix::sys::statfs as fs_info;
    let t = fs_info::fstatfs(dir).ok()?.filesystem_type();
    [
        fs_info::EXT4_SUPER_MAGIC,
        fs_info::XFS_SUPER_MAGIC,
        fs_info::BTRFS_SUPER_MAGIC,
        fs_info::TMPFS_MAGIC,
    ]
    .contains(&t)
    .then(crate::host::holders::locked_inodes)
    .flatten()
}

/// 16 lowercase hex characters, as `project::project_id` makes them.
fn project_name(name: &OsStr) -> Option<String> {
    let b = name.as_bytes();
    (b.len() == 16 && b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| String::from_utf8_lossy(b).into_owned())
}

/// Reads the entries on a few threads: the work is independent syscalls per directory.
fn read_entries(
    found: Vec<(String, PathBuf)>,
    detail: Detail,
    parent: Option<RawFd>,
    locks: Option<&HashSet<u64>>,
) -> Vec<ProjectEntry> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    if threads < 2 || found.len() < 64 {
        return found
            .into_iter()
            .map(|(id, p)| read_entry(id, p, detail, parent, locks))
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
                        .map(|(id, p)| read_entry(id.clone(), p.clone(), detail, parent, locks))
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

/// One project's record. `parent`: a descriptor of the projects directory `dir` is in
/// (then `dir` is opened relative to it, by its id). `locks`: the inodes `/proc/locks`
/// showed locked, where they can be trusted ([`locked_inodes`]).
fn read_entry(
    id: String,
    dir: PathBuf,
    detail: Detail,
    parent: Option<RawFd>,
    locks: Option<&HashSet<u64>>,
) -> ProjectEntry {
    let mut e = ProjectEntry {
        id,
        root: Root::Problem("the state directory cannot be opened".into()),
        size: None,
        last_used: None,
        running: None,
        stuck: Vec::new(),
        sessions: Vec::new(),
        missing_since: None,
        last_conversation: None,
        quarantined: 0,
        agents: Vec::new(),
        review_pending: false,
        dir,
    };
    // Everything below is read relative to one descriptor of the state directory (opened
    // without following a symlink, `O_PATH`: only looked up from, never read): one path
    // walk per project, not one per file.
    let opened = match parent {
        Some(p) => crate::state::du::open_path_dir(Some(p), e.id.as_str()),
        None => crate::state::du::open_path_dir(None, &e.dir),
    };
    let Some(pd) = opened else {
        e.root = read_root(&e.id, &e.dir);
        return e;
    };
    let pd = pd.as_raw_fd();
    e.root = read_root_at(&e.id, pd);
    e.missing_since = read_missing_since(pd);
    e.quarantined = quarantined_at(pd);
    let lock = fstatat(Some(pd), state::LOCK_FILE, AtFlags::AT_SYMLINK_NOFOLLOW).ok();
    e.last_used = lock.as_ref().map(mtime_of).or_else(|| mtime_at(pd, c"."));
    if detail.size {
        e.size = Some(crate::state::du::usage(&e.dir).bytes);
    }
    // With `running`: how many sandboxes run on it now, and what the summary the last
    // one left says, if that still holds.
    let mut summary = None;
    if let Some(locks) = detail.running.then_some(locks) {
        let (running, stuck) = running_slots(pd, &e.dir, locks);
        e.running = Some(running);
        // `--sizes` reads the whole state anyway: then the directories too.
        if running == 0 && stuck.is_empty() && !detail.size {
            summary = lock.as_ref().and_then(|l| read_summary(pd, l));
        }
        e.stuck = stuck;
    }
    let newest = detail.size || detail.running;
    let codex = match summary {
        Some(s) => {
            // A record the summary saw (a launch killed earlier) may have been reviewed
            // since: looked at again.
            e.review_pending = s.review_pending
                && has_visible_entries(pd, crate::policy::layout::REVIEW_PENDING_DIR);
            e.last_conversation = s.last_conversation();
            if s.conversations {
                e.agents.push(crate::policy::agent::AgentId::Claude.name());
            }
            s.codex
        }
        None => {
            e.review_pending = has_visible_entries(pd, crate::policy::layout::REVIEW_PENDING_DIR);
            let c = conversations(pd, newest);
            if newest {
                e.last_conversation = c.last;
            }
            if c.any {
                e.agents.push(crate::policy::agent::AgentId::Claude.name());
            }
            is_dir_at(pd, crate::policy::layout::CODEX_HOME_DIR)
        }
    };
    if codex {
        e.agents.push(crate::policy::agent::AgentId::Codex.name());
    }
    let sessions_dir = crate::policy::layout::SESSIONS_DIR;
    if fstatat(Some(pd), sessions_dir, AtFlags::AT_SYMLINK_NOFOLLOW)
        != Err(nix::errno::Errno::ENOENT)
    {
        e.sessions = sessions(&e.dir);
    }
    e
}

/// The modification time of `name` in the directory open at `pd` (not followed).
fn mtime_at<P: ?Sized + nix::NixPath>(pd: RawFd, name: &P) -> Option<SystemTime> {
    let st = fstatat(Some(pd), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
    Some(mtime_of(&st))
}

/// A file's modification time (the epoch for one before it).
fn mtime_of(st: &FileStat) -> SystemTime {
    SystemTime::UNIX_EPOCH
        + std::time::Duration::new(
            u64::try_from(st.st_mtime).unwrap_or(0),
            u32::try_from(st.st_mtime_nsec).unwrap_or(0),
        )
}

/// Whether `name` in the directory open at `pd` is a directory (not followed).
fn is_dir_at<P: ?Sized + nix::NixPath>(pd: RawFd, name: &P) -> bool {
    fstatat(Some(pd), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
}

/// Whether the directory `name` in the directory open at `pd` holds an entry whose name
/// does not start with a dot.
fn has_visible_entries(pd: RawFd, name: &str) -> bool {
    crate::state::du::open_dir(Some(pd), name)
        .and_then(|d| crate::state::du::entries(&d).ok())
        .is_some_and(|l| l.iter().any(|(n, _)| !n.as_bytes().starts_with(b".")))
}

/// How many entries the exit review moved aside (the `quarantine/<ID>/` directories of
/// the state directory open at `pd`; nothing followed).
fn quarantined_at(pd: RawFd) -> usize {
    use crate::state::du::{self, DT_DIR, DT_UNKNOWN};
    let q = crate::policy::layout::QUARANTINE_DIR;
    match fstatat(Some(pd), q, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(_) => return 0,
        Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFDIR => {
            return 0
        }
        // A directory's link count is 2 plus its subdirectories where the file system
        // counts them (ext4, xfs, tmpfs): 2 is none, and nothing to read. Where it does
        // not (btrfs says 1), the directory is read.
        Ok(st) if st.st_nlink == 2 => return 0,
        Ok(_) => {}
    }
    let Some(q) = du::open_dir(Some(pd), crate::policy::layout::QUARANTINE_DIR) else {
        return 0;
    };
    du::entries(&q).map_or(0, |l| {
        l.iter()
            .filter(|(n, t)| {
                !n.as_bytes().starts_with(b".")
                    && (*t == DT_DIR
                        || (*t == DT_UNKNOWN && is_dir_at(q.as_raw_fd(), n.as_c_str())))
            })
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
    match crate::state::du::open_dir(None, dir) {
        Some(pd) => read_root_at(id, pd.as_raw_fd()),
        None => Root::Problem(format!(
            "{} is unreadable: its state directory cannot be opened",
            state::ROOT_FILE
        )),
    }
}

/// [`read_root`] in the state directory open at `pd`.
fn read_root_at(id: &str, pd: RawFd) -> Root {
    let bytes = match read_small(pd, state::ROOT_FILE) {
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
        read_small(pd, state::ROOT_MOUNT_FILE)
            .ok()
            .filter(|b| b.first() == Some(&b'/') && !b.contains(&0) && b.len() <= MAX_ROOT_LEN)
            .map(|b| PathBuf::from(OsString::from_vec(b)))
    });
    Root::Recorded { path: root, exists }
}

/// `root-missing-since`: seconds since the epoch, written by `--gc`.
fn read_missing_since(pd: RawFd) -> Option<SystemTime> {
    let bytes = read_small(pd, state::MISSING_FILE).ok()?;
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

/// Reads at most MAX_ROOT_LEN + 1 bytes of the file `name` in the directory open at `pd`,
/// never through a symlink and never blocking on a FIFO.
fn read_small(pd: RawFd, name: &str) -> std::io::Result<Vec<u8>> {
    let flags = nix::fcntl::OFlag::O_RDONLY
        | nix::fcntl::OFlag::O_NOFOLLOW
        | nix::fcntl::OFlag::O_NONBLOCK
        | nix::fcntl::OFlag::O_CLOEXEC;
    let raw = nix::fcntl::openat(Some(pd), name, flags, nix::sys::stat::Mode::empty())?;
    // SAFETY: `openat` just returned this descriptor; nothing else owns it.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    // One read() normally returns the whole file; read on only if it filled the buffer.
    let mut buf = vec![0u8; 1024];
    let mut len = 0;
    loop {
        let n = match nix::unistd::read(fd.as_raw_fd(), &mut buf[len..]) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
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

/// Whether `d_type` `t` of `name` in the directory open at `d` is of the kind `want`
/// (an lstat where the file system does not say).
fn is_kind(d: RawFd, name: &CStr, t: u8, want: SFlag) -> bool {
    use crate::state::du::{DT_DIR, DT_REG, DT_UNKNOWN};
    if t != DT_UNKNOWN {
        return (t == DT_DIR && want == SFlag::S_IFDIR) || (t == DT_REG && want == SFlag::S_IFREG);
    }
    fstatat(Some(d), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == want)
}

/// How many of the `running/` registrations of the state directory open at `pd` (`dir`
/// is its path, for the slots' names) are held by a running sandbox, and which are held
/// by bwraps stuck at start. A slot whose inode the `Some` set of locked inodes lacks is
/// free without a look.
fn running_slots(
    pd: RawFd,
    dir: &Path,
    locks: Option<&HashSet<u64>>,
) -> (usize, Vec<(PathBuf, Vec<i32>)>) {
    use crate::state::du;
    let (mut running, mut stuck) = (0, Vec::new());
    let slots = dir.join(inuse::RUNNING_DIR);
    let Some(fd) = du::open_dir(Some(pd), inuse::RUNNING_DIR) else {
        return (running, stuck);
    };
    let mut listed = Vec::new();
    let _ = du::each_entry(&fd, |name, t, ino| {
        // Not locked at all: free, whatever it is (nothing to open).
        if locks.is_some_and(|l| !l.contains(&ino)) {
            return;
        }
        if let Ok(c) = std::ffi::CString::new(name) {
            listed.push((c, t));
        }
    });
    for (name, t) in listed {
        if !is_kind(fd.as_raw_fd(), &name, t, SFlag::S_IFREG) {
            continue;
        }
        let path = slots.join(OsStr::from_bytes(name.as_bytes()));
        match inuse::holder_at(fd.as_raw_fd(), &name, &path) {
            crate::host::holders::Holder::Running => running += 1,
            crate::host::holders::Holder::Stuck(pids) => stuck.push((path, pids)),
            _ => {}
        }
    }
    (running, stuck)
}

/// What the conversations directory holds.
struct Conversations {
    /// Any entry (the project has claude's state).
    any: bool,
    /// (With `newest`) the newest transcript: a `<uuid>.jsonl` in a directory of
    /// `claude-projects/`.
    last: Option<(SystemTime, String)>,
}

/// Reads the conversations directory of the state directory open at `pd` (not a walk of
/// the whole state: a project made by a real launch has ~40 entries, this looks at a few).
fn conversations(pd: RawFd, newest: bool) -> Conversations {
    use crate::state::du;
    let mut c = Conversations {
        any: false,
        last: None,
    };
    let Some(conv) = du::open_dir(Some(pd), state::CONVERSATIONS_DIR) else {
        return c;
    };
    let listed = du::entries(&conv).unwrap_or_default();
    c.any = !listed.is_empty();
    if !newest {
        return c;
    }
    for (d, t) in listed {
        if !is_kind(conv.as_raw_fd(), &d, t, SFlag::S_IFDIR) {
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
                newer_transcript(&mut c.last, name, mtime_of(&st));
            }
        }
    }
    c
}

/// What `--list` shows of a project that only its sandboxes change (its conversations,
/// its agents, a missed exit review), as the launcher of the last one to end left it
/// ([`write_summary`]): `--list` reads this one small file instead of three directories
/// (the reads that cost most of its time over 10,000 projects). It holds while nothing
/// can have changed since: it is written only under the project's `lock` with no other
/// slot held, so a launch registering later (`inuse::mark`, under that lock) holds its
/// slot after it was written, and removes it before its sandbox starts (the launch, once
/// its bind sources are open; `--import-conversation` before it copies); and `--list`
/// uses it only while no sandbox runs and `lock` has the very modification time it
/// recorded (every registration sets it, to the clock's nanosecond: a launch by a
/// claudebox that does not know the file, or one that failed before removing it). Anything else, and with `--sizes`: the directories are read as
/// before. Not seen: a transcript put in the state by hand, outside claudebox, after
/// the last launch ended (the next launch, or `--list --sizes`, shows it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// `lock`'s modification time when written: seconds, nanoseconds.
    pub lock_mtime: (i64, i64),
    /// The conversations directory holds an entry.
    pub conversations: bool,
    /// The newest transcript: its UUID and modification time (seconds, nanoseconds).
    pub last_conversation: Option<(String, u64, u32)>,
    /// The project has its own `~/.codex`.
    pub codex: bool,
    /// `review-pending/` held a record (then it is read again).
    pub review_pending: bool,
}

impl Summary {
    fn last_conversation(&self) -> Option<(SystemTime, String)> {
        let (uuid, s, ns) = self.last_conversation.as_ref()?;
        // Only a UUID is ever shown, as from the directory itself.
        crate::state::sessions::is_uuid(uuid).then(|| {
            (
                SystemTime::UNIX_EPOCH + std::time::Duration::new(*s, (*ns).min(999_999_999)),
                uuid.clone(),
            )
        })
    }
}

/// The summary in the state directory open at `pd`, if it holds for `lock` as it is now.
fn read_summary(pd: RawFd, lock: &FileStat) -> Option<Summary> {
    let bytes = read_small(pd, state::LIST_SUMMARY_FILE).ok()?;
    let s: Summary = serde_json::from_slice(&bytes).ok()?;
    (s.lock_mtime == (lock.st_mtime, lock.st_mtime_nsec)).then_some(s)
}

/// Writes the project's [`Summary`] as its last sandbox ended (the launcher, after the
/// exit review; `own`: this launch's slot, still held). Only under the project's `lock`,
/// taken without waiting (a launch registering now would make it stale at once), and
/// only when no other slot is held; otherwise, or on any error, nothing is written and
/// `--list` reads the directories. Changes nothing else.
pub fn write_summary(st: &crate::state::ProjectState, own: RawFd) {
    let _ = (|| -> Option<()> {
        let dir = crate::state::beneath::Dir::open(&st.dir).ok()?;
        let pd = dir.fd().as_raw_fd();
        let lock = inuse::try_lock_at(pd)?;
        let own = nix::sys::stat::fstat(own).ok()?;
        let slots = crate::state::du::open_dir(Some(pd), inuse::RUNNING_DIR)?;
        let mut others = Vec::new();
        crate::state::du::each_entry(&slots, |name, _, ino| {
            if ino != own.st_ino {
                others.push(std::ffi::CString::new(name).ok());
            }
        })
        .ok()?;
        for name in others {
            let name = name?;
            let path = st
                .dir
                .join(inuse::RUNNING_DIR)
                .join(OsStr::from_bytes(name.as_bytes()));
            if inuse::holder_at(slots.as_raw_fd(), &name, &path)
                != crate::host::holders::Holder::Free
            {
                return None;
            }
        }
        let held = nix::sys::stat::fstat(lock.as_raw_fd()).ok()?;
        let c = conversations(pd, true);
        let s = Summary {
            lock_mtime: (held.st_mtime, held.st_mtime_nsec),
            conversations: c.any,
            last_conversation: c.last.map(|(t, uuid)| {
                let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
                (uuid, d.as_secs(), d.subsec_nanos())
            }),
            codex: is_dir_at(pd, crate::policy::layout::CODEX_HOME_DIR),
            review_pending: has_visible_entries(pd, crate::policy::layout::REVIEW_PENDING_DIR),
        };
        let bytes = serde_json::to_vec(&s).ok()?;
        dir.write_atomic(Path::new(state::LIST_SUMMARY_FILE), &bytes, 0o600, false)
            .ok()?;
        drop(lock);
        Some(())
    })();
}

/// Removes the project's [`Summary`] (a launch registering: what it says stops holding).
pub fn forget_summary(st: &crate::state::ProjectState) {
    if let Ok(dir) = crate::state::beneath::Dir::open(&st.dir) {
        let _ = dir.remove_file(Path::new(state::LIST_SUMMARY_FILE));
    }
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

    /// The summary holds only for `lock`'s exact modification time, and only a UUID it
    /// names is ever shown.
    #[test]
    fn a_summary_holds_only_for_the_lock_time_it_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let lock = tmp.path().join(state::LOCK_FILE);
        fs::write(&lock, "").unwrap();
        let pd = crate::state::du::open_path_dir(None, tmp.path()).unwrap();
        let st = || fstatat(Some(pd.as_raw_fd()), state::LOCK_FILE, AtFlags::empty()).unwrap();
        let uuid = "6b82fc6a-a700-4dc8-b533-f21b3be9478f";
        let write = |lock_mtime: (i64, i64), uuid: &str| {
            let s = Summary {
                lock_mtime,
                conversations: true,
                last_conversation: Some((uuid.to_string(), 1_700_000_000, 5)),
                codex: false,
                review_pending: false,
            };
            fs::write(
                tmp.path().join(state::LIST_SUMMARY_FILE),
                serde_json::to_vec(&s).unwrap(),
            )
            .unwrap();
        };
        let now = st();
        write((now.st_mtime, now.st_mtime_nsec), uuid);
        let s = read_summary(pd.as_raw_fd(), &now).expect("holds");
        assert_eq!(s.last_conversation().unwrap().1, uuid);
        // One nanosecond off: not the same `lock`.
        write((now.st_mtime, now.st_mtime_nsec + 1), uuid);
        assert!(read_summary(pd.as_raw_fd(), &now).is_none());
        // A name that is not a UUID is never shown.
        write((now.st_mtime, now.st_mtime_nsec), "../evil\u{1b}[31m");
        let s = read_summary(pd.as_raw_fd(), &now).expect("holds");
        assert!(s.last_conversation().is_none());
        // Not JSON, or no file: none.
        fs::write(tmp.path().join(state::LIST_SUMMARY_FILE), "{").unwrap();
        assert!(read_summary(pd.as_raw_fd(), &now).is_none());
        fs::remove_file(tmp.path().join(state::LIST_SUMMARY_FILE)).unwrap();
        assert!(read_summary(pd.as_raw_fd(), &now).is_none());
    }

    #[test]
    fn project_names_are_16_lowercase_hex() {
        assert!(project_name(OsStr::new("0123456789abcdef")).is_some());
        assert!(project_name(OsStr::new("0123456789ABCDEF")).is_none());
        assert!(project_name(OsStr::new("0123456789abcde")).is_none());
        assert!(project_name(OsStr::new("../../etc/passwd")).is_none());
        assert!(project_name(OsStr::new(".gc-0123456789abcdef")).is_none());
    }
}
