//! Attempts through `~/.claude` and `~/.claude.json` (issue 13): what a hostile agent
//! inside would plant there for the host's claude, another project's sandbox or a later
//! session to run or read. Each is judged on the host (the file the host or project B
//! uses), and each has a control that makes the same attempt where nothing stops it: with
//! `--writable-claude-setup`, with the directory bound read-write on purpose, or on the
//! host itself.

use super::*;
use crate::BIN;

/// Project B's state (the fake id the arena's secrets already use).
const B_STATE: &str = ".claudebox/projects/0123456789abcdef";

/// The host's Claude Code setup, a running host session's shell snapshot, another
/// project's file history, backups and config entries. Idempotent.
pub(crate) fn seed(a: &Arena) {
    let h = a.w.home();
    let c = h.join(".claude");
    write(&c.join("settings.json"), "{\"permissions\":{}}\n");
    write(&c.join("CLAUDE.md"), "be nice\n");
    write(&c.join("commands/host-cmd.md"), "host command\n");
    write(&c.join("agents/host-agent.md"), "host agent\n");
    write(&c.join("skills/s/SKILL.md"), "host skill\n");
    write(&c.join("plugins/installed_plugins.json"), "{}\n");
    // An installed plugin as claude lays it out (both versions): its code in the cache,
    // its marketplace's clone, the two registries.
    let plugin = c.join("plugins/cache/lab/labplug/1.0.0");
    write(&plugin.join("hooks/mark.sh"), "#!/bin/sh\nexit 0\n");
    write(&plugin.join("hooks/hooks.json"), "{\"hooks\":{}}\n");
    write(&plugin.join(".mcp.json"), "{\"mcpServers\":{}}\n");
    write(
        &c.join("plugins/marketplaces/lab/.claude-plugin/marketplace.json"),
        "{\"name\":\"lab\",\"plugins\":[]}\n",
    );
    write(&c.join("plugins/known_marketplaces.json"), "{}\n");
    write(&c.join("hooks/pre.sh"), "#!/bin/sh\nexit 0\n");
    write(
        &c.join("shell-snapshots/snapshot-bash-1795000000000-host.sh"),
        "# snapshot of the host session\nexport PATH=/usr/bin:/bin\n",
    );
    write(
        &c.join("file-history/b-session/0123abcd@v1"),
        "DB_PASSWORD=SECRET-file-history-of-B\n",
    );
    write(
        &c.join("backups/.claude.json.backup.1795000000000"),
        "{\"projects\":{\"/srv/b\":{\"lastSessionId\":\"SECRET-backup-sid\"}}}\n",
    );
    write(&c.join("local/claude"), "#!/bin/sh\nexec true\n");
    write(
        &h.join(".claude.json"),
        &serde_json::json!({
            "hasCompletedOnboarding": true,
            "mcpServers": {"user-server": {"command": "/bin/true"}},
            "projects": {
                "/srv/b-SECRET-path": {
                    "lastSessionId": "SECRET-last-session-of-B",
                    "mcpServers": {"b-db": {"command": "x", "env": {"TOKEN": "SECRET-mcp-of-B"}}}
                }
            },
            "githubRepoPaths": {"org/b": ["/srv/b-SECRET-path"]}
        })
        .to_string(),
    );
    // Project B's own state, as claudebox keeps it.
    let b = h.join(B_STATE).join("claude-config");
    write(
        &b.join("file-history/s/h@v1"),
        "API_KEY=SECRET-b-state-file-history\n",
    );
    write(&b.join(".claude.json"), "{\"mcpServers\":{}}\n");
}

/// Any file under `dir` that holds `PLANTED`.
pub(crate) fn planted_under(dir: &Path) -> bool {
    let Ok(rd) = fs::read_dir(dir) else {
        return contains_planted(dir);
    };
    rd.flatten().any(|e| {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            planted_under(&p)
        } else {
            contains_planted(&p)
        }
    })
}

/// The host's own `~/.claude` entry `rel`, or project B's, or the Setup entry of this
/// project's state (planting there would reach the project's later sandboxes).
fn host_or_b_planted(a: &Arena, rel: &str) -> bool {
    let h = a.w.home();
    let mut places = vec![
        h.join(".claude").join(rel),
        h.join(B_STATE).join("claude-config").join(rel),
    ];
    if let Ok(rd) = fs::read_dir(h.join(".claudebox/projects")) {
        places.extend(
            rd.flatten()
                .map(|e| e.path().join("claude-config").join(rel)),
        );
    }
    places.iter().any(|p| planted_under(p))
}

/// Whether the next sandbox of the project sees what was planted in its `~/.claude/rel`
/// (settings.json is the project's copy, read-write inside: only the Bypass Permissions
/// answer may carry over to the next launch).
fn next_sandbox_planted(a: &Arena, rel: &str) -> bool {
    let o = a
        .cmd(&a.proj, &[])
        .args(["--exec", "cat"])
        .arg(a.w.home().join(".claude").join(rel))
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).contains("PLANTED")
}

/// How a control makes the same attempt where nothing stops it (this file's and
/// `codex_home`'s attempts).
pub(crate) enum Control {
    /// Inside, with these claudebox options (after the agent's, `agent` of [`control`]).
    Inside(&'static [&'static str]),
    /// On the host, as the user's own shell.
    Host,
}

/// Makes attempt `at` again where nothing stops it (`how`), inside with `agent` (the
/// claudebox options that choose the agent, none for claude): it must succeed, inside or
/// as the host sees it.
pub(crate) fn control(a: &Arena, at: &Attempt, how: &Control, agent: &[&str]) {
    let o = match how {
        Control::Inside(args) => {
            let args: Vec<String> = args
                .iter()
                .map(|s| s.replace('~', &a.w.home().display().to_string()))
                .collect();
            a.cmd(&a.proj, &[])
                .args(agent)
                .args(&args)
                .args(["--exec", "sh", "-c", &at.script])
                .output()
                .unwrap()
        }
        Control::Host => Command::new("sh")
            .args(["-c", &at.script])
            .env("HOME", a.w.home())
            .env("T_HOME", a.w.home())
            .output()
            .unwrap(),
    };
    let inside = stdout(&o).contains(MARK);
    let host = at.host_check.as_ref().is_some_and(|f| f(a));
    assert!(
        inside || host,
        "control of {:?} did not succeed:\n{}{}",
        at.name,
        stdout(&o),
        stderr(&o)
    );
}

fn cases(a: &Arena) -> Vec<(Attempt, Control)> {
    seed(a);
    let mut v = Vec::new();
    v.push((
        attempt(
            "append to the shell snapshot a running host session sources, and add one",
            "for f in ~/.claude/shell-snapshots/*.sh; do echo 'echo PLANTED' >> \"$f\"; done; \
             echo 'echo PLANTED' > ~/.claude/shell-snapshots/snapshot-bash-1795000000001-x.sh",
        )
        .host_check(|a| host_or_b_planted(a, "shell-snapshots")),
        Control::Inside(&["--rw", "~/.claude/shell-snapshots"]),
    ));
    let settings = r#"{"statusLine":{"type":"command","command":"echo PLANTED"},"apiKeyHelper":"echo PLANTED","hooks":{"PreToolUse":[{"matcher":"*","hooks":[{"type":"command","command":"echo PLANTED"}]}]}}"#;
    for file in ["settings.json", "settings.local.json"] {
        v.push((
            attempt(
                "write a statusLine, a PreToolUse hook and apiKeyHelper into the user settings",
                format!("printf '%s' {} > ~/.claude/{file}", sq(settings)),
            )
            .host_check(move |a| host_or_b_planted(a, file) || next_sandbox_planted(a, file)),
            Control::Inside(&["--writable-claude-setup"]),
        ));
    }
    for (what, rel) in [
        ("plant a slash command", "commands/review.md"),
        ("plant a subagent", "agents/helper.md"),
        ("plant a skill", "skills/evil/SKILL.md"),
        ("plant a hook script", "hooks/pre.sh"),
        ("plant a plugin", "plugins/evil/plugin.json"),
        ("plant user memory (CLAUDE.md)", "CLAUDE.md"),
        ("plant an output style", "output-styles/evil.md"),
    ] {
        let top = rel.split('/').next().unwrap();
        v.push((
            attempt(what, plant(&format!("~/.claude/{rel}")))
                .host_check(move |a| host_or_b_planted(a, top)),
            Control::Inside(&["--writable-claude-setup"]),
        ));
    }
    // An installed plugin: what every later session (the host's included) runs.
    let cache = "~/.claude/plugins/cache/lab/labplug/1.0.0";
    for (what, script) in [
        (
            "append to an installed plugin's hook script",
            format!("echo 'echo PLANTED' >> {cache}/hooks/mark.sh"),
        ),
        (
            "replace an installed plugin's hooks.json by rename",
            format!(
                "printf '{{\"hooks\":{{\"SessionStart\":[{{\"hooks\":[{{\"type\":\"command\",\"command\":\"echo PLANTED\"}}]}}]}}}}' \
                 > /tmp/h.json; mv -f /tmp/h.json {cache}/hooks/hooks.json || \
                 cp /tmp/h.json {cache}/hooks/hooks.json"
            ),
        ),
        (
            "add an MCP server to an installed plugin's .mcp.json",
            format!(
                "printf '{{\"mcpServers\":{{\"evil\":{{\"command\":\"echo PLANTED\"}}}}}}' > {cache}/.mcp.json"
            ),
        ),
        (
            "point installed_plugins.json at a plugin of ours",
            "echo '{\"version\":2,\"plugins\":{\"PLANTED@lab\":[]}}' > ~/.claude/plugins/installed_plugins.json".into(),
        ),
        (
            "add a marketplace of ours to known_marketplaces.json",
            "echo '{\"PLANTED\":{}}' > ~/.claude/plugins/known_marketplaces.json".into(),
        ),
        (
            "plant a plugin in the marketplace's clone",
            plant("~/.claude/plugins/marketplaces/lab/plugins/evil/hooks/run.sh"),
        ),
    ] {
        v.push((
            attempt(what, script).host_check(|a| host_or_b_planted(a, "plugins")),
            Control::Inside(&["--writable-claude-setup"]),
        ));
    }
    // The plugins' data dir is the project's inside: what a plugin installs there from a
    // sandbox (its node_modules, say) never reaches the host's or another project's.
    v.push((
        attempt(
            "plant code in the plugins' data dir (CLAUDE_PLUGIN_DATA) for the host's plugin to run",
            plant("~/.claude/plugins/data/labplug-lab/node_modules/x/index.js"),
        )
        .host_check(|a| {
            host_or_b_planted(a, "plugins")
                || planted_under(&a.w.home().join(B_STATE).join("claude-plugin-data"))
        }),
        Control::Inside(&["--writable-claude-setup"]),
    ));
    v.push((
        attempt(
            "replace the claude installed under ~/.claude/local",
            format!(
                "{}; chmod +x ~/.claude/local/claude",
                plant("~/.claude/local/claude")
            ),
        )
        .host_check(|a| host_or_b_planted(a, "local")),
        Control::Inside(&["--rw", "~/.claude/local"]),
    ));
    let mcp = r#"
import json, os, sys
for path in [os.path.expanduser("~/.claude.json"), os.path.expanduser("~/.claude/.claude.json"), os.environ["T_HOME"] + "/.claude.json"]:
    try:
        d = json.load(open(path))
    except Exception:
        d = {}
    d.setdefault("mcpServers", {})["evil"] = {"command": "sh", "args": ["-c", "echo PLANTED"]}
    d.setdefault("projects", {}).setdefault("/srv/b-guess", {}).setdefault("mcpServers", {})["evil"] = {"command": "echo PLANTED"}
    try:
        open(path, "w").write(json.dumps(d))
    except Exception as e:
        print("write failed:", e)
"#;
    v.push((
        attempt(
            "add an MCP server to ~/.claude.json, user scope and under another project's entry",
            py(mcp),
        )
        .host_check(|a| {
            contains_planted(&a.w.home().join(".claude.json"))
                || contains_planted(&a.w.home().join(B_STATE).join("claude-config/.claude.json"))
        }),
        Control::Host,
    ));
    v.push((
        attempt(
            "read other projects' paths, last session ids and MCP secrets from ~/.claude.json and backups/",
            format!(
                "grep -rsq SECRET- ~/.claude.json ~/.claude/.claude.json ~/.claude/backups \
                 \"$T_HOME/.claude.json\" \"$T_HOME/{B_STATE}\" && echo {MARK}"
            ),
        ),
        Control::Host,
    ));
    v.push((
        attempt(
            "read another project's file history (pre-edit copies of its files)",
            format!(
                "grep -rsq SECRET- ~/.claude/file-history \"$T_HOME/.claude/file-history\" && echo {MARK}"
            ),
        ),
        Control::Inside(&["--rw", "~/.claude/file-history"]),
    ));
    v.push((
        attempt(
            "rewrite another project's file history, so its /rewind writes our content",
            "for f in ~/.claude/file-history/*/*; do echo PLANTED > \"$f\"; done",
        )
        .host_check(|a| host_or_b_planted(a, "file-history")),
        Control::Inside(&["--rw", "~/.claude/file-history"]),
    ));
    v
}

/// The attempts, for the suite.
pub(crate) fn attempts(a: &Arena) -> Vec<Attempt> {
    cases(a).into_iter().map(|(at, _)| at).collect()
}

/// Each attempt again where nothing stops it: it must succeed.
pub(crate) fn controls(a: &Arena) {
    for (at, how) in cases(a) {
        control(a, &at, &how, &[]);
    }
}

/// A claude installed under `~/.claude/local` and found there on PATH stays read-only
/// even with `--writable-claude-setup` (its mount comes again after the group); with the
/// directory bound read-write on purpose, the same write reaches the host.
#[test]
fn a_claude_under_dot_claude_local_stays_read_only_with_the_opt_out() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let local = w.home().join(".claude/local");
    write(
        &local.join("claude"),
        "#!/bin/sh\neval \"$FAKE_CLAUDE_SCRIPT\"\n",
    );
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(local.join("claude"), fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", local.display());
    let script = "echo 'echo PLANTED' >> ~/.claude/local/claude; echo DONE";
    for args in [&["--writable-claude-setup"][..], &[][..]] {
        let o = w
            .cmd(&p)
            .env("PATH", &path)
            .env("FAKE_CLAUDE_SCRIPT", script)
            .args(args)
            .output()
            .unwrap();
        assert!(stdout(&o).contains("DONE"), "{}", stderr(&o));
        assert!(!contains_planted(&local.join("claude")), "{args:?}");
    }
    let o = w
        .cmd(&p)
        .env("PATH", &path)
        .env("FAKE_CLAUDE_SCRIPT", script)
        .args(["--rw", &local.display().to_string()])
        .output()
        .unwrap();
    assert!(stdout(&o).contains("DONE"), "{}", stderr(&o));
    assert!(contains_planted(&local.join("claude")), "control");
}

/// With the real Claude Code: a host session is in the middle of a Bash call when a
/// sandbox appends to every shell snapshot it can reach; the host session's next Bash
/// call sources its snapshot. Protected: the planted line never runs on the host. Control
/// (the snapshots bound read-write on purpose): it runs.
#[test]
fn a_running_host_session_never_sources_what_a_sandbox_planted() {
    use lab::agent::{MockApi, API_KEY};
    use std::time::{Duration, Instant};
    for c in lab::agent::each_claude() {
        for (args, expect_ran) in [(&[][..], false), (&["--rw", "SNAPSHOTS"][..], true)] {
            let w = World::new(BIN);
            let host_proj = w.dir("host-proj");
            let proj = w.dir("proj");
            let ready = w.root().join("ready");
            let go = w.root().join("go");
            let ran = w.root().join("planted-line-ran");
            let mock = MockApi::start(&serde_json::json!([
                {"bash": {"command": format!(
                    "touch {}; while [ ! -e {} ]; do sleep 0.1; done",
                    ready.display(), go.display()
                ), "description": "wait"}},
                {"bash": {"command": "echo second", "description": "second"}},
                "done"
            ]));
            let host = Command::new(&c.bin)
                .args(["-p", "go", "--allowedTools", "Bash"])
                .current_dir(&host_proj)
                .env_clear()
                .env("HOME", w.home())
                .env("PATH", "/usr/bin:/bin")
                .env("ANTHROPIC_BASE_URL", mock.base_url())
                .env("ANTHROPIC_API_KEY", API_KEY)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while !ready.exists() {
                assert!(
                    Instant::now() < deadline,
                    "[{}] the host session never ran its Bash call",
                    c.label
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            let snaps = w.home().join(".claude/shell-snapshots");
            assert!(
                fs::read_dir(&snaps).is_ok_and(|d| d.count() > 0),
                "[{}] the host session made no shell snapshot",
                c.label
            );
            let args: Vec<String> = args
                .iter()
                .map(|a| a.replace("SNAPSHOTS", &snaps.display().to_string()))
                .collect();
            let script = format!(
                "for f in ~/.claude/shell-snapshots/*.sh \"$T_HOME\"/.claude/shell-snapshots/*.sh; do \
                 echo 'touch {}' >> \"$f\"; done; echo PLANT-TRIED",
                ran.display()
            );
            let o = w
                .cmd(&proj)
                .env("T_HOME", w.home())
                .args(&args)
                .args(["--exec", "sh", "-c", &script])
                .output()
                .unwrap();
            assert!(stdout(&o).contains("PLANT-TRIED"), "{}", stderr(&o));
            fs::write(&go, "").unwrap();
            let out = host.wait_with_output().unwrap();
            assert!(
                out.status.success()
                    && mock
                        .requests()
                        .iter()
                        .filter(|r| r["kind"] == "conversation")
                        .count()
                        >= 3,
                "[{}] host session: {}{}",
                c.label,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                ran.exists(),
                expect_ran,
                "[{}] with {args:?}: planted line ran on the host: {}",
                c.label,
                ran.exists()
            );
        }
    }
}

/// The agent replaces the project's `.claude.json` by a symlink to another project's
/// (claudebox's state paths are predictable), hoping the next launch's merge reads that
/// file as the project's own and copies its secrets in. The launch never follows it.
/// Control: the symlink does lead to the secret when followed.
#[test]
fn a_symlinked_project_claude_json_is_not_followed_by_the_next_launch() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let b = w.state().join("projects/0123456789abcdef/claude-config");
    fs::create_dir_all(&b).unwrap();
    fs::write(
        b.join(".claude.json"),
        "{\"projects\":{\"/srv/b\":{\"mcpServers\":{\"db\":{\"env\":{\"T\":\"SECRET-b-token\"}}}}}}",
    )
    .unwrap();
    fs::write(w.home().join(".claude.json"), "{\"v\":1}").unwrap();
    let plant = format!(
        "ln -sf '{}' ~/.claude/.claude.json && echo PLANTED-LINK",
        b.join(".claude.json").display()
    );
    assert!(ok(&w.run_script(&p, &plant)).contains("PLANTED-LINK"));
    // The host changes its file, so the next launch merges.
    fs::write(w.home().join(".claude.json"), "{\"v\":2}").unwrap();
    let out = ok(&w.run_script(
        &p,
        "cat ~/.claude/.claude.json; echo; grep -rq SECRET- ~/.claude/ && echo ESCAPED; true",
    ));
    assert!(!out.contains("ESCAPED") && !out.contains("SECRET"), "{out}");
    assert!(out.contains("\"v\": 2"), "{out}");
    // Control: followed, the link leads to the secret.
    let id = env_in_dry_run(&dry_run(&w, &p), "CLAUDEBOX_PROJECT_ID").unwrap();
    let mine = w
        .state()
        .join("projects")
        .join(id)
        .join("claude-config/.claude.json");
    assert!(!fs::symlink_metadata(&mine)
        .unwrap()
        .file_type()
        .is_symlink());
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("ln -sf '{}' /tmp/x-link-$$ && grep -q SECRET- /tmp/x-link-$$ && echo FOLLOWED; rm -f /tmp/x-link-$$", b.join(".claude.json").display()))
        .output()
        .unwrap();
    assert!(stdout(&o).contains("FOLLOWED"));
}
