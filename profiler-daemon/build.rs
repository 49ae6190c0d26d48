//! Builds the eBPF object once and hands it to the daemon, which embeds it.
//!
//! The object is built with the nightly toolchain into a fixed target
//! directory (`target/bpf`), so check, build, test and clippy share one
//! build instead of rebuilding `core` per build-script output directory.
//! `PROFILERD_BPF_OBJECT=path` embeds a prebuilt object instead.
//!
//! Either way the object's DWARF sections are dropped before it is
//! embedded: the loader parses every section of the object and its
//! relocations at each start (the DWARF is 80% of the object's 3.3 MB),
//! and nothing reads it; the BTF and its line records (`.BTF`, `.BTF.ext`)
//! stay, and are what the kernel is given.

use std::env;
use std::path::PathBuf;
use std::process::Command;

use object::build::elf::SectionData;

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dest = out_dir.join("profiler-ebpf.o");
    println!("cargo:rerun-if-env-changed=PROFILERD_BPF_OBJECT");
    if let Some(obj) = env::var_os("PROFILERD_BPF_OBJECT") {
        embed(&PathBuf::from(obj), &dest);
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
    embed(&built, &dest);
}

/// Writes object `built` to `dest` without its DWARF sections (`.debug_*`
/// and their relocations).
fn embed(built: &PathBuf, dest: &PathBuf) {
    let data = std::fs::read(built).expect("read the eBPF object");
    let mut builder = object::build::elf::Builder::read(&*data).expect("parse the eBPF object");
    for section in builder.sections.iter_mut() {
        let name = section.name.as_slice();
        if name.starts_with(b".debug") || name.starts_with(b".rel.debug") {
            section.delete = true;
        }
    }
    // bpf-linker names sections from the symbols' string table; the
    // writer wants a section-name table of its own.
    if !builder
        .sections
        .iter()
        .any(|section| matches!(section.data, SectionData::SectionString))
    {
        let names = builder.sections.add();
        names.name = b".shstrtab".to_vec().into();
        names.sh_type = object::elf::SHT_STRTAB;
        names.data = SectionData::SectionString;
    }
    let mut out = Vec::new();
    builder.write(&mut out).expect("write the eBPF object");
    std::fs::write(dest, out).expect("write the embedded eBPF object");
}
