//! Issue 22, item 4: no stuck children, no hung pipes. A launch is killed at a random
//! point of its first 200 ms (half of them in bwrap's first 3 ms) (SIGKILL or SIGTERM to claudebox, SIGINT to its process
//! group as a terminal's Ctrl-C, or `pkill -KILL claudebox` within that group), for a plain launch, a named session and the first
//! launch of a new project, with its stderr read through a pipe. Counted: bwrap
//! processes of the launch still there a second after the kill (a zombie holds nothing
//! and is not counted), and pipes not closed within a second of it.
//!
//! The agent sleeps: a kill at any point lands before the launch would end by itself, and
//! a sandbox left running without its claudebox is seen (it would hold the pipe).
//!
//! The normal suite runs a few rounds (`kills_at_random_points_leave_no_bwrap_and_no_open_pipe`);
//! the figure for BENCHMARKS.md is 1,000 (`CLAUDEBOX_KILL_ROUNDS=1000`, the ignored
//! `...at_scale` test with `--nocapture`).

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::BIN;
use lab::World;

struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("CLAUDEBOX_KILL_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        println!("launch kills: seed {seed}");
        Rng(seed)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Plain,
    Named,
    First,
}

#[derive(Clone, Copy, Debug)]
enum How {
    Kill,
    Term,
    /// SIGINT to the process group; a Ctrl-C that came before the agent existed is
    /// ignored by design (the agent's, not claudebox's): such a launch is then SIGKILLed.
    Int,
    /// `pkill -KILL -g GROUP claudebox`: claudebox by name (its keeper, `cbx-keeper`, is
    /// spared), confined to the launch's own process group.
    Named,
}

/// Live (not zombie) bwrap processes whose command line names this world's directory.
fn bwraps_of(root: &Path) -> Vec<i32> {
    let needle = root.as_os_str().as_encoded_bytes();
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        if !stat.contains("(bwrap)") {
            continue;
        }
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        if state.starts_with('Z') || state.starts_with('X') {
            continue;
        }
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        if cmdline.windows(needle.len()).any(|w| w == needle) {
            out.push(pid);
        }
    }
    out
}

/// `w.cmd(dir)`, or the same with another claudebox binary (`CLAUDEBOX_KILL_BIN`: a
/// control build measured by this test binary).
fn launcher(w: &World, dir: &Path) -> Command {
    let model = w.cmd(dir);
    let Some(bin) = std::env::var_os("CLAUDEBOX_KILL_BIN") else {
        return model;
    };
    let mut c = Command::new(bin);
    c.current_dir(dir).env_clear();
    for (k, v) in model.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c
}

#[derive(Default, Debug)]
struct Tally {
    rounds: usize,
    leftover_bwraps: usize,
    rounds_with_leftovers: usize,
    hung_pipes: usize,
    int_ignored: usize,
    worst_close_ms: u128,
    /// The rounds whose pipe stayed open past a second: kind, signal, timing, and when it
    /// closed at last.
    hung: Vec<String>,
}

/// When the kill comes: after a delay from the spawn, or a delay after bwrap appeared
/// (its first milliseconds, where bubblewrap #633 lies).
#[derive(Clone, Copy, Debug)]
enum When {
    After(Duration),
    AtBwrap(Duration),
}

/// Whether a bwrap runs among the children or grandchildren of `pid`.
fn has_bwrap_below(pid: u32) -> bool {
    let kids = |p: u32| -> Vec<u32> {
        fs::read_to_string(format!("/proc/{p}/task/{p}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect()
    };
    let is_bwrap =
        |p: u32| fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "bwrap");
    kids(pid)
        .into_iter()
        .any(|c| is_bwrap(c) || kids(c).into_iter().any(is_bwrap))
}

fn round(w: &World, kind: Kind, how: How, delay: When, n: usize, t: &mut Tally) {
    let dir = match kind {
        Kind::Plain => w.dir("plain"),
        Kind::Named => w.dir("named"),
        Kind::First => w.dir(&format!("first-{n}")),
    };
    let mut c = launcher(w, &dir);
    if let Kind::Named = kind {
        c.args(["--session", "s"]);
    }
    c.env("FAKE_CLAUDE_SCRIPT", "exec sleep 5")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = c.spawn().unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    let closed = lab::closed_when_done(child.stderr.take().unwrap());
    match delay {
        When::After(d) => thread::sleep(d),
        When::AtBwrap(d) => {
            let until = Instant::now() + Duration::from_secs(2);
            while !has_bwrap_below(child.id()) && Instant::now() < until {
                std::hint::spin_loop();
            }
            thread::sleep(d);
        }
    }
    let mut killed_at = Instant::now();
    match how {
        How::Kill => drop(kill(pid, Signal::SIGKILL)),
        How::Term => drop(kill(pid, Signal::SIGTERM)),
        How::Named => {
            // Until it matches: right after the spawn the child may not have exec'd
            // claudebox yet (it has the test's name), and a kill by name misses it.
            let group = pid.as_raw().to_string();
            let until = Instant::now() + Duration::from_secs(2);
            loop {
                killed_at = Instant::now();
                let matched = Command::new("pkill")
                    .args(["-KILL", "-g", &group, "claudebox"])
                    .status()
                    .is_ok_and(|s| s.success());
                if matched || Instant::now() > until {
                    break;
                }
            }
        }
        How::Int => {
            let _ = kill(Pid::from_raw(-pid.as_raw()), Signal::SIGINT);
            if closed.recv_timeout(Duration::from_secs(1)).is_err() {
                // Ignored: it came before the agent ran (claudebox and bwrap ignore it).
                t.int_ignored += 1;
                killed_at = Instant::now();
                let _ = kill(pid, Signal::SIGKILL);
            } else {
                let _ = child.wait();
                finish(w, killed_at, None, String::new(), t);
                return;
            }
        }
    }
    let got = closed.recv_timeout(Duration::from_secs(1)).ok();
    let _ = child.wait();
    let what = format!("{kind:?} {how:?} {delay:?}");
    finish(w, killed_at, Some((got, closed)), what, t);
}

/// After the kill: the pipe closed within a second, and no bwrap of the world lives a
/// second after the kill; whatever is left is counted, then cleared for the next round.
fn finish(
    w: &World,
    killed_at: Instant,
    pipe: Option<(Option<()>, mpsc::Receiver<()>)>,
    what: String,
    t: &mut Tally,
) {
    t.rounds += 1;
    if let Some((got, closed)) = pipe {
        if got.is_none() {
            t.hung_pipes += 1;
        } else {
            t.worst_close_ms = t.worst_close_ms.max(killed_at.elapsed().as_millis());
        }
        let root = w.root();
        while killed_at.elapsed() < Duration::from_secs(1) && !bwraps_of(&root).is_empty() {
            thread::sleep(Duration::from_millis(10));
        }
        let left = bwraps_of(&root);
        if !left.is_empty() {
            t.leftover_bwraps += left.len();
            t.rounds_with_leftovers += 1;
            for p in left {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
        }
        let late = closed.recv_timeout(Duration::from_secs(10)).is_ok();
        if got.is_none() {
            t.hung.push(format!(
                "{what}: {} after {} ms",
                if late { "closed" } else { "still open" },
                killed_at.elapsed().as_millis()
            ));
        }
    } else {
        t.worst_close_ms = t.worst_close_ms.max(killed_at.elapsed().as_millis());
    }
    // The next launch of the same project or name must not wait for this one's end.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !bwraps_of(&w.root()).is_empty() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
}

/// `rounds` randomly timed kills; kinds and signals drawn at random. Half the kills land
/// anywhere in the first 200 ms, half in the first 3 ms of bwrap (seen as a child or
/// grandchild of claudebox).
fn run_kills(rounds: usize) -> Tally {
    let w = World::new(BIN);
    let mut rng = Rng::new();
    let mut t = Tally::default();
    let started = Instant::now();
    for n in 0..rounds {
        let kind = [Kind::Plain, Kind::Named, Kind::First][rng.below(3) as usize];
        let how = [How::Kill, How::Kill, How::Term, How::Int, How::Named][rng.below(5) as usize];
        let when = if rng.below(2) == 0 {
            When::AtBwrap(Duration::from_micros(rng.below(3_000)))
        } else {
            When::After(Duration::from_micros(rng.below(200_000)))
        };
        round(&w, kind, how, when, n, &mut t);
    }
    println!(
        "launch kills: {} kills in {:.1}s: {} leftover bwrap processes (in {} rounds), {} \
         stderr pipes not closed within 1 s, worst close {} ms, {} Ctrl-C ignored before \
         the agent ran (then SIGKILLed)",
        t.rounds,
        started.elapsed().as_secs_f64(),
        t.leftover_bwraps,
        t.rounds_with_leftovers,
        t.hung_pipes,
        t.worst_close_ms,
        t.int_ignored
    );
    t
}

fn rounds_from_env(default: usize) -> usize {
    std::env::var("CLAUDEBOX_KILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn kills_at_random_points_leave_no_bwrap_and_no_open_pipe() {
    let _heavy = lab::heavy();
    let t = run_kills(rounds_from_env(60));
    assert_eq!(t.leftover_bwraps, 0, "{t:?}");
    assert_eq!(t.hung_pipes, 0, "{t:?}");
}

/// The figure: 1,000 kills (about ten minutes).
#[test]
#[ignore]
fn kills_at_random_points_leave_no_bwrap_and_no_open_pipe_at_scale() {
    let _heavy = lab::heavy();
    let t = run_kills(rounds_from_env(1000));
    assert_eq!(t.leftover_bwraps, 0, "{t:?}");
    assert_eq!(t.hung_pipes, 0, "{t:?}");
}

/// The window random kills rarely hit, made certain: bwrap wrapped so that it waits
/// (`--userns-block-fd` on a FIFO nobody writes) right after cloning its child, armed
/// with `--die-with-parent` and its child blocked (bubblewrap #633). claudebox itself is
/// then SIGKILLed: its keeper kills bwrap and the orphaned child; the caller's stderr
/// pipe closes within a second and no bwrap is left. Control: today's main (claudebox
/// the direct parent of bwrap) left the child stuck for ever, holding the pipe.
#[test]
fn claudebox_killed_while_bwrap_s_child_waits_leaves_nothing() {
    let _heavy = lab::heavy();
    assert_eq!(
        kill_while_child_waits(Kill::Launcher, false, 3, &[]),
        0,
        "3 rounds"
    );
}

/// The same window, then the whole process group SIGKILLed at once (claudebox and its
/// keeper together: a shell's job killed, `timeout -s KILL` on a group): nothing of the
/// launch may outlive it, and the caller's stderr pipe closes within a second. This holds
/// because bwrap and its waiting child stay in the caller's process group (no
/// `--new-session`, no `setsid` before the sandbox is up) and a SIGKILL from an ancestor
/// pid namespace reaches a namespace's init: the guard is that nothing of the launch
/// leaves the group early. Measured control (not a test): claudebox and its keeper
/// SIGKILLed by pid, bwrap spared, leaves the child stuck 3 of 3, holding the pipe.
#[test]
fn group_killed_while_bwrap_s_child_waits_leaves_nothing() {
    let _heavy = lab::heavy();
    assert_eq!(
        kill_while_child_waits(Kill::Group, false, 3, &[]),
        0,
        "3 rounds"
    );
    // Control: bwrap started in a session of its own (as `--new-session` or a `setsid`
    // before it would do) is outside the group; its child is left stuck, holding the pipe.
    assert!(
        kill_while_child_waits(Kill::Group, true, 1, &[]) > 0,
        "control left nothing"
    );
}

/// The same window, then `pkill -STOP claudebox` and `pkill -KILL claudebox` (a regex on
/// the process name, as `killall claudebox` matches the exact name): claudebox dies, its
/// keeper (named `cbx-keeper`) is spared and kills bwrap and bwrap's orphaned child. Then
/// the same with `-f` (the command line: claudebox, its keeper, and bwrap and its child,
/// whose arguments name `~/.claudebox`). Each pkill is confined to the launch's own process
/// group (`-g`): the test kills nothing of anyone else's. Control
/// (`CLAUDEBOX_TEST_KEEPER_AS_CLAUDEBOX`): a keeper named `claudebox` is stopped and dies
/// with claudebox, bwrap dies of its parent-death signal, and its child is left stuck
/// holding the pipe. (Without the stop, pkill's one-by-one kills let that keeper act
/// between two of them at times: as claudebox-test it cleared up 2 of 2.)
#[test]
fn killed_by_name_while_bwrap_s_child_waits_leaves_nothing() {
    let _heavy = lab::heavy();
    assert_eq!(
        kill_while_child_waits(Kill::Named(false), false, 3, &[]),
        0,
        "3 rounds"
    );
    assert_eq!(
        kill_while_child_waits(Kill::Named(true), false, 2, &[]),
        0,
        "2 rounds"
    );
    // This machine's init (which adopts the orphaned child) at times kills it: the control
    // tries up to six rounds for one stuck child (2 to 4 of 6 were cleared so, as root).
    let control = [("CLAUDEBOX_TEST_KEEPER_AS_CLAUDEBOX", "1")];
    assert!(
        (0..6).any(|_| kill_while_child_waits(Kill::Named(false), false, 1, &control) > 0),
        "control left nothing"
    );
}

/// How a launch held in bubblewrap #633's window is SIGKILLed.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// claudebox alone, by pid.
    Launcher,
    /// Its whole process group.
    Group,
    /// `pkill -KILL -g GROUP claudebox` (`true`: with `-f`, the command line).
    Named(bool),
}

/// Rounds of a launch held in bubblewrap #633's window, then SIGKILLed (`how`;
/// `own_session`: bwrap started through `setsid`, the group kill's control; `env`: more
/// variables for claudebox): how many bwraps were left and pipes not closed within a
/// second.
fn kill_while_child_waits(
    how: Kill,
    own_session: bool,
    rounds: usize,
    env: &[(&str, &str)],
) -> usize {
    let w = World::new(BIN);
    let dir = w.dir("p");
    let fifo = w.root().join("block.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let real = ["/usr/local/bin/bwrap", "/usr/bin/bwrap", "/bin/bwrap"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("bwrap");
    let wrapper = w.root().join("bwrap-blocking");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {}{real} --info-fd 8 --userns-block-fd 9 \"$@\" 9<>'{}' 8>/dev/null\n",
            if own_session { "setsid " } else { "" },
            fifo.display()
        ),
    )
    .unwrap();
    fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut stuck_total = 0;
    for _ in 0..rounds {
        let mut c = launcher(&w, &dir);
        c.env("CLAUDEBOX_BWRAP", &wrapper)
            .envs(env.iter().copied())
            .args(["--session", "s"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !matches!(how, Kill::Launcher) {
            c.process_group(0);
        }
        let mut child = c.spawn().unwrap();
        let closed = lab::closed_when_done(child.stderr.take().unwrap());
        // bwrap has cloned its child, which waits: two bwraps of this world.
        let until = Instant::now() + Duration::from_secs(20);
        while bwraps_of(&w.root()).len() < 2 {
            assert!(Instant::now() < until, "bwrap never cloned its child");
            thread::sleep(Duration::from_millis(5));
        }
        thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        let target = child.id() as i32;
        match how {
            Kill::Launcher => kill(Pid::from_raw(target), Signal::SIGKILL).unwrap(),
            Kill::Group => kill(Pid::from_raw(-target), Signal::SIGKILL).unwrap(),
            Kill::Named(full) => {
                // Stopped by name first, then killed by name: the matched processes die
                // at once as far as they can tell (pkill's kills, one after another, may
                // otherwise let a matched keeper act between two of them).
                let group = target.to_string();
                for sig in ["-STOP", "-KILL"] {
                    let mut pkill = Command::new("pkill");
                    pkill.args([sig, "-g", &group]);
                    if full {
                        pkill.arg("-f");
                    }
                    let st = pkill.arg("claudebox").status().unwrap();
                    assert!(st.success(), "pkill {sig} matched nothing: {st}");
                }
            }
        }
        child.wait().unwrap();
        let pipe_closed = closed.recv_timeout(Duration::from_secs(1)).is_ok();
        while t.elapsed() < Duration::from_secs(1) && !bwraps_of(&w.root()).is_empty() {
            thread::sleep(Duration::from_millis(10));
        }
        let left = bwraps_of(&w.root());
        println!(
            "{how:?} killed while bwrap's child waits{}: pipe closed: {pipe_closed} ({} ms), \
             bwraps left: {left:?}",
            if env.is_empty() { "" } else { " (control)" },
            t.elapsed().as_millis()
        );
        stuck_total += left.len() + usize::from(!pipe_closed);
        for p in left {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        let _ = closed.recv_timeout(Duration::from_secs(5));
    }
    stuck_total
}

/// SIGTERM to claudebox 0 to 3 ms after bwrap appeared, on first launches of new projects
/// (`CLAUDEBOX_KILL_ROUNDS`, 150 unless set): the sandbox must end, and the pipe close,
/// within a second. Before the fix (`supervise::PENDING`) a SIGTERM taken by another
/// thread of claudebox while no child was known was lost and the agent ran on: 2 and 4 of
/// 150 as root; the random kills above saw it once in 1,000 as claudebox-test.
#[test]
#[ignore]
fn a_sigterm_in_bwrap_s_first_milliseconds_is_not_lost() {
    let _heavy = lab::heavy();
    let w = World::new(BIN);
    let mut rng = Rng::new();
    let rounds = rounds_from_env(150);
    let mut lost = Vec::new();
    for n in 0..rounds {
        let dir = w.dir(&format!("first-{n}"));
        let mut c = launcher(&w, &dir);
        c.env("FAKE_CLAUDE_SCRIPT", "exec sleep 5")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = c.spawn().unwrap();
        let pid = child.id();
        let closed = lab::closed_when_done(child.stderr.take().unwrap());
        let until = Instant::now() + Duration::from_secs(2);
        while !has_bwrap_below(pid) && Instant::now() < until {
            std::hint::spin_loop();
        }
        thread::sleep(Duration::from_micros(rng.below(3000)));
        let t = Instant::now();
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        if closed.recv_timeout(Duration::from_secs(1)).is_err() {
            let _ = closed.recv_timeout(Duration::from_secs(10));
            lost.push(format!(
                "round {n}: closed after {} ms",
                t.elapsed().as_millis()
            ));
        }
        let _ = child.wait();
    }
    println!(
        "SIGTERM in bwrap's first 3 ms: {} of {rounds} lost {lost:?}",
        lost.len()
    );
    assert!(lost.is_empty(), "{lost:?}");
}

/// Issue 35: a launch killed after its agent made work-tree entries the host runs code
/// from (`.envrc`, `.vscode`, `.mcp.json`, missing at its start, so not mounted over) left
/// its exit review undone; the next launch does it, and it must do it before it plans
/// its mounts: the first relaunch failed "cannot open .../.envrc to mount it" (planned
/// as present, then moved aside by the missed review). The relaunch now starts at once,
/// with the entries moved aside. Control: the entries were there when it started.
#[test]
fn a_relaunch_after_a_kill_with_new_entries_starts_at_once() {
    let _heavy = lab::heavy();
    let w = World::new(BIN);
    let dir = w.dir("p");
    lab::init_repo(&dir);
    let made = dir.join(".made");
    let mut c = w.cmd(&dir);
    c.args([
        "--exec",
        "sh",
        "-c",
        "echo 'echo hi' > .envrc && mkdir .vscode && echo '{}' > .vscode/tasks.json \
         && echo '{}' > .mcp.json && touch .made && exec sleep 60",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    // Bounded wait for the agent's entries (no fixed sleep: polled, at most 60 s).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !made.exists() {
        assert!(
            Instant::now() < deadline,
            "the agent never made its entries"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the launch ended early"
        );
        thread::sleep(Duration::from_millis(20));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    for e in [".envrc", ".vscode", ".mcp.json"] {
        assert!(
            dir.join(e).exists(),
            "control: {e} was made by the killed agent"
        );
    }
    let out = w
        .cmd(&dir)
        .args(["--exec", "sh", "-c", "echo relaunched"])
        .output()
        .unwrap();
    let err = lab::stderr(&out);
    assert!(out.status.success(), "the first relaunch failed: {err}");
    assert!(lab::stdout(&out).contains("relaunched"), "{err}");
    assert!(err.contains("ended without its exit review"), "{err}");
    assert!(!err.contains("to mount it"), "{err}");
    for e in [".envrc", ".vscode", ".mcp.json"] {
        assert!(!dir.join(e).exists(), "{e} was not moved aside: {err}");
    }
}
