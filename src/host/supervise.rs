//! claudebox as bwrap's small supervising parent: it starts bwrap as its child, forwards
//! SIGHUP and SIGTERM to it, waits, and then (after the exit review) ends the way bwrap
//! ended: the same exit status, or killed by the same signal. One that comes before the
//! child's pid is known (on any of claudebox's threads) is kept and forwarded once it is
//! (`PENDING`; test `launch_kills::a_sigterm_in_bwrap_s_first_milliseconds_is_not_lost`).
//!
//! What stays as it was when claudebox exec'd bwrap: both stay in the caller's process
//! group, so Ctrl-C (SIGINT, ignored by both as before; the agent gets it) and Ctrl-Z
//! (SIGTSTP stops both, `fg`'s SIGCONT continues both; the wait ignores stops) reach them
//! as the terminal sends them; this process gets SIGTERM (a parent-death signal, forwarded
//! to bwrap) when its own parent dies, as bwrap did when claudebox exec'd it.
//!
//! Between this process and bwrap stands a small keeper (a fork of this process, see
//! [`keep`]) that outlives a claudebox killed with SIGKILL: bwrap's `--die-with-parent`
//! (which binds bwrap to the keeper) is armed only some time after bwrap starts, and
//! bwrap's child waits for ever if bwrap dies before letting it go on (bubblewrap issue
//! #633). The keeper is a child subreaper: it kills bwrap when claudebox dies, and every
//! bwrap orphan left once bwrap has ended, then passes bwrap's status on and exits (or,
//! holding the exit review's inotify instance, closes everything else and waits for
//! claudebox's end: see [`run`]'s `hold`). No bwrap outlives the launch, and nothing
//! holds the caller's stderr after it. A SIGKILL of
//! the whole process group (keeper included) is covered by the group itself: bwrap and its
//! waiting child are in it (never `--new-session` or `setsid` before the sandbox is up), and
//! a SIGKILL from an ancestor pid namespace reaches a namespace's init (test
//! `launch_kills::group_killed_while_bwrap_s_child_waits_leaves_nothing`). A kill by name
//! is covered by the keeper's own name ([`KEEPER_NAME`], no `claudebox` in it): `pkill
//! claudebox` (a regex on the name) and `killall claudebox` (the exact name) kill claudebox
//! and spare the keeper, which clears up as above; `pkill -f claudebox` (the command line,
//! the keeper's still claudebox's) also kills bwrap and its child, whose arguments name
//! `~/.claudebox` (test `launch_kills::killed_by_name_while_bwrap_s_child_waits_leaves_nothing`).
//! Not covered: a kill that names the keeper itself with claudebox (both pids, or `killall
//! /path/to/claudebox`, which matches the executable) in #633's window leaves bwrap's child
//! stuck, holding the caller's stderr, until the project's next launch (or `--list`,
//! `--gc`) ends it (`host::holders::reap`).
//!
//! With `watch_setup`, bwrap's stderr is a pipe read here until the step inside writes
//! `UP_MARKER` on it (bwrap's setup is done; it then puts the caller's stderr back for the
//! agent): until then bwrap's lines are held, so a launch whose setup failed is told from
//! the agent's own exit ([`Ended::SetupFailed`], with those lines), and after it whatever
//! bwrap writes is copied to this process's stderr as it comes.

use std::ffi::{CString, OsStr};
use std::io;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use nix::libc;
use nix::sys::signal::{self, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{ForkResult, Pid};

/// The signals forwarded to bwrap (the terminal's SIGINT/SIGQUIT/SIGTSTP reach it
/// directly, through the process group).
const FORWARDED: [Signal; 2] = [Signal::SIGHUP, Signal::SIGTERM];

static CHILD: AtomicI32 = AtomicI32::new(0);

/// A forwarded signal that came while no child was known (0: none): forwarded as soon as
/// one is. Blocking the signals across the fork covers only the thread that forks; another
/// thread of claudebox (it has some by then) took them with no child known, and they were
/// lost: a SIGTERM in bwrap's first milliseconds left the sandbox running (4 of 150 kills
/// of a first launch, as root).
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
        return;
    }
    PENDING.store(sig, Ordering::SeqCst);
    // The child may have become known meanwhile: whichever of this and [`forward_pending`]
    // takes the signal out of PENDING forwards it.
    if CHILD.load(Ordering::SeqCst) > 0 {
        forward_pending();
    }
}

/// Forwards the signal left in PENDING, if any, to CHILD (async-signal-safe).
fn forward_pending() {
    let sig = PENDING.swap(0, Ordering::SeqCst);
    let pid = CHILD.load(Ordering::SeqCst);
    if sig > 0 && pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// How bwrap ended.
#[derive(Debug)]
pub enum Ended {
    /// The sandbox came up (or nobody watched): the agent's status, or bwrap's own.
    Ran(WaitStatus),
    /// bwrap failed before the sandbox was up: its status and what it wrote on stderr (not
    /// printed yet).
    SetupFailed(WaitStatus, Vec<u8>),
}

/// Starts `argv` as a child and waits for it to end. `Err`: it could not be started (the
/// exec failed in the child: its error).
/// `pre_exec` runs in the child right before the exec (async-signal-safe calls only); its
/// error is the launch's. `watch_setup`: the child's stderr is a pipe read until the step
/// inside writes `UP_MARKER` (see the module's header).
///
/// `hold`: a descriptor whose last close must not fall to this process (an inotify
/// instance: its last close waits for the kernel, see `state::review`). Once bwrap and
/// every orphan are gone, the keeper closes all its other descriptors (the caller's
/// stdio too), sends bwrap's status and keeps `hold` open until this process has ended;
/// this process does not wait for the keeper's exit (the second value: the keeper holds
/// it). Without `hold`, or where the keeper cannot do so, it exits at once as before and
/// is waited for.
pub fn run<S: AsRef<OsStr>>(
    argv: &[S],
    pre_exec: &dyn Fn() -> io::Result<()>,
    watch_setup: bool,
    hold: Option<libc::c_int>,
) -> io::Result<(Ended, bool)> {
    let mut args = Vec::with_capacity(argv.len());
    for a in argv {
        args.push(CString::new(a.as_ref().as_bytes()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "an argument holds a NUL byte")
        })?);
    }
    let Some(program) = args.first().cloned() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no program to run",
        ));
    };
    // No allocation between fork and exec.
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let _ = nix::sys::prctl::set_child_subreaper(true);
    // Blocked across the fork: a signal that comes meanwhile is forwarded once the
    // child's pid is known.
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    let mut old = SigSet::empty();
    signal::sigprocmask(signal::SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old))?;
    let action = signal::SigAction::new(
        SigHandler::Handler(forward),
        signal::SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    let mut previous = Vec::new();
    for s in FORWARDED {
        // SAFETY: the handler only calls kill(2).
        previous.push((s, unsafe { signal::sigaction(s, &action) }?));
    }
    // As when claudebox exec'd bwrap (whose --die-with-parent then applied to this very
    // process): the sandbox ends when claudebox's parent dies. SIGTERM, forwarded to bwrap
    // like any other (blocked until the child's pid is known), so the review still runs.
    let parent = nix::unistd::getppid();
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
    if nix::unistd::getppid() != parent {
        let _ = signal::raise(Signal::SIGTERM);
    }
    // The exec's error comes back through a close-on-exec pipe.
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let err_pipe = if watch_setup {
        Some(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
    } else {
        None
    };
    let err_wr = err_pipe
        .as_ref()
        .map(|(_, w)| std::os::fd::AsRawFd::as_raw_fd(w));
    // bwrap's wait status, from the keeper.
    let (status_rd, status_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let me = nix::unistd::getpid();
    let start = Start {
        program: &program,
        argv: &ptrs,
        pre_exec,
        previous: &previous,
        old_mask: &old,
        exec_err: std::os::fd::AsRawFd::as_raw_fd(&wr),
        err_wr,
        status_wr: std::os::fd::AsRawFd::as_raw_fd(&status_wr),
        launcher: me,
        rename: named_keeper(),
        hold,
    };
    // SAFETY: the child (the keeper) only makes async-signal-safe calls (see `keep`).
    match unsafe { nix::unistd::fork() }? {
        ForkResult::Child => {
            drop(rd);
            drop(status_rd);
            keep(&start)
        }
        ForkResult::Parent { child } => {
            drop(wr);
            drop(status_wr);
            let watcher = err_pipe.map(|(r, w)| {
                drop(w);
                Watcher::start(r)
            });
            CHILD.store(child.as_raw(), Ordering::SeqCst);
            forward_pending();
            let _ = signal::sigprocmask(signal::SigmaskHow::SIG_SETMASK, Some(&old), None);
            let mut buf = [0u8; 4];
            let n = read_full(&rd, &mut buf);
            // bwrap's status and whether the keeper holds `hold`, sent once bwrap and every
            // orphan are gone; nothing (the keeper was killed, or bwrap never started): the
            // keeper's own end tells.
            let mut raw = [0u8; 8];
            let sent = read_full(&status_rd, &mut raw) == 8;
            let field = |i: usize| i32::from_ne_bytes([raw[i], raw[i + 1], raw[i + 2], raw[i + 3]]);
            let holding = sent && field(4) == 1;
            // A holding keeper waits for this process's end: not waited for.
            let kept = if holding {
                WaitStatus::Exited(child, 1)
            } else {
                wait_for(child)
            };
            CHILD.store(0, Ordering::SeqCst);
            let status = if sent {
                WaitStatus::from_raw(child, field(0)).unwrap_or(kept)
            } else {
                kept
            };
            if n == 4 {
                return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(buf)));
            }
            end_orphans(child);
            let ended = match watcher {
                None => Ended::Ran(status),
                Some(w) => w.ended(status),
            };
            Ok((ended, holding))
        }
    }
}

/// Reads up to `buf.len()` bytes (a pipe's writer writes them at once): how many came
/// before the end.
fn read_full(fd: &OwnedFd, buf: &mut [u8]) -> usize {
    loop {
        match nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(fd), buf) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r.unwrap_or(0),
        }
    }
}

/// What the keeper needs to start bwrap (all made before the fork: no allocation after it).
struct Start<'a> {
    program: &'a CString,
    argv: &'a [*const libc::c_char],
    pre_exec: &'a dyn Fn() -> io::Result<()>,
    previous: &'a [(Signal, signal::SigAction)],
    old_mask: &'a SigSet,
    exec_err: libc::c_int,
    err_wr: Option<libc::c_int>,
    status_wr: libc::c_int,
    launcher: Pid,
    /// The keeper takes [`KEEPER_NAME`] (false only for the control, see [`named_keeper`]).
    rename: bool,
    /// Kept open by the keeper until the launcher has ended (see [`run`]).
    hold: Option<libc::c_int>,
}

/// The keeper's own name (`comm`), which holds no `claudebox`: `pkill claudebox` (a regex
/// on the name) and `killall claudebox` (the exact name) kill claudebox and spare its
/// keeper, which then kills bwrap and bwrap's orphaned child. Named `claudebox` like the
/// launcher, the keeper died with it, bwrap died of its parent-death signal and its child
/// was left blocked (bubblewrap #633), holding the caller's stderr and the run slot.
pub const KEEPER_NAME: &std::ffi::CStr = c"cbx-keeper";

/// Whether the keeper takes its own name: always, but for the control of
/// `launch_kills::killed_by_name_while_bwrap_s_child_waits_leaves_nothing`
/// (`CLAUDEBOX_TEST_KEEPER_AS_CLAUDEBOX`, debug builds only; a release build ignores it).
fn named_keeper() -> bool {
    super::test_switch::get("CLAUDEBOX_TEST_KEEPER_AS_CLAUDEBOX").is_none()
}

/// The signal the keeper gets when the launching claudebox dies (a parent-death signal).
const LAUNCHER_GONE: Signal = Signal::SIGUSR2;

extern "C" fn launcher_gone(_: libc::c_int) {
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// The keeper: a forked copy of claudebox between it and bwrap that outlives a claudebox
/// killed with SIGKILL. bwrap's `--die-with-parent` is armed only some time after its
/// start, and its child waits for it for ever if it dies first (bubblewrap #633): a
/// SIGKILL of claudebox in bwrap's first milliseconds left either a sandbox running
/// without its claudebox or a stuck child holding the caller's stderr. The keeper is a
/// child subreaper: it gets bwrap's orphans; on claudebox's death (its parent-death
/// signal) it kills bwrap, and once bwrap has ended it kills and reaps every orphan left,
/// sends bwrap's wait status to claudebox and exits (with `hold`: closes every other
/// descriptor first and exits once claudebox has ended). SIGHUP and SIGTERM (forwarded by
/// claudebox) it forwards to bwrap; SIGINT/SIGQUIT it ignores as claudebox does.
/// Async-signal-safe calls only: claudebox may have threads.
fn keep(s: &Start) -> ! {
    // SAFETY: every call below is a plain system call (or libc's thin wrapper of one) on
    // memory made before the fork; nothing allocates or takes a lock.
    unsafe {
        // The launcher forwards any signal it holds to this process once it knows its pid.
        PENDING.store(0, Ordering::SeqCst);
        if s.rename {
            libc::prctl(libc::PR_SET_NAME, KEEPER_NAME.as_ptr(), 0, 0, 0);
        }
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        let gone = signal::SigAction::new(
            SigHandler::Handler(launcher_gone),
            signal::SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let _ = signal::sigaction(LAUNCHER_GONE, &gone);
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&raw mut block);
        libc::sigaddset(&raw mut block, LAUNCHER_GONE as libc::c_int);
        libc::sigprocmask(libc::SIG_BLOCK, &raw const block, std::ptr::null_mut());
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            LAUNCHER_GONE as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::getppid() != s.launcher.as_raw() {
            libc::_exit(1); // claudebox died before bwrap was started: nothing to start
        }
        // Out of the project for the sandbox's life, and bwrap's outer process with it
        // (bwrap goes to the plan's `--chdir` inside; every path it is given is absolute).
        super::companion::Outside::chdir_raw();
        let bwrap = libc::fork();
        if bwrap < 0 {
            let e = nix::errno::Errno::last_raw();
            let _ = libc::write(s.exec_err, (&raw const e).cast(), 4);
            libc::_exit(127);
        }
        if bwrap == 0 {
            start_bwrap(s);
        }
        CHILD.store(bwrap, Ordering::SeqCst);
        libc::close(s.exec_err);
        if let Some(w) = s.err_wr {
            libc::close(w);
        }
        // The signals blocked across the forks come now: forwarded, or bwrap killed.
        libc::sigprocmask(libc::SIG_UNBLOCK, &raw const block, std::ptr::null_mut());
        let _ = signal::sigprocmask(signal::SigmaskHow::SIG_SETMASK, Some(s.old_mask), None);
        let mut status: libc::c_int = 0;
        loop {
            let r = libc::waitpid(bwrap, &raw mut status, 0);
            if r == bwrap {
                break;
            }
            if r < 0 && nix::errno::Errno::last() != nix::errno::Errno::EINTR {
                status = 1 << 8;
                break;
            }
        }
        CHILD.store(0, Ordering::SeqCst);
        kill_orphans();
        let launcher = match s.hold {
            Some(fd) => hold_alone(s.launcher, fd, s.status_wr),
            None => None,
        };
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&status.to_ne_bytes());
        msg[4..].copy_from_slice(&i32::from(launcher.is_some()).to_ne_bytes());
        let _ = libc::write(s.status_wr, msg.as_ptr().cast(), msg.len());
        if let Some(pidfd) = launcher {
            // Until the launcher has ended (a signal, its parent-death one included, ends
            // the wait too; a minute at most): `hold`'s last close is this process's.
            let mut p = libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            };
            libc::poll(&raw mut p, 1, 60_000);
        }
        libc::_exit(0)
    }
}

/// In the keeper, once bwrap and its orphans are gone: a pidfd of the launcher, with every
/// descriptor but it, `hold` and `status_wr` closed (the caller's stdio too: the keeper
/// may outlive the launcher, and nothing of the launch may hold them then). `None`, and
/// the keeper exits at once: no pidfd (before Linux 5.3, or the launcher gone), or a
/// descriptor left open (`close_range` before Linux 5.9).
///
/// # Safety
/// Async-signal-safe calls only; call in the single-threaded keeper.
unsafe fn hold_alone(
    launcher: Pid,
    hold: libc::c_int,
    status_wr: libc::c_int,
) -> Option<libc::c_int> {
    // SAFETY: raw system calls with no pointers.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, launcher.as_raw(), 0);
        let pidfd = libc::c_int::try_from(pidfd).ok().filter(|fd| *fd >= 0)?;
        let mut keep = [hold, status_wr, pidfd];
        keep.sort_unstable();
        let mut from: libc::c_uint = 0;
        let mut closed = true;
        for k in keep {
            let k = libc::c_uint::try_from(k).unwrap_or(0);
            if k > from {
                closed &= libc::syscall(libc::SYS_close_range, from, k - 1, 0) == 0;
            }
            from = k + 1;
        }
        closed &= libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) == 0;
        if !closed {
            libc::close(pidfd);
            return None;
        }
        Some(pidfd)
    }
}

/// In the keeper's child: back to claudebox's signal dispositions and mask, stderr on
/// the watched pipe, `pre_exec`, then bwrap. Its error goes back on the exec-error pipe.
fn start_bwrap(s: &Start) -> ! {
    for (sig, old_action) in s.previous {
        if matches!(old_action.handler(), SigHandler::SigIgn) {
            // SAFETY: restoring the disposition claudebox had (ignored).
            let _ = unsafe { signal::sigaction(*sig, old_action) };
        } else {
            // SAFETY: SIG_DFL installs no handler. (A handler here is `forward`, from an
            // earlier try of the launch: bwrap gets the default, as at the first try.)
            let _ = unsafe { signal::signal(*sig, SigHandler::SigDfl) };
        }
    }
    // SAFETY: SIG_DFL installs no handler.
    let _ = unsafe { signal::signal(LAUNCHER_GONE, SigHandler::SigDfl) };
    let _ = signal::sigprocmask(signal::SigmaskHow::SIG_SETMASK, Some(s.old_mask), None);
    // SAFETY: SIG_DFL installs no handler.
    let _ = unsafe { signal::signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    let redirected = match s.err_wr {
        // SAFETY: dup2 on descriptors this process holds.
        Some(w) if unsafe { libc::dup2(w, 2) } < 0 => Err(io::Error::last_os_error()),
        _ => Ok(()),
    };
    let e = match redirected.and_then(|()| (s.pre_exec)()) {
        Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
        Ok(()) => {
            // SAFETY: a NUL-terminated array of valid C strings, made before the fork.
            unsafe { libc::execvp(s.program.as_ptr(), s.argv.as_ptr()) };
            nix::errno::Errno::last_raw()
        }
    };
    // SAFETY: a 4-byte write from a local, then leaving without the parent's destructors.
    unsafe {
        let _ = libc::write(s.exec_err, (&raw const e).cast(), 4);
        libc::_exit(127)
    }
}

/// In the keeper, once bwrap has ended: kills and reaps every process left as its child
/// (bwrap's own child, orphaned: the sandbox's pid 1 tearing down, or stuck at start),
/// read from `/proc/thread-self/children` into a buffer on the stack.
///
/// # Safety
/// Async-signal-safe calls only; call in the single-threaded keeper.
unsafe fn kill_orphans() {
    for _ in 0..64 {
        // SAFETY: open, read and close of a NUL-terminated path into a stack buffer:
        // async-signal-safe system calls on this process's own descriptor.
        let (buf, n) = unsafe {
            let fd = libc::open(
                c"/proc/thread-self/children".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                break;
            }
            let mut buf = [0u8; 4096];
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            libc::close(fd);
            (buf, n)
        };
        let n = usize::try_from(n).unwrap_or(0);
        let mut any = false;
        let mut pid: libc::pid_t = 0;
        for &b in buf[..n].iter().chain(std::iter::once(&b' ')) {
            if b.is_ascii_digit() {
                pid = pid
                    .saturating_mul(10)
                    .saturating_add(libc::pid_t::from(b - b'0'));
            } else if pid > 0 {
                // SAFETY: kill and waitpid of this process's own child, by pid.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    let mut st = 0;
                    while libc::waitpid(pid, &raw mut st, 0) < 0
                        && nix::errno::Errno::last() == nix::errno::Errno::EINTR
                    {
                    }
                }
                any = true;
                pid = 0;
            }
        }
        if !any {
            break;
        }
    }
}

/// What the reader of bwrap's stderr has seen: the sandbox up, the lines held until then.
#[derive(Default)]
struct Seen {
    up: bool,
    held: Vec<u8>,
}

/// A thread reading bwrap's stderr (it must not be the waiting thread: a bwrap child stuck
/// at start holds the pipe until the wait ends and kills it).
struct Watcher {
    seen: Arc<Mutex<Seen>>,
    done: mpsc::Receiver<()>,
}

impl Watcher {
    fn start(rd: OwnedFd) -> Watcher {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, done) = mpsc::channel();
        let shared = Arc::clone(&seen);
        std::thread::spawn(move || {
            read_stderr(std::fs::File::from(rd), &shared);
            let _ = tx.send(());
        });
        Watcher { seen, done }
    }

    /// Once bwrap has exited (and its orphans are gone): waits a little for the last of
    /// its lines (the pipe's end), then says how it ended.
    fn ended(self, status: WaitStatus) -> Ended {
        let _ = self.done.recv_timeout(Duration::from_secs(1));
        let seen = std::mem::take(&mut *self.seen.lock().unwrap_or_else(|p| p.into_inner()));
        let failed = !matches!(status, WaitStatus::Exited(_, 0));
        if seen.up || !failed {
            let _ = io::stderr().write_all(&seen.held);
            Ended::Ran(status)
        } else {
            Ended::SetupFailed(status, seen.held)
        }
    }
}

fn read_stderr(mut pipe: std::fs::File, seen: &Mutex<Seen>) {
    let marker = crate::policy::confinement::UP_MARKER;
    let mut buf = [0u8; 4096];
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
        if s.up {
            drop(s);
            let _ = io::stderr().write_all(&buf[..n]);
            continue;
        }
        s.held.extend_from_slice(&buf[..n]);
        if let Some(at) = s.held.windows(marker.len()).position(|w| w == marker) {
            let mut held = std::mem::take(&mut s.held);
            held.drain(at..at + marker.len());
            s.up = true;
            drop(s);
            let _ = io::stderr().write_all(&held);
        }
    }
}

fn wait_for(child: Pid) -> WaitStatus {
    loop {
        match waitpid(child, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            Ok(s @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => return s,
            Ok(_) => continue,
            Err(_) => return WaitStatus::Exited(child, 1),
        }
    }
}

/// Kills and reaps the bwrap processes left as this process's children once the keeper
/// has exited (this process is a child subreaper too): bwrap's orphans reach it only if
/// the keeper itself was killed (SIGKILL) before it could end them.
fn end_orphans(keeper: Pid) {
    let me = std::process::id();
    let Ok(list) = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")) else {
        return;
    };
    for pid in list
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        if pid == keeper.as_raw() {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() != "bwrap" {
            continue; // the proxy or the credentials sync: they end with this process
        }
        let pid = Pid::from_raw(pid);
        let _ = signal::kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
    }
}

/// Ends this process the way the child ended: its exit status, or the same signal
/// (default action restored, no core file).
pub fn exit_as(status: WaitStatus) -> ! {
    match status {
        WaitStatus::Exited(_, code) => std::process::exit(code),
        WaitStatus::Signaled(_, sig, _) => {
            let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
            // SAFETY: SIG_DFL installs no handler.
            let _ = unsafe { signal::signal(sig, SigHandler::SigDfl) };
            let mut set = SigSet::empty();
            set.add(sig);
            let _ = signal::sigprocmask(signal::SigmaskHow::SIG_UNBLOCK, Some(&set), None);
            let _ = signal::raise(sig);
            std::process::exit(128 + sig as i32)
        }
        _ => std::process::exit(1),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, Write};
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;

    /// The descriptor numbers `keeper_role` finds its pipes on.
    const CALLERS: i32 = 10;
    const HELD: i32 = 11;
    const RELEASE: i32 = 12;
    const ROLE: &str = "CLAUDEBOX_TEST_KEEPER_ROLE";

    /// Not a test on its own: the launcher's part of
    /// `a_holding_keeper_keeps_only_what_it_holds_and_ends_with_the_launcher`, in a process
    /// of its own (that test starts this binary for it, with [`ROLE`] set).
    #[test]
    fn keeper_role() {
        if std::env::var_os(ROLE).is_none() {
            return;
        }
        let (ended, holding) = super::run(&["/bin/true"], &|| Ok(()), false, Some(HELD))
            .expect("bwrap's stand-in runs");
        assert!(matches!(ended, super::Ended::Ran(_)), "{ended:?}");
        // Only the keeper has them now.
        // SAFETY: descriptors this process was started with, not used elsewhere.
        unsafe {
            nix::libc::close(CALLERS);
            nix::libc::close(HELD);
        }
        let mut out = std::io::stdout();
        let _ = writeln!(out, "holding {holding}");
        let _ = out.flush();
        // Alive until the test says so (the end of its pipe).
        let mut b = [0u8; 1];
        // SAFETY: a read into a local buffer.
        unsafe { nix::libc::read(RELEASE, b.as_mut_ptr().cast(), 1) };
    }

    /// Whether `fd` shows `events` within `ms`.
    fn polled(fd: &OwnedFd, events: nix::libc::c_short, ms: i32) -> bool {
        let mut p = nix::libc::pollfd {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack.
        unsafe { nix::libc::poll(&raw mut p, 1, ms) == 1 && p.revents != 0 }
    }

    /// The keeper that holds the review's inotify instance past the launcher's end holds
    /// nothing else of the launch (the caller's descriptors, a pipe here, reach their end
    /// while the launcher still runs) and lets go of it once the launcher has ended.
    /// Control: without the keeper's `close_range` calls (`hold_alone`) the caller's pipe
    /// stays open until the launcher ends (fails after 5 s).
    #[test]
    fn a_holding_keeper_keeps_only_what_it_holds_and_ends_with_the_launcher() {
        let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let (callers_r, callers_w) = pipe();
        let (held_r, held_w) = pipe();
        let (release_r, release_w) = pipe();
        let fds = [
            (callers_w.as_raw_fd(), CALLERS),
            (held_r.as_raw_fd(), HELD),
            (release_r.as_raw_fd(), RELEASE),
        ];
        let mut cmd = std::process::Command::new(std::env::current_exe().expect("test binary"));
        cmd.args([
            "--exact",
            "host::supervise::tests::keeper_role",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(ROLE, "1")
        .stdout(std::process::Stdio::piped());
        // SAFETY: fcntl and dup2 only (async-signal-safe), on descriptors open in the child.
        unsafe {
            cmd.pre_exec(move || {
                // Each moved above the targets first: a pipe's own number may be another's
                // target (other tests' descriptors decide them), and placing one there
                // first replaced it (CI hung: the role read HELD's pipe for RELEASE's).
                let mut high = [0; 3];
                for (h, (from, _)) in high.iter_mut().zip(fds) {
                    *h = nix::libc::fcntl(from, nix::libc::F_DUPFD_CLOEXEC, 64);
                    if *h < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for (h, (_, to)) in high.into_iter().zip(fds) {
                    if nix::libc::dup2(h, to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut launcher = cmd.spawn().expect("the launcher's stand-in starts");
        drop((callers_w, held_r, release_r));
        let mut said = String::new();
        let mut out = std::io::BufReader::new(launcher.stdout.take().expect("stdout"));
        for line in (&mut out).lines() {
            let line = line.expect("a line");
            // (after libtest's own "test ... " on the same line)
            if let Some(at) = line.find("holding ") {
                said = line[at..].to_string();
                break;
            }
        }
        assert_eq!(said, "holding true", "the keeper did not hold");
        // The launcher (alive) and its keeper have let go of the caller's descriptor.
        assert!(
            polled(&callers_r, nix::libc::POLLIN, 5_000),
            "the keeper still holds the caller's descriptor"
        );
        let mut b = [0u8; 1];
        assert_eq!(nix::unistd::read(callers_r.as_raw_fd(), &mut b), Ok(0));
        // The keeper holds `hold` while the launcher lives...
        assert!(
            !polled(&held_w, nix::libc::POLLERR, 300),
            "the keeper let go of what it holds before the launcher ended"
        );
        // ... and lets go of it once the launcher has ended.
        drop(release_w);
        let _ = std::io::copy(&mut out, &mut std::io::sink());
        let _ = launcher.wait();
        assert!(
            polled(&held_w, nix::libc::POLLERR, 5_000),
            "the keeper outlived the launcher"
        );
    }
}
