//! The docs against the code: every long option of `claudebox --help` is in
//! docs/reference.md's options table and every option there is in `--help`; every hidden
//! role the reference lists is a role of the binary and none is in `--help`; every key the
//! config file takes (serde's own list, from a real unknown-key error) is in the reference's
//! keys table and nothing else is; relative links in README.md, ARCHITECTURE.md,
//! BENCHMARKS.md and docs/ resolve, anchors included. Each comparison is one function, and
//! a control feeds it a doctored text to show it fails.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::BIN;
use lab::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn reference() -> String {
    fs::read_to_string(repo().join("docs/reference.md")).unwrap()
}

/// The text under a `## `/`### ` heading, up to the next heading of that level or higher.
fn section<'a>(md: &'a str, heading: &str) -> &'a str {
    let start = md
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no `{heading}` in the reference"))
        + heading.len()
        + 2;
    let rest = &md[start..];
    let level = heading.split(' ').next().unwrap();
    let mut end = rest.len();
    for (i, _) in rest.match_indices('\n') {
        let line = &rest[i + 1..];
        let h = line.split(' ').next().unwrap_or("");
        if !h.is_empty() && h.chars().all(|c| c == '#') && h.len() <= level.len() {
            end = i;
            break;
        }
    }
    &rest[..end]
}

/// The first cells of a section's table rows (header and separator left out).
fn first_cells(section: &str) -> Vec<String> {
    section
        .lines()
        .filter(|l| l.starts_with("| "))
        .skip(1)
        .filter(|l| !l.starts_with("| ---"))
        .map(|l| l[2..].split(" | ").next().unwrap().to_string())
        .collect()
}

/// `--name` words in a text.
fn long_options(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("--") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-') {
            continue;
        }
        let name: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if !name.is_empty() {
            out.insert(format!("--{name}"));
        }
    }
    out
}

/// The long options clap prints: the first word of each option line of `--help`.
fn help_options(help: &str) -> BTreeSet<String> {
    help.lines()
        .map(str::trim_start)
        .filter_map(|l| {
            let l = l.strip_prefix("-h, ").unwrap_or(l);
            let word = l.split([' ', '<', '[']).next()?;
            (word.starts_with("--") && word.len() > 2).then(|| word.to_string())
        })
        .collect()
}

/// What differs between `--help` and the reference's options table, one line each.
fn options_differ(help: &str, reference: &str) -> Vec<String> {
    let in_help = help_options(help);
    let mut in_ref = BTreeSet::new();
    for cell in first_cells(section(reference, "## Options")) {
        in_ref.extend(long_options(&cell));
    }
    let mut out = Vec::new();
    for o in in_help.difference(&in_ref) {
        out.push(format!(
            "{o} is in --help but not in docs/reference.md's options table"
        ));
    }
    for o in in_ref.difference(&in_help) {
        out.push(format!(
            "{o} is in docs/reference.md's options table but not in --help"
        ));
    }
    out
}

fn help() -> String {
    let w = World::new(BIN);
    ok(&w.cmd(&w.work()).arg("--help").output().unwrap())
}

#[test]
fn help_and_the_reference_list_the_same_options() {
    let help = help();
    assert!(help_options(&help).len() > 30, "{help}");
    let differ = options_differ(&help, &reference());
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// The control: a row taken out of the table, and a row for an option that does not
/// exist, are both found.
#[test]
fn a_doctored_options_table_is_caught() {
    let help = help();
    let r = reference();
    let row = r
        .lines()
        .find(|l| l.starts_with("| `--gc-margin "))
        .unwrap();
    let cut = r.replace(&format!("{row}\n"), "");
    assert_eq!(
        options_differ(&help, &cut),
        ["--gc-margin is in --help but not in docs/reference.md's options table"]
    );
    let added = r.replace(
        &format!("{row}\n"),
        &format!("{row}\n| `--frobnicate` | x |\n"),
    );
    assert_eq!(
        options_differ(&help, &added),
        ["--frobnicate is in docs/reference.md's options table but not in --help"]
    );
}

/// Every string literal `"--internal-..."` or `"--sandbox-init"` in src/: the hidden roles.
fn hidden_roles_in_src() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = fs::read_to_string(&p).unwrap();
                for o in long_options(&text) {
                    let quoted = format!("\"{o}\"");
                    if (o.starts_with("--internal-") || o == "--sandbox-init")
                        && text.contains(&quoted)
                    {
                        out.insert(o);
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&repo().join("src"), &mut out);
    out
}

#[test]
fn the_hidden_roles_are_documented_and_not_in_help() {
    let in_ref: BTreeSet<String> = first_cells(section(&reference(), "## Hidden roles"))
        .iter()
        .flat_map(|c| long_options(c))
        .collect();
    let in_src = hidden_roles_in_src();
    assert!(in_src.len() >= 4, "{in_src:?}");
    assert_eq!(in_ref, in_src, "the reference's hidden roles against src/");
    let help = help();
    for r in &in_src {
        assert!(!help.contains(r.as_str()), "{r} is in --help");
    }
}

/// The keys serde accepts at the top level, from the error for an unknown one.
fn config_keys() -> BTreeSet<String> {
    let w = World::new(BIN);
    let xdg = w.root().join("xdg");
    fs::create_dir_all(xdg.join("claudebox")).unwrap();
    fs::write(xdg.join("claudebox/config.toml"), "zz_not_a_key = 1\n").unwrap();
    let out = w
        .cmd(&w.work())
        .env("XDG_CONFIG_HOME", &xdg)
        .arg("--dry-run")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    let list = err
        .split("expected one of ")
        .nth(1)
        .unwrap_or_else(|| panic!("{err}"));
    list.split(", ")
        .map(|k| k.trim().trim_matches('`').to_string())
        .collect()
}

fn keys_differ(keys: &BTreeSet<String>, reference: &str) -> Vec<String> {
    let in_ref: BTreeSet<String> = first_cells(section(reference, "### Configuration keys"))
        .iter()
        .map(|c| c.trim_matches('`').to_string())
        .collect();
    let mut out = Vec::new();
    for k in keys.difference(&in_ref) {
        out.push(format!("config key {k} is not in docs/reference.md"));
    }
    for k in in_ref.difference(keys) {
        out.push(format!(
            "docs/reference.md lists config key {k}, which the file does not take"
        ));
    }
    out
}

#[test]
fn every_config_key_is_documented() {
    let keys = config_keys();
    assert!(keys.contains("gc_margin") && keys.len() > 15, "{keys:?}");
    let differ = keys_differ(&keys, &reference());
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    // The control: a key the code takes, left out of the table, is caught.
    let r = reference();
    let row = r
        .lines()
        .find(|l| l.starts_with("| `gc_margin` |"))
        .unwrap();
    assert_eq!(
        keys_differ(&keys, &r.replace(&format!("{row}\n"), "")),
        ["config key gc_margin is not in docs/reference.md"]
    );
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Lines outside code blocks.
fn prose(md: &str) -> Vec<&str> {
    let mut fence = false;
    md.lines()
        .filter(|l| {
            if l.starts_with("```") {
                fence = !fence;
                return false;
            }
            !fence
        })
        .collect()
}

fn anchors(md: &str) -> BTreeSet<String> {
    prose(md)
        .into_iter()
        .filter(|l| {
            let h = l.split(' ').next().unwrap_or("");
            !h.is_empty() && h.len() <= 6 && h.chars().all(|c| c == '#')
        })
        .map(slug)
        .collect()
}

/// The broken relative links of `file` (repo-relative), whose text is `md`; `read` gives
/// another file's text.
fn broken_links(file: &Path, md: &str, read: &dyn Fn(&Path) -> Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(md) {
        for (i, _) in line.match_indices("](") {
            let rest = &line[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let link = &rest[..end];
            if link.contains("://") || link.starts_with("mailto:") || link.contains(' ') {
                continue;
            }
            let (path, frag) = link.split_once('#').unwrap_or((link, ""));
            let target = if path.is_empty() {
                file.to_path_buf()
            } else {
                normalize(&file.parent().unwrap().join(path))
            };
            let text = if path.is_empty() {
                Some(md.to_string())
            } else {
                read(&target)
            };
            let Some(text) = text else {
                out.push(format!("{}: {link}: no such file", file.display()));
                continue;
            };
            if !frag.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&text).contains(frag)
            {
                out.push(format!("{}: {link}: no such heading", file.display()));
            }
        }
    }
    out
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn read_in_repo(rel: &Path) -> Option<String> {
    let p = repo().join(rel);
    if p.is_dir() {
        return Some(String::new());
    }
    fs::read(&p)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn doc_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]
        .iter()
        .map(PathBuf::from)
        .collect();
    for e in fs::read_dir(repo().join("docs")).unwrap() {
        let name = e.unwrap().file_name();
        if Path::new(&name).extension().is_some_and(|x| x == "md") {
            files.push(Path::new("docs").join(name));
        }
    }
    files
}

#[test]
fn relative_links_in_the_docs_resolve() {
    let files = doc_files();
    assert!(files.len() >= 10, "{files:?}");
    let mut broken = Vec::new();
    for f in &files {
        broken.extend(broken_links(f, &read_in_repo(f).unwrap(), &read_in_repo));
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The control: a link to a missing file and one to a missing heading are both found.
#[test]
fn broken_links_are_caught() {
    let md = "# T\n\n## A heading: `x`\n\nSee [a](#a-heading-x), [b](network.md#nope), \
              [c](missing.md), [d](../README.md), [e](https://example.com/x).\n\
              ```\n[f](in-code.md)\n```\n";
    let got = broken_links(Path::new("docs/t.md"), md, &read_in_repo);
    assert_eq!(
        got,
        [
            "docs/t.md: network.md#nope: no such heading",
            "docs/t.md: missing.md: no such file"
        ]
    );
}

#[test]
fn the_readme_stays_short() {
    let lines = read_in_repo(Path::new("README.md"))
        .unwrap()
        .lines()
        .count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; move detail into docs/"
    );
}

/// BENCHMARKS.md keeps today's figures and the method; older figures move to
/// docs/benchmark-history.md (issue 39).
#[test]
fn benchmarks_stay_under_400_lines() {
    let lines = read_in_repo(Path::new("BENCHMARKS.md"))
        .unwrap()
        .lines()
        .count();
    assert!(
        lines < 400,
        "BENCHMARKS.md has {lines} lines; move older figures to docs/benchmark-history.md"
    );
}

/// `claudebox manpage` has the sections a man page reader looks for, taken from the
/// reference, and groff reads it without a warning.
#[test]
fn the_man_page_has_files_environment_exit_status_examples() {
    let w = World::new(BIN);
    let man = ok(&w.cmd(&w.work()).arg("manpage").output().unwrap());
    let heads: Vec<&str> = man.lines().filter(|l| l.starts_with(".SH ")).collect();
    for h in [
        ".SH OPTIONS",
        ".SH FILES",
        ".SH ENVIRONMENT",
        ".SH \"EXIT STATUS\"",
        ".SH EXAMPLES",
    ] {
        assert!(heads.contains(&h), "{h} not in {heads:?}");
    }
    let r = reference();
    for cell in first_cells(section(&r, "## Environment")) {
        let var = cell.trim_matches('`').split('`').next().unwrap();
        assert!(man.contains(var), "{var} not in the man page");
    }
    let groff = std::process::Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    if let Ok(mut g) = groff {
        use std::io::Write;
        g.stdin.take().unwrap().write_all(man.as_bytes()).unwrap();
        let out = g.wait_with_output().unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{}",
            stderr(&out)
        );
    }
}

/// The layer table lives in src/layers.rs only: no document copies its rows (a table row
/// that starts with a layer's folder, `| \`policy/\` |`).
#[test]
fn no_document_copies_the_layer_table() {
    let mut layers = Vec::new();
    for e in fs::read_dir(repo().join("src")).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            layers.push(format!("| `{}/` |", e.file_name().to_str().unwrap()));
        }
    }
    assert!(layers.len() >= 9, "{layers:?}");
    let copies = |md: &str| -> Vec<String> {
        md.lines()
            .filter(|l| layers.iter().any(|row| l.starts_with(row.as_str())))
            .map(String::from)
            .collect()
    };
    for f in doc_files() {
        let found = copies(&read_in_repo(&f).unwrap());
        assert!(
            found.is_empty(),
            "{} copies src/layers.rs: {found:?}",
            f.display()
        );
    }
    // The control: the table as ARCHITECTURE.md held it is caught.
    assert_eq!(
        copies("| layer | what |\n|---|---|\n| `policy/` | pure data |\n").len(),
        1
    );
}

/// The roles `src/main.rs` dispatches on: each `Some(a) if a == NAME` arm's constant,
/// resolved to its `pub const NAME: &str = "--..."` anywhere in src/.
fn roles_main_dispatches() -> BTreeSet<String> {
    let main = fs::read_to_string(repo().join("src/main.rs")).unwrap();
    let names: Vec<String> = main
        .lines()
        .filter_map(|l| l.split_once("if a == ").map(|(_, r)| r))
        .map(|r| {
            let r = r.split_whitespace().next().unwrap_or_default();
            r.rsplit("::").next().unwrap_or(r).to_string()
        })
        .collect();
    assert!(names.len() >= 3, "no role arms in src/main.rs: {names:?}");
    let mut consts = std::collections::BTreeMap::new();
    fn walk(dir: &Path, out: &mut std::collections::BTreeMap<String, String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                for l in fs::read_to_string(&p).unwrap().lines() {
                    let Some(rest) = l.trim().strip_prefix("pub const ") else {
                        continue;
                    };
                    let Some((name, value)) = rest.split_once(": &str = \"") else {
                        continue;
                    };
                    if let Some(v) = value.strip_suffix("\";") {
                        out.insert(name.to_string(), v.to_string());
                    }
                }
            }
        }
    }
    walk(&repo().join("src"), &mut consts);
    names
        .iter()
        .map(|n| {
            consts
                .get(n)
                .unwrap_or_else(|| panic!("src/main.rs's role {n} is no `pub const {n}: &str`"))
                .clone()
        })
        .collect()
}

/// The hidden roles a Processes section names (`--sandbox-init`, `--internal-...`), and
/// the ones `src/main.rs` dispatches that it does not name, or names but are not roles.
fn diagram_differs(section: &str, roles: &BTreeSet<String>) -> Vec<String> {
    let named: BTreeSet<String> = long_options(section)
        .into_iter()
        .filter(|o| o.starts_with("--internal-") || o == "--sandbox-init")
        .collect();
    let mut out = Vec::new();
    for r in roles.difference(&named) {
        out.push(format!(
            "{r} is a role of src/main.rs that ARCHITECTURE.md does not show"
        ));
    }
    for r in named.difference(roles) {
        out.push(format!(
            "{r} is in ARCHITECTURE.md's processes but src/main.rs has no such role"
        ));
    }
    out
}

#[test]
fn the_process_diagram_names_the_roles_main_dispatches() {
    let arch = fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let processes = section(&arch, "## Processes");
    assert!(
        processes.contains("cbx-keeper"),
        "the keeper is not in the diagram"
    );
    let roles = roles_main_dispatches();
    assert!(roles.contains("--sandbox-init"), "{roles:?}");
    assert_eq!(diagram_differs(processes, &roles), Vec::<String>::new());
    // The control: the section as it was (a removed limits watcher) is caught.
    let old = format!("{processes}\n├─ claudebox --internal-limits-watch ...\n");
    assert_eq!(
        diagram_differs(&old, &roles),
        ["--internal-limits-watch is in ARCHITECTURE.md's processes but src/main.rs has no such role"]
    );
}
