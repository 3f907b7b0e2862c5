//! The inside half of the bridge to the proxy (the host half is `proxy::netbridge`): in the
//! sandbox's own network namespace, open 127.0.0.1:PORT (allowlist mode) and one listener
//! per loopback forward (the allowlist's, the forwarded host ports), send them to the proxy
//! over the inherited descriptor, close it. The step then
//! execs the agent, so the agent keeps its pid, holds no socket to the proxy, and its exit
//! status is the sandbox's.

use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use anyhow::{bail, Context, Result};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use crate::policy::error::Fixable;
use crate::policy::network::{BROKER_CA_FILE, BROKER_HELPER_KEY_FILE, MAX_FORWARDS};

/// Opens the proxy port (allowlist mode; `None` in none mode, where only forwarded ports
/// are served) and the forwards (`(address, optional)`), sends them over `fd` and closes
/// it.
pub fn hand_to_proxy(
    fd: RawFd,
    port: Option<u16>,
    forwards: &[(SocketAddr, bool)],
    broker_dir: Option<&Path>,
) -> Result<()> {
    if forwards.len() > MAX_FORWARDS {
        bail!("at most {MAX_FORWARDS} loopback forwards");
    }
    if port.is_none() && forwards.is_empty() {
        bail!("nothing to hand to the proxy");
    }
    let mut listeners = Vec::new();
    let mut open_port = None;
    if let Some(port) = port {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).with_context(|| {
            format!("cannot open the proxy port 127.0.0.1:{port} in the sandbox")
        })?;
        if port == 0 {
            // Open mode (the login broker): a free port on the host's loopback, which the
            // sandbox shares; the agent finds the proxy through HTTPS_PROXY, set below
            // with the proxy's secret once the proxy has sent it.
            open_port = Some(l.local_addr().context("the proxy port")?.port());
        }
        listeners.push(l);
    }
    for (addr, optional) in forwards {
        match TcpListener::bind(addr) {
            Ok(l) => listeners.push(l),
            // `localhost`'s IPv6 half, where the sandbox has no IPv6 loopback.
            Err(_) if *optional => {}
            Err(e) => {
                bail!("cannot listen on {addr} in the sandbox for a loopback forward: {e}")
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
        Fixable::new(
            format!("the network proxy is not reachable on descriptor {fd}"),
            "allowlist mode works only when claudebox itself starts the sandbox",
        )
    })?;
    let secret = match broker_dir {
        Some(dir) => receive_stand_in(fd, dir)?,
        None => None,
    };
    if let Some(got) = open_port {
        // Fail closed: a proxy on the shared loopback that anyone can use is not started.
        let secret =
            secret.context("the proxy sent no secret for its port on the shared loopback")?;
        for (k, v) in crate::policy::network::open_proxy_env(got, &secret) {
            std::env::set_var(k, v);
        }
    }
    let _ = nix::unistd::close(fd);
    drop(listeners);
    Ok(())
}

/// The login broker's answer (`proxy::netbridge::send_stand_in`): the stand-in login and
/// the certificate authority claude is to trust, written into `dir` (this sandbox's own
/// tmpfs, claude's secure-storage dir). Returns the open-mode proxy's secret, when sent.
fn receive_stand_in(fd: RawFd, dir: &Path) -> Result<Option<String>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut text = Vec::new();
    // SAFETY: the descriptor is ours (inherited for this step); `ManuallyDrop` leaves its
    // closing to the caller.
    let f = std::mem::ManuallyDrop::new(unsafe {
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
    });
    (&*f)
        .take(1 << 20)
        .read_to_end(&mut text)
        .context("cannot read the stand-in login from the login broker")?;
    let v: serde_json::Value =
        serde_json::from_slice(&text).context("the login broker sent no stand-in login")?;
    if let Some(why) = v["error"].as_str() {
        // Fail closed: nothing starts without the login it was to have.
        bail!(
            "the login broker cannot lend the login: {}",
            crate::policy::escape::shown(why)
        );
    }
    let ca = v["ca"]
        .as_str()
        .context("the login broker's answer is incomplete")?;
    let login = v["credentials"].as_str();
    if let Some(key) = v["api_key"].as_str() {
        // The stand-in key (the broker swaps it for the real one): for claude, which
        // this step execs next.
        std::env::set_var(crate::policy::network::API_KEY_ENV, key);
    }
    for (name, body) in [
        (BROKER_CA_FILE, Some(ca)),
        (".credentials.json", login),
        (BROKER_HELPER_KEY_FILE, v["api_key_helper"].as_str()),
    ] {
        let Some(body) = body else { continue };
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, body.as_bytes()))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    // Hex only: it goes into a URL's user part unescaped.
    Ok(v["proxy_secret"]
        .as_str()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string))
}
