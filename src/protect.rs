//! Code-bearing paths inside the writable project that tools on the host run code from
//! (git hooks and config, `.envrc`, `.vscode`, `.idea`): found on the host at launch so
//! the plan can lay read-only mounts over them. Reads the disk, never writes.
//!
//! What is protected, per git directory the project uses (the common dir, every linked
//! worktree's git dir, every submodule's git dir under `<common>/modules`):
//! - `hooks/` (an empty read-only directory when it is missing, so none can be planted),
//!   and the `core.hooksPath` directory when it lies inside the project;
//! - `config`, `config.worktree` (when present, or when `extensions.worktreeConfig` is
//!   mentioned), and a linked worktree's `commondir` (it names the config git reads);
//! - the work tree's `.git`: a directory is pinned as a mount point so that it cannot be
//!   renamed away and replaced, a `gitdir:` file is read-only; the same for the `.git`
//!   files of submodule work trees inside the project;
//! - `.envrc`, `.vscode`, `.idea` at the top of the work tree, when they exist (binding a
//!   missing one would leave an empty entry in the user's tree).
//!
//! A protected path that is a symlink, or that lies below one, cannot be protected by a
//! mount (the link itself stays replaceable, and following it could expose a path outside
//! the project): the launch refuses it and names the opt-out.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::project::Project;

/// How a protected path is laid over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// An existing file or directory, bound read-only onto itself.
    ReadOnly,
    /// A missing directory: an empty read-only directory in its place (bwrap leaves an
    /// empty directory on the host as the mount point).
    EmptyDir,
    /// A missing file: an empty read-only file in its place (bwrap leaves an empty file on
    /// the host as the mount point).
    EmptyFile,
    /// An existing directory bound read-write onto itself so that it is a mount point,
    /// which cannot be renamed or removed.
    Pin,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protected {
    pub path: PathBuf,
    pub guard: Guard,
    pub why: &'static str,
}

const WORK_TREE_ENTRIES: &[(&str, &str)] = &[
    (".envrc", "direnv runs it on the host"),
    (
        ".vscode",
        "VS Code runs tasks and settings from it on the host",
    ),
    (
        ".idea",
        "JetBrains IDEs run configurations from it on the host",
    ),
];

/// Finds the project's code-bearing paths. Fails on a protected path that is a symlink.
pub fn probe(project: &Project, home: &Path) -> Result<Vec<Protected>> {
    let mut out = Vec::new();
    let wt = &project.work_tree;
    if let Some(common) = &project.common_dir {
        let dot_git = wt.join(".git");
        match fs::symlink_metadata(&dot_git) {
            Ok(m) if m.is_dir() => push(
                &mut out,
                dot_git,
                Guard::Pin,
                "the work tree's .git, pinned: it cannot be renamed away and replaced",
            ),
            Ok(m) if m.is_file() => push(
                &mut out,
                dot_git,
                Guard::ReadOnly,
                "the work tree's .git file: it names the git dir git uses",
            ),
            Ok(_) => push(&mut out, dot_git, Guard::ReadOnly, "symlink"),
            Err(_) => {}
        }
        let worktree_config = mentions_worktree_config(&common.join("config"));
        git_dir_entries(&mut out, common, worktree_config);
        pin(&mut out, &common.join("worktrees"));
        for wt_dir in subdirs(&common.join("worktrees")) {
            pin(&mut out, &wt_dir);
            if wt_dir.join("commondir").exists() {
                push(
                    &mut out,
                    wt_dir.join("commondir"),
                    Guard::ReadOnly,
                    "a linked worktree's commondir: it names the config git reads",
                );
            }
            config_worktree(&mut out, &wt_dir, worktree_config);
        }
        pin(&mut out, &common.join("modules"));
        modules(&mut out, &common.join("modules"), wt, 0);
        for hooks in hooks_paths(project, home) {
            let inside = hooks.starts_with(wt) || hooks.starts_with(common);
            if inside && !out.iter().any(|p| p.path == hooks) {
                let guard = if hooks.exists() {
                    Guard::ReadOnly
                } else {
                    Guard::EmptyDir
                };
                push(
                    &mut out,
                    hooks,
                    guard,
                    "core.hooksPath: git runs hooks from it",
                );
            }
        }
    }
    for (name, why) in WORK_TREE_ENTRIES {
        let p = wt.join(name);
        if fs::symlink_metadata(&p).is_ok() {
            push(&mut out, p, Guard::ReadOnly, why);
        }
    }
    for p in &out {
        check_no_symlink(&p.path)?;
    }
    // A mount over a parent after one over its child would hide the child's: parents first.
    out.sort_by_key(|p| p.path.components().count());
    Ok(out)
}

/// The work-tree entries that are not protected because they do not exist.
pub fn missing_work_tree_entries(project: &Project) -> Vec<PathBuf> {
    WORK_TREE_ENTRIES
        .iter()
        .map(|(n, _)| project.work_tree.join(n))
        .filter(|p| fs::symlink_metadata(p).is_err())
        .collect()
}

/// Pins an existing directory of git metadata: a mount point cannot be renamed away and
/// replaced by a directory with other config in it.
fn pin(out: &mut Vec<Protected>, dir: &Path) {
    if fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        push(
            out,
            dir.to_path_buf(),
            Guard::Pin,
            "git metadata directory, pinned: it cannot be renamed away and replaced",
        );
    }
}

fn push(out: &mut Vec<Protected>, path: PathBuf, guard: Guard, why: &'static str) {
    out.push(Protected { path, guard, why });
}

/// `hooks/`, `config` and `config.worktree` of one git directory.
fn git_dir_entries(out: &mut Vec<Protected>, git_dir: &Path, worktree_config: bool) {
    let hooks = git_dir.join("hooks");
    let guard = if fs::symlink_metadata(&hooks).is_ok() {
        Guard::ReadOnly
    } else {
        Guard::EmptyDir
    };
    push(out, hooks, guard, "git hooks: host git runs them");
    let config = git_dir.join("config");
    let guard = if fs::symlink_metadata(&config).is_ok() {
        Guard::ReadOnly
    } else {
        Guard::EmptyFile
    };
    push(
        out,
        config,
        guard,
        "git config: core.fsmonitor, aliases, filters run code on the host",
    );
    config_worktree(out, git_dir, worktree_config);
}

fn config_worktree(out: &mut Vec<Protected>, git_dir: &Path, worktree_config: bool) {
    let p = git_dir.join("config.worktree");
    let why = "per-worktree git config: it can run code on the host like config";
    if fs::symlink_metadata(&p).is_ok() {
        push(out, p, Guard::ReadOnly, why);
    } else if worktree_config {
        push(out, p, Guard::EmptyFile, why);
    }
}

/// Submodule git dirs (`modules/<name>`, nested), and their work trees' `.git` files.
fn modules(out: &mut Vec<Protected>, dir: &Path, wt: &Path, depth: usize) {
    if depth > 8 {
        return;
    }
    for sub in subdirs(dir) {
        pin(out, &sub);
        if sub.join("HEAD").is_file() {
            git_dir_entries(out, &sub, mentions_worktree_config(&sub.join("config")));
            if let Some(sub_wt) = core_value(&sub.join("config"), b"worktree") {
                let sub_wt = normalize(&sub.join(OsStr::from_bytes(&sub_wt)));
                let dot_git = sub_wt.join(".git");
                if sub_wt.starts_with(wt)
                    && fs::symlink_metadata(&dot_git).is_ok_and(|m| !m.is_dir())
                {
                    push(
                        out,
                        dot_git,
                        Guard::ReadOnly,
                        "a submodule's .git file: it names the git dir git uses",
                    );
                }
            }
            pin(out, &sub.join("modules"));
            modules(out, &sub.join("modules"), wt, depth + 1);
        } else {
            // Submodule names may contain slashes: modules/a/b.
            modules(out, &sub, wt, depth + 1);
        }
    }
}

/// `core.hooksPath` from the repository's and the user's git config, resolved.
fn hooks_paths(project: &Project, home: &Path) -> Vec<PathBuf> {
    let mut files = vec![home.join(".gitconfig"), home.join(".config/git/config")];
    if let Some(c) = &project.common_dir {
        files.push(c.join("config"));
        files.push(c.join("config.worktree"));
    }
    if let Some(g) = &project.git_dir {
        files.push(g.join("config.worktree"));
    }
    let mut out = Vec::new();
    for f in files {
        let Some(v) = core_value(&f, b"hookspath") else {
            continue;
        };
        let p = match v.strip_prefix(b"~/") {
            Some(rest) => home.join(OsStr::from_bytes(rest)),
            None => project.work_tree.join(OsStr::from_bytes(&v)),
        };
        out.push(normalize(&p));
    }
    out
}

/// The last value of `core.<key>` (key lowercase) in one git config file. A small reader:
/// sections, `key = value`, optional double quotes; includes are not followed.
pub(crate) fn core_value(file: &Path, key: &[u8]) -> Option<Vec<u8>> {
    let text = fs::read(file).ok()?;
    let mut in_core = false;
    let mut found = None;
    for line in text.split(|b| *b == b'\n') {
        let line = line.trim_ascii();
        if line.starts_with(b"[") {
            let name = line[1..].split(|b| *b == b']' || *b == b' ').next()?;
            in_core = name.eq_ignore_ascii_case(b"core");
            continue;
        }
        if !in_core {
            continue;
        }
        let Some(eq) = line.iter().position(|b| *b == b'=') else {
            continue;
        };
        if line[..eq].trim_ascii().eq_ignore_ascii_case(key) {
            let v = line[eq + 1..].trim_ascii();
            let v = v
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(v);
            found = Some(v.to_vec());
        }
    }
    found
}

fn mentions_worktree_config(config: &Path) -> bool {
    fs::read(config)
        .map(|t| {
            t.to_ascii_lowercase()
                .windows(14)
                .any(|w| w == b"worktreeconfig")
        })
        .unwrap_or(false)
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Removes `.` and `..` components lexically (the paths here have no symlinks).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Fails when `path` or one of its parents (that exists) is a symlink.
fn check_no_symlink(path: &Path) -> Result<()> {
    let mut existing = path;
    let meta = loop {
        match fs::symlink_metadata(existing) {
            Ok(m) => break m,
            Err(_) => match existing.parent() {
                Some(p) => existing = p,
                None => return Ok(()),
            },
        }
    };
    let is_link = meta.file_type().is_symlink();
    let real = fs::canonicalize(existing).ok();
    if is_link || real.as_deref() != Some(existing) {
        bail!(
            "cannot protect {} from writes: it is or lies below a symlink, which a mount \
             cannot make read-only; replace the symlink with the real file or directory, or \
             launch with --writable-project-config to leave it writable",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_value_reads_last_value_in_core_section() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("config");
        fs::write(
            &f,
            "[core]\n\tbare = false\n[alias]\n\thooksPath = no\n[core]\n\thooksPath = \".husky/_\"\n",
        )
        .unwrap();
        assert_eq!(core_value(&f, b"hookspath").unwrap(), b".husky/_");
        assert_eq!(core_value(&f, b"worktree"), None);
    }

    #[test]
    fn normalize_drops_dot_dot() {
        assert_eq!(
            normalize(Path::new("/r/.git/modules/a/../../../sub")),
            PathBuf::from("/r/sub")
        );
    }
}
