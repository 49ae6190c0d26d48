//! JIT-compiled code named from the process's perf map: a Node program
//! run with `--perf-basic-prof` (which writes `/tmp/perf-PID.map`, as
//! Node's documentation says for perf) splits its time 3:1 between two
//! JavaScript functions; profilerd's CPU profile names both from the map,
//! in the ratio the program timed and the ratio of Node's own profiler
//! (`--cpu-prof`) on the same run, and its stacks go on through the JIT
//! frames (by their frame pointers) into Node's own code. The program runs
//! with `--no-turbo-inlining`: V8 would otherwise inline both leaves into
//! their caller, whose one code object the perf map then names (perf's
//! answer too). CPython 3.12 with `-X perf` (a trampoline per Python
//! function in the map) likewise when its frames are not read: its
//! functions named, nested as they were called, in the ratio the program
//! timed; and when they are (by default), the Python frames stand in for
//! the trampolines, none left beside them. A container's map, in
//! the `/tmp` of the process's own mount namespace and under its pid in
//! its own pid namespace, is found there. Code written over (a C program's
//! JIT spin loop named `jit_first`, then at the same address
//! `jit_second`, each spun for three seconds, in one profile window) is
//! named by the line that was there when each sample was taken.
//! (Garbage lines, maps that grow and maps replaced are the unit tests'
//! of `stacks/symbolize/perf_map.rs`.)

use std::path::{Path, PathBuf};

use std::time::Duration;

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::node::{node_args, v8_log_in};
use profiler_tests::process::child_of;
use profiler_tests::profiles::{
    FlatSample, cpu_where, flatten_all, of_pid, read_node_cpu_profile, read_profiles, summary,
    total_cpu,
};
use profiler_tests::temp_dir;
use profiler_tests::workloads::{
    Running, WholeLife, Workload, field, parse_report, profile_whole_life, pyenv_python,
};

/// |profiled heavy share / timed heavy share - 1| bound, and the least
/// share of the process's samples whose leaf the map names.
const SHARE_TOLERANCE: f64 = 0.05;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/cpu_ratio.js")
}

/// The CPU time of samples with a frame whose name (as the perf map has
/// it, `JS:*spinHeavy /path:line:col`) names JavaScript function `f`.
fn cpu_in(samples: &[FlatSample], f: &str) -> i64 {
    cpu_where(samples, |s| {
        s.frames.iter().any(|fr| names_js(&fr.function, f))
    })
}

/// Whether a perf-map name is JavaScript function `f`'s: V8 writes
/// `JS:` (or `LazyCompile:`) and a tier mark (`*`, `~`, `^`, `+`) before
/// the name, and its script's place after it.
fn names_js(name: &str, f: &str) -> bool {
    name.split_whitespace().next().is_some_and(|head| {
        head.rsplit(':')
            .next()
            .is_some_and(|fun| fun.trim_start_matches(['*', '~', '^', '+']) == f)
    })
}

#[test]
fn node_functions_are_named_from_the_perf_map() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let node = PathBuf::from("/usr/bin/node");
    let script = script();
    let v8_log = v8_log_in(tmp.path());
    let WholeLife {
        pid,
        report,
        daemon,
    } = profile_whole_life(
        &node,
        &node_args(
            &v8_log,
            &[
                "--no-turbo-inlining",
                "--cpu-prof",
                "--cpu-prof-dir",
                tmp.path().join("own").to_str().expect("UTF-8 path"),
                script.to_str().expect("UTF-8 path"),
                "4",
            ],
        ),
        &out,
        199,
        &["--profiles", "cpu"],
    );
    // The program's map, which Node leaves behind.
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let _ = std::fs::remove_file(&map);
    let files = read_profiles(&out, "cpu");
    let samples = of_pid(&flatten_all(&files), pid);
    let total: i64 = samples.iter().map(|s| s.cpu_ns).sum();
    let (heavy, light) = (cpu_in(&samples, "spinHeavy"), cpu_in(&samples, "spinLight"));
    let (timed_heavy, timed_light) = (
        field(&report, "heavy_ns") as f64,
        field(&report, "light_ns") as f64,
    );
    let share = heavy as f64 / (heavy + light).max(1) as f64;
    let (own_heavy, own_light) = node_self_samples(&tmp.path().join("own"));
    let own_share = own_heavy as f64 / (own_heavy + own_light).max(1) as f64;
    // Stacks that go from a JavaScript leaf through Node's C++ into libuv.
    let through: i64 = samples
        .iter()
        .filter(|s| {
            s.frames
                .first()
                .is_some_and(|f| f.function.starts_with("JS:"))
                && s.has_function("Builtins_JSEntry")
                && s.frames.iter().any(|f| f.function.starts_with("uv_"))
        })
        .map(|s| s.cpu_ns)
        .sum();
    let timed_share = timed_heavy / (timed_heavy + timed_light);
    let named = (heavy + light) as f64 / total.max(1) as f64;
    let diag = format!("\n{}\n{}", summary(&samples), daemon.describe());
    let deep = through as f64 / total.max(1) as f64;
    println!(
        "node --perf-basic-prof: spinHeavy {heavy} ns, spinLight {light} ns of {total} ({named:.3} of the process's time): heavy share {share:.3}, timed {timed_share:.3}, node --cpu-prof {own_share:.3} ({own_heavy} and {own_light} samples); {deep:.3} of the time in stacks from a JS leaf through JSEntry into libuv; {} frames named from perf maps",
        daemon.summary_field("perf_map_frames")
    );
    assert!(
        (share - own_share).abs() <= SHARE_TOLERANCE,
        "spinHeavy's share of the two {share:.3}, node --cpu-prof's {own_share:.3} (allowed ±{SHARE_TOLERANCE}){diag}"
    );
    assert!(
        deep >= 0.8,
        "only {deep:.3} of node's time in stacks that go from a JavaScript leaf through Builtins_JSEntry into libuv{diag}"
    );
    assert!(
        named >= 0.8,
        "only {named:.3} of node's CPU time in spinHeavy or spinLight by name (expected ≥ 0.8){diag}"
    );
    assert!(
        (share - timed_share).abs() <= SHARE_TOLERANCE,
        "spinHeavy's share of the two {share:.3}, the program timed {timed_share:.3} (allowed ±{SHARE_TOLERANCE}){diag}"
    );
    assert!(daemon.summary_field("perf_map_frames") > 0, "{diag}");
    // Without --interpreted-frames-native-stack the interpreted code (the
    // script's top level here) is V8's one trampoline: counted, and the
    // log says how to name it, once.
    assert!(
        daemon.summary_field("v8_interpreted_frames_unnamed") > 0,
        "{diag}"
    );
    let told = daemon
        .stderr_lines()
        .iter()
        .filter(|l| l.contains("--interpreted-frames-native-stack"))
        .count();
    assert_eq!(
        told, 1,
        "the log must say once how to name interpreted frames{diag}"
    );
}

/// What one run of `node_io.js` gave: for its main thread, in the
/// windows after the first (the thread is marked deep at the daemon's
/// first tick), the CPU and off-CPU time in stacks through `uv__io_poll`
/// and the part of it whose stacks reach `_start`.
struct EventLoopRun {
    cpu: (i64, i64),
    off: (i64, i64),
    /// CPU time in stacks whose JavaScript leaf is `work`.
    work: i64,
    report: std::collections::BTreeMap<String, u64>,
    long_records: u64,
    diag: String,
}

fn event_loop_run(config: Option<&str>) -> EventLoopRun {
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let mut extra = vec!["--profiles", "cpu,offcpu"];
    let config_path = tmp.path().join("profilerd.toml");
    if let Some(text) = config {
        std::fs::write(&config_path, text).expect("config file");
        extra.extend(["--config", config_path.to_str().expect("UTF-8 path")]);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/node_io.js");
    let v8_log = v8_log_in(tmp.path());
    let WholeLife {
        pid,
        report,
        daemon,
    } = profile_whole_life(
        Path::new("/usr/bin/node"),
        &node_args(&v8_log, &[script.to_str().expect("UTF-8 path"), "5"]),
        &out,
        199,
        &extra,
    );
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let later = |kind: &str| -> Vec<FlatSample> {
        let files = read_profiles(&out, kind);
        assert!(files.len() >= 2, "{kind}: {} files", files.len());
        of_pid(&flatten_all(&files[1..]), pid)
            .into_iter()
            .filter(|s| s.tid() == pid && s.has_function("uv__io_poll"))
            .collect()
    };
    let whole = |samples: &[FlatSample], value: fn(&FlatSample) -> i64| {
        let reaching = samples
            .iter()
            .filter(|s| s.frames.last().is_some_and(|f| f.function == "_start"))
            .map(value)
            .sum();
        (samples.iter().map(value).sum(), reaching)
    };
    let (cpu, off) = (later("cpu"), later("offcpu"));
    let work = cpu_where(&cpu, |s| {
        s.frames
            .iter()
            .take(1)
            .any(|f| names_js(&f.function, "work"))
    });
    EventLoopRun {
        cpu: whole(&cpu, |s| s.cpu_ns),
        off: whole(&off, |s| s.values.last().copied().unwrap_or(0)),
        work,
        report,
        long_records: daemon.summary_field("records_long_form"),
        diag: format!("\n{}\n{}", summary(&cpu), daemon.describe()),
    }
}

/// A Node program whose JavaScript runs from libuv's I/O callbacks: its
/// main thread's stacks, on and off the CPU, go through `uv__io_poll`,
/// whose frame holds 12 KiB of epoll events, and reach `_start`. Its
/// first walks run past the end of the usual copy; the thread is then
/// marked deep and copied in the long form. With `long_records` off
/// they stay cut: the test sees the difference.
#[test]
fn node_event_loop_stacks_reach_their_root() {
    require_root();
    let on = event_loop_run(None);
    let off = event_loop_run(Some("[debug]\nlong_records = false\n"));
    let share = |(total, reaching): (i64, i64)| reaching as f64 / total.max(1) as f64;
    for (name, run) in [("long records on", &on), ("long records off", &off)] {
        println!(
            "{name}: main thread through uv__io_poll after the first window: CPU {:.3} of {} ns reaches _start, off-CPU {:.3} of {} ns; {} ns in work (the program timed {} ns over its whole run); {} long records",
            share(run.cpu),
            run.cpu.0,
            share(run.off),
            run.off.0,
            run.work,
            field(&run.report, "work_ns"),
            run.long_records
        );
    }
    // Enough of both to judge (199 Hz; 1 ms waits between 5 ms turns).
    for run in [&on, &off] {
        assert!(
            run.cpu.0 >= 500_000_000,
            "CPU time {}{}",
            run.cpu.0,
            run.diag
        );
        assert!(
            run.off.0 >= 100_000_000,
            "off-CPU time {}{}",
            run.off.0,
            run.diag
        );
        assert!(
            run.work as f64 >= 0.5 * run.cpu.0 as f64,
            "work {}{}",
            run.work,
            run.diag
        );
    }
    assert!(on.long_records > 0, "{}", on.diag);
    assert!(share(on.cpu) >= 0.97, "CPU stacks cut{}", on.diag);
    assert!(share(on.off) >= 0.97, "off-CPU stacks cut{}", on.diag);
    assert_eq!(off.long_records, 0, "{}", off.diag);
    assert!(
        share(off.cpu) <= 0.5,
        "CPU stacks whole without long records{}",
        off.diag
    );
    assert!(
        share(off.off) <= 0.5,
        "off-CPU stacks whole without long records{}",
        off.diag
    );
}

/// Self samples of spinHeavy and spinLight in the `.cpuprofile` Node's own
/// profiler wrote into `dir` (its nodes' `hitCount`).
fn node_self_samples(dir: &Path) -> (u64, u64) {
    let profile = read_node_cpu_profile(dir);
    let (mut heavy, mut light) = (0, 0);
    for node in profile["nodes"].as_array().expect("nodes") {
        let hits = node["hitCount"].as_u64().unwrap_or(0);
        match node["callFrame"]["functionName"].as_str() {
            Some("spinHeavy") => heavy += hits,
            Some("spinLight") => light += hits,
            _ => {}
        }
    }
    (heavy, light)
}

/// The CPU time of samples whose stack holds Python function `f` (as
/// CPython's perf map names its trampoline, `py::f:/path/file.py`), and
/// of those, the time whose stack also holds the caller `caller` and
/// `py::run` further out, in that order.
fn python_cpu_in(samples: &[FlatSample], f: &str, caller: &str) -> (i64, i64) {
    let at = |s: &FlatSample, name: &str| {
        let prefix = format!("py::{name}:");
        s.frames
            .iter()
            .position(|fr| fr.function.starts_with(&prefix))
    };
    let (mut all, mut nested) = (0, 0);
    for s in samples {
        let Some(leaf) = at(s, f) else { continue };
        all += s.cpu_ns;
        if let (Some(c), Some(r)) = (at(s, caller), at(s, "run"))
            && leaf < c
            && c < r
        {
            nested += s.cpu_ns;
        }
    }
    (all, nested)
}

/// CPython 3.12 under `-X perf`, with its frames' reading switched off
/// (`[debug] python_frames = false`): named by its trampolines, as perf
/// names them. Then as it is by default: the Python frames read from the
/// interpreter stand for the trampolines, none of which is left beside
/// them.
#[test]
fn python_functions_are_named_from_the_perf_map() {
    require_root();
    let tmp = temp_dir();
    let config = tmp.path().join("python-frames-off.toml");
    std::fs::write(&config, "[debug]\npython_frames = false\n").expect("config file");
    let config = config.to_str().expect("UTF-8 path");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/cpu_ratio.py");
    let run = |name: &str, extra: &[&str]| {
        let out = tmp.path().join(name);
        let mut args = vec!["--profiles", "cpu"];
        args.extend_from_slice(extra);
        let whole = profile_whole_life(
            &pyenv_python("3.12"),
            &["-X", "perf", script.to_str().expect("UTF-8 path"), "4"],
            &out,
            199,
            &args,
        );
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", whole.pid));
        let files = read_profiles(&out, "cpu");
        let samples = of_pid(&flatten_all(&files), whole.pid);
        (whole, samples)
    };

    let (WholeLife { report, daemon, .. }, samples) = run("frames-off", &["--config", config]);
    let total: i64 = samples.iter().map(|s| s.cpu_ns).sum();
    let (heavy, heavy_nested) = python_cpu_in(&samples, "spin_heavy", "call_heavy");
    let (light, light_nested) = python_cpu_in(&samples, "spin_light", "call_light");
    let (timed_heavy, timed_light) = (
        field(&report, "heavy_ns") as f64,
        field(&report, "light_ns") as f64,
    );
    let share = heavy as f64 / (heavy + light).max(1) as f64;
    let timed_share = timed_heavy / (timed_heavy + timed_light);
    let named = (heavy + light) as f64 / total.max(1) as f64;
    let nested = (heavy_nested + light_nested) as f64 / (heavy + light).max(1) as f64;
    let diag = format!("\n{}\n{}", summary(&samples), daemon.describe());
    println!(
        "python3.12 -X perf, Python frames not read: spin_heavy {heavy} ns, spin_light {light} ns of {total} ({named:.3} of the process's time): heavy share {share:.3}, timed {timed_share:.3}; {nested:.3} of it under its caller and run; {} frames named from perf maps, {} JIT frames stepped",
        daemon.summary_field("perf_map_frames"),
        daemon.summary_field("jit_frames_by_frame_pointer")
    );
    assert!(
        named >= 0.8 && nested >= 0.95,
        "{named:.3} of python's CPU time in spin_heavy or spin_light by name (expected ≥ 0.8), {nested:.3} of that under its caller and run (expected ≥ 0.95){diag}"
    );
    assert!(
        (share - timed_share).abs() <= SHARE_TOLERANCE,
        "spin_heavy's share of the two {share:.3}, the program timed {timed_share:.3} (allowed ±{SHARE_TOLERANCE}){diag}"
    );

    let (WholeLife { report, daemon, .. }, samples) = run("frames-on", &[]);
    let total = total_cpu(&samples);
    let leaf_time = |f: &str| {
        cpu_where(&samples, |s| {
            s.frames
                .iter()
                .find(|fr| fr.file.ends_with(".py"))
                .is_some_and(|fr| fr.function == f)
        })
    };
    let (heavy, light) = (leaf_time("spin_heavy"), leaf_time("spin_light"));
    // Among the samples whose Python frames were read: those taken before
    // the daemon marked the process (at its first re-read, 20 ms after
    // its exec) have none, and keep their trampolines, as perf shows them;
    // the 0.95 below bounds them.
    let trampolines = cpu_where(&samples, |s| {
        s.frames.iter().any(|f| f.file.ends_with(".py"))
            && s.frames.iter().any(|f| f.function.starts_with("py::"))
    });
    let in_python = cpu_where(&samples, |s| {
        s.frames.iter().any(|f| f.file.ends_with(".py"))
    });
    let share = heavy as f64 / (heavy + light).max(1) as f64;
    let timed_share = field(&report, "heavy_ns") as f64
        / (field(&report, "heavy_ns") + field(&report, "light_ns")).max(1) as f64;
    let folded = daemon.summary_field("python_trampolines_folded");
    let left: Vec<Vec<&str>> = samples
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.function.starts_with("py::")))
        .take(5)
        .map(|s| s.frames.iter().map(|f| f.function.as_str()).collect())
        .collect();
    let diag = format!(
        "\nstacks with a trampoline left: {left:#?}\n{}\n{}",
        summary(&samples),
        daemon.describe()
    );
    println!(
        "python3.12 -X perf, Python frames read: heavy share {share:.3}, timed {timed_share:.3}; {:.3} of the time in Python frames, {:.3} with a trampoline left; {folded} trampolines folded",
        in_python as f64 / total.max(1) as f64,
        trampolines as f64 / total.max(1) as f64,
    );
    assert!(
        in_python as f64 >= 0.95 * total as f64 && trampolines == 0 && folded > 0,
        "{in_python} of {total} ns in Python frames (expected ≥ 0.95), {trampolines} ns with Python frames and a `py::` trampoline left (expected none), {folded} folded{diag}"
    );
    assert!(
        (share - timed_share).abs() <= SHARE_TOLERANCE,
        "with Python frames read, spin_heavy's share {share:.3}, the program timed {timed_share:.3} (allowed ±{SHARE_TOLERANCE}){diag}"
    );
}

/// A container's view: Node runs in a mount namespace of its own with a
/// private `/tmp` (a tmpfs mounted there by `unshare`) and in a pid
/// namespace of its own, where it is pid 1: its perf map is
/// `/tmp/perf-1.map` and exists only inside. profilerd reads it through
/// the process's own root, under its pid in its namespace (`NSpid`), and
/// names its functions, while the host's `/tmp` has no map of either pid.
#[test]
fn a_perf_map_is_found_in_the_process_own_namespaces() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let script = script();
    // sh execs node, the first process of the new pid namespace (unshare
    // forks it, and kills it if unshare dies). The script is read before
    // the tmpfs hides /tmp (a checkout may lie under it) and written into
    // it.
    let inner = format!(
        "script=$(cat '{}') && mount -t tmpfs profilerd-jit-tmp /tmp && printf '%s\\n' \"$script\" > /tmp/cpu_ratio.js && exec /usr/bin/node --perf-basic-prof --no-logfile-per-isolate --logfile=/tmp/v8.log --no-turbo-inlining /tmp/cpu_ratio.js \"$@\"",
        script.to_str().expect("UTF-8 path")
    );
    let mut unshare = Running::start(
        Path::new("/usr/bin/unshare"),
        &[
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child",
            "--",
            "/bin/sh",
            "-c",
            &inner,
            "sh",
            "3",
            "--wait-stdin",
        ],
    );
    let ready = unshare.wait_line(Duration::from_secs(20), |l| l.starts_with("ready "));
    let node = child_of(unshare.pid());
    let mut daemon = Daemon::start(&[
        "--pid",
        &node.to_string(),
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
        "--interval",
        "2s",
        "--cpu-frequency",
        "199",
    ]);
    daemon.wait_ready();
    unshare.release();
    let report = unshare.finish(Duration::from_secs(30));
    daemon.wait_success(Duration::from_secs(10));
    let on_host = [node.to_string(), "1".to_string()]
        .iter()
        .any(|p| Path::new(&format!("/tmp/perf-{p}.map")).exists());
    let files = read_profiles(&out, "cpu");
    let samples = of_pid(&flatten_all(&files), node);
    let total: i64 = samples.iter().map(|s| s.cpu_ns).sum();
    let (heavy, light) = (cpu_in(&samples, "spinHeavy"), cpu_in(&samples, "spinLight"));
    let named = (heavy + light) as f64 / total.max(1) as f64;
    let diag = format!("\n{}\n{}", summary(&samples), daemon.describe());
    println!(
        "node as pid 1 of its own pid and mount namespaces (host pid {node}; it said {ready:?}): {named:.3} of its time named from its map (a map on the host's /tmp: {on_host}); its report: {report}"
    );
    assert!(ready.contains("pid=1"), "node is not pid 1 inside: {ready}");
    assert!(!on_host, "a map was written to the host's /tmp{diag}");
    // The split itself is the test above's; here, that the names come.
    assert!(
        named >= 0.8,
        "{named:.3} of node's time named from the map in its own /tmp (expected ≥ 0.8){diag}"
    );
}

/// Bound of |the share of `jit_first` among the two names - its phase's
/// share of the CPU time|: the maps are read once a second and a line is
/// taken as written halfway between two reads, and a sample is placed
/// within a quarter second (`SampleId::jit_quarter`), so up to 0.75 s of
/// the six can take the other name (measured: 0.397 to 0.406 against
/// 0.5). Named by the last line alone, every sample of the one window was
/// `jit_second`.
const REWRITE_TOLERANCE: f64 = 0.2;

#[test]
fn code_written_over_is_named_as_it_was_when_sampled() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let exe = Workload::JitRewrite.build(tmp.path(), "jit_rewrite");
    let mut work = Running::start(&exe, &["3", "--wait-stdin"]);
    work.wait_line(Duration::from_secs(10), |l| l.starts_with("ready"));
    let pid = work.pid();
    // One window for the whole run: both names in it.
    let mut daemon = Daemon::start(&[
        "--pid",
        &pid.to_string(),
        "--profiles",
        "cpu",
        "--cpu-frequency",
        "199",
        "--interval",
        "60s",
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
    ]);
    daemon.wait_ready();
    work.release();
    let report = parse_report(&work.finish(Duration::from_secs(30)), "pid");
    work.kill();
    daemon.wait_success(Duration::from_secs(10));
    let samples = of_pid(&flatten_all(&read_profiles(&out, "cpu")), pid);
    let named = |name: &str| cpu_where(&samples, |s| s.has_function(name)) as f64;
    let (first, second) = (named("jit_first"), named("jit_second"));
    let (timed_first, timed_second) = (
        field(&report, "first_ns") as f64,
        field(&report, "second_ns") as f64,
    );
    let share = first / (first + second).max(1.0);
    let timed = timed_first / (timed_first + timed_second);
    let of_process = (first + second) / total_cpu(&samples).max(1) as f64;
    println!(
        "code written over: jit_first {share:.3} of the two names (timed {timed:.3}); the names on {of_process:.3} of the process's time"
    );
    let diag = format!("\n{}\n{}", summary(&samples), daemon.describe());
    assert!(
        of_process >= 0.9,
        "only {of_process:.3} of the process's time under either name{diag}"
    );
    assert!(
        (share - timed).abs() <= REWRITE_TOLERANCE,
        "jit_first {share:.3} of the two names, its phase {timed:.3} of the time (allowed ±{REWRITE_TOLERANCE}){diag}"
    );
}
