//! The AppArmor profile claudebox ships for its bwrap (`packaging/apparmor/claudebox-bwrap`)
//! and the same text for another bwrap: `claudebox --apparmor-profile` prints the shipped
//! file with its one attachment line naming the bwrap in use, so the file in the repository,
//! the packages' copies and the printed text cannot drift apart.

use std::path::Path;

use anyhow::{bail, Result};

use crate::policy::error::Fixable;
use crate::policy::escape::Shown;

/// The shipped profile, byte for byte.
pub const SHIPPED: &str = include_str!("../../packaging/apparmor/claudebox-bwrap");

/// The profile's name (also its file name under /etc/apparmor.d): no distribution profile
/// has it, so loading it replaces none (a profile named `bwrap` would replace Ubuntu's).
pub const NAME: &str = "claudebox-bwrap";

/// Where the profile goes.
pub const INSTALL_PATH: &str = "/etc/apparmor.d/claudebox-bwrap";

/// The line of [`SHIPPED`] that names the bwrap the profile attaches to; nix/package.nix
/// replaces the same line.
pub const ATTACH_LINE: &str = "@{claudebox_bwrap} = /usr/bin/bwrap";

/// The one command that installs and loads the profile for the bwrap claudebox uses.
pub const ONE_STEP: &str =
    "claudebox --apparmor-profile | sudo tee /etc/apparmor.d/claudebox-bwrap \
     && sudo apparmor_parser -r /etc/apparmor.d/claudebox-bwrap";

/// The AppArmor label of a process: `unconfined`, or a profile (or stack) and its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    Unconfined,
    Profile { name: String, mode: String },
}

impl Label {
    /// As the kernel writes it in /proc/PID/attr/apparmor/current.
    pub fn parse(text: &str) -> Label {
        let t = text.trim_end_matches(['\n', '\0']).trim();
        if t == "unconfined" {
            return Label::Unconfined;
        }
        match t.rsplit_once(" (") {
            Some((name, mode)) if mode.ends_with(')') => Label::Profile {
                name: name.to_string(),
                mode: mode.trim_end_matches(')').to_string(),
            },
            _ => Label::Profile {
                name: t.to_string(),
                mode: String::new(),
            },
        }
    }
}

/// The line a launch prints before it runs bwrap when the kernel restricts user namespaces
/// for this user and no profile covers bwrap (bwrap's own error, which follows, names
/// neither cause nor fix). None otherwise, and when the label is unknown.
pub fn launch_warning(
    restrict: Option<bool>,
    uid: u32,
    label: &Result<Label, String>,
    bwrap: &Path,
) -> Option<String> {
    if restrict != Some(true) || uid == 0 || label != &Ok(Label::Unconfined) {
        return None;
    }
    Some(format!(
        "AppArmor restricts user namespaces here (kernel.apparmor_restrict_unprivileged_userns \
         = 1) and no profile covers {}, so bwrap will be refused; fix: {ONE_STEP} (claudebox \
         --check tells more)",
        bwrap.shown()
    ))
}

/// The shipped profile attached to `bwrap` (an absolute path with symlinks resolved:
/// AppArmor matches the executable's real path). Refuses a path the profile language
/// cannot name literally (glob and quoting characters, control characters, non-UTF-8):
/// escaping those is easy to get wrong, and a wrong attachment silently covers nothing
/// or more than meant.
pub fn profile_for(bwrap: &Path) -> Result<String> {
    let Some(path) = bwrap.to_str() else {
        bail!(unnameable(bwrap, "it is not UTF-8"));
    };
    if !path.starts_with('/') {
        bail!(unnameable(bwrap, "it is not absolute"));
    }
    if let Some(c) = path.chars().find(|c| !plain(*c)) {
        bail!(unnameable(bwrap, &format!("it holds {}", c.escape_debug())));
    }
    let line = format!("@{{claudebox_bwrap}} = \"{path}\"");
    Ok(SHIPPED.replacen(ATTACH_LINE, &line, 1))
}

/// A character AppArmor reads literally inside a double-quoted variable value.
fn plain(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '+' | '~' | ':' | '=' | '%' | ' ')
}

fn unnameable(bwrap: &Path, why: &str) -> Fixable {
    Fixable::new(
        format!(
            "cannot write an AppArmor profile for {}: {why}",
            bwrap.shown()
        ),
        "install bwrap at a plain path (letters, digits, / . _ - + ~ : = % and spaces) or \
         point CLAUDEBOX_BWRAP at one",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn shipped_file_has_the_attachment_line_once() {
        assert_eq!(SHIPPED.matches(ATTACH_LINE).count(), 1);
        assert!(SHIPPED.contains("profile claudebox-bwrap @{claudebox_bwrap} flags=(unconfined)"));
        assert!(SHIPPED.contains("  userns,\n"));
        assert!(SHIPPED.contains("abi <abi/4.0>,"));
        assert!(SHIPPED.contains(&format!("include if exists <local/{NAME}>")));
        assert!(SHIPPED.contains(INSTALL_PATH));
        assert!(ONE_STEP.contains(INSTALL_PATH));
    }

    #[test]
    fn printed_profile_is_the_shipped_one_with_the_path() {
        let p = profile_for(Path::new("/usr/bin/bwrap")).unwrap();
        assert_eq!(
            p,
            SHIPPED.replace(ATTACH_LINE, "@{claudebox_bwrap} = \"/usr/bin/bwrap\"")
        );
        let nix = "/nix/store/0abc-bubblewrap-0.11.0/bin/bwrap";
        let p = profile_for(Path::new(nix)).unwrap();
        assert!(p.contains(&format!("@{{claudebox_bwrap}} = \"{nix}\"\n")));
        assert!(!p.contains(ATTACH_LINE));
        // Everything but that line is the shipped file.
        let others = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| !l.starts_with("@{claudebox_bwrap}"))
                .map(String::from)
                .collect()
        };
        assert_eq!(others(&p), others(SHIPPED));
        let spaced = profile_for(Path::new("/opt/my tools/bwrap")).unwrap();
        assert!(spaced.contains("@{claudebox_bwrap} = \"/opt/my tools/bwrap\"\n"));
    }

    #[test]
    fn refuses_paths_it_cannot_name() {
        for bad in [
            "/opt/a*b/bwrap",
            "/opt/{x}/bwrap",
            "/opt/q\"x/bwrap",
            "/opt/a\\b/bwrap",
            "/opt/new\nline/bwrap",
            "/opt/[x]/bwrap",
            "/opt/c,d/bwrap",
            "/opt/@{x}/bwrap",
            "relative/bwrap",
        ] {
            let e = profile_for(Path::new(bad)).unwrap_err();
            let text = format!("{e:#}");
            assert!(
                text.starts_with("cannot write an AppArmor profile for"),
                "{text}"
            );
            assert!(!text.contains('\n'), "one line: {text}");
        }
        let e = profile_for(Path::new(OsStr::from_bytes(b"/opt/\xff/bwrap"))).unwrap_err();
        assert!(format!("{e:#}").contains("not UTF-8"));
    }

    /// A bwrap path that would smuggle rules into a profile root loads (a directory named
    /// with a newline and a second, all-allowing profile) is refused; the control shows what
    /// a plain substitution would have made of it.
    #[test]
    fn a_path_cannot_inject_rules() {
        let evil = "/tmp/x\"\nprofile evil /** flags=(unconfined) {\n  capability,\n}\n#/bwrap";
        assert!(profile_for(Path::new(evil)).is_err());
        let naive = SHIPPED.replacen(
            ATTACH_LINE,
            &format!("@{{claudebox_bwrap}} = \"{evil}\""),
            1,
        );
        assert!(naive.lines().any(|l| l.starts_with("profile evil")));
    }

    #[test]
    fn labels_as_the_kernel_writes_them() {
        assert_eq!(Label::parse("unconfined\n"), Label::Unconfined);
        assert_eq!(
            Label::parse("claudebox-bwrap (unconfined)\n"),
            Label::Profile {
                name: "claudebox-bwrap".into(),
                mode: "unconfined".into()
            }
        );
        assert_eq!(
            Label::parse("bwrap//&unpriv_bwrap (enforce)\n"),
            Label::Profile {
                name: "bwrap//&unpriv_bwrap".into(),
                mode: "enforce".into()
            }
        );
        assert_eq!(
            Label::parse("/usr/bin/foo (complain)\0"),
            Label::Profile {
                name: "/usr/bin/foo".into(),
                mode: "complain".into()
            }
        );
    }

    #[test]
    fn launch_warns_only_when_bwrap_will_be_refused() {
        let bwrap = Path::new("/usr/bin/bwrap");
        let unconfined = Ok(Label::Unconfined);
        let w = launch_warning(Some(true), 1000, &unconfined, bwrap).unwrap();
        assert!(w.contains("no profile covers /usr/bin/bwrap"), "{w}");
        assert!(w.contains(ONE_STEP), "{w}");
        // The controls: not restricted, root, covered, unknown.
        assert_eq!(launch_warning(Some(false), 1000, &unconfined, bwrap), None);
        assert_eq!(launch_warning(None, 1000, &unconfined, bwrap), None);
        assert_eq!(launch_warning(Some(true), 0, &unconfined, bwrap), None);
        let ours = Ok(Label::Profile {
            name: NAME.into(),
            mode: "unconfined".into(),
        });
        assert_eq!(launch_warning(Some(true), 1000, &ours, bwrap), None);
        assert_eq!(
            launch_warning(Some(true), 1000, &Err("no".into()), bwrap),
            None
        );
    }

    #[test]
    fn nix_package_replaces_the_same_line() {
        let nix =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("nix/package.nix"))
                .unwrap();
        assert!(
            nix.contains(&format!("'{ATTACH_LINE}'")),
            "nix/package.nix must replace {ATTACH_LINE:?}"
        );
        assert!(nix.contains("packaging/apparmor/claudebox-bwrap"));
    }
}
