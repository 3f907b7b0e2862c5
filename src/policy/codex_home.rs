//! `~/.codex` (Codex's `CODEX_HOME`) inside the sandbox as data: one row per entry of the
//! user's real Codex directory with its class and why ([`TABLE`]), what the launch found
//! on the host ([`HostCodex`]) and the group's mounts in order ([`overlays`], pure). The
//! I/O (the project's directory, its mount points, the login's symlink) is
//! `state::codex_home`.
//!
//! Measured with Codex 0.169.0 offline (strace, a fresh CODEX_HOME, `exec` with a shell
//! call, `login --with-api-key`): Codex keeps whole conversations in six SQLite databases
//! beside `sessions/`, so isolating only `sessions/` leaks other projects' threads; and it
//! writes `config.toml` and `auth.json` by temp file + rename, which fails (EBUSY) on a
//! single-file bind. So inside, `~/.codex` is the project's own directory
//! (`projects/<id>/codex-home/`, read-write, shared by the project's sandboxes) with the
//! user's setup bound read-only over it, and `auth.json` a symlink into claudebox's
//! `codex-login/` directory: Codex writes beside a symlink's target, so one login (and its
//! `auth.json.lock`) serves every Codex sandbox.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::policy::claude_home::{Class, Kind, Overlay};
use crate::policy::layout::ProjectState;

pub struct CodexEntry {
    pub name: &'static str,
    pub kind: Kind,
    pub class: Class,
    pub why: &'static str,
}

const fn row(name: &'static str, kind: Kind, class: Class, why: &'static str) -> CodexEntry {
    CodexEntry {
        name,
        kind,
        class,
        why,
    }
}

use Class::*;
use Kind::*;

/// Every entry of `~/.codex` claudebox knows. An entry of the real directory that no row
/// names is not shown (the project's directory is the base: what Codex writes is its own).
#[rustfmt::skip]
pub const TABLE: &[CodexEntry] = &[
    // The setup: what Codex reads and runs without asking.
    row("config.toml", File, Setup, "user config: model providers, MCP servers, sandbox and approval settings, notify commands"),
    row("AGENTS.md", File, Setup, "user instructions: part of every prompt"),
    row("AGENTS.override.md", File, Setup, "user instructions that replace AGENTS.md"),
    row("rules", Dir, Setup, "execution policy rules: which commands run without asking"),
    row("agents", Dir, Setup, "user subagents: prompts"),
    row("hooks.json", File, Setup, "hooks: commands Codex runs on events"),
    row("environments.toml", File, Setup, "environments: setup commands"),
    row(".env", File, Setup, "variables Codex loads into its environment"),
    row("prompts", Dir, Setup, "user prompts (slash commands)"),
    row("skills", Dir, Setup, "user skills: prompts and scripts (Codex's bundled .system skills, unpacked here at start, are skipped when it cannot: measured, 0.169.0)"),
    // Written while Codex works: the project's own directory holds them.
    row("sessions", Dir, Project, "conversations: rollout-*.jsonl per thread"),
    row("archived_sessions", Dir, Project, "archived conversations (moved by rename from sessions/)"),
    row("history.jsonl", File, Project, "prompt history (no cwd in it: every project's would mix)"),
    row("state_5.sqlite", File, Project, "threads: ids, cwd, rollout paths"),
    row("thread_history_1.sqlite", File, Project, "the whole text of every conversation"),
    row("logs_2.sqlite", File, Project, "logs"),
    row("memories_1.sqlite", File, Project, "memories"),
    row("goals_1.sqlite", File, Project, "goals"),
    row("queue_1.sqlite", File, Project, "queued messages"),
    row("shell_snapshots", Dir, Project, "shell environment snapshots, sourced before commands"),
    row("thread-writer-locks", Dir, Project, "one writer per thread"),
    row("installation_id", File, Project, "an id sent with every request"),
    row(".sandbox_migration", File, Project, "a one-time migration marker"),
    row("log", Dir, Project, "logs"),
    row("tmp", Dir, Project, "arg0 helper links (apply_patch, codex-linux-sandbox), reaped at each start"),
    row(".tmp", Dir, Project, "plugin marketplace sync"),
    row("packages", Dir, Project, "the TUI's copy of its distribution for the app-server daemon (~410 MB)"),
    row("app-server-daemon", Dir, Project, "the daemon's pid files (its socket is in the sandbox's own /tmp)"),
    row("auth.lock", File, Project, "a lock Codex takes beside CODEX_HOME's auth.json link"),
    // One login.
    row("auth.json", File, Login, "the login: an API key or ChatGPT tokens, refreshed by any codex"),
];

/// Setup entries that get an empty read-only stand-in when the host has none: those Codex
/// runs or prompts from, so that nothing the agent writes there takes their place.
fn placeholder(name: &str) -> bool {
    matches!(
        name,
        "config.toml"
            | "AGENTS.md"
            | "AGENTS.override.md"
            | "rules"
            | "agents"
            | "hooks.json"
            | "environments.toml"
            | ".env"
            | "prompts"
            | "skills"
    )
}

pub fn entry(name: &str) -> Option<&'static CodexEntry> {
    TABLE.iter().find(|e| e.name == name)
}

/// What the launch found of the user's Codex directory on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostCodex {
    /// The real directory: `$CODEX_HOME` when the host sets it, else `~/.codex`.
    pub dir: PathBuf,
    /// Its entries, sorted by name, each with whether it is a directory.
    pub entries: Vec<(OsString, bool)>,
}

/// The file name of the login inside `codex-login/`.
pub const LOGIN_FILE: &str = "auth.json";

/// The `~/.codex` group, in mount order: the project's directory, the Setup entries
/// read-only over it (empty stand-ins where the host has none), the login's directory.
/// The `auth.json` symlink into it is made on the host (`state::codex_home`). Pure.
pub fn overlays(home: &Path, host: &HostCodex, st: &ProjectState) -> Vec<Overlay> {
    let inside = home.join(".codex");
    let mut v = vec![Overlay::Bind {
        source: st.codex_home(),
        target: inside.clone(),
        writable: true,
        file: false,
        why: "this project's ~/.codex (claudebox state): sessions, the SQLite databases, \
              history, shell snapshots"
            .into(),
    }];
    let on_host = |name: &str| host.entries.iter().find(|(n, _)| n == name);
    for e in TABLE.iter().filter(|e| e.class == Setup) {
        let target = inside.join(e.name);
        match on_host(e.name) {
            Some((_, is_dir)) if *is_dir == (e.kind == Dir) => v.push(Overlay::Bind {
                source: host.dir.join(e.name),
                target,
                writable: false,
                file: e.kind == File,
                why: format!("your setup, read-only: {}", e.why),
            }),
            _ if placeholder(e.name) => {
                let why = format!("empty and read-only, as you have none: {}", e.why);
                v.push(match e.kind {
                    Dir => Overlay::EmptyDir { target, why },
                    File => Overlay::Bind {
                        // Codex parses hooks.json as JSON at every start: an empty file
                        // made it warn "failed to parse hooks config" (0.169, 0.171).
                        source: if e.name == "hooks.json" {
                            st.empty_json()
                        } else {
                            st.empty_file()
                        },
                        target,
                        writable: false,
                        file: true,
                        why,
                    },
                })
            }
            _ => {}
        }
    }
    let login = st.codex_login_dir();
    v.push(Overlay::Bind {
        source: login.clone(),
        target: login,
        writable: true,
        file: false,
        why: "Codex's login, shared by every Codex sandbox: auth.json (~/.codex/auth.json \
              is a symlink to it) and its lock"
            .into(),
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st() -> ProjectState {
        ProjectState {
            dir: PathBuf::from("/h/.claudebox/projects/p1"),
        }
    }

    #[test]
    fn the_setup_is_read_only_and_missing_setup_is_covered() {
        let host = HostCodex {
            dir: "/h/.codex".into(),
            entries: vec![
                ("config.toml".into(), false),
                ("rules".into(), true),
                ("sessions".into(), true),
                ("state_5.sqlite".into(), false),
            ],
        };
        let v = overlays(Path::new("/h"), &host, &st());
        let target = |o: &Overlay| match o {
            Overlay::Bind { target, .. }
            | Overlay::EmptyDir { target, .. }
            | Overlay::Tmpfs { target, .. } => target.clone(),
        };
        // The host's conversations and databases are never a source.
        for o in &v {
            if let Overlay::Bind { source, .. } = o {
                assert!(!source.starts_with("/h/.codex/sessions"), "{o:?}");
                assert!(!source.ends_with("state_5.sqlite"), "{o:?}");
            }
        }
        assert!(
            matches!(&v[0], Overlay::Bind { writable: true, target, .. } if target == Path::new("/h/.codex"))
        );
        for name in ["config.toml", "rules", "hooks.json", "AGENTS.md"] {
            let o = v
                .iter()
                .find(|o| target(o) == Path::new("/h/.codex").join(name))
                .unwrap_or_else(|| panic!("{name} not covered"));
            assert!(
                !matches!(o, Overlay::Bind { writable: true, .. }),
                "{name} writable"
            );
        }
        assert!(
            matches!(v.last(), Some(Overlay::Bind { writable: true, target, .. }) if target.ends_with("codex-login"))
        );
    }

    #[test]
    fn every_setup_row_that_runs_or_prompts_has_a_stand_in() {
        for e in TABLE.iter().filter(|e| e.class == Setup) {
            assert!(placeholder(e.name), "{}", e.name);
        }
    }
}
