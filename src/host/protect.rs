//! Code-bearing paths inside the writable project that tools on the host run code from
//! (git hooks and config, `.envrc`, `.vscode`, `.idea`): found on the host at launch so
//! the plan can lay read-only mounts over them. Reads the disk, never writes.
//!
//! What is protected, per git directory the project uses (the common dir, every linked
//! worktree's git dir, every submodule's git dir under `<common>/modules`):
//! - `hooks/` (an empty read-only directory when it is missing, so none can be planted),
//!   and the `core.hooksPath` directory when it lies inside the project;
//! - `config`, `config.worktree` (when present, or when `extensions.worktreeConfig` is
//!   mentioned), a linked worktree's `commondir` (it names the config git reads) and
//!   `gitdir` (`git worktree repair` writes a `.git` file where it points), and the files
//!   those configs and the user's include (`include.path`, `includeIf.*.path`) when they
//!   lie in the project; a `commondir` git would not have written (in the main, a
//!   submodule's or a nested git dir; a linked one not resolving to the common dir) is
//!   refused (see `policy::git_dir` for every file git reads there and how it is guarded);
//! - the work tree's `.git`: a directory is pinned as a mount point so that it cannot be
//!   renamed away and replaced, a `gitdir:` file is read-only; the same for the `.git`
//!   files of submodule work trees inside the project;
//! - the work-tree entries of [`WORK_TREE_ENTRIES`] (`.envrc`, `.vscode`, `.idea`, hook
//!   managers' config, `.mcp.json`, `.gitmodules`, `.devcontainer`, ...), when they exist
//!   (binding a missing one would leave an empty entry in the user's tree);
//! - `.claude`, always: a scratch tmpfs in its place, the host's entries read-only in it,
//!   and `settings.local.json` the project's own copy in claudebox's state (see
//!   [`Guard::LocalSettings`]), so that "always allow" keeps working and nothing the
//!   sandbox writes there reaches a host `claude`;
//! - git repositories nested in the work tree (vendored clones) at its top level or one
//!   level below a [`VENDOR_DIRS`] directory: their `.git` pinned, `hooks/` and `config`
//!   read-only.
//!
//! A protected path that is a symlink, or that lies below one, cannot be protected by a
//! mount (the link itself stays replaceable, and following it could expose a path outside
//! the project): the launch refuses it and names the opt-out.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::Result;

use crate::policy::facts::Project;
use crate::policy::protected::{
    Guard, Protected, CLAUDE_DIR, LOCAL_SETTINGS, VENDOR_DIRS, WORK_TREE_ENTRIES,
};

/// Top-level directories not looked into for nested repositories.
const NESTED_SKIP: &[&str] = &[".git", "node_modules", "target", ".claude"];

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
        // Read once: it is looked at for extensions.worktreeConfig and core.hooksPath.
        let common_config = fs::read(common.join("config")).ok();
        let worktree_config = common_config
            .as_deref()
            .is_some_and(mentions_worktree_config_in);
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
            if wt_dir.join("gitdir").exists() {
                push(
                    &mut out,
                    wt_dir.join("gitdir"),
                    Guard::ReadOnly,
                    "a linked worktree's gitdir: git worktree repair writes a .git file where \
                     it points",
                );
            }
            config_worktree(&mut out, &wt_dir, worktree_config);
        }
        pin(&mut out, &common.join("modules"));
        modules(&mut out, &common.join("modules"), wt, 0);
        for (hooks, from) in hooks_paths(project, home, common_config.as_deref()) {
            let inside = hooks.starts_with(wt) || hooks.starts_with(common);
            if inside && !out.iter().any(|p| p.path == hooks) {
                let guard = if hooks.exists() {
                    Guard::ReadOnly
                } else {
                    Guard::EmptyDir
                };
                out.push(Protected {
                    path: hooks,
                    guard,
                    why: "core.hooksPath: git runs hooks from it",
                    named_by: Some(from),
                });
            }
        }
    }
    // Files the protected configs include (`include.path`, `includeIf.*.path`, e.g. a
    // tracked `../.gitconfig`): git reads them as config.
    for (inc, from) in include_paths(project, home, &out) {
        let inside = inc.starts_with(wt)
            || project
                .outside_git_dirs()
                .iter()
                .any(|d| inc.starts_with(d));
        if inside && !out.iter().any(|p| p.path == inc) {
            let guard = if fs::symlink_metadata(&inc).is_ok() {
                Guard::ReadOnly
            } else {
                Guard::EmptyFile
            };
            out.push(Protected {
                path: inc,
                guard,
                why: "a file git config includes: git reads it as config",
                named_by: Some(from),
            });
        }
    }
    // One read of the work tree's top level: the table's entries and the nested
    // repositories are looked up in it (one `getdents` instead of an `lstat` per row).
    let top = top_level(wt);
    for (name, why) in WORK_TREE_ENTRIES {
        if top.iter().any(|(n, _)| n == name) {
            push(&mut out, wt.join(name), Guard::ReadOnly, why);
        }
    }
    // A home-sized project (`--yes`): its `.claude` is `~/.claude`, which the plan binds
    // over the project anyway.
    let home_c = fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
    if !home_c.starts_with(wt) {
        claude_dir(&mut out, wt);
    }
    nested_repos(&mut out, wt, &top);
    check_commondirs(project, &out)?;
    let mut real_dirs = Vec::new();
    // The host's `.claude/settings.local.json` is never mounted (the state's copy goes in
    // its place in the scratch `.claude`, whose own path is checked): a symlink there is
    // fine. The stand-in `.gitignore` is made only where the host has none.
    for p in out
        .iter()
        .filter(|p| !matches!(p.guard, Guard::LocalSettings | Guard::GitIgnore))
    {
        check_no_symlink(&p.path, &mut real_dirs).map_err(|e| match &p.named_by {
            Some(f) => {
                let look = format!(
                    "that path comes from {}: look there",
                    crate::policy::escape::shown(f)
                );
                // The fix grows by where to look; the message stays `{e}; {look}`.
                let fixable = match e.downcast_ref::<crate::policy::error::Fixable>() {
                    Some(x) => crate::policy::error::Fixable {
                        fix: format!("{}; {look}", x.fix),
                        ..x.clone()
                    },
                    None => crate::policy::error::Fixable::new(e.to_string(), look),
                };
                fixable.at(f).into()
            }
            None => e,
        })?;
    }
    // A mount over a parent after one over its child would hide the child's: parents first.
    out.sort_by_key(|p| p.path.components().count());
    Ok(out)
}

/// Refuses a `commondir` that redirects a git dir claudebox protects: in the main git dir,
/// a submodule's or a nested repository's (git writes none there), or a linked worktree's
/// that does not resolve to the common dir. Git reads it in every git dir and takes
/// config and hooks from where it points, so the protected config is no longer the one
/// git reads (an earlier session planted it and the review at its end was missed).
fn check_commondirs(project: &Project, out: &[Protected]) -> Result<()> {
    let Some(common) = &project.common_dir else {
        return Ok(());
    };
    // Every git dir whose config the probe protects, and the project's own git dir.
    let mut dirs: Vec<&Path> = out
        .iter()
        .filter(|p| p.path.file_name() == Some(OsStr::new("config")))
        .filter_map(|p| p.path.parent())
        .collect();
    dirs.extend(project.git_dir.as_deref());
    dirs.push(common);
    let linked = common.join("worktrees");
    for wt_dir in subdirs(&linked) {
        let f = wt_dir.join("commondir");
        let resolves = fs::read(&f)
            .ok()
            .and_then(|b| fs::canonicalize(wt_dir.join(OsStr::from_bytes(b.trim_ascii()))).ok());
        if fs::symlink_metadata(&f).is_ok() && resolves.as_deref() != Some(common.as_path()) {
            return Err(planted_commondir(&f));
        }
    }
    for d in dirs {
        if d.parent() == Some(linked.as_path()) {
            continue;
        }
        let f = d.join("commondir");
        if fs::symlink_metadata(&f).is_ok()
            && crate::policy::git_dir::git_dir_finding(
                crate::policy::git_dir::GitDirKind::Common,
                "commondir",
                &fs::read(&f).unwrap_or_default(),
            )
            .is_some()
        {
            return Err(planted_commondir(&f));
        }
    }
    Ok(())
}

fn planted_commondir(f: &Path) -> anyhow::Error {
    crate::policy::error::Fixable::new(
        format!(
            "{} moves this repository's config and hooks elsewhere (git reads it in every \
             git dir; git itself writes one only in a linked worktree's, as \"../..\")",
            crate::policy::escape::shown(f)
        ),
        "look at it and remove it, or launch with --writable-project-config to leave the \
         project's git metadata writable",
    )
    .at(f)
    .into()
}

/// The work-tree entries that are not protected because they do not exist: those that
/// [`probe`] (which looked at each) did not return.
pub fn missing_work_tree_entries(project: &Project, protected: &[Protected]) -> Vec<PathBuf> {
    WORK_TREE_ENTRIES
        .iter()
        .filter(|(name, why)| {
            let p = project.work_tree.join(name);
            // Bytes, not `Path` equality (which parses both): `probe` built the same path.
            !protected
                .iter()
                .any(|q| q.path.as_os_str() == p.as_os_str() && q.why == *why)
        })
        .map(|(name, _)| project.work_tree.join(name))
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

/// A submodule's or nested repository's git dir: pinned, and guarded by the file
/// supervisor ([`crate::policy::protected::PINNED_GIT_DIR_WHY`]).
fn pin_git_dir(out: &mut Vec<Protected>, dir: &Path) {
    push(
        out,
        dir.to_path_buf(),
        Guard::Pin,
        crate::policy::protected::PINNED_GIT_DIR_WHY,
    );
}

fn push(out: &mut Vec<Protected>, path: PathBuf, guard: Guard, why: &'static str) {
    out.push(Protected {
        path,
        guard,
        why,
        named_by: None,
    });
}

/// `.claude`: a scratch directory in its place (the host's `.claude` is its mount point;
/// bwrap creates an empty one when it is missing, which git does not see), each host
/// entry bound back read-only, and `settings.local.json` the project's own copy. A
/// `.claude` that is not a directory is bound read-only like the table's entries.
fn claude_dir(out: &mut Vec<Protected>, wt: &Path) {
    let dir = wt.join(CLAUDE_DIR);
    let why = "the project's Claude Code settings, hooks, MCP servers, commands, agents: a \
               host claude runs them; the sandbox gets a scratch copy";
    let host_names = match fs::symlink_metadata(&dir) {
        Ok(m) if !m.is_dir() => {
            push(out, dir, Guard::ReadOnly, why);
            return;
        }
        Ok(_) => {
            push(out, dir.clone(), Guard::Scratch, why);
            claude_entries(out, &dir)
        }
        // A work tree the user cannot write: bwrap could not make the mount point, and the
        // agent cannot make a `.claude` either.
        Err(_)
            if nix::unistd::access(
                wt,
                nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
            )
            .is_err() =>
        {
            return
        }
        Err(_) => {
            push(out, dir.clone(), Guard::Scratch, why);
            Vec::new()
        }
    };
    push(
        out,
        dir.join(LOCAL_SETTINGS),
        Guard::LocalSettings,
        "claude saves \"always allow\" rules here: the project's copy in claudebox's state, \
         never the host's file",
    );
    // The stand-in settings.local.json where the host has none: ignored inside (a
    // `.gitignore` of the host's own is left as it is: see `Guard::GitIgnore`).
    let has = |n: &str| host_names.iter().any(|h| h == n);
    if !has(LOCAL_SETTINGS) && !has(".gitignore") {
        push(
            out,
            dir.join(".gitignore"),
            Guard::GitIgnore,
            "git ignores the stand-in settings.local.json (and this file): git status \
             inside shows what it shows on the host, git add -A commits neither",
        );
    }
}

/// The host's entries of an existing `.claude`, read-only in the scratch one (all but
/// `settings.local.json`); returns the names of all of them.
fn claude_entries(out: &mut Vec<Protected>, dir: &Path) -> Vec<std::ffi::OsString> {
    let mut names = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        names = rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        names.sort();
        for n in names.iter().filter(|n| *n != LOCAL_SETTINGS) {
            push(
                out,
                dir.join(n),
                Guard::ReadOnly,
                "the host's .claude entry, read-only in the scratch .claude",
            );
        }
    }
    names
}

/// Git repositories nested in the work tree (not submodules, whose git dirs live in the
/// common dir): their `.git` pinned, their hooks and config read-only, as the project's.
/// Looked for (this is on the launch path, and a full walk of a large tree would cost
/// more than the rest of the launch) in each top-level directory, and one level below
/// the top-level directories where vendored code conventionally lives ([`VENDOR_DIRS`]).
fn nested_repos(out: &mut Vec<Protected>, wt: &Path, top: &[(std::ffi::OsString, bool)]) {
    for (name, is_dir) in top {
        if !is_dir || NESTED_SKIP.iter().any(|s| name == *s) {
            continue;
        }
        let dir = wt.join(name);
        nested_repo(out, &dir);
        if VENDOR_DIRS.iter().any(|v| name == *v) {
            for sub in subdirs(&dir) {
                nested_repo(out, &sub);
            }
        }
    }
}

/// `dir/.git` when `dir` is a git work tree nested in the project.
fn nested_repo(out: &mut Vec<Protected>, dir: &Path) {
    let p = dir.join(".git");
    match fs::symlink_metadata(&p) {
        Ok(m) if m.is_dir() && p.join("HEAD").is_file() => {
            pin_git_dir(out, &p);
            git_dir_entries(out, &p, mentions_worktree_config(&p.join("config")));
        }
        Ok(m) if m.is_file() && !out.iter().any(|q| q.path == p) => push(
            out,
            p,
            Guard::ReadOnly,
            "a nested repository's .git file: it names the git dir git uses",
        ),
        _ => {}
    }
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
        if sub.join("HEAD").is_file() {
            pin_git_dir(out, &sub);
            git_dir_entries(out, &sub, mentions_worktree_config(&sub.join("config")));
            if let Some(sub_wt) = core_value(&sub.join("config"), b"worktree") {
                let sub_wt = normalize(&sub.join(OsStr::from_bytes(&sub_wt)));
                let dot_git = sub_wt.join(".git");
                if sub_wt.starts_with(wt)
                    && fs::symlink_metadata(&dot_git).is_ok_and(|m| !m.is_dir())
                {
                    out.push(Protected {
                        path: dot_git,
                        guard: Guard::ReadOnly,
                        why: "a submodule's .git file: it names the git dir git uses",
                        named_by: Some(sub.join("config")),
                    });
                }
            }
            pin(out, &sub.join("modules"));
            modules(out, &sub.join("modules"), wt, depth + 1);
        } else {
            pin(out, &sub);
            // Submodule names may contain slashes: modules/a/b.
            modules(out, &sub, wt, depth + 1);
        }
    }
}

/// `core.hooksPath` from the repository's and the user's git config, resolved.
/// `common_config` is the common dir's `config` as already read (None: unreadable).
fn hooks_paths(
    project: &Project,
    home: &Path,
    common_config: Option<&[u8]>,
) -> Vec<(PathBuf, PathBuf)> {
    let mut files = vec![home.join(".gitconfig"), home.join(".config/git/config")];
    let common_config_file = project.common_dir.as_ref().map(|c| c.join("config"));
    if let Some(c) = &project.common_dir {
        files.push(c.join("config"));
        files.push(c.join("config.worktree"));
    }
    if let Some(g) = &project.git_dir {
        let f = g.join("config.worktree");
        // The same file as the common dir's when the git dir is the common dir.
        if !files.iter().any(|x| x.as_os_str() == f.as_os_str()) {
            files.push(f);
        }
    }
    let mut out = Vec::new();
    for f in files {
        let value = if common_config_file.as_ref().map(|c| c.as_os_str()) == Some(f.as_os_str()) {
            common_config.and_then(|t| core_value_in(t, b"hookspath"))
        } else {
            core_value(&f, b"hookspath")
        };
        let Some(v) = value else {
            continue;
        };
        let p = match v.strip_prefix(b"~/") {
            Some(rest) => home.join(OsStr::from_bytes(rest)),
            None => project.work_tree.join(OsStr::from_bytes(&v)),
        };
        out.push((normalize(&p), f));
    }
    out
}

/// The files named by `include.path` and `includeIf.*.path` in the user's git config and
/// in every git config the probe protects, resolved (relative to the including file,
/// `~/` to the home), each with the file that names it.
fn include_paths(project: &Project, home: &Path, out: &[Protected]) -> Vec<(PathBuf, PathBuf)> {
    let mut files = vec![home.join(".gitconfig"), home.join(".config/git/config")];
    files.extend(
        out.iter()
            .filter(|p| {
                let n = p.path.file_name();
                n == Some(OsStr::new("config")) || n == Some(OsStr::new("config.worktree"))
            })
            .map(|p| p.path.clone()),
    );
    if let Some(c) = &project.common_dir {
        files.push(c.join("config"));
    }
    let mut found = Vec::new();
    for f in files {
        let Ok(text) = fs::read(&f) else { continue };
        for v in include_values_in(&text) {
            let p = match v.strip_prefix(b"~/") {
                Some(rest) => home.join(OsStr::from_bytes(rest)),
                None => f
                    .parent()
                    .unwrap_or(Path::new("/"))
                    .join(OsStr::from_bytes(&v)),
            };
            found.push((normalize(&p), f.clone()));
        }
    }
    found
}

/// The `path` values of `[include]` and `[includeIf "..."]` sections (a small reader, as
/// [`core_value_in`]).
fn include_values_in(text: &[u8]) -> Vec<Vec<u8>> {
    let mut in_include = false;
    let mut out = Vec::new();
    for line in text.split(|b| *b == b'\n') {
        let mut line = line.trim_ascii();
        if line.starts_with(b"[") {
            let name = line[1..]
                .split(|b| *b == b']' || *b == b' ' || *b == b'"')
                .next()
                .unwrap_or(b"");
            in_include =
                name.eq_ignore_ascii_case(b"include") || name.eq_ignore_ascii_case(b"includeif");
            // `[include] path = x` on one line.
            match line.iter().position(|b| *b == b']') {
                Some(end) => line = line[end + 1..].trim_ascii(),
                None => continue,
            }
        }
        if !in_include {
            continue;
        }
        let Some(eq) = line.iter().position(|b| *b == b'=') else {
            continue;
        };
        if line[..eq].trim_ascii().eq_ignore_ascii_case(b"path") {
            let v = line[eq + 1..].trim_ascii();
            let v = v
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(v);
            if !v.is_empty() {
                out.push(v.to_vec());
            }
        }
    }
    out
}

/// The last value of `core.<key>` (key lowercase) in one git config file. A small reader:
/// sections, `key = value`, optional double quotes; includes are not followed.
pub(crate) fn core_value(file: &Path, key: &[u8]) -> Option<Vec<u8>> {
    core_value_in(&fs::read(file).ok()?, key)
}

/// [`core_value`] of a config file's bytes.
fn core_value_in(text: &[u8], key: &[u8]) -> Option<Vec<u8>> {
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
        .map(|t| mentions_worktree_config_in(&t))
        .unwrap_or(false)
}

fn mentions_worktree_config_in(text: &[u8]) -> bool {
    text.to_ascii_lowercase()
        .windows(14)
        .any(|w| w == b"worktreeconfig")
}

/// The names in `dir`, each with whether it is a directory (not following symlinks),
/// sorted.
fn top_level(dir: &Path) -> Vec<(std::ffi::OsString, bool)> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(std::ffi::OsString, bool)> = rd
        .filter_map(|e| e.ok())
        .map(|e| {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            (e.file_name(), is_dir)
        })
        .collect();
    v.sort();
    v
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

/// Fails when `path` or one of its parents (that exists) is a symlink. `real_dirs` holds
/// the directories already found to be neither a symlink nor below one, so that the
/// parents the protected paths share are looked at once per launch, not once per path.
fn check_no_symlink(path: &Path, real_dirs: &mut Vec<PathBuf>) -> Result<()> {
    let plain = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !plain {
        return check_no_symlink_by_realpath(path);
    }
    // From the root down: each existing component must not be a symlink; the first one
    // that does not exist ends the walk (nothing below it exists either).
    let bytes = path.as_os_str().as_bytes();
    let ends = bytes
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, b)| **b == b'/')
        .map(|(i, _)| i)
        .chain(std::iter::once(bytes.len()));
    for end in ends {
        let prefix = Path::new(OsStr::from_bytes(&bytes[..end]));
        if real_dirs
            .iter()
            .any(|d| d.as_os_str() == prefix.as_os_str())
        {
            continue;
        }
        let Ok(meta) = fs::symlink_metadata(prefix) else {
            return Ok(());
        };
        if meta.file_type().is_symlink() {
            return Err(below_symlink(path));
        }
        if meta.is_dir() {
            real_dirs.push(prefix.to_path_buf());
        }
    }
    Ok(())
}

/// The same check for a path with `.`, `..` or no root: the deepest existing ancestor
/// must be what `realpath` makes of it.
fn check_no_symlink_by_realpath(path: &Path) -> Result<()> {
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
        return Err(below_symlink(path));
    }
    Ok(())
}

fn below_symlink(path: &Path) -> anyhow::Error {
    crate::policy::error::Fixable::new(
        format!(
            "cannot protect {} from writes: it is or lies below a symlink, which a mount \
             cannot make read-only",
            crate::policy::escape::shown(path)
        ),
        "replace the symlink with the real file or directory, or launch with \
         --writable-project-config to leave it writable",
    )
    .at(path)
    .into()
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
    fn a_symlink_anywhere_on_the_way_is_refused_once_parents_are_known() {
        let d = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(d.path()).unwrap();
        fs::create_dir_all(root.join("real/hooks")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        let mut known = Vec::new();
        // Real paths pass, missing ones too (nothing below a missing directory exists).
        check_no_symlink(&root.join("real/hooks"), &mut known).unwrap();
        check_no_symlink(&root.join("real/missing/x"), &mut known).unwrap();
        assert!(known.contains(&root.join("real")));
        // With the shared parents already known, a symlink below them, at the end, or as
        // a parent of a missing path is still found.
        for bad in ["link", "link/hooks", "link/missing/x", "real/../link/hooks"] {
            let err = check_no_symlink(&root.join(bad), &mut known).unwrap_err();
            assert!(err.to_string().contains("symlink"), "{bad}: {err}");
        }
        // `..` is judged by realpath, as before: a real path through `..` is not itself.
        assert!(check_no_symlink(&root.join("real/../real/hooks"), &mut known).is_err());
    }

    #[test]
    fn include_values_are_read_from_both_sections() {
        let t = b"[include]\n\tpath = ../.gitconfig\n[core]\n\tpath = no\n\
                  [includeIf \"gitdir:/x/\"]\n\tpath = \"~/inc\"\n[include] path = a\n";
        assert_eq!(
            include_values_in(t),
            vec![b"../.gitconfig".to_vec(), b"~/inc".to_vec(), b"a".to_vec()]
        );
    }

    #[test]
    fn normalize_drops_dot_dot() {
        assert_eq!(
            normalize(Path::new("/r/.git/modules/a/../../../sub")),
            PathBuf::from("/r/sub")
        );
    }
}
