//! The file supervisor: the step inside forks before the command; the parent (not
//! dumpable, a child subreaper) becomes the supervisor and the child installs a second
//! seccomp filter whose action for the calls of `policy::confinement::NOTIFIED` is
//! `SECCOMP_RET_USER_NOTIF`, hands its listener to the parent over a socketpair and execs
//! the command. The supervisor then makes each such call itself:
//!
//! - it reads the path(s) from the caller's memory (`process_vm_readv`; being the caller's
//!   ancestor it may under Yama's ptrace scope 1), opens the caller's base (its `dirfd`,
//!   cwd or root through `/proc/TID/...`) and checks with `SECCOMP_IOCTL_NOTIF_ID_VALID`
//!   that the caller is still the one that asked;
//! - it opens the parent directory of the final name itself (`O_PATH|O_DIRECTORY`) and
//!   refuses with EPERM a guarded name (`GUARDED_NAMES`) in a guarded git dir, compared
//!   by `(st_dev, st_ino)`;
//! - otherwise it makes the call on that descriptor (`openat(parent, name, flags |
//!   O_NOFOLLOW)`, a final symlink followed by itself, at most 40 hops; `renameat2`,
//!   `linkat`, `symlinkat`, `mknodat`, `mkdirat`) with the caller's umask, and answers with the
//!   result: an errno, or the opened file's descriptor injected into the caller
//!   (`SECCOMP_IOCTL_NOTIF_ADDFD` with `SECCOMP_ADDFD_FLAG_SEND`).
//!
//! It never answers `SECCOMP_USER_NOTIF_FLAG_CONTINUE` to a call that names a path: a
//! path read from the caller's memory may be rewritten by another of its threads before
//! the kernel reads it again. `umask()` (no path) is let go on, after its process is
//! marked to have its umask read anew at each call ([`Proc`]).
//!
//! Several threads answer (one per CPU, 2 to 8), each with a filesystem context, and so
//! a umask, of its own; a caller's `/proc/TID` is opened once and kept (its umask read
//! then), its root opened once per call.
//! The supervisor exits with the command's status (128 + the signal that ended it, as bwrap
//! reports one), ignoring the signals a terminal or the agent sends to the group; if the
//! agent kills it, bwrap ends the sandbox; with no supervisor the notified calls fail
//! (ENOSYS), never pass.
//!
//! A caller whose root is not the supervisor's (another mount namespace or root: a sandbox
//! inside this one) has its paths walked within its own root ([`walk`]), never by the
//! supervisor's own lookup, which would follow an absolute symlink or `..` into the
//! supervisor's view, where the inner sandbox's read-only mounts are not.
//!
//! Not the kernel's exact semantics (each said in docs/security.md): restrictions a
//! process put on itself (its own Landlock domain) do
//! not bind the supervisor's call; `/proc/self` in a path means the caller only for its
//! `fd` directory and its process directory.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use nix::libc;

use crate::policy::confinement as switches;
use crate::policy::confinement::{When, GUARDED_NAMES, GUARDED_TOP_NAMES, NOTIFIED};

/// A guarded directory: `(st_dev, st_ino)` and the names refused in it.
type Guard = ((u64, u64), &'static [(&'static str, &'static str)]);

/// Whether this kernel and host let the supervisor run: `Err(why not)`.
pub fn available() -> std::result::Result<(), String> {
    let rel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut nums = rel
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    let (major, minor) = (
        nums.next().and_then(|r| r.ok()).unwrap_or(0),
        nums.next().and_then(|r| r.ok()).unwrap_or(0),
    );
    if (major, minor) < (5, 19) {
        return Err(format!(
            "Linux {rel} has no seccomp SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV (5.19+), without \
             which a signal would make a supervised call twice"
        ));
    }
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        if s.trim().parse::<u32>().unwrap_or(3) >= 2 {
            return Err(format!(
                "Yama's ptrace_scope is {} (the supervisor must read the caller's memory)",
                s.trim()
            ));
        }
    }
    Ok(())
}

/// Starts the supervisor when `dirs` are guarded and the kernel can: returns in the child
/// (the command's process, filtered), never in the parent (the supervisor exits with the
/// command's status). Nothing to guard, the tests' switch, or a kernel without the
/// mechanism: returns at once (the launch's inotify watch is the protection then).
pub fn start(dirs: &[PathBuf], tops: &[PathBuf]) -> Result<()> {
    if dirs.is_empty() || crate::host::test_switch::get(switches::NO_SUPERVISOR_ENV).is_some() {
        return Ok(());
    }
    if available().is_err() {
        return Ok(());
    }
    let mut guards: Vec<Guard> = Vec::new();
    let tables = (dirs.iter().map(|d| (d, GUARDED_NAMES)))
        .chain(tops.iter().map(|d| (d, GUARDED_TOP_NAMES)));
    for (d, names) in tables {
        let f = open_path(libc::AT_FDCWD, d.as_os_str().as_bytes(), libc::O_NOFOLLOW)
            .map_err(std::io::Error::from_raw_os_error)
            .with_context(|| format!("cannot open {}", crate::policy::escape::shown(d)))?;
        let id = dev_ino(f.as_raw_fd())
            .map_err(std::io::Error::from_raw_os_error)
            .context("cannot stat a guarded directory")?;
        guards.push((id, names));
    }
    let prog = program();
    let (parent_end, child_end) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .context("cannot make the supervisor's socketpair")?;
    // SAFETY: the step is single-threaded here (no thread was started), so the child may
    // run any code.
    match unsafe { nix::unistd::fork() }.context("cannot fork the file supervisor")? {
        nix::unistd::ForkResult::Child => {
            drop(parent_end);
            let listener = install(&prog).context("cannot install the notifying filter")?;
            let fds = [listener.as_raw_fd()];
            let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
            let iov = [std::io::IoSlice::new(b"L")];
            nix::sys::socket::sendmsg::<()>(
                child_end.as_raw_fd(),
                &iov,
                &cmsg,
                nix::sys::socket::MsgFlags::empty(),
                None,
            )
            .context("cannot hand the listener to the supervisor")?;
            drop(listener);
            drop(child_end);
            Ok(())
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(child_end);
            supervise(parent_end, child.as_raw(), guards)
        }
    }
}

const AUDIT_ARCH: u32 = if cfg!(target_arch = "x86_64") {
    0xc000_003e
} else if cfg!(target_arch = "aarch64") {
    0xc000_00b7
} else {
    0xc000_00f3 // riscv64
};
/// x32's bit: its open/rename/link calls share x86_64's numbers with this bit set.
const X32: u32 = 0x4000_0000;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: usize, jf: usize) -> libc::sock_filter {
    libc::sock_filter {
        code,
        // The program is a few dozen instructions: every offset fits.
        jt: u8::try_from(jt).unwrap_or(u8::MAX),
        jf: u8::try_from(jf).unwrap_or(u8::MAX),
        k,
    }
}

/// The notifying filter compiled from [`NOTIFIED`] (seccompiler has no user-notification
/// action): a foreign architecture is allowed here (the first filter kills it), the x32
/// bit is masked off, each row's number jumps to the notification or to its flag test.
pub fn program() -> Vec<libc::sock_filter> {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const AND: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
    let rows: Vec<_> = NOTIFIED.iter().filter(|r| r.nr >= 0).collect();
    let flagged: Vec<_> = rows
        .iter()
        .filter_map(|r| match r.when {
            When::FlagSet { index, mask, .. } => Some((index, mask)),
            When::Always => None,
        })
        .collect();
    let mut p = vec![
        stmt(LD_W_ABS, 4),
        jump(JEQ, AUDIT_ARCH, 1, 0),
        stmt(RET, libc::SECCOMP_RET_ALLOW),
        stmt(LD_W_ABS, 0),
        stmt(AND, !X32),
    ];
    let first = p.len();
    let allow_at = first + rows.len();
    let notify_at = allow_at + 1 + 2 * flagged.len();
    let mut j = 0;
    for (i, r) in rows.iter().enumerate() {
        let here = first + i;
        let to = match r.when {
            When::Always => notify_at,
            When::FlagSet { .. } => {
                j += 1;
                allow_at + 1 + 2 * (j - 1)
            }
        };
        // The table's numbers are small non-negative syscall numbers.
        p.push(jump(JEQ, r.nr as u32, to - here - 1, 0));
    }
    p.push(stmt(RET, libc::SECCOMP_RET_ALLOW));
    for (j, (index, mask)) in flagged.iter().enumerate() {
        let ld = allow_at + 1 + 2 * j;
        // The low 32 bits of argument `index` (seccomp_data: nr, arch, ip, args[6]).
        p.push(stmt(LD_W_ABS, 16 + 8 * u32::from(*index)));
        p.push(jump(JSET, *mask, notify_at - ld - 2, notify_at - ld - 1));
    }
    p.push(stmt(RET, libc::SECCOMP_RET_USER_NOTIF));
    p.push(stmt(RET, libc::SECCOMP_RET_ALLOW));
    p
}

/// Installs `prog` with a new listener (no_new_privs is already set by the first filter).
fn install(prog: &[libc::sock_filter]) -> Result<OwnedFd> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len())?,
        filter: prog.as_ptr().cast_mut(),
    };
    // Once the supervisor has received a call, a signal other than a fatal one does not
    // interrupt the caller's wait (Linux 5.19+): otherwise a call the supervisor made
    // would be restarted and made again (measured: 182 of 3,000 O_EXCL creates and
    // renames under a signal storm failed EEXIST or ENOENT; Go's runtime preempts with
    // SIGURG every 10 ms).
    const WAIT_KILLABLE_RECV: libc::c_ulong = 1 << 5;
    // SAFETY: `fprog` points at `prog`, alive for the call; the kernel copies it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | WAIT_KILLABLE_RECV,
            &raw const fprog,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: the kernel returned a new descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The signals the supervisor ignores: the terminal's (the agent handles them and the
/// supervisor exits when the agent does) and the ones the agent may send to its group.
const IGNORED: &[libc::c_int] = &[
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGHUP,
    libc::SIGTERM,
    libc::SIGPIPE,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
];

/// The supervisor's life: receive the listener, answer notifications, reap, and exit
/// with the command's status.
fn supervise(sock: OwnedFd, agent: libc::pid_t, guards: Vec<Guard>) -> Result<()> {
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    for &sig in IGNORED {
        // SAFETY: SIG_IGN installs no handler.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let mut mask = nix::sys::signal::SigSet::empty();
    mask.add(nix::sys::signal::Signal::SIGCHLD);
    mask.thread_block().context("cannot block SIGCHLD")?;
    let sigfd = nix::sys::signalfd::SignalFd::with_flags(
        &mask,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
    )
    .context("cannot make a signalfd")?;
    let listener = receive_listener(&sock);
    drop(sock);
    let me = Arc::new(Me::new(guards)?);
    if let Some(l) = &listener {
        // The caller's wait and the supervisor's wake-up hand the CPU over directly
        // (Linux 6.6+; before, the flag is refused and the wake-ups stay as they were):
        // without it most of a call's time is the two tasks waking each other on other
        // CPUs.
        const SYNC_WAKE_UP: u64 = 1;
        // SAFETY: SET_FLAGS reads one u64 (the flags) from its argument's value.
        unsafe {
            libc::ioctl(
                l.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS,
                SYNC_WAKE_UP,
            )
        };
        // Several threads receive from the one listener (each RECV gets a notification of
        // its own): calls are made in parallel, as the kernel would make them. Each has
        // a filesystem context of its own, hence a umask of its own (`with_umask`).
        for n in 0..workers() {
            let (me, fd) = (Arc::clone(&me), l.as_raw_fd());
            std::thread::Builder::new()
                .name("supervisor".into())
                .stack_size(256 * 1024)
                .spawn(move || me.work(fd, n))
                .context("cannot start a supervisor thread")?;
        }
    }
    loop {
        // Reap first: the agent may be gone before the listener reports anything.
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes the status into `status`.
            let pid = unsafe { libc::waitpid(-1, &raw mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == agent {
                let code = if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else if libc::WIFSIGNALED(status) {
                    128 + libc::WTERMSIG(status)
                } else {
                    255
                };
                std::process::exit(code);
            }
        }
        let mut fds = [libc::pollfd {
            fd: sigfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: `fds` is a valid array of its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, -1) };
        if n > 0 {
            while let Ok(Some(_)) = sigfd.read_signal() {}
        }
    }
}

/// How many threads answer notifications: one per CPU the sandbox may use, 2 to 8 (two,
/// so that a call that takes long, such as an open on a slow file system, holds up no
/// other).
fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
}

/// The listener from the child, or None when the child died before sending it (the
/// supervisor then only waits for it).
fn receive_listener(sock: &OwnedFd) -> Option<OwnedFd> {
    let mut buf = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = nix::sys::socket::recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    for c in msg.cmsgs().ok()? {
        if let nix::sys::socket::ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&fd) = fds.first() {
                // SAFETY: the descriptor was just received, owned by nobody else.
                return Some(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    None
}

/// What the supervisor answers.
enum Answer {
    Errno(i32),
    Value(i64),
    Fd {
        fd: OwnedFd,
        cloexec: bool,
    },
    /// Answered by a thread (an open that waits: a FIFO's other end).
    Later,
}

type Res<T> = std::result::Result<T, i32>;

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn cstr(b: &[u8]) -> Res<CString> {
    CString::new(b).map_err(|_| libc::EINVAL)
}

/// `openat(dirfd, path, O_PATH|O_DIRECTORY|O_CLOEXEC|extra)`.
fn open_path(dirfd: RawFd, path: &[u8], extra: i32) -> Res<OwnedFd> {
    let p = cstr(if path.is_empty() { b"." } else { path })?;
    // SAFETY: `p` is a NUL-terminated string alive for the call.
    let fd = unsafe {
        libc::openat(
            dirfd,
            p.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | extra,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn io_err(e: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(e)
}

/// A directory's (mount id, device, inode): two roots are the same only when all three are.
fn root_id(fd: &OwnedFd) -> Res<(u64, u64, u64)> {
    let mask = rustix::fs::StatxFlags::MNT_ID | rustix::fs::StatxFlags::INO;
    let st = rustix::fs::statx(fd, "", rustix::fs::AtFlags::EMPTY_PATH, mask)
        .map_err(|e| e.raw_os_error())?;
    let dev = libc::makedev(st.stx_dev_major, st.stx_dev_minor);
    Ok((st.stx_mnt_id, dev, st.stx_ino))
}

/// One component `name` of a path from `dir`, not followed if a symlink.
fn walk_one(dir: &OwnedFd, name: &[u8]) -> Res<OwnedFd> {
    let p = cstr(name)?;
    // SAFETY: `p` is a NUL-terminated string alive for the call.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            p.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The directory `rel` names from `start`, walked one component at a time within
/// `root` (a caller's own root, see `Me::foreign_root`): an absolute symlink starts again
/// at `root`, and `..` at `root` stays there, as the kernel does for that caller; at most
/// 40 symlinks (ELOOP), and what is not a directory is ENOTDIR.
fn walk(root: &OwnedFd, start: &OwnedFd, rel: &[u8]) -> Res<OwnedFd> {
    let dup = |fd: &OwnedFd| rustix::io::dup(fd).map_err(|e| e.raw_os_error());
    let root_is = root_id(root)?;
    let mut cur = dup(start)?;
    let mut todo: std::collections::VecDeque<Vec<u8>> = rel
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let mut hops = 0;
    while let Some(name) = todo.pop_front() {
        match name.as_slice() {
            b"." => {}
            b".." => {
                if root_id(&cur)? != root_is {
                    cur = open_path(cur.as_raw_fd(), b"..", 0)?;
                }
            }
            _ => {
                let next = walk_one(&cur, &name)?;
                let st = rustix::fs::fstat(&next).map_err(|e| e.raw_os_error())?;
                match st.st_mode & libc::S_IFMT {
                    libc::S_IFDIR => cur = next,
                    libc::S_IFLNK => {
                        hops += 1;
                        if hops > 40 {
                            return Err(libc::ELOOP);
                        }
                        let target = readlinkat(next.as_raw_fd(), b"")?;
                        if target.first() == Some(&b'/') {
                            cur = dup(root)?;
                        }
                        for c in target.split(|&b| b == b'/').rev().filter(|c| !c.is_empty()) {
                            todo.push_front(c.to_vec());
                        }
                    }
                    _ => return Err(libc::ENOTDIR),
                }
            }
        }
    }
    Ok(cur)
}

fn dev_ino(fd: RawFd) -> Res<(u64, u64)> {
    let st = rustix::fs::fstat(
        // SAFETY: `fd` is open for the borrow's duration (the caller holds it).
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
    )
    .map_err(|e| e.raw_os_error())?;
    Ok((st.st_dev, st.st_ino))
}

/// A path split into the directory part and its final name (trailing slashes kept
/// apart: the kernel never creates a file through one).
struct Split {
    dir: Vec<u8>,
    name: Vec<u8>,
    slash: bool,
}

fn split(path: &[u8]) -> Split {
    let end = path.iter().rposition(|&c| c != b'/').map_or(0, |i| i + 1);
    let slash = end < path.len();
    let trimmed = &path[..end];
    match trimmed.iter().rposition(|&c| c == b'/') {
        Some(i) => Split {
            dir: trimmed[..=i].to_vec(),
            name: trimmed[i + 1..].to_vec(),
            slash,
        },
        None if end == 0 => Split {
            // "/" (or "///"): the root itself.
            dir: b"/".to_vec(),
            name: b".".to_vec(),
            slash: false,
        },
        None => Split {
            dir: Vec::new(),
            name: trimmed.to_vec(),
            slash,
        },
    }
}

/// The supervisor's fixed state.
struct Me {
    guards: Vec<Guard>,
    pid: libc::pid_t,
    /// The supervisor's own root: (mount id, device, inode).
    root: (u64, u64, u64),
    /// Whether a caller with a root of its own is walked within it (off only for a
    /// test's control, [`NO_WALK_ENV`], in debug builds).
    walk: bool,
    /// The callers seen, by thread id: their `/proc/TID` and umask (see [`Proc`]).
    procs: Mutex<HashMap<libc::pid_t, Arc<Proc>>>,
    /// The thread groups that called `umask()`: their umask is read at each call.
    volatile: Mutex<HashSet<libc::pid_t>>,
    /// Every caller's umask is read at each call (a `umask()` whose caller's group could
    /// not be told, or too many groups in `volatile`).
    all_volatile: AtomicBool,
}

/// A caller thread as first seen: its `/proc/TID` directory, which names that very
/// thread for as long as the descriptor lives (a thread id used again by another is
/// another directory, where `root` and `cwd` are not found), its thread group and its
/// umask then. A thread's umask changes only by `umask()`, which the filter notifies:
/// the group is then marked in `Me::volatile` before its call goes on, and from then on
/// read at each call (`Me::umask`). Not followed: a process sharing its filesystem
/// context with another process (`clone(CLONE_FS)` without `CLONE_THREAD`, which no
/// libc's fork or spawn does) keeps the umask the other had when first seen; the umask
/// is the caller's own restriction (it may `chmod` what it makes), never a guard's.
struct Proc {
    dir: OwnedFd,
    tgid: libc::pid_t,
    umask: u32,
}

/// At most this many callers are remembered (then all are forgotten at once).
const PROCS_MAX: usize = 1024;

/// One notification's caller: its thread, its `/proc/TID`, and its root (opened once for
/// the call) with whether it is not the supervisor's (`Me::foreign_root`).
struct Caller {
    tid: libc::pid_t,
    id: u64,
    proc: Arc<Proc>,
    root: OwnedFd,
    foreign: bool,
}

thread_local! {
    /// The umask this thread's filesystem context has now (None: not set yet).
    static UMASK: Cell<Option<u32>> = const { Cell::new(None) };
}

/// `openat(dir, name, O_PATH|O_CLOEXEC)`.
fn open_in(dir: &OwnedFd, name: &[u8]) -> Res<OwnedFd> {
    let p = cstr(name)?;
    // SAFETY: a NUL-terminated string alive for the call.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), p.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A thread's group and umask, from the `status` of its `/proc/TID` directory (Umask:
/// Linux 4.7+); GONE when the thread is.
fn status(dir: &OwnedFd) -> Res<(libc::pid_t, u32)> {
    // SAFETY: a NUL-terminated string alive for the call.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c"status".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(GONE);
    }
    // SAFETY: a new descriptor owned by nobody else.
    let mut f = unsafe { File::from_raw_fd(fd) };
    let mut s = String::with_capacity(2048);
    f.read_to_string(&mut s).map_err(|_| GONE)?;
    let tgid = field(&s, "Tgid:").and_then(|t| t.parse().ok());
    let umask = field(&s, "Umask:").and_then(|u| u32::from_str_radix(u, 8).ok());
    match (tgid, umask) {
        (Some(t), Some(u)) => Ok((t, u)),
        _ => Err(libc::EIO),
    }
}

impl Me {
    fn new(guards: Vec<Guard>) -> Result<Me> {
        Ok(Me {
            guards,
            // SAFETY: getpid takes no arguments.
            pid: unsafe { libc::getpid() },
            root: root_id(&open_path(libc::AT_FDCWD, b"/", 0).map_err(io_err)?).map_err(io_err)?,
            walk: crate::host::test_switch::get(switches::NO_WALK_ENV).is_none(),
            procs: Mutex::new(HashMap::new()),
            volatile: Mutex::new(HashSet::new()),
            all_volatile: AtomicBool::new(false),
        })
    }

    /// One supervisor thread's life: receive and answer notifications. Each thread has a
    /// filesystem context (and so a umask) of its own; where that cannot be, only the
    /// first thread answers.
    fn work(&self, listener: RawFd, n: usize) {
        // SAFETY: unshare with a flag; CLONE_FS copies this thread's cwd, root and umask.
        if unsafe { libc::unshare(libc::CLONE_FS) } != 0 && n > 0 {
            return;
        }
        while self.serve(listener) {}
    }

    /// Receives one notification and answers it; false when the listener is unusable.
    fn serve(&self, listener: RawFd) -> bool {
        // SAFETY: an all-zero seccomp_notif is valid (and required by RECV).
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: RECV writes one seccomp_notif into `req`.
        if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &raw mut req) } < 0 {
            // The caller died meanwhile (ENOENT), or a signal (EINTR).
            return matches!(errno(), libc::ENOENT | libc::EINTR);
        }
        let (tid, id) = (req.pid as libc::pid_t, req.id);
        if i64::from(req.data.nr as u32 & !X32) == libc::SYS_umask {
            self.umask_called(listener, tid, id);
            return true;
        }
        let c = match self.caller(tid, id) {
            Ok(c) => c,
            Err(e) => {
                // Most likely gone; if not, it must not wait forever.
                reply(
                    listener,
                    id,
                    Answer::Errno(if e == GONE { libc::EIO } else { e }),
                );
                return true;
            }
        };
        if let Some(answer) = self.answer(listener, &c, &req.data) {
            reply(listener, c.id, answer);
        }
        true
    }

    /// A `umask()`: its thread group's umask is read at each call from now on, marked
    /// before the call goes on (so a call answered while it is not marked was made
    /// before the umask changed). The call itself is the kernel's
    /// (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`: it has no path or memory to rewrite).
    fn umask_called(&self, listener: RawFd, tid: libc::pid_t, id: u64) {
        let group = open_path(libc::AT_FDCWD, format!("/proc/{tid}").as_bytes(), 0)
            .and_then(|d| status(&d));
        match group {
            Ok((tgid, _)) => {
                let mut v = self.volatile.lock().unwrap_or_else(|e| e.into_inner());
                if v.len() >= PROCS_MAX {
                    self.all_volatile.store(true, Ordering::SeqCst);
                } else {
                    v.insert(tgid);
                }
            }
            Err(_) => self.all_volatile.store(true, Ordering::SeqCst),
        }
        let resp = libc::seccomp_notif_resp {
            id,
            val: 0,
            error: 0,
            flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        };
        // SAFETY: SEND reads one seccomp_notif_resp.
        unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &raw const resp) };
    }

    /// The thread `tid`'s `/proc/TID` entry, remembered or first seen now (then true).
    fn proc_of(&self, tid: libc::pid_t) -> Res<(Arc<Proc>, bool)> {
        let lock = || self.procs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = lock().get(&tid) {
            return Ok((Arc::clone(p), false));
        }
        let dir =
            open_path(libc::AT_FDCWD, format!("/proc/{tid}").as_bytes(), 0).map_err(|_| GONE)?;
        let (tgid, umask) = status(&dir)?;
        let p = Arc::new(Proc { dir, tgid, umask });
        let mut m = lock();
        if m.len() >= PROCS_MAX {
            m.clear();
        }
        m.insert(tid, Arc::clone(&p));
        Ok((p, true))
    }

    /// The caller of notification `id`: its `/proc/TID` (a remembered one whose thread
    /// is gone is forgotten and the thread id looked up again) and its root.
    fn caller(&self, tid: libc::pid_t, id: u64) -> Res<Caller> {
        for _ in 0..2 {
            let (proc, new) = self.proc_of(tid)?;
            match open_in(&proc.dir, b"root") {
                Ok(root) => {
                    let foreign = self.walk && root_id(&root)? != self.root;
                    return Ok(Caller {
                        tid,
                        id,
                        proc,
                        root,
                        foreign,
                    });
                }
                Err(_) if !new => {
                    let mut m = self.procs.lock().unwrap_or_else(|e| e.into_inner());
                    if m.get(&tid).is_some_and(|p| Arc::ptr_eq(p, &proc)) {
                        m.remove(&tid);
                    }
                }
                Err(_) => return Err(GONE),
            }
        }
        Err(GONE)
    }

    /// The caller's umask now: as first seen, or read again when its group called
    /// `umask()` (see [`Proc`]).
    fn umask(&self, c: &Caller) -> Res<u32> {
        let read_again = self.all_volatile.load(Ordering::SeqCst)
            || self
                .volatile
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&c.proc.tgid);
        if read_again {
            return status(&c.proc.dir).map(|(_, u)| u);
        }
        Ok(c.proc.umask)
    }

    /// Performs the call; None when the caller is no longer the one that asked.
    fn answer(&self, listener: RawFd, c: &Caller, d: &libc::seccomp_data) -> Option<Answer> {
        let mem = Mem(c.tid);
        let nr = i64::from(d.nr as u32 & !X32);
        let a = d.args;
        let at = |i: usize| a[i] as i32;
        let r = if nr == sys::OPEN || nr == sys::CREAT {
            let (flags, mode) = if nr == sys::CREAT {
                (libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, a[1])
            } else {
                (at(1), a[2])
            };
            self.open(
                listener,
                c,
                &mem,
                libc::AT_FDCWD,
                a[0],
                flags,
                mode as u32,
                0,
            )
        } else if nr == libc::SYS_openat {
            self.open(listener, c, &mem, at(0), a[1], at(2), a[3] as u32, 0)
        } else if nr == libc::SYS_openat2 {
            match read_how(&mem, a[2], a[3]) {
                Ok(how) => self.open(
                    listener,
                    c,
                    &mem,
                    at(0),
                    a[1],
                    how.flags as i32,
                    how.mode as u32,
                    how.resolve,
                ),
                Err(e) => Err(e),
            }
        } else if nr == sys::RENAME {
            self.rename(
                listener,
                c,
                &mem,
                [libc::AT_FDCWD, libc::AT_FDCWD],
                [a[0], a[1]],
                0,
            )
        } else if nr == libc::SYS_renameat {
            self.rename(listener, c, &mem, [at(0), at(2)], [a[1], a[3]], 0)
        } else if nr == libc::SYS_renameat2 {
            self.rename(listener, c, &mem, [at(0), at(2)], [a[1], a[3]], a[4] as u32)
        } else if nr == sys::LINK {
            self.link(
                listener,
                c,
                &mem,
                [libc::AT_FDCWD, libc::AT_FDCWD],
                [a[0], a[1]],
                0,
            )
        } else if nr == libc::SYS_linkat {
            self.link(listener, c, &mem, [at(0), at(2)], [a[1], a[3]], at(4))
        } else if nr == sys::SYMLINK {
            self.symlink(listener, c, &mem, a[0], libc::AT_FDCWD, a[1])
        } else if nr == libc::SYS_symlinkat {
            self.symlink(listener, c, &mem, a[0], at(1), a[2])
        } else if nr == sys::MKDIR {
            self.mkdir(listener, c, &mem, libc::AT_FDCWD, a[0], a[1] as u32)
        } else if nr == libc::SYS_mkdirat {
            self.mkdir(listener, c, &mem, at(0), a[1], a[2] as u32)
        } else if nr == sys::MKNOD {
            self.mknod(listener, c, &mem, libc::AT_FDCWD, a[0], a[1] as u32, a[2])
        } else if nr == libc::SYS_mknodat {
            self.mknod(listener, c, &mem, at(0), a[1], a[2] as u32, a[3])
        } else {
            Err(libc::ENOSYS)
        };
        match r {
            Ok(a) => Some(a),
            Err(GONE) => None,
            Err(e) => Some(Answer::Errno(e)),
        }
    }

    /// The directory a path is resolved from: the caller's root (absolute), cwd
    /// (`AT_FDCWD`) or its descriptor `dirfd`, opened through `/proc/TID`.
    fn base(&self, c: &Caller, dirfd: i32, path: &[u8]) -> Res<OwnedFd> {
        if path.first() == Some(&b'/') {
            return rustix::io::fcntl_dupfd_cloexec(&c.root, 0).map_err(|e| e.raw_os_error());
        }
        if dirfd == libc::AT_FDCWD {
            return open_in(&c.proc.dir, b"cwd");
        }
        if dirfd < 0 {
            return Err(libc::EBADF);
        }
        open_in(&c.proc.dir, format!("fd/{dirfd}").as_bytes()).map_err(|e| match e {
            libc::ENOENT => libc::EBADF,
            e => e,
        })
    }

    /// The directory holding `s`'s final name, from `base`; a directory of the
    /// supervisor's own `/proc` entry is the caller's instead (`/proc/self/fd`).
    fn parent(&self, c: &Caller, base: &OwnedFd, s: &Split, resolve: u64) -> Res<OwnedFd> {
        self.parent_on(c, base, s, resolve).map(|(fd, _)| fd)
    }

    /// [`Me::parent`], and whether that directory is on procfs.
    fn parent_on(
        &self,
        c: &Caller,
        base: &OwnedFd,
        s: &Split,
        resolve: u64,
    ) -> Res<(OwnedFd, bool)> {
        let rel: &[u8] = {
            let t = s.dir.iter().position(|&b| b != b'/').unwrap_or(s.dir.len());
            &s.dir[t..]
        };
        let pfd = if resolve != 0 {
            openat2_path(base.as_raw_fd(), rel, resolve)?
        } else if let Some(root) = self.foreign_root(c)? {
            walk(root, base, rel)?
        } else {
            open_path(base.as_raw_fd(), rel, 0)?
        };
        self.not_mine(c, pfd)
    }

    /// The caller's root when it is not the supervisor's (a process that changed its
    /// root or its mount namespace: a sandbox inside this one, such as Claude Code's own
    /// Bash sandbox): its paths are then walked by [`walk`] within that root, so that an
    /// absolute symlink or a `..` never reaches what the caller's own view hides or
    /// makes read-only. None: the same root, where the kernel's own lookup is exact.
    fn foreign_root<'c>(&self, c: &'c Caller) -> Res<Option<&'c OwnedFd>> {
        Ok(c.foreign.then_some(&c.root))
    }

    /// `name` in `pfd` with its final symlinks followed within the caller's root (for
    /// a caller with a root of its own, whose symlinks the kernel would follow from the
    /// supervisor's root): the directory and name of what is not a symlink.
    fn follow_final(&self, c: &Caller, mut pfd: OwnedFd, mut s: Split) -> Res<(OwnedFd, Split)> {
        let Some(root) = self.foreign_root(c)? else {
            return Ok((pfd, s));
        };
        for _ in 0..40 {
            match readlinkat(pfd.as_raw_fd(), &s.name) {
                Ok(target) => {
                    let target = localize(c.tid, target);
                    if target.is_empty() {
                        return Err(libc::ENOENT);
                    }
                    s = split(&target);
                    let from = if target.first() == Some(&b'/') {
                        rustix::io::dup(root).map_err(|e| e.raw_os_error())?
                    } else {
                        pfd
                    };
                    pfd = self.parent(c, &from, &s, 0)?;
                }
                // Not a symlink (EINVAL) or not there (ENOENT: the call says so).
                Err(libc::EINVAL | libc::ENOENT) => return Ok((pfd, s)),
                Err(e) => return Err(e),
            }
        }
        Err(libc::ELOOP)
    }

    /// `pfd`, or, when it is the supervisor's own `/proc/PID`, `/proc/PID/task/TID`
    /// or one of their `fd` directories, the caller's; any other directory under the
    /// supervisor's `/proc` entry is refused (EACCES).
    fn not_mine(&self, c: &Caller, pfd: OwnedFd) -> Res<(OwnedFd, bool)> {
        if !on_proc(&pfd) {
            return Ok((pfd, false));
        }
        let tgid_in = |rel: &[u8]| -> Option<libc::pid_t> {
            let d = open_path(pfd.as_raw_fd(), rel, 0).ok()?;
            let st = cstr(b"status").ok()?;
            // SAFETY: a NUL-terminated string alive for the call.
            let fd = unsafe {
                libc::openat(d.as_raw_fd(), st.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC)
            };
            if fd < 0 {
                return None;
            }
            // SAFETY: a new descriptor owned by nobody else.
            let mut f = unsafe { File::from_raw_fd(fd) };
            let mut s = String::new();
            f.read_to_string(&mut s).ok()?;
            field(&s, "Tgid:")?.parse().ok()
        };
        if tgid_in(b".") == Some(self.pid) {
            // The supervisor's /proc/PID or /proc/PID/task/TID itself.
            return open_path(libc::AT_FDCWD, format!("/proc/{}", c.tid).as_bytes(), 0)
                .map(|fd| (fd, true));
        }
        if tgid_in(b"..") == Some(self.pid) {
            let fd_dir = open_path(pfd.as_raw_fd(), b"../fd", 0)?;
            if dev_ino(fd_dir.as_raw_fd())? == dev_ino(pfd.as_raw_fd())? {
                return open_path(libc::AT_FDCWD, format!("/proc/{}/fd", c.tid).as_bytes(), 0)
                    .map(|fd| (fd, true));
            }
            return Err(libc::EACCES);
        }
        Ok((pfd, true))
    }

    fn guarded(&self, pfd: &OwnedFd, name: &[u8]) -> Res<bool> {
        let named = |names: &[(&str, &str)]| names.iter().any(|(n, _)| n.as_bytes() == name);
        if !named(GUARDED_NAMES) && !named(GUARDED_TOP_NAMES) {
            return Ok(false);
        }
        let id = dev_ino(pfd.as_raw_fd())?;
        Ok(self
            .guards
            .iter()
            .any(|(g, names)| *g == id && named(names)))
    }

    /// Checks the caller is still the one that asked (after its memory and /proc
    /// entries were read): GONE otherwise.
    fn still(listener: RawFd, c: &Caller) -> Res<()> {
        let mut id = c.id;
        // SAFETY: ID_VALID reads one u64.
        if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &raw mut id) } < 0 {
            return Err(GONE);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        listener: RawFd,
        c: &Caller,
        mem: &Mem,
        dirfd: i32,
        path_at: u64,
        flags: i32,
        mode: u32,
        resolve: u64,
    ) -> Res<Answer> {
        let path = localize(c.tid, read_path(mem, path_at)?);
        // openat2's RESOLVE_IN_ROOT takes an absolute path from dirfd, RESOLVE_BENEATH
        // refuses one.
        let scoped = resolve & (RESOLVE_IN_ROOT | RESOLVE_BENEATH) != 0;
        if resolve & RESOLVE_BENEATH != 0 && path.first() == Some(&b'/') {
            return Err(libc::EXDEV);
        }
        let base = self.base(c, dirfd, if scoped { b"." } else { &path })?;
        let umask = self.umask(c)?;
        Self::still(listener, c)?;
        let cloexec = flags & libc::O_CLOEXEC != 0;
        if path.is_empty() {
            return Err(libc::ENOENT);
        }
        let done = move |fd: OwnedFd| Answer::Fd { fd, cloexec };
        let foreign = resolve == 0 && self.foreign_root(c)?.is_some();
        if flags & libc::O_CREAT == 0 && !foreign {
            // openat2 without O_CREAT (or an O_TMPFILE, which has no name): the
            // caller's own call, made from its base (a caller with a root of its own:
            // walked within it below).
            return with_umask(umask, || {
                openat2_any(base.as_raw_fd(), &path, flags, mode, resolve)
            })
            .map(done);
        }
        let mut s = split(&path);
        if s.slash && flags & libc::O_CREAT == 0 {
            // A directory named with a trailing slash, from a caller with a root of
            // its own: the whole path walked within it.
            let pfd = self.parent(c, &base, &s, 0)?;
            let root = self.foreign_root(c)?.ok_or(libc::EISDIR)?;
            let dir = walk(root, &pfd, &s.name)?;
            return with_umask(umask, || openat2_any(dir.as_raw_fd(), b".", flags, mode, 0))
                .map(done);
        }
        if s.slash {
            return Err(libc::EISDIR);
        }
        let (mut pfd, mut pfd_on_proc) = self.parent_on(c, &base, &s, resolve)?;
        for _ in 0..40 {
            if self.guarded(&pfd, &s.name)? {
                return Err(libc::EPERM);
            }
            let on_proc = pfd_on_proc;
            // What is there now, where it matters: an O_CREAT|O_EXCL open opens nothing
            // that exists (EEXIST), neither a FIFO nor /dev/tty.
            let excl = flags & (libc::O_CREAT | libc::O_EXCL) == libc::O_CREAT | libc::O_EXCL;
            let there = if excl {
                None
            } else {
                rustix::fs::statat(
                    &pfd,
                    s.name.as_slice(),
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                )
                .ok()
            };
            if there.is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFIFO) {
                // Its open waits for the other end, which may need the supervisor first:
                // a thread waits instead. Nothing is created (it exists; if it goes
                // meanwhile, ENOENT).
                let (id, name) = (c.id, s.name.clone());
                let flags = (flags & !libc::O_CREAT) | libc::O_NOFOLLOW;
                std::thread::spawn(move || {
                    let a = match openat2_any(pfd.as_raw_fd(), &name, flags, 0, resolve) {
                        Ok(fd) => done(fd),
                        Err(e) => Answer::Errno(e),
                    };
                    reply(listener, id, a);
                });
                return Ok(Answer::Later);
            }
            // /proc makes no files: its magic links (fd/N) are followed as the caller's
            // open would (the directory is the caller's, see `not_mine`).
            let nofollow = if on_proc { 0 } else { libc::O_NOFOLLOW };
            if let Some(r) = there.and_then(|st| their_tty(c.tid, &st, flags)) {
                return r.map(done);
            }
            let r = with_umask(umask, || {
                openat2_any(pfd.as_raw_fd(), &s.name, flags | nofollow, mode, resolve)
            });
            match r {
                Ok(fd) => return Ok(done(fd)),
                Err(libc::ELOOP)
                    if flags & (libc::O_NOFOLLOW | libc::O_EXCL) == 0
                        && resolve & RESOLVE_NO_SYMLINKS == 0 =>
                {
                    let target = match readlinkat(pfd.as_raw_fd(), &s.name) {
                        Ok(t) => localize(c.tid, t),
                        Err(libc::EINVAL) => continue, // no longer a symlink: again
                        Err(e) => return Err(e),
                    };
                    if target.is_empty() {
                        return Err(libc::ENOENT);
                    }
                    s = split(&target);
                    if s.slash {
                        return Err(libc::EISDIR);
                    }
                    let from = if target.first() == Some(&b'/') {
                        if scoped {
                            // The scope's root stays dirfd (or refuses, as the kernel does).
                            return Err(libc::EXDEV);
                        }
                        self.base(c, libc::AT_FDCWD, &target)?
                    } else {
                        pfd
                    };
                    (pfd, pfd_on_proc) = self.parent_on(c, &from, &s, resolve)?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(libc::ELOOP)
    }

    fn rename(
        &self,
        listener: RawFd,
        c: &Caller,
        mem: &Mem,
        dirfds: [i32; 2],
        at: [u64; 2],
        flags: u32,
    ) -> Res<Answer> {
        let old = localize(c.tid, read_path(mem, at[0])?);
        let new = localize(c.tid, read_path(mem, at[1])?);
        let (ob, nb) = (
            self.base(c, dirfds[0], &old)?,
            self.base(c, dirfds[1], &new)?,
        );
        Self::still(listener, c)?;
        if old.is_empty() || new.is_empty() {
            return Err(libc::ENOENT);
        }
        let (os, ns) = (split(&old), split(&new));
        let (op, np) = (self.parent(c, &ob, &os, 0)?, self.parent(c, &nb, &ns, 0)?);
        if self.guarded(&np, &ns.name)?
            || (flags & libc::RENAME_EXCHANGE != 0 && self.guarded(&op, &os.name)?)
        {
            return Err(libc::EPERM);
        }
        let (on, nn) = (cstr(&with_slash(&os))?, cstr(&with_slash(&ns))?);
        // SAFETY: NUL-terminated strings and descriptors alive for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                op.as_raw_fd(),
                on.as_ptr(),
                np.as_raw_fd(),
                nn.as_ptr(),
                flags,
            )
        };
        result(r)
    }

    fn link(
        &self,
        listener: RawFd,
        c: &Caller,
        mem: &Mem,
        dirfds: [i32; 2],
        at: [u64; 2],
        flags: i32,
    ) -> Res<Answer> {
        let old = localize(c.tid, read_path(mem, at[0])?);
        let new = localize(c.tid, read_path(mem, at[1])?);
        let nb = self.base(c, dirfds[1], &new)?;
        let empty_old = old.is_empty() && flags & libc::AT_EMPTY_PATH != 0;
        let ob = if empty_old {
            None
        } else {
            Some(self.base(c, dirfds[0], &old)?)
        };
        Self::still(listener, c)?;
        if new.is_empty() || (old.is_empty() && !empty_old) {
            return Err(libc::ENOENT);
        }
        if flags & !(libc::AT_EMPTY_PATH | libc::AT_SYMLINK_FOLLOW) != 0 {
            return Err(libc::EINVAL);
        }
        let ns = split(&new);
        let np = self.parent(c, &nb, &ns, 0)?;
        if self.guarded(&np, &ns.name)? {
            return Err(libc::EPERM);
        }
        let nn = cstr(&with_slash(&ns))?;
        let r = match ob {
            None => {
                // The caller's descriptor itself (an O_TMPFILE file): a copy of it
                // (pidfd_getfd), linked by the supervisor. Linux 6.10+ lets only the
                // file's opener (its very credentials) or a holder of
                // CAP_DAC_READ_SEARCH do this, so the answer is ENOENT, as before 6.10
                // for an unprivileged caller (through /proc/PID/fd, Linux 6.18 answers
                // EXDEV to the caller itself).
                let src = if dirfds[0] == libc::AT_FDCWD {
                    self.base(c, libc::AT_FDCWD, b"")?
                } else {
                    getfd(c.tid, dirfds[0])?
                };
                // SAFETY: NUL-terminated strings and descriptors alive for the call.
                unsafe {
                    libc::linkat(
                        src.as_raw_fd(),
                        c"".as_ptr(),
                        np.as_raw_fd(),
                        nn.as_ptr(),
                        libc::AT_EMPTY_PATH,
                    )
                }
            }
            Some(ob) => {
                let os = split(&old);
                let op = self.parent(c, &ob, &os, 0)?;
                let (op, os) = if flags & libc::AT_SYMLINK_FOLLOW != 0 {
                    self.follow_final(c, op, os)?
                } else {
                    (op, os)
                };
                let on = cstr(&with_slash(&os))?;
                // SAFETY: as above.
                unsafe {
                    libc::linkat(
                        op.as_raw_fd(),
                        on.as_ptr(),
                        np.as_raw_fd(),
                        nn.as_ptr(),
                        flags & libc::AT_SYMLINK_FOLLOW,
                    )
                }
            }
        };
        result(i64::from(r))
    }

    fn symlink(
        &self,
        listener: RawFd,
        c: &Caller,
        mem: &Mem,
        target_at: u64,
        dirfd: i32,
        at: u64,
    ) -> Res<Answer> {
        let target = read_path(mem, target_at)?;
        let new = localize(c.tid, read_path(mem, at)?);
        let nb = self.base(c, dirfd, &new)?;
        Self::still(listener, c)?;
        if new.is_empty() || target.is_empty() {
            return Err(libc::ENOENT);
        }
        let ns = split(&new);
        let np = self.parent(c, &nb, &ns, 0)?;
        if self.guarded(&np, &ns.name)? {
            return Err(libc::EPERM);
        }
        let (t, nn) = (cstr(&target)?, cstr(&with_slash(&ns))?);
        // SAFETY: NUL-terminated strings and a descriptor alive for the call.
        result(i64::from(unsafe {
            libc::symlinkat(t.as_ptr(), np.as_raw_fd(), nn.as_ptr())
        }))
    }

    fn mkdir(
        &self,
        listener: RawFd,
        c: &Caller,
        mem: &Mem,
        dirfd: i32,
        at: u64,
        mode: u32,
    ) -> Res<Answer> {
        self.make_name(listener, c, mem, dirfd, at, |dir, name| {
            // SAFETY: a NUL-terminated string and a descriptor alive for the call.
            unsafe { libc::mkdirat(dir, name.as_ptr(), mode as libc::mode_t) }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        listener: RawFd,
        c: &Caller,
        mem: &Mem,
        dirfd: i32,
        at: u64,
        mode: u32,
        dev: u64,
    ) -> Res<Answer> {
        self.make_name(listener, c, mem, dirfd, at, |dir, name| {
            // SAFETY: a NUL-terminated string and a descriptor alive for the call.
            unsafe { libc::mknodat(dir, name.as_ptr(), mode, dev as libc::dev_t) }
        })
    }

    /// mkdir's and mknod's common course: the path at `at` read, its directory opened
    /// (a guarded name refused), then `call(directory, final name)` made under the
    /// caller's umask.
    fn make_name(
        &self,
        listener: RawFd,
        c: &Caller,
        mem: &Mem,
        dirfd: i32,
        at: u64,
        call: impl FnOnce(RawFd, &std::ffi::CStr) -> libc::c_int,
    ) -> Res<Answer> {
        let path = localize(c.tid, read_path(mem, at)?);
        let base = self.base(c, dirfd, &path)?;
        let umask = self.umask(c)?;
        Self::still(listener, c)?;
        if path.is_empty() {
            return Err(libc::ENOENT);
        }
        let s = split(&path);
        let pfd = self.parent(c, &base, &s, 0)?;
        if self.guarded(&pfd, &s.name)? {
            return Err(libc::EPERM);
        }
        let n = cstr(&with_slash(&s))?;
        with_umask(umask, || result(i64::from(call(pfd.as_raw_fd(), &n))))
    }
}

/// `/dev/tty` names the opener's controlling terminal: opened by the supervisor it would
/// be the supervisor's, so when `st` (the name opened) is that device and the caller's
/// terminal is another (a terminal multiplexer's pty, inside), its pty is opened instead, and
/// none is ENXIO, as the kernel answers. None: not `/dev/tty`, or the same terminal.
fn their_tty(tid: libc::pid_t, st: &rustix::fs::Stat, flags: i32) -> Option<Res<OwnedFd>> {
    if st.st_mode & libc::S_IFMT != libc::S_IFCHR || st.st_rdev != libc::makedev(5, 0) {
        return None;
    }
    let tty_of = |pid: &str| -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command's name, in parentheses: state ppid pgrp session tty_nr.
        s.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(4)?
            .parse()
            .ok()
    };
    let (theirs, mine) = (tty_of(&tid.to_string()), tty_of("self"));
    Some(match theirs {
        None => Err(GONE),
        Some(0) => Err(libc::ENXIO),
        Some(t) if Some(t) == mine => return None,
        Some(t) => {
            let (major, minor) = (libc::major(t as libc::dev_t), libc::minor(t as libc::dev_t));
            if !(136..=143).contains(&major) {
                return Some(Err(libc::ENXIO));
            }
            let n = (major - 136) * 256 + minor;
            let p = match cstr(format!("/proc/{tid}/root/dev/pts/{n}").as_bytes()) {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            // SAFETY: a NUL-terminated string alive for the call.
            let r = unsafe { libc::open(p.as_ptr(), (flags & !libc::O_CREAT) | libc::O_CLOEXEC) };
            if r < 0 {
                Err(errno())
            } else {
                // SAFETY: a new descriptor owned by nobody else.
                Ok(unsafe { OwnedFd::from_raw_fd(r) })
            }
        }
    })
}

/// Whether `fd` is on procfs (whose type is an i64 on some architectures, narrower on
/// others).
#[allow(clippy::unnecessary_cast)]
fn on_proc(fd: &OwnedFd) -> bool {
    rustix::fs::fstatfs(fd)
        .map(|s| s.f_type as i64 == libc::PROC_SUPER_MAGIC)
        .unwrap_or(false)
}

/// Not an errno: the caller is gone, answer nothing.
const GONE: i32 = -1;

const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;
const RESOLVE_IN_ROOT: u64 = 0x10;

use crate::policy::confinement::legacy as sys;

fn field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
}

/// `f()` under `mask`: the umask of this thread's own filesystem context (each
/// supervisor thread has one, `Me::work`), set only when it changes.
fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    UMASK.with(|now| {
        if now.get() != Some(mask) {
            // SAFETY: umask sets this thread's filesystem context's mask, which no other
            // thread that makes calls shares.
            unsafe { libc::umask(mask as libc::mode_t) };
            now.set(Some(mask));
        }
    });
    f()
}

fn result(r: i64) -> Res<Answer> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(Answer::Value(r))
    }
}

/// Sends `answer` for notification `id`.
fn reply(listener: RawFd, id: u64, answer: Answer) {
    match answer {
        Answer::Fd { fd, cloexec } => {
            let add = libc::seccomp_notif_addfd {
                id,
                flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
                srcfd: fd.as_raw_fd() as u32,
                newfd: 0,
                newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
            };
            // SAFETY: ADDFD reads `add`; the descriptor stays ours and is closed on drop.
            unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &raw const add) };
        }
        Answer::Errno(e) => send(listener, id, 0, -e),
        Answer::Value(v) => send(listener, id, v, 0),
        Answer::Later => {}
    }
}

fn send(listener: RawFd, id: u64, val: i64, error: i32) {
    let resp = libc::seccomp_notif_resp {
        id,
        val,
        error,
        flags: 0,
    };
    // SAFETY: SEND reads one seccomp_notif_resp.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &raw const resp) };
}

fn with_slash(s: &Split) -> Vec<u8> {
    let mut v = s.name.clone();
    if s.slash {
        v.push(b'/');
    }
    v
}

/// `path` with a leading `/proc/self` or `/proc/thread-self` naming the caller (as it
/// does in the caller's own call) rather than the supervisor: `/proc/TID`. Any other
/// way to the supervisor's /proc entry is caught where it is opened ([`Me::not_mine`]).
fn localize(tid: libc::pid_t, path: Vec<u8>) -> Vec<u8> {
    let mut parts = path.split(|&b| b == b'/').filter(|p| !p.is_empty());
    if path.first() != Some(&b'/') || parts.next() != Some(b"proc") {
        return path;
    }
    match parts.next() {
        Some(b"self" | b"thread-self") => {
            let mut out = format!("/proc/{tid}").into_bytes();
            for p in parts {
                out.push(b'/');
                out.extend_from_slice(p);
            }
            if path.ends_with(b"/") {
                out.push(b'/');
            }
            out
        }
        _ => path,
    }
}

/// The caller's memory, read with process_vm_readv (the supervisor is its ancestor, which
/// Yama's ptrace scope 1 asks).
struct Mem(libc::pid_t);

impl Mem {
    fn read_at(&self, buf: &mut [u8], addr: u64) -> std::io::Result<usize> {
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` covers `buf`, writable for its length; `remote` is only read by
        // the kernel from the other process, checked there.
        let n =
            unsafe { libc::process_vm_readv(self.0, &raw const local, 1, &raw const remote, 1, 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// A NUL-terminated path from the caller's memory (at most PATH_MAX bytes).
fn read_path(mem: &Mem, at: u64) -> Res<Vec<u8>> {
    const PATH_MAX: usize = 4096;
    let mut out = Vec::new();
    let mut addr = at;
    if addr == 0 {
        return Err(libc::EFAULT);
    }
    while out.len() < PATH_MAX {
        // To the end of this page, so an unmapped next page is not read early.
        let room = 4096 - (addr % 4096) as usize;
        let mut buf = vec![0u8; room.min(PATH_MAX + 1 - out.len())];
        let n = mem.read_at(&mut buf, addr).map_err(|_| libc::EFAULT)?;
        if n == 0 {
            return Err(libc::EFAULT);
        }
        if let Some(z) = buf[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..z]);
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
        addr += n as u64;
    }
    Err(libc::ENAMETOOLONG)
}

/// openat2's `struct open_how` from the caller (its first 24 bytes; a larger struct's
/// extra bytes must be zero, as the kernel requires).
fn read_how(mem: &Mem, at: u64, size: u64) -> Res<libc::open_how> {
    if !(24..=4096).contains(&size) {
        return Err(if size < 24 { libc::EINVAL } else { libc::E2BIG });
    }
    let mut buf = vec![0u8; size as usize];
    let n = mem.read_at(&mut buf, at).map_err(|_| libc::EFAULT)?;
    if n != buf.len() {
        return Err(libc::EFAULT);
    }
    if buf[24..].iter().any(|&b| b != 0) {
        return Err(libc::E2BIG);
    }
    let u = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[i..i + 8]);
        u64::from_ne_bytes(b)
    };
    // SAFETY: an all-zero open_how is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = u(0);
    how.mode = u(8);
    how.resolve = u(16);
    Ok(how)
}

/// openat2 when `resolve` is set (or the flags are outside what openat takes), openat
/// otherwise; a new descriptor, close-on-exec on the supervisor's side.
fn openat2_any(dirfd: RawFd, path: &[u8], flags: i32, mode: u32, resolve: u64) -> Res<OwnedFd> {
    let p = cstr(path)?;
    let fd = if resolve == 0 {
        // SAFETY: a NUL-terminated string alive for the call.
        unsafe { libc::openat(dirfd, p.as_ptr(), flags | libc::O_CLOEXEC, mode) }
    } else {
        // SAFETY: an all-zero open_how is valid.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.mode = u64::from(mode);
        how.resolve = resolve;
        // SAFETY: `how` and `p` are alive for the call.
        unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dirfd,
                p.as_ptr(),
                &raw const how,
                std::mem::size_of::<libc::open_how>(),
            ) as i32
        }
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn openat2_path(dirfd: RawFd, path: &[u8], resolve: u64) -> Res<OwnedFd> {
    openat2_any(
        dirfd,
        if path.is_empty() { b"." } else { path },
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        resolve,
    )
}

/// A copy of the caller's descriptor `fd` (pidfd_getfd, Linux 5.6+; the supervisor is
/// the caller's ancestor).
fn getfd(tid: libc::pid_t, fd: i32) -> Res<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, 0) };
    if pidfd < 0 {
        return Err(GONE);
    }
    // SAFETY: a new descriptor owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    // SAFETY: pidfd_getfd takes descriptors and flags.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if r < 0 {
        return Err(match errno() {
            libc::EBADF => libc::EBADF,
            e => e,
        });
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

fn readlinkat(dirfd: RawFd, name: &[u8]) -> Res<Vec<u8>> {
    let n = cstr(name)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is writable for its length; `n` is NUL-terminated.
    let r = unsafe { libc::readlinkat(dirfd, n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_directory_and_name() {
        let s = |p: &[u8]| {
            let s = split(p);
            (s.dir, s.name, s.slash)
        };
        assert_eq!(s(b"a"), (b"".to_vec(), b"a".to_vec(), false));
        assert_eq!(s(b"a/b/c"), (b"a/b/".to_vec(), b"c".to_vec(), false));
        assert_eq!(s(b"/c"), (b"/".to_vec(), b"c".to_vec(), false));
        assert_eq!(s(b"a/c//"), (b"a/".to_vec(), b"c".to_vec(), true));
        assert_eq!(s(b"///"), (b"/".to_vec(), b".".to_vec(), false));
        assert_eq!(
            s(b".git/commondir"),
            (b".git/".to_vec(), b"commondir".to_vec(), false)
        );
    }

    #[test]
    fn proc_self_names_the_caller() {
        let l = |p: &[u8]| String::from_utf8(localize(42, p.to_vec())).unwrap();
        assert_eq!(l(b"/proc/self/cwd/x"), "/proc/42/cwd/x");
        assert_eq!(l(b"//proc//thread-self/fd/1"), "/proc/42/fd/1");
        assert_eq!(l(b"/proc/self/"), "/proc/42/");
        assert_eq!(l(b"/proc/selfish/x"), "/proc/selfish/x");
        assert_eq!(l(b"proc/self/x"), "proc/self/x");
        assert_eq!(l(b"/tmp/self"), "/tmp/self");
    }

    /// The compiled program in a forked child whose listener is closed at once: a
    /// notified call then fails ENOSYS (never passes), the rest reach the kernel.
    #[test]
    fn the_program_notifies_exactly_the_table() {
        use nix::sys::wait::{waitpid, WaitStatus};
        let dir = tempfile::tempdir().unwrap();
        let d = std::ffi::CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let prog = program();
        // SAFETY: the child makes system calls only and leaves with _exit.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                // SAFETY: prctl with integer arguments.
                unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
                let code = match install(&prog) {
                    Err(_) => 100,
                    Ok(l) => {
                        drop(l);
                        let errno = |r: i64| if r < 0 { errno() } else { 0 };
                        // SAFETY: NUL-terminated strings; the results are only compared.
                        let r = unsafe {
                            [
                                // No O_CREAT: the kernel's (a directory opens).
                                errno(i64::from(libc::openat(
                                    libc::AT_FDCWD,
                                    d.as_ptr(),
                                    libc::O_RDONLY,
                                ))) == 0,
                                errno(i64::from(libc::openat(
                                    libc::AT_FDCWD,
                                    c"/nonexistent/x".as_ptr(),
                                    libc::O_CREAT | libc::O_WRONLY,
                                    0o644,
                                ))) == libc::ENOSYS,
                                errno(libc::syscall(
                                    libc::SYS_rename,
                                    c"/a".as_ptr(),
                                    c"/b".as_ptr(),
                                )) == libc::ENOSYS,
                                errno(libc::syscall(
                                    0x4000_0000 | libc::SYS_rename,
                                    c"/a".as_ptr(),
                                    c"/b".as_ptr(),
                                )) == libc::ENOSYS,
                                errno(libc::syscall(
                                    libc::SYS_mkdirat,
                                    libc::AT_FDCWD,
                                    d.as_ptr(),
                                    0o755,
                                )) == libc::ENOSYS,
                                errno(libc::syscall(
                                    libc::SYS_unlinkat,
                                    libc::AT_FDCWD,
                                    c"/nonexistent/x".as_ptr(),
                                    0,
                                )) == libc::ENOENT,
                                errno(libc::syscall(libc::SYS_getpid)) == 0,
                            ]
                        };
                        r.iter()
                            .enumerate()
                            .find(|(_, ok)| !**ok)
                            .map_or(0, |(i, _)| 1 + i as i32)
                    }
                };
                // SAFETY: _exit ends the forked child without the parent's destructors.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                assert_eq!(waitpid(child, None).unwrap(), WaitStatus::Exited(child, 0));
            }
        }
    }

    #[test]
    fn the_program_is_short_enough_for_its_jumps() {
        let p = program();
        assert!(p.len() < 250);
    }
}
