//! Whether the bwrap found carries the fix for CVE-2026-87766 (`policy::bwrap_cve`): its
//! version, and for an older one its distribution package's changelog, which is where
//! Debian, Ubuntu and the RPM distributions record a backported fix (`dpkg-query -S`
//! names the package owning the binary, `/usr/share/doc/<package>/changelog.Debian.gz`
//! holds its changelog; `rpm -q --changelog -f`). A harmless probe of the bug itself
//! would need a second process racing bwrap's setup: not done at each launch.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::policy::bwrap_cve::{judge, Fix};

/// Runs `cmd` with no input and returns its standard output when it succeeded.
fn output(cmd: &mut Command) -> Option<String> {
    let o = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .env("LC_ALL", "C")
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The changelog of the package that owns `bwrap`, and how it was found.
fn changelog(bwrap: &Path) -> Option<(String, String)> {
    let real = std::fs::canonicalize(bwrap).unwrap_or_else(|_| bwrap.to_path_buf());
    if let Some(owner) = output(Command::new("dpkg-query").arg("-S").arg(&real)) {
        // `bubblewrap: /usr/bin/bwrap` (or `bubblewrap:amd64: ...`).
        let pkg = owner.split(':').next()?.trim().to_string();
        if pkg.is_empty() || pkg.contains('/') {
            return None;
        }
        for name in ["changelog.Debian.gz", "changelog.gz"] {
            let f = Path::new("/usr/share/doc").join(&pkg).join(name);
            if let Some(text) = output(Command::new("gzip").arg("-dc").arg(&f)) {
                return Some((format!("{} names it", f.display()), text));
            }
        }
        return None;
    }
    let text = output(
        Command::new("rpm")
            .args(["-q", "--changelog", "-f"])
            .arg(&real),
    )?;
    Some(("rpm -q --changelog names it".into(), text))
}

/// The debug builds' control for the attempt (tests/integration/escape/bwrap_parents.rs):
/// `CLAUDEBOX_TEST_BWRAP_FIXED` makes any bwrap count as fixed, so the launch does not
/// refuse, as before issue 34. A release build never reads it.
fn pretend_fixed() -> bool {
    super::test_switch::on("CLAUDEBOX_TEST_BWRAP_FIXED")
}

/// Whether `bwrap` carries the fix.
pub fn probe(bwrap: &Path) -> Fix {
    if pretend_fixed() {
        return Fix::Version("(a test switch)".into());
    }
    let Some(out) = output(Command::new(bwrap).arg("--version")) else {
        return Fix::Unknown(format!("{} --version failed", bwrap.display()));
    };
    let first = judge(&out, None);
    if !matches!(first, Fix::Missing { .. }) {
        return first;
    }
    match changelog(bwrap) {
        Some((how, text)) => judge(&out, Some((&how, &text))),
        None => first,
    }
}
