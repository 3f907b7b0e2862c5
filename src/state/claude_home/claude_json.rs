//! `.claude.json` per project: the host's file filtered to this project, merged
//! three-way into the project's copy at each launch under claude's own lock.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use super::HostClaude;
use crate::host::project::Project;
use crate::state::{self, ProjectState};

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
/// update. Remembers the host's view for the next three-way merge.
pub fn sync_config(host: &HostClaude, st: &ProjectState, project: &Project) -> Result<()> {
    // Most launches: the host's file is the very one merged last time (same inode, size
    // and mtime), and the project's copy is there: nothing to read or parse.
    let stamp = host_stamp(&host.json);
    let stamp_path = st.claude_json_base().with_extension("stamp");
    if fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str())
        && is_regular(&st.claude_json())
    {
        return Ok(());
    }
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
    let base_path = st.claude_json_base();
    let path = st.claude_json();
    let read_base = || -> Option<Value> {
        fs::read(&base_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    };
    if read_base().as_ref() == Some(&host_view) && is_regular(&path) {
        // Nothing this project sees changed on the host since the last sync.
        state::write_atomic_volatile(&stamp_path, stamp.as_bytes(), 0o600)?;
        return Ok(());
    }
    {
        let _lock = ConfigLock::take(&path, &st.claude_json_lock_owner())?;
        // Another launch of the project may have merged the same host state meanwhile.
        let base = read_base();
        if base.as_ref() == Some(&host_view) && is_regular(&path) {
            return Ok(());
        }
        merge_into(&path, base.as_ref(), &host_view)?;
        state::write_atomic_volatile(&base_path, &serde_json::to_vec(&host_view)?, 0o600)?;
        state::write_atomic_volatile(&stamp_path, stamp.as_bytes(), 0o600)?;
    }
    // Durable after the lock is released, so the lock is held for as short as can be:
    // claude 2.1.x does not wait for it (a held lock makes it write without one).
    for p in [&path, &base_path] {
        if let Ok(f) = fs::File::open(p) {
            f.sync_all().ok();
        }
    }
    if let Ok(d) = fs::File::open(st.claude_config()) {
        d.sync_all().ok();
    }
    Ok(())
}

/// Under the lock: read the project's file, merge, and rename the result over it unless
/// the file changed since it was read (a claude that found the lock held writes without
/// it); then read and merge again.
fn merge_into(path: &Path, base: Option<&Value>, host_view: &Value) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let stamp = |m: &fs::Metadata| (m.ino(), m.size(), m.mtime(), m.mtime_nsec());
    for _ in 0..20 {
        let before = fs::symlink_metadata(path).ok().map(|m| stamp(&m));
        // The sandbox can write this directory: never follow a symlink it planted there
        // (to another project's file), never block on a FIFO. Anything but a regular
        // file counts as no file, and the rename below replaces it.
        let mine: Option<Value> = read_regular(path).and_then(|b| serde_json::from_slice(&b).ok());
        let merged = merge(base, host_view, mine.as_ref());
        if mine.as_ref() == Some(&merged) {
            return Ok(());
        }
        let mut text = serde_json::to_vec_pretty(&merged)?;
        text.push(b'\n');
        let tmp = tmp_beside(path)?;
        fs::write(&tmp, &text).with_context(|| format!("cannot write {}", tmp.display()))?;
        if fs::symlink_metadata(path).ok().map(|m| stamp(&m)) != before {
            let _ = fs::remove_file(&tmp);
            continue;
        }
        return fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()));
    }
    bail!(
        "{} keeps changing; the host's changes to ~/.claude.json come in at the next launch",
        path.display()
    )
}

/// The host file's identity as last seen: inode, size, mtime (empty when it is missing).
fn host_stamp(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path)
        .map(|m| format!("{} {} {} {}", m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
        .unwrap_or_default()
}

/// Whether `path` is a regular file (not through a symlink).
fn is_regular(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// The bytes of `path` when it is a regular file, opened without following a symlink and
/// without blocking.
fn read_regular(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut b = Vec::new();
    f.read_to_end(&mut b).ok()?;
    Some(b)
}

/// A new 0600 temporary file name beside `path`.
fn tmp_beside(path: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".tmp.claudebox.{}.{seq}", std::process::id()));
    let tmp = PathBuf::from(name);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    Ok(tmp)
}

/// claude's lock of `.claude.json`: the directory `<file>.lock`, made with `mkdir` and
/// removed after (proper-lockfile, which claude treats as stale after 10 s). The lock
/// directory stays empty, as claude's own `rmdir` needs; who holds it is written to
/// `owner` (in claudebox's state, out of the sandbox's reach): a launch killed while it
/// held the lock leaves an owner whose process is gone, and the next launch takes the lock
/// over at once instead of waiting for it to go stale.
pub struct ConfigLock {
    dir: PathBuf,
    owner: PathBuf,
}

/// As claude: a lock directory untouched for this long is abandoned.
const STALE: Duration = Duration::from_secs(10);
/// Longer than [`STALE`], so a lock left by a killed claude is always taken over.
const WAIT: Duration = Duration::from_secs(15);

impl ConfigLock {
    pub fn take(file: &Path, owner: &Path) -> Result<ConfigLock> {
        use std::os::unix::fs::MetadataExt;
        let mut dir = file.as_os_str().to_os_string();
        dir.push(".lock");
        let dir = PathBuf::from(dir);
        let start = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match fs::create_dir(&dir) {
                Ok(()) => {
                    let ino = fs::metadata(&dir).map(|m| m.ino()).unwrap_or(0);
                    let record = format!("{} {ino}\n", std::process::id());
                    state::write_atomic_volatile(owner, record.as_bytes(), 0o600)?;
                    return Ok(ConfigLock {
                        dir,
                        owner: owner.to_path_buf(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let meta = fs::metadata(&dir).ok();
                    let age = meta
                        .as_ref()
                        .and_then(|m| m.modified().ok())
                        .and_then(|t| SystemTime::now().duration_since(t).ok());
                    let abandoned = meta
                        .as_ref()
                        .is_some_and(|m| held_by_a_dead_launch(owner, m));
                    if abandoned || age.is_some_and(|a| a > STALE) {
                        let _ = fs::remove_dir(&dir);
                        continue;
                    }
                    if start.elapsed() > WAIT {
                        bail!(crate::policy::error::Fixable::new(
                            format!(
                                "{} is held by another claude for more than {}s",
                                dir.display(),
                                WAIT.as_secs()
                            ),
                            "if none runs, remove it"
                        )
                        .at(&dir));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create {}", dir.display()))
                }
            }
        }
    }
}

/// Whether `owner` says a claudebox process that no longer exists made this lock
/// directory (same inode, and made before the record was written: not a later one that
/// reuses the inode).
pub(super) fn held_by_a_dead_launch(owner: &Path, lock: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(text) = fs::read_to_string(owner) else {
        return false;
    };
    let Ok(written) = fs::metadata(owner) else {
        return false;
    };
    let (ino, made) = (lock.ino(), (lock.ctime(), lock.ctime_nsec()));
    if made > (written.mtime(), written.mtime_nsec()) {
        return false;
    }
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

impl Drop for ConfigLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.owner);
        let _ = fs::remove_dir(&self.dir);
    }
}
