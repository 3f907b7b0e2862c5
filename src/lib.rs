//! claudebox: run Claude Code inside a per-project bubblewrap sandbox.
//!
//! One folder per layer; a module imports only from its own folder or a lower layer. The
//! layers, lowest first, what each holds, and the test that holds the code to them are in
//! `layers.rs` (the one copy of that table). The binary (`main.rs`) picks its role once and calls into one of
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
