//! The launch race (issue 14): a first sandbox A1 of a project creates a protected path
//! that was missing when it started (`.vscode`, `.git/worktrees`) and, each time the next
//! launch opens a file of `.git` (inotify), swaps it for a while between the real
//! directory and a symlink to the home directory (`renameat2` RENAME_EXCHANGE). The next
//! launch A2 checks the path, then mounts it: by name, bwrap resolves the symlink and A2
//! gets the real home (read-only at `.vscode`, read-write at `.git/worktrees`, which is
//! pinned). By descriptor it mounts what was checked, or refuses.
//!
//! Also here: descriptors inherited from the launching shell (`exec 7< ~`).

use super::*;
use crate::BIN;
use std::io::Read;
use std::time::{Duration, Instant};

/// A2 launches per target and per mode: bounded, each with a timeout.
const LAUNCHES: usize = 30;
/// The control stops at its first success; this many launches at most.
const CONTROL_LAUNCHES: usize = 100;
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(20);
const HOME_MARK: &str = "SECRET-RACE-HOME";

/// A1's program: `python3 -c ATTACKER TARGET HOME STOPFILE`, run in the project.
const ATTACKER: &str = r#"
import ctypes, os, select, shutil, sys, time
libc = ctypes.CDLL(None, use_errno=True)
target, home, stop = sys.argv[1], sys.argv[2], sys.argv[3]
swap = target + ".swap"
def xchg():
    if libc.renameat2(-100, target.encode(), -100, swap.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
os.mkdir(target)
open(os.path.join(target, "innocent"), "w").write("innocent\n")
os.symlink(home, swap)
# The next launch checks the path, then execs bwrap, which resolves every source by name
# while it parses its arguments, then mounts them a few milliseconds later: bwrap's own
# binary being opened (IN_OPEN, 0x20) is the moment to swap.
ino = libc.inotify_init1(0)
bwrap = shutil.which("bwrap").encode()
if ino < 0 or libc.inotify_add_watch(ino, bwrap, 0x20) < 0:
    raise OSError(ctypes.get_errno(), "inotify")
print("READY", flush=True)
deadline = time.time() + 300
holds = [0.0003, 0.0006, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.008]
n = 0
while time.time() < deadline and not os.path.exists(stop):
    r, _, _ = select.select([ino], [], [], 0.05)
    if not r:
        continue
    xchg()  # the symlink while bwrap resolves its sources
    time.sleep(holds[n % len(holds)])
    xchg()  # the directory again when it mounts them
    n += 1
    time.sleep(0.02)
    os.read(ino, 65536)
print("SWAPS", n, flush=True)
"#;

/// Runs a `--dry-run` command line (sources named, as bwrap resolved them before) without
/// the mount check of the first step inside, as launches ran before issue 14.
const BY_NAME: &str = r#"
import os, shlex, sys
a, out = shlex.split(sys.argv[1]), []
while a:
    x = a.pop(0)
    if x in ("--expect-ro", "--expect-rw"):
        a.pop(0)
    else:
        out.append(x)
os.execvp(out[0], out)
"#;

/// What A2 runs: read the home's marker through `.vscode`, write into the home through
/// `.git/worktrees`.
const A2: &str = "cat .vscode/MARKER 2>/dev/null; \
                  echo PWNED > .git/worktrees/PWNED-RACE 2>/dev/null; true";

/// Runs `cmd` with a time limit; `None` when it had to be killed.
pub(super) fn output_within(cmd: &mut Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct Race {
    w: World,
    proj: PathBuf,
    a1: Child,
    stop: PathBuf,
}

impl Race {
    /// A project whose `target` is missing, and A1 attacking it.
    fn start(target: &str) -> Race {
        let w = World::new(BIN);
        let proj = w.dir("proj");
        init_repo(&proj);
        fs::write(w.home().join("MARKER"), format!("{HOME_MARK}\n")).unwrap();
        let stop = proj.join("STOP-RACE");
        let (a1, line) = lab::spawn_first_line(
            w.cmd(&proj)
                .args(["--exec", "python3", "-c", ATTACKER, target])
                .arg(w.home())
                .arg(&stop)
                .stdin(Stdio::null()),
        );
        assert_eq!(line.trim(), "READY", "the attacker did not start");
        Race { w, proj, a1, stop }
    }

    /// Whether this A2 got the home: the marker read, or a file written there.
    fn escaped(&self, out: &Output) -> bool {
        if std::env::var_os("RACE_DEBUG").is_some() {
            eprintln!("A2: {:?} {}{}", out.status, stdout(out), stderr(out));
        }
        let planted = self.w.home().join("PWNED-RACE");
        let wrote = planted.exists();
        let _ = fs::remove_file(&planted);
        stdout(out).contains(HOME_MARK) || wrote
    }

    /// A2 as the user launches it: sources bound by descriptor.
    fn launch(&self) -> bool {
        let out = output_within(
            self.w.cmd(&self.proj).args(["--exec", "sh", "-c", A2]),
            LAUNCH_TIMEOUT,
        )
        .expect("a launch hung");
        self.escaped(&out)
    }

    /// The control: the same check (`--dry-run` plans it), then bwrap binding the
    /// sources by name, as launches did before (the printed command line, without the
    /// mount check inside).
    fn launch_by_name(&self) -> bool {
        let Some(dry) = output_within(
            self.w
                .cmd(&self.proj)
                .args(["--dry-run", "--exec", "sh", "-c", A2]),
            LAUNCH_TIMEOUT,
        ) else {
            return false;
        };
        let Some(line) = stdout(&dry).lines().last().map(str::to_string) else {
            return false;
        };
        if !dry.status.success() {
            return false;
        }
        let base = self.w.cmd(&self.proj);
        let mut sh = Command::new("python3");
        sh.args(["-c", BY_NAME])
            .arg(line)
            .current_dir(&self.proj)
            .env_clear()
            .envs(base.get_envs().filter_map(|(k, v)| Some((k, v?))));
        let out = output_within(&mut sh, LAUNCH_TIMEOUT).expect("bwrap hung");
        self.escaped(&out)
    }

    fn finish(mut self) -> String {
        fs::write(&self.stop, "").unwrap();
        let start = Instant::now();
        while self.a1.try_wait().unwrap().is_none() && start.elapsed() < LAUNCH_TIMEOUT {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.a1.kill();
        let _ = self.a1.wait();
        let mut rest = String::new();
        let _ = self.a1.stdout.take().unwrap().read_to_string(&mut rest);
        rest
    }
}

/// Successes out of `launches` against `target`, by descriptor or by name; with
/// `until_won`, stops at the first success.
fn race(target: &str, by_name: bool, launches: usize, until_won: bool) -> usize {
    let r = Race::start(target);
    let mut wins = 0;
    let mut tries = 0;
    while tries < launches && !(until_won && wins > 0) {
        tries += 1;
        let won = if by_name {
            r.launch_by_name()
        } else {
            r.launch()
        };
        wins += usize::from(won);
    }
    let a1 = r.finish();
    println!(
        "race on {target}, {}: {wins} of {tries} launches got the home ({})",
        if by_name {
            "bound by name"
        } else {
            "bound by descriptor"
        },
        a1.trim()
    );
    wins
}

const TARGETS: &[&str] = &[".vscode", ".git/worktrees"];

/// The races, as escape attempts: each succeeds when any of its launches got the home.
pub(crate) fn attempts() -> Vec<(&'static str, bool)> {
    let mut v = Vec::new();
    for t in TARGETS {
        let name: &'static str = match *t {
            ".vscode" => {
                "race: swap a new .vscode for a symlink to HOME while the next launch starts"
            }
            _ => {
                "race: swap a new .git/worktrees for a symlink to HOME while the next launch starts"
            }
        };
        v.push((name, race(t, false, LAUNCHES, false) > 0));
    }
    v.push(inherited_home_fd());
    v.push((
        "a protecting mount moved elsewhere by a symlink in its destination",
        moved_destination(true).0,
    ));
    v
}

/// bwrap follows a symlink in a destination: a read-only mount meant for
/// `proj/link/hooks` lands in `proj/other/hooks` when `link` is (made) a symlink to
/// `other` while the sandbox starts. With the check (`--expect-ro`, as a launch renders
/// it for every protected path) the first step inside refuses to start the command.
/// Returns whether the command ran, and its output.
fn moved_destination(check: bool) -> (bool, String) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    fs::create_dir_all(proj.join("real/hooks")).unwrap();
    fs::create_dir_all(proj.join("other/hooks")).unwrap();
    std::os::unix::fs::symlink("other", proj.join("link")).unwrap();
    let dest = proj.join("link/hooks");
    let empty = w.dir("empty");
    let mut c = Command::new("bwrap");
    c.args([
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--bind",
    ])
    .arg(&proj)
    .arg(&proj)
    .arg("--ro-bind")
    .arg(&empty)
    .arg(&dest)
    .arg(BIN)
    .arg("--sandbox-init");
    if check {
        c.arg("--expect-ro").arg(&dest);
    }
    let out = c
        .args([
            "--",
            "sh",
            "-c",
            "echo RAN; grep -F /hooks /proc/self/mountinfo",
        ])
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&out), stderr(&out));
    if check {
        assert!(!out.status.success(), "{text}");
        assert_eq!(stderr(&out).lines().count(), 1, "{text}");
        assert!(
            stderr(&out).contains("link/hooks is not the read-only mount"),
            "{text}"
        );
    }
    (stdout(&out).contains("RAN"), text)
}

/// The same races with the sources bound by name: each must succeed at least once.
pub(crate) fn controls() {
    for t in TARGETS {
        assert!(
            race(t, true, CONTROL_LAUNCHES, true) > 0,
            "control: the race on {t} never won with sources bound by name"
        );
    }
    inherited_fd_control();
    let (ran, text) = moved_destination(false);
    assert!(
        ran && text.contains("/other/hooks ro,"),
        "control: the mount did not move: {text}"
    );
}

/// Python that runs argv[2:] with the directory argv[1] open on descriptor 7, the way
/// `exec 7< ~` in the user's shell leaves it.
const WITH_FD7: &str = "import os, sys\n\
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n\
os.dup2(fd, 7)\n\
os.execvp(sys.argv[2], sys.argv[2:])\n";

/// Inside: every descriptor past 2 of the shell, and of the sandbox's pid 1, tried as a
/// way into the home: read its ssh key, write a file there.
const THROUGH_FDS: &str = r#"for f in /proc/$$/fd/* /proc/1/fd/*; do
  cat "$f/.ssh/id_ed25519" 2>/dev/null
  echo PLANTED > "$f/PWNED-FD" 2>/dev/null && echo "wrote through $f"
done
echo FDS
ls /proc/$$/fd
echo END"#;

fn home_with_key(w: &World) {
    fs::create_dir_all(w.home().join(".ssh")).unwrap();
    fs::write(w.home().join(".ssh/id_ed25519"), "SECRET-FD-KEY\n").unwrap();
}

/// A descriptor of the real home, inherited from the launching shell.
fn inherited_home_fd() -> (&'static str, bool) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    home_with_key(&w);
    let base = w.cmd(&proj);
    let out = Command::new("python3")
        .args(["-c", WITH_FD7])
        .arg(w.home())
        .arg(BIN)
        .args(["--exec", "sh", "-c", THROUGH_FDS])
        .current_dir(&proj)
        .env_clear()
        .envs(base.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Only 0, 1, 2 are open in the command's shell (listed without a pipe, whose ends
    // the shell would hold while ls reads the list).
    let text = stdout(&out);
    let fds: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "FDS")
        .skip(1)
        .take_while(|l| *l != "END")
        .collect();
    let only_stdio = fds == ["0", "1", "2"];
    if std::env::var_os("RACE_DEBUG").is_some() {
        eprintln!("fd attempt: {text}{}", stderr(&out));
    }
    let escaped =
        stdout(&out).contains("SECRET-FD-KEY") || w.home().join("PWNED-FD").exists() || !only_stdio;
    (
        "an inherited descriptor of the home (exec 7< ~): read ~/.ssh, write there, via the command's or pid 1's fds",
        escaped,
    )
}

/// The same descriptor given to a plain bwrap that does not close it: the home is read
/// and written through it.
fn inherited_fd_control() {
    let w = World::new(BIN);
    home_with_key(&w);
    let out = Command::new("python3")
        .args(["-c", WITH_FD7])
        .arg(w.home())
        .args([
            "bwrap",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
        ])
        .arg(w.home())
        .args(["--unshare-pid", "sh", "-c", THROUGH_FDS])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("SECRET-FD-KEY"),
        "control: {}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(w.home().join("PWNED-FD").exists(), "control: no write");
}

/// The figures alone (`cargo test --test integration race_figures -- --ignored --nocapture`):
/// successes out of the launches, by descriptor and by name, per target.
#[test]
#[ignore]
fn race_figures() {
    let _heavy = lab::heavy();
    for t in TARGETS {
        race(t, false, LAUNCHES, false);
        race(t, true, LAUNCHES, false);
    }
    let (_, escaped) = inherited_home_fd();
    println!("inherited descriptor: escaped = {escaped}");
    inherited_fd_control();
}
