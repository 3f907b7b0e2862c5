//! What the launcher looks up on the host before it plans: the home directory, bwrap,
//! where `claude` is installed, and which system paths exist. Read-only.

pub mod apparmor;
pub mod bwrap_cve;
pub mod companion;
pub mod diagnose;
pub mod exec;
pub mod fd;
pub mod gpu;
pub mod holders;
pub mod home;
pub mod limits;
pub mod mounts;
pub mod project;
pub mod protect;
pub mod sources;
pub mod supervise;
pub mod test_switch;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use crate::policy::error::Fixable;
use crate::policy::escape::Shown;
use crate::policy::facts::{ClaudeInstall, HostFacts, SystemEntry};
use anyhow::{bail, Context, Result};

/// System paths bound read-only when they exist, in this order.
pub const SYSTEM_PATHS: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix/store",
    "/nix/var/nix/profiles",
    "/run/current-system",
];

impl HostFacts {
    pub fn probe() -> HostFacts {
        let mut system = Vec::new();
        for p in SYSTEM_PATHS {
            let path = Path::new(p);
            let Ok(meta) = fs::symlink_metadata(path) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = fs::read_link(path) {
                    system.push((path.to_path_buf(), SystemEntry::Symlink(target)));
                }
            } else if meta.is_dir() {
                system.push((path.to_path_buf(), SystemEntry::Dir));
            }
        }
        let resolv_conf_target = fs::canonicalize("/etc/resolv.conf")
            .ok()
            .filter(|t| !t.starts_with("/etc") && !t.starts_with("/usr"));
        HostFacts {
            system,
            resolv_conf_target,
        }
    }
}

/// The user's home directory: `$HOME`, or the password database when HOME is unset or
/// empty (then HOME is set to it, so that the sandbox sees the same home claudebox used).
/// A relative HOME, or one that is not an existing directory, is refused: claudebox
/// creates nothing under a home it cannot be sure of.
pub fn home_dir() -> Result<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        let home = PathBuf::from(h);
        let shown = crate::policy::escape::shown(&home);
        if !home.is_absolute() {
            bail!(Fixable::new(
                format!("HOME is a relative path ({shown})"),
                "set HOME to your home directory's absolute path"
            ));
        }
        if !fs::metadata(&home).is_ok_and(|m| m.is_dir()) {
            bail!(Fixable::new(
                format!("HOME is {shown}, which is not an existing directory"),
                "set HOME to your home directory"
            )
            .at(&home));
        }
        return system_home(home);
    }
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .ok_or_else(|| {
            Fixable::new(
                "HOME is not set and the user has no password entry",
                "set HOME",
            )
        })?;
    if !user.dir.is_absolute() || !fs::metadata(&user.dir).is_ok_and(|m| m.is_dir()) {
        bail!(Fixable::new(
            format!(
                "HOME is not set and the password database's home {} is not an existing directory",
                crate::policy::escape::shown(&user.dir)
            ),
            "set HOME"
        )
        .at(&user.dir));
    }
    let home = system_home(user.dir)?;
    // Called on the main thread before any other starts.
    std::env::set_var("HOME", &home);
    Ok(home)
}

/// Refuses a home that is `/` or holds a system path (a service's `HOME=/`, `HOME=/usr`):
/// the sandbox's empty home is mounted over it, which would hide the system (bwrap then
/// fails with "execvp ...: No such file or directory").
fn system_home(home: PathBuf) -> Result<PathBuf> {
    let real = fs::canonicalize(&home).unwrap_or_else(|_| home.clone());
    if let Some(sys) = SYSTEM_PATHS
        .iter()
        .map(Path::new)
        .find(|s| s.starts_with(&real))
    {
        bail!(Fixable::new(
            format!(
                "HOME is {}, which holds the system ({}): the sandbox's empty home would be \
                 mounted over it",
                crate::policy::escape::shown(&home),
                crate::policy::escape::shown(sys)
            ),
            "set HOME to a directory of your own (e.g. HOME=/var/lib/NAME for a service)"
        ));
    }
    Ok(home)
}

/// Longest path bwrap can mount or enter: it prefixes `/newroot` (or `/oldroot`) to each,
/// and the result must fit in PATH_MAX (4096 bytes with its NUL).
pub const MAX_MOUNT_PATH: usize = 4096 - 1 - "/newroot".len();

/// Refuses a plan with a path bwrap would reject ("File name too long") before any
/// state is made.
pub fn check_path_lengths<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    for p in paths {
        let n = p.as_os_str().len();
        if n > MAX_MOUNT_PATH {
            let head = String::from_utf8_lossy(&p.as_os_str().as_bytes()[..48]).into_owned();
            bail!(Fixable::new(
                format!(
                    "the path {}... is {n} bytes long; bwrap cannot mount or enter a path \
                     longer than {MAX_MOUNT_PATH} bytes",
                    head.escape_debug()
                ),
                "move the project to a shorter path"
            ));
        }
    }
    Ok(())
}

/// Finds `claude` on the host's PATH.
pub fn find_claude(home: &Path) -> Result<ClaudeInstall> {
    find_agent(crate::policy::agent::AgentId::Claude.row(), home)
}

/// Finds an agent's binary on the host's PATH, and what of its installation to bind: the
/// npm package holding it, or its whole npm scope (`@openai/`) when the package lies in one
/// (Codex's launcher finds its native binary in a sibling package, `@openai/codex-linux-x64`).
pub fn find_agent(agent: &crate::policy::agent::Agent, home: &Path) -> Result<ClaudeInstall> {
    let on_path = which::which(agent.binary)
        .map_err(|_| Fixable::new(format!("no `{}` on PATH", agent.binary), agent.install))?;
    let real = fs::canonicalize(&on_path)
        .with_context(|| format!("cannot resolve {}", on_path.shown()))?;
    let mut bind = package_root(&real, home).unwrap_or_else(|| real.clone());
    if agent.id != crate::policy::agent::AgentId::Claude {
        if let Some(scope) = bind.parent().filter(|p| {
            p.file_name()
                .is_some_and(|n| n.as_encoded_bytes().starts_with(b"@"))
        }) {
            bind = scope.to_path_buf();
        }
    }
    let mut shim = false;
    if bind == real {
        if let Some(root) = shim_root(&real, home, agent.binary)? {
            bind = root;
            shim = true;
        }
    }
    // A pnpm shim's own #! is the system's sh; the interpreter that matters is the
    // node it execs by name (Codex's launcher), found on PATH as the shim would.
    let interpreter = shim
        .then(|| shim_node(&real, std::env::var_os("PATH")))
        .flatten()
        .or_else(|| script_interpreter(&real));
    Ok(ClaudeInstall {
        on_path,
        real,
        bind,
        interpreter,
    })
}

/// pnpm's global install puts a shell script (its cmd-shim) on PATH, not a link: it
/// execs the package under the pnpm home (`global/`, and the store it links into), and
/// names that target on its last line (`# cmd-shim-target=PATH`). The directory to bind
/// is the nearest one holding both the shim and the target's real file: the pnpm home. A
/// target outside it (a store elsewhere) would need the home or more bound: refused.
fn shim_root(shim: &Path, home: &Path, name: &str) -> Result<Option<PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    // A shim is a few kilobytes of shell; the native binaries (a file of their own, as the
    // native installer's) are hundreds of megabytes, never read here.
    const MAX: u64 = 64 * 1024;
    let mut text = Vec::new();
    let read = fs::File::open(shim).and_then(|f| {
        use std::io::Read;
        f.take(MAX + 1).read_to_end(&mut text)
    });
    if read.is_err() || text.len() as u64 > MAX || !text.starts_with(b"#!") {
        return Ok(None);
    }
    const MARK: &[u8] = b"\n# cmd-shim-target=";
    let Some(at) = text.windows(MARK.len()).rposition(|w| w == MARK) else {
        return Ok(None);
    };
    let rest = &text[at + MARK.len()..];
    let line = &rest[..rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len())];
    let target = Path::new(std::ffi::OsStr::from_bytes(line));
    let Ok(real) = fs::canonicalize(target) else {
        return Ok(None);
    };
    let root = shim
        .ancestors()
        .skip(1)
        .find(|d| real.starts_with(d))
        .unwrap_or(Path::new("/"));
    if home.starts_with(root) {
        bail!(Fixable::new(
            format!(
                "`{name}` on PATH is a pnpm shim ({}) whose package ({}) lies outside its \
                 pnpm home; claudebox would have to show all of {} to run it",
                shim.shown(),
                real.shown(),
                root.shown()
            ),
            format!(
                "keep pnpm's store under PNPM_HOME (pnpm's default), or install {name} with \
                 npm (npm install -g)"
            )
        ));
    }
    Ok(Some(root.to_path_buf()))
}

/// The `node` a pnpm shim execs by name (`exec node "$basedir/..."`), found on `path`;
/// `None` when it execs no node by name (a native binary, or `$basedir/node`).
fn shim_node(shim: &Path, path: Option<OsString>) -> Option<crate::policy::facts::Interpreter> {
    use std::io::Read;
    let mut text = Vec::new();
    fs::File::open(shim)
        .and_then(|f| f.take(64 * 1024).read_to_end(&mut text))
        .ok()?;
    if !text.windows(10).any(|w| w == b"exec node ") {
        return None;
    }
    let cwd = std::env::current_dir().ok()?;
    let on_path = which::which_in("node", path, cwd).ok()?;
    let real = fs::canonicalize(&on_path).ok()?;
    Some(crate::policy::facts::Interpreter { on_path, real })
}

/// The interpreter a script's `#!` line names, found as the kernel (an absolute path) or
/// `env` (a name on PATH, after `env`'s options such as `-S`) would find it; `None` for a
/// binary or when it is not there.
fn script_interpreter(file: &Path) -> Option<crate::policy::facts::Interpreter> {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    let mut head = [0u8; 256];
    let mut f = fs::File::open(file).ok()?;
    let n = f.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n')?];
    let mut words = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| Path::new(std::ffi::OsStr::from_bytes(w)));
    let prog = words.next()?;
    let on_path = if prog.file_name().is_some_and(|n| n == "env") {
        let name = words.find(|w| !w.as_os_str().as_bytes().starts_with(b"-"))?;
        which::which(name).ok()?
    } else {
        prog.to_path_buf()
    };
    let real = fs::canonicalize(&on_path).ok()?;
    Some(crate::policy::facts::Interpreter { on_path, real })
}

/// The nearest ancestor holding a `package.json` (an npm package needs its whole
/// directory: vendored ripgrep, scripts), stopping at the home directory and `/`.
fn package_root(real: &Path, home: &Path) -> Option<PathBuf> {
    for dir in real.ancestors().skip(1) {
        if dir == home || dir.parent().is_none() {
            return None;
        }
        if dir.join("package.json").is_file() {
            return Some(dir.to_path_buf());
        }
    }
    None
}

/// bwrap: `$CLAUDEBOX_BWRAP` (an absolute path, as the Nix package sets it), or PATH.
/// Only for `--check` and the AppArmor steps, which run no sandbox; a launch finds it
/// with [`find_bwrap_outside`].
pub fn find_bwrap() -> Result<PathBuf> {
    find_bwrap_outside(&[])
}

/// bwrap as [`find_bwrap`] finds it, but never from a `PATH` entry that is relative (it
/// names the working directory, the project) or lies in one of `written` (canonical
/// directories a sandbox of this project writes): bwrap runs on the host, so a `bwrap`
/// the agent planted in the project's `.venv/bin` or `node_modules/.bin`, on the
/// launcher's PATH because the user activated it, would run outside the sandbox at the
/// next launch (issue 34: no host process from a place the agent writes). Such entries
/// are passed over, as if absent; `$CLAUDEBOX_BWRAP` in such a place is refused.
pub fn find_bwrap_outside(written: &[PathBuf]) -> Result<PathBuf> {
    let is_written = |p: &Path| {
        let c = fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        !c.is_absolute() || written.iter().any(|w| c.starts_with(w))
    };
    if let Some(p) = std::env::var_os("CLAUDEBOX_BWRAP").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_absolute() || is_written(&p) {
            bail!(Fixable::new(
                format!(
                    "CLAUDEBOX_BWRAP is {}, a place the sandbox can write",
                    p.shown()
                ),
                "point it at the system's bwrap (an absolute path outside the project)"
            )
            .at(&p));
        }
        if p.is_file() {
            return Ok(p);
        }
        bail!(Fixable::new(
            format!("CLAUDEBOX_BWRAP is {} but that is not a file", p.shown()),
            "point it at bwrap or unset it"
        )
        .at(&p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let unfiltered = companion::in_launchers_dir();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|d| unfiltered || (d.is_absolute() && !is_written(d)))
        .collect();
    let joined = std::env::join_paths(&dirs).unwrap_or_default();
    which::which_in("bwrap", Some(joined), "/").map_err(|_| {
        Fixable::new(
            "bwrap (bubblewrap) not found on PATH (outside the project)",
            "install it (Debian/Ubuntu: apt install bubblewrap, Fedora: dnf install bubblewrap, \
             NixOS: add bubblewrap to environment.systemPackages)",
        )
        .into()
    })
}

/// A fresh random 128-bit id as 32 hex characters.
pub fn random_id() -> Result<String> {
    let mut buf = [0u8; 16];
    use std::io::Read;
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("cannot read /dev/urandom")?;
    Ok(hex::encode(buf))
}

/// The current directory, with a clear message when it has vanished.
pub fn current_dir() -> Result<PathBuf> {
    std::env::current_dir().map_err(|e| {
        Fixable::new(
            format!("the current directory is gone or unreadable ({e})"),
            "cd to an existing directory",
        )
        .into()
    })
}

/// The process arguments as `OsString`s.
pub fn args_os() -> Vec<OsString> {
    std::env::args_os().collect()
}

/// The Landlock ABI version the running kernel offers (0 without Landlock).
pub fn landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: nix::libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset with a null attribute, size 0 and the VERSION flag
    // only returns the ABI version (or -1 with errno); it touches no memory.
    let v = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).unwrap_or(0)
}

/// claudebox's own executable: it runs inside as the sandbox's first step
/// (`--sandbox-init`). The kernel's `/proc/self/exe` has its symlinks resolved already;
/// when the file was removed or replaced since it started (an upgrade), that path no
/// longer names it.
pub fn own_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find claudebox's own executable")?;
    if !exe.is_file() {
        bail!(Fixable::new(
            format!(
                "claudebox's own executable {} is gone (upgraded while starting?)",
                exe.shown()
            ),
            "run claudebox again"
        )
        .at(&exe));
    }
    Ok(exe)
}

/// The host IPC variables set in this process's environment, in table order.
pub fn ipc_vars_present() -> Vec<OsString> {
    crate::policy::ipc::HOST_IPC_VARS
        .iter()
        .filter(|(name, _)| std::env::var_os(name).is_some())
        .map(|(name, _)| OsString::from(name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A pnpm home as pnpm lays it out: the shim in bin/, the package in the store,
    /// reached through global/ links; `store` elsewhere when given.
    fn pnpm_home(top: &Path, store: Option<&Path>) -> PathBuf {
        let pnpm = top.join("home/.local/share/pnpm");
        let store = store.map_or_else(|| pnpm.join("store"), Path::to_path_buf);
        let pkg = store
            .join("v11/links/@anthropic-ai/claude-code/1/node_modules/@anthropic-ai/claude-code");
        fs::create_dir_all(pkg.join("bin")).unwrap();
        fs::write(pkg.join("bin/claude.exe"), "\x7fELF").unwrap();
        fs::create_dir_all(pnpm.join("global/v11/h/node_modules/@anthropic-ai")).unwrap();
        symlink(
            &pkg,
            pnpm.join("global/v11/h/node_modules/@anthropic-ai/claude-code"),
        )
        .unwrap();
        fs::create_dir_all(pnpm.join("bin")).unwrap();
        let target =
            pnpm.join("global/v11/h/node_modules/@anthropic-ai/claude-code/bin/claude.exe");
        fs::write(
            pnpm.join("bin/claude"),
            format!(
                "#!/bin/sh\nexec \"$basedir\"/../global/v11/h/node_modules/@anthropic-ai/claude-code/bin/claude.exe \"$@\"\nexit $?\n# cmd-shim-target={}\n",
                target.display()
            ),
        )
        .unwrap();
        pnpm
    }

    /// pnpm's shim: the pnpm home is bound (the shim and its store's target in it); a
    /// store outside it would need the home itself: one line, what to do; a script
    /// without the mark is left as it is; the shim's `#!` names the system's sh.
    #[test]
    fn a_pnpm_shim_binds_its_pnpm_home_or_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let top = fs::canonicalize(t.path()).unwrap();
        let home = top.join("home");
        let pnpm = pnpm_home(&top, None);
        let shim = pnpm.join("bin/claude");
        assert_eq!(
            shim_root(&shim, &home, "claude").unwrap(),
            Some(pnpm.clone())
        );
        let i = script_interpreter(&shim).unwrap();
        assert_eq!(i.on_path, Path::new("/bin/sh"));

        let t2 = tempfile::tempdir().unwrap();
        let top2 = fs::canonicalize(t2.path()).unwrap();
        let pnpm2 = pnpm_home(&top2, Some(&top2.join("home/pnpm-store")));
        let e = shim_root(&pnpm2.join("bin/claude"), &top2.join("home"), "claude").unwrap_err();
        let f = crate::policy::error::find(&e).unwrap();
        assert!(
            f.what.contains("pnpm shim") && f.fix.contains("PNPM_HOME"),
            "{f:?}"
        );

        fs::write(top.join("plain"), "#!/usr/bin/env node\nconsole.log(1)\n").unwrap();
        assert_eq!(
            shim_root(&top.join("plain"), &home, "claude").unwrap(),
            None
        );
        // The shim of a launcher run by node (pnpm's for Codex): that node, from PATH.
        let bin = top.join("nvm-bin");
        fs::create_dir_all(&bin).unwrap();
        fs::write(bin.join("node"), "").unwrap();
        fs::set_permissions(
            bin.join("node"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        fs::write(
            top.join("codex-shim"),
            "#!/bin/sh\nexec node  \"$basedir/../global/x/codex.js\" \"$@\"\n",
        )
        .unwrap();
        let i = shim_node(&top.join("codex-shim"), Some(bin.clone().into())).unwrap();
        assert_eq!(i.on_path, bin.join("node"));
        assert!(
            shim_node(&shim, Some(bin.into())).is_none(),
            "claude's execs its binary"
        );

        // A big file (a native binary) is not read as a shim, whatever it ends with (it
        // was read whole, 245 MB, at every launch of the native installer's claude).
        let mut big = fs::read(pnpm.join("bin/claude")).unwrap();
        big.splice(2..2, vec![b'#'; 70 * 1024]);
        fs::write(top.join("big"), &big).unwrap();
        assert_eq!(shim_root(&top.join("big"), &home, "claude").unwrap(), None);
    }
}
