//! Core dumps of the host-side processes that hold the real login (the broker, and the
//! launching claudebox with `ANTHROPIC_API_KEY` in its environment): they are not
//! dumpable and have no core limit (`host::companion::keep_out_of_dumps`). The attack: the
//! agent waits while the broker is made to crash (SIGABRT, sent from the host; a SIGSEGV sent by kill is caught by Rust's stack-overflow handler and ignored: inside it
//! cannot see or signal the broker, which the script checks too), then searches the
//! project (the broker's working directory, where `core_pattern = core` puts the file)
//! and everything else it can read for the key. The control: the same with
//! `CLAUDEBOX_TEST_DUMPABLE=1` (debug builds only) finds a core holding the key. Besides,
//! another host process of the same user (checked as an ordinary user) cannot read the broker's or the launcher's `/proc/<pid>/environ` or `mem`.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{run_with_key_cmd, setup_api_key, LIMIT, REAL_KEY};
use crate::BIN;
use lab::{agent, World};

/// What one dump attempt found.
#[derive(Debug, Default)]
pub(crate) struct Dumped {
    /// The agent read the key (in a core or anywhere else) after the crash.
    pub found_inside: bool,
    /// A core file was left in the project.
    pub core_in_project: bool,
    /// The agent saw or signalled the broker from inside.
    pub broker_reached_inside: bool,
    /// Another host process of the user read the broker's or the launcher's environ/mem.
    pub proc_readable: Vec<String>,
    /// The whole story, for the failure message.
    pub log: String,
}

/// The kernel writes `core` into the crashing process's working directory.
pub(crate) fn core_pattern_is_plain() -> bool {
    let pat = fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    let pat = pat.trim();
    !pat.is_empty() && !pat.starts_with('|') && !pat.contains('/')
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Host processes whose command line holds `marker` (the launcher, its keeper, bwrap, the
/// agent's shell) and the broker of this world (`--internal-proxy` with a path under
/// its home), with their `comm`.
fn find(marker: &str, home: &Path) -> (Vec<(i32, String)>, Option<i32>) {
    let home = home.as_os_str().as_encoded_bytes();
    let has = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    let mut mine = Vec::new();
    let mut broker = None;
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let comm = fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if has(&cmdline, b"--internal-proxy") && has(&cmdline, home) {
            broker = Some(pid);
        } else if has(&cmdline, marker.as_bytes()) {
            mine.push((pid, comm.trim().to_string()));
        }
    }
    (mine, broker)
}

/// Reads `/proc/<pid>/<what>` as another process of this user would. `Some(bytes)`
/// when readable; `None` too as root, where the question has no answer: every root
/// process may read every other (CAP_SYS_PTRACE), and one without capabilities may read
/// none, dumpable or not (its permitted set is not a superset of the target's); run as
/// an ordinary user (scripts/test does) to see it.
fn read_as_peer(pid: i32, what: &str) -> Option<Vec<u8>> {
    if nix::unistd::geteuid().is_root() {
        return None;
    }
    let path = format!("/proc/{pid}/{what}");
    // environ: all of it; mem: a readable page (the first of the stack is enough).
    let script = if what == "mem" {
        format!(
            "a=$(grep -m1 '\\[stack\\]' /proc/{pid}/maps | cut -d- -f1); \
             [ -n \"$a\" ] || exit 3; dd if={path} bs=4096 skip=$((0x$a / 4096)) count=1 \
             status=none | wc -c"
        )
    } else {
        format!("cat {path}")
    };
    let o = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    let ok = o.status.success() && !o.stdout.is_empty() && o.stdout != b"0\n";
    ok.then_some(o.stdout)
}

/// The inside half: waits for the host to say the broker's pid, tries to see and signal
/// it, waits for the crash, then searches for the key.
fn script(marker: &str) -> String {
    let (a, b) = REAL_KEY.split_at(REAL_KEY.len() / 2);
    format!(
        r#": {marker}
touch .dump-ready
i=0; while [ ! -s .dump-pid ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
pid=$(cat .dump-pid)
grep -ls claudebox-proxy /proc/[0-9]*/comm | sed 's/^/REACHED comm /'
[ -e /proc/$pid ] && echo "REACHED /proc/$pid"
kill -0 "$pid" 2>/dev/null && echo "REACHED kill -0 $pid"
kill -s ABRT "$pid" 2>/dev/null && echo "REACHED kill -ABRT $pid"
touch .dump-tried
i=0; while [ ! -e .dump-done ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
a='{a}'; n="$a"'{b}'
ls -la "$PWD" | sed 's/^/LS /'
for d in "$PWD" "$HOME" /tmp /run /var; do
  grep -rlsaF -- "$n" "$d" 2>/dev/null | sed 's/^/FOUND file /'
done
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
  grep -qsaF -- "$n" "$f" && echo "FOUND $f"
done
echo SEARCH-DONE"#
    )
}

/// Launches a sandbox (API-key user, none mode) whose agent runs [`script`], crashes its
/// broker from the host, and reports.
pub(crate) fn attempt(dumpable: bool) -> Dumped {
    let w = World::new(BIN);
    let (p, mock) = setup_api_key(&w, &serde_json::json!([]));
    let marker = format!(
        "dump-attempt-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ (p.as_os_str().len() as u128)
    );
    let script = script(&marker);
    let mut cmd = run_with_key_cmd(
        &w,
        &p,
        &mock,
        &[
            "--login-broker",
            "--network",
            "none",
            "--exec",
            "sh",
            "-c",
            &script,
        ],
    );
    if dumpable {
        // As before issue 34 too: the broker in the project, where its core then lands
        // (it runs in `/` now, where a core of an ordinary user's broker cannot be made).
        cmd.env("CLAUDEBOX_TEST_DUMPABLE", "1")
            .env("CLAUDEBOX_TEST_COMPANIONS_IN_CWD", "1");
    }
    // Cores allowed as far as the hard limit goes: the protection, not an inherited
    // `ulimit -c 0`, is what must stop them.
    // SAFETY: one system call between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            use nix::sys::resource::{getrlimit, setrlimit, Resource};
            let (_, hard) = getrlimit(Resource::RLIMIT_CORE)?;
            setrlimit(Resource::RLIMIT_CORE, hard, hard)?;
            Ok(())
        });
    }
    let run = std::thread::spawn(move || agent::output_within(&mut cmd, LIMIT));
    let mut d = Dumped::default();
    wait_for("the agent's start", LIMIT, || {
        p.join(".dump-ready").exists()
    });
    let mut broker = None;
    let mut mine = Vec::new();
    wait_for("the broker's pid", Duration::from_secs(10), || {
        (mine, broker) = find(&marker, &w.home());
        broker.is_some()
    });
    let broker = broker.unwrap();
    let launchers: Vec<i32> = (mine.iter())
        .filter(|(_, comm)| comm == "claudebox" || comm == "cbx-keeper")
        .map(|(pid, _)| *pid)
        .collect();
    d.log += &format!("broker {broker}, launcher and keeper {launchers:?}, all {mine:?}\n");
    assert!(!launchers.is_empty(), "no launcher found: {mine:?}");
    for pid in std::iter::once(broker).chain(launchers) {
        for what in ["environ", "mem"] {
            if let Some(got) = read_as_peer(pid, what) {
                let key = got
                    .windows(REAL_KEY.len())
                    .any(|w| w == REAL_KEY.as_bytes());
                let how = if what == "mem" {
                    "a page of its stack read".to_string()
                } else {
                    format!("the key in it: {key}")
                };
                d.log += &format!("/proc/{pid}/{what} readable ({how})\n");
                d.proc_readable.push(format!("/proc/{pid}/{what}"));
            }
        }
    }
    fs::write(p.join(".dump-pid"), broker.to_string()).unwrap();
    wait_for("the agent's try", Duration::from_secs(30), || {
        p.join(".dump-tried").exists()
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(broker),
        nix::sys::signal::Signal::SIGABRT,
    )
    .unwrap();
    // Dead (a zombie until bwrap reaps it): the core, if any, is written by then.
    wait_for("the broker's end", Duration::from_secs(30), || {
        fs::read_to_string(format!("/proc/{broker}/stat")).map_or(true, |s| {
            s.rsplit(')').next().unwrap_or("").trim().starts_with('Z')
        })
    });
    fs::write(p.join(".dump-done"), "").unwrap();
    let o = run.join().unwrap().unwrap();
    let out = lab::stdout(&o);
    d.log += &format!("inside:\n{out}\nstderr:\n{}\n", lab::stderr(&o));
    assert!(
        out.contains("SEARCH-DONE"),
        "the search did not run:\n{}",
        d.log
    );
    d.found_inside = out.contains("FOUND");
    d.broker_reached_inside = out.contains("REACHED");
    for e in fs::read_dir(&p).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("core") {
            d.core_in_project = true;
            let _ = fs::remove_file(e.path());
        }
    }
    d
}

#[test]
fn a_crashed_broker_leaves_no_core_and_its_memory_is_closed_to_the_user() {
    let _g = lab::heavy();
    let d = attempt(false);
    eprintln!("protected:\n{}", d.log);
    assert!(
        !d.found_inside && !d.core_in_project,
        "the key is readable after a crash:\n{}",
        d.log
    );
    assert!(
        !d.broker_reached_inside,
        "the broker is reachable inside:\n{}",
        d.log
    );
    assert!(
        d.proc_readable.is_empty(),
        "another process of the user reads {:?}:\n{}",
        d.proc_readable,
        d.log
    );
    // Control: dumpable, the same crash leaves a core holding the key in the project,
    // which the agent reads, and the same user reads the processes' environ and memory.
    if !core_pattern_is_plain() {
        eprintln!("control skipped: core_pattern is not a plain name (cores go elsewhere)");
        return;
    }
    let c = attempt(true);
    eprintln!("control:\n{}", c.log);
    assert!(
        c.core_in_project && c.found_inside,
        "control: no core holding the key:\n{}",
        c.log
    );
    assert!(
        nix::unistd::geteuid().is_root() || c.proc_readable.len() >= 4,
        "control: environ and mem not readable:\n{}",
        c.log
    );
}
