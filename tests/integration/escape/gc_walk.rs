//! `--gc`'s removal of a project's state, racing an agent's process that still writes the
//! conversations directory (issue 21): the moment the walk starts emptying a directory of
//! `claude-projects/` (inotify, IN_DELETE), the attacker renames it away and puts a
//! symlink to a canary directory in the host's home in its place, whose files have the
//! names the walk is removing. gc walks by descriptor (`beneath::Dir::remove_all`): the
//! canary survives. The control, a by-name walk run by the test (list, `is_dir` through
//! the name, remove each entry by its path) against the same attacker, deletes canary
//! files.
//!
//! The attacker is a process of the test acting on the conversations directory through a
//! descriptor, with the agent's rights there: gc removes a project only when no sandbox
//! is registered on it (`inuse::count_running`), so the process that races it is one an
//! agent left behind (what gc reports as stuck), not a registered sandbox.

use super::*;
use crate::BIN;
use std::io::Read;
use std::time::{Duration, Instant};

/// Directories in the conversations, and files in each (and in the canary).
const DIRS: usize = 12;
const FILES: usize = 150;
/// gc rounds (one project each).
pub(crate) const ROUNDS: usize = 3;
const CANARY: &str = "CANARY-untouched\n";

/// `python3 -c ATTACKER CONVERSATIONS CANARY_DIR STOPFILE`
const ATTACKER: &str = r#"
import ctypes, os, select, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
conv, canary, stop = sys.argv[1], sys.argv[2], sys.argv[3]
cfd = os.open(conv, os.O_RDONLY | os.O_DIRECTORY)
ino = libc.inotify_init1(0)
wds = {}
for name in os.listdir(cfd):
    wd = libc.inotify_add_watch(ino, os.path.join(conv, name).encode(), 0x200)  # IN_DELETE
    if wd < 0:
        raise OSError(ctypes.get_errno(), "inotify")
    wds[wd] = name
print("READY", flush=True)
n, done = 0, set()
while not os.path.exists(stop):
    r, _, _ = select.select([ino], [], [], 0.05)
    if not r:
        continue
    buf = os.read(ino, 65536)
    i = 0
    while i < len(buf):
        wd, _, _, ln = struct.unpack_from("iIII", buf, i)
        i += 16 + ln
        name = wds.get(wd)
        if name is None or name in done:
            continue
        done.add(name)
        try:
            os.rename(name, name + ".moved", src_dir_fd=cfd, dst_dir_fd=cfd)
            os.symlink(canary, name, dir_fd=cfd)
            n += 1
        except OSError:
            pass
print("SWAPS", n, flush=True)
"#;

struct Round {
    w: World,
    conv: PathBuf,
    canary: PathBuf,
    stop: PathBuf,
    a: Option<Child>,
}

fn file_name(j: usize) -> String {
    format!("f{j:03}.jsonl")
}

impl Round {
    /// A project with a state whose root is gone, its conversations filled, the canary
    /// made and the attacker watching.
    fn start() -> Round {
        let w = World::new(BIN);
        let proj = w.dir("proj");
        init_repo(&proj);
        ok(&w.cmd(&proj).args(["--exec", "true"]).output().unwrap());
        let projects = w.state().join("projects");
        let state = fs::read_dir(&projects)
            .unwrap()
            .flatten()
            .find(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .expect("the project's state")
            .path();
        let conv = state.join("claude-projects");
        let canary = w.home().join("canary-dir");
        fs::create_dir_all(&canary).unwrap();
        for j in 0..FILES {
            fs::write(canary.join(file_name(j)), CANARY).unwrap();
        }
        for i in 0..DIRS {
            let d = conv.join(format!("-d{i:02}"));
            fs::create_dir_all(&d).unwrap();
            for j in 0..FILES {
                fs::write(d.join(file_name(j)), "{}\n").unwrap();
            }
        }
        fs::remove_dir_all(&proj).unwrap();
        let mut r = Round {
            stop: w.root().join("STOP-ATTACK"),
            w,
            conv,
            canary,
            a: None,
        };
        let (a, line) = lab::spawn_first_line(
            Command::new("python3")
                .args(["-c", ATTACKER])
                .arg(&r.conv)
                .arg(&r.canary)
                .arg(&r.stop)
                .stdin(Stdio::null()),
        );
        assert_eq!(line.trim(), "READY", "the attacker did not start");
        r.a = Some(a);
        r
    }

    /// Canary files deleted or changed.
    fn lost(&self) -> usize {
        (0..FILES)
            .filter(|j| {
                fs::read_to_string(self.canary.join(file_name(*j)))
                    .ok()
                    .as_deref()
                    != Some(CANARY)
            })
            .count()
    }

    fn finish(mut self) -> (usize, String) {
        fs::write(&self.stop, "").unwrap();
        let mut a = self.a.take().unwrap();
        let start = Instant::now();
        while a.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = a.kill();
        let _ = a.wait();
        let mut rest = String::new();
        let _ = a.stdout.take().unwrap().read_to_string(&mut rest);
        (self.lost(), rest.trim().to_string())
    }
}

/// The walk gc had no reason not to write: names, `is_dir` through them.
fn remove_by_name(p: &Path) {
    let Ok(rd) = fs::read_dir(p) else { return };
    for e in rd.flatten() {
        let q = e.path();
        if q.is_dir() {
            remove_by_name(&q);
            let _ = fs::remove_dir(&q);
        } else {
            let _ = fs::remove_file(&q);
        }
    }
}

/// Canary files lost over [`ROUNDS`] gc runs (and the attacker's swap counts).
pub(crate) fn gc_race() -> (usize, Vec<String>) {
    let mut lost = 0;
    let mut swaps = Vec::new();
    for _ in 0..ROUNDS {
        let r = Round::start();
        let out =
            r.w.cmd(&r.w.root())
                .args(["--gc", "--gc-margin", "0"])
                .output()
                .unwrap();
        if std::env::var_os("RACE_DEBUG").is_some() {
            eprintln!("gc: {:?} {}", out.status, stderr(&out));
        }
        let (l, s) = r.finish();
        lost += l;
        swaps.push(s);
    }
    (lost, swaps)
}

/// The control: the by-name walk over the same conversations, same attacker.
pub(crate) fn gc_race_by_name() -> (usize, Vec<String>) {
    let mut lost = 0;
    let mut swaps = Vec::new();
    for _ in 0..ROUNDS {
        let r = Round::start();
        remove_by_name(&r.conv);
        let (l, s) = r.finish();
        lost += l;
        swaps.push(s);
    }
    (lost, swaps)
}

pub(crate) fn attempts() -> Vec<(&'static str, bool)> {
    let (lost, swaps) = gc_race();
    eprintln!("gc walk race: {lost} canary files lost over {ROUNDS} runs ({swaps:?})");
    vec![(
        "gc removal walk: a conversations directory swapped for a symlink to the home",
        lost > 0,
    )]
}

pub(crate) fn controls() {
    let (lost, swaps) = gc_race_by_name();
    eprintln!("gc walk by name: {lost} canary files lost over {ROUNDS} runs ({swaps:?})");
    assert!(
        lost > 0,
        "control: the by-name walk never reached the canary"
    );
}

/// Figures for the README (`-- --ignored --nocapture`).
#[test]
#[ignore]
fn gc_walk_race_figures() {
    let _heavy = lab::heavy();
    let (lost, swaps) = gc_race();
    println!("gc by descriptor: {lost} canary files lost over {ROUNDS} runs ({swaps:?})");
    let (lost, swaps) = gc_race_by_name();
    println!("by name: {lost} canary files lost over {ROUNDS} runs ({swaps:?})");
}
