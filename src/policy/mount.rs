//! A plan mount and its kinds: the shared type of the plan (`plan`) and the tables that
//! add mounts to it (`gpu`), at the bottom of `policy` so that both can name it.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::policy::origin::Origin;

/// How a path appears inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountKind {
    /// Read-only bind of a host path.
    Ro,
    /// Read-only bind of a host path that is skipped when the source is missing.
    RoTry,
    /// Read-write bind of a host directory.
    Rw,
    /// Read-write bind of a single host file.
    File,
    /// An empty in-memory file system.
    Tmpfs,
    /// A symlink pointing at `source`.
    Symlink,
    /// A minimal `/dev`.
    Dev,
    /// A new `/proc` for the new pid namespace.
    Proc,
    /// An empty read-only directory (a tmpfs remounted read-only).
    EmptyRo,
    /// A host device node (or a directory of them) with device access, skipped when
    /// missing: `--gpu` only (see `gpu`), named, since bwrap has no `--dev-bind-fd`.
    DevBind,
    /// A directory of the sandbox's own around the project (its parents), made read-only
    /// once every mount beneath it is in place: a write there (`git worktree add ../x`)
    /// would be lost at exit, so it fails at once. `/` is bwrap's own root (no tmpfs made);
    /// any other target is a tmpfs (see `scratch_parents`).
    ScratchRo,
}

impl MountKind {
    /// Every kind, in the order `--dry-run`'s legend explains them.
    pub const ALL: &'static [MountKind] = &[
        MountKind::Ro,
        MountKind::RoTry,
        MountKind::Rw,
        MountKind::File,
        MountKind::Tmpfs,
        MountKind::EmptyRo,
        MountKind::ScratchRo,
        MountKind::Symlink,
        MountKind::Dev,
        MountKind::Proc,
        MountKind::DevBind,
    ];

    /// What the kind means, for `--dry-run`'s legend.
    pub fn meaning(&self) -> &'static str {
        match self {
            MountKind::Ro => "the host's path, read-only",
            MountKind::RoTry => "the host's path, read-only; skipped when the host has none",
            MountKind::Rw => "the host's directory, read-write: writes reach the host",
            MountKind::File => "the host's file, read-write: writes reach the host",
            MountKind::Tmpfs => "an empty writable directory in memory, gone at exit",
            MountKind::EmptyRo => "an empty read-only directory: what is there is hidden",
            MountKind::ScratchRo => {
                "the sandbox's own directories around the project, read-only once the mounts \
                 beneath are made: a write there would be lost at exit, so it fails at once"
            }
            MountKind::Symlink => "a symlink made inside, pointing at the source",
            MountKind::Dev => "a minimal /dev (null, zero, random, tty, ...)",
            MountKind::Proc => "a /proc of the sandbox's own processes",
            MountKind::DevBind => {
                "the host's device node, usable (--gpu); skipped when the host has none"
            }
        }
    }
}

impl fmt::Display for MountKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MountKind::Ro => "ro",
            MountKind::RoTry => "ro?",
            MountKind::Rw => "rw",
            MountKind::File => "file",
            MountKind::Tmpfs => "tmpfs",
            MountKind::Symlink => "symlink",
            MountKind::Dev => "dev",
            MountKind::Proc => "proc",
            MountKind::EmptyRo => "empty-ro",
            MountKind::ScratchRo => "scratch-ro",
            MountKind::DevBind => "dev-bind?",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub kind: MountKind,
    /// Host path (or symlink target); `None` for tmpfs, dev and proc.
    pub source: Option<PathBuf>,
    pub target: PathBuf,
    pub why: String,
    /// Who asked for it: claudebox's default, the config file or the command line.
    pub origin: Origin,
}

impl Mount {
    pub fn new(kind: MountKind, source: Option<&Path>, target: &Path, why: &str) -> Mount {
        Mount {
            kind,
            source: source.map(Path::to_path_buf),
            target: target.to_path_buf(),
            why: why.to_string(),
            origin: Origin::Default,
        }
    }
    pub fn same(kind: MountKind, path: &Path, why: &str) -> Mount {
        Mount::new(kind, Some(path), path, why)
    }
}
