//! The on-disk state's layout as data: the names in a project's state directory and the
//! paths of one project's state (`~/.claudebox/projects/<id>/`). Pure; `state` does the I/O.

use std::path::{Path, PathBuf};

pub const ROOT_FILE: &str = "project-root";
pub const CONVERSATIONS_DIR: &str = "claude-projects";
pub const HISTORY_FILE: &str = "history.jsonl";
pub const CLAUDE_CONFIG_DIR: &str = "claude-config";
pub const CLAUDE_JSON_BASE: &str = "claude-json-host.json";
pub const LOGIN_DIR: &str = "login";
/// The project's own `~/.codex` (`--agent codex`, see `codex_home`).
pub const CODEX_HOME_DIR: &str = "codex-home";
/// Codex's login, shared by every project: `<state home>/codex-login`.
pub const CODEX_LOGIN_DIR: &str = "codex-login";
/// The project's own `~/.claude/plugins/data` (see `claude_home::WITHIN`).
pub const PLUGIN_DATA_DIR: &str = "claude-plugin-data";
pub const LOCK_FILE: &str = "lock";
/// What the exit review moved aside, one directory per entry (`claudebox --restore ID`).
pub const QUARANTINE_DIR: &str = "quarantine";
/// One record per running launch whose exit review is still to come.
pub const REVIEW_PENDING_DIR: &str = "review-pending";
pub const SESSIONS_DIR: &str = "sessions";
pub const EMPTY_FILE: &str = "empty";
pub const EMPTY_JSON_FILE: &str = "empty.json";
pub const DENIED_LOG: &str = "network-denied.log";
/// The sandbox's `.claude/settings.local.json` (see `protect::Guard::LocalSettings`).
pub const LOCAL_SETTINGS_FILE: &str = "claude-settings.local.json";
/// The project's package caches (see `caches::TABLE`).
pub const CACHES_DIR: &str = "caches";
/// The sandbox's `.claude/.gitignore` (see `protected::Guard::GitIgnore`).
pub const CLAUDE_GITIGNORE_FILE: &str = "claude-dir.gitignore";
/// The project's copy of the user's `settings.json` (see `ProjectState::user_settings`).
pub const USER_SETTINGS_FILE: &str = "claude-settings.json";
/// In the state home: the Bypass Permissions dialog was accepted (see
/// `ProjectState::bypass_consent`).
pub const BYPASS_CONSENT_FILE: &str = "claude-bypass-accepted";
/// The mount point of the file system the project's root was on at its last launch (raw
/// bytes): `--gc` counts a missing root as unknown while that file system is not mounted.
pub const ROOT_MOUNT_FILE: &str = "root-mount";
/// What `--list` shows of the project that only its sandboxes change, as the last one to
/// end left it (`inventory::Summary`).
pub const LIST_SUMMARY_FILE: &str = "list-summary.json";
/// When `--gc` first found the project's root missing (seconds since the epoch).
pub const MISSING_FILE: &str = "root-missing-since";
/// Prefix of a project directory being made (renamed into place when whole).
pub const NEW_PREFIX: &str = ".new-";

/// The paths of one project's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectState {
    pub dir: PathBuf,
}

impl ProjectState {
    pub fn root_file(&self) -> PathBuf {
        self.dir.join(ROOT_FILE)
    }
    pub fn conversations(&self) -> PathBuf {
        self.dir.join(CONVERSATIONS_DIR)
    }
    pub fn history(&self) -> PathBuf {
        self.dir.join(HISTORY_FILE)
    }
    /// The login's directory, shared by every project: `<state home>/login` (claude's
    /// `CLAUDE_SECURESTORAGE_CONFIG_DIR` inside, see `claude_home`).
    pub fn login_dir(&self) -> PathBuf {
        let home = self
            .dir
            .parent()
            .and_then(Path::parent)
            .unwrap_or(&self.dir);
        home.join(LOGIN_DIR)
    }
    /// Codex's login directory, shared by every project: `<state home>/codex-login`
    /// (see `codex_home`).
    pub fn codex_login_dir(&self) -> PathBuf {
        let home = self
            .dir
            .parent()
            .and_then(Path::parent)
            .unwrap_or(&self.dir);
        home.join(CODEX_LOGIN_DIR)
    }
    /// Mounted at `~/.codex` with `--agent codex` (see `codex_home`).
    pub fn codex_home(&self) -> PathBuf {
        self.dir.join(CODEX_HOME_DIR)
    }
    /// Mounted at `~/.claude` (see `claude_home`).
    pub fn claude_config(&self) -> PathBuf {
        self.dir.join(CLAUDE_CONFIG_DIR)
    }
    /// The project's `.claude.json` (`CLAUDE_CONFIG_DIR` inside points at its dir).
    pub fn claude_json(&self) -> PathBuf {
        self.claude_config().join(".claude.json")
    }
    /// Who holds claude's lock of the project's `.claude.json` for a launch.
    pub fn claude_json_lock_owner(&self) -> PathBuf {
        self.dir.join("claude-json-lock-owner")
    }
    /// The host's `.claude.json` as last synced, for the next three-way merge.
    pub fn claude_json_base(&self) -> PathBuf {
        self.dir.join(CLAUDE_JSON_BASE)
    }
    pub fn lock(&self) -> PathBuf {
        self.dir.join(LOCK_FILE)
    }
    pub fn sessions(&self) -> PathBuf {
        self.dir.join(SESSIONS_DIR)
    }
    /// The user's settings.json with the login broker's stand-in `apiKeyHelper`, mounted
    /// read-only at `~/.claude/settings.json` (written by each launch that lends a helper).
    pub fn broker_settings(&self) -> PathBuf {
        self.dir.join("broker-settings.json")
    }
    /// Mounted read-only over each hidden file (`hide`).
    pub fn empty_file(&self) -> PathBuf {
        self.dir.join(EMPTY_FILE)
    }
    /// `{}`, read-only: the stand-in for a missing setup file read as JSON (Codex's
    /// `hooks.json`).
    pub fn empty_json(&self) -> PathBuf {
        self.dir.join(EMPTY_JSON_FILE)
    }
    pub fn quarantine(&self) -> PathBuf {
        self.dir.join(QUARANTINE_DIR)
    }
    pub fn review_pending(&self) -> PathBuf {
        self.dir.join(REVIEW_PENDING_DIR)
    }
    /// Hosts the allowlist proxy refused.
    pub fn denied_log(&self) -> PathBuf {
        self.dir.join(DENIED_LOG)
    }
    /// The sandbox's `.claude/settings.local.json` (see `protect::Guard::LocalSettings`).
    pub fn local_settings(&self) -> PathBuf {
        self.dir.join(LOCAL_SETTINGS_FILE)
    }
    /// A package cache of the project (see `caches::TABLE`), mounted at its path.
    pub fn cache(&self, name: &str) -> PathBuf {
        self.dir.join(CACHES_DIR).join(name)
    }
    /// The sandbox's `.claude/.gitignore` (see `protected::Guard::GitIgnore`).
    pub fn claude_gitignore(&self) -> PathBuf {
        self.dir.join(CLAUDE_GITIGNORE_FILE)
    }
    /// The project's copy of the user's `~/.claude/settings.json`, mounted read-write at
    /// `~/.claude/settings.json` (see `claude_home::SETTINGS_COPY_WHY`).
    pub fn user_settings(&self) -> PathBuf {
        self.dir.join(USER_SETTINGS_FILE)
    }
    /// `<state home>/claude-bypass-accepted`: the user accepted Claude Code's Bypass
    /// Permissions dialog in a sandbox (see `claude_home::BYPASS_KEY`). Never mounted.
    pub fn bypass_consent(&self) -> PathBuf {
        let home = self
            .dir
            .parent()
            .and_then(Path::parent)
            .unwrap_or(&self.dir);
        home.join(BYPASS_CONSENT_FILE)
    }
}
