//! The one error type that carries its fix as data: what went wrong, what to do about it,
//! and the path to look at where there is one. It travels inside `anyhow::Error`; whoever
//! needs the parts (`--check`'s rows, the top-level report) finds it with [`find`], never
//! by parsing the message text.

use std::fmt;
use std::path::{Path, PathBuf};

/// A refusal or failure with its fix. Its one-line text is `"{what}; {fix}"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixable {
    /// What went wrong (already escaped for the terminal).
    pub what: String,
    /// What the user can do about it.
    pub fix: String,
    /// The file or directory to look at, when there is one.
    pub path: Option<PathBuf>,
}

impl Fixable {
    pub fn new(what: impl Into<String>, fix: impl Into<String>) -> Self {
        Fixable {
            what: what.into(),
            fix: fix.into(),
            path: None,
        }
    }

    /// The same, naming the path to look at.
    pub fn at(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().to_path_buf());
        self
    }
}

impl fmt::Display for Fixable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.what, self.fix)
    }
}

impl std::error::Error for Fixable {}

impl From<Fixable> for String {
    fn from(e: Fixable) -> String {
        e.to_string()
    }
}

/// The outermost [`Fixable`] in an error's chain: as a context on it (anyhow looks through
/// its contexts), as the error itself, or as a source further down.
pub fn find(e: &anyhow::Error) -> Option<&Fixable> {
    e.downcast_ref::<Fixable>()
        .or_else(|| e.chain().find_map(|c| c.downcast_ref::<Fixable>()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_what_then_fix_and_parts_survive_a_semicolon_in_a_path() {
        let e =
            Fixable::new("the state directory /tmp/a; b is not writable", "fix it").at("/tmp/a; b");
        assert_eq!(
            e.to_string(),
            "the state directory /tmp/a; b is not writable; fix it"
        );
        let any = anyhow::Error::new(e.clone()).context("outer");
        let found = find(&any).unwrap();
        assert_eq!(found, &e);
        assert_eq!(found.path.as_deref(), Some(Path::new("/tmp/a; b")));
    }

    #[test]
    fn found_when_used_as_context() {
        let inner: anyhow::Result<()> = Err(anyhow::anyhow!("io error"));
        let e = anyhow::Context::context(inner, Fixable::new("cannot create x", "set HOME"))
            .unwrap_err();
        assert_eq!(format!("{e:#}"), "cannot create x; set HOME: io error");
        assert_eq!(find(&e).unwrap().fix, "set HOME");
    }
}
