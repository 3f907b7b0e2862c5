//! The maintenance commands that run no sandbox: `--list`, `--gc`, `--check` and the
//! diagnosis `--check` prints when a sandbox cannot start.

pub mod check;
pub mod diagnose;
pub mod gc;
pub mod list;
