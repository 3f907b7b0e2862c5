//! `cargo bench --bench review`: the exit review's cost, printed as figures.
//!
//! 1. the walk alone (`state::review::scan`) over a 100,000-file project (1,000
//!    directories of 100 files, three levels, a `.envrc`, `.claude/settings.json` and
//!    nested `.git` among them, all older than the launch), warm cache, median of 20;
//!    and the same with 10 entries planted after the launch point (found: 10);
//! 2. the time to exit of `claudebox --exec true` in that project, with the review and
//!    with `--writable-project-config` (none), interleaved, medians of 20;
//! 3. the supervising claudebox's resident memory (VmRSS) while `--exec sleep` runs.
//!
//! Needs bwrap and git; fixtures under $TMPDIR, removed at the end.

// A bench: a panic on an unexpected None or Err is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use claudebox::state::review::{self, walk::Since};

const BIN: &str = env!("CARGO_BIN_EXE_claudebox");

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn since_now(dir: &Path) -> Since {
    let f = dir.join(".since");
    fs::write(&f, "").unwrap();
    Since::of(&nix::sys::stat::stat(&f).unwrap())
}

fn main() {
    let root = tempfile::tempdir().unwrap();
    let proj = root.path().join("proj");
    let mut files = 0;
    for a in 0..10 {
        for b in 0..10 {
            for c in 0..10 {
                let d = proj.join(format!("a{a}/b{b}/c{c}"));
                fs::create_dir_all(&d).unwrap();
                for f in 0..100 {
                    fs::write(d.join(format!("f{f}.rs")), "").unwrap();
                    files += 1;
                }
                if c == 0 {
                    fs::write(d.join(".envrc"), "").unwrap();
                    fs::create_dir_all(d.join(".claude")).unwrap();
                    fs::write(d.join(".claude/settings.json"), "{}").unwrap();
                }
            }
        }
    }
    Command::new("git")
        .args(["init", "-q"])
        .current_dir(&proj)
        .status()
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let since = since_now(root.path());
    let target = review::Target {
        work_tree: proj.as_os_str().as_encoded_bytes().to_vec(),
        common_dir: None,
        git_dir: None,
        writable: Vec::new(),
        covered: Vec::new(),
    };
    let mut times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let (n, _) = review::scan(&target, since);
        times.push(t.elapsed());
        assert_eq!(n, 0);
    }
    println!(
        "walk of {files} files (1,000 dirs), nothing new: median {:.1} ms",
        median(times).as_secs_f64() * 1e3
    );
    for i in 0..10 {
        fs::write(proj.join(format!("a{i}/b1/.mcp.json")), "{}").unwrap();
    }
    let mut times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let (n, _) = review::scan(&target, since);
        times.push(t.elapsed());
        assert_eq!(n, 10);
    }
    println!(
        "walk of {files} files, 10 planted: median {:.1} ms",
        median(times).as_secs_f64() * 1e3
    );
    for i in 0..10 {
        fs::remove_file(proj.join(format!("a{i}/b1/.mcp.json"))).unwrap();
    }

    let env = |c: &mut Command| {
        c.current_dir(&proj)
            .env("HOME", root.path().join("home"))
            .env("CLAUDEBOX_HOME", root.path().join("state"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };
    fs::create_dir_all(root.path().join("home")).unwrap();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        for opt_out in [false, true] {
            let mut c = Command::new(BIN);
            env(&mut c);
            if opt_out {
                c.arg("--writable-project-config");
            }
            let t = Instant::now();
            assert!(c.args(["--exec", "true"]).status().unwrap().success());
            if opt_out {
                without.push(t.elapsed());
            } else {
                with.push(t.elapsed());
            }
        }
    }
    println!(
        "claudebox --exec true in it: {:.1} ms with the review, {:.1} ms without (medians)",
        median(with).as_secs_f64() * 1e3,
        median(without).as_secs_f64() * 1e3
    );

    let mut c = Command::new(BIN);
    env(&mut c);
    let mut child = c.args(["--exec", "sleep", "1"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let status = fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or("VmRSS: ?")
        .to_string();
    child.wait().unwrap();
    println!("the supervising claudebox while the sandbox runs: {rss}");
}
