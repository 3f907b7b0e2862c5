//! `cargo bench --bench list`: `--list`, `--list --sizes` and `--gc --dry-run` over a state
//! of N projects shaped as real launches make them. One real launch of the Claude Code in
//! `CLAUDEBOX_TEST_CLAUDE` (`claude -p hi` in claudebox, against the lab's mock API,
//! tests/lab/mock_api.py) makes one project's state (~40 entries: claude's own
//! `~/.claude` files, the transcript, the lock, the slot...); it is copied N times, each
//! copy with its own `project-root` (half still existing, half gone). Without
//! `CLAUDEBOX_TEST_CLAUDE` the bench says so and stops. Cases run interleaved, and with
//! `--compare` another build runs in the same rounds. Prints min / median / p90 / spread
//! (p90 - min) per case, the user it ran as, and the load.
//!
//! Options (after `cargo bench --bench list --`):
//!   --bin PATH      the claudebox binary to measure (default: the one cargo just built)
//!   --compare PATH  another claudebox build, measured in the same rounds
//!   --runs N        runs of each case (default 10)
//!   --projects N    project directories (default 10000)
//!   --keep          keep the state made (its path is printed), e.g. for a profiler

// A bench: a panic on an unexpected None or Err is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lab::agent::{MockApi, API_KEY};
use lab::bench::{die, install, load, number};

struct Opts {
    bin: PathBuf,
    compare: Option<PathBuf>,
    runs: usize,
    projects: usize,
    keep: bool,
}

fn opts() -> Opts {
    let mut o = Opts {
        bin: PathBuf::from(env!("CARGO_BIN_EXE_claudebox")),
        compare: None,
        runs: 10,
        projects: 10_000,
        keep: false,
    };
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| die("missing value"));
        match a.to_str() {
            Some("--bin") => o.bin = value().into(),
            Some("--compare") => o.compare = Some(value().into()),
            Some("--runs") => o.runs = number(&value()).max(1),
            Some("--projects") => o.projects = number(&value()),
            Some("--keep") => o.keep = true,
            Some("--bench") => {}
            _ => die(&format!("unknown option {}", a.to_string_lossy())),
        }
    }
    o
}

/// One project's state made by a real launch of the real Claude Code against the mock.
fn real_state(root: &Path, bin: &Path, claude: &Path) -> PathBuf {
    let (home, bins, proj) = (root.join("home"), root.join("bin"), root.join("proj"));
    for d in [&home, &bins, &proj] {
        fs::create_dir_all(d).unwrap();
    }
    symlink(claude, bins.join("claude")).unwrap();
    let git = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&proj)
        .status();
    assert!(git.is_ok_and(|s| s.success()), "git init");
    let tail = &API_KEY[API_KEY.len() - 20..];
    let seed = format!(
        r#"{{"hasCompletedOnboarding":true,"lastOnboardingVersion":"2.1.330","theme":"dark",
        "customApiKeyResponses":{{"approved":["{tail}"],"rejected":[]}},
        "hasSeenAutoDefaultNotice":true,
        "projects":{{"{}":{{"hasTrustDialogAccepted":true}}}}}}"#,
        proj.display()
    );
    fs::write(home.join(".claude.json"), seed).unwrap();
    let mock = MockApi::start(&serde_json::json!(["hello from the mock"]));
    let mut path = bins.into_os_string();
    path.push(":/usr/local/bin:/usr/bin:/bin");
    let mut launch = Command::new(bin);
    launch
        .args(["-p", "hi"])
        .current_dir(&proj)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", path)
        .stdin(Stdio::null());
    let out = mock.point(&mut launch).output().unwrap();
    drop(mock);
    if !out.status.success() || !String::from_utf8_lossy(&out.stdout).contains("hello") {
        die(&format!(
            "the real launch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let projects = home.join(".claudebox/projects");
    let mut dirs = fs::read_dir(&projects).unwrap().flatten();
    let state = dirs.next().unwrap().path();
    assert!(dirs.next().is_none());
    state
}

/// Copies a tree (files, directories, symlinks), keeping modes and files' times.
fn copy_tree(from: &Path, to: &Path) -> usize {
    let mut n = 0;
    fs::create_dir(to).unwrap();
    for e in fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type().unwrap();
        if t.is_dir() {
            n += copy_tree(&src, &dst);
        } else if t.is_symlink() {
            symlink(fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if t.is_file() {
            fs::copy(&src, &dst).unwrap();
            // Its times too, as `cp -a` keeps them: the copy is the state that launch left
            // (`lock`'s time is the one its `list-summary.json` recorded).
            let mtime = fs::symlink_metadata(&src).unwrap().modified().unwrap();
            let f = fs::File::open(&dst).unwrap();
            f.set_modified(mtime).unwrap();
        }
        n += 1;
    }
    let mode = fs::metadata(from).unwrap().permissions().mode();
    fs::set_permissions(to, fs::Permissions::from_mode(mode)).unwrap();
    n
}

struct Case {
    name: String,
    bin: PathBuf,
    args: Vec<&'static str>,
    times: Vec<Duration>,
    /// CPU time (user + system) of each run: less moved by other work on the machine
    /// than the wall time, which waits for the cores.
    cpu: Vec<Duration>,
}

fn main() {
    let o = opts();
    let Some(claude) = std::env::var_os("CLAUDEBOX_TEST_CLAUDE").filter(|c| !c.is_empty()) else {
        println!(
            "list bench: set CLAUDEBOX_TEST_CLAUDE to a Claude Code binary (scripts/test \
             installs one): the projects are copies of one real launch's state"
        );
        return;
    };
    let tmp = tempfile::Builder::new()
        .prefix("claudebox-list-bench-")
        .tempdir()
        .unwrap();
    let root = fs::canonicalize(tmp.path()).unwrap();
    let bin = install(&fs::canonicalize(&o.bin).unwrap(), &root.join("installed"));
    let compare = o
        .compare
        .as_deref()
        .map(|c| install(c, &root.join("installed-compared")));
    eprintln!("list bench: one real launch...");
    let one = real_state(&root.join("real"), &bin, Path::new(&claude));
    eprintln!("list bench: {} copies of its state...", o.projects);
    let home = root.join("state");
    let projects = home.join("projects");
    fs::create_dir_all(&projects).unwrap();
    let mut entries = 0;
    for i in 0..o.projects {
        let exists = i % 2 == 0;
        let work = root
            .join(if exists { "roots" } else { "gone" })
            .join(format!("p{i:05}"));
        let common = work.join(".git");
        if exists {
            fs::create_dir_all(&common).unwrap();
        }
        let dir = projects.join(claudebox::policy::facts::project_id(&common));
        entries += copy_tree(&one, &dir);
        fs::write(dir.join("project-root"), common.as_os_str().as_bytes()).unwrap();
    }
    let user = String::from_utf8_lossy(
        &Command::new("id")
            .arg("-un")
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default(),
    )
    .trim()
    .to_string();
    println!("claudebox list benchmark");
    println!(
        "state: {} projects, {} entries ({} per project, from one real launch of {})",
        o.projects,
        entries,
        entries / o.projects.max(1),
        Path::new(&claude).display()
    );
    println!("user: {user}; load average at start: {}", load());
    let mut cases = Vec::new();
    for (label, b) in std::iter::once(("", &bin)).chain(compare.iter().map(|c| ("compared: ", c))) {
        for args in [
            vec!["--list"],
            vec!["--list", "--sizes"],
            vec!["--gc", "--dry-run"],
        ] {
            cases.push(Case {
                name: format!("{label}claudebox {}", args.join(" ")),
                bin: b.clone(),
                args,
                times: Vec::new(),
                cpu: Vec::new(),
            });
        }
    }
    for _ in 0..o.runs {
        for c in &mut cases {
            let mut cmd = Command::new(&c.bin);
            cmd.args(&c.args)
                .current_dir(&root)
                .env_clear()
                .env("HOME", root.join("real/home"))
                .env("CLAUDEBOX_HOME", &home)
                .env("PATH", "/usr/bin:/bin")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let before = children_cpu();
            let t = Instant::now();
            let st = cmd.status();
            let dt = t.elapsed();
            let cpu = children_cpu().saturating_sub(before);
            match st {
                Ok(s) if s.success() => {
                    c.times.push(dt);
                    c.cpu.push(cpu);
                }
                // An older build without --sizes: not measured.
                _ => {
                    c.times.clear();
                    c.cpu.clear();
                }
            }
        }
    }
    println!();
    println!(
        "{:<52} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "case (wall time per run, ms; cpu: user + system)",
        "runs",
        "min",
        "median",
        "p90",
        "spread",
        "cpu med"
    );
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
    for c in &mut cases {
        if c.times.is_empty() {
            println!("{:<52} not available in this build", c.name);
            continue;
        }
        c.times.sort();
        c.cpu.sort();
        let n = c.times.len();
        let (min, med, p90) = (c.times[0], c.times[n / 2], c.times[(n * 9 / 10).min(n - 1)]);
        println!(
            "{:<52} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}",
            c.name,
            n,
            ms(min),
            ms(med),
            ms(p90),
            ms(p90.checked_sub(min).unwrap()),
            ms(c.cpu[n / 2])
        );
    }
    println!("load average at end: {}", load());
    if o.keep {
        let kept = tmp.keep();
        println!(
            "state kept: CLAUDEBOX_HOME={} HOME={}",
            kept.join("state").display(),
            kept.join("real/home").display()
        );
    }
}

/// User + system time of this process's waited-for children so far.
fn children_cpu() -> Duration {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, (t.tv_usec() * 1000) as u32);
    tv(u.user_time()) + tv(u.system_time())
}
