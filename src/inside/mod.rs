//! The one step inside the sandbox, run by bwrap before the agent: `--sandbox-init`
//! (mount checks, Landlock, seccomp, the file supervisor, signals, and in allowlist mode the proxy's
//! listeners), then the command in its place.

pub mod confine;
pub mod listen;
pub mod notify;
