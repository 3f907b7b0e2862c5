//! The user's configuration file, `$XDG_CONFIG_HOME/claudebox/config.toml`: where it is,
//! what it may say, and errors that name its path, line and column. This is the only
//! configuration claudebox reads: nothing inside a project is ever read as configuration,
//! so a cloned repository cannot widen its own sandbox.
//!
//! ```toml
//! ro = ["~/.cargo/registry", "~/.rustup"]   # bound read-only at the same path
//! rw = ["~/.cache/sccache"]                 # bound read-write at the same path
//! hide = ["/srv/data/private"]              # an empty directory (or file) over it
//! network = "open"                          # "open" (default), "allowlist" or "none"
//! forward_ports = [5432]                    # host loopback ports, in allowlist/none mode
//! claude_args = ["--model", "opus"]         # before the arguments given to claudebox
//! pass_env = ["GITHUB_TOKEN"]               # the host's value, passed explicitly
//! env = { RUST_BACKTRACE = "1" }            # set inside the sandbox
//! gc_margin = "7d"                          # --gc: how long a missing root is waited for
//! memory = "8G"                             # the sandbox's limits (as --memory, --pids,
//! pids = 4096                               #   --cpu; "max" for none), per project too
//! cpu = 2
//! agent = "claude"                          # or "codex" (as --agent), per project too
//!
//! [[project]]                               # applies only to this project
//! root = "~/src/website"
//! rw = ["~/.npm"]
//! gpu = true                                # as --gpu: the GPUs' device nodes, /sys parts
//! ```

pub mod guard;
pub mod settings;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use toml::Spanned;

use crate::policy::escape::Shown;
use crate::policy::facts::Project;
use crate::policy::network::ModeName;

/// `$XDG_CONFIG_HOME/claudebox/config.toml`; `~/.config` when `XDG_CONFIG_HOME` is unset,
/// empty or relative (the XDG spec says to ignore a relative value).
pub fn location(home: &Path) -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| home.join(".config"));
    base.join("claudebox").join("config.toml")
}

/// One table of settings: the top level of the file, or one `[[project]]` section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section {
    #[serde(default)]
    pub ro: Vec<Spanned<String>>,
    #[serde(default)]
    pub rw: Vec<Spanned<String>>,
    #[serde(default)]
    pub hide: Vec<Spanned<String>>,
    #[serde(default)]
    pub env: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    pub pass_env: Vec<Spanned<String>>,
    pub network: Option<Spanned<ModeName>>,
    /// Hosts reachable in allowlist mode (`*.example.com`, `HOST:PORT`); listing any
    /// without naming a mode means allowlist.
    #[serde(default)]
    pub allow_hosts: Vec<Spanned<String>>,
    /// Host loopback ports brought into an allowlist or none sandbox (as
    /// `--forward-port`): `5432` or `"127.0.0.1:5432"`.
    #[serde(default, deserialize_with = "port_list")]
    pub forward_ports: Vec<Spanned<String>>,
    pub claude_args: Option<Spanned<Vec<String>>>,
    /// Opt-in: forward the host's ssh agent (as `--ssh-agent`).
    pub ssh_agent: Option<Spanned<bool>>,
    /// Opt-out of the project write protection (as `--writable-project-config`).
    pub writable_project_config: Option<Spanned<bool>>,
    /// Opt-out of the read-only Claude Code setup (as `--writable-claude-setup`).
    pub writable_claude_setup: Option<Spanned<bool>>,
    /// The login broker (as `--login-broker`, or `false` as `--no-login-broker`).
    pub login_broker: Option<Spanned<bool>>,
    /// Opt-in: the GPUs' device nodes and the /sys parts drivers read (as `--gpu`).
    pub gpu: Option<Spanned<bool>>,
    /// The sandbox's limits (as `--memory`, `--pids`, `--cpu`): `"8G"`, `4096`, `1.5`,
    /// or `"max"` for none; checked by `policy::limits::parse`.
    #[serde(default, deserialize_with = "scalar")]
    pub memory: Option<Spanned<String>>,
    #[serde(default, deserialize_with = "scalar")]
    pub pids: Option<Spanned<String>>,
    #[serde(default, deserialize_with = "scalar")]
    pub cpu: Option<Spanned<String>>,
    /// Which agent runs inside (as `--agent`): `"claude"` or `"codex"`.
    pub agent: Option<Spanned<String>>,
    /// Only at the top level: how long `--gc` waits before removing the state of a
    /// project whose root is missing (`"7d"`, `"12h"`, `"0"`).
    pub gc_margin: Option<Spanned<String>>,
    /// Only in a `[[project]]` section: the project it applies to.
    pub root: Option<Spanned<String>>,
    /// Only at the top level: the per-project sections, in file order.
    #[serde(default)]
    pub project: Vec<Spanned<Section>>,
}

/// A configuration file that was read and parsed.
#[derive(Debug)]
pub struct File {
    pub path: PathBuf,
    text: String,
    pub global: Section,
}

impl File {
    /// `PATH:LINE:COL` of a byte span, for messages.
    pub fn at(&self, span: &Range<usize>) -> String {
        let (line, col) = line_col(&self.text, span.start);
        format!("{}:{line}:{col}", self.path.shown())
    }

    /// The 1-based line of a byte span.
    pub fn line(&self, span: &Range<usize>) -> usize {
        line_col(&self.text, span.start).0
    }

    /// An error at a span: `PATH:LINE:COL: message`.
    pub fn error(&self, span: &Range<usize>, msg: impl fmt::Display) -> anyhow::Error {
        anyhow!("{}: {msg}", self.at(span))
    }
}

/// Reads and parses the file at `path`; `Ok(None)` when there is none.
pub fn load(path: &Path) -> Result<Option<File>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(anyhow!("cannot read the config file {}: {e}", path.shown())),
    };
    let text = String::from_utf8(bytes).map_err(|e| {
        let (line, col) = line_col(
            &String::from_utf8_lossy(e.as_bytes()),
            e.utf8_error().valid_up_to(),
        );
        anyhow!("{}:{line}:{col}: not valid UTF-8", path.shown())
    })?;
    parse(path, text).map(Some)
}

/// Parses `text` as the file at `path` and checks the placement of `root` and `project`.
pub fn parse(path: &Path, text: String) -> Result<File> {
    let parsed: Result<Section, toml::de::Error> = toml::from_str(&text);
    let file = File {
        path: path.to_path_buf(),
        text,
        global: Section::default(),
    };
    let global = match parsed {
        Ok(s) => s,
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            let msg = one_line(e.message());
            return Err(file.error(&span, msg));
        }
    };
    if let Some(root) = &global.root {
        return Err(file.error(&root.span(), "`root` belongs in a [[project]] section"));
    }
    for p in &global.project {
        if p.get_ref().root.is_none() {
            return Err(file.error(
                &p.span(),
                "this [[project]] section has no `root` (the project it applies to)",
            ));
        }
        if let Some(m) = &p.get_ref().gc_margin {
            return Err(file.error(&m.span(), "`gc_margin` belongs at the top level"));
        }
        if let Some(inner) = p.get_ref().project.first() {
            return Err(file.error(&inner.span(), "[[project]] sections do not nest"));
        }
    }
    Ok(File { global, ..file })
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

impl<'de> Deserialize<'de> for ModeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ModeName, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ModeName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""open", "allowlist" or "none""#)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ModeName, E> {
                match s {
                    "open" => Ok(ModeName::Open),
                    "allowlist" => Ok(ModeName::Allowlist),
                    "none" => Ok(ModeName::None),
                    _ => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `forward_ports`: each a port number or a `"HOST:PORT"` string, kept as written.
fn port_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Spanned<String>>, D::Error> {
    struct PortSpec(String);
    impl<'de> Deserialize<'de> for PortSpec {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PortSpec, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = PortSpec;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str(r#"a port (5432) or "HOST:PORT" ("127.0.0.1:5432")"#)
                }
                fn visit_i64<E: de::Error>(self, n: i64) -> Result<PortSpec, E> {
                    Ok(PortSpec(n.to_string()))
                }
                fn visit_u64<E: de::Error>(self, n: u64) -> Result<PortSpec, E> {
                    Ok(PortSpec(n.to_string()))
                }
                fn visit_str<E: de::Error>(self, s: &str) -> Result<PortSpec, E> {
                    Ok(PortSpec(s.to_string()))
                }
            }
            d.deserialize_any(V)
        }
    }
    let v: Vec<Spanned<PortSpec>> = Deserialize::deserialize(d)?;
    Ok(v.into_iter()
        .map(|p| {
            let span = p.span();
            Spanned::new(span, p.into_inner().0)
        })
        .collect())
}

/// A number or a string, kept as written (the limits' values).
fn scalar<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Spanned<String>>, D::Error> {
    struct Scalar(String);
    impl<'de> Deserialize<'de> for Scalar {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Scalar;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str(r#"a number (4096, 1.5) or a string ("8G", "max")"#)
                }
                fn visit_i64<E: de::Error>(self, n: i64) -> Result<Scalar, E> {
                    Ok(Scalar(n.to_string()))
                }
                fn visit_u64<E: de::Error>(self, n: u64) -> Result<Scalar, E> {
                    Ok(Scalar(n.to_string()))
                }
                fn visit_f64<E: de::Error>(self, n: f64) -> Result<Scalar, E> {
                    Ok(Scalar(n.to_string()))
                }
                fn visit_str<E: de::Error>(self, s: &str) -> Result<Scalar, E> {
                    Ok(Scalar(s.to_string()))
                }
            }
            d.deserialize_any(V)
        }
    }
    let v: Spanned<Scalar> = Deserialize::deserialize(d)?;
    let span = v.span();
    Ok(Some(Spanned::new(span, v.into_inner().0)))
}

/// Facts about the launch that resolving needs.
pub struct Context<'a> {
    pub home: &'a Path,
    pub cwd: &'a Path,
    pub project: &'a Project,
    pub state_dir: &'a Path,
    pub conversations: &'a Path,
    pub config_file: &'a Path,
    /// `--yes`: allows a config file inside the (home-sized) project.
    pub yes: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(Path::new("/c/config.toml"), text.to_string())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("é = 1\nx", 3), (1, 3));
    }

    #[test]
    fn errors_name_file_line_and_column() {
        assert_eq!(
            err("ro = []\nrox = 1\n"),
            "/c/config.toml:2:1: unknown field `rox`, expected one of `ro`, `rw`, `hide`, \
             `env`, `pass_env`, `network`, `allow_hosts`, `forward_ports`, `claude_args`, `ssh_agent`, `writable_project_config`, `writable_claude_setup`, `login_broker`, `gpu`, `memory`, `pids`, `cpu`, `agent`, `gc_margin`, `root`, `project`"
        );
        assert_eq!(
            err("ro = 5\n"),
            "/c/config.toml:1:6: invalid type: integer `5`, expected a sequence"
        );
        assert_eq!(
            err("\n\nnetwork = true\n"),
            r#"/c/config.toml:3:11: invalid type: boolean `true`, expected "open", "allowlist" or "none""#
        );
        assert_eq!(
            err("network = \"off\"\n"),
            r#"/c/config.toml:1:11: invalid value: string "off", expected "open", "allowlist" or "none""#
        );
        assert_eq!(
            err("ro = [\n"),
            "/c/config.toml:1:7: unclosed array, expected `]`"
        );
        assert_eq!(
            err("\nro = [\"a\"]\nro = [\"b\"]\n"),
            "/c/config.toml:3:1: duplicate key"
        );
    }

    #[test]
    fn root_only_in_project_sections() {
        assert_eq!(
            err("root = \"/x\"\n"),
            "/c/config.toml:1:8: `root` belongs in a [[project]] section"
        );
        assert_eq!(
            err("ro = []\n[[project]]\nrw = []\n"),
            "/c/config.toml:2:1: this [[project]] section has no `root` (the project it applies to)"
        );
        let f = parse(
            Path::new("/c"),
            "[[project]]\nroot = \"~/a\"\nro = [\"~/b\"]\n".into(),
        )
        .unwrap();
        assert_eq!(f.global.project.len(), 1);
        assert_eq!(f.global.project[0].get_ref().ro[0].get_ref(), "~/b");
    }
}
