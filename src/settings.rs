//! The user's additions to the sandbox, from the config file and the command line: extra
//! mounts (read-only, read-write, hidden), environment variables, the network mode and
//! default arguments for claude, each with where it came from. Resolving them (expanding
//! `~`, checking that paths exist, resolving symlinks, refusing what would break the
//! sandbox) happens here, on the launch path; the plan only places them.
//!
//! Precedence: the top level of the config file, then each `[[project]]` section that
//! matches the project (in file order), then the command line. Later wins: one mount per
//! target path, one value per variable, one network mode; default claude arguments add up.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, Result};

use crate::config::{self, Section};
use crate::project::Project;

/// Where a mount or setting came from, shown by `--dry-run`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Origin {
    /// claudebox's own default.
    #[default]
    Default,
    /// The config file, at this line.
    ConfigFile { path: PathBuf, line: usize },
    /// claudebox's command line.
    CommandLine,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::ConfigFile { path, line } => write!(f, "config {}:{line}", path.display()),
            Origin::CommandLine => f.write_str("command line"),
        }
    }
}

/// Network access from inside the sandbox. (The allowlist mode will be a third variant.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Network {
    /// The host's network, as outside (the default).
    #[default]
    Open,
    /// No network at all: a network namespace with only a loopback device.
    None,
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Network::Open => "open",
            Network::None => "none",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraKind {
    Ro,
    Rw,
    Hide,
}

/// A mount the user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraMount {
    pub kind: ExtraKind,
    /// The host path, symlinks resolved.
    pub source: PathBuf,
    /// Where it appears inside: the path as written (`~` expanded), so that a symlinked
    /// `~/.cargo` still appears at `~/.cargo`; for `hide`, the resolved path.
    pub target: PathBuf,
    pub is_dir: bool,
    pub origin: Origin,
}

/// An environment variable the user sets (or passes from the host) inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserEnv {
    pub name: OsString,
    pub value: OsString,
    pub origin: Origin,
}

/// Default arguments for claude from one section of the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaudeArgs {
    pub args: Vec<OsString>,
    pub origin: Origin,
}

/// Everything the user added, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    /// Where the config file is looked for, and whether one was read.
    pub config_file: PathBuf,
    pub config_read: bool,
    pub mounts: Vec<ExtraMount>,
    pub env: Vec<UserEnv>,
    pub network: Network,
    pub network_origin: Origin,
    pub claude_args: Vec<ClaudeArgs>,
}

impl Settings {
    /// Whether a hidden path is a file (it gets the state's empty file over it).
    pub fn hides_a_file(&self) -> bool {
        self.mounts
            .iter()
            .any(|m| m.kind == ExtraKind::Hide && !m.is_dir)
    }
}

/// What claudebox's own command-line options ask for.
#[derive(Debug, Clone, Default)]
pub struct CliRequest {
    pub ro: Vec<PathBuf>,
    pub rw: Vec<PathBuf>,
    pub hide: Vec<PathBuf>,
    pub env: Vec<OsString>,
    pub network: Option<Network>,
}

/// Facts about the launch that resolving needs.
pub struct Context<'a> {
    pub home: &'a Path,
    pub cwd: &'a Path,
    pub project: &'a Project,
    pub state_dir: &'a Path,
    pub conversations: &'a Path,
    pub config_file: &'a Path,
    /// `--yes`: allows a config file inside the (home-sized) project.
    pub yes: bool,
}

/// Where a request was written, for its error messages and its origin.
#[derive(Clone)]
enum Where<'a> {
    Config(&'a config::File, Range<usize>),
    Cli(&'static str, OsString),
}

impl Where<'_> {
    fn error(&self, msg: impl fmt::Display) -> anyhow::Error {
        match self {
            Where::Config(file, span) => file.error(span, msg),
            Where::Cli(flag, value) => anyhow!("{flag} {}: {msg}", value.to_string_lossy()),
        }
    }
    fn origin(&self) -> Origin {
        match self {
            Where::Config(file, span) => Origin::ConfigFile {
                path: file.path.clone(),
                line: file.line(span),
            },
            Where::Cli(..) => Origin::CommandLine,
        }
    }
}

struct Request<'a> {
    kind: ExtraKind,
    path: PathBuf,
    at: Where<'a>,
}

/// Combines the config file (top level and matching `[[project]]` sections) with the
/// command line, checks every path and refuses what would widen or break the sandbox.
pub fn resolve(file: Option<&config::File>, cli: &CliRequest, cx: &Context) -> Result<Settings> {
    let mut s = Settings {
        config_file: cx.config_file.to_path_buf(),
        config_read: file.is_some(),
        ..Settings::default()
    };
    let mut requests: Vec<Request> = Vec::new();
    let mut env: Vec<UserEnv> = Vec::new();

    if let Some(file) = file {
        let mut sections: Vec<&Section> = vec![&file.global];
        for p in &file.global.project {
            let root = p.get_ref().root.as_ref().expect("checked by config::parse");
            let at = Where::Config(file, root.span());
            let path = expand_config_path(root.get_ref(), cx.home, &at)?;
            if project_matches(&path, cx.project) {
                sections.push(p.get_ref());
            }
        }
        for sec in sections {
            for (kind, list) in [
                (ExtraKind::Ro, &sec.ro),
                (ExtraKind::Rw, &sec.rw),
                (ExtraKind::Hide, &sec.hide),
            ] {
                for p in list {
                    let at = Where::Config(file, p.span());
                    let path = expand_config_path(p.get_ref(), cx.home, &at)?;
                    requests.push(Request { kind, path, at });
                }
            }
            for (name, value) in &sec.env {
                let at = Where::Config(file, name.span());
                check_env_name(OsStr::new(name.get_ref()), &at)?;
                env.push(UserEnv {
                    name: name.get_ref().into(),
                    value: value.get_ref().into(),
                    origin: at.origin(),
                });
            }
            for name in &sec.pass_env {
                let at = Where::Config(file, name.span());
                check_env_name(OsStr::new(name.get_ref()), &at)?;
                if let Some(value) = std::env::var_os(name.get_ref()) {
                    env.push(UserEnv {
                        name: name.get_ref().into(),
                        value,
                        origin: at.origin(),
                    });
                }
            }
            if let Some(n) = &sec.network {
                s.network = *n.get_ref();
                s.network_origin = Where::Config(file, n.span()).origin();
            }
            if let Some(a) = &sec.claude_args {
                s.claude_args.push(ClaudeArgs {
                    args: a.get_ref().iter().map(OsString::from).collect(),
                    origin: Where::Config(file, a.span()).origin(),
                });
            }
        }
    }

    for (kind, flag, list) in [
        (ExtraKind::Ro, "--ro", &cli.ro),
        (ExtraKind::Rw, "--rw", &cli.rw),
        (ExtraKind::Hide, "--hide", &cli.hide),
    ] {
        for p in list {
            let at = Where::Cli(flag, p.clone().into_os_string());
            let path = expand_cli_path(p, cx.home, cx.cwd);
            requests.push(Request { kind, path, at });
        }
    }
    for e in &cli.env {
        let at = Where::Cli("--env", e.clone());
        let bytes = e.as_bytes();
        let (name, value) = match bytes.iter().position(|b| *b == b'=') {
            Some(i) => (
                OsStr::from_bytes(&bytes[..i]),
                Some(OsStr::from_bytes(&bytes[i + 1..]).to_os_string()),
            ),
            None => (e.as_os_str(), std::env::var_os(e)),
        };
        check_env_name(name, &at)?;
        if let Some(value) = value {
            env.push(UserEnv {
                name: name.to_os_string(),
                value,
                origin: Origin::CommandLine,
            });
        }
    }
    if let Some(n) = cli.network {
        s.network = n;
        s.network_origin = Origin::CommandLine;
    }

    s.mounts = resolve_mounts(requests, cx)?;
    check_config_not_writable(cx, &s.mounts)?;
    s.env = last_wins(env, |e| e.name.clone());
    Ok(s)
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
        return p.work_tree.join(".git") == p.root;
    }
    if git_dir.parent() != Some(p.root.join("worktrees").as_path()) {
        return false;
    }
    let Ok(bytes) = fs::read(git_dir.join("gitdir")) else {
        return false;
    };
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    let back = Path::new(OsStr::from_bytes(&bytes[..end]));
    fs::canonicalize(git_dir.join(back)).ok() == Some(p.work_tree.join(".git"))
}

/// `~` and `~/...` expanded; anything else must be absolute.
fn expand_config_path(raw: &str, home: &Path, at: &Where) -> Result<PathBuf> {
    if let Some(p) = expand_tilde(Path::new(raw), home) {
        return Ok(p);
    }
    if raw.starts_with('~') {
        return Err(at.error(format!(
            "`{raw}`: only `~` and `~/...` are expanded; write the full path"
        )));
    }
    if !Path::new(raw).is_absolute() {
        return Err(at.error(format!(
            "`{raw}` is a relative path; write an absolute path or one starting with ~/"
        )));
    }
    Ok(PathBuf::from(raw))
}

/// As on a shell command line: `~` expanded, a relative path taken from the cwd.
fn expand_cli_path(raw: &Path, home: &Path, cwd: &Path) -> PathBuf {
    expand_tilde(raw, home).unwrap_or_else(|| cwd.join(raw))
}

fn expand_tilde(raw: &Path, home: &Path) -> Option<PathBuf> {
    let b = raw.as_os_str().as_bytes();
    if b == b"~" {
        return Some(home.to_path_buf());
    }
    let rest = b.strip_prefix(b"~/")?;
    Some(home.join(OsStr::from_bytes(rest)))
}

fn check_env_name(name: &OsStr, at: &Where) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b.contains(&b'=') || b.contains(&0) {
        return Err(at.error("not a valid environment variable name"));
    }
    if b == b"CLAUDEBOX" || b.starts_with(b"CLAUDEBOX_") {
        return Err(at.error(format!(
            "{} is set by claudebox itself",
            name.to_string_lossy()
        )));
    }
    Ok(())
}

/// Keeps the last item for each key, in the order of those last items.
fn last_wins<T, K: PartialEq>(items: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let keys: Vec<K> = items.iter().map(&key).collect();
    items
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !keys[i + 1..].contains(&keys[*i]))
        .map(|(_, t)| t)
        .collect()
}

fn resolve_mounts(requests: Vec<Request>, cx: &Context) -> Result<Vec<ExtraMount>> {
    let mut resolved: Vec<(ExtraMount, Request)> = Vec::new();
    for r in requests {
        let source = fs::canonicalize(&r.path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                r.at.error(format!("{} does not exist", r.path.display()))
            }
            _ => {
                r.at.error(format!("cannot resolve {}: {e}", r.path.display()))
            }
        })?;
        let is_dir = fs::metadata(&source).map(|m| m.is_dir()).unwrap_or(false);
        let has_dotdot = r.path.components().any(|c| c == Component::ParentDir);
        let target = if r.kind == ExtraKind::Hide || has_dotdot {
            source.clone()
        } else {
            r.path.components().collect()
        };
        let m = ExtraMount {
            kind: r.kind,
            source,
            target,
            is_dir,
            origin: r.at.origin(),
        };
        resolved.push((m, r));
    }
    let resolved = last_wins(resolved, |(m, _)| m.target.clone());

    // Places the sandbox can write: a symlink there may have been planted by the agent.
    let mut writable: Vec<PathBuf> = vec![cx.project.work_tree.clone()];
    writable.extend(cx.project.outside_git_dirs());
    writable.push(canonical_lossy(&cx.home.join(".claude")));
    writable.push(canonical_lossy(cx.conversations));
    for (m, _) in &resolved {
        if m.kind == ExtraKind::Rw {
            writable.push(m.source.clone());
        }
    }
    for (m, r) in &resolved {
        check_mount(m, r, &writable, cx)?;
    }
    Ok(resolved.into_iter().map(|(m, _)| m).collect())
}

/// The refusals: what would cover the home, claudebox's own files, its state or its
/// configuration, or what a symlink inside the sandbox's reach could redirect.
fn check_mount(m: &ExtraMount, r: &Request, writable: &[PathBuf], cx: &Context) -> Result<()> {
    let home = cx.home;
    let home_c = canonical_lossy(home);
    let covers = |ancestor: &Path, p: &Path| p.starts_with(ancestor);
    let both = |p: &Path| [p.to_path_buf(), canonical_lossy(p)];

    if [&m.target, &m.source]
        .iter()
        .any(|p| covers(p, home) || covers(p, &home_c))
    {
        return Err(r.at.error(format!(
            "{} would cover the whole home directory; list the directories you need instead",
            m.target.display()
        )));
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
        return Err(r.at.error(format!(
            "claudebox manages {} itself (the project's conversations and history, \
             ~/.claude.json); it cannot be mounted over",
            m.target.display()
        )));
    }
    if m.kind == ExtraKind::Rw {
        let state = canonical_lossy(cx.state_dir);
        if m.source.starts_with(&state) || state.starts_with(&m.source) {
            return Err(r.at.error(format!(
                "read-write {} would let the sandbox change claudebox's state in {}",
                m.source.display(),
                state.display()
            )));
        }
        let dir = canonical_lossy(cx.config_file.parent().unwrap_or(cx.config_file));
        if m.source.starts_with(&dir) || dir.starts_with(&m.source) {
            return Err(r.at.error(format!(
                "read-write {} would let the sandbox rewrite its own configuration in {}",
                m.source.display(),
                dir.display()
            )));
        }
    }
    if let Some((link, area)) = symlink_in(&r.path, writable) {
        return Err(r.at.error(format!(
            "{} goes through the symlink {}, inside {} which the sandbox can write, so \
             the agent could have redirected it; name the real path instead",
            r.path.display(),
            link.display(),
            area.display()
        )));
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
fn check_config_not_writable(cx: &Context, mounts: &[ExtraMount]) -> Result<()> {
    let cfg = canonical_lossy(cx.config_file);
    let mut areas: Vec<PathBuf> = vec![cx.project.work_tree.clone()];
    areas.extend(cx.project.outside_git_dirs());
    areas.push(canonical_lossy(&cx.home.join(".claude")));
    if cx.yes {
        areas.clear();
    }
    areas.extend(
        mounts
            .iter()
            .filter(|m| m.kind == ExtraKind::Rw)
            .map(|m| m.source.clone()),
    );
    if let Some(area) = areas.iter().find(|a| cfg.starts_with(a)) {
        return Err(anyhow!(
            "the config file {} lies inside {}, which the sandbox can write: the agent \
             could rewrite its own configuration; set XDG_CONFIG_HOME to a directory \
             outside it",
            cx.config_file.display(),
            area.display()
        ));
    }
    Ok(())
}

/// `path` with symlinks resolved as far as it exists; the missing rest appended.
fn canonical_lossy(path: &Path) -> PathBuf {
    let mut missing: Vec<&OsStr> = Vec::new();
    let mut p = path;
    loop {
        if let Ok(c) = fs::canonicalize(p) {
            let mut out = c;
            out.extend(missing.iter().rev());
            return out;
        }
        match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name);
                p = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilde_expansion() {
        let home = Path::new("/h");
        assert_eq!(expand_tilde(Path::new("~"), home), Some("/h".into()));
        assert_eq!(
            expand_tilde(Path::new("~/a b"), home),
            Some("/h/a b".into())
        );
        assert_eq!(expand_tilde(Path::new("~x/a"), home), None);
        assert_eq!(expand_tilde(Path::new("/a/~"), home), None);
        assert_eq!(
            expand_cli_path(Path::new("rel"), home, Path::new("/cwd")),
            PathBuf::from("/cwd/rel")
        );
    }

    #[test]
    fn last_wins_keeps_order_of_the_winners() {
        let v = vec![("a", 1), ("b", 2), ("a", 3), ("c", 4)];
        assert_eq!(last_wins(v, |x| x.0), vec![("b", 2), ("a", 3), ("c", 4)]);
    }

    #[test]
    fn env_names() {
        let at = Where::Cli("--env", "x".into());
        assert!(check_env_name(OsStr::new("FOO_1"), &at).is_ok());
        for bad in ["", "A=B", "CLAUDEBOX", "CLAUDEBOX_PROJECT_ROOT"] {
            assert!(check_env_name(OsStr::new(bad), &at).is_err(), "{bad}");
        }
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
