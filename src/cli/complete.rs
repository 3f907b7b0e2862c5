//! Session names in the shell completions: the scripts `claudebox completions SHELL`
//! prints are clap's, with `--session` and `--forget` completing the current project's
//! named sessions (not file names) through the hidden first argument [`SESSION_NAMES`],
//! which prints them one per line. Session names are letters, digits, `.`, `_` and `-`
//! only (`sessions::check_name`), so no shell reads more into them.
//!
//! Why not clap_complete's dynamic completion: it is behind an unstable feature and
//! replaces the whole script with calls into the binary; here only two values call it.

use std::io::Write;
use std::process::ExitCode;

use clap_complete::Shell;

use crate::host::{self, project};
use crate::state::sessions::list;
use crate::state::StateHome;

/// The hidden first argument: print this project's session names, one per line.
pub const SESSION_NAMES: &str = "--internal-session-names";

/// Prints the session names of the current directory's project; nothing (and success)
/// when there is no project, state or session: a completion never prints an error.
pub fn print_session_names() -> ExitCode {
    let names = (|| -> anyhow::Result<Vec<String>> {
        let (home, _) = host::home::resolve(&host::home_dir()?, host::SYSTEM_PATHS);
        let project = project::discover(&host::current_dir()?)?;
        let state = StateHome::from_env(&home)?.project(&project.id());
        Ok(list::list(&state)?.into_iter().map(|s| s.name).collect())
    })()
    .unwrap_or_default();
    let mut out = std::io::stdout().lock();
    for n in names {
        let _ = writeln!(out, "{n}");
    }
    ExitCode::SUCCESS
}

/// The options whose value is a session name.
const SESSION_OPTIONS: &[&str] = &["session", "forget"];

/// clap's script for `shell`, with the session options completing session names.
/// Each edit is checked by the tests against the text clap generates.
pub fn with_session_names(shell: Shell, script: &str) -> String {
    let call = format!("claudebox {SESSION_NAMES} 2>/dev/null");
    match shell {
        Shell::Bash => {
            let mut s = script.to_string();
            for o in SESSION_OPTIONS {
                let from = format!(
                    "                --{o})\n                    COMPREPLY=($(compgen -f \"${{cur}}\"))"
                );
                let to = format!(
                    "                --{o})\n                    COMPREPLY=($(compgen -W \"$({call})\" -- \"${{cur}}\"))"
                );
                s = s.replacen(&from, &to, 1);
            }
            s
        }
        Shell::Zsh => {
            script
                .lines()
                .map(|l| {
                    let ours = SESSION_OPTIONS.iter().any(|o| {
                        l.contains(&format!(")--{o}=[")) || l.starts_with(&format!("'--{o}=["))
                    });
                    match l.strip_suffix(":NAME:_default' \\") {
                        Some(head) if ours => {
                            format!("{head}:NAME:{{compadd -- ${{(f)\"$({call})\"}}}}' \\")
                        }
                        _ => l.to_string(),
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
        }
        Shell::Fish => {
            script
                .lines()
                .map(|l| {
                    let ours = SESSION_OPTIONS
                        .iter()
                        .any(|o| l.starts_with(&format!("complete -c claudebox -l {o} ")));
                    match l.strip_suffix(" -r") {
                        Some(head) if ours => format!("{head} -r -f -a '({call})'"),
                        _ => l.to_string(),
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
        }
        _ => script.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn script(shell: Shell) -> String {
        let mut buf = Vec::new();
        clap_complete::generate(
            shell,
            &mut crate::cli::Cli::command(),
            "claudebox",
            &mut buf,
        );
        with_session_names(shell, &String::from_utf8(buf).unwrap())
    }

    #[test]
    fn every_shell_calls_for_session_names_on_both_options() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let s = script(shell);
            assert_eq!(
                s.matches(SESSION_NAMES).count(),
                SESSION_OPTIONS.len(),
                "{shell}: clap's text changed, the edit no longer applies"
            );
        }
    }
}
