//! The sandbox's one step inside: `claudebox --sandbox-init [--scope-abstract-unix]
//! [--default-signals] [--expect-ro|--expect-rw PATH]... [--proxy-fd FD [--proxy-port PORT]
//! [--forward ADDR|--forward-optional ADDR]...] -- CMD [ARGS...]` (parsed by [`Args`],
//! rendered only by `policy::render`) applies what bwrap cannot express, then execs CMD in
//! its place:
//!
//! - a seccomp filter that makes `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)` fail with EPERM
//!   (typing into the user's terminal) while every other ioctl (TIOCGWINSZ for resizing)
//!   passes, and that denies the kernel keyring calls (`add_key`, `keyctl`,
//!   `request_key`), through which the host session's keys stay readable in a sandbox; the
//!   rules are one table, [`SECCOMP`], from which `--dry-run` prints them too;
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
//! - in allowlist mode or with forwarded host ports, last, the proxy's listeners (see
//!   `inside::listen`).
//! - with `--guard-git-dir DIR` (the project's main git dir), the file supervisor (see
//!   `inside::notify`): this process forks, the parent makes every call of the command
//!   that can make a name appear and refuses a `commondir` in DIR; the child goes on.
//!
//! It runs as a step of the printed command line, so `--dry-run` shows it and pasting that
//! line applies it too. Any failure ends the launch: nothing runs unconfined.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
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

use crate::policy::error::Fixable;

/// The signals a terminal sends to its foreground process group from the keyboard, which
/// the launcher ignores and the first step inside gives back to the agent.
pub const TERMINAL_SIGNALS: [Signal; 2] = [Signal::SIGINT, Signal::SIGQUIT];

/// The step's command line, after `--sandbox-init` (rendered by `policy::render` from the
/// plan; hidden: it is no part of the user's `--help`).
#[derive(clap::Parser, Debug, PartialEq, Eq)]
#[command(
    name = "claudebox --sandbox-init",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true,
    group(clap::ArgGroup::new("listeners").multiple(true).args(["proxy_port", "forward", "forward_optional"]))
)]
pub struct Args {
    /// The caller's stderr, put back on 2 once the sandbox is up (the launcher reads
    /// bwrap's stderr until then).
    #[arg(long = "stderr-fd", value_name = "FD")]
    pub stderr_fd: Option<i32>,
    /// Landlock: no connect() to abstract unix sockets made outside the sandbox.
    #[arg(long = "scope-abstract-unix")]
    pub scope_abstract_unix: bool,
    /// SIGINT and SIGQUIT back to their default action.
    #[arg(long = "default-signals")]
    pub default_signals: bool,
    /// A git dir where the file supervisor refuses a `commondir` (`inside::notify`).
    #[arg(long = "guard-git-dir", value_name = "DIR")]
    pub guard_git_dir: Vec<PathBuf>,
    /// A work tree's top where the file supervisor refuses a `HEAD` (`inside::notify`).
    #[arg(long = "guard-work-tree", value_name = "DIR")]
    pub guard_work_tree: Vec<PathBuf>,
    /// A read-only mount that must be at exactly this path.
    #[arg(long = "expect-ro", value_name = "PATH")]
    pub expect_ro: Vec<PathBuf>,
    /// A read-write mount that must be at exactly this path.
    #[arg(long = "expect-rw", value_name = "PATH")]
    pub expect_rw: Vec<PathBuf>,
    /// The descriptor to the proxy on the host (allowlist mode, or forwarded ports).
    #[arg(long = "proxy-fd", value_name = "FD", requires = "listeners")]
    pub proxy_fd: Option<i32>,
    /// Allowlist mode: the proxy's port on the sandbox's loopback.
    #[arg(long = "proxy-port", value_name = "PORT", requires = "proxy_fd")]
    pub proxy_port: Option<u16>,
    /// A loopback address to listen on for an allowed loopback host.
    #[arg(long = "forward", value_name = "ADDR", requires = "proxy_fd")]
    pub forward: Vec<std::net::SocketAddr>,
    /// The same, skipped where the sandbox has no such address (`localhost`'s IPv6 half).
    #[arg(long = "forward-optional", value_name = "ADDR", requires = "proxy_fd")]
    pub forward_optional: Vec<std::net::SocketAddr>,
    /// The login broker: write the stand-in login and the broker's certificate authority
    /// the proxy sends back into this directory (a tmpfs of this sandbox).
    #[arg(long = "broker-dir", value_name = "DIR", requires = "proxy_port")]
    pub broker_dir: Option<PathBuf>,
    /// The command, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Entry point for `claudebox --sandbox-init ...` (args after the flag).
pub fn main(args: &[OsString]) -> ExitCode {
    let parsed = <Args as clap::Parser>::try_parse_from(args)
        .map_err(|e| anyhow::anyhow!("{}", crate::cli::one_line(&e)))
        .and_then(run);
    match parsed {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("claudebox: sandbox init: {e:#}");
            ExitCode::from(126)
        }
    }
}

/// In order: the mount checks, Landlock, seccomp, the proxy's listeners, the file
/// supervisor (a fork), the signals; then the command in this process's place.
fn run(args: Args) -> Result<std::convert::Infallible> {
    // First: bwrap's setup is done (every mount in place) when this step runs at all.
    if let Some(fd) = args.stderr_fd {
        hand_back_stderr(fd)?;
    }
    let checks: Vec<(PathBuf, bool)> = (args.expect_ro.iter().map(|p| (p.clone(), true)))
        .chain(args.expect_rw.iter().map(|p| (p.clone(), false)))
        .collect();
    let cmd = &args.command;
    if !checks.is_empty() {
        check_mounts(&checks)?;
    }
    if args.scope_abstract_unix {
        scope_abstract_unix()?;
    }
    let filter = filter()?;
    seccompiler::apply_filter(&filter).context("cannot install the seccomp filter")?;
    if let Some(fd) = args.proxy_fd {
        let forwards: Vec<(std::net::SocketAddr, bool)> =
            (args.forward.iter().map(|a| (*a, false)))
                .chain(args.forward_optional.iter().map(|a| (*a, true)))
                .collect();
        crate::inside::listen::hand_to_proxy(
            fd,
            args.proxy_port,
            &forwards,
            args.broker_dir.as_deref(),
        )?;
    }
    // Last before the command: this process forks; the parent becomes the file
    // supervisor, this one goes on under the notifying filter.
    crate::inside::notify::start(&args.guard_git_dir, &args.guard_work_tree)?;
    if args.default_signals {
        for sig in TERMINAL_SIGNALS {
            // SAFETY: SIG_DFL installs no handler.
            unsafe { signal(sig, SigHandler::SigDfl) }
                .with_context(|| format!("cannot restore the default action of {sig}"))?;
        }
    }
    let err = crate::host::exec::replace_with(cmd);
    Err(err).with_context(|| format!("cannot run {}", crate::policy::escape::shown(&cmd[0])))
}

/// Tells the launcher the sandbox is up ([`UP_MARKER`] on bwrap's stderr, its pipe), then
/// puts the caller's stderr (`fd`) back on 2 for this step and the agent (a terminal stays
/// a terminal) and closes `fd`.
fn hand_back_stderr(fd: i32) -> Result<()> {
    // SAFETY: plain system calls on descriptor numbers; the results are checked.
    let n = unsafe { libc::write(2, UP_MARKER.as_ptr().cast(), UP_MARKER.len()) };
    if n != UP_MARKER.len() as isize {
        bail!("cannot tell the launcher the sandbox is up");
    }
    // SAFETY: as above.
    if unsafe { libc::dup2(fd, 2) } < 0 || unsafe { libc::close(fd) } != 0 {
        bail!(
            "cannot restore stderr from descriptor {fd}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
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
            if crate::host::sources::same_or_replaced(reached, path) && point == path && ro == read_only);
        if !ok {
            bail!(Fixable::new(
                format!(
                    "{} is not the {} mount claudebox placed there (a directory on its way \
                     may have been swapped for a symlink while the sandbox started, by \
                     another sandbox of this project)",
                    show(path),
                    if *read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                ),
                "refusing to start: look at that path",
            )
            .at(path));
        }
    }
    Ok(())
}

fn show(p: &Path) -> String {
    crate::policy::escape::shown(p)
}

/// The id of the mount `path` is on (its last component not followed), and the path the
/// kernel reached.
fn mount_at(path: &Path) -> std::io::Result<(u64, PathBuf)> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)?;
    let fd = f.as_raw_fd();
    let reached = crate::host::sources::reached(fd)?;
    // statx names the mount (Linux 5.8); before that (or without statx), the descriptor's
    // fdinfo does. One system call instead of three for each of the ~20 checks of a launch.
    let mask = rustix::fs::StatxFlags::MNT_ID;
    match rustix::fs::statx(&f, "", rustix::fs::AtFlags::EMPTY_PATH, mask) {
        Ok(st) if st.stx_mask & mask.bits() != 0 => Ok((st.stx_mnt_id, reached)),
        _ => Ok((fdinfo_mount_id(fd)?, reached)),
    }
}

/// The id of the mount the descriptor `fd` is on, from `/proc/self/fdinfo` (the same
/// numbers as mountinfo's first column, and as statx's `STATX_MNT_ID`).
fn fdinfo_mount_id(fd: i32) -> std::io::Result<u64> {
    let info = fs::read(format!("/proc/self/fdinfo/{fd}"))?;
    info.split(|b| *b == b'\n')
        .find_map(|l| l.strip_prefix(b"mnt_id:"))
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
        .ok_or_else(|| std::io::Error::other("no mnt_id"))
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

use crate::policy::confinement::{Rule, MATCH_ERRNO, SECCOMP, UP_MARKER};

/// The seccomp filter, compiled from [`SECCOMP`] for the running architecture.
pub fn filter() -> Result<BpfProgram> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|_| {
        anyhow::Error::new(Fixable::new(
            format!(
                "no seccomp filter for the {} architecture",
                std::env::consts::ARCH
            ),
            "claudebox supports x86_64, aarch64 and riscv64",
        ))
    })?;
    // seccompiler's filter is a map from syscall number to rules (any rule matching is a
    // match; an empty list matches every call of that number).
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut whole = std::collections::BTreeSet::new();
    let mut add = |nr: i64, row: &Rule| -> Result<()> {
        let entry = rules.entry(nr).or_default();
        if whole.contains(&nr) || (row.arg.is_none() && !entry.is_empty()) {
            bail!("seccomp table: {} both whole and by argument", row.syscall);
        }
        if let Some(a) = &row.arg {
            let c = SeccompCondition::new(
                a.index,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                u64::from(a.value),
            )?;
            entry.push(SeccompRule::new(vec![c])?);
        } else {
            whole.insert(nr);
        }
        Ok(())
    };
    for row in SECCOMP {
        add(row.nr, row)?;
        if arch == TargetArch::x86_64 {
            // The x32 ABI reaches the same calls with bit 30 set (where the kernel enables
            // it); ioctl also has its x32 number 514. The i386 ABI (int 0x80) fails the
            // filter's architecture check and kills the process.
            const X32: i64 = 0x4000_0000;
            add(X32 | row.nr, row)?;
            if row.nr == libc::SYS_ioctl {
                add(X32 | 514, row)?;
            }
        }
    }
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(MATCH_ERRNO.0 as u32),
        arch,
    )?;
    Ok(f.try_into()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::confinement::{seccomp_lines, INIT_FLAG};

    /// The step's argv as the one renderer makes it from an allowlist plan, parsed back by
    /// the step's clap parser: every planned check, scope, signal and listener arrives.
    #[test]
    fn the_rendered_step_parses_back_into_the_plan() {
        use crate::policy::network::{Allowlist, HostPattern, NetworkMode};
        use crate::policy::render::{self, Runtime};
        let mut list = Allowlist::default();
        list.push(HostPattern::parse("api.anthropic.com").unwrap(), "test");
        list.push(HostPattern::parse("localhost:8080").unwrap(), "test");
        let mut inp = crate::policy::plan::tests::test_inputs();
        inp.settings.network = NetworkMode::Allowlist(list);
        inp.command = crate::policy::plan::Command::Exec(vec!["sh".into(), "--x".into()]);
        let plan = crate::policy::plan::build(&inp);
        let c = plan.confine.as_ref().unwrap();
        for (rt, signals) in [
            (Runtime::DRY_RUN, true),
            (
                Runtime {
                    proxy_fd: 7,
                    signals_ignored_on_entry: true,
                    stderr_fd: Some(9),
                    ..Runtime::DRY_RUN
                },
                false,
            ),
        ] {
            let argv = render::argv_with(&plan, &rt);
            let at = argv.iter().position(|a| a == INIT_FLAG).unwrap();
            let parsed = <Args as clap::Parser>::try_parse_from(&argv[at + 1..]).unwrap();
            assert_eq!(parsed.command, ["sh", "--x"].map(OsString::from));
            assert_eq!(parsed.scope_abstract_unix, c.scope_abstract_unix);
            assert_eq!(parsed.default_signals, signals);
            assert_eq!(parsed.stderr_fd, rt.stderr_fd);
            let ro: Vec<PathBuf> = (c.mount_checks.iter().filter(|m| m.read_only))
                .map(|m| m.path.clone())
                .collect();
            let rw: Vec<PathBuf> = (c.mount_checks.iter().filter(|m| !m.read_only))
                .map(|m| m.path.clone())
                .collect();
            assert!(!ro.is_empty() && !rw.is_empty());
            assert_eq!((parsed.expect_ro, parsed.expect_rw), (ro, rw));
            assert_eq!(parsed.proxy_fd, Some(rt.proxy_fd));
            assert_eq!(parsed.proxy_port, Some(crate::policy::network::PROXY_PORT));
            assert_eq!(parsed.forward, ["127.0.0.1:8080".parse().unwrap()]);
            assert_eq!(parsed.forward_optional, ["[::1]:8080".parse().unwrap()]);
        }
        // None mode with a forwarded port: its listeners and no proxy port.
        inp.settings.network = NetworkMode::None;
        inp.settings.forward_ports = vec![crate::policy::network::HostEntry {
            pattern: crate::policy::forward::parse("[::1]:5432").unwrap(),
            source: "test".into(),
        }];
        let argv = render::argv(&crate::policy::plan::build(&inp));
        let at = argv.iter().position(|a| a == INIT_FLAG).unwrap();
        let parsed = <Args as clap::Parser>::try_parse_from(&argv[at + 1..]).unwrap();
        assert_eq!(
            parsed.proxy_fd,
            Some(crate::policy::network::SANDBOX_NET_FD)
        );
        assert_eq!(parsed.proxy_port, None);
        assert_eq!(parsed.forward, ["[::1]:5432".parse().unwrap()]);
        assert!(parsed.forward_optional.is_empty());
        // Open mode: no listeners (a forwarded port is the host's there anyway).
        inp.settings.network = NetworkMode::Open;
        let argv = render::argv(&crate::policy::plan::build(&inp));
        let at = argv.iter().position(|a| a == INIT_FLAG).unwrap();
        let parsed = <Args as clap::Parser>::try_parse_from(&argv[at + 1..]).unwrap();
        assert_eq!((parsed.proxy_fd, parsed.proxy_port), (None, None));
        // Control: the parser refuses what the renderer never makes.
        for bad in [
            &["--proxy-fd", "3", "--", "sh"][..],
            &["--forward", "127.0.0.1:1", "--", "sh"],
            &["--expect-ro"],
            &["--bogus", "--", "sh"],
            &["sh"],
        ] {
            assert!(
                <Args as clap::Parser>::try_parse_from(bad).is_err(),
                "{bad:?}"
            );
        }
    }

    /// statx's mount id is the one mountinfo names (the check compares them): the same as
    /// fdinfo's, on mounts of several kinds, and mountinfo's row for it is that mount point.
    #[test]
    fn a_mount_id_from_statx_is_the_one_mountinfo_and_fdinfo_name() {
        let table = parse_mountinfo(&fs::read("/proc/self/mountinfo").unwrap());
        for p in ["/", "/proc", "/dev", "/tmp"] {
            let (id, reached) = mount_at(Path::new(p)).unwrap();
            let f = fs::File::open(p).unwrap();
            assert_eq!(id, fdinfo_mount_id(f.as_raw_fd()).unwrap(), "{p}");
            assert_eq!(reached, PathBuf::from(p));
            assert!(
                table.iter().any(|(i, _, _)| *i == id),
                "{p}: id {id} in mountinfo"
            );
        }
        let (id, _) = mount_at(Path::new("/proc/self")).unwrap();
        let (proc_id, _) = mount_at(Path::new("/proc")).unwrap();
        let (root_id, _) = mount_at(Path::new("/")).unwrap();
        assert_eq!(id, proc_id, "/proc/self is on /proc's mount (not followed)");
        assert_ne!(proc_id, root_id);
        let point = |id: u64| table.iter().find(|(i, _, _)| *i == id).unwrap().1.clone();
        assert_eq!(point(proc_id), PathBuf::from("/proc"));
    }

    #[test]
    fn the_rendered_proxy_argv_parses_back() {
        use crate::policy::network::{Allowlist, HostPattern, ProxySpec};
        use crate::proxy::netbridge::ProxyArgs;
        let mut allowlist = Allowlist::default();
        allowlist.push(HostPattern::parse("*.example.com").unwrap(), "test");
        allowlist.push(HostPattern::parse("localhost:8080").unwrap(), "test");
        let spec = ProxySpec {
            allowlist,
            forward_ports: vec![crate::policy::network::HostEntry {
                pattern: crate::policy::forward::parse("5432").unwrap(),
                source: "test".into(),
            }],
            http_proxy: false,
            open: true,
            denied_log: PathBuf::from(OsString::from_vec(b"/s/a b\xff/denied.log".to_vec())),
            log_stderr: true,
            instance_id: "i-1".into(),
            broker: Some(crate::policy::network::BrokerSpec {
                credentials: Some(PathBuf::from(OsString::from_vec(
                    b"/h/.claude/a b\xff/.credentials.json".to_vec(),
                ))),
                api_key: true,
                api_key_helper: Some(PathBuf::from("/h/.claude/settings.json")),
                settings_api_key: None,
            }),
        };
        let argv = crate::policy::render::proxy_argv(&spec, 9);
        assert_eq!(argv[0], crate::policy::network::INTERNAL_PROXY);
        let p = <ProxyArgs as clap::Parser>::try_parse_from(&argv[1..]).unwrap();
        assert_eq!(
            (p.instance.as_str(), p.fd, &p.denied_log, p.log_denied),
            ("i-1", 9, &spec.denied_log, true)
        );
        assert_eq!(p.allow, ["*.example.com", "localhost:8080"]);
        assert_eq!(p.forward_port, ["localhost:5432"]);
        assert!(p.forwards_only);
        assert!(p.open);
        let b = spec.broker.as_ref().unwrap();
        assert_eq!(p.login_broker, b.credentials);
        assert!(p.broker_api_key);
        assert_eq!(p.broker_api_key_helper, b.api_key_helper);
    }

    #[test]
    fn mountinfo_rows_are_read_with_escapes() {
        let t =
            b"36 25 0:32 / /a\\040b\\012c ro,nosuid - tmpfs x rw\n37 25 0:32 / /d rw - x y rw\n";
        let rows = parse_mountinfo(t);
        assert_eq!(rows[0], (36, PathBuf::from("/a b\nc"), true));
        assert_eq!(rows[1], (37, PathBuf::from("/d"), false));
    }

    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};

    /// How a child that made one call ended.
    #[derive(Debug, PartialEq)]
    enum Ended {
        /// The call returned; its errno, 0 if it succeeded.
        Errno(i32),
        Signal(Signal),
    }

    /// Makes `call` in a forked child, under the compiled filter if `filtered` (the real
    /// kernel filter, applied the way `--sandbox-init` applies it).
    fn in_child(filtered: bool, call: impl FnOnce() -> i64) -> Ended {
        let prog = filter().unwrap();
        // SAFETY: the child only makes system calls and leaves with _exit.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                if filtered && seccompiler::apply_filter(&prog).is_err() {
                    // SAFETY: _exit ends the forked child without running the parent's
                    // atexit handlers or destructors.
                    unsafe { libc::_exit(200) }
                }
                let r = call();
                let errno = if r == -1 {
                    std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(201)
                } else {
                    0
                };
                // SAFETY: as above.
                unsafe { libc::_exit(errno) }
            }
            ForkResult::Parent { child } => match waitpid(child, None).unwrap() {
                WaitStatus::Exited(_, 200) => panic!("cannot apply the filter"),
                WaitStatus::Exited(_, code) => Ended::Errno(code),
                WaitStatus::Signaled(_, sig, _) => Ended::Signal(sig),
                other => panic!("{other:?}"),
            },
        }
    }

    /// The row's syscall with its matched argument and harmless others: the first is -1
    /// (a bad descriptor, a bad pointer, a bad keyctl operation), so that unfiltered the
    /// call fails with an errno of its own and changes nothing.
    fn probe(row: &Rule, value: Option<u64>) -> impl FnOnce() -> i64 {
        let mut args = [u64::MAX, 0, 0, 0, 0, 0];
        if let (Some(a), Some(v)) = (&row.arg, value) {
            args[a.index as usize] = v;
        }
        let nr = row.nr;
        // SAFETY: the arguments are numbers or an invalid pointer (-1): the kernel checks
        // them, nothing in this process is read or written through them.
        move || unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) }
    }

    #[test]
    fn every_row_fails_with_its_errno_and_only_under_the_filter() {
        let eperm = Ended::Errno(MATCH_ERRNO.0);
        for row in SECCOMP {
            let value = row.arg.as_ref().map(|a| u64::from(a.value));
            let shown = row.shown();
            assert_eq!(in_child(true, probe(row, value)), eperm, "{shown}");
            // Control: the same call unfiltered reaches the kernel and fails otherwise
            // (EBADF, EFAULT, EOPNOTSUPP), so the EPERM above is the filter's.
            let free = in_child(false, probe(row, value));
            assert!(
                matches!(free, Ended::Errno(e) if e != MATCH_ERRNO.0),
                "{shown}: {free:?}"
            );
            if let Some(a) = &row.arg {
                // The kernel reads the low 32 bits: junk above them is the same request.
                let junk = 0xdead_beef_0000_0000 | u64::from(a.value);
                assert_eq!(
                    in_child(true, probe(row, Some(junk))),
                    eperm,
                    "{shown} + junk"
                );
            }
        }
    }

    #[test]
    fn calls_outside_the_table_pass() {
        let ioctl = SECCOMP.iter().find(|r| r.syscall == "ioctl").unwrap();
        // TIOCGWINSZ (resizing) is not a row: it reaches the kernel (bad descriptor).
        let winsz = Some(u64::from(libc::TIOCGWINSZ as u32));
        assert_eq!(
            in_child(true, probe(ioctl, winsz)),
            Ended::Errno(libc::EBADF)
        );
        // Neither is the neighbour of a matched request.
        let next = Some(u64::from(libc::TIOCSTI as u32 + 1));
        assert_eq!(
            in_child(true, probe(ioctl, next)),
            Ended::Errno(libc::EBADF)
        );
        // SAFETY: getpid takes no arguments.
        let pid = || unsafe { libc::syscall(libc::SYS_getpid) };
        assert_eq!(in_child(true, pid), Ended::Errno(0));
    }

    /// The architecture check: an i386 call (`int 0x80`, getpid is 20 there) kills.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_call_through_the_i386_abi_is_killed() {
        let int80 = || -> i64 {
            let mut rax: i64 = 20;
            // SAFETY: i386 getpid takes no arguments and touches no memory.
            unsafe { std::arch::asm!("int 0x80", inout("rax") rax) };
            rax.max(0)
        };
        assert_eq!(in_child(true, int80), Ended::Signal(Signal::SIGSYS));
        // Control: unfiltered, the same instruction is no SIGSYS (a pid where the kernel
        // has IA32 emulation, SIGSEGV where it does not).
        assert_ne!(in_child(false, int80), Ended::Signal(Signal::SIGSYS));
    }

    #[test]
    fn every_row_has_its_dry_run_line() {
        let lines = seccomp_lines();
        assert_eq!(lines.len(), SECCOMP.len() + 1);
        for (row, line) in SECCOMP.iter().zip(&lines) {
            assert!(
                line.starts_with(&format!("seccomp\t{} ", row.syscall)),
                "{line}"
            );
            assert!(
                line.ends_with(&format!("-> EPERM: {}", row.reason)),
                "{line}"
            );
            if let Some(a) = &row.arg {
                assert!(line.contains(a.name), "{line}");
            }
        }
        assert!(lines.last().unwrap().contains("-> kill the process"));
    }
}
