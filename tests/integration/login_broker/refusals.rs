//! The broker's refusals go to the project's denied log, as the allowlist's denied hosts
//! do: one line per refusal (code, method, path without its query, reason), escaped (the
//! agent chooses those bytes), and with `--log-denied` on stderr. Control: a request the
//! broker lends the login to leaves no line.

use std::fs;

use serde_json::json;

use super::{run, setup};
use crate::BIN;
use lab::World;

/// Inside: one accepted request, one refused by its path (with a query holding a
/// secret-looking word), one whose path holds a terminal escape, a direction override and
/// a byte that is not UTF-8 (the parser refuses it: only printable ASCII reaches a
/// method or a path, and what is logged of it is escaped all the same).
const SCRIPT: &str = r#"
import http.client, json, os, ssl
login = json.load(open(os.path.join(os.environ["CLAUDE_SECURESTORAGE_CONFIG_DIR"], ".credentials.json")))
own = login["claudeAiOauth"]["accessToken"]
port = int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])
import base64, urllib.parse
u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
PA = {"Proxy-Authorization": "Basic " + base64.b64encode(("%s:%s" % (u.username, u.password)).encode()).decode()} if u.username else {}
ctx = ssl.create_default_context(cafile=os.environ["NODE_EXTRA_CA_CERTS"])
def send(name, path):
    try:
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=20)
        c.set_tunnel("api.anthropic.com", 443, headers=PA)
        c.connect()
        body = b"{}"
        c.sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: api.anthropic.com\r\n"
            + b"Authorization: Bearer " + own.encode() + b"\r\nContent-Type: application/json\r\n"
            + b"Content-Length: 2\r\n\r\n" + body)
        r = http.client.HTTPResponse(c.sock)
        r.begin()
        print(name, r.status)
    except Exception as e:
        print(name, "error", type(e).__name__)
send("accepted", b"/v1/messages/count_tokens")
send("mint", b"/api/oauth/claude_cli/create_api_key?hush=QUERY-SECRET")
send("odd", b"/odd/\x1b[31m\xe2\x80\xae\xff")
"#;

pub(super) fn denied_log(w: &World) -> String {
    let mut out = String::new();
    for e in fs::read_dir(w.state().join("projects")).unwrap().flatten() {
        out += &fs::read_to_string(e.path().join("network-denied.log")).unwrap_or_default();
    }
    out
}

#[test]
fn each_refusal_is_in_the_denied_log_once_and_escaped() {
    let w = World::new(BIN);
    let (p, mock) = setup(&w, &json!([]));
    let o = run(
        &w,
        &p,
        &mock,
        &[
            "--login-broker",
            "--log-denied",
            "--network",
            "none",
            "--exec",
            "python3",
            "-c",
            SCRIPT,
        ],
    );
    let out = lab::stdout(&o);
    let err = lab::stderr(&o);
    for want in ["accepted 200", "mint 403", "odd 400"] {
        assert!(out.contains(want), "no {want:?}:\n{out}\n{err}");
    }
    let log = denied_log(&w);
    let lines: Vec<&str> = log.lines().collect();
    let mint: Vec<&&str> = (lines.iter())
        .filter(|l| {
            l.contains("refused login broker 403 POST /api/oauth/claude_cli/create_api_key:")
        })
        .collect();
    assert_eq!(mint.len(), 1, "the refusal once:\n{log}");
    assert!(mint[0].contains("is not lent the login"), "{log}");
    let odd: Vec<&&str> = (lines.iter())
        .filter(|l| l.contains("refused login broker 400 - -: malformed request"))
        .collect();
    assert_eq!(odd.len(), 1, "the unparsed request once:\n{log}");
    assert!(
        !log.contains('\u{1b}') && !log.contains('\u{202e}') && !log.contains("QUERY-SECRET"),
        "raw bytes or the query in the log:\n{log}"
    );
    // With --log-denied the same lines reach the terminal, escaped too.
    assert!(
        err.contains("claudebox: network: refused login broker 403 POST /api/oauth/claude_cli/create_api_key:")
            && !err.contains('\u{1b}'),
        "{err}"
    );
    // Control: the accepted request left no line.
    assert!(!log.contains("count_tokens"), "{log}");
    assert_eq!(lines.len(), 2, "{log}");
}
