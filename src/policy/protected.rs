//! The protected paths as data: how each is laid over (`Guard`), and the tables of names
//! `host::protect` looks for in the project (each with its reason).

use std::path::PathBuf;

/// How a protected path is laid over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// An existing file or directory, bound read-only onto itself.
    ReadOnly,
    /// A missing directory: an empty read-only directory in its place (bwrap leaves an
    /// empty directory on the host as the mount point).
    EmptyDir,
    /// A missing file: an empty read-only file in its place (bwrap leaves an empty file on
    /// the host as the mount point).
    EmptyFile,
    /// An existing directory bound read-write onto itself so that it is a mount point,
    /// which cannot be renamed or removed.
    Pin,
    /// A writable tmpfs in its place: the sandbox may write there, nothing reaches the
    /// host, all of it is gone at exit (the host's entries are bound back read-only).
    Scratch,
    /// `.claude/settings.local.json`: the project's copy in claudebox's state
    /// (`ProjectState::local_settings`), read-write. Claude saves "always allow" rules
    /// there (a temporary file in `.claude`, then `rename`, which fails with EBUSY on a
    /// mount point, then a rewrite in place: measured with 2.1.330).
    LocalSettings,
    /// `.claude/.gitignore` in the scratch `.claude`, when the host's `.claude` has neither
    /// a `.gitignore` nor a `settings.local.json`: the state's read-only file
    /// (`ProjectState::claude_gitignore`, [`CLAUDE_GITIGNORE`]) that ignores itself and
    /// the stand-in `settings.local.json`, so that `git status` inside shows what it shows
    /// on the host and `git add -A` commits nothing claudebox placed. Nothing is written
    /// in the user's repository (no `info/exclude` line), and git's configuration is left
    /// as the user's (a `core.excludesFile` in the environment would replace theirs).
    GitIgnore,
}

/// What the stand-in `.claude/.gitignore` holds (see [`Guard::GitIgnore`]).
pub const CLAUDE_GITIGNORE: &str =
    "# claudebox: inside the sandbox only (never on your disk): the stand-ins\n\
# claudebox placed in the scratch .claude, ignored so that git does not show or commit them\n\
/.gitignore\n\
/settings.local.json\n";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protected {
    pub path: PathBuf,
    pub guard: Guard,
    pub why: &'static str,
    /// The file that named this path, when that is not claudebox's own table (a
    /// `core.worktree` or `core.hooksPath` value): an error about the path names it.
    pub named_by: Option<PathBuf>,
}

/// Work-tree entries that tools on the host run code from, read-only when they exist.
pub const WORK_TREE_ENTRIES: &[(&str, &str)] = &[
    (".envrc", "direnv runs it on the host"),
    (
        ".vscode",
        "VS Code runs tasks and settings from it on the host",
    ),
    (
        ".idea",
        "JetBrains IDEs run configurations from it on the host",
    ),
    (
        ".codex",
        "a host Codex reads the project's .codex (config.toml: notify commands, MCP servers, \
         hooks)",
    ),
    (
        ".husky",
        "husky's hook stubs (core.hooksPath .husky/_) run .husky/<hook> on a host git commit",
    ),
    (
        "lefthook.yml",
        "lefthook: the hooks it installs run the commands listed here",
    ),
    (
        "lefthook.yaml",
        "lefthook: the hooks it installs run the commands listed here",
    ),
    (
        "lefthook.toml",
        "lefthook: the hooks it installs run the commands listed here",
    ),
    (
        "lefthook.json",
        "lefthook: the hooks it installs run the commands listed here",
    ),
    (
        ".lefthook.yml",
        "lefthook: the hooks it installs run the commands listed here",
    ),
    (
        ".lefthook.yaml",
        "lefthook: the hooks it installs run the commands listed here",
    ),
    (
        ".lefthook.toml",
        "lefthook: the hooks it installs run the commands listed here",
    ),
    (
        ".lefthook.json",
        "lefthook: the hooks it installs run the commands listed here",
    ),
    (
        "lefthook-local.yml",
        "lefthook: local overrides of the commands it runs",
    ),
    (
        "lefthook-local.yaml",
        "lefthook: local overrides of the commands it runs",
    ),
    (
        ".lefthook-local.yml",
        "lefthook: local overrides of the commands it runs",
    ),
    (
        ".lefthook-local.yaml",
        "lefthook: local overrides of the commands it runs",
    ),
    (".lefthook", "lefthook: scripts its hooks run"),
    (".lefthook-local", "lefthook: local scripts its hooks run"),
    (
        ".pre-commit-config.yaml",
        "pre-commit: its git hook runs the commands listed here",
    ),
    (
        ".pre-commit-config.yml",
        "pre-commit: its git hook runs the commands listed here",
    ),
    (
        ".mcp.json",
        "a host claude in the project starts its MCP servers",
    ),
    (
        ".gitmodules",
        "git submodule sync/update copy its URLs into .git/config and fetch from them",
    ),
    (
        ".devcontainer",
        "VS Code and the devcontainer CLI run its initializeCommand on the host",
    ),
    (
        ".devcontainer.json",
        "VS Code and the devcontainer CLI run its initializeCommand on the host",
    ),
];

/// The project's Claude Code directory: hooks, MCP servers, commands, agents, skills, a
/// host `claude` started in the project runs them.
pub const CLAUDE_DIR: &str = ".claude";

/// Where claude saves "always allow" rules, inside [`CLAUDE_DIR`].
pub const LOCAL_SETTINGS: &str = "settings.local.json";

/// Top-level directories where vendored repositories conventionally live: nested
/// repositories are also looked for one level below them.
pub const VENDOR_DIRS: &[&str] = &[
    "vendor",
    "vendored",
    "third_party",
    "third-party",
    "thirdparty",
    "external",
    "externals",
    "extern",
    "deps",
    "lib",
    "libs",
    "packages",
    "modules",
    "contrib",
    "submodules",
];

/// Shared system directories: other programs keep their files and unix sockets there, so
/// none of them, nor a directory holding one, is a project without `--yes` (see
/// `config::guard::check_shared_dir`). `$XDG_RUNTIME_DIR` is added at the launch.
pub const SHARED_SYSTEM_DIRS: &[(&str, &str)] = &[
    (
        "/tmp",
        "every user's and program's temporary files and sockets (tmux, X11, ssh agents)",
    ),
    (
        "/var/tmp",
        "every user's and program's temporary files, kept across reboots",
    ),
    (
        "/dev/shm",
        "shared memory of running programs (browsers, PulseAudio)",
    ),
    (
        "/run",
        "system services' sockets (docker, D-Bus, systemd) and every user's runtime dir",
    ),
];

/// Why `$XDG_RUNTIME_DIR` is refused like [`SHARED_SYSTEM_DIRS`].
pub const XDG_RUNTIME_DIR_WHY: &str =
    "your session's sockets (D-Bus, Wayland, ssh and gpg agents, pipewire)";

/// How deep below the project's top unix sockets are looked for by reading directories at
/// the launch (the project's own entries are level 1). Live sockets bound in the host's
/// network namespace (tmux, X11, ssh agents, dev servers) are found at any depth through
/// `/proc/net/unix`; this scan adds the rest (another namespace's, stale ones).
pub const SOCKET_SCAN_DEPTH: usize = 2;

/// Directories not looked into for sockets: the git dir (git's own fsmonitor daemon
/// socket, `fsmonitor--daemon.ipc`, answers which paths changed and runs nothing) and
/// the two large trees of generated files.
pub const SOCKET_SCAN_SKIP: &[&str] = &[".git", "node_modules", "target"];

/// At most this many directory entries are looked at for sockets (a bound on the
/// launch's cost); the rest is named in the warning as not looked at.
pub const SOCKET_SCAN_LIMIT: usize = 2_000;

/// Why a submodule's or a nested repository's git dir is pinned: a git dir of its own,
/// which the file supervisor also guards (no `commondir` can be made in it; see
/// `plan::confine`), as it guards the main one.
pub const PINNED_GIT_DIR_WHY: &str =
    "a git dir (a submodule's or a nested repository's), pinned: it cannot be renamed away \
     and replaced, and no commondir can be made in it";

/// Why a unix socket found in the project is covered with `--yes`.
pub const SOCKET_WHY: &str =
    "another program's unix socket in the project (--yes): /dev/null over it, so connect() is refused";
