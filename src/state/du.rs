//! Disk usage of a directory tree, as `du` counts it (`st_blocks`, symlinks not followed,
//! hard links once), walked by directory descriptors: each directory is opened relative
//! to its parent's descriptor (`openat`, `O_NOFOLLOW`) and its entries are stat'ed
//! relative to it (`fstatat`, `AT_SYMLINK_NOFOLLOW`), so no path is ever built and a tree
//! deeper than `PATH_MAX` is counted whole. At most [`OPEN_DIRS`] descriptors are held:
//! deeper, a directory's descriptor is closed and reopened on the way back up through
//! `..` of its child, checked to be the same directory (device and inode). Also the
//! directory reading `--list` uses without sizes ([`entries`]).

use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};

/// Directory descriptors held open at once, whatever the depth.
pub const OPEN_DIRS: usize = 64;

/// What a walk counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes on disk: `st_blocks * 512` of the directory and everything below it.
    pub bytes: u64,
    /// Directories that could not be read (permissions, or changed under the walk).
    pub unreadable: u64,
}

/// One directory on the walk: its descriptor (while held), identity, and the
/// subdirectories still to visit (name, device, inode).
struct Frame {
    fd: Option<OwnedFd>,
    id: (u64, u64),
    todo: Vec<(CString, (u64, u64))>,
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn id(st: &FileStat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

/// `d_type` values of [`entries`] (from `<dirent.h>`).
pub const DT_UNKNOWN: u8 = 0;
pub const DT_DIR: u8 = 4;
pub const DT_REG: u8 = 8;

/// Opens the directory `name` (relative to `dir`, or a path with `None`) without
/// following a symlink.
pub fn open_dir<P: ?Sized + nix::NixPath>(dir: Option<RawFd>, name: &P) -> Option<OwnedFd> {
    let fd = openat(dir, name, dir_flags(), Mode::empty()).ok()?;
    // SAFETY: `openat` just returned this descriptor; nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// [`open_dir`] with `O_PATH`: a descriptor to look names up from (`openat`, `fstatat`),
/// not to read; cheaper to open and close.
pub fn open_path_dir<P: ?Sized + nix::NixPath>(dir: Option<RawFd>, name: &P) -> Option<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, Mode::empty()).ok()?;
    // SAFETY: `openat` just returned this descriptor; nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The entries of the directory open at `fd` (without `.` and `..`): name and `d_type`.
pub fn entries(fd: &OwnedFd) -> std::io::Result<Vec<(CString, u8)>> {
    let mut out = Vec::new();
    each_entry(fd, |name, d_type, _| {
        if let Ok(c) = CString::new(name) {
            out.push((c, d_type));
        }
    })?;
    Ok(out)
}

/// Calls `f` with the name, `d_type` and inode number (`d_ino`) of each entry of the
/// directory open at `fd` (without `.` and `..`). Read with `getdents64` itself: libc's
/// `readdir` costs an `fstat` and a copy first, which over 10,000 projects is a tenth of
/// `--list`; into one buffer per thread, kept, rather than 16 KiB allocated and zeroed
/// for each directory.
pub fn each_entry(fd: &OwnedFd, mut f: impl FnMut(&[u8], u8, u64)) -> std::io::Result<()> {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|cell| {
        // Taken out while in use, so a nested call (none today) gets a buffer of its own.
        let mut buf = cell.take();
        if buf.len() < 16 * 1024 {
            buf = vec![0u8; 16 * 1024];
        }
        let r = fill(fd, &mut buf, &mut f);
        cell.replace(buf);
        r
    })
}

fn fill(fd: &OwnedFd, buf: &mut [u8], f: &mut impl FnMut(&[u8], u8, u64)) -> std::io::Result<()> {
    loop {
        // SAFETY: `buf` is valid for writes of its length; the kernel writes at most that.
        let n = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_getdents64,
                fd.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        let filled = &buf[..n as usize];
        let mut off = 0;
        while off + 19 <= filled.len() {
            let reclen = u16::from_ne_bytes([filled[off + 16], filled[off + 17]]) as usize;
            if reclen < 19 || off + reclen > filled.len() {
                return Err(std::io::Error::other("malformed directory entry"));
            }
            let mut ino = [0u8; 8];
            ino.copy_from_slice(&filled[off..off + 8]);
            let d_type = filled[off + 18];
            let raw = &filled[off + 19..off + reclen];
            let name = &raw[..raw.iter().position(|b| *b == 0).unwrap_or(raw.len())];
            if name != b"." && name != b".." {
                f(name, d_type, u64::from_ne_bytes(ino));
            }
            off += reclen;
        }
    }
}

/// The disk usage of `dir` (not followed if it is a symlink: then its own size).
pub fn usage(dir: &Path) -> Usage {
    let mut u = Usage::default();
    let Some(top) = open_dir(None, dir) else {
        u.bytes = std::fs::symlink_metadata(dir)
            .map_or(0, |m| std::os::unix::fs::MetadataExt::blocks(&m) * 512);
        return u;
    };
    let Ok(st) = fstat(top.as_raw_fd()) else {
        u.unreadable += 1;
        return u;
    };
    u.bytes += st.st_blocks as u64 * 512;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut stack = vec![read(top, id(&st), &mut u, &mut seen)];
    while let Some(frame) = stack.last_mut() {
        if let Some((name, want)) = frame.todo.pop() {
            let Some(parent) = frame.fd.as_ref() else {
                u.unreadable += 1;
                continue;
            };
            let child = open_dir(Some(parent.as_raw_fd()), name.as_c_str());
            let same = child
                .as_ref()
                .and_then(|c| fstat(c.as_raw_fd()).ok())
                .is_some_and(|st| id(&st) == want);
            match child {
                Some(c) if same => {
                    stack.push(read(c, want, &mut u, &mut seen));
                    // Deep: let go of the descriptor OPEN_DIRS levels up.
                    if stack.len() > OPEN_DIRS {
                        let i = stack.len() - 1 - OPEN_DIRS;
                        stack[i].fd = None;
                    }
                }
                _ => u.unreadable += 1,
            }
            continue;
        }
        let Some(done) = stack.pop() else { break };
        if let (Some(parent), Some(child)) = (stack.last_mut(), done.fd.as_ref()) {
            if parent.fd.is_none() {
                parent.fd = open_dir(Some(child.as_raw_fd()), c"..")
                    .filter(|p| fstat(p.as_raw_fd()).is_ok_and(|st| id(&st) == parent.id));
                if parent.fd.is_none() {
                    // Moved away meanwhile: what is left of it is not reachable from here.
                    u.unreadable += parent.todo.len() as u64;
                    parent.todo.clear();
                }
            }
        }
    }
    u
}

/// Reads one directory: counts every entry's blocks and lists its subdirectories.
fn read(fd: OwnedFd, me: (u64, u64), u: &mut Usage, seen: &mut HashSet<(u64, u64)>) -> Frame {
    let mut todo = Vec::new();
    let Ok(list) = entries(&fd) else {
        u.unreadable += 1;
        return Frame {
            fd: Some(fd),
            id: me,
            todo,
        };
    };
    for (name, _) in list {
        let Ok(st) = fstatat(
            Some(fd.as_raw_fd()),
            name.as_c_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) else {
            continue;
        };
        if is_dir(&st) {
            todo.push((name, id(&st)));
        } else if st.st_nlink > 1 && !seen.insert(id(&st)) {
            continue;
        }
        u.bytes += st.st_blocks as u64 * 512;
    }
    Frame {
        fd: Some(fd),
        id: me,
        todo,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A chain of directories far deeper than PATH_MAX (and than OPEN_DIRS), made by
    /// descriptors, with a file at the bottom: counted whole; a path-based walk (the
    /// control) cannot even reach the bottom.
    #[test]
    fn counts_below_path_max_and_past_the_descriptor_budget() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("state");
        fs::create_dir(&top).unwrap();
        let name = "d".repeat(100);
        // 100 * 101 bytes: more than twice PATH_MAX, and deeper than OPEN_DIRS.
        let levels = 100;
        let mut fd = openat(None, &top, dir_flags(), Mode::empty()).unwrap();
        for _ in 0..levels {
            nix::sys::stat::mkdirat(Some(fd), name.as_str(), Mode::from_bits_truncate(0o700))
                .unwrap();
            let next = openat(Some(fd), name.as_str(), dir_flags(), Mode::empty()).unwrap();
            nix::unistd::close(fd).unwrap();
            fd = next;
        }
        let f = openat(
            Some(fd),
            "data",
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        // SAFETY: just opened, owned here.
        let mut file = unsafe { fs::File::from_raw_fd(f) };
        std::io::Write::write_all(&mut file, &vec![7u8; 4 << 20]).unwrap();
        file.sync_all().unwrap();
        drop(file);
        nix::unistd::close(fd).unwrap();

        let u = usage(&top);
        assert!(u.bytes >= 4 << 20, "{u:?}");
        assert_eq!(u.unreadable, 0, "{u:?}");
        // Control: by paths, the walk stops at PATH_MAX and misses the data.
        fn by_path(p: &Path) -> u64 {
            let mut n = 0;
            let Ok(rd) = fs::read_dir(p) else { return 0 };
            for e in rd.flatten() {
                let Ok(m) = e.metadata() else { continue };
                n += std::os::unix::fs::MetadataExt::blocks(&m) * 512;
                if m.is_dir() {
                    n += by_path(&e.path());
                }
            }
            n
        }
        assert!(by_path(&top) < 1 << 20, "the path walk reached the data");
    }

    #[test]
    fn counts_like_du() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path();
        fs::create_dir_all(top.join("a/b/c")).unwrap();
        fs::write(top.join("a/b/c/f"), vec![1u8; 100_000]).unwrap();
        fs::hard_link(top.join("a/b/c/f"), top.join("a/g")).unwrap();
        std::os::unix::fs::symlink("/usr", top.join("a/usr")).unwrap();
        let out = std::process::Command::new("du")
            .args(["-s", "-B1"])
            .arg(top)
            .output()
            .unwrap();
        let du: u64 = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(usage(top).bytes, du);
    }
}
