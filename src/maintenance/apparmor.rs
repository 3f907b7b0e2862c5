//! AppArmor and the bwrap claudebox runs: `--apparmor-profile` prints the profile for it,
//! and `--check` reports the state: whether the kernel restricts unprivileged user
//! namespaces, whether AppArmor is enabled, and which profile covers that bwrap.
//!
//! [`Facts::probe`] reads the host as an ordinary user can: sysfs and procfs files any user
//! may read, and the label of a real bwrap process (`host::apparmor`). What cannot be read
//! is "unknown" with why, never an error. [`classify`] is pure.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::host;
use crate::host::apparmor::{label_of_bwrap, restrict_sysctl};
use crate::policy::apparmor::{profile_for, Label, INSTALL_PATH, NAME, ONE_STEP};
use crate::policy::escape::Shown;

/// `--apparmor-profile`: the shipped profile attached to the bwrap claudebox uses, on
/// stdout.
pub fn print_profile() -> Result<ExitCode> {
    let bwrap = host::find_bwrap()?;
    let real =
        fs::canonicalize(&bwrap).with_context(|| format!("cannot resolve {}", bwrap.shown()))?;
    let text = profile_for(&real)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    eprintln!(
        "claudebox: the AppArmor profile for {}; it goes to {INSTALL_PATH}, loaded with \
         `sudo apparmor_parser -r {INSTALL_PATH}`",
        real.shown()
    );
    Ok(ExitCode::SUCCESS)
}

/// Whether AppArmor is enabled in the running kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enabled {
    Yes,
    /// Not enabled, and how we know.
    No(String),
    /// Why we cannot tell.
    Unknown(String),
}

/// What `--check` reads about AppArmor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub uid: u32,
    /// `kernel.apparmor_restrict_unprivileged_userns` (None: the kernel has no such switch).
    pub restrict: Option<bool>,
    pub enabled: Enabled,
    /// The bwrap claudebox uses, symlinks resolved (profiles attach to this path).
    pub bwrap: PathBuf,
    /// The label a bwrap process gets, or why it could not be read.
    pub label: Result<Label, String>,
    /// Profile files in /etc/apparmor.d (not disabled) other than claudebox's that name
    /// this bwrap: two loaded profiles attaching to one path make AppArmor attach neither.
    pub others_naming_bwrap: Vec<String>,
    /// /etc/apparmor.d/claudebox-bwrap exists.
    pub installed: bool,
}

impl Facts {
    pub fn probe(bwrap: &Path) -> Facts {
        let bwrap = fs::canonicalize(bwrap).unwrap_or_else(|_| bwrap.to_path_buf());
        let enabled = enabled();
        let label = match &enabled {
            Enabled::No(why) => Err(format!("AppArmor is not enabled ({why})")),
            _ => label_of_bwrap(&bwrap),
        };
        Facts {
            uid: nix::unistd::getuid().as_raw(),
            restrict: restrict_sysctl(),
            enabled,
            others_naming_bwrap: others_naming(Path::new("/etc/apparmor.d"), &bwrap),
            installed: Path::new(INSTALL_PATH).is_file(),
            bwrap,
            label,
        }
    }
}

fn enabled() -> Enabled {
    match fs::read_to_string("/sys/module/apparmor/parameters/enabled") {
        Ok(s) if s.trim() == "Y" => return Enabled::Yes,
        Ok(s) => {
            return Enabled::No(format!(
                "/sys/module/apparmor/parameters/enabled is {}",
                s.trim().shown()
            ))
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Enabled::Unknown(format!(
                "cannot read /sys/module/apparmor/parameters/enabled: {e}"
            ))
        }
        Err(_) => {}
    }
    match fs::read_to_string("/sys/kernel/security/lsm") {
        Ok(lsm) if lsm.split(',').any(|m| m.trim() == "apparmor") => Enabled::Yes,
        Ok(lsm) => Enabled::No(format!(
            "not among the kernel's security modules: {}",
            lsm.trim().shown()
        )),
        Err(_) if !Path::new("/sys/module").exists() => {
            Enabled::Unknown("/sys is not mounted".into())
        }
        Err(_) => Enabled::No("this kernel has no AppArmor (no /sys/module/apparmor)".into()),
    }
}

/// The profile files of `dir` other than claudebox's, not disabled, with a non-comment line
/// naming `bwrap`.
fn others_naming(dir: &Path, bwrap: &Path) -> Vec<String> {
    let Some(needle) = bwrap.to_str() else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == NAME || dir.join("disable").join(&name).exists() {
            continue;
        }
        if !e.file_type().is_ok_and(|t| t.is_file())
            || e.metadata().is_ok_and(|m| m.len() > 1 << 20)
        {
            continue;
        }
        let Ok(text) = fs::read_to_string(e.path()) else {
            continue;
        };
        if text
            .lines()
            .any(|l| !l.trim_start().starts_with('#') && names_path(l, needle))
        {
            found.push(name);
        }
    }
    found.sort();
    found
}

/// `line` holds `path` as a whole word (not a prefix of a longer path).
fn names_path(line: &str, path: &str) -> bool {
    line.match_indices(path).any(|(i, _)| {
        let after = line[i + path.len()..].chars().next();
        !matches!(after, Some(c) if c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

/// What `--check`'s `apparmor` row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub level: Level,
    pub detail: String,
    pub fix: Option<String>,
}

fn verdict(level: Level, detail: String, fix: Option<String>) -> Verdict {
    Verdict { level, detail, fix }
}

/// The AppArmor state, from the facts alone.
pub fn classify(f: &Facts) -> Verdict {
    let bwrap = f.bwrap.shown();
    if let Enabled::No(why) = &f.enabled {
        return verdict(
            Level::Ok,
            format!("not enabled: {why}; no profile needed"),
            None,
        );
    }
    let sysctl = match f.restrict {
        Some(true) => "kernel.apparmor_restrict_unprivileged_userns = 1",
        Some(false) => "kernel.apparmor_restrict_unprivileged_userns = 0",
        None => "no kernel.apparmor_restrict_unprivileged_userns",
    };
    let enabled = match &f.enabled {
        Enabled::Unknown(why) => format!("enabled: unknown ({why})"),
        _ => "enabled".to_string(),
    };
    let conflict: String = f
        .others_naming_bwrap
        .iter()
        .map(|n| {
            let file = format!("/etc/apparmor.d/{}", n.shown());
            format!(
                "; {file} names {bwrap} too (two profiles naming one program make AppArmor \
                 attach neither), disable it: sudo ln -s {file} /etc/apparmor.d/disable/ && \
                 sudo apparmor_parser -R {file}"
            )
        })
        .collect();
    // Ubuntu's bwrap-userns-restrict: bwrap gets its capabilities, what it runs gets none,
    // so a bwrap inside the sandbox cannot start, whatever the sysctl says.
    if let Ok(Label::Profile { name, mode }) = &f.label {
        if name == "bwrap" && mode == "enforce" {
            return verdict(
                Level::Warn,
                format!(
                    "{enabled}, {sysctl}; {bwrap} runs under the profile `bwrap` (enforce), \
                     the one Ubuntu's bwrap-userns-restrict loads: the sandbox starts, but \
                     what bwrap runs gets no capabilities, so a bwrap inside it (Claude \
                     Code's Bash sandbox) cannot start"
                ),
                Some(format!(
                    "{ONE_STEP}; then disable bwrap-userns-restrict (two profiles naming one \
                     bwrap make AppArmor attach neither): sudo ln -s \
                     /etc/apparmor.d/bwrap-userns-restrict /etc/apparmor.d/disable/ && sudo \
                     apparmor_parser -R /etc/apparmor.d/bwrap-userns-restrict"
                )),
            );
        }
    }
    let label = match &f.label {
        Ok(Label::Unconfined) => format!("no profile covers {bwrap}"),
        Ok(Label::Profile { name, mode }) if name == NAME => {
            format!("the profile {NAME} is loaded and covers {bwrap} ({mode})")
        }
        Ok(Label::Profile { name, mode }) => {
            format!(
                "{bwrap} runs under the profile {} ({})",
                name.shown(),
                mode.shown()
            )
        }
        Err(why) => format!("which profile covers {bwrap} is unknown: {why}"),
    };
    if f.restrict != Some(true) {
        return verdict(
            Level::Ok,
            format!("{enabled}, {sysctl}: user namespaces are not restricted; {label}"),
            None,
        );
    }
    if f.uid == 0 {
        return verdict(
            Level::Ok,
            format!("{enabled}, {sysctl}, which does not restrict root; {label}"),
            None,
        );
    }
    match &f.label {
        Ok(Label::Profile { name, .. }) if name == NAME => {
            verdict(Level::Ok, format!("{enabled}, {sysctl}; {label}"), None)
        }
        Ok(Label::Unconfined) => {
            let why = if f.installed && !f.others_naming_bwrap.is_empty() {
                format!(
                    " ({INSTALL_PATH} exists, but another profile names {bwrap} too, and \
                     AppArmor then attaches neither)"
                )
            } else if f.installed {
                format!(" ({INSTALL_PATH} exists but is not loaded, or names another path)")
            } else {
                String::new()
            };
            verdict(
                Level::Fail,
                format!(
                    "{enabled}, {sysctl} and {label}{why}: bwrap may not create user namespaces"
                ),
                Some(format!("{ONE_STEP}{conflict}")),
            )
        }
        Ok(Label::Profile { mode, .. }) if mode == "enforce" => verdict(
            Level::Warn,
            format!(
                "{enabled}, {sysctl}; {label}, which may deny what the sandbox needs (the \
                 sandbox rows below show whether it starts)"
            ),
            Some(format!("{ONE_STEP}{conflict}")),
        ),
        Ok(Label::Profile { .. }) => verdict(
            Level::Ok,
            format!("{enabled}, {sysctl}; {label} (not claudebox's, which is not needed then)"),
            None,
        ),
        Err(_) => verdict(
            Level::Warn,
            format!("{enabled}, {sysctl}; {label}"),
            Some(ONE_STEP.to_string()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(restrict: Option<bool>, label: Result<Label, String>) -> Facts {
        Facts {
            uid: 1000,
            restrict,
            enabled: Enabled::Yes,
            bwrap: "/usr/bin/bwrap".into(),
            label,
            others_naming_bwrap: Vec::new(),
            installed: false,
        }
    }

    fn profile(name: &str, mode: &str) -> Result<Label, String> {
        Ok(Label::Profile {
            name: name.into(),
            mode: mode.into(),
        })
    }

    #[test]
    fn restricted_and_uncovered_fails_with_the_one_step() {
        let v = classify(&facts(Some(true), Ok(Label::Unconfined)));
        assert_eq!(v.level, Level::Fail);
        assert!(
            v.detail.contains("no profile covers /usr/bin/bwrap"),
            "{}",
            v.detail
        );
        assert_eq!(v.fix.as_deref(), Some(ONE_STEP));
        // The control: our profile loaded.
        let v = classify(&facts(Some(true), profile(NAME, "unconfined")));
        assert_eq!(v.level, Level::Ok);
        assert!(
            v.detail.contains("the profile claudebox-bwrap is loaded"),
            "{}",
            v.detail
        );
        assert_eq!(v.fix, None);
    }

    #[test]
    fn conflicting_attachments_are_named() {
        let f = Facts {
            installed: true,
            others_naming_bwrap: vec!["bwrap-userns-restrict".into()],
            ..facts(Some(true), Ok(Label::Unconfined))
        };
        let v = classify(&f);
        assert_eq!(v.level, Level::Fail);
        assert!(
            v.detail
                .contains("another profile names /usr/bin/bwrap too"),
            "{}",
            v.detail
        );
        let fix = v.fix.unwrap();
        assert!(fix.starts_with(ONE_STEP));
        assert!(
            fix.contains("/etc/apparmor.d/bwrap-userns-restrict"),
            "{fix}"
        );
        let f = Facts {
            installed: true,
            ..facts(Some(true), Ok(Label::Unconfined))
        };
        assert!(classify(&f).detail.contains("exists but is not loaded"));
    }

    #[test]
    fn ubuntus_bwrap_profile_stops_the_nested_sandbox() {
        for restrict in [Some(true), Some(false), None] {
            let v = classify(&facts(restrict, profile("bwrap", "enforce")));
            assert_eq!(v.level, Level::Warn, "{restrict:?}");
            assert!(v.detail.contains("bwrap-userns-restrict"), "{}", v.detail);
            let fix = v.fix.unwrap();
            assert!(fix.starts_with(ONE_STEP));
            assert!(fix.contains("/etc/apparmor.d/disable/"), "{fix}");
        }
        // The common hand-made `profile bwrap ... flags=(unconfined)` does not strip them.
        let v = classify(&facts(Some(true), profile("bwrap", "unconfined")));
        assert_eq!(v.level, Level::Ok, "{}", v.detail);
    }

    #[test]
    fn not_restricted_or_not_enabled_is_ok() {
        for restrict in [Some(false), None] {
            let v = classify(&facts(restrict, Ok(Label::Unconfined)));
            assert_eq!(v.level, Level::Ok);
            assert!(v.detail.contains("not restricted"), "{}", v.detail);
        }
        let f = Facts {
            enabled: Enabled::No("this kernel has no AppArmor (no /sys/module/apparmor)".into()),
            ..facts(None, Err("AppArmor is not enabled".into()))
        };
        let v = classify(&f);
        assert_eq!(v.level, Level::Ok);
        assert!(
            v.detail
                .starts_with("not enabled: this kernel has no AppArmor"),
            "{}",
            v.detail
        );
        let root = Facts {
            uid: 0,
            ..facts(Some(true), Ok(Label::Unconfined))
        };
        assert_eq!(classify(&root).level, Level::Ok);
    }

    #[test]
    fn unknown_label_warns_with_why() {
        let v = classify(&facts(
            Some(true),
            Err("cannot read the label of a bwrap process: Permission denied".into()),
        ));
        assert_eq!(v.level, Level::Warn);
        assert!(
            v.detail.contains("unknown: cannot read the label"),
            "{}",
            v.detail
        );
        let v = classify(&facts(Some(true), profile("someone-else", "enforce")));
        assert_eq!(v.level, Level::Warn);
        let v = classify(&facts(Some(true), profile("someone-else", "complain")));
        assert_eq!(v.level, Level::Ok);
    }

    #[test]
    fn finds_other_profiles_naming_the_bwrap() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(
            d.join("bwrap-userns-restrict"),
            "# names /usr/bin/bwrap in a comment only\nprofile bwrap /usr/bin/bwrap flags=(attach_disconnected) {\n}\n",
        )
        .unwrap();
        fs::write(d.join("comment-only"), "# /usr/bin/bwrap\n").unwrap();
        fs::write(d.join("longer"), "profile x /usr/bin/bwrap2 {}\n").unwrap();
        fs::write(d.join(NAME), "profile claudebox-bwrap /usr/bin/bwrap {}\n").unwrap();
        fs::write(d.join("disabled"), "profile y /usr/bin/bwrap {}\n").unwrap();
        fs::create_dir(d.join("disable")).unwrap();
        fs::write(d.join("disable/disabled"), "").unwrap();
        assert_eq!(
            others_naming(d, Path::new("/usr/bin/bwrap")),
            vec!["bwrap-userns-restrict".to_string()]
        );
    }

    /// The probe on this machine: never panics, and says why when it cannot tell.
    #[test]
    fn probe_fails_soft() {
        let f = Facts::probe(Path::new("/nonexistent/bwrap"));
        let v = classify(&f);
        assert!(!v.detail.is_empty());
        if let Ok(bwrap) = which::which("bwrap") {
            let f = Facts::probe(&bwrap);
            let v = classify(&f);
            assert!(!v.detail.contains('\n'), "{}", v.detail);
            println!("{v:?}");
        }
    }
}
