//! Marking a project's state in use for the whole life of a sandbox, and telling from
//! outside how many sandboxes run on it (`--list`) or whether any does (`--gc`).
//!
//! Protocol, per project directory `projects/<id>/`:
//! - `lock` is a short mutex between a launch setting up and `--gc`. A launch holds it
//!   exclusively only while it registers itself; `--gc` holds it from its final check
//!   until the directory is gone, so a launch never registers in a directory being removed.
//! - `running/<instance-id>` is one empty file per running sandbox. The launch creates it
//!   and takes an exclusive flock on it while holding `lock`, then hands the descriptor to
//!   bwrap as `--sync-fd`: bwrap keeps it open in the sandbox's pid 1 (not in the agent's
//!   processes) until the last process of the sandbox exits, and the kernel drops the lock
//!   with it, however the sandbox ends. A reader counts the files it cannot lock.
//! - Stale files (sandbox gone, lock free) are removed by the next launch of the project,
//!   under `lock`, so every unlocked file it sees is stale.

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, Flock, FlockArg};

use crate::state::{self, ProjectState, StateHome};

pub const RUNNING_DIR: &str = "running";

/// How often a launch starts over when `--gc` removed the directory under it.
const ATTEMPTS: usize = 5;

/// The running sandbox's registration: an exclusively locked `running/<instance-id>`,
/// open without close-on-exec so that bwrap inherits it.
pub struct InUse {
    file: Flock<File>,
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
pub fn mark(
    home: &StateHome,
    state: &ProjectState,
    root: &Path,
    instance_id: &str,
) -> Result<InUse> {
    let lock_path = state.lock();
    let mut last_err = None;
    for _ in 0..ATTEMPTS {
        // Fails half-way when `--gc` moves the directory away meanwhile: start over.
        if let Err(e) = state::ensure_project_dir(home, state, root) {
            last_err = Some(e);
            continue;
        }
        let f = match open_for_lock(&lock_path, false) {
            Ok(f) => f,
            // Removed between creating and opening it: start over.
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot open {}", lock_path.display()))
            }
        };
        // Waits only while another launch registers or `--gc` removes this directory.
        let lock = Flock::lock(f, FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .with_context(|| format!("cannot lock {}", lock_path.display()))?;
        if !same_file(&lock, &lock_path) {
            // `--gc` removed the directory while we waited.
            continue;
        }
        let _ = lock.set_modified(SystemTime::now());
        prune_stale(state);
        return register(state, instance_id);
    }
    if let Some(e) = last_err {
        return Err(e);
    }
    bail!(
        "{} keeps disappearing while claudebox starts (is `claudebox --gc` running in a loop?)",
        state.dir.display()
    )
}

fn register(state: &ProjectState, instance_id: &str) -> Result<InUse> {
    let dir = running_dir(state);
    state::mkdir_private(&dir)?;
    let path = dir.join(instance_id);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let file = Flock::lock(f, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .with_context(|| format!("cannot lock {}", path.display()))?;
    // std opens files close-on-exec; clear it so that bwrap inherits the lock.
    fcntl(file.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))
        .with_context(|| format!("cannot pass {} to bwrap", path.display()))?;
    Ok(InUse { file })
}

/// Removes `running/` entries whose sandbox has ended. Call only while holding `lock`:
/// then no launch is between creating its file and locking it.
fn prune_stale(state: &ProjectState) {
    let Ok(rd) = fs::read_dir(running_dir(state)) else {
        return;
    };
    for entry in rd.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        if let Ok(f) = open_for_lock(&entry.path(), false) {
            if let Ok(unlocked) = Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                let _ = fs::remove_file(entry.path());
                drop(unlocked);
            }
        }
    }
}

/// Whether a file is locked by someone else (a running sandbox). Errors other than "it is
/// locked" count as locked: when in doubt, in use.
pub fn is_locked(path: &Path) -> bool {
    let f = match open_for_lock(path, false) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return false,
        Err(_) => return true,
    };
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(_) => false,
        Err((_, Errno::EWOULDBLOCK)) => true,
        Err(_) => true,
    }
}

/// How many sandboxes run on the project in `dir` now. Changes nothing.
pub fn count_running(dir: &Path) -> usize {
    let Ok(rd) = fs::read_dir(dir.join(RUNNING_DIR)) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()) && is_locked(&e.path()))
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
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
    };
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(GcLock::Held(l)),
        Err((_, Errno::EWOULDBLOCK)) => Ok(GcLock::Busy),
        Err((_, e)) => Err(e).with_context(|| format!("cannot lock {}", path.display())),
    }
}
