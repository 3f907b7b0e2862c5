//! The agents claudebox runs, as data: one row of [`AGENTS`] per agent, with what the
//! sandbox needs to know of it (its binary, its state directory and the variable that
//! moves it, the table of that directory's entries by class, the login's files and lock,
//! how a conversation is named and resumed, the hosts it needs). `--agent NAME` (or
//! `agent = "NAME"` in the config file) picks the row; the plan takes the rest from it.
//!
//! A third agent is a new row, its state table (a module like `codex_home`) and its
//! tests. What is not data yet: each state table's mounts are made by its own `overlays`
//! function (`claude_home::overlays`, `codex_home::overlays`), as the two directories
//! differ in shape (Claude's login is one file bound in place, Codex's is a symlink to a
//! shared directory).

use std::fmt;

/// Which agent runs inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AgentId {
    /// Anthropic's Claude Code (`claude`), the default.
    #[default]
    Claude,
    /// OpenAI's Codex CLI (`codex`), experimental.
    Codex,
}

impl AgentId {
    pub fn row(self) -> &'static Agent {
        match self {
            AgentId::Claude => &AGENTS[0],
            AgentId::Codex => &AGENTS[1],
        }
    }
    /// As the config file and `--agent` spell it.
    pub fn name(self) -> &'static str {
        self.row().name
    }
    pub fn parse(s: &str) -> Option<AgentId> {
        AGENTS.iter().find(|a| a.name == s).map(|a| a.id)
    }
}

/// Every agent's name, as `--agent` takes them.
pub fn names() -> Vec<&'static str> {
    AGENTS.iter().map(|a| a.name).collect()
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One agent.
pub struct Agent {
    pub id: AgentId,
    /// As `--agent` and the config file's `agent` spell it.
    pub name: &'static str,
    /// The program looked up on the host's PATH.
    pub binary: &'static str,
    /// How to install it, for the line when it is missing.
    pub install: &'static str,
    /// Its state directory, relative to the home.
    pub state_dir: &'static str,
    /// The variable that moves that directory (set inside to the path above).
    pub state_var: &'static str,
    /// The module holding the table of that directory's entries by class, each with why.
    pub table: &'static str,
    /// The login's files, shared by every sandbox.
    pub login_files: &'static [&'static str],
    /// The login's lock, and where it lives.
    pub login_lock: &'static str,
    /// How a conversation is named and resumed.
    pub conversations: &'static str,
    /// Hosts the agent needs in allowlist mode (HTTPS).
    pub hosts: &'static [&'static str],
    /// Whether `--session NAME` works with it yet.
    pub named_sessions: bool,
    /// Said by `--dry-run` about this agent.
    pub notes: &'static [&'static str],
}

/// Every agent claudebox knows.
pub const AGENTS: &[Agent] = &[
    Agent {
        id: AgentId::Claude,
        name: "claude",
        binary: "claude",
        install: "install Claude Code (npm install -g @anthropic-ai/claude-code, or the native \
                  installer) and make sure `claude` runs in this shell",
        state_dir: ".claude",
        state_var: "CLAUDE_CONFIG_DIR",
        table: "policy::claude_home::TABLE",
        login_files: &[".credentials.json"],
        login_lock: ".oauth_refresh.lock (a directory) in claudebox's login dir, \
                     CLAUDE_SECURESTORAGE_CONFIG_DIR inside",
        conversations: "a session id claude takes on its command line (--session-id); \
                        resumed with --resume ID",
        hosts: crate::policy::network::DEFAULT_HOSTS,
        named_sessions: true,
        notes: &[],
    },
    Agent {
        id: AgentId::Codex,
        name: "codex",
        binary: "codex",
        install: "install OpenAI's Codex CLI (npm install -g @openai/codex) and make sure \
                  `codex` runs in this shell",
        state_dir: ".codex",
        state_var: "CODEX_HOME",
        table: "policy::codex_home::TABLE",
        login_files: &["auth.json"],
        login_lock: "auth.json.lock (flock), beside auth.json in claudebox's codex-login dir",
        conversations: "a thread id codex chooses (exec --json prints thread.started); \
                        resumed with `codex resume ID` from any directory",
        hosts: CODEX_HOSTS,
        named_sessions: true,
        notes: &[
            "agent codex (experimental): ~/.codex is this project's own CODEX_HOME (sessions, \
             the SQLite databases, history, shell snapshots); your config.toml, AGENTS.md, \
             rules/, skills/, agents/, hooks.json are read-only in it",
            "agent codex: its login is claudebox's codex-login/auth.json, shared read-write \
             by every Codex sandbox (seeded from your ~/.codex/auth.json when it has none); \
             a refresh inside is not written back to ~/.codex",
            "agent codex: its app-server daemon and socket live in this sandbox's own pid \
             namespace and /tmp, so they end with it and never meet another sandbox's",
            "agent codex: Codex's own sandbox (bwrap + seccomp) and its --sandbox and approval \
             settings are yours and unchanged; it runs inside this one for an ordinary user, \
             not for root (a nested user namespace mapping uid 0 needs CAP_SETFCAP): as \
             root, choose Codex's --sandbox danger-full-access, this sandbox still holds",
        ],
    },
];

/// Hosts the Codex CLI needs: the API, the ChatGPT login and its token refresh.
pub const CODEX_HOSTS: &[&str] = &[
    "api.openai.com:443",
    "auth.openai.com:443",
    "chatgpt.com:443",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_found_by_its_id_and_name() {
        for a in AGENTS {
            assert_eq!(a.id.row().name, a.name);
            assert_eq!(AgentId::parse(a.name), Some(a.id));
        }
        assert_eq!(AgentId::parse("gemini"), None);
    }
}
