//! Host-side writes beneath a directory a sandbox can write (issue 21): a sibling sandbox
//! A1 of the project watches its `~/.claude` (the project's `claude-config` on the host)
//! with inotify and, the moment the launch-time merge of `~/.claude.json` creates its
//! temporary file there, swaps it for a symlink to a canary file in the host's home, a
//! FIFO or a directory. The launches B keep merging (the host's `~/.claude.json` changes
//! before each). By descriptor (`state::beneath`) the merge writes the file it created or
//! fails; the control, the old sequence (create, close, write again by name, rename) run
//! by the test against the same attacker, writes into the canary.

use super::race::output_within;
use super::*;
use crate::BIN;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

/// B launches per swap kind (each merges once).
const LAUNCHES: usize = 12;
/// The control stops at its first hit; this many rounds at most.
const CONTROL_ROUNDS: usize = 4000;
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(20);
const CANARY: &str = "CANARY-untouched\n";

/// A1's program: `python3 -c ATTACKER CANARY STOPFILE KIND`.
const ATTACKER: &str = r#"
import ctypes, os, select, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
canary, stop, kind = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = os.path.expanduser("~/.claude")
ino = libc.inotify_init1(0)
if ino < 0 or libc.inotify_add_watch(ino, cfg.encode(), 0x100) < 0:  # IN_CREATE
    raise OSError(ctypes.get_errno(), "inotify")
print("READY", flush=True)
n, seen = 0, set()
while not os.path.exists(stop):
    r, _, _ = select.select([ino], [], [], 0.05)
    if not r:
        continue
    buf = os.read(ino, 65536)
    i = 0
    while i < len(buf):
        _, _, _, ln = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16:i + 16 + ln].rstrip(b"\0").decode()
        i += 16 + ln
        if ".tmp." not in name or name in seen:
            continue
        seen.add(name)
        p = os.path.join(cfg, name)
        try:
            os.unlink(p)
        except OSError:
            continue
        try:
            if kind == "symlink":
                os.symlink(canary, p)
            elif kind == "fifo":
                os.mkfifo(p)
            else:
                os.mkdir(p)
            n += 1
        except OSError:
            pass
print("SWAPS", n, flush=True)
"#;

struct Attack {
    w: World,
    proj: PathBuf,
    a1: Child,
    stop: PathBuf,
    canary: PathBuf,
}

impl Attack {
    fn start(kind: &str) -> Attack {
        let w = World::new(BIN);
        let proj = w.dir("proj");
        init_repo(&proj);
        let canary = w.home().join("canary");
        fs::write(&canary, CANARY).unwrap();
        fs::write(w.home().join(".claude.json"), "{\"n\": 0}\n").unwrap();
        let stop = proj.join("STOP-ATTACK");
        let (a1, line) = lab::spawn_first_line(
            w.cmd(&proj)
                .args(["--exec", "python3", "-c", ATTACKER])
                .arg(&canary)
                .arg(&stop)
                .arg(kind)
                .stdin(Stdio::null()),
        );
        assert_eq!(line.trim(), "READY", "the attacker did not start");
        Attack {
            w,
            proj,
            a1,
            stop,
            canary,
        }
    }

    /// Whether the canary changed (and puts it back).
    fn hit(&self) -> bool {
        let now = fs::read_to_string(&self.canary).unwrap_or_default();
        let hit = now != CANARY;
        if hit {
            let _ = fs::remove_file(&self.canary);
            fs::write(&self.canary, CANARY).unwrap();
        }
        hit
    }

    /// One launch B, after a change of the host's `~/.claude.json` (so it merges).
    fn launch(&self, n: usize) -> bool {
        fs::write(
            self.w.home().join(".claude.json"),
            format!("{{\"n\": {n}}}\n"),
        )
        .unwrap();
        let out = output_within(
            self.w.cmd(&self.proj).args(["--exec", "true"]),
            LAUNCH_TIMEOUT,
        )
        .expect("a launch hung on what the agent planted");
        if std::env::var_os("RACE_DEBUG").is_some() {
            eprintln!("B: {:?} {}", out.status, stderr(&out));
        }
        self.hit()
    }

    fn config(&self) -> PathBuf {
        let projects = self.w.state().join("projects");
        let id = fs::read_dir(&projects)
            .unwrap()
            .flatten()
            .find(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .expect("the project's state")
            .path();
        id.join("claude-config")
    }

    /// The control: the merge as it was before (`tmp_beside` created and closed the file,
    /// then it was written by name and renamed).
    fn by_name(&self, cfg: &Path, seq: usize) -> bool {
        let tmp = cfg.join(format!(
            ".claude.json.tmp.claudebox.{}.{seq}",
            std::process::id()
        ));
        if fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .is_err()
        {
            return false;
        }
        let _ = fs::write(&tmp, b"{\"merged\": \"by name\"}\n");
        let _ = fs::rename(&tmp, cfg.join(".claude.json"));
        // Let the attacker see the next creation.
        std::thread::sleep(Duration::from_millis(2));
        self.hit()
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

/// Hits out of [`LAUNCHES`] launches with the attacker swapping in `kind`.
fn merge_race(kind: &str) -> (usize, String) {
    let a = Attack::start(kind);
    let hits = (1..=LAUNCHES).filter(|n| a.launch(*n)).count();
    let swaps = a.finish();
    (hits, swaps)
}

/// Rounds until the by-name control first hit (`None`: never in [`CONTROL_ROUNDS`]).
fn merge_race_by_name() -> (Option<usize>, String) {
    let a = Attack::start("symlink");
    // One real launch made the project's state.
    a.launch(1);
    let cfg = a.config();
    let won = (1..=CONTROL_ROUNDS).find(|n| a.by_name(&cfg, *n));
    let swaps = a.finish();
    (won, swaps)
}

pub(crate) fn attempts() -> Vec<(&'static str, bool)> {
    ["symlink", "fifo", "dir"]
        .into_iter()
        .map(|kind| {
            let (hits, swaps) = merge_race(kind);
            eprintln!(
                "claude.json merge race ({kind}): {hits} of {LAUNCHES} launches wrote outside ({})",
                swaps.trim()
            );
            let name: &'static str = match kind {
                "symlink" => "claude.json merge: temp file swapped for a symlink to the home",
                "fifo" => "claude.json merge: temp file swapped for a FIFO",
                _ => "claude.json merge: temp file swapped for a directory",
            };
            (name, hits > 0)
        })
        .collect()
}

pub(crate) fn controls() {
    let (won, swaps) = merge_race_by_name();
    eprintln!(
        "claude.json merge by name: first hit at round {won:?} ({})",
        swaps.trim()
    );
    assert!(
        won.is_some(),
        "control: the by-name merge never wrote into the canary"
    );
}

/// Prints the figures for the README (`-- --ignored --nocapture`).
#[test]
#[ignore]
fn host_write_race_figures() {
    let _heavy = lab::heavy();
    for kind in ["symlink", "fifo", "dir"] {
        let (hits, swaps) = merge_race(kind);
        println!(
            "by descriptor, {kind}: {hits} of {LAUNCHES} launches wrote outside ({})",
            swaps.trim()
        );
    }
    let mut wins = 0;
    for _ in 0..3 {
        let (won, swaps) = merge_race_by_name();
        println!("by name: first hit at round {won:?} ({})", swaps.trim());
        wins += usize::from(won.is_some());
    }
    println!("by name: {wins} of 3 races hit");
}
