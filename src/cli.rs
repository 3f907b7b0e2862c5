//! The command line. claudebox's own options come first; everything after them goes to
//! claude unchanged (or is the command for `--exec`). Option names never take one of
//! claude's (`-n/--name`, `-r/--resume`, `-c`, `-p`, `-w` are claude's).

use std::ffi::OsString;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "claudebox",
    disable_version_flag = true,
    about = "Run Claude Code in a per-project bubblewrap sandbox",
    long_about = "Run Claude Code in a per-project bubblewrap sandbox.\n\n\
        Arguments after claudebox's own options go to claude unchanged; use `--` when the \
        first of them could be read as a claudebox option. `--version` goes to claude \
        (claude's version, from inside the sandbox); `claudebox -- --help` shows claude's help.",
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

    /// List every project's named sessions and whether each is running.
    #[arg(long, conflicts_with_all = ["session", "forget", "exec", "args"])]
    pub list: bool,

    /// Skip confirmations (allow the home directory or / as the project).
    #[arg(long)]
    pub yes: bool,

    /// Print claudebox's own version (`--version` is claude's).
    #[arg(long)]
    pub claudebox_version: bool,

    /// Arguments for claude (or, with --exec, the command and its arguments).
    #[arg(
        value_name = "CLAUDE_ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(OsString)
    )]
    pub args: Vec<OsString>,
}
