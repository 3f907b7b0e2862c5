//! Every file operation claudebox does on the host beneath a directory a sandbox can write
//! (the project's state and its `claude-config`, the conversations, the plugin data, the
//! login directory, session records, the settings copy, the denied log, gc's walk): by
//! directory descriptor, never by name. A [`Dir`] is a directory held open; every path
//! given to it is relative and resolved with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, or, where the kernel has no `openat2`
//! (ENOSYS, before 5.6), one `O_NOFOLLOW` component at a time. So an agent that swaps a
//! symlink, a FIFO or a directory in at any moment makes the operation fail; it never
//! leads it out. Files are created `O_EXCL`, written through the descriptor that created
//! them, read and written `O_NONBLOCK` and only when regular, written in place only when
//! they have one link (not a hard link the agent made to something of the host's).
//!
//! Only an anchor is opened by name ([`Dir::open`]): a directory whose parents no
//! sandbox can write (`~/.claudebox/projects/<id>`, `~/.claudebox/login`).
//! `src/state/beneath/scan.rs` fails the build's tests when code elsewhere touches such
//! paths with `std::fs`.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, ResolveFlags, CWD};
use rustix::io::Errno;

// Re-exported: `stat` and `kind` return rustix's types, named here so that callers need
// no `rustix` import of their own.
pub use rustix::fs::{FileType, Stat};

#[cfg(test)]
mod scan;
#[cfg(test)]
mod tests;

/// Set once `openat2` answered ENOSYS: the walk is used from then on.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// A directory held open by descriptor, with its path for messages only.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn err(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Refuses what cannot be beneath: an absolute path, `..`, an empty path.
fn check_rel(rel: &Path) -> io::Result<()> {
    let ok = !rel.as_os_str().is_empty()
        && rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a path beneath a directory: {}", rel.display()),
        ))
    }
}

/// The race harness's control (tests/integration/escape/state_races.rs), in debug builds
/// only: `CLAUDEBOX_TEST_BY_NAME=<ms>` makes every operation here by name, as before
/// issue 21 (paths followed through symlinks, no regular-file or link-count check, a new
/// file created, closed, and after `<ms>` opened again by name to be written, a new
/// directory followed by the same wait), so the
/// harness can show it hits what the protection stops. A release build never reads it.
#[cfg(debug_assertions)]
fn by_name() -> Option<Duration> {
    static BY_NAME: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *BY_NAME.get_or_init(|| {
        crate::host::test_switch::get("CLAUDEBOX_TEST_BY_NAME")
            .and_then(|v| v.into_string().ok())
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
    })
}

#[cfg(not(debug_assertions))]
fn by_name() -> Option<Duration> {
    None
}

/// Opens `rel` beneath `dir`: openat2, or the `O_NOFOLLOW` walk without it.
fn open_beneath(dir: BorrowedFd, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    check_rel(rel)?;
    if by_name().is_some() {
        return rustix::fs::openat(dir, rel, flags | OFlags::CLOEXEC, mode).map_err(err);
    }
    // openat2 refuses with O_PATH any flag but O_DIRECTORY, O_NOFOLLOW and O_CLOEXEC.
    let flags = if flags.contains(OFlags::PATH) {
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW
    } else {
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY
    };
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match rustix::fs::openat2(dir, rel, flags, mode, how) {
            Err(Errno::NOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
            r => return r.map_err(err),
        }
    }
    walk(dir, rel, flags, mode)
}

/// The fallback: every component but the last opened `O_PATH|O_DIRECTORY|O_NOFOLLOW`
/// from the one before, the last with `flags` (which hold `O_NOFOLLOW`).
fn walk(dir: BorrowedFd, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    check_rel(rel)?;
    let names: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = names.split_last() else {
        return rustix::fs::openat(dir, ".", flags, mode).map_err(err);
    };
    let mut cur: Option<OwnedFd> = None;
    for n in parents {
        let at = cur.as_ref().map_or(dir, |f| f.as_fd());
        let next = rustix::fs::openat(
            at,
            *n,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        cur = Some(next);
    }
    let at = cur.as_ref().map_or(dir, |f| f.as_fd());
    rustix::fs::openat(at, *last, flags | OFlags::NOFOLLOW, mode).map_err(err)
}

/// The parent directory of `rel` (opened beneath) and its last name.
fn split(rel: &Path) -> io::Result<(Option<&Path>, &OsStr)> {
    check_rel(rel)?;
    let name = rel.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "a path without a final name")
    })?;
    let parent = rel.parent().filter(|p| !p.as_os_str().is_empty());
    Ok((parent, name))
}

impl Dir {
    /// Opens an anchor by name: a directory whose parents no sandbox can write (the
    /// project's state directory, the login directory, the state home). The anchor itself
    /// may be a symlink the user made (`~/.claudebox -> /data/cb`).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = rustix::fs::openat(
            CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The directory `rel` beneath this one.
    pub fn sub(&self, rel: &Path) -> io::Result<Dir> {
        let fd = open_beneath(
            self.fd.as_fd(),
            rel,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )?;
        Ok(Dir {
            fd,
            path: self.path.join(rel),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `rel`, for messages.
    pub fn shown(&self, rel: &Path) -> PathBuf {
        self.path.join(rel)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Runs `f` on the parent of `rel` (this directory, or one opened beneath it) and the
    /// last name: for the calls that act on a name and never follow it (`unlinkat`,
    /// `mkdirat`, `renameat`, `fstatat` without following).
    fn at<T>(
        &self,
        rel: &Path,
        f: impl FnOnce(BorrowedFd, &OsStr) -> io::Result<T>,
    ) -> io::Result<T> {
        let (parent, name) = split(rel)?;
        match parent {
            None => f(self.fd.as_fd(), name),
            Some(p) => {
                let d = open_beneath(
                    self.fd.as_fd(),
                    p,
                    OFlags::PATH | OFlags::DIRECTORY,
                    Mode::empty(),
                )?;
                f(d.as_fd(), name)
            }
        }
    }

    /// `lstat` of `rel`: what is there, never through a symlink.
    pub fn stat(&self, rel: &Path) -> io::Result<Stat> {
        self.at(rel, |d, n| {
            rustix::fs::statat(d, n, AtFlags::SYMLINK_NOFOLLOW).map_err(err)
        })
    }

    /// The type of `rel`, `None` when nothing is there.
    pub fn kind(&self, rel: &Path) -> Option<FileType> {
        self.stat(rel)
            .ok()
            .map(|s| FileType::from_raw_mode(s.st_mode))
    }

    pub fn is_file(&self, rel: &Path) -> bool {
        self.kind(rel) == Some(FileType::RegularFile)
    }

    pub fn is_dir(&self, rel: &Path) -> bool {
        self.kind(rel) == Some(FileType::Directory)
    }

    /// Opens the regular file `rel` for reading (a FIFO, device or directory is refused,
    /// and never blocks the open).
    pub fn open_read(&self, rel: &Path) -> io::Result<File> {
        let fd = open_beneath(
            self.fd.as_fd(),
            rel,
            OFlags::RDONLY | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        regular(File::from(fd), false)
    }

    /// The bytes of the regular file `rel`.
    pub fn read(&self, rel: &Path) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let mut b = Vec::new();
        self.open_read(rel)?.read_to_end(&mut b)?;
        Ok(b)
    }

    /// Opens the regular file `rel`, with one link, for writing in place.
    pub fn open_write(&self, rel: &Path) -> io::Result<File> {
        let fd = open_beneath(
            self.fd.as_fd(),
            rel,
            OFlags::WRONLY | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        regular(File::from(fd), true)
    }

    /// Opens `rel` for appending, creating it (`mode`) when missing: a regular file with
    /// one link, or an error.
    pub fn open_append(&self, rel: &Path, mode: u32) -> io::Result<File> {
        let fd = open_beneath(
            self.fd.as_fd(),
            rel,
            OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NONBLOCK,
            Mode::from_raw_mode(mode),
        )?;
        regular(File::from(fd), true)
    }

    /// Creates `rel`, which must not exist (`O_EXCL`), and returns it open for writing.
    pub fn create_new(&self, rel: &Path, mode: u32) -> io::Result<File> {
        if let Some(wait) = by_name() {
            drop(open_beneath(
                self.fd.as_fd(),
                rel,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
                Mode::from_raw_mode(mode),
            )?);
            std::thread::sleep(wait);
            let fd = open_beneath(
                self.fd.as_fd(),
                rel,
                OFlags::WRONLY | OFlags::TRUNC,
                Mode::empty(),
            )?;
            return Ok(File::from(fd));
        }
        let fd = open_beneath(
            self.fd.as_fd(),
            rel,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(mode),
        )?;
        Ok(File::from(fd))
    }

    /// Creates the empty regular file `rel` unless one is there.
    pub fn touch(&self, rel: &Path, mode: u32) -> io::Result<()> {
        if self.is_file(rel) {
            return Ok(());
        }
        let fd = open_beneath(
            self.fd.as_fd(),
            rel,
            OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK,
            Mode::from_raw_mode(mode),
        )?;
        regular(File::from(fd), false).map(drop)
    }

    /// Writes `bytes` to a new temporary file beside `rel` (created `O_EXCL`, written
    /// through that descriptor) and renames it over `rel` within the same directory
    /// descriptor; with `durable`, fsyncs the file and the directory.
    pub fn write_atomic(
        &self,
        rel: &Path,
        bytes: &[u8],
        mode: u32,
        durable: bool,
    ) -> io::Result<()> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let (parent, name) = split(rel)?;
        let dir = match parent {
            Some(p) => self.sub(p)?,
            None => self.sub(Path::new("."))?,
        };
        let mut tmp = OsString::from(".");
        tmp.push(name);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        tmp.push(format!(".tmp.{}.{seq}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let result = (|| -> io::Result<()> {
            let mut f = dir.create_new(&tmp, mode)?;
            f.write_all(bytes)?;
            if durable {
                f.sync_all()?;
            }
            rustix::fs::renameat(dir.fd(), &tmp, dir.fd(), name).map_err(err)?;
            if durable {
                rustix::fs::fsync(dir.fd()).ok();
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = rustix::fs::unlinkat(dir.fd(), &tmp, AtFlags::empty());
        }
        result
    }

    /// Writes `bytes` over the regular file `rel` in place (same inode: a file bound into
    /// running sandboxes), or creates it atomically when there is none or it is anything
    /// but a regular file with one link (replaced by rename, which never follows it).
    pub fn rewrite_in_place(&self, rel: &Path, bytes: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        match self.open_write(rel) {
            Ok(f) => {
                f.write_all_at(bytes, 0)?;
                f.set_len(bytes.len() as u64)?;
                f.sync_all()
            }
            Err(_) => self.write_atomic(rel, bytes, 0o600, true),
        }
    }

    /// `mkdir rel` (mode), failing when anything is there.
    pub fn mkdir(&self, rel: &Path, mode: u32) -> io::Result<()> {
        self.at(rel, |d, n| {
            rustix::fs::mkdirat(d, n, Mode::from_raw_mode(mode)).map_err(err)
        })?;
        // The race harness's control waits after a new directory as after a new file:
        // without it, its by-name import was hit only when the host was slow between
        // two mkdirs (0 of 40 rounds on a quiet machine with the file supervisor inside).
        if let Some(wait) = by_name() {
            std::thread::sleep(wait);
        }
        Ok(())
    }

    /// Makes `rel` a directory unless it is one (never a symlink to one).
    pub fn ensure_dir(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let exists_as_dir = |s: Stat| {
            if FileType::from_raw_mode(s.st_mode) == FileType::Directory {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a directory",
                        self.shown(rel).display()
                    ),
                ))
            }
        };
        if let Ok(s) = self.stat(rel) {
            return exists_as_dir(s);
        }
        match self.mkdir(rel, mode) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => exists_as_dir(self.stat(rel)?),
            r => r,
        }
    }

    /// `symlink target rel`, failing when anything is there.
    pub fn symlink(&self, target: &Path, rel: &Path) -> io::Result<()> {
        self.at(rel, |d, n| rustix::fs::symlinkat(target, d, n).map_err(err))
    }

    /// The target of the symlink `rel` (never followed).
    pub fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        use std::os::unix::ffi::OsStringExt;
        self.at(rel, |d, n| {
            rustix::fs::readlinkat(d, n, Vec::new())
                .map(|t| PathBuf::from(OsString::from_vec(t.into_bytes())))
                .map_err(err)
        })
    }

    pub fn remove_file(&self, rel: &Path) -> io::Result<()> {
        self.at(rel, |d, n| {
            rustix::fs::unlinkat(d, n, AtFlags::empty()).map_err(err)
        })
    }

    pub fn remove_dir(&self, rel: &Path) -> io::Result<()> {
        self.at(rel, |d, n| {
            rustix::fs::unlinkat(d, n, AtFlags::REMOVEDIR).map_err(err)
        })
    }

    /// Removes `rel` and, if it is a directory, everything in it, by descriptor: a
    /// directory is opened `O_NOFOLLOW` before it is read, a symlink is removed, never
    /// followed. Directories the owner cannot enter or write are made 0700 first (an
    /// agent's `chmod 000`, a Go module cache's read-only trees).
    pub fn remove_all(&self, rel: &Path) -> io::Result<()> {
        let kind = FileType::from_raw_mode(self.stat(rel)?.st_mode);
        if kind != FileType::Directory {
            return self.remove_file(rel);
        }
        self.at(rel, |d, n| {
            remove_tree(d, n)?;
            rustix::fs::unlinkat(d, n, AtFlags::REMOVEDIR).map_err(err)
        })
    }

    /// Renames `from` to `to`, both beneath this directory (replacing `to`).
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.at(from, |fd, fname| {
            self.at(to, |td, tname| {
                rustix::fs::renameat(fd, fname, td, tname).map_err(err)
            })
        })
    }

    /// Sets the permission bits of `rel` (through an `O_PATH` descriptor of what was
    /// resolved beneath, never a symlink).
    pub fn chmod(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let fd = open_beneath(self.fd.as_fd(), rel, OFlags::PATH, Mode::empty())?;
        chmod_fd(fd.as_fd(), mode)
    }

    /// The names in `rel` (this directory for `.`) with their types.
    pub fn entries(&self, rel: &Path) -> io::Result<Vec<(OsString, FileType)>> {
        let d = if rel == Path::new(".") {
            rustix::fs::openat(
                self.fd(),
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(err)?
        } else {
            open_beneath(
                self.fd(),
                rel,
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mode::empty(),
            )?
        };
        list(d.as_fd())
    }

    /// fsync of the directory itself.
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::fsync(self.fd()).map_err(err)
    }
}

fn chmod_fd(fd: BorrowedFd, mode: u32) -> io::Result<()> {
    // fchmod refuses an O_PATH descriptor; its magic link names exactly that inode.
    let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    rustix::fs::chmodat(
        CWD,
        link.as_str(),
        Mode::from_raw_mode(mode),
        AtFlags::empty(),
    )
    .map_err(err)
}

fn list(d: BorrowedFd) -> io::Result<Vec<(OsString, FileType)>> {
    let mut out = Vec::new();
    for e in rustix::fs::Dir::read_from(d).map_err(err)? {
        let e = e.map_err(err)?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push((OsStr::from_bytes(name).to_os_string(), e.file_type()));
    }
    Ok(out)
}

/// How deep [`remove_tree`] goes before it moves a directory up to the top one.
const HOIST_AT: usize = 64;

/// The escape suite's control, in debug builds only: `CLAUDEBOX_TEST_UNBOUNDED_WALKS`
/// makes [`remove_tree`] hold a descriptor per level (no hoisting) and the exit review
/// walk any depth, as before.
pub fn unbounded_walks() -> bool {
    crate::host::test_switch::get("CLAUDEBOX_TEST_UNBOUNDED_WALKS").is_some()
}

/// Empties the directory `name` in `parent`, by descriptor. Iterative, and past
/// [`HOIST_AT`] levels a directory is first moved up into the top one: a chain of
/// directories as deep as the agent likes (30,000 made inside) costs neither stack
/// (the recursive walk before overflowed it and aborted `--gc`) nor more than
/// [`HOIST_AT`] descriptors (one per level failed with EMFILE past the open-files limit).
fn remove_tree(parent: BorrowedFd, name: &OsStr) -> io::Result<()> {
    /// A directory being emptied: its descriptor, its name in the one above, the entries
    /// still to remove.
    struct Level {
        dir: OwnedFd,
        name: OsString,
        left: Vec<(OsString, FileType)>,
    }
    let top = open_to_empty(parent, name)?;
    let left = list(top.as_fd())?;
    let mut levels = vec![Level {
        dir: top,
        name: name.to_os_string(),
        left,
    }];
    while let Some(last) = levels.len().checked_sub(1) {
        let Some((n, t)) = levels[last].left.pop() else {
            let done = levels.pop();
            if let (Some(done), Some(up)) = (done, levels.last()) {
                drop(done.dir);
                rustix::fs::unlinkat(&up.dir, &done.name, AtFlags::REMOVEDIR).map_err(err)?;
            }
            continue;
        };
        if t == FileType::Directory && levels.len() >= HOIST_AT && !unbounded_walks() {
            // Moved up to the top directory (a rename between two descriptors of this
            // tree) and emptied from there: the descriptors held stay under HOIST_AT.
            let (dir, top) = (levels[last].dir.as_fd(), levels[0].dir.as_fd());
            let mut k = 0u64;
            let hoisted = loop {
                let to = OsString::from(format!(".claudebox-deep-{k}"));
                match rustix::fs::renameat_with(dir, &n, top, &to, RenameFlags::NOREPLACE) {
                    Ok(()) => break to,
                    Err(Errno::EXIST) => k += 1,
                    Err(e) => return Err(err(e)),
                }
            };
            levels[0].left.push((hoisted, t));
        } else if t == FileType::Directory {
            let dir = open_to_empty(levels[last].dir.as_fd(), &n)?;
            let left = list(dir.as_fd())?;
            levels.push(Level { dir, name: n, left });
        } else {
            rustix::fs::unlinkat(&levels[last].dir, &n, AtFlags::empty()).map_err(err)?;
        }
    }
    Ok(())
}

/// Opens the directory `name` in `parent` to empty it (never through a symlink),
/// giving its owner the rights to first when it lacks them.
fn open_to_empty(parent: BorrowedFd, name: &OsStr) -> io::Result<OwnedFd> {
    let open = || {
        rustix::fs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)
    };
    let d = match open() {
        Err(e) if e.raw_os_error() == Some(libc_eacces()) => {
            let p = rustix::fs::openat(
                parent,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(err)?;
            chmod_fd(p.as_fd(), 0o700)?;
            open()?
        }
        r => r?,
    };
    let st = rustix::fs::fstat(&d).map_err(err)?;
    if st.st_mode & 0o700 != 0o700 {
        rustix::fs::fchmod(&d, Mode::from_raw_mode((st.st_mode | 0o700) & 0o7777)).map_err(err)?;
    }
    Ok(d)
}

fn libc_eacces() -> i32 {
    Errno::ACCESS.raw_os_error()
}

/// `f` when it is a regular file (and, with `single`, has one link), else an error.
fn regular(f: File, single: bool) -> io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    if by_name().is_some() {
        return Ok(f);
    }
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if single && m.nlink() != 1 {
        return Err(io::Error::other("a file with more than one link"));
    }
    Ok(f)
}

/// How long claude (proper-lockfile) waits before it takes over a lock directory.
pub const LOCK_STALE: Duration = Duration::from_secs(10);
/// A lock dated later than now by more than this was not made by a clock of this machine.
const FUTURE_SLACK: Duration = Duration::from_secs(2);

/// Whether a lock directory (or anything at a lock's name) with these times blocks for
/// nobody's good: dated in the future, or untouched for longer than claude's stale time.
/// proper-lockfile dates its lock now and touches it every 5 s while it holds it.
pub fn lock_is_stale(mtime: SystemTime, now: SystemTime) -> bool {
    match now.duration_since(mtime) {
        Ok(age) => age > LOCK_STALE,
        Err(ahead) => ahead.duration() > FUTURE_SLACK,
    }
}

fn mtime_of(s: &Stat) -> SystemTime {
    let secs = s.st_mtime;
    let nanos = s.st_mtime_nsec as u32;
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(secs as u64, nanos)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::new(0, nanos)
    }
}

/// Removes a lock planted at `name` in `dir` that would block a claude or a launch: a
/// lock directory dated in the future (claude never takes one over), anything but an
/// empty directory (claude's `rmdir` of a stale lock fails on it), or one older than the
/// stale time. A lock a live claude holds (dated now, touched every 5 s, empty) is
/// left alone. Returns whether something was removed.
pub fn clear_planted_lock(dir: &Dir, name: &Path) -> bool {
    let Ok(s) = dir.stat(name) else {
        return false;
    };
    let is_dir = FileType::from_raw_mode(s.st_mode) == FileType::Directory;
    let empty = is_dir && dir.entries(name).is_ok_and(|e| e.is_empty());
    if is_dir && empty && !lock_is_stale(mtime_of(&s), SystemTime::now()) {
        return false;
    }
    dir.remove_all(name).is_ok()
}

/// The modification time of `rel` (not through a symlink).
pub fn mtime(dir: &Dir, rel: &Path) -> io::Result<SystemTime> {
    dir.stat(rel).map(|s| mtime_of(&s))
}
