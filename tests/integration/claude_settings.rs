//! The project's `.claude` inside the sandbox, with the real Claude Code (both versions,
//! against the lab's mock API, the TUI under tmux): "Yes, and don't ask again" saves the
//! rule to the project's copy in claudebox's state (claude's rename over the mounted file
//! fails with EBUSY and it rewrites the file in place), the next sandbox in the project
//! runs the command without asking, and the host's `.claude/settings.local.json` and
//! `.claude/settings.json` are never written.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::BIN;
use lab::agent::*;
use lab::tmux::Tmux;
use lab::*;

/// How long the TUI gets to show each thing.
const SCREEN_LIMIT: Duration = Duration::from_secs(40);

const COMMAND: &str = "python3 -c 'print(12345 * 2)'";

/// One TUI session in `proj` through claudebox: asks for the command, answers the
/// permission prompt with "don't ask again" when it comes, waits for the closing answer,
/// exits. Returns whether claude asked.
fn session(w: &World, proj: &Path, label: &str) -> bool {
    let mock = MockApi::start(&json!([
        {"bash": {"command": COMMAND, "description": "multiply"}},
        "SESSION-DONE",
    ]));
    let tmux = Tmux::new().with_scrollback(200);
    let shell = format!("'{BIN}' --permission-mode default");
    tmux.start(w, &mock, proj, (150, 50), &shell);
    tmux.wait_for(&format!("[{label}] the prompt"), SCREEN_LIMIT, |s| {
        s.contains("Claude Code")
    });
    tmux.run(&["send-keys", "-l", "run the command"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux.run(&["send-keys", "Enter"]);
    let s = tmux.wait_for(
        &format!("[{label}] a permission prompt or the answer"),
        SCREEN_LIMIT,
        |s| s.contains("proceed?") || s.contains("SESSION-DONE"),
    );
    let asked = s.contains("proceed?");
    if asked {
        assert!(
            s.contains("don't ask again") || s.contains("don’t ask again"),
            "{s}"
        );
        // The prompt takes keys once it has drawn; a key sent earlier is lost.
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(700));
            tmux.run(&["send-keys", "2"]);
            let deadline = std::time::Instant::now() + Duration::from_secs(4);
            while std::time::Instant::now() < deadline && tmux.screen().contains("proceed?") {
                std::thread::sleep(Duration::from_millis(100));
            }
            if !tmux.screen().contains("proceed?") {
                break;
            }
        }
        tmux.wait_for(&format!("[{label}] the answer"), SCREEN_LIMIT, |s| {
            s.contains("SESSION-DONE")
        });
    }
    // The command ran: its result went back to the mock.
    let sent: String = mock.conversation(0).iter().map(messages_text).collect();
    assert!(
        sent.contains("24690"),
        "[{label}] the command did not run:\n{sent}"
    );
    tmux.run(&["send-keys", "-l", "/exit"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux.run(&["send-keys", "Enter"]);
    std::thread::sleep(Duration::from_millis(1000));
    asked
}

fn state_copy(w: &World) -> PathBuf {
    let projects = w.state().join("projects");
    let id = fs::read_dir(&projects).unwrap().next().unwrap().unwrap();
    id.path().join("claude-settings.local.json")
}

#[test]
fn always_allow_lands_in_the_state_copy_and_holds_in_the_next_sandbox() {
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        seed_claude_json(&w.home(), &[&p]);
        let host_local = "{\"permissions\": {\"allow\": [\"Bash(ls:*)\"]}}\n";
        let host_shared = "{\"permissions\": {}}\n";
        fs::create_dir_all(p.join(".claude")).unwrap();
        fs::write(p.join(".claude/settings.local.json"), host_local).unwrap();
        fs::write(p.join(".claude/settings.json"), host_shared).unwrap();
        let label = c.label;

        assert!(
            session(&w, &p, label),
            "[{label}] the first session did not ask"
        );
        let copy = fs::read_to_string(state_copy(&w)).unwrap();
        assert!(
            copy.contains("Bash(python3") && copy.contains("Bash(ls:*)"),
            "[{label}] the state copy: {copy}"
        );
        assert_eq!(
            fs::read_to_string(p.join(".claude/settings.local.json")).unwrap(),
            host_local,
            "[{label}] the host's file changed"
        );
        assert_eq!(
            fs::read_to_string(p.join(".claude/settings.json")).unwrap(),
            host_shared
        );
        assert!(
            !session(&w, &p, label),
            "[{label}] the second sandbox asked again"
        );
    }
}

/// A sandbox that saves a rule after a later launch rebuilt the project's copy (the host's
/// file changed meanwhile) keeps it: the rebuild rewrites the copy in place, so the
/// running sandbox and the next one share one inode. With the copy replaced by rename
/// (the code before), the rule went to the old inode and the next sandbox lacked it
/// (measured by reverting `rewrite_in_place` to `write_atomic`: "from-A" missing).
#[test]
fn a_rule_saved_after_a_later_launch_rebuilt_the_copy_reaches_the_next_sandbox() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    init_repo(&p);
    let host_file = p.join(".claude/settings.local.json");
    fs::create_dir_all(host_file.parent().unwrap()).unwrap();
    let host = |rules: &[&str]| {
        fs::write(
            &host_file,
            serde_json::to_string_pretty(&json!({"permissions": {"allow": rules}})).unwrap(),
        )
        .unwrap()
    };
    host(&["Bash(echo host1)"]);
    // Signals through the project, the one place both sides see.
    let (started, go, saved) = (p.join("started"), p.join("go"), p.join("saved"));
    // Sandbox A: waits, then saves a rule the way claude does inside (in place).
    let save = "import json; f = open('.claude/settings.local.json', 'r+'); \
                d = json.load(f); d['permissions']['allow'].append('Bash(echo from-A)'); \
                f.seek(0); f.write(json.dumps(d)); f.truncate(); f.close()";
    let script = format!(
        "touch '{}'; n=0; while [ ! -e '{}' ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); \
         done; python3 -c \"{save}\" && touch '{}'",
        started.display(),
        go.display(),
        saved.display()
    );
    let mut a = w
        .cmd(&p)
        .args(["--exec", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "sandbox A did not start"
        );
        if a.try_wait().unwrap().is_some() {
            panic!(
                "sandbox A ended early: {}",
                stderr(&a.wait_with_output().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The host's file changes, and another launch rebuilds the copy.
    host(&["Bash(echo host1)", "Bash(echo host2)"]);
    ok(&w.cmd(&p).args(["--exec", "true"]).output().unwrap());
    fs::write(&go, "").unwrap();
    let out = a.wait_with_output().unwrap();
    ok(&out);
    assert!(saved.exists(), "sandbox A could not save its rule");

    let seen = ok(&w
        .cmd(&p)
        .args(["--exec", "cat", ".claude/settings.local.json"])
        .output()
        .unwrap());
    for rule in ["Bash(echo host1)", "Bash(echo host2)", "Bash(echo from-A)"] {
        assert!(
            seen.contains(rule),
            "{rule} missing in the next sandbox:\n{seen}"
        );
    }
    // The host's own file never gets the rule.
    assert!(!fs::read_to_string(&host_file).unwrap().contains("from-A"));
}
