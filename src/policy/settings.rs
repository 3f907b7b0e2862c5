//! The data types of what the user asked for (config file and command line), resolved by
//! `config::settings` and read by the plan.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::policy::network::{NetworkChoice, NetworkMode};
use crate::policy::origin::Origin;

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
    /// The network mode in force: the layers (config top level, matching project sections,
    /// the command line) merged by `network::resolve`.
    pub network: NetworkMode,
    /// Where the last layer that named a mode or hosts came from.
    pub network_origin: Origin,
    /// Forwarded host ports (`--forward-port`, `forward_ports`), every layer's, each with
    /// where it came from (see `policy::forward`).
    pub forward_ports: Vec<crate::policy::network::HostEntry>,
    pub claude_args: Vec<ClaudeArgs>,
    /// Opt-in: forward the host's ssh agent, and where that was asked for.
    pub ssh_agent: Option<Origin>,
    /// Opt-out of the project write protection, and where that was asked for.
    pub writable_project_config: Option<Origin>,
    /// Opt-out of the read-only Claude Code setup, and where that was asked for.
    pub writable_claude_setup: Option<Origin>,
    /// Opt-in: the GPUs' device nodes and the /sys parts drivers read (see `gpu`).
    pub gpu: Option<Origin>,
    /// `--login-broker` / `--no-login-broker`, the config file's `login_broker`: asked for
    /// or refused, and where (none: the default, on when there is a login to lend).
    pub login_broker: Option<(bool, Origin)>,
    /// `--memory`, `--pids`, `--cpu` and their config keys, the last layer winning.
    pub limits: crate::policy::limits::Requested,
    /// `--agent`, the config file's `agent`: which agent runs, and where that was asked
    /// for (none: Claude Code, the default).
    pub agent: Option<(crate::policy::agent::AgentId, Origin)>,
}

/// What claudebox's own command-line options ask for.
#[derive(Debug, Clone, Default)]
pub struct CliRequest {
    pub ro: Vec<PathBuf>,
    pub rw: Vec<PathBuf>,
    pub hide: Vec<PathBuf>,
    pub env: Vec<OsString>,
    pub network: NetworkChoice,
    pub ssh_agent: bool,
    pub writable_project_config: bool,
    pub writable_claude_setup: bool,
    pub gpu: bool,
    /// `--login-broker` (true) or `--no-login-broker` (false).
    pub login_broker: Option<bool>,
    /// `--agent`.
    pub agent: Option<crate::policy::agent::AgentId>,
    /// `--memory`, `--pids`, `--cpu` as written.
    pub limits: Vec<(crate::policy::limits::Kind, String)>,
}
