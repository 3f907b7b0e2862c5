//! bubblewrap's CVE-2026-87766 reached through claudebox's launch (issue 34): before
//! bubblewrap 0.12.0, bwrap makes its mount points under the new root by name, following
//! symlinks. Sandbox A of a project with a nested repository (`inner/.git`, a protected
//! mount point beneath the plain directory `inner`) keeps exchanging `inner` with a
//! symlink to `/oldroot/<a host directory>` (`renameat2(RENAME_EXCHANGE)`, in a loop);
//! launches B of the same project follow, bounded. The attempt gets out when B's bwrap
//! made anything in that host directory. With an unfixed bwrap, B refuses while A runs
//! (`launch::refuse_unfixed_bwrap`); the control, the same with the bwrap taken for fixed
//! (`CLAUDEBOX_TEST_BWRAP_FIXED`, debug builds), gets `.git` made in the host directory
//! (measured with Debian 12's 0.8.0-2+deb12u1: within the first few launches).

use super::*;
use crate::BIN;
use lab::agent::output_within;
use std::time::Duration;

/// B launches at most: the attempt's, and the control's, which stops at its first hit
/// (measured: as root 14 of 15 launches hit; as an ordinary user the first hit came
/// after 3 to 37).
const LAUNCHES: usize = 40;
const CONTROL_LAUNCHES: usize = 200;

/// `python3 -c SWAP HOSTDIR STOPFILE`: exchanges `inner` and `inner.lnk` (a symlink to
/// `/oldroot/HOSTDIR`, the host's root as bwrap sees it during its setup) until STOPFILE
/// exists.
const SWAP: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
host, stop = sys.argv[1], sys.argv[2]
os.symlink("/oldroot" + host, "inner.lnk")
print("READY", flush=True)
n = 0
while not os.path.exists(stop):
    for _ in range(200):
        if libc.syscall(316, -100, b"inner", -100, b"inner.lnk", 2) != 0:
            print("EXCHANGE-FAILED", os.strerror(ctypes.get_errno()), flush=True)
            sys.exit(0)
        n += 1
if n % 2:
    libc.syscall(316, -100, b"inner", -100, b"inner.lnk", 2)
print("SWAPS", n, flush=True)
"#;

/// The attempt (or its control): whether B's bwrap made anything in the host directory,
/// and what the launches said.
fn run(pretend_fixed: bool) -> (bool, String) {
    let launches = if pretend_fixed {
        CONTROL_LAUNCHES
    } else {
        LAUNCHES
    };
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    init_repo(&proj.join("inner"));
    let host = w.home().join("host-dir");
    fs::create_dir_all(&host).unwrap();
    let stop = proj.join("stop-swapping");
    let (mut a, line) = lab::spawn_first_line(
        w.cmd(&proj)
            .args(["--exec", "python3", "-c", SWAP])
            .arg(&host)
            .arg(&stop)
            .stdin(Stdio::null())
            .stderr(Stdio::null()),
    );
    assert_eq!(line.trim(), "READY", "A did not start");
    let mut said = String::new();
    let mut hit = false;
    let mut n = 0;
    for _ in 0..launches {
        n += 1;
        let mut cmd = w.cmd(&proj);
        cmd.args(["--exec", "true"]);
        if pretend_fixed {
            cmd.env("CLAUDEBOX_TEST_BWRAP_FIXED", "1");
        }
        match output_within(&mut cmd, Duration::from_secs(30)) {
            Ok(o) => said.push_str(&stderr(&o)),
            Err(e) => said.push_str(&e),
        }
        if fs::read_dir(&host).unwrap().next().is_some() {
            hit = true;
            break;
        }
    }
    fs::write(&stop, "").unwrap();
    let _ = a.wait();
    if pretend_fixed {
        lab::figure!("bwrap_parents control: first hit after {n} launches");
    }
    (hit, said)
}

/// Whether the bwrap here carries the fix (then neither the refusal nor the control's
/// success is expected of it).
fn bwrap_fixed() -> bool {
    let o = Command::new("bwrap").arg("--version").output().unwrap();
    let v = stdout(&o);
    let n: Vec<u32> = v
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .split('.')
        .filter_map(|x| x.parse().ok())
        .collect();
    n >= vec![0, 12, 0]
}

pub(super) fn attempts() -> Vec<(&'static str, bool)> {
    let (hit, said) = run(false);
    if !bwrap_fixed() {
        assert!(
            said.contains("lacks the fix for CVE-2026-87766"),
            "B never refused for the unfixed bwrap:\n{said}"
        );
    }
    vec![(
        "swap a parent of a mount point for a symlink while a sibling launch's bwrap runs",
        hit,
    )]
}

pub(super) fn controls() {
    if bwrap_fixed() {
        eprintln!("escape controls: bwrap_parents: this bwrap carries the fix: no control");
        return;
    }
    let (hit, said) = run(true);
    assert!(
        hit,
        "control: bwrap made nothing on the host in {CONTROL_LAUNCHES} launches:\n{said}"
    );
}
