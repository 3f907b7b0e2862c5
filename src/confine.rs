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
    let mut default_signals = false;
    let mut rest = args;
    loop {
        match rest.first().and_then(|a| a.to_str()) {
            Some(SCOPE_FLAG) => scope = true,
            Some(SIGNALS_FLAG) => default_signals = true,
            Some("--") => {
                rest = &rest[1..];
                break;
            }
            _ => bail!(
                "usage: claudebox {INIT_FLAG} [{SCOPE_FLAG}] [{SIGNALS_FLAG}] -- CMD [ARGS...]"
            ),
        }
        rest = &rest[1..];
    }
    let Some(cmd) = rest.first() else {
        bail!("no command to run");
    };
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
    fn filter_compiles() {
        let f = filter().unwrap();
        assert!(f.len() > 10);
    }
}
