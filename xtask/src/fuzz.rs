//! `cargo xtask fuzz`: runs each cargo-fuzz target of `fuzz/` for a fixed
//! time on its committed seed corpus, installing cargo-fuzz if it is
//! missing, and prints each target's runs, exec/s and corpus size.

use std::path::Path;
use std::process::{Command, Stdio};

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
}

/// One target's run, from libFuzzer's closing lines.
struct Outcome {
    target: String,
    runs: u64,
    seconds: u64,
    corpus: usize,
}

pub fn run(root: &Path, args: FuzzArgs) -> Result<()> {
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

    #[test]
    fn reads_libfuzzer_closing_line() {
        let log = "#1024\tpulse  cov: 10\nDone 123456 runs in 121 second(s)\n";
        let o = outcome("report", log, Path::new("/nonexistent")).unwrap();
        assert_eq!((o.runs, o.seconds, o.corpus), (123456, 121, 0));
        assert!(outcome("report", "crashed\n", Path::new("/nonexistent")).is_err());
    }
}
