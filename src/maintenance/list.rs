//! `--list`: one row per project directory (id, root, whether it still exists, last used,
//! running sandboxes; with `--sizes` the size on disk), as a table or, with `--json`, for
//! scripts. Sizes are on request: they need a walk of every project's whole state (~40
//! entries each from a real launch), the rest reads ~10 of them, so `--list` over 10,000
//! projects stays well under a second without them.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use serde::Serialize;

use crate::host;
use crate::maintenance::gc::{self, Verdict};
use crate::state::inventory::{self, show, Detail, Exists, ProjectEntry, Root};
use crate::state::StateHome;

#[derive(Serialize)]
struct Row<'a> {
    id: &'a str,
    state_dir: String,
    /// The root as text (non-UTF-8 bytes replaced); `null` when `project-root` is unusable.
    root: Option<String>,
    /// The root's exact bytes in hex, only when they are not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    root_bytes_hex: Option<String>,
    /// `null` when unknown (unusable `project-root`, or lstat failed).
    root_exists: Option<bool>,
    /// Why `root` or `root_exists` is `null`.
    problem: Option<String>,
    /// With `--sizes`; `null` without.
    size_bytes: Option<u64>,
    last_used: Option<String>,
    last_used_unix: Option<u64>,
    running: usize,
    sessions: &'a [serde_json::Value],
    /// What `--gc` would do: "live", "kept", "waiting" or "removable".
    gc: &'static str,
    /// Why (null when live).
    gc_reason: Option<String>,
    /// When a "waiting" project becomes removable if its root stays missing and unused.
    gc_removable_after: Option<String>,
    /// The newest transcript of the project: `claudebox --resume <uuid>` from the
    /// project continues it. `null` when there is none.
    last_conversation: Option<LastConversation>,
    /// Entries the exit review moved aside (`claudebox --restore ID` puts one back).
    quarantined: usize,
    /// The agents whose state the project holds: "claude", "codex".
    agents: &'a [&'static str],
}

/// A project's most recently written conversation.
#[derive(Serialize)]
struct LastConversation {
    uuid: String,
    /// When its transcript was last written.
    time: String,
    time_unix: u64,
}

/// The newest conversation the inventory's walk found, as `--list` shows it.
fn last_conversation(e: &ProjectEntry) -> Option<LastConversation> {
    let (t, uuid) = e.last_conversation.as_ref()?;
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Some(LastConversation {
        uuid: uuid.clone(),
        time: utc(secs, 'T', true) + "Z",
        time_unix: secs,
    })
}

pub fn run(json: bool, margin_flag: Option<&str>, sizes: bool) -> Result<ExitCode> {
    let margin = gc::margin(margin_flag)?.value;
    let now = SystemTime::now();
    let home = StateHome::from_env(&host::home_dir()?)?;
    let detail = Detail {
        size: sizes,
        running: true,
    };
    let mut inv = inventory::scan(&home, detail)?;
    for s in &inv.skipped {
        eprintln!("claudebox: list: skipped {}: {}", show(&s.path), s.why);
    }
    for e in &inv.entries {
        // A sandbox whose claudebox was killed left its exit review undone: done now
        // (looked at only where the inventory saw a record waiting).
        if e.review_pending {
            let st = crate::policy::layout::ProjectState { dir: e.dir.clone() };
            crate::state::review::missed(&st, None, &mut std::io::stderr());
        }
        for (slot, pids) in &e.stuck {
            eprintln!(
                "claudebox: list: {}",
                crate::host::holders::reap_or_name(slot, pids, &show(slot))
            );
        }
    }
    // Most recently used first.
    inv.entries
        .sort_by(|a, b| b.last_used.cmp(&a.last_used).then(a.id.cmp(&b.id)));
    let text = if json {
        let rows: Vec<Row> = inv
            .entries
            .iter()
            .map(|e| row(e, gc::verdict(e, margin, now)))
            .collect();
        serde_json::to_string_pretty(&rows)? + "\n"
    } else if inv.entries.is_empty() {
        eprintln!(
            "claudebox: list: no project state in {}",
            show(&home.projects())
        );
        String::new()
    } else {
        table(&inv.entries, margin, now, sizes)
    };
    write_stdout(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// Writes a report to stdout; a reader that went away (`| head`) is not an error.
pub fn write_stdout(bytes: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn row(e: &ProjectEntry, v: Verdict) -> Row<'_> {
    let (root, root_bytes_hex, root_exists, problem) = match &e.root {
        Root::Recorded { path, exists } => {
            let bytes = path.as_os_str().as_bytes();
            let hex_bytes = std::str::from_utf8(bytes)
                .is_err()
                .then(|| hex::encode(bytes));
            let (ex, problem) = match exists {
                Exists::Yes => (Some(true), None),
                Exists::No => (Some(false), None),
                Exists::Unknown(err) => {
                    (None, Some(format!("cannot tell whether it exists: {err}")))
                }
            };
            (
                Some(path.to_string_lossy().into_owned()),
                hex_bytes,
                ex,
                problem,
            )
        }
        Root::Problem(p) => (None, None, None, Some(p.clone())),
    };
    let unix = e
        .last_used
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs());
    Row {
        id: &e.id,
        state_dir: e.dir.to_string_lossy().into_owned(),
        root,
        root_bytes_hex,
        root_exists,
        problem,
        size_bytes: e.size,
        last_used: unix.map(|s| utc(s, 'T', true) + "Z"),
        last_used_unix: unix,
        running: e.running.unwrap_or(0),
        sessions: &e.sessions,
        agents: &e.agents,
        gc: match v {
            Verdict::Live => "live",
            Verdict::Kept(_) => "kept",
            Verdict::Waiting { .. } => "waiting",
            Verdict::Removable { .. } => "removable",
        },
        gc_removable_after: match &v {
            Verdict::Waiting { after, .. } => after
                .duration_since(UNIX_EPOCH)
                .ok()
                .map(|d| utc(d.as_secs(), 'T', true) + "Z"),
            _ => None,
        },
        gc_reason: match v {
            Verdict::Live => None,
            Verdict::Kept(w) | Verdict::Waiting { why: w, .. } | Verdict::Removable { why: w } => {
                Some(w)
            }
        },
        last_conversation: last_conversation(e),
        quarantined: e.quarantined,
    }
}

fn table(
    entries: &[ProjectEntry],
    margin: std::time::Duration,
    now: SystemTime,
    sizes: bool,
) -> String {
    // The SIZE column only with --sizes.
    let size = |v: String| {
        if sizes {
            format!("{v:>9}  ")
        } else {
            String::new()
        }
    };
    let mut s = format!(
        "{:<16}  {:>7}  {:<6}  {}{:<17}  {:<16}  {}\n",
        "ID",
        "RUNNING",
        "EXISTS",
        size("SIZE".into()),
        "LAST USED (UTC)",
        "GC",
        "ROOT"
    );
    for e in entries {
        let (exists, root) = match &e.root {
            Root::Recorded { path, exists } => (
                match exists {
                    Exists::Yes => "yes",
                    Exists::No => "no",
                    Exists::Unknown(_) => "?",
                },
                show(path),
            ),
            Root::Problem(p) => ("?", format!("({p})")),
        };
        let last = e
            .last_used
            .filter(|t| *t <= now)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or_else(|| "-".to_string(), |d| utc(d.as_secs(), ' ', false));
        let gc = match gc::verdict(e, margin, now) {
            Verdict::Live => "-".to_string(),
            Verdict::Kept(_) => "kept".to_string(),
            Verdict::Waiting { after, .. } => after.duration_since(UNIX_EPOCH).map_or_else(
                |_| "waiting".into(),
                |d| {
                    format!(
                        "after {}",
                        utc(d.as_secs(), ' ', false).split(' ').next().unwrap_or("")
                    )
                },
            ),
            Verdict::Removable { .. } => "removable".to_string(),
        };
        s.push_str(&format!(
            "{:<16}  {:>7}  {:<6}  {}{:<17}  {:<16}  {}\n",
            e.id,
            e.running.unwrap_or(0),
            exists,
            size(human_size(e.size.unwrap_or(0))),
            last,
            gc,
            root
        ));
        if let Some(c) = last_conversation(e) {
            s.push_str(&format!(
                "{:<16}  last conversation\t{}\t{}\n",
                "",
                c.uuid,
                utc(c.time_unix, ' ', false)
            ));
        }
        // Only when it is not Claude Code's alone (the default), so most tables stay short.
        if e.agents.iter().any(|a| *a != "claude") {
            s.push_str(&format!("{:<16}  agents\t{}\n", "", e.agents.join(", ")));
        }
        if e.quarantined > 0 {
            s.push_str(&format!(
                "{:<16}  moved aside by the exit review\t{}\t{}\n",
                "",
                e.quarantined,
                show(&e.dir.join(crate::policy::layout::QUARANTINE_DIR))
            ));
        }
        for n in &e.sessions {
            let text = |k: &str| n.get(k).and_then(|v| v.as_str()).unwrap_or("-").to_string();
            let state = match (n.get("running").and_then(|v| v.as_bool()), n.get("problem")) {
                (_, Some(p)) if !p.is_null() => format!("unreadable: {}", text("problem")),
                (Some(true), _) => "running".to_string(),
                _ => "stopped".to_string(),
            };
            s.push_str(&format!(
                "{:<16}  session\t{}\t{}\t{state}\t{}\n",
                "",
                text("name"),
                text("uuid"),
                text("last_started")
            ));
        }
    }
    s
}

/// `1.5 KiB`-style sizes.
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Seconds since the epoch as a UTC date and time: `YYYY-MM-DD<sep>HH:MM[:SS]`
/// (humantime's RFC 3339 form; times past 9999, which it cannot print, as its last second).
fn utc(t: u64, sep: char, seconds: bool) -> String {
    const LAST: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t.min(LAST));
    // `YYYY-MM-DDTHH:MM:SSZ`: ASCII, so the byte ranges below are characters.
    let full = humantime::format_rfc3339_seconds(at).to_string();
    let end = if seconds { 19 } else { 16 };
    format!("{}{sep}{}", &full[..10], &full[11..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0, 'T', true), "1970-01-01T00:00:00");
        // `date -u -d @1700000000` = Tue Nov 14 22:13:20 UTC 2023
        assert_eq!(utc(1_700_000_000, ' ', false), "2023-11-14 22:13");
        // A leap day: `date -u -d 2024-02-29T12:34:56Z +%s` = 1709210096
        assert_eq!(utc(1_709_210_096, 'T', true), "2024-02-29T12:34:56");
        // A last-used time a sandbox could set far ahead prints, rather than panics.
        assert_eq!(utc(u64::MAX, ' ', false), "9999-12-31 23:59");
    }

    #[test]
    fn sizes_are_human() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(4096), "4.0 KiB");
        assert_eq!(human_size(1536 * 1024), "1.5 MiB");
    }
}
