//! Where the host-side companions of a sandbox run (the proxy with the login broker and
//! the user's `apiKeyHelper` it runs, the credentials sync) and what of the launcher's
//! environment they take (issue 34).
//!
//! The launcher runs where the user started it, in the project, which the agent writes. A
//! program run there on the host loads what the agent planted: `python3 -c "import
//! keyring"` imports `./keyring.py` (the script's directory is the working directory for
//! `-c`), `node -e "require('x')"` loads `./node_modules/x`, a relative or project entry
//! of `PATH` runs the agent's binary. So every companion runs in [`WORKDIR`], `/`: never a
//! project (a launch refuses `/`, the home and its parents as a project) and never
//! written by a sandbox. The user's home was the other choice; it is where a helper's
//! relative paths would have meant the least surprise, but a home can hold other things
//! a sandbox writes (`--rw` paths, state), `/` cannot, and the credentials sync already
//! ran there. A helper that names a file relatively (`./get-key.sh`) must name it by its
//! full path (or `~/...`) instead: it fails with its own message, once, at the launch.
//!
//! The environment: [`ROWS`] says what happens to the variables that name the working
//! directory; every other variable is kept (`HOME`, `PATH`, the helper's own settings),
//! but whatever in it points into a place the sandbox writes is dropped: a value that is
//! such a path (`VIRTUAL_ENV=<project>/.venv`), or, for a value that is a list of paths
//! separated by `:` (`PATH`, `PYTHONPATH`, `NODE_PATH`, `LD_LIBRARY_PATH`, ...), each
//! such entry (the variable is removed when none is left). Relative entries (`.`, an
//! empty one) are kept: in `/` they name `/`. Variables that change how an interpreter
//! loads code but name no such path (`PYTHONSTARTUP=~/x.py`, `NODE_OPTIONS=--require
//! ~/y`) are the user's own and are kept.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// The working directory of every host-side companion and of what they run.
pub const WORKDIR: &str = "/";

/// What happens to a variable of the launcher's environment in a companion's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Set to [`WORKDIR`].
    Workdir,
    /// Removed.
    Removed,
    /// Kept as it is, whatever it names (checked nowhere else).
    Kept,
}

/// The named variables, with why. Every other one goes through [`outside`]'s path rule.
pub const ROWS: &[(&str, Rule, &str)] = &[
    (
        "PWD",
        Rule::Workdir,
        "the shell's idea of the working directory: a program that trusts it over getcwd \
         (`pwd -L`, a shell's `cd .`) would be back in the project",
    ),
    (
        "OLDPWD",
        Rule::Removed,
        "the shell's previous directory (`cd -`), often the project",
    ),
    (
        "HOME",
        Rule::Kept,
        "the helper reads the user's files through it; a launch refuses a project that is \
         the home or holds it",
    ),
];

/// One change to a companion's environment: `Some(value)` set, `None` removed.
pub type Change = (OsString, Option<OsString>);

/// The changes that take `vars` (the launcher's environment) to a companion's, given
/// `written(path)`: whether an absolute path lies in a place the sandbox writes (the
/// caller resolves symlinks).
pub fn outside(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    written: impl Fn(&Path) -> bool,
) -> Vec<Change> {
    let mut out = Vec::new();
    for (name, value) in vars {
        match ROWS.iter().find(|(n, _, _)| OsStr::new(n) == name) {
            Some((_, Rule::Workdir, _)) => out.push((name, Some(OsString::from(WORKDIR)))),
            Some((_, Rule::Removed, _)) => out.push((name, None)),
            Some((_, Rule::Kept, _)) => {}
            None => {
                let parts: Vec<&[u8]> = value.as_bytes().split(|b| *b == b':').collect();
                let is_written =
                    |p: &[u8]| p.first() == Some(&b'/') && written(Path::new(OsStr::from_bytes(p)));
                if !parts.iter().any(|p| is_written(p)) {
                    continue;
                }
                let kept: Vec<&[u8]> = parts.into_iter().filter(|p| !is_written(p)).collect();
                if kept.is_empty() {
                    out.push((name, None));
                } else {
                    out.push((name, Some(OsString::from_vec(kept.join(&b':')))));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> OsString {
        OsString::from(s)
    }

    /// Entries in the project go, the rest stays; the controls: the same variables
    /// naming no written place are not touched, and HOME stays even when it would match.
    #[test]
    fn what_points_into_a_written_place_is_dropped() {
        let written = |p: &Path| p.starts_with("/w/proj") || p.starts_with("/w/rw");
        let env = [
            ("PWD", "/w/proj/sub"),
            ("OLDPWD", "/w/proj"),
            ("HOME", "/w/proj-home"),
            (
                "PATH",
                "/w/proj/.venv/bin:/usr/bin::.:/w/rw/bin:/w/projx/bin",
            ),
            ("PYTHONPATH", "/w/proj"),
            ("NODE_PATH", "/usr/lib/node_modules"),
            ("VIRTUAL_ENV", "/w/proj/.venv"),
            ("EDITOR", "vim"),
            ("URL", "https://example.com/w/proj"),
        ];
        let got = outside(env.iter().map(|(k, v)| (os(k), os(v))), written);
        let want: Vec<Change> = vec![
            (os("PWD"), Some(os("/"))),
            (os("OLDPWD"), None),
            (os("PATH"), Some(os("/usr/bin::.:/w/projx/bin"))),
            (os("PYTHONPATH"), None),
            (os("VIRTUAL_ENV"), None),
        ];
        assert_eq!(got, want);
        // Control: nothing written, nothing but the working directory's names changes.
        let none = outside(env.iter().map(|(k, v)| (os(k), os(v))), |_| false);
        assert_eq!(none, vec![(os("PWD"), Some(os("/"))), (os("OLDPWD"), None)]);
    }
}
