//! Marking a project's state in use for the whole life of a sandbox, and telling from
//! outside how many sandboxes run on it (`--list`) or whether any does (`--gc`).
//!
//! Protocol, per project directory `projects/<id>/`:
//! - `lock` is a short mutex between a launch setting up and `--gc`. A launch holds it
//!   exclusively only while it registers itself; `--gc` holds it from its final check
//!   until the directory is gone, so a launch never registers in a directory being removed.
//! - `running/0`, `running/1`, ... are slots, one empty file each. A launch takes an
//!   exclusive flock on the lowest slot nobody holds (creating it only when every existing
//!   one is held) while holding `lock`, then hands the descriptor to bwrap as `--sync-fd`:
//!   bwrap keeps it open in the sandbox's pid 1 (not in the agent's processes) until the
//!   last process of the sandbox exits, and the kernel drops the lock with it, however the
//!   sandbox ends. A reader counts the files it cannot lock; an unlocked slot is free.
//! - Slots are reused, not removed: there are never more of them than sandboxes that ran
//!   on the project at once, and a launch creates no file once they exist. (Creating a
//!   file costs a journalled metadata write: 0.6 ms on the ext4 of the benchmark's
//!   machine, a tenth of the whole sandbox's start.)

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::host::holders::{self, Holder};
use crate::policy::escape::Shown;
use crate::state::{self, ProjectState, StateHome};

pub const RUNNING_DIR: &str = "running";

/// How often a launch starts over when `--gc` removed the directory under it.
const ATTEMPTS: usize = 5;

/// More sandboxes than this on one project at once is refused rather than looped over.
const MAX_SLOTS: usize = 4096;

/// The running sandbox's registration: an exclusively locked `running/<slot>`,
/// open without close-on-exec so that bwrap inherits it.
pub struct InUse {
    file: Flock<File>,
    /// This launch made the project's state directory (its first launch).
    pub created: bool,
}

impl InUse {
    /// The descriptor to pass as `--sync-fd`.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

fn running_dir(state: &ProjectState) -> PathBuf {
    state.dir.join(RUNNING_DIR)
}

/// Opens a file for locking only: never follows a symlink, never blocks on a FIFO.
fn open_for_lock(path: &Path, create: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK);
    if create {
        o.write(true).create(true).mode(0o600);
    }
    o.open(path)
}

fn same_file(f: &File, path: &Path) -> bool {
    match (f.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Creates the project's state (again, if `--gc` removed it meanwhile) and registers this
/// launch as running. Touches `lock` so that `--list` can show when the project was last
/// used.
pub fn mark(home: &StateHome, state: &ProjectState, root: &Path) -> Result<InUse> {
    let lock_path = state.lock();
    let mut last_err = None;
    let mut created = false;
    for _ in 0..ATTEMPTS {
        // Fails half-way when `--gc` moves the directory away meanwhile: start over.
        match state::ensure_project_dir(home, state, root) {
            Ok(made) => created |= made,
            Err(e) => {
                last_err = Some(e);
                continue;
            }
        }
        let f = match open_for_lock(&lock_path, false) {
            Ok(f) => f,
            // Removed between creating and opening it: start over.
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", lock_path.shown())),
        };
        // Waits only while another launch registers or `--gc` removes this directory.
        let lock = Flock::lock(f, FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .with_context(|| format!("cannot lock {}", lock_path.shown()))?;
        if !same_file(&lock, &lock_path) {
            // `--gc` removed the directory while we waited.
            continue;
        }
        let _ = lock.set_modified(SystemTime::now());
        let registered = register(state).map(|file| InUse { file, created });
        if registered.is_err() && created {
            drop(lock);
            state::remove_unused(state);
        }
        return registered;
    }
    if let Some(e) = last_err {
        return Err(e);
    }
    bail!(
        "{} keeps disappearing while claudebox starts (is `claudebox --gc` running in a loop?)",
        state.dir.shown()
    )
}

/// The project's `lock` (in the state directory open at `pd`), taken exclusively if
/// nobody holds it now; `None` otherwise.
pub fn try_lock_at(pd: std::os::fd::RawFd) -> Option<Flock<File>> {
    let flags = nix::fcntl::OFlag::O_RDONLY
        | nix::fcntl::OFlag::O_NOFOLLOW
        | nix::fcntl::OFlag::O_NONBLOCK
        | nix::fcntl::OFlag::O_CLOEXEC;
    let raw = nix::fcntl::openat(
        Some(pd),
        state::LOCK_FILE,
        flags,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    // SAFETY: `openat` just returned this descriptor; nothing else owns it.
    let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    Flock::lock(f, FlockArg::LockExclusiveNonblock).ok()
}

/// Holds the project's `lock` while a registered launch prepares the state files it binds
/// and opens its bind sources: a sibling launch that checks a file and then replaces it
/// (the settings copy, a mount point) must not do so between this launch's check and its
/// open, or this launch binds a replaced inode and bwrap refuses it (20 first launches at
/// once failed a third of the time so). `--gc` leaves a project alone while it is held.
pub fn setup_lock(state: &ProjectState) -> Result<Flock<File>> {
    let path = state.lock();
    let f = open_for_lock(&path, false).with_context(|| format!("cannot open {}", path.shown()))?;
    Flock::lock(f, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .with_context(|| format!("cannot lock {}", path.shown()))
}

/// Takes the lowest free slot. Call only while holding `lock`: then no other launch is
/// between opening a slot and locking it.
fn register(state: &ProjectState) -> Result<Flock<File>> {
    let dir = running_dir(state);
    // Who took the held slots, read once at the first one held (not once per slot: with
    // 200 sandboxes of the project, 200 reads of a 400-line `/proc/locks` per launch, made
    // one at a time under `lock`).
    let mut takers: Option<Option<holders::Takers>> = None;
    for slot in 0..MAX_SLOTS {
        let path = dir.join(slot.to_string());
        let f = match open_for_lock(&path, false) {
            Ok(f) => f,
            // Every slot there is is held (or this is the project's first launch).
            Err(e) if e.kind() == ErrorKind::NotFound => {
                state::mkdir_private(&dir)?;
                open_for_lock(&path, true)
                    .with_context(|| format!("cannot create {}", path.shown()))?
            }
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.shown())),
        };
        let file = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(file) => file,
            // A running sandbox holds it (or `--list` is looking at it): the next one. A
            // bwrap stuck at start (bubblewrap #633) is ended and its slot taken: that
            // frees whatever pipe it held (a caller's stderr) at this launch.
            Err((f, Errno::EWOULDBLOCK)) => {
                // Taken by a launch that lives: a running sandbox, no look for stuck ones.
                let t = takers.get_or_insert_with(holders::Takers::read);
                if let (Some(t), Ok(m)) = (t, f.metadata()) {
                    if t.live_taker(&m) {
                        continue;
                    }
                }
                match reap_and_lock(f, &path) {
                    Some(file) => file,
                    None => continue,
                }
            }
            Err((_, e)) => return Err(e).with_context(|| format!("cannot lock {}", path.shown())),
        };
        // std opens files close-on-exec; clear it so that bwrap inherits the lock.
        crate::host::fd::inherit(&*file)
            .with_context(|| format!("cannot pass {} to bwrap", path.shown()))?;
        return Ok(file);
    }
    bail!(crate::policy::error::Fixable::new(
        format!(
            "{} has {MAX_SLOTS} sandboxes running on it",
            state.dir.shown()
        ),
        "stop some first"
    )
    .at(&state.dir))
}

/// The lock of the slot `f` (open on `path`, held by someone else) once the bwraps stuck
/// at start that held it are ended (`holders::reap`; said on stderr); `None` when a
/// running sandbox (or anything else) holds it.
fn reap_and_lock(f: File, path: &Path) -> Option<Flock<File>> {
    let Some(Holder::Stuck(pids)) = holders::of_held(path) else {
        return None;
    };
    let ended = holders::reap(path, &pids);
    if ended.is_empty() {
        return None;
    }
    eprintln!(
        "claudebox: {}",
        holders::reaped_message(&ended, &path.shown())
    );
    Flock::lock(f, FlockArg::LockExclusiveNonblock).ok()
}

/// Whether a file is locked by a running sandbox. A lock still held after the launch that
/// took it has exited (bwrap's pid 1 tearing down, or a bwrap stuck at start: see
/// `holders.rs`) does not count. Errors other than "it is locked" count as locked: when
/// in doubt, in use.
pub fn is_locked(path: &Path) -> bool {
    match holder(path) {
        Holder::Free | Holder::Ended | Holder::Stuck(_) => false,
        Holder::Running => true,
    }
}

/// Who holds a file's lock now.
pub fn holder(path: &Path) -> Holder {
    let f = match open_for_lock(path, false) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Holder::Free,
        Err(_) => return Holder::Running,
    };
    held_by(f, path)
}

/// Who holds the lock of `f`, open on the file `path` names.
fn held_by<T: nix::fcntl::Flockable>(mut f: T, path: &Path) -> Holder {
    for _ in 0..2 {
        f = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(_) => return Holder::Free,
            Err((f, Errno::EWOULDBLOCK)) => match holders::of_held(path) {
                Some(h) => return h,
                // Released meanwhile (or not shown): look again.
                None => f,
            },
            Err(_) => return Holder::Running,
        };
    }
    Holder::Running
}

/// [`holder`] of the file `name` in the directory open at `dir` (`path` names the same
/// file, for the look at who holds it): one lookup, not a walk of the whole path.
pub fn holder_at(dir: std::os::fd::RawFd, name: &std::ffi::CStr, path: &Path) -> Holder {
    let flags = nix::fcntl::OFlag::O_RDONLY
        | nix::fcntl::OFlag::O_NOFOLLOW
        | nix::fcntl::OFlag::O_NONBLOCK
        | nix::fcntl::OFlag::O_CLOEXEC;
    let f = match nix::fcntl::openat(Some(dir), name, flags, nix::sys::stat::Mode::empty()) {
        // SAFETY: `openat` just returned this descriptor; nothing else owns it.
        Ok(raw) => unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) },
        Err(Errno::ENOENT) => return Holder::Free,
        Err(_) => return Holder::Running,
    };
    held_by(f, path)
}

/// Slots of the project in `dir` held by bwraps stuck at start, with their pids.
pub fn stuck(dir: &Path) -> Vec<(PathBuf, Vec<i32>)> {
    let Ok(rd) = fs::read_dir(dir.join(RUNNING_DIR)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| match holder(&e.path()) {
            Holder::Stuck(p) => Some((e.path(), p)),
            _ => None,
        })
        .collect()
}

/// How many sandboxes run on the project in `dir` now. Changes nothing.
pub fn count_running(dir: &Path) -> usize {
    let Ok(rd) = fs::read_dir(dir.join(RUNNING_DIR)) else {
        return 0;
    };
    // Who took the held slots, read once (as `register` does), not once per slot.
    let mut takers: Option<Option<holders::Takers>> = None;
    rd.flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            let path = e.path();
            let f = match open_for_lock(&path, false) {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::NotFound => return false,
                Err(_) => return true,
            };
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(_) => false,
                Err((f, Errno::EWOULDBLOCK)) => {
                    let t = takers.get_or_insert_with(holders::Takers::read);
                    if let (Some(t), Ok(m)) = (t, f.metadata()) {
                        if t.live_taker(&m) {
                            return true;
                        }
                    }
                    held_by(f, &path) == Holder::Running
                }
                Err(_) => true,
            }
        })
        .count()
}

/// What `--gc` found when it tried to take a project's `lock`.
pub enum GcLock {
    /// Held exclusively: no launch can register until it is dropped.
    Held(#[allow(dead_code)] Flock<File>),
    /// A launch is registering (or an older claudebox holds it for its sandbox's life).
    Busy,
    /// No `lock` file (and none created, for a dry run).
    Absent,
}

/// Takes `lock` without waiting. With `create`, makes it when missing so that a launch
/// arriving now waits for `--gc` to finish.
pub fn lock_for_gc(dir: &Path, create: bool) -> Result<GcLock> {
    let path = dir.join(state::LOCK_FILE);
    let f = match open_for_lock(&path, create) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(GcLock::Absent),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.shown())),
    };
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(GcLock::Held(l)),
        Err((_, Errno::EWOULDBLOCK)) => Ok(GcLock::Busy),
        Err((_, e)) => Err(e).with_context(|| format!("cannot lock {}", path.shown())),
    }
}
