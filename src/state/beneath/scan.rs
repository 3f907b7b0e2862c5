//! The test that holds the code to [`super`]: `std::fs`, `File::` and `OpenOptions` (the
//! by-name file API) appear only in `state::beneath` and in the files of [`BY_NAME`],
//! each with how many lines use it and why none of them touches a path beneath a
//! directory a sandbox can write. A new by-name call anywhere (or one more in a listed
//! file) fails the test until it goes through `beneath` or the row says why it may not.

use std::collections::BTreeMap;
use std::path::Path;

/// (file, lines using the by-name API outside its tests, why those paths are no
/// sandbox's).
#[rustfmt::skip]
const BY_NAME: &[(&str, usize, &str)] = &[
    ("src/config/guard.rs", 17, "the user's config file and the paths it names, and the shared-dir socket scan (/proc/net/unix, lstat, and an lstat of each directory above a socket for its owner and mode): read-only; a directory swapped meanwhile can only be the agent's own (searchable whatever its mode) or another user's it cannot change"),
    ("src/config/mod.rs", 1, "the user's config file"),
    ("src/config/settings.rs", 2, "the user's config file and extra mount sources (canonicalised, checked by guard)"),
    ("src/host/apparmor.rs", 4, "/sys/kernel/security, /proc/self/attr, /etc/apparmor.d: the system's"),
    ("src/host/gpu.rs", 7, "/dev, /sys, driver libraries: the system's"),
    ("src/host/holders.rs", 15, "/proc/<pid>/fd, /proc/<pid>/stat, /proc/locks (also read once per search, Takers) and /proc/self/ns/pid: read-only"),
    ("src/host/home.rs", 1, "the home's real path (canonicalize), read before any sandbox"),
    ("src/host/limits.rs", 14, "the cgroup v2 file system (/sys/fs/cgroup, /proc/self/cgroup) and the state home's own .limits-warned mark: no sandbox mounts either"),
    ("src/host/mod.rs", 15, "the home (and its real path, to refuse one holding the system), bwrap and the agents' installs (a launcher's #! line, a pnpm shim's target), /proc/self: read-only; PATH entries canonicalised only to compare them with the places a sandbox writes"),
    ("src/host/mounts.rs", 7, "/proc/self/mountinfo: read-only"),
    ("src/host/project.rs", 7, "the project's root found before launch (canonicalize, git's files read-only)"),
    ("src/host/protect.rs", 25, "the project's protected paths and the files their git configs include: read-only probes before the launch; the mounts themselves are opened O_NOFOLLOW by descriptor (host::sources)"),
    ("src/host/supervise.rs", 4, "/proc/<own pid>/task/<pid>/children and /proc/<pid>/comm: read-only; bwrap's stderr pipe as a File (a descriptor, no name)"),
    ("src/host/companion.rs", 1, "the launcher's environment's paths canonicalised, only to compare them with the places a sandbox writes (nothing opened, read or written through them)"),
    ("src/host/bwrap_cve.rs", 1, "bwrap's real path (canonicalize), to ask the package manager which package owns it: the system's"),
    ("src/host/fd.rs", 1, "/proc/self/fd: this process's own descriptors, listed when close_range is missing"),
    ("src/host/sources.rs", 9, "/proc/self/fd: the bind sources' own descriptors; the canonical directory of each source (then checked through its descriptor); a no-follow stat of each source's path, only compared with its descriptor (a difference reopens it, checked again), or to see an optional one renamed away, or made again under its name (then skipped, as if missing)"),
    ("src/inside/listen.rs", 3, "inside the sandbox, before the agent runs: the broker's stand-in login written into the sandbox's own tmpfs login dir (O_NOFOLLOW, create_new)"),
    ("src/inside/notify.rs", 13, "inside the sandbox, the file supervisor: /proc/<tid>/status, /proc/<tid>/stat and /proc/self/stat (the controlling terminal of /dev/tty), and the caller's base (cwd, root, fd) read through /proc, /proc/sys's Yama scope; and File::from_raw_fd of a /proc status opened by descriptor; statx and fstat of descriptors (rustix::fs) in the walk within a caller's own root; the caller's own paths are opened by descriptor, never through these"),
    ("src/inside/confine.rs", 6, "inside the sandbox: /proc/self, its own mounts (and two rustix::fs lines: a statx of a descriptor it holds)"),
    ("src/launch/mod.rs", 6, "the ssh agent's socket and the home, canonicalised: the user's; the host's ~/.claude/plugins/known_marketplaces.json and the directories it names, read and canonicalised: the user's setup, never bound writable by default"),
    ("src/layers.rs", 2, "the crate's own sources, read in a test"),
    ("src/maintenance/apparmor.rs", 6, "/etc/apparmor.d and /sys: the system's"),
    ("src/maintenance/check.rs", 17, "--check's own throwaway home under a fresh temporary dir, and reads of the user's setup (and the Codex npm package's package.json)"),
    ("src/host/diagnose.rs", 3, "/proc/sys and /etc: the system's"),
    ("src/proxy/mod.rs", 1, "the CA bundle read at the proxy's start: the system's"),
    ("src/proxy/broker.rs", 9, "the user's ~/.claude/settings.json read once for its apiKeyHelper (never with --writable-claude-setup, never one lying in the project); the host's .credentials.json (O_NOFOLLOW|O_NONBLOCK, a regular file only: never a link followed or a fifo waited on) and, after a refresh under claude's lock, a new file beside it (create_new, O_NOFOLLOW) renamed over it, as claude does; in ~/.claude, which no sandbox mounts with the broker (a login kept in ~/.claudebox/login is writable by sandboxes without the broker, which can write that file anyway); /dev/urandom; the tests' upstream CA file"),
    ("src/proxy/netbridge.rs", 6, "/proc/self/fd and the bridge's own socket pair (the stand-in login written to it); the user's own ~/.claude/settings.json read for its env block's API key (not lent with --writable-claude-setup; read only, never run: a copy the agent could write would only lend a key of its own)"),
    ("src/state/claude_home.rs", 8, "the host's ~/.claude (read_dir, the credentials probe, settings.json read once for its apiKeyHelper and its env block's API key and canonicalised for the helper, the project canonicalised to compare) and the WITHIN mount point in it: the user's, never bound writable by default (the broker's copy of settings.json is written beneath); the bypass record's lstat in the state home, which no sandbox mounts"),
    ("src/state/codex_home.rs", 4, "the host's ~/.codex (read_dir, a symlink's target's type) and its auth.json, read (O_NONBLOCK) to seed or replace the login: the user's, never bound writable; the metadata and open-options traits (for the login's fstat)"),
    ("src/state/claude_home/claude_json.rs", 4, "the host's own ~/.claude.json: read, and its inode stamp"),
    ("src/state/credsync/remount.rs", 16, "/proc of the sandbox's first process (its children, comm, root and mount namespace: the user's own processes), the mount points opened from outside through /proc/<pid>/root (openat2 RESOLVE_IN_ROOT|NO_SYMLINKS, each checked to show the bound inode), and in the child that joined the sandbox's mount namespace only a file created in a fresh tmpfs attached nowhere, the mounts by descriptor, and the name of a mount point (which nothing inside can replace) looked up in its directory by descriptor (fchdir), checked again before it is unmounted"),
    ("src/state/credsync.rs", 21, "the host's .credentials.json (O_NOFOLLOW, same-inode check) and its refresh lock in the host's dir (made under the sync's own name, renamed into place, broken when past claude's stale time, removed by identity when the sync that held it died), the bound file reopened through /proc/self/fd, /proc/sys's inotify limits"),
    ("src/state/inuse.rs", 6, "running/ slots and the lock file in the project's state dir, which no sandbox sees"),
    ("src/state/du.rs", 2, "the size walk's top directory, lstat for its own blocks: read-only; the walk below it goes by descriptors"),
    ("src/state/inventory.rs", 3, "--list's and --gc's reads of the projects directory itself (lstat, read_dir) and an lstat of each project's root; inside a project's state everything is read relative to one O_NOFOLLOW descriptor of its directory (sizes by du's descriptor walk); list-summary.json is written and removed beneath (write_atomic, remove_file), nothing by name, and nothing read reaches a sandbox"),
    ("src/state/mod.rs", 23, "the state home and a new project dir made under a temporary name before any sandbox; remove_unused before any sandbox ran; the root-mount record read from the project's state dir, which no sandbox mounts (written by write_atomic, beneath); the user's ~/.claude/settings.json read once for the project's copy (O_NONBLOCK, a regular file only; the user's, never bound writable by default), the bypass record's lstat in the state home, which no sandbox mounts"),
    ("src/state/review/mod.rs", 3, "File::from_raw_fd wraps a descriptor opened beneath; review-pending/ is listed in the project's state dir, which no sandbox sees"),
    ("src/state/review/walk.rs", 1, "File::from_raw_fd wraps a descriptor opened with O_NOFOLLOW to read a git dir's file for judging"),
    ("src/state/sessions/list.rs", 1, "sessions/: not bound into any sandbox"),
    ("src/state/sessions/lock.rs", 7, "sessions/<name>.lock and .running: not bound into any sandbox"),
    ("src/state/sessions/mod.rs", 13, "sessions/: not bound into any sandbox; the conversations (lookups, the move, --continue's newest) are by descriptor (transcripts)"),
    ("src/state/sessions/record.rs", 3, "sessions/<name>.json: not bound into any sandbox (written by state::write_atomic, beneath)"),
];

/// Lines of `text` before its unit tests that use the by-name file API.
fn by_name_lines(text: &str) -> usize {
    let mut n = 0;
    for line in text.lines() {
        if line.starts_with("mod tests {") {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        if ["fs::", "File::", "OpenOptions", "DirBuilder"]
            .iter()
            .any(|p| code.contains(p) && !code.contains(&format!("_{p}")))
        {
            n += 1;
        }
    }
    n
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The count per file, outside `state::beneath` and the unit test files.
fn counts() -> BTreeMap<String, usize> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        if rel.starts_with("src/state/beneath") || rel.ends_with("/tests.rs") {
            continue;
        }
        let n = by_name_lines(&std::fs::read_to_string(&f).unwrap());
        if n > 0 {
            out.insert(rel, n);
        }
    }
    out
}

#[test]
fn by_name_file_io_is_only_where_no_sandbox_writes() {
    let found = counts();
    let listed: BTreeMap<String, usize> = BY_NAME
        .iter()
        .map(|(f, n, _)| (f.to_string(), *n))
        .collect();
    let mut wrong = Vec::new();
    for (f, n) in &found {
        match listed.get(f) {
            None => wrong.push(format!("{f}: {n} by-name lines, not in BY_NAME: use state::beneath")),
            Some(m) if m != n => wrong.push(format!(
                "{f}: {n} by-name lines, BY_NAME says {m}: use state::beneath, or change the row and say why"
            )),
            _ => {}
        }
    }
    for f in listed.keys().filter(|f| !found.contains_key(*f)) {
        wrong.push(format!(
            "{f}: listed in BY_NAME but uses no by-name I/O: remove the row"
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_scan_sees_a_by_name_write() {
    assert_eq!(by_name_lines("let x = 1;\nstd::fs::write(p, b)?;\n"), 1);
    assert_eq!(by_name_lines("// fs::write in a comment\n"), 0);
    assert_eq!(
        by_name_lines("fn f() {}\nmod tests {\nfs::write(p, b);\n}\n"),
        0
    );
    assert_eq!(
        by_name_lines("OpenOptions::new().open(p)\nFile::create(p)\n"),
        2
    );
}
