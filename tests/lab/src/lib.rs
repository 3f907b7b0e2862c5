//! claudebox's test lab, shared by the integration tests (tests/integration/) and the
//! benches (benches/): a throwaway HOME, a fake `claude` on PATH that reports from inside
//! the sandbox, helpers to build real git repositories, the lock that keeps heavy tests
//! apart ([`heavy()`]), the real agents against the mock APIs ([`agent`]), claude's TUI
//! under tmux ([`tmux`]), the maintenance tests' helpers ([`maintenance`]) and the
//! benches' numbers ([`bench`]).
//!
//! A library cannot see the claudebox binary (`CARGO_BIN_EXE_claudebox` is set only when
//! a test or a bench is compiled): each caller hands its path to [`World::new`].

// Test support: a panic on an unexpected None or Err is the failing test's report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

/// The fake agent. It prints each argument on its own line between markers, then runs the
/// shell code in `$FAKE_CLAUDE_SCRIPT` (so a test decides what to look at from inside),
/// and exits with that code's status.
pub const FAKE_CLAUDE: &str = r#"#!/bin/sh
echo "FAKE-CLAUDE-START"
for a in "$@"; do printf 'ARG<%s>\n' "$a"; done
if [ -n "${FAKE_CLAUDE_SCRIPT:-}" ]; then
  eval "$FAKE_CLAUDE_SCRIPT"
fi
"#;

/// A temporary world: `root/home` is HOME, `root/bin` holds the fake claude; `cmd` runs
/// the claudebox binary it was made with.
pub struct World {
    pub dir: tempfile::TempDir,
    claudebox: PathBuf,
    /// Held by a world made with [`World::heavy`].
    _heavy: Option<Heavy>,
}

impl World {
    /// A world whose `cmd` runs `claudebox` (a test's or a bench's
    /// `env!("CARGO_BIN_EXE_claudebox")`).
    pub fn new(claudebox: impl AsRef<Path>) -> World {
        World::make(claudebox.as_ref(), &std::env::temp_dir(), None)
    }

    /// A world under `base` (Codex refuses to make its helper links when its home lies
    /// under the temporary directory: its tests use /var/tmp).
    pub fn new_in(claudebox: impl AsRef<Path>, base: &Path) -> World {
        World::make(claudebox.as_ref(), base, None)
    }

    /// A world for a test that loads the machine or is bound by time: it holds
    /// [`heavy()`] as long as it lives.
    pub fn heavy(claudebox: impl AsRef<Path>) -> World {
        World::make(claudebox.as_ref(), &std::env::temp_dir(), Some(heavy()))
    }

    fn make(claudebox: &Path, base: &Path, heavy: Option<Heavy>) -> World {
        let dir = tempfile::Builder::new()
            .prefix("claudebox-test-")
            .tempdir_in(base)
            .expect("tempdir");
        let w = World {
            dir,
            claudebox: claudebox.to_path_buf(),
            _heavy: heavy,
        };
        fs::create_dir_all(w.home()).unwrap();
        fs::create_dir_all(w.bin()).unwrap();
        fs::create_dir_all(w.work()).unwrap();
        fs::create_dir_all(w.home().join(".claude")).unwrap();
        w.install_claude(FAKE_CLAUDE);
        w
    }

    /// The claudebox binary this world runs.
    pub fn claudebox(&self) -> &Path {
        &self.claudebox
    }

    pub fn root(&self) -> PathBuf {
        fs::canonicalize(self.dir.path()).unwrap()
    }
    pub fn home(&self) -> PathBuf {
        self.root().join("home")
    }
    pub fn bin(&self) -> PathBuf {
        self.root().join("bin")
    }
    /// Where tests put their projects (outside HOME, like /tmp checkouts).
    pub fn work(&self) -> PathBuf {
        self.root().join("work")
    }
    pub fn state(&self) -> PathBuf {
        self.home().join(".claudebox")
    }

    pub fn install_claude(&self, script: &str) {
        let p = self.bin().join("claude");
        fs::write(&p, script).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A new directory under `work()`.
    pub fn dir(&self, rel: &str) -> PathBuf {
        let p = self.work().join(rel);
        fs::create_dir_all(&p).unwrap();
        p
    }

    /// `claudebox ARGS` in `cwd` with this world's HOME and PATH.
    pub fn cmd(&self, cwd: &Path) -> Command {
        let mut c = Command::new(&self.claudebox);
        c.current_dir(cwd);
        c.env_clear();
        c.env("HOME", self.home());
        c.env("PATH", self.path_var());
        c.env("LANG", "C.UTF-8");
        if let Some(v) = std::env::var_os("USER") {
            c.env("USER", v);
        }
        c
    }

    pub fn path_var(&self) -> OsString {
        let mut p = self.bin().into_os_string();
        p.push(":/usr/local/bin:/usr/bin:/bin");
        p
    }

    /// Runs claudebox with no arguments, the fake agent executing `script` inside.
    pub fn run_script(&self, cwd: &Path, script: &str) -> Output {
        self.run_claude(cwd, [] as [&str; 0], script)
    }

    /// Runs claudebox with the fake agent executing `script` inside.
    pub fn run_claude<I, S>(&self, cwd: &Path, args: I, script: &str) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd(cwd)
            .args(args)
            .env("FAKE_CLAUDE_SCRIPT", script)
            .output()
            .expect("run claudebox")
    }
}

/// Taken for the whole test by the tests that load the machine and are bound by time:
/// the fault loops, the escape suite's races, the `.claude.json` writers, Ctrl-C, twenty
/// launches at once, token lifetimes and refresh races against the real Claude Code. In
/// one test binary they would otherwise run beside each other on the harness's threads;
/// with this, at most one of them runs at a time, beside light tests and no [`busy()`]
/// one. Another user's run at the same time (scripts/test runs root's and claudebox-test's
/// at once) has its own: the machine-wide lock is shared here, and exclusive only for
/// [`heavy_alone`]. A test that failed while holding it does not stop the others.
pub fn heavy() -> Heavy {
    heavy_with(SLOTS, nix::fcntl::FlockArg::LockShared)
}

/// Taken by the tests that load the machine (the real Claude Code, node, a second or
/// more of CPU at each start) but whose checks do not hang on timing: conversations,
/// tools, resumes, with limits of tens of seconds. Two of them run at once in a process
/// (they mostly wait: the mock, the sandbox's start, node's), never beside a [`heavy()`]
/// one; waiters are served in the order they came, so a heavy test waits for the busy
/// ones ahead of it and none behind it.
pub fn busy() -> Heavy {
    heavy_with(1, nix::fcntl::FlockArg::LockShared)
}

/// [`heavy()`], and no heavy test of another user's run meanwhile (scripts/test runs root's
/// and an ordinary user's at once): for the tests whose figures a loaded machine changes,
/// such as a launch racing a host that renames files every few milliseconds.
pub fn heavy_alone() -> Heavy {
    heavy_with(SLOTS, nix::fcntl::FlockArg::LockExclusive)
}

/// A process's heavy slots: [`heavy()`] takes them all, [`busy()`] one.
const SLOTS: u32 = 2;

/// The slots in use, and the tickets: each caller takes the next ticket and goes when
/// the tickets before it have gone and its slots are free (first come, first served).
struct Slots {
    used: u32,
    next_ticket: u64,
    serving: u64,
}

static SLOTS_STATE: Mutex<Slots> = Mutex::new(Slots {
    used: 0,
    next_ticket: 0,
    serving: 0,
});
static SLOTS_FREED: std::sync::Condvar = std::sync::Condvar::new();

fn slots() -> MutexGuard<'static, Slots> {
    SLOTS_STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Held while a heavy (or busy) test runs: its slots of this process, then the machine's
/// lock (`/tmp/claudebox-test-heavy.lock`, shared by heavy tests, exclusive for
/// [`heavy_alone`]). When `CLAUDEBOX_TEST_HEAVY_LOG` names a file, each hold appends a line
/// to it on drop: seconds held, seconds waited for it, the test's name, and `busy` for a
/// [`busy()`] hold (scripts/test prints the longest and the run's floor: the heavy holds
/// add up, the busy ones count half, two running at once).
pub struct Heavy {
    _machine: nix::fcntl::Flock<fs::File>,
    slots: Taken,
    asked: std::time::Instant,
    got: std::time::Instant,
}

fn heavy_with(weight: u32, how: nix::fcntl::FlockArg) -> Heavy {
    let asked = std::time::Instant::now();
    let mut s = slots();
    let ticket = s.next_ticket;
    s.next_ticket += 1;
    while s.serving != ticket || s.used + weight > SLOTS {
        s = SLOTS_FREED
            .wait(s)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    s.used += weight;
    s.serving += 1;
    drop(s);
    SLOTS_FREED.notify_all();
    // Given back on drop, also when the machine's lock below panics.
    let slots = Taken(weight);
    Heavy {
        _machine: machine_lock_as("heavy", how),
        slots,
        asked,
        got: std::time::Instant::now(),
    }
}

/// A process's heavy slots, taken: given back when dropped.
struct Taken(u32);

impl Drop for Taken {
    fn drop(&mut self) {
        slots().used -= self.0;
        SLOTS_FREED.notify_all();
    }
}

impl Drop for Heavy {
    fn drop(&mut self) {
        let Some(path) = std::env::var_os("CLAUDEBOX_TEST_HEAVY_LOG") else {
            return;
        };
        use std::io::Write;
        let line = format!(
            "{:.1}\t{:.1}\t{}{}\n",
            self.got.elapsed().as_secs_f64(),
            (self.got - self.asked).as_secs_f64(),
            std::thread::current().name().unwrap_or("?"),
            if self.slots.0 < SLOTS { "\tbusy" } else { "" }
        );
        // One write of the line, appended: holds ending at once do not interleave. A log
        // that cannot be written loses its line, not the test.
        if let Ok(mut f) = fs::OpenOptions::new().append(true).create(true).open(&path) {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// Prints a line a test measured (a figure CI shows: the escape count, the fault suite's
/// kills and floods) and, when `CLAUDEBOX_TEST_FIGURES` names a file, appends it there:
/// scripts/test checks that file after its one run of the tests rather than running the
/// suites a second time with `--nocapture` to read their output.
#[macro_export]
macro_rules! figure {
    ($($arg:tt)*) => {
        $crate::figure_line(&format!($($arg)*))
    };
}

pub fn figure_line(line: &str) {
    println!("{line}");
    if let Some(path) = std::env::var_os("CLAUDEBOX_TEST_FIGURES") {
        use std::io::Write;
        // One write of the whole line to a file opened for appending: lines of tests
        // running at once do not interleave.
        let mut f = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("CLAUDEBOX_TEST_FIGURES={}: {e}", path.to_string_lossy()));
        f.write_all(format!("{line}\n").as_bytes())
            .unwrap_or_else(|e| panic!("CLAUDEBOX_TEST_FIGURES={}: {e}", path.to_string_lossy()));
    }
}

/// An exclusive lock shared by every user's test run on this machine (scripts/test runs
/// root's and an ordinary user's at once), for the few tests that use a machine-wide place
/// such as `/tmp` itself as a project: `/tmp/claudebox-test-NAME.lock`, held until dropped.
pub fn machine_lock(name: &str) -> nix::fcntl::Flock<fs::File> {
    machine_lock_as(name, nix::fcntl::FlockArg::LockExclusive)
}

/// [`machine_lock`], shared: for the tests that only need the machine-wide place left
/// alone meanwhile (several may hold it at once; [`machine_lock`] waits for them all).
pub fn machine_lock_shared(name: &str) -> nix::fcntl::Flock<fs::File> {
    machine_lock_as(name, nix::fcntl::FlockArg::LockShared)
}

fn machine_lock_as(name: &str, how: nix::fcntl::FlockArg) -> nix::fcntl::Flock<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = PathBuf::from(format!("/tmp/claudebox-test-{name}.lock"));
    // Opened without O_CREAT first: with fs.protected_regular, O_CREAT on another user's
    // file in the sticky /tmp fails even though it exists. flock needs only read access.
    let f = fs::File::open(&path).or_else(|_| {
        let f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)?;
        f.set_permissions(fs::Permissions::from_mode(0o644))?;
        Ok::<_, std::io::Error>(f)
    });
    let f = f.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    nix::fcntl::Flock::lock(f, how).unwrap_or_else(|(_, e)| panic!("flock {}: {e}", path.display()))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts success and returns stdout.
#[track_caller]
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "claudebox failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// The arguments the fake agent received.
pub fn fake_args(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("ARG<").and_then(|l| l.strip_suffix('>')))
        .map(str::to_string)
        .collect()
}

/// Runs git with a fixed identity; panics on failure.
pub fn git(cwd: &Path, args: &[&str]) -> String {
    let o = Command::new("git")
        .current_dir(cwd)
        .args(["-c", "user.name=T", "-c", "user.email=t@example.com"])
        .args([
            "-c",
            "protocol.file.allow=always",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", cwd)
        .output()
        .expect("git");
    assert!(
        o.status.success(),
        "git {:?} failed: {}",
        args,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim_end().to_string()
}

/// A repository with one commit.
pub fn init_repo(path: &Path) {
    fs::create_dir_all(path).unwrap();
    git(path, &["init", "-q"]);
    fs::write(path.join("README"), "hi\n").unwrap();
    git(path, &["add", "README"]);
    git(path, &["commit", "-qm", "init"]);
}

/// What real git says the canonical root is: realpath of the absolute common dir.
pub fn git_root(cwd: &Path) -> PathBuf {
    let out = git(
        cwd,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    );
    fs::canonicalize(out).unwrap()
}

/// The project id claudebox uses for `cwd`, read from `--dry-run`.
pub fn dry_run(w: &World, cwd: &Path) -> String {
    ok(&w.cmd(cwd).arg("--dry-run").output().unwrap())
}

pub fn env_in_dry_run(out: &str, name: &str) -> Option<String> {
    let prefix = format!("set\t{name}=");
    // A row is `set\tNAME=VALUE\tFROM`; values are escaped, so the first tab ends them.
    // The last row for a name is the one in force.
    out.lines()
        .rev()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|rest| rest.split('\t').next().unwrap_or(rest).to_string())
}

/// A fake agent that keeps conversations the way claude does: `--session-id U` creates
/// `~/.claude/projects/<encoded real cwd>/U.jsonl` (and a `U/tool-results/` directory) and
/// fails "already in use" when it exists; `--resume U` fails "No conversation found"
/// unless `U.jsonl` is under the current directory's encoded name, and prints the
/// conversation so far as `HISTORY<..>` lines. Every run appends a line naming
/// `$CLAUDEBOX_SESSION` and the cwd, then runs `$FAKE_CLAUDE_SCRIPT`.
pub const FAKE_CLAUDE_SESSIONS: &str = r#"#!/bin/sh
echo "FAKE-CLAUDE-START"
for a in "$@"; do printf 'ARG<%s>\n' "$a"; done
printf 'SESSION<%s>\n' "${CLAUDEBOX_SESSION-unset}"
dir="$HOME/.claude/projects/$(pwd -P | sed 's/[^a-zA-Z0-9]/-/g')"
mode=; id=
while [ $# -gt 0 ]; do
  case "$1" in
    --session-id) mode=new; id=$2; shift ;;
    --resume) mode=resume; id=$2; shift ;;
  esac
  shift
done
case "$mode" in
  new)
    if [ -e "$dir/$id.jsonl" ]; then echo "Error: Session ID $id is already in use." >&2; exit 1; fi
    mkdir -p "$dir/$id/tool-results" && echo result > "$dir/$id/tool-results/r.txt" ;;
  resume)
    if [ ! -f "$dir/$id.jsonl" ]; then echo "No conversation found with session ID: $id" >&2; exit 1; fi
    while IFS= read -r line; do printf 'HISTORY<%s>\n' "$line"; done < "$dir/$id.jsonl"
    if [ -f "$dir/$id/tool-results/r.txt" ]; then echo "TOOL-RESULTS-HERE"; fi ;;
esac
if [ -n "$mode" ]; then
  printf '{"session":"%s","cwd":"%s"}\n' "$CLAUDEBOX_SESSION" "$(pwd -P)" >> "$dir/$id.jsonl"
fi
if [ -n "${FAKE_CLAUDE_SCRIPT:-}" ]; then
  eval "$FAKE_CLAUDE_SCRIPT"
fi
"#;

pub mod agent;
pub mod bench;
pub mod maintenance;
pub mod tmux;

/// Spawns `cmd` with its stdout piped and reads the first line it prints (a fixture saying
/// it is ready): the child, its stdout still piped to this process, and that line.
pub fn spawn_first_line(cmd: &mut Command) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().expect("stdout piped"))
        .read_line(&mut line)
        .expect("read its first line");
    (child, line)
}

/// Reads `pipe` to its end in a thread; the receiver gets `()` when the pipe closes (every
/// writer gone): how a test sees a caller's stderr pipe released.
pub fn closed_when_done(
    mut pipe: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<()> {
    let (tx, closed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = pipe.read_to_end(&mut sink);
        let _ = tx.send(());
    });
    closed
}

/// A helper process of a test, killed when the test ends however it ends (a panic
/// included: a helper left running holds the test run's output pipe open, and the run
/// waits on it).
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
