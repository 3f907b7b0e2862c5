//! Where a mount or setting came from (claudebox's default, the config file, the command
//! line): shared by the settings, the limits, the `--gpu` table and the plan, so it sits at
//! the bottom of `policy`.

use std::fmt;
use std::path::PathBuf;

/// Where a mount or setting came from, shown by `--dry-run`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Origin {
    /// claudebox's own default.
    #[default]
    Default,
    /// The config file, at this line.
    ConfigFile { path: PathBuf, line: usize },
    /// claudebox's command line.
    CommandLine,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::ConfigFile { path, line } => write!(f, "config {}:{line}", path.display()),
            Origin::CommandLine => f.write_str("command line"),
        }
    }
}
