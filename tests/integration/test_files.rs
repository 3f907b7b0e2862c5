//! Every `.rs` file under `tests/integration/` is compiled into the test binary, and every
//! one under `tests/lab/src/` into the lab crate: a file no `mod` names is never built, and
//! its tests (or the helpers a test thinks it changed) silently never run.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The module files reachable from `root` (main.rs or lib.rs) through `mod NAME;`
/// declarations: NAME.rs or NAME/mod.rs beside a main.rs, lib.rs or mod.rs, in the folder
/// named after any other file.
fn compiled(root: &Path) -> BTreeSet<PathBuf> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(file) = todo.pop() {
        if !seen.insert(file.clone()) {
            continue;
        }
        let dir = file.parent().unwrap();
        let stem = file.file_stem().unwrap();
        let children = if stem == "main" || stem == "lib" || stem == "mod" {
            dir.to_path_buf()
        } else {
            dir.join(stem)
        };
        for name in declared_mods(&fs::read_to_string(&file).unwrap()) {
            let flat = children.join(format!("{name}.rs"));
            let nested = children.join(&name).join("mod.rs");
            todo.push(if nested.exists() { nested } else { flat });
        }
    }
    seen
}

/// The NAMEs of `mod NAME;` lines (with any visibility), not of inline `mod NAME {`.
fn declared_mods(src: &str) -> Vec<String> {
    src.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub(super) "))
                .or_else(|| l.strip_prefix("pub "))
                .unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(|n| n.trim().to_string())
        })
        .collect()
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path, out: &mut BTreeSet<PathBuf>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.insert(p);
        }
    }
}

/// The `.rs` files below `dir` that `dir/ROOT` (main.rs or lib.rs) does not compile.
fn not_compiled(dir: &Path, root: &str) -> Vec<PathBuf> {
    let mut all = BTreeSet::new();
    rust_files(dir, &mut all);
    let built = compiled(&dir.join(root));
    all.difference(&built).cloned().collect()
}

#[test]
fn every_test_file_is_compiled() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dir, root) in [
        ("tests/integration", "main.rs"),
        ("tests/lab/src", "lib.rs"),
    ] {
        let orphans = not_compiled(&here.join(dir), root);
        assert!(
            orphans.is_empty(),
            "not compiled by {dir}/{root} (add a `mod` line for each): {orphans:#?}"
        );
    }
}

/// Control: a file no `mod` names, at the top and in a module's folder, beside a main.rs
/// or a lib.rs, is found; a commented-out `mod` line does not count.
#[test]
fn a_file_no_mod_names_is_found() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::create_dir_all(d.join("common")).unwrap();
    fs::write(d.join("main.rs"), "mod common;\nmod sub;\n// mod gone;\n").unwrap();
    fs::write(d.join("common/mod.rs"), "pub mod lab;\n").unwrap();
    fs::write(d.join("common/lab.rs"), "").unwrap();
    fs::write(d.join("sub.rs"), "mod inner;\nmod inline {}\n").unwrap();
    fs::write(d.join("sub/inner.rs"), "").unwrap();
    assert!(not_compiled(d, "main.rs").is_empty());
    fs::write(d.join("gone.rs"), "").unwrap();
    fs::write(d.join("sub/stray.rs"), "").unwrap();
    assert_eq!(
        not_compiled(d, "main.rs"),
        vec![d.join("gone.rs"), d.join("sub/stray.rs")]
    );
    // A library's root (the lab crate's lib.rs) names its modules the same way.
    let l = t.path().join("lib");
    fs::create_dir_all(&l).unwrap();
    fs::write(
        l.join("lib.rs"),
        "pub mod agent;
",
    )
    .unwrap();
    fs::write(l.join("agent.rs"), "").unwrap();
    assert!(not_compiled(&l, "lib.rs").is_empty());
    fs::write(l.join("bench.rs"), "").unwrap();
    assert_eq!(not_compiled(&l, "lib.rs"), vec![l.join("bench.rs")]);
}
