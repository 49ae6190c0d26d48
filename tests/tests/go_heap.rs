//! The heap profile of Go programs, read from outside: Go allocates
//! without malloc and samples its allocations itself, by its own
//! `runtime.MemProfileRate`; profilerd records what the runtime samples
//! and when the collector frees it. Per allocation site, its allocated and
//! in-use objects and bytes are held against what the program counted and
//! against the heap profile Go's runtime/pprof wrote of the same run, on Go
//! 1.19 and a current Go, as built (a rate the program set, read from its
//! memory) and stripped (`-s -w`: Go's default rate assumed, functions found
//! in the pclntab).

use std::path::Path;

use profiler_tests::daemon::require_root;
use profiler_tests::http::{get, parse_exposition};
use profiler_tests::profiles::{FlatSample, flatten, flatten_all, flatten_file, read_profiles};
use profiler_tests::workloads::{
    GoBuild, WholeLife, Workload, field, go_builds, go_versions, profile_whole_life,
};
use profiler_tests::{pprof_heap_tops, temp_dir};

/// Per site, |profilerd / runtime/pprof - 1| bound (issue 20: ±15%). Both
/// count the same samples, the runtime's, so they agree more closely.
const GO_TOLERANCE: f64 = 0.15;
/// Per site, the least |profiled / counted - 1| bound against the
/// program's own count; sites with fewer samples get four standard
/// deviations of their sample count.
const TRUTH_TOLERANCE: f64 = 0.15;
/// The rate the stripped builds set (`runtime.MemProfileRate`, found in
/// their code: they have no symbol table), and the builds of the A/B.
const SET_RATE: u64 = 128 * 1024;
/// Go's default `MemProfileRate`, which the unstripped builds keep.
const DEFAULT_RATE: u64 = 512 * 1024;

/// A site of go_heap.go: its function, the report field with its bytes,
/// the size of its objects, and whether they stay in use.
struct Site {
    function: &'static str,
    bytes_field: &'static str,
    size: u64,
    kept: bool,
}

const SITES: [Site; 3] = [
    Site {
        function: "main.allocSmall",
        bytes_field: "small_bytes",
        size: 64,
        kept: false,
    },
    Site {
        function: "main.allocLarge",
        bytes_field: "large_bytes",
        size: 8192,
        kept: false,
    },
    Site {
        function: "main.retain",
        bytes_field: "retain_bytes",
        size: 16384,
        kept: true,
    },
];

/// [alloc_objects, alloc_space, inuse_objects, inuse_space] of the samples
/// whose stack holds `function`.
fn values_of(samples: &[FlatSample], function: &str) -> [i64; 4] {
    let mut v = [0i64; 4];
    for s in samples.iter().filter(|s| s.has_function(function)) {
        for (i, x) in v.iter_mut().enumerate() {
            *x += s.values.get(i).copied().unwrap_or(0);
        }
    }
    v
}

fn off(ours: i64, theirs: i64) -> f64 {
    (ours as f64 / (theirs as f64).max(1.0) - 1.0).abs()
}

#[test]
fn go_heap_agrees_with_go_and_with_the_program() {
    require_root();
    let tmp = temp_dir();
    for GoBuild {
        what,
        tag,
        go,
        workload,
    } in go_builds(Workload::GoHeap, Workload::GoHeapStripped)
    {
        // The stripped build sets its own rate, found from its code.
        let rate = match workload {
            Workload::GoHeapStripped => SET_RATE,
            _ => DEFAULT_RATE,
        };
        let exe = workload.build_with_go(tmp.path(), &format!("heap_{tag}"), &go);
        check_run(&what, &exe, rate, &tmp.path().join(&tag), None);
    }
}

/// The optimizations' A/B: with `[debug] go_special_kinds = false` a
/// profiled object's free is seen at `mProf_Free` as well as at
/// `freeSpecial` (no kind read), one probe more per free, and with
/// `short_records = false` each allocation's record carries a 16 KiB
/// stack buffer although its frames were walked; the answer must be the
/// same, held against the same references.
#[test]
fn go_heap_is_the_same_without_its_optimizations() {
    require_root();
    let tmp = temp_dir();
    let config = tmp.path().join("kinds-off.toml");
    std::fs::write(
        &config,
        "[debug]\ngo_special_kinds = false\nshort_records = false\n",
    )
    .expect("config file");
    // One release: the paths switched are the same on both.
    for (version, go) in go_versions().into_iter().skip(1) {
        let what = format!("{version} optimizations off");
        let tag = what.replace([' ', '='], "_");
        let exe = Workload::GoHeap.build_with_go(tmp.path(), &format!("heap_{tag}"), &go);
        check_run(&what, &exe, SET_RATE, &tmp.path().join(&tag), Some(&config));
    }
}

fn check_run(what: &str, exe: &Path, rate: u64, dir: &Path, config: Option<&Path>) {
    std::fs::create_dir_all(dir).expect("run directory");
    let own = dir.join("own.pprof");
    let rate_arg = match rate {
        DEFAULT_RATE => "0".to_string(),
        set => set.to_string(),
    };
    let out = dir.join("out");
    let mut extra = vec!["--profiles", "heap"];
    if let Some(config) = config {
        extra.extend(["--config", config.to_str().expect("UTF-8 path")]);
    }
    let WholeLife {
        pid,
        report,
        daemon,
    } = profile_whole_life(
        exe,
        &["2", own.to_str().expect("UTF-8 path"), &rate_arg],
        &out,
        99,
        &extra,
    );
    let files = read_profiles(&out, "heap");
    let per_file: Vec<Vec<FlatSample>> = files
        .iter()
        .map(|f| {
            flatten(&f.profile)
                .into_iter()
                .filter(|s| s.pid() == pid)
                .collect()
        })
        .collect();
    let all: Vec<FlatSample> = flatten_all(&files)
        .into_iter()
        .filter(|s| s.pid() == pid)
        .collect();
    // In use: the window that closed while the program held its objects
    // (after its exit the address space, and so its live set, is gone).
    let held = per_file
        .iter()
        .max_by_key(|samples| values_of(samples, "main.retain")[3])
        .cloned()
        .unwrap_or_default();
    let theirs = flatten_file(&own);
    let diag = format!("\n{}\n{}", pprof_heap_tops(&files), daemon.describe());
    let go_samples = daemon.summary_field("go_heap_samples");
    assert!(
        go_samples > 0,
        "{what}: no allocation of the Go runtime recorded{diag}"
    );
    // The program's own rate was read, not Go's default assumed.
    assert_eq!(
        daemon.summary_field("go_rates_assumed"),
        0,
        "{what}: windows rescaled by an assumed MemProfileRate{diag}"
    );
    // Frees are told by the special record's kind unless that is off.
    let at_profile_free = daemon.summary_field("go_frees_at_profile_free");
    let lost = daemon.summary_field("heap_allocs_lost");
    println!(
        "{what}: {go_samples} allocations sampled by the Go runtime, {at_profile_free} frees seen at mProf_Free, {lost} allocation records lost"
    );
    // Frames-only records (on by default) keep the ring from filling at
    // some 20 000 samples a second; with the optimizations off some may
    // be lost, counted, within the tolerances below.
    assert!(
        config.is_some() || lost * 100 <= go_samples,
        "{what}: {lost} of {go_samples} allocation records lost (allowed 1%){diag}"
    );
    let short = daemon.summary_field("records_short_form");
    assert_eq!(
        (at_profile_free > 0, short > 0),
        (config.is_some(), config.is_none()),
        "{what}: {at_profile_free} frees seen at mProf_Free, {short} records in a short form{diag}"
    );
    for site in &SITES {
        let ours = values_of(&all, site.function);
        let ours_inuse = values_of(&held, site.function);
        let go = values_of(&theirs, site.function);
        let counted = field(&report, site.bytes_field);
        let objects = counted / site.size;
        let expected_samples = objects as f64 * (1.0 - (-(site.size as f64) / rate as f64).exp());
        let truth_tolerance = TRUTH_TOLERANCE.max(4.0 / expected_samples.max(1.0).sqrt());
        println!(
            "{what}: {}: alloc_space profilerd {} runtime/pprof {} counted {counted} ({:.0} samples expected); alloc_objects {} / {}; inuse_space {} / {}; inuse_objects {} / {}",
            site.function,
            ours[1],
            go[1],
            expected_samples,
            ours[0],
            go[0],
            ours_inuse[3],
            go[3],
            ours_inuse[2],
            go[2],
        );
        assert!(
            off(ours[1], go[1]) <= GO_TOLERANCE && off(ours[0], go[0]) <= GO_TOLERANCE,
            "{what}: {}: allocated {} bytes in {} objects, runtime/pprof {} in {} (allowed ±{GO_TOLERANCE}){diag}",
            site.function,
            ours[1],
            ours[0],
            go[1],
            go[0]
        );
        assert!(
            off(ours[1], counted as i64) <= truth_tolerance,
            "{what}: {}: allocated {} bytes, the program counted {counted} (allowed ±{truth_tolerance:.3}){diag}",
            site.function,
            ours[1]
        );
        if site.kept {
            assert!(
                off(ours_inuse[3], go[3]) <= GO_TOLERANCE
                    && off(ours_inuse[2], go[2]) <= GO_TOLERANCE,
                "{what}: {}: in use {} bytes in {} objects, runtime/pprof {} in {} (allowed ±{GO_TOLERANCE}){diag}",
                site.function,
                ours_inuse[3],
                ours_inuse[2],
                go[3],
                go[2]
            );
            assert!(
                off(ours_inuse[3], counted as i64) <= truth_tolerance,
                "{what}: {}: in use {} bytes, the program holds {counted} (allowed ±{truth_tolerance:.3}){diag}",
                site.function,
                ours_inuse[3]
            );
        } else {
            // Garbage: what is left in use is what the last collection
            // had not swept yet, a small part.
            assert!(
                ours_inuse[3] as f64 <= 0.05 * ours[1] as f64,
                "{what}: {}: {} bytes still in use of {} allocated, all of it garbage{diag}",
                site.function,
                ours_inuse[3],
                ours[1]
            );
        }
        // As Go's own profile shows it: the site is the leaf, the
        // runtime's allocator and profiler frames hidden.
        let at_leaf: i64 = all
            .iter()
            .filter(|s| {
                s.frames
                    .first()
                    .is_some_and(|f| f.function == site.function)
            })
            .map(|s| s.values[1])
            .sum();
        assert!(
            at_leaf as f64 >= 0.99 * ours[1] as f64,
            "{what}: {}: the leaf in {at_leaf} of its {} bytes (runtime frames not hidden?){diag}",
            site.function,
            ours[1]
        );
    }
}

/// The sites of go_alloc.go: function, report field of all its bytes, of
/// its bytes allocated while the rate was above 0, its objects' size.
const ALLOC_SITES: [(&str, &str, &str, u64); 2] = [
    ("main.allocKiB", "kib_bytes", "kib_sampled_bytes", 1024),
    (
        "main.allocQuarter",
        "quarter_bytes",
        "quarter_sampled_bytes",
        256 * 1024,
    ),
];

/// Runs go_alloc (built by `go`) for `seconds` at `rate` as the command
/// of a heap profile with `extra` options, one window only (the last,
/// built after the program exited), calling `meanwhile` with the metrics'
/// address once the daemon is ready: the program's report, the daemon,
/// and its samples with the profiles' comments.
fn run_go_alloc(
    dir: &Path,
    exe: &Path,
    (seconds, rate): (&str, u64),
    extra: &[&str],
    meanwhile: impl FnOnce(std::net::SocketAddr),
) -> (
    std::collections::BTreeMap<String, u64>,
    profiler_tests::daemon::Daemon,
    Vec<FlatSample>,
    Vec<String>,
) {
    let out = dir.join("out");
    let mut args = vec![
        "--profiles",
        "heap",
        "--interval",
        "60s",
        "--metrics-addr",
        "127.0.0.1:0",
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
    ];
    args.extend_from_slice(extra);
    let rate = rate.to_string();
    args.extend(["--", exe.to_str().expect("UTF-8 path"), seconds, &rate]);
    let mut daemon = profiler_tests::daemon::Daemon::start(&args);
    daemon.wait_ready();
    meanwhile(daemon.metrics_addr());
    daemon.wait_success(std::time::Duration::from_secs(30));
    let report = profiler_tests::workloads::parse_report(&daemon.stdout_text(), "pid");
    let files = read_profiles(&out, "heap");
    let comments = files
        .iter()
        .flat_map(|f| {
            f.profile
                .comment
                .iter()
                .map(|&i| f.profile.string_table[i as usize].clone())
        })
        .collect();
    (report, daemon, flatten_all(&files), comments)
}

/// Holds each site's allocated bytes against what the program counted in
/// `report`: all of them, or (`sampled_only`) those allocated while its
/// rate was above 0 (±15%, or 4 standard deviations of the samples
/// expected at `rate`).
fn check_alloc_sites(
    what: &str,
    samples: &[FlatSample],
    report: &std::collections::BTreeMap<String, u64>,
    sampled_only: bool,
    rate: u64,
    diag: &str,
) {
    for site in &ALLOC_SITES {
        let (function, size) = (site.0, site.3);
        let counted = field(report, if sampled_only { site.2 } else { site.1 });
        let ours = values_of(samples, function);
        let objects = counted / size;
        let expected = objects as f64 * (1.0 - (-(size as f64) / rate as f64).exp());
        let tolerance = TRUTH_TOLERANCE.max(4.0 / expected.max(1.0).sqrt());
        println!(
            "{what}: {function}: alloc_space {} against {counted} counted ({expected:.0} samples expected), alloc_objects {} against {objects}",
            ours[1], ours[0]
        );
        assert!(
            off(ours[1], counted as i64) <= tolerance && off(ours[0], objects as i64) <= tolerance,
            "{what}: {function}: allocated {} bytes in {} objects, the program counted {counted} in {objects} (allowed ±{tolerance:.3}){diag}",
            ours[1],
            ours[0]
        );
    }
}

/// A Go program's own `MemProfileRate` (here 64 KiB, where Go's default is
/// 512 KiB) holds for a window built after the program exited: it was
/// read while the program ran and kept. Before, the rate could no longer
/// be read then and Go's default was assumed: 8 times the bytes of the
/// 1 KiB objects.
#[test]
fn a_programs_own_rate_holds_after_it_exits() {
    require_root();
    let tmp = temp_dir();
    for (version, go) in go_versions() {
        let tag = version.replace(' ', "_");
        let exe = Workload::GoAlloc.build_with_go(tmp.path(), &format!("alloc_{tag}"), &go);
        let dir = tmp.path().join(format!("own-rate-{tag}"));
        let (report, daemon, samples, _) = run_go_alloc(&dir, &exe, ("2", 65_536), &[], |_| ());
        let samples: Vec<FlatSample> = samples
            .into_iter()
            .filter(|s| s.pid() == field(&report, "pid") as u32)
            .collect();
        let diag = format!("\n{}", daemon.describe());
        assert_eq!(field(&report, "rate_at_end"), 65_536, "{version}{diag}");
        assert_eq!(
            daemon.summary_field("go_rates_assumed"),
            0,
            "{version}: a window rescaled by an assumed rate{diag}"
        );
        check_alloc_sites(version, &samples, &report, false, 65_536, &diag);
    }
}

/// A Go program that links no profiler samples nothing (its linker set
/// `runtime.disableMemoryProfiling`): by default the daemon says so, once
/// in its log naming the process and why, in the exit summary, in
/// `/metrics` and in the heap profile's comments; asked to
/// (`--go-heap-sampling force`), it sets the program's rate to
/// `--heap-sample-bytes`, and the sites' bytes then agree with what the
/// program allocated from then on.
#[test]
fn a_go_heap_the_runtime_does_not_sample_is_never_silent() {
    require_root();
    let tmp = temp_dir();
    for (version, go) in go_versions() {
        let tag = version.replace(' ', "_");
        let exe = Workload::GoAlloc.build_with_go(tmp.path(), &format!("alloc_{tag}"), &go);
        // Reported.
        let dir = tmp.path().join(format!("report-{tag}"));
        // /metrics counts the process once it is checked (some 250 ms
        // after its start), while it runs.
        let mut unsampled = 0.0;
        let (report, daemon, samples, comments) = run_go_alloc(&dir, &exe, ("3", 0), &[], |addr| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while unsampled < 1.0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(100));
                let (status, _, body) = get(addr, "/metrics");
                assert_eq!(status, 200, "{body}");
                unsampled = parse_exposition(&body).value(
                    "profilerd_go_heap_processes_total",
                    &[("outcome", "unsampled")],
                );
            }
        });
        let pid = field(&report, "pid") as u32;
        let diag = format!("\n{}", daemon.describe());
        assert_eq!(
            field(&report, "rate_at_start"),
            0,
            "{version}: the program's runtime samples after all{diag}"
        );
        assert_eq!(
            daemon.summary_field("go_heaps_unsampled"),
            1,
            "{version}{diag}"
        );
        let said: Vec<String> = daemon
            .stderr_lines()
            .into_iter()
            .filter(|l| l.contains(&format!("pid {pid} (")) && l.contains("no Go heap profile"))
            .collect();
        assert_eq!(said.len(), 1, "{version}: logged {said:?}{diag}");
        assert!(
            said[0].contains("runtime.disableMemoryProfiling"),
            "{version}: the reason not given: {}",
            said[0]
        );
        assert!(
            samples.iter().all(|s| s.pid() != pid),
            "{version}: samples of a process that samples nothing{diag}"
        );
        assert_eq!(unsampled, 1.0, "{version}: not counted in /metrics{diag}");
        // The window built after the exit still names the process, with
        // why (`go tool pprof -comments`).
        assert!(
            comments.iter().any(
                |c| c.starts_with(&format!("pid {pid} (")) && c.contains("MemProfileRate is 0")
            ),
            "{version}: the profile does not say why: {comments:?}{diag}"
        );
        // Forced.
        let dir = tmp.path().join(format!("force-{tag}"));
        let (report, daemon, samples, _) = run_go_alloc(
            &dir,
            &exe,
            ("2", 0),
            &["--go-heap-sampling", "force"],
            |_| (),
        );
        let pid = field(&report, "pid") as u32;
        let diag = format!("\n{}", daemon.describe());
        let samples: Vec<FlatSample> = samples.into_iter().filter(|s| s.pid() == pid).collect();
        assert_eq!(
            daemon.summary_field("go_heaps_forced"),
            1,
            "{version}{diag}"
        );
        assert_eq!(
            daemon.summary_field("go_heaps_unsampled"),
            0,
            "{version}{diag}"
        );
        assert_eq!(
            field(&report, "rate_at_end"),
            DEFAULT_RATE,
            "{version}: the rate the daemon set{diag}"
        );
        // Set within a fraction of a second of the start.
        assert!(
            field(&report, "kib_sampled_bytes") * 10 >= field(&report, "kib_bytes") * 7,
            "{version}: the rate was set late: {report:?}{diag}"
        );
        check_alloc_sites(
            &format!("{version} forced"),
            &samples,
            &report,
            true,
            DEFAULT_RATE,
            &diag,
        );
    }
}
