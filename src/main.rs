//! claudebox's binary: picks its role once and calls into the library. The roles: the one
//! step inside the sandbox (`--sandbox-init`), the allowlist's proxy on the host
//! (`--internal-proxy`), the credentials sync on the host (`--internal-credentials-sync`),
//! and otherwise the launcher and maintenance command line. The three hidden roles have
//! their own parsers and are no part of the user's `--help` (docs/reference.md lists them).

use std::process::ExitCode;

use claudebox::policy::credsync::INTERNAL_CREDENTIALS_SYNC;
use claudebox::{host, inside::confine, policy::network::INTERNAL_PROXY, proxy::netbridge, run};

fn main() -> ExitCode {
    let args = host::args_os();
    match args.get(1) {
        Some(a) if a == claudebox::policy::confinement::INIT_FLAG => confine::main(&args[2..]),
        Some(a) if a == INTERNAL_PROXY => netbridge::main(&args[2..]),
        Some(a) if a == INTERNAL_CREDENTIALS_SYNC => claudebox::state::credsync::main(&args[2..]),
        _ => run::main(args),
    }
}
