//! Worktrees a sandbox made outside the project that are gone at its exit: `git worktree
//! add ../x` from a project directly in the home (or /tmp) makes `x` in the sandbox's
//! scratch home, discarded at exit, while the entry in the project's git dir stays (the
//! other places around the project are read-only inside: `policy::plan`'s scratch-ro). The
//! launch names each at exit. Read by descriptor beneath the git dir's parent, no symlink
//! followed (a sandbox of the project may still write there).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::state::beneath::{self, Dir};

/// The worktrees whose entry in `common_dir/worktrees/` changed since `since` and whose
/// directory does not exist on the host. Empty when anything cannot be read.
pub fn lost(common_dir: &Path, since: SystemTime) -> Vec<PathBuf> {
    let (Some(parent), Some(name)) = (common_dir.parent(), common_dir.file_name()) else {
        return Vec::new();
    };
    let Ok(git) = Dir::open(parent).and_then(|p| p.sub(Path::new(name))) else {
        return Vec::new();
    };
    let Ok(entries) = git.entries(Path::new("worktrees")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (entry, kind) in entries {
        let rel = Path::new("worktrees").join(&entry);
        let recent = beneath::mtime(&git, &rel).is_ok_and(|t| t >= since);
        if !kind.is_dir() || !recent {
            continue;
        }
        let Ok(bytes) = git.read(&rel.join("gitdir")) else {
            continue;
        };
        let line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
        let dot_git = Path::new(OsStr::from_bytes(line));
        let Some(worktree) = dot_git.parent().filter(|_| dot_git.is_absolute()) else {
            continue;
        };
        // A host path outside the project, only looked at: is it there?
        if worktree.symlink_metadata().is_err() {
            out.push(worktree.to_path_buf());
        }
    }
    out.sort();
    out
}
