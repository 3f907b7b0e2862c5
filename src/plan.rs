//! The sandbox plan: one pure function from what was found on the host to a typed list of
//! mounts, environment changes and the command to run. Nothing here touches the disk.
//!
//! Mount order (bwrap applies mounts in argv order, and a later mount over the same or a
//! parent path wins, so a child placed before its parent would be shadowed):
//!
//! 1. the system, read-only (`/usr`, `/etc`, `/bin`, `/lib*`, `/opt`, `/nix/store`, ...),
//!    with merged-usr symlinks recreated as symlinks;
//! 2. `/dev`, a new `/proc`, a fresh `/tmp`;
//! 3. an empty writable tmpfs over `$HOME`;
//! 4. the project's work tree read-write at its real path, then its git dirs that lie
//!    outside it;
//! 5. the `claude` installation, read-only, and git's configuration, read-only;
//! 6. the real `~/.claude`, read-write, then over it, in this order, the project's
//!    conversations (`~/.claude/projects`), the project's history
//!    (`~/.claude/history.jsonl`) and a private `~/.claude/sessions`;
//! 7. the shared `~/.claude.json`;
//! 8. in allowlist mode, claudebox itself at `/run/claudebox/claudebox` (read-only), the
//!    sandbox's first program, which hands the proxy its port (see `netbridge`).
//!
//! The `~/.claude` group comes after the project so that it still wins when the project
//! is the home directory itself (only allowed with `--yes`).

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::host::{ClaudeInstall, HostFacts, SystemEntry};
use crate::netbridge;
use crate::network::{self, NetworkMode, ProxySpec};
use crate::project::Project;
use crate::state::ProjectState;

/// How a path appears inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountKind {
    /// Read-only bind of a host path.
    Ro,
    /// Read-only bind of a host path that is skipped when the source is missing.
    RoTry,
    /// Read-write bind of a host directory.
    Rw,
    /// Read-write bind of a single host file.
    File,
    /// An empty in-memory file system.
    Tmpfs,
    /// A symlink pointing at `source`.
    Symlink,
    /// A minimal `/dev`.
    Dev,
    /// A new `/proc` for the new pid namespace.
    Proc,
}

impl fmt::Display for MountKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MountKind::Ro => "ro",
            MountKind::RoTry => "ro?",
            MountKind::Rw => "rw",
            MountKind::File => "file",
            MountKind::Tmpfs => "tmpfs",
            MountKind::Symlink => "symlink",
            MountKind::Dev => "dev",
            MountKind::Proc => "proc",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub kind: MountKind,
    /// Host path (or symlink target); `None` for tmpfs, dev and proc.
    pub source: Option<PathBuf>,
    pub target: PathBuf,
    pub why: String,
}

impl Mount {
    fn new(kind: MountKind, source: Option<&Path>, target: &Path, why: &str) -> Mount {
        Mount {
            kind,
            source: source.map(Path::to_path_buf),
            target: target.to_path_buf(),
            why: why.to_string(),
        }
    }
    fn same(kind: MountKind, path: &Path, why: &str) -> Mount {
        Mount::new(kind, Some(path), path, why)
    }
}

/// An environment change inside the sandbox (the host environment passes through).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvOp {
    #[allow(dead_code)] // used by the hardening that strips host IPC variables
    Unset(OsString),
    Set(OsString, OsString),
}

/// What runs inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// claude, with the user's arguments passed through unchanged.
    Claude(Vec<OsString>),
    /// `--exec CMD [ARGS...]`.
    Exec(Vec<OsString>),
}

/// Everything the plan is made from; gathered at the edge.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub project: Project,
    pub home: PathBuf,
    pub state: ProjectState,
    pub claude: Option<ClaudeInstall>,
    pub command: Command,
    pub instance_id: String,
    pub host: HostFacts,
    pub bwrap: PathBuf,
    /// Open, allowlist (through the proxy) or none.
    pub network: NetworkMode,
    /// claudebox's own executable on the host; bound inside in allowlist mode.
    pub self_exe: Option<PathBuf>,
    /// Allowlist mode: also report denied hosts on stderr.
    pub log_denied: bool,
}

/// The typed sandbox plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub bwrap: PathBuf,
    /// Namespace and process flags, in order.
    pub flags: Vec<&'static str>,
    pub mounts: Vec<Mount>,
    pub env: Vec<EnvOp>,
    pub cwd: PathBuf,
    /// Program and arguments run inside.
    pub argv: Vec<OsString>,
    /// The network mode in force.
    pub network: NetworkMode,
    /// Allowlist mode: the proxy that the launcher starts on the host before bwrap.
    pub proxy: Option<ProxySpec>,
}

pub const NAMESPACE_FLAGS: &[&str] = &[
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--cap-drop",
    "ALL",
];

/// Builds the plan. Pure: same inputs, same plan.
pub fn build(inp: &Inputs) -> Plan {
    let mut m: Vec<Mount> = Vec::new();
    let home = inp.home.as_path();

    for (path, entry) in &inp.host.system {
        match entry {
            SystemEntry::Dir => m.push(Mount::same(MountKind::Ro, path, "system, read-only")),
            SystemEntry::Symlink(target) => m.push(Mount::new(
                MountKind::Symlink,
                Some(target),
                path,
                "system symlink, as on the host",
            )),
        }
    }
    if let Some(resolv) = &inp.host.resolv_conf_target {
        m.push(Mount::same(
            MountKind::RoTry,
            resolv,
            "target of the /etc/resolv.conf symlink, for DNS",
        ));
    }
    m.push(Mount::new(
        MountKind::Dev,
        None,
        Path::new("/dev"),
        "minimal devices",
    ));
    m.push(Mount::new(
        MountKind::Proc,
        None,
        Path::new("/proc"),
        "processes of the sandbox's own pid namespace",
    ));
    m.push(Mount::new(
        MountKind::Tmpfs,
        None,
        Path::new("/tmp"),
        "fresh /tmp",
    ));
    m.push(Mount::new(
        MountKind::Tmpfs,
        None,
        home,
        "empty writable home: nothing of the real home unless listed below",
    ));

    let p = &inp.project;
    m.push(Mount::same(
        MountKind::Rw,
        &p.work_tree,
        "the project's work tree",
    ));
    for dir in p.outside_git_dirs() {
        m.push(Mount::same(
            MountKind::Rw,
            &dir,
            "the project's git dir, outside its work tree",
        ));
    }

    if let Some(c) = &inp.claude {
        m.push(Mount::same(
            MountKind::Ro,
            &c.bind,
            "the claude installation",
        ));
        if c.on_path != c.real && !c.bind.starts_with(&c.on_path) {
            m.push(Mount::new(
                MountKind::Symlink,
                Some(&c.real),
                &c.on_path,
                "claude as the host's PATH finds it",
            ));
        }
    }
    m.push(Mount::same(
        MountKind::RoTry,
        &home.join(".gitconfig"),
        "git identity, so commits work",
    ));
    m.push(Mount::same(
        MountKind::RoTry,
        &home.join(".config/git"),
        "git configuration, so commits work",
    ));

    let claude_dir = home.join(".claude");
    m.push(Mount::same(
        MountKind::Rw,
        &claude_dir,
        "the real ~/.claude: settings, plugins, skills, hooks, credentials",
    ));
    m.push(Mount::new(
        MountKind::Rw,
        Some(&inp.state.conversations()),
        &claude_dir.join("projects"),
        "this project's conversations, over the real ones",
    ));
    m.push(Mount::new(
        MountKind::File,
        Some(&inp.state.history()),
        &claude_dir.join("history.jsonl"),
        "this project's prompt history, over the real one",
    ));
    m.push(Mount::new(
        MountKind::Tmpfs,
        None,
        &claude_dir.join("sessions"),
        "running-session registry private to this launch (claude is pid 2 in every sandbox)",
    ));
    m.push(Mount::same(
        MountKind::File,
        &home.join(".claude.json"),
        "user config shared with the host: MCP servers, onboarding",
    ));

    let mut flags = NAMESPACE_FLAGS.to_vec();
    let mut proxy = None;
    match &inp.network {
        NetworkMode::Open => {}
        NetworkMode::None => flags.push("--unshare-net"),
        NetworkMode::Allowlist(list) => {
            flags.push("--unshare-net");
            if let Some(exe) = &inp.self_exe {
                m.push(Mount::new(
                    MountKind::Ro,
                    Some(exe),
                    Path::new(network::SANDBOX_SELF),
                    "claudebox itself: opens the proxy port inside, then runs the command",
                ));
            }
            proxy = Some(ProxySpec {
                allowlist: list.clone(),
                denied_log: inp.state.denied_log(),
                log_stderr: inp.log_denied,
                instance_id: inp.instance_id.clone(),
            });
        }
    }

    let mut env = vec![
        set("CLAUDEBOX", OsStr::new("1")),
        set("CLAUDEBOX_PROJECT_ROOT", p.root.as_os_str()),
        set("CLAUDEBOX_PROJECT_ID", OsStr::new(&p.id())),
        set("CLAUDEBOX_INSTANCE_ID", OsStr::new(&inp.instance_id)),
    ];
    if proxy.is_some() {
        for (k, v) in netbridge::proxy_env() {
            env.push(set(k, OsStr::new(v)));
        }
    }

    let argv = match &inp.command {
        Command::Exec(cmd) => cmd.clone(),
        Command::Claude(args) => {
            let program = inp
                .claude
                .as_ref()
                .map(|c| c.on_path.clone().into_os_string())
                .unwrap_or_else(|| "claude".into());
            let mut v = vec![program, "--append-system-prompt".into(), sandbox_note(inp)];
            v.extend(args.iter().cloned());
            v
        }
    };

    let argv = match proxy {
        Some(_) => netbridge::listen_argv(OsStr::new(network::SANDBOX_SELF), &argv),
        None => argv,
    };

    Plan {
        bwrap: inp.bwrap.clone(),
        flags,
        mounts: m,
        env,
        cwd: p.cwd.clone(),
        argv,
        network: inp.network.clone(),
        proxy,
    }
}

fn set(name: &str, value: &OsStr) -> EnvOp {
    EnvOp::Set(name.into(), value.to_os_string())
}

/// The note appended to Claude's system prompt: it runs sandboxed, and what it can write.
pub fn sandbox_note(inp: &Inputs) -> OsString {
    let mut s: Vec<u8> = Vec::new();
    s.extend_from_slice(
        b"You are running inside claudebox, a bubblewrap sandbox. Writable: the project at ",
    );
    s.extend_from_slice(inp.project.work_tree.as_os_str().as_bytes());
    s.extend_from_slice(
        b", ~/.claude, ~/.claude.json, and the temporary /tmp and home directory (both \
          discarded when the sandbox exits). The rest of the system is read-only; the rest \
          of the real home directory (ssh keys, other projects) is not visible. Files you \
          create outside the project and ~/.claude are lost at exit. If a command fails \
          for lack of access, say so instead of working around the sandbox.",
    );
    match &inp.network {
        NetworkMode::Open => {}
        NetworkMode::None => s.extend_from_slice(b" There is no network: only loopback."),
        NetworkMode::Allowlist(list) => {
            s.extend_from_slice(
                b" Network: only these hosts are reachable, through an HTTP proxy (the proxy \
                  variables are set; there is no DNS inside); others get 403 from the proxy: ",
            );
            let hosts: Vec<String> = list.entries.iter().map(|e| e.pattern.to_string()).collect();
            s.extend_from_slice(hosts.join(", ").as_bytes());
            s.push(b'.');
        }
    }
    OsString::from_vec(s)
}
