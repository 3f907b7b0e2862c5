//! The launcher's and maintenance commands' entry: parse the command line with clap and
//! run what it asks for.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{self, shell};
use crate::host::{self, project};
use crate::launch;
use crate::maintenance::{check, gc, list};
use crate::policy::render;
use crate::state::{self, sessions};

/// The command line of the launcher (everything but the roles `main` picked before).
pub fn main(args: Vec<OsString>) -> ExitCode {
    if let Some(code) = shell::dispatch(&args) {
        return code;
    }
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("claudebox: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// `--help` prints as clap prints it; a usage error becomes one line on stderr.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let text = e.render().to_string();
    // The error itself is the first paragraph (a conflict lists its other side below it).
    let first: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let first = first.join(" ");
    let first = first.strip_prefix("error: ").unwrap_or(&first);
    eprintln!("claudebox: {first} (see claudebox --help)");
    ExitCode::from(2)
}

fn run(cli: &cli::Cli) -> anyhow::Result<ExitCode> {
    if cli.claudebox_version {
        println!("claudebox {}", env!("CARGO_PKG_VERSION"));
        return Ok(ExitCode::SUCCESS);
    }
    if cli.check {
        return check::run();
    }
    if cli.gc_margin.is_some() && !cli.gc && !cli.list {
        anyhow::bail!("--gc-margin goes with --gc or --list (see claudebox --help)");
    }
    if cli.gc {
        return gc::run(cli.dry_run, cli.gc_margin.as_deref());
    }
    if cli.list {
        return list::run(cli.json, cli.gc_margin.as_deref());
    }
    if cli.forget.is_some() {
        return session_command(cli);
    }
    let prepared = launch::prepare(cli)?;
    if cli.dry_run {
        if let Some(s) = &prepared.inputs.session {
            let (state, cwd) = (&prepared.inputs.state, &prepared.inputs.project.cwd);
            eprintln!("claudebox: {}", sessions::dry_run_note(state, s, cwd));
        }
        let mut out = std::io::stdout().lock();
        out.write_all(&render::dry_run(&prepared.plan))?;
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    match launch::exec(&prepared)? {}
}

/// `--forget NAME`: run and exit without a sandbox.
fn session_command(cli: &cli::Cli) -> anyhow::Result<ExitCode> {
    let home = host::home_dir()?;
    let state_home = state::StateHome::from_env(&home);
    if let Some(name) = &cli.forget {
        let project = project::discover(&host::current_dir()?)?;
        let state = state_home.project(&project.id());
        eprintln!(
            "claudebox: {}",
            sessions::forget(&state, name, cli.dry_run)?
        );
    }
    Ok(ExitCode::SUCCESS)
}
