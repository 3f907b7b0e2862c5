//! No git process on the launch path: `--dry-run` and a real launch find the project root
//! in-process, with a `git` on PATH that records every call and fails, and still agree
//! with what real git says.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BIN;
use lab::*;

/// Installs a `git` first on the world's PATH that logs its arguments to `log` and fails.
fn trap_git(w: &World) -> PathBuf {
    let log = w.root().join("git-calls.log");
    let script = format!(
        "#!/bin/sh\nprintf 'git %s\\n' \"$*\" >> '{}'\nexit 97\n",
        log.display()
    );
    let p = w.bin().join("git");
    fs::write(&p, script).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    log
}

fn git_calls(log: &Path) -> String {
    fs::read_to_string(log).unwrap_or_default()
}

/// A repository, a linked worktree of it, and a deep subdirectory in the worktree.
fn layout(w: &World) -> (PathBuf, PathBuf, PathBuf) {
    let repo = w.dir("repo");
    init_repo(&repo);
    let wt = w.work().join("wt");
    git(
        &repo,
        &["worktree", "add", "-q", "-b", "wt", wt.to_str().unwrap()],
    );
    let deep = wt.join("a/b/c/d/e/f/g/h");
    fs::create_dir_all(&deep).unwrap();
    (repo, wt, deep)
}

#[test]
fn the_trap_catches_a_git_call() {
    // Proves the trap works: a `git` run with the world's PATH lands in the log.
    let w = World::new(BIN);
    let log = trap_git(&w);
    let st = Command::new("sh")
        .args(["-c", "git rev-parse --git-common-dir"])
        .env("PATH", w.path_var())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(97));
    assert_eq!(git_calls(&log), "git rev-parse --git-common-dir\n");
}

#[test]
fn dry_run_calls_no_git_and_agrees_with_git() {
    let w = World::new(BIN);
    let (repo, wt, deep) = layout(&w);
    let log = trap_git(&w);
    for cwd in [&repo, &wt, &deep] {
        let out = dry_run(&w, cwd);
        let root = env_in_dry_run(&out, "CLAUDEBOX_PROJECT_ROOT").expect("root in dry-run");
        assert_eq!(Path::new(&root), git_root(cwd), "from {}", cwd.display());
    }
    assert_eq!(git_calls(&log), "", "claudebox --dry-run ran git");
}

#[test]
fn a_launch_calls_no_git_and_agrees_with_git() {
    let w = World::new(BIN);
    let (_repo, _wt, deep) = layout(&w);
    let log = trap_git(&w);
    let o = w
        .cmd(&deep)
        .args([
            "--exec",
            "sh",
            "-c",
            "printf %s \"$CLAUDEBOX_PROJECT_ROOT\"",
        ])
        .output()
        .unwrap();
    let root = ok(&o);
    assert_eq!(Path::new(&root), git_root(&deep));
    assert_eq!(git_calls(&log), "", "claudebox --exec ran git");
}

/// The PATH trap misses a git run by absolute path; strace sees every execve.
#[test]
fn a_launch_execs_only_bwrap_under_strace() {
    let Some(strace) = which("strace") else {
        eprintln!("strace not found: skipping the execve check (the PATH trap still ran)");
        return;
    };
    let w = World::new(BIN);
    let (_repo, _wt, deep) = layout(&w);
    let trace = w.root().join("execve.trace");
    // The world's environment (HOME, PATH with the fake claude), with strace in front.
    let env = w.cmd(&deep);
    let mut c = Command::new(strace);
    c.current_dir(&deep)
        .env_clear()
        .envs(env.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .args(["-f", "-qq", "-e", "trace=execve", "-o"])
        .arg(&trace)
        .arg(BIN)
        .args(["--exec", "true"]);
    ok(&c.output().unwrap());
    let t = fs::read_to_string(&trace).unwrap();
    let programs: Vec<&str> = t
        .lines()
        .filter(|l| l.contains("execve(\"") && !l.contains("= -1 "))
        .filter_map(|l| l.split('"').nth(1))
        .collect();
    assert!(
        programs.iter().any(|p| p.ends_with("/bwrap")),
        "no bwrap in the trace:\n{t}"
    );
    let git: Vec<_> = programs
        .iter()
        .filter(|p| {
            let name = p.rsplit('/').next().unwrap_or(p);
            name == "git" || name.starts_with("git-")
        })
        .collect();
    assert!(git.is_empty(), "git ran on the launch path: {git:?}\n{t}");
    // claudebox, bwrap (claudebox execs it), the command inside, and claudebox again if
    // it wraps the command: nothing else.
    let others: Vec<_> = programs
        .iter()
        .filter(|p| **p != BIN && !p.ends_with("/bwrap") && !p.ends_with("/true"))
        .collect();
    assert!(
        others.is_empty(),
        "unexpected programs ran: {others:?}\n{t}"
    );
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}
