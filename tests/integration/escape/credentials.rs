//! Attempts through the credentials sync (`state::credsync`): the agent writes its bound
//! `.credentials.json` after the host's file was replaced by rename, so that the sync
//! process on the host is the one that copies it out. What the agent has today is the
//! content of that one file; through the sync it must get no more: content that is no
//! JSON object or larger than 64 KiB never reaches the host's file, a symlink or a
//! path-like content writes nothing elsewhere, and nothing else in the host's `~/.claude`
//! or home changes. Controls: the same writes without a rename (the host's very file is
//! bound, as before the sync existed) do reach the host's file, so the checks can fail.
//!
//! And with no login on the host: the agent puts a FIFO (holding its write end), a
//! symlink or a directory in place of the shared login directory's `.credentials.json`,
//! which every other project's claude opens at its start (with an API key too) and
//! would block on for ever, or follow. That file is a mount point of its own in every
//! sandbox, so nothing can take its place. Control: the host's opt-in (its
//! `CLAUDE_SECURESTORAGE_CONFIG_DIR` is the login directory, where the host's own file is
//! read by path and nothing is bound over it): the same plant succeeds.

use super::*;
use crate::BIN;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

/// The host's login after its claude refreshed (by rename, so a new inode).
const HOST_PAIR: &str =
    r#"{"claudeAiOauth":{"accessToken":"host-a1","refreshToken":"host-r1","expiresAt":2000}}"#;
const LAUNCH_LIMIT: Duration = Duration::from_secs(60);

struct Fixture {
    w: World,
    proj: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let w = World::new(BIN);
        let proj = w.dir("proj");
        let h = w.home();
        write(
            &h.join(".claude/.credentials.json"),
            r#"{"claudeAiOauth":{"accessToken":"a0","refreshToken":"r0","expiresAt":1000}}"#,
        );
        write(&h.join(".claude/settings.json"), "{}\n");
        write(&h.join(".bashrc"), "# the host's\n");
        Fixture { w, proj }
    }
    fn creds(&self) -> PathBuf {
        self.w.home().join(".claude/.credentials.json")
    }
    /// Whether the home comes back to `before` within 3 s: a sync still finishing its
    /// last copy as the launch ends holds the host's refresh lock (a directory of its own
    /// name) for a moment; a write that went elsewhere stays.
    fn settles_to(&self, before: &[(PathBuf, Vec<u8>)]) -> bool {
        let end = Instant::now() + Duration::from_secs(3);
        loop {
            let now = self.snapshot();
            if now == before {
                return true;
            }
            if Instant::now() > end {
                eprintln!(
                    "the home did not come back: {:?}",
                    now.iter()
                        .filter(|e| !before.contains(e))
                        .map(|(p, _)| p)
                        .collect::<Vec<_>>()
                );
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    /// Every path under the host's home (the sandbox's own state aside) with its size
    /// and content hash, to see that nothing else changed.
    fn snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        fn walk(d: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
            for e in fs::read_dir(d).into_iter().flatten().flatten() {
                let p = e.path();
                let t = e.file_type().unwrap();
                if t.is_dir() {
                    out.push((p.clone(), b"dir".to_vec()));
                    walk(&p, out);
                } else if t.is_symlink() {
                    out.push((
                        p.clone(),
                        fs::read_link(&p).unwrap().into_os_string().into_vec(),
                    ));
                } else {
                    out.push((p.clone(), fs::read(&p).unwrap_or_default()));
                }
            }
        }
        let mut v = Vec::new();
        walk(&self.w.home(), &mut v);
        let state = self.w.home().join(".claudebox");
        v.retain(|(p, _)| !p.starts_with(&state) && *p != self.creds());
        v.sort();
        v
    }

    /// Runs `script` in a sandbox; once it is up, the host's file is replaced by rename
    /// (`rename`) or left as it is, then the script writes; the sandbox lingers 1 s so the
    /// sync acts. Returns the host's file afterwards (`None`: not a regular file).
    fn run(&self, script: &str, rename: bool) -> Option<Vec<u8>> {
        let p = &self.proj;
        let _ = fs::remove_file(p.join("go"));
        let _ = fs::remove_file(p.join("ready"));
        let full = format!(
            "touch ready; i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; \
             i=$((i+1)); done; C=\"$HOME/.claude/.credentials.json\"; {script}; sleep 1; \
             echo ATTEMPT-RAN"
        );
        let mut cmd = self.w.cmd(p);
        // The credentials sync is the path without the broker.
        cmd.args(["--no-login-broker", "--exec", "sh", "-c", &full]);
        let out = std::thread::scope(|s| {
            let h = s.spawn(|| lab::agent::output_within(&mut cmd, LAUNCH_LIMIT));
            let t = Instant::now();
            while !p.join("ready").exists() {
                assert!(t.elapsed() < LAUNCH_LIMIT, "the sandbox did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
            if rename {
                let tmp = self.w.home().join(".claude/.credentials.json.tmp.host");
                fs::write(&tmp, HOST_PAIR).unwrap();
                fs::rename(&tmp, self.creds()).unwrap();
            }
            std::thread::sleep(Duration::from_millis(300));
            fs::write(p.join("go"), b"").unwrap();
            h.join().unwrap()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            stdout(&out).contains("ATTEMPT-RAN"),
            "{}{}",
            stdout(&out),
            stderr(&out)
        );
        let m = fs::symlink_metadata(self.creds()).ok()?;
        m.is_file().then(|| fs::read(self.creds()).unwrap())
    }
}

/// The host's file is a JSON object no larger than 64 KiB.
fn sound(content: &Option<Vec<u8>>) -> bool {
    content.as_ref().is_some_and(|c| {
        c.len() <= 64 * 1024
            && matches!(
                serde_json::from_slice::<serde_json::Value>(c),
                Ok(serde_json::Value::Object(_))
            )
    })
}

/// The agent's writes: each bad for the host's file.
const BAD_WRITES: &[(&str, &str)] = &[
    (
        "credentials sync: non-JSON content into the bound file reaches the host's",
        "printf 'not json at all' > \"$C\"",
    ),
    (
        "credentials sync: a JSON array into the bound file reaches the host's",
        "printf '[\"x\"]' > \"$C\"",
    ),
    (
        "credentials sync: a 100 KiB JSON object into the bound file reaches the host's",
        "{ printf '{\"a\":\"'; head -c 100000 /dev/zero | tr '\\0' x; printf '\"}'; } > \"$C\"",
    ),
    (
        "credentials sync: an empty bound file reaches the host's",
        ": > \"$C\"",
    ),
];

/// Plants in place of the login directory's `.credentials.json`: each prints PLANTED when
/// the name then holds something else than the regular file.
const PLANT: &str = r#"
L="$CLAUDE_SECURESTORAGE_CONFIG_DIR"; F="$L/.credentials.json"
planted() { [ -p "$F" ] || [ -L "$F" ] || [ -d "$F" ] || [ ! -e "$F" ]; }
mkfifo "$L/cb-fifo" && mv -f "$L/cb-fifo" "$F" 2>/dev/null; planted && echo "PLANTED fifo renamed over"
rm -f "$F" 2>/dev/null && { mkfifo "$F" 2>/dev/null; planted && echo "PLANTED fifo after rm"; }
ln -sfn /etc/passwd "$L/cb-link" && mv -fT "$L/cb-link" "$F" 2>/dev/null; planted && echo "PLANTED symlink"
mkdir "$L/cb-dir" && mv -fT "$L/cb-dir" "$F" 2>/dev/null; planted && echo "PLANTED directory"
rm -rf "$L/cb-fifo" "$L/cb-link" "$L/cb-dir"
echo PLANT-RAN
"#;

/// Runs [`PLANT`] in a sandbox of a home with no `~/.claude/.credentials.json`; with
/// `opt_in`, the host's claude keeps its login in the login directory
/// (`CLAUDE_SECURESTORAGE_CONFIG_DIR`, the README's opt-in). Returns (planted: the script
/// said so or the host's file there is no regular file afterwards, its output).
fn plant_login(opt_in: bool) -> (bool, String) {
    let w = World::new(BIN);
    let proj = w.dir("proj");
    init_repo(&proj);
    let login = w.state().join("login");
    let mut cmd = w.cmd(&proj);
    if opt_in {
        fs::create_dir_all(&login).unwrap();
        write(
            &login.join(".credentials.json"),
            r#"{"claudeAiOauth":{"accessToken":"a0","refreshToken":"r0","expiresAt":1}}"#,
        );
        cmd.env("CLAUDE_SECURESTORAGE_CONFIG_DIR", &login);
    }
    let out = cmd
        .args(["--no-login-broker", "--exec", "sh", "-c", PLANT])
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("PLANT-RAN"), "{text}");
    let regular = fs::symlink_metadata(login.join(".credentials.json")).is_ok_and(|m| m.is_file());
    (text.contains("PLANTED") || !regular, text)
}

pub(crate) fn attempts() -> Vec<(&'static str, bool)> {
    let mut v = Vec::new();
    let (planted, text) = plant_login(false);
    if planted {
        eprintln!("{text}");
    }
    v.push((
        "login directory: a FIFO, symlink or directory in place of .credentials.json (no host \
         login) for other projects' claude to block on or follow",
        planted,
    ));
    for (name, write) in BAD_WRITES {
        let f = Fixture::new();
        let before = f.snapshot();
        let host = f.run(write, true);
        let escaped = !sound(&host)
            || host.as_deref() != Some(HOST_PAIR.as_bytes())
            || !f.settles_to(&before);
        v.push((*name, escaped));
    }
    // The bound file swapped for a symlink (to the host's .bashrc, as the agent sees it),
    // or path-like content: nothing is written anywhere else.
    let f = Fixture::new();
    let before = f.snapshot();
    let host = f.run(
        "ln -sf \"$HOME/.bashrc\" \"$C\" 2>/dev/null; rm -f \"$C\" 2>/dev/null; \
         ln -s /etc/passwd \"$C\" 2>/dev/null; \
         printf '{\"path\":\"../../.bashrc\",\"file\":\"/etc/passwd\"}' > \"$C\"",
        true,
    );
    let escaped = !sound(&host) || !f.settles_to(&before);
    v.push((
        "credentials sync: a symlink or a path in the bound file makes the sync write elsewhere",
        escaped,
    ));
    // A valid pair the agent writes does reach the host's file (as it did before the
    // sync, by the same inode): the agent has the file's content, no more, no less.
    let host = host.unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&host).contains("../../.bashrc"),
        "a JSON object written inside reaches the host's file: {}",
        String::from_utf8_lossy(&host)
    );
    v
}

/// Without a rename the bound file is the host's very file: the same bad writes reach it
/// (what the agent could always do), so the checks above can see one.
pub(crate) fn controls() {
    let (planted, text) = plant_login(true);
    assert!(
        planted,
        "control: the plant in the opt-in's login directory (nothing bound) failed:\n{text}"
    );
    // Each write in its own fixture, all at once (without a rename there is nothing to
    // race: the write lands in the host's file itself).
    std::thread::scope(|s| {
        for (name, write) in BAD_WRITES {
            s.spawn(move || {
                let f = Fixture::new();
                let ino = fs::metadata(f.creds()).unwrap().ino();
                let host = f.run(write, false);
                assert_eq!(fs::metadata(f.creds()).unwrap().ino(), ino);
                assert!(
                    !sound(&host),
                    "control of {name:?}: the write did not reach the host's file"
                );
            });
        }
    });
}
