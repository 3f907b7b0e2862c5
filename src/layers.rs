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
         after the wait), the supervising parent (`supervise`)",
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
        "--list, --gc, --check (which runs a launch's preparation), the diagnosis of bwrap's \
         failure texts (`diagnose`) and the AppArmor row's classifier (`apparmor`)",
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
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut out = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&root).unwrap().to_path_buf();
        if ["main.rs", "lib.rs", "layers.rs"]
            .iter()
            .any(|n| rel == Path::new(n))
        {
            continue;
        }
        let from = layer_of(&rel);
        for to in crate_imports(&fs::read_to_string(&f).unwrap()) {
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
