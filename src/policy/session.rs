//! A named session's launch as data for the plan (`state::sessions` decides it).

use std::ffi::OsString;

use crate::policy::agent::AgentId;

/// What a named launch does; data for the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub name: String,
    /// The conversation claude is started with (Codex: the thread resumed; for a new one
    /// Codex chooses the id, learnt after the run, and this is unused).
    pub uuid: String,
    pub start: Start,
    /// The agent whose conversation it is.
    pub agent: AgentId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// No record yet: `--session-id <uuid>`, record it.
    New,
    /// `--resume <uuid>`; `from` names the conversations directory the transcript is
    /// moved out of first, when the session last ran in another directory.
    Resume { from: Option<OsString> },
    /// The recorded conversation `lost` has no transcript: a new one under the same name.
    Fresh { lost: String },
}

impl Launch {
    /// The options claude gets before the user's arguments.
    pub fn claude_args(&self) -> [OsString; 2] {
        let flag = match self.start {
            Start::Resume { .. } => "--resume",
            Start::New | Start::Fresh { .. } => "--session-id",
        };
        [flag.into(), self.uuid.clone().into()]
    }
}

impl Launch {
    /// Codex's arguments: a thread to resume goes first (`resume ID ...`, or
    /// `exec resume ID ...` when the user's arguments start with `exec`); a new thread is
    /// Codex's own, learnt after the run.
    pub fn codex_args(&self, args: &[OsString]) -> Vec<OsString> {
        let Start::Resume { .. } = self.start else {
            return args.to_vec();
        };
        let mut v = Vec::with_capacity(args.len() + 3);
        let rest = match args.first() {
            Some(a) if a == "exec" || a == "e" => {
                v.push(a.clone());
                &args[1..]
            }
            _ => args,
        };
        v.push("resume".into());
        v.push(self.uuid.clone().into());
        v.extend(rest.iter().cloned());
        v
    }
}

/// Codex's subcommands other than `exec`: with `--session` they are refused (the name
/// chooses the thread, and these either pick one themselves or hold no conversation).
pub const CODEX_OTHER_COMMANDS: &[&str] = &[
    "agents",
    "review",
    "login",
    "logout",
    "mcp",
    "plugin",
    "app-server",
    "remote-control",
    "completion",
    "update",
    "doctor",
    "sandbox",
    "debug",
    "apply",
    "a",
    "resume",
    "queue",
    "archive",
    "delete",
    "migrate-rollouts",
    "migrate-nfs-db",
    "unarchive",
    "fork",
    "cloud",
    "exec-server",
    "features",
    "help",
    "mcp-server",
    "proto",
];

/// Refuses Codex arguments that pick a thread themselves, or hold none, with `--session`.
pub fn codex_args_refusal(args: &[OsString]) -> Option<String> {
    let first = args.first().and_then(|a| a.to_str());
    let bad = match first {
        Some(c) if CODEX_OTHER_COMMANDS.contains(&c) => Some(c.to_string()),
        Some("exec" | "e") => match args.get(1).and_then(|a| a.to_str()) {
            Some(s @ ("resume" | "review" | "help")) => Some(format!("exec {s}")),
            _ => None,
        },
        _ => None,
    };
    let bad = bad.or_else(|| {
        args.iter()
            .take_while(|a| *a != "--")
            .find(|a| *a == "--last")
            .map(|_| "--last".to_string())
    });
    bad.map(|b| {
        format!(
            "`--session` chooses Codex's thread itself, so `codex {b}` cannot be used with it; \
             give the TUI's options or `exec ...`"
        )
    })
}

/// The one line a launch as root gets when claude is asked to skip its permission prompts:
/// claude refuses `--dangerously-skip-permissions` (and `--allow-dangerously-skip-permissions`)
/// when its uid is 0, and inside the sandbox root stays uid 0.
pub fn root_refusal<'a>(
    is_root: bool,
    mut args: impl Iterator<Item = &'a std::ffi::OsString>,
) -> Option<&'static str> {
    let skip = args.any(|a| {
        a == "--dangerously-skip-permissions" || a == "--allow-dangerously-skip-permissions"
    });
    (is_root && skip).then_some(
        "running as root: claude refuses --dangerously-skip-permissions as root (uid 0 stays \
         uid 0 inside the sandbox, and claude will not skip its prompts for root); run \
         claudebox as your ordinary user",
    )
}

#[cfg(test)]
mod root_tests {
    use super::root_refusal;
    use std::ffi::OsString;

    #[test]
    fn only_root_asking_to_skip_the_prompts_is_told() {
        let skip: Vec<OsString> = vec!["-c".into(), "--dangerously-skip-permissions".into()];
        let plain: Vec<OsString> = vec!["-c".into()];
        assert!(root_refusal(true, skip.iter()).is_some());
        assert!(root_refusal(false, skip.iter()).is_none());
        assert!(root_refusal(true, plain.iter()).is_none());
    }
}
