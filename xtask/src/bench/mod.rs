//! `cargo xtask bench`: the CPU profiler's cost, side by side with
//! `perf record -F 99 -a -g` and a bpftrace stack-counting one-liner in the
//! same run.
//!
//! Two CPUs are kept busy by a C program built with frame pointers;
//! profilerd profiles the whole system at 99 Hz with a profile every 10 s
//! while perf records and bpftrace counts stacks over the same window.
//! Reported: the daemon's CPU time (user+sys, from schedstat, steady state
//! after readiness and whole life), its peak RSS, BPF run time per sample
//! from the kernel's BPF statistics (ours and bpftrace's), and the CPU time
//! of perf record and bpftrace.
//!
//! `cargo xtask bench --footprint` measures what the daemon costs a node
//! (start-up, threads, CPU, memory) on a quiet and a busy node
//! (footprint.rs); `cargo xtask bench --heap` measures the heap profile
//! instead (heap.rs),
//! `cargo xtask bench --waits` the block, mutex and off-CPU profiles
//! (waits.rs), with `--baseline BIN` side by side with another build of
//! the daemon; `cargo xtask bench --go` what profiling a Go program costs
//! it (go.rs); `cargo xtask bench --runtimes` what a CPU sample costs in
//! C, Python and Node processes (runtimes.rs); `cargo xtask bench
//! --on-demand` what a 999 Hz capture over HTTP and an idle server cost
//! (on_demand.rs).

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

pub mod cpu;
pub mod footprint;
pub mod go;
mod go_label_ab;
pub mod harness;
pub mod heap;
pub mod on_demand;
pub mod runtimes;
pub mod waits;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Length of the measured window in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Profile interval in seconds.
    #[arg(long, default_value_t = 10)]
    interval: u64,
    /// profilerd's --unwind mode; `dwarf` also makes perf record use
    /// `--call-graph dwarf` instead of `-g`.
    #[arg(long, default_value = "fp")]
    unwind: String,
    /// Measure the heap profile instead: malloc+free cost against empty
    /// uprobes, and the daemon with a million sampled live allocations
    /// (writes target/bench-heap.md).
    #[arg(long, conflicts_with_all = ["seconds", "interval", "unwind"])]
    heap: bool,
    /// Measure the block, mutex and off-CPU profiles instead: futex
    /// wait/wake and context-switch cost against empty bpftrace tracepoints,
    /// and the daemon under 100k futex calls a second (writes
    /// target/bench-waits.md).
    #[arg(long, conflicts_with_all = ["seconds", "interval", "unwind", "heap"])]
    waits: bool,
    /// Measure the daemon's footprint instead: start-up, threads, CPU and
    /// memory for `--profiles cpu` and all five, on a quiet node and under
    /// a busy load this benchmark starts, beside perf record (`--seconds`
    /// per run; writes target/bench-footprint.md).
    #[arg(long, conflicts_with_all = ["interval", "unwind", "heap", "waits"])]
    footprint: bool,
    /// Measure what profiling a Go program costs it instead: its work
    /// done bare and under `--pid` at 499 Hz, and the BPF time per CPU
    /// sample with and without goroutine labels, on Go 1.19 and the
    /// current Go (`--seconds` per run; writes target/bench-go.md).
    #[arg(long, conflicts_with_all = ["interval", "unwind", "heap", "waits", "footprint"])]
    go: bool,
    /// Measure what a CPU sample costs by runtime instead: C, CPython
    /// without a flag (3.11, 3.12), CPython 3.12 `-X perf` and Node,
    /// daemon CPU and BPF time per sample (`--seconds` per run; writes
    /// target/bench-runtimes.md).
    #[arg(long, conflicts_with_all = ["interval", "unwind", "heap", "waits", "footprint", "go"])]
    runtimes: bool,
    /// Measure what profiles on demand cost instead: a busy thread's work
    /// bare, under the daemon, with an idle `--http-addr` server, during a
    /// 999 Hz capture of it and under perf record -F 999 (`--seconds` per
    /// run; writes target/bench-on-demand.md).
    #[arg(long, conflicts_with_all = ["interval", "unwind", "heap", "waits", "footprint", "go", "runtimes"])]
    on_demand: bool,
    /// With --go: only these tables (comma-separated: cpu, heap,
    /// channels, goroutines, labels).
    #[arg(long, value_name = "TABLES", requires = "go", value_delimiter = ',')]
    go_tables: Vec<String>,
    /// With --waits or --footprint: also run every profilerd setup with
    /// this daemon binary (an earlier build), in the same rounds, and
    /// compare the two.
    #[arg(long, value_name = "BIN")]
    baseline: Option<std::path::PathBuf>,
    /// The profilerd binary to measure, when not this checkout's release
    /// build (an earlier build, to compare runs of the CPU and heap
    /// benchmarks).
    #[arg(long, value_name = "BIN")]
    daemon: Option<std::path::PathBuf>,
}

pub fn run(root: &Path, args: BenchArgs) -> Result<()> {
    let bin = match &args.daemon {
        Some(path) => {
            fs::canonicalize(path).with_context(|| format!("daemon {}", path.display()))?
        }
        None => root.join("target/release/profilerd"),
    };
    let baseline = args
        .baseline
        .as_deref()
        .map(|path| {
            fs::canonicalize(path).with_context(|| format!("baseline daemon {}", path.display()))
        })
        .transpose()?;
    let work = tempdir(root)?;
    let out_dir = work.join("profiles");
    let stats_before = fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
    let (result, path) = if args.heap {
        (
            heap::measure(&bin, &work),
            root.join("target/bench-heap.md"),
        )
    } else if args.footprint {
        (
            footprint::measure(&bin, baseline.as_deref(), &work, args.seconds),
            root.join("target/bench-footprint.md"),
        )
    } else if args.go {
        let result = fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")
            .context("enabling BPF run-time stats")
            .and_then(|()| go::measure(root, &bin, &work, args.seconds, &args.go_tables));
        (result, root.join("target/bench-go.md"))
    } else if args.runtimes {
        let result = fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")
            .context("enabling BPF run-time stats")
            .and_then(|()| runtimes::measure(root, &bin, &work, args.seconds));
        (result, root.join("target/bench-runtimes.md"))
    } else if args.on_demand {
        let result = fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")
            .context("enabling BPF run-time stats")
            .and_then(|()| on_demand::measure(&bin, &work, args.seconds));
        (result, root.join("target/bench-on-demand.md"))
    } else if args.waits {
        (
            waits::measure(&bin, baseline.as_deref(), &work),
            root.join("target/bench-waits.md"),
        )
    } else {
        let result = fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")
            .context("enabling BPF run-time stats")
            .and_then(|()| cpu::measure(&bin, &work, &out_dir, &args));
        (
            result,
            root.join(format!("target/bench-cpu-{}.md", args.unwind)),
        )
    };
    let _ = fs::write(
        "/proc/sys/kernel/bpf_stats_enabled",
        if stats_before.trim().is_empty() {
            "0"
        } else {
            stats_before.trim()
        },
    );
    let report = result?;
    let _ = fs::remove_dir_all(&work);
    println!("{report}");
    fs::write(&path, &report)?;
    eprintln!("report written to {}", path.display());
    Ok(())
}

fn tempdir(root: &Path) -> Result<std::path::PathBuf> {
    let dir = root
        .join("target")
        .join(format!("bench-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    Ok(dir)
}
