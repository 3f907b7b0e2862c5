//! `--gc`: remove the state of projects whose root no longer exists, and nothing else.
//!
//! A project directory is removed only when all of these hold: it is a real directory
//! under `projects/` with a claudebox name (never a symlink, never followed); its
//! `project-root` is readable, valid and names a path that lstat says is gone; no
//! sandbox runs on it; and all of that still holds once `--gc` holds its `lock`. It is
//! then renamed to `projects/.gc-*` (so no launch can register in it any more) and
//! removed without following any symlink inside. Everything else is kept, and every
//! directory kept for a reason other than "its project exists" is reported.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::host;
use crate::inuse::{self, GcLock};
use crate::inventory::{self, show, Detail, Entry, Exists, Root, TRASH_PREFIX};
use crate::state::StateHome;

enum Outcome {
    /// The project exists: nothing to say.
    Live,
    /// Kept, and the user should know why.
    Kept(String),
    Removed(PathBuf),
}

pub fn run(dry_run: bool) -> Result<ExitCode> {
    let home = StateHome::from_env(&host::home_dir()?);
    let detail = Detail {
        size: false,
        running: false,
    };
    let inv = inventory::scan(&home, detail)?;
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
            if let Err(e) = remove_tree(t) {
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
    for e in &inv.entries {
        match collect(e, dry_run) {
            Ok(Outcome::Live) => {}
            Ok(Outcome::Kept(why)) => {
                eprintln!("claudebox: gc: kept {}: {why}", show(&e.dir));
                reported += 1;
            }
            Ok(Outcome::Removed(root)) => {
                eprintln!(
                    "claudebox: gc: {would} {} (project {} no longer exists)",
                    show(&e.dir),
                    show(&root)
                );
                gone += 1;
            }
            Err(err) => {
                eprintln!("claudebox: gc: {}: {err:#}", show(&e.dir));
                failed += 1;
            }
        }
    }
    let total = inv.entries.len();
    let mut summary = format!("claudebox: gc: {gone} of {total} project directories {removed}");
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

fn collect(e: &Entry, dry_run: bool) -> Result<Outcome> {
    let root = match &e.root {
        Root::Problem(p) => return Ok(Outcome::Kept(format!("{p}; remove it by hand if unused"))),
        Root::Recorded {
            exists: Exists::Yes,
            ..
        } => return Ok(Outcome::Live),
        Root::Recorded {
            path,
            exists: Exists::Unknown(err),
        } => {
            return Ok(Outcome::Kept(format!(
                "cannot tell whether {} exists: {err}",
                show(path)
            )))
        }
        Root::Recorded {
            path,
            exists: Exists::No,
        } => path,
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
        fs::rename(&e.dir, &trash)
            .with_context(|| format!("cannot move {} aside", show(&e.dir)))?;
        remove_tree(&trash)?;
    }
    drop(lock);
    Ok(Outcome::Removed(root.clone()))
}

/// Removes a directory tree. `remove_dir_all` never follows symlinks: a symlink inside is
/// removed itself, its target untouched (tests/gc.rs plants such links).
fn remove_tree(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", show(dir))),
    }
}
