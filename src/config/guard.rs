//! What claudebox refuses, so that neither a project nor the agent inside can widen the
//! sandbox: extra mounts over the home or over what claudebox manages, read-write access
//! to its state or configuration, paths redirected through a symlink the sandbox could
//! have planted, a config file the sandbox could rewrite, and `[[project]]` sections
//! claimed by a directory that only pretends to be a work tree of the repository.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::Result;

use crate::config::Context;
use crate::policy::escape::Shown;
use crate::policy::facts::Project;
use crate::policy::protected::{
    SHARED_SYSTEM_DIRS, SOCKET_SCAN_DEPTH, SOCKET_SCAN_LIMIT, SOCKET_SCAN_SKIP, XDG_RUNTIME_DIR_WHY,
};
use crate::policy::settings::{ExtraKind, ExtraMount};

/// Places the sandbox can write (besides `rw` extras): a symlink there may have been
/// planted by the agent.
pub fn writable_areas(cx: &Context) -> Vec<PathBuf> {
    let mut areas = vec![cx.project.work_tree.clone()];
    areas.extend(cx.project.outside_git_dirs());
    areas.push(canonical_lossy(&cx.home.join(".claude")));
    areas.push(canonical_lossy(cx.conversations));
    areas
}

/// Whether a `[[project]] root` names this project: its work tree, or its repository
/// (the main work tree `~/src/foo` or the git dir `~/src/foo/.git`) when the current work
/// tree is one the repository itself lists (the main one, or a linked worktree registered
/// under `.git/worktrees/`). A directory that merely carries a planted `.git` file
/// pointing at that repository does not match.
pub fn project_matches(root: &Path, project: &Project) -> bool {
    let Ok(c) = fs::canonicalize(root) else {
        return false;
    };
    if c == project.work_tree {
        return true;
    }
    (c == project.root || c.join(".git") == project.root) && listed_work_tree(project)
}

/// Whether the project's work tree is one its repository records.
fn listed_work_tree(p: &Project) -> bool {
    let Some(git_dir) = &p.git_dir else {
        return false;
    };
    if p.work_tree.starts_with(&p.root) {
        return true; // inside the git dir itself
    }
    if *git_dir == p.root {
        // the main work tree (its `.git` may be a symlink to the git dir), or a submodule
        return fs::canonicalize(p.work_tree.join(".git")).ok().as_ref() == Some(&p.root)
            || submodule_of(git_dir, &p.work_tree);
    }
    if git_dir.parent() != Some(p.root.join("worktrees").as_path()) {
        return submodule_of(git_dir, &p.work_tree);
    }
    let Ok(bytes) = fs::read(git_dir.join("gitdir")) else {
        return submodule_of(git_dir, &p.work_tree);
    };
    let back = Path::new(OsStr::from_bytes(bytes.trim_ascii()));
    fs::canonicalize(git_dir.join(back)).ok() == Some(p.work_tree.join(".git"))
}

/// Whether `git_dir` is a submodule's git dir (or one made with `--separate-git-dir` and a
/// `core.worktree`) whose `core.worktree` names `work_tree`.
fn submodule_of(git_dir: &Path, work_tree: &Path) -> bool {
    let Some(wt) = crate::host::protect::core_value(&git_dir.join("config"), b"worktree") else {
        return false;
    };
    fs::canonicalize(git_dir.join(Path::new(OsStr::from_bytes(&wt))))
        .ok()
        .as_deref()
        == Some(work_tree)
}

/// Binding a git dir outside the work tree read-write is only safe when that repository
/// records this work tree: otherwise a planted `.git` file (`gitdir: ../other/.git`, which
/// an agent can write in a project) would hand the next sandbox another repository.
pub fn check_outside_git_dirs(project: &Project, yes: bool) -> Result<()> {
    if yes || project.outside_git_dirs().is_empty() || listed_work_tree(project) {
        return Ok(());
    }
    let git_dir = project.git_dir.as_deref().unwrap_or(&project.root);
    Err(crate::policy::error::Fixable::new(
        format!(
            "{} names the git dir {}, which does not list {} as one of its work trees (a \
             `.git` file can be planted to reach another repository)",
            project.work_tree.join(".git").shown(),
            git_dir.shown(),
            project.work_tree.shown()
        ),
        "if this layout is yours, run `git worktree repair` there or pass --yes to bind it \
         anyway",
    )
    .at(git_dir)
    .into())
}

/// The refusals: what would cover the home, claudebox's own files, its state or its
/// configuration, or what a symlink inside the sandbox's reach could redirect.
pub fn check_mount(
    m: &ExtraMount,
    written: &Path,
    writable: &[PathBuf],
    cx: &Context,
) -> Result<(), String> {
    let home = cx.home;
    let home_c = canonical_lossy(home);
    let covers = |ancestor: &Path, p: &Path| p.starts_with(ancestor);
    let both = |p: &Path| [p.to_path_buf(), canonical_lossy(p)];

    if [&m.target, &m.source]
        .iter()
        .any(|p| covers(p, home) || covers(p, &home_c))
    {
        return Err(format!(
            "{} would cover the whole home directory; list the directories you need instead",
            m.target.shown()
        ));
    }
    let claude = home.join(".claude");
    let managed: Vec<PathBuf> = [
        claude.join("projects"),
        claude.join("sessions"),
        claude.join("history.jsonl"),
        home.join(".claude.json"),
    ]
    .iter()
    .flat_map(|p| both(p))
    .collect();
    if both(&claude).contains(&m.target) || managed.iter().any(|p| m.target.starts_with(p)) {
        return Err(format!(
            "claudebox manages {} itself (the project's conversations and history, \
             ~/.claude.json); it cannot be mounted over",
            m.target.shown()
        ));
    }
    if m.kind == ExtraKind::Rw {
        let state = canonical_lossy(cx.state_dir);
        if m.source.starts_with(&state) || state.starts_with(&m.source) {
            return Err(format!(
                "read-write {} would let the sandbox change claudebox's state in {}",
                m.source.shown(),
                state.shown()
            ));
        }
        let dir = canonical_lossy(cx.config_file.parent().unwrap_or(cx.config_file));
        if m.source.starts_with(&dir) || dir.starts_with(&m.source) {
            return Err(format!(
                "read-write {} would let the sandbox rewrite its own configuration in {}",
                m.source.shown(),
                dir.shown()
            ));
        }
    }
    if let Some((link, area)) = symlink_in(written, writable) {
        return Err(format!(
            "{} goes through the symlink {}, inside {} which the sandbox can write, so \
             the agent could have redirected it; name the real path instead",
            written.shown(),
            link.shown(),
            area.shown()
        ));
    }
    Ok(())
}

/// The first symlink on the way to `path` whose directory lies inside one of `areas`.
fn symlink_in(path: &Path, areas: &[PathBuf]) -> Option<(PathBuf, PathBuf)> {
    let mut prefix = PathBuf::new();
    for comp in path.components() {
        prefix.push(comp);
        if !matches!(comp, Component::Normal(_)) {
            continue;
        }
        let meta = fs::symlink_metadata(&prefix).ok()?;
        if !meta.file_type().is_symlink() {
            continue;
        }
        let dir = fs::canonicalize(prefix.parent()?).ok()?;
        if let Some(area) = areas.iter().find(|a| dir.starts_with(a)) {
            return Some((prefix, area.clone()));
        }
    }
    None
}

/// The config file must not be where the sandbox can write it: the agent would widen
/// its own next sandbox. (Only `--yes`, which already allows a home-sized project, lets
/// the project hold it.)
pub fn check_config_not_writable(cx: &Context, mounts: &[ExtraMount]) -> Result<()> {
    let cfg = canonical_lossy(cx.config_file);
    let mut project_dirs = vec![cx.project.work_tree.clone()];
    project_dirs.extend(cx.project.outside_git_dirs());
    let areas = writable_areas(cx)
        .into_iter()
        .filter(|a| !(cx.yes && project_dirs.contains(a)))
        .chain(
            mounts
                .iter()
                .filter(|m| m.kind == ExtraKind::Rw)
                .map(|m| m.source.clone()),
        );
    for area in areas {
        if cfg.starts_with(&area) {
            return Err(crate::policy::error::Fixable::new(
                format!(
                    "the config file {} lies inside {}, which the sandbox can write: the \
                     agent could rewrite its own configuration",
                    cx.config_file.shown(),
                    area.shown()
                ),
                "set XDG_CONFIG_HOME to a directory outside it",
            )
            .at(cx.config_file)
            .into());
        }
    }
    Ok(())
}

/// claudebox's state directory (`CLAUDEBOX_HOME`, default `~/.claudebox`) holds every
/// project's conversations: it must not lie where a sandbox can write (the project, its
/// git dirs, `~/.claude`), nor hold such a place in its `projects/`, or every sandbox could read and change
/// every project's state. (`rw` extras over it are refused in [`check_mount`]; `--yes`,
/// which allows a home-sized project, also allows the project to hold it.)
pub fn check_state_not_writable(cx: &Context) -> Result<()> {
    let state = canonical_lossy(cx.state_dir);
    let mut areas: Vec<PathBuf> = Vec::new();
    if !cx.yes {
        areas.push(cx.project.work_tree.clone());
        areas.extend(cx.project.outside_git_dirs());
    }
    areas.push(canonical_lossy(&cx.home.join(".claude")));
    for area in areas {
        if state.starts_with(&area) || area.starts_with(state.join("projects")) {
            return Err(crate::policy::error::Fixable::new(
                format!(
                    "claudebox's state directory {} (CLAUDEBOX_HOME) and {}, which the \
                     sandbox can write, overlap: every sandbox could read every project's \
                     conversations",
                    cx.state_dir.shown(),
                    area.shown()
                ),
                "set CLAUDEBOX_HOME to a directory outside it",
            )
            .at(cx.state_dir)
            .into());
        }
    }
    Ok(())
}

/// What [`check_shared_dir`] found in a project it let through (with `--yes`): the unix
/// sockets to cover, and whether the project is or holds a shared system directory.
#[derive(Debug, Default)]
pub struct SharedDir {
    /// The shared system directory the project is or holds, with why it is shared.
    pub shared: Option<(PathBuf, String)>,
    /// Unix sockets found within [`SOCKET_SCAN_DEPTH`] levels of the project's top.
    pub sockets: Vec<PathBuf>,
    /// The scan stopped at [`SOCKET_SCAN_LIMIT`] entries.
    pub incomplete: bool,
}

impl SharedDir {
    /// The one line printed before a `--yes` launch, when there is something to say.
    pub fn warning(&self, work_tree: &Path) -> Option<String> {
        if self.shared.is_none() && self.sockets.is_empty() {
            return None;
        }
        let mut s = format!(
            "warning: {} unix socket(s) in {} covered with /dev/null",
            self.sockets.len(),
            work_tree.shown()
        );
        if let Some(first) = self.sockets.first() {
            s.push_str(&format!(" ({}{})", first.shown(), more(self.sockets.len())));
        }
        s.push_str("; sockets made there after the launch are reachable from the sandbox");
        if self.incomplete {
            s.push_str(&format!(
                " (only the first {SOCKET_SCAN_LIMIT} entries within {SOCKET_SCAN_DEPTH} \
                 levels were looked at for sockets nothing listens on)"
            ));
        }
        Some(s)
    }
}

fn more(n: usize) -> String {
    if n > 1 {
        format!(" and {} more", n - 1)
    } else {
        String::new()
    }
}

/// Refuses, without `--yes`, a project that is or holds a shared system directory
/// ([`SHARED_SYSTEM_DIRS`], `$XDG_RUNTIME_DIR`), or that holds unix sockets of other
/// programs (the agent could connect to a tmux server and type into a host shell). With
/// `--yes` the sockets found are returned, to be covered.
pub fn check_shared_dir(work_tree: &Path, yes: bool) -> Result<SharedDir> {
    let xdg = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let mut out = SharedDir::default();
    let shared = SHARED_SYSTEM_DIRS
        .iter()
        .map(|(d, why)| (PathBuf::from(d), why.to_string()))
        .chain(xdg.map(|d| (d, XDG_RUNTIME_DIR_WHY.to_string())));
    for (dir, why) in shared {
        let Ok(dir) = fs::canonicalize(&dir) else {
            continue;
        };
        if dir.starts_with(work_tree) {
            out.shared = Some((dir, why));
            break;
        }
    }
    if let (Some((dir, why)), false) = (&out.shared, yes) {
        let what = if dir == work_tree {
            "it is".to_string()
        } else {
            format!("it holds {}, which is", dir.shown())
        };
        return Err(crate::policy::error::Fixable::new(
            format!(
                "refusing to use {} as the project: {what} a shared system directory ({why}), \
                 and the agent could connect to other programs' sockets there",
                work_tree.shown()
            ),
            "cd into a project directory, or pass --yes to launch with the sockets found \
             there covered",
        )
        .at(work_tree)
        .into());
    }
    let mut budget = SOCKET_SCAN_LIMIT;
    find_sockets(work_tree, 1, &mut budget, &mut out.sockets);
    out.incomplete = budget == 0;
    // Live sockets at any depth: the kernel lists every bound one of this network
    // namespace (the host's) with the path it was bound at.
    for p in bound_unix_paths(&fs::read("/proc/net/unix").unwrap_or_default()) {
        use std::os::unix::fs::FileTypeExt;
        // A path this process may not look at (a directory of no permissions above it)
        // is still the kernel's word for a bound socket: kept, for reachable_inside.
        let socket = match fs::symlink_metadata(&p) {
            Ok(m) => m.file_type().is_socket(),
            Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied,
        };
        if p.starts_with(work_tree) && !out.sockets.contains(&p) && socket {
            out.sockets.push(p);
        }
    }
    out.sockets.sort();
    if !out.sockets.is_empty() && !yes {
        return Err(crate::policy::error::Fixable::new(
            format!(
                "refusing to use {} as the project: it holds unix sockets of other programs \
                 ({}{}), which the agent could connect to",
                work_tree.shown(),
                out.sockets[0].shown(),
                more(out.sockets.len())
            ),
            "cd into a project directory, remove the stale sockets, or pass --yes to launch \
             with them covered",
        )
        .at(&out.sockets[0])
        .into());
    }
    // A socket behind a directory the sandbox cannot search (another user's 0700 tmux
    // directory in /tmp) cannot be reached from inside, nor covered: bwrap fails to make
    // its mount point there ("Can't create file ...: Permission denied").
    let who = Searcher::current();
    out.sockets.retain(|p| reachable_inside(p, work_tree, &who));
    Ok(out)
}

/// Who the sandbox's processes are, for search permission on the host's directories.
struct Searcher {
    uid: u32,
    gids: Vec<u32>,
}

impl Searcher {
    fn current() -> Searcher {
        let mut gids = vec![nix::unistd::getegid().as_raw()];
        gids.extend(
            nix::unistd::getgroups()
                .unwrap_or_default()
                .iter()
                .map(|g| g.as_raw()),
        );
        Searcher {
            uid: nix::unistd::geteuid().as_raw(),
            gids,
        }
    }
}

/// Whether the sandbox can reach `socket` below `top` (the project, bound whole): every
/// directory between them must be searchable by [`Searcher`] as bwrap's user namespace
/// sees it: its own ids only mapped, so root's override of permissions holds only for
/// directories owned by root (uid and gid 0), and another owner's are judged by their
/// mode bits as for anyone. A directory that cannot be looked at counts as searchable
/// (the socket is covered, as before).
fn reachable_inside(socket: &Path, top: &Path, who: &Searcher) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(parent) = socket.parent() else {
        return true;
    };
    let mut dir = parent;
    while dir.starts_with(top) && dir != top {
        if let Ok(m) = fs::symlink_metadata(dir) {
            if !searchable(m.mode(), m.uid(), m.gid(), who) {
                return false;
            }
        }
        let Some(up) = dir.parent() else { break };
        dir = up;
    }
    true
}

/// Search permission on a directory of `mode`, owned by `uid`:`gid`, for `who` inside
/// the sandbox's user namespace (see [`reachable_inside`]). A directory of its own is
/// searchable whatever its mode: the agent can chmod it.
fn searchable(mode: u32, uid: u32, gid: u32, who: &Searcher) -> bool {
    if uid == who.uid || (who.uid == 0 && gid == 0) {
        return true;
    }
    if who.gids.contains(&gid) {
        mode & 0o010 != 0
    } else {
        mode & 0o001 != 0
    }
}

/// The absolute paths unix sockets are bound at, from `/proc/net/unix` (`Num RefCount
/// Protocol Flags Type St Inode Path`; abstract ones start with `@`).
fn bound_unix_paths(table: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in table.split(|b| *b == b'\n').skip(1) {
        let mut rest = line;
        for _ in 0..7 {
            rest = rest.trim_ascii_start();
            let end = rest.iter().position(|b| *b == b' ').unwrap_or(rest.len());
            rest = &rest[end..];
        }
        let path = rest.trim_ascii_start();
        if path.starts_with(b"/") {
            out.push(PathBuf::from(OsStr::from_bytes(path)));
        }
    }
    out
}

/// The unix sockets in `dir` and below, down to [`SOCKET_SCAN_DEPTH`] levels, symlinks
/// not followed; each directory entry looked at costs one of `budget`.
fn find_sockets(dir: &Path, depth: usize, budget: &mut usize, out: &mut Vec<PathBuf>) {
    use std::os::unix::fs::FileTypeExt;
    if *budget == 0 {
        return;
    }
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    let mut subdirs = Vec::new();
    for e in rd.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let Ok(t) = e.file_type() else {
            continue;
        };
        if t.is_socket() {
            out.push(e.path());
        } else if t.is_dir()
            && depth < SOCKET_SCAN_DEPTH
            && !SOCKET_SCAN_SKIP.iter().any(|s| e.file_name() == *s)
        {
            subdirs.push(e.path());
        }
    }
    subdirs.sort();
    for d in subdirs {
        find_sockets(&d, depth + 1, budget, out);
    }
}

/// `path` with symlinks resolved as far as it exists; the missing rest appended.
pub fn canonical_lossy(path: &Path) -> PathBuf {
    let mut missing: Vec<&OsStr> = Vec::new();
    let mut p = path;
    loop {
        if let Ok(c) = fs::canonicalize(p) {
            let mut out = c;
            out.extend(missing.iter().rev());
            return out;
        }
        // Up to the next ancestor that exists: `realpath` fails on any path `lstat` cannot
        // reach, so resolving those would only fail again, a system call per component.
        loop {
            match (p.parent(), p.file_name()) {
                (Some(parent), Some(name)) => {
                    missing.push(name);
                    p = parent;
                }
                _ => return path.to_path_buf(),
            }
            if fs::symlink_metadata(p).is_ok() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_socket_behind_another_users_private_directory_is_not_reachable_inside() {
        use super::{searchable, Searcher};
        let user = Searcher {
            uid: 1000,
            gids: vec![1000, 27],
        };
        let root = Searcher {
            uid: 0,
            gids: vec![0],
        };
        // Another user's tmux directory (0700): neither the user nor root inside.
        assert!(!searchable(0o40700, 1001, 1001, &user));
        assert!(!searchable(0o40700, 1001, 1001, &root));
        // Root's own directories: root's override holds (its ids are mapped).
        assert!(searchable(0o40000, 0, 0, &root));
        // By mode bits: owner, group (a supplementary one too), others.
        // Its own directories, whatever their mode: the agent can chmod them.
        assert!(searchable(0o40700, 1000, 5, &user));
        assert!(searchable(0o40000, 1000, 1000, &user));
        // Another's, by mode bits: group (a supplementary one too), others.
        assert!(searchable(0o40710, 1001, 27, &user));
        assert!(!searchable(0o40700, 1001, 27, &user));
        assert!(searchable(0o41777, 1001, 1001, &user));
    }

    use super::*;

    #[test]
    fn bound_unix_paths_reads_the_kernel_table() {
        let t = b"Num       RefCount Protocol Flags    Type St Inode Path\n\
                  0000000000000000: 00000002 00000000 00010000 0001 01 23108 /run/a b.sock\n\
                  0000000000000000: 00000002 00000000 00010000 0001 01 23109 @/tmp/.X11-unix/X0\n\
                  0000000000000000: 00000003 00000000 00000000 0001 03 23110\n";
        assert_eq!(bound_unix_paths(t), vec![PathBuf::from("/run/a b.sock")]);
    }

    #[test]
    fn canonical_lossy_appends_missing_parts() {
        let t = tempfile::tempdir().unwrap();
        let real = fs::canonicalize(t.path()).unwrap();
        std::os::unix::fs::symlink(&real, real.join("link")).unwrap();
        assert_eq!(
            canonical_lossy(&real.join("link/missing/x")),
            real.join("missing/x")
        );
    }
}
