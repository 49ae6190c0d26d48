//! `cargo xtask bench --runtimes`: what a CPU sample costs in a process of
//! each kind of runtime, side by side in one run. The same 3:1 workload
//! (`cpu_ratio`) in C, in CPython without any flag (its Python frames
//! read by `py_sample`) on pyenv's 3.10 (frame objects), Debian's 3.11
//! and pyenv's 3.12, in CPython 3.12
//! with `-X perf` (a perf map besides), and in Node with
//! `--perf-basic-prof`, each profiled alone under `--pid` at 499 Hz, in
//! alternated rounds.
//!
//! Reported per workload (medians, and each round's value in order): the
//! daemon's CPU per sample from READY to the workload's end (its
//! schedstat time; the first window's symbolization included), and the
//! BPF time per run of `cpu_sample` (the kernel's run-time statistics, as
//! the daemon logs them at exit), which includes the programs it
//! tail-calls (`py_sample`): the kernel counts a tail-called program's
//! time in its caller's. Deep threads' long copies are measured the same
//! way: the C workload with `[debug] long_records = false` beside it (the
//! mark's lookup), and a Node event loop (`node_io.js`, cpu and off-CPU,
//! with sched_switch's time too) with them on and off.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::harness::{Daemon, median, parse_bpf_line_of, task_cpu_ns};

const ROUNDS: usize = 3;
const HZ: &str = "499";

/// One workload: its name, program and arguments before `SECONDS`.
struct Workload {
    name: &'static str,
    exe: PathBuf,
    args: Vec<String>,
    /// Whether it prints `ready` before it waits (the C program does not).
    says_ready: bool,
    /// The daemon's `--profiles` (cpu, or cpu,offcpu for an event loop
    /// that mostly waits).
    profiles: &'static str,
    /// Whether threads are marked deep (`[debug] long_records`): off, to
    /// measure what the long copies and the mark's lookup cost.
    long_records: bool,
}

#[derive(Default)]
struct Figures {
    /// Daemon CPU per sample, µs.
    daemon_us: Vec<f64>,
    cpu_sample_ns: Vec<f64>,
    /// BPF time per run of `sched_switch` (0 without off-CPU).
    switch_ns: Vec<f64>,
    samples: Vec<f64>,
}

pub fn measure(root: &Path, bin: &Path, work: &Path, seconds: u64) -> Result<String> {
    let c = work.join("cpu_ratio");
    let built = Command::new("gcc")
        .args(["-O2", "-fno-omit-frame-pointer", "-o"])
        .arg(&c)
        .arg(root.join("tests/workloads/cpu_ratio.c"))
        .status()
        .context("running gcc")?;
    if !built.success() {
        bail!("gcc failed on cpu_ratio.c");
    }
    let script = |name: &str| {
        root.join("tests/workloads")
            .join(name)
            .display()
            .to_string()
    };
    let python312 = pyenv("3.12")?;
    let mut workloads = vec![
        Workload {
            name: "C (gcc -O2, frame pointers)",
            exe: c.clone(),
            args: Vec::new(),
            says_ready: false,
            profiles: "cpu",
            long_records: true,
        },
        Workload {
            name: "CPython 3.10 (pyenv), no flag",
            exe: pyenv("3.10")?,
            args: vec![script("cpu_ratio.py")],
            says_ready: true,
            profiles: "cpu",
            long_records: true,
        },
        Workload {
            name: "CPython 3.11 (Debian), no flag",
            exe: PathBuf::from("/usr/bin/python3.11"),
            args: vec![script("cpu_ratio.py")],
            says_ready: true,
            profiles: "cpu",
            long_records: true,
        },
        Workload {
            name: "CPython 3.12 (pyenv), no flag",
            exe: python312.clone(),
            args: vec![script("cpu_ratio.py")],
            says_ready: true,
            profiles: "cpu",
            long_records: true,
        },
        Workload {
            name: "CPython 3.12 (pyenv), -X perf",
            exe: python312,
            args: vec!["-X".into(), "perf".into(), script("cpu_ratio.py")],
            says_ready: true,
            profiles: "cpu",
            long_records: true,
        },
        Workload {
            name: "Node 20, --perf-basic-prof",
            exe: PathBuf::from("/usr/bin/node"),
            args: vec![
                "--perf-basic-prof".into(),
                // V8's log, which --perf-basic-prof also writes, kept out
                // of the working directory.
                "--no-logfile-per-isolate".into(),
                format!("--logfile={}", work.join("v8.log").display()),
                "--no-turbo-inlining".into(),
                script("cpu_ratio.js"),
            ],
            says_ready: true,
            profiles: "cpu",
            long_records: true,
        },
    ];
    // Deep threads: the C program, which never needs a long copy, with
    // them off (what the mark's lookup costs each sample), and a Node
    // event loop whose main thread needs them (node_io.js: JavaScript run
    // from I/O callbacks under uv__io_poll, 1 ms timer waits), on and off.
    workloads.push(Workload {
        name: "C (gcc -O2, frame pointers), long records off",
        exe: c,
        args: Vec::new(),
        says_ready: false,
        profiles: "cpu",
        long_records: false,
    });
    for long_records in [true, false] {
        workloads.push(Workload {
            name: match long_records {
                true => "Node 20 event loop (node_io.js), cpu+offcpu",
                false => "Node 20 event loop (node_io.js), cpu+offcpu, long records off",
            },
            exe: PathBuf::from("/usr/bin/node"),
            args: vec![
                "--perf-basic-prof".into(),
                "--no-logfile-per-isolate".into(),
                format!("--logfile={}", work.join("v8.log").display()),
                script("node_io.js"),
            ],
            says_ready: false,
            profiles: "cpu,offcpu",
            long_records,
        });
    }
    let mut figures: Vec<Figures> = workloads.iter().map(|_| Figures::default()).collect();
    for round in 0..ROUNDS {
        for (workload, figures) in workloads.iter().zip(figures.iter_mut()) {
            eprintln!("round {}/{ROUNDS}: {}", round + 1, workload.name);
            run(bin, workload, work, seconds, figures)?;
        }
    }
    let mut out = String::new();
    writeln!(
        out,
        "# A CPU sample's cost by runtime\n\n\
         `cargo xtask bench --runtimes --seconds {seconds}`: each workload alone under \
         `profilerd --pid P --cpu-frequency {HZ}`, {ROUNDS} alternated rounds; medians \
         (and the rounds' values).\n\n\
         | workload | samples | daemon CPU per sample | cpu_sample ns/run (with py_sample) | sched_switch ns/run |\n\
         |---|---|---|---|---|"
    )?;
    let rounds = |values: &[f64]| {
        values
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    for (workload, f) in workloads.iter().zip(&figures) {
        writeln!(
            out,
            "| {} | {:.0} | {:.1} µs ({}) | {:.0} ({}) | {} |",
            workload.name,
            median(&f.samples),
            median(&f.daemon_us),
            rounds(&f.daemon_us),
            median(&f.cpu_sample_ns),
            rounds(&f.cpu_sample_ns),
            match workload.profiles.contains("offcpu") {
                true => format!("{:.0} ({})", median(&f.switch_ns), rounds(&f.switch_ns)),
                false => "-".into(),
            },
        )?;
    }
    Ok(out)
}

/// pyenv's newest CPython `minor` (3.12).
fn pyenv(minor: &str) -> Result<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let versions = Path::new(&home).join(".pyenv/versions");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&versions)
        .with_context(|| format!("reading {}", versions.display()))?
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{minor}."))
        })
        .map(|e| e.path().join(format!("bin/python{minor}")))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found
        .pop()
        .with_context(|| format!("no CPython {minor} under {}", versions.display()))
}

fn run(bin: &Path, workload: &Workload, work: &Path, seconds: u64, f: &mut Figures) -> Result<()> {
    let mut child = super::harness::Reaped(
        Command::new(&workload.exe)
            .args(&workload.args)
            .arg(seconds.to_string())
            .arg("--wait-stdin")
            .current_dir(work)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", workload.exe.display()))?,
    );
    let pid = child.0.id();
    let mut stdout = BufReader::new(child.0.stdout.take().context("workload stdout")?);
    if workload.says_ready {
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if !line.starts_with("ready") {
            bail!("unexpected workload output {line:?}");
        }
    }
    let out = work.join("runtime-profiles");
    let config = work.join("runtimes-long-records-off.toml");
    std::fs::write(&config, "[debug]\nlong_records = false\n")
        .with_context(|| format!("writing {}", config.display()))?;
    let mut args: Vec<String> = [
        "--pid",
        &pid.to_string(),
        "--profiles",
        workload.profiles,
        "--interval",
        "5s",
        "--cpu-frequency",
        HZ,
        "--output-dir",
        &out.to_string_lossy(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    if !workload.long_records {
        args.extend(["--config".into(), config.to_string_lossy().into_owned()]);
    }
    let mut daemon = Daemon::start(bin, &args)?;
    if let Some(reason) = daemon.wait_ready()? {
        bail!("profilerd did not start: {reason}");
    }
    let cpu_at_ready = task_cpu_ns(daemon.pid())?;
    child
        .0
        .stdin
        .take()
        .context("workload stdin")?
        .write_all(b"g")?;
    let mut report = String::new();
    stdout.read_line(&mut report)?;
    // Before the daemon notices the end and writes its last window.
    let cpu_at_end = task_cpu_ns(daemon.pid())?;
    let status = child.0.wait()?;
    if !status.success() {
        bail!("{} exited with {status}", workload.exe.display());
    }
    let (status, log) = daemon.finish(Duration::from_secs(20))?;
    if !status.success() {
        bail!("profilerd exited with {status}");
    }
    let samples = log
        .iter()
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("samples="))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    let ns_of = |program: &str| {
        log.iter()
            .find_map(|l| parse_bpf_line_of(l, program))
            .map_or(0.0, |(_, ns)| ns)
    };
    f.samples.push(samples);
    f.daemon_us
        .push((cpu_at_end.saturating_sub(cpu_at_ready)) as f64 / 1000.0 / samples.max(1.0));
    f.cpu_sample_ns.push(ns_of("cpu_sample"));
    f.switch_ns.push(ns_of("sched_switch"));
    let _ = std::fs::remove_dir_all(&out);
    // Node leaves its perf map behind.
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    Ok(())
}
