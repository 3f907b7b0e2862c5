//! The sandbox plan: one pure function from what was found on the host to a typed list of
//! mounts, environment changes and the command to run. Nothing here touches the disk.
//!
//! Mount order (bwrap applies mounts in argv order, and a later mount over the same or a
//! parent path wins, so a child placed before its parent would be shadowed); `build` calls
//! one function per step, named here:
//!
//! 1. `system`: the system, read-only (`/usr`, `/etc`, `/bin`, `/lib*`, `/opt`,
//!    `/nix/store`, ...), with merged-usr symlinks recreated as symlinks;
//! 2. `dev_proc_tmp`: `/dev`, a new `/proc`, a fresh `/tmp`; with `--gpu`, the GPUs'
//!    device nodes over that `/dev` and the parts of `/sys` their drivers read (see `gpu`);
//! 3. `home`: an empty writable tmpfs over `$HOME` (its canonical path; `$HOME`'s own
//!    name, when it goes through a symlink, as a symlink to it: see `host::home`);
//! 4. `project`: the project's work tree read-write at its real path, then its git dirs
//!    that lie outside it, then over them (parents first) the code-bearing paths made
//!    read-only (`.git/hooks`, `.git/config`, ..., see `protect`) unless the user opted out;
//! 5. `installation`: the agent's installation (`claude`, or `codex` with `--agent
//!    codex`) and claudebox itself (it runs first inside, to apply the seccomp filter and
//!    the Landlock scope), read-only; git's configuration, read-only; with `--ssh-agent`,
//!    the agent's socket;
//! 6. `agent_home`: `~/.claude` (see `claude_home`; `~/.codex` with `--agent codex`, see
//!    `codex_home`): the project's own directory in claudebox's state, read-write, then
//!    over it the project's conversations and history, the user's setup from the real
//!    `~/.claude` read-only (read-write with `--writable-claude-setup`), empty read-only
//!    stand-ins for setup the user has none of, the login's credentials file, a tmpfs per
//!    launch-private entry, and the claude installation again when it lies under
//!    `~/.claude`; with the login broker, a tmpfs in place of the login's directory;
//! 7. (in `agent_home`) `~/.claude.json`, a symlink to the project's copy in `~/.claude`
//!    (with the home as the project, `--yes`: that copy bound over the real file when
//!    there is one, else nothing, since a mount point would be left in the real home);
//! 8. the user's extra mounts (`ro`, `rw`, `hide` from the config file and the command
//!    line, split by `place_extras`), parents before children; then `read_only_root`.
//!
//! After the mounts: `network` (the namespace flags and, in allowlist mode, with forwarded
//! host ports or with the login broker, the proxy), `environment`, `command` (what runs
//! inside) and `confinement`: claudebox's one step inside (see `inside::confine`), which in
//! allowlist mode also opens the proxy's port and hands it to the proxy (see
//! `inside::listen`), and with forwarded host ports (allowlist or none mode) their
//! listeners (see `policy::forward`).
//!
//! The `~/.claude` group comes after the project so that it still wins when the project
//! is the home directory itself (only allowed with `--yes`).
//!
//! The user's extra mounts come last so that they win over the defaults: `ro` or `hide`
//! of a directory inside the project makes it read-only or empty. One exception: an extra
//! mount that is a parent of the project (`ro = ["~/src"]` while working in `~/src/foo`)
//! goes just before step 4 instead, so that the project stays writable inside it. Among
//! the extras, a shorter path goes first, so the more specific of two nested entries wins
//! whatever order they were listed in. (Mounts over the home directory itself and over
//! what claudebox manages in `~/.claude` are refused before planning: see `settings`.)

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::policy::facts::Project;
use crate::policy::facts::{ClaudeInstall, HostFacts, SystemEntry};
use crate::policy::gpu::{self, GpuHost};
use crate::policy::mount::{Mount, MountKind};
use crate::policy::network::{NetworkMode, ProxySpec};
use crate::policy::protected::{Guard, Protected};
use crate::policy::settings::{ExtraKind, ExtraMount, Settings, UserEnv};

use crate::policy::agent::AgentId;
use crate::policy::claude_home::{self, HostClaude, Overlay};
use crate::policy::codex_home::{self, HostCodex};
use crate::policy::layout::ProjectState;
use crate::policy::session;

/// An environment change inside the sandbox (the host environment passes through).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvOp {
    Unset(OsString),
    Set(OsString, OsString),
}

/// Variables claudebox sets inside unless the user set them (in the host environment or
/// with `--env`), each with its reason, shown by `--dry-run`.
pub const DEFAULT_ENV: &[(&str, &str, &str)] = &[(
    "DISABLE_AUTOUPDATER",
    "1",
    "claude's installation is read-only inside, so its auto-updater can only fail",
)];

/// The reason claudebox sets `name` by default, if it is one of [`DEFAULT_ENV`].
pub fn default_env_reason(name: &OsStr) -> Option<&'static str> {
    DEFAULT_ENV
        .iter()
        .find(|(n, _, _)| OsStr::new(n) == name)
        .map(|(_, _, why)| *why)
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
    /// The home, canonical (see `host::home`).
    pub home: PathBuf,
    /// `$HOME` as the host names it, through a symlink: recreated inside as a symlink to
    /// `home` (see `host::home`).
    pub home_alias: Option<PathBuf>,
    /// Local-directory plugin marketplaces the host's claude reads plugins from (see
    /// `claude_home::local_marketplaces`), checked at the edge; bound read-only.
    pub marketplaces: Vec<PathBuf>,
    /// The host's `~/.claude.json` exists: with the home as the project (`--yes`), the
    /// project's copy is bound over it (see `claude_home`).
    pub home_claude_json: bool,
    pub state: ProjectState,
    pub claude: Option<ClaudeInstall>,
    /// Which agent runs (`--agent`, the config file's `agent`): Claude Code unless asked.
    pub agent: AgentId,
    /// With `--agent codex`: Codex's installation, found on the host's PATH.
    pub codex: Option<ClaudeInstall>,
    /// With `--agent codex`: the real Codex directory and its entries (see `codex_home`).
    pub codex_home: HostCodex,
    pub command: Command,
    pub instance_id: String,
    pub host: HostFacts,
    pub bwrap: PathBuf,
    /// `--session NAME`: which conversation, decided at the edge.
    pub session: Option<session::Launch>,
    /// The user's extra mounts, environment, network mode and claude arguments.
    pub settings: Settings,
    /// The real Claude Code config dir and its entries (see `claude_home`).
    pub claude_home: HostClaude,
    /// `--writable-claude-setup`: the Setup entries of `~/.claude` bound read-write.
    pub writable_claude_setup: bool,
    /// Lay read-only mounts over `protected` (off with `--writable-project-config`).
    pub protect_project_metadata: bool,
    /// The project's code-bearing paths (see `protect`).
    pub protected: Vec<Protected>,
    /// Code-bearing work-tree entries that do not exist, so are not protected.
    pub unprotected_missing: Vec<PathBuf>,
    /// Other programs' unix sockets found in the project (`--yes`): `/dev/null` over each.
    pub host_sockets: Vec<PathBuf>,
    /// Host IPC variables present in the environment, to unset inside.
    pub ipc_vars: Vec<OsString>,
    /// Variables of [`DEFAULT_ENV`] the host environment already sets: the user's stand.
    pub preset_vars: Vec<OsString>,
    /// `--ssh-agent`: the host agent's socket, bound at [`SSH_AGENT_SOCK`].
    pub ssh_agent: Option<PathBuf>,
    /// claudebox's own executable, run inside as the first step.
    pub own_exe: PathBuf,
    /// The kernel's Landlock ABI version (6 and later can scope abstract unix sockets).
    pub landlock_abi: u32,
    /// Allowlist mode: also report denied hosts on stderr.
    pub log_denied: bool,
    /// `--login-broker`: the login stays on the host (see `proxy::broker`); used when
    /// `claude_home.credentials` names the host's login or `api_key` is set (every network mode).
    pub login_broker: bool,
    /// A non-empty `ANTHROPIC_API_KEY` in the launcher's environment (the broker lends it).
    pub api_key: bool,
    /// The user's own `settings.json` when it has an `apiKeyHelper` and the sandbox cannot
    /// write it (the broker runs that helper on the host).
    pub api_key_helper: Option<PathBuf>,
    /// The user's own `settings.json` when its `env` block sets an API key (the broker
    /// lends that key; the sandbox gets the settings without it).
    pub settings_api_key: Option<PathBuf>,
    /// With the GPU opt-in (`settings.gpu`): what of `gpu::TABLE` this host has.
    pub gpu: GpuHost,
    /// The limits decided from `settings.limits` and the host's support (see `limits`).
    pub limits: crate::policy::limits::Decided,
}

impl Inputs {
    /// The one place every field is named: the project, its home and state, bwrap and
    /// claudebox's own executable, with the rest neutral and safe (no claude found, claude
    /// with no arguments, no extra settings, an empty `~/.claude` at `home`, the project's
    /// metadata protected with nothing probed yet, no Landlock). The launch, `--check` and
    /// the tests override what they probed with `Inputs { field, ..Inputs::new(..) }`.
    pub fn new(
        project: Project,
        home: PathBuf,
        state: ProjectState,
        bwrap: PathBuf,
        own_exe: PathBuf,
        instance_id: String,
    ) -> Inputs {
        let codex_home = HostCodex {
            dir: home.join(".codex"),
            entries: Vec::new(),
        };
        Inputs {
            claude_home: HostClaude {
                dir: home.join(".claude"),
                json: home.join(".claude.json"),
                entries: Vec::new(),
                credentials: None,
                within: Vec::new(),
            },
            project,
            home,
            home_alias: None,
            marketplaces: Vec::new(),
            home_claude_json: false,
            state,
            claude: None,
            agent: AgentId::Claude,
            codex: None,
            codex_home,
            command: Command::Claude(Vec::new()),
            instance_id,
            host: HostFacts::default(),
            bwrap,
            session: None,
            settings: Settings::default(),
            writable_claude_setup: false,
            protect_project_metadata: true,
            protected: Vec::new(),
            unprotected_missing: Vec::new(),
            host_sockets: Vec::new(),
            ipc_vars: Vec::new(),
            preset_vars: Vec::new(),
            ssh_agent: None,
            own_exe,
            landlock_abi: 0,
            log_denied: false,
            login_broker: false,
            api_key: false,
            api_key_helper: None,
            settings_api_key: None,
            gpu: GpuHost::default(),
            limits: Default::default(),
        }
    }
}

/// The files of `~/.config/git` that git reads to commit; the rest of it (`credentials`,
/// tokens) is not bound.
pub const GIT_XDG_FILES: &[&str] = &["config", "ignore", "attributes"];

/// Where `--ssh-agent` puts the host agent's socket inside.
pub const SSH_AGENT_SOCK: &str = "/run/claudebox/ssh-agent.sock";

/// What claudebox applies inside before the command (see `confine`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confine {
    /// claudebox's own executable, bound read-only at this path.
    pub exe: PathBuf,
    /// Block `connect()` to the host's abstract unix sockets (Landlock ABI 6+).
    pub scope_abstract_unix: bool,
    /// Give SIGINT/SIGQUIT their default action back before the command: the launcher
    /// ignores them so that a terminal's Ctrl-C reaches the agent alone (src/inside/confine.rs).
    /// The launch clears it when claudebox was started with SIGINT already ignored (a
    /// background job), so the agent inherits that choice.
    pub default_signals: bool,
    /// Mounts whose destination lies where a sandbox can write (the project, its git
    /// dirs, `~/.claude`): checked from inside before the command starts, since bwrap
    /// follows symlinks in a destination and another sandbox can swap one in.
    pub mount_checks: Vec<MountCheck>,
    /// Allowlist mode: the listening sockets this step opens in the sandbox's network
    /// namespace and hands to the proxy on the host, before the command starts.
    pub listen: Option<Listen>,
    /// The git dirs the file supervisor guards (the project's main git dir, unless the
    /// project's metadata is left writable): no `commondir` can be made there
    /// (`policy::confinement::NOTIFIED`).
    pub guard_git_dirs: Vec<PathBuf>,
    /// The work tree's top and those of the nested repositories and submodules whose `.git`
    /// the launch protects, where the supervisor refuses `confinement::GUARDED_TOP_NAMES`
    /// (with the git dirs above; none without them).
    pub guard_work_tree: Vec<PathBuf>,
}

/// The sockets the step inside opens for the proxy: the proxy port (allowlist mode), then
/// one per loopback forward (the allowlist's, the forwarded host ports). The descriptor to
/// the proxy is a runtime input of the renderer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    pub port: Option<u16>,
    pub forwards: Vec<crate::policy::network::LoopbackForward>,
    /// The login broker: where the step writes the stand-in login it is handed.
    pub broker_dir: Option<PathBuf>,
}

/// One mount the first step inside verifies: `path` is a mount point, reached without a
/// symlink, read-only or not as planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountCheck {
    pub path: PathBuf,
    pub read_only: bool,
}

/// One row of `--dry-run`'s settings table: a name, its value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingRow {
    pub name: &'static str,
    pub value: Vec<u8>,
    pub from: String,
}

/// The settings table's rows: the config file, the network mode and the default claude
/// arguments, each with where it came from.
fn settings_rows(s: &Settings) -> Vec<SettingRow> {
    let state = if s.config_read { "read" } else { "not present" };
    let mut rows = vec![
        SettingRow {
            name: "config-file",
            value: s.config_file.as_os_str().as_bytes().to_vec(),
            from: state.to_string(),
        },
        SettingRow {
            name: "network",
            value: match &s.network {
                NetworkMode::Open => b"open".to_vec(),
                NetworkMode::Allowlist(_) => b"allowlist".to_vec(),
                NetworkMode::None => b"none".to_vec(),
            },
            from: s.network_origin.to_string(),
        },
    ];
    rows.push(SettingRow {
        name: "agent",
        value: s
            .agent
            .as_ref()
            .map_or("claude", |(a, _)| a.name())
            .as_bytes()
            .to_vec(),
        from: s
            .agent
            .as_ref()
            .map_or("default".to_string(), |(_, o)| o.to_string()),
    });
    for a in &s.claude_args {
        rows.push(SettingRow {
            name: "claude-args",
            value: crate::policy::escape::shell_line(&a.args),
            from: a.origin.to_string(),
        });
    }
    rows
}

/// The typed sandbox plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Which agent runs (for `--dry-run`'s summary).
    pub agent: AgentId,
    /// The project's work tree (for `--dry-run`'s summary).
    pub project: PathBuf,
    /// The project's state directory (for `--dry-run`'s summary).
    pub state_dir: PathBuf,
    pub bwrap: PathBuf,
    /// Namespace and process flags, in order.
    pub flags: Vec<&'static str>,
    pub mounts: Vec<Mount>,
    pub env: Vec<EnvOp>,
    pub cwd: PathBuf,
    /// The one step inside: mount checks, Landlock, seccomp, signals, the proxy's
    /// listeners, then exec of `argv`.
    pub confine: Option<Confine>,
    /// Program and arguments run inside.
    pub argv: Vec<OsString>,
    /// The user's variables (`--env`, the config file), set after `env`, so that an
    /// explicit `--env NAME` wins over claudebox's own changes.
    pub user_env: Vec<UserEnv>,
    /// The network mode in force (shown by `--dry-run`; the proxy is `proxy`).
    pub network: NetworkMode,
    /// The user's settings that are not mounts, one row each, for `--dry-run`.
    pub settings_rows: Vec<SettingRow>,
    /// Opt-ins and known gaps of this launch, each with its reason, for `--dry-run`.
    pub notes: Vec<String>,
    /// Allowlist mode: the proxy that the launcher starts on the host before bwrap.
    pub proxy: Option<ProxySpec>,
    /// The sandbox's limits and how they are applied (see `limits`).
    pub limits: crate::policy::limits::Decided,
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

/// Builds the plan. Pure: same inputs, same plan. Each line is one step of the mount
/// order above; the steps after the mounts decide the network, the environment, the
/// command and the one step inside.
pub fn build(inp: &Inputs) -> Plan {
    let mut m: Vec<Mount> = Vec::new();
    let mut notes = Vec::new();
    system(inp, &mut m);
    dev_proc_tmp(inp, &mut m, &mut notes);
    home(inp, &mut m);
    let (extra_before, extra_after) =
        place_extras(&inp.settings.mounts, &inp.project, &inp.state.empty_file());
    let project_mount = project(inp, extra_before, &mut m, &mut notes);
    installation(inp, &mut m, &mut notes);
    let broker = broker_login(inp);
    agent_home(inp, broker.as_ref(), &mut m, &mut notes);
    caches(inp, &mut m);
    m.extend(extra_after);
    read_only_root(&mut m);
    let (flags, proxy) = network(inp, broker.as_ref(), &mut notes);
    let env = environment(inp, proxy.as_ref(), broker.is_some());
    let argv = command(inp);
    let confine = confinement(inp, &m, project_mount, proxy.as_ref(), &mut notes);
    Plan {
        agent: inp.agent,
        project: inp.project.work_tree.clone(),
        state_dir: inp.state.dir.clone(),
        bwrap: inp.bwrap.clone(),
        flags,
        mounts: m,
        env,
        cwd: inp.project.cwd.clone(),
        confine: Some(confine),
        argv,
        user_env: inp.settings.env.clone(),
        network: inp.settings.network.clone(),
        settings_rows: settings_rows(&inp.settings),
        notes,
        proxy,
        limits: inp.limits.clone(),
    }
}

/// Step 1: the system, read-only, its merged-usr symlinks as symlinks, and the target of
/// `/etc/resolv.conf` when that is a symlink.
fn system(inp: &Inputs, m: &mut Vec<Mount>) {
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
}

/// Step 2: `/dev`, a new `/proc`, a fresh `/tmp`; with `--gpu`, the GPUs (see `gpu`).
fn dev_proc_tmp(inp: &Inputs, m: &mut Vec<Mount>, notes: &mut Vec<String>) {
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
    if let Some(origin) = &inp.settings.gpu {
        let (mounts, gpu_notes) = gpu::plan(&inp.gpu, origin);
        m.extend(mounts);
        notes.extend(gpu_notes);
    }
}

/// Step 3: the empty writable home, and `$HOME`'s own name as a symlink to it.
fn home(inp: &Inputs, m: &mut Vec<Mount>) {
    let home = inp.home.as_path();
    m.push(Mount::new(
        MountKind::Tmpfs,
        None,
        home,
        "empty writable home: nothing of the real home unless listed below",
    ));
    if let Some(alias) = &inp.home_alias {
        m.push(Mount::new(
            MountKind::Symlink,
            Some(home),
            alias,
            "$HOME as the host names it, through a symlink to the real home",
        ));
    }
}

/// Step 4: the scratch parents and the extra mounts that are parents of the project, the
/// work tree and its outside git dirs read-write, the protected paths over them, and the
/// host's sockets found in the project hidden. Returns where the project's mounts begin
/// (the first one the step inside checks).
fn project(
    inp: &Inputs,
    extra_before: Vec<Mount>,
    m: &mut Vec<Mount>,
    notes: &mut Vec<String>,
) -> usize {
    let p = &inp.project;
    scratch_parents(m, p, &inp.home, &extra_before);
    m.extend(extra_before);
    let project_mount = m.len();
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

    protect(inp, m, notes);
    for s in &inp.host_sockets {
        let why = crate::policy::protected::SOCKET_WHY;
        m.push(Mount::new(
            MountKind::Ro,
            Some(Path::new("/dev/null")),
            s,
            why,
        ));
    }
    project_mount
}

/// Step 5: the agent's installation, claudebox itself, `--ssh-agent`'s socket and git's
/// configuration.
fn installation(inp: &Inputs, m: &mut Vec<Mount>, notes: &mut Vec<String>) {
    let home = inp.home.as_path();
    if let Some(c) = &inp.claude {
        m.push(Mount::same(
            MountKind::Ro,
            &c.bind,
            "the claude installation",
        ));
        if needs_path_link(inp, c) {
            m.push(Mount::new(
                MountKind::Symlink,
                Some(&c.real),
                &c.on_path,
                "claude as the host's PATH finds it",
            ));
        }
        interpreter(inp, c, "claude", m);
    }
    if let Some(c) = inp.codex.as_ref().filter(|_| inp.agent == AgentId::Codex) {
        m.push(Mount::same(
            MountKind::Ro,
            &c.bind,
            "the codex installation (its npm scope: the launcher and its platform package)",
        ));
        if needs_path_link(inp, c) {
            m.push(Mount::new(
                MountKind::Symlink,
                Some(&c.real),
                &c.on_path,
                "codex as the host's PATH finds it",
            ));
        }
        interpreter(inp, c, "codex", m);
    }
    if !in_system(inp, &inp.own_exe) {
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
    // git's XDG files one by one, not the directory: `~/.config/git/credentials` (the
    // credential store's XDG file) and whatever else lives there stay out.
    for name in GIT_XDG_FILES {
        m.push(Mount::same(
            MountKind::RoTry,
            &home.join(".config/git").join(name),
            "git configuration, so commits work",
        ));
    }
}

/// Whether `path` lies in the system as step 1 shows it (under one of its read-only
/// directories or its symlinks): there the host's own entry is seen inside as it is.
fn in_system(inp: &Inputs, path: &Path) -> bool {
    inp.host.system.iter().any(|(p, _)| path.starts_with(p))
}

/// Whether the host's own entry at `path` is seen inside before step 5: in the system,
/// or in the project's work tree (bound read-write in step 4: a project-local install's
/// `node_modules/.bin/claude`).
fn seen_inside(inp: &Inputs, path: &Path) -> bool {
    in_system(inp, path) || path.starts_with(&inp.project.work_tree)
}

/// Whether the agent's name on the host's PATH must be made inside as a symlink to its
/// real file: not when it is that file, not when the installation's bind holds it, and not
/// when it lies in the system (`sudo npm install -g` puts `/usr/local/bin/claude` there,
/// a symlink into `/usr/local/lib/node_modules`), nor in the project (a project-local
/// install's `node_modules/.bin`): the host's own link is seen inside already, and bwrap
/// cannot make a symlink where one exists ("File exists").
fn needs_path_link(inp: &Inputs, c: &ClaudeInstall) -> bool {
    c.on_path != c.real && !c.bind.starts_with(&c.on_path) && !seen_inside(inp, &c.on_path)
}

/// The interpreter of an agent that is a script (Codex's launcher is `#!/usr/bin/env
/// node`), read-only, when the system does not show it: nvm's node is a file in
/// `~/.nvm/versions/node/*/bin`, Homebrew's a link in `/home/linuxbrew/.linuxbrew/bin`
/// into its Cellar. Its name on PATH is made as a symlink when it is one on the host.
/// Once: claude's and codex's may be the same node.
fn interpreter(inp: &Inputs, c: &ClaudeInstall, agent: &str, m: &mut Vec<Mount>) {
    let Some(i) = &c.interpreter else { return };
    let shown = |m: &[Mount], p: &Path| {
        seen_inside(inp, p) || p.starts_with(&c.bind) || m.iter().any(|x| x.target == p)
    };
    if !shown(m, &i.real) {
        m.push(Mount::same(
            MountKind::Ro,
            &i.real,
            match agent {
                "codex" => {
                    "the interpreter of codex's launcher (its #! line), as the host finds it"
                }
                _ => "the interpreter of claude's launcher (its #! line), as the host finds it",
            },
        ));
    }
    if i.on_path != i.real && !shown(m, &i.on_path) {
        m.push(Mount::new(
            MountKind::Symlink,
            Some(&i.real),
            &i.on_path,
            "the interpreter as the host's PATH finds it",
        ));
    }
}

/// Steps 6 and 7: the agent's home (`~/.claude` and `~/.claude.json`, or `~/.codex`), the
/// agent's notes, and with the login broker a tmpfs in place of the host's login.
fn agent_home(
    inp: &Inputs,
    broker: Option<&crate::policy::network::BrokerSpec>,
    m: &mut Vec<Mount>,
    notes: &mut Vec<String>,
) {
    match inp.agent {
        AgentId::Claude => {
            claude_home(inp, m, notes);
            marketplaces(inp, m);
        }
        AgentId::Codex => codex_home(inp, m, notes),
    }
    notes.extend(inp.agent.row().notes.iter().map(|n| n.to_string()));
    if broker.is_some() {
        // Nothing of the host's login inside: the login dir is this sandbox's own tmpfs,
        // where the step inside writes the stand-in the broker hands it.
        let login = inp.state.login_dir();
        m.retain(|x| {
            x.target != login
                && !x.target.starts_with(&login)
                && broker
                    .and_then(|b| b.credentials.as_ref())
                    .is_none_or(|c| x.source.as_ref() != Some(c))
        });
        m.push(Mount::new(
            MountKind::Tmpfs,
            None,
            &login,
            "the login broker: a stand-in login of this sandbox only; the host's stays \
             outside (claude's CLAUDE_SECURESTORAGE_CONFIG_DIR)",
        ));
    }
    if broker.is_some_and(|b| b.api_key_helper.is_some() || b.settings_api_key.is_some()) {
        // The user's settings as they were at the launch, with the apiKeyHelper that
        // prints the stand-in (the broker runs the real one on the host) and without the
        // API key of its `env` block (the broker lends it).
        let target = inp.home.join(".claude/settings.json");
        for x in m.iter_mut().filter(|x| x.target == target) {
            *x = Mount::new(
                MountKind::Ro,
                Some(&inp.state.broker_settings()),
                &target,
                "your settings.json as at the launch, its apiKeyHelper replaced by one \
                 printing this sandbox's stand-in key and its env block's ANTHROPIC_API_KEY \
                 removed: the login broker runs the helper and lends the key on the host",
            );
        }
    }
}

/// The project's package caches (see `caches::TABLE`), each read-write at its path in the
/// home, before the extras (a `--rw ~/.npm` of the user's wins). A cache whose path lies
/// in the project (the home as the project) is left to the project's own files, and one
/// that lies in an agent's installation or holds it ([`overlaps_an_install`]) to the
/// installation.
fn caches(inp: &Inputs, m: &mut Vec<Mount>) {
    for c in crate::policy::caches::TABLE {
        let target = crate::policy::caches::target(&inp.home, c);
        if target.starts_with(&inp.project.work_tree) || overlaps_an_install(inp, &target) {
            continue;
        }
        m.push(Mount::new(
            MountKind::Rw,
            Some(&inp.state.cache(c.name)),
            &target,
            &format!("this project's package cache (claudebox state): {}", c.why),
        ));
    }
}

/// The variables that name the caches (see `caches::TABLE`), pointing at their mounts
/// unless the user sets them (`--env`, the config file).
fn cache_env(inp: &Inputs, env: &mut Vec<EnvOp>) {
    for c in crate::policy::caches::TABLE {
        let Some(var) = c.var else { continue };
        let target = crate::policy::caches::target(&inp.home, c);
        if target.starts_with(&inp.project.work_tree)
            || overlaps_an_install(inp, &target)
            || inp.settings.env.iter().any(|e| e.name == var)
        {
            continue;
        }
        env.push(set(var, target.as_os_str()));
    }
}

/// Whether a cache's path lies in what an agent's installation binds, or holds it: pnpm's
/// global install binds the whole pnpm home, whose `store` its packages' files come from
/// (a cache mounted over it hid `claude.exe`: "not found", the layouts test), so the
/// installation is shown as it is and that cache is not the project's.
fn overlaps_an_install(inp: &Inputs, target: &Path) -> bool {
    [&inp.claude, &inp.codex]
        .into_iter()
        .flatten()
        .any(|c| target.starts_with(&c.bind) || c.bind.starts_with(target))
}

/// The last mount, after the extras (step 8): bwrap's root made read-only.
fn read_only_root(m: &mut Vec<Mount>) {
    m.push(Mount::new(
        MountKind::ScratchRo,
        None,
        Path::new("/"),
        "bwrap's root, read-only once every mount is made: a directory made there (the \
         project's parents, the home's) would be lost at exit",
    ));
}

/// The network (step 9): the namespace flags, and in allowlist mode, with forwarded host
/// ports or with the login broker, the proxy the launcher starts on the host.
fn network(
    inp: &Inputs,
    broker: Option<&crate::policy::network::BrokerSpec>,
    notes: &mut Vec<String>,
) -> (Vec<&'static str>, Option<ProxySpec>) {
    let mut flags = NAMESPACE_FLAGS.to_vec();
    let mut proxy = None;
    let forward_ports = inp.settings.forward_ports.clone();
    match &inp.settings.network {
        NetworkMode::Open => {
            // The sandbox shares the host's loopback: a forwarded port is there already.
            for e in &forward_ports {
                notes.push(format!(
                    "forward-port {} ({}): nothing to do in open mode, the host's loopback is \
                     shared",
                    e.pattern, e.source
                ));
            }
            if broker.is_some() {
                // The broker in open mode: the proxy passes every other host through
                // unfiltered; only api.anthropic.com ends in the broker. The sandbox
                // reaching that host past the proxy holds only the stand-in, which is
                // worthless upstream.
                proxy = Some(ProxySpec {
                    http_proxy: true,
                    open: true,
                    broker: broker.cloned(),
                    allowlist: Default::default(),
                    forward_ports: Vec::new(),
                    denied_log: inp.state.denied_log(),
                    log_stderr: inp.log_denied,
                    instance_id: inp.instance_id.clone(),
                });
            }
        }
        NetworkMode::None if forward_ports.is_empty() && broker.is_none() => {
            flags.push("--unshare-net")
        }
        NetworkMode::None | NetworkMode::Allowlist(_) => {
            flags.push("--unshare-net");
            let allowlist = match &inp.settings.network {
                NetworkMode::Allowlist(list) => Some(list.clone()),
                _ => None,
            };
            proxy = Some(ProxySpec {
                // None mode with the broker: the proxy serves api.anthropic.com through
                // the broker and refuses everything else (its allowlist is empty).
                http_proxy: allowlist.is_some() || broker.is_some(),
                open: false,
                broker: broker.cloned(),
                allowlist: allowlist.unwrap_or_default(),
                forward_ports,
                denied_log: inp.state.denied_log(),
                log_stderr: inp.log_denied,
                instance_id: inp.instance_id.clone(),
            });
        }
    }
    (flags, proxy)
}

/// The environment: the host's IPC variables unset, the agent's directories, claudebox's
/// own variables, the defaults the user did not set, the proxy's and the broker's.
fn environment(inp: &Inputs, proxy: Option<&ProxySpec>, broker: bool) -> Vec<EnvOp> {
    let home = inp.home.as_path();
    let mut env: Vec<EnvOp> = inp
        .ipc_vars
        .iter()
        .filter(|v| !(inp.ssh_agent.is_some() && v.as_os_str() == "SSH_AUTH_SOCK"))
        .map(|v| EnvOp::Unset(v.clone()))
        .collect();
    if inp.ssh_agent.is_some() {
        env.push(set("SSH_AUTH_SOCK", OsStr::new(SSH_AGENT_SOCK)));
    }
    match inp.agent {
        AgentId::Claude => {
            env.push(set("CLAUDE_CONFIG_DIR", home.join(".claude").as_os_str()));
            env.push(set(
                "CLAUDE_SECURESTORAGE_CONFIG_DIR",
                inp.state.login_dir().as_os_str(),
            ));
        }
        AgentId::Codex => {
            env.push(set("CODEX_HOME", home.join(".codex").as_os_str()));
            // The databases stay in the project's CODEX_HOME, whatever the host says.
            env.push(EnvOp::Unset("CODEX_SQLITE_HOME".into()));
        }
    }
    let p = &inp.project;
    env.extend([
        set("CLAUDEBOX", OsStr::new("1")),
        set("CLAUDEBOX_PROJECT_ROOT", p.root.as_os_str()),
        set("CLAUDEBOX_PROJECT_ID", OsStr::new(&p.id())),
        set("CLAUDEBOX_INSTANCE_ID", OsStr::new(&inp.instance_id)),
    ]);
    env.push(match &inp.session {
        Some(s) => set("CLAUDEBOX_SESSION", OsStr::new(&s.name)),
        None => EnvOp::Unset("CLAUDEBOX_SESSION".into()),
    });
    for (name, value, _) in DEFAULT_ENV {
        let user_set = inp.preset_vars.iter().any(|v| v == name)
            || inp.settings.env.iter().any(|e| e.name == *name);
        if !user_set {
            env.push(set(name, OsStr::new(value)));
        }
    }
    cache_env(inp, &mut env);
    if proxy.is_some_and(|p| p.http_proxy && !p.open) {
        for (k, v) in crate::policy::network::proxy_env() {
            env.push(set(k, OsStr::new(v)));
        }
    }
    if broker {
        let ca = inp
            .state
            .login_dir()
            .join(crate::policy::network::BROKER_CA_FILE);
        env.push(set("NODE_EXTRA_CA_CERTS", ca.as_os_str()));
        // A credential in the launcher's environment would be one more way in.
        for v in crate::policy::network::BROKER_UNSET_ENV {
            env.push(EnvOp::Unset(v.into()));
        }
    }
    env
}

/// The command run inside: the user's, or the agent with its arguments (for claude: the
/// sandbox note, the named session's, the defaults, then the command line's).
fn command(inp: &Inputs) -> Vec<OsString> {
    match &inp.command {
        Command::Exec(cmd) => cmd.clone(),
        Command::Claude(args) if inp.agent == AgentId::Codex => {
            let program = inp
                .codex
                .as_ref()
                .map(|c| c.on_path.clone().into_os_string())
                .unwrap_or_else(|| "codex".into());
            let mut v = vec![program];
            match &inp.session {
                Some(s) => v.extend(s.codex_args(args)),
                None => v.extend(args.iter().cloned()),
            }
            v
        }
        Command::Claude(args) => {
            let program = inp
                .claude
                .as_ref()
                .map(|c| c.on_path.clone().into_os_string())
                .unwrap_or_else(|| "claude".into());
            let mut v = vec![program, "--append-system-prompt".into(), sandbox_note(inp)];
            if let Some(s) = &inp.session {
                v.extend(s.claude_args());
            }
            for defaults in &inp.settings.claude_args {
                v.extend(defaults.args.iter().cloned());
            }
            v.extend(args.iter().cloned());
            v
        }
    }
}

/// The one step inside (see `Confine`): the Landlock scope (a note when the kernel has
/// none), the mount checks from the project's mounts on, and the proxy's listeners.
fn confinement(
    inp: &Inputs,
    m: &[Mount],
    project_mount: usize,
    proxy: Option<&ProxySpec>,
    notes: &mut Vec<String>,
) -> Confine {
    let scope_abstract_unix = inp.landlock_abi >= 6;
    if !scope_abstract_unix {
        notes.push(
            "gap: this kernel has no Landlock scopes (Linux 6.12+), so abstract unix sockets \
             of the host (X11 @/tmp/.X11-unix, some D-Bus buses) stay reachable"
                .to_string(),
        );
    }
    let listen = proxy.map(|spec| Listen {
        // Open mode: port 0, any free one on the host's loopback; the step sets
        // HTTPS_PROXY to it.
        port: spec.http_proxy.then_some(if spec.open {
            0
        } else {
            crate::policy::network::PROXY_PORT
        }),
        // A forward on the proxy's port, or too many, is refused at the edge.
        forwards: spec.forwards().unwrap_or_default(),
        broker_dir: spec.broker.as_ref().map(|_| inp.state.login_dir()),
    });
    let agent_dir = inp.home.join(inp.agent.row().state_dir);
    let mount_checks = mount_checks(m, project_mount, &project_dirs(&inp.project), &agent_dir);
    Confine {
        exe: inp.own_exe.clone(),
        scope_abstract_unix,
        mount_checks,
        default_signals: true,
        listen,
        // The main git dir, and the submodules' and nested repositories' git dirs pinned
        // at the launch (a mount point each: what the supervisor guards by inode stays
        // that directory). One made during the session is judged at exit.
        guard_git_dirs: (inp.project.common_dir.iter())
            .chain(
                inp.protected
                    .iter()
                    .filter(|p| {
                        p.guard == Guard::Pin
                            && p.why == crate::policy::protected::PINNED_GIT_DIR_WHY
                    })
                    .map(|p| &p.path),
            )
            .filter(|_| inp.protect_project_metadata)
            .cloned()
            .collect(),
        guard_work_tree: (inp.project.common_dir.iter())
            .filter(|_| inp.protect_project_metadata)
            .flat_map(|_| guarded_tops(inp))
            .collect(),
    }
}

/// The work-tree tops where the supervisor refuses `confinement::GUARDED_TOP_NAMES`: the
/// project's, then each directory holding a `.git` the launch protects (a nested
/// repository's pinned git dir or `.git` file, a submodule's `.git` file): git's
/// discovery there takes the top for a bare repository once that `.git` is no valid git
/// dir, as at the project's top. A `.git` made during the session is judged at exit.
fn guarded_tops(inp: &Inputs) -> Vec<PathBuf> {
    let mut tops = vec![inp.project.work_tree.clone()];
    let nested = (inp.protected.iter())
        .filter(|p| p.path.file_name() == Some(OsStr::new(".git")))
        .filter_map(|p| p.path.parent());
    for top in nested {
        if !tops.iter().any(|t| t.as_os_str() == top.as_os_str()) {
            tops.push(top.to_path_buf());
        }
    }
    tops
}

/// Marketplaces added as a local directory (`~/.claude/plugins/known_marketplaces.json`):
/// claude reads their plugins from there, so each is bound read-only.
fn marketplaces(inp: &Inputs, m: &mut Vec<Mount>) {
    for dir in &inp.marketplaces {
        m.push(Mount::same(
            MountKind::Ro,
            dir,
            "a plugin marketplace added as a local directory \
             (~/.claude/plugins/known_marketplaces.json): claude reads its plugins from here",
        ));
    }
}

/// What the broker lends, when it is on and can serve: the agent is Claude Code and there
/// is a login file or an API key (in every network mode).
fn broker_login(inp: &Inputs) -> Option<crate::policy::network::BrokerSpec> {
    if !inp.login_broker || inp.agent != AgentId::Claude {
        return None;
    }
    let credentials = inp.claude_home.credentials.clone();
    // The helper is lent only where the sandbox gets the copy without it (the user's
    // settings.json, read-only): `--writable-claude-setup` leaves it inside, as before.
    let api_key_helper = inp
        .api_key_helper
        .clone()
        .filter(|_| !inp.writable_claude_setup);
    let settings_api_key = inp
        .settings_api_key
        .clone()
        .filter(|_| !inp.writable_claude_setup);
    if credentials.is_none()
        && !inp.api_key
        && api_key_helper.is_none()
        && settings_api_key.is_none()
    {
        return None;
    }
    Some(crate::policy::network::BrokerSpec {
        credentials,
        // The settings' key is the one claude would use: it is lent in place of the
        // environment's.
        api_key: inp.api_key && settings_api_key.is_none(),
        api_key_helper,
        settings_api_key,
    })
}

/// Steps 6 and 7: `~/.claude` (see `claude_home`), then the installation again if it
/// lies under `~/.claude` (so nothing of that group can re-expose it read-write), and
/// `~/.claude.json` as a symlink to the project's copy.
fn claude_home(inp: &Inputs, m: &mut Vec<Mount>, notes: &mut Vec<String>) {
    let home = inp.home.as_path();
    let inside = home.join(".claude");
    for o in claude_home::overlays(
        home,
        &inp.claude_home,
        &inp.state,
        inp.writable_claude_setup,
    ) {
        m.push(overlay_mount(inp, o));
    }
    if let Some(c) = &inp.claude {
        if c.bind.starts_with(&inside) {
            m.push(Mount::same(
                MountKind::Ro,
                &c.bind,
                "the claude installation, again: it lies under ~/.claude and stays read-only",
            ));
        }
        if c.on_path.starts_with(&inside) && c.on_path != c.real && !c.bind.starts_with(&c.on_path)
        {
            m.push(Mount::new(
                MountKind::Symlink,
                Some(&c.real),
                &c.on_path,
                "claude as the host's PATH finds it, again (under ~/.claude)",
            ));
        }
    }
    let json = home.join(".claude.json");
    if !home.starts_with(&inp.project.work_tree) {
        m.push(Mount::new(
            MountKind::Symlink,
            Some(Path::new(".claude/.claude.json")),
            &json,
            "this project's config (CLAUDE_CONFIG_DIR=~/.claude keeps it in ~/.claude), \
             for tools that read ~/.claude.json",
        ));
    } else if inp.home_claude_json {
        // The home is (in) the project (`--yes`): the real file lies in the read-write
        // project, where no symlink can be made. The project's copy covers it: the real
        // one (every project's trust and MCP servers) is neither shown nor written.
        m.push(Mount::new(
            MountKind::File,
            Some(&inp.state.claude_json()),
            &json,
            "this project's config over your real ~/.claude.json, which lies in the \
             project (the home): the real one is neither shown nor written",
        ));
    }
    if inp.writable_claude_setup {
        notes.push(
            "opt-in --writable-claude-setup: your ~/.claude setup (settings.json, hooks, \
             commands, agents, skills, plugins, CLAUDE.md, ...) is writable; what the agent \
             writes there runs on the host and in every other sandbox"
                .to_string(),
        );
    }
}

/// One mount of an agent's state group (`claude_home`, `codex_home`) as a plan mount.
fn overlay_mount(inp: &Inputs, o: Overlay) -> Mount {
    match o {
        Overlay::Bind {
            source,
            target,
            writable,
            file,
            why,
        } => {
            let kind = match (writable, file) {
                (true, true) => MountKind::File,
                (true, false) => MountKind::Rw,
                (false, _) if source.starts_with(&inp.state.dir) => MountKind::Ro,
                (false, _) => MountKind::RoTry,
            };
            Mount::new(kind, Some(&source), &target, &why)
        }
        Overlay::EmptyDir { target, why } => Mount::new(MountKind::EmptyRo, None, &target, &why),
        Overlay::Tmpfs { target, why } => Mount::new(MountKind::Tmpfs, None, &target, &why),
    }
}

/// Step 6 with `--agent codex`: `~/.codex` (see `codex_home`); the login's symlink in it
/// is made on the host by `state::codex_home` (a note says so).
fn codex_home(inp: &Inputs, m: &mut Vec<Mount>, notes: &mut Vec<String>) {
    for o in codex_home::overlays(&inp.home, &inp.codex_home, &inp.state) {
        m.push(overlay_mount(inp, o));
    }
    notes.push(format!(
        "agent codex: ~/.codex/auth.json is a symlink (made before each launch) to {}: Codex \
         writes beside a link's target, so every Codex sandbox shares one login and its lock",
        inp.state
            .codex_login_dir()
            .join(codex_home::LOGIN_FILE)
            .display()
    ));
}

fn project_dirs(p: &Project) -> Vec<PathBuf> {
    let mut v = vec![p.work_tree.clone()];
    v.extend(p.outside_git_dirs());
    v
}

/// The mounts from the project's on whose destination lies in a directory a sandbox can
/// write: the project and its git dirs (and anything in them), entries of `~/.claude`.
/// A mount that a later one covers (same path or a parent) is not visible, so not checked.
fn mount_checks(
    m: &[Mount],
    from: usize,
    project_dirs: &[PathBuf],
    claude_dir: &Path,
) -> Vec<MountCheck> {
    let mut out = Vec::new();
    for (i, mount) in m.iter().enumerate().skip(from) {
        let read_only = match mount.kind {
            MountKind::Ro | MountKind::EmptyRo => true,
            MountKind::Rw | MountKind::File | MountKind::Tmpfs => false,
            MountKind::RoTry
            | MountKind::Symlink
            | MountKind::Dev
            | MountKind::Proc
            | MountKind::DevBind
            | MountKind::ScratchRo => continue,
        };
        let t = &mount.target;
        let reachable = project_dirs.iter().any(|d| t.starts_with(d))
            || (t.starts_with(claude_dir) && t != claude_dir);
        // A scratch-ro row only remounts what lies around the mounts beneath it.
        let covered = m[i + 1..]
            .iter()
            .any(|later| later.kind != MountKind::ScratchRo && t.starts_with(&later.target));
        if reachable && !covered {
            out.push(MountCheck {
                path: t.clone(),
                read_only,
            });
        }
    }
    out
}

/// Step 4's second half: read-only mounts over the project's code-bearing paths.
fn protect(inp: &Inputs, m: &mut Vec<Mount>, notes: &mut Vec<String>) {
    if !inp.protect_project_metadata {
        notes.push(
            "opt-in --writable-project-config: .git/hooks, .git/config, .envrc, .vscode, \
             .idea, .codex, .claude, .mcp.json, .husky, lefthook and pre-commit config, .gitmodules, \
             .devcontainer and nested repositories' git dirs are writable; tools on the host \
             run code from them"
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
            Guard::Scratch => Mount::new(MountKind::Tmpfs, None, &p.path, &why),
            Guard::LocalSettings => Mount::new(
                MountKind::File,
                Some(&inp.state.local_settings()),
                &p.path,
                &why,
            ),
            Guard::GitIgnore => Mount::new(
                MountKind::Ro,
                Some(&inp.state.claude_gitignore()),
                &p.path,
                &why,
            ),
        });
    }
    if !inp.unprotected_missing.is_empty() {
        let names: Vec<String> = inp
            .unprotected_missing
            .iter()
            .map(|p| crate::policy::escape::shown(p.file_name().unwrap_or(p.as_os_str())))
            .collect();
        notes.push(format!(
            "gap: these do not exist in the work tree, so they are not protected and can be \
             created (a mount would leave an empty one in your project): {}; nor are git \
             repositories created later, or nested elsewhere than at the top level or in \
             vendor/, third_party/, lib/, ... (see protect::VENDOR_DIRS)",
            names.join(", ")
        ));
    }
}

/// The user's extra mounts as plan mounts, split into those that go before the project
/// (parents of it) and those that go last; each list parents first.
/// The directories around the project that would live only in the sandbox: the parents of
/// the project's directories up to the file system they are made in (bwrap's root, the
/// home's tmpfs or /tmp's). Below the home or /tmp, the first directory under it on the way
/// to the project becomes a tmpfs, inserted right after that file system's mount (before
/// anything mounted beneath it) and made read-only at the end (`ScratchRo`); a project
/// directly in the home or /tmp keeps its parent writable, as the scratch home must be.
/// Parents in bwrap's root need nothing here: `/` is made read-only at the end in every
/// plan. A user's mount at or above that directory covers it.
fn scratch_parents(m: &mut Vec<Mount>, p: &Project, home: &Path, before: &[Mount]) {
    let mut dirs = vec![p.work_tree.clone()];
    dirs.extend(p.outside_git_dirs());
    let tmp = Path::new("/tmp");
    for d in &dirs {
        let base = if d.starts_with(home) && d != home {
            home
        } else if d.starts_with(tmp) && d != tmp {
            tmp
        } else {
            continue;
        };
        let Ok(rel) = d.strip_prefix(base) else {
            continue;
        };
        let Some(first) = rel.components().next() else {
            continue;
        };
        let top = base.join(first);
        let covered = before.iter().any(|e| top.starts_with(&e.target))
            || m.iter()
                .any(|e| e.kind == MountKind::ScratchRo && e.target == top);
        if top == *d || covered {
            continue;
        }
        let Some(at) = m
            .iter()
            .position(|e| e.kind == MountKind::Tmpfs && e.target == base)
        else {
            continue;
        };
        m.insert(
            at + 1,
            Mount::new(
                MountKind::ScratchRo,
                None,
                &top,
                "the project's parents, read-only once the mounts beneath are made: a \
                 worktree or file made there would be lost at exit",
            ),
        );
    }
}

fn place_extras(extras: &[ExtraMount], p: &Project, empty: &Path) -> (Vec<Mount>, Vec<Mount>) {
    let mut sorted: Vec<&ExtraMount> = extras.iter().collect();
    sorted.sort_by_key(|e| e.target.components().count());
    let mut project_dirs = vec![p.work_tree.clone()];
    project_dirs.extend(p.outside_git_dirs());
    let (before, after): (Vec<&ExtraMount>, Vec<&ExtraMount>) = sorted.into_iter().partition(|e| {
        project_dirs
            .iter()
            .any(|d| d.starts_with(&e.target) && *d != e.target)
    });
    let to_mount = |e: &&ExtraMount| {
        let (kind, source, why) = match (e.kind, e.is_dir) {
            (ExtraKind::Ro, _) => (
                MountKind::Ro,
                Some(e.source.as_path()),
                "read-only, as you asked",
            ),
            (ExtraKind::Rw, true) => (
                MountKind::Rw,
                Some(e.source.as_path()),
                "read-write, as you asked",
            ),
            (ExtraKind::Rw, false) => (
                MountKind::File,
                Some(e.source.as_path()),
                "read-write, as you asked",
            ),
            (ExtraKind::Hide, true) => {
                (MountKind::Tmpfs, None, "hidden: an empty directory over it")
            }
            (ExtraKind::Hide, false) => {
                (MountKind::Ro, Some(empty), "hidden: an empty file over it")
            }
        };
        let mut m = Mount::new(kind, source, &e.target, why);
        m.origin = e.origin.clone();
        m
    };
    (
        before.iter().map(to_mount).collect(),
        after.iter().map(to_mount).collect(),
    )
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
        b", ~/.claude (this project's own copy: the user's setup in it, hooks, commands, \
          agents, skills, plugins, CLAUDE.md, is read-only; settings.json is a copy whose \
          changes last until the sandbox exits), ~/.claude.json (this \
          project's copy), and the temporary /tmp and home directory (both discarded when \
          the sandbox exits). The rest of the system is read-only; the rest of the real \
          home directory (ssh keys, other projects) is not visible. Files you create \
          outside the project and ~/.claude are lost at exit (the directories around the \
          project are read-only for that reason: make git worktrees inside the project). A single read-only file \
          that a program replaces by rename fails with \"Device or resource busy\" \
          (EBUSY), not \"Read-only file system\": it means read-only. If a command fails \
          for lack of access, say so instead of working around the sandbox.",
    );
    for (kind, label) in [
        (ExtraKind::Ro, " Also readable (read-only):"),
        (ExtraKind::Rw, " Also writable:"),
        (ExtraKind::Hide, " Hidden (empty on purpose):"),
    ] {
        let mut listed = false;
        for e in inp.settings.mounts.iter().filter(|e| e.kind == kind) {
            s.extend_from_slice(if listed { b"," } else { label.as_bytes() });
            s.push(b' ');
            s.extend_from_slice(e.target.as_os_str().as_bytes());
            listed = true;
        }
        if listed {
            s.push(b'.');
        }
    }
    if inp.settings.gpu.is_some() && !inp.gpu.devices().is_empty() {
        s.extend_from_slice(gpu::PROMPT_NOTE.as_bytes());
    }
    match &inp.settings.network {
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
    if !matches!(inp.settings.network, NetworkMode::Open) && !inp.settings.forward_ports.is_empty()
    {
        let ports: Vec<String> = (inp.settings.forward_ports.iter())
            .map(|e| e.pattern.to_string())
            .collect();
        s.extend_from_slice(
            b" The host's services on these loopback ports are reachable at the same address: ",
        );
        s.extend_from_slice(ports.join(", ").as_bytes());
        s.push(b'.');
    }
    OsString::from_vec(s)
}

#[cfg(test)]
pub(crate) mod tests;

/// Whether a plan mount takes a host source that bwrap binds.
pub fn is_bind(kind: &MountKind) -> bool {
    matches!(
        kind,
        MountKind::Ro | MountKind::RoTry | MountKind::Rw | MountKind::File
    )
}
