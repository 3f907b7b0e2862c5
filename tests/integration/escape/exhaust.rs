//! Host-wide tables one sandbox could exhaust (issue 34).
//!
//! - Descriptors: the agent raises its soft `nofile` to its hard limit and opens
//!   descriptors until open(2) fails. Inside, the launch's bound (`NOFILE_MAX`, 16384, set
//!   on bwrap's process before it starts) stops it; the control (the bound off,
//!   `CLAUDEBOX_TEST_NO_NOFILE_BOUND`, debug builds; as root the hard limit first raised
//!   to 65536) gets further: to the user's own hard limit.
//! - inotify instances: `fs.inotify.max_user_instances` counts per user, never per
//!   sandbox, so nothing bounds what one sandbox takes. Made in a user namespace whose
//!   own limit is [`INSTANCES`] (`/proc/sys/user/max_inotify_instances`, as the
//!   credentials sync's test does: the machine's limit is not touched), sandbox A takes
//!   every instance left; then the user's own inotify fails (the control: the attack is
//!   real, as `tail -f` and editors see it), and the project's next launch B says in one
//!   line that it cannot set its commondir watch and looks every 50 ms instead (the
//!   attempt succeeds if B starts silently without it).

use super::*;
use crate::BIN;
use std::os::unix::process::CommandExt;

/// The bound claudebox sets (src/policy/limits.rs).
const NOFILE_MAX: usize = 16384;
/// The user namespace's inotify instance limit in the second attempt.
const INSTANCES: usize = 24;

/// Raises the soft limit to the hard one, opens /dev/null until it fails; prints
/// `OPENED n errno`.
const OPEN_ALL: &str = r#"
import os, resource, errno
s, h = resource.getrlimit(resource.RLIMIT_NOFILE)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
except (ValueError, OSError):
    pass
n, e = 0, 0
fds = []
while True:
    try:
        fds.append(os.open("/dev/null", os.O_RDONLY))
        n += 1
    except OSError as x:
        e = x.errno
        break
print("OPENED", n, errno.errorcode.get(e, e), flush=True)
"#;

/// How many descriptors the agent opened inside (with the bound, or without it).
fn opened_inside(bound_off: bool) -> (usize, String) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let mut cmd = w.cmd(&proj);
    cmd.args(["--exec", "python3", "-c", OPEN_ALL]);
    if bound_off {
        cmd.env("CLAUDEBOX_TEST_NO_NOFILE_BOUND", "1");
        if nix::unistd::geteuid().is_root() {
            // SAFETY: setrlimit only, between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    let l = nix::libc::rlimit {
                        rlim_cur: 65536,
                        rlim_max: 65536,
                    };
                    nix::libc::setrlimit(nix::libc::RLIMIT_NOFILE, &raw const l);
                    Ok(())
                });
            }
        }
    }
    let o = cmd.output().unwrap();
    let text = format!("{}{}", stdout(&o), stderr(&o));
    let n = stdout(&o)
        .lines()
        .find_map(|l| l.strip_prefix("OPENED "))
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("the descriptor attempt did not run:\n{text}"));
    (n, text)
}

/// The user's own hard limit (the control can get no further).
fn hard_nofile() -> usize {
    let mut l = nix::libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a pointer to a local.
    unsafe { nix::libc::getrlimit(nix::libc::RLIMIT_NOFILE, &raw mut l) };
    l.rlim_max as usize
}

/// Python that takes every inotify instance it can, prints `TOOK n`, and holds them
/// until the file `$1` exists.
const TAKE_INOTIFY: &str = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while libc.inotify_init1(0o2000000) >= 0:
    n += 1
print("TOOK", n, os.strerror(ctypes.get_errno()), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"#;

/// The user's own inotify, as `tail -f` would try it: `OK` or the error.
const USER_INOTIFY: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print("USER-INOTIFY", "OK" if fd >= 0 else os.strerror(ctypes.get_errno()), flush=True)
"#;

/// The inotify attempt in a user namespace whose limit is [`INSTANCES`]: what A took,
/// what the user then saw, and B's output.
fn inotify_attempt() -> (usize, String, String) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    // In the project: the sandbox's /tmp is its own.
    let stop = proj.join("stop-taking");
    let script = format!(
        "echo {INSTANCES} > /proc/sys/user/max_inotify_instances || exit 9\n\
         \"$CB\" --exec python3 -c {take} {stop} > a.out 2>&1 &\n\
         i=0; until grep -q TOOK a.out; do i=$((i+1)); [ $i -gt 600 ] && break; sleep 0.05; done\n\
         cat a.out\n\
         python3 -c {user}\n\
         \"$CB\" --exec sh -c 'echo B-RAN' 2>&1\n\
         echo B-STATUS $?\n\
         touch {stop}; wait",
        take = sq(TAKE_INOTIFY),
        stop = sq(stop.to_str().unwrap()),
        user = sq(USER_INOTIFY),
    );
    let o = lab::agent::output_within(
        Command::new("unshare")
            .current_dir(&proj)
            .env_clear()
            .env("HOME", w.home())
            .env("PATH", w.path_var())
            .env("LANG", "C.UTF-8")
            .env("CB", BIN)
            .args(["-Ur", "sh", "-c", &script]),
        std::time::Duration::from_secs(120),
    )
    .unwrap_or_else(|e| panic!("the inotify attempt did not end: {e}"));
    let text = stdout(&o);
    assert!(o.status.success(), "{text}{}", stderr(&o));
    let took = text
        .lines()
        .find_map(|l| l.strip_prefix("TOOK "))
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("A did not take the instances:\n{text}"));
    let user = text
        .lines()
        .find_map(|l| l.strip_prefix("USER-INOTIFY "))
        .unwrap_or("")
        .to_string();
    let b: String = text
        .lines()
        .skip_while(|l| !l.starts_with("USER-INOTIFY"))
        .skip(1)
        .collect::<Vec<_>>()
        .join("\n");
    (took, user, b)
}

pub(super) fn attempts() -> Vec<(&'static str, bool)> {
    let (n, text) = opened_inside(false);
    assert!(n > 100, "the agent could hardly open anything:\n{text}");
    lab::figure!("descriptors one sandbox process opened: {n} (bound {NOFILE_MAX})");
    let (took, user, b) = inotify_attempt();
    // The control of the attack itself: the user's own inotify failed meanwhile.
    assert!(
        user.contains("Too many open files"),
        "A did not exhaust the user's inotify instances (took {took}): {user}\n{b}"
    );
    assert!(
        b.contains("B-RAN") && b.contains("B-STATUS 0"),
        "B did not run:\n{b}"
    );
    let said = b
        .lines()
        .any(|l| l.contains("cannot watch") && l.contains("inotify instance"));
    lab::figure!("inotify instances one sandbox took: {took} of the user's {INSTANCES}");
    vec![
        (
            "open descriptors past the sandbox's bound (the machine's file table)",
            n > NOFILE_MAX,
        ),
        (
            "take every inotify instance so the next launch runs without its watch, silently",
            !said,
        ),
    ]
}

pub(super) fn controls() {
    let hard = if nix::unistd::geteuid().is_root() {
        65536
    } else {
        hard_nofile()
    };
    let (n, text) = opened_inside(true);
    if hard > NOFILE_MAX + 64 {
        assert!(
            n > NOFILE_MAX,
            "control: without the bound the agent opened only {n}:\n{text}"
        );
    } else {
        eprintln!("escape controls: exhaust: the user's hard nofile ({hard}) is below the bound");
    }
}
