//! The command line. claudebox's own options come first; everything after them goes to
//! claude unchanged (or is the command for `--exec`). Option names never take one of
//! claude's (`-n/--name`, `-r/--resume`, `-c`, `-p`, `-w` are claude's).

use std::ffi::OsString;

use clap::Parser;

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

    /// Forward the host's ssh agent ($SSH_AUTH_SOCK) into the sandbox: the agent can then
    /// use (not read) your ssh keys, e.g. to push, for as long as it runs.
    #[arg(long)]
    pub ssh_agent: bool,

    /// Leave the project's code-bearing config writable: .git/hooks, .git/config (and the
    /// worktree and submodule equivalents), core.hooksPath, .envrc, .vscode, .idea. Tools on
    /// the host run code from these.
    #[arg(long)]
    pub writable_project_config: bool,

    /// Arguments for claude (or, with --exec, the command and its arguments).
    #[arg(
        value_name = "CLAUDE_ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(OsString)
    )]
    pub args: Vec<OsString>,
}
