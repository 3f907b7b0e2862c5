//! Keeping the login's credentials file bound into a sandbox in step with the host's (the
//! policy; the process is `state::credsync`).
//!
//! The host's `.credentials.json` is bound into a sandbox as a single file: the sandbox
//! holds that inode (B) for its life, until the sync mounts a file of its own over it.
//! Claude on the host refreshes by temp file + rename, so after a host refresh the host's
//! file is a new inode (H) and B keeps a spent, single-use refresh token; and a sandbox
//! refreshing in place afterwards writes into B, which the host no longer reads. A small
//! host-side process per sandbox watches both and copies the newer content across (into
//! the sandbox as a new file mounted over B, so that no reader inside sees a file being
//! written); [`decide`] says which way, from the two contents and the content both last
//! agreed on.

use crate::policy::mount::MountKind;
use crate::policy::plan::Plan;

/// The largest credentials file copied either way (claude's is a few hundred bytes).
pub const MAX_SIZE: u64 = 64 * 1024;

/// The hidden role of the sync process.
pub const INTERNAL_CREDENTIALS_SYNC: &str = "--internal-credentials-sync";

/// Set (to anything non-empty) to start no sync process: the tests' control.
pub const DISABLE_ENV: &str = "CLAUDEBOX_NO_CREDENTIALS_SYNC";

/// The shortest time between two copies of one sync: a burst of writes (an agent
/// rewriting its credentials file in a loop) is coalesced into one copy per interval,
/// the first at once, the last at the end of the interval.
pub const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// How often a sync without an inotify instance (the user's
/// `fs.inotify.max_user_instances` spent) looks at both files.
pub const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// JSON's insignificant whitespace, which pads a file written in place to the length it
/// had (a shorter content never leaves a tail and the file is never truncated, so a
/// reader at any moment reads one whole JSON text).
pub fn is_json_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\t' | b'\r')
}

/// `content` without its trailing JSON whitespace (the padding of an in-place write):
/// what is compared and copied.
pub fn trimmed(content: &[u8]) -> &[u8] {
    let end = content
        .iter()
        .rposition(|&b| !is_json_space(b))
        .map_or(0, |i| i + 1);
    &content[..end]
}

/// What to write at offset 0 of a file `old_len` long so that it holds `content` without
/// being truncated: `content`, padded with spaces to `old_len` when shorter.
pub fn padded(content: &[u8], old_len: u64) -> Vec<u8> {
    let mut out = content.to_vec();
    if (out.len() as u64) < old_len {
        out.resize(old_len as usize, b' ');
    }
    out
}

/// What the sync process does after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do (same file, same content, or nothing valid to copy).
    Nothing,
    /// The host's content goes into the bound file (in place).
    ToBound,
    /// The bound file's content goes into the host's file.
    ToHost,
}

/// One side as read: its inode and content (`None`: missing, not a regular file, too
/// big, unreadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    pub inode: (u64, u64),
    pub content: Vec<u8>,
}

/// Content that may be copied: a JSON object.
pub fn valid(content: &[u8]) -> bool {
    content.len() as u64 <= MAX_SIZE
        && matches!(
            serde_json::from_slice::<serde_json::Value>(content),
            Ok(serde_json::Value::Object(_))
        )
}

/// `claudeAiOauth.expiresAt` (milliseconds), when there is one: the newer refresh has the
/// later one.
pub fn expires_at(content: &[u8]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(content).ok()?;
    v.get("claudeAiOauth")?.get("expiresAt")?.as_u64()
}

/// Which way to copy, given the host's file, the bound one and the content both held at
/// the last sync (`last`). Rules:
/// - the same inode, or the same content: nothing (a copy's own event ends here);
/// - only one side changed since `last`: that side wins;
/// - both changed: the later `claudeAiOauth.expiresAt` wins (refresh tokens are
///   single-use, so of two refreshes from one token only one succeeded, and it carries
///   the later expiry; the loser cleared its tokens), the host on a tie (the user's own);
/// - content that is no JSON object (or larger than [`MAX_SIZE`]) is never copied, and a
///   missing host file is never recreated (a logout on the host stays a logout).
pub fn decide(host: Option<&Side>, bound: &Side, last: &[u8]) -> Action {
    let Some(host) = host else {
        return Action::Nothing;
    };
    if host.inode == bound.inode || host.content == bound.content {
        return Action::Nothing;
    }
    let host_changed = host.content != last;
    let bound_changed = bound.content != last;
    let want = match (host_changed, bound_changed) {
        (true, false) => Action::ToBound,
        (false, true) => Action::ToHost,
        _ => {
            if expires_at(&bound.content) > expires_at(&host.content) {
                Action::ToHost
            } else {
                Action::ToBound
            }
        }
    };
    let from = match want {
        Action::ToBound => &host.content,
        _ => &bound.content,
    };
    if valid(from) {
        want
    } else {
        Action::Nothing
    }
}

/// The plan's mount of the host's credentials file (a read-write single-file bind of a
/// `.credentials.json` from outside claudebox's state), by index: the sync process holds
/// that mount's inode. The login directory's own file, bound onto itself when the host
/// has none (see `claude_home::overlays`), is no host's: nothing to keep in step.
pub fn bound_index(plan: &Plan) -> Option<usize> {
    let name = Some(std::ffi::OsStr::new(".credentials.json"));
    let state_home = plan.state_dir.parent().and_then(std::path::Path::parent);
    plan.mounts.iter().position(|m| {
        m.kind == MountKind::File
            && m.target.file_name() == name
            && m.source.as_deref().is_some_and(|s| {
                s.file_name() == name && !state_home.is_some_and(|h| s.starts_with(h))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(ino: u64, s: &str) -> Side {
        Side {
            inode: (1, ino),
            content: s.as_bytes().to_vec(),
        }
    }
    const OLD: &str = r#"{"claudeAiOauth":{"refreshToken":"r1","expiresAt":1000}}"#;
    const NEW: &str = r#"{"claudeAiOauth":{"refreshToken":"r2","expiresAt":2000}}"#;
    const NEWER: &str = r#"{"claudeAiOauth":{"refreshToken":"r3","expiresAt":3000}}"#;
    const CLEARED: &str = r#"{"claudeAiOauth":{}}"#;

    #[test]
    fn one_file_or_equal_content_is_left_alone() {
        let b = side(1, OLD);
        assert_eq!(
            decide(Some(&side(1, NEW)), &b, OLD.as_bytes()),
            Action::Nothing
        );
        assert_eq!(
            decide(Some(&side(2, OLD)), &b, OLD.as_bytes()),
            Action::Nothing
        );
        assert_eq!(decide(None, &side(1, NEW), OLD.as_bytes()), Action::Nothing);
    }

    #[test]
    fn the_side_that_changed_wins() {
        let last = OLD.as_bytes();
        assert_eq!(
            decide(Some(&side(2, NEW)), &side(1, OLD), last),
            Action::ToBound
        );
        assert_eq!(
            decide(Some(&side(2, OLD)), &side(1, NEW), last),
            Action::ToHost
        );
        // Even an older expiry: the side that moved is the one that was written.
        assert_eq!(
            decide(Some(&side(2, NEW)), &side(1, NEWER), NEWER.as_bytes()),
            Action::ToBound
        );
    }

    #[test]
    fn both_changed_the_later_expiry_wins_the_host_on_a_tie() {
        let last = OLD.as_bytes();
        assert_eq!(
            decide(Some(&side(2, NEW)), &side(1, NEWER), last),
            Action::ToHost
        );
        assert_eq!(
            decide(Some(&side(2, NEWER)), &side(1, NEW), last),
            Action::ToBound
        );
        // The loser of two refreshes cleared its tokens: the live pair wins either way.
        assert_eq!(
            decide(Some(&side(2, CLEARED)), &side(1, NEW), last),
            Action::ToHost
        );
        assert_eq!(
            decide(Some(&side(2, NEW)), &side(1, CLEARED), last),
            Action::ToBound
        );
        assert_eq!(
            decide(Some(&side(2, "{}")), &side(1, "[]"), last),
            Action::ToBound
        );
    }

    #[test]
    fn padding_keeps_the_length_and_trims_back_to_the_content() {
        let p = padded(b"{}", 6);
        assert_eq!(p, b"{}    ");
        assert!(valid(&p));
        assert_eq!(trimmed(&p), b"{}");
        assert_eq!(padded(b"{\"a\":1}", 2), b"{\"a\":1}");
        assert_eq!(trimmed(b"{} \n\t\r"), b"{}");
        assert_eq!(trimmed(b"   "), b"");
        // Every prefix state of an in-place write over a longer text is that text's
        // head followed by the rest of the old one: with padding, every whole state
        // (before, after) is valid.
        assert!(valid(&padded(OLD.as_bytes(), NEW.len() as u64 + 40)));
    }

    /// Only the host's file is kept in step: the login directory's own file, bound onto
    /// itself when the host has none, is no bound host file.
    #[test]
    fn the_bound_host_file_is_found_the_login_dirs_own_is_not() {
        use crate::policy::plan::{build, tests::test_inputs};
        let mut inp = test_inputs();
        let plan = build(&inp);
        let own = std::path::Path::new("/h/.claudebox/login/.credentials.json");
        assert!(plan
            .mounts
            .iter()
            .any(|m| m.kind == MountKind::File && m.source.as_deref() == Some(own)));
        assert_eq!(bound_index(&plan), None);
        inp.claude_home.credentials = Some("/h/.claude/.credentials.json".into());
        let plan = build(&inp);
        let i = bound_index(&plan).expect("the host's file is bound");
        assert_eq!(
            plan.mounts[i].source.as_deref(),
            Some(std::path::Path::new("/h/.claude/.credentials.json"))
        );
    }

    #[test]
    fn no_json_object_is_ever_copied() {
        let last = OLD.as_bytes();
        for bad in ["", "not json", "[1,2]", "\"s\"", "{\"a\":", "null"] {
            assert_eq!(
                decide(Some(&side(2, OLD)), &side(1, bad), last),
                Action::Nothing,
                "{bad}"
            );
            assert_eq!(
                decide(Some(&side(2, bad)), &side(1, OLD), last),
                Action::Nothing,
                "{bad}"
            );
        }
        let huge = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_SIZE as usize));
        assert!(!valid(huge.as_bytes()));
        assert_eq!(
            decide(Some(&side(2, OLD)), &side(1, &huge), last),
            Action::Nothing
        );
    }
}
