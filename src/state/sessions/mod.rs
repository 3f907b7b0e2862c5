//! Named sessions: `claudebox --session NAME` comes back to its own conversation, from any
//! directory or worktree of the project, and never to another name's.
//!
//! ```text
//! projects/<id>/sessions/       mode 0700
//! ├── <name>.json     the record: {"name", "uuid", "created", "replaced"}, mode 0600,
//! │                   written atomically, only by the holder of <name>.lock
//! ├── <name>.lock     flock held exclusively by the sandbox running <name> (bwrap
//! │                   inherits the descriptor through exec); `--list` probes it shared
//! └── <name>.running  who took the lock last: pid, instance id, start time, cwd, and
//!                     the pid's start ticks: while that process (the outer bwrap)
//!                     lives the name runs, even if the agent closed its lock descriptor
//! ```
//!
//! The decision (new conversation, resume, or fresh because the transcript is gone) is
//! made read-only before planning ([`prepare`]), and made again under the name's lock at
//! exec time ([`claim`]), which alone writes the record and moves the transcript.

pub mod list;
mod lock;
mod record;

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::fcntl::Flock;

use crate::host;
use crate::policy::agent::AgentId;
use crate::state::transcripts::{self, Found};
use crate::state::ProjectState;

use crate::policy::escape::Shown;
use lock::{busy, is_running, lock_name, write_run_info, RunInfo};
use record::{now, read_record, write_record, Record};

/// Longest accepted name, in bytes.
pub const MAX_NAME: usize = 64;

use crate::policy::session::{Launch, Start};

/// Checks a session name: 1 to 64 bytes of `[A-Za-z0-9._-]`, not starting with `.` or
/// `-`, so it is one plain file name and never a path or an option.
pub fn check_name(name: &OsStr) -> Result<String> {
    let b = name.as_bytes();
    let shown = name.to_string_lossy().escape_debug().to_string();
    let why = if b.is_empty() {
        Some("it is empty")
    } else if b.len() > MAX_NAME {
        Some("it is longer than 64 bytes")
    } else if b[0] == b'.' || b[0] == b'-' {
        Some("it starts with `.` or `-`")
    } else if !b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
    {
        Some("only letters, digits, `.`, `_` and `-` are allowed")
    } else {
        None
    };
    match why {
        Some(why) => bail!("invalid session name \"{shown}\": {why}"),
        None => Ok(String::from_utf8_lossy(b).into_owned()),
    }
}

/// Refuses claude options that pick a conversation themselves.
pub fn check_claude_args(name: &str, args: &[OsString]) -> Result<()> {
    for a in args {
        let b = a.as_bytes();
        if b == b"--" {
            break;
        }
        let long = ["--resume", "--continue", "--session-id", "--fork-session"]
            .iter()
            .any(|l| b == l.as_bytes() || b.starts_with(format!("{l}=").as_bytes()));
        let short = b.len() >= 2
            && b[0] == b'-'
            && b[1] != b'-'
            && (b.starts_with(b"-r")
                || b.starts_with(b"-c")
                || (b[1..].iter().all(u8::is_ascii_alphabetic)
                    && b[1..].iter().any(|c| *c == b'r' || *c == b'c')));
        if long || short {
            bail!(crate::policy::error::Fixable::new(
                format!(
                    "`--session {name}` chooses the conversation itself, so claude's `{}` \
                     cannot be used with it",
                    a.to_string_lossy()
                ),
                format!("drop it (to start this name over: `claudebox --forget {name}`)")
            ));
        }
    }
    Ok(())
}

pub(crate) fn record_path(state: &ProjectState, name: &str) -> PathBuf {
    state.sessions().join(format!("{name}.json"))
}
pub(crate) fn lock_path(state: &ProjectState, name: &str) -> PathBuf {
    state.sessions().join(format!("{name}.lock"))
}
pub(crate) fn running_path(state: &ProjectState, name: &str) -> PathBuf {
    state.sessions().join(format!("{name}.running"))
}

/// A fresh random UUID (version 4), lowercase.
pub fn new_uuid() -> Result<String> {
    let mut h = host::random_id()?.into_bytes();
    h[12] = b'4';
    let v = (h[16] as char).to_digit(16).unwrap_or(0) as usize;
    h[16] = b"89ab"[v & 3];
    let h = String::from_utf8_lossy(&h).into_owned();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

pub(crate) fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn decide_with(
    state: &ProjectState,
    name: &str,
    cwd: &Path,
    fresh: &str,
    agent: AgentId,
) -> Result<(Launch, Option<Record>)> {
    let rec = read_record(state, name)?;
    if let Some(r) = &rec {
        if r.agent_name() != agent.name() {
            bail!(crate::policy::error::Fixable::new(
                format!(
                    "session `{name}` is a conversation of {}, not of {agent}",
                    r.agent_name()
                ),
                format!(
                    "run it with `--agent {}`, or choose another name",
                    r.agent_name()
                )
            ));
        }
    }
    let (uuid, start) = match (&rec, agent) {
        (None, _) => (fresh.to_string(), Start::New),
        (Some(r), AgentId::Codex) => {
            if crate::state::codex_home::threads(state).contains(&r.uuid) {
                (r.uuid.clone(), Start::Resume { from: None })
            } else {
                (
                    fresh.to_string(),
                    Start::Fresh {
                        lost: r.uuid.clone(),
                    },
                )
            }
        }
        (Some(r), AgentId::Claude) => {
            match transcripts::find(&state.conversations(), &r.uuid, cwd)? {
                Found::Here => (r.uuid.clone(), Start::Resume { from: None }),
                Found::Elsewhere(dir) => (r.uuid.clone(), Start::Resume { from: Some(dir) }),
                Found::Nowhere => (
                    fresh.to_string(),
                    Start::Fresh {
                        lost: r.uuid.clone(),
                    },
                ),
            }
        }
    };
    let launch = Launch {
        name: name.to_string(),
        uuid,
        start,
        agent,
    };
    Ok((launch, rec))
}

/// The read-only decision made before planning: checks the name and claude's arguments,
/// reads the record and looks for the transcript. Changes nothing on disk.
pub fn prepare(
    state: &ProjectState,
    name: &OsStr,
    cwd: &Path,
    args: &[OsString],
    agent: AgentId,
) -> Result<Launch> {
    let name = check_name(name)?;
    match agent {
        AgentId::Claude => check_claude_args(&name, args)?,
        AgentId::Codex => {
            if let Some(why) = crate::policy::session::codex_args_refusal(args) {
                bail!("{why}");
            }
        }
    }
    Ok(decide_with(state, &name, cwd, &new_uuid()?, agent)?.0)
}

/// What `--dry-run` says about a named launch (on stderr).
pub fn dry_run_note(state: &ProjectState, l: &Launch, cwd: &Path) -> String {
    let n = &l.name;
    match (&l.start, l.agent) {
        (Start::New, AgentId::Codex) => format!(
            "session `{n}`: would start a new Codex thread and record its id in {} after the run",
            record_path(state, n).shown()
        ),
        (Start::Fresh { lost }, AgentId::Codex) => format!(
            "session `{n}`: its thread {lost} is no longer in this project's ~/.codex; would \
             start a new thread under that name"
        ),
        (Start::New, _) => format!(
            "session `{n}`: would start a new conversation {} and record it in {}",
            l.uuid,
            record_path(state, n).shown()
        ),
        (Start::Resume { from: None }, _) => {
            format!("session `{n}`: would resume {}", l.uuid)
        }
        (Start::Resume { from: Some(d) }, _) => format!(
            "session `{n}`: would resume {} after moving its transcript from {} to {}",
            l.uuid,
            state.conversations().join(d).shown(),
            state
                .conversations()
                .join(transcripts::dir_name(cwd))
                .shown()
        ),
        (Start::Fresh { lost }, _) => gone_note(n, lost, &l.uuid, "would start"),
    }
}

fn gone_note(name: &str, lost: &str, uuid: &str, verb: &str) -> String {
    format!(
        "session `{name}`: its conversation {lost} has no transcript in this project (deleted, \
         or claude quit before the first message); {verb} a new conversation {uuid} under \
         that name"
    )
}

/// A name's lock, held exclusively; bwrap inherits it through exec.
pub struct Claimed {
    pub launch: Launch,
    pub lock: Flock<File>,
}

/// At exec time: takes the name's lock (refusing, with who runs it, when it is held),
/// decides again under the lock, then moves the transcript or writes the record, and
/// notes who runs it.
pub fn claim(
    state: &ProjectState,
    planned: &Launch,
    cwd: &Path,
    instance_id: &str,
) -> Result<Claimed> {
    let name = &planned.name;
    let sessions_existed = fs::symlink_metadata(state.sessions()).is_ok();
    let lock_existed = fs::symlink_metadata(lock_path(state, name)).is_ok();
    crate::state::mkdir_private(&state.sessions())?;
    let Some(lock) = lock_name(state, name)? else {
        if !sessions_existed {
            let _ = fs::remove_dir(state.sessions());
        }
        bail!("{}", busy(state, name));
    };
    match claim_locked(state, planned, cwd, instance_id, &lock) {
        Ok(launch) => Ok(Claimed { launch, lock }),
        Err(e) => {
            // A failed launch leaves what it found: the name's lock file and the sessions
            // directory go again if it made them (unlinked while held, as --forget does).
            if !lock_existed {
                let _ = fs::remove_file(lock_path(state, name));
            }
            drop(lock);
            if !sessions_existed {
                let _ = fs::remove_dir(state.sessions());
            }
            Err(e)
        }
    }
}

/// The part of [`claim`] done under the name's lock.
fn claim_locked(
    state: &ProjectState,
    planned: &Launch,
    cwd: &Path,
    instance_id: &str,
    lock: &Flock<File>,
) -> Result<Launch> {
    let name = &planned.name;
    crate::host::fd::inherit(&**lock)
        .with_context(|| format!("cannot pass the lock of session `{name}` to bwrap"))?;
    remove_own_temporaries(state, name);
    let fresh = match planned.start {
        Start::Resume { .. } => new_uuid()?,
        Start::New | Start::Fresh { .. } => planned.uuid.clone(),
    };
    let (launch, rec) = decide_with(state, name, cwd, &fresh, planned.agent)?;
    match (&launch.start, rec) {
        // Codex chooses a new thread's id: recorded after the run (`learn_codex_thread`).
        (Start::New, _) if launch.agent == AgentId::Codex => {}
        (Start::Fresh { lost }, _) if launch.agent == AgentId::Codex => eprintln!(
            "claudebox: session `{name}`: its thread {lost} is no longer in this project's \
             ~/.codex; starting a new thread under that name"
        ),
        (Start::Resume { from: Some(dir) }, _) => {
            transcripts::move_here(&state.conversations(), &launch.uuid, dir, cwd)?
        }
        (Start::Resume { from: None }, _) => {}
        (Start::New, _) => write_record(
            state,
            &Record {
                name: name.clone(),
                uuid: launch.uuid.clone(),
                created: now(),
                replaced: Vec::new(),
                agent: None,
            },
        )?,
        (Start::Fresh { lost }, rec) => {
            let mut replaced = rec.map(|r| r.replaced).unwrap_or_default();
            replaced.push(lost.clone());
            write_record(
                state,
                &Record {
                    name: name.clone(),
                    uuid: launch.uuid.clone(),
                    created: now(),
                    replaced,
                    agent: None,
                },
            )?;
            eprintln!(
                "claudebox: {}",
                gone_note(name, lost, &launch.uuid, "starting")
            );
        }
    }
    let info = RunInfo::now(instance_id, cwd);
    write_run_info(state, name, &info)?;
    Ok(launch)
}

/// After a Codex run of a named session that began a thread (a new name, or one whose
/// thread had gone): finds the thread Codex made and records it, under the name's lock
/// still held by the launcher. The thread is the one whose id (a UUID v7, which holds its
/// creation time) is newer than the launch, no other name's, and started in this launch's
/// directory (its rollout's `session_meta`, read whole); with none (Codex quit before
/// the first message) nothing is recorded, and with several (another Codex sandbox of this project
/// started one meanwhile in the same directory, or `/new` inside) the newest is taken and
/// the line says so. Returns the line to print.
pub fn learn_codex_thread(
    state: &ProjectState,
    launch: &Launch,
    started: std::time::SystemTime,
    cwd: &Path,
) -> Result<Option<String>> {
    let lost = match &launch.start {
        Start::New => None,
        Start::Fresh { lost } => Some(lost.clone()),
        Start::Resume { .. } => return Ok(None),
    };
    let name = &launch.name;
    let others: Vec<String> = list::list(state)?
        .into_iter()
        .filter(|s| &s.name != name)
        .filter_map(|s| s.uuid)
        .collect();
    let mut new: Vec<(std::time::SystemTime, String)> = crate::state::codex_home::threads(state)
        .into_iter()
        .filter(|id| !others.contains(id))
        .filter_map(|id| Some((crate::state::codex_home::thread_time(&id)?, id)))
        .filter(|(t, _)| *t >= started)
        .collect();
    // Only a thread whose rollout says it started in this launch's directory: another
    // sandbox of this project may have started one meanwhile in another checkout, and a
    // rollout whose first line is still being written is another running Codex's (this
    // one has exited). Taking an unreadable one, or the only one, unchecked recorded
    // the other checkout's thread under this name when two began at once.
    new.retain(|(_, id)| crate::state::codex_home::thread_cwd(state, id).is_some_and(|d| d == cwd));
    new.sort();
    let Some((_, id)) = new.last().cloned() else {
        return Ok(Some(format!(
            "session `{name}`: Codex made no thread (it quit before the first message); \
             nothing recorded"
        )));
    };
    let old = read_record(state, name)?;
    let mut replaced = old.map(|r| r.replaced).unwrap_or_default();
    replaced.extend(lost);
    write_record(
        state,
        &Record {
            name: name.clone(),
            uuid: id.clone(),
            created: now(),
            replaced,
            agent: Some(AgentId::Codex.name().to_string()),
        },
    )?;
    Ok(Some(if new.len() > 1 {
        format!(
            "session `{name}`: Codex made {} threads during this run (another Codex sandbox \
             of this project, or /new); recorded the newest, {id}",
            new.len()
        )
    } else {
        format!("session `{name}` is Codex thread {id}")
    }))
}

/// Removes the temporary files of writes of this name's record and run note that a kill
/// interrupted (`.NAME.json.tmp.*`, `.NAME.running.tmp.*`). Only the holder of the name's
/// lock writes them, so under the lock any that exist are leftovers.
fn remove_own_temporaries(state: &ProjectState, name: &str) {
    let Ok(rd) = fs::read_dir(state.sessions()) else {
        return;
    };
    let prefixes = [
        format!(".{name}.json.tmp."),
        format!(".{name}.running.tmp."),
    ];
    for e in rd.flatten() {
        let file = e.file_name();
        let b = file.as_bytes();
        // The rest is `<pid>.<n>`: another name's files never match.
        let ours = prefixes.iter().any(|p| {
            b.strip_prefix(p.as_bytes()).is_some_and(|rest| {
                let mut parts = rest.split(|c| *c == b'.');
                let digits = |x: Option<&[u8]>| {
                    x.is_some_and(|x| !x.is_empty() && x.iter().all(u8::is_ascii_digit))
                };
                digits(parts.next()) && digits(parts.next()) && parts.next().is_none()
            })
        });
        if ours && e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Which conversation claude's own options pick, when they pick one (no `--session`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Picked {
    /// `--resume U`, `-r U`, `--session-id U` (with `=` too).
    Uuid(String),
    /// `--continue`/`-c`: the newest conversation of the current directory.
    Latest,
    /// `--resume`/`-r` without a UUID: claude's picker, decided inside.
    Picker,
}

/// Reads claude's arguments the way [`check_claude_args`] does. `--fork-session` writes a
/// new conversation, so it picks none to append to.
pub fn picked_by_args(args: &[OsString]) -> Option<Picked> {
    let mut picked = None;
    let mut it = args.iter().map(|a| a.as_bytes()).peekable();
    while let Some(b) = it.next() {
        if b == b"--" {
            break;
        }
        if b == b"--fork-session" {
            return None;
        }
        let value_of = |flag: &[u8]| -> Option<Option<&[u8]>> {
            if b == flag {
                Some(None)
            } else {
                b.strip_prefix(flag)
                    .and_then(|r| r.strip_prefix(b"="))
                    .map(Some)
            }
        };
        let uuid_or = |v: Option<&[u8]>, next: Option<&&[u8]>, otherwise: Picked| match v
            .or(next.copied())
            .and_then(|v| std::str::from_utf8(v).ok())
        {
            Some(u) if is_uuid(u) => Picked::Uuid(u.to_ascii_lowercase()),
            _ => otherwise,
        };
        if let Some(v) = value_of(b"--resume") {
            let next = if v.is_none() { it.peek() } else { None };
            picked = Some(uuid_or(v, next, Picked::Picker));
        } else if let Some(v) = value_of(b"--session-id") {
            let next = if v.is_none() { it.peek() } else { None };
            if let Picked::Uuid(u) = uuid_or(v, next, Picked::Picker) {
                picked = Some(Picked::Uuid(u));
            }
        } else if b == b"--continue" {
            picked = Some(Picked::Latest);
        } else if b.len() >= 2 && b[0] == b'-' && b[1] != b'-' {
            if let Some(rest) = b.strip_prefix(b"-r") {
                let v = (!rest.is_empty()).then_some(rest);
                let next = if v.is_none() { it.peek() } else { None };
                picked = Some(uuid_or(v, next, Picked::Picker));
            } else if b[1..].iter().all(u8::is_ascii_alphabetic) {
                if b[1..].contains(&b'r') {
                    picked = Some(Picked::Picker);
                } else if b[1..].contains(&b'c') {
                    picked = Some(Picked::Latest);
                }
            }
        }
    }
    picked
}

/// The newest transcript of `cwd`'s conversations directory, as `--continue` picks it.
fn latest_here(state: &ProjectState, cwd: &Path) -> Option<String> {
    transcripts::newest(&state.conversations(), cwd, is_uuid)
}

/// A launch without `--session` whose claude options pick a conversation: when that
/// conversation is a named session's, takes the name's lock for the sandbox's life, so
/// that the session and this launch never append to one transcript at once; refuses,
/// naming the running session, when it is held. Claude's picker (`--resume` without a
/// UUID) is refused while any named session of the project runs.
pub fn guard_picked(
    state: &ProjectState,
    args: &[OsString],
    cwd: &Path,
    instance_id: &str,
) -> Result<Option<Flock<File>>> {
    let uuid = match picked_by_args(args) {
        None => return Ok(None),
        Some(Picked::Uuid(u)) => u,
        Some(Picked::Latest) => match latest_here(state, cwd) {
            Some(u) => u,
            None => return Ok(None),
        },
        Some(Picked::Picker) => {
            for s in list::list(state)? {
                if s.running {
                    bail!(
                        "{} (claude's --resume picker could choose its conversation; name the \
                         conversation with --resume <uuid>, or quit the session first)",
                        busy(state, &s.name)
                    );
                }
            }
            return Ok(None);
        }
    };
    let Some(name) = list::list(state)?
        .into_iter()
        .find(|s| s.uuid.as_deref() == Some(uuid.as_str()))
        .map(|s| s.name)
    else {
        return Ok(None);
    };
    let Some(lock) = lock_name(state, &name)? else {
        bail!(
            "conversation {uuid} is session `{name}`'s: {}",
            busy(state, &name)
        );
    };
    crate::host::fd::inherit(&*lock)?;
    let info = RunInfo::now(instance_id, cwd);
    write_run_info(state, &name, &info)?;
    Ok(Some(lock))
}

/// `--forget NAME`: removes the record (the transcript stays). Refused while it runs.
pub fn forget(state: &ProjectState, name: &OsStr, dry_run: bool) -> Result<String> {
    let name = check_name(name)?;
    let path = record_path(state, &name);
    if fs::symlink_metadata(&path).is_err() {
        bail!(crate::policy::error::Fixable::new(
            format!("there is no session named `{name}` in this project"),
            "`claudebox --list` shows them"
        ));
    }
    let uuid = read_record(state, &name).ok().flatten().map(|r| r.uuid);
    let kept = match &uuid {
        Some(u) => format!(
            "its conversation {u} stays in {}",
            state.conversations().shown()
        ),
        None => "its record was unreadable".to_string(),
    };
    if dry_run {
        if is_running(state, &name) {
            bail!("{}", busy(state, &name));
        }
        return Ok(format!("would forget session `{name}` ({kept})"));
    }
    let Some(lock) = lock_name(state, &name)? else {
        bail!("{}", busy(state, &name));
    };
    fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.shown()))?;
    let _ = fs::remove_file(running_path(state, &name));
    let _ = fs::remove_file(lock_path(state, &name));
    File::open(state.sessions()).and_then(|d| d.sync_all()).ok();
    drop(lock);
    Ok(format!("forgot session `{name}` ({kept})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two Codex sandboxes of one project, one in each checkout, began a thread at once
    /// (CI, issue 25's test): the one ending first must record its own, not the other's
    /// newer one whose rollout's first line is still being written, and the other then
    /// its own. Control: with an unreadable rollout counted as this directory's (the old
    /// rule), the first records the other's and the second is left with the first's.
    #[test]
    fn a_codex_thread_is_learnt_only_from_a_whole_rollout_of_this_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let state = ProjectState {
            dir: tmp.path().to_path_buf(),
        };
        let day = state.codex_home().join("sessions/2026/11/28");
        fs::create_dir_all(&day).unwrap();
        fs::create_dir_all(state.sessions()).unwrap();
        let started = std::time::UNIX_EPOCH + std::time::Duration::from_millis(0x01a2_2309_c000);
        let (wt, top) = (Path::new("/p/wt"), Path::new("/p/top"));
        let (delta, gamma) = (
            "01a22309-c2bd-7d90-91da-c47a3d250e0d",
            "01a22309-c3b4-7f21-bd72-ece74abb4e5b",
        );
        let meta = |cwd: &Path| {
            let big = "x".repeat(300_000);
            format!(
                "{}\n{{\"type\":\"event\"}}\n",
                serde_json::json!({"type": "session_meta",
                    "payload": {"cwd": cwd, "instructions": big}})
            )
        };
        let rollout = |id: &str| day.join(format!("rollout-2026-11-28T16-42-52-{id}.jsonl"));
        fs::write(rollout(delta), meta(wt)).unwrap();
        let whole = meta(top);
        fs::write(rollout(gamma), &whole[..whole.len() / 2]).unwrap();
        let launch = |name: &str| Launch {
            name: name.into(),
            uuid: String::new(),
            start: Start::New,
            agent: AgentId::Codex,
        };
        let learnt = |name: &str, cwd: &Path| {
            learn_codex_thread(&state, &launch(name), started, cwd).unwrap();
            read_record(&state, name).unwrap().map(|r| r.uuid)
        };
        assert_eq!(learnt("delta", wt).as_deref(), Some(delta));
        fs::write(rollout(gamma), &whole).unwrap();
        assert_eq!(learnt("gamma", top).as_deref(), Some(gamma));
        // A thread of this directory from before the launch is not this run's.
        let late = started + std::time::Duration::from_secs(3600);
        let line = learn_codex_thread(&state, &launch("later"), late, top).unwrap();
        assert!(line.unwrap().contains("Codex made no thread"));
        assert!(read_record(&state, "later").unwrap().is_none());
    }

    #[test]
    fn which_conversation_claudes_options_pick() {
        let u = "0123abcd-0000-4000-8000-00000000beef";
        let pick =
            |args: &[&str]| picked_by_args(&args.iter().map(OsString::from).collect::<Vec<_>>());
        let uuid = Some(Picked::Uuid(u.into()));
        assert_eq!(pick(&["--resume", u]), uuid);
        assert_eq!(pick(&[&format!("--resume={u}")]), uuid);
        assert_eq!(pick(&["-r", u, "-p", "x"]), uuid);
        assert_eq!(pick(&[&format!("-r{u}")]), uuid);
        assert_eq!(pick(&["--session-id", u]), uuid);
        assert_eq!(pick(&["--continue"]), Some(Picked::Latest));
        assert_eq!(pick(&["-pc", "x"]), Some(Picked::Latest));
        assert_eq!(pick(&["--resume"]), Some(Picked::Picker));
        assert_eq!(pick(&["-r", "search words"]), Some(Picked::Picker));
        assert_eq!(pick(&["--resume", u, "--fork-session"]), None);
        assert_eq!(pick(&["-p", "--", "--resume", u]), None);
        assert_eq!(pick(&["-p", "hi"]), None);
    }

    #[test]
    fn names() {
        for ok in ["a", "reviewer", "Builder-2", "x.y_z", &"n".repeat(64)] {
            assert_eq!(check_name(OsStr::new(ok)).unwrap(), ok);
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "-x",
            "a/b",
            "../x",
            "a b",
            "a\nb",
            "é",
            "a\0b",
            &"n".repeat(65),
        ] {
            assert!(check_name(OsStr::new(bad)).is_err(), "{bad:?} accepted");
        }
        assert!(check_name(OsStr::from_bytes(b"a\xffb")).is_err());
    }

    #[test]
    fn uuids_are_v4() {
        let u = new_uuid().unwrap();
        assert!(is_uuid(&u), "{u}");
        assert_eq!(&u[14..15], "4");
        assert!("89ab".contains(&u[19..20]), "{u}");
        assert_ne!(u, new_uuid().unwrap());
        assert!(!is_uuid("--dangerously-skip-permissions-xxxxxx"));
    }

    #[test]
    fn conflicting_claude_args() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        for bad in [
            &["--resume"][..],
            &["-r"],
            &["-rabc"],
            &["--resume=x"],
            &["-c"],
            &["--continue"],
            &["-pc"],
            &["--session-id", "x"],
            &["--fork-session"],
        ] {
            assert!(check_claude_args("n", &args(bad)).is_err(), "{bad:?}");
        }
        for ok in [
            &["-p", "hi"][..],
            &["--model", "opus"],
            &["--", "-c"],
            &["fix -c"],
            &["--print"],
        ] {
            assert!(check_claude_args("n", &args(ok)).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn resume_or_new_flags() {
        let mut l = Launch {
            name: "n".into(),
            uuid: "u".into(),
            start: Start::New,
            agent: AgentId::Claude,
        };
        assert_eq!(
            l.claude_args(),
            [OsString::from("--session-id"), OsString::from("u")]
        );
        l.start = Start::Resume { from: None };
        assert_eq!(
            l.claude_args(),
            [OsString::from("--resume"), OsString::from("u")]
        );
    }

    #[test]
    fn the_plan_puts_the_conversation_first_and_names_the_session() {
        use crate::policy::plan::{build, Command, EnvOp, Inputs};
        let inputs = |session: Option<Launch>| Inputs {
            project: crate::policy::facts::Project {
                root: "/p".into(),
                work_tree: "/p".into(),
                git_dir: None,
                common_dir: None,
                cwd: "/p/sub".into(),
            },
            home: "/home/u".into(),
            state: ProjectState { dir: "/s".into() },
            claude: None,
            command: Command::Claude(vec!["-p".into(), "hi".into()]),
            instance_id: "i".into(),
            host: Default::default(),
            session,
            ..crate::policy::plan::tests::test_inputs()
        };
        let launch = Launch {
            name: "rev".into(),
            uuid: "u".into(),
            start: Start::Resume { from: None },
            agent: AgentId::Claude,
        };
        let plan = build(&inputs(Some(launch)));
        let tail: Vec<_> = plan.argv[3..].iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(plan.argv[1], "--append-system-prompt");
        assert_eq!(tail, ["--resume", "u", "-p", "hi"]);
        assert!(plan
            .env
            .contains(&EnvOp::Set("CLAUDEBOX_SESSION".into(), "rev".into())));
        let plan = build(&inputs(None));
        assert_eq!(plan.argv.len(), 5);
        assert!(plan.env.contains(&EnvOp::Unset("CLAUDEBOX_SESSION".into())));
    }
}
