//! What the session reports: losses as they happen, the metrics each
//! tick, BPF run-time stats, and the summary line at exit.

use std::sync::atomic::Ordering;

use profiler_common::counter;

use crate::bpf::drain::SAMPLES_AFTER_CAPTURE;
use crate::bpf::go_labels::GoLabelSets;
use crate::bpf::probes::Probes;
use crate::bpf::ring::WRAPPED_RECORDS;
use crate::config::{Settings, UnwindMode};
use crate::model::profile_kind::ProfileKind;
use crate::output::metrics::{Metrics, Observed};
use crate::procs::go_heap_rate::GoHeapRateStats;
use crate::procs::go_parked::FollowStats;
use crate::procs::go_runtime::GoExecutableStats;
use crate::procs::goroutines::GoroutineStats;
use crate::procs::process::ProcessTable;
use crate::profiles::cpu::{
    COUNTS_AHEAD_OF_IMAGE, LONG_RECORDS, SAMPLES_IMAGE_UNHEARD, SAMPLES_WAITED_FOR_IMAGE,
    SHORT_RECORDS,
};
use crate::profiles::heap::HeapTable;
use crate::profiles::waits::Waits;
use crate::stacks::budget::{Cache, MemoryBudget};
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::unwind::Unwinder;

/// Kernel-side losses already logged. Each kind is logged once, when it
/// first happens: a full map stays full under the same load, and a line per
/// window would flood the log. Later losses are counted in `/metrics` and in
/// the exit summary.
#[derive(Default)]
pub(crate) struct Losses {
    /// Bit i: counter i was logged.
    pub(crate) logged: u64,
}

impl Losses {
    pub(crate) fn report(&mut self, probes: &Probes) {
        let now = probes.counters();
        for (index, what) in LOSSES {
            let i = index as usize;
            if now[i] > 0 && self.logged & (1 << i) == 0 {
                self.logged |= 1 << i;
                tracing::warn!(target: "profilerd::session",
                    "{what}: {} so far (logged once; see the exit summary and /metrics)",
                    now[i]
                );
            }
        }
        tracing::debug!(target: "profilerd::session", samples = now[counter::SAMPLES as usize], "kernel counters");
    }
}

/// Every kernel loss counter and what its loss means, for the log.
pub(crate) const LOSSES: [(u32, &str); 14] = [
    (
        counter::ANCHORS_LOST,
        "image anchors dropped: process event ring half full",
    ),
    (counter::COUNTS_FULL, "samples dropped: count map full"),
    (
        counter::USER_STACK_LOST,
        "user stacks lost: stack map full or walk failed",
    ),
    (
        counter::KERNEL_STACK_LOST,
        "kernel stacks lost: stack map full or walk failed",
    ),
    (
        counter::PROC_EVENTS_LOST,
        "process events dropped: ring buffer full",
    ),
    (
        counter::TARGETS_FULL,
        "descendants not followed: target map full",
    ),
    (
        counter::STACK_SAMPLES_FULL,
        "stack copies dropped (frame-pointer stacks used instead): stack sample ring full",
    ),
    (
        counter::HEAP_ALLOCS_LOST,
        "sampled allocations dropped: heap event ring full",
    ),
    (
        counter::HEAP_FREES_LOST,
        "frees of sampled allocations dropped: heap event ring full",
    ),
    (
        counter::HEAP_LIVE_FULL,
        "sampled allocations not tracked as live: live map full",
    ),
    (
        counter::HEAP_THREADS_FULL,
        "heap sampling state lost: thread map full",
    ),
    (
        counter::WAIT_EVENTS_LOST,
        "wait events dropped: wait event ring full",
    ),
    (
        counter::FUTEX_CALLS_FULL,
        "futex calls not tracked: futex call map full",
    ),
    (
        counter::OFFCPU_PARKED_FULL,
        "blocked threads not tracked: off-CPU map full",
    ),
];

/// One line at exit with what was collected and every loss, so that a run
/// can be judged from its log.
/// The Go line of the exit summary: park probes put on a duty cycle
/// (`bpf::park_budget`) and the waits followed past their windows
/// (`procs::go_parked`), labels, allocations the Go runtime sampled,
/// goroutine parks the block profile left out, and goroutines read for
/// the goroutine profile; and new processes' executables read to tell
/// whether they are Go.
pub(crate) fn log_go_summary(
    probes: &Probes,
    go_labels: &GoLabelSets,
    goroutines: GoroutineStats,
    heap_rates: GoHeapRateStats,
    executables: GoExecutableStats,
    followed: FollowStats,
) {
    let c = probes.counters();
    let parks = probes.park_budget_stats();
    tracing::info!(target: "profilerd::session",
        go_park_links_cycled = parks.links_cycled,
        go_park_links_cycled_at_once = parks.most_cycled,
        go_park_windows = parks.windows,
        go_park_window_failures = parks.resume_failures,
        go_waits_outlasting_windows = c[counter::GO_WAITS_OUTLASTING_WINDOWS as usize],
        go_waits_followed = followed.followed,
        go_waits_followed_ended = followed.ended,
        go_waits_followed_at_once = followed.most,
        go_waits_not_followed = followed.not_followed,
        go_waits_followed_gone = followed.gone,
        go_park_reads_failed = parks.parks_unread,
        go_waits_past_half_window = crate::profiles::waits::GO_WAITS_PAST_HALF_WINDOW
            .load(std::sync::atomic::Ordering::Relaxed),
        go_labeled_samples = c[counter::GO_LABELED_SAMPLES as usize],
        go_labels_own_stack = c[counter::GO_LABELS_OWN_STACK as usize],
        go_label_map_cache_hits = c[counter::GO_LABEL_MAP_CACHE_HITS as usize],
        go_label_read_ns = c[counter::GO_LABEL_READ_NS as usize],
        go_label_reads = c[counter::GO_LABEL_READS as usize],
        go_heap_samples = c[counter::GO_HEAP_SAMPLES as usize],
        go_frees_at_profile_free = c[counter::GO_FREES_AT_PROFILE_FREE as usize],
        go_rates_assumed = heap_rates.rates_assumed,
        go_heaps_checked = heap_rates.checked,
        go_heaps_unsampled = heap_rates.unsampled,
        go_heaps_forced = heap_rates.forced,
        go_heaps_force_failed = heap_rates.force_failed,
        go_heap_checks_dropped = heap_rates.checks_dropped,
        go_parks_not_blocking = crate::profiles::waits::GO_PARKS_NOT_BLOCKING
            .load(std::sync::atomic::Ordering::Relaxed),
        go_releases_not_mutex = crate::profiles::waits::GO_RELEASES_NOT_MUTEX
            .load(std::sync::atomic::Ordering::Relaxed),
        go_runtime_futexes_skipped = c[counter::GO_RUNTIME_FUTEXES_SKIPPED as usize],
        go_runtime_futexes = crate::profiles::waits::GO_RUNTIME_FUTEXES
            .load(std::sync::atomic::Ordering::Relaxed),
        go_label_sets_full = c[counter::GO_LABEL_SETS_FULL as usize],
        go_label_sets_kept = go_labels.len(),
        go_label_sets_dropped = go_labels.dropped,
        go_label_sets_cut = go_labels.cut,
        go_label_sets_missing = go_labels.missing,
        goroutines_read = goroutines.read,
        goroutines_not_read = goroutines.not_read,
        goroutine_releases_unknown = goroutines.unknown_release,
        goroutine_lists_not_found = goroutines.no_goroutine_list,
        executables_read = executables.reads,
        executables_known_already = executables.hits,
        go_label_layouts_unknown = executables.labels_unknown,
        "go label summary"
    );
}

pub(crate) fn log_summary(
    probes: &mut Probes,
    unwinder: &Unwinder,
    symbolizer: &Symbolizer,
    procs: &ProcessTable,
    heap: &HeapTable,
    waits: &Waits,
    budget: &MemoryBudget,
) {
    if let Some(conds) = probes.cond_parks() {
        let a = conds.stats();
        tracing::info!(target: "profilerd::session",
            condition_links = a.links,
            condition_attach_failures = a.failures,
            mutex_orphan_delays = waits.mutex.orphan_delays,
            cond_words_cleared = waits.mutex.cond_words_cleared,
            "wait summary"
        );
    }
    if let Some(allocators) = probes.allocators() {
        let a = allocators.stats();
        let callers = probes.allocator_caller_stats();
        let c = probes.counters();
        tracing::info!(target: "profilerd::session",
            heap_samples = c[counter::HEAP_SAMPLES as usize],
            heap_nested_calls = c[counter::HEAP_NESTED_CALLS as usize],
            allocator_caller_processes = callers.processes,
            allocator_caller_ranges_cut = callers.ranges_cut,
            allocator_callers_full = callers.full,
            heap_allocs_lost = c[counter::HEAP_ALLOCS_LOST as usize],
            heap_frees_lost = c[counter::HEAP_FREES_LOST as usize],
            heap_live_full = c[counter::HEAP_LIVE_FULL as usize],
            heap_threads_full = c[counter::HEAP_THREADS_FULL as usize],
            heap_live = heap.live_count(),
            heap_unknown_frees = heap.unknown_frees,
            allocator_links = a.links,
            allocator_attach_failures = a.failures,
            allocator_probes_single_stepped = a.single_stepped,
            allocator_files_forgotten = a.files_forgotten,
            "heap summary"
        );
    }
    let c = probes.counters();
    let u = unwinder.stats();
    let s = symbolizer.stats();
    let p = procs.stats();
    let b = budget.stats();
    // name:bytes:evictions for each cache, one word for the log's readers.
    let caches: Vec<String> = Cache::ALL
        .iter()
        .enumerate()
        .map(|(i, cache)| format!("{}:{}:{}", cache.name(), b.bytes[i], b.evictions[i]))
        .collect();
    tracing::info!(target: "profilerd::session",
        samples = c[counter::SAMPLES as usize],
        stack_copies = c[counter::STACK_SAMPLES as usize],
        stack_copies_dropped = c[counter::STACK_SAMPLES_FULL as usize],
        count_map_full = c[counter::COUNTS_FULL as usize],
        user_stacks_lost = c[counter::USER_STACK_LOST as usize],
        kernel_stacks_lost = c[counter::KERNEL_STACK_LOST as usize],
        process_events_lost = c[counter::PROC_EVENTS_LOST as usize],
        wait_events_lost = c[counter::WAIT_EVENTS_LOST as usize],
        futex_calls_full = c[counter::FUTEX_CALLS_FULL as usize],
        offcpu_parked_full = c[counter::OFFCPU_PARKED_FULL as usize],
        offcpu_deep_full = c[counter::OFFCPU_DEEP_FULL as usize],
        unwinds = u.unwinds,
        unwinds_truncated = u.truncated,
        jit_frames_by_frame_pointer = u.jit_frames,
        leaves_by_frame_pointer = u.leaves_by_frame_pointer,
        unwinds_remembered = u.memo.hits + u.memo.matched_in_kernel,
        unwinds_matched_in_kernel = u.memo.matched_in_kernel,
        unwinds_matched_but_forgotten = u.memo.matched_but_forgotten,
        walk_memo_generations = u.memo.clears,
        stack_copy_count = c[counter::STACK_COPIES as usize],
        stack_copy_bytes = c[counter::STACK_BYTES_COPIED as usize],
        stack_tops_sent = u.tops.sent,
        records_short_form = SHORT_RECORDS.load(Ordering::Relaxed),
        records_long_form = LONG_RECORDS.load(Ordering::Relaxed),
        deep_threads_marked = u.tops.deep_marked,
        unwinds_cut_past_long_copy = u.tops.cut_past_long,
        samples_waited_for_image = SAMPLES_WAITED_FOR_IMAGE.load(Ordering::Relaxed),
        samples_image_unheard = SAMPLES_IMAGE_UNHEARD.load(Ordering::Relaxed),
        samples_after_capture = SAMPLES_AFTER_CAPTURE.load(Ordering::Relaxed),
        counts_ahead_of_image = COUNTS_AHEAD_OF_IMAGE.load(Ordering::Relaxed),
        ring_records_wrapped = WRAPPED_RECORDS.load(Ordering::Relaxed),
        stack_tops_taken_back = u.tops.taken_back,
        unwind_object_failures = u.object_load_failures,
        frames_unsymbolized = s.failures,
        frames_in_plt_stubs = s.plt_stubs,
        frames_named_by_go_pclntab = s.go_pclntab,
        go_leaf_callers_restored = s.go_leaf_callers,
        symbol_file_page_releases = s.file_page_releases,
        perf_map_frames = s.perf_map_frames,
        perf_map_bad_lines = s.perf_map_bad_lines,
        perf_maps_truncated = s.perf_maps_truncated,
        v8_interpreted_frames_unnamed = s.v8_interpreted_frames_unnamed,
        frames_without_covering_symbol = s.uncovered,
        process_snapshots = p.snapshots,
        process_snapshot_failures = p.failures,
        process_evictions = p.evictions,
        processes_inherited_from_parent = p.inherited,
        processes_anchored = p.anchored,
        anchor_files_unknown = p.anchor_files_unknown,
        anchors_lost = c[counter::ANCHORS_LOST as usize],
        brief_records = c[counter::BRIEF_RECORDS as usize],
        walk_hints_torn = c[counter::HINTS_TORN as usize],
        kernel_logs_dropped = c[counter::KERNEL_LOGS_DROPPED as usize],
        fork_record_evictions = p.fork_evictions,
        fork_records_unconfirmed = p.forks_unconfirmed,
        pids_read_as_threads = p.not_processes,
        processes = p.processes,
        open_handles = p.open_handles,
        handle_limit_hits = p.handle_limit_hits,
        uprobe_links_closed_inline = probes.links_closed_inline(),
        symbol_cache_evictions = s.cache_evictions,
        unwind_evictions = u.evictions,
        unwind_objects_too_large = u.objects_too_large,
        cache_budget_bytes = b.limit,
        cache_bytes = b.total_bytes(),
        cache_peak_bytes = b.peak,
        cache_evictions = b.total_evictions(),
        caches = %caches.join(","),
        bpf_map_bytes = crate::bpf::map_syscalls::map_memory()
            .iter()
            .map(|(_, bytes)| bytes)
            .sum::<u64>(),
        peak_resident_bytes = peak_resident_bytes(),
        profiles_unavailable = %match crate::bpf::check::skipped_names() {
            "" => "none",
            names => names,
        },
        "summary"
    );
    let py = symbolizer.python.stats;
    if py.processes > 0 {
        tracing::info!(target: "profilerd::session",
            python_processes = py.processes,
            python_samples = c[counter::PY_SAMPLES as usize],
            python_threads_unfound = c[counter::PY_THREADS_UNFOUND as usize],
            python_stacks_truncated = crate::profiles::samples::PYTHON_STACKS_TRUNCATED
                .load(Ordering::Relaxed),
            python_frames = py.frames,
            python_frames_unread = py.frames_unread,
            python_code_reads = py.code_reads,
            python_segments_unplaced = py.segments_unplaced,
            python_trampolines_folded = py.trampolines_folded,
            python_layouts_from_debug_offsets = py.layouts_from_debug_offsets,
            python_debug_offsets_rejected = py.debug_offsets_rejected,
            "python summary"
        );
    }
}

/// The daemon's peak resident set (VmHWM), in bytes; 0 if unknown.
fn peak_resident_bytes() -> u64 {
    procfs::process::Process::myself()
        .and_then(|me| me.status())
        .ok()
        .and_then(|status| status.vmhwm)
        .map_or(0, |kib| kib * 1024)
}

pub(crate) fn log_run_stats(probes: &Probes) {
    for (name, runs, time) in probes.run_stats() {
        if runs > 0 {
            tracing::info!(target: "profilerd::session",
                "bpf program {name}: {runs} runs, {:.0} ns per run",
                time.as_nanos() as f64 / runs as f64
            );
        }
    }
}

pub(crate) fn describe(settings: &Settings) -> String {
    let what = if !settings.command.is_empty() {
        let cmd: Vec<String> = settings
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        format!("command `{}` and its descendants", cmd.join(" "))
    } else if !settings.pids.is_empty() {
        let pids: Vec<String> = settings.pids.iter().map(u32::to_string).collect();
        format!("pid {}", pids.join(","))
    } else {
        "all processes".to_string()
    };
    let profiles: Vec<String> = settings
        .profiles
        .iter()
        .map(|k| match k {
            ProfileKind::Cpu => format!("cpu at {} Hz", settings.cpu_frequency),
            ProfileKind::Heap => format!("heap every {} bytes", settings.heap_sample_bytes),
            ProfileKind::Block | ProfileKind::Offcpu => format!(
                "{k} at rate {}",
                humantime::format_duration(settings.block_rate)
            ),
            ProfileKind::Mutex => format!("mutex 1 in {}", settings.mutex_fraction),
            ProfileKind::Goroutine => "goroutine".to_string(),
        })
        .collect();
    let unwind = match settings.unwind {
        UnwindMode::Auto => "auto (.eh_frame; frame pointers for Go)",
        UnwindMode::Fp => "frame pointers",
        UnwindMode::Dwarf => ".eh_frame",
    };
    format!(
        "profiling {what}: {}; user stacks by {unwind}, a profile every {}{}, into {}",
        profiles.join(", "),
        humantime::format_duration(settings.interval),
        settings
            .duration
            .map(|d| format!(" for {}", humantime::format_duration(d)))
            .unwrap_or_default(),
        settings.output_dir.display()
    )
}

/// Mirrors the session's counters into the metrics.
pub(crate) fn observe(
    metrics: &Metrics,
    probes: &mut Probes,
    unwinder: &Unwinder,
    symbolizer: &Symbolizer,
    procs: &ProcessTable,
    budget: &MemoryBudget,
    go_heaps: GoHeapRateStats,
) {
    let p = procs.stats();
    let b = budget.stats();
    metrics.observe(&Observed {
        caches: Cache::ALL
            .iter()
            .enumerate()
            .map(|(i, cache)| (cache.name(), b.bytes[i], b.evictions[i]))
            .collect(),
        cache_budget_bytes: b.limit,
        kernel: probes.counters().to_vec(),
        symbolization_failures: symbolizer.stats().failures,
        unwinds_truncated: unwinder.stats().truncated,
        attach_errors: probes.uprobe_links().map(|l| l.stats().failures).sum(),
        processes: p.processes as u64,
        process_snapshots: p.snapshots,
        process_snapshot_failures: p.failures,
        go_heaps,
    });
}
