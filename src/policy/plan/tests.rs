//! Unit tests of the plan: mount order, argv, settings, hardening.

use super::*;
use crate::policy::origin::Origin;

/// A plan input with every field set to a neutral value, for unit tests: tests override
/// what they look at with `Inputs { field, ..test_inputs() }`.
pub(crate) fn test_inputs() -> Inputs {
    Inputs {
        command: Command::Exec(vec!["sh".into()]),
        protect_project_metadata: false,
        landlock_abi: 7,
        ..Inputs::new(
            Project {
                root: "/p/.git".into(),
                work_tree: "/p".into(),
                git_dir: Some("/p/.git".into()),
                common_dir: Some("/p/.git".into()),
                cwd: "/p".into(),
            },
            "/h".into(),
            ProjectState {
                dir: "/h/.claudebox/projects/0123456789abcdef".into(),
            },
            "/usr/bin/bwrap".into(),
            "/opt/cb/claudebox".into(),
            "0".repeat(32),
        )
    }
}

/// Where `window` starts in the argv `a` (a test fails when it is not there).
fn pos(a: &[OsString], window: &[&str]) -> usize {
    a.windows(window.len())
        .position(|w| w.iter().zip(window).all(|(x, y)| x == y))
        .unwrap_or_else(|| panic!("{window:?} not in {a:?}"))
}

mod claude_home_group {
    use super::*;

    /// A claude installed under `~/.claude/local` stays read-only: its mount comes again
    /// after the whole `~/.claude` group, even with the setup writable.
    #[test]
    fn an_installation_under_dot_claude_is_read_only_last() {
        for writable in [false, true] {
            let inp = Inputs {
                claude: Some(ClaudeInstall {
                    on_path: "/h/.claude/local/claude".into(),
                    real: "/h/.claude/local/node_modules/@anthropic-ai/claude-code/cli.js".into(),
                    bind: "/h/.claude/local/node_modules/@anthropic-ai/claude-code".into(),
                    interpreter: None,
                }),
                claude_home: HostClaude {
                    dir: "/h/.claude".into(),
                    json: "/h/.claude.json".into(),
                    entries: vec![("local".into(), true), ("settings.json".into(), false)],
                    credentials: None,
                    within: Vec::new(),
                },
                writable_claude_setup: writable,
                ..test_inputs()
            };
            let plan = build(&inp);
            let last_over = |p: &str| {
                plan.mounts
                    .iter()
                    .rev()
                    .find(|m| m.kind != MountKind::ScratchRo && Path::new(p).starts_with(&m.target))
                    .unwrap()
                    .clone()
            };
            let m = last_over("/h/.claude/local/node_modules/@anthropic-ai/claude-code/cli.js");
            assert_eq!(m.kind, MountKind::Ro, "{m:?}");
            let m = last_over("/h/.claude/local/claude");
            assert!(
                matches!(
                    m.kind,
                    MountKind::Ro | MountKind::RoTry | MountKind::Symlink
                ),
                "{m:?}"
            );
            // Writable: the host's own file; else the project's copy in the state.
            let m = last_over("/h/.claude/settings.json");
            assert_eq!(m.kind, MountKind::File);
            assert_eq!(
                m.source.as_deref() == Some(inp.state.user_settings().as_path()),
                !writable,
                "{m:?}"
            );
            assert_eq!(
                plan.notes
                    .iter()
                    .any(|n| n.contains("--writable-claude-setup")),
                writable
            );
        }
    }
}

mod argv_order {
    use super::*;
    use crate::policy::render;

    fn inputs(command: Command) -> Inputs {
        Inputs {
            project: Project {
                root: "/src/app/.git".into(),
                work_tree: "/src/wt".into(),
                git_dir: Some("/src/app/.git/worktrees/wt".into()),
                common_dir: Some("/src/app/.git".into()),
                cwd: "/src/wt/sub".into(),
            },
            home: "/home/u".into(),
            state: ProjectState {
                dir: "/home/u/.claudebox/projects/0123456789abcdef".into(),
            },
            claude: Some(ClaudeInstall {
                on_path: "/home/u/.local/bin/claude".into(),
                real: "/home/u/.local/share/claude/versions/1".into(),
                bind: "/home/u/.local/share/claude/versions/1".into(),
                interpreter: None,
            }),
            command,
            instance_id: "00".repeat(16),
            host: HostFacts {
                system: vec![
                    ("/usr".into(), SystemEntry::Dir),
                    ("/bin".into(), SystemEntry::Symlink("usr/bin".into())),
                ],
                resolv_conf_target: None,
            },
            ..test_inputs()
        }
    }

    #[test]
    fn overlays_come_after_claude_dir_in_order() {
        let a = render::argv(&build(&inputs(Command::Claude(vec![]))));
        let claude = pos(
            &a,
            &[
                "--bind",
                "/home/u/.claudebox/projects/0123456789abcdef/claude-config",
                "/home/u/.claude",
            ],
        );
        let conv = pos(
            &a,
            &[
                "--bind",
                "/home/u/.claudebox/projects/0123456789abcdef/claude-projects",
                "/home/u/.claude/projects",
            ],
        );
        let hist = pos(
            &a,
            &[
                "--bind",
                "/home/u/.claudebox/projects/0123456789abcdef/history.jsonl",
                "/home/u/.claude/history.jsonl",
            ],
        );
        let sessions = pos(&a, &["--tmpfs", "/home/u/.claude/sessions"]);
        let home = pos(&a, &["--tmpfs", "/home/u"]);
        let project = pos(&a, &["--bind", "/src/wt", "/src/wt"]);
        let common = pos(&a, &["--bind", "/src/app/.git", "/src/app/.git"]);
        assert!(home < project && project < common && common < claude);
        assert!(claude < conv && conv < hist && hist < sessions);
        assert!(pos(&a, &["--tmpfs", "/tmp"]) < home);
        assert!(
            pos(
                &a,
                &["--symlink", ".claude/.claude.json", "/home/u/.claude.json"]
            ) > claude
        );
        assert!(pos(&a, &["--setenv", "CLAUDE_CONFIG_DIR", "/home/u/.claude"]) > claude);
    }

    #[test]
    fn system_namespaces_and_command() {
        let a = render::argv(&build(&inputs(Command::Claude(vec![
            "-p".into(),
            "a b".into(),
        ]))));
        assert_eq!(a[0], "/usr/bin/bwrap");
        pos(&a, &["--ro-bind", "/usr", "/usr"]);
        pos(&a, &["--symlink", "usr/bin", "/bin"]);
        for f in [
            "--unshare-user",
            "--unshare-pid",
            "--die-with-parent",
            "--proc",
            "--dev",
        ] {
            pos(&a, &[f]);
        }
        pos(&a, &["--chdir", "/src/wt/sub"]);
        pos(
            &a,
            &[
                "--setenv",
                "CLAUDEBOX_PROJECT_ID",
                &crate::policy::facts::project_id(Path::new("/src/app/.git")),
            ],
        );
        // the claude found on PATH is reachable at the same path inside
        pos(&a, &["--ro-bind", "/home/u/.local/share/claude/versions/1"]);
        pos(
            &a,
            &[
                "--symlink",
                "/home/u/.local/share/claude/versions/1",
                "/home/u/.local/bin/claude",
            ],
        );
        // bwrap runs claudebox's init step, which then execs claude
        let dd = pos(&a, &["--"]);
        assert_eq!(&a[dd + 1..dd + 3], &["/opt/cb/claudebox", "--sandbox-init"]);
        let dd = a.iter().rposition(|x| x == "--").unwrap();
        assert_eq!(a[dd + 1], "/home/u/.local/bin/claude");
        assert_eq!(a[dd + 2], "--append-system-prompt");
        assert_eq!(&a[dd + 4..], &["-p", "a b"]);
        assert_eq!(a.len(), dd + 6);
    }

    #[test]
    fn exec_runs_the_command_without_the_note() {
        let a = render::argv(&build(&inputs(Command::Exec(vec!["bash".into()]))));
        let dd = a.iter().rposition(|x| x == "--").unwrap();
        assert_eq!(&a[dd + 1..], &["bash"]);
    }

    #[test]
    fn the_project_is_never_shadowed_by_the_home_tmpfs() {
        let mut i = inputs(Command::Exec(vec!["true".into()]));
        i.project.work_tree = "/home/u/src/p".into();
        let a = render::argv(&build(&i));
        assert!(
            pos(&a, &["--tmpfs", "/home/u"])
                < pos(&a, &["--bind", "/home/u/src/p", "/home/u/src/p"])
        );
    }

    use crate::policy::settings::{ClaudeArgs, UserEnv};

    fn inputs_with(settings: Settings) -> Inputs {
        Inputs {
            project: Project {
                root: "/w/p/.git".into(),
                work_tree: "/w/p".into(),
                git_dir: Some("/w/p/.git".into()),
                common_dir: Some("/w/p/.git".into()),
                cwd: "/w/p".into(),
            },
            command: Command::Claude(vec!["mcp".into(), "list".into()]),
            settings,
            ..test_inputs()
        }
    }

    fn extra(kind: ExtraKind, path: &str, is_dir: bool) -> ExtraMount {
        ExtraMount {
            kind,
            source: path.into(),
            target: path.into(),
            is_dir,
            origin: Origin::CommandLine,
        }
    }

    fn position(plan: &Plan, target: &str, kind: MountKind) -> usize {
        plan.mounts
            .iter()
            .position(|m| m.target == Path::new(target) && m.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} mount at {target}"))
    }

    #[test]
    fn extras_go_last_except_parents_of_the_project() {
        let settings = Settings {
            mounts: vec![
                extra(ExtraKind::Hide, "/w/p/secret/key", false),
                extra(ExtraKind::Ro, "/w/p/vendor", true),
                extra(ExtraKind::Hide, "/w/p/secret", true),
                extra(ExtraKind::Ro, "/w", true),
                extra(ExtraKind::Rw, "/data", true),
            ],
            ..Settings::default()
        };
        let plan = build(&inputs_with(settings));
        let project = position(&plan, "/w/p", MountKind::Rw);
        let claude_json = position(&plan, "/h/.claude.json", MountKind::Symlink);
        let parent = position(&plan, "/w", MountKind::Ro);
        assert!(
            parent < project,
            "a parent of the project must not shadow it"
        );
        assert!(position(&plan, "/h", MountKind::Tmpfs) < parent);
        for (t, k) in [
            ("/w/p/vendor", MountKind::Ro),
            ("/data", MountKind::Rw),
            ("/w/p/secret", MountKind::Tmpfs),
        ] {
            assert!(position(&plan, t, k.clone()) > claude_json, "{t}");
        }
        // Parents first, whatever order they were listed in: the file stays hidden.
        let dir = position(&plan, "/w/p/secret", MountKind::Tmpfs);
        let file = position(&plan, "/w/p/secret/key", MountKind::Ro);
        assert!(dir < file);
        assert_eq!(
            plan.mounts[file].source.as_deref(),
            Some(Path::new("/h/.claudebox/projects/0123456789abcdef/empty"))
        );
        assert_eq!(plan.mounts[file].origin, Origin::CommandLine);
        assert_eq!(plan.mounts[project].origin, Origin::Default);
    }

    #[test]
    fn network_none_unshares_the_network() {
        assert!(!build(&inputs_with(Settings::default()))
            .flags
            .contains(&"--unshare-net"));
        let plan = build(&inputs_with(Settings {
            network: NetworkMode::None,
            ..Settings::default()
        }));
        assert!(plan.flags.contains(&"--unshare-net"));
        let argv = crate::policy::render::argv(&plan);
        let net = argv.iter().position(|a| a == "--unshare-net").unwrap();
        let sep = argv.iter().position(|a| a == "--").unwrap();
        assert!(net < sep);
    }

    #[test]
    fn default_claude_args_come_before_the_users_and_env_after_claudeboxs() {
        let plan = build(&inputs_with(Settings {
            claude_args: vec![ClaudeArgs {
                args: vec!["--model".into(), "opus".into()],
                origin: Origin::CommandLine,
            }],
            env: vec![UserEnv {
                name: "CLAUDEBOX_X".into(),
                value: "v".into(),
                origin: Origin::CommandLine,
            }],
            ..Settings::default()
        }));
        let tail: Vec<&OsStr> = plan.argv[3..].iter().map(|a| a.as_os_str()).collect();
        assert_eq!(tail, ["--model", "opus", "mcp", "list"]);
        let argv = crate::policy::render::argv(&plan);
        let user = argv.iter().position(|a| a == "CLAUDEBOX_X").unwrap();
        let own = argv
            .iter()
            .position(|a| a == "CLAUDEBOX_INSTANCE_ID")
            .unwrap();
        assert!(own < user && argv[user - 1] == "--setenv");
    }
}

mod hardening {
    use super::*;
    use crate::policy::render;

    /// `test_inputs()`'s project `/p`, with its metadata protected.
    fn inputs() -> Inputs {
        Inputs {
            protect_project_metadata: true,
            protected: vec![
                Protected {
                    path: "/p/.git".into(),
                    guard: Guard::Pin,
                    why: "pin",
                    named_by: None,
                },
                Protected {
                    path: "/p/.git/hooks".into(),
                    guard: Guard::EmptyDir,
                    why: "hooks",
                    named_by: None,
                },
                Protected {
                    path: "/p/.git/config".into(),
                    guard: Guard::ReadOnly,
                    why: "config",
                    named_by: None,
                },
            ],
            unprotected_missing: vec!["/p/.envrc".into()],
            ipc_vars: vec!["SSH_AUTH_SOCK".into(), "DISPLAY".into()],
            ..test_inputs()
        }
    }

    #[test]
    fn protections_come_after_the_project_and_parents_first() {
        let a = render::argv(&build(&inputs()));
        let project = pos(&a, &["--bind", "/p", "/p"]);
        let pin = pos(&a, &["--bind", "/p/.git", "/p/.git"]);
        let hooks = pos(
            &a,
            &["--tmpfs", "/p/.git/hooks", "--remount-ro", "/p/.git/hooks"],
        );
        let config = pos(&a, &["--ro-bind", "/p/.git/config", "/p/.git/config"]);
        assert!(project < pin && pin < hooks && pin < config);
    }

    /// The supervisor refuses `HEAD` at the project's top and at the top of every nested
    /// repository or submodule whose `.git` the launch protects (their git dirs, where git
    /// writes `HEAD`, are not tops); none with the metadata writable.
    #[test]
    fn the_tops_of_nested_repositories_are_guarded() {
        let mut i = inputs();
        for (path, why) in [
            (
                "/p/vendor/lib/.git",
                crate::policy::protected::PINNED_GIT_DIR_WHY,
            ),
            (
                "/p/.git/modules/sub",
                crate::policy::protected::PINNED_GIT_DIR_WHY,
            ),
            ("/p/sub/.git", "a submodule's .git file"),
            ("/p/vendor/lib/.git/config", "config"),
        ] {
            i.protected.push(Protected {
                path: path.into(),
                guard: Guard::Pin,
                why,
                named_by: None,
            });
        }
        let tops = |i: &Inputs| build(i).confine.map(|c| c.guard_work_tree);
        let want: Vec<PathBuf> = ["/p", "/p/vendor/lib", "/p/sub"].map(PathBuf::from).into();
        assert_eq!(tops(&i), Some(want));
        i.protect_project_metadata = false;
        assert_eq!(tops(&i), Some(Vec::new()));
    }

    #[test]
    fn init_step_wraps_the_command_and_ipc_vars_are_unset() {
        let a = render::argv(&build(&inputs()));
        let init = pos(
            &a,
            &[
                "--",
                "/opt/cb/claudebox",
                "--sandbox-init",
                "--scope-abstract-unix",
                "--default-signals",
            ],
        );
        // then the mounts it checks from inside, each once, the visible one per path
        let end = pos(&a, &["--", "sh"]);
        assert_eq!(end + 2, a.len());
        let checks: Vec<&str> = a[init + 5..end]
            .iter()
            .map(|x| x.to_str().unwrap())
            .collect();
        for window in [
            &["--expect-rw", "/p"][..],
            &["--expect-rw", "/p/.git"],
            &["--expect-ro", "/p/.git/hooks"],
            &["--expect-ro", "/p/.git/config"],
            &["--expect-rw", "/h/.claude/projects"],
        ] {
            assert!(
                checks.windows(2).any(|w| w == window),
                "{window:?} in {checks:?}"
            );
        }
        assert!(!checks.contains(&"/h/.claude"), "{checks:?}");
        pos(&a, &["--ro-bind", "/opt/cb/claudebox", "/opt/cb/claudebox"]);
        pos(&a, &["--unsetenv", "SSH_AUTH_SOCK"]);
        pos(&a, &["--unsetenv", "DISPLAY"]);
    }

    #[test]
    fn the_projects_claude_dir_is_a_scratch_tmpfs_with_the_state_copy_of_local_settings() {
        let mut i = inputs();
        for (path, guard) in [
            ("/p/.claude", Guard::Scratch),
            ("/p/.claude/settings.json", Guard::ReadOnly),
            ("/p/.claude/settings.local.json", Guard::LocalSettings),
        ] {
            i.protected.push(Protected {
                path: path.into(),
                guard,
                why: "claude",
                named_by: None,
            });
        }
        let copy = i.state.local_settings();
        let a = render::argv(&build(&i));
        let scratch = pos(&a, &["--tmpfs", "/p/.claude"]);
        let shared = pos(
            &a,
            &[
                "--ro-bind",
                "/p/.claude/settings.json",
                "/p/.claude/settings.json",
            ],
        );
        let local = pos(
            &a,
            &[
                "--bind",
                copy.to_str().unwrap(),
                "/p/.claude/settings.local.json",
            ],
        );
        assert!(pos(&a, &["--bind", "/p", "/p"]) < scratch && scratch < shared && shared < local);
    }

    #[test]
    fn without_landlock_scopes_the_gap_is_told() {
        let mut i = inputs();
        i.landlock_abi = 5;
        let p = build(&i);
        assert!(!p.confine.as_ref().unwrap().scope_abstract_unix);
        assert!(p.notes.iter().any(|n| n.contains("abstract unix sockets")));
    }

    #[test]
    fn opt_outs_show_in_the_notes() {
        let mut i = inputs();
        i.protect_project_metadata = false;
        i.ssh_agent = Some("/tmp/ssh-x/agent.1".into());
        let p = build(&i);
        let a = render::argv(&p);
        assert!(!a.iter().any(|x| x == "/p/.git/config"));
        pos(&a, &["--bind", "/tmp/ssh-x/agent.1", SSH_AGENT_SOCK]);
        pos(&a, &["--setenv", "SSH_AUTH_SOCK", SSH_AGENT_SOCK]);
        assert!(!a
            .windows(2)
            .any(|w| w[0] == "--unsetenv" && w[1] == "SSH_AUTH_SOCK"));
        let dry = String::from_utf8(render::dry_run(&p)).unwrap();
        assert!(dry.contains("opt-in --writable-project-config"));
        assert!(dry.contains("opt-in --ssh-agent"));
    }
}

/// `--dry-run` shows the seccomp filter and the Landlock scope from their tables: each
/// row once, and no seccomp or landlock line that is not a row.
#[test]
fn dry_run_shows_the_confinement_tables_exactly() {
    let text = |abi: u32| {
        let plan = build(&Inputs {
            landlock_abi: abi,
            ..test_inputs()
        });
        String::from_utf8(crate::policy::render::dry_run(&plan)).unwrap()
    };
    let only = |t: &str, prefix: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect()
    };
    let dry = text(6);
    assert_eq!(
        only(&dry, "seccomp"),
        crate::policy::confinement::seccomp_lines()
    );
    assert_eq!(
        only(&dry, "landlock"),
        [format!(
            "landlock\t{}",
            crate::policy::confinement::LANDLOCK_SCOPE
        )]
    );
    for row in crate::policy::confinement::SECCOMP {
        assert_eq!(dry.matches(&row.shown()).count(), 1, "{}", row.shown());
    }
    // Without Landlock scopes (ABI 5), no landlock line claims one.
    assert!(only(&text(5), "landlock").is_empty());
}

mod codex_group {
    use super::*;
    use crate::policy::codex_home::HostCodex;

    /// `--agent codex`: `~/.codex` is the project's own directory with the user's setup
    /// read-only over it (checked inside), CODEX_HOME instead of the `CLAUDE_*` variables,
    /// nothing of `~/.claude`, codex as the program; Claude's plan has none of it.
    #[test]
    fn codex_gets_its_own_home_and_the_setup_read_only() {
        let inp = Inputs {
            agent: AgentId::Codex,
            command: Command::Claude(vec!["exec".into()]),
            codex: Some(ClaudeInstall {
                on_path: "/u/bin/codex".into(),
                real: "/u/lib/node_modules/@openai/codex/bin/codex.js".into(),
                bind: "/u/lib/node_modules/@openai".into(),
                interpreter: None,
            }),
            codex_home: HostCodex {
                dir: "/h/.codex".into(),
                entries: vec![("config.toml".into(), false), ("sessions".into(), true)],
            },
            ..test_inputs()
        };
        let plan = build(&inp);
        assert_eq!(
            plan.argv[..2],
            ["/u/bin/codex".into(), "exec".into()] as [OsString; 2]
        );
        let set = |name: &str| {
            plan.env
                .iter()
                .any(|e| matches!(e, EnvOp::Set(n, _) if n == name))
        };
        assert!(set("CODEX_HOME") && !set("CLAUDE_CONFIG_DIR"));
        assert!(!plan
            .mounts
            .iter()
            .any(|m| m.target.starts_with("/h/.claude")));
        let home = plan
            .mounts
            .iter()
            .find(|m| m.target == Path::new("/h/.codex"))
            .unwrap();
        assert_eq!(home.kind, MountKind::Rw);
        assert_eq!(
            home.source.as_deref(),
            Some(Path::new(
                "/h/.claudebox/projects/0123456789abcdef/codex-home"
            ))
        );
        assert!(!plan
            .mounts
            .iter()
            .any(|m| m.source.as_deref() == Some(Path::new("/h/.codex/sessions"))));
        let checks = &plan.confine.as_ref().unwrap().mount_checks;
        // The host's config.toml, read-only (skipped if it goes before the launch opens it,
        // as for ~/.claude's setup); the stand-ins for what the host lacks are checked.
        assert!(plan.mounts.iter().any(|m| m.kind == MountKind::RoTry
            && m.source.as_deref() == Some(Path::new("/h/.codex/config.toml"))
            && m.target == Path::new("/h/.codex/config.toml")));
        for p in [
            "/h/.codex/hooks.json",
            "/h/.codex/rules",
            "/h/.codex/AGENTS.md",
        ] {
            assert!(
                checks.iter().any(|c| c.path == Path::new(p) && c.read_only),
                "{p} not checked read-only: {checks:?}"
            );
        }
        let claude = build(&test_inputs());
        assert!(!claude
            .mounts
            .iter()
            .any(|m| m.target.starts_with("/h/.codex")));
    }
}

/// The directories around the project are the sandbox's own: read-only at the end.
#[test]
fn the_projects_parents_are_read_only_once_mounted() {
    let kinds = |plan: &Plan| -> Vec<(String, MountKind)> {
        plan.mounts
            .iter()
            .map(|m| (m.target.display().to_string(), m.kind.clone()))
            .collect()
    };
    // Outside the home and /tmp: bwrap's root, remounted last.
    let plan = build(&test_inputs());
    let m = kinds(&plan);
    assert_eq!(m.last(), Some(&("/".to_string(), MountKind::ScratchRo)));
    assert_eq!(m.iter().filter(|k| k.1 == MountKind::ScratchRo).count(), 1);
    let argv: Vec<String> = crate::policy::render::argv(&plan)
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let at = argv.iter().position(|a| a == "--remount-ro").unwrap();
    assert!(!argv[..at].iter().any(|a| a == "/"), "no tmpfs over /");
    // Under the home: its first directory on the way is a tmpfs right after the home's.
    for (work_tree, top, base) in [
        ("/h/src/a/app", "/h/src", "/h"),
        ("/tmp/t/app", "/tmp/t", "/tmp"),
    ] {
        let mut inp = test_inputs();
        inp.project.work_tree = work_tree.into();
        let plan = build(&inp);
        let m = kinds(&plan);
        let b = m
            .iter()
            .position(|k| k.0 == base && k.1 == MountKind::Tmpfs)
            .unwrap();
        assert_eq!(m[b + 1], (top.to_string(), MountKind::ScratchRo), "{m:?}");
        let argv: Vec<String> = crate::policy::render::argv(&plan)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let pairs: Vec<&[String]> = argv.windows(2).filter(|w| w[0] == "--remount-ro").collect();
        assert!(pairs.iter().any(|w| w[1] == top), "{argv:?}");
    }
    // Directly in the home: the home stays writable (scratch), nothing added there.
    let mut inp = test_inputs();
    inp.project.work_tree = "/h/app".into();
    let m = kinds(&build(&inp));
    assert_eq!(
        m.iter().filter(|k| k.1 == MountKind::ScratchRo).count(),
        1,
        "{m:?}"
    );
}

/// Where the installers put the agents (issue 35): the name on PATH is made inside as a
/// symlink only where the system does not show the host's own entry already.
mod install_layouts {
    use super::*;

    fn system() -> HostFacts {
        HostFacts {
            system: vec![
                ("/usr".into(), SystemEntry::Dir),
                ("/bin".into(), SystemEntry::Symlink("usr/bin".into())),
                ("/nix/store".into(), SystemEntry::Dir),
            ],
            resolv_conf_target: None,
        }
    }

    fn install(on_path: &str, real: &str, bind: &str) -> ClaudeInstall {
        ClaudeInstall {
            on_path: on_path.into(),
            real: real.into(),
            bind: bind.into(),
            interpreter: None,
        }
    }

    /// The symlinks and the read-only binds the plan makes for `c`, run as claude and
    /// as codex.
    fn links_and_binds(c: &ClaudeInstall) -> [(Vec<PathBuf>, Vec<PathBuf>); 2] {
        let claude = Inputs {
            claude: Some(c.clone()),
            host: system(),
            ..test_inputs()
        };
        let codex = Inputs {
            agent: AgentId::Codex,
            codex: Some(c.clone()),
            host: system(),
            ..test_inputs()
        };
        [claude, codex].map(|inp| {
            let plan = build(&inp);
            let of = |kind: MountKind| {
                plan.mounts
                    .iter()
                    .filter(|m| m.kind == kind && m.why.contains("installation"))
                    .map(|m| m.target.clone())
                    .collect::<Vec<_>>()
            };
            let links = plan
                .mounts
                .iter()
                .filter(|m| m.kind == MountKind::Symlink && m.why.contains("PATH finds it"))
                .map(|m| m.target.clone())
                .collect();
            (links, of(MountKind::Ro))
        })
    }

    /// `sudo npm install -g`: `/usr/local/bin/claude` is a symlink in the read-only
    /// system; making it again made bwrap fail every launch ("Can't make symlink at
    /// /usr/local/bin/claude: File exists"). The package is still bound (the same files).
    #[test]
    fn a_global_npm_install_in_the_system_gets_no_second_link() {
        let pkg = "/usr/local/lib/node_modules/@anthropic-ai/claude-code";
        let c = install(
            "/usr/local/bin/claude",
            &format!("{pkg}/bin/claude.exe"),
            pkg,
        );
        for (links, binds) in links_and_binds(&c) {
            assert!(links.is_empty(), "{links:?}");
            assert_eq!(binds, [PathBuf::from(pkg)]);
        }
        // Under a system symlink (`/bin` -> `usr/bin`) the same.
        let c = install("/bin/claude", &format!("{pkg}/bin/claude.exe"), pkg);
        for (links, _) in links_and_binds(&c) {
            assert!(links.is_empty(), "{links:?}");
        }
    }

    /// A project-local install (`npm install` in the project, PATH through its
    /// `node_modules/.bin`): the link is the project's own, seen inside; the package is
    /// bound read-only over the project's.
    #[test]
    fn a_project_local_install_gets_no_second_link() {
        let pkg = "/p/node_modules/@anthropic-ai/claude-code";
        let c = install(
            "/p/node_modules/.bin/claude",
            &format!("{pkg}/bin/claude.exe"),
            pkg,
        );
        for (links, binds) in links_and_binds(&c) {
            assert!(links.is_empty(), "{links:?}");
            assert_eq!(binds, [PathBuf::from(pkg)]);
        }
    }

    /// Control, and the layouts in the home: a user prefix, nvm, the native installer's
    /// `~/.local/bin`, a Nix profile (its target in the system's `/nix/store`) each get
    /// the link, since the home inside is empty.
    #[test]
    fn a_name_in_the_home_or_outside_the_system_is_linked() {
        for (on_path, real, bind) in [
            (
                "/h/.npm-global/bin/claude",
                "/h/.npm-global/lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe",
                "/h/.npm-global/lib/node_modules/@anthropic-ai/claude-code",
            ),
            (
                "/h/.local/bin/claude",
                "/h/.local/share/claude/versions/2.1.197",
                "/h/.local/share/claude/versions/2.1.197",
            ),
            (
                "/h/.nix-profile/bin/claude",
                "/nix/store/0000-claude-code-2.1.197/bin/claude",
                "/nix/store/0000-claude-code-2.1.197/bin/claude",
            ),
            (
                "/home/linuxbrew/.linuxbrew/bin/claude",
                "/home/linuxbrew/.linuxbrew/lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe",
                "/home/linuxbrew/.linuxbrew/lib/node_modules/@anthropic-ai/claude-code",
            ),
        ] {
            for (links, binds) in links_and_binds(&install(on_path, real, bind)) {
                assert_eq!(links, [PathBuf::from(on_path)], "{on_path}");
                assert_eq!(binds, [PathBuf::from(bind)], "{on_path}");
            }
        }
    }

    /// Codex's launcher is `#!/usr/bin/env node`: nvm's node (a file in the home) and
    /// Homebrew's (a link into its Cellar) are made inside, once even when claude's
    /// launcher names the same; the system's node is seen inside already.
    #[test]
    fn a_launchers_interpreter_outside_the_system_is_bound() {
        let nvm = "/h/.nvm/versions/node/v20.20.2";
        let brew = "/home/linuxbrew/.linuxbrew";
        for (node, node_real, want) in [
            (
                format!("{nvm}/bin/node"),
                format!("{nvm}/bin/node"),
                vec![(MountKind::Ro, format!("{nvm}/bin/node"))],
            ),
            (
                format!("{brew}/bin/node"),
                format!("{brew}/Cellar/node/20.20.2/bin/node"),
                vec![
                    (
                        MountKind::Ro,
                        format!("{brew}/Cellar/node/20.20.2/bin/node"),
                    ),
                    (MountKind::Symlink, format!("{brew}/bin/node")),
                ],
            ),
            ("/usr/bin/node".into(), "/usr/bin/node".into(), vec![]),
        ] {
            let mut c = install(
                &format!("{nvm}/bin/codex"),
                &format!("{nvm}/lib/node_modules/@openai/codex/bin/codex.js"),
                &format!("{nvm}/lib/node_modules/@openai"),
            );
            c.interpreter = Some(crate::policy::facts::Interpreter {
                on_path: node.into(),
                real: node_real.into(),
            });
            let inp = Inputs {
                agent: AgentId::Codex,
                claude: Some(c.clone()),
                codex: Some(c),
                host: system(),
                ..test_inputs()
            };
            let plan = build(&inp);
            let got: Vec<_> = plan
                .mounts
                .iter()
                .filter(|m| m.why.contains("interpreter"))
                .map(|m| (m.kind.clone(), m.target.to_string_lossy().into_owned()))
                .collect();
            assert_eq!(got, want);
        }
    }
}
