//! A `commondir` planted in the project's main git dir (issue 21's last critical
//! residual): the host's next `git status` reads the agent's config (core.fsmonitor). The
//! file supervisor (src/inside/notify.rs) makes every creating call itself and refuses
//! that name there; the launch's inotify watch is the second line. Each route below runs
//! in a launch of its own while a host-side inotify watch of `.git` records whether a
//! `commondir` appeared even for an instant, and the host's `git status` checks whether
//! the planted fsmonitor ran. The controls run the same routes with the supervisor off
//! (the tests' switch): each must plant one.

use super::*;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The evil common dir (a copy of the real one whose config has a fsmonitor) and a file
/// holding its name, made in the project before each route.
const PREPARE: &str = r#"
import os, shutil, subprocess, sys, ctypes, threading, time, stat
libc = ctypes.CDLL(None, use_errno=True)
world = os.environ["T_WORLD"]
shutil.rmtree("evilc", ignore_errors=True)
os.mkdir("evilc")
for n in ("HEAD", "refs", "objects"):
    src = os.path.join(".git", n)
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join("evilc", n))
open("evilc/config", "w").write("[core]\n\trepositoryformatversion = 0\n\tfsmonitor = \"touch %s/fsm-ran; false\"\n" % world)
def prep(name=".git/prep"):
    with open(name, "w") as f:
        f.write("../evilc\n")
def report(what):
    print("route result:", what, flush=True)
G = ".git/commondir"
"#;

/// The routes: (name, python code after [`PREPARE`]).
const ROUTES: &[(&str, &str)] = &[
    (
        "open O_CREAT",
        r#"
try:
    open(G, "w").write("../evilc\n"); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "openat O_CREAT on a descriptor of .git",
        r#"
d = os.open(".git", os.O_RDONLY | os.O_DIRECTORY)
try:
    fd = os.open("commondir", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=d); os.write(fd, b"../evilc\n"); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "openat2 O_CREAT",
        r#"
class How(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]
how = How(os.O_CREAT | os.O_WRONLY, 0o644, 0)
fd = libc.syscall(437, -100, G.encode(), ctypes.byref(how), ctypes.sizeof(how))
if fd >= 0:
    os.write(fd, b"../evilc\n"); report("made")
else: report(ctypes.get_errno())
"#,
    ),
    (
        "open O_CREAT through /proc/self/cwd",
        r#"
try:
    open("/proc/self/cwd/" + G, "w").write("../evilc\n"); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "open O_CREAT through a dangling symlink to .git/commondir",
        r#"
os.symlink(os.path.abspath(G), "lnk")
try:
    open("lnk", "w").write("../evilc\n"); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "open O_CREAT through a chain of relative symlinks",
        r#"
os.symlink(".git/cd2", "lnk1")
try:
    os.symlink("commondir", ".git/cd2")
except OSError as e: report(e)
try:
    open("lnk1", "w").write("../evilc\n"); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "creat",
        r#"
fd = libc.syscall(85, G.encode(), 0o644)
report("made" if fd >= 0 else ctypes.get_errno())
if fd >= 0: os.write(fd, b"../evilc\n")
"#,
    ),
    (
        "rename of a prepared file",
        r#"
prep()
try:
    os.rename(".git/prep", G); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "renameat2 RENAME_NOREPLACE",
        r#"
prep()
r = libc.renameat2(-100, b".git/prep", -100, G.encode(), 1)
report("made" if r == 0 else ctypes.get_errno())
"#,
    ),
    (
        "renameat2 RENAME_EXCHANGE with an existing name in .git",
        r#"
prep()
# Swap commondir (as the name to appear) with a file of the git dir that exists.
r = libc.renameat2(-100, b".git/prep", -100, b".git/description", 2)
r2 = libc.renameat2(-100, b".git/description", -100, G.encode(), 2)
report("made" if os.path.lexists(G) else ctypes.get_errno())
"#,
    ),
    (
        "rename a directory holding commondir over .git",
        r#"
os.mkdir("fake"); prep("fake/commondir")
r = libc.renameat2(-100, b"fake", -100, b".git", 2)
report("made" if r == 0 else ctypes.get_errno())
"#,
    ),
    (
        "link",
        r#"
prep()
try:
    os.link(".git/prep", G); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "linkat of an O_TMPFILE through /proc/self/fd",
        r#"
fd = os.open(".git", os.O_TMPFILE | os.O_WRONLY, 0o644)
os.write(fd, b"../evilc\n")
try:
    os.link("/proc/self/fd/%d" % fd, G, follow_symlinks=True); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "linkat AT_EMPTY_PATH of an O_TMPFILE",
        r#"
fd = os.open(".git", os.O_TMPFILE | os.O_WRONLY, 0o644)
os.write(fd, b"../evilc\n")
r = libc.linkat(fd, b"", -100, G.encode(), 0x1000)
report("made" if r == 0 else ctypes.get_errno())
"#,
    ),
    (
        "symlink",
        r#"
try:
    os.symlink(os.path.abspath("evilc"), G); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "mknod of a regular file",
        r#"
try:
    os.mknod(G, 0o644 | stat.S_IFREG); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "mknod FIFO",
        r#"
try:
    os.mkfifo(G); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "mkdir (git dies on a directory there)",
        r#"
try:
    os.mkdir(G); report("made")
except OSError as e: report(e)
"#,
    ),
    (
        "the x32 ABI's rename (bit 30)",
        r#"
prep()
r = libc.syscall(0x40000000 | 82, b".git/prep", G.encode())
report("made" if r == 0 else ctypes.get_errno())
"#,
    ),
    (
        "a bind mount of .git in a new user namespace",
        r#"
prep()
r = subprocess.run(["unshare", "-Urm", "sh", "-c", "mkdir -p /tmp/g && mount --bind .git /tmp/g && mv /tmp/g/prep /tmp/g/commondir"], capture_output=True, text=True)
report(r.stderr.strip() or "made")
"#,
    ),
    (
        "a racing thread rewrites the path between the check and the call",
        r#"
buf = ctypes.create_string_buffer(b".git/xommondir")
stop = False
def flip():
    # Fast flips, and flips that hold each name a moment (so that the control's plain
    # rename meets "commondir" often).
    n = 0
    while not stop:
        n += 1
        buf[5] = b"c"
        if n % 2: time.sleep(0.0003)
        buf[5] = b"x"
        if n % 3: time.sleep(0.0002)
t = threading.Thread(target=flip); t.start()
made = 0
end = time.time() + 3
while time.time() < end and not made:
    prep()
    if libc.rename(b".git/prep", buf) == 0 and os.path.lexists(G):
        made = 1
    try: os.unlink(".git/xommondir")
    except OSError: pass
stop = True; t.join()
report("made" if made else "never")
"#,
    ),
];

/// A host-side inotify watch of `dir` recording whether an entry named `commondir` was
/// created or moved there, until dropped.
struct Watch {
    seen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn new(dir: &Path) -> Watch {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
        ino.add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
            .unwrap();
        let (seen, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || loop {
            let done = st.load(Ordering::SeqCst);
            while let Ok(evs) = ino.read_events() {
                if evs
                    .iter()
                    .any(|e| e.name.as_deref() == Some(std::ffi::OsStr::new("commondir")))
                {
                    s.store(true, Ordering::SeqCst);
                }
            }
            if done {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        });
        Watch {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> bool {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        self.seen.load(Ordering::SeqCst)
    }
}

/// One route in a fresh launch: (planted: seen by the host's watch, left behind, or the
/// host's git ran the fsmonitor; what the route and claudebox said).
fn run_route(w: &World, proj: &Path, code: &str, supervisor: bool) -> (bool, String) {
    let watch = Watch::new(&proj.join(".git"));
    let mut cmd = sandbox(w, proj, supervisor);
    cmd.env("T_WORLD", w.root());
    let o = cmd
        .args(["--exec", "python3", "-c", &format!("{PREPARE}\n{code}")])
        .output()
        .unwrap();
    let seen = watch.finish();
    let left = fs::symlink_metadata(proj.join(".git/commondir")).is_ok();
    let marker = w.root().join("fsm-ran");
    host_git_status(w, proj);
    let ran = marker.exists();
    // Clean up for the next route: whatever was planted, moved aside, or prepared.
    let _ = fs::remove_file(&marker);
    let _ = fs::remove_file(proj.join(".git/commondir"));
    let _ = fs::remove_dir(proj.join(".git/commondir"));
    for junk in ["evilc", "fake"] {
        let _ = fs::remove_dir_all(proj.join(junk));
    }
    for junk in [
        ".git/prep",
        ".git/description",
        "lnk",
        "lnk1",
        ".git/cd2",
        ".git/xommondir",
    ] {
        let _ = fs::remove_file(proj.join(junk));
    }
    git(proj, &["checkout", "-q", "--", "."]);
    let text = format!(
        "seen {seen}, left {left}, fsmonitor ran {ran}\n{}{}",
        stdout(&o),
        stderr(&o)
    );
    (seen || left || ran, text)
}

/// The main `.git` made no valid git dir (its `HEAD`, which git writes, made no ref) and
/// the top shaped as a bare repository whose config has a fsmonitor: git's discovery then
/// takes the top for the git dir. Run while the sandbox runs: the agent waits for the
/// host's `git status` (`.host-ran`), then removes it all before the exit review. In
/// `T_TOP` (the project's top, or a nested repository's).
const BARE_TOP: &str = r#"
import os, time
world = os.environ["T_WORLD"]
os.chdir(os.environ["T_TOP"])
saved = open(".git/HEAD").read()
open(".git/HEAD", "w").write("garbage\n")
for d in ("objects", "refs"):
    os.makedirs(d, exist_ok=True)
open("config", "w").write("[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = .\n\tfsmonitor = \"touch %s/fsm-top; false\"\n" % world)
try:
    open("HEAD", "w").write("ref: refs/heads/main\n"); print("route result: made", flush=True)
except OSError as e: print("route result:", e, flush=True)
open(".planted", "w").close()
for _ in range(300):
    if os.path.exists(".host-ran"): break
    time.sleep(0.05)
open(".git/HEAD", "w").write(saved)
for f in ("HEAD", "config", ".planted", ".host-ran"):
    try: os.remove(f)
    except OSError: pass
for d in ("objects", "refs"):
    os.rmdir(d)
"#;

/// [`BARE_TOP`] in `top` (relative to the project) with the host's `git status` there
/// while the sandbox runs: whether the planted fsmonitor ran.
fn bare_top(w: &World, proj: &Path, top: &str, supervisor: bool) -> (bool, String) {
    let dir = proj.join(top);
    let head = fs::read(dir.join(".git/HEAD")).unwrap();
    let mut cmd = sandbox(w, proj, supervisor);
    cmd.env("T_WORLD", w.root()).env("T_TOP", &dir);
    let child = cmd
        .args(["--exec", "python3", "-c", BARE_TOP])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !dir.join(".planted").exists() && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let marker = w.root().join("fsm-top");
    host_git_status(w, &dir);
    let _ = fs::write(dir.join(".host-ran"), "");
    let o = child.wait_with_output().unwrap();
    let ran = marker.exists();
    let _ = fs::remove_file(&marker);
    fs::write(dir.join(".git/HEAD"), head).unwrap();
    let text = format!("fsmonitor ran {ran}\n{}{}", stdout(&o), stderr(&o));
    (ran, text)
}

/// claudebox in `proj`, with the file supervisor or (the controls) without it.
fn sandbox(w: &World, proj: &Path, supervisor: bool) -> Command {
    let mut cmd = w.cmd(proj);
    if !supervisor {
        cmd.env("CLAUDEBOX_TEST_NO_FILE_SUPERVISOR", "1");
    }
    cmd
}

/// The host's `git status` in `proj` (whatever a planted config makes it run).
fn host_git_status(w: &World, proj: &Path) {
    let _ = Command::new("git")
        .arg("-C")
        .arg(proj)
        .arg("status")
        .env("HOME", w.home())
        .output()
        .unwrap();
}

fn arena() -> (World, PathBuf) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    (w, proj)
}

/// Escape attempts (counted by `escape_suite`): every route with the supervisor on, and
/// a commondir in a submodule's and a nested repository's git dir.
pub fn attempts() -> Vec<(&'static str, bool)> {
    let (w, proj) = arena();
    let mut v: Vec<(&'static str, bool)> = ROUTES
        .iter()
        .map(|(name, code)| {
            let (planted, text) = run_route(&w, &proj, code, true);
            if planted {
                eprintln!("commondir route {name:?} planted one:\n{text}");
            }
            (*name, planted)
        })
        .collect();
    let (w, proj) = other_git_dirs_arena();
    for (name, planted) in other_git_dirs(&w, &proj, true) {
        v.push((name, planted));
    }
    for (name, top) in BARE_TOPS {
        let (w, proj) = top_arena(top);
        let (ran, text) = bare_top(&w, &proj, top, true);
        if ran {
            eprintln!("{name}: {text}");
        }
        v.push((name, ran));
    }
    v
}

/// [`BARE_TOP`]'s attempts: (name, the top it plants in, relative to the project).
const BARE_TOPS: [(&str, &str); 2] = [
    (
        "the main .git/HEAD made no ref and the top shaped as a bare repository (HEAD, \
         objects/, refs/, config) while the sandbox runs: the host's git status at the top",
        ".",
    ),
    (
        "a nested repository's .git/HEAD made no ref and its top shaped as a bare \
         repository while the sandbox runs: the host's git status in that repository",
        "vendor/lib",
    ),
];

/// A project with a repository at `top` (when not the project's top itself).
fn top_arena(top: &str) -> (World, PathBuf) {
    let (w, proj) = arena();
    if top != "." {
        init_repo(&proj.join(top));
    }
    (w, proj)
}

/// Without the supervisor, the host's git status at the top (the project's, a nested
/// repository's) runs the fsmonitor of [`BARE_TOP`]'s config while the sandbox runs (and
/// the exit review finds nothing).
#[test]
fn controls_the_top_as_a_bare_repository_runs_without_the_supervisor() {
    for (_, top) in BARE_TOPS {
        let (w, proj) = top_arena(top);
        let (ran, text) = bare_top(&w, &proj, top, false);
        assert!(ran, "{top}: {text}");
        assert!(!stderr_has_review(&text), "{top}: {text}");
    }
}

fn stderr_has_review(text: &str) -> bool {
    text.contains("claudebox: review:")
}

/// The git dirs the supervisor guards besides the main one: an existing submodule's
/// (`.git/modules/sub`, where the host's `git status` at the top runs `git status` in the
/// submodule) and a nested repository's (`vendor/lib/.git`), both pinned at the launch.
const OTHER_GIT_DIRS: [(&str, &str); 2] = [
    ("a commondir in a submodule's git dir", ".git/modules/sub"),
    (
        "a commondir in a nested repository's git dir",
        "vendor/lib/.git",
    ),
];

fn other_git_dirs_arena() -> (World, PathBuf) {
    let (w, proj) = arena();
    let lib = w.dir("lib");
    init_repo(&lib);
    git(
        &proj,
        &[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            lib.to_str().unwrap(),
            "sub",
        ],
    );
    git(&proj, &["commit", "-qm", "sub"]);
    init_repo(&proj.join("vendor/lib"));
    (w, proj)
}

/// Each of [`OTHER_GIT_DIRS`]: (attempt, whether a commondir was made there).
fn other_git_dirs(w: &World, proj: &Path, supervisor: bool) -> Vec<(&'static str, bool)> {
    let mut cmd = sandbox(w, proj, supervisor);
    let script = OTHER_GIT_DIRS
        .iter()
        .map(|(_, d)| format!("echo ../../../evil > '{d}/commondir' && echo made-in '{d}'"))
        .collect::<Vec<_>>()
        .join("; ");
    // Watched from the host while the sandbox runs: the exit review moves a planted one
    // aside at the end, so what is left afterwards says nothing.
    let watches: Vec<Watch> = OTHER_GIT_DIRS
        .iter()
        .map(|(_, d)| Watch::new(&proj.join(d)))
        .collect();
    let o = cmd.args(["--exec", "sh", "-c", &script]).output().unwrap();
    OTHER_GIT_DIRS
        .iter()
        .zip(watches)
        .map(|((name, d), watch)| {
            let made = watch.finish() || stdout(&o).contains(&format!("made-in {d}"));
            if made {
                eprintln!("{name}: made\n{}{}", stdout(&o), stderr(&o));
            }
            (*name, made)
        })
        .collect()
}

/// Their control: with the supervisor off, each is made.
#[test]
fn controls_a_commondir_is_made_in_other_git_dirs_without_the_supervisor() {
    let (w, proj) = other_git_dirs_arena();
    for (name, made) in other_git_dirs(&w, &proj, false) {
        assert!(made, "{name}: not made without the supervisor");
    }
}

/// The routes that can make the file at all (the kernel refuses the others whatever the
/// supervisor does: a directory over a mounted .git, AT_EMPTY_PATH without
/// CAP_DAC_READ_SEARCH, a user namespace where the sandbox has none, x32 where the kernel
/// has it off, linkat through /proc/self/fd, which Linux 6.18 answers EXDEV): each plants a commondir with the supervisor off.
const CONTROLLED: &[&str] = &[
    "open O_CREAT",
    "openat O_CREAT on a descriptor of .git",
    "openat2 O_CREAT",
    "open O_CREAT through /proc/self/cwd",
    "open O_CREAT through a dangling symlink to .git/commondir",
    "open O_CREAT through a chain of relative symlinks",
    "creat",
    "rename of a prepared file",
    "renameat2 RENAME_NOREPLACE",
    "link",
    "linkat AT_EMPTY_PATH of an O_TMPFILE",
    "symlink",
    "mknod of a regular file",
    "mknod FIFO",
    "mkdir (git dies on a directory there)",
    "a racing thread rewrites the path between the check and the call",
];

#[test]
fn controls_each_route_plants_a_commondir_without_the_supervisor() {
    let _heavy = lab::heavy();
    let (w, proj) = arena();
    let mut failed = Vec::new();
    for (name, code) in ROUTES {
        let (planted, text) = run_route(&w, &proj, code, false);
        if CONTROLLED.contains(name) && !planted {
            failed.push(format!("{name}: {text}"));
        }
        eprintln!("control {name}: {}", text.lines().next().unwrap_or(""));
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// The same routes with the supervisor on (also counted in `escape_suite`).
#[test]
fn no_route_plants_a_commondir_with_the_supervisor() {
    let _heavy = lab::heavy();
    let escaped: Vec<&str> = attempts()
        .into_iter()
        .filter(|(_, e)| *e)
        .map(|(n, _)| n)
        .collect();
    assert!(escaped.is_empty(), "{escaped:#?}");
}

/// With the supervisor (also counted in `escape_suite`): neither is made, even for an
/// instant.
#[test]
fn a_commondir_is_refused_in_other_git_dirs() {
    let (w, proj) = other_git_dirs_arena();
    for (name, made) in other_git_dirs(&w, &proj, true) {
        assert!(!made, "{name}: made with the supervisor");
    }
}
