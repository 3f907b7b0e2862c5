//! Planted locks block nobody (issue 21): a lock directory an agent makes in the login
//! directory shared by every project's sandboxes (`.oauth_refresh.lock`), dated in the
//! future so Claude Code (proper-lockfile, stale after 10 s of no mtime update) would
//! never take it over, is cleared by the host side of a running sandbox of another
//! project within the stale time. Control: with the credentials sync off
//! (`CLAUDEBOX_NO_CREDENTIALS_SYNC`), the same lock is still there after the stale time.
//! The same when the host has no `.credentials.json` (no sync process runs): the launcher
//! of each running sandbox sweeps the login directory itself.
//! And a `.claude.json.lock` planted the same way in the project does not hold up its
//! next launch.

use std::fs;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::BIN;
use lab::*;

const PLANT: &str = "L=\"$CLAUDE_SECURESTORAGE_CONFIG_DIR\"; \
                     mkdir \"$L/.oauth_refresh.lock\" && \
                     touch -d 2099-01-01 \"$L/.oauth_refresh.lock\" && echo PLANTED";

/// Claude Code's stale time, and a little more.
const STALE: Duration = Duration::from_secs(10);

fn world(credentials: bool) -> World {
    let w = World::new(BIN);
    if !credentials {
        return w;
    }
    fs::write(
        w.home().join(".claude/.credentials.json"),
        "{\"claudeAiOauth\": {\"accessToken\": \"a\", \"refreshToken\": \"r\", \"expiresAt\": 1}}\n",
    )
    .unwrap();
    w
}

/// Another project's sandbox, running while the agent plants.
fn other_sandbox(w: &World, sync: bool) -> Child {
    let p = w.dir("other");
    init_repo(&p);
    let mut c = w.cmd(&p);
    c.arg("--no-login-broker");
    if !sync {
        c.env("CLAUDEBOX_NO_CREDENTIALS_SYNC", "1");
    }
    c.args(["--exec", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// How long the planted lock stayed (`None`: still there after `limit`).
fn planted_lock_lasts(sync: bool, credentials: bool, limit: Duration) -> Option<Duration> {
    let w = world(credentials);
    let mut b = other_sandbox(&w, sync);
    let lock = w.state().join("login/.oauth_refresh.lock");
    // B's sync process is up when B's sandbox runs.
    std::thread::sleep(Duration::from_millis(1500));
    let proj = w.dir("proj");
    init_repo(&proj);
    let mut a = w.cmd(&proj);
    a.arg("--no-login-broker");
    if !sync {
        a.env("CLAUDEBOX_NO_CREDENTIALS_SYNC", "1");
    }
    // A's agent plants and keeps running (a sibling: its own sync sees it too).
    let o = a
        .args(["--exec", "sh", "-c", &format!("{PLANT}; sleep 1")])
        .output()
        .unwrap();
    let start = Instant::now();
    assert!(stdout(&o).contains("PLANTED"), "{}", stderr(&o));
    let gone = loop {
        if fs::symlink_metadata(&lock).is_err() {
            break Some(start.elapsed());
        }
        if start.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = b.kill();
    let _ = b.wait();
    gone
}

#[test]
fn a_future_dated_refresh_lock_in_the_login_dir_is_cleared_within_the_stale_time() {
    // Bound by time: one heavy test at a time. The control below only waits for nothing
    // to happen, which a loaded machine does not hasten: it runs beside the heavy tests.
    let heavy = heavy();
    let took = planted_lock_lasts(true, true, STALE);
    drop(heavy);
    eprintln!("planted .oauth_refresh.lock cleared after {took:?}");
    assert!(
        took.is_some(),
        "the planted lock outlived claude's stale time"
    );
    // Control: nothing on the host clears it; claude never would (dated 2099).
    assert_eq!(
        planted_lock_lasts(false, true, STALE + Duration::from_secs(1)),
        None,
        "control: the planted lock went away by itself"
    );
}

/// With no `.credentials.json` on the host no sync process runs: the launchers of the
/// running sandboxes sweep the login directory instead.
#[test]
fn without_host_credentials_a_planted_refresh_lock_is_cleared_within_the_stale_time() {
    // As above: the heavy lock for the timed part only.
    let heavy = heavy();
    let took = planted_lock_lasts(true, false, STALE);
    drop(heavy);
    eprintln!("planted .oauth_refresh.lock (no host credentials) cleared after {took:?}");
    assert!(
        took.is_some(),
        "the planted lock outlived claude's stale time"
    );
    // Control: the sweep off (with the sync, `CLAUDEBOX_NO_CREDENTIALS_SYNC`).
    assert_eq!(
        planted_lock_lasts(false, false, STALE + Duration::from_secs(1)),
        None,
        "control: the planted lock went away by itself"
    );
}

#[test]
fn a_planted_claude_json_lock_does_not_hold_up_the_next_launch() {
    let w = world(true);
    let proj = w.dir("proj");
    init_repo(&proj);
    let plant = "mkdir ~/.claude/.claude.json.lock && \
                 touch -d 2099-01-01 ~/.claude/.claude.json.lock && echo PLANTED";
    let o = w
        .cmd(&proj)
        .args(["--exec", "sh", "-c", plant])
        .output()
        .unwrap();
    assert!(stdout(&o).contains("PLANTED"), "{}", stderr(&o));
    // The host's file changes: the next launch merges under the lock.
    fs::write(w.home().join(".claude.json"), "{\"n\": 1}\n").unwrap();
    let start = Instant::now();
    let o = w.cmd(&proj).args(["--exec", "true"]).output().unwrap();
    let took = start.elapsed();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(took < STALE, "the launch waited {took:?}");
    let copy = fs::read_dir(w.state().join("projects"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path()
        .join("claude-config/.claude.json");
    assert!(
        fs::read_to_string(Path::new(&copy))
            .unwrap()
            .contains("\"n\": 1"),
        "the merge did not happen"
    );
}
