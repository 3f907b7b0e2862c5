//! Issue 22, item 2: the host's own activity never breaks a launch. A host claude writes
//! `~/.claude/.credentials.json`, `~/.claude/settings.json` and `~/.claude.json` by
//! renaming a new file over the old one; bwrap 0.8 reaches a bound descriptor through
//! `/proc/self/fd/N` by name, so a source replaced between claudebox's open and bwrap's
//! mount used to fail the launch ("Can't find source path /proc/self/fd/N", "Race
//! condition binding dirfd"). claudebox now opens such a source again and starts bwrap
//! again, silently. Figures: `cargo test --test integration host_renames -- --nocapture`.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::BIN;
use lab::{stderr, World};

const LAUNCHES: usize = 100;
const EVERY: Duration = Duration::from_millis(50);

/// The host's files a host claude rewrites by rename.
fn host_files(w: &World) -> [PathBuf; 3] {
    let c = w.home().join(".claude");
    [
        c.join(".credentials.json"),
        c.join("settings.json"),
        w.home().join(".claude.json"),
    ]
}

/// A host-side loop: every 50 ms, a fresh copy of each file renamed over it (as claude's
/// atomic writes do). Returns the stop flag, the count of renames and the thread.
fn renamer(files: [PathBuf; 3]) -> (Arc<AtomicBool>, Arc<AtomicUsize>, thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let (s, n) = (Arc::clone(&stop), Arc::clone(&count));
    let t = thread::spawn(move || {
        let mut i = 0u64;
        while !s.load(Ordering::Relaxed) {
            for f in &files {
                // Beside the file, as claude's own atomic writes do: a launch's listing of
                // ~/.claude may catch the temporary file, gone by the open (skipped then).
                let tmp = f.with_extension(format!("tmp.{i}"));
                fs::write(&tmp, format!("{{\"n\": {i}}}\n")).unwrap();
                fs::rename(&tmp, f).unwrap();
                n.fetch_add(1, Ordering::Relaxed);
            }
            i += 1;
            thread::sleep(EVERY);
        }
    });
    (stop, count, t)
}

fn world() -> (World, PathBuf) {
    let w = World::new(BIN);
    for f in host_files(&w) {
        fs::write(&f, "{}\n").unwrap();
    }
    let dir = w.dir("p");
    (w, dir)
}

fn is_race(err: &str) -> bool {
    err.contains("Race condition binding dirfd")
        || err.contains("Can't find source path /proc/self/fd/")
        || err.contains(" (deleted)\" in mount table")
}

#[test]
fn host_renames_during_launches_never_fail_one() {
    let _heavy = lab::heavy_alone();
    let (w, dir) = world();
    // The project exists before the loop starts (its first launch makes the state).
    let out = w.cmd(&dir).args(["--exec", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let (stop, renames, t) = renamer(host_files(&w));
    let started = Instant::now();
    let mut failed = Vec::new();
    for _ in 0..LAUNCHES {
        let out = w
            .cmd(&dir)
            .args(["--exec", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if !out.status.success() {
            failed.push(stderr(&out));
        }
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    println!(
        "host renames: {LAUNCHES} launches in {:.1}s beside {} host renames, {} failed",
        took.as_secs_f64(),
        renames.load(Ordering::Relaxed),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} failed, first:\n{}",
        failed.len(),
        failed[0]
    );

    // Control: bwrap alone, with the same arrangement (each file opened O_PATH, then
    // bound by descriptor), beside the same loop: the race is real, and bwrap fails.
    let (stop, renames, t) = renamer(host_files(&w));
    let started = Instant::now();
    let mut raced = 0;
    let mut other = Vec::new();
    for _ in 0..LAUNCHES {
        let out = bwrap_by_fd(&host_files(&w));
        let err = stderr(&out);
        if is_race(&err) {
            raced += 1;
        } else if !out.status.success() {
            other.push(err);
        }
    }
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    println!(
        "host renames, control (bwrap alone): {LAUNCHES} runs in {:.1}s beside {} host \
         renames, {raced} failed on a replaced source",
        started.elapsed().as_secs_f64(),
        renames.load(Ordering::Relaxed),
    );
    assert!(other.is_empty(), "{other:?}");
    assert!(raced > 0, "the control never hit the race");
}

/// `bwrap --ro-bind / / --tmpfs /mnt --ro-bind-fd N /mnt/I ... -- true`, each file opened
/// `O_PATH|O_NOFOLLOW` just before, as claudebox opens its sources, and mounted on a
/// target of the sandbox's own, as claudebox's targets are.
fn bwrap_by_fd(files: &[PathBuf]) -> std::process::Output {
    let fds: Vec<OwnedFd> = files.iter().map(|f| open_path(f)).collect();
    let mut c = Command::new("bwrap");
    c.args([
        "--unshare-all",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]);
    c.args(["--tmpfs", "/mnt"]);
    for (i, fd) in fds.iter().enumerate() {
        c.arg("--ro-bind-fd")
            .arg(fd.as_raw_fd().to_string())
            .arg(format!("/mnt/{i}"));
    }
    c.args(["--", "true"]).stdin(Stdio::null());
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    // SAFETY: only fcntl between fork and exec.
    unsafe {
        c.pre_exec(move || {
            for fd in &raw {
                nix::libc::fcntl(*fd, nix::libc::F_SETFD, 0);
            }
            Ok(())
        });
    }
    c.output().unwrap()
}

fn open_path(p: &Path) -> OwnedFd {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_PATH | nix::libc::O_NOFOLLOW)
        .open(p)
        .unwrap()
        .into()
}

/// A host that never stops renaming (no pause at all): a launch that still loses after its
/// tries fails with one line naming the file and saying the host replaced it, and leaves
/// no review for the next launch (no sandbox came up).
#[test]
fn a_host_that_keeps_renaming_gets_one_line_naming_the_file() {
    let _heavy = lab::heavy_alone();
    let (w, dir) = world();
    let out = w.cmd(&dir).args(["--exec", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let creds = host_files(&w)[0].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    let f = creds.clone();
    let t = thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let tmp = f.with_extension("tmp");
            fs::write(&tmp, "{}\n").unwrap();
            fs::rename(&tmp, &f).unwrap();
        }
    });
    let (mut lost, mut ran) = (0, 0);
    for _ in 0..6 {
        let out = w.cmd(&dir).args(["--exec", "true"]).output().unwrap();
        let err = stderr(&out);
        if out.status.success() {
            ran += 1;
            continue;
        }
        lost += 1;
        let lines: Vec<&str> = err.lines().filter(|l| !l.contains("limits:")).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(
            lines[0].contains(&*creds.to_string_lossy())
                && lines[0].contains("was replaced on the host while the sandbox started"),
            "{err}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    println!(
        "a host renaming without pause: {lost} of 6 launches lost after their tries, {ran} ran"
    );
    let out = w.cmd(&dir).args(["--exec", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("review"), "{}", stderr(&out));
}
