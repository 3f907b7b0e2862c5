//! The launch path: gather inputs, plan, then (the only side effects) create state, mark
//! the project in use, run bwrap as a child and review the project when it ends.

use std::fs;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::cli::Cli;
use crate::config;
use crate::config::guard;
use crate::config::settings;
use crate::host;
use crate::host::project;
use crate::host::protect;
use crate::host::sources;
use crate::policy::agent::AgentId;
use crate::policy::claude_home::HostClaude;
use crate::policy::escape::Shown;
use crate::policy::facts::HostFacts;
use crate::policy::plan::{self, Command, Inputs, Plan};
use crate::policy::render;
use crate::policy::settings::ExtraKind;
use crate::proxy::netbridge;
use crate::state::claude_home;
use crate::state::codex_home;
use crate::state::inuse;
use crate::state::review;
use crate::state::sessions;
use crate::state::{self, StateHome};

/// Everything found on the host, and the plan made from it.
pub struct Prepared {
    pub inputs: Inputs,
    pub state_home: StateHome,
    pub plan: Plan,
}

/// `launching`: the launch itself (not `--dry-run`), which first does the exit review a
/// killed sandbox of the project missed: before the protected paths are probed, so that
/// what the review moves aside (a `.envrc` the dead agent made) is not planned as a mount.
pub fn prepare(cli: &Cli, launching: bool) -> Result<Prepared> {
    let cwd = host::current_dir()?;
    let (home, home_alias) = host::home::resolve(&host::home_dir()?, host::SYSTEM_PATHS);
    let project = project::discover(&cwd)?;
    refuse_dangerous_root(&project.work_tree, &home, cli.yes)?;
    let shared = guard::check_shared_dir(&project.work_tree, cli.yes)?;
    if let Some(w) = shared.warning(&project.work_tree) {
        eprintln!("claudebox: {w}");
    }
    guard::check_outside_git_dirs(&project, cli.yes)?;
    let command = if cli.exec {
        if cli.args.is_empty() {
            bail!("--exec needs a command to run, e.g. `claudebox --exec bash`");
        }
        Command::Exec(cli.args.clone())
    } else {
        Command::Claude(cli.args.clone())
    };
    let state_home = StateHome::from_env(&home)?;
    let state = state_home.project(&project.id());
    if launching {
        // The plan below mounts each work-tree entry that exists; the review moves aside
        // the entries a killed sandbox made (done again under the setup lock, for a
        // sibling killed in between).
        // Held: refused here as below. An unreadable record: the project reviewed whole
        // (the --rw paths the killed launch bound are in its record, when it is readable).
        let whole = review::Target::of(&project, &Default::default());
        if let Some(held) = review::missed(&state, Some(&whole), &mut std::io::stderr()).refusal() {
            return Err(held.into());
        }
    }
    let config_file = config::location(&home);
    let settings = settings::resolve(
        config::load(&config_file)?.as_ref(),
        &cli.request(),
        &crate::config::Context {
            home: &home,
            cwd: &cwd,
            project: &project,
            state_dir: &state_home.dir,
            conversations: &state.conversations(),
            config_file: &config_file,
            yes: cli.yes,
        },
    )?;
    // bwrap from no PATH entry a sandbox of this project writes (`find_bwrap_outside`):
    // the project, its outside git dirs, all of claudebox's state, ~/.claude, --rw paths.
    let bwrap = {
        let mut written = vec![project.work_tree.clone()];
        written.extend(project.outside_git_dirs());
        written.push(guard::canonical_lossy(&state_home.dir));
        written.push(guard::canonical_lossy(&home.join(".claude")));
        written.extend(
            settings
                .mounts
                .iter()
                .filter(|m| m.kind == ExtraKind::Rw)
                .map(|m| m.source.clone()),
        );
        host::find_bwrap_outside(&written)?
    };
    let agent = settings.agent.as_ref().map(|(a, _)| *a).unwrap_or_default();
    let claude = match (&command, agent) {
        (Command::Claude(_), AgentId::Claude) => Some(host::find_claude(&home)?),
        _ => host::find_claude(&home).ok(),
    };
    let codex = match (&command, agent) {
        (Command::Claude(_), AgentId::Codex) => Some(host::find_agent(agent.row(), &home)?),
        (_, AgentId::Codex) => host::find_agent(agent.row(), &home).ok(),
        _ => None,
    };
    if cli.session.is_some() && !agent.row().named_sessions {
        bail!(
            "--session does not work with --agent {agent} yet; run it without, or with \
             --agent claude"
        );
    }
    let session = match &cli.session {
        Some(name) => Some(sessions::prepare(
            &state,
            name,
            &project.cwd,
            &cli.args,
            agent,
        )?),
        None => None,
    };
    if let (Command::Claude(args), AgentId::Claude) = (&command, agent) {
        let all = settings
            .claude_args
            .iter()
            .flat_map(|c| &c.args)
            .chain(args);
        if let Some(w) = crate::policy::session::root_refusal(nix::unistd::geteuid().is_root(), all)
        {
            eprintln!("claudebox: {w}");
        }
    }
    // Refuses a forward on the proxy's port, or too many, before anything is made.
    let forwards = crate::policy::forward::in_mode(&settings.network, &settings.forward_ports)?;
    let base_url = std::env::var_os(crate::policy::base_url::VAR);
    if let Some(w) =
        crate::policy::base_url::in_force(&settings.env, base_url.as_deref()).and_then(|u| {
            crate::policy::base_url::unreachable_warning(&u, &settings.network, &forwards)
        })
    {
        eprintln!("claudebox: {w}");
    }
    if let crate::policy::network::NetworkMode::Allowlist(list) = &settings.network {
        for e in crate::policy::network::portless_loopback(list) {
            eprintln!(
                "claudebox: network: warning: --allow-host {e} names no port; loopback inside \
                 the sandbox is its own and clients send it past the proxy (NO_PROXY), so \
                 name the host's service with its port, e.g. --allow-host {e}:8080"
            );
        }
    }
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
    let codex_home = match agent {
        AgentId::Codex => crate::policy::codex_home::HostCodex::probe(&home),
        AgentId::Claude => crate::policy::codex_home::HostCodex {
            dir: home.join(".codex"),
            entries: Vec::new(),
        },
    };
    let mut visible = vec![project.work_tree.clone(), claude_home.dir.clone()];
    visible.extend(project.outside_git_dirs());
    let marketplaces = local_marketplaces(&home, &claude_home.dir, &visible);
    let gpu = match settings.gpu {
        Some(_) => host::gpu::probe(),
        None => Default::default(),
    };
    if settings.gpu.is_some() && gpu.devices().is_empty() {
        // Nothing is less protected without a GPU: say so and go on.
        eprintln!(
            "claudebox: gpu: warning: {}; the sandbox starts without a GPU",
            crate::policy::gpu::no_devices_line()
        );
    }
    let limits = crate::policy::limits::decide(&settings.limits, &host::limits::probe())?;
    let api_key =
        std::env::var_os(crate::policy::network::API_KEY_ENV).is_some_and(|v| !v.is_empty());
    // Claude pointed at another API (a gateway, the lab's mock): the broker serves
    // api.anthropic.com only, so it stays off by default and is refused when asked for.
    let base_url = custom_base_url(&settings);
    // The user's own apiKeyHelper (never the project's), which the broker runs on the
    // host, and an API key in the `env` block of the user's own settings.json, lent the
    // same way. With --writable-claude-setup the agent could write them: not lent then.
    let claude_home::SettingsKeys {
        api_key_helper,
        api_key: settings_api_key,
    } = if writable_claude_setup {
        claude_home::SettingsKeys::default()
    } else {
        claude_home::settings_keys(&claude_home, &project.work_tree)?
    };
    let login_broker = match settings.login_broker {
        Some((false, _)) => false,
        Some((true, ref at)) => {
            if agent != AgentId::Claude {
                bail!("--login-broker ({at}) keeps Claude Code's login outside; it does not serve --agent {agent} yet");
            }
            if let Some(url) = &base_url {
                bail!(
                    "--login-broker ({at}) serves api.anthropic.com only, and ANTHROPIC_BASE_URL \
                     points claude at {}; unset it, or use --no-login-broker",
                    crate::policy::escape::shown(url)
                );
            }
            if claude_home.credentials.is_none()
                && !api_key
                && api_key_helper.is_none()
                && settings_api_key.is_none()
            {
                bail!(
                    "--login-broker ({at}): no login to keep outside (no .credentials.json \
                     found, no ANTHROPIC_API_KEY set, no apiKeyHelper)"
                );
            }
            true
        }
        None => {
            agent == AgentId::Claude
                && base_url.is_none()
                && (claude_home.credentials.is_some()
                    || api_key
                    || api_key_helper.is_some()
                    || settings_api_key.is_some())
        }
    };
    let inputs = Inputs {
        login_broker,
        api_key,
        api_key_helper,
        settings_api_key,
        gpu,
        home_claude_json: home.join(".claude.json").symlink_metadata().is_ok(),
        home_alias,
        marketplaces,
        claude,
        agent,
        codex,
        codex_home,
        command,
        host: HostFacts::probe(),
        session,
        settings,
        claude_home,
        writable_claude_setup,
        protect_project_metadata,
        protected,
        unprotected_missing,
        host_sockets: shared.sockets,
        ipc_vars: host::ipc_vars_present(),
        preset_vars: plan::DEFAULT_ENV
            .iter()
            .filter(|(n, _, _)| std::env::var_os(n).is_some())
            .map(|(n, _, _)| n.into())
            .collect(),
        ssh_agent,
        landlock_abi: host::landlock_abi(),
        limits,
        log_denied: cli.log_denied,
        ..Inputs::new(
            project,
            home,
            state,
            bwrap,
            host::own_exe()?,
            host::random_id()?,
        )
    };
    let plan = plan::build(&inputs);
    host::check_path_lengths(
        plan.mounts
            .iter()
            .flat_map(|m| [Some(m.target.as_path()), m.source.as_deref()])
            .flatten()
            .chain([plan.cwd.as_path()]),
    )?;
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
        bail!(crate::policy::error::Fixable::new(
            "--ssh-agent: SSH_AUTH_SOCK is not set",
            "start an ssh agent (eval $(ssh-agent)) or drop --ssh-agent"
        ));
    };
    let path = std::path::PathBuf::from(sock);
    match fs::metadata(&path) {
        Ok(m) if m.file_type().is_socket() => Ok(fs::canonicalize(&path)?),
        _ => bail!(crate::policy::error::Fixable::new(
            format!(
                "--ssh-agent: SSH_AUTH_SOCK is {} but that is not a socket",
                path.shown()
            ),
            "check your ssh agent or drop --ssh-agent"
        )
        .at(&path)),
    }
}

/// Refuses a project that would bind `/`, the home directory or a parent of it read-write.
fn refuse_dangerous_root(work_tree: &Path, home: &Path, yes: bool) -> Result<()> {
    let home = fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
    if yes {
        return Ok(());
    }
    if work_tree == Path::new("/") || home.starts_with(work_tree) {
        bail!(crate::policy::error::Fixable::new(
            format!(
                "refusing to use {} as the project: it would bind {} read-write into the \
                 sandbox",
                work_tree.shown(),
                if work_tree == Path::new("/") {
                    "the whole file system"
                } else {
                    "your whole home directory"
                }
            ),
            "cd into a project directory, or pass --yes if you really mean it"
        )
        .at(work_tree));
    }
    Ok(())
}

/// Creates state and mount points, takes the in-use lock and execs bwrap. Returns only on
/// error.
pub fn exec(p: &Prepared) -> Result<std::convert::Infallible> {
    let inp = &p.inputs;
    state::check_writable(&p.state_home)?;
    // Ubuntu's AppArmor restriction: bwrap's own error names neither cause nor fix.
    if let Some(w) = host::apparmor::launch_warning(&inp.bwrap) {
        eprintln!("claudebox: {w}");
    }
    // This process (and the keeper forked from it) keeps the environment it was started
    // with, ANTHROPIC_API_KEY included, for the sandbox's life; bwrap, exec'd later with
    // the core limit given back, is dumpable again and never had it.
    let core_limit = match &p.plan.proxy {
        Some(s) if s.broker.is_some() => Some(
            host::companion::keep_out_of_dumps()
                .context("cannot keep claudebox out of core dumps (the login broker)")?,
        ),
        _ => None,
    };
    let proxy_fd = match &p.plan.proxy {
        // Before any lock is taken: the proxy must not inherit one, and its descriptor
        // for the sandbox goes on a fixed number.
        Some(spec) => Some(netbridge::start_proxy(spec, &outside(inp))?),
        None => None,
    };
    if p.plan.proxy.as_ref().is_some_and(|s| s.broker.is_some()) {
        // The proxy (started above) has inherited the credentials it lends; bwrap must
        // not: its first process's environment block is readable inside as /proc/1/environ,
        // whatever --unsetenv does later. Still one thread here (nothing started yet).
        for v in crate::policy::network::BROKER_UNSET_ENV {
            std::env::remove_var(v);
        }
    }
    // Creates the project's state and registers this sandbox as running on it.
    let in_use = inuse::mark(&p.state_home, &inp.state, &inp.project.root)?;
    let created = in_use.created;
    let err = exec_registered(p, in_use, proxy_fd, core_limit).unwrap_err();
    // A first launch that failed leaves no project directory behind.
    if created {
        state::remove_unused(&inp.state);
    }
    Err(err)
}

/// The rest of [`exec`], once registered; returns only on error (the slot is released).
/// bubblewrap's CVE-2026-87766 (`policy::bwrap_cve`): an unfixed bwrap makes a mount
/// point beneath a directory of the project by name, so another sandbox of the project,
/// running now, could swap that directory for a symlink while bwrap starts and have bwrap
/// make directories on the host. Refused then: only when the plan has such a mount point
/// (a nested repository or a submodule; the top's are beneath mount points) and another
/// sandbox of the project is registered as running (this launch is, already); the bwrap's
/// version is asked only then.
fn refuse_unfixed_bwrap(plan: &Plan, st: &crate::policy::layout::ProjectState) -> Result<()> {
    let Some((target, dir)) = crate::policy::bwrap_cve::swappable(&plan.mounts) else {
        return Ok(());
    };
    if inuse::count_running(&st.dir) < 2 {
        return Ok(());
    }
    let fix = crate::host::bwrap_cve::probe(&plan.bwrap);
    if fix.fixed() {
        return Ok(());
    }
    bail!(crate::policy::error::Fixable::new(
        format!(
            "{}; another sandbox of this project is running and could swap {} for a symlink \
             while bwrap makes the mount point {} beneath it, leading bwrap onto the host",
            fix.describe_short(),
            dir.shown(),
            target.shown()
        ),
        "refusing to start: end the other sandbox first, or install bubblewrap 0.12.0 or later"
    ))
}

fn exec_registered(
    p: &Prepared,
    in_use: inuse::InUse,
    proxy_fd: Option<i32>,
    core_limit: Option<host::companion::CoreLimit>,
) -> Result<std::convert::Infallible> {
    let inp = &p.inputs;
    // A sandbox of this project whose claudebox was killed left its review undone (done
    // also with --writable-project-config: that launch's opt-out is not the other's).
    // Held (what an earlier review could not look into or move aside is still there):
    // refused, naming it. A record that cannot be read: this project reviewed whole.
    let writable = crate::policy::review::writable_outside(&p.plan.mounts, &inp.project.work_tree);
    let whole = review::Target::of(&inp.project, &writable);
    if let Some(held) = review::missed(&inp.state, Some(&whole), &mut std::io::stderr()).refusal() {
        return Err(held.into());
    }

    // Sibling launches prepare the same files: one at a time, until the fds are open.
    let setup = inuse::setup_lock(&inp.state)?;
    // The empty file stands in for hidden files and for setup files the user has none of.
    state::ensure_empty_file(&inp.state)?;
    state::ensure_caches(&inp.state)?;
    if inp.agent == AgentId::Codex {
        state::ensure_empty_json(&inp.state)?;
    }
    let overlays = crate::policy::claude_home::overlays(
        &inp.home,
        &inp.claude_home,
        &inp.state,
        inp.writable_claude_setup,
    );
    claude_home::prepare_mount_points(&inp.home, &inp.claude_home, &inp.state, &overlays)?;
    let settings_copy = inp.state.user_settings();
    if overlays.iter().any(|o| {
        matches!(o, crate::policy::claude_home::Overlay::Bind { source, .. } if *source == settings_copy)
    }) {
        let host_file = inp.claude_home.dir.join(crate::policy::claude_home::SETTINGS);
        let on_host = inp
            .claude_home
            .entries
            .iter()
            .any(|(n, _)| n == crate::policy::claude_home::SETTINGS);
        state::refresh_user_settings(&inp.state, on_host.then_some(host_file.as_path()))?;
    }
    if let Some(b) = p.plan.proxy.as_ref().and_then(|x| x.broker.as_ref()) {
        if let Some(settings) = b.api_key_helper.as_ref().or(b.settings_api_key.as_ref()) {
            claude_home::write_broker_settings(settings, &inp.state, b.api_key_helper.is_some())?;
        }
    }
    claude_home::sync_config(&inp.claude_home, &inp.state, &inp.project)?;
    if inp.agent == AgentId::Codex {
        let overlays = crate::policy::codex_home::overlays(&inp.home, &inp.codex_home, &inp.state);
        for note in codex_home::prepare(&inp.home, &inp.codex_home, &inp.state, &overlays)? {
            eprintln!("claudebox: {note}");
        }
    }
    if inp.protect_project_metadata {
        if let Some(p) = inp
            .protected
            .iter()
            .find(|p| p.guard == crate::policy::protected::Guard::LocalSettings)
        {
            state::refresh_local_settings(&inp.state, &p.path)?;
        }
        if inp
            .protected
            .iter()
            .any(|p| p.guard == crate::policy::protected::Guard::GitIgnore)
        {
            state::ensure_claude_gitignore(&inp.state)?;
        }
    }
    // A named session is decided again under its own lock; replan if that changed it.
    let mut replanned = None;
    let mut replanned_session = None;
    let session = match &inp.session {
        Some(s) => {
            let claimed = sessions::claim(&inp.state, s, &inp.project.cwd, &inp.instance_id)?;
            replanned_session = Some(claimed.launch.clone());
            if claimed.launch != *s {
                replanned = Some(plan::build(&Inputs {
                    session: Some(claimed.launch.clone()),
                    ..inp.clone()
                }));
            }
            Some(claimed.lock)
        }
        // claude's own --resume/--continue may pick a named session's conversation.
        None => match &inp.command {
            Command::Claude(args) if inp.agent == AgentId::Claude => {
                // As claude gets them: the configured defaults, then the user's own.
                let all: Vec<std::ffi::OsString> = (inp.settings.claude_args.iter())
                    .flat_map(|d| d.args.iter().cloned())
                    .chain(args.iter().cloned())
                    .collect();
                sessions::guard_picked(&inp.state, &all, &inp.project.cwd, &inp.instance_id)?
            }
            Command::Claude(_) | Command::Exec(_) => None,
        },
    };
    let plan = replanned.as_ref().unwrap_or(&p.plan);
    refuse_unfixed_bwrap(plan, &inp.state)?;
    let signals_ignored_on_entry = !ignore_terminal_signals();
    let areas = writable_areas(inp);
    // Every bind source opened and checked now, and mounted by that descriptor.
    let mut opened = sources::open(plan, &areas)?;
    // What `--list`'s summary says stops holding once the sandbox starts (removed only
    // now: a launch that fails before changes nothing in the state).
    crate::state::inventory::forget_summary(&inp.state);
    drop(setup);
    // bwrap's stderr is the supervisor's pipe until the step inside says the sandbox is up
    // and puts this copy back on 2 (a terminal stays one for the agent).
    // (With no stderr open to copy, bwrap's goes where this one goes, unwatched.)
    let stderr_copy = match &plan.confine {
        Some(_) => std::io::stderr().as_fd().try_clone_to_owned().ok(),
        None => None,
    };
    // The exit review's record, locked for this process's life: if it is killed, the
    // project's next launch, `--list` or `--check` does the review it missed.
    let pending = if inp.protect_project_metadata {
        let writable =
            crate::policy::review::writable_outside(&plan.mounts, &inp.project.work_tree);
        let pending = review::begin(&inp.state, &inp.project, &inp.instance_id, &writable)?;
        pending.watch_commondir(&inp.state);
        Some(pending)
    } else {
        None
    };
    // Less a margin: file times come from a coarser clock than this one.
    let started = std::time::SystemTime::now() - std::time::Duration::from_millis(20);
    // Allowlist mode: where the denied log stood, to name this sandbox's denials at its end.
    let allowlist = plan.proxy.as_ref().is_some_and(|x| x.http_proxy && !x.open);
    let denied_mark = allowlist.then(|| state::denied::mark(&inp.state));
    let mut limits = None;
    let mut tries = 0;
    // The keeper keeps the commondir watch's inotify instance past this process's end.
    let mut held = false;
    let status = loop {
        tries += 1;
        let table = opened.table();
        let bwrap_argv = render::argv_with(
            plan,
            &render::Runtime {
                sources: render::Sources::Fds(&table),
                sync_fd: Some(in_use.fd()),
                proxy_fd: proxy_fd.unwrap_or(crate::policy::network::SANDBOX_NET_FD),
                signals_ignored_on_entry,
                stderr_fd: stderr_copy.as_ref().map(|f| f.as_raw_fd()),
            },
        );
        let sync = start_credentials_sync(inp, plan, &table);
        // Only claudebox's own descriptors cross into bwrap, none inherited from the shell.
        let mut keep = opened.fds();
        keep.push(in_use.fd());
        keep.extend(proxy_fd);
        keep.extend(stderr_copy.as_ref().map(|f| f.as_raw_fd()));
        // A named session's lock stays in this process, which outlives the sandbox (and
        // whose death ends it): the command never gets its descriptor.
        crate::host::fd::keep_only(&keep)?;
        if limits.is_none() {
            // The sandbox's limits: its own cgroup, entered by bwrap's process between fork
            // and exec (or the systemd-run prefix). Once, for every try.
            if let Some(w) = &plan.limits.warning {
                crate::host::limits::warn_once(&p.state_home.dir, ".limits-warned", w);
            }
            // A kernel without the file supervisor: the launch's watch alone keeps a
            // commondir out of the main git dir (said once; --check says it too).
            if plan
                .confine
                .as_ref()
                .is_some_and(|c| !c.guard_git_dirs.is_empty())
            {
                if let Err(why) = crate::inside::notify::available() {
                    crate::host::limits::warn_once(
                        &p.state_home.dir,
                        ".supervisor-warned",
                        &format!(
                            "warning: no file supervisor here ({why}): a commondir the agent \
                             plants in the project's git dir is moved aside within about a \
                             millisecond, and a git run on the host in that moment can read \
                             it (shown once; see claudebox --check)"
                        ),
                    );
                }
            }
            limits = Some(crate::host::limits::prepare(
                &plan.limits,
                &inp.instance_id,
                Vec::new(),
            )?);
        }
        let Some((prefix, limits)) = &limits else {
            bail!("the sandbox's limits were not prepared");
        };
        let argv: Vec<std::ffi::OsString> = prefix.iter().cloned().chain(bwrap_argv).collect();
        // A source the host replaced since it was opened (a host claude renames its new
        // `.credentials.json` over the old one) would fail bwrap's mount: opened again.
        let fresh = opened.replaced().is_empty();
        let ended = if !fresh && tries < HOST_RACE_TRIES {
            None
        } else {
            // claudebox stays bwrap's parent (`host::supervise`), for the review at the end.
            let bound_nofile = !crate::host::limits::nofile_bound_off();
            let pre_exec = || {
                if let Some(c) = core_limit {
                    c.restore()?;
                }
                if bound_nofile {
                    crate::host::limits::bound_nofile(crate::policy::limits::NOFILE_MAX)?;
                }
                limits.enter()
            };
            let hold = pending.as_ref().and_then(|_| review::commondir_watch_fd());
            match crate::host::supervise::run(&argv, &pre_exec, stderr_copy.is_some(), hold) {
                Ok((ended, holding)) => {
                    held = holding;
                    Some(ended)
                }
                Err(err) => {
                    let _ = limits.finish(&plan.limits);
                    if let Some(p) = pending {
                        p.cancel();
                    }
                    drop((in_use, session, opened));
                    return Err(err).with_context(|| format!("cannot run {}", argv[0].shown()));
                }
            }
        };
        use crate::host::supervise::Ended;
        match ended {
            Some(Ended::Ran(status)) => break status,
            Some(Ended::SetupFailed(status, text)) => match host_race(&text, &opened) {
                None => {
                    // A cause the kernel's settings explain (user namespaces off or used up,
                    // AppArmor's restriction, a container): one line with its fix, as
                    // --check says it; any other text unchanged.
                    match setup_cause(&text, &inp.bwrap) {
                        Some(line) => eprintln!("{line}"),
                        None => {
                            let _ = std::io::Write::write_all(&mut std::io::stderr(), &text);
                        }
                    }
                    break status;
                }
                Some(file) if tries >= HOST_RACE_TRIES => {
                    let _ = limits.finish(&plan.limits);
                    if let Some(p) = pending {
                        p.cancel();
                    }
                    drop((in_use, session, opened));
                    bail!(crate::policy::error::Fixable::new(
                        format!(
                            "{} was replaced on the host while the sandbox started, {tries} \
                             times (a claude running on the host rewrites it by renaming a \
                             new file over it)",
                            file.shown()
                        ),
                        "launch again once the host's claude is idle",
                    )
                    .at(&file));
                }
                Some(_) => {}
            },
            None => {}
        }
        // Again with every source opened anew (and the sync on the new descriptor).
        if let Some(mut child) = sync {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
        let setup = inuse::setup_lock(&inp.state)?;
        opened = sources::open(plan, &areas)?;
        drop(setup);
    };
    // The sandbox's descriptors go: nothing of it is open in here during the review.
    drop(opened);
    // The limit it hit, if any, named; its cgroup removed.
    let status = match limits.as_ref().and_then(|(_, e)| e.finish(&plan.limits)) {
        // systemd stopped the scope a limit hit ("Terminated"): the status names the limit.
        Some(code) => nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(0), code),
        None => status,
    };
    if let Some(p) = pending {
        p.finish(&inp.state, held, &mut std::io::stderr());
    }
    if let Some(m) = denied_mark {
        let denied = state::denied::since(&inp.state, m);
        if let Some(line) = state::denied::summary(&denied, &inp.state.denied_log()) {
            eprintln!("claudebox: {line}");
        }
    }
    // The Bypass Permissions answer given in this sandbox, kept for the next ones.
    if inp.agent == AgentId::Claude {
        state::keep_bypass_consent(&inp.state);
    }
    if let Some(common) = &inp.project.common_dir {
        for lost in crate::state::worktrees::lost(common, started) {
            eprintln!(
                "claudebox: the worktree {} made inside lived in the sandbox's scratch home and \
                 is gone; its entry stays in git (`git worktree prune` removes it): make \
                 worktrees inside the project",
                crate::policy::escape::shown(&lost)
            );
        }
    }
    // A Codex session's new thread: its id is Codex's, learnt now (the name's lock is
    // still held).
    if let (Some(launch), Some(_), AgentId::Codex) = (
        replanned_session.as_ref().or(inp.session.as_ref()),
        &session,
        inp.agent,
    ) {
        match sessions::learn_codex_thread(&inp.state, launch, started, &inp.project.cwd) {
            Ok(Some(line)) => eprintln!("claudebox: {line}"),
            Ok(None) => {}
            Err(e) => eprintln!("claudebox: session `{}`: {e:#}", launch.name),
        }
    }
    if let Some(line) = resume_line(inp, started) {
        eprintln!("claudebox: to resume this conversation: {line}");
    }
    // What `--list` shows of the project, while this was its last sandbox.
    crate::state::inventory::write_summary(&inp.state, in_use.fd());
    drop((in_use, session));
    crate::host::supervise::exit_as(status)
}

/// The command that resumes the conversation a claude launch used (claude's own
/// `claude --resume <uuid>` line names bare claude's conversations, which do not hold it):
/// a named session's name, else the UUID claude's options named, else the newest
/// transcript of the cwd's conversations written during the launch. None for `--exec`,
/// and when claude wrote no conversation (`--version`, `mcp list`).
fn resume_line(inp: &Inputs, started: std::time::SystemTime) -> Option<String> {
    let Command::Claude(args) = &inp.command else {
        return None;
    };
    if inp.agent != AgentId::Claude {
        return None;
    }
    if let Some(s) = &inp.session {
        // A checked name: letters, digits, `.`, `_`, `-`.
        return Some(format!("claudebox --session {}", s.name));
    }
    let all: Vec<std::ffi::OsString> = (inp.settings.claude_args.iter())
        .flat_map(|d| d.args.iter().cloned())
        .chain(args.iter().cloned())
        .collect();
    let pinned = match sessions::picked_by_args(&all) {
        Some(sessions::Picked::Uuid(u)) => Some(u),
        _ => None,
    };
    // A file name the agent could choose: only a UUID (hex digits and `-`) is printed.
    let uuid = crate::state::crossing::used_since(
        &inp.state.conversations(),
        &inp.project.cwd,
        started,
        pinned.as_deref(),
    )?;
    Some(format!("claudebox --resume {uuid}"))
}

/// How many times a launch opens its sources and starts bwrap when the host keeps
/// replacing one of them meanwhile. Under load a try is long, and a host renaming every
/// 50 ms wins most of them: beside tests/integration/host_renames.rs's loop at load 29
/// (20 busy loops), 5 tries lost 62 of 100 launches, 20 lost 8 (issue 35).
const HOST_RACE_TRIES: u32 = 20;

/// bwrap's setup failed because a source was replaced on the host after claudebox opened
/// it (bwrap 0.8 reaches a descriptor's file by its name: "Can't find source path
/// /proc/self/fd/N" once the name is gone, "Race condition binding dirfd" when another
/// file took it, "Can't bind mount SRC on DEST: Unable to find "DEST (deleted)" in mount
/// table" when it went just after the mount): that source, or where none is named the
/// first one replaced.
fn host_race(text: &[u8], opened: &sources::Opened) -> Option<std::path::PathBuf> {
    let named = race_in(&String::from_utf8_lossy(text))?.and_then(|fd| opened.source_of(fd));
    named
        .or(opened.replaced().first().copied())
        .map(Path::to_path_buf)
        .or_else(|| Some(std::path::PathBuf::from("a file mounted into the sandbox")))
}

/// The one line for a bwrap setup failure whose cause `host::diagnose` knows from the
/// kernel's settings (None: bwrap's own text is printed).
fn setup_cause(text: &[u8], bwrap: &Path) -> Option<String> {
    use crate::host::diagnose::{classify, Cause, Facts};
    let text = String::from_utf8_lossy(text);
    let dg = classify(&text, &Facts::probe(bwrap), false);
    let known = matches!(
        dg.cause,
        Cause::AppArmor
            | Cause::UsernsCloneOff
            | Cause::MaxUserNamespaces
            | Cause::NoUserNamespaces
            | Cause::Container
            | Cause::UnexpectedCapabilities
            | Cause::OldBwrap
    );
    let bwrap_said = text
        .lines()
        .rev()
        .find(|l| l.starts_with("bwrap:"))
        .map(|l| crate::policy::escape::shown(l.trim()))?;
    let said = if dg.text.contains(bwrap_said.trim_start_matches("bwrap: ")) {
        String::new()
    } else {
        format!(" ({bwrap_said})")
    };
    known.then(|| {
        format!(
            "claudebox: the sandbox cannot start: {}{said}; {}",
            dg.text, dg.fix
        )
    })
}

/// bwrap's text says a source was replaced under it: `Some`, with the descriptor it names
/// if it names one.
fn race_in(text: &str) -> Option<Option<i32>> {
    let named = text
        .split("Can't find source path /proc/self/fd/")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    let raced = text.contains("Race condition binding dirfd")
        || (text.contains("Can't bind mount ") && text.contains(" (deleted)\" in mount table"));
    (named.is_some() || raced).then_some(named)
}

/// The login's credentials bound as a single file: a host-side process keeps that inode
/// and the host's file in step for the sandbox's life (`state::credsync`). Not starting
/// it leaves the sandbox as it was before it existed: a warning, not a refusal.
fn start_credentials_sync(
    inp: &Inputs,
    plan: &plan::Plan,
    table: &[render::Bind],
) -> Option<std::process::Child> {
    use crate::policy::credsync;
    if std::env::var_os(credsync::DISABLE_ENV).is_some_and(|v| !v.is_empty()) {
        return None;
    }
    let (Some(i), Some(host)) = (credsync::bound_index(plan), &inp.claude_home.credentials) else {
        state::credsync::sweep_login_locks(&inp.state.login_dir());
        return None;
    };
    let Some(render::Bind::Fd(fd)) = table.get(i) else {
        return None;
    };
    // Every mount point of that source inside (the login directory's and ~/.claude's).
    let targets: Vec<_> = plan
        .mounts
        .iter()
        .filter(|m| m.kind == plan.mounts[i].kind && m.source == plan.mounts[i].source)
        .map(|m| m.target.clone())
        .collect();
    match state::credsync::start(
        *fd,
        host,
        &inp.instance_id,
        &inp.state.login_dir(),
        &targets,
        &outside(inp),
    ) {
        Ok((state::credsync::Watch::Inotify, child)) => Some(child),
        Ok((state::credsync::Watch::Polling(why), child)) => {
            eprintln!(
                "claudebox: {why}: the credentials sync looks at the login every {} s instead",
                credsync::POLL_INTERVAL.as_secs()
            );
            Some(child)
        }
        Err(e) => {
            eprintln!("claudebox: {e:#} (the sandbox will not see a refresh by the host)");
            state::credsync::sweep_login_locks(&inp.state.login_dir());
            None
        }
    }
}

/// How the host-side companions run outside every project (issue 34): in `/`, with no
/// variable of the launcher's environment pointing into a place the sandbox writes
/// ([`writable_areas`]; `policy::companion_env`).
fn outside(inp: &Inputs) -> host::companion::Outside {
    host::companion::Outside::new(&writable_areas(inp))
}

/// The directories a sandbox of this project can write (canonical): a bind source there,
/// or reached through there, must be exactly the path the plan names.
pub fn writable_areas(inp: &Inputs) -> Vec<std::path::PathBuf> {
    let mut areas = vec![inp.project.work_tree.clone()];
    areas.extend(inp.project.outside_git_dirs());
    areas.push(guard::canonical_lossy(&inp.home.join(".claude")));
    areas.push(guard::canonical_lossy(&inp.state.conversations()));
    // Written by every unbrokered claude sandbox of every project (its own file is bound
    // from there when the host has no login).
    areas.push(guard::canonical_lossy(&inp.state.login_dir()));
    if inp.agent == AgentId::Codex {
        areas.push(guard::canonical_lossy(&inp.state.codex_home()));
        areas.push(guard::canonical_lossy(&inp.state.codex_login_dir()));
    }
    for m in &inp.settings.mounts {
        if m.kind == ExtraKind::Rw {
            areas.push(m.source.clone());
        }
    }
    areas
}

/// Ignores SIGINT and SIGQUIT for claudebox and bwrap, which inherit the disposition (see
/// src/inside/confine.rs). Returns whether the agent should get the default back: not when
/// claudebox itself was started with SIGINT ignored (a background job of a shell), which
/// then stays ignored for the agent too.
fn ignore_terminal_signals() -> bool {
    use nix::sys::signal::{signal, SigHandler};
    let mut was_ignored = false;
    for sig in crate::inside::confine::TERMINAL_SIGNALS {
        // SAFETY: SIG_IGN installs no handler.
        let old = unsafe { signal(sig, SigHandler::SigIgn) };
        was_ignored |=
            sig == nix::sys::signal::Signal::SIGINT && matches!(old, Ok(SigHandler::SigIgn));
    }
    !was_ignored
}

/// The host's local-directory plugin marketplaces that may be bound read-only; one line
/// for each that may not (its plugins will not load inside), naming `--ro`.
/// `visible`: the project's directories and `~/.claude` (the host's, as probed).
fn local_marketplaces(
    home: &Path,
    claude_dir: &Path,
    visible: &[std::path::PathBuf],
) -> Vec<std::path::PathBuf> {
    // Renamed: `claude_home` in this module is `state::claude_home`.
    use crate::policy::claude_home as ch;
    let known = std::fs::read(claude_dir.join(ch::KNOWN_MARKETPLACES)).unwrap_or_default();
    let visible: Vec<&Path> = visible.iter().map(|v| v.as_path()).collect();
    let mut out = Vec::new();
    for dir in ch::local_marketplaces(&known) {
        // Canonical, so that the checks see where a symlink leads.
        let Ok(real) = std::fs::canonicalize(&dir) else {
            eprintln!(
                "claudebox: plugins: the local marketplace {} is missing on the host; its \
                 plugins will not load inside",
                crate::policy::escape::shown(&dir)
            );
            continue;
        };
        let manifest = real.join(".claude-plugin/marketplace.json").is_file();
        match ch::marketplace(&real, manifest, home, &visible) {
            ch::Marketplace::Bind => out.push(real),
            ch::Marketplace::Visible => {}
            ch::Marketplace::Refused(why) => eprintln!(
                "claudebox: plugins: the local marketplace {} is not bound ({why}): its \
                 plugins will not load inside; `--ro {}` brings it in",
                crate::policy::escape::shown(&dir),
                crate::policy::escape::shown(&dir)
            ),
        }
    }
    out
}

/// `ANTHROPIC_BASE_URL` as claude inside would get it (the config file's `env`, else
/// claudebox's environment), when it names another API than api.anthropic.com.
fn custom_base_url(settings: &crate::policy::settings::Settings) -> Option<std::ffi::OsString> {
    let name = "ANTHROPIC_BASE_URL";
    let value = settings
        .env
        .iter()
        .rev()
        .find(|e| e.name == name)
        .map(|e| e.value.clone())
        .or_else(|| std::env::var_os(name))?;
    let v = value.to_string_lossy();
    let v = v.trim().trim_end_matches('/');
    (!v.is_empty() && !v.eq_ignore_ascii_case("https://api.anthropic.com")).then_some(value)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bwrap_s_lines_for_a_replaced_source_are_recognised_and_no_others() {
        use super::race_in;
        let s = "bwrap: Can't find source path /proc/self/fd/17: No such file or directory\n";
        assert_eq!(race_in(s), Some(Some(17)));
        assert_eq!(
            race_in("bwrap: Race condition binding dirfd: Invalid argument\n"),
            Some(None)
        );
        let m = "bwrap: Can't bind mount /oldroot/h/c on /newroot/h/c: Unable to find \
                 \"/newroot/h/c (deleted)\" in mount table\n";
        assert_eq!(race_in(m), Some(None));
        for other in [
            "bwrap: Can't find source path /home/x: No such file or directory\n",
            "bwrap: Can't bind mount /oldroot/a on /newroot/a: Unable to find \"/newroot/a\" in \
             mount table\n",
            "bwrap: setting up uid map: Permission denied\n",
            "",
        ] {
            assert_eq!(race_in(other), None, "{other}");
        }
    }
}
