//! Package caches across sessions of a project (issue 35): the home inside is empty, so
//! each cache of `policy::caches::TABLE` is the project's own directory in the state,
//! mounted at its path. A first session's online `npm ci` fills `~/.npm`; a second
//! session's `npm ci --offline` installs from it. Control: with a state of its own (no
//! cache) the same offline install fails (ENOTCACHED). The host's `~/.npm` is never made.
//! Needs the npm registry (one 9 KB package); without it the test says so and stops.

use std::fs;
use std::path::Path;

use crate::BIN;
use lab::*;

const PACKAGE: &str = r#"{"name": "t", "version": "1.0.0", "dependencies": {"is-number": "7.0.0"}}
"#;
const LOCK: &str = r#"{
  "name": "t",
  "version": "1.0.0",
  "lockfileVersion": 3,
  "requires": true,
  "packages": {
    "": {"name": "t", "version": "1.0.0", "dependencies": {"is-number": "7.0.0"}},
    "node_modules/is-number": {
      "version": "7.0.0",
      "resolved": "https://registry.npmjs.org/is-number/-/is-number-7.0.0.tgz",
      "integrity": "sha512-41Cifkg6e8TylSpdtTpeLVMqvSBEVzTttHvERD741+pnZ8ANv0004MRL43QKPDlK9cGvNp6NZWZUBlbGXYxxng==",
      "license": "MIT",
      "engines": {"node": ">=0.12.0"}
    }
  }
}
"#;

fn npm_ci(w: &World, p: &Path, state: &Path, offline: bool) -> std::process::Output {
    let script = format!(
        "npm ci --no-audit --no-fund --no-update-notifier{} && test -f node_modules/is-number/package.json && echo INSTALLED",
        if offline { " --offline" } else { "" }
    );
    w.cmd(p)
        .env("CLAUDEBOX_HOME", state)
        .args(["--exec", "sh", "-c", &script])
        .output()
        .unwrap()
}

#[test]
fn a_second_sessions_offline_npm_ci_installs_from_the_projects_cache() {
    if which("npm").is_none() {
        panic!("npm is not installed (.ci/run installs it)");
    }
    let w = World::new(BIN);
    let p = w.dir("proj");
    init_repo(&p);
    fs::write(p.join("package.json"), PACKAGE).unwrap();
    fs::write(p.join("package-lock.json"), LOCK).unwrap();
    let state = w.state();
    let first = npm_ci(&w, &p, &state, false);
    if !stdout(&first).contains("INSTALLED") {
        let err = stderr(&first);
        if [
            "ENOTFOUND",
            "EAI_AGAIN",
            "ECONNREFUSED",
            "ETIMEDOUT",
            "ECONNRESET",
        ]
        .iter()
        .any(|e| err.contains(e))
        {
            eprintln!("skipped: the npm registry cannot be reached: {err}");
            return;
        }
        panic!("the first, online npm ci failed: {}{err}", stdout(&first));
    }
    fs::remove_dir_all(p.join("node_modules")).unwrap();
    let second = npm_ci(&w, &p, &state, true);
    assert!(
        stdout(&second).contains("INSTALLED"),
        "the offline npm ci of a second session: {}{}",
        stdout(&second),
        stderr(&second)
    );
    assert!(
        !w.home().join(".npm").exists(),
        "the host's ~/.npm was made"
    );
    // Control: no cache (a state of its own), the same offline install fails.
    fs::remove_dir_all(p.join("node_modules")).unwrap();
    let fresh = w.root().join("fresh-state");
    let control = npm_ci(&w, &p, &fresh, true);
    assert!(
        !stdout(&control).contains("INSTALLED") && stderr(&control).contains("ENOTCACHED"),
        "control: installed offline without a cache: {}{}",
        stdout(&control),
        stderr(&control)
    );
    // --dry-run names the caches and their variables.
    let dry = dry_run(&w, &p);
    for s in [
        "caches/npm",
        "/.npm\t",
        "npm_config_cache=",
        "caches/cargo-registry",
        "caches/pip",
        "GOMODCACHE=",
    ] {
        assert!(dry.contains(s), "--dry-run lacks {s}:\n{dry}");
    }
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([std::path::PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
