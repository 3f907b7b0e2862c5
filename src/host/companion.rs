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
