//! The exit review's walk: every directory of the work tree read once by descriptor
//! (`openat` with `O_NOFOLLOW`, so no symlink the agent planted is followed), and only the
//! names `policy::review` has a rule for looked at (`fstatat` without following), then the
//! project's git dirs' code-bearing files. Files git reads in a git dir (the rows of
//! `policy::git_dir::GIT_DIR_FILES`) are read through the descriptor of their directory
//! (`O_NOFOLLOW`, regular files only, at most [`MAX_JUDGED`] bytes) and judged by their
//! content (`policy::review::git_dir_judgement`); never by name.
//!
//! Minimal descriptor helpers are local to this module; the general descriptor module of
//! `state` is meant to take them over.

use std::ffi::{CStr, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::sys::stat::{self, FileStat, Mode};

use crate::policy::git_dir::{judged_files, GitDirKind, MODULES_DEPTH};
use crate::policy::review::{self, Severity};

/// A point in the file system's clock: what a file's ctime is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Since {
    pub sec: i64,
    pub nsec: i64,
}

impl Since {
    pub fn of(st: &FileStat) -> Since {
        Since {
            sec: st.st_ctime,
            nsec: st.st_ctime_nsec,
        }
    }

    /// Whether a file's ctime is at or after this point. A ctime with no nanoseconds
    /// (file systems that keep whole seconds) counts from the launch's second.
    pub fn precedes(&self, st: &FileStat) -> bool {
        if st.st_ctime_nsec == 0 {
            return st.st_ctime >= self.sec;
        }
        (st.st_ctime, st.st_ctime_nsec) >= (self.sec, self.nsec)
    }
}

/// One thing found: in the directory `dir` (open as `dirfd`), the entry `name`.
pub struct Found<'a> {
    pub dirfd: RawFd,
    pub dir: &'a Path,
    pub name: &'a OsStr,
    pub severity: Severity,
    pub reason: String,
}

/// What the walk could not look at (a directory it could not open, even after giving its
/// owner the rights to): reported, never silently skipped.
pub struct Unread {
    pub path: PathBuf,
    pub error: Errno,
    /// Whether what lies below could hold what a host tool runs: the review then holds the
    /// project. False for a directory this user cannot enter at all (nothing below is
    /// reachable to the user's host tools, nor was to the sandbox, which runs as the
    /// user), and for one gone meanwhile.
    pub holds: bool,
}

/// The escape suite's control, in debug builds only: `CLAUDEBOX_TEST_REVIEW_GIVES_UP`
/// makes the review as it was before it failed closed: it does not make its way into a
/// directory it cannot list or move from, warns and keeps what it cannot move, and takes
/// an unreadable pending-review record for no review at all.
pub fn gives_up() -> bool {
    crate::host::test_switch::on("CLAUDEBOX_TEST_REVIEW_GIVES_UP")
}

/// Changes the mode of the inode `fd` stands for (an `O_PATH` descriptor too: `fchmod`
/// refuses one, its magic link names exactly that inode; never a symlink's target).
pub fn chmod_fd(fd: RawFd, mode: u32) -> nix::Result<()> {
    let link = format!("/proc/self/fd/{fd}");
    stat::fchmodat(
        None,
        link.as_str(),
        Mode::from_bits_truncate(mode),
        stat::FchmodatFlags::FollowSymlink,
    )
}

/// Whether this process's user, the file's owner, lacks the owner's rights `want` (bits of
/// 0o700) on a file of status `st`: root needs none (it passes permission bits); on
/// another user's file the owner's bits are not this user's (its rights there cannot be
/// given, and are not asked for).
pub fn lacks(st: &FileStat, want: u32) -> bool {
    let me = nix::unistd::geteuid();
    !me.is_root() && st.st_uid == me.as_raw() && st.st_mode & want != want
}

/// Opens the directory `name` in `dirfd` as [`open_dir`] does; one its owner (this user)
/// cannot list or search (the agent's `chmod 0111`, `0000`, `0444`) is first given
/// `u+rwx` through an `O_PATH` descriptor opened without following a symlink, as `--gc`
/// does. Returns its mode before, to put back when the review is done with it (`None`:
/// unchanged), and its status before (its ctime not yet the review's). A directory
/// another user owns, or one whose mode cannot change, is an error (`EACCES`).
pub fn open_dir_in(dirfd: RawFd, name: &OsStr) -> nix::Result<(OwnedFd, Option<u32>, FileStat)> {
    let first = open_dir(Some(dirfd), name);
    if gives_up() {
        let fd = first?;
        let st = stat::fstat(fd.as_raw_fd())?;
        return Ok((fd, None, st));
    }
    match first {
        Ok(fd) => {
            let st = stat::fstat(fd.as_raw_fd())?;
            if !lacks(&st, 0o500) {
                return Ok((fd, None, st));
            }
            let old = st.st_mode & 0o7777;
            stat::fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(old | 0o700))
                .map_err(|_| Errno::EACCES)?;
            Ok((fd, Some(old), st))
        }
        Err(Errno::EACCES) => {
            let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let p = fcntl::openat(Some(dirfd), name, flags, Mode::empty())?;
            // SAFETY: openat just returned this descriptor.
            let p = unsafe { OwnedFd::from_raw_fd(p) };
            let st = stat::fstat(p.as_raw_fd())?;
            let old = st.st_mode & 0o7777;
            chmod_fd(p.as_raw_fd(), old | 0o700).map_err(|_| Errno::EACCES)?;
            match open_dir(Some(dirfd), name) {
                // The same directory (not one swapped in by name meanwhile).
                Ok(fd) if stat::fstat(fd.as_raw_fd()).is_ok_and(|s| ino(&s) == ino(&st)) => {
                    Ok((fd, Some(old), st))
                }
                other => {
                    let _ = chmod_fd(p.as_raw_fd(), old);
                    Err(other.err().unwrap_or(Errno::EAGAIN))
                }
            }
        }
        Err(e) => Err(e),
    }
}

/// Whether this user can search the directory `name` in `dirfd` (reach what lies below it
/// by name).
fn searchable(dirfd: RawFd, name: &OsStr) -> bool {
    nix::unistd::faccessat(
        Some(dirfd),
        name,
        nix::unistd::AccessFlags::X_OK,
        nix::fcntl::AtFlags::AT_EACCESS | nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .is_ok()
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// How long one process's review waits, in all, for descriptors to come free.
pub const NO_FD_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs `open` again while it fails with `EMFILE` or `ENFILE` (this process's descriptors,
/// or the machine's file table, used up: by another sandbox still running, say), waiting
/// 10 ms and then twice as long each time up to 500 ms, for [`NO_FD_WAIT`] in all per
/// process (issue 34: the review skipped a project with "check it by hand" when a sandbox
/// had filled the file table). Past that the error stands, and the review says so.
pub fn retry_no_fd<T>(mut open: impl FnMut() -> nix::Result<T>) -> nix::Result<T> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static WAITED_MS: AtomicU64 = AtomicU64::new(0);
    let mut pause = 10u64;
    loop {
        match open() {
            Err(e @ (Errno::EMFILE | Errno::ENFILE)) => {
                if WAITED_MS.fetch_add(pause, Ordering::Relaxed) + pause
                    > NO_FD_WAIT.as_millis() as u64
                {
                    return Err(e);
                }
                std::thread::sleep(std::time::Duration::from_millis(pause));
                pause = (pause * 2).min(500);
            }
            r => return r,
        }
    }
}

/// Opens `name` in `dirfd` as a directory, never through a symlink.
pub fn open_dir(dirfd: Option<RawFd>, name: &(impl nix::NixPath + ?Sized)) -> nix::Result<OwnedFd> {
    let fd = retry_no_fd(|| fcntl::openat(dirfd, name, DIR_FLAGS, Mode::empty()))?;
    // SAFETY: openat just returned this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn lstat_at(dirfd: RawFd, name: &(impl nix::NixPath + ?Sized)) -> nix::Result<FileStat> {
    stat::fstatat(Some(dirfd), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
}

fn is_dir(st: &FileStat) -> bool {
    st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR
}

/// The names in a directory with their types (`None`: the file system did not say).
fn entries(fd: &OwnedFd) -> nix::Result<Vec<(OsString, Option<Type>)>> {
    // fdopendir takes the descriptor: give it a duplicate, keep ours for *at calls.
    let dup = nix::unistd::dup(fd.as_raw_fd())?;
    let mut d = Dir::from_fd(dup)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e?;
        let n: &CStr = e.file_name();
        let b = n.to_bytes();
        if b == b"." || b == b".." {
            continue;
        }
        out.push((OsStr::from_bytes(b).to_os_string(), e.file_type()));
    }
    Ok(out)
}

/// Whether the entry, or (for a directory) anything below it, changed at or after
/// `since`. Never follows a symlink; an unreadable directory (one past the open-file
/// limit too) counts as changed. Iterative: a tree of any depth the agent made cannot
/// overflow the stack (a recursive walk aborted at 5,000 levels).
fn changed(dirfd: RawFd, name: &OsStr, since: Since) -> bool {
    let Ok(st) = lstat_at(dirfd, name) else {
        return false; // gone meanwhile
    };
    if since.precedes(&st) {
        return true;
    }
    if !is_dir(&st) {
        return false;
    }
    let Ok(fd) = open_dir(Some(dirfd), name) else {
        return true;
    };
    let Ok(list) = entries(&fd) else {
        return true;
    };
    let mut stack = vec![(fd, list.into_iter())];
    while let Some((fd, rest)) = stack.last_mut() {
        let Some((n, _)) = rest.next() else {
            stack.pop();
            continue;
        };
        let raw = fd.as_raw_fd();
        let Ok(st) = lstat_at(raw, n.as_os_str()) else {
            continue;
        };
        if since.precedes(&st) {
            return true;
        }
        if !is_dir(&st) {
            continue;
        }
        let Ok(child) = open_dir(Some(raw), n.as_os_str()) else {
            return true;
        };
        let Ok(list) = entries(&child) else {
            return true;
        };
        stack.push((child, list.into_iter()));
    }
    false
}

/// Walks the work tree at `root` (its top-level `.claude`, a scratch directory, and
/// `.git`, whose git dir is reviewed by [`git_dir`], skipped) and calls `found` for each
/// entry a rule matches that changed at or after `since`. Entries are handed over before
/// the walk goes on, so `found` may move them away: a matched entry is never descended
/// into.
///
/// `judged_there`: the directories (`modules/`, `worktrees/` of the common dir) whose git
/// dirs [`git_dir`] judges; a gitlink file naming one of them is not judged again.
///
/// `links`: the directories a sandbox can write outside the work tree, by
/// `policy::review::LINK_RULES`' row (claudebox's state home: the shared login
/// directory, each project's claude-config and conversations; the launch's `--rw`
/// paths; by name, any `.git` directory below the top); a symlink made during the
/// session that leads into one is moved aside.
pub fn work_tree(
    root: &Path,
    since: Since,
    judged_there: &[Ino],
    links: &[LinkDirs],
    found: &mut dyn FnMut(Found<'_>),
    unread: &mut Vec<Unread>,
) {
    let mut w = Walk {
        since,
        judged_there,
        links,
        top: None,
        found,
        unread,
    };
    match open_top(root) {
        Ok((fd, restore, before)) => {
            w.top = Some(ino(&before));
            w.walk(fd, restore, &before, root.to_path_buf());
        }
        Err(error) => w.unread.push(Unread {
            path: root.to_path_buf(),
            holds: error != Errno::ENOENT,
            error,
        }),
    }
}

/// Opens a directory the review starts from (the work tree, a git dir) by its path, making
/// its way in as [`open_dir_in`] does (through its parent's descriptor).
pub fn open_top(root: &Path) -> nix::Result<(OwnedFd, Option<u32>, FileStat)> {
    match (root.parent(), root.file_name()) {
        (Some(parent), Some(name)) => {
            let pfd = open_dir(None, parent)?;
            open_dir_in(pfd.as_raw_fd(), name)
        }
        _ => {
            let fd = open_dir(None, root)?;
            let st = stat::fstat(fd.as_raw_fd())?;
            Ok((fd, None, st))
        }
    }
}

/// Puts back a directory's mode [`open_dir_in`] changed.
pub fn restore_mode(fd: &OwnedFd, restore: Option<u32>) {
    if let Some(mode) = restore {
        let _ = stat::fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(mode));
    }
}

/// A directory's identity: `(st_dev, st_ino)`.
pub type Ino = (u64, u64);

/// One row of `policy::review::LINK_RULES` with its directories: a new symlink leading
/// in or below one of `dirs` is taken, unless one of `covered` (or the work tree) lies
/// nearer above its target (the `.git` row's directories are found by name, its lists
/// are empty).
pub struct LinkDirs {
    pub rule: review::LinkRule,
    pub dirs: Vec<Ino>,
    pub covered: Vec<Ino>,
}

fn ino(st: &FileStat) -> Ino {
    (st.st_dev, st.st_ino)
}

/// The identity of a directory, opened without following symlinks (None when missing).
pub fn dir_ino(p: &Path) -> Option<Ino> {
    let fd = open_dir(None, p).ok()?;
    stat::fstat(fd.as_raw_fd()).ok().map(|st| ino(&st))
}

struct Walk<'a> {
    since: Since,
    judged_there: &'a [Ino],
    links: &'a [LinkDirs],
    /// The work tree's top: a symlink leading into it is the walk's to judge.
    top: Option<Ino>,
    found: &'a mut dyn FnMut(Found<'_>),
    unread: &'a mut Vec<Unread>,
}

/// A directory the walk is in: its entries not looked at yet.
struct Frame {
    fd: OwnedFd,
    path: PathBuf,
    /// The directory's name (empty at the top).
    name: OsString,
    depth: usize,
    /// The directory is itself new or renamed here: a `.claude`'s settings files, and the
    /// files a `Pattern::Under` chain through it leads to, count as new whatever their own
    /// ctime (a whole old directory moved into place).
    new: bool,
    /// Its mode before the review gave its owner the rights to list and search it: put
    /// back when the walk leaves it.
    restore: Option<u32>,
    rest: std::vec::IntoIter<(OsString, Option<Type>)>,
}

impl Drop for Frame {
    fn drop(&mut self) {
        if let Some(mode) = self.restore {
            let _ = stat::fchmod(self.fd.as_raw_fd(), Mode::from_bits_truncate(mode));
        }
    }
}

impl Walk<'_> {
    /// Depth first with a stack of its own (a recursive walk overflowed the thread's stack
    /// at 5,000 levels, and the review, every later one too, aborted before the rest of
    /// the tree and the git dirs).
    fn walk(&mut self, fd: OwnedFd, restore: Option<u32>, before: &FileStat, path: PathBuf) {
        let since = self.since;
        let new = since.precedes(before);
        let mut stack = match self.enter(fd, restore, new, path.clone(), OsString::new(), 0) {
            Ok(frame) => vec![frame],
            Err(error) => {
                self.unread.push(Unread {
                    path,
                    error,
                    holds: true,
                });
                return;
            }
        };
        while let Some(frame) = stack.last_mut() {
            let Some((name, kind)) = frame.rest.next() else {
                stack.pop();
                continue;
            };
            let Some(top) = stack.last() else { continue };
            let (raw, depth) = (top.fd.as_raw_fd(), top.depth);
            if depth == 0 && (name == ".git" || review::is_claude_dir(&name)) {
                continue;
            }
            // The directories it is in below the top, innermost first (frame i is at
            // depth i).
            let dirs: Vec<&OsStr> = stack[1..]
                .iter()
                .rev()
                .take(review::DIRS_LOOKED_AT)
                .map(|f| f.name.as_os_str())
                .collect();
            if let Some(rule) = review::work_tree_rule(&name, depth, &dirs) {
                let as_rule = |reason: String| (rule.severity, reason);
                let hit = match rule.pattern {
                    // As severe as what was found in its git dir.
                    review::Pattern::NestedGit => {
                        nested_git(raw, &name, since, self.judged_there, self.top)
                            .map(|(severity, why)| (severity, review::nested_reason(&why)))
                    }
                    review::Pattern::InClaudeDir(_) => (top.new || changed(raw, &name, since))
                        .then(|| as_rule(rule.reason.to_string())),
                    review::Pattern::Under(chain, ..) => {
                        (stack.iter().rev().take(chain.len()).any(|f| f.new)
                            || changed(raw, &name, since))
                        .then(|| as_rule(rule.reason.to_string()))
                    }
                    _ => changed(raw, &name, since).then(|| as_rule(rule.reason.to_string())),
                };
                if let Some((severity, reason)) = hit {
                    self.report(raw, &top.path, &name, severity, reason);
                }
                // A matched entry is not walked (a nested .git's files are git's).
                continue;
            }
            let is_dir = match kind {
                Some(Type::Directory) => true,
                Some(_) => false,
                None => lstat_at(raw, name.as_os_str()).is_ok_and(|st| is_dir(&st)),
            };
            if !is_dir {
                // A symlinked `.claude`: a host claude follows it, this walk does not.
                let hit = if review::is_claude_dir(&name) && changed(raw, &name, since) {
                    let rule = review::CLAUDE_DIR_NOT_A_DIRECTORY;
                    Some((rule.severity, rule.reason))
                } else {
                    (kind.is_none_or(|k| k == Type::Symlink))
                        .then(|| link_rule(raw, &name, since, self.top, self.links))
                        .flatten()
                        .map(|rule| (rule.severity, rule.reason))
                };
                if let Some((severity, reason)) = hit {
                    self.report(raw, &top.path, &name, severity, reason.to_string());
                }
                continue;
            }
            // Past the depth the walk goes to: a changed tree there is moved aside whole
            // (with descriptors to spare for the move, under a 1,024 open-file limit).
            if depth + 1 >= review::MAX_WALK_DEPTH {
                if changed(raw, &name, since) {
                    self.report(
                        raw,
                        &top.path,
                        &name,
                        Severity::High,
                        review::too_deep_to_walk_reason(),
                    );
                }
                continue;
            }
            let opened = open_dir_in(raw, name.as_os_str()).and_then(|(child, restore, st)| {
                let new = since.precedes(&st);
                let path = top.path.join(&name);
                self.enter(child, restore, new, path, name.clone(), depth + 1)
            });
            match opened {
                Ok(frame) => stack.push(frame),
                // Replaced by a non-directory or removed meanwhile: nothing to walk.
                Err(Errno::ENOTDIR | Errno::ENOENT | Errno::ELOOP) => {}
                // Past the open-file limit (a tree deeper than it): what the session made
                // there is not kept unlooked-at.
                Err(Errno::EMFILE | Errno::ENFILE)
                    if lstat_at(raw, name.as_os_str()).is_ok_and(|st| since.precedes(&st)) =>
                {
                    self.report(
                        raw,
                        &top.path,
                        &name,
                        Severity::High,
                        review::too_deep_to_walk_reason(),
                    );
                }
                // Not to be listed even with its owner's rights given (another user's, an
                // immutable one): moved aside whole when this user can reach what lies below
                // it by name (as the sandbox could), else nothing below is reachable.
                Err(Errno::EACCES | Errno::EPERM) if !gives_up() && searchable(raw, &name) => {
                    self.report(
                        raw,
                        &top.path,
                        &name,
                        Severity::High,
                        review::unlisted_reason(),
                    );
                }
                Err(error) => self.unread.push(Unread {
                    path: top.path.join(&name),
                    holds: !matches!(error, Errno::EACCES | Errno::EPERM) || gives_up(),
                    error,
                }),
            }
        }
    }

    /// Hands `name` in `dirfd` (the directory `dir`) to `found`.
    fn report(
        &mut self,
        dirfd: RawFd,
        dir: &Path,
        name: &OsStr,
        severity: Severity,
        reason: String,
    ) {
        (self.found)(Found {
            dirfd,
            dir,
            name,
            severity,
            reason,
        });
    }

    /// Lists a directory the walk goes into and judges it when git would take it for a
    /// bare repository.
    fn enter(
        &mut self,
        fd: OwnedFd,
        restore: Option<u32>,
        new: bool,
        path: PathBuf,
        name: OsString,
        depth: usize,
    ) -> nix::Result<Frame> {
        let since = self.since;
        let list = match entries(&fd) {
            Ok(l) => l,
            Err(e) => {
                restore_mode(&fd, restore);
                return Err(e);
            }
        };
        let raw = fd.as_raw_fd();
        // A directory git's discovery takes for a bare repository (the top too: git looks
        // there when the main .git is no valid git dir): judged as a nested git dir.
        if review::bare_repo_shaped(|n| list.iter().any(|(x, _)| x == n)) {
            let hits = judge(raw, GitDirKind::Nested, true, Some(since))
                .into_iter()
                .map(|h| Hit {
                    reason: review::bare_repo_reason(&h.reason),
                    ..h
                })
                .collect();
            report_hits(raw, &path, hits, &mut *self.found);
        }
        Ok(Frame {
            fd,
            path,
            name,
            depth,
            new,
            restore,
            rest: list.into_iter(),
        })
    }
}

/// The `links` row that takes `name` in `dirfd`: a symlink made at or after `since` that
/// leads (through any chain) to a directory in or below one of the row's directories,
/// the first row in table order, unless the work tree (`top`) or one of the row's
/// covered directories lies nearer above the target than that directory. The link is
/// followed only to open its target as a path (`O_PATH`), nothing read through it.
fn link_rule(
    dirfd: RawFd,
    name: &OsStr,
    since: Since,
    top: Option<Ino>,
    links: &[LinkDirs],
) -> Option<review::LinkRule> {
    if (links.iter()).all(|l| l.dirs.is_empty() && l.rule.into != review::LinkInto::GitDirInTree) {
        return None;
    }
    let st = lstat_at(dirfd, name).ok()?;
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFLNK || !since.precedes(&st) {
        return None;
    }
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    // Dangling, or no directory: nothing.
    let fd = fcntl::openat(Some(dirfd), name, flags, Mode::empty()).ok()?;
    // SAFETY: openat just returned this descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let above = ancestors(&fd);
    let at = |dirs: &[Ino]| above.iter().position(|(i, _)| dirs.contains(i));
    let in_tree = top.and_then(|t| at(&[t]));
    links.iter().find_map(|l| {
        if l.rule.into == review::LinkInto::GitDirInTree {
            // A `.git` directory below the work tree's top, nearer than the top.
            let pos = above.iter().position(|(_, git)| *git)?;
            return in_tree.is_some_and(|t| pos < t).then_some(l.rule);
        }
        let pos = at(&l.dirs)?;
        let stop = [in_tree, at(&l.covered)].into_iter().flatten().min();
        stop.is_none_or(|s| pos < s).then_some(l.rule)
    })
}

/// The directory `fd` and every directory above it (going up by `..`), nearest first,
/// each with whether it is its parent's `.git`.
fn ancestors(fd: &OwnedFd) -> Vec<(Ino, bool)> {
    let mut out = Vec::new();
    let Ok(mut st) = stat::fstat(fd.as_raw_fd()) else {
        return out;
    };
    let mut cur = None::<OwnedFd>;
    for _ in 0..4096 {
        let at = cur.as_ref().map_or(fd.as_raw_fd(), |c| c.as_raw_fd());
        let Ok(parent) = open_dir(Some(at), "..") else {
            out.push((ino(&st), false));
            break;
        };
        let Ok(pst) = stat::fstat(parent.as_raw_fd()) else {
            out.push((ino(&st), false));
            break;
        };
        let git = lstat_at(parent.as_raw_fd(), ".git").is_ok_and(|g| ino(&g) == ino(&st));
        out.push((ino(&st), git));
        if ino(&pst) == ino(&st) {
            break; // the root
        }
        st = pst;
        cur = Some(parent);
    }
    out
}

/// The most of a file the review reads to judge it; a larger one is not judged, and so
/// moved aside (git would read it all).
pub const MAX_JUDGED: u64 = 1 << 20;

/// A file of a git dir, as read for judging.
enum Content {
    Missing,
    Bytes(Vec<u8>),
    /// Git would read it, the review cannot: why.
    Unjudged(&'static str),
}

/// Reads `name` in `dirfd` through its descriptor: a regular file only, never through a
/// symlink, at most [`MAX_JUDGED`] bytes.
fn read_at(dirfd: RawFd, name: &OsStr) -> Content {
    use std::io::Read;
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let fd = match retry_no_fd(|| fcntl::openat(Some(dirfd), name, flags, Mode::empty())) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Content::Missing,
        Err(Errno::ELOOP) => return Content::Unjudged("a symlink, which git follows"),
        Err(_) => return Content::Unjudged("it cannot be opened"),
    };
    // SAFETY: openat just returned this descriptor.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    match stat::fstat(f.as_raw_fd()) {
        Ok(st) if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG => {}
        _ => return Content::Unjudged("not a regular file"),
    }
    let mut out = Vec::new();
    if (&f).take(MAX_JUDGED + 1).read_to_end(&mut out).is_err() {
        return Content::Unjudged("it cannot be read");
    }
    if out.len() as u64 > MAX_JUDGED {
        return Content::Unjudged("larger than the review reads (1 MiB)");
    }
    Content::Bytes(out)
}

/// One finding in a git dir: the entry `name` in its subdirectory `sub` (`""`: the git
/// dir itself; `hooks`, `rebase-merge`, `sequencer`).
struct Hit {
    sub: &'static str,
    name: OsString,
    rel: &'static str,
    severity: Severity,
    reason: String,
}

/// Judges the git dir open as `fd`, of `kind`: each file `policy::git_dir::judged_files`
/// names for it, when changed at or after `since` (`None`: all of them), read through
/// its descriptor and handed to `policy::review::git_dir_judgement`.
fn judge(fd: RawFd, kind: GitDirKind, made: bool, since: Option<Since>) -> Vec<Hit> {
    let fresh = |dir: RawFd, name: &OsStr| since.is_none_or(|s| changed(dir, name, s));
    let mut hits = Vec::new();
    for rel in judged_files(kind, made) {
        let (sub, leaf) = rel.rsplit_once('/').unwrap_or(("", rel));
        let subfd = if sub.is_empty() {
            None
        } else {
            match open_dir(Some(fd), sub) {
                Ok(d) => Some(d),
                Err(Errno::ENOENT) => continue,
                Err(_) => {
                    if fresh(fd, OsStr::new(sub)) {
                        hits.push(Hit {
                            sub: "",
                            name: sub.into(),
                            rel,
                            severity: Severity::High,
                            reason: review::unjudged(
                                sub,
                                "not a directory git reads (a symlink it follows?)",
                            ),
                        });
                    }
                    continue;
                }
            }
        };
        let dfd = subfd.as_ref().map_or(fd, |d| d.as_raw_fd());
        if leaf.is_empty() {
            // hooks/: each entry; git runs any that is not a sample (or follows it).
            let list = subfd.as_ref().map(entries).and_then(Result::ok);
            for (n, _) in list.unwrap_or_default() {
                if !fresh(dfd, &n) {
                    continue;
                }
                let r = format!("{sub}/{}", n.to_string_lossy());
                if let Some((severity, reason)) = review::git_dir_judgement(kind, &r, b"") {
                    hits.push(Hit {
                        sub,
                        name: n,
                        rel,
                        severity,
                        reason,
                    });
                }
            }
            continue;
        }
        let leaf = OsStr::new(leaf);
        if !fresh(dfd, leaf) {
            continue;
        }
        let judged = match read_at(dfd, leaf) {
            Content::Missing => None,
            Content::Bytes(b) => review::git_dir_judgement(kind, rel, &b),
            Content::Unjudged(what) => Some((
                // As severe as the file would be with any content.
                review::git_dir_judgement(kind, rel, b"\0").map_or(Severity::High, |j| j.0),
                review::unjudged(rel, what),
            )),
        };
        if let Some((severity, reason)) = judged {
            hits.push(Hit {
                sub,
                name: leaf.to_os_string(),
                rel,
                severity,
                reason,
            });
        }
    }
    hits
}

/// Hands each hit over to be moved aside, `root` being the git dir open as `fd`.
fn report_hits(fd: RawFd, root: &Path, hits: Vec<Hit>, found: &mut dyn FnMut(Found<'_>)) {
    for h in hits {
        let sub = if h.sub.is_empty() {
            None
        } else {
            match open_dir(Some(fd), h.sub) {
                Ok(d) => Some(d),
                Err(_) => continue, // gone meanwhile
            }
        };
        let dir = if h.sub.is_empty() {
            root.to_path_buf()
        } else {
            root.join(h.sub)
        };
        found(Found {
            dirfd: sub.as_ref().map_or(fd, |d| d.as_raw_fd()),
            dir: &dir,
            name: &h.name,
            severity: h.severity,
            reason: h.reason,
        });
    }
}

/// A nested `.git` in the work tree: why it must be moved aside, or None. A directory is
/// judged as a nested repository's git dir (every file the table names when the `.git`
/// itself is new or was moved in, otherwise those changed during the session); a gitlink
/// file made during the session is judged through the git dir it names, unless that is
/// one of `judged_there` (the common dir's `modules/`, `worktrees/`: judged there), or
/// moved aside when it lies outside the work tree `top` (git there would work on another
/// repository); anything else new in its place (a symlink git would follow) is moved
/// aside. With its severity: as grave as the gravest finding.
fn nested_git(
    dirfd: RawFd,
    name: &OsStr,
    since: Since,
    judged_there: &[Ino],
    top: Option<Ino>,
) -> Option<(Severity, String)> {
    let st = lstat_at(dirfd, name).ok()?;
    let new = since.precedes(&st);
    let unjudged = |what: &str| (Severity::High, review::unjudged(".git", what));
    if is_dir(&st) {
        let Ok((fd, restore, _)) = open_dir_in(dirfd, name) else {
            return (new || !gives_up()).then(|| unjudged("it cannot be opened"));
        };
        let hits = judge(
            fd.as_raw_fd(),
            GitDirKind::Nested,
            true,
            (!new).then_some(since),
        );
        restore_mode(&fd, restore);
        // The gravest finding's reason (a core.fsmonitor the next git status runs).
        return hits
            .into_iter()
            .min_by_key(|h| h.severity != Severity::Critical)
            .map(|h| (h.severity, h.reason));
    }
    if !new {
        return None;
    }
    let bytes = match read_at(dirfd, name) {
        Content::Bytes(b) => b,
        Content::Missing => return None,
        Content::Unjudged(what) => return Some(unjudged(what)),
    };
    // What git does not read as a gitlink file makes git stop: nothing runs.
    let target = bytes.trim_ascii().strip_prefix(b"gitdir:")?.trim_ascii();
    let target = Path::new(OsStr::from_bytes(target));
    let gd = match open_path(dirfd, target) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ENOTDIR) => return None,
        Err(_) => {
            return Some((
                Severity::High,
                review::unjudged(
                    "the git dir its .git file names",
                    "it cannot be opened without following a symlink",
                ),
            ))
        }
    };
    if beneath(&gd, judged_there) {
        return None;
    }
    if top.is_some_and(|t| !beneath(&gd, &[t])) {
        return Some((Severity::High, review::GITLINK_OUTSIDE_WHY.to_string()));
    }
    let hits = judge(gd.as_raw_fd(), GitDirKind::Nested, true, None);
    hits.into_iter()
        .min_by_key(|h| h.severity != Severity::Critical)
        .map(|h| {
            let why = format!("the git dir its .git file names: {}", h.reason);
            (h.severity, why)
        })
}

/// Opens the directory `p` (relative to `dirfd` unless absolute) one component at a
/// time, never through a symlink (so a `..` is the real parent).
fn open_path(dirfd: RawFd, p: &Path) -> nix::Result<OwnedFd> {
    use std::path::Component;
    let mut cur = if p.is_absolute() {
        open_dir(None, "/")?
    } else {
        open_dir(Some(dirfd), ".")?
    };
    for c in p.components() {
        cur = match c {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => open_dir(Some(cur.as_raw_fd()), "..")?,
            Component::Normal(n) => open_dir(Some(cur.as_raw_fd()), n)?,
            Component::Prefix(_) => return Err(Errno::EINVAL),
        };
    }
    Ok(cur)
}

/// Whether the directory `fd` is one of `dirs` or below one (going up by `..`).
fn beneath(fd: &OwnedFd, dirs: &[Ino]) -> bool {
    ancestors(fd).iter().any(|(i, _)| dirs.contains(i))
}

/// Reviews one of the project's git dirs: the common dir (`linked`: false), which also
/// holds `worktrees/` and `modules/`, or a linked worktree's own. What the launch's mounts
/// could not cover is judged there (a new commondir, todo lists with exec lines); the git
/// dirs made inside it (worktrees, modules) are judged whole.
pub fn git_dir(
    root: &Path,
    linked: bool,
    since: Since,
    found: &mut dyn FnMut(Found<'_>),
    unread: &mut Vec<Unread>,
) {
    let (fd, restore) = match open_top(root) {
        Ok((fd, restore, _)) => (fd, restore),
        Err(error) => {
            unread.push(Unread {
                path: root.to_path_buf(),
                holds: error != Errno::ENOENT,
                error,
            });
            return;
        }
    };
    git_dir_in(&fd, root, linked, since, found);
    restore_mode(&fd, restore);
}

fn git_dir_in(
    fd: &OwnedFd,
    root: &Path,
    linked: bool,
    since: Since,
    found: &mut dyn FnMut(Found<'_>),
) {
    let raw = fd.as_raw_fd();
    let kind = if linked {
        GitDirKind::Linked
    } else {
        GitDirKind::Common
    };
    report_hits(raw, root, judge(raw, kind, false, Some(since)), found);
    if linked {
        return;
    }
    if let Ok(wt) = open_dir(Some(raw), "worktrees") {
        let wt_path = root.join("worktrees");
        let w = wt.as_raw_fd();
        for (id, _) in entries(&wt).unwrap_or_default() {
            if !changed(w, &id, since) {
                continue;
            }
            let Ok(d) = open_dir(Some(w), id.as_os_str()) else {
                continue;
            };
            let hits = judge(d.as_raw_fd(), GitDirKind::Linked, true, Some(since));
            // A commondir leading elsewhere: the whole entry goes (git in that worktree
            // would read another config and hooks).
            if let Some(h) = hits.iter().find(|h| h.rel == "commondir") {
                let reason = format!("a linked worktree's git dir: {}", h.reason);
                drop(d);
                found(Found {
                    dirfd: w,
                    dir: &wt_path,
                    name: &id,
                    severity: h.severity,
                    reason,
                });
                continue;
            }
            report_hits(d.as_raw_fd(), &wt_path.join(&id), hits, found);
        }
    }
    if let Ok(m) = open_dir(Some(raw), "modules") {
        modules(m, root.join("modules"), 0, since, found);
    }
}

/// `modules/<name>/...`: each submodule's git dir (a directory with a `HEAD` or a
/// `config`; a name with slashes is a path of directories) judged as a module, and the modules nested in it.
fn modules(
    fd: OwnedFd,
    path: PathBuf,
    depth: usize,
    since: Since,
    found: &mut dyn FnMut(Found<'_>),
) {
    for (name, kind) in entries(&fd).unwrap_or_default() {
        if kind.is_some_and(|k| k != Type::Directory) {
            continue;
        }
        // Past the depth looked at: what changed there is not kept unjudged (a .git file
        // in the work tree can name a git dir at any depth).
        if depth >= MODULES_DEPTH {
            if changed(fd.as_raw_fd(), &name, since) {
                found(Found {
                    dirfd: fd.as_raw_fd(),
                    dir: &path,
                    name: &name,
                    severity: Severity::High,
                    reason: review::too_deep_reason(MODULES_DEPTH),
                });
            }
            continue;
        }
        let Ok(module) = open_dir(Some(fd.as_raw_fd()), name.as_os_str()) else {
            continue;
        };
        let mpath = path.join(&name);
        let git_dir = ["HEAD", "config"]
            .iter()
            .any(|n| lstat_at(module.as_raw_fd(), *n).is_ok());
        if !git_dir {
            modules(module, mpath, depth + 1, since, found);
            continue;
        }
        let hits = judge(module.as_raw_fd(), GitDirKind::Module, true, Some(since));
        report_hits(module.as_raw_fd(), &mpath, hits, found);
        if let Ok(sub) = open_dir(Some(module.as_raw_fd()), "modules") {
            modules(sub, mpath.join("modules"), depth + 1, since, found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_waits_for_descriptors_and_gives_up_on_other_errors() {
        let mut n = 0;
        let r = retry_no_fd(|| {
            n += 1;
            match n {
                1 => Err(Errno::EMFILE),
                2 => Err(Errno::ENFILE),
                _ => Ok(n),
            }
        });
        assert_eq!(r, Ok(3));
        let mut n = 0;
        let r: nix::Result<()> = retry_no_fd(|| {
            n += 1;
            Err(Errno::EACCES)
        });
        assert_eq!((r, n), (Err(Errno::EACCES), 1));
    }

    /// `levels` directories `d/d/d/...` under `top`, made by descriptor (no path is
    /// that long).
    fn chain(top: &Path, levels: usize) {
        let mut fd = open_dir(None, top).unwrap();
        for _ in 0..levels {
            nix::sys::stat::mkdirat(Some(fd.as_raw_fd()), "d", Mode::from_bits_truncate(0o700))
                .unwrap();
            fd = open_dir(Some(fd.as_raw_fd()), "d").unwrap();
        }
        nix::fcntl::openat(
            Some(fd.as_raw_fd()),
            ".mcp.json",
            OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .unwrap();
    }

    /// The names the walk of `top` hands over, with `links` as the review gives them.
    fn found_in(top: &Path, links: &[LinkDirs]) -> Vec<(String, String)> {
        let mut found = Vec::new();
        let mut unread = Vec::new();
        work_tree(
            top,
            Since { sec: 0, nsec: 0 },
            &[],
            links,
            &mut |f| found.push((f.name.to_string_lossy().into_owned(), f.reason)),
            &mut unread,
        );
        assert!(unread.is_empty());
        found.sort();
        found
    }

    /// A new symlink leading into a directory the launch binds read-write outside the
    /// project is handed over with its row's reason; one into the project (also when the
    /// project lies inside that directory), into a read-only place, or dangling is not.
    /// The control: without the row, the same links are all kept.
    #[test]
    fn symlinks_into_writable_dirs_outside_the_project() {
        use std::os::unix::fs::symlink;
        let t = tempfile::tempdir().unwrap();
        let rw = t.path().join("rw");
        let proj = rw.join("proj");
        for d in [proj.join("sub"), rw.join("other/deep"), t.path().join("ro")] {
            std::fs::create_dir_all(d).unwrap();
        }
        symlink("sub", proj.join("to-sub")).unwrap();
        symlink(proj.join("sub"), proj.join("to-sub-abs")).unwrap();
        symlink("../proj/sub", proj.join("sub/via-parent")).unwrap();
        symlink("../other/deep", proj.join("to-rw")).unwrap();
        symlink(rw.join("other"), proj.join("sub/to-rw-abs")).unwrap();
        symlink("to-rw", proj.join("chain")).unwrap();
        symlink(t.path().join("ro"), proj.join("to-ro")).unwrap();
        symlink("../missing", proj.join("dangling")).unwrap();
        // A directory of the rw one that a later read-only mount covers inside.
        std::fs::create_dir_all(rw.join("shown/deep")).unwrap();
        symlink(rw.join("shown/deep"), proj.join("to-covered")).unwrap();
        let writable = |dirs: Vec<Ino>, covered: Vec<Ino>| {
            let rule = *review::LINK_RULES
                .iter()
                .find(|r| r.into == review::LinkInto::WritableOutside)
                .unwrap();
            vec![LinkDirs {
                rule,
                dirs,
                covered,
            }]
        };
        let (rw_ino, shown) = (dir_ino(&rw).unwrap(), dir_ino(&rw.join("shown")).unwrap());
        let found = found_in(&proj, &writable(vec![rw_ino], vec![shown]));
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["chain", "to-rw", "to-rw-abs"]);
        assert!(found
            .iter()
            .all(|(_, why)| why == review::INTO_WRITABLE_WHY));
        // The controls: not known as covered, that link is taken too; no writable
        // directory known, nothing is.
        let found = found_in(&proj, &writable(vec![rw_ino], Vec::new()));
        assert!(found.iter().any(|(n, _)| n == "to-covered"));
        assert!(found_in(&proj, &writable(Vec::new(), Vec::new())).is_empty());
    }

    /// A new symlink leading into a `.git` directory below the work tree's top (the
    /// project's, a nested repository's) is taken with its row's reason; one into another
    /// repository's `.git` outside the project, or elsewhere in the project, is not. The
    /// control: without the row, none is.
    #[test]
    fn symlinks_into_git_dirs_of_the_work_tree() {
        use std::os::unix::fs::symlink;
        let t = tempfile::tempdir().unwrap();
        let proj = t.path().join("proj");
        for d in [
            proj.join(".git/x"),
            proj.join("vendor/lib/.git/y"),
            proj.join("sub"),
            t.path().join("other/.git/z"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        symlink(".git/x", proj.join("to-git")).unwrap();
        symlink(proj.join(".git"), proj.join("sub/to-git-top")).unwrap();
        symlink("../vendor/lib/.git/y", proj.join("sub/to-nested")).unwrap();
        symlink(t.path().join("other/.git/z"), proj.join("to-other")).unwrap();
        symlink("sub", proj.join("to-sub")).unwrap();
        let row = |rows: &[review::LinkRule]| -> Vec<LinkDirs> {
            (rows.iter())
                .filter(|r| r.into == review::LinkInto::GitDirInTree)
                .map(|r| LinkDirs {
                    rule: *r,
                    dirs: Vec::new(),
                    covered: Vec::new(),
                })
                .collect()
        };
        let found = found_in(&proj, &row(review::LINK_RULES));
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["to-git", "to-git-top", "to-nested"]);
        assert!(found.iter().all(|(_, why)| why == review::INTO_GIT_DIR_WHY));
        assert!(found_in(&proj, &row(&[])).is_empty());
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn set_mode(p: &Path, m: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    /// Directories the agent made unlistable (`0111`, `0000`, `0444`) or unwritable
    /// (`0555`): the walk makes its way in (as the ordinary user; root needs not) and finds
    /// what lies there, a staged nested repository's `core.fsmonitor` as CRITICAL, and puts
    /// each mode back. Near misses there stay. (The control, the same walk giving up, is
    /// the integration test's: `CLAUDEBOX_TEST_REVIEW_GIVES_UP`.)
    #[test]
    fn directories_made_unlistable_are_walked_and_their_modes_put_back() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("project");
        let nested = top.join("x111/nested");
        std::fs::create_dir_all(&nested).unwrap();
        let git = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .arg("-C")
                .arg(&nested)
                .args(args)
                .output()
                .unwrap()
                .status
                .success();
            assert!(ok, "{args:?}");
        };
        git(&["init", "-q"]);
        git(&["config", "core.fsmonitor", "touch /tmp/never"]);
        for (d, f) in [
            ("x000/.claude", "settings.json"),
            ("x444", ".mcp.json"),
            ("x555", ".envrc"),
            ("x555", "notes.txt"),
            ("x111/deep", "README"),
        ] {
            std::fs::create_dir_all(top.join(d)).unwrap();
            std::fs::write(top.join(d).join(f), "x").unwrap();
        }
        let modes = [
            ("x111", 0o111),
            ("x000", 0o000),
            ("x444", 0o444),
            ("x555", 0o555),
        ];
        for (d, m) in modes {
            set_mode(&top.join(d), m);
        }
        let mut found = Vec::new();
        let mut unread = Vec::new();
        work_tree(
            &top,
            Since { sec: 0, nsec: 0 },
            &[],
            &[],
            &mut |f| {
                let rel = f.dir.join(f.name);
                let rel = rel
                    .strip_prefix(&top)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                found.push((rel, f.severity));
            },
            &mut unread,
        );
        for (d, m) in modes {
            assert_eq!(mode(&top.join(d)), m, "{d}");
            set_mode(&top.join(d), 0o755);
        }
        assert!(
            unread.is_empty(),
            "{:?}",
            unread.iter().map(|u| &u.path).collect::<Vec<_>>()
        );
        found.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            found,
            [
                ("x000/.claude/settings.json".into(), Severity::High),
                ("x111/nested/.git".into(), Severity::Critical),
                ("x444/.mcp.json".into(), Severity::High),
                ("x555/.envrc".into(), Severity::High),
            ]
        );
    }

    /// A nested `.git` file made in the session naming a git dir outside the project is
    /// taken (measured, git 2.47: `git log` and `git commit` there worked on the other
    /// repository); near misses: one naming a benign git dir inside the project, one
    /// naming nothing (git stops), a `.git` directory with a benign config.
    #[test]
    fn a_gitlink_naming_a_git_dir_outside_the_project() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("project");
        let other = t.path().join("other");
        for d in [
            top.join("vend"),
            top.join("inside/.git"),
            top.join("near"),
            top.join("gone"),
            top.join("plain/.git"),
            other.join(".git"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        let gitfile = |at: &str, to: &Path| {
            let line = format!("gitdir: {}\n", to.display());
            std::fs::write(top.join(at).join(".git"), line).unwrap();
        };
        gitfile("vend", &other.join(".git"));
        gitfile("near", &top.join("inside/.git"));
        gitfile("gone", &t.path().join("missing/.git"));
        let found = found_in(&top, &[]);
        assert_eq!(
            found,
            [(
                ".git".to_string(),
                review::nested_reason(review::GITLINK_OUTSIDE_WHY)
            )]
        );
    }

    /// A chain of 30,000 directories (an agent's, in the project): the review finds the
    /// directory at the bound and hands it over to be moved aside whole, unwalked (the
    /// recursive walk overflowed the stack at about 5,400 levels in a debug build, and
    /// aborted the launch's review and every later `--list`).
    #[test]
    fn a_chain_past_the_bound_is_named_not_walked() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("project");
        std::fs::create_dir(&top).unwrap();
        chain(&top, 30_000);
        let mut found = Vec::new();
        let mut unread = Vec::new();
        work_tree(
            &top,
            Since { sec: 0, nsec: 0 },
            &[],
            &[],
            &mut |f| {
                found.push((f.dir.components().count(), f.reason));
            },
            &mut unread,
        );
        assert!(unread.is_empty(), "{}", unread.len());
        assert_eq!(found.len(), 1, "the chain, once, at the bound");
        assert_eq!(
            found[0].0,
            top.components().count() + review::MAX_WALK_DEPTH - 1
        );
        assert_eq!(found[0].1, review::too_deep_to_walk_reason());
        // std's remove_dir_all (the temporary dir's) is recursive: beneath's is not.
        crate::state::beneath::Dir::open(&top)
            .unwrap()
            .remove_all(Path::new("d"))
            .unwrap();
    }
}
