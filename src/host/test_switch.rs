//! The tests' switches (`CLAUDEBOX_TEST_*` environment variables: a control that turns a
//! protection off, the lab's upstream for the login broker, a delay that widens a race)
//! exist in debug builds only (issue 34): [`get`] is the one place that reads them, and
//! in a release build it is a function that returns `None` without looking, so that the
//! names are not even in the binary (`tests/vm/readme-install.sh` greps the installed
//! release binary for `CLAUDEBOX_TEST_` and runs it with the broker's upstream switch
//! set). The test below reads `src/` and fails on any `CLAUDEBOX_TEST_` name that reaches
//! the environment some other way.

use std::ffi::OsString;

/// The value of the test switch `name` (`CLAUDEBOX_TEST_...`) in a debug build.
#[cfg(debug_assertions)]
pub fn get(name: &str) -> Option<OsString> {
    debug_assert!(name.starts_with("CLAUDEBOX_TEST_"), "{name}");
    std::env::var_os(name)
}

/// A release build: no test switch is read.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn get(_name: &str) -> Option<OsString> {
    None
}

/// Whether the switch is set to anything non-empty.
#[inline(always)]
pub fn on(name: &str) -> bool {
    get(name).is_some_and(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    const PREFIX: &str = "CLAUDEBOX_TEST_";

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// `text` without its `#[cfg(test)]` items (a test module, a test-only function).
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

    /// The code of a line: without a `//` comment (none of the checked lines holds `//`
    /// in a string).
    fn code(line: &str) -> &str {
        line.split("//").next().unwrap_or("")
    }

    /// What is wrong in one file's non-test text: a `CLAUDEBOX_TEST_` name outside
    /// `test_switch::get`/`on` and outside a `const NAME: &str = "..."`, and any use of
    /// such a constant's name outside those calls. Returns the switches it found too.
    fn check(file: &str, text: &str, consts: &[String]) -> (Vec<String>, Vec<String>) {
        // `test_switch::get(WHAT)` or `test_switch::on(WHAT)`, WHAT the quoted name, the
        // constant, or a path ending in the constant, on one line.
        let gate = |l: &str, what: &str| {
            l.match_indices("test_switch::").any(|(at, _)| {
                let r = &l[at + "test_switch::".len()..];
                let arg = r.strip_prefix("get(").or_else(|| r.strip_prefix("on("));
                arg.and_then(|a| a.split(')').next())
                    .is_some_and(|a| a == what || a.ends_with(&format!("::{what}")))
            })
        };
        let mut wrong = Vec::new();
        let mut names = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let c = code(line);
            let mut rest = c;
            while let Some(at) = rest.find(PREFIX) {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit() || *ch == '_')
                    .collect();
                names.push(name.clone());
                let quoted = format!("\"{name}\"");
                let declared = c.trim_start().starts_with("pub const ")
                    || c.trim_start().starts_with("const ");
                if !(declared && c.contains(&format!("= {quoted};")) || gate(c, &quoted)) {
                    wrong.push(format!("{file}:{}: {name} read outside test_switch", i + 1));
                }
                rest = &rest[at + name.len()..];
            }
            for k in consts {
                let used = c.match_indices(k.as_str()).any(|(at, _)| {
                    let before = c[..at].chars().last();
                    let after = c[at + k.len()..].chars().next();
                    let ident =
                        |ch: Option<char>| ch.is_some_and(|x| x.is_alphanumeric() || x == '_');
                    !ident(before) && !ident(after)
                });
                let declaration = c.contains(&format!("const {k}:"));
                if used && !declaration && !gate(c, k) {
                    wrong.push(format!("{file}:{}: {k} used outside test_switch", i + 1));
                }
            }
        }
        (wrong, names)
    }

    /// The names of the constants that hold a switch's name.
    fn consts_of(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| {
                let c = code(l).trim_start();
                let c = c.strip_prefix("pub ").unwrap_or(c);
                let c = c.strip_prefix("const ")?;
                let (name, value) = c.split_once(':')?;
                value
                    .contains(&format!("\"{PREFIX}"))
                    .then(|| name.trim().to_string())
            })
            .collect()
    }

    /// Every `CLAUDEBOX_TEST_` name in `src/` reaches the environment through [`super::get`]
    /// alone, so a release build reads none: the list is the source's own, a new switch
    /// cannot be missed.
    #[test]
    fn every_test_switch_in_src_is_read_through_the_gate() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let texts: Vec<(String, String)> = files
            .iter()
            .filter(|f| !f.ends_with("host/test_switch.rs"))
            .map(|f| {
                let rel = f.strip_prefix(&src).unwrap().display().to_string();
                (rel, without_tests(&std::fs::read_to_string(f).unwrap()))
            })
            .collect();
        let consts: Vec<String> = texts.iter().flat_map(|(_, t)| consts_of(t)).collect();
        let mut wrong = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for (f, t) in &texts {
            let (w, n) = check(f, t, &consts);
            wrong.extend(w);
            names.extend(n);
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        // The switches the issue names are among those found (the scan sees them).
        for want in [
            "CLAUDEBOX_TEST_BROKER_UPSTREAM_PROXY",
            "CLAUDEBOX_TEST_BROKER_UPSTREAM_CA",
            "CLAUDEBOX_TEST_PROXY_OPEN_TO_ALL",
        ] {
            assert!(names.contains(want), "{want} not found in src/: {names:?}");
        }
    }

    /// The control: reads that go around the gate are found.
    #[test]
    fn a_switch_read_around_the_gate_is_found() {
        let consts = vec!["X_ENV".to_string()];
        for bad in [
            "let v = std::env::var_os(\"CLAUDEBOX_TEST_X\");",
            "let v = std::env::var(X_ENV);",
            "cmd.env(X_ENV, \"1\");",
            "if cfg!(debug_assertions) && std::env::var_os(\"CLAUDEBOX_TEST_Y\").is_some() {}",
        ] {
            let (wrong, _) = check("f.rs", bad, &consts);
            assert!(!wrong.is_empty(), "not found: {bad}");
        }
        for good in [
            "pub const X_ENV: &str = \"CLAUDEBOX_TEST_X\";",
            "let v = crate::host::test_switch::get(\"CLAUDEBOX_TEST_X\");",
            "let v = crate::host::test_switch::on(X_ENV);",
            "let v = crate::host::test_switch::on(crate::policy::X_ENV);",
            "/// [`X_ENV`] and CLAUDEBOX_TEST_X in a comment",
        ] {
            let (wrong, _) = check("f.rs", good, &consts);
            assert!(wrong.is_empty(), "{good}: {wrong:?}");
        }
    }
}
