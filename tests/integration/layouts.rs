//! Every common install of the agents launches (issue 35): Claude Code and Codex laid out
//! as their installers lay them out, each holding a real conversation with the lab's mock
//! through claudebox: `sudo npm install -g` (/usr/local, where every launch failed with
//! bwrap's "Can't make symlink at /usr/local/bin/claude: File exists"), a user npm prefix,
//! nvm (on a machine whose only node is nvm's), pnpm, bun, the native installer's
//! `~/.local/bin`, Homebrew on Linux, a Nix profile, and a project-local `npm install`
//! run through the project's `node_modules/.bin` (the same failure: the link is in the
//! project, bound already).
//!
//! The trees come from `scripts/install-layouts.sh` (`CLAUDEBOX_TEST_LAYOUTS`; scripts/test
//! makes them, as root, once per cache), which says how each was made: by the installer
//! itself (npm, pnpm, bun) or reproduced (the native installer, Homebrew, Nix). None is
//! installed into the machine's own /usr/local, /home or /nix: each launch runs in a
//! private mount namespace whose root is the machine's with the tree laid over it
//! (`tests/lab/layout-root.sh`), as the test's user (root, or an ordinary user in a user
//! namespace mapping it back), with the world's home at /home/claudebox-layouts (pnpm
//! writes absolute paths into its install). Without the variable the tests fail, unless
//! `CLAUDEBOX_SKIP_E2E=1`.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::BIN;
use lab::agent::{codex_config, output_within, MockApi, OPENAI_KEY, OPENAI_KEY_VAR};
use lab::*;

/// The home the layouts are made for (scripts/install-layouts.sh's LAYOUT_HOME).
const HOME: &str = "/home/claudebox-layouts";
const LAYOUT_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab/layout-root.sh");
const LIMIT: Duration = Duration::from_secs(180);

/// The trees' directory, or `None` (skip) with `CLAUDEBOX_SKIP_E2E=1`.
fn layouts() -> Option<PathBuf> {
    match std::env::var_os("CLAUDEBOX_TEST_LAYOUTS") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ if std::env::var_os("CLAUDEBOX_SKIP_E2E").is_some_and(|v| v == "1") => {
            eprintln!("skipping: CLAUDEBOX_SKIP_E2E=1");
            None
        }
        _ => panic!(
            "CLAUDEBOX_TEST_LAYOUTS is not set: run the tests with scripts/test (which runs \
             scripts/install-layouts.sh as root), or set CLAUDEBOX_SKIP_E2E=1"
        ),
    }
}

/// One install: the mounts that lay it out (layout-root.sh's specs, `{L}` the trees'
/// directory, `{H}` the home), the links its installer makes in the home, PATH's
/// directories before the system's, and which agents it has.
struct Layout {
    name: &'static str,
    specs: Vec<String>,
    links: Vec<(String, String)>,
    path: Vec<String>,
    claude: bool,
    codex: bool,
}

/// A world run in a private root holding `layout`.
struct LayoutWorld {
    w: World,
    /// The project (a git repository; `{P}` in a layout).
    p: PathBuf,
    specs: Vec<String>,
    path: OsString,
}

impl LayoutWorld {
    fn new(l: &Layout, trees: &Path) -> LayoutWorld {
        let w = World::new_in(BIN, Path::new("/var/tmp"));
        // The world's fake claude would come first on PATH.
        fs::remove_file(w.bin().join("claude")).unwrap();
        let homes = w.root().join("homes");
        fs::create_dir_all(homes.join("claudebox-layouts")).unwrap();
        fs::create_dir_all(w.root().join("fakeroot")).unwrap();
        let p = w.dir("proj");
        init_repo(&p);
        let fill = |s: &str| {
            s.replace("{L}", &trees.to_string_lossy())
                .replace("{H}", HOME)
                .replace("{P}", &p.to_string_lossy())
        };
        let mut specs = vec![format!("over:{}:/home", homes.display())];
        let (overs, binds): (Vec<_>, Vec<_>) = l
            .specs
            .iter()
            .map(|s| fill(s))
            .partition(|s| s.starts_with("over:"));
        specs.extend(overs);
        specs.push(format!("bind:{}:{HOME}", w.home().display()));
        specs.extend(binds);
        for (link, target) in &l.links {
            let at = w
                .home()
                .join(fill(link).strip_prefix(&format!("{HOME}/")).unwrap());
            fs::create_dir_all(at.parent().unwrap()).unwrap();
            symlink(fill(target), at).unwrap();
        }
        let mut path: Vec<String> = l.path.iter().map(|p| fill(p)).collect();
        path.extend(["/usr/local/bin", "/usr/bin", "/bin"].map(String::from));
        LayoutWorld {
            w,
            p,
            specs,
            path: path.join(":").into(),
        }
    }

    /// `claudebox ARGS` in `cwd` as the world runs it, but in the layout's root, with the
    /// home at /home/claudebox-layouts and the layout's PATH.
    fn cmd(&self, cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
        let inner = self.w.cmd(cwd);
        let mut c = self.in_root(cwd);
        c.args(["env", "-i"]);
        for (k, v) in inner.get_envs() {
            let Some(v) = v else { continue };
            if k == "HOME" || k == "PATH" {
                continue;
            }
            let mut kv = k.to_os_string();
            kv.push("=");
            kv.push(v);
            c.arg(kv);
        }
        c.arg(format!("HOME={HOME}"));
        let mut p = OsString::from("PATH=");
        p.push(&self.path);
        c.arg(p);
        for (k, v) in env {
            c.arg(format!("{k}={v}"));
        }
        c.arg(BIN).args(args);
        c
    }

    /// The layout's root, as this test's user, in `cwd`: the command follows.
    fn in_root(&self, cwd: &Path) -> Command {
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let mut c = Command::new("unshare");
        c.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8");
        if uid != 0 {
            c.args(["--user", "--map-root-user"]);
        }
        c.args(["--mount", "--propagation", "private", "sh", LAYOUT_ROOT])
            .arg(self.w.root().join("fakeroot"))
            .arg(uid.to_string())
            .arg(gid.to_string())
            .arg(cwd)
            .args(&self.specs)
            .arg("--");
        c
    }

    fn run(&self, cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        output_within(&mut self.cmd(cwd, args, env), LIMIT)
            .unwrap_or_else(|e| panic!("claudebox {args:?}: {e}"))
    }
}

/// The layout's claude holds a conversation with a Bash call inside the sandbox.
fn claude_converses(l: &Layout, lw: &LayoutWorld, p: &Path) {
    let mock = MockApi::start(&serde_json::json!([
        {"bash": {"command": "echo LAYOUT-RAN-5521 > ran.txt", "description": "mark"}},
        "DONE-LAYOUT-8113"
    ]));
    let (url, key) = (mock.base_url(), lab::agent::API_KEY);
    let env = [
        ("ANTHROPIC_BASE_URL", url.as_str()),
        ("ANTHROPIC_API_KEY", key),
    ];
    let o = lw.run(p, &["-p", "go", "--allowedTools", "Bash"], &env);
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        o.status.success() && out.contains("DONE-LAYOUT-8113"),
        "[{}] claude: {:?}\n{out}{err}{}",
        l.name,
        o.status,
        mock.stderr()
    );
    assert_eq!(
        fs::read_to_string(p.join("ran.txt")).unwrap_or_default(),
        "LAYOUT-RAN-5521\n",
        "[{}] claude's Bash call did not run in the project",
        l.name
    );
}

/// The layout's codex holds a conversation with a shell call (Codex's own sandbox inside
/// ours as an ordinary user; as root it cannot nest, see e2e_codex).
fn codex_converses(l: &Layout, lw: &LayoutWorld, p: &Path) {
    let mock = MockApi::start_openai(&serde_json::json!([
        {"shell": "echo CODEX-LAYOUT-RAN-4242 > cx.txt; cat cx.txt"},
        "CODEX-DONE-7731"
    ]));
    let host_codex = lw.w.home().join(".codex");
    fs::create_dir_all(&host_codex).unwrap();
    fs::write(host_codex.join("config.toml"), codex_config(mock.port())).unwrap();
    let sandbox = if nix::unistd::geteuid().is_root() {
        "danger-full-access"
    } else {
        "workspace-write"
    };
    let o = lw.run(
        p,
        &[
            "--agent",
            "codex",
            "exec",
            "--json",
            "--sandbox",
            sandbox,
            "PROMPT-LAYOUT",
        ],
        &[(OPENAI_KEY_VAR, OPENAI_KEY)],
    );
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        o.status.success() && out.contains("CODEX-DONE-7731"),
        "[{}] codex: {:?}\n{out}{err}{}",
        l.name,
        o.status,
        mock.stderr()
    );
    assert_eq!(
        fs::read_to_string(p.join("cx.txt")).unwrap_or_default(),
        "CODEX-LAYOUT-RAN-4242\n",
        "[{}] codex's shell call did not run in the project",
        l.name
    );
}

/// Runs the layout's agents; returns the world for more checks.
fn converse(l: Layout) -> Option<(LayoutWorld, PathBuf)> {
    let trees = layouts()?;
    let _busy = busy();
    let lw = LayoutWorld::new(&l, &trees);
    let p = lw.p.clone();
    if l.claude {
        claude_converses(&l, &lw, &p);
    }
    if l.codex {
        codex_converses(&l, &lw, &p);
    }
    Some((lw, p))
}

fn layout(name: &'static str, specs: &[&str], path: &[&str]) -> Layout {
    Layout {
        name,
        specs: specs.iter().map(|s| s.to_string()).collect(),
        links: Vec::new(),
        path: path.iter().map(|s| s.to_string()).collect(),
        claude: true,
        codex: true,
    }
}

/// `sudo npm install -g`: /usr/local/bin/claude is npm's link in the read-only system.
/// Control: making that link again, as the plan did, is what bwrap refuses.
#[test]
fn sudo_npm_install_g_in_usr_local() {
    let l = layout("/usr/local", &["over:{L}/npm-prefix:/usr/local"], &[]);
    let Some((lw, p)) = converse(l) else { return };
    // --check's probe sandbox runs it too (it failed there the same way, and pointed at
    // the kernel log).
    let o = lw.run(&p, &["--check"], &[]);
    let check = format!("{}{}", stdout(&o), stderr(&o));
    let row = check
        .lines()
        .find(|l| l.contains("claude in sandbox"))
        .unwrap_or_default();
    assert!(
        row.contains("runs:") && row.contains("Claude Code"),
        "[{}] --check:\n{check}",
        "/usr/local"
    );
    let row = check
        .lines()
        .find(|l| l.contains("sandbox") && l.contains("starts"));
    assert!(row.is_some(), "[{}] --check:\n{check}", "/usr/local");
    let o = lw.run(&p, &["--dry-run"], &[]);
    let dry = stdout(&o);
    let pkg = "/usr/local/lib/node_modules/@anthropic-ai/claude-code";
    assert!(dry.contains(pkg), "{dry}");
    // The host's own link is seen inside through the system: none is made over it.
    let words: Vec<&str> = dry.split_whitespace().collect();
    assert!(
        !words
            .windows(3)
            .any(|w| w[0] == "--symlink" && w[2] == "/usr/local/bin/claude")
            && dry.contains(&format!("--ro-bind {pkg} {pkg}")),
        "{dry}"
    );
    // Control: the link made again over the system, as the plan did, is what bwrap
    // refused at every launch.
    let mut control = lw.in_root(&p);
    control.arg(which_bwrap()).args([
        "--unshare-user",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "../lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe",
        "/usr/local/bin/claude",
        "true",
    ]);
    let o = output_within(&mut control, LIMIT).unwrap();
    assert!(
        !o.status.success() && stderr(&o).contains("File exists"),
        "the control did not fail as launches did: {}",
        stderr(&o)
    );
}

fn which_bwrap() -> PathBuf {
    ["/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("bwrap")
}

/// A project-local install (`npm install` in the project) run through its
/// `node_modules/.bin` on PATH: the link is in the project, bound already.
#[test]
fn npm_install_in_the_project() {
    converse(layout(
        "project-local",
        &["bind:{L}/project-local/node_modules:{P}/node_modules"],
        &["{P}/node_modules/.bin"],
    ));
}

/// A user prefix (`npm config set prefix ~/.npm-global`, then `npm install -g`).
#[test]
fn npm_install_g_into_a_user_prefix() {
    converse(layout(
        "~/.npm-global",
        &["bind:{L}/npm-prefix:{H}/.npm-global"],
        &["{H}/.npm-global/bin"],
    ));
}

/// nvm: the agents in ~/.nvm/versions/node/vX/bin, and node only there (the system's
/// hidden): Codex's launcher (`#!/usr/bin/env node`) finds nvm's node inside.
#[test]
fn nvm_with_no_system_node() {
    let Some(trees) = layouts() else { return };
    let v = fs::read_to_string(trees.join("nvm/alias-default")).unwrap();
    let bin = format!("{{H}}/.nvm/versions/node/{}/bin", v.trim());
    let Some((lw, p)) = converse(layout(
        "nvm",
        &["bind:{L}/nvm:{H}/.nvm", "hide:/usr/bin/node"],
        &[&bin],
    )) else {
        return;
    };
    let dry = stdout(&lw.run(&p, &["--agent", "codex", "--dry-run"], &[]));
    let node = format!("{HOME}/.nvm/versions/node/{}/bin/node", v.trim());
    assert!(
        dry.contains(&format!("--ro-bind {node} {node}")) && dry.contains("interpreter"),
        "{dry}"
    );
    // Control: the system's node is not there to stand in for nvm's.
    let o = lw.run(&p, &["--exec", "/usr/bin/node", "--version"], &[]);
    assert!(!o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

/// pnpm's global install: its shims in ~/.local/share/pnpm/bin exec the packages in its
/// store; the pnpm home is bound.
#[test]
fn pnpm_add_g() {
    let Some((lw, p)) = converse(layout(
        "pnpm",
        &["bind:{L}/pnpm:{H}/.local/share/pnpm"],
        &["{H}/.local/share/pnpm/bin"],
    )) else {
        return;
    };
    let dry = stdout(&lw.run(&p, &["--dry-run"], &[]));
    let pnpm = format!("{HOME}/.local/share/pnpm");
    assert!(dry.contains(&format!("--ro-bind {pnpm} {pnpm}")), "{dry}");
}

/// pnpm's global install with nvm's node alone (a common pair): Codex's shim execs
/// `node` by name, found on PATH in nvm's bin, bound for it.
#[test]
fn pnpm_add_g_with_nvms_node() {
    let Some(trees) = layouts() else { return };
    let v = fs::read_to_string(trees.join("nvm/alias-default")).unwrap();
    let bin = format!("{{H}}/.nvm/versions/node/{}/bin", v.trim());
    let mut l = layout(
        "pnpm + nvm",
        &[
            "bind:{L}/pnpm:{H}/.local/share/pnpm",
            "bind:{L}/nvm:{H}/.nvm",
            "hide:/usr/bin/node",
        ],
        &["{H}/.local/share/pnpm/bin", &bin],
    );
    l.claude = false;
    let Some((lw, p)) = converse(l) else { return };
    // Control: with claude's installation planned (its shim execs its binary, no node)
    // nvm's node is not inside, and the system's is hidden.
    let node = ["--exec", "sh", "-c", "node --version"];
    let o = lw.run(&p, &node, &[]);
    assert!(!o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let o = lw.run(&p, &[&["--agent", "codex"][..], &node].concat(), &[]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

/// bun's global install: ~/.bun/bin/claude links into ~/.bun/install/global.
#[test]
fn bun_add_g() {
    converse(layout("bun", &["bind:{L}/bun:{H}/.bun"], &["{H}/.bun/bin"]));
}

/// The native installer: ~/.local/bin/claude -> ~/.local/share/claude/versions/VER (an
/// absolute link). Claude only: Codex has no such installer.
#[test]
fn the_native_installers_local_bin() {
    let mut l = layout(
        "native",
        &["bind:{L}/native/share/claude:{H}/.local/share/claude"],
        &["{H}/.local/bin"],
    );
    l.links = vec![(
        "{H}/.local/bin/claude".into(),
        "{H}/.local/share/claude/versions/2.1.197".into(),
    )];
    l.codex = false;
    converse(l);
}

/// Homebrew on Linux: claude through brew's npm, codex as brew's formula, node in the
/// Cellar behind bin/node.
#[test]
fn homebrew_on_linux() {
    converse(layout(
        "linuxbrew",
        &["over:{L}/linuxbrew-home:/home"],
        &[
            "/home/linuxbrew/.linuxbrew/bin",
            "/home/linuxbrew/.linuxbrew/sbin",
        ],
    ));
}

/// A Nix profile: ~/.nix-profile/bin/claude through the profile links into /nix/store,
/// claude a wrapper script whose shell is in the store.
#[test]
fn a_nix_profile() {
    let mut l = layout("nix", &["bind:{L}/nix:/nix"], &["{H}/.nix-profile/bin"]);
    l.links = vec![(
        "{H}/.nix-profile".into(),
        "/nix/var/nix/profiles/per-user/user/profile".into(),
    )];
    converse(l);
}
