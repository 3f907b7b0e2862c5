//! Codex's config and login under many sandboxes at once (issue 25, item 5): N Codex
//! sandboxes of two projects (and a linked worktree of one) each hold a conversation with
//! the lab's mock of the Responses API, authenticated by the one shared `auth.json` login,
//! while N/2 more sandboxes each log in again with their own API key (`codex login
//! --with-api-key`, which rewrites that shared file). Nothing may be lost or corrupted: every
//! conversation ends and sent a key of the login, the login is one whole key at the end,
//! every project's `~/.codex/auth.json` is still the link to it, the host's `config.toml`
//! and `auth.json` are untouched, each thread is in its own project's `~/.codex` only.
//! Control: the same processes bare, sharing one `~/.codex`. Prints the figures.
//!
//! `CLAUDEBOX_CODEX_CONCURRENCY` (default 8) sets N; `CLAUDEBOX_CODEX_CONCURRENCY_VERSION=latest`
//! picks the newest Codex instead of the pinned one.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use crate::BIN;
use lab::agent::{codex_versions, MockApi};
use lab::*;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A provider that takes its key from the login (`auth.json`), not from a variable.
fn config(port: u16) -> String {
    format!(
        "model = \"mock-model\"\nmodel_provider = \"mock\"\n\n[model_providers.mock]\n\
         name = \"mock\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n\
         wire_api = \"responses\"\nrequires_openai_auth = true\n"
    )
}

fn key(i: usize) -> String {
    format!("sk-proj-claudebox-lab-login-{i:04}")
}

fn auth(k: &str) -> String {
    format!("{{\"auth_mode\":\"apikey\",\"OPENAI_API_KEY\":\"{k}\"}}\n")
}

/// The request's Authorization header as the mock logs it (length and last 4 characters).
fn auth_header(r: &serde_json::Value) -> String {
    r["headers"]
        .as_object()
        .into_iter()
        .flatten()
        .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        .and_then(|(_, v)| v.as_str())
        .unwrap_or_default()
        .to_string()
}

/// What one wave measured.
struct Wave {
    seconds: f64,
    failed: Vec<String>,
    /// Requests whose Authorization was no key of the login.
    foreign_keys: usize,
    /// The login at the end is one whole key of those written.
    login_whole: bool,
}

/// Starts every child at once (conversations first, then the logins), waits for all.
fn wave(
    mock: &MockApi,
    conversations: Vec<(String, Command)>,
    logins: Vec<(String, Command)>,
    login_file: &Path,
    keys: &[String],
) -> Wave {
    let before = mock.conversation(0).len();
    let start = Instant::now();
    let mut children: Vec<(String, Child)> = Vec::new();
    for (label, mut c) in conversations {
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        children.push((label, c.spawn().unwrap()));
    }
    for (label, mut c) in logins {
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let k = label.rsplit(' ').next().unwrap().to_string();
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(format!("{k}\n").as_bytes()).unwrap();
        drop(stdin);
        children.push((label, child));
    }
    let mut failed = Vec::new();
    for (label, child) in children {
        let o = child.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let conversation = !label.starts_with("login");
        if !o.status.success() || (conversation && !out.contains("MOCK: the script is over.")) {
            failed.push(format!(
                "{label}: {}: {}{}",
                o.status,
                out.chars().take(400).collect::<String>(),
                String::from_utf8_lossy(&o.stderr)
                    .chars()
                    .take(600)
                    .collect::<String>()
            ));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let tails: Vec<String> = keys.iter().map(|k| k[k.len() - 4..].to_string()).collect();
    let foreign_keys = mock
        .conversation(before)
        .iter()
        .filter(|r| {
            let a = auth_header(r);
            !tails.iter().any(|t| a.ends_with(&format!("...{t}>")))
        })
        .count();
    let end = fs::read(login_file).unwrap_or_default();
    let login_whole = serde_json::from_slice::<serde_json::Value>(&end)
        .ok()
        .and_then(|v| v["OPENAI_API_KEY"].as_str().map(String::from))
        .is_some_and(|k| keys.contains(&k));
    Wave {
        seconds,
        failed,
        foreign_keys,
        login_whole,
    }
}

#[test]
fn many_codex_sandboxes_share_one_login_nothing_lost_nothing_corrupted() {
    let _heavy = heavy();
    let n = env_num("CLAUDEBOX_CODEX_CONCURRENCY", 8).max(2);
    let versions = codex_versions();
    let latest = std::env::var("CLAUDEBOX_CODEX_CONCURRENCY_VERSION").is_ok_and(|v| v == "latest");
    let Some(c) = (if latest {
        versions.last()
    } else {
        versions.first()
    }) else {
        return;
    };
    let w = World::new_in(BIN, Path::new("/var/tmp"));
    symlink(&c.bin, w.bin().join("codex")).unwrap();
    let a = w.dir("alpha");
    init_repo(&a);
    let b = w.dir("beta");
    init_repo(&b);
    let wt = w.root().join("alpha-wt");
    git(&a, &["worktree", "add", "-q", wt.to_str().unwrap()]);
    let dirs = [a.clone(), b.clone(), wt.clone()];
    let mock = MockApi::start_openai(&serde_json::json!([]));
    let host_codex = w.home().join(".codex");
    fs::create_dir_all(&host_codex).unwrap();
    let cfg = config(mock.port());
    fs::write(host_codex.join("config.toml"), &cfg).unwrap();
    let first = key(0);
    fs::write(host_codex.join("auth.json"), auth(&first)).unwrap();
    let mut keys: Vec<String> = (0..=n / 2).map(key).collect();
    keys.dedup();

    // --- N sandboxes and N/2 logins at once.
    let conversations = (0..n)
        .map(|i| {
            let mut cmd = w.cmd(&dirs[i % dirs.len()]);
            cmd.args([
                "--agent",
                "codex",
                "exec",
                "--json",
                "--skip-git-repo-check",
            ])
            .arg(format!("PROMPT-SANDBOX-{i:04}"));
            (format!("sandbox {i}"), cmd)
        })
        .collect();
    let logins = (1..=n / 2)
        .map(|i| {
            let mut cmd = w.cmd(&dirs[i % dirs.len()]);
            cmd.args(["--agent", "codex", "login", "--with-api-key"]);
            (format!("login {}", key(i)), cmd)
        })
        .collect();
    let login_file = w.state().join("codex-login/auth.json");
    let boxed = wave(&mock, conversations, logins, &login_file, &keys);
    assert!(boxed.failed.is_empty(), "[{}] {:#?}", c.label, boxed.failed);
    assert_eq!(boxed.foreign_keys, 0, "[{}]", c.label);
    assert!(
        boxed.login_whole,
        "[{}] {:?}",
        c.label,
        fs::read_to_string(&login_file)
    );
    // Every project's ~/.codex/auth.json is still the link to the one login.
    let projects: Vec<PathBuf> = fs::read_dir(w.state().join("projects"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(projects.len(), 2, "[{}] {projects:?}", c.label);
    for p in &projects {
        assert_eq!(
            fs::read_link(p.join("codex-home/auth.json"))
                .ok()
                .as_deref(),
            Some(login_file.as_path()),
            "[{}] {}",
            c.label,
            p.display()
        );
    }
    // The logins inside wrote the one shared file (no longer the first key), and the
    // other project's next conversation sends what it holds now.
    let now: serde_json::Value = serde_json::from_slice(&fs::read(&login_file).unwrap()).unwrap();
    let now = now["OPENAI_API_KEY"].as_str().unwrap().to_string();
    assert_ne!(
        now, first,
        "[{}] no login inside reached the shared file",
        c.label
    );
    let before = mock.conversation(0).len();
    ok(&w
        .cmd(&b)
        .args([
            "--agent",
            "codex",
            "exec",
            "--json",
            "--skip-git-repo-check",
            "AFTER",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap());
    let sent = auth_header(&mock.conversation(before)[0]);
    assert!(
        sent.contains(&now[now.len() - 4..]),
        "[{}] {sent} vs {now}",
        c.label
    );
    // The host's setup and login are untouched.
    assert_eq!(
        fs::read_to_string(host_codex.join("config.toml")).unwrap(),
        cfg
    );
    assert_eq!(
        fs::read_to_string(host_codex.join("auth.json")).unwrap(),
        auth(&first)
    );
    // Each conversation's thread is in its own project's ~/.codex, and only there.
    let id_of = |dir: &Path| {
        let o = w
            .cmd(dir)
            .args(["--agent", "codex", "--exec", "sh", "-c", "grep -rlo 'PROMPT-SANDBOX-[0-9]*' ~/.codex/sessions | wc -l; grep -rho 'PROMPT-SANDBOX-[0-9]*' ~/.codex/sessions | sort -u | tr '\\n' ' '"])
            .output()
            .unwrap();
        ok(&o)
    };
    let seen_a = id_of(&a);
    let seen_b = id_of(&b);
    for i in 0..n {
        let tag = format!("PROMPT-SANDBOX-{i:04}");
        let (own, other) = if i % dirs.len() == 1 {
            (&seen_b, &seen_a)
        } else {
            (&seen_a, &seen_b)
        };
        assert!(
            own.contains(&tag) && !other.contains(&tag),
            "[{}] {tag}: {seen_a} | {seen_b}",
            c.label
        );
    }

    // --- Control: the same, bare, every process sharing one ~/.codex.
    let bare_home = w.root().join("bare-home");
    fs::create_dir_all(bare_home.join(".codex")).unwrap();
    fs::write(bare_home.join(".codex/config.toml"), &cfg).unwrap();
    fs::write(bare_home.join(".codex/auth.json"), auth(&first)).unwrap();
    let bare = |dir: &Path| {
        let mut cmd = Command::new(&c.bin);
        cmd.current_dir(dir)
            .env_clear()
            .env("HOME", &bare_home)
            .env("PATH", w.path_var())
            .env("LANG", "C.UTF-8");
        cmd
    };
    let conversations = (0..n)
        .map(|i| {
            let mut cmd = bare(&dirs[i % dirs.len()]);
            cmd.args(["exec", "--json", "--skip-git-repo-check"])
                .arg(format!("PROMPT-BARE-{i:04}"));
            (format!("bare {i}"), cmd)
        })
        .collect();
    let logins = (1..=n / 2)
        .map(|i| {
            let mut cmd = bare(&dirs[i % dirs.len()]);
            cmd.args(["login", "--with-api-key"]);
            (format!("login {}", key(i)), cmd)
        })
        .collect();
    let control = wave(
        &mock,
        conversations,
        logins,
        &bare_home.join(".codex/auth.json"),
        &keys,
    );
    figure!(
        "codex concurrency ({}, {n} conversations + {} logins at once, 2 projects + 1 worktree): \
         sandboxed {:.1} s, {} failed, {} requests with a foreign key, login whole: {}; \
         bare (one shared ~/.codex) {:.1} s, {} failed, {} foreign, login whole: {}",
        c.label,
        n / 2,
        boxed.seconds,
        boxed.failed.len(),
        boxed.foreign_keys,
        boxed.login_whole,
        control.seconds,
        control.failed.len(),
        control.foreign_keys,
        control.login_whole
    );
    for f in &control.failed {
        figure!("  bare failure: {}", f.replace('\n', " "));
    }
}

/// The processes whose command line names a path under `under` and Codex's daemon.
fn daemons(under: &Path) -> Vec<(i32, String)> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let b = fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&b).replace('\0', " ")))
        })
        .filter(|(_, cl)| {
            cl.contains(&*under.to_string_lossy()) && cl.contains("app-server-daemon")
        })
        .collect()
}

/// Codex's app-server daemons of K sandboxes of one project, started at once (issue 25,
/// item 5). The project's `~/.codex` is shared, and Codex keeps there the daemon's pid file
/// and `app-server-control/app-server-control.sock`, a symlink to a socket under
/// `/tmp/codex-daemon-<uid>/`: each sandbox's own `/tmp`, so each sandbox starts and talks
/// to its own daemon, which ends with it. Control: K bare processes sharing one `~/.codex`
/// share one daemon (the host's `/tmp`). Prints the figures.
#[test]
fn codex_daemons_of_many_sandboxes_of_one_project_never_meet() {
    let _heavy = heavy();
    let k = env_num("CLAUDEBOX_CODEX_DAEMONS", 4).max(2);
    let Some(c) = codex_versions().into_iter().next() else {
        return;
    };
    let w = World::new_in(BIN, Path::new("/var/tmp"));
    symlink(&c.bin, w.bin().join("codex")).unwrap();
    let p = w.dir("proj");
    init_repo(&p);
    let host_codex = w.home().join(".codex");
    fs::create_dir_all(&host_codex).unwrap();
    // Each starts its daemon, waits until all K have, asks its daemon, and says which
    // socket its link leads to and whether that socket is there.
    let script = r#"
        codex app-server daemon start >/dev/null 2>&1; echo "START=$?"
        touch "$1/.up-$2"
        n=0; while [ "$(ls "$1" -a | grep -c '^\.up-')" -lt "$3" ] && [ $n -lt 600 ]; do sleep 0.2; n=$((n+1)); done
        codex app-server daemon version 2>/dev/null | tail -1
        l=$(readlink ~/.codex/app-server-control/app-server-control.sock); echo "LINK=$l"
        test -S "$l" && echo SOCKET-HERE
        touch "$1/.done-$2"
        n=0; while [ "$(ls "$1" -a | grep -c '^\.done-')" -lt "$3" ] && [ $n -lt 600 ]; do sleep 0.2; n=$((n+1)); done
    "#;
    let run_all = |sandboxed: bool, tag: &str| -> (f64, Vec<String>) {
        let marks = p.join(format!(".marks-{tag}"));
        fs::create_dir_all(&marks).unwrap();
        let start = Instant::now();
        let children: Vec<Child> = (0..k)
            .map(|i| {
                let mut cmd = if sandboxed {
                    let mut c = w.cmd(&p);
                    c.args(["--agent", "codex", "--exec", "sh", "-c", script, "sh"]);
                    c
                } else {
                    let mut c = Command::new("sh");
                    c.current_dir(&p)
                        .env_clear()
                        .env("HOME", w.root().join("bare-home"))
                        .env("PATH", w.path_var())
                        .args(["-c", script, "sh"]);
                    c
                };
                cmd.arg(&marks).arg(i.to_string()).arg(k.to_string());
                cmd.stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outs = children
            .into_iter()
            .map(|ch| {
                let o = ch.wait_with_output().unwrap();
                format!("{}{}", stdout(&o), stderr(&o))
            })
            .collect();
        (start.elapsed().as_secs_f64(), outs)
    };
    let (secs, outs) = run_all(true, "boxed");
    let running = outs
        .iter()
        .filter(|o| {
            o.contains("START=0")
                && o.contains("\"status\":\"running\"")
                && o.contains("SOCKET-HERE")
        })
        .count();
    let link = outs
        .iter()
        .find_map(|o| {
            o.lines()
                .find_map(|l| l.strip_prefix("LINK="))
                .map(String::from)
        })
        .unwrap_or_default();
    // The daemons ended with their sandboxes: nothing of them on the host.
    let host_socket = !link.is_empty() && Path::new(&link).exists();
    let left = daemons(&w.root());
    // Control: the same, bare, one shared ~/.codex.
    fs::create_dir_all(w.root().join("bare-home/.codex")).unwrap();
    let (bare_secs, bare_outs) = run_all(false, "bare");
    let bare_started = bare_outs.iter().filter(|o| o.contains("START=0")).count();
    let bare_running = bare_outs
        .iter()
        .filter(|o| o.contains("\"status\":\"running\""))
        .count();
    let mut stop = Command::new(&c.bin);
    let _ = stop
        .current_dir(&p)
        .env_clear()
        .env("HOME", w.root().join("bare-home"))
        .env("PATH", w.path_var())
        .args(["app-server", "daemon", "stop"])
        .output();
    // `daemon stop` leaves its `pid-update-loop` running (measured, 0.169.0): this test's
    // bare daemons go by pid, found by their path under this test's directory.
    let bare_left = daemons(&w.root().join("bare-home"));
    for (pid, _) in &bare_left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    figure!(
        "codex daemons ({}, {k} sandboxes of one project at once): {running} of {k} ran and \
         reached their own daemon through their own /tmp socket, {:.1} s, host socket left: \
         {host_socket}, daemon processes left: {}; bare (one ~/.codex): {bare_started} \
         started, {bare_running} of {k} reached a daemon, {:.1} s, daemon processes left \
         after `daemon stop`: {}",
        c.label,
        secs,
        left.len(),
        bare_secs,
        bare_left.len()
    );
    assert_eq!(running, k, "[{}] {outs:#?}", c.label);
    assert!(!host_socket, "[{}] {link}", c.label);
    assert!(left.is_empty(), "[{}] {left:?}", c.label);
}
