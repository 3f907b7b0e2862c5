//! The file supervisor (src/inside/notify.rs) leaves normal work as it was: git's whole
//! workflow, file modes under the caller's umask, O_EXCL, /dev/stdout, FIFOs, O_TMPFILE,
//! symlinks and links, exit statuses; and what it costs (figures). The escape attempts
//! are in escape/commondir.rs; the real claude holding a conversation through it is
//! e2e_claude's (every launch has the supervisor).

use std::path::Path;
use std::process::Output;
use std::time::Instant;

use crate::BIN;
use lab::*;

const OFF: &str = "CLAUDEBOX_TEST_NO_FILE_SUPERVISOR";

fn run(w: &World, proj: &Path, script: &str, supervisor: bool) -> Output {
    let mut c = w.cmd(proj);
    if !supervisor {
        c.env(OFF, "1");
    }
    c.args(["--exec", "sh", "-c", script]).output().unwrap()
}

/// What the scripts below print, the same with and without the supervisor.
fn same_both_ways(w: &World, proj: &Path, script: &str) -> String {
    let on = run(w, proj, script, true);
    let on_text = format!("{}{}", stdout(&on), stderr(&on));
    assert!(on.status.success(), "{on_text}");
    let off = run(w, proj, script, false);
    assert!(off.status.success(), "{}", stderr(&off));
    assert_eq!(stdout(&on), stdout(&off), "with and without the supervisor");
    on_text
}

#[test]
fn git_works_inside_as_before() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let script = "set -e; git init -q sub && cd sub && git config user.email t@e && git config user.name T && \
        echo a > a && git add a && git commit -qm a && git branch b && git checkout -q b && \
        echo b > b && git add b && git commit -qm b && git checkout -q - && echo c > c && \
        git add c && git commit -qm c && git checkout -q b && git rebase -q master 2>/dev/null || git rebase -q main; \
        git log --format=%s | tr '\\n' ' '; echo; echo d > d; git stash -u -q && git stash pop -q && ls d; \
        git worktree add -q ../wt-x && ls ../wt-x | tr '\\n' ' '; echo; git worktree remove ../wt-x; \
        git gc -q && git fsck >/dev/null 2>&1 && echo fsck-ok; cd .. && rm -rf sub";
    let text = same_both_ways(&w, &proj, script);
    assert!(text.contains("b c a") && text.contains("fsck-ok"), "{text}");
}

/// A project with a submodule (`sub`) and a nested repository (`vendor/lib`), both pinned
/// at the launch, whose tops the supervisor guards for `HEAD`.
fn nested_arena() -> (World, std::path::PathBuf) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let lib = w.dir("lib");
    init_repo(&lib);
    let lib = lib.to_str().unwrap();
    let add = [
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "add",
        "-q",
        lib,
        "sub",
    ];
    git(&proj, &add);
    git(&proj, &["commit", "-qm", "sub"]);
    init_repo(&proj.join("vendor/lib"));
    (w, proj)
}

/// git's workflow in a nested repository and a submodule pinned at the launch is as
/// before: the supervisor refuses `HEAD` at their tops only, and git writes its `HEAD` in
/// their git dirs (`vendor/lib/.git`, `.git/modules/sub`).
#[test]
fn git_works_in_nested_repositories_as_before() {
    let (w, proj) = nested_arena();
    // Their configs are read-only inside: the identity comes from the environment. Each
    // repository is put back as it was at the end (the script runs twice).
    let script = "set -e; export GIT_AUTHOR_NAME=T GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=T \
        GIT_COMMITTER_EMAIL=t@e; for r in vendor/lib sub; do (set -e; cd $r; \
        start=$(git rev-parse HEAD); br=$(git symbolic-ref -q --short HEAD || echo $start); \
        git checkout -q -b b; echo b > b; git add b; git commit -qm b; git checkout -q -; \
        echo c > c; git add c; git commit -qm c; git checkout -q b; git rebase -q -; \
        git checkout -q --detach HEAD~1; git checkout -q b; git log --format=%s | tr '\\n' ' '; \
        echo; mkdir docs; echo x > docs/HEAD; ls docs; git gc -q; git fsck >/dev/null 2>&1; \
        echo fsck-ok; git checkout -q $br; git reset -q --hard $start; git branch -qD b; \
        rm -r docs); done";
    let text = same_both_ways(&w, &proj, script);
    assert_eq!(text.matches("fsck-ok").count(), 2, "{text}");
    assert_eq!(text.matches("b c init").count(), 2, "{text}");
}

/// `HEAD` cannot be made at the top of a nested repository or a submodule pinned at the
/// launch (nor at the project's top); control: without the supervisor each is made.
#[test]
fn head_is_refused_at_nested_tops() {
    let (w, proj) = nested_arena();
    let script = "for d in . vendor/lib sub; do echo x > $d/HEAD && echo made $d; \
        mv $d/README $d/HEAD 2>/dev/null && echo moved $d; done; true";
    let on = run(&w, &proj, script, true);
    assert!(
        !stdout(&on).contains("made") && !stdout(&on).contains("moved"),
        "{}{}",
        stdout(&on),
        stderr(&on)
    );
    for d in [".", "vendor/lib", "sub"] {
        assert!(!proj.join(d).join("HEAD").exists(), "{d}");
    }
    let off = run(&w, &proj, script, false);
    for d in [".", "vendor/lib", "sub"] {
        assert!(
            stdout(&off).contains(&format!("made {d}")),
            "{d}: {}",
            stdout(&off)
        );
    }
}

#[test]
fn files_keep_their_modes_and_meanings() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let py = r#"
import os, stat
os.umask(0o027)
fd = os.open("m1", os.O_CREAT | os.O_WRONLY, 0o666); os.close(fd)
print("mode", oct(os.stat("m1").st_mode & 0o777))
os.umask(0o077); os.close(os.open("m2", os.O_CREAT | os.O_WRONLY, 0o666))
print("mode after umask", oct(os.stat("m2").st_mode & 0o777))
import threading; t = threading.Thread(target=lambda: os.umask(0o002)); t.start(); t.join()
os.close(os.open("m3", os.O_CREAT | os.O_WRONLY, 0o666))
print("mode after a sibling thread umask", oct(os.stat("m3").st_mode & 0o777))
os.umask(0o027)
try:
    os.open("m1", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666); print("excl: opened!")
except FileExistsError: print("excl: EEXIST")
os.symlink("m1", "s1")
try:
    os.open("s1", os.O_CREAT | os.O_EXCL | os.O_WRONLY); print("excl through symlink: opened!")
except FileExistsError: print("excl through symlink: EEXIST")
os.symlink("dangling-target", "s2"); open("s2", "w").write("x")
print("through dangling symlink:", open("dangling-target").read())
try:
    os.open("s1", os.O_CREAT | os.O_NOFOLLOW | os.O_WRONLY); print("nofollow: opened!")
except OSError as e: print("nofollow:", e.errno == 40)
os.mkdir("dd", 0o777); print("dir mode", oct(os.stat("dd").st_mode & 0o777))
os.mkfifo("ff"); print("fifo mode", oct(os.stat("ff").st_mode & 0o777))
fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o600); os.write(fd, b"t")
os.close(fd); open("tl", "w").write("t")
os.rename("tl", "dd/tl2"); os.link("dd/tl2", "hl"); print("links", os.stat("hl").st_nlink)
try:
    os.open("nodir/x", os.O_CREAT)
except OSError as e: print("missing dir", e.errno)
try:
    os.open("m1/x", os.O_CREAT)
except OSError as e: print("not a dir", e.errno)
try:
    os.open("new/", os.O_CREAT)
except OSError as e: print("trailing slash", e.errno)
d = os.open("dd", os.O_RDONLY | os.O_DIRECTORY)
fd = os.open("at", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=d)
import fcntl; print("cloexec", fcntl.fcntl(fd, fcntl.F_GETFD) & 1, os.path.exists("dd/at"))
fd = os.open("/proc/self/cwd/abs", os.O_CREAT | os.O_WRONLY, 0o644); print("via /proc/self/cwd", os.path.exists("abs"))
"#;
    let script = format!(
        "set -e; cd \"$(mktemp -d -p .)\"; python3 -c '{py}'; echo to-stdout > /dev/stdout; \
         echo fd1 > /dev/fd/1; mkfifo p; (touch log; cat p) & echo via-fifo > p; wait; \
         cd ..; rm -rf tmp.*"
    );
    let text = same_both_ways(&w, &proj, &script);
    for want in [
        "mode 0o640",
        "mode after umask 0o600",
        "mode after a sibling thread umask 0o664",
        "excl: EEXIST",
        "excl through symlink: EEXIST",
        "through dangling symlink: x",
        "nofollow: True",
        "dir mode 0o750",
        "fifo mode 0o640",
        "links 2",
        "missing dir 2",
        "not a dir 20",
        "trailing slash 21",
        "cloexec 1 True",
        "via /proc/self/cwd True",
        "to-stdout",
        "fd1",
        "via-fifo",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
}

#[test]
fn the_agents_exit_status_is_the_sandboxs() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    for (script, code) in [
        ("exit 7", 7),
        ("kill -TERM $$", 143),
        ("kill -KILL $$", 137),
    ] {
        for sup in [true, false] {
            let o = run(&w, &proj, script, sup);
            assert_eq!(
                o.status.code(),
                Some(code),
                "{script} {sup}: {}",
                stderr(&o)
            );
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// What a creating call costs through the supervisor, and the launch: medians of
/// interleaved runs with and without it (printed, not asserted; `-- --ignored
/// --nocapture`, best on a release build: ~90 s of a debug build's heavy hold in CI).
#[test]
#[ignore]
fn figures_the_cost_of_a_creating_call() {
    let _heavy = lab::heavy();
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    // The loop's own time, inside: 10,000 files created and written (python, one open
    // with O_CREAT each), and git add + commit of 2,000 new files.
    let create =
        "python3 -c 'import time,os,tempfile\nd=tempfile.mkdtemp(dir=\".\")\nt=time.monotonic()\n\
        for i in range(10000): open(\"%s/f%d\" % (d, i), \"w\").close()\n\
        print(\"T\", time.monotonic()-t)\nimport shutil; shutil.rmtree(d)'";
    let commit = "d=$(mktemp -d -p .); cd $d && git init -q && i=0; while [ $i -lt 2000 ]; do echo $i > f$i; i=$((i+1)); done; \
        python3 -c 'import time,subprocess\nt=time.monotonic()\nsubprocess.run(\"git add -A && git -c user.email=t@e -c user.name=T commit -qm x\", shell=True, check=True)\nprint(\"T\", time.monotonic()-t)'; cd .. && rm -rf $d";
    let measure = |script: &str, sup: bool| -> f64 {
        let o = run(&w, &proj, script, sup);
        let s = stdout(&o);
        s.lines()
            .find_map(|l| {
                l.strip_prefix("T ")
                    .and_then(|t| t.trim().parse::<f64>().ok())
            })
            .unwrap_or_else(|| panic!("{s}{}", stderr(&o)))
    };
    for (what, script, rounds) in [
        ("10,000 files created", create, 5),
        ("git add -A && git commit of 2,000 files", commit, 5),
    ] {
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            off.push(measure(script, false));
            on.push(measure(script, true));
        }
        let (on, off) = (median(on), median(off));
        lab::figure!(
            "file supervisor: {what}: {:.0} ms with it, {:.0} ms without (median of {rounds} interleaved runs inside; {:.1} us more per file)",
            on * 1000.0,
            off * 1000.0,
            (on - off) * 1e6 / if what.starts_with("10") { 10000.0 } else { 2000.0 }
        );
    }
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..9 {
        for sup in [false, true] {
            let t = Instant::now();
            let o = run(&w, &proj, "true", sup);
            assert!(o.status.success());
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            if sup {
                on.push(ms);
            } else {
                off.push(ms);
            }
        }
    }
    lab::figure!(
        "file supervisor: a launch of `true`: {:.1} ms with it, {:.1} ms without (median of 9 interleaved)",
        median(on),
        median(off)
    );
}

/// A call interrupted by a signal while the supervisor makes it is not made twice: the
/// filter waits killably once the supervisor has it (Linux 5.19+), so 3,000 exclusive
/// creates and renames under a storm of signals (as Go's preemption sends) all succeed.
#[test]
fn a_signal_storm_does_not_make_a_call_twice() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let py = r#"
import os, signal, threading, tempfile
signal.signal(signal.SIGUSR1, lambda *a: None)
signal.siginterrupt(signal.SIGUSR1, False)
d = tempfile.mkdtemp(dir=".")
stop = False
main = threading.get_ident()
def storm():
    while not stop:
        signal.pthread_kill(main, signal.SIGUSR1)
t = threading.Thread(target=storm); t.start()
bad = 0
for i in range(3000):
    try:
        fd = os.open("%s/f%d" % (d, i), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644); os.close(fd)
        os.rename("%s/f%d" % (d, i), "%s/g%d" % (d, i))
    except OSError as e:
        bad += 1
stop = True; t.join()
print("failed calls:", bad)
import shutil; shutil.rmtree(d)
"#;
    let o = run(&w, &proj, &format!("python3 -c '{py}'"), true);
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert!(text.contains("failed calls: 0"), "{text}");
}

/// `/dev/tty` is the caller's terminal, also when the caller's is not the supervisor's (a
/// pty made inside, as tmux makes one), and none (a new session) is ENXIO.
#[test]
fn dev_tty_is_the_callers_terminal() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    std::fs::write(
        proj.join("devtty_probe.py"),
        r#"
import os, pty, time
pid, fd = pty.fork()
if pid == 0:
    os.system("echo in-pty > /dev/tty")
    os._exit(0)
time.sleep(0.5)
print("pty got:", os.read(fd, 100).decode().strip())
os.waitpid(pid, 0)
r = os.system("setsid sh -c 'echo x > /dev/tty' 2>/dev/null")
print("new session:", os.waitstatus_to_exitcode(r))
"#,
    )
    .unwrap();
    let text = same_both_ways(&w, &proj, "python3 devtty_probe.py");
    assert!(text.contains("pty got: in-pty"), "{text}");
    assert!(text.contains("new session: 2"), "{text}");
}

/// A sandbox inside the sandbox (what Claude Code's own Bash sandbox makes: bwrap with
/// the project read-only) keeps its own view through the supervisor: the supervisor makes
/// the calls of a process whose root is its own by walking the path within that root, so
/// an absolute symlink (or `..`) cannot lead to what the inner sandbox made read-only but
/// the supervisor's view has writable. Control: with the supervisor resolving from its
/// own root (the debug switch), the same writes land in the project.
#[test]
fn a_sandbox_inside_keeps_its_own_view() {
    if nix::unistd::Uid::current().is_root() {
        // As in hardening::nested_bwrap_runs_inside: uid 0 without capabilities cannot
        // map a nested user namespace; scripts/test runs this as an ordinary user.
        eprintln!("a sandbox inside: skipped as root, checked as a normal user");
        return;
    }
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let p = proj.to_str().unwrap();
    // Each write from inside the inner sandbox, through a symlink in its own /tmp that
    // names the project by its absolute path: a file, a final symlink, a directory, a
    // rename, a hard link (followed symlink), and a `..` walk back up from the symlink.
    let inner = format!(
        "cd /tmp; ln -s '{p}' pj; echo x > made; \
         echo x > pj/via-dir 2>/dev/null; ln -s '{p}/via-final' fl; echo x > fl 2>/dev/null; \
         mkdir pj/via-mkdir 2>/dev/null; mv made pj/via-rename 2>/dev/null; \
         echo y > other; ln -L other pj/via-link 2>/dev/null; \
         echo x > 'pj/../{base}/via-dotdot' 2>/dev/null; \
         echo x > '{p}/direct' 2>/dev/null || echo direct-refused; echo inner-done",
        base = proj.file_name().unwrap().to_str().unwrap()
    );
    let run_inner = |walk: bool| {
        let mut c = w.cmd(&proj);
        if !walk {
            c.env("CLAUDEBOX_TEST_SUPERVISOR_NO_WALK", "1");
        }
        let o = c
            .args(["--exec", "bwrap", "--unshare-user", "--unshare-pid"])
            .args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"])
            .args(["--tmpfs", "/tmp", "--ro-bind", p, p])
            .args(["--die-with-parent", "--", "sh", "-c", &inner])
            .output()
            .unwrap();
        assert!(
            stdout(&o).contains("direct-refused") && stdout(&o).contains("inner-done"),
            "{}{}",
            stdout(&o),
            stderr(&o)
        );
        let mut made: Vec<String> = std::fs::read_dir(&proj)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("via-"))
            .collect();
        made.sort();
        for n in &made {
            let _ =
                std::fs::remove_file(proj.join(n)).or_else(|_| std::fs::remove_dir(proj.join(n)));
        }
        made
    };
    assert_eq!(
        run_inner(true),
        Vec::<String>::new(),
        "the inner sandbox's read-only project was written"
    );
    let control = run_inner(false);
    // Without the walk a symlink in the middle of a path leads out of the inner view; a
    // final symlink was already followed from the caller's root, and mv and ln work from
    // a descriptor of the inner view (or cross filesystems): refused either way.
    for n in ["via-dir", "via-mkdir", "via-dotdot"] {
        assert!(
            control.iter().any(|m| m == n),
            "control: {n} not made: {control:?}"
        );
    }
}
