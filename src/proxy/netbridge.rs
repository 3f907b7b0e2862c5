//! The plumbing of allowlist mode, without any file on disk.
//!
//! 1. Before it execs bwrap, claudebox makes a socket pair, starts the proxy (itself, with
//!    the hidden `--internal-proxy`) holding one end, and leaves the other end on
//!    [`SANDBOX_NET_FD`] for bwrap and the sandbox to inherit.
//! 2. Inside the sandbox (its own network namespace) the first program is claudebox again
//!    (`--internal-listen`): it opens 127.0.0.1:[`PROXY_PORT`], sends that listening
//!    socket over the inherited descriptor, closes the descriptor and execs the agent, so
//!    the agent keeps its pid and its exit status is the sandbox's.
//! 3. The proxy accepts connections on a socket that lives in the sandbox's namespace and
//!    connects out from the host's. No socket path exists that another user (or another
//!    sandbox) could connect to, and nothing is left behind to clean up.
//!
//! The proxy dies with bwrap (`PR_SET_PDEATHSIG`), runs in its own session (a Ctrl-C in
//! the terminal does not reach it) and writes to the terminal only with `--log-denied`.

use std::ffi::OsString;
use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};

use anyhow::{bail, Context, Result};
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

use crate::policy::network::{self, Allowlist, HostPattern, ProxySpec, PROXY_PORT, SANDBOX_NET_FD};
pub use crate::policy::network::{
    listen_argv, proxy_env, FORWARD, FORWARD_OPTIONAL, INTERNAL_LISTEN,
};
use crate::proxy;

pub const INTERNAL_PROXY: &str = "--internal-proxy";

/// At most this many loopback forwards (descriptors in one message).
pub const MAX_FORWARDS: usize = 32;

/// Starts the proxy and leaves the sandbox's end of the bridge on [`SANDBOX_NET_FD`],
/// inheritable. Call right before exec'ing bwrap, before any other descriptor meant for
/// the sandbox is opened.
pub fn start_proxy(spec: &ProxySpec) -> Result<()> {
    let (host_end, sandbox_end) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .context("cannot create the socket pair for the network proxy")?;
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0("claudebox")
        .arg(INTERNAL_PROXY)
        .arg("--instance")
        .arg(&spec.instance_id)
        .arg("--fd")
        .arg(host_end.as_raw_fd().to_string())
        .arg("--denied-log")
        .arg(&spec.denied_log);
    if spec.log_stderr {
        cmd.arg("--log-denied");
    }
    for e in &spec.allowlist.entries {
        cmd.arg("--allow").arg(e.pattern.to_string());
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    if !spec.log_stderr {
        cmd.stderr(Stdio::null());
    }
    let fd = host_end.as_raw_fd();
    let parent = nix::unistd::getpid();
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            clear_cloexec(fd)?;
            nix::unistd::setsid()?;
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            // The parent may have died before the death signal was armed.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("claudebox exited"));
            }
            Ok(())
        });
    }
    // The child is not waited for: after the exec it is bwrap's child, and dies with it.
    cmd.spawn().context("cannot start the network proxy")?;
    drop(host_end);
    place_on(sandbox_end, SANDBOX_NET_FD)
}

/// Moves `fd` to number `target` without close-on-exec.
fn place_on(fd: OwnedFd, target: RawFd) -> Result<()> {
    if fd.as_raw_fd() == target {
        clear_cloexec(fd.into_raw_fd())?;
        return Ok(());
    }
    // dup2 leaves the new descriptor without close-on-exec.
    nix::unistd::dup2(fd.as_raw_fd(), target)
        .with_context(|| format!("cannot place the proxy's socket on descriptor {target}"))?;
    Ok(())
}

fn clear_cloexec(fd: RawFd) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
    Ok(())
}

/// Runs a hidden internal role when `args[1]` names one.
pub fn internal(args: &[OsString]) -> Option<ExitCode> {
    let role = args.get(1)?.as_bytes();
    let result = if role == INTERNAL_PROXY.as_bytes() {
        run_proxy(&args[2..])
    } else if role == INTERNAL_LISTEN.as_bytes() {
        listen_and_exec(&args[2..])
    } else {
        return None;
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("claudebox: {e:#}");
            ExitCode::from(1)
        }
    })
}

fn utf8(a: &OsString) -> Result<&str> {
    a.to_str().context("non-UTF-8 internal argument")
}

/// `--internal-proxy --instance ID --fd N --denied-log PATH [--log-denied] [--allow P]...`
fn run_proxy(args: &[OsString]) -> Result<()> {
    let mut fd: Option<RawFd> = None;
    let mut denied_log: Option<PathBuf> = None;
    let mut log_stderr = false;
    let mut allowlist = Allowlist::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match utf8(a)? {
            "--instance" => {
                it.next();
            }
            "--fd" => fd = Some(utf8(it.next().context("--fd needs a value")?)?.parse()?),
            "--denied-log" => {
                denied_log = Some(it.next().context("--denied-log needs a value")?.into())
            }
            "--log-denied" => log_stderr = true,
            "--allow" => {
                let p = utf8(it.next().context("--allow needs a value")?)?;
                allowlist.push(HostPattern::parse(p)?, "launcher");
            }
            other => bail!("internal proxy: unknown argument {other:?}"),
        }
    }
    let fd = fd.context("internal proxy: no --fd")?;
    // Shown by ps/top instead of "exe" (it was started through /proc/self/exe).
    let _ = nix::sys::prctl::set_name(c"claudebox-proxy");
    exit_with_parent();
    // SAFETY: the launcher passed this descriptor to us and nothing else owns it.
    let ctl = unsafe { OwnedFd::from_raw_fd(fd) };
    let denied_log = denied_log.context("internal proxy: no --denied-log")?;
    rotate(&denied_log);
    let config = || proxy::Config {
        allowlist: allowlist.clone(),
        denied_log: denied_log.clone(),
        log_stderr,
    };
    let served = receive_listeners(&ctl).and_then(|listeners| {
        drop(ctl);
        let forwards = network::loopback_forwards(&allowlist)?;
        let shared = std::sync::Arc::new(config());
        let proxy_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, PROXY_PORT));
        let mut main = None;
        for l in listeners {
            let addr = l.local_addr().context("a socket from the sandbox")?;
            if addr == proxy_addr && main.is_none() {
                main = Some(l);
            } else if let Some(f) = forwards.iter().find(|f| f.listen == addr) {
                proxy::serve_forward(l, f.host.clone(), f.port, shared.clone());
            } else {
                bail!("the sandbox sent a socket on {addr}, which is no allowed forward");
            }
        }
        let main = main.context("the sandbox sent no proxy port")?;
        proxy::serve(main, config()).context("network proxy")
    });
    if let Err(e) = &served {
        // Its stderr is usually /dev/null: leave the reason where the user looks.
        note_error(&denied_log, &format!("{e:#}"));
    }
    served
}

/// Keeps the denied log bounded: past the cap it becomes `<name>.old` (replacing the last).
fn rotate(log: &std::path::Path) {
    if std::fs::symlink_metadata(log).is_ok_and(|m| m.is_file() && m.len() > proxy::DENIED_LOG_CAP)
    {
        let mut old = log.as_os_str().to_os_string();
        old.push(".old");
        let _ = std::fs::rename(log, old);
    }
}

fn note_error(log: &std::path::Path, msg: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(log)
    {
        let _ = writeln!(f, "error: claudebox's network proxy stopped: {msg}");
    }
}

/// A second guard besides `PR_SET_PDEATHSIG`: a thread that waits on a pidfd of the parent
/// (bwrap) and ends the process when it exits. Skipped where pidfds are missing (< 5.3).
fn exit_with_parent() {
    use nix::libc;
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
            let r = unsafe { libc::poll(&mut p, 1, -1) };
            if r > 0 {
                std::process::exit(0);
            }
        });
}

/// Waits for the sandbox to send its listening sockets (the proxy port, then one per
/// loopback forward). Only the first message counts.
fn receive_listeners(ctl: &OwnedFd) -> Result<Vec<TcpListener>> {
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FORWARDS + 1]);
    let msg = recvmsg::<()>(
        ctl.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .context("waiting for the sandbox's proxy port")?;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if !fds.is_empty() {
                // SAFETY: the kernel just gave us these descriptors.
                let all = fds.into_iter();
                return Ok(all
                    .map(|fd| unsafe { TcpListener::from_raw_fd(fd) })
                    .collect());
            }
        }
    }
    bail!("the sandbox exited before it opened the proxy port")
}

/// `--internal-listen FD PORT [--forward ADDR | --forward-optional ADDR]... -- CMD
/// [ARGS...]`, inside the sandbox.
fn listen_and_exec(args: &[OsString]) -> Result<()> {
    let usage = || {
        anyhow::anyhow!(
            "usage: {INTERNAL_LISTEN} FD PORT [{FORWARD} ADDR | {FORWARD_OPTIONAL} ADDR]... \
             -- CMD [ARGS...]"
        )
    };
    let [fd, port, rest @ ..] = args else {
        return Err(usage());
    };
    let mut forwards: Vec<(SocketAddr, bool)> = Vec::new();
    let mut rest = rest;
    loop {
        match rest {
            [flag, addr, more @ ..] if flag == FORWARD || flag == FORWARD_OPTIONAL => {
                forwards.push((utf8(addr)?.parse()?, flag == FORWARD_OPTIONAL));
                rest = more;
            }
            [dashes, ..] if dashes == "--" => break,
            _ => return Err(usage()),
        }
    }
    let cmd = &rest[1..];
    if cmd.is_empty() || forwards.len() > MAX_FORWARDS {
        return Err(usage());
    }
    let fd: RawFd = utf8(fd)?.parse()?;
    let port: u16 = utf8(port)?.parse()?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .with_context(|| format!("cannot open the proxy port 127.0.0.1:{port} in the sandbox"))?;
    let mut listeners = vec![listener];
    for (addr, optional) in forwards {
        match TcpListener::bind(addr) {
            Ok(l) => listeners.push(l),
            // `localhost`'s IPv6 half, where the sandbox has no IPv6 loopback.
            Err(_) if optional => {}
            Err(e) => {
                bail!("cannot listen on {addr} in the sandbox for the allowed loopback host: {e}")
            }
        }
    }
    let raw: Vec<RawFd> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
    sendmsg::<()>(
        fd,
        &[IoSlice::new(b"L")],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .with_context(|| {
        format!(
            "the network proxy is not reachable on descriptor {fd}; allowlist mode works \
             only when claudebox itself starts the sandbox"
        )
    })?;
    let _ = nix::unistd::close(fd);
    drop(listeners);
    let err = crate::host::exec::replace_with(cmd);
    bail!(
        "cannot run {}: {err}",
        crate::policy::render::shown(&cmd[0])
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_denied_log_is_rotated_past_one_mebibyte() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("network-denied.log");
        std::fs::write(&log, vec![b'x'; 1000]).unwrap();
        rotate(&log);
        assert!(log.exists(), "a small log is kept");
        std::fs::write(&log, vec![b'x'; (1 << 20) + 1]).unwrap();
        rotate(&log);
        assert!(!log.exists());
        let old = dir.path().join("network-denied.log.old");
        assert_eq!(std::fs::metadata(old).unwrap().len(), (1 << 20) + 1);
    }

    #[test]
    fn the_sandbox_command_is_wrapped_unchanged() {
        let cmd: Vec<OsString> = vec!["claude".into(), "--".into(), "a b".into()];
        let v = listen_argv(OsStr::new("/run/claudebox/claudebox"), &[], &cmd);
        assert_eq!(
            v,
            [
                "/run/claudebox/claudebox",
                "--internal-listen",
                "3",
                "3128",
                "--",
                "claude",
                "--",
                "a b"
            ]
            .map(OsString::from)
        );
    }
}
