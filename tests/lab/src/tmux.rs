//! Claude's TUI under tmux, for the tests that drive it like a person: start a command in
//! a detached session, type, read the screen, wait for something to show.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::agent::{output_within, MockApi, API_KEY};
use crate::{stderr, stdout, World};

/// A tmux server of the test's own (its socket in a temporary directory), killed on drop.
pub struct Tmux {
    pub dir: tempfile::TempDir,
    /// Lines of scrollback `screen` includes above the visible pane.
    scrollback: usize,
}

impl Default for Tmux {
    fn default() -> Tmux {
        Tmux::new()
    }
}

impl Tmux {
    pub fn new() -> Tmux {
        Tmux {
            dir: tempfile::tempdir().unwrap(),
            scrollback: 0,
        }
    }

    /// `screen` also shows this many lines of scrollback.
    pub fn with_scrollback(mut self, lines: usize) -> Tmux {
        self.scrollback = lines;
        self
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(self.dir.path().join("tmux.sock"));
        c
    }

    pub fn run(&self, args: &[&str]) -> String {
        let o = output_within(self.cmd().args(args), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("tmux {args:?}: {e}"));
        assert!(o.status.success(), "tmux {args:?}: {}", stderr(&o));
        stdout(&o)
    }

    /// Starts `shell` in a `cols` x `rows` session in `cwd`, with `w`'s environment only,
    /// pointed at `mock`.
    pub fn start(&self, w: &World, mock: &MockApi, cwd: &Path, size: (u16, u16), shell: &str) {
        let (cols, rows) = (size.0.to_string(), size.1.to_string());
        let mut start = self.cmd();
        start
            .env_clear()
            .env("HOME", w.home())
            .env("PATH", w.path_var())
            .env("LANG", "C.UTF-8")
            .env("ANTHROPIC_BASE_URL", mock.base_url())
            .env("ANTHROPIC_API_KEY", API_KEY)
            .args(["new-session", "-d", "-x", &cols, "-y", &rows, "-c"])
            .arg(cwd)
            .arg(shell);
        if let Some(u) = std::env::var_os("USER") {
            start.env("USER", u);
        }
        let o = output_within(&mut start, Duration::from_secs(10)).unwrap();
        assert!(o.status.success(), "tmux new-session: {}", stderr(&o));
    }

    pub fn screen(&self) -> String {
        if self.scrollback == 0 {
            self.run(&["capture-pane", "-p"])
        } else {
            self.run(&["capture-pane", "-p", "-S", &format!("-{}", self.scrollback)])
        }
    }

    /// Types `text` literally, then Enter.
    pub fn type_line(&self, text: &str) {
        self.run(&["send-keys", "-l", text]);
        std::thread::sleep(Duration::from_millis(300));
        self.run(&["send-keys", "Enter"]);
    }

    /// Waits (at most `limit`) until `pred` holds for the screen; returns that screen.
    #[track_caller]
    pub fn wait_for(&self, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if Instant::now() >= deadline {
                panic!("waited {limit:?} for {what}; the screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = output_within(self.cmd().arg("kill-server"), Duration::from_secs(5));
    }
}
