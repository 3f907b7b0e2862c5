//! Real conversations: the real Claude Code (both the pinned and the newest version) runs
//! through claudebox against the lab's mock Messages API (`tests/lab/mock_api.py`, see
//! `lab::lab`): `-p` runs whose Bash and Write tool calls change the project, named
//! sessions resumed from elsewhere in the project, the TUI under tmux, and allowlist mode
//! with the API reached only through claudebox's proxy.
//!
//! The binaries come from `CLAUDEBOX_TEST_CLAUDE` and `CLAUDEBOX_TEST_CLAUDE_LATEST`
//! (scripts/test installs both); without them these tests fail unless
//! `CLAUDEBOX_SKIP_E2E=1`.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};

use crate::BIN;
use lab::agent::*;
use lab::tmux::Tmux;
use lab::*;

/// How long one claudebox run may take before the test fails (and kills it).
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// `claudebox ARGS` in `cwd`, pointed at `mock`, bounded in time.
fn claudebox(w: &World, cwd: &Path, mock: &MockApi, args: &[&str]) -> Output {
    run_claudebox(w, cwd, mock, args, &[], RUN_LIMIT)
}

/// Every `.jsonl` transcript under `dir`, recursively.
fn transcripts(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(transcripts(&p));
        } else if p.extension().is_some_and(|x| x == "jsonl") {
            out.push(p);
        }
    }
    out
}

/// The transcripts claudebox keeps for the world's projects (`<id>/claude-projects/`).
fn kept_transcripts(w: &World) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(w.state().join("projects"))
        .into_iter()
        .flatten()
        .flatten()
    {
        out.extend(transcripts(&e.path().join("claude-projects")));
    }
    out
}

/// A plain HTTP/1.1 request to the mock; returns the status line and the body.
fn http(port: u16, method: &str, path: &str, body: &Value) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let data = serde_json::to_vec(body).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        data.len()
    )
    .unwrap();
    s.write_all(&data).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The lab itself, without claude: the conversation takes script turns in order (SSE with
/// text and tool_use, or JSON), side calls take none, the log records every request.
#[test]
fn mock_api_plays_its_script_and_logs_every_request() {
    let mock = MockApi::start(&json!([
        {"text": "first", "chunks": 3},
        {"bash": {"command": "touch x", "description": "make x"}},
    ]));
    let tools = json!([{"name": "Bash", "input_schema": {}}]);
    let (st, body) = http(
        mock.port(),
        "POST",
        "/v1/messages?beta=true",
        &json!({"stream": true, "tools": tools, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert!(st.contains("200"), "{st}");
    for ev in [
        "event: message_start",
        "event: content_block_start",
        "\"text_delta\"",
        "event: content_block_stop",
        "\"end_turn\"",
        "event: message_stop",
    ] {
        assert!(body.contains(ev), "no {ev} in:\n{body}");
    }
    let text: String = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["delta"]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, "first");

    // side calls in between take no turn
    let (_, title) = http(
        mock.port(),
        "POST",
        "/v1/messages",
        &json!({"stream": false, "messages": [],
                "output_config": {"format": {"type": "json_schema"}}}),
    );
    let title: Value = serde_json::from_str(&title).unwrap();
    let title_text = title["content"][0]["text"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(title_text).is_ok(), "{title}");
    let (_, cls) = http(
        mock.port(),
        "POST",
        "/v1/messages",
        &json!({"stream": false, "messages": []}),
    );
    assert!(cls.contains("<block>no</block>"), "{cls}");
    assert!(http(mock.port(), "HEAD", "/api/hello", &json!(null))
        .0
        .contains("200"));
    let (st, count) = http(
        mock.port(),
        "POST",
        "/v1/messages/count_tokens?beta=true",
        &json!({"messages": []}),
    );
    assert!(
        st.contains("200") && count.contains("input_tokens"),
        "{count}"
    );
    assert!(http(mock.port(), "GET", "/v1/models", &json!(null))
        .0
        .contains("404"));

    // the second conversation request gets the tool call, here as plain JSON
    let (_, tool) = http(
        mock.port(),
        "POST",
        "/v1/messages",
        &json!({"stream": false, "tools": tools, "messages": []}),
    );
    let tool: Value = serde_json::from_str(&tool).unwrap();
    assert_eq!(tool["stop_reason"], "tool_use", "{tool}");
    assert_eq!(tool["content"][0]["name"], "Bash");
    assert_eq!(tool["content"][0]["input"]["command"], "touch x");
    // then the script is over: the final text
    let (_, fin) = http(
        mock.port(),
        "POST",
        "/v1/messages",
        &json!({"stream": false, "tools": tools, "messages": []}),
    );
    assert!(fin.contains("the script is over"), "{fin}");

    let log = mock.requests();
    let kinds: Vec<&str> = log.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "conversation",
            "title",
            "classifier",
            "head",
            "count_tokens",
            "other",
            "conversation",
            "conversation"
        ]
    );
    assert_eq!(log[0]["turn"], 0);
    assert_eq!(log[6]["turn"], 1);
    assert!(log[7].get("turn").is_none());
    // every answer to a Messages request went out in full
    for r in log
        .iter()
        .filter(|r| ["conversation", "title", "classifier"].contains(&r["kind"].as_str().unwrap()))
    {
        assert_eq!(mock.answer_complete(&r["id"]), Some(true), "{r}");
    }
    assert!(messages_text(&log[0]).contains("hi\n"));
    assert_eq!(mock.conversation(1).len(), 2);

    // loopback only: the host's own address on its outward interface gets no answer
    let outward = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|u| u.connect("192.0.2.1:9").map(|_| u))
        .and_then(|u| u.local_addr())
        .map(|a| a.ip());
    match outward {
        Ok(ip) if !ip.is_loopback() && !ip.is_unspecified() => {
            assert!(
                TcpStream::connect_timeout(&(ip, mock.port()).into(), Duration::from_secs(2))
                    .is_err(),
                "the mock answers on {ip}"
            );
        }
        other => eprintln!("no outward address to check the mock against: {other:?}"),
    }
}

/// `claudebox -p` in open mode: the answer's Bash tool call creates a file in the work
/// tree, which is there on the host afterwards; the answer reaches stdout; the transcript
/// is in claudebox's state, not in the host's `~/.claude/projects`.
#[test]
fn print_mode_bash_tool_call_changes_the_project() {
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        let mock = MockApi::start(&json!([
            {"text": "Creating it.",
             "bash": {"command": "echo made-by-bash > created-by-bash.txt",
                      "description": "create a file"}},
            "BASH-DONE-ANSWER",
        ]));
        let o = claudebox(
            &w,
            &p,
            &mock,
            &["-p", "make the file", "--allowedTools", "Bash"],
        );
        let out = ok_run(&c, &o, &mock);
        assert!(
            out.contains("BASH-DONE-ANSWER"),
            "[{}] stdout: {out}",
            c.label
        );
        assert_eq!(
            fs::read_to_string(p.join("created-by-bash.txt")).unwrap_or_default(),
            "made-by-bash\n",
            "[{}] the Bash tool call did not reach the work tree",
            c.label
        );
        // claude sent the tool's result back
        let conv = mock.conversation(0);
        assert_eq!(conv.len(), 2, "[{}] {conv:#?}", c.label);
        assert!(
            messages_text(&conv[1]).contains("tool_result"),
            "[{}]",
            c.label
        );
        // the key was sent, and the log keeps only its tail
        let key = conv[0]["headers"]["x-api-key"].as_str().unwrap_or_default();
        assert_eq!(key, "<redacted: 41 chars, ends '6789'>", "[{}]", c.label);
        assert!(
            !mock.log().iter().any(|r| r.to_string().contains(API_KEY)),
            "[{}] the log holds the API key",
            c.label
        );
        // the conversation is kept by claudebox, per project
        let kept = kept_transcripts(&w);
        assert_eq!(
            kept.len(),
            1,
            "[{}] transcripts in state: {kept:?}",
            c.label
        );
        assert!(
            fs::read_to_string(&kept[0])
                .unwrap()
                .contains("BASH-DONE-ANSWER"),
            "[{}]",
            c.label
        );
        assert!(
            transcripts(&w.home().join(".claude/projects")).is_empty(),
            "[{}] a transcript reached the host's ~/.claude/projects",
            c.label
        );
    }
}

/// A Write tool call: the file appears in the work tree on the host, with its content.
#[test]
fn print_mode_write_tool_call_writes_into_the_project() {
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        let target = p.join("sub dir").join("written by claude.txt");
        let mock = MockApi::start(&json!([
            {"write": {"file_path": target.to_str().unwrap(),
                       "content": "line one\nline two\n"}},
            "WRITE-DONE-ANSWER",
        ]));
        let o = claudebox(
            &w,
            &p,
            &mock,
            &["-p", "write the file", "--allowedTools", "Write"],
        );
        let out = ok_run(&c, &o, &mock);
        assert!(
            out.contains("WRITE-DONE-ANSWER"),
            "[{}] stdout: {out}",
            c.label
        );
        assert_eq!(
            fs::read_to_string(&target).unwrap_or_default(),
            "line one\nline two\n",
            "[{}] the Write tool call did not reach the work tree",
            c.label
        );
    }
}

/// `--session NAME` from the repo root, again from the root, from a subdirectory and from
/// a linked worktree: each resumed run sends claude's earlier messages to the API.
#[test]
fn named_session_resumes_from_root_subdirectory_and_worktree() {
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let repo = w.dir("repo");
        init_repo(&repo);
        let sub = repo.join("src").join("deep");
        fs::create_dir_all(&sub).unwrap();
        let wt = w.work().join("repo-wt");
        git(
            &repo,
            &["worktree", "add", "-q", "-b", "wt", wt.to_str().unwrap()],
        );
        let mock = MockApi::start(&json!([
            "ANSWER-ONE",
            "ANSWER-TWO",
            "ANSWER-THREE",
            "ANSWER-FOUR"
        ]));
        let runs: [(&Path, &str, &str); 4] = [
            (&repo, "PROMPT-ONE", "ANSWER-ONE"),
            (&repo, "PROMPT-TWO", "ANSWER-TWO"),
            (&sub, "PROMPT-THREE", "ANSWER-THREE"),
            (&wt, "PROMPT-FOUR", "ANSWER-FOUR"),
        ];
        let mut earlier: Vec<&str> = Vec::new();
        for (cwd, prompt, answer) in runs {
            let seen = mock.conversation(0).len();
            let o = claudebox(&w, cwd, &mock, &["--session", "lab", "-p", prompt]);
            let out = ok_run(&c, &o, &mock);
            assert!(
                out.contains(answer),
                "[{}] from {}: stdout: {out}",
                c.label,
                cwd.display()
            );
            let sent = mock.conversation(seen);
            assert!(!sent.is_empty(), "[{}] no request", c.label);
            let text = messages_text(&sent[0]);
            assert!(text.contains(prompt), "[{}] {text}", c.label);
            for e in &earlier {
                assert!(
                    text.contains(e),
                    "[{}] resumed from {}: the request lacks the earlier {e:?}:\n{text}",
                    c.label,
                    cwd.display()
                );
            }
            earlier.push(prompt);
            earlier.push(answer);
        }
        // one conversation, kept by claudebox
        let kept = kept_transcripts(&w);
        assert_eq!(kept.len(), 1, "[{}] {kept:?}", c.label);
    }
}

/// A screen line made of exactly `n` box-drawing dashes: claude's prompt rules span the
/// terminal's width.
fn has_rule_of_width(screen: &str, n: usize) -> bool {
    screen
        .lines()
        .any(|l| l.trim_end().chars().count() == n && l.trim_end().chars().all(|c| c == '─'))
}

/// The TUI under tmux: type a prompt and see the answer, resize the window (claude
/// redraws at the new width), Ctrl-C during a slow answer (the answer stops, claude
/// stays), `/exit`, and claudebox's exit status is 0.
#[test]
fn tui_under_tmux_answers_resizes_interrupts_and_exits_zero() {
    for c in lab::agent::each_claude_timed() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        seed_claude_json(&w.home(), &[&p]);
        let mock = MockApi::start(&json!([
            "HELLO-FROM-THE-MOCK",
            {"text": "SLOW-START one two three four five six seven eight nine ten SLOW-END",
             "chunks": 40, "chunk_delay_ms": 250},
        ]));
        let tmux = Tmux::new();
        let exit_file = tmux.dir.path().join("exit");
        let shell = format!(
            "{} ; echo EXIT=$? > {}",
            sh_quote(Path::new(BIN)),
            sh_quote(&exit_file)
        );
        tmux.start(&w, &mock, &p, (120, 40), &shell);
        let limit = Duration::from_secs(30);
        let label = c.label;

        tmux.wait_for(&format!("[{label}] the prompt"), limit, |s| {
            s.contains("Claude Code") && has_rule_of_width(s, 120)
        });
        tmux.type_line("say hello");
        tmux.wait_for(&format!("[{label}] the answer"), limit, |s| {
            s.contains("HELLO-FROM-THE-MOCK")
        });

        tmux.run(&["resize-window", "-x", "70", "-y", "25"]);
        tmux.wait_for(&format!("[{label}] a redraw at 70 columns"), limit, |s| {
            has_rule_of_width(s, 70) && !has_rule_of_width(s, 120)
        });

        let before = mock.conversation(0).len();
        tmux.type_line("answer slowly");
        // the answer is on its way (2.1.197 shows a line only once it is whole)
        tmux.wait_for(&format!("[{label}] the slow answer begins"), limit, |s| {
            s.contains("esc to interrupt") && mock.conversation(before).len() == 1
        });
        std::thread::sleep(Duration::from_millis(1500));
        let slow = mock.conversation(before).remove(0);
        assert_eq!(
            mock.answer_complete(&slow["id"]),
            None,
            "[{label}] too late"
        );
        tmux.run(&["send-keys", "C-c"]);
        let s = tmux.wait_for(&format!("[{label}] the interruption"), limit, |s| {
            s.contains("Interrupted")
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while mock.answer_complete(&slow["id"]).is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(
            mock.answer_complete(&slow["id"]),
            Some(false),
            "[{label}] claude did not drop the answer's connection on Ctrl-C"
        );
        assert!(!s.contains("SLOW-END"), "[{label}] not interrupted:\n{s}");
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !exit_file.exists(),
            "[{label}] Ctrl-C ended the session: {:?}\n{}",
            fs::read_to_string(&exit_file),
            tmux.screen()
        );

        tmux.type_line("/exit");
        let deadline = std::time::Instant::now() + limit;
        while !exit_file.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "[{label}] /exit did not end claudebox"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            fs::read_to_string(&exit_file).unwrap().trim(),
            "EXIT=0",
            "[{label}]"
        );
    }
}

/// `path` quoted for sh.
fn sh_quote(path: &Path) -> String {
    format!("'{}'", path.to_str().unwrap().replace('\'', r"'\''"))
}

/// Allowlist mode with the API on the host's loopback, allowed by `--allow-host
/// 127.0.0.1:PORT`: the sandbox has its own network namespace, so the request reaches
/// the mock only through claudebox's proxy; the answer reaches stdout, in bounded time.
/// Control: without `--allow-host`, nothing from inside reaches the mock.
#[test]
fn allowlist_reaches_a_loopback_api_only_through_the_proxy() {
    for c in lab::agent::each_claude() {
        let w = world_with(BIN, &c);
        let p = w.dir("proj");
        init_repo(&p);
        let mock = MockApi::start(&json!(["ANSWER-THROUGH-THE-PROXY"]));
        let allow = format!("127.0.0.1:{}", mock.port());

        // control: not allowed, a request from inside never reaches the mock
        assert_mock_unreachable(&w, &p, &mock, "allowlist", c.label);

        let mut cmd = w.cmd(&p);
        mock.point(&mut cmd)
            .args(["--allow-host", &allow, "-p", "hello through the proxy"]);
        // a real run takes a second or two; without the fix claude retries for minutes
        let o = output_within(&mut cmd, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("[{}] {e}", c.label));
        let out = ok_run(&c, &o, &mock);
        assert!(
            out.contains("ANSWER-THROUGH-THE-PROXY"),
            "[{}] stdout: {out}",
            c.label
        );
        let conv = mock.conversation(0);
        assert_eq!(conv.len(), 1, "[{}] {conv:#?}", c.label);
        assert!(messages_text(&conv[0]).contains("hello through the proxy"));
    }
}
