//! Claude Code's OAuth token refresh inside a sandbox, offline, with the real claude
//! (both versions) against the lab's mock playing the OAuth server (`MockApi::start_oauth`:
//! single-use refresh tokens, as Anthropic rotates them).
//!
//! The login's `.credentials.json` is the host's real file, bound read-write into the
//! shared login directory. Claude writes it with a temporary file and a rename, which
//! fails with EBUSY on a bind-mounted file; claude then copies the temporary file over it
//! in place. These tests prove that a refresh inside reaches the host's file (so neither
//! the host's claude nor a later sandbox is logged out), and that two sandboxes refreshing
//! at once take the shared lock and spend the refresh token once. Controls: the
//! credentials as they were before the sandbox's refresh (what the host would hold had
//! the rotation been lost) are refused by the mock, and that claude is logged out; the
//! host's claude (lock in the real `~/.claude`) and a sandbox at once spend the token
//! twice. The README's opt-in (the host's `CLAUDE_SECURESTORAGE_CONFIG_DIR` in
//! claudebox's login directory) makes that one refresh. The credentials sync (a host
//! process per sandbox, `state::credsync`): a sandbox started before the host's claude
//! refreshed (by rename: a new inode) uses the host's new pair, and a sandbox refreshing
//! after the host's file was replaced puts its pair in the host's file; each with its
//! control (`CLAUDEBOX_NO_CREDENTIALS_SYNC=1`: logged out). About 30 s per version.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};

use crate::BIN;
use lab::agent::{self, Claude, MockApi};
use lab::World;

/// The login's refresh token before any refresh (the mock takes it as live).
const SEED_REFRESH: &str = "sk-ant-ort01-lab-seed-r000";
/// Its access token, expired (and never issued by the mock: refused if used).
const SEED_ACCESS: &str = "sk-ant-oat01-lab-seed-expired-a000";
const FINAL: &str = "MOCK: the script is over.";
const LIMIT: Duration = Duration::from_secs(90);

/// The host's credentials with `access`/`refresh`, expired (`expiresAt` in 1970).
fn credentials(access: &str, refresh: &str) -> Value {
    json!({"claudeAiOauth": {
        "accessToken": access,
        "refreshToken": refresh,
        "expiresAt": 1000,
        "scopes": ["user:inference", "user:profile", "user:sessions:claude_code"],
        "subscriptionType": "max",
        "rateLimitTier": "default_claude_max_20x",
    }})
}

fn creds_path(w: &World) -> std::path::PathBuf {
    w.home().join(".claude/.credentials.json")
}

fn host_creds(w: &World) -> Value {
    let text = fs::read_to_string(creds_path(w)).unwrap();
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the host's .credentials.json is not JSON ({e}): {text:?}"))
}

fn write_creds(w: &World, v: &Value) {
    fs::write(creds_path(w), serde_json::to_vec(v).unwrap()).unwrap();
}

/// A world with a logged-in host (expired access token, live refresh token), a project
/// trusted in `~/.claude.json`, and the mock's certificate copied where a sandbox of
/// that project can read it.
/// `token_delay_ms`: how long the mock's token endpoint takes to answer.
fn setup(
    c: &Claude,
    token_delay_ms: u64,
) -> (World, std::path::PathBuf, MockApi, std::path::PathBuf) {
    let w = agent::world_with(BIN, c);
    let p = w.dir("proj");
    let script = json!({"turns": [], "token_delay_ms": token_delay_ms});
    let mock = MockApi::start_oauth(&script, SEED_REFRESH);
    let ca = p.join("mock-ca.pem");
    fs::copy(mock.ca_cert(), &ca).unwrap();
    write_creds(&w, &credentials(SEED_ACCESS, SEED_REFRESH));
    let mut seed = agent::claude_json_seed(&[&p]);
    seed.as_object_mut()
        .unwrap()
        .remove("customApiKeyResponses");
    fs::write(w.home().join(".claude.json"), seed.to_string()).unwrap();
    (w, p, mock, ca)
}

/// `claudebox -p hello` (or bare `claude -p hello` with `sandbox` false) in `p`, logged in
/// by OAuth only (no API key), pointed at the mock.
fn ask(w: &World, p: &Path, mock: &MockApi, ca: &Path, sandbox: bool) -> Command {
    let mut cmd = if sandbox {
        // The login shared with the sandbox: the path without the broker.
        let mut c = w.cmd(p);
        c.arg("--no-login-broker");
        c
    } else {
        let mut c = Command::new(w.bin().join("claude"));
        c.current_dir(p)
            .env_clear()
            .env("HOME", w.home())
            .env("PATH", w.path_var())
            .env("LANG", "C.UTF-8");
        c
    };
    cmd.envs(mock.oauth_env(ca)).args(["-p", "hello"]);
    cmd
}

fn run(cmd: &mut Command) -> Output {
    agent::output_within(cmd, LIMIT).unwrap_or_else(|e| panic!("{e}"))
}

#[track_caller]
fn answered(c: &Claude, what: &str, o: &Output, mock: &MockApi) {
    let out = agent::ok_run(c, o, mock);
    assert!(
        out.contains(FINAL),
        "[{}] {what}: no final answer\nstdout:\n{out}\nmock stderr:\n{}",
        c.label,
        mock.stderr()
    );
}

/// The last 4 characters of the bearer token of the last conversation request.
fn last_bearer(mock: &MockApi) -> String {
    let conv = mock.conversation(0);
    let last = conv.last().expect("a conversation request");
    last["headers"]["authorization"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The last 4 characters (all of a shorter string: a refused refresh leaves it empty).
fn tail4(s: &str) -> &str {
    &s[s.len().saturating_sub(4)..]
}

#[test]
fn a_refresh_inside_a_sandbox_reaches_the_hosts_login() {
    for c in lab::agent::each_claude() {
        let (w, p, mock, ca) = setup(&c, 0);
        let before = fs::read(creds_path(&w)).unwrap();
        let inode = fs::metadata(creds_path(&w)).unwrap().ino();

        // A sandbox finds the access token expired and refreshes it.
        let o = run(&mut ask(&w, &p, &mock, &ca, true));
        answered(&c, "the sandbox's claude", &o, &mock);
        assert_eq!(
            mock.refreshes(),
            vec![(tail4(SEED_REFRESH).to_string(), Some("0001".to_string()))],
            "[{}] one refresh, of the seeded token",
            c.label
        );
        assert!(last_bearer(&mock).contains("'0001'"), "[{}]", c.label);
        // The rotated pair is in the host's very file (same inode: written in place).
        let host = host_creds(&w);
        assert_eq!(
            host["claudeAiOauth"]["refreshToken"], "sk-ant-ort01-mock-r0001",
            "[{}] the host's file: {host}",
            c.label
        );
        assert_eq!(
            host["claudeAiOauth"]["accessToken"],
            "sk-ant-oat01-mock-a0001"
        );
        assert!(host["claudeAiOauth"]["expiresAt"].as_u64().unwrap() > 1000);
        assert_eq!(
            fs::metadata(creds_path(&w)).unwrap().ino(),
            inode,
            "[{}]",
            c.label
        );

        // A second sandbox and the host's claude use the new access token, no re-login.
        let o = run(&mut ask(&w, &p, &mock, &ca, true));
        answered(&c, "a later sandbox", &o, &mock);
        let o = run(&mut ask(&w, &p, &mock, &ca, false));
        answered(&c, "the host's claude", &o, &mock);
        assert_eq!(mock.refreshes().len(), 1, "[{}]", c.label);
        assert!(last_bearer(&mock).contains("'0001'"), "[{}]", c.label);

        // When it expires, the host's claude refreshes with the token the sandbox got.
        let mut expired = host_creds(&w);
        expired["claudeAiOauth"]["expiresAt"] = json!(1000);
        write_creds(&w, &expired);
        let o = run(&mut ask(&w, &p, &mock, &ca, false));
        answered(&c, "the host's claude, refreshing", &o, &mock);
        assert_eq!(
            mock.refreshes()[1],
            ("0001".to_string(), Some("0002".to_string())),
            "[{}]",
            c.label
        );

        // Control: had the rotation not reached the host (its file as before the
        // sandbox's refresh), the host's claude would spend a dead token and be logged out.
        fs::write(creds_path(&w), &before).unwrap();
        let o = run(&mut ask(&w, &p, &mock, &ca, false));
        eprintln!(
            "[{}] control, the host with its pre-refresh file: {:?}, stdout {:?}, stderr {:?}",
            c.label,
            o.status.code(),
            lab::stdout(&o).trim(),
            lab::stderr(&o).trim()
        );
        assert!(
            !o.status.success() && !lab::stdout(&o).contains(FINAL),
            "[{}] control: the stale login still answered",
            c.label
        );
        assert_eq!(
            mock.refreshes().last(),
            Some(&(tail4(SEED_REFRESH).to_string(), None)),
            "[{}] control: the spent token is refused",
            c.label
        );
        assert_eq!(
            host_creds(&w)["claudeAiOauth"]["refreshToken"],
            "",
            "[{}] control: claude clears a dead refresh token from the file",
            c.label
        );
    }
}

/// Two claudes started together, both finding the access token expired; the mock takes
/// `TOKEN_DELAY_MS` to answer a refresh, so that the second reads the file before the
/// first's new tokens are in it: only a shared lock keeps it from refreshing too.
const TOKEN_DELAY_MS: u64 = 1500;

fn at_once(a: &mut Command, b: &mut Command) -> (Output, Output) {
    std::thread::scope(|s| {
        let ta = s.spawn(|| run(a));
        let tb = s.spawn(|| run(b));
        (ta.join().unwrap(), tb.join().unwrap())
    })
}

#[test]
fn two_sandboxes_refreshing_at_once_spend_the_token_once() {
    for c in lab::agent::each_claude_timed() {
        let (w, p, mock, ca) = setup(&c, TOKEN_DELAY_MS);
        let mut last = SEED_REFRESH.to_string();
        for round in 0..1 {
            let before = mock.refreshes().len();
            let (oa, ob) = at_once(
                &mut ask(&w, &p, &mock, &ca, true),
                &mut ask(&w, &p, &mock, &ca, true),
            );
            answered(&c, "sandbox A", &oa, &mock);
            answered(&c, "sandbox B", &ob, &mock);
            let now = mock.refreshes()[before..].to_vec();
            eprintln!(
                "[{}] round {round}: two sandboxes at once: {} refresh(es) {now:?}",
                c.label,
                now.len()
            );
            assert_eq!(
                now.len(),
                1,
                "[{}] round {round}: the shared lock lets one refresh: {now:?}",
                c.label
            );
            assert_eq!(now[0].0, tail4(&last), "[{}]", c.label);
            let host = host_creds(&w);
            last = host["claudeAiOauth"]["refreshToken"]
                .as_str()
                .unwrap()
                .to_string();
            assert_eq!(Some(tail4(&last).to_string()), now[0].1, "[{}]", c.label);
            let mut expired = host;
            expired["claudeAiOauth"]["expiresAt"] = json!(1000);
            write_creds(&w, &expired);
        }

        // Control: the host's claude keeps its lock in the real ~/.claude, which no
        // sandbox shares: the host and a sandbox at once both spend the same token.
        let before = mock.refreshes().len();
        let (oh, os) = at_once(
            &mut ask(&w, &p, &mock, &ca, false),
            &mut ask(&w, &p, &mock, &ca, true),
        );
        let now = mock.refreshes()[before..].to_vec();
        let end = host_creds(&w);
        eprintln!(
            "[{}] control, the host and a sandbox at once: {} refresh(es) {now:?}; host \
             claude {:?} {:?}, sandbox {:?} {:?}; the file ends with refresh token ..{}",
            c.label,
            now.len(),
            oh.status.code(),
            lab::stdout(&oh).trim(),
            os.status.code(),
            lab::stdout(&os).trim(),
            tail4(
                end["claudeAiOauth"]["refreshToken"]
                    .as_str()
                    .unwrap_or("none")
            ),
        );
        assert_eq!(now.len(), 2, "[{}] control: {now:?}", c.label);
        assert_eq!(now[0].0, now[1].0, "[{}] control: {now:?}", c.label);
        assert_eq!(
            now.iter().filter(|r| r.1.is_none()).count(),
            1,
            "[{}] control: the second use is refused: {now:?}",
            c.label
        );

        // The README's opt-in: the host's claude keeps its login in claudebox's login
        // directory (CLAUDE_SECURESTORAGE_CONFIG_DIR), so it shares the sandboxes' lock.
        let login = w.state().join("login");
        fs::create_dir_all(&login).unwrap();
        // The pair the control's winning refresh issued (the mock names its tokens by a
        // counter): the file itself may end cleared, when the refused claude clears it
        // after the winner wrote.
        let won = now
            .iter()
            .find_map(|r| r.1.clone())
            .expect("one refresh of the control was answered");
        let last = format!("sk-ant-ort01-mock-r{won}");
        let expired = credentials(&format!("sk-ant-oat01-mock-a{won}"), &last);
        fs::write(login.join(".credentials.json"), expired.to_string()).unwrap();
        fs::remove_file(creds_path(&w)).unwrap();
        let before = mock.refreshes().len();
        let (mut h, mut s) = (
            ask(&w, &p, &mock, &ca, false),
            ask(&w, &p, &mock, &ca, true),
        );
        for cmd in [&mut h, &mut s] {
            cmd.env("CLAUDE_SECURESTORAGE_CONFIG_DIR", &login);
        }
        let (oh, os) = at_once(&mut h, &mut s);
        answered(&c, "the host's claude, opted in", &oh, &mock);
        answered(&c, "a sandbox beside it", &os, &mock);
        let now = mock.refreshes()[before..].to_vec();
        eprintln!(
            "[{}] opt-in, the host and a sandbox at once: {} refresh(es) {now:?}",
            c.label,
            now.len()
        );
        assert_eq!(now.len(), 1, "[{}] opt-in: {now:?}", c.label);
        assert_eq!(now[0].0, tail4(&last), "[{}]", c.label);
        let end: Value =
            serde_json::from_slice(&fs::read(login.join(".credentials.json")).unwrap()).unwrap();
        assert_eq!(
            now[0].1.as_deref(),
            Some(tail4(
                end["claudeAiOauth"]["refreshToken"].as_str().unwrap()
            )),
            "[{}]",
            c.label
        );
    }
}

/// A sandbox started now that waits (for `go` in the project) before its claude asks,
/// run on a thread: `started` returns once the sandbox is up (its `ready` file).
fn waiting_sandbox<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    w: &World,
    p: &Path,
    mock: &MockApi,
    ca: &Path,
    sync: bool,
) -> std::thread::ScopedJoinHandle<'s, Output> {
    let _ = fs::remove_file(p.join("go"));
    let _ = fs::remove_file(p.join("ready"));
    let mut cmd = w.cmd(p);
    cmd.envs(mock.oauth_env(ca)).args([
        "--no-login-broker",
        "--exec",
        "sh",
        "-c",
        "touch ready; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); \
         done; exec claude -p hello",
    ]);
    if !sync {
        cmd.env("CLAUDEBOX_NO_CREDENTIALS_SYNC", "1");
    }
    let h = s.spawn(move || run(&mut cmd));
    let t = std::time::Instant::now();
    while !p.join("ready").exists() {
        assert!(t.elapsed() < LIMIT, "the sandbox did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    h
}

/// Lets the sandbox's claude go on, once the sync had time to copy (it reacts to inotify
/// at once; the pause only keeps a loaded machine from making this test flaky).
fn go(p: &Path) {
    std::thread::sleep(Duration::from_millis(500));
    fs::write(p.join("go"), b"").unwrap();
}

#[test]
fn a_refresh_by_the_host_reaches_a_running_sandbox() {
    for c in lab::agent::each_claude() {
        for sync in [true, false] {
            let (w, p, mock, ca) = setup(&c, 0);
            let inode = fs::metadata(creds_path(&w)).unwrap().ino();
            let o = std::thread::scope(|s| {
                let sandbox = waiting_sandbox(s, &w, &p, &mock, &ca, sync);
                // The host's claude refreshes: its file becomes a new inode.
                let o = run(&mut ask(&w, &p, &mock, &ca, false));
                answered(&c, "the host's claude", &o, &mock);
                assert_ne!(
                    fs::metadata(creds_path(&w)).unwrap().ino(),
                    inode,
                    "[{}] the host's claude replaced its file by rename",
                    c.label
                );
                go(&p);
                sandbox.join().unwrap()
            });
            let refreshes = mock.refreshes();
            eprintln!(
                "[{}] sync {sync}: the sandbox started before the host's refresh: {:?}, \
                 refreshes {refreshes:?}, stderr {:?}",
                c.label,
                o.status.code(),
                lab::stderr(&o).trim()
            );
            if sync {
                answered(&c, "the sandbox after the host's refresh", &o, &mock);
                assert_eq!(
                    refreshes,
                    vec![(tail4(SEED_REFRESH).to_string(), Some("0001".to_string()))],
                    "[{}] the sandbox used the host's new pair, no refresh of its own",
                    c.label
                );
                assert!(last_bearer(&mock).contains("'0001'"), "[{}]", c.label);
            } else {
                // Control: the sandbox keeps the old file with the spent refresh token.
                assert!(
                    !o.status.success() && !lab::stdout(&o).contains(FINAL),
                    "[{}] control: the sandbox answered without the sync",
                    c.label
                );
                assert_eq!(
                    refreshes.last(),
                    Some(&(tail4(SEED_REFRESH).to_string(), None)),
                    "[{}] control: the sandbox spent the dead token",
                    c.label
                );
            }
        }
    }
}

#[test]
fn a_refresh_in_a_sandbox_reaches_the_hosts_replaced_file() {
    for c in lab::agent::each_claude() {
        for sync in [true, false] {
            let (w, p, mock, ca) = setup(&c, 0);
            let o = std::thread::scope(|s| {
                let sandbox = waiting_sandbox(s, &w, &p, &mock, &ca, sync);
                // The host's file is replaced by rename (same content, say a host claude
                // rewrote it): the sandbox now holds a file the host no longer reads.
                let tmp = w.home().join(".claude/.credentials.json.tmp.test");
                fs::copy(creds_path(&w), &tmp).unwrap();
                fs::rename(&tmp, creds_path(&w)).unwrap();
                go(&p);
                sandbox.join().unwrap()
            });
            answered(&c, "the sandbox, refreshing", &o, &mock);
            assert_eq!(mock.refreshes().len(), 1, "[{}]", c.label);
            std::thread::sleep(Duration::from_millis(500));
            let host = host_creds(&w);
            let o = run(&mut ask(&w, &p, &mock, &ca, false));
            eprintln!(
                "[{}] sync {sync}: the host after a sandbox's refresh into its old file: \
                 refresh token ..{}, host claude {:?}, refreshes {:?}",
                c.label,
                tail4(
                    host["claudeAiOauth"]["refreshToken"]
                        .as_str()
                        .unwrap_or("none")
                ),
                o.status.code(),
                mock.refreshes()
            );
            if sync {
                assert_eq!(
                    host["claudeAiOauth"]["refreshToken"], "sk-ant-ort01-mock-r0001",
                    "[{}] the sandbox's rotated pair is in the host's file: {host}",
                    c.label
                );
                answered(&c, "the host's claude", &o, &mock);
                assert_eq!(mock.refreshes().len(), 1, "[{}]", c.label);
                assert!(last_bearer(&mock).contains("'0001'"), "[{}]", c.label);
            } else {
                // Control: the host kept the spent token and is logged out.
                assert!(
                    !o.status.success() && !lab::stdout(&o).contains(FINAL),
                    "[{}] control: the host answered without the sync",
                    c.label
                );
                assert_eq!(
                    mock.refreshes().last(),
                    Some(&(tail4(SEED_REFRESH).to_string(), None)),
                    "[{}] control",
                    c.label
                );
            }
        }
    }
}

#[test]
fn dry_run_shows_the_sync_only_with_a_credentials_file() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    assert!(
        !lab::dry_run(&w, &p).contains("# credentials sync"),
        "no credentials file (an API key user): no sync process"
    );
    fs::create_dir_all(w.home().join(".claude")).unwrap();
    write_creds(&w, &credentials(SEED_ACCESS, SEED_REFRESH));
    let out = lab::ok(
        &w.cmd(&p)
            .args(["--no-login-broker", "--dry-run"])
            .output()
            .unwrap(),
    );
    assert!(
        out.contains("# credentials sync: started on the host"),
        "{out}"
    );
    // By default the broker keeps that login on the host: no sync.
    let out = lab::dry_run(&w, &p);
    assert!(!out.contains("# credentials sync"), "{out}");
    assert!(
        out.contains("# login broker: in the proxy process"),
        "{out}"
    );
}
