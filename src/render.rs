//! The one renderer from a [`Plan`] to bwrap's argv, used both to exec and to print
//! (`--dry-run`), plus the human-readable mount table and the shell-quoted command line.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use shell_quote::Sh;

use crate::network;
use crate::plan::{EnvOp, MountKind, Plan};

/// bwrap's full argv, program first.
pub fn argv(plan: &Plan) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec![plan.bwrap.clone().into_os_string()];
    for f in &plan.flags {
        a.push(f.into());
    }
    for m in &plan.mounts {
        let flag = match m.kind {
            MountKind::Ro => "--ro-bind",
            MountKind::RoTry => "--ro-bind-try",
            MountKind::Rw | MountKind::File => "--bind",
            MountKind::Tmpfs => "--tmpfs",
            MountKind::Symlink => "--symlink",
            MountKind::Dev => "--dev",
            MountKind::Proc => "--proc",
        };
        a.push(flag.into());
        if let Some(src) = &m.source {
            a.push(src.clone().into_os_string());
        }
        a.push(m.target.clone().into_os_string());
    }
    for e in &plan.env {
        match e {
            EnvOp::Set(k, v) => {
                a.push("--setenv".into());
                a.push(k.clone());
                a.push(v.clone());
            }
            EnvOp::Unset(k) => {
                a.push("--unsetenv".into());
                a.push(k.clone());
            }
        }
    }
    a.push("--chdir".into());
    a.push(plan.cwd.clone().into_os_string());
    a.push("--".into());
    a.extend(plan.argv.iter().cloned());
    a
}

/// The argv as one line of `sh` input that performs the same launch.
pub fn shell_line(argv: &[OsString]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, arg) in argv.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        let bytes = arg.as_bytes();
        if !bytes.is_empty() && bytes.iter().all(|b| is_plain(*b)) {
            out.extend_from_slice(bytes);
        } else {
            Sh::quote_into_vec(arg.as_os_str(), &mut out);
        }
    }
    out
}

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b)
}

/// The mount table, one row per mount in the order bwrap applies them.
pub fn mount_table(plan: &Plan) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"# mounts, in the order bwrap applies them (later wins)\n");
    out.extend_from_slice(b"# kind\tsource\ttarget\twhy\n");
    for m in &plan.mounts {
        out.extend_from_slice(m.kind.to_string().as_bytes());
        out.push(b'\t');
        match &m.source {
            Some(s) => out.extend_from_slice(&escape_bytes(s.as_os_str().as_bytes())),
            None => out.push(b'-'),
        }
        out.push(b'\t');
        out.extend_from_slice(&escape_bytes(m.target.as_os_str().as_bytes()));
        out.push(b'\t');
        out.extend_from_slice(m.why.as_bytes());
        out.push(b'\n');
    }
    out
}

/// One table cell: tabs, newlines and non-UTF-8 bytes shown as escapes so a row stays
/// one line.
fn escape_bytes(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\t' => out.extend_from_slice(b"\\t"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\\' => out.extend_from_slice(b"\\\\"),
                c if c.is_control() => {
                    out.extend_from_slice(format!("\\x{:02x}", c as u32).as_bytes())
                }
                c => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        for b in chunk.invalid() {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        }
    }
    out
}

/// The full `--dry-run` output: the mount table, the environment changes, the command.
pub fn dry_run(plan: &Plan) -> Vec<u8> {
    let mut out = mount_table(plan);
    out.extend_from_slice(b"# environment: the host's, plus\n");
    for e in &plan.env {
        match e {
            EnvOp::Set(k, v) => {
                out.extend_from_slice(b"set\t");
                out.extend_from_slice(&escape_bytes(k.as_bytes()));
                out.push(b'=');
                out.extend_from_slice(&escape_bytes(v.as_bytes()));
            }
            EnvOp::Unset(k) => {
                out.extend_from_slice(b"unset\t");
                out.extend_from_slice(&escape_bytes(k.as_bytes()));
            }
        }
        out.push(b'\n');
    }
    out.extend_from_slice(format!("# network: {}\n", network::describe(&plan.network)).as_bytes());
    if let Some(proxy) = &plan.proxy {
        for e in &proxy.allowlist.entries {
            out.extend_from_slice(format!("allow\t{}\t{}\n", e.pattern, e.source).as_bytes());
        }
        out.extend_from_slice(b"# proxy: started on the host by claudebox for the life of the sandbox; the sandbox's first program hands it 127.0.0.1:3128 over descriptor 3 (run alone, the command below fails closed); denied hosts go to ");
        out.extend_from_slice(&escape_bytes(proxy.denied_log.as_os_str().as_bytes()));
        out.push(b'\n');
    }
    out.extend_from_slice(b"# command\n");
    out.extend_from_slice(&shell_line(&argv(plan)));
    out.push(b'\n');
    out
}
