//! The credentials sync process (the hidden `--internal-credentials-sync` role): for the
//! life of one sandbox, keeps the login's `.credentials.json` bound into it (the inode
//! bwrap mounted, held here by descriptor) in step with the host's file, which the host's
//! claude replaces by rename at each refresh. The policy (which way, when not) is
//! `policy::credsync::decide`; this is the edge.
//!
//! Started by the launch like the network proxy: forked and exec'd from claudebox right
//! before it execs bwrap, in its own session, with the death signal armed (it dies with
//! bwrap), holding only the bound file (descriptor 3). Idle, it blocks in one inotify
//! read: on the host's directory (`.credentials.json` created, renamed onto, written) and
//! on the bound inode (written, by a refresh inside).
//!
//! What it writes, and how strictly:
//! - into the bound file: the host's content, in place (write at 0, then truncate), so a
//!   running claude in the sandbox sees the rotated pair at its next request;
//! - into the host's file: the bound file's content, in place, under claude's own refresh
//!   lock (`mkdir <dir>/.oauth_refresh.lock`), only into the inode it just read there:
//!   opened with `O_NOFOLLOW|O_NONBLOCK`, a regular file, the same device and inode. In
//!   place rather than temp + rename so that sandboxes started since the host's last
//!   rename (which hold that very inode) see it at once. Nothing is ever created, no
//!   other path is written, and content larger than 64 KiB or not a JSON object is
//!   never copied either way.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::libc;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::policy::credsync::{decide, valid, Action, Side, INTERNAL_CREDENTIALS_SYNC, MAX_SIZE};
use crate::state::beneath;
use crate::state::claude_home::LOGIN_LOCKS;
use std::os::fd::AsFd;

/// How often the sync process looks for planted locks in the login directory when nothing
/// happens (a lock going stale with something in it makes no event).
const SWEEP_MS: u16 = 2000;

/// The descriptor the sync process finds the bound file on.
const BOUND_FD: RawFd = 3;

/// Starts the sync process for the bound file `source` (an `O_PATH` descriptor of the
/// inode bwrap will mount) and the host's file `host`. Call after the sources are opened
/// and before bwrap starts; it ends with the launcher. The child is returned for a launch
/// that starts bwrap again (a source replaced by the host meanwhile) and ends this one.
pub fn start(
    source: RawFd,
    host: &Path,
    instance: &str,
    login: &Path,
) -> Result<std::process::Child> {
    // The very inode bwrap mounts: reopened through the descriptor, not by name.
    let bound = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{source}"))
        .context("cannot open the bound credentials file")?;
    if !bound.metadata()?.is_file() {
        bail!("the credentials file is not a regular file");
    }
    let mut cmd = std::process::Command::new("/proc/self/exe");
    use std::os::unix::process::CommandExt;
    cmd.arg0("claudebox")
        .arg(INTERNAL_CREDENTIALS_SYNC)
        .arg("--instance")
        .arg(instance)
        .arg("--host")
        .arg(host)
        .arg("--login")
        .arg(login);
    cmd.current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let fd = bound.as_raw_fd();
    let parent = nix::unistd::getpid();
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if fd != BOUND_FD && libc::dup2(fd, BOUND_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fcntl(BOUND_FD, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing else crosses: no lock of the launch, no descriptor of the shell
            // (CLOSE_RANGE_CLOEXEC, Linux 5.11, keeps std's own exec-error pipe working;
            // before it, the launch's descriptors are close-on-exec already).
            const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
            libc::syscall(
                libc::SYS_close_range,
                BOUND_FD + 1,
                u32::MAX,
                CLOSE_RANGE_CLOEXEC,
            );
            crate::host::companion::detach_bound_to(parent)
        });
    }
    cmd.spawn()
        .context("cannot start the credentials sync process")
}

/// Runs the sync role: `args` are those after `--internal-credentials-sync`.
pub fn main(args: &[OsString]) -> ExitCode {
    let (host, login) = match args {
        [i, _, h, path, l, login] if i == "--instance" && h == "--host" && l == "--login" => {
            (PathBuf::from(path), PathBuf::from(login))
        }
        _ => {
            eprintln!("claudebox: internal credentials sync: bad arguments");
            return ExitCode::from(2);
        }
    };
    let _ = nix::sys::prctl::set_name(c"claudebox-creds");
    crate::host::companion::exit_with_parent();
    // SAFETY: the launcher placed the bound file on this descriptor for us alone.
    let bound = File::from(unsafe { OwnedFd::from_raw_fd(BOUND_FD) });
    match run(&bound, &host, &login) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("claudebox: credentials sync: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(bound: &File, host: &Path, login: &Path) -> Result<()> {
    let (Some(dir), Some(name)) = (host.parent(), host.file_name()) else {
        bail!("no directory in {}", host.display());
    };
    let ino = Inotify::init(InitFlags::IN_CLOEXEC)?;
    ino.add_watch(
        dir,
        AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_ONLYDIR,
    )
    .context("cannot watch the host's credentials directory")?;
    let bound_watch = ino
        .add_watch(
            format!("/proc/self/fd/{}", bound.as_raw_fd()).as_str(),
            AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MODIFY,
        )
        .context("cannot watch the bound credentials file")?;
    // The login directory, shared by every project's sandboxes: a lock an agent planted
    // there (dated in the future, never stale for claude) is cleared as soon as it appears
    // or is re-dated, and at every tick (one that went stale with something in it).
    let login_dir = beneath::Dir::open(login).ok();
    if login_dir.is_some() {
        let _ = ino.add_watch(
            login,
            AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_ATTRIB
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_ONLYDIR,
        );
    }
    let sweep = || {
        if let Some(d) = &login_dir {
            for name in LOGIN_LOCKS {
                beneath::clear_planted_lock(d, Path::new(name));
            }
        }
    };
    sweep();
    let mut last = read_bound(bound).map(|s| s.content).unwrap_or_default();
    // The host may have renamed between the launch's open and now.
    sync_once(bound, host, dir, &mut last);
    loop {
        let mut fds = [nix::poll::PollFd::new(
            ino.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(SWEEP_MS)) {
            Ok(0) => {
                sweep();
                continue;
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        sweep();
        let events = match ino.read_events() {
            Ok(e) => e,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let relevant = events.iter().any(|e| {
            e.wd == bound_watch
                || e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW)
                || e.name.as_deref() == Some(name)
        });
        if relevant {
            sync_once(bound, host, dir, &mut last);
        }
    }
}

/// One round: read both sides, decide, copy. Errors leave both files as they were.
fn sync_once(bound: &File, host: &Path, dir: &Path, last: &mut Vec<u8>) {
    let Some(b) = read_bound(bound) else { return };
    let h = read_host(host);
    match decide(h.as_ref(), &b, last) {
        act @ (Action::Nothing | Action::ToBound) => apply(act, bound, host, h, b, last),
        Action::ToHost => {
            let lock = RefreshLock::take(dir);
            // Under the lock, both again: a refresh on the host may just have renamed its
            // file; whatever is decided now is done before the lock goes.
            let (Some(b), h) = (read_bound(bound), read_host(host)) else {
                return;
            };
            let act = decide(h.as_ref(), &b, last);
            apply(act, bound, host, h, b, last);
            drop(lock);
        }
    }
}

/// Does what [`decide`] said for `h` and `b` (read just before).
fn apply(act: Action, bound: &File, host: &Path, h: Option<Side>, b: Side, last: &mut Vec<u8>) {
    let copied = match (act, h) {
        (Action::ToBound, Some(h)) => write_in_place(bound, &h.content).ok().map(|()| h.content),
        (Action::ToHost, Some(h)) => write_host(host, h.inode, &b.content)
            .ok()
            .map(|()| b.content),
        (Action::Nothing, Some(h)) if h.content == b.content => Some(b.content),
        _ => None,
    };
    if let Some(c) = copied {
        *last = c;
    }
}

/// Reads at most [`MAX_SIZE`] + 1 bytes from the start of `f`; `None` past the cap.
fn read_capped(f: &File) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; MAX_SIZE as usize + 1];
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    if n as u64 > MAX_SIZE {
        return None;
    }
    buf.truncate(n);
    Some(buf)
}

fn side_of(f: &File) -> Option<Side> {
    let m = f.metadata().ok()?;
    if !m.is_file() || m.len() > MAX_SIZE {
        return None;
    }
    Some(Side {
        inode: (m.dev(), m.ino()),
        content: read_capped(f)?,
    })
}

fn read_bound(bound: &File) -> Option<Side> {
    side_of(bound)
}

/// The host's file, never through a symlink, never a fifo or device.
fn read_host(host: &Path) -> Option<Side> {
    let f = open_nofollow(host, false).ok()?;
    side_of(&f)
}

fn open_nofollow(p: &Path, write: bool) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(p)
}

/// Replaces `f`'s content in place: one write at 0, then the length cut to it.
fn write_in_place(f: &File, content: &[u8]) -> std::io::Result<()> {
    if !valid(content) {
        return Err(std::io::Error::other("not a JSON object"));
    }
    f.write_all_at(content, 0)?;
    f.set_len(content.len() as u64)?;
    f.sync_data()
}

/// Writes `content` into the host's file, only if it still is the regular file `inode`.
fn write_host(host: &Path, inode: (u64, u64), content: &[u8]) -> std::io::Result<()> {
    let f = open_nofollow(host, true)?;
    let m = f.metadata()?;
    if !m.is_file() || (m.dev(), m.ino()) != inode {
        return Err(std::io::Error::other("the host's file changed"));
    }
    write_in_place(&f, content)
}

/// Claude's refresh lock on the host (`mkdir <dir>/.oauth_refresh.lock`), waited for up
/// to 5 s; after that (a crashed claude's lock) the copy goes ahead without it.
struct RefreshLock(Option<PathBuf>);

impl RefreshLock {
    fn take(dir: &Path) -> RefreshLock {
        let path = dir.join(".oauth_refresh.lock");
        for _ in 0..50 {
            match std::fs::create_dir(&path) {
                Ok(()) => return RefreshLock(Some(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(_) => break,
            }
        }
        RefreshLock(None)
    }
}

impl Drop for RefreshLock {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_dir(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_file_is_written_only_if_it_is_the_regular_file_read() {
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join(".credentials.json");
        std::fs::write(&host, b"{\"a\":1}").unwrap();
        let s = read_host(&host).unwrap();
        write_host(&host, s.inode, b"{\"b\":2}").unwrap();
        assert_eq!(std::fs::read(&host).unwrap(), b"{\"b\":2}");
        // Not JSON: refused, the file unchanged.
        assert!(write_host(&host, s.inode, b"nope").is_err());
        assert_eq!(std::fs::read(&host).unwrap(), b"{\"b\":2}");
        // Renamed over since: refused.
        let tmp = d.path().join("t");
        std::fs::write(&tmp, b"{}").unwrap();
        std::fs::rename(&tmp, &host).unwrap();
        assert!(write_host(&host, s.inode, b"{\"c\":3}").is_err());
        // A symlink at the path: neither read nor written through.
        let target = d.path().join("elsewhere");
        std::fs::write(&target, b"{\"x\":0}").unwrap();
        std::fs::remove_file(&host).unwrap();
        std::os::unix::fs::symlink(&target, &host).unwrap();
        assert!(read_host(&host).is_none());
        let t = read_host(&target).unwrap();
        assert!(write_host(&host, t.inode, b"{\"c\":3}").is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"{\"x\":0}");
        // A fifo: never opened for reading (it would block).
        std::fs::remove_file(&host).unwrap();
        nix::unistd::mkfifo(&host, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read_host(&host).is_none());
    }

    #[test]
    fn a_shorter_content_leaves_no_tail() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"{\"long\":\"xxxxxxxxxxxxxxxx\"}").unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        write_in_place(&f, b"{}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
    }
}
