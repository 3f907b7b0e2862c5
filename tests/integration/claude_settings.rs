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

use crate::common::lab::*;
use crate::common::tmux::Tmux;
use crate::common::*;

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
    let _heavy = crate::common::heavy();
    for c in claude_versions() {
        let w = world_with(&c);
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
