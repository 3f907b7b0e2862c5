//! `cargo bench --bench credsync`: the credentials sync at scale and under a writer.
//!
//! 1. 500 sync processes of one user without inotify (`--watch poll`, what a launch past
//!    the user's `fs.inotify.max_user_instances` runs), each holding its own copy of the
//!    login: after one host refresh (by rename), the time until all 500 copies hold it,
//!    and the CPU all 500 use in 10 s idle;
//! 2. a real sandbox whose agent rewrites its credentials file in a loop for 10 s: the
//!    CPU the host-side sync process uses, its copies, and the share of time the host's
//!    refresh lock (`.oauth_refresh.lock`) exists (sampled every 0.2 ms).
//!
//! Needs bwrap and git; fixtures under $TMPDIR, removed at the end.

// A bench: a panic on an unexpected None or Err is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_claudebox");

fn creds(token: &str, expires: u64) -> String {
    format!("{{\"claudeAiOauth\":{{\"accessToken\":\"{token}\",\"refreshToken\":\"r-{token}\",\"expiresAt\":{expires}}}}}")
}

/// The time `pid` (all its threads) spent on a CPU, in ns (`/proc/PID/task/*/schedstat`).
fn cpu_ticks(pid: u32) -> u64 {
    fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|t| {
                let s = fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
                s.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum()
        })
        .unwrap_or(0)
}

fn ticks_per_s() -> f64 {
    1e9
}

fn sync_process(bound: &fs::File, host: &Path, login: &Path) -> Child {
    let fd = bound.as_raw_fd();
    let mut c = Command::new(BIN);
    c.args([
        "--internal-credentials-sync",
        "--instance",
        "bench",
        "--host",
    ])
    .arg(host)
    .arg("--login")
    .arg(login)
    .args(["--watch", "poll"])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    // SAFETY: dup2 only.
    unsafe {
        c.pre_exec(move || {
            if (fd != 3 && nix::libc::dup2(fd, 3) < 0)
                || nix::libc::fcntl(3, nix::libc::F_SETFD, 0) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.spawn().unwrap()
}

fn five_hundred() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("claude");
    fs::create_dir(&dir).unwrap();
    let host = dir.join(".credentials.json");
    fs::write(&host, creds("old", 1)).unwrap();
    let login = d.path().join("login");
    let mut kids = Vec::new();
    let mut files = Vec::new();
    for i in 0..500 {
        let p = d.path().join(format!("b{i}"));
        fs::write(&p, creds("old", 1)).unwrap();
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        kids.push(sync_process(&f, &host, &login));
        files.push(p);
    }
    std::thread::sleep(Duration::from_secs(3));
    let tmp = dir.join("t");
    fs::write(&tmp, creds("new", 2)).unwrap();
    fs::rename(&tmp, &host).unwrap();
    let t = Instant::now();
    let mut left: Vec<_> = files.clone();
    while !left.is_empty() && t.elapsed() < Duration::from_secs(30) {
        left.retain(|p| {
            !fs::read_to_string(p)
                .unwrap_or_default()
                .contains("\"new\"")
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    let all = t.elapsed();
    println!(
        "500 polling syncs: all in step {:.2} s after the host's refresh ({} left behind)",
        all.as_secs_f64(),
        left.len()
    );
    let before: u64 = kids.iter().map(|k| cpu_ticks(k.id())).sum();
    std::thread::sleep(Duration::from_secs(10));
    let after: u64 = kids.iter().map(|k| cpu_ticks(k.id())).sum();
    println!(
        "500 polling syncs idle: {:.2}% of one CPU in all ({:.4}% each)",
        (after - before) as f64 / ticks_per_s() / 10.0 * 100.0,
        (after - before) as f64 / ticks_per_s() / 10.0 * 100.0 / 500.0
    );
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

fn writer_loop() {
    let d = tempfile::tempdir().unwrap();
    let home = d.path().join("home");
    fs::create_dir_all(home.join(".claude")).unwrap();
    let host = home.join(".claude/.credentials.json");
    fs::write(&host, creds("old", 1)).unwrap();
    let p = d.path().join("p");
    fs::create_dir(&p).unwrap();
    Command::new("git")
        .arg("init")
        .arg("-q")
        .current_dir(&p)
        .status()
        .unwrap();
    let script = String::from(
        "F=\"$CLAUDE_SECURESTORAGE_CONFIG_DIR/.credentials.json\"; touch ready; \
         while [ ! -e go ]; do sleep 0.05; done; end=$(($(date +%s)+10)); n=0; \
         while [ $(date +%s) -lt $end ]; do n=$((n+1)); \
         printf '%s' \"{\\\"claudeAiOauth\\\":{\\\"accessToken\\\":\\\"a$n\\\",\\\"expiresAt\\\":$n}}\" > \"$F\"; done; \
         echo writes $n"
    );
    let k = Command::new(BIN)
        .current_dir(&p)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        // The sync runs only without the login broker (which, on by default for an OAuth
        // login, keeps the login outside and syncs nothing).
        .args(["--no-login-broker", "--exec", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while !p.join("ready").exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The host refreshed since: the sandbox holds another inode.
    let tmp = home.join(".claude/t");
    fs::write(&tmp, creds("host", 1)).unwrap();
    fs::rename(&tmp, &host).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    // The sync process: claudebox's child named claudebox-creds.
    let sync = fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.contains("(claudebox-creds)")
                && stat
                    .rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().nth(1))
                    == Some(&k.id().to_string())
        })
        .expect("the sync process");
    let before = cpu_ticks(sync);
    fs::write(p.join("go"), "").unwrap();
    let lock = home.join(".claude/.oauth_refresh.lock");
    let (mut samples, mut held) = (0u64, 0u64);
    let t = Instant::now();
    let mut host_changes = 0;
    let mut last = String::new();
    while t.elapsed() < Duration::from_secs(10) {
        samples += 1;
        if lock.exists() {
            held += 1;
        }
        if samples % 500 == 0 {
            let now = fs::read_to_string(&host).unwrap_or_default();
            if now != last {
                host_changes += 1;
                last = now;
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let after = cpu_ticks(sync);
    let o = k.wait_with_output().unwrap();
    println!(
        "agent rewriting its credentials in a loop for 10 s ({}): host-side sync {:.2}% of one CPU, \
         host's lock held in {held} of {samples} samples ({:.3}%), host's file seen changing {host_changes} times",
        String::from_utf8_lossy(&o.stdout).trim(),
        (after - before) as f64 / ticks_per_s() / 10.0 * 100.0,
        held as f64 / samples as f64 * 100.0
    );
}

fn main() {
    five_hundred();
    writer_loop();
}
