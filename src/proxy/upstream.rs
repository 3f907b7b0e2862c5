//! The user's own HTTP proxy (`https_proxy` / `HTTPS_PROXY` on the host, minus
//! `NO_PROXY`): the login broker's upstream connections, and in open mode the hosts the
//! proxy lets through, go through it with `CONNECT` rather than around it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};

const TIMEOUT: Duration = Duration::from_secs(30);
const MAX_HEAD: usize = 64 * 1024;

/// An HTTP proxy the broker's upstream connections go through (`CONNECT`).
#[derive(Debug, PartialEq, Eq)]
pub struct UpstreamProxy {
    /// `host:port`.
    pub addr: String,
    /// `user:password` in base64, for `Proxy-Authorization: Basic`.
    pub auth: Option<String>,
    /// How errors name it (never with its password).
    pub label: String,
    /// `NO_PROXY`'s entries, lower case, without a leading `*.` or `.`; `*` is every host.
    pub no_proxy: Vec<String>,
}

impl UpstreamProxy {
    /// The user's own proxy: `https_proxy`, else `HTTPS_PROXY` (as curl reads them), with
    /// `no_proxy` / `NO_PROXY`. Only `http://` proxies (or a bare `host:port`); another
    /// scheme fails the launch in one line rather than going around the user's proxy.
    pub fn from_env() -> Result<Option<UpstreamProxy>> {
        let var = |names: [&str; 2]| {
            names
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
        };
        let Some(url) = var(["https_proxy", "HTTPS_PROXY"]) else {
            return Ok(None);
        };
        let mut p = UpstreamProxy::parse(url.trim())?;
        p.no_proxy = var(["no_proxy", "NO_PROXY"])
            .unwrap_or_default()
            .split(',')
            .map(|e| {
                let e = e.trim().to_ascii_lowercase();
                let e = e.trim_start_matches("*.").trim_start_matches('.');
                // A port in an entry is not compared (the broker goes to port 443 only).
                match e.rsplit_once(':') {
                    Some((h, port)) if !h.contains(':') && port.parse::<u16>().is_ok() => {
                        h.to_string()
                    }
                    _ => e.to_string(),
                }
            })
            .filter(|e| !e.is_empty())
            .collect();
        Ok(Some(p))
    }

    pub fn parse(url: &str) -> Result<UpstreamProxy> {
        let rest = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) => bail!(
                "HTTPS_PROXY: the login broker reaches api.anthropic.com through an http:// \
                 proxy only, not {}://; use --no-login-broker",
                crate::policy::escape::shown(scheme)
            ),
            None => url,
        };
        let rest = rest.split('/').next().unwrap_or("");
        let (auth, hostport) = match rest.rsplit_once('@') {
            Some((userinfo, hp)) => {
                use base64::Engine;
                let decoded = percent_decode(userinfo);
                (
                    Some(base64::engine::general_purpose::STANDARD.encode(decoded)),
                    hp,
                )
            }
            None => (None, rest),
        };
        if hostport.is_empty() {
            bail!("HTTPS_PROXY names no host");
        }
        let has_port = match hostport.rsplit_once(':') {
            Some((h, p)) => {
                !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':')
            }
            None => false,
        } && !hostport.ends_with(']');
        let addr = if has_port {
            hostport.to_string()
        } else {
            format!("{hostport}:80")
        };
        Ok(UpstreamProxy {
            label: format!("your HTTPS_PROXY ({})", crate::policy::escape::shown(&addr)),
            addr,
            auth,
            no_proxy: Vec::new(),
        })
    }

    /// A tunnel to `host:port` through this proxy (`CONNECT`, with its password when it
    /// has one): the stream once the proxy answered 200.
    pub fn connect(&self, host: &str, port: u16) -> Result<TcpStream> {
        let mut s = TcpStream::connect(self.addr.as_str())
            .with_context(|| format!("cannot reach {}", self.label))?;
        let _ = s.set_read_timeout(Some(TIMEOUT));
        let auth = self
            .auth
            .as_ref()
            .map(|a| format!("proxy-authorization: Basic {a}\r\n"))
            .unwrap_or_default();
        let target = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        write!(
            s,
            "CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n{auth}\r\n"
        )?;
        // Byte by byte: nothing after the head is the proxy's.
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut b)? == 0 || head.len() > MAX_HEAD {
                bail!("{} closed", self.label);
            }
            head.push(b[0]);
        }
        if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
            let line = String::from_utf8_lossy(&head);
            bail!(
                "{} refused the tunnel to {}: {}",
                self.label,
                crate::policy::escape::shown(&target),
                crate::policy::escape::shown(line.lines().next().unwrap_or(""))
            );
        }
        let _ = s.set_read_timeout(None);
        Ok(s)
    }

    /// Whether `NO_PROXY` sends `host` direct.
    pub fn bypassed(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.no_proxy
            .iter()
            .any(|e| e == "*" || host == *e || host.ends_with(&format!(".{e}")))
    }
}

/// `%XX` sequences decoded (a proxy URL's user and password).
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_proxy_is_read_as_curl_does() {
        let p = UpstreamProxy::parse("http://lab:s%40cret@proxy.corp:3128/").unwrap();
        assert_eq!(p.addr, "proxy.corp:3128");
        // base64("lab:s@cret")
        assert_eq!(p.auth.as_deref(), Some("bGFiOnNAY3JldA=="));
        assert!(!p.label.contains("cret"));
        assert_eq!(
            UpstreamProxy::parse("proxy.corp").unwrap().addr,
            "proxy.corp:80"
        );
        assert_eq!(
            UpstreamProxy::parse("http://[::1]:8080").unwrap().addr,
            "[::1]:8080"
        );
        assert_eq!(
            UpstreamProxy::parse("http://[::1]").unwrap().addr,
            "[::1]:80"
        );
        assert!(UpstreamProxy::parse("socks5://proxy.corp:1080").is_err());
        assert!(UpstreamProxy::parse("https://proxy.corp:443").is_err());
        let mut p = UpstreamProxy::parse("proxy.corp:3128").unwrap();
        p.no_proxy = vec!["anthropic.com".into()];
        assert!(p.bypassed("api.anthropic.com") && p.bypassed("ANTHROPIC.com"));
        assert!(!p.bypassed("platform.claude.com") && !p.bypassed("notanthropic.com"));
        p.no_proxy = vec!["*".into()];
        assert!(p.bypassed("platform.claude.com"));
    }
}
