//! The credentials sync process (the hidden `--internal-credentials-sync` role): for the
//! life of one sandbox, keeps the login's `.credentials.json` bound into it in step with
//! the host's file, which the host's claude replaces by rename at each refresh. The
//! policy (which way, when not) is `policy::credsync::decide`; this is the edge.
//!
//! Started by the launch like the network proxy: forked and exec'd from claudebox right
//! before it starts bwrap, in its own session, with the death signal armed (it ends with
//! the supervising claudebox, between copies), holding only the bound file (descriptor 3)
//! and an inotify instance the launch made (descriptor 4). Idle, it blocks in one inotify
//! read: on the host's directory (`.credentials.json` created, renamed onto, written) and
//! on the bound inode (written, by a refresh inside). Where the user has no inotify
//! instance left (`fs.inotify.max_user_instances`, 128 by default, shared with editors),
//! the launch says so in one line and the process looks at both files every second
//! instead. Copies are coalesced: at most one per 500 ms, however fast a side is written.
//!
//! What it writes, and how strictly:
//! - into the sandbox: the host's content as a new file mounted over the bound one at
//!   each of its mount points inside (`remount`: from a fresh tmpfs attached nowhere,
//!   through the sandbox's own namespaces), so that a reader inside opens either the old
//!   file or the new one, each whole, and nothing writes a file a reader may be reading
//!   (no reader sees a torn file; an in-place write could interleave with a read of the
//!   same page: 1 in 846,778 reads was seen so). The sync then holds and watches the new
//!   file. Where that cannot be done (Linux before 6.5 has no `MOVE_MOUNT_BENEATH`, needed
//!   to replace the host's unlinked inode; a namespace that cannot be joined), in place
//!   as before: one write at 0, padded with spaces to the old length, never truncated;
//! - into the host's file: the sandbox's content, in place, under claude's own refresh
//!   lock (`mkdir <dir>/.oauth_refresh.lock`), only into the inode it just read there:
//!   opened with `O_NOFOLLOW|O_NONBLOCK`, a regular file, the same device and inode. In
//!   place rather than temp + rename so that sandboxes started since the host's last
//!   rename (which hold that very inode) see it at once. Nothing is ever created, no
//!   other path is written, and content larger than 64 KiB or not a JSON object is
//!   never copied either way. A sync killed while it holds the lock (SIGKILL: nothing
//!   else can end it then) leaves no lock: the launcher, told over a pipe which directory
//!   it holds, removes that one as soon as the sync is gone.
//!
//! Why not a regular file renamed into the shared login directory (measured and
//! rejected): claude reads and writes it by path with temp + rename there (both pinned
//! versions), but that directory is writable by every unbrokered sandbox of every
//! project, so the name would no longer be a mount point: an agent can put a FIFO in its
//! place and hold its write end, and every other claude that starts blocks on it for ever
//! (also with an API key); a sync that notices and puts the file back cannot release a
//! reader already blocked while the agent holds that write end.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use nix::libc;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::policy::credsync::{
    decide, padded, trimmed, valid, Action, Side, INTERNAL_CREDENTIALS_SYNC, MAX_SIZE,
    MIN_INTERVAL, POLL_INTERVAL,
};
use crate::state::beneath;

mod remount;
use crate::state::claude_home::LOGIN_LOCKS;
use std::os::fd::AsFd;

/// How often the sync process looks for planted locks in the login directory when nothing
/// happens (a lock going stale with something in it makes no event).
const SWEEP_MS: u16 = 2000;

/// Where no sync process runs (the host has no `.credentials.json`, so nothing is bound),
/// the launcher, which stays the sandbox's supervising parent, sweeps the login
/// directory's planted locks as the sync would, every [`SWEEP_MS`], for the sandbox's
/// life: one sleeping thread (no inotify instance, whose release would cost ~9 ms at the
/// exit). So while any sandbox runs, a lock one project's agent plants there blocks no
/// other project longer than claude's stale time; with none running nobody uses it, and
/// the next launch clears it first. At most one per process.
pub fn sweep_login_locks(login: &Path) {
    static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if STARTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let Ok(dir) = beneath::Dir::open(login) else {
        return;
    };
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(u64::from(SWEEP_MS)));
        for name in LOGIN_LOCKS {
            beneath::clear_planted_lock(&dir, Path::new(name));
        }
    });
}

/// The descriptor the sync process finds the bound file on.
const BOUND_FD: RawFd = 3;

/// The descriptor the sync process finds its inotify instance on (`--watch inotify`).
const INOTIFY_FD: RawFd = 4;

/// Set (to anything non-empty) to make no inotify instance and poll: the fallback's test
/// without exhausting the user's instances.
pub const FORCE_POLL_ENV: &str = "CLAUDEBOX_TEST_CREDENTIALS_SYNC_POLL";

/// Set (to anything non-empty) to copy as before padding and coalescing existed (write,
/// then truncate, at every event): the torn-read test's control.
pub const TRUNCATE_ENV: &str = "CLAUDEBOX_TEST_CREDENTIALS_SYNC_TRUNCATE";

static TRUNCATE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set to a number of milliseconds: the sync holds the host's refresh lock that much
/// longer at each copy to the host (the test that kills it while it holds the lock).
pub const HOLD_MS_ENV: &str = "CLAUDEBOX_TEST_CREDENTIALS_SYNC_HOLD_MS";

static HOLD_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Set in the sync process only: [`REPORT_FD`] is its report pipe there. Another process
/// that takes the refresh lock (the login broker, in the proxy) has something else, or
/// nothing, on that descriptor and reports nothing.
static REPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The descriptor the sync process reports on (a pipe to the launching claudebox) which
/// refresh lock it is about to hold and when it let it go: a sync that dies holding it
/// (SIGKILL) leaves it to the launcher, which removes it at once ([`guard_lock`]).
const REPORT_FD: RawFd = 5;

/// How the sync process learns of changes.
pub enum Watch {
    /// One inotify instance (made by the launch, handed over on descriptor 4).
    Inotify,
    /// No inotify instance could be had (the reason): both files are looked at every
    /// [`POLL_INTERVAL`].
    Polling(String),
}

/// The inotify instance the sync process blocks on, made here in the launch so that a
/// failure is said on the user's terminal (the sync process has no stderr): the host's
/// directory, the bound inode (`bound`, a descriptor of this process) and the login
/// directory (where planted locks are swept).
fn watcher(dir: &Path, bound: RawFd, login: &Path) -> Result<Inotify, String> {
    if crate::host::test_switch::on(FORCE_POLL_ENV) {
        return Err("the tests' switch asks for polling".into());
    }
    let limit = || {
        // The user namespace's own limit (the same as fs.inotify.max_user_instances in
        // the initial one).
        std::fs::read_to_string("/proc/sys/user/max_inotify_instances")
            .or_else(|_| std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).map_err(|e| {
        format!(
            "no inotify instance ({}; fs.inotify.max_user_instances is {})",
            e.desc(),
            limit()
        )
    })?;
    let watch = |p: &Path, flags| {
        ino.add_watch(p, flags)
            .map_err(|e| format!("cannot watch {} ({})", p.display(), e.desc()))
    };
    watch(
        dir,
        AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_ONLYDIR,
    )?;
    watch(
        Path::new(&format!("/proc/self/fd/{bound}")),
        AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MODIFY,
    )?;
    // The login directory, shared by every project's sandboxes: a lock an agent planted
    // there (dated in the future, never stale for claude) is cleared as soon as it
    // appears or is re-dated (and at every tick: one that went stale with something in
    // it makes no event). Missing: nothing to watch.
    if login.is_dir() {
        watch(
            login,
            AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_ATTRIB
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_ONLYDIR,
        )?;
    }
    Ok(ino)
}

/// Starts the sync process for the bound file `source` (an `O_PATH` descriptor of the
/// inode bwrap will mount) and the host's file `host`. Call after the sources are opened
/// and before bwrap is started; the child stays claudebox's (the supervising parent's)
/// and ends with it. The child is returned too, for a launch that starts bwrap again (a
/// source replaced by the host meanwhile) and ends this one.
pub fn start(
    source: RawFd,
    host: &Path,
    instance: &str,
    login: &Path,
    targets: &[PathBuf],
    outside: &crate::host::companion::Outside,
) -> Result<(Watch, std::process::Child)> {
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
    let dir = host.parent().unwrap_or(Path::new("/"));
    let (ino, watch) = match watcher(dir, bound.as_raw_fd(), login) {
        Ok(i) => (Some(i), Watch::Inotify),
        Err(why) => (None, Watch::Polling(why)),
    };
    let mut cmd = std::process::Command::new("/proc/self/exe");
    use std::os::unix::process::CommandExt;
    cmd.arg0("claudebox")
        .arg(INTERNAL_CREDENTIALS_SYNC)
        .arg("--instance")
        .arg(instance)
        .arg("--host")
        .arg(host)
        .arg("--login")
        .arg(login)
        .arg("--watch")
        .arg(if ino.is_some() { "inotify" } else { "poll" });
    for t in targets {
        cmd.arg("--target").arg(t);
    }
    // The tests' switches of the sync (debug builds) reach it in the environment it
    // inherits.
    // The sync's reports of the host's refresh lock; the write end is its alone.
    let (report_rd, report_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let report = report_wr.as_raw_fd();
    outside.apply(&mut cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let fd = bound.as_raw_fd();
    let ino_fd = ino.as_ref().map_or(-1, |i| i.as_fd().as_raw_fd());
    let parent = nix::unistd::getpid();
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Both moved out of the way first (either may sit on 3 or 4), then placed.
            let high = |fd: RawFd| {
                let n = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n)
                }
            };
            let b = high(fd)?;
            let i = if ino_fd >= 0 { high(ino_fd)? } else { -1 };
            let r = high(report)?;
            if libc::dup2(b, BOUND_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if i >= 0 && libc::dup2(i, INOTIFY_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::dup2(r, REPORT_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing else crosses: no lock of the launch, no descriptor of the shell
            // (CLOSE_RANGE_CLOEXEC, Linux 5.11, keeps std's own exec-error pipe working;
            // before it, the launch's descriptors are close-on-exec already).
            const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
            libc::syscall(
                libc::SYS_close_range,
                REPORT_FD + 1,
                u32::MAX,
                CLOSE_RANGE_CLOEXEC,
            );
            crate::host::companion::detach_bound_to(parent)
        });
    }
    let child = cmd
        .spawn()
        .context("cannot start the credentials sync process")?;
    drop(report_wr);
    let (dir, pid) = (dir.to_path_buf(), child.id());
    let _ = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || guard_lock(report_rd, &dir, pid));
    Ok((watch, child))
}

/// Runs the sync role: `args` are those after `--internal-credentials-sync`.
pub fn main(args: &[OsString]) -> ExitCode {
    let (host, login, inotify, rest) = match args {
        [i, _, h, path, l, login, w, mode, rest @ ..]
            if i == "--instance" && h == "--host" && l == "--login" && w == "--watch" =>
        {
            (
                PathBuf::from(path),
                PathBuf::from(login),
                mode == "inotify",
                rest,
            )
        }
        _ => {
            eprintln!("claudebox: internal credentials sync: bad arguments");
            return ExitCode::from(2);
        }
    };
    // `--target PATH`, once per mount point of the bound file inside.
    let Some(targets) = rest
        .chunks(2)
        .map(|c| match c {
            [t, p] if t == "--target" => Some(PathBuf::from(p)),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
    else {
        eprintln!("claudebox: internal credentials sync: bad arguments");
        return ExitCode::from(2);
    };
    let _ = nix::sys::prctl::set_name(c"claudebox-creds");
    REPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
    TRUNCATE.store(
        crate::host::test_switch::on(TRUNCATE_ENV),
        std::sync::atomic::Ordering::Relaxed,
    );
    HOLD_MS.store(
        crate::host::test_switch::get(HOLD_MS_ENV)
            .and_then(|v| v.into_string().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        std::sync::atomic::Ordering::Relaxed,
    );
    // Ended by a signal or its parent's death only between copies, never holding the
    // host's refresh lock (`HOLD`).
    crate::host::companion::end_with_parent_outside(&HOLD);
    // SAFETY: the launcher placed the bound file on this descriptor for us alone.
    let bound = File::from(unsafe { OwnedFd::from_raw_fd(BOUND_FD) });
    // SAFETY: likewise the inotify instance, when it says so.
    let ino = inotify.then(|| unsafe { Inotify::from_raw_fd(INOTIFY_FD) });
    match run(bound, &host, &login, ino, targets) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("claudebox: credentials sync: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Held while the host's refresh lock is: the exit waits for it.
static HOLD: Mutex<()> = Mutex::new(());

/// What says a file changed when nothing watches it: identity, size, times.
type Stamp = Option<(u64, u64, u64, i64, i64, i64, i64)>;

fn stamp(m: std::io::Result<std::fs::Metadata>) -> Stamp {
    let m = m.ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

fn stamps(bound: &File, host: &Path) -> (Stamp, Stamp) {
    (
        stamp(bound.metadata()),
        stamp(std::fs::symlink_metadata(host)),
    )
}

fn run(
    bound: File,
    host: &Path,
    login: &Path,
    ino: Option<Inotify>,
    targets: Vec<PathBuf>,
) -> Result<()> {
    let mut bound = Bound {
        file: bound,
        targets,
        parent: nix::unistd::getppid().as_raw(),
        ino: ino.as_ref().map(|i| i.as_fd().as_raw_fd()),
        wd: None,
    };
    let (Some(dir), Some(name)) = (host.parent(), host.file_name()) else {
        bail!("no directory in {}", host.display());
    };
    let login_dir = beneath::Dir::open(login).ok();
    let sweep = || {
        if let Some(d) = &login_dir {
            for name in LOGIN_LOCKS {
                beneath::clear_planted_lock(d, Path::new(name));
            }
        }
    };
    sweep();
    let mut last = read_bound(&bound.file)
        .map(|s| s.content)
        .unwrap_or_default();
    // The host may have renamed between the launch's open and now.
    // The control of the torn-read test copies as before: at every event.
    let interval = if TRUNCATE.load(std::sync::atomic::Ordering::Relaxed) {
        Duration::ZERO
    } else {
        MIN_INTERVAL
    };
    let first = sync_once(&mut bound, host, dir, &mut last);
    let mut due = (first == Round::Blocked).then(|| Instant::now() + MIN_INTERVAL);
    // A copy is made at once when none was made for MIN_INTERVAL (only copies count).
    let mut last_copy = match first {
        Round::Copied => Instant::now(),
        _ => Instant::now()
            .checked_sub(interval)
            .unwrap_or_else(Instant::now),
    };
    let mut seen = stamps(&bound.file, host);
    loop {
        // Waiting: for an event (inotify, nothing owed), or for the time a copy is owed
        // (events meanwhile pile up in the kernel's queue, merged, and are read at once:
        // a writer in a loop wakes this at most twice per MIN_INTERVAL), or for the next
        // look (polling).
        let now = Instant::now();
        match (&ino, due) {
            (_, Some(d)) => std::thread::sleep(d.saturating_duration_since(now)),
            (None, None) => std::thread::sleep(POLL_INTERVAL),
            (Some(ino), None) => {
                let mut fds = [nix::poll::PollFd::new(
                    ino.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(SWEEP_MS)) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        sweep();
        let changed = match &ino {
            Some(ino) => drain(ino, name)?,
            None => {
                let s = stamps(&bound.file, host);
                s != seen
            }
        };
        let now = Instant::now();
        if changed && due.is_none() {
            due = Some((last_copy + interval).max(now));
        }
        if due.is_some_and(|d| d <= now) {
            let round = sync_once(&mut bound, host, dir, &mut last);
            let now = Instant::now();
            due = None;
            match round {
                Round::Copied => last_copy = now,
                Round::Blocked => due = Some(now + MIN_INTERVAL),
                Round::Idle => {}
            }
            seen = stamps(&bound.file, host);
        }
    }
}

/// Reads every queued event; whether one concerns the credentials (the bound inode, the
/// host's file by `name`, or an overflow).
fn drain(ino: &Inotify, name: &std::ffi::OsStr) -> Result<bool> {
    let mut relevant = false;
    loop {
        match ino.read_events() {
            Ok(events) if !events.is_empty() => {
                relevant |= events.iter().any(|e| {
                    e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW)
                        || (e.name.is_none()
                            && e.mask.intersects(
                                AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CLOSE_WRITE,
                            ))
                        || e.name.as_deref() == Some(name)
                })
            }
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => return Ok(relevant),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// What a round did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Nothing to copy (or nothing valid).
    Idle,
    /// A copy was made: the next one waits for [`MIN_INTERVAL`].
    Copied,
    /// A copy to the host is owed but the host's lock is held (by a live claude): tried
    /// again later rather than written without it.
    Blocked,
}

/// One round: read both sides, decide, copy. Errors leave both files as they were.
fn sync_once(bound: &mut Bound, host: &Path, dir: &Path, last: &mut Vec<u8>) -> Round {
    let Some(b) = read_bound(&bound.file) else {
        return Round::Idle;
    };
    let h = read_host(host);
    match decide(h.as_ref(), &b, last) {
        act @ (Action::Nothing | Action::ToBound) => apply(act, bound, host, h, b, last),
        Action::ToHost => {
            let Some(lock) = RefreshLock::take(dir) else {
                return Round::Blocked;
            };
            // Under the lock, both again: a refresh on the host may just have renamed its
            // file; whatever is decided now is done before the lock goes.
            let (Some(b), h) = (read_bound(&bound.file), read_host(host)) else {
                return Round::Idle;
            };
            let act = decide(h.as_ref(), &b, last);
            let round = apply(act, bound, host, h, b, last);
            let hold = HOLD_MS.load(std::sync::atomic::Ordering::Relaxed);
            if hold > 0 {
                std::thread::sleep(Duration::from_millis(hold));
            }
            drop(lock);
            round
        }
    }
}

/// Does what [`decide`] said for `h` and `b` (read just before).
fn apply(
    act: Action,
    bound: &mut Bound,
    host: &Path,
    h: Option<Side>,
    b: Side,
    last: &mut Vec<u8>,
) -> Round {
    let copied = match (act, h) {
        (Action::ToBound, Some(h)) => bound.write(&h.content).ok().map(|()| h.content),
        (Action::ToHost, Some(h)) => write_host(host, h.inode, &b.content)
            .ok()
            .map(|()| b.content),
        (Action::Nothing, Some(h)) if h.content == b.content => Some(b.content),
        _ => None,
    };
    let round = match (act, &copied) {
        (Action::ToBound | Action::ToHost, Some(_)) => Round::Copied,
        _ => Round::Idle,
    };
    if let Some(c) = copied {
        *last = c;
    }
    round
}

/// The sandbox's credentials file as the sync holds it: at first the inode bwrap bound
/// (the host's at the launch), after the first copy from the host a file of the sync's
/// own mounted over it ([`remount`]).
struct Bound {
    file: File,
    /// Where the file is mounted inside the sandbox (the plan's targets of that source).
    targets: Vec<PathBuf>,
    /// The process that started the sync and bwrap.
    parent: i32,
    /// The inotify instance, to watch each new file.
    ino: Option<RawFd>,
    /// The watch of the file mounted last (removed with it: a watch keeps its inode).
    wd: Option<i32>,
}

impl Bound {
    /// Puts `content` in the sandbox: a new file mounted over the old one, so that no
    /// reader inside ever reads a file being written; where that cannot be done (the
    /// sandbox not started yet, no new mount API, a namespace that cannot be joined), in
    /// place as before ([`write_in_place`]: padded, never truncated).
    fn write(&mut self, content: &[u8]) -> std::io::Result<()> {
        if !valid(content) {
            return Err(std::io::Error::other("not a JSON object"));
        }
        let truncate = TRUNCATE.load(std::sync::atomic::Ordering::Relaxed);
        let init = (!truncate && !self.targets.is_empty())
            .then(|| remount::sandbox_init(self.parent))
            .flatten();
        if let Some(init) = init {
            let m = self.file.metadata()?;
            if let Ok(f) = remount::remount(init, &self.targets, (m.dev(), m.ino()), content) {
                if let Some(ino) = self.ino {
                    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", f.as_raw_fd()))
                        .map_err(std::io::Error::other)?;
                    // SAFETY: watches of this process's own instance; a failure only
                    // leaves that file unwatched (the poll of the host's side goes on).
                    let wd = unsafe {
                        libc::inotify_add_watch(
                            ino,
                            path.as_ptr(),
                            libc::IN_CLOSE_WRITE | libc::IN_MODIFY,
                        )
                    };
                    if let Some(old) = self.wd.take() {
                        // SAFETY: as above.
                        unsafe { libc::inotify_rm_watch(ino, old) };
                    }
                    self.wd = (wd >= 0).then_some(wd);
                }
                self.file = f;
                return Ok(());
            }
        }
        write_in_place(&self.file, content)
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
        content: trimmed(&read_capped(f)?).to_vec(),
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

/// Replaces `f`'s content in place in one write at 0, padded with JSON whitespace to
/// the length the file had and never truncated: a reader at any moment reads either the
/// old text or the new one followed by spaces (the torn reads came from the
/// moment between a shorter write and the truncation). A file already past
/// [`MAX_SIZE`] (not one claude wrote) is cut to the content instead.
fn write_in_place(f: &File, content: &[u8]) -> std::io::Result<()> {
    if !valid(content) {
        return Err(std::io::Error::other("not a JSON object"));
    }
    let len = f.metadata()?.len();
    if len > MAX_SIZE || TRUNCATE.load(std::sync::atomic::Ordering::Relaxed) {
        f.write_all_at(content, 0)?;
        f.set_len(content.len() as u64)?;
    } else {
        f.write_all_at(&padded(content, len), 0)?;
    }
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

/// Claude's refresh lock on the host (`mkdir <dir>/.oauth_refresh.lock`), held for one
/// copy (a read of both files and one write) and only while [`HOLD`] is, so that no
/// signal or parent death ends this process with it taken; removed on drop.
/// A lock older than claude's stale time (untouched for 10 s: proper-lockfile touches
/// its own every 5 s; or dated ahead) is a dead holder's, for claude as here: removed
/// and taken. A live one is waited for up to 5 s; then `None` (no copy without it).
///
/// A SIGKILL cannot be waited for: the directory is made under a name of this process's
/// own (`.oauth_refresh.lock.claudebox-<pid>`), reported to the launcher (its identity:
/// device, inode, birth time) and only then renamed into place (`RENAME_NOREPLACE`: a
/// lock taken meanwhile is never replaced). Whenever this process dies, the launcher
/// knows which directory, under either name, is its, and removes it ([`guard_lock`]).
pub struct RefreshLock {
    path: PathBuf,
    id: Option<LockId>,
    _hold: std::sync::MutexGuard<'static, ()>,
}

/// The lock's name in the host's credentials directory.
pub const REFRESH_LOCK: &str = ".oauth_refresh.lock";

/// A lock directory's identity: device, inode and birth time (0 where the file system
/// keeps none), so that a directory made later on a reused inode is not taken for it.
type LockId = (u64, u64, i64, u32);

fn lock_id(p: &Path) -> Option<LockId> {
    let m = std::fs::symlink_metadata(p).ok()?;
    if !m.is_dir() {
        return None;
    }
    let born = m
        .created()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or((0, 0), |d| {
            (i64::try_from(d.as_secs()).unwrap_or(0), d.subsec_nanos())
        });
    Some((m.dev(), m.ino(), born.0, born.1))
}

/// This process's own name for the lock before it is put in place.
fn own_name(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{REFRESH_LOCK}.claudebox-{pid}"))
}

const RECORD: usize = 1 + 8 + 8 + 8 + 4;

/// Tells the launcher: `Some`, about to hold (or holding) the lock of that identity;
/// `None`, holding none. One write of a record smaller than a pipe's atomic size.
fn report(id: Option<LockId>) {
    if !REPORTING.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let rec = record(id);
    // SAFETY: a write from a local buffer; a missing descriptor only fails.
    let _ = unsafe { libc::write(REPORT_FD, rec.as_ptr().cast(), RECORD) };
}

fn record(id: Option<LockId>) -> [u8; RECORD] {
    let mut rec = [0u8; RECORD];
    if let Some((dev, ino, s, ns)) = id {
        rec[0] = 1;
        rec[1..9].copy_from_slice(&dev.to_ne_bytes());
        rec[9..17].copy_from_slice(&ino.to_ne_bytes());
        rec[17..25].copy_from_slice(&s.to_ne_bytes());
        rec[25..29].copy_from_slice(&ns.to_ne_bytes());
    }
    rec
}

fn decode(rec: &[u8; RECORD]) -> Option<LockId> {
    let n8 = |r: std::ops::Range<usize>| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&rec[r]);
        b
    };
    let mut ns = [0u8; 4];
    ns.copy_from_slice(&rec[25..29]);
    (rec[0] == 1).then(|| {
        (
            u64::from_ne_bytes(n8(1..9)),
            u64::from_ne_bytes(n8(9..17)),
            i64::from_ne_bytes(n8(17..25)),
            u32::from_ne_bytes(ns),
        )
    })
}

/// In the launcher, for the life of one sync process (`pid`): reads its reports until it
/// ends; if it ended holding the host's refresh lock, removes that directory (only that
/// one: same identity, under the lock's name or the sync's own).
fn guard_lock(report: OwnedFd, dir: &Path, pid: u32) {
    use std::io::Read;
    let mut from = File::from(report);
    let mut held = None;
    let mut rec = [0u8; RECORD];
    while from.read_exact(&mut rec).is_ok() {
        held = decode(&rec);
    }
    if let Some(id) = held {
        for p in [dir.join(REFRESH_LOCK), own_name(dir, pid)] {
            if lock_id(&p) == Some(id) {
                let _ = std::fs::remove_dir(&p);
            }
        }
    }
}

impl RefreshLock {
    pub fn take(dir: &Path) -> Option<RefreshLock> {
        let path = dir.join(REFRESH_LOCK);
        let mine = own_name(dir, std::process::id());
        for _ in 0..50 {
            let hold = HOLD.lock().unwrap_or_else(|e| e.into_inner());
            // A leftover of this very process (its pid is its own while it lives).
            let _ = std::fs::remove_dir(&mine);
            std::fs::create_dir(&mine).ok()?;
            let id = lock_id(&mine);
            report(id);
            let mut put = nix::fcntl::renameat2(
                None,
                &mine,
                None,
                &path,
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            );
            if matches!(
                put,
                Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS)
            ) {
                // No RENAME_NOREPLACE on this file system (NFS): claude's own way, a
                // mkdir, reported right after (a SIGKILL between the two is not covered).
                let _ = std::fs::remove_dir(&mine);
                put = std::fs::create_dir(&path).map_err(|e| {
                    nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
                });
                let id = lock_id(&path);
                if put.is_ok() {
                    report(id);
                    return Some(RefreshLock {
                        path,
                        id,
                        _hold: hold,
                    });
                }
                report(None);
            }
            match put {
                Ok(()) => {
                    return Some(RefreshLock {
                        path,
                        id,
                        _hold: hold,
                    })
                }
                Err(nix::errno::Errno::EEXIST) => {
                    let _ = std::fs::remove_dir(&mine);
                    report(None);
                    drop(hold);
                    let stale = std::fs::symlink_metadata(&path)
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| beneath::lock_is_stale(t, SystemTime::now()));
                    // Only an empty directory: anything else is not claude's lock.
                    if !(stale && std::fs::remove_dir(&path).is_ok()) {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                Err(_) => {
                    let _ = std::fs::remove_dir(&mine);
                    report(None);
                    return None;
                }
            }
        }
        None
    }
}

impl Drop for RefreshLock {
    fn drop(&mut self) {
        // Only the directory put there: never one another holder made since.
        if lock_id(&self.path) == self.id {
            let _ = std::fs::remove_dir(&self.path);
        }
        report(None);
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

    /// The launcher's side of a sync that died: the lock it reported holding is removed
    /// (under the lock's name or the sync's own); one it let go, or a directory made
    /// since under the same name (another identity), is left.
    #[test]
    fn the_launcher_removes_only_the_lock_a_dead_sync_held() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join(REFRESH_LOCK);
        let guarded = |records: &[Option<LockId>]| {
            let (rd, wr) = nix::unistd::pipe().unwrap();
            let mut wr = File::from(wr);
            for r in records {
                wr.write_all(&record(*r)).unwrap();
            }
            drop(wr);
            guard_lock(rd, d.path(), 4242);
        };
        // Held when it died: removed.
        std::fs::create_dir(&lock).unwrap();
        guarded(&[lock_id(&lock)]);
        assert!(!lock.exists());
        // Killed before the rename: its own name is removed.
        let own = own_name(d.path(), 4242);
        std::fs::create_dir(&own).unwrap();
        guarded(&[lock_id(&own)]);
        assert!(!own.exists());
        // Let go before it died: a lock there now is another holder's.
        std::fs::create_dir(&lock).unwrap();
        guarded(&[lock_id(&lock), None]);
        assert!(lock.exists());
        // Held, but the directory there now is another one (removed and made again).
        let id = lock_id(&lock);
        std::fs::remove_dir(&lock).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::create_dir(&lock).unwrap();
        let now = lock_id(&lock);
        if now != id {
            guarded(&[id]);
            assert!(lock.exists(), "another holder's lock was removed");
        }
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
        let now = std::fs::read(&p).unwrap();
        assert_eq!(now.len(), b"{\"long\":\"xxxxxxxxxxxxxxxx\"}".len());
        assert_eq!(trimmed(&now), b"{}");
        assert!(valid(&now));
    }
}
