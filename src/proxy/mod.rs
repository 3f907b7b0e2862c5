//! The host-side HTTP proxy of allowlist mode, and the loopback forwards (allowlist and
//! none mode: see `serve_forward`). It serves a listening socket that lives in
//! the sandbox's network namespace (handed over by `netbridge`), and admits two kinds of
//! request, each decided once, by the host and port it names, before any byte reaches the
//! destination:
//!
//! - `CONNECT host:port`: after the decision the connection becomes a blind tunnel; the
//!   bytes in it are never parsed or decided on again.
//! - a plain-HTTP request in absolute form (`GET http://host/path`): decided by the URL's
//!   host (a `Host` header naming another host is refused), forwarded in origin form with
//!   `Connection: close`, and the client connection is closed after that one response, so
//!   a second request always comes on a new connection and is decided again.
//!
//! Names are resolved here, on the host: the sandbox has no DNS and needs none. Denied
//! requests get `403 Forbidden` naming the host and are appended to the project's denied
//! log (and to stderr when asked): at most [`DENIED_LOG_CAP`] bytes, then it is rotated to
//! `<name>.old`, and a denial repeated within [`REPEAT_WINDOW`] is counted, not written
//! again, so a flood of denials cannot fill the disk. One thread per connection, two file
//! descriptors per connection (no clones: both directions of a tunnel borrow the same
//! sockets); at start the soft open-files limit is raised to the hard one and the number
//! of connections served at once is sized from it (at most [`MAX_CONNECTIONS`]);
//! further connections wait in the listen queue: a connection is accepted only when a
//! slot and its descriptors are free.
//!
//! Slow clients cannot hold the slots: a request head must arrive whole within
//! [`HEAD_TIMEOUT`] of the accept (one deadline for the head, not one per byte), and when
//! every slot is taken and a new connection waits, the connection that has been sending
//! its head the longest (at least [`EVICT_AFTER`]) is closed to make room. Connections
//! past their head that are blind tunnels (CONNECT, loopback forwards) hold at most
//! [`tunnel_cap`] of the slots: a share is kept for new connections, and a connection
//! that becomes a tunnel when that many are open closes the tunnel idle the longest (no
//! byte either way for the longest time, at least [`TUNNEL_IDLE_EVICT`]); when every slot
//! is taken, no head can be closed and a connection waits, so is such a tunnel. Requests
//! being relayed, and tunnels in use, are never closed for room.

pub mod broker;
pub mod netbridge;
pub mod upstream;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::policy::network::{self, Allowlist};

pub const MAX_CONNECTIONS: usize = 256;
/// Descriptors budgeted per connection: the client, the upstream, and one for the name
/// lookup's transient files and sockets.
const FDS_PER_CONNECTION: u64 = 3;
/// Descriptors kept for the rest (standard streams, listeners, the denied log, pidfd).
const FDS_RESERVED: u64 = 32;
/// The denied log's largest size before it is rotated.
pub const DENIED_LOG_CAP: u64 = 256 * 1024;
/// A denial of the same method, host and port within this time of its last line is
/// counted and reported with the next line written for it.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(10);
const MAX_HEAD: usize = 64 * 1024;
/// The whole request head must arrive within this time of the accept.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection still sending its head after this long is closed when every slot is
/// taken and another connection waits (a client's own head takes microseconds).
pub const EVICT_AFTER: Duration = Duration::from_millis(250);
/// A tunnel is closed for room only once no byte went through it for this long (a
/// tunnel just opened, or one in use, is not).
pub const TUNNEL_IDLE_EVICT: Duration = Duration::from_secs(1);
/// How often a full proxy looks again for a connection it may close.
const EVICT_POLL: Duration = Duration::from_millis(50);
/// How long a full proxy waits for a slot to come back after it closed a connection for
/// room before it closes another (the handler's end frees it).
const EVICT_SETTLE: Duration = Duration::from_secs(1);
/// The escape suite's control, in debug builds only: the open-mode proxy serves requests
/// without its secret, and drains a refused connection two seconds per read (as before).
pub const OPEN_TO_ALL_ENV: &str = "CLAUDEBOX_TEST_PROXY_OPEN_TO_ALL";
/// How long a refused connection's unread bytes are drained, in all.
const REFUSE_DRAIN: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const STACK_SIZE: usize = 256 * 1024;
/// Headers that belong to one hop and are not forwarded (RFC 9110 7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

pub struct Config {
    pub allowlist: Allowlist,
    /// Appended to for each denied request.
    pub denied_log: PathBuf,
    /// Also report denied requests on stderr.
    pub log_stderr: bool,
    /// Open mode (with the login broker): every host is let through, unfiltered.
    pub open: bool,
    /// `--login-broker`: `CONNECT api.anthropic.com:443` is served by the broker, in any
    /// mode, whatever the allowlist says.
    pub broker: Option<Arc<broker::Broker>>,
    /// Open mode: the user's own proxy, which every host let through goes through
    /// (`CONNECT`) unless its `NO_PROXY` names the host.
    pub upstream: Option<Arc<upstream::UpstreamProxy>>,
    /// Open mode: the `Proxy-Authorization` every request must carry
    /// (`network::open_proxy_authorization`); a request without it is refused (407)
    /// before anything is connected, so nothing else on the shared loopback can hold a
    /// slot past its head.
    pub authorization: Option<String>,
}

/// Serves `listener` until the process is killed (it dies with the sandbox).
pub fn serve(listener: TcpListener, cfg: Config) -> io::Result<()> {
    let cfg = Arc::new(cfg);
    let slots = shared_slots();
    loop {
        slots.acquire(&listener);
        let slot = Slot(slots.clone());
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) => match e.raw_os_error() {
                Some(
                    nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOBUFS | nix::libc::ENOMEM,
                ) => {
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Some(nix::libc::ECONNABORTED | nix::libc::EINTR | nix::libc::EPROTO) => continue,
                _ => return Err(e),
            },
        };
        let cfg = cfg.clone();
        // If the thread cannot be made, the closure (connection and slot) is dropped.
        let _ = thread::Builder::new()
            .stack_size(STACK_SIZE)
            .spawn(move || {
                let _slot = slot;
                handle(conn, &cfg);
            });
    }
}

/// Raises the soft open-files limit to the hard one and returns the soft limit then.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// How many connections the descriptors allow at once (at least 1, at most
/// [`MAX_CONNECTIONS`]).
pub fn capacity(nofile: u64) -> usize {
    let n = nofile.saturating_sub(FDS_RESERVED) / FDS_PER_CONNECTION;
    usize::try_from(n)
        .unwrap_or(usize::MAX)
        .clamp(1, MAX_CONNECTIONS)
}

/// The one bound shared by every listener of this proxy, sized at first use.
fn shared_slots() -> Arc<Slots> {
    static SLOTS: std::sync::OnceLock<Arc<Slots>> = std::sync::OnceLock::new();
    SLOTS
        .get_or_init(|| {
            let n = capacity(raise_fd_limit());
            let _ = TUNNEL_CAP.set(tunnel_cap(n));
            Arc::new(Slots::new(n))
        })
        .clone()
}

/// How many of `slots` open tunnels may hold: all but an eighth (at least one), kept for
/// new connections (their heads, and the tunnel each may become by closing an idle one).
pub fn tunnel_cap(slots: usize) -> usize {
    slots.saturating_sub((slots / 8).max(1)).max(1)
}

static TUNNEL_CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// The open tunnels: their id, when a byte last went through either way (milliseconds
/// since [`clock`]'s start), and their two sockets. Listed only while `pump` holds both
/// streams open (the entry goes first, under this lock), so the descriptors shut down by
/// [`Tunnels::enter`] are always that tunnel's.
struct Tunnels;

type TunnelEntry = (
    u64,
    Arc<std::sync::atomic::AtomicU64>,
    std::os::fd::RawFd,
    std::os::fd::RawFd,
);

static TUNNELS: Mutex<Vec<TunnelEntry>> = Mutex::new(Vec::new());

/// A tunnel's place in [`TUNNELS`] while it is pumped.
struct TunnelPhase(u64);

fn clock() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let ms = START.get_or_init(Instant::now).elapsed().as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl Tunnels {
    /// Lists the tunnel of `a` and `b`; while more than [`tunnel_cap`] are open, the one
    /// idle the longest (at least [`TUNNEL_IDLE_EVICT`]) is shut down: its pump ends and
    /// frees its slot.
    fn enter(a: &TcpStream, b: &TcpStream) -> (TunnelPhase, Arc<std::sync::atomic::AtomicU64>) {
        use std::os::fd::AsRawFd;
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let active = Arc::new(std::sync::atomic::AtomicU64::new(clock()));
        let cap = TUNNEL_CAP.get().copied().unwrap_or(MAX_CONNECTIONS);
        // Counted and evicted under one lock: tunnels entering at once each see the
        // others' entries, so together they evict only what is over the cap (counted
        // outside it, each evicted for all, and the flood's 256 CONNECTs left 210 of
        // 224 tunnels open).
        let mut open = TUNNELS.lock().unwrap_or_else(|e| e.into_inner());
        open.push((id, active.clone(), a.as_raw_fd(), b.as_raw_fd()));
        while open.len() > cap && Tunnels::evict_idlest_in(&mut open, Some(id)) {}
        drop(open);
        (TunnelPhase(id), active)
    }

    /// Shuts down the tunnel idle the longest, if at least [`TUNNEL_IDLE_EVICT`] (never
    /// `keep`). Whether one was.
    fn evict_idlest(keep: Option<u64>) -> bool {
        let mut open = TUNNELS.lock().unwrap_or_else(|e| e.into_inner());
        Tunnels::evict_idlest_in(&mut open, keep)
    }

    /// [`Tunnels::evict_idlest`] on the list its caller holds locked.
    fn evict_idlest_in(open: &mut Vec<TunnelEntry>, keep: Option<u64>) -> bool {
        let now = clock();
        let idle = u64::try_from(TUNNEL_IDLE_EVICT.as_millis()).unwrap_or(u64::MAX);
        let Some(i) = open
            .iter()
            .enumerate()
            .filter(|(_, t)| Some(t.0) != keep)
            .map(|(i, t)| (i, t.1.load(std::sync::atomic::Ordering::Relaxed)))
            .filter(|(_, last)| now.saturating_sub(*last) >= idle)
            .min_by_key(|(_, last)| *last)
            .map(|(i, _)| i)
        else {
            return false;
        };
        let (_, _, x, y) = open.swap_remove(i);
        // SAFETY: both descriptors are open: their pump removes the entry (under this
        // lock) before it closes the streams, and the entry is gone now.
        unsafe {
            nix::libc::shutdown(x, nix::libc::SHUT_RDWR);
            nix::libc::shutdown(y, nix::libc::SHUT_RDWR);
        }
        true
    }
}

impl Drop for TunnelPhase {
    fn drop(&mut self) {
        let mut open = TUNNELS.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|t| t.0 != self.0);
    }
}

/// Copies `from` to `to` until the end of `from` (`true`) or an error, marking `active`
/// at each chunk.
fn copy_marking(from: &TcpStream, to: &TcpStream, active: &std::sync::atomic::AtomicU64) -> bool {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match (&*from).read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                active.store(clock(), std::sync::atomic::Ordering::Relaxed);
                if (&*to).write_all(&buf[..n]).is_err() {
                    return false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// A loopback forward (see `network::LoopbackForward`): each connection accepted on
/// `listener`, a socket on the sandbox's own loopback, is tunnelled, blind, to the
/// forward's host addresses, fixed at launch (the first that accepts); nothing the
/// connection carries is read to choose them. Runs on its own thread, under the proxy's
/// one bound on connections (sized from its descriptors).
pub fn serve_forward(listener: TcpListener, forward: network::LoopbackForward) {
    let slots = shared_slots();
    let targets = Arc::new(forward.targets());
    let _ = thread::Builder::new()
        .stack_size(STACK_SIZE)
        .spawn(move || loop {
            slots.acquire(&listener);
            let slot = Slot(slots.clone());
            let conn = match listener.accept() {
                Ok((c, _)) => c,
                Err(e) if e.raw_os_error() == Some(nix::libc::EBADF) => return,
                Err(_) => {
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let targets = targets.clone();
            let _ = thread::Builder::new()
                .stack_size(STACK_SIZE)
                .spawn(move || {
                    let _slot = slot;
                    let upstream = targets
                        .iter()
                        .find_map(|a| TcpStream::connect_timeout(a, CONNECT_TIMEOUT).ok());
                    // Refused on the host: the client sees its connection closed.
                    if let Some(upstream) = upstream {
                        pump(conn, upstream);
                    }
                });
        });
}

/// A counting semaphore bounding concurrent connections.
struct Slots {
    free: Mutex<Free>,
    cv: Condvar,
}

/// The slots free, how many times one came back, and when a full proxy last closed a
/// connection for room (with the count of returns then).
struct Free {
    n: usize,
    returned: u64,
    evicted: Option<(Instant, u64)>,
}

impl Slots {
    fn new(n: usize) -> Slots {
        Slots {
            free: Mutex::new(Free {
                n,
                returned: 0,
                evicted: None,
            }),
            cv: Condvar::new(),
        }
    }
    /// Takes a slot for the next connection of `listener`. While none is free and a
    /// connection waits in its queue, the connection slowest with its head (or else the
    /// tunnel idle the longest) is closed; another only once a slot has come back since
    /// (or EVICT_SETTLE has passed): a loaded machine's handlers can take more than a
    /// poll to end, and each poll would otherwise close one more.
    fn acquire(&self, listener: &TcpListener) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while free.n == 0 {
            let returned = free.returned;
            let may_evict = free
                .evicted
                .is_none_or(|(t, r)| r != returned || t.elapsed() >= EVICT_SETTLE);
            drop(free);
            let evicted = may_evict
                && waiting(listener)
                && (Heads::evict_oldest() || Tunnels::evict_idlest(None));
            free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if evicted {
                free.evicted = Some((Instant::now(), returned));
            }
            if free.n == 0 {
                free = self
                    .cv
                    .wait_timeout(free, EVICT_POLL)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        free.n -= 1;
    }
}

/// Whether a connection waits in `listener`'s queue (polled, not accepted).
fn waiting(listener: &TcpListener) -> bool {
    use std::os::fd::AsFd;
    let mut fds = [nix::poll::PollFd::new(
        listener.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    nix::poll::poll(
        &mut fds,
        nix::poll::PollTimeout::from(EVICT_POLL.as_millis() as u16),
    )
    .is_ok_and(|n| n > 0)
}

/// The connections still sending their request head: when they were accepted, and their
/// socket. A connection is listed only while its handler holds its `TcpStream` open (the
/// entry goes before the stream does, under this lock), so the descriptor shut down by
/// [`Heads::evict_oldest`] is always that connection's.
struct Heads;

static HEADS: Mutex<Vec<(u64, Instant, std::os::fd::RawFd)>> = Mutex::new(Vec::new());

/// A connection's place in [`HEADS`] while its head is read.
struct HeadPhase(u64);

impl Heads {
    fn enter(c: &TcpStream, since: Instant) -> HeadPhase {
        use std::os::fd::AsRawFd;
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut heads = HEADS.lock().unwrap_or_else(|e| e.into_inner());
        heads.push((id, since, c.as_raw_fd()));
        HeadPhase(id)
    }
    /// Shuts down the connection that has sent its head the longest, if that is at least
    /// [`EVICT_AFTER`]; its handler then sees the end of the stream and frees its slot.
    /// Whether one was.
    fn evict_oldest() -> bool {
        let mut heads = HEADS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = heads
            .iter()
            .enumerate()
            .filter(|(_, (_, t, _))| t.elapsed() >= EVICT_AFTER)
            .min_by_key(|(_, (_, t, _))| *t)
            .map(|(i, _)| i)
        else {
            return false;
        };
        let (_, _, fd) = heads.swap_remove(i);
        // SAFETY: the descriptor is open: its handler removes the entry (under this lock)
        // before it closes the stream, and the entry is gone now, so it is shut down once.
        unsafe {
            nix::libc::shutdown(fd, nix::libc::SHUT_RDWR);
        }
        true
    }
}

impl Drop for HeadPhase {
    fn drop(&mut self) {
        let mut heads = HEADS.lock().unwrap_or_else(|e| e.into_inner());
        heads.retain(|(id, _, _)| *id != self.0);
    }
}

struct Slot(Arc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        let mut free = self.0.free.lock().unwrap_or_else(|e| e.into_inner());
        free.n += 1;
        free.returned += 1;
        self.0.cv.notify_all();
    }
}

/// A refusal: status, reason phrase, body text.
struct Reject(u16, &'static str, String);

/// The parsed request head.
struct Head {
    method: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    /// Bytes of the head; what follows in the buffer is body or tunnel data.
    len: usize,
}

fn handle(mut client: TcpStream, cfg: &Config) {
    let start = Instant::now();
    let _ = client.set_write_timeout(Some(HEAD_TIMEOUT));
    let read = {
        let _phase = Heads::enter(&client, start);
        read_head(&mut client, start + HEAD_TIMEOUT)
    };
    let (head, buf) = match read {
        Ok(Some(x)) => x,
        Ok(None) => return,
        Err(r) => return refuse(client, r),
    };
    if let Some(want) = &cfg.authorization {
        if !authorized(&head, want) {
            // Answered and closed at once, nothing drained: a client without the secret
            // is no client of this sandbox, and must not hold a slot for a moment more.
            let _ = client.write_all(
                b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\
                  connection: close\r\nx-claudebox: this proxy serves one sandbox\r\n\r\n",
            );
            return;
        }
    }
    let rest = &buf[head.len..];
    let result = if head.method.eq_ignore_ascii_case("CONNECT") {
        tunnel(&mut client, cfg, &head, rest)
    } else {
        forward(&client, cfg, &head, rest).map(|()| None)
    };
    match result {
        Err(r) => refuse(client, r),
        Ok(Some(upstream)) => pump(client, upstream),
        Ok(None) => {}
    }
}

/// Whether `head` carries the `Proxy-Authorization` value `want` (compared in time that
/// does not depend on where they differ).
fn authorized(head: &Head, want: &str) -> bool {
    head.headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("proxy-authorization"))
        .any(|(_, v)| {
            v.len() == want.len()
                && v.iter()
                    .zip(want.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        })
}

/// Reads until the end of the request head, which must be whole by `deadline`.
/// `Ok(None)`: the client left without a request.
fn read_head(c: &mut TcpStream, deadline: Instant) -> Result<Option<(Head, Vec<u8>)>, Reject> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    let late = || Reject(408, "Request Timeout", "no request head in time".into());
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || c.set_read_timeout(Some(left)).is_err() {
            return Err(late());
        }
        let n = match c.read(&mut chunk) {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(late())
            }
            Err(_) => return Ok(None),
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut hs = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut hs);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let head = Head {
                    method: req.method.unwrap_or_default().to_string(),
                    target: req.path.unwrap_or_default().to_string(),
                    headers: req
                        .headers
                        .iter()
                        .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
                        .collect(),
                    len,
                };
                return Ok(Some((head, buf)));
            }
            Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => {}
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
                return Err(Reject(
                    431,
                    "Request Header Fields Too Large",
                    "request head too large".into(),
                ))
            }
            Err(e) => {
                return Err(Reject(
                    400,
                    "Bad Request",
                    format!("malformed request: {e}"),
                ))
            }
        }
    }
}

fn bad(msg: impl Into<String>) -> Reject {
    Reject(400, "Bad Request", msg.into())
}

/// `CONNECT host:port`: decide, connect; the caller then pumps the blind tunnel.
fn tunnel(
    client: &mut TcpStream,
    cfg: &Config,
    head: &Head,
    rest: &[u8],
) -> Result<Option<TcpStream>, Reject> {
    let (host, port) = network::parse_authority(&head.target, None)
        .map_err(|e| bad(format!("bad CONNECT target: {e}")))?;
    if let Some(b) = cfg
        .broker
        .as_ref()
        .filter(|_| broker::Broker::serves(&host, port))
    {
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .is_ok()
        {
            if let Ok(c) = client.try_clone() {
                if let Some(r) = b.serve(c, rest) {
                    cfg.record_refused(&r);
                }
            }
        }
        return Ok(None);
    }
    let mut upstream = decide_and_connect(cfg, "CONNECT", &host, port)?;
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
        || upstream.write_all(rest).is_err()
    {
        return Ok(None);
    }
    let _ = client.set_read_timeout(None);
    let _ = client.set_write_timeout(None);
    Ok(Some(upstream))
}

/// A plain-HTTP request in absolute form: decide by the URL's host, forward one request,
/// relay the response, close.
fn forward(client: &TcpStream, cfg: &Config, head: &Head, rest: &[u8]) -> Result<(), Reject> {
    let target = &head.target;
    let after_scheme = match target.get(..7) {
        Some(s) if s.eq_ignore_ascii_case("http://") => &target[7..],
        _ if target
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://")) =>
        {
            return Err(bad("send https:// requests through CONNECT"))
        }
        _ => {
            return Err(bad(
                "this is claudebox's proxy: send requests in absolute form \
                 (GET http://host/path) or use CONNECT",
            ))
        }
    };
    let split = after_scheme.find(['/', '?']).unwrap_or(after_scheme.len());
    let (authority, path) = after_scheme.split_at(split);
    if authority.contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    if path.contains('#') {
        return Err(bad("a URL fragment does not belong in a request"));
    }
    let (host, port) = network::parse_authority(authority, Some(80))
        .map_err(|e| bad(format!("bad host in the URL: {e}")))?;
    let mut host_headers = head.headers.iter().filter(|(n, _)| n == "host");
    if let Some((_, v)) = host_headers.next() {
        let same = std::str::from_utf8(v)
            .ok()
            .and_then(|v| network::parse_authority(v.trim(), Some(80)).ok())
            .is_some_and(|hp| hp == (host.clone(), port));
        if !same || host_headers.next().is_some() {
            return Err(bad(format!(
                "the Host header does not name the URL's host {}:{port}",
                network::show_host(&host)
            )));
        }
    }
    if head.headers.iter().any(|(n, _)| n == "transfer-encoding") {
        return Err(Reject(
            501,
            "Not Implemented",
            "chunked request bodies are not supported over plain http by claudebox's proxy; \
             use https"
                .into(),
        ));
    }
    let mut length: Option<u64> = None;
    for (_, v) in head.headers.iter().filter(|(n, _)| n == "content-length") {
        let n = std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| bad("bad Content-Length"))?;
        if length.is_some_and(|l| l != n) {
            return Err(bad("conflicting Content-Length headers"));
        }
        length = Some(n);
    }
    let length = length.unwrap_or(0);

    let upstream = decide_and_connect(cfg, &head.method, &host, port)?;
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    if !path.starts_with('/') {
        out.push(b'/');
    }
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let named_in_connection: Vec<String> = head
        .headers
        .iter()
        .filter(|(n, _)| n == "connection" || n == "proxy-connection")
        .flat_map(|(_, v)| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut has_host = false;
    for (name, value) in &head.headers {
        if HOP_BY_HOP.contains(&name.as_str()) || named_in_connection.contains(name) {
            continue;
        }
        has_host |= name == "host";
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !has_host {
        out.extend_from_slice(format!("host: {authority}\r\n").as_bytes());
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");

    let _ = client.set_read_timeout(None);
    let _ = client.set_write_timeout(None);
    let upstream = &upstream;
    thread::scope(|s| {
        // The response is relayed while the body is still being sent (Expect: 100-continue).
        let relay = thread::Builder::new()
            .stack_size(STACK_SIZE)
            .spawn_scoped(s, move || {
                let _ = io::copy(&mut &*upstream, &mut &*client);
                let _ = client.shutdown(Shutdown::Both);
            });
        let early = rest
            .len()
            .min(usize::try_from(length).unwrap_or(usize::MAX));
        let mut up = upstream;
        let sent = up.write_all(&out).is_ok()
            && up.write_all(&rest[..early]).is_ok()
            && io::copy(&mut client.take(length - early as u64), &mut up).is_ok();
        if !sent {
            let _ = upstream.shutdown(Shutdown::Both);
        }
        if let Ok(t) = relay {
            let _ = t.join();
        }
    });
    // Anything the client sent after this request (a pipelined second one) is dropped
    // with the connection.
    let _ = upstream.shutdown(Shutdown::Both);
    Ok(())
}

/// The one decision: is `host:port` allowed? Then resolve it here and connect.
fn decide_and_connect(
    cfg: &Config,
    method: &str,
    host: &str,
    port: u16,
) -> Result<TcpStream, Reject> {
    let shown = network::show_host(host);
    if cfg.open {
        if let Some(u) = cfg.upstream.as_ref().filter(|u| !u.bypassed(host)) {
            // The way out the user's own clients take on the host.
            return u
                .connect(host, port)
                .map_err(|e| Reject(502, "Bad Gateway", format!("{e:#}")));
        }
        // Open mode: the sandbox could reach this host without the proxy anyway.
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| Reject(502, "Bad Gateway", format!("cannot resolve {shown}: {e}")))?
            .collect();
        return connect_any(&addrs.iter().collect::<Vec<_>>(), &shown, port);
    }
    let Some(entry) = cfg.allowlist.find(host, port) else {
        cfg.record_denied(method, &shown, port);
        return Err(Reject(
            403,
            "Forbidden",
            format!(
                "claudebox: {shown}:{port} is not on this sandbox's network allowlist; \
                 to allow it, start claudebox with --allow-host {shown}\n"
            ),
        ));
    };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Reject(502, "Bad Gateway", format!("cannot resolve {shown}: {e}")))?
        .collect();
    let wildcard = entry.pattern.is_wildcard();
    let usable: Vec<&SocketAddr> = addrs
        .iter()
        .filter(|a| !(wildcard && network::is_local_address(a.ip())))
        .collect();
    if usable.is_empty() {
        cfg.record_denied(method, &shown, port);
        return Err(Reject(
            403,
            "Forbidden",
            format!(
                "claudebox: {shown} resolves to a local address, which the wildcard entry {} \
                 does not reach; allow the host by its exact name\n",
                entry.pattern
            ),
        ));
    }
    connect_any(&usable, &shown, port)
}

/// The first of `addrs` that answers.
fn connect_any(addrs: &[&SocketAddr], shown: &str, port: u16) -> Result<TcpStream, Reject> {
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(Reject(
        502,
        "Bad Gateway",
        format!(
            "cannot connect to {shown}:{port}: {}",
            last.map(|e| e.to_string()).unwrap_or_default()
        ),
    ))
}

/// Copies both ways until both sides are done. Both directions borrow the same two
/// sockets: no descriptor is duplicated.
fn pump(a: TcpStream, b: TcpStream) {
    // Dropped before the streams (declared after them): see `Tunnels`.
    let (_listed, active) = Tunnels::enter(&a, &b);
    let active = &*active;
    let (a, b) = (&a, &b);
    thread::scope(|s| {
        let back = thread::Builder::new()
            .stack_size(STACK_SIZE)
            .spawn_scoped(s, move || {
                let ok = copy_marking(b, a, active);
                let _ = a.shutdown(if ok { Shutdown::Write } else { Shutdown::Both });
                if !ok {
                    let _ = b.shutdown(Shutdown::Both);
                }
            });
        if back.is_err() {
            return;
        }
        let ok = copy_marking(a, b, active);
        let _ = b.shutdown(if ok { Shutdown::Write } else { Shutdown::Both });
        if !ok {
            let _ = a.shutdown(Shutdown::Both);
        }
    });
}

/// Sends an error response and closes without resetting what the client still sends.
fn refuse(mut client: TcpStream, Reject(code, reason, mut body): Reject) {
    if !body.ends_with('\n') {
        body.push('\n');
    }
    let _ = client.set_write_timeout(Some(HEAD_TIMEOUT));
    let msg = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\nx-claudebox: {}\r\n\r\n{body}",
        body.len(),
        if code == 403 { "denied" } else { "error" }
    );
    if client.write_all(msg.as_bytes()).is_err() {
        return;
    }
    let _ = client.shutdown(Shutdown::Write);
    // Drain briefly so that unread request bytes do not turn the close into a reset
    // that would destroy the response before the client reads it. Two seconds in all,
    // not per read: a client trickling a byte a second would otherwise hold the slot.
    if crate::host::test_switch::get(OPEN_TO_ALL_ENV).is_some() {
        // The escape suite's control: the drain as it was, two seconds per read.
        let _ = client.set_read_timeout(Some(REFUSE_DRAIN));
        let _ = io::copy(&mut (&client).take(1 << 20), &mut io::sink());
        return;
    }
    let deadline = Instant::now() + REFUSE_DRAIN;
    let mut buf = [0u8; 16 * 1024];
    let mut left: usize = 1 << 20;
    while left > 0 {
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() || client.set_read_timeout(Some(wait)).is_err() {
            return;
        }
        match (&client).read(&mut buf) {
            Ok(0) => return,
            Ok(n) => left = left.saturating_sub(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The denied log of this proxy process: its open file, its size, and when each kind
/// of denial was last written.
struct DeniedLog {
    file: Option<std::fs::File>,
    size: u64,
    recent: HashMap<String, (Instant, u64)>,
}

static DENIED: Mutex<Option<DeniedLog>> = Mutex::new(None);

impl Config {
    fn record_denied(&self, method: &str, host: &str, port: u16) {
        // What the agent sent, escaped before it reaches the log or the terminal.
        let (method, host) = (
            crate::policy::escape::shown(method),
            crate::policy::escape::shown(host),
        );
        let key = format!("{method} {host}:{port}");
        let Some(more) = self.log_once(&key, |more| {
            format!(
                "denied {key}{more}{}--allow-host {host})",
                crate::state::denied::ALLOW_PREFIX
            )
        }) else {
            return;
        };
        if self.log_stderr {
            eprintln!(
                "claudebox: network: denied {method} {host}:{port}{more} (allow it with --allow-host {host})"
            );
        }
    }

    /// Appends `line(more)` (with the time before it) to the denied log, unless `key`
    /// was written within [`REPEAT_WINDOW`]: then it is only counted, and `None` returned.
    /// `more` names the repeats counted since its last line.
    fn log_once(&self, key: &str, line: impl FnOnce(&str) -> String) -> Option<String> {
        let now = Instant::now();
        let mut guard = DENIED.lock().unwrap_or_else(|e| e.into_inner());
        let log = guard.get_or_insert_with(|| DeniedLog {
            file: None,
            size: 0,
            recent: HashMap::new(),
        });
        let repeated = match log.recent.get_mut(key) {
            Some((last, n)) if now.duration_since(*last) < REPEAT_WINDOW => {
                *n += 1;
                return None;
            }
            Some((_, n)) => *n,
            None => 0,
        };
        if log.recent.len() >= 4096 {
            log.recent
                .retain(|_, (t, n)| now.duration_since(*t) < REPEAT_WINDOW || *n > 0);
            if log.recent.len() >= 4096 {
                log.recent.clear();
            }
        }
        log.recent.insert(key.to_string(), (now, 0));
        let more = if repeated > 0 {
            format!(
                " (and {repeated} more time{} since its last line)",
                if repeated == 1 { "" } else { "s" }
            )
        } else {
            String::new()
        };
        let line = format!("{} {}\n", utc_now(), line(&more));
        log.write(&self.denied_log, line.as_bytes());
        Some(more)
    }
}

impl Config {
    /// A request the login broker refused, in the denied log as a denied host is (the
    /// same cap, the same count of repeats; stderr with `--log-denied`). The method, the
    /// path and the reason are the agent's words: escaped.
    fn record_refused(&self, r: &broker::Refused) {
        let shown = |s: &str| match s {
            "" => "-".to_string(),
            s => crate::policy::escape::shown(s),
        };
        let (method, path, why) = (shown(&r.method), shown(&r.path), shown(&r.why));
        let key = format!("login broker {} {method} {path}", r.code);
        let Some(more) = self.log_once(&key, |more| format!("refused {key}: {why}{more}")) else {
            return;
        };
        if self.log_stderr {
            eprintln!("claudebox: network: refused {key}: {why}{more}");
        }
    }
}

impl DeniedLog {
    /// Appends a line, rotating the file to `<name>.old` first when it would pass the cap.
    fn write(&mut self, path: &std::path::Path, line: &[u8]) {
        // In the project's state directory, by its descriptor (`state::beneath`).
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return;
        };
        let name = std::path::Path::new(name);
        let open = || {
            let d = crate::state::beneath::Dir::open(dir).ok()?;
            d.open_append(name, 0o600).ok()
        };
        if self.file.is_none() {
            self.file = open();
            self.size = self
                .file
                .as_ref()
                .and_then(|f| f.metadata().ok())
                .map_or(0, |m| m.len());
        }
        if self.size + line.len() as u64 > DENIED_LOG_CAP {
            self.file = None;
            let mut old = name.as_os_str().to_os_string();
            old.push(".old");
            if let Ok(d) = crate::state::beneath::Dir::open(dir) {
                let _ = d.rename(name, std::path::Path::new(&old));
            }
            self.file = open();
            self.size = 0;
        }
        if let Some(f) = &mut self.file {
            if f.write_all(line).is_ok() {
                self.size += line.len() as u64;
            }
        }
    }
}

/// The current time as `YYYY-MM-DDTHH:MM:SSZ` (a clock past 9999, which humantime cannot
/// print, as its last second).
fn utc_now() -> String {
    const LAST: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let at = UNIX_EPOCH + std::time::Duration::from_secs(secs.min(LAST));
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The only unit test that writes the process's denied log (`DENIED` keeps the
    /// first file it opens).
    #[test]
    fn a_broker_refusal_is_logged_once_escaped_and_repeats_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            allowlist: Allowlist::default(),
            denied_log: dir.path().join("network-denied.log"),
            log_stderr: false,
            open: false,
            broker: None,
            upstream: None,
            authorization: None,
        };
        let r = broker::Refused {
            code: 403,
            method: "PO\u{1b}ST".into(),
            path: "/a\u{202e}b\nc".into(),
            why: "no\tlent".into(),
        };
        cfg.record_refused(&r);
        cfg.record_refused(&r);
        cfg.record_refused(&broker::Refused {
            code: 400,
            method: String::new(),
            path: String::new(),
            why: "malformed request".into(),
        });
        let log = std::fs::read_to_string(&cfg.denied_log).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "{log}");
        assert!(
            lines[0].ends_with(" refused login broker 403 PO\\x1bST /a\\u{202e}b\\nc: no\\tlent"),
            "{log}"
        );
        assert!(
            lines[1].ends_with(" refused login broker 400 - -: malformed request"),
            "{log}"
        );
    }

    #[test]
    fn only_the_exact_proxy_authorization_is_served() {
        let want = network::open_proxy_authorization("00ff");
        assert_eq!(want, "Basic Y2xhdWRlYm94OjAwZmY=");
        let head = |h: &[(&str, &str)]| Head {
            method: "CONNECT".into(),
            target: "api.anthropic.com:443".into(),
            headers: h
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            len: 0,
        };
        assert!(authorized(
            &head(&[("host", "x"), ("proxy-authorization", &want)]),
            &want
        ));
        assert!(!authorized(&head(&[("host", "x")]), &want));
        assert!(!authorized(
            &head(&[("proxy-authorization", "Basic Y2xhdWRlYm94OjAwZmY")]),
            &want
        ));
        let other = network::open_proxy_authorization("00fe");
        assert!(!authorized(
            &head(&[("proxy-authorization", &other)]),
            &want
        ));
    }

    #[test]
    fn the_denied_log_time_is_rfc3339_in_seconds() {
        let t = utc_now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.as_bytes()[10] == b'T' && t.ends_with('Z'), "{t}");
    }

    #[test]
    fn the_connection_bound_follows_the_descriptors() {
        assert_eq!(capacity(1024), MAX_CONNECTIONS);
        assert_eq!(capacity(128), 32);
        assert_eq!(capacity(20), 1);
        assert_eq!(capacity(1 << 20), MAX_CONNECTIONS);
    }

    #[test]
    fn open_tunnels_leave_a_share_of_the_slots() {
        assert_eq!(tunnel_cap(256), 224);
        assert_eq!(tunnel_cap(32), 28);
        assert_eq!(tunnel_cap(2), 1);
        assert_eq!(tunnel_cap(1), 1);
    }
}
