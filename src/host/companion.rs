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
            if unsafe { libc::poll(&mut p, 1, -1) } > 0 {
                std::process::exit(0);
            }
        });
}
