//! The layer order of the library, policy as data, and the test that holds the code to it:
//! a module imports (`crate::...`) only from its own folder or a lower layer, so nothing
//! imports upward and the folders form no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first: one folder (or top-level module) of `src/` per row, with
/// what it holds, which is why it sits where it does. This table is the one description of
/// the layers: ARCHITECTURE.md and the README point here rather than copy it.
pub const LAYERS: &[(&str, &str)] = &[
    (
        "policy",
        "pure data and policy, no I/O: `plan::build` (one pure function from `plan::Inputs` \
         to a typed `Plan`), `render` (the one renderer from a plan to bwrap's argv, \
         `--dry-run`'s text and the companions' argv), the network policy, the seccomp table \
         (`confinement`), the IPC table, the protected-path tables, what git reads in a git \
         dir and the judgement of a file found there after a session (`git_dir`), the exit \
         review's rules (`review`), the agent table (`agent`), the `~/.claude` table \
         (`claude_home`), the `~/.codex` table (`codex_home`), the forwarded host \
         ports (`forward`), the `--gpu` table (`gpu`), the AppArmor profile text and launch \
         warning (`apparmor`), the state's layout (`layout`), a named session's launch \
         (`session`), which way the credentials sync copies (`credsync`), the limits' values, \
         default and mechanism (`limits`), the user's settings as data, the escaper",
    ),
    (
        "host",
        "reads the host: home, bwrap, claude's install, the project, protected paths, mounts, \
         holders of a file, bind sources opened by descriptor, exec, GPU nodes (`gpu`), \
         AppArmor's state and the label of the bwrap in use (`apparmor`), how the companions \
         are bound to bwrap's life (`companion`), the sandbox's limits (`limits`: the systemd \
         manager or a delegated cgroup v2 subtree, the sandbox's cgroup, read and removed \
         after the wait), the supervising parent (`supervise`), the cause of a bwrap failure \
         (`diagnose`: its text with the kernel's settings)",
    ),
    (
        "state",
        "claudebox's on-disk state and its I/O: `~/.claudebox` and its inventory (sizes \
         walked by directory descriptors), in-use marks, sessions, transcripts, conversations \
         copied between bare claude and the state (`crossing`), `~/.claude`'s mount points and \
         `.claude.json`'s sync, `~/.codex`'s mount points and login link (`codex_home`), the exit review (`review`), file operations beneath a \
         directory a sandbox can write (`beneath`), the credentials sync process (`credsync`, \
         hidden role `--internal-credentials-sync`)",
    ),
    (
        "config",
        "the config file and the user's settings resolved from it and the command line, \
         with the checks of what they ask for (guard)",
    ),
    (
        "cli",
        "the command line as clap parses it, near-miss options (`typo`), completions and the \
         man page (its extra sections rendered from docs/reference.md); the launch reads it",
    ),
    (
        "proxy",
        "the allowlist proxy process (hidden role `--internal-proxy`), the loopback forwards \
         (`--forward-port`, also in none mode), and the host half of their bridge into the \
         sandbox (`netbridge`)",
    ),
    (
        "inside",
        "the one step inside the sandbox (`--sandbox-init`, `confine`) and the inside half \
         of the bridge (`listen`)",
    ),
    (
        "launch",
        "gathers everything below, plans, creates state, starts the companions and bwrap \
         (under `host::supervise`), and the exit review after it",
    ),
    (
        "maintenance",
        "--list, --gc, --check (which runs a launch's preparation) and the AppArmor row's \
         classifier (`apparmor`); the diagnosis of bwrap's failure texts is `host::diagnose` \
         (a launch names the cause too)",
    ),
    (
        "run",
        "the launcher's dispatcher: ties the parsed command line to the commands",
    ),
];

/// Upward imports still in the code, each with why and what removes it. The test fails on
/// any upward import not listed here, and on a row no longer needed.
pub const KNOWN_UPWARD: &[(&str, &str, &str)] = &[];

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|(l, _)| *l == layer)
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every Rust file under `root`, by its path relative to `root`, with its text.
fn sources(root: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files
        .into_iter()
        .map(|f| {
            let text = fs::read_to_string(&f).unwrap();
            (f.strip_prefix(root).unwrap().to_path_buf(), text)
        })
        .collect()
}

/// The layer a file of `src/` belongs to: its first path component, without `.rs`.
fn layer_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap();
    first.strip_suffix(".rs").unwrap_or(first).to_string()
}

/// The top-level modules a source text names after `crate::`, including each name of a
/// `crate::{a, b::c}` group.
fn crate_imports(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            for part in split_top(group) {
                let name = ident(part.trim());
                if !name.is_empty() && name != "self" {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The comma-separated items of a `{...}` group at its top level (up to its closing brace).
fn split_top(group: &str) -> Vec<&str> {
    let (mut depth, mut from, mut parts) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                parts.push(&group[from..i]);
                return parts;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&group[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    parts
}

/// Every (file, imported layer) pair whose target is another layer.
fn edges() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (rel, text) in sources(&src()) {
        if ["main.rs", "lib.rs", "layers.rs"]
            .iter()
            .any(|n| rel == Path::new(n))
        {
            continue;
        }
        let from = layer_of(&rel);
        for to in crate_imports(&text) {
            if to != from {
                out.push((rel.display().to_string(), from.clone(), to));
            }
        }
    }
    out
}

#[test]
fn every_module_is_in_a_layer() {
    for (file, from, to) in edges() {
        assert!(
            rank(&from).is_some(),
            "{file}: layer {from} is not in LAYERS"
        );
        assert!(
            rank(&to).is_some(),
            "{file}: imports crate::{to}, not in LAYERS"
        );
    }
}

#[test]
fn nothing_imports_upward() {
    let mut bad = Vec::new();
    let mut used = BTreeSet::new();
    for (file, from, to) in edges() {
        if rank(&to) > rank(&from) {
            match KNOWN_UPWARD
                .iter()
                .position(|(f, t, _)| *f == file && *t == to)
            {
                Some(i) => {
                    used.insert(i);
                }
                None => bad.push(format!("{file} ({from}) imports crate::{to}")),
            }
        }
    }
    assert!(bad.is_empty(), "upward imports:\n{}", bad.join("\n"));
    for (i, (f, t, _)) in KNOWN_UPWARD.iter().enumerate() {
        assert!(
            used.contains(&i),
            "KNOWN_UPWARD row {f} -> {t} is no longer needed"
        );
    }
}

#[test]
fn the_folders_form_no_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, from, to) in edges() {
        if KNOWN_UPWARD.iter().any(|(f, t, _)| *f == file && *t == to) {
            continue;
        }
        graph.entry(from).or_default().insert(to);
    }
    // Depth-first search with colours: reaching a folder still on the stack is a cycle.
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) {
        match state.get(n) {
            Some(2) => return,
            Some(1) => panic!("cycle between folders: {} -> {n}", stack.join(" -> ")),
            _ => {}
        }
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            visit(m, g, state, stack);
        }
        stack.pop();
        state.insert(n.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        visit(n, &graph, &mut state, &mut Vec::new());
    }
}

#[test]
fn the_scanner_sees_grouped_and_nested_imports() {
    let got = crate_imports(
        "use crate::{policy::plan, host::{self, project}};\nlet x = crate::state::X;",
    );
    let want: BTreeSet<String> = ["policy", "host", "state"].map(String::from).into();
    assert_eq!(got, want);
}

#[test]
fn an_upward_import_is_caught() {
    // The control: a file of `policy` naming `crate::launch` is an upward import.
    let from = "policy";
    let to: Vec<String> = crate_imports("use crate::launch::prepare;")
        .into_iter()
        .collect();
    assert!(rank(&to[0]) > rank(from));
}

/// The layers inside `policy/`, lowest first: the modules of each row, and why they sit
/// there. A module imports (`crate::policy::...`, or `super::...` from a top-level file)
/// only from its own row or a lower one, and the modules form no cycle. Test code (a
/// `#[cfg(test)]` module, `tests.rs`) is left out: a test may build a whole plan.
pub const POLICY_LAYERS: &[(&[&str], &str)] = &[
    (
        &[
            "escape",
            "error",
            "origin",
            "mount",
            "facts",
            "layout",
            "ipc",
            "protected",
            "confinement",
            "git_dir",
            "caches",
        ],
        "shared types and tables, at the bottom so that every module above can name them: \
         the escaper, the error with its fix, where a setting came from (`origin`), a plan \
         mount and its kinds (`mount`), what the host was found to hold (`facts`), the \
         state's layout, the IPC, protected-path and seccomp tables, what git reads, the package caches",
    ),
    (
        &[
            "network",
            "forward",
            "agent",
            "limits",
            "apparmor",
            "claude_home",
            "codex_home",
            "review",
            "session",
            "companion_env",
            "bwrap_cve",
        ],
        "one concern each, on the types below: the network modes and the proxy's spec, the \
         forwarded host ports (`forward`, over `network`'s types), the agent table, the \
         limits, the AppArmor text, the `~/.claude` and `~/.codex` tables, the exit review's \
         rules, a named session's launch, the host companions' working directory and \
         environment (`companion_env`), which bwrap carries CVE-2026-87766's fix and which \
         mount points a sibling could swap a parent of (`bwrap_cve`, over `mount`)",
    ),
    (
        &["settings", "base_url", "gpu"],
        "what the user asked for, as data (`settings`), and the rules that read it: the \
         base URL's check, the `--gpu` table and its mounts",
    ),
    (
        &["plan", "credsync"],
        "the plan: one pure function from the inputs to a typed plan, and which way the \
         credentials sync copies for a plan",
    ),
    (
        &["render"],
        "the one renderer from a plan to bwrap's argv, `--dry-run`'s text and the \
         companions' argv",
    ),
];

fn policy_rank(module: &str) -> Option<usize> {
    POLICY_LAYERS
        .iter()
        .position(|(mods, _)| mods.contains(&module))
}

/// A source text without its test code: each `#[cfg(test)]` item, a `mod ... {` block to
/// its matching brace (counted line by line) or one line (`mod tests;`).
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let Some(item) = lines.next() else { break };
        if item.trim_end().ends_with('{') {
            let mut depth: i64 = 1;
            for l in lines.by_ref() {
                depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
                if depth <= 0 {
                    break;
                }
            }
        }
    }
    out
}

/// The modules of `policy` a source text of it names: after `crate::policy::` (each name
/// of a group too) and, in a top-level file, after `super::`.
fn policy_imports(text: &str, top_level: bool) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut prefixes = vec!["crate::policy::"];
    if top_level {
        prefixes.push("super::");
    }
    let mut out = BTreeSet::new();
    for prefix in prefixes {
        for (i, _) in text.match_indices(prefix) {
            let rest = &text[i + prefix.len()..];
            match rest.strip_prefix('{') {
                Some(group) => out.extend(split_top(group).iter().map(|p| ident(p.trim()))),
                None => {
                    out.insert(ident(rest));
                }
            }
        }
    }
    out.retain(|m| policy_rank(m).is_some());
    out
}

/// Every (file, module, imported module) of `policy`'s non-test code, between modules.
fn policy_edges() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (rel, text) in sources(&src().join("policy")) {
        if rel == Path::new("mod.rs") || rel.file_name().unwrap() == "tests.rs" {
            continue;
        }
        let from = layer_of(&rel);
        let top_level = rel.components().count() == 1;
        for to in policy_imports(&without_tests(&text), top_level) {
            if to != from {
                out.push((rel.display().to_string(), from.clone(), to));
            }
        }
    }
    out
}

#[test]
fn every_policy_module_is_in_a_policy_layer() {
    let root = src().join("policy");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    for f in files {
        let module = layer_of(f.strip_prefix(&root).unwrap());
        if module != "mod" {
            assert!(
                policy_rank(&module).is_some(),
                "policy/{module} is not in POLICY_LAYERS"
            );
        }
    }
}

#[test]
fn nothing_in_policy_imports_upward() {
    let bad: Vec<String> = policy_edges()
        .into_iter()
        .filter(|(_, from, to)| policy_rank(to) > policy_rank(from))
        .map(|(file, from, to)| format!("policy/{file} ({from}) imports policy::{to}"))
        .collect();
    assert!(
        bad.is_empty(),
        "upward imports in policy:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_policy_modules_form_no_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, from, to) in policy_edges() {
        graph.entry(from).or_default().insert(to);
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!("cycle between policy modules: {}", cycle.join(" -> "));
    }
}

/// A cycle of the graph, if it has one: depth-first search with colours, where reaching a
/// node still on the stack closes a cycle.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let mut c = stack.clone();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    g.keys()
        .find_map(|n| visit(n, g, &mut state, &mut Vec::new()))
}

#[test]
fn the_policy_scanner_sees_groups_super_and_skips_tests() {
    let text = "use crate::policy::{plan::Plan, escape};\nuse super::gpu::X;\n\
                #[cfg(test)]\nmod tests {\n    use crate::policy::render;\n}\n";
    let got = policy_imports(&without_tests(text), true);
    let want: BTreeSet<String> = ["plan", "escape", "gpu"].map(String::from).into();
    assert_eq!(got, want);
    // The control: a cycle is found, and an upward import ranks above.
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("plan".to_string(), ["gpu".to_string()].into()),
        ("gpu".to_string(), ["plan".to_string()].into()),
    ]
    .into();
    assert!(find_cycle(&g).is_some());
    assert!(policy_rank("render") > policy_rank("mount"));
}
