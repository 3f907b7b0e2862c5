//! The process entry point, in place of std's start-up code.
//!
//! Before `main`, std reads `/proc/self/maps` to place a stack-overflow guard, sets up an
//! alternate signal stack and names the main thread: about 100,000 instructions and a
//! dozen system calls, a tenth of a millisecond on every launch (BENCHMARKS.md), and
//! claudebox starts more than once per launch. It needs none of that: it does not
//! recurse deeply, and a stack overflow still stops the process (SIGSEGV, without std's
//! message). What std does that matters is kept: SIGPIPE is ignored, so a write to a
//! closed pipe or socket (the proxy) is an error rather than death; std's `Command` puts
//! it back to the default for every program it runs, bwrap included.
//! `std::env::args_os` works as before: glibc hands the arguments to std's initialiser.

use std::io::Write;
use std::os::raw::{c_char, c_int};
use std::process::ExitCode;

use nix::sys::signal::{signal, SigHandler, Signal};

#[no_mangle]
extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    // SAFETY: no handler is installed; SIG_IGN is what std's own start-up sets here.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
    // A panic must not unwind into C; report it as std would, with status 101.
    let code = std::panic::catch_unwind(crate::main).unwrap_or(ExitCode::from(101));
    // std flushes stdout after `main` returns; nothing else does here.
    let _ = std::io::stdout().flush();
    // `ExitCode` has no stable accessor for its value; it compares equal to its `u8`.
    (0..=u8::MAX)
        .find(|&n| ExitCode::from(n) == code)
        .map_or(1, c_int::from)
}
