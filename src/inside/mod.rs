//! The one step inside the sandbox, run by bwrap before the agent: `--sandbox-init`.

pub mod confine;
