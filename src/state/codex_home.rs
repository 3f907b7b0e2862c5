//! `~/.codex` inside a Codex sandbox (`--agent codex`): the I/O of `policy::codex_home`.
//! What the host has ([`HostCodex::probe`]), and before each launch ([`prepare`]): the
//! project's own Codex directory with a mount point of the right type for every entry
//! bound over it, the login's directory, and `auth.json` in the project's directory a
//! symlink to the login's (made again at each launch: an agent may have replaced it, and
//! Codex's `logout` deletes it). Both directories are written by sandboxes: every call here
//! goes through `state::beneath`, never following a name.

use std::ffi::OsString;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::state::{self, beneath, ProjectState};

use crate::policy::claude_home::Overlay;
use crate::policy::codex_home::{HostCodex, LOGIN_FILE};

impl HostCodex {
    /// Reads the real Codex directory's entry names (one `readdir`).
    pub fn probe(home: &Path) -> HostCodex {
        let dir = match std::env::var_os("CODEX_HOME") {
            Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d),
            _ => home.join(".codex"),
        };
        let mut entries: Vec<(OsString, bool)> = fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let ft = e.file_type().ok()?;
                // A symlink counts as what it leads to (bwrap binds its target).
                let is_dir = if ft.is_symlink() {
                    fs::metadata(e.path()).ok()?.is_dir()
                } else {
                    ft.is_dir()
                };
                Some((e.file_name(), is_dir))
            })
            .collect();
        entries.sort();
        HostCodex { dir, entries }
    }
}

/// Makes the project's `~/.codex`, the login's directory, the mount points of `overlays`
/// and the login's symlink; seeds the login from the host's `auth.json` when it has none.
pub fn prepare(
    home: &Path,
    host: &HostCodex,
    st: &ProjectState,
    overlays: &[Overlay],
) -> Result<()> {
    let dir_path = st.codex_home();
    let login_path = st.codex_login_dir();
    state::mkdir_private(&dir_path)?;
    state::mkdir_private(&login_path)?;
    let dir = open_root(&dir_path)?;
    let login = open_root(&login_path)?;
    let inside = home.join(".codex");
    for o in overlays {
        let (target, file) = match o {
            Overlay::Bind { target, file, .. } => (target, *file),
            Overlay::EmptyDir { target, .. } | Overlay::Tmpfs { target, .. } => (target, false),
        };
        // Only the entries directly in the project's directory are mount points here.
        let Ok(rel) = target.strip_prefix(&inside) else {
            continue;
        };
        if rel.as_os_str().is_empty() || rel.components().count() != 1 {
            continue;
        }
        let want = if file {
            beneath::FileType::RegularFile
        } else {
            beneath::FileType::Directory
        };
        ensure(&dir, rel, want, || {
            if file {
                dir.create_new(rel, 0o600).map(drop)
            } else {
                dir.mkdir(rel, 0o700)
            }
        })
        .with_context(|| format!("cannot create {}", dir_path.join(rel).display()))?;
    }
    // The login: the host's auth.json copied in once, when the login has none.
    let name = Path::new(LOGIN_FILE);
    if login.kind(name).is_none() {
        if let Ok(bytes) = fs::read(host.dir.join(LOGIN_FILE)) {
            match login.create_new(name, 0o600) {
                Ok(mut f) => {
                    use std::io::Write;
                    f.write_all(&bytes).with_context(|| {
                        format!("cannot write {}", login_path.join(name).display())
                    })?;
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot create {}", login_path.join(name).display())
                    })
                }
            }
        }
    }
    let target = login_path.join(LOGIN_FILE);
    if dir.read_link(name).ok().as_deref() != Some(target.as_path()) {
        if dir.kind(name).is_some() {
            // Left by an agent (the directory is writable inside), or Codex's own file
            // after a logout and login inside: never the user's.
            dir.remove_all(name)
                .with_context(|| format!("cannot replace {}", dir_path.join(name).display()))?;
        }
        match dir.symlink(&target, name) {
            Err(e)
                if e.kind() == ErrorKind::AlreadyExists
                    && dir.read_link(name).ok().as_deref() == Some(target.as_path()) => {}
            r => r.with_context(|| format!("cannot create {}", dir_path.join(name).display()))?,
        }
    }
    Ok(())
}

/// `rel` is a `want` in `dir`: anything else there (a symlink, the wrong type) is removed
/// and `make` makes it.
fn ensure(
    dir: &beneath::Dir,
    rel: &Path,
    want: beneath::FileType,
    make: impl Fn() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let kind = dir.kind(rel);
    if kind == Some(want) {
        return Ok(());
    }
    if kind.is_some() {
        match dir.remove_all(rel) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    match make() {
        Err(e) if e.kind() == ErrorKind::AlreadyExists && dir.kind(rel) == Some(want) => Ok(()),
        r => r,
    }
}

fn open_root(p: &Path) -> Result<beneath::Dir> {
    beneath::Dir::open(p).with_context(|| format!("cannot open {}", p.display()))
}
