//! A real installed plugin inside the sandbox, with the real Claude Code (both versions,
//! `-p`, against the lab's mock API). The user installs it on the host from a marketplace
//! (`tests/lab/plugin-marketplace`, a git repository reached offline through a
//! `url.insteadOf` of an https address, as a GitHub marketplace is cloned into
//! `~/.claude/plugins/marketplaces/`); inside, from the read-only setup: its slash
//! command expands, its UserPromptSubmit hook runs (a mark in the project, its output in
//! the prompt), its skill is listed, its MCP server's tool is offered and a call to it
//! answers. Claude writes the plugin's data dir (`CLAUDE_PLUGIN_DATA`) before it runs a
//! hook or an MCP server: that lands in the project's own directory, and the host's
//! `~/.claude/plugins` is byte-identical afterwards.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::BIN;
use lab::agent::*;
use lab::*;

const MARKETPLACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab/plugin-marketplace");
/// The https address the marketplace is added by; git reads it from the fixture's copy.
const URL: &str = "https://git.lab.invalid/lab/";
const TOOL: &str = "mcp__plugin_labplug_labmcp__lab_echo";

/// Runs the host's claude (`c`) of `w` with `args`: what the user does in their shell.
fn host_claude(w: &World, c: &Claude, args: &[&str]) {
    let mut cmd = Command::new(&c.bin);
    cmd.current_dir(w.root())
        .env_clear()
        .env("HOME", w.home())
        .env("PATH", w.path_var())
        .env("LANG", "C.UTF-8")
        .args(args);
    let o = output_within(&mut cmd, Duration::from_secs(60)).unwrap();
    assert!(
        o.status.success(),
        "[{}] claude {args:?} on the host: {}{}",
        c.label,
        stdout(&o),
        stderr(&o)
    );
}

/// The marketplace as a git repository in `w`, and the plugin installed from it on the
/// host, offline.
fn install_on_host(w: &World, c: &Claude) {
    let repo = w.root().join("marketplace");
    let o = Command::new("cp")
        .arg("-r")
        .arg(MARKETPLACE)
        .arg(&repo)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "the lab's marketplace"]);
    fs::write(
        w.home().join(".gitconfig"),
        format!(
            "[url \"file://{}/\"]\n\tinsteadOf = {URL}\n",
            repo.display()
        ),
    )
    .unwrap();
    host_claude(
        w,
        c,
        &["plugin", "marketplace", "add", &format!("{URL}.git")],
    );
    host_claude(w, c, &["plugin", "install", "labplug@lab"]);
}

/// Every file under `dir` (relative path -> content), `data/` left out.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if rel == Path::new("data") {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(rel, fs::read(&p).unwrap_or_default());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn an_installed_plugins_command_hook_skill_and_mcp_server_work_from_the_read_only_setup() {
    for c in lab::agent::each_claude() {
        let label = c.label;
        let w = world_with(BIN, &c);
        install_on_host(&w, &c);
        let plugins = w.home().join(".claude/plugins");
        let before = snapshot(&plugins);
        assert!(
            before
                .keys()
                .any(|p| p.ends_with("labplug/1.0.0/hooks/mark.sh")),
            "[{label}] the plugin is not in the host's cache: {:?}",
            before.keys()
        );
        let p = w.dir("proj");
        init_repo(&p);
        let mock = MockApi::start(&json!([
            {"tool": TOOL, "input": {"text": "abc123"}},
            "PLUGIN-DONE"
        ]));
        let o = run_claudebox(
            &w,
            &p,
            &mock,
            &["-p", "/labplug:xcmd", "--allowedTools", TOOL],
            &[],
            Duration::from_secs(120),
        );
        let out = ok_run(&c, &o, &mock);
        assert!(out.contains("PLUGIN-DONE"), "[{label}] {out}");
        let conv = mock.conversation(0);
        assert!(conv.len() >= 2, "[{label}] {conv:#?}");
        let first = messages_text(&conv[0]);
        assert!(
            first.contains("PLUGIN-COMMAND-BODY-5512"),
            "[{label}] the plugin's slash command did not expand:\n{first}"
        );
        assert!(
            first.contains("PLUGIN-HOOK-CONTEXT-9034"),
            "[{label}] the plugin's hook output did not reach the prompt:\n{first}"
        );
        assert!(
            fs::read_to_string(p.join("plugin-hook-ran")).is_ok_and(|s| s.contains("ran")),
            "[{label}] the plugin's hook left no mark in the project"
        );
        let body = conv[0]["body"].to_string();
        assert!(
            body.contains("PLUGIN-SKILL-DESC-6620"),
            "[{label}] the plugin's skill is not listed"
        );
        assert!(
            body.contains(TOOL),
            "[{label}] the plugin's MCP tool is not offered"
        );
        let second = messages_text(&conv[1]);
        assert!(
            second.contains("MCP-ECHO:321cba"),
            "[{label}] the call to the plugin's MCP tool did not answer:\n{second}"
        );
        // What claude wrote for the plugin is the project's; the host's setup is as it was.
        assert_eq!(
            snapshot(&plugins),
            before,
            "[{label}] the host's ~/.claude/plugins changed"
        );
        let host_data: Vec<_> = fs::read_dir(plugins.join("data"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            host_data.is_empty(),
            "[{label}] the host's plugins/data got {host_data:?}"
        );
        let projects = w.state().join("projects");
        let id = fs::read_dir(&projects).unwrap().next().unwrap().unwrap();
        let data = id.path().join("claude-plugin-data/labplug-lab");
        assert!(
            data.is_dir(),
            "[{label}] the plugin's data dir is not in the project's state"
        );
        assert!(
            data.join("hook-ran").is_file(),
            "[{label}] the hook did not write into its CLAUDE_PLUGIN_DATA"
        );
    }
}

/// A marketplace added as a local directory (`claude plugin marketplace add ./dir`):
/// `known_marketplaces.json` names the directory and claude reads the plugin from there,
/// not from its cache, so inside it failed to load ("cache-miss") without a word. The
/// launch binds that directory read-only: the real claude inside lists the plugin enabled,
/// read from the directory, and cannot write there. Control: the same launch with the
/// directory hidden (`--hide`) fails to load it, as before.
#[test]
fn a_plugin_from_a_local_directory_marketplace_loads_inside() {
    for c in claude_versions() {
        let label = c.label;
        let w = world_with(BIN, &c);
        let dir = w.root().join("my marketplace");
        let o = Command::new("cp")
            .arg("-r")
            .arg(MARKETPLACE)
            .arg(&dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        host_claude(
            &w,
            &c,
            &["plugin", "marketplace", "add", "./my marketplace"],
        );
        host_claude(&w, &c, &["plugin", "install", "labplug@lab"]);
        let known =
            fs::read_to_string(w.home().join(".claude/plugins/known_marketplaces.json")).unwrap();
        assert!(known.contains("\"directory\""), "[{label}] {known}");
        let p = w.dir("proj");
        init_repo(&p);
        let list = |extra: &[&std::ffi::OsStr]| {
            let o = w
                .cmd(&p)
                .args(extra)
                .args(["--exec", "sh", "-c"])
                .arg("claude plugin list; touch \"$1/x\" 2>/dev/null && echo WROTE")
                .arg("sh")
                .arg(&dir)
                .output()
                .unwrap();
            (stdout(&o), stderr(&o))
        };
        let (out, err) = list(&[]);
        assert!(out.contains("labplug@lab"), "[{label}] {out}{err}");
        assert!(out.contains("enabled"), "[{label}] {out}{err}");
        assert!(!out.contains("failed to load"), "[{label}] {out}");
        assert!(
            !out.contains("WROTE"),
            "[{label}] the marketplace is writable inside"
        );
        let dry = dry_run(&w, &p);
        assert!(
            dry.contains(&format!("ro\t{}\t", dir.display()).replace(' ', "\\ "))
                || dry.contains("a plugin marketplace added as a local directory"),
            "[{label}] {dry}"
        );
        // Control: hidden, the plugin fails to load as it did.
        let (out, err) = list(&["--hide".as_ref(), dir.as_os_str()]);
        assert!(out.contains("failed to load"), "[{label}] {out}{err}");
    }
}
