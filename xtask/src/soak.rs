//! `cargo xtask soak [--minutes N] [--warm-up-minutes W]`: the daemon's
//! memory over uptime.
//!
//! profilerd runs system-wide with cpu, heap and block profiles (a window
//! every 60 s, the default) over a steady load: `mixed.c` (CPU, malloc/free
//! and a contended mutex) and `churn.c` starting 20 short-lived processes a
//! second, both from tests/workloads. Its VmRSS, RssAnon and open
//! descriptors are read every second. Growth is judged on RssAnon (the
//! daemon's own memory; RSS also holds pages of the files it reads symbols
//! from, which follow whatever else runs): the mean of the last minute
//! against the mean of the first minute after warm-up, under 10%. The
//! warm-up is the time it takes the daemon to have seen every file, stack
//! and symbol of a steady load and filled its caches to their working size;
//! it is a flag, and the report shows the growth from every earlier minute
//! too, so the choice can be judged. Writes target/soak.md; exits 1 if the
//! growth is 10% or more.

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench::harness::{Reaped, status_field};

/// Allowed RssAnon growth after warm-up.
const MAX_GROWTH: f64 = 0.10;
/// Short-lived processes a second in the load.
const CHURN_RATE: u32 = 20;

#[derive(clap::Args)]
pub struct SoakArgs {
    /// Length of the run in minutes (after the daemon is ready).
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// Minutes at the start that are not judged.
    #[arg(long, default_value_t = 5)]
    warm_up_minutes: u64,
}

/// One reading of the daemon.
#[derive(Clone, Copy)]
struct Reading {
    rss_kib: u64,
    anon_kib: u64,
    fds: u64,
}

fn read(pid: u32) -> Result<Reading> {
    Ok(Reading {
        rss_kib: status_field(pid, "VmRSS:")?,
        anon_kib: status_field(pid, "RssAnon:")?,
        fds: fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64,
    })
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn compile(root: &Path, work: &Path, name: &str) -> Result<std::path::PathBuf> {
    let out = work.join(name);
    let source = root.join("tests/workloads").join(format!("{name}.c"));
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
        .context("running gcc")?;
    if !status.success() {
        bail!("compiling {} failed", source.display());
    }
    Ok(out)
}

pub fn run(root: &Path, args: SoakArgs) -> Result<()> {
    if args.minutes < args.warm_up_minutes + 1 {
        eprintln!("error: --minutes must exceed --warm-up-minutes by at least 1 (a judged minute)");
        std::process::exit(2);
    }
    let work = root
        .join("target")
        .join(format!("soak-{}", std::process::id()));
    fs::create_dir_all(&work)?;
    let result = soak(root, &work, &args);
    let _ = fs::remove_dir_all(&work);
    let (report, growth) = result?;
    let path = root.join("target/soak.md");
    println!("{report}");
    fs::write(&path, &report)?;
    eprintln!("report written to {}", path.display());
    if growth >= MAX_GROWTH {
        bail!(
            "RssAnon grew {:.1}% after warm-up (limit {:.0}%)",
            growth * 100.0,
            MAX_GROWTH * 100.0
        );
    }
    Ok(())
}

fn soak(root: &Path, work: &Path, args: &SoakArgs) -> Result<(String, f64)> {
    let mixed = compile(root, work, "mixed")?;
    let churn = compile(root, work, "churn")?;
    let run_for = Duration::from_secs(args.minutes * 60);
    let load_for = (run_for + Duration::from_secs(30)).as_secs().to_string();
    let out_dir = work.join("profiles");
    let bin = root.join("target/release/profilerd");
    let load_before = loadavg();
    let mut daemon = Reaped(
        Command::new(&bin)
            .arg("--output-dir")
            .arg(&out_dir)
            .args(["--profiles", "cpu,heap,block"])
            // Plain log lines: the summary is copied into the report.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting profilerd")?,
    );
    let pid = daemon.0.id();
    let stderr = daemon.0.stderr.take().context("daemon stderr")?;
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let ready_by = Instant::now() + Duration::from_secs(30);
    loop {
        let line = rx
            .recv_timeout(ready_by.saturating_duration_since(Instant::now()))
            .context("profilerd did not become ready within 30 s")?;
        if line.contains("ready") {
            break;
        }
    }
    let _mixed = Reaped(
        Command::new(&mixed)
            .arg(&load_for)
            .stdout(Stdio::null())
            .spawn()
            .context("starting mixed")?,
    );
    let _churn = Reaped(
        Command::new(&churn)
            .args(["procs", &CHURN_RATE.to_string(), &load_for])
            .stdout(Stdio::null())
            .spawn()
            .context("starting churn")?,
    );
    let started = Instant::now();
    let mut readings: Vec<Reading> = Vec::new();
    let mut next = started;
    while started.elapsed() < run_for {
        readings.push(read(pid).context("the daemon exited during the soak")?);
        next += Duration::from_secs(1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let load_after = loadavg();
    // SAFETY: signalling our own child, not yet reaped.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    let status = daemon.0.wait()?;
    let _ = reader.join();
    let log: Vec<String> = rx.try_iter().collect();
    if !status.success() {
        bail!("profilerd exited with {status}:\n{}", log.join("\n"));
    }
    Ok(report(args, &readings, &log, &load_before, &load_after))
}

/// Per-minute means and maxima, the growth from every minute to the last,
/// and the verdict.
fn report(
    args: &SoakArgs,
    readings: &[Reading],
    log: &[String],
    load_before: &str,
    load_after: &str,
) -> (String, f64) {
    let minutes: Vec<&[Reading]> = readings.chunks(60).filter(|c| c.len() == 60).collect();
    let mean = |m: &[Reading], f: fn(&Reading) -> u64| {
        m.iter().map(f).sum::<u64>() as f64 / m.len().max(1) as f64
    };
    let anon_means: Vec<f64> = minutes.iter().map(|m| mean(m, |r| r.anon_kib)).collect();
    let last = anon_means.last().copied().unwrap_or(0.0);
    let base = anon_means
        .get(args.warm_up_minutes as usize)
        .copied()
        .unwrap_or(last);
    let growth = if base > 0.0 { last / base - 1.0 } else { 0.0 };
    let mut out = String::new();
    let _ = writeln!(out, "# profilerd soak: memory over uptime\n");
    let _ = writeln!(
        out,
        "Command: `cargo xtask soak --minutes {} --warm-up-minutes {}` \
         (profilerd --profiles cpu,heap,block, system-wide, 60 s windows; \
         load: mixed.c and churn.c at {CHURN_RATE} processes/s). \
         Load average before {load_before}, after {load_after}, on {} CPUs.\n",
        args.minutes,
        args.warm_up_minutes,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let _ = writeln!(
        out,
        "| minute | RssAnon mean MiB | RssAnon max MiB | VmRSS mean MiB | VmRSS max MiB | fds max | last minute vs this |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for (i, m) in minutes.iter().enumerate() {
        let max = |f: fn(&Reading) -> u64| m.iter().map(f).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {:+.1}% |",
            i + 1,
            anon_means[i] / 1024.0,
            max(|r| r.anon_kib) as f64 / 1024.0,
            mean(m, |r| r.rss_kib) / 1024.0,
            max(|r| r.rss_kib) as f64 / 1024.0,
            max(|r| r.fds),
            (last / anon_means[i] - 1.0) * 100.0
        );
    }
    let _ = writeln!(
        out,
        "\nWarm-up: the first {} minute(s). RssAnon growth from minute {} to the last minute: \
         {:+.1}% (limit {:.0}%): {}.\n",
        args.warm_up_minutes,
        args.warm_up_minutes + 1,
        growth * 100.0,
        MAX_GROWTH * 100.0,
        if growth < MAX_GROWTH { "pass" } else { "FAIL" }
    );
    let _ = writeln!(out, "Exit summary:\n");
    for line in log.iter().filter(|l| l.contains("summary")) {
        let _ = writeln!(out, "    {line}");
    }
    (out, growth)
}
