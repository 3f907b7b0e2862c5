//! The inside half of the bridge to the proxy (the host half is `proxy::netbridge`): in the
//! sandbox's own network namespace, open 127.0.0.1:PORT (allowlist mode) and one listener
//! per loopback forward (the allowlist's, the forwarded host ports), send them to the proxy
//! over the inherited descriptor, close it. The step then
//! execs the agent, so the agent keeps its pid, holds no socket to the proxy, and its exit
//! status is the sandbox's.

use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};

use anyhow::{bail, Context, Result};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use crate::policy::error::Fixable;
use crate::policy::network::MAX_FORWARDS;

/// Opens the proxy port (allowlist mode; `None` in none mode, where only forwarded ports
/// are served) and the forwards (`(address, optional)`), sends them over `fd` and closes
/// it.
pub fn hand_to_proxy(fd: RawFd, port: Option<u16>, forwards: &[(SocketAddr, bool)]) -> Result<()> {
    if forwards.len() > MAX_FORWARDS {
        bail!("at most {MAX_FORWARDS} loopback forwards");
    }
    if port.is_none() && forwards.is_empty() {
        bail!("nothing to hand to the proxy");
    }
    let mut listeners = Vec::new();
    if let Some(port) = port {
        listeners.push(
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).with_context(|| {
                format!("cannot open the proxy port 127.0.0.1:{port} in the sandbox")
            })?,
        );
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
    let _ = nix::unistd::close(fd);
    drop(listeners);
    Ok(())
}
