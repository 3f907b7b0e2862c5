//! Shared system directories and other programs' unix sockets as the project: the agent
//! types into a host shell through the user's tmux server (a real one, `tmux -S`), as an
//! independent review did from `cd /tmp && claudebox`. Each attempt needs its own launch
//! in its own directory, so they run beside the arena (like `race`).
//!
//! Attempts: `/tmp` itself as the project, and a project holding a live tmux socket three
//! levels down, each refused without `--yes`; with `--yes` the socket is covered and the
//! keys never reach the shell. Controls: the same keys through the same socket bound with
//! `--rw` (the cover is what stops them), and from the host.

use std::process::Command;
use std::time::{Duration, Instant};

use super::*;
use crate::BIN;

/// A tmux server of the test's own, a shell in it, killed on drop.
struct Server {
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    /// A server whose socket lies in a new directory under `parent`.
    fn start(parent: &Path) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("cbx-tmux-")
            .tempdir_in(parent)
            .unwrap();
        let sock = dir.path().join("default");
        let o = Command::new("tmux")
            .arg("-S")
            .arg(&sock)
            .args([
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "80",
                "-y",
                "24",
                "sh",
            ])
            .env("HOME", dir.path())
            .output()
            .expect("tmux");
        assert!(o.status.success(), "tmux: {}", stderr(&o));
        Server { sock, _dir: dir }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.sock)
            .arg("kill-server")
            .output();
    }
}

/// Shell code run inside: type `touch MARK` into the tmux server's shell.
fn type_into(sock: &Path, marker: &Path) -> String {
    format!(
        "tmux -S {} send-keys 'touch {}' Enter 2>&1; sleep 0.3; echo ATTEMPT-RAN",
        sq(sock.to_str().unwrap()),
        marker.to_str().unwrap()
    )
}

/// Whether the host shell made `marker` (it is given 3 s).
fn typed(marker: &Path) -> bool {
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        if marker.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// claudebox in `cwd` with `home` as HOME and the world's PATH, running `script`.
fn launch(w: &World, home: &Path, cwd: &Path, args: &[&str], script: &str) -> Output {
    w.cmd(cwd)
        .env("HOME", home)
        .args(args)
        .args(["--exec", "sh", "-c", script])
        .output()
        .unwrap()
}

/// A home outside /tmp (the world's is inside it, which would make `/tmp` a home-sized
/// project and be refused for that).
fn home_outside_tmp() -> Home {
    let d = tempfile::Builder::new()
        .prefix("cbx-home-")
        .tempdir_in("/var/tmp")
        .unwrap();
    fs::create_dir_all(d.path().join(".claude")).unwrap();
    Home(d.keep())
}

/// Removed with rm, not std's recursive removal: the review of a launch at /tmp moves
/// aside what other programs changed there meanwhile into this home's quarantine, a tree
/// of any depth (a 5,000-level one overflowed the test thread's stack).
struct Home(PathBuf);

impl Home {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = Command::new("rm").arg("-rf").arg(&self.0).status();
    }
}

/// A refusal is one line on stderr naming why; the launch did not run the script.
fn refused(o: &Output, why: &str) -> bool {
    let e = stderr(o);
    !o.status.success()
        && e.lines().count() == 1
        && e.contains(why)
        && !stdout(o).contains("ATTEMPT-RAN")
}

/// Removes the `.claude` mount point a `--yes` launch at `/tmp` leaves (when empty).
fn tidy_tmp() {
    let _ = fs::remove_dir(Path::new("/tmp/.claude"));
}

/// Whether each marker was made, all given the same 3 s (from now).
fn typed_all(markers: &[&Path]) -> Vec<bool> {
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end && !markers.iter().all(|m| m.exists()) {
        std::thread::sleep(Duration::from_millis(50));
    }
    markers.iter().map(|m| m.exists()).collect()
}

pub(super) fn attempts() -> Vec<(&'static str, bool)> {
    // The other user's run (scripts/test runs root's and claudebox-test's at once) must not
    // have its tmux server in /tmp, or launch at /tmp, meanwhile.
    let _tmp = lab::machine_lock("tmp-as-project");
    let w = World::new(BIN);
    let home = home_outside_tmp();
    // Each attempt types into its own marker; the servers live to the end, where the
    // markers are given their 3 s together.
    let marker: Vec<PathBuf> = (0..4)
        .map(|i| w.root().join(format!("typed-{i}")))
        .collect();

    // 1. /tmp as the project, a tmux server's socket in it.
    let s = Server::start(Path::new("/tmp"));
    let o = launch(
        &w,
        home.path(),
        Path::new("/tmp"),
        &[],
        &type_into(&s.sock, &marker[0]),
    );
    let stopped_tmp = refused(&o, "shared system directory");
    let o = launch(
        &w,
        home.path(),
        Path::new("/tmp"),
        &["--yes"],
        &type_into(&s.sock, &marker[1]),
    );
    tidy_tmp();
    let warned_tmp = stderr(&o).contains("covered with /dev/null");
    if !warned_tmp || !o.status.success() {
        eprintln!("/tmp --yes: {}{}", stdout(&o), stderr(&o));
    }

    // 2. A project holding a live socket three levels down (`tmp/cbx-tmux-*/default`).
    let proj = w.dir("sockproj");
    init_repo(&proj);
    fs::create_dir_all(proj.join("tmp")).unwrap();
    let s2 = Server::start(&proj.join("tmp"));
    let o = launch(&w, &w.home(), &proj, &[], &type_into(&s2.sock, &marker[2]));
    let stopped_proj = refused(&o, "unix sockets of other programs");
    let o = launch(
        &w,
        &w.home(),
        &proj,
        &["--yes"],
        &type_into(&s2.sock, &marker[3]),
    );
    let warned_proj =
        o.status.success() && stderr(&o).contains(s2.sock.file_name().unwrap().to_str().unwrap());
    if !warned_proj {
        eprintln!("project --yes: {}{}", stdout(&o), stderr(&o));
    }
    let typed = typed_all(&marker.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    drop((s, s2));
    vec![
        (
            "/tmp as the project: type into a host shell through a tmux socket there",
            !stopped_tmp || typed[0],
        ),
        (
            "/tmp as the project with --yes: the tmux socket there",
            !warned_tmp || typed[1],
        ),
        (
            "a project holding a tmux socket: type into the host shell",
            !stopped_proj || typed[2],
        ),
        (
            "a project holding a tmux socket, --yes: type into the host shell",
            !warned_proj || typed[3],
        ),
    ]
}

/// The same keys reach the host shell from the host, and from inside through the same
/// socket when it is bound with `--rw` (after the cover, so the cover is what stopped them).
pub(super) fn controls() {
    let _tmp = lab::machine_lock("tmp-as-project");
    let w = World::new(BIN);
    let home = home_outside_tmp();
    let marker = w.root().join("typed");
    let s = Server::start(Path::new("/tmp"));
    let o = Command::new("sh")
        .arg("-c")
        .arg(type_into(&s.sock, &marker))
        .output()
        .unwrap();
    assert!(typed(&marker), "host control: {}", stderr(&o));
    fs::remove_file(&marker).unwrap();
    let dir = s.sock.parent().unwrap().to_str().unwrap().to_string();
    let o = launch(
        &w,
        home.path(),
        Path::new("/tmp"),
        &["--yes", "--rw", &dir],
        &type_into(&s.sock, &marker),
    );
    tidy_tmp();
    assert!(
        typed(&marker),
        "/tmp --yes --rw control: {}{}",
        stdout(&o),
        stderr(&o)
    );
    fs::remove_file(&marker).unwrap();
    drop(s);

    let proj = w.dir("sockproj");
    init_repo(&proj);
    fs::create_dir_all(proj.join("tmp")).unwrap();
    let s = Server::start(&proj.join("tmp"));
    let dir = s.sock.parent().unwrap().to_str().unwrap().to_string();
    let o = launch(
        &w,
        &w.home(),
        &proj,
        &["--yes", "--rw", &dir],
        &type_into(&s.sock, &marker),
    );
    assert!(
        typed(&marker),
        "project --yes --rw control: {}{}",
        stdout(&o),
        stderr(&o)
    );
}

/// A project (here with `--yes`) holding a live socket behind a directory the sandbox
/// cannot search: another user's private directory (as root: owned by nobody, 0700; the
/// kernel gives root in bwrap's user namespace no override there). The launch runs, and
/// the keys never reach the shell. An ordinary user cannot make another user's directory:
/// there the socket's directory stays the user's own (0700), and the socket is covered. Found when the
/// ordinary user's test run had claude's tmux sockets in `/tmp/tmux-1001/` while root's
/// launched at `/tmp`: bwrap failed "Can't create file at /tmp/tmux-1001/...: Permission
/// denied" because the socket was passed to be covered though nothing inside can reach it.
#[test]
fn a_socket_behind_a_directory_the_sandbox_cannot_search_does_not_stop_the_launch() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new(BIN);
    let home = home_outside_tmp();
    let proj = tempfile::Builder::new()
        .prefix("cbx-proj-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let s = Server::start(proj.path());
    let private = s.sock.parent().unwrap().to_path_buf();
    let root = nix::unistd::geteuid().is_root();
    if root {
        std::os::unix::fs::chown(&private, Some(65534), Some(65534)).unwrap();
    }
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let marker = w.root().join("typed");
    let o = launch(
        &w,
        home.path(),
        proj.path(),
        &["--yes"],
        &type_into(&s.sock, &marker),
    );
    // Let the tempdir go (root's chown) before any assertion.
    if root {
        std::os::unix::fs::chown(&private, Some(0), Some(0)).unwrap();
    }
    assert!(
        o.status.success() && stdout(&o).contains("ATTEMPT-RAN"),
        "the launch did not run: {}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(!typed(&marker), "the keys reached the host shell");
    // As root the socket is not covered (nothing inside can reach it); as the user, it is.
    assert_eq!(
        stderr(&o).contains("covered with /dev/null"),
        !root,
        "{}",
        stderr(&o)
    );
}
