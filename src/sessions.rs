//! Named sessions: `claudebox --session NAME` comes back to its own conversation, from any
//! directory or worktree of the project, and never to another name's.
//!
//! ```text
//! projects/<id>/sessions/       mode 0700
//! ├── <name>.json     the record: {"name", "uuid", "created", "replaced"}, mode 0600,
//! │                   written atomically, only by the holder of <name>.lock
//! ├── <name>.lock     flock held exclusively by the sandbox running <name> (bwrap
//! │                   inherits the descriptor through exec); `--list` probes it shared
//! └── <name>.running  who took the lock last: pid, instance id, start time, cwd
//! ```
//!
//! The decision (new conversation, resume, or fresh because the transcript is gone) is
//! made read-only before planning ([`prepare`]), and made again under the name's lock at
//! exec time ([`claim`]), which alone writes the record and moves the transcript.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::host;
use crate::state::{self, ProjectState};
use crate::transcripts::{self, Found};

/// Longest accepted name, in bytes.
pub const MAX_NAME: usize = 64;

/// What a named launch does; data for the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub name: String,
    /// The conversation claude is started with.
    pub uuid: String,
    pub start: Start,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// No record yet: `--session-id <uuid>`, record it.
    New,
    /// `--resume <uuid>`; `from` names the conversations directory the transcript is
    /// moved out of first, when the session last ran in another directory.
    Resume { from: Option<OsString> },
    /// The recorded conversation `lost` has no transcript: a new one under the same name.
    Fresh { lost: String },
}

impl Launch {
    /// The options claude gets before the user's arguments.
    pub fn claude_args(&self) -> [OsString; 2] {
        let flag = match self.start {
            Start::Resume { .. } => "--resume",
            Start::New | Start::Fresh { .. } => "--session-id",
        };
        [flag.into(), self.uuid.clone().into()]
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    name: String,
    uuid: String,
    created: String,
    /// Earlier conversations of this name whose transcripts had gone.
    #[serde(default)]
    replaced: Vec<String>,
}

/// Who holds (or last held) a name's lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    pub pid: u32,
    pub instance: String,
    pub started: String,
    pub cwd: String,
}

/// One named session, for `--list`.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub name: String,
    pub uuid: Option<String>,
    pub running: bool,
    pub last_run: Option<RunInfo>,
    /// Why the record could not be read, if it could not.
    pub problem: Option<String>,
}

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
            bail!(
                "`--session {name}` chooses the conversation itself, so claude's `{}` cannot \
                 be used with it; drop it (to start this name over: `claudebox --forget {name}`)",
                a.to_string_lossy()
            );
        }
    }
    Ok(())
}

fn record_path(state: &ProjectState, name: &str) -> PathBuf {
    state.sessions().join(format!("{name}.json"))
}
fn lock_path(state: &ProjectState, name: &str) -> PathBuf {
    state.sessions().join(format!("{name}.lock"))
}
fn running_path(state: &ProjectState, name: &str) -> PathBuf {
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

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Reads a record; `None` when there is none. Anything else wrong is an error that
/// names the file: a record is never silently replaced.
fn read_record(state: &ProjectState, name: &str) -> Result<Option<Record>> {
    let path = record_path(state, name);
    let mut bytes = Vec::new();
    let read = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .and_then(|mut f| f.read_to_end(&mut bytes));
    match read {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!(
            "cannot read the record of session `{name}`, {} ({e}); fix it (nothing was changed)",
            path.display()
        ),
    }
    let corrupted = |why: String| {
        anyhow::anyhow!(
            "the record of session `{name}`, {}, is corrupted ({why}); repair it, or remove it \
             with `claudebox --forget {name}` (its conversation transcripts stay in {})",
            path.display(),
            state.conversations().display()
        )
    };
    let rec: Record = serde_json::from_slice(&bytes).map_err(|e| corrupted(e.to_string()))?;
    if rec.name != name {
        return Err(corrupted(format!("it names session `{}`", rec.name)));
    }
    if !is_uuid(&rec.uuid) {
        return Err(corrupted(format!("`{}` is not a UUID", rec.uuid)));
    }
    Ok(Some(rec))
}

fn write_record(state: &ProjectState, rec: &Record) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(rec)?;
    bytes.push(b'\n');
    state::write_atomic(&record_path(state, &rec.name), &bytes, 0o600)
}

fn decide_with(
    state: &ProjectState,
    name: &str,
    cwd: &Path,
    fresh: &str,
) -> Result<(Launch, Option<Record>)> {
    let rec = read_record(state, name)?;
    let (uuid, start) = match &rec {
        None => (fresh.to_string(), Start::New),
        Some(r) => match transcripts::find(&state.conversations(), &r.uuid, cwd)? {
            Found::Here => (r.uuid.clone(), Start::Resume { from: None }),
            Found::Elsewhere(dir) => (r.uuid.clone(), Start::Resume { from: Some(dir) }),
            Found::Nowhere => (
                fresh.to_string(),
                Start::Fresh {
                    lost: r.uuid.clone(),
                },
            ),
        },
    };
    let launch = Launch {
        name: name.to_string(),
        uuid,
        start,
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
) -> Result<Launch> {
    let name = check_name(name)?;
    check_claude_args(&name, args)?;
    Ok(decide_with(state, &name, cwd, &new_uuid()?)?.0)
}

/// What `--dry-run` says about a named launch (on stderr).
pub fn dry_run_note(state: &ProjectState, l: &Launch, cwd: &Path) -> String {
    let n = &l.name;
    match &l.start {
        Start::New => format!(
            "session `{n}`: would start a new conversation {} and record it in {}",
            l.uuid,
            record_path(state, n).display()
        ),
        Start::Resume { from: None } => format!("session `{n}`: would resume {}", l.uuid),
        Start::Resume { from: Some(d) } => format!(
            "session `{n}`: would resume {} after moving its transcript from {} to {}",
            l.uuid,
            state.conversations().join(d).display(),
            state
                .conversations()
                .join(transcripts::dir_name(cwd))
                .display()
        ),
        Start::Fresh { lost } => format!("{} (would)", gone_note(n, lost, &l.uuid)),
    }
}

fn gone_note(name: &str, lost: &str, uuid: &str) -> String {
    format!(
        "session `{name}`: its conversation {lost} has no transcript in this project (deleted, \
         or claude quit before the first message); starting a new conversation {uuid} under \
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
    mkdir_private(&state.sessions())?;
    let Some(lock) = lock_name(state, name)? else {
        bail!("{}", busy(state, name));
    };
    fcntl(lock.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))?;
    let fresh = match planned.start {
        Start::Resume { .. } => new_uuid()?,
        Start::New | Start::Fresh { .. } => planned.uuid.clone(),
    };
    let (launch, rec) = decide_with(state, name, cwd, &fresh)?;
    match (&launch.start, rec) {
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
                },
            )?;
            eprintln!("claudebox: {}", gone_note(name, lost, &launch.uuid));
        }
    }
    let info = RunInfo {
        pid: std::process::id(),
        instance: instance_id.to_string(),
        started: now(),
        cwd: cwd.to_string_lossy().into_owned(),
    };
    let mut bytes = serde_json::to_vec(&info)?;
    bytes.push(b'\n');
    state::write_atomic_volatile(&running_path(state, name), &bytes, 0o600)?;
    Ok(Claimed { launch, lock })
}

fn mkdir_private(dir: &Path) -> Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists && fs::symlink_metadata(dir)?.is_dir() => {
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("cannot create {}", dir.display())),
    }
}

/// The name's lock, or `None` when a running session (or `--forget`) holds it.
fn lock_name(state: &ProjectState, name: &str) -> Result<Option<Flock<File>>> {
    let path = lock_path(state, name);
    loop {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
        }
        let f = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => continue, // forgotten meanwhile
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        };
        let Some(lock) = lock_exclusive(f, &path)? else {
            return Ok(None);
        };
        // `--forget` unlinks the lock file while holding it: ours must still be in place.
        let held = lock.metadata()?;
        if let Ok(now) = fs::symlink_metadata(&path) {
            if now.ino() == held.ino() && now.dev() == held.dev() {
                return Ok(Some(lock));
            }
        }
    }
}

/// Exclusive, non-blocking. A shared holder is only `--list` looking for an instant, so
/// that is waited out; an exclusive holder is a running session: `None`.
fn lock_exclusive(mut f: File, path: &Path) -> Result<Option<Flock<File>>> {
    let fail = |e: Errno| anyhow::Error::from(e).context(format!("cannot lock {}", path.display()));
    loop {
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(Some(l)),
            Err((back, Errno::EWOULDBLOCK)) => f = back,
            Err((_, e)) => return Err(fail(e)),
        }
        match Flock::lock(f, FlockArg::LockSharedNonblock) {
            Ok(l) => {
                f = l.unlock().map_err(|(_, e)| fail(e))?;
                std::thread::yield_now();
            }
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(fail(e)),
        }
    }
}

/// Whether a session holds its lock, probed with a shared lock released at once.
fn is_running(state: &ProjectState, name: &str) -> bool {
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(lock_path(state, name))
    else {
        return false;
    };
    matches!(
        Flock::lock(f, FlockArg::LockSharedNonblock),
        Err((_, Errno::EWOULDBLOCK))
    )
}

fn read_run_info(state: &ProjectState, name: &str) -> Option<RunInfo> {
    let bytes = fs::read(running_path(state, name)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The refusal for a name that is in use, naming the sandbox that runs it.
fn busy(state: &ProjectState, name: &str) -> String {
    let alive = |pid: u32| {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        !matches!(nix::sys::signal::kill(pid, None), Err(Errno::ESRCH))
    };
    match read_run_info(state, name).filter(|i| alive(i.pid)) {
        Some(i) => format!(
            "session `{name}` is already running: pid {}, started {} in {}, \
             CLAUDEBOX_INSTANCE_ID={}; quit it first, or use another name",
            i.pid, i.started, i.cwd, i.instance
        ),
        None => format!(
            "session `{name}` is already running (another claudebox is starting it right \
             now); quit it first, or use another name"
        ),
    }
}

/// The named sessions of one project, by name. A record that cannot be read is listed
/// with its problem rather than failing the whole list.
pub fn list(state: &ProjectState) -> Result<Vec<SessionInfo>> {
    let dir = state.sessions();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut out = Vec::new();
    for entry in entries {
        let file = entry?.file_name();
        let Some(name) = file.as_bytes().strip_suffix(b".json") else {
            continue;
        };
        let Ok(name) = check_name(OsStr::from_bytes(name)) else {
            continue;
        };
        let (uuid, problem) = match read_record(state, &name) {
            Ok(Some(r)) => (Some(r.uuid), None),
            Ok(None) => continue,
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        out.push(SessionInfo {
            running: is_running(state, &name),
            last_run: read_run_info(state, &name),
            name,
            uuid,
            problem,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// `--forget NAME`: removes the record (the transcript stays). Refused while it runs.
pub fn forget(state: &ProjectState, name: &OsStr, dry_run: bool) -> Result<String> {
    let name = check_name(name)?;
    let path = record_path(state, &name);
    if fs::symlink_metadata(&path).is_err() {
        bail!("there is no session named `{name}` in this project; `claudebox --list` shows them");
    }
    let uuid = read_record(state, &name).ok().flatten().map(|r| r.uuid);
    let kept = match &uuid {
        Some(u) => format!(
            "its conversation {u} stays in {}",
            state.conversations().display()
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
    fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    let _ = fs::remove_file(running_path(state, &name));
    let _ = fs::remove_file(lock_path(state, &name));
    File::open(state.sessions()).and_then(|d| d.sync_all()).ok();
    drop(lock);
    Ok(format!("forgot session `{name}` ({kept})"))
}

/// A minimal `--list`: every project's named sessions, one row each.
pub fn list_all(home: &state::StateHome) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    writeln!(
        out,
        "# project root\tsession\tconversation\tstate\tlast started"
    )?;
    let mut ids: Vec<OsString> = match fs::read_dir(home.projects()) {
        Ok(e) => e.filter_map(|e| e.ok().map(|e| e.file_name())).collect(),
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read {}", home.projects().display()))
        }
    };
    ids.sort();
    for id in ids {
        let state = home.project(&id.to_string_lossy());
        let root = fs::read(state.root_file()).unwrap_or_else(|_| b"?".to_vec());
        for s in list(&state)? {
            out.extend_from_slice(&root);
            let state_word = if s.running { "running" } else { "stopped" };
            let last = s
                .last_run
                .map(|r| format!("{} in {}", r.started, r.cwd))
                .unwrap_or_else(|| "-".into());
            match s.problem {
                None => writeln!(
                    out,
                    "\t{}\t{}\t{state_word}\t{last}",
                    s.name,
                    s.uuid.unwrap_or_default()
                )?,
                Some(p) => writeln!(out, "\t{}\t-\t{state_word}\tunreadable: {p}", s.name)?,
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
