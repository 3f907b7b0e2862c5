//! Attempts with `--gpu` on: the opt-in adds device nodes and parts of `/sys`, and the
//! agent tries to use that opening for more than the GPU: other host devices, a device
//! node of its own, the rest of `/sys`, another PCI device's files, writing to `/sys`.
//! The controls run the same code on the host, where nothing stops it.

use std::process::Command;

use super::{attempt, Arena, Attempt, MARK};
use lab::maintenance::is_root;
use lab::*;

/// Host devices other than a GPU's: disks, KVM, memory, the kernel log, input, sound,
/// cameras.
const OTHER_DEVICES: &str = r#"for d in /dev/vda /dev/sda /dev/nvme0n1 /dev/kvm /dev/mem /dev/kmem \
  /dev/port /dev/kmsg /dev/input /dev/snd /dev/video0 /dev/hidraw0 /dev/fuse /dev/loop0 \
  /dev/loop-control /dev/btrfs-control /dev/tty0 /dev/console; do
  [ -e "$d" ] && echo "ESCAPED $d is there"
done"#;

/// The sysfs files of a PCI device that is not a GPU (class 0x03/0x12).
const OTHER_PCI: &str = r#"for d in /sys/bus/pci/devices/*; do
  c=$(cat "$d/class" 2>/dev/null)
  case "$c" in 0x03*|0x12*) continue;; esac
  [ -r "$d/uevent" ] && echo "ESCAPED read $d"
done"#;

/// The kernel's and the cgroups' parts of /sys.
const REST_OF_SYS: &str = r#"for p in /sys/kernel /sys/fs/cgroup /sys/firmware /sys/class/net \
  /sys/block /sys/power /sys/devices/system/cpu /sys/module/kvm; do
  [ -e "$p" ] && echo "ESCAPED $p is there"
done"#;

/// A device node of its own, then used: any node would do once that works (a disk's, the
/// memory's); the attempt makes /dev/null's (1:3), which every kernel has and a machine's
/// device policy allows to root. mknod needs CAP_MKNOD, and a node on a nodev mount
/// cannot be opened.
fn own_node(dir: &str) -> String {
    format!(
        r#"rm -f {dir}/cb-gpu-node
if mknod {dir}/cb-gpu-node c 1 3 2>/dev/null && (echo x > {dir}/cb-gpu-node) 2>/dev/null; then
  echo "ESCAPED used a device node of its own"
fi
rm -f {dir}/cb-gpu-node"#
    )
}

/// Writing into the /sys parts the opt-in binds: a new file, and every attribute found.
const WRITE_SYS: &str = r#"for d in /sys/dev/char /sys/bus/pci/devices /sys/devices/system/node; do
  [ -d "$d" ] || continue
  (: > "$d/cb-gpu-planted") 2>/dev/null && echo "ESCAPED created a file in $d"
done
find /sys -type f 2>/dev/null | head -300 | while read -r f; do
  (printf '' >> "$f") 2>/dev/null && echo "ESCAPED opened $f for writing"
done"#;

fn with_gpu(name: &'static str, script: impl Into<String>) -> Attempt {
    let mut a = attempt(name, script);
    a.args = vec!["--gpu".into()];
    a
}

pub(crate) fn attempts(_a: &Arena) -> Vec<Attempt> {
    vec![
        with_gpu(
            "--gpu: open a host device that is not a GPU's (disk, kvm, mem, input)",
            OTHER_DEVICES,
        ),
        with_gpu("--gpu: read another PCI device's sysfs files", OTHER_PCI),
        with_gpu(
            "--gpu: reach the rest of /sys (kernel, cgroups, firmware)",
            REST_OF_SYS,
        ),
        with_gpu(
            "--gpu: make a device node of its own and use it",
            own_node("/dev"),
        ),
        with_gpu(
            "--gpu: write to the /sys parts bound for the driver",
            WRITE_SYS,
        ),
    ]
}

/// The same code on the host: the devices, the PCI devices' files and the rest of /sys
/// are there, and root can make a device node and use it. (Writing to /sys has no control:
/// on the host it would change the machine; `gpu.rs` shows the write stopped by the
/// read-only mount, before sysfs's own permissions.)
pub(crate) fn controls(_a: &Arena) {
    let host = |script: &str| -> String {
        let o = Command::new("sh").args(["-c", script]).output().unwrap();
        stdout(&o)
    };
    let has_pci = std::fs::read_dir("/sys/bus/pci/devices").is_ok_and(|mut d| d.next().is_some());
    for (name, script, applies) in [
        ("other devices", OTHER_DEVICES, true),
        ("another PCI device", OTHER_PCI, has_pci),
        ("the rest of /sys", REST_OF_SYS, true),
    ] {
        if applies {
            assert!(host(script).contains(MARK), "gpu control: {name}");
        }
    }
    // Root's devtmpfs takes a node and opens it.
    if is_root() {
        let out = host(&own_node("/dev"));
        assert!(out.contains(MARK), "gpu control: a node of its own: {out}");
    }
}
