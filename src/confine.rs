//! The sandbox's first step inside: `claudebox --sandbox-init [--scope-abstract-unix] --
//! CMD [ARGS...]` applies what bwrap cannot express, then execs CMD in its place:
//!
//! - a seccomp filter that makes `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)` fail with EPERM
//!   (typing into the user's terminal) while every other ioctl (TIOCGWINSZ for resizing)
//!   passes, and that denies the kernel keyring calls (`add_key`, `keyctl`,
//!   `request_key`), through which the host session's keys stay readable in a sandbox;
//! - with `--scope-abstract-unix`, a Landlock scope that stops `connect()` to abstract
//!   unix sockets created outside the sandbox (X11 and Xwayland listen on
//!   `@/tmp/.X11-unix/X0` and authorise the same user by uid; some D-Bus buses), which the
//!   shared network namespace otherwise leaves reachable.
//!
//! - a check of the mounts whose destination lies where a sandbox can write (see
//!   `plan::mount_checks`): bwrap follows symlinks in a destination, so another sandbox of
//!   the project that swaps a directory on the way for a symlink while this one starts
//!   would move a protecting mount elsewhere. Each must be a mount point at its exact
//!   path (reached with no symlink), read-only as planned, or nothing starts.
//! - with `--default-signals`, SIGINT and SIGQUIT back at their default disposition. The
//!   launcher ignores them before it execs bwrap, so a Ctrl-C in the terminal (sent to the
//!   whole foreground process group) no longer kills bwrap, which would take the agent
//!   down mid-cleanup through `--die-with-parent`; bwrap's processes inherit the ignored
//!   disposition and only the agent, given the default back here, sees the signal. This
//!   step is essential: a non-interactive shell cannot trap a signal ignored on entry.
//!
//! It runs as a step of the printed command line, so `--dry-run` shows it and pasting that
//! line applies it too. Any failure ends the launch: nothing runs unconfined.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use landlock::{CompatLevel, Compatible, Ruleset, RulesetAttr, Scope};
use nix::libc;
use nix::sys::signal::{signal, SigHandler, Signal};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

pub const INIT_FLAG: &str = "--sandbox-init";
pub const SCOPE_FLAG: &str = "--scope-abstract-unix";
/// `--expect-ro PATH` / `--expect-rw PATH`: PATH must be a mount point, reached without a
/// symlink, read-only (or not).
pub const EXPECT_RO: &str = "--expect-ro";
pub const EXPECT_RW: &str = "--expect-rw";
pub const SIGNALS_FLAG: &str = "--default-signals";

/// The signals a terminal sends to its foreground process group from the keyboard, which
/// the launcher ignores and the first step inside gives back to the agent.
pub const TERMINAL_SIGNALS: [Signal; 2] = [Signal::SIGINT, Signal::SIGQUIT];

/// `TIOCLINUX` (console ioctl multiplexer; its subcode 2 pastes the selection as input).
const TIOCLINUX: u64 = 0x541C;

/// Entry point for `claudebox --sandbox-init ...` (args after the flag).
pub fn main(args: &[OsString]) -> ExitCode {
    match run(args) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("claudebox: sandbox init: {e:#}");
            ExitCode::from(126)
        }
    }
}

fn run(args: &[OsString]) -> Result<std::convert::Infallible> {
    let mut scope = false;
    let mut checks: Vec<(PathBuf, bool)> = Vec::new();
    let mut default_signals = false;
    let mut rest = args;
    loop {
        match rest.first().and_then(|a| a.to_str()) {
            Some(SCOPE_FLAG) => scope = true,
            Some(flag @ (EXPECT_RO | EXPECT_RW)) if rest.len() > 1 => {
                checks.push((PathBuf::from(&rest[1]), flag == EXPECT_RO));
                rest = &rest[1..];
            }
            Some(SIGNALS_FLAG) => default_signals = true,
            Some("--") => {
                rest = &rest[1..];
                break;
            }
            _ => bail!(
                "usage: claudebox {INIT_FLAG} [{SCOPE_FLAG}] [{SIGNALS_FLAG}] \
                 [{EXPECT_RO}|{EXPECT_RW} PATH]... -- CMD [ARGS...]"
            ),
        }
        rest = &rest[1..];
    }
    let Some(cmd) = rest.first() else {
        bail!("no command to run");
    };
    if !checks.is_empty() {
        check_mounts(&checks)?;
    }
    if scope {
        scope_abstract_unix()?;
    }
    let filter = filter()?;
    seccompiler::apply_filter(&filter).context("cannot install the seccomp filter")?;
    if default_signals {
        for sig in TERMINAL_SIGNALS {
            // SAFETY: SIG_DFL installs no handler.
            unsafe { signal(sig, SigHandler::SigDfl) }
                .with_context(|| format!("cannot restore the default action of {sig}"))?;
        }
    }
    let err = crate::exec::replace_with(rest);
    Err(err).with_context(|| format!("cannot run {}", cmd.to_string_lossy()))
}

/// Each `(path, read_only)` must be a mount point at exactly `path`, reached with no
/// symlink on the way, read-only as asked.
fn check_mounts(checks: &[(PathBuf, bool)]) -> Result<()> {
    let table = fs::read("/proc/self/mountinfo").context("cannot read /proc/self/mountinfo")?;
    let mounts = parse_mountinfo(&table);
    for (path, read_only) in checks {
        let found = mount_at(path).ok().and_then(|(id, reached)| {
            let (point, ro) = mounts
                .iter()
                .find(|(i, _, _)| *i == id)
                .map(|(_, p, r)| (p, *r))?;
            Some((reached, point.clone(), ro))
        });
        let ok = matches!(&found, Some((reached, point, ro))
            if reached == path && point == path && ro == read_only);
        if !ok {
            bail!(
                "{} is not the {} mount claudebox placed there (a directory on its way may \
                 have been swapped for a symlink while the sandbox started, by another \
                 sandbox of this project); refusing to start: look at that path",
                show(path),
                if *read_only {
                    "read-only"
                } else {
                    "read-write"
                },
            );
        }
    }
    Ok(())
}

fn show(p: &Path) -> String {
    String::from_utf8_lossy(&crate::render::escape_bytes(p.as_os_str().as_bytes())).into_owned()
}

/// The id of the mount `path` is on (its last component not followed), and the path the
/// kernel reached.
fn mount_at(path: &Path) -> std::io::Result<(u64, PathBuf)> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)?;
    let fd = f.as_raw_fd();
    let reached = crate::sources::reached(fd)?;
    let info = fs::read(format!("/proc/self/fdinfo/{fd}"))?;
    let id = info
        .split(|b| *b == b'\n')
        .find_map(|l| l.strip_prefix(b"mnt_id:"))
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
        .ok_or_else(|| std::io::Error::other("no mnt_id"))?;
    Ok((id, reached))
}

/// `/proc/self/mountinfo` rows: mount id, mount point (unescaped), read-only.
fn parse_mountinfo(text: &[u8]) -> Vec<(u64, PathBuf, bool)> {
    let mut out = Vec::new();
    for line in text.split(|b| *b == b'\n') {
        let f: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
        if f.len() < 6 {
            continue;
        }
        let Some(id) = std::str::from_utf8(f[0]).ok().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let ro = f[5].split(|b| *b == b',').any(|o| o == b"ro");
        out.push((id, PathBuf::from(OsString::from_vec(unescape(f[4]))), ro));
    }
    out
}

/// mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// Landlock: no `connect()` to abstract unix sockets made outside this domain.
fn scope_abstract_unix() -> Result<()> {
    Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .scope(Scope::AbstractUnixSocket)
        .and_then(|r| r.create())
        .and_then(|r| r.restrict_self())
        .context("cannot scope abstract unix sockets with Landlock (needs Linux 6.12 or later)")?;
    Ok(())
}

/// The seccomp filter, compiled for the running architecture.
pub fn filter() -> Result<BpfProgram> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|_| {
        anyhow::anyhow!(
            "no seccomp filter for the {} architecture; claudebox supports x86_64, aarch64 \
             and riscv64",
            std::env::consts::ARCH
        )
    })?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // The kernel reads ioctl's request as a 32-bit unsigned int, so compare the low 32
    // bits only (Dword): a request with junk in the high bits is the same request.
    let ioctl_rules = || -> Result<Vec<SeccompRule>> {
        [u64::from(libc::TIOCSTI as u32), TIOCLINUX]
            .into_iter()
            .map(|req| {
                let c = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, req)?;
                Ok(SeccompRule::new(vec![c])?)
            })
            .collect()
    };
    rules.insert(libc::SYS_ioctl, ioctl_rules()?);
    for nr in [libc::SYS_add_key, libc::SYS_keyctl, libc::SYS_request_key] {
        rules.insert(nr, vec![]);
    }
    if arch == TargetArch::x86_64 {
        // The x32 ABI reaches the same calls with bit 30 set (where the kernel enables
        // it); ioctl also has its x32 number 514. The i386 ABI (int 0x80) fails the
        // filter's architecture check and kills the process.
        const X32: i64 = 0x4000_0000;
        rules.insert(X32 | libc::SYS_ioctl, ioctl_rules()?);
        rules.insert(X32 | 514, ioctl_rules()?);
        for nr in [libc::SYS_add_key, libc::SYS_keyctl, libc::SYS_request_key] {
            rules.insert(X32 | nr, vec![]);
        }
    }
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    Ok(f.try_into()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_rows_are_read_with_escapes() {
        let t =
            b"36 25 0:32 / /a\\040b\\012c ro,nosuid - tmpfs x rw\n37 25 0:32 / /d rw - x y rw\n";
        let rows = parse_mountinfo(t);
        assert_eq!(rows[0], (36, PathBuf::from("/a b\nc"), true));
        assert_eq!(rows[1], (37, PathBuf::from("/d"), false));
    }

    #[test]
    fn filter_compiles() {
        let f = filter().unwrap();
        assert!(f.len() > 10);
    }
}
