//! The sandbox's limits (`--memory`, `--pids`, `--cpu`, the config keys, the default
//! process limit). On a kernel with cgroup v2 delegated to the user (tests/vm/limits.sh
//! boots one in qemu): a fork bomb and an allocation past the limit are held or end the
//! sandbox while a process outside still starts, with the controls without the limit. On
//! this host: the limits apply where it can, and where it cannot a requested limit refuses
//! with one line and the default warns once, with their controls.

use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use crate::vm;
use crate::BIN;
use lab::{stderr, stdout, World};

/// The `limits` row of `claudebox --check` on this host: (status, detail).
fn check_row(w: &World, cwd: &Path) -> (String, String) {
    let out = w.cmd(cwd).arg("--check").output().unwrap();
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.len() > 23 && l[6..23].trim_end() == "limits")
        .unwrap_or_else(|| panic!("no limits row:\n{text}"))
        .to_string();
    (line[..5].trim_end().to_string(), line[23..].to_string())
}

/// A fork tree of 2^8 shells that each wait; the most processes seen from inside.
const TREE: &str = "f() { if [ $1 -gt 0 ]; then f $(($1-1)) & f $(($1-1)); fi; sleep 2; }; \
    f 8 2>/dev/null & m=0; i=0; while [ $i -lt 200 ]; do set -- /proc/[0-9]*; \
    [ $# -gt $m ] && m=$#; i=$((i+1)); done; echo $m";

#[test]
fn on_this_host_limits_apply_or_a_requested_one_refuses() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let (status, detail) = check_row(&w, &p);
    if status == "ok" {
        // This host delegates cgroup v2 to this user (root on a cgroup v2 host): the
        // limit holds a fork tree, and the control without it reaches far more.
        let _heavy = lab::heavy();
        let run = |pids: &str| {
            let out = w
                .cmd(&p)
                .args(["--pids", pids, "--exec", "sh", "-c", TREE])
                .output()
                .unwrap();
            let n: u32 = stdout(&out).trim().parse().unwrap_or_else(|_| {
                panic!("{}\n{}", stdout(&out), stderr(&out));
            });
            (n, stderr(&out))
        };
        let (limited, err) = run("32");
        assert!(limited <= 40, "{limited}");
        assert!(
            err.contains("reached its process limit (--pids 32)"),
            "{err}"
        );
        let (unlimited, err) = run("max");
        assert!(unlimited >= 200, "{unlimited}");
        assert!(!err.contains("process limit"), "{err}");
        return;
    }
    eprintln!("this host cannot apply limits ({detail}): checking the refusal and the warning");
    assert_eq!(status, "warn");
    // A requested limit: refused with one line naming it and the fix; nothing runs.
    let marker = p.join("ran");
    let out = w
        .cmd(&p)
        .args(["--memory", "1G", "--exec", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("claudebox: --memory 1G (command line): cannot be applied: "),
        "{err}"
    );
    assert!(err.contains("delegate a cgroup v2 subtree"), "{err}");
    assert!(!marker.exists());
    // The same from the config file, per project: refused naming the file's line.
    let cfg = w.home().join(".config/claudebox");
    fs::create_dir_all(&cfg).unwrap();
    fs::write(
        cfg.join("config.toml"),
        format!("[[project]]\nroot = \"{}\"\ncpu = 1.5\n", p.display()),
    )
    .unwrap();
    let out = w.cmd(&p).args(["--exec", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("--cpu 1.5 (config ") && err.contains("config.toml:3): cannot be applied"),
        "{err}"
    );
    // The control: the command line's `max` wins over the file, and the launch runs.
    let out = w
        .cmd(&p)
        .args(["--cpu", "max", "--exec", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(marker.exists());
    // The default limit only warns, once per user.
    let warned = stderr(&out);
    assert_eq!(
        warned.matches("limits: warning: no process limit").count(),
        1,
        "{warned}"
    );
    let again = w
        .cmd(&p)
        .args(["--cpu", "max", "--exec", "true"])
        .output()
        .unwrap();
    assert!(again.status.success());
    assert!(!stderr(&again).contains("limits"), "{}", stderr(&again));
    // The control: `--pids max` in a fresh world never warns.
    let w2 = World::new(BIN);
    let p2 = w2.dir("p");
    let out = w2
        .cmd(&p2)
        .args(["--pids", "max", "--exec", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("limits"), "{}", stderr(&out));
}

#[test]
fn values_are_checked_and_dry_run_shows_the_limits() {
    let w = World::new(BIN);
    let p = w.dir("p");
    for (args, msg) in [
        (&["--pids", "3"][..], "--pids 3: `3` is too few"),
        (
            &["--memory", "lots"][..],
            "--memory lots: `lots` is not a size",
        ),
        (
            &["--cpu", "0"][..],
            "--cpu 0: `0` is below the kernel's least share",
        ),
    ] {
        let out = w
            .cmd(&p)
            .args(args)
            .args(["--exec", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with(&format!("claudebox: {msg}")), "{err}");
    }
    let cfg = w.home().join(".config/claudebox");
    fs::create_dir_all(&cfg).unwrap();
    fs::write(cfg.join("config.toml"), "pids = 3\n").unwrap();
    let out = w.cmd(&p).args(["--exec", "true"]).output().unwrap();
    let err = stderr(&out);
    assert!(
        err.contains("config.toml:1:8: pids: `3` is too few"),
        "{err}"
    );
    // Dry-run: no limit at all when every one is `max`; the default otherwise (or, where
    // it cannot apply, the warning in its place).
    fs::write(cfg.join("config.toml"), "pids = \"max\"\n").unwrap();
    let out = w
        .cmd(&p)
        .args(["--dry-run", "--exec", "true"])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(
        text.contains("# limits of the sandbox as a whole\nnone\tno limit is in force\n"),
        "{text}"
    );
    let out = w
        .cmd(&p)
        .args(["--pids", "4096", "--dry-run", "--exec", "true"])
        .output()
        .unwrap();
    let text = stdout(&out);
    let (status, _) = check_row(&w, &p);
    if status == "ok" {
        assert!(text.contains("\npids\t4096\tcommand line\t"), "{text}");
    } else {
        // Asked for on the command line and impossible here: refused, even for --dry-run.
        assert_eq!(out.status.code(), Some(1));
        assert!(stderr(&out).contains("--pids 4096 (command line): cannot be applied"));
    }
}

/// tests/vm/limits.sh boots once for both VM tests below (the delegated cgroup, then the
/// systemd user manager): the first of them to come runs it, the other waits for its
/// results.
fn limits_vm() -> Option<&'static vm::Results> {
    static RUN: OnceLock<Option<vm::Results>> = OnceLock::new();
    RUN.get_or_init(|| vm::run("limits.sh")).as_ref()
}

/// On Ubuntu 24.04's kernel in qemu with cgroup v2, root delegating /u1000 to uid 1000
/// (tests/vm/limits.sh): the limits row, a fork tree and a fork bomb held at --pids 64
/// while processes outside start (control: the tree without a limit reaches far more), an
/// allocation past --memory 64M ending the sandbox with status 137 and the line (control:
/// it succeeds with `max`), the default process limit in a plain launch, and for uid 1001
/// with nothing delegated the refusal and the warning shown once. Needs root (it builds
/// the image) and qemu-system-x86_64; in CI their absence fails the test.
#[test]
fn on_a_kernel_with_cgroup_v2_delegated() {
    let Some(r) = limits_vm() else {
        return;
    };
    let one = |step: &str, what: &str| r.one(step, what);
    let num = |step: &str, what: &str| r.num(step, what);
    assert!(one("kernel", "controllers").contains("pids"));
    // --check.
    let c = one("check", "u1000");
    assert!(
        c.starts_with("ok") && c.contains("/sys/fs/cgroup/u1000, controllers: cpu memory pids"),
        "{c}"
    );
    let c = one("check", "u1001");
    assert!(
        c.starts_with("warn") && c.contains("your cgroup /nodeleg"),
        "{c}"
    );
    // The fork tree: held near 64 (counted from inside /proc, which also lists exiting
    // processes the controller already let go: 63 to 79 seen), the control far above;
    // the cgroup's own count is the bomb's below.
    let limited = num("tree", "limited");
    let unlimited = num("tree", "unlimited");
    assert!(limited <= 100, "{limited}");
    assert!(unlimited >= 500, "{unlimited}");
    assert!(one("tree", "limited-line").contains("reached its process limit (--pids 64)"));
    // The endless fork bomb: the cgroup at its maximum, processes outside start.
    assert_eq!(num("bomb", "cgroup-max"), 64);
    assert!(num("bomb", "cgroup-peak") <= 64);
    assert!(num("bomb", "cgroup-peak") >= 60);
    assert_eq!(one("bomb", "running"), "yes");
    assert_eq!(one("bomb", "outside-root-rc"), "0");
    assert_eq!(one("bomb", "outside-user-rc"), "0");
    assert_eq!(one("bomb", "outside-user"), "1000");
    assert!(one("bomb", "line")
        .starts_with("claudebox: the sandbox reached its process limit (--pids 64)"));
    assert_eq!(one("bomb", "cgroups-left"), "0");
    // Memory: past the limit the sandbox ends, status 137 and the line; the control succeeds.
    assert_eq!(one("mem", "limited-rc"), "137");
    assert_eq!(one("mem", "limited-out"), "");
    assert!(one("mem", "limited-line")
        .starts_with("claudebox: the sandbox was ended by its memory limit (--memory 64M"));
    assert_eq!(one("mem", "unlimited-rc"), "0");
    assert_eq!(one("mem", "unlimited-out"), "1+0 records in");
    assert_eq!(one("mem", "unlimited-line"), "");
    // The default: 4096 processes, no memory limit, the agent's status, nothing printed.
    assert_eq!(one("default", "pids-max"), "4096");
    assert_eq!(one("default", "memory-max"), "max");
    assert_eq!(one("default", "rc"), "7");
    assert_eq!(one("default", "stderr"), "");
    assert_eq!(one("default", "cgroups-left"), "0");
    // Nothing delegated: refused in one line; the default warns once.
    assert_eq!(one("nodeleg", "requested-rc"), "1");
    assert_eq!(one("nodeleg", "requested-lines"), "1");
    assert!(one("nodeleg", "requested-err")
        .starts_with("claudebox: --memory 256M (command line): cannot be applied"));
    assert_eq!(one("nodeleg", "default-rc"), "0");
    assert!(
        one("nodeleg", "default-err").starts_with("claudebox: limits: warning: no process limit")
    );
    assert_eq!(one("nodeleg", "again-rc"), "0");
    assert_eq!(one("nodeleg", "again-lines"), "0");
    assert_eq!(one("done", "all"), "yes");
}

/// The systemd mechanism for real (tests/vm/limits.sh's second part): the same kernel in qemu
/// with this machine's systemd, root laying out user@1000.service's delegated cgroup as the
/// system manager would and starting `systemd --user` for uid 1000 (no system manager, no
/// D-Bus: systemd-run reaches the user manager on its private socket). The limits row names
/// the manager; `--dry-run` shows the `systemd-run --user --scope` prefix; a fork tree is held
/// near `--pids 64` (control: `--pids max` reaches far more) and an allocation past
/// `--memory 64M` ends the sandbox with status 137 and the line naming the limit, as the
/// cgroup mechanism does (systemd stops the scope on the OOM kill, "Terminated" 143, and
/// claudebox reads the scope's result `oom-kill` before resetting it; control: `max`
/// succeeds); no scope or unit is left. Needs root, qemu and systemd; skipped without them
/// (outside CI).
#[test]
fn through_a_systemd_user_manager() {
    if !vm::available(&[("systemd-run", "systemd")]) {
        return;
    }
    let Some(r) = limits_vm() else {
        return;
    };
    let one = |step: &str, what: &str| r.one(step, what);
    let num = |step: &str, what: &str| r.num(step, what);
    let console = r.console();
    assert_eq!(one("sd-manager", "socket"), "yes");
    assert_eq!(one("sd-manager", "plain-scope-rc"), "0");
    let c = one("sd-check", "row");
    assert!(
        c.starts_with("ok") && c.contains("the user's systemd manager"),
        "{c}"
    );
    assert!(
        r.step("sd-dry")
            .iter()
            .any(|(_, v)| v.contains("systemd-run --user --scope")
                && v.contains("-p TasksMax=64")
                && v.contains("-p MemoryMax=268435456")),
        "{console}"
    );
    let limited = num("sd-tree", "limited");
    let unlimited = num("sd-tree", "unlimited");
    assert!(limited <= 100, "{limited}");
    assert!(unlimited >= 500, "{unlimited}");
    assert_eq!(one("sd-mem", "limited-rc"), "137", "{console}");
    assert!(
        one("sd-mem", "limited-err").contains("ended by its memory limit (--memory 64M"),
        "{console}"
    );
    assert_eq!(one("sd-mem", "limited-out"), "");
    assert!(
        !one("sd-mem", "unlimited-err").contains("memory limit"),
        "{console}"
    );
    assert_eq!(one("sd-mem", "unlimited-rc"), "0");
    assert_eq!(one("sd-mem", "unlimited-out"), "1+0 records in");
    assert_eq!(one("sd-left", "scopes"), "0");
    assert_eq!(one("sd-left", "units"), "0", "{console}");
    assert_eq!(one("done", "all"), "yes");
}
