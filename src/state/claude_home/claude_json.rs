//! `.claude.json` per project: the host's file filtered to this project, merged
//! three-way into the project's copy at each launch under claude's own lock.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use super::HostClaude;
use crate::policy::escape::Shown;
use crate::policy::facts::Project;
use crate::state::beneath::{self, Dir};
use crate::state::{ProjectState, CLAUDE_CONFIG_DIR, CLAUDE_JSON_BASE};

/// Whether a path key of `.claude.json` is this project's: the work tree or inside it,
/// or the main work tree of its repository or inside that.
pub fn is_this_project(key: &str, project: &Project) -> bool {
    let p = Path::new(key);
    if p.starts_with(&project.work_tree) {
        return true;
    }
    match project.root.file_name() {
        Some(n) if n == ".git" => project
            .root
            .parent()
            .is_some_and(|main| p.starts_with(main)),
        _ => false,
    }
}

/// The host's `.claude.json` as this project may see it: every user-level key, and of
/// the two keys that name projects only this project's part: `projects` (per-project
/// trust, last session id, costs, local-scope MCP servers with their secrets, keyed by
/// path) and `githubRepoPaths` (where each GitHub repository is checked out).
pub fn filter_for_project(host: &Value, project: &Project) -> Value {
    let Some(obj) = host.as_object() else {
        return Value::Object(Map::new());
    };
    let mut out = Map::new();
    for (k, v) in obj {
        match k.as_str() {
            "projects" => {
                let kept: Map<String, Value> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(path, _)| is_this_project(path, project))
                    .map(|(a, b)| (a.clone(), b.clone()))
                    .collect();
                out.insert(k.clone(), Value::Object(kept));
            }
            "githubRepoPaths" => {
                let mut kept = Map::new();
                for (repo, paths) in v.as_object().into_iter().flatten() {
                    let mine: Vec<Value> = paths
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|p| p.as_str().is_some_and(|s| is_this_project(s, project)))
                        .cloned()
                        .collect();
                    if !mine.is_empty() {
                        kept.insert(repo.clone(), Value::Array(mine));
                    }
                }
                out.insert(k.clone(), Value::Object(kept));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Keys merged one level down (per MCP server name, per project path).
const NESTED: &[&str] = &["mcpServers", "projects", "githubRepoPaths"];

/// Three-way merge of the host's view into the project's file: what the host changed
/// since the last sync (`base` to `host`) wins, per top-level key and, for [`NESTED`]
/// keys, per sub-key; everything else stays as the project has it.
pub fn merge(base: Option<&Value>, host: &Value, mine: Option<&Value>) -> Value {
    let empty = Map::new();
    let Some(mine) = mine.and_then(Value::as_object) else {
        return host.clone();
    };
    let base = base.and_then(Value::as_object).unwrap_or(&empty);
    let host = host.as_object().unwrap_or(&empty);
    let mut out = mine.clone();
    let keys: Vec<&String> = host.keys().chain(base.keys()).collect();
    for k in keys {
        let (b, h) = (base.get(k), host.get(k));
        if b == h {
            continue;
        }
        if NESTED.contains(&k.as_str()) {
            let (bo, ho) = (
                b.and_then(Value::as_object).unwrap_or(&empty),
                h.and_then(Value::as_object).unwrap_or(&empty),
            );
            let mut m = out
                .get(k)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            for sk in ho.keys().chain(bo.keys()) {
                match (bo.get(sk), ho.get(sk)) {
                    (x, y) if x == y => {}
                    (_, Some(y)) => {
                        m.insert(sk.clone(), y.clone());
                    }
                    (_, None) => {
                        m.remove(sk);
                    }
                }
            }
            out.insert(k.clone(), Value::Object(m));
        } else {
            match h {
                Some(h) => out.insert(k.clone(), h.clone()),
                None => out.remove(k),
            };
        }
    }
    Value::Object(out)
}

/// At launch: brings the host's changes into the project's `.claude.json` under claude's
/// own lock (a `mkdir` lock directory beside the file), written to a temporary file and
/// renamed, so a running sandbox of the project never reads half a file or loses its
/// update. Remembers the host's view for the next three-way merge. Everything in the
/// project's state goes through [`beneath`] (its `claude-config` is the sandboxes').
pub fn sync_config(host: &HostClaude, st: &ProjectState, project: &Project) -> Result<()> {
    let state_dir =
        Dir::open(&st.dir).with_context(|| format!("cannot open {}", st.dir.display()))?;
    let config = state_dir
        .sub(Path::new(CLAUDE_CONFIG_DIR))
        .with_context(|| format!("cannot open {}", st.claude_config().display()))?;
    let json = Path::new(JSON);
    let base_name = Path::new(CLAUDE_JSON_BASE);
    let stamp_name = PathBuf::from(CLAUDE_JSON_BASE).with_extension("stamp");
    // Most launches: the host's file is the very one merged last time (same inode, size
    // and mtime), and the project's copy is there: nothing to read or parse.
    let stamp = host_stamp(&host.json);
    if state_dir.read(&stamp_name).ok().as_deref() == Some(stamp.as_bytes()) && config.is_file(json)
    {
        return Ok(());
    }
    // The host's own file: not in a directory any sandbox can write.
    let host_view = match fs::read(&host.json) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => Some(filter_for_project(&v, project)),
            // The host's claude is between writes, or the file is broken: keep the
            // project's copy as it is and try again next launch.
            Err(_) => None,
        },
        Err(e) if e.kind() == ErrorKind::NotFound => Some(Value::Object(Map::new())),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", host.json.display())),
    };
    let Some(host_view) = host_view else {
        return Ok(());
    };
    let read_base = || -> Option<Value> {
        state_dir
            .read(base_name)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    };
    let write = |name: &Path, bytes: &[u8]| {
        state_dir
            .write_atomic(name, bytes, 0o600, false)
            .with_context(|| format!("cannot write {}", state_dir.shown(name).display()))
    };
    if read_base().as_ref() == Some(&host_view) && config.is_file(json) {
        // Nothing this project sees changed on the host since the last sync.
        write(&stamp_name, stamp.as_bytes())?;
        return Ok(());
    }
    {
        let _lock = ConfigLock::take(&config, json, &state_dir, Path::new(LOCK_OWNER))?;
        // Another launch of the project may have merged the same host state meanwhile.
        let base = read_base();
        if base.as_ref() == Some(&host_view) && config.is_file(json) {
            return Ok(());
        }
        merge_into(&config, json, base.as_ref(), &host_view)?;
        write(base_name, &serde_json::to_vec(&host_view)?)?;
        write(&stamp_name, stamp.as_bytes())?;
    }
    // Durable after the lock is released, so the lock is held for as short as can be:
    // claude 2.1.x does not wait for it (a held lock makes it write without one).
    if let Ok(f) = config.open_read(json) {
        f.sync_all().ok();
    }
    if let Ok(f) = state_dir.open_read(base_name) {
        f.sync_all().ok();
    }
    config.sync().ok();
    Ok(())
}

/// The project's `.claude.json`, in its `claude-config`.
const JSON: &str = ".claude.json";
/// Who holds claude's lock of it for a launch, in the project's state (out of reach).
const LOCK_OWNER: &str = "claude-json-lock-owner";

/// Under the lock: read the project's file, merge, and rename the result over it unless
/// the file changed since it was read (a claude that found the lock held writes without
/// it); then read and merge again. The temporary file is created `O_EXCL` beneath the
/// directory's descriptor and written through the descriptor that created it: an agent
/// swapping a symlink, FIFO or directory in at any moment makes it fail, never follow.
fn merge_into(config: &Dir, json: &Path, base: Option<&Value>, host_view: &Value) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let stamp = |s: &beneath::Stat| (s.st_ino, s.st_size, s.st_mtime, s.st_mtime_nsec);
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for _ in 0..20 {
        let before = config.stat(json).ok().map(|s| stamp(&s));
        // Anything but a regular file counts as no file, and the rename below replaces it.
        let mine: Option<Value> = config
            .read(json)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let merged = merge(base, host_view, mine.as_ref());
        if mine.as_ref() == Some(&merged) {
            return Ok(());
        }
        let mut text = serde_json::to_vec_pretty(&merged)?;
        text.push(b'\n');
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = PathBuf::from(format!("{JSON}.tmp.claudebox.{}.{seq}", std::process::id()));
        let written = config.create_new(&tmp, 0o600).and_then(|mut f| {
            use std::io::Write;
            f.write_all(&text)?;
            f.metadata()
        });
        let ours = match written {
            Ok(m) => (m.dev(), m.ino()),
            Err(e) => {
                let _ = config.remove_file(&tmp);
                return Err(e)
                    .with_context(|| format!("cannot write {}", config.shown(&tmp).display()));
            }
        };
        // The name may have been swapped meanwhile (a sibling sandbox): then what would be
        // renamed is not ours; try again with a new name.
        let is_ours = |p: &Path| config.stat(p).is_ok_and(|s| (s.st_dev, s.st_ino) == ours);
        if config.stat(json).ok().map(|s| stamp(&s)) != before || !is_ours(&tmp) {
            let _ = config.remove_all(&tmp);
            continue;
        }
        if config.rename(&tmp, json).is_err() || !is_ours(json) {
            let _ = config.remove_all(&tmp);
            continue;
        }
        return Ok(());
    }
    // Changed under every try (claude writing without the lock, or a sibling sandbox
    // swapping names): the project keeps its copy; nothing is lost but the host's news.
    eprintln!(
        "claudebox: warning: {} keeps changing; the host's changes to ~/.claude.json come in \
         at the next launch",
        config.shown(json).shown()
    );
    Ok(())
}

/// The host file's identity as last seen: inode, size, mtime (empty when it is missing).
fn host_stamp(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path)
        .map(|m| format!("{} {} {} {}", m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
        .unwrap_or_default()
}

/// claude's lock of `.claude.json`: the directory `<file>.lock`, made with `mkdir` and
/// removed after (proper-lockfile, which claude treats as stale after 10 s). The lock
/// directory stays empty, as claude's own `rmdir` needs; who holds it is written to
/// `owner` (in claudebox's state, out of the sandbox's reach): a launch killed while it
/// held the lock leaves an owner whose process is gone, and the next launch takes the lock
/// over at once instead of waiting for it to go stale. A lock an agent planted (dated in
/// the future, not an empty directory, or untouched past the stale time) is removed at
/// once ([`beneath::clear_planted_lock`]): it never holds a launch up.
pub struct ConfigLock<'a> {
    config: &'a Dir,
    dir: PathBuf,
    state: &'a Dir,
    owner: PathBuf,
}

/// Longer than claude's stale time, so a lock left by a killed claude is always taken over.
const WAIT: Duration = Duration::from_secs(15);

impl<'a> ConfigLock<'a> {
    pub fn take(
        config: &'a Dir,
        file: &Path,
        state: &'a Dir,
        owner: &Path,
    ) -> Result<ConfigLock<'a>> {
        let mut dir = file.as_os_str().to_os_string();
        dir.push(".lock");
        let dir = PathBuf::from(dir);
        let start = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match config.mkdir(&dir, 0o700) {
                Ok(()) => {
                    let ino = config.stat(&dir).map(|s| s.st_ino).unwrap_or(0);
                    let record = format!("{} {ino}\n", std::process::id());
                    state
                        .write_atomic(owner, record.as_bytes(), 0o600, false)
                        .with_context(|| {
                            format!("cannot write {}", state.shown(owner).display())
                        })?;
                    return Ok(ConfigLock {
                        config,
                        dir,
                        state,
                        owner: owner.to_path_buf(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let abandoned = config
                        .stat(&dir)
                        .is_ok_and(|s| held_by_a_dead_launch(state, owner, &s));
                    if abandoned {
                        let _ = config.remove_dir(&dir);
                        continue;
                    }
                    if beneath::clear_planted_lock(config, &dir) {
                        continue;
                    }
                    if start.elapsed() > WAIT {
                        bail!(crate::policy::error::Fixable::new(
                            format!(
                                "{} is held by another claude for more than {}s",
                                config.shown(&dir).display(),
                                WAIT.as_secs()
                            ),
                            "if none runs, remove it"
                        )
                        .at(config.shown(&dir)));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("cannot create {}", config.shown(&dir).display()))
                }
            }
        }
    }
}

/// Whether `owner` says a claudebox process that no longer exists made this lock
/// directory (same inode, and made before the record was written: not a later one that
/// reuses the inode).
pub(super) fn held_by_a_dead_launch(state: &Dir, owner: &Path, lock: &beneath::Stat) -> bool {
    let Ok(text) = state.read(owner) else {
        return false;
    };
    let Ok(written) = state.stat(owner) else {
        return false;
    };
    let (ino, made) = (lock.st_ino, (lock.st_ctime, lock.st_ctime_nsec));
    if made > (written.st_mtime, written.st_mtime_nsec) {
        return false;
    }
    let text = String::from_utf8_lossy(&text);
    let mut it = text.split_whitespace();
    let (Some(pid), Some(recorded)) = (
        it.next().and_then(|p| p.parse::<i32>().ok()),
        it.next().and_then(|i| i.parse::<u64>().ok()),
    ) else {
        return false;
    };
    recorded == ino
        && pid > 0
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH)
}

impl Drop for ConfigLock<'_> {
    fn drop(&mut self) {
        let _ = self.state.remove_file(&self.owner);
        let _ = self.config.remove_dir(&self.dir);
    }
}
