//! Channels between projects on the loopback that open-mode sandboxes share with each
//! other and the host. Each open-mode sandbox's proxy (the login broker's way to
//! api.anthropic.com, and every other HTTPS host) listens on a free port of that loopback,
//! which an agent of another project finds in `/proc/net/tcp` (the network namespace is
//! shared). The attacker, in project A's sandbox, holds B's proxy: with CONNECT tunnels to
//! a listener of its own kept busy (a byte every 0.2 s), or with requests the proxy
//! refuses whose connections then trickle a byte every 0.5 s, re-opening whatever the
//! proxy closes. Project B's sandbox then makes three requests through its own proxy; the
//! attempt got through when one of them waits more than [`HELD_AFTER`] or fails (B's
//! claude would hang). Measured before the fix: both held B for as long as A ran (every
//! request of B timed out). The test hands B's port to A rather than letting A scan the
//! loopback, so that other tests' proxies running meanwhile are left alone. A third
//! attempt goes through B's broker (CONNECT api.anthropic.com, TLS unchecked) with a
//! request it refuses, whose path then was a line of B's `network-denied.log` (and of B's
//! terminal with `--log-denied`): it got through when that line is there.
//! Controls: the same attempts with the proxy serving requests without its secret and
//! draining a refused connection two seconds per read (`CLAUDEBOX_TEST_PROXY_OPEN_TO_ALL`,
//! debug builds) hold B.

use super::*;
use lab::Reaped;
use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// A request of B waiting longer than this counts as held.
const HELD_AFTER: f64 = 5.0;

/// Project B: writes its proxy's port to `./port`, waits for `./go`, then makes three
/// CONNECTs through its own proxy (with the credentials HTTPS_PROXY carries, as every
/// client inside does) to the host's listener `$1`, each timed; it stops at the first
/// that fails or waits more than `$2` seconds.
const VICTIM: &str = r#"
import base64, os, socket, sys, time, urllib.parse
u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
auth = b""
if u.username:
    auth = b"Proxy-Authorization: Basic " + base64.b64encode(("%s:%s" % (u.username, u.password)).encode()) + b"\r\n"
open("port.tmp", "w").write(str(u.port))
os.rename("port.tmp", "port")
end = time.time() + 120
while not os.path.exists("go") and time.time() < end:
    time.sleep(0.1)
target = int(sys.argv[1])
for i in range(3):
    t = time.time()
    try:
        s = socket.create_connection(("127.0.0.1", u.port), timeout=8)
        s.settimeout(8)
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (target, target) + auth + b"\r\n")
        r = s.recv(64)
        s.close()
        ok = r.startswith(b"HTTP/1.1 200")
        print("PROBE", "ok" if ok else "refused", "%.2f" % (time.time() - t), r[:20], flush=True)
        if not ok or time.time() - t > float(sys.argv[2]):
            break
    except OSError as e:
        print("PROBE failed %.2f" % (time.time() - t), e, flush=True)
        break
    time.sleep(0.5)
print("ATTEMPT-RAN")
"#;

/// Project A: holds up to 300 connections to the proxy on port `$2`, of kind `$1`
/// (`tunnels`: CONNECT to a listener of A's own, a byte each 0.2 s; `trickle`: a request
/// the proxy refuses, then a byte each 0.5 s), re-opening those the proxy closes. Prints
/// `HELD <n>` after the first round (it ends at the first connection not taken), then goes
/// on until killed.
const ATTACKER: &str = r#"
import selectors, socket, sys, threading, time
kind, port = sys.argv[1], int(sys.argv[2])
sink = socket.socket(); sink.bind(("127.0.0.1", 0)); sink.listen(1024)
sport = sink.getsockname()[1]
def drain():
    sel = selectors.DefaultSelector(); sel.register(sink, selectors.EVENT_READ)
    while True:
        for k, _ in sel.select():
            if k.fileobj is sink:
                c, _ = sink.accept(); c.setblocking(False); sel.register(c, selectors.EVENT_READ)
            else:
                try:
                    if not k.fileobj.recv(65536): sel.unregister(k.fileobj); k.fileobj.close()
                except OSError:
                    sel.unregister(k.fileobj)
threading.Thread(target=drain, daemon=True).start()
def one():
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        if kind == "tunnels":
            s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (sport, sport))
            if not s.recv(64).startswith(b"HTTP/1.1 200"):
                s.close(); return None
        else:
            s.sendall(b"GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n")
        s.setblocking(False)
        return s
    except OSError:
        return None
if kind == "denied-log":
    import ssl
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n")
        r = s.recv(64)
        print("HELD", r[:20], flush=True)
        if r.startswith(b"HTTP/1.1 200"):
            ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
            t = ctx.wrap_socket(s, server_hostname="api.anthropic.com")
            t.sendall(b"GET /A-WAS-HERE/x HTTP/1.1\r\nHost: api.anthropic.com\r\nAuthorization: Bearer x\r\n\r\n")
            print("answer", t.recv(64), flush=True)
    except OSError as e:
        print("HELD none", e, flush=True)
    while True:
        time.sleep(1)
held = [None] * 300
lock = threading.Lock()
def keep():
    while True:
        with lock:
            for i, h in enumerate(held):
                if h:
                    try: h.send(b"x")
                    except OSError:
                        h.close(); held[i] = None
        time.sleep(0.2 if kind == "tunnels" else 0.5)
threading.Thread(target=keep, daemon=True).start()
first = True
while True:
    for i in range(len(held)):
        if held[i] is None:
            s = one()
            with lock:
                held[i] = s
            # The first round ends at the first connection the proxy does not take (a
            # full proxy makes each further one wait for its 2 s timeout: 88 s in all).
            if first and s is None:
                break
    if first:
        print("HELD", sum(1 for h in held if h), flush=True)
        first = False
    time.sleep(0.05)
"#;

/// One duel: B waits, A attacks B's proxy, B measures. Whether B was held, and the output.
fn duel(kind: &str, protection_off: bool) -> (bool, String) {
    let w = World::new(BIN);
    let pa = w.dir("a");
    let pb = w.dir("b");
    let target = TcpListener::bind("127.0.0.1:0").unwrap();
    let tport = target.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for c in target.incoming().flatten() {
            open.push(c);
        }
    });
    let launch = |p: &Path, script: &str, args: &[&str]| {
        let mut c = w.cmd(p);
        c.env("ANTHROPIC_API_KEY", "sk-ant-escape-test")
            .args(["--network", "open", "--exec", "python3", "-c", script])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if protection_off {
            c.env("CLAUDEBOX_TEST_PROXY_OPEN_TO_ALL", "1");
        }
        Reaped(c.spawn().unwrap())
    };
    let tport_s = tport.to_string();
    let mut b = launch(&pb, VICTIM, &[&tport_s, &HELD_AFTER.to_string()]);
    let t = Instant::now();
    while !pb.join("port").exists() {
        assert!(t.elapsed() < Duration::from_secs(60), "B never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let port = fs::read_to_string(pb.join("port")).unwrap();
    let mut a = launch(&pa, ATTACKER, &[kind, port.trim()]);
    let mut first = String::new();
    BufReader::new(a.0.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    fs::write(pb.join("go"), "").unwrap();
    let mut out = String::new();
    b.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut err = String::new();
    b.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let _ = b.0.wait();
    drop(a);
    assert!(
        out.contains("ATTEMPT-RAN"),
        "B did not run to its end ({kind}):\nA: {first}\n{out}{err}"
    );
    let probes: Vec<&str> = out.lines().filter(|l| l.starts_with("PROBE")).collect();
    if kind == "denied-log" {
        // Another project's line in this project's log (and on its terminal with
        // --log-denied).
        let mut logs = String::new();
        for e in fs::read_dir(w.state().join("projects")).unwrap().flatten() {
            logs += &fs::read_to_string(e.path().join("network-denied.log")).unwrap_or_default();
        }
        let wrote = logs.contains("A-WAS-HERE");
        return (wrote, format!("A: {first}log: {logs}"));
    }
    let held = probes.iter().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) != Some(&"ok") || f.get(2).and_then(|s| s.parse::<f64>().ok()) > Some(HELD_AFTER)
    });
    (held, format!("A: {first}B: {}", probes.join("; ")))
}

const TUNNELS: &str =
    "shared loopback: another project's agent holds an open-mode sandbox's proxy with busy tunnels";
const DENIED_LOG: &str = "shared loopback: another project's agent writes a line into an open-mode sandbox's denied log through its broker";
const TRICKLE: &str = "shared loopback: another project's agent holds an open-mode sandbox's proxy with refused requests that trickle";

pub(super) fn attempts() -> Vec<(&'static str, bool)> {
    [
        (TUNNELS, "tunnels"),
        (TRICKLE, "trickle"),
        (DENIED_LOG, "denied-log"),
    ]
    .into_iter()
    .map(|(name, kind)| {
        let (held, text) = duel(kind, false);
        eprintln!("{name}: {text}");
        (name, held)
    })
    .collect()
}

pub(super) fn controls() {
    for kind in ["tunnels", "trickle", "denied-log"] {
        let (held, text) = duel(kind, true);
        assert!(
            held,
            "control ({kind}): the attempt did not get through: {text}"
        );
    }
}
