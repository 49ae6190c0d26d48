//! A window of samples and its close: symbolizes, builds and publishes the
//! profile of every enabled type.

use std::time::{Instant, SystemTime};

use crate::bpf::drain::CpuWindow;
use crate::config::Settings;
use crate::model::profile_kind::ProfileKind;
use crate::output::publish::Publisher;
use crate::procs::goroutines::GoroutineReader;
use crate::procs::process::ProcessTable;
use crate::profiles::cpu::build_cpu_profile;
use crate::profiles::goroutine::build_goroutine_profile;
use crate::profiles::heap::{HeapTable, build_heap_profile};
use crate::profiles::waits::{Waits, build_wait_profile};
use crate::stacks::symbolize::Symbolizer;

/// One window: its start time and what it collected.
pub(crate) struct Window {
    pub(crate) start: SystemTime,
    pub(crate) started: Instant,
    pub(crate) cpu: CpuWindow,
}

impl Window {
    pub(crate) fn new() -> Self {
        Window {
            start: SystemTime::now(),
            started: Instant::now(),
            cpu: CpuWindow::default(),
        }
    }
}

/// What the profiles other than CPU draw on at a window's close.
pub(crate) struct Sources<'a> {
    pub(crate) heap: &'a mut HeapTable,
    pub(crate) waits: &'a mut Waits,
    pub(crate) goroutines: &'a mut GoroutineReader,
    /// The processes whose goroutines are read.
    pub(crate) goroutine_pids: &'a [u32],
}

/// Symbolizes, builds and writes every enabled profile of a closed window.
pub(crate) fn write_window(
    settings: &Settings,
    publisher: &Publisher,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    sources: Sources<'_>,
    window: &mut Window,
) {
    let Sources {
        heap,
        waits,
        goroutines,
        goroutine_pids,
    } = sources;
    let duration = window.started.elapsed();
    let time_nanos = window
        .start
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    // Processes whose park probes were on a duty cycle: said in the
    // comments of both wait profiles their goroutines' waits are in.
    let budget_notes = waits.park_windows.take_notes();
    for &kind in &settings.profiles {
        let began = Instant::now();
        let profile = match kind {
            ProfileKind::Cpu => build_cpu_profile(
                settings,
                symbolizer,
                procs,
                &mut window.cpu,
                settings.cpu_frequency,
                (time_nanos, duration.as_nanos() as i64),
            ),
            ProfileKind::Heap => build_heap_profile(
                settings,
                symbolizer,
                procs,
                heap,
                time_nanos,
                duration.as_nanos() as i64,
            ),
            ProfileKind::Goroutine => build_goroutine_profile(
                settings,
                symbolizer,
                procs,
                goroutines,
                goroutine_pids,
                time_nanos,
                duration.as_nanos() as i64,
            ),
            ProfileKind::Block | ProfileKind::Mutex | ProfileKind::Offcpu => {
                let rows = match kind {
                    ProfileKind::Block => waits.block.close(),
                    ProfileKind::Offcpu => waits.offcpu.close(),
                    _ => waits.mutex.close(),
                };
                let mut profile = build_wait_profile(
                    kind,
                    settings,
                    symbolizer,
                    procs,
                    &mut window.cpu.go_labels,
                    &rows,
                    time_nanos,
                    duration.as_nanos() as i64,
                );
                if kind != ProfileKind::Offcpu {
                    for note in &budget_notes {
                        profile.comment.push(profile.string_table.len() as i64);
                        profile.string_table.push(note.clone());
                    }
                }
                profile
            }
        };
        let built = began.elapsed();
        // A failure is logged by the publisher, once per window.
        if let Ok(path) = publisher.publish(kind, window.start, &profile) {
            tracing::info!(target: "profilerd::session",
                "wrote {} ({} samples, built in {:.1} ms, written in {:.1} ms)",
                path.display(),
                profile.sample.len(),
                built.as_secs_f64() * 1e3,
                (began.elapsed() - built).as_secs_f64() * 1e3,
            );
        }
    }
    procs.prune();
    symbolizer.release_unused();
    symbolizer.release_file_pages();
    crate::model::own_heap::release_free_memory();
}
