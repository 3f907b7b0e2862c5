//! `--gpu` through real bwrap. There is no GPU on the test machines: as root the tests make
//! device nodes with GPU names on the host (clones of /dev/null and /dev/zero, names no
//! real driver uses) and show them usable inside with the opt-in, absent without it, and
//! unusable when bound without device access (the control: bwrap's other binds are
//! nodev). As an ordinary user, who cannot make nodes, they check the rest (/sys read-only
//! and nothing else of it, the warning, `--check`) and say what they skipped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::BIN;
use lab::maintenance::is_root;
use lab::*;

/// A numbered NVIDIA node no driver makes (nvidia0.. count GPUs) and a render node far
/// above the 128.. that DRM hands out.
const NVIDIA: &str = "/dev/nvidia9731";
const DRI: &str = "/dev/dri";
const RENDER: &str = "/dev/dri/renderD231";

/// Fake device nodes on the host, removed when dropped (also when the test fails).
struct FakeNodes {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl FakeNodes {
    /// `None` when this process cannot make device nodes (not root, or a /dev that
    /// refuses mknod).
    fn make() -> Option<FakeNodes> {
        if !is_root() {
            return None;
        }
        let mut made = FakeNodes {
            files: Vec::new(),
            dirs: Vec::new(),
        };
        if !Path::new(DRI).exists() {
            fs::create_dir(DRI).ok()?;
            made.dirs.push(DRI.into());
        }
        // Leftovers of a run that was killed carry these unlikely names: replace them.
        for (path, minor) in [(NVIDIA, "3"), (RENDER, "5")] {
            let _ = fs::remove_file(path);
            let ok = Command::new("mknod")
                .args(["-m", "666", path, "c", "1", minor])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!("gpu: mknod {path} failed: /dev refuses device nodes here");
                return None;
            }
            made.files.push(path.into());
        }
        Some(made)
    }
}

impl Drop for FakeNodes {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = fs::remove_file(f);
        }
        for d in &self.dirs {
            let _ = fs::remove_dir(d);
        }
    }
}

/// Whether the host has any of the device nodes `--gpu` looks for.
fn host_has_gpu_nodes() -> bool {
    let numbered = fs::read_dir("/dev").is_ok_and(|d| {
        d.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.strip_prefix("nvidia")
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        })
    });
    numbered
        || [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
            "/dev/nvidia-caps",
            "/dev/dri",
            "/dev/kfd",
            "/dev/dxg",
        ]
        .iter()
        .any(|p| Path::new(p).exists())
}

/// What the sandbox sees, one `KEY=value` line each.
const LOOK: &str = r#"
r() { printf '%s=%s\n' "$1" "$2"; }
if [ -c /dev/nvidia9731 ]; then r nvidia char; elif [ -e /dev/nvidia9731 ]; then r nvidia other; else r nvidia absent; fi
if (echo x > /dev/nvidia9731) 2>/dev/null; then r nvidia-write ok; else r nvidia-write refused; fi
r render "$(head -c 4 /dev/dri/renderD231 2>/dev/null | od -An -tx1 | tr -d ' \n')"
for p in /sys /sys/dev/char /sys/bus/pci/devices /sys/devices/system/node /sys/kernel \
         /sys/fs/cgroup /sys/class/net /sys/firmware /sys/block /sys/devices/system/cpu; do
  if [ -e "$p" ]; then r "$p" present; else r "$p" absent; fi
done
r sys "$(ls /sys 2>/dev/null | tr '\n' ' ')"
r sys-devices "$(ls /sys/devices 2>/dev/null | tr '\n' ' ')"
r sys-write "$(touch /sys/dev/char/cb-gpu-probe 2>&1 | sed 's/.*: //')"
r sys-mkdir "$(mkdir /sys/bus/pci/devices/cb-gpu-probe 2>&1 | sed 's/.*: //')"
"#;

fn look(w: &World, cwd: &Path, args: &[&str]) -> (Output, Vec<(String, String)>) {
    let o = w
        .cmd(cwd)
        .args(args)
        .args(["--exec", "sh", "-c", LOOK])
        .output()
        .unwrap();
    let seen = stdout(&o)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect();
    (o, seen)
}

fn get<'a>(seen: &'a [(String, String)], key: &str) -> &'a str {
    seen.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{key} not reported: {seen:?}"))
}

#[test]
fn gpu_nodes_work_inside_with_the_opt_in_and_sys_is_read_only_and_minimal() {
    let w = World::heavy(BIN);
    let proj = w.dir("proj");
    let nodes = FakeNodes::make();
    if nodes.is_none() {
        eprintln!(
            "gpu: skipped the device-node checks (usable inside, absent without --gpu, \
             the nodev control): not root, so no device nodes can be made"
        );
    }

    let (o, seen) = look(&w, &proj, &["--gpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    if nodes.is_some() {
        // A char device, usable: writing to the null clone works, the zero clone reads
        // zeros. A nodev mount would refuse both.
        assert_eq!(get(&seen, "nvidia"), "char", "{seen:?}");
        assert_eq!(get(&seen, "nvidia-write"), "ok", "{seen:?}");
        assert_eq!(get(&seen, "render"), "00000000", "{seen:?}");
        assert!(
            !stderr(&o).contains("no GPU device nodes"),
            "{}",
            stderr(&o)
        );
    } else if !host_has_gpu_nodes() {
        assert!(
            stderr(&o).contains(
                "claudebox: gpu: warning: no GPU device nodes found: /dev/nvidia*, /dev/dri, \
                 /dev/kfd, /dev/dxg; the sandbox starts without a GPU"
            ),
            "{}",
            stderr(&o)
        );
        assert_eq!(get(&seen, "nvidia"), "absent");
    }
    // The /sys parts drivers read, read-only, where this host has them.
    for p in [
        "/sys/dev/char",
        "/sys/bus/pci/devices",
        "/sys/devices/system/node",
    ] {
        if Path::new(p).exists() {
            assert_eq!(get(&seen, p), "present", "{p}: {seen:?}");
        }
    }
    assert_eq!(get(&seen, "sys-write"), "Read-only file system", "{seen:?}");
    assert_eq!(get(&seen, "sys-mkdir"), "Read-only file system", "{seen:?}");
    // Nothing else of /sys.
    for p in [
        "/sys/kernel",
        "/sys/fs/cgroup",
        "/sys/class/net",
        "/sys/firmware",
        "/sys/block",
        "/sys/devices/system/cpu",
    ] {
        assert_eq!(get(&seen, p), "absent", "{p}: {seen:?}");
    }
    for top in get(&seen, "sys").split_whitespace() {
        assert!(
            ["bus", "dev", "devices", "class", "module"].contains(&top),
            "/sys/{top} inside: {seen:?}"
        );
    }
    for dir in get(&seen, "sys-devices").split_whitespace() {
        assert!(
            dir == "system" || dir == "virtual" || dir.starts_with("pci"),
            "/sys/devices/{dir} inside: {seen:?}"
        );
    }

    // Without the opt-in: no node, no /sys at all.
    let (o, seen) = look(&w, &proj, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(get(&seen, "nvidia"), "absent", "{seen:?}");
    assert_eq!(get(&seen, "render"), "", "{seen:?}");
    assert_eq!(get(&seen, "/sys"), "absent", "{seen:?}");

    // The control: the same node bound without device access (`--ro`, nodev like every
    // bind but --gpu's) is there and cannot be used.
    if nodes.is_some() {
        let (o, seen) = look(&w, &proj, &["--ro", NVIDIA]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(get(&seen, "nvidia"), "char", "{seen:?}");
        assert_eq!(get(&seen, "nvidia-write"), "refused", "{seen:?}");
    }
    // The same launch by an ordinary user (the suite's `claudebox-test`): root's nodes
    // show as nobody's in the user namespace and open by their mode, as a GPU's 0666
    // nodes would.
    if nodes.is_some() {
        match look_as_ordinary_user() {
            Some(seen) => {
                assert_eq!(get(&seen, "nvidia"), "char", "{seen:?}");
                assert_eq!(get(&seen, "nvidia-write"), "ok", "{seen:?}");
                assert_eq!(get(&seen, "render"), "00000000", "{seen:?}");
                assert_eq!(get(&seen, "sys-write"), "Read-only file system");
            }
            None => eprintln!(
                "gpu: skipped the ordinary user's launch with the nodes: no user \
                 claudebox-test, or it cannot run {BIN}"
            ),
        }
    }
    drop(nodes);
    assert!(!Path::new(NVIDIA).exists() && !Path::new(RENDER).exists());
}

/// `--gpu --exec sh -c LOOK` run as the user `claudebox-test`, in a home and project of
/// its own; `None` when there is no such user or it cannot run claudebox.
fn look_as_ordinary_user() -> Option<Vec<(String, String)>> {
    const USER: &str = "claudebox-test";
    let runs = |args: &[&str]| {
        Command::new("runuser")
            .args(["-u", USER, "--"])
            .args(args)
            .output()
            .ok()
    };
    if !runs(&["test", "-x", BIN]).is_some_and(|o| o.status.success()) {
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("claudebox-gpu-user-")
        .tempdir()
        .ok()?;
    let root = fs::canonicalize(dir.path()).ok()?;
    let (home, proj) = (root.join("home"), root.join("proj"));
    fs::create_dir_all(&home).ok()?;
    fs::create_dir_all(&proj).ok()?;
    let chown = Command::new("chown")
        .args(["-R", USER])
        .arg(&root)
        .status()
        .ok()?;
    assert!(chown.success());
    let o = Command::new("runuser")
        .args(["-u", USER, "--", "env", "-i"])
        .arg(format!("HOME={}", home.display()))
        .args(["PATH=/usr/local/bin:/usr/bin:/bin", BIN, "--gpu", "--exec"])
        .args(["sh", "-c", LOOK])
        .current_dir(&proj)
        .output()
        .ok()?;
    assert!(o.status.success(), "{}", stderr(&o));
    Some(
        stdout(&o)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect(),
    )
}

/// The `gpu` row of `--check`, if any: (status, detail).
fn gpu_row(out: &str) -> Option<(String, String)> {
    out.lines().find(|l| l.get(6..10) == Some("gpu ")).map(|l| {
        (
            l[..5].trim().to_string(),
            l.get(24..).unwrap_or("").to_string(),
        )
    })
}

fn check(w: &World, args: &[&str]) -> String {
    let tmp = w.root().join("tmp");
    fs::create_dir_all(&tmp).unwrap();
    // From a project outside HOME (the config file must not lie inside the project).
    let o = w
        .cmd(&w.dir("proj"))
        .arg("--check")
        .args(args)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    stdout(&o)
}

#[test]
fn check_says_which_gpu_nodes_exist_when_the_opt_in_is_set() {
    let w = World::heavy(BIN);
    // No opt-in: no row.
    let out = check(&w, &[]);
    assert_eq!(gpu_row(&out), None, "{out}");

    if !host_has_gpu_nodes() {
        let out = check(&w, &["--gpu"]);
        assert_eq!(
            gpu_row(&out),
            Some((
                "warn".into(),
                "no GPU device nodes found: /dev/nvidia*, /dev/dri, /dev/kfd, /dev/dxg (opt-in: command \
                 line); a launch goes on without a GPU"
                    .into()
            )),
            "{out}"
        );
    }
    let Some(nodes) = FakeNodes::make() else {
        eprintln!("gpu: skipped --check with device nodes: not root, none can be made");
        return;
    };
    // The opt-in from the config file this time.
    let cfg = w.home().join(".config/claudebox/config.toml");
    fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    fs::write(&cfg, "gpu = true\n").unwrap();
    let out = check(&w, &[]);
    drop(nodes);
    let (status, detail) = gpu_row(&out).unwrap_or_else(|| panic!("no gpu row:\n{out}"));
    assert_eq!(status, "ok", "{out}");
    assert!(detail.starts_with("device nodes found: "), "{detail}");
    assert!(detail.contains(NVIDIA) && detail.contains(DRI), "{detail}");
    assert!(
        detail.ends_with(&format!(
            "(opt-in: config {}:1); a sandbox sees them",
            cfg.display()
        )),
        "{detail}"
    );
}

/// The opt-in's layers, as `--dry-run` shows them: the config file's top level, a
/// `[[project]]` section over it, the command line over both; off when none says so.
#[test]
fn the_opt_in_layers_like_the_other_opt_ins() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    let other = w.dir("other");
    let cfg = w.home().join(".config/claudebox/config.toml");
    fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    let shown = cfg.display().to_string();
    let dry =
        |cwd: &Path, args: &[&str]| ok(&w.cmd(cwd).args(args).arg("--dry-run").output().unwrap());
    let opt_in = |out: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix("opt-in --gpu ("))
            .map(|l| l.split_once(')').unwrap().0.to_string())
    };

    let out = dry(&proj, &[]);
    assert_eq!(opt_in(&out), None, "off by default:\n{out}");
    assert!(
        !out.contains("--gpu:") && !out.contains("--dev-bind"),
        "{out}"
    );

    fs::write(
        &cfg,
        format!(
            "gpu = true\n\n[[project]]\nroot = \"{}\"\ngpu = false\n",
            proj.display()
        ),
    )
    .unwrap();
    assert_eq!(opt_in(&dry(&other, &[])), Some(format!("config {shown}:1")));
    assert_eq!(
        opt_in(&dry(&proj, &[])),
        None,
        "the project's section turns it off"
    );
    assert_eq!(
        opt_in(&dry(&proj, &["--gpu"])),
        Some("command line".to_string())
    );

    fs::write(
        &cfg,
        format!("[[project]]\nroot = \"{}\"\ngpu = true\n", proj.display()),
    )
    .unwrap();
    let out = dry(&proj, &[]);
    assert_eq!(opt_in(&out), Some(format!("config {shown}:3")));
    if Path::new("/sys/dev/char").exists() {
        let row = out
            .lines()
            .find(|l| l.starts_with("ro?\t/sys/dev/char\t/sys/dev/char\t--gpu: "))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(row.ends_with(&format!("\tconfig {shown}:3")), "{row}");
    }
    assert!(out.contains("\ngpu: skipped: "), "{out}");
    assert_eq!(opt_in(&dry(&other, &[])), None, "another project");

    fs::write(&cfg, "gpu = \"yes\"\n").unwrap();
    let o = w.cmd(&proj).arg("--dry-run").output().unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!(
            "{shown}:1:7: invalid type: string \"yes\", expected a boolean"
        )),
        "{}",
        stderr(&o)
    );
}
