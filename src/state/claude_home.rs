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

use anyhow::{Context, Result};

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
#[rustfmt::skip]
pub const TABLE: &[Entry] = &[
    // The setup: what claude reads and runs without asking.
    row("settings.json", File, Setup, "user settings: hooks, statusLine, apiKeyHelper, permissions, env (hot-reloaded)"),
    row("settings.local.json", File, Setup, "user settings, local layer: same powers as settings.json"),
    row("CLAUDE.md", File, Setup, "user memory: part of every prompt"),
    row("keybindings.json", File, Setup, "key bindings"),
    row("commands", Dir, Setup, "user slash commands: prompts"),
    row("agents", Dir, Setup, "user subagents: prompts and tool grants"),
    row("skills", Dir, Setup, "user skills: prompts and scripts"),
    row("plugins", Dir, Setup, "installed plugins and marketplaces: hooks, MCP servers, commands"),
    row("hooks", Dir, Setup, "scripts that settings.json hooks name"),
    row("output-styles", Dir, Setup, "output styles: system-prompt text"),
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
    row(".config.json", File, Setup, "legacy user config, read at start"),
    row("local", Dir, Setup, "a claude installed by `claude migrate-installer`: the host runs it"),
    row("ide", Dir, Setup, "IDE lock files naming the IDE's port and token"),
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
    row(".claude.json.lock", Dir, Project, "claude's lock of .claude.json"),
    row("backups", Dir, Project, "copies of .claude.json: the host's name every project"),
    row("file-history", Dir, Project, "pre-edit copies of edited files; /rewind writes them back"),
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
    row("mcp-needs-auth-cache.json", File, Project, "MCP servers waiting for a login"),
    row("policy-limits.json", File, Project, "organisation policy cache"),
    row("remote-settings.json", File, Project, "remote managed settings cache"),
    row("chrome", Dir, Project, "Chrome integration: the host's native-messaging host is not shown"),
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
    row(".oauth_refresh.lock", Dir, Project, "OAuth refresh lock: shared by the project's sandboxes"),
    // Private to one launch.
    row(
        "sessions",
        Dir,
        Launch,
        "running-session registry keyed by pid (claude is pid 2 in every sandbox)",
    ),
    row("shell-snapshots", Dir, Launch, "sourced before every Bash call of every running session"),
    row("session-env", Dir, Launch, "hook environment scripts, run without asking"),
    // One login.
    row(".credentials.json", File, Login, "OAuth tokens of the login, refreshed by any claude"),
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

mod claude_json;
pub use claude_json::sync_config;
#[cfg(test)]
use claude_json::{filter_for_project, held_by_a_dead_launch, is_this_project, merge, ConfigLock};

#[cfg(test)]
mod tests;
