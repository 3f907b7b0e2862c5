//! A near-miss of one of claudebox's own options (`--netwrok`, `--no-netwrok`): clap takes
//! the first unknown option as the start of claude's arguments, so without this it went
//! to claude, whose error does not mention claudebox. Refused with "did you mean", unless
//! it is one of claude's own options, or the user put it after `--`.
//!
//! Near: an optimal-string-alignment distance (a swap of two neighbours counts once) of at
//! most 1 for names up to 4 letters, 2 for longer ones (strsim's `osa_distance`).

use std::ffi::OsString;

use clap::CommandFactory;

use crate::cli::Cli;

/// claude's long options, so that one near a claudebox option still goes to claude: from
/// `claude --help` of 2.1.197 and 2.1.330, and the hidden ones claudebox's facts name.
#[rustfmt::skip]
pub const CLAUDE_LONG: &[&str] = &[
    "add-dir", "agent", "agents", "all", "allow-dangerously-skip-permissions",
    "allowed-tools", "allowedTools", "append-system-prompt", "append-system-prompt-file",
    "autocompact", "ax-screen-reader", "background", "bare", "betas", "bg", "brief", "chrome",
    "cloud", "continue", "dangerously-skip-permissions", "debug", "debug-file", "desktop",
    "disable-slash-commands", "disallowed-tools", "disallowedTools", "effort", "environment",
    "exclude-dynamic-system-prompt-sections", "fallback-model", "file", "fork-session",
    "forward-subagent-text", "from-pr", "help", "ide", "include-hook-events",
    "include-partial-messages", "input-format", "json-schema", "max-budget-usd", "max-turns",
    "mcp-config", "mcp-debug", "model", "name", "no-chrome", "no-session-persistence",
    "output-format", "permission-mode", "permission-prompt-tool", "permission-prompts",
    "plugin-dir", "plugin-url", "print", "prompt-suggestions", "remote-control",
    "remote-control-session-name-prefix", "replay-user-messages", "restricted", "resume",
    "safe-mode", "session-id", "setting-sources", "settings", "strict-mcp-config",
    "system-prompt", "system-prompt-file", "system-prompt-snapshot", "teleport", "tmux",
    "tools", "verbose", "version", "worktree",
];

/// The one-line refusal when claude's arguments start with a near-miss of a claudebox
/// option. `raw` is the command line as given (program name first).
pub fn near_miss(raw: &[OsString], cli: &Cli) -> Option<String> {
    if cli.exec {
        return None;
    }
    let first = cli.args.first()?;
    // The trailing arguments are the last of the command line, verbatim; one that follows
    // `--` was meant for claude.
    let at = raw.len().checked_sub(cli.args.len())?;
    if at == 0 || raw[at - 1] == "--" {
        return None;
    }
    let name = first.to_str()?.strip_prefix("--")?;
    let name = name.split_once('=').map_or(name, |(n, _)| n);
    if name.is_empty() || CLAUDE_LONG.contains(&name) {
        return None;
    }
    let ours = Cli::command();
    let best = ours
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .map(|l| (strsim::osa_distance(name, l), l))
        .filter(|(d, l)| *d > 0 && *d <= if l.len() <= 4 { 1 } else { 2 })
        .min()?;
    let shown = crate::policy::escape::shown(first);
    Some(format!(
        "unknown option {shown}: did you mean --{}? (an option meant for claude goes \
         after --: claudebox -- {shown})",
        best.1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn check(args: &[&str]) -> Option<String> {
        let raw: Vec<OsString> = std::iter::once("claudebox")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        near_miss(&raw, &Cli::try_parse_from(&raw).unwrap())
    }

    #[test]
    fn a_near_miss_of_ours_is_refused_and_claudes_options_pass() {
        let m = check(&["--no-netwrok"]).unwrap();
        assert!(m.contains("did you mean --no-network?"), "{m}");
        assert!(check(&["--netwrok", "none"])
            .unwrap()
            .contains("did you mean --network?"));
        assert!(check(&["--yes", "--dry-rnu"])
            .unwrap()
            .contains("--dry-run?"));
        assert!(check(&["--allow-hots=x.com"])
            .unwrap()
            .contains("--allow-host?"));
        // claude's own, near ours or not; after --; with --exec; a far one; a prompt.
        for ok in [
            &["--ide"][..],
            &["--bg"],
            &["--model", "x"],
            &["--", "--netwrok"],
            &["--exec", "ls", "--netwrok"],
            &["--frobnicate"],
            &["-p", "--netwrok"],
            &["hello"],
        ] {
            assert_eq!(check(ok), None, "{ok:?}");
        }
    }
}
