//! The canonical project root agrees with `realpath "$(git rev-parse --path-format=absolute
//! --git-common-dir)"` in every layout, and the id is the first 16 hex of its SHA-256.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::Path;

use crate::BIN;
use lab::*;
use sha2::{Digest, Sha256};

/// The root claudebox reports (CLAUDEBOX_PROJECT_ROOT in --dry-run) for `cwd`.
fn claudebox_root(w: &World, cwd: &Path) -> (String, String) {
    let out = dry_run(w, cwd);
    let root = env_in_dry_run(&out, "CLAUDEBOX_PROJECT_ROOT").expect("root in dry-run");
    let id = env_in_dry_run(&out, "CLAUDEBOX_PROJECT_ID").expect("id in dry-run");
    (root, id)
}

#[track_caller]
fn assert_agrees_with_git(w: &World, cwd: &Path) -> String {
    let expected = git_root(cwd);
    let (root, id) = claudebox_root(w, cwd);
    assert_eq!(Path::new(&root), expected, "root for cwd {}", cwd.display());
    let digest = hex::encode(Sha256::digest(expected.as_os_str().as_bytes()));
    assert_eq!(id, digest[..16], "id for cwd {}", cwd.display());
    id
}

#[test]
fn plain_repo_top_and_deep_subdirectory() {
    let w = World::new(BIN);
    let repo = w.work().join("repo");
    init_repo(&repo);
    let deep = repo.join("a/b/c/d");
    fs::create_dir_all(&deep).unwrap();
    let a = assert_agrees_with_git(&w, &repo);
    let b = assert_agrees_with_git(&w, &deep);
    assert_eq!(a, b);
}

#[test]
fn linked_worktrees_share_one_id_and_clones_differ() {
    let w = World::new(BIN);
    let repo = w.work().join("repo");
    init_repo(&repo);
    git(&repo, &["worktree", "add", "-q", "../wt1", "-b", "wt1"]);
    let wt = w.work().join("wt1");
    fs::create_dir_all(wt.join("sub")).unwrap();
    let main_id = assert_agrees_with_git(&w, &repo);
    assert_eq!(assert_agrees_with_git(&w, &wt), main_id);
    assert_eq!(assert_agrees_with_git(&w, &wt.join("sub")), main_id);

    git(&w.work(), &["clone", "-q", "repo", "clone2"]);
    let clone_id = assert_agrees_with_git(&w, &w.work().join("clone2"));
    assert_ne!(clone_id, main_id);
}

#[test]
fn worktree_with_relative_paths_and_a_worktree_of_a_worktree() {
    let w = World::new(BIN);
    let repo = w.work().join("repo");
    init_repo(&repo);
    // git >= 2.48 can record relative worktree links; older git ignores the option.
    let _ = std::process::Command::new("git")
        .current_dir(&repo)
        .args([
            "-c",
            "worktree.useRelativePaths=true",
            "worktree",
            "add",
            "-q",
            "../rel",
            "-b",
            "rel",
        ])
        .status();
    let rel = w.work().join("rel");
    let id = assert_agrees_with_git(&w, &repo);
    if rel.exists() {
        assert_eq!(assert_agrees_with_git(&w, &rel), id);
        git(&rel, &["worktree", "add", "-q", "../nested-wt", "-b", "n"]);
        assert_eq!(assert_agrees_with_git(&w, &w.work().join("nested-wt")), id);
    }
}

#[test]
fn submodule_is_its_own_project() {
    let w = World::new(BIN);
    let lib = w.work().join("lib");
    init_repo(&lib);
    let sup = w.work().join("super");
    init_repo(&sup);
    git(&sup, &["submodule", "add", "-q", "../lib", "vendor/lib"]);
    let sub = sup.join("vendor/lib");
    let sup_id = assert_agrees_with_git(&w, &sup);
    let sub_id = assert_agrees_with_git(&w, &sub);
    assert_ne!(sup_id, sub_id);
    // the submodule's git dir lives in the superproject's .git/modules
    assert!(git_root(&sub).starts_with(fs::canonicalize(sup.join(".git")).unwrap()));
}

#[test]
fn nested_repository_inside_another_is_its_own_project() {
    let w = World::new(BIN);
    let outer = w.work().join("outer");
    init_repo(&outer);
    let inner = outer.join("inner");
    init_repo(&inner);
    fs::create_dir_all(inner.join("x")).unwrap();
    assert_ne!(
        assert_agrees_with_git(&w, &outer),
        assert_agrees_with_git(&w, &inner.join("x"))
    );
}

#[test]
fn paths_through_symlinks_resolve() {
    let w = World::new(BIN);
    let repo = w.work().join("real/repo");
    init_repo(&repo);
    fs::create_dir_all(repo.join("src")).unwrap();
    symlink(w.work().join("real"), w.work().join("link")).unwrap();
    let via_link = w.work().join("link/repo/src");
    let id = assert_agrees_with_git(&w, &via_link);
    assert_eq!(id, assert_agrees_with_git(&w, &repo));
    // a symlinked .git directory
    let dotgit_target = w.work().join("store/dotgit");
    let repo2 = w.work().join("repo2");
    init_repo(&repo2);
    fs::create_dir_all(dotgit_target.parent().unwrap()).unwrap();
    fs::rename(repo2.join(".git"), &dotgit_target).unwrap();
    symlink(&dotgit_target, repo2.join(".git")).unwrap();
    let expected = git_root(&repo2);
    // a symlinked .git cannot be write-protected by a mount: the launch refuses it unless
    // the user opts out of the protection, and then the root still agrees with git
    let refused = w.cmd(&repo2).arg("--dry-run").output().unwrap();
    assert!(!refused.status.success() && stderr(&refused).contains("symlink"));
    let out = ok(&w
        .cmd(&repo2)
        .args(["--writable-project-config", "--dry-run"])
        .output()
        .unwrap());
    let root = env_in_dry_run(&out, "CLAUDEBOX_PROJECT_ROOT").unwrap();
    assert_eq!(Path::new(&root), expected);
}

#[test]
fn separate_git_dir() {
    let w = World::new(BIN);
    let repo = w.work().join("sep");
    fs::create_dir_all(&repo).unwrap();
    let gd = w.work().join("sep-gitdir");
    git(
        &repo,
        &["init", "-q", "--separate-git-dir", gd.to_str().unwrap()],
    );
    // the git dir does not record its work tree, so a `.git` file alone cannot prove the
    // layout is the user's: binding it read-write takes --yes
    let refused = w.cmd(&repo).arg("--dry-run").output().unwrap();
    assert!(!refused.status.success() && stderr(&refused).contains("--yes"));
    let out = ok(&w.cmd(&repo).args(["--yes", "--dry-run"]).output().unwrap());
    let root = env_in_dry_run(&out, "CLAUDEBOX_PROJECT_ROOT").unwrap();
    assert_eq!(Path::new(&root), git_root(&repo));
    // and the git dir lies outside the work tree, so it is bound too
    assert!(
        out.contains(&format!("rw\t{}\t{}", gd.display(), gd.display())),
        "{out}"
    );
}

#[test]
fn inside_the_git_dir_and_a_bare_repository() {
    let w = World::new(BIN);
    let repo = w.work().join("repo");
    init_repo(&repo);
    assert_agrees_with_git(&w, &repo.join(".git"));
    assert_agrees_with_git(&w, &repo.join(".git/refs"));
    git(&w.work(), &["clone", "-q", "--bare", "repo", "bare.git"]);
    assert_agrees_with_git(&w, &w.work().join("bare.git"));
}

#[test]
fn outside_git_is_the_real_cwd() {
    let w = World::new(BIN);
    let d = w.dir("plain/dir with space");
    symlink(&d, w.work().join("alias")).unwrap();
    let (root, _) = claudebox_root(&w, &w.work().join("alias"));
    assert_eq!(Path::new(&root), fs::canonicalize(&d).unwrap());
}

#[test]
fn a_planted_git_file_cannot_hand_the_sandbox_another_repository() {
    let w = World::new(BIN);
    let victim = w.work().join("victim");
    init_repo(&victim);
    // what an agent could write inside a project it can edit
    let trap = w.dir("project/sub");
    fs::write(
        trap.join(".git"),
        format!("gitdir: {}\n", victim.join(".git").display()),
    )
    .unwrap();
    // git itself would take it as a work tree of `victim` ...
    assert_eq!(
        git_root(&trap),
        fs::canonicalize(victim.join(".git")).unwrap()
    );
    // ... but claudebox refuses to bind victim/.git read-write for it
    let o = w.cmd(&trap).args(["--exec", "true"]).output().unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("does not list") && err.lines().count() == 1,
        "{err}"
    );
    assert!(!w.state().exists(), "a refused launch created state");
    // a real linked worktree and a real submodule are accepted (see the tests above)
    git(&victim, &["worktree", "add", "-q", "../real-wt"]);
    ok(&w
        .cmd(&w.work().join("real-wt"))
        .args(["--exec", "true"])
        .output()
        .unwrap());
}
