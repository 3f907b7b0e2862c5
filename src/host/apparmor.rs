//! What AppArmor says about the bwrap claudebox runs, read as an ordinary user can: the
//! sysctl of Ubuntu's user namespace restriction, and the label AppArmor gives a real bwrap
//! process at exec (the profile that covers it), read from
//! `/proc/PID/attr/apparmor/current` while that bwrap is held waiting for its arguments on a
//! pipe, so it creates no namespace (`/sys/kernel/security/apparmor/profiles` needs root).

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::policy::apparmor::Label;
use crate::policy::escape::Shown;

/// `kernel.apparmor_restrict_unprivileged_userns` (None: the kernel has no such switch).
pub fn restrict_sysctl() -> Option<bool> {
    fs::read_to_string("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|v| v != 0)
}

/// [`crate::policy::apparmor::launch_warning`] for this host; starts bwrap only where the
/// kernel restricts user namespaces for this user.
pub fn launch_warning(bwrap: &Path) -> Option<String> {
    let restrict = restrict_sysctl();
    let uid = nix::unistd::getuid().as_raw();
    if restrict != Some(true) || uid == 0 {
        return None;
    }
    let real = fs::canonicalize(bwrap).unwrap_or_else(|_| bwrap.to_path_buf());
    crate::policy::apparmor::launch_warning(restrict, uid, &label_of_bwrap(&real), &real)
}

/// The label AppArmor gave a bwrap process at exec: the profile that covers it.
pub fn label_of_bwrap(bwrap: &Path) -> Result<Label, String> {
    let (pid, text) = with_held_bwrap(bwrap, |pid| {
        fs::read_to_string(format!("/proc/{pid}/attr/apparmor/current"))
            .or_else(|_| fs::read_to_string(format!("/proc/{pid}/attr/current")))
    })?;
    match text {
        Ok(t) if !t.trim().is_empty() => Ok(Label::parse(&t)),
        Ok(_) => Err(format!("bwrap's label (/proc/{pid}/attr/current) is empty")),
        Err(e) => Err(format!("cannot read the label of a bwrap process: {e}")),
    }
}

/// Starts `bwrap --args FD` with FD a pipe it waits on (so it parses nothing and makes no
/// namespace), runs `f` with its pid, then closes the pipe and reaps it (killed after 5 s).
pub fn with_held_bwrap<T>(bwrap: &Path, f: impl FnOnce(u32) -> T) -> Result<(u32, T), String> {
    let (read, write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let fd = read.as_raw_fd();
    let mut cmd = std::process::Command::new(bwrap);
    cmd.arg("--args")
        .arg(fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only fcntl between fork and exec, on `read`, which stays open until after
    // the spawn.
    unsafe {
        cmd.pre_exec(move || super::fd::inherit_raw(fd));
    }
    // spawn returns once the exec has happened: the process is bwrap from here on.
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bwrap.shown()))?;
    drop(read);
    let pid = child.id();
    let out = f(pid);
    drop(write);
    let deadline = Instant::now() + Duration::from_secs(5);
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok((pid, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The held bwrap is bwrap itself, in our own user namespace (it made none), and is
    /// gone afterwards.
    #[test]
    fn held_bwrap_is_bwrap_and_makes_no_namespace() {
        let Ok(bwrap) = which::which("bwrap") else {
            return;
        };
        let real = fs::canonicalize(&bwrap).unwrap();
        let ours = fs::read_link("/proc/self/ns/user").unwrap();
        let (pid, (exe, ns)) = with_held_bwrap(&bwrap, |pid| {
            std::thread::sleep(Duration::from_millis(50));
            (
                fs::read_link(format!("/proc/{pid}/exe")).unwrap(),
                fs::read_link(format!("/proc/{pid}/ns/user")).unwrap(),
            )
        })
        .unwrap();
        assert_eq!(exe, real);
        assert_eq!(ns, ours);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "bwrap {pid} was reaped"
        );
    }
}
