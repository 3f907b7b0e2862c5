//! What the host was found to be, as data: the inputs of `plan::build` that `host` finds
//! (the project, the system paths, where claude is installed, the protected paths).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemEntry {
    Dir,
    Symlink(PathBuf),
}

/// Facts about the host file system the plan depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    pub system: Vec<(PathBuf, SystemEntry)>,
    /// Where `/etc/resolv.conf` leads when that is outside `/etc` (systemd-resolved).
    pub resolv_conf_target: Option<PathBuf>,
}

/// Where `claude` is installed and what must be bound so that it runs inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaudeInstall {
    /// The path the host's PATH resolves to (possibly a symlink).
    pub on_path: PathBuf,
    /// That path with symlinks resolved.
    pub real: PathBuf,
    /// What to bind read-only: the npm package directory holding it, or the file itself.
    pub bind: PathBuf,
    /// The interpreter its `#!` line names (`#!/usr/bin/env node`: `node` as the host's
    /// PATH finds it), when it names one that exists: nvm's and Homebrew's node live
    /// outside the system.
    pub interpreter: Option<Interpreter>,
}

/// A script's interpreter on the host: where PATH (or the `#!` line) names it, and that
/// path with symlinks resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    pub on_path: PathBuf,
    pub real: PathBuf,
}

/// Where a launch happens and what of the file system belongs to its project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    /// Canonical root: the git common dir, or the real cwd outside git.
    pub root: PathBuf,
    /// The work tree that is bound read-write: the top of the current work tree, or the
    /// real cwd outside git (or inside a bare repository / a git dir).
    pub work_tree: PathBuf,
    /// The git dir of this work tree (differs from `common_dir` in linked worktrees).
    pub git_dir: Option<PathBuf>,
    /// The common dir, equal to `root` inside git.
    pub common_dir: Option<PathBuf>,
    /// The real cwd, where the agent starts.
    pub cwd: PathBuf,
}

impl Project {
    /// The first 16 hex characters of the SHA-256 of the root path's bytes.
    pub fn id(&self) -> String {
        project_id(&self.root)
    }

    /// Git directories that lie outside the work tree and must be bound with it.
    pub fn outside_git_dirs(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        // The common dir holds the git dir in every layout git makes; bind the outermost
        // one only, so that one mount covers both.
        for dir in [&self.common_dir, &self.git_dir].into_iter().flatten() {
            let covered =
                dir.starts_with(&self.work_tree) || out.iter().any(|o| dir.starts_with(o));
            if !covered {
                out.push(dir.clone());
            }
        }
        out
    }
}

pub fn project_id(root: &Path) -> String {
    let digest = Sha256::digest(root.as_os_str().as_bytes());
    hex::encode(&digest[..8])
}
