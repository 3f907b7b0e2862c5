//! Resource limits of a sandbox as a whole (`--memory`, `--pids`, `--cpu`, the same keys
//! in the config file): their spelling, the default process limit, which mechanism applies
//! them (the user's systemd manager or a delegated cgroup v2 subtree, found by
//! `host::limits`), what a launch does when it cannot (a requested limit refuses, the
//! default warns), `--dry-run`'s and `--check`'s lines, and the line after a sandbox a
//! limit ended. Pure: the host's facts come in as [`Support`].

use std::fmt;
use std::path::PathBuf;

use crate::policy::error::Fixable;
use crate::policy::origin::Origin;

/// The default process limit (tasks: the kernel's pids controller counts threads too).
/// Measured (README, "Limits"): Claude Code 2.1.197 and 2.1.330 in `-p` with a Bash tool
/// call peak at 14 to 17 tasks in the sandbox, the same with `cargo build -j2` of
/// claudebox as the tool call at 33 (about 8 per job). 4096 leaves room for a 256-job
/// build on a big machine, is systemd's own order for a service (15% of the default
/// pid_max: 4915), and stops a fork bomb far below the kernel's pid_max.
pub const DEFAULT_PIDS: u64 = 4096;

/// The open-file limit (`RLIMIT_NOFILE`, soft and hard) of every process in the sandbox:
/// the launch lowers bwrap's before it starts, and nothing inside can raise a hard limit.
/// Why (issue 34): the system's file table (`fs.file-max`) is shared by every process of
/// the machine, and systemd gives user sessions a hard `nofile` of 524288; an agent that
/// raised its soft limit to that and opened descriptors made open(2) fail machine-wide
/// (ENFILE) after ~300k on a VM whose `file-max` was that size, and the exit review then
/// skipped the project. 16384 is far above what the tools an agent runs use (the usual
/// soft limit is 1024, and npm, cargo and node's watchers work within it: watchers use
/// inotify, one descriptor per instance; Go and Java raise their soft limit to the hard
/// one at start and then hold what they open), and below `file-max` on any machine with
/// 200 MiB of memory or more (the kernel sizes it at about one file per 10 KiB). A
/// lower soft limit of the user's is kept. Not a bound of the sandbox as a whole: each
/// process has its own, so the sandbox's is this times its processes (the `--pids`
/// limit); docs/security.md says what that leaves.
pub const NOFILE_MAX: u64 = 16384;

/// Below this many tasks bwrap, the step inside and claude cannot start.
pub const MIN_PIDS: u64 = 16;
/// Below this a sandbox cannot start claude (node alone maps ~50 MiB).
pub const MIN_MEMORY: u64 = 16 << 20;
/// The period of `cpu.max`, in microseconds (the kernel's and systemd's default).
pub const CPU_PERIOD_US: u64 = 100_000;

/// One kind of limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Pids,
    Cpu,
}

/// The limits as data: per kind its flag, config key, cgroup controller, what a hit does
/// and why it exists.
pub struct Row {
    pub kind: Kind,
    pub flag: &'static str,
    pub key: &'static str,
    pub controller: &'static str,
    /// The file of the sandbox's cgroup counting hits, and the key in it.
    pub events: Option<(&'static str, &'static str)>,
    pub why: &'static str,
}

pub const TABLE: &[Row] = &[
    Row {
        kind: Kind::Memory,
        flag: "--memory",
        key: "memory",
        controller: "memory",
        events: Some(("memory.events", "oom_kill")),
        why: "memory of every process in the sandbox together (swap none): past it the \
              kernel ends the whole sandbox (memory.oom.group)",
    },
    Row {
        kind: Kind::Pids,
        flag: "--pids",
        key: "pids",
        controller: "pids",
        events: Some(("pids.events", "max")),
        why: "processes and threads in the sandbox together: past it fork fails there, so a \
              fork bomb stops and the machine stays usable",
    },
    Row {
        kind: Kind::Cpu,
        flag: "--cpu",
        key: "cpu",
        controller: "cpu",
        events: None,
        why: "CPUs' worth of time per period for the sandbox together: past it it waits",
    },
];

#[allow(clippy::expect_used)] // TABLE has a row for each Kind (the tests read every kind's row)
pub fn row(kind: Kind) -> &'static Row {
    TABLE
        .iter()
        .find(|r| r.kind == kind)
        .expect("every kind has a row")
}

/// One limit as written: a value, or `max` (none, overriding the default or the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Max,
    /// Bytes (memory), tasks (pids) or thousandths of a CPU (cpu).
    Value(u64),
}

/// Parses a value of `kind` as the command line and the config file spell it.
pub fn parse(kind: Kind, s: &str) -> Result<Setting, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("max") {
        return Ok(Setting::Max);
    }
    match kind {
        Kind::Memory => parse_size(s).map(Setting::Value),
        Kind::Pids => match s.parse::<u64>() {
            Ok(n) if n >= MIN_PIDS => Ok(Setting::Value(n)),
            Ok(_) => Err(format!(
                "`{s}` is too few: bwrap, claudebox's step inside and claude need {MIN_PIDS} \
                 tasks (or `max` for no limit)"
            )),
            Err(_) => Err(format!(
                "`{s}` is not a number of processes (e.g. 4096, or `max` for no limit)"
            )),
        },
        Kind::Cpu => parse_cpu(s).map(Setting::Value),
    }
}

/// `4G`, `512M`, `1.5GiB`, `1048576` (bytes): binary units K, M, G, T.
fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not a size (e.g. 4G, 512M, or `max` for no limit)");
    let digits = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    let value = decimal(num, shift).ok_or_else(bad)?;
    if value < MIN_MEMORY {
        return Err(format!(
            "`{s}` is too little memory to start claude (at least 16M; `max` for no limit)"
        ));
    }
    Ok(value)
}

/// `num` (digits, at most one `.`) times 2^shift, rounded down; None when malformed.
fn decimal(num: &str, shift: u32) -> Option<u64> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') || frac.len() > 6 {
        return None;
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_digits = frac.len() as u32;
    let frac: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let scale = 10u128.pow(frac_digits);
    let total = ((int * scale + frac) << shift) / scale;
    u64::try_from(total).ok()
}

/// `1.5` CPUs or `150%`, in thousandths of a CPU.
fn parse_cpu(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not a number of CPUs (e.g. 1.5 or 150%, or `max`)");
    let millis = match s.strip_suffix('%') {
        Some(p) => scaled(p.trim(), 10),
        None => scaled(s, 1000),
    }
    .ok_or_else(bad)?;
    if millis < 10 {
        return Err(format!("`{s}` is below the kernel's least share (0.01)"));
    }
    Ok(millis)
}

/// `num` times `factor`, keeping three decimals of the result; None when malformed.
fn scaled(num: &str, factor: u64) -> Option<u64> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty()
        || !(int.chars().chain(frac.chars())).all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let int: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut f = frac.to_string();
    f.truncate(3);
    while f.len() < 3 {
        f.push('0');
    }
    let f: u64 = f.parse().ok()?;
    int.checked_mul(1000)?
        .checked_add(f)?
        .checked_mul(factor)
        .map(|v| v / 1000)
}

/// How a value is shown to the user.
pub fn shown(kind: Kind, v: Setting) -> String {
    match (kind, v) {
        (_, Setting::Max) => "max (no limit)".into(),
        (Kind::Memory, Setting::Value(b)) => size(b),
        (Kind::Pids, Setting::Value(n)) => n.to_string(),
        (Kind::Cpu, Setting::Value(m)) => cpus(m),
    }
}

fn size(b: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        let whole = b >> shift;
        if whole == 0 {
            continue;
        }
        if b == whole << shift {
            return format!("{whole}{unit}");
        }
        // One decimal when that is exact (1.5G).
        let tenths = (b - (whole << shift)) * 10;
        if tenths.is_multiple_of(1 << shift) {
            return format!("{whole}.{}{unit}", tenths >> shift);
        }
    }
    format!("{b} bytes")
}

fn cpus(m: u64) -> String {
    let s = format!("{}.{:03}", m / 1000, m % 1000);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One limit asked for, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    pub kind: Kind,
    pub setting: Setting,
    pub origin: Origin,
}

/// What the user asked for, one entry per kind at most (the last layer wins), before the
/// default process limit is added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Requested(pub Vec<Asked>);

impl Requested {
    /// The later layer wins for its kind.
    pub fn set(&mut self, a: Asked) {
        self.0.retain(|x| x.kind != a.kind);
        self.0.push(a);
    }

    /// The limits in force: the asked ones that are not `max`, and the default process
    /// limit unless pids were named.
    pub fn in_force(&self) -> Vec<Asked> {
        let mut v: Vec<Asked> = TABLE
            .iter()
            .filter_map(|r| self.0.iter().find(|a| a.kind == r.kind).cloned())
            .collect();
        if !v.iter().any(|a| a.kind == Kind::Pids) {
            v.insert(
                v.iter()
                    .position(|a| a.kind == Kind::Cpu)
                    .unwrap_or(v.len()),
                Asked {
                    kind: Kind::Pids,
                    setting: Setting::Value(DEFAULT_PIDS),
                    origin: Origin::Default,
                },
            );
        }
        v.retain(|a| a.setting != Setting::Max);
        v
    }
}

/// What the host offers to apply limits with (found by `host::limits::probe`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Support {
    /// The user's systemd manager runs (`systemd-run --user --scope`), with these
    /// controllers delegated to it.
    Systemd { controllers: Vec<String> },
    /// A cgroup v2 directory the user can make a child of and move processes into, with
    /// these controllers available to that child.
    Cgroup {
        parent: PathBuf,
        controllers: Vec<String>,
    },
    /// Neither: why, in a few words.
    None(String),
    /// Not looked (`--check` and tests that need no limits).
    #[default]
    NotProbed,
}

impl Support {
    fn controllers(&self) -> &[String] {
        match self {
            Support::Systemd { controllers } | Support::Cgroup { controllers, .. } => controllers,
            _ => &[],
        }
    }
    /// One line: the mechanism, or what is missing.
    pub fn describe(&self) -> String {
        match self {
            Support::Systemd { controllers } => format!(
                "the user's systemd manager (systemd-run --user --scope), controllers: {}",
                controllers.join(" ")
            ),
            Support::Cgroup {
                parent,
                controllers,
            } => format!(
                "a delegated cgroup v2 subtree at {}, controllers: {}",
                crate::policy::escape::Shown::shown(parent.as_path()),
                controllers.join(" ")
            ),
            Support::None(why) => why.clone(),
            Support::NotProbed => "not probed".into(),
        }
    }
}

/// The limits a launch applies, and how.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decided {
    pub limits: Vec<Asked>,
    pub support: Support,
    /// The default limit could not be applied: the warning (shown once per user).
    pub warning: Option<String>,
}

/// Decides which limits apply with what the host offers: a requested limit it cannot
/// apply refuses the launch (one line, the fix); the default one is dropped with a warning.
pub fn decide(asked: &Requested, support: &Support) -> Result<Decided, Fixable> {
    let mut d = Decided {
        support: support.clone(),
        ..Decided::default()
    };
    for a in asked.in_force() {
        let r = row(a.kind);
        if support.controllers().iter().any(|c| c == r.controller) {
            d.limits.push(a);
            continue;
        }
        let missing = match support {
            Support::Systemd { .. } | Support::Cgroup { .. } => format!(
                "the {} controller is not delegated to you ({})",
                r.controller,
                support.describe()
            ),
            _ => support.describe(),
        };
        if a.origin == Origin::Default {
            d.warning = Some(format!(
                "limits: warning: no process limit, so a fork bomb inside can take the \
                 machine: {missing} (shown once; see claudebox --check)"
            ));
        } else {
            return Err(Fixable::new(
                format!(
                    "{} {} ({}): cannot be applied: {missing}",
                    r.flag,
                    shown(a.kind, a.setting),
                    a.origin
                ),
                FIX,
            ));
        }
    }
    Ok(d)
}

/// What makes limits possible, for the refusal and `--check`.
pub const FIX: &str = "run claudebox in a systemd user session (loginctl enable-linger $USER), \
     or have root delegate a cgroup v2 subtree to you (chown it and its cgroup.procs, \
     cgroup.subtree_control), or drop the limit";

/// `systemd-run`'s arguments before bwrap's, for the systemd mechanism; empty otherwise.
pub fn systemd_prefix(d: &Decided, instance_id: &str) -> Vec<String> {
    if !matches!(d.support, Support::Systemd { .. }) || d.limits.is_empty() {
        return Vec::new();
    }
    // No `--collect`: a scope the OOM kill failed stays loaded until claudebox has read its
    // result (`oom-kill`) and reset it (`host::limits`).
    let mut v: Vec<String> = ["systemd-run", "--user", "--scope", "--quiet"]
        .map(String::from)
        .into();
    v.push(format!("--unit=claudebox-{instance_id}"));
    for a in &d.limits {
        let Setting::Value(n) = a.setting else {
            continue;
        };
        let props: Vec<String> = match a.kind {
            Kind::Memory => vec![format!("MemoryMax={n}"), "MemorySwapMax=0".into()],
            Kind::Pids => vec![format!("TasksMax={n}")],
            Kind::Cpu => vec![format!("CPUQuota={}%", cpus(n * 100))],
        };
        for p in props {
            v.push("-p".into());
            v.push(p);
        }
    }
    v.push("--".into());
    v
}

/// The files written into a fresh cgroup for the cgroup mechanism, in order: (file,
/// content, whether a missing file is fine).
pub fn cgroup_writes(d: &Decided) -> Vec<(&'static str, String, bool)> {
    let mut v = Vec::new();
    for a in &d.limits {
        let Setting::Value(n) = a.setting else {
            continue;
        };
        match a.kind {
            Kind::Memory => {
                v.push(("memory.max", n.to_string(), false));
                // Without swap accounting (or swap) the file is absent: nothing to bound.
                v.push(("memory.swap.max", "0".into(), true));
                v.push(("memory.oom.group", "1".into(), false));
            }
            Kind::Pids => v.push(("pids.max", n.to_string(), false)),
            Kind::Cpu => v.push((
                "cpu.max",
                format!("{} {CPU_PERIOD_US}", n * CPU_PERIOD_US / 1000),
                false,
            )),
        }
    }
    v
}

/// What the first cell of a [`dry_run_rows`] row means, for `--dry-run`'s legend.
pub fn row_meaning(first: &str) -> &'static str {
    match first {
        "none" => "no limit is in force, and why",
        "via" => "how the limits are applied (systemd or a delegated cgroup v2 subtree)",
        "prefix" => "the systemd-run command bwrap starts under",
        _ => "a limit of the sandbox as a whole: its value, where it came from, why",
    }
}

/// `--dry-run`'s rows (cells, one line each): one per limit in force, and the mechanism.
pub fn dry_run_rows(d: &Decided, instance_id: &str) -> Vec<Vec<String>> {
    let mut v = Vec::new();
    for a in &d.limits {
        let r = row(a.kind);
        v.push(vec![
            r.key.to_string(),
            shown(a.kind, a.setting),
            a.origin.to_string(),
            r.why.to_string(),
        ]);
    }
    if let Some(w) = &d.warning {
        v.push(vec!["none".into(), w.clone()]);
    } else if d.limits.is_empty() {
        v.push(vec!["none".into(), "no limit is in force".into()]);
    }
    if !d.limits.is_empty() {
        v.push(vec!["via".into(), d.support.describe()]);
        let prefix = systemd_prefix(d, instance_id);
        if !prefix.is_empty() {
            v.push(vec!["prefix".into(), prefix.join(" ")]);
        }
    }
    v
}

/// The counters read from the sandbox's cgroup once it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hits {
    pub oom_kills: u64,
    pub pids_max: u64,
}

/// The value of `key` in a cgroup events file (`oom_kill 2\nmax 0\n`).
pub fn event_count(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The exit status of a sandbox the memory limit ended: as for a process killed by
/// SIGKILL (the kernel's OOM kill).
pub const MEMORY_EXIT: i32 = 137;

/// The one line after a sandbox a limit ended or held, and the exit status it must have
/// (None: the agent's own). An OOM kill with no memory limit in force (the cgroup's
/// `oom_kill` counts every OOM kill of its processes, the kernel's global one too, and a
/// systemd scope records it as its result alike) was the machine running out of memory:
/// said so, and the agent's own status stays (the agent may have survived the kill of a
/// child and exited 0).
pub fn ended_line(d: &Decided, hits: Hits) -> Option<(String, Option<i32>)> {
    let value = |k: Kind| {
        d.limits
            .iter()
            .find(|a| a.kind == k)
            .map(|a| shown(k, a.setting))
            .unwrap_or_else(|| "?".into())
    };
    let memory_limited = d
        .limits
        .iter()
        .any(|a| a.kind == Kind::Memory && matches!(a.setting, Setting::Value(_)));
    if hits.oom_kills > 0 && !memory_limited {
        return Some((
            format!(
                "claudebox: the kernel's out-of-memory killer killed {} in the sandbox: the \
                 machine ran short of memory (no memory limit was set; --memory SIZE or \
                 `memory` in the config file keeps the sandbox within SIZE)",
                if hits.oom_kills == 1 {
                    "a process".to_string()
                } else {
                    format!("{} processes", hits.oom_kills)
                }
            ),
            None,
        ));
    }
    if hits.oom_kills > 0 {
        return Some((
            format!(
                "claudebox: the sandbox was ended by its memory limit (--memory {}, exit \
                 status {MEMORY_EXIT}); raise it with --memory SIZE or `memory` in the config file",
                value(Kind::Memory)
            ),
            Some(MEMORY_EXIT),
        ));
    }
    if hits.pids_max > 0 {
        return Some((
            format!(
                "claudebox: the sandbox reached its process limit (--pids {}) {} times, and \
                 forks failed there; raise it with --pids N or `pids` in the config file",
                value(Kind::Pids),
                hits.pids_max
            ),
            None,
        ));
    }
    None
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(row(*self).key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(kind: Kind, s: &str) -> Result<Setting, String> {
        parse(kind, s)
    }

    #[test]
    fn sizes() {
        assert_eq!(v(Kind::Memory, "4G"), Ok(Setting::Value(4 << 30)));
        assert_eq!(v(Kind::Memory, "512m"), Ok(Setting::Value(512 << 20)));
        assert_eq!(v(Kind::Memory, "1.5GiB"), Ok(Setting::Value(3 << 29)));
        assert_eq!(v(Kind::Memory, "100MB"), Ok(Setting::Value(100 << 20)));
        assert_eq!(v(Kind::Memory, "67108864"), Ok(Setting::Value(64 << 20)));
        assert_eq!(v(Kind::Memory, "MAX"), Ok(Setting::Max));
        for bad in ["", "G", "4X", "1.2.3G", "-1G", "4 G B", "1e9"] {
            assert!(v(Kind::Memory, bad).is_err(), "{bad}");
        }
        assert!(v(Kind::Memory, "1M").unwrap_err().contains("too little"));
        assert_eq!(shown(Kind::Memory, Setting::Value(3 << 29)), "1.5G");
        assert_eq!(shown(Kind::Memory, Setting::Value(512 << 20)), "512M");
        assert_eq!(
            shown(Kind::Memory, Setting::Value(100_000_001)),
            "100000001 bytes"
        );
    }

    #[test]
    fn pids_and_cpus() {
        assert_eq!(v(Kind::Pids, "4096"), Ok(Setting::Value(4096)));
        assert!(v(Kind::Pids, "3").unwrap_err().contains("too few"));
        assert!(v(Kind::Pids, "lots").is_err());
        assert_eq!(v(Kind::Cpu, "1.5"), Ok(Setting::Value(1500)));
        assert_eq!(v(Kind::Cpu, "150%"), Ok(Setting::Value(1500)));
        assert_eq!(v(Kind::Cpu, "0.25"), Ok(Setting::Value(250)));
        assert_eq!(v(Kind::Cpu, "2"), Ok(Setting::Value(2000)));
        for bad in ["", "x", "1,5", "0", "0.001", "%", "-1"] {
            assert!(v(Kind::Cpu, bad).is_err(), "{bad}");
        }
        assert_eq!(shown(Kind::Cpu, Setting::Value(1500)), "1.5");
        assert_eq!(shown(Kind::Cpu, Setting::Value(2000)), "2");
    }

    fn asked(kind: Kind, setting: Setting, origin: Origin) -> Asked {
        Asked {
            kind,
            setting,
            origin,
        }
    }

    #[test]
    fn the_default_process_limit_unless_named() {
        let mut r = Requested::default();
        assert_eq!(
            r.in_force(),
            vec![asked(
                Kind::Pids,
                Setting::Value(DEFAULT_PIDS),
                Origin::Default
            )]
        );
        r.set(asked(Kind::Cpu, Setting::Value(500), Origin::CommandLine));
        r.set(asked(
            Kind::Memory,
            Setting::Value(1 << 30),
            Origin::CommandLine,
        ));
        let kinds: Vec<Kind> = r.in_force().iter().map(|a| a.kind).collect();
        assert_eq!(kinds, [Kind::Memory, Kind::Pids, Kind::Cpu]);
        r.set(asked(Kind::Pids, Setting::Max, Origin::CommandLine));
        let kinds: Vec<Kind> = r.in_force().iter().map(|a| a.kind).collect();
        assert_eq!(kinds, [Kind::Memory, Kind::Cpu]);
    }

    #[test]
    fn a_requested_limit_refuses_the_default_warns() {
        let none = Support::None("no systemd user manager, no delegated cgroup v2 subtree".into());
        let d = decide(&Requested::default(), &none).unwrap();
        assert!(d.limits.is_empty());
        let w = d.warning.unwrap();
        assert!(
            w.contains("no process limit, so a fork bomb inside can take the machine: no systemd"),
            "{w}"
        );
        let mut r = Requested::default();
        r.set(asked(
            Kind::Memory,
            Setting::Value(1 << 30),
            Origin::CommandLine,
        ));
        let e = decide(&r, &none).unwrap_err();
        assert_eq!(
            e.what,
            "--memory 1G (command line): cannot be applied: no systemd user manager, no \
             delegated cgroup v2 subtree"
        );
        // A mechanism without the memory controller: refused, naming it.
        let pids_only = Support::Cgroup {
            parent: "/sys/fs/cgroup/u".into(),
            controllers: vec!["pids".into()],
        };
        let e = decide(&r, &pids_only).unwrap_err();
        assert!(
            e.what.contains("the memory controller is not delegated"),
            "{}",
            e.what
        );
        let all = Support::Cgroup {
            parent: "/sys/fs/cgroup/u".into(),
            controllers: ["memory", "pids", "cpu"].map(String::from).into(),
        };
        let d = decide(&r, &all).unwrap();
        assert_eq!(d.limits.len(), 2);
        assert_eq!(d.warning, None);
        assert_eq!(
            cgroup_writes(&d),
            vec![
                ("memory.max", (1u64 << 30).to_string(), false),
                ("memory.swap.max", "0".into(), true),
                ("memory.oom.group", "1".into(), false),
                ("pids.max", DEFAULT_PIDS.to_string(), false),
            ]
        );
        assert!(systemd_prefix(&d, "x").is_empty());
    }

    #[test]
    fn systemd_prefix_names_every_limit() {
        let mut r = Requested::default();
        r.set(asked(
            Kind::Memory,
            Setting::Value(2 << 30),
            Origin::CommandLine,
        ));
        r.set(asked(Kind::Cpu, Setting::Value(1500), Origin::CommandLine));
        let s = Support::Systemd {
            controllers: ["cpu", "memory", "pids"].map(String::from).into(),
        };
        let d = decide(&r, &s).unwrap();
        assert_eq!(
            systemd_prefix(&d, "abc").join(" "),
            "systemd-run --user --scope --quiet --unit=claudebox-abc \
             -p MemoryMax=2147483648 -p MemorySwapMax=0 -p TasksMax=4096 -p CPUQuota=150% --"
        );
        let lines: Vec<String> = dry_run_rows(&d, "abc")
            .iter()
            .map(|r| r.join("\t"))
            .collect();
        assert!(
            lines[0].starts_with("memory\t2G\tcommand line\t"),
            "{lines:?}"
        );
        assert!(lines[1].starts_with("pids\t4096\tdefault\t"), "{lines:?}");
        assert!(
            lines[2].starts_with("cpu\t1.5\tcommand line\t"),
            "{lines:?}"
        );
        assert!(
            lines[3].starts_with("via\tthe user's systemd manager"),
            "{lines:?}"
        );
        assert!(
            lines[4].starts_with("prefix\tsystemd-run --user"),
            "{lines:?}"
        );
    }

    #[test]
    fn the_line_after_names_the_limit() {
        let all = Support::Cgroup {
            parent: "/c".into(),
            controllers: ["memory", "pids"].map(String::from).into(),
        };
        let mut r = Requested::default();
        r.set(asked(
            Kind::Memory,
            Setting::Value(256 << 20),
            Origin::CommandLine,
        ));
        let d = decide(&r, &all).unwrap();
        assert_eq!(event_count("low 0\noom 3\noom_kill 2\n", "oom_kill"), 2);
        assert_eq!(event_count("max 7\n", "max"), 7);
        assert_eq!(event_count("", "max"), 0);
        assert_eq!(ended_line(&d, Hits::default()), None);
        let (line, status) = ended_line(
            &d,
            Hits {
                oom_kills: 1,
                pids_max: 9,
            },
        )
        .unwrap();
        assert!(
            line.contains("ended by its memory limit (--memory 256M"),
            "{line}"
        );
        assert_eq!(status, Some(MEMORY_EXIT));
        let (line, status) = ended_line(
            &d,
            Hits {
                oom_kills: 0,
                pids_max: 9,
            },
        )
        .unwrap();
        assert!(
            line.contains("process limit (--pids 4096) 9 times"),
            "{line}"
        );
        assert_eq!(status, None);
        // No memory limit in force (the default pids limit alone): an OOM kill was the
        // machine's, the agent's own status stays, and no "--memory ?" is printed.
        let mut r = Requested::default();
        r.set(asked(Kind::Pids, Setting::Value(4096), Origin::CommandLine));
        let pids_only = decide(&r, &all).unwrap();
        let mut r = Requested::default();
        r.set(asked(Kind::Memory, Setting::Max, Origin::CommandLine));
        let memory_max = decide(&r, &all).unwrap();
        for d in [&pids_only, &memory_max, &Decided::default()] {
            let (line, status) = ended_line(
                d,
                Hits {
                    oom_kills: 2,
                    pids_max: 0,
                },
            )
            .unwrap();
            assert!(
                line.contains("out-of-memory killer killed 2 processes"),
                "{line}"
            );
            assert!(line.contains("no memory limit was set"), "{line}");
            assert!(!line.contains('?') && !line.contains("137"), "{line}");
            assert_eq!(status, None);
        }
    }
}
