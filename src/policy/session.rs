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
