//! Conversations crossing between bare claude and claudebox on request
//! (`--import-conversation`, `--export-conversation`), and the resume line claudebox
//! prints at exit: with the real Claude Code (both versions) against the lab's mock API,
//! bare claude run on the host with the world's HOME.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::json;

use crate::BIN;
use lab::agent::*;
use lab::*;

const LIMIT: Duration = Duration::from_secs(90);

/// A Bash command whose output claude saves under `<uuid>/tool-results/` (too large to
/// keep inline) and cites by absolute path.
const BIG: &str =
    "for i in $(seq 1 3000); do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; done";

fn claudebox(w: &World, cwd: &Path, mock: &MockApi, args: &[&str]) -> Output {
    run_claudebox(w, cwd, mock, args, &[], LIMIT)
}

/// Bare claude on the host, with the world's HOME, pointed at the mock.
fn bare_claude(w: &World, c: &Claude, cwd: &Path, mock: &MockApi, args: &[&str]) -> Output {
    let mut cmd = Command::new(&c.bin);
    cmd.current_dir(cwd)
        .env_clear()
        .env("HOME", w.home())
        .env("PATH", w.path_var())
        .env("LANG", "C.UTF-8")
        .env("DISABLE_AUTOUPDATER", "1");
    mock.point(&mut cmd).args(args);
    output_within(&mut cmd, LIMIT).unwrap_or_else(|e| panic!("bare claude {args:?}: {e}"))
}

/// claude's encoding of a directory's name (short paths: every non-alphanumeric is `-`).
fn encoded(p: &Path) -> String {
    p.to_str()
        .unwrap()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The project's conversations directory of `cwd` in claudebox's state.
fn state_conversations(w: &World, cwd: &Path) -> PathBuf {
    let projects = w.state().join("projects");
    let id = fs::read_dir(&projects).unwrap().next().unwrap().unwrap();
    id.path().join("claude-projects").join(encoded(cwd))
}

/// Files under `<dir>/<uuid>/tool-results/`.
fn tool_results(dir: &Path, uuid: &str) -> Vec<PathBuf> {
    fs::read_dir(dir.join(uuid).join("tool-results"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn uuid_in_line(stderr: &str) -> Option<String> {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("claudebox: to resume this conversation: claudebox --resume "))?;
    Some(line.rsplit(' ').next()?.to_string())
}

/// A conversation made by bare claude on the host is imported, and `claudebox --resume
/// <uuid>` continues it: the mock sees the earlier exchange, and the tool output the
/// transcript cites by absolute path is there at that path inside. Control: before the
/// import, the same resume fails.
#[test]
fn a_bare_claude_conversation_is_imported_and_resumed_in_claudebox() {
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        seed_claude_json(&w.home(), &[&p]);
        let mock = MockApi::start(&json!([
            {"bash": {"command": BIG, "description": "print a lot"}},
            "HOST-ANSWER",
            "BOX-ANSWER",
        ]));
        let u = "4a1e0c2d-7b3f-4c55-9e21-0123456789ab";
        let o = bare_claude(
            &w,
            &c,
            &p,
            &mock,
            &[
                "-p",
                "HOST-PROMPT",
                "--allowedTools",
                "Bash",
                "--session-id",
                u,
            ],
        );
        ok_run(&c, &o, &mock);
        let host_dir = w.home().join(".claude/projects").join(encoded(&p));
        let transcript = fs::read_to_string(host_dir.join(format!("{u}.jsonl"))).unwrap();
        let cited = tool_results(&host_dir, u);
        assert!(
            !cited.is_empty(),
            "[{}] no tool-results: {transcript}",
            c.label
        );
        for f in &cited {
            assert!(
                transcript.contains(f.to_str().unwrap()),
                "[{}] {} is not cited",
                c.label,
                f.display()
            );
        }

        // control: claudebox does not see bare claude's conversation
        let seen = mock.conversation(0).len();
        let o = claudebox(&w, &p, &mock, &["--resume", u, "-p", "BOX-PROMPT"]);
        assert!(
            !o.status.success() || !stdout(&o).contains("BOX-ANSWER"),
            "[{}] resumed without an import: {}",
            c.label,
            stdout(&o)
        );
        assert_eq!(mock.conversation(seen).len(), 0, "[{}]", c.label);

        let o = w
            .cmd(&p)
            .args(["--import-conversation", u])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(o.status.success(), "[{}] {err}", c.label);
        assert!(err.contains(&format!("imported conversation {u}")), "{err}");
        // a copy: bare claude keeps its own
        assert!(host_dir.join(format!("{u}.jsonl")).is_file());

        let o = claudebox(&w, &p, &mock, &["--resume", u, "-p", "BOX-PROMPT"]);
        let out = ok_run(&c, &o, &mock);
        assert!(out.contains("BOX-ANSWER"), "[{}] {out}", c.label);
        let sent = mock.conversation(seen);
        let text = messages_text(&sent[0]);
        for e in ["HOST-PROMPT", "HOST-ANSWER", "BOX-PROMPT"] {
            assert!(text.contains(e), "[{}] lacks {e}: {text}", c.label);
        }
        assert_eq!(
            uuid_in_line(&stderr(&o)).as_deref(),
            Some(u),
            "{}",
            stderr(&o)
        );
        // the cited paths resolve inside, to the state's copy
        for f in &cited {
            let o = w.cmd(&p).args(["--exec", "cat"]).arg(f).output().unwrap();
            assert_eq!(
                o.stdout,
                fs::read(f).unwrap(),
                "[{}] {} inside: {}",
                c.label,
                f.display(),
                stderr(&o)
            );
        }
    }
}

/// A conversation made in claudebox: the line printed at exit, pasted, continues it; once
/// exported, bare `claude --resume <uuid>` on the host continues it too, and the tool
/// output it cites resolves on the host. Control: before the export bare claude's resume
/// fails.
#[test]
fn a_claudebox_conversation_resumes_by_its_exit_line_and_is_exported_to_bare_claude() {
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        seed_claude_json(&w.home(), &[&p]);
        let mock = MockApi::start(&json!([
            {"bash": {"command": BIG, "description": "print a lot"}},
            "BOX-ANSWER-ONE",
            "BOX-ANSWER-TWO",
            "HOST-ANSWER",
        ]));
        let o = claudebox(
            &w,
            &p,
            &mock,
            &["-p", "BOX-PROMPT-ONE", "--allowedTools", "Bash"],
        );
        ok_run(&c, &o, &mock);
        let err = stderr(&o);
        let u = uuid_in_line(&err).unwrap_or_else(|| panic!("[{}] no resume line: {err}", c.label));
        assert_eq!(
            err.matches("to resume this conversation").count(),
            1,
            "{err}"
        );
        // the line, pasted (its words as the shell splits them), continues it
        let line = err
            .lines()
            .find_map(|l| l.strip_prefix("claudebox: to resume this conversation: "))
            .unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], "claudebox");
        let mut args: Vec<&str> = words[1..].to_vec();
        args.extend(["-p", "BOX-PROMPT-TWO"]);
        let seen = mock.conversation(0).len();
        let o = claudebox(&w, &p, &mock, &args);
        let out = ok_run(&c, &o, &mock);
        assert!(out.contains("BOX-ANSWER-TWO"), "[{}] {out}", c.label);
        let text = messages_text(&mock.conversation(seen)[0]);
        assert!(
            text.contains("BOX-PROMPT-ONE") && text.contains("BOX-ANSWER-ONE"),
            "{text}"
        );

        // control: bare claude on the host does not have it
        let seen = mock.conversation(0).len();
        let o = bare_claude(&w, &c, &p, &mock, &["--resume", &u, "-p", "HOST-PROMPT"]);
        assert!(
            !o.status.success() || !stdout(&o).contains("HOST-ANSWER"),
            "[{}] bare claude resumed it without an export",
            c.label
        );
        assert_eq!(mock.conversation(seen).len(), 0, "[{}]", c.label);

        let o = w.cmd(&p).args(["--export-conversation"]).output().unwrap();
        let err = stderr(&o);
        assert!(o.status.success(), "[{}] {err}", c.label);
        assert!(err.contains(&format!("exported conversation {u}")), "{err}");
        let mine = state_conversations(&w, &p);
        assert!(
            mine.join(format!("{u}.jsonl")).is_file(),
            "a copy, not a move"
        );

        let o = bare_claude(&w, &c, &p, &mock, &["--resume", &u, "-p", "HOST-PROMPT"]);
        let out = ok_run(&c, &o, &mock);
        assert!(out.contains("HOST-ANSWER"), "[{}] {out}", c.label);
        let text = messages_text(&mock.conversation(seen)[0]);
        for e in [
            "BOX-PROMPT-ONE",
            "BOX-ANSWER-ONE",
            "BOX-PROMPT-TWO",
            "HOST-PROMPT",
        ] {
            assert!(text.contains(e), "[{}] lacks {e}: {text}", c.label);
        }
        // the cited tool output resolves on the host
        let host_dir = w.home().join(".claude/projects").join(encoded(&p));
        let transcript = fs::read_to_string(host_dir.join(format!("{u}.jsonl"))).unwrap();
        let cited = tool_results(&host_dir, &u);
        assert!(!cited.is_empty(), "[{}]", c.label);
        for f in &cited {
            assert!(transcript.contains(f.to_str().unwrap()), "{}", f.display());
            assert_eq!(
                fs::read(f).unwrap(),
                fs::read(mine.join(f.strip_prefix(&host_dir).unwrap())).unwrap()
            );
        }
    }
}

/// The agent plants, in the conversations it can write, a transcript whose `tool-results`
/// entry is a symlink to a host file it cannot read: the export copies the transcript and
/// not the link's target (it names what it skipped). Control: a by-name copy (`cp -rL`,
/// `fs::copy`) of the same directory reads the secret through the link.
#[test]
fn export_does_not_follow_an_agent_planted_symlink() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    init_repo(&p);
    let secret = w.root().join("host-secret");
    fs::write(&secret, "HOST-SECRET").unwrap();
    let u = "5b2e0c2d-7b3f-4c55-9e21-0123456789ab";
    let dir = w.home().join(".claude/projects").join(encoded(&p));
    let plant = format!(
        "set -e; d='{d}'; mkdir -p \"$d/{u}/tool-results\"; echo '{{}}' > \"$d/{u}.jsonl\"; \
         ln -s '{s}' \"$d/{u}/tool-results/steal.txt\"; ! cat '{s}' 2>/dev/null",
        d = dir.display(),
        s = secret.display()
    );
    let o = w
        .cmd(&p)
        .args(["--exec", "sh", "-c", &plant])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mine = state_conversations(&w, &p);
    let planted = mine.join(u).join("tool-results/steal.txt");
    assert!(fs::symlink_metadata(&planted).unwrap().is_symlink());

    let o = w
        .cmd(&p)
        .args(["--export-conversation", u])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("not copied") && err.contains("steal.txt"),
        "{err}"
    );
    let out = dir.join(u).join("tool-results/steal.txt");
    assert!(
        fs::symlink_metadata(&out).is_err(),
        "the link or its target was exported"
    );
    assert!(dir.join(format!("{u}.jsonl")).is_file());

    // control: by name, the planted link leads to the host's file
    assert_eq!(fs::read_to_string(&planted).unwrap(), "HOST-SECRET");
}

/// The agent replaces the cwd's conversations directory by a symlink to a host directory:
/// an import then writes nothing there (it refuses). Control: a write by name through the
/// same path lands in the host's directory.
#[test]
fn import_does_not_write_through_an_agent_planted_directory_link() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    init_repo(&p);
    let target = w.root().join("host-dir");
    fs::create_dir(&target).unwrap();
    let u = "6c2e0c2d-7b3f-4c55-9e21-0123456789ab";
    let host_dir = w.home().join(".claude/projects").join(encoded(&p));
    fs::create_dir_all(&host_dir).unwrap();
    fs::write(host_dir.join(format!("{u}.jsonl")), "{}\n").unwrap();
    let inside = w.home().join(".claude/projects").join(encoded(&p));
    let plant = format!(
        "set -e; rm -rf '{d}'; ln -s '{t}' '{d}'",
        d = inside.display(),
        t = target.display()
    );
    let o = w
        .cmd(&p)
        .args(["--exec", "sh", "-c", &plant])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mine = state_conversations(&w, &p);
    assert!(fs::symlink_metadata(&mine).unwrap().is_symlink());

    let o = w
        .cmd(&p)
        .args(["--import-conversation", u])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert_eq!(
        fs::read_dir(&target).unwrap().count(),
        0,
        "a write went through the link"
    );

    // control: by name, the same path is the host's directory
    fs::write(mine.join("probe"), "x").unwrap();
    assert!(target.join("probe").is_file());
}

/// The line at exit: a named session's is its name; an unnamed launch's names the
/// conversation written during it (here by a fake agent), and only a UUID; nothing when
/// none was written, nor for `--exec`.
#[test]
fn the_exit_line_names_the_session_or_the_conversation_written() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    init_repo(&p);
    let u = "7d2e0c2d-7b3f-4c55-9e21-0123456789ab";
    let dir = w.home().join(".claude/projects").join(encoded(&p));
    let write = |name: &str| {
        format!(
            "mkdir -p '{d}' && echo '{{}}' > '{d}/{name}.jsonl'",
            d = dir.display()
        )
    };
    let line = |o: &Output| {
        stderr(o)
            .lines()
            .filter(|l| l.contains("to resume this conversation"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let o = w.run_claude(&p, ["--session", "rev"], "true");
    assert_eq!(
        line(&o),
        ["claudebox: to resume this conversation: claudebox --session rev"],
        "{}",
        stderr(&o)
    );
    let o = w.run_claude(&p, Vec::<&str>::new(), &write(u));
    assert_eq!(
        line(&o),
        [format!(
            "claudebox: to resume this conversation: claudebox --resume {u}"
        )],
        "{}",
        stderr(&o)
    );
    // nothing written during this launch: no line (the older transcript is not this one's;
    // launches here take milliseconds, more than the 20 ms margin for file times apart)
    std::thread::sleep(Duration::from_millis(100));
    let o = w.run_claude(&p, Vec::<&str>::new(), "true");
    assert!(line(&o).is_empty(), "{}", stderr(&o));
    // a name that is not a UUID is never printed
    let o = w.run_claude(&p, Vec::<&str>::new(), &write("x\u{1b}]0;evil\u{7}"));
    assert!(line(&o).is_empty(), "{}", stderr(&o));
    // --exec: no line
    let o = w
        .cmd(&p)
        .args([
            "--exec",
            "sh",
            "-c",
            &write("8d2e0c2d-7b3f-4c55-9e21-0123456789ab"),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(line(&o).is_empty(), "{}", stderr(&o));
}
