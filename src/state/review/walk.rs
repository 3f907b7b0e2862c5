//! The exit review's walk: every directory of the work tree read once by descriptor
//! (`openat` with `O_NOFOLLOW`, so no symlink the agent planted is followed), and only the
//! names `policy::review` has a rule for looked at (`fstatat` without following), then the
//! project's git dirs' code-bearing files.
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

use crate::policy::review::{self, GitRow, Rule, Severity};

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
    pub reason: &'static str,
}

/// What the walk could not look at (a directory it could not open): reported, never
/// silently skipped.
pub struct Unread {
    pub path: PathBuf,
    pub error: Errno,
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opens `name` in `dirfd` as a directory, never through a symlink.
pub fn open_dir(dirfd: Option<RawFd>, name: &(impl nix::NixPath + ?Sized)) -> nix::Result<OwnedFd> {
    let fd = fcntl::openat(dirfd, name, DIR_FLAGS, Mode::empty())?;
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
/// `since`. Never follows a symlink; an unreadable directory counts as changed.
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
    list.iter().any(|(n, _)| changed(fd.as_raw_fd(), n, since))
}

/// Walks the work tree at `root` (its top-level `.claude`, a scratch directory, and
/// `.git`, whose git dir is reviewed by [`git_dir`], skipped) and calls `found` for each
/// entry a rule matches that changed at or after `since`. Entries are handed over before
/// the walk goes on, so `found` may move them away: a matched entry is never descended
/// into.
pub fn work_tree(
    root: &Path,
    since: Since,
    found: &mut dyn FnMut(Found<'_>),
    unread: &mut Vec<Unread>,
) {
    match open_dir(None, root) {
        Ok(fd) => walk(fd, root.to_path_buf(), 0, false, since, found, unread),
        Err(error) => unread.push(Unread {
            path: root.to_path_buf(),
            error,
        }),
    }
}

#[allow(clippy::too_many_arguments)]
fn walk(
    fd: OwnedFd,
    path: PathBuf,
    depth: usize,
    in_claude_dir: bool,
    since: Since,
    found: &mut dyn FnMut(Found<'_>),
    unread: &mut Vec<Unread>,
) {
    let list = match entries(&fd) {
        Ok(l) => l,
        Err(error) => {
            unread.push(Unread { path, error });
            return;
        }
    };
    let raw = fd.as_raw_fd();
    // A `.claude` directory that is itself new or renamed here makes its settings files
    // count as new, whatever their own ctime (a whole old directory moved into place).
    let claude_dir_new = in_claude_dir && stat::fstat(raw).is_ok_and(|st| since.precedes(&st));
    for (name, kind) in list {
        if depth == 0 && (name == ".git" || review::is_claude_dir(&name)) {
            continue;
        }
        if let Some(rule) = review::work_tree_rule(&name, depth, in_claude_dir) {
            let hit = match rule.pattern {
                review::Pattern::NestedGit => nested_git_changed(raw, &name, since),
                review::Pattern::InClaudeDir(_) => claude_dir_new || changed(raw, &name, since),
                _ => changed(raw, &name, since),
            };
            if hit {
                report(raw, &path, &name, &rule, found);
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
            continue;
        }
        match open_dir(Some(raw), name.as_os_str()) {
            Ok(child) => walk(
                child,
                path.join(&name),
                depth + 1,
                review::is_claude_dir(&name),
                since,
                found,
                unread,
            ),
            // Replaced by a non-directory or removed meanwhile: nothing to walk.
            Err(Errno::ENOTDIR | Errno::ENOENT | Errno::ELOOP) => {}
            Err(error) => unread.push(Unread {
                path: path.join(&name),
                error,
            }),
        }
    }
}

fn report(raw: RawFd, dir: &Path, name: &OsStr, rule: &Rule, found: &mut dyn FnMut(Found<'_>)) {
    found(Found {
        dirfd: raw,
        dir,
        name,
        severity: rule.severity,
        reason: rule.reason,
    });
}

/// The files of a nested repository git runs code from: a new gitlink file, or in a
/// `.git` directory its config, config.worktree, commondir or hooks.
fn nested_git_changed(dirfd: RawFd, name: &OsStr, since: Since) -> bool {
    let Ok(st) = lstat_at(dirfd, name) else {
        return false;
    };
    if !is_dir(&st) {
        return since.precedes(&st);
    }
    let Ok(fd) = open_dir(Some(dirfd), name) else {
        return true;
    };
    ["config", "config.worktree", "commondir", "hooks"]
        .iter()
        .any(|n| changed(fd.as_raw_fd(), OsStr::new(n), since))
}

/// Reviews one of the project's git dirs (`main`: the common dir, which holds
/// `worktrees/` and `modules/`) through `policy::review::git_dir_rule`, the one question
/// asked about git dirs. `common` is the common dir's canonical path, which a linked
/// worktree's `commondir` must lead back to.
pub fn git_dir(
    root: &Path,
    main: bool,
    common: &Path,
    since: Since,
    found: &mut dyn FnMut(Found<'_>),
    unread: &mut Vec<Unread>,
) {
    let fd = match open_dir(None, root) {
        Ok(fd) => fd,
        Err(error) => {
            unread.push(Unread {
                path: root.to_path_buf(),
                error,
            });
            return;
        }
    };
    let raw = fd.as_raw_fd();
    for top in ["commondir", "config.worktree"] {
        let rel = [OsStr::new(top)];
        if let Some(GitRow::Changed(sev, why)) = review::git_dir_rule(&rel, main) {
            if changed(raw, rel[0], since) {
                found(Found {
                    dirfd: raw,
                    dir: root,
                    name: rel[0],
                    severity: sev,
                    reason: why,
                });
            }
        }
    }
    if !main {
        return;
    }
    if let Ok(wt) = open_dir(Some(raw), "worktrees") {
        let wt_path = root.join("worktrees");
        for (id, _) in entries(&wt).unwrap_or_default() {
            let w = wt.as_raw_fd();
            if !changed(w, &id, since) {
                continue;
            }
            let rel = [OsStr::new("worktrees"), id.as_os_str()];
            let leads_home = leads_to(&wt_path.join(&id), common);
            match review::git_dir_rule(&rel, true) {
                Some(GitRow::Worktree(why)) if !leads_home => found(Found {
                    dirfd: w,
                    dir: &wt_path,
                    name: &id,
                    severity: Severity::High,
                    reason: why,
                }),
                _ => {
                    let cw = [rel[0], rel[1], OsStr::new("config.worktree")];
                    if let (Some(GitRow::Changed(sev, why)), Ok(d)) = (
                        review::git_dir_rule(&cw, true),
                        open_dir(Some(w), id.as_os_str()),
                    ) {
                        if changed(d.as_raw_fd(), cw[2], since) {
                            found(Found {
                                dirfd: d.as_raw_fd(),
                                dir: &wt_path.join(&id),
                                name: cw[2],
                                severity: sev,
                                reason: why,
                            });
                        }
                    }
                }
            }
        }
    }
    if let Ok(m) = open_dir(Some(raw), "modules") {
        modules(
            m,
            root.join("modules"),
            &mut vec![OsString::from("modules")],
            since,
            found,
        );
    }
}

/// `modules/<name>/...`: each module's config and hooks, and modules nested in it.
fn modules(
    fd: OwnedFd,
    path: PathBuf,
    rel: &mut Vec<OsString>,
    since: Since,
    found: &mut dyn FnMut(Found<'_>),
) {
    for (name, kind) in entries(&fd).unwrap_or_default() {
        if kind.is_some_and(|k| k != Type::Directory) || rel.len() > 64 {
            continue;
        }
        let Ok(module) = open_dir(Some(fd.as_raw_fd()), name.as_os_str()) else {
            continue;
        };
        let mpath = path.join(&name);
        rel.push(name);
        for leaf in ["config", "hooks"] {
            let mut r: Vec<&OsStr> = rel.iter().map(|s| s.as_os_str()).collect();
            r.push(OsStr::new(leaf));
            if let Some(GitRow::Changed(sev, why)) = review::git_dir_rule(&r, true) {
                if changed(module.as_raw_fd(), OsStr::new(leaf), since) {
                    found(Found {
                        dirfd: module.as_raw_fd(),
                        dir: &mpath,
                        name: OsStr::new(leaf),
                        severity: sev,
                        reason: why,
                    });
                }
            }
        }
        if let Ok(sub) = open_dir(Some(module.as_raw_fd()), "modules") {
            rel.push("modules".into());
            modules(sub, mpath.join("modules"), rel, since, found);
            rel.pop();
        }
        rel.pop();
    }
}

/// Whether the linked worktree's git dir at `wt` names `common` as its common dir (a
/// missing or unreadable `commondir` does not).
fn leads_to(wt: &Path, common: &Path) -> bool {
    let Ok(bytes) = read_small(wt, "commondir") else {
        return false;
    };
    let rel = Path::new(OsStr::from_bytes(bytes.trim_ascii()));
    std::fs::canonicalize(wt.join(rel)).is_ok_and(|p| p == common)
}

fn read_small(dir: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let d = open_dir(None, dir)?;
    let fd = fcntl::openat(
        Some(d.as_raw_fd()),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: openat just returned this descriptor.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut out = Vec::new();
    f.take(4096).read_to_end(&mut out)?;
    Ok(out)
}
