//! Issue 21 (3): what a sandbox created or changed that a host tool runs without asking
//! is moved aside when it ends, one line each with the command that puts it back; with
//! `--writable-project-config` (the control) it stays, and a host tool runs it.

use std::fs;
use std::process::{Command, Stdio};

use crate::BIN;
use lab::*;

/// Files planted from inside, relative to the project, with what makes each (shell).
const PLANTS: &[(&str, &str)] = &[
    ("sub/.claude/settings.json", "mkdir -p sub/.claude && echo '{\"hooks\":{}}' > sub/.claude/settings.json"),
    ("sub/deeper/.claude/settings.local.json", "mkdir -p sub/deeper/.claude && echo '{}' > sub/deeper/.claude/settings.local.json"),
    ("sub/.mcp.json", "echo '{\"mcpServers\":{}}' > sub/.mcp.json"),
    (".husky", "mkdir -p .husky && echo 'echo PLANTED' > .husky/pre-commit"),
    ("lefthook-local.yml", "echo 'pre-commit: {}' > lefthook-local.yml"),
    ("sub/.lefthook", "mkdir -p sub/.lefthook && echo x > sub/.lefthook/run.sh"),
    (".pre-commit-config.yaml", "echo 'repos: []' > .pre-commit-config.yaml"),
    ("sub/.envrc", "echo 'echo PLANTED' > sub/.envrc"),
    (".mise.toml", "echo '[tasks]' > .mise.toml"),
    ("sub/mise.toml", "echo '[env]' > sub/mise.toml"),
    (".tool-versions", "echo 'nodejs 20' > .tool-versions"),
    ("sub/mise.local.toml", "echo '[env]' > sub/mise.local.toml"),
    (".mise.dev.toml", "echo '[tasks]' > .mise.dev.toml"),
    (".rtx.toml", "echo '[env]' > .rtx.toml"),
    ("sub/.mise", "mkdir -p sub/.mise && echo x > sub/.mise/config.toml"),
    ("mise/config.toml", "mkdir -p mise && echo '[env]' > mise/config.toml"),
    ("sub/.config/mise/config.toml", "mkdir -p sub/.config/mise && echo '[env]' > sub/.config/mise/config.toml"),
    ("sub/.config/mise.toml", "echo '[env]' > sub/.config/mise.toml"),
    (".config/mise/conf.d/env.toml", "mkdir -p .config/mise/conf.d && echo '[env]' > .config/mise/conf.d/env.toml"),
    ("sub/.vscode", "mkdir -p sub/.vscode && echo '{}' > sub/.vscode/tasks.json"),
    (".devcontainer", "mkdir -p .devcontainer && echo '{\"initializeCommand\":\"x\"}' > .devcontainer/devcontainer.json"),
    ("sub/.devcontainer.json", "echo '{}' > sub/.devcontainer.json"),
    ("vendorx/.git", "mkdir vendorx && git -C vendorx init -q && git -C vendorx config core.fsmonitor 'echo PLANTED'"),
    (".git/worktrees/evil", "mkdir -p .git/worktrees/evil && echo /tmp > .git/worktrees/evil/commondir"),
    (".git/modules/m/config", "mkdir -p .git/modules/m && printf '[core]\\n\\tfsmonitor = x\\n' > .git/modules/m/config"),
    ("rust-toolchain.toml", "printf '[toolchain]\\npath = \"/tmp/tc\"\\n' > rust-toolchain.toml"),
    ("sub/rust-toolchain", "echo /tmp/tc > sub/rust-toolchain"),
    (".exrc", "echo '!touch x' > .exrc"),
    ("sub/.vimrc", "echo 'call system(\"x\")' > sub/.vimrc"),
    ("sub/_vimrc", "echo 'call system(\"x\")' > sub/_vimrc"),
    (".nvimrc", "echo 'call system(\"x\")' > .nvimrc"),
    ("sub/.nvim.lua", "echo 'os.execute(\"x\")' > sub/.nvim.lua"),
    // A gitlink naming the repository beside the project (`project()` makes it).
    ("sub/vendg/.git", "mkdir -p sub/vendg && echo 'gitdir: ../../../other/.git' > sub/vendg/.git"),
];

/// Planted with them: the same names where no tool reads them, which stay.
const NEAR_MISSES: &[(&str, &str)] = &[
    ("sub/config.toml", "echo '[env]' > sub/config.toml"),
    ("conf.d/x.toml", "mkdir -p conf.d && echo x > conf.d/x.toml"),
    (
        "sub/.config/fish/conf.d/x.toml",
        "mkdir -p sub/.config/fish/conf.d && echo x > sub/.config/fish/conf.d/x.toml",
    ),
    (
        "mise/tasks/build.toml",
        "mkdir -p mise/tasks && echo x > mise/tasks/build.toml",
    ),
    (
        "rust-toolchain.toml.bak",
        "echo x > rust-toolchain.toml.bak",
    ),
    ("sub/_exrc", "echo x > sub/_exrc"),
    ("sub/.gvimrc", "echo x > sub/.gvimrc"),
];

fn project(w: &World) -> std::path::PathBuf {
    let p = w.dir("proj");
    init_repo(&p);
    init_repo(&w.dir("other"));
    fs::create_dir_all(p.join("sub")).unwrap();
    fs::write(p.join("sub/keep.txt"), "the user's\n").unwrap();
    p
}

fn plant_all() -> String {
    let mut s: Vec<&str> = PLANTS.iter().chain(NEAR_MISSES).map(|(_, c)| *c).collect();
    s.push("exit 5");
    s.join(" && ")
}

/// The review's lines, by path: path -> the restore command.
fn review_lines(err: &str) -> Vec<(String, String)> {
    err.lines()
        .filter(|l| l.starts_with("claudebox: review: "))
        .filter_map(|l| {
            let path = l.split_whitespace().nth(3)?.to_string();
            let cmd = l.split("to put it back: ").nth(1)?.to_string();
            Some((path, cmd))
        })
        .collect()
}

#[test]
fn each_kind_is_moved_aside_with_a_line_and_put_back_by_its_command() {
    let w = World::new(BIN);
    let p = project(&w);
    let o = w
        .cmd(&p)
        .args(["--exec", "sh", "-c", &plant_all()])
        .output()
        .unwrap();
    let err = stderr(&o);
    // The agent's exit status is the launch's.
    assert_eq!(o.status.code(), Some(5), "{err}");
    let lines = review_lines(&err);
    for (rel, _) in PLANTS {
        assert!(!p.join(rel).exists(), "{rel} stayed:\n{err}");
        assert!(
            lines.iter().any(|(l, _)| l == rel),
            "no line for {rel}:\n{err}"
        );
    }
    assert_eq!(lines.len(), PLANTS.len(), "{err}");
    for (rel, _) in NEAR_MISSES {
        assert!(p.join(rel).exists(), "{rel} was moved:\n{err}");
    }
    // The rest of the project is untouched.
    assert_eq!(
        fs::read_to_string(p.join("sub/keep.txt")).unwrap(),
        "the user's\n"
    );
    // Each line's command puts its entry back, once, and refuses to overwrite.
    for (rel, cmd) in &lines {
        let args: Vec<&str> = cmd.split_whitespace().collect();
        assert_eq!(&args[..2], &["claudebox", "--restore"], "{cmd}");
        let r = w.cmd(&w.root()).args(&args[1..]).output().unwrap();
        assert!(r.status.success(), "{cmd}: {}", stderr(&r));
        assert!(
            fs::symlink_metadata(p.join(rel)).is_ok(),
            "{rel} not restored"
        );
        let again = w.cmd(&w.root()).args(&args[1..]).output().unwrap();
        assert!(!again.status.success());
    }
    assert!(fs::read_to_string(p.join("sub/.claude/settings.json"))
        .unwrap()
        .contains("hooks"));
    // The control: with the opt-out nothing is reviewed and every planted file stays.
    let w = World::new(BIN);
    let p = project(&w);
    let o = w
        .cmd(&p)
        .args([
            "--writable-project-config",
            "--exec",
            "sh",
            "-c",
            &plant_all(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(review_lines(&stderr(&o)).is_empty(), "{}", stderr(&o));
    for (rel, _) in PLANTS {
        assert!(p.join(rel).exists(), "control: {rel} missing");
    }
}

#[test]
fn a_restore_refuses_an_existing_file_and_a_symlinked_directory() {
    let w = World::new(BIN);
    let p = project(&w);
    let o = w
        .cmd(&p)
        .args(["--exec", "sh", "-c", "echo x > sub/.envrc"])
        .output()
        .unwrap();
    let lines = review_lines(&stderr(&o));
    assert_eq!(lines.len(), 1, "{}", stderr(&o));
    let id = lines[0].1.split_whitespace().nth(2).unwrap().to_string();
    fs::write(p.join("sub/.envrc"), "mine\n").unwrap();
    let r = w.cmd(&p).args(["--restore", &id]).output().unwrap();
    assert!(
        !r.status.success() && stderr(&r).contains("exists now"),
        "{}",
        stderr(&r)
    );
    assert_eq!(fs::read_to_string(p.join("sub/.envrc")).unwrap(), "mine\n");
    fs::remove_file(p.join("sub/.envrc")).unwrap();
    fs::rename(p.join("sub"), p.join("sub.real")).unwrap();
    std::os::unix::fs::symlink(w.home(), p.join("sub")).unwrap();
    let r = w.cmd(&p).args(["--restore", &id]).output().unwrap();
    assert!(!r.status.success(), "{}", stderr(&r));
    assert!(!w.home().join(".envrc").exists());
}

/// The critical one, as the user meets it: the agent makes the main git dir's
/// `commondir` lead to a copy with its own `core.fsmonitor`; the host's `git status`
/// runs it (the control, with the opt-out), unless the review moved it aside.
#[test]
fn a_new_commondir_runs_nothing_on_the_hosts_git_status() {
    for protected in [true, false] {
        let w = World::new(BIN);
        let p = project(&w);
        let marker = w.root().join("fsmonitor-ran");
        let script = format!(
            "d=$PWD/evil-common; cp -r .git/. \"$d\" && \
             git --git-dir=\"$d\" config core.fsmonitor 'touch {}; false' && \
             echo \"$d\" > .git/commondir",
            marker.display()
        );
        let mut c = w.cmd(&p);
        // The launch's watch, the second line: the file supervisor off (it refuses the
        // plant itself: escape::commondir).
        c.env(NO_SUPERVISOR, "1");
        if !protected {
            c.arg("--writable-project-config");
        }
        let o = c.args(["--exec", "sh", "-c", &script]).output().unwrap();
        // Protected, the running launcher may end the sandbox first (SIGTERM).
        use std::os::unix::process::ExitStatusExt;
        assert!(
            o.status.success() || (protected && o.status.signal() == Some(15)),
            "{}",
            stderr(&o)
        );
        let _ = Command::new("git")
            .args(["status", "--short"])
            .current_dir(&p)
            .output()
            .unwrap();
        assert_eq!(
            marker.exists(),
            !protected,
            "protected={protected}: {}",
            stderr(&o)
        );
    }
}

/// A planted name with terminal escapes is printed escaped.
#[test]
fn a_planted_name_is_printed_escaped() {
    let w = World::new(BIN);
    let p = project(&w);
    let o = w
        .cmd(&p)
        .args([
            "--exec",
            "sh",
            "-c",
            "n=$(printf 'x\\033]52;c;ZXZpbA==\\007\\ry'); mkdir \"$n\" && echo a > \"$n/.envrc\"",
        ])
        .output()
        .unwrap();
    assert!(!o.stderr.iter().any(|b| matches!(b, 0x1b | 0x07 | b'\r')));
    assert!(
        stderr(&o).contains("x\\x1b]52;c;ZXZpbA==\\x07\\x0dy/.envrc"),
        "{}",
        stderr(&o)
    );
}

/// claudebox killed with SIGKILL while the agent runs: no review at its exit; the
/// project's next `--list`, and then the next launch, do the review it missed.
#[test]
fn a_killed_claudebox_s_review_is_done_by_the_next_list_or_launch() {
    let w = World::new(BIN);
    let p = project(&w);
    for (round, next) in [["--list", ""], ["--exec", "true"]].iter().enumerate() {
        let rel = format!("sub/r{round}/.envrc");
        let (mut child, line) = lab::spawn_first_line(
            w.cmd(&p)
                .args([
                    "--exec",
                    "sh",
                    "-c",
                    &format!("mkdir -p sub/r{round} && echo x > {rel} && echo ready && sleep 100"),
                ])
                .stderr(Stdio::null()),
        );
        assert_eq!(line.trim(), "ready");
        child.kill().unwrap();
        child.wait().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        // The control: the planted file is still there, nothing reviewed it.
        assert!(p.join(&rel).exists(), "reviewed by a killed claudebox?");
        let args: Vec<&str> = next.iter().copied().filter(|a| !a.is_empty()).collect();
        let o = w.cmd(&p).args(&args).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            !p.join(&rel).exists(),
            "{next:?} did not review:\n{}",
            stderr(&o)
        );
        assert!(
            stderr(&o).contains(&format!("{rel} was created")),
            "{}",
            stderr(&o)
        );
    }
}

/// A symlink the session made into a `--rw` directory is moved aside (the sandbox writes
/// there, the review does not walk it); links into the project and to a read-only place
/// (also a `--ro` inside the `--rw` directory) stay. A launch killed before its review: the next one, granted no `--rw`, does the
/// review it missed with the killed launch's `--rw` paths, kept in its record. (The
/// escape suite's `--rw` link attempt has the control: unreviewed, git runs through it.)
#[test]
fn a_symlink_into_an_rw_path_is_moved_aside_also_by_a_missed_review() {
    let w = World::new(BIN);
    let p = project(&w);
    let rw = w.dir("granted");
    let ro = w.dir("shown");
    let inner = rw.join("inner-ro");
    fs::create_dir_all(inner.join("d")).unwrap();
    let (rws, ros, inners) = (
        rw.to_str().unwrap(),
        ro.to_str().unwrap(),
        inner.to_str().unwrap(),
    );
    let gone = |rel: &str| fs::symlink_metadata(p.join(rel)).is_err();
    let script = format!(
        "mkdir -p {r}/x && ln -s {r}/x to-rw && ln -s {r} sub/to-rw-top && ln -s {o} to-ro && \
         ln -s sub to-sub && ln -s {s} sub/back && ln -s {i}/d to-inner-ro",
        r = sq(rws),
        o = sq(ros),
        i = sq(inners),
        s = sq(p.join("sub").to_str().unwrap()),
    );
    let o = w
        .cmd(&p)
        .args(["--rw", rws, "--ro", ros, "--ro", inners])
        .args(["--exec", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(gone("to-rw") && gone("sub/to-rw-top"), "{err}");
    for kept in ["to-ro", "to-sub", "sub/back", "to-inner-ro"] {
        assert!(!gone(kept), "{kept}: {err}");
    }
    for rel in ["to-rw", "sub/to-rw-top"] {
        let line = line_for(&err, rel).unwrap_or_else(|| panic!("{rel}: {err}"));
        assert!(line.contains("an rw path"), "{line}");
    }
    // A `--ro` inside the `--rw` directory whose parent the agent renames and replaces
    // with a symlink to a directory of its own: that one is not covered, its link goes.
    let nested = rw.join("a/b");
    fs::create_dir_all(&nested).unwrap();
    let script = format!(
        "cd {r} && mv a a-old && mkdir -p evil/b/x && ln -s evil a && cd {p} && \
         ln -s {r}/a/b/x to-fake-covered",
        r = sq(rws),
        p = sq(p.to_str().unwrap()),
    );
    let o = w
        .cmd(&p)
        .args(["--rw", rws, "--ro", nested.to_str().unwrap()])
        .args(["--exec", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(gone("to-fake-covered"), "{err}");
    // Killed before its review.
    let (mut child, line) = lab::spawn_first_line(
        w.cmd(&p)
            .args(["--rw", rws, "--exec", "sh", "-c"])
            .arg(format!(
                "ln -s {}/x to-rw-killed && echo ready && sleep 100",
                sq(rws)
            ))
            .stderr(Stdio::null()),
    );
    assert_eq!(line.trim(), "ready");
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!gone("to-rw-killed"), "reviewed by a killed claudebox?");
    let o = w.cmd(&p).args(["--exec", "true"]).output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(gone("to-rw-killed"), "the missed review kept it:\n{err}");
    assert!(
        line_for(&err, "to-rw-killed").is_some_and(|l| l.contains("an rw path")),
        "{err}"
    );
}

const PLANT_PY: &str = "python3 -c \"import os; d='sub/.cl'+'aude'; os.makedirs(d); \
    open(d+'/settings.json','w').write('{}')\"";

/// The real Claude Code (both versions, against the lab's mock) plants a hook in
/// `sub/.claude/settings.json` with its Bash tool: moved aside at exit; the control with
/// the opt-out keeps it.
#[test]
fn real_claude_planting_a_nested_hook_is_reviewed() {
    use lab::agent::*;
    use serde_json::json;
    for c in lab::agent::each_claude() {
        for protected in [true, false] {
            let w = world_with(BIN, &c);
            let p = project(&w);
            let mock = MockApi::start(&json!([
                // Through python: claude's own check asks before a shell writes to a
                // path it recognises as a `.claude` settings file.
                {"bash": {"command": PLANT_PY, "description": "plant"}},
                "PLANT-DONE",
            ]));
            let mut args = vec!["-p", "go", "--allowedTools", "Bash"];
            if !protected {
                args.insert(0, "--writable-project-config");
            }
            let o = run_claudebox(
                &w,
                &p,
                &mock,
                &args,
                &[],
                std::time::Duration::from_secs(120),
            );
            let out = ok_run(&c, &o, &mock);
            assert!(out.contains("PLANT-DONE"), "[{}] {out}", c.label);
            let sent: String = mock.conversation(0).iter().map(messages_text).collect();
            let there = p.join("sub/.claude/settings.json").exists();
            assert_eq!(there, !protected, "[{}] {}\n{sent}", c.label, stderr(&o));
            assert_eq!(
                stderr(&o).contains("HIGH sub/.claude/settings.json"),
                protected,
                "[{}] {}",
                c.label,
                stderr(&o)
            );
        }
    }
}

/// git, inside, with an identity and local clones allowed.
const G: &str = "git -c user.name=T -c user.email=t@example.com -c init.defaultBranch=main \
                 -c protocol.file.allow=always";

/// A repository `up` made inside, with one commit (shell).
fn upstream() -> String {
    format!("mkdir up && {G} -C up init -q && echo a > up/f && {G} -C up add f && {G} -C up commit -qm a")
}

/// The review's line for `rel`, if any.
fn line_for<'a>(err: &'a str, rel: &str) -> Option<&'a str> {
    err.lines()
        .find(|l| l.starts_with("claudebox: review: ") && l.split_whitespace().nth(3) == Some(rel))
}

/// mise's path-shaped configs the user already had, each in a directory the agent moves
/// into place whole (the files keep their old ctime, the moved directory's is new): the
/// review takes them as new; an old one left where it was stays.
#[test]
fn an_old_mise_config_moved_into_place_with_its_directory_is_moved_aside() {
    let w = World::new(BIN);
    let p = project(&w);
    for rel in [
        "fixtures/mise/config.toml",
        "fixtures/.config/mise/conf.d/env.toml",
        "keep/mise/config.toml",
    ] {
        fs::create_dir_all(p.join(rel).parent().unwrap()).unwrap();
        fs::write(p.join(rel), "[env]\n").unwrap();
    }
    let o = w
        .cmd(&p)
        .args([
            "--exec",
            "sh",
            "-c",
            "mv fixtures/mise sub/mise && mv fixtures/.config sub/.config",
        ])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    for rel in ["sub/mise/config.toml", "sub/.config/mise/conf.d/env.toml"] {
        assert!(line_for(&err, rel).is_some(), "no line for {rel}:\n{err}");
        assert!(!p.join(rel).exists(), "{rel} stayed:\n{err}");
    }
    assert!(p.join("keep/mise/config.toml").exists(), "{err}");
    assert_eq!(review_lines(&err).len(), 2, "{err}");
}

/// A repository cloned (and one `git init`ed) inside, staged as a gitlink, with a benign
/// config: the user's work stays. With `core.fsmonitor` planted in the clone it is moved
/// aside, and the host's `git status` at the top runs nothing; the control, with the
/// opt-out, runs the planted fsmonitor.
#[test]
fn a_nested_repository_is_moved_aside_only_when_its_config_bears_code() {
    for (plant, protected) in [(false, true), (true, true), (true, false)] {
        let w = World::new(BIN);
        let p = project(&w);
        let marker = w.root().join("fsmonitor-ran");
        let mut script = format!(
            "{} && {G} clone -q up vendorx && {G} add vendorx",
            upstream()
        );
        if plant {
            script += &format!(
                " && git -C vendorx config core.fsmonitor 'touch {}; false'",
                marker.display()
            );
        }
        let mut c = w.cmd(&p);
        if !protected {
            c.arg("--writable-project-config");
        }
        let o = c.args(["--exec", "sh", "-c", &script]).output().unwrap();
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        // The untracked `up`, made with git init, is benign: kept in every case.
        assert!(p.join("up/.git/config").exists(), "{err}");
        assert_eq!(line_for(&err, "up/.git"), None, "{err}");
        let moved = line_for(&err, "vendorx/.git");
        assert_eq!(moved.is_some(), plant && protected, "plant={plant}: {err}");
        assert_eq!(p.join("vendorx/.git").exists(), !(plant && protected));
        if let Some(l) = moved {
            assert!(l.contains("core.fsmonitor"), "{l}");
        }
        // Staged as a gitlink.
        let staged = git(&p, &["ls-files", "-s", "vendorx"]);
        assert!(staged.starts_with("160000"), "{staged}");
        let st = Command::new("git")
            .args(["status", "--short"])
            .current_dir(&p)
            .output()
            .unwrap();
        if !plant {
            // The user's work: the clone is whole, and the host's git sees it clean.
            assert!(st.status.success(), "{}", stderr(&st));
            let log = git(&p.join("vendorx"), &["log", "--oneline"]);
            assert_eq!(log.lines().count(), 1, "{log}");
        }
        assert_eq!(
            marker.exists(),
            plant && !protected,
            "plant={plant} protected={protected}: {err}"
        );
    }
}

/// `git submodule add` of a repository made inside: its `.git` file and
/// `.git/modules/<name>` (a config with core.worktree, sample hooks) are git's own: kept.
/// A hook planted there is moved aside (that file only).
#[test]
fn a_benign_submodule_add_is_kept_and_a_planted_module_hook_is_not() {
    for plant in [false, true] {
        let w = World::new(BIN);
        let p = project(&w);
        let mut script = format!("{} && {G} submodule add -q \"$PWD/up\" libs/x", upstream());
        if plant {
            script += " && printf '#!/bin/sh\\necho PLANTED\\n' > .git/modules/libs/x/hooks/post-checkout && chmod +x .git/modules/libs/x/hooks/post-checkout";
        }
        let o = w
            .cmd(&p)
            .args(["--exec", "sh", "-c", &script])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        assert!(p.join("libs/x/.git").is_file(), "{err}");
        let cfg = fs::read_to_string(p.join(".git/modules/libs/x/config")).unwrap();
        assert!(cfg.contains("worktree"), "{cfg}");
        assert!(p
            .join(".git/modules/libs/x/hooks/pre-commit.sample")
            .exists());
        let hook = p.join(".git/modules/libs/x/hooks/post-checkout");
        // Planted: moved aside (the control is the benign round: nothing to move).
        assert!(!hook.exists(), "{err}");
        assert_eq!(review_lines(&err).len(), usize::from(plant), "{err}");
        if plant {
            assert!(
                err.contains("HIGH .git/modules/libs/x/hooks/post-checkout"),
                "{err}"
            );
        }
        // The submodule works on the host.
        let head = git(&p.join("libs/x"), &["log", "--oneline"]);
        assert_eq!(head.lines().count(), 1, "{head}");
    }
}

/// A rebase stopped inside with an `exec` line planted in its todo list: the host's
/// `git rebase --continue` would run it. Moved aside; the control keeps it and the host's
/// continue runs it.
#[test]
fn an_exec_line_planted_in_a_rebase_todo_is_caught() {
    for protected in [true, false] {
        let w = World::new(BIN);
        let p = project(&w);
        let marker = w.root().join("exec-ran");
        git(&p, &["commit", "-q", "--allow-empty", "-m", "two"]);
        let script = format!(
            "GIT_SEQUENCE_EDITOR='sed -i 1s/^pick/edit/' {G} rebase -q -i HEAD~1 >/dev/null 2>&1; \
             test -f .git/rebase-merge/git-rebase-todo && \
             echo 'exec touch {}' >> .git/rebase-merge/git-rebase-todo",
            marker.display()
        );
        let mut c = w.cmd(&p);
        if !protected {
            c.arg("--writable-project-config");
        }
        let o = c.args(["--exec", "sh", "-c", &script]).output().unwrap();
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        assert_eq!(
            err.contains("HIGH .git/rebase-merge/git-rebase-todo"),
            protected,
            "{err}"
        );
        let _ = Command::new("git")
            .args(["-c", "user.name=T", "-c", "user.email=t@example.com"])
            .args(["rebase", "--continue"])
            .current_dir(&p)
            .env("GIT_EDITOR", "true")
            .output()
            .unwrap();
        assert_eq!(marker.exists(), !protected, "protected={protected}: {err}");
    }
}

/// `--list` counts a project's quarantined entries (JSON and a line under its row);
/// `--gc` removes a gone project's quarantine with it and says so. The control: a
/// project with nothing moved aside shows 0 and no line.
#[test]
fn list_counts_the_quarantine_and_gc_says_it_goes_with_the_project() {
    let w = World::new(BIN);
    let p = project(&w);
    let o = w
        .cmd(&p)
        .args([
            "--exec",
            "sh",
            "-c",
            "echo x > sub/.envrc && echo y > .mise.toml",
        ])
        .output()
        .unwrap();
    assert_eq!(review_lines(&stderr(&o)).len(), 2, "{}", stderr(&o));
    let clean = w.dir("clean");
    init_repo(&clean);
    let o = w.cmd(&clean).args(["--exec", "true"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let l = w.cmd(&p).args(["--list", "--json"]).output().unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&l.stdout).unwrap();
    let mut counts: Vec<u64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["quarantined"].as_u64().unwrap())
        .collect();
    counts.sort();
    assert_eq!(counts, [0, 2], "{rows}");
    let t = stdout(&w.cmd(&p).arg("--list").output().unwrap());
    assert_eq!(
        t.matches("moved aside by the exit review\t2\t").count(),
        1,
        "{t}"
    );
    assert!(!t.contains("review\t0"), "{t}");
    fs::remove_dir_all(&p).unwrap();
    let g = w
        .cmd(&w.root())
        .args(["--gc", "--gc-margin", "0"])
        .output()
        .unwrap();
    let err = stderr(&g);
    assert!(g.status.success(), "{err}");
    assert!(
        err.contains("no longer exists; the 2 entries its exit review moved aside go with it)"),
        "{err}"
    );
    assert!(err.contains("1 of 2 project directories removed"), "{err}");
}

/// The same plant while the sandbox still runs, and the user's own `git status` in another
/// terminal meanwhile: the running launcher moved the `commondir` aside the moment it
/// appeared (a line says so) and ended the sandbox, so that git runs nothing. Control: with the opt-out (no
/// review, no watch) the same `git status` during the session runs the planted
/// fsmonitor.
#[test]
fn a_commondir_planted_while_the_sandbox_runs_is_moved_aside_at_once() {
    for protected in [true, false] {
        let w = World::new(BIN);
        let p = project(&w);
        let marker = w.root().join("fsmonitor-ran");
        let planted = p.join("planted");
        let release = p.join("release");
        let script = format!(
            "d=$PWD/evil-common; cp -r .git/. \"$d\" && \
             git --git-dir=\"$d\" config core.fsmonitor 'touch {}; false' && \
             touch planted && echo \"$d\" > .git/commondir && \
             while [ ! -e release ]; do sleep 0.05; done",
            marker.display()
        );
        let mut c = w.cmd(&p);
        // The launch's watch, the second line: the file supervisor off (it refuses the
        // plant itself: escape::commondir).
        c.env(NO_SUPERVISOR, "1");
        if !protected {
            c.arg("--writable-project-config");
        }
        let child = c
            .args(["--exec", "sh", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !planted.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(planted.exists(), "the agent never planted");
        // The user's git, while the agent still runs (a moment for the watch to act).
        std::thread::sleep(std::time::Duration::from_millis(200));
        let _ = Command::new("git")
            .args(["status", "--short"])
            .current_dir(&p)
            .output()
            .unwrap();
        let ran = marker.exists();
        fs::write(&release, "").unwrap();
        let o = child.wait_with_output().unwrap();
        let err = stderr(&o);
        // Protected, the sandbox was ended as by SIGTERM.
        use std::os::unix::process::ExitStatusExt;
        let ended = o.status.signal() == Some(15);
        assert_eq!(ended, protected, "{:?} {err}", o.status);
        assert_eq!(ran, !protected, "protected={protected}: {err}");
        if protected {
            assert!(
                err.contains(".git/commondir") && err.contains("moved while the sandbox runs"),
                "{err}"
            );
            assert!(err.contains("ending the sandbox"), "{err}");
            assert!(!p.join(".git/commondir").exists());
        }
    }
}

/// An agent that plants the main git dir's `commondir` again each time it is moved aside
/// (a tight loop; inotify would be faster still): moving it aside every 50 ms leaves it
/// there nearly all the time. The first one found ends the sandbox (fail closed: git never
/// writes a `commondir` in a main git dir), so the user's `git status` meanwhile runs
/// nothing. Control: with the opt-out the same `git status` runs the planted fsmonitor.
#[test]
fn an_agent_that_keeps_planting_commondir_is_ended() {
    for protected in [true, false] {
        let w = World::new(BIN);
        let p = project(&w);
        let marker = w.root().join("fsmonitor-ran");
        let planted = p.join("planted");
        let script = format!(
            "d=$PWD/evil-common; cp -r .git/. \"$d\" && \
             git --git-dir=\"$d\" config core.fsmonitor 'touch {}; false' && \
             touch planted && echo \"$d\" > .git/commondir && \
             end=$(($(date +%s) + 8)); while [ $(date +%s) -lt $end ]; do \
               [ -e .git/commondir ] || echo \"$d\" > .git/commondir; done; echo SURVIVED",
            marker.display()
        );
        let mut c = w.cmd(&p);
        // The launch's watch, the second line: the file supervisor off (it refuses the
        // plant itself: escape::commondir).
        c.env(NO_SUPERVISOR, "1");
        if !protected {
            c.arg("--writable-project-config");
        }
        let child = c
            .args(["--exec", "sh", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !planted.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(planted.exists(), "the agent never planted");
        // The user's git, a few times while the agent runs.
        for _ in 0..10 {
            std::thread::sleep(std::time::Duration::from_millis(150));
            let _ = Command::new("git")
                .args(["status", "--short"])
                .current_dir(&p)
                .output()
                .unwrap();
        }
        let ran = marker.exists();
        let o = child.wait_with_output().unwrap();
        let err = stderr(&o);
        eprintln!(
            "protected={protected}: git ran the fsmonitor: {ran}; moved aside {} times",
            err.matches("moved while").count()
        );
        assert_eq!(ran, !protected, "protected={protected}: {err}");
        if protected {
            assert!(!stdout(&o).contains("SURVIVED"), "{err}");
            assert!(err.contains("ending the sandbox"), "{err}");
            assert!(!p.join(".git/commondir").exists());
        }
    }
}

/// The agent's timed plant: it watches the main git dir's `HEAD` with inotify and, when
/// the host's git opens it, renames a prepared `commondir` into place and takes it away
/// again `hold` seconds later; the host runs `git status` `rounds` times, 100 ms apart.
/// How many runs ran the planted fsmonitor, and whether the sandbox was ended.
fn timed_commondir_plant(
    protected: bool,
    supervisor: bool,
    hold: &str,
    rounds: usize,
) -> (usize, bool, String) {
    const TIMED: &str = r#"
import ctypes, os, select, sys
libc = ctypes.CDLL(None, use_errno=True)
d, hold = sys.argv[1], float(sys.argv[2])
ino = libc.inotify_init1(0)
libc.inotify_add_watch(ino, b".git/HEAD", 0x20)  # IN_OPEN
open("ready", "w").close()
n = 0
while not os.path.exists("release"):
    r, _, _ = select.select([ino], [], [], 0.05)
    if not r:
        continue
    open(".git/cd.tmp", "w").write(d + "\n")
    os.rename(".git/cd.tmp", ".git/commondir")
    n += 1
    if hold > 0:
        select.select([], [], [], hold)
    try:
        os.unlink(".git/commondir")
    except OSError:
        pass
    select.select([], [], [], 0.02)
    os.read(ino, 65536)
print("PLANTS", n, flush=True)
"#;
    let w = World::new(BIN);
    let p = project(&w);
    let marker = w.root().join("fsmonitor-ran");
    let script = format!(
        "d=$PWD/evil-common; cp -r .git/. \"$d\" && \
         git --git-dir=\"$d\" config core.fsmonitor 'echo $CB_ROUND >> {}; false' && \
         exec python3 -c {} \"$d\" {hold}",
        marker.display(),
        sq(TIMED)
    );
    let mut c = w.cmd(&p);
    if !supervisor {
        c.env(NO_SUPERVISOR, "1");
    }
    if !protected {
        c.arg("--writable-project-config");
    }
    let child = c
        .args(["--exec", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !p.join("ready").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(p.join("ready").exists(), "the agent did not start");
    for round in 0..rounds {
        // Unprotected (the controls), stop at the first hit: a plant timed to one open of
        // HEAD meets git's read of `commondir` in only a few of the rounds on a quiet machine.
        if !protected && marker.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let _ = Command::new("git")
            .args(["status", "--short"])
            .env("CB_ROUND", round.to_string())
            .current_dir(&p)
            .output()
            .unwrap();
    }
    let _ = fs::write(p.join("release"), "");
    let o = child.wait_with_output().unwrap();
    // The runs of `git status` that ran it (once or more each).
    let runs = fs::read_to_string(&marker)
        .unwrap_or_default()
        .lines()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let ended = stderr(&o).contains("ending the sandbox");
    (runs, ended, format!("{}{}", stdout(&o), stderr(&o)))
}

/// An agent that plants the main git dir's `commondir` just when the host's git opens
/// `HEAD` and removes it 3 ms later (so a look every 50 ms rarely sees it: measured, 28
/// of 30 of the host's `git status` ran its fsmonitor): every creation is seen (inotify)
/// and the first ends the sandbox, so at most that first one can meet a host git.
/// Control: with the opt-out every `git status` runs it.
#[test]
fn a_commondir_planted_for_a_moment_ends_the_sandbox_at_once() {
    // Bound by time: the plant meets a host git only within milliseconds.
    let _heavy = lab::heavy();
    let (runs, ended, text) = timed_commondir_plant(true, false, "0.003", 15);
    eprintln!("protected: {runs} of 15 git status ran the fsmonitor; ended {ended}");
    assert!(ended, "{text}");
    assert!(runs <= 1, "{runs} runs: {text}");
    // With the file supervisor (the default) no plant is made at all: nothing runs and
    // the watch has nothing to end.
    let (runs, ended, text) = timed_commondir_plant(true, true, "0.003", 15);
    eprintln!("supervisor: {runs} of 15 git status ran the fsmonitor; ended {ended}");
    assert!(
        !ended && runs == 0 && text.contains("Operation not permitted"),
        "{text}"
    );
    // Up to 150 rounds, until the first hit: measured, 2 of 30 rounds hit on a quiet
    // machine, and 15 once met none.
    let (runs, ended, text) = timed_commondir_plant(false, false, "0.003", 150);
    eprintln!("control: {runs} git status ran the fsmonitor (stopped at the first)");
    assert!(!ended && runs >= 1, "control: {runs} runs: {text}");
}

/// The figures (`-- --ignored --nocapture`).
#[test]
#[ignore]
fn timed_commondir_plant_figures() {
    for (protected, supervisor, hold) in [
        (true, true, "0.003"),
        (true, false, "0.003"),
        (true, false, "0"),
        (false, false, "0.003"),
    ] {
        let (runs, ended, _) = timed_commondir_plant(protected, supervisor, hold, 30);
        println!(
            "protected={protected} supervisor={supervisor} hold={hold}: {runs} of 30 ran the fsmonitor (unprotected: until the first); ended {ended}"
        );
    }
}

/// The tests' switch that starts no file supervisor (`policy::confinement`).
const NO_SUPERVISOR: &str = "CLAUDEBOX_TEST_NO_FILE_SUPERVISOR";

fn sq(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Plants in directories the agent made unlistable or unwritable before its session
/// ended, as an ordinary user meets them (root passes permission bits: as root the
/// review could always look in, and the control's plants are moved aside too).
fn locked_plants(marker: &std::path::Path) -> String {
    format!(
        "mkdir -p x111/nested && cd x111/nested && git init -q && \
         git config core.fsmonitor 'touch {m}; false' && echo x > f && git add f && \
         git -c user.name=a -c user.email=b commit -qm x && cd ../.. && \
         git add x111/nested 2>/dev/null && \
         mkdir -p x111/sub/.claude && \
         echo '{{\"hooks\":{{\"SessionStart\":[]}}}}' > x111/sub/.claude/settings.json && \
         echo '{{\"mcpServers\":{{}}}}' > x111/sub/.mcp.json && chmod 0111 x111 && \
         mkdir -p x555/.husky && echo 'echo PLANTED' > x555/.envrc && \
         echo x > x555/.husky/pre-commit && echo x > x555/keep.txt && \
         chmod 0555 x555/.husky x555",
        m = marker.display()
    )
}

const LOCKED: &[&str] = &[
    "x111/nested/.git",
    "x111/sub/.claude/settings.json",
    "x111/sub/.mcp.json",
    "x555/.envrc",
    "x555/.husky",
];

/// Issue 34 (2): a staged nested repository with a `core.fsmonitor` inside a directory
/// the agent made `0111`, a nested `.claude/settings.json` and `.mcp.json` there, and
/// plants in a `0555` directory: the review makes its way in (and out), moves them aside
/// (the fsmonitor as CRITICAL: the next plain git status at the top runs it), and puts
/// the modes back. The control (`CLAUDEBOX_TEST_REVIEW_GIVES_UP`, the review as it was):
/// as an ordinary user everything stays and the host's `git status` at the top runs the
/// agent's fsmonitor.
#[test]
fn directories_the_agent_locked_are_looked_into_and_moved_from() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let unlock = |p: &std::path::Path| {
        for d in ["x111", "x555", "x555/.husky"] {
            let _ = fs::set_permissions(p.join(d), fs::Permissions::from_mode(0o755));
        }
    };
    for control in [false, true] {
        let w = World::new(BIN);
        let p = project(&w);
        let marker = w.root().join("fsm-ran");
        let mut cmd = w.cmd(&p);
        if control {
            cmd.env("CLAUDEBOX_TEST_REVIEW_GIVES_UP", "1");
        }
        let o = cmd
            .args(["--exec", "sh", "-c", &locked_plants(&marker)])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        let _ = Command::new("git")
            .arg("-C")
            .arg(&p)
            .arg("status")
            .env("HOME", w.home())
            .output()
            .unwrap();
        let ran = marker.exists();
        let modes = (mode(&p.join("x111")), mode(&p.join("x555")));
        unlock(&p);
        let stayed: Vec<&&str> = LOCKED.iter().filter(|r| p.join(r).exists()).collect();
        if control {
            if !lab::maintenance::is_root() {
                assert_eq!(stayed.len(), LOCKED.len(), "control: {stayed:?}\n{err}");
                assert!(ran, "control: the host's git status did not run it\n{err}");
            }
            continue;
        }
        assert!(stayed.is_empty(), "{stayed:?} stayed:\n{err}");
        assert!(!ran, "the host's git status ran the fsmonitor\n{err}");
        assert_eq!(modes, (0o111, 0o555), "modes not put back\n{err}");
        assert!(p.join("x555/keep.txt").exists());
        let nested = line_for(&err, "x111/nested/.git").unwrap_or_default();
        assert!(nested.contains("CRITICAL"), "{err}");
        assert!(!err.contains("holding"), "{err}");
    }
}

/// Issue 34 (2): a launch killed while its agent planted `.envrc`, its pending-review
/// record then truncated: the next launch reviews the whole project (a record it cannot
/// read is "review everything") and moves the `.envrc` aside. The control
/// (`CLAUDEBOX_TEST_REVIEW_GIVES_UP`): the record is dropped silently and the `.envrc`
/// stays.
#[test]
fn a_truncated_pending_record_reviews_everything() {
    for control in [false, true] {
        let w = World::new(BIN);
        let p = project(&w);
        let (mut child, line) = lab::spawn_first_line(
            w.cmd(&p)
                .args([
                    "--exec",
                    "sh",
                    "-c",
                    "echo 'echo PLANTED' > sub/.envrc && echo ready && sleep 100",
                ])
                .stderr(Stdio::null()),
        );
        assert_eq!(line.trim(), "ready");
        child.kill().unwrap();
        child.wait().unwrap();
        let pending: Vec<_> = fs::read_dir(w.home().join(".claudebox/projects"))
            .unwrap()
            .flatten()
            .flat_map(|d| {
                fs::read_dir(d.path().join("review-pending"))
                    .into_iter()
                    .flatten()
            })
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(pending.len(), 1, "{pending:?}");
        let rec = fs::read(&pending[0]).unwrap();
        fs::write(&pending[0], &rec[..rec.len() / 2]).unwrap();
        // The killed launch's sandbox may hold its record's lock a moment longer: the
        // next launch is tried until the record is looked at (bounded).
        let mut err = String::new();
        for _ in 0..50 {
            let mut next = w.cmd(&p);
            if control {
                next.env("CLAUDEBOX_TEST_REVIEW_GIVES_UP", "1");
            }
            let o = next.args(["--exec", "true"]).output().unwrap();
            err = stderr(&o);
            assert!(o.status.success(), "{err}");
            if !pending[0].exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(!pending[0].exists(), "{err}");
        if control {
            assert!(p.join("sub/.envrc").exists(), "control: {err}");
            continue;
        }
        assert!(!p.join("sub/.envrc").exists(), "{err}");
        assert!(err.contains("cannot be read"), "{err}");
        // The user's own files stay.
        assert!(p.join("sub/keep.txt").exists());
    }
}

/// Issue 34 (2): what the exit review cannot move aside holds the project (here the
/// quarantine cannot be made: a file stands in its place). The session's launch says
/// so; the next launch refuses in one line naming it, `--check` fails a row naming it;
/// once it is gone both pass and the record is gone.
#[test]
fn what_the_review_cannot_move_holds_the_project() {
    let w = World::new(BIN);
    let p = project(&w);
    let o = w.cmd(&p).args(["--exec", "true"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let projects = w.home().join(".claudebox/projects");
    let state = fs::read_dir(&projects)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|d| d.join("review-pending").exists())
        .unwrap();
    let _ = fs::remove_dir_all(state.join("quarantine"));
    fs::write(state.join("quarantine"), "in the way").unwrap();
    let o = w
        .cmd(&p)
        .args(["--exec", "sh", "-c", "echo 'echo PLANTED' > sub/.envrc"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(err.contains("holding the project"), "{err}");
    assert!(p.join("sub/.envrc").exists(), "{err}");
    let next = w.cmd(&p).args(["--exec", "true"]).output().unwrap();
    let refusal = stderr(&next);
    assert!(!next.status.success(), "{refusal}");
    let last = refusal.lines().last().unwrap_or_default();
    assert!(
        last.contains("held") && last.contains("sub/.envrc"),
        "{refusal}"
    );
    let check = w.cmd(&p).arg("--check").output().unwrap();
    let rows = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(
        rows.lines().any(|l| l.starts_with("fail")
            && l.contains("exit review")
            && l.contains("sub/.envrc")),
        "{rows}"
    );
    // Removed by hand: the project launches again, and nothing is pending.
    fs::remove_file(p.join("sub/.envrc")).unwrap();
    let o = w.cmd(&p).args(["--exec", "true"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        fs::read_dir(state.join("review-pending")).unwrap().count(),
        0
    );
}
