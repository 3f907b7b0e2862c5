//! `--check`: can this machine run claudebox, and if not, why and what to do. One row per
//! check (ok / warn / fail, with a fix for each that is not ok), printed on stdout; exit 1
//! when any check failed.
//!
//! The sandbox checks are real: a sandbox is built by `plan::build` and `render::argv`
//! exactly as a launch builds it (same namespace flags, same kinds of mounts), over a
//! throwaway home, project and state directory in a temporary directory, and runs `true`;
//! then `bwrap` inside it (Claude Code's own Bash sandbox is bwrap), then `claude --version`.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use std::os::unix::process::CommandExt;

use anyhow::{Context, Result};

use crate::host;
use crate::host::diagnose::{self, Facts};
use crate::host::exec::{run_with_timeout, Ran};
use crate::policy::facts::{project_id, Project};
use crate::policy::facts::{ClaudeInstall, HostFacts};
use crate::policy::plan::{self, Command, Inputs, NAMESPACE_FLAGS};
use crate::policy::{error, render};
use crate::state::inventory::show;
use crate::state::{self, StateHome};

const TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Warn,
    Fail,
}

struct Row {
    status: Status,
    name: &'static str,
    detail: String,
    fix: Option<String>,
}

fn ok(name: &'static str, detail: String) -> Row {
    Row {
        status: Status::Ok,
        name,
        detail,
        fix: None,
    }
}
fn warn(name: &'static str, detail: String, fix: String) -> Row {
    Row {
        status: Status::Warn,
        name,
        detail,
        fix: Some(fix),
    }
}
fn fail(name: &'static str, detail: String, fix: String) -> Row {
    Row {
        status: Status::Fail,
        name,
        detail,
        fix: Some(fix),
    }
}

pub fn run(gpu: bool) -> Result<ExitCode> {
    let held = missed_review();
    let mut rows = checks()?;
    rows.extend(held);
    rows.extend(gpu_row(&host::home_dir()?, gpu));
    let mut out = String::new();
    for r in &rows {
        let status = match r.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        };
        out.push_str(&format!("{status:<5} {:<17} {}\n", r.name, r.detail));
        if let Some(fix) = &r.fix {
            let mut lines = fix.lines();
            if let Some(first) = lines.next() {
                out.push_str(&format!("      fix: {first}\n"));
            }
            for l in lines {
                out.push_str(&format!("           {l}\n"));
            }
        }
    }
    let count = |s| rows.iter().filter(|r| r.status == s).count();
    let failed = count(Status::Fail);
    out.push_str(&format!(
        "{} ok, {} warn, {failed} fail\n",
        count(Status::Ok),
        count(Status::Warn)
    ));
    crate::maintenance::list::write_stdout(out.as_bytes())?;
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// An error's text and its fix, from the [`Fixable`] it carries (`fallback` when it
/// carries none): the fix is data, never cut out of the message.
fn parts(e: &anyhow::Error, fallback: &str) -> (String, String) {
    match error::find(e) {
        Some(f) => (f.what.clone(), f.fix.clone()),
        None => (format!("{e:#}"), fallback.to_string()),
    }
}

/// The [`error::Fixable`] that is the error itself (not one under a context, whose
/// `what` would leave the context out).
fn top_fixable(e: &anyhow::Error) -> Option<&error::Fixable> {
    e.chain().next()?.downcast_ref::<error::Fixable>()
}

fn checks() -> Result<Vec<Row>> {
    let home = host::home_dir()?;
    let mut rows = Vec::new();
    let bwrap = host::find_bwrap();
    let claude = host::find_claude(&home);

    match &bwrap {
        Ok(b) => {
            rows.push(bwrap_row(b));
            rows.push(bwrap_cve_row(b));
            rows.push(apparmor_row(b));
        }
        Err(e) => {
            let (detail, fix) = parts(e, "install bubblewrap");
            rows.push(fail("bwrap", detail, fix));
        }
    }
    rows.push(claude_row(&claude));
    rows.push(codex_row(&home));
    match &bwrap {
        Ok(b) => rows.extend(sandbox_rows(b, claude.as_ref().ok())),
        Err(_) => {
            for name in ["sandbox", "nested sandbox"] {
                rows.push(fail(
                    name,
                    "not tried: no bwrap".into(),
                    "install bubblewrap".into(),
                ));
            }
        }
    }
    rows.extend(claude_home_rows(&home));
    rows.push(credentials_row(&home));
    rows.push(match StateHome::from_env(&home) {
        Ok(st) => state_row(&st),
        Err(e) => {
            let (detail, fix) = parts(&e, "set CLAUDEBOX_HOME to an absolute path");
            fail("state dir", detail, fix)
        }
    });
    rows.push(config_row(&home));
    rows.push(limits_row(&crate::host::limits::probe()));
    rows.push(supervisor_row());
    Ok(rows)
}

/// Whether the file supervisor guards the main git dir here (seccomp user notification),
/// or the launch's inotify watch alone.
fn supervisor_row() -> Row {
    match crate::inside::notify::available() {
        Ok(()) => ok(
            "file supervisor",
            "seccomp user notification: no commondir can be made in a project's main git \
             dir (the launch's watch stays as a second line)"
                .into(),
        ),
        Err(why) => warn(
            "file supervisor",
            format!(
                "none ({why}): a commondir planted in a project's main git dir is moved aside \
                 by the launch's watch within about a millisecond, and one git run on the \
                 host in that moment can read it"
            ),
            "Linux 5.19 or newer, with Yama's ptrace_scope at 0 or 1".into(),
        ),
    }
}

/// Whether `--memory`, `--pids`, `--cpu` and the default process limit can be applied.
fn limits_row(support: &crate::policy::limits::Support) -> Row {
    use crate::policy::limits::{Support, FIX, TABLE};
    let detail = support.describe();
    match support {
        Support::Systemd { controllers } | Support::Cgroup { controllers, .. } => {
            let missing: Vec<&str> = TABLE
                .iter()
                .filter(|r| !controllers.iter().any(|c| c == r.controller))
                .map(|r| r.flag)
                .collect();
            if missing.is_empty() {
                ok("limits", detail)
            } else {
                warn(
                    "limits",
                    format!("{detail}; {} cannot be applied", missing.join(", ")),
                    FIX.to_string(),
                )
            }
        }
        _ => warn("limits", detail, FIX.to_string()),
    }
}

/// The config file as a launch from the current directory would read it, and the network
/// mode that would be in force there.
fn config_row(home: &Path) -> Row {
    let config_file = crate::config::location(home);
    // A file that does not parse stops every launch: a failure. What depends on the
    // project (paths, [[project]] sections) is judged for the current directory: a warning.
    let file = match crate::config::load(&config_file) {
        Ok(f) => f,
        Err(e) => {
            return fail(
                "config",
                format!("{e:#}"),
                format!("fix {}; every launch stops until then", show(&config_file)),
            )
        }
    };
    let resolved = settings_here(home, file.as_ref(), &config_file);
    match resolved {
        Ok(s) => ok(
            "network",
            format!(
                "{} ({}; config {})",
                crate::policy::forward::describe(&s.network, &s.forward_ports),
                s.network_origin,
                if s.config_read {
                    show(&config_file)
                } else {
                    "none".into()
                }
            ),
        ),
        Err(e) => match top_fixable(&e) {
            // A refusal that says its own fix (e.g. the config file inside the project).
            Some(f) => warn(
                "config",
                format!("a launch from this directory would stop: {}", f.what),
                f.fix.clone(),
            ),
            None => warn(
                "config",
                format!("a launch from this directory would stop: {e:#}"),
                format!("fix {} or launch from your project", show(&config_file)),
            ),
        },
    }
}

/// The settings a launch from the current directory would resolve from the config file.
fn settings_here(
    home: &Path,
    file: Option<&crate::config::File>,
    config_file: &Path,
) -> Result<crate::policy::settings::Settings> {
    let cwd = host::current_dir()?;
    let project = crate::host::project::discover(&cwd)?;
    let state_home = StateHome::from_env(home)?;
    let state = state_home.project(&project.id());
    crate::config::settings::resolve(
        file,
        &crate::policy::settings::CliRequest::default(),
        &crate::config::Context {
            home,
            cwd: &cwd,
            project: &project,
            state_dir: &state_home.dir,
            conversations: &state.conversations(),
            config_file,
            yes: false,
        },
    )
}

/// With the GPU opt-in in force (`--gpu`, or `gpu = true` for the current directory's
/// project): which of the GPU device nodes this host has. No row without the opt-in.
fn gpu_row(home: &Path, cli_gpu: bool) -> Option<Row> {
    let origin = if cli_gpu {
        crate::policy::origin::Origin::CommandLine
    } else {
        let config_file = crate::config::location(home);
        let file = crate::config::load(&config_file).ok()?;
        settings_here(home, file.as_ref(), &config_file).ok()?.gpu?
    };
    let host = crate::host::gpu::probe();
    let devices: Vec<String> = host.devices().iter().map(|d| show(d)).collect();
    if devices.is_empty() {
        return Some(warn(
            "gpu",
            format!(
                "{} (opt-in: {origin}); a launch goes on without a GPU",
                crate::policy::gpu::no_devices_line()
            ),
            "load the GPU's driver on the host (nvidia, amdgpu), or drop the opt-in".into(),
        ));
    }
    let found = format!(
        "device nodes found: {} (opt-in: {origin})",
        devices.join(", ")
    );
    Some(match gpu_in_sandbox(&host, &origin) {
        Ok(missing) if missing.is_empty() => ok("gpu", format!("{found}; a sandbox sees them")),
        Ok(missing) => warn(
            "gpu",
            format!("{found}; a sandbox does not see {}", missing.join(", ")),
            "report it with `claudebox --gpu --dry-run`'s output".into(),
        ),
        Err(e) => warn(
            "gpu",
            format!("{found}; a sandbox with them does not start: {e:#}"),
            "report it with `claudebox --gpu --dry-run`'s output".into(),
        ),
    })
}

/// The GPU device nodes that a sandbox planned with the opt-in (as a launch plans it) does
/// not show as a device or a directory. Nothing is opened: opening a DRM card can make
/// the opener its master.
fn gpu_in_sandbox(
    host: &crate::policy::gpu::GpuHost,
    origin: &crate::policy::origin::Origin,
) -> Result<Vec<String>> {
    let mut probe = Probe::create(&host::find_bwrap()?, None)?;
    probe.inputs.settings.gpu = Some(origin.clone());
    probe.inputs.gpu = host.clone();
    let mut argv: Vec<OsString> = ["sh", "-c", GPU_LOOK, "sh"].map(OsString::from).to_vec();
    argv.extend(host.devices().iter().map(|d| d.as_os_str().to_os_string()));
    let ran = probe.run(argv)?;
    if !ran.success() {
        anyhow::bail!("{}", ran.describe());
    }
    Ok(String::from_utf8_lossy(&ran.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// Prints each argument that is neither a character device nor a directory.
const GPU_LOOK: &str = r#"for d; do [ -c "$d" ] || [ -d "$d" ] || printf '%s\n' "$d"; done"#;

fn bwrap_row(bwrap: &Path) -> Row {
    let mut cmd = std::process::Command::new(bwrap);
    cmd.arg("--version");
    match run_with_timeout(&mut cmd, TIMEOUT) {
        Ok(r) if r.success() => ok(
            "bwrap",
            format!("{} ({})", show(bwrap), first_line(&r.stdout)),
        ),
        Ok(r) => fail(
            "bwrap",
            format!("{} --version failed: {}", show(bwrap), r.describe()),
            "reinstall bubblewrap".into(),
        ),
        Err(e) => fail(
            "bwrap",
            format!("{} cannot run: {e:#}", show(bwrap)),
            "reinstall bubblewrap, or point CLAUDEBOX_BWRAP at a working bwrap".into(),
        ),
    }
}

/// Whether this bwrap carries the fix for CVE-2026-87766: by its version (0.12.0 or later),
/// else by its package's changelog naming the CVE (a backport; `host::bwrap_cve`).
fn bwrap_cve_row(bwrap: &Path) -> Row {
    let fix = crate::host::bwrap_cve::probe(bwrap);
    if fix.fixed() {
        ok("bwrap fix", fix.describe())
    } else {
        warn(
            "bwrap fix",
            fix.describe(),
            "install bubblewrap 0.12.0 or later (or your distribution's update that names \
             the CVE)"
                .into(),
        )
    }
}

/// The AppArmor state for this bwrap (src/maintenance/apparmor.rs).
fn apparmor_row(bwrap: &Path) -> Row {
    use crate::maintenance::apparmor::{classify, Facts, Level};
    let v = classify(&Facts::probe(bwrap));
    Row {
        status: match v.level {
            Level::Ok => Status::Ok,
            Level::Warn => Status::Warn,
            Level::Fail => Status::Fail,
        },
        name: "apparmor",
        detail: v.detail,
        fix: v.fix,
    }
}

/// The three checks that need a real sandbox.
fn sandbox_rows(bwrap: &Path, claude: Option<&ClaudeInstall>) -> Vec<Row> {
    let facts = Facts::probe(bwrap);
    let world = match Probe::create(bwrap, claude) {
        Ok(w) => w,
        Err(e) => {
            return vec![fail(
                "sandbox",
                format!("cannot prepare a test sandbox: {e:#}"),
                "make the temporary directory ($TMPDIR or /tmp) writable".into(),
            )]
        }
    };
    let mut rows = Vec::new();
    let outer = world.run(vec!["true".into()]);
    let flags = NAMESPACE_FLAGS.join(" ");
    match &outer {
        Ok(r) if r.success() => rows.push(ok(
            "sandbox",
            format!("a launch's sandbox starts ({flags})"),
        )),
        Ok(r) => rows.push(match installation_fails(bwrap, claude, r) {
            Some(row) => row,
            None => {
                let dg = diagnose::classify(&r.stderr_text(), &facts, false);
                fail("sandbox", dg.text, dg.fix)
            }
        }),
        Err(e) => rows.push(fail(
            "sandbox",
            format!("bwrap cannot run: {e:#}"),
            "reinstall bubblewrap".into(),
        )),
    }
    let outer_ok = matches!(&outer, Ok(r) if r.success());

    // Claude Code's own Bash sandbox runs bwrap inside ours, with a network namespace.
    let mut nested: Vec<OsString> = vec!["bwrap".into()];
    nested.extend(NAMESPACE_FLAGS.iter().map(OsString::from));
    for a in [
        "--unshare-net",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--",
        "true",
    ] {
        nested.push(a.into());
    }
    if !outer_ok {
        rows.push(fail(
            "nested sandbox",
            "not tried: the sandbox itself does not start".into(),
            "fix the sandbox row first".into(),
        ));
    } else {
        match world.run(nested) {
            Ok(r) if r.success() => rows.push(ok(
                "nested sandbox",
                "bwrap runs inside the sandbox (Claude Code's Bash sandbox can work)".into(),
            )),
            Ok(r) => {
                let dg = diagnose::classify(&r.stderr_text(), &facts, true);
                rows.push(warn(
                    "nested sandbox",
                    format!(
                        "Claude Code's Bash sandbox will not start inside: {}",
                        dg.text
                    ),
                    dg.fix,
                ));
            }
            Err(e) => rows.push(warn(
                "nested sandbox",
                format!("cannot run: {e:#}"),
                "reinstall bubblewrap".into(),
            )),
        }
    }

    if let Some(c) = claude {
        if outer_ok {
            match world.run(vec![c.on_path.clone().into(), "--version".into()]) {
                Ok(r) if r.success() => rows.push(ok(
                    "claude in sandbox",
                    format!("runs: {}", first_line(&r.stdout)),
                )),
                Ok(r) => rows.push(fail(
                    "claude in sandbox",
                    format!("`claude --version` fails inside: {}", r.describe()),
                    "run `claudebox --exec claude --version` to see it; report it with \
                     `claudebox --dry-run`'s output"
                        .into(),
                )),
                Err(e) => rows.push(fail(
                    "claude in sandbox",
                    format!("cannot run: {e:#}"),
                    "reinstall bubblewrap".into(),
                )),
            }
        }
    }
    rows
}

/// When the probe sandbox failed with claude's installation in it and starts without
/// it, the installation's mounts are the cause, not the kernel or a security module:
/// the row names the install and bwrap's line, and says what to do.
fn installation_fails(bwrap: &Path, claude: Option<&ClaudeInstall>, r: &Ran) -> Option<Row> {
    let c = claude?;
    let bare = Probe::create(bwrap, None).ok()?;
    if !bare.run(vec!["true".into()]).is_ok_and(|b| b.success()) {
        return None;
    }
    Some(fail(
        "sandbox",
        format!(
            "the sandbox starts, but not with claude's installation ({} -> {}) in it: {}",
            show(&c.on_path),
            show(&c.real),
            r.describe()
        ),
        "report it with `claudebox --dry-run`'s output (the installation's mounts); \
         meanwhile install Claude Code into a user prefix \
         (npm config set prefix ~/.npm-global; npm install -g @anthropic-ai/claude-code)"
            .into(),
    ))
}

fn claude_row(claude: &Result<ClaudeInstall>) -> Row {
    let c = match claude {
        Ok(c) => c,
        Err(e) => {
            let (what, fix) = parts(e, "install Claude Code");
            return fail("claude", what, fix);
        }
    };
    let place = if c.on_path == c.real {
        show(&c.on_path)
    } else {
        format!("{} -> {}", show(&c.on_path), show(&c.real))
    };
    let mut cmd = std::process::Command::new(&c.on_path);
    cmd.arg("--version");
    match run_with_timeout(&mut cmd, TIMEOUT) {
        Ok(r) if r.success() => ok("claude", format!("{place} ({})", first_line(&r.stdout))),
        Ok(r) => fail(
            "claude",
            format!("{place}: `claude --version` failed: {}", r.describe()),
            "reinstall Claude Code (npm install -g @anthropic-ai/claude-code, or the native \
             installer)"
                .into(),
        ),
        Err(e) => fail(
            "claude",
            format!("{place} cannot run: {e:#}"),
            "reinstall Claude Code".into(),
        ),
    }
}

/// The agent a launch from this directory runs (`agent` in the config file), and Codex's
/// install: a failure only when Codex is that agent and missing or broken.
fn codex_row(home: &Path) -> Row {
    use crate::policy::agent::AgentId;
    let config_file = crate::config::location(home);
    let agent = crate::config::load(&config_file)
        .ok()
        .and_then(|f| settings_here(home, f.as_ref(), &config_file).ok())
        .and_then(|s| s.agent)
        .map(|(a, o)| format!("{a} ({o})"))
        .unwrap_or_else(|| "claude (default)".into());
    let wanted = agent.starts_with("codex");
    let row = AgentId::Codex.row();
    let c = match host::find_agent(row, home) {
        Ok(c) => c,
        Err(e) if wanted => {
            let (what, fix) = parts(&e, row.install);
            return fail("codex", format!("agent here: {agent}; {what}"), fix);
        }
        Err(_) => {
            return ok(
                "codex",
                format!("agent here: {agent}; no `codex` on PATH (needed only for --agent codex)"),
            )
        }
    };
    // Not `codex --version`: every codex start writes into the real ~/.codex (its helper
    // links in tmp/arg0-linux, measured), and --check changes nothing. The npm package
    // says its version.
    let version = c
        .real
        .ancestors()
        .map(|d| d.join("package.json"))
        .find(|p| p.is_file())
        .and_then(|p| fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string))
        .unwrap_or_else(|| "version unknown".into());
    ok(
        "codex",
        format!("agent here: {agent}; {} ({version})", show(&c.on_path)),
    )
}

fn claude_home_rows(home: &Path) -> Vec<Row> {
    let dir = home.join(".claude");
    let dir_row = match fs::metadata(&dir) {
        Ok(m) if m.is_dir() => ok("~/.claude", show(&dir)),
        Ok(_) => fail(
            "~/.claude",
            format!("{} is not a directory", show(&dir)),
            "move it aside; Claude Code keeps its settings in a directory there".into(),
        ),
        Err(_) => warn(
            "~/.claude",
            format!("{} is missing", show(&dir)),
            "run `claude` once on the host and log in (claudebox would otherwise start with \
             an empty one)"
                .into(),
        ),
    };
    let json = home.join(".claude.json");
    let json_row = match fs::read(&json) {
        Ok(bytes) => match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(_) => ok("~/.claude.json", show(&json)),
            Err(e) => warn(
                "~/.claude.json",
                format!("{} is not valid JSON: {e}", show(&json)),
                "let `claude` rewrite it, or restore it from ~/.claude/backups/".into(),
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => warn(
            "~/.claude.json",
            format!("{} is missing", show(&json)),
            "run `claude` once on the host (claudebox would otherwise create an empty one)".into(),
        ),
        Err(e) => fail(
            "~/.claude.json",
            format!("{} is unreadable: {e}", show(&json)),
            "fix its permissions: chmod 600 ~/.claude.json".into(),
        ),
    };
    vec![dir_row, json_row]
}

/// Why the broker stays off by default, when it does: claude is pointed at another API.
fn base_url_note() -> &'static str {
    match std::env::var("ANTHROPIC_BASE_URL") {
        Ok(v)
            if !v.trim().is_empty()
                && !v
                    .trim()
                    .trim_end_matches('/')
                    .eq_ignore_ascii_case("https://api.anthropic.com") =>
        {
            "; but not now: ANTHROPIC_BASE_URL names another API, which the broker does not serve"
        }
        _ => "",
    }
}

/// Where Claude Code finds credentials. Never reads or prints a secret's value.
fn credentials_row(home: &Path) -> Row {
    let file = home.join(".claude/.credentials.json");
    if fs::metadata(&file).is_ok_and(|m| m.is_file() && m.len() > 0) {
        return ok(
            "credentials",
            format!(
                "{} (OAuth login: kept on the host by the login broker, the sandbox gets a \
                 stand-in{}; with --no-login-broker bound into every sandbox)",
                show(&file),
                base_url_note()
            ),
        );
    }
    if std::env::var_os("ANTHROPIC_API_KEY").is_some_and(|v| !v.is_empty()) {
        return ok(
            "credentials",
            format!(
                "$ANTHROPIC_API_KEY is set (kept on the host by the login broker, the sandbox \
                 gets a stand-in{}; with --no-login-broker passed into the sandbox)",
                base_url_note()
            ),
        );
    }
    for var in [
        "ANTHROPIC_API_KEY",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "ANTHROPIC_AUTH_TOKEN",
    ] {
        if std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
            return ok(
                "credentials",
                format!("${var} is set (passed into the sandbox)"),
            );
        }
    }
    for var in ["CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"] {
        if std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0") {
            return ok(
                "credentials",
                format!("${var} is set (cloud credentials not checked)"),
            );
        }
    }
    let api_key_in_config = fs::read(home.join(".claude.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("primaryApiKey").map(|k| k.is_string()))
        .unwrap_or(false);
    if api_key_in_config {
        return ok(
            "credentials",
            "an API key is stored in ~/.claude.json".into(),
        );
    }
    warn(
        "credentials",
        "none found (~/.claude/.credentials.json, $ANTHROPIC_API_KEY, $CLAUDE_CODE_OAUTH_TOKEN)"
            .into(),
        "run `claude` on the host and log in (/login), or set ANTHROPIC_API_KEY".into(),
    )
}

fn state_row(home: &StateHome) -> Row {
    if let Err(e) = state::check_writable(home) {
        let (detail, fix) = parts(&e, "fix its permissions");
        return fail("state dir", detail, fix);
    }
    match fs::metadata(&home.dir) {
        Ok(m) if m.permissions().mode() & 0o077 != 0 => warn(
            "state dir",
            format!(
                "{} is writable but open to other users (mode {:o})",
                show(&home.dir),
                m.permissions().mode() & 0o7777
            ),
            format!("chmod 700 {}", show(&home.dir)),
        ),
        Ok(_) => ok("state dir", format!("{} is writable", show(&home.dir))),
        Err(_) => ok(
            "state dir",
            format!("{} will be created at the first launch", show(&home.dir)),
        ),
    }
}

/// A throwaway home, project and state directory to build a real plan over; removed on
/// drop.
struct Probe {
    dir: PathBuf,
    inputs: Inputs,
}

impl Probe {
    fn create(bwrap: &Path, claude: Option<&ClaudeInstall>) -> Result<Probe> {
        let dir = std::env::temp_dir().join(format!("claudebox-check-{}", host::random_id()?));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", show(&dir)))?;
        let dir = fs::canonicalize(&dir)?;
        let probe_inputs = |dir: &Path| -> Result<Inputs> {
            let home = dir.join("home");
            let work = dir.join("work");
            let state_home = StateHome {
                dir: dir.join("state"),
            };
            let state = state_home.project(&project_id(&work));
            for d in [
                home.join(".claude/projects"),
                home.join(".claude/sessions"),
                work.clone(),
                state.conversations(),
                state.claude_config(),
                state.login_dir(),
            ] {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&d)?;
            }
            fs::write(home.join(".claude/history.jsonl"), b"")?;
            fs::write(home.join(".claude.json"), b"{}\n")?;
            fs::write(state.history(), b"")?;
            fs::write(state.empty_file(), b"")?;
            // What a launch makes in the state for its mounts: the settings copy, the
            // package caches, the scratch .claude's .gitignore.
            crate::state::refresh_user_settings(&state, None)?;
            crate::state::ensure_caches(&state)?;
            crate::state::ensure_claude_gitignore(&state)?;
            // The login directory's own credentials file, bound onto itself when the home
            // has no login (as this one has none): the launch makes it beneath the
            // directory (`prepare_mount_points`); this directory is the probe's own.
            fs::write(
                state
                    .login_dir()
                    .join(crate::policy::claude_home::LOGIN_FILE),
                b"",
            )?;
            Ok(Inputs {
                claude: claude.cloned(),
                command: Command::Exec(vec!["true".into()]),
                host: HostFacts::probe(),
                protect_project_metadata: false,
                ipc_vars: crate::host::ipc_vars_present(),
                landlock_abi: host::landlock_abi(),
                ..Inputs::new(
                    Project {
                        root: work.clone(),
                        work_tree: work.clone(),
                        git_dir: None,
                        common_dir: None,
                        cwd: work,
                    },
                    home,
                    state,
                    bwrap.to_path_buf(),
                    host::own_exe()?,
                    host::random_id()?,
                )
            })
        };
        match probe_inputs(&dir) {
            Ok(inputs) => Ok(Probe { dir, inputs }),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Runs `argv` in a sandbox planned and rendered as a launch does it.
    fn run(&self, argv: Vec<OsString>) -> Result<Ran> {
        let mut inputs = self.inputs.clone();
        inputs.command = Command::Exec(argv);
        let plan = plan::build(&inputs);
        // Sources bound by descriptor, as a launch binds them.
        let opened = crate::host::sources::open(&plan, &crate::launch::writable_areas(&inputs))?;
        let table = opened.table();
        let argv = render::argv_with(
            &plan,
            &render::Runtime {
                sources: render::Sources::Fds(&table),
                ..render::Runtime::DRY_RUN
            },
        );
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).env("HOME", &inputs.home);
        let fds = opened.fds();
        // SAFETY: only fcntl between fork and exec, on descriptors `opened` holds open until
        // after the spawn.
        unsafe {
            cmd.pre_exec(move || {
                for fd in &fds {
                    crate::host::fd::inherit_raw(*fd)?;
                }
                Ok(())
            });
        }
        let ran = run_with_timeout(&mut cmd, TIMEOUT);
        drop(opened);
        ran
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Ran {
    fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    fn describe(&self) -> String {
        let err = self.stderr_text();
        let last = err.lines().rev().find(|l| !l.trim().is_empty());
        match (self.status, last) {
            (None, _) => format!("no answer within {} s", TIMEOUT.as_secs()),
            (Some(s), Some(l)) => format!("{s}: {}", l.trim()),
            (Some(s), None) => s.to_string(),
        }
    }
}

fn first_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

/// The current project's exit reviews that were missed (its claudebox was killed, or an
/// earlier review was held): a failing row while the project is held. A record that
/// cannot be read: the project reviewed whole.
fn missed_review() -> Option<Row> {
    let (Ok(cwd), Ok(home)) = (host::current_dir(), host::home_dir()) else {
        return None;
    };
    let p = crate::host::project::discover(&cwd).ok()?;
    let st = crate::state::StateHome::from_env(&home)
        .ok()?
        .project(&p.id());
    let whole = crate::state::review::Target::of(&p, &Default::default());
    let held = crate::state::review::missed(&st, Some(&whole), &mut std::io::stderr()).refusal()?;
    Some(fail("exit review", held.what, held.fix))
}
