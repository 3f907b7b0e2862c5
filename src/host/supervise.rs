//! claudebox as bwrap's small supervising parent: it starts bwrap as its child, forwards
//! SIGHUP and SIGTERM to it, waits, and then (after the exit review) ends the way bwrap
//! ended: the same exit status, or killed by the same signal.
//!
//! What stays as it was when claudebox exec'd bwrap: both stay in the caller's process
//! group, so Ctrl-C (SIGINT, ignored by both as before; the agent gets it) and Ctrl-Z
//! (SIGTSTP stops both, `fg`'s SIGCONT continues both; the wait ignores stops) reach them
//! as the terminal sends them; bwrap's `--die-with-parent` ends the sandbox when this
//! process is killed, and this process gets SIGTERM (a parent-death signal, forwarded to
//! bwrap) when its own parent dies, as bwrap did when claudebox exec'd it. It is also a child subreaper: a bwrap child orphaned by a bwrap
//! killed in its first milliseconds (bubblewrap issue #633, blocked for ever) becomes its
//! child and is killed once bwrap has exited.
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

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
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
pub fn run<S: AsRef<OsStr>>(
    argv: &[S],
    pre_exec: &dyn Fn() -> io::Result<()>,
    watch_setup: bool,
) -> io::Result<Ended> {
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
    // SAFETY: the child only makes async-signal-safe calls before exec or _exit.
    match unsafe { nix::unistd::fork() }? {
        ForkResult::Child => {
            drop(rd);
            for (s, old_action) in &previous {
                // SAFETY: restoring the dispositions claudebox had (default or ignored).
                let _ = unsafe { signal::sigaction(*s, old_action) };
            }
            let _ = signal::sigprocmask(signal::SigmaskHow::SIG_SETMASK, Some(&old), None);
            // SAFETY: SIG_DFL installs no handler.
            let _ = unsafe { signal::signal(Signal::SIGPIPE, SigHandler::SigDfl) };
            let redirected = match err_wr {
                // SAFETY: dup2 on descriptors this process holds.
                Some(w) if unsafe { libc::dup2(w, 2) } < 0 => Err(io::Error::last_os_error()),
                _ => Ok(()),
            };
            let e = match redirected.and_then(|()| pre_exec()) {
                Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
                Ok(()) => {
                    // SAFETY: a NUL-terminated array of valid C strings, made before the fork.
                    unsafe { libc::execvp(program.as_ptr(), ptrs.as_ptr()) };
                    nix::errno::Errno::last_raw()
                }
            };
            let _ = nix::unistd::write(&wr, &e.to_ne_bytes());
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => {
            drop(wr);
            let watcher = err_pipe.map(|(r, w)| {
                drop(w);
                Watcher::start(r)
            });
            CHILD.store(child.as_raw(), Ordering::SeqCst);
            let _ = signal::sigprocmask(signal::SigmaskHow::SIG_SETMASK, Some(&old), None);
            let mut buf = [0u8; 4];
            let n = loop {
                match nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&rd), &mut buf) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    r => break r.unwrap_or(0),
                }
            };
            let status = wait_for(child);
            CHILD.store(0, Ordering::SeqCst);
            if n == 4 {
                return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(buf)));
            }
            end_orphans(child);
            Ok(match watcher {
                None => Ended::Ran(status),
                Some(w) => w.ended(status),
            })
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

/// Kills and reaps the bwrap processes left as this process's children once bwrap has
/// exited: a sandbox's pid 1 orphaned while it tears down (it would die with its parent
/// anyway), or the child of a bwrap killed before it let it go on (bubblewrap #633).
fn end_orphans(bwrap: Pid) {
    let me = std::process::id();
    let Ok(list) = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")) else {
        return;
    };
    for pid in list
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        if pid == bwrap.as_raw() {
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
