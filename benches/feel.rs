//! `cargo bench --bench feel`: what a user of claudebox feels, measured side by side in one
//! run, on loopback only, in a few minutes, then a table:
//!
//! 1. the launch's cost over bwrap alone (`claudebox --exec true` against bwrap with the
//!    argv claudebox prints, interleaved; `--bench launch` has the long version);
//! 2. the time from `claude -p hello` to the first streamed token of the real Claude Code
//!    against the lab's mock Messages API (`tests/lab/mock_api.py`): bare claude, claudebox
//!    in open mode, claudebox in allowlist mode with the mock allowed on the host's
//!    loopback (`--allow-host 127.0.0.1:PORT`, through the proxy's loopback forward);
//!    interleaved rounds, medians, ratios;
//! 3. the proxy: per-request latency (a new connection per request) and a bulk transfer
//!    from a local HTTP server, direct on the host against the same client inside a
//!    sandbox (open mode; allowlist through the loopback forward; allowlist through a
//!    CONNECT tunnel of the proxy);
//! 4. memory: the PSS and RSS of N idle sandboxes (`--exec sleep`) per sandbox, by process
//!    (bwrap, claudebox's proxy, the command), and of an idle Claude Code TUI (under tmux)
//!    bare and in claudebox.
//!
//! Options (after `cargo bench --bench feel --`):
//!   --rounds N       rounds of the first-token runs, each case once per round (default 10)
//!   --launch-runs N  rounds of the launch-cost runs (default 200)
//!   --requests N     requests per proxy run (default 500), 5 runs per case
//!   --bulk-mb N      MiB of each bulk transfer (default 256), 3 per run
//!   --idle N         idle sandboxes at once, per mode (default 5)
//!   --claude PATH    a Claude Code to measure (repeatable; default: $CLAUDEBOX_TEST_CLAUDE
//!                    and $CLAUDEBOX_TEST_CLAUDE_LATEST, else the CI cache's two versions)
//!   --no-tui         skip the idle-TUI memory figures
//!   --only LIST      run only these parts, comma-separated: launch,token,proxy,memory
//!   --cases LIST     run only these first-token cases, by number in the order of the
//!                    table (1-9, 10 for --compare's), comma-separated: e.g. `7,8` for
//!                    the two that compare allowlist with open mode under the broker,
//!                    with many rounds where a difference needs resolving
//!   --compare PATH   another claudebox build: one more first-token case, its login
//!                    broker in open mode, in the same rounds
//! Needs bwrap, git, python3 (/usr/bin/python3 inside the sandbox), and tmux for the TUI
//! figures. Fixtures go under $TMPDIR (default /tmp) and are removed at the end.

// A bench: a panic on an unexpected None or Err is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use lab::agent::{self, Claude, MockApi, API_KEY};
use lab::{init_repo, World};

/// The claudebox binary measured (as an installed copy) and run by the worlds.
const BIN: &str = env!("CARGO_BIN_EXE_claudebox");
use lab::bench::{argv_from_dry_run, die, install, load, load1, median_ci95, number, quantile};

/// The Claude Code versions the CI caches, used when no variable or `--claude` names one.
const CACHED_CLAUDES: [&str; 2] = [
    "/var/cache/claudebox-ci/claude-code-2.1.197/node_modules/.bin/claude",
    "/var/cache/claudebox-ci/claude-code-2.1.330/node_modules/.bin/claude",
];
const ANSWER: &str = "Hello from the mock API, streamed back.";
const PYTHON: &str = "/usr/bin/python3";

struct Opts {
    rounds: usize,
    launch_runs: usize,
    requests: usize,
    bulk_mb: usize,
    idle: usize,
    claudes: Vec<PathBuf>,
    tui: bool,
    /// The parts to run (`--only launch,token,proxy,memory`; default all).
    only: Vec<String>,
    /// Another claudebox build: its login broker gets a first-token case of its own.
    compare: Option<PathBuf>,
    /// The first-token cases to run, 0-based (`--cases`, 1-based; default all).
    cases: Option<Vec<usize>>,
}

impl Opts {
    fn parse() -> Opts {
        let mut o = Opts {
            rounds: 10,
            launch_runs: 200,
            requests: 500,
            bulk_mb: 256,
            idle: 5,
            claudes: Vec::new(),
            tui: true,
            only: ["launch", "token", "proxy", "memory"]
                .map(String::from)
                .to_vec(),
            compare: None,
            cases: None,
        };
        let mut args = std::env::args_os().skip(1);
        while let Some(a) = args.next() {
            let mut value = || {
                args.next()
                    .unwrap_or_else(|| die(&format!("{} needs a value", a.to_string_lossy())))
            };
            match a.to_str() {
                Some("--rounds") => o.rounds = number(&value()),
                Some("--launch-runs") => o.launch_runs = number(&value()),
                Some("--requests") => o.requests = number(&value()),
                Some("--bulk-mb") => o.bulk_mb = number(&value()),
                Some("--idle") => o.idle = number(&value()),
                Some("--claude") => o.claudes.push(PathBuf::from(value())),
                Some("--no-tui") => o.tui = false,
                Some("--compare") => o.compare = Some(PathBuf::from(value())),
                Some("--cases") => {
                    o.cases = Some(
                        value()
                            .to_string_lossy()
                            .split(',')
                            .map(|n| number(std::ffi::OsStr::new(n)).max(1) - 1)
                            .collect(),
                    )
                }
                Some("--only") => {
                    o.only = value()
                        .to_string_lossy()
                        .split(',')
                        .map(str::to_string)
                        .collect()
                }
                // cargo bench passes --bench; a filter may follow. Neither applies here.
                _ => {}
            }
        }
        if o.claudes.is_empty() {
            for var in ["CLAUDEBOX_TEST_CLAUDE", "CLAUDEBOX_TEST_CLAUDE_LATEST"] {
                if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
                    o.claudes.push(PathBuf::from(p));
                }
            }
        }
        if o.claudes.is_empty() {
            o.claudes = CACHED_CLAUDES
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .collect();
        }
        o.rounds = o.rounds.max(1);
        o.launch_runs = o.launch_runs.max(1);
        o.requests = o.requests.max(1);
        o.idle = o.idle.max(1);
        o
    }
}

fn say(msg: &str) {
    eprintln!("feel bench: {msg}");
}

// ---------------------------------------------------------------------------------------
// Statistics and printing

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut t = v.to_vec();
    t.sort_by(f64::total_cmp);
    t
}
fn median(v: &[f64]) -> f64 {
    let t = sorted(v);
    let n = t.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        t[n / 2]
    } else {
        (t[n / 2 - 1] + t[n / 2]) / 2.0
    }
}
fn min(v: &[f64]) -> f64 {
    sorted(v).first().copied().unwrap_or(f64::NAN)
}
fn p90(v: &[f64]) -> f64 {
    let t = sorted(v);
    if t.is_empty() {
        return f64::NAN;
    }
    t[((t.len() * 9).div_ceil(10)).max(1) - 1]
}
/// Who runs the bench, for the record (sandboxes differ for root and ordinary users).
fn user_name() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map_or_else(|| "?".into(), |u| u.name)
}
fn secs_ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------
// Processes

/// `claudebox` (the installed copy `bin`) in `cwd` with the world's environment, like
/// `World::cmd`.
fn claudebox(w: &World, bin: &Path, cwd: &Path) -> Command {
    let mut c = Command::new(bin);
    base_env(&mut c, w, cwd);
    c
}

/// The environment every measured process gets, claudebox or bare claude alike: the
/// world's HOME and PATH, and no auto-updater or non-essential traffic (no network but
/// loopback is assumed; claudebox turns the auto-updater off by itself, bare claude gets
/// the same here).
fn base_env(c: &mut Command, w: &World, cwd: &Path) {
    c.current_dir(cwd)
        .env_clear()
        .env("HOME", w.home())
        .env("PATH", w.path_var())
        .env("LANG", "C.UTF-8")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .stdin(Stdio::null());
    if let Some(v) = std::env::var_os("USER") {
        c.env("USER", v);
    }
}

/// Kills a whole process group and the child, and reaps it.
fn kill_group(child: &mut Child) {
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `cmd` to its end within `limit` (else kills its process group and stops the
/// bench); returns stdout. `what` names it in messages.
fn run_within(cmd: &mut Command, limit: Duration, what: &str) -> Vec<u8> {
    match agent::output_within(cmd, limit) {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => die(&format!(
            "{what} failed ({}):\n{}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => die(&format!("{what}: {e}")),
    }
}

// ---------------------------------------------------------------------------------------
// 1. The launch's cost over bwrap alone

/// The launch cases, all `--exec true`: bwrap alone with the argv claudebox prints against
/// claudebox itself (an empty home, as before; and a home logged in by OAuth with the
/// broker off, so the credentials sync starts), then what each network mode and the login
/// broker add (the proxy, its readiness, the broker's certificate authority).
const LAUNCH_CASES: [&str; 9] = [
    "bwrap alone, empty home (argv of --dry-run)",
    "claudebox, empty home, open",
    "bwrap alone, OAuth home, --no-login-broker (argv)",
    "claudebox, OAuth home, open --no-login-broker",
    "claudebox, OAuth home, open, broker",
    "claudebox, empty home, allowlist",
    "claudebox, OAuth home, allowlist, broker",
    "claudebox, empty home, none",
    "claudebox, OAuth home, none, broker",
];

fn launch_cost(bin: &Path, runs: usize) -> Vec<Vec<f64>> {
    let n = LAUNCH_CASES.len();
    say(&format!("launch cost, {n} cases x {runs} rounds..."));
    let w = World::new(BIN);
    let repo = w.dir("repo");
    init_repo(&repo);
    let ow = World::new(BIN);
    let orepo = ow.dir("repo");
    init_repo(&orepo);
    oauth_home(&ow, &[&orepo]);
    let quiet = |mut c: Command| {
        c.stdout(Stdio::null()).stderr(Stdio::null());
        c
    };
    let cb = |oauth: bool, args: &[&str]| {
        let (world, dir) = if oauth { (&ow, &orepo) } else { (&w, &repo) };
        let mut c = claudebox(world, bin, dir);
        c.args(args).args(["--exec", "true"]);
        quiet(c)
    };
    let argv = |oauth: bool, args: &[&str]| {
        run_within(
            &mut cb(oauth, args),
            Duration::from_secs(30),
            "claudebox --exec true",
        );
        let (world, dir) = if oauth { (&ow, &orepo) } else { (&w, &repo) };
        let mut dry = claudebox(world, bin, dir);
        dry.arg("--dry-run").args(args).args(["--exec", "true"]);
        argv_from_dry_run(&run_within(
            &mut dry,
            Duration::from_secs(30),
            "claudebox --dry-run",
        ))
    };
    let plain = argv(false, &[]);
    let shared = argv(true, &["--no-login-broker"]);
    let bwrap = |oauth: bool, argv: &[std::ffi::OsString]| {
        let (world, dir) = if oauth { (&ow, &orepo) } else { (&w, &repo) };
        let mut c = Command::new(&argv[0]);
        base_env(&mut c, world, dir);
        c.args(&argv[1..]);
        quiet(c)
    };
    let make = |i: usize| -> Command {
        match i {
            0 => bwrap(false, &plain),
            1 => cb(false, &[]),
            2 => bwrap(true, &shared),
            3 => cb(true, &["--no-login-broker"]),
            4 => cb(true, &[]),
            5 => cb(false, &["--network", "allowlist"]),
            6 => cb(true, &["--network", "allowlist"]),
            7 => cb(false, &["--network", "none"]),
            _ => cb(true, &["--network", "none"]),
        }
    };
    for (i, name) in LAUNCH_CASES.iter().enumerate() {
        let st = make(i).status();
        if !st.as_ref().is_ok_and(|s| s.success()) {
            die(&format!("launch case {name}: {st:?}"));
        }
    }
    let mut out = vec![Vec::new(); n];
    for round in 0..runs {
        for j in 0..n {
            let i = (round + j) % n;
            let mut c = make(i);
            let t = Instant::now();
            let st = c.status();
            let dt = secs_ms(t.elapsed());
            if !st.as_ref().is_ok_and(|s| s.success()) {
                die(&format!("launch case {} failed: {st:?}", LAUNCH_CASES[i]));
            }
            out[i].push(dt);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// 2. Time to the first streamed token of the real claude

/// One `-p` run: when stdout's first line came (claude's `system/init`), when the first
/// text delta of the answer came, and when the process ended, from spawn, in ms.
struct TokenRun {
    first_line: f64,
    first_token: f64,
    exit: f64,
}

const CLAUDE_ARGS: [&str; 6] = [
    "-p",
    "hello",
    "--output-format",
    "stream-json",
    "--verbose",
    "--include-partial-messages",
];

fn token_run(mut cmd: Command, what: &str, err_file: &Path) -> TokenRun {
    let limit = Duration::from_secs(90);
    cmd.stdout(Stdio::piped())
        .stderr(fs::File::create(err_file).unwrap())
        .process_group(0);
    let t0 = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| die(&format!("{what}: {e}")));
    let pid = child.id() as i32;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(limit).is_err() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    });
    let mut first_line = None;
    let mut first_token = None;
    let mut answer = String::new();
    let mut lines = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let Ok(line) = line else { break };
        let now = t0.elapsed();
        first_line.get_or_insert(now);
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            let delta = &v["event"]["delta"];
            if v["type"] == "stream_event"
                && v["event"]["type"] == "content_block_delta"
                && delta["type"] == "text_delta"
            {
                first_token.get_or_insert(now);
                answer.push_str(delta["text"].as_str().unwrap_or(""));
            }
        }
        lines.push(line);
    }
    let status = child.wait();
    let exit = t0.elapsed();
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let ok = status.as_ref().is_ok_and(|s| s.success());
    match (ok, first_line, first_token) {
        (true, Some(l), Some(t)) if answer == ANSWER => TokenRun {
            first_line: secs_ms(l),
            first_token: secs_ms(t),
            exit: secs_ms(exit),
        },
        _ => die(&format!(
            "{what}: no streamed answer (status {status:?}, answer {answer:?})\nstdout:\n{}\nstderr:\n{}",
            lines.join("\n"),
            fs::read_to_string(err_file).unwrap_or_default()
        )),
    }
}

struct TokenCase {
    name: String,
    runs: Vec<TokenRun>,
}

impl TokenCase {
    fn col(&self, f: impl Fn(&TokenRun) -> f64) -> Vec<f64> {
        self.runs.iter().map(f).collect()
    }
}

/// The version `claude --version` prints, as the label of its rows.
fn claude_label(bin: &Path) -> String {
    let mut c = Command::new(bin);
    c.arg("--version").env("DISABLE_AUTOUPDATER", "1");
    let out = run_within(&mut c, Duration::from_secs(60), "claude --version");
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

/// The host's OAuth login in the OAuth world (a live login the mock takes as issued).
const OAUTH_ACCESS: &str = "sk-ant-oat01-bench-access-token-F33L";
const OAUTH_REFRESH: &str = "sk-ant-ort01-bench-refresh-token-F33L";

fn oauth_login() -> Value {
    json!({"claudeAiOauth": {
        "accessToken": OAUTH_ACCESS,
        "refreshToken": OAUTH_REFRESH,
        "expiresAt": 4_102_444_800_000u64,
        "scopes": ["user:inference", "user:profile", "user:sessions:claude_code"],
        "subscriptionType": "max",
        "rateLimitTier": "default_claude_max_20x",
    }})
}

/// A home logged in by OAuth, as most users' are: `~/.claude/.credentials.json` and a
/// `~/.claude.json` trusting `projects` (no API key approved).
fn oauth_home(w: &World, projects: &[&Path]) {
    fs::write(
        w.home().join(".claude/.credentials.json"),
        oauth_login().to_string(),
    )
    .unwrap();
    let mut seed = agent::claude_json_seed(projects);
    seed.as_object_mut()
        .unwrap()
        .remove("customApiKeyResponses");
    fs::write(w.home().join(".claude.json"), seed.to_string()).unwrap();
}

/// The first-token cases, each one way a user runs claude.
///
/// API key (`ANTHROPIC_BASE_URL` at the mock's plain HTTP port, as for a local gateway;
/// the login broker stays off for a custom base URL): bare, claudebox open, allowlist (the
/// mock through the proxy's loopback forward), none (the mock's port forwarded).
///
/// OAuth (`.credentials.json`, claude talks HTTPS to api.anthropic.com; the mock plays it
/// behind TLS, reached as an HTTPS proxy, as the real one is reached across the internet):
/// bare (HTTPS_PROXY at the mock), claudebox open `--no-login-broker` (the login shared
/// with the sandbox, as before issue 23; the same variables), and the login broker (the
/// default) in open, allowlist and none: claude's CONNECT ends at the broker in claudebox's
/// proxy, which goes on to the mock with the host's token
/// (`CLAUDEBOX_TEST_BROKER_UPSTREAM_PROXY`/`_CA`, what the login broker's tests use).
const TOKEN_CASES: [&str; 9] = [
    "api key: bare",
    "api key: claudebox open",
    "api key: claudebox allowlist (proxy forward)",
    "api key: claudebox none (--forward-port)",
    "oauth: bare",
    "oauth: claudebox open --no-login-broker",
    "oauth: claudebox open, broker",
    "oauth: claudebox allowlist, broker",
    "oauth: claudebox none, broker",
];

/// The first-token cases of one claude version (`TOKEN_CASES`), `rounds` interleaved
/// rounds (every case once a round, the order rotating) after one warm-up run each.
fn first_token(
    bin: &Path,
    compare: Option<&Path>,
    c: &Claude,
    mock: &MockApi,
    oauth: &MockApi,
    rounds: usize,
    only: Option<&[usize]>,
) -> (Vec<TokenCase>, Vec<f64>) {
    let all = TOKEN_CASES.len() + usize::from(compare.is_some());
    let run: Vec<usize> = (0..all)
        .filter(|i| only.is_none_or(|o| o.contains(i)))
        .collect();
    let n = run.len();
    say(&format!(
        "first token, claude {}: {n} cases x {rounds} rounds (+1 warm-up)...",
        c.label
    ));
    let w = agent::world_with(BIN, c);
    let proj = w.dir("proj");
    init_repo(&proj);
    let ow = agent::world_with(BIN, c);
    let oproj = ow.dir("proj");
    init_repo(&oproj);
    oauth_home(&ow, &[&oproj]);
    // The mock's certificate where a sandbox of the project can read it.
    let ca = oproj.join("mock-ca.pem");
    fs::copy(oauth.ca_cert(), &ca).unwrap();
    let err_file = w.root().join("stderr");
    let allow = format!("127.0.0.1:{}", mock.port());
    let port = mock.port().to_string();
    let api_key = |cmd: &mut Command| {
        cmd.env("ANTHROPIC_BASE_URL", mock.base_url())
            .env("ANTHROPIC_API_KEY", API_KEY);
    };
    let via_mock = |cmd: &mut Command| {
        cmd.env("HTTPS_PROXY", oauth.base_url())
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("NODE_EXTRA_CA_CERTS", &ca);
    };
    let broker = |cmd: &mut Command| {
        cmd.env(
            "CLAUDEBOX_TEST_BROKER_UPSTREAM_PROXY",
            oauth.base_url().trim_start_matches("http://"),
        )
        .env("CLAUDEBOX_TEST_BROKER_UPSTREAM_CA", oauth.ca_cert());
    };
    let make = |i: usize| -> Command {
        let (world, dir) = if i < 4 { (&w, &proj) } else { (&ow, &oproj) };
        let mut cmd = if i == 0 || i == 4 {
            let mut cmd = Command::new(&c.bin);
            base_env(&mut cmd, world, dir);
            cmd
        } else if i == 9 {
            // the other build, as case 6
            claudebox(world, compare.expect("case 9 is --compare's"), dir)
        } else {
            claudebox(world, bin, dir)
        };
        match i {
            0 | 1 => api_key(&mut cmd),
            2 => {
                api_key(&mut cmd);
                cmd.args(["--allow-host", &allow]);
            }
            3 => {
                api_key(&mut cmd);
                cmd.args(["--network", "none", "--forward-port", &port]);
            }
            4 => via_mock(&mut cmd),
            5 => {
                via_mock(&mut cmd);
                cmd.args(["--no-login-broker"]);
            }
            6 => broker(&mut cmd),
            9 => broker(&mut cmd),
            7 => {
                broker(&mut cmd);
                cmd.args(["--network", "allowlist"]);
            }
            _ => {
                broker(&mut cmd);
                cmd.args(["--network", "none"]);
            }
        }
        if i != 0 && i != 4 {
            cmd.arg("--");
        }
        cmd.args(CLAUDE_ARGS);
        cmd
    };
    let mut names: Vec<String> = TOKEN_CASES
        .iter()
        .map(|k| format!("{} {k}", c.label))
        .collect();
    if let Some(p) = compare {
        names.push(format!(
            "{} oauth: claudebox open, broker, --compare {}",
            c.label,
            p.display()
        ));
    }
    let mut cases: Vec<TokenCase> = names
        .iter()
        .map(|n| TokenCase {
            name: n.clone(),
            runs: Vec::new(),
        })
        .collect();
    for &i in &run {
        token_run(make(i), &format!("{} (warm-up)", names[i]), &err_file);
    }
    let mut loads = Vec::new();
    for round in 0..rounds {
        for j in 0..n {
            let i = run[(round + j) % n];
            let r = token_run(make(i), &names[i], &err_file);
            cases[i].runs.push(r);
        }
        loads.push(load1());
        if (round + 1) % 10 == 0 {
            say(&format!(
                "  round {} of {rounds}, load {}",
                round + 1,
                load()
            ));
        }
    }
    (cases, loads)
}

// ---------------------------------------------------------------------------------------
// 3. The proxy: latency per request and bulk throughput

/// A tiny HTTP/1.1 server on the host's loopback: `GET /small` answers "ok", `GET
/// /bulk/N` answers N bytes; one request per connection.
fn start_http_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind the bench's HTTP server");
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || serve(s));
        }
    });
    port
}

fn serve(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 65536 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/");
    if let Some(n) = path
        .strip_prefix("/bulk/")
        .and_then(|n| n.parse::<usize>().ok())
    {
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
        );
        let chunk = vec![b'x'; 1 << 20];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len());
            if s.write_all(&chunk[..k]).is_err() {
                return;
            }
            left -= k;
        }
    } else {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    }
}

/// The client, the same program on the host and in the sandbox: `direct` connects to
/// HOST:PORT, `connect` asks the proxy at 127.0.0.1:3128 for a CONNECT tunnel to it. N
/// requests of /small, each on a new connection, then /bulk/BYTES three times; prints
/// JSON (the latencies in ms, the bulk rates in MiB/s).
const NET_CLIENT: &str = r#"
import json, socket, sys, time
mode, host, port, n, bulk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

def head(s, what):
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            sys.exit("%s: closed after %r" % (what, buf[:200]))
        buf += d
    i = buf.index(b"\r\n\r\n") + 4
    if buf.split(b" ", 2)[1] != b"200":
        sys.exit("%s: %r" % (what, buf[:300]))
    return buf[i:]

def conn():
    if mode == "direct":
        s = socket.create_connection((host, port))
    else:
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, port, host, port)).encode())
        rest = head(s, "CONNECT")
        assert not rest
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s

buf = bytearray(1 << 20)
def get(path):
    s = conn()
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n" % (path, host, port)).encode())
    got = len(head(s, "GET " + path))
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        got += k
    s.close()
    return got

lat = []
for _ in range(n):
    t = time.perf_counter()
    got = get("/small")
    lat.append(time.perf_counter() - t)
    assert got == 2, got
rates = []
for _ in range(3):
    t = time.perf_counter()
    got = get("/bulk/%d" % bulk)
    dt = time.perf_counter() - t
    assert got == bulk, (got, bulk)
    rates.append(bulk / dt / 1048576)
print(json.dumps({"lat_ms": [x * 1e3 for x in lat], "bulk_mb_s": rates}))
"#;

struct NetCase {
    name: String,
    lat_ms: Vec<f64>,
    mb_s: Vec<f64>,
}

fn proxy(bin: &Path, requests: usize, bulk_mb: usize) -> Vec<NetCase> {
    let port = start_http_server();
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let client = proj.join("netclient.py");
    fs::write(&client, NET_CLIENT).unwrap();
    let allow = format!("127.0.0.1:{port}");
    let bulk = (bulk_mb << 20).to_string();
    let n = requests.to_string();
    let port_s = port.to_string();
    let names = [
        "host, direct",
        "claudebox open, direct",
        "claudebox allowlist, loopback forward (proxy)",
        "claudebox allowlist, CONNECT tunnel (proxy)",
    ];
    let make = |i: usize| -> Command {
        let mode = if i == 3 { "connect" } else { "direct" };
        let mut cmd = match i {
            0 => {
                let mut c = Command::new(PYTHON);
                base_env(&mut c, &w, &proj);
                c
            }
            1 => {
                let mut c = claudebox(&w, bin, &proj);
                c.args(["--exec", PYTHON]);
                c
            }
            _ => {
                let mut c = claudebox(&w, bin, &proj);
                c.args(["--allow-host", &allow, "--exec", PYTHON]);
                c
            }
        };
        cmd.arg(&client)
            .args([mode, "127.0.0.1", &port_s, &n, &bulk]);
        cmd
    };
    let mut cases: Vec<NetCase> = names
        .iter()
        .map(|n| NetCase {
            name: n.to_string(),
            lat_ms: Vec::new(),
            mb_s: Vec::new(),
        })
        .collect();
    let runs = 5;
    say(&format!(
        "proxy: 4 cases x {runs} runs of {requests} requests + {bulk_mb} MiB..."
    ));
    for round in 0..runs {
        for j in 0..names.len() {
            let i = (round + j) % names.len();
            let out = run_within(&mut make(i), Duration::from_secs(120), names[i]);
            let v: Value = serde_json::from_slice(&out)
                .unwrap_or_else(|e| die(&format!("{}: not JSON ({e})", names[i])));
            let lat = v["lat_ms"].as_array().cloned().unwrap_or_default();
            cases[i]
                .lat_ms
                .extend(lat.iter().filter_map(|x| x.as_f64()));
            let rates = v["bulk_mb_s"].as_array().cloned().unwrap_or_default();
            cases[i]
                .mb_s
                .extend(rates.iter().filter_map(|x| x.as_f64()));
        }
    }
    cases
}

// ---------------------------------------------------------------------------------------
// 4. Memory

/// Resident memory of one process, kB: (PSS, RSS).
fn mem_of(pid: i32) -> Option<(u64, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((field("Pss:")?, field("Rss:")?))
}

/// `root` and every process below it, with its name (`comm`).
fn tree(root: i32) -> Vec<(i32, String)> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces and parentheses
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = after.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        let comm = fs::read_to_string(format!("/proc/{p}/comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        out.push((p, comm));
        todo.extend(children.get(&p).into_iter().flatten());
    }
    out
}

/// Memory by process name, kB: name -> (count, PSS, RSS).
type ByName = Vec<(String, usize, u64, u64)>;

fn tally(procs: &[(i32, String)]) -> ByName {
    let mut m: Vec<(String, usize, u64, u64)> = Vec::new();
    for (pid, comm) in procs {
        let Some((pss, rss)) = mem_of(*pid) else {
            continue;
        };
        match m.iter_mut().find(|e| &e.0 == comm) {
            Some(e) => {
                e.1 += 1;
                e.2 += pss;
                e.3 += rss;
            }
            None => m.push((comm.clone(), 1, pss, rss)),
        }
    }
    m
}

struct MemRow {
    name: String,
    n: usize,
    by_name: ByName,
}

/// `n` idle sandboxes at once running `sleep`; the memory of each tree, per sandbox.
fn idle_sandboxes(bin: &Path, n: usize, allowlist: bool) -> MemRow {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let mut kids = Vec::new();
    for _ in 0..n {
        let mut c = claudebox(&w, bin, &proj);
        if allowlist {
            c.args(["--network", "allowlist"]);
        }
        c.args(["--exec", "sleep", "600"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        kids.push(c.spawn().expect("start an idle sandbox"));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut trees;
    loop {
        trees = kids.iter().map(|k| tree(k.id() as i32)).collect::<Vec<_>>();
        if trees.iter().all(|t| t.iter().any(|(_, c)| c == "sleep")) {
            break;
        }
        if Instant::now() > deadline {
            for k in &mut kids {
                kill_group(k);
            }
            die("the idle sandboxes did not start within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let all: Vec<(i32, String)> = kids.iter().flat_map(|k| tree(k.id() as i32)).collect();
    let by_name = tally(&all);
    for k in &mut kids {
        // the proxy runs in its own session: kill the tree's processes by pid too
        for (pid, _) in tree(k.id() as i32) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        kill_group(k);
    }
    MemRow {
        name: format!(
            "idle sandbox ({}, --exec sleep)",
            if allowlist { "allowlist" } else { "open" }
        ),
        n,
        by_name,
    }
}

/// An idle Claude Code TUI under tmux: bare, in claudebox open, in claudebox allowlist
/// (the mock allowed); the memory of the pane's process tree once the prompt is up.
fn idle_tui(bin: &Path, c: &Claude, mock: &MockApi) -> Vec<MemRow> {
    let w = agent::world_with(BIN, c);
    let proj = w.dir("proj");
    init_repo(&proj);
    agent::seed_claude_json(&w.home(), &[&proj]);
    let sock = format!("claudebox-feel-{}", std::process::id());
    let tmux = |args: &[&str]| {
        let mut t = Command::new("tmux");
        t.args(["-L", &sock, "-f", "/dev/null"]).args(args);
        t
    };
    // the tmux server outlives the bench unless killed: kill it on every way out
    struct KillServer<'a>(&'a str);
    impl Drop for KillServer<'_> {
        fn drop(&mut self) {
            let _ = Command::new("tmux")
                .args(["-L", self.0, "kill-server"])
                .stderr(Stdio::null())
                .status();
        }
    }
    let _server = KillServer(&sock);
    let allow = format!("127.0.0.1:{}", mock.port());
    let mut rows = Vec::new();
    for (mode, args) in [
        ("bare", vec![c.bin.to_str().unwrap().to_string()]),
        ("claudebox open", vec![bin.to_str().unwrap().to_string()]),
        (
            "claudebox allowlist",
            vec![
                bin.to_str().unwrap().to_string(),
                "--allow-host".into(),
                allow.clone(),
            ],
        ),
    ] {
        say(&format!("idle TUI, claude {} {mode}...", c.label));
        let mut start = tmux(&["new-session", "-d", "-x", "120", "-y", "40", "-c"]);
        base_env(&mut start, &w, &proj);
        start
            .env("ANTHROPIC_BASE_URL", mock.base_url())
            .env("ANTHROPIC_API_KEY", API_KEY)
            .arg(&proj)
            .args(&args);
        run_within(&mut start, Duration::from_secs(10), "tmux new-session");
        let pane = |fmt: &str| {
            let mut c = tmux(&["display-message", "-p", fmt]);
            String::from_utf8_lossy(&run_within(&mut c, Duration::from_secs(10), "tmux"))
                .trim()
                .to_string()
        };
        let deadline = Instant::now() + Duration::from_secs(45);
        loop {
            let mut cap = tmux(&["capture-pane", "-p"]);
            let screen = String::from_utf8_lossy(&run_within(
                &mut cap,
                Duration::from_secs(10),
                "tmux capture-pane",
            ))
            .to_string();
            if screen.contains("Claude Code") && screen.contains("──────────") {
                break;
            }
            if Instant::now() > deadline {
                die(&format!("no prompt in the TUI ({mode}):\n{screen}"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        // settled: what an idle session holds, not the start-up peak
        std::thread::sleep(Duration::from_secs(5));
        let pid: i32 = pane("#{pane_pid}")
            .parse()
            .unwrap_or_else(|_| die("no pane pid"));
        let procs = tree(pid);
        let by_name = tally(&procs);
        let _ = tmux(&["kill-server"]).status();
        // what the kill left (the proxy is in its own session; it dies with bwrap)
        std::thread::sleep(Duration::from_millis(300));
        for (p, _) in procs {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        rows.push(MemRow {
            name: format!("idle claude {} TUI, {mode}", c.label),
            n: 1,
            by_name,
        });
    }
    rows
}

// ---------------------------------------------------------------------------------------

/// Prints the launch table (part 1) as soon as it is measured.
fn print_launch(launch: &[Vec<f64>], runs: usize) {
    println!();
    println!(
        "1. Launch, `--exec true`: wall time from spawn to exit, ms ({runs} interleaved rounds)"
    );
    println!(
        "{:<52} {:>5} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "case", "runs", "min", "p25", "median", "p75", "p90"
    );
    for (name, v) in LAUNCH_CASES.iter().zip(launch) {
        println!(
            "{name:<52} {:>5} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2}",
            v.len(),
            min(v),
            quantile(v, 0.25),
            median(v),
            quantile(v, 0.75),
            p90(v)
        );
    }
    for (case, base) in [(1, 0), (3, 2), (4, 3), (5, 1), (6, 4), (7, 1), (8, 4)] {
        let d: Vec<f64> = launch[case]
            .iter()
            .zip(&launch[base])
            .map(|(a, b)| a - b)
            .collect();
        let (lo, hi) = median_ci95(&d);
        println!(
            "  {} - {}: {:+.2} ms (medians, {:.3}x); per round {:+.2} ms, 95% CI {:+.2} .. {:+.2}",
            LAUNCH_CASES[case],
            LAUNCH_CASES[base],
            median(&launch[case]) - median(&launch[base]),
            median(&launch[case]) / median(&launch[base]),
            median(&d),
            lo,
            hi
        );
    }
}

/// Prints one claude version's first-token table (part 2) as soon as it is measured.
fn print_tokens(cases: &[TokenCase], loads: &[f64], rounds: usize) {
    println!();
    println!(
        "2. `claude -p hello` to the first streamed token, against the mock API: ms from spawn, {} interleaved rounds, load (1 min) {:.2} - {:.2} over the rounds",
        rounds,
        min(loads),
        sorted(loads).last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "{:<56} {:>5} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "case", "runs", "1st ln", "min", "p25", "median", "p75", "max", "exit"
    );
    for c in cases.iter().filter(|c| !c.runs.is_empty()) {
        let tok = c.col(|r| r.first_token);
        println!(
            "{:<56} {:>5} {:>7.0} {:>7.0} {:>7.0} {:>7.0} {:>7.0} {:>7.0} {:>7.0}",
            c.name,
            tok.len(),
            median(&c.col(|r| r.first_line)),
            min(&tok),
            quantile(&tok, 0.25),
            median(&tok),
            quantile(&tok, 0.75),
            sorted(&tok).last().copied().unwrap_or(f64::NAN),
            median(&c.col(|r| r.exit)),
        );
    }
    // Each against its control: API-key cases against bare (api key) or open, the
    // OAuth ones against bare (oauth), open without the broker, open with it.
    let label = |i: usize| cases[i].name.split_once(' ').map_or("", |x| x.1);
    let compared = [(9, 6)];
    for &(case, base) in [
        (1, 0),
        (2, 0),
        (3, 0),
        (2, 1),
        (3, 1),
        (5, 4),
        (6, 4),
        (6, 5),
        (7, 6),
        (8, 6),
        (7, 5),
    ]
    .iter()
    .chain(compared.iter().filter(|_| cases.len() > 9))
    .filter(|(a, b)| !cases[*a].runs.is_empty() && !cases[*b].runs.is_empty())
    {
        let a = cases[case].col(|r| r.first_token);
        let b = cases[base].col(|r| r.first_token);
        // the same rounds paired: each round runs every case within seconds, so a
        // load that drifts over the run falls on both
        let d: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
        let (lo, hi) = median_ci95(&d);
        println!(
            "  {} - {}: medians {:+.0} ms ({:.3}x); per round {:+.0} ms, 95% CI {:+.0} .. {:+.0}{}",
            label(case),
            label(base),
            median(&a) - median(&b),
            median(&a) / median(&b),
            median(&d),
            lo,
            hi,
            if hi - lo > 20.0 {
                " (wider than 20 ms: 10 ms not resolved)"
            } else {
                ""
            }
        );
    }
}

fn main() {
    let o = Opts::parse();
    let started = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("claudebox-feel-")
        .tempdir()
        .expect("tempdir");
    let bin = install(Path::new(BIN), tmp.path());
    println!("claudebox feel benchmark");
    println!("machine: {}", lab::bench::machine(Path::new("bwrap")));
    println!("binary: {BIN} (measured as a copy)");
    println!("load average at start: {}", load());

    let part = |name: &str| o.only.iter().any(|p| p == name);
    println!("user: {} (uid {})", user_name(), nix::unistd::getuid());
    if part("launch") {
        print_launch(&launch_cost(&bin, o.launch_runs), o.launch_runs);
    }

    let claudes: Vec<Claude> = o
        .claudes
        .iter()
        .map(|p| Claude {
            label: Box::leak(claude_label(p).into_boxed_str()),
            bin: p.clone(),
        })
        .collect();
    let mock = MockApi::start(&json!({"turns": [], "final_text": ANSWER}));
    let oauth = MockApi::start_oauth_live(
        &json!({"turns": [], "final_text": ANSWER}),
        OAUTH_REFRESH,
        OAUTH_ACCESS,
    );
    let mut tokens = Vec::new();
    if part("token") {
        for c in &claudes {
            let (cases, loads) = first_token(
                &bin,
                o.compare.as_deref(),
                c,
                &mock,
                &oauth,
                o.rounds,
                o.cases.as_deref(),
            );
            print_tokens(&cases, &loads, o.rounds);
            tokens.push(cases);
        }
        if claudes.is_empty() {
            say("no Claude Code found: the first-token and TUI rows are left out");
        }
    }

    let net = if part("proxy") {
        proxy(&bin, o.requests, o.bulk_mb)
    } else {
        Vec::new()
    };

    let mut mem = Vec::new();
    if part("memory") {
        say(&format!("memory, {} idle sandboxes per mode...", o.idle));
        mem.push(idle_sandboxes(&bin, o.idle, false));
        mem.push(idle_sandboxes(&bin, o.idle, true));
        let have_tmux = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if o.tui && have_tmux {
            for c in &claudes {
                mem.extend(idle_tui(&bin, c, &mock));
            }
        } else if o.tui {
            say("no tmux: the idle-TUI rows are left out");
        }
    }

    // ---- the table
    println!("load average at end: {}", load());
    println!("whole run: {:.0} s", started.elapsed().as_secs_f64());
    println!("user: {} (uid {})", user_name(), nix::unistd::getuid());
    if net.is_empty() && mem.is_empty() {
        drop((mock, oauth));
        return;
    }
    println!();
    println!(
        "3. HTTP from a local server on the host's loopback: {} requests x 5 runs, a new connection each; {} MiB bulk x 3 x 5",
        o.requests, o.bulk_mb
    );
    println!(
        "{:<48} {:>9} {:>9} {:>9} {:>11}",
        "client", "req min", "req med", "req p90", "bulk MiB/s"
    );
    for c in &net {
        println!(
            "{:<48} {:>9.3} {:>9.3} {:>9.3} {:>11.0}",
            c.name,
            min(&c.lat_ms),
            median(&c.lat_ms),
            p90(&c.lat_ms),
            median(&c.mb_s)
        );
    }
    let direct = &net[0];
    for c in &net[1..] {
        println!(
            "  {} / host direct: request {:.2}x ({:+.3} ms), bulk {:.2}x",
            c.name,
            median(&c.lat_ms) / median(&direct.lat_ms),
            median(&c.lat_ms) - median(&direct.lat_ms),
            median(&c.mb_s) / median(&direct.mb_s)
        );
    }

    println!();
    println!(
        "4. Memory per sandbox, MiB (PSS: shared pages split among their users; RSS: all resident)"
    );
    println!(
        "{:<44} {:>4} {:>9} {:>9}  by process (PSS / RSS)",
        "case", "n", "PSS", "RSS"
    );
    for r in &mem {
        let n = r.n as f64;
        let pss: u64 = r.by_name.iter().map(|e| e.2).sum();
        let rss: u64 = r.by_name.iter().map(|e| e.3).sum();
        let parts: Vec<String> = r
            .by_name
            .iter()
            .map(|(name, k, p, r)| {
                format!(
                    "{name} x{}: {:.2} / {:.2}",
                    *k as f64 / n,
                    *p as f64 / 1024.0 / n,
                    *r as f64 / 1024.0 / n
                )
            })
            .collect();
        println!(
            "{:<44} {:>4} {:>9.2} {:>9.2}  {}",
            r.name,
            r.n,
            pss as f64 / 1024.0 / n,
            rss as f64 / 1024.0 / n,
            parts.join(", ")
        );
    }
    drop((mock, oauth));
}
