//! A custom `ANTHROPIC_BASE_URL` (a local gateway, a proxy on the LAN) that the network
//! mode cannot reach: claude retries it for minutes with no message, and nothing reaches
//! the denied log (a loopback address goes past the proxy, `NO_PROXY`). One warning line
//! at launch names the flag that opens it. Pure: the edge gives the value in force.
//!
//! Reachable: in open mode anything; a loopback address (`localhost`, 127.0.0.0/8, `::1`)
//! only through a forward listening on it inside (`--forward-port`, or an allowed loopback
//! `host:port`); another host in allowlist mode when the allowlist admits it, in none
//! mode never.

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::policy::escape::shown;
use crate::policy::network::{parse_authority, show_host, LoopbackForward, NetworkMode};
use crate::policy::settings::UserEnv;

/// The variable claude reads.
pub const VAR: &str = "ANTHROPIC_BASE_URL";

/// The warning for `url` under `mode` with `forwards` (the launch's loopback forwards),
/// or `None` when claude can reach it, or when it is no http(s) URL (claude's own error
/// says so then).
pub fn unreachable_warning(
    url: &str,
    mode: &NetworkMode,
    forwards: &[LoopbackForward],
) -> Option<String> {
    let (host, port) = host_port(url)?;
    let mode_name = match mode {
        NetworkMode::Open => return None,
        NetworkMode::Allowlist(_) => "allowlist",
        NetworkMode::None => "none",
    };
    let target = format!("{}:{port}", show_host(&host));
    let fix = if let Some(ips) = loopback(&host) {
        if ips.iter().any(|ip| {
            forwards
                .iter()
                .any(|f| f.listen == SocketAddr::new(*ip, port))
        }) {
            return None;
        }
        format!(
            "loopback inside the sandbox is its own: add --forward-port {target} (or \
             --allow-host {target} in allowlist mode), or --network open"
        )
    } else {
        match mode {
            NetworkMode::Allowlist(list) if list.find(&host, port).is_some() => return None,
            NetworkMode::Allowlist(_) => {
                format!("add --allow-host {target} (--forward-port is for loopback ports only)")
            }
            _ => format!(
                "use --network allowlist --allow-host {target} (--forward-port is for \
                 loopback ports only), or --network open"
            ),
        }
    };
    Some(format!(
        "network: warning: {VAR} is {}, which --network {mode_name} cannot reach, so claude \
         would retry it for minutes with no message; {fix}",
        shown(url)
    ))
}

/// The value claude sees inside: the last `--env`/config `env` entry naming [`VAR`], else
/// the host's (`host`); `None` when unset, empty or not UTF-8.
pub fn in_force(user_env: &[UserEnv], host: Option<&OsStr>) -> Option<String> {
    let v = match user_env.iter().rev().find(|e| e.name == VAR) {
        Some(e) => e.value.as_os_str(),
        None => host?,
    };
    v.to_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// The normalized host and port of an `http://` or `https://` URL (default 80 and 443).
fn host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    parse_authority(authority, Some(default)).ok()
}

/// The addresses a loopback host names inside; `None` for any other host.
fn loopback(host: &str) -> Option<Vec<IpAddr>> {
    if host == "localhost" {
        return Some(vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()]);
    }
    let ip: IpAddr = host.parse().ok()?;
    ip.is_loopback().then(|| vec![ip])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::network::{Allowlist, HostPattern};

    fn allow(extra: &[&str]) -> NetworkMode {
        let mut list = Allowlist::default_list();
        for e in extra {
            list.push(HostPattern::parse(e).unwrap(), "--allow-host");
        }
        NetworkMode::Allowlist(list)
    }

    fn forwards(mode: &NetworkMode) -> Vec<LoopbackForward> {
        match mode {
            NetworkMode::Allowlist(l) => crate::policy::network::loopback_forwards(l).unwrap(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn an_unreachable_gateway_is_named_with_the_flag_that_opens_it() {
        let gw = "http://127.0.0.1:4000";
        let w = unreachable_warning(gw, &NetworkMode::None, &[]).unwrap();
        assert!(w.contains("--forward-port 127.0.0.1:4000"), "{w}");
        assert!(w.contains("--network none"), "{w}");
        let w = unreachable_warning(gw, &allow(&[]), &[]).unwrap();
        assert!(w.contains("--allow-host 127.0.0.1:4000"), "{w}");
        let lan = "https://gateway.lan:8080/v1";
        let w = unreachable_warning(lan, &allow(&[]), &[]).unwrap();
        assert!(w.contains("--allow-host gateway.lan:8080"), "{w}");
        let w = unreachable_warning(lan, &NetworkMode::None, &[]).unwrap();
        assert!(
            w.contains("--network allowlist --allow-host gateway.lan:8080"),
            "{w}"
        );
        assert!(unreachable_warning("http://u:p@localhost", &NetworkMode::None, &[]).is_some());
    }

    #[test]
    fn a_reachable_base_url_gets_no_warning() {
        let gw = "http://127.0.0.1:4000";
        assert_eq!(unreachable_warning(gw, &NetworkMode::Open, &[]), None);
        let m = allow(&["127.0.0.1:4000"]);
        assert_eq!(unreachable_warning(gw, &m, &forwards(&m)), None);
        // localhost reaches a forward on either of its addresses.
        assert_eq!(
            unreachable_warning("http://localhost:4000/", &m, &forwards(&m)),
            None
        );
        let m = allow(&["gateway.lan:8080"]);
        assert_eq!(
            unreachable_warning("http://gateway.lan:8080", &m, &[]),
            None
        );
        // The port matters, the default one included.
        assert!(unreachable_warning("http://gateway.lan", &m, &[]).is_some());
        // The default allowlist has Anthropic's API.
        let m = allow(&[]);
        assert_eq!(
            unreachable_warning("https://api.anthropic.com", &m, &[]),
            None
        );
        assert_eq!(unreachable_warning("not a url", &m, &[]), None);
    }
}
