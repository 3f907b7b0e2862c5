//! The state directory: where claudebox keeps each project's conversations and history.
//!
//! ```text
//! $CLAUDEBOX_HOME (default ~/.claudebox, mode 0700)
//! ├── login/                mounted at the same path in every sandbox: claude's secure-
//! │                         storage dir (OAuth refresh lock; .credentials.json bound in)
//! └── projects/
//!     └── <id>/                 16 hex chars of sha256(project root)
//!         ├── project-root      the canonical project root, raw bytes, no newline
//!         ├── claude-projects/  mounted at ~/.claude/projects inside the sandbox
//!         ├── history.jsonl     mounted at ~/.claude/history.jsonl
//!         ├── claude-config/    mounted at ~/.claude: what claude writes while it works,
//!         │                     this project's .claude.json (see `claude_home`)
//!         ├── claude-json-host.json  the host's .claude.json as last synced (filtered)
//!         ├── claude-json-host.stamp the host file's inode, size, mtime then (skips a re-read)
//!         ├── empty             an empty read-only file, mounted over hidden files
//!         ├── lock              mutex between a launch registering and --gc; its mtime
//!         │                     is the project's last use
//!         ├── running/0, 1, ...      slots: one flock per running sandbox, held by its pid 1
//!         ├── network-denied.log  hosts the allowlist proxy refused (allowlist mode) and
//!         │                       requests the login broker refused (any mode),
//!         │                       at most 256 KiB, plus one rotated `.1`
//!         ├── root-mount    the mount point of the root's file system at the last launch
//!         ├── root-missing-since  when `--gc` first found the root missing (see gc.rs)
//!         ├── claude-settings.local.json  mounted at <project>/.claude/settings.local.json:
//!         │                     "always allow" rules saved inside, never the host's file
//!         └── sessions/         named sessions (`--session NAME`), see `sessions/`
//! ```
//!
//! Path computation is pure; creating things is done by [`ensure_project_dir`], on the
//! launch path only, after the plan has been built.

pub mod beneath;
pub mod claude_home;
pub mod codex_home;
pub mod credsync;
pub mod crossing;
pub mod denied;
pub mod du;
pub mod inuse;
pub mod inventory;
pub mod review;
pub mod sessions;
pub mod transcripts;
pub mod worktrees;

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::policy::error::Fixable;
use crate::policy::escape::Shown;
use anyhow::{bail, Context, Result};

use crate::policy::layout::{
    ProjectState, CLAUDE_CONFIG_DIR, CLAUDE_JSON_BASE, CONVERSATIONS_DIR, LIST_SUMMARY_FILE,
    LOCK_FILE, MISSING_FILE, NEW_PREFIX, ROOT_FILE, ROOT_MOUNT_FILE,
};

/// The paths of one state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateHome {
    pub dir: PathBuf,
}

impl StateHome {
    /// `$CLAUDEBOX_HOME`, or `~/.claudebox`. A relative `CLAUDEBOX_HOME` is refused: it
    /// would name another state directory in every directory claudebox is started from.
    pub fn from_env(home: &Path) -> Result<StateHome> {
        let dir = match std::env::var_os("CLAUDEBOX_HOME") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => home.join(".claudebox"),
        };
        if !dir.is_absolute() {
            bail!(Fixable::new(
                format!("CLAUDEBOX_HOME is a relative path ({})", dir.shown()),
                "set CLAUDEBOX_HOME to an absolute path (e.g. CLAUDEBOX_HOME=$PWD/NAME), or \
                 unset it for ~/.claudebox"
            ));
        }
        Ok(StateHome { dir })
    }

    pub fn projects(&self) -> PathBuf {
        self.dir.join("projects")
    }

    pub fn project(&self, id: &str) -> ProjectState {
        ProjectState {
            dir: self.projects().join(id),
        }
    }
}

/// Creates (or empties) the file mounted over hidden files and missing setup files.
/// Looks first: on most launches it exists, empty, read-only (which the owner cannot open
/// for writing unless root).
pub fn ensure_empty_file(state: &ProjectState) -> Result<()> {
    let path = state.empty_file();
    let (dir, name) = parent_and_name(&path)?;
    if let Ok(s) = dir.stat(name) {
        let is_file = beneath::FileType::from_raw_mode(s.st_mode) == beneath::FileType::RegularFile;
        if is_file && s.st_size == 0 {
            return Ok(());
        }
        if is_file {
            dir.chmod(name, 0o600)?;
        }
    }
    dir.touch(name, 0o400)
        .with_context(|| format!("cannot create {}", path.shown()))?;
    let len = dir.stat(name).map(|s| s.st_size).unwrap_or(0);
    if len != 0 {
        dir.open_write(name)
            .and_then(|f| f.set_len(0))
            .with_context(|| format!("cannot empty {}", path.shown()))?;
        dir.chmod(name, 0o400)?;
    }
    Ok(())
}

/// Creates the `{}` file mounted over a missing setup file read as JSON
/// (`ProjectState::empty_json`), read-only; looks first, as [`ensure_empty_file`].
pub fn ensure_empty_json(state: &ProjectState) -> Result<()> {
    let path = state.empty_json();
    let (dir, name) = parent_and_name(&path)?;
    if dir.read(name).ok().as_deref() == Some(b"{}\n") {
        return Ok(());
    }
    dir.write_atomic(name, b"{}\n", 0o400, false)
        .with_context(|| format!("cannot create {}", path.shown()))
}

/// Makes the project's package caches (`caches::TABLE`), empty, where they are missing.
pub fn ensure_caches(state: &ProjectState) -> Result<()> {
    mkdir_private(&state.dir.join(crate::policy::layout::CACHES_DIR))?;
    for c in crate::policy::caches::TABLE {
        mkdir_private(&state.cache(c.name))?;
    }
    Ok(())
}

/// Writes the scratch `.claude`'s stand-in `.gitignore` (`protected::CLAUDE_GITIGNORE`)
/// to the state, read-only; looks first.
pub fn ensure_claude_gitignore(state: &ProjectState) -> Result<()> {
    let path = state.claude_gitignore();
    let text = crate::policy::protected::CLAUDE_GITIGNORE.as_bytes();
    let (dir, name) = parent_and_name(&path)?;
    if dir.read(name).ok().as_deref() == Some(text) {
        return Ok(());
    }
    dir.write_atomic(name, text, 0o400, false)
        .with_context(|| format!("cannot create {}", path.shown()))
}

/// The permission lists that carry over from one sandbox to the next in the project's copy
/// of `.claude/settings.local.json`: what "always allow" (and `/permissions`) save.
const CARRIED_PERMISSIONS: &[&str] = &["allow", "deny", "ask", "additionalDirectories"];

/// Rebuilds the sandbox's `.claude/settings.local.json` (the project's copy in the state):
/// the host's file as it is now, plus the permission rules saved in the copy by earlier
/// sandboxes. Nothing else the sandbox wrote there (hooks, MCP servers, env) survives, and
/// nothing goes back to the host's file. A host file that is missing, a symlink or not a
/// JSON object counts as `{}`.
pub fn refresh_local_settings(state: &ProjectState, host_file: &Path) -> Result<()> {
    use serde_json::{Map, Value};
    let read_object = |p: &Path| -> Map<String, Value> {
        let Ok(f) = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(p)
        else {
            return Map::new();
        };
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            return Map::new();
        }
        match serde_json::from_reader(std::io::BufReader::new(f)) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        }
    };
    let copy = state.local_settings();
    let mut out = read_object(host_file);
    let (dir, name) = parent_and_name(&copy)?;
    let prev = match dir.read(name).map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(Value::Object(m))) => m,
        _ => Map::new(),
    };
    if let Some(Value::Object(saved)) = prev.get("permissions") {
        let perms = out
            .entry("permissions")
            .or_insert_with(|| Value::Object(Map::new()));
        if !perms.is_object() {
            *perms = Value::Object(Map::new());
        }
        #[allow(clippy::expect_used)] // replaced by an object just above when it was not one
        let perms = perms.as_object_mut().expect("made an object above");
        for key in CARRIED_PERMISSIONS {
            let Some(Value::Array(rules)) = saved.get(*key) else {
                continue;
            };
            let list = perms
                .entry(*key)
                .or_insert_with(|| Value::Array(Vec::new()));
            if !list.is_array() {
                *list = Value::Array(Vec::new());
            }
            #[allow(clippy::expect_used)] // replaced by an array just above when it was not one
            let list = list.as_array_mut().expect("made an array above");
            for r in rules.iter().filter(|r| r.is_string()) {
                if !list.contains(r) {
                    list.push(r.clone());
                }
            }
        }
    }
    let mut bytes = serde_json::to_vec_pretty(&Value::Object(out))?;
    bytes.push(b'\n');
    if dir.read(name).ok().as_deref() == Some(&bytes[..]) {
        return Ok(());
    }
    rewrite_in_place(&copy, &bytes)
}

/// Rebuilds the sandbox's `~/.claude/settings.json` (the project's copy in the state,
/// mounted read-write; see `claude_home::SETTINGS_COPY_WHY`): the user's file as it is
/// now (`host_file`; missing counts as `{}`, a file that is not a JSON object is copied
/// unchanged), with the Bypass Permissions answer (`claude_home::BYPASS_KEY`) set when the
/// user gave it in any sandbox (first kept from this copy: [`keep_bypass_consent`]).
/// Nothing else a sandbox wrote in the copy survives, and the user's file is never
/// written: what the agent writes there (hooks, a status line, an `apiKeyHelper`) would
/// otherwise run in a host claude. Why a copy at all: claude saves the dialog's answer to
/// the user settings, and a read-only file made the dialog come back at every launch.
pub fn refresh_user_settings(state: &ProjectState, host_file: Option<&Path>) -> Result<()> {
    use crate::policy::claude_home::BYPASS_KEY;
    use serde_json::Value;
    keep_bypass_consent(state);
    let accepted = fs::symlink_metadata(state.bypass_consent()).is_ok();
    // The user's own file: symlinks followed (a home-manager link into the store), as
    // bwrap's bind of it did; never a FIFO that would block.
    let host = match host_file {
        Some(p) => match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(p)
        {
            Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut std::io::BufReader::new(f), &mut b)
                    .with_context(|| format!("cannot read {}", p.shown()))?;
                Some(b)
            }
            _ => None,
        },
        None => None,
    };
    // The user's bytes as they are unless the answer must be added (then re-serialised).
    let bytes = match host.as_deref().map(serde_json::from_slice::<Value>) {
        None if accepted => {
            let mut m = serde_json::Map::new();
            m.insert(BYPASS_KEY.into(), Value::Bool(true));
            Some(Value::Object(m))
        }
        None => None,
        Some(Ok(Value::Object(mut m)))
            if accepted && m.get(BYPASS_KEY) != Some(&Value::Bool(true)) =>
        {
            m.insert(BYPASS_KEY.into(), Value::Bool(true));
            Some(Value::Object(m))
        }
        // Not an object, not JSON: claude shows its own error for it; same bytes.
        Some(_) => None,
    };
    let bytes = match (bytes, host) {
        (Some(v), _) => {
            let mut b = serde_json::to_vec_pretty(&v)?;
            b.push(b'\n');
            b
        }
        (None, Some(raw)) => raw,
        (None, None) => b"{}\n".to_vec(),
    };
    let copy = state.user_settings();
    let (dir, name) = parent_and_name(&copy)?;
    if dir.read(name).ok().as_deref() == Some(&bytes[..]) {
        return Ok(());
    }
    rewrite_in_place(&copy, &bytes)
}

/// Keeps the Bypass Permissions answer a sandbox of this project saved in its copy of
/// the user's settings (`claude_home::BYPASS_KEY` true): claudebox's own record for every
/// project (`ProjectState::bypass_consent`), never the host's settings. Quietly does
/// nothing when the copy is missing or holds no answer. Run at each launch and at each
/// sandbox's end.
pub fn keep_bypass_consent(state: &ProjectState) {
    use crate::policy::claude_home::BYPASS_KEY;
    let consent = state.bypass_consent();
    if fs::symlink_metadata(&consent).is_ok() {
        return;
    }
    let copy = state.user_settings();
    let Ok((dir, name)) = parent_and_name(&copy) else {
        return;
    };
    let given = dir
        .read(name)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v.get(BYPASS_KEY) == Some(&serde_json::Value::Bool(true)));
    if !given {
        return;
    }
    if let Ok((home, name)) = parent_and_name(&consent) {
        let text = "Claude Code's Bypass Permissions dialog was accepted in a sandbox: \
                    claudebox sets skipDangerousModePermissionPrompt in every sandbox's copy \
                    of your settings.json (never in yours). Delete this file to be asked \
                    again.\n";
        let _ = home.write_atomic(name, text.as_bytes(), 0o600, true);
    }
}

/// Writes `bytes` over the regular file at `path` in place (same inode), or creates it
/// atomically when there is none. For a file bound into running sandboxes: a rename
/// would leave each of them on the old inode, and what they write there afterwards
/// (claude saving an "always allow" rule) would never reach the next sandbox. Readers
/// may see a mix for an instant, as with claude's own in-place write inside (its rename
/// onto a bound file fails with EBUSY).
fn rewrite_in_place(path: &Path, bytes: &[u8]) -> Result<()> {
    let (dir, name) = parent_and_name(path)?;
    dir.rewrite_in_place(name, bytes)
        .with_context(|| format!("cannot write {}", path.shown()))
}

/// Creates a 0700 directory, or accepts an existing directory (never a symlink to one).
/// Looks first: on a launch everything exists already, and one `lstat` is cheaper than a
/// failed `mkdir` followed by one.
pub fn mkdir_private(path: &Path) -> Result<()> {
    let (dir, name) = parent_and_name(path)?;
    dir.ensure_dir(name, 0o700).map_err(|e| {
        if e.kind() == ErrorKind::AlreadyExists {
            anyhow::anyhow!("{} exists and is not a directory", path.shown())
        } else {
            anyhow::Error::new(e).context(format!("cannot create {}", path.shown()))
        }
    })
}

/// Creates the state home and one project's directory, files and lock file. Idempotent.
/// Returns whether the project's directory was made by this call. A project directory
/// appears whole or not at all (made under a temporary name, then renamed into place),
/// and when this fails nothing it made stays: not the project directory, not `projects/`,
/// not the state home.
pub fn ensure_project_dir(home: &StateHome, state: &ProjectState, root: &Path) -> Result<bool> {
    let meta = fs::metadata(&home.dir);
    let existed = meta.is_ok();
    // The state home itself may be a symlink the user made (`~/.claudebox -> /data/cb`);
    // nothing below it may be.
    let home_is_dir = meta.is_ok_and(|m| m.is_dir());
    if !home_is_dir {
        mkdir_private(&home.dir).with_context(|| {
            Fixable::new(
                format!("the state directory {} cannot be created", home.dir.shown()),
                "set CLAUDEBOX_HOME to a writable directory",
            )
            .at(&home.dir)
        })?;
    }
    let projects = home.projects();
    let projects_existed = fs::symlink_metadata(&projects).is_ok();
    let result = (|| -> Result<bool> {
        if !existed {
            fs::set_permissions(&home.dir, fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot make {} private (mode 0700)", home.dir.shown()))?;
        }
        mkdir_private(&projects)?;
        let made = match fs::symlink_metadata(&state.dir) {
            Ok(_) => false,
            Err(_) => create_whole(home, state, root)?,
        };
        mkdir_private(&state.dir)?;
        mkdir_private(&state.conversations())?;
        write_root_file(state, root)?;
        write_root_mount(state, root);
        touch(&state.history(), 0o600)?;
        touch(&state.lock(), 0o600)?;
        Ok(made)
    })();
    if result.is_err() {
        if !projects_existed {
            let _ = fs::remove_dir(&projects);
        }
        if !existed {
            let _ = fs::remove_dir(&home.dir);
        }
    }
    result
}

/// Makes a project's directory under a temporary name (`projects/.new-<id>.<pid>.<n>`)
/// and renames it into place. `Ok(false)`: another launch made it first.
fn create_whole(home: &StateHome, state: &ProjectState, root: &Path) -> Result<bool> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = state
        .dir
        .file_name()
        .context("state directory has no name")?;
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = std::ffi::OsString::from(NEW_PREFIX);
    name.push(id);
    name.push(format!(".{}.{seq}", std::process::id()));
    let tmp = home.projects().join(name);
    let doing = || format!("creating the state of project {}", root.shown());
    DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .with_context(|| format!("cannot create {} ({})", tmp.shown(), doing()))?;
    let tmp_state = ProjectState { dir: tmp.clone() };
    let filled = (|| -> Result<()> {
        mkdir_private(&tmp_state.conversations())?;
        let path = tmp_state.root_file();
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot create {} ({})", path.shown(), doing()))?;
        f.write_all(root.as_os_str().as_bytes())
            .and_then(|()| f.sync_all())
            .with_context(|| format!("cannot write {} ({})", path.shown(), doing()))?;
        touch(&tmp_state.history(), 0o600)?;
        touch(&tmp_state.lock(), 0o600)?;
        Ok(())
    })();
    let placed = filled.and_then(|()| match fs::rename(&tmp, &state.dir) {
        Ok(()) => {
            File::open(home.projects()).and_then(|d| d.sync_all()).ok();
            Ok(true)
        }
        // Another launch made it meanwhile: theirs is as good as ours.
        Err(e)
            if e.kind() == ErrorKind::AlreadyExists
                || e.raw_os_error() == Some(nix::libc::ENOTEMPTY) =>
        {
            Ok(false)
        }
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot rename {} to {} ({})",
                tmp.shown(),
                state.dir.shown(),
                doing()
            )
        }),
    });
    if !matches!(placed, Ok(true)) {
        let _ = fs::remove_dir_all(&tmp);
    }
    placed
}

/// Removes a project directory this launch made, when the launch failed before anyone
/// else used it (no conversation in it, no other sandbox registered). Best effort.
pub fn remove_unused(state: &ProjectState) {
    let conversations_empty = fs::read_dir(state.conversations())
        .map(|mut d| d.next().is_none())
        .unwrap_or(true);
    if !conversations_empty || crate::state::inuse::count_running(&state.dir) > 0 {
        return;
    }
    let Some(projects) = state.dir.parent() else {
        return;
    };
    let mut name = std::ffi::OsString::from(".gc-");
    name.push(state.dir.file_name().unwrap_or_default());
    name.push(format!("-{}", std::process::id()));
    let trash = projects.join(name);
    if fs::rename(&state.dir, &trash).is_ok() {
        let _ = fs::remove_dir_all(&trash);
    }
}

/// Checks that the state directory is (or can be made) writable, without creating it.
pub fn check_writable(home: &StateHome) -> Result<()> {
    let mut probe: &Path = &home.dir;
    let is_dir = loop {
        if let Ok(m) = fs::metadata(probe) {
            break m.is_dir();
        }
        match probe.parent() {
            Some(p) => probe = p,
            None => break false,
        }
    };
    if nix::unistd::access(
        probe,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    )
    .is_err()
        || !is_dir
    {
        bail!(Fixable::new(
            format!(
                "the state directory {} is not writable ({} is not a writable directory)",
                home.dir.shown(),
                probe.shown()
            ),
            "fix its permissions or set CLAUDEBOX_HOME to a writable directory"
        )
        .at(probe));
    }
    Ok(())
}

/// Creates an empty file unless a regular file is there already (a symlink or anything
/// else is left to `open`, which refuses it).
fn touch(path: &Path, mode: u32) -> Result<()> {
    let (dir, name) = parent_and_name(path)?;
    dir.touch(name, mode)
        .with_context(|| format!("cannot create {}", path.shown()))
}

/// Writes `project-root` atomically when it is missing or names another path.
fn write_root_file(state: &ProjectState, root: &Path) -> Result<()> {
    let path = state.root_file();
    if fs::read(&path).ok().as_deref() == Some(root.as_os_str().as_bytes()) {
        return Ok(());
    }
    write_atomic(&path, root.as_os_str().as_bytes(), 0o600)
}

/// Records the mount point of the file system `root` is on (`root-mount`), when it changed:
/// a root missing later while that file system is not mounted is unknown to `--gc`, not
/// gone (a disk or tmpfs mounted by hand). Best effort: without a record `--gc` falls back
/// to what the mount table and fstab say.
fn write_root_mount(state: &ProjectState, root: &Path) {
    let Some(mount) = crate::host::mounts::mount_point_of(root) else {
        return;
    };
    let path = state.dir.join(ROOT_MOUNT_FILE);
    if fs::read(&path).ok().as_deref() != Some(mount.as_os_str().as_bytes()) {
        let _ = write_atomic(&path, mount.as_os_str().as_bytes(), 0o600);
    }
}

/// Write to a temporary file beside `path`, fsync, rename over `path`, fsync the
/// directory. The temporary name is unique per process and per call, so concurrent
/// writers (processes or threads) never share one.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    replace(path, bytes, mode, true)
}

/// Like [`write_atomic`] without the fsyncs: readers see the old or the new content,
/// never a mix, but a crash may lose the change. For files that only matter while the
/// machine is up (who runs a session now).
pub fn write_atomic_volatile(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    replace(path, bytes, mode, false)
}

fn replace(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> Result<()> {
    let (dir, name) = parent_and_name(path)?;
    dir.write_atomic(name, bytes, mode, durable)
        .with_context(|| format!("cannot write {}", path.shown()))
}

/// The directory of `path` opened as an anchor of [`beneath`], and its file name. For
/// files directly in claudebox's own directories (the state dir, `sessions/`), whose
/// parents no sandbox can write: the operation on the name is then beneath a descriptor.
fn parent_and_name(path: &Path) -> Result<(beneath::Dir, &Path)> {
    let dir = path.parent().context("path has no parent")?;
    let name = path.file_name().context("path has no file name")?;
    let d = beneath::Dir::open(dir).with_context(|| format!("cannot open {}", dir.shown()))?;
    Ok((d, Path::new(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_settings_copy_keeps_the_hosts_file_and_only_the_bypass_answer() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("projects")).unwrap();
        let (a, b) = (d.path().join("projects/a"), d.path().join("projects/b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        let (a, b) = (ProjectState { dir: a }, ProjectState { dir: b });
        let host = d.path().join("settings.json");
        fs::write(&host, r#"{"model": "x"}"#).unwrap();
        let read = |st: &ProjectState| -> serde_json::Value {
            serde_json::from_slice(&fs::read(st.user_settings()).unwrap()).unwrap()
        };
        refresh_user_settings(&a, Some(&host)).unwrap();
        assert_eq!(read(&a), serde_json::json!({"model": "x"}));
        // A sandbox of `a` writes the answer, and a hook beside it.
        fs::write(
            a.user_settings(),
            r#"{"model": "x", "skipDangerousModePermissionPrompt": true,
               "hooks": {"SessionStart": []}}"#,
        )
        .unwrap();
        keep_bypass_consent(&a);
        assert!(a.bypass_consent().exists());
        assert_eq!(
            a.bypass_consent(),
            d.path().join(crate::policy::layout::BYPASS_CONSENT_FILE)
        );
        // Both projects' next copies: the host's file and the answer, no hook.
        for st in [&a, &b] {
            refresh_user_settings(st, Some(&host)).unwrap();
            assert_eq!(
                read(st),
                serde_json::json!({"model": "x", "skipDangerousModePermissionPrompt": true})
            );
        }
        // The host's file is never written.
        assert_eq!(fs::read_to_string(&host).unwrap(), r#"{"model": "x"}"#);
        // No file on the host: {} and the answer; a file that is no JSON object: its bytes.
        refresh_user_settings(&b, None).unwrap();
        assert_eq!(
            read(&b),
            serde_json::json!({"skipDangerousModePermissionPrompt": true})
        );
        fs::write(&host, "// not json").unwrap();
        refresh_user_settings(&b, Some(&host)).unwrap();
        assert_eq!(fs::read(b.user_settings()).unwrap(), b"// not json");
        // Control: without the record, the copy has no answer.
        fs::remove_file(a.bypass_consent()).unwrap();
        fs::write(a.user_settings(), "{}").unwrap();
        refresh_user_settings(&a, None).unwrap();
        assert_eq!(read(&a), serde_json::json!({}));
    }

    #[test]
    fn local_settings_copy_keeps_the_hosts_file_and_only_saved_permissions() {
        let d = tempfile::tempdir().unwrap();
        let state = ProjectState {
            dir: d.path().to_path_buf(),
        };
        let host = d.path().join("host.json");
        fs::write(
            &host,
            r#"{"permissions": {"allow": ["Bash(ls:*)"]}, "model": "x"}"#,
        )
        .unwrap();
        // What a sandbox left in the copy: a rule claude saved, and a planted hook.
        fs::write(
            state.local_settings(),
            r#"{"permissions": {"allow": ["Bash(ls:*)", "Bash(make:*)"], "deny": ["Read(.env)"],
                "defaultMode": "bypassPermissions"},
               "hooks": {"SessionStart": []}, "enableAllProjectMcpServers": true}"#,
        )
        .unwrap();
        refresh_local_settings(&state, &host).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(state.local_settings()).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "permissions": {"allow": ["Bash(ls:*)", "Bash(make:*)"], "deny": ["Read(.env)"]},
                "model": "x"
            })
        );
        // The host's file is not written; a missing or broken one counts as {}.
        assert!(fs::read_to_string(&host)
            .unwrap()
            .contains("\"model\": \"x\""));
        fs::write(&host, "not json").unwrap();
        refresh_local_settings(&state, &host).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(state.local_settings()).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"permissions": {"allow": ["Bash(ls:*)", "Bash(make:*)"], "deny": ["Read(.env)"]}})
        );
        // A symlinked host file is not followed.
        fs::remove_file(&host).unwrap();
        let secret = d.path().join("secret.json");
        fs::write(&secret, r#"{"token": "SECRET"}"#).unwrap();
        std::os::unix::fs::symlink(&secret, &host).unwrap();
        refresh_local_settings(&state, &host).unwrap();
        assert!(!fs::read_to_string(state.local_settings())
            .unwrap()
            .contains("SECRET"));
    }
}
