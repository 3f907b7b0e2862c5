//! `--list`: one row per project directory, checked against the real state on disk (du,
//! stat) and against real running sandboxes.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use crate::BIN;
use lab::maintenance::*;
use lab::{git, init_repo, ok, stderr, stdout, World};

/// `du -s -B1`: bytes used on disk, hard links once, symlinks not followed.
fn du(path: &Path) -> u64 {
    let o = Command::new("du")
        .args(["-s", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `claudebox ARGS` (a `--list --json` variant), parsed.
fn json_of(w: &World, args: &[&str]) -> Vec<serde_json::Value> {
    let out = ok(&run(w, args));
    serde_json::from_str::<serde_json::Value>(&out)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// Bytes on disk under `p` counted by paths, as `--list` did before issue 22: every
/// directory read by its full path, so nothing below PATH_MAX is reached.
fn by_paths(p: &Path) -> u64 {
    let mut n = 0;
    let Ok(rd) = fs::read_dir(p) else { return 0 };
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        n += m.blocks() * 512;
        if m.is_dir() {
            n += by_paths(&e.path());
        }
    }
    n
}

/// Issue 22: every byte of a project's state is counted, however deep. The agent plants
/// 4 MiB at the bottom of a chain of directories 10,000 bytes deep (more than twice
/// PATH_MAX) in its `~/.claude` (the project's `claude-config/`), from inside, by
/// `mkdirat` and `openat` (python's `dir_fd`). `--list --sizes` counts it (equal to `du`, which walks by
/// descriptors too). Control: the same state counted by paths, as `--list` did before,
/// misses the 4 MiB.
#[test]
fn sizes_count_data_nested_deeper_than_path_max() {
    let w = World::new(BIN);
    let p = w.dir("deep");
    let plant = r#"
import os
fd = os.open(os.path.expanduser("~/.claude"), os.O_RDONLY | os.O_DIRECTORY)
name = "d" * 100
for _ in range(100):
    os.mkdir(name, dir_fd=fd)
    fd2 = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    os.close(fd)
    fd = fd2
f = os.open("data", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
os.write(f, os.urandom(4 << 20))
os.close(f)
print("PLANTED")
"#;
    let out = ok(&w
        .cmd(&p)
        .args(["--exec", "python3", "-c", plant])
        .output()
        .unwrap());
    assert!(out.contains("PLANTED"), "{out}");
    settle(&w.state());
    let id = id_of(&w, &p);
    let dir = projects(&w).join(&id);
    let rows = json_of(&w, &["--list", "--json", "--sizes"]);
    let size = row(&rows, &id).unwrap()["size_bytes"].as_u64().unwrap();
    assert!(size > 4 << 20, "{size}");
    assert_eq!(size, du(&dir));
    // Control: by paths the data is out of reach.
    let old = by_paths(&dir);
    assert!(old < 1 << 20, "the path walk counted {old}");
    assert!(size - old >= 4 << 20, "{size} against {old}");
}

#[test]
fn one_row_per_project_with_root_existence_size_and_last_use() {
    let w = World::new(BIN);
    let repo = w.work().join("repo");
    init_repo(&repo);
    let wt = w.work().join("repo-wt");
    git(&repo, &["worktree", "add", "-q", wt.to_str().unwrap()]);
    let plain = w.dir("plain");
    let gone = w.dir("gone");
    for d in [&repo, &wt, &plain, &gone] {
        launch(&w, d);
    }
    // The agent writes a conversation, so sizes differ.
    ok(&w
        .cmd(&plain)
        .args([
            "--exec",
            "sh",
            "-c",
            "mkdir -p ~/.claude/projects/x && head -c 100000 /dev/zero > ~/.claude/projects/x/s.jsonl",
        ])
        .output()
        .unwrap());
    let ids = [id_of(&w, &repo), id_of(&w, &plain), id_of(&w, &gone)];
    assert_eq!(
        id_of(&w, &wt),
        ids[0],
        "a worktree is its repository's project"
    );
    fs::remove_dir_all(&gone).unwrap();

    let rows = list_json(&w);
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let sized = json_of(&w, &["--list", "--json", "--sizes"]);
    let roots = [
        fs::canonicalize(repo.join(".git")).unwrap(),
        plain.clone(),
        gone.clone(),
    ];
    for (id, root) in ids.iter().zip(&roots) {
        let r = row(&rows, id).unwrap_or_else(|| panic!("no row for {id}"));
        let dir = projects(&w).join(id);
        assert_eq!(r["root"], root.to_str().unwrap());
        assert_eq!(r["root_exists"], root.exists());
        assert_eq!(r["state_dir"], dir.to_str().unwrap());
        // Sizes only on request (--sizes).
        assert!(r["size_bytes"].is_null(), "{id}");
        assert_eq!(row(&sized, id).unwrap()["size_bytes"], du(&dir), "{id}");
        let lock_mtime = fs::metadata(dir.join("lock")).unwrap().mtime();
        assert_eq!(r["last_used_unix"], lock_mtime, "{id}");
        assert_eq!(r["running"], 0);
        assert_eq!(r["sessions"], serde_json::json!([]));
        assert!(r.get("root_bytes_hex").is_none());
    }
    assert!(
        row(&sized, &ids[1]).unwrap()["size_bytes"]
            .as_u64()
            .unwrap()
            > 100_000
    );

    // The table: a header and one line per project, ids and roots in it.
    let table = ok(&run(&w, &["--list"]));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(lines[0].starts_with("ID"), "{table}");
    for (id, root) in ids.iter().zip(&roots) {
        let line = lines.iter().find(|l| l.starts_with(id.as_str())).unwrap();
        assert!(line.ends_with(root.to_str().unwrap()), "{line}");
        let exists = if root.exists() { " yes " } else { " no " };
        assert!(line.contains(exists), "{line}");
    }
}

#[test]
fn a_launch_updates_last_used() {
    let w = World::new(BIN);
    let p = w.dir("p");
    launch(&w, &p);
    let id = id_of(&w, &p);
    let lock = projects(&w).join(&id).join("lock");
    let o = Command::new("touch")
        .args(["-d", "2001-02-03 04:05:06 UTC"])
        .arg(&lock)
        .output()
        .unwrap();
    assert!(o.status.success());
    let r = list_json(&w);
    assert_eq!(row(&r, &id).unwrap()["last_used"], "2001-02-03T04:05:06Z");
    assert_eq!(row(&r, &id).unwrap()["last_used_unix"], 981_173_106);
    launch(&w, &p);
    let r = list_json(&w);
    assert!(row(&r, &id).unwrap()["last_used_unix"].as_u64().unwrap() > 981_173_106);
}

#[test]
fn odd_roots_are_exact_in_json_and_one_line_in_the_table() {
    let w = World::new(BIN);
    let odd = w.work().join(OsStr::from_bytes(b"caf\xe9\tx"));
    let nl = w.work().join("two\nlines");
    for d in [&odd, &nl] {
        fs::create_dir_all(d).unwrap();
        launch(&w, d);
    }
    let rows = list_json(&w);
    let odd_row = row(&rows, &id_of(&w, &odd)).unwrap();
    assert_eq!(odd_row["root_bytes_hex"], hex::encode(bytes(&odd)));
    assert_eq!(odd_row["root"], odd.to_string_lossy().as_ref());
    let nl_row = row(&rows, &id_of(&w, &nl)).unwrap();
    assert_eq!(nl_row["root"], nl.to_str().unwrap());
    assert!(nl_row.get("root_bytes_hex").is_none());

    let table = ok(&run(&w, &["--list"]));
    assert_eq!(table.lines().count(), 3, "{table}");
    assert!(table.contains("caf\\xe9\\tx\n"), "{table}");
    assert!(table.contains("two\\nlines\n"), "{table}");
}

#[test]
fn counts_running_sandboxes_and_ignores_stale_registrations() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let id = id_of(&w, &p);
    let sandboxes = [Running::start(&w, &p), Running::start(&w, &p)];
    // One slot per sandbox, and a registration left by a sandbox that is gone (an older
    // claudebox named them by instance id): its file exists, nobody holds it.
    let running = projects(&w).join(&id).join("running");
    fs::write(running.join("00000000000000000000000000000000"), "").unwrap();
    let names = |dir: &std::path::Path| {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let before = names(&running);
    assert_eq!(before, ["0", "00000000000000000000000000000000", "1"]);

    assert_eq!(row(&list_json(&w), &id).unwrap()["running"], 2);
    let table = ok(&run(&w, &["--list"]));
    let line = table.lines().find(|l| l.starts_with(&id)).unwrap();
    assert_eq!(line.split_whitespace().nth(1), Some("2"), "{line}");
    // --list changes nothing.
    assert_eq!(names(&running), before);

    // The agent inside cannot see or drop the lock: no descriptor of it reaches it.
    let fds = ok(&w
        .cmd(&p)
        .args([
            "--exec",
            "sh",
            "-c",
            "for f in /proc/$$/fd/*; do echo \"$f $(readlink \"$f\")\"; done",
        ])
        .output()
        .unwrap());
    assert!(fds.lines().count() >= 3, "{fds}");
    assert!(
        !fds.contains("/projects/"),
        "a state file reached the agent:\n{fds}"
    );
    // It ran beside the two others: a third slot.
    let slots = names(&running);
    assert_eq!(slots, ["0", "00000000000000000000000000000000", "1", "2"]);

    for s in sandboxes {
        s.stop();
    }
    let mut idle = false;
    for _ in 0..2000 {
        if row(&list_json(&w), &id).unwrap()["running"] == 0 {
            idle = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(idle, "the sandboxes' registrations outlived them");
    // The next launch takes a free slot again: it creates no file (a file creation is a
    // journalled write, the launch's most expensive system call), and the sandboxes
    // that ended left nothing that counts.
    let sandbox = Running::start(&w, &p);
    assert_eq!(names(&running), slots);
    assert_eq!(row(&list_json(&w), &id).unwrap()["running"], 1);
    sandbox.stop();
}

#[test]
fn empty_or_missing_state_and_bad_arguments() {
    let w = World::new(BIN);
    let o = run(&w, &["--list", "--json"]);
    assert_eq!(ok(&o).trim(), "[]");
    let o = run(&w, &["--list"]);
    assert!(o.status.success());
    assert!(stdout(&o).is_empty());
    assert!(stderr(&o).contains("no project state"));
    assert!(!w.state().exists(), "--list created the state directory");

    for args in [
        &["--json"][..],
        &["--list", "extra"],
        &["--list", "--exec", "true"],
        &["--gc", "--list"],
        &["--check", "--gc"],
        &["--list", "--dry-run"],
    ] {
        let o = run(&w, args);
        assert!(!o.status.success(), "{args:?} was accepted");
        let err = stderr(&o);
        assert!(
            err.starts_with("claudebox: ") && err.lines().count() == 1,
            "{err}"
        );
        assert!(!w.state().exists());
    }
}

#[test]
fn list_and_gc_need_no_claude() {
    let w = World::new(BIN);
    let p = w.dir("p");
    launch(&w, &p);
    fs::remove_file(w.bin().join("claude")).unwrap();
    let rows = list_json(&w);
    assert_eq!(rows.len(), 1);
    assert!(run(&w, &["--gc", "--dry-run"]).status.success());
}

/// `--list` shows each project's last conversation (`claudebox --resume <uuid>` from the
/// project continues it; claude's own hint `claude --resume` fails on the host). Only a
/// regular `<uuid>.jsonl` counts: names the agent plants are never printed.
#[test]
fn the_last_conversation_of_each_project_is_listed() {
    let w = World::new(BIN);
    w.install_claude(lab::FAKE_CLAUDE_SESSIONS);
    let repo = w.work().join("repo");
    init_repo(&repo);
    let first = "11111111-1111-4111-8111-111111111111";
    let last = "22222222-2222-4222-8222-222222222222";
    for u in [first, last] {
        ok(&w
            .cmd(&repo)
            .args(["--session-id", u, "-p", "hi"])
            .output()
            .unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let id = id_of(&w, &repo);
    let conv = projects(&w).join(&id).join("claude-projects");
    let dir = fs::read_dir(&conv).unwrap().next().unwrap().unwrap().path();
    // Planted later, by the agent: not a UUID, and a symlink with a UUID's name.
    fs::write(dir.join("evil\x1b[31m.jsonl"), "{}").unwrap();
    std::os::unix::fs::symlink(
        "/etc/passwd",
        dir.join("33333333-3333-4333-8333-333333333333.jsonl"),
    )
    .unwrap();
    let table = ok(&w.cmd(&repo).arg("--list").output().unwrap());
    assert!(
        table
            .lines()
            .any(|l| l.contains(&format!("last conversation\t{last}\t"))),
        "{table}"
    );
    assert!(!table.contains('\x1b'), "{table:?}");
    let rows = list_json(&w);
    let r = row(&rows, &id).unwrap();
    assert_eq!(r["last_conversation"]["uuid"], last, "{r}");
    assert!(r["last_conversation"]["time"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    // A project without conversations has none.
    let plain = w.dir("plain");
    ok(&w.cmd(&plain).args(["--exec", "true"]).output().unwrap());
    let rows = list_json(&w);
    assert!(row(&rows, &id_of(&w, &plain)).unwrap()["last_conversation"].is_null());
}

/// Issue 22: `--list` reads the summary the launcher of a project's last sandbox left
/// (`list-summary.json`) instead of its conversations directory, only while it holds.
/// That it is read at all: a summary changed on disk (same `lock` time) is what `--list`
/// shows, so an invalidation that failed would show a stale conversation. It stops
/// holding when `lock` is touched (a launch by a claudebox that does not know the file),
/// for `--list --sizes` (which reads everything), while a sandbox runs (its registration
/// removed it), and after a launch killed mid-way (none is written): then the
/// directories are read and the new conversation shows.
#[test]
fn the_list_summary_holds_until_the_next_launch_and_no_longer() {
    let w = World::new(BIN);
    w.install_claude(lab::FAKE_CLAUDE_SESSIONS);
    let repo = w.work().join("repo");
    init_repo(&repo);
    let [a, b, d, forged] = [
        "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa",
        "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb",
        "dddddddd-dddd-4ddd-8ddd-dddddddddddd",
        "ffffffff-ffff-4fff-8fff-ffffffffffff",
    ];
    let launch_session = |u: &str| {
        ok(&w
            .cmd(&repo)
            .args(["--session-id", u, "-p", "hi"])
            .output()
            .unwrap());
    };
    let last = |args: &[&str]| -> String {
        let rows = json_of(&w, args);
        row(&rows, &id_of(&w, &repo)).unwrap()["last_conversation"]["uuid"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    };
    launch_session(a);
    let state = projects(&w).join(id_of(&w, &repo));
    let summary = state.join("list-summary.json");
    let forge = |real: &str| {
        let text = fs::read_to_string(&summary).unwrap();
        assert!(text.contains(real), "{text}");
        // Written in place: `lock` keeps its time, so the summary still holds.
        fs::write(&summary, text.replace(real, forged)).unwrap();
    };
    assert_eq!(last(&["--list", "--json"]), a);
    forge(a);
    assert_eq!(
        last(&["--list", "--json"]),
        forged,
        "the summary is not read"
    );
    // --sizes reads the directories.
    assert_eq!(last(&["--list", "--json", "--sizes"]), a);
    // `lock` touched: the summary no longer holds.
    let lock = fs::File::open(state.join("lock")).unwrap();
    lock.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(1))
        .unwrap();
    assert_eq!(last(&["--list", "--json"]), a);

    // The next launch: a new summary, with its conversation.
    launch_session(b);
    assert_eq!(last(&["--list", "--json"]), b);
    forge(b);
    assert_eq!(last(&["--list", "--json"]), forged);
    // A launch killed once its conversation is written: its registration removed the
    // summary and nothing wrote one again, so the directories are read.
    let mut child = w
        .cmd(&repo)
        .args(["--session-id", d, "-p", "hi"])
        .env("FAKE_CLAUDE_SCRIPT", "sleep 600")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let transcript = fs::read_dir(state.join("claude-projects"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join(format!("{d}.jsonl"));
    let t = std::time::Instant::now();
    while !transcript.exists() {
        assert!(t.elapsed().as_secs() < 60, "the killed launch never wrote");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!summary.exists(), "a summary while a sandbox runs");
    assert_ne!(last(&["--list", "--json"]), forged);
    child.kill().unwrap();
    child.wait().unwrap();
    let t = std::time::Instant::now();
    while row(&list_json(&w), &id_of(&w, &repo)).unwrap()["running"] != 0 {
        assert!(t.elapsed().as_secs() < 30, "the killed sandbox still runs");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!summary.exists());
    assert_eq!(last(&["--list", "--json"]), d);
}

/// Sandboxes started at once in `dirs` (one per entry; an entry may repeat), each up until
/// its stdin closes: the children and the seconds until the last said it was up.
fn start_at_once(w: &World, dirs: &[std::path::PathBuf]) -> (Vec<std::process::Child>, f64) {
    use std::io::BufRead;
    use std::process::Stdio;
    let t0 = std::time::Instant::now();
    let mut children: Vec<_> = dirs
        .iter()
        .map(|d| {
            w.cmd(d)
                .args(["--exec", "sh", "-c", "echo ready; read line"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run claudebox")
        })
        .collect();
    let mut failed = Vec::new();
    for c in &mut children {
        let mut line = String::new();
        let _ = std::io::BufReader::new(c.stdout.as_mut().unwrap()).read_line(&mut line);
        if line != "ready\n" {
            failed.push(c.id());
        }
    }
    let up = t0.elapsed().as_secs_f64();
    if !failed.is_empty() {
        let errs: Vec<String> = children
            .into_iter()
            .filter(|c| failed.contains(&c.id()))
            .take(3)
            .map(|mut c| {
                drop(c.stdin.take());
                stderr(&c.wait_with_output().unwrap())
            })
            .collect();
        panic!(
            "{} of {} sandboxes did not come up:\n{}",
            failed.len(),
            dirs.len(),
            errs.join("\n")
        );
    }
    (children, up)
}

fn stop_all(children: Vec<std::process::Child>) {
    for mut c in children {
        use std::io::Write;
        let _ = c.stdin.take().unwrap().write_all(b"\n");
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
}

/// N sandboxes of one project started at once all come up, each on its own slot, and
/// `--list` counts every one (issue 36: nothing lost). Printed: how long they took to
/// come up against N sandboxes over N projects, each counted once too (before the fix,
/// 38.5 s against 2.4 s at N = 200, debug build: each launch read `/proc/locks` once per
/// sandbox running; `CLAUDEBOX_TEST_SANDBOXES=200` for BENCHMARKS.md's N).
#[test]
fn many_sandboxes_of_one_project_all_come_up_and_are_counted() {
    let _heavy = lab::heavy();
    let n: usize = std::env::var("CLAUDEBOX_TEST_SANDBOXES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let w = World::new(BIN);
    let one = w.dir("one");
    let many: Vec<_> = (0..n).map(|i| w.dir(&format!("p{i}"))).collect();
    // Each project's state made once before (a first launch's setup is not measured).
    launch(&w, &one);
    for p in &many {
        launch(&w, p);
    }

    let (children, one_s) = start_at_once(&w, &vec![one.clone(); n]);
    let rows = list_json(&w);
    assert_eq!(row(&rows, &id_of(&w, &one)).unwrap()["running"], n, "lost");
    let running = projects(&w).join(id_of(&w, &one)).join("running");
    assert_eq!(fs::read_dir(&running).unwrap().count(), n, "one slot each");
    stop_all(children);

    let (children, many_s) = start_at_once(&w, &many);
    let rows = list_json(&w);
    for p in &many {
        assert_eq!(row(&rows, &id_of(&w, p)).unwrap()["running"], 1);
    }
    stop_all(children);
    lab::figure!(
        "{n} sandboxes up at once: one project {one_s:.2} s, {n} projects {many_s:.2} s \
         ({:.2}x)",
        one_s / many_s
    );
}
