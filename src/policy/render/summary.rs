//! The head of `--dry-run`: a short summary a person reads first (project, state,
//! network, what is writable, read-only and hidden, opt-ins), then a legend of every mount
//! kind the listing below prints. Made from the plan alone, like the rest of the listing.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{escape_bytes, shown};
use crate::policy::agent::AgentId;
use crate::policy::mount::MountKind;
use crate::policy::network::NetworkMode;
use crate::policy::origin::Origin;
use crate::policy::plan::{Plan, SSH_AGENT_SOCK};

fn path(p: &Path) -> String {
    String::from_utf8_lossy(&escape_bytes(p.as_os_str().as_bytes())).into_owned()
}

/// `a, b, c` of at most `max` items, then "and N more".
fn list(items: &[String], max: usize) -> String {
    let mut s = items
        .iter()
        .take(max)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > max {
        s.push_str(&format!(" and {} more", items.len() - max));
    }
    s
}

pub fn summary(plan: &Plan) -> Vec<u8> {
    let project = &plan.project;
    let in_state = |p: &Option<std::path::PathBuf>| {
        p.as_deref().is_some_and(|s| s.starts_with(&plan.state_dir))
    };
    let claude_dir = plan
        .mounts
        .iter()
        .find(|m| m.kind == MountKind::Rw && in_state(&m.source))
        .map(|m| m.target.clone());
    let home = claude_dir.as_deref().and_then(Path::parent);
    let by_user = |o: &Origin| !matches!(o, Origin::Default);
    let (mut writable, mut scratch, mut protected, mut read_only, mut hidden) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    writable.push(format!("the project {}", path(project)));
    for m in &plan.mounts {
        let under_claude = claude_dir
            .as_deref()
            .is_some_and(|c| m.target.starts_with(c));
        let user = by_user(&m.origin);
        let hide_file = m.kind == MountKind::Ro && user && in_state(&m.source);
        match m.kind {
            MountKind::Rw | MountKind::File if user => {
                writable.push(format!("{} ({})", path(&m.target), m.origin))
            }
            MountKind::Rw | MountKind::File
                if !m.target.starts_with(project)
                    && !in_state(&m.source)
                    && m.target != Path::new(SSH_AGENT_SOCK) =>
            {
                writable.push(path(&m.target))
            }
            MountKind::Tmpfs if user => hidden.push(format!("{} ({})", path(&m.target), m.origin)),
            MountKind::Tmpfs if !under_claude => scratch.push(path(&m.target)),
            MountKind::Ro if hide_file => {
                hidden.push(format!("{} ({})", path(&m.target), m.origin))
            }
            MountKind::Ro if user => read_only.push(format!("{} ({})", path(&m.target), m.origin)),
            MountKind::Ro | MountKind::EmptyRo
                if !user
                    && m.target.starts_with(project)
                    && m.target != *project
                    && !in_state(&m.source) =>
            {
                let rel = m.target.strip_prefix(project).unwrap_or(&m.target);
                protected.push(path(rel))
            }
            _ => {}
        }
    }
    let codex = plan.agent == AgentId::Codex;
    if let Some(c) = claude_dir.as_ref().filter(|_| codex) {
        writable.push(format!(
            "{}: this project's own CODEX_HOME, kept in the state",
            path(c)
        ));
    } else if let Some(c) = &claude_dir {
        writable.push(format!(
            "{} and {}.json: this project's own copies, kept in the state",
            path(c),
            path(c)
        ));
    }
    let caches = plan.state_dir.join(crate::policy::layout::CACHES_DIR);
    let cache_paths: Vec<String> = plan
        .mounts
        .iter()
        .filter(|m| {
            m.kind == MountKind::Rw && m.source.as_deref().is_some_and(|s| s.starts_with(&caches))
        })
        .map(|m| path(&m.target))
        .collect();
    if !cache_paths.is_empty() {
        writable.push(format!(
            "the package caches ({}): this project's own, kept in the state",
            list(&cache_paths, 3)
        ));
    }
    let mut ro = vec!["the system (/usr, /etc, ...)".to_string()];
    let around: Vec<String> = plan
        .mounts
        .iter()
        .filter(|m| m.kind == MountKind::ScratchRo && m.target != Path::new("/"))
        .map(|m| path(&m.target))
        .collect();
    ro.push(if around.is_empty() {
        "the directories around the project (a write there would be lost at exit)".to_string()
    } else {
        format!(
            "the directories around the project, {} (a write there would be lost at exit)",
            around.join(", ")
        )
    });
    if !protected.is_empty() {
        ro.push(format!(
            "{} code-bearing paths of the project ({})",
            protected.len(),
            list(&protected, 4)
        ));
    }
    if codex {
        ro.push(
            "your Codex setup in ~/.codex (config.toml, AGENTS.md, rules, hooks.json, ...)".into(),
        );
    } else if claude_dir.is_some() {
        ro.push(
            "your Claude Code setup in ~/.claude (hooks, plugins, ...; settings.json is a copy)"
                .into(),
        );
    }
    ro.extend(read_only);
    let mut hid = vec![match home {
        Some(h) => format!(
            "the rest of your home {} (ssh keys, other projects)",
            path(h)
        ),
        None => "the rest of your home (ssh keys, other projects)".to_string(),
    }];
    hid.extend(hidden);
    let opt_ins: Vec<String> = plan
        .notes
        .iter()
        .filter_map(|n| n.strip_prefix("opt-in "))
        .map(|n| shown(n.split_once(':').map_or(n, |(f, _)| f)))
        .collect();
    let ports = plan
        .proxy
        .as_ref()
        .map_or(&[][..], |p| &p.forward_ports[..]);
    let mut network = match &plan.network {
        NetworkMode::Open => "open: the host's network, unfiltered".to_string(),
        NetworkMode::None => "none: loopback only".to_string(),
        NetworkMode::Allowlist(l) => format!(
            "allowlist: {} allowed host patterns (listed below), through a proxy on the host",
            l.entries.len()
        ),
    };
    if !ports.is_empty() && plan.network != NetworkMode::Open {
        let named: Vec<String> = ports.iter().map(|e| e.pattern.to_string()).collect();
        network.push_str(&format!("; forwarded host ports: {}", list(&named, 4)));
    }
    if plan.proxy.as_ref().is_some_and(|p| p.broker.is_some()) {
        network.push_str(
            "; login broker: api.anthropic.com through the proxy, which swaps this \
             sandbox's stand-in login for the host's (the login stays on the host)",
        );
    }
    let mut out = String::new();
    out.push_str("# claudebox --dry-run: nothing was started or changed. In short:\n");
    let mut row = |name: &str, value: String| {
        out.push_str(&format!("#   {name:<10} {value}\n"));
    };
    let mut project_row = path(project);
    if plan.cwd != *project {
        project_row.push_str(&format!(" (started in {})", path(&plan.cwd)));
    }
    row("project", project_row);
    if codex {
        row(
            "agent",
            "codex (experimental; notes at the end)".to_string(),
        );
    }
    row("state", path(&plan.state_dir));
    row("network", shown(&network));
    row("writable", writable.join("; "));
    if !scratch.is_empty() {
        row(
            "scratch",
            format!("{} (writable, lost at exit)", scratch.join(", ")),
        );
    }
    row("read-only", ro.join("; "));
    row("hidden", hid.join("; "));
    row(
        "opt-ins",
        if opt_ins.is_empty() {
            "none".to_string()
        } else {
            opt_ins.join(", ")
        },
    );
    out.push_str("# kinds of row in the listing below:\n");
    for k in MountKind::ALL {
        if plan.mounts.iter().any(|m| m.kind == *k) {
            out.push_str(&format!("#   {:<10} {}\n", k.to_string(), k.meaning()));
        }
    }
    let forwards = plan.proxy.as_ref().and_then(|p| p.forwards().ok());
    let confine = plan.confine.as_ref();
    for (present, name, meaning) in [
        (
            true,
            "set",
            "a variable set inside (the host's environment passes through)",
        ),
        (
            true,
            "unset",
            "a host variable removed inside (it names a host socket or bus)",
        ),
        (
            confine.is_some(),
            "seccomp",
            "a system call refused inside, and why",
        ),
        (
            confine.is_some_and(|c| !c.guard_git_dirs.is_empty()),
            "supervisor",
            "the file supervisor, and a name it never lets the agent make",
        ),
        (
            confine.is_some_and(|c| !c.guard_git_dirs.is_empty()),
            "notify",
            "a system call the file supervisor makes itself for the agent",
        ),
        (
            confine.is_some_and(|c| c.scope_abstract_unix),
            "landlock",
            "what Landlock refuses inside",
        ),
        (
            confine.is_some_and(|c| c.default_signals),
            "signals",
            "how Ctrl-C reaches the agent",
        ),
        (
            plan.proxy.as_ref().is_some_and(|p| p.http_proxy),
            "allow",
            "a host the proxy lets through, and who allowed it",
        ),
        (
            forwards.is_some_and(|f| !f.is_empty()),
            "forward",
            "a loopback address inside connected to the host's, and why",
        ),
    ] {
        if present {
            out.push_str(&format!("#   {name:<10} {meaning}\n"));
        }
    }
    for row in crate::policy::limits::dry_run_rows(&plan.limits, "") {
        if let Some(first) = row.first() {
            let meaning = crate::policy::limits::row_meaning(first);
            out.push_str(&format!("#   {first:<10} {meaning}\n"));
        }
    }
    out.into_bytes()
}
