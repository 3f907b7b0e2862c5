//! Unit tests of the table, the mounts of `~/.claude` and the `.claude.json` merge.

use super::*;
use crate::policy::claude_home::Class::*;
use crate::policy::claude_home::{class_of, overlays, TABLE};
use crate::policy::facts::Project;
use serde_json::json;
use std::ffi::OsStr;
use std::time::{Duration, Instant};

fn project() -> Project {
    Project {
        root: "/src/app/.git".into(),
        work_tree: "/src/app".into(),
        git_dir: Some("/src/app/.git".into()),
        common_dir: Some("/src/app/.git".into()),
        cwd: "/src/app".into(),
    }
}

fn st() -> ProjectState {
    ProjectState {
        dir: "/h/.claudebox/projects/0123456789abcdef".into(),
    }
}

fn host(entries: &[(&str, bool)]) -> HostClaude {
    HostClaude {
        dir: "/h/.claude".into(),
        json: "/h/.claude.json".into(),
        entries: entries
            .iter()
            .map(|(n, d)| (OsString::from(n), *d))
            .collect(),
        credentials: Some("/h/.claude/.credentials.json".into()),
        within: Vec::new(),
    }
}

fn find<'a>(v: &'a [Overlay], target: &str) -> Vec<&'a Overlay> {
    v.iter()
        .filter(|o| match o {
            Overlay::Bind { target: t, .. }
            | Overlay::EmptyDir { target: t, .. }
            | Overlay::Tmpfs { target: t, .. } => t == Path::new(target),
        })
        .collect()
}

#[test]
fn every_name_is_in_the_table_once() {
    for (i, e) in TABLE.iter().enumerate() {
        assert!(
            !TABLE[i + 1..].iter().any(|o| o.name == e.name),
            "{} twice",
            e.name
        );
        assert!(!e.name.contains('/') && !e.why.is_empty());
    }
}

#[test]
fn unknown_entries_are_setup() {
    assert_eq!(class_of(OsStr::new("statusline.sh")), Setup);
    assert_eq!(class_of(OsStr::new("something-new")), Setup);
    // A hook's own data is the project's; its scripts and unknown JSON stay the setup.
    assert_eq!(class_of(OsStr::new("hook.log")), Project);
    assert_eq!(class_of(OsStr::new("tool-calls.jsonl")), Project);
    assert_eq!(class_of(OsStr::new("logs")), Project);
    assert_eq!(class_of(OsStr::new(".log")), Setup);
    assert_eq!(class_of(OsStr::new("log-tool.sh")), Setup);
    assert_eq!(class_of(OsStr::new("hook-state.json")), Setup);
    assert_eq!(class_of(OsStr::new("history.jsonl")), Project);
    assert_eq!(class_of(OsStr::new("shell-snapshots")), Launch);
    assert_eq!(class_of(OsStr::new("file-history")), Project);
    assert_eq!(class_of(OsStr::new(".credentials.json")), Login);
}

#[test]
fn setup_is_read_only_project_entries_are_not_shown_launch_entries_are_private() {
    let h = host(&[
        ("settings.json", false),
        ("statusline.sh", false),
        ("commands", true),
        ("file-history", true),
        ("backups", true),
        ("shell-snapshots", true),
        (".credentials.json", false),
    ]);
    let v = overlays(Path::new("/h"), &h, &st(), false);
    // The project's directory first, at the same path.
    assert!(
        matches!(&v[0], Overlay::Bind { target, writable: true, .. } if target == Path::new("/h/.claude"))
    );
    // settings.json: the project's copy, read-write (the host's file is never bound).
    assert!(matches!(
        &find(&v, "/h/.claude/settings.json")[..],
        [Overlay::Bind { source, writable: true, file: true, .. }] if *source == st().user_settings()
    ));
    for name in ["statusline.sh", "commands"] {
        let t = format!("/h/.claude/{name}");
        assert!(
            matches!(
                find(&v, &t)[..],
                [Overlay::Bind {
                    writable: false,
                    ..
                }]
            ),
            "{name}"
        );
    }
    assert!(find(&v, "/h/.claude/file-history").is_empty());
    assert!(find(&v, "/h/.claude/backups").is_empty());
    assert!(matches!(
        find(&v, "/h/.claude/shell-snapshots")[..],
        [Overlay::Tmpfs { .. }]
    ));
    assert!(matches!(
        find(&v, "/h/.claude/.credentials.json")[..],
        [Overlay::Bind {
            writable: true,
            file: true,
            ..
        }]
    ));
    // The login's directory, shared by every project, with the host's tokens in it.
    let login = "/h/.claudebox/login";
    assert!(matches!(
        find(&v, login)[..],
        [Overlay::Bind {
            writable: true,
            file: false,
            ..
        }]
    ));
    assert!(matches!(
        find(&v, "/h/.claudebox/login/.credentials.json")[..],
        [Overlay::Bind { source, writable: true, file: true, .. }] if source == Path::new("/h/.claude/.credentials.json")
    ));
    // Setup the user has none of: an empty read-only stand-in.
    assert!(matches!(
        find(&v, "/h/.claude/agents")[..],
        [Overlay::EmptyDir { .. }]
    ));
    assert!(matches!(
        find(&v, "/h/.claude/settings.local.json")[..],
        [Overlay::Bind {
            writable: false,
            ..
        }]
    ));
}

/// No login on the host: the login directory's own `.credentials.json` is bound onto
/// itself (a mount point in every sandbox, so no agent can put a FIFO or a symlink in its
/// place for other projects' claude), and no credentials sync keeps it in step with
/// anything. The host's opt-in (its credentials in the login directory) binds nothing.
#[test]
fn without_a_host_login_the_login_file_is_a_mount_point_of_its_own() {
    let login_file = Path::new("/h/.claudebox/login/.credentials.json");
    let mut h = host(&[]);
    h.credentials = None;
    let v = overlays(Path::new("/h"), &h, &st(), false);
    assert!(matches!(
        find(&v, "/h/.claudebox/login/.credentials.json")[..],
        [Overlay::Bind { source, writable: true, file: true, .. }] if source == login_file
    ));
    h.credentials = Some(login_file.into());
    let v = overlays(Path::new("/h"), &h, &st(), false);
    assert!(find(&v, "/h/.claudebox/login/.credentials.json").is_empty());
}

#[test]
fn the_opt_out_makes_setup_writable_but_never_the_installation() {
    let h = host(&[("settings.json", false), ("local", true)]);
    let v = overlays(Path::new("/h"), &h, &st(), true);
    assert!(matches!(
        find(&v, "/h/.claude/settings.json")[..],
        [Overlay::Bind { writable: true, .. }]
    ));
    assert!(matches!(
        find(&v, "/h/.claude/local")[..],
        [Overlay::Bind {
            writable: false,
            ..
        }]
    ));
    assert!(find(&v, "/h/.claude/agents").is_empty());
}

#[test]
fn the_filter_keeps_this_projects_entries_only() {
    let host = json!({
        "numStartups": 4,
        "oauthAccount": {"emailAddress": "u@example.com"},
        "mcpServers": {"user": {"command": "u"}},
        "projects": {
            "/src/app": {"hasTrustDialogAccepted": true},
            "/src/app/sub": {"lastSessionId": "mine"},
            "/src/app-other": {"lastSessionId": "S-OTHER"},
            "/src/b": {"mcpServers": {"s": {"env": {"K": "SECRET"}}}}
        },
        "githubRepoPaths": {"o/app": ["/src/app"], "o/b": ["/src/b"]}
    });
    let f = filter_for_project(&host, &project());
    assert_eq!(
        f,
        json!({
            "numStartups": 4,
            "oauthAccount": {"emailAddress": "u@example.com"},
            "mcpServers": {"user": {"command": "u"}},
            "projects": {
                "/src/app": {"hasTrustDialogAccepted": true},
                "/src/app/sub": {"lastSessionId": "mine"}
            },
            "githubRepoPaths": {"o/app": ["/src/app"]}
        })
    );
}

#[test]
fn merge_host_changes_win_project_changes_stay() {
    let base = json!({"a": 1, "b": 1, "mcpServers": {"h": {"c": "1"}, "gone": {}}});
    let host = json!({"a": 2, "b": 1, "mcpServers": {"h": {"c": "1"}, "new": {"c": "n"}}});
    let mine = json!({"a": 1, "b": 5, "x": 9, "mcpServers": {"h": {"c": "1"}, "gone": {}, "inside": {"c": "i"}}});
    let m = merge(Some(&base), &host, Some(&mine));
    assert_eq!(
        m,
        json!({"a": 2, "b": 5, "x": 9, "mcpServers": {"h": {"c": "1"}, "new": {"c": "n"}, "inside": {"c": "i"}}})
    );
    // No project file yet: the host's view.
    assert_eq!(merge(None, &host, None), host);
    // A host key removed since the last sync goes.
    let m = merge(
        Some(&json!({"t": 1})),
        &json!({}),
        Some(&json!({"t": 1, "u": 2})),
    );
    assert_eq!(m, json!({"u": 2}));
}

#[test]
fn this_project_is_the_work_tree_and_the_main_work_tree() {
    let p = project();
    assert!(is_this_project("/src/app", &p));
    assert!(is_this_project("/src/app/x", &p));
    assert!(!is_this_project("/src/app2", &p));
    assert!(!is_this_project("/src", &p));
    let linked = Project {
        work_tree: "/wt/feature".into(),
        git_dir: Some("/src/app/.git/worktrees/feature".into()),
        cwd: "/wt/feature".into(),
        ..project()
    };
    assert!(is_this_project("/wt/feature", &linked));
    assert!(is_this_project("/src/app", &linked));
}

#[test]
fn a_lock_left_by_a_killed_launch_is_taken_over_at_once_a_live_one_is_not() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let owner = t.path().join("owner");
    let lock = t.path().join(".claude.json.lock");
    fs::create_dir(&lock).unwrap();
    let ino = fs::metadata(&lock).unwrap().ino();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    fs::write(&owner, format!("{dead} {ino}\n")).unwrap();
    let start = Instant::now();
    let d = crate::state::beneath::Dir::open(t.path()).unwrap();
    let (file, owner_name) = (Path::new(".claude.json"), Path::new("owner"));
    let l = ConfigLock::take(&d, file, &d, owner_name).unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
    drop(l);
    assert!(!lock.exists() && !owner.exists());
    // Held by a live process (this one), fresh: not taken over (checked without waiting
    // the whole WAIT: the record says alive).
    fs::create_dir(&lock).unwrap();
    let ino = fs::metadata(&lock).unwrap().ino();
    fs::write(&owner, format!("{} {ino}\n", std::process::id())).unwrap();
    assert!(!held_by_a_dead_launch(
        &d,
        owner_name,
        &d.stat(Path::new(".claude.json.lock")).unwrap()
    ));
    // Planted by an agent, dated in the future: not waited for (claude never would take
    // it over), removed.
    let _ = fs::remove_file(&owner);
    fs::remove_dir(&lock).unwrap();
    fs::create_dir(&lock).unwrap();
    fs::File::open(&lock)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(86400))
        .unwrap();
    let start = Instant::now();
    let l = ConfigLock::take(&d, file, &d, owner_name).unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
    drop(l);
}

#[test]
fn plugin_data_is_the_projects_over_the_read_only_plugins_unless_the_setup_is_writable() {
    let mut h = host(&[("plugins", true)]);
    h.within = vec!["/h/.claude/plugins/data".into()];
    let v = overlays(Path::new("/h"), &h, &st(), false);
    let plugins = v
        .iter()
        .position(|o| matches!(o, Overlay::Bind { target, writable: false, .. } if target == Path::new("/h/.claude/plugins")))
        .expect("plugins read-only");
    let data = v
        .iter()
        .position(|o| matches!(o, Overlay::Bind { target, source, writable: true, file: false, .. }
            if target == Path::new("/h/.claude/plugins/data")
                && source == Path::new("/h/.claudebox/projects/0123456789abcdef/claude-plugin-data")))
        .expect("plugins/data: the project's, read-write");
    assert!(plugins < data, "mounted before the plugins dir it lies in");
    // With the opt-out the real one is seen; without a mount point on the host, none.
    let v = overlays(Path::new("/h"), &h, &st(), true);
    assert!(find(&v, "/h/.claude/plugins/data").is_empty());
    h.within.clear();
    let v = overlays(Path::new("/h"), &h, &st(), false);
    assert!(find(&v, "/h/.claude/plugins/data").is_empty());
}
