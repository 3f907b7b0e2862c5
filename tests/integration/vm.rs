//! The VM tests' one scaffold: run a script of tests/vm/ (it boots a kernel in qemu with the
//! claudebox under test, tests/vm/lib.sh) and read the guest's `RESULT <step> <what> <value>`
//! console lines. Not a test module: limits.rs and apparmor.rs assert on its [`Results`].

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::BIN;
use lab::{stderr, stdout};

/// The console of one VM run, its results parsed.
pub struct Results {
    console: String,
    stderr: String,
    rows: Vec<(String, String, String)>,
}

/// Whether the VM tests can run here: root (the image is made by root; the checks inside
/// run as uid 1000), amd64, qemu and each tool of `needs` (name, Debian package) on PATH.
/// Says why not on stderr (a skip); a missing tool in CI fails the test instead.
pub fn available(needs: &[(&str, &str)]) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIP as non-root: the VM image is made by root (the checks inside run as uid 1000)"
        );
        return false;
    }
    if !cfg!(target_arch = "x86_64") {
        eprintln!("SKIP: the VM test boots an amd64 kernel");
        return false;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    for (tool, package) in [("qemu-system-x86_64", "qemu-system-x86")]
        .iter()
        .chain(needs)
    {
        if which::which(tool).is_err() {
            assert!(!ci, "{tool} is missing in CI (apt install {package})");
            eprintln!("SKIP: no {tool} (apt install {package})");
            return false;
        }
    }
    true
}

/// Runs `tests/vm/SCRIPT BIN` and returns its results; `None` when the test is skipped
/// ([`available`] says no, or the script exits 75: what the VM needs could not be
/// fetched, which says nothing about claudebox).
///
/// Not under `lab::heavy()`: the guest keeps its own clock (tests/vm/lib.sh boots it
/// with -icount, so its sleeps and timeouts count its own instructions, however little
/// CPU qemu gets) and qemu runs at the idle scheduling class, taking only CPU time nothing
/// else wants. So the VM neither slows the time-bound tests beside it nor is disturbed by
/// them, and its minutes are not added to the chain of heavy tests.
pub fn run(script: &str) -> Option<Results> {
    if !available(&[]) {
        return None;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vm")
        .join(script);
    let out: Output = Command::new("bash")
        .arg(&path)
        .arg(BIN)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if out.status.code() == Some(75) {
        eprintln!(
            "SKIP: tests/vm/{script} could not fetch what the VM needs:\n{}",
            stderr(&out)
        );
        return None;
    }
    let r = Results::parse(stdout(&out), stderr(&out));
    eprintln!(
        "{}",
        r.console
            .lines()
            .filter(|l| l.contains("RESULT "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Some(r)
}

impl Results {
    fn parse(console: String, stderr: String) -> Results {
        let rows = console
            .lines()
            .filter_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
            .map(|r| {
                let mut it = r.splitn(3, ' ');
                let step = it.next().unwrap_or("").to_string();
                let what = it.next().unwrap_or("").to_string();
                (step, what, it.next().unwrap_or("").trim_end().to_string())
            })
            .collect();
        Results {
            console,
            stderr,
            rows,
        }
    }

    /// The whole console (for an assertion's message).
    pub fn console(&self) -> &str {
        &self.console
    }

    /// Every value of `RESULT step what`, in order.
    pub fn all(&self, step: &str, what: &str) -> Vec<&str> {
        self.rows
            .iter()
            .filter(|(s, w, _)| s == step && w == what)
            .map(|(_, _, v)| v.as_str())
            .collect()
    }

    /// Every (what, value) of a step, in order.
    pub fn step(&self, step: &str) -> Vec<(&str, &str)> {
        self.rows
            .iter()
            .filter(|(s, _, _)| s == step)
            .map(|(_, w, v)| (w.as_str(), v.as_str()))
            .collect()
    }

    /// The first value of `RESULT step what`; its absence fails the test, showing the console.
    pub fn one(&self, step: &str, what: &str) -> String {
        self.all(step, what)
            .first()
            .map(|v| v.to_string())
            .unwrap_or_else(|| {
                panic!(
                    "no RESULT {step} {what} in the console:\n{}\n{}",
                    self.console, self.stderr
                )
            })
    }

    /// [`Results::one`] as a number.
    pub fn num(&self, step: &str, what: &str) -> u64 {
        self.one(step, what)
            .parse()
            .unwrap_or_else(|_| panic!("RESULT {step} {what} is not a number:\n{}", self.console))
    }
}
