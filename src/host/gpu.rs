//! Which paths of the GPU table (`policy::gpu::TABLE`) this host has: the host facts of
//! `--gpu`, gathered only when the opt-in is set. Read-only; the plan decides.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::policy::gpu::{Found, GpuHost, Kind, OnHost, Pattern, TABLE};

/// Where the PCI devices are listed, each a link to its directory under `/sys/devices`.
const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// PCI base classes of GPUs: display controller (VGA, 3D controller, ...) and processing
/// accelerator (some compute-only GPUs).
const GPU_CLASSES: &[&str] = &["0x03", "0x12"];

pub fn probe() -> GpuHost {
    probe_under(Path::new("/"))
}

/// The probe with every table path taken under `root` (`/` on a launch; a temporary
/// tree in the tests).
pub fn probe_under(root: &Path) -> GpuHost {
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let mut found = Vec::new();
    for (i, row) in TABLE.iter().enumerate() {
        match row.pattern {
            Pattern::Exact => {
                if let Some(entry) = entry(&at(row.path), row.kind) {
                    found.push(Found {
                        row: i,
                        path: row.path.into(),
                        entry,
                    });
                }
            }
            Pattern::Numbered => {
                for n in numbered(&at(row.path)) {
                    let path = PathBuf::from(format!("{}{n}", row.path));
                    if let Some(entry) = entry(&at(&path.to_string_lossy()), row.kind) {
                        found.push(Found {
                            row: i,
                            path,
                            entry,
                        });
                    }
                }
            }
            Pattern::GpuPciDevices => {
                for dir in gpu_pci_dirs(&at(PCI_DEVICES), root) {
                    found.push(Found {
                        row: i,
                        path: dir,
                        entry: OnHost::Present,
                    });
                }
            }
        }
    }
    GpuHost { found }
}

/// What `path` is, for a row of `kind`; `None` when it does not exist.
fn entry(path: &Path, kind: Kind) -> Option<OnHost> {
    let meta = fs::symlink_metadata(path).ok()?;
    let t = meta.file_type();
    Some(if t.is_symlink() {
        match fs::read_link(path) {
            Ok(target) => OnHost::Symlink(target),
            Err(_) => OnHost::Unexpected("an unreadable symlink"),
        }
    } else {
        match kind {
            Kind::Device if t.is_char_device() => OnHost::Present,
            Kind::Device => OnHost::Unexpected("not a character device"),
            Kind::DeviceDir | Kind::Sys | Kind::Driver if t.is_dir() => OnHost::Present,
            _ => OnHost::Unexpected("not a directory"),
        }
    })
}

/// The numbers N for which `prefix`N exists (`/dev/nvidia` -> 0, 1, ...), in order.
fn numbered(prefix: &Path) -> Vec<u64> {
    let (Some(dir), Some(stem)) = (prefix.parent(), prefix.file_name()) else {
        return Vec::new();
    };
    let Ok(list) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<u64> = list
        .filter_map(|e| {
            let name = e.ok()?.file_name();
            let rest = name.as_bytes().strip_prefix(stem.as_bytes())?;
            if rest.is_empty() || !rest.iter().all(u8::is_ascii_digit) || rest.len() > 9 {
                return None;
            }
            std::str::from_utf8(rest).ok()?.parse().ok()
        })
        .collect();
    out.sort_unstable();
    out
}

/// The directories (under `/sys/devices`, as the host names them) of the PCI devices whose
/// class is a GPU's.
fn gpu_pci_dirs(listing: &Path, root: &Path) -> Vec<PathBuf> {
    let Ok(list) = fs::read_dir(listing) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in list.flatten() {
        let link = e.path();
        let Ok(class) = fs::read_to_string(link.join("class")) else {
            continue;
        };
        if !GPU_CLASSES.iter().any(|c| class.trim().starts_with(c)) {
            continue;
        }
        let Ok(real) = fs::canonicalize(&link) else {
            continue;
        };
        let Ok(rel) = real.strip_prefix(root) else {
            continue;
        };
        let path = Path::new("/").join(rel);
        if path.starts_with("/sys/devices") && real.is_dir() {
            out.push(path);
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn finds_numbered_nodes_gpu_pci_dirs_and_driver_symlinks_and_skips_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(d.path()).unwrap();
        let mk = |p: &str| {
            let p = root.join(p);
            fs::create_dir_all(&p).unwrap();
            p
        };
        mk("dev/dri");
        // Regular files stand in for nodes: the probe says they are not devices.
        fs::write(root.join("dev/nvidiactl"), "").unwrap();
        for n in ["nvidia0", "nvidia12", "nvidia-uvm", "nvidiax1"] {
            fs::write(root.join("dev").join(n), "").unwrap();
        }
        let gpu = mk("sys/devices/pci0000:00/0000:00:02.0");
        fs::write(gpu.join("class"), "0x030000\n").unwrap();
        let nic = mk("sys/devices/pci0000:00/0000:00:03.0");
        fs::write(nic.join("class"), "0x020000\n").unwrap();
        mk("sys/bus/pci/devices");
        for (name, dir) in [("0000:00:02.0", &gpu), ("0000:00:03.0", &nic)] {
            symlink(dir, root.join("sys/bus/pci/devices").join(name)).unwrap();
        }
        mk("run");
        symlink("/nix/store/abc-drivers", root.join("run/opengl-driver")).unwrap();

        let host = probe_under(&root);
        let got: Vec<(String, OnHost)> = host
            .found
            .iter()
            .map(|f| (f.path.display().to_string(), f.entry.clone()))
            .collect();
        let not_dev = OnHost::Unexpected("not a character device");
        assert_eq!(
            got,
            vec![
                ("/dev/nvidiactl".into(), not_dev.clone()),
                ("/dev/nvidia0".into(), not_dev.clone()),
                ("/dev/nvidia12".into(), not_dev.clone()),
                ("/dev/nvidia-uvm".into(), not_dev),
                ("/dev/dri".into(), OnHost::Present),
                ("/sys/bus/pci/devices".into(), OnHost::Present),
                (
                    "/sys/devices/pci0000:00/0000:00:02.0".into(),
                    OnHost::Present
                ),
                (
                    "/run/opengl-driver".into(),
                    OnHost::Symlink("/nix/store/abc-drivers".into())
                ),
            ]
        );
        assert_eq!(host.devices(), vec![Path::new("/dev/dri")]);
    }

    #[test]
    fn a_real_character_device_is_present() {
        assert_eq!(
            entry(Path::new("/dev/null"), Kind::Device),
            Some(OnHost::Present)
        );
        assert_eq!(entry(Path::new("/nonexistent-gpu"), Kind::Device), None);
    }
}
