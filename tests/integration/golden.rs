//! Golden `--dry-run` files: what a launch would mount, set and run, for the default (open)
//! network, allowlist, none and a named session, kept in `tests/integration/golden/` so
//! that a change in the sandbox shows as a diff in review. The output is normalized: the
//! throwaway world's directory is `$ROOT` (HOME is `$ROOT/home`, the project
//! `$ROOT/work/proj`), the binary under test `$CLAUDEBOX`, bwrap `$BWRAP`, the ids `$ID`,
//! `$INSTANCE` and `$UUID`; the rows of the host's top-level system directories (they differ
//! between machines) and the limits rows (they depend on cgroup delegation) are replaced
//! by one line each; the command is one option per line.
//!
//! Refresh after an intended change, then review `git diff tests/integration/golden/`:
//!
//! ```sh
//! CLAUDEBOX_BLESS=1 cargo test --test integration golden::
//! ```
//!
//! No golden file for `--gpu`: its rows name this machine's device nodes (`/dev/nvidia*`,
//! `/dev/dri/*`, ...), which the test machines do not have; `gpu.rs` tests the rows.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BIN;
use lab::{env_in_dry_run, init_repo, stderr, stdout, World};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/golden")
}

/// Why-texts of the rows that name the host's own top-level system directories.
const SYSTEM_WHY: &[&str] = &["system, read-only", "system symlink, as on the host"];

/// `--dry-run ARGS` in a fresh world's project, normalized (see the module's comment).
fn normalized_dry_run(args: &[&str]) -> String {
    let w = World::new(BIN);
    let proj = w.work().join("proj");
    init_repo(&proj);
    let o = w.cmd(&proj).args(args).arg("--dry-run").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let id = env_in_dry_run(&out, "CLAUDEBOX_PROJECT_ID").expect("CLAUDEBOX_PROJECT_ID");
    let instance = env_in_dry_run(&out, "CLAUDEBOX_INSTANCE_ID").expect("CLAUDEBOX_INSTANCE_ID");
    let root = w.root().to_str().unwrap().to_string();
    let paths = |s: &str| -> String {
        uuids(
            &s.replace(BIN, "$CLAUDEBOX")
                .replace(&root, "$ROOT")
                .replace(&id, "$ID")
                .replace(&instance, "$INSTANCE"),
        )
    };

    let mut text = String::new();
    let mut system: Vec<(String, String)> = Vec::new();
    let mut in_limits = false;
    let mut lines = out.lines().peekable();
    while let Some(line) = lines.next() {
        if lines.peek().is_none() {
            text += "# (one option per line, the system rows left out)\n";
            text += &command(line, &system, &paths);
            break;
        }
        if line.starts_with('#') {
            in_limits = line.starts_with("# limits");
            text += &paths(line);
            text.push('\n');
            if in_limits {
                text += "$LIMITS (this machine's cgroup delegation)\n";
            }
            continue;
        }
        if in_limits {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() >= 4 && SYSTEM_WHY.contains(&cols[3]) {
            if system.is_empty() {
                text += "$SYSTEM (rows for this host's top-level system directories)\n";
            }
            system.push((cols[1].to_string(), cols[2].to_string()));
            continue;
        }
        text += &paths(line);
        text.push('\n');
    }
    let err: Vec<String> = stderr(&o)
        .lines()
        .filter(|l| !l.starts_with("claudebox: limits:"))
        .map(&paths)
        .collect();
    if !err.is_empty() {
        text += "# stderr\n";
        for l in err {
            text += &l;
            text.push('\n');
        }
    }
    text
}

/// The printed command split as sh would (it is shell-quoted), one option and its
/// arguments per line; `--ro-bind S T` and `--symlink S T` of system rows left out.
fn command(line: &str, system: &[(String, String)], paths: &dyn Fn(&str) -> String) -> String {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("printf '%s\\0' {line}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "sh could not split: {line}");
    let words: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .split_terminator('\0')
        .map(str::to_string)
        .collect();
    let mut groups: Vec<Vec<String>> = Vec::new();
    for word in words {
        match groups.last_mut() {
            Some(g) if !word.starts_with("--") => g.push(word),
            _ => groups.push(vec![word]),
        }
    }
    let mut out = String::new();
    for (i, g) in groups.iter().enumerate() {
        if i == 0 && g[0].ends_with("/bwrap") {
            out += "$BWRAP\n";
            continue;
        }
        if g.len() == 3
            && (g[0] == "--ro-bind" || g[0] == "--symlink")
            && system.iter().any(|(s, t)| *s == g[1] && *t == g[2])
        {
            continue;
        }
        out += "  ";
        out += &paths(&g.join(" "));
        out.push('\n');
    }
    out
}

/// Every UUID (8-4-4-4-12 lowercase hex) replaced by `$UUID`.
fn uuids(s: &str) -> String {
    let b = s.as_bytes();
    let shape = [8, 4, 4, 4, 12];
    let is_uuid_at = |i: usize| -> bool {
        let mut j = i;
        for (k, n) in shape.iter().enumerate() {
            if j + n > b.len()
                || !b[j..j + n]
                    .iter()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
            {
                return false;
            }
            j += n;
            if k < 4 {
                if b.get(j) != Some(&b'-') {
                    return false;
                }
                j += 1;
            }
        }
        true
    };
    let mut out = String::new();
    let mut i = 0;
    while i < s.len() {
        if s.is_char_boundary(i) && is_uuid_at(i) {
            out += "$UUID";
            i += 36;
        } else {
            let c = s[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Compares `name`'s golden file with `actual`, or writes it with `CLAUDEBOX_BLESS=1`.
fn check(name: &str, actual: &str) {
    let path = golden_dir().join(format!("{name}.txt"));
    if std::env::var_os("CLAUDEBOX_BLESS").is_some_and(|v| v == "1") {
        fs::create_dir_all(golden_dir()).unwrap();
        fs::write(&path, actual).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        fs::write(tmp.path(), actual).unwrap();
        let diff = Command::new("diff")
            .arg("-u")
            .arg(&path)
            .arg(tmp.path())
            .output()
            .unwrap();
        panic!(
            "--dry-run differs from {} (if intended: CLAUDEBOX_BLESS=1 cargo test --test \
             integration golden::, then review the diff):\n{}",
            path.display(),
            String::from_utf8_lossy(&diff.stdout)
        );
    }
}

#[test]
fn dry_run_open() {
    check("dry-run-open", &normalized_dry_run(&[]));
}

#[test]
fn dry_run_allowlist() {
    check(
        "dry-run-allowlist",
        &normalized_dry_run(&["--network", "allowlist"]),
    );
}

#[test]
fn dry_run_none() {
    check("dry-run-none", &normalized_dry_run(&["--network", "none"]));
}

#[test]
fn dry_run_named_session() {
    check(
        "dry-run-session",
        &normalized_dry_run(&["--session", "review"]),
    );
}

#[test]
fn the_normalizer_replaces_uuids_only() {
    assert_eq!(
        uuids("id c7664977-3f22-4316-aaac-2df8cb4e3622, not c7664977-3f22 or ü"),
        "id $UUID, not c7664977-3f22 or ü"
    );
}
