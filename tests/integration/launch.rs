//! The launcher with real bwrap and a fake claude reporting from inside.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BIN;
use lab::*;

fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.push((p.clone(), Vec::new()));
                stack.push(p);
            } else {
                out.push((p.clone(), fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn two_projects_do_not_see_each_others_conversations_and_host_projects_untouched() {
    let w = World::new(BIN);
    let host_projects = w.home().join(".claude/projects/-host-proj");
    fs::create_dir_all(&host_projects).unwrap();
    fs::write(host_projects.join("host-session.jsonl"), "{\"host\":1}\n").unwrap();
    let before = snapshot(&w.home().join(".claude/projects"));

    let a = w.dir("a");
    let b = w.dir("b");
    ok(&w.run_script(
        &a,
        "mkdir -p ~/.claude/projects/enc-a && echo secret-a > ~/.claude/projects/enc-a/s.jsonl",
    ));
    let out = ok(&w.run_script(&b, "find ~/.claude/projects -type f; echo END"));
    assert!(
        !out.contains("s.jsonl"),
        "project b sees a's conversation:\n{out}"
    );
    assert!(
        !out.contains("host-session"),
        "project b sees the host's conversations:\n{out}"
    );
    let again = ok(&w.run_script(&a, "cat ~/.claude/projects/enc-a/s.jsonl"));
    assert!(
        again.contains("secret-a"),
        "a lost its own conversation:\n{again}"
    );
    assert_eq!(
        before,
        snapshot(&w.home().join(".claude/projects")),
        "host ~/.claude/projects changed"
    );
}

#[test]
fn a_worktree_shares_conversations_with_its_main_checkout() {
    let w = World::new(BIN);
    let repo = w.work().join("repo");
    init_repo(&repo);
    git(&repo, &["worktree", "add", "-q", "../wt", "-b", "wt"]);
    let wt = w.work().join("wt");
    ok(&w.run_script(
        &repo,
        "mkdir -p ~/.claude/projects/x && echo shared > ~/.claude/projects/x/t.jsonl",
    ));
    let out = ok(&w.run_script(&wt, "cat ~/.claude/projects/x/t.jsonl; git status --short >/dev/null && echo GIT-OK; touch .git-probe && echo WT-WRITABLE"));
    assert!(out.contains("shared"), "{out}");
    assert!(
        out.contains("GIT-OK"),
        "git does not work in the linked worktree:\n{out}"
    );
    assert!(out.contains("WT-WRITABLE"), "{out}");
}

#[test]
fn skills_plugins_settings_and_credentials_are_visible_and_writes_stay_with_the_project() {
    let w = World::new(BIN);
    let c = w.home().join(".claude");
    fs::create_dir_all(c.join("skills/my-skill")).unwrap();
    fs::write(c.join("skills/my-skill/SKILL.md"), "skill-body").unwrap();
    fs::create_dir_all(c.join("plugins/p1")).unwrap();
    fs::write(c.join("plugins/p1/plugin.json"), "plugin-body").unwrap();
    fs::write(c.join("settings.json"), "{\"s\":1}").unwrap();
    fs::write(c.join(".credentials.json"), "cred-body").unwrap();
    let p = w.dir("p");
    let out = ok(&w.run_claude(&p, ["--no-login-broker"], "cat ~/.claude/skills/my-skill/SKILL.md ~/.claude/plugins/p1/plugin.json ~/.claude/settings.json ~/.claude/.credentials.json; echo; \
         echo new > ~/.claude/new-file && echo NEW-OK; echo x >> ~/.claude/settings.json && echo SETTINGS-COPY; \
         echo refreshed > ~/.claude/.credentials.json && echo CRED-OK",
    ));
    for s in [
        "skill-body",
        "plugin-body",
        "{\"s\":1}",
        "cred-body",
        "NEW-OK",
        "SETTINGS-COPY",
        "CRED-OK",
    ] {
        assert!(out.contains(s), "missing {s}:\n{out}");
    }
    // What claude writes stays with the project; the setup is unchanged; the login is shared.
    assert!(!c.join("new-file").exists());
    let id = env_in_dry_run(&dry_run(&w, &p), "CLAUDEBOX_PROJECT_ID").unwrap();
    let mine = w
        .state()
        .join("projects")
        .join(&id)
        .join("claude-config/new-file");
    assert_eq!(fs::read_to_string(mine).unwrap(), "new\n");
    assert_eq!(
        fs::read_to_string(c.join("settings.json")).unwrap(),
        "{\"s\":1}"
    );
    assert_eq!(
        fs::read_to_string(c.join(".credentials.json")).unwrap(),
        "refreshed\n"
    );
}

#[test]
fn history_is_per_project_and_the_host_history_untouched() {
    let w = World::new(BIN);
    fs::write(w.home().join(".claude/history.jsonl"), "host-history\n").unwrap();
    let a = w.dir("a");
    let b = w.dir("b");
    ok(&w.run_script(&a, "echo prompt-a >> ~/.claude/history.jsonl"));
    let out_b = ok(&w.run_script(&b, "echo B:; cat ~/.claude/history.jsonl; echo :B"));
    assert!(
        out_b.contains("B:\n:B"),
        "b's history is not empty:\n{out_b}"
    );
    let out_a = ok(&w.run_script(&a, "cat ~/.claude/history.jsonl"));
    assert!(
        out_a.contains("prompt-a") && !out_a.contains("host-history"),
        "{out_a}"
    );
    assert_eq!(
        fs::read_to_string(w.home().join(".claude/history.jsonl")).unwrap(),
        "host-history\n"
    );
}

#[test]
fn sessions_registry_is_private_to_each_launch() {
    let w = World::new(BIN);
    let p = w.dir("p");
    ok(&w.run_script(&p, "echo x > ~/.claude/sessions/2.json"));
    assert!(!w.home().join(".claude/sessions/2.json").exists());
    let out = ok(&w.run_script(&p, "ls -A ~/.claude/sessions | wc -l"));
    assert!(out.lines().any(|l| l.trim() == "0"), "{out}");
}

#[test]
fn claude_json_is_the_projects_own_and_follows_the_host() {
    let w = World::new(BIN);
    let host = w.home().join(".claude.json");
    fs::write(
        &host,
        "{\"host\":1,\"projects\":{\"/elsewhere\":{\"lastSessionId\":\"SECRET-B\"}}}",
    )
    .unwrap();
    let p = w.dir("p");
    let out = ok(&w.run_script(
        &p,
        "cat ~/.claude.json; echo; echo \"$CLAUDE_CONFIG_DIR\"; \
         printf '{\"host\":1,\"inside\":true}' > ~/.claude/.claude.json",
    ));
    assert!(
        out.contains("\"host\": 1") && !out.contains("SECRET-B"),
        "{out}"
    );
    assert!(
        out.contains(&format!("{}/.claude\n", w.home().display())),
        "{out}"
    );
    // The host's file is untouched; a host change shows at the next launch, beside the
    // project's own change.
    assert!(fs::read_to_string(&host).unwrap().contains("SECRET-B"));
    fs::write(&host, "{\"host\":2}").unwrap();
    let out = ok(&w.run_script(&p, "cat ~/.claude.json"));
    let v: serde_json::Value = serde_json::from_str(
        out.lines()
            .skip_while(|l| !l.starts_with('{'))
            .collect::<Vec<_>>()
            .join("\n")
            .as_str(),
    )
    .unwrap();
    assert_eq!(v["host"], 2, "{out}");
    assert_eq!(v["inside"], true, "{out}");
    // Another project does not see it.
    let q = w.dir("q");
    let out = ok(&w.run_script(&q, "cat ~/.claude.json"));
    assert!(!out.contains("\"inside\""), "{out}");
}

#[test]
fn nothing_else_of_the_home_is_visible_but_the_home_is_writable() {
    let w = World::new(BIN);
    fs::create_dir_all(w.home().join(".ssh")).unwrap();
    fs::write(w.home().join(".ssh/id_ed25519"), "PRIVATE").unwrap();
    fs::write(w.home().join(".bash_history"), "secret-cmd").unwrap();
    let other = w.home().join("src/other-project");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("code.rs"), "other").unwrap();
    fs::write(
        w.home().join(".gitconfig"),
        "[user]\n\tname = Inside\n\temail = i@example.com\n",
    )
    .unwrap();
    let p = w.dir("p");
    let out = ok(&w.run_script(&p, "ls -A ~; cat ~/.ssh/id_ed25519 2>&1; cat ~/src/other-project/code.rs 2>&1; cat ~/.bash_history 2>&1; \
         mkdir -p ~/.cache/x && echo HOME-WRITABLE; echo x >> ~/.gitconfig 2>/dev/null || echo GITCONFIG-RO; \
         git config user.name",
    ));
    assert!(
        !out.contains("PRIVATE") && !out.contains("secret-cmd") && !out.contains("\nother\n"),
        "{out}"
    );
    assert!(
        !out.lines()
            .any(|l| l == ".ssh" || l == "src" || l == ".bash_history"),
        "{out}"
    );
    assert!(
        out.contains("HOME-WRITABLE") && out.contains("GITCONFIG-RO") && out.contains("Inside"),
        "{out}"
    );
    assert!(
        !w.home().join(".cache").exists(),
        "the sandbox home leaked to the host"
    );
}

#[test]
fn project_is_read_write_system_read_only_and_cwd_kept() {
    let w = World::new(BIN);
    let repo = w.work().join("repo");
    init_repo(&repo);
    fs::write(
        w.home().join(".gitconfig"),
        "[user]\n\tname = Inside\n\temail = i@example.com\n",
    )
    .unwrap();
    let sub = repo.join("sub dir");
    fs::create_dir_all(&sub).unwrap();
    let out = ok(&w.run_script(
        &sub,
        "pwd; echo new > f.txt && git add f.txt && git commit -qm inside && echo COMMITTED; \
         touch /usr/x 2>/dev/null || echo USR-RO; touch /etc/x 2>/dev/null || echo ETC-RO; \
         touch /tmp/x && echo TMP-RW; echo CLAUDEBOX=$CLAUDEBOX",
    ));
    assert!(
        out.lines().any(|l| Path::new(l) == sub),
        "cwd not kept:\n{out}"
    );
    for s in ["COMMITTED", "USR-RO", "ETC-RO", "TMP-RW", "CLAUDEBOX=1"] {
        assert!(out.contains(s), "missing {s}:\n{out}");
    }
    assert_eq!(git(&repo, &["log", "-1", "--format=%s"]), "inside");
}

#[test]
fn environment_names_project_and_a_fresh_instance_each_launch() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let script = "echo ROOT=$CLAUDEBOX_PROJECT_ROOT; echo ID=$CLAUDEBOX_PROJECT_ID; echo INST=$CLAUDEBOX_INSTANCE_ID; echo HOSTVAR=$MY_HOST_VAR";
    let run = || {
        let o = w
            .cmd(&p)
            .env("FAKE_CLAUDE_SCRIPT", script)
            .env("MY_HOST_VAR", "kept")
            .output()
            .unwrap();
        ok(&o)
    };
    let (o1, o2) = (run(), run());
    let get = |o: &str, k: &str| {
        o.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap()
            .to_string()
    };
    assert_eq!(get(&o1, "ROOT="), p.to_str().unwrap());
    assert_eq!(get(&o1, "ID=").len(), 16);
    assert_eq!(get(&o1, "HOSTVAR="), "kept");
    let (i1, i2) = (get(&o1, "INST="), get(&o2, "INST="));
    assert_eq!(i1.len(), 32);
    assert!(i1.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(i1, i2);
}

#[test]
fn arguments_pass_through_unchanged_and_exit_status_returns() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let args = [
        "--model",
        "x y",
        "it's \"quoted\"",
        "-p",
        "$HOME `id`",
        "-r",
        "--name",
        "n",
    ];
    let out = w.run_claude(&p, args, "exit 42");
    assert_eq!(out.status.code(), Some(42), "{}", stderr(&out));
    let got = fake_args(&stdout(&out));
    // the sandbox note comes first, then the user's arguments unchanged
    assert_eq!(got[0], "--append-system-prompt");
    assert_eq!(&got[2..], &args);
    assert!(got[1].contains("claudebox"));

    // non-UTF-8 bytes too
    let raw = OsStr::from_bytes(b"caf\xe9\nline");
    let out = w
        .cmd(&p)
        .arg(raw)
        .env(
            "FAKE_CLAUDE_SCRIPT",
            "printf '%s' \"$3\" > /tmp/a; od -An -c /tmp/a",
        )
        .output()
        .unwrap();
    let s = ok(&out);
    assert!(s.contains("351") && s.contains("\\n"), "{s}");
}

#[test]
fn exec_runs_another_command_in_the_same_sandbox() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let out = w
        .cmd(&p)
        .args([
            "--exec",
            "sh",
            "-c",
            "echo in-$CLAUDEBOX; ls ~/.claude >/dev/null && exit 3",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(stdout(&out).contains("in-1"));
    let e = w.cmd(&p).arg("--exec").output().unwrap();
    assert!(!e.status.success());
    assert!(
        stderr(&e).contains("--exec needs a command"),
        "{}",
        stderr(&e)
    );
}

#[test]
fn dry_run_creates_nothing_and_its_printed_command_runs() {
    let w = World::new(BIN);
    let p = w.dir("we'ird \"dir\" $x");
    let before = snapshot(&w.root());
    let out = w
        .cmd(&p)
        .args([
            "--dry-run",
            "--exec",
            "sh",
            "-c",
            "echo ran-$CLAUDEBOX_PROJECT_ID; echo \"$0\"",
        ])
        .output()
        .unwrap();
    let text = ok(&out);
    assert_eq!(before, snapshot(&w.root()), "--dry-run changed the disk");
    assert!(text.contains("# mounts"));
    let id = env_in_dry_run(&text, "CLAUDEBOX_PROJECT_ID").unwrap();
    // the mount table lists the overlays after ~/.claude, in order
    let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let pos = |needle: &str| {
        rows.iter()
            .position(|r| r.contains(needle))
            .unwrap_or_else(|| panic!("{needle} missing:\n{text}"))
    };
    let claude_dir = format!("{}\t", w.home().join(".claude").display());
    assert!(pos(&claude_dir) < pos("/.claude/projects\t"));
    assert!(pos("/.claude/projects\t") < pos("/.claude/history.jsonl\t"));

    // paste the printed command into sh (after the state exists, as a launch would make it)
    ok(&w.cmd(&p).args(["--exec", "true"]).output().unwrap());
    let line = text.lines().last().unwrap();
    let sh = Command::new("sh")
        .arg("-c")
        .arg(line)
        .current_dir(&p)
        .env_clear()
        .env("HOME", w.home())
        .env("PATH", w.path_var())
        .output()
        .unwrap();
    assert!(
        sh.status.success(),
        "printed command failed: {}",
        String::from_utf8_lossy(&sh.stderr)
    );
    assert!(String::from_utf8_lossy(&sh.stdout).contains(&format!("ran-{id}")));
}

#[test]
fn refuses_home_and_root_without_yes() {
    let w = World::new(BIN);
    for dir in [w.home(), PathBuf::from("/")] {
        let out = w.cmd(&dir).args(["--exec", "true"]).output().unwrap();
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(
            err.starts_with("claudebox: refusing")
                && err.contains("--yes")
                && err.lines().count() == 1,
            "{err}"
        );
    }
    assert!(!w.state().exists(), "refusal created state");
    let out = w
        .cmd(&w.home())
        .args([
            "--yes",
            "--exec",
            "sh",
            "-c",
            "ls -A ~/.claude >/dev/null && echo OK",
        ])
        .output()
        .unwrap();
    assert!(ok(&out).contains("OK"));
}

#[test]
fn clear_errors_and_nothing_created() {
    let w = World::new(BIN);
    let p = w.dir("p");
    // no bwrap on PATH
    let o = w.cmd(&p).env("PATH", w.bin()).output().unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("bwrap") && stderr(&o).lines().count() == 1,
        "{}",
        stderr(&o)
    );
    // no claude on PATH
    fs::remove_file(w.bin().join("claude")).unwrap();
    let o = w.cmd(&p).output().unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no `claude` on PATH") && stderr(&o).lines().count() == 1,
        "{}",
        stderr(&o)
    );
    assert!(!w.state().exists());
    w.install_claude(FAKE_CLAUDE);
    // unwritable state directory (under a regular file: fails for root too)
    let file = w.root().join("a-file");
    fs::write(&file, "").unwrap();
    let o = w
        .cmd(&p)
        .env("CLAUDEBOX_HOME", file.join("state"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("state directory") && stderr(&o).lines().count() == 1,
        "{}",
        stderr(&o)
    );
    // a vanished cwd
    let gone = w.dir("gone");
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && rmdir '{}' && exec '{}' --exec true",
            gone.display(),
            gone.display(),
            BIN
        ))
        .env("HOME", w.home())
        .env("PATH", w.path_var())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("current directory") && stderr(&o).lines().count() == 1,
        "{}",
        stderr(&o)
    );
    assert!(!w.state().exists(), "an error left state behind");
    assert!(!w.home().join(".claude.json").exists());
}

#[test]
fn odd_project_paths_work() {
    let w = World::new(BIN);
    let name = OsStr::from_bytes(b"odd \xff name\nwith 'quotes'");
    let p = w.work().join(name);
    fs::create_dir_all(&p).unwrap();
    let o = w
        .cmd(&p)
        .args(["--exec", "sh", "-c", "echo hi > file && cat file"])
        .output()
        .unwrap();
    assert!(ok(&o).contains("hi"));
    let root = fs::read(
        w.state()
            .join("projects")
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("project-root"),
    )
    .unwrap();
    assert_eq!(root, p.as_os_str().as_bytes());
}

#[test]
fn state_layout_is_private() {
    let w = World::new(BIN);
    let p = w.dir("p");
    ok(&w.cmd(&p).args(["--exec", "true"]).output().unwrap());
    assert_eq!(
        fs::metadata(w.state()).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let dirs: Vec<_> = fs::read_dir(w.state().join("projects"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(dirs.len(), 1);
    let d = dirs[0].path();
    assert_eq!(d.file_name().unwrap().len(), 16);
    assert_eq!(
        fs::read(d.join("project-root")).unwrap(),
        p.as_os_str().as_bytes()
    );
    assert!(d.join("claude-projects").is_dir() && d.join("history.jsonl").is_file());
}

#[test]
fn claude_installed_in_the_home_is_found_inside() {
    // the native installer's layout: ~/.local/bin/claude -> ~/.local/share/claude/versions/X
    let w = World::new(BIN);
    let versions = w.home().join(".local/share/claude/versions");
    fs::create_dir_all(&versions).unwrap();
    fs::write(versions.join("9.9.9"), FAKE_CLAUDE).unwrap();
    fs::set_permissions(versions.join("9.9.9"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(w.home().join(".local/bin")).unwrap();
    symlink(versions.join("9.9.9"), w.home().join(".local/bin/claude")).unwrap();
    fs::remove_file(w.bin().join("claude")).unwrap();
    let p = w.dir("p");
    let mut path = w.home().join(".local/bin").into_os_string();
    path.push(":/usr/bin:/bin");
    let o = w
        .cmd(&p)
        .env("PATH", &path)
        .env("FAKE_CLAUDE_SCRIPT", "echo NATIVE-OK; command -v claude")
        .output()
        .unwrap();
    let s = ok(&o);
    assert!(
        s.contains("NATIVE-OK") && s.contains(".local/bin/claude"),
        "{s}"
    );

    // an npm prefix: bin/claude -> ../lib/node_modules/pkg/cli.sh, which needs a sibling file
    let w = World::new(BIN);
    let pkg = w
        .root()
        .join("npm/lib/node_modules/@anthropic-ai/claude-code");
    fs::create_dir_all(pkg.join("vendor")).unwrap();
    fs::write(pkg.join("package.json"), "{}").unwrap();
    fs::write(pkg.join("vendor/data"), "VENDOR-OK").unwrap();
    let script = "#!/bin/sh\nd=$(dirname \"$(readlink -f \"$0\")\")\ncat \"$d/vendor/data\"\n";
    fs::write(pkg.join("cli.sh"), script).unwrap();
    fs::set_permissions(pkg.join("cli.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(w.root().join("npm/bin")).unwrap();
    symlink(
        "../lib/node_modules/@anthropic-ai/claude-code/cli.sh",
        w.root().join("npm/bin/claude"),
    )
    .unwrap();
    fs::remove_file(w.bin().join("claude")).unwrap();
    let mut path = w.root().join("npm/bin").into_os_string();
    path.push(":/usr/bin:/bin");
    let o = w.cmd(&p_dir(&w)).env("PATH", &path).output().unwrap();
    assert!(ok(&o).contains("VENDOR-OK"));
}

fn p_dir(w: &World) -> PathBuf {
    w.dir("p")
}

#[test]
fn the_agent_gets_sigpipe_at_its_default_and_a_pipe_closing_ends_the_writer() {
    // claudebox ignores SIGPIPE for itself (its proxy writes to sockets that may close);
    // an ignored signal survives exec, so it must put it back before it execs bwrap and
    // before its own step inside execs the agent. Otherwise `yes | head -1` never ends
    // the `yes` with SIGPIPE (status 141), it gets EPIPE instead and reports an error.
    let w = World::new(BIN);
    let p = w.dir("p");
    let out = ok(&w
        .cmd(&p)
        .args([
            "--exec",
            "bash",
            "-c",
            "grep SigIgn /proc/self/status; yes | head -1 >/dev/null; echo \"yes=${PIPESTATUS[0]}\"",
        ])
        .output()
        .unwrap());
    let ignored = out
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .unwrap_or_else(|| panic!("no SigIgn line:\n{out}"));
    const SIGPIPE: u64 = 1 << (13 - 1);
    assert_eq!(ignored & SIGPIPE, 0, "SIGPIPE is ignored inside:\n{out}");
    assert!(out.contains("yes=141"), "{out}");
}

/// One login, many agents: every sandbox, of every project, has the same secure-storage
/// directory (claude's `CLAUDE_SECURESTORAGE_CONFIG_DIR`, where it takes its OAuth refresh
/// lock `.oauth_refresh.lock` with `mkdir`), with the host's credentials in it.
#[test]
fn every_project_shares_the_login_directory_and_its_locks() {
    let w = World::new(BIN);
    fs::write(w.home().join(".claude/.credentials.json"), "tokens-v1").unwrap();
    let a = w.dir("a");
    let b = w.dir("b");
    let out = ok(&w.run_claude(&a, ["--no-login-broker"], "echo \"DIR<$CLAUDE_SECURESTORAGE_CONFIG_DIR>\"; cat \"$CLAUDE_SECURESTORAGE_CONFIG_DIR/.credentials.json\"; echo; \
         mkdir \"$CLAUDE_SECURESTORAGE_CONFIG_DIR/.oauth_refresh.lock\" && echo A-HOLDS",
    ));
    assert!(
        out.contains("tokens-v1") && out.contains("A-HOLDS"),
        "{out}"
    );
    let dir = out
        .lines()
        .find_map(|l| l.strip_prefix("DIR<").and_then(|l| l.strip_suffix('>')))
        .unwrap()
        .to_string();
    assert_eq!(Path::new(&dir), w.state().join("login"));
    let out = ok(&w.run_claude(&b, ["--no-login-broker"], "mkdir \"$CLAUDE_SECURESTORAGE_CONFIG_DIR/.oauth_refresh.lock\" 2>/dev/null && echo B-TOOK || echo B-WAITS; \
         echo tokens-v2 > \"$CLAUDE_SECURESTORAGE_CONFIG_DIR/.credentials.json\"",
    ));
    assert!(out.contains("B-WAITS"), "{out}");
    // A refresh written in place reaches the host's file.
    assert_eq!(
        fs::read_to_string(w.home().join(".claude/.credentials.json")).unwrap(),
        "tokens-v2\n"
    );
}

/// The installation is read-only inside: claude's auto-updater can only fail, so
/// claudebox turns it off unless the user chose (host environment or `--env`).
#[test]
fn the_auto_updater_is_off_inside_unless_the_user_set_it() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let inside = |c: &mut Command| {
        let o = c
            .args([
                "--exec",
                "sh",
                "-c",
                "echo \"<${DISABLE_AUTOUPDATER-unset}>\"",
            ])
            .output()
            .unwrap();
        ok(&o).trim().to_string()
    };
    assert_eq!(inside(&mut w.cmd(&proj)), "<1>");
    let dry = dry_run(&w, &proj);
    let row = dry
        .lines()
        .find(|l| l.starts_with("set\tDISABLE_AUTOUPDATER=1\t"))
        .unwrap_or_else(|| panic!("{dry}"));
    assert!(row.contains("read-only"), "the reason is shown: {row}");
    // The user's own value stands, from the host environment or from --env.
    assert_eq!(inside(w.cmd(&proj).env("DISABLE_AUTOUPDATER", "0")), "<0>");
    assert_eq!(
        inside(w.cmd(&proj).args(["--env", "DISABLE_AUTOUPDATER=0"])),
        "<0>"
    );
}

/// A host that sets `CLAUDE_CONFIG_DIR` keeps its Claude Code config there: that is the
/// real config dir (its setup read-only at `~/.claude` inside, its `.claude.json` merged
/// into the project's copy); inside, `CLAUDE_CONFIG_DIR` is `~/.claude`.
#[test]
fn a_host_claude_config_dir_is_the_real_config_dir() {
    let w = World::new(BIN);
    let d = w.root().join("cfg");
    fs::create_dir_all(d.join("commands")).unwrap();
    fs::write(d.join("settings.json"), "{\"from\":\"cfg-dir\"}").unwrap();
    fs::write(d.join("commands/c.md"), "cmd").unwrap();
    fs::write(d.join(".claude.json"), "{\"fromCfgDir\":true}").unwrap();
    fs::write(w.home().join(".claude.json"), "{\"fromHome\":true}").unwrap();
    let p = w.dir("p");
    let out = ok(&w
        .cmd(&p)
        .env("CLAUDE_CONFIG_DIR", &d)
        .env(
            "FAKE_CLAUDE_SCRIPT",
            "echo \"CFG<$CLAUDE_CONFIG_DIR>\"; cat ~/.claude/settings.json ~/.claude/commands/c.md; echo; \
             cat ~/.claude/.claude.json; echo x > ~/.claude/settings.json && echo COPY-WRITTEN",
        )
        .output()
        .unwrap());
    assert!(
        out.contains(&format!("CFG<{}/.claude>", w.home().display())),
        "{out}"
    );
    assert!(out.contains("cfg-dir") && out.contains("cmd"), "{out}");
    assert!(
        out.contains("fromCfgDir") && !out.contains("fromHome"),
        "{out}"
    );
    // settings.json inside is the project's copy: written there, never in the real one.
    assert!(out.contains("COPY-WRITTEN"), "{out}");
    assert_eq!(
        fs::read_to_string(d.join("settings.json")).unwrap(),
        "{\"from\":\"cfg-dir\"}"
    );
}

/// Twenty first launches of a new project at once all start: a sibling launch preparing
/// the same state files never replaces one this launch has checked and opened to bind
/// (before the fix, about a third failed: bwrap "Can't find source path /proc/self/fd/N",
/// or the sandbox's check of `.claude/settings.local.json`).
#[test]
fn twenty_first_launches_of_a_new_project_at_once_all_start() {
    let _heavy = lab::heavy();
    const ROUNDS: usize = 3;
    const N: usize = 20;
    let mut failed = Vec::new();
    for round in 0..ROUNDS {
        // A fresh state home and project each round: every launch is a first one.
        let w = World::new(BIN);
        let repo = w.work().join("repo");
        init_repo(&repo);
        let children: Vec<_> = (0..N)
            .map(|_| {
                w.cmd(&repo)
                    .args(["--exec", "true"])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("run claudebox")
            })
            .collect();
        for c in children {
            let o = c.wait_with_output().unwrap();
            if !o.status.success() {
                failed.push(format!("round {round}: {}", stderr(&o).trim()));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} first launches failed:\n{}",
        failed.len(),
        ROUNDS * N,
        failed.join("\n")
    );
}

/// A `bwrap` the agent planted in the project (`.venv/bin/bwrap`, on the launcher's PATH
/// because the user activated the venv, or through a relative entry) is not what the next
/// launch runs on the host (issue 34: no host process from a place the agent writes).
/// Control: with `CLAUDEBOX_TEST_COMPANIONS_IN_CWD=1` (debug builds: PATH looked up as it
/// is) the planted one runs on the host.
#[test]
fn a_bwrap_planted_in_the_project_is_not_run_on_the_host() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    let real = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v bwrap"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let real = real.trim();
    assert!(real.starts_with('/'), "no bwrap on the test's PATH");
    let marker = w.home().join("planted-bwrap-ran");
    let plant = format!(
        "mkdir -p .venv/bin && printf '#!/bin/sh\\necho ran >> {m}\\nexec {real} \"$@\"\\n' \
         > .venv/bin/bwrap && chmod +x .venv/bin/bwrap && echo PLANTED",
        m = marker.display()
    );
    assert!(ok(&w.run_script(&p, &plant)).contains("PLANTED"));
    let launch = |path_first: &str, control: bool| {
        let mut path = OsStr::new(path_first).to_os_string();
        path.push(":");
        path.push(w.path_var());
        let mut c = w.cmd(&p);
        c.env("PATH", path).env("FAKE_CLAUDE_SCRIPT", "echo INSIDE");
        if control {
            c.env("CLAUDEBOX_TEST_COMPANIONS_IN_CWD", "1");
        }
        ok(&c.output().unwrap())
    };
    let venv = p.join(".venv/bin");
    for first in [venv.to_str().unwrap(), ".venv/bin"] {
        assert!(launch(first, false).contains("INSIDE"));
        assert!(
            !marker.exists(),
            "the bwrap planted at {first} ran on the host"
        );
    }
    // The control: the plant is on the way, and a plain PATH lookup runs it.
    assert!(launch(venv.to_str().unwrap(), true).contains("INSIDE"));
    assert!(marker.exists(), "the control did not run the planted bwrap");
}
