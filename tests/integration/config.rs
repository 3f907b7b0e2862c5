//! The config file and the matching command-line options, tested through real bwrap with
//! the fake claude reporting from inside: extra mounts, hidden paths, environment, the
//! network switch, per-project sections, origins in `--dry-run`, invalid files, and the
//! attempts of a project (or the agent) to widen its own sandbox.

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::BIN;
use lab::*;

/// `XDG_CONFIG_HOME` for these tests: outside the World's HOME.
fn xdg(w: &World) -> PathBuf {
    w.root().join("xdg")
}

fn config_path(w: &World) -> PathBuf {
    xdg(w).join("claudebox/config.toml")
}

fn write_config(w: &World, text: &str) -> PathBuf {
    let p = config_path(w);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, text).unwrap();
    p
}

/// A path as a TOML basic string.
fn q(p: &Path) -> String {
    let s = p.to_str().unwrap();
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn cmd(w: &World, cwd: &Path) -> Command {
    let mut c = w.cmd(cwd);
    c.env("XDG_CONFIG_HOME", xdg(w));
    c
}

fn run(w: &World, cwd: &Path, args: &[&str], script: &str) -> Output {
    cmd(w, cwd)
        .args(args)
        .env("FAKE_CLAUDE_SCRIPT", script)
        .output()
        .unwrap()
}

/// Runs and returns what the fake agent printed, asserting success.
fn inside(w: &World, cwd: &Path, args: &[&str], script: &str) -> String {
    ok(&run(w, cwd, args, script))
}

/// Asserts that claudebox refused with one line containing `want`, ran nothing and
/// created nothing.
#[track_caller]
fn refused(w: &World, o: &Output, want: &str) -> String {
    let err = stderr(o);
    assert!(
        !o.status.success(),
        "expected a refusal, got success:\n{err}"
    );
    assert_eq!(err.lines().count(), 1, "not one line:\n{err}");
    assert!(err.starts_with("claudebox: "), "{err}");
    assert!(err.contains(want), "expected {want:?} in:\n{err}");
    assert!(!stdout(o).contains("FAKE-CLAUDE-START"), "claude ran");
    assert!(!w.state().exists(), "the state directory was created");
    err
}

fn data_dir(w: &World, name: &str) -> PathBuf {
    let d = w.dir(name);
    fs::write(d.join("f"), format!("content of {name}\n")).unwrap();
    d
}

#[test]
fn ro_path_is_visible_and_not_writable() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let a = data_dir(&w, "a");
    let b = data_dir(&w, "b");
    write_config(&w, &format!("ro = [{}]\n", q(&a)));
    let script = format!(
        "cat {a}/f {b}/f; for d in {a} {b}; do touch $d/new 2>/dev/null && echo WROTE $d; done; \
         echo DONE",
        a = a.display(),
        b = b.display()
    );
    let out = inside(&w, &p, &["--ro", b.to_str().unwrap()], &script);
    assert!(
        out.contains("content of a") && out.contains("content of b"),
        "{out}"
    );
    assert!(!out.contains("WROTE") && out.contains("DONE"), "{out}");
    assert!(!a.join("new").exists() && !b.join("new").exists());
}

#[test]
fn without_ro_the_path_is_invisible() {
    // The same directory as above is not there unless listed: the test can fail.
    let w = World::new(BIN);
    let p = w.dir("p");
    let a = data_dir(&w, "a");
    let out = inside(
        &w,
        &p,
        &[],
        &format!("cat {}/f || echo ABSENT", a.display()),
    );
    assert!(
        out.contains("ABSENT") && !out.contains("content of a"),
        "{out}"
    );
}

#[test]
fn rw_path_is_writable() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let a = data_dir(&w, "a");
    let b = data_dir(&w, "b");
    write_config(&w, &format!("rw = [{}]\n", q(&a)));
    let script = format!(
        "echo from-inside > {a}/made && echo from-inside > {b}/made && echo WROTE-BOTH",
        a = a.display(),
        b = b.display()
    );
    let out = inside(&w, &p, &["--rw", b.to_str().unwrap()], &script);
    assert!(out.contains("WROTE-BOTH"), "{out}");
    assert_eq!(fs::read_to_string(a.join("made")).unwrap(), "from-inside\n");
    assert_eq!(fs::read_to_string(b.join("made")).unwrap(), "from-inside\n");
}

#[test]
fn hidden_paths_show_nothing() {
    let w = World::new(BIN);
    let p = w.dir("p");
    fs::create_dir_all(p.join("secret")).unwrap();
    fs::write(p.join("secret/key"), "SECRET-KEY\n").unwrap();
    fs::write(p.join(".env"), "TOKEN=SECRET-TOKEN\n").unwrap();
    fs::write(p.join("ok"), "visible\n").unwrap();
    let data = data_dir(&w, "data");
    fs::create_dir_all(data.join("private")).unwrap();
    fs::write(data.join("private/x"), "SECRET-PRIVATE\n").unwrap();
    write_config(
        &w,
        &format!(
            "ro = [{data}]\nhide = [{secret}, {env}]\n",
            data = q(&data),
            secret = q(&p.join("secret")),
            env = q(&p.join(".env")),
        ),
    );
    let script = format!(
        "cat ok {d}/f; cat secret/key .env {d}/private/x 2>/dev/null; \
         echo entries=$(ls -A secret | wc -l); echo env-bytes=$(wc -c < .env); \
         rm -f .env 2>/dev/null; echo x >> .env; echo DONE",
        d = data.display()
    );
    let hide_private = data.join("private");
    let out = inside(&w, &p, &["--hide", hide_private.to_str().unwrap()], &script);
    assert!(
        out.contains("visible") && out.contains("content of data"),
        "{out}"
    );
    assert!(!out.contains("SECRET"), "{out}");
    assert!(
        out.contains("entries=0") && out.contains("env-bytes=0"),
        "{out}"
    );
    // Writing to the hidden file goes nowhere; the real one is untouched.
    assert_eq!(
        fs::read_to_string(p.join(".env")).unwrap(),
        "TOKEN=SECRET-TOKEN\n"
    );
    assert!(p.join("secret/key").exists());
}

#[test]
fn environment_set_and_passed() {
    let w = World::new(BIN);
    let p = w.dir("p");
    write_config(
        &w,
        "pass_env = [\"HOST_A\", \"HOST_UNSET\"]\n\
         [env]\nFROM_CONFIG = \"c v\"\nBOTH = \"config\"\n",
    );
    let args = [
        "--env",
        "BOTH=cli",
        "--env",
        "SET_ME=s=1",
        "--env",
        "HOST_B",
        "--env",
        "MISSING",
    ];
    let script = "echo \"FC=$FROM_CONFIG|BOTH=$BOTH|SM=$SET_ME|HA=$HOST_A|HB=$HOST_B|\
                  M=${MISSING-unset}|HU=${HOST_UNSET-unset}\"";
    let out = ok(&cmd(&w, &p)
        .args(args)
        .env("HOST_A", "ha")
        .env("HOST_B", "hb")
        .env("FAKE_CLAUDE_SCRIPT", script)
        .output()
        .unwrap());
    assert!(
        out.contains("FC=c v|BOTH=cli|SM=s=1|HA=ha|HB=hb|M=unset|HU=unset"),
        "{out}"
    );
    // Passed explicitly: claudebox sets them itself, so the hardening that strips host
    // variables cannot drop them.
    let dry = ok(&cmd(&w, &p)
        .arg("--dry-run")
        .args(args)
        .env("HOST_A", "ha")
        .env("HOST_B", "hb")
        .output()
        .unwrap());
    assert!(dry.contains("set\tHOST_B=hb\tcommand line"), "{dry}");
    assert!(
        dry.contains(&format!(
            "set\tHOST_A=ha\tconfig {}:1",
            config_path(&w).display()
        )),
        "{dry}"
    );
    assert_eq!(env_in_dry_run(&dry, "BOTH").as_deref(), Some("cli"));
    assert!(!dry.contains("BOTH=config"), "{dry}");
}

#[test]
fn claudebox_variables_cannot_be_overridden() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let o = run(&w, &p, &["--env", "CLAUDEBOX_PROJECT_ROOT=/etc"], "");
    refused(
        &w,
        &o,
        "--env CLAUDEBOX_PROJECT_ROOT=/etc: CLAUDEBOX_PROJECT_ROOT is set by claudebox itself",
    );
}

/// Connects from inside to a listener the test holds on the host's 127.0.0.1.
fn connect_script(port: u16) -> String {
    format!(
        "if bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null; \
         then echo NET-CONNECTED; else echo NET-REFUSED; fi"
    )
}

#[test]
fn network_switch() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let script = connect_script(listener.local_addr().unwrap().port());
    let w = World::new(BIN);
    let p = w.dir("p");
    let net = |args: &[&str]| {
        let out = inside(&w, &p, args, &script);
        assert!(out.contains("NET-"), "{out}");
        out.contains("NET-CONNECTED")
    };
    assert!(net(&[]), "open by default");
    assert!(!net(&["--no-network"]));
    assert!(!net(&["--network", "none"]));
    write_config(&w, "network = \"none\"\n");
    assert!(!net(&[]), "network = none in the config file");
    assert!(net(&["--network", "open"]), "the command line wins");
    write_config(&w, "network = \"open\"\n");
    assert!(!net(&["--no-network"]), "the command line wins");
    drop(listener);
}

#[test]
fn no_network_and_network_conflict() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let o = run(&w, &p, &["--no-network", "--network", "open"], "");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
    assert!(!w.state().exists());
}

#[test]
fn command_line_replaces_the_config_entry_for_the_same_path() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let a = data_dir(&w, "a");
    write_config(&w, &format!("rw = [{}]\n", q(&a)));
    let script = format!(
        "touch {}/new 2>/dev/null && echo WROTE; echo DONE",
        a.display()
    );
    let out = inside(&w, &p, &["--ro", a.to_str().unwrap()], &script);
    assert!(out.contains("DONE") && !out.contains("WROTE"), "{out}");
    let out = inside(&w, &p, &[], &script);
    assert!(out.contains("WROTE"), "{out}");
}

#[test]
fn a_parent_of_the_project_read_only_keeps_the_project_writable() {
    let w = World::new(BIN);
    let p = w.dir("src/p");
    let sibling = data_dir(&w, "src/other");
    let vendor = w.dir("src/p/vendor");
    write_config(
        &w,
        &format!("ro = [{}, {}]\n", q(&vendor), q(&w.work().join("src"))),
    );
    let script = format!(
        "cat {s}/f; touch {s}/x 2>/dev/null && echo SIBLING-WROTE; \
         touch vendor/x 2>/dev/null && echo VENDOR-WROTE; \
         echo hi > mine && echo PROJECT-WROTE",
        s = sibling.display()
    );
    let out = inside(&w, &p, &[], &script);
    assert!(out.contains("content of src/other"), "{out}");
    assert!(out.contains("PROJECT-WROTE"), "{out}");
    assert!(
        !out.contains("SIBLING-WROTE") && !out.contains("VENDOR-WROTE"),
        "{out}"
    );
}

#[test]
fn claude_args_come_first() {
    let w = World::new(BIN);
    let p = w.dir("p");
    write_config(
        &w,
        &format!(
            "claude_args = [\"--model\", \"opus\"]\n[[project]]\nroot = {}\nclaude_args = [\"--effort\", \"high\"]\n",
            q(&p)
        ),
    );
    let out = inside(&w, &p, &["mcp", "list"], "");
    let args = fake_args(&out);
    assert_eq!(
        args[2..],
        ["--model", "opus", "--effort", "high", "mcp", "list"]
    );
    // Not for --exec.
    let out = inside(
        &w,
        &p,
        &["--exec", "sh", "-c", "echo EXEC-ARGS \"$@\"", "x", "a"],
        "",
    );
    assert!(out.contains("EXEC-ARGS a\n"), "{out}");
}

#[test]
fn per_project_sections_apply_only_to_their_project() {
    let w = World::new(BIN);
    let a = w.work().join("a");
    init_repo(&a);
    fs::create_dir_all(a.join("sub")).unwrap();
    let b = w.work().join("b");
    init_repo(&b);
    let a_evil = w.work().join("a-evil");
    init_repo(&a_evil);
    let nested = a.join("nested");
    init_repo(&nested);
    let wt = w.work().join("a-wt");
    git(&a, &["worktree", "add", "-q", wt.to_str().unwrap()]);
    let plain = w.dir("plain");
    let secret = data_dir(&w, "granted");
    write_config(
        &w,
        &format!(
            "[[project]]\nroot = {a}\nro = [{s}]\nenv = {{ SECTION = \"a\" }}\n\n\
             [[project]]\nroot = \"/nonexistent/project\"\nro = [\"/nonexistent/x\"]\n\n\
             [[project]]\nroot = {plain}\nenv = {{ SECTION = \"plain\" }}\n",
            a = q(&a),
            s = q(&secret),
            plain = q(&plain)
        ),
    );
    let script = format!(
        "cat {}/f 2>/dev/null || echo NOT-GRANTED; echo \"SECTION=${{SECTION-none}}\"",
        secret.display()
    );
    for (cwd, granted) in [
        (a.clone(), true),
        (a.join("sub"), true),
        (wt.clone(), true),
        (b.clone(), false),
        (a_evil.clone(), false),
        (nested.clone(), false),
    ] {
        let out = inside(&w, &cwd, &[], &script);
        assert_eq!(
            out.contains("content of granted"),
            granted,
            "{}: {out}",
            cwd.display()
        );
        assert_eq!(
            out.contains("SECTION=a"),
            granted,
            "{}: {out}",
            cwd.display()
        );
    }
    let out = inside(&w, &plain, &[], &script);
    assert!(
        out.contains("NOT-GRANTED") && out.contains("SECTION=plain"),
        "{out}"
    );
}

#[test]
fn a_project_section_can_name_the_git_dir() {
    let w = World::new(BIN);
    let a = w.work().join("a");
    init_repo(&a);
    write_config(
        &w,
        &format!(
            "[[project]]\nroot = {}\nnetwork = \"none\"\n",
            q(&a.join(".git"))
        ),
    );
    let dry = ok(&cmd(&w, &a).arg("--dry-run").output().unwrap());
    assert!(
        dry.contains(&format!(
            "network\tnone\tconfig {}:3",
            config_path(&w).display()
        )),
        "{dry}"
    );
}

#[test]
fn a_planted_git_file_does_not_join_a_configured_project() {
    // A downloaded directory whose `.git` file points at the configured repository is
    // not one of its work trees: the section's grants do not apply.
    let w = World::new(BIN);
    let a = w.work().join("a");
    init_repo(&a);
    let evil = w.dir("evil");
    fs::write(evil.join(".git"), "gitdir: ../a/.git\n").unwrap();
    let secret = data_dir(&w, "granted");
    write_config(
        &w,
        &format!("[[project]]\nroot = {}\nro = [{}]\n", q(&a), q(&secret)),
    );
    let script = format!("cat {}/f 2>/dev/null || echo NOT-GRANTED", secret.display());
    // without --yes the launch refuses the foreign git dir outright (tests/integration/identity.rs);
    // with it, the section still does not apply
    let out = inside(&w, &evil, &["--yes"], &script);
    assert!(out.contains("NOT-GRANTED"), "{out}");
    let out = inside(&w, &a, &[], &script);
    assert!(out.contains("content of granted"), "{out}");
}

#[test]
fn files_inside_the_project_are_never_read_as_configuration() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let w = World::new(BIN);
    let ssh = w.home().join(".ssh");
    fs::create_dir_all(&ssh).unwrap();
    fs::write(ssh.join("id_ed25519"), "PRIVATE-KEY\n").unwrap();
    let p = w.work().join("cloned");
    init_repo(&p);
    let planted = format!(
        "ro = [\"~/.ssh\", {ssh}]\nnetwork = \"open\"\nenv = {{ PLANTED = \"1\" }}\n",
        ssh = q(&ssh)
    );
    for f in [
        ".claudebox.toml",
        "claudebox.toml",
        ".claudebox/config.toml",
        ".config/claudebox/config.toml",
        "config.toml",
    ] {
        let path = p.join(f);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, &planted).unwrap();
    }
    write_config(&w, "network = \"none\"\n");
    let script = format!(
        "cat ~/.ssh/id_ed25519 {ssh}/id_ed25519 2>/dev/null; echo \"PLANTED=${{PLANTED-no}}\"; {}",
        connect_script(listener.local_addr().unwrap().port()),
        ssh = ssh.display()
    );
    for cwd in [p.clone(), p.join(".config/claudebox"), p.join(".claudebox")] {
        // With XDG_CONFIG_HOME set, and with it unset (~/.config of the real home).
        for xdg_set in [true, false] {
            let mut c = if xdg_set { cmd(&w, &cwd) } else { w.cmd(&cwd) };
            let o = c.env("FAKE_CLAUDE_SCRIPT", &script).output().unwrap();
            let out = ok(&o);
            assert!(!out.contains("PRIVATE-KEY"), "{out}");
            assert!(out.contains("PLANTED=no"), "{out}");
            if xdg_set {
                assert!(out.contains("NET-REFUSED"), "{out}");
            }
        }
    }
}

#[test]
fn the_agent_cannot_read_or_change_its_own_configuration() {
    let w = World::new(BIN);
    let p = w.dir("p");
    // The default location, ~/.config/claudebox, in the real home.
    let default_cfg = w.home().join(".config/claudebox/config.toml");
    fs::create_dir_all(default_cfg.parent().unwrap()).unwrap();
    let original = "network = \"none\"\n";
    fs::write(&default_cfg, original).unwrap();
    let attack = |cfg: &Path| {
        format!(
            "cat {c} 2>/dev/null && echo CONFIG-READ; \
             mkdir -p {d} && printf 'network = \"open\"\\nro = [\"~/.ssh\"]\\n' > {c} \
             && echo WROTE-SOMEWHERE; true",
            c = cfg.display(),
            d = cfg.parent().unwrap().display()
        )
    };
    let out = ok(&w
        .cmd(&p)
        .env("FAKE_CLAUDE_SCRIPT", attack(&default_cfg))
        .output()
        .unwrap());
    assert!(!out.contains("CONFIG-READ"), "{out}");
    assert_eq!(fs::read_to_string(&default_cfg).unwrap(), original);
    // And under XDG_CONFIG_HOME.
    let cfg = write_config(&w, original);
    let out = inside(&w, &p, &[], &attack(&cfg));
    assert!(!out.contains("CONFIG-READ"), "{out}");
    assert_eq!(fs::read_to_string(&cfg).unwrap(), original);
}

#[test]
fn a_config_file_the_sandbox_could_write_is_refused() {
    let w = World::new(BIN);
    let p = w.work().join("dotfiles");
    init_repo(&p);
    let o = w
        .cmd(&p)
        .env("XDG_CONFIG_HOME", p.join("config"))
        .output()
        .unwrap();
    refused(&w, &o, "which the sandbox can write");
}

#[test]
fn mounts_that_would_break_the_sandbox_are_refused() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let home = w.home();
    fs::create_dir_all(home.join(".config/claudebox")).unwrap();
    fs::create_dir_all(home.join(".claude/projects")).unwrap();
    fs::write(home.join(".claude.json"), "{}").unwrap();
    let home_s = home.display().to_string();
    let parent = home.parent().unwrap().display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--rw", "/"], "would cover the whole home directory"),
        (&["--ro", &home_s], "would cover the whole home directory"),
        (&["--ro", "~"], "would cover the whole home directory"),
        (&["--hide", &parent], "would cover the whole home directory"),
        (&["--rw", "~/.config"], "rewrite its own configuration"),
        (
            &["--rw", "~/.config/claudebox"],
            "rewrite its own configuration",
        ),
        (&["--ro", "~/.claude"], "claudebox manages"),
        (&["--hide", "~/.claude/projects"], "claudebox manages"),
        (&["--rw", "~/.claude.json"], "claudebox manages"),
        (&["--ro", "/nonexistent/x"], "/nonexistent/x does not exist"),
        (
            &["--hide", "/nonexistent/x"],
            "/nonexistent/x does not exist",
        ),
    ];
    for (args, want) in cases {
        // XDG_CONFIG_HOME unset: the config file is ~/.config/claudebox/config.toml.
        refused(&w, &w.cmd(&p).args(*args).output().unwrap(), want);
    }
    // The state directory (elsewhere here, so that `refused` can check ~/.claudebox).
    let state = w.dir("state");
    let o = cmd(&w, &p)
        .env("CLAUDEBOX_HOME", &state)
        .args(["--rw", state.to_str().unwrap()])
        .output()
        .unwrap();
    refused(&w, &o, "change claudebox's state");
    assert!(!state.join("projects").exists());
    // Read-only is fine: the user asked to show it.
    let out = inside(&w, &p, &["--ro", "~/.config"], "echo RAN");
    assert!(out.contains("RAN"), "{out}");
}

#[test]
fn a_symlink_the_agent_could_have_planted_is_refused() {
    let w = World::new(BIN);
    let p = w.work().join("p");
    init_repo(&p);
    let ssh = w.home().join(".ssh");
    fs::create_dir_all(&ssh).unwrap();
    fs::write(ssh.join("id_ed25519"), "PRIVATE-KEY\n").unwrap();
    // The user protects `vendor` with ro; the agent replaced it with a symlink.
    symlink(&ssh, p.join("vendor")).unwrap();
    write_config(&w, &format!("ro = [{}]\n", q(&p.join("vendor"))));
    let o = run(&w, &p, &[], "cat vendor/id_ed25519");
    let err = refused(&w, &o, "goes through the symlink");
    assert!(
        err.contains(&format!("{}:1:7:", config_path(&w).display())),
        "{err}"
    );
    // Same for hide: the agent could point it at a decoy.
    write_config(&w, &format!("hide = [{}]\n", q(&p.join("vendor"))));
    refused(&w, &run(&w, &p, &[], ""), "goes through the symlink");
    // A symlink the user made outside anything writable is fine: ~/link -> data.
    let data = data_dir(&w, "data");
    symlink(&data, w.home().join("link")).unwrap();
    write_config(&w, "ro = [\"~/link\"]\n");
    let out = inside(&w, &p, &[], "cat ~/link/f");
    assert!(out.contains("content of data"), "{out}");
}

#[test]
fn invalid_config_files_name_file_line_and_column() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let cfg = config_path(&w);
    let c = cfg.display();
    let cases: Vec<(String, String)> = vec![
        ("ro = [\n".into(), format!("{c}:1:7: unclosed array")),
        (
            "ro = []\nrox = []\n".into(),
            format!("{c}:2:1: unknown field `rox`"),
        ),
        (
            "network = 1\n".into(),
            format!(
                "{c}:1:11: invalid type: integer `1`, expected \"open\", \"allowlist\" or \"none\""
            ),
        ),
        (
            "network = \"off\"\n".into(),
            format!("{c}:1:11: invalid value"),
        ),
        (
            "ro = \"/tmp\"\n".into(),
            format!("{c}:1:6: invalid type: string \"/tmp\", expected a sequence"),
        ),
        (
            "\nro = [\"/nonexistent/x\"]\n".into(),
            format!("{c}:2:7: /nonexistent/x does not exist"),
        ),
        (
            "rw = [\"relative/x\"]\n".into(),
            format!("{c}:1:7: `relative/x` is a relative path"),
        ),
        (
            "ro = [\"~root/x\"]\n".into(),
            format!("{c}:1:7: `~root/x`: only `~` and `~/...` are expanded"),
        ),
        (
            "[env]\n\"A=B\" = \"x\"\n".into(),
            format!("{c}:2:1: not a valid environment variable name"),
        ),
        (
            "[[project]]\nrw = []\n".into(),
            format!("{c}:1:1: this [[project]] section has no `root`"),
        ),
        (
            "root = \"/x\"\n".into(),
            format!("{c}:1:8: `root` belongs in a [[project]] section"),
        ),
        (
            format!(
                "[[project]]\nroot = {}\nhide = [\"/nonexistent/y\"]\n",
                q(&p)
            ),
            format!("{c}:3:9: /nonexistent/y does not exist"),
        ),
        (
            "[[project]]\nroot = \"rel\"\n".into(),
            format!("{c}:2:8: `rel` is a relative path"),
        ),
    ];
    for (text, want) in cases {
        write_config(&w, &text);
        refused(&w, &run(&w, &p, &[], ""), &want);
        refused(&w, &run(&w, &p, &["--dry-run"], ""), &want);
    }
}

#[test]
fn dry_run_shows_where_everything_came_from() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let a = data_dir(&w, "a");
    let b = data_dir(&w, "b");
    let cfg = write_config(
        &w,
        &format!(
            "ro = [{}]\nclaude_args = [\"--model\", \"opus\"]\n\n[env]\nFOO = \"bar\"\n",
            q(&a)
        ),
    );
    let dry = ok(&cmd(&w, &p)
        .args([
            "--dry-run",
            "--rw",
            b.to_str().unwrap(),
            "--no-network",
            "--env",
            "X=1",
        ])
        .output()
        .unwrap());
    let c = cfg.display();
    for row in [
        "# kind\tsource\ttarget\twhy\tfrom".to_string(),
        format!(
            "rw\t{p}\t{p}\tthe project's work tree\tdefault",
            p = p.display()
        ),
        format!(
            "ro\t{a}\t{a}\tread-only, as you asked\tconfig {c}:1",
            a = a.display()
        ),
        format!(
            "rw\t{b}\t{b}\tread-write, as you asked\tcommand line",
            b = b.display()
        ),
        format!("config-file\t{c}\tread"),
        "network\tnone\tcommand line".to_string(),
        format!("claude-args\t--model opus\tconfig {c}:2"),
        format!("set\tFOO=bar\tconfig {c}:5"),
        "set\tX=1\tcommand line".to_string(),
        "set\tCLAUDEBOX=1\tdefault".to_string(),
    ] {
        assert!(dry.lines().any(|l| l == row), "no row {row:?} in:\n{dry}");
    }
    assert!(dry.contains(" --unshare-net "), "{dry}");
    assert!(!w.state().exists(), "--dry-run created the state directory");

    // No config file: said so, and the defaults.
    fs::remove_file(&cfg).unwrap();
    let dry = ok(&cmd(&w, &p).arg("--dry-run").output().unwrap());
    assert!(
        dry.contains(&format!("config-file\t{c}\tnot present\n")),
        "{dry}"
    );
    assert!(dry.contains("network\topen\tdefault\n"), "{dry}");
    assert!(!dry.contains("--unshare-net"), "{dry}");
}

#[test]
fn the_printed_command_runs_with_the_extras() {
    let w = World::new(BIN);
    let p = w.dir("p");
    let a = data_dir(&w, "a");
    write_config(&w, &format!("ro = [{}]\n", q(&a)));
    let dry = ok(&cmd(&w, &p)
        .args([
            "--dry-run",
            "--env",
            "GREETING=hello there",
            "--exec",
            "sh",
            "-c",
        ])
        .arg(format!("cat {}/f; echo \"$GREETING\"", a.display()))
        .output()
        .unwrap());
    let line = dry.lines().last().unwrap();
    // The state the command binds must exist: a real launch creates it.
    ok(&cmd(&w, &p).args(["--exec", "true"]).output().unwrap());
    let o = Command::new("sh")
        .arg("-c")
        .arg(line)
        .current_dir(&p)
        .env_clear()
        .env("PATH", w.path_var())
        .env("HOME", w.home())
        .output()
        .unwrap();
    let out = ok(&o);
    assert!(
        out.contains("content of a") && out.contains("hello there"),
        "{out}"
    );
}

#[test]
fn xdg_config_home_is_honoured_and_relative_ignored() {
    let w = World::new(BIN);
    let p = w.dir("p");
    write_config(&w, "network = \"none\"\n");
    let dry = ok(&cmd(&w, &p).arg("--dry-run").output().unwrap());
    assert!(dry.contains("network\tnone\tconfig "), "{dry}");
    // Without XDG_CONFIG_HOME: ~/.config/claudebox/config.toml.
    let dry = dry_run(&w, &p);
    let default_cfg = w.home().join(".config/claudebox/config.toml");
    assert!(
        dry.contains(&format!(
            "config-file\t{}\tnot present",
            default_cfg.display()
        )),
        "{dry}"
    );
    fs::create_dir_all(default_cfg.parent().unwrap()).unwrap();
    fs::write(&default_cfg, "network = \"none\"\n").unwrap();
    assert!(dry_run(&w, &p).contains("network\tnone\tconfig "));
    // A relative XDG_CONFIG_HOME is ignored, as the XDG spec says.
    let dry = ok(&w
        .cmd(&p)
        .arg("--dry-run")
        .env("XDG_CONFIG_HOME", "rel")
        .output()
        .unwrap());
    assert!(
        dry.contains(&format!("config-file\t{}\tread", default_cfg.display())),
        "{dry}"
    );
}

#[test]
fn completions_and_man_page() {
    let w = World::new(BIN);
    let p = w.dir("p");
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef claudebox"),
        ("fish", "complete -c claudebox"),
    ] {
        let out = ok(&w.cmd(&p).args(["completions", shell]).output().unwrap());
        assert!(out.contains(marker), "{shell}: {out}");
        for opt in ["no-network", "dry-run", "rw"] {
            assert!(out.contains(opt), "{shell} lacks {opt}");
        }
    }
    let o = w.cmd(&p).args(["completions", "tcsh"]).output().unwrap();
    assert!(!o.status.success());
    let man = ok(&w.cmd(&p).arg("manpage").output().unwrap());
    assert!(
        man.starts_with(".ie") || man.contains(".TH claudebox"),
        "{man}"
    );
    for opt in ["no\\-network", "config.toml", "completions"] {
        assert!(man.contains(opt), "man page lacks {opt}");
    }
    assert!(!w.state().exists());
    // Anything else still goes to claude, and `--` sends the words themselves.
    let out = inside(&w, &p, &["--", "manpage"], "");
    assert_eq!(fake_args(&out)[2..], ["manpage"]);
    let out = inside(&w, &p, &["mcp", "list"], "");
    assert_eq!(fake_args(&out)[2..], ["mcp", "list"]);
}

#[test]
fn the_config_file_sets_the_allowlist_and_the_opt_ins_per_project() {
    let w = World::new(BIN);
    let a = w.work().join("a");
    init_repo(&a);
    let b = w.dir("b");
    write_config(
        &w,
        &format!(
            "allow_hosts = [\"example.org\"]\n\
             [[project]]\nroot = {}\nnetwork = \"allowlist\"\nallow_hosts = [\"*.internal.example\"]\n\
             writable_project_config = true\nwritable_claude_setup = true\n",
            q(&a)
        ),
    );
    let out = ok(&cmd(&w, &a).arg("--dry-run").output().unwrap());
    assert!(out.contains("# network: allowlist"), "{out}");
    assert!(out.contains("allow\texample.org\t"), "{out}");
    assert!(out.contains("allow\t*.internal.example\t"), "{out}");
    assert!(
        out.contains("config.toml:5"),
        "the origin of the per-project host:\n{out}"
    );
    assert!(out.contains("opt-in --writable-project-config"), "{out}");
    assert!(out.contains("opt-in --writable-claude-setup"), "{out}");
    assert!(!out.contains("protected: "), "protection still on:\n{out}");
    // in another project only the top level applies: listing hosts means allowlist,
    // and the project protection stays on
    let out = ok(&cmd(&w, &b).arg("--dry-run").output().unwrap());
    assert!(
        out.contains("# network: allowlist") && out.contains("allow\texample.org\t"),
        "{out}"
    );
    assert!(
        !out.contains("*.internal.example") && !out.contains("opt-in --writable"),
        "{out}"
    );
    // the command line wins over the file
    let out = ok(&w
        .cmd(&b)
        .args(["--network", "open", "--dry-run"])
        .output()
        .unwrap());
    assert!(out.contains("# network: open"), "{out}");
    // a refused pattern in the file names the file
    write_config(&w, "allow_hosts = [\"*.com\"]\n");
    let o = cmd(&w, &b).arg("--dry-run").output().unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("config.toml") && stderr(&o).lines().count() == 1,
        "{}",
        stderr(&o)
    );
}
