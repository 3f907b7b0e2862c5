//! The command line. claudebox's own options come first; everything after them goes to
//! claude unchanged (or is the command for `--exec`). Option names never take one of
//! claude's (`-n/--name`, `-r/--resume`, `-c`, `-p`, `-w` are claude's).

use std::ffi::OsString;

use clap::Parser;

use crate::network::NetworkChoice;

#[derive(Debug, Parser)]
#[command(
    name = "claudebox",
    version,
    about = "Run Claude Code in a per-project bubblewrap sandbox",
    long_about = "Run Claude Code in a per-project bubblewrap sandbox.\n\n\
        Arguments after claudebox's own options go to claude unchanged; use `--` when the \
        first of them could be read as a claudebox option.",
    args_override_self = true
)]
pub struct Cli {
    /// Print the mount table and the exact bwrap command line; change nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Run CMD [ARGS...] in the same sandbox instead of claude.
    #[arg(long)]
    pub exec: bool,

    /// Skip confirmations (allow the home directory or / as the project).
    #[arg(long)]
    pub yes: bool,

    /// Network: open (the host's, default), allowlist (only allowed hosts, through a
    /// proxy on the host) or none.
    #[arg(long, value_enum, value_name = "MODE")]
    pub network: Option<crate::network::ModeName>,

    /// Allow HOST in allowlist mode (repeatable): a name, `*.example.com` for its
    /// subdomains, `HOST:PORT` for one port. Implies --network allowlist.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_host: Vec<String>,

    /// Allowlist mode: also report each denied host on stderr (they always go to the
    /// project's network-denied.log).
    #[arg(long)]
    pub log_denied: bool,

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
    /// The command line's layer of network settings (the config file adds layers below it).
    pub fn network_choice(&self) -> NetworkChoice {
        NetworkChoice {
            mode: self.network,
            allow_hosts: self
                .allow_host
                .iter()
                .map(|h| (h.clone(), "--allow-host".to_string()))
                .collect(),
            source: if self.network.is_some() {
                "--network".to_string()
            } else {
                "--allow-host".to_string()
            },
        }
    }
}
