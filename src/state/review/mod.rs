//! The exit review: when a sandbox ends, what it created or changed in the project that a
//! host tool runs without asking (`policy::review`'s rules) is moved aside into the
//! project's state, one line each on stderr with the one command that puts it back.
//!
//! "Created or changed during the session" is a ctime at or after the launch: the agent
//! cannot set a ctime (utimes does not touch it), and a rename or a new hard link sets the
//! moved inode's. The launch's point in time is the ctime of its pending-review record
//! (`review-pending/<instance>.json`, the same clock as the project's files), written
//! before bwrap starts and locked (flock) by the supervising claudebox for its life: a
//! record nobody holds is a review that was missed (the launcher was killed, the terminal
//! closed), done by the project's next launch, `--list` or `--check`.
//!
//! Layout, per project: `quarantine/<ID>/entry` (what was moved, as it was) and
//! `quarantine/<ID>/record.json` (where it was, why); `claudebox --restore ID` moves it
//! back (refusing to overwrite, never through a symlink).

pub mod walk;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::errno::Errno;
use nix::fcntl::{self, Flock, FlockArg, OFlag};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use serde::{Deserialize, Serialize};

use crate::policy::escape::Shown;
use crate::policy::facts::Project;
use crate::policy::review::{LinkInto, Writable, LINK_RULES};
use crate::state::{self, ProjectState, StateHome};
use walk::{Found, Since, Unread};

/// What a review looks at: the work tree and the project's git dirs (paths as bytes).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    pub work_tree: Vec<u8>,
    /// The common dir (where `worktrees/` and `modules/` live).
    pub common_dir: Option<Vec<u8>>,
    /// A linked worktree's or submodule's own git dir, when not the common dir.
    pub git_dir: Option<Vec<u8>>,
    /// The directories the launch's plan binds read-write outside the work tree
    /// (`policy::review::writable_outside`: its `--rw` paths and the like): a symlink the
    /// session made into one is moved aside. Kept in the record, so that a review missed
    /// and done by a later launch knows the killed launch's own; a record without it (an
    /// older claudebox's) has only the state home looked for.
    #[serde(default)]
    pub writable: Vec<Vec<u8>>,
    /// Directories below those that a later mount covers inside (`Writable::covered`).
    #[serde(default)]
    pub covered: Vec<Vec<u8>>,
}

fn path(b: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(b))
}

impl Target {
    /// `writable`: see [`Target::writable`].
    pub fn of(p: &Project, writable: &Writable) -> Target {
        let bytes = |p: &Path| p.as_os_str().as_bytes().to_vec();
        Target {
            work_tree: bytes(&p.work_tree),
            common_dir: p.common_dir.as_deref().map(bytes),
            git_dir: p
                .git_dir
                .as_deref()
                .filter(|g| Some(*g) != p.common_dir.as_deref())
                .map(bytes),
            writable: writable.dirs.iter().map(|w| bytes(w)).collect(),
            covered: writable.covered.iter().map(|w| bytes(w)).collect(),
        }
    }
}

/// How often the running launcher looks for a new `commondir` in the main git dir.
pub const COMMONDIR_LOOK: std::time::Duration = std::time::Duration::from_millis(50);

/// A running launch's pending review: its record, locked for the launcher's life.
pub struct Pending {
    lock: Flock<File>,
    dir: OwnedFd,
    name: OsString,
    target: Target,
    since: Since,
}

const FILE_FLAGS: OFlag = OFlag::O_NOFOLLOW
    .union(OFlag::O_CLOEXEC)
    .union(OFlag::O_NONBLOCK);

fn open_in(dir: RawFd, name: &OsStr, flags: OFlag, mode: u32) -> nix::Result<File> {
    let fd = fcntl::openat(
        Some(dir),
        name,
        flags | FILE_FLAGS,
        Mode::from_bits_truncate(mode),
    )?;
    // SAFETY: openat just returned this descriptor.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// A directory of the project's state, made private when missing, opened by descriptor.
fn state_dir(p: &Path) -> Result<OwnedFd> {
    state::mkdir_private(p)?;
    walk::open_dir(None, p).with_context(|| format!("cannot open {}", p.shown()))
}

/// Writes and locks the launch's pending-review record. Its ctime is the launch's point
/// in time. Call before bwrap starts. `writable`: see [`Target::writable`].
pub fn begin(
    st: &ProjectState,
    project: &Project,
    instance: &str,
    writable: &Writable,
) -> Result<Pending> {
    let dir = state_dir(&st.review_pending())?;
    let name = OsString::from(format!("{instance}.json"));
    let target = Target::of(project, writable);
    // Made under a dot name, locked, then renamed into place: `missed` never sees it
    // unlocked while its launcher runs.
    let tmp = OsString::from(format!(".{instance}.json"));
    let f = open_in(
        dir.as_raw_fd(),
        &tmp,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
        0o600,
    )
    .with_context(|| format!("cannot create {}", st.review_pending().join(&tmp).shown()))?;
    let mut lock = Flock::lock(f, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .context("cannot lock the pending review's record")?;
    lock.write_all(&serde_json::to_vec(&target)?)?;
    fcntl::renameat(
        Some(dir.as_raw_fd()),
        tmp.as_os_str(),
        Some(dir.as_raw_fd()),
        name.as_os_str(),
    )
    .context("cannot write the pending review's record")?;
    let since = Since::of(&nix::sys::stat::fstat(lock.as_raw_fd())?);
    Ok(Pending {
        lock,
        dir,
        name,
        target,
        since,
    })
}

impl Pending {
    /// Watches the common dir while the sandbox runs and moves a new `commondir` aside as
    /// soon as it appears, then ends the sandbox. No mount can stand in for a missing one
    /// (git lstats the name: an empty file, a directory or a dangling symlink there makes
    /// it die; a "." changes what `rev-parse --git-common-dir` prints; unlinking a mount
    /// point from the host detaches it), and the user's own `git` in another terminal
    /// reads it at once, so waiting for the exit review leaves hours.
    ///
    /// A thread of the supervising parent blocks on an inotify watch of the directory
    /// (every creation or rename onto the name is queued, so one made and removed again
    /// at once is seen too; measured, an agent timing its plant to the host's git opening
    /// `HEAD` and removing it 3 ms later was seen by a 50 ms poll only by chance). The
    /// watch is removed as soon as the sandbox ends ([`Pending::finish`]): an inotify
    /// instance that still holds a watch at the process's exit delays the exit (the
    /// kernel waits for the mark's release; measured 6 to 18 ms), one without costs
    /// nothing measurable. Without an inotify instance (the user's are used up) it looks
    /// every [`COMMONDIR_LOOK`] instead. A directory that cannot be opened is said in one
    /// line; the exit review still runs.
    pub fn watch_commondir(&self, st: &ProjectState) {
        let Some(common) = self.target.common_dir.as_deref().map(path) else {
            return;
        };
        let dir = match walk::open_dir(None, &common) {
            Ok(d) => d,
            Err(e) => {
                eprintln!(
                    "claudebox: review: warning: cannot watch {} ({e}); a commondir planted \
                     there is caught only when the sandbox ends",
                    common.shown()
                );
                return;
            }
        };
        let ino = commondir_watch(dir.as_raw_fd());
        let st = st.clone();
        let work_tree = path(&self.target.work_tree);
        std::thread::spawn(move || {
            let mut q = Quarantine::new(&st);
            let mut err = std::io::stderr();
            loop {
                let seen = match &ino {
                    None => {
                        std::thread::sleep(COMMONDIR_LOOK);
                        false
                    }
                    Some(ino) => match ino.read_events() {
                        Ok(evs) => {
                            let has = |f: AddWatchFlags| evs.iter().any(|e| e.mask.intersects(f));
                            // The watch removed (the sandbox ended), or the directory gone.
                            if has(AddWatchFlags::IN_IGNORED | AddWatchFlags::IN_DELETE_SELF) {
                                return;
                            }
                            if !has(AddWatchFlags::IN_Q_OVERFLOW)
                                && !evs
                                    .iter()
                                    .any(|e| e.name.as_deref() == Some(OsStr::new("commondir")))
                            {
                                continue;
                            }
                            // Made, even if gone again; after an overflow, only if there.
                            !has(AddWatchFlags::IN_Q_OVERFLOW)
                        }
                        Err(Errno::EINTR) => continue,
                        Err(_) => return,
                    },
                };
                if take_commondir(&mut q, dir.as_raw_fd(), &common, &work_tree, &mut err) || seen {
                    break;
                }
            }
            // Moved aside, it can be planted again at once (an agent watching with
            // inotify keeps it there nearly all the time: measured, the host's git status
            // ran it). git never writes a commondir in a main git dir: the sandbox is
            // ended, as if the user sent SIGTERM (forwarded to bwrap), and the exit
            // review runs as usual.
            let _ = writeln!(
                err,
                "claudebox: review: a commondir was planted in the main git dir while the \
                 sandbox ran: ending the sandbox"
            );
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::SIGTERM);
        });
    }

    /// Runs the review, then removes the record. Returns how many entries were moved.
    /// `held`: another process (the launch's keeper) holds the watch's inotify instance
    /// until this one has ended (see [`stop_commondir_watch`]).
    pub fn finish(self, st: &ProjectState, held: bool, err: &mut dyn Write) -> usize {
        stop_commondir_watch(held);
        let n = run(st, &self.target, self.since, err);
        let _ = nix::unistd::unlinkat(
            Some(self.dir.as_raw_fd()),
            self.name.as_os_str(),
            UnlinkatFlags::NoRemoveDir,
        );
        drop(self.lock);
        n
    }

    /// Removes the record without a review: no sandbox came up (bwrap could not start, or
    /// its setup failed before the step inside ran), so nothing in the project changed.
    pub fn cancel(self) {
        stop_commondir_watch(false);
        let _ = nix::unistd::unlinkat(
            Some(self.dir.as_raw_fd()),
            self.name.as_os_str(),
            UnlinkatFlags::NoRemoveDir,
        );
    }
}

/// The reviews that were missed: every pending record of the project that no running
/// launcher holds. Returns how many entries were moved.
pub fn missed(st: &ProjectState, err: &mut dyn Write) -> usize {
    let Ok(dir) = walk::open_dir(None, &st.review_pending()) else {
        return 0;
    };
    let Ok(names) = std::fs::read_dir(st.review_pending()) else {
        return 0;
    };
    let mut moved = 0;
    for e in names.flatten() {
        let name = e.file_name();
        if name.as_bytes().starts_with(b".") {
            continue;
        }
        let Ok(f) = open_in(dir.as_raw_fd(), &name, OFlag::O_RDONLY, 0) else {
            continue;
        };
        // Held: its launcher still runs and reviews at its own exit; or it was killed and
        // its keeper (a fork holding the record's lock) is still ending the sandbox: then
        // waited for (bounded), so that a relaunch right after a kill plans its mounts
        // after this review rather than before.
        let mut lock = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((f, _)) => match ended_holder_gone(f, &st.review_pending().join(&name)) {
                Some(lock) => lock,
                None => continue,
            },
        };
        let Ok(meta) = nix::sys::stat::fstat(lock.as_raw_fd()) else {
            continue;
        };
        let mut bytes = Vec::new();
        let _ = (&mut *lock).take(64 * 1024).read_to_end(&mut bytes);
        if let Ok(target) = serde_json::from_slice::<Target>(&bytes) {
            let _ = writeln!(
                err,
                "claudebox: review: a sandbox of this project ended without its exit review \
                 (its claudebox was killed); reviewing now"
            );
            moved += run(st, &target, Since::of(&meta), err);
        }
        let _ = nix::unistd::unlinkat(
            Some(dir.as_raw_fd()),
            name.as_os_str(),
            UnlinkatFlags::NoRemoveDir,
        );
    }
    moved
}

/// One review: finds what changed at or after `since`, moves it aside, prints a line per
/// entry. Returns how many were moved.
pub fn run(st: &ProjectState, target: &Target, since: Since, err: &mut dyn Write) -> usize {
    let work_tree = path(&target.work_tree);
    let mut q = Quarantine::new(st);
    let mut moved = 0;
    let mut unread = Vec::new();
    {
        let mut on_found = |f: Found<'_>| {
            moved += usize::from(q.take(&f, &work_tree, err));
        };
        // The common dir's modules/ and worktrees/: git dirs judged by walk::git_dir, so
        // a gitlink file naming one is not judged twice.
        let judged_there: Vec<walk::Ino> = target
            .common_dir
            .iter()
            .flat_map(|c| ["modules", "worktrees"].map(|d| path(c).join(d)))
            .filter_map(|d| walk::dir_ino(&d))
            .collect();
        // Where a new symlink must not lead, by policy::review::LINK_RULES' row:
        // claudebox's state home (`projects/<id>` is two below it: the login directory
        // and the project's claude-config and conversations, written from inside), and
        // what the launch bound read-write outside the work tree.
        // Opened without following a symlink: a covered directory lies in a writable one,
        // where the agent could have renamed a parent and put a symlink in its place to
        // make another directory count as covered (then it counts as none).
        let inos = |ps: &[Vec<u8>]| -> Vec<walk::Ino> {
            (ps.iter())
                .filter_map(|p| open_no_symlinks(&path(p)).ok())
                .filter_map(|fd| nix::sys::stat::fstat(fd.as_raw_fd()).ok())
                .map(|st| (st.st_dev, st.st_ino))
                .collect()
        };
        let links: Vec<walk::LinkDirs> = LINK_RULES
            .iter()
            .map(|r| match r.into {
                LinkInto::StateHome => walk::LinkDirs {
                    rule: *r,
                    dirs: walk::dir_ino(&st.dir.join("../..")).into_iter().collect(),
                    covered: Vec::new(),
                },
                LinkInto::WritableOutside => walk::LinkDirs {
                    rule: *r,
                    dirs: inos(&target.writable),
                    covered: inos(&target.covered),
                },
                // Recognised by the walk by name: any `.git` below the work tree's top.
                LinkInto::GitDirInTree => walk::LinkDirs {
                    rule: *r,
                    dirs: Vec::new(),
                    covered: Vec::new(),
                },
            })
            .collect();
        walk::work_tree(
            &work_tree,
            since,
            &judged_there,
            &links,
            &mut on_found,
            &mut unread,
        );
        if let Some(common) = &target.common_dir {
            walk::git_dir(&path(common), false, since, &mut on_found, &mut unread);
            if let Some(g) = &target.git_dir {
                walk::git_dir(&path(g), true, since, &mut on_found, &mut unread);
            }
        }
    }
    for Unread { path, error } in unread {
        let _ = writeln!(
            err,
            "claudebox: review: warning: could not look into {} ({error}); check it by hand",
            path.shown()
        );
    }
    moved
}

/// The running launcher's inotify watch of the main git dir, removed when the sandbox ends.
/// The instance is never closed by this process (see [`stop_commondir_watch`]).
static COMMONDIR_WATCH: std::sync::Mutex<Option<(&'static Inotify, WatchDescriptor)>> =
    std::sync::Mutex::new(None);

/// An inotify watch of the directory `dirfd` for names made or renamed into it; `None`
/// when the user has no inotify instance or watch left.
fn commondir_watch(dirfd: RawFd) -> Option<&'static Inotify> {
    let ino = Inotify::init(InitFlags::IN_CLOEXEC).ok()?;
    let wd = ino
        .add_watch(
            format!("/proc/self/fd/{dirfd}").as_str(),
            AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR,
        )
        .ok()?;
    let ino: &'static Inotify = Box::leak(Box::new(ino));
    if let Ok(mut w) = COMMONDIR_WATCH.lock() {
        *w = Some((ino, wd));
    }
    Some(ino)
}

/// How long a missed review waits for the keeper of a killed launcher to let go of its
/// record (it kills bwrap and reaps the sandbox's processes first: milliseconds).
const KEEPER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The record's lock once its holder, whose launcher is dead (`host::holders`: the taker
/// of the flock no longer runs, or cannot be named here), lets go of it; `None` while
/// the launcher runs, or when it is still held after [`KEEPER_WAIT`].
fn ended_holder_gone(f: File, path: &Path) -> Option<Flock<File>> {
    use crate::host::holders::{of_held, Holder};
    let deadline = std::time::Instant::now() + KEEPER_WAIT;
    let mut f = f;
    loop {
        match of_held(path) {
            Some(Holder::Running) => return None,
            Some(Holder::Free | Holder::Ended | Holder::Stuck(_)) | None => {}
        }
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Some(lock),
            Err((back, _)) => f = back,
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The watch's inotify instance, while there is one: the launch's keeper, forked with it,
/// holds it past this process's end (`host::supervise::run`'s `hold`).
pub fn commondir_watch_fd() -> Option<RawFd> {
    let w = COMMONDIR_WATCH.lock().ok()?;
    w.as_ref().map(|(ino, _)| ino.as_fd().as_raw_fd())
}

/// Removes the watch (its thread sees `IN_IGNORED` and ends): the sandbox ended and the
/// exit review takes over. The last close of an inotify instance waits for the kernel to
/// release the removed mark (measured ~7 ms, in `close`, or in the exit when the process
/// holds it): another process holds the instance past this process's end and is the one
/// to close it, so the launcher's exit does not wait. `held`: the launch's keeper does
/// (it waits for this process's end anyway); else a child forked here (~0.2 - 0.4 ms on
/// the way to the prompt), which only closes descriptors, waits for its parent's end (a
/// pidfd) and exits.
fn stop_commondir_watch(held: bool) {
    let Some((ino, wd)) = COMMONDIR_WATCH.lock().ok().and_then(|mut w| w.take()) else {
        return;
    };
    let _ = ino.rm_watch(wd);
    if held {
        return;
    }
    let keep = ino.as_fd().as_raw_fd();
    // SAFETY: a raw system call with no pointers; the descriptor is checked by the caller.
    let parent =
        unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, nix::unistd::getpid().as_raw(), 0) };
    if parent < 0 {
        return;
    }
    let parent = parent as RawFd;
    // SAFETY: the child makes only async-signal-safe calls (close, poll, _exit).
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            // SAFETY: close_range, poll, close and _exit are async-signal-safe; no memory
            // is touched but the stack.
            unsafe {
                let (lo, hi) = (keep.min(parent) as u32, keep.max(parent) as u32);
                for (from, to) in [
                    (0, lo.wrapping_sub(1)),
                    (lo + 1, hi - 1),
                    (hi + 1, u32::MAX),
                ] {
                    if from <= to && !(from == 0 && lo == 0) {
                        nix::libc::syscall(nix::libc::SYS_close_range, from, to, 0);
                    }
                }
                let mut p = nix::libc::pollfd {
                    fd: parent,
                    events: nix::libc::POLLIN,
                    revents: 0,
                };
                nix::libc::poll(&raw mut p, 1, 60_000);
                nix::libc::close(keep);
                nix::libc::_exit(0);
            }
        }
        _ => {
            // SAFETY: our own pidfd, no longer needed here.
            unsafe { nix::libc::close(parent) };
        }
    }
}

/// Moves the common dir's `commondir` aside now, whatever it is (file, symlink, fifo):
/// read by git in the main git dir, never made by git there. Whether one was there.
fn take_commondir(
    q: &mut Quarantine,
    dirfd: RawFd,
    common: &Path,
    work_tree: &Path,
    err: &mut dyn Write,
) -> bool {
    let name = OsStr::new("commondir");
    let there =
        nix::sys::stat::fstatat(Some(dirfd), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
    if there.is_err() {
        return false;
    }
    let (severity, reason) = crate::policy::review::git_dir_judgement(
        crate::policy::git_dir::GitDirKind::Common,
        "commondir",
        b"",
    )
    .unwrap_or((
        crate::policy::review::Severity::Critical,
        "a commondir in the main git dir".into(),
    ));
    q.take(
        &Found {
            dirfd,
            dir: common,
            name,
            severity,
            reason: format!("{reason}; moved while the sandbox runs"),
        },
        work_tree,
        err,
    );
    true
}

/// Scans without moving: how many entries a review would move (the benchmark's count).
pub fn scan(target: &Target, since: Since) -> (usize, usize) {
    let mut n = 0;
    let mut unread = Vec::new();
    walk::work_tree(
        &path(&target.work_tree),
        since,
        &[],
        &[],
        &mut |_| n += 1,
        &mut unread,
    );
    (n, unread.len())
}

/// Where a moved entry was, and why it was moved (`quarantine/<ID>/record.json`).
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    dir: Vec<u8>,
    name: Vec<u8>,
    severity: String,
    reason: String,
    /// Moved within its own directory under this name (the state is on another file
    /// system), not into `entry`.
    #[serde(default)]
    in_place: Option<Vec<u8>>,
}

const ENTRY: &str = "entry";
const RECORD: &str = "record.json";
const IN_PLACE_INFIX: &str = ".claudebox-quarantine.";

struct Quarantine {
    dir: Result<OwnedFd>,
    project_id: String,
    seq: u32,
}

impl Quarantine {
    fn new(st: &ProjectState) -> Quarantine {
        Quarantine {
            dir: state_dir(&st.quarantine()),
            project_id: st
                .dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            seq: 0,
        }
    }

    /// Moves one entry aside and prints its line; false (and a line saying so) when it
    /// could not be moved.
    fn take(&mut self, f: &Found<'_>, work_tree: &Path, err: &mut dyn Write) -> bool {
        let full = f.dir.join(f.name);
        let shown = full
            .strip_prefix(work_tree)
            .map_or_else(|_| full.shown(), |r| r.shown());
        match self.move_aside(f) {
            Ok(id) => {
                let _ = writeln!(
                    err,
                    "claudebox: review: {} {shown} was created or changed in the sandbox ({}): \
                     moved aside; to put it back: claudebox --restore {id}",
                    f.severity.label(),
                    f.reason.shown()
                );
                true
            }
            Err(e) => {
                let _ = writeln!(
                    err,
                    "claudebox: review: {} {shown} was created or changed in the sandbox ({}) \
                     and could not be moved aside: {e:#}; remove it before running host tools \
                     there",
                    f.severity.label(),
                    f.reason.shown()
                );
                false
            }
        }
    }

    fn move_aside(&mut self, f: &Found<'_>) -> Result<String> {
        let q = match &self.dir {
            Ok(d) => d.as_raw_fd(),
            Err(e) => bail!("{e:#}"),
        };
        let (id, idfd) = loop {
            self.seq += 1;
            let id = format!("{}-{}-{}", self.project_id, std::process::id(), self.seq);
            match nix::sys::stat::mkdirat(Some(q), id.as_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) => break (id.clone(), walk::open_dir(Some(q), id.as_str())?),
                Err(Errno::EEXIST) if self.seq < 10_000 => continue,
                Err(e) => return Err(e).context("cannot make a quarantine entry"),
            }
        };
        let mut in_place = None;
        match fcntl::renameat(Some(f.dirfd), f.name, Some(idfd.as_raw_fd()), ENTRY) {
            Ok(()) => {}
            Err(Errno::EXDEV) => {
                // The state lives on another file system: an inert name beside it.
                let mut n = f.name.to_os_string();
                n.push(IN_PLACE_INFIX);
                n.push(&id);
                fcntl::renameat(Some(f.dirfd), f.name, Some(f.dirfd), n.as_os_str())
                    .context("cannot rename it")?;
                in_place = Some(n.into_vec());
            }
            Err(e) => {
                let _ = nix::unistd::unlinkat(Some(q), id.as_str(), UnlinkatFlags::RemoveDir);
                return Err(e).context("cannot move it");
            }
        }
        let rec = Record {
            dir: f.dir.as_os_str().as_bytes().to_vec(),
            name: f.name.as_bytes().to_vec(),
            severity: f.severity.label().into(),
            reason: f.reason.clone(),
            in_place,
        };
        let mut file = open_in(
            idfd.as_raw_fd(),
            OsStr::new(RECORD),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            0o600,
        )?;
        file.write_all(&serde_json::to_vec(&rec)?)?;
        Ok(id)
    }
}

/// Opens an absolute directory path one component at a time, never through a symlink.
fn open_no_symlinks(p: &Path) -> Result<OwnedFd> {
    let mut fd = walk::open_dir(None, "/")?;
    for c in p.components() {
        match c {
            std::path::Component::RootDir => {}
            std::path::Component::Normal(n) => {
                fd = walk::open_dir(Some(fd.as_raw_fd()), n).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot open {} without following a symlink ({e})",
                        p.shown()
                    )
                })?;
            }
            _ => bail!("{} is not a plain absolute path", p.shown()),
        }
    }
    Ok(fd)
}

/// `claudebox --restore ID`: puts a moved entry back where it was. Refuses to overwrite
/// what is there now, and never goes through a symlink.
pub fn restore(home: &StateHome, id: &OsStr) -> Result<PathBuf> {
    let idb = id.as_bytes();
    let ok = idb.len() > 17
        && idb[16] == b'-'
        && idb
            .iter()
            .all(|b| b.is_ascii_hexdigit() || b.is_ascii_digit() || *b == b'-');
    if !ok {
        bail!(crate::policy::error::Fixable::new(
            format!(
                "--restore: {} is not an ID the exit review printed",
                id.shown()
            ),
            "copy the ID from the line `claudebox: review: ...` printed when the sandbox ended"
        ));
    }
    let st = home.project(std::str::from_utf8(&idb[..16]).unwrap_or_default());
    let q = walk::open_dir(None, &st.quarantine()).ok();
    let idfd = q
        .as_ref()
        .and_then(|q| walk::open_dir(Some(q.as_raw_fd()), id).ok())
        .with_context(|| {
            format!(
                "--restore: nothing was moved aside as {} (restored already?)",
                id.shown()
            )
        })?;
    let mut bytes = Vec::new();
    open_in(idfd.as_raw_fd(), OsStr::new(RECORD), OFlag::O_RDONLY, 0)?
        .take(64 * 1024)
        .read_to_end(&mut bytes)?;
    let rec: Record = serde_json::from_slice(&bytes).context("--restore: unreadable record")?;
    let dir = path(&rec.dir);
    let name = OsStr::from_bytes(&rec.name);
    let to = dir.join(name);
    let dirfd = open_no_symlinks(&dir).with_context(|| format!("--restore {}", id.shown()))?;
    let (from_fd, from_name): (RawFd, &OsStr) = match &rec.in_place {
        Some(n) => (dirfd.as_raw_fd(), OsStr::from_bytes(n)),
        None => (idfd.as_raw_fd(), OsStr::new(ENTRY)),
    };
    match rename_noreplace(from_fd, from_name, dirfd.as_raw_fd(), name) {
        Ok(()) => {}
        Err(Errno::EEXIST) => bail!(crate::policy::error::Fixable::new(
            format!("--restore: {} exists now", to.shown()),
            "move it away first, then run the same command again"
        )),
        Err(e) => {
            return Err(e).with_context(|| format!("--restore: cannot move back {}", to.shown()))
        }
    }
    let _ = nix::unistd::unlinkat(Some(idfd.as_raw_fd()), RECORD, UnlinkatFlags::NoRemoveDir);
    if let Some(q) = q {
        let _ = nix::unistd::unlinkat(Some(q.as_raw_fd()), id, UnlinkatFlags::RemoveDir);
    }
    Ok(to)
}

/// `renameat2(RENAME_NOREPLACE)`, by system call (libc wrappers differ between targets).
fn rename_noreplace(from: RawFd, a: &OsStr, to: RawFd, b: &OsStr) -> nix::Result<()> {
    let a = std::ffi::CString::new(a.as_bytes()).map_err(|_| Errno::EINVAL)?;
    let b = std::ffi::CString::new(b.as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: two valid C strings and descriptors; RENAME_NOREPLACE = 1.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_renameat2,
            from,
            a.as_ptr(),
            to,
            b.as_ptr(),
            1 as nix::libc::c_uint,
        )
    };
    Errno::result(r).map(drop)
}
