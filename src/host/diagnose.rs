//! Why bwrap could not make a sandbox: its error text together with the kernel's and the
//! container's settings, turned into the cause and the fix for it. The classifier is pure
//! ([`classify`]); [`Facts::probe`] reads the settings.

use crate::policy::escape::Shown;
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
    UnexpectedCapabilities,
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
    if has("Unexpected capabilities but not setuid") {
        return d(
            Cause::UnexpectedCapabilities,
            "bwrap was started holding capabilities while not setuid and not root, which it \
             refuses (it expects either a setuid bwrap or none)"
                .into(),
            "start claudebox from a process without added capabilities (not under a wrapper \
             that grants ambient capabilities, not a non-root container user given --cap-add), \
             and give bwrap no file capabilities (sudo setcap -r on it)"
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
    // bwrap 0.8 "No permissions to creating new namespace", Debian's "... to create new
    // namespace", bwrap 0.9+ "... to create a new namespace": EPERM from clone.
    if has("No permissions to creat") {
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
    // Denials of the restriction: EACCES on the uid map, or no CAP_NET_ADMIN for the new
    // network namespace's loopback; with the sysctl read as 0 it is not the restriction.
    let not_restricted = f.apparmor_restrict == Some(false);
    if uid_map && !not_restricted && (has("Permission denied") || f.apparmor_restrict == Some(true))
    {
        return apparmor(f);
    }
    if (has("Failed RTM_NEWADDR") || has("loopback: Failed")) && !not_restricted {
        return apparmor(f);
    }
    // Without the `unprivileged_userns` profile the restriction refuses the namespace itself.
    if has("Creating new namespace failed: Permission denied") && f.apparmor_restrict == Some(true)
    {
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
    // bwrap 0.9 to 0.11 (bubblewrap.c), and Debian's patched wording.
    const NO_PERM_09: &str = "bwrap: No permissions to create a new namespace, likely because \
        the kernel does not allow non-privileged user namespaces. On e.g. debian this can be \
        enabled with 'sysctl kernel.unprivileged_userns_clone=1'.\n";
    const NO_PERM_DEBIAN: &str = "bwrap: No permissions to create new namespace, likely because \
        the kernel does not allow non-privileged user namespaces. See <https://deb.li/bubblewrap> \
        or <file:///usr/share/doc/bubblewrap/README.Debian.gz>.\n";
    const NEW_NS_EACCES: &str = "bwrap: Creating new namespace failed: Permission denied\n";
    const UNEXPECTED_CAPS: &str =
        "bwrap: Unexpected capabilities but not setuid, old file caps config?\n";
    const CAPSET: &str = "bwrap: capset failed: Operation not permitted\n";
    const MAKE_SLAVE: &str = "bwrap: Failed to make / slave: Permission denied\n";
    const PIVOT_ROOT: &str = "bwrap: pivot_root: Permission denied\n";
    const APPLY_SECCOMP_SETGROUPS: &str = "apply-seccomp: write /proc/self/setgroups (nested \
        userns is capability-restricted; caller must provide CAP_SYS_ADMIN): Permission denied\n";
    const APPLY_SECCOMP_UID_MAP: &str =
        "apply-seccomp: write /proc/self/uid_map: Operation not permitted\n";
    const OVERFLOWUID: &str = "bwrap: Can't read /proc/sys/kernel/overflowuid: Permission denied\n";

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

    /// The failure texts users report, exactly as bwrap (0.8 to 0.11, and Debian's
    /// patched wording) and Claude Code's sandbox helper print them, each with the cause it
    /// must get under each reading of the host: the sysctl at 1, at 0 or unreadable, a
    /// container, Debian's switch off, root nesting. Texts that are not AppArmor's must
    /// not become AppArmor even when the restriction is on.
    #[test]
    fn reported_failure_texts_get_their_cause() {
        use Cause::*;
        let restricted = Facts {
            apparmor_restrict: Some(true),
            ..user()
        };
        let unrestricted = Facts {
            apparmor_restrict: Some(false),
            ..user()
        };
        let unread = user();
        let docker = Facts {
            container: Some("/.dockerenv exists: Docker".into()),
            ..user()
        };
        let debian_off = Facts {
            userns_clone: Some(false),
            apparmor_restrict: None,
            ..user()
        };
        let root = Facts { uid: 0, ..user() };
        // (where it was reported, text, facts, nested, cause)
        let table: &[(&str, &str, &Facts, bool, Cause)] = &[
            // anthropics/claude-code#17727, akitaonrails/ai-jail#34, Kron4ek/Conty#139
            (
                "uid map EACCES",
                UID_MAP_EACCES,
                &restricted,
                false,
                AppArmor,
            ),
            (
                "uid map EACCES, sysctl unread",
                UID_MAP_EACCES,
                &unread,
                false,
                AppArmor,
            ),
            (
                "uid map EACCES, sysctl 0",
                UID_MAP_EACCES,
                &unrestricted,
                false,
                Unknown,
            ),
            (
                "uid map EACCES in Docker",
                UID_MAP_EACCES,
                &Facts {
                    apparmor_restrict: Some(true),
                    ..docker.clone()
                },
                false,
                AppArmor,
            ),
            // anthropics/claude-code#14719 #55585, openai/codex#15057, sandbox-runtime#74
            ("loopback", RTM, &restricted, false, AppArmor),
            ("loopback, sysctl unread", RTM, &unread, false, AppArmor),
            ("loopback, sysctl 0", RTM, &unrestricted, false, Unknown),
            ("loopback nested", RTM, &restricted, true, AppArmor),
            ("uid map EPERM", UID_MAP_EPERM, &restricted, false, AppArmor),
            (
                "uid map EPERM, sysctl 0",
                UID_MAP_EPERM,
                &unrestricted,
                false,
                Unknown,
            ),
            (
                "uid map EPERM, root nested",
                UID_MAP_EPERM,
                &root,
                true,
                RootNested,
            ),
            // bwrap 0.9+, Debian's wording, bwrap 0.8's (VHSgunzo/runimage#2)
            (
                "no permissions 0.9",
                NO_PERM_09,
                &debian_off,
                false,
                UsernsCloneOff,
            ),
            (
                "no permissions Debian",
                NO_PERM_DEBIAN,
                &debian_off,
                false,
                UsernsCloneOff,
            ),
            (
                "no permissions 0.8",
                NO_PERM,
                &debian_off,
                false,
                UsernsCloneOff,
            ),
            (
                "no permissions 0.9 in Docker",
                NO_PERM_09,
                &docker,
                false,
                Container,
            ),
            (
                "no permissions Debian in Docker",
                NO_PERM_DEBIAN,
                &docker,
                false,
                Container,
            ),
            (
                "no permissions, restricted",
                NO_PERM_09,
                &restricted,
                false,
                AppArmor,
            ),
            (
                "no permissions, sysctl 0",
                NO_PERM_09,
                &unrestricted,
                false,
                Unknown,
            ),
            (
                "clone EACCES, restricted",
                NEW_NS_EACCES,
                &restricted,
                false,
                AppArmor,
            ),
            (
                "clone EACCES, sysctl 0",
                NEW_NS_EACCES,
                &unrestricted,
                false,
                Unknown,
            ),
            (
                "clone EPERM in Docker",
                NEW_NS_EPERM,
                &docker,
                false,
                Container,
            ),
            (
                "clone EPERM, restricted",
                NEW_NS_EPERM,
                &restricted,
                false,
                Unknown,
            ),
            // setuid and capabilities: never AppArmor
            (
                "file caps",
                UNEXPECTED_CAPS,
                &restricted,
                false,
                UnexpectedCapabilities,
            ),
            (
                "file caps, user",
                UNEXPECTED_CAPS,
                &unread,
                false,
                UnexpectedCapabilities,
            ),
            (
                "no userns, setuid needed",
                NO_USERNS,
                &restricted,
                false,
                NoUserNamespaces,
            ),
            ("capset", CAPSET, &restricted, false, Unknown),
            ("ENOSPC", ENOSPC_NEW, &restricted, false, MaxUserNamespaces),
            ("ENOSPC old", ENOSPC_OLD, &unread, true, MaxUserNamespaces),
            // containers (typeclaw/typeclaw#1441, containers/bubblewrap#362)
            ("slave in Docker", MAKE_SLAVE, &docker, false, Container),
            ("slave on a host", MAKE_SLAVE, &restricted, false, Unknown),
            ("pivot_root in LXC", PIVOT_ROOT, &docker, false, Container),
            ("proc in Docker", PROC, &docker, false, Container),
            ("proc nested", PROC, &unread, true, Unknown),
            // Claude Code's helper (anthropics/claude-code#87680 #89478) and a confined
            // caller (openai/codex#29908): not the userns restriction
            (
                "apply-seccomp setgroups",
                APPLY_SECCOMP_SETGROUPS,
                &restricted,
                true,
                Unknown,
            ),
            (
                "apply-seccomp uid_map",
                APPLY_SECCOMP_UID_MAP,
                &restricted,
                true,
                Unknown,
            ),
            ("overflowuid", OVERFLOWUID, &restricted, false, Unknown),
            (
                "old bwrap",
                "bwrap: Unknown option --ro-bind-fd\n",
                &restricted,
                false,
                OldBwrap,
            ),
            (
                "no bwrap inside",
                NO_BWRAP,
                &restricted,
                true,
                NoBwrapInside,
            ),
        ];
        for (what, text, facts, nested, want) in table {
            let got = classify(text, facts, *nested);
            assert_eq!(got.cause, *want, "{what}: {text}");
            if *want == AppArmor {
                assert!(
                    got.fix.contains(crate::policy::apparmor::ONE_STEP),
                    "{what}"
                );
            } else {
                assert!(!got.fix.contains("apparmor_parser"), "{what}: {}", got.fix);
            }
        }
    }

    #[test]
    fn unknown_quotes_bwrap() {
        let dg = classify("bwrap: Something new: Bad thing\n", &user(), false);
        assert_eq!(dg.cause, Cause::Unknown);
        assert!(dg.text.contains("bwrap: Something new: Bad thing"));
    }
}
