//! What git reads from a git dir, as data ([`GIT_DIR_FILES`], one row per file with what
//! git does with it, whether it can bear code, and how claudebox guards it), and the one
//! pure judgement of a file found in a git dir after a session ([`git_dir_finding`]):
//! whether the host's git would run code, or read config, of the agent's choosing from it.
//!
//! Derived from `strace -f -e trace=openat,newfstatat,access,readlink` of git 2.47's
//! `status`, `commit`, `fetch` (a local remote), `worktree list` and `submodule status` in
//! a repository with a linked worktree and a submodule, and from measuring each row by
//! hand (README "Threat model", /work/shared/docs/claude-code-facts.md "Git dirs").

/// The kinds of git dir claudebox mounts writable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitDirKind {
    /// The main repository's git dir, which is also the common dir of its worktrees.
    Common,
    /// A linked worktree's own git dir, `<common>/worktrees/<id>`.
    Linked,
    /// A submodule's git dir, `<common>/modules/<name>`.
    Module,
    /// The `.git` directory of a repository nested in the work tree (a vendored clone, or
    /// one made and staged as a gitlink during the session).
    Nested,
}

use GitDirKind::*;

/// How a row is kept from the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarding {
    /// A mount at the launch: read-only (or pinned) when it exists, an empty read-only
    /// one in its place when it is missing, or git ignores a missing one.
    Prevented,
    /// Read-only when it exists; what the agent creates is judged by [`git_dir_finding`]
    /// when the session ends (a mount over a missing one would break git or leave an
    /// entry git reads), and the next launch refuses a planted `commondir`.
    CaughtAfterLaunch,
    /// Nothing to keep: git runs no code from it and it names no config.
    NotCodeBearing,
}

/// One file (or directory) git reads in a git dir.
#[derive(Debug)]
pub struct GitDirFile {
    /// Relative to the git dir; `<id>`, `<name>` stand for any entry.
    pub path: &'static str,
    pub kinds: &'static [GitDirKind],
    /// What git does with it, and whether that can run code (or choose the config).
    pub git_does: &'static str,
    pub code_bearing: bool,
    pub guarding: Guarding,
    /// How claudebox guards it, and for a missing one why it cannot be prevented.
    pub how: &'static str,
}

const ALL: &[GitDirKind] = &[Common, Linked, Module, Nested];
const OWN_CONFIG: &[GitDirKind] = &[Common, Module, Nested];

/// Every file of a git dir that git reads and that can run code or pick the config, and
/// the ones looked at and found not to (so that nobody looks again).
pub const GIT_DIR_FILES: &[GitDirFile] = &[
    GitDirFile {
        path: "config",
        kinds: OWN_CONFIG,
        git_does: "every command reads it: core.fsmonitor runs on every status, hooksPath, \
                   sshCommand, pager, editor, aliases, filters, textconv, credential helpers, \
                   include paths",
        code_bearing: true,
        guarding: Guarding::Prevented,
        how: "read-only bind; an empty read-only file when missing; a nested repository's \
              made during the session is judged at exit",
    },
    GitDirFile {
        path: "hooks/",
        kinds: OWN_CONFIG,
        git_does: "commit, merge, checkout, push and even status (post-index-change, \
                   reference-transaction) run its scripts",
        code_bearing: true,
        guarding: Guarding::Prevented,
        how: "read-only bind; an empty read-only directory when missing",
    },
    GitDirFile {
        path: "config.worktree",
        kinds: ALL,
        git_does: "read like config, but only when the common config sets \
                   extensions.worktreeConfig (measured: ignored otherwise)",
        code_bearing: true,
        guarding: Guarding::Prevented,
        how: "read-only bind when it exists; an empty read-only file when the common config \
              mentions worktreeConfig; otherwise git ignores it, and the common config that \
              would turn it on is read-only",
    },
    GitDirFile {
        path: "commondir",
        kinds: &[Common, Module, Nested],
        git_does: "read in every git dir, the main one included (measured): it moves config, \
                   hooks, refs and objects to the directory it names, so the host's next git \
                   status runs that directory's core.fsmonitor",
        code_bearing: true,
        guarding: Guarding::CaughtAfterLaunch,
        how: "missing by nature, so no mount can cover it (an empty file or a directory \
              there makes every git command die, \".\" changes what `git rev-parse \
              --git-common-dir` prints): the file supervisor refuses to make one in the main \
              git dir and in the git dirs pinned at the launch (src/inside/notify.rs, Linux \
              5.19+), the launch's watch moves one in the main git dir aside at once, and \
              any is judged at exit (anything but \".\"); the next launch refuses one",
    },
    GitDirFile {
        path: "commondir",
        kinds: &[Linked],
        git_does: "names the common dir (\"../..\"), so the config and hooks git uses in that \
                   worktree",
        code_bearing: true,
        guarding: Guarding::Prevented,
        how: "read-only bind; a new worktree's is judged at exit (anything but \"../..\"), \
              and the next launch refuses one that does not resolve to the common dir",
    },
    GitDirFile {
        path: "gitdir",
        kinds: &[Linked],
        git_does: "names the worktree's .git file; `git worktree repair` on the host writes a \
                   .git file at that path (measured), `prune` drops the entry when it is gone",
        code_bearing: false,
        guarding: Guarding::Prevented,
        how: "read-only bind; a new worktree's names a work tree the agent made (claude \
              --worktree), whose config is judged through its commondir and config.worktree",
    },
    GitDirFile {
        path: "worktrees/<id>/",
        kinds: &[Common],
        git_does: "a linked worktree's git dir: git uses it when run in the work tree whose \
                   .git file names it",
        code_bearing: true,
        guarding: Guarding::CaughtAfterLaunch,
        how: "worktrees/ and each existing entry pinned; new entries are needed inside (git \
              worktree add, claude --worktree) and judged at exit as Linked",
    },
    GitDirFile {
        path: "modules/<name>/",
        kinds: &[Common, Module],
        git_does: "a submodule's git dir, reached through its work tree's .git file when the \
                   gitlink is in the index",
        code_bearing: true,
        guarding: Guarding::CaughtAfterLaunch,
        how: "modules/ and each existing entry pinned, their config and hooks read-only; a \
              new one (git submodule add) judged at exit as Module; a directory of modules/ \
              nested deeper than the review looks (MODULES_DEPTH), which a .git file can \
              name as well, is moved aside unjudged",
    },
    GitDirFile {
        path: "(the whole git dir of a repository nested in the work tree)",
        kinds: &[Nested],
        git_does: "once staged as a gitlink (git add vendorx), the host's git status at the \
                   top runs git status in it: its core.fsmonitor, post-index-change hook, \
                   core.hooksPath and include.path all ran (measured); an untracked nested \
                   repository is not entered",
        code_bearing: true,
        guarding: Guarding::CaughtAfterLaunch,
        how: "existing ones at the top level and one level below vendor/, third_party/, ... \
              pinned with config and hooks read-only; one made during the session cannot \
              be foreseen by a mount: judged at exit as Nested",
    },
    GitDirFile {
        path: "(a work-tree directory holding HEAD with objects/ and refs/, or with commondir)",
        kinds: &[Nested],
        git_does: "git's discovery takes it for a bare repository: git run in it or below it \
                   (a shell prompt's git, git status in a subdirectory) uses it as its git dir \
                   and reads its config (core.worktree gives it a work tree, whose \
                   core.fsmonitor then runs); at the project's top too once the main .git is \
                   no valid git dir (its HEAD, writable, not a ref: measured with git 2.47)",
        code_bearing: true,
        guarding: Guarding::CaughtAfterLaunch,
        how: "any directory can take that shape, so no mount foresees it: the exit review \
              judges each such directory of the work tree (its top included) as a nested \
              repository's git dir, the files changed during the session, and moves the ones \
              that bear code aside",
    },
    GitDirFile {
        path: "rebase-merge/git-rebase-todo",
        kinds: ALL,
        git_does: "`git rebase --continue` runs its exec lines; git status shows a rebase in \
                   progress, which invites it",
        code_bearing: true,
        guarding: Guarding::CaughtAfterLaunch,
        how: "a rebase inside must be able to stop and go on; judged at exit (an exec line)",
    },
    GitDirFile {
        path: "sequencer/todo",
        kinds: ALL,
        git_does: "`git cherry-pick --continue` / `revert --continue` go on with it; exec \
                   lines run",
        code_bearing: true,
        guarding: Guarding::CaughtAfterLaunch,
        how: "judged at exit (an exec line)",
    },
    GitDirFile {
        path: "info/attributes, info/exclude, info/sparse-checkout",
        kinds: OWN_CONFIG,
        git_does: "attributes pick filter and diff drivers, which only config defines (the \
                   work tree's .gitattributes can do the same); exclude and sparse-checkout \
                   pick paths",
        code_bearing: false,
        guarding: Guarding::NotCodeBearing,
        how: "nothing",
    },
    GitDirFile {
        path: "remotes/<name>, branches/<name>",
        kinds: OWN_CONFIG,
        git_does: "legacy remote definitions (a URL), read only for a remote name config does \
                   not define (measured: config's origin wins); ext:: transports are off",
        code_bearing: false,
        guarding: Guarding::NotCodeBearing,
        how: "nothing: a URL the agent could as well put in the work tree",
    },
    GitDirFile {
        path: "objects/info/alternates",
        kinds: OWN_CONFIG,
        git_does: "more object stores to read objects from",
        code_bearing: false,
        guarding: Guarding::NotCodeBearing,
        how: "nothing",
    },
    GitDirFile {
        path: "HEAD, index, packed-refs, refs/, logs/, objects/, shallow, info/grafts, \
               FETCH_HEAD, ORIG_HEAD, MERGE_HEAD, COMMIT_EDITMSG",
        kinds: ALL,
        git_does: "history and state, written by every commit and fetch; a HEAD that is no \
                   ref makes git pass the git dir over and look at the work tree's top as a \
                   bare repository (the row above judges that)",
        code_bearing: false,
        guarding: Guarding::NotCodeBearing,
        how: "nothing (writable: git works inside)",
    },
];

/// How many directories deep the exit review looks for submodules' git dirs below
/// `modules/` (a submodule's name may hold slashes); a directory below that which changed
/// during the session is moved aside unjudged: a `.git` file anywhere in the work tree
/// can name a git dir at any depth (`gitdir: ../.git/modules/a/a/.../x`).
pub const MODULES_DEPTH: usize = 64;

/// The files of a git dir of `kind` the exit review reads and hands to
/// [`git_dir_finding`], from [`GIT_DIR_FILES`]: the code-bearing rows naming one file (or
/// `hooks/`, whose entries are judged one by one) for that kind. `made_in_session`: the git
/// dir was not there at the launch (a nested repository, a submodule's or a worktree's
/// made inside), so no launch mount guarded any of it; otherwise only the rows caught
/// after the launch (what a mount there could not cover).
pub fn judged_files(kind: GitDirKind, made_in_session: bool) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in GIT_DIR_FILES {
        let concrete = !r.path.contains('<') && !r.path.starts_with('(') && !r.path.contains(',');
        let wanted = made_in_session || r.guarding == Guarding::CaughtAfterLaunch;
        if r.code_bearing && concrete && wanted && r.kinds.contains(&kind) && !out.contains(&r.path)
        {
            out.push(r.path);
        }
    }
    out
}

/// Config keys that run a command or change where config and code come from:
/// `(section, key)`, `key` `*` for the whole section; the subsection (`diff.<driver>`)
/// is not looked at.
pub const CODE_KEYS: &[(&str, &str, &str)] = &[
    ("core", "fsmonitor", "runs on every git status"),
    ("core", "hookspath", "the directory git runs hooks from"),
    (
        "core",
        "sshcommand",
        "runs for every fetch and push over ssh",
    ),
    ("core", "gitproxy", "runs for git:// fetches"),
    ("core", "pager", "runs for log and diff"),
    ("core", "editor", "runs for commit and rebase -i"),
    ("core", "askpass", "runs when git asks for a password"),
    ("core", "alternaterefscommand", "runs on fetch and push"),
    (
        "core",
        "worktree",
        "moves the work tree: checkout writes there",
    ),
    ("include", "*", "reads config from another file"),
    ("includeif", "*", "reads config from another file"),
    ("alias", "*", "`!` aliases run shell commands"),
    (
        "filter",
        "*",
        "clean and smudge commands run on add and checkout",
    ),
    ("diff", "external", "runs for git diff"),
    ("diff", "textconv", "runs for git diff and log -p"),
    ("diff", "command", "runs for git diff"),
    ("merge", "driver", "runs for git merge"),
    ("difftool", "*", "runs for git difftool"),
    ("mergetool", "*", "runs for git mergetool"),
    (
        "credential",
        "*",
        "helpers run for every authenticated fetch and push",
    ),
    ("pager", "*", "runs for the named command"),
    ("sequence", "editor", "runs for rebase -i"),
    ("interactive", "difffilter", "runs for add -p"),
    ("gpg", "*", "its program runs for signed commits and tags"),
    ("man", "*", "runs for git help"),
    ("browser", "*", "runs for git help -w"),
    ("web", "browser", "runs for git help -w"),
    ("guitool", "*", "runs from git gui"),
    ("sendemail", "*", "runs for git send-email"),
    ("imap", "tunnel", "runs for git imap-send"),
    ("trailer", "*", "commands run for commit --trailer"),
    (
        "protocol",
        "*",
        "turns on the ext:: transport, which runs commands",
    ),
    (
        "extensions",
        "*",
        "changes how the repository is read (worktreeConfig)",
    ),
    ("remote", "uploadpack", "runs for a fetch from a local path"),
    ("remote", "receivepack", "runs for a push to a local path"),
    ("remote", "vcs", "picks the transport helper that runs"),
    (
        "submodule",
        "update",
        "`!command` runs for git submodule update",
    ),
    (
        "uploadpack",
        "packobjectshook",
        "runs for fetches served from here",
    ),
    ("tar", "command", "runs for git archive"),
    ("instaweb", "*", "runs for git instaweb"),
];

/// Whether a file found in a git dir after a session would make the host's git run code,
/// or read config, of the agent's choosing; the reason when it would. `rel` is relative
/// to the git dir of `kind` (a `Common` path under `worktrees/<id>/` is judged as that
/// linked worktree's); `content` is the file's bytes (empty for a directory).
pub fn git_dir_finding(kind: GitDirKind, rel: &str, content: &[u8]) -> Option<String> {
    let rel = rel.trim_start_matches("./");
    if kind == Common {
        if let Some(rest) = rel.strip_prefix("worktrees/") {
            if let Some((_, inner)) = rest.split_once('/') {
                return git_dir_finding(Linked, inner, content);
            }
            return None;
        }
    }
    let own_config = kind != Linked;
    match rel {
        "commondir" => {
            let want: &[u8] = if kind == Linked { b"../.." } else { b"." };
            (content.trim_ascii() != want).then(|| {
                format!(
                    "commondir: git reads config and hooks from the directory it names ({})",
                    if kind == Linked {
                        "a linked worktree's is \"../..\""
                    } else {
                        "this git dir is no linked worktree's"
                    }
                )
            })
        }
        "config" if own_config => config_finding(kind, content).map(|w| format!("config: {w}")),
        "config.worktree" => config_finding(kind, content).map(|w| format!("config.worktree: {w}")),
        "rebase-merge/git-rebase-todo" | "sequencer/todo" => has_exec_line(content)
            .then(|| format!("{rel}: an exec line runs on the host's --continue")),
        _ if own_config && rel.starts_with("hooks/") => {
            let name = &rel["hooks/".len()..];
            (!name.is_empty() && !name.ends_with(".sample"))
                .then(|| format!("{rel}: git runs hooks from here"))
        }
        _ => None,
    }
}

/// What in a git dir's file the user's next plain `git status` runs, as its finding says
/// it: a config's (or `config.worktree`'s) `core.fsmonitor`, the [`CODE_KEYS`] row that
/// runs on every status. None for anything else (it runs for other commands).
pub fn runs_on_status(kind: GitDirKind, rel: &str, content: &[u8]) -> Option<String> {
    let rel = rel.trim_start_matches("./");
    let rel = match (kind, rel.strip_prefix("worktrees/")) {
        (Common, Some(rest)) => rest.split_once('/')?.1,
        _ => rel,
    };
    if !(rel == "config" || rel == "config.worktree") {
        return None;
    }
    let keys = config_keys(content)?;
    let (s, k, why) = CODE_KEYS
        .iter()
        .find(|(s, k, _)| *s == "core" && *k == "fsmonitor")?;
    keys.iter()
        .any(|(section, key)| section == s && key == k)
        .then(|| format!("{rel}: {s}.{k} {why}"))
}

/// The first code-bearing key of a config file, as `section.key: why`. A file claudebox
/// cannot read as git config counts (git might read it otherwise).
fn config_finding(kind: GitDirKind, content: &[u8]) -> Option<String> {
    let Some(keys) = config_keys(content) else {
        return Some("not readable as git config".into());
    };
    for (section, key) in keys {
        // A submodule's git dir names its work tree: git writes that.
        if kind == Module && section == "core" && key == "worktree" {
            continue;
        }
        if let Some((s, k, why)) = CODE_KEYS
            .iter()
            .find(|(s, k, _)| *s == section && (*k == "*" || *k == key))
        {
            let k = if *k == "*" { key.as_str() } else { k };
            return Some(format!("{s}.{k} {why}"));
        }
    }
    None
}

/// `(section, key)` of every variable in a git config file, both lowercase (subsections
/// dropped); None when it is not git config syntax as this reader knows it.
pub fn config_keys(text: &[u8]) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    let mut i = 0;
    let n = text.len();
    while i < n {
        let c = text[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'#' || c == b';' {
            while i < n && text[i] != b'\n' {
                i += 1;
            }
        } else if c == b'[' {
            let end = i + text[i..].iter().position(|b| *b == b']')?;
            let inner = &text[i + 1..end];
            // `[section "sub"]` or `[section.sub]`: the section is up to a space or dot.
            let name: Vec<u8> = inner
                .iter()
                .take_while(|b| **b != b' ' && **b != b'\t' && **b != b'.' && **b != b'"')
                .copied()
                .collect();
            if name.is_empty() || !name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-') {
                return None;
            }
            section = Some(String::from_utf8_lossy(&name).to_ascii_lowercase());
            i = end + 1;
        } else if c.is_ascii_alphabetic() {
            let start = i;
            while i < n && (text[i].is_ascii_alphanumeric() || text[i] == b'-') {
                i += 1;
            }
            let key = String::from_utf8_lossy(&text[start..i]).to_ascii_lowercase();
            out.push((section.clone()?, key));
            while i < n && (text[i] == b' ' || text[i] == b'\t') {
                i += 1;
            }
            if i < n && text[i] == b'=' {
                i = skip_value(text, i + 1);
            } else if i < n && !matches!(text[i], b'\n' | b'\r' | b'#' | b';') {
                return None;
            }
        } else {
            return None;
        }
    }
    Some(out)
}

/// Past a value: to the end of the line, across quotes and backslash-newlines.
fn skip_value(text: &[u8], mut i: usize) -> usize {
    let mut quoted = false;
    while i < text.len() {
        match text[i] {
            b'\\' => i += 1,
            b'"' => quoted = !quoted,
            b'\n' if !quoted => return i,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Whether a rebase or sequencer todo list has an `exec` (`x`) line.
fn has_exec_line(text: &[u8]) -> bool {
    text.split(|b| *b == b'\n').any(|l| {
        let l = l.trim_ascii_start();
        let word = l.split(|b| b.is_ascii_whitespace()).next().unwrap_or(b"");
        word == b"exec" || word == b"x"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commondir_only_as_git_writes_it() {
        assert!(git_dir_finding(Common, "commondir", b"/tmp/evil\n").is_some());
        assert!(git_dir_finding(Common, "commondir", b"").is_some());
        assert!(git_dir_finding(Nested, "commondir", b"../x").is_some());
        assert!(git_dir_finding(Module, "commondir", b"../../..").is_some());
        assert_eq!(git_dir_finding(Common, "commondir", b".\n"), None);
        assert_eq!(git_dir_finding(Linked, "commondir", b"../..\n"), None);
        assert!(git_dir_finding(Linked, "commondir", b"/tmp/evil").is_some());
        // Through the common dir's worktrees/.
        assert_eq!(
            git_dir_finding(Common, "worktrees/w1/commondir", b"../..\n"),
            None
        );
        assert!(git_dir_finding(Common, "worktrees/w1/commondir", b"../../x").is_some());
    }

    #[test]
    fn configs_with_code_keys_are_findings() {
        let plain = b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\
                      \tlogallrefupdates = true\n[remote \"origin\"]\n\turl = /x\n\
                      \tfetch = +refs/heads/*:refs/remotes/origin/*\n";
        for kind in [Common, Module, Nested] {
            assert_eq!(git_dir_finding(kind, "config", plain), None, "{kind:?}");
        }
        for (cfg, key) in [
            (&b"[core]\n\tfsmonitor = echo x\n"[..], "core.fsmonitor"),
            (b"[CORE] FSMonitor=x", "core.fsmonitor"),
            (b"[core] fsmonitor = x", "core.fsmonitor"),
            (b"[core]\n\thooksPath = /tmp/h\n", "core.hookspath"),
            (b"[include]\n\tpath = ../../evil\n", "include.path"),
            (b"[includeIf \"gitdir:/\"]\n\tpath = x\n", "includeif.path"),
            (b"[alias]\n\tst = !sh -c x\n", "alias.st"),
            (b"[filter \"lfs\"]\n\tsmudge = x\n", "filter.smudge"),
            (b"[diff \"bin\"]\n\ttextconv = x\n", "diff.textconv"),
            (b"[credential]\n\thelper = x\n", "credential.helper"),
            (
                b"[extensions]\n\tworktreeConfig = true\n",
                "extensions.worktreeconfig",
            ),
            (b"[remote \"o\"]\n\tuploadpack = x\n", "remote.uploadpack"),
            (b"[submodule \"s\"]\n\tupdate = !x\n", "submodule.update"),
            (b"[core.x]\n\tpager = x\n", "core.pager"),
            // A key hidden after a quoted value with a comment sign, and a continued line.
            (
                b"[user]\n\tname = \"a;b\" ; c\n[core]\n\teditor = \\\n x\n",
                "core.editor",
            ),
        ] {
            let f = git_dir_finding(Nested, "config", cfg).unwrap_or_default();
            assert!(f.contains(key), "{:?}: {f}", String::from_utf8_lossy(cfg));
        }
        // Not git config: counted.
        assert!(git_dir_finding(Nested, "config", b"[core\n").is_some());
        assert!(git_dir_finding(Nested, "config", b"fsmonitor = x\n").is_some());
        // A submodule's core.worktree is git's own; a nested repository has none.
        let wt = b"[core]\n\tworktree = ../../../sub\n";
        assert_eq!(git_dir_finding(Module, "config", wt), None);
        assert!(git_dir_finding(Nested, "config", wt).is_some());
        // A linked worktree's git dir has no config of its own; config.worktree is judged.
        assert_eq!(
            git_dir_finding(Linked, "config", b"[core]\nfsmonitor=x"),
            None
        );
        assert!(git_dir_finding(Linked, "config.worktree", b"[core]\nfsmonitor=x").is_some());
        assert!(git_dir_finding(
            Common,
            "worktrees/a/config.worktree",
            b"[core]\nfsmonitor=x"
        )
        .is_some());
    }

    #[test]
    fn hooks_and_todo_lists() {
        assert!(git_dir_finding(Nested, "hooks/post-index-change", b"#!/bin/sh").is_some());
        assert!(git_dir_finding(Module, "hooks/pre-commit", b"").is_some());
        assert_eq!(
            git_dir_finding(Nested, "hooks/pre-commit.sample", b"x"),
            None
        );
        assert_eq!(git_dir_finding(Linked, "hooks/pre-commit", b"x"), None);
        let todo = b"pick 1234 one\n  x make\n";
        assert!(git_dir_finding(Common, "rebase-merge/git-rebase-todo", todo).is_some());
        assert!(git_dir_finding(Linked, "sequencer/todo", b"exec sh\n").is_some());
        assert_eq!(
            git_dir_finding(
                Common,
                "rebase-merge/git-rebase-todo",
                b"pick 1 a\n# exec x\n"
            ),
            None
        );
    }

    #[test]
    fn the_review_reads_what_the_table_says() {
        assert_eq!(
            judged_files(Nested, true),
            [
                "config",
                "hooks/",
                "config.worktree",
                "commondir",
                "rebase-merge/git-rebase-todo",
                "sequencer/todo"
            ]
        );
        // The main git dir: its config and hooks are read-only binds (a change there is
        // the user's own, on the host); what the launch could not cover is judged.
        assert_eq!(
            judged_files(Common, false),
            [
                "commondir",
                "rebase-merge/git-rebase-todo",
                "sequencer/todo"
            ]
        );
        assert_eq!(
            judged_files(Linked, true),
            [
                "config.worktree",
                "commondir",
                "rebase-merge/git-rebase-todo",
                "sequencer/todo"
            ]
        );
    }

    #[test]
    fn data_files_are_not_findings() {
        for rel in [
            "HEAD",
            "index",
            "packed-refs",
            "refs/heads/main",
            "info/attributes",
            "remotes/origin",
            "objects/info/alternates",
            "gitdir",
            "worktrees/x",
        ] {
            assert_eq!(git_dir_finding(Common, rel, b"/tmp/x\n"), None, "{rel}");
        }
    }

    #[test]
    fn every_row_has_its_reason_and_caught_rows_are_judged() {
        for r in GIT_DIR_FILES {
            assert!(!r.git_does.is_empty() && !r.how.is_empty(), "{}", r.path);
            // A code-bearing row is guarded one way or the other.
            assert!(
                !r.code_bearing || r.guarding != Guarding::NotCodeBearing,
                "{}",
                r.path
            );
        }
        // What is caught after the launch, git_dir_finding judges.
        assert!(git_dir_finding(Common, "commondir", b"x").is_some());
        assert!(git_dir_finding(Common, "worktrees/n/commondir", b"x").is_some());
        assert!(git_dir_finding(Module, "config", b"[core]fsmonitor=x").is_some());
        assert!(git_dir_finding(Nested, "config", b"[core]fsmonitor=x").is_some());
    }
}
