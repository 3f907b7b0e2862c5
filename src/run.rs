//! The launcher's and maintenance commands' entry: parse the command line with clap and
//! run what it asks for.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{self, shell, Mode};
use crate::host::{self, project};
use crate::launch;
use crate::maintenance::{apparmor, check, gc, list};
use crate::policy::render;
use crate::state::{self, sessions};

/// The command line of the launcher (everything but the roles `main` picked before).
pub fn main(args: Vec<OsString>) -> ExitCode {
    if let Some(code) = shell::dispatch(&args) {
        return code;
    }
    let cli = match cli::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    if let Some(line) = cli::typo::near_miss(&args, &cli) {
        eprintln!("claudebox: {line}");
        return ExitCode::from(2);
    }
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            // One line: the causes joined by ": "; a `Fixable` among them prints as
            // "what; fix" from its fields (no one parses this text back).
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
    match cli.mode()? {
        Mode::Version => {
            println!("claudebox {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        Mode::Check => check::run(cli.gpu),
        Mode::AppArmorProfile => apparmor::print_profile(),
        Mode::Gc { dry_run, margin } => gc::run(dry_run, margin),
        Mode::List {
            json,
            margin,
            sizes,
        } => list::run(json, margin, sizes),
        Mode::Forget { name, dry_run } => forget(name, dry_run),
        Mode::Cross { way, uuid } => cross(way, uuid),
        Mode::Restore(id) => {
            let home = host::home_dir()?;
            let to = state::review::restore(&state::StateHome::from_env(&home)?, id)?;
            eprintln!(
                "claudebox: restored {}",
                crate::policy::escape::Shown::shown(&to)
            );
            Ok(ExitCode::SUCCESS)
        }
        Mode::Launch { dry_run: true } => {
            let prepared = launch::prepare(cli, false)?;
            if let Some(s) = &prepared.inputs.session {
                let (state, cwd) = (&prepared.inputs.state, &prepared.inputs.project.cwd);
                eprintln!("claudebox: {}", sessions::dry_run_note(state, s, cwd));
            }
            let mut out = std::io::stdout().lock();
            out.write_all(&render::dry_run(&prepared.plan))?;
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        Mode::Launch { dry_run: false } => match launch::exec(&launch::prepare(cli, true)?)? {},
    }
}

/// `--forget NAME`: run and exit without a sandbox.
fn forget(name: &OsStr, dry_run: bool) -> anyhow::Result<ExitCode> {
    let home = host::home_dir()?;
    let state_home = state::StateHome::from_env(&home)?;
    let project = project::discover(&host::current_dir()?)?;
    let state = state_home.project(&project.id());
    eprintln!("claudebox: {}", sessions::forget(&state, name, dry_run)?);
    Ok(ExitCode::SUCCESS)
}

/// `--import-conversation`, `--export-conversation`: copy one conversation of the current
/// directory between bare claude and the project's state, without a sandbox.
fn cross(way: state::crossing::Way, uuid: Option<&str>) -> anyhow::Result<ExitCode> {
    let (home, _) = host::home::resolve(&host::home_dir()?, host::SYSTEM_PATHS);
    let state_home = state::StateHome::from_env(&home)?;
    let project = project::discover(&host::current_dir()?)?;
    let st = state_home.project(&project.id());
    // Registered as a launch for the copy's length: --gc leaves the project alone, and
    // an import into a project never launched makes its state.
    let in_use = state::inuse::mark(&state_home, &st, &project.root)?;
    // The copy changes what `--list`'s summary says.
    crate::state::inventory::forget_summary(&st);
    let host_projects = crate::policy::claude_home::HostClaude::probe(&home)
        .dir
        .join("projects");
    let crossed =
        state::crossing::copy(way, &host_projects, &st.conversations(), &project.cwd, uuid);
    let created = in_use.created;
    drop(in_use);
    let crossed = match crossed {
        Ok(c) => c,
        Err(e) => {
            if created {
                state::remove_unused(&st);
            }
            return Err(e);
        }
    };
    eprintln!("claudebox: {}", state::crossing::summary(way, &crossed));
    Ok(ExitCode::SUCCESS)
}
