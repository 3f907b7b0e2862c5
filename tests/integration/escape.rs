//! The escape suite: a hostile agent inside the sandbox tries, for real, to read the real
//! home, reach host IPC endpoints, type into the user's terminal, touch host processes,
//! gain privileges and plant code that the host runs later. Every attempt must fail;
//! `controls_*` prove that the same attempts succeed where nothing stops them, so a pass
//! here means something.

mod bwrap_parents;
mod claude_home;
mod codex_home;
mod codex_login;
mod commondir;
mod credentials;
mod deep_tree;
mod exhaust;
mod gc_walk;
mod gpu;
mod host_ports;
mod host_writes;
mod project_files;
mod race;
mod shared_dirs;
mod shared_loopback;
mod state_races;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::BIN;
use lab::*;

const HELPERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/helpers");
const MARK: &str = "ESCAPED";

/// `python3 -c CODE` as shell text.
fn py(code: &str) -> String {
    format!("python3 -c {}", sq(code))
}

/// Single-quotes for sh.
fn sq(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn helper(name: &str) -> String {
    format!("{HELPERS}/{name}")
}

/// Python that connects to the unix socket `$1` (`@name` for an abstract one).
const CONNECT_PY: &str = r#"
import socket, sys
a = sys.argv[1]
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0" + a[1:] if a.startswith("@") else a)
    print("ESCAPED connected to", a)
except OSError as e:
    print("connect failed:", e)
"#;

fn connect(addr_expr: &str) -> String {
    format!("python3 -c {} {addr_expr}", sq(CONNECT_PY))
}

/// ioctl(fd of /dev/tty, REQUEST, "#"); `ESCAPED` when the kernel accepted it.
fn tty_ioctl(request: u64) -> String {
    py(&format!(
        r##"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/dev/tty", os.O_RDWR)
c = ctypes.c_char(b"#")
r = libc.ioctl(fd, ctypes.c_ulong({request}), ctypes.byref(c))
e = ctypes.get_errno()
print("ESCAPED ioctl accepted" if r == 0 else "ioctl failed: errno %d" % e)
"##
    ))
}

/// The world every attempt runs in: a home full of secrets, host IPC endpoints, a host
/// process, and a project with every kind of code-bearing path.
struct Arena {
    w: World,
    proj: PathBuf,
    linked: PathBuf,
    run: PathBuf,
    markers: PathBuf,
    listeners: Child,
    host_proc: Child,
    abstract_x11: String,
    abstract_dbus: String,
}

impl Drop for Arena {
    fn drop(&mut self) {
        let _ = self.listeners.kill();
        let _ = self.listeners.wait();
        let _ = self.host_proc.kill();
        let _ = self.host_proc.wait();
        let _ = fs::remove_file(host_tmp_secret());
    }
}

const SECRETS: &[&str] = &[
    ".ssh/id_ed25519",
    ".aws/credentials",
    ".config/gcloud/credentials.db",
    ".docker/config.json",
    ".npmrc",
    ".netrc",
    ".git-credentials",
    ".bash_history",
    ".mozilla/firefox/abc.default/cookies.sqlite",
    ".config/google-chrome/Default/Login Data",
    "src/other-project/secret.txt",
    ".claudebox/projects/0123456789abcdef/claude-projects/-other/conv.jsonl",
    ".claude/projects/-other-project/conversation.jsonl",
];

/// A secret in the host's /tmp (the sandbox gets a fresh one).
fn host_tmp_secret() -> PathBuf {
    std::env::temp_dir().join(format!("claudebox-escape-secret-{}", std::process::id()))
}

fn write(p: &Path, s: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, s).unwrap();
}

impl Arena {
    fn new() -> Arena {
        let w = World::new(BIN);
        let home = w.home();
        for (i, rel) in SECRETS.iter().enumerate() {
            write(&home.join(rel), &format!("SECRET-{i}\n"));
        }
        write(
            &home.join(".gitconfig"),
            "[user]\n\tname = T\n\temail = t@example.com\n",
        );
        write(&w.work().join("other/secret.txt"), "SECRET-other-dir\n");
        write(&host_tmp_secret(), "SECRET-host-tmp\n");

        // The project: hooks, config, core.hooksPath in the tree, .envrc, .vscode, .idea,
        // a submodule and a linked worktree.
        let lib = w.dir("lib");
        init_repo(&lib);
        let proj = w.dir("proj");
        init_repo(&proj);
        git(
            &proj,
            &["submodule", "add", "-q", lib.to_str().unwrap(), "sub"],
        );
        git(&proj, &["commit", "-qm", "sub"]);
        git(&proj, &["config", "core.hooksPath", ".githooks"]);
        write(&proj.join(".githooks/pre-commit"), "#!/bin/sh\nexit 0\n");
        write(&proj.join(".envrc"), "export A=1\n");
        write(&proj.join(".vscode/settings.json"), "{}\n");
        write(&proj.join(".idea/workspace.xml"), "<project/>\n");
        let linked = w.work().join("proj-linked");
        git(&proj, &["worktree", "add", "-q", linked.to_str().unwrap()]);

        let run = w.root().join("run");
        let markers = w.root().join("markers");
        fs::create_dir_all(run.join("user/bus-dir")).unwrap();
        fs::create_dir_all(&markers).unwrap();
        let tag = w.root().file_name().unwrap().to_str().unwrap().to_string();
        let abstract_x11 = format!("@/tmp/.X11-unix/X-{tag}");
        let abstract_dbus = format!("@/tmp/dbus-claudebox-test-{tag}");
        let mut listeners = Command::new("python3")
            .arg(helper("listeners.py"))
            .arg(&markers)
            .arg(run.join("ssh-agent.sock"))
            .arg(run.join("docker.sock"))
            .arg(run.join("user/bus"))
            .arg(&abstract_x11)
            .arg(&abstract_dbus)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 listeners");
        let mut line = String::new();
        BufReader::new(listeners.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "READY", "listeners did not start");

        let host_proc = Command::new("sleep")
            .arg("987654")
            .env("HOST_PROC_SECRET", "SECRET-host-process-env")
            .spawn()
            .unwrap();
        Arena {
            w,
            proj,
            linked,
            run,
            markers,
            listeners,
            host_proc,
            abstract_x11,
            abstract_dbus,
        }
    }

    /// claudebox in `cwd` with the host session's IPC variables set, as a desktop has them.
    fn cmd(&self, cwd: &Path, wrapper: &[String]) -> Command {
        let base = self.w.cmd(cwd);
        let mut c = if wrapper.is_empty() {
            base
        } else {
            let mut c = Command::new(&wrapper[0]);
            c.args(&wrapper[1..]).arg(BIN).current_dir(cwd).env_clear();
            for (k, v) in base.get_envs() {
                if let Some(v) = v {
                    c.env(k, v);
                }
            }
            c
        };
        let run = &self.run;
        c.env("SSH_AUTH_SOCK", run.join("ssh-agent.sock"))
            .env(
                "DOCKER_HOST",
                format!("unix://{}", run.join("docker.sock").display()),
            )
            .env("XDG_RUNTIME_DIR", run.join("user"))
            .env(
                "DBUS_SESSION_BUS_ADDRESS",
                format!("unix:abstract={}", &self.abstract_dbus[1..]),
            )
            .env("DISPLAY", format!(":{}", 1000 + std::process::id() % 50000))
            .env("WAYLAND_DISPLAY", "wayland-0")
            .env("XAUTHORITY", self.w.home().join(".Xauthority"))
            .env("GPG_AGENT_INFO", run.join("gpg-agent.sock"))
            // What the agent could learn anyway (paths, pids): given to the attempts.
            .env("T_RUN", run)
            .env("T_HOME", self.w.home())
            .env("T_WORLD", self.w.root())
            .env("T_HOSTPID", self.host_proc.id().to_string())
            .env("T_X11", &self.abstract_x11)
            .env("T_DBUS", &self.abstract_dbus)
            .env("T_PROJ", &self.proj)
            .env("T_COMMON", self.proj.join(".git"))
            .env("T_LINKED", &self.linked)
            .env("T_HOSTTMP", host_tmp_secret());
        c
    }
}

#[derive(Clone, Copy)]
enum Via {
    Plain,
    Pty,
    Keyring,
}

/// Host-side evidence that an attempt got out.
type HostCheck = Box<dyn Fn(&Arena) -> bool>;

struct Attempt {
    name: &'static str,
    /// Shell code run inside; it prints `ESCAPED` when it got out.
    script: String,
    /// Where it runs: the project or the linked worktree.
    linked: bool,
    via: Via,
    /// Host-side evidence of success, checked after the run.
    host_check: Option<HostCheck>,
    /// claudebox options and environment for this launch (a control's opt-out, a state
    /// directory).
    args: Vec<String>,
    env: Vec<(&'static str, PathBuf)>,
    /// A launch that claudebox refuses (one line on stderr) counts as stopped.
    refusal_stops_it: bool,
    /// claudebox may end the sandbox mid-attempt, saying this on stderr (the attempt is
    /// then judged by its host check alone: what it planted must not be there).
    ended_by: Option<&'static str>,
}

fn attempt(name: &'static str, script: impl Into<String>) -> Attempt {
    Attempt {
        name,
        script: script.into(),
        linked: false,
        via: Via::Plain,
        host_check: None,
        args: Vec::new(),
        env: Vec::new(),
        refusal_stops_it: false,
        ended_by: None,
    }
}

impl Attempt {
    fn in_linked_worktree(mut self) -> Attempt {
        self.linked = true;
        self
    }
    fn via(mut self, via: Via) -> Attempt {
        self.via = via;
        self
    }
    fn host_check(mut self, f: impl Fn(&Arena) -> bool + 'static) -> Attempt {
        self.host_check = Some(Box::new(f));
        self
    }
    fn env(mut self, name: &'static str, value: PathBuf) -> Attempt {
        self.env.push((name, value));
        self
    }
    fn refusal_stops_it(mut self) -> Attempt {
        self.refusal_stops_it = true;
        self
    }
    fn may_be_ended_by(mut self, line: &'static str) -> Attempt {
        self.ended_by = Some(line);
        self
    }
}

/// Shell code writing a script to `path_expr`. Success is judged on the host (writing
/// into the sandbox's own tmpfs home or /tmp succeeds and is harmless).
fn plant(path_expr: &str) -> String {
    format!(
        "mkdir -p \"$(dirname {path_expr})\" 2>/dev/null; \
         printf '#!/bin/sh\\necho PLANTED\\n' > {path_expr}"
    )
}

fn contains_planted(p: &Path) -> bool {
    fs::read_to_string(p).is_ok_and(|s| s.contains("PLANTED"))
}

fn attempts(a: &Arena) -> Vec<Attempt> {
    let mut v = claude_home::attempts(a);
    v.extend(codex_home::attempts(a));
    v.extend(project_files::attempts(a));
    v.extend(host_ports::attempts(a));
    v.extend(gpu::attempts(a));

    // 1. Read the real home: keys, credentials, browser profiles, other projects, history.
    for rel in SECRETS {
        v.push(attempt(
            "read a secret of the real home",
            format!(
                "cat \"$T_HOME\"/{} 2>/dev/null | grep -q SECRET && echo {MARK}",
                sq(rel)
            ),
        ));
    }
    v.push(attempt(
        "find any planted secret anywhere in the test world",
        format!("grep -rqs SECRET- \"$T_WORLD\" && echo {MARK}"),
    ));
    v.push(attempt(
        "read another project next to this one",
        format!("cat \"$T_WORLD\"/work/other/secret.txt 2>/dev/null && echo {MARK}"),
    ));
    v.push(attempt(
        "read the host's /tmp",
        format!("cat \"$T_HOSTTMP\" 2>/dev/null | grep -q SECRET && echo {MARK}"),
    ));

    // 2. Host IPC endpoints and the variables naming them.
    for var in [
        "SSH_AUTH_SOCK",
        "DOCKER_HOST",
        "XDG_RUNTIME_DIR",
        "DBUS_SESSION_BUS_ADDRESS",
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "XAUTHORITY",
        "GPG_AGENT_INFO",
    ] {
        v.push(attempt(
            "receive a variable naming a host socket",
            format!("[ -n \"${{{var}+set}}\" ] && echo {MARK} {var}"),
        ));
    }
    for (name, idx, addr) in [
        ("connect to the ssh agent", 0, "\"$T_RUN/ssh-agent.sock\""),
        ("connect to docker.sock", 1, "\"$T_RUN/docker.sock\""),
        (
            "connect to the D-Bus socket in XDG_RUNTIME_DIR",
            2,
            "\"$T_RUN/user/bus\"",
        ),
        ("connect to the X11 abstract socket", 3, "\"$T_X11\""),
        ("connect to the D-Bus abstract socket", 4, "\"$T_DBUS\""),
    ] {
        let marker = a.markers.join(idx.to_string());
        v.push(attempt(name, connect(addr)).host_check(move |_| marker.exists()));
    }
    v.push(attempt(
        "list the host's runtime dirs (/run/user, XDG_RUNTIME_DIR)",
        format!("ls /run/user \"$T_RUN/user\" 2>/dev/null | grep -q . && echo {MARK}"),
    ));
    v.push(
        attempt(
            "read the host session's kernel keyring",
            py(include_str!("../helpers/keyring_read.py")),
        )
        .via(Via::Keyring),
    );

    // 3. Type into the user's terminal.
    v.push(attempt("TIOCSTI into the controlling terminal", tty_ioctl(0x5412)).via(Via::Pty));
    v.push(
        attempt(
            "TIOCSTI with junk in the request's high 32 bits",
            tty_ioctl(0xdead_0000_5412),
        )
        .via(Via::Pty),
    );
    v.push(
        attempt(
            "TIOCLINUX reaches the terminal driver (filter must answer EPERM)",
            py(r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/dev/tty", os.O_RDWR)
c = ctypes.c_char(b"\x02")
r = libc.ioctl(fd, ctypes.c_ulong(0x541C), ctypes.byref(c))
e = ctypes.get_errno()
print("ESCAPED driver answered" if r == 0 or e != 1 else "blocked: EPERM")
"#),
        )
        .via(Via::Pty),
    );

    // 4. Host processes.
    v.push(attempt(
        "see a host process in /proc",
        // The pattern is not the literal, so this shell's own cmdline does not match.
        format!("grep -qs '98765[4]' /proc/[0-9]*/cmdline && echo {MARK}"),
    ));
    v.push(attempt(
        "read a host process's environment",
        format!("grep -qs SECRET- /proc/\"$T_HOSTPID\"/environ && echo {MARK}"),
    ));
    v.push(
        attempt(
            "kill a host process",
            format!("kill -KILL \"$T_HOSTPID\" 2>/dev/null && echo {MARK}"),
        )
        .host_check(|a| {
            // Still running: /proc/<pid> of the host shows it and it is not a zombie.
            !fs::read_to_string(format!("/proc/{}/stat", a.host_proc.id()))
                .is_ok_and(|s| !s.contains(") Z "))
        }),
    );
    v.push(attempt(
        "ptrace a host process",
        py(r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pid = int(os.environ["T_HOSTPID"])
r = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
print("ESCAPED attached" if r == 0 else "ptrace failed: errno %d" % ctypes.get_errno())
"#),
    ));

    // 5. Privileges.
    v.push(attempt(
        "hold an effective capability",
        format!("grep -q '^CapEff:[[:space:]]*0*$' /proc/self/status || echo {MARK}"),
    ));
    v.push(attempt(
        "gain privileges through a setuid-root binary (su)",
        format!(
            "python3 -c {} su -c 'sleep 5' root | sed 's/ELEVATED/{MARK}/'",
            sq(include_str!("../helpers/setuid_probe.py"))
        ),
    ));
    v.push(attempt(
        "remount the system read-write",
        format!("mount -o remount,rw /usr 2>/dev/null && echo {MARK}"),
    ));
    v.push(
        attempt(
            "write into the system",
            plant("/usr/local/bin/claudebox-planted"),
        )
        .host_check(|_| Path::new("/usr/local/bin/claudebox-planted").exists()),
    );

    // 6. Plant code that the host runs later.
    let proj = a.proj.clone();
    let common = a.proj.join(".git");
    let home = a.w.home();
    let mut host_file = |name: &'static str, script: String, path: PathBuf| {
        v.push(attempt(name, script).host_check(move |_| contains_planted(&path)));
    };
    host_file(
        "write a git hook",
        plant("\"$T_COMMON\"/hooks/post-checkout"),
        common.join("hooks/post-checkout"),
    );
    host_file(
        "overwrite an existing git hook sample",
        plant("\"$T_COMMON\"/hooks/pre-commit.sample"),
        common.join("hooks/pre-commit.sample"),
    );
    host_file(
        "write a hook in core.hooksPath inside the project",
        plant(".githooks/pre-commit"),
        proj.join(".githooks/pre-commit"),
    );
    host_file(
        "write a submodule's hook",
        plant("\"$T_COMMON\"/modules/sub/hooks/post-checkout"),
        common.join("modules/sub/hooks/post-checkout"),
    );
    host_file("write .envrc", plant(".envrc"), proj.join(".envrc"));
    host_file(
        "write .vscode/tasks.json",
        plant(".vscode/tasks.json"),
        proj.join(".vscode/tasks.json"),
    );
    host_file(
        "write .idea/workspace.xml",
        plant(".idea/workspace.xml"),
        proj.join(".idea/workspace.xml"),
    );
    host_file(
        "replace .envrc through a rename",
        format!(
            "{}; mv -f /tmp/x .envrc 2>/dev/null && echo {MARK}",
            plant("/tmp/x")
        ),
        proj.join(".envrc"),
    );
    host_file(
        "replace .envrc with a symlink to a planted file",
        format!(
            "{}; rm -f .envrc 2>/dev/null; ln -s p .envrc 2>/dev/null && echo {MARK}",
            plant("p")
        ),
        proj.join(".envrc"),
    );
    host_file(
        "write ~/.gitconfig (core.hooksPath for every repo)",
        format!(
            "git config --global core.hooksPath /tmp/h 2>/dev/null; \
             printf 'PLANTED' >> ~/.gitconfig 2>/dev/null && echo {MARK}"
        ),
        home.join(".gitconfig"),
    );
    host_file("write ~/.bashrc", plant("~/.bashrc"), home.join(".bashrc"));
    host_file(
        "write into another project",
        plant("\"$T_WORLD\"/work/other/run.sh"),
        a.w.work().join("other/run.sh"),
    );
    let git_config_fsmonitor = |p: &Path| {
        fs::read_to_string(p).is_ok_and(|s| s.contains("fsmonitor") || s.contains("PLANTED"))
    };
    let c = common.join("config");
    v.push(
        attempt(
            "git config core.fsmonitor (runs on every git status)",
            format!("git config core.fsmonitor 'echo PLANTED' 2>/dev/null && echo {MARK}"),
        )
        .host_check(move |_| git_config_fsmonitor(&c)),
    );
    let c = common.join("config");
    v.push(
        attempt(
            "rename a new file over .git/config",
            format!(
                "cp .git/config /tmp/c; printf '[core]\\n\\tfsmonitor = echo PLANTED\\n' >> /tmp/c; \
                 mv -f /tmp/c .git/config 2>/dev/null && echo {MARK}"
            ),
        )
        .host_check(move |_| git_config_fsmonitor(&c)),
    );
    let c = common.join("modules/sub/config");
    v.push(
        attempt(
            "write a submodule's git config",
            format!(
                "printf 'PLANTED' >> \"$T_COMMON\"/modules/sub/config 2>/dev/null && echo {MARK}"
            ),
        )
        .host_check(move |_| git_config_fsmonitor(&c)),
    );
    let c = common.join("hooks");
    v.push(
        attempt(
            "move .git/hooks aside and make a new one",
            format!(
                "mv .git/hooks .git/hooks.old 2>/dev/null && mkdir .git/hooks && {}",
                plant(".git/hooks/post-commit")
            ),
        )
        .host_check(move |_| contains_planted(&c.join("post-commit"))),
    );
    let p = proj.clone();
    v.push(
        attempt(
            "move .git aside and make a new one with a fsmonitor",
            format!(
                "mv .git .git.old 2>/dev/null && cp -r .git.old .git && \
                 git config core.fsmonitor 'echo PLANTED' && echo {MARK}"
            ),
        )
        .host_check(move |_| p.join(".git.old").exists()),
    );
    let p = proj.join("sub/.git");
    v.push(
        attempt(
            "point a submodule's .git file at a planted git dir",
            format!("echo 'gitdir: /tmp/evil' > sub/.git 2>/dev/null && echo {MARK}"),
        )
        .host_check(move |_| fs::read_to_string(&p).is_ok_and(|s| s.contains("evil"))),
    );
    let m = common.join("modules");
    v.push(
        attempt(
            "move the submodules' git dirs aside",
            format!("mv \"$T_COMMON\"/modules/sub \"$T_COMMON\"/modules/sub.old 2>/dev/null && echo {MARK}"),
        )
        .host_check(move |_| m.join("sub.old").exists()),
    );

    // From a linked worktree: the common dir lies outside the work tree.
    let l = a.linked.join(".git");
    v.push(
        attempt(
            "linked worktree: point .git at a planted git dir",
            format!("echo 'gitdir: /tmp/evil' > .git 2>/dev/null && echo {MARK}"),
        )
        .in_linked_worktree()
        .host_check(move |_| fs::read_to_string(&l).is_ok_and(|s| s.contains("evil"))),
    );
    let wtname = a.linked.file_name().unwrap().to_owned();
    let cd = common.join("worktrees").join(&wtname).join("commondir");
    v.push(
        attempt(
            "linked worktree: rewrite commondir",
            format!(
                "echo /tmp/evil > \"$T_COMMON\"/worktrees/{}/commondir 2>/dev/null && echo {MARK}",
                wtname.to_str().unwrap()
            ),
        )
        .in_linked_worktree()
        .host_check(move |_| fs::read_to_string(&cd).is_ok_and(|s| s.contains("evil"))),
    );
    let wt_dir = common.join("worktrees");
    v.push(
        attempt(
            "linked worktree: move its git dir aside",
            format!(
                "mv \"$T_COMMON\"/worktrees/{n} \"$T_COMMON\"/worktrees/{n}.old 2>/dev/null && echo {MARK}",
                n = wtname.to_str().unwrap()
            ),
        )
        .in_linked_worktree()
        .host_check(move |_| fs::read_dir(&wt_dir).unwrap().count() != 1),
    );
    let h = common.join("hooks/post-merge");
    v.push(
        attempt(
            "linked worktree: write the common dir's hook",
            plant("\"$T_COMMON\"/hooks/post-merge"),
        )
        .in_linked_worktree()
        .host_check(move |_| contains_planted(&h)),
    );
    let c = common.join("config");
    v.push(
        attempt(
            "linked worktree: git config core.fsmonitor",
            format!("git config core.fsmonitor 'echo PLANTED' 2>/dev/null && echo {MARK}"),
        )
        .in_linked_worktree()
        .host_check(move |_| git_config_fsmonitor(&c)),
    );
    v
}

fn run_attempt(a: &Arena, at: &Attempt) -> (bool, String) {
    let cwd = if at.linked { &a.linked } else { &a.proj };
    let script = format!("{}\necho ATTEMPT-RAN", at.script);
    let wrapper: Vec<String> = match at.via {
        Via::Plain => vec![],
        Via::Pty => vec![
            "python3".into(),
            helper("pty_run.py"),
            "24".into(),
            "80".into(),
            "--".into(),
        ],
        Via::Keyring => vec![
            "python3".into(),
            helper("keyring_run.py"),
            "SECRET-keyring".into(),
            "--".into(),
        ],
    };
    let mut cmd = a.cmd(cwd, &wrapper);
    cmd.envs(at.env.iter().map(|(k, v)| (k, v)));
    let out: Output = cmd
        .args(&at.args)
        .args(["--exec", "sh", "-c", &script])
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&out), stderr(&out));
    if at.refusal_stops_it && !out.status.success() {
        assert!(
            stdout(&out).is_empty() && stderr(&out).lines().count() == 1,
            "attempt {:?}: a refusal is one line on stderr:\n{text}",
            at.name
        );
        return (false, text);
    }
    if let Some(line) = at.ended_by {
        if !out.status.success() && stderr(&out).contains(line) {
            let host = at.host_check.as_ref().is_some_and(|f| f(a));
            return (host, text);
        }
    }
    assert!(
        out.status.success() && text.contains("ATTEMPT-RAN"),
        "attempt {:?} did not run to its end:\n{text}",
        at.name
    );
    let inside = stdout(&out).lines().any(|l| l.contains(MARK));
    let host = at.host_check.as_ref().is_some_and(|f| f(a));
    (inside || host, text)
}

/// How many arenas the suite's one-launch attempts are dealt to: each arena (its own
/// home, project, listeners) runs its share one after the other, beside the others. An
/// arena's attempts may end each other's sandboxes (a commondir planted in the main git
/// dir ends every sandbox of the project): the arenas share nothing, so they cannot.
const ARENAS: usize = 3;

/// A group of attempts that take more than one launch: each attempt's name, and whether
/// it got out.
type Group = fn() -> Vec<(&'static str, bool)>;

/// An arena's attempts: how many it made, and the name, outcome and output of its share.
type Dealt = (usize, Vec<(&'static str, bool, String)>);

/// The attempts that take more than one launch (tests/integration/escape/race.rs and the
/// rest), each making its own world: in threads of groups beside the arenas, the groups
/// of a thread one after the other (each thread about the same time). Not `shared_dirs`:
/// it launches at `/tmp` itself, whose review at the sandbox's end moves aside what other
/// worlds under `/tmp` made meanwhile (a linked worktree's commondir): it runs after them.
const MORE: [&[(&str, Group)]; 3] = [
    &[
        ("credentials", credentials::attempts),
        ("race", race::attempts),
        ("host_writes", host_writes::attempts),
        ("codex_home", codex_home::attempts_more),
        ("codex_login", codex_login::attempts),
        ("deep_tree", deep_tree::attempts),
    ],
    &[
        ("state_races", state_races::attempts),
        ("gc_walk", gc_walk::attempts),
        ("shared_loopback", shared_loopback::attempts),
        ("exhaust", exhaust::attempts),
    ],
    &[
        ("login_broker", crate::login_broker::attempts),
        ("commondir", commondir::attempts),
        ("bwrap_parents", bwrap_parents::attempts),
    ],
];

/// Shows how long a part of the suite took (scripts/test's output keeps it).
fn took<R>(what: &str, f: impl FnOnce() -> R) -> R {
    let t = std::time::Instant::now();
    let r = f();
    eprintln!("{what}: {:.1} s", t.elapsed().as_secs_f64());
    r
}

/// A thread's result; its panic goes on as the test's.
fn joined<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

#[test]
fn escape_suite() {
    let _heavy = lab::heavy();
    let t0 = std::time::Instant::now();
    // No launch at /tmp itself (shared_dirs, of this run or the other user's) while the
    // arenas and the groups make their worlds under /tmp: its review at the sandbox's end
    // moves aside the git dirs made there meanwhile.
    let tmp = lab::machine_lock_shared("tmp-as-project");
    let (dealt, more) = std::thread::scope(|s| {
        let arenas: Vec<_> = (0..ARENAS)
            .map(|k| {
                s.spawn(move || {
                    let arena = Arena::new();
                    let attempts = attempts(&arena);
                    let n = attempts.len();
                    let ran: Vec<(&'static str, bool, String)> =
                        took(&format!("escape suite: arena {k}"), || {
                            attempts
                                .iter()
                                .skip(k)
                                .step_by(ARENAS)
                                .map(|at| {
                                    let (escaped, text) = run_attempt(&arena, at);
                                    (at.name, escaped, text)
                                })
                                .collect()
                        });
                    (n, ran)
                })
            })
            .collect();
        let more: Vec<_> = MORE
            .iter()
            .map(|groups| {
                s.spawn(move || {
                    groups
                        .iter()
                        .flat_map(|(group, f)| took(&format!("escape suite: {group}"), f))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let dealt: Vec<Dealt> = arenas.into_iter().map(joined).collect();
        let more: Vec<(&'static str, bool)> = more.into_iter().flat_map(joined).collect();
        (dealt, more)
    });
    drop(tmp);
    let mut more = more;
    more.extend(took("escape suite: shared_dirs", shared_dirs::attempts));
    // Every arena made the same attempts and ran its share of them.
    let made = dealt[0].0;
    assert!(dealt.iter().all(|(n, _)| *n == made));
    let ran: Vec<_> = dealt.into_iter().flat_map(|(_, ran)| ran).collect();
    assert_eq!(ran.len(), made);
    let mut succeeded = Vec::new();
    for (name, escaped, text) in &ran {
        if *escaped {
            eprintln!("ESCAPE: {name}\n{text}");
            succeeded.push(*name);
        }
    }
    for (name, escaped) in &more {
        if *escaped {
            eprintln!("ESCAPE: {name}");
            succeeded.push(name);
        }
    }
    eprintln!("escape suite: {:.1} s in all", t0.elapsed().as_secs_f64());
    lab::figure!(
        "{} escape attempts, {} succeeded",
        ran.len() + more.len(),
        succeeded.len()
    );
    assert!(succeeded.is_empty(), "escapes: {succeeded:#?}");
}

/// The same kinds of attempts where nothing stops them: on the host, or inside with the
/// protection turned off. Each must succeed, or the suite above proves nothing.
#[test]
fn controls_show_the_attempts_can_succeed() {
    let _heavy = lab::heavy();
    // As in the suite: no launch at /tmp itself meanwhile; shared_dirs' controls last.
    let tmp = lab::machine_lock_shared("tmp-as-project");
    let arena = Arena::new();
    let host = |script: &str| -> String {
        let o = Command::new("sh")
            .args(["-c", script])
            .env("T_X11", &arena.abstract_x11)
            .env("T_RUN", &arena.run)
            .env("T_HOME", arena.w.home())
            .env("T_HOSTPID", arena.host_proc.id().to_string())
            .output()
            .unwrap();
        stdout(&o)
    };
    // Reading a secret, connecting to sockets, reading a process environment: on the host.
    assert!(host(&format!(
        "cat \"$T_HOME\"/.ssh/id_ed25519 | grep -q SECRET && echo {MARK}"
    ))
    .contains(MARK));
    assert!(host(&connect("\"$T_X11\"")).contains(MARK));
    assert!(host(&connect("\"$T_RUN/ssh-agent.sock\"")).contains(MARK));
    assert!(host(&format!(
        "grep -qs SECRET- /proc/\"$T_HOSTPID\"/environ && echo {MARK}"
    ))
    .contains(MARK));
    // The keyring: read on the host through the same wrapper.
    let o = Command::new("python3")
        .args([&helper("keyring_run.py"), "SECRET-keyring", "--", "python3"])
        .arg(helper("keyring_read.py"))
        .output()
        .unwrap();
    assert!(stdout(&o).contains(MARK), "keyring control: {}", stdout(&o));
    // su elevates on the host.
    let o = Command::new("python3")
        .arg(helper("setuid_probe.py"))
        .args(["su", "-c", "sleep 5", "root"])
        .output()
        .unwrap();
    assert!(
        stdout(&o).contains("ELEVATED"),
        "setuid control: {}",
        stdout(&o)
    );
    // TIOCSTI works on a host pty when the kernel still allows it.
    if fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti").is_ok_and(|s| s.trim() == "1") {
        let o = Command::new("python3")
            .args([&helper("pty_run.py"), "24", "80", "--", "sh", "-c"])
            .arg(tty_ioctl(0xdead_0000_5412))
            .output()
            .unwrap();
        assert!(stdout(&o).contains(MARK), "TIOCSTI control: {}", stdout(&o));
    }
    let timed = |name: &str, f: &dyn Fn()| took(&format!("escape controls: {name}"), f);
    timed("claude_home", &|| claude_home::controls(&arena));
    timed("codex_home", &|| codex_home::controls(&arena));
    timed("codex_login", &codex_login::controls);
    // Inside with --writable-project-config, planting a hook and a config works.
    let o = arena
        .cmd(&arena.proj, &[])
        .args(["--writable-project-config", "--exec", "sh", "-c"])
        .arg(format!(
            "{} && git config core.fsmonitor 'echo PLANTED' && echo CONFIG-OK",
            plant(".git/hooks/post-commit")
        ))
        .output()
        .unwrap();
    assert!(stdout(&o).contains("CONFIG-OK"), "{}", stderr(&o));
    assert!(contains_planted(&arena.proj.join(".git/hooks/post-commit")));
    timed("project_files", &|| project_files::controls(&arena));
    timed("host_ports", &|| host_ports::controls(&arena));
    timed("gpu", &|| gpu::controls(&arena));
    // The launch race and an inherited descriptor, with sources bound by name and
    // descriptors left open.
    timed("race", &race::controls);
    timed("credentials", &credentials::controls);
    timed("host_writes", &host_writes::controls);
    timed("gc_walk", &gc_walk::controls);
    timed("state_races", &state_races::controls);
    timed("shared_loopback", &shared_loopback::controls);
    timed("deep_tree", &deep_tree::controls);
    timed("exhaust", &exhaust::controls);
    timed("bwrap_parents", &bwrap_parents::controls);
    drop(tmp);
    timed("shared_dirs", &shared_dirs::controls);
}

/// A symlink planted at a protected path (say by an earlier session with the protection
/// off) would make the next launch bind whatever it points at: the launch refuses.
#[test]
fn a_symlink_at_a_protected_path_is_refused() {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    write(&w.home().join(".ssh/id_ed25519"), "SECRET-ssh\n");
    std::os::unix::fs::symlink(w.home().join(".ssh"), proj.join(".vscode")).unwrap();
    let o = w.run_claude(&proj, ["x"], "cat .vscode/id_ed25519");
    assert!(!o.status.success());
    assert!(!stdout(&o).contains("SECRET"));
    assert!(stderr(&o).contains("symlink"), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    // The user can still opt out knowingly.
    let o = w.run_claude(&proj, ["--writable-project-config"], "echo STARTED");
    assert!(stdout(&o).contains("STARTED"), "{}", stderr(&o));
}
