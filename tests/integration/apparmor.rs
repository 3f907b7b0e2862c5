//! The shipped AppArmor profile and `--apparmor-profile`'s text, compiled by the real
//! AppArmor 4 `apparmor_parser` (Debian trixie's 4.1.0, fetched by
//! scripts/install-apparmor-parser.sh; its path in CLAUDEBOX_TEST_APPARMOR_PARSER). Only
//! compiled (`-Q -K`): the test machines' kernels have no AppArmor, so nothing is loaded.
//! Each test has its control: a broken profile is rejected by the same invocation, and a
//! profile naming another path compiles to other policy.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::vm;
use crate::BIN;
use lab::{stderr, stdout, World};

const SHIPPED: &str = include_str!("../../packaging/apparmor/claudebox-bwrap");

/// The AppArmor 4 parser, or None (then the test says why it skipped); in CI (CI=true) its
/// absence fails the test rather than passing silently.
fn parser() -> Option<PathBuf> {
    match std::env::var_os("CLAUDEBOX_TEST_APPARMOR_PARSER").filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => panic!(
            "CLAUDEBOX_TEST_APPARMOR_PARSER is not set in CI: scripts/test sets it from \
             scripts/install-apparmor-parser.sh"
        ),
        None => {
            eprintln!(
                "SKIP: CLAUDEBOX_TEST_APPARMOR_PARSER is not set (run \
                 scripts/install-apparmor-parser.sh and export its output)"
            );
            None
        }
    }
}

/// `apparmor_parser -K ARGS FILE` on `text`.
fn parse(parser: &Path, dir: &Path, text: &str, args: &[&str]) -> Output {
    let file = dir.join("profile");
    fs::write(&file, text).unwrap();
    Command::new(parser)
        .arg("-K")
        .args(args)
        .arg(&file)
        .output()
        .unwrap()
}

/// The compiled policy (`-S`: the binary the kernel would load), or a panic with the
/// parser's error.
fn compiled(parser: &Path, dir: &Path, text: &str) -> Vec<u8> {
    let out = parse(parser, dir, text, &["-S"]);
    assert!(out.status.success(), "{}\n{text}", stderr(&out));
    assert!(!out.stdout.is_empty());
    out.stdout
}

#[test]
fn shipped_profile_compiles_with_apparmor_4_and_typos_do_not() {
    let Some(parser) = parser() else { return };
    let version = Command::new(&parser).arg("--version").output().unwrap();
    assert!(
        stdout(&version).starts_with("AppArmor parser version 4."),
        "{}",
        stdout(&version)
    );
    let w = World::new(BIN);
    let out = parse(&parser, &w.root(), SHIPPED, &["-Q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The controls: the same invocation rejects a misspelt rule, flag or abi.
    for (good, bad) in [
        ("  userns,\n", "  usernz,\n"),
        ("flags=(unconfined)", "flags=(unconfinde)"),
        ("abi <abi/4.0>,", "abi <abi/9.9>,"),
    ] {
        assert!(SHIPPED.contains(good), "{good}");
        let broken = SHIPPED.replacen(good, bad, 1);
        let out = parse(&parser, &w.root(), &broken, &["-Q"]);
        assert!(!out.status.success(), "{bad:?} was accepted");
        assert!(
            stderr(&out).contains("AppArmor parser error"),
            "{}",
            stderr(&out)
        );
    }
}

/// `claudebox --apparmor-profile` for a bwrap at an unusual path (a copy in a directory
/// with a space): its text compiles to exactly the policy of a profile written by hand with
/// that path as a literal attachment, and not to the policy for /usr/bin/bwrap.
#[test]
fn printed_profile_attaches_to_the_bwrap_in_use() {
    let Some(parser) = parser() else { return };
    let w = World::new(BIN);
    let real = fs::canonicalize(which::which("bwrap").unwrap()).unwrap();
    let dir = w.root().join("my tools");
    fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("bwrap");
    fs::copy(&real, &copy).unwrap();
    // Through a symlink, as NixOS's /run/current-system/sw/bin/bwrap is one.
    let link = w.root().join("bwrap-link");
    std::os::unix::fs::symlink(&copy, &link).unwrap();

    let out = w
        .cmd(&w.root())
        .arg("--apparmor-profile")
        .env("CLAUDEBOX_BWRAP", &link)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = stdout(&out);
    let path = copy.to_str().unwrap();
    assert!(
        printed.contains(&format!("@{{claudebox_bwrap}} = \"{path}\"\n")),
        "{printed}"
    );
    assert!(stderr(&out).contains("/etc/apparmor.d/claudebox-bwrap"));

    let literal = |attach: &str| {
        format!(
            "abi <abi/4.0>,\ninclude <tunables/global>\n\
             profile claudebox-bwrap \"{attach}\" flags=(unconfined) {{\n  userns,\n  \
             include if exists <local/claudebox-bwrap>\n}}\n"
        )
    };
    let ours = compiled(&parser, &w.root(), &printed);
    assert_eq!(ours, compiled(&parser, &w.root(), &literal(path)));
    // The control: the shipped file (for /usr/bin/bwrap) compiles to other policy.
    let usr = compiled(&parser, &w.root(), SHIPPED);
    assert_ne!(ours, usr);
    assert_eq!(
        usr,
        compiled(&parser, &w.root(), &literal("/usr/bin/bwrap"))
    );
}

/// A bwrap whose path the profile language cannot name literally: one line, no profile.
#[test]
fn a_bwrap_path_it_cannot_name_is_refused() {
    let w = World::new(BIN);
    let real = fs::canonicalize(which::which("bwrap").unwrap()).unwrap();
    let dir = w.root().join("glob*dir");
    fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("bwrap");
    fs::copy(&real, &copy).unwrap();
    let out = w
        .cmd(&w.root())
        .arg("--apparmor-profile")
        .env("CLAUDEBOX_BWRAP", &copy)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("claudebox: cannot write an AppArmor profile for"),
        "{err}"
    );
}

/// On real Ubuntu kernels with AppArmor: tests/vm/apparmor.sh boots 24.04's kernel in
/// qemu with the restriction on (and an enforcing `unprivileged_userns`), and runs bwrap,
/// a bwrap inside it, a launch and `claudebox --check` as uid 1000 without a profile (the control:
/// refused), with claudebox-bwrap loaded (everything starts, the nested bwrap too), with
/// Ubuntu's bwrap-userns-restrict loaded as well (conflicting attachments: refused again,
/// and --check says why), and with bwrap-userns-restrict alone (the sandbox starts, the
/// nested bwrap does not: anthropics/claude-code#87680); with claudebox-bwrap, the file
/// supervisor under Yama's ptrace_scope 1 (files made inside, a commondir renamed into the
/// main git dir refused and absent on the host). Needs root (it builds the image)
/// and qemu-system-x86_64; in CI their absence fails the test.
#[test]
fn on_a_real_ubuntu_kernel() {
    let Some(r) = vm::run("apparmor.sh") else {
        return;
    };
    let console = r.console();
    let all = |step: &str, what: &str| r.all(step, what);
    let one = |step: &str, what: &str| r.one(step, what);
    let row = |step: &str, name: &str| -> String {
        all(step, "check")
            .into_iter()
            .find(|v| v.len() > 23 && v[6..23].trim_end() == name)
            .unwrap_or_else(|| panic!("no --check row {name} in step {step}:\n{console}"))
            .to_string()
    };
    assert_eq!(one("kernel", "apparmor-enabled"), "Y");
    assert_eq!(one("kernel", "restrict"), "1");
    assert_eq!(one("kernel", "unprivileged_userns-loaded"), "yes");
    // A: no profile.
    assert_ne!(one("A", "bwrap-rc"), "0");
    assert_eq!(
        one("A", "bwrap-err"),
        "bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted"
    );
    let a = row("A", "apparmor");
    assert!(
        a.starts_with("fail") && a.contains("no profile covers /usr/bin/bwrap"),
        "{a}"
    );
    let s = row("A", "sandbox");
    assert!(
        s.starts_with("fail") && s.contains("AppArmor restricts"),
        "{s}"
    );
    // B: claudebox's profile.
    assert_eq!(one("B", "loaded"), "claudebox-bwrap");
    assert_eq!(one("B", "bwrap-rc"), "0");
    assert_eq!(one("B", "label-inside"), "claudebox-bwrap (unconfined)");
    assert_eq!(one("B", "nested-rc"), "0", "{}", one("B", "nested-err"));
    let b = row("B", "apparmor");
    assert!(
        b.starts_with("ok") && b.contains("the profile claudebox-bwrap is loaded"),
        "{b}"
    );
    assert!(row("B", "sandbox").starts_with("ok"));
    assert!(row("B", "nested sandbox").starts_with("ok"));
    assert_eq!(one("B", "launch-rc"), "0");
    assert!(all("B", "launch-err").is_empty());
    // The file supervisor under Yama's ptrace_scope 1: files are made, a commondir is not.
    assert_eq!(one("B", "yama"), "1");
    assert_eq!(
        all("B", "supervised"),
        ["made", "mv-rc 1"],
        "{:?}",
        all("B", "supervised-err")
    );
    assert_eq!(one("B", "commondir"), "absent");
    let sup = one("B", "supervisor-check");
    assert!(sup.starts_with("ok"), "{sup}");
    // C: and Ubuntu's bwrap-userns-restrict: two profiles name /usr/bin/bwrap.
    assert_eq!(one("C", "loaded"), "bwrap-userns-restrict");
    assert_ne!(one("C", "bwrap-rc"), "0");
    let c = row("C", "apparmor");
    assert!(
        c.starts_with("fail") && c.contains("another profile names /usr/bin/bwrap too"),
        "{c}"
    );
    // D: bwrap-userns-restrict alone.
    assert_eq!(one("D", "bwrap-rc"), "0");
    assert_eq!(one("D", "label-inside"), "bwrap//&unpriv_bwrap (enforce)");
    assert_ne!(one("D", "nested-rc"), "0");
    let d = row("D", "apparmor");
    assert!(
        d.starts_with("warn") && d.contains("bwrap-userns-restrict"),
        "{d}"
    );
    assert!(row("D", "sandbox").starts_with("ok"));
    assert!(row("D", "nested sandbox").starts_with("warn"));
    assert_eq!(one("D", "launch-rc"), "0");
    assert_eq!(one("done", "all"), "yes");
}
