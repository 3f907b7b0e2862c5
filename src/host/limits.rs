//! The edge of the sandbox's limits (the policy is `policy::limits`): finding what the
//! host offers (the user's systemd manager, or a cgroup v2 directory the user may make a
//! child of), making the sandbox's own cgroup and writing its limits, moving the launch
//! into it right before bwrap starts, and after the sandbox ends reading which limit it
//! hit and removing its cgroup (the supervising claudebox, after its wait: [`CgroupEntry::finish`]).
//!
//! Why a process moves itself rather than bwrap being started under a wrapper: the move
//! is one write of `0` to `cgroup.procs` by the process that then execs bwrap, so it works
//! the same whether the launcher execs bwrap (the process moves, then execs) or forks it
//! (the child moves between fork and exec, async-signal-safe: [`Applied::enter`]); bwrap
//! and everything it starts inherit the cgroup and cannot leave it (the sandbox has its
//! own cgroup namespace and no write access to the parent). The systemd mechanism instead
//! prefixes bwrap's argv with `systemd-run --user --scope ... --`, which execs bwrap in the
//! scope in place (same pid), so it too works either way.

use std::ffi::{CString, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use nix::libc;

use crate::policy::error::Fixable;
use crate::policy::escape::Shown;
use crate::policy::limits::{self, Decided, Hits, Support};

/// The prefix of the cgroups claudebox makes (one per sandbox, named by its instance).
const PREFIX: &str = "claudebox-";

/// What the host offers to apply limits with.
pub fn probe() -> Support {
    let uid = nix::unistd::getuid().as_raw();
    let controllers_of = |dir: &Path| -> Vec<String> {
        fs::read_to_string(dir.join("cgroup.controllers"))
            .map(|s| s.split_whitespace().map(String::from).collect())
            .unwrap_or_default()
    };
    let mount = cgroup2_mount();
    if let Some(runtime) = runtime_dir() {
        if runtime.join("systemd/private").exists() && which::which("systemd-run").is_ok() {
            let service = mount
                .as_ref()
                .map(|m| m.join(format!("user.slice/user-{uid}.slice/user@{uid}.service")));
            return Support::Systemd {
                controllers: service.as_deref().map(controllers_of).unwrap_or_default(),
            };
        }
    }
    let Some(mount) = mount else {
        return Support::None("no systemd user manager and no cgroup v2 file system".into());
    };
    let own = own_cgroup();
    let mut dir = match own.as_deref().map(|r| r.strip_prefix("/").unwrap_or(r)) {
        Some(rel) if !rel.as_os_str().is_empty() => mount.join(rel),
        _ => mount.clone(),
    };
    loop {
        if writable(&dir) {
            // The kernel lets a cgroup with processes of its own (the root aside) hand no
            // controller to its children: only a process-free one can be the parent. The
            // root's list is not read: it names every process of the host on a hybrid
            // one, and the kernel walks them all for it at every launch.
            let usable = if dir == mount
                || fs::read_to_string(dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .trim()
                    .is_empty()
            {
                controllers_of(&dir)
            } else {
                Vec::new()
            };
            if !usable.is_empty() {
                return Support::Cgroup {
                    parent: dir,
                    controllers: usable,
                };
            }
        }
        if dir == mount || !dir.pop() || !dir.starts_with(&mount) {
            break;
        }
    }
    let shown = own.as_deref().unwrap_or(Path::new("?")).shown();
    Support::None(format!(
        "no systemd user manager, and no cgroup v2 subtree delegated to you (your cgroup {shown} \
         and its parents are not yours to divide)"
    ))
}

/// `$XDG_RUNTIME_DIR`: systemd-run finds the user's manager through it, so without it
/// there is none to use.
fn runtime_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on a hybrid host).
fn cgroup2_mount() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split(' ').next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(unescape(left.split(' ').nth(4)?)))
    })
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    std::ffi::OsStr::from_bytes(&out).to_os_string()
}

/// This process's cgroup v2 path (`0::/user.slice/...`), relative to the hierarchy.
fn own_cgroup() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(PathBuf::from)
}

/// Whether this user may make a child of `dir` and move processes in and out of it.
fn writable(dir: &Path) -> bool {
    use nix::unistd::{access, AccessFlags};
    access(dir, AccessFlags::W_OK).is_ok()
        && access(&dir.join("cgroup.procs"), AccessFlags::W_OK).is_ok()
        && access(&dir.join("cgroup.subtree_control"), AccessFlags::W_OK).is_ok()
}

/// The limits made ready for one sandbox.
#[derive(Debug, Default)]
pub struct Applied {
    /// `systemd-run`'s arguments before bwrap's (the systemd mechanism).
    pub prefix: Vec<OsString>,
    /// The sandbox's own cgroup (the cgroup mechanism).
    pub cgroup: Option<PathBuf>,
    procs: Option<CString>,
    /// The scope's unit (the systemd mechanism), whose result is read at the end.
    unit: Option<String>,
}

/// Makes the limits of `d` ready: for the cgroup mechanism, the sandbox's cgroup with its
/// limits written (the caller then [`Applied::enter`]s it right before bwrap starts). A
/// limit the user asked for that fails here refuses the launch; the default alone warns.
pub fn apply(d: &Decided, instance_id: &str) -> Result<Applied> {
    if d.limits.is_empty() {
        return Ok(Applied::default());
    }
    match &d.support {
        Support::Systemd { .. } => Ok(Applied {
            prefix: limits::systemd_prefix(d, instance_id)
                .into_iter()
                .map(OsString::from)
                .collect(),
            unit: Some(format!("claudebox-{instance_id}.scope")),
            ..Applied::default()
        }),
        Support::Cgroup { parent, .. } => match make_cgroup(parent, d, instance_id) {
            Ok(a) => Ok(a),
            Err(e) => {
                let what = format!("limits: cannot set up the sandbox's cgroup: {e:#}");
                if requested(d) {
                    anyhow::bail!(Fixable::new(what, limits::FIX).at(parent));
                }
                eprintln!("claudebox: {what}; the sandbox starts without a process limit");
                Ok(Applied::default())
            }
        },
        _ => Ok(Applied::default()),
    }
}

fn make_cgroup(parent: &Path, d: &Decided, instance_id: &str) -> Result<Applied> {
    remove_stale(parent);
    let needed: Vec<&str> = d
        .limits
        .iter()
        .map(|a| limits::row(a.kind).controller)
        .collect();
    let enabled = fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    for c in &needed {
        if !enabled.split_whitespace().any(|e| e == *c) {
            write(&parent.join("cgroup.subtree_control"), &format!("+{c}"))?;
        }
    }
    let dir = parent.join(format!("{PREFIX}{instance_id}"));
    fs::create_dir(&dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.shown()))?;
    for (file, content, optional) in limits::cgroup_writes(d) {
        let path = dir.join(file);
        if optional && !path.exists() {
            continue;
        }
        if let Err(e) = write(&path, &content) {
            let _ = fs::remove_dir(&dir);
            return Err(e);
        }
    }
    let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())?;
    Ok(Applied {
        prefix: Vec::new(),
        cgroup: Some(dir),
        procs: Some(procs),
        unit: None,
    })
}

fn write(path: &Path, content: &str) -> Result<()> {
    fs::write(path, content)
        .map_err(|e| anyhow::anyhow!("cannot write {content} to {}: {e}", path.shown()))
}

/// Removes the empty cgroups of sandboxes whose claudebox was killed (a populated
/// one refuses: EBUSY). Only those made a minute ago or more: a sibling launch may have
/// made its own and not entered it yet.
fn remove_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= Duration::from_secs(60));
        if old && e.file_name().as_bytes().starts_with(PREFIX.as_bytes()) {
            let _ = fs::remove_dir(e.path());
        }
    }
}

/// Before bwrap starts: makes the limits ready and returns `argv` with the systemd prefix
/// where that is the mechanism, and the [`CgroupEntry`] bwrap's process enters the sandbox's
/// cgroup with (between fork and exec), whose [`CgroupEntry::finish`] the supervising parent
/// calls after its wait.
pub fn prepare(
    d: &Decided,
    instance_id: &str,
    argv: Vec<OsString>,
) -> Result<(Vec<OsString>, CgroupEntry)> {
    let applied = apply(d, instance_id)?;
    let required = requested(d);
    let prefix = applied.prefix.clone();
    Ok((
        prefix.into_iter().chain(argv).collect(),
        CgroupEntry { applied, required },
    ))
}

/// How bwrap's process enters the sandbox's cgroup, between fork and exec.
pub struct CgroupEntry {
    applied: Applied,
    required: bool,
}

impl CgroupEntry {
    /// Moves the calling process (bwrap's, before its exec) into the sandbox's cgroup. A
    /// failure stops the launch when a limit was asked for; the default alone lets it go
    /// on without it (async-signal-safe: no message here).
    pub fn enter(&self) -> io::Result<()> {
        match self.applied.enter() {
            Err(e) if self.required => Err(e),
            _ => Ok(()),
        }
    }
}

/// Lowers this process's open-file limit to `max` (soft and hard; a lower soft limit is
/// kept). Called between fork and exec of bwrap: only system calls, no allocation.
pub fn bound_nofile(max: u64) -> io::Result<()> {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a pointer to a local rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut cur) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let hard = cur.rlim_max.min(max as libc::rlim_t);
    let new = libc::rlimit {
        rlim_cur: cur.rlim_cur.min(hard),
        rlim_max: hard,
    };
    // SAFETY: a pointer to a local rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const new) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The debug builds' control for the descriptor attempts (tests/integration/escape/
/// exhaust.rs): `CLAUDEBOX_TEST_NO_NOFILE_BOUND` keeps the user's open-file limit in the
/// sandbox, as before issue 34. A release build never reads it.
pub fn nofile_bound_off() -> bool {
    super::test_switch::on("CLAUDEBOX_TEST_NO_NOFILE_BOUND")
}

/// Whether any limit in force was asked for (not only the default).
fn requested(d: &Decided) -> bool {
    d.limits
        .iter()
        .any(|a| a.origin != crate::policy::origin::Origin::Default)
}

/// Prints a warning once per user: `mark` names its mark in claudebox's state
/// (`.limits-warned` for the default limit's, `.supervisor-warned` for a kernel without
/// the file supervisor).
pub fn warn_once(state_dir: &Path, mark: &str, warning: &str) {
    let mark = state_dir.join(mark);
    if mark.exists() {
        return;
    }
    eprintln!("claudebox: {warning}");
    let _ = fs::write(mark, b"");
}

impl Applied {
    /// Moves the calling process into the sandbox's cgroup: right before bwrap is exec'd,
    /// by the process that execs it. Only async-signal-safe calls (open, write, close), so
    /// it may run between fork and exec.
    pub fn enter(&self) -> io::Result<()> {
        let Some(procs) = &self.procs else {
            return Ok(());
        };
        // SAFETY: a NUL-terminated path and a two-byte buffer; the descriptor is closed.
        unsafe {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = io::Error::last_os_error();
            libc::close(fd);
            if n != 1 {
                return Err(err);
            }
        }
        Ok(())
    }

    /// The counters of the sandbox's cgroup, once it ended.
    pub fn hits(&self) -> Hits {
        self.cgroup.as_deref().map(hits_of).unwrap_or_default()
    }
}

impl CgroupEntry {
    /// After the sandbox ended (bwrap and its orphans reaped): waits for its cgroup to
    /// empty (its pid namespace goes with bwrap's end; at most 5 s), prints the line
    /// naming the limit it hit, if any, and removes the cgroup; with systemd's scope, reads
    /// the scope's result (systemd stops a scope on an OOM kill: the sandbox ends
    /// "Terminated") and resets it. Returns the exit status the sandbox must have when
    /// systemd ended it for a limit (137, what the kernel's OOM kill gives the agent on the
    /// cgroup mechanism, where the agent's own status stays: an OOM-killed child of a
    /// surviving agent ends nothing).
    pub fn finish(&self, d: &Decided) -> Option<i32> {
        if let Some(unit) = &self.applied.unit {
            let result = scope_result(unit);
            let hits = Hits {
                oom_kills: u64::from(result.as_deref() == Some("oom-kill")),
                pids_max: 0,
            };
            // A scope that ended well is gone already; a failed one stays until reset.
            if result.as_deref() != Some("success") {
                let _ = systemctl(&["reset-failed", unit]);
            }
            let (line, status) = limits::ended_line(d, hits)?;
            eprintln!("{line}");
            return status;
        }
        let dir = self.applied.cgroup.as_ref()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while populated(dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let hits = self.applied.hits();
        let _ = fs::remove_dir(dir);
        if let Some((line, _)) = limits::ended_line(d, hits) {
            eprintln!("{line}");
        }
        None
    }
}

/// The `Result` systemd recorded for the scope `unit` (`success`, `oom-kill`, ...).
fn scope_result(unit: &str) -> Option<String> {
    let out = systemctl(&["show", "--property=Result", "--value", unit])?;
    Some(out.trim().to_string())
}

/// `systemctl --user ARGS`, its output when it succeeded within 5 s.
fn systemctl(args: &[&str]) -> Option<String> {
    let mut cmd = std::process::Command::new("systemctl");
    cmd.arg("--user").args(args);
    let ran = super::exec::run_with_timeout(&mut cmd, Duration::from_secs(5)).ok()?;
    ran.success()
        .then(|| String::from_utf8_lossy(&ran.stdout).into_owned())
}

fn hits_of(dir: &Path) -> Hits {
    let read = |f: &str, k: &str| {
        fs::read_to_string(dir.join(f))
            .map(|t| limits::event_count(&t, k))
            .unwrap_or(0)
    };
    Hits {
        oom_kills: read("memory.events", "oom_kill"),
        pids_max: read("pids.events", "max"),
    }
}

fn populated(dir: &Path) -> bool {
    fs::read_to_string(dir.join("cgroup.events"))
        .map(|t| limits::event_count(&t, "populated") > 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/a\\040b"), OsString::from("/a b"));
        assert_eq!(unescape("/plain"), OsString::from("/plain"));
        assert_eq!(unescape("/end\\04"), OsString::from("/end\\04"));
    }

    #[test]
    fn probe_names_a_mechanism_or_what_is_missing() {
        // Whatever this host has, the answer is one of the three, with a reason.
        match probe() {
            Support::Systemd { .. } | Support::Cgroup { .. } => {}
            Support::None(why) => assert!(why.contains("no systemd user manager"), "{why}"),
            Support::NotProbed => panic!("probe returned NotProbed"),
        }
    }
}
