//! The plumbing of allowlist mode (and of forwarded host ports, also in none mode), without
//! any file on disk.
//!
//! 1. Before it execs bwrap, claudebox makes a socket pair, starts the proxy (itself, with
//!    the hidden `--internal-proxy`) holding one end, and leaves the other end on
//!    [`SANDBOX_NET_FD`] for bwrap and the sandbox to inherit.
//! 2. Inside the sandbox (its own network namespace) claudebox's one step inside
//!    (`--sandbox-init`, see `inside::listen`), last before the agent, opens
//!    127.0.0.1:[`PROXY_PORT`], sends that listening socket over the inherited descriptor,
//!    closes the descriptor and execs the agent, so the agent keeps its pid and its exit
//!    status is the sandbox's.
//! 3. The proxy accepts connections on a socket that lives in the sandbox's namespace and
//!    connects out from the host's. No socket path exists that another user (or another
//!    sandbox) could connect to, and nothing is left behind to clean up.
//!
//! The proxy dies with bwrap (`PR_SET_PDEATHSIG`), runs in its own session (a Ctrl-C in
//! the terminal does not reach it) and writes to the terminal only with `--log-denied`.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};

use anyhow::{bail, Context, Result};
use nix::sys::socket::{
    recvmsg, socketpair, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType,
};

use crate::policy::network::{self, Allowlist, HostPattern, ProxySpec, PROXY_PORT, SANDBOX_NET_FD};
use crate::proxy;

/// Starts the proxy and leaves the sandbox's end of the bridge on [`SANDBOX_NET_FD`],
/// inheritable; returns that descriptor (a runtime input of the renderer). Call right
/// before exec'ing bwrap, before any other descriptor meant for the sandbox is opened.
pub fn start_proxy(spec: &ProxySpec, outside: &crate::host::companion::Outside) -> Result<RawFd> {
    let (host_end, sandbox_end) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .context("cannot create the socket pair for the network proxy")?;
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0("claudebox")
        .args(crate::policy::render::proxy_argv(
            spec,
            host_end.as_raw_fd(),
        ));
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    // In `/`, with nothing of the environment pointing into the project: the login
    // broker runs the user's apiKeyHelper from here (issue 34).
    outside.apply(&mut cmd);
    if !spec.log_stderr {
        cmd.stderr(Stdio::null());
    }
    let fd = host_end.as_raw_fd();
    let parent = nix::unistd::getpid();
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            clear_cloexec(fd)?;
            crate::host::companion::detach_bound_to(parent)
        });
    }
    // The child is not waited for: after the exec it is bwrap's child, and dies with it.
    cmd.spawn().context("cannot start the network proxy")?;
    drop(host_end);
    place_on(sandbox_end, SANDBOX_NET_FD)?;
    Ok(SANDBOX_NET_FD)
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
    // SAFETY: the callers pass descriptors they hold (and keep: the child inherits them).
    unsafe { crate::host::fd::inherit_raw(fd) }
}

/// The proxy's command line after `--internal-proxy` (rendered by
/// `policy::render::proxy_argv`; hidden: no part of the user's `--help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "claudebox --internal-proxy",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true
)]
pub struct ProxyArgs {
    /// The sandbox's instance id (only so that the process can be found).
    #[arg(long)]
    pub instance: String,
    /// The proxy's end of the bridge to the sandbox.
    #[arg(long)]
    pub fd: RawFd,
    #[arg(long = "denied-log")]
    pub denied_log: PathBuf,
    /// Also report denied hosts on stderr.
    #[arg(long = "log-denied")]
    pub log_denied: bool,
    #[arg(long = "allow", value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// None mode: no HTTP proxy, only the forwarded ports.
    #[arg(long = "forwards-only")]
    pub forwards_only: bool,
    /// Open mode (with the login broker): every host is let through; the proxy's port is
    /// any on the host's loopback.
    #[arg(long)]
    pub open: bool,
    /// A forwarded host port (`localhost:5432`, `127.0.0.1:5432`, `[::1]:5432`).
    #[arg(long = "forward-port", value_name = "HOST:PORT")]
    pub forward_port: Vec<String>,
    /// The login broker, lending the login in this host file (`proxy::broker`).
    #[arg(long = "login-broker", value_name = "CREDENTIALS")]
    pub login_broker: Option<PathBuf>,
    /// The login broker also lends `ANTHROPIC_API_KEY` of this process's environment.
    #[arg(long = "broker-api-key")]
    pub broker_api_key: bool,
    /// The login broker also lends the key of the `apiKeyHelper` in this host
    /// `settings.json` (the user's own), run here on the host.
    #[arg(long = "broker-api-key-helper", value_name = "SETTINGS")]
    pub broker_api_key_helper: Option<PathBuf>,
    /// The login broker lends the `ANTHROPIC_API_KEY` of this host `settings.json`'s
    /// `env` block (the user's own), read here on the host.
    #[arg(long = "broker-settings-api-key", value_name = "SETTINGS")]
    pub broker_settings_api_key: Option<PathBuf>,
}

/// Runs the proxy role: `args` are those after `--internal-proxy`.
pub fn main(args: &[OsString]) -> ExitCode {
    let result = <ProxyArgs as clap::Parser>::try_parse_from(args)
        .map_err(|e| anyhow::anyhow!("internal proxy: {}", crate::cli::one_line(&e)))
        .and_then(run_proxy);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("claudebox: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run_proxy(args: ProxyArgs) -> Result<()> {
    // Before anything is read: a core file of this process would hold the login it lends.
    // (A proxy that lends nothing stays dumpable: the tests count its descriptors.)
    if args.login_broker.is_some()
        || args.broker_api_key
        || args.broker_api_key_helper.is_some()
        || args.broker_settings_api_key.is_some()
    {
        crate::host::companion::keep_out_of_dumps()
            .context("cannot keep the login broker out of core dumps")?;
    }
    let mut allowlist = Allowlist::default();
    for p in &args.allow {
        allowlist.push(HostPattern::parse(p)?, "launcher");
    }
    let mut forward_ports = Vec::new();
    for p in &args.forward_port {
        forward_ports.push(network::HostEntry {
            pattern: crate::policy::forward::parse(p)?,
            source: "launcher".into(),
        });
    }
    let http_proxy = !args.forwards_only;
    let log_stderr = args.log_denied;
    let fd = args.fd;
    // Shown by ps/top instead of "exe" (it was started through /proc/self/exe).
    let _ = nix::sys::prctl::set_name(c"claudebox-proxy");
    crate::host::companion::exit_with_parent();
    // SAFETY: the launcher passed this descriptor to us and nothing else owns it.
    let ctl = unsafe { OwnedFd::from_raw_fd(fd) };
    let denied_log = args.denied_log;
    rotate(&denied_log);
    let api_key = if let Some(settings) = &args.broker_settings_api_key {
        Some(settings_api_key(settings).with_context(|| {
            format!(
                "the login broker: no ANTHROPIC_API_KEY in the env block of {}",
                crate::policy::escape::Shown::shown(settings.as_path())
            )
        })?)
    } else if args.broker_api_key {
        let key = std::env::var(network::API_KEY_ENV)
            .ok()
            .filter(|k| !k.is_empty())
            .context("the login broker: no ANTHROPIC_API_KEY to lend")?;
        // Kept in the broker only; no child of this process gets it.
        std::env::remove_var(network::API_KEY_ENV);
        Some(key)
    } else {
        None
    };
    // A broker that cannot start (a helper that fails) is told to the sandbox's step
    // inside, which ends the launch with that line: nothing starts without its login.
    let broker =
        if args.login_broker.is_some() || api_key.is_some() || args.broker_api_key_helper.is_some()
        {
            Some(
                proxy::broker::Broker::new(
                    args.login_broker,
                    api_key,
                    args.broker_api_key_helper.as_deref(),
                )
                .map(std::sync::Arc::new),
            )
        } else {
            None
        };
    let (broker, mut broken) = match broker {
        Some(Ok(b)) => (Some(b), None),
        Some(Err(e)) => (None, Some(format!("{e:#}"))),
        None => (None, None),
    };
    // Open mode: what the proxy lets through goes the user's own way out.
    let upstream = if args.open {
        match proxy::upstream::UpstreamProxy::from_env() {
            Ok(u) => u.map(std::sync::Arc::new),
            Err(e) => {
                broken.get_or_insert(format!("{e:#}"));
                None
            }
        }
    } else {
        None
    };
    // Open mode: the port is on the shared loopback; only requests with this secret
    // (which the step inside puts in HTTPS_PROXY) are served.
    let open_to_all = crate::host::test_switch::get(proxy::OPEN_TO_ALL_ENV).is_some();
    let open_secret = if args.open {
        Some(proxy::broker::random_hex(16)?)
    } else {
        None
    };
    let config = || proxy::Config {
        allowlist: allowlist.clone(),
        denied_log: denied_log.clone(),
        log_stderr,
        open: args.open,
        broker: broker.clone(),
        upstream: upstream.clone(),
        authorization: open_secret
            .as_deref()
            .filter(|_| !open_to_all)
            .map(network::open_proxy_authorization),
    };
    let served = receive_listeners(&ctl).and_then(|listeners| {
        if let Some(why) = &broken {
            send_message(&ctl, &serde_json::json!({ "error": why }))?;
            bail!("the login broker: {why}");
        }
        if let Some(b) = &broker {
            send_stand_in(&ctl, b, open_secret.as_deref())?;
        }
        drop(ctl);
        // The same list the plan made: the addresses and their fixed host targets.
        let forwards =
            crate::policy::forward::all(http_proxy.then_some(&allowlist), &forward_ports)?;
        let proxy_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, PROXY_PORT));
        let mut main = None;
        let mut serving = Vec::new();
        for l in listeners {
            let addr = l.local_addr().context("a socket from the sandbox")?;
            let is_proxy_port = if args.open {
                addr.ip() == std::net::IpAddr::from(Ipv4Addr::LOCALHOST)
            } else {
                addr == proxy_addr
            };
            if http_proxy && is_proxy_port && main.is_none() {
                main = Some(l);
            } else if let Some(f) = forwards.iter().find(|f| f.listen == addr) {
                serving.push((l, f.clone()));
            } else {
                bail!("the sandbox sent a socket on {addr}, which is no allowed forward");
            }
        }
        for (l, f) in serving {
            proxy::serve_forward(l, f);
        }
        if !http_proxy {
            // None mode: the forwards' threads are the whole work, for the sandbox's life.
            loop {
                std::thread::park();
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

/// Sends the sandbox's step inside what it writes for claude: the broker's certificate
/// authority and the stand-in login, as one JSON object, then the end of the stream.
/// In open mode also the secret the proxy's URL carries.
fn send_stand_in(ctl: &OwnedFd, b: &proxy::broker::Broker, secret: Option<&str>) -> Result<()> {
    let mut msg = serde_json::json!({ "ca": b.ca_pem });
    if let Some(s) = secret {
        msg["proxy_secret"] = s.into();
    }
    if b.lends_login() {
        msg["credentials"] = b.stand_in_credentials()?.into();
    }
    if let Some(k) = b.stand_in_api_key() {
        msg["api_key"] = k.into();
    }
    if let Some(k) = b.stand_in_helper_key() {
        msg["api_key_helper"] = k.into();
    }
    send_message(ctl, &msg)
}

/// One JSON object to the sandbox's step inside, then the end of the stream.
fn send_message(ctl: &OwnedFd, msg: &serde_json::Value) -> Result<()> {
    let msg = msg.to_string();
    let mut f = std::fs::File::from(ctl.try_clone()?);
    std::io::Write::write_all(&mut f, msg.as_bytes())
        .context("cannot hand the stand-in login to the sandbox")?;
    Ok(())
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

/// Waits for the sandbox to send its listening sockets (the proxy port, then one per
/// loopback forward). Only the first message counts.
fn receive_listeners(ctl: &OwnedFd) -> Result<Vec<TcpListener>> {
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; network::MAX_FORWARDS + 1]);
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
                let all = fds.into_iter();
                return Ok(all
                    // SAFETY: the kernel just gave us these descriptors; each is owned once.
                    .map(|fd| unsafe { TcpListener::from_raw_fd(fd) })
                    .collect());
            }
        }
    }
    bail!("the sandbox exited before it opened the proxy port")
}

/// The `ANTHROPIC_API_KEY` a `settings.json`'s `env` block sets (the user's own file, on
/// the host; the sandbox's copy has it removed).
fn settings_api_key(settings: &std::path::Path) -> Result<String> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(settings)?)?;
    v["env"][network::SETTINGS_KEY_ENV]
        .as_str()
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .context("not set")
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
