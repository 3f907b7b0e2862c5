//! The per-name lock, `sessions/<name>.lock`: held exclusively by the sandbox that runs
//! the session (bwrap inherits the descriptor through exec), probed shared by `--list`;
//! and `sessions/<name>.running`, which says who took it last.

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{lock_path, running_path};
use crate::host::holders::{self, Holder};
use crate::policy::escape::Shown;
use crate::state::{self, ProjectState};

/// Who holds (or last held) a name's lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    pub pid: u32,
    pub instance: String,
    pub started: String,
    pub cwd: String,
    /// When `pid` started (see [`holders::start_ticks`]): the launching claudebox, which
    /// becomes the sandbox's outer bwrap by exec and lives exactly as long as the sandbox.
    /// Absent in notes written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
}

impl RunInfo {
    /// Who runs the session from now on: this process, which is about to exec bwrap.
    pub fn now(instance: &str, cwd: &std::path::Path) -> RunInfo {
        let pid = std::process::id();
        RunInfo {
            pid,
            instance: instance.to_string(),
            started: super::record::now(),
            cwd: cwd.to_string_lossy().into_owned(),
            start_ticks: holders::start_ticks(pid),
        }
    }
}

/// Whether the sandbox the run note names still runs. The flock alone does not say so:
/// the agent's processes inherit its descriptor (bwrap's pid 1 keeps only the in-use
/// slot), so an agent can close it; the outer bwrap, which the note names, is out of its
/// reach and ends with the sandbox.
fn noted_sandbox_runs(state: &ProjectState, name: &str) -> bool {
    read_run_info(state, name).is_some_and(|i| {
        i.pid != std::process::id() && i.start_ticks.is_some_and(|t| holders::still_runs(i.pid, t))
    })
}

/// The name's lock, or `None` when a running session (or `--forget`) holds it.
pub fn lock_name(state: &ProjectState, name: &str) -> Result<Option<Flock<File>>> {
    let path = lock_path(state, name);
    // A sandbox that has just ended still holds the lock for a moment (its bwrap pid 1
    // tears down after the launch's exit status is out): wait that out.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.shown())),
        }
        let f = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => continue, // forgotten meanwhile
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.shown())),
        };
        let Some(lock) = lock_exclusive(f, &path)? else {
            match holders::of_held(&path).unwrap_or(Holder::Ended) {
                Holder::Ended | Holder::Free if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                }
                Holder::Stuck(pids) => {
                    let what = format!("session `{name}`");
                    let ended = holders::reap(&path, &pids);
                    if ended.is_empty() {
                        bail!("{}", holders::stuck_message(&pids, &what))
                    }
                    eprintln!("claudebox: {}", holders::reaped_message(&ended, &what));
                    continue;
                }
                _ => return Ok(None),
            }
        };
        // `--forget` unlinks the lock file while holding it: ours must still be in place.
        let held = lock.metadata()?;
        if let Ok(now) = fs::symlink_metadata(&path) {
            if now.ino() == held.ino() && now.dev() == held.dev() {
                if noted_sandbox_runs(state, name) {
                    return Ok(None);
                }
                return Ok(Some(lock));
            }
        }
    }
}

/// Exclusive, non-blocking. A shared holder is only `--list` looking for an instant, so
/// that is waited out; an exclusive holder is a running session: `None`.
fn lock_exclusive(mut f: File, path: &Path) -> Result<Option<Flock<File>>> {
    let fail = |e: Errno| anyhow::Error::from(e).context(format!("cannot lock {}", path.shown()));
    loop {
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(Some(l)),
            Err((back, Errno::EWOULDBLOCK)) => f = back,
            Err((_, e)) => return Err(fail(e)),
        }
        match Flock::lock(f, FlockArg::LockSharedNonblock) {
            Ok(l) => {
                f = l.unlock().map_err(|(_, e)| fail(e))?;
                std::thread::yield_now();
            }
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(fail(e)),
        }
    }
}

/// Whether a session holds its lock, probed with a shared lock released at once.
pub fn is_running(state: &ProjectState, name: &str) -> bool {
    if noted_sandbox_runs(state, name) {
        return true;
    }
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(lock_path(state, name))
    else {
        return false;
    };
    matches!(
        Flock::lock(f, FlockArg::LockSharedNonblock),
        Err((_, Errno::EWOULDBLOCK))
    ) && holders::of_held(&lock_path(state, name)).unwrap_or(Holder::Running) == Holder::Running
}

pub fn read_run_info(state: &ProjectState, name: &str) -> Option<RunInfo> {
    let bytes = fs::read(running_path(state, name)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The refusal for a name that is in use, naming the sandbox that runs it.
pub fn busy(state: &ProjectState, name: &str) -> String {
    let alive = |pid: u32| {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        !matches!(nix::sys::signal::kill(pid, None), Err(Errno::ESRCH))
    };
    match read_run_info(state, name).filter(|i| alive(i.pid)) {
        Some(i) => format!(
            "session `{name}` is already running: pid {}, started {} in {}, \
             CLAUDEBOX_INSTANCE_ID={}; quit it first, or use another name",
            i.pid, i.started, i.cwd, i.instance
        ),
        None => format!(
            "session `{name}` is already running (another claudebox is starting it right \
             now); quit it first, or use another name"
        ),
    }
}

/// Notes who runs the session now (atomic; not worth an fsync on the launch path).
pub fn write_run_info(state: &ProjectState, name: &str, info: &RunInfo) -> Result<()> {
    let mut bytes = serde_json::to_vec(info)?;
    bytes.push(b'\n');
    state::write_atomic_volatile(&running_path(state, name), &bytes, 0o600)
        .with_context(|| format!("noting who runs session `{name}`"))
}
