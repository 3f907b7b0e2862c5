//! Named sessions (`--session NAME`, `--forget NAME`, `--list`) with real bwrap, real git
//! and a fake claude that keeps transcripts where claude keeps them.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use crate::BIN;
use lab::*;

fn world() -> World {
    let w = World::new(BIN);
    w.install_claude(FAKE_CLAUDE_SESSIONS);
    w
}

fn launch(w: &World, cwd: &Path, name: &str, script: &str) -> Output {
    w.run_claude(cwd, ["--session", name, "-p", "hi"], script)
}

/// The conversation flag claude got and its UUID.
fn conversation(out: &str) -> (String, String) {
    let args = fake_args(out);
    let i = args
        .iter()
        .position(|a| a == "--session-id" || a == "--resume")
        .unwrap_or_else(|| panic!("no conversation flag in {args:?}"));
    (args[i].clone(), args[i + 1].clone())
}

fn history(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("HISTORY<").and_then(|l| l.strip_suffix('>')))
        .map(str::to_string)
        .collect()
}

fn sessions_dir(w: &World) -> PathBuf {
    let projects: Vec<_> = fs::read_dir(w.state().join("projects"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(projects.len(), 1, "{projects:?}");
    projects[0].join("sessions")
}

fn record(w: &World, name: &str) -> serde_json::Value {
    let bytes = fs::read(sessions_dir(w).join(format!("{name}.json"))).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn conversations(w: &World) -> PathBuf {
    sessions_dir(w).parent().unwrap().join("claude-projects")
}

/// Every `<uuid>.jsonl` in the project's conversations, as "<dir>/<file>".
fn transcripts(w: &World) -> Vec<String> {
    let mut out = Vec::new();
    for d in fs::read_dir(conversations(w)).unwrap() {
        let d = d.unwrap();
        for f in fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap().file_name().into_string().unwrap();
            if f.ends_with(".jsonl") {
                out.push(format!("{}/{f}", d.file_name().into_string().unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn repo(w: &World) -> PathBuf {
    let r = w.dir("repo");
    init_repo(&r);
    r
}

#[test]
fn first_launch_records_then_later_launches_resume() {
    let w = world();
    let r = repo(&w);
    let out = ok(&launch(&w, &r, "rev", ""));
    let (flag, uuid) = conversation(&out);
    assert_eq!(flag, "--session-id");
    // claudebox's options come before the user's arguments.
    let args = fake_args(&out);
    let at = args.iter().position(|a| a == "--session-id").unwrap();
    assert_eq!(&args[at + 2..], ["-p", "hi"]);
    assert!(out.contains("SESSION<rev>"), "{out}");
    assert_eq!(record(&w, "rev")["uuid"], uuid.as_str());

    let dir = sessions_dir(&w);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("rev.json")), 0o600);
    assert_eq!(mode(&dir.join("rev.running")), 0o600);

    let out = ok(&launch(&w, &r, "rev", ""));
    assert_eq!(conversation(&out), ("--resume".to_string(), uuid.clone()));
    assert_eq!(history(&out).len(), 1, "{out}");
    let out = ok(&launch(&w, &r, "rev", ""));
    assert_eq!(conversation(&out), ("--resume".to_string(), uuid));
    assert_eq!(history(&out).len(), 2, "{out}");
}

#[test]
fn resumes_its_own_conversation_from_a_subdirectory_and_a_worktree() {
    let w = world();
    let r = repo(&w);
    let sub = r.join("src/deep");
    fs::create_dir_all(&sub).unwrap();
    let wt = w.work().join("repo-wt");
    git(&r, &["worktree", "add", "-q", wt.to_str().unwrap()]);

    let (_, uuid) = conversation(&ok(&launch(&w, &r, "builder", "")));
    for (i, cwd) in [&sub, &wt, &r].into_iter().enumerate() {
        let out = ok(&launch(&w, cwd, "builder", ""));
        assert_eq!(conversation(&out), ("--resume".into(), uuid.clone()));
        // The whole conversation so far came along, tool results included.
        assert_eq!(history(&out).len(), i + 1, "{out}");
        assert!(out.contains("TOOL-RESULTS-HERE"), "{out}");
    }
    // One transcript, now under the directory it last ran in.
    let t = transcripts(&w);
    assert_eq!(t.len(), 1, "{t:?}");
    assert!(t[0].ends_with(&format!("-repo/{uuid}.jsonl")), "{t:?}");
}

#[test]
fn two_names_never_cross() {
    let w = world();
    let r = repo(&w);
    let sub = w.dir("repo/sub");
    let (_, a) = conversation(&ok(&launch(&w, &r, "a", "")));
    let (_, b) = conversation(&ok(&launch(&w, &sub, "b", "")));
    assert_ne!(a, b);
    for (name, uuid, cwd) in [
        ("a", &a, &sub),
        ("b", &b, &r),
        ("a", &a, &r),
        ("b", &b, &sub),
    ] {
        let out = ok(&launch(&w, cwd, name, ""));
        assert_eq!(conversation(&out).1, *uuid);
        let h = history(&out);
        assert!(!h.is_empty());
        let own = format!("\"session\":\"{name}\"");
        assert!(h.iter().all(|l| l.contains(&own)), "{name}: {h:?}");
    }
}

/// Waits for `path` to exist, failing (not hanging) if the launch it waits on died.
fn wait_for(path: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the launch exited ({status}) before {}", path.display());
        }
        assert!(
            Instant::now() < deadline,
            "gave up waiting for {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Shell for the fake agent: create `$1`, then wait until `$2` exists.
fn signal_then_wait(started: &Path, release: &Path) -> String {
    format!(
        "echo \"$CLAUDEBOX_INSTANCE_ID\" > '{}'; n=0; while [ ! -e '{}' ] && [ $n -lt 2400 ]; \
         do sleep 0.05; n=$((n+1)); done",
        started.display(),
        release.display()
    )
}

fn spawn(w: &World, cwd: &Path, args: &[&str], script: &str) -> Child {
    w.cmd(cwd)
        .args(args)
        .env("FAKE_CLAUDE_SCRIPT", script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn the_same_name_twice_at_once_refuses_and_names_the_running_one() {
    let w = world();
    let r = repo(&w);
    let (started, release) = (r.join("started"), r.join("release"));
    ok(&launch(&w, &r, "rev", ""));
    let mut first = spawn(
        &w,
        &r,
        &["--session", "rev"],
        &signal_then_wait(&started, &release),
    );
    wait_for(&started, &mut first);
    let instance = fs::read_to_string(&started).unwrap().trim().to_string();

    let second = launch(&w, &r, "rev", "");
    let err = stderr(&second);
    assert!(!second.status.success());
    assert!(!stdout(&second).contains("FAKE-CLAUDE-START"), "it ran");
    assert!(err.contains("session `rev` is already running"), "{err}");
    assert!(err.contains(&format!("pid {}", first.id())), "{err}");
    assert!(err.contains(&instance), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // --list tells, and --forget refuses while it runs.
    let list = ok(&w.cmd(&r).arg("--list").output().unwrap());
    assert!(
        list.lines()
            .any(|l| l.contains("session\trev\t") && l.contains("\trunning\t")),
        "{list}"
    );
    let forget = w.cmd(&r).args(["--forget", "rev"]).output().unwrap();
    assert!(!forget.status.success());
    assert!(
        stderr(&forget).contains("already running"),
        "{}",
        stderr(&forget)
    );
    assert!(sessions_dir(&w).join("rev.json").exists());

    // Another name runs alongside.
    ok(&launch(&w, &r, "other", ""));

    fs::write(&release, "").unwrap();
    let out = first.wait_with_output().unwrap();
    ok(&out);
    let list = ok(&w.cmd(&r).arg("--list").output().unwrap());
    assert!(
        list.lines()
            .any(|l| l.contains("\trev\t") && l.contains("\tstopped\t")),
        "{list}"
    );
    let out = ok(&launch(&w, &r, "rev", ""));
    assert_eq!(conversation(&out).0, "--resume");
}

/// The agent closes every descriptor from 3 up: the name's lock is not among them (the
/// supervising claudebox holds it, out of the sandbox's reach), so the flock stays held
/// and a second launch of the name is refused; the run note names the first sandbox's
/// claudebox, which still runs.
#[test]
fn a_session_that_closes_its_lock_still_counts_as_running() {
    use nix::fcntl::{Flock, FlockArg};
    let w = world();
    let r = repo(&w);
    let (started, release) = (r.join("started"), r.join("release"));
    ok(&launch(&w, &r, "rev", ""));
    let inner = r.join("inner.sh");
    fs::write(&inner, signal_then_wait(&started, &release)).unwrap();
    let script = format!(
        "exec python3 -c 'import os; os.closerange(3, 1 << 16); \
         os.execvp(\"sh\", [\"sh\", \"{}\"])'",
        inner.display()
    );
    let mut first = spawn(&w, &r, &["--session", "rev"], &script);
    wait_for(&started, &mut first);

    let lock = fs::File::open(sessions_dir(&w).join("rev.lock")).unwrap();
    assert!(
        Flock::lock(lock, FlockArg::LockExclusiveNonblock).is_err(),
        "the name's lock was freed from inside"
    );

    let second = launch(&w, &r, "rev", "");
    let err = stderr(&second);
    assert!(!second.status.success(), "a second `rev` started: {err}");
    assert!(!stdout(&second).contains("FAKE-CLAUDE-START"), "it ran");
    assert!(err.contains("session `rev` is already running"), "{err}");
    assert!(err.contains(&format!("pid {}", first.id())), "{err}");
    let list = ok(&w.cmd(&r).arg("--list").output().unwrap());
    assert!(
        list.lines()
            .any(|l| l.contains("session\trev\t") && l.contains("\trunning\t")),
        "{list}"
    );
    let forget = w.cmd(&r).args(["--forget", "rev"]).output().unwrap();
    assert!(!forget.status.success(), "forgotten while it runs");

    fs::write(&release, "").unwrap();
    ok(&first.wait_with_output().unwrap());
    let out = ok(&launch(&w, &r, "rev", ""));
    assert_eq!(conversation(&out).0, "--resume");
}

#[test]
fn twenty_names_launched_at_once_all_survive() {
    const N: usize = 20;
    let w = world();
    let r = repo(&w);
    let names: Vec<String> = (0..N).map(|i| format!("agent-{i}")).collect();
    for round in 0..2 {
        let ready = r.join(format!("ready-{round}"));
        fs::create_dir_all(&ready).unwrap();
        // Each agent waits until all twenty run at once.
        let barrier = format!(
            "touch '{0}/'\"$CLAUDEBOX_SESSION\"; n=0; \
             while [ $(ls '{0}' | wc -l) -lt {N} ]; do \
               sleep 0.05; n=$((n+1)); [ $n -gt 2400 ] && exit 3; done; true",
            ready.display()
        );
        let children: Vec<Child> = names
            .iter()
            .map(|n| spawn(&w, &r, &["--session", n, "-p", "hi"], &barrier))
            .collect();
        let mut uuids = Vec::new();
        for (name, child) in names.iter().zip(children) {
            let out = ok(&child.wait_with_output().unwrap());
            let (flag, uuid) = conversation(&out);
            assert_eq!(
                flag,
                if round == 0 {
                    "--session-id"
                } else {
                    "--resume"
                }
            );
            assert_eq!(record(&w, name)["uuid"], uuid.as_str(), "{name}");
            if round == 1 {
                let h = history(&out);
                let own = format!("\"session\":\"{name}\"");
                assert!(h.len() == 1 && h[0].contains(&own), "{name}: {h:?}");
            }
            uuids.push(uuid);
        }
        uuids.sort();
        uuids.dedup();
        assert_eq!(uuids.len(), N);
    }
    // No temporary files left behind.
    let left: Vec<_> = fs::read_dir(sessions_dir(&w))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.as_bytes().starts_with(b"."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_gone_transcript_is_reported_and_a_fresh_conversation_starts() {
    let w = world();
    let r = repo(&w);
    let (_, old) = conversation(&ok(&launch(&w, &r, "rev", "")));
    for t in transcripts(&w) {
        fs::remove_file(conversations(&w).join(t)).unwrap();
    }
    let o = launch(&w, &r, "rev", "");
    let out = ok(&o);
    let (flag, new) = conversation(&out);
    assert_eq!(flag, "--session-id");
    assert_ne!(new, old);
    let err = stderr(&o);
    assert!(err.contains(&old) && err.contains("no transcript"), "{err}");
    let rec = record(&w, "rev");
    assert_eq!(rec["uuid"], new.as_str());
    assert_eq!(rec["replaced"][0], old.as_str());
    let out = ok(&launch(&w, &r, "rev", ""));
    assert_eq!(conversation(&out), ("--resume".into(), new));
}

#[test]
fn a_corrupted_record_is_an_error_and_is_left_alone() {
    let w = world();
    let r = repo(&w);
    ok(&launch(&w, &r, "rev", ""));
    let path = sessions_dir(&w).join("rev.json");
    for bad in [
        &b"{\"name\":\"rev\",\"uu"[..],
        b"",
        b"{\"name\":\"rev\",\"uuid\":\"--dangerously-skip-permissions\",\"created\":\"x\"}",
        b"{\"name\":\"other\",\"uuid\":\"11111111-2222-4333-8444-555555555555\",\"created\":\"x\"}",
    ] {
        fs::write(&path, bad).unwrap();
        for args in [
            &["--session", "rev"][..],
            &["--session", "rev", "--dry-run"],
        ] {
            let o = w.cmd(&r).args(args).output().unwrap();
            assert!(!o.status.success());
            assert!(!stdout(&o).contains("FAKE-CLAUDE-START"));
            let err = stderr(&o);
            assert!(
                err.contains(path.to_str().unwrap()) && err.contains("corrupted"),
                "{err}"
            );
            assert_eq!(fs::read(&path).unwrap(), bad);
        }
    }
    // Other names still work; --list shows the problem; --forget is the way out.
    ok(&launch(&w, &r, "other", ""));
    let list = ok(&w.cmd(&r).arg("--list").output().unwrap());
    assert!(list.contains("session\trev\t-\tunreadable: "), "{list}");
    ok(&w.cmd(&r).args(["--forget", "rev"]).output().unwrap());
    assert_eq!(
        conversation(&ok(&launch(&w, &r, "rev", ""))).0,
        "--session-id"
    );
}

#[test]
fn bad_names_are_refused_and_nothing_is_created() {
    let w = world();
    let r = w.dir("plain");
    let long = "n".repeat(65);
    let bad: Vec<&OsStr> = vec![
        OsStr::new(""),
        OsStr::new("."),
        OsStr::new(".."),
        OsStr::new("../escape"),
        OsStr::new("a/b"),
        OsStr::new("/abs"),
        OsStr::new(".hidden"),
        OsStr::new("a\nb"),
        OsStr::new("sp ace"),
        OsStr::new(&long),
        OsStr::from_bytes(b"bad\xffbytes"),
    ];
    for name in bad {
        for flag in ["--session", "--forget"] {
            let o = w
                .cmd(&r)
                .arg(flag)
                .arg(name)
                .env("FAKE_CLAUDE_SCRIPT", "")
                .output()
                .unwrap();
            assert!(!o.status.success(), "{name:?} accepted");
            let err = stderr(&o);
            assert!(err.contains("invalid session name"), "{name:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(!w.state().exists(), "{name:?} created state");
        }
    }
    let home: Vec<_> = fs::read_dir(w.home())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(home, [".claude"]);
}

#[test]
fn claude_options_that_pick_a_conversation_are_refused_with_session() {
    let w = world();
    let r = w.dir("plain");
    for extra in [
        &["--resume", "x"][..],
        &["-c"],
        &["--continue"],
        &["--session-id", "x"],
    ] {
        let o = w
            .cmd(&r)
            .args(["--session", "rev"])
            .args(extra)
            .output()
            .unwrap();
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("cannot be used with it"),
            "{}",
            stderr(&o)
        );
        assert!(!w.state().exists());
    }
    // Text after claude's own `--` is claude's business (clap takes the first `--`).
    let out = ok(&w
        .cmd(&r)
        .args(["--session", "rev", "--", "--", "-c"])
        .env("FAKE_CLAUDE_SCRIPT", "")
        .output()
        .unwrap());
    assert!(out.contains("ARG<-->\nARG<-c>"), "{out}");
}

#[test]
fn forget_removes_the_record_and_keeps_the_transcript() {
    let w = world();
    let r = repo(&w);
    let (_, uuid) = conversation(&ok(&launch(&w, &r, "rev", "")));
    let o = w
        .cmd(&r)
        .args(["--forget", "rev", "--dry-run"])
        .output()
        .unwrap();
    assert!(ok(&o).is_empty() && stderr(&o).contains("would forget"));
    assert!(sessions_dir(&w).join("rev.json").exists());

    let o = w.cmd(&r).args(["--forget", "rev"]).output().unwrap();
    ok(&o);
    assert!(stderr(&o).contains(&uuid), "{}", stderr(&o));
    assert!(fs::read_dir(sessions_dir(&w)).unwrap().next().is_none());
    assert_eq!(transcripts(&w).len(), 1);

    let o = w.cmd(&r).args(["--forget", "rev"]).output().unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no session named `rev`"),
        "{}",
        stderr(&o)
    );

    let (flag, new) = conversation(&ok(&launch(&w, &r, "rev", "")));
    assert_eq!(flag, "--session-id");
    assert_ne!(new, uuid);
}

#[test]
fn dry_run_shows_the_decision_and_changes_nothing() {
    let w = world();
    let r = repo(&w);
    let o = w
        .cmd(&r)
        .args(["--dry-run", "--session", "rev"])
        .output()
        .unwrap();
    let out = ok(&o);
    assert!(
        stderr(&o).contains("would start a new conversation"),
        "{}",
        stderr(&o)
    );
    assert!(out.contains("--session-id"), "{out}");
    assert!(out.contains("set\tCLAUDEBOX_SESSION=rev"), "{out}");
    assert!(!w.state().exists());

    let (_, uuid) = conversation(&ok(&launch(&w, &r, "rev", "")));
    let sub = w.dir("repo/sub");
    let before = transcripts(&w);
    let o = w
        .cmd(&sub)
        .args(["--dry-run", "--session", "rev"])
        .output()
        .unwrap();
    let out = ok(&o);
    assert!(out.contains(&format!("--resume {uuid}")), "{out}");
    assert!(
        stderr(&o).contains("after moving its transcript"),
        "{}",
        stderr(&o)
    );
    assert_eq!(transcripts(&w), before);
}

#[test]
fn the_session_variable_is_set_only_for_named_sessions() {
    let w = world();
    let r = w.dir("plain");
    let out = ok(&w
        .cmd(&r)
        .env("CLAUDEBOX_SESSION", "stale")
        .env("FAKE_CLAUDE_SCRIPT", "")
        .output()
        .unwrap());
    assert!(out.contains("SESSION<unset>"), "{out}");
    let o = w
        .cmd(&r)
        .args(["--session", "x", "--exec", "true"])
        .output()
        .unwrap();
    assert!(!o.status.success());
}

/// The agent plants a symlink where the transcript would be moved to; claudebox must not
/// follow it out of the conversations directory.
#[test]
fn a_planted_symlink_does_not_carry_the_transcript_outside() {
    let w = world();
    let r = repo(&w);
    let sub = w.dir("repo/sub");
    let outside = w.dir("outside");
    let enc = |p: &Path| -> String {
        p.to_str()
            .unwrap()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect()
    };
    let plant = format!(
        "ln -s '{}' \"$HOME/.claude/projects/{}\"",
        outside.display(),
        enc(&sub)
    );
    ok(&launch(&w, &r, "rev", &plant));
    let before = transcripts(&w);
    let o = launch(&w, &sub, "rev", "");
    assert!(!o.status.success());
    assert!(!stdout(&o).contains("FAKE-CLAUDE-START"));
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(transcripts(&w), before);
    // Still resumable where it is.
    assert_eq!(conversation(&ok(&launch(&w, &r, "rev", ""))).0, "--resume");
}

/// With the real Claude Code CLI, both versions (`CLAUDEBOX_TEST_CLAUDE` and
/// `CLAUDEBOX_TEST_CLAUDE_LATEST`, installed by scripts/test): it runs offline far enough
/// to create the transcript and to look it up for `--resume` (2.1.197 says "No
/// conversation found" when the transcript is not where it looks).
#[test]
fn real_claude_resumes_from_another_directory_including_a_long_one() {
    for c in lab::agent::each_claude() {
        resumes_from_another_directory_including_a_long_one(&c.bin);
    }
}

fn resumes_from_another_directory_including_a_long_one(real: &Path) {
    let w = World::new(BIN);
    fs::remove_file(w.bin().join("claude")).unwrap();
    std::os::unix::fs::symlink(fs::canonicalize(real).unwrap(), w.bin().join("claude")).unwrap();
    let r = repo(&w);
    let long = r.join("a".repeat(120)).join("b".repeat(120));
    fs::create_dir_all(&long).unwrap();
    let run = |cwd: &Path, name: &str| -> Output {
        w.cmd(cwd)
            .args(["--session", name, "-p", "hi"])
            .output()
            .unwrap()
    };
    // claude prints its verdict on stdout or stderr depending on the version: read both.
    let said = |o: &Output| format!("{}{}", stdout(o), stderr(o));
    // claude also searches the worktree roots' directories, so start in a subdirectory.
    let start = w.dir("repo/start");
    let o = run(&start, "real");
    assert!(said(&o).contains("Not logged in"), "{}", said(&o));
    let uuid = record(&w, "real")["uuid"].as_str().unwrap().to_string();
    // Let claude itself name the long directory's conversations (with its hash suffix).
    run(&long, "probe");
    let probe = record(&w, "probe")["uuid"].as_str().unwrap().to_string();
    let dir_of = |u: &str| -> String {
        let t = transcripts(&w);
        let f = t.iter().find(|t| t.ends_with(&format!("/{u}.jsonl")));
        f.unwrap_or_else(|| panic!("{u} not in {t:?}"))
            .split('/')
            .next()
            .unwrap()
            .to_string()
    };
    let long_dir = dir_of(&probe);
    assert!(long_dir.len() > 200, "{long_dir}");
    for cwd in [&long, &r] {
        let o = run(cwd, "real");
        let all = said(&o);
        assert!(!all.contains("No conversation found"), "{all}");
        assert!(all.contains("Not logged in"), "{all}");
        assert_eq!(record(&w, "real")["uuid"], uuid.as_str());
        assert_eq!(transcripts(&w).len(), 2);
        if cwd == &long {
            // Moved exactly where claude keeps that directory's conversations.
            assert_eq!(dir_of(&uuid), long_dir);
        }
    }
}

/// While `--session NAME` runs, claude's own options that pick its conversation
/// (`--resume U`, `-r U`, `--session-id U`, `--continue`, `-c`) are refused, naming the
/// running session; and a session resumed by UUID holds the name against `--session`.
#[test]
fn the_names_lock_holds_whatever_way_the_conversation_is_picked() {
    let w = world();
    let r = repo(&w);
    let (started, release) = (r.join("started"), r.join("release"));
    let uuid = conversation(&ok(&launch(&w, &r, "rev", ""))).1;
    let mut first = spawn(
        &w,
        &r,
        &["--session", "rev"],
        &signal_then_wait(&started, &release),
    );
    wait_for(&started, &mut first);
    let picks: [&[&str]; 6] = [
        &["--resume", &uuid],
        &["-r", &uuid],
        &[&format!("--resume={uuid}")],
        &["--session-id", &uuid],
        &["--continue"],
        &["-c"],
    ];
    for pick in picks {
        let o = w.run_claude(&r, pick.iter().chain(&["-p", "hi"]), "");
        let err = stderr(&o);
        assert!(!o.status.success(), "{pick:?} ran beside the session");
        assert!(!stdout(&o).contains("FAKE-CLAUDE-START"), "{pick:?} ran");
        assert!(err.contains("session `rev` is already running"), "{err}");
        assert!(err.contains(&format!("pid {}", first.id())), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // The picker could choose it too.
    let o = w.run_claude(&r, ["--resume"], "");
    assert!(
        stderr(&o).contains("session `rev` is already running"),
        "{}",
        stderr(&o)
    );
    // A conversation that is no session's is not held back.
    ok(&w.run_claude(&r, ["-p", "hi"], ""));
    fs::write(&release, "").unwrap();
    ok(&first.wait_with_output().unwrap());

    // The other way round: the conversation resumed by its UUID holds the name.
    fs::remove_file(&started).unwrap();
    fs::remove_file(&release).unwrap();
    let mut by_uuid = spawn(
        &w,
        &r,
        &["--resume", &uuid],
        &signal_then_wait(&started, &release),
    );
    wait_for(&started, &mut by_uuid);
    let o = launch(&w, &r, "rev", "");
    assert!(
        !o.status.success(),
        "--session ran beside --resume of its conversation"
    );
    assert!(
        stderr(&o).contains(&format!("pid {}", by_uuid.id())),
        "{}",
        stderr(&o)
    );
    fs::write(&release, "").unwrap();
    ok(&by_uuid.wait_with_output().unwrap());
    ok(&launch(&w, &r, "rev", ""));
}

/// The link a move leaves, and the one it replaces: an agent that plants
/// `<destination dir>/<uuid> -> outside` gets its link removed (never followed), the
/// conversation's directory lands in place, and the old place links to it.
#[test]
fn a_planted_link_where_the_directory_goes_is_replaced_not_followed() {
    let w = world();
    let r = repo(&w);
    let sub = w.dir("repo/sub");
    let outside = w.dir("outside");
    let uuid = conversation(&ok(&launch(&w, &r, "rev", ""))).1;
    let conv = conversations(&w);
    let old = fs::read_dir(&conv).unwrap().next().unwrap().unwrap().path();
    assert!(old.join(&uuid).is_dir(), "the fake claude made no {uuid}/");
    fs::write(old.join(&uuid).join("tool-results/out.txt"), "SAVED").unwrap();
    let enc: String = sub
        .to_str()
        .unwrap()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let plant = format!(
        "mkdir -p \"$HOME/.claude/projects/{enc}\" && ln -s '{}' \"$HOME/.claude/projects/{enc}/{uuid}\"",
        outside.display()
    );
    ok(&w.run_claude(&r, ["--exec", "sh", "-c", &plant], ""));
    ok(&launch(&w, &sub, "rev", ""));
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    let new = conv.join(&enc).join(&uuid);
    assert!(fs::symlink_metadata(&new).unwrap().is_dir());
    let link = fs::read_link(old.join(&uuid)).unwrap();
    assert_eq!(link, Path::new("..").join(&enc).join(&uuid));
    assert_eq!(
        fs::read_to_string(old.join(&uuid).join("tool-results/out.txt")).unwrap(),
        "SAVED"
    );
}
