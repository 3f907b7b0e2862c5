//! A named session's launch as data for the plan (`state::sessions` decides it).

use std::ffi::OsString;

/// What a named launch does; data for the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub name: String,
    /// The conversation claude is started with.
    pub uuid: String,
    pub start: Start,
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
