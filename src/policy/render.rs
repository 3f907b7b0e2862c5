//! The one renderer from a [`Plan`] to bwrap's argv, used both to exec and to print
//! (`--dry-run`), plus the human-readable mount table and the shell-quoted command line.

mod summary;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use crate::policy::escape::{escape_bytes, shell_line, shown};

use crate::policy::confinement;
use crate::policy::mount::MountKind;
use crate::policy::network::{self, ProxySpec};
use crate::policy::plan::{EnvOp, Plan};

/// How one plan mount's source reaches bwrap at the launch (see `sources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// Not a bind mount (tmpfs, symlink, dev, proc, empty-ro).
    Other,
    /// An optional source that does not exist: left out.
    Skip,
    /// Bound from this descriptor, opened and checked by the launch.
    Fd(i32),
}

/// How bind mounts name their sources.
#[derive(Debug, Clone, Copy)]
pub enum Sources<'a> {
    /// By path, for `--dry-run` and tests: bwrap resolves each name when it mounts.
    Names,
    /// By descriptor (`--bind-fd`, `--ro-bind-fd`), one entry per plan mount: the launch
    /// and `--check`. Never falls back to a name.
    Fds(&'a [Bind]),
}

/// What only the launch knows, given to the renderer beside the plan (the plan itself is
/// never changed after it is built).
#[derive(Debug, Clone, Copy)]
pub struct Runtime<'a> {
    /// How bind mounts name their sources.
    pub sources: Sources<'a>,
    /// A descriptor bwrap keeps open in the sandbox's pid 1 for the sandbox's whole life
    /// (`--sync-fd`): the launch's in-use lock (src/state/inuse.rs).
    pub sync_fd: Option<i32>,
    /// Allowlist mode: the descriptor on which the step inside reaches the proxy.
    pub proxy_fd: i32,
    /// claudebox was started with SIGINT ignored (a background job of a shell): the agent
    /// inherits that choice, so the step inside leaves the signals alone.
    pub signals_ignored_on_entry: bool,
    /// The launch's copy of its stderr, which the step inside puts back on 2 once bwrap's
    /// setup is done (bwrap's own stderr is the launcher's pipe until then).
    pub stderr_fd: Option<i32>,
}

impl Runtime<'static> {
    /// `--dry-run`: sources by name, no lock, the proxy's descriptor where the launch puts
    /// it.
    pub const DRY_RUN: Runtime<'static> = Runtime {
        sources: Sources::Names,
        sync_fd: None,
        proxy_fd: network::SANDBOX_NET_FD,
        signals_ignored_on_entry: false,
        stderr_fd: None,
    };
}

/// bwrap's full argv with sources named by path (`--dry-run`).
pub fn argv(plan: &Plan) -> Vec<OsString> {
    argv_with(plan, &Runtime::DRY_RUN)
}

/// bwrap's full argv, program first.
pub fn argv_with(plan: &Plan, rt: &Runtime) -> Vec<OsString> {
    let sources = rt.sources;
    let mut a: Vec<OsString> = vec![plan.bwrap.clone().into_os_string()];
    for f in &plan.flags {
        a.push(f.into());
    }
    if let Some(fd) = rt.sync_fd {
        a.push("--sync-fd".into());
        a.push(fd.to_string().into());
    }
    if let Sources::Fds(t) = sources {
        assert_eq!(t.len(), plan.mounts.len(), "one source entry per mount");
    }
    for (i, m) in plan.mounts.iter().enumerate() {
        if let Sources::Fds(table) = sources {
            match table[i] {
                Bind::Other => {}
                Bind::Skip => continue,
                Bind::Fd(fd) => {
                    let flag = match m.kind {
                        MountKind::Ro | MountKind::RoTry => "--ro-bind-fd",
                        MountKind::Rw | MountKind::File => "--bind-fd",
                        _ => unreachable!("only bind mounts take a descriptor"),
                    };
                    a.push(flag.into());
                    a.push(fd.to_string().into());
                    a.push(m.target.clone().into_os_string());
                    continue;
                }
            }
            assert!(
                !crate::policy::plan::is_bind(&m.kind),
                "a bind mount without a descriptor: {}",
                m.target.display()
            );
        }
        if m.kind == MountKind::ScratchRo {
            // Made read-only after every mount (below); bwrap's root is there already.
            if m.target != std::path::Path::new("/") {
                a.push("--tmpfs".into());
                a.push(m.target.clone().into_os_string());
            }
            continue;
        }
        if m.kind == MountKind::EmptyRo {
            a.push("--tmpfs".into());
            a.push(m.target.clone().into_os_string());
            a.push("--remount-ro".into());
            a.push(m.target.clone().into_os_string());
            continue;
        }
        let flag = match m.kind {
            MountKind::Ro => "--ro-bind",
            MountKind::RoTry => "--ro-bind-try",
            MountKind::Rw | MountKind::File => "--bind",
            MountKind::Tmpfs => "--tmpfs",
            MountKind::Symlink => "--symlink",
            MountKind::Dev => "--dev",
            MountKind::Proc => "--proc",
            MountKind::DevBind => "--dev-bind-try",
            MountKind::EmptyRo | MountKind::ScratchRo => unreachable!("handled above"),
        };
        a.push(flag.into());
        if let Some(src) = &m.source {
            a.push(src.clone().into_os_string());
        }
        a.push(m.target.clone().into_os_string());
    }
    for m in plan
        .mounts
        .iter()
        .filter(|m| m.kind == MountKind::ScratchRo)
    {
        a.push("--remount-ro".into());
        a.push(m.target.clone().into_os_string());
    }
    for e in &plan.env {
        match e {
            EnvOp::Set(k, v) => {
                a.push("--setenv".into());
                a.push(k.clone());
                a.push(v.clone());
            }
            EnvOp::Unset(k) => {
                a.push("--unsetenv".into());
                a.push(k.clone());
            }
        }
    }
    for e in &plan.user_env {
        a.push("--setenv".into());
        a.push(e.name.clone());
        a.push(e.value.clone());
    }
    a.push("--chdir".into());
    a.push(plan.cwd.clone().into_os_string());
    a.push("--".into());
    if let Some(c) = &plan.confine {
        a.push(c.exe.clone().into_os_string());
        a.push(confinement::INIT_FLAG.into());
        if let Some(fd) = rt.stderr_fd {
            a.push(confinement::STDERR_FD_FLAG.into());
            a.push(fd.to_string().into());
        }
        if c.scope_abstract_unix {
            a.push(confinement::SCOPE_FLAG.into());
        }
        if c.default_signals && !rt.signals_ignored_on_entry {
            a.push(confinement::SIGNALS_FLAG.into());
        }
        for dir in &c.guard_git_dirs {
            a.push(confinement::GUARD_FLAG.into());
            a.push(dir.clone().into_os_string());
        }
        for dir in &c.guard_work_tree {
            a.push(confinement::GUARD_TOP_FLAG.into());
            a.push(dir.clone().into_os_string());
        }
        for check in &c.mount_checks {
            a.push(
                if check.read_only {
                    confinement::EXPECT_RO
                } else {
                    confinement::EXPECT_RW
                }
                .into(),
            );
            a.push(check.path.clone().into_os_string());
        }
        if let Some(l) = &c.listen {
            a.push(confinement::PROXY_FD_FLAG.into());
            a.push(rt.proxy_fd.to_string().into());
            if let Some(port) = l.port {
                a.push(confinement::PROXY_PORT_FLAG.into());
                a.push(port.to_string().into());
            }
            if let Some(dir) = &l.broker_dir {
                a.push(confinement::BROKER_DIR_FLAG.into());
                a.push(dir.clone().into_os_string());
            }
            for f in &l.forwards {
                a.push(
                    if f.optional {
                        confinement::FORWARD_OPTIONAL_FLAG
                    } else {
                        confinement::FORWARD_FLAG
                    }
                    .into(),
                );
                a.push(f.listen.to_string().into());
            }
        }
        a.push("--".into());
    }
    a.extend(plan.argv.iter().cloned());
    a
}

/// The proxy's argv (the hidden `--internal-proxy` role, parsed by `proxy::netbridge`'s
/// clap parser), with `fd` its end of the bridge to the sandbox.
pub fn proxy_argv(spec: &ProxySpec, fd: i32) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec![
        network::INTERNAL_PROXY.into(),
        "--instance".into(),
        spec.instance_id.clone().into(),
        "--fd".into(),
        fd.to_string().into(),
        "--denied-log".into(),
        spec.denied_log.clone().into_os_string(),
    ];
    if spec.log_stderr {
        a.push("--log-denied".into());
    }
    if !spec.http_proxy {
        a.push("--forwards-only".into());
    }
    if spec.open {
        a.push("--open".into());
    }
    if let Some(b) = &spec.broker {
        if let Some(c) = &b.credentials {
            a.push("--login-broker".into());
            a.push(c.clone().into_os_string());
        }
        if b.api_key {
            a.push("--broker-api-key".into());
        }
        if let Some(h) = &b.api_key_helper {
            a.push("--broker-api-key-helper".into());
            a.push(h.clone().into_os_string());
        }
        if let Some(s) = &b.settings_api_key {
            a.push("--broker-settings-api-key".into());
            a.push(s.clone().into_os_string());
        }
    }
    for e in &spec.allowlist.entries {
        a.push("--allow".into());
        a.push(e.pattern.to_string().into());
    }
    for e in &spec.forward_ports {
        a.push("--forward-port".into());
        a.push(e.pattern.to_string().into());
    }
    a
}

/// The mount table, one row per mount in the order bwrap applies them.
pub fn mount_table(plan: &Plan) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"# mounts, in the order bwrap applies them (later wins)\n");
    out.extend_from_slice(b"# kind\tsource\ttarget\twhy\tfrom\n");
    for m in &plan.mounts {
        out.extend_from_slice(m.kind.to_string().as_bytes());
        out.push(b'\t');
        match &m.source {
            Some(s) => out.extend_from_slice(&escape_bytes(s.as_os_str().as_bytes())),
            None => out.push(b'-'),
        }
        out.push(b'\t');
        out.extend_from_slice(&escape_bytes(m.target.as_os_str().as_bytes()));
        out.push(b'\t');
        out.extend_from_slice(m.why.as_bytes());
        out.push(b'\t');
        out.extend_from_slice(&escape_bytes(m.origin.to_string().as_bytes()));
        out.push(b'\n');
    }
    out
}

/// The user's settings that are not mounts: the config file, the network mode and the
/// default claude arguments, each with where it came from.
pub fn settings_table(plan: &Plan) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"# settings\n# name\tvalue\tfrom\n");
    for r in &plan.settings_rows {
        out.extend_from_slice(r.name.as_bytes());
        out.push(b'\t');
        out.extend_from_slice(&escape_bytes(&r.value));
        out.push(b'\t');
        out.extend_from_slice(&escape_bytes(r.from.as_bytes()));
        out.push(b'\n');
    }
    out
}

/// The full `--dry-run` output: a short summary and the legend of the kinds (see
/// `summary`), the mount table, the settings, the environment changes,
/// the command.
pub fn dry_run(plan: &Plan) -> Vec<u8> {
    let mut out = summary::summary(plan);
    out.extend_from_slice(&mount_table(plan));
    out.extend_from_slice(&settings_table(plan));
    out.extend_from_slice(
        b"# environment: the host's, plus (unset: variables naming host sockets and buses)\n",
    );
    let mut line = |op: &str, k: &[u8], v: Option<&[u8]>, from: &str| {
        out.extend_from_slice(op.as_bytes());
        out.push(b'\t');
        out.extend_from_slice(&escape_bytes(k));
        if let Some(v) = v {
            out.push(b'=');
            out.extend_from_slice(&escape_bytes(v));
        }
        out.push(b'\t');
        out.extend_from_slice(&escape_bytes(from.as_bytes()));
        out.push(b'\n');
    };
    for e in &plan.env {
        match e {
            EnvOp::Set(k, v) => {
                let from = match crate::policy::plan::default_env_reason(k) {
                    Some(why) => format!("default: {why}"),
                    None => "default".to_string(),
                };
                line("set", k.as_bytes(), Some(v.as_bytes()), &from)
            }
            EnvOp::Unset(k) => line("unset", k.as_bytes(), None, "default"),
        }
    }
    for e in &plan.user_env {
        let from = e.origin.to_string();
        line("set", e.name.as_bytes(), Some(e.value.as_bytes()), &from);
    }
    if let Some(c) = &plan.confine {
        out.extend_from_slice(b"# inside, before the command (claudebox --sandbox-init, one step: mount checks, Landlock, seccomp, the file supervisor, signals, and in allowlist mode or with forwarded ports the proxy's listeners)\n");
        for l in crate::policy::confinement::seccomp_lines() {
            out.extend_from_slice(l.as_bytes());
            out.push(b'\n');
        }
        for l in crate::policy::confinement::notify_lines(&c.guard_git_dirs, &c.guard_work_tree) {
            out.extend_from_slice(l.as_bytes());
            out.push(b'\n');
        }
        if c.scope_abstract_unix {
            out.extend_from_slice(b"landlock\t");
            out.extend_from_slice(crate::policy::confinement::LANDLOCK_SCOPE.as_bytes());
            out.push(b'\n');
        }
        if c.default_signals {
            out.extend_from_slice(
                b"signals\tSIGINT, SIGQUIT back to default: claudebox and bwrap ignore them, so a Ctrl-C reaches the agent alone and its exit status is the sandbox's\n",
            );
        }
    }
    out.extend_from_slice(b"# limits of the sandbox as a whole\n");
    for cells in crate::policy::limits::dry_run_rows(&plan.limits, "INSTANCE") {
        let cells: Vec<Vec<u8>> = cells.iter().map(|c| escape_bytes(c.as_bytes())).collect();
        out.extend_from_slice(&cells.join(&b'\t'));
        out.push(b'\n');
    }
    if !plan.notes.is_empty() {
        out.extend_from_slice(b"# opt-ins and gaps\n");
        for n in &plan.notes {
            out.extend_from_slice(&escape_bytes(n.as_bytes()));
            out.push(b'\n');
        }
    }
    let ports = plan
        .proxy
        .as_ref()
        .map_or(&[][..], |p| &p.forward_ports[..]);
    let described = crate::policy::forward::describe(&plan.network, ports);
    out.extend_from_slice(format!("# network: {}\n", shown(&described)).as_bytes());
    if let Some(proxy) = &plan.proxy {
        for e in &proxy.allowlist.entries {
            let source = shown(&e.source);
            out.extend_from_slice(format!("allow\t{}\t{source}\n", e.pattern).as_bytes());
        }
        if let Ok(forwards) = proxy.forwards() {
            if !forwards.is_empty() {
                out.extend_from_slice(
                    b"# holes: forward\tinside\tthe host's (tried in order)\twhy\tfrom\n",
                );
            }
            for f in forwards {
                let targets: Vec<String> = f.targets().iter().map(|a| a.to_string()).collect();
                out.extend_from_slice(
                    format!(
                        "forward\t{} inside{}\t{}\t{}\t{}\n",
                        f.listen,
                        if f.optional {
                            " (if the sandbox has IPv6)"
                        } else {
                            ""
                        },
                        targets.join(" then "),
                        f.kind.why(),
                        shown(&f.source),
                    )
                    .as_bytes(),
                );
            }
        }
        if proxy.open {
            out.extend_from_slice(b"# proxy: started on the host by claudebox for the life of the sandbox (open mode, for the login broker): the sandbox's first step opens a free port on the shared loopback, hands it over descriptor 3 and sets HTTPS_PROXY to it with a secret of this sandbox, which the proxy requires of every request (anything on that loopback can reach the port); every host is let through unfiltered, except api.anthropic.com:443 (the broker)");
        } else if proxy.http_proxy {
            out.extend_from_slice(b"# proxy: started on the host by claudebox for the life of the sandbox; the sandbox's first step hands it 127.0.0.1:3128 over descriptor 3 (run alone, the command below fails closed); denied hosts go to ");
            out.extend_from_slice(&escape_bytes(proxy.denied_log.as_os_str().as_bytes()));
        } else {
            out.extend_from_slice(b"# forwarder: claudebox's proxy process, started on the host for the life of the sandbox with no HTTP proxy (nothing on 3128 inside): the sandbox's first step hands it the listeners above over descriptor 3, and it connects each connection to the host address beside it, nothing else (run alone, the command below fails closed)");
        }
        out.push(b'\n');
        if let Some(b) = &proxy.broker {
            out.extend_from_slice(b"# login broker: in the proxy process; CONNECT api.anthropic.com:443 (whatever the allowlist) ends there in TLS under a certificate authority made for this sandbox (NODE_EXTRA_CA_CERTS inside), ");
            if let Some(c) = &b.credentials {
                out.extend_from_slice(
                    b"the stand-in bearer is swapped for the access token read from ",
                );
                out.extend_from_slice(&escape_bytes(c.as_os_str().as_bytes()));
                out.extend_from_slice(b", ");
            }
            if b.api_key {
                out.extend_from_slice(b"the stand-in x-api-key (ANTHROPIC_API_KEY inside) is swapped for the launcher's ANTHROPIC_API_KEY, which only the proxy keeps, ");
            }
            if let Some(s) = &b.settings_api_key {
                out.extend_from_slice(b"the stand-in x-api-key (ANTHROPIC_API_KEY inside) is swapped for the ANTHROPIC_API_KEY of the env block of ");
                out.extend_from_slice(&escape_bytes(s.as_os_str().as_bytes()));
                out.extend_from_slice(b", read by the proxy on the host (the sandbox's copy of that file has it removed), ");
            }
            if let Some(h) = &b.api_key_helper {
                out.extend_from_slice(b"the apiKeyHelper of ");
                out.extend_from_slice(&escape_bytes(h.as_os_str().as_bytes()));
                out.extend_from_slice(b" runs in the proxy on the host (at the start, then when its key is older than CLAUDE_CODE_API_KEY_HELPER_TTL_MS, default 5 minutes) and its key replaces the stand-in one that claude's helper inside prints (x-api-key and bearer), ");
            }
            out.extend_from_slice(b"and the request goes to api.anthropic.com over TLS; the sandbox gets the stand-in login in its tmpfs login dir and nothing of the host's\n");
        }
    }
    if let Some(i) = crate::policy::credsync::bound_index(plan) {
        out.extend_from_slice(b"# credentials sync: started on the host by claudebox for the life of the sandbox (claudebox --internal-credentials-sync), holding the bound ");
        if let Some(src) = &plan.mounts[i].source {
            out.extend_from_slice(&escape_bytes(src.as_os_str().as_bytes()));
        }
        out.extend_from_slice(b": copies a refresh by the host (which replaces that file by rename) into the sandbox as a new file mounted over the bound one (in place where the kernel cannot, before Linux 6.5), and a refresh inside into the host's file (in place, under claude's refresh lock, JSON objects up to 64 KiB only)\n");
    }
    out.extend_from_slice(
        b"# the launch opens each bind source once, checks it, and has bwrap mount that \
          descriptor (--bind-fd/--ro-bind-fd), so a path swapped meanwhile is never \
          mounted; the line below names the sources instead, and only claudebox's own \
          descriptors cross into a launch\n",
    );
    out.extend_from_slice(b"# command\n");
    out.extend_from_slice(&shell_line(&argv(plan)));
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn shell_line_round_trips_through_sh() {
        let args: Vec<OsString> = vec![
            "printf".into(),
            "%s|".into(),
            "plain".into(),
            "sp ace".into(),
            "it's".into(),
            "\"$HOME\" `x` \\".into(),
            "new\nline".into(),
            "".into(),
            OsString::from_vec(b"\xff\xfe".to_vec()),
        ];
        let line = shell_line(&args);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(std::ffi::OsStr::from_bytes(&line))
            .output()
            .unwrap();
        let mut expected = Vec::new();
        for a in &args[2..] {
            expected.extend_from_slice(a.as_bytes());
            expected.push(b'|');
        }
        assert_eq!(out.stdout, expected);
    }

    #[test]
    fn table_cells_stay_on_one_line() {
        assert_eq!(escape_bytes(b"a\tb\nc\xff"), b"a\\tb\\nc\\xff".to_vec());
        assert_eq!(
            shown("\x1b]52;c;eA==\x07 ok\u{9b}1m \u{202e}x"),
            "\\x1b]52;c;eA==\\x07 ok\\x9b1m \\u{202e}x"
        );
    }
}
