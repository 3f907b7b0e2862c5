//! `--check`: real sandboxes on this machine, and the failure paths we can make real: no
//! bwrap, a bwrap that fails like Ubuntu's AppArmor makes it fail, no claude, a state
//! directory that cannot be written.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::process::{Command, Output};

use crate::BIN;
use lab::maintenance::*;
use lab::{stdout, World};

fn check(w: &World, f: impl FnOnce(&mut std::process::Command)) -> Output {
    let mut c = w.cmd(&w.root());
    c.arg("--check");
    // The probe's temporary directory lives in the world, so leftovers would show.
    let tmp = w.root().join("tmp");
    fs::create_dir_all(&tmp).unwrap();
    c.env("TMPDIR", &tmp);
    f(&mut c);
    c.output().unwrap()
}

/// The row named `name`: (status, detail, fix lines).
fn row_of(out: &str, name: &str) -> (String, String, String) {
    let lines: Vec<&str> = out.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.len() > 24 && !l.starts_with(' ') && l[6..23].trim_end() == name)
        .unwrap_or_else(|| panic!("no row {name} in\n{out}"));
    let status = lines[i][..5].trim().to_string();
    let detail = lines[i][24..].to_string();
    let fix = lines[i + 1..]
        .iter()
        .take_while(|l| l.starts_with("      "))
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join("\n");
    (status, detail, fix)
}

fn path_without_bwrap(w: &World) -> std::ffi::OsString {
    // Only the world's bin (fake claude) and a dir with what the fake claude needs.
    let tools = w.root().join("tools");
    fs::create_dir_all(&tools).unwrap();
    for t in ["sh", "true"] {
        let src = which::which(t).unwrap();
        let _ = symlink(src, tools.join(t));
    }
    let mut p = w.bin().into_os_string();
    p.push(":");
    p.push(&tools);
    p
}

#[test]
fn passes_on_this_machine_and_leaves_nothing_behind() {
    let w = World::new(BIN);
    fs::write(w.home().join(".claude.json"), "{}\n").unwrap();
    let before = snapshot(&w.root());
    let out = check(&w, |_| {});
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", lab::stderr(&out));
    for name in [
        "bwrap",
        "sandbox",
        "claude",
        "claude in sandbox",
        "state dir",
    ] {
        assert_eq!(row_of(&text, name).0, "ok", "{name}:\n{text}");
    }
    let (st, detail, fix) = row_of(&text, "nested sandbox");
    if is_root() {
        // Measured here: as root the sandbox drops CAP_SETFCAP, so bwrap cannot nest.
        assert_eq!(st, "warn", "{text}");
        assert!(detail.contains("runs as root"), "{detail}");
        assert!(fix.contains("ordinary user"), "{fix}");
    } else {
        assert_eq!(st, "ok", "{text}");
    }
    assert!(row_of(&text, "claude")
        .1
        .contains(w.bin().join("claude").to_str().unwrap()));
    assert!(row_of(&text, "bwrap").1.contains("bubblewrap"), "{text}");
    // Measured here: no AppArmor in this kernel (no /sys/module/apparmor).
    let (st, detail, _) = row_of(&text, "apparmor");
    assert_eq!(st, "ok", "{text}");
    if !std::path::Path::new("/sys/module/apparmor").exists() {
        assert!(detail.starts_with("not enabled: "), "{detail}");
    }
    assert!(text.trim_end().ends_with("0 fail"), "{text}");
    // Nothing created: no state directory, no leftover probe directory.
    let mut after = snapshot(&w.root());
    after.remove(&w.root().join("tmp"));
    assert_same(&before, &after);
}

#[test]
fn no_bwrap_fails_with_the_install_hint() {
    let w = World::new(BIN);
    let path = path_without_bwrap(&w);
    let out = check(&w, |c| {
        c.env("PATH", &path);
    });
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let (st, _, fix) = row_of(&text, "bwrap");
    assert_eq!(st, "fail");
    assert!(fix.contains("apt install bubblewrap"), "{fix}");
    assert_eq!(row_of(&text, "sandbox").0, "fail");
    assert_eq!(row_of(&text, "claude").0, "ok", "{text}");
}

#[test]
fn an_apparmor_style_failure_is_recognised_end_to_end() {
    let w = World::new(BIN);
    let bwrap = fake_bwrap(
        &w,
        "#!/bin/sh\n\
         if [ \"$1\" = --version ]; then echo 'bubblewrap 0.9.0'; exit 0; fi\n\
         echo 'bwrap: setting up uid map: Permission denied' >&2\n\
         exit 1\n",
    );
    let mut path = bwrap.parent().unwrap().as_os_str().to_os_string();
    path.push(":");
    path.push(w.path_var());
    let out = check(&w, |c| {
        c.env("PATH", &path);
    });
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        row_of(&text, "bwrap").1.contains("bubblewrap 0.9.0"),
        "{text}"
    );
    // No package owns the fake: an older version with no backport found.
    let (st, detail, _) = row_of(&text, "bwrap fix");
    assert_eq!(st, "warn", "{text}");
    assert!(
        detail.contains("0.9.0 lacks the fix for CVE-2026-87766"),
        "{detail}"
    );
    let (st, detail, fix) = row_of(&text, "sandbox");
    assert_eq!(st, "fail");
    assert!(detail.contains("AppArmor"), "{detail}");
    // The fix is the one step: claudebox prints the profile for this bwrap.
    assert!(fix.contains(&format!("({})", bwrap.display())), "{fix}");
    assert!(
        fix.contains(
            "claudebox --apparmor-profile | sudo tee /etc/apparmor.d/claudebox-bwrap \
             && sudo apparmor_parser -r /etc/apparmor.d/claudebox-bwrap"
        ),
        "{fix}"
    );
    assert!(
        !fix.contains("apparmor_restrict_unprivileged_userns=0"),
        "{fix}"
    );
    assert_eq!(row_of(&text, "nested sandbox").0, "fail");
}

#[test]
fn no_claude_fails() {
    let w = World::new(BIN);
    fs::remove_file(w.bin().join("claude")).unwrap();
    let out = check(&w, |_| {});
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let (st, detail, fix) = row_of(&text, "claude");
    assert_eq!(st, "fail");
    assert!(detail.contains("no `claude` on PATH"), "{detail}");
    assert!(
        fix.contains("npm install -g @anthropic-ai/claude-code"),
        "{fix}"
    );
    assert_eq!(row_of(&text, "sandbox").0, "ok", "{text}");
}

#[test]
fn a_state_dir_that_cannot_be_made_fails() {
    let w = World::new(BIN);
    // Under a regular file: not creatable, even for root.
    let file = w.root().join("afile");
    fs::write(&file, "").unwrap();
    let out = check(&w, |c| {
        c.env("CLAUDEBOX_HOME", file.join("state"));
    });
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let (st, detail, fix) = row_of(&text, "state dir");
    assert_eq!(st, "fail");
    assert!(detail.contains("is not writable"), "{detail}");
    assert!(fix.contains("CLAUDEBOX_HOME"), "{fix}");
}

/// A path holding "; " comes out whole: the fix is data, not the message cut at "; "
/// (which gave the detail "the state directory .../a" and the fix "b/afile/state is not
/// writable (...)").
#[test]
fn a_state_dir_path_holding_a_semicolon_comes_out_whole() {
    let w = World::new(BIN);
    let dir = w.dir("a; b");
    let file = dir.join("afile");
    fs::write(&file, "").unwrap();
    let out = check(&w, |c| {
        c.env("CLAUDEBOX_HOME", file.join("state"));
    });
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let (st, detail, fix) = row_of(&text, "state dir");
    assert_eq!(st, "fail", "{text}");
    assert!(detail.starts_with("the state directory "), "{detail}");
    assert!(
        detail.contains("a; b/afile/state is not writable"),
        "{detail}"
    );
    assert!(
        detail.contains("a; b/afile is not a writable directory)"),
        "{detail}"
    );
    assert_eq!(
        fix, "fix: fix its permissions or set CLAUDEBOX_HOME to a writable directory",
        "{text}"
    );
    // The check runs from the world's root, which holds the config file: a launch there
    // would refuse it, and the row gives that refusal's own fix, from its fields.
    let (st, detail, fix) = row_of(&text, "config");
    assert_eq!(st, "warn", "{text}");
    assert!(
        detail.ends_with("the agent could rewrite its own configuration"),
        "{detail}"
    );
    assert_eq!(
        fix, "fix: set XDG_CONFIG_HOME to a directory outside it",
        "{text}"
    );
}

#[test]
fn an_unwritable_state_dir_fails_for_a_user() {
    if is_root() {
        eprintln!("skipped as root: chmod does not stop root (covered by the non-root run)");
        return;
    }
    let w = World::new(BIN);
    let ro = w.dir("ro");
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    let out = check(&w, |c| {
        c.env("CLAUDEBOX_HOME", ro.join("state"));
    });
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(row_of(&text, "state dir").0, "fail", "{text}");
}

#[test]
fn credentials_are_found_but_never_printed() {
    let w = World::new(BIN);
    let secret = "sk-ant-test-SECRET-0123456789";
    let out = check(&w, |c| {
        c.env("ANTHROPIC_API_KEY", secret);
    });
    let text = stdout(&out);
    let (st, detail, _) = row_of(&text, "credentials");
    assert_eq!(st, "ok", "{text}");
    assert!(detail.contains("ANTHROPIC_API_KEY"), "{detail}");
    assert!(!text.contains(secret));

    fs::write(
        w.home().join(".claude/.credentials.json"),
        format!("{{\"claudeAiOauth\":{{\"accessToken\":\"{secret}\"}}}}"),
    )
    .unwrap();
    let text = stdout(&check(&w, |_| {}));
    assert_eq!(row_of(&text, "credentials").0, "ok", "{text}");
    assert!(!text.contains(secret));

    fs::remove_file(w.home().join(".claude/.credentials.json")).unwrap();
    let out = check(&w, |_| {});
    let text = stdout(&out);
    let (st, _, fix) = row_of(&text, "credentials");
    assert_eq!(st, "warn", "{text}");
    assert!(fix.contains("log in"), "{fix}");
    // A warning alone does not fail the check.
    assert!(out.status.success(), "{text}");
}

#[test]
fn shows_the_network_mode_in_force_and_fails_on_a_bad_config() {
    let w = World::new(BIN);
    let xdg = w.root().join("xdg");
    fs::create_dir_all(xdg.join("claudebox")).unwrap();
    fs::write(
        xdg.join("claudebox/config.toml"),
        "network = \"allowlist\"\nallow_hosts = [\"example.org\"]\n",
    )
    .unwrap();
    let project = w.dir("project");
    let o = check(&w, |c| {
        c.env("XDG_CONFIG_HOME", &xdg).current_dir(&project);
    });
    let (status, detail, _) = row_of(&stdout(&o), "network");
    assert_eq!(status, "ok");
    assert!(
        detail.starts_with("allowlist") && detail.contains("example.org"),
        "{detail}"
    );

    fs::write(
        xdg.join("claudebox/config.toml"),
        "network = \"sometimes\"\n",
    )
    .unwrap();
    let o = check(&w, |c| {
        c.env("XDG_CONFIG_HOME", &xdg);
    });
    assert!(!o.status.success());
    let (status, detail, fix) = row_of(&stdout(&o), "config");
    assert_eq!(status, "fail");
    assert!(detail.contains("config.toml:1:11"), "{detail}");
    assert!(fix.contains("config.toml"), "{fix}");
}

/// CVE-2026-87766: a bwrap of 0.12.0 or later carries the fix by its version; the one
/// installed here (Debian 12's 0.8.0-2+deb12u1, whose changelog names no backport) not.
#[test]
fn the_bwrap_fix_row_reads_the_version_and_the_package() {
    let w = World::new(BIN);
    let bwrap = fake_bwrap(
        &w,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'bubblewrap 0.12.1'; exit 0; fi\nexit 1\n",
    );
    let out = check(&w, |c| {
        c.env("CLAUDEBOX_BWRAP", &bwrap);
    });
    let (st, detail, _) = row_of(&stdout(&out), "bwrap fix");
    assert_eq!(st, "ok", "{}", stdout(&out));
    assert!(detail.contains("0.12.1 carries the fix"), "{detail}");
    let real = Command::new("bwrap").arg("--version").output().unwrap();
    if stdout(&real).trim() == "bubblewrap 0.8.0" {
        let out = check(&w, |_| {});
        let (st, detail, _) = row_of(&stdout(&out), "bwrap fix");
        assert_eq!(st, "warn", "{}", stdout(&out));
        assert!(detail.contains("no backport named"), "{detail}");
    }
}

/// A stand-in `bwrap` running `script`, alone in a directory of its own (for PATH or
/// `CLAUDEBOX_BWRAP`).
fn fake_bwrap(w: &World, script: &str) -> std::path::PathBuf {
    let fake = w.root().join("fakebwrap");
    fs::create_dir_all(&fake).unwrap();
    let bwrap = fake.join("bwrap");
    fs::write(&bwrap, script).unwrap();
    fs::set_permissions(&bwrap, fs::Permissions::from_mode(0o755)).unwrap();
    bwrap
}
