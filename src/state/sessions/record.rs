//! A session's record, `sessions/<name>.json`: which conversation the name stands for.
//! Read strictly (anything unexpected is an error naming the file, never replaced) and
//! written atomically, mode 0600, by the holder of the name's lock only.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{is_uuid, record_path};
use crate::policy::escape::Shown;
use crate::state::{self, ProjectState};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    pub uuid: String,
    pub created: String,
    /// Earlier conversations of this name whose transcripts had gone.
    #[serde(default)]
    pub replaced: Vec<String>,
    /// The agent whose conversation it is; absent for Claude Code (records written before
    /// there were two agents have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

impl Record {
    /// The agent's name, `claude` when the record names none.
    pub fn agent_name(&self) -> &str {
        self.agent.as_deref().unwrap_or("claude")
    }
}

pub fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Reads a record; `None` when there is none. Anything else wrong is an error that
/// names the file: a record is never silently replaced.
pub fn read_record(state: &ProjectState, name: &str) -> Result<Option<Record>> {
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
        Err(e) => bail!(crate::policy::error::Fixable::new(
            format!(
                "cannot read the record of session `{name}`, {} ({e})",
                path.shown()
            ),
            "fix it (nothing was changed)"
        )
        .at(&path)),
    }
    let corrupted = |why: String| {
        anyhow::Error::new(
            crate::policy::error::Fixable::new(
                format!(
                    "the record of session `{name}`, {}, is corrupted ({why})",
                    path.shown()
                ),
                format!(
                    "repair it, or remove it with `claudebox --forget {name}` (its conversation \
                     transcripts stay in {})",
                    state.conversations().shown()
                ),
            )
            .at(&path),
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

pub fn write_record(state: &ProjectState, rec: &Record) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(rec)?;
    bytes.push(b'\n');
    state::write_atomic(&record_path(state, &rec.name), &bytes, 0o600)
        .with_context(|| format!("recording session `{}`", rec.name))
}
