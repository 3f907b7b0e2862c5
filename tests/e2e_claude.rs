//! End to end with the real Claude Code CLI (offline commands only): it starts inside the
//! sandbox, sees a user-scope MCP server configured on the host, and `claude mcp add -s
//! user` inside reaches the host's `~/.claude.json`, which stays valid JSON.
//!
//! The CLI comes from `CLAUDEBOX_TEST_CLAUDE` (the pinned version) and
//! `CLAUDEBOX_TEST_CLAUDE_LATEST` (the newest; scripts/test installs both); the test runs
//! with each. Without them it fails, unless `CLAUDEBOX_SKIP_E2E=1` says to skip it.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use common::*;

/// A world whose `claude` is the real CLI, linked the way npm links it.
fn world_with_real_claude(claude: &PathBuf) -> World {
    let w = World::new();
    fs::remove_file(w.bin().join("claude")).unwrap();
    symlink(claude, w.bin().join("claude")).unwrap();
    w
}

#[test]
fn real_claude_runs_inside_and_shares_user_mcp_config_with_the_host() {
    for c in common::lab::claude_versions() {
        shares_user_mcp_config_with_the_host(&c.bin);
    }
}

fn shares_user_mcp_config_with_the_host(claude: &PathBuf) {
    let w = world_with_real_claude(claude);
    let host_cfg = w.home().join(".claude.json");
    fs::write(
        &host_cfg,
        r#"{"hasCompletedOnboarding":true,"mcpServers":{"host-side-server":{"type":"stdio","command":"/bin/true","args":[],"env":{}}}}"#,
    )
    .unwrap();
    let p = w.dir("proj");

    let v = w.cmd(&p).arg("--version").output().unwrap();
    let version = ok(&v);
    assert!(version.contains("Claude Code"), "{version}");

    let list = w.cmd(&p).args(["mcp", "list"]).output().unwrap();
    let listed = ok(&list);
    assert!(
        listed.contains("host-side-server"),
        "host MCP server not listed inside:\n{listed}\n{}",
        stderr(&list)
    );

    let add = w
        .cmd(&p)
        .args([
            "mcp",
            "add",
            "-s",
            "user",
            "added-inside",
            "--",
            "/bin/echo",
            "hi",
        ])
        .output()
        .unwrap();
    ok(&add);
    let text = fs::read_to_string(&host_cfg).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&text).expect("host ~/.claude.json is valid JSON");
    let servers = &json["mcpServers"];
    assert!(
        servers.get("added-inside").is_some(),
        "server added inside did not reach the host:\n{text}"
    );
    assert!(
        servers.get("host-side-server").is_some(),
        "host server lost:\n{text}"
    );

    // the conversation-less run left the host's own ~/.claude/projects alone
    assert!(fs::read_dir(w.home().join(".claude/projects"))
        .map(|d| d.count() == 0)
        .unwrap_or(true));
}
