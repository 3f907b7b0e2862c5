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
    let mut cmd = w.cmd(proj);
    cmd.env("T_WORLD", w.root());
    if !supervisor {
        cmd.env("CLAUDEBOX_TEST_NO_FILE_SUPERVISOR", "1");
    }
    let o = cmd
        .args(["--exec", "python3", "-c", &format!("{PREPARE}\n{code}")])
        .output()
        .unwrap();
    let seen = watch.finish();
    let left = fs::symlink_metadata(proj.join(".git/commondir")).is_ok();
    let marker = w.root().join("fsm-ran");
    let _ = Command::new("git")
        .arg("-C")
        .arg(proj)
        .arg("status")
        .env("HOME", w.home())
        .output()
        .unwrap();
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

fn arena() -> (World, PathBuf) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    (w, proj)
}

/// Escape attempts (counted by `escape_suite`): every route with the supervisor on.
pub fn attempts() -> Vec<(&'static str, bool)> {
    let (w, proj) = arena();
    ROUTES
        .iter()
        .map(|(name, code)| {
            let (planted, text) = run_route(&w, &proj, code, true);
            if planted {
                eprintln!("commondir route {name:?} planted one:\n{text}");
            }
            (*name, planted)
        })
        .collect()
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
