//! Whether a missing project root is really gone, or only not reachable now: a disk that
//! is not mounted, a network file system that is not there yet, a removable drive that
//! is unplugged. `--gc` never counts such a root as gone ("unknown" instead), so the
//! conversations of a project on an unplugged disk survive any number of `--gc` runs.
//!
//! Read-only: `/proc/self/mountinfo`, `/etc/fstab`, `lstat`s of the root's ancestors, and
//! the mount point the root's file system had at the project's last launch (recorded in
//! its state as `root-mount`: a file system mounted by hand, anywhere, and since
//! unmounted is not there now, not gone).

use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where removable drives are mounted: a missing root under one of these, with no file
/// system mounted between the base and the root, is an unplugged drive, not a deleted
/// project.
pub const REMOVABLE_BASES: &[(&str, &str)] = &[
    (
        "/media",
        "udisks mounts removable drives here (Debian, Ubuntu)",
    ),
    (
        "/run/media",
        "udisks mounts removable drives here (Fedora, Arch)",
    ),
    (
        "/mnt",
        "the conventional place for temporarily mounted file systems",
    ),
];

/// File system types whose mount point exists before what they serve is reachable.
const ON_DEMAND_FS: &[(&str, &str)] = &[
    (
        "autofs",
        "mounted on demand; a missing path may only be not mounted yet",
    ),
    ("fuse.sshfs", "a network file system that can drop"),
];

/// The mount point of the file system `path` is on now: the longest mount point in
/// `/proc/self/mountinfo` that is `path` or one of its ancestors. Recorded at each launch
/// (`root-mount`) for [`why_unknown`].
pub fn mount_point_of(path: &Path) -> Option<PathBuf> {
    let mountinfo = fs::read("/proc/self/mountinfo").ok()?;
    mount_point_in(path, &parse_mountinfo(&mountinfo))
}

/// [`mount_point_of`] with the mount table given.
pub fn mount_point_in(path: &Path, mounted: &[(PathBuf, String)]) -> Option<PathBuf> {
    mounted
        .iter()
        .map(|(m, _)| m)
        .filter(|m| path.starts_with(m))
        .max_by_key(|m| m.as_os_str().len())
        .cloned()
}

/// Why a root that `lstat` says is missing may still exist, or `None` when it is gone.
/// `recorded`: the mount point its file system had at the project's last launch
/// (`root-mount`), if one was recorded.
pub fn why_unknown(root: &Path, recorded: Option<&Path>) -> Option<String> {
    // Read once per run: `--gc` over thousands of missing roots asks again and again.
    type Tables = (Vec<(PathBuf, String)>, Vec<PathBuf>);
    static TABLES: std::sync::OnceLock<Tables> = std::sync::OnceLock::new();
    let (mounted, fstab) = TABLES.get_or_init(|| {
        let mountinfo = fs::read("/proc/self/mountinfo").unwrap_or_default();
        let fstab = fs::read("/etc/fstab").unwrap_or_default();
        (parse_mountinfo(&mountinfo), parse_fstab(&fstab))
    });
    recorded
        .and_then(|m| why_unmounted(root, m, mounted))
        .or_else(|| why_unknown_with(root, mounted, fstab))
}

/// A root whose file system was mounted at `recorded` when the project was last launched
/// (not the root file system) and is not mounted there now: a disk or tmpfs mounted by
/// hand and since unmounted, not a deleted project. A mount point recorded that is not
/// an ancestor of the root (a record from another root) says nothing.
pub fn why_unmounted(
    root: &Path,
    recorded: &Path,
    mounted: &[(PathBuf, String)],
) -> Option<String> {
    let show = |p: &Path| crate::policy::escape::shown(p);
    if recorded == Path::new("/") || !root.starts_with(recorded) {
        return None;
    }
    if mounted.iter().any(|(m, _)| m == recorded) {
        return None;
    }
    Some(format!(
        "its file system was mounted at {} at its last launch and is not mounted now",
        show(recorded)
    ))
}

/// [`why_unknown`] with the mount table and fstab given (the decision, testable).
pub fn why_unknown_with(
    root: &Path,
    mounted: &[(PathBuf, String)],
    fstab: &[PathBuf],
) -> Option<String> {
    let show = |p: &Path| crate::policy::escape::shown(p);
    // The nearest ancestor that exists.
    let existing = root
        .ancestors()
        .skip(1)
        .find(|a| fs::symlink_metadata(a).is_ok())?;
    if let Some((_, fstype)) = mounted.iter().find(|(m, _)| m == existing) {
        if let Some((_, why)) = ON_DEMAND_FS.iter().find(|(t, _)| t == fstype) {
            return Some(format!("{} is a {fstype} mount ({why})", show(existing)));
        }
        let empty = fs::read_dir(existing).is_ok_and(|mut d| d.next().is_none());
        if empty && existing != Path::new("/") {
            return Some(format!(
                "{} is an empty mount point (a file system that is not ready?)",
                show(existing)
            ));
        }
    }
    for m in fstab {
        let is_mounted = mounted.iter().any(|(p, _)| p == m);
        if m != Path::new("/") && root.starts_with(m) && !is_mounted {
            return Some(format!(
                "its file system {} (in /etc/fstab) is not mounted",
                show(m)
            ));
        }
    }
    for (base, why) in REMOVABLE_BASES {
        let base = Path::new(base);
        if !root.starts_with(base) || root == base {
            continue;
        }
        // A drive is mounted somewhere between the base and the root: then the root is
        // really gone from it.
        let dev = |p: &Path| fs::symlink_metadata(p).map(|m| m.dev()).ok();
        let base_dev = dev(base);
        let drive_mounted = existing.starts_with(base)
            && existing
                .ancestors()
                .take_while(|a| a.starts_with(base) && *a != base)
                .any(|a| dev(a) != base_dev || mounted.iter().any(|(m, _)| m == a));
        if !drive_mounted {
            return Some(format!(
                "it lies under {} ({why}) and no drive is mounted there",
                show(base)
            ));
        }
    }
    None
}

/// Mount points and file system types from `/proc/self/mountinfo`.
pub fn parse_mountinfo(text: &[u8]) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for line in text.split(|b| *b == b'\n') {
        let fields: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == b"-") else {
            continue;
        };
        if fields.len() < 5 || fields.len() <= sep + 1 {
            continue;
        }
        let fstype = String::from_utf8_lossy(fields[sep + 1]).into_owned();
        out.push((unescape(fields[4]), fstype));
    }
    out
}

/// Mount points listed in `/etc/fstab` (swap and `none` skipped).
pub fn parse_fstab(text: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in text.split(|b| *b == b'\n') {
        let line = line.trim_ascii();
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let mut fields = line
            .split(|b| *b == b' ' || *b == b'\t')
            .filter(|f| !f.is_empty());
        let (Some(_), Some(dir)) = (fields.next(), fields.next()) else {
            continue;
        };
        if dir.first() == Some(&b'/') {
            out.push(unescape(dir));
        }
    }
    out
}

/// Octal escapes (`\040` for a space) as both files write them.
fn unescape(b: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = u32::from(b[i + 1] - b'0') * 64
                + u32::from(b[i + 2] - b'0') * 8
                + u32::from(b[i + 3] - b'0');
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_and_fstab() {
        let mi = b"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                   40 22 0:40 / /mnt/my\\040disk rw shared:1 - vfat /dev/sdb1 rw\n";
        let m = parse_mountinfo(mi);
        assert_eq!(m[1], (PathBuf::from("/mnt/my disk"), "vfat".to_string()));
        let f = parse_fstab(b"# c\nUUID=x / ext4 defaults 0 1\n/dev/sdb1\t/data\\040x ext4 noauto 0 0\nnone swap swap sw 0 0\n");
        assert_eq!(f, vec![PathBuf::from("/"), PathBuf::from("/data x")]);
    }

    #[test]
    fn a_recorded_mount_point_that_is_not_mounted_makes_its_paths_unknown() {
        let root = Path::new("/srv/disk/app/.git");
        let mounted = vec![
            (PathBuf::from("/"), "ext4".to_string()),
            (PathBuf::from("/srv"), "ext4".to_string()),
        ];
        assert_eq!(mount_point_in(root, &mounted), Some(PathBuf::from("/srv")));
        let why = why_unmounted(root, Path::new("/srv/disk"), &mounted).unwrap();
        assert!(
            why.contains("mounted at /srv/disk at its last launch"),
            "{why}"
        );
        // Mounted now (the root really gone from it), on `/`, or a record of another
        // path: no say.
        let mut with = mounted.clone();
        with.push((PathBuf::from("/srv/disk"), "tmpfs".into()));
        assert_eq!(why_unmounted(root, Path::new("/srv/disk"), &with), None);
        assert_eq!(why_unmounted(root, Path::new("/"), &mounted), None);
        assert_eq!(why_unmounted(root, Path::new("/mnt/x"), &mounted), None);
    }

    #[test]
    fn an_fstab_file_system_that_is_not_mounted_makes_its_paths_unknown() {
        let tmp = tempfile::tempdir().unwrap();
        let mp = tmp.path().join("disk");
        fs::create_dir(&mp).unwrap();
        let root = mp.join("src/app/.git");
        let mounted = vec![(PathBuf::from("/"), "ext4".to_string())];
        let why = why_unknown_with(&root, &mounted, std::slice::from_ref(&mp)).unwrap();
        assert!(why.contains("in /etc/fstab) is not mounted"), "{why}");
        // Mounted (and the project really gone from it): gone.
        let mut with = mounted.clone();
        with.push((mp.clone(), "ext4".into()));
        fs::write(mp.join("other"), "x").unwrap();
        assert_eq!(
            why_unknown_with(&root, &with, std::slice::from_ref(&mp)),
            None
        );
        // An empty mount point right above: unknown.
        fs::remove_file(mp.join("other")).unwrap();
        let why = why_unknown_with(&root, &with, &[]).unwrap();
        assert!(why.contains("empty mount point"), "{why}");
        // Not in fstab, not a mount: gone.
        assert_eq!(why_unknown_with(&root, &mounted, &[]), None);
    }
}
