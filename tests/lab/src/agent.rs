//! The real agents in the lab: the real Claude Code (and Codex) against a local mock of the Anthropic Messages API
//! (`tests/lab/mock_api.py`, Python 3 stdlib). A test starts the mock with a script,
//! points claude at `base_url()`, and reads back every request claude sent.
//!
//! The Claude Code binaries come from `CLAUDEBOX_TEST_CLAUDE` (the pinned version) and
//! `CLAUDEBOX_TEST_CLAUDE_LATEST` (the newest on npm); `scripts/test` installs and exports
//! both. A test that needs them fails when they are missing, unless `CLAUDEBOX_SKIP_E2E=1`.

use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{stderr, stdout, World};

pub const MOCK_API: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/mock_api.py");
/// The mock of OpenAI's Responses API, for the real Codex CLI (`--agent codex`).
pub const MOCK_OPENAI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/mock_openai.py");

/// The API key the tests give claude (and approve in the seeded `~/.claude.json`).
pub const API_KEY: &str = "sk-ant-api03-claudebox-lab-key-0123456789";

/// One Claude Code under test: a short label for messages, and its binary.
#[derive(Clone, Debug)]
pub struct Claude {
    pub label: &'static str,
    pub bin: PathBuf,
}

/// Both Claude Code versions the tests run with: the pinned one (`CLAUDEBOX_TEST_CLAUDE`)
/// and the newest (`CLAUDEBOX_TEST_CLAUDE_LATEST`). Empty (the test returns early) only
/// with `CLAUDEBOX_SKIP_E2E=1`; otherwise a missing variable fails the test.
pub fn claude_versions() -> Vec<Claude> {
    versions(
        [
            ("pinned", "CLAUDEBOX_TEST_CLAUDE"),
            ("latest", "CLAUDEBOX_TEST_CLAUDE_LATEST"),
        ],
        "Claude Code",
    )
}

/// Both Codex CLI versions the tests run with: the pinned one (`CLAUDEBOX_TEST_CODEX`) and
/// the newest (`CLAUDEBOX_TEST_CODEX_LATEST`); `scripts/install-agent.sh codex` installs
/// them. As [`claude_versions`]: empty only with `CLAUDEBOX_SKIP_E2E=1`, else a missing
/// one fails.
pub fn codex_versions() -> Vec<Claude> {
    versions(
        [
            ("codex pinned", "CLAUDEBOX_TEST_CODEX"),
            ("codex latest", "CLAUDEBOX_TEST_CODEX_LATEST"),
        ],
        "Codex CLI",
    )
}

/// The agent binaries named by `vars` (label, variable), as the two functions above say.
fn versions(vars: [(&'static str, &str); 2], what: &str) -> Vec<Claude> {
    let skip = std::env::var_os("CLAUDEBOX_SKIP_E2E").is_some_and(|v| v == "1");
    let mut out = Vec::new();
    for (label, var) in vars {
        match std::env::var_os(var) {
            Some(p) if !p.is_empty() => out.push(Claude {
                label,
                bin: PathBuf::from(p),
            }),
            _ if skip => {
                eprintln!("skipping: CLAUDEBOX_SKIP_E2E=1");
                return Vec::new();
            }
            _ => panic!(
                "{var} is not set: run the tests with scripts/test (which installs the pinned \
                 and the newest {what} and exports {} and {}), or set CLAUDEBOX_SKIP_E2E=1 to \
                 skip the end-to-end tests",
                vars[0].1, vars[1].1
            ),
        }
    }
    out
}

/// The API key variable the lab's Codex config names, and its value.
pub const OPENAI_KEY_VAR: &str = "CLAUDEBOX_LAB_OPENAI_KEY";
pub const OPENAI_KEY: &str = "sk-proj-claudebox-lab-key-0123456789";

/// A Codex `config.toml` whose model provider is the mock at `port`.
pub fn codex_config(port: u16) -> String {
    format!(
        "model = \"mock-model\"\nmodel_provider = \"mock\"\n\n[model_providers.mock]\n\
         name = \"mock\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n\
         env_key = \"{OPENAI_KEY_VAR}\"\nwire_api = \"responses\"\n"
    )
}

/// Both Claude Code versions ([`claude_versions`]), one after the other, holding
/// [`crate::busy()`] until the loop ends: `for c in agent::each_claude() { ... }`. For
/// conversations whose checks do not hang on timing (two of them run at once).
pub fn each_claude() -> EachClaude {
    let heavy = crate::busy();
    EachClaude {
        versions: claude_versions().into_iter(),
        _heavy: heavy,
    }
}

/// [`each_claude`] holding [`crate::heavy()`] instead: for the tests that race or time
/// the real Claude Code (two refreshes at once, Ctrl-C, the TUI's screens).
pub fn each_claude_timed() -> EachClaude {
    let heavy = crate::heavy();
    EachClaude {
        versions: claude_versions().into_iter(),
        _heavy: heavy,
    }
}

/// What [`each_claude`] returns: the versions, and the lock while they are run.
pub struct EachClaude {
    versions: std::vec::IntoIter<Claude>,
    _heavy: crate::Heavy,
}

impl Iterator for EachClaude {
    type Item = Claude;
    fn next(&mut self) -> Option<Claude> {
        self.versions.next()
    }
}

/// A world ([`World::new`]) running `claudebox` whose `claude` is `c`, linked the way npm
/// links it.
pub fn world_with(claudebox: impl AsRef<Path>, c: &Claude) -> World {
    let w = World::new(claudebox);
    fs::remove_file(w.bin().join("claude")).unwrap();
    std::os::unix::fs::symlink(&c.bin, w.bin().join("claude")).unwrap();
    w
}

/// A running mock API. Killed (SIGKILL, then reaped) on drop; also dies with the thread
/// that started it (`PR_SET_PDEATHSIG`), so a test that is killed leaves none behind.
pub struct MockApi {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl MockApi {
    /// Starts the mock playing `script` (see `tests/lab/mock_api.py` for the format:
    /// a list of turns, or `{"turns": [...], "final_text": ..., "chunk_delay_ms": ...}`).
    pub fn start(script: &Value) -> MockApi {
        MockApi::start_with(script, &[])
    }

    /// Starts the mock also playing Claude Code's OAuth server (`--oauth`, see
    /// `tests/lab/mock_api.py`): `refresh_token` is the login's live refresh token.
    /// Point claude at it with `oauth_env`.
    pub fn start_oauth(script: &Value, refresh_token: &str) -> MockApi {
        MockApi::start_oauth_with(script, refresh_token, &[])
    }

    /// `start_oauth` with a live login: `access` is taken as issued.
    pub fn start_oauth_live(script: &Value, refresh_token: &str, access: &str) -> MockApi {
        MockApi::start_oauth_with(script, refresh_token, &["--access-token", access])
    }

    /// `start_oauth_live` taking only `api_key` as an API key (`--api-key`: any other
    /// x-api-key, or bearer `sk-ant-api...`, gets 401).
    pub fn start_oauth_live_key(
        script: &Value,
        refresh_token: &str,
        access: &str,
        api_key: &str,
    ) -> MockApi {
        MockApi::start_oauth_with(
            script,
            refresh_token,
            &["--access-token", access, "--api-key", api_key],
        )
    }

    /// `start_oauth` with more arguments for the mock.
    fn start_oauth_with(script: &Value, refresh_token: &str, extra: &[&str]) -> MockApi {
        let mut args = vec!["--refresh-token", refresh_token, "--oauth", "@tls"];
        args.extend_from_slice(extra);
        MockApi::start_with(script, &args)
    }

    /// `start` with more arguments for the mock; `@tls` stands for `<its dir>/tls`.
    fn start_with(script: &Value, extra: &[&str]) -> MockApi {
        MockApi::spawn(MOCK_API, script, extra)
    }

    /// Starts the mock of OpenAI's Responses API playing `script` (see
    /// `tests/lab/mock_openai.py`); point Codex at it with [`codex_config`].
    pub fn start_openai(script: &Value) -> MockApi {
        MockApi::spawn(MOCK_OPENAI, script, &[])
    }

    fn spawn(mock: &str, script: &Value, extra: &[&str]) -> MockApi {
        let dir = tempfile::Builder::new()
            .prefix("claudebox-mock-api-")
            .tempdir()
            .expect("tempdir for the mock");
        let script_path = dir.path().join("script.json");
        fs::write(&script_path, serde_json::to_vec(script).unwrap()).unwrap();
        let port_file = dir.path().join("port");
        let log = dir.path().join("requests.jsonl");
        let err = fs::File::create(dir.path().join("stderr")).unwrap();
        let mut cmd = Command::new("python3");
        cmd.arg(mock)
            .arg("--port-file")
            .arg(&port_file)
            .arg("--script")
            .arg(&script_path)
            .arg("--log")
            .arg(&log)
            .args(extra.iter().map(|a| match *a {
                "@tls" => dir.path().join("tls").into_os_string(),
                a => a.into(),
            }))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .expect("start python3 tests/lab/mock_api.py (is python3 installed?)");
        let mut mock = MockApi {
            child,
            dir,
            port: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(text) = fs::read_to_string(&port_file) {
                if let Ok(port) = text.trim().parse() {
                    mock.port = port;
                    return mock;
                }
            }
            if let Ok(Some(status)) = mock.child.try_wait() {
                panic!(
                    "the mock API exited at start ({status}):\n{}",
                    fs::read_to_string(mock.dir.path().join("stderr")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the mock API did not start listening within 15 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`, for `ANTHROPIC_BASE_URL`.
    /// With `start_oauth`: the mock stops taking `access` (a revoked token).
    pub fn revoke(&self, access: &str) {
        use std::io::Write;
        let body = json!({ "access": access }).to_string();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "POST /mock/revoke HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
            "{answer}"
        );
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Points `cmd` (claudebox or claude) at the mock: `ANTHROPIC_BASE_URL` and
    /// `ANTHROPIC_API_KEY` (= `API_KEY`).
    pub fn point<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.env("ANTHROPIC_BASE_URL", self.base_url())
            .env("ANTHROPIC_API_KEY", API_KEY)
    }

    /// With `start_oauth`: the mock's self-signed certificate for the OAuth hosts.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("tls/cert.pem")
    }

    /// With `start_oauth`: what points claude at the mock with no API key, so that it
    /// uses its OAuth login: the Messages API at `base_url()`, and the OAuth hosts through
    /// the mock as an HTTPS proxy trusting `ca` (a copy of `ca_cert()` claude can read).
    pub fn oauth_env(&self, ca: &Path) -> Vec<(String, String)> {
        let proxy = self.base_url();
        vec![
            ("ANTHROPIC_BASE_URL".into(), proxy.clone()),
            ("HTTPS_PROXY".into(), proxy),
            ("NO_PROXY".into(), "127.0.0.1,localhost".into()),
            (
                "NODE_EXTRA_CA_CERTS".into(),
                ca.to_string_lossy().into_owned(),
            ),
            ("DISABLE_AUTOUPDATER".into(), "1".into()),
        ]
    }

    /// With `start_oauth`: every token refresh, oldest first, as (the last 4 characters
    /// of the refresh token spent, those of the new one or `None` when refused).
    pub fn refreshes(&self) -> Vec<(String, Option<String>)> {
        self.log()
            .iter()
            .filter(|r| r["kind"] == "oauth_refresh")
            .map(|r| {
                (
                    r["old"].as_str().unwrap_or_default().to_string(),
                    r["new"].as_str().map(str::to_string),
                )
            })
            .collect()
    }

    /// Every request so far, oldest first: `{id, time, method, path, headers, body,
    /// kind[, turn]}` where kind is `conversation` (took a script turn), `title`,
    /// `classifier`, `side`, `count_tokens`, `head` or `other`.
    pub fn requests(&self) -> Vec<Value> {
        self.log()
            .into_iter()
            .filter(|r| r["kind"] != "end" && r["kind"] != "oauth_refresh")
            .collect()
    }

    /// Whether the answer to request `id` was sent in full (`Some(false)`: the client
    /// went away mid-answer; `None`: not over yet).
    pub fn answer_complete(&self, id: &Value) -> Option<bool> {
        self.log()
            .iter()
            .find(|r| r["kind"] == "end" && &r["request_id"] == id)
            .and_then(|r| r["complete"].as_bool())
    }

    /// The whole log: the requests and, after each answer to a POST, an `{kind: "end",
    /// request_id, complete}` line.
    pub fn log(&self) -> Vec<Value> {
        let text = fs::read_to_string(self.dir.path().join("requests.jsonl")).unwrap_or_default();
        // The mock may be half-way through writing a long line (Python writes it in
        // several system calls): only lines that end in a newline are whole.
        let whole = match text.rfind('\n') {
            Some(end) => &text[..end],
            None => "",
        };
        whole
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).expect("a JSON line in the mock's log"))
            .collect()
    }

    /// The requests of the conversation itself (the ones that took a script turn or the
    /// final text), from the `skip`-th on (pass a count taken earlier to see one run's).
    pub fn conversation(&self, skip: usize) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r["kind"] == "conversation")
            .skip(skip)
            .collect()
    }

    /// The mock's own stderr (tracebacks), for failure messages.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }
}

impl Drop for MockApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// All the text of a request's messages (text blocks, tool inputs and tool results), one
/// string, to look for what an earlier turn said.
pub fn messages_text(request: &Value) -> String {
    let mut out = String::new();
    fn walk(v: &Value, out: &mut String) {
        match v {
            Value::String(s) => {
                out.push_str(s);
                out.push('\n');
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(o) => o.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(&request["body"]["messages"], &mut out);
    out
}

/// The `~/.claude.json` a TUI run needs to go straight to the prompt offline: onboarding
/// done, `API_KEY` approved, each of `projects` trusted, 2.1.330's notices seen.
pub fn claude_json_seed(projects: &[&Path]) -> Value {
    let key = API_KEY;
    let tail = &key[key.len().saturating_sub(20)..];
    let mut p = serde_json::Map::new();
    for dir in projects {
        p.insert(
            dir.to_str().expect("a UTF-8 project path").to_string(),
            json!({"hasTrustDialogAccepted": true, "hasCompletedProjectOnboarding": true}),
        );
    }
    json!({
        "hasCompletedOnboarding": true,
        "lastOnboardingVersion": "2.1.330",
        "theme": "dark",
        "customApiKeyResponses": {"approved": [tail], "rejected": []},
        "hasSeenAutoDefaultNotice": true,
        "autoModeClassifierBillingNoticeAcknowledgedAt": 1,
        "projects": p,
    })
}

/// Writes `claude_json_seed(projects)` to `home/.claude.json`.
pub fn seed_claude_json(home: &Path, projects: &[&Path]) {
    fs::write(
        home.join(".claude.json"),
        serde_json::to_vec_pretty(&claude_json_seed(projects)).unwrap(),
    )
    .unwrap();
}

/// Runs `cmd` (stdin null, output captured) in its own process group and waits at most
/// `limit`; on timeout the whole group is killed and `Err` carries what it printed.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    let deadline = Instant::now() + limit;
    let status: Option<ExitStatus> = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() >= deadline => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(25)),
            Err(e) => return Err(format!("wait: {e}")),
        }
    };
    // Whatever of the group is left (all of it on a timeout) goes, so the pipes close.
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!(
            "timed out after {limit:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&collect(out)),
            String::from_utf8_lossy(&collect(err))
        ));
    };
    Ok(Output {
        status,
        stdout: collect(out),
        stderr: collect(err),
    })
}

/// Reads a pipe to its end on a thread.
fn reader(mut r: impl Read + Send + 'static) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        let _ = tx.send(v);
    });
    rx
}

/// What a `reader` read; waits at most 5 s more (a process outside the group, such as a
/// sandbox in its own session, could hold the pipe open).
fn collect(rx: std::sync::mpsc::Receiver<Vec<u8>>) -> Vec<u8> {
    rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default()
}

/// `claudebox ARGS` of `w` in `cwd`, pointed at `mock` (plus `env`), killed after `limit`.
pub fn run_claudebox(
    w: &World,
    cwd: &Path,
    mock: &MockApi,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Output {
    let mut cmd = w.cmd(cwd);
    mock.point(&mut cmd).envs(env.iter().copied()).args(args);
    match output_within(&mut cmd, limit) {
        Ok(o) => o,
        Err(e) => panic!("claudebox {args:?} in {}: {e}", cwd.display()),
    }
}

/// Asserts a run succeeded, naming the claude version and showing everything on failure;
/// returns its stdout.
#[track_caller]
pub fn ok_run(c: &Claude, o: &Output, mock: &MockApi) -> String {
    assert!(
        o.status.success(),
        "[{}] claudebox failed: {:?}\nstdout:\n{}\nstderr:\n{}\nmock stderr:\n{}",
        c.label,
        o.status,
        stdout(o),
        stderr(o),
        mock.stderr()
    );
    stdout(o)
}

/// The control of the network tests: from a sandbox of `w` in `p` with `--network MODE`
/// (and nothing else opened), a request to the mock never reaches it.
pub fn assert_mock_unreachable(w: &World, p: &Path, mock: &MockApi, mode: &str, label: &str) {
    let url = format!("{}/control-probe", mock.base_url());
    let mut probe = w.cmd(p);
    probe.args([
        "--network",
        mode,
        "--exec",
        "curl",
        "-sS",
        "--max-time",
        "5",
        &url,
    ]);
    let o = output_within(&mut probe, Duration::from_secs(30)).unwrap();
    assert!(
        !o.status.success(),
        "[{label}] {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(
        mock.requests()
            .iter()
            .all(|r| r["path"] != "/control-probe"),
        "[{label}] the mock was reached from a `--network {mode}` sandbox"
    );
}
