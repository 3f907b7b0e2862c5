//! What the lab found (issue 12), each with the real Claude Code (both versions) against
//! the mock Messages API: the paths a moved conversation cites, Ctrl-C in `-p`. (Loopback
//! hosts in allowlist mode: tests/integration/conversations.rs
//! allowlist_reaches_a_loopback_api_only_through_the_proxy.)

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::json;

use crate::BIN;
use lab::agent::*;
use lab::*;

const RUN_LIMIT: Duration = Duration::from_secs(90);

/// `claudebox ARGS` in `cwd`, pointed at `mock`, bounded in time.
fn claudebox(w: &World, cwd: &Path, mock: &MockApi, args: &[&str]) -> Output {
    let quiet = [("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")];
    run_claudebox(w, cwd, mock, args, &quiet, RUN_LIMIT)
}

/// Every file under `dir`, recursively, not following symlinks.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Absolute paths under `~/.claude/projects/` that a transcript cites.
fn cited_paths(transcript: &str, home: &Path) -> Vec<String> {
    let prefix = format!("{}/.claude/projects/", home.display());
    let mut out = Vec::new();
    let mut rest = transcript;
    while let Some(i) = rest.find(&prefix) {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| c == '"' || c == '\\' || c.is_whitespace() || c == '<' || c == ')')
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out.sort();
    out.dedup();
    out
}

/// A large Bash output is saved under `<uuid>/tool-results/` and cited by absolute path;
/// after the named session resumes from another directory (its transcript moves there),
/// that path still resolves inside the sandbox.
#[test]
fn paths_a_moved_conversation_cites_still_resolve() {
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let repo = w.dir("repo");
        init_repo(&repo);
        let sub = repo.join("sub");
        fs::create_dir_all(&sub).unwrap();
        let mock = MockApi::start(&json!([
            {"bash": {"command": "seq 1 100000", "description": "count"}},
            "COUNTED",
            "AGAIN",
        ]));
        let o = claudebox(
            &w,
            &repo,
            &mock,
            &["--session", "big", "-p", "count", "--allowedTools", "Bash"],
        );
        ok_run(&c, &o, &mock);
        let conversations = fs::read_dir(w.state().join("projects"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("claude-projects");
        let transcript = files(&conversations)
            .into_iter()
            .find(|p| {
                p.extension().is_some_and(|x| x == "jsonl")
                    && p.parent().unwrap().parent() == Some(conversations.as_path())
            })
            .expect("a transcript");
        let text = fs::read_to_string(&transcript).unwrap();
        let cited: Vec<String> = cited_paths(&text, &w.home())
            .into_iter()
            .filter(|p| p.contains("/tool-results/"))
            .collect();
        assert!(
            !cited.is_empty(),
            "[{}] claude saved no large output to cite; files: {:?}",
            c.label,
            files(&conversations)
        );
        // Resume from a subdirectory: the transcript moves to that directory's name.
        let o = claudebox(&w, &sub, &mock, &["--session", "big", "-p", "again"]);
        ok_run(&c, &o, &mock);
        assert!(
            !transcript.exists(),
            "[{}] the transcript did not move",
            c.label
        );
        for path in &cited {
            let o = w
                .cmd(&sub)
                .args([
                    "--exec",
                    "sh",
                    "-c",
                    "test -f \"$1\" && echo RESOLVES",
                    "sh",
                ])
                .arg(path)
                .output()
                .unwrap();
            assert_eq!(
                stdout(&o).trim(),
                "RESOLVES",
                "[{}] {path} no longer resolves inside: {}",
                c.label,
                stderr(&o)
            );
        }
    }
}

/// Ctrl-C in `claudebox -p` while the answer streams: the exit status is claude's own,
/// the same as bare `claude -p` interrupted the same way (2.1.197 and 2.1.330 print
/// "Execution error" and exit 0); before, the sandbox died of the signal (status 130).
#[test]
fn ctrl_c_in_print_mode_gives_claudes_own_status() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::time::Instant;
    for c in lab::agent::each_claude_timed() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        let interrupted = |mut cmd: std::process::Command, mock: &MockApi| {
            cmd.env("ANTHROPIC_BASE_URL", mock.base_url())
                .env("ANTHROPIC_API_KEY", API_KEY)
                .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0);
            // SAFETY: only sigaction between fork and exec: a terminal's shell starts
            // programs with SIGINT at its default.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::signal::signal(
                        nix::sys::signal::Signal::SIGINT,
                        nix::sys::signal::SigHandler::SigDfl,
                    )?;
                    Ok(())
                });
            }
            let mut child = cmd.spawn().unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while mock.conversation(0).is_empty() {
                assert!(Instant::now() < deadline, "[{}] no request", c.label);
                if let Some(st) = child.try_wait().unwrap() {
                    panic!("[{}] claude ended before the answer: {st}", c.label);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(500));
            let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
            nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGINT).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            let st = loop {
                if let Some(st) = child.try_wait().unwrap() {
                    break st;
                }
                if Instant::now() > deadline {
                    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                    panic!("[{}] still running 30 s after Ctrl-C", c.label);
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            (st.code(), st.signal())
        };
        let slow = json!([{"text": "SLOW ".repeat(40), "chunks": 40, "chunk_delay_ms": 250}]);
        let mock = MockApi::start(&slow);
        let mut bare = std::process::Command::new(&c.bin);
        bare.current_dir(&p)
            .env_clear()
            .env("HOME", w.home())
            .env("PATH", w.path_var())
            .args(["-p", "hi"]);
        let bare = interrupted(bare, &mock);
        let mock = MockApi::start(&slow);
        let mut boxed = w.cmd(&p);
        boxed.args(["-p", "hi"]);
        let boxed = interrupted(boxed, &mock);
        assert_eq!(
            boxed, bare,
            "[{}] (code, signal) through claudebox vs bare",
            c.label
        );
        assert_eq!(boxed.1, None, "[{}] claudebox died of the signal", c.label);
    }
}
