//! claudebox: run Claude Code inside a per-project bubblewrap sandbox.

mod check;
mod cli;
mod diagnose;
mod gc;
mod host;
mod inuse;
mod inventory;
mod launch;
mod list;
mod plan;
mod project;
mod render;
mod state;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse_from(host::args_os());
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("claudebox: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: &cli::Cli) -> anyhow::Result<ExitCode> {
    if cli.check {
        return check::run();
    }
    if cli.gc {
        return gc::run(cli.dry_run);
    }
    if cli.list {
        return list::run(cli.json);
    }
    let prepared = launch::prepare(cli)?;
    if cli.dry_run {
        let mut out = std::io::stdout().lock();
        out.write_all(&render::dry_run(&prepared.plan))?;
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    match launch::exec(&prepared)? {}
}
