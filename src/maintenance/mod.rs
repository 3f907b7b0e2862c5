//! The maintenance commands that run no sandbox: `--list`, `--gc`, `--check`, the
//! diagnosis `--check` prints when a sandbox cannot start, and `--apparmor-profile`
//! with the AppArmor state `--check` reports.

pub mod apparmor;
pub mod check;
pub mod gc;
pub mod list;
