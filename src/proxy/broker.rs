//! The login broker (`--login-broker`): the sandbox holds a stand-in login, this process
//! (the sandbox's one host-side proxy) holds the real one.
//!
//! Inside, claude finds a stand-in `.credentials.json` (random tokens, expiring in ten
//! years, so it never refreshes) and sends everything for `api.anthropic.com` through the
//! proxy (`HTTPS_PROXY`), which is the only way out of the sandbox's network namespace.
//! A `CONNECT api.anthropic.com:443` is not tunnelled blind: the broker ends TLS there with
//! a certificate of a certificate authority made for this sandbox alone (its key never
//! leaves this process; claude trusts it through `NODE_EXTRA_CA_CERTS`), reads one request,
//! replaces `Authorization: Bearer <stand-in>` with the host's real access token (read from
//! the host's `.credentials.json` for each request), and sends it on to the real
//! `api.anthropic.com:443` over TLS checked against the public roots (`webpki-roots`).
//! The host is fixed: the request's own `Host` must name it, and nothing the request says
//! chooses where it goes. One request per connection (`Connection: close` both ways).
//!
//! Measured with both pinned claude versions (2.1.197, 2.1.330): with `ANTHROPIC_BASE_URL`
//! set only `/v1/messages` follows it, while the account calls (`/api/oauth/profile`,
//! `/api/claude_cli/bootstrap`, `/v1/mcp_servers`, `/api/event_logging/v2/batch`, ...) go
//! to `api.anthropic.com` with the bearer anyway; so the broker serves the host itself.
//!
//! For the tests, [`UPSTREAM_PROXY_ENV`] sends the upstream connection through an HTTPS
//! proxy (the lab's mock, `tests/lab/mock_api.py --oauth`) and [`UPSTREAM_CA_ENV`] names
//! the certificate authority to trust instead of the public roots.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use super::upstream::UpstreamProxy;

/// The one host the broker serves.
pub const HOST: &str = "api.anthropic.com";
/// Tests: `host:port` of an HTTPS proxy to reach [`HOST`] through (the lab's mock).
pub const UPSTREAM_PROXY_ENV: &str = "CLAUDEBOX_TEST_BROKER_UPSTREAM_PROXY";
/// Tests: a PEM file of the certificate authority to trust upstream instead of the
/// public roots.
pub const UPSTREAM_CA_ENV: &str = "CLAUDEBOX_TEST_BROKER_UPSTREAM_CA";
/// Tests' control: non-empty keeps Nagle's algorithm on the broker's sockets (as before
/// they were set `TCP_NODELAY`), so that a test can show the delay it measures.
pub const NAGLE_ENV: &str = "CLAUDEBOX_TEST_BROKER_NAGLE";
/// The largest request body passed on (conversations with images are a few MiB).
pub const MAX_BODY: usize = 64 << 20;
const MAX_HEAD: usize = 64 * 1024;
const TIMEOUT: Duration = Duration::from_secs(30);
/// The stand-in's lifetime as written in its `expiresAt`: long enough that claude never
/// tries to refresh it.
const STAND_IN_LIFETIME_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// The stand-in API key's last 20 characters, the same in every sandbox: claude asks once
/// whether to use a key from `ANTHROPIC_API_KEY` and remembers the answer by the key's last
/// 20 characters (`customApiKeyResponses`), so a fixed end keeps that one question per
/// project; the random middle is what the broker checks.
pub const API_KEY_STAND_IN_END: &str = "claudebox-standin-k1";

/// The paths the broker lends the login to (a request carrying the stand-in to any other
/// is refused, 403, naming it): what both pinned claude versions were measured to call
/// with their login, with the reason. Matched by whole path segments ([`lent`]): a row
/// ending `/**` lends the path and every path beneath it, `*` stands for exactly one
/// segment, any other row lends that path alone. Not lent: anything that mints or
/// manages credentials or billing (`/api/oauth/claude_cli/create_api_key`,
/// `/v1/oauth/...`, an organisation's other calls).
pub const LENT_PATHS: &[(&str, &str)] = &[
    (
        "/v1/messages/**",
        "the conversation, titles, the classifier, count_tokens",
    ),
    ("/v1/models/**", "the model list (/model)"),
    (
        "/v1/mcp_servers",
        "the account's MCP connectors, listed at start",
    ),
    ("/v1/files/**", "file uploads of a conversation"),
    (
        "/api/oauth/profile",
        "the account and subscription (what the user sees)",
    ),
    ("/api/oauth/usage", "the subscription's usage (/usage)"),
    ("/api/oauth/claude_cli/roles", "the account's roles"),
    (
        "/api/oauth/organizations/*/referral/eligibility",
        "the organisation's referral eligibility (read at start)",
    ),
    (
        "/api/claude_cli/bootstrap",
        "start-up settings for the account",
    ),
    ("/api/claude_code_penguin_mode", "a feature flag"),
    ("/api/claude_code_grove", "a feature flag"),
    (
        "/api/claude_code/**",
        "the account's Claude Code settings and policy limits (lent as before issue 34, \
         by the old prefix `/api/claude_code`; not measured one by one)",
    ),
    ("/api/event_logging/**", "claude's telemetry batches"),
    ("/api/eval/**", "feature evaluation at start"),
    ("/api/hello", "the warm-up"),
];

/// The segments of a request's path, normalised, or None when the path is one the broker
/// does not judge (it then lends nothing): the query (`?...`) is dropped; the path must
/// start with `/`; each segment is percent-decoded once, and a decoded segment that is
/// empty (`//`; a single trailing `/` is dropped), `.` or `..`, or that holds `/`, `\`,
/// `;`, `%`, a control character or a byte that is no ASCII is refused: a real client
/// sends none of them, and a server upstream may read each of them as something else
/// (dot segments removed, `%2F` as a separator, `;` as a matrix parameter, a second
/// decoding). A `#` is refused too (no fragment travels in a request).
pub fn path_segments(path: &str) -> Option<Vec<String>> {
    let p = path.split('?').next().unwrap_or(path);
    let rest = p.strip_prefix('/')?;
    if p.contains('#') {
        return None;
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let mut out = Vec::new();
    if rest.is_empty() {
        return Some(out);
    }
    for raw in rest.split('/') {
        let seg = percent_decoded(raw)?;
        let bad =
            |c: char| matches!(c, '/' | '\\' | ';' | '%') || c.is_ascii_control() || !c.is_ascii();
        if seg.is_empty() || seg == "." || seg == ".." || seg.chars().any(bad) {
            return None;
        }
        out.push(seg);
    }
    Some(out)
}

/// `s` with each `%XX` decoded once; None for a `%` not followed by two hex digits or
/// bytes that are not UTF-8.
fn percent_decoded(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether the segments `path` match the row `pattern` of [`LENT_PATHS`].
fn row_matches(pattern: &str, path: &[String]) -> bool {
    let (pattern, subtree) = match pattern.strip_suffix("/**") {
        Some(p) => (p, true),
        None => (pattern, false),
    };
    let want: Vec<&str> = pattern.trim_start_matches('/').split('/').collect();
    if path.len() < want.len() || (!subtree && path.len() != want.len()) {
        return false;
    }
    want.iter().zip(path).all(|(w, s)| *w == "*" || w == s)
}

/// Whether a request for `path` may carry the host's token: its normalised segments
/// ([`path_segments`]) match a row of [`LENT_PATHS`] whole, and no segment names API
/// keys (a second guard for the `/**` rows).
pub fn lent(path: &str) -> bool {
    let Some(segs) = path_segments(path) else {
        return false;
    };
    let keys = |s: &String| {
        let l = s.to_ascii_lowercase().replace('-', "_");
        l.contains("api_key")
    };
    !segs.iter().any(keys) && LENT_PATHS.iter().any(|(row, _)| row_matches(row, &segs))
}

/// Headers of one hop, not passed on (RFC 9110 7.6.1), in either direction.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

pub struct Broker {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    /// The access token written in the sandbox's stand-in login.
    stand_in: String,
    stand_in_refresh: String,
    /// The host's `.credentials.json`, when it lends an OAuth login.
    credentials: Option<PathBuf>,
    /// The API key it lends (`ANTHROPIC_API_KEY` of the launcher), and the stand-in for it.
    api_key: Option<(String, String)>,
    /// The user's `apiKeyHelper`, run here on the host, and the stand-in for its key.
    helper: Option<(helper::Helper, String)>,
    /// Where the upstream connections go through: the tests' proxy, else the user's own
    /// (`https_proxy` / `HTTPS_PROXY` of the launcher, minus `NO_PROXY`).
    upstream_proxy: Option<UpstreamProxy>,
    /// `TCP_NODELAY` on both sides of a request (false only as a test's control).
    nodelay: bool,
    /// The certificate authority's certificate, for the sandbox to trust.
    pub ca_pem: String,
    /// One refresh at a time in this process (the lock on disk is for the others).
    refreshing: std::sync::Mutex<()>,
    /// The last refresh token the token endpoint refused (or that could not be spent).
    refused: std::sync::Mutex<Option<String>>,
    /// An access token a refresh after a 401 gave, which upstream refused too: a 401 to it
    /// is not answered by another refresh (a 401 a refresh does not cure would otherwise
    /// spend one per request).
    futile: std::sync::Mutex<Option<String>>,
}

/// `n` random bytes as hex, from the kernel.
pub(crate) fn random_hex(n: usize) -> Result<String> {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("cannot read /dev/urandom")?;
    Ok(hex::encode(b))
}

impl Broker {
    pub fn new(
        credentials: Option<PathBuf>,
        api_key: Option<String>,
        helper_settings: Option<&std::path::Path>,
    ) -> Result<Broker> {
        // First, so that a helper that fails ends the launch before anything is made.
        let helper = match helper_settings {
            Some(s) => Some((
                helper::Helper::from_settings(s)?,
                format!("sk-ant-api03-claudebox-stand-in-helper-{}", random_hex(32)?),
            )),
            None => None,
        };
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name.push(
            DnType::CommonName,
            "claudebox login broker (one sandbox only)",
        );
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;
        let mut leaf = CertificateParams::new(vec![HOST.to_string()])?;
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        leaf.distinguished_name.push(DnType::CommonName, HOST);
        let leaf_key = KeyPair::generate()?;
        let leaf_cert = leaf.signed_by(&leaf_key, &ca_cert, &ca_key)?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf_cert.der().clone(), ca_cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
            )?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];

        let mut roots = rustls::RootCertStore::empty();
        match crate::host::test_switch::get(UPSTREAM_CA_ENV).filter(|v| !v.is_empty()) {
            Some(path) => {
                let pem = std::fs::read(&path).context("cannot read the tests' upstream CA")?;
                for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                    roots.add(cert?)?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];

        Ok(Broker {
            server: Arc::new(server),
            client: Arc::new(client),
            stand_in: format!("sk-ant-oat01-claudebox-stand-in-{}", random_hex(32)?),
            stand_in_refresh: format!("sk-ant-ort01-claudebox-stand-in-{}", random_hex(32)?),
            credentials,
            api_key: match api_key {
                Some(k) => Some((
                    k,
                    format!(
                        "sk-ant-api03-claudebox-stand-in-{}-{API_KEY_STAND_IN_END}",
                        random_hex(32)?
                    ),
                )),
                None => None,
            },
            helper,
            upstream_proxy: match crate::host::test_switch::get(UPSTREAM_PROXY_ENV)
                .and_then(|v| v.into_string().ok())
                .filter(|v| !v.is_empty())
            {
                Some(addr) => Some(UpstreamProxy {
                    addr,
                    auth: None,
                    label: "the test upstream proxy".into(),
                    no_proxy: Vec::new(),
                }),
                None => UpstreamProxy::from_env()?,
            },
            nodelay: !crate::host::test_switch::on(NAGLE_ENV),
            ca_pem: ca_cert.pem(),
            refreshing: std::sync::Mutex::new(()),
            refused: std::sync::Mutex::new(None),
            futile: std::sync::Mutex::new(None),
        })
    }

    /// Whether a `CONNECT` to `host:port` is the broker's.
    pub fn serves(host: &str, port: u16) -> bool {
        port == 443 && host.eq_ignore_ascii_case(HOST)
    }

    /// Whether it lends the host's OAuth login.
    pub fn lends_login(&self) -> bool {
        self.credentials.is_some()
    }

    /// The stand-in API key the sandbox gets (`ANTHROPIC_API_KEY` inside), when it lends
    /// one.
    pub fn stand_in_api_key(&self) -> Option<&str> {
        self.api_key.as_ref().map(|(_, s)| s.as_str())
    }

    /// The stand-in key claude's `apiKeyHelper` prints inside, when it lends one.
    pub fn stand_in_helper_key(&self) -> Option<&str> {
        self.helper.as_ref().map(|(_, s)| s.as_str())
    }

    /// The host's login as JSON (`claudeAiOauth`), read now.
    fn host_login(&self) -> Result<serde_json::Value> {
        Ok(self.host_file()?["claudeAiOauth"].clone())
    }

    /// The stand-in `.credentials.json` for the sandbox: the host login's scopes and
    /// subscription (so claude behaves as that subscriber), random tokens.
    pub fn stand_in_credentials(&self) -> Result<String> {
        let real = self.host_login()?;
        let now = now_ms();
        let mut login = serde_json::json!({
            "accessToken": self.stand_in,
            "refreshToken": self.stand_in_refresh,
            "expiresAt": now + STAND_IN_LIFETIME_MS,
        });
        for k in ["scopes", "subscriptionType", "rateLimitTier"] {
            if let Some(v) = real.get(k) {
                login[k] = v.clone();
            }
        }
        Ok(serde_json::json!({ "claudeAiOauth": login }).to_string())
    }

    /// The host's access token, refreshed first when it expires within
    /// [`REFRESH_MARGIN_MS`]: under claude's own lock (`.oauth_refresh.lock` beside the
    /// host's file), re-read under it (another claude may have just refreshed), so that
    /// a refresh token is spent once.
    fn access_token(&self) -> Result<String, Refusal> {
        let no_login = |e: anyhow::Error| Refusal(502, format!("{e:#}"));
        let login = self.host_login().map_err(no_login)?;
        if !expiring(&login) {
            return token_of(&login);
        }
        let _one = self.refreshing.lock().unwrap_or_else(|e| e.into_inner());
        let dir = self
            .credentials
            .as_deref()
            .and_then(|c| c.parent())
            .ok_or_else(|| Refusal(502, "the host's login has no directory".into()))?;
        let Some(_lock) = crate::state::credsync::RefreshLock::take(dir) else {
            return Err(Refusal(
                503,
                "the host's login is being refreshed by another claude; try again".into(),
            ));
        };
        let login = self.host_login().map_err(no_login)?;
        if !expiring(&login) {
            return token_of(&login);
        }
        let logged_out = |why: String| {
            Refusal(
                401,
                format!(
                    "the host's login could not be refreshed ({why}); log in again on the \
                     host (claude, /login)"
                ),
            )
        };
        // A refresh token refused once is not spent again (every request would):
        // until the host's file has another one, the answer is the same.
        let refresh = login["refreshToken"].as_str().unwrap_or("").to_string();
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.as_deref() == Some(refresh.as_str()) {
            return Err(logged_out("its refresh token was refused".into()));
        }
        match self.refresh(&login) {
            Ok(fresh) => token_of(&fresh),
            Err(e) => {
                *refused = Some(refresh);
                Err(logged_out(format!("{e:#}")))
            }
        }
    }

    /// Spends the host login's refresh token at claude's token endpoint and writes the
    /// new pair into the host's file (a new file renamed over it, as claude does).
    fn refresh(&self, login: &serde_json::Value) -> Result<serde_json::Value> {
        let refresh = login["refreshToken"]
            .as_str()
            .filter(|r| !r.is_empty())
            .context("the host's login has no refresh token")?;
        let mut req = serde_json::json!({
            "grant_type": "refresh_token",
            "refresh_token": refresh,
            "client_id": CLIENT_ID,
        });
        if let Some(scopes) = login["scopes"].as_array() {
            let s: Vec<&str> = scopes.iter().filter_map(|v| v.as_str()).collect();
            req["scope"] = s.join(" ").into();
        }
        let body = req.to_string();
        let mut up = self.connect_upstream(TOKEN_HOST)?;
        write!(
            up,
            "POST {TOKEN_PATH} HTTP/1.1\r\nhost: {TOKEN_HOST}\r\ncontent-type: application/json\r\n\
             accept: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )?;
        up.flush()?;
        let _ = up.sock.set_read_timeout(Some(TIMEOUT));
        let mut raw = Vec::new();
        // The end of the stream without TLS's close_notify still ends the answer.
        let _ = Read::by_ref(&mut up).take(1 << 20).read_to_end(&mut raw);
        let (status, answer) = parse_answer(&raw)?;
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
        if status != 200 {
            bail!(
                "{TOKEN_HOST} answered {status} {}",
                v["error"].as_str().unwrap_or("")
            );
        }
        let access = v["access_token"]
            .as_str()
            .context("no access_token in the answer")?;
        let now = now_ms();
        let mut file = self.host_file()?;
        let o = &mut file["claudeAiOauth"];
        o["accessToken"] = access.into();
        if let Some(r) = v["refresh_token"].as_str() {
            o["refreshToken"] = r.into();
        }
        o["expiresAt"] = (now + v["expires_in"].as_u64().unwrap_or(3600) * 1000).into();
        if let Some(scope) = v["scope"].as_str() {
            o["scopes"] = scope.split(' ').collect::<Vec<_>>().into();
        }
        let fresh = o.clone();
        self.write_host_file(&file)?;
        Ok(fresh)
    }

    /// The host's whole `.credentials.json`.
    fn host_file(&self) -> Result<serde_json::Value> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(
                self.credentials
                    .as_deref()
                    .context("no OAuth login is lent")?,
            )
            .context("cannot read the host's login")?;
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            bail!("the host's login is not a regular file");
        }
        let mut text = String::new();
        Read::by_ref(&mut f)
            .take(1 << 20)
            .read_to_string(&mut text)
            .context("cannot read the host's login")?;
        serde_json::from_str(&text).context("the host's login is not JSON")
    }

    /// A new file beside the host's, renamed over it (mode 0600).
    fn write_host_file(&self, v: &serde_json::Value) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let credentials = self
            .credentials
            .as_deref()
            .context("no OAuth login is lent")?;
        let mut tmp = credentials.as_os_str().to_os_string();
        tmp.push(format!(".claudebox-broker.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)
            .context("cannot write the host's login")?;
        let done = f
            .write_all(v.to_string().as_bytes())
            .and_then(|()| f.sync_all())
            .and_then(|()| std::fs::rename(&tmp, credentials));
        if done.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        done.context("cannot write the host's login")
    }

    /// Serves one request of a `CONNECT api.anthropic.com:443` tunnel whose `200` the
    /// client has had; `rest` are bytes it sent after the `CONNECT` head. Returns the
    /// refusal when it refused the request (for the denied log).
    pub fn serve(&self, client: TcpStream, rest: &[u8]) -> Option<Refused> {
        let _ = client.set_read_timeout(Some(TIMEOUT));
        let _ = client.set_write_timeout(Some(TIMEOUT));
        // TLS sends small records one after the other (the handshake's flights, a
        // response's head then its body): with Nagle's algorithm on, each one after the
        // first waits for the peer's delayed ACK, ~40 ms per request (measured:
        // BENCHMARKS.md, "the login broker per request").
        let _ = client.set_nodelay(self.nodelay);
        let Ok(conn) = rustls::ServerConnection::new(self.server.clone()) else {
            return None;
        };
        let mut tls = rustls::StreamOwned::new(
            conn,
            Prefixed {
                pre: rest.to_vec(),
                at: 0,
                s: client,
            },
        );
        let mut seen = (String::new(), String::new());
        if let Err(Refusal(code, why)) = self.one_request(&mut tls, &mut seen) {
            let body = format!("claudebox login broker: {why}\n");
            let _ = write!(
                tls,
                "HTTP/1.1 {code} {}\r\ncontent-type: text/plain; charset=utf-8\r\n\
                 content-length: {}\r\nconnection: close\r\nx-claudebox: broker\r\n\r\n{body}",
                reason(code),
                body.len()
            );
            tls.conn.send_close_notify();
            let _ = tls.flush();
            linger(&mut tls.sock.s);
            let (method, path) = seen;
            return Some(Refused {
                code,
                method,
                path,
                why,
            });
        }
        tls.conn.send_close_notify();
        let _ = tls.flush();
        None
    }

    /// One request; `seen` gets its method and path (without the query) once parsed.
    fn one_request<S: Read + Write>(
        &self,
        tls: &mut S,
        seen: &mut (String, String),
    ) -> Result<(), Refusal> {
        let (head, buf) = read_head(tls).map_err(|e| Refusal(400, e.to_string()))?;
        let mut hs = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut hs);
        let Ok(httparse::Status::Complete(len)) = req.parse(&buf) else {
            return Err(Refusal(400, "malformed request".into()));
        };
        debug_assert_eq!(len, head);
        let method = req.method.unwrap_or_default().to_string();
        let path = req.path.unwrap_or_default().to_string();
        *seen = (
            method.clone(),
            path.split('?').next().unwrap_or("").to_string(),
        );
        if !path.starts_with('/') {
            return Err(Refusal(400, "the request target must be a path".into()));
        }
        let mut length = 0usize;
        let mut out = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
        let mut host_seen = false;
        // What was lent, and where in `out` its bytes are (for a retry after a 401).
        let mut lent_as: Option<Lent> = None;
        let mut spans: Vec<(usize, usize)> = Vec::new();
        let mut mixed = false;
        for h in req.headers.iter() {
            let name = h.name.to_ascii_lowercase();
            if HOP_BY_HOP.contains(&name.as_str()) {
                continue;
            }
            match name.as_str() {
                "transfer-encoding" => {
                    return Err(Refusal(
                        411,
                        "only requests with a Content-Length are passed on".into(),
                    ))
                }
                "content-length" => {
                    length = std::str::from_utf8(h.value)
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                        .ok_or_else(|| Refusal(400, "bad Content-Length".into()))?;
                    if length > MAX_BODY {
                        return Err(Refusal(413, format!("body over {MAX_BODY} bytes")));
                    }
                }
                "host" => {
                    let v = String::from_utf8_lossy(h.value);
                    let v = v.trim();
                    if !(v.eq_ignore_ascii_case(HOST)
                        || v.eq_ignore_ascii_case(&format!("{HOST}:443")))
                    {
                        return Err(Refusal(421, format!("this tunnel serves {HOST} only")));
                    }
                    host_seen = true;
                }
                "authorization" | "x-api-key" if self.is_helper_stand_in(&name, h.value) => {
                    if !lent(&path) {
                        return Err(Refusal(
                            403,
                            format!(
                                "{} is not lent the apiKeyHelper's key (only what claude was \
                                 measured to call: docs/security.md)",
                                path.split('?').next().unwrap_or("")
                            ),
                        ));
                    }
                    let (helper, _) = self
                        .helper
                        .as_ref()
                        .ok_or_else(|| Refusal(502, "no apiKeyHelper".into()))?;
                    let real = helper.key().map_err(|e| {
                        Refusal(502, format!("your apiKeyHelper failed on the host: {e:#}"))
                    })?;
                    if name == "x-api-key" {
                        out.extend_from_slice(b"x-api-key: ");
                    } else {
                        out.extend_from_slice(b"authorization: Bearer ");
                    }
                    spans.push((out.len(), real.len()));
                    out.extend_from_slice(real.as_bytes());
                    out.extend_from_slice(b"\r\n");
                    mixed |= matches!(lent_as, Some(Lent::Login(_)));
                    lent_as = Some(Lent::Helper(real));
                    continue;
                }
                "authorization" if h.value == format!("Bearer {}", self.stand_in).as_bytes() => {
                    if !lent(&path) {
                        return Err(Refusal(
                            403,
                            format!(
                                "{} is not lent the login (only what claude was measured to \
                                 call: docs/security.md)",
                                path.split('?').next().unwrap_or("")
                            ),
                        ));
                    }
                    let real = self.access_token()?;
                    out.extend_from_slice(b"authorization: Bearer ");
                    spans.push((out.len(), real.len()));
                    out.extend_from_slice(real.as_bytes());
                    out.extend_from_slice(b"\r\n");
                    mixed |= matches!(lent_as, Some(Lent::Helper(_)));
                    lent_as = Some(Lent::Login(real));
                    continue;
                }
                "x-api-key" => {
                    if let Some((real, stand_in)) = &self.api_key {
                        if h.value == stand_in.as_bytes() {
                            if !lent(&path) {
                                return Err(Refusal(
                                    403,
                                    format!(
                                        "{} is not lent the API key (only what claude was \
                                         measured to call: docs/security.md)",
                                        path.split('?').next().unwrap_or("")
                                    ),
                                ));
                            }
                            out.extend_from_slice(b"x-api-key: ");
                            out.extend_from_slice(real.as_bytes());
                            out.extend_from_slice(b"\r\n");
                            continue;
                        }
                    }
                }
                _ => {}
            }
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
        if !host_seen {
            out.extend_from_slice(format!("host: {HOST}\r\n").as_bytes());
        }
        out.extend_from_slice(b"connection: close\r\n\r\n");
        let mut body = buf[head..].to_vec();
        if body.len() > length {
            return Err(Refusal(400, "more bytes than the Content-Length".into()));
        }
        let start = body.len();
        body.resize(length, 0);
        tls.read_exact(&mut body[start..])
            .map_err(|_| Refusal(400, "the body ended early".into()))?;

        let (mut up, mut answer) = self.send(&out, &body)?;
        if mixed {
            // Both lent in one request (no request claude makes): no retry to splice.
            lent_as = None;
        }
        // A 401 to what the broker lent: once, with the login re-read or refreshed (or the
        // helper run again), when that gives another credential; never twice.
        if let (Some(401), Some(lent)) = (answer.as_ref().map(|a| a.1), &lent_as) {
            if let Some(fresh) = self.after_401(lent) {
                let mut again = Vec::with_capacity(out.len() + fresh.len());
                let mut at = 0;
                for &(start, len) in &spans {
                    again.extend_from_slice(&out[at..start]);
                    again.extend_from_slice(fresh.as_bytes());
                    at = start + len;
                }
                again.extend_from_slice(&out[at..]);
                (up, answer) = self.send(&again, &body)?;
                if matches!(lent, Lent::Login(_)) && answer.as_ref().is_some_and(|a| a.1 == 401) {
                    *self.futile.lock().unwrap_or_else(|e| e.into_inner()) = Some(fresh);
                }
            }
        }
        drop(out);
        relay_response(&mut up, answer, tls);
        Ok(())
    }

    /// Sends one request upstream and reads the head of its answer (`None` when there is
    /// no whole head): the stream, and the head's length, status and bytes read so far.
    fn send(&self, head: &[u8], body: &[u8]) -> Result<(Upstream, Option<Answer>), Refusal> {
        let mut up = self
            .connect_upstream(HOST)
            .map_err(|e| Refusal(502, format!("{e:#}")))?;
        // Head and body in one write: sent at once, not as two small writes (the second
        // would wait for the peer's ACK of the first without TCP_NODELAY).
        let mut request = Vec::with_capacity(head.len() + body.len());
        request.extend_from_slice(head);
        request.extend_from_slice(body);
        up.write_all(&request)
            .and_then(|()| up.flush())
            .map_err(|e| Refusal(502, format!("{HOST}: {e}")))?;
        drop(request);
        let answer = read_head(&mut up).ok().map(|(n, buf)| {
            let mut hs = [httparse::EMPTY_HEADER; 100];
            let mut resp = httparse::Response::new(&mut hs);
            let code = match resp.parse(&buf) {
                Ok(httparse::Status::Complete(_)) => resp.code.unwrap_or(0),
                _ => 0,
            };
            (n, code, buf)
        });
        Ok((up, answer))
    }

    /// After upstream refused `lent` (401): the credential to try once more, if there is
    /// another. The login: the host's file as it is now (the host's claude may have
    /// refreshed it), else a refresh under claude's lock, unless its refresh token was
    /// refused before (a dead token is never spent twice). The helper: run again.
    fn after_401(&self, lent: &Lent) -> Option<String> {
        match lent {
            Lent::Helper(used) => {
                let (helper, _) = self.helper.as_ref()?;
                helper.forget();
                helper.key().ok().filter(|k| k != used)
            }
            Lent::Login(used) => {
                let changed =
                    |login: &serde_json::Value| token_of(login).ok().filter(|t| t != used);
                if let Some(t) = self.host_login().ok().as_ref().and_then(changed) {
                    return Some(t);
                }
                let _one = self.refreshing.lock().unwrap_or_else(|e| e.into_inner());
                let dir = self.credentials.as_deref().and_then(|c| c.parent())?;
                let _lock = crate::state::credsync::RefreshLock::take(dir)?;
                let login = self.host_login().ok()?;
                if let Some(t) = changed(&login) {
                    return Some(t);
                }
                let refresh = login["refreshToken"].as_str().unwrap_or("").to_string();
                let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                let futile = self.futile.lock().unwrap_or_else(|e| e.into_inner());
                if refused.as_deref() == Some(refresh.as_str())
                    || futile.as_deref() == Some(used.as_str())
                {
                    return None;
                }
                drop(futile);
                match self.refresh(&login) {
                    Ok(fresh) => token_of(&fresh).ok().filter(|t| t != used),
                    Err(_) => {
                        *refused = Some(refresh);
                        None
                    }
                }
            }
        }
    }

    /// Whether a header is the helper's stand-in key (`x-api-key: K` or
    /// `authorization: Bearer K`: claude sends the helper's key in both).
    fn is_helper_stand_in(&self, name: &str, value: &[u8]) -> bool {
        let Some((_, stand_in)) = &self.helper else {
            return false;
        };
        match name {
            "x-api-key" => value == stand_in.as_bytes(),
            _ => value == format!("Bearer {stand_in}").as_bytes(),
        }
    }

    /// A TLS connection to `host:443` (checked as `host`), through the upstream proxy
    /// unless `NO_PROXY` names the host.
    fn connect_upstream(&self, host: &str) -> Result<Upstream> {
        let tcp = match self.upstream_proxy.as_ref().filter(|p| !p.bypassed(host)) {
            Some(proxy) => proxy.connect(host, 443)?,
            None => {
                TcpStream::connect((host, 443)).with_context(|| format!("cannot reach {host}"))?
            }
        };
        tcp.set_write_timeout(Some(TIMEOUT))?;
        // As for the client's side (`serve`): no Nagle wait between TLS records.
        tcp.set_nodelay(self.nodelay)?;
        let name = ServerName::try_from(host.to_string())?;
        let conn = rustls::ClientConnection::new(self.client.clone(), name)?;
        Ok(rustls::StreamOwned::new(conn, tcp))
    }
}

/// The user's `apiKeyHelper`, run on the host as claude runs it (`sh -c`), its key kept
/// as long as claude keeps one (`CLAUDE_CODE_API_KEY_HELPER_TTL_MS`, 5 minutes unset).
mod helper {
    use std::path::Path;
    use std::process::Command;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use anyhow::{bail, Context, Result};

    /// Claude's own default for how long a helper's key is used (measured with both
    /// pinned versions: a helper runs again for a request once this has passed).
    const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);
    /// A helper that has not answered by then is taken as failed.
    const LIMIT: Duration = Duration::from_secs(60);

    pub struct Helper {
        command: String,
        ttl: Duration,
        key: Mutex<Option<(String, Instant)>>,
    }

    impl Helper {
        /// The `apiKeyHelper` of the user's `settings.json`, run once now: a helper that
        /// fails fails the launch.
        pub fn from_settings(settings: &Path) -> Result<Helper> {
            let text = std::fs::read_to_string(settings)
                .with_context(|| format!("cannot read {}", settings.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", settings.display()))?;
            let command = v["apiKeyHelper"]
                .as_str()
                .filter(|c| !c.trim().is_empty())
                .with_context(|| format!("{} has no apiKeyHelper", settings.display()))?
                .to_string();
            let ttl = std::env::var("CLAUDE_CODE_API_KEY_HELPER_TTL_MS")
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .map_or(DEFAULT_TTL, Duration::from_millis);
            let h = Helper {
                command,
                ttl,
                key: Mutex::new(None),
            };
            h.key()?;
            Ok(h)
        }

        /// The helper's key: the one it printed last while younger than the TTL, else
        /// what it prints now.
        pub fn key(&self) -> Result<String> {
            let mut k = self.key.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((key, at)) = k.as_ref() {
                if at.elapsed() < self.ttl {
                    return Ok(key.clone());
                }
            }
            let key = run(&self.command)?;
            *k = Some((key.clone(), Instant::now()));
            Ok(key)
        }

        /// Forgets the key (the API refused it): the next request runs the helper again.
        pub fn forget(&self) {
            *self.key.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// Runs `sh -c command` (stdin empty, stderr kept for the reason) and returns its
    /// first line of output.
    fn run(command: &str) -> Result<String> {
        let mut sh = Command::new("/bin/sh");
        // The proxy runs in `/` already (`host::companion::Outside`); said again here, as
        // what keeps the helper from importing what the agent planted in the project.
        sh.arg("-c").arg(command);
        if !crate::host::companion::in_launchers_dir() {
            sh.current_dir(crate::policy::companion_env::WORKDIR);
        }
        let ran = crate::host::exec::run_with_timeout(&mut sh, LIMIT).context("apiKeyHelper")?;
        let Some(status) = ran.status else {
            bail!(
                "your apiKeyHelper (run on the host) gave no key within {} s",
                LIMIT.as_secs()
            );
        };
        if !status.success() {
            let why = String::from_utf8_lossy(&ran.stderr);
            let why = why.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            let code = status
                .code()
                .map_or_else(|| "a signal".to_string(), |c| c.to_string());
            bail!(
                "your apiKeyHelper (run on the host) exited with {code}{}{}",
                if why.is_empty() { "" } else { ": " },
                crate::policy::escape::shown(why)
            );
        }
        let key = String::from_utf8_lossy(&ran.stdout).trim().to_string();
        if key.is_empty() || key.contains(char::is_whitespace) {
            bail!("your apiKeyHelper (run on the host) printed no key (one line, no spaces)");
        }
        Ok(key)
    }
}

/// One TLS connection to the upstream.
type Upstream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;
/// The head of an upstream answer: its length, its status, every byte read so far.
type Answer = (usize, u16, Vec<u8>);

/// What the broker put in a request in place of the stand-in.
enum Lent {
    /// The host login's access token.
    Login(String),
    /// The key the user's apiKeyHelper printed.
    Helper(String),
}

/// A request the broker refused: what the agent sent (unescaped) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub code: u16,
    /// Empty when the request was not parsed.
    pub method: String,
    /// Without its query; empty when the request was not parsed.
    pub path: String,
    pub why: String,
}

/// Claude Code's OAuth client id and token endpoint (measured: what both pinned versions
/// send when they refresh).
const CLIENT_ID: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";
const TOKEN_HOST: &str = "platform.claude.com";
const TOKEN_PATH: &str = "/v1/oauth/token";
/// Refresh when the access token expires within this (claude's own margin: 5 minutes).
const REFRESH_MARGIN_MS: u64 = 5 * 60 * 1000;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn expiring(login: &serde_json::Value) -> bool {
    login["expiresAt"]
        .as_u64()
        .is_none_or(|t| t < now_ms() + REFRESH_MARGIN_MS)
}

fn token_of(login: &serde_json::Value) -> Result<String, Refusal> {
    login["accessToken"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| Refusal(502, "the host has no OAuth login to lend".into()))
}

/// The status and body of a whole HTTP/1.1 answer (`Content-Length`, chunked, or up to
/// the end of the stream).
fn parse_answer(raw: &[u8]) -> Result<(u16, Vec<u8>)> {
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut hs);
    let httparse::Status::Complete(n) = resp.parse(raw)? else {
        bail!("a partial answer");
    };
    let chunked = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            && String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("chunked")
    });
    let status = resp.code.unwrap_or(0);
    let mut body = &raw[n..];
    if !chunked {
        return Ok((status, body.to_vec()));
    }
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("a bad chunk")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .context("a bad chunk size")?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok((status, out));
        }
        if body.len() < size + 2 {
            bail!("a cut chunk");
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// Passes the upstream's response to the client: its head with `connection: close`
/// instead of its own hop-by-hop headers, then every byte until the upstream ends.
fn relay_response<U: Read, C: Write>(up: &mut U, answer: Option<Answer>, client: &mut C) {
    let Some((head, _, buf)) = answer else {
        let _ = client.write_all(
            b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        );
        return;
    };
    let mut hs = [httparse::EMPTY_HEADER; 100];
    let mut resp = httparse::Response::new(&mut hs);
    if !matches!(resp.parse(&buf), Ok(httparse::Status::Complete(_))) {
        return;
    }
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        resp.code.unwrap_or(502),
        resp.reason.unwrap_or("")
    )
    .into_bytes();
    for h in resp.headers.iter() {
        if HOP_BY_HOP.contains(&h.name.to_ascii_lowercase().as_str()) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out.extend_from_slice(&buf[head..]);
    if client
        .write_all(&out)
        .and_then(|()| client.flush())
        .is_err()
    {
        return;
    }
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match up.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if client
                    .write_all(&chunk[..n])
                    .and_then(|()| client.flush())
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// Reads until a whole HTTP head; returns its length and every byte read.
fn read_head<S: Read>(s: &mut S) -> io::Result<(usize, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok((i + 4, buf));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::other("request head too large"));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::other("the connection ended before a whole head"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

struct Refusal(u16, String);

fn reason(code: u16) -> &'static str {
    match code {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        411 => "Length Required",
        413 => "Content Too Large",
        421 => "Misdirected Request",
        503 => "Service Unavailable",
        _ => "Bad Gateway",
    }
}

/// Ends a refused client's connection without losing the answer: a socket closed with
/// unread bytes (the body of a request refused by its head) is reset, and a reset can
/// reach the client before the refusal it was sent (TCP drops what it had not yet
/// handed over). So our side is shut, and what the client still sends is read and thrown
/// away until it closes, for at most a second and 1 MiB.
fn linger(s: &mut TcpStream) {
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let end = std::time::Instant::now() + Duration::from_secs(1);
    let mut buf = [0u8; 16 * 1024];
    let mut left = 1usize << 20;
    while left > 0 && std::time::Instant::now() < end {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// The client's socket, with the bytes it sent after its `CONNECT` head read first.
struct Prefixed {
    pre: Vec<u8>,
    at: usize,
    s: TcpStream,
}

impl Read for Prefixed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at < self.pre.len() {
            let n = buf.len().min(self.pre.len() - self.at);
            buf[..n].copy_from_slice(&self.pre[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        self.s.read(buf)
    }
}

impl Write for Prefixed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a 401, a login the host's claude refreshed meanwhile is taken as it is (no
    /// refresh spent); the same token with its refresh token refused before, or one a
    /// refresh gave that upstream refused too, is not refreshed again (nothing to retry).
    #[test]
    fn after_a_401_the_hosts_new_login_is_taken_and_a_dead_token_is_not_spent_again() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join(".credentials.json");
        let login = |access: &str| {
            serde_json::json!({"claudeAiOauth": {
                "accessToken": access, "refreshToken": "r-dead",
                "expiresAt": now_ms() + 3_600_000}})
            .to_string()
        };
        std::fs::write(&creds, login("a-new")).unwrap();
        let b = Broker::new(Some(creds.clone()), None, None).unwrap();
        assert_eq!(
            b.after_401(&Lent::Login("a-old".into())),
            Some("a-new".into())
        );
        *b.refused.lock().unwrap() = Some("r-dead".into());
        assert_eq!(b.after_401(&Lent::Login("a-new".into())), None);
        // A token a refresh gave and upstream refused too: no refresh for it again.
        *b.refused.lock().unwrap() = None;
        *b.futile.lock().unwrap() = Some("a-new".into());
        assert_eq!(b.after_401(&Lent::Login("a-new".into())), None);
        assert!(!dir.path().join(".oauth_refresh.lock").exists());
    }

    /// Claude's own calls are lent (the controls: each attempt below differs from one of
    /// them by what it adds); a path sharing a row's prefix but not its whole segments,
    /// or one a server upstream could read as another path, is not.
    #[test]
    fn the_login_is_lent_to_claudes_own_calls_only() {
        for p in [
            "/v1/messages",
            "/v1/messages?beta=true",
            "/v1/messages/count_tokens",
            "/v1/messages/count_tokens?beta=true",
            "/v1/models?beta=true",
            "/v1/mcp_servers?limit=1000",
            "/v1/files/file_011/content?beta=true",
            "/api/oauth/profile",
            "/api/oauth/usage",
            "/api/oauth/claude_cli/roles",
            "/api/claude_cli/bootstrap?entrypoint=sdk-cli",
            "/api/claude_code_penguin_mode",
            "/api/claude_code_grove",
            "/api/claude_code/settings",
            "/api/event_logging/v2/batch",
            "/api/eval/sdk-abc",
            "/api/hello",
            "/api/hello/",
            "/api/oauth/organizations/00000000-0000-4000-8000-00000000b001/referral/eligibility",
            "/api/oauth/organizations/00000000-0000-4000-8000-00000000b001/referral/eligibility?campaign=x",
            // Percent-encoding of a plain character is decoded before matching.
            "/v1/m%65ssages",
        ] {
            assert!(lent(p), "{p}");
        }
        for p in [
            // Issue 34's attempts: a row's prefix without a segment boundary, and a path
            // beneath the organisations' row that is no call claude makes.
            "/api/hellox",
            "/v1/messages_anything",
            "/v1/messagesx/count_tokens",
            "/api/oauth/organizations/x/api-keys",
            "/api/oauth/organizations/x/api_keys",
            "/api/oauth/organizations/x/referral/eligibility/x",
            "/api/oauth/organizations/x/setup_overage_billing",
            "/api/oauth/organizations//referral/eligibility",
            "/api/oauth/profilex",
            "/api/oauth/profile/x",
            "/api/claude_codex",
            "/api/claude_code_shared_session_transcripts",
            "/api/evalx",
            "/api/hello/x",
            // Minting and the token endpoint.
            "/api/oauth/claude_cli/create_api_key",
            "/v1/oauth/token",
            "/v1/messages/api_keys",
            "/v1/messages/API-KEY",
            // Dot segments, raw and encoded (once and twice), separators hidden in a
            // segment, empty segments, matrix parameters, fragments, backslashes.
            "/v1/messages/../../v1/oauth/token",
            "/v1/messages/./count_tokens",
            "/v1/messages/%2E%2E/%2e%2e/v1/oauth/token",
            "/v1/messages/%2e./v1/oauth/token",
            "/v1/messages/%252e%252e/v1/oauth/token",
            "/v1/messages%2F..%2F..%2Fv1%2Foauth%2Ftoken",
            "/v1/messages%2fcount_tokens",
            "//v1/messages",
            "/v1//messages",
            "/v1/messages;/../../v1/oauth/token",
            "/v1/messages;x",
            "/v1/messages#x",
            "/v1/messages\\..\\..\\v1\\oauth",
            "/v1/messages/%00",
            "/v1/messages/%zz",
            "/v1/messages/%c3%a9",
            "v1/messages",
            "*",
            "/admin",
            "/",
            "",
        ] {
            assert!(!lent(p), "{p}");
        }
    }

    /// The control: the matcher before issue 34 (a row's text as a prefix of the path, dot
    /// segments and `%2e` refused) lent issue 34's attempts.
    #[test]
    fn matching_by_prefix_lent_the_attempts() {
        let by_prefix = |p: &str| {
            ["/api/hello", "/v1/messages", "/api/oauth/organizations/"]
                .iter()
                .any(|r| p.starts_with(r))
        };
        for p in [
            "/api/hellox",
            "/v1/messages_anything",
            "/api/oauth/organizations/x/api-keys",
        ] {
            assert!(by_prefix(p) && !lent(p), "{p}");
        }
    }

    #[test]
    fn segments_are_normalised_or_refused() {
        let s = |p: &str| path_segments(p).map(|v| v.join("|"));
        assert_eq!(s("/a/b/?q=../x"), Some("a|b".into()));
        assert_eq!(s("/a%62/c"), Some("ab|c".into()));
        assert_eq!(s("/"), Some(String::new()));
        for bad in [
            "/a//b",
            "/a/./b",
            "/a/%2e%2E/b",
            "/a;b",
            "/a%3bb",
            "/a%5cb",
            "/a%25b",
            "/a%2",
        ] {
            assert_eq!(s(bad), None, "{bad}");
        }
    }
}
