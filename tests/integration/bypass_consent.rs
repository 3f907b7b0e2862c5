//! Claude Code's "Bypass Permissions mode" dialog (the real TUI, both versions, against
//! the lab's mock API, under tmux) is asked once per user: "Yes, I accept" lands in the
//! project's copy of `~/.claude/settings.json` in claudebox's state (the host's file is
//! read-only to claude inside and never written), claudebox keeps that one key for every
//! project, and the next launch, in this project or another, goes straight to the prompt.
//! Control: with a fresh state directory the dialog is asked again (the answer lives in
//! claudebox's state, nowhere else). claude refuses `--dangerously-skip-permissions` as
//! root: as root the test says so and does nothing.

use std::fs;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::BIN;
use lab::agent::*;
use lab::tmux::Tmux;
use lab::*;

const SCREEN_LIMIT: Duration = Duration::from_secs(40);
const DIALOG: &str = "Bypass Permissions mode";

/// One TUI launch with `--dangerously-skip-permissions` in `proj` (`state` as
/// CLAUDEBOX_HOME); accepts the dialog when it comes. Returns whether it came.
fn launch(w: &World, proj: &Path, state: &Path, label: &str) -> bool {
    let mock = MockApi::start(&json!(["DONE"]));
    let tmux = Tmux::new().with_scrollback(200);
    let shell = format!(
        "CLAUDEBOX_HOME='{}' '{BIN}' --dangerously-skip-permissions",
        state.display()
    );
    tmux.start(w, &mock, proj, (150, 50), &shell);
    let s = tmux.wait_for(
        &format!("[{label}] the dialog or the prompt"),
        SCREEN_LIMIT,
        |s| s.contains(DIALOG) || s.contains("bypass permissions on"),
    );
    let asked = s.contains(DIALOG);
    if asked {
        tmux.wait_for(
            &format!("[{label}] the dialog's answers"),
            SCREEN_LIMIT,
            |s| s.contains("Yes, I accept"),
        );
        // The dialog takes keys once it has drawn; a key sent earlier is lost. Down moves
        // the choice to "Yes, I accept" (2.1.330 has no numbers), Enter confirms; Enter
        // alone would choose "No, exit".
        let chosen = |s: &str| {
            s.lines()
                .any(|l| l.contains('❯') && l.contains("Yes, I accept"))
        };
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(500));
            tmux.run(&["send-keys", "Down"]);
            let deadline = std::time::Instant::now() + Duration::from_secs(3);
            while std::time::Instant::now() < deadline && !chosen(&tmux.screen()) {
                std::thread::sleep(Duration::from_millis(100));
            }
            if chosen(&tmux.screen()) {
                break;
            }
        }
        tmux.run(&["send-keys", "Enter"]);
    }
    tmux.wait_for(
        &format!("[{label}] the prompt in bypass mode"),
        SCREEN_LIMIT,
        |s| !s.contains(DIALOG) && s.contains("bypass permissions on"),
    );
    tmux.run(&["send-keys", "-l", "/exit"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux.run(&["send-keys", "Enter"]);
    // The launch ends (its exit keeps the answer): the tmux session goes with it.
    let deadline = std::time::Instant::now() + SCREEN_LIMIT;
    while std::time::Instant::now() < deadline
        && tmux
            .cmd()
            .args(["has-session"])
            .output()
            .is_ok_and(|o| o.status.success())
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    asked
}

#[test]
fn the_bypass_permissions_dialog_is_asked_once_per_user() {
    if nix::unistd::geteuid().is_root() {
        eprintln!("skipped as root: claude refuses --dangerously-skip-permissions as root");
        return;
    }
    for c in lab::agent::each_claude() {
        let label = c.label;
        let w = world_with(BIN, &c);
        let (a, b) = (w.dir("a"), w.dir("b"));
        init_repo(&a);
        init_repo(&b);
        seed_claude_json(&w.home(), &[&a, &b]);
        let host_settings = w.home().join(".claude/settings.json");
        let host_text = "{\"env\": {\"FROM_HOST\": \"1\"}}\n";
        fs::write(&host_settings, host_text).unwrap();
        let state = w.state();

        assert!(
            launch(&w, &a, &state, label),
            "[{label}] the first launch did not ask"
        );
        assert!(
            state.join("claude-bypass-accepted").exists(),
            "[{label}] the answer was not kept"
        );
        assert!(
            !launch(&w, &a, &state, label),
            "[{label}] the second launch asked again"
        );
        assert!(
            !launch(&w, &b, &state, label),
            "[{label}] another project's launch asked again"
        );
        assert_eq!(
            fs::read_to_string(&host_settings).unwrap(),
            host_text,
            "[{label}] the host's settings.json changed"
        );
        // Control: the same user with a state of its own is asked again.
        let fresh = w.root().join("fresh-state");
        assert!(
            launch(&w, &a, &fresh, label),
            "[{label}] control: a fresh state was not asked"
        );
    }
}
