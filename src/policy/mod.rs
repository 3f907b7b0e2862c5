//! Pure data and policy, no I/O: the sandbox plan and its one renderer, the network
//! policy, the IPC variables table, the escaper for untrusted text.

pub mod confinement;
pub mod escape;
pub mod facts;
pub mod ipc;
pub mod network;
pub mod plan;
pub mod protected;
pub mod render;
pub mod settings;
