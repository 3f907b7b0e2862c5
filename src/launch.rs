//! The launch path: gather inputs, plan, then (the only side effects) create state, mark
//! the project in use and exec bwrap.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use nix::fcntl::{fcntl, FcntlArg, FdFlag, Flock, FlockArg};

use crate::cli::Cli;
use crate::host::{self, HostFacts};
use crate::netbridge;
use crate::network::{self, NetworkMode};
use crate::plan::{self, Command, Inputs, Plan};
use crate::project;
use crate::render;
use crate::state::{self, ProjectState, StateHome};

/// Everything found on the host, and the plan made from it.
pub struct Prepared {
    pub inputs: Inputs,
    pub state_home: StateHome,
    pub plan: Plan,
}

pub fn prepare(cli: &Cli) -> Result<Prepared> {
    let cwd = host::current_dir()?;
    let home = host::home_dir()?;
    let project = project::discover(&cwd)?;
    refuse_dangerous_root(&project.work_tree, &home, cli.yes)?;
    let bwrap = host::find_bwrap()?;
    let command = if cli.exec {
        if cli.args.is_empty() {
            bail!("--exec needs a command to run, e.g. `claudebox --exec bash`");
        }
        Command::Exec(cli.args.clone())
    } else {
        Command::Claude(cli.args.clone())
    };
    let claude = match &command {
        Command::Claude(_) => Some(host::find_claude(&home)?),
        Command::Exec(_) => host::find_claude(&home).ok(),
    };
    // Integration point for the config file: its layers (global, then the project's
    // section) go before the command line's.
    let network = network::resolve(&[cli.network_choice()])?;
    let self_exe = match network {
        NetworkMode::Allowlist(_) => {
            Some(std::env::current_exe().context("cannot find claudebox's own executable")?)
        }
        _ => None,
    };
    let state_home = StateHome::from_env(&home);
    let state = state_home.project(&project.id());
    let inputs = Inputs {
        project,
        home,
        state,
        claude,
        command,
        instance_id: host::random_id()?,
        host: HostFacts::probe(),
        bwrap,
        network,
        self_exe,
        log_denied: cli.log_denied,
    };
    let plan = plan::build(&inputs);
    Ok(Prepared {
        inputs,
        state_home,
        plan,
    })
}

/// Refuses a project that would bind `/`, the home directory or a parent of it read-write.
fn refuse_dangerous_root(work_tree: &Path, home: &Path, yes: bool) -> Result<()> {
    let home = fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
    if yes {
        return Ok(());
    }
    if work_tree == Path::new("/") || home.starts_with(work_tree) {
        bail!(
            "refusing to use {} as the project: it would bind {} read-write into the sandbox; \
             cd into a project directory, or pass --yes if you really mean it",
            work_tree.display(),
            if work_tree == Path::new("/") {
                "the whole file system"
            } else {
                "your whole home directory"
            }
        );
    }
    Ok(())
}

/// Creates state and mount points, takes the in-use lock and execs bwrap. Returns only on
/// error.
pub fn exec(p: &Prepared) -> Result<std::convert::Infallible> {
    let inp = &p.inputs;
    state::check_writable(&p.state_home)?;
    state::ensure_project_dir(&p.state_home, &inp.state, &inp.project.root)?;
    ensure_claude_mount_points(&inp.home)?;
    if let Some(spec) = &p.plan.proxy {
        // Before the lock: the proxy must not hold it, and its descriptor for the
        // sandbox goes on a fixed number.
        netbridge::start_proxy(spec)?;
    }
    let lock = hold_in_use(&inp.state)?;
    let argv = render::argv(&p.plan);
    let err = std::process::Command::new(&argv[0]).args(&argv[1..]).exec();
    drop(lock);
    Err(err).with_context(|| format!("cannot run {}", argv[0].to_string_lossy()))
}

/// Makes sure the mount points bwrap needs exist on the host, so bwrap does not create
/// them itself: `~/.claude` and the entries overlaid on it, and `~/.claude.json`.
fn ensure_claude_mount_points(home: &Path) -> Result<()> {
    let claude = home.join(".claude");
    let mut b = fs::DirBuilder::new();
    b.mode(0o700).recursive(true);
    for d in [
        claude.clone(),
        claude.join("projects"),
        claude.join("sessions"),
    ] {
        b.create(&d)
            .with_context(|| format!("cannot create {}", d.display()))?;
    }
    create_if_missing(&claude.join("history.jsonl"), b"")?;
    create_if_missing(&home.join(".claude.json"), b"{}\n")?;
    Ok(())
}

fn create_if_missing(path: &Path, content: &[u8]) -> Result<()> {
    if fs::metadata(path).is_ok() {
        return Ok(());
    }
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => f
            .write_all(content)
            .with_context(|| format!("cannot write {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
    }
}

/// Opens the project's lock file with a shared flock that bwrap (and so the sandbox)
/// inherits through exec: the project counts as in use until the last process of the
/// sandbox exits.
fn hold_in_use(state: &ProjectState) -> Result<Flock<fs::File>> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(state.lock())
        .with_context(|| format!("cannot open {}", state.lock().display()))?;
    // std opens files with O_CLOEXEC; clear it so the lock lives as long as the sandbox.
    fcntl(f.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))?;
    // Blocks only while `--gc` is deciding about this very directory.
    Flock::lock(f, FlockArg::LockShared)
        .map_err(|(_, e)| e)
        .with_context(|| format!("cannot lock {}", state.lock().display()))
}
