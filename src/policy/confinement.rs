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
];

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
