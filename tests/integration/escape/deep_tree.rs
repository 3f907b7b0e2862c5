//! Host-side walks over what a sandbox writes, against a chain of 8,000 directories the
//! agent makes (by descriptor: no path is that long; 8,000 is past the 5,400 levels where
//! the recursive walk overflowed a debug build's stack, and past the open-file limit of
//! the open-file limit (1,024) `--gc` runs with here; the helper's first runs used
//! 30,000, five times as slow). The exit review walks the project,
//! and `--gc` empties the conversations: each was recursive with no bound, one stack frame
//! and one descriptor per level. Measured before the fix: the launcher's exit review
//! overflowed its stack (SIGABRT), left its pending record, and every later launch of
//! the project, `--list` (all projects) and `--check` aborted the same way; `--gc` of
//! the project aborted too. Now the review walks with a stack of its own and moves a
//! changed tree deeper than 256 levels aside whole, and gc empties any depth with at most
//! 64 descriptors. Control: `CLAUDEBOX_TEST_UNBOUNDED_WALKS` (debug builds) has gc hold a
//! descriptor per level as before, and it fails. The recursive review walk is gone from
//! the code, so the review's control is the plant past the bound surviving without the
//! review (`project_files`' deep tree, `--writable-project-config`). The review's
//! launches run with the open-files limit raised to the hard one (see [`nofile`]).

use super::*;

/// `python3 -c CHAIN DIR`: 8,000 directories `d/d/...` under DIR, one file in each.
const CHAIN: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
for i in range(8000):
    os.mkdir("d", dir_fd=fd)
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = nfd
print("ATTEMPT-RAN")
"#;

/// `rm -rf` (fts: any depth); std's `remove_dir_all`, which the world's temporary
/// directory uses when it goes, is recursive and overflows a test thread's stack on the
/// chain.
/// A few tries: a sandbox whose launcher aborted may still be going away.
fn rm_rf(p: &Path) {
    let mut o = Command::new("rm").arg("-rf").arg(p).output().unwrap();
    for _ in 0..10 {
        if o.status.success() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        o = Command::new("rm").arg("-rf").arg(p).output().unwrap();
    }
    assert!(o.status.success(), "rm -rf: {}", stderr(&o));
}

/// Runs `c` with its open-files limit at `soft` (at most the hard one): the hard one for
/// the review (root's here is 20,000; an ordinary user's 1,024 ends the unbounded walk
/// with EMFILE at about 1,000 levels, before the stack: the user whose limit is raised, as
/// in many containers, is the one the attempt reaches), 1,024 (the usual default) for gc.
fn nofile(c: &mut Command, soft: u64) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only getrlimit and setrlimit run between fork and exec, both plain
    // system calls that allocate nothing.
    unsafe {
        c.pre_exec(move || {
            use nix::sys::resource::{getrlimit, setrlimit, Resource};
            let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
            setrlimit(Resource::RLIMIT_NOFILE, soft.min(hard), hard)?;
            Ok(())
        })
    }
}

fn world() -> (World, PathBuf) {
    let w = World::new(BIN);
    let p = w.dir("deep");
    init_repo(&p);
    (w, p)
}

/// The review: the chain in the project. Whether the launch or the `--list` after it
/// failed (aborted), and what they said.
fn review() -> (bool, String) {
    let (w, p) = world();
    let mut c = w.cmd(&p);
    c.args(["--exec", "python3", "-c", CHAIN, "."]);
    let launch = nofile(&mut c, u64::MAX).output().unwrap();
    let list = nofile(w.cmd(&p).arg("--list"), u64::MAX).output().unwrap();
    let failed = !launch.status.success() || !list.status.success();
    rm_rf(&p);
    // The chain, moved aside, is in the project's state now.
    rm_rf(&w.state());
    let said = format!(
        "launch {:?}: {}\n--list {:?}: {}",
        launch.status,
        stderr(&launch).lines().last().unwrap_or(""),
        list.status,
        stderr(&list).lines().last().unwrap_or("")
    );
    (failed, said)
}

/// `--gc`: the chain in the conversations (`~/.claude/projects` inside), the project then
/// gone. Whether gc failed to remove its state, and what it said.
fn gc(unbounded: bool) -> (bool, String) {
    let (w, p) = world();
    let o = w
        .cmd(&p)
        .args(["--exec", "sh", "-c"])
        .arg(format!(
            "mkdir -p \"$HOME/.claude/projects/x\" && python3 -c {} \"$HOME/.claude/projects/x\"",
            sq(CHAIN)
        ))
        .output()
        .unwrap();
    assert!(stdout(&o).contains("ATTEMPT-RAN"), "{}", stderr(&o));
    rm_rf(&p);
    let mut c = w.cmd(&w.work());
    c.args(["--gc", "--gc-margin", "0"]);
    // At the usual open-file limit (1,024; a shell's here may be 20,000, past the chain):
    // one descriptor a level, as before, runs out of them.
    nofile(&mut c, 1024);
    if unbounded {
        c.env("CLAUDEBOX_TEST_UNBOUNDED_WALKS", "1");
    }
    let out = c.output().unwrap();
    let left = fs::read_dir(w.state().join("projects"))
        .map(|d| d.count())
        .unwrap_or(0);
    rm_rf(&w.state());
    (
        !out.status.success() || left != 0,
        format!("gc {:?}, {left} left: {}", out.status, stderr(&out)),
    )
}

const REVIEW: &str =
    "a chain of 8,000 directories in the project aborts the exit review, later launches and --list";
const GC: &str = "a chain of 8,000 directories in the conversations makes --gc fail";

pub(super) fn attempts() -> Vec<(&'static str, bool)> {
    let (r, said) = review();
    eprintln!("{REVIEW}: {said}");
    let (g, said) = gc(false);
    eprintln!("{GC}: {said}");
    vec![(REVIEW, r), (GC, g)]
}

pub(super) fn controls() {
    let (g, said) = gc(true);
    assert!(g, "control (gc): {said}");
}
