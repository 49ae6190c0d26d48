//! `cargo xtask fuzz`: runs each cargo-fuzz target of `fuzz/` for a fixed
//! time on its committed seed corpus, installing cargo-fuzz if it is
//! missing, and prints each target's runs, exec/s and corpus size.
//!
//! [`replay`], part of `cargo xtask test`, only builds the targets on the
//! stable toolchain and runs each once on every file of its corpus, so
//! that a change to the daemon's API or a regression on a seed fails CI.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;

/// The targets of fuzz/Cargo.toml, each with a seed corpus in
/// fuzz/corpus/NAME.
pub const TARGETS: [&str; 6] = [
    "pprof_decode",
    "report",
    "config_toml",
    "allocator_elf",
    "probe_placement",
    "cgroup_path",
];

#[derive(Args)]
pub struct FuzzArgs {
    /// How long to run each target, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Targets to run [default: all].
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    targets: Vec<String>,
    /// Do not fuzz: build the targets on the stable toolchain, without
    /// sanitizers, and run each once on every file of its corpus, as
    /// `cargo xtask test` does.
    #[arg(long, conflicts_with = "seconds")]
    replay: bool,
}

/// One target's run, from libFuzzer's closing lines.
struct Outcome {
    target: String,
    runs: u64,
    seconds: u64,
    corpus: usize,
}

pub fn run(root: &Path, args: FuzzArgs) -> Result<()> {
    if args.replay {
        let targets: Vec<&str> = if args.targets.is_empty() {
            TARGETS.to_vec()
        } else {
            args.targets.iter().map(String::as_str).collect()
        };
        return replay(root, &targets);
    }
    install_cxx()?;
    install_cargo_fuzz()?;
    let fuzz_dir = root.join("fuzz");
    let logs = root.join("target").join("fuzz-logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let targets: Vec<String> = if args.targets.is_empty() {
        TARGETS.iter().map(|t| (*t).to_owned()).collect()
    } else {
        args.targets
    };
    let mut outcomes = Vec::new();
    for target in &targets {
        let log_path = logs.join(format!("{target}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        eprintln!(
            "+ fuzzing {target} for {}s (log: {})",
            args.seconds,
            log_path.display()
        );
        // -O: release with debug assertions, so overflow still panics.
        let status = Command::new("cargo")
            .current_dir(&fuzz_dir)
            .args(["+nightly", "fuzz", "run", "-O", target, "--"])
            .arg(format!("-max_total_time={}", args.seconds))
            // Inputs larger than a real profile or config add little.
            .arg("-max_len=65536")
            .stdout(Stdio::null())
            .stderr(log)
            .status()
            .with_context(|| format!("running cargo fuzz on {target}"))?;
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if !status.success() {
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "fuzz target {target} failed ({status}); inputs under fuzz/artifacts/{target}:\n{}",
                tail.join("\n")
            );
        }
        outcomes.push(outcome(
            target,
            &text,
            &fuzz_dir.join("corpus").join(target),
        )?);
    }
    println!(
        "{:<16} {:>12} {:>8} {:>10} {:>8}",
        "target", "runs", "seconds", "exec/s", "corpus"
    );
    for o in &outcomes {
        println!(
            "{:<16} {:>12} {:>8} {:>10} {:>8}",
            o.target,
            o.runs,
            o.seconds,
            o.runs / o.seconds.max(1),
            o.corpus
        );
    }
    Ok(())
}

/// Reads "Done N runs in S second(s)" from libFuzzer's output.
fn outcome(target: &str, log: &str, corpus: &Path) -> Result<Outcome> {
    let done = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Done "))
        .with_context(|| format!("no closing line from libFuzzer for {target}"))?;
    let words: Vec<&str> = done.split_whitespace().collect();
    let (runs, seconds) = match words.as_slice() {
        [runs, "runs", "in", seconds, ..] => (runs.parse()?, seconds.parse()?),
        _ => bail!("unexpected libFuzzer line for {target}: Done {done}"),
    };
    let corpus = std::fs::read_dir(corpus).map(|d| d.count()).unwrap_or(0);
    Ok(Outcome {
        target: target.to_owned(),
        runs,
        seconds,
        corpus,
    })
}

/// [`replay`]'s profile: dev, with the dependencies without debug info as
/// the workspace's dev profile has them, built in the workspace's target
/// directory, so that the dependencies the unit tests built are reused.
/// After them, on a clean clone, the targets cost the libFuzzer runtime
/// (C++), the daemon's library without mimalloc and the few crates whose
/// features differ. The dev profile's debug assertions make an overflow
/// panic.
const REPLAY_PROFILE: [&str; 2] = ["--config", "profile.dev.package.\"*\".debug=false"];

/// At most this many inputs on one command line.
const REPLAY_BATCH: usize = 1000;

/// Builds each of `targets` (names in [`TARGETS`]) with the current
/// (stable) toolchain, without sanitizers or coverage instrumentation, and
/// runs each once on every file in fuzz/corpus/TARGET; fails with a line
/// naming the target and the input that crashed.
///
/// libFuzzer given files, rather than directories, runs each of them once
/// whole and stops ("Running: FILE" before each). Given a corpus directory
/// and `-runs=0` it would run an empty input besides, cut files at 1 MiB
/// (its `-max_len` without one given) and write a crashing input to the
/// working directory, without naming the file it came from.
pub fn replay(root: &Path, targets: &[&str]) -> Result<()> {
    install_cxx()?;
    let started = Instant::now();
    let target_dir = root.join("target");
    let mut build = crate::cargo();
    build
        .args(["build", "--manifest-path", "fuzz/Cargo.toml"])
        .args(REPLAY_PROFILE)
        .arg("--target-dir")
        .arg(&target_dir);
    for target in targets {
        build.args(["--bin", target]);
    }
    eprintln!("+ {build:?}");
    let status = build
        .status()
        .context("starting cargo build for the fuzz targets")?;
    if !status.success() {
        bail!("the fuzz targets of fuzz/ failed to build ({status}); cargo's errors are above");
    }
    eprintln!(
        "fuzz targets built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    for target in targets {
        let inputs = corpus_files(root, target)?;
        let binary = target_dir.join("debug").join(target);
        let ran = Instant::now();
        for batch in inputs.chunks(REPLAY_BATCH) {
            replay_batch(root, target, &binary, batch)?;
        }
        eprintln!(
            "fuzz target {target}: {} corpus inputs passed in {:.1} s",
            inputs.len(),
            ran.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Every file in fuzz/corpus/TARGET, by name; an error if there is none.
fn corpus_files(root: &Path, target: &str) -> Result<Vec<PathBuf>> {
    let dir = root.join("fuzz/corpus").join(target);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| {
        format!(
            "fuzz target {target} has no corpus: reading {}",
            dir.display()
        )
    })? {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        if entry.file_type()?.is_file() {
            files.push(entry.path());
        }
    }
    if files.is_empty() {
        bail!(
            "fuzz target {target} has no corpus: {} holds no file",
            dir.display()
        );
    }
    files.sort();
    Ok(files)
}

/// Runs `binary` once on each of `inputs`; on a failure shows libFuzzer's
/// output and fails naming the input it was running.
fn replay_batch(root: &Path, target: &str, binary: &Path, inputs: &[PathBuf]) -> Result<()> {
    let out = Command::new(binary)
        // A hang fails too, rather than running into CI's time limit.
        .arg("-timeout=60")
        .args(inputs)
        .current_dir(root)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = text.lines().rev().take(40).collect();
    if !out.stdout.is_empty() {
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    }
    eprintln!("{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    let input = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Running: "))
        .map_or_else(
            || "before its first input".to_owned(),
            |p| {
                let p = Path::new(p);
                format!("on {}", p.strip_prefix(root).unwrap_or(p).display())
            },
        );
    bail!(
        "fuzz target {target} failed {input} ({}); its output is above",
        out.status
    )
}

/// libfuzzer-sys's build script compiles libFuzzer, which is C++, with
/// `c++` (g++ on Debian).
fn install_cxx() -> Result<()> {
    if crate::have("c++") {
        return Ok(());
    }
    crate::apt_install(&["g++"])
}

fn install_cargo_fuzz() -> Result<()> {
    let installed = Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        crate::run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `name`s of the `[[bin]]` tables of a Cargo.toml.
    fn manifest_bins(manifest: &str) -> Vec<String> {
        let mut bins = Vec::new();
        let mut in_bin = false;
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                in_bin = line == "[[bin]]";
            } else if in_bin && let Some(value) = line.strip_prefix("name") {
                let value = value.trim_start().trim_start_matches('=').trim();
                bins.push(value.trim_matches('"').to_owned());
            }
        }
        bins
    }

    /// The names of the entries of `dir`, `suffix` removed, sorted.
    fn names(dir: &Path, suffix: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|n| n.strip_suffix(suffix).map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    /// TARGETS, fuzz/Cargo.toml's [[bin]]s, fuzz/fuzz_targets/*.rs and
    /// fuzz/corpus/* name the same targets: `cargo xtask fuzz` and `test`
    /// run only TARGETS, and cargo builds only the [[bin]]s.
    #[test]
    fn targets_are_the_fuzz_crates() {
        let fuzz = crate::root().join("fuzz");
        let mut targets: Vec<String> = TARGETS.iter().map(|t| (*t).to_owned()).collect();
        targets.sort();
        let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
        let mut bins = manifest_bins(&manifest);
        bins.sort();
        assert_eq!(bins, targets, "fuzz/Cargo.toml's [[bin]]s against TARGETS");
        assert_eq!(
            names(&fuzz.join("fuzz_targets"), ".rs"),
            targets,
            "fuzz/fuzz_targets"
        );
        assert_eq!(names(&fuzz.join("corpus"), ""), targets, "fuzz/corpus");
    }

    #[test]
    fn reads_bin_names() {
        let manifest = "[package]\nname = \"p\"\n\n[[bin]]\nname = \"a\"\npath = \"a.rs\"\n\n[[bin]]\npath = \"b.rs\"\nname=\"b\"\n[dependencies]\nname = \"x\"\n";
        assert_eq!(manifest_bins(manifest), ["a", "b"]);
    }

    #[test]
    fn reads_libfuzzer_closing_line() {
        let log = "#1024\tpulse  cov: 10\nDone 123456 runs in 121 second(s)\n";
        let o = outcome("report", log, Path::new("/nonexistent")).unwrap();
        assert_eq!((o.runs, o.seconds, o.corpus), (123456, 121, 0));
        assert!(outcome("report", "crashed\n", Path::new("/nonexistent")).is_err());
    }
}
