//! Every host-side write in a directory a sandbox can write, raced (issue 21 item 1).
//!
//! The directories of the host a sandbox can write that claudebox itself writes in are the
//! project's `claude-config`, `claude-projects` and `claude-plugin-data` and the shared
//! `login` (checked below from inside: every read-write mount of the state is one of
//! these, or one of the package caches, which claudebox only makes; session records, the
//! settings copy's directory, the denied log, quarantine and the rest of the state are
//! mounted nowhere). What claudebox does there: it creates
//! files (the `.claude.json` merge, the conversation copies of `--import-conversation`,
//! mount points), creates directories, renames and removes; it writes nothing in place
//! there (the in-place writes, the settings copy and the credentials, go to single-file
//! binds, tested below as unswappable).
//!
//! The harness: an attacker watches all four directories (and every directory made in
//! them) with inotify and, the moment anything is created that it did not make itself,
//! swaps it: a file for a symlink to a canary file in the host's home, a FIFO or a
//! directory; a directory for a symlink to a canary directory; run from a sibling sandbox
//! of the project, with the agent's rights. The hard-link swap cannot be made from inside
//! (the canary is on another mount: `link` fails EXDEV, shown below), so it is made by a
//! process of the test on the host, stronger than any agent. Meanwhile the launches B
//! merge a changed `~/.claude.json` and `--import-conversation` copies a new conversation
//! (a transcript and its `<uuid>/tool-results/`) each round. A hit is a canary changed or
//! a file appearing in the canary directory. The control runs the same rounds with
//! `CLAUDEBOX_TEST_BY_NAME` (debug builds: `state::beneath` by name, as before issue 21,
//! its reopen 5 ms after the creation) and must hit.
//!
//! Also here: `--restore` while a sibling exchanges the entry's directory with a symlink
//! to the home (the exit review's own moves go from directories it opened by descriptor
//! into the state's `quarantine/`, which no sandbox sees, so a swap there moves only what
//! the agent put at the name).

use super::race::output_within;
use super::*;
use crate::BIN;
use std::io::Read;
use std::time::{Duration, Instant};

/// Rounds (one merge and one import each) per swap kind.
const ROUNDS: usize = 6;
/// The control stops at its first hit; this many rounds at most.
const CONTROL_ROUNDS: usize = 40;
const LIMIT: Duration = Duration::from_secs(30);
const CANARY: &str = "CANARY-untouched\n";
const KINDS: &[&str] = &["symlink", "fifo", "dir", "dirlink", "hardlink"];

/// `python3 -c ATTACKER KIND CANARY_FILE CANARY_DIR STOPFILE DIR...`
const ATTACKER: &str = r#"
import ctypes, os, select, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
kind, canary, canary_dir, stop = sys.argv[1:5]
dirs = [d for d in sys.argv[5:] if os.path.isdir(d)]
ino = libc.inotify_init1(0)
wds = {}
def watch(d):
    wd = libc.inotify_add_watch(ino, d.encode(), 0x100)  # IN_CREATE
    if wd >= 0:
        wds[wd] = d
for top in dirs:
    for root, subs, _ in os.walk(top):
        watch(root)
print("READY", len(wds), flush=True)
mine, n, fails = set(), 0, 0
while not os.path.exists(stop):
    r, _, _ = select.select([ino], [], [], 0.05)
    if not r:
        continue
    buf = os.read(ino, 65536)
    i = 0
    while i < len(buf):
        wd, mask, _, ln = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16:i + 16 + ln].rstrip(b"\0").decode("utf-8", "replace")
        i += 16 + ln
        d = wds.get(wd)
        if d is None or not name:
            continue
        p = os.path.join(d, name)
        if p in mine:
            continue
        is_dir = bool(mask & 0x40000000)
        try:
            if is_dir:
                if kind != "dirlink":
                    watch(p)
                    continue
                os.rename(p, p + ".away")
                mine.add(p + ".away")
                mine.add(p)
                os.symlink(canary_dir, p)
            else:
                if kind == "dirlink":
                    continue
                os.unlink(p)
                mine.add(p)
                if kind == "symlink":
                    os.symlink(canary, p)
                elif kind == "fifo":
                    os.mkfifo(p)
                elif kind == "dir":
                    os.mkdir(p)
                else:
                    os.link(canary, p)
            n += 1
        except OSError:
            fails += 1
print("SWAPS", n, "missed", fails, flush=True)
"#;

/// Where the sandbox of the project writes on the host, as the attacker names them.
fn inside_dirs() -> Vec<String> {
    [
        "$HOME/.claude",
        "$HOME/.claude/projects",
        "$HOME/.claude/plugins/data",
        "$CLAUDE_SECURESTORAGE_CONFIG_DIR",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

struct Race {
    w: World,
    proj: PathBuf,
    a: Option<Child>,
    stop: PathBuf,
    canary: PathBuf,
    canary_dir: PathBuf,
    host_projects: PathBuf,
}

/// Claude's name for a directory's conversations (short paths).
fn encoded(p: &Path) -> String {
    p.to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

fn state_of(w: &World) -> PathBuf {
    fs::read_dir(w.state().join("projects"))
        .unwrap()
        .flatten()
        .find(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .expect("the project's state")
        .path()
}

impl Race {
    fn start(kind: &str) -> Race {
        let w = World::new(BIN);
        let proj = w.dir("proj");
        init_repo(&proj);
        let canary_dir = w.home().join("canary-dir");
        fs::create_dir_all(&canary_dir).unwrap();
        let canary = canary_dir.join("canary");
        fs::write(&canary, CANARY).unwrap();
        fs::write(w.home().join(".claude.json"), "{\"n\": 0}\n").unwrap();
        let host_projects = w.home().join(".claude/projects").join(encoded(&proj));
        fs::create_dir_all(&host_projects).unwrap();
        // The project's state, its mount points and the conversations' directory exist
        // (a first launch and a first import), as on any machine after its first day.
        let mut r = Race {
            stop: proj.join("STOP-ATTACK"),
            w,
            proj,
            a: None,
            canary,
            canary_dir,
            host_projects,
        };
        ok(&r.w.cmd(&r.proj).args(["--exec", "true"]).output().unwrap());
        r.import(0, false);
        let mut cmd = if kind == "hardlink" {
            let st = state_of(&r.w);
            let mut c = Command::new("python3");
            c.args(["-c", ATTACKER, kind])
                .arg(&r.canary)
                .arg(&r.canary_dir)
                .arg(&r.stop)
                .arg(st.join("claude-config"))
                .arg(st.join("claude-projects"))
                .arg(st.join("claude-plugin-data"))
                .arg(r.w.state().join("login"));
            c
        } else {
            let mut c = r.w.cmd(&r.proj);
            let script = format!(
                "exec python3 -c {} {kind} {} {} {} {}",
                sq(ATTACKER),
                sq(&r.canary.to_string_lossy()),
                sq(&r.canary_dir.to_string_lossy()),
                sq(&r.stop.to_string_lossy()),
                inside_dirs()
                    .iter()
                    .map(|d| format!("\"{d}\""))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            c.args(["--exec", "sh", "-c", &script]);
            c
        };
        let (a, line) = lab::spawn_first_line(cmd.stdin(Stdio::null()));
        assert!(line.starts_with("READY"), "the attacker did not start");
        r.a = Some(a);
        r
    }

    /// Whether a canary changed or the canary directory got a new entry (and puts them
    /// back).
    fn hit(&self) -> bool {
        let changed = fs::read_to_string(&self.canary).unwrap_or_default() != CANARY;
        let extra: Vec<_> = fs::read_dir(&self.canary_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != "canary")
            .collect();
        for e in &extra {
            let _ = fs::remove_dir_all(e.path()).or_else(|_| fs::remove_file(e.path()));
        }
        if changed {
            let _ = fs::remove_file(&self.canary);
            fs::write(&self.canary, CANARY).unwrap();
        }
        changed || !extra.is_empty()
    }

    fn by_name(c: &mut Command, by_name: bool) -> &mut Command {
        if by_name {
            c.env("CLAUDEBOX_TEST_BY_NAME", "5");
        }
        c
    }

    /// A new conversation on the host, imported into the state.
    fn import(&self, n: usize, by_name: bool) {
        let uuid = format!("00000000-0000-4000-8000-{n:012}");
        let dir = self.host_projects.join(&uuid).join("tool-results");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("t.txt"), format!("result {n}\n")).unwrap();
        fs::write(
            self.host_projects.join(format!("{uuid}.jsonl")),
            format!("{{\"sessionId\":\"{uuid}\",\"n\":{n}}}\n"),
        )
        .unwrap();
        let mut c = self.w.cmd(&self.proj);
        c.args(["--import-conversation", &uuid]);
        let out = output_within(Self::by_name(&mut c, by_name), LIMIT)
            .expect("an import hung on what the agent planted");
        if std::env::var_os("RACE_DEBUG").is_some() {
            eprintln!("import: {:?} {}", out.status, stderr(&out));
        }
    }

    /// One round: a merge (the host's file changed) and an import. Whether it hit.
    fn round(&self, n: usize, by_name: bool) -> bool {
        fs::write(
            self.w.home().join(".claude.json"),
            format!("{{\"n\": {n}}}\n"),
        )
        .unwrap();
        let mut c = self.w.cmd(&self.proj);
        c.args(["--exec", "true"]);
        let out = output_within(Self::by_name(&mut c, by_name), LIMIT)
            .expect("a launch hung on what the agent planted");
        if std::env::var_os("RACE_DEBUG").is_some() {
            eprintln!("launch: {:?} {}", out.status, stderr(&out));
        }
        let launch_hit = self.hit();
        self.import(n, by_name);
        launch_hit | self.hit()
    }

    fn finish(mut self) -> String {
        fs::write(&self.stop, "").unwrap();
        let mut a = self.a.take().unwrap();
        let start = Instant::now();
        while a.try_wait().unwrap().is_none() && start.elapsed() < LIMIT {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = a.kill();
        let _ = a.wait();
        let mut rest = String::new();
        let _ = a.stdout.take().unwrap().read_to_string(&mut rest);
        rest.trim().to_string()
    }
}

/// Hits over `rounds` rounds against `kind` (the control stops at its first hit).
fn state_race(kind: &str, by_name: bool, rounds: usize) -> (usize, usize, String) {
    let r = Race::start(kind);
    let mut hits = 0;
    let mut done = 0;
    for n in 1..=rounds {
        done = n;
        hits += usize::from(r.round(n, by_name));
        if by_name && hits > 0 {
            break;
        }
    }
    let swaps = r.finish();
    (hits, done, swaps)
}

/// Whether the attacker's report counts at least one swap.
fn swapped(report: &str) -> bool {
    report
        .split_whitespace()
        .skip_while(|w| *w != "SWAPS")
        .nth(1)
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n > 0)
}

fn attempt_name(kind: &str) -> &'static str {
    match kind {
        "symlink" => {
            "state writes (merge, import): each new file swapped for a symlink to the home"
        }
        "fifo" => "state writes (merge, import): each new file swapped for a FIFO",
        "dir" => "state writes (merge, import): each new file swapped for a directory",
        "dirlink" => "state writes (import): each new directory swapped for a symlink to the home",
        _ => "state writes (merge, import): each new file swapped for a hard link to a host file",
    }
}

/// `python3 -c EXCHANGER HOME STOPFILE`, in the project: `sub` and a symlink to the
/// home exchanged (`renameat2` RENAME_EXCHANGE) again and again, for 0.3 to 3 ms each.
const EXCHANGER: &str = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
home, stop = sys.argv[1], sys.argv[2]
os.symlink(home, "sub.swap")
holds = [0.0003, 0.001, 0.003]
n = 0
print("READY", flush=True)
while not os.path.exists(stop):
    if libc.renameat2(-100, b"sub", -100, b"sub.swap", 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
    n += 1
    time.sleep(holds[n % len(holds)])
if os.path.islink("sub"):
    libc.renameat2(-100, b"sub", -100, b"sub.swap", 2)
print("SWAPS", n, flush=True)
"#;

/// `--restore` racing a sibling sandbox that exchanges the entry's directory with a
/// symlink to the home: hits (a `.envrc` reaching the home) over `rounds` restores, and
/// the sibling's report. The control moves the entries back by name.
fn restore_race(by_name: bool, rounds: usize) -> (usize, usize, String) {
    use std::os::fd::AsRawFd;
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    fs::create_dir_all(proj.join("sub")).unwrap();
    fs::write(proj.join("sub/keep.txt"), "the user's\n").unwrap();
    // Entries to restore: one `.envrc` moved aside by each session's exit review.
    let mut ids = Vec::new();
    for _ in 0..rounds {
        let o = w
            .cmd(&proj)
            .args(["--exec", "sh", "-c", "echo 'echo AGENT' > sub/.envrc"])
            .output()
            .unwrap();
        let id = stderr(&o)
            .lines()
            .filter_map(|l| l.split("claudebox --restore ").nth(1))
            .map(|s| s.trim().to_string())
            .next()
            .unwrap_or_else(|| panic!("no review line: {}", stderr(&o)));
        ids.push(id);
    }
    let quarantine = state_of(&w).join("quarantine");
    let real = fs::File::open(proj.join("sub")).unwrap();
    let stop = proj.join("STOP-ATTACK");
    let (mut a, line) = lab::spawn_first_line(
        w.cmd(&proj)
            .args(["--exec", "python3", "-c", EXCHANGER])
            .arg(w.home())
            .arg(&stop)
            .stdin(Stdio::null()),
    );
    assert_eq!(line.trim(), "READY", "the attacker did not start");
    let canary = w.home().join(".envrc");
    let mut hits = 0;
    let mut done = 0;
    for id in &ids {
        done += 1;
        if by_name {
            // Paced like the real command's runs, to meet both phases of the exchange.
            std::thread::sleep(Duration::from_millis(2));
            let _ = fs::rename(quarantine.join(id).join("entry"), proj.join("sub/.envrc"));
        } else {
            let _ = w.cmd(&w.root()).args(["--restore", id]).output().unwrap();
        }
        if fs::symlink_metadata(&canary).is_ok() {
            hits += 1;
            let _ = fs::remove_file(&canary);
        }
        // What came back in the project, by the real directory's descriptor.
        let _ = nix::unistd::unlinkat(
            Some(real.as_raw_fd()),
            ".envrc",
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        if by_name && hits > 0 {
            break;
        }
    }
    fs::write(&stop, "").unwrap();
    let start = Instant::now();
    while a.try_wait().unwrap().is_none() && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = a.kill();
    let _ = a.wait();
    let mut rest = String::new();
    let _ = a.stdout.take().unwrap().read_to_string(&mut rest);
    (hits, done, rest.trim().to_string())
}

/// Restores per run.
const RESTORES: usize = 40;

/// Inside, every read-write mount of claudebox's state: only the four directories the
/// harness races and the single-file binds (prompt history, the settings copy).
const MOUNTS: &str = "cat /proc/self/mountinfo";

/// Single-file binds: replaced, removed, renamed away, or a symlink put over them from
/// inside, each must fail (EBUSY); and a hard link of anything from another mount into a
/// raced directory (the project's files, the system's, the bound files) fails (EXDEV).
const UNSWAPPABLE: &str = r#"
L="$CLAUDE_SECURESTORAGE_CONFIG_DIR"
for f in "$HOME/.claude/history.jsonl" "$HOME/.claude/settings.json" "$PWD/.claude/settings.local.json" "$L/.credentials.json"; do
  [ -e "$f" ] || { echo "MISSING $f"; continue; }
  d=$(dirname "$f")
  echo x > "$d/cb-other" 2>/dev/null
  mv -f "$d/cb-other" "$f" 2>/dev/null && echo "SWAPPED replaced $f"
  rm -f "$d/cb-other"
  mv "$f" "$f.away" 2>/dev/null && echo "SWAPPED renamed $f"
  rm -f "$f" 2>/dev/null && [ ! -e "$f" ] && echo "SWAPPED removed $f"
  ln -sfn /etc/passwd "$f" 2>/dev/null && [ -L "$f" ] && echo "SWAPPED symlinked $f"
  python3 -c 'import os,sys; os.rename(sys.argv[1], sys.argv[2])' "$f" "$d/cb-x" 2>/dev/null && echo "SWAPPED pyrename $f"
done
echo project > "$PWD/cb-file"
for src in "$PWD/cb-file" /etc/hostname "$HOME/.claude/history.jsonl" "$HOME/.claude/settings.json" "$L/.credentials.json" "$PWD/.claude/settings.local.json"; do
  [ -e "$src" ] || continue
  for to in "$HOME/.claude" "$HOME/.claude/projects" "$L"; do
    ln "$src" "$to/cb-hardlink" 2>/dev/null && echo "LINKED $src into $to"
    rm -f "$to/cb-hardlink"
  done
done
echo DONE
"#;

/// The host's login, shared with the sandbox as a single-file bind: the tests using it
/// give `--no-login-broker` (with the broker the login dir is the sandbox's own tmpfs).
fn with_credentials(w: &World) {
    fs::write(
        w.home().join(".claude/.credentials.json"),
        r#"{"claudeAiOauth":{"accessToken":"a0","refreshToken":"r0","expiresAt":1}}"#,
    )
    .unwrap();
}

/// Runs UNSWAPPABLE inside: (escaped, output).
fn unswappable() -> (bool, String) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    with_credentials(&w);
    let out = w
        .cmd(&proj)
        .args(["--no-login-broker", "--exec", "sh", "-c", UNSWAPPABLE])
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("DONE"), "{text}");
    let missing = stdout(&out).contains("MISSING");
    (
        missing || text.contains("SWAPPED") || text.contains("LINKED"),
        text,
    )
}

/// The state's read-write mounts inside, relative to the project's state (or `login`).
fn state_mounts() -> (Vec<String>, String) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    with_credentials(&w);
    let out = w
        .cmd(&proj)
        .args(["--no-login-broker", "--exec", "sh", "-c", MOUNTS])
        .output()
        .unwrap();
    let text = stdout(&out);
    // The state's path as mountinfo's root field shows it: relative to its file
    // system's root, found from the host's own mountinfo.
    let state = fs::canonicalize(w.state()).unwrap();
    let host = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let (mp, root) = host
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((PathBuf::from(f.get(4)?), PathBuf::from(f.get(3)?)))
        })
        .filter(|(mp, _)| state.starts_with(mp))
        .max_by_key(|(mp, _)| mp.as_os_str().len())
        .unwrap();
    let in_fs = root.join(state.strip_prefix(&mp).unwrap());
    let project = state_of(&w);
    let id = project.file_name().unwrap().to_string_lossy().to_string();
    let mut rw = Vec::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let (Some(r), Some(opts)) = (f.get(3), f.get(5)) else {
            continue;
        };
        let Ok(rel) = Path::new(r).strip_prefix(&in_fs) else {
            continue;
        };
        if opts.split(',').any(|o| o == "rw") {
            let rel = rel
                .to_string_lossy()
                .replacen(&format!("projects/{id}"), "<id>", 1);
            rw.push(rel);
        }
    }
    rw.sort();
    (rw, text)
}

/// Read-write mounts of the state a sandbox may have: the raced directories and the
/// single-file binds.
const RW_STATE: &[&str] = &[
    "<id>/claude-config",
    "<id>/claude-plugin-data",
    "<id>/claude-projects",
    "<id>/claude-settings.json",
    "<id>/claude-settings.local.json",
    "<id>/history.jsonl",
    "login",
];

/// The project's package caches (`policy::caches::TABLE`), each bound read-write whole:
/// claudebox only makes each one (`mkdir` in `caches/`, which no sandbox sees) and never
/// writes in them (`--gc` removes them beneath its descriptor).
fn is_cache(r: &str) -> bool {
    r.strip_prefix("<id>/caches/")
        .is_some_and(|n| !n.is_empty() && !n.contains('/'))
}

pub(crate) fn attempts() -> Vec<(&'static str, bool)> {
    let mut v = Vec::new();
    for kind in KINDS {
        let (hits, rounds, swaps) = state_race(kind, false, ROUNDS);
        eprintln!("state race ({kind}): {hits} of {rounds} rounds hit ({swaps})");
        assert!(
            swapped(&swaps),
            "the attacker swapped nothing ({kind}): {swaps}"
        );
        v.push((attempt_name(kind), hits > 0));
    }
    let (hits, done, swaps) = restore_race(false, RESTORES);
    eprintln!("restore race: {hits} of {done} restores reached the home ({swaps})");
    assert!(swapped(&swaps), "the attacker swapped nothing: {swaps}");
    v.push((
        "--restore: the entry's directory exchanged with a symlink to the home meanwhile",
        hits > 0,
    ));
    let (rw, text) = state_mounts();
    let extra: Vec<_> = rw
        .iter()
        .filter(|r| !RW_STATE.contains(&r.as_str()) && !is_cache(r))
        .collect();
    if !extra.is_empty() {
        eprintln!("state mounted read-write beyond the raced directories: {extra:?}\n{text}");
    }
    v.push((
        "reach the session records, the settings copy's directory, the denied log or quarantine (a read-write mount of the state)",
        !extra.is_empty() || rw.is_empty(),
    ));
    let (escaped, text) = unswappable();
    if escaped {
        eprintln!("unswappable: {text}");
    }
    v.push((
        "swap a single-file bind (history, settings copy, credentials) or hard-link a file of another mount into a raced directory",
        escaped,
    ));
    v
}

/// The same commands where nothing stops them: a file in a directory bound whole (not a
/// single-file bind) is replaced, renamed, removed and symlinked; a hard link within one
/// mount is made.
fn unswappable_control() {
    let w = World::new(BIN);
    let d = w.dir("bound");
    fs::write(d.join("history.jsonl"), "x\n").unwrap();
    let script = format!(
        "f={0}/history.jsonl; echo y > {0}/o; mv -f {0}/o $f && echo SWAPPED-replaced; \
         mv $f $f.away && echo SWAPPED-renamed; echo z > $f; rm -f $f && echo SWAPPED-removed; \
         ln -sfn /etc/passwd $f && echo SWAPPED-symlinked; echo w > {0}/a; ln {0}/a {0}/b && echo LINKED",
        sq(&d.to_string_lossy())
    );
    let out = Command::new("bwrap")
        .args([
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--bind",
        ])
        .arg(&d)
        .arg(&d)
        .args(["sh", "-c", &script])
        .output()
        .unwrap();
    let t = stdout(&out);
    for m in [
        "SWAPPED-replaced",
        "SWAPPED-renamed",
        "SWAPPED-removed",
        "SWAPPED-symlinked",
        "LINKED",
    ] {
        assert!(t.contains(m), "control: {m} missing: {t}{}", stderr(&out));
    }
}

pub(crate) fn controls() {
    for kind in ["symlink", "dirlink", "hardlink"] {
        let (hits, rounds, swaps) = state_race(kind, true, CONTROL_ROUNDS);
        eprintln!("state race by name ({kind}): first hit after {rounds} rounds: {hits} ({swaps})");
        assert!(
            hits > 0,
            "control: the by-name state writes never reached the canary ({kind}; \
             CLAUDEBOX_TEST_BY_NAME is read by debug builds only)"
        );
    }
    let (hits, done, swaps) = restore_race(true, RESTORES);
    eprintln!("restore race by name: {hits} hit after {done} restores ({swaps})");
    assert!(
        hits > 0,
        "control: the by-name restore never reached the home"
    );
    unswappable_control();
}

/// The figures (`-- --ignored --nocapture`).
#[test]
#[ignore]
fn state_race_figures() {
    let _heavy = lab::heavy();
    for kind in KINDS {
        let (hits, rounds, swaps) = state_race(kind, false, ROUNDS);
        println!("by descriptor, {kind}: {hits} of {rounds} rounds hit ({swaps})");
    }
    // By name, a FIFO blocks the reopen for good (the hang is its own harm).
    for kind in ["symlink", "dirlink", "hardlink"] {
        let (hits, rounds, swaps) = state_race(kind, true, ROUNDS);
        println!("by name, {kind}: first hit at round {rounds}, {hits} ({swaps})");
    }
    let (rw, _) = state_mounts();
    println!("read-write state mounts inside: {rw:?}");
    let (escaped, text) = unswappable();
    println!("unswappable: escaped = {escaped}\n{text}");
}

/// The restore race's figures (`-- --ignored --nocapture`).
#[test]
#[ignore]
fn restore_race_figures() {
    let _heavy = lab::heavy();
    let (hits, done, swaps) = restore_race(false, RESTORES);
    println!("restore by descriptor: {hits} of {done} reached the home ({swaps})");
    let (hits, done, swaps) = restore_race(true, RESTORES);
    println!("restore by name: {hits} hit after {done} ({swaps})");
}
