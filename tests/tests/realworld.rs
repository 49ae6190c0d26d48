//! Real programs nobody here wrote, beside the profiler their community
//! trusts, on the same run: sympy (PyPI) doing symbolic algebra on
//! CPython, profiled with `--pid` while py-spy records it (stopping the
//! process at each sample, so that its stacks are whole: read while the
//! program runs, they put some functions 6–7 points off). Every Python
//! function among py-spy's fifteen heaviest (inclusive: the share of
//! samples with the function anywhere in the stack) has profilerd's share
//! within four points of py-spy's.
//!
//! The suite's other comparisons live with their features: native CPU
//! against `perf` (`perf_compare.rs`), a native heap under heaptrack
//! against heaptrack's own count (`heap_profile.rs`), the Go standard
//! library's benchmarks against the runtime's own profiles
//! (`go_stdlib.rs`), a Node program against `node --cpu-prof` (`jit.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::profiles::{flatten_all, of_pid, read_profiles};
use profiler_tests::py_spy::{SpyFrame, py_spy_stacks, start_py_spy_blocking};
use profiler_tests::temp_dir;
use profiler_tests::workloads::{Running, field, parse_report};

/// Samples per second of profilerd, and of py-spy, which stops the
/// process for each of its samples (at 499 Hz sympy ran a third as fast).
const HZ: u64 = 499;
const PY_SPY_HZ: u64 = 199;
/// Seconds sympy works.
const SECONDS: &str = "12";
/// Functions compared: py-spy's heaviest, inclusive.
const TOP: usize = 15;
/// Bound of |profilerd's share - py-spy's| per function (issue 42).
const SHARE_TOLERANCE: f64 = 0.04;

/// The virtualenv `cargo xtask test` installs sympy into.
fn sympy_python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/sympy/bin/python")
}

/// A function as both profilers can name it: its name and its file's
/// last component (py-spy shortens paths to the package's part). From
/// CPython 3.11 profilerd names a method by its qualified name
/// (`Poly.factor_list`), py-spy by its name (`factor_list`).
fn key(function: &str, file: &str) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    let name = match function.starts_with('<') {
        true => function,
        false => function.rsplit('.').next().unwrap_or(function),
    };
    format!("{name} ({base})")
}

/// Inclusive shares: for each function, the weight of the stacks that
/// hold it (once per stack), over the weight of every stack given.
fn inclusive<'a>(
    stacks: impl Iterator<Item = (BTreeSet<String>, f64)> + 'a,
) -> BTreeMap<String, f64> {
    let mut total = 0.0;
    let mut by: BTreeMap<String, f64> = BTreeMap::new();
    for (functions, weight) in stacks {
        total += weight;
        for f in functions {
            *by.entry(f).or_default() += weight;
        }
    }
    by.values_mut()
        .for_each(|w| *w /= total.max(f64::MIN_POSITIVE));
    by
}

#[test]
fn sympy_against_py_spy() {
    require_root();
    let python = sympy_python();
    assert!(
        python.exists(),
        "{} is absent: `cargo xtask test` installs sympy there",
        python.display()
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/sympy_work.py");
    let script = script.to_str().expect("UTF-8 path");
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let spy_out = tmp.path().join("py-spy.txt");
    // Both profilers start once sympy is imported: the work is the same
    // from round to round, so the few milliseconds py-spy takes to attach
    // after the daemon is ready do not tilt the shares; the import's
    // would.
    let mut workload = Running::start(&python, &[script, SECONDS, "--wait-stdin"]);
    workload.wait_line(Duration::from_secs(60), |l| l.starts_with("ready "));
    let pid = workload.pid();
    let hz = HZ.to_string();
    let pid_text = pid.to_string();
    let mut daemon = Daemon::start(&[
        "--pid",
        &pid_text,
        "--profiles",
        "cpu",
        "--cpu-frequency",
        &hz,
        "--interval",
        "2s",
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
    ]);
    daemon.wait_ready();
    let spy = start_py_spy_blocking(pid, PY_SPY_HZ, &spy_out);
    workload.release();
    let report = parse_report(&workload.finish(Duration::from_secs(60)), "pid");
    workload.kill();
    daemon.wait_success(Duration::from_secs(10));
    let spy = py_spy_stacks(spy, &spy_out);
    let samples = of_pid(&flatten_all(&read_profiles(&out, "cpu")), pid);
    let ours = inclusive(samples.iter().filter_map(|s| {
        let python: BTreeSet<String> = s
            .frames
            .iter()
            .filter(|f| f.file.ends_with(".py"))
            .map(|f| key(&f.function, &f.file))
            .collect();
        (!python.is_empty()).then_some((python, s.cpu_ns as f64))
    }));
    let theirs = inclusive(spy.iter().filter(|(frames, _)| !frames.is_empty()).map(
        |(frames, n)| {
            let functions = frames
                .iter()
                .map(|f: &SpyFrame| key(&f.function, &f.file))
                .collect();
            (functions, *n as f64)
        },
    ));
    let mut top: Vec<(&String, f64)> = theirs.iter().map(|(k, &v)| (k, v)).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(TOP);
    let mut table = String::new();
    let mut worst: f64 = 0.0;
    let mut failures = Vec::new();
    for (function, spy_share) in &top {
        let our_share = ours.get(*function).copied().unwrap_or(0.0);
        let off = (our_share - spy_share).abs();
        worst = worst.max(off);
        table.push_str(&format!(
            "  {:>6.2}% {:>6.2}% {:+6.2}  {function}\n",
            our_share * 100.0,
            spy_share * 100.0,
            (our_share - spy_share) * 100.0
        ));
        if off > SHARE_TOLERANCE {
            failures.push(format!(
                "{function}: {:.2}% against py-spy's {:.2}%",
                our_share * 100.0,
                spy_share * 100.0
            ));
        }
    }
    println!(
        "sympy, {} rounds: profilerd / py-spy inclusive shares of py-spy's top {TOP} (worst {:.2} points):\n{table}",
        field(&report, "rounds"),
        worst * 100.0
    );
    assert_eq!(
        top.len(),
        TOP,
        "py-spy's profile has too few functions:\n{table}"
    );
    assert!(
        failures.is_empty(),
        "more than {:.0} points from py-spy:\n  {}\n{table}{}",
        SHARE_TOLERANCE * 100.0,
        failures.join("\n  "),
        daemon.describe()
    );
}
