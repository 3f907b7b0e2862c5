//! What a newcomer meets first (issue 24): a home reached through a symlink, `--yes` in
//! the home, a local gateway the network mode cannot reach, a hook's own log under
//! `~/.claude`, the read-only notice, near-misses of claudebox's options, `--dry-run`'s
//! summary, session-name completion (bash, zsh, fish), a worktree outside the project.

use crate::BIN;
use lab::*;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

/// A world whose HOME and project are named through a symlink (`root/link -> root`), as
/// on Fedora Silverblue (`/home -> var/home`) or with a home linked onto another disk.
fn linked(w: &World) -> (PathBuf, PathBuf) {
    symlink(w.root(), w.root().join("link")).unwrap();
    let proj = w.dir("proj");
    init_repo(&proj);
    (w.root().join("link/home"), w.root().join("link/work/proj"))
}

#[test]
fn a_home_and_a_project_reached_through_a_symlink_launch() {
    let w = World::new(BIN);
    let (home, proj) = linked(&w);
    // A source under ~/.claude, named through the link: what was refused as tampering.
    fs::write(
        w.home().join(".claude/settings.json"),
        "{\"mark\":\"SETUP\"}",
    )
    .unwrap();
    let out = w
        .cmd(&proj)
        .env("HOME", &home)
        .env(
            "FAKE_CLAUDE_SCRIPT",
            "pwd; echo HOME=$HOME; cat $HOME/.claude/settings.json; echo; \
             test -L \"$HOME\" && echo HOME-IS-LINK; echo x > $HOME/scratch && echo WROTE",
        )
        .output()
        .unwrap();
    let out = ok(&out);
    assert!(
        out.contains(&format!("{}\n", w.root().join("work/proj").display())),
        "{out}"
    );
    assert!(out.contains(&format!("HOME={}", home.display())), "{out}");
    assert!(out.contains("SETUP"), "{out}");
    assert!(
        out.contains("HOME-IS-LINK") && out.contains("WROTE"),
        "{out}"
    );
    assert!(
        !w.home().join("scratch").exists(),
        "the home inside is scratch"
    );

    // The source check still runs under the linked home: a host file that leads into a
    // place a sandbox writes (here the project) is refused, not mounted.
    fs::write(w.root().join("work/proj/planted"), "[alias]\n").unwrap();
    symlink(
        w.root().join("work/proj/planted"),
        w.home().join(".gitconfig"),
    )
    .unwrap();
    let refused = w.cmd(&proj).env("HOME", &home).output().unwrap();
    assert!(!refused.status.success());
    let err = stderr(&refused);
    assert!(
        err.contains("now leads to") && err.contains("tampering"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `cd ~ && claudebox --yes`: the home is the project. The real `~/.claude.json` (every
/// project's trust and MCP servers) lies in the read-write project; the project's copy
/// covers it, and `~/.claude` is the project's own as in every launch.
#[test]
fn yes_in_the_home_launches_without_showing_or_writing_the_real_claude_json() {
    let w = World::new(BIN);
    let home = w.home();
    let real = r#"{"projects":{"/elsewhere":{"mcpServers":{"s":{"env":{"TOKEN":"OTHER-PROJECT-SECRET"}}}}}}"#;
    fs::write(home.join(".claude.json"), real).unwrap();
    // The host's backups of it: a Project entry of ~/.claude, so never the real one.
    fs::create_dir_all(home.join(".claude/backups")).unwrap();
    fs::write(
        home.join(".claude/backups/.claude.json.backup.1"),
        "REAL-CLAUDE-DIR",
    )
    .unwrap();
    // The control: the same bytes under another name in the home are the project's.
    fs::write(home.join("copy.json"), real).unwrap();
    let script = "cat ~/.claude.json; echo; cat ~/copy.json; echo; \
                  cat ~/.claude/backups/* 2>/dev/null; \
                  echo '{\"planted\":1}' > ~/.claude.json && echo WROTE-JSON";
    let out = w.run_claude(&home, ["--yes"], script);
    let out = ok(&out);
    assert_eq!(
        out.matches("OTHER-PROJECT-SECRET").count(),
        1,
        "only the control shows it: {out}"
    );
    assert!(!out.contains("REAL-CLAUDE-DIR"), "{out}");
    assert!(out.contains("WROTE-JSON"), "{out}");
    assert_eq!(fs::read_to_string(home.join(".claude.json")).unwrap(), real);

    // Without a real ~/.claude.json nothing is left in the real home.
    fs::remove_file(home.join(".claude.json")).unwrap();
    let out = w.run_claude(&home, ["--yes"], "echo RAN");
    assert!(ok(&out).contains("RAN"));
    assert!(fs::symlink_metadata(home.join(".claude.json")).is_err());
}

/// A local gateway the network mode cannot reach: one warning line naming the flag, and
/// none once that flag opens it (the control), nor in open mode.
#[test]
fn an_unreachable_base_url_gets_one_warning_line_and_an_opened_one_none() {
    let w = World::new(BIN);
    let proj = w.dir("gw");
    init_repo(&proj);
    let launch = |url: &str, args: &[&str]| {
        let o = w
            .cmd(&proj)
            .env("ANTHROPIC_BASE_URL", url)
            .args(args)
            .args(["--exec", "true"])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        err.lines()
            .filter(|l| l.contains("ANTHROPIC_BASE_URL"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let local = "http://127.0.0.1:47999";
    let warned = launch(local, &["--network", "none"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].starts_with("claudebox: network: warning:"),
        "{warned:?}"
    );
    assert!(
        warned[0].contains("--forward-port 127.0.0.1:47999"),
        "{warned:?}"
    );
    let warned = launch(local, &["--network", "allowlist"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(launch(local, &["--network", "none", "--forward-port", "47999"]).is_empty());
    assert!(launch(local, &["--allow-host", "127.0.0.1:47999"]).is_empty());
    assert!(launch(local, &["--network", "open"]).is_empty());

    let lan = "http://gateway.lan:8080/v1";
    let warned = launch(lan, &["--network", "allowlist"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("--allow-host gateway.lan:8080"),
        "{warned:?}"
    );
    assert!(launch(lan, &["--allow-host", "gateway.lan:8080"]).is_empty());
    // --env sets the value claude sees: it is the one judged, not the host's.
    let env = "ANTHROPIC_BASE_URL=https://api.anthropic.com";
    assert!(launch(local, &["--network", "allowlist", "--env", env]).is_empty());
    let env = "ANTHROPIC_BASE_URL=http://localhost:4000";
    let warned = launch(
        "https://api.anthropic.com",
        &["--network", "allowlist", "--env", env],
    );
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("localhost:4000"), "{warned:?}");
}

/// A user's hook that appends to its own log under `~/.claude` keeps working inside once
/// the host has that log: a data file is the project's own (the host's is neither shown
/// nor written). The control: the same hook appending to a file not named as data (the
/// setup, read-only) fails inside.
#[test]
fn a_hooks_own_log_under_dot_claude_stays_writable_and_the_setup_does_not() {
    use lab::agent::{ok_run, world_with, MockApi, API_KEY};
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        let claude = w.home().join(".claude");
        fs::write(claude.join("hook.log"), "HOST-LOG\n").unwrap();
        fs::write(claude.join("hook-state"), "HOST-STATE\n").unwrap();
        let log = p.join("appended");
        let hook = format!(
            "echo tool >> \"$HOME/.claude/hook.log\" && echo log-ok >> '{0}'; \
             echo tool >> \"$HOME/.claude/hook-state\" && echo state-ok >> '{0}'; exit 0",
            log.display()
        );
        let settings = serde_json::json!({"hooks": {"PreToolUse": [{"matcher": "Bash",
            "hooks": [{"type": "command", "command": hook}]}]}});
        fs::write(claude.join("settings.json"), settings.to_string()).unwrap();
        let mock = MockApi::start(&serde_json::json!([
            {"bash": {"command": "echo tool-ran", "description": "x"}},
            "DONE"
        ]));
        let o = w
            .cmd(&p)
            .env("ANTHROPIC_BASE_URL", mock.base_url())
            .env("ANTHROPIC_API_KEY", API_KEY)
            .args(["-p", "go", "--allowedTools", "Bash"])
            .output()
            .unwrap();
        ok_run(&c, &o, &mock);
        let appended = fs::read_to_string(&log).unwrap_or_default();
        assert!(appended.contains("log-ok"), "[{}] {appended:?}", c.label);
        assert!(!appended.contains("state-ok"), "[{}] {appended:?}", c.label);
        // The host's files are as they were: what the sandbox wrote stayed the project's.
        assert_eq!(
            fs::read_to_string(claude.join("hook.log")).unwrap(),
            "HOST-LOG\n"
        );
        assert_eq!(
            fs::read_to_string(claude.join("hook-state")).unwrap(),
            "HOST-STATE\n"
        );
    }
}

/// Read-only files: an append fails "Read-only file system" (EROFS), a rename over one
/// fails "Device or resource busy" (EBUSY, the kernel refuses a rename over a mount
/// point before it looks at read-only; only a read-only parent directory gives EROFS,
/// and the project's `.git` must stay writable). The note appended to claude's system
/// prompt says EBUSY means read-only. The control: the same rename over a file that is
/// not protected succeeds.
#[test]
fn a_rename_over_a_read_only_file_fails_ebusy_and_the_note_says_it_means_read_only() {
    let w = World::new(BIN);
    let p = w.dir("ro");
    init_repo(&p);
    fs::write(p.join("plain"), "x\n").unwrap();
    let script = r#"
ap() { sh -c 'echo x >> "$1"' ap "$1" 2>&1 | sed 's/.*: //'; }
echo "APPEND<$(ap .git/config)>"
echo t > .git/t; echo "RENAME<$(mv .git/t .git/config 2>&1 | sed 's/.*: //')>"
echo t > p.tmp; mv p.tmp plain && echo CONTROL-RENAMED
"#;
    let out = ok(&w.run_claude(&p, Vec::<&str>::new(), script));
    assert!(out.contains("APPEND<Read-only file system>"), "{out}");
    assert!(out.contains("RENAME<Device or resource busy>"), "{out}");
    assert!(out.contains("CONTROL-RENAMED"), "{out}");
    let note = fake_args(&out).join("\n");
    assert!(
        note.contains("\"Device or resource busy\" (EBUSY)") && note.contains("means read-only"),
        "{note}"
    );
}

/// A typo in a claudebox option is refused with one line naming the option meant, before
/// anything is made; the same word after `--` (the control) reaches claude, as do claude's
/// own options.
#[test]
fn a_near_miss_of_a_claudebox_option_is_refused_with_did_you_mean() {
    let w = World::new(BIN);
    let p = w.dir("typo");
    init_repo(&p);
    let o = w.run_claude(&p, ["--no-netwrok"], "echo RAN");
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("claudebox: unknown option --no-netwrok: did you mean --no-network?"),
        "{err}"
    );
    assert!(!stdout(&o).contains("RAN"));
    assert!(!w.state().join("projects").exists(), "nothing made");
    let out = ok(&w.run_claude(&p, ["--", "--no-netwrok"], "echo RAN"));
    assert_eq!(
        fake_args(&out).last().map(String::as_str),
        Some("--no-netwrok")
    );
    let out = ok(&w.run_claude(&p, ["--ide"], "echo RAN"));
    assert!(fake_args(&out).iter().any(|a| a == "--ide"), "{out}");
}

/// `--dry-run` starts with what a person reads first, and explains every kind of row it
/// prints below: each first column of the listing has its line in the legend.
#[test]
fn dry_run_starts_with_a_summary_and_explains_every_kind_it_prints() {
    let w = World::new(BIN);
    let p = w.dir("dry");
    init_repo(&p);
    let extra = w.dir("extra");
    let out = ok(&w
        .cmd(&p)
        .args(["--dry-run", "--allow-host", "127.0.0.1:5432", "--hide"])
        .arg(p.join("README"))
        .arg("--ro")
        .arg(&extra)
        .output()
        .unwrap());
    let head: Vec<&str> = out.lines().take(9).collect();
    assert!(
        head[0].starts_with("# claudebox --dry-run: nothing was started"),
        "{out}"
    );
    for (i, row) in [
        "project",
        "state",
        "network",
        "writable",
        "scratch",
        "read-only",
        "hidden",
        "opt-ins",
    ]
    .iter()
    .enumerate()
    {
        assert!(
            head[i + 1].starts_with(&format!("#   {row} ")),
            "{row}: {head:?}"
        );
    }
    assert!(head[1].contains(&p.display().to_string()));
    assert!(head[3].contains("allowlist"), "{head:?}");
    assert!(
        head[6].contains(&format!("{} (command line)", extra.display())),
        "{head:?}"
    );
    assert!(head[7].contains("README (command line)"), "{head:?}");
    assert_eq!(head[8], "#   opt-ins    none");
    // Every kind of row below has its line in the legend.
    let legend: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("# kinds of row"))
        .skip(1)
        .take_while(|l| l.starts_with("#   "))
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    // Rows of the listing, but the settings table (its first column names a setting).
    let mut in_settings = false;
    let rows: std::collections::BTreeSet<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("# mounts"))
        .take_while(|l| !l.starts_with("# command"))
        .filter(|l| {
            if l.starts_with("# settings") || l.starts_with("# environment") {
                in_settings = l.starts_with("# settings");
            }
            !in_settings
        })
        .filter(|l| !l.starts_with('#') && l.contains('\t'))
        .filter_map(|l| l.split('\t').next())
        .collect();
    for kind in [
        "ro?", "empty-ro", "tmpfs", "symlink", "allow", "forward", "seccomp",
    ] {
        assert!(rows.contains(kind), "{kind} not printed: {rows:?}");
    }
    for kind in &rows {
        assert!(legend.contains(kind), "{kind} is not explained: {legend:?}");
    }
}

/// `--session <TAB>` completes the project's session names, not file names: bash's
/// completion function from `claudebox completions bash`, run for real (and fish's when
/// fish is installed). The control: `--ro <TAB>` in the same shell completes file names.
#[test]
fn session_names_complete_in_bash_zsh_and_fish() {
    let w = World::new(BIN);
    let p = w.dir("comp");
    init_repo(&p);
    for name in ["alpha", "beta-2"] {
        ok(&w.run_claude(&p, ["--session", name], "true"));
    }
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let mut path = bin_dir.as_os_str().to_owned();
    path.push(":/usr/bin:/bin");
    let script = |shell: &str| {
        let s = ok(&w.cmd(&p).args(["completions", shell]).output().unwrap());
        let f = w.root().join(format!("completion.{shell}"));
        fs::write(&f, s).unwrap();
        f
    };
    let bash = |words: &str, cur: &str| {
        let code = format!(
            "source \"$1\"; COMP_WORDS=({words} \"{cur}\"); COMP_CWORD=${{#COMP_WORDS[@]}}; \
             COMP_CWORD=$((COMP_CWORD-1)); COMP_LINE=\"{words} {cur}\"; COMP_POINT=${{#COMP_LINE}}; \
             _claudebox claudebox \"{cur}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\""
        );
        let o = std::process::Command::new("bash")
            .args(["--norc", "-c", &code, "bash"])
            .arg(script("bash"))
            .current_dir(&p)
            .env_clear()
            .env("HOME", w.home())
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let mut got: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
        got.sort();
        got
    };
    assert_eq!(bash("claudebox --session", ""), ["alpha", "beta-2"]);
    assert_eq!(bash("claudebox --yes --forget", "b"), ["beta-2"]);
    // The control: a path option still completes file names.
    assert!(bash("claudebox --ro", "REA").contains(&"README".to_string()));
    assert!(!bash("claudebox --session", "REA").contains(&"README".to_string()));

    // zsh: the real completion system in an interactive zsh on a pseudo-terminal (zpty):
    // the typed line after one Tab.
    if let Ok(zsh) = which::which("zsh") {
        let driver = "zmodload zsh/zpty\n\
            zpty z zsh -f -i\n\
            zpty -w z \"PROMPT='> '; autoload -U compinit; compinit -u -d $3; source $1\"\n\
            sleep 2\n\
            zpty -w -n z \"$2\"\n\
            sleep 3\n\
            out=\n\
            while zpty -rt z chunk; do out+=$chunk; done\n\
            print -r -- \"${out##*$'\\e'\\[\\?2004h}\"\n\
            zpty -d z\n";
        let file = script("zsh");
        let zsh_tab = |typed: &str| {
            let o = std::process::Command::new(&zsh)
                .args(["-f", "-c", driver, "zsh"])
                .arg(&file)
                .arg(format!("{typed}\t"))
                .arg(w.root().join("zcompdump"))
                .current_dir(&p)
                .env_clear()
                .env("HOME", w.home())
                .env("PATH", &path)
                .output()
                .unwrap();
            stdout(&o)
        };
        let got = zsh_tab("claudebox --session b");
        assert!(got.contains("claudebox --session beta-2"), "{got:?}");
        let got = zsh_tab("claudebox --forget a");
        assert!(got.contains("claudebox --forget alpha"), "{got:?}");
        // The control: a path option still completes file names, a session option not.
        let got = zsh_tab("claudebox --ro REA");
        assert!(got.contains("claudebox --ro README"), "{got:?}");
        let got = zsh_tab("claudebox --session REA");
        assert!(!got.contains("README"), "{got:?}");
    } else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "zsh is missing in CI (.ci/run installs it)"
        );
        eprintln!("skipping the zsh half: zsh is not installed");
    }

    let Ok(fish) = which_fish() else {
        eprintln!("skipping the fish half: fish is not installed");
        return;
    };
    let o = std::process::Command::new(fish)
        .args([
            "--no-config",
            "-c",
            "source $argv[1]; complete -C 'claudebox --session '",
        ])
        .arg(script("fish"))
        .current_dir(&p)
        .env_clear()
        .env("HOME", w.home())
        .env("PATH", &path)
        .output()
        .unwrap();
    let fish_out = stdout(&o);
    let got: Vec<&str> = fish_out
        .lines()
        .map(|l| l.split('\t').next().unwrap_or(l))
        .collect();
    assert!(
        got.contains(&"alpha") && got.contains(&"beta-2"),
        "{got:?} {}",
        stderr(&o)
    );
    assert!(!got.contains(&"README"), "{got:?}");
}

fn which_fish() -> Result<PathBuf, ()> {
    ["/usr/bin/fish", "/bin/fish", "/usr/local/bin/fish"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or(())
}

/// `git worktree add ../x` inside, run with real git: the directories around the project
/// are the sandbox's own (bwrap's root, the home's or /tmp's tmpfs), so a worktree made
/// there was lost at exit while the host's git kept its entry. They are read-only now
/// (`scratch-ro`): git fails at once and removes its half-made entry. Three places: under
/// the home (`~/src/app`), under the world's root (a tmpfs /tmp inside, or bwrap's root),
/// and outside both (`/var/tmp`: bwrap's root, made read-only at the end). Control: the
/// same bwrap command line from `--dry-run` without the scratch-ro rows; git returns 0 and
/// the host's git lists a prunable worktree.
#[test]
fn a_worktree_outside_the_project_fails_at_once_and_leaves_no_entry() {
    let w = World::new(BIN);
    let var_tmp = tempfile::Builder::new()
        .prefix("claudebox-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let outside = fs::canonicalize(var_tmp.path()).unwrap().join("proj");
    let under_home = w.home().join("src/app");
    let script = "git worktree add ../x >/dev/null 2>&1; echo WT=$?; \
                  touch ../f 2>/dev/null; echo TOUCH=$?; \
                  git worktree add .wt/y >/dev/null 2>&1; echo INSIDE=$?; \
                  echo x > $HOME/scratch && echo HOME-OK";
    for proj in [under_home.clone(), w.dir("app"), outside] {
        init_repo(&proj);
        let out = ok(&w
            .cmd(&proj)
            .args(["--exec", "sh", "-c", script])
            .output()
            .unwrap());
        assert!(out.contains("WT=128\n"), "{}: {out}", proj.display());
        assert!(out.contains("TOUCH=1\n"), "{}: {out}", proj.display());
        assert!(out.contains("INSIDE=0\n"), "{}: {out}", proj.display());
        assert!(out.contains("HOME-OK"), "{}: {out}", proj.display());
        let list = git(&proj, &["worktree", "list", "--porcelain"]);
        assert!(
            !list.contains("/x\n") && !list.contains("prunable"),
            "{list}"
        );
        assert!(list.contains("/.wt/y\n"), "{list}");
        assert!(!proj.parent().unwrap().join("x").exists());
    }

    // Control: the dry run's own command line without the scratch-ro rows.
    let proj = under_home;
    let src = w.home().join("src");
    let dry = ok(&w
        .cmd(&proj)
        .args(["--dry-run", "--exec", "sh", "-c"])
        .arg("git worktree add ../x >/dev/null 2>&1; echo WT=$?")
        .output()
        .unwrap());
    assert!(
        dry.contains(&format!("scratch-ro\t-\t{}\t", src.display())),
        "{dry}"
    );
    let line = dry.lines().last().unwrap().to_string();
    let (tmpfs, remount) = (
        format!("--tmpfs {} ", src.display()),
        format!("--remount-ro {} ", src.display()),
    );
    assert!(line.contains(&tmpfs) && line.contains(&remount), "{line}");
    let run = |line: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(line)
            .current_dir(&proj)
            .env("HOME", w.home())
            .env("PATH", w.path_var())
            .output()
            .unwrap()
    };
    assert!(stdout(&run(&line)).contains("WT=128"));
    let off = line.replace(&tmpfs, "").replace(&remount, "");
    let out = run(&off);
    assert!(stdout(&out).contains("WT=0"), "{}", stderr(&out));
    let list = git(&proj, &["worktree", "list", "--porcelain"]);
    assert!(list.contains("prunable"), "{list}");
}

/// A project directly in the home: `../x` is the sandbox's scratch home, writable and
/// discarded at exit, so git succeeds inside and the worktree is gone at exit while its
/// entry stays. The exit names it, with the command that drops the entry. Control: a
/// worktree made inside the project (kept) and an older dangling entry (not this launch's)
/// are not named.
#[test]
fn a_worktree_lost_with_the_scratch_home_is_named_at_exit() {
    let w = World::new(BIN);
    let proj = w.home().join("proj");
    init_repo(&proj);
    // An entry left dangling before this launch: not this launch's to name.
    git(&proj, &["worktree", "add", "-q", "../old"]);
    fs::remove_dir_all(w.home().join("old")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let o = w
        .cmd(&proj)
        .args(["--exec", "sh", "-c"])
        .arg(
            "git worktree add ../x >/dev/null 2>&1; echo WT=$?; \
             git worktree add .wt/y >/dev/null 2>&1; echo INSIDE=$?",
        )
        .output()
        .unwrap();
    let out = ok(&o);
    assert!(
        out.contains("WT=0\n") && out.contains("INSIDE=0\n"),
        "{out}"
    );
    let err = stderr(&o);
    let named: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("made inside lived in the sandbox's scratch home"))
        .collect();
    assert_eq!(named.len(), 1, "{err}");
    assert!(
        named[0].contains(&format!("worktree {} made", w.home().join("x").display()))
            && named[0].contains("git worktree prune"),
        "{err}"
    );
    let list = git(&proj, &["worktree", "list", "--porcelain"]);
    assert!(list.contains("/.wt/y\n"), "{list}");
}
