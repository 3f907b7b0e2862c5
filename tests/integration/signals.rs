//! Ctrl-C in a terminal: SIGINT to the whole foreground process group. The agent must get
//! it, have time to clean up, and its exit status must be the sandbox's (issue 12).

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::BIN;
use lab::*;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A shell that traps INT, takes a while to clean up (its `sleep` is killed by the same
/// Ctrl-C, so the trap runs at once), writes `$1` and exits 7.
const TRAPPING: &str = r#"trap 'sleep 0.5; echo cleaned > "$1"; exit 7' INT
echo ready
while :; do sleep 0.1; done"#;

/// `sh` with the environment `w.cmd` gives claudebox.
fn sh_like(w: &World, cwd: &std::path::Path) -> Command {
    let mut c = Command::new("sh");
    c.current_dir(cwd)
        .env_clear()
        .envs(w.cmd(cwd).get_envs().filter_map(|(k, v)| Some((k, v?))));
    c
}

/// As a terminal's shell starts a program: SIGINT and SIGQUIT at their default, whatever
/// the test runner was started with.
fn with_default_signals(mut cmd: Command) -> Command {
    // SAFETY: only sigaction between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for s in [Signal::SIGINT, Signal::SIGQUIT] {
                nix::sys::signal::signal(s, nix::sys::signal::SigHandler::SigDfl)?;
            }
            Ok(())
        });
    }
    cmd
}

/// Starts `cmd` as a terminal starts a foreground job: in its own process group.
fn start_job(cmd: Command) -> Child {
    let mut cmd = with_default_signals(cmd);
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd.spawn().expect("start the job")
}

/// Waits for the job's "ready", presses Ctrl-C (SIGINT to the group) and waits for it.
fn interrupt(mut child: Child) -> ExitStatus {
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the job did not start");
    killpg(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "the job did not end after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ctrl_c_reaches_the_agent_which_cleans_up_and_whose_status_is_the_sandboxs() {
    let w = World::heavy(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let marker = proj.join("cleaned");
    // Open mode, and allowlist mode (claudebox's proxy step runs before the agent; the
    // proxy itself is in its own session).
    for mode in [
        &["--network", "open"][..],
        &["--allow-host", "example.com"][..],
    ] {
        let _ = fs::remove_file(&marker);
        let mut cmd = w.cmd(&proj);
        cmd.args(mode)
            .args(["--exec", "sh", "-c", TRAPPING, "sh"])
            .arg(&marker);
        let st = interrupt(start_job(cmd));
        assert_eq!(
            (st.code(), st.signal()),
            (Some(7), None),
            "{mode:?}: the exit status is the agent's"
        );
        assert_eq!(
            fs::read_to_string(&marker).unwrap(),
            "cleaned\n",
            "{mode:?}"
        );
    }

    // Control: the same sandbox started by a shell from the --dry-run line, without
    // claudebox ignoring the signal for bwrap: Ctrl-C kills bwrap and, through
    // --die-with-parent, the agent before its cleanup finishes.
    fs::remove_file(&marker).unwrap();
    let mut dry = w.cmd(&proj);
    dry.args(["--dry-run", "--exec", "sh", "-c", TRAPPING, "sh"])
        .arg(&marker);
    let out = ok(&dry.output().unwrap());
    let line = out.split_once("# command\n").unwrap().1.trim_end();
    assert!(line.contains("--default-signals"), "{line}");
    let mut control = sh_like(&w, &proj);
    control.args(["-c", &format!("exec {line}")]);
    let st = interrupt(start_job(control));
    assert_ne!(
        st.code(),
        Some(7),
        "control: bwrap should have died of SIGINT"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !marker.exists(),
        "control: the agent should have been killed mid-cleanup"
    );
}

#[test]
fn a_job_started_with_sigint_ignored_keeps_it_ignored_inside() {
    // A background job of a non-interactive shell starts with SIGINT ignored; the agent
    // inherits that choice instead of having it undone.
    let w = World::heavy(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let mut cmd = w.cmd(&proj);
    cmd.args(["--exec", "sh", "-c", "grep ^SigIgn: /proc/self/status"]);
    let default = ok(&with_default_signals(cmd).output().unwrap());
    let mut ignored = sh_like(&w, &proj);
    ignored.args([
        "-c",
        "trap '' INT QUIT; exec \"$1\" --exec sh -c 'grep ^SigIgn: /proc/self/status'",
        "sh",
        BIN,
    ]);
    let ign = ok(&with_default_signals(ignored).output().unwrap());
    let mask =
        |s: &str| u64::from_str_radix(s.trim().trim_start_matches("SigIgn:").trim(), 16).unwrap();
    let (int, quit) = (1u64 << (2 - 1), 1u64 << (3 - 1));
    assert_eq!(mask(&default) & (int | quit), 0, "default: {default}");
    assert_eq!(mask(&ign) & (int | quit), int | quit, "ignored: {ign}");
}

/// claudebox stays bwrap's parent; when claudebox's own parent dies (a wrapper killed, a
/// terminal's process gone) the sandbox ends, as it did when claudebox exec'd bwrap and
/// bwrap's `--die-with-parent` applied to that process. Control: the same agent under a
/// parent that stays alive is still running after the same wait.
#[test]
fn the_sandbox_ends_when_claudebox_s_parent_dies() {
    let w = World::heavy(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let run = |kill_parent: bool| -> bool {
        let beat = proj.join(if kill_parent {
            "beat-killed"
        } else {
            "beat-alive"
        });
        let _ = fs::remove_file(&beat);
        let inner = format!(
            "{} --exec sh -c 'while :; do date +%s%N > \"$0\"; sleep 0.1; done' '{}' & wait",
            BIN,
            beat.display()
        );
        let mut parent = sh_like(&w, &proj)
            .args(["-c", &inner])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !beat.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(beat.exists(), "the agent never started");
        if kill_parent {
            parent.kill().unwrap();
        }
        std::thread::sleep(Duration::from_secs(2));
        let a = fs::read_to_string(&beat).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let b = fs::read_to_string(&beat).unwrap();
        let alive = a != b;
        if !kill_parent {
            parent.kill().unwrap();
        }
        let _ = parent.wait();
        alive
    };
    assert!(run(false), "control: the agent runs under a living parent");
    // The agent of the killed parent's sandbox: left running, the control's agent ends
    // with claudebox's --die-with-parent once its parent is killed above.
    assert!(!run(true), "the agent outlived claudebox's parent");
}
