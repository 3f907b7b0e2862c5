//! Project identity: which project a directory belongs to, found in-process (no git
//! process on the launch path), and the 16-hex-character id that names its state.
//!
//! The canonical root is what `realpath "$(git rev-parse --path-format=absolute
//! --git-common-dir)"` prints inside a git repository (so every worktree of a repository is
//! one project) and the real cwd outside git.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::policy::escape::Shown;
use crate::policy::facts::Project;
use anyhow::{Context, Result};

/// Finds the project of `cwd` (which need not be canonical).
pub fn discover(cwd: &Path) -> Result<Project> {
    let cwd = fs::canonicalize(cwd)
        .with_context(|| format!("the current directory {} is not reachable", cwd.shown()))?;
    for dir in cwd.ancestors() {
        let dot_git = dir.join(".git");
        if let Some((git_dir, common)) = git_dir_of_dot_git(&dot_git) {
            return Ok(Project {
                root: common.clone(),
                work_tree: dir.to_path_buf(),
                git_dir: Some(git_dir),
                common_dir: Some(common),
                cwd: cwd.clone(),
            });
        }
        if let Some(common) = git_directory_common_dir(dir) {
            // Inside a bare repository or a .git directory itself: git reports this
            // directory's common dir and has no work tree.
            return Ok(Project {
                root: common.clone(),
                work_tree: cwd.clone(),
                git_dir: Some(dir.to_path_buf()),
                common_dir: Some(common),
                cwd: cwd.clone(),
            });
        }
    }
    Ok(Project {
        root: cwd.clone(),
        work_tree: cwd.clone(),
        git_dir: None,
        common_dir: None,
        cwd,
    })
}

/// `.git` as a directory, or as a `gitdir: PATH` file (linked worktrees, submodules):
/// the canonical git dir and its canonical common dir.
fn git_dir_of_dot_git(dot_git: &Path) -> Option<(PathBuf, PathBuf)> {
    let meta = fs::metadata(dot_git).ok()?;
    let candidate = if meta.is_dir() {
        dot_git.to_path_buf()
    } else if meta.is_file() {
        let bytes = fs::read(dot_git).ok()?;
        let rest = bytes.strip_prefix(b"gitdir:")?;
        let target = rest.trim_ascii();
        let target = Path::new(OsStr::from_bytes(target));
        dot_git.parent()?.join(target)
    } else {
        return None;
    };
    let (common, from) = git_directory(&candidate)?;
    let git_dir = match from {
        // The common dir is the git dir itself, already resolved.
        CommonFrom::GitDirResolved => common.clone(),
        CommonFrom::CommondirFile | CommonFrom::GitDirUnresolved => {
            fs::canonicalize(&candidate).ok()?
        }
    };
    Some((git_dir, common))
}

/// The canonical common dir of `dir` when `dir` is a git directory.
fn git_directory_common_dir(dir: &Path) -> Option<PathBuf> {
    git_directory(dir).map(|(common, _)| common)
}

/// Git's own test for a git directory: `HEAD`, an objects directory and a refs directory
/// (the latter two possibly through the common dir). Returns the common dir and where it
/// came from.
fn git_directory(dir: &Path) -> Option<(PathBuf, CommonFrom)> {
    if !dir.join("HEAD").is_file() {
        return None;
    }
    let (common, from) = common_dir_of(dir);
    (common.join("objects").is_dir() && common.join("refs").is_dir()).then_some((common, from))
}

/// Where [`common_dir_of`] found the common dir.
#[derive(Clone, Copy)]
enum CommonFrom {
    /// `<git_dir>/commondir`, resolved.
    CommondirFile,
    /// The git dir itself, resolved.
    GitDirResolved,
    /// The git dir itself, as given (it could not be resolved).
    GitDirUnresolved,
}

/// The common dir named by `<git_dir>/commondir`, or the git dir itself, resolved (as
/// given when it cannot be). `realpath` resolves each component before the next, so
/// resolving `git_dir` first or not gives the same result: callers compute it once.
fn common_dir_of(git_dir: &Path) -> (PathBuf, CommonFrom) {
    if let Ok(bytes) = fs::read(git_dir.join("commondir")) {
        let rel = Path::new(OsStr::from_bytes(bytes.trim_ascii()));
        if let Ok(p) = fs::canonicalize(git_dir.join(rel)) {
            return (p, CommonFrom::CommondirFile);
        }
    }
    match fs::canonicalize(git_dir) {
        Ok(p) => (p, CommonFrom::GitDirResolved),
        Err(_) => (git_dir.to_path_buf(), CommonFrom::GitDirUnresolved),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::facts::project_id;
    use sha2::{Digest, Sha256};

    #[test]
    fn id_is_16_hex_of_sha256_of_path_bytes() {
        // sha256("/tmp/x") = 5f3e... computed by `printf %s /tmp/x | sha256sum`
        let id = project_id(Path::new("/tmp/x"));
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        let full = hex::encode(Sha256::digest(b"/tmp/x"));
        assert_eq!(id, full[..16]);
    }

    #[test]
    fn outside_git_dirs_skips_dirs_within_work_tree() {
        let p = Project {
            root: "/r/.git".into(),
            work_tree: "/r".into(),
            git_dir: Some("/r/.git".into()),
            common_dir: Some("/r/.git".into()),
            cwd: "/r".into(),
        };
        assert!(p.outside_git_dirs().is_empty());
        let wt = Project {
            root: "/r/.git".into(),
            work_tree: "/w".into(),
            git_dir: Some("/r/.git/worktrees/w".into()),
            common_dir: Some("/r/.git".into()),
            cwd: "/w/sub".into(),
        };
        assert_eq!(wt.outside_git_dirs(), vec![PathBuf::from("/r/.git")]);
    }
}
