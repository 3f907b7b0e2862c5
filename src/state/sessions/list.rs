//! `--list` for named sessions: each project's names, conversations, and whether each runs.

use std::ffi::OsStr;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;

use anyhow::{Context, Result};

use super::check_name;
use super::lock::{is_running, read_run_info, RunInfo};
use super::record::read_record;
use crate::policy::escape::Shown;
use crate::state::ProjectState;

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
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.shown())),
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
