//! Codex's login shared by every Codex sandbox (`~/.claudebox/codex-login/auth.json`,
//! read-write inside each: `~/.codex/auth.json` is a symlink to it), issue 34: a sandbox
//! of project A puts a FIFO or a dangling symlink at its name; then the real Codex in
//! project B runs `codex login status`. Each Codex launch checks the login (a regular file
//! opened without following or blocking, owned by the user, a JSON object) and replaces it
//! from the host's `~/.codex/auth.json`: B's Codex sees the host's login. The control, the
//! same with the check off (`CLAUDEBOX_TEST_NO_LOGIN_CHECK`, debug builds): B's Codex hangs
//! on the FIFO (measured: Codex 0.169.0 blocks in open) or says "Not logged in".

use super::*;
use crate::BIN;
use lab::agent::{codex_versions, output_within};
use std::time::Duration;

const HOST_LOGIN: &str = "{\"auth_mode\":\"apikey\",\"OPENAI_API_KEY\":\"sk-host-login-77aa\"}\n";
const LIMIT: Duration = Duration::from_secs(20);

/// The plants, each as the shell text A runs on the login's real path `$t`.
const PLANTS: [(&str, &str); 2] = [
    (
        "a FIFO at Codex's shared login hangs codex in another project",
        "mkfifo \"$t\"",
    ),
    (
        "a dangling symlink at Codex's shared login logs another project out",
        "ln -s /nonexistent-login \"$t\"",
    ),
];

/// One attempt: A plants, B runs `codex login status`; whether B's Codex lost the host's
/// login (hung, or not logged in), and what it printed.
fn one(plant: &str, check_off: bool) -> Option<(bool, String)> {
    let c = codex_versions().into_iter().next()?;
    let w = World::new(BIN);
    std::os::unix::fs::symlink(&c.bin, w.bin().join("codex")).unwrap();
    write(&w.home().join(".codex/auth.json"), HOST_LOGIN);
    let a = w.dir("a");
    init_repo(&a);
    let b = w.dir("b");
    init_repo(&b);
    let o = w
        .cmd(&a)
        .args(["--agent", "codex", "--exec", "sh", "-c"])
        .arg(format!(
            "t=$(readlink ~/.codex/auth.json) && rm -f \"$t\" && {plant} && echo PLANTED"
        ))
        .output()
        .unwrap();
    assert!(
        stdout(&o).contains("PLANTED"),
        "A could not plant: {}{}",
        stdout(&o),
        stderr(&o)
    );
    let mut cmd = w.cmd(&b);
    cmd.args(["--agent", "codex", "login", "status"]);
    if check_off {
        cmd.env("CLAUDEBOX_TEST_NO_LOGIN_CHECK", "1");
    }
    Some(match output_within(&mut cmd, LIMIT) {
        Err(text) => (true, format!("B's codex hung: {text}")),
        Ok(o) => {
            let text = format!("{}{}", stdout(&o), stderr(&o));
            let kept = o.status.success() && text.contains("API key configured");
            if !check_off {
                assert!(
                    text.contains("replaced by your"),
                    "B's launch did not say it replaced the login:\n{text}"
                );
            }
            (!kept, text)
        }
    })
}

pub(super) fn attempts() -> Vec<(&'static str, bool)> {
    PLANTS
        .iter()
        .filter_map(|(name, plant)| {
            let (escaped, text) = one(plant, false)?;
            if escaped {
                eprintln!("{name}:\n{text}");
            }
            Some((*name, escaped))
        })
        .collect()
}

pub(super) fn controls() {
    for (name, plant) in PLANTS {
        if let Some((escaped, text)) = one(plant, true) {
            assert!(escaped, "control of {name:?}: B kept the login:\n{text}");
        }
    }
}
