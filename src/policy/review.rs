//! The exit review's rules as data: which files a sandbox may have created or changed in
//! the project that a host tool then runs without asking, so that claudebox moves them
//! aside when the sandbox ends (`state::review` walks and moves; this is pure).
//!
//! A rule matches a name found anywhere in the work tree (below its top-level `.claude`,
//! a scratch directory, and its `.git`); names shared with `protected::WORK_TREE_ENTRIES`
//! take that table's reason. A nested repository's `.git`, and the project's git dirs,
//! are judged by their content through [`git_dir_judgement`], which asks
//! `policy::git_dir` (`GIT_DIR_FILES`, what git reads, and `git_dir_finding`): the table
//! that also drives the launch's mounts.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::git_dir::{git_dir_finding, GitDirKind};
use super::mount::{Mount, MountKind};
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
    /// A name with this prefix and one of these endings (as `Family`) inside directories
    /// of these names, outermost first, the last its parent (`&["mise", "conf.d"]`:
    /// `mise/conf.d/x`): a tool's config read from a path below the directory it serves.
    Under(
        &'static [&'static str],
        &'static str,
        &'static [&'static str],
    ),
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
const TOML: &[&str] = &[".toml"];

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
    // mise's other config files by its documented names: local (`mise.local.toml`), per
    // environment (`mise.<env>.toml`), and rtx's, its former name (`.rtx.toml`).
    Rule {
        pattern: Pattern::Family("mise.", TOML),
        severity: Severity::High,
        reason: "mise reads it as config (local or per environment): its tasks and env hooks \
                 run when a shell enters the directory",
    },
    Rule {
        pattern: Pattern::Family(".mise.", TOML),
        severity: Severity::High,
        reason: "mise reads it as config (local or per environment): its tasks and env hooks \
                 run when a shell enters the directory",
    },
    Rule {
        pattern: Pattern::Family(".rtx.", TOML),
        severity: Severity::High,
        reason: "mise (formerly rtx) reads it as config: its tasks and env hooks run when a \
                 shell enters the directory",
    },
    // mise's path-shaped configs (its docs' list and `LOCAL_CONFIG_FILENAMES`): a
    // directory's `mise/config.toml` and `.config/mise/config.toml`, their local and per
    // environment forms, and `.config/mise/conf.d/*.toml`. `.config/mise.toml`,
    // `.config/mise/mise.toml` and `.mise/config.toml` are the name rows' above.
    Rule {
        pattern: Pattern::Under(&["mise"], "config.", TOML),
        severity: Severity::High,
        reason: "mise reads a mise/ or .config/mise/ directory's config.toml (or its local \
                 or per environment form) as the config of the directory above: its tasks \
                 and env hooks run when a shell enters it",
    },
    Rule {
        pattern: Pattern::Under(&[".config", "mise", "conf.d"], "", TOML),
        severity: Severity::High,
        reason: "mise reads each .toml in .config/mise/conf.d as config of the directory \
                 above .config: its tasks and env hooks run when a shell enters it",
    },
    Rule {
        pattern: Pattern::Name(".tool-versions"),
        severity: Severity::High,
        reason: "mise and asdf install and run the tools it names",
    },
    // rustup (measured, rustup 1.29): a `rust-toolchain.toml`, or a legacy
    // `rust-toolchain` (TOML or one line), in the directory or any above it picks the
    // toolchain of every `cargo`/`rustc` run there; `[toolchain] path = "/abs/dir"` (or a
    // one-line absolute path) makes the proxies run `<dir>/bin/cargo`: `cargo --version`
    // from a subdirectory ran the agent's script. (A relative path is refused by rustup; a
    // `channel` only installs Rust's own. The review does not read the file: any new one
    // is moved aside, `--restore` puts a wanted one back.)
    Rule {
        pattern: Pattern::Name("rust-toolchain.toml"),
        severity: Severity::High,
        reason: RUST_TOOLCHAIN_WHY,
    },
    Rule {
        pattern: Pattern::Name("rust-toolchain"),
        severity: Severity::High,
        reason: RUST_TOOLCHAIN_WHY,
    },
    // vim and neovim with `set exrc` (measured, Debian 12's vim 9.0 and neovim 0.7.2,
    // each started in the directory): vim sourced `.vimrc`, `_vimrc` and `.exrc`; neovim
    // `.nvimrc` and `.exrc`. `.nvim.lua` is neovim 0.9's first name (its docs; it asks
    // before running a file it has not been told to trust; not packaged here). Near
    // misses measured: `_exrc`, `.gvimrc` (vim without a GUI), `.nvim.lua` in 0.7.2.
    Rule {
        pattern: Pattern::Name(".exrc"),
        severity: Severity::High,
        reason: EXRC_WHY,
    },
    Rule {
        pattern: Pattern::Name(".vimrc"),
        severity: Severity::High,
        reason: EXRC_WHY,
    },
    Rule {
        pattern: Pattern::Name("_vimrc"),
        severity: Severity::High,
        reason: EXRC_WHY,
    },
    Rule {
        pattern: Pattern::Name(".nvimrc"),
        severity: Severity::High,
        reason: EXRC_WHY,
    },
    Rule {
        pattern: Pattern::Name(".nvim.lua"),
        severity: Severity::High,
        reason: EXRC_WHY,
    },
    Rule {
        pattern: Pattern::NestedGit,
        severity: Severity::High,
        reason: "a nested repository (or gitlink): judged by what git reads in its git dir \
                 (policy::git_dir), moved aside only when that bears code",
    },
];

const RUST_TOOLCHAIN_WHY: &str = "rustup: the toolchain it names with `path` runs for \
    every cargo and rustc in this directory and below (prompts and editors run cargo \
    --version on cd and open)";

const EXRC_WHY: &str = "vim or neovim with 'exrc' set (a common vimrc line) runs it when \
    started in this directory";

/// Why a nested `.git` file (a gitlink) made in the session that names a git dir outside
/// the project is moved aside: git in that directory works on the other repository (its
/// config, hooks and objects; a commit or checkout there writes another project), which
/// the review does not judge and the sandbox may have reached (an rw path).
pub const GITLINK_OUTSIDE_WHY: &str = "a .git file naming a git dir outside the project: \
    git in this directory works on that other repository, with its config and hooks";

/// How many directories above a name [`work_tree_rule`] looks at (the longest
/// [`Pattern::Under`] chain): the walk hands it that many names.
pub const DIRS_LOOKED_AT: usize = 3;

/// The rule a name found in the work tree matches. `depth` is 0 at the work tree's top;
/// `dirs`: the names of the directories it is in below the top, innermost first (at most
/// [`DIRS_LOOKED_AT`] needed). The top-level `.claude` and `.git` are not walked (the
/// caller skips them), so nothing here sees them.
pub fn work_tree_rule(name: &OsStr, depth: usize, dirs: &[&OsStr]) -> Option<Rule> {
    let b = name.as_bytes();
    let family = |p: &str, ends: &[&str]| {
        b.starts_with(p.as_bytes()) && ends.iter().any(|e| b.ends_with(e.as_bytes()))
    };
    for r in WORK_TREE_RULES {
        let hit = match r.pattern {
            Pattern::Name(n) => b == n.as_bytes(),
            Pattern::Family(p, ends) => family(p, ends),
            Pattern::InClaudeDir(n) => {
                dirs.first().is_some_and(|d| is_claude_dir(d)) && b == n.as_bytes()
            }
            Pattern::Under(chain, p, ends) => {
                chain.len() <= dirs.len()
                    && chain
                        .iter()
                        .rev()
                        .zip(dirs)
                        .all(|(c, d)| c.as_bytes() == d.as_bytes())
                    && family(p, ends)
            }
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

/// A `.claude` below the top that is no directory (a symlink): a host `claude` started in
/// that directory follows it to the settings it names (measured with 2.1.330: a
/// SessionStart hook in the target's `settings.json` ran), which the review's walk, never
/// following a symlink, does not see as a `.claude` directory's.
pub const CLAUDE_DIR_NOT_A_DIRECTORY: Rule = Rule {
    pattern: Pattern::Name(CLAUDE_DIR),
    severity: Severity::High,
    reason: "a .claude that is no directory (a symlink): a host claude started in this \
             directory follows it and runs the hooks, status line and MCP servers of the \
             settings it leads to",
};

/// Whether a directory of the work tree is shaped as a bare repository to git's discovery
/// (`is_git_directory` in git's setup.c): a `HEAD`, and `objects/` and `refs/`, or a
/// `commondir` naming where those are. `has` says whether the directory holds a name.
/// git run in such a directory, or below it with no `.git` between, uses it as its git
/// dir and reads its `config`; at the project's top too, once the main `.git` is no valid
/// git dir (policy::git_dir's row).
pub fn bare_repo_shaped(has: impl Fn(&str) -> bool) -> bool {
    has("HEAD") && (has("commondir") || (has("objects") && has("refs")))
}

/// The line for a file judged in a directory shaped as a bare repository.
pub fn bare_repo_reason(finding: &str) -> String {
    format!(
        "a directory shaped as a bare repository (HEAD, objects/, refs/: git run in it, or at \
         the top once .git is not valid, uses it as its git dir): {finding}"
    )
}

/// The line for a directory the review could not list even after giving its owner the
/// rights to (another user's, an immutable one) while this user can reach what lies
/// below it by name, as the sandbox could: moved aside whole, not kept unlooked-at.
pub fn unlisted_reason() -> String {
    "a directory the review cannot list (its owner's rights could not be given to it), \
     while what lies below it can be reached by name: not looked into, so not kept"
        .into()
}

/// The line for a directory below a git dir's `modules/` deeper than the review looks.
pub fn too_deep_reason(depth: usize) -> String {
    format!(
        "deeper than {depth} directories below modules/, where the review does not judge \
         submodules' git dirs (a .git file can name one there)"
    )
}

/// How many directories deep below the work tree's top the exit review walks. The walk
/// holds a descriptor per level (and `changed` one per level below a match), so a tree
/// the agent made deeper than the open-file limit (1,024 by default) would leave the
/// review unable to look, or to move anything aside; paths of real projects stay far
/// shallower (PATH_MAX, 4,096 bytes, is about 2,000 levels of one-letter names).
pub const MAX_WALK_DEPTH: usize = 256;

/// The line for a directory deeper than the walk goes ([`MAX_WALK_DEPTH`], or past the
/// open-file limit) in which something changed during the session.
pub fn too_deep_to_walk_reason() -> String {
    format!(
        "a directory tree deeper than the review walks ({MAX_WALK_DEPTH} levels, or the \
         open-file limit) that changed in the session: not looked into, so not kept"
    )
}

/// Why a symlink made in the session that leads into claudebox's state is moved aside:
/// the sandbox writes there too (the login directory is even mounted at its own path), so
/// a host tool in the directory the link stands for (git's discovery from the real path,
/// direnv, a host claude) would read files the review never walks.
pub const INTO_STATE_WHY: &str = "a symlink into claudebox's state, which the sandbox \
    writes and the review does not walk: git, direnv or claude started through it would \
    read the agent's files there";

/// Why a symlink made in the session that leads into a directory the launch bound
/// read-write outside the project (a `--rw` path, a linked worktree's git dir) is moved
/// aside: as with claudebox's state, the sandbox writes there and the review does not
/// walk it.
pub const INTO_WRITABLE_WHY: &str = "a symlink into a directory the sandbox could write \
    outside the project (an rw path), which the review does not walk: git, direnv or \
    claude started through it would read the agent's files there";

/// Why a symlink made in the session that leads into a `.git` directory of the work tree
/// is moved aside: the sandbox writes there, and the review judges only the files git
/// reads in a git dir, so a directory the agent shaped as a bare repository inside it
/// (`.git/x` with `HEAD`, `objects/`, `refs/` and a config with a `core.fsmonitor`) is
/// not looked at; git started through the link takes it for its git dir (measured with
/// git 2.47: the host's `git status` in `docs -> .git/x` ran the fsmonitor).
pub const INTO_GIT_DIR_WHY: &str = "a symlink into a .git directory, which the sandbox \
    writes and the review judges only for git's own files: git, direnv or claude started \
    through it would read the agent's files there";

/// Where a symlink made in the session may lead for a [`LINK_RULES`] row to take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkInto {
    /// claudebox's state home (the login directory, each project's claude-config and
    /// conversations).
    StateHome,
    /// A directory the launch bound read-write outside the work tree
    /// ([`writable_outside`]).
    WritableOutside,
    /// A directory named `.git` below the work tree's top (the project's git dir, a
    /// nested repository's): the walk skips it, the git dirs' review judges only the
    /// files git reads there.
    GitDirInTree,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkRule {
    pub into: LinkInto,
    pub severity: Severity,
    pub reason: &'static str,
}

/// The symlinks the review moves aside by where they lead (through any chain, the walk
/// opening the target as a path only). A symlink leading into the work tree is taken
/// only into a `.git` directory there: the walk looks at the rest itself. Where
/// directories nest, the nearest one above the target decides (the work tree inside a
/// `--rw` directory keeps its own links); a link into another repository's `.git`
/// elsewhere (not written from inside) stays.
pub const LINK_RULES: &[LinkRule] = &[
    LinkRule {
        into: LinkInto::StateHome,
        severity: Severity::High,
        reason: INTO_STATE_WHY,
    },
    LinkRule {
        into: LinkInto::WritableOutside,
        severity: Severity::High,
        reason: INTO_WRITABLE_WHY,
    },
    LinkRule {
        into: LinkInto::GitDirInTree,
        severity: Severity::High,
        reason: INTO_GIT_DIR_WHY,
    },
];

/// The directories a launch lets the sandbox write outside its work tree, as the plan
/// binds them ([`writable_outside`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Writable {
    /// The host sources of its read-write directory binds (`--rw`, a linked worktree's or
    /// submodule's git dirs outside the work tree, claudebox's state), less the work tree
    /// and what lies in it (walked by the review).
    pub dirs: Vec<PathBuf>,
    /// The host directories below one of `dirs` that a later mount covers inside (a
    /// `--ro` or `--hide` within a `--rw`): not written through it, so a link there stays
    /// unless it is one of `dirs` itself.
    pub covered: Vec<PathBuf>,
}

/// [`Writable`] from the plan's mounts, in bwrap's order (later wins). File binds are left
/// out: a host tool finds a file by its name, which the work tree's rules judge; and so
/// are symlinks the plan makes.
pub fn writable_outside(mounts: &[Mount], work_tree: &Path) -> Writable {
    let mut w = Writable::default();
    for (i, m) in mounts.iter().enumerate() {
        let Some(src) = m.source.as_deref().filter(|_| m.kind == MountKind::Rw) else {
            continue;
        };
        if src.starts_with(work_tree) {
            continue;
        }
        if !w.dirs.iter().any(|d| d == src) {
            w.dirs.push(src.to_path_buf());
        }
        for later in &mounts[i + 1..] {
            if later.kind == MountKind::Symlink {
                continue;
            }
            if let Ok(rel) = later.target.strip_prefix(&m.target) {
                let c = src.join(rel);
                if !rel.as_os_str().is_empty() && !w.covered.contains(&c) {
                    w.covered.push(c);
                }
            }
        }
    }
    let dirs = w.dirs.clone();
    w.covered.retain(|c| !dirs.contains(c));
    w
}

/// Whether a directory name is a `.claude` directory (its settings files have rules).
pub fn is_claude_dir(name: &OsStr) -> bool {
    name.as_bytes() == CLAUDE_DIR.as_bytes()
}

/// The exit review's judgement of a file found changed in a git dir after the session:
/// [`git_dir_finding`]'s, from the one table of what git reads ([`super::git_dir`]), as
/// High; except what the user's next plain `git status` runs, Critical by
/// [`Severity::Critical`]'s definition: the main git dir's `commondir`, whatever it holds
/// (git reads one there, measured; even `.`, which git treats as absent, changes what
/// `git rev-parse --git-common-dir` prints, so any new one is moved aside), and a config
/// with a `core.fsmonitor` ([`super::git_dir::runs_on_status`]): git status runs it in
/// its repository, and at the project's top enters a nested repository staged as a
/// gitlink, or a submodule, and runs it there (a nested repository not staged yet is
/// staged by any `git add -A`; the review does not read the index to tell). `rel` is
/// relative to the git dir of `kind`; `content` the file's bytes (empty for a hook).
pub fn git_dir_judgement(
    kind: GitDirKind,
    rel: &str,
    content: &[u8],
) -> Option<(Severity, String)> {
    if kind == GitDirKind::Common && rel == "commondir" {
        let why = git_dir_finding(kind, rel, content).unwrap_or_else(|| {
            "commondir: \".\" in the main git dir changes what `git rev-parse \
             --git-common-dir` prints"
                .into()
        });
        return Some((
            Severity::Critical,
            format!("{why}: the next host git status runs that directory's core.fsmonitor"),
        ));
    }
    let finding = git_dir_finding(kind, rel, content)?;
    if let Some(why) = super::git_dir::runs_on_status(kind, rel, content) {
        return Some((Severity::Critical, why));
    }
    Some((Severity::High, finding))
}

/// Why a file the review must judge was moved aside unread: git would read it, the
/// review cannot (`what`: a symlink git follows, not a regular file, too large), and
/// what cannot be judged is not kept.
pub fn unjudged(rel: &str, what: &str) -> String {
    format!("{rel}: {what}, so it was not judged")
}

/// A nested repository's finding, as its line says it (`finding` from
/// [`git_dir_judgement`] of its `.git`, or of the git dir its gitlink file names).
pub fn nested_reason(finding: &str) -> String {
    format!(
        "a nested repository (git status at the project's top enters it once staged as a \
         gitlink): {finding}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(n: &str, depth: usize, claude: bool) -> Option<Severity> {
        let dirs: &[&OsStr] = if claude {
            &[OsStr::new(".claude")]
        } else {
            &[]
        };
        work_tree_rule(OsStr::new(n), depth, dirs).map(|r| r.severity)
    }

    /// The rule for a path relative to the work tree's top, its directories handed over
    /// as the walk does (innermost first, at most `DIRS_LOOKED_AT`).
    fn at(path: &str) -> Option<Rule> {
        let mut parts: Vec<&OsStr> = path.split('/').map(OsStr::new).collect();
        let name = parts.pop().unwrap();
        let depth = parts.len();
        let dirs: Vec<&OsStr> = parts.into_iter().rev().take(DIRS_LOOKED_AT).collect();
        work_tree_rule(name, depth, &dirs)
    }

    #[test]
    fn mise_configs_by_path() {
        // mise's documented and loaded paths (LOCAL_CONFIG_FILENAMES and the per
        // environment patterns), at the top and below.
        for p in [
            "mise/config.toml",
            "sub/mise/config.toml",
            "mise/config.local.toml",
            "mise/config.production.toml",
            "mise/config.production.local.toml",
            ".config/mise/config.toml",
            "a/b/.config/mise/config.toml",
            ".config/mise/config.local.toml",
            ".config/mise/config.staging.toml",
            ".config/mise/conf.d/tools.toml",
            "sub/.config/mise/conf.d/00-env.toml",
            ".config/mise/conf.d/tools.production.local.toml",
            // By the name rows: `.config/mise.toml` and its forms, `.config/mise/mise.toml`.
            ".config/mise.toml",
            "sub/.config/mise.local.toml",
            ".config/mise.dev.toml",
            ".config/mise/mise.toml",
            ".config/mise/mise.local.toml",
            // `.mise/config.toml`: the `.mise` directory is the name row's, whole.
            ".mise",
        ] {
            assert_eq!(at(p).map(|r| r.severity), Some(Severity::High), "{p}");
        }
        // Near misses: the same names elsewhere, other names there, a deeper conf.d.
        for p in [
            "config.toml",
            "sub/config.toml",
            ".config/config.toml",
            "mise-x/config.toml",
            "notmise/config.toml",
            "mise/sub/config.toml",
            "mise/settings.toml",
            "mise/config.json",
            "mise/config.toml.bak",
            "mise/tasks/build.toml",
            "conf.d/x.toml",
            "sub/conf.d/x.toml",
            "mise/conf.d/x.toml",
            "other/mise/conf.d/x.toml",
            ".config/conf.d/x.toml",
            ".config/other/conf.d/x.toml",
            ".config/mise/conf.d/x.yaml",
            ".config/mise/conf.d/nested/x.toml",
            ".config/fish/conf.d/mise.fish",
        ] {
            assert_eq!(at(p), None, "{p}");
        }
        // The walk hands over enough directories for the longest chain.
        for r in WORK_TREE_RULES {
            if let Pattern::Under(chain, ..) = r.pattern {
                assert!(chain.len() <= DIRS_LOOKED_AT, "{r:?}");
            }
        }
    }

    /// The host-run rows measured with the real tools (rustup 1.29, vim 9.0, neovim
    /// 0.7.2): their names at any depth; the near misses (measured not to run, or other
    /// names) are not taken.
    #[test]
    fn toolchain_and_exrc_rows_with_near_misses() {
        for p in [
            "rust-toolchain.toml",
            "rust-toolchain",
            "crates/x/rust-toolchain.toml",
            "sub/rust-toolchain",
            ".exrc",
            ".vimrc",
            "_vimrc",
            ".nvimrc",
            ".nvim.lua",
            "sub/deeper/.exrc",
            "sub/.nvimrc",
        ] {
            let r = at(p).unwrap_or_else(|| panic!("{p}"));
            assert_eq!(r.severity, Severity::High, "{p}");
        }
        assert_eq!(
            at("rust-toolchain.toml").unwrap().reason,
            RUST_TOOLCHAIN_WHY
        );
        assert_eq!(at("sub/.vimrc").unwrap().reason, EXRC_WHY);
        for p in [
            "rust-toolchain.toml.bak",
            "rust-toolchain.txt",
            "my-rust-toolchain",
            "rust-toolchain.yaml",
            "_exrc",
            ".gvimrc",
            "vimrc",
            ".vimrc.local",
            "nvim.lua",
            ".nvim.vim",
            "init.lua",
            "sub/.exrc.swp",
        ] {
            assert_eq!(at(p), None, "{p}");
        }
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
            "mise.local.toml",
            ".mise.local.toml",
            "mise.production.toml",
            ".rtx.toml",
            ".rtx.local.toml",
        ] {
            assert_eq!(rule(n, 0, false), Some(Severity::High), "{n}");
            assert_eq!(rule(n, 7, false), Some(Severity::High), "{n}");
        }
        // Controls: ordinary names, and the settings files outside a .claude directory.
        for n in [
            "main.rs",
            "settings.json",
            "lefthook.md",
            "mise.md",
            "promise.toml",
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
    fn writable_outside_is_the_rw_binds_not_in_the_work_tree() {
        use super::super::mount::{Mount, MountKind::*};
        let wt = Path::new("/h/proj");
        let m = |kind, src: &str, target: &str| {
            Mount::new(kind, Some(Path::new(src)), Path::new(target), "")
        };
        let mounts = [
            m(Rw, "/h/proj", "/h/proj"),
            m(Rw, "/h/proj/.git", "/h/proj/.git"),
            m(Rw, "/h/proj/cache", "/h/proj/cache"),
            m(Rw, "/h/.claudebox/projects/x/claude-config", "/h/.claude"),
            m(Rw, "/data/out", "/data/out"),
            m(Rw, "/data/out", "/data/out"),
            m(Rw, "/h/projects-other", "/h/projects-other"),
            m(Ro, "/data/in", "/data/in"),
            m(File, "/data/f.txt", "/data/f.txt"),
            Mount::new(Tmpfs, None, Path::new("/tmp"), ""),
        ];
        let got = writable_outside(&mounts, wt);
        let paths = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        let want = paths(&[
            "/h/.claudebox/projects/x/claude-config",
            "/data/out",
            "/h/projects-other",
        ]);
        assert_eq!(got.dirs, want);
        // The empty-ro over ~/.claude/commands covers the claude-config's; the later
        // read-only bind inside /data/out covers its `in`, a read-write one does not.
        let mounts = [
            m(Rw, "/h/.claudebox/projects/x/claude-config", "/h/.claude"),
            Mount::new(EmptyRo, None, Path::new("/h/.claude/commands"), ""),
            m(Rw, "/data/out", "/data/out"),
            m(Ro, "/data/out/in", "/data/out/in"),
            m(Rw, "/data/out/back", "/data/out/back"),
            Mount::new(Symlink, Some(Path::new("x")), Path::new("/data/out/l"), ""),
            m(Ro, "/data/other", "/data/other"),
        ];
        let got = writable_outside(&mounts, wt);
        assert_eq!(
            got.covered,
            paths(&[
                "/h/.claudebox/projects/x/claude-config/commands",
                "/data/out/in",
            ])
        );
        assert!(got.dirs.contains(&PathBuf::from("/data/out/back")));
    }

    #[test]
    fn bare_repository_shapes() {
        let has = |names: &'static [&'static str]| move |n: &str| names.contains(&n);
        assert!(bare_repo_shaped(has(&[
            "HEAD", "objects", "refs", "config"
        ])));
        assert!(bare_repo_shaped(has(&["HEAD", "commondir"])));
        // Controls: what git's discovery does not take for a git dir.
        assert!(!bare_repo_shaped(has(&["objects", "refs", "config"])));
        assert!(!bare_repo_shaped(has(&["HEAD", "refs", "config"])));
        assert!(!bare_repo_shaped(has(&["README", "src", "config"])));
    }

    #[test]
    fn reasons_come_from_the_launch_table_where_names_match() {
        let r = work_tree_rule(OsStr::new(".envrc"), 3, &[]).unwrap();
        assert_eq!(r.reason, "direnv runs it on the host");
    }

    #[test]
    fn git_dir_judgements() {
        use GitDirKind::*;
        // Any new main commondir, even ".", is critical.
        for c in [&b"."[..], b"/tmp/x", b""] {
            assert!(matches!(
                git_dir_judgement(Common, "commondir", c),
                Some((Severity::Critical, _))
            ));
        }
        // Elsewhere the table's judgement: a benign config stays, a code key goes.
        let plain = b"[core]\n\tbare = false\n[remote \"origin\"]\n\turl = /x\n";
        assert_eq!(git_dir_judgement(Nested, "config", plain), None);
        assert_eq!(git_dir_judgement(Module, "config", plain), None);
        // What the next plain git status runs is critical (Severity::Critical's
        // definition): a core.fsmonitor in any git dir's config, even behind other keys;
        // other code keys are high.
        for kind in [Nested, Module, Common] {
            let (sev, why) =
                git_dir_judgement(kind, "config", b"[core]\n\tfsmonitor = x\n").unwrap();
            assert_eq!(sev, Severity::Critical, "{kind:?}");
            assert!(why.contains("core.fsmonitor"), "{why}");
        }
        let (sev, why) = git_dir_judgement(
            Nested,
            "config",
            b"[alias]\n\tx = !y\n[core]\nfsmonitor=z\n",
        )
        .unwrap();
        assert_eq!(sev, Severity::Critical);
        assert!(why.contains("core.fsmonitor"), "{why}");
        let (sev, _) =
            git_dir_judgement(Linked, "config.worktree", b"[core]\nfsmonitor=x").unwrap();
        assert_eq!(sev, Severity::Critical);
        // Near misses: other code keys, a fsmonitor in another section, a hook.
        for (rel, c) in [
            ("config", &b"[core]\n\tpager = x\n"[..]),
            ("config", b"[alias]\n\tfsmonitor = x\n"),
            ("config", b"[core \"x\"]\n\thookspath = y\n"),
            ("hooks/pre-commit", b""),
        ] {
            let (sev, _) = git_dir_judgement(Nested, rel, c).unwrap();
            assert_eq!(sev, Severity::High, "{rel} {c:?}");
        }
        assert!(git_dir_judgement(Common, "rebase-merge/git-rebase-todo", b"exec x\n").is_some());
        assert_eq!(
            git_dir_judgement(Module, "hooks/pre-commit.sample", b""),
            None
        );
        assert_eq!(git_dir_judgement(Linked, "commondir", b"../..\n"), None);
    }
}
