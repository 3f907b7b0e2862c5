//! End to end with the real Claude Code CLI (offline commands only): it starts inside the
//! sandbox, sees a user-scope MCP server configured on the host, and `claude mcp add -s
//! user` inside lands in the project's own `.claude.json`: it shows in the project's next
//! sandbox, never in the host's file or another project. A host change shows at the next
//! launch.
//!
//! The CLI comes from `CLAUDEBOX_TEST_CLAUDE` (the pinned version) and
//! `CLAUDEBOX_TEST_CLAUDE_LATEST` (the newest; scripts/test installs both); the test runs
//! with each. Without them it fails, unless `CLAUDEBOX_SKIP_E2E=1` says to skip it.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use crate::BIN;
use lab::*;

/// A world whose `claude` is the real CLI, linked the way npm links it.
fn world_with_real_claude(claude: &PathBuf) -> World {
    let w = World::new(BIN);
    fs::remove_file(w.bin().join("claude")).unwrap();
    symlink(claude, w.bin().join("claude")).unwrap();
    w
}

#[test]
fn real_claude_mcp_config_is_the_projects_and_follows_the_host() {
    for c in lab::agent::each_claude() {
        mcp_config_is_the_projects(&c.bin);
    }
}

fn mcp_config_is_the_projects(claude: &PathBuf) {
    let w = world_with_real_claude(claude);
    let host_cfg = w.home().join(".claude.json");
    let host_text = r#"{"hasCompletedOnboarding":true,"mcpServers":{"host-side-server":{"type":"stdio","command":"/bin/true","args":[],"env":{}}}}"#;
    fs::write(&host_cfg, host_text).unwrap();
    let p = w.dir("proj");
    let q = w.dir("other");

    let v = w.cmd(&p).arg("--version").output().unwrap();
    let version = ok(&v);
    assert!(version.contains("Claude Code"), "{version}");

    let list = |dir: &PathBuf| {
        let o = w.cmd(dir).args(["mcp", "list"]).output().unwrap();
        format!("{}{}", ok(&o), stderr(&o))
    };
    let listed = list(&p);
    assert!(
        listed.contains("host-side-server"),
        "host MCP server not listed inside:\n{listed}"
    );

    for (scope, name) in [("user", "added-inside"), ("local", "added-local")] {
        let add = w
            .cmd(&p)
            .args(["mcp", "add", "-s", scope, name, "--", "/bin/echo", "hi"])
            .output()
            .unwrap();
        ok(&add);
    }
    // The host's file is as the host wrote it.
    assert_eq!(fs::read_to_string(&host_cfg).unwrap(), host_text);
    // The project's next sandbox lists both; another project neither.
    let again = list(&p);
    assert!(
        again.contains("added-inside") && again.contains("added-local"),
        "{again}"
    );
    let other = list(&q);
    assert!(
        !other.contains("added-inside") && !other.contains("added-local"),
        "{other}"
    );
    assert!(other.contains("host-side-server"), "{other}");

    // A host change shows at the next launch, beside the project's own.
    fs::write(
        &host_cfg,
        r#"{"hasCompletedOnboarding":true,"mcpServers":{"host-side-server":{"type":"stdio","command":"/bin/true","args":[],"env":{}},"host-later":{"type":"stdio","command":"/bin/true","args":[],"env":{}}}}"#,
    )
    .unwrap();
    let after = list(&p);
    assert!(
        after.contains("host-later") && after.contains("added-inside"),
        "{after}"
    );

    // The conversation-less runs left the host's own ~/.claude alone.
    assert!(fs::read_dir(w.home().join(".claude"))
        .map(|d| d.count() == 0)
        .unwrap_or(true));
}

/// The user's setup works inside although it is read-only: a `PreToolUse` hook from the
/// host's `~/.claude/settings.json` runs a script from `~/.claude/hooks/` (named by its
/// `$HOME/.claude/...` path) before the Bash call of a `-p` conversation, and a user slash
/// command from `~/.claude/commands/` expands into the prompt the API receives, and a
/// skill from `~/.claude/skills/` is offered to the model.
#[test]
fn real_claude_runs_the_users_hooks_and_commands_from_the_read_only_setup() {
    use lab::agent::{MockApi, API_KEY};
    for c in lab::agent::each_claude() {
        let w = world_with_real_claude(&c.bin);
        let p = w.dir("proj");
        init_repo(&p);
        let claude = w.home().join(".claude");
        fs::create_dir_all(claude.join("hooks")).unwrap();
        fs::create_dir_all(claude.join("commands")).unwrap();
        let marker = p.join("hook-ran");
        fs::write(
            claude.join("hooks/mark.sh"),
            format!("#!/bin/sh\necho ran >> '{}'\nexit 0\n", marker.display()),
        )
        .unwrap();
        let settings = serde_json::json!({"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
            {"type": "command", "command": "sh \"$HOME/.claude/hooks/mark.sh\""}]}]}});
        fs::write(claude.join("settings.json"), settings.to_string()).unwrap();
        fs::create_dir_all(claude.join("skills/lab-skill")).unwrap();
        fs::write(
            claude.join("skills/lab-skill/SKILL.md"),
            "---\nname: lab-skill\ndescription: SKILL-DESC-4471 use this for lab checks\n---\nbody\n",
        )
        .unwrap();
        fs::write(
            claude.join("commands/greet.md"),
            "USER-COMMAND-BODY-7731: say hello\n",
        )
        .unwrap();
        let mock = MockApi::start(&serde_json::json!([
            {"bash": {"command": "echo tool-ran", "description": "x"}},
            "DONE"
        ]));
        let o = w
            .cmd(&p)
            .env("ANTHROPIC_BASE_URL", mock.base_url())
            .env("ANTHROPIC_API_KEY", API_KEY)
            .args(["-p", "/greet", "--allowedTools", "Bash"])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "[{}] {}{}",
            c.label,
            stdout(&o),
            stderr(&o)
        );
        assert!(
            fs::read_to_string(&marker).is_ok_and(|s| s.contains("ran")),
            "[{}] the user's PreToolUse hook did not run inside",
            c.label
        );
        let first = &mock.conversation(0)[0];
        assert!(
            first["body"].to_string().contains("SKILL-DESC-4471"),
            "[{}] the user's skill is not offered to the model",
            c.label
        );
        assert!(
            lab::agent::messages_text(first).contains("USER-COMMAND-BODY-7731"),
            "[{}] the user's slash command did not expand",
            c.label
        );
    }
}
