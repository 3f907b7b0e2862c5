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

    /// Check whether this machine can run claudebox (bwrap, user namespaces, a nested
    /// sandbox, claude, credentials, state); exit non-zero when a check fails.
    #[arg(long, conflicts_with_all = ["gc", "list", "exec", "dry_run", "args"])]
    pub check: bool,

    /// Remove the state of projects whose root no longer exists (with --dry-run: only say
    /// what would be removed).
    #[arg(long, conflicts_with_all = ["list", "exec", "args"])]
    pub gc: bool,

    /// List the state of every project: root, size, last use, running sandboxes.
    #[arg(long, conflicts_with_all = ["exec", "dry_run", "args"])]
    pub list: bool,

    /// With --list: print JSON for scripts.
    #[arg(long, requires = "list")]
    pub json: bool,

    /// Arguments for claude (or, with --exec, the command and its arguments).
    #[arg(
        value_name = "CLAUDE_ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(OsString)
    )]
    pub args: Vec<OsString>,
}
