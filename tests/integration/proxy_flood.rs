//! Issue 22: the allowlist proxy under a slow-client flood, for real. An attacker inside
//! `claudebox --network allowlist` (python3, as any tool the agent runs could be) opens as
//! many connections to the proxy as it has slots and sends one byte on each every 5 s;
//! a request to the lab's mock Messages API through the proxy must still be answered
//! within 1 s more than without the flood. The proxy's own side is counted from the host:
//! its sockets show the flood really holds every slot. A request head trickled one byte
//! a second is cut at the head deadline (a deadline per byte would never cut it).
//! Every slot held by open CONNECT tunnels (past their head; released 2 s after the
//! request is sent): the request is answered within 1 s more than without them, as open
//! tunnels hold at most 7/8 of the slots and a new tunnel closes the one idle the longest.
//! Control: main's proxy before that (every slot could be a tunnel) made the request wait
//! for the release (2.0 s, `HELD` in the output).

use std::fs;
use std::net::TcpListener;
use std::path::Path;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::BIN;
use lab::agent::MockApi;
use lab::*;

/// Python for both scripts below: the proxy's side of the sandbox's TCP table.
const PROXY_SIDE: &str = r#"
def proxy_side():
    """Connections the proxy has accepted and those waiting in its queue, from the
    sandbox's own TCP table (3128 = 0x0C38)."""
    est, queued = 0, 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(":0C38"):
            if f[3] == "0A":
                queued = int(f[4].split(":")[1], 16)
            elif f[3] == "01":
                est += 1
    return est - queued, queued
"#;

/// The attacker and the measuring client, run inside the sandbox (after [`PROXY_SIDE`]).
/// Prints `KEY value` lines.
const ATTACK: &str = r#"
import os, socket, sys, threading, time
proxy = ("127.0.0.1", 3128)
mock, hold, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def request():
    body = b'{"model":"claude-x","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
    head = ("POST http://localhost:%d/v1/messages HTTP/1.1\r\nHost: localhost:%d\r\n"
            "content-type: application/json\r\nx-api-key: k\r\nanthropic-version: 2023-06-01\r\n"
            "content-length: %d\r\n\r\n" % (mock, mock, len(body))).encode()
    t = time.monotonic()
    s = socket.create_connection(proxy, timeout=120)
    s.sendall(head + body)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return time.monotonic() - t, data.split(b"\r\n", 1)[0].decode()

def timed(label):
    for i in range(3):
        dt, status = request()
        print(label, "%.3f" % dt, status, flush=True)

def wait_for(name):
    while not os.path.exists(name):
        time.sleep(0.02)

timed("BASE")

# One head trickled a byte a second: when does the proxy cut it?
s = socket.create_connection(proxy)
t = time.monotonic()
s.settimeout(1)
answer = b""
for b in b"GET http://localhost:%d/ HTTP/1.1\r\nX-Slow: " % mock + b"a" * 60:
    try:
        s.send(bytes([b]))
        answer = s.recv(4096)
        if answer == b"" or answer:
            break
    except socket.timeout:
        pass
    except OSError:
        break
print("TRICKLE_CUT %.3f %s" % (time.monotonic() - t, answer.split(b"\r\n", 1)[0].decode()), flush=True)
s.close()

# The flood: n connections, one byte each every 5 s.
flood = []
for i in range(n):
    c = socket.create_connection(proxy)
    c.send(b"G")
    flood.append(c)
alive = [True]
def trickle():
    while alive[0]:
        time.sleep(5)
        for c in flood:
            try:
                c.send(b"E")
            except OSError:
                pass
threading.Thread(target=trickle, daemon=True).start()
time.sleep(1)
print("FLOOD_HELD accepted=%d queued=%d" % proxy_side(), flush=True)
open("flooding", "w").close()
wait_for("counted")
timed("FLOOD")
alive[0] = False
closed = 0
for c in flood:
    c.setblocking(False)
    try:
        if c.recv(1) == b"":
            closed += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
print("FLOOD_CLOSED_BY_PROXY", closed, flush=True)
for c in flood:
    c.close()

# Every slot held by open tunnels (past their head), released 2 s after the request is
# sent (the old proxy made the request wait for that).
tunnels = []
for i in range(n):
    c = socket.create_connection(proxy)
    c.sendall(b"CONNECT localhost:%d HTTP/1.1\r\nHost: localhost:%d\r\n\r\n" % (hold, hold))
    tunnels.append(c)
time.sleep(1)
def release():
    time.sleep(2)
    for c in tunnels:
        c.close()
threading.Thread(target=release).start()
dt, status = request()
print("HELD %.3f %s" % (dt, status), flush=True)
closed = 0
for c in tunnels:
    c.setblocking(False)
    try:
        while c.recv(4096) != b"":
            pass
        closed += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
print("TUNNELS_CLOSED_BY_PROXY", closed, flush=True)
"#;

/// Sockets the process `pid` has open.
fn sockets_of(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Pids of the proxies running for sandbox instance `id`.
fn proxy_of(id: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.contains(&&b"--internal-proxy"[..]) && args.contains(&id.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

fn wait_for(path: &Path, limit: Duration) {
    let t = Instant::now();
    while !path.exists() {
        assert!(t.elapsed() < limit, "never appeared: {}", path.display());
        thread::sleep(Duration::from_millis(20));
    }
}

fn times(out: &str, key: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.strip_prefix(key))
        .map(|l| l.split_whitespace().next().unwrap().parse::<f64>().unwrap())
        .collect()
}

#[test]
fn a_slow_client_flood_does_not_starve_the_proxy() {
    let _heavy = heavy();
    const SLOTS: usize = 256;
    let mock = MockApi::start(&json!({"turns": [], "final_text": "pong"}));
    // A host service that holds every connection open (the control's tunnels end here).
    let hold = TcpListener::bind("127.0.0.1:0").unwrap();
    let hold_port = hold.local_addr().unwrap().port();
    thread::spawn(move || {
        let mut kept = Vec::new();
        for c in hold.incoming().flatten() {
            kept.push(c);
        }
    });
    let w = World::new(BIN);
    let proj = w.dir("proj");
    fs::write(proj.join("attack.py"), format!("{PROXY_SIDE}{ATTACK}")).unwrap();
    let script = format!(
        "echo $CLAUDEBOX_INSTANCE_ID > id.tmp && mv id.tmp id
         python3 attack.py {} {hold_port} {SLOTS}",
        mock.port()
    );
    let child = w
        .cmd(&proj)
        .args([
            "--network",
            "allowlist",
            "--allow-host",
            &format!("localhost:{}", mock.port()),
            "--allow-host",
            &format!("localhost:{hold_port}"),
        ])
        .env("FAKE_CLAUDE_SCRIPT", script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&proj.join("id"), Duration::from_secs(30));
    let id = fs::read_to_string(proj.join("id"))
        .unwrap()
        .trim()
        .to_string();
    wait_for(&proj.join("flooding"), Duration::from_secs(60));
    let pids = proxy_of(&id);
    assert_eq!(pids.len(), 1, "the proxy of instance {id}");
    let held = sockets_of(pids[0]);
    fs::write(proj.join("counted"), "").unwrap();
    let o = child.wait_with_output().unwrap();
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    eprintln!("{out}proxy sockets during the flood: {held}");

    // The flood holds every slot: the proxy has accepted as many of its connections as
    // it has slots (256, less one per loopback forward waiting in its accept), and holds
    // a socket for each.
    let accepted: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("FLOOD_HELD accepted="))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        accepted >= SLOTS - 8,
        "the flood holds {accepted} slots:\n{out}"
    );
    assert!(held >= accepted, "the proxy holds {held} sockets:\n{out}");
    let base = times(&out, "BASE ");
    let flood = times(&out, "FLOOD ");
    assert_eq!((base.len(), flood.len()), (3, 3), "{out}");
    assert!(
        out.lines()
            .filter(|l| l.starts_with("BASE ") || l.starts_with("FLOOD "))
            .all(|l| l.ends_with("HTTP/1.0 200 OK") || l.ends_with("HTTP/1.1 200 OK")),
        "every request answered by the mock:\n{out}"
    );
    let worst_base = base.iter().copied().fold(0.0, f64::max);
    let worst_flood = flood.iter().copied().fold(0.0, f64::max);
    assert!(
        worst_flood < worst_base + 1.0,
        "under the flood {worst_flood:.3} s, without {worst_base:.3} s:\n{out}"
    );
    // Room was made by closing the flood's oldest connections, one per request.
    let closed: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("FLOOD_CLOSED_BY_PROXY "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(closed >= 3, "{out}");
    // The head deadline is one for the whole head: a byte a second is cut near it.
    let cut = times(&out, "TRICKLE_CUT ");
    assert!(
        cut.len() == 1 && cut[0] > 9.0 && cut[0] < 12.0,
        "a trickled head is cut at 10 s:\n{out}"
    );
    assert!(out.contains("408 Request Timeout"), "{out}");
    // Every slot held by tunnels: the request is answered as fast, by room made from
    // the tunnel idle the longest (the old proxy waited for their release, 2 s).
    let held_time = times(&out, "HELD ");
    assert!(
        held_time.len() == 1 && held_time[0] < worst_base + 1.0,
        "with every slot held by tunnels the request waited:\n{out}"
    );
    assert!(out.contains("HELD ") && out.contains(" 200 OK"), "{out}");
    let tunnels_closed: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("TUNNELS_CLOSED_BY_PROXY "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(tunnels_closed >= 1, "no tunnel was closed for room:\n{out}");
}

/// The flood for the real-claude test (after [`PROXY_SIDE`]): `n` connections to the proxy, one byte each
/// every 5 s, started by claude's own Bash tool and left running in the background.
const FLOOD: &str = r#"
import socket, sys, time
n, forwarded = int(sys.argv[1]), int(sys.argv[2])
tunnels = len(sys.argv) > 3 and sys.argv[3] == "tunnels"
flood = []
for i in range(n):
    c = socket.create_connection(("127.0.0.1", 3128))
    if tunnels:
        c.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (forwarded, forwarded))
    else:
        c.send(b"G")
    flood.append(c)
time.sleep(0.5)
# One idle connection to the forwarded port too: it takes the slot the forward's accept
# loop holds ready, so claude's next connection needs a slot the flood holds.
idle = socket.create_connection(("127.0.0.1", forwarded))
# Counted once the proxy has taken what it takes (the same count over a second: on a
# loaded machine its accepts can trail the flood's connects), at most 15 s.
prev, same = -1, 0
for _ in range(60):
    time.sleep(0.25)
    h = proxy_side()[0]; print("count", h, flush=True)
    same = same + 1 if h == prev else 0
    prev = h
    if same >= 4:
        break
print("HELD accepted=%d" % prev, flush=True)
while True:
    time.sleep(5)
    for c in flood:
        try:
            c.send(b"E")
        except OSError:
            pass
"#;

/// The real Claude Code under the flood: its Bash tool starts 256 trickling connections
/// (they hold every slot of the proxy, counted in the sandbox's TCP table) and one idle
/// connection to the forwarded mock port, prints the time it ended, and claude's next
/// API request (carrying that output, on a new connection: the mock closes each
/// streamed answer's) reaches the mock through the proxy (claude's `ANTHROPIC_BASE_URL`
/// is the allowed loopback address, forwarded by the proxy under the same slots). The
/// time from the tool's end to the request's arrival is within 1 s of the same without
/// the flood. (Measured against the proxy before issue 22: claude got no answer within
/// the test's 60 s.)
#[test]
fn real_claude_is_answered_under_the_flood() {
    let _heavy = heavy();
    let Some(c) = lab::agent::claude_versions().into_iter().next() else {
        return;
    };
    let mut gaps = Vec::new();
    for mode in ["", "trickle", "tunnels"] {
        let flood = !mode.is_empty();
        let cmd = if flood {
            format!(
                "setsid python3 flood.py 256 $PORT {mode} > flood.log 2>&1 < /dev/null & \
                 for i in $(seq 400); do grep -q HELD flood.log && break; sleep 0.05; done; \
                 cat flood.log; echo TOOL-END $(date +%s.%N)"
            )
        } else {
            "echo no flood; echo TOOL-END $(date +%s.%N)".to_string()
        };
        // The mock's port is known once it runs: the command names it as $PORT.
        let mock = MockApi::start(&json!([
            {"bash": {"command": format!("PORT=$(cat port); {cmd}"), "description": "flood"}},
            "done"
        ]));
        let w = lab::agent::world_with(BIN, &c);
        let proj = w.dir("proj");
        fs::write(proj.join("flood.py"), format!("{PROXY_SIDE}{FLOOD}")).unwrap();
        fs::write(proj.join("port"), mock.port().to_string()).unwrap();
        lab::agent::seed_claude_json(&w.home(), &[&proj]);
        let allow = format!("127.0.0.1:{}", mock.port());
        let o = lab::agent::run_claudebox(
            &w,
            &proj,
            &mock,
            &["--allow-host", &allow, "-p", "go", "--allowedTools", "Bash"],
            &[],
            Duration::from_secs(60),
        );
        let out = lab::agent::ok_run(&c, &o, &mock);
        assert!(out.contains("done"), "{out}");
        let conv = mock.conversation(0);
        assert!(conv.len() >= 2, "{conv:#?}");
        // The tool's output, as claude sent it back (in the request's JSON).
        let text = conv[1]["body"].to_string();
        if flood {
            let accepted: usize = text
                .split("HELD accepted=")
                .nth(1)
                .and_then(|t| t.split(|ch: char| !ch.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            // Open tunnels hold at most 7/8 of the 256 slots (224).
            let least = if mode == "tunnels" { 216 } else { 248 };
            assert!(
                accepted >= least,
                "the flood held {accepted} slots: {}",
                &text[..text.len().min(3000)]
            );
        }
        // The last mention is the output (the first is the command itself).
        let end: f64 = text
            .rsplit("TOOL-END ")
            .next()
            .and_then(|t| t.split(|ch: char| !ch.is_ascii_digit() && ch != '.').next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no TOOL-END in the request:\n{}", &text[..2000]));
        let arrived = conv[1]["time"].as_f64().unwrap();
        gaps.push(arrived - end);
    }
    eprintln!(
        "tool end to the next API request: {:.3} s without the flood, {:.3} s under \
         trickling heads, {:.3} s under open tunnels",
        gaps[0], gaps[1], gaps[2]
    );
    assert!(gaps[1] < gaps[0] + 1.0, "{gaps:?}");
    assert!(gaps[2] < gaps[0] + 1.0, "{gaps:?}");
}
