//! Who holds a lock file, and whether that holder is a sandbox that still runs.
//!
//! A launch takes its locks (the in-use slot `running/<n>`, a session's `<name>.lock`)
//! with `flock` and execs bwrap, which keeps them open in the sandbox's pid 1. So a held
//! lock does not by itself mean a running sandbox:
//!
//! - the process that took it (the launching claudebox, now the outer bwrap, whose exit
//!   status the caller gets) may have exited while bwrap's pid 1 is still tearing down:
//!   the sandbox has ended, the lock goes a moment later;
//! - that process may have been killed in bwrap's first milliseconds, leaving bwrap's
//!   child blocked for ever in `read()` on an eventfd its dead parent was to write
//!   (bubblewrap issue #633): nothing runs, and nothing will ever release the lock but
//!   `kill -KILL` of that child, which [`reap`] does (the next launch, `--list`, `--gc`).
//!
//! `/proc/locks` names the process that took each flock (in the initial pid namespace it
//! keeps naming it after it died). A lock counts as a running sandbox only while that
//! process lives. The stuck child is found by the lock file among its open descriptors
//! (it is still dumpable, so readable by its owner) and by its state: sleeping in
//! `read(2)` on an eventfd.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What holds a lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Not locked.
    Free,
    /// The process that took it lives: a sandbox runs (or a launch is starting).
    Running,
    /// Its taker exited; what still holds it is a sandbox tearing down.
    Ended,
    /// Held by bwrap processes stuck at start (bubblewrap issue #633): these pids.
    Stuck(Vec<i32>),
}

/// Who holds the lock on `path`, given that a non-blocking lock attempt failed. `None`:
/// `/proc/locks` shows no lock on it (released since, or a file system whose device
/// numbers `/proc/locks` shows differently): the caller tries the lock again.
pub fn of_held(path: &Path) -> Option<Holder> {
    let Ok(m) = fs::metadata(path) else {
        return Some(Holder::Running);
    };
    // Unknown (no /proc/locks): in doubt, running.
    let Some(takers) = takers(m.dev(), m.ino()) else {
        return Some(Holder::Running);
    };
    if takers.is_empty() {
        return None;
    }
    if takers.iter().any(|p| alive(*p)) {
        return Some(Holder::Running);
    }
    let stuck = stuck_holders(m.dev(), m.ino());
    Some(if stuck.is_empty() {
        Holder::Ended
    } else {
        Holder::Stuck(stuck)
    })
}

/// The inode numbers of every file `/proc/locks` shows a lock on (any kind, holders and
/// waiters, any device), read once: a file whose inode is not among them holds no lock,
/// so `--list` need not open and try to lock it. `None` when that cannot be trusted: no
/// `/proc/locks`, or a pid namespace other than the initial one, where the kernel leaves
/// out the locks whose taker it cannot name there (a launcher outside, or one that died
/// while bwrap keeps its lock). Devices are not compared: btrfs shows each subvolume's
/// own device in `stat` but the file system's in `/proc/locks`; an inode number shared
/// with another device's locked file only costs the usual look.
pub fn locked_inodes() -> Option<std::collections::HashSet<u64>> {
    // The initial pid namespace's fixed inode number (PROC_PID_INIT_INO, include/linux/proc_ns.h).
    const INIT_PID_NS: u64 = 0xEFFF_FFFC;
    let ns = fs::metadata("/proc/self/ns/pid").ok()?;
    if ns.ino() != INIT_PID_NS {
        return None;
    }
    let text = fs::read_to_string("/proc/locks").ok()?;
    Some(locked_inodes_in(&text))
}

/// [`locked_inodes`] of a `/proc/locks` text: each line's `MAJOR:MINOR:INODE` field.
fn locked_inodes_in(text: &str) -> std::collections::HashSet<u64> {
    text.lines()
        .filter_map(|line| {
            line.split_whitespace().find_map(|f| {
                let mut parts = f.split(':');
                let (_, _, ino, rest) = (parts.next()?, parts.next()?, parts.next()?, parts.next());
                rest.is_none().then(|| ino.parse::<u64>().ok()).flatten()
            })
        })
        .collect()
}

/// The pids that took a flock on (dev, ino), waiters excluded; `None` without /proc/locks.
fn takers(dev: u64, ino: u64) -> Option<Vec<i32>> {
    let text = fs::read_to_string("/proc/locks").ok()?;
    let want = lock_field(dev, ino);
    Some(
        flock_takers_in(&text)
            .filter(|(f, _)| *f == want)
            .map(|(_, pid)| pid)
            .collect(),
    )
}

/// How `/proc/locks` names the file (dev, ino): `MAJOR:MINOR:INODE`, in hex, then decimal.
fn lock_field(dev: u64, ino: u64) -> String {
    format!(
        "{:02x}:{:02x}:{ino}",
        nix::libc::major(dev),
        nix::libc::minor(dev)
    )
}

/// Each flock's file field and taker pid in a `/proc/locks` text, waiters excluded.
fn flock_takers_in(text: &str) -> impl Iterator<Item = (&str, i32)> {
    text.lines().filter_map(|line| {
        let mut f = line.split_whitespace();
        // "1: FLOCK ADVISORY WRITE 1234 fd:01:5678 0 EOF"; waiters have "->" after "1:".
        let (_, kind, _, _, pid, file) = (
            f.next()?,
            f.next()?,
            f.next()?,
            f.next()?,
            f.next()?,
            f.next()?,
        );
        (kind == "FLOCK").then_some(())?;
        Some((file, pid.parse::<i32>().ok()?))
    })
}

/// The takers of every flock `/proc/locks` shows, read once: for a caller that meets many
/// held files in a row (a launch passing the in-use slots of hundreds of sandboxes of its
/// project), one read and parse of the file rather than one per held file, which made
/// each launch's search quadratic in the sandboxes running (issue 36).
pub struct Takers(std::collections::HashMap<String, Vec<i32>>);

impl Takers {
    /// `None` without `/proc/locks`.
    pub fn read() -> Option<Takers> {
        let text = fs::read_to_string("/proc/locks").ok()?;
        let mut map = std::collections::HashMap::<String, Vec<i32>>::new();
        for (file, pid) in flock_takers_in(&text) {
            map.entry(file.to_owned()).or_default().push(pid);
        }
        Some(Takers(map))
    }

    /// Whether a process that took a flock on the file `m` describes lived when asked: its
    /// holder is then [`Holder::Running`], as [`of_held`] would say. `false` says nothing
    /// (no taker in this read, or none alive): ask [`of_held`].
    pub fn live_taker(&self, m: &fs::Metadata) -> bool {
        self.0
            .get(&lock_field(m.dev(), m.ino()))
            .is_some_and(|pids| pids.iter().any(|p| alive(*p)))
    }
}

/// Whether a pid names a live process (not a zombie). Pid 0 or less: a taker the kernel
/// cannot name in this pid namespace any more, so dead.
fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => state_of(&stat).is_some_and(|s| s != 'Z' && s != 'X'),
        Err(_) => false,
    }
}

/// When the process `pid` started (`/proc/PID/stat` field 22, clock ticks after boot):
/// with the pid, it names one process for good, across exec, never a later one that
/// reuses the pid.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name start at field 3 (the state): 22 - 3 = 19.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Whether the process that had `pid` and started at `ticks` still lives (not a zombie).
pub fn still_runs(pid: u32, ticks: u64) -> bool {
    i32::try_from(pid).is_ok_and(alive) && start_ticks(pid) == Some(ticks)
}

/// The state letter of a `/proc/PID/stat` line (after the command name in parentheses).
fn state_of(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// bwrap processes of this user that hold (dev, ino) open and are stuck at start.
fn stuck_holders(dev: u64, ino: u64) -> Vec<i32> {
    let me = nix::unistd::getuid().as_raw();
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if e.metadata().map_or(true, |m| m.uid() != me) {
            continue;
        }
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if !stat.contains("(bwrap)") || state_of(&stat) != Some('S') {
            continue;
        }
        if holds(pid, dev, ino) && stuck_in_eventfd_read(pid) {
            out.push(pid);
        }
    }
    out
}

fn holds(pid: i32, dev: u64, ino: u64) -> bool {
    let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    rd.flatten()
        .any(|fd| fs::metadata(fd.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino))
}

/// Blocked in `read(2)` (syscall 0 on x86-64, 63 on aarch64) on an eventfd.
fn stuck_in_eventfd_read(pid: i32) -> bool {
    const READ: &str = if cfg!(target_arch = "aarch64") {
        "63"
    } else {
        "0"
    };
    let Ok(sc) = fs::read_to_string(format!("/proc/{pid}/syscall")) else {
        return false;
    };
    let mut f = sc.split_whitespace();
    if f.next() != Some(READ) {
        return false;
    }
    let Some(fd) = f
        .next()
        .and_then(|h| i64::from_str_radix(h.trim_start_matches("0x"), 16).ok())
    else {
        return false;
    };
    fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]")
}

/// Ends the bwraps stuck at start (bubblewrap #633) among `pids` that hold the lock on
/// `path`, and returns those it ended. Each is looked at again through a pidfd (so that a
/// pid reused meanwhile is never signalled) and killed only if it still is one: this
/// user's, named bwrap, asleep in `read(2)` on an eventfd, holding the lock file, whose
/// lock's taker is dead (see [`of_held`]). A healthy sandbox never matches: the process
/// that took its lock lives, and neither of its bwraps sleeps in that `read`. Each is
/// waited for (at most a second): its lock is free once this returns. Nothing is killed
/// with `CLAUDEBOX_TEST_NO_REAP` (debug builds only: the controls; the stuck child is then
/// only named, as before).
pub fn reap(path: &Path, pids: &[i32]) -> Vec<i32> {
    if super::test_switch::get("CLAUDEBOX_TEST_NO_REAP").is_some() {
        return Vec::new();
    }
    let mut ended = Vec::new();
    for &pid in pids {
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor (or -1).
        let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
        let Ok(fd) = std::os::fd::RawFd::try_from(fd) else {
            continue;
        };
        if fd < 0 {
            continue;
        }
        // SAFETY: pidfd_open just returned this descriptor; nothing else owns it.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // Looked at again with the pidfd held: if the pid names another process now, the
        // pidfd names the one that died and the signal below fails.
        if !matches!(of_held(path), Some(Holder::Stuck(now)) if now.contains(&pid)) {
            continue;
        }
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // SAFETY: pidfd_send_signal(2) on a pidfd this process holds, no siginfo.
        let sent = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_pidfd_send_signal,
                raw,
                nix::libc::SIGKILL,
                std::ptr::null::<nix::libc::siginfo_t>(),
                0,
            )
        };
        if sent != 0 {
            continue;
        }
        // A pidfd turns readable when its process has exited (its descriptors closed).
        let mut pfd = [nix::poll::PollFd::new(
            std::os::fd::AsFd::as_fd(&fd),
            nix::poll::PollFlags::POLLIN,
        )];
        let _ = nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(1000u16));
        ended.push(pid);
    }
    ended
}

/// Ends the bwraps stuck at start among `pids` that hold `slot` ([`reap`]) and says so;
/// names them with the command that clears them if none could be ended.
pub fn reap_or_name(slot: &Path, pids: &[i32], what: &str) -> String {
    let ended = reap(slot, pids);
    if ended.is_empty() {
        stuck_message(pids, what)
    } else {
        reaped_message(&ended, what)
    }
}

/// The line saying that claudebox ended stuck holders of `what`.
pub fn reaped_message(pids: &[i32], what: &str) -> String {
    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
    format!(
        "ended a bwrap that got stuck when its launch was killed in its first milliseconds \
         (pid {}; bubblewrap issue #633: it waited for ever for its dead parent), which held {what}",
        list.join(", ")
    )
}

/// The message naming stuck holders and the command that clears them.
pub fn stuck_message(pids: &[i32], what: &str) -> String {
    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
    format!(
        "{what} is held by a bwrap that got stuck when its launch was killed in its first \
         milliseconds (pid {}; bubblewrap issue #633: it waits for ever for its dead parent); \
         end it with `kill -KILL {}` and run claudebox again",
        list.join(", "),
        list.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locked_inodes_are_read_from_every_line() {
        let text = "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 99 fd:01:5678 0 EOF\n\
                    2: POSIX  ADVISORY  READ 42 00:1f:91 0 EOF\n\
                    3: OFDLCK ADVISORY  WRITE -1 08:02:7 0 EOF\n";
        let got = locked_inodes_in(text);
        assert_eq!(got, [5678, 91, 7].into_iter().collect());
    }

    #[test]
    fn flock_takers_are_read_without_waiters_or_other_kinds() {
        let text = "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 99 fd:01:5678 0 EOF\n\
                    2: POSIX  ADVISORY  READ 42 00:1f:91 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 7 fd:01:5679 0 EOF\n";
        let got: Vec<_> = flock_takers_in(text).collect();
        assert_eq!(got, [("fd:01:5678", 1234), ("fd:01:5679", 7)]);
        assert_eq!(lock_field(nix::libc::makedev(0xfd, 1), 5678), "fd:01:5678");
    }

    #[test]
    fn reads_the_state_letter_after_the_command_name() {
        assert_eq!(state_of("12 (a) b) S 1 2"), Some('S'));
        assert_eq!(state_of("12 (bwrap) Z 1"), Some('Z'));
        assert!(alive(std::process::id() as i32));
        assert!(!alive(0));
    }
}
