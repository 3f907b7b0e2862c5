//! `--list` for named sessions: each project's names, conversations, and whether each runs.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;

use anyhow::{Context, Result};

use super::check_name;
use super::lock::{is_running, read_run_info, RunInfo};
use super::record::read_record;
use crate::state::{self, ProjectState};

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
