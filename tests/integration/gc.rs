//! `--gc`: removes the state of projects whose root is gone, and nothing else: every trap
//! below is planted for real and the whole test tree is compared before and after.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::BIN;
use lab::maintenance::*;
use lab::{ok, stderr, World};

/// A project directory under `work/` that has been launched in once.
fn project(w: &World, name: &OsStr) -> (PathBuf, String) {
    let dir = w.work().join(name);
    fs::create_dir_all(&dir).unwrap();
    launch(w, &dir);
    let id = id_of(w, &dir);
    assert!(projects(w).join(&id).join("project-root").is_file());
    (dir, id)
}

#[test]
fn removes_only_state_whose_root_is_gone_and_dry_run_removes_nothing() {
    let w = World::new(BIN);
    let (live, live_id) = project(&w, OsStr::new("live"));
    let (gone, gone_id) = project(&w, OsStr::new("gone"));
    fs::remove_dir_all(&gone).unwrap();

    let before = snapshot(&w.root());
    let dry = run(&w, &["--gc", "--dry-run", "--gc-margin", "0"]);
    let err = stderr(&dry);
    assert!(dry.status.success(), "{err}");
    assert!(dry.stdout.is_empty(), "--gc prints on stderr only");
    let state_dir = projects(&w).join(&gone_id);
    assert!(
        err.contains(&format!(
            "would remove {} (project {} no longer exists)",
            state_dir.display(),
            gone.display()
        )),
        "{err}"
    );
    assert_same(&before, &snapshot(&w.root()));

    let real = run(&w, &["--gc", "--gc-margin", "0"]);
    let err = stderr(&real);
    assert!(real.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "removed {} (project {} no longer exists)",
            state_dir.display(),
            gone.display()
        )),
        "{err}"
    );
    assert!(!state_dir.exists());
    assert!(projects(&w).join(&live_id).is_dir());
    assert!(live.is_dir());
    // Nothing else changed: only the removed project's directory is missing.
    assert_same(
        &without(&before, &[&state_dir]),
        &without(&snapshot(&w.root()), &[&state_dir]),
    );
    // A second run finds nothing to do.
    let again = run(&w, &["--gc", "--gc-margin", "0"]);
    assert!(stderr(&again).contains("0 of 1 project directories removed"));
}

#[test]
fn never_follows_symlinks_and_keeps_what_it_cannot_vouch_for() {
    let w = World::new(BIN);
    // Things outside the state that a careless gc could destroy.
    let outside = w.dir("outside");
    fs::write(outside.join("precious"), "keep me\n").unwrap();
    fs::create_dir_all(outside.join("sub")).unwrap();
    fs::write(outside.join("sub/also"), "keep me too\n").unwrap();

    // 1. A gone project whose agent planted symlinks to the outside in its conversations
    //    directory, from inside the sandbox (as a hostile agent can).
    let planted = w.dir("planted");
    let script = format!(
        "ln -s {o} ~/.claude/projects/dir-link && ln -s {o}/precious ~/.claude/projects/file-link \
         && mkdir -p ~/.claude/projects/deep/er && ln -s {o}/sub ~/.claude/projects/deep/er/link \
         && ln {o}/precious ~/.claude/projects/hardlink 2>/dev/null; true",
        o = outside.display()
    );
    ok(&w
        .cmd(&planted)
        .args(["--exec", "sh", "-c", &script])
        .output()
        .unwrap());
    settle(&w.state());
    let planted_id = id_of(&w, &planted);
    let planted_state = projects(&w).join(&planted_id);
    assert!(
        fs::symlink_metadata(planted_state.join("claude-projects/dir-link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    fs::remove_dir_all(&planted).unwrap();

    // 2. projects/<id> is a symlink to a directory outside (id of a gone project).
    let ghost = w.work().join("ghost");
    let ghost_id = {
        fs::create_dir_all(&ghost).unwrap();
        let id = id_of(&w, &ghost);
        fs::remove_dir_all(&ghost).unwrap();
        id
    };
    fs::create_dir_all(projects(&w)).unwrap();
    fs::write(outside.join("project-root"), ghost.as_os_str().as_bytes()).unwrap();
    symlink(&outside, projects(&w).join(&ghost_id)).unwrap();

    // 3. project-root missing, 4. a directory, 5. a symlink to a valid-looking file,
    // 6. naming another project, 7. not an absolute path: all for gone projects.
    let mut kept = Vec::new();
    for (name, how) in [
        ("no-root-file", "missing"),
        ("root-is-dir", "dir"),
        ("root-is-symlink", "symlink"),
        ("root-mismatch", "mismatch"),
        ("root-relative", "relative"),
    ] {
        let (dir, id) = project(&w, OsStr::new(name));
        fs::remove_dir_all(&dir).unwrap();
        let rf = projects(&w).join(&id).join("project-root");
        fs::remove_file(&rf).unwrap();
        match how {
            "missing" => {}
            "dir" => fs::create_dir(&rf).unwrap(),
            "symlink" => {
                let decoy = outside.join(format!("decoy-{name}"));
                fs::write(&decoy, dir.as_os_str().as_bytes()).unwrap();
                symlink(&decoy, &rf).unwrap();
            }
            "mismatch" => {
                fs::write(&rf, w.work().join("elsewhere").as_os_str().as_bytes()).unwrap()
            }
            "relative" => fs::write(&rf, b"work/x").unwrap(),
            _ => unreachable!(),
        }
        kept.push(projects(&w).join(&id));
    }

    // 8. A root that still exists, 9. junk that is not a project directory.
    let (_live, live_id) = project(&w, OsStr::new("live"));
    kept.push(projects(&w).join(&live_id));
    fs::create_dir(projects(&w).join("notes")).unwrap();
    fs::write(projects(&w).join("notes/todo"), "x").unwrap();
    fs::write(projects(&w).join("0123456789abcdef"), "a file").unwrap();

    // 10. Non-UTF-8 and newline-containing roots, gone.
    let (odd, odd_id) = project(&w, OsStr::from_bytes(b"caf\xe9 \"q\" $x"));
    let (nl, nl_id) = project(&w, OsStr::new("two\nlines"));
    fs::remove_dir_all(&odd).unwrap();
    fs::remove_dir_all(&nl).unwrap();

    let before = snapshot(&w.root());
    let out = run(&w, &["--gc", "--gc-margin", "0"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");

    let removed = [
        planted_state.clone(),
        projects(&w).join(&odd_id),
        projects(&w).join(&nl_id),
    ];
    for r in &removed {
        assert!(!r.exists(), "{} should be gone\n{err}", r.display());
    }
    for k in &kept {
        assert!(k.is_dir(), "{} should be kept\n{err}", k.display());
    }
    // Every kept-for-safety directory is reported; the live one is not.
    for k in &kept[..5] {
        assert!(
            err.contains(&format!("kept {}:", k.display())),
            "{} not reported\n{err}",
            k.display()
        );
    }
    assert!(
        !err.contains(&format!("kept {}", kept[5].display())),
        "{err}"
    );
    assert!(err.contains("project-root is missing"), "{err}");
    assert!(err.contains("project-root is unreadable"), "{err}");
    assert!(err.contains("names a project whose id is"), "{err}");
    assert!(err.contains("does not hold an absolute path"), "{err}");
    assert!(err.contains(&format!(
        "left alone {}",
        projects(&w).join(&ghost_id).display()
    )));
    assert!(
        err.contains("notes: not a claudebox project directory name"),
        "{err}"
    );
    assert!(err.contains("0123456789abcdef: not a directory"), "{err}");
    // Odd roots are printed escaped, one line each.
    for shown in ["caf\\xe9 \"q\" $x", "two\\nlines"] {
        let line = format!("(project {}/{shown} no longer exists)", w.work().display());
        assert!(err.contains(&line), "{line} not in\n{err}");
    }
    assert_eq!(
        err.lines().filter(|l| l.contains("removed ")).count(),
        3,
        "{err}"
    );

    // The symlink, everything it and the planted links point at, and all else outside the
    // removed directories are untouched.
    assert_same(
        &without(
            &before,
            &removed.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
        ),
        &without(
            &snapshot(&w.root()),
            &removed.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
        ),
    );
    assert_eq!(
        fs::read_to_string(outside.join("precious")).unwrap(),
        "keep me\n"
    );
    assert!(fs::symlink_metadata(projects(&w).join(&ghost_id))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn unreadable_project_root_is_kept() {
    if is_root() {
        eprintln!("skipped as root: chmod 000 does not stop root (covered by the non-root run)");
        return;
    }
    let w = World::new(BIN);
    let (dir, id) = project(&w, OsStr::new("p"));
    fs::remove_dir_all(&dir).unwrap();
    let rf = projects(&w).join(&id).join("project-root");
    fs::set_permissions(&rf, fs::Permissions::from_mode(0o000)).unwrap();
    let out = run(&w, &["--gc", "--gc-margin", "0"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("project-root is unreadable"), "{err}");
    assert!(projects(&w).join(&id).is_dir());
}

#[test]
fn a_root_whose_existence_cannot_be_checked_is_kept() {
    if is_root() {
        eprintln!("skipped as root: permissions do not stop root's lstat");
        return;
    }
    let w = World::new(BIN);
    let locked = w.dir("locked");
    let (dir, id) = project(&w, OsStr::new("locked/p"));
    assert!(dir.is_dir());
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
    let out = run(&w, &["--gc", "--gc-margin", "0"]);
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).unwrap();
    let err = stderr(&out);
    assert!(err.contains("cannot tell whether"), "{err}");
    assert!(projects(&w).join(&id).is_dir());
}

#[test]
fn works_through_a_symlinked_state_home() {
    let w = World::new(BIN);
    let real = w.dir("real-state");
    fs::write(real.join("mine"), "not claudebox's\n").unwrap();
    let link = w.root().join("state-link");
    symlink(&real, &link).unwrap();
    let gone = w.dir("gone");
    ok(&w
        .cmd(&gone)
        .env("CLAUDEBOX_HOME", &link)
        .args(["--exec", "true"])
        .output()
        .unwrap());
    settle(&link);
    fs::remove_dir_all(&gone).unwrap();
    let before = snapshot(&w.root());
    let out = w
        .cmd(&w.root())
        .env("CLAUDEBOX_HOME", &link)
        .args(["--gc", "--gc-margin", "0"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("1 of 1 project directories removed"), "{err}");
    let after = snapshot(&w.root());
    let removed: Vec<&Path> = before
        .keys()
        .filter(|p| !after.contains_key(*p))
        .map(PathBuf::as_path)
        .collect();
    assert!(!removed.is_empty());
    for p in &removed {
        assert!(
            p.starts_with(real.join("projects")),
            "{} removed",
            p.display()
        );
        assert_ne!(*p, real.join("projects").as_path());
    }
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::read_to_string(real.join("mine")).unwrap(),
        "not claudebox's\n"
    );
}

#[test]
fn a_projects_dir_that_is_a_symlink_is_refused() {
    let w = World::new(BIN);
    let elsewhere = w.dir("elsewhere");
    let (gone, id) = project(&w, OsStr::new("gone"));
    fs::remove_dir_all(&gone).unwrap();
    fs::rename(projects(&w), elsewhere.join("projects")).unwrap();
    symlink(elsewhere.join("projects"), projects(&w)).unwrap();
    let before = snapshot(&w.root());
    let out = run(&w, &["--gc", "--gc-margin", "0"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is not a directory"), "{err}");
    assert!(elsewhere.join("projects").join(id).is_dir());
    assert_same(&before, &snapshot(&w.root()));
}

/// Waits until `--list` reports no sandbox on `id` (bwrap's pid 1 drops the lock a moment
/// after the command exits).
fn wait_until_idle(w: &World, id: &str) {
    for _ in 0..2000 {
        if row(&list_json(w), id).is_some_and(|r| r["running"] == 0) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("the sandbox on {id} never ended");
}

#[test]
fn keeps_state_in_use_by_a_running_sandbox() {
    let w = World::new(BIN);
    let dir = w.dir("busy");
    let id = id_of(&w, &dir);
    let sandbox = Running::start(&w, &dir);
    // The project root disappears while the agent works in it.
    fs::remove_dir_all(&dir).unwrap();

    for args in [
        &["--gc", "--dry-run", "--gc-margin", "0"][..],
        &["--gc", "--gc-margin", "0"][..],
    ] {
        let out = run(&w, args);
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains(&format!(
                "kept {}: in use by 1 running sandbox",
                projects(&w).join(&id).display()
            )),
            "{err}"
        );
        assert!(projects(&w).join(&id).join("claude-projects").is_dir());
    }
    let r = list_json(&w);
    assert_eq!(row(&r, &id).unwrap()["running"], 1);
    assert_eq!(row(&r, &id).unwrap()["root_exists"], false);

    sandbox.stop();
    wait_until_idle(&w, &id);
    let out = run(&w, &["--gc", "--gc-margin", "0"]);
    assert!(
        stderr(&out).contains("1 of 1 project directories removed"),
        "{}",
        stderr(&out)
    );
    assert!(!projects(&w).join(&id).exists());
}

/// Takes `lock` the way `--gc` (or a registering launch) does.
fn hold_lock(state: &Path) -> nix::fcntl::Flock<fs::File> {
    let f = fs::File::open(state.join("lock")).unwrap();
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .unwrap()
}

/// Waits until some process is blocked on a flock of the file with inode `ino`
/// (/proc/locks shows waiters as `->` lines).
fn wait_for_lock_waiter(ino: u64) {
    for _ in 0..4000 {
        let locks = fs::read_to_string("/proc/locks").unwrap();
        if locks
            .lines()
            .any(|l| l.contains("->") && l.contains(&format!(":{ino} ")))
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("no launch ever waited on the lock");
}

#[test]
fn a_launch_waiting_while_gc_removes_its_state_starts_over() {
    // --gc's side of the protocol, played by the test: hold `lock`, let a launch block on
    // it, move the directory away and delete it, release. The launch must notice and make
    // a fresh state directory that its sandbox really writes to.
    let w = World::new(BIN);
    let dir = w.dir("p");
    launch(&w, &dir);
    let state = projects(&w).join(id_of(&w, &dir));
    let lock = hold_lock(&state);
    let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(state.join("lock")).unwrap());
    let child = w
        .cmd(&dir)
        .args(["--exec", "sh", "-c", "echo hi > ~/.claude/projects/marker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_lock_waiter(ino);
    let trash = projects(&w).join(".gc-test");
    fs::rename(&state, &trash).unwrap();
    fs::remove_dir_all(&trash).unwrap();
    drop(lock);
    let out = child.wait_with_output().unwrap();
    ok(&out);
    settle(&w.state());
    assert_eq!(
        fs::read_to_string(state.join("claude-projects/marker")).unwrap(),
        "hi\n",
        "the sandbox wrote into the removed directory"
    );
    assert!(state.join("project-root").is_file());
    assert!(!trash.exists());
}

#[test]
fn gc_skips_a_project_whose_lock_is_held() {
    // A launch registering holds `lock`: --gc must not wait for it, nor remove.
    let w = World::new(BIN);
    let dir = w.dir("p");
    launch(&w, &dir);
    let state = projects(&w).join(id_of(&w, &dir));
    fs::remove_dir_all(&dir).unwrap();
    let lock = hold_lock(&state);
    let out = run(&w, &["--gc", "--gc-margin", "0"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "kept {}: a sandbox is starting on it",
            state.display()
        )),
        "{err}"
    );
    assert!(state.join("project-root").is_file());
    drop(lock);
    let out = run(&w, &["--gc", "--gc-margin", "0"]);
    assert!(stderr(&out).contains("1 of 1 project directories removed"));
    assert!(!state.exists());
}

/// Sets a file's modification time `secs` seconds into the past.
fn age(path: &Path, secs: u64) {
    let t = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
    fs::File::options()
        .append(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// Issue 15: a missing root is waited for (7 days by default): the first `--gc` only
/// notes when it saw it missing, `--list` and `--dry-run` say until when it is kept, a
/// root that comes back clears the note, and only a root missing (and a project unused)
/// for the whole margin is removed. Control: `--gc-margin 0` removes at once, as `--gc`
/// did before.
#[test]
fn a_missing_root_is_waited_for_before_its_state_is_removed() {
    let w = World::new(BIN);
    let (dir, id) = project(&w, OsStr::new("away"));
    let state = projects(&w).join(&id);
    fs::write(state.join("claude-projects/conversation.jsonl"), "{}\n").unwrap();
    fs::remove_dir_all(&dir).unwrap();

    let before = snapshot(&w.root());
    let dry = stderr(&run(&w, &["--gc", "--dry-run"]));
    assert!(
        dry.contains(&format!(
            "kept {}: project {} is missing (first seen now); removable after ",
            state.display(),
            dir.display()
        )),
        "{dry}"
    );
    assert!(dry.contains("margin 7days (the default)"), "{dry}");
    assert_same(&before, &snapshot(&w.root()));

    let first = run(&w, &["--gc"]);
    let err = stderr(&first);
    assert!(first.status.success(), "{err}");
    assert!(err.contains("0 of 1 project directories removed"), "{err}");
    assert!(state.join("claude-projects/conversation.jsonl").is_file());
    let since = fs::read_to_string(state.join("root-missing-since")).unwrap();
    assert!(since.trim().parse::<u64>().is_ok(), "{since}");
    let again = stderr(&run(&w, &["--gc"]));
    assert!(again.contains("missing since "), "{again}");
    assert!(
        again.contains("(first seen by --gc); removable after"),
        "{again}"
    );

    let rows = list_json(&w);
    let r = row(&rows, &id).unwrap();
    assert_eq!(r["gc"], "waiting", "{r}");
    assert!(
        r["gc_removable_after"].as_str().unwrap().ends_with('Z'),
        "{r}"
    );
    assert!(
        r["gc_reason"]
            .as_str()
            .unwrap()
            .contains("is missing since"),
        "{r}"
    );
    let table = ok(&run(&w, &["--list"]));
    assert!(
        table.contains("  GC  ") && table.contains("after 20"),
        "{table}"
    );

    // The root comes back: the note goes.
    fs::create_dir(&dir).unwrap();
    ok(&run(&w, &["--gc"]));
    assert!(!state.join("root-missing-since").exists());
    assert_eq!(row(&list_json(&w), &id).unwrap()["gc"], "live");

    // Gone again, first seen 8 days ago but used 2 days ago: still kept.
    fs::remove_dir_all(&dir).unwrap();
    ok(&run(&w, &["--gc"]));
    age(&state.join("root-missing-since"), 0);
    let eight_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(8 * 86_400);
    let secs = eight_days_ago
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    fs::write(state.join("root-missing-since"), format!("{secs}\n")).unwrap();
    age(&state.join("lock"), 2 * 86_400);
    let err = stderr(&run(&w, &["--gc"]));
    assert!(err.contains(", used "), "{err}");
    assert!(state.is_dir());
    // Unused for 8 days too: removed.
    age(&state.join("lock"), 8 * 86_400);
    assert_eq!(row(&list_json(&w), &id).unwrap()["gc"], "removable");
    let err = stderr(&run(&w, &["--gc"]));
    assert!(err.contains("1 of 1 project directories removed"), "{err}");
    assert!(!state.exists());

    // Control: with no margin the first --gc removes a project whose root just went.
    let (dir, id) = project(&w, OsStr::new("control"));
    fs::remove_dir_all(&dir).unwrap();
    let err = stderr(&run(&w, &["--gc", "--gc-margin", "0"]));
    assert!(err.contains("1 of 1 project directories removed"), "{err}");
    assert!(!projects(&w).join(&id).exists());
}

/// The margin from the config file, and a bad one named by file, line and column.
#[test]
fn the_margin_comes_from_the_config_file_too() {
    let w = World::new(BIN);
    let (dir, id) = project(&w, OsStr::new("cfg"));
    fs::remove_dir_all(&dir).unwrap();
    let cfg = w.home().join(".config/claudebox");
    fs::create_dir_all(&cfg).unwrap();
    fs::write(cfg.join("config.toml"), "gc_margin = \"fortnight\"\n").unwrap();
    let out = run(&w, &["--gc"]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("config.toml:1:13: gc_margin:"), "{err}");
    assert!(projects(&w).join(&id).is_dir());
    fs::write(cfg.join("config.toml"), "gc_margin = \"0\"\n").unwrap();
    let err = stderr(&run(&w, &["--gc"]));
    assert!(
        err.contains("1 of 1 project directories removed; margin 0 (gc_margin in"),
        "{err}"
    );
    let out = run(&w, &["--gc", "--gc-margin", "soon"]);
    assert!(
        stderr(&out).contains("--gc-margin \"soon\""),
        "{}",
        stderr(&out)
    );
}

/// Issue 15's race: a live project's root is deleted and recreated (a re-clone) while
/// `--gc` runs again and again: no conversation is lost. Control: the same with no
/// margin loses the project's conversations the first time `--gc` sees the root away.
#[test]
fn a_root_deleted_and_recreated_while_gc_runs_loses_nothing() {
    let w = World::new(BIN);
    let (dir, id) = project(&w, OsStr::new("reclone"));
    let state = projects(&w).join(&id);
    let n = 57;
    for i in 0..n {
        fs::write(state.join(format!("claude-projects/c{i}.jsonl")), "{}\n").unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (dir, stop) = (dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut flips = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = fs::remove_dir_all(&dir);
                std::thread::sleep(std::time::Duration::from_millis(2));
                let _ = fs::create_dir(&dir);
                std::thread::sleep(std::time::Duration::from_millis(1));
                flips += 1;
            }
            flips
        })
    };
    let runs = 40;
    let mut saw_missing = 0;
    for _ in 0..runs {
        let err = stderr(&run(&w, &["--gc"]));
        saw_missing += usize::from(err.contains("is missing"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    let _ = fs::create_dir(&dir);
    let left = fs::read_dir(state.join("claude-projects")).map_or(0, |d| d.count());
    println!(
        "gc race: {runs} --gc runs over {flips} delete/recreate cycles, {saw_missing} saw the \
         root missing; {left} of {n} conversations left"
    );
    assert_eq!(left, n, "conversations were lost");
    assert!(saw_missing > 0, "the race never showed gc a missing root");

    // Control.
    fs::remove_dir_all(&dir).unwrap();
    ok(&run(&w, &["--gc", "--gc-margin", "0"]));
    assert!(
        !state.exists(),
        "the control lost nothing: the test cannot fail"
    );
}

/// A root under an empty mount point (a network or removable file system that is not
/// there) is unknown, never gone, whatever the margin. Made for real in a user and mount
/// namespace (`unshare -rm`): an empty tmpfs over the project's parent directory.
/// Control: the same root missing without the mount is removed.
#[test]
fn a_root_under_an_empty_mount_point_is_unknown_not_gone() {
    if std::process::Command::new("unshare")
        .args(["-rm", "true"])
        .status()
        .map_or(true, |s| !s.success())
    {
        println!("SKIP: unshare -rm (user and mount namespaces) is not available here");
        return;
    }
    let w = World::new(BIN);
    let parent = w.dir("netdisk");
    let (proj, id) = project(&w, &parent.join("proj").into_os_string());
    let state = projects(&w).join(&id);
    let gc_in_namespace = |mount: bool| {
        let script = format!(
            "{}exec \"$0\" --gc --gc-margin 0",
            if mount {
                "mount -t tmpfs none \"$1\" && "
            } else {
                ""
            }
        );
        let out = w
            .cmd(&w.root())
            .arg0_unshare(&script, &parent)
            .output()
            .unwrap();
        stderr(&out)
    };
    let err = gc_in_namespace(true);
    assert!(
        err.contains(&format!(
            "kept {}: cannot tell whether {} exists: {} is an empty mount point",
            state.display(),
            proj.display(),
            parent.display()
        )),
        "{err}"
    );
    assert!(state.is_dir());
    // Control: really gone.
    fs::remove_dir_all(&proj).unwrap();
    let err = gc_in_namespace(false);
    assert!(err.contains("1 of 1 project directories removed"), "{err}");
    assert!(!state.exists());
}

trait Unshare {
    fn arg0_unshare(&mut self, script: &str, arg: &Path) -> &mut Self;
}

impl Unshare for std::process::Command {
    /// Runs claudebox (this command's program) through `unshare -rm sh -c SCRIPT BIN ARG`.
    fn arg0_unshare(&mut self, script: &str, arg: &Path) -> &mut Self {
        let mut c = std::process::Command::new("unshare");
        c.args(["-rm", "sh", "-c", script, BIN]).arg(arg);
        c.current_dir(self.get_current_dir().unwrap());
        c.env_clear();
        for (k, v) in self.get_envs() {
            if let Some(v) = v {
                c.env(k, v);
            }
        }
        *self = c;
        self
    }
}

/// Issue 14: a directory the agent planted in its conversations and locked with
/// `chmod 000` (from inside the sandbox, for real) does not stop `--gc`: the state is
/// removed whole and nothing outside it is touched. Control: plain `rm -rf`-style removal
/// (std's `remove_dir_all`) fails on it as an ordinary user.
#[test]
fn gc_removes_what_the_agent_locked_with_chmod_000() {
    let w = World::new(BIN);
    let dir = w.dir("locked");
    let script = "mkdir -p ~/.claude/projects/trap/inner/deeper && echo x > ~/.claude/projects/trap/inner/deeper/f \
                  && chmod 000 ~/.claude/projects/trap/inner/deeper ~/.claude/projects/trap/inner \
                  && chmod 500 ~/.claude/projects/trap";
    ok(&w
        .cmd(&dir)
        .args(["--exec", "sh", "-c", script])
        .output()
        .unwrap());
    settle(&w.state());
    let id = id_of(&w, &dir);
    let state = projects(&w).join(&id);
    let trap = state.join("claude-projects/trap");
    assert_eq!(
        fs::symlink_metadata(trap.join("inner"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0
    );
    fs::remove_dir_all(&dir).unwrap();
    if !is_root() {
        // Control: what gc did before.
        let copy = w.work().join("copy");
        fs::create_dir_all(copy.join("inner/deeper")).unwrap();
        fs::set_permissions(copy.join("inner/deeper"), fs::Permissions::from_mode(0o0)).unwrap();
        fs::set_permissions(copy.join("inner"), fs::Permissions::from_mode(0o0)).unwrap();
        assert!(fs::remove_dir_all(&copy).is_err(), "the control removed it");
        fs::set_permissions(copy.join("inner"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(copy.join("inner/deeper"), fs::Permissions::from_mode(0o700)).unwrap();
    }
    let before = snapshot(&w.work());
    let out = run(&w, &["--gc", "--gc-margin", "0"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("1 of 1 project directories removed"), "{err}");
    assert!(!state.exists());
    let trash: Vec<_> = fs::read_dir(projects(&w)).unwrap().flatten().collect();
    assert!(trash.is_empty(), "left behind: {trash:?}");
    assert_same(&before, &snapshot(&w.work()));
}

/// A tmpfs mounted (for real, on the host) at `dir` for as long as it lives.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path) -> Tmpfs {
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "claudebox-test"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount -t tmpfs {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
    fn unmount(self) {
        drop(self);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Issue 22: a project on a file system mounted by hand (a tmpfs at a mount point that is
/// in no fstab and under no removable-drive base) and since unmounted is unknown to
/// `--gc`, never gone: each launch records the mount point of the root's file system
/// (`root-mount`), and a root missing while that is not mounted is kept. Controls: the
/// same unmounted project without the record (state from before it) is removed, as all
/// were before; and once the file system is mounted again without the project, its
/// state is removed.
#[test]
fn a_root_on_a_file_system_mounted_by_hand_and_unmounted_is_unknown_not_gone() {
    if !is_root() {
        println!("SKIP: mounting a tmpfs on the host needs root (the root run covers this)");
        return;
    }
    let w = World::new(BIN);
    let disk = w.dir("disk");
    let m = Tmpfs::mount(&disk);
    let (proj, id) = project(&w, &disk.join("proj").into_os_string());
    let (_, old_id) = project(&w, &disk.join("old").into_os_string());
    let state = projects(&w).join(&id);
    let old_state = projects(&w).join(&old_id);
    assert_eq!(
        fs::read(state.join("root-mount")).unwrap(),
        disk.as_os_str().as_bytes()
    );
    fs::remove_file(old_state.join("root-mount")).unwrap();
    m.unmount();
    assert!(!proj.exists() && disk.is_dir());

    let err = stderr(&run(&w, &["--gc", "--gc-margin", "0"]));
    assert!(
        err.contains(&format!(
            "kept {}: cannot tell whether {} exists: its file system was mounted at {} at \
             its last launch and is not mounted now",
            state.display(),
            proj.display(),
            disk.display()
        )),
        "{err}"
    );
    assert!(state.join("claude-projects").is_dir());
    let rows = list_json(&w);
    assert_eq!(
        row(&rows, &id).unwrap()["root_exists"],
        serde_json::Value::Null
    );
    // Control: the same root without the record counts as gone (today's rule).
    assert!(err.contains("1 of 2 project directories removed"), "{err}");
    assert!(!old_state.exists(), "{err}");

    // Control: mounted again, and the project is not on it: gone.
    let _m = Tmpfs::mount(&disk);
    fs::write(disk.join("other"), "x").unwrap();
    let err = stderr(&run(&w, &["--gc", "--gc-margin", "0"]));
    assert!(
        err.contains(&format!(
            "removed {} (project {} no longer exists)",
            state.display(),
            proj.display()
        )),
        "{err}"
    );
    assert!(!state.exists());
}
