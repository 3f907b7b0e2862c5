//! `--gc`: remove the state of projects whose root has been gone for a while, and nothing
//! else.
//!
//! A project directory is removed only when all of these hold: it is a real directory
//! under `projects/` with a claudebox name (never a symlink, never followed); its
//! `project-root` is readable, valid and names a path that lstat says is gone, on a file
//! system that is there (a root under an unmounted disk, an empty mount point or an
//! unplugged drive is "unknown", never gone: see `mounts.rs`); an earlier `--gc` first
//! found it missing at least the margin ago (`root-missing-since`, default 7 days,
//! `--gc-margin` or `gc_margin` in the config file) and it was not used (launched)
//! within the margin either; no sandbox runs on it; and all of that still holds once
//! `--gc` holds its `lock`. It is then renamed to `projects/.gc-*` (so no launch can
//! register in it any more) and removed without following any symlink inside, making
//! directories the agent locked (`chmod 000`) writable again as it goes. A root found
//! again clears its `root-missing-since`. Everything else is kept, and every directory
//! kept for a reason other than "its project exists" is reported with the reason.
//!
//! It also removes what interrupted runs left: temporary files of a killed write
//! (`.*.tmp.*`, older than [`STALE`]) and half-made project directories of a killed first
//! launch (`projects/.new-*`, older than [`STALE`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use crate::config;
use crate::host;
use crate::state::beneath::{self, Dir};
use crate::state::inuse::{self, GcLock};
use crate::state::inventory::{self, show, Detail, Exists, ProjectEntry, Root, TRASH_PREFIX};
use crate::state::{self, StateHome};

/// How long a root must have been seen missing (and the project unused) by default.
pub const DEFAULT_MARGIN: Duration = Duration::from_secs(7 * 86_400);

/// A temporary file or half-made directory older than this was left by a killed run
/// (a write or a first launch takes milliseconds).
pub const STALE: Duration = Duration::from_secs(600);

/// The margin and where it came from.
#[derive(Debug, Clone)]
pub struct Margin {
    pub value: Duration,
    pub source: String,
}

impl Margin {
    pub fn shown(&self) -> String {
        if self.value.is_zero() {
            "0".into()
        } else {
            humantime::format_duration(self.value).to_string()
        }
    }
}

fn parse_margin(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s.trim()).map_err(|e| e.to_string())
}

/// `--gc-margin`, else `gc_margin` in the config file, else [`DEFAULT_MARGIN`].
pub fn margin(cli: Option<&str>) -> Result<Margin> {
    if let Some(s) = cli {
        let value = parse_margin(s).map_err(|e| {
            crate::policy::error::Fixable::new(
                format!("--gc-margin {s:?}: {e}"),
                "give a duration such as 7d, 12h or 0",
            )
        })?;
        return Ok(Margin {
            value,
            source: "--gc-margin".into(),
        });
    }
    let file = config::location(&host::home_dir()?);
    if let Some(f) = config::load(&file)? {
        if let Some(m) = &f.global.gc_margin {
            let value = parse_margin(m.get_ref()).map_err(|e| {
                f.error(
                    &m.span(),
                    format!("gc_margin: {e}; give a duration such as \"7d\", \"12h\" or \"0\""),
                )
            })?;
            return Ok(Margin {
                value,
                source: format!("gc_margin in {}", show(&file)),
            });
        }
    }
    Ok(Margin {
        value: DEFAULT_MARGIN,
        source: "the default".into(),
    })
}

/// What `--gc` does with a project, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The project exists.
    Live,
    /// Kept for as long as the reason holds.
    Kept(String),
    /// Root missing: kept until `after`, then removable if still missing and unused.
    Waiting { why: String, after: SystemTime },
    /// Removable now: its root has been missing (and it unused) for the whole margin.
    Removable { why: String },
}

/// The decision for one project (`--gc` acts on it, `--list` shows it).
pub fn verdict(e: &ProjectEntry, margin: Duration, now: SystemTime) -> Verdict {
    let root = match &e.root {
        Root::Problem(p) => return Verdict::Kept(format!("{p}; remove it by hand if unused")),
        Root::Recorded {
            exists: Exists::Yes,
            ..
        } => return Verdict::Live,
        Root::Recorded {
            path,
            exists: Exists::Unknown(err),
        } => return Verdict::Kept(format!("cannot tell whether {} exists: {err}", show(path))),
        Root::Recorded {
            path,
            exists: Exists::No,
        } => path,
    };
    let since = e.missing_since.unwrap_or(now);
    let first = match e.missing_since {
        Some(t) => format!("missing since {} (first seen by --gc)", stamp(t)),
        None => "missing (first seen now)".to_string(),
    };
    let used = e.last_used.unwrap_or(UNIX_EPOCH);
    let base = since.max(used);
    let after = base + margin;
    if now >= after {
        // The project's quarantine goes with it: the moved entries' home is gone, and
        // `--restore` has nowhere to put them back (said, so nobody is surprised).
        let q = match e.quarantined {
            0 => String::new(),
            1 => "; the 1 entry its exit review moved aside goes with it".into(),
            n => format!("; the {n} entries its exit review moved aside go with it"),
        };
        return Verdict::Removable {
            why: format!("project {} no longer exists{q}", show(root)),
        };
    }
    // The note is written in whole seconds after the launch that touched `lock`.
    let used_note = if used > since + Duration::from_secs(1) {
        format!(", used {}", stamp(used))
    } else {
        String::new()
    };
    Verdict::Waiting {
        why: format!(
            "project {} is {first}{used_note}; removable after {} if it stays missing and unused",
            show(root),
            stamp(after)
        ),
        after,
    }
}

/// `2026-11-22 23:05 UTC`.
pub fn stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs - secs % 60))
        .to_string()
        .replace('T', " ")
        .replace(":00Z", " UTC")
}

enum Outcome {
    /// The project exists: nothing to say.
    Live,
    /// Kept, and the user should know why.
    Kept(String),
    Removed(String),
}

pub fn run(dry_run: bool, margin_flag: Option<&str>) -> Result<ExitCode> {
    let margin = margin(margin_flag)?;
    let home = StateHome::from_env(&host::home_dir()?)?;
    let detail = Detail {
        size: false,
        running: false,
    };
    let inv = inventory::scan(&home, detail)?;
    let now = SystemTime::now();
    let (would, removed) = if dry_run {
        ("would remove", "would be removed")
    } else {
        ("removed", "removed")
    };
    let mut failed = 0usize;
    let mut gone = 0usize;
    let mut reported = 0usize;

    for s in &inv.skipped {
        eprintln!("claudebox: gc: left alone {}: {}", show(&s.path), s.why);
        reported += 1;
    }
    for t in &inv.trash {
        if !dry_run {
            if let Err(e) = remove_path(t) {
                eprintln!("claudebox: gc: {e:#}");
                failed += 1;
                continue;
            }
        }
        eprintln!(
            "claudebox: gc: {would} {} (left by an interrupted --gc)",
            show(t)
        );
    }
    for u in &inv.unfinished {
        let young = Dir::open(&home.projects())
            .and_then(|d| beneath::mtime(&d, Path::new(u.file_name().unwrap_or_default())))
            .map_or(true, |t| t + STALE > now);
        if young {
            eprintln!(
                "claudebox: gc: left alone {}: a first launch is making it",
                show(u)
            );
            reported += 1;
            continue;
        }
        if !dry_run {
            if let Err(e) = remove_path(u) {
                eprintln!("claudebox: gc: {e:#}");
                failed += 1;
                continue;
            }
        }
        eprintln!(
            "claudebox: gc: {would} {} (left by a first launch that was killed)",
            show(u)
        );
    }
    for e in &inv.entries {
        let v = verdict(e, margin.value, now);
        let outcome = match v {
            Verdict::Live => {
                if e.missing_since.is_some() && !dry_run {
                    let _ = Dir::open(&e.dir).and_then(|d| {
                        d.remove_file(Path::new(crate::policy::layout::MISSING_FILE))
                    });
                }
                Ok(Outcome::Live)
            }
            Verdict::Kept(why) => Ok(Outcome::Kept(why)),
            Verdict::Waiting { why, .. } => {
                let mut result = Ok(Outcome::Kept(why));
                if e.missing_since.is_none() && !dry_run {
                    if let Err(err) = mark_missing(&e.dir, now) {
                        result = Err(err);
                    }
                }
                result
            }
            Verdict::Removable { why } => collect(e, dry_run, why),
        };
        match outcome {
            Ok(Outcome::Live) => {}
            Ok(Outcome::Kept(why)) => {
                eprintln!("claudebox: gc: kept {}: {why}", show(&e.dir));
                reported += 1;
            }
            Ok(Outcome::Removed(why)) => {
                eprintln!("claudebox: gc: {would} {} ({why})", show(&e.dir));
                gone += 1;
                continue;
            }
            Err(err) => {
                eprintln!("claudebox: gc: {}: {err:#}", show(&e.dir));
                failed += 1;
            }
        }
        for leftover in leftovers(&e.dir, now) {
            if !dry_run {
                let rel = leftover.strip_prefix(&e.dir).unwrap_or(&leftover);
                if let Err(err) = Dir::open(&e.dir).and_then(|d| d.remove_file(rel)) {
                    if err.kind() != std::io::ErrorKind::NotFound {
                        eprintln!("claudebox: gc: cannot remove {}: {err}", show(&leftover));
                        failed += 1;
                    }
                    continue;
                }
            }
            eprintln!(
                "claudebox: gc: {would} {} (a temporary file left by an interrupted write)",
                show(&leftover)
            );
        }
    }
    let total = inv.entries.len();
    let mut summary = format!(
        "claudebox: gc: {gone} of {total} project directories {removed}; margin {} ({})",
        margin.shown(),
        margin.source
    );
    if reported > 0 {
        summary.push_str(&format!("; {reported} kept or left alone, see above"));
    }
    if failed > 0 {
        summary.push_str(&format!("; {failed} failed"));
    }
    eprintln!("{summary}");
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Notes when the root was first found missing.
fn mark_missing(dir: &Path, now: SystemTime) -> Result<()> {
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    state::write_atomic(
        &dir.join(crate::policy::layout::MISSING_FILE),
        format!("{secs}\n").as_bytes(),
        0o600,
    )
}

/// Temporary files of an interrupted write (`.NAME.tmp.PID.N`) in a project directory,
/// its `sessions/` and its `claude-config/` (claude's and the launch's `.claude.json`
/// temporaries), older than [`STALE`]: regular files only. Read beneath the project
/// directory's descriptor (`claude-config` is the sandboxes').
pub fn leftovers(dir: &Path, now: SystemTime) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    let Ok(top) = Dir::open(dir) else {
        return out;
    };
    for sub in [
        ".",
        crate::policy::layout::SESSIONS_DIR,
        crate::policy::layout::CLAUDE_CONFIG_DIR,
    ] {
        let Ok(names) = top.entries(Path::new(sub)) else {
            continue;
        };
        for (name, kind) in names {
            let b = name.as_bytes();
            let is_tmp = b.starts_with(b".") && b.windows(5).any(|w| w == b".tmp.");
            let rel = Path::new(sub).join(&name);
            if is_tmp
                && kind == beneath::FileType::RegularFile
                && beneath::mtime(&top, &rel).is_ok_and(|t| t + STALE <= now)
            {
                out.push(dir.join(sub).join(name));
            }
        }
    }
    out
}

fn collect(e: &ProjectEntry, dry_run: bool, why: String) -> Result<Outcome> {
    let Root::Recorded { path: root, .. } = &e.root else {
        return Ok(Outcome::Kept("changed while --gc ran; run it again".into()));
    };
    // Bars new launches from registering until this directory is gone.
    let lock = inuse::lock_for_gc(&e.dir, !dry_run)?;
    if let GcLock::Busy = lock {
        return Ok(Outcome::Kept("a sandbox is starting on it".into()));
    }
    let running = inuse::count_running(&e.dir);
    if running > 0 {
        return Ok(Outcome::Kept(format!(
            "in use by {running} running sandbox{} (project {})",
            if running == 1 { "" } else { "es" },
            show(root)
        )));
    }
    for (slot, pids) in inuse::stuck(&e.dir) {
        eprintln!(
            "claudebox: gc: {}",
            crate::host::holders::reap_or_name(&slot, &pids, &show(&slot))
        );
    }
    // Decided under the lock: the root may have come back since the scan.
    match inventory::read_root(&e.id, &e.dir) {
        Root::Recorded {
            path,
            exists: Exists::No,
        } if path == *root => {}
        _ => return Ok(Outcome::Kept("changed while --gc ran; run it again".into())),
    }
    if !dry_run {
        let projects = e.dir.parent().context("state directory has no parent")?;
        let trash = projects.join(format!("{TRASH_PREFIX}{}-{}", e.id, std::process::id()));
        let parent =
            Dir::open(projects).with_context(|| format!("cannot open {}", show(projects)))?;
        let (from, to) = (
            Path::new(e.dir.file_name().context("state directory has no name")?),
            Path::new(trash.file_name().context("no name")?),
        );
        parent
            .rename(from, to)
            .with_context(|| format!("cannot move {} aside", show(&e.dir)))?;
        remove_tree(&parent, to)?;
    }
    drop(lock);
    Ok(Outcome::Removed(why))
}

/// [`remove_tree`] for a directory directly in `projects/`.
fn remove_path(p: &Path) -> Result<()> {
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        anyhow::bail!("cannot remove {}", show(p));
    };
    let d = Dir::open(parent).with_context(|| format!("cannot open {}", show(parent)))?;
    remove_tree(&d, Path::new(name))
}

/// Removes a directory tree beneath `parent`'s descriptor ([`beneath::Dir::remove_all`]):
/// a symlink inside is removed itself, its target untouched (tests/integration/gc.rs
/// plants such links); a directory the agent made unreadable or unwritable (`chmod 000`)
/// is given back its owner's rights first.
fn remove_tree(parent: &Dir, name: &Path) -> Result<()> {
    match parent.remove_all(name) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", show(&parent.shown(name)))),
    }
}
