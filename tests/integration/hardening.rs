//! What must keep working under the hardening: the terminal (resize, /dev/tty), git
//! commits with the project's hooks, nested bwrap (Claude Code's own Bash sandbox), the
//! opt-ins, and a `--dry-run` that shows all of it, creates nothing and still runs.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::BIN;
use lab::*;

const HELPERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/helpers");

/// Inside, on a pty: the window size is read, `/dev/tty` opens, and a resize from the
/// terminal arrives as SIGWINCH with the new size.
const RESIZE_PY: &str = r#"
import fcntl, os, signal, struct, sys, termios
def size():
    return struct.unpack("HHHH", fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8))[:2]
got = []
signal.signal(signal.SIGWINCH, lambda *a: got.append(size()))
os.close(os.open("/dev/tty", os.O_RDWR))
print("TTY-OPENS")
print("SIZE-BEFORE %d %d" % size())
signal.alarm(30)
print("READY-FOR-RESIZE", flush=True)
while not got:
    signal.pause()
print("SIZE-AFTER %d %d" % got[-1])
"#;

#[test]
fn terminal_resize_and_dev_tty_work_inside() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    let mut c = Command::new("python3");
    c.arg(format!("{HELPERS}/pty_run.py"))
        .args(["24", "80", "--resize", "50", "132", "--", BIN])
        .args(["--exec", "python3", "-c", RESIZE_PY]);
    let base = w.cmd(&proj);
    c.current_dir(&proj).env_clear();
    for (k, v) in base.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    let out = ok(&c.output().unwrap());
    assert!(out.contains("TTY-OPENS"), "{out}");
    assert!(out.contains("SIZE-BEFORE 24 80"), "{out}");
    assert!(out.contains("SIZE-AFTER 50 132"), "{out}");
}

#[test]
fn git_commit_works_and_the_projects_hooks_still_run() {
    let w = World::new(BIN);
    fs::write(
        w.home().join(".gitconfig"),
        "[user]\n\tname = T\n\temail = t@example.com\n",
    )
    .unwrap();
    let proj = w.dir("proj");
    init_repo(&proj);
    fs::write(
        proj.join(".git/hooks/pre-commit"),
        "#!/bin/sh\necho HOOK-RAN >&2\n",
    )
    .unwrap();
    fs::set_permissions(
        proj.join(".git/hooks/pre-commit"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let o = w
        .cmd(&proj)
        .args(["--exec", "sh", "-c"])
        .arg("echo change > file && git add file && git commit -qm inside && echo COMMITTED")
        .output()
        .unwrap();
    assert!(stdout(&o).contains("COMMITTED"), "{}", stderr(&o));
    assert!(stderr(&o).contains("HOOK-RAN"), "{}", stderr(&o));
    assert_eq!(git(&proj, &["log", "-1", "--format=%s"]), "inside");
}

#[test]
fn nested_bwrap_runs_inside() {
    if nix::unistd::Uid::current().is_root() {
        // bwrap run as uid 0 without capabilities cannot map its user namespace
        // ("setting up uid map: Operation not permitted"): the same happens under a plain
        // `bwrap --unshare-user --cap-drop ALL`, whatever claudebox adds. Real users are
        // not root; scripts/test runs this again as an ordinary user.
        eprintln!("nested bwrap: skipped as root (see comment), checked as a normal user");
        return;
    }
    let w = World::new(BIN);
    let proj = w.dir("proj");
    // What Claude Code's Bash sandbox does: a new user, pid and network namespace, a
    // read-only root, its own /proc and /dev.
    let o = w
        .cmd(&proj)
        .args(["--exec", "bwrap", "--unshare-user", "--unshare-pid", "--unshare-net"])
        .args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"])
        .args(["--bind", proj.to_str().unwrap(), proj.to_str().unwrap()])
        .args(["--die-with-parent", "--", "sh", "-c"])
        .arg("echo nested > nested.txt && cat /proc/self/status | grep -q NoNewPrivs && echo NESTED-OK")
        .output()
        .unwrap();
    assert!(stdout(&o).contains("NESTED-OK"), "{}", stderr(&o));
    assert_eq!(
        fs::read_to_string(proj.join("nested.txt")).unwrap(),
        "nested\n"
    );
}

#[test]
fn a_missing_hooks_dir_becomes_an_empty_read_only_one() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    fs::remove_dir_all(proj.join(".git/hooks")).unwrap();
    // --dry-run creates nothing.
    let dry = dry_run(&w, &proj);
    assert!(dry.contains("empty-ro\t-\t"), "{dry}");
    assert!(!proj.join(".git/hooks").exists());
    let o = w
        .cmd(&proj)
        .args(["--exec", "sh", "-c"])
        .arg("printf '#!/bin/sh\\n' > .git/hooks/post-commit || echo REFUSED")
        .output()
        .unwrap();
    assert!(stdout(&o).contains("REFUSED"), "{}", stderr(&o));
    // The mount point bwrap left behind is an empty directory, as git itself makes.
    assert_eq!(fs::read_dir(proj.join(".git/hooks")).unwrap().count(), 0);
}

#[test]
fn dry_run_shows_the_restrictions_and_opt_ins_and_its_line_runs() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let before = listing(&w.root());
    let dry = dry_run(&w, &proj);
    assert!(
        dry.contains("seccomp\tioctl with arg1 == TIOCSTI "),
        "{dry}"
    );
    assert!(dry.contains("protected: git hooks"), "{dry}");
    assert!(dry.contains("--sandbox-init"), "{dry}");
    let o = w
        .cmd(&proj)
        .args(["--writable-project-config", "--dry-run"])
        .output()
        .unwrap();
    let dry_open = ok(&o);
    assert!(
        dry_open.contains("opt-in --writable-project-config"),
        "{dry_open}"
    );
    assert!(!dry_open.contains("protected: git hooks"), "{dry_open}");
    assert_eq!(before, listing(&w.root()), "--dry-run changed the disk");

    // The printed line, pasted into sh (with the same environment), makes the same
    // launch: the seccomp filter is on and the hooks are read-only there too.
    let line = dry.lines().last().unwrap().to_string();
    ok(&w.cmd(&proj).args(["--exec", "true"]).output().unwrap()); // creates the state
    let mut c = Command::new("sh");
    c.arg("-c").arg(&line).current_dir(&proj).env_clear();
    for (k, v) in w.cmd(&proj).get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c.env(
        "FAKE_CLAUDE_SCRIPT",
        "grep -q '^Seccomp:[[:space:]]*2' /proc/self/status && echo FILTERED; \
         touch .git/hooks/x 2>/dev/null || echo HOOKS-RO",
    );
    let out = ok(&c.output().unwrap());
    assert!(out.contains("FAKE-CLAUDE-START"), "{out}");
    assert!(out.contains("FILTERED"), "{out}");
    assert!(out.contains("HOOKS-RO"), "{out}");
}

#[test]
fn ssh_agent_is_forwarded_only_on_request() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    let run = w.root().join("run");
    let markers = w.root().join("markers");
    fs::create_dir_all(&run).unwrap();
    fs::create_dir_all(&markers).unwrap();
    let sock = run.join("agent.sock");
    let mut listener = lab::Reaped(
        Command::new("python3")
            .arg(format!("{HELPERS}/listeners.py"))
            .arg(&markers)
            .arg(&sock)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(listener.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "READY");
    let connect = r#"python3 -c 'import os, socket; s = socket.socket(socket.AF_UNIX); s.connect(os.environ["SSH_AUTH_SOCK"]); print("AGENT-REACHED", os.environ["SSH_AUTH_SOCK"])'"#;

    let o = w
        .cmd(&proj)
        .env("SSH_AUTH_SOCK", &sock)
        .args(["--exec", "sh", "-c", connect])
        .output()
        .unwrap();
    assert!(!stdout(&o).contains("AGENT-REACHED"));
    assert!(!markers.join("0").exists());

    let dry = ok(&w
        .cmd(&proj)
        .env("SSH_AUTH_SOCK", &sock)
        .args(["--ssh-agent", "--dry-run"])
        .output()
        .unwrap());
    assert!(dry.contains("opt-in --ssh-agent"), "{dry}");

    let o = w
        .cmd(&proj)
        .env("SSH_AUTH_SOCK", &sock)
        .args(["--ssh-agent", "--exec", "sh", "-c", connect])
        .output()
        .unwrap();
    assert!(
        stdout(&o).contains("AGENT-REACHED /run/claudebox/ssh-agent.sock"),
        "{}",
        stderr(&o)
    );
    // The listener makes its marker after its accept, a moment after the connect inside
    // returned (under a heavy load, later than the sandbox's exit).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !markers.join("0").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(markers.join("0").exists());

    // Asked for without an agent: one line, nothing runs.
    let o = w
        .cmd(&proj)
        .args(["--ssh-agent", "--exec", "true"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("SSH_AUTH_SOCK"), "{}", stderr(&o));
    drop(listener);
}

/// Every path under `dir`, with its kind, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            out.push(format!("{} {}", e.path().display(), t.is_dir()));
            if t.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}
