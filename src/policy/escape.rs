//! The one escaper for what claudebox prints: paths and values that come from the host,
//! the project or the agent (a directory name can hold a terminal escape sequence). Used by
//! the `--dry-run` tables and by every message; and the shell-quoted command line.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use shell_quote::Sh;

/// One table cell, or one value in a message: tabs, newlines, control characters
/// (ESC and the rest of C0 and C1, so no terminal escape sequence), Unicode direction
/// overrides and non-UTF-8 bytes shown as escapes, so a row stays one line and what the
/// project or the agent named cannot drive or fake the terminal.
pub fn escape_bytes(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\t' => out.extend_from_slice(b"\\t"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\\' => out.extend_from_slice(b"\\\\"),
                c if c.is_control() => {
                    out.extend_from_slice(format!("\\x{:02x}", c as u32).as_bytes())
                }
                '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
                    out.extend_from_slice(format!("\\u{{{:04x}}}", c as u32).as_bytes())
                }
                c => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        for b in chunk.invalid() {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        }
    }
    out
}

/// A path or value from the host, the project or the agent, as claudebox prints it in a
/// message: [`escape_bytes`], the one escaper.
#[allow(clippy::expect_used)] // escape_bytes emits ASCII escapes and whole UTF-8 sequences only
pub fn shown(value: impl AsRef<std::ffi::OsStr>) -> String {
    String::from_utf8(escape_bytes(value.as_ref().as_bytes())).expect("escape_bytes makes UTF-8")
}

/// [`shown`] as a method, for paths and OS strings in messages: `path.shown()` where
/// `path.display()` would print the raw bytes.
pub trait Shown {
    fn shown(&self) -> String;
}

impl<T: AsRef<std::ffi::OsStr> + ?Sized> Shown for T {
    fn shown(&self) -> String {
        shown(self)
    }
}

/// The argv as one line of `sh` input that performs the same launch.
pub fn shell_line(argv: &[OsString]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, arg) in argv.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        let bytes = arg.as_bytes();
        if !bytes.is_empty() && bytes.iter().all(|b| is_plain(*b)) {
            out.extend_from_slice(bytes);
        } else {
            Sh::quote_into_vec(arg.as_os_str(), &mut out);
        }
    }
    out
}

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b)
}
