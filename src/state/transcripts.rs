//! Where Claude Code keeps a conversation's transcript, and moving it to where `--resume`
//! looks, so that a named session resumes from any directory of its project.
//!
//! Claude writes `~/.claude/projects/<encoded cwd>/<uuid>.jsonl` (plus, in newer versions,
//! a `<uuid>/` directory for subagents and tool results), and `claude --resume <uuid>`
//! (2.1.197 measured) looks only under the encoded directory of the current directory.
//! Inside claudebox `~/.claude/projects` is the project's conversations directory, which
//! the agent can write: every step here refuses to follow a symlink it may have planted.

use std::ffi::{OsStr, OsString};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::SystemTime;

use crate::policy::escape::Shown;
use crate::state::beneath::{self, Dir, FileType};
use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::fcntl::{renameat2, RenameFlags};
use nix::sys::stat::fstatat;

/// Claude Code's name for a directory's conversations: every UTF-16 code unit outside
/// `[a-zA-Z0-9]` becomes `-`; past 200 characters the name is cut at 200 and gets `-` and
/// the base-36 absolute value of a 32-bit string hash of the path (verified against the
/// real 2.1.197 and 2.1.330 binaries). Non-UTF-8 bytes count as U+FFFD.
pub fn dir_name(cwd: &Path) -> OsString {
    let path = cwd.as_os_str().to_string_lossy();
    let mut out = String::new();
    let mut hash: i32 = 0;
    for c in path.chars() {
        let mut units = [0u16; 2];
        for u in c.encode_utf16(&mut units) {
            hash = hash
                .wrapping_shl(5)
                .wrapping_sub(hash)
                .wrapping_add(i32::from(*u));
        }
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else {
            out.extend(std::iter::repeat_n('-', c.len_utf16()));
        }
    }
    if out.len() > 200 {
        out.truncate(200);
        out.push('-');
        out.push_str(&base36(i64::from(hash).unsigned_abs()));
    }
    out.into()
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut s = Vec::new();
    loop {
        s.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}

/// Where a conversation's transcript is, seen from one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Under the encoded directory of the cwd: `--resume` finds it as it is.
    Here,
    /// Under another directory's name (the session last ran elsewhere in the project).
    Elsewhere(OsString),
    /// Nowhere in the project's conversations.
    Nowhere,
}

/// The project's conversations directory, held open beneath the project's state directory
/// (which no sandbox writes); `None` when there is none yet.
fn open_conversations(conversations: &Path) -> Result<Option<Dir>> {
    let (Some(parent), Some(name)) = (conversations.parent(), conversations.file_name()) else {
        anyhow::bail!("no directory in {}", conversations.shown());
    };
    let state = Dir::open(parent).with_context(|| format!("cannot open {}", parent.shown()))?;
    match state.sub(Path::new(name)) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot open {}", conversations.shown())),
    }
}

/// Looks for `<uuid>.jsonl` (a regular file, not a symlink) in every directory of
/// `conversations`; a copy under the cwd's own name wins, otherwise the newest. Every
/// lookup is beneath the directory's descriptor and never through a symlink.
pub fn find(conversations: &Path, uuid: &str, cwd: &Path) -> Result<Found> {
    let file = format!("{uuid}.jsonl");
    let here = dir_name(cwd);
    let Some(conv) = open_conversations(conversations)? else {
        return Ok(Found::Nowhere);
    };
    if conv.is_file(&Path::new(&here).join(&file)) {
        return Ok(Found::Here);
    }
    let entries = conv
        .entries(Path::new("."))
        .with_context(|| format!("cannot read {}", conversations.shown()))?;
    let mut best: Option<(SystemTime, OsString)> = None;
    for (name, kind) in entries {
        let is_dir = match kind {
            FileType::Directory => true,
            FileType::Unknown => conv.is_dir(Path::new(&name)),
            _ => false,
        };
        if !is_dir {
            continue;
        }
        let rel = Path::new(&name).join(&file);
        if !conv.is_file(&rel) {
            continue;
        }
        let mtime = beneath::mtime(&conv, &rel).unwrap_or(SystemTime::UNIX_EPOCH);
        if best.as_ref().is_none_or(|(t, n)| (mtime, &name) > (*t, n)) {
            best = Some((mtime, name));
        }
    }
    Ok(best.map_or(Found::Nowhere, |(_, n)| Found::Elsewhere(n)))
}

/// The newest `<uuid>.jsonl` (a regular file) directly in `cwd`'s own directory of
/// `conversations` whose uuid `accept` takes, as `--continue` picks it; beneath the
/// directory's descriptor, never through a symlink.
pub fn newest(conversations: &Path, cwd: &Path, accept: impl Fn(&str) -> bool) -> Option<String> {
    let conv = open_conversations(conversations).ok()??;
    let here = conv.sub(Path::new(&dir_name(cwd))).ok()?;
    let mut best: Option<(SystemTime, String)> = None;
    for (name, _) in here.entries(Path::new(".")).ok()? {
        let Some(uuid) = name.as_bytes().strip_suffix(b".jsonl") else {
            continue;
        };
        let Ok(uuid) = std::str::from_utf8(uuid) else {
            continue;
        };
        if !accept(uuid) || !here.is_file(Path::new(&name)) {
            continue;
        }
        let t = beneath::mtime(&here, Path::new(&name)).unwrap_or(SystemTime::UNIX_EPOCH);
        if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
            best = Some((t, uuid.to_string()));
        }
    }
    best.map(|(_, u)| u)
}

/// Moves `<uuid>.jsonl` and its `<uuid>/` directory from `conversations/<from>` to the
/// cwd's own directory, creating it. Never replaces anything and never follows a symlink:
/// both directories are opened beneath the conversations' descriptor.
///
/// The conversation cites files under `<uuid>/` by absolute path (large tool output saved
/// in `tool-results/`, subagent transcripts in `subagents/`): a relative symlink
/// `<from>/<uuid> -> ../<to>/<uuid>` is left behind so those paths still resolve. A later
/// move leaves another link, and links chain; a link found where the directory goes back
/// to (one this function left earlier) is replaced by the directory.
pub fn move_here(conversations: &Path, uuid: &str, from: &OsStr, cwd: &Path) -> Result<()> {
    let to = dir_name(cwd);
    let target = conversations.join(&to);
    let conv = open_conversations(conversations)?
        .with_context(|| format!("no {}", conversations.shown()))?;
    match conv.mkdir(Path::new(&to), 0o700) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", target.shown())),
    }
    let open_dir = |name: &OsStr| {
        conv.sub(Path::new(name)).with_context(|| {
            format!(
                "cannot open {} as a directory",
                conversations.join(name).shown()
            )
        })
    };
    let src = open_dir(from)?;
    let dst = open_dir(&to)?;
    let file = format!("{uuid}.jsonl");
    rename_noreplace(&src, &dst, OsStr::new(&file))
        .with_context(|| format!("cannot move {file} into {}", target.shown()))?;
    // The directory is optional; a leftover one under the target name is left alone.
    if src.kind(Path::new(uuid)) != Some(FileType::Directory) {
        return Ok(());
    }
    if dst.kind(Path::new(uuid)) == Some(FileType::Symlink) {
        // A link an earlier move left here; the directory comes back in its place.
        let _ = dst.remove_file(Path::new(uuid));
    }
    if let Err(e) = rename_noreplace(&src, &dst, OsStr::new(uuid)) {
        eprintln!(
            "claudebox: warning: left {} where it was: {e:#}",
            conversations.join(from).join(uuid).shown()
        );
        return Ok(());
    }
    let mut link = OsString::from("../");
    link.push(&to);
    link.push("/");
    link.push(uuid);
    if let Err(e) = nix::unistd::symlinkat(link.as_os_str(), Some(src.fd().as_raw_fd()), uuid) {
        eprintln!(
            "claudebox: warning: cannot leave a link at {} (files the conversation cites \
             there are now under {}): {e}",
            conversations.join(from).join(uuid).shown(),
            target.join(uuid).shown()
        );
    }
    Ok(())
}

fn rename_noreplace(src: &Dir, dst: &Dir, name: &OsStr) -> Result<()> {
    let (s, d) = (Some(src.fd().as_raw_fd()), Some(dst.fd().as_raw_fd()));
    match renameat2(s, name, d, name, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(()),
        // A file system without RENAME_NOREPLACE: check, then rename.
        Err(Errno::EINVAL) => {
            if fstatat(d, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
                return Err(Errno::EEXIST.into());
            }
            nix::fcntl::renameat(s, name, d, name).map_err(Into::into)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn moves_leave_links_that_chain_and_a_move_back_replaces_its_link() {
        let t = tempfile::tempdir().unwrap();
        let conv = t.path();
        let u = "0123abcd-0000-4000-8000-00000000beef";
        let (a, b, c) = (Path::new("/w/a"), Path::new("/w/b"), Path::new("/w/c"));
        let cited = conv.join(dir_name(a)).join(u).join("tool-results/x.txt");
        fs::create_dir_all(cited.parent().unwrap()).unwrap();
        fs::write(&cited, "out").unwrap();
        fs::write(conv.join(dir_name(a)).join(format!("{u}.jsonl")), "{}").unwrap();
        move_here(conv, u, &dir_name(a), b).unwrap();
        assert_eq!(fs::read_to_string(&cited).unwrap(), "out");
        move_here(conv, u, &dir_name(b), c).unwrap();
        assert_eq!(fs::read_to_string(&cited).unwrap(), "out", "links chain");
        move_here(conv, u, &dir_name(c), a).unwrap();
        assert!(fs::symlink_metadata(conv.join(dir_name(a)).join(u))
            .unwrap()
            .is_dir());
        for d in [b, c] {
            let via = conv.join(dir_name(d)).join(u).join("tool-results/x.txt");
            assert_eq!(fs::read_to_string(via).unwrap(), "out");
        }
    }

    #[test]
    fn short_paths_replace_every_non_alphanumeric_unit() {
        assert_eq!(
            dir_name(Path::new("/tmp/my proj_x.v2")),
            OsString::from("-tmp-my-proj-x-v2")
        );
        // é is one UTF-16 unit, 😀 is two; case is kept.
        assert_eq!(dir_name(Path::new("/A/é/😀")), OsString::from("-A-----"));
    }

    #[test]
    fn long_paths_match_real_claude() {
        // Measured: claude 2.1.197 and 2.1.330 started in this directory wrote their
        // transcript under exactly this name.
        let cwd = format!(
            "/tmp/ccprobe4.kof4/w/{}/{}",
            "a".repeat(120),
            "b".repeat(100)
        );
        let want = format!(
            "-tmp-ccprobe4-kof4-w-{}-{}-uz6idf",
            "a".repeat(120),
            "b".repeat(58)
        );
        assert_eq!(dir_name(Path::new(&cwd)), OsString::from(want));
        // 200 characters exactly: no hash.
        let cwd = format!("/{}", "x".repeat(199));
        assert_eq!(dir_name(Path::new(&cwd)).len(), 200);
    }

    #[test]
    fn base36_matches_javascript() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        assert_eq!(base36(2_147_483_648), "zik0zk");
    }

    #[test]
    fn find_never_looks_through_a_planted_symlink() {
        let t = tempfile::tempdir().unwrap();
        let conv = t.path().join("claude-projects");
        let outside = t.path().join("outside");
        let u = "0123abcd-0000-4000-8000-00000000cafe";
        fs::create_dir_all(outside.join("d")).unwrap();
        fs::write(outside.join(format!("{u}.jsonl")), "{}").unwrap();
        fs::write(outside.join("d").join(format!("{u}.jsonl")), "{}").unwrap();
        fs::create_dir(&conv).unwrap();
        let cwd = Path::new("/w/a");
        // The cwd's own name a link to a directory outside, another name too.
        std::os::unix::fs::symlink(&outside, conv.join(dir_name(cwd))).unwrap();
        std::os::unix::fs::symlink(outside.join("d"), conv.join("other")).unwrap();
        assert_eq!(find(&conv, u, cwd).unwrap(), Found::Nowhere);
        assert!(move_here(&conv, u, OsStr::new("other"), Path::new("/w/b")).is_err());
        assert!(outside.join("d").join(format!("{u}.jsonl")).is_file());
    }
}
