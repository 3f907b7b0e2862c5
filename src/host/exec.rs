//! Replacing this process with another program: bwrap (the launch), then inside the
//! sandbox the agent (after the seccomp/Landlock step or the proxy port).

use std::ffi::{CString, OsStr};
use std::io;
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
}
