//! Lays out the functions a launch runs next to each other in the binary.
//!
//! A launch touches code from all over claudebox's 2 MB of text, and the kernel maps it
//! 64 KB at a time on first touch: about 30 page faults, a few microseconds each, on every
//! start (and claudebox starts twice per launch). `launch.order` lists the functions a
//! launch runs (`scripts/launch-order` regenerates it with valgrind); lld's
//! `--symbol-ordering-file` puts them first, so they share a few windows. Only the layout
//! changes. A name the build no longer has is skipped, so a stale list only makes the
//! layout looser. The option is passed only when a test link shows the linker takes it
//! (lld, rustc's default linker on x86_64 Linux since 1.90; GNU ld does not).

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=launch.order");
    let Some(dir) = env::var_os("CARGO_MANIFEST_DIR") else {
        return;
    };
    let order = PathBuf::from(dir).join("launch.order");
    if !order.is_file() {
        return;
    }
    // Cargo's directives are lines of text: a path that is not UTF-8 or holds a newline
    // goes without. `-Xlinker` rather than `-Wl,`, which would split the path at commas.
    let Some(order) = order.to_str().filter(|p| !p.contains('\n')) else {
        return;
    };
    let args = [
        "-Xlinker".to_string(),
        format!("--symbol-ordering-file={order}"),
        "-Xlinker".to_string(),
        "--no-warn-symbol-ordering".to_string(),
    ];
    if !linker_takes(&args) {
        return;
    }
    for a in &args {
        println!("cargo:rustc-link-arg-bins={a}");
    }
}

/// Links an empty program for the same target with the same flags and `args`.
fn linker_takes(args: &[String]) -> bool {
    let (Some(out), Ok(target)) = (env::var_os("OUT_DIR"), env::var("TARGET")) else {
        return false;
    };
    let out = Path::new(&out);
    let src = out.join("link_probe.rs");
    if fs::write(&src, "fn main() {}\n").is_err() {
        return false;
    }
    let mut cmd = Command::new(env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()));
    cmd.args([
        "--crate-name",
        "link_probe",
        "--crate-type",
        "bin",
        "--target",
        &target,
    ])
    .arg("-o")
    .arg(out.join("link_probe"))
    .arg(&src);
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        cmd.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    }
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        let mut a = OsString::from("-Clinker=");
        a.push(linker);
        cmd.arg(a);
    }
    for a in args {
        cmd.arg(format!("-Clink-arg={a}"));
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
