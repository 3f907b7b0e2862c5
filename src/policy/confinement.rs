//! The step inside the sandbox as data: its argv flags (rendered by `render`, parsed by
//! `inside::confine`); the seccomp table, policy as data: one row per syscall with the reason, compiled into
//! the filter by `inside::confine` and printed by `--dry-run` from the same rows; and the
//! Landlock scope's line.

use nix::libc;

/// The in-sandbox step's own flags.
pub const INIT_FLAG: &str = "--sandbox-init";
pub const SCOPE_FLAG: &str = "--scope-abstract-unix";
/// `--expect-ro PATH` / `--expect-rw PATH`: PATH must be a mount point, reached without a
/// symlink, read-only (or not).
pub const EXPECT_RO: &str = "--expect-ro";
pub const EXPECT_RW: &str = "--expect-rw";
pub const SIGNALS_FLAG: &str = "--default-signals";
/// Allowlist mode, or forwarded host ports: `--proxy-fd FD [--proxy-port PORT] [--forward
/// ADDR] [--forward-optional ADDR]...`: open these listeners and send them to the proxy
/// over FD (no `--proxy-port` in none mode: only the forwards).
pub const PROXY_FD_FLAG: &str = "--proxy-fd";
pub const PROXY_PORT_FLAG: &str = "--proxy-port";
/// `--broker-dir DIR`: write the login broker's stand-in login into DIR.
pub const BROKER_DIR_FLAG: &str = "--broker-dir";
pub const FORWARD_FLAG: &str = "--forward";
pub const FORWARD_OPTIONAL_FLAG: &str = "--forward-optional";
/// `--stderr-fd FD`: the caller's real stderr. The step inside writes [`UP_MARKER`] on its
/// stderr (bwrap's, a pipe the launcher reads), puts FD back on 2 and closes FD, so the
/// launcher tells bwrap's setup failing from the agent's own exit and the agent keeps the
/// terminal.
pub const STDERR_FD_FLAG: &str = "--stderr-fd";
/// What the step inside writes when bwrap's setup is done (no bwrap message holds a NUL).
pub const UP_MARKER: &[u8] = b"\0claudebox: sandbox up\n";

/// One rule of the seccomp filter: a syscall, the argument it is matched on (if any), and
/// why. The filter is compiled from [`SECCOMP`] and `--dry-run` prints it from there, one
/// line per row ([`seccomp_lines`]).
pub struct Rule {
    pub syscall: &'static str,
    pub nr: i64,
    pub arg: Option<ArgEq>,
    pub reason: &'static str,
}

/// The syscall's argument `index` equals `value` in its low 32 bits (the kernel reads an
/// ioctl request as a 32-bit unsigned int: a request with junk in the high bits is the
/// same request).
pub struct ArgEq {
    pub index: u8,
    pub name: &'static str,
    pub value: u32,
}

/// `TIOCLINUX` (console ioctl multiplexer; its subcode 2 pastes the selection as input).
const TIOCLINUX: u32 = 0x541C;

/// What a call that matches a row gets: it fails with this errno, and the process goes on.
pub const MATCH_ERRNO: (i32, &str) = (libc::EPERM, "EPERM");

/// The seccomp rules, policy as data. Every other call of the native ABI is allowed.
pub const SECCOMP: &[Rule] = &[
    Rule {
        syscall: "ioctl",
        nr: libc::SYS_ioctl,
        arg: Some(ArgEq {
            index: 1,
            name: "TIOCSTI",
            value: libc::TIOCSTI as u32,
        }),
        reason: "no typing into your terminal",
    },
    Rule {
        syscall: "ioctl",
        nr: libc::SYS_ioctl,
        arg: Some(ArgEq {
            index: 1,
            name: "TIOCLINUX",
            value: TIOCLINUX,
        }),
        reason: "no pasting the console selection into your terminal",
    },
    Rule {
        syscall: "add_key",
        nr: libc::SYS_add_key,
        arg: None,
        reason: "the host session's kernel keyring",
    },
    Rule {
        syscall: "keyctl",
        nr: libc::SYS_keyctl,
        arg: None,
        reason: "the host session's kernel keyring",
    },
    Rule {
        syscall: "request_key",
        nr: libc::SYS_request_key,
        arg: None,
        reason: "the host session's kernel keyring",
    },
    Rule {
        syscall: "io_uring_setup",
        nr: libc::SYS_io_uring_setup,
        arg: None,
        reason: "io_uring opens, renames and links files without a system call this filter \
                 or the file supervisor sees (callers fall back to plain calls)",
    },
    Rule {
        syscall: "io_uring_enter",
        nr: libc::SYS_io_uring_enter,
        arg: None,
        reason: "io_uring (see io_uring_setup)",
    },
    Rule {
        syscall: "io_uring_register",
        nr: libc::SYS_io_uring_register,
        arg: None,
        reason: "io_uring (see io_uring_setup)",
    },
];

/// `--guard-git-dir DIR`: the file supervisor refuses to make a `commondir` in DIR (the
/// project's main git dir), see [`NOTIFIED`].
pub const GUARD_FLAG: &str = "--guard-git-dir";

/// Tests only (debug builds; a release build ignores it): set in claudebox's environment,
/// the step inside starts no file supervisor (the controls of the escape attempts). Not a
/// user setting: the launch's inotify watch still runs.
pub const NO_SUPERVISOR_ENV: &str = "CLAUDEBOX_TEST_NO_FILE_SUPERVISOR";

/// Debug builds only: the file supervisor resolves every caller's paths from its own root,
/// also a caller with a root of its own (a sandbox inside this one): the control of the
/// test that such a caller keeps its own view (`file_supervisor::a_sandbox_inside_*`).
pub const NO_WALK_ENV: &str = "CLAUDEBOX_TEST_SUPERVISOR_NO_WALK";

/// The names the file supervisor never lets appear in a guarded git dir: git lstats them
/// there, they do not exist at launch (so no read-only mount can hold them), and the
/// host's git follows what they say (`src/policy/git_dir.rs`).
pub const GUARDED_NAMES: &[(&str, &str)] = &[(
    "commondir",
    "git reads config (core.fsmonitor) and hooks from the directory it names: the host's \
     next git status would run the agent's code",
)];

/// The names the file supervisor never lets appear at the work tree's top (the main
/// checkout's, and those of the nested repositories and submodules pinned at the launch,
/// see `plan::guarded_tops`): with one there, and `objects/` and `refs/` beside it, git's discovery
/// takes the top for a bare repository as soon as the main `.git` is no valid git dir
/// (its `HEAD`, which git writes, made no ref), and reads the top's `config` (measured
/// with git 2.47: the host's git status at the top ran its core.fsmonitor while the
/// sandbox ran, and the agent removed its files before the exit review).
pub const GUARDED_TOP_NAMES: &[(&str, &str)] = &[(
    "HEAD",
    "git takes the work tree's top for a bare repository once .git is made invalid, and \
     the host's next git status would run the fsmonitor of the top's config",
)];

/// `--guard-work-tree DIR`: the file supervisor refuses [`GUARDED_TOP_NAMES`] in DIR (the
/// project's work tree top, or a nested repository's or submodule's).
pub const GUARD_TOP_FLAG: &str = "--guard-work-tree";

/// When a call is handed to the file supervisor.
pub enum When {
    /// Always (its flags are in memory, or every form of it makes a name).
    Always,
    /// When argument `index` has a bit of `mask` set (`O_CREAT` of an open).
    FlagSet {
        index: u8,
        name: &'static str,
        mask: u32,
    },
}

/// One call the file supervisor performs itself (seccomp user notification): the calls
/// that can make a name appear in a directory.
pub struct Notified {
    pub syscall: &'static str,
    pub nr: i64,
    pub when: When,
    pub reason: &'static str,
}

/// The notified calls, policy as data: the step inside compiles them into a second
/// filter whose listener the file supervisor holds; `--dry-run` prints them from here.
/// Left to the kernel: `bind()` of a unix socket and an `O_TMPFILE` open (a socket named
/// `commondir` makes the host's git die rather than follow it; the launch's watch and the
/// exit review move it aside), and every call that makes no name. `umask()` is notified
/// only to be let go on (it names no path), after the supervisor noted it.
pub const NOTIFIED: &[Notified] = &[
    Notified {
        syscall: "open",
        nr: legacy::OPEN,
        when: When::FlagSet {
            index: 1,
            name: "O_CREAT",
            mask: libc::O_CREAT as u32,
        },
        reason: "creates a file",
    },
    Notified {
        syscall: "openat",
        nr: libc::SYS_openat,
        when: When::FlagSet {
            index: 2,
            name: "O_CREAT",
            mask: libc::O_CREAT as u32,
        },
        reason: "creates a file",
    },
    Notified {
        syscall: "creat",
        nr: legacy::CREAT,
        when: When::Always,
        reason: "creates a file",
    },
    Notified {
        syscall: "openat2",
        nr: libc::SYS_openat2,
        when: When::Always,
        reason: "its flags are in memory the filter cannot read",
    },
    Notified {
        syscall: "rename",
        nr: legacy::RENAME,
        when: When::Always,
        reason: "puts an entry at a new name",
    },
    Notified {
        syscall: "renameat",
        nr: libc::SYS_renameat,
        when: When::Always,
        reason: "puts an entry at a new name",
    },
    Notified {
        syscall: "renameat2",
        nr: libc::SYS_renameat2,
        when: When::Always,
        reason: "puts an entry at a new name (RENAME_EXCHANGE at either)",
    },
    Notified {
        syscall: "link",
        nr: legacy::LINK,
        when: When::Always,
        reason: "puts a file at a new name",
    },
    Notified {
        syscall: "linkat",
        nr: libc::SYS_linkat,
        when: When::Always,
        reason: "puts a file at a new name (an O_TMPFILE one too)",
    },
    Notified {
        syscall: "symlink",
        nr: legacy::SYMLINK,
        when: When::Always,
        reason: "makes a symlink",
    },
    Notified {
        syscall: "symlinkat",
        nr: libc::SYS_symlinkat,
        when: When::Always,
        reason: "makes a symlink",
    },
    Notified {
        syscall: "mkdir",
        nr: legacy::MKDIR,
        when: When::Always,
        reason: "makes a directory (at commondir git would die)",
    },
    Notified {
        syscall: "mkdirat",
        nr: libc::SYS_mkdirat,
        when: When::Always,
        reason: "makes a directory (at commondir git would die)",
    },
    Notified {
        syscall: "mknod",
        nr: legacy::MKNOD,
        when: When::Always,
        reason: "makes a file or FIFO",
    },
    Notified {
        syscall: "mknodat",
        nr: libc::SYS_mknodat,
        when: When::Always,
        reason: "makes a file or FIFO",
    },
    Notified {
        syscall: "umask",
        nr: libc::SYS_umask,
        when: When::Always,
        reason: "sets the mask the supervisor's calls apply: the caller's thread group has \
                 its umask read at each call from then on; the call itself is the kernel's",
    },
];

/// The calls x86_64 has and the newer architectures do not (-1 there: no row is compiled).
pub mod legacy {
    #[cfg(target_arch = "x86_64")]
    pub use nix::libc::{
        SYS_creat as CREAT, SYS_link as LINK, SYS_mkdir as MKDIR, SYS_mknod as MKNOD,
        SYS_open as OPEN, SYS_rename as RENAME, SYS_symlink as SYMLINK,
    };
    #[cfg(not(target_arch = "x86_64"))]
    mod none {
        pub const CREAT: i64 = -1;
        pub const LINK: i64 = -1;
        pub const MKDIR: i64 = -1;
        pub const MKNOD: i64 = -1;
        pub const OPEN: i64 = -1;
        pub const RENAME: i64 = -1;
        pub const SYMLINK: i64 = -1;
    }
    #[cfg(not(target_arch = "x86_64"))]
    pub use none::*;
}

/// What the supervisor does with a notified call, as `--dry-run` says it.
pub const SUPERVISOR: &str = "a process forked before the command (its parent, not \
     dumpable, reaping the orphans) reads each notified call's path from the caller, opens \
     the parent directory itself, refuses a guarded name in a guarded git dir with EPERM and \
     otherwise makes the call itself on that directory and answers with its result (a \
     created file's descriptor injected into the caller): what it checked is what is used \
     (Linux 5.19+, Yama's ptrace_scope 0 or 1: --check says; elsewhere the launch's watch \
     alone)";

/// The filter's architecture check, the one rule that kills: a call through another ABI
/// than the native one (i386's `int 0x80` on x86_64) would use other syscall numbers, which
/// the rows above do not name. On x86_64 the x32 numbers (bit 30 set, and ioctl's 514) get
/// the same rows.
pub const FOREIGN_ABI: &str = "any call through another architecture's ABI (i386 int 0x80) -> \
     kill the process: the rules are written for the native syscall numbers";

/// The Landlock scope, shown when the kernel has it (ABI 6+).
pub const LANDLOCK_SCOPE: &str = "no connect() to the host's abstract unix sockets (X11, D-Bus)";

impl Rule {
    /// The row as `--dry-run` prints it after `seccomp\t`.
    pub fn shown(&self) -> String {
        let arg = match &self.arg {
            Some(a) => format!(
                " with arg{} == {} (0x{:x}, low 32 bits)",
                a.index, a.name, a.value
            ),
            None => String::new(),
        };
        format!(
            "{}{arg} -> {}: {}",
            self.syscall, MATCH_ERRNO.1, self.reason
        )
    }
}

/// The `--dry-run` lines of the seccomp filter: one per row of [`SECCOMP`], then the
/// architecture check.
pub fn seccomp_lines() -> Vec<String> {
    SECCOMP
        .iter()
        .map(Rule::shown)
        .chain([FOREIGN_ABI.to_string()])
        .map(|l| format!("seccomp\t{l}"))
        .collect()
}

impl Notified {
    /// The row as `--dry-run` prints it after `notify\t`.
    pub fn shown(&self) -> String {
        let when = match &self.when {
            When::Always => String::new(),
            When::FlagSet { index, name, .. } => format!(" with {name} in arg{index}"),
        };
        format!("{}{when} -> file supervisor: {}", self.syscall, self.reason)
    }
}

/// The `--dry-run` lines of the file supervisor, when one guards `dirs`.
pub fn notify_lines(dirs: &[std::path::PathBuf], tops: &[std::path::PathBuf]) -> Vec<String> {
    if dirs.is_empty() {
        return Vec::new();
    }
    let mut out = vec![format!("supervisor\t{SUPERVISOR}")];
    for (names, dirs) in [(GUARDED_NAMES, dirs), (GUARDED_TOP_NAMES, tops)] {
        for (name, why) in names {
            for d in dirs {
                out.push(format!(
                    "supervisor\trefuse {}/{name}: {why}",
                    crate::policy::escape::shown(d.as_os_str())
                ));
            }
        }
    }
    out.extend(NOTIFIED.iter().map(|r| format!("notify\t{}", r.shown())));
    out
}
