//! Shell integration generated from the same clap definitions as the command line:
//! `claudebox completions bash|zsh|fish` and `claudebox manpage`. Both are recognised
//! only as the very first argument, so every other command line still goes to claude
//! unchanged (`claudebox -- manpage` sends the word to claude).

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use clap_complete::Shell;

use crate::cli::Cli;

#[derive(Debug, Parser)]
#[command(
    name = "claudebox completions",
    about = "Print a completion script for SHELL to stdout"
)]
struct Completions {
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Debug, Parser)]
#[command(
    name = "claudebox manpage",
    about = "Print claudebox's manual page (roff) to stdout"
)]
struct Manpage {}

/// Runs `completions` or `manpage` when `args[1]` names one; `None` otherwise.
pub fn dispatch(args: &[OsString]) -> Option<ExitCode> {
    let out = match args.get(1)?.to_str()? {
        crate::cli::complete::SESSION_NAMES => {
            return Some(crate::cli::complete::print_session_names())
        }
        "completions" => {
            let c = Completions::parse_from(&args[1..]);
            let mut buf = Vec::new();
            clap_complete::generate(c.shell, &mut Cli::command(), "claudebox", &mut buf);
            let script = String::from_utf8_lossy(&buf);
            Ok(crate::cli::complete::with_session_names(c.shell, &script).into_bytes())
        }
        "manpage" => {
            Manpage::parse_from(&args[1..]);
            match crate::cli::man::render() {
                Ok(buf) => Ok(buf),
                Err(e) => {
                    eprintln!("claudebox: manpage: {e:#}");
                    return Some(ExitCode::from(1));
                }
            }
        }
        _ => return None,
    };
    let written = out.and_then(|buf| {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&buf)?;
        stdout.flush()
    });
    Some(match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("claudebox: cannot write to stdout: {e}");
            ExitCode::from(1)
        }
    })
}
