//! Bind sources opened at the launch, so that bwrap mounts the inode claudebox checked and
//! never resolves a name again (`--bind-fd` / `--ro-bind-fd`), and the descriptors the
//! launch lets cross into bwrap.
//!
//! Why: bwrap resolves a `--bind SRC` by name when it mounts, milliseconds after
//! claudebox looked at SRC. Another sandbox of the same project can swap a path it can
//! write (a protected `.vscode` it created, `.git/worktrees`, ...) between a directory and
//! a symlink to the home directory in that window, and the next launch would mount the
//! real home. Here each source is opened once (`O_PATH|O_NOFOLLOW`), checked through that
//! descriptor, and bwrap mounts the descriptor: it reaches the file through
//! `/proc/self/fd/N`, a link the kernel follows to the open file itself (bwrap also
//! compares the mounted inode with the descriptor's afterwards).
//!
//! The check of one source `S`, against the places an agent can write (`areas`: the
//! project, its git dirs, `~/.claude`, the conversations, `rw` extras):
//! - a symlink at `S` is refused when `S` lies inside an area (the agent may have made
//!   it); elsewhere (a home-manager `~/.gitconfig`) it is followed, as bwrap did;
//! - the path the descriptor really reached must be `S` itself when either lies inside an
//!   area: a symlink swapped in anywhere on the way is caught;
//! - a read-write directory mount must reach a directory, a file mount a non-directory.
//!
//! Pure policy stays in `plan`; this is the edge.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use nix::libc;

use crate::policy::mount::MountKind;
use crate::policy::plan::{is_bind, Plan};
use crate::policy::render::Bind;

/// The opened sources of one plan, one entry per mount of the plan.
pub struct Opened {
    entries: Vec<SourceEntry>,
}

enum SourceEntry {
    Other,
    Skip,
    /// The descriptor, and the path it reached when opened.
    Fd(OwnedFd, PathBuf),
}

impl Opened {
    /// The table the renderer takes.
    pub fn table(&self) -> Vec<Bind> {
        self.entries
            .iter()
            .map(|e| match e {
                SourceEntry::Other => Bind::Other,
                SourceEntry::Skip => Bind::Skip,
                SourceEntry::Fd(fd, _) => Bind::Fd(fd.as_raw_fd()),
            })
            .collect()
    }

    /// The descriptors bwrap must inherit.
    pub fn fds(&self) -> Vec<RawFd> {
        self.entries
            .iter()
            .filter_map(|e| match e {
                SourceEntry::Fd(fd, _) => Some(fd.as_raw_fd()),
                _ => None,
            })
            .collect()
    }

    /// The sources the host replaced since they were opened (a host claude rewrites
    /// `.credentials.json` and `settings.json` by renaming a new file over them): their
    /// path now names another inode, or none. bwrap cannot mount such a descriptor (it
    /// goes through `/proc/self/fd/N` by name).
    pub fn replaced(&self) -> Vec<&Path> {
        use std::os::unix::fs::MetadataExt;
        self.entries
            .iter()
            .filter_map(|e| match e {
                SourceEntry::Fd(fd, path) => {
                    let held = nix::sys::stat::fstat(fd.as_raw_fd()).ok()?;
                    let now = std::fs::symlink_metadata(path).ok();
                    let same = now.is_some_and(|m| {
                        (m.dev(), m.ino()) == (held.st_dev as u64, held.st_ino as u64)
                    });
                    (!same).then_some(path.as_path())
                }
                _ => None,
            })
            .collect()
    }

    /// The source bound from descriptor `fd`.
    pub fn source_of(&self, fd: RawFd) -> Option<&Path> {
        self.entries.iter().find_map(|e| match e {
            SourceEntry::Fd(f, path) if f.as_raw_fd() == fd => Some(path.as_path()),
            _ => None,
        })
    }
}

/// Opens and checks every bind source of `plan`. `areas` are the canonical directories
/// the sandbox (or another sandbox of this project) can write.
pub fn open(plan: &Plan, areas: &[PathBuf]) -> Result<Opened> {
    let mut entries = Vec::with_capacity(plan.mounts.len());
    for m in &plan.mounts {
        let (true, Some(src)) = (is_bind(&m.kind), &m.source) else {
            entries.push(SourceEntry::Other);
            continue;
        };
        match open_one(&with_real_parent(src), &m.kind, areas)? {
            Some((fd, real)) => entries.push(SourceEntry::Fd(fd, real)),
            None => entries.push(SourceEntry::Skip),
        }
    }
    Ok(Opened { entries })
}

/// `src` with its directory's symlinks resolved (the name itself left as it is): a state
/// home or a home reached through a symlink of the user's (`CLAUDEBOX_HOME`, Silverblue's
/// `/home` -> `/var/home`) names a source inside an area by another path than the area's
/// canonical one, and the checks below compare paths. What the resolution finds is checked
/// as before: the descriptor must reach exactly this path when it lies in an area, so a
/// directory swapped for a symlink between this look and the open is refused. The source
/// as given where its directory cannot be resolved (a missing optional one).
fn with_real_parent(src: &Path) -> PathBuf {
    match (src.parent(), src.file_name()) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or_else(|_| src.to_path_buf()),
        _ => src.to_path_buf(),
    }
}

fn show(p: &Path) -> String {
    crate::policy::escape::shown(p)
}

/// `p` lies inside (or is) one of `areas`.
fn in_area<'a>(p: &Path, areas: &'a [PathBuf]) -> Option<&'a PathBuf> {
    areas.iter().find(|a| p.starts_with(a))
}

fn open_path(path: &Path, follow: bool, dir: bool) -> std::io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    if dir {
        flags |= libc::O_DIRECTORY;
    }
    // SAFETY: a valid C string; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: open just returned this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The path the descriptor reached, as the kernel records it.
pub fn reached(fd: RawFd) -> std::io::Result<PathBuf> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    Ok(PathBuf::from(OsString::from_vec(
        link.into_os_string().into_vec(),
    )))
}

/// The descriptor, and the path it reached.
fn open_one(src: &Path, kind: &MountKind, areas: &[PathBuf]) -> Result<Option<(OwnedFd, PathBuf)>> {
    // A file the host replaced between the open and the look at where it was reached (a
    // host claude renames a new `.credentials.json` over the old one) reads `SRC (deleted)`:
    // opened again.
    for _ in 1..OPEN_TRIES {
        match open_once(src, kind, areas)? {
            Some((_, real)) if real != src && same_or_replaced(&real, src) => continue,
            found => return Ok(found),
        }
    }
    match open_once(src, kind, areas)? {
        Some((_, real)) if real != src && same_or_replaced(&real, src) => {
            bail!(crate::policy::error::Fixable::new(
                format!(
                    "{} was replaced on the host while the sandbox started, {OPEN_TRIES} times in \
                     a row (a claude running on the host saves it by renaming a new file over it)",
                    show(src)
                ),
                "launch again once the host's claude is idle",
            )
            .at(src))
        }
        found => Ok(found),
    }
}

/// How many times a source replaced right after its open is opened again.
const OPEN_TRIES: u32 = 5;

/// `reached` is `path`, or `path` whose file has since been replaced (unlinked by a rename
/// over it): the kernel then names it `PATH (deleted)`.
pub fn same_or_replaced(reached: &Path, path: &Path) -> bool {
    let mut deleted = path.as_os_str().to_owned();
    deleted.push(" (deleted)");
    reached == path || reached.as_os_str() == deleted
}

fn open_once(
    src: &Path,
    kind: &MountKind,
    areas: &[PathBuf],
) -> Result<Option<(OwnedFd, PathBuf)>> {
    let want_dir = *kind == MountKind::Rw;
    let changed = |what: String| {
        anyhow::Error::new(
            crate::policy::error::Fixable::new(
                format!(
                    "{} {what}, inside {} which a sandbox can write: another sandbox of this \
                     project may be tampering with it",
                    show(src),
                    show(in_area(src, areas).map(PathBuf::as_path).unwrap_or(src)),
                ),
                "refusing to mount it (look at that path, then launch again)",
            )
            .at(src),
        )
    };
    let fd = match open_path(src, false, false) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && *kind == MountKind::RoTry => {
            return Ok(None)
        }
        Err(e) => bail!("cannot open {} to mount it: {e}", show(src)),
    };
    let mut meta = File::from(fd.try_clone()?).metadata()?;
    let mut fd = fd;
    if meta.file_type().is_symlink() {
        if in_area(src, areas).is_some() {
            return Err(changed("is a symlink".into()));
        }
        // A symlink of the host's own (home-manager dotfiles): followed, as bwrap did.
        fd = match open_path(src, true, false) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && *kind == MountKind::RoTry => {
                return Ok(None)
            }
            Err(e) => bail!("cannot open {} to mount it: {e}", show(src)),
        };
        meta = File::from(fd.try_clone()?).metadata()?;
    }
    let real = reached(fd.as_raw_fd())?;
    if !same_or_replaced(&real, src)
        && (in_area(src, areas).is_some() || strictly_in_area(&real, areas))
    {
        // An optional source renamed away since it was listed (a host claude's temporary
        // file, renamed over the file it saves, and perhaps already made again under the
        // same name): as if it had been missing at the open, which skips it. A sandbox
        // that renames one away gains nothing a missing one would not give.
        // (Followed, as the open was: a host symlink still leading to the same file is
        // the case below, refused.)
        if *kind == MountKind::RoTry
            && std::fs::metadata(src).map_or_else(
                |e| e.kind() == std::io::ErrorKind::NotFound,
                |now| {
                    use std::os::unix::fs::MetadataExt;
                    (now.dev(), now.ino()) != (meta.dev(), meta.ino())
                },
            )
        {
            return Ok(None);
        }
        return Err(changed(format!("now leads to {}", show(&real))));
    }
    if want_dir && !meta.is_dir() {
        return Err(changed("is no longer a directory".into()));
    }
    if *kind == MountKind::File && meta.is_dir() {
        return Err(changed("is a directory where a file was expected".into()));
    }
    Ok(Some((fd, real)))
}

/// `p` lies strictly below one of `areas` (an area's own root is named in a directory the
/// sandbox cannot write).
fn strictly_in_area(p: &Path, areas: &[PathBuf]) -> bool {
    areas.iter().any(|a| p.starts_with(a) && p != a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_swapped_source_is_refused_and_a_real_one_reached() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let proj = root.join("proj");
        std::fs::create_dir_all(proj.join("real/hooks")).unwrap();
        std::fs::create_dir_all(root.join("home")).unwrap();
        std::os::unix::fs::symlink(root.join("home"), proj.join("link")).unwrap();
        let areas = vec![proj.clone()];
        let ok = open_one(&proj.join("real/hooks"), &MountKind::Ro, &areas).unwrap();
        let (fd, real) = ok.unwrap();
        assert_eq!(reached(fd.as_raw_fd()).unwrap(), proj.join("real/hooks"));
        assert_eq!(real, proj.join("real/hooks"));
        for bad in ["link", "link/x"] {
            std::fs::create_dir_all(root.join("home/x")).unwrap();
            let e = open_one(&proj.join(bad), &MountKind::Rw, &areas)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("tampering"), "{bad}: {e}");
        }
        // Outside the areas, a host symlink is followed unless it leads into one.
        std::os::unix::fs::symlink(root.join("home"), root.join("dotfile")).unwrap();
        assert!(open_one(&root.join("dotfile"), &MountKind::Ro, &areas).is_ok());
        std::os::unix::fs::symlink(proj.join("real/hooks"), root.join("into")).unwrap();
        assert!(open_one(&root.join("into"), &MountKind::Ro, &areas).is_err());
        // A missing optional source is skipped; a missing required one refused.
        assert!(open_one(&root.join("none"), &MountKind::RoTry, &areas)
            .unwrap()
            .is_none());
        assert!(open_one(&root.join("none"), &MountKind::Ro, &areas).is_err());
    }
}
