//! The user's additions to the sandbox, from the config file and the command line: extra
//! mounts (read-only, read-write, hidden), environment variables, the network mode and
//! default arguments for claude, each with where it came from. Resolving them (expanding
//! `~`, checking that paths exist, resolving symlinks, refusing what would break the
//! sandbox) happens here, on the launch path; the plan only places them.
//!
//! Precedence: the top level of the config file, then each `[[project]]` section that
//! matches the project (in file order), then the command line. Later wins: one mount per
//! target path, one value per variable, one network mode; default claude arguments add up.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, Result};

use crate::config::guard;
use crate::config::{self, Section};
use crate::policy::escape::Shown;
use crate::policy::limits;
use crate::policy::network::{self, NetworkChoice};

use crate::config::Context;
use crate::policy::origin::Origin;
use crate::policy::settings::{ClaudeArgs, CliRequest, ExtraKind, ExtraMount, Settings, UserEnv};

/// Where a request was written, for its error messages and its origin.
#[derive(Clone)]
enum Where<'a> {
    Config(&'a config::File, Range<usize>),
    Cli(&'static str, OsString),
}

impl Where<'_> {
    fn error(&self, msg: impl fmt::Display) -> anyhow::Error {
        match self {
            Where::Config(file, span) => file.error(span, msg),
            Where::Cli(flag, value) => anyhow!("{flag} {}: {msg}", value.shown()),
        }
    }
    fn origin(&self) -> Origin {
        match self {
            Where::Config(file, span) => Origin::ConfigFile {
                path: file.path.clone(),
                line: file.line(span),
            },
            Where::Cli(..) => Origin::CommandLine,
        }
    }
}

struct Request<'a> {
    kind: ExtraKind,
    path: PathBuf,
    at: Where<'a>,
}

/// Combines the config file (top level and matching `[[project]]` sections) with the
/// command line, checks every path and refuses what would widen or break the sandbox.
pub fn resolve(file: Option<&config::File>, cli: &CliRequest, cx: &Context) -> Result<Settings> {
    let mut s = Settings {
        config_file: cx.config_file.to_path_buf(),
        config_read: file.is_some(),
        ..Settings::default()
    };
    let mut requests: Vec<Request> = Vec::new();
    let mut network: Vec<NetworkChoice> = Vec::new();
    let mut env: Vec<UserEnv> = Vec::new();

    if let Some(file) = file {
        let mut sections: Vec<&Section> = vec![&file.global];
        for p in &file.global.project {
            #[allow(clippy::expect_used)] // config::parse refuses a [[project]] without root
            let root = p.get_ref().root.as_ref().expect("checked by config::parse");
            let at = Where::Config(file, root.span());
            let path = expand_config_path(root.get_ref(), cx.home, &at)?;
            if guard::project_matches(&path, cx.project) {
                sections.push(p.get_ref());
            }
        }
        for sec in sections {
            for (kind, list) in [
                (ExtraKind::Ro, &sec.ro),
                (ExtraKind::Rw, &sec.rw),
                (ExtraKind::Hide, &sec.hide),
            ] {
                for p in list {
                    let at = Where::Config(file, p.span());
                    let path = expand_config_path(p.get_ref(), cx.home, &at)?;
                    requests.push(Request { kind, path, at });
                }
            }
            for (name, value) in &sec.env {
                let at = Where::Config(file, name.span());
                check_env_name(OsStr::new(name.get_ref()), &at)?;
                env.push(UserEnv {
                    name: name.get_ref().into(),
                    value: value.get_ref().into(),
                    origin: at.origin(),
                });
            }
            for name in &sec.pass_env {
                let at = Where::Config(file, name.span());
                check_env_name(OsStr::new(name.get_ref()), &at)?;
                if let Some(value) = std::env::var_os(name.get_ref()) {
                    env.push(UserEnv {
                        name: name.get_ref().into(),
                        value,
                        origin: at.origin(),
                    });
                }
            }
            if sec.network.is_some() || !sec.allow_hosts.is_empty() || !sec.forward_ports.is_empty()
            {
                let first = sec
                    .network
                    .as_ref()
                    .map(|n| n.span())
                    .or_else(|| sec.allow_hosts.first().map(|h| h.span()))
                    .or_else(|| sec.forward_ports.first().map(|h| h.span()))
                    .unwrap_or_default();
                let spelled = |h: &toml::Spanned<String>| {
                    let at = Where::Config(file, h.span()).origin();
                    (h.get_ref().clone(), at.to_string())
                };
                network.push(NetworkChoice {
                    mode: sec.network.as_ref().map(|n| *n.get_ref()),
                    allow_hosts: sec.allow_hosts.iter().map(spelled).collect(),
                    forward_ports: sec.forward_ports.iter().map(spelled).collect(),
                    source: file.at(&first),
                });
                if sec.network.is_some() || !sec.allow_hosts.is_empty() {
                    s.network_origin = Where::Config(file, first).origin();
                }
            }
            for (flag, value) in [
                (&mut s.ssh_agent, &sec.ssh_agent),
                (&mut s.writable_project_config, &sec.writable_project_config),
                (&mut s.writable_claude_setup, &sec.writable_claude_setup),
                (&mut s.gpu, &sec.gpu),
            ] {
                if let Some(v) = value {
                    *flag = v.get_ref().then(|| Where::Config(file, v.span()).origin());
                }
            }
            if let Some(v) = &sec.login_broker {
                s.login_broker = Some((*v.get_ref(), Where::Config(file, v.span()).origin()));
            }
            for (kind, value) in [
                (limits::Kind::Memory, &sec.memory),
                (limits::Kind::Pids, &sec.pids),
                (limits::Kind::Cpu, &sec.cpu),
            ] {
                if let Some(v) = value {
                    let at = Where::Config(file, v.span());
                    let setting = limits::parse(kind, v.get_ref())
                        .map_err(|e| at.error(format!("{kind}: {e}")))?;
                    s.limits.set(limits::Asked {
                        kind,
                        setting,
                        origin: at.origin(),
                    });
                }
            }
            if let Some(a) = &sec.agent {
                let at = Where::Config(file, a.span());
                let id = crate::policy::agent::AgentId::parse(a.get_ref()).ok_or_else(|| {
                    at.error(format!(
                        "agent: unknown agent {:?}; one of {}",
                        a.get_ref(),
                        crate::policy::agent::names().join(", ")
                    ))
                })?;
                s.agent = Some((id, at.origin()));
            }
            if let Some(a) = &sec.claude_args {
                s.claude_args.push(ClaudeArgs {
                    args: a.get_ref().iter().map(OsString::from).collect(),
                    origin: Where::Config(file, a.span()).origin(),
                });
            }
        }
    }

    for (kind, flag, list) in [
        (ExtraKind::Ro, "--ro", &cli.ro),
        (ExtraKind::Rw, "--rw", &cli.rw),
        (ExtraKind::Hide, "--hide", &cli.hide),
    ] {
        for p in list {
            let at = Where::Cli(flag, p.clone().into_os_string());
            let path = expand_cli_path(p, cx.home, cx.cwd);
            requests.push(Request { kind, path, at });
        }
    }
    for e in &cli.env {
        let at = Where::Cli("--env", e.clone());
        let bytes = e.as_bytes();
        let (name, value) = match bytes.iter().position(|b| *b == b'=') {
            Some(i) => (
                OsStr::from_bytes(&bytes[..i]),
                Some(OsStr::from_bytes(&bytes[i + 1..]).to_os_string()),
            ),
            None => (e.as_os_str(), std::env::var_os(e)),
        };
        check_env_name(name, &at)?;
        if let Some(value) = value {
            env.push(UserEnv {
                name: name.to_os_string(),
                value,
                origin: Origin::CommandLine,
            });
        }
    }
    if cli.network.mode.is_some() || !cli.network.allow_hosts.is_empty() {
        s.network_origin = Origin::CommandLine;
    }
    network.push(cli.network.clone());
    s.network = network::resolve(&network)?;
    s.forward_ports = crate::policy::forward::resolve(&network)?;
    if cli.ssh_agent {
        s.ssh_agent = Some(Origin::CommandLine);
    }
    if cli.writable_project_config {
        s.writable_project_config = Some(Origin::CommandLine);
    }
    if cli.writable_claude_setup {
        s.writable_claude_setup = Some(Origin::CommandLine);
    }
    if cli.gpu {
        s.gpu = Some(Origin::CommandLine);
    }
    if let Some(b) = cli.login_broker {
        s.login_broker = Some((b, Origin::CommandLine));
    }
    if let Some(a) = cli.agent {
        s.agent = Some((a, Origin::CommandLine));
    }
    for (kind, value) in &cli.limits {
        let setting = limits::parse(*kind, value)
            .map_err(|e| anyhow!("{} {}: {e}", limits::row(*kind).flag, value.shown()))?;
        s.limits.set(limits::Asked {
            kind: *kind,
            setting,
            origin: Origin::CommandLine,
        });
    }

    // The agent's own hosts join the defaults (the agent table's `hosts`).
    if let (network::NetworkMode::Allowlist(list), Some((agent, _))) = (&mut s.network, &s.agent) {
        if *agent != crate::policy::agent::AgentId::Claude {
            for h in agent.row().hosts {
                if let Ok(p) = network::HostPattern::parse(h) {
                    list.push(p, "default");
                }
            }
        }
    }
    s.mounts = resolve_mounts(requests, cx)?;
    guard::check_config_not_writable(cx, &s.mounts)?;
    guard::check_state_not_writable(cx)?;
    s.env = last_wins(env, |e| e.name.clone());
    Ok(s)
}

/// `~` and `~/...` expanded; anything else must be absolute.
fn expand_config_path(raw: &str, home: &Path, at: &Where) -> Result<PathBuf> {
    if let Some(p) = expand_tilde(Path::new(raw), home) {
        return Ok(p);
    }
    if raw.starts_with('~') {
        return Err(at.error(format!(
            "`{raw}`: only `~` and `~/...` are expanded; write the full path"
        )));
    }
    if !Path::new(raw).is_absolute() {
        return Err(at.error(format!(
            "`{raw}` is a relative path; write an absolute path or one starting with ~/"
        )));
    }
    Ok(PathBuf::from(raw))
}

/// As on a shell command line: `~` expanded, a relative path taken from the cwd.
fn expand_cli_path(raw: &Path, home: &Path, cwd: &Path) -> PathBuf {
    expand_tilde(raw, home).unwrap_or_else(|| cwd.join(raw))
}

fn expand_tilde(raw: &Path, home: &Path) -> Option<PathBuf> {
    let b = raw.as_os_str().as_bytes();
    if b == b"~" {
        return Some(home.to_path_buf());
    }
    let rest = b.strip_prefix(b"~/")?;
    Some(home.join(OsStr::from_bytes(rest)))
}

fn check_env_name(name: &OsStr, at: &Where) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b.contains(&b'=') || b.contains(&0) {
        return Err(at.error("not a valid environment variable name"));
    }
    if b == b"CLAUDEBOX" || b.starts_with(b"CLAUDEBOX_") {
        return Err(at.error(format!("{} is set by claudebox itself", name.shown())));
    }
    Ok(())
}

/// Keeps the last item for each key, in the order of those last items.
fn last_wins<T, K: PartialEq>(items: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let keys: Vec<K> = items.iter().map(&key).collect();
    items
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !keys[i + 1..].contains(&keys[*i]))
        .map(|(_, t)| t)
        .collect()
}

fn resolve_mounts(requests: Vec<Request>, cx: &Context) -> Result<Vec<ExtraMount>> {
    let mut resolved: Vec<(ExtraMount, Request)> = Vec::new();
    for r in requests {
        let source = fs::canonicalize(&r.path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                r.at.error(format!("{} does not exist", r.path.shown()))
            }
            _ => {
                r.at.error(format!("cannot resolve {}: {e}", r.path.shown()))
            }
        })?;
        let is_dir = fs::metadata(&source).map(|m| m.is_dir()).unwrap_or(false);
        let has_dotdot = r.path.components().any(|c| c == Component::ParentDir);
        let target = if r.kind == ExtraKind::Hide || has_dotdot {
            source.clone()
        } else {
            r.path.components().collect()
        };
        let m = ExtraMount {
            kind: r.kind,
            source,
            target,
            is_dir,
            origin: r.at.origin(),
        };
        resolved.push((m, r));
    }
    let resolved = last_wins(resolved, |(m, _)| m.target.clone());
    if resolved.is_empty() {
        // The usual launch: nothing to check, and writable_areas costs ~25 system calls.
        return Ok(Vec::new());
    }

    let mut writable = guard::writable_areas(cx);
    writable.extend(
        resolved
            .iter()
            .filter(|(m, _)| m.kind == ExtraKind::Rw)
            .map(|(m, _)| m.source.clone()),
    );
    for (m, r) in &resolved {
        guard::check_mount(m, &r.path, &writable, cx).map_err(|msg| r.at.error(msg))?;
    }
    Ok(resolved.into_iter().map(|(m, _)| m).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilde_expansion() {
        let home = Path::new("/h");
        assert_eq!(expand_tilde(Path::new("~"), home), Some("/h".into()));
        assert_eq!(
            expand_tilde(Path::new("~/a b"), home),
            Some("/h/a b".into())
        );
        assert_eq!(expand_tilde(Path::new("~x/a"), home), None);
        assert_eq!(expand_tilde(Path::new("/a/~"), home), None);
        assert_eq!(
            expand_cli_path(Path::new("rel"), home, Path::new("/cwd")),
            PathBuf::from("/cwd/rel")
        );
    }

    #[test]
    fn last_wins_keeps_order_of_the_winners() {
        let v = vec![("a", 1), ("b", 2), ("a", 3), ("c", 4)];
        assert_eq!(last_wins(v, |x| x.0), vec![("b", 2), ("a", 3), ("c", 4)]);
    }

    #[test]
    fn env_names() {
        let at = Where::Cli("--env", "x".into());
        assert!(check_env_name(OsStr::new("FOO_1"), &at).is_ok());
        for bad in ["", "A=B", "CLAUDEBOX", "CLAUDEBOX_PROJECT_ROOT"] {
            assert!(check_env_name(OsStr::new(bad), &at).is_err(), "{bad}");
        }
    }
}
