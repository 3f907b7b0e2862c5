//! The user's `apiKeyHelper` runs on the host, in the login broker, outside every project
//! (issue 34, `policy::companion_env`). The attack: the agent plants, at the project's
//! top, what an interpreter started there loads before the user's own module: a
//! `keyring.py` (`python3 -c "import keyring"` puts the working directory first on
//! `sys.path`), a `node_modules/claude-key` (`node -e "require('claude-key')"` looks in
//! `./node_modules` before `NODE_PATH`), and a `python3` in the project's `.venv/bin`,
//! which the user activated (first on the launcher's `PATH`). Each plant, run, writes a
//! line in the host's home, where nothing inside reaches. It is run by the helper the
//! broker runs at the next launch (before the sandbox starts), and mid-session once the
//! key is older than its TTL (`CLAUDE_CODE_API_KEY_HELPER_TTL_MS`), when a request needs
//! it. The control: the same with `CLAUDEBOX_TEST_COMPANIONS_IN_CWD=1` (debug builds
//! only: the broker in the launcher's directory and environment, as before) runs every
//! plant. Besides: every host-side process of a running sandbox (the launcher aside)
//! has its working directory outside the project.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{HELPER_KEY, LIMIT, REAL_ACCESS, REAL_REFRESH};
use crate::BIN;
use lab::agent::{self, MockApi};
use lab::World;

/// The user's own modules (on the host, outside the project), printing the key.
const USER_PY: &str = "def get_password(*a):\n    return open(__file__ + '.key').read().strip()\n";
const USER_JS: &str =
    "module.exports = { get: () => require('fs').readFileSync(__filename + '.key', 'utf8').trim() };\n";

/// What the agent plants: each appends `<what> <cwd>` to `$HOME/plant-ran` when run.
const PLANT: &str = r#"
cat > keyring.py <<'EOF'
import os
open(os.path.join(os.environ["HOME"], "plant-ran"), "a").write("py " + os.getcwd() + "\n")
def get_password(*a):
    return "planted"
EOF
mkdir -p node_modules/claude-key .venv/bin
cat > node_modules/claude-key/index.js <<'EOF'
require('fs').appendFileSync(require('path').join(process.env.HOME, 'plant-ran'), 'node ' + process.cwd() + '\n');
module.exports = { get: () => 'planted' };
EOF
cat > .venv/bin/python3 <<'EOF'
#!/bin/sh
echo "venv $(pwd)" >> "$HOME/plant-ran"
exec /usr/bin/python3 "$@"
EOF
chmod +x .venv/bin/python3
"#;

/// Inside, after the plant: a request through the broker carrying the helper's stand-in
/// (the key is older than its TTL by then, so the broker runs the helper again).
const REQUEST: &str = r#"
import base64, http.client, os, ssl, urllib.parse
key = open(os.path.join(os.environ["CLAUDE_SECURESTORAGE_CONFIG_DIR"], "claudebox-api-key-helper")).read().split()[0]
port = int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])
ctx = ssl.create_default_context(cafile=os.environ["NODE_EXTRA_CA_CERTS"])
c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=20)
c.set_tunnel("api.anthropic.com", 443)
c.request("POST", "/v1/messages/count_tokens", body=b"{}",
          headers={"x-api-key": key, "Content-Type": "application/json"})
print("REQUEST", c.getresponse().status)
"#;

/// A helper of the user's: (name, `apiKeyHelper` command given the world's root).
fn helpers(root: &Path) -> Vec<(&'static str, String)> {
    let runs = root.join("helper-runs");
    let py = root.join("pylib");
    let js = root.join("nodelib");
    vec![
        (
            "python import",
            format!(
                "echo run >> '{}'; PYTHONPATH='{}' python3 -c 'import keyring; print(keyring.get_password(\"claude\", \"key\"))'",
                runs.display(),
                py.display()
            ),
        ),
        (
            "node require",
            format!(
                "echo run >> '{}'; NODE_PATH='{}' node -e 'console.log(require(\"claude-key\").get())'",
                runs.display(),
                js.display()
            ),
        ),
        (
            "python3 of an activated venv",
            format!(
                "echo run >> '{}'; python3 -c 'print(open(\"{}/keyring.py.key\").read().strip())'",
                runs.display(),
                py.display()
            ),
        ),
    ]
}

struct Fixture {
    w: World,
    mock: MockApi,
}

impl Fixture {
    fn new() -> Fixture {
        let w = World::new(BIN);
        let mock = MockApi::start_oauth_live_key(&json!([]), REAL_REFRESH, REAL_ACCESS, HELPER_KEY);
        let _ = fs::remove_file(w.home().join(".claude/.credentials.json"));
        let root = w.root();
        for (dir, file, text) in [
            ("pylib", "keyring.py", USER_PY),
            ("nodelib/claude-key", "index.js", USER_JS),
        ] {
            let d = root.join(dir);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join(file), text).unwrap();
            fs::write(d.join(format!("{file}.key")), HELPER_KEY).unwrap();
        }
        Fixture { w, mock }
    }

    fn plant_ran(&self) -> String {
        fs::read_to_string(self.w.home().join("plant-ran")).unwrap_or_default()
    }

    fn runs(&self) -> usize {
        fs::read_to_string(self.w.root().join("helper-runs"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// A fresh project, the helper `command` in the user's settings, the project's
    /// `.venv` activated in the launcher's environment.
    fn project(&self, name: &str, command: &str) -> PathBuf {
        let p = self.w.dir(name);
        agent::seed_claude_json(&self.w.home(), &[&p]);
        let settings = self.w.home().join(".claude/settings.json");
        let mut v: Value = fs::read_to_string(&settings)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_else(|| json!({}));
        v["apiKeyHelper"] = command.into();
        fs::write(&settings, v.to_string()).unwrap();
        let _ = fs::remove_file(self.w.home().join("plant-ran"));
        let _ = fs::remove_file(self.w.root().join("helper-runs"));
        p
    }

    fn launch(&self, p: &Path, script: &str, control: bool, ttl_ms: Option<u64>) -> String {
        let mut cmd = self.w.cmd(p);
        cmd.envs(super::upstream_env(&self.mock))
            .env("PWD", p)
            .env("OLDPWD", p)
            .env("VIRTUAL_ENV", p.join(".venv"))
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    p.join(".venv/bin").display(),
                    self.w.path_var().to_string_lossy()
                ),
            )
            .args([
                "--login-broker",
                "--network",
                "none",
                "--exec",
                "sh",
                "-c",
                script,
            ]);
        if let Some(ms) = ttl_ms {
            cmd.env("CLAUDE_CODE_API_KEY_HELPER_TTL_MS", ms.to_string());
        }
        if control {
            cmd.env("CLAUDEBOX_TEST_COMPANIONS_IN_CWD", "1");
        }
        let o = agent::output_within(&mut cmd, LIMIT).unwrap();
        format!("{}{}", lab::stdout(&o), lab::stderr(&o))
    }

    /// The plant runs at the next launch, before the sandbox starts: what `plant-ran`
    /// says afterwards, and how the launch went.
    fn at_launch(&self, name: &str, command: &str, control: bool) -> (String, String) {
        let p = self.project(name, command);
        let first = self.launch(&p, &format!("{PLANT}\necho PLANTED"), control, None);
        assert!(
            first.contains("PLANTED"),
            "{name}: the plant was not made: {first}"
        );
        assert!(p.join("keyring.py").exists() && p.join("node_modules/claude-key").exists());
        let second = self.launch(&p, "echo SECOND", control, None);
        (
            self.plant_ran(),
            format!("{first}\n--- next launch:\n{second}"),
        )
    }

    /// The plant runs mid-session, when the broker runs the helper again after its TTL.
    fn at_ttl(&self, name: &str, command: &str, control: bool) -> (String, String) {
        let p = self.project(name, command);
        let script = format!(
            "{PLANT}\nsleep 1.5\npython3 -c '{}'",
            REQUEST.replace('\'', r"'\''")
        );
        let out = self.launch(&p, &script, control, Some(1000));
        assert!(out.contains("REQUEST "), "{name}: no request: {out}");
        (self.plant_ran(), out)
    }
}

/// Every (attempt, plant-ran, log) of the six: three helpers, at launch and at the TTL.
fn all(f: &Fixture, control: bool) -> Vec<(String, String, String)> {
    let mut v = Vec::new();
    for (i, (what, command)) in helpers(&f.w.root()).into_iter().enumerate() {
        let (ran, log) = f.at_launch(&format!("launch-{i}"), &command, control);
        assert!(f.runs() >= 1, "{what}: the helper never ran: {log}");
        v.push((format!("{what}, at launch"), ran, log));
        let (ran, log) = f.at_ttl(&format!("ttl-{i}"), &command, control);
        assert!(
            f.runs() >= 2,
            "{what}: the helper did not run again at its TTL: {log}"
        );
        v.push((format!("{what}, at the key's TTL"), ran, log));
    }
    v
}

/// The attempts for the escape suite: `true` when a plant ran on the host.
pub(crate) fn attempts() -> Vec<(&'static str, bool)> {
    let f = Fixture::new();
    all(&f, false)
        .into_iter()
        .map(|(what, ran, log)| {
            if !ran.is_empty() {
                eprintln!("apiKeyHelper plant ran ({what}): {ran}\n{log}");
            }
            let name =
                format!("login broker: the apiKeyHelper runs a plant of the project ({what})");
            (&*name.leak(), !ran.is_empty())
        })
        .collect()
}

#[test]
fn the_api_key_helper_runs_no_plant_of_the_project() {
    let f = Fixture::new();
    for (what, ran, log) in all(&f, false) {
        assert!(
            ran.is_empty(),
            "{what}: the plant ran on the host: {ran}\n{log}"
        );
    }
    // Control: in the launcher's directory and environment, as before, each plant runs,
    // in the project.
    for (what, ran, log) in all(&f, true) {
        assert!(
            !ran.is_empty(),
            "control {what}: the plant did not run\n{log}"
        );
    }
}

/// While a sandbox runs, no host-side process of it but the launcher (the user's own
/// process, in the directory the user started it in) has its working directory in the
/// project: the keeper, bwrap's outer process, the proxy with the broker, the credentials
/// sync (a launch without the broker). Control: with `CLAUDEBOX_TEST_COMPANIONS_IN_CWD=1`
/// the proxy and the sync are in the project. As an ordinary user the broker's and its
/// keeper's directories cannot be read (they are not dumpable): root's run sees them.
#[test]
fn no_host_companion_works_in_the_project() {
    let w = World::new(BIN);
    let p = w.dir("proj");
    super::log_in(&w, &p, &super::real_login());
    let mock = MockApi::start_oauth_live(&json!([]), REAL_REFRESH, REAL_ACCESS);
    for control in [false, true] {
        let mut found = Vec::new();
        for broker in ["--login-broker", "--no-login-broker"] {
            found.extend(companions(&w, &p, &mock, broker, control));
        }
        let names: Vec<&str> = found.iter().map(|(_, n, _)| n.as_str()).collect();
        for want in ["cbx-keeper", "bwrap", "claudebox-proxy", "claudebox-creds"] {
            assert!(
                names.contains(&want),
                "[control {control}] no {want} found: {found:?}"
            );
        }
        let inside: Vec<_> = (found.iter())
            .filter(|(_, _, cwd)| cwd.as_ref().is_some_and(|c| c.starts_with(&p)))
            .collect();
        eprintln!("[control {control}] {found:?}");
        // Root reads every one; an ordinary user not the broker's (not dumpable).
        let root = nix::unistd::geteuid().is_root();
        let unread = found.iter().filter(|(_, _, c)| c.is_none()).count();
        assert!(!root || unread == 0, "unread as root: {found:?}");
        if control {
            // The sync (and as root the proxy with the broker) in the project.
            assert!(
                inside.len() >= if root { 2 } else { 1 },
                "control: the companions are not in the project: {found:?}"
            );
        } else {
            assert!(
                inside.is_empty(),
                "companions in the project: {inside:?} (all: {found:?})"
            );
        }
    }
}

/// The host-side processes of a sandbox launched with `broker` (the flag), while it runs.
fn companions(
    w: &World,
    p: &Path,
    mock: &MockApi,
    broker: &str,
    control: bool,
) -> Vec<(i32, String, Option<PathBuf>)> {
    let ready = p.join("ready");
    let _ = fs::remove_file(&ready);
    let go = p.join("go");
    let _ = fs::remove_file(&go);
    let mut cmd = w.cmd(p);
    cmd.envs(super::upstream_env(mock)).args([
        broker,
        "--network",
        "none",
        "--exec",
        "sh",
        "-c",
        "touch ready; i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done",
    ]);
    if control {
        cmd.env("CLAUDEBOX_TEST_COMPANIONS_IN_CWD", "1");
    }
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !ready.exists() {
        assert!(t.elapsed() < LIMIT, "the sandbox did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let found = host_processes_of(child.id() as i32);
    fs::write(&go, "").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", lab::stderr(&o));
    found
}

/// The host-side processes (not in the sandbox: the same mount namespace as this
/// process) that descend from `launcher` or share its session id's children: the keeper,
/// the proxy, the credentials sync (each in a session of its own, children of the
/// launcher or of the keeper). (pid, comm, cwd).
fn host_processes_of(launcher: i32) -> Vec<(i32, String, Option<PathBuf>)> {
    let my_ns = fs::read_link("/proc/self/ns/mnt").unwrap();
    let stat = |pid: i32| fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    let ppid = |pid: i32| -> Option<i32> {
        let s = stat(pid)?;
        let after = &s[s.rfind(')')? + 2..];
        after.split(' ').nth(1)?.parse().ok()
    };
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == launcher {
            continue;
        }
        // A descendant of the launcher?
        let mut at = pid;
        let mut descends = false;
        for _ in 0..64 {
            match ppid(at) {
                Some(pp) if pp == launcher => {
                    descends = true;
                    break;
                }
                Some(pp) if pp > 1 => at = pp,
                _ => break,
            }
        }
        // In the sandbox: another mount namespace (a process that is not dumpable, whose
        // namespace cannot be read, is one of the host's: nothing inside is made so).
        let ns = fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        if !descends || ns.is_some_and(|n| n != my_ns) {
            continue;
        }
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        // Unreadable (None) for another user's process, and for one that is not
        // dumpable (the broker and its keeper) for anyone but root.
        let cwd = fs::read_link(format!("/proc/{pid}/cwd")).ok();
        // Gone or a zombie meanwhile (a sandbox's short `touch` whose namespace could no
        // longer be read: a CI run under load listed it as the host's, cwd unread).
        let ended = stat(pid).is_none_or(|s| {
            s.rfind(')')
                .and_then(|i| s.get(i + 2..i + 3))
                .is_none_or(|st| st == "Z" || st == "X")
        });
        if cwd.is_none() && ended {
            continue;
        }
        out.push((pid, comm.trim().to_string(), cwd));
    }
    out
}
