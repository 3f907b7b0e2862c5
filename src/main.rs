//! claudebox: run Claude Code inside a per-project bubblewrap sandbox.

mod cli;
mod host;
mod launch;
mod netbridge;
mod network;
mod plan;
mod project;
mod proxy;
mod render;
mod state;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = host::args_os();
    if let Some(code) = netbridge::internal(&args) {
        return code;
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
