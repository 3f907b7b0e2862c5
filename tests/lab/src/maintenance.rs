//! Helpers for the --list / --gc / --check tests: launches, project ids, a snapshot of a
//! tree that shows whether anything in it changed, and the state's layout.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use std::io::Write;
use std::process::Stdio;

use crate::{dry_run, env_in_dry_run, ok, spawn_first_line, World};

/// A real launch of `true` in `cwd`: creates (or re-registers) the project's state.
/// Returns once the sandbox has released its registration.
pub fn launch(w: &World, cwd: &Path) {
    ok(&w.cmd(cwd).args(["--exec", "true"]).output().unwrap());
    settle(&w.state());
}

/// Waits until no sandbox holds a registration under `state_home` (bwrap's pid 1, which
/// holds it, exits a moment after the bwrap process the launch exec'd).
pub fn settle(state_home: &Path) {
    for _ in 0..4000 {
        if !any_registration_held(state_home) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("a sandbox under {} never ended", state_home.display());
}

fn any_registration_held(state_home: &Path) -> bool {
    let Ok(projects) = fs::read_dir(state_home.join("projects")) else {
        return false;
    };
    for p in projects.flatten() {
        let Ok(running) = fs::read_dir(p.path().join("running")) else {
            continue;
        };
        for r in running.flatten() {
            let Ok(f) = fs::File::open(r.path()) else {
                continue;
            };
            if nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err() {
                return true;
            }
        }
    }
    false
}

/// The project id claudebox uses for `cwd`.
pub fn id_of(w: &World, cwd: &Path) -> String {
    let out = dry_run(w, cwd);
    env_in_dry_run(&out, "CLAUDEBOX_PROJECT_ID").expect("project id in --dry-run")
}

pub fn projects(w: &World) -> PathBuf {
    w.state().join("projects")
}

pub fn run(w: &World, args: &[&str]) -> Output {
    w.cmd(&w.root()).args(args).output().unwrap()
}

/// `--list --json`, parsed.
pub fn list_json(w: &World) -> Vec<serde_json::Value> {
    let out = ok(&run(w, &["--list", "--json"]));
    serde_json::from_str::<serde_json::Value>(&out)
        .unwrap_or_else(|e| panic!("--list --json is not JSON ({e}):\n{out}"))
        .as_array()
        .expect("an array")
        .clone()
}

pub fn row<'a>(rows: &'a [serde_json::Value], id: &str) -> Option<&'a serde_json::Value> {
    rows.iter().find(|r| r["id"] == id)
}

/// Every path under `root` (symlinks not followed) with what it is: kind, mode, size and
/// content of files, target of symlinks. Two equal snapshots mean nothing changed.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p).unwrap();
        let mode = m.permissions().mode() & 0o7777;
        let what = if m.file_type().is_symlink() {
            format!("symlink -> {:?}", fs::read_link(&p).unwrap())
        } else if m.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
            format!("dir {mode:o}")
        } else {
            let content = fs::read(&p).unwrap_or_default();
            format!("file {mode:o} {:?}", String::from_utf8_lossy(&content))
        };
        out.insert(p, what);
    }
    out
}

/// `snapshot` without the entries under `prefix` (what a removal may take away).
pub fn without(snap: &BTreeMap<PathBuf, String>, prefixes: &[&Path]) -> BTreeMap<PathBuf, String> {
    snap.iter()
        .filter(|(p, _)| !prefixes.iter().any(|x| p.starts_with(x)))
        .map(|(p, v)| (p.clone(), v.clone()))
        .collect()
}

/// Asserts two snapshots are equal, printing the difference.
#[track_caller]
pub fn assert_same(before: &BTreeMap<PathBuf, String>, after: &BTreeMap<PathBuf, String>) {
    let mut diff = Vec::new();
    for (p, v) in before {
        match after.get(p) {
            None => diff.push(format!("gone: {p:?} ({v})")),
            Some(a) if a != v => diff.push(format!("changed: {p:?}: {v} -> {a}")),
            _ => {}
        }
    }
    for (p, v) in after {
        if !before.contains_key(p) {
            diff.push(format!("new: {p:?} ({v})"));
        }
    }
    assert!(diff.is_empty(), "the tree changed:\n{}", diff.join("\n"));
}

pub fn is_root() -> bool {
    nix::unistd::getuid().is_root()
}

/// Bytes of a path, for non-UTF-8 comparisons.
pub fn bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

/// A sandbox that stays up until its stdin closes, and says when it is up.
pub struct Running {
    pub child: std::process::Child,
}

impl Running {
    pub fn start(w: &World, cwd: &Path) -> Running {
        let (child, first) = spawn_first_line(
            w.cmd(cwd)
                .args(["--exec", "sh", "-c", "echo ready; read line"])
                .stdin(Stdio::piped()),
        );
        assert_eq!(first, "ready\n");
        Running { child }
    }

    pub fn stop(mut self) {
        self.child.stdin.take().unwrap().write_all(b"\n").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}
