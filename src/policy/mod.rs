//! Pure data and policy, no I/O: the sandbox plan and its one renderer, the network
//! policy, the IPC variables table, the `~/.claude` table, the state's layout, the escaper for untrusted text.

pub mod agent;
pub mod apparmor;
pub mod base_url;
pub mod bwrap_cve;
pub mod caches;
pub mod claude_home;
pub mod codex_home;
pub mod companion_env;
pub mod confinement;
pub mod credsync;
pub mod error;
pub mod escape;
pub mod facts;
pub mod forward;
pub mod git_dir;
pub mod gpu;
pub mod ipc;
pub mod layout;
pub mod limits;
pub mod mount;
pub mod network;
pub mod origin;
pub mod plan;
pub mod protected;
pub mod render;
pub mod review;
pub mod session;
pub mod settings;
