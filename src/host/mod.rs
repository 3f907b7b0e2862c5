//! What the launcher looks up on the host before it plans: the home directory, bwrap,
//! where `claude` is installed, and which system paths exist. Read-only.

pub mod apparmor;
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
    Ok(ClaudeInstall {
        on_path,
        real,
        bind,
    })
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
pub fn find_bwrap() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CLAUDEBOX_BWRAP").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(Fixable::new(
            format!("CLAUDEBOX_BWRAP is {} but that is not a file", p.shown()),
            "point it at bwrap or unset it"
        )
        .at(&p));
    }
    which::which("bwrap").map_err(|_| {
        Fixable::new(
            "bwrap (bubblewrap) not found on PATH",
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
