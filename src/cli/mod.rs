//! The command line. claudebox's own options come first; everything after them goes to
//! claude unchanged (or is the command for `--exec`). Option names never take one of
//! claude's (`-n/--name`, `-r/--resume`, `-c`, `-p`, `-w` are claude's).

pub mod complete;
pub mod man;
pub mod shell;
pub mod typo;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;

use crate::policy::network::{ModeName, NetworkChoice};
use crate::policy::settings::CliRequest;

#[derive(Debug, Parser)]
#[command(
    name = "claudebox",
    disable_version_flag = true,
    about = "Run Claude Code in a per-project bubblewrap sandbox",
    long_about = "Run Claude Code in a per-project bubblewrap sandbox.\n\n\
        Arguments after claudebox's own options go to claude unchanged; use `--` when the \
        first of them could be read as a claudebox option. `--version` goes to claude \
        (claude's version, from inside the sandbox); `claudebox -- --help` shows claude's help.",
    after_long_help = "Configuration: $XDG_CONFIG_HOME/claudebox/config.toml \
        (default ~/.config/claudebox/config.toml) can list the same things as --ro, --rw, \
        --hide, --env, --network, --allow-host, --forward-port, --ssh-agent, --writable-project-config, \
        --writable-claude-setup, --gpu, --memory, --pids, --cpu and --gc-margin, default arguments \
        for claude, and [[project]] sections for one project. The command line wins over the \
        file. Nothing inside a project is read as configuration.\n\n\
        Shell integration: `claudebox completions bash|zsh|fish` prints a completion \
        script; `claudebox manpage` prints this manual page (roff).\n\n\
        Every option, config key, environment variable and exit status: docs/reference.md \
        in claudebox's source, and the man page.",
    args_override_self = true
)]
pub struct Cli {
    /// Print the mount table and the exact bwrap command line; change nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Run CMD [ARGS...] in the same sandbox instead of claude.
    #[arg(long)]
    pub exec: bool,

    /// Run claude as the named session NAME: its own conversation, resumed from any
    /// directory or worktree of the project (created the first time).
    #[arg(long, value_name = "NAME", conflicts_with = "exec", value_parser = clap::value_parser!(OsString))]
    pub session: Option<OsString>,

    /// Forget the named session NAME of this project (its conversation transcript stays).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["session", "exec", "args"], value_parser = clap::value_parser!(OsString))]
    pub forget: Option<OsString>,

    /// Put back what the exit review moved aside, by the ID its line printed.
    #[arg(long, value_name = "ID", conflicts_with_all = ["session", "exec", "args", "forget", "dry_run"], value_parser = clap::value_parser!(OsString))]
    pub restore: Option<OsString>,

    /// Copy a conversation of this directory from bare claude (~/.claude/projects) into
    /// claudebox's state, where `claudebox --resume UUID` (and `-c`) continues it; without
    /// UUID the newest. A copy: bare claude keeps its own.
    #[arg(long, value_name = "UUID", num_args = 0..=1, conflicts_with_all = ["session", "exec", "args", "forget", "restore", "dry_run", "export_conversation"])]
    pub import_conversation: Option<Option<String>>,

    /// Copy a conversation of this directory from claudebox's state to bare claude
    /// (~/.claude/projects), where `claude --resume UUID` on the host continues it; without
    /// UUID the newest. A copy: claudebox keeps its own.
    #[arg(long, value_name = "UUID", num_args = 0..=1, conflicts_with_all = ["session", "exec", "args", "forget", "restore", "dry_run"])]
    pub export_conversation: Option<Option<String>>,

    /// Skip confirmations (allow the home directory or / as the project).
    #[arg(long)]
    pub yes: bool,

    /// Print claudebox's own version (`--version` is claude's).
    #[arg(long)]
    pub claudebox_version: bool,

    /// Also bind PATH read-only, at the same path (repeatable).
    #[arg(long, value_name = "PATH", value_parser = clap::value_parser!(PathBuf))]
    pub ro: Vec<PathBuf>,

    /// Also bind PATH read-write, at the same path (repeatable).
    #[arg(long, value_name = "PATH", value_parser = clap::value_parser!(PathBuf))]
    pub rw: Vec<PathBuf>,

    /// Show an empty directory (or file) at PATH instead of its contents (repeatable).
    #[arg(long, value_name = "PATH", value_parser = clap::value_parser!(PathBuf))]
    pub hide: Vec<PathBuf>,

    /// Set NAME=VALUE inside, or pass the host's NAME explicitly (repeatable).
    #[arg(long, value_name = "NAME[=VALUE]", value_parser = clap::value_parser!(OsString))]
    pub env: Vec<OsString>,

    /// No network at all (same as --network none).
    #[arg(long, conflicts_with = "network")]
    pub no_network: bool,

    /// Forward the host's ssh agent ($SSH_AUTH_SOCK) into the sandbox: the agent can then
    /// use (not read) your ssh keys, e.g. to push, for as long as it runs.
    #[arg(long)]
    pub ssh_agent: bool,

    /// Leave the project's code-bearing config writable: .git/hooks, .git/config (and the
    /// worktree, submodule and nested-repository equivalents), core.hooksPath, .envrc,
    /// .vscode, .idea, .codex, .claude, .mcp.json, .husky, lefthook and pre-commit config,
    /// .gitmodules, .devcontainer. Tools on the host run code from these.
    #[arg(long)]
    pub writable_project_config: bool,

    /// Leave your Claude Code setup in ~/.claude writable (settings.json, hooks, commands,
    /// agents, skills, plugins, CLAUDE.md, ...), to change it from inside. Claude on the
    /// host and in every other sandbox runs what is written there.
    #[arg(long)]
    pub writable_claude_setup: bool,

    /// Give the agent this machine's GPUs (CUDA, ROCm): the NVIDIA, DRM and AMD KFD device
    /// nodes that exist, and read-only the parts of /sys their drivers read; nothing else
    /// of /dev or /sys. The agent can then use the GPU driver's whole interface. Also
    /// `gpu = true` in the config file.
    #[arg(long)]
    pub gpu: bool,

    /// Which agent runs inside: claude (Claude Code, the default) or codex (OpenAI's Codex
    /// CLI, experimental: its own ~/.codex per project, your setup read-only, one shared
    /// login). Also `agent = "codex"` in the config file, per project too.
    #[arg(long, value_name = "NAME", value_enum)]
    pub agent: Option<crate::policy::agent::AgentId>,

    /// Bound the memory of the whole sandbox to SIZE (e.g. 8G; swap none): past it the
    /// sandbox is ended. `max` for none. Also `memory` in the config file.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,

    /// Bound the processes and threads of the whole sandbox to N (default 4096, so a fork
    /// bomb cannot take the machine; `max` for none). Also `pids` in the config file.
    #[arg(long, value_name = "N")]
    pub pids: Option<String>,

    /// Bound the CPU time of the whole sandbox to FRACTION CPUs (e.g. 1.5 or 150%; `max`
    /// for none). Also `cpu` in the config file.
    #[arg(long, value_name = "FRACTION")]
    pub cpu: Option<String>,

    /// Check whether this machine can run claudebox (bwrap, user namespaces, a nested
    /// sandbox, claude, credentials, state; with --gpu, the GPU device nodes); exit
    /// non-zero when a check fails.
    #[arg(long, conflicts_with_all = ["gc", "list", "exec", "dry_run", "args"])]
    pub check: bool,

    /// Print the AppArmor profile that lets the bwrap claudebox uses create user
    /// namespaces on Ubuntu 23.10 and later, for /etc/apparmor.d/claudebox-bwrap:
    /// `claudebox --apparmor-profile | sudo tee /etc/apparmor.d/claudebox-bwrap &&
    /// sudo apparmor_parser -r /etc/apparmor.d/claudebox-bwrap` (--check says if it is loaded).
    #[arg(long, conflicts_with_all = ["check", "gc", "list", "exec", "dry_run", "args", "session", "forget"])]
    pub apparmor_profile: bool,

    /// Remove the state of projects whose root no longer exists (with --dry-run: only say
    /// what would be removed).
    #[arg(long, conflicts_with_all = ["list", "exec", "args"])]
    pub gc: bool,

    /// With --gc (and --list): how long a project's root must have been seen missing, and
    /// the project unused, before --gc removes its state (e.g. `14d`, `12h`, `0` for at
    /// once). Default: `gc_margin` in the config file, else 7 days.
    #[arg(long, value_name = "DURATION", conflicts_with_all = ["exec", "args", "session", "forget", "check"])]
    pub gc_margin: Option<String>,

    /// List the state of every project: root, last use, running sandboxes (with
    /// --sizes, the size of each).
    #[arg(long, conflicts_with_all = ["exec", "dry_run", "args", "session", "forget"])]
    pub list: bool,

    /// With --list: print JSON for scripts.
    #[arg(long, requires = "list")]
    pub json: bool,

    /// With --list: also the size on disk of each project's state, counted whole however
    /// deep, and everything read from the state itself rather than from the summary the
    /// last sandbox left (walks all of it: ~1.4 s for 10,000 projects, where --list alone
    /// takes ~0.25 s).
    #[arg(long, requires = "list")]
    pub sizes: bool,

    /// Network: open (the host's, default), allowlist (only allowed hosts, through a
    /// proxy on the host) or none.
    #[arg(long, value_enum, value_name = "MODE")]
    pub network: Option<crate::policy::network::ModeName>,

    /// Allow HOST in allowlist mode (repeatable): a name, `*.example.com` for its
    /// subdomains, `HOST:PORT` for one port. Implies --network allowlist.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_host: Vec<String>,

    /// Bring the host's loopback port PORT into an allowlist or none sandbox, at the same
    /// port inside (repeatable): a dev database, a local LLM gateway, an MCP server. PORT,
    /// or 127.0.0.1:PORT / [::1]:PORT for one address; nothing else of the host's loopback.
    #[arg(long = "forward-port", value_name = "PORT")]
    pub forward_port: Vec<String>,

    /// Allowlist mode: also report each denied host on stderr (they always go to the
    /// project's network-denied.log), and in any mode each request the login broker refused.
    #[arg(long)]
    pub log_denied: bool,

    /// Keep the OAuth login (or ANTHROPIC_API_KEY, or your apiKeyHelper's key) on the
    /// host: the sandbox gets a stand-in and the host-side proxy swaps it for the real
    /// one on the way to api.anthropic.com (every network mode; see docs/security.md). The default when
    /// there is a login to lend; this fails when there is none.
    #[arg(long, overrides_with = "no_login_broker")]
    pub login_broker: bool,

    /// Share the login with the sandbox instead, as before the broker (the file bound
    /// read-write, the credentials sync, ANTHROPIC_API_KEY passed in).
    #[arg(long, overrides_with = "login_broker")]
    pub no_login_broker: bool,

    /// Arguments for claude (or, with --exec, the command and its arguments).
    #[arg(
        value_name = "CLAUDE_ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(OsString)
    )]
    pub args: Vec<OsString>,
}

impl Cli {
    /// The options that add to or override the config file.
    pub fn request(&self) -> CliRequest {
        CliRequest {
            ro: self.ro.clone(),
            rw: self.rw.clone(),
            hide: self.hide.clone(),
            env: self.env.clone(),
            network: self.network_choice(),
            ssh_agent: self.ssh_agent,
            writable_project_config: self.writable_project_config,
            writable_claude_setup: self.writable_claude_setup,
            gpu: self.gpu,
            login_broker: if self.login_broker {
                Some(true)
            } else if self.no_login_broker {
                Some(false)
            } else {
                None
            },
            agent: self.agent,
            limits: [
                (crate::policy::limits::Kind::Memory, &self.memory),
                (crate::policy::limits::Kind::Pids, &self.pids),
                (crate::policy::limits::Kind::Cpu, &self.cpu),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.clone()?)))
            .collect(),
        }
    }

    /// The command line's layer of network settings (the config file adds layers below it).
    pub fn network_choice(&self) -> NetworkChoice {
        NetworkChoice {
            mode: if self.no_network {
                Some(ModeName::None)
            } else {
                self.network
            },
            allow_hosts: self
                .allow_host
                .iter()
                .map(|h| (h.clone(), "--allow-host".to_string()))
                .collect(),
            forward_ports: self
                .forward_port
                .iter()
                .map(|p| (p.clone(), crate::policy::forward::FLAG.to_string()))
                .collect(),
            source: if self.no_network {
                "--no-network".to_string()
            } else if self.network.is_some() {
                "--network".to_string()
            } else if !self.allow_host.is_empty() {
                "--allow-host".to_string()
            } else {
                crate::policy::forward::FLAG.to_string()
            },
        }
    }
}

/// A clap error as one line, for the hidden roles (the step inside, the proxy): their
/// argv is rendered by claudebox, so a bad one is a bug or a hand-made line, not a user's
/// typo that needs clap's usage text.
pub fn one_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("bad arguments");
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// What claudebox does, chosen once from the parsed command line.
#[derive(Debug, PartialEq, Eq)]
pub enum Mode<'a> {
    /// `--claudebox-version`.
    Version,
    /// `--check`.
    Check,
    /// `--apparmor-profile`.
    AppArmorProfile,
    /// `--gc` (with `--dry-run`: only say what would go).
    Gc {
        dry_run: bool,
        margin: Option<&'a str>,
    },
    /// `--list`.
    List {
        json: bool,
        margin: Option<&'a str>,
        sizes: bool,
    },
    /// `--forget NAME`.
    Forget { name: &'a OsString, dry_run: bool },
    /// `--restore ID`.
    Restore(&'a OsString),
    /// `--import-conversation [UUID]`, `--export-conversation [UUID]`.
    Cross {
        way: crate::state::crossing::Way,
        uuid: Option<&'a str>,
    },
    /// A launch (claude, or `--exec`'s command); with `--dry-run` only printed.
    Launch { dry_run: bool },
}

impl Cli {
    /// The one mode this command line asks for, or why the combination makes no sense
    /// (what clap's conflicts cannot say).
    pub fn mode(&self) -> anyhow::Result<Mode<'_>> {
        let margin = self.gc_margin.as_deref();
        if self.claudebox_version {
            return Ok(Mode::Version);
        }
        if self.check {
            return Ok(Mode::Check);
        }
        if self.apparmor_profile {
            return Ok(Mode::AppArmorProfile);
        }
        if margin.is_some() && !self.gc && !self.list {
            anyhow::bail!("--gc-margin goes with --gc or --list (see claudebox --help)");
        }
        Ok(if self.gc {
            Mode::Gc {
                dry_run: self.dry_run,
                margin,
            }
        } else if self.list {
            Mode::List {
                json: self.json,
                margin,
                sizes: self.sizes,
            }
        } else if let Some(uuid) = &self.import_conversation {
            Mode::Cross {
                way: crate::state::crossing::Way::Import,
                uuid: uuid.as_deref(),
            }
        } else if let Some(uuid) = &self.export_conversation {
            Mode::Cross {
                way: crate::state::crossing::Way::Export,
                uuid: uuid.as_deref(),
            }
        } else if let Some(id) = &self.restore {
            Mode::Restore(id)
        } else if let Some(name) = &self.forget {
            Mode::Forget {
                name,
                dry_run: self.dry_run,
            }
        } else {
            Mode::Launch {
                dry_run: self.dry_run,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(args: &[&str]) -> String {
        let cli =
            Cli::try_parse_from(std::iter::once("claudebox").chain(args.iter().copied())).unwrap();
        match cli.mode() {
            Ok(m) => format!("{m:?}"),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn one_mode_per_command_line() {
        assert_eq!(mode_of(&[]), "Launch { dry_run: false }");
        assert_eq!(
            mode_of(&["--dry-run", "--exec", "sh"]),
            "Launch { dry_run: true }"
        );
        assert_eq!(mode_of(&["--check"]), "Check");
        assert_eq!(mode_of(&["--apparmor-profile"]), "AppArmorProfile");
        assert_eq!(mode_of(&["--claudebox-version", "--check"]), "Version");
        assert_eq!(
            mode_of(&["--gc", "--dry-run", "--gc-margin", "0"]),
            "Gc { dry_run: true, margin: Some(\"0\") }"
        );
        assert_eq!(
            mode_of(&["--list", "--json"]),
            "List { json: true, margin: None, sizes: false }"
        );
        assert_eq!(
            mode_of(&["--forget", "x"]),
            "Forget { name: \"x\", dry_run: false }"
        );
        assert!(mode_of(&["--gc-margin", "1d"]).starts_with("error: --gc-margin goes with"));
        assert_eq!(
            mode_of(&["--import-conversation"]),
            "Cross { way: Import, uuid: None }"
        );
        assert_eq!(
            mode_of(&["--export-conversation", "u"]),
            "Cross { way: Export, uuid: Some(\"u\") }"
        );
    }
}
