//! The integration tests: one binary (`cargo test --test integration`), one module per
//! subject. Tests that run the real Claude Code, the fault loops or the escape suite's
//! races take `common::heavy()` so that two of them never share the machine's cores.

mod common;

mod apparmor;
mod check;
mod claude_json_concurrency;
mod claude_settings;
mod config;
mod conversations;
mod e2e_claude;
mod escape;
mod faults;
mod forward_ports;
mod gc;
mod gpu;
mod hardening;
mod identity;
mod lab_findings;
mod launch;
mod list;
mod network;
mod no_git;
mod oauth_refresh;
mod plugins;
mod proxy_flood;
mod sessions;
mod signals;
