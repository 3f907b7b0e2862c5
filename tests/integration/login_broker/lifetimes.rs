//! Many token lifetimes with no claude on the host: the lab's token endpoint issues
//! access tokens that expire (for the broker) 1 s after they are issued, and the mock
//! refuses each as dead 3 s after it issued it (`token_expires_in` is 300 s more than the
//! lifetime: the broker refreshes within 5 minutes of the end, as claude does). One
//! sandbox holds one conversation whose every turn is a Bash call that outlasts a
//! lifetime, so each request of the conversation finds the host's login expired:
//! every request is answered, the refresh token is spent once per lifetime (each
//! refresh spends the token the last one got, never two in one lifetime), and no dead
//! token is tried again. `CLAUDEBOX_TEST_LIFETIMES` sets how many (8 unless set: the
//! figure in BENCHMARKS.md is 32 lifetimes of 2 s, a run of its own; in CI the test held
//! the machine-wide heavy lock 162 s per user with those, 48 s with 8 of 2 s).

use std::fs;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{expired, host_file, upstream_env, SEED_ACCESS, SEED_REFRESH};
use crate::BIN;
use lab::agent::{self, MockApi};

/// A token's lifetime for the broker, in seconds (the mock kills it 2 s later: the same
/// margin for a request in flight as with longer lifetimes, in half the test's time).
const LIFE_S: u64 = 1;

#[test]
fn one_sandbox_talks_over_many_token_lifetimes_and_each_refresh_token_is_spent_once() {
    let _g = lab::heavy();
    let lifetimes: usize = std::env::var("CLAUDEBOX_TEST_LIFETIMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    // The versions' conversations at once (each its own world and mock; they mostly
    // sleep through their turns), then each one's checks.
    let versions = agent::claude_versions();
    let talks: Vec<_> = std::thread::scope(|s| {
        let talking: Vec<_> = versions
            .iter()
            .map(|c| s.spawn(move || talk(c, lifetimes, LIFE_S, LIFE_S as f64 + 0.3, LIFE_S + 2)))
            .collect();
        talking
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    for (c, (w, mock, o, took)) in versions.iter().zip(talks) {
        let out = agent::ok_run(c, &o, &mock);
        assert!(
            out.contains("talked through every lifetime"),
            "[{}] the conversation did not end: {out}\n{}",
            c.label,
            lab::stderr(&o)
        );

        let log = mock.log();
        // Every request answered: none carried a token the mock had not issued or that
        // had died.
        let refused: Vec<&Value> = log.iter().filter(|r| r["kind"] == "unauthorized").collect();
        assert!(
            refused.is_empty(),
            "[{}] requests with a dead token: {refused:?}",
            c.label
        );
        let spent: Vec<(String, Option<String>, f64)> = log
            .iter()
            .filter(|r| r["kind"] == "oauth_refresh")
            .map(|r| {
                (
                    r["old"].as_str().unwrap_or_default().to_string(),
                    r["new"].as_str().map(str::to_string),
                    r["time"].as_f64().unwrap_or_default(),
                )
            })
            .collect();
        // Each turn outlasts a lifetime: at least one refresh per turn; and no more than
        // the lifetimes that passed.
        assert!(
            spent.len() >= lifetimes,
            "[{}] {} refreshes for {lifetimes} lifetimes: {spent:?}",
            c.label,
            spent.len()
        );
        let most = took.as_secs_f64() / LIFE_S as f64 + 1.0;
        assert!(
            spent.len() as f64 <= most,
            "[{}] {} refreshes in {took:?}: {spent:?}",
            c.label,
            spent.len()
        );
        // A chain: each refresh spends what the last one got, none refused (a dead token
        // is never tried again), none within a lifetime of the last.
        let mut last = SEED_REFRESH[SEED_REFRESH.len() - 4..].to_string();
        let mut at = 0.0;
        for (i, (old, new, time)) in spent.iter().enumerate() {
            assert_eq!(old, &last, "[{}] refresh {i}: {spent:?}", c.label);
            let new = new
                .clone()
                .unwrap_or_else(|| panic!("[{}] refresh {i} refused: {spent:?}", c.label));
            if i > 0 {
                assert!(
                    time - at >= LIFE_S as f64 - 0.5,
                    "[{}] refresh {i} {:.2} s after the last: {spent:?}",
                    c.label,
                    time - at
                );
            }
            last = new;
            at = *time;
        }
        let host = host_file(&w);
        assert!(
            host["claudeAiOauth"]["refreshToken"]
                .as_str()
                .unwrap()
                .ends_with(&last),
            "[{}] the host's file holds the last pair: {host}",
            c.label
        );
        lab::figure!(
            "login broker, {} token lifetimes of {LIFE_S} s with no host claude ({}): {} \
             refreshes, each spending the last one's token, 0 refused, 0 requests with a \
             dead token, {:.0} s",
            lifetimes,
            c.label,
            spent.len(),
            took.as_secs_f64()
        );
    }
    // Control: with lifetimes of 2 s, the mock refuses a token 1 s after issuing it,
    // before the broker's 2 s are over, and each turn sleeps 1.5 s: the requests with a
    // dead token are seen.
    let c = &agent::claude_versions()[0];
    let (_, mock, _, _) = talk(c, 3, 2, 1.5, 1);
    assert!(
        mock.log().iter().any(|r| r["kind"] == "unauthorized"),
        "[{}] control: no request with a dead token seen",
        c.label
    );
}

/// One sandbox of `c`'s claude holding a conversation of `turns` Bash calls that each
/// sleep `sleep_s`, the mock's access tokens expiring for the broker `life_s` after
/// they are issued and refused by the mock `dies_after` seconds after.
fn talk(
    c: &agent::Claude,
    turns: usize,
    life_s: u64,
    sleep_s: f64,
    dies_after: u64,
) -> (lab::World, MockApi, std::process::Output, Duration) {
    let w = agent::world_with(BIN, c);
    let p = w.dir("proj");
    let n = turns;
    let mut turns: Vec<Value> = (0..n)
        .map(|i| {
            json!({"bash": {
                "command": format!("sleep {sleep_s}; echo turn {i}"),
                "description": "outlast a token"
            }})
        })
        .collect();
    turns.push(json!("talked through every lifetime"));
    let mock = MockApi::start_oauth(
        &json!({
            "turns": turns,
            "token_expires_in": 300 + life_s,
            "token_dies_after": dies_after,
        }),
        SEED_REFRESH,
    );
    fs::write(
        w.home().join(".claude/.credentials.json"),
        expired(SEED_ACCESS, SEED_REFRESH).to_string(),
    )
    .unwrap();
    let mut seed = agent::claude_json_seed(&[&p]);
    seed.as_object_mut()
        .unwrap()
        .remove("customApiKeyResponses");
    fs::write(w.home().join(".claude.json"), seed.to_string()).unwrap();

    let started = Instant::now();
    let mut cmd = w.cmd(&p);
    cmd.envs(upstream_env(&mock)).args([
        "--login-broker",
        "--network",
        "none",
        "-p",
        "hello",
        "--allowedTools",
        "Bash",
    ]);
    let limit = Duration::from_secs(60 + 8 * n as u64);
    let o = agent::output_within(&mut cmd, limit).unwrap();
    let took = started.elapsed();
    (w, mock, o, took)
}
