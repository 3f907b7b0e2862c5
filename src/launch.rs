//! The launch path: gather inputs, plan, then (the only side effects) create state, mark
//! the project in use and exec bwrap.

use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::claude_home::{self, HostClaude};
use crate::cli::Cli;
use crate::config;
use crate::guard;
use crate::host::{self, HostFacts};
use crate::inuse;
use crate::netbridge;
use crate::plan::{self, Command, Inputs, Plan};
use crate::project;
use crate::render;
use crate::sessions;
use crate::settings;
use crate::state::{self, StateHome};
use crate::{ipc, protect};

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
    guard::check_outside_git_dirs(&project, cli.yes)?;
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
    let state_home = StateHome::from_env(&home);
    let state = state_home.project(&project.id());
    let session = match &cli.session {
        Some(name) => Some(sessions::prepare(&state, name, &project.cwd, &cli.args)?),
        None => None,
    };
    let config_file = config::location(&home);
    let settings = settings::resolve(
        config::load(&config_file)?.as_ref(),
        &cli.request(),
        &settings::Context {
            home: &home,
            cwd: &cwd,
            project: &project,
            state_dir: &state_home.dir,
            conversations: &state.conversations(),
            config_file: &config_file,
            yes: cli.yes,
        },
    )?;
    let protect_project_metadata = settings.writable_project_config.is_none();
    let writable_claude_setup = settings.writable_claude_setup.is_some();
    let (protected, unprotected_missing) = if protect_project_metadata {
        let protected = protect::probe(&project, &home)?;
        let missing = protect::missing_work_tree_entries(&project, &protected);
        (protected, missing)
    } else {
        (Vec::new(), Vec::new())
    };
    let ssh_agent = if settings.ssh_agent.is_some() {
        Some(ssh_agent_socket()?)
    } else {
        None
    };
    let claude_home = HostClaude::probe(&home);
    let inputs = Inputs {
        project,
        home,
        state,
        claude,
        command,
        instance_id: host::random_id()?,
        host: HostFacts::probe(),
        bwrap,
        session,
        settings,
        claude_home,
        writable_claude_setup,
        protect_project_metadata,
        protected,
        unprotected_missing,
        ipc_vars: ipc::present(),
        ssh_agent,
        own_exe: host::own_exe()?,
        landlock_abi: host::landlock_abi(),
        log_denied: cli.log_denied,
    };
    let plan = plan::build(&inputs);
    Ok(Prepared {
        inputs,
        state_home,
        plan,
    })
}

/// `--ssh-agent`: the socket `$SSH_AUTH_SOCK` names, which must exist and be a socket.
fn ssh_agent_socket() -> Result<std::path::PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let Some(sock) = std::env::var_os("SSH_AUTH_SOCK").filter(|s| !s.is_empty()) else {
        bail!("--ssh-agent: SSH_AUTH_SOCK is not set; start an ssh agent (eval $(ssh-agent)) or drop --ssh-agent");
    };
    let path = std::path::PathBuf::from(sock);
    match fs::metadata(&path) {
        Ok(m) if m.file_type().is_socket() => Ok(fs::canonicalize(&path)?),
        _ => bail!(
            "--ssh-agent: SSH_AUTH_SOCK is {} but that is not a socket; check your ssh agent or drop --ssh-agent",
            path.display()
        ),
    }
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
    if let Some(spec) = &p.plan.proxy {
        // Before any lock is taken: the proxy must not inherit one, and its descriptor
        // for the sandbox goes on a fixed number.
        netbridge::start_proxy(spec)?;
    }
    // Creates the project's state and registers this sandbox as running on it.
    let in_use = inuse::mark(&p.state_home, &inp.state, &inp.project.root)?;
    // The empty file stands in for hidden files and for setup files the user has none of.
    state::ensure_empty_file(&inp.state)?;
    let overlays = claude_home::overlays(
        &inp.home,
        &inp.claude_home,
        &inp.state,
        inp.writable_claude_setup,
    );
    claude_home::prepare_mount_points(&inp.home, &inp.state, &overlays)?;
    claude_home::sync_config(&inp.claude_home, &inp.state, &inp.project)?;
    // A named session is decided again under its own lock; replan if that changed it.
    let mut plan = p.plan.clone();
    let session = match &inp.session {
        Some(s) => {
            let claimed = sessions::claim(&inp.state, s, &inp.project.cwd, &inp.instance_id)?;
            if claimed.launch != *s {
                plan = plan::build(&Inputs {
                    session: Some(claimed.launch.clone()),
                    ..inp.clone()
                });
            }
            Some(claimed.lock)
        }
        None => None,
    };
    plan.sync_fd = Some(in_use.fd());
    let argv = render::argv(&plan);
    let err = crate::exec::replace_with(&argv);
    drop((in_use, session));
    Err(err).with_context(|| format!("cannot run {}", argv[0].to_string_lossy()))
}
