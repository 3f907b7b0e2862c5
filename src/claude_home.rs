//! `~/.claude` and `~/.claude.json` inside the sandbox: which entries of the user's real
//! Claude Code directory the agent sees, which are this project's or this launch's own,
//! and how the project's copy of `.claude.json` follows the host's.
//!
//! One table ([`TABLE`]), one row per entry of `~/.claude`, each with its class and why.
//! It was taken from `strace -f -e trace=file` of claude 2.1.330 and 2.1.197 (`-p` with a
//! Bash tool call, `mcp add`, plugin commands), not from memory. An entry of the real
//! directory that no row names is [`Class::Setup`]: visible, read-only.
//!
//! Inside, `~/.claude` is the project's own directory in claudebox's state
//! (`projects/<id>/claude-config/`, read-write, shared by the project's sandboxes), with
//! over it: the Setup entries of the real directory read-only, the project's
//! conversations and prompt history (kept where earlier claudebox versions kept them),
//! an empty tmpfs per Launch entry, and the login's credentials file read-write.
//! `CLAUDE_CONFIG_DIR=$HOME/.claude` makes claude keep its config at
//! `~/.claude/.claude.json` there, with its lock directory beside it: one lock for every
//! sandbox of the project, and an atomic rename that works (a directory bind).

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use crate::project::Project;
use crate::state::{self, ProjectState};

/// Whose an entry of `~/.claude` is, inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The user's setup: the real entry, read-only (read-write with
    /// `--writable-claude-setup`). When the host has none, an empty read-only one, so
    /// that nothing planted in the project's directory takes its place.
    Setup,
    /// Written while claude works; this project's, persistent, shared by its sandboxes,
    /// never the host's: the real entry is not visible.
    Project,
    /// Private to one launch and discarded at its end (an empty tmpfs).
    Launch,
    /// Shared by every sandbox and the host, read-write: one login.
    Login,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

pub struct Entry {
    pub name: &'static str,
    pub kind: Kind,
    pub class: Class,
    pub why: &'static str,
}

const fn row(name: &'static str, kind: Kind, class: Class, why: &'static str) -> Entry {
    Entry {
        name,
        kind,
        class,
        why,
    }
}

use Class::*;
use Kind::*;

/// Every entry of `~/.claude` claudebox knows. A new Claude Code directory is one line.
pub const TABLE: &[Entry] = &[
    // The setup: what claude reads and runs without asking.
    row(
        "settings.json",
        File,
        Setup,
        "user settings: hooks, statusLine, apiKeyHelper, permissions, env (hot-reloaded)",
    ),
    row(
        "settings.local.json",
        File,
        Setup,
        "user settings, local layer: same powers as settings.json",
    ),
    row(
        "CLAUDE.md",
        File,
        Setup,
        "user memory: part of every prompt",
    ),
    row("keybindings.json", File, Setup, "key bindings"),
    row("commands", Dir, Setup, "user slash commands: prompts"),
    row(
        "agents",
        Dir,
        Setup,
        "user subagents: prompts and tool grants",
    ),
    row("skills", Dir, Setup, "user skills: prompts and scripts"),
    row(
        "plugins",
        Dir,
        Setup,
        "installed plugins and marketplaces: hooks, MCP servers, commands",
    ),
    row("hooks", Dir, Setup, "scripts that settings.json hooks name"),
    row(
        "output-styles",
        Dir,
        Setup,
        "output styles: system-prompt text",
    ),
    row("rules", Dir, Setup, "user rules: prompt text (2.1.330)"),
    row("workflows", Dir, Setup, "user workflows (2.1.330)"),
    row("themes", Dir, Setup, "user themes (2.1.330)"),
    row(
        "cowork_plugins",
        Dir,
        Setup,
        "plugins of the desktop app's cowork mode (2.1.330)",
    ),
    row(
        "cowork_settings.json",
        File,
        Setup,
        "settings of cowork mode (2.1.330)",
    ),
    row(
        "state",
        Dir,
        Setup,
        "hybrid settings and consents (2.1.330)",
    ),
    row(
        ".config.json",
        File,
        Setup,
        "legacy user config, read at start",
    ),
    row(
        "local",
        Dir,
        Setup,
        "a claude installed by `claude migrate-installer`: the host runs it",
    ),
    row(
        "ide",
        Dir,
        Setup,
        "IDE lock files naming the IDE's port and token",
    ),
    // What claude writes while it works: this project's.
    row(
        "projects",
        Dir,
        Project,
        "conversations and memory (claudebox's claude-projects state)",
    ),
    row(
        "history.jsonl",
        File,
        Project,
        "prompt history (claudebox's history.jsonl state)",
    ),
    row(
        ".claude.json",
        File,
        Project,
        "config: this project's copy (see sync)",
    ),
    row(
        ".claude.json.lock",
        Dir,
        Project,
        "claude's lock of .claude.json",
    ),
    row(
        "backups",
        Dir,
        Project,
        "copies of .claude.json: the host's name every project",
    ),
    row(
        "file-history",
        Dir,
        Project,
        "pre-edit copies of edited files; /rewind writes them back",
    ),
    row("todos", Dir, Project, "todo lists per session"),
    row("plans", Dir, Project, "plan-mode plans"),
    row("tasks", Dir, Project, "task lists"),
    row("teams", Dir, Project, "agent teams"),
    row("paste-cache", Dir, Project, "pasted text"),
    row("image-cache", Dir, Project, "pasted images"),
    row("uploads", Dir, Project, "uploaded files"),
    row("downloads", Dir, Project, "downloaded files (2.1.330)"),
    row("debug", Dir, Project, "debug logs"),
    row("telemetry", Dir, Project, "failed telemetry events"),
    row("statsig", Dir, Project, "feature-flag cache"),
    row(
        "cache",
        Dir,
        Project,
        "model catalog and other caches (2.1.330)",
    ),
    row("stats-cache.json", File, Project, "usage statistics"),
    row("usage-data", Dir, Project, "usage data"),
    row("agent-memory", Dir, Project, "subagent memory"),
    row(
        "mcp-needs-auth-cache.json",
        File,
        Project,
        "MCP servers waiting for a login",
    ),
    row(
        "policy-limits.json",
        File,
        Project,
        "organisation policy cache",
    ),
    row(
        "remote-settings.json",
        File,
        Project,
        "remote managed settings cache",
    ),
    row(
        "chrome",
        Dir,
        Project,
        "Chrome integration: the host's native-messaging host is not shown",
    ),
    row("jobs", Dir, Project, "background jobs (2.1.330)"),
    row("daemon", Dir, Project, "background daemon state (2.1.330)"),
    row(
        "daemon.json",
        File,
        Project,
        "background daemon state (2.1.330)",
    ),
    row("dev-mods", Dir, Project, "per-session state (2.1.330)"),
    row(".device-keys.json", File, Project, "device keys (2.1.330)"),
    row(
        ".storage-write.lock",
        Dir,
        Project,
        "claude's storage lock (2.1.330)",
    ),
    row(
        ".hybrid_oauth_refresh.lock",
        Dir,
        Project,
        "claude's lock (2.1.330)",
    ),
    row(
        ".oauth_refresh.lock",
        Dir,
        Project,
        "OAuth refresh lock: shared by the project's sandboxes",
    ),
    // Private to one launch.
    row(
        "sessions",
        Dir,
        Launch,
        "running-session registry keyed by pid (claude is pid 2 in every sandbox)",
    ),
    row(
        "shell-snapshots",
        Dir,
        Launch,
        "sourced before every Bash call of every running session",
    ),
    row(
        "session-env",
        Dir,
        Launch,
        "hook environment scripts, run without asking",
    ),
    // One login.
    row(
        ".credentials.json",
        File,
        Login,
        "OAuth tokens of the login, refreshed by any claude",
    ),
];

/// Where `claude migrate-installer` puts claude: read-only whatever the options.
const INSTALLATION: &str = "local";

/// The class of an entry of the real `~/.claude`; unknown entries are Setup.
pub fn class_of(name: &OsStr) -> Class {
    entry(name).map_or(Setup, |e| e.class)
}

pub fn entry(name: &OsStr) -> Option<&'static Entry> {
    TABLE.iter().find(|e| OsStr::new(e.name) == name)
}

/// What the launch found of the user's Claude Code configuration on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostClaude {
    /// The real config dir: `$CLAUDE_CONFIG_DIR` when the host sets it, else `~/.claude`.
    pub dir: PathBuf,
    /// The real `.claude.json`: `$CLAUDE_CONFIG_DIR/.claude.json`, else `~/.claude.json`.
    pub json: PathBuf,
    /// The entries of `dir`, sorted by name, each with whether it is a directory.
    pub entries: Vec<(OsString, bool)>,
    /// The login's credentials file, when there is one: in
    /// `$CLAUDE_SECURESTORAGE_CONFIG_DIR` when the host sets it, else in `dir`.
    pub credentials: Option<PathBuf>,
}

impl HostClaude {
    /// Reads the real config dir's entry names (one `readdir`).
    pub fn probe(home: &Path) -> HostClaude {
        let (dir, json) = match std::env::var_os("CLAUDE_CONFIG_DIR") {
            Some(d) if Path::new(&d).is_absolute() => {
                let d = PathBuf::from(d);
                let json = d.join(".claude.json");
                (d, json)
            }
            _ => (home.join(".claude"), home.join(".claude.json")),
        };
        let mut entries: Vec<(OsString, bool)> = fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let ft = e.file_type().ok()?;
                // A symlink counts as what it leads to (bwrap binds its target).
                let is_dir = if ft.is_symlink() {
                    fs::metadata(e.path()).ok()?.is_dir()
                } else {
                    ft.is_dir()
                };
                Some((e.file_name(), is_dir))
            })
            .collect();
        entries.sort();
        let secure = std::env::var_os("CLAUDE_SECURESTORAGE_CONFIG_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute())
            .unwrap_or_else(|| dir.clone());
        let credentials = Some(secure.join(".credentials.json")).filter(|c| c.is_file());
        HostClaude {
            dir,
            json,
            entries,
            credentials,
        }
    }
}

/// One mount of the `~/.claude` group, for the plan to turn into its own type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overlay {
    /// Bind `source` at `target`, read-only unless `writable`; skipped if `source` went.
    Bind {
        source: PathBuf,
        target: PathBuf,
        writable: bool,
        file: bool,
        why: String,
    },
    /// An empty read-only directory.
    EmptyDir { target: PathBuf, why: String },
    /// A fresh empty tmpfs.
    Tmpfs { target: PathBuf, why: String },
}

/// The `~/.claude` group, in mount order: the project's directory, then over it every
/// entry that is not the project's. Pure.
pub fn overlays(
    home: &Path,
    host: &HostClaude,
    st: &ProjectState,
    writable_setup: bool,
) -> Vec<Overlay> {
    let inside = home.join(".claude");
    let mut v = vec![Overlay::Bind {
        source: st.claude_config(),
        target: inside.clone(),
        writable: true,
        file: false,
        why: "this project's ~/.claude (claudebox state): what claude writes while it works".into(),
    }];
    v.push(Overlay::Bind {
        source: st.conversations(),
        target: inside.join("projects"),
        writable: true,
        file: false,
        why: "this project's conversations".into(),
    });
    v.push(Overlay::Bind {
        source: st.history(),
        target: inside.join("history.jsonl"),
        writable: true,
        file: true,
        why: "this project's prompt history".into(),
    });
    let on_host = |name: &str| host.entries.iter().any(|(n, _)| n == name);
    for (name, is_dir) in &host.entries {
        let class = class_of(name);
        let target = inside.join(name);
        let source = host.dir.join(name);
        match class {
            Setup => {
                let known = entry(name).is_some();
                // The installation stays read-only even with the opt-out: the host runs it.
                let writable = writable_setup && name != INSTALLATION;
                v.push(Overlay::Bind {
                    source,
                    target,
                    writable,
                    file: !is_dir,
                    why: match (writable, known) {
                        (true, _) => "your setup, read-write (--writable-claude-setup)".into(),
                        (false, true) => {
                            format!(
                                "your setup, read-only: {}",
                                entry(name).map_or("", |e| e.why)
                            )
                        }
                        (false, false) => {
                            "your setup (an entry claudebox does not know), read-only".into()
                        }
                    },
                });
            }
            Login => v.push(Overlay::Bind {
                source,
                target,
                writable: true,
                file: true,
                why: "the login's OAuth tokens, shared with the host".into(),
            }),
            Project | Launch => {}
        }
    }
    if !writable_setup {
        for e in TABLE
            .iter()
            .filter(|e| e.class == Setup && !on_host(e.name) && placeholder(e.name))
        {
            let target = inside.join(e.name);
            let why = format!("empty and read-only, as you have none: {}", e.why);
            v.push(match e.kind {
                Dir => Overlay::EmptyDir { target, why },
                File => Overlay::Bind {
                    source: st.empty_file(),
                    target,
                    writable: false,
                    file: true,
                    why,
                },
            });
        }
    }
    for e in TABLE.iter().filter(|e| e.class == Launch) {
        v.push(Overlay::Tmpfs {
            target: inside.join(e.name),
            why: format!("private to this launch: {}", e.why),
        });
    }
    // The login: claude's secure-storage dir (CLAUDE_SECURESTORAGE_CONFIG_DIR inside),
    // one for every sandbox of every project, so they share the OAuth refresh lock.
    let login = st.login_dir();
    v.push(Overlay::Bind {
        source: login.clone(),
        target: login.clone(),
        writable: true,
        file: false,
        why: "the login's directory, shared by every sandbox: OAuth refresh and storage \
              locks (claude's CLAUDE_SECURESTORAGE_CONFIG_DIR)"
            .into(),
    });
    if let Some(c) = host.credentials.as_ref().filter(|c| !c.starts_with(&login)) {
        v.push(Overlay::Bind {
            source: c.clone(),
            target: login.join(".credentials.json"),
            writable: true,
            file: true,
            why: "the login's OAuth tokens, shared with the host".into(),
        });
    }
    v
}

/// Setup entries that get an empty read-only stand-in when the host has none: those
/// claude runs or prompts from.
fn placeholder(name: &str) -> bool {
    matches!(
        name,
        "settings.json"
            | "settings.local.json"
            | "CLAUDE.md"
            | "commands"
            | "agents"
            | "skills"
            | "plugins"
            | "hooks"
            | "output-styles"
            | "rules"
            | "workflows"
    )
}

/// Makes the mount points of the group exist as what they must be (never a symlink an
/// earlier sandbox left to redirect a mount), so bwrap does not create them and no mount
/// lands elsewhere. Only inside claudebox's state: the project's directory (seen at
/// `~/.claude`) and the login directory.
pub fn prepare_mount_points(home: &Path, st: &ProjectState, overlays: &[Overlay]) -> Result<()> {
    let dir = st.claude_config();
    let login = st.login_dir();
    state::mkdir_private(&dir)?;
    state::mkdir_private(&login)?;
    let inside = home.join(".claude");
    for o in overlays {
        let (target, file) = match o {
            Overlay::Bind { target, file, .. } => (target, *file),
            Overlay::EmptyDir { target, .. } | Overlay::Tmpfs { target, .. } => (target, false),
        };
        let point = if let Ok(rel) = target.strip_prefix(&inside) {
            dir.join(rel)
        } else {
            target.clone()
        };
        // Only the entries directly in one of the two roots are mount points.
        if point.parent() != Some(dir.as_path()) && point.parent() != Some(login.as_path()) {
            continue;
        }
        let meta = fs::symlink_metadata(&point);
        let right = meta.as_ref().is_ok_and(|m| {
            if file {
                m.file_type().is_file()
            } else {
                m.file_type().is_dir()
            }
        });
        if right {
            continue;
        }
        if let Ok(m) = &meta {
            // Wrong type or a symlink: left by an agent (the directory is writable
            // inside). Remove it; it never was the user's.
            let removed = if m.is_dir() {
                fs::remove_dir_all(&point)
            } else {
                fs::remove_file(&point)
            };
            match removed {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot replace {}", point.display()))
                }
                _ => {}
            }
        }
        let made = if file {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&point)
                .map(drop)
        } else {
            fs::DirBuilder::new().mode(0o700).create(&point)
        };
        match made {
            Ok(()) => {}
            // A sibling launch of the project made it at the same moment: fine if it is
            // what it must be.
            Err(e)
                if e.kind() == ErrorKind::AlreadyExists
                    && fs::symlink_metadata(&point).is_ok_and(|m| {
                        if file {
                            m.file_type().is_file()
                        } else {
                            m.file_type().is_dir()
                        }
                    }) => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", point.display())),
        }
    }
    Ok(())
}

// ---- ~/.claude.json -------------------------------------------------------------------

/// Whether a path key of `.claude.json` is this project's: the work tree or inside it,
/// or the main work tree of its repository or inside that.
pub fn is_this_project(key: &str, project: &Project) -> bool {
    let p = Path::new(key);
    if p.starts_with(&project.work_tree) {
        return true;
    }
    match project.root.file_name() {
        Some(n) if n == ".git" => project
            .root
            .parent()
            .is_some_and(|main| p.starts_with(main)),
        _ => false,
    }
}

/// The host's `.claude.json` as this project may see it: every user-level key, and of
/// the two keys that name projects only this project's part: `projects` (per-project
/// trust, last session id, costs, local-scope MCP servers with their secrets, keyed by
/// path) and `githubRepoPaths` (where each GitHub repository is checked out).
pub fn filter_for_project(host: &Value, project: &Project) -> Value {
    let Some(obj) = host.as_object() else {
        return Value::Object(Map::new());
    };
    let mut out = Map::new();
    for (k, v) in obj {
        match k.as_str() {
            "projects" => {
                let kept: Map<String, Value> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(path, _)| is_this_project(path, project))
                    .map(|(a, b)| (a.clone(), b.clone()))
                    .collect();
                out.insert(k.clone(), Value::Object(kept));
            }
            "githubRepoPaths" => {
                let mut kept = Map::new();
                for (repo, paths) in v.as_object().into_iter().flatten() {
                    let mine: Vec<Value> = paths
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|p| p.as_str().is_some_and(|s| is_this_project(s, project)))
                        .cloned()
                        .collect();
                    if !mine.is_empty() {
                        kept.insert(repo.clone(), Value::Array(mine));
                    }
                }
                out.insert(k.clone(), Value::Object(kept));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Keys merged one level down (per MCP server name, per project path).
const NESTED: &[&str] = &["mcpServers", "projects", "githubRepoPaths"];

/// Three-way merge of the host's view into the project's file: what the host changed
/// since the last sync (`base` to `host`) wins, per top-level key and, for [`NESTED`]
/// keys, per sub-key; everything else stays as the project has it.
pub fn merge(base: Option<&Value>, host: &Value, mine: Option<&Value>) -> Value {
    let empty = Map::new();
    let Some(mine) = mine.and_then(Value::as_object) else {
        return host.clone();
    };
    let base = base.and_then(Value::as_object).unwrap_or(&empty);
    let host = host.as_object().unwrap_or(&empty);
    let mut out = mine.clone();
    let keys: Vec<&String> = host.keys().chain(base.keys()).collect();
    for k in keys {
        let (b, h) = (base.get(k), host.get(k));
        if b == h {
            continue;
        }
        if NESTED.contains(&k.as_str()) {
            let (bo, ho) = (
                b.and_then(Value::as_object).unwrap_or(&empty),
                h.and_then(Value::as_object).unwrap_or(&empty),
            );
            let mut m = out
                .get(k)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            for sk in ho.keys().chain(bo.keys()) {
                match (bo.get(sk), ho.get(sk)) {
                    (x, y) if x == y => {}
                    (_, Some(y)) => {
                        m.insert(sk.clone(), y.clone());
                    }
                    (_, None) => {
                        m.remove(sk);
                    }
                }
            }
            out.insert(k.clone(), Value::Object(m));
        } else {
            match h {
                Some(h) => out.insert(k.clone(), h.clone()),
                None => out.remove(k),
            };
        }
    }
    Value::Object(out)
}

/// At launch: brings the host's changes into the project's `.claude.json` under claude's
/// own lock (a `mkdir` lock directory beside the file), written to a temporary file and
/// renamed, so a running sandbox of the project never reads half a file or loses its
/// update. Remembers the host's view for the next three-way merge.
pub fn sync_config(host: &HostClaude, st: &ProjectState, project: &Project) -> Result<()> {
    let host_view = match fs::read(&host.json) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => Some(filter_for_project(&v, project)),
            // The host's claude is between writes, or the file is broken: keep the
            // project's copy as it is and try again next launch.
            Err(_) => None,
        },
        Err(e) if e.kind() == ErrorKind::NotFound => Some(Value::Object(Map::new())),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", host.json.display())),
    };
    let Some(host_view) = host_view else {
        return Ok(());
    };
    let base_path = st.claude_json_base();
    let path = st.claude_json();
    let read_base = || -> Option<Value> {
        fs::read(&base_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    };
    if read_base().as_ref() == Some(&host_view) && is_regular(&path) {
        return Ok(()); // nothing changed on the host since the last sync
    }
    {
        let _lock = ConfigLock::take(&path, &st.claude_json_lock_owner())?;
        // Another launch of the project may have merged the same host state meanwhile.
        let base = read_base();
        if base.as_ref() == Some(&host_view) && is_regular(&path) {
            return Ok(());
        }
        merge_into(&path, base.as_ref(), &host_view)?;
        state::write_atomic_volatile(&base_path, &serde_json::to_vec(&host_view)?, 0o600)?;
    }
    // Durable after the lock is released, so the lock is held for as short as can be:
    // claude 2.1.x does not wait for it (a held lock makes it write without one).
    for p in [&path, &base_path] {
        if let Ok(f) = fs::File::open(p) {
            f.sync_all().ok();
        }
    }
    if let Ok(d) = fs::File::open(st.claude_config()) {
        d.sync_all().ok();
    }
    Ok(())
}

/// Under the lock: read the project's file, merge, and rename the result over it unless
/// the file changed since it was read (a claude that found the lock held writes without
/// it); then read and merge again.
fn merge_into(path: &Path, base: Option<&Value>, host_view: &Value) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let stamp = |m: &fs::Metadata| (m.ino(), m.size(), m.mtime(), m.mtime_nsec());
    for _ in 0..20 {
        let before = fs::symlink_metadata(path).ok().map(|m| stamp(&m));
        // The sandbox can write this directory: never follow a symlink it planted there
        // (to another project's file), never block on a FIFO. Anything but a regular
        // file counts as no file, and the rename below replaces it.
        let mine: Option<Value> = read_regular(path).and_then(|b| serde_json::from_slice(&b).ok());
        let merged = merge(base, host_view, mine.as_ref());
        if mine.as_ref() == Some(&merged) {
            return Ok(());
        }
        let mut text = serde_json::to_vec_pretty(&merged)?;
        text.push(b'\n');
        let tmp = tmp_beside(path)?;
        fs::write(&tmp, &text).with_context(|| format!("cannot write {}", tmp.display()))?;
        if fs::symlink_metadata(path).ok().map(|m| stamp(&m)) != before {
            let _ = fs::remove_file(&tmp);
            continue;
        }
        return fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()));
    }
    bail!(
        "{} keeps changing; the host's changes to ~/.claude.json come in at the next launch",
        path.display()
    )
}

/// Whether `path` is a regular file (not through a symlink).
fn is_regular(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// The bytes of `path` when it is a regular file, opened without following a symlink and
/// without blocking.
fn read_regular(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut b = Vec::new();
    f.read_to_end(&mut b).ok()?;
    Some(b)
}

/// A new 0600 temporary file name beside `path`.
fn tmp_beside(path: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".tmp.claudebox.{}.{seq}", std::process::id()));
    let tmp = PathBuf::from(name);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    Ok(tmp)
}

/// claude's lock of `.claude.json`: the directory `<file>.lock`, made with `mkdir` and
/// removed after (proper-lockfile, which claude treats as stale after 10 s). The lock
/// directory stays empty, as claude's own `rmdir` needs; who holds it is written to
/// `owner` (in claudebox's state, out of the sandbox's reach): a launch killed while it
/// held the lock leaves an owner whose process is gone, and the next launch takes the lock
/// over at once instead of waiting for it to go stale.
pub struct ConfigLock {
    dir: PathBuf,
    owner: PathBuf,
}

/// As claude: a lock directory untouched for this long is abandoned.
const STALE: Duration = Duration::from_secs(10);
/// Longer than [`STALE`], so a lock left by a killed claude is always taken over.
const WAIT: Duration = Duration::from_secs(15);

impl ConfigLock {
    pub fn take(file: &Path, owner: &Path) -> Result<ConfigLock> {
        use std::os::unix::fs::MetadataExt;
        let mut dir = file.as_os_str().to_os_string();
        dir.push(".lock");
        let dir = PathBuf::from(dir);
        let start = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match fs::create_dir(&dir) {
                Ok(()) => {
                    let ino = fs::metadata(&dir).map(|m| m.ino()).unwrap_or(0);
                    let record = format!("{} {ino}\n", std::process::id());
                    state::write_atomic_volatile(owner, record.as_bytes(), 0o600)?;
                    return Ok(ConfigLock {
                        dir,
                        owner: owner.to_path_buf(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let meta = fs::metadata(&dir).ok();
                    let age = meta
                        .as_ref()
                        .and_then(|m| m.modified().ok())
                        .and_then(|t| SystemTime::now().duration_since(t).ok());
                    let abandoned = meta
                        .as_ref()
                        .is_some_and(|m| held_by_a_dead_launch(owner, m));
                    if abandoned || age.is_some_and(|a| a > STALE) {
                        let _ = fs::remove_dir(&dir);
                        continue;
                    }
                    if start.elapsed() > WAIT {
                        bail!(
                            "{} is held by another claude for more than {}s; if none runs, remove it",
                            dir.display(),
                            WAIT.as_secs()
                        );
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create {}", dir.display()))
                }
            }
        }
    }
}

/// Whether `owner` says a claudebox process that no longer exists made this lock
/// directory (same inode, and made before the record was written: not a later one that
/// reuses the inode).
fn held_by_a_dead_launch(owner: &Path, lock: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(text) = fs::read_to_string(owner) else {
        return false;
    };
    let Ok(written) = fs::metadata(owner) else {
        return false;
    };
    let (ino, made) = (lock.ino(), (lock.ctime(), lock.ctime_nsec()));
    if made > (written.mtime(), written.mtime_nsec()) {
        return false;
    }
    let mut it = text.split_whitespace();
    let (Some(pid), Some(recorded)) = (
        it.next().and_then(|p| p.parse::<i32>().ok()),
        it.next().and_then(|i| i.parse::<u64>().ok()),
    ) else {
        return false;
    };
    recorded == ino
        && pid > 0
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH)
}

impl Drop for ConfigLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.owner);
        let _ = fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests;
