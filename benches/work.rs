//! `cargo bench --bench work`: the work agents do, timed bare and inside: `npm ci` from a
//! warm cache, `git checkout` between two commits of 5,000 files each, `git add -A &&
//! commit` of 2,000 new files, a file-making loop (made, then removed) in the project and
//! in `/tmp`, 1/2/4/8 processes making files at once, and a small `cargo build`
//! (offline). Cases: bare, claudebox, claudebox without the file supervisor
//! (`--writable-project-config`), and bwrap alone with the argv claudebox prints for
//! `--dry-run`. Each round runs every case of a workload in a rotating order; a ratio is
//! taken against bare in the same round, and the median of the rounds is printed with
//! the smallest and largest and the load average.
//!
//! Runs offline: the caches (an npm cache and package-lock, the checkout repository, a
//! cargo home with the crates fetched) are filled once into `--cache DIR` (default
//! `$HOME/.cache/claudebox-bench-work`; the npm registry and crates.io are asked then
//! only). On a disk other programs write to, the file-making workloads measure the disk's
//! queue more than anything: a cache on a tmpfs (`--cache /dev/shm/...`) measures the
//! calls. Each timed part is timed inside the case (`date +%s%N` or Python's clock), so
//! the launch itself is not in it.
//!
//! Options (after `cargo bench --bench work --`):
//!   --bin PATH     the claudebox binary (default: the one cargo just built)
//!   --compare PATH another claudebox build, one more case in the same rounds
//!   --cache DIR    where the caches and the project live (filled on first use)
//!   --rounds N     interleaved rounds (default 5; --quick: 3)
//!   --quick        smaller loops (5,000 files, writers 1,000 each), no cargo build
//!   --only A,B     only these workloads (npm, checkout, commit, loop, tmp, w1, w2, w4,
//!                  w8, cargo)

// A bench: a panic on an unexpected None or Err is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use lab::bench::{argv_from_dry_run, die, install, load, machine, number, quantile};

struct Opts {
    bin: PathBuf,
    compare: Option<PathBuf>,
    cache: PathBuf,
    rounds: usize,
    quick: bool,
    only: Option<Vec<String>>,
}

impl Opts {
    fn parse() -> Opts {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        let mut o = Opts {
            bin: PathBuf::from(env!("CARGO_BIN_EXE_claudebox")),
            compare: None,
            cache: home.join(".cache/claudebox-bench-work"),
            rounds: 0,
            quick: false,
            only: None,
        };
        let mut args = std::env::args_os().skip(1);
        while let Some(a) = args.next() {
            let mut value = || {
                args.next()
                    .unwrap_or_else(|| die(&format!("{} needs a value", a.to_string_lossy())))
            };
            match a.to_str() {
                Some("--bin") => o.bin = PathBuf::from(value()),
                Some("--compare") => o.compare = Some(PathBuf::from(value())),
                Some("--cache") => o.cache = PathBuf::from(value()),
                Some("--rounds") => o.rounds = number(&value()),
                Some("--quick") => o.quick = true,
                Some("--only") => {
                    o.only = Some(
                        value()
                            .to_string_lossy()
                            .split(',')
                            .map(str::to_string)
                            .collect(),
                    );
                }
                // cargo bench passes --bench; a filter may follow. Neither applies here.
                _ => {}
            }
        }
        if o.rounds == 0 {
            o.rounds = if o.quick { 3 } else { 5 };
        }
        o
    }
}

fn sh(cwd: &Path, script: &str, what: &str) {
    let st = Command::new("sh")
        .args(["-ec", script])
        .current_dir(cwd)
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| die(&format!("{what}: {e}")));
    if !st.success() {
        die(&format!("{what} failed ({st})"));
    }
}

/// The project (a git repository) and the caches in it, filled once.
fn prepare(cache: &Path) -> PathBuf {
    let p = cache.join("project");
    let bench = p.join(".bench");
    fs::create_dir_all(&bench).unwrap();
    if !p.join(".git").exists() {
        sh(
            &p,
            "git init -q -b main && printf '.bench/\\n' >.gitignore && echo bench >README && \
             git add -A && git -c user.name=B -c user.email=b@example.com commit -qm init",
            "the project's git init",
        );
    }
    // The scripts are one line each (--dry-run prints the argv on one line): Python's
    // parts are files.
    fs::write(bench.join("writers.py"), WRITERS).unwrap();
    fs::write(
        bench.join("make.py"),
        "import os, sys\nos.makedirs(sys.argv[1], exist_ok=True)\n\
         for i in range(int(sys.argv[2])):\n    \
         with open(f\"{sys.argv[1]}/f{i}.txt\", \"w\") as f: f.write(str(i))\n",
    )
    .unwrap();
    let npm = bench.join("npm");
    if !npm.join("package-lock.json").exists() {
        eprintln!("work bench: filling the npm cache once (registry.npmjs.org)...");
        fs::create_dir_all(&npm).unwrap();
        fs::write(
            npm.join("package.json"),
            r#"{"name":"bench","version":"1.0.0","private":true,
"dependencies":{"express":"4.21.2","eslint":"8.57.1","typescript":"5.6.3",
"lodash":"4.17.21","chalk":"4.1.2","commander":"12.1.0","yargs":"17.7.2","axios":"1.7.9"}}"#,
        )
        .unwrap();
        sh(
            &npm,
            "npm install --cache ../npm-cache --no-audit --no-fund --ignore-scripts \
             --loglevel=error && rm -rf node_modules && npm ci --cache ../npm-cache \
             --no-audit --no-fund --ignore-scripts --loglevel=error && rm -rf node_modules",
            "npm install (filling the cache)",
        );
    }
    let co = bench.join("co");
    if !co.join(".git").exists() {
        eprintln!("work bench: making the checkout repository (2 x 5,000 files)...");
        fs::create_dir_all(&co).unwrap();
        sh(&co, "git init -q -b main", "git init");
        let mut s = String::new();
        let blob = |s: &mut String, text: &str| {
            let _ = write!(s, "data {}\n{text}\n", text.len());
        };
        for (name, from) in [("a", None), ("b", Some("a"))] {
            let _ = writeln!(s, "commit refs/heads/{name}");
            let _ = writeln!(s, "committer B <b@example.com> 1700000000 +0000");
            blob(&mut s, name);
            if let Some(f) = from {
                let _ = writeln!(s, "from refs/heads/{f}");
                let _ = writeln!(s, "deleteall");
            }
            for i in 0..5000 {
                let _ = writeln!(s, "M 644 inline src/{name}{}/f{i}.txt", i % 50);
                blob(&mut s, &format!("{name} {i}\n"));
            }
        }
        let mut child = Command::new("git")
            .args(["fast-import", "--quiet"])
            .current_dir(&co)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "git fast-import");
        sh(&co, "git checkout -qf a", "git checkout a");
    }
    let crate_dir = bench.join("crate");
    if !crate_dir.join("Cargo.lock").exists() {
        if let Some(cargo) = cargo() {
            eprintln!("work bench: fetching the cargo build's crates once (crates.io)...");
            fs::create_dir_all(crate_dir.join("src")).unwrap();
            fs::write(
                crate_dir.join("Cargo.toml"),
                "[package]\nname = \"bench\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
                 [dependencies]\nserde_json = \"1\"\nregex = \"1\"\n",
            )
            .unwrap();
            fs::write(
                crate_dir.join("src/main.rs"),
                "fn main() { let r = regex::Regex::new(\"a+\").unwrap(); \
                 println!(\"{}\", serde_json::json!({\"m\": r.is_match(\"aa\")})); }\n",
            )
            .unwrap();
            let st = Command::new(&cargo)
                .arg("fetch")
                .current_dir(&crate_dir)
                .env("CARGO_HOME", bench.join("cargo-home"))
                .status()
                .unwrap();
            if !st.success() {
                die("cargo fetch failed");
            }
        }
    }
    p
}

/// The cargo of the toolchain (its directory goes on PATH for the build), when there is one.
fn cargo() -> Option<PathBuf> {
    let o = Command::new("rustup")
        .args(["which", "cargo"])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    p.is_file().then_some(p)
}

/// Python making `n` files in DIR (and removing them) at once in `procs` processes,
/// printing the elapsed nanoseconds; the files are opened O_CREAT as `open(2)` would.
const WRITERS: &str = r#"
import os, sys, time
d, procs, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d, exist_ok=True)
t0 = time.monotonic_ns()
kids = []
for p in range(procs):
    pid = os.fork()
    if pid == 0:
        sub = os.path.join(d, str(p))
        os.mkdir(sub)
        for i in range(n):
            os.close(os.open(f"{sub}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644))
        for i in range(n):
            os.unlink(f"{sub}/f{i}")
        os.rmdir(sub)
        os._exit(0)
    kids.append(pid)
ok = all(os.waitpid(k, 0)[1] == 0 for k in kids)
t1 = time.monotonic_ns()
os.rmdir(d)
if ok:
    print("T", t1 - t0)
"#;

/// One workload: its key, what it is, its script (run by `sh -ec` in the project, printing
/// `T <nanoseconds>` for the timed part) and the names it makes (for a throughput).
struct Work {
    key: &'static str,
    name: String,
    script: String,
    names: usize,
    /// claudebox's own arguments for it (the toolchain bound read-only for cargo).
    extra: Vec<String>,
}

fn workloads(o: &Opts, cargo: Option<&Path>) -> Vec<Work> {
    let (loop_n, per_writer) = if o.quick {
        (5000, 1000)
    } else {
        (20_000, 5000)
    };
    let py = "/usr/bin/python3";
    let writers = |n: usize, key: &'static str| Work {
        key,
        name: format!("{n} process(es) x {per_writer} files at once"),
        script: format!("{py} .bench/writers.py .bench/w-$$ {n} {per_writer}"),
        names: n * per_writer,
        extra: Vec::new(),
    };
    let mut v = vec![
        Work {
            key: "npm",
            name: "npm ci, warm cache, --offline".into(),
            script: "cd .bench/npm && rm -rf node_modules && t0=$(date +%s%N) && \
                     npm ci --offline --cache \"$PWD/../npm-cache\" --no-audit --no-fund \
                     --ignore-scripts --loglevel=error >/dev/null && t1=$(date +%s%N) && \
                     rm -rf node_modules && echo T $((t1 - t0))"
                .into(),
            names: 0,
            extra: Vec::new(),
        },
        Work {
            key: "checkout",
            name: "git checkout a->b->a, 2 x 5,000 files".into(),
            script: "cd .bench/co && git checkout -qf a && t0=$(date +%s%N) && \
                     git checkout -q b && git checkout -q a && t1=$(date +%s%N) && \
                     echo T $((t1 - t0))"
                .into(),
            names: 10_000,
            extra: Vec::new(),
        },
        Work {
            key: "commit",
            name: "git add -A && commit, 2,000 new files".into(),
            script: format!(
                "export GIT_AUTHOR_NAME=B GIT_AUTHOR_EMAIL=b@example.com \
                 GIT_COMMITTER_NAME=B GIT_COMMITTER_EMAIL=b@example.com; \
                 {py} .bench/make.py added 2000 && \
                 t0=$(date +%s%N) && git add -A && git commit -qm bench && \
                 t1=$(date +%s%N) && git reset -q --hard HEAD~1 && echo T $((t1 - t0))"
            ),
            names: 2000,
            extra: Vec::new(),
        },
        Work {
            key: "loop",
            name: format!("{loop_n} files made, then removed, in the project"),
            script: format!("{py} .bench/writers.py .bench/loop-$$ 1 {loop_n}"),
            names: loop_n,
            extra: Vec::new(),
        },
        Work {
            key: "tmp",
            name: format!("{loop_n} files made, then removed, in /tmp"),
            script: format!("{py} .bench/writers.py /tmp/claudebox-work-$$ 1 {loop_n}"),
            names: loop_n,
            extra: Vec::new(),
        },
        writers(1, "w1"),
        writers(2, "w2"),
        writers(4, "w4"),
        writers(8, "w8"),
    ];
    if let (Some(cargo), false) = (cargo, o.quick) {
        let bin = cargo.parent().unwrap().display().to_string();
        // The toolchain (under rustup's home, out of the sandbox's view) bound read-only.
        let toolchain = cargo.parent().unwrap().parent().unwrap();
        v.push(Work {
            key: "cargo",
            name: "cargo build --offline (serde_json, regex)".into(),
            script: format!(
                "cd .bench/crate && export PATH=\"{bin}:$PATH\" CARGO_HOME=\"$PWD/../cargo-home\" \
                 && rm -rf /tmp/cbw-target-$$ && t0=$(date +%s%N) && \
                 cargo build -q --offline --target-dir /tmp/cbw-target-$$ && \
                 t1=$(date +%s%N) && rm -rf /tmp/cbw-target-$$ && echo T $((t1 - t0))"
            ),
            names: 0,
            extra: vec!["--ro".into(), toolchain.display().to_string()],
        });
    }
    if let Some(only) = &o.only {
        v.retain(|w| only.iter().any(|k| k == w.key));
    }
    v
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Bare,
    Claudebox,
    NoSupervisor,
    Bwrap,
    Compared,
}

struct Env {
    bin: PathBuf,
    compare: Option<PathBuf>,
    home: PathBuf,
    project: PathBuf,
}

impl Env {
    fn cmd(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        c.current_dir(&self.project)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .stdout(Stdio::piped());
        c
    }

    fn claudebox(&self, extra: &[&str], script: &str) -> Command {
        self.claudebox_of(&self.bin, extra, script)
    }

    fn claudebox_of(&self, bin: &Path, extra: &[&str], script: &str) -> Command {
        let mut c = self.cmd(bin);
        c.args(extra).args(["--exec", "sh", "-ec", script]);
        c
    }

    /// bwrap's argv for `script` as claudebox prints it for `--dry-run`.
    fn bwrap_argv(&self, w: &Work) -> Vec<OsString> {
        let mut args = vec!["--dry-run"];
        args.extend(w.extra.iter().map(String::as_str));
        let o = self
            .claudebox(&args, &w.script)
            .output()
            .unwrap_or_else(|e| die(&format!("claudebox --dry-run: {e}")));
        if !o.status.success() {
            die(&format!(
                "claudebox --dry-run failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        argv_from_dry_run(&o.stdout)
    }
}

/// Runs `c`, returning the seconds its script timed (None: it failed; its stderr is shown).
fn timed(mut c: Command, what: &str) -> Option<f64> {
    let o = c.output().unwrap_or_else(|e| die(&format!("{what}: {e}")));
    let out = String::from_utf8_lossy(&o.stdout);
    let t = out
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("T "))
        .and_then(|n| n.trim().parse::<f64>().ok());
    if !o.status.success() || t.is_none() {
        eprintln!(
            "work bench: {what} failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        );
        return None;
    }
    t.map(|ns| ns / 1e9)
}

fn main() {
    let o = Opts::parse();
    let cache = {
        fs::create_dir_all(&o.cache).unwrap();
        fs::canonicalize(&o.cache).unwrap()
    };
    let project = prepare(&cache);
    let home = cache.join("home");
    fs::create_dir_all(home.join(".claude")).unwrap();
    let bin = install(&fs::canonicalize(&o.bin).unwrap(), &cache.join("installed"));
    let compare = o.compare.as_ref().map(|c| {
        let dir = cache.join("installed-compared");
        install(&fs::canonicalize(c).unwrap(), &dir)
    });
    let env = Env {
        bin,
        compare,
        home,
        project,
    };
    let cargo = cargo();
    let works = workloads(&o, cargo.as_deref());
    println!("claudebox work benchmark");
    println!("binary: {}", o.bin.display());
    if let Some(c) = &o.compare {
        println!("compared with: {}", c.display());
    }
    let mut kinds = vec![
        (Kind::Bare, "bare"),
        (Kind::Claudebox, "claudebox"),
        (Kind::NoSupervisor, "no supervisor"),
        (Kind::Bwrap, "bwrap, same argv"),
    ];
    if o.compare.is_some() {
        kinds.push((Kind::Compared, "compared build"));
    }
    let kinds = kinds;
    println!("project and caches: {}", cache.display());
    // One launch first: the project's state, which bwrap alone binds, must exist.
    let _ = timed(env.claudebox(&[], "echo T 0"), "a first launch");
    let argvs: Vec<Vec<OsString>> = works.iter().map(|w| env.bwrap_argv(w)).collect();
    println!("machine: {}", machine(Path::new(&argvs[0][0])));
    println!(
        "user: {}, rounds: {}{}",
        nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .map_or_else(|| "?".into(), |u| u.name),
        o.rounds,
        if o.quick { " (--quick)" } else { "" }
    );
    let load_start = load();
    println!("load average at start: {load_start}");
    // times[work][kind] = seconds per round
    let mut times: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); kinds.len()]; works.len()];
    for round in 0..o.rounds {
        eprintln!(
            "work bench: round {} of {} (load {})",
            round + 1,
            o.rounds,
            load()
        );
        for (wi, w) in works.iter().enumerate() {
            for j in 0..kinds.len() {
                let (kind, kname) = kinds[(round + j) % kinds.len()];
                let ki = kinds.iter().position(|k| k.0 == kind).unwrap();
                let extra: Vec<&str> = w.extra.iter().map(String::as_str).collect();
                let c = match kind {
                    Kind::Bare => {
                        let mut c = env.cmd(Path::new("/bin/sh"));
                        c.args(["-ec", &w.script]);
                        c
                    }
                    Kind::Claudebox => env.claudebox(&extra, &w.script),
                    Kind::NoSupervisor => {
                        let mut a = vec!["--writable-project-config"];
                        a.extend(&extra);
                        env.claudebox(&a, &w.script)
                    }
                    Kind::Compared => {
                        env.claudebox_of(env.compare.as_deref().unwrap(), &extra, &w.script)
                    }
                    Kind::Bwrap => {
                        let mut c = env.cmd(Path::new(&argvs[wi][0]));
                        c.args(&argvs[wi][1..]);
                        c
                    }
                };
                if let Some(t) = timed(c, &format!("{} ({kname})", w.name)) {
                    times[wi][ki].push(t);
                }
            }
        }
    }
    println!("load average at end: {}", load());
    println!();
    let mut head = format!(
        "{:<46} {:>9}",
        "work (ratio to bare in the same round:", "bare s"
    );
    for (_, k) in kinds.iter().skip(1) {
        let _ = write!(head, " {k:>22}");
    }
    println!("{head}");
    println!("{:<46}", "median of rounds [min..max])");
    for (wi, w) in works.iter().enumerate() {
        let bare = &times[wi][0];
        let mut line = format!("{:<46} {:>9.3}", w.name, quantile(bare, 0.5));
        for (ki, _) in kinds.iter().enumerate().skip(1) {
            let t = &times[wi][ki];
            let ratios: Vec<f64> = t.iter().zip(bare).map(|(a, b)| a / b).collect();
            if ratios.is_empty() {
                let _ = write!(line, " {:>22}", "failed");
                continue;
            }
            let _ = write!(
                line,
                " {:>22}",
                format!(
                    "{:.2}x [{:.2}..{:.2}]",
                    quantile(&ratios, 0.5),
                    quantile(&ratios, 0.0),
                    quantile(&ratios, 1.0)
                )
            );
        }
        println!("{line}");
    }
    let throughput: Vec<&Work> = works.iter().filter(|w| w.key.starts_with('w')).collect();
    if !throughput.is_empty() {
        println!();
        println!("names made per second (median of rounds):");
        let mut head = format!("{:<46}", "");
        for (i, (_, k)) in kinds.iter().enumerate() {
            let _ = write!(head, " {k:>w$}", w = if i == 0 { 9 } else { 22 });
        }
        println!("{head}");
        for w in throughput {
            let wi = works.iter().position(|x| x.key == w.key).unwrap();
            let mut line = format!("{:<46}", w.name);
            for (ki, t) in times[wi].iter().enumerate() {
                let v = if t.is_empty() {
                    "-".to_string()
                } else {
                    format!("{:.0}", w.names as f64 / quantile(t, 0.5))
                };
                let _ = write!(line, " {:>width$}", v, width = if ki == 0 { 9 } else { 22 });
            }
            println!("{line}");
        }
    }
}
