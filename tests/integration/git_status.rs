//! `git status --porcelain` inside equals the host's on the same tree: the stand-ins
//! claudebox places in the project's scratch `.claude` (the project's copy of
//! `settings.local.json`) are ignored by a stand-in `.claude/.gitignore` that exists only
//! inside, so `git add -A` commits nothing of claudebox's and later checkouts do not meet
//! a committed mount point ("Device or resource busy"). Controls: `--ignored` shows the
//! stand-ins are there; a forced add of the stand-in makes the checkout fail as it did.

use std::fs;
use std::path::Path;

use crate::BIN;
use lab::*;

/// Git with a fixed identity, inside the sandbox (the world's HOME has no git config).
const GIT: &str = "git -c user.name=T -c user.email=t@example.com";

fn inside(w: &World, p: &Path, script: &str) -> std::process::Output {
    w.cmd(p)
        .args(["--exec", "sh", "-c", script])
        .output()
        .unwrap()
}

/// A repository with `.claude` as `claude` says: absent, tracked settings, or a tracked
/// `.gitignore` of the user's own in it.
fn repo(w: &World, name: &str, claude: &str) -> std::path::PathBuf {
    let p = w.dir(name);
    init_repo(&p);
    match claude {
        "none" => {}
        "settings" => {
            fs::create_dir_all(p.join(".claude/commands")).unwrap();
            fs::write(p.join(".claude/settings.json"), "{}\n").unwrap();
            fs::write(p.join(".claude/commands/c.md"), "hi\n").unwrap();
            git(&p, &["add", "-A"]);
            git(&p, &["commit", "-qm", "claude"]);
        }
        "gitignore" => {
            fs::create_dir_all(p.join(".claude")).unwrap();
            fs::write(p.join(".claude/.gitignore"), "settings.local.json\n").unwrap();
            git(&p, &["add", "-A"]);
            git(&p, &["commit", "-qm", "claude"]);
        }
        _ => unreachable!(),
    }
    fs::write(p.join("untracked.txt"), "u\n").unwrap();
    fs::write(p.join("README"), "changed\n").unwrap();
    p
}

#[test]
fn porcelain_inside_equals_the_hosts_and_nothing_of_claudebox_is_committed() {
    let w = World::new(BIN);
    for claude in ["none", "settings", "gitignore"] {
        let p = repo(&w, claude, claude);
        let host = git(&p, &["status", "--porcelain"]);
        let o = inside(&w, &p, "git status --porcelain");
        assert_eq!(
            ok(&o).trim_end(),
            host,
            "[{claude}] porcelain inside differs"
        );
        // Control: the stand-in is there, only ignored (not with the user's own
        // .gitignore, which already ignores it).
        let ign = ok(&inside(&w, &p, "git status --porcelain --ignored"));
        assert!(ign.contains("!! .claude/"), "[{claude}] control: {ign}");
        // `git add -A` and a commit inside take the user's changes only.
        let script = format!(
            "{GIT} add -A && {GIT} commit -qm inside && git show --name-only --format= HEAD"
        );
        let files = ok(&inside(&w, &p, &script));
        let mut files: Vec<&str> = files.lines().collect();
        files.sort();
        assert_eq!(files, ["README", "untracked.txt"], "[{claude}]");
        assert_eq!(
            git(&p, &["status", "--porcelain"]),
            "",
            "[{claude}] host after"
        );
        assert!(
            !git(&p, &["ls-files"]).contains("settings.local.json"),
            "[{claude}]"
        );
    }
}

/// Branches made and switched inside, one of them with a `.claude` change, as a day's
/// work does: every checkout works. Control: the stand-in committed by force (what
/// `git add -A` did before) makes the checkout away from that commit fail.
#[test]
fn checkouts_inside_work_and_a_committed_stand_in_was_what_broke_them() {
    let w = World::new(BIN);
    let p = repo(&w, "proj", "none");
    git(&p, &["add", "-A"]);
    git(&p, &["commit", "-qm", "base"]);
    // A branch made on the host whose tree has a .claude.
    git(&p, &["checkout", "-qb", "with-claude"]);
    fs::create_dir_all(p.join(".claude")).unwrap();
    fs::write(p.join(".claude/settings.json"), "{}\n").unwrap();
    git(&p, &["add", "-A"]);
    git(&p, &["commit", "-qm", "claude"]);
    git(&p, &["checkout", "-q", "main"]);
    let script = format!(
        "set -e; {GIT} checkout -qb feature; echo f > f.txt; {GIT} add -A; \
         {GIT} commit -qm f; {GIT} checkout -q main; {GIT} checkout -q with-claude; \
         {GIT} checkout -q feature; {GIT} checkout -q main; git status --porcelain"
    );
    let o = inside(&w, &p, &script);
    assert_eq!(ok(&o), "", "{}", stderr(&o));
    // Control: the stand-in forced into a commit; leaving that commit must remove it,
    // which its mount point refuses.
    let script = format!(
        "{GIT} checkout -qb forced && {GIT} add -f .claude/settings.local.json && \
         {GIT} commit -qm forced && {GIT} checkout -q main"
    );
    let o = inside(&w, &p, &script);
    assert!(
        stderr(&o).contains("busy"),
        "control: the checkout worked: {}{}",
        stdout(&o),
        stderr(&o)
    );
}
