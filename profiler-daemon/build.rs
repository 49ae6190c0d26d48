//! Builds the eBPF object once and hands it to the daemon, which embeds it.
//!
//! The object is built with the nightly toolchain into a fixed target
//! directory (`target/bpf`), so check, build, test and clippy share one
//! build instead of rebuilding `core` per build-script output directory.
//! `PROFILERD_BPF_OBJECT=path` embeds a prebuilt object instead.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dest = out_dir.join("profiler-ebpf.o");
    println!("cargo:rerun-if-env-changed=PROFILERD_BPF_OBJECT");
    if let Some(obj) = env::var_os("PROFILERD_BPF_OBJECT") {
        std::fs::copy(&obj, &dest).expect("copy PROFILERD_BPF_OBJECT");
        return;
    }
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let root = manifest.parent().expect("workspace root").to_path_buf();
    for dir in [
        "profiler-ebpf/src",
        "profiler-common/src",
        "profiler-ebpf/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let target_dir = root.join("target").join("bpf");
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root.join("profiler-ebpf"))
        .args([
            "+nightly",
            "build",
            "--release",
            "--package",
            "profiler-ebpf",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    // Start from a clean slate: the outer cargo's settings are for the host.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key == "RUSTFLAGS"
            || key == "RUSTDOCFLAGS"
            || key == "RUSTUP_TOOLCHAIN"
        {
            cmd.env_remove(&key);
        }
    }
    cmd.env(
        "CARGO_ENCODED_RUSTFLAGS",
        "-Cdebuginfo=2\x1f-Clink-arg=--btf",
    );
    let status = cmd.status().expect("run cargo +nightly for the eBPF crate");
    assert!(status.success(), "building the eBPF crate failed");
    let built = target_dir
        .join("bpfel-unknown-none")
        .join("release")
        .join("profiler-ebpf");
    std::fs::copy(&built, &dest).expect("copy the eBPF object");
}
