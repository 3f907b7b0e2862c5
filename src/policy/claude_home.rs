//! `~/.claude` inside the sandbox as data: one row per entry of the user's real Claude
//! Code directory with its class and why ([`TABLE`]), what the launch found on the host
//! ([`HostClaude`]) and the group's mounts in order ([`overlays`], pure). The I/O (probing
//! the host, making mount points, syncing `.claude.json`) is `state::claude_home`.
//!
//! A new Claude Code entry of `~/.claude` is one row of [`TABLE`].

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::policy::layout::ProjectState;

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

pub struct ClaudeEntry {
    pub name: &'static str,
    pub kind: Kind,
    pub class: Class,
    pub why: &'static str,
}

const fn row(name: &'static str, kind: Kind, class: Class, why: &'static str) -> ClaudeEntry {
    ClaudeEntry {
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
pub const TABLE: &[ClaudeEntry] = &[
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

/// An entry inside a Setup directory that claude writes for the setup to work: this
/// project's own directory (`ProjectState::dir/state`) is mounted over it, read-write,
/// when the setup is read-only. Only entries the host never runs from what a sandbox
/// wrote: the host sees its own real entry, never the project's.
pub struct Within {
    /// The Setup directory it is in (a row of [`TABLE`]).
    pub parent: &'static str,
    pub name: &'static str,
    /// Its source, a directory in the project's state.
    pub state: &'static str,
    pub why: &'static str,
}

/// Every entry inside a Setup directory that is this project's (measured with strace and
/// `--debug-file`, claude 2.1.197 and 2.1.330, a plugin with a hook and an MCP server).
#[rustfmt::skip]
pub const WITHIN: &[Within] = &[
    Within {
        parent: "plugins",
        name: "data",
        state: crate::policy::layout::PLUGIN_DATA_DIR,
        why: "plugins' persistent data (CLAUDE_PLUGIN_DATA): claude makes data/<plugin> before \
              it runs a plugin's hook or MCP server and fails them if it cannot; plugins may \
              install code there, so this project's, never run on the host",
    },
];

/// The login's credentials file in claude's `CLAUDE_SECURESTORAGE_CONFIG_DIR`.
pub const LOGIN_FILE: &str = ".credentials.json";

/// Where `claude migrate-installer` puts claude: read-only whatever the options.
const INSTALLATION: &str = "local";

/// The class of an entry of the real `~/.claude`: its row of [`TABLE`]; an unknown entry
/// named as data ([`is_data`]) is Project, any other unknown entry Setup.
pub fn class_of(name: &OsStr) -> Class {
    match entry(name) {
        Some(e) => e.class,
        None if is_data(name) => Project,
        None => Setup,
    }
}

/// Name endings of the user's own data at the top of `~/.claude`, not in [`TABLE`]: a
/// hook's log or record (`echo ... >> ~/.claude/hook.log`). Such an entry is this
/// project's (class Project), so a hook that appends to it keeps working inside once the
/// host has one (a Setup entry would be bound read-only over it): the sandbox writes the
/// project's own copy in claudebox's state, which the host never reads or runs, and the
/// host's own is neither shown nor written. Scripts (`.sh`, `.py`, no ending, ...) and
/// configuration (`.json`, which claude may read as settings) stay Setup, read-only.
pub const DATA_ENDINGS: &[&str] = &[".log", ".jsonl", ".ndjson", ".txt", ".csv", ".tsv"];

/// Unknown directories of `~/.claude` that hold data only, by the same reasoning.
pub const DATA_DIRS: &[&str] = &["logs"];

/// `name` (an entry of `~/.claude` not in [`TABLE`]) is the user's data: see
/// [`DATA_ENDINGS`].
pub fn is_data(name: &OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    DATA_DIRS.iter().any(|d| b == d.as_bytes())
        || DATA_ENDINGS
            .iter()
            .any(|e| b.len() > e.len() && b.ends_with(e.as_bytes()))
}

pub fn entry(name: &OsStr) -> Option<&'static ClaudeEntry> {
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
    /// Where a row of [`WITHIN`] is mounted on the host's side (`dir/parent/name`), for
    /// each row whose parent is a directory and whose entry is a directory or absent (then
    /// the launch makes it, empty: the mount point).
    pub within: Vec<PathBuf>,
}

/// The user's settings file in `~/.claude`.
pub const SETTINGS: &str = "settings.json";

/// The one key of claude's user settings that a sandbox's copy carries over (to
/// claudebox's state, never to the host's file): "the user has accepted the bypass
/// permissions mode dialog" (both Claude Code versions write it to the user settings when
/// the dialog's "Yes, I accept" is chosen, and skip the dialog when any of the user,
/// local, flag or policy settings has it true; measured in 2.1.197 and 2.1.330).
pub const BYPASS_KEY: &str = "skipDangerousModePermissionPrompt";

/// Why `~/.claude/settings.json` is the project's copy (see `state::claude_home::
/// refresh_user_settings`).
pub const SETTINGS_COPY_WHY: &str = "your settings.json, as this project's copy (claudebox \
     state), rebuilt from yours at each launch: claude may write it (the Bypass \
     Permissions answer is kept, for every project, and nothing else; your file is never \
     written)";

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
    let settings_dir = host
        .entries
        .iter()
        .any(|(n, d)| *d && n == OsStr::new(SETTINGS));
    let settings_copy = !writable_setup && !settings_dir;
    if settings_copy {
        v.push(Overlay::Bind {
            source: st.user_settings(),
            target: inside.join(SETTINGS),
            writable: true,
            file: true,
            why: SETTINGS_COPY_WHY.into(),
        });
    }
    for (name, is_dir) in &host.entries {
        let class = class_of(name);
        let target = inside.join(name);
        let source = host.dir.join(name);
        match class {
            Setup if settings_copy && name == OsStr::new(SETTINGS) => {}
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
        for w in WITHIN {
            let point = host.dir.join(w.parent).join(w.name);
            if host.within.contains(&point) {
                v.push(Overlay::Bind {
                    source: st.dir.join(w.state),
                    target: inside.join(w.parent).join(w.name),
                    writable: true,
                    file: false,
                    why: format!("this project's: {}", w.why),
                });
            }
        }
        for e in TABLE
            .iter()
            .filter(|e| e.class == Setup && !on_host(e.name) && placeholder(e.name))
            .filter(|e| e.name != SETTINGS)
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
    let file = login.join(LOGIN_FILE);
    match &host.credentials {
        Some(c) if !c.starts_with(&login) => v.push(Overlay::Bind {
            source: c.clone(),
            target: file,
            writable: true,
            file: true,
            why: "the login's OAuth tokens, shared with the host".into(),
        }),
        // Your opt-in (the host's own CLAUDE_SECURESTORAGE_CONFIG_DIR is this directory):
        // the very file the host reads, by path, so that its renames reach every sandbox.
        Some(_) => {}
        // No login on the host: the directory's own file, bound onto itself so that it is
        // a mount point in every sandbox. Otherwise one project's agent could put a FIFO
        // in its place (and hold its write end): every other project's claude reads that
        // name at its start, with an API key too, and would block on it for ever (measured,
        // 2.1.197 and 2.1.330), or a symlink it would follow. A login made inside
        // (`/login`) is still written there, in place, for every sandbox.
        None => v.push(Overlay::Bind {
            source: file.clone(),
            target: file,
            writable: true,
            file: true,
            why: "the login directory's own credentials file (you have none on the host), \
                  bound onto itself so that no sandbox can put anything else in its place"
                .into(),
        }),
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

/// Where claude keeps the marketplaces it knows, under `~/.claude`.
pub const KNOWN_MARKETPLACES: &str = "plugins/known_marketplaces.json";

/// The directories of marketplaces added as local directories (`/plugin marketplace add
/// ./dir`: `"source": {"source": "directory", "path": DIR}`) in `known_marketplaces.json`.
/// claude reads such a marketplace's plugins from that directory, not from its cache, so
/// inside they load only when it is there. Absolute paths only; anything unreadable is
/// none. Whether each may be bound is the edge's check (`marketplace_refusal`).
pub fn local_marketplaces(known: &[u8]) -> Vec<PathBuf> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(known) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = map
        .values()
        .filter_map(|m| {
            let src = m.get("source")?;
            (src.get("source")?.as_str()? == "directory").then_some(())?;
            let p = PathBuf::from(src.get("path")?.as_str()?);
            p.is_absolute().then_some(p)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What to do with a local marketplace directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marketplace {
    /// Bind it read-only.
    Bind,
    /// Inside the project or `~/.claude`: there already.
    Visible,
    /// Not bound, and why.
    Refused(&'static str),
}

/// A local marketplace directory is bound read-only when it holds a marketplace
/// (`.claude-plugin/marketplace.json`, so that a doctored list cannot bring in any
/// directory) and is neither the home nor above it, nor above the project (`visible`: the
/// project's directories and `~/.claude`, where it is there already).
pub fn marketplace(dir: &Path, has_manifest: bool, home: &Path, visible: &[&Path]) -> Marketplace {
    if home.starts_with(dir) {
        Marketplace::Refused("it is the home or above it")
    } else if visible.iter().any(|v| v.starts_with(dir) && *v != dir) {
        // Bound after them, it would cover the project's read-write mounts.
        Marketplace::Refused("it holds the project")
    } else if visible.iter().any(|v| dir.starts_with(v)) {
        Marketplace::Visible
    } else if !has_manifest {
        Marketplace::Refused("it has no .claude-plugin/marketplace.json")
    } else {
        Marketplace::Bind
    }
}

#[cfg(test)]
mod marketplace_tests {
    use super::*;

    #[test]
    fn directory_sources_are_found_and_checked() {
        let known = br#"{"lab":{"source":{"source":"directory","path":"/w/mk"},"installLocation":"/w/mk"},
            "gh":{"source":{"source":"github","repo":"a/b"},"installLocation":"/h/.claude/plugins/marketplaces/gh"},
            "rel":{"source":{"source":"directory","path":"mk"}}}"#;
        assert_eq!(local_marketplaces(known), vec![PathBuf::from("/w/mk")]);
        assert!(local_marketplaces(b"not json").is_empty());
        let home = Path::new("/h");
        let proj = Path::new("/w/p");
        let m = |d: &str, manifest| marketplace(Path::new(d), manifest, home, &[proj]);
        assert_eq!(m("/w/mk", true), Marketplace::Bind);
        assert!(matches!(m("/", true), Marketplace::Refused(_)));
        assert!(matches!(m("/h", true), Marketplace::Refused(_)));
        assert_eq!(m("/w/p/mk", true), Marketplace::Visible);
        assert!(matches!(m("/w/mk", false), Marketplace::Refused(_)));
        assert_eq!(m("/w", true), Marketplace::Refused("it holds the project"));
    }
}
