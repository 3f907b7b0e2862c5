//! `.claude.json` as shared state (issue 13, point 3): N sandboxes of one project each
//! run the real `claude mcp add` at once, while the host's own claude adds servers to the
//! host's file and readers parse both files in a loop. Prints the figures: invalid reads
//! and lost updates, which must both be 0.
//!
//! Short by default (a few rounds, for CI); `CLAUDEBOX_CONCURRENCY_ROUNDS` and
//! `CLAUDEBOX_CONCURRENCY_SANDBOXES` make the long run recorded in BENCHMARKS.md, and
//! `CLAUDEBOX_CONCURRENCY_VERSION=pinned` picks 2.1.197 instead of the newest.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use crate::BIN;
use lab::*;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Parses `path` over and over until told to stop: (reads, invalid reads).
fn reader(path: PathBuf, stop: Arc<AtomicBool>, reads: Arc<AtomicU64>, invalid: Arc<AtomicU64>) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(bytes) = fs::read(&path) {
            reads.fetch_add(1, Ordering::Relaxed);
            if serde_json::from_slice::<serde_json::Value>(&bytes).is_err() {
                invalid.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn servers(path: &Path) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    let mut out: Vec<String> = v["mcpServers"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    for p in v["projects"].as_object().into_iter().flatten() {
        out.extend(
            p.1["mcpServers"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k.clone()),
        );
    }
    out
}

#[test]
fn sandboxes_and_the_host_add_mcp_servers_at_once_nothing_lost_nothing_invalid() {
    let _heavy = lab::heavy();
    // The newest in CI (2.1.197 loses updates to its own siblings even bare: its config
    // lock does not wait); `CLAUDEBOX_CONCURRENCY_VERSION=pinned` for 2.1.197.
    let want = std::env::var("CLAUDEBOX_CONCURRENCY_VERSION").unwrap_or_else(|_| "latest".into());
    let Some(c) = lab::agent::claude_versions()
        .into_iter()
        .find(|c| c.label == want)
    else {
        return;
    };
    let rounds = env_num("CLAUDEBOX_CONCURRENCY_ROUNDS", 3);
    let n = env_num("CLAUDEBOX_CONCURRENCY_SANDBOXES", 4);
    let w = World::new(BIN);
    fs::remove_file(w.bin().join("claude")).unwrap();
    symlink(&c.bin, w.bin().join("claude")).unwrap();
    let host_json = w.home().join(".claude.json");
    fs::write(&host_json, "{\"hasCompletedOnboarding\":true}\n").unwrap();
    let p = w.dir("proj");
    ok(&w.cmd(&p).args(["--exec", "true"]).output().unwrap());
    let id = env_in_dry_run(&dry_run(&w, &p), "CLAUDEBOX_PROJECT_ID").unwrap();
    let project_json = w
        .state()
        .join("projects")
        .join(&id)
        .join("claude-config/.claude.json");

    let stop = Arc::new(AtomicBool::new(false));
    let counters: Vec<(Arc<AtomicU64>, Arc<AtomicU64>)> = (0..2)
        .map(|_| (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))))
        .collect();
    let readers: Vec<_> = [project_json.clone(), host_json.clone()]
        .into_iter()
        .zip(counters.iter().cloned())
        .map(|(path, (r, i))| {
            let stop = stop.clone();
            thread::spawn(move || reader(path, stop, r, i))
        })
        .collect();

    let mut expected_inside = Vec::new();
    let mut expected_host = Vec::new();
    let start = std::time::Instant::now();
    for round in 0..rounds {
        let mut children = Vec::new();
        for i in 0..n {
            let name = format!("sb-{round}-{i}");
            let scope = if i % 2 == 0 { "user" } else { "local" };
            children.push(
                w.cmd(&p)
                    .args(["mcp", "add", "-s", scope, &name, "--", "/bin/true"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            expected_inside.push(name);
        }
        let host_name = format!("host-{round}");
        let host = Command::new(&c.bin)
            .args(["mcp", "add", "-s", "user", &host_name, "--", "/bin/true"])
            .current_dir(w.work())
            .env_clear()
            .env("HOME", w.home())
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        assert!(host.status.success(), "{}", stderr(&host));
        expected_host.push(host_name);
        for ch in children {
            let o = ch.wait_with_output().unwrap();
            assert!(o.status.success(), "{}", stderr(&o));
        }
    }
    // One more launch brings the host's last changes in.
    ok(&w.cmd(&p).args(["--exec", "true"]).output().unwrap());
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let inside = servers(&project_json);
    let host = servers(&host_json);
    let lost_inside = expected_inside
        .iter()
        .filter(|s| !inside.contains(s))
        .count();
    let host_lost_inside = expected_host.iter().filter(|s| !inside.contains(s)).count();
    let lost_host = expected_host.iter().filter(|s| !host.contains(s)).count();
    let leaked = host.iter().filter(|s| s.starts_with("sb-")).count();
    let (pr, pi) = (&counters[0].0, &counters[0].1);
    let (hr, hi) = (&counters[1].0, &counters[1].1);
    println!(
        "claude {} ({}): {rounds} rounds x {n} sandboxes + the host, {:.1}s: \
         project file {} reads, {} invalid; host file {} reads, {} invalid; \
         lost: {lost_inside} of {} sandbox updates, {host_lost_inside} of {} host updates \
         not in the project's file after the next launch, {lost_host} of the host's own; \
         sandbox servers in the host's file: {leaked}",
        c.label,
        c.bin.display(),
        start.elapsed().as_secs_f64(),
        pr.load(Ordering::Relaxed),
        pi.load(Ordering::Relaxed),
        hr.load(Ordering::Relaxed),
        hi.load(Ordering::Relaxed),
        expected_inside.len(),
        expected_host.len(),
    );
    let missing: Vec<&String> = expected_inside
        .iter()
        .chain(&expected_host)
        .filter(|s| !inside.contains(s))
        .collect();
    println!("missing from the project's file: {missing:?}");
    assert_eq!(pi.load(Ordering::Relaxed) + hi.load(Ordering::Relaxed), 0);
    assert_eq!(
        (lost_inside, host_lost_inside, lost_host, leaked),
        (0, 0, 0, 0)
    );
}
