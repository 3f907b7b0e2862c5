//! Network policy: open (the host's network), allowlist (only listed hosts, through a
//! proxy that claudebox runs on the host) or none; and the allowlist's host patterns.
//!
//! Pure: parsing, matching and merging. The proxy lives in `proxy.rs`, the plumbing that
//! starts it and hands it the sandbox's port in `netbridge.rs`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::{bail, Result};

/// The proxy's port on the sandbox's own loopback (a fresh network namespace, so no
/// other program competes for it).
pub const PROXY_PORT: u16 = 3128;
/// The descriptor, inherited by bwrap and the sandbox, over which the sandbox hands its
/// proxy port to the proxy on the host.
pub const SANDBOX_NET_FD: i32 = 3;
/// What the proxy variables inside point at.
pub const PROXY_URL: &str = "http://127.0.0.1:3128";
/// Destinations that clients inside reach directly (the sandbox's own loopback).
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// Hosts Claude Code needs (Anthropic's "network access requirements" for Claude Code):
/// the API, the claude.ai and Console logins (and token refresh), feature flags; HTTPS
/// only.
/// Left out on purpose: `sentry.io` (error reports; it accepts events for anyone's
/// Sentry project, so it is a way out for data) and download hosts for the auto-updater
/// (the installation is read-only inside anyway).
pub const DEFAULT_HOSTS: &[&str] = &[
    "api.anthropic.com:443",
    "claude.ai:443",
    "platform.claude.com:443",
    "console.anthropic.com:443",
    "statsig.anthropic.com:443",
];

/// Which network the sandbox gets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkMode {
    /// The host's network, unfiltered (today's default).
    #[default]
    Open,
    /// Its own network namespace; out only through the proxy, to the listed hosts.
    Allowlist(Allowlist),
    /// Its own network namespace with loopback only.
    None,
}

/// The mode names used on the command line (`--network`) and, later, in the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeName {
    Open,
    Allowlist,
    None,
}

/// One layer of network settings: the built-in default, the config file (global, then the
/// project's section), the command line. Later layers win for `mode`; `allow_hosts`
/// accumulate. Each host carries where it came from, for `--dry-run`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkChoice {
    pub mode: Option<ModeName>,
    /// (pattern as written, where it came from)
    pub allow_hosts: Vec<(String, String)>,
    /// Forwarded host ports (`--forward-port`, `forward_ports`; see `policy::forward`):
    /// (as written, where it came from). They name no mode.
    pub forward_ports: Vec<(String, String)>,
    /// Where this layer came from, for error messages ("--network", "config file X").
    pub source: String,
}

/// Merges the layers into the mode in force.
///
/// The mode is the last one named; when no layer names one, listing a host means
/// allowlist, otherwise open. A layer that names open or none and also lists hosts
/// contradicts itself and is refused. In allowlist mode the built-in hosts come first,
/// then every layer's hosts in order (repeats dropped).
pub fn resolve(layers: &[NetworkChoice]) -> Result<NetworkMode> {
    let mut mode = None;
    for l in layers {
        if let (Some(m @ (ModeName::Open | ModeName::None)), Some((h, _))) =
            (l.mode, l.allow_hosts.first())
        {
            let name = if m == ModeName::Open { "open" } else { "none" };
            bail!(crate::policy::error::Fixable::new(
                format!(
                    "{}: allowing host {h} makes no sense with network mode {name}",
                    l.source
                ),
                "drop one of them (allowed hosts need the allowlist mode)"
            ));
        }
        if l.mode.is_some() {
            mode = l.mode;
        }
    }
    let any_hosts = layers.iter().any(|l| !l.allow_hosts.is_empty());
    let mode = mode.unwrap_or(if any_hosts {
        ModeName::Allowlist
    } else {
        ModeName::Open
    });
    Ok(match mode {
        ModeName::Open => NetworkMode::Open,
        ModeName::None => NetworkMode::None,
        ModeName::Allowlist => {
            let mut list = Allowlist::default_list();
            for l in layers {
                for (pat, source) in &l.allow_hosts {
                    let pattern = HostPattern::parse(pat)
                        .map_err(|e| anyhow::anyhow!("{source}: allowed host {pat:?}: {e}"))?;
                    list.push(pattern, source);
                }
            }
            NetworkMode::Allowlist(list)
        }
    })
}

/// One line saying which mode is in force, for `--dry-run` and `--check`.
pub fn describe(mode: &NetworkMode) -> String {
    match mode {
        NetworkMode::Open => "open: the host's network, unfiltered".to_string(),
        NetworkMode::None => {
            "none: own network namespace with loopback only; no way out".to_string()
        }
        NetworkMode::Allowlist(list) => format!(
            "allowlist: own network namespace; out only through claudebox's HTTP proxy on \
             the host ({PROXY_URL} inside), to {} allowed host pattern{}: {}",
            list.entries.len(),
            if list.entries.len() == 1 { "" } else { "s" },
            list.entries
                .iter()
                .map(|e| e.pattern.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// What the launcher hands the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySpec {
    /// Allowlist mode: the hosts the HTTP proxy lets through; empty in none mode.
    pub allowlist: Allowlist,
    /// The forwarded host ports (`--forward-port`, `forward_ports`).
    pub forward_ports: Vec<HostEntry>,
    /// Allowlist mode: the HTTP proxy on 127.0.0.1:3128 inside. Off in none mode, where the
    /// process serves only the forwarded ports.
    pub http_proxy: bool,
    /// Open mode with the login broker: the HTTP proxy lets every host through (open means
    /// unfiltered) and only ends `api.anthropic.com` in the broker. Its port is any free
    /// one on the host's loopback, which the sandbox shares; the step inside sets
    /// `HTTPS_PROXY` to it.
    pub open: bool,
    pub denied_log: PathBuf,
    pub log_stderr: bool,
    /// The sandbox's instance id; in the proxy's command line so it can be found.
    pub instance_id: String,
    /// `--login-broker`: what the proxy lends (`proxy::broker`).
    pub broker: Option<BrokerSpec>,
}

/// What the login broker lends: the host's OAuth login file, and the launcher's
/// `ANTHROPIC_API_KEY` (which the proxy inherits: it is named here, never carried, so no
/// plan, argv or `--dry-run` holds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerSpec {
    pub credentials: Option<PathBuf>,
    pub api_key: bool,
    /// The user's own `settings.json` (the host's, which the sandbox cannot write) whose
    /// `apiKeyHelper` the proxy runs on the host; inside, claude's helper prints a stand-in.
    pub api_key_helper: Option<PathBuf>,
    /// The user's own `settings.json` when its `env` block sets `ANTHROPIC_API_KEY`
    /// (claude applies that over its environment): the proxy reads that key there, on
    /// the host, and lends it; inside, the settings copy has it removed.
    pub settings_api_key: Option<PathBuf>,
}

/// The key a `settings.json`'s `env` block sets, which the broker lends and the sandbox's
/// copy of the settings drops.
pub const SETTINGS_KEY_ENV: &str = "ANTHROPIC_API_KEY";

/// The launcher's variable holding an API key the broker lends.
pub const API_KEY_ENV: &str = "ANTHROPIC_API_KEY";

/// The hosts the proxy lets through.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allowlist {
    pub entries: Vec<HostEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    pub pattern: HostPattern,
    /// Where it came from: "default", "--allow-host", a config file.
    pub source: String,
}

impl Allowlist {
    pub fn default_list() -> Allowlist {
        let mut l = Allowlist::default();
        for h in DEFAULT_HOSTS {
            if let Ok(p) = HostPattern::parse(h) {
                l.push(p, "default");
            }
        }
        l
    }

    pub fn push(&mut self, pattern: HostPattern, source: &str) {
        if !self.entries.iter().any(|e| e.pattern == pattern) {
            self.entries.push(HostEntry {
                pattern,
                source: source.to_string(),
            });
        }
    }

    /// The first entry that admits `host` (already normalized by [`normalize_host`]) on
    /// `port`, or `None` when the host is denied.
    pub fn find(&self, host: &str, port: u16) -> Option<&HostEntry> {
        self.entries.iter().find(|e| e.pattern.matches(host, port))
    }
}

/// An allowlist entry: an exact host or `*.domain` (any subdomain, at any depth, but not
/// `domain` itself), optionally limited to one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    pub host: HostMatch,
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// A normalized host name or IP literal (IPv6 without brackets).
    Exact(String),
    /// A suffix with its leading dot: `.example.com` for `*.example.com`.
    Subdomains(String),
}

impl HostPattern {
    /// Parses `host`, `host:port`, `*.domain`, `*.domain:port`, `1.2.3.4`, `[::1]:443`.
    /// Case-insensitive; a trailing dot is dropped. A bare `*` and a wildcard over a
    /// top-level domain (`*.com`) are refused.
    pub fn parse(s: &str) -> Result<HostPattern> {
        let s = s.trim();
        if s.contains("://") || s.contains('/') {
            bail!("give a host name (like api.example.com or *.example.com), not a URL");
        }
        let (host, port) = split_host_port(s)?;
        if host == "*" {
            bail!(crate::policy::error::Fixable::new(
                "a bare * would allow every host",
                "use --network open for that"
            ));
        }
        if let Some(domain) = host.strip_prefix("*.") {
            let domain = normalize_host(domain)?;
            if domain.parse::<IpAddr>().is_ok() {
                bail!("a wildcard needs a domain name, not an IP address");
            }
            if !domain.contains('.') {
                bail!(crate::policy::error::Fixable::new(
                    format!(
                        "*.{domain} would allow every host under the top-level domain {domain}"
                    ),
                    format!("name a domain you trust, like *.example.{domain}")
                ));
            }
            return Ok(HostPattern {
                host: HostMatch::Subdomains(format!(".{domain}")),
                port,
            });
        }
        if host.contains('*') {
            bail!("a wildcard is only allowed as a whole first label, as in *.example.com");
        }
        Ok(HostPattern {
            host: HostMatch::Exact(normalize_host(&host)?),
            port,
        })
    }

    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match &self.host {
            HostMatch::Exact(h) => h == host,
            HostMatch::Subdomains(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        }
    }

    pub fn is_wildcard(&self) -> bool {
        matches!(self.host, HostMatch::Subdomains(_))
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostMatch::Exact(h) if h.contains(':') => write!(f, "[{h}]")?,
            HostMatch::Exact(h) => f.write_str(h)?,
            HostMatch::Subdomains(s) => write!(f, "*{s}")?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// Splits `host[:port]` / `[v6][:port]`; the host is returned as written (brackets off).
fn split_host_port(s: &str) -> Result<(String, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            bail!("unclosed [ in an IPv6 address");
        };
        let port = match after {
            "" => None,
            p => Some(parse_port(p.strip_prefix(':').unwrap_or("x"))?),
        };
        return Ok((v6.to_string(), port));
    }
    if s.matches(':').count() > 1 {
        // A bare IPv6 literal.
        return Ok((s.to_string(), None));
    }
    match s.split_once(':') {
        Some((h, p)) => Ok((h.to_string(), Some(parse_port(p)?))),
        None => Ok((s.to_string(), None)),
    }
}

/// A request's `host[:port]` (CONNECT target, URL authority, Host header), normalized;
/// `default_port` applies when none is written (none for CONNECT, which must name one).
pub fn parse_authority(s: &str, default_port: Option<u16>) -> Result<(String, u16)> {
    let (host, port) = split_host_port(s)?;
    let Some(port) = port.or(default_port) else {
        bail!("{s:?} names no port");
    };
    Ok((normalize_host(&host)?, port))
}

/// How a host appears in messages and in `--allow-host` (IPv6 in brackets).
pub fn show_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

pub(crate) fn parse_port(p: &str) -> Result<u16> {
    match p.parse::<u16>() {
        Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => bail!("{p:?} is not a port number (1-65535)"),
    }
}

/// The canonical form of a host as the proxy compares it: lower case, no trailing dot,
/// IPv6 without brackets in its canonical text. Refuses anything that is not a DNS name
/// (letters, digits, `-`, `_`, labels of 1-63) or an IP literal.
pub fn normalize_host(h: &str) -> Result<String> {
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    if let Ok(v6) = h.parse::<Ipv6Addr>() {
        return Ok(v6.to_string());
    }
    let lower = h.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if let Ok(v4) = name.parse::<Ipv4Addr>() {
        return Ok(v4.to_string());
    }
    if name.is_empty() || name.len() > 253 {
        bail!("{h:?} is not a host name");
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            bail!("{h:?} is not a host name");
        }
    }
    Ok(name.to_string())
}

/// Addresses the proxy reaches only for a host named exactly (never through a wildcard,
/// whose subdomains someone else may point anywhere): the host's own loopback, the
/// unspecified address, link-local (cloud metadata at 169.254.169.254).
pub fn is_local_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified() || v4.is_link_local(),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_local_address(IpAddr::V4(v4));
            }
            v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// At most this many loopback forwards (listening sockets handed to the proxy in one
/// message, besides the proxy's own port).
pub const MAX_FORWARDS: usize = 32;

/// A host loopback `host:port` reached at the same address inside. Inside, loopback is the
/// sandbox's own (and clients honour `NO_PROXY` for it), so the sandbox's first step
/// listens on `listen` there and hands the socket to the proxy on the host, which tunnels
/// each connection, blind, to [`LoopbackForward::targets`]: fixed at launch, chosen by
/// nothing the agent sends. Two kinds share this one path: an allowed loopback
/// `host:port` of the allowlist (`--allow-host 127.0.0.1:5432`) and a forwarded host port
/// (`--forward-port 5432`, also in `none` mode; see `policy::forward`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopbackForward {
    pub listen: SocketAddr,
    /// The host as written (`localhost`, `127.0.0.1`, `::1`).
    pub host: String,
    pub port: u16,
    /// `localhost`'s IPv6 half: skipped when the sandbox has no IPv6 loopback.
    pub optional: bool,
    /// Why the hole is there.
    pub kind: ForwardKind,
    /// Where it was asked for: "--allow-host", "--forward-port", a config file line.
    pub source: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardKind {
    /// An allowed loopback `host:port` of the allowlist.
    AllowedHost,
    /// A forwarded host port (`--forward-port`, `forward_ports`).
    HostPort,
}

impl ForwardKind {
    pub fn why(self) -> &'static str {
        match self {
            ForwardKind::AllowedHost => {
                "an allowed loopback host:port (clients skip the proxy for loopback, so the \
                 sandbox listens on it and the proxy tunnels to the host's)"
            }
            ForwardKind::HostPort => {
                "a forwarded host port: whatever listens there on the host, the agent can \
                 talk to; no other host port or address"
            }
        }
    }
}

impl LoopbackForward {
    /// The host addresses the proxy connects to, in order: fixed at launch (`localhost` is
    /// 127.0.0.1, then ::1; nothing is resolved).
    pub fn targets(&self) -> Vec<SocketAddr> {
        if self.host == "localhost" {
            vec![
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.port),
                SocketAddr::new(Ipv6Addr::LOCALHOST.into(), self.port),
            ]
        } else {
            loopback_ip(&self.host)
                .map(|ip| SocketAddr::new(ip, self.port))
                .into_iter()
                .collect()
        }
    }

    /// `localhost:5432` or `[::1]:5432`, as the host side is named.
    pub fn target_shown(&self) -> String {
        format!("{}:{}", show_host(&self.host), self.port)
    }
}

fn loopback_ip(host: &str) -> Option<IpAddr> {
    host.parse::<IpAddr>().ok().filter(IpAddr::is_loopback)
}

/// Whether `pattern` names one loopback host exactly, with a port.
pub fn is_loopback_host_port(pattern: &HostPattern) -> bool {
    matches!((&pattern.host, pattern.port),
        (HostMatch::Exact(h), Some(_)) if h == "localhost" || loopback_ip(h).is_some())
}

/// The forwards of one exact loopback `host:port` entry (`localhost` as both 127.0.0.1 and
/// ::1); none for any other entry.
pub fn entry_forwards(e: &HostEntry, kind: ForwardKind) -> Vec<LoopbackForward> {
    let (HostMatch::Exact(host), Some(port)) = (&e.pattern.host, e.pattern.port) else {
        return Vec::new();
    };
    let listens: Vec<(IpAddr, bool)> = if host == "localhost" {
        vec![
            (Ipv4Addr::LOCALHOST.into(), false),
            (Ipv6Addr::LOCALHOST.into(), true),
        ]
    } else if let Some(ip) = loopback_ip(host) {
        vec![(ip, false)]
    } else {
        return Vec::new();
    };
    listens
        .into_iter()
        .map(|(ip, optional)| LoopbackForward {
            listen: SocketAddr::new(ip, port),
            host: host.clone(),
            port,
            optional,
            kind,
            source: e.source.clone(),
        })
        .collect()
}

/// Adds `f` unless its address is taken (the first one wins an address). Refuses one on
/// the proxy's own port when the proxy listens (`proxy_port`).
pub fn add_forward(
    out: &mut Vec<LoopbackForward>,
    f: LoopbackForward,
    proxy_port: bool,
) -> Result<()> {
    if proxy_port && f.listen == SocketAddr::new(Ipv4Addr::LOCALHOST.into(), PROXY_PORT) {
        let (key, flag) = match f.kind {
            ForwardKind::AllowedHost => ("allow_hosts", "--allow-host"),
            ForwardKind::HostPort => ("forward_ports", "--forward-port"),
        };
        bail!(crate::policy::error::Fixable::new(
            format!(
                "{}: claudebox's proxy listens on 127.0.0.1:{PROXY_PORT} inside the sandbox in \
                 allowlist mode, so the host's service on that port cannot be reached there",
                named(&f.source, key, flag, &f.target_shown())
            ),
            "move it to another port (in none mode there is no proxy and 3128 can be forwarded)"
        ));
    }
    if out.iter().all(|o| o.listen != f.listen) {
        out.push(f);
    }
    Ok(())
}

/// How an entry is named in a message: `--forward-port 5432` from the command line
/// (`source` is the flag), `config FILE:LINE: forward_ports 5432` from the config file.
pub fn named(source: &str, key: &str, flag: &str, value: &str) -> String {
    if source == flag {
        format!("{flag} {value}")
    } else {
        format!("{source}: {key} {value}")
    }
}

/// The loopback forwards of an allowlist: every exact loopback host with a port
/// (127.0.0.0/8, `::1`, `localhost` as both 127.0.0.1 and ::1), first entry winning an
/// address. Refuses one on the proxy's own port.
pub fn loopback_forwards(list: &Allowlist) -> Result<Vec<LoopbackForward>> {
    let mut out: Vec<LoopbackForward> = Vec::new();
    for e in &list.entries {
        for f in entry_forwards(e, ForwardKind::AllowedHost) {
            add_forward(&mut out, f, true)?;
        }
    }
    Ok(out)
}

/// Allowed loopback hosts without a port: inside, their addresses are the sandbox's own
/// loopback, so clients that honour `NO_PROXY` never reach the host through them.
pub fn portless_loopback(list: &Allowlist) -> Vec<String> {
    list.entries
        .iter()
        .filter_map(|e| match (&e.pattern.host, e.pattern.port) {
            (HostMatch::Exact(h), None) if h == "localhost" || loopback_ip(h).is_some() => {
                Some(e.pattern.to_string())
            }
            _ => None,
        })
        .collect()
}

/// The login broker's certificate authority in the sandbox's login dir
/// (`NODE_EXTRA_CA_CERTS` inside).
pub const BROKER_CA_FILE: &str = "claudebox-broker-ca.pem";

/// The stand-in key of the user's `apiKeyHelper`, in the sandbox's login dir: what the
/// helper claude runs inside prints.
pub const BROKER_HELPER_KEY_FILE: &str = "claudebox-api-key-helper";

/// The `apiKeyHelper` claude finds inside when the broker runs the user's on the host:
/// it prints this sandbox's stand-in key. `None` for a login dir that is no UTF-8 (JSON
/// cannot hold it).
pub fn inside_api_key_helper(login_dir: &std::path::Path) -> Option<String> {
    let path = login_dir.join(BROKER_HELPER_KEY_FILE);
    let path = path.to_str()?;
    Some(format!("cat '{}'", path.replace('\'', "'\\''")))
}

/// Credentials in the launcher's environment that never reach a sandbox with the broker.
pub const BROKER_UNSET_ENV: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
];

/// The proxy's hidden role on claudebox's command line.
pub const INTERNAL_PROXY: &str = "--internal-proxy";

/// Open mode with the login broker: the variables the step inside sets once it has its
/// port (any free one on the host's loopback): HTTPS only, so that plain HTTP and every
/// other client keep going straight out as in open mode.
/// The URL carries the proxy's secret (`http://claudebox:SECRET@127.0.0.1:PORT`): that
/// port is on the loopback every open-mode sandbox and host process shares, and the proxy
/// serves only requests that show it (see [`open_proxy_authorization`]).
pub fn open_proxy_env(port: u16, secret: &str) -> Vec<(&'static str, String)> {
    let url = format!("http://{OPEN_PROXY_USER}:{secret}@127.0.0.1:{port}");
    vec![
        ("HTTPS_PROXY", url.clone()),
        ("https_proxy", url),
        ("NO_PROXY", NO_PROXY.to_string()),
        ("no_proxy", NO_PROXY.to_string()),
        ("NODE_USE_ENV_PROXY", "1".to_string()),
    ]
}

/// The user name in the open-mode proxy's URL (the password is its secret).
pub const OPEN_PROXY_USER: &str = "claudebox";

/// The `Proxy-Authorization` value the open-mode proxy requires of every request: Basic
/// with [`OPEN_PROXY_USER`] and the secret, as clients make it from the proxy URL's user
/// part (measured: Claude Code 2.1.197 and 2.1.330 send it on every `CONNECT`; curl,
/// git and Python do too). Without it anything on the shared loopback could hold the
/// proxy's connections (another project's agent keeping its tunnels busy) and leave this
/// sandbox's claude waiting for ever.
pub fn open_proxy_authorization(secret: &str) -> String {
    use base64::Engine;
    let pair = format!("{OPEN_PROXY_USER}:{secret}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// The proxy variables set inside in allowlist mode; `NODE_USE_ENV_PROXY` makes Node.js
/// (22.21+/24+) honour them in `fetch` and `http(s)` too (older Node ignores it).
pub fn proxy_env() -> Vec<(&'static str, &'static str)> {
    let url = PROXY_URL;
    let no = NO_PROXY;
    vec![
        ("HTTPS_PROXY", url),
        ("https_proxy", url),
        ("HTTP_PROXY", url),
        ("http_proxy", url),
        ("ALL_PROXY", url),
        ("all_proxy", url),
        ("NO_PROXY", no),
        ("no_proxy", no),
        ("NODE_USE_ENV_PROXY", "1"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_with_a_port_are_forwarded() {
        let mut l = Allowlist::default_list();
        for h in [
            "localhost:8080",
            "127.0.0.1:8080",
            "127.0.0.2:9",
            "[::1]:7",
            "127.0.0.1",
        ] {
            l.push(HostPattern::parse(h).unwrap(), "t");
        }
        let f = loopback_forwards(&l).unwrap();
        let shown: Vec<String> = f
            .iter()
            .map(|f| format!("{} {} {} {}", f.listen, f.host, f.port, f.optional))
            .collect();
        assert_eq!(
            shown,
            [
                "127.0.0.1:8080 localhost 8080 false",
                "[::1]:8080 localhost 8080 true",
                "127.0.0.2:9 127.0.0.2 9 false",
                "[::1]:7 ::1 7 false",
            ]
        );
        assert_eq!(portless_loopback(&l), ["127.0.0.1"]);
        let mut bad = Allowlist::default();
        bad.push(HostPattern::parse("127.0.0.1:3128").unwrap(), "t");
        assert!(loopback_forwards(&bad)
            .unwrap_err()
            .to_string()
            .contains("3128"));
    }

    fn p(s: &str) -> HostPattern {
        HostPattern::parse(s).unwrap()
    }
    fn err(s: &str) -> String {
        HostPattern::parse(s).unwrap_err().to_string()
    }

    #[test]
    fn exact_hosts_are_case_insensitive_and_ignore_a_trailing_dot() {
        let pat = p("API.Example.COM.");
        assert_eq!(pat.host, HostMatch::Exact("api.example.com".into()));
        assert!(pat.matches("api.example.com", 443));
        assert!(pat.matches("api.example.com", 80));
        assert!(!pat.matches("example.com", 443));
        assert!(!pat.matches("x.api.example.com", 443));
        assert!(!pat.matches("api.example.com.evil.org", 443));
        assert_eq!(
            normalize_host("API.example.com.").unwrap(),
            "api.example.com"
        );
    }

    #[test]
    fn a_port_limits_the_entry_to_that_port() {
        let pat = p("example.com:8443");
        assert!(pat.matches("example.com", 8443));
        assert!(!pat.matches("example.com", 443));
        assert_eq!(pat.to_string(), "example.com:8443");
    }

    #[test]
    fn wildcards_match_subdomains_at_any_depth_but_not_the_domain() {
        let pat = p("*.Example.com");
        assert!(pat.is_wildcard());
        assert!(pat.matches("a.example.com", 443));
        assert!(pat.matches("a.b.example.com", 443));
        assert!(!pat.matches("example.com", 443));
        assert!(!pat.matches("badexample.com", 443));
        assert!(!pat.matches("a.example.com.evil.org", 443));
        assert_eq!(pat.to_string(), "*.example.com");
        assert!(p("*.example.com:443").matches("x.example.com", 443));
        assert!(!p("*.example.com:443").matches("x.example.com", 80));
    }

    #[test]
    fn bare_star_and_top_level_wildcards_are_refused() {
        assert!(err("*").contains("every host"), "{}", err("*"));
        assert!(err("*:443").contains("every host"));
        assert!(
            err("*.com").contains("top-level domain com"),
            "{}",
            err("*.com")
        );
        assert!(err("*.COM.").contains("top-level"));
        assert!(err("*.org:443").contains("top-level"));
        assert!(err("*.1.2.3.4").contains("IP address"));
        assert!(err("api.*.com").contains("whole first label"));
        assert!(err("*example.com").contains("whole first label"));
        assert!(err("**.example.com").contains("whole first label"));
        assert!(err("*.*.example.com").contains("not a host name"));
        // A documented limit: public suffixes of two labels pass the top-level check.
        assert!(HostPattern::parse("*.co.uk").is_ok());
    }

    #[test]
    fn junk_is_refused() {
        for bad in [
            "",
            "https://example.com",
            "example.com/path",
            "exa mple.com",
            "a..b",
            "example.com:0",
            "example.com:70000",
            "example.com:+1",
            "example.com:",
            "user@example.com",
            "[::1",
            "[::1]x",
            &format!("{}.com", "a".repeat(64)),
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn ip_literals_are_exact_and_canonical() {
        assert_eq!(p("127.0.0.1:8080").to_string(), "127.0.0.1:8080");
        let v6 = p("[0:0::1]:443");
        assert_eq!(v6.host, HostMatch::Exact("::1".into()));
        assert_eq!(v6.to_string(), "[::1]:443");
        assert!(v6.matches(&normalize_host("[::1]").unwrap(), 443));
        assert_eq!(p("::1").host, HostMatch::Exact("::1".into()));
    }

    #[test]
    fn authorities() {
        assert_eq!(
            parse_authority("Example.COM.:8080", None).unwrap(),
            ("example.com".to_string(), 8080)
        );
        assert_eq!(
            parse_authority("example.com", Some(80)).unwrap(),
            ("example.com".to_string(), 80)
        );
        assert!(parse_authority("example.com", None).is_err());
        assert_eq!(
            parse_authority("[::1]:443", None).unwrap(),
            ("::1".to_string(), 443)
        );
        assert!(parse_authority("a@b.com:80", None).is_err());
        assert!(parse_authority("b.com:80\r\nX: y", None).is_err());
        assert_eq!(show_host("::1"), "[::1]");
    }

    #[test]
    fn local_addresses() {
        for a in [
            "127.0.0.1",
            "127.8.9.10",
            "0.0.0.0",
            "169.254.169.254",
            "::1",
            "::",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_local_address(a.parse().unwrap()), "{a}");
        }
        for a in ["10.0.0.1", "192.168.1.1", "160.79.104.10", "2607:6bc0::10"] {
            assert!(!is_local_address(a.parse().unwrap()), "{a}");
        }
    }

    fn layer(mode: Option<ModeName>, hosts: &[&str], source: &str) -> NetworkChoice {
        NetworkChoice {
            mode,
            allow_hosts: hosts
                .iter()
                .map(|h| (h.to_string(), source.to_string()))
                .collect(),
            source: source.to_string(),
            ..NetworkChoice::default()
        }
    }

    #[test]
    fn resolve_defaults_to_open_and_hosts_imply_allowlist() {
        assert_eq!(resolve(&[]).unwrap(), NetworkMode::Open);
        assert_eq!(
            resolve(&[layer(None, &[], "cli")]).unwrap(),
            NetworkMode::Open
        );
        let NetworkMode::Allowlist(l) = resolve(&[layer(None, &["Example.com"], "cli")]).unwrap()
        else {
            panic!("not allowlist")
        };
        assert_eq!(l.entries.len(), DEFAULT_HOSTS.len() + 1);
        assert_eq!(l.entries[0].source, "default");
        let last = l.entries.last().unwrap();
        assert_eq!(last.pattern.to_string(), "example.com");
        assert_eq!(last.source, "cli");
        assert!(l.find("api.anthropic.com", 443).is_some());
        assert!(l.find("api.anthropic.com", 22).is_none());
        assert!(l.find("evil.example.org", 443).is_none());
    }

    #[test]
    fn resolve_later_layers_win_and_hosts_accumulate() {
        let cfg = layer(Some(ModeName::Allowlist), &["a.example.com"], "config");
        let cli = layer(None, &["b.example.com", "a.example.com"], "cli");
        let NetworkMode::Allowlist(l) = resolve(&[cfg.clone(), cli]).unwrap() else {
            panic!()
        };
        let names: Vec<String> = l.entries.iter().map(|e| e.pattern.to_string()).collect();
        assert_eq!(
            &names[DEFAULT_HOSTS.len()..],
            ["a.example.com", "b.example.com"]
        );
        // The command line can switch a configured allowlist off, or the network off.
        let open = layer(Some(ModeName::Open), &[], "cli");
        assert_eq!(resolve(&[cfg.clone(), open]).unwrap(), NetworkMode::Open);
        let none = layer(Some(ModeName::None), &[], "cli");
        assert_eq!(resolve(&[cfg, none]).unwrap(), NetworkMode::None);
    }

    #[test]
    fn resolve_refuses_contradictions_and_bad_hosts() {
        let e = resolve(&[layer(Some(ModeName::None), &["x.com"], "--network")]).unwrap_err();
        assert!(e.to_string().contains("--network"), "{e}");
        let e = resolve(&[layer(None, &["*.com"], "--allow-host")]).unwrap_err();
        assert!(e.to_string().contains("top-level"), "{e}");
        assert!(e.to_string().starts_with("--allow-host"), "{e}");
    }

    #[test]
    fn describe_names_the_mode() {
        assert!(describe(&NetworkMode::Open).starts_with("open"));
        assert!(describe(&NetworkMode::None).starts_with("none"));
        let d = describe(&NetworkMode::Allowlist(Allowlist::default_list()));
        assert!(d.starts_with("allowlist"), "{d}");
        assert!(d.contains("api.anthropic.com"), "{d}");
    }
}
