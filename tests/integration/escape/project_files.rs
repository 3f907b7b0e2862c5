//! Files in the project that tools on the host run, claudebox's state in the sandbox's
//! reach, git's XDG credential store, and terminal escapes in paths claudebox prints: the
//! attempts (a part of the escape suite) and their controls.
//!
//! Each file attempt plants code from inside where a host tool would run it (husky,
//! lefthook, pre-commit, a host `claude` in the project, the devcontainer CLI, git in a
//! vendored repository) and is judged on the host file. The controls make the same
//! attempts with `--writable-project-config` and see them land.

use std::fs;
use std::path::PathBuf;
use std::process::Output;

use super::{attempt, contains_planted, plant, run_attempt, write, Arena, Attempt, MARK};
use lab::*;

/// A file attempt: its name, the shell code run inside (from the project, or from the
/// linked worktree), and the host file that shows it landed.
struct Plant {
    name: &'static str,
    script: String,
    linked: bool,
    landed: Box<dyn Fn(&Arena) -> bool>,
    /// The line with which claudebox may end the sandbox at once for this plant.
    ended_by: Option<&'static str>,
    /// claudebox options of the launch (a directory granted with `--rw`).
    args: Vec<String>,
}

fn plant_case(
    name: &'static str,
    script: impl Into<String>,
    landed: impl Fn(&Arena) -> bool + 'static,
) -> Plant {
    Plant {
        name,
        script: script.into(),
        linked: false,
        landed: Box::new(landed),
        ended_by: None,
        args: Vec::new(),
    }
}

/// Writes what a project using these tools has, once per arena.
fn setup(a: &Arena) {
    let p = &a.proj;
    if p.join("lefthook.yml").exists() {
        return;
    }
    write(&p.join(".husky/pre-commit"), "npx lint-staged\n");
    write(
        &p.join("lefthook.yml"),
        "pre-commit:\n  commands:\n    lint:\n      run: true\n",
    );
    write(
        &p.join(".lefthook/pre-commit/check.sh"),
        "#!/bin/sh\nexit 0\n",
    );
    write(&p.join(".pre-commit-config.yaml"), "repos: []\n");
    write(
        &p.join(".claude/settings.json"),
        "{\"permissions\": {\"allow\": []}}\n",
    );
    write(
        &p.join(".claude/settings.local.json"),
        "{\"permissions\": {\"allow\": [\"Bash(ls:*)\"]}}\n",
    );
    write(&p.join(".claude/commands/review.md"), "Review the diff.\n");
    write(&p.join(".mcp.json"), "{\"mcpServers\": {}}\n");
    write(
        &p.join(".devcontainer/devcontainer.json"),
        "{\"image\": \"debian\"}\n",
    );
    // A tracked config the repository includes (`git config include.path ../x`), and one
    // it includes that does not exist yet.
    write(&p.join(".gitconfig-project"), "[user]\n\tname = T\n");
    git(
        p,
        &["config", "--add", "include.path", "../.gitconfig-project"],
    );
    git(
        p,
        &["config", "--add", "include.path", "../.gitconfig-local"],
    );
    let vendored = p.join("vendor/lib");
    fs::create_dir_all(&vendored).unwrap();
    init_repo(&vendored);
    fs::create_dir_all(rw_dir(a)).unwrap();
    let home = a.w.home();
    write(
        &home.join(".config/git/credentials"),
        "https://u:SECRET-xdg-git-credentials@example.com\n",
    );
    write(&home.join(".config/git/ignore"), "*.swp\n");
    // Another project's conversation where a state directory inside ~/.claude would keep
    // it (no `SECRET-` in it: ~/.claude itself is visible by design).
    write(
        &state_in_claude(a).join("projects/fedcba9876543210/claude-projects/-o/c.jsonl"),
        "OTHER-PROJECT-CONVERSATION\n",
    );
}

/// A directory the user grants with `--rw` (the `rw-link` plant's).
fn rw_dir(a: &Arena) -> PathBuf {
    a.w.root().join("rw-granted")
}

fn state_in_claude(a: &Arena) -> PathBuf {
    a.w.home().join(".claude/claudebox-state")
}

/// Whether the host file holds `PLANTED`.
fn planted_at(rel: &'static str) -> impl Fn(&Arena) -> bool {
    move |a: &Arena| contains_planted(&a.proj.join(rel))
}

fn exists_at(rel: &'static str) -> impl Fn(&Arena) -> bool {
    move |a: &Arena| a.proj.join(rel).exists()
}

fn plants(a: &Arena) -> Vec<Plant> {
    let append = |file: &str| format!("printf '\\nPLANTED\\n' >> {file} 2>/dev/null");
    let rename_over = |file: &str| {
        format!(
            "cp {file} /tmp/x; printf '\\nPLANTED\\n' >> /tmp/x; mv -f /tmp/x {file} 2>/dev/null"
        )
    };
    let mut v = vec![
        plant_case(
            "husky: write .husky/pre-commit (its stubs run it on a host git commit)",
            plant(".husky/pre-commit"),
            planted_at(".husky/pre-commit"),
        ),
        plant_case(
            "lefthook: add a command to lefthook.yml",
            append("lefthook.yml"),
            planted_at("lefthook.yml"),
        ),
        plant_case(
            "lefthook: replace lefthook.yml through a rename",
            rename_over("lefthook.yml"),
            planted_at("lefthook.yml"),
        ),
        plant_case(
            "lefthook: write a script in .lefthook/",
            plant(".lefthook/pre-commit/check.sh"),
            planted_at(".lefthook/pre-commit/check.sh"),
        ),
        plant_case(
            "pre-commit: add a local hook to .pre-commit-config.yaml",
            append(".pre-commit-config.yaml"),
            planted_at(".pre-commit-config.yaml"),
        ),
        plant_case(
            ".claude/settings.json: add a hook a host claude runs",
            r#"printf '{"hooks":{"SessionStart":[{"hooks":[{"type":"command","command":"echo PLANTED"}]}]}}' > .claude/settings.json 2>/dev/null"#,
            planted_at(".claude/settings.json"),
        ),
        plant_case(
            ".claude/settings.json: replace it through a rename",
            rename_over(".claude/settings.json"),
            planted_at(".claude/settings.json"),
        ),
        plant_case(
            ".claude/settings.local.json: add a hook",
            append(".claude/settings.local.json"),
            planted_at(".claude/settings.local.json"),
        ),
        plant_case(
            ".claude/commands: add a command",
            plant(".claude/commands/deploy.md"),
            planted_at(".claude/commands/deploy.md"),
        ),
        plant_case(
            ".claude/agents: create it with an agent",
            plant(".claude/agents/helper.md"),
            planted_at(".claude/agents/helper.md"),
        ),
        plant_case(
            ".claude/hooks: create it with a hook script",
            plant(".claude/hooks/start.sh"),
            planted_at(".claude/hooks/start.sh"),
        ),
        plant_case(
            "move .claude aside and make a new one",
            format!(
                "mv .claude .claude.old 2>/dev/null && mkdir .claude && {}",
                plant(".claude/settings.json")
            ),
            exists_at(".claude.old"),
        ),
        plant_case(
            ".mcp.json: add an MCP server a host claude starts",
            r#"printf '{"mcpServers":{"x":{"command":"sh","args":["-c","echo PLANTED"]}}}' > .mcp.json 2>/dev/null"#,
            planted_at(".mcp.json"),
        ),
        plant_case(
            ".devcontainer: an initializeCommand (runs on the host)",
            r#"printf '{"initializeCommand":"echo PLANTED"}' > .devcontainer/devcontainer.json 2>/dev/null"#,
            planted_at(".devcontainer/devcontainer.json"),
        ),
        plant_case(
            ".gitmodules: point the submodule at another URL",
            append(".gitmodules"),
            planted_at(".gitmodules"),
        ),
        plant_case(
            "vendored repository: write its git hook",
            plant("vendor/lib/.git/hooks/post-checkout"),
            planted_at("vendor/lib/.git/hooks/post-checkout"),
        ),
        plant_case(
            "vendored repository: git config core.fsmonitor",
            "git -C vendor/lib config core.fsmonitor 'echo PLANTED' 2>/dev/null",
            |a: &Arena| {
                fs::read_to_string(a.proj.join("vendor/lib/.git/config"))
                    .is_ok_and(|s| s.contains("PLANTED"))
            },
        ),
        plant_case(
            "vendored repository: move its .git aside",
            "mv vendor/lib/.git vendor/lib/.git.old 2>/dev/null",
            exists_at("vendor/lib/.git.old"),
        ),
    ];
    // Not there at launch, so not mounted read-only: the exit review moves them aside.
    v.extend([
        plant_case(
            "nested sub/.claude/settings.json: a hook a host claude in sub/ runs",
            plant("deep/sub/.claude/settings.json"),
            planted_at("deep/sub/.claude/settings.json"),
        ),
        plant_case(
            "nested sub/.mcp.json: a server a host claude in sub/ starts",
            plant("deep/sub/.mcp.json"),
            planted_at("deep/sub/.mcp.json"),
        ),
        plant_case(
            "a new .envrc in a subdirectory",
            plant("deep/.envrc"),
            planted_at("deep/.envrc"),
        ),
        plant_case(
            "a new mise.toml",
            plant("mise.toml"),
            planted_at("mise.toml"),
        ),
        plant_case(
            "a new .codex/config.toml (a host Codex runs its notify command and MCP servers)",
            "mkdir -p .codex && printf 'notify = [\"sh\", \"-c\", \"echo PLANTED\"]\\n' > .codex/config.toml",
            planted_at(".codex/config.toml"),
        ),
        plant_case(
            "a new .vscode/tasks.json in a subdirectory",
            plant("deep/.vscode/tasks.json"),
            planted_at("deep/.vscode/tasks.json"),
        ),
        plant_case(
            "a new nested repository with core.fsmonitor",
            "mkdir -p newrepo && git -C newrepo init -q && \
             git -C newrepo config core.fsmonitor 'echo PLANTED'",
            |a: &Arena| {
                fs::read_to_string(a.proj.join("newrepo/.git/config"))
                    .is_ok_and(|s| s.contains("PLANTED"))
            },
        ),
        Plant {
            // The running launcher sees it at once and ends the sandbox (review.rs).
            ended_by: Some("a commondir was planted in the main git dir while the sandbox ran"),
            ..plant_case(
                "a new commondir in the main git dir (its config's fsmonitor runs on git status)",
                "echo \"$PWD/evil-common\" > .git/commondir",
                |a: &Arena| {
                    // Checked, then removed: the arena's next launches need the real one.
                    let there = a.proj.join(".git/commondir").exists();
                    let _ = fs::remove_file(a.proj.join(".git/commondir"));
                    there
                },
            )
        },
    ]);
    // Issue 34 (3): rustup's toolchain file naming a toolchain directory in the project
    // (rustup then runs its bin/cargo for `cargo --version` there: measured), and vim's
    // local config read with `set exrc`.
    v.push(plant_case(
        "rustup: rust-toolchain.toml with [toolchain] path naming a directory of the project",
        "mkdir -p tc/bin && printf '#!/bin/sh\\necho PLANTED\\n' > tc/bin/cargo && \
         chmod +x tc/bin/cargo && \
         printf '[toolchain]\\npath = \"%s/tc\"\\n# PLANTED\\n' \"$T_PROJ\" > rust-toolchain.toml",
        |a: &Arena| {
            let landed = contains_planted(&a.proj.join("rust-toolchain.toml"));
            let _ = fs::remove_file(a.proj.join("rust-toolchain.toml"));
            let _ = fs::remove_dir_all(a.proj.join("tc"));
            landed
        },
    ));
    v.push(plant_case(
        "vim with set exrc: a .exrc in a subdirectory",
        plant("src/.exrc"),
        |a: &Arena| {
            let landed = contains_planted(&a.proj.join("src/.exrc"));
            let _ = fs::remove_file(a.proj.join("src/.exrc"));
            landed
        },
    ));
    // Issue 34: plants in directories the agent made unlistable (0111) or unwritable
    // (0555) before it ended; the review gave up on them ("check it by hand", "remove
    // it"). As an ordinary user only: root passes permission bits (the review looked in).
    v.push(plant_case(
        "a staged nested repository with core.fsmonitor inside a directory made 0111: \
         the host's git status at the top runs it",
        "mkdir -p lock1/nested && cd lock1/nested && git init -q && \
         git config core.fsmonitor \"touch $T_WORLD/fsm-locked; false\" && echo x > f && \
         git add f && git -c user.name=a -c user.email=b commit -qm x && cd \"$T_PROJ\" && \
         git add lock1/nested 2>/dev/null; chmod 0111 lock1",
        |a: &Arena| {
            let ran = host_git_status_runs(a, "fsm-locked");
            unlock(a, &["lock1"]);
            let _ = std::process::Command::new("git")
                .arg("-C")
                .arg(&a.proj)
                .args(["rm", "-q", "--cached", "lock1/nested"])
                .output();
            let _ = fs::remove_dir_all(a.proj.join("lock1"));
            ran
        },
    ));
    v.push(plant_case(
        "a nested .claude/settings.json hook and .mcp.json inside a directory made 0111",
        "mkdir -p lock2/sub/.claude && \
         printf '{\"hooks\":{\"SessionStart\":[{\"hooks\":[{\"type\":\"command\",\"command\":\"echo PLANTED\"}]}]}}' \
         > lock2/sub/.claude/settings.json && \
         printf '{\"mcpServers\":{\"x\":{\"command\":\"PLANTED\"}}}' > lock2/sub/.mcp.json && \
         chmod 0111 lock2",
        |a: &Arena| {
            let landed = contains_planted(&a.proj.join("lock2/sub/.claude/settings.json"))
                || contains_planted(&a.proj.join("lock2/sub/.mcp.json"));
            unlock(a, &["lock2"]);
            let _ = fs::remove_dir_all(a.proj.join("lock2"));
            landed
        },
    ));
    v.push(plant_case(
        "plants inside a directory made 0555, which the review finds but cannot move from",
        "mkdir -p lock3/.husky && printf 'echo PLANTED\\n' > lock3/.envrc && \
         printf 'echo PLANTED\\n' > lock3/.husky/pre-commit && chmod 0555 lock3/.husky lock3",
        |a: &Arena| {
            let landed = contains_planted(&a.proj.join("lock3/.envrc"))
                || contains_planted(&a.proj.join("lock3/.husky/pre-commit"));
            unlock(a, &["lock3", "lock3/.husky"]);
            let _ = fs::remove_dir_all(a.proj.join("lock3"));
            landed
        },
    ));
    v.push(Plant {
        linked: true,
        ..plant_case(
            "linked worktree: rewrite its gitdir (git worktree repair writes a .git file there)",
            "echo /tmp/victim/.git > \"$T_COMMON\"/worktrees/\"$(basename \"$T_LINKED\")\"/gitdir 2>/dev/null",
            |a: &Arena| {
                let n = a.linked.file_name().unwrap();
                let f = a.proj.join(".git/worktrees").join(n).join("gitdir");
                let landed = fs::read_to_string(&f).is_ok_and(|s| s.contains("victim"));
                if landed {
                    // Put it back: the attempts after this one use the worktree.
                    let back = format!("{}\n", a.linked.join(".git").display());
                    fs::write(&f, back).unwrap();
                }
                landed
            },
        )
    });
    v.push(plant_case(
        "config.worktree with a fsmonitor, turned on by extensions.worktreeConfig",
        "git config extensions.worktreeConfig true 2>/dev/null; \
             printf '[core]\\n\\tfsmonitor = \"touch %s/fsm-worktree; false\"\\n' \"$T_WORLD\" \
             > .git/config.worktree 2>/dev/null",
        |a: &Arena| {
            let ran = host_git_status_runs(a, "fsm-worktree");
            // Its fsmonitor would win over the ones the attempts after this plant.
            let _ = fs::remove_file(a.proj.join(".git/config.worktree"));
            ran
        },
    ));
    for (name, file, marker) in [
        (
            "a config file .git/config includes: add a fsmonitor",
            ".gitconfig-project",
            "fsm-include",
        ),
        (
            "a config file .git/config includes that does not exist: create it",
            ".gitconfig-local",
            "fsm-include-missing",
        ),
    ] {
        v.push(plant_case(
            name,
            format!(
                "printf '[core]\\n\\tfsmonitor = \"touch %s/{marker}; false\"\\n' \"$T_WORLD\" \
                 >> {file} 2>/dev/null"
            ),
            move |a: &Arena| host_git_status_runs(a, marker),
        ));
    }
    // Found by the red-team pass on what the host runs (branch rtHost): a directory git's
    // discovery takes for a bare repository, a symlinked .claude, a git dir deeper below
    // modules/ than the review looked.
    let bare_config = |marker: &str| {
        format!(
            "echo 'ref: refs/heads/main' > HEAD && mkdir -p objects refs && \
             printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = .\\n\\t\
             fsmonitor = \"touch %s/{marker}; false\"\\n' \"$T_WORLD\" > config"
        )
    };
    v.push(plant_case(
        "a subdirectory shaped as a bare repository (HEAD, objects/, refs/, a config with \
         core.worktree and a fsmonitor): git status in it runs it",
        format!(
            "mkdir -p bare-sub && cd bare-sub && {}",
            bare_config("fsm-bare-sub")
        ),
        |a: &Arena| {
            let ran = host_git_status_in(a, "bare-sub", "fsm-bare-sub");
            let _ = fs::remove_dir_all(a.proj.join("bare-sub"));
            ran
        },
    ));
    v.push(plant_case(
        "the main .git/HEAD made no ref, the project's top shaped as a bare repository: \
         git status at the top runs its config's fsmonitor",
        format!(
            "cp .git/HEAD head.saved && echo garbage > .git/HEAD && {}",
            bare_config("fsm-bare-top")
        ),
        |a: &Arena| {
            let ran = host_git_status_in(a, "", "fsm-bare-top");
            // The arena's next attempts need its repository back.
            let p = &a.proj;
            if let Ok(head) = fs::read(p.join("head.saved")) {
                fs::write(p.join(".git/HEAD"), head).unwrap();
            }
            for f in ["head.saved", "HEAD", "config"] {
                let _ = fs::remove_file(p.join(f));
            }
            for d in ["objects", "refs"] {
                let _ = fs::remove_dir_all(p.join(d));
            }
            ran
        },
    ));
    v.push(plant_case(
        "a symlinked sub/.claude whose target holds settings.json with a hook (a host claude \
         in sub/ follows it)",
        "mkdir -p deep/lnk deep/lnk-target && \
         printf '{\"hooks\":{\"SessionStart\":[{\"hooks\":[{\"type\":\"command\",\"command\":\"echo PLANTED\"}]}]}}' \
         > deep/lnk-target/settings.json && ln -s ../lnk-target deep/lnk/.claude",
        |a: &Arena| {
            let landed = contains_planted(&a.proj.join("deep/lnk/.claude/settings.json"));
            let _ = fs::remove_file(a.proj.join("deep/lnk/.claude"));
            landed
        },
    ));
    v.push(plant_case(
        "a git dir 70 levels below .git/modules/ named by a new .git file: git status there \
         runs its fsmonitor",
        "d=.git/modules; for i in $(seq 70); do d=$d/a; done; \
         mkdir -p $d/objects $d/refs && echo 'ref: refs/heads/main' > $d/HEAD && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \"touch %s/fsm-deep-module; false\"\\n' \
         \"$T_WORLD\" > $d/config && mkdir -p deepmod && echo \"gitdir: ../$d\" > deepmod/.git",
        |a: &Arena| {
            let ran = host_git_status_in(a, "deepmod", "fsm-deep-module");
            let _ = fs::remove_dir_all(a.proj.join("deepmod"));
            let _ = fs::remove_dir_all(a.proj.join(".git/modules/a"));
            ran
        },
    ));
    v.push(plant_case(
        "a symlink into the project's claude-config (the sandbox's ~/.claude, its host path \
         in /proc/self/mountinfo), where a directory shaped as a bare repository waits: git \
         status through the link runs it",
        format!(
            "c=$(awk -v m=\"$HOME/.claude\" '$5 == m {{print $4}}' /proc/self/mountinfo) && \
             mkdir -p ~/.claude/bare-x && cd ~/.claude/bare-x && {} && \
             cd \"$T_PROJ\" && ln -s \"$c/bare-x\" state-link",
            bare_config("fsm-into-state")
        ),
        |a: &Arena| {
            let ran = host_git_status_in(a, "state-link", "fsm-into-state");
            let _ = fs::remove_file(a.proj.join("state-link"));
            let projects = a.w.home().join(".claudebox/projects");
            for e in fs::read_dir(projects).into_iter().flatten().flatten() {
                let _ = fs::remove_dir_all(e.path().join("claude-config/bare-x"));
            }
            ran
        },
    ));
    // The same in the project's own .git, which the review judges only for git's files.
    v.push(plant_case(
        "a symlink into .git, where a directory shaped as a bare repository waits: git \
         status through the link runs it",
        format!(
            "mkdir -p .git/bare-z && cd .git/bare-z && {} && cd \"$T_PROJ\" && \
             ln -s .git/bare-z git-link",
            bare_config("fsm-into-git")
        ),
        |a: &Arena| {
            let ran = host_git_status_in(a, "git-link", "fsm-into-git");
            let _ = fs::remove_file(a.proj.join("git-link"));
            let _ = fs::remove_dir_all(a.proj.join(".git/bare-z"));
            ran
        },
    ));
    // The same through a directory the user granted with --rw: the sandbox writes it, the
    // review does not walk it.
    let rw = rw_dir(a);
    v.push(Plant {
        args: vec!["--rw".into(), rw.to_str().unwrap().into()],
        ..plant_case(
            "a symlink into a directory granted with --rw, where a directory shaped as a bare \
             repository waits: git status through the link runs it",
            format!(
                "mkdir -p \"$T_WORLD\"/rw-granted/bare-y && cd \"$T_WORLD\"/rw-granted/bare-y && \
                 {} && cd \"$T_PROJ\" && ln -s \"$T_WORLD\"/rw-granted/bare-y rw-link",
                bare_config("fsm-into-rw")
            ),
            move |a: &Arena| {
                let ran = host_git_status_in(a, "rw-link", "fsm-into-rw");
                let _ = fs::remove_file(a.proj.join("rw-link"));
                let _ = fs::remove_dir_all(rw.join("bare-y"));
                ran
            },
        )
    });
    v.push(Plant {
        // Unfixed, the review overflowed its stack and aborted (every later one too).
        ended_by: Some("overflowed its stack"),
        ..plant_case(
            "a 5,000-level directory tree, then a rebase todo with an exec line: the review \
             must not stop before the git dirs",
            "python3 -c 'import os\nos.mkdir(\"deeptree\"); os.chdir(\"deeptree\")\n\
             for i in range(5000):\n    os.mkdir(\"d\"); os.chdir(\"d\")' && \
             mkdir -p .git/rebase-merge && printf 'pick 1 a\\nexec echo PLANTED\\n' \
             > .git/rebase-merge/git-rebase-todo",
            |a: &Arena| {
                let todo = a.proj.join(".git/rebase-merge");
                let landed = contains_planted(&todo.join("git-rebase-todo"));
                let _ = fs::remove_dir_all(&todo);
                // rm's walk, not std's recursive one (a test thread's stack).
                let q = a.w.home().join(".claudebox/projects");
                let _ = std::process::Command::new("sh")
                    .arg("-c")
                    .arg("rm -rf \"$1\"/deeptree \"$2\"/*/quarantine")
                    .args(["sh".as_ref(), a.proj.as_os_str(), q.as_os_str()])
                    .status();
                landed
            },
        )
    });
    v.push(Plant {
        linked: true,
        ..plant_case(
            "a work tree without .claude: create .claude/settings.json with a hook",
            plant(".claude/settings.json"),
            |a: &Arena| contains_planted(&a.linked.join(".claude/settings.json")),
        )
    });
    v
}

/// Gives the project's directories `rels` back their owner's rights (the agent's `chmod`
/// undone), for the next attempt.
fn unlock(a: &Arena, rels: &[&str]) {
    use std::os::unix::fs::PermissionsExt;
    for r in rels {
        let _ = fs::set_permissions(a.proj.join(r), fs::Permissions::from_mode(0o755));
    }
}

/// Whether the host's `git status` in the project makes `$T_WORLD/<marker>` (a planted
/// fsmonitor ran); the marker is removed for the next attempt.
fn host_git_status_runs(a: &Arena, marker: &str) -> bool {
    host_git_status_in(a, "", marker)
}

/// The same in the project's directory `rel` (`""`: its top).
fn host_git_status_in(a: &Arena, rel: &str, marker: &str) -> bool {
    let m = a.w.root().join(marker);
    let _ = std::process::Command::new("git")
        .arg("-C")
        .arg(a.proj.join(rel))
        .arg("status")
        .env("HOME", a.w.home())
        .output()
        .unwrap();
    let ran = m.exists();
    let _ = fs::remove_file(&m);
    ran
}

/// Plants, from inside, a `commondir` in the main git dir naming a copy of it whose
/// config has a fsmonitor (the copy lies in the project; it did not exist at the launch).
const COMMONDIR_SCRIPT: &str = "mkdir -p evilc && cp -r .git/HEAD .git/refs .git/objects evilc/ && \
     printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \"touch %s/fsm-commondir; false\"\\n' \"$T_WORLD\" > evilc/config && \
     echo ../evilc > .git/commondir";

/// Removes what [`COMMONDIR_SCRIPT`] planted.
fn remove_commondir(a: &Arena) {
    let _ = fs::remove_file(a.proj.join(".git/commondir"));
    let _ = fs::remove_dir_all(a.proj.join("evilc"));
}

/// The planted name: an OSC 52 clipboard write, a carriage return and a fake verdict.
const EVIL_NAME: &str = "L\\033]52;c;ZXZpbA==\\007\\rclaudebox: all good\\033[K";

/// Plants, from inside, a submodule git dir whose `core.worktree` names a path through a
/// symlink, with terminal escapes in its name: the next launch cannot protect it and
/// says so, printing the path.
fn escape_sequence_script() -> String {
    format!(
        "d=\"$T_COMMON\"/modules/evil; mkdir -p \"$d\" && echo 'ref: refs/heads/main' > \"$d/HEAD\" && \
         n=$(printf '{EVIL_NAME}') && mkdir -p evil-real && : > evil-real/.git && \
         ln -s evil-real \"$n\" && \
         printf '[core]\\n\\tworktree = ../../../%s\\n' \"$n\" > \"$d/config\""
    )
}

/// The next launch in the project, as the user would make it after the agent's session.
fn next_launch(a: &Arena) -> Output {
    a.cmd(&a.proj, &[])
        .args(["--exec", "true"])
        .output()
        .unwrap()
}

/// Removes what [`escape_sequence_script`] planted.
fn remove_evil(a: &Arena) {
    let _ = fs::remove_dir_all(a.proj.join(".git/modules/evil"));
    let _ = fs::remove_dir_all(a.proj.join("evil-real"));
    for e in fs::read_dir(&a.proj).unwrap().flatten() {
        if e.file_name().as_encoded_bytes().starts_with(b"L\x1b") {
            fs::remove_file(e.path()).unwrap();
        }
    }
}

pub(super) fn attempts(a: &Arena) -> Vec<Attempt> {
    setup(a);
    let mut v: Vec<Attempt> = plants(a)
        .into_iter()
        .map(|p| {
            let landed = p.landed;
            let mut at = Attempt {
                args: p.args,
                ..attempt(p.name, p.script)
            }
            .host_check(move |a| landed(a));
            if let Some(line) = p.ended_by {
                at = at.may_be_ended_by(line);
            }
            if p.linked {
                at.in_linked_worktree()
            } else {
                at
            }
        })
        .collect();
    v.push(attempt(
        "read git's XDG credential store (~/.config/git/credentials)",
        format!("grep -qs SECRET ~/.config/git/credentials && echo {MARK}"),
    ));
    v.push(
        attempt(
            "CLAUDEBOX_HOME inside ~/.claude: read another project's conversation",
            format!("grep -rqs OTHER-PROJECT-CONVERSATION ~/.claude && echo {MARK}"),
        )
        .env("CLAUDEBOX_HOME", state_in_claude(a))
        .refusal_stops_it(),
    );
    // Planted with the opt-out, so that the exit review (which moves any new main
    // commondir aside: review.rs) leaves it for the next launch to meet.
    v.push(
        Attempt {
            args: vec!["--writable-project-config".into()],
            ..attempt(
                "plant .git/commondir (main git dir, the exit review off): the next launch must refuse it",
                COMMONDIR_SCRIPT,
            )
        }
        .host_check(|a| {
            let o = next_launch(a);
            remove_commondir(a);
            let e = stderr(&o);
            let refused =
                !o.status.success() && e.lines().count() == 1 && e.contains(".git/commondir");
            if !refused {
                eprintln!("next launch: {:?}\n{e}", o.status);
            }
            !refused
        }),
    );
    v.push(
        attempt(
            "terminal escapes in a path claudebox prints (core.worktree of a planted git dir)",
            escape_sequence_script(),
        )
        .host_check(|a| {
            // The exit review moved the planted config aside: nothing left to launch into.
            if !a.proj.join(".git/modules/evil/config").exists() {
                remove_evil(a);
                return false;
            }
            let o = next_launch(a);
            remove_evil(a);
            let err = &o.stderr;
            let raw = err.iter().any(|b| matches!(b, 0x1b | 0x07 | b'\r'));
            let text = stderr(&o);
            // It must be refused, say which file named the path, and show it escaped.
            let named = text.contains(".git/modules/evil/config");
            let escaped = text.contains("\\x1b]52;c;ZXZpbA==\\x07\\x0dclaudebox: all good");
            if raw || o.status.success() || !named || !escaped {
                eprintln!("next launch: {:?}\n{text}", o.status);
                return true;
            }
            false
        }),
    );
    v
}

/// With the opt-out (`--writable-project-config`) every file attempt lands, and with the
/// other doors open the reads succeed: the attempts above can succeed.
pub(super) fn controls(a: &Arena) {
    setup(a);
    for p in plants(a) {
        let at = attempt(p.name, p.script);
        let at = if p.linked {
            at.in_linked_worktree()
        } else {
            at
        };
        let mut args = p.args;
        args.push("--writable-project-config".into());
        let at = Attempt { args, ..at };
        let (_, text) = run_attempt(a, &at);
        assert!((p.landed)(a), "control {:?} did not land:\n{text}", p.name);
    }
    // The credential store is there, beside the config git reads, and readable when bound.
    let creds = a.w.home().join(".config/git/credentials");
    let read = attempt(
        "control: read ~/.config/git/credentials bound with --ro",
        format!(
            "grep -qs SECRET ~/.config/git/credentials && echo {MARK}; cat ~/.config/git/ignore"
        ),
    );
    let read = Attempt {
        args: vec!["--ro".into(), creds.to_str().unwrap().into()],
        ..read
    };
    let (escaped, text) = run_attempt(a, &read);
    assert!(escaped && text.contains("*.swp"), "{text}");
    // Another project's conversation in ~/.claude is readable from inside: a state
    // directory there would be.
    let (escaped, text) = run_attempt(
        a,
        &attempt(
            "control: read ~/.claude/claudebox-state",
            format!("grep -rqs OTHER-PROJECT-CONVERSATION ~/.claude && echo {MARK}"),
        ),
    );
    assert!(escaped, "{text}");
    // A planted main commondir: the host's git status runs its fsmonitor, and a launch
    // with the opt-out starts (so the refusal above is the probe's).
    // (With the opt-out: otherwise the exit review moves it aside.)
    let (_, text) = run_attempt(
        a,
        &Attempt {
            args: vec!["--writable-project-config".into()],
            ..attempt("control: plant .git/commondir", COMMONDIR_SCRIPT)
        },
    );
    assert!(host_git_status_runs(a, "fsm-commondir"), "{text}");
    let o = a
        .cmd(&a.proj, &[])
        .args(["--writable-project-config", "--exec", "true"])
        .output()
        .unwrap();
    remove_commondir(a);
    assert!(o.status.success(), "{}", stderr(&o));
    // The planted path reaches claudebox's message (escaped), and the project launches
    // again once the named file is gone.
    // (With the opt-out: otherwise the exit review moves the planted config aside.)
    let (_, text) = run_attempt(
        a,
        &Attempt {
            args: vec!["--writable-project-config".into()],
            ..attempt(
                "control: plant the escape sequence",
                escape_sequence_script(),
            )
        },
    );
    let o = next_launch(a);
    assert!(!o.status.success(), "{text}");
    assert!(stderr(&o).contains("\\x1b]52;c;"), "{}", stderr(&o));
    remove_evil(a);
    let o = next_launch(a);
    assert!(o.status.success(), "{}", stderr(&o));
}
