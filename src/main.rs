//! claudebox: run Claude Code inside a per-project bubblewrap sandbox.

mod cli;
mod confine;
mod host;
mod ipc;
mod launch;
mod plan;
mod project;
mod protect;
mod render;
mod state;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = host::args_os();
    if args.get(1).is_some_and(|a| a == confine::INIT_FLAG) {
        return confine::main(&args[2..]);
    }
    let cli = cli::Cli::parse_from(args);
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("claudebox: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: &cli::Cli) -> anyhow::Result<ExitCode> {
    let prepared = launch::prepare(cli)?;
    if cli.dry_run {
        let mut out = std::io::stdout().lock();
        out.write_all(&render::dry_run(&prepared.plan))?;
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    match launch::exec(&prepared)? {}
}
