//! Host-side companion processes of a sandbox (the network proxy, the credentials sync):
//! started by the launch right before it execs bwrap, in their own session, and ended
//! when bwrap (their parent after the exec) exits.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::libc;
use nix::unistd::Pid;

/// For the child between fork and exec (async-signal-safe calls only): its own session
/// (a Ctrl-C in the terminal does not reach it), the death signal armed, and an error
/// if `parent` (the launching claudebox) already died before it was armed.
pub fn detach_bound_to(parent: Pid) -> std::io::Result<()> {
    nix::unistd::setsid()?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    if nix::unistd::getppid() != parent {
        return Err(std::io::Error::other("claudebox exited"));
    }
    Ok(())
}

/// A second guard besides the death signal, called by the companion once it runs: a
/// thread that waits on a pidfd of the parent (bwrap) and ends the process when it
/// exits. Skipped where pidfds are missing (< 5.3).
pub fn exit_with_parent() {
    let parent = nix::unistd::getppid();
    // SAFETY: a plain system call with integer arguments.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, parent.as_raw(), 0) };
    if raw < 0 {
        return;
    }
    // SAFETY: pidfd_open just returned this descriptor.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
    if nix::unistd::getppid() != parent {
        std::process::exit(0);
    }
    let _ = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || loop {
            let mut p = libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&raw mut p, 1, -1) } > 0 {
                std::process::exit(0);
            }
        });
}

/// For a companion that must not die in the middle of something (the credentials sync
/// holding the host's refresh lock): its parent's death (armed as SIGTERM, and a pidfd
/// where there is one), SIGTERM, SIGHUP and SIGINT end the process only once `hold` is
/// free. Call first thing, before any other thread exists (the signals are blocked and
/// read by a thread of their own). SIGKILL cannot be waited for: the launcher
/// removes a lock the dead sync held (`state::credsync`).
pub fn end_with_parent_outside(hold: &'static std::sync::Mutex<()>) {
    use nix::sys::signal::{SigSet, Signal};
    let parent = nix::unistd::getppid();
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGINT] {
        set.add(s);
    }
    let _ = set.thread_block();
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
    let sfd =
        nix::sys::signalfd::SignalFd::with_flags(&set, nix::sys::signalfd::SfdFlags::SFD_CLOEXEC);
    // SAFETY: a plain system call with integer arguments.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, parent.as_raw(), 0) };
    // SAFETY: pidfd_open just returned this descriptor.
    let pidfd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw as RawFd) });
    let end = move || {
        let _g = hold.lock();
        std::process::exit(0)
    };
    if nix::unistd::getppid() != parent {
        end();
    }
    let _ = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || loop {
            let mut p = [
                libc::pollfd {
                    fd: sfd.as_ref().map_or(-1, |s| s.as_raw_fd()),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: pidfd.as_ref().map_or(-1, |p| p.as_raw_fd()),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds (a negative fd is ignored).
            if unsafe { libc::poll(p.as_mut_ptr(), 2, -1) } > 0 {
                end();
            }
        });
}

/// Keeps what this process holds (the login it lends, the API key in its environment) out
/// of core dumps and away from other processes of the user: no core file (`RLIMIT_CORE`'s
/// soft limit 0) and not dumpable (`PR_SET_DUMPABLE` 0: no core through a `core_pattern`
/// pipe either while `fs.suid_dumpable` is 0, no `ptrace` attach, and its
/// `/proc/<pid>/mem`, `environ`, `fd` owned by root). Call first thing in every host-side
/// process that holds a real credential; an error is for the caller to stop on. Returns
/// the soft limit it replaced, which a child that holds no credential gets back
/// ([`CoreLimit::restore`]; the hard limit is left as it was so that it can).
///
/// The escape suite's control, in debug builds only: `CLAUDEBOX_TEST_DUMPABLE=1` leaves
/// the process as it was (`tests/integration/login_broker.rs`). A release build never
/// reads it.
pub fn keep_out_of_dumps() -> std::io::Result<CoreLimit> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_CORE)?;
    if super::test_switch::get("CLAUDEBOX_TEST_DUMPABLE").is_some() {
        return Ok(CoreLimit(soft, hard));
    }
    setrlimit(Resource::RLIMIT_CORE, 0, hard)?;
    nix::sys::prctl::set_dumpable(false)?;
    Ok(CoreLimit(soft, hard))
}

/// `RLIMIT_CORE` as it was before [`keep_out_of_dumps`].
#[derive(Clone, Copy, Debug)]
pub struct CoreLimit(u64, u64);

impl CoreLimit {
    /// For a child between fork and exec (one system call): the core limit back as it
    /// was (the exec makes the child dumpable again).
    pub fn restore(self) -> std::io::Result<()> {
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, self.0, self.1)?;
        Ok(())
    }
}

/// How a companion is started outside every project (`policy::companion_env`): its
/// working directory and the changes to the launcher's environment, worked out once by
/// the launch from the places the sandbox writes.
#[derive(Debug, Clone, Default)]
pub struct Outside {
    changes: Vec<crate::policy::companion_env::Change>,
}

impl Outside {
    /// From this process's environment and `areas`, the places the sandbox writes
    /// (canonical): a path is in one when it, with its symlinks resolved as far as it
    /// exists, lies beneath one.
    pub fn new(areas: &[std::path::PathBuf]) -> Outside {
        let written = |p: &std::path::Path| {
            let resolved = resolved(p);
            areas
                .iter()
                .any(|a| p.starts_with(a) || resolved.starts_with(a))
        };
        Outside {
            changes: crate::policy::companion_env::outside(std::env::vars_os(), written),
        }
    }

    /// Sets `cmd`'s working directory and environment: the launcher's, changed.
    pub fn apply(&self, cmd: &mut std::process::Command) {
        if in_launchers_dir() {
            return;
        }
        cmd.current_dir(crate::policy::companion_env::WORKDIR);
        for (name, value) in &self.changes {
            match value {
                Some(v) => cmd.env(name, v),
                None => cmd.env_remove(name),
            };
        }
    }

    /// For a process that runs no other program but keeps running on the host (the
    /// keeper, a holder): the working directory alone. Async-signal-safe.
    pub fn chdir_raw() {
        // SAFETY: chdir with a static C string.
        unsafe { libc::chdir(c"/".as_ptr()) };
    }
}

/// The escape suite's control, debug builds only: `CLAUDEBOX_TEST_COMPANIONS_IN_CWD`
/// leaves the companions (and the apiKeyHelper the broker runs) in the launcher's working
/// directory and environment, as before issue 34.
pub fn in_launchers_dir() -> bool {
    super::test_switch::on("CLAUDEBOX_TEST_COMPANIONS_IN_CWD")
}

/// `p` with its symlinks resolved as far as it exists, the rest joined as it is.
fn resolved(p: &std::path::Path) -> std::path::PathBuf {
    let mut rest = Vec::new();
    let mut at = p;
    loop {
        if let Ok(c) = std::fs::canonicalize(at) {
            return rest.iter().rev().fold(c, |acc, r| acc.join(r));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}
