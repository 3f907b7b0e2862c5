use super::*;
use std::os::unix::fs::symlink;

fn setup() -> (tempfile::TempDir, Dir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let inner = t.path().join("state");
    std::fs::create_dir(&inner).unwrap();
    let outside = t.path().join("outside");
    std::fs::write(&outside, b"host\n").unwrap();
    let d = Dir::open(&inner).unwrap();
    (t, d, outside)
}

#[test]
fn nothing_follows_a_symlink_or_leaves_the_directory() {
    let (t, d, outside) = setup();
    let inner = t.path().join("state");
    symlink(&outside, inner.join("link")).unwrap();
    std::fs::create_dir(inner.join("sub")).unwrap();
    symlink(t.path(), inner.join("up")).unwrap();
    let p = Path::new;
    assert!(d.read(p("link")).is_err());
    assert!(d.open_write(p("link")).is_err());
    assert!(d.open_append(p("link"), 0o600).is_err());
    assert!(d.create_new(p("link"), 0o600).is_err());
    assert!(d.read(p("up/outside")).is_err());
    assert!(d.sub(p("up")).is_err());
    assert!(d.read(p("../outside")).is_err());
    assert!(d.read(Path::new("/etc/hostname")).is_err());
    assert!(d.chmod(p("link"), 0o777).is_err());
    d.rewrite_in_place(p("link"), b"agent\n").unwrap();
    // The symlink was replaced by a file; the outside file is as it was.
    assert_eq!(std::fs::read(&outside).unwrap(), b"host\n");
    assert_eq!(d.read(p("link")).unwrap(), b"agent\n");
    d.write_atomic(p("sub/x"), b"1", 0o600, true).unwrap();
    assert_eq!(d.read(p("sub/x")).unwrap(), b"1");
    // A hard link to a file outside: never written in place.
    std::fs::hard_link(&outside, inner.join("hard")).unwrap();
    assert!(d.open_write(p("hard")).is_err());
    d.rewrite_in_place(p("hard"), b"agent\n").unwrap();
    assert_eq!(std::fs::read(&outside).unwrap(), b"host\n");
    // A FIFO: neither read nor written, never blocks.
    nix::unistd::mkfifo(
        &inner.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    assert!(d.read(p("fifo")).is_err());
    assert!(d.open_write(p("fifo")).is_err());
    // remove_all removes a symlink, never what it points at.
    std::fs::create_dir(inner.join("tree")).unwrap();
    symlink(t.path(), inner.join("tree/escape")).unwrap();
    std::fs::create_dir(inner.join("tree/locked")).unwrap();
    std::fs::write(inner.join("tree/locked/f"), b"").unwrap();
    std::fs::set_permissions(
        inner.join("tree/locked"),
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    d.remove_all(p("tree")).unwrap();
    assert!(!inner.join("tree").exists());
    assert!(outside.exists());
}

#[test]
fn the_walk_without_openat2_refuses_the_same() {
    let (t, d, outside) = setup();
    let inner = t.path().join("state");
    symlink(&outside, inner.join("link")).unwrap();
    std::fs::create_dir(inner.join("sub")).unwrap();
    std::fs::write(inner.join("sub/f"), b"ok").unwrap();
    symlink(t.path(), inner.join("sub/up")).unwrap();
    let r = |rel: &str| {
        walk(
            d.fd(),
            Path::new(rel),
            OFlags::RDONLY | OFlags::NONBLOCK,
            Mode::empty(),
        )
    };
    assert!(r("sub/f").is_ok());
    assert!(r("link").is_err());
    assert!(r("sub/up/outside").is_err());
    assert!(r("../outside").is_err());
}

#[test]
fn planted_locks_are_cleared_and_a_live_one_is_not() {
    let (t, d, _) = setup();
    let inner = t.path().join("state");
    let p = Path::new;
    let set = |path: &Path, when: SystemTime| {
        let f = std::fs::File::open(path).unwrap();
        f.set_modified(when).unwrap();
    };
    std::fs::create_dir(inner.join("live.lock")).unwrap();
    assert!(!clear_planted_lock(&d, p("live.lock")));
    std::fs::create_dir(inner.join("future.lock")).unwrap();
    set(
        &inner.join("future.lock"),
        SystemTime::now() + Duration::from_secs(3600),
    );
    assert!(clear_planted_lock(&d, p("future.lock")));
    std::fs::create_dir(inner.join("old.lock")).unwrap();
    set(
        &inner.join("old.lock"),
        SystemTime::now() - Duration::from_secs(60),
    );
    assert!(clear_planted_lock(&d, p("old.lock")));
    std::fs::create_dir_all(inner.join("full.lock/x")).unwrap();
    assert!(clear_planted_lock(&d, p("full.lock")));
    std::fs::write(inner.join("file.lock"), b"").unwrap();
    assert!(clear_planted_lock(&d, p("file.lock")));
    assert!(!clear_planted_lock(&d, p("none.lock")));
    assert!(lock_is_stale(
        SystemTime::now() + Duration::from_secs(5),
        SystemTime::now()
    ));
    assert!(!lock_is_stale(SystemTime::now(), SystemTime::now()));
}

#[test]
fn paths_with_parents_and_chmod_work() {
    let (t, d, _) = setup();
    let inner = t.path().join("state");
    std::fs::create_dir(inner.join("sessions")).unwrap();
    std::fs::write(inner.join("sessions/.a.tmp.1.0"), b"").unwrap();
    let p = Path::new;
    assert!(mtime(&d, p("sessions/.a.tmp.1.0")).is_ok());
    assert!(mtime(&d, p("./sessions")).is_ok());
    d.chmod(p("sessions/.a.tmp.1.0"), 0o400).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::metadata(inner.join("sessions/.a.tmp.1.0")).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o400);
    d.remove_file(p("sessions/.a.tmp.1.0")).unwrap();
    assert!(d.entries(p("sessions")).unwrap().is_empty());
}

/// A chain of 30,000 directories (an agent's, in its conversations), a file at every
/// level: removed whole (the recursive walk overflowed the stack and aborted `--gc`; one
/// descriptor per level fails with EMFILE past the open-files limit, 20,000 for root
/// here and 1,024 for an ordinary user).
#[test]
fn a_chain_deeper_than_the_open_files_limit_is_removed() {
    let (t, d, outside) = setup();
    let inner = t.path().join("state");
    std::fs::create_dir(inner.join("deep")).unwrap();
    let mut fd = rustix::fs::open(
        inner.join("deep"),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    for _ in 0..30_000 {
        rustix::fs::mkdirat(&fd, "d", Mode::from_raw_mode(0o700)).unwrap();
        drop(
            rustix::fs::openat(
                &fd,
                "f",
                OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .unwrap(),
        );
        fd = rustix::fs::openat(
            &fd,
            "d",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
    }
    drop(fd);
    d.remove_all(Path::new("deep")).unwrap();
    assert!(!inner.join("deep").exists());
    assert!(outside.exists());
}
