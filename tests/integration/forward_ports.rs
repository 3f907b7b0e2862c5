//! Host services when the network is filtered: `--forward-port` and `forward_ports`, for
//! real. Host listeners on the host's 127.0.0.1 (one forwarded, one not), bwrap with its
//! own network namespace, python3 inside as the agent's client. The forwarded port
//! answers in allowlist and none mode; the other port does not (also not through the
//! proxy's CONNECT), and in none mode nothing else answers (3128 refused). Controls: the
//! same connect succeeds with `--network open`, and when that port is forwarded. The
//! hostile attempts (reach another port through a forward, and the rest) are in
//! `escape/host_ports.rs`.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::BIN;
use lab::*;

/// A host service on 127.0.0.1: answers every connection with `HELLO <name>` and the first
/// line it got, and records those lines (the bytes the agent sent, as the host saw them).
pub struct HostPort {
    pub port: u16,
    pub hits: Arc<AtomicUsize>,
    pub got: Arc<Mutex<Vec<String>>>,
}

impl HostPort {
    pub fn start(name: &'static str) -> HostPort {
        HostPort::start_on("127.0.0.1:0", name)
    }
    /// The same on `addr` (`0.0.0.0:0`: every address of the host).
    pub fn start_on(addr: &str, name: &'static str) -> HostPort {
        let l = TcpListener::bind(addr).unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (h, g) = (hits.clone(), got.clone());
        thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                h.fetch_add(1, Ordering::SeqCst);
                let g = g.clone();
                thread::spawn(move || {
                    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = [0u8; 512];
                    let n = c.read(&mut buf).unwrap_or(0);
                    let first = String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_string();
                    let _ = c.write_all(format!("HELLO {name} got={first}\n").as_bytes());
                    g.lock().unwrap().push(first);
                });
            }
        });
        HostPort { port, hits, got }
    }
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Python inside: connect to `host:port`, send a line, print `<tag> OK <answer>` or
/// `<tag> REFUSED <error>`.
pub fn probe(tag: &str, host: &str, port: u16) -> String {
    format!(
        "python3 -c '
import socket, sys
try:
    s = socket.create_connection((\"{host}\", {port}), timeout=10)
    s.sendall(b\"ping from {tag}\\n\")
    print(\"{tag} OK\", s.recv(200).decode().strip())
except OSError as e:
    print(\"{tag} REFUSED\", e)
'\n"
    )
}

fn project(w: &World) -> PathBuf {
    w.dir("proj")
}

fn run(w: &World, args: &[String], script: &str) -> String {
    ok(&w.run_claude(&project(w), args, script))
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_forwarded_port_is_the_hosts_service_and_nothing_else_answers() {
    let w = World::new(BIN);
    let (a, b) = (HostPort::start("A"), HostPort::start("B"));
    let (pa, pb) = (a.port.to_string(), b.port.to_string());
    // Through the proxy in allowlist mode: CONNECT to the port that is not forwarded.
    let connect_b = format!(
        "python3 -c '
import socket
s = socket.create_connection((\"127.0.0.1\", 3128), timeout=10)
s.sendall(b\"CONNECT 127.0.0.1:{pb} HTTP/1.1\\r\\nHost: 127.0.0.1:{pb}\\r\\n\\r\\n\")
print(\"VIA-PROXY\", s.recv(100).decode().splitlines()[0])
' 2>/dev/null || echo VIA-PROXY no-proxy\n"
    );
    let script = [
        probe("A4", "127.0.0.1", a.port),
        probe("Aname", "localhost", a.port),
        probe("B", "127.0.0.1", b.port),
        probe("B6", "::1", b.port),
        probe("P", "127.0.0.1", 3128),
        connect_b,
        "echo PROXYVAR=${HTTPS_PROXY:-unset}\n".into(),
        "echo SOCKETS=$(for f in /proc/$$/fd/*; do readlink $f; done | grep -c socket:)\n".into(),
    ]
    .concat();
    for mode in ["allowlist", "none"] {
        let before = a.hits();
        let out = run(
            &w,
            &args(&["--network", mode, "--forward-port", &pa]),
            &script,
        );
        assert!(
            out.contains("A4 OK HELLO A got=ping from A4"),
            "{mode}: {out}"
        );
        assert!(
            out.contains("Aname OK HELLO A got=ping from Aname"),
            "{mode}: {out}"
        );
        assert_eq!(a.hits(), before + 2, "{mode}");
        assert!(out.contains("B REFUSED"), "{mode}: {out}");
        assert!(out.contains("B6 REFUSED"), "{mode}: {out}");
        // The agent holds no socket: the bridge was closed before it started.
        assert!(out.contains("SOCKETS=0\n"), "{mode}: {out}");
        if mode == "allowlist" {
            assert!(out.contains("P OK"), "{out}");
            assert!(out.contains("VIA-PROXY HTTP/1.1 403"), "{out}");
            assert!(out.contains("PROXYVAR=http://127.0.0.1:3128"), "{out}");
        } else {
            // None stays none: no proxy inside, no proxy variables.
            assert!(out.contains("P REFUSED"), "{out}");
            assert!(out.contains("VIA-PROXY no-proxy"), "{out}");
            assert!(out.contains("PROXYVAR=unset"), "{out}");
        }
    }
    assert_eq!(b.hits(), 0, "{:?}", b.got.lock().unwrap());

    // Controls: the same connect to B succeeds in open mode, and when B is forwarded.
    let out = run(
        &w,
        &args(&["--network", "open"]),
        &probe("B", "127.0.0.1", b.port),
    );
    assert!(out.contains("B OK HELLO B"), "{out}");
    for mode in ["allowlist", "none"] {
        let out = run(
            &w,
            &args(&["--network", mode, "--forward-port", &pb]),
            &probe("B", "127.0.0.1", b.port),
        );
        assert!(out.contains("B OK HELLO B"), "{mode}: {out}");
    }
    assert_eq!(b.hits(), 3);
}

#[test]
fn one_address_forms_bring_that_address_only() {
    let w = World::new(BIN);
    let a = HostPort::start("A");
    let spec = format!("127.0.0.1:{}", a.port);
    let script = [probe("A4", "127.0.0.1", a.port), probe("A6", "::1", a.port)].concat();
    let out = run(
        &w,
        &args(&["--no-network", "--forward-port", &spec]),
        &script,
    );
    assert!(out.contains("A4 OK HELLO A"), "{out}");
    assert!(out.contains("A6 REFUSED"), "{out}");
    // The host side of `[::1]:PORT` is the host's ::1, where A does not listen: the
    // connection is closed, never sent to 127.0.0.1.
    let spec6 = format!("[::1]:{}", a.port);
    let before = a.hits();
    let out = run(
        &w,
        &args(&["--no-network", "--forward-port", &spec6]),
        &script,
    );
    assert!(out.contains("A4 REFUSED"), "{out}");
    assert!(!out.contains("A6 OK HELLO"), "{out}");
    assert_eq!(a.hits(), before);
}

fn dry(w: &World, cwd: &Path, extra: &[&str], xdg: Option<&Path>) -> Output {
    let mut c = w.cmd(cwd);
    if let Some(x) = xdg {
        c.env("XDG_CONFIG_HOME", x);
    }
    c.args(extra).arg("--dry-run").output().unwrap()
}

#[test]
fn dry_run_shows_each_forward_as_a_hole_with_its_source() {
    let w = World::new(BIN);
    let proj = project(&w);
    let out = ok(&dry(
        &w,
        &proj,
        &[
            "--network",
            "none",
            "--forward-port",
            "5432",
            "--forward-port",
            "[::1]:8080",
        ],
        None,
    ));
    assert!(
        out.contains(
            "# network: none: own network namespace with loopback only; no way out but 2 \
             forwarded host ports: localhost:5432, [::1]:8080"
        ),
        "{out}"
    );
    for row in [
        "forward\t127.0.0.1:5432 inside\t127.0.0.1:5432 then [::1]:5432\ta forwarded host port",
        "forward\t[::1]:5432 inside (if the sandbox has IPv6)\t127.0.0.1:5432 then [::1]:5432\t",
        "forward\t[::1]:8080 inside\t[::1]:8080\ta forwarded host port",
    ] {
        assert!(out.contains(row), "{row:?} in\n{out}");
    }
    assert!(
        out.lines()
            .filter(|l| l.starts_with("forward\t"))
            .all(|l| l.ends_with("\t--forward-port")),
        "{out}"
    );
    assert!(out.contains("# forwarder: "), "{out}");
    assert!(out.contains(" --proxy-fd 3 --forward 127.0.0.1:5432 --forward-optional '[::1]:5432' --forward '[::1]:8080' -- "), "{out}");
    assert!(!out.contains("--proxy-port"), "{out}");
    assert!(!out.contains("HTTPS_PROXY"), "{out}");
    // In allowlist mode: after the allowed hosts; 3128 is the proxy's.
    let out = ok(&dry(
        &w,
        &proj,
        &["--network", "allowlist", "--forward-port", "5432"],
        None,
    ));
    assert!(
        out.contains("; and 1 forwarded host port: localhost:5432\n"),
        "{out}"
    );
    assert!(
        out.contains("--proxy-port 3128 --forward 127.0.0.1:5432"),
        "{out}"
    );
    // No mode named: open, where a forward is a no-op, said as such.
    let out = ok(&dry(&w, &proj, &["--forward-port", "5432"], None));
    assert!(
        out.contains("# network: open: the host's network, unfiltered\n"),
        "{out}"
    );
    assert!(
        out.contains("forward-port localhost:5432 (--forward-port): nothing to do in open mode"),
        "{out}"
    );
    assert!(!out.contains("--proxy-fd"), "{out}");
}

fn write_config(xdg: &Path, text: &str) -> PathBuf {
    let p = xdg.join("claudebox/config.toml");
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, text).unwrap();
    p
}

#[test]
fn config_file_forwards_accumulate_per_project_and_work() {
    let w = World::new(BIN);
    let proj = project(&w);
    let other = w.dir("other");
    let (a, b, c) = (
        HostPort::start("A"),
        HostPort::start("B"),
        HostPort::start("C"),
    );
    let xdg = w.root().join("xdg");
    let cfg = write_config(
        &xdg,
        &format!(
            "network = \"none\"\nforward_ports = [{}]\n\n[[project]]\nroot = \"{}\"\n\
             forward_ports = [\"127.0.0.1:{}\"]\n",
            a.port,
            proj.display(),
            b.port
        ),
    );
    let out = ok(&dry(
        &w,
        &proj,
        &["--forward-port", &c.port.to_string()],
        Some(&xdg),
    ));
    let from = |line: usize| format!("config {}:{line}", cfg.display());
    for (port, source) in [
        (a.port, from(2)),
        (b.port, from(6)),
        (c.port, "--forward-port".to_string()),
    ] {
        let row = out
            .lines()
            .find(|l| l.starts_with(&format!("forward\t127.0.0.1:{port} inside")))
            .unwrap_or_else(|| panic!("no row for {port}:\n{out}"));
        assert!(row.ends_with(&format!("\t{source}")), "{row}");
    }
    let script = [
        probe("A", "127.0.0.1", a.port),
        probe("B", "127.0.0.1", b.port),
        probe("C", "localhost", c.port),
    ]
    .concat();
    let run = |cwd: &Path| {
        ok(&w
            .cmd(cwd)
            .env("XDG_CONFIG_HOME", &xdg)
            .args(["--forward-port", &c.port.to_string()])
            .env("FAKE_CLAUDE_SCRIPT", &script)
            .output()
            .unwrap())
    };
    let out = run(&proj);
    for tag in ["A OK HELLO A", "B OK HELLO B", "C OK HELLO C"] {
        assert!(out.contains(tag), "{tag}: {out}");
    }
    // Another project gets the top level and the command line, not the section.
    let out = run(&other);
    assert!(
        out.contains("A OK HELLO A") && out.contains("C OK HELLO C"),
        "{out}"
    );
    assert!(out.contains("B REFUSED"), "{out}");

    // --check names the forwards with the network mode in force.
    let tmp = w.root().join("tmp");
    fs::create_dir_all(&tmp).unwrap();
    let o = w
        .cmd(&proj)
        .env("XDG_CONFIG_HOME", &xdg)
        .env("TMPDIR", &tmp)
        .arg("--check")
        .output()
        .unwrap();
    let text = stdout(&o);
    let row = text
        .lines()
        .find(|l| l.contains("network") && l.contains("none:"))
        .unwrap_or_else(|| panic!("no network row:\n{text}"));
    assert!(
        row.contains(&format!(
            "2 forwarded host ports: localhost:{}, 127.0.0.1:{}",
            a.port, b.port
        )),
        "{row}"
    );
}

/// Asserts one line on stderr, a non-zero exit, nothing run and nothing made.
#[track_caller]
fn refused(w: &World, o: &Output, want: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "accepted:\n{}", stdout(o));
    assert_eq!(err.lines().count(), 1, "not one line:\n{err}");
    assert!(err.starts_with("claudebox: "), "{err}");
    assert!(err.contains(want), "expected {want:?} in:\n{err}");
    assert!(!stdout(o).contains("FAKE-CLAUDE-START"), "claude ran");
    assert!(!w.state().join("projects").exists(), "state was made");
}

#[test]
fn bad_forwards_are_one_line_refusals() {
    let w = World::new(BIN);
    let proj = project(&w);
    let launch = |a: &[&str]| {
        w.cmd(&proj)
            .args(a)
            .env("FAKE_CLAUDE_SCRIPT", "true")
            .output()
            .unwrap()
    };
    for (a, want) in [
        (
            &["--no-network", "--forward-port", "0"][..],
            "\"0\" is not a port number (1-65535)",
        ),
        (
            &["--no-network", "--forward-port", "65536"],
            "is not a port number",
        ),
        (
            &["--no-network", "--forward-port", "db"],
            "\"db\" is not a port number",
        ),
        (
            &["--no-network", "--forward-port", "example.com:80"],
            "example.com:80 is not the host's loopback",
        ),
        (
            &["--no-network", "--forward-port", "10.0.0.1:80"],
            "--allow-host",
        ),
        (
            &["--no-network", "--forward-port", "127.0.0.1"],
            "is not a port number",
        ),
        (
            &["--no-network", "--forward-port", "[::1]"],
            "name the port",
        ),
        (
            &["--network", "allowlist", "--forward-port", "3128"],
            "--forward-port localhost:3128: claudebox's proxy listens on 127.0.0.1:3128",
        ),
        (
            &[
                "--no-network",
                "--forward-port",
                "5432",
                "--forward-port",
                "localhost:5432",
            ],
            "--forward-port localhost:5432: 127.0.0.1:5432 is already forwarded by 5432",
        ),
        (
            &["--network", "open", "--forward-port", "5432"],
            "--network: forwarding host port 5432 makes no sense with network mode open",
        ),
    ] {
        refused(&w, &launch(a), want);
    }
    let many: Vec<String> = (40001..=40017)
        .flat_map(|p| ["--forward-port".to_string(), p.to_string()])
        .chain(["--no-network".to_string()])
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    refused(&w, &launch(&many), "at most 32");

    // In none mode there is no proxy: 3128 is a port like any other.
    let out = ok(&dry(
        &w,
        &proj,
        &["--no-network", "--forward-port", "3128"],
        None,
    ));
    assert!(out.contains("forward\t127.0.0.1:3128 inside"), "{out}");

    // The config file: file, line and column; a section naming open refuses its forwards.
    let xdg = w.root().join("xdg");
    let cfg_launch = |text: &str| {
        write_config(&xdg, text);
        w.cmd(&proj)
            .env("XDG_CONFIG_HOME", &xdg)
            .env("FAKE_CLAUDE_SCRIPT", "true")
            .output()
            .unwrap()
    };
    let cfg = xdg.join("claudebox/config.toml");
    let c = cfg.display();
    refused(
        &w,
        &cfg_launch("forward_ports = [true]\n"),
        &format!("{c}:1:18: invalid type: boolean `true`, expected a port"),
    );
    refused(
        &w,
        &cfg_launch("network = \"none\"\n\nforward_ports = [8080, 0]\n"),
        &format!("config {c}:3: forward_ports 0: \"0\" is not a port number"),
    );
    refused(
        &w,
        &cfg_launch("network = \"open\"\nforward_ports = [8080]\n"),
        "forwarding host port 8080 makes no sense with network mode open",
    );
    // Open from the command line over a configured forward: a no-op, launched.
    write_config(&xdg, "network = \"none\"\nforward_ports = [8080]\n");
    let o = w
        .cmd(&proj)
        .env("XDG_CONFIG_HOME", &xdg)
        .args(["--network", "open", "--dry-run"])
        .output()
        .unwrap();
    assert!(
        ok(&o).contains("nothing to do in open mode"),
        "{}",
        stdout(&o)
    );
}

/// The real Claude Code in `none` mode with a local LLM gateway: the lab's mock of the
/// Messages API on the host's loopback, brought in with `--forward-port`. The answer
/// reaches stdout; nothing else of the network exists. Control: without the forward the
/// mock is never reached from inside.
#[test]
fn real_claude_code_works_in_none_mode_through_a_forwarded_gateway() {
    use lab::agent::*;
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        let mock = MockApi::start(&serde_json::json!(["ANSWER-THROUGH-A-FORWARDED-PORT"]));
        let port = mock.port().to_string();

        assert_mock_unreachable(&w, &p, &mock, "none", c.label);

        let o = run_claudebox(
            &w,
            &p,
            &mock,
            &[
                "--network",
                "none",
                "--forward-port",
                &port,
                "-p",
                "hello in none mode",
            ],
            &[],
            Duration::from_secs(60),
        );
        let out = ok_run(&c, &o, &mock);
        assert!(
            out.contains("ANSWER-THROUGH-A-FORWARDED-PORT"),
            "[{}] stdout: {out}",
            c.label
        );
        let conv = mock.conversation(0);
        assert_eq!(conv.len(), 1, "[{}] {conv:#?}", c.label);
        assert!(messages_text(&conv[0]).contains("hello in none mode"));
    }
}

/// The forwarder of none mode lives as long as the sandbox: it served the forward while
/// the agent ran, and no process of that instance is left afterwards.
#[test]
fn the_forwarder_is_gone_after_the_sandbox_exits() {
    let w = World::new(BIN);
    let a = HostPort::start("A");
    let script = format!(
        "{}echo INSTANCE=$CLAUDEBOX_INSTANCE_ID\n",
        probe("A", "127.0.0.1", a.port)
    );
    let out = run(
        &w,
        &args(&["--no-network", "--forward-port", &a.port.to_string()]),
        &script,
    );
    assert!(out.contains("A OK HELLO A"), "{out}");
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("INSTANCE="))
        .unwrap()
        .to_string();
    let running = || {
        fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                let zombie = stat
                    .rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
                args.contains(&&b"--internal-proxy"[..]) && args.contains(&id.as_bytes()) && !zombie
            })
            .count()
    };
    let start = std::time::Instant::now();
    while running() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the forwarder outlived the sandbox"
        );
        thread::sleep(Duration::from_millis(20));
    }
}
