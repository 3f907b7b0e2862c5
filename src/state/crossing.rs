//! Conversations crossing, on request, between bare claude (`~/.claude/projects`) and the
//! project's conversations in claudebox's state (`projects/<id>/claude-projects`, which
//! sandboxes see at `~/.claude/projects`): `--import-conversation` and
//! `--export-conversation` copy one conversation of the current directory, never move it.
//!
//! A conversation is `<encoded cwd>/<uuid>.jsonl` and its `<uuid>/` directory
//! (`tool-results/`, `subagents/`), which the transcript cites by absolute path,
//! `<home>/.claude/projects/<encoded cwd>/<uuid>/...`. Inside a sandbox that path is the
//! state's copy (bound at the same path), on the host the host's: a copy under the same
//! names keeps every cited path resolving on the side it was copied to.
//!
//! Both sides are read and written by descriptor ([`beneath`]): the state's conversations
//! are the agent's to write, so a symlink (or FIFO, device) found there is skipped, never
//! followed, and a symlinked directory on the way of a write makes it fail. Nothing is
//! replaced but a copy the source continues (the destination's bytes are a prefix of the
//! source's); a copy that differs otherwise is refused before anything is written.

use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};

use crate::policy::error::Fixable;
use crate::policy::escape::Shown;
use crate::state::beneath::{self, Dir, FileType};
use crate::state::sessions::is_uuid;
use crate::state::transcripts::dir_name;

/// Which way a conversation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From bare claude's `~/.claude/projects` into claudebox's state.
    Import,
    /// From claudebox's state into bare claude's `~/.claude/projects`.
    Export,
}

/// What a copy did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Crossed {
    pub uuid: String,
    /// Files written (new, or a copy the source continued).
    pub written: usize,
    /// Files already there, the same.
    pub unchanged: usize,
    /// What was not copied: symlinks and anything but regular files and directories
    /// (relative to the conversations directory of the cwd).
    pub skipped: Vec<PathBuf>,
    /// Where it went: the destination's directory for the cwd.
    pub to: PathBuf,
}

/// Deepest `<uuid>/` directory walked (claude's are two levels).
const MAX_DEPTH: usize = 8;

/// Copies conversation `uuid` (the newest of the cwd's when `None`) of `cwd` between
/// `host_projects` (bare claude's `projects` directory, made when missing) and
/// `conversations` (the state's, which must exist).
pub fn copy(
    way: Way,
    host_projects: &Path,
    conversations: &Path,
    cwd: &Path,
    uuid: Option<&str>,
) -> Result<Crossed> {
    // Checked first: anything else is never part of a path, nor printed as given.
    let asked = match uuid {
        Some(u) if is_uuid(u) => Some(u.to_ascii_lowercase()),
        Some(u) => bail!(Fixable::new(
            format!("`{}` is not a conversation id", u.escape_debug()),
            "give the UUID claude printed (`claude --resume <uuid>`), or none for the newest"
        )),
        None => None,
    };
    let uuid = asked.as_deref();
    let enc = dir_name(cwd);
    let state_side = open_anchor_sub(conversations)?;
    if way == Way::Export {
        // Before bare claude's directory is made: is there anything to export?
        let here = state_side.sub(Path::new(&enc)).ok();
        let has = here.as_ref().is_some_and(|d| match uuid {
            Some(u) => d.kind(Path::new(&format!("{u}.jsonl"))).is_some(),
            None => newest_in(d, is_uuid).is_some(),
        });
        if !has {
            bail!(no_conversation(uuid, &conversations.join(&enc)));
        }
    }
    let host_side = {
        let (parent, name) = parent_and_name(host_projects)?;
        if way == Way::Export && !parent.exists() {
            // Bare claude never ran here: its config dir is made as claude makes it.
            let (up, dir) = parent_and_name(parent)?;
            Dir::open(up)
                .and_then(|d| d.ensure_dir(Path::new(dir), 0o700))
                .with_context(|| format!("cannot create {}", parent.shown()))?;
        }
        let anchor = match Dir::open(parent) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => bail!(
                "bare claude has no conversations here: there is no {}",
                parent.shown()
            ),
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", parent.shown())),
        };
        if way == Way::Export {
            anchor
                .ensure_dir(Path::new(name), 0o700)
                .with_context(|| format!("cannot create {}", host_projects.shown()))?;
        }
        match anchor.sub(Path::new(name)) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => bail!(
                "bare claude has no conversations here: there is no {}",
                host_projects.shown()
            ),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot open {}", host_projects.shown()))
            }
        }
    };
    let (src_root, dst_root) = match way {
        Way::Import => (host_side, state_side),
        Way::Export => (state_side, host_side),
    };
    let src_path = src_root.path().join(&enc);
    let src = match src_root.sub(Path::new(&enc)) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => bail!(no_conversation(uuid, &src_path)),
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot open {} as a directory (not followed)",
                    src_path.shown()
                )
            })
        }
    };
    let uuid = match asked {
        Some(u) => u,
        None => match newest_in(&src, is_uuid) {
            Some((_, u)) => u,
            None => bail!(no_conversation(None, &src_path)),
        },
    };
    let file = PathBuf::from(format!("{uuid}.jsonl"));
    match src.kind(&file) {
        Some(FileType::RegularFile) => {}
        None => bail!(no_conversation(Some(&uuid), &src_path)),
        Some(_) => bail!(
            "{} is not a regular file (not followed)",
            src.shown(&file).shown()
        ),
    }
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    match src.kind(Path::new(&uuid)) {
        Some(FileType::Directory) => walk(&src, Path::new(&uuid), 0, &mut files, &mut skipped)?,
        None => {}
        Some(_) => skipped.push(PathBuf::from(&uuid)),
    }
    // The transcript last: a resume sees every file it cites.
    files.push(file);
    // Read and compared first; nothing is written when one copy conflicts.
    let mut plan = Vec::new();
    let mut unchanged = 0;
    for rel in files {
        let bytes = src
            .read(&rel)
            .with_context(|| format!("cannot read {}", src.shown(&rel).shown()))?;
        let dst_path = dst_root.path().join(&enc).join(&rel);
        let existing = match dst_root.sub(Path::new(&enc)) {
            Ok(d) => match d.kind(&rel) {
                None => None,
                Some(FileType::RegularFile) => Some(
                    d.read(&rel)
                        .with_context(|| format!("cannot read {}", dst_path.shown()))?,
                ),
                Some(_) => bail!(
                    "{} is there and is not a regular file: nothing was copied",
                    dst_path.shown()
                ),
            },
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot open {} as a directory (not followed)",
                        dst_root.path().join(&enc).shown()
                    )
                })
            }
        };
        match existing {
            Some(old) if old == bytes => unchanged += 1,
            Some(old) if bytes.starts_with(&old) => plan.push((rel, bytes)),
            Some(_) => bail!(Fixable::new(
                format!(
                    "{} is there and differs from {} (the conversation went on on both \
                     sides): nothing was copied",
                    dst_path.shown(),
                    src.shown(&rel).shown()
                ),
                "move one of them aside"
            )),
            None => plan.push((rel, bytes)),
        }
    }
    dst_root
        .ensure_dir(Path::new(&enc), 0o700)
        .with_context(|| format!("cannot create {}", dst_root.path().join(&enc).shown()))?;
    let dst = dst_root.sub(Path::new(&enc)).with_context(|| {
        format!(
            "cannot open {} as a directory (not followed)",
            dst_root.path().join(&enc).shown()
        )
    })?;
    let written = plan.len();
    for (rel, bytes) in plan {
        let mut parents: Vec<&Path> = rel.ancestors().skip(1).collect();
        parents.reverse();
        for p in parents.into_iter().filter(|p| !p.as_os_str().is_empty()) {
            dst.ensure_dir(p, 0o700)
                .with_context(|| format!("cannot create {}", dst.shown(p).shown()))?;
        }
        let durable =
            rel.extension().is_some_and(|x| x == "jsonl") && rel.parent() == Some(Path::new(""));
        dst.write_atomic(&rel, &bytes, 0o600, durable)
            .with_context(|| format!("cannot write {}", dst.shown(&rel).shown()))?;
    }
    Ok(Crossed {
        uuid,
        written,
        unchanged,
        skipped,
        to: dst.path().to_path_buf(),
    })
}

fn no_conversation(uuid: Option<&str>, dir: &Path) -> Fixable {
    Fixable::new(
        match uuid {
            Some(u) => format!("no conversation {u} in {}", dir.shown()),
            None => format!("no conversation in {}", dir.shown()),
        },
        "claude keeps a conversation under the directory it was started in: run this from \
         that directory",
    )
}

fn parent_and_name(path: &Path) -> Result<(&Path, &std::ffi::OsStr)> {
    match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) => Ok((p, n)),
        _ => bail!("no directory in {}", path.shown()),
    }
}

/// `path`, opened beneath its parent (an anchor no sandbox writes).
fn open_anchor_sub(path: &Path) -> Result<Dir> {
    let (parent, name) = parent_and_name(path)?;
    Dir::open(parent)
        .and_then(|d| d.sub(Path::new(name)))
        .with_context(|| format!("cannot open {}", path.shown()))
}

/// The regular files beneath `rel` (relative to `dir`), by descriptor; anything else but
/// a directory is skipped.
fn walk(
    dir: &Dir,
    rel: &Path,
    depth: usize,
    files: &mut Vec<PathBuf>,
    skipped: &mut Vec<PathBuf>,
) -> Result<()> {
    if depth > MAX_DEPTH {
        skipped.push(rel.to_path_buf());
        return Ok(());
    }
    let mut entries = dir
        .entries(rel)
        .with_context(|| format!("cannot read {}", dir.shown(rel).shown()))?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, kind) in entries {
        let child = rel.join(&name);
        let kind = match kind {
            FileType::Unknown => dir.kind(&child).unwrap_or(FileType::Unknown),
            k => k,
        };
        match kind {
            FileType::Directory => walk(dir, &child, depth + 1, files, skipped)?,
            FileType::RegularFile => files.push(child),
            _ => skipped.push(child),
        }
    }
    Ok(())
}

/// The newest `<uuid>.jsonl` regular file directly in `dir` whose uuid `accept` takes,
/// with its modification time.
pub fn newest_in(dir: &Dir, accept: impl Fn(&str) -> bool) -> Option<(SystemTime, String)> {
    let mut best: Option<(SystemTime, String)> = None;
    for (name, _) in dir.entries(Path::new(".")).ok()? {
        let Some(uuid) = name.as_bytes().strip_suffix(b".jsonl") else {
            continue;
        };
        let Ok(uuid) = std::str::from_utf8(uuid) else {
            continue;
        };
        if !accept(uuid) || !dir.is_file(Path::new(&name)) {
            continue;
        }
        let t = beneath::mtime(dir, Path::new(&name)).unwrap_or(SystemTime::UNIX_EPOCH);
        if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
            best = Some((t, uuid.to_string()));
        }
    }
    best
}

/// The conversation a launch in `cwd` used, for the line printed at its end: `pinned`
/// (the UUID claude's own options named) when its transcript is there, else the newest
/// transcript of the cwd's directory written since `since`.
pub fn used_since(
    conversations: &Path,
    cwd: &Path,
    since: SystemTime,
    pinned: Option<&str>,
) -> Option<String> {
    let conv = open_anchor_sub(conversations).ok()?;
    let here = conv.sub(Path::new(&dir_name(cwd))).ok()?;
    if let Some(u) = pinned {
        if here.is_file(Path::new(&format!("{u}.jsonl"))) {
            return Some(u.to_string());
        }
    }
    newest_in(&here, is_uuid)
        .filter(|(t, _)| *t >= since)
        .map(|(_, u)| u)
}

/// The line printed for a copy.
pub fn summary(way: Way, c: &Crossed) -> String {
    let mut s = format!(
        "{} conversation {} to {}: {} file{} written, {} already there",
        match way {
            Way::Import => "imported",
            Way::Export => "exported",
        },
        c.uuid,
        c.to.shown(),
        c.written,
        if c.written == 1 { "" } else { "s" },
        c.unchanged
    );
    if !c.skipped.is_empty() {
        let names: Vec<String> = c.skipped.iter().map(|p| p.shown().clone()).collect();
        s.push_str(&format!(
            "; not copied (not regular files, never followed): {}",
            names.join(", ")
        ));
    }
    s.push_str(&format!(
        "; resume it {}: {} --resume {}",
        match way {
            Way::Import => "in claudebox from this directory",
            Way::Export => "with bare claude from this directory",
        },
        match way {
            Way::Import => "claudebox",
            Way::Export => "claude",
        },
        c.uuid
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    const U: &str = "0123abcd-0000-4000-8000-00000000beef";

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf, &'static Path) {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("home/.claude/projects");
        let conv = t.path().join("state/claude-projects");
        fs::create_dir_all(&conv).unwrap();
        fs::create_dir_all(t.path().join("home")).unwrap();
        (t, host, conv, Path::new("/w/a"))
    }

    #[test]
    fn import_then_export_round_trips_and_a_continued_copy_replaces_its_prefix() {
        let (_t, host, conv, cwd) = setup();
        let d = host.join(dir_name(cwd));
        fs::create_dir_all(d.join(U).join("tool-results")).unwrap();
        fs::write(d.join(format!("{U}.jsonl")), "line1\n").unwrap();
        fs::write(d.join(U).join("tool-results/x.txt"), "out").unwrap();
        let c = copy(Way::Import, &host, &conv, cwd, None).unwrap();
        assert_eq!((c.uuid.as_str(), c.written, c.unchanged), (U, 2, 0));
        let mine = conv.join(dir_name(cwd));
        assert_eq!(
            fs::read_to_string(mine.join(U).join("tool-results/x.txt")).unwrap(),
            "out"
        );
        // again: nothing to do; the source kept (a copy, not a move)
        let c = copy(Way::Import, &host, &conv, cwd, Some(U)).unwrap();
        assert_eq!((c.written, c.unchanged), (0, 2));
        assert!(d.join(format!("{U}.jsonl")).is_file());
        // continued in claudebox: the export replaces the host's shorter copy
        fs::write(mine.join(format!("{U}.jsonl")), "line1\nline2\n").unwrap();
        let c = copy(Way::Export, &host, &conv, cwd, Some(U)).unwrap();
        assert_eq!((c.written, c.unchanged), (1, 1));
        assert_eq!(
            fs::read_to_string(d.join(format!("{U}.jsonl"))).unwrap(),
            "line1\nline2\n"
        );
        // diverged: refused, nothing written
        fs::write(d.join(format!("{U}.jsonl")), "line1\nother\n").unwrap();
        let e = copy(Way::Import, &host, &conv, cwd, Some(U)).unwrap_err();
        assert!(format!("{e:#}").contains("differs"), "{e:#}");
        assert_eq!(
            fs::read_to_string(mine.join(format!("{U}.jsonl"))).unwrap(),
            "line1\nline2\n"
        );
    }

    #[test]
    fn export_never_follows_a_planted_symlink() {
        let (t, host, conv, cwd) = setup();
        let secret = t.path().join("secret");
        fs::write(&secret, "KEY").unwrap();
        let mine = conv.join(dir_name(cwd));
        fs::create_dir_all(mine.join(U).join("tool-results")).unwrap();
        fs::write(mine.join(format!("{U}.jsonl")), "x\n").unwrap();
        symlink(&secret, mine.join(U).join("tool-results/steal.txt")).unwrap();
        let c = copy(Way::Export, &host, &conv, cwd, Some(U)).unwrap();
        assert_eq!(c.skipped, [PathBuf::from(U).join("tool-results/steal.txt")]);
        let out = host
            .join(dir_name(cwd))
            .join(U)
            .join("tool-results/steal.txt");
        assert!(fs::symlink_metadata(&out).is_err());
        // the transcript itself a link: refused
        let v = "0123abcd-0000-4000-8000-00000000cafe";
        symlink(&secret, mine.join(format!("{v}.jsonl"))).unwrap();
        assert!(copy(Way::Export, &host, &conv, cwd, Some(v)).is_err());
    }

    #[test]
    fn import_never_writes_through_a_planted_directory_link() {
        let (t, host, conv, cwd) = setup();
        let elsewhere = t.path().join("elsewhere");
        fs::create_dir_all(&elsewhere).unwrap();
        symlink(&elsewhere, conv.join(dir_name(cwd))).unwrap();
        let d = host.join(dir_name(cwd));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(format!("{U}.jsonl")), "x\n").unwrap();
        assert!(copy(Way::Import, &host, &conv, cwd, Some(U)).is_err());
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn a_missing_or_bad_id_is_one_clear_error() {
        let (_t, host, conv, cwd) = setup();
        fs::create_dir_all(host.join(dir_name(cwd))).unwrap();
        let e = format!(
            "{:#}",
            copy(Way::Import, &host, &conv, cwd, Some(U)).unwrap_err()
        );
        assert!(
            e.contains("no conversation") && e.contains("run this from"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            copy(Way::Import, &host, &conv, cwd, Some("../x")).unwrap_err()
        );
        assert!(e.contains("not a conversation id"), "{e}");
    }
}
