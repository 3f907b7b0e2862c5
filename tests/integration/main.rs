//! The integration tests: one binary (`cargo test --test integration`), one module per
//! subject. Tests bound by time (the fault loops, the escape suite's races, refresh races,
//! Ctrl-C) hold `lab::heavy()` (through `World::heavy(BIN)`,
//! `lab::agent::each_claude_timed()` or directly) so that two of them never share the
//! machine's cores; conversations with the real Claude Code hold `lab::busy()` (through
//! `lab::agent::each_claude()` or directly): two at once, never beside a heavy one. What
//! the tests share with the benches (worlds, the mock APIs, the real agents) is the lab
//! crate (tests/lab).

// A test: a panic on an unexpected None or Err is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The claudebox binary under test, handed to every `lab::World`.
const BIN: &str = env!("CARGO_BIN_EXE_claudebox");

mod apparmor;
mod bypass_consent;
mod caches;
mod check;
mod claude_json_concurrency;
mod claude_settings;
mod codex_concurrency;
mod config;
mod conversations;
mod credsync;
mod crossing;
mod docs;
mod e2e_claude;
mod e2e_codex;
mod escape;
mod faults;
mod file_supervisor;
mod first_contact;
mod forward_ports;
mod gc;
mod git_status;
mod golden;
mod gpu;
mod hardening;
mod host_renames;
mod identity;
mod lab_findings;
mod launch;
mod launch_kills;
mod layouts;
mod limits;
mod list;
mod login_broker;
mod network;
mod no_git;
mod oauth_refresh;
mod planted_locks;
mod plugins;
mod proxy_flood;
mod review;
mod sessions;
mod signals;
mod test_files;
mod vm;
