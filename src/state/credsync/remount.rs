//! A new inode for the sandbox's credentials file, mounted over the old one from the host:
//! how the sync brings the host's refresh into a running sandbox without writing the
//! file a reader inside may be reading (an in-place write and a read of the same page can
//! interleave: 1 torn read in 846,778 was seen so). Readers that open the name after the
//! mount get the new file whole; those that opened the old one read it whole, as nothing
//! writes it again.
//!
//! How: a short-lived child of the sync process joins the sandbox's mount namespace
//! (through the user namespace that owns it, which the user's own processes outside may
//! join: the user made it with bwrap), makes a fresh tmpfs that is attached nowhere,
//! creates the file in it and mounts that one file over each mount point that shows the
//! old inode (found from outside through `/proc/<pid>/root`, never by a path resolved
//! inside, and checked to be that inode), then hands the file back over a socket. The
//! agent never sees the file before it is in place, and cannot take it away: it has no
//! capability in the namespace that owns the mounts, so the mount point stays
//! unswappable (EBUSY) as before. Measured by hand first (bare bwrap and a claudebox
//! sandbox, root and an ordinary user): the sandbox's processes are in a user namespace
//! nested below the one owning its mount namespace, so it is the owner that is joined.
//!
//! Any failure (no new mount API, before Linux 5.2; a namespace that cannot be joined) is
//! reported, and the caller writes in place as before.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::libc;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, OpenTreeFlags};

/// One mount point of the bound file inside: its directory, its name there, and the
/// mount on top of it now (all opened from outside, in the sandbox's mount namespace).
struct Point {
    dir: OwnedFd,
    name: CString,
    top: OwnedFd,
}

/// `NS_GET_USERNS` (linux/nsfs.h): the user namespace owning a namespace.
const NS_GET_USERNS: libc::c_ulong = 0xb701;

/// The name of the file in the fresh tmpfs.
const NAME: &str = "credentials.json";

/// The sandbox's first process (bwrap's child in the sandbox's pid namespace): the first
/// child of the outer bwrap found among the descendants of `parent` (the launcher, which
/// started the sync and, through its supervising child, bwrap), at most three levels down.
pub fn sandbox_init(parent: i32) -> Option<i32> {
    let kids = |pid: i32| -> Vec<i32> {
        let mut v = Vec::new();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                v.extend(s.split_whitespace().filter_map(|n| n.parse::<i32>().ok()));
            }
        }
        v
    };
    let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let mut level = vec![parent];
    for _ in 0..3 {
        let mut next = Vec::new();
        for p in level {
            for k in kids(p) {
                if comm(k).trim() == "bwrap" {
                    return kids(k).into_iter().next();
                }
                next.push(k);
            }
        }
        level = next;
    }
    None
}

/// Mounts a new file holding `content` over every mount point of `targets` (paths inside
/// the sandbox whose first process is `init`) that shows the inode `old` (device, inode).
/// Returns the new file, open read-write, for the sync to read the sandbox's writes from.
pub fn remount(
    init: i32,
    targets: &[PathBuf],
    old: (u64, u64),
    content: &[u8],
) -> io::Result<File> {
    let root = rustix::fs::open(
        format!("/proc/{init}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // Each mount point, opened from outside (the names inside resolved within the
    // sandbox's root, no symlink followed) with its directory, and only if it shows the
    // old inode.
    let mut points = Vec::new();
    for t in targets {
        let (Some(dir), Some(name)) = (t.parent(), t.file_name()) else {
            continue;
        };
        let rel = dir.strip_prefix("/").unwrap_or(dir);
        let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let dir = rustix::fs::openat2(
            &root,
            if rel.as_os_str().is_empty() {
                Path::new(".")
            } else {
                rel
            },
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            how,
        )?;
        let fd = rustix::fs::openat2(
            &dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            how,
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if (st.st_dev, st.st_ino) == old {
            let name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
            points.push(Point { dir, name, top: fd });
        }
    }
    if points.is_empty() {
        return Err(io::Error::other("no mount point shows the bound file"));
    }
    let mnt = File::open(format!("/proc/{init}/ns/mnt"))?;
    // SAFETY: an ioctl with no argument on a namespace descriptor; the result is checked.
    let owner = unsafe { libc::ioctl(mnt.as_raw_fd(), NS_GET_USERNS as _) };
    if owner < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the ioctl just returned this descriptor, ours alone.
    let owner = unsafe { OwnedFd::from_raw_fd(owner) };
    let (here, there) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let name = CString::new(NAME).map_err(io::Error::other)?;
    let tmpfs = CString::new("tmpfs").map_err(io::Error::other)?;
    let empty = CString::default();
    // SAFETY: the child makes system calls (their arguments made above; only the message
    // that sends the file back, or an error, allocates: the one other thread of the sync,
    // `companion`'s signal watcher, only waits in poll and holds no lock) and ends with
    // `_exit`; it never returns into the caller.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => {
            let code = match in_child(
                &owner, &mnt, &points, &tmpfs, &name, &empty, content, &there, old,
            ) {
                Ok(()) => 0,
                Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
            };
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(there);
            let got = receive_fd(&here);
            let status = nix::sys::wait::waitpid(child, None).map_err(io::Error::from)?;
            match (got, status) {
                (Ok(fd), nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(File::from(fd)),
                (_, nix::sys::wait::WaitStatus::Exited(_, code)) if code != 0 => {
                    Err(io::Error::from_raw_os_error(code))
                }
                (Err(e), _) => Err(e),
                (_, s) => Err(io::Error::other(format!("remount: {s:?}"))),
            }
        }
    }
}

/// In the forked child: join the namespaces, make the file, mount it, send it back.
#[allow(clippy::too_many_arguments)]
fn in_child(
    owner: &OwnedFd,
    mnt: &File,
    points: &[Point],
    tmpfs: &CString,
    name: &CString,
    empty: &CString,
    content: &[u8],
    to: &OwnedFd,
    old: (u64, u64),
) -> io::Result<()> {
    // SAFETY: setns on descriptors of this process; results checked.
    if unsafe { libc::setns(owner.as_raw_fd(), libc::CLONE_NEWUSER) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let fs = rustix::mount::fsopen(tmpfs.as_c_str(), FsOpenFlags::FSOPEN_CLOEXEC)?;
    rustix::mount::fsconfig_set_string(&fs, c"mode", c"0700")?;
    rustix::mount::fsconfig_set_string(&fs, c"size", c"1m")?;
    rustix::mount::fsconfig_create(&fs)?;
    let top = rustix::mount::fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, MountAttrFlags::empty())?;
    let fd = rustix::fs::openat(
        &top,
        name.as_c_str(),
        OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut f = File::from(fd);
    f.write_all(content)?;
    for p in points {
        let tree = rustix::mount::open_tree(
            &top,
            name.as_c_str(),
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )?;
        let both =
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH;
        // The new file goes beneath the old one (Linux 6.5), then the old one is taken off,
        // so that the name shows one whole file or the other and one mount stays. Before
        // 6.5, on top (which fails on the host's file once the host's claude renamed over
        // it: nothing can be mounted on an unlinked file).
        match rustix::mount::move_mount(
            &tree,
            empty.as_c_str(),
            &p.top,
            empty.as_c_str(),
            both | MoveMountFlags::MOVE_MOUNT_BENEATH,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::INVAL) => {
                rustix::mount::move_mount(&tree, empty.as_c_str(), &p.top, empty.as_c_str(), both)?;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        // The name, looked up in its directory (a mount point there: nothing can take its
        // place), must still show the old file before that mount is taken off.
        rustix::process::fchdir(&p.dir)?;
        let now = rustix::fs::openat(
            rustix::fs::CWD,
            p.name.as_c_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let st = rustix::fs::fstat(&now)?;
        if (st.st_dev, st.st_ino) != old {
            return Err(io::Error::other("the mount point changed"));
        }
        rustix::mount::unmount(
            p.name.as_c_str(),
            rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW,
        )?;
    }
    send_fd(to, f.as_fd().as_raw_fd())
}

fn send_fd(to: &OwnedFd, fd: RawFd) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds = [fd];
    let iov = [io::IoSlice::new(b"f")];
    sendmsg::<()>(
        to.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map(drop)
    .map_err(io::Error::from)
}

fn receive_fd(from: &OwnedFd) -> io::Result<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut buf = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        from.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&fd) = fds.first() {
                // SAFETY: the kernel just installed this descriptor for us.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Err(io::Error::other("the remount sent no file"))
}
