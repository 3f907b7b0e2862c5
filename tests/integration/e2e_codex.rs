//! End to end with the real Codex CLI (`--agent codex`, issue 25) against the lab's mock of
//! OpenAI's Responses API (`tests/lab/mock_openai.py`): a conversation with a shell tool
//! call inside the sandbox, the user's read-only setup in the prompt, the conversation
//! kept in the project's own `~/.codex` and never in the host's or another project's.
//!
//! The CLI comes from `CLAUDEBOX_TEST_CODEX` (pinned) and `CLAUDEBOX_TEST_CODEX_LATEST`
//! (scripts/test installs both); without them the test fails unless `CLAUDEBOX_SKIP_E2E=1`.
//! As an ordinary user Codex's own sandbox (bwrap) runs the command inside ours
//! (`--sandbox workspace-write`); as root it cannot (a nested user namespace mapping uid 0
//! needs CAP_SETFCAP), so there the test chooses Codex's `danger-full-access`.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Stdio;

use crate::BIN;
use lab::agent::{codex_config, codex_versions, MockApi, OPENAI_KEY, OPENAI_KEY_VAR};
use lab::*;

/// Every file under `dir` whose text contains `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => out.extend(files_containing(&p, needle)),
            Ok(t)
                if t.is_file()
                    && fs::read(&p)
                        .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())) =>
            {
                out.push(p)
            }
            _ => {}
        }
    }
    out
}

#[test]
fn real_codex_holds_a_conversation_with_a_shell_call_inside_the_sandbox() {
    let _heavy = busy();
    let codex_sandbox = if nix::unistd::geteuid().is_root() {
        "danger-full-access"
    } else {
        "workspace-write"
    };
    for c in codex_versions() {
        let w = World::new_in(BIN, Path::new("/var/tmp"));
        symlink(&c.bin, w.bin().join("codex")).unwrap();
        let p = w.dir("proj");
        init_repo(&p);
        let q = w.dir("other");
        init_repo(&q);
        let mock = MockApi::start_openai(&serde_json::json!([
            {"shell": "echo SHELL-RAN-4242 > out.txt; cat out.txt"},
            "DONE-7731"
        ]));
        let host_codex = w.home().join(".codex");
        fs::create_dir_all(&host_codex).unwrap();
        fs::write(host_codex.join("config.toml"), codex_config(mock.port())).unwrap();
        fs::write(host_codex.join("AGENTS.md"), "USER-AGENTS-MD-5150\n").unwrap();
        fs::create_dir_all(host_codex.join("skills/lab-skill")).unwrap();
        fs::write(
            host_codex.join("skills/lab-skill/SKILL.md"),
            "---\nname: lab-skill\ndescription: USER-SKILL-DESC-6161\n---\nbody\n",
        )
        .unwrap();
        let o = w
            .cmd(&p)
            .env(OPENAI_KEY_VAR, OPENAI_KEY)
            .args([
                "--agent",
                "codex",
                "exec",
                "--json",
                "--sandbox",
                codex_sandbox,
            ])
            .arg("PROMPT-RUN-IT-9090")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (out, err) = (stdout(&o), stderr(&o));
        assert!(
            o.status.success(),
            "[{}] {out}{err}{}",
            c.label,
            mock.stderr()
        );
        assert!(out.contains("\"thread.started\""), "[{}] {out}", c.label);
        assert!(out.contains("DONE-7731"), "[{}] {out}", c.label);
        // The command ran inside, in the project, and Codex sent its output back.
        assert_eq!(
            fs::read_to_string(p.join("out.txt")).unwrap_or_default(),
            "SHELL-RAN-4242\n",
            "[{}] {out}",
            c.label
        );
        let conv = mock.conversation(0);
        assert!(conv.len() >= 2, "[{}] {conv:?}", c.label);
        let second = conv[1]["body"].to_string();
        assert!(
            second.contains("function_call_output") && second.contains("SHELL-RAN-4242"),
            "[{}] the tool's output did not reach the API: {second}",
            c.label
        );
        // The user's AGENTS.md (read-only inside) is part of the prompt.
        assert!(
            conv[0]["body"].to_string().contains("USER-AGENTS-MD-5150"),
            "[{}] the user's AGENTS.md is not in the prompt",
            c.label
        );
        assert!(
            conv[0]["body"].to_string().contains("USER-SKILL-DESC-6161"),
            "[{}] the user's skill (read-only) is not offered",
            c.label
        );
        // The conversation is the project's: in its own Codex directory, not the host's.
        let state = w.state().join("projects");
        let kept = files_containing(&state, "PROMPT-RUN-IT-9090");
        assert!(
            kept.iter()
                .any(|f| f.to_string_lossy().contains("/codex-home/sessions/")),
            "[{}] the rollout is not in the project's state: {kept:?}",
            c.label
        );
        assert!(
            files_containing(&host_codex, "PROMPT-RUN-IT-9090").is_empty()
                && !host_codex.join("sessions").exists()
                && !host_codex.join("state_5.sqlite").exists(),
            "[{}] Codex wrote into the host's ~/.codex",
            c.label
        );
        // Another project's Codex sandbox sees none of it.
        let o = w
            .cmd(&q)
            .args(["--agent", "codex", "--exec", "sh", "-c"])
            .arg("grep -rqs PROMPT-RUN-IT-9090 ~/.codex/ $HOME/.claudebox 2>/dev/null && echo LEAKED; echo CHECKED")
            .output()
            .unwrap();
        let seen = stdout(&o);
        assert!(
            seen.contains("CHECKED") && !seen.contains("LEAKED"),
            "[{}] {seen}{}",
            c.label,
            stderr(&o)
        );
        // Control: the same search from the host finds it.
        assert!(!kept.is_empty());
        // --check names Codex's install and version, and the agent a launch here runs.
        let o = w.cmd(&p).arg("--check").output().unwrap();
        let check = format!("{}{}", stdout(&o), stderr(&o));
        let version = fs::read_to_string(
            fs::canonicalize(&c.bin)
                .unwrap()
                .parent()
                .unwrap()
                .join("../package.json"),
        )
        .unwrap();
        let version: serde_json::Value = serde_json::from_str(&version).unwrap();
        let line = check
            .lines()
            .find(|l| l.contains("codex"))
            .unwrap_or_default();
        assert!(
            line.contains("agent here: claude (default)")
                && line.contains(version["version"].as_str().unwrap()),
            "[{}] {check}",
            c.label
        );
    }
}

/// The agent is a setting like the others: `--agent`, `agent = "codex"` in a project's
/// section of the config file, shown by `--dry-run` (with CODEX_HOME instead of
/// CLAUDE_CONFIG_DIR) and `--list`; a name no row has is one line. No Codex needed:
/// `--exec` runs without it.
#[test]
fn the_agent_is_chosen_by_flag_or_config_and_shown() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    init_repo(&p);
    let xdg = w.root().join("xdg");
    fs::create_dir_all(xdg.join("claudebox")).unwrap();
    let dry = |args: &[&str]| {
        let o = w
            .cmd(&p)
            .env("XDG_CONFIG_HOME", &xdg)
            .arg("--dry-run")
            .args(args)
            .output()
            .unwrap();
        ok(&o)
    };
    let plain = dry(&[]);
    assert!(plain.contains("\nagent\tclaude\tdefault\n"), "{plain}");
    assert!(plain.contains("CLAUDE_CONFIG_DIR=") && !plain.contains("CODEX_HOME="));
    let codex = dry(&["--agent", "codex", "--exec", "true"]);
    assert!(codex.contains("\nagent\tcodex\tcommand line\n"), "{codex}");
    assert!(codex.contains("CODEX_HOME=") && !codex.contains("CLAUDE_CONFIG_DIR="));
    assert!(codex.contains("#   agent      codex"), "{codex}");
    fs::write(
        xdg.join("claudebox/config.toml"),
        format!(
            "[[project]]\nroot = \"{}\"\nagent = \"codex\"\n",
            p.display()
        ),
    )
    .unwrap();
    let from_config = dry(&["--exec", "true"]);
    assert!(from_config.contains("\nagent\tcodex\t"), "{from_config}");
    assert!(dry(&["--agent", "claude"]).contains("\nagent\tclaude\tcommand line\n"));
    fs::write(xdg.join("claudebox/config.toml"), "agent = \"gemini\"\n").unwrap();
    let o = w
        .cmd(&p)
        .env("XDG_CONFIG_HOME", &xdg)
        .arg("--dry-run")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("unknown agent"), "{}", stderr(&o));
    fs::remove_file(xdg.join("claudebox/config.toml")).unwrap();
    // --session with --exec is refused, in one line, before anything is made (as with claude).
    let o = w
        .cmd(&p)
        .args(["--agent", "codex", "--session", "x", "--exec", "true"])
        .output()
        .unwrap();
    assert!(
        !o.status.success() && stderr(&o).lines().count() == 1,
        "{}",
        stderr(&o)
    );
    // A Codex launch gives the project its own ~/.codex, and --list names the agent.
    ok(&w
        .cmd(&p)
        .args([
            "--agent",
            "codex",
            "--exec",
            "sh",
            "-c",
            "test -L ~/.codex/auth.json",
        ])
        .output()
        .unwrap());
    let o = w.cmd(&p).args(["--list", "--json"]).output().unwrap();
    let rows: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
    assert_eq!(rows[0]["agents"], serde_json::json!(["codex"]), "{rows}");
    let table = ok(&w.cmd(&p).arg("--list").output().unwrap());
    assert!(table.contains("agents\tcodex"), "{table}");
}

/// `--session NAME` with Codex (issue 25, item 3): the first run's thread (Codex chooses its
/// id) is learnt after the run and recorded; the same name from a linked worktree resumes
/// it (the API sees the earlier exchange), another name gets its own thread. Control:
/// without the record, Codex's own `resume --last` from the worktree starts fresh (it picks
/// by exact cwd).
#[test]
fn codex_named_sessions_resume_their_own_thread_from_a_worktree() {
    let _heavy = busy();
    for c in codex_versions() {
        let w = World::new_in(BIN, Path::new("/var/tmp"));
        symlink(&c.bin, w.bin().join("codex")).unwrap();
        let p = w.dir("proj");
        init_repo(&p);
        let wt = w.root().join("wt");
        git(&p, &["worktree", "add", "-q", wt.to_str().unwrap()]);
        let mock = MockApi::start_openai(&serde_json::json!([
            "ANSWER-ONE-1111",
            "ANSWER-CONTROL-4444",
            "ANSWER-TWO-2222",
            "ANSWER-OTHER-3333"
        ]));
        let host_codex = w.home().join(".codex");
        fs::create_dir_all(&host_codex).unwrap();
        fs::write(host_codex.join("config.toml"), codex_config(mock.port())).unwrap();
        let run = |dir: &Path, pre: &[&str], prompt: &str| {
            let o = w
                .cmd(dir)
                .env(OPENAI_KEY_VAR, OPENAI_KEY)
                .args(["--agent", "codex"])
                .args(pre)
                .arg(prompt)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "[{}] {}{}{}",
                c.label,
                stdout(&o),
                stderr(&o),
                mock.stderr()
            );
            (stdout(&o), stderr(&o))
        };
        let thread_of = |out: &str| -> String {
            out.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v["type"] == "thread.started")
                .and_then(|v| v["thread_id"].as_str().map(String::from))
                .unwrap_or_else(|| panic!("[{}] no thread.started: {out}", c.label))
        };
        let exec = ["exec", "--json", "--skip-git-repo-check"];
        let named = |n: &'static str| -> Vec<&'static str> {
            let mut v = vec!["--session", n];
            v.extend(exec);
            v
        };
        // 1. A new name: Codex makes a thread, claudebox records its id.
        let (out, err) = run(&p, &named("alpha"), "PROMPT-ONE-5555");
        let first = thread_of(&out);
        assert!(
            err.contains(&format!("session `alpha` is Codex thread {first}")),
            "[{}] {err}",
            c.label
        );
        let list = ok(&w.cmd(&p).args(["--list", "--json"]).output().unwrap());
        assert!(list.contains(&first), "[{}] {list}", c.label);
        // Control: without the record, Codex's own `resume --last` from the worktree does
        // not find alpha's thread (made in the main checkout): a new thread, no earlier
        // exchange.
        let (out, _) = run(
            &wt,
            &[
                "exec",
                "--json",
                "--skip-git-repo-check",
                "resume",
                "--last",
            ],
            "PROMPT-CONTROL-8888",
        );
        assert_ne!(thread_of(&out), first, "[{}] {out}", c.label);
        let control = mock.conversation(1)[0]["body"].to_string();
        assert!(
            control.contains("PROMPT-CONTROL-8888") && !control.contains("PROMPT-ONE-5555"),
            "[{}] {control}",
            c.label
        );
        // 2. The same name from the linked worktree resumes it: same thread, and the API
        // is sent the earlier exchange.
        let dry = w
            .cmd(&wt)
            .args(["--agent", "codex", "--dry-run"])
            .args(named("alpha"))
            .arg("x")
            .output()
            .unwrap();
        assert!(
            stderr(&dry).contains(&format!("would resume {first}"))
                && stdout(&dry).contains(&format!("exec resume {first} --json")),
            "[{}] {}{}",
            c.label,
            stdout(&dry),
            stderr(&dry)
        );
        let (out, _) = run(&wt, &named("alpha"), "PROMPT-TWO-6666");
        assert_eq!(thread_of(&out), first, "[{}] {out}", c.label);
        assert!(out.contains("ANSWER-TWO-2222"), "[{}] {out}", c.label);
        let conv = mock.conversation(0);
        let second = conv[2]["body"].to_string();
        assert!(
            second.contains("PROMPT-ONE-5555")
                && second.contains("ANSWER-ONE-1111")
                && second.contains("PROMPT-TWO-6666"),
            "[{}] the resumed thread lost the earlier exchange: {second}",
            c.label
        );
        // 3. Another name: its own thread, nothing of alpha's.
        let (out, err) = run(&wt, &named("beta"), "PROMPT-OTHER-7777");
        let other = thread_of(&out);
        assert_ne!(other, first, "[{}]", c.label);
        assert!(
            err.contains(&format!("session `beta` is Codex thread {other}")),
            "[{}] {err}",
            c.label
        );
        let third = mock.conversation(3)[0]["body"].to_string();
        assert!(
            third.contains("PROMPT-OTHER-7777") && !third.contains("PROMPT-ONE-5555"),
            "[{}] {third}",
            c.label
        );
        // 4. Two new names at once, one from each checkout: each records its own thread
        // (both threads are new when either run ends; the rollout's cwd tells them apart).
        let spawn = |dir: &Path, name: &str, prompt: &str| {
            w.cmd(dir)
                .env(OPENAI_KEY_VAR, OPENAI_KEY)
                .args(["--agent", "codex", "--session", name])
                .args(exec)
                .arg(prompt)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (g, d) = (
            spawn(&p, "gamma", "PROMPT-G"),
            spawn(&wt, "delta", "PROMPT-D"),
        );
        let (g, d) = (g.wait_with_output().unwrap(), d.wait_with_output().unwrap());
        for (name, o) in [("gamma", &g), ("delta", &d)] {
            assert!(o.status.success(), "[{}] {name}: {}", c.label, stderr(o));
            let id = thread_of(&stdout(o));
            assert!(
                stderr(o).contains(&format!("session `{name}` is Codex thread {id}")),
                "[{}] {name} recorded another thread than its own {id}: {}",
                c.label,
                stderr(o)
            );
        }
        // 5. The thread gone (its rollout deleted): a new one under the same name, the lost
        // one kept in the record's `replaced`.
        let state = w.state().join("projects");
        for f in files_containing(&state, "PROMPT-OTHER-7777") {
            if f.to_string_lossy().contains("/sessions/") && f.to_string_lossy().contains(&other) {
                fs::remove_file(f).unwrap();
            }
        }
        let (out, err) = run(&p, &named("beta"), "PROMPT-AGAIN-9999");
        let again = thread_of(&out);
        assert_ne!(again, other, "[{}]", c.label);
        assert!(
            err.contains(&format!("its thread {other} is no longer"))
                && err.contains(&format!("session `beta` is Codex thread {again}")),
            "[{}] {err}",
            c.label
        );
        let record = files_containing(&state, &again)
            .into_iter()
            .find(|f| f.ends_with("sessions/beta.json"))
            .unwrap();
        let record: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(record).unwrap()).unwrap();
        assert_eq!(
            record["replaced"],
            serde_json::json!([other]),
            "[{}]",
            c.label
        );
        assert_eq!(record["agent"], "codex", "[{}]", c.label);
        // A Claude launch with a Codex session's name is refused in one line.
        let o = w
            .cmd(&p)
            .args(["--session", "alpha", "--dry-run"])
            .output()
            .unwrap();
        assert!(
            !o.status.success() && stderr(&o).contains("is a conversation of codex"),
            "[{}] {}",
            c.label,
            stderr(&o)
        );
        // Codex's own thread pickers are refused with --session, in one line.
        for bad in [
            &["resume", "--last"][..],
            &["exec", "resume", "--last"],
            &["--last"],
        ] {
            let o = w
                .cmd(&p)
                .args(["--agent", "codex", "--session", "alpha", "--dry-run"])
                .args(bad)
                .output()
                .unwrap();
            assert!(
                !o.status.success() && stderr(&o).lines().count() == 1,
                "[{}] {bad:?}: {}",
                c.label,
                stderr(&o)
            );
        }
    }
}

/// Codex starts without a warning when the user has no `~/.codex/hooks.json`: the
/// read-only stand-in claudebox mounts in its place is valid, empty JSON (an empty file
/// made both versions print "failed to parse hooks config" at every start). Control: an
/// empty `hooks.json` of the user's own, bound read-only as it is, gets the warning.
#[test]
fn codex_starts_without_a_hooks_warning() {
    let _heavy = busy();
    let codex_sandbox = if nix::unistd::geteuid().is_root() {
        "danger-full-access"
    } else {
        "workspace-write"
    };
    for c in codex_versions() {
        let w = World::new_in(BIN, Path::new("/var/tmp"));
        symlink(&c.bin, w.bin().join("codex")).unwrap();
        let p = w.dir("proj");
        init_repo(&p);
        let mock = MockApi::start_openai(&serde_json::json!(["DONE-QUIET", "DONE-QUIET"]));
        let host_codex = w.home().join(".codex");
        fs::create_dir_all(&host_codex).unwrap();
        fs::write(host_codex.join("config.toml"), codex_config(mock.port())).unwrap();
        let run = || {
            let o = w
                .cmd(&p)
                .env(OPENAI_KEY_VAR, OPENAI_KEY)
                .args(["--agent", "codex", "exec", "--sandbox", codex_sandbox])
                .arg("say it")
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                o.status.success() && stdout(&o).contains("DONE-QUIET"),
                "[{}] {}{}",
                c.label,
                stdout(&o),
                stderr(&o)
            );
            stderr(&o)
        };
        let err = run();
        assert!(
            !err.to_lowercase().contains("hooks"),
            "[{}] a warning about hooks: {err}",
            c.label
        );
        // Control: the user's own empty hooks.json.
        fs::write(host_codex.join("hooks.json"), "").unwrap();
        let err = run();
        assert!(
            err.contains("failed to parse hooks config"),
            "[{}] control: no warning for an empty hooks.json: {err}",
            c.label
        );
    }
}
