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
//! It fails closed. A directory it cannot list or move from (the agent's `chmod 0111`,
//! `0555`) it makes its way into as `--gc` does (its owner's rights given through a
//! descriptor opened without following a symlink), putting the mode back when done; what
//! it still cannot look into or move aside holds the project: the record stays, and the
//! next launch (which reviews again first) refuses, and `--check` fails, naming what must
//! be done. A record it cannot read (truncated, corrupt) means the whole work tree and
//! the git dirs are reviewed as if everything in them had changed.
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
    let fd = walk::retry_no_fd(|| {
        fcntl::openat(
            Some(dir),
            name,
            flags | FILE_FLAGS,
            Mode::from_bits_truncate(mode),
        )
    })?;
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
        let ino = match commondir_watch(dir.as_raw_fd()) {
            Ok(ino) => Some(ino),
            Err(e) => {
                // Set before the sandbox starts, so an agent cannot take the user's last
                // instance first; another sandbox (or any process of the user's) can.
                eprintln!("{}", no_watch_line(&common.shown(), e));
                None
            }
        };
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

    /// Runs the review, then removes the record; keeps it when the review left something
    /// it could not look into or move aside (the project is held: [`missed`] reviews again
    /// at the next launch, which refuses while anything is left). `held`: another process
    /// (the launch's keeper) holds the watch's inotify instance until this one has ended
    /// (see [`stop_commondir_watch`]).
    pub fn finish(self, st: &ProjectState, held: bool, err: &mut dyn Write) -> Outcome {
        stop_commondir_watch(held);
        let out = run(st, &self.target, self.since, err);
        if out.left.is_empty() || walk::gives_up() {
            let _ = nix::unistd::unlinkat(
                Some(self.dir.as_raw_fd()),
                self.name.as_os_str(),
                UnlinkatFlags::NoRemoveDir,
            );
        } else {
            out.say_held(err);
        }
        drop(self.lock);
        out
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

/// What a review did: how many entries it moved aside, and what it left that it could
/// not look into or move aside (shown paths), which holds the project.
#[derive(Debug, Default)]
pub struct Outcome {
    pub moved: usize,
    pub left: Vec<String>,
}

impl Outcome {
    fn add(&mut self, o: Outcome) {
        self.moved += o.moved;
        self.left.extend(o.left);
    }

    fn say_held(&self, err: &mut dyn Write) {
        let _ = writeln!(
            err,
            "claudebox: review: holding the project: {} could not be looked into or moved \
             aside (above); the next launch refuses until it is gone",
            self.left.join(", ")
        );
    }

    /// The next launch's refusal (and `--check`'s failure) while the project is held.
    pub fn refusal(&self) -> Option<crate::policy::error::Fixable> {
        (!self.left.is_empty()).then(|| {
            crate::policy::error::Fixable::new(
                format!(
                    "the exit review of an earlier session could not look into or move aside \
                     {}, so the project is held",
                    self.left.join(", ")
                ),
                "remove it by hand (or give it back to your user), then launch again: the \
                 review runs again first",
            )
        })
    }
}

/// The reviews that were missed: every pending record of the project that no running
/// launcher holds (a killed launcher's, or a held review's, kept). `project`: the
/// project's own target, reviewed whole (everything counts as changed) for a record that
/// cannot be read; without one such a record holds the project.
pub fn missed(st: &ProjectState, project: Option<&Target>, err: &mut dyn Write) -> Outcome {
    let mut out = Outcome::default();
    let Ok(dir) = walk::open_dir(None, &st.review_pending()) else {
        return out;
    };
    let Ok(names) = std::fs::read_dir(st.review_pending()) else {
        return out;
    };
    // Who took the held records, read once at the first one held: one record per running
    // sandbox of the project, so one read of `/proc/locks` per record made each launch's
    // look quadratic in the sandboxes running (issue 36).
    let mut takers: Option<Option<crate::host::holders::Takers>> = None;
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
            Err((f, _)) => {
                // Its launcher lives (when `/proc/locks` was read above): it reviews at
                // its own exit.
                let t = takers.get_or_insert_with(crate::host::holders::Takers::read);
                if let (Some(t), Ok(m)) = (t, f.metadata()) {
                    if t.live_taker(&m) {
                        continue;
                    }
                }
                match ended_holder_gone(f, &st.review_pending().join(&name)) {
                    Some(lock) => lock,
                    None => continue,
                }
            }
        };
        let Ok(meta) = nix::sys::stat::fstat(lock.as_raw_fd()) else {
            continue;
        };
        let mut bytes = Vec::new();
        let read = (&mut *lock).take(64 * 1024).read_to_end(&mut bytes);
        let parsed = read
            .ok()
            .and_then(|_| serde_json::from_slice::<Target>(&bytes).ok());
        let o = match (parsed, project) {
            (Some(target), _) => {
                let _ = writeln!(
                    err,
                    "claudebox: review: a sandbox of this project ended without its exit \
                     review (its claudebox was killed, or the review was held); reviewing now"
                );
                run(st, &target, Since::of(&meta), err)
            }
            _ if walk::gives_up() => Outcome::default(),
            (None, Some(target)) => {
                let _ = writeln!(
                    err,
                    "claudebox: review: a pending review's record cannot be read ({}); \
                     reviewing the whole project as if everything in it had changed",
                    st.review_pending().join(&name).shown()
                );
                run(st, target, Since { sec: 0, nsec: 0 }, err)
            }
            (None, None) => Outcome {
                moved: 0,
                left: vec![format!(
                    "the project (its pending review's record {} cannot be read; `claudebox \
                     --check` in the project reviews it whole)",
                    st.review_pending().join(&name).shown()
                )],
            },
        };
        if o.left.is_empty() || walk::gives_up() {
            let _ = nix::unistd::unlinkat(
                Some(dir.as_raw_fd()),
                name.as_os_str(),
                UnlinkatFlags::NoRemoveDir,
            );
        }
        out.add(o);
    }
    out
}

/// One review: finds what changed at or after `since`, moves it aside, prints a line per
/// entry. Returns how many were moved and what was left.
pub fn run(st: &ProjectState, target: &Target, since: Since, err: &mut dyn Write) -> Outcome {
    let work_tree = path(&target.work_tree);
    let mut q = Quarantine::new(st);
    let mut out = Outcome::default();
    let mut unread = Vec::new();
    {
        let mut on_found = |f: Found<'_>| {
            if q.take(&f, &work_tree, err) {
                out.moved += 1;
            } else {
                out.left.push(shown_in(&f.dir.join(f.name), &work_tree));
            }
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
    for Unread { path, error, holds } in unread {
        if holds && !walk::gives_up() {
            let _ = writeln!(
                err,
                "claudebox: review: could not look into {} ({error})",
                path.shown()
            );
            out.left.push(shown_in(&path, &work_tree));
        } else if holds {
            let _ = writeln!(
                err,
                "claudebox: review: warning: could not look into {} ({error}); check it by hand",
                path.shown()
            );
        } else {
            let _ = writeln!(
                err,
                "claudebox: review: not looked into {} ({error}): your user cannot enter it, \
                 so nothing below it is reachable to your host tools (nor was to the sandbox)",
                path.shown()
            );
        }
    }
    out
}

/// A path as the review's lines show it: relative to the work tree when in it, escaped.
fn shown_in(full: &Path, work_tree: &Path) -> String {
    full.strip_prefix(work_tree)
        .map_or_else(|_| full.shown(), |r| r.shown())
}

/// The running launcher's inotify watch of the main git dir, removed when the sandbox ends.
/// The instance is never closed by this process (see [`stop_commondir_watch`]).
static COMMONDIR_WATCH: std::sync::Mutex<Option<(&'static Inotify, WatchDescriptor)>> =
    std::sync::Mutex::new(None);

/// The line a launch prints when it cannot set its commondir watch (issue 34): `EMFILE`
/// from `inotify_init` is the user's `fs.inotify.max_user_instances` used up, `ENOSPC`
/// from `inotify_add_watch` their `max_user_watches`; both are per user, so another
/// sandbox of theirs may hold them all.
pub fn no_watch_line(dir: &impl std::fmt::Display, e: Errno) -> String {
    let why = match e {
        Errno::EMFILE => "every inotify instance of this user is in use \
                         (fs.inotify.max_user_instances; another sandbox may hold them)"
            .to_string(),
        Errno::ENOSPC => "every inotify watch of this user is in use \
                          (fs.inotify.max_user_watches; another sandbox may hold them)"
            .to_string(),
        e => e.to_string(),
    };
    format!(
        "claudebox: review: warning: cannot watch {dir}: {why}; looking for a planted \
         commondir every {} ms instead",
        COMMONDIR_LOOK.as_millis()
    )
}

/// An inotify watch of the directory `dirfd` for names made or renamed into it; the error
/// when the user has no inotify instance or watch left.
fn commondir_watch(dirfd: RawFd) -> Result<&'static Inotify, Errno> {
    let ino = Inotify::init(InitFlags::IN_CLOEXEC)?;
    let wd = ino.add_watch(
        format!("/proc/self/fd/{dirfd}").as_str(),
        AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR,
    )?;
    let ino: &'static Inotify = Box::leak(Box::new(ino));
    if let Ok(mut w) = COMMONDIR_WATCH.lock() {
        *w = Some((ino, wd));
    }
    Ok(ino)
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
            // Out of the project while it holds (chdir is async-signal-safe).
            crate::host::companion::Outside::chdir_raw();
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
        let beside = || {
            let mut n = f.name.to_os_string();
            n.push(IN_PLACE_INFIX);
            n.push(&id);
            n
        };
        // Rights given to move it (its directory's, its own), put back after.
        let mut granted = Granted::default();
        let mut tried = 0;
        let moved = loop {
            let e = match fcntl::renameat(Some(f.dirfd), f.name, Some(idfd.as_raw_fd()), ENTRY) {
                Ok(()) => break Ok(()),
                Err(e) => e,
            };
            match e {
                // The state lives on another file system: an inert name beside it.
                Errno::EXDEV => {}
                // The agent's `chmod 0555` on its directory, or on itself (a directory
                // moved to another one needs its own write right, for `..`): its owner's
                // rights given, as for listing; then an inert name beside it, which
                // needs neither its own right nor the quarantine.
                Errno::EACCES | Errno::EPERM if tried == 0 && !walk::gives_up() => {
                    tried += 1;
                    granted.give(f.dirfd, f.name);
                    continue;
                }
                Errno::EACCES | Errno::EPERM if tried == 1 && !walk::gives_up() => {}
                e => break Err(e),
            }
            let n = beside();
            match fcntl::renameat(Some(f.dirfd), f.name, Some(f.dirfd), n.as_os_str()) {
                Ok(()) => {
                    in_place = Some(n.into_vec());
                    break Ok(());
                }
                Err(e) => break Err(e),
            }
        };
        granted.put_back();
        if let Err(e) = moved {
            let _ = nix::unistd::unlinkat(Some(q), id.as_str(), UnlinkatFlags::RemoveDir);
            return Err(e).context("cannot move it");
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

/// The owner's rights the review gave to move an entry aside, to put back after: its
/// directory's (`u+wx`, through the descriptor the walk holds) and, for a directory, its
/// own (`u+w`, through an `O_PATH` descriptor opened without following a symlink, which
/// still names it once moved).
#[derive(Default)]
struct Granted {
    parent: Option<(RawFd, u32)>,
    entry: Option<(OwnedFd, u32)>,
}

impl Granted {
    fn give(&mut self, dirfd: RawFd, name: &OsStr) {
        if let Ok(st) = nix::sys::stat::fstat(dirfd) {
            let old = st.st_mode & 0o7777;
            if walk::lacks(&st, 0o300)
                && nix::sys::stat::fchmod(dirfd, Mode::from_bits_truncate(old | 0o700)).is_ok()
            {
                self.parent = Some((dirfd, old));
            }
        }
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let Ok(fd) = fcntl::openat(Some(dirfd), name, flags, Mode::empty()) else {
            return;
        };
        // SAFETY: openat just returned this descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let Ok(st) = nix::sys::stat::fstat(fd.as_raw_fd()) else {
            return;
        };
        let old = st.st_mode & 0o7777;
        if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR
            && walk::lacks(&st, 0o200)
            && walk::chmod_fd(fd.as_raw_fd(), old | 0o700).is_ok()
        {
            self.entry = Some((fd, old));
        }
    }

    fn put_back(self) {
        if let Some((fd, mode)) = self.parent {
            let _ = nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode));
        }
        if let Some((fd, mode)) = self.entry {
            let _ = walk::chmod_fd(fd.as_raw_fd(), mode);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn set_mode(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// A work tree and a project state beside it in a temporary directory.
    fn setup() -> (tempfile::TempDir, PathBuf, ProjectState, Target) {
        let t = tempfile::tempdir().unwrap();
        let wt = t.path().join("proj");
        std::fs::create_dir_all(&wt).unwrap();
        let st = ProjectState {
            dir: t.path().join("state/projects/0123456789abcdef"),
        };
        std::fs::create_dir_all(&st.dir).unwrap();
        let target = Target {
            work_tree: wt.as_os_str().as_bytes().to_vec(),
            common_dir: None,
            git_dir: None,
            writable: Vec::new(),
            covered: Vec::new(),
        };
        (t, wt, st, target)
    }

    const EPOCH: Since = Since { sec: 0, nsec: 0 };

    /// A project outside git at `wt`.
    fn plain(wt: &Path) -> Project {
        Project {
            root: wt.to_path_buf(),
            work_tree: wt.to_path_buf(),
            git_dir: None,
            common_dir: None,
            cwd: wt.to_path_buf(),
        }
    }

    /// Plants in a directory the agent made `0555` (a file, and a directory itself
    /// `0555`, which a move to another directory needs the write right of): moved aside,
    /// every mode put back (also the moved directory's, in the quarantine), restorable.
    #[test]
    fn plants_in_a_0555_directory_are_moved_and_modes_put_back() {
        let (_t, wt, st, target) = setup();
        let ro = wt.join("ro");
        std::fs::create_dir_all(ro.join(".husky")).unwrap();
        std::fs::write(ro.join(".envrc"), "x").unwrap();
        std::fs::write(ro.join(".husky/pre-commit"), "x").unwrap();
        std::fs::write(ro.join("keep.txt"), "x").unwrap();
        set_mode(&ro.join(".husky"), 0o555);
        set_mode(&ro, 0o555);
        let mut err = Vec::new();
        let out = run(&st, &target, EPOCH, &mut err);
        let err = String::from_utf8_lossy(&err);
        assert_eq!((out.moved, out.left.len()), (2, 0), "{err}");
        assert!(
            !ro.join(".envrc").exists() && !ro.join(".husky").exists(),
            "{err}"
        );
        assert!(ro.join("keep.txt").exists());
        assert_eq!(mode(&ro), 0o555);
        let q: Vec<_> = std::fs::read_dir(st.quarantine())
            .unwrap()
            .flatten()
            .collect();
        let husky = q
            .iter()
            .map(|e| e.path().join(ENTRY))
            .find(|p| p.is_dir())
            .unwrap();
        assert_eq!(mode(&husky), 0o555);
        set_mode(&ro, 0o755);
        set_mode(&husky, 0o755);
    }

    /// What the review cannot move aside holds the project: the launch's record is kept,
    /// the next review (the next launch's) names it, and once it is gone the record goes.
    /// (The quarantine cannot be made here: a file stands where it would be.)
    #[test]
    fn what_cannot_be_moved_holds_the_project_until_it_is_gone() {
        let (_t, wt, st, target) = setup();
        std::fs::write(st.quarantine(), "in the way").unwrap();
        let project = plain(&wt);
        let pending = begin(&st, &project, "i1", &Writable::default()).unwrap();
        // Made in the session: after the record (made before it, in another tick of the
        // file system's clock, it is older than the session and no finding: 9 of 30 runs).
        std::fs::write(wt.join(".envrc"), "x").unwrap();
        let mut err = Vec::new();
        let out = pending.finish(&st, false, &mut err);
        let text = String::from_utf8_lossy(&err);
        assert_eq!(out.left, [".envrc"], "{text}");
        assert!(text.contains("holding the project"), "{text}");
        let records = || std::fs::read_dir(st.review_pending()).unwrap().count();
        assert_eq!(records(), 1);
        // The next launch: still there, still held (its refusal names it).
        let out = missed(&st, Some(&target), &mut Vec::new());
        let refusal = out.refusal().unwrap().to_string();
        assert!(refusal.contains(".envrc"), "{refusal}");
        assert_eq!(records(), 1);
        // Gone: the review holds nothing, and its record goes.
        std::fs::remove_file(wt.join(".envrc")).unwrap();
        let out = missed(&st, Some(&target), &mut Vec::new());
        assert!(out.refusal().is_none(), "{:?}", out.left);
        assert_eq!(records(), 0);
    }

    /// A pending record that cannot be read (truncated after a killed launch) is "review
    /// everything": the project's host-run files are moved aside whatever their age.
    /// Without the project's target, it holds the project. The near miss: an intact
    /// record reviews only what changed since its launch.
    #[test]
    fn an_unreadable_record_means_reviewing_everything() {
        let (_t, wt, st, target) = setup();
        std::fs::write(wt.join(".envrc"), "planted before the record").unwrap();
        std::fs::write(wt.join("main.rs"), "x").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let intact = || {
            let p = begin(&st, &plain(&wt), "i1", &Writable::default()).unwrap();
            drop(p); // killed: not finished, not cancelled
        };
        intact();
        let out = missed(&st, Some(&target), &mut Vec::new());
        assert_eq!(out.moved, 0);
        assert!(wt.join(".envrc").exists());
        // Truncated.
        intact();
        let rec = st.review_pending().join("i1.json");
        std::fs::write(&rec, "{\"work_tr").unwrap();
        let out = missed(&st, None, &mut Vec::new());
        assert!(out.refusal().is_some());
        assert!(rec.exists() && wt.join(".envrc").exists());
        let mut err = Vec::new();
        let out = missed(&st, Some(&target), &mut err);
        let text = String::from_utf8_lossy(&err);
        assert_eq!((out.moved, out.left.len()), (1, 0), "{text}");
        assert!(text.contains("cannot be read"), "{text}");
        assert!(!wt.join(".envrc").exists() && wt.join("main.rs").exists());
        assert!(!rec.exists());
    }
}
