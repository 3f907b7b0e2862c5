//! Descriptor flags: the one place claudebox lets a descriptor cross an exec (clears
//! `FD_CLOEXEC`, which std and nix set on everything they open) or stops it there. On
//! rustix's `fcntl` (a direct system call, nothing allocated: safe between fork and exec,
//! in a `pre_exec` closure, too); `close_range` through libc, which rustix does not wrap.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};

use rustix::io::{fcntl_setfd, FdFlags};

/// Lets `fd` cross the next exec: bwrap or a companion inherits it.
pub fn inherit(fd: impl AsFd) -> io::Result<()> {
    fcntl_setfd(fd, FdFlags::empty())?;
    Ok(())
}

/// [`inherit`] for a descriptor number, for a `pre_exec` closure (the owning value stays
/// with the parent's `Command`, the child has only the number).
///
/// # Safety
/// `fd` is open in this process for the duration of the call.
pub unsafe fn inherit_raw(fd: RawFd) -> io::Result<()> {
    // SAFETY: the caller keeps `fd` open during the call.
    inherit(unsafe { BorrowedFd::borrow_raw(fd) })
}

/// Stops `fd` at the next exec (sets `FD_CLOEXEC`).
///
/// # Safety
/// `fd` is open in this process for the duration of the call.
pub unsafe fn close_on_exec_raw(fd: RawFd) -> io::Result<()> {
    // SAFETY: the caller keeps `fd` open during the call.
    fcntl_setfd(unsafe { BorrowedFd::borrow_raw(fd) }, FdFlags::CLOEXEC)?;
    Ok(())
}

/// Descriptor 3 and up: only `keep` crosses an exec; every other descriptor this process
/// holds (inherited from the user's shell, say `exec 7< ~`) gets close-on-exec. `keep`
/// loses close-on-exec.
pub fn keep_only(keep: &[RawFd]) -> anyhow::Result<()> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|fd| *fd > 2).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut lo: u32 = 3;
    let mut ranges = Vec::new();
    for &k in &keep {
        let k = k as u32;
        if k > lo {
            ranges.push((lo, k - 1));
        }
        lo = k + 1;
    }
    ranges.push((lo, u32::MAX));
    let mut fallback = false;
    for (a, b) in &ranges {
        // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags.
        let r = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_close_range,
                *a,
                *b,
                nix::libc::CLOSE_RANGE_CLOEXEC,
            )
        };
        if r != 0 {
            fallback = true;
            break;
        }
    }
    if fallback {
        // Before Linux 5.11: every open descriptor, one by one.
        let listed: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        for fd in listed {
            if fd > 2 && !keep.contains(&fd) {
                // SAFETY: a number listed as open just now; the one that is not (the
                // listing's own, closed since) only fails with EBADF, which is ignored.
                let _ = unsafe { close_on_exec_raw(fd) };
            }
        }
    }
    for fd in keep {
        // SAFETY: a descriptor this process holds (the caller's `keep`).
        if let Err(e) = unsafe { inherit_raw(fd) } {
            anyhow::bail!("cannot pass descriptor {fd} to bwrap: {e}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::io::fcntl_getfd;

    #[test]
    fn inherit_clears_and_close_on_exec_sets_the_flag() {
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(fcntl_getfd(&f).unwrap().contains(FdFlags::CLOEXEC));
        inherit(&f).unwrap();
        assert!(!fcntl_getfd(&f).unwrap().contains(FdFlags::CLOEXEC));
        use std::os::fd::AsRawFd;
        // SAFETY: `f` is open until the end of the test.
        unsafe { close_on_exec_raw(f.as_raw_fd()) }.unwrap();
        assert!(fcntl_getfd(&f).unwrap().contains(FdFlags::CLOEXEC));
        // SAFETY: as above.
        unsafe { inherit_raw(f.as_raw_fd()) }.unwrap();
        assert!(!fcntl_getfd(&f).unwrap().contains(FdFlags::CLOEXEC));
    }
}
