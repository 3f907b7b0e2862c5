//! Replacing this process with another program: bwrap (the launch), then inside the
//! sandbox the agent (after the seccomp/Landlock step or the proxy port); and running a
//! short host command with a time limit (`--check`'s probes, `systemctl`).

use std::ffi::{CString, OsStr};
use std::io;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use std::os::unix::ffi::OsStrExt;

use nix::sys::signal::{signal, SigHandler, Signal};

/// Runs `argv[0]` (looked up on PATH when it holds no `/`) with `argv` in place of this
/// process, in this process's environment. Returns only when that fails.
///
/// What std's `Command::exec` does that matters is kept: SIGPIPE, which std's start-up
/// ignores in claudebox, is back at its default for the program. What it does besides costs a
/// launch: a copy of every argument into a list of its own, and a look at the
/// environment, for bwrap's hundred-odd arguments.
pub fn replace_with<S: AsRef<OsStr>>(argv: &[S]) -> io::Error {
    let mut args = Vec::with_capacity(argv.len());
    for a in argv {
        match CString::new(a.as_ref().as_bytes()) {
            Ok(c) => args.push(c),
            Err(_) => {
                return io::Error::new(io::ErrorKind::InvalidInput, "an argument holds a NUL byte")
            }
        }
    }
    let Some(program) = args.first() else {
        return io::Error::new(io::ErrorKind::InvalidInput, "no program to run");
    };
    // SAFETY: SIG_DFL installs no handler.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    match nix::unistd::execvp(program, &args) {
        Err(e) => e.into(),
        Ok(never) => match never {},
    }
}

/// How much of each of its outputs (stdout, stderr) [`run_with_timeout`] reads from a
/// command: the rest is not read, and the command's next write past it fails (EPIPE). The
/// commands it runs print a line or a key.
pub const MAX_OUTPUT: u64 = 64 * 1024;

/// What a command run by [`run_with_timeout`] did: `status` is None when it was killed
/// at the time limit (its output is then not waited for).
pub struct Ran {
    pub status: Option<std::process::ExitStatus>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Ran {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs a command with stdin closed, collecting its output (up to [`MAX_OUTPUT`] of each);
/// kills it after `limit`. Runs in `/` unless the caller chose a directory: never in the
/// project the user started claudebox in (`policy::companion_env`).
pub fn run_with_timeout(cmd: &mut std::process::Command, limit: Duration) -> anyhow::Result<Ran> {
    if cmd.get_current_dir().is_none() && !super::companion::in_launchers_dir() {
        cmd.current_dir(crate::policy::companion_env::WORKDIR);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", cmd.get_program().to_string_lossy()))?;
    let reader = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(r) = r {
                let _ = r.take(MAX_OUTPUT).read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if status.is_none() {
        // Its output may be held open by a grandchild: do not wait for it.
        return Ok(Ran {
            status,
            stdout: Vec::new(),
            stderr: Vec::new(),
        });
    }
    Ok(Ran {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_exec_cannot_take_and_reports_a_missing_program() {
        let nul = replace_with(&["a\0b"]);
        assert_eq!(nul.kind(), io::ErrorKind::InvalidInput);
        let none = replace_with::<&str>(&[]);
        assert_eq!(none.kind(), io::ErrorKind::InvalidInput);
        let missing = replace_with(&["/nonexistent/claudebox-test-program"]);
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    /// A command that prints without end gets MAX_OUTPUT of each output read and ends
    /// (its next write fails); its status and its capped output come back.
    #[test]
    fn a_command_printing_without_end_is_read_up_to_the_cap() {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", "yes out & yes err >&2; wait"]);
        let ran = run_with_timeout(&mut cmd, Duration::from_secs(20)).unwrap();
        assert!(ran.status.is_some(), "killed at the time limit");
        assert_eq!(ran.stdout.len() as u64, MAX_OUTPUT);
        assert_eq!(ran.stderr.len() as u64, MAX_OUTPUT);
        assert!(ran.stdout.starts_with(b"out\n") && ran.stderr.starts_with(b"err\n"));
    }
}
