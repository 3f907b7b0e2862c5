//! claudebox: run Claude Code inside a per-project bubblewrap sandbox.
//!
//! One folder per layer; a module imports only from its own folder or a lower layer
//! (the table and its test are in `layers.rs`):
//! `policy` < `host` < `state` < `config` < `cli` < `proxy` < `inside` < `launch` <
//! `maintenance` < `run`. The binary (`main.rs`) picks its role once and calls into one of
//! them.

pub mod cli;
pub mod config;
pub mod host;
pub mod inside;
pub mod launch;
pub mod maintenance;
pub mod policy;
pub mod proxy;
pub mod run;
pub mod state;

#[cfg(test)]
mod layers;
