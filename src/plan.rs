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
//!    outside it, then over them (parents first) the code-bearing paths made read-only
//!    (`.git/hooks`, `.git/config`, ..., see `protect`) unless the user opted out;
//! 5. the `claude` installation and claudebox itself (it runs first inside, to apply the
//!    seccomp filter and the Landlock scope), read-only; git's configuration, read-only;
//!    with `--ssh-agent`, the agent's socket;
//! 6. the real `~/.claude`, read-write, then over it, in this order, the project's
//!    conversations (`~/.claude/projects`), the project's history
//!    (`~/.claude/history.jsonl`) and a private `~/.claude/sessions`;
//! 7. the shared `~/.claude.json`.
//!
//! The `~/.claude` group comes after the project so that it still wins when the project
//! is the home directory itself (only allowed with `--yes`).

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::host::{ClaudeInstall, HostFacts, SystemEntry};
use crate::project::Project;
use crate::protect::{Guard, Protected};
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
    /// An empty read-only directory (a tmpfs remounted read-only).
    EmptyRo,
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
            MountKind::EmptyRo => "empty-ro",
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
    /// Lay read-only mounts over `protected` (off with `--writable-project-config`).
    pub protect_project_metadata: bool,
    /// The project's code-bearing paths (see `protect`).
    pub protected: Vec<Protected>,
    /// Code-bearing work-tree entries that do not exist, so are not protected.
    pub unprotected_missing: Vec<PathBuf>,
    /// Host IPC variables present in the environment, to unset inside.
    pub ipc_vars: Vec<OsString>,
    /// `--ssh-agent`: the host agent's socket, bound at [`SSH_AGENT_SOCK`].
    pub ssh_agent: Option<PathBuf>,
    /// claudebox's own executable, run inside as the first step.
    pub own_exe: PathBuf,
    /// The kernel's Landlock ABI version (6 and later can scope abstract unix sockets).
    pub landlock_abi: u32,
}

/// Where `--ssh-agent` puts the host agent's socket inside.
pub const SSH_AGENT_SOCK: &str = "/run/claudebox/ssh-agent.sock";

/// What claudebox applies inside before the command (see `confine`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confine {
    /// claudebox's own executable, bound read-only at this path.
    pub exe: PathBuf,
    /// Block `connect()` to the host's abstract unix sockets (Landlock ABI 6+).
    pub scope_abstract_unix: bool,
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
    /// The first step inside: seccomp filter and Landlock scope, then exec of `argv`.
    pub confine: Option<Confine>,
    /// Program and arguments run inside.
    pub argv: Vec<OsString>,
    /// Opt-ins and known gaps of this launch, each with its reason, for `--dry-run`.
    pub notes: Vec<String>,
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

    let mut notes = Vec::new();
    protect(inp, &mut m, &mut notes);

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
    if !inp
        .host
        .system
        .iter()
        .any(|(p, _)| inp.own_exe.starts_with(p))
    {
        m.push(Mount::same(
            MountKind::Ro,
            &inp.own_exe,
            "claudebox itself: inside, it applies the seccomp filter and the Landlock scope, \
             then execs the command",
        ));
    }
    if let Some(sock) = &inp.ssh_agent {
        m.push(Mount::new(
            MountKind::File,
            Some(sock),
            Path::new(SSH_AGENT_SOCK),
            "--ssh-agent: the host's ssh agent (the agent can sign with your keys, not read them)",
        ));
        notes.push(format!(
            "opt-in --ssh-agent: {} is bound at {SSH_AGENT_SOCK}; while it runs the agent can \
             use every key the ssh agent holds (push, log in to hosts)",
            sock.display()
        ));
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

    let mut env: Vec<EnvOp> = inp
        .ipc_vars
        .iter()
        .filter(|v| !(inp.ssh_agent.is_some() && v.as_os_str() == "SSH_AUTH_SOCK"))
        .map(|v| EnvOp::Unset(v.clone()))
        .collect();
    if inp.ssh_agent.is_some() {
        env.push(set("SSH_AUTH_SOCK", OsStr::new(SSH_AGENT_SOCK)));
    }
    env.extend([
        set("CLAUDEBOX", OsStr::new("1")),
        set("CLAUDEBOX_PROJECT_ROOT", p.root.as_os_str()),
        set("CLAUDEBOX_PROJECT_ID", OsStr::new(&p.id())),
        set("CLAUDEBOX_INSTANCE_ID", OsStr::new(&inp.instance_id)),
    ]);

    let scope_abstract_unix = inp.landlock_abi >= 6;
    if !scope_abstract_unix {
        notes.push(
            "gap: this kernel has no Landlock scopes (Linux 6.12+), so abstract unix sockets \
             of the host (X11 @/tmp/.X11-unix, some D-Bus buses) stay reachable"
                .to_string(),
        );
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

    Plan {
        bwrap: inp.bwrap.clone(),
        flags: NAMESPACE_FLAGS.to_vec(),
        mounts: m,
        env,
        cwd: p.cwd.clone(),
        confine: Some(Confine {
            exe: inp.own_exe.clone(),
            scope_abstract_unix,
        }),
        argv,
        notes,
    }
}

/// Step 4's second half: read-only mounts over the project's code-bearing paths.
fn protect(inp: &Inputs, m: &mut Vec<Mount>, notes: &mut Vec<String>) {
    if !inp.protect_project_metadata {
        notes.push(
            "opt-in --writable-project-config: .git/hooks, .git/config, .envrc, .vscode, \
             .idea are writable; tools on the host run code from them"
                .to_string(),
        );
        return;
    }
    for p in &inp.protected {
        let why = format!("protected: {}", p.why);
        m.push(match p.guard {
            Guard::ReadOnly => Mount::same(MountKind::Ro, &p.path, &why),
            Guard::Pin => Mount::same(MountKind::Rw, &p.path, &why),
            Guard::EmptyDir => Mount::new(MountKind::EmptyRo, None, &p.path, &why),
            Guard::EmptyFile => {
                Mount::new(MountKind::Ro, Some(Path::new("/dev/null")), &p.path, &why)
            }
        });
    }
    for p in &inp.unprotected_missing {
        notes.push(format!(
            "gap: {} does not exist, so it is not protected and can be created \
             (a mount would leave an empty one in your project)",
            p.display()
        ));
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
    OsString::from_vec(s)
}

#[cfg(test)]
mod hardening_tests {
    use super::*;
    use crate::render;

    fn inputs() -> Inputs {
        Inputs {
            project: Project {
                root: "/p/.git".into(),
                work_tree: "/p".into(),
                git_dir: Some("/p/.git".into()),
                common_dir: Some("/p/.git".into()),
                cwd: "/p".into(),
            },
            home: "/h".into(),
            state: ProjectState {
                dir: "/h/.claudebox/projects/x".into(),
            },
            claude: None,
            command: Command::Exec(vec!["sh".into()]),
            instance_id: "i".into(),
            host: HostFacts::default(),
            bwrap: "/usr/bin/bwrap".into(),
            protect_project_metadata: true,
            protected: vec![
                Protected {
                    path: "/p/.git".into(),
                    guard: Guard::Pin,
                    why: "pin",
                },
                Protected {
                    path: "/p/.git/hooks".into(),
                    guard: Guard::EmptyDir,
                    why: "hooks",
                },
                Protected {
                    path: "/p/.git/config".into(),
                    guard: Guard::ReadOnly,
                    why: "config",
                },
            ],
            unprotected_missing: vec!["/p/.envrc".into()],
            ipc_vars: vec!["SSH_AUTH_SOCK".into(), "DISPLAY".into()],
            ssh_agent: None,
            own_exe: "/opt/cb/claudebox".into(),
            landlock_abi: 7,
        }
    }

    fn pos(a: &[OsString], window: &[&str]) -> usize {
        a.windows(window.len())
            .position(|w| w.iter().zip(window).all(|(x, y)| x == y))
            .unwrap_or_else(|| panic!("{window:?} not in {a:?}"))
    }

    #[test]
    fn protections_come_after_the_project_and_parents_first() {
        let a = render::argv(&build(&inputs()));
        let project = pos(&a, &["--bind", "/p", "/p"]);
        let pin = pos(&a, &["--bind", "/p/.git", "/p/.git"]);
        let hooks = pos(
            &a,
            &["--tmpfs", "/p/.git/hooks", "--remount-ro", "/p/.git/hooks"],
        );
        let config = pos(&a, &["--ro-bind", "/p/.git/config", "/p/.git/config"]);
        assert!(project < pin && pin < hooks && pin < config);
    }

    #[test]
    fn init_step_wraps_the_command_and_ipc_vars_are_unset() {
        let a = render::argv(&build(&inputs()));
        let init = pos(
            &a,
            &[
                "--",
                "/opt/cb/claudebox",
                "--sandbox-init",
                "--scope-abstract-unix",
                "--",
                "sh",
            ],
        );
        assert_eq!(init + 6, a.len());
        pos(&a, &["--ro-bind", "/opt/cb/claudebox", "/opt/cb/claudebox"]);
        pos(&a, &["--unsetenv", "SSH_AUTH_SOCK"]);
        pos(&a, &["--unsetenv", "DISPLAY"]);
    }

    #[test]
    fn without_landlock_scopes_the_gap_is_told() {
        let mut i = inputs();
        i.landlock_abi = 5;
        let p = build(&i);
        assert!(!p.confine.as_ref().unwrap().scope_abstract_unix);
        assert!(p.notes.iter().any(|n| n.contains("abstract unix sockets")));
    }

    #[test]
    fn opt_outs_show_in_the_notes() {
        let mut i = inputs();
        i.protect_project_metadata = false;
        i.ssh_agent = Some("/tmp/ssh-x/agent.1".into());
        let p = build(&i);
        let a = render::argv(&p);
        assert!(!a.iter().any(|x| x == "/p/.git/config"));
        pos(&a, &["--bind", "/tmp/ssh-x/agent.1", SSH_AGENT_SOCK]);
        pos(&a, &["--setenv", "SSH_AUTH_SOCK", SSH_AGENT_SOCK]);
        assert!(!a
            .windows(2)
            .any(|w| w[0] == "--unsetenv" && w[1] == "SSH_AUTH_SOCK"));
        let dry = String::from_utf8(render::dry_run(&p)).unwrap();
        assert!(dry.contains("opt-in --writable-project-config"));
        assert!(dry.contains("opt-in --ssh-agent"));
    }
}
