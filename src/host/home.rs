//! The home directory as the kernel reaches it, when `$HOME` names it through a symlink
//! (Fedora Silverblue and other image-based systems: `/home -> var/home`; a home linked
//! onto a second disk).
//!
//! Why: the launch opens every bind source and refuses one whose descriptor reached a
//! path other than the one named, inside a place a sandbox can write (`sources`): that is
//! how a symlink swapped in by another sandbox is caught. Those places are canonical, so
//! a source named through the home's own symlink (`/home/u/.claude/settings.json`, really
//! `/var/home/u/...`) looked swapped. The plan is therefore made from the canonical home,
//! and `$HOME`'s own name is recreated inside as a symlink to it, so that paths the user's
//! environment holds (`$HOME/.local/bin` on PATH) still lead somewhere.

use std::fs;
use std::path::{Path, PathBuf};

/// The canonical home, and `home` itself when it differs and must be recreated inside as
/// a symlink: not when it lies under a system path bound from the host (its own symlinks
/// come with that bind), nor when it cannot be resolved (then the home is used as named).
pub fn resolve(home: &Path, system: &[&str]) -> (PathBuf, Option<PathBuf>) {
    let Ok(real) = fs::canonicalize(home) else {
        return (home.to_path_buf(), None);
    };
    if real == home {
        return (real, None);
    }
    let under_system = system.iter().any(|s| home.starts_with(s));
    (real, (!under_system).then(|| home.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linked_home_resolves_and_keeps_its_name() {
        let d = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(d.path()).unwrap();
        fs::create_dir_all(root.join("var/home/u")).unwrap();
        std::os::unix::fs::symlink("var/home", root.join("home")).unwrap();
        let named = root.join("home/u");
        assert_eq!(
            resolve(&named, &[]),
            (root.join("var/home/u"), Some(named.clone()))
        );
        // A real home, and a home under a bound system path, get no symlink.
        assert_eq!(
            resolve(&root.join("var/home/u"), &[]),
            (root.join("var/home/u"), None)
        );
        let sys = root.to_str().unwrap();
        assert_eq!(resolve(&named, &[sys]), (root.join("var/home/u"), None));
    }
}
