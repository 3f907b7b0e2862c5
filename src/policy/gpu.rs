//! GPUs (`--gpu`, `gpu = true` in the config file), as data: the table of what CUDA and
//! ROCm need from the host, each row with its reason, and the pure step from what the host
//! was found to hold (gathered by `host::gpu`) to the plan's mounts and notes.
//!
//! Off by default. With the opt-in the sandbox gets whatever of the table exists on this
//! host, and nothing else of `/dev` or `/sys`: no vendor choice, because the table is
//! small, a machine rarely has both vendors' drivers, and the risk that matters (the agent
//! drives a GPU through its kernel driver) is the same for either.
//!
//! Device nodes are bound with device access (`--dev-bind-try`: bwrap's other binds are
//! `nodev`, which makes a node unusable). bwrap has no `--dev-bind-fd`, so they are named:
//! that is safe here because `/dev` is the host's devtmpfs, writable by root alone; no
//! sandbox writes it (each has its own `/dev`), so nothing the agent does can swap a node
//! or a directory of `/dev` for a symlink between the probe and the mount. The `/sys`
//! parts are read-only binds opened by descriptor like every other source
//! (`host::sources`); sysfs is written by the kernel alone, and the binds are read-only,
//! so the agent cannot change a driver's parameters or a device's state through them.
//!
//! Not needed here, found present already: `/proc/driver/nvidia` (nvidia-smi and NVML read
//! it) is part of every procfs mount, so the sandbox's own `/proc` has it; the driver
//! libraries of most distributions live in `/usr` and `/etc` (vulkan, OpenCL ICDs), which
//! are bound. The seccomp filter matches two terminal ioctls by their full request number
//! (`confinement::SECCOMP`), which no GPU ioctl shares (see the test below); Landlock is
//! used only for its socket scope.

use std::path::{Path, PathBuf};

use crate::policy::mount::{Mount, MountKind};
use crate::policy::origin::Origin;

/// What a row binds, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A character device node, bound with device access.
    Device,
    /// A directory of device nodes, bound with device access.
    DeviceDir,
    /// A part of `/sys`, read-only.
    Sys,
    /// Driver userspace that the sandbox otherwise hides, read-only, or the symlink it is.
    Driver,
}

/// Which host paths a row stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// The path itself.
    Exact,
    /// The path followed by a decimal number (`/dev/nvidia` -> `/dev/nvidia0`, ...).
    Numbered,
    /// The directories under `/sys/devices` of the host's PCI devices of class display
    /// controller (0x03) or processing accelerator (0x12): the GPUs themselves.
    GpuPciDevices,
}

/// One row of [`TABLE`].
#[derive(Debug)]
pub struct Row {
    pub path: &'static str,
    pub pattern: Pattern,
    pub kind: Kind,
    pub why: &'static str,
}

const fn row(path: &'static str, pattern: Pattern, kind: Kind, why: &'static str) -> Row {
    Row {
        path,
        pattern,
        kind,
        why,
    }
}

use Kind::{Device, DeviceDir, Driver, Sys};
use Pattern::{Exact, GpuPciDevices, Numbered};

/// Everything `--gpu` can expose, in mount order (devices, then `/sys`, then drivers).
pub const TABLE: &[Row] = &[
    row(
        "/dev/nvidiactl",
        Exact,
        Device,
        "NVIDIA's control device: every CUDA, NVML and nvidia-smi process opens it first",
    ),
    row(
        "/dev/nvidia",
        Numbered,
        Device,
        "one NVIDIA GPU (nvidia0, nvidia1, ...): CUDA and NVML open the GPUs they use",
    ),
    row(
        "/dev/nvidia-uvm",
        Exact,
        Device,
        "CUDA's unified memory: CUDA cannot initialize without it",
    ),
    row(
        "/dev/nvidia-uvm-tools",
        Exact,
        Device,
        "CUDA's profiling and debugging interface (Nsight, cuda-gdb, CUPTI)",
    ),
    row(
        "/dev/nvidia-modeset",
        Exact,
        Device,
        "NVIDIA's mode-setting device: Vulkan, EGL and OpenGL on NVIDIA open it",
    ),
    row(
        "/dev/nvidia-caps",
        Exact,
        DeviceDir,
        "NVIDIA's capability nodes: MIG instances and the capabilities NVML checks",
    ),
    row(
        "/dev/dri",
        Exact,
        DeviceDir,
        "DRM devices (card*, renderD*, by-path links): Mesa, Vulkan, VA-API, and ROCm's \
         per-GPU memory and queues",
    ),
    row(
        "/dev/kfd",
        Exact,
        Device,
        "AMD's compute interface (ROCm's HSA runtime): ROCm cannot initialize without it",
    ),
    row(
        "/dev/dxg",
        Exact,
        Device,
        "WSL2: the paravirtualized GPU; CUDA on WSL goes through it (its libraries are in \
         /usr/lib/wsl, already bound)",
    ),
    row(
        "/sys/module/nvidia",
        Exact,
        Sys,
        "NVIDIA's libraries check the module's initstate and version before they start",
    ),
    row(
        "/sys/module/nvidia_uvm",
        Exact,
        Sys,
        "the unified-memory module's parameters, read by CUDA",
    ),
    row(
        "/sys/module/nvidia_modeset",
        Exact,
        Sys,
        "the mode-setting module's parameters, read by NVIDIA's graphics libraries",
    ),
    row(
        "/sys/module/nvidia_drm",
        Exact,
        Sys,
        "the DRM module's parameters (modeset), read by NVIDIA's graphics libraries",
    ),
    row(
        "/sys/module/amdgpu",
        Exact,
        Sys,
        "amdgpu's parameters, read by ROCm",
    ),
    row(
        "/sys/bus/pci/devices",
        Exact,
        Sys,
        "PCI addresses, each a link to its device: CUDA, NVML and ROCm find the GPU's \
         PCI device here (only the GPUs' own directories are bound, the other links lead \
         nowhere)",
    ),
    row(
        "/sys/dev/char",
        Exact,
        Sys,
        "device number -> device links: libdrm goes from an open /dev node to its PCI GPU",
    ),
    row(
        "/sys/class/drm",
        Exact,
        Sys,
        "the DRM devices, links to their GPUs: libdrm, Mesa and ROCm list the GPUs here",
    ),
    row(
        "/sys/class/kfd",
        Exact,
        Sys,
        "ROCm's topology, as a link into /sys/devices/virtual/kfd",
    ),
    row(
        "/sys/devices/virtual/kfd",
        Exact,
        Sys,
        "ROCm's topology (nodes, memory banks, caches, links): the HSA runtime reads it to \
         find the GPUs",
    ),
    row(
        "/sys/devices/system/node",
        Exact,
        Sys,
        "NUMA nodes and their CPUs: CUDA and ROCm read them at start to place memory near \
         the GPU",
    ),
    row(
        "/sys/devices/pci*/.../GPU",
        GpuPciDevices,
        Sys,
        "the GPU's own PCI device directory (vendor, device, NUMA node, resources, its DRM \
         nodes), where the links above lead",
    ),
    row(
        "/run/opengl-driver",
        Exact,
        Driver,
        "NixOS: the driver's userspace (libcuda, libnvidia-ml, Vulkan and OpenGL drivers), \
         not under /usr there",
    ),
    row(
        "/run/opengl-driver-32",
        Exact,
        Driver,
        "NixOS: the 32-bit driver userspace",
    ),
];

/// The device nodes `--check` and the launch look for, as one line.
pub const DEVICE_SUMMARY: &str = "/dev/nvidia*, /dev/dri, /dev/kfd, /dev/dxg";

/// Said to Claude (its system prompt's sandbox note) when the opt-in found a GPU.
pub const PROMPT_NOTE: &str = " The host's GPUs are available (their device nodes, and \
    read-only the parts of /sys their drivers read): CUDA and ROCm work.";

/// What a path of the table turned out to be on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnHost {
    /// What the row expects: a character device, a directory.
    Present,
    /// A symlink (a `Driver` row: NixOS's `/run/opengl-driver` leads into `/nix/store`).
    Symlink(PathBuf),
    /// Something else, left out, and why.
    Unexpected(&'static str),
}

/// One host path of one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Index in [`TABLE`].
    pub row: usize,
    pub path: PathBuf,
    pub entry: OnHost,
}

/// What `host::gpu::probe` found of [`TABLE`] on this host (the paths that exist).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuHost {
    pub found: Vec<Found>,
}

impl GpuHost {
    /// The device nodes (and directories of them) that will be bound.
    pub fn devices(&self) -> Vec<&Path> {
        self.found
            .iter()
            .filter(|f| f.entry == OnHost::Present)
            .filter(|f| matches!(TABLE[f.row].kind, Device | DeviceDir))
            .map(|f| f.path.as_path())
            .collect()
    }
}

/// The line said when the opt-in is set and no device node is there.
pub fn no_devices_line() -> String {
    format!("no GPU device nodes found: {DEVICE_SUMMARY}")
}

/// The opt-in's mounts, placed right after the sandbox's own `/dev` and `/proc`, and its
/// notes for `--dry-run`: the risk, the rows skipped on this host, and a missing GPU.
pub fn plan(host: &GpuHost, origin: &Origin) -> (Vec<Mount>, Vec<String>) {
    let mut mounts = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for (i, r) in TABLE.iter().enumerate() {
        let found: Vec<&Found> = host.found.iter().filter(|f| f.row == i).collect();
        if found.is_empty() {
            skipped.push(format!("{} (not on this host)", r.path));
        }
        for f in found {
            let (kind, source) = match (&f.entry, r.kind) {
                (OnHost::Unexpected(what), _) => {
                    skipped.push(format!(
                        "{} ({what})",
                        crate::policy::escape::shown(&f.path)
                    ));
                    continue;
                }
                (OnHost::Symlink(target), Driver) => (MountKind::Symlink, target.clone()),
                (OnHost::Symlink(_), _) => {
                    skipped.push(format!(
                        "{} (a symlink)",
                        crate::policy::escape::shown(&f.path)
                    ));
                    continue;
                }
                (OnHost::Present, Device | DeviceDir) => (MountKind::DevBind, f.path.clone()),
                (OnHost::Present, Sys | Driver) => (MountKind::RoTry, f.path.clone()),
            };
            mounts.push(Mount {
                kind,
                source: Some(source),
                target: f.path.clone(),
                why: format!("--gpu: {}", r.why),
                origin: origin.clone(),
            });
        }
    }
    let devices = host.devices();
    let mut notes = vec![format!(
        "opt-in --gpu ({origin}): the agent gets the GPUs: it can drive them through the \
         driver's whole ioctl interface (kernel code the sandbox otherwise keeps out of \
         reach), read what other processes left in GPU memory where the driver does not \
         clear it, and keep the GPUs busy; only the device nodes and /sys parts listed \
         above are added"
    )];
    if devices.is_empty() {
        notes.push(format!(
            "gpu: {}; the sandbox starts without a GPU",
            no_devices_line()
        ));
    }
    if !skipped.is_empty() {
        notes.push(format!("gpu: skipped: {}", skipped.join(", ")));
    }
    (mounts, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(path: &str, entry: OnHost) -> Found {
        let row = TABLE
            .iter()
            .position(|r| match r.pattern {
                Pattern::Exact => r.path == path,
                Pattern::Numbered => path
                    .strip_prefix(r.path)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
                Pattern::GpuPciDevices => path.starts_with("/sys/devices/pci"),
            })
            .unwrap_or_else(|| panic!("no row for {path}"));
        Found {
            row,
            path: path.into(),
            entry,
        }
    }

    #[test]
    fn every_row_has_a_reason_and_a_path_of_its_kind() {
        for r in TABLE {
            assert!(r.why.len() > 20, "{}", r.path);
            let prefix = match r.kind {
                Device | DeviceDir => "/dev/",
                Sys => "/sys/",
                Driver => "/run/",
            };
            assert!(r.path.starts_with(prefix), "{}", r.path);
        }
        // Nothing wholesale: not /dev, not /sys, not a whole class of /sys.
        for r in TABLE {
            assert!(
                !["/dev", "/sys", "/sys/class", "/sys/devices", "/sys/bus"].contains(&r.path),
                "{}",
                r.path
            );
        }
    }

    #[test]
    fn found_rows_become_mounts_of_their_kind_and_the_rest_are_skipped() {
        let host = GpuHost {
            found: vec![
                found("/dev/nvidiactl", OnHost::Present),
                found("/dev/nvidia0", OnHost::Present),
                found("/dev/nvidia1", OnHost::Present),
                found("/dev/dri", OnHost::Present),
                found("/dev/kfd", OnHost::Unexpected("not a character device")),
                found("/sys/class/drm", OnHost::Present),
                found("/sys/devices/pci0000:00/0000:00:02.0", OnHost::Present),
                found(
                    "/run/opengl-driver",
                    OnHost::Symlink("/nix/store/x-graphics-drivers".into()),
                ),
            ],
        };
        let (mounts, notes) = plan(&host, &Origin::CommandLine);
        let rows: Vec<(String, String, String)> = mounts
            .iter()
            .map(|m| {
                (
                    m.kind.to_string(),
                    m.source.as_ref().unwrap().display().to_string(),
                    m.target.display().to_string(),
                )
            })
            .collect();
        let r = |k: &str, s: &str, t: &str| (k.to_string(), s.to_string(), t.to_string());
        assert_eq!(
            rows,
            vec![
                r("dev-bind?", "/dev/nvidiactl", "/dev/nvidiactl"),
                r("dev-bind?", "/dev/nvidia0", "/dev/nvidia0"),
                r("dev-bind?", "/dev/nvidia1", "/dev/nvidia1"),
                r("dev-bind?", "/dev/dri", "/dev/dri"),
                r("ro?", "/sys/class/drm", "/sys/class/drm"),
                r(
                    "ro?",
                    "/sys/devices/pci0000:00/0000:00:02.0",
                    "/sys/devices/pci0000:00/0000:00:02.0"
                ),
                r(
                    "symlink",
                    "/nix/store/x-graphics-drivers",
                    "/run/opengl-driver"
                ),
            ]
        );
        assert!(mounts.iter().all(|m| m.origin == Origin::CommandLine));
        assert!(mounts.iter().all(|m| m.why.starts_with("--gpu: ")));
        assert!(notes[0].starts_with("opt-in --gpu (command line): the agent gets the GPUs"));
        let skipped = notes
            .iter()
            .find(|n| n.starts_with("gpu: skipped: "))
            .unwrap();
        for s in [
            "/dev/nvidia-uvm (not on this host)",
            "/dev/kfd (not a character device)",
            "/sys/module/amdgpu (not on this host)",
            "/run/opengl-driver-32 (not on this host)",
        ] {
            assert!(skipped.contains(s), "{s}: {skipped}");
        }
        assert!(!skipped.contains("/dev/nvidiactl"), "{skipped}");
        assert!(!notes.iter().any(|n| n.contains("no GPU device nodes")));
    }

    #[test]
    fn no_device_node_is_said_and_sys_alone_is_still_bound() {
        let host = GpuHost {
            found: vec![found("/sys/dev/char", OnHost::Present)],
        };
        let (mounts, notes) = plan(&host, &Origin::Default);
        assert_eq!(mounts.len(), 1);
        assert!(
            notes.iter().any(|n| n
                == "gpu: no GPU device nodes found: /dev/nvidia*, /dev/dri, /dev/kfd, /dev/dxg; \
                    the sandbox starts without a GPU"),
            "{notes:?}"
        );
        assert!(host.devices().is_empty());
    }

    #[test]
    fn a_symlink_is_bound_only_where_the_row_allows_it() {
        let host = GpuHost {
            found: vec![found("/dev/nvidiactl", OnHost::Symlink("/tmp/x".into()))],
        };
        let (mounts, notes) = plan(&host, &Origin::Default);
        assert!(mounts.is_empty());
        assert!(notes
            .iter()
            .any(|n| n.contains("/dev/nvidiactl (a symlink)")));
    }

    /// The ioctl type byte (bits 8..16 of the request) of NVIDIA's ('F'), DRM's ('d'), AMD
    /// KFD's ('K') and WSL's dxgkrnl ('G') ioctls: the seccomp table matches whole request
    /// numbers, none of which is theirs, so the filter leaves the GPU drivers' ioctls alone.
    #[test]
    fn the_seccomp_table_blocks_no_gpu_ioctl() {
        for rule in crate::policy::confinement::SECCOMP {
            let Some(arg) = &rule.arg else {
                assert_ne!(rule.syscall, "ioctl", "an ioctl rule without an argument");
                assert_ne!(rule.syscall, "mmap");
                assert_ne!(rule.syscall, "openat");
                continue;
            };
            let ty = (arg.value >> 8) & 0xff;
            for gpu in [b'F', b'd', b'K', b'G'] {
                assert_ne!(ty, u32::from(gpu), "{} {}", rule.syscall, arg.name);
            }
        }
    }

    mod in_the_plan {
        use super::*;
        use crate::policy::plan::tests::test_inputs;
        use crate::policy::plan::{build, Inputs};
        use crate::policy::render::{self, Bind, Runtime, Sources};
        use crate::policy::settings::Settings;

        fn host() -> GpuHost {
            GpuHost {
                found: vec![
                    found("/dev/nvidia0", OnHost::Present),
                    found("/dev/dri", OnHost::Present),
                    found("/sys/dev/char", OnHost::Present),
                ],
            }
        }

        fn with(gpu: Option<Origin>) -> Inputs {
            Inputs {
                gpu: host(),
                settings: Settings {
                    gpu,
                    ..Settings::default()
                },
                ..test_inputs()
            }
        }

        #[test]
        fn off_by_default_even_on_a_host_with_gpus() {
            let plan = build(&with(None));
            assert!(
                !plan.mounts.iter().any(|m| m.kind == MountKind::DevBind
                    || m.target.starts_with("/sys")
                    || (m.target.starts_with("/dev") && m.target != Path::new("/dev"))),
                "{:?}",
                plan.mounts
            );
            assert!(!plan.notes.iter().any(|n| n.contains("gpu")));
            let note = crate::policy::plan::sandbox_note(&with(None));
            assert!(!note.to_string_lossy().contains("GPU"));
            let argv = crate::policy::escape::shell_line(&render::argv(&plan));
            let argv = String::from_utf8(argv).unwrap();
            assert!(
                !argv.contains("--dev-bind") && !argv.contains("/sys"),
                "{argv}"
            );
        }

        #[test]
        fn on_it_binds_over_the_sandbox_dev_and_says_where_it_came_from() {
            let origin = Origin::ConfigFile {
                path: "/h/.config/claudebox/config.toml".into(),
                line: 3,
            };
            let plan = build(&with(Some(origin)));
            let at = |t: &str| plan.mounts.iter().position(|m| m.target == Path::new(t));
            let dev = at("/dev").unwrap();
            let proc = at("/proc").unwrap();
            let home = at("/h").unwrap();
            for t in ["/dev/nvidia0", "/dev/dri", "/sys/dev/char"] {
                let i = at(t).unwrap_or_else(|| panic!("{t}"));
                assert!(dev < i && proc < i && i < home, "{t}");
            }
            let text = String::from_utf8(render::dry_run(&plan)).unwrap();
            for line in [
                "dev-bind?\t/dev/nvidia0\t/dev/nvidia0\t--gpu: one NVIDIA GPU",
                "dev-bind?\t/dev/dri\t/dev/dri\t--gpu: DRM devices",
                "ro?\t/sys/dev/char\t/sys/dev/char\t--gpu: device number",
            ] {
                let row = text
                    .lines()
                    .find(|l| l.starts_with(line))
                    .unwrap_or_else(|| panic!("{line}\n{text}"));
                assert!(
                    row.ends_with("\tconfig /h/.config/claudebox/config.toml:3"),
                    "{row}"
                );
            }
            assert!(text.contains(
                "opt-in --gpu (config /h/.config/claudebox/config.toml:3): the agent gets the GPUs"
            ));
            assert!(text.contains("gpu: skipped: /dev/nvidiactl (not on this host)"));
            let note = crate::policy::plan::sandbox_note(&with(Some(Origin::CommandLine)));
            assert!(note.to_string_lossy().contains(PROMPT_NOTE));
            let line =
                String::from_utf8(crate::policy::escape::shell_line(&render::argv(&plan))).unwrap();
            assert!(
                line.contains(
                    "--dev /dev --proc /proc --tmpfs /tmp --dev-bind-try /dev/nvidia0 /dev/nvidia0 \
                     --dev-bind-try /dev/dri /dev/dri --ro-bind-try /sys/dev/char /sys/dev/char"
                ),
                "{line}"
            );
        }

        /// At the launch the /sys parts are mounted from descriptors like every other
        /// source; the device nodes stay named (bwrap has no --dev-bind-fd).
        #[test]
        fn at_the_launch_sys_goes_by_descriptor_and_devices_by_name() {
            let plan = build(&with(Some(Origin::CommandLine)));
            let table: Vec<Bind> = plan
                .mounts
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    if crate::policy::plan::is_bind(&m.kind) {
                        Bind::Fd(100 + i as i32)
                    } else {
                        Bind::Other
                    }
                })
                .collect();
            let rt = Runtime {
                sources: Sources::Fds(&table),
                ..Runtime::DRY_RUN
            };
            let argv: Vec<String> = render::argv_with(&plan, &rt)
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let pos = |w: &[&str]| argv.windows(w.len()).position(|x| x == w);
            assert!(pos(&["--dev-bind-try", "/dev/nvidia0", "/dev/nvidia0"]).is_some());
            let i = plan
                .mounts
                .iter()
                .position(|m| m.target == Path::new("/sys/dev/char"))
                .unwrap();
            let fd = (100 + i).to_string();
            assert!(
                pos(&["--ro-bind-fd", &fd, "/sys/dev/char"]).is_some(),
                "{argv:?}"
            );
        }
    }
}
