//! claudebox's binary: picks its role once and calls into the library. The roles: the
//! step inside the sandbox (`--sandbox-init`), the allowlist's in-sandbox listener
//! (`--internal-listen`), and otherwise the launcher and maintenance command line.

use std::process::ExitCode;

use claudebox::{host, inside::confine, proxy::netbridge, run};

fn main() -> ExitCode {
    let args = host::args_os();
    if args.get(1).is_some_and(|a| a == confine::INIT_FLAG) {
        return confine::main(&args[2..]);
    }
    if let Some(code) = netbridge::internal(&args) {
        return code;
    }
    run::main(args)
}
