//! Why bwrap could not make a sandbox: its error text together with the kernel's and the
//! container's settings, turned into the cause and the fix for it. The classifier is pure
//! ([`classify`]); [`Facts::probe`] reads the settings.

use crate::policy::render::Shown;
use std::fs;
use std::path::{Path, PathBuf};

/// The settings that decide whether an unprivileged user may create user namespaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub uid: u32,
    /// `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10+).
    pub apparmor_restrict: Option<bool>,
    /// `kernel.unprivileged_userns_clone` (Debian's and some older kernels' switch).
    pub userns_clone: Option<bool>,
    /// `user.max_user_namespaces`.
    pub max_user_ns: Option<u64>,
    /// How we know that we run in a container, if we do.
    pub container: Option<String>,
    /// bwrap with symlinks resolved (AppArmor profiles attach to this path).
    pub bwrap: PathBuf,
}

impl Facts {
    pub fn probe(bwrap: &Path) -> Facts {
        Facts {
            uid: nix::unistd::getuid().as_raw(),
            apparmor_restrict: read_num("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
                .map(|v| v != 0),
            userns_clone: read_num("/proc/sys/kernel/unprivileged_userns_clone").map(|v| v != 0),
            max_user_ns: read_num("/proc/sys/user/max_user_namespaces"),
            container: container(),
            bwrap: fs::canonicalize(bwrap).unwrap_or_else(|_| bwrap.to_path_buf()),
        }
    }
}

fn read_num(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Docker, Podman, systemd-nspawn/LXC, or a container cgroup.
fn container() -> Option<String> {
    if Path::new("/.dockerenv").exists() {
        return Some("/.dockerenv exists: Docker".into());
    }
    if Path::new("/run/.containerenv").exists() {
        return Some("/run/.containerenv exists: Podman".into());
    }
    if let Some(v) = std::env::var_os("container").filter(|v| !v.is_empty()) {
        return Some(format!("$container is {}", v.to_string_lossy()));
    }
    let cg = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for word in ["docker", "kubepods", "containerd", "libpod", "lxc"] {
        if cg.contains(word) {
            return Some(format!("/proc/self/cgroup mentions {word}"));
        }
    }
    None
}

/// A cause and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub cause: Cause,
    pub text: String,
    pub fix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    AppArmor,
    UsernsCloneOff,
    MaxUserNamespaces,
    NoUserNamespaces,
    Container,
    RootNested,
    NoBwrapInside,
    OldBwrap,
    Unknown,
}

/// Classifies bwrap's stderr. `nested`: bwrap ran inside a claudebox sandbox.
pub fn classify(stderr: &str, f: &Facts, nested: bool) -> Diagnosis {
    let err = last_bwrap_line(stderr);
    let has = |s: &str| stderr.contains(s);
    let uid_map = has("setting up uid map") || has("setting up gid map");

    if has("Unknown option --ro-bind-fd") || has("Unknown option --bind-fd") {
        return d(
            Cause::OldBwrap,
            "this bwrap cannot mount a descriptor (--bind-fd, --ro-bind-fd), which claudebox \
             uses so that what it checked is what gets mounted"
                .into(),
            "upgrade bubblewrap to 0.10 or later (Debian 12: the 0.8.0-2+deb12u1 security \
             update has it)"
                .into(),
        );
    }
    if has("execvp bwrap") || (nested && has("execvp") && has("No such file")) {
        return d(
            Cause::NoBwrapInside,
            "there is no `bwrap` on PATH inside the sandbox".into(),
            "install bubblewrap system-wide (e.g. /usr/bin/bwrap), so that Claude Code's own \
             Bash sandbox finds it inside"
                .into(),
        );
    }
    if f.max_user_ns == Some(0) {
        return d(
            Cause::MaxUserNamespaces,
            "user.max_user_namespaces is 0: the kernel allows no user namespaces".into(),
            sysctl_fix("user.max_user_namespaces", "15000"),
        );
    }
    if has("max_*_namespaces exceeded")
        || (has("Creating new namespace failed") && has("No space left on device"))
    {
        return d(
            Cause::MaxUserNamespaces,
            format!(
                "the limit of user namespaces is reached (user.max_user_namespaces = {}){}",
                f.max_user_ns
                    .map_or_else(|| "unknown".into(), |v| v.to_string()),
                if nested {
                    ", or they are nested too deep"
                } else {
                    ""
                }
            ),
            sysctl_fix("user.max_user_namespaces", "15000"),
        );
    }
    if has("likely because the kernel does not support user namespaces") {
        return d(
            Cause::NoUserNamespaces,
            "this kernel has no user namespaces".into(),
            "use a kernel built with CONFIG_USER_NS=y (every mainstream distribution's is)".into(),
        );
    }
    if has("No permissions to creating new namespace") {
        if f.userns_clone == Some(false) {
            return d(
                Cause::UsernsCloneOff,
                "kernel.unprivileged_userns_clone is 0: unprivileged users may not create \
                 user namespaces"
                    .into(),
                sysctl_fix("kernel.unprivileged_userns_clone", "1"),
            );
        }
        if let Some(how) = &f.container {
            return container_diag(how, err);
        }
        if f.apparmor_restrict == Some(true) {
            return apparmor(f);
        }
    }
    if uid_map && (has("Permission denied") || f.apparmor_restrict == Some(true)) {
        return apparmor(f);
    }
    if has("Failed RTM_NEWADDR") || has("loopback: Failed") {
        return apparmor(f);
    }
    if uid_map && has("Operation not permitted") && f.uid == 0 && nested {
        return d(
            Cause::RootNested,
            "claudebox runs as root: the sandbox drops every capability, and since Linux 5.12 \
             a nested user namespace that maps uid 0 needs CAP_SETFCAP, so a sandbox inside \
             it cannot start"
                .into(),
            "run claudebox as an ordinary user (Claude Code's Bash sandbox then works inside)"
                .into(),
        );
    }
    let container_signs = has("Creating new namespace failed")
        || has("Can't mount proc")
        || has("Failed to make / slave")
        || has("Failed to mount tmpfs")
        || has("pivot_root")
        || uid_map;
    if container_signs {
        if let Some(how) = &f.container {
            return container_diag(how, err);
        }
        if nested && has("Can't mount proc") {
            return d(
                Cause::Unknown,
                format!("bwrap cannot mount a new /proc inside the sandbox: {err}"),
                "the sandbox needs a full /proc of its own; report this with `claudebox --dry-run`"
                    .into(),
            );
        }
    }
    d(
        Cause::Unknown,
        format!("bwrap failed: {err}"),
        "run the command `claudebox --dry-run` prints to see the whole error; the kernel log \
         (`sudo dmesg | tail`) may name an LSM that denied it"
            .into(),
    )
}

fn d(cause: Cause, text: String, fix: String) -> Diagnosis {
    Diagnosis { cause, text, fix }
}

fn last_bwrap_line(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("bwrap:"))
        .or_else(|| stderr.lines().rev().find(|l| !l.trim().is_empty()))
        .unwrap_or("(no message)")
        .trim()
}

fn apparmor(f: &Facts) -> Diagnosis {
    let bwrap = f.bwrap.shown();
    d(
        Cause::AppArmor,
        format!(
            "AppArmor restricts unprivileged user namespaces{} (Ubuntu 23.10 and later)",
            match f.apparmor_restrict {
                Some(true) => " (kernel.apparmor_restrict_unprivileged_userns = 1)",
                _ => "",
            }
        ),
        format!(
            "allow them for this bwrap ({bwrap}) only, with claudebox's AppArmor profile, \
             rather than turning the restriction off for the whole machine:\n{}",
            crate::policy::apparmor::ONE_STEP
        ),
    )
}

fn container_diag(how: &str, err: &str) -> Diagnosis {
    d(
        Cause::Container,
        format!(
            "claudebox runs in a container ({how}) that does not let it create namespaces or \
             mount a new /proc: {err}"
        ),
        "run claudebox on the host; or start the container with namespaces allowed, e.g. \
         `docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
         --security-opt systempaths=unconfined ...` (podman: also `--security-opt unmask=ALL`)"
            .into(),
    )
}

fn sysctl_fix(key: &str, value: &str) -> String {
    format!(
        "sudo sysctl -w {key}={value}; to keep it after a reboot: \
         echo '{key} = {value}' | sudo tee /etc/sysctl.d/60-claudebox-userns.conf"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // bwrap 0.8's messages, as bubblewrap.c words them.
    const UID_MAP_EACCES: &str = "bwrap: setting up uid map: Permission denied\n";
    const UID_MAP_EPERM: &str = "bwrap: setting up uid map: Operation not permitted\n";
    const RTM: &str = "bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted\n";
    const NO_PERM: &str = "bwrap: No permissions to creating new namespace, likely because the \
        kernel does not allow non-privileged user namespaces. On e.g. debian this can be \
        enabled with 'sysctl kernel.unprivileged_userns_clone=1'.\n";
    const ENOSPC_NEW: &str = "bwrap: Creating new namespace failed: nesting depth or \
        /proc/sys/user/max_*_namespaces exceeded (ENOSPC)\n";
    const ENOSPC_OLD: &str = "bwrap: Creating new namespace failed: No space left on device\n";
    const NO_USERNS: &str = "bwrap: Creating new namespace failed, likely because the kernel \
        does not support user namespaces.  bwrap must be installed setuid on such systems.\n";
    const PROC: &str = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n";
    const NEW_NS_EPERM: &str = "bwrap: Creating new namespace failed: Operation not permitted\n";
    const NO_BWRAP: &str = "bwrap: execvp bwrap: No such file or directory\n";

    fn user() -> Facts {
        Facts {
            uid: 1000,
            bwrap: "/usr/bin/bwrap".into(),
            max_user_ns: Some(63_000),
            ..Facts::default()
        }
    }

    #[test]
    fn ubuntu_apparmor_restriction() {
        let f = Facts {
            apparmor_restrict: Some(true),
            ..user()
        };
        for msg in [UID_MAP_EACCES, UID_MAP_EPERM, RTM] {
            let dg = classify(msg, &f, false);
            assert_eq!(dg.cause, Cause::AppArmor, "{msg}");
            assert!(dg.fix.contains("(/usr/bin/bwrap)"), "{}", dg.fix);
            assert!(
                dg.fix.contains(crate::policy::apparmor::ONE_STEP),
                "{}",
                dg.fix
            );
            assert!(!dg.fix.contains("apparmor_restrict_unprivileged_userns=0"));
        }
        // EACCES on the uid map is AppArmor's signature even when the sysctl is unreadable.
        assert_eq!(
            classify(UID_MAP_EACCES, &user(), false).cause,
            Cause::AppArmor
        );
    }

    #[test]
    fn debian_userns_clone_off() {
        let f = Facts {
            userns_clone: Some(false),
            ..user()
        };
        let dg = classify(NO_PERM, &f, false);
        assert_eq!(dg.cause, Cause::UsernsCloneOff);
        assert!(dg.fix.contains("kernel.unprivileged_userns_clone=1"));
    }

    #[test]
    fn max_user_namespaces_zero() {
        let f = Facts {
            max_user_ns: Some(0),
            ..user()
        };
        for msg in [ENOSPC_NEW, ENOSPC_OLD, NO_PERM] {
            let dg = classify(msg, &f, false);
            assert_eq!(dg.cause, Cause::MaxUserNamespaces, "{msg}");
            assert!(dg.fix.contains("user.max_user_namespaces=15000"));
        }
        assert_eq!(
            classify(ENOSPC_NEW, &user(), true).cause,
            Cause::MaxUserNamespaces
        );
    }

    #[test]
    fn kernel_without_user_namespaces() {
        assert_eq!(
            classify(NO_USERNS, &user(), false).cause,
            Cause::NoUserNamespaces
        );
    }

    #[test]
    fn containers() {
        let f = Facts {
            container: Some("/.dockerenv exists: Docker".into()),
            ..user()
        };
        for msg in [NO_PERM, PROC, NEW_NS_EPERM, UID_MAP_EPERM] {
            let dg = classify(msg, &f, false);
            assert_eq!(dg.cause, Cause::Container, "{msg}");
            assert!(dg.fix.contains("seccomp=unconfined"));
            assert!(dg.text.contains("Docker"));
        }
    }

    #[test]
    fn root_cannot_nest() {
        let f = Facts { uid: 0, ..user() };
        assert_eq!(classify(UID_MAP_EPERM, &f, true).cause, Cause::RootNested);
        assert_ne!(classify(UID_MAP_EPERM, &f, false).cause, Cause::RootNested);
    }

    #[test]
    fn bwrap_without_bind_fd() {
        let out = classify("bwrap: Unknown option --ro-bind-fd\n", &user(), false);
        assert_eq!(out.cause, Cause::OldBwrap);
        assert!(out.fix.contains("0.10"), "{}", out.fix);
    }

    #[test]
    fn no_bwrap_inside() {
        assert_eq!(
            classify(NO_BWRAP, &user(), true).cause,
            Cause::NoBwrapInside
        );
    }

    #[test]
    fn unknown_quotes_bwrap() {
        let dg = classify("bwrap: Something new: Bad thing\n", &user(), false);
        assert_eq!(dg.cause, Cause::Unknown);
        assert!(dg.text.contains("bwrap: Something new: Bad thing"));
    }
}
