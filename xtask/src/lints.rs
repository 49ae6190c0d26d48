//! The lints of `cargo xtask test`: clippy over every crate, with warnings
//! denied, at the least build cost.
//!
//! `cargo clippy` type-checks every dependency once more in check mode, a
//! fourth compilation of them beside the release build, the unit tests'
//! dev build and the end-to-end tests' release build (236 s of a 2,365 s
//! CI run on a 2-core machine). So the crates whose unit tests run are
//! linted while those tests are built: clippy-driver compiles the
//! workspace's own crates (cargo's `RUSTC_WORKSPACE_WRAPPER`, as `cargo
//! clippy` sets it; the dependencies are built by rustc as for any test
//! build), and a warning in cargo's messages fails the build as `-D
//! warnings` would. The other crates (the end-to-end tests, whose tests
//! run in the release profile) and the kernel crate, built for BPF, keep a
//! clippy run of their own.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The crates whose unit tests `cargo xtask test` runs.
const UNIT_TESTED: &[&str] = &["profiler-common", "profiler-daemon", "pprof-proto", "xtask"];

/// Clippy over the crates not built by [`unit_test_build`]: every other
/// member of the workspace (today the end-to-end tests), then the kernel
/// crate.
pub fn clippy_others() -> Result<()> {
    let mut clippy = crate::cargo();
    clippy.args(["clippy", "--workspace", "--exclude", "profiler-ebpf"]);
    for package in UNIT_TESTED {
        clippy.args(["--exclude", package]);
    }
    crate::run(clippy.args(["--all-targets", "--", "-D", "warnings"]))?;
    // The kernel crate only builds for the BPF target, with nightly.
    crate::run(
        Command::new("cargo")
            .current_dir(crate::root().join("profiler-ebpf"))
            .args([
                "+nightly",
                "clippy",
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--target-dir",
            ])
            .arg(crate::root().join("target/bpf"))
            .args(["--", "-D", "warnings"]),
    )
}

/// `cargo test` over [`UNIT_TESTED`] with the environment `env`, each
/// crate compiled by clippy-driver when `linted`. Building, then running,
/// use the same environment, so the run rebuilds nothing.
pub fn unit_tests(linted: bool, env: &[(&str, &str)]) -> Result<()> {
    let command = |extra: &[&str]| {
        let mut cmd = crate::cargo();
        cmd.arg("test");
        for package in UNIT_TESTED {
            cmd.args(["--package", package]);
        }
        cmd.args(extra).envs(env.iter().copied());
        if linted {
            cmd.env("RUSTC_WORKSPACE_WRAPPER", clippy_driver());
        }
        cmd
    };
    if linted {
        unit_test_build(command(&[
            "--all-targets",
            "--no-run",
            "--message-format=json",
        ]))?;
    }
    crate::run(&mut command(&[]))
}

/// Runs the build `cmd` (cargo with `--message-format=json`), showing each
/// compiler message as rustc renders it; fails on any warning or error.
fn unit_test_build(mut cmd: Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut warnings = 0usize;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's messages")?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] != "compiler-message" {
            continue;
        }
        let message = &msg["message"];
        if let Some(text) = message["rendered"].as_str() {
            eprint!("{text}");
        }
        // Dependencies are built with their lints capped, so every
        // message here is about the workspace's code.
        if matches!(message["level"].as_str(), Some("warning" | "error")) {
            warnings += 1;
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("building the unit tests failed: {status}");
    }
    if warnings > 0 {
        bail!(
            "{warnings} compiler or clippy warnings in the unit-tested crates (denied, as `cargo clippy -- -D warnings` does)"
        );
    }
    Ok(())
}

/// The clippy-driver of the toolchain that runs this task: beside its
/// cargo, else the one on the PATH.
fn clippy_driver() -> PathBuf {
    std::env::var_os("CARGO")
        .map(PathBuf::from)
        .and_then(|cargo| Some(cargo.parent()?.join("clippy-driver")))
        .filter(|driver| driver.is_file())
        .unwrap_or_else(|| PathBuf::from("clippy-driver"))
}
