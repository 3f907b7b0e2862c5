//! What the allowlist proxy denied during one launch, read back from the project's denied
//! log (`ProjectState::denied_log`, written by the proxy, mounted in no sandbox) so that
//! the launcher names the hosts and the flag that allows them at the sandbox's end: a
//! client's own message ("403 ... forbidden by your security policy") does not say.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::policy::layout::ProjectState;
use crate::state::beneath;

/// Where the log stood when the launch began: its inode and size (none: no log yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark(Option<(u64, u64)>);

/// The flag each denial line ends with (see `proxy::Config::record_denied`).
pub const ALLOW_PREFIX: &str = " (allow it with ";

fn log_name(st: &ProjectState) -> Option<std::path::PathBuf> {
    st.denied_log().file_name().map(std::path::PathBuf::from)
}

pub fn mark(st: &ProjectState) -> Mark {
    let Ok(dir) = beneath::Dir::open(&st.dir) else {
        return Mark(None);
    };
    let Some(name) = log_name(st) else {
        return Mark(None);
    };
    Mark(dir.stat(&name).ok().map(|s| (s.st_ino, s.st_size as u64)))
}

/// The denials logged since `m`, one per host and port, in the order first seen: each
/// `(what, flag)`, e.g. `("CONNECT registry.npmjs.org:443", "--allow-host
/// registry.npmjs.org")`. A log rotated meanwhile is read from its start; lines of the
/// login broker's refusals are left out.
pub fn since(st: &ProjectState, m: Mark) -> Vec<(String, String)> {
    let Ok(dir) = beneath::Dir::open(&st.dir) else {
        return Vec::new();
    };
    let Some(name) = log_name(st) else {
        return Vec::new();
    };
    let Ok(mut f) = dir.open_read(Path::new(&name)) else {
        return Vec::new();
    };
    let from = match (m.0, dir.stat(&name)) {
        (Some((ino, size)), Ok(s)) if s.st_ino == ino && s.st_size as u64 >= size => size,
        _ => 0,
    };
    let mut text = Vec::new();
    // At most the log's cap (256 KiB) and a little.
    if f.seek(SeekFrom::Start(from)).is_err() || f.take(1 << 19).read_to_end(&mut text).is_err() {
        return Vec::new();
    }
    parse(&String::from_utf8_lossy(&text))
}

fn parse(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        // `<time> denied <METHOD> <host:port>[ (and N more ...)] (allow it with <flag>)`
        let Some(rest) = line.split_once(" denied ").map(|(_, r)| r) else {
            continue;
        };
        let Some((what, flag)) = rest.rsplit_once(ALLOW_PREFIX) else {
            continue;
        };
        let Some(flag) = flag.strip_suffix(')') else {
            continue;
        };
        let what = what.split(" (and ").next().unwrap_or(what);
        // Written escaped by the proxy; kept printable whatever the file holds.
        let clean = |s: &str| s.chars().filter(|c| !c.is_control()).collect::<String>();
        let (what, flag) = (clean(what), clean(flag));
        if !out.iter().any(|(w, _)| *w == what) {
            out.push((what, flag));
        }
    }
    out
}

/// The line the launcher prints at the end, when anything was denied.
pub fn summary(denied: &[(String, String)], log: &Path) -> Option<String> {
    const SHOWN: usize = 6;
    if denied.is_empty() {
        return None;
    }
    let mut flags: Vec<&str> = Vec::new();
    for (_, f) in denied {
        if !flags.contains(&f.as_str()) {
            flags.push(f);
        }
    }
    let names: Vec<&str> = denied.iter().take(SHOWN).map(|(w, _)| w.as_str()).collect();
    let more = match denied.len().saturating_sub(SHOWN) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let allow: Vec<&str> = flags.iter().take(SHOWN).copied().collect();
    Some(format!(
        "network: the allowlist denied {}{more} in this sandbox; to allow {}: {} (every \
         denial is in {})",
        names.join(", "),
        if denied.len() == 1 { "it" } else { "them" },
        allow.join(" "),
        crate::policy::escape::shown(log)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_are_read_once_each_with_their_flag() {
        let log = "2026-12-05T21:00:00Z denied CONNECT registry.npmjs.org:443 (allow it with --allow-host registry.npmjs.org)\n\
                   2026-12-05T21:00:01Z refused login broker 403 GET /x: no (allow it with nothing)\n\
                   2026-12-05T21:00:02Z denied CONNECT registry.npmjs.org:443 (and 3 more times since its last line) (allow it with --allow-host registry.npmjs.org)\n\
                   2026-12-05T21:00:03Z denied GET example.com:80 (allow it with --allow-host example.com)\n\
                   2026-12-05T21:00:04Z denied CONNECT old.example:443\n";
        let d = parse(log);
        assert_eq!(
            d,
            [
                (
                    "CONNECT registry.npmjs.org:443".to_string(),
                    "--allow-host registry.npmjs.org".to_string()
                ),
                (
                    "GET example.com:80".to_string(),
                    "--allow-host example.com".to_string()
                ),
            ]
        );
        let s = summary(&d, Path::new("/s/network-denied.log")).unwrap();
        assert!(
            s.contains("registry.npmjs.org:443, GET example.com:80")
                && s.contains("--allow-host registry.npmjs.org --allow-host example.com"),
            "{s}"
        );
        assert!(summary(&[], Path::new("/x")).is_none());
    }

    #[test]
    fn only_what_came_after_the_mark_counts() {
        let d = tempfile::tempdir().unwrap();
        let st = ProjectState {
            dir: d.path().to_path_buf(),
        };
        let line = |h: &str| {
            format!(
                "2026-12-05T21:00:00Z denied CONNECT {h}:443 (allow it with --allow-host {h})\n"
            )
        };
        assert_eq!(mark(&st), Mark(None));
        std::fs::write(st.denied_log(), line("before.example")).unwrap();
        let m = mark(&st);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(st.denied_log())
            .unwrap();
        std::io::Write::write_all(&mut f, line("after.example").as_bytes()).unwrap();
        let got = since(&st, m);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].0.contains("after.example"));
        // No log at the launch: all of it.
        assert_eq!(since(&st, Mark(None)).len(), 2);
    }
}
