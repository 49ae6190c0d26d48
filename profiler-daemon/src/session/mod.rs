//! The schedule: starts the probes (and the command, if any), drains the
//! kernel buffers every second, closes a window every `--interval` (and at
//! exit) by symbolizing, building and writing its profiles, and decides when
//! to stop.

mod events;
pub mod notify;
mod summary;
mod targets;
mod window;

use crate::config::Settings;
use crate::kernel::check::probe_config;
use crate::kernel::check::settle_profiles;
use crate::kernel::features::KernelFeatures;
use crate::kernel::probes::Probes;
use crate::output::publish::start_outputs;
use crate::output::push::SHUTDOWN_GRACE;
use crate::output::retention::Retention;
use crate::output::writer::ProfileWriter;
use crate::procs::process::ProcessTable;
use crate::profiles::cpu::drain_once;
use crate::profiles::cpu::read_stack_samples;
use crate::profiles::heap::HeapTable;
use crate::profiles::heap::read_heap_events;
use crate::profiles::waits::Waits;
use crate::profiles::waits::read_wait_events;
use crate::session::events::take_proc_events;
use crate::session::summary::Losses;
use crate::session::summary::describe;
use crate::session::summary::log_run_stats;
use crate::session::summary::log_summary;
use crate::session::summary::observe;
use crate::session::targets::all_pids;
use crate::session::targets::check_privileges;
use crate::session::targets::kernel_log_readable;
use crate::session::targets::process_start;
use crate::session::targets::sleep_opt;
use crate::session::targets::start_command;
use crate::session::targets::wait_child;
use crate::session::targets::watch_ring;
use crate::session::window::Window;
use crate::session::window::write_window;
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::unwind::Unwinder;
use anyhow::Context as _;
use anyhow::Result;
use std::collections::HashMap;
use std::time::Duration;
use std::time::Instant;
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::SignalKind;
use tokio::signal::unix::signal;

/// How often the kernel buffers are drained. Short enough that the count
/// and stack maps (16k entries each) stay far from full and the stack-copy
/// ring (about 470 samples) does not overflow at common rates, long enough
/// that draining costs little.
const DRAIN_PERIOD: Duration = Duration::from_secs(1);
/// Bound on process metadata kept at once.
pub(crate) const MAX_PROCESSES: usize = 16_384;

/// Why the session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Signal(&'static str),
    Duration,
    TargetsGone,
    CommandExited,
}

/// Runs the profiler until a stop condition, writing every window.
pub async fn run(mut settings: Settings) -> Result<()> {
    check_privileges()?;
    let features = KernelFeatures::probe(crate::kernel::probes::tracefs_dir()?);
    let skipped = settle_profiles(&mut settings, &features)?;
    let writer = ProfileWriter::open(&settings.output_dir)?;
    let stale = writer.remove_stale_temp_files();
    if stale > 0 {
        tracing::info!("removed {stale} temporary file(s) of a writer that died mid-write");
    }
    let mut retention = settings
        .retention
        .map(|age| Retention::new(writer.dir(), age));
    retention.as_mut().map(Retention::run);
    let mut publisher = start_outputs(&settings, writer).await?;
    for (kind, _) in &skipped {
        publisher.metrics().profile_unavailable(*kind);
    }
    let mut symbolizer = Symbolizer::new().context("preparing the symbolizer")?;
    let mut procs = ProcessTable::new(MAX_PROCESSES);

    let command_mode = !settings.command.is_empty();
    let mut probes = Probes::load(&probe_config(&settings, &features, &settings.profiles))?;
    let mut unwinder = Unwinder::new();
    let switches = settings.stack_switches;
    unwinder.set_stack_options(
        settings.limits.walk_memo_entries as usize,
        switches.walk_hints,
        switches.stack_tops,
    );
    for &pid in &settings.pids {
        probes.add_target(pid)?;
        procs.ensure(pid);
    }
    let system_wide = settings.pids.is_empty() && !command_mode;
    let every_pid = match system_wide {
        true => all_pids(),
        false => Vec::new(),
    };
    for links in probes.uprobe_links() {
        // System-wide: every file to probe that is mapped now; later ones
        // as processes exec.
        for &pid in every_pid.iter().chain(&settings.pids) {
            links.attach_process(pid);
        }
    }
    let mut events = watch_ring(probes.take_proc_events(), "process events")?;
    let mut stack_samples = watch_ring(probes.take_stack_samples(), "stack samples")?;
    let mut heap_events = watch_ring(probes.take_heap_events(), "heap events")?;
    let mut heap = HeapTable::default();
    let mut wait_events = watch_ring(probes.take_wait_events(), "wait events")?;
    let mut waits = Waits::new(&settings, probes.take_walk_hints());
    let mut kernel_log = match probes.take_kernel_log() {
        // SAFETY: the reader owns the ring's fd for as long as the AsyncFd
        // owns the reader, and always reports that same fd.
        Some(log) => Some(
            unsafe { AsyncFd::register(log) }
                .map_err(|e| e.into_parts().1)
                .context("watching the kernel's log ring")?,
        ),
        None => None,
    };
    // Processes that exec'd: their mappings are complete only once the
    // dynamic loader has run, so they are looked at again a tick later.
    let mut exec_rescan: Vec<u32> = Vec::new();

    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;

    tracing::info!("{}", describe(&settings));
    let mut child = match command_mode {
        true => Some(start_command(&settings.command, &mut probes, &mut procs)?),
        false => None,
    };
    match crate::kernel::check::skipped_names() {
        "" => tracing::info!("ready: every probe is attached"),
        skipped => tracing::info!(
            "ready: every probe is attached (skipped at best effort on this kernel: {skipped})"
        ),
    }
    if let Err(e) = crate::session::notify::notify("READY=1") {
        tracing::warn!("could not notify the service manager: {e}");
    }

    let started = Instant::now();
    let deadline = settings.duration.map(|d| started + d);
    let mut window = Window::new();
    let mut drain_tick =
        tokio::time::interval_at(tokio::time::Instant::now() + DRAIN_PERIOD, DRAIN_PERIOD);
    let mut window_end = tokio::time::Instant::now() + settings.interval;
    // Each target with its start time: a new process that reuses the pid of
    // an exited target is not that target.
    let mut live_targets: HashMap<u32, Option<u64>> = settings
        .pids
        .iter()
        .map(|&pid| (pid, process_start(pid)))
        .collect();
    let mut reported = Losses::default();

    let stop = loop {
        let until_deadline = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        tokio::select! {
            _ = sigterm.recv() => break Stop::Signal("SIGTERM"),
            _ = sigint.recv() => break Stop::Signal("SIGINT"),
            _ = sleep_opt(until_deadline) => break Stop::Duration,
            status = wait_child(&mut child) => {
                match status {
                    Ok(status) => tracing::info!("command exited: {status}"),
                    Err(e) => tracing::warn!("waiting for the command failed: {e}"),
                }
                child = None;
                break Stop::CommandExited;
            }
            // Process events are read before any record of a process, so
            // that every record read finds the execs that came before it
            // (records carry their time; see ProcessTable::generation_at).
            guard = events.readable_mut() => {
                let mut guard = guard.context("waiting for process events")?;
                take_proc_events(guard.get_inner_mut(), &mut procs, &mut probes, &mut heap, &mut exec_rescan, settings.unwind);
                guard.clear_ready();
            }
            guard = wait_events.readable_mut() => {
                let mut guard = guard.context("waiting for wait events")?;
                take_proc_events(events.get_mut(), &mut procs, &mut probes, &mut heap, &mut exec_rescan, settings.unwind);
                read_wait_events(guard.get_inner_mut(), &mut procs, &mut unwinder, &mut waits);
                guard.clear_ready();
            }
            guard = heap_events.readable_mut() => {
                let mut guard = guard.context("waiting for heap events")?;
                take_proc_events(events.get_mut(), &mut procs, &mut probes, &mut heap, &mut exec_rescan, settings.unwind);
                read_heap_events(guard.get_inner_mut(), &mut procs, &mut probes, &mut unwinder, &mut heap);
                guard.clear_ready();
            }
            guard = stack_samples.readable_mut() => {
                let mut guard = guard.context("waiting for stack samples")?;
                take_proc_events(events.get_mut(), &mut procs, &mut probes, &mut heap, &mut exec_rescan, settings.unwind);
                read_stack_samples(guard.get_inner_mut(), &mut procs, &mut unwinder, &mut window.cpu);
                guard.clear_ready();
            }
            guard = kernel_log_readable(&mut kernel_log) => {
                let mut guard = guard.context("waiting for the kernel's log")?;
                guard.get_inner_mut().read();
                guard.clear_ready();
            }
            _ = drain_tick.tick() => {
                take_proc_events(events.get_mut(), &mut procs, &mut probes, &mut heap, &mut exec_rescan, settings.unwind);
                drain_once(&mut probes, &procs, &mut window.cpu).await;
                // The kernel wakes us for stack samples only when their ring
                // fills up; collect the rest here.
                read_stack_samples(stack_samples.get_mut(), &mut procs, &mut unwinder, &mut window.cpu);
                read_heap_events(heap_events.get_mut(), &mut procs, &mut probes, &mut unwinder, &mut heap);
                read_wait_events(wait_events.get_mut(), &mut procs, &mut unwinder, &mut waits);
                probes.update_stack_tops(&unwinder.take_stack_tops());
                for pid in exec_rescan.drain(..) {
                    for links in probes.uprobe_links() {
                        links.attach_process(pid);
                    }
                }
                procs.settle();
                observe(&publisher.metrics, &mut probes, &unwinder, &symbolizer, &procs);
                if !live_targets.is_empty() {
                    live_targets.retain(|&pid, start| start.is_some() && process_start(pid) == *start);
                    for pid in settings.pids.iter().filter(|p| !live_targets.contains_key(p)) {
                        probes.remove_target(*pid);
                    }
                    if live_targets.is_empty() {
                        break Stop::TargetsGone;
                    }
                }
            }
            _ = tokio::time::sleep_until(window_end) => {
                window_end += settings.interval;
                take_proc_events(events.get_mut(), &mut procs, &mut probes, &mut heap, &mut exec_rescan, settings.unwind);
                drain_once(&mut probes, &procs, &mut window.cpu).await;
                read_stack_samples(stack_samples.get_mut(), &mut procs, &mut unwinder, &mut window.cpu);
                read_heap_events(heap_events.get_mut(), &mut procs, &mut probes, &mut unwinder, &mut heap);
                read_wait_events(wait_events.get_mut(), &mut procs, &mut unwinder, &mut waits);
                let closed = std::mem::replace(&mut window, Window::new());
                write_window(&settings, &publisher, &mut symbolizer, &mut procs, &mut heap, &mut waits, closed);
                retention.as_mut().map(Retention::run);
                unwinder.release_unused();
                reported.report(&probes);
            }
        }
    };

    // Stop sampling first so that the last window is complete and closed.
    log_run_stats(&probes);
    probes.stop_sampling();
    tracing::info!("stopping ({stop:?}): writing the last window");
    take_proc_events(
        events.get_mut(),
        &mut procs,
        &mut probes,
        &mut heap,
        &mut exec_rescan,
        settings.unwind,
    );
    read_heap_events(
        heap_events.get_mut(),
        &mut procs,
        &mut probes,
        &mut unwinder,
        &mut heap,
    );
    read_wait_events(wait_events.get_mut(), &mut procs, &mut unwinder, &mut waits);
    drain_once(&mut probes, &procs, &mut window.cpu).await;
    read_stack_samples(
        stack_samples.get_mut(),
        &mut procs,
        &mut unwinder,
        &mut window.cpu,
    );
    // The active buffer may hold samples written during the grace period.
    drain_once(&mut probes, &procs, &mut window.cpu).await;
    write_window(
        &settings,
        &publisher,
        &mut symbolizer,
        &mut procs,
        &mut heap,
        &mut waits,
        window,
    );
    if let Some(r) = retention.as_mut() {
        r.run();
        r.log_totals();
    }
    reported.report(&probes);
    if let Some(log) = kernel_log.as_mut() {
        log.get_mut().read();
    }
    log_summary(&mut probes, &unwinder, &symbolizer, &procs, &heap, &waits);
    observe(
        &publisher.metrics,
        &mut probes,
        &unwinder,
        &symbolizer,
        &procs,
    );
    if let Some(pusher) = publisher.pusher.take() {
        tracing::info!("{}", pusher.finish(SHUTDOWN_GRACE).await.summary());
    }
    if let Some(mut child) = child {
        // We started it; on our own stop (signal or duration) leave it be as
        // perf does, but reap it if it already finished.
        let _ = child.try_wait();
    }
    Ok(())
}
