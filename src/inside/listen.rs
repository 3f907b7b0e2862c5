//! The inside half of allowlist mode's bridge (the host half is `proxy::netbridge`): in the
//! sandbox's own network namespace, open 127.0.0.1:PORT and one listener per loopback
//! forward, send them to the proxy over the inherited descriptor, close it. The step then
//! execs the agent, so the agent keeps its pid, holds no socket to the proxy, and its exit
//! status is the sandbox's.

use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};

use anyhow::{bail, Context, Result};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use crate::policy::error::Fixable;
use crate::proxy::netbridge::MAX_FORWARDS;

/// Opens the proxy port and the forwards (`(address, optional)`), sends them over `fd`
/// and closes it.
pub fn hand_to_proxy(fd: RawFd, port: u16, forwards: &[(SocketAddr, bool)]) -> Result<()> {
    if forwards.len() > MAX_FORWARDS {
        bail!("at most {MAX_FORWARDS} loopback forwards");
    }
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .with_context(|| format!("cannot open the proxy port 127.0.0.1:{port} in the sandbox"))?;
    let mut listeners = vec![listener];
    for (addr, optional) in forwards {
        match TcpListener::bind(addr) {
            Ok(l) => listeners.push(l),
            // `localhost`'s IPv6 half, where the sandbox has no IPv6 loopback.
            Err(_) if *optional => {}
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
        Fixable::new(
            format!("the network proxy is not reachable on descriptor {fd}"),
            "allowlist mode works only when claudebox itself starts the sandbox",
        )
    })?;
    let _ = nix::unistd::close(fd);
    drop(listeners);
    Ok(())
}
