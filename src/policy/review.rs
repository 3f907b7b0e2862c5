//! The exit review's rules as data: which files a sandbox may have created or changed in
//! the project that a host tool then runs without asking, so that claudebox moves them
//! aside when the sandbox ends (`state::review` walks and moves; this is pure).
//!
//! A rule matches a name found anywhere in the work tree (below its top-level `.claude`,
//! a scratch directory, and its `.git`); names shared with `protected::WORK_TREE_ENTRIES`
//! take that table's reason. The project's git dirs have their own rules, behind one
//! function ([`git_dir_rule`]) that another table of git's code-bearing files can replace.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::protected::{CLAUDE_DIR, WORK_TREE_ENTRIES};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The user's next ordinary command (`git status`) runs the agent's code.
    Critical,
    /// A host tool started in that directory runs it without asking.
    High,
}

impl Severity {
    pub fn label(self) -> &'static str {
        match self {
            Severity::Critical => "CRITICAL",
            Severity::High => "HIGH",
        }
    }
}

/// How a rule picks names in the work tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// This exact name, in any directory.
    Name(&'static str),
    /// A name with this prefix and one of these endings (lefthook's file family).
    Family(&'static str, &'static [&'static str]),
    /// This name inside a `.claude` directory below the top level.
    InClaudeDir(&'static str),
    /// A `.git` (directory or gitlink file) below the top level: a nested repository.
    NestedGit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub pattern: Pattern,
    pub severity: Severity,
    pub reason: &'static str,
}

const LEFTHOOK_ENDINGS: &[&str] = &[".yml", ".yaml", ".toml", ".json"];

/// The work tree's rules, in addition to `WORK_TREE_ENTRIES` (all of which apply at any
/// depth: a host tool started in a subdirectory reads them there too).
pub const WORK_TREE_RULES: &[Rule] = &[
    Rule {
        pattern: Pattern::InClaudeDir("settings.json"),
        severity: Severity::High,
        reason:
            "a host claude started in this directory runs its hooks, status line and MCP servers",
    },
    Rule {
        pattern: Pattern::InClaudeDir("settings.local.json"),
        severity: Severity::High,
        reason:
            "a host claude started in this directory runs its hooks, status line and MCP servers",
    },
    Rule {
        pattern: Pattern::Family("lefthook", LEFTHOOK_ENDINGS),
        severity: Severity::High,
        reason: "lefthook: the hooks it installs run the commands listed here",
    },
    Rule {
        pattern: Pattern::Family(".lefthook", LEFTHOOK_ENDINGS),
        severity: Severity::High,
        reason: "lefthook: the hooks it installs run the commands listed here",
    },
    Rule {
        pattern: Pattern::Name(".mise.toml"),
        severity: Severity::High,
        reason: "mise runs its tasks and env hooks when a shell enters the directory",
    },
    Rule {
        pattern: Pattern::Name("mise.toml"),
        severity: Severity::High,
        reason: "mise runs its tasks and env hooks when a shell enters the directory",
    },
    Rule {
        pattern: Pattern::Name(".mise"),
        severity: Severity::High,
        reason: "mise reads its config and tasks from it",
    },
    Rule {
        pattern: Pattern::Name(".tool-versions"),
        severity: Severity::High,
        reason: "mise and asdf install and run the tools it names",
    },
    Rule {
        pattern: Pattern::NestedGit,
        severity: Severity::High,
        reason: "a nested repository (or gitlink): git runs its config's core.fsmonitor and its \
                 hooks, also from a git status at the project's top",
    },
];

/// The rule a name found in the work tree matches. `depth` is 0 at the work tree's top;
/// `in_claude_dir`: the name is inside a `.claude` directory. The top-level `.claude` and
/// `.git` are not walked (the caller skips them), so nothing here sees them.
pub fn work_tree_rule(name: &OsStr, depth: usize, in_claude_dir: bool) -> Option<Rule> {
    let b = name.as_bytes();
    for r in WORK_TREE_RULES {
        let hit = match r.pattern {
            Pattern::Name(n) => b == n.as_bytes(),
            Pattern::Family(p, ends) => {
                b.starts_with(p.as_bytes()) && ends.iter().any(|e| b.ends_with(e.as_bytes()))
            }
            Pattern::InClaudeDir(n) => in_claude_dir && b == n.as_bytes(),
            Pattern::NestedGit => depth > 0 && b == b".git",
        };
        if hit {
            return Some(*r);
        }
    }
    // The launch's table: any name of it, at any depth (`.gitmodules` only matters at
    // the top, where it is protected when it exists, and is no code: not reviewed).
    WORK_TREE_ENTRIES
        .iter()
        .find(|(n, _)| b == n.as_bytes() && *n != ".gitmodules")
        .map(|(n, why)| Rule {
            pattern: Pattern::Name(n),
            severity: Severity::High,
            reason: why,
        })
}

/// Whether a directory name is a `.claude` directory (its settings files have rules).
pub fn is_claude_dir(name: &OsStr) -> bool {
    name.as_bytes() == CLAUDE_DIR.as_bytes()
}

/// What a file found in one of the project's git dirs after the session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitRow {
    /// Reported when it was created or changed during the session.
    Changed(Severity, &'static str),
    /// `worktrees/<id>`: reported when created or changed during the session and its
    /// `commondir` does not lead back to this common dir.
    Worktree(&'static str),
}

/// The rule of a path relative to a git dir (`main`: the project's common dir, where
/// `worktrees/` and `modules/` live). `None`: not code-bearing, or not looked at here.
/// The one function the exit review asks about git dirs.
pub fn git_dir_rule(rel: &[&OsStr], main: bool) -> Option<GitRow> {
    let names: Vec<&[u8]> = rel.iter().map(|n| n.as_bytes()).collect();
    match names.as_slice() {
        [b"commondir"] if main => Some(GitRow::Changed(
            Severity::Critical,
            "a commondir in the main git dir moves its config and hooks to a directory of \
             the agent's choice: the next host git status runs its core.fsmonitor",
        )),
        [b"commondir"] => Some(GitRow::Changed(
            Severity::High,
            "commondir moves this git dir's config and hooks elsewhere",
        )),
        [b"config.worktree"] => Some(GitRow::Changed(
            Severity::High,
            "config.worktree is read by git (extensions.worktreeConfig): core.fsmonitor, hooksPath",
        )),
        [b"worktrees", _] if main => Some(GitRow::Worktree(
            "a linked worktree's git dir whose commondir leads elsewhere: git in that \
             worktree reads another config and hooks",
        )),
        [b"worktrees", _, b"config.worktree"] if main => Some(GitRow::Changed(
            Severity::High,
            "a linked worktree's config.worktree: git there reads core.fsmonitor, hooksPath",
        )),
        [b"modules", .., b"config"] if main && names.len() >= 3 => Some(GitRow::Changed(
            Severity::High,
            "a submodule's config: git status at the top runs its core.fsmonitor",
        )),
        [b"modules", .., b"hooks"] if main && names.len() >= 3 => Some(GitRow::Changed(
            Severity::High,
            "a submodule's hooks: git in the submodule runs them",
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(n: &str, depth: usize, claude: bool) -> Option<Severity> {
        work_tree_rule(OsStr::new(n), depth, claude).map(|r| r.severity)
    }

    #[test]
    fn names_at_any_depth_and_only_the_listed_ones() {
        for n in [
            ".envrc",
            ".mcp.json",
            ".husky",
            ".vscode",
            ".devcontainer",
            ".devcontainer.json",
            "lefthook-local.yml",
            "lefthook.toml",
            ".lefthook.json",
            ".lefthook",
            ".pre-commit-config.yaml",
            ".mise.toml",
            "mise.toml",
            ".mise",
            ".tool-versions",
        ] {
            assert_eq!(rule(n, 0, false), Some(Severity::High), "{n}");
            assert_eq!(rule(n, 7, false), Some(Severity::High), "{n}");
        }
        // Controls: ordinary names, and the settings files outside a .claude directory.
        for n in [
            "main.rs",
            "settings.json",
            "lefthook.md",
            ".gitmodules",
            "README",
        ] {
            assert_eq!(rule(n, 3, false), None, "{n}");
        }
        assert_eq!(rule("settings.json", 2, true), Some(Severity::High));
        assert_eq!(rule("settings.local.json", 2, true), Some(Severity::High));
        assert_eq!(rule("commands", 2, true), None);
        // A nested .git, not the top one.
        assert_eq!(rule(".git", 1, false), Some(Severity::High));
        assert_eq!(rule(".git", 0, false), None);
    }

    #[test]
    fn reasons_come_from_the_launch_table_where_names_match() {
        let r = work_tree_rule(OsStr::new(".envrc"), 3, false).unwrap();
        assert_eq!(r.reason, "direnv runs it on the host");
    }

    #[test]
    fn git_dir_rows() {
        fn p(s: &str) -> Vec<&OsStr> {
            s.split('/').map(OsStr::new).collect()
        }
        assert!(matches!(
            git_dir_rule(&p("commondir"), true),
            Some(GitRow::Changed(Severity::Critical, _))
        ));
        assert!(matches!(
            git_dir_rule(&p("worktrees/w1"), true),
            Some(GitRow::Worktree(_))
        ));
        assert!(git_dir_rule(&p("modules/a/config"), true).is_some());
        assert!(git_dir_rule(&p("modules/a/modules/b/hooks"), true).is_some());
        assert!(git_dir_rule(&p("config.worktree"), false).is_some());
        for n in [
            "HEAD",
            "index",
            "objects/ab",
            "refs/heads/main",
            "worktrees/w1/HEAD",
        ] {
            assert_eq!(git_dir_rule(&p(n), true), None, "{n}");
        }
    }
}
