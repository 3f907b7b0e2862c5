//! Host ports in a filtered sandbox (`--forward-port`): the agent has one host loopback
//! port on purpose and tries to turn it, or anything else, into a way to another host
//! port: directly, by name, through the host's outward address, through the proxy, by
//! sending a proxy request or a URL into the forwarded port, through the proxy port in
//! none mode, through the bridge descriptor. Each attempt gets its own host listener N
//! (not forwarded, on all addresses) and counts as an escape when N sees a connection or
//! the agent gets N's answer. Controls: the same attempts reach N in open mode, with N
//! allowed, or with N forwarded; and the bytes sent into the forward do reach the
//! forwarded service, unread by claudebox.

use super::*;
use crate::forward_ports::HostPort;

/// Python inside: connect to `$1:$2`, send `$3` (with `\r\n` escapes), print `ESCAPED`
/// when the answer is N's.
const SEND_PY: &str = r#"
import socket, sys
host, port, payload = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode().decode("unicode_escape").encode()
try:
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(payload)
    got = b""
    while True:
        d = s.recv(4096)
        if not d:
            break
        got += d
        if b"HELLO" in got and b"\n" in got[got.index(b"HELLO"):]:
            break
    print("answer:", got[:200])
    if b"HELLO N" in got:
        print("ESCAPED answer from N")
except OSError as e:
    print("connect failed:", e)
"#;

fn send(host: &str, port: impl std::fmt::Display, payload: &str) -> String {
    format!(
        "python3 -c {} {} {port} {}",
        sq(SEND_PY),
        sq(host),
        sq(payload)
    )
}

/// The host's address on its outward interface, if it has one.
fn outward_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// A fresh not-forwarded host listener N per attempt (on all addresses), so that each
/// attempt's host check sees only its own connections.
fn fresh_n() -> HostPort {
    HostPort::start_on("0.0.0.0:0", "N")
}

pub(super) fn attempts(_a: &Arena) -> Vec<Attempt> {
    let f = HostPort::start("F");
    let fp = f.port;
    // The forwarded service stays up for the whole suite.
    std::mem::forget(f);
    let mut v = Vec::new();
    for mode in ["allowlist", "none"] {
        let args = vec![
            "--network".to_string(),
            mode.to_string(),
            "--forward-port".to_string(),
            fp.to_string(),
        ];
        let mut add = |name: &'static str, script: String, n: HostPort| {
            let hits = n.hits.clone();
            std::mem::forget(n);
            let mut at = attempt(name, script)
                .host_check(move |_| hits.load(std::sync::atomic::Ordering::SeqCst) > 0);
            at.args = args.clone();
            v.push(at);
        };
        let n = fresh_n();
        add(
            "forwarded port: connect to a host port that is not forwarded",
            send("127.0.0.1", n.port, "ping\\n"),
            n,
        );
        let n = fresh_n();
        add(
            "forwarded port: connect to a host port that is not forwarded, by name",
            send("localhost", n.port, "ping\\n"),
            n,
        );
        if let Some(ip) = outward_ip() {
            let n = fresh_n();
            add(
                "forwarded port: the host's outward address, another port",
                send(&ip.to_string(), n.port, "ping\\n"),
                n,
            );
        }
        let n = fresh_n();
        add(
            "forwarded port: send CONNECT to another host port into the forwarded port",
            send(
                "127.0.0.1",
                fp,
                &format!(
                    "CONNECT 127.0.0.1:{p} HTTP/1.1\\r\\nHost: 127.0.0.1:{p}\\r\\n\\r\\nping\\n",
                    p = n.port
                ),
            ),
            n,
        );
        let n = fresh_n();
        add(
            "forwarded port: send a URL of another host port into the forwarded port",
            send(
                "localhost",
                fp,
                &format!(
                    "GET http://127.0.0.1:{p}/ HTTP/1.1\\r\\nHost: 127.0.0.1:{p}\\r\\n\\r\\n",
                    p = n.port
                ),
            ),
            n,
        );
        let n = fresh_n();
        add(
            "forwarded port: CONNECT to another host port through 127.0.0.1:3128",
            format!(
                "NO_PROXY= no_proxy= {}",
                send(
                    "127.0.0.1",
                    3128,
                    &format!("CONNECT 127.0.0.1:{p} HTTP/1.1\\r\\nHost: 127.0.0.1:{p}\\r\\n\\r\\nping\\n", p = n.port),
                )
            ),
            n,
        );
        let n = fresh_n();
        add(
            "forwarded port: a plain-http URL of another host port through 127.0.0.1:3128",
            send(
                "127.0.0.1",
                3128,
                &format!(
                    "GET http://localhost:{p}/ HTTP/1.1\\r\\nHost: localhost:{p}\\r\\n\\r\\n",
                    p = n.port
                ),
            ),
            n,
        );
        let n = fresh_n();
        add(
            "forwarded port: hand the proxy a listener over the bridge descriptor",
            format!(
                "python3 -c {} {}",
                sq(r#"
import os, socket, stat, sys
for fd in range(3, 64):
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    if stat.S_ISSOCK(st.st_mode):
        s = socket.socket(fileno=fd)
        if s.family == socket.AF_UNIX:
            l = socket.socket(); l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen()
            socket.send_fds(s, [b"L"], [l.fileno()])
            print("ESCAPED a socket to the proxy is open:", fd)
print("no bridge descriptor")
"#),
                n.port
            ),
            n,
        );
    }
    v
}

/// The same attempts where nothing stops them, or with the hole opened on purpose.
pub(super) fn controls(a: &Arena) {
    let run = |args: &[&str], script: &str| -> String {
        let o = a
            .cmd(&a.proj, &[])
            .args(args)
            .args(["--exec", "sh", "-c", script])
            .output()
            .unwrap();
        format!("{}{}", stdout(&o), stderr(&o))
    };
    // Open mode: the host's loopback, and its outward address, are the sandbox's.
    let n = fresh_n();
    let out = run(
        &["--network", "open"],
        &send("127.0.0.1", n.port, "ping\\n"),
    );
    assert!(out.contains(MARK), "open-mode control: {out}");
    if let Some(ip) = outward_ip() {
        let n = fresh_n();
        let out = run(
            &["--network", "open"],
            &send(&ip.to_string(), n.port, "ping\\n"),
        );
        assert!(out.contains(MARK), "outward-address control: {out}");
    }
    // N forwarded: reached in both filtered modes.
    for mode in ["allowlist", "none"] {
        let n = fresh_n();
        let p = n.port.to_string();
        let out = run(
            &["--network", mode, "--forward-port", &p],
            &send("localhost", n.port, "ping\\n"),
        );
        assert!(out.contains(MARK), "{mode} forwarded control: {out}");
        assert!(n.hits() > 0);
    }
    // N allowed: the proxy's CONNECT and plain http reach it.
    let n = fresh_n();
    let allow = format!("127.0.0.1:{}", n.port);
    let connect = format!(
        "CONNECT 127.0.0.1:{p} HTTP/1.1\\r\\nHost: 127.0.0.1:{p}\\r\\n\\r\\nping\\n",
        p = n.port
    );
    let out = run(
        &["--allow-host", &allow],
        &send("127.0.0.1", 3128, &connect),
    );
    assert!(out.contains(MARK), "proxy CONNECT control: {out}");
    let allow = format!("localhost:{}", n.port);
    let get = format!(
        "GET http://localhost:{p}/ HTTP/1.1\\r\\nHost: localhost:{p}\\r\\n\\r\\n",
        p = n.port
    );
    let out = run(&["--allow-host", &allow], &send("127.0.0.1", 3128, &get));
    assert!(out.contains(MARK), "proxy plain-http control: {out}");
    // What the agent sends into the forward arrives at the forwarded service as sent:
    // claudebox reads none of it, so nothing in it can choose another destination.
    let f = HostPort::start("F");
    let p = f.port.to_string();
    let out = run(
        &["--network", "none", "--forward-port", &p],
        &send("127.0.0.1", f.port, &connect),
    );
    assert!(out.contains("HELLO F"), "{out}");
    let got = f.got.lock().unwrap().clone();
    assert!(
        got.iter().any(|l| l.starts_with("CONNECT 127.0.0.1:")),
        "{got:?}"
    );
}
