//! bubblewrap's CVE-2026-87766 (issue 34), as data: which bwrap carries the fix, and which
//! of a plan's mount points a sibling sandbox could lead bwrap astray at. Pure.
//!
//! Before bubblewrap 0.12.0, bwrap makes the mount points of its destinations by name
//! under the new root (`mkdir` of each missing component, following symlinks), so a
//! directory on the way that another process swaps for a symlink at that moment leads
//! the `mkdir` (and the mount) onto the host. claudebox opens and checks every bind
//! *source* by descriptor (`host::sources`), but the *destinations* are bwrap's. Measured
//! with Debian 12's bwrap 0.8.0-2+deb12u1 (tests/integration/escape/bwrap_parents.rs): a
//! sandbox of the same project that keeps exchanging a nested repository's directory
//! (`inner`, which holds the protected `inner/.git`) with a symlink to
//! `/oldroot/<a host directory>` made the next launch's bwrap create `.git` in that host
//! directory within the first launches (14 of 15 as root; as an ordinary user at the 3rd to
//! the 37th; the step inside then refused that launch: its mount check saw the swap). A destination whose parent is itself a mount point of the plan
//! cannot be led astray so: a sibling sandbox has the same mount point there, and a mount
//! point cannot be renamed or replaced.

use std::path::PathBuf;

use crate::policy::mount::{Mount, MountKind};

/// The CVE's name, as `--check` and the refusal say it.
pub const CVE: &str = "CVE-2026-87766";

/// The first bubblewrap release with the fix.
pub const FIXED_IN: (u32, u32, u32) = (0, 12, 0);

/// The version in `bwrap --version`'s output (`bubblewrap 0.8.0`).
pub fn parse_version(out: &str) -> Option<(u32, u32, u32)> {
    let v = out.split_whitespace().nth(1)?;
    let mut it = v
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>());
    let major = it.next()?.ok()?;
    let minor = it.next()?.ok()?;
    let patch = it.next().and_then(|r| r.ok()).unwrap_or(0);
    Some((major, minor, patch))
}

/// Whether the bwrap found carries the fix, and how claudebox knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    /// Its version is `FIXED_IN` or later.
    Version(String),
    /// An older version whose distribution package names the CVE in its changelog (the
    /// way Debian and Ubuntu, and RPM distributions, record a backported fix).
    Backported { version: String, how: String },
    /// An older version with no backport found.
    Missing { version: String },
    /// `bwrap --version` said nothing claudebox can read.
    Unknown(String),
}

impl Fix {
    pub fn fixed(&self) -> bool {
        matches!(self, Fix::Version(_) | Fix::Backported { .. })
    }

    /// The refusal's first half.
    pub fn describe_short(&self) -> String {
        match self {
            Fix::Missing { version } => format!("bubblewrap {version} lacks the fix for {CVE}"),
            Fix::Unknown(why) => {
                format!("cannot tell whether bwrap carries the fix for {CVE} ({why})")
            }
            _ => self.describe(),
        }
    }

    /// `--check`'s text.
    pub fn describe(&self) -> String {
        match self {
            Fix::Version(v) => format!("bubblewrap {v} carries the fix for {CVE}"),
            Fix::Backported { version, how } => {
                format!("bubblewrap {version} carries the fix for {CVE}: backported ({how})")
            }
            Fix::Missing { version } => format!(
                "bubblewrap {version} lacks the fix for {CVE} (fixed in {}.{}.{}; no \
                 backport named in its package's changelog): a launch refuses while another \
                 sandbox of the project runs and the project holds nested mount points \
                 (a nested repository, a submodule)",
                FIXED_IN.0, FIXED_IN.1, FIXED_IN.2
            ),
            Fix::Unknown(why) => {
                format!("cannot tell whether bwrap carries the fix for {CVE}: {why}")
            }
        }
    }
}

/// Judges a bwrap from its `--version` output and, for an older one, whether its
/// package's changelog (`changelog`, when found) names the CVE.
pub fn judge(version_out: &str, changelog: Option<(&str, &str)>) -> Fix {
    let Some(v) = parse_version(version_out) else {
        return Fix::Unknown(format!("bwrap --version said {:?}", version_out.trim()));
    };
    let version = format!("{}.{}.{}", v.0, v.1, v.2);
    if v >= FIXED_IN {
        return Fix::Version(version);
    }
    match changelog {
        Some((how, text)) if text.contains(CVE) => Fix::Backported {
            version,
            how: how.to_string(),
        },
        _ => Fix::Missing { version },
    }
}

/// The first mount point of `mounts` that a sibling sandbox could lead an unfixed bwrap
/// astray at: a target beneath a read-write bind (the project, shared by its sandboxes)
/// with a directory between the two that is not itself a mount point of the plan. Returns
/// the target and that directory.
pub fn swappable(mounts: &[Mount]) -> Option<(PathBuf, PathBuf)> {
    for (i, m) in mounts.iter().enumerate() {
        // The nearest earlier mount whose target holds this one.
        let Some(near) = mounts[..i]
            .iter()
            .rev()
            .filter(|o| o.kind != MountKind::Symlink && o.target != m.target)
            .find(|o| m.target.starts_with(&o.target))
        else {
            continue;
        };
        if near.kind != MountKind::Rw {
            continue;
        }
        let Some(parent) = m.target.parent() else {
            continue;
        };
        if parent == near.target {
            continue;
        }
        // The directory just beneath `near` on the way: the one a sibling can swap.
        let rel = parent.strip_prefix(&near.target).ok()?;
        let first = rel.components().next()?;
        return Some((m.target.clone(), near.target.join(first)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn versions_and_backports() {
        assert_eq!(parse_version("bubblewrap 0.8.0\n"), Some((0, 8, 0)));
        assert_eq!(parse_version("bubblewrap 0.12.0"), Some((0, 12, 0)));
        assert_eq!(parse_version("bubblewrap 0.11"), Some((0, 11, 0)));
        assert!(judge("bubblewrap 0.12.0", None).fixed());
        assert!(judge("bubblewrap 1.0.1", None).fixed());
        assert_eq!(
            judge("bubblewrap 0.8.0", None),
            Fix::Missing {
                version: "0.8.0".into()
            }
        );
        let log = "bubblewrap (0.9.0-1ubuntu0.1) noble-security; urgency=medium\n\n  * SECURITY UPDATE: CVE-2026-87766\n";
        assert!(judge("bubblewrap 0.9.0", Some(("dpkg changelog", log))).fixed());
        assert!(!judge("bubblewrap 0.8.0", Some(("dpkg changelog", "nothing"))).fixed());
        assert!(matches!(judge("garbage", None), Fix::Unknown(_)));
    }

    #[test]
    fn only_nested_mount_points_beneath_a_writable_bind_are_swappable() {
        let p = Path::new("/w/proj");
        let m = |k, t: &str| Mount::new(k, Some(Path::new(t)), Path::new(t), "");
        let mut v = vec![
            m(MountKind::Rw, "/w/proj"),
            m(MountKind::Rw, "/w/proj/.git"),
            m(MountKind::Tmpfs, "/w/proj/.claude"),
            m(MountKind::Ro, "/w/proj/.git/hooks"),
            m(MountKind::Ro, "/w/proj/.husky"),
            m(MountKind::File, "/w/proj/.claude/settings.local.json"),
        ];
        assert_eq!(swappable(&v), None);
        v.push(m(MountKind::Rw, "/w/proj/inner/.git"));
        v.push(m(MountKind::Ro, "/w/proj/inner/.git/hooks"));
        assert_eq!(swappable(&v), Some((p.join("inner/.git"), p.join("inner"))));
        // A chain of mount points is not: a/b is one too.
        let v = vec![
            m(MountKind::Rw, "/w/proj"),
            m(MountKind::Rw, "/w/proj/a"),
            m(MountKind::Ro, "/w/proj/a/b"),
        ];
        assert_eq!(swappable(&v), None);
    }
}
