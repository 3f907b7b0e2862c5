//! Where Claude Code keeps a conversation's transcript, and moving it to where `--resume`
//! looks, so that a named session resumes from any directory of its project.
//!
//! Claude writes `~/.claude/projects/<encoded cwd>/<uuid>.jsonl` (plus, in newer versions,
//! a `<uuid>/` directory for subagents and tool results), and `claude --resume <uuid>`
//! (2.1.197 measured) looks only under the encoded directory of the current directory.
//! Inside claudebox `~/.claude/projects` is the project's conversations directory, which
//! the agent can write: every step here refuses to follow a symlink it may have planted.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::time::SystemTime;

use crate::policy::render::Shown;
use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::fcntl::{renameat2, RenameFlags};
use nix::sys::stat::{fstatat, SFlag};

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

/// Looks for `<uuid>.jsonl` (a regular file, not a symlink) in every directory of
/// `conversations`; a copy under the cwd's own name wins, otherwise the newest.
pub fn find(conversations: &Path, uuid: &str, cwd: &Path) -> Result<Found> {
    let file = format!("{uuid}.jsonl");
    let here = dir_name(cwd);
    if is_regular(&conversations.join(&here).join(&file)) {
        return Ok(Found::Here);
    }
    let entries = match fs::read_dir(conversations) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Found::Nowhere),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", conversations.shown())),
    };
    let mut best: Option<(SystemTime, OsString)> = None;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", conversations.shown()))?;
        if !entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        let Ok(meta) = fs::symlink_metadata(entry.path().join(&file)) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let name = entry.file_name();
        if best.as_ref().is_none_or(|(t, n)| (mtime, &name) > (*t, n)) {
            best = Some((mtime, name));
        }
    }
    Ok(best.map_or(Found::Nowhere, |(_, n)| Found::Elsewhere(n)))
}

fn is_regular(p: &Path) -> bool {
    fs::symlink_metadata(p)
        .map(|m| m.is_file())
        .unwrap_or(false)
}

/// Moves `<uuid>.jsonl` and its `<uuid>/` directory from `conversations/<from>` to the
/// cwd's own directory, creating it. Never replaces anything and never follows a symlink.
///
/// The conversation cites files under `<uuid>/` by absolute path (large tool output saved
/// in `tool-results/`, subagent transcripts in `subagents/`): a relative symlink
/// `<from>/<uuid> -> ../<to>/<uuid>` is left behind so those paths still resolve. A later
/// move leaves another link, and links chain; a link found where the directory goes back
/// to (one this function left earlier) is replaced by the directory.
pub fn move_here(conversations: &Path, uuid: &str, from: &OsStr, cwd: &Path) -> Result<()> {
    let to = dir_name(cwd);
    let target = conversations.join(&to);
    match fs::DirBuilder::new().mode(0o700).create(&target) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", target.shown())),
    }
    let src = open_dir(&conversations.join(from))?;
    let dst = open_dir(&target)?;
    let file = format!("{uuid}.jsonl");
    rename_noreplace(&src, &dst, OsStr::new(&file))
        .with_context(|| format!("cannot move {file} into {}", target.shown()))?;
    // The directory is optional; a leftover one under the target name is left alone.
    if file_type(&src, uuid) != Some(SFlag::S_IFDIR) {
        return Ok(());
    }
    if file_type(&dst, uuid) == Some(SFlag::S_IFLNK) {
        // A link an earlier move left here; the directory comes back in its place.
        let _ = nix::unistd::unlinkat(
            Some(dst.as_raw_fd()),
            OsStr::new(uuid),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
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
    if let Err(e) = nix::unistd::symlinkat(link.as_os_str(), Some(src.as_raw_fd()), uuid) {
        eprintln!(
            "claudebox: warning: cannot leave a link at {} (files the conversation cites \
             there are now under {}): {e}",
            conversations.join(from).join(uuid).shown(),
            target.join(uuid).shown()
        );
    }
    Ok(())
}

/// The type of `dir/name`, without following a symlink.
fn file_type(dir: &File, name: &str) -> Option<SFlag> {
    fstatat(
        Some(dir.as_raw_fd()),
        OsStr::new(name),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .ok()
    .map(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT)
}

fn open_dir(p: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
        .open(p)
        .with_context(|| format!("cannot open {} as a directory", p.shown()))
}

fn rename_noreplace(src: &File, dst: &File, name: &OsStr) -> Result<()> {
    let (s, d) = (Some(src.as_raw_fd()), Some(dst.as_raw_fd()));
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
}
