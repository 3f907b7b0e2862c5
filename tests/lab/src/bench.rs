//! What the benches share: reading numbers from the command line, installing the binary
//! as `cargo install` would, the launch's bwrap argv from `--dry-run`, quantiles and their
//! intervals, and the machine and its load, for the record.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Stops the bench. A panic, not an exit, so that the fixtures are removed on the way out.
pub fn die(msg: &str) -> ! {
    panic!("bench: {msg}")
}

/// A count given on the command line.
pub fn number(s: &OsStr) -> usize {
    s.to_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| die(&format!("not a number: {}", s.to_string_lossy())))
}

/// A copy of `bin` in `dir`, as `cargo install` makes one (a file the linker has just
/// written starts slower than any installed copy).
pub fn install(bin: &Path, dir: &Path) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let dst = dir.join("claudebox");
    fs::copy(bin, &dst).unwrap_or_else(|e| die(&format!("cannot copy {}: {e}", bin.display())));
    dst
}

/// The bwrap argv claudebox prints for a launch: the last line of `--dry-run`, split into
/// words by `sh` itself (the dry-run contract is that `sh` runs that line as the launch).
/// Done once, outside any timing.
pub fn argv_from_dry_run(dry_run_stdout: &[u8]) -> Vec<OsString> {
    let line = dry_run_stdout
        .split(|b| *b == b'\n')
        .rfind(|l| !l.is_empty())
        .unwrap_or_else(|| die("--dry-run printed nothing"));
    let mut script = b"printf '%s\\0' ".to_vec();
    script.extend_from_slice(line);
    let out = Command::new("sh")
        .arg("-c")
        .arg(OsString::from_vec(script))
        .output()
        .unwrap_or_else(|e| die(&format!("cannot run sh: {e}")));
    if !out.status.success() {
        die(&format!(
            "sh could not split the --dry-run command line: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut words: Vec<OsString> = out
        .stdout
        .split(|b| *b == 0)
        .map(|w| OsString::from_vec(w.to_vec()))
        .collect();
    words.pop(); // after the last NUL
    words
}

/// The load averages (1, 5, 15 minutes), for the record.
pub fn load() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The 1-minute load average, as a number (NaN when unreadable).
pub fn load1() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// The `q` quantile of `v` (0..=1), linear between the two nearest ranks.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut t = v.to_vec();
    t.sort_by(f64::total_cmp);
    if t.is_empty() {
        return f64::NAN;
    }
    let x = q.clamp(0.0, 1.0) * (t.len() - 1) as f64;
    let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
    t[lo] + (t[hi] - t[lo]) * (x - lo as f64)
}

/// A 95% interval of the median of `v` by the bootstrap (2,000 resamples, a fixed seed so
/// that a run's output can be reproduced from its samples): whether a difference of
/// medians is resolved at all, given the spread.
pub fn median_ci95(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut medians: Vec<f64> = (0..2000)
        .map(|_| {
            let sample: Vec<f64> = (0..v.len())
                .map(|_| v[(next() % v.len() as u64) as usize])
                .collect();
            quantile(&sample, 0.5)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (quantile(&medians, 0.025), quantile(&medians, 0.975))
}

/// The machine, for the record: cpus, CPU model, memory, kernel, bwrap version.
pub fn machine(bwrap: &Path) -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "?".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let version = Command::new(bwrap)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!(
        "{cpus} cpus ({model}), {mem_gib:.0} GiB, kernel {}, {version}",
        kernel.trim()
    )
}
