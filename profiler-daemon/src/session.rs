//! The schedule: starts the probes (and the command, if any), drains the
//! kernel buffers every second, closes a window every `--interval` (and at
//! exit) by symbolizing, building and writing its profiles, and decides when
//! to stop.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use aya::Pod;
use aya::maps::{HashMap as AyaHashMap, MapData, RingBuf};
use profiler_common::{
    BRIEF_FRAMES_OFFSET, HeapAlloc, HeapFree, ImageAnchors, MAX_STACK_DEPTH, MutexDelay,
    OFFCPU_KERNEL_DEPTH, OFFCPU_STACK_BYTES, OffcpuRecord, ProcEvent, SHORT_STACK_BYTES,
    STACK_COPY_BYTES, StackSample, WALK_HINT_WORDS, WaitBrief, WaitHead, WaitStack, WalkHint,
    WalkHintKey, counter, heap_event, proc_event, wait_event, wait_flags,
};
use tokio::io::unix::{AsyncFd, AsyncFdReadyMutGuard};
use tokio::signal::unix::{SignalKind, signal};

use crate::allocators::{PreExecLinks, resolve_program};
use crate::config::{Settings, UnwindMode};
use crate::drain::{CpuWindow, SampleId, Stack};
use crate::frames::{Frame, Line};
use crate::heap::HeapTable;
use crate::kernel_check::{probe_config, settle_profiles};
use crate::kernel_features::KernelFeatures;
use crate::kernel_log::KernelLog;
use crate::metrics::{Metrics, Observed};
use crate::pprof::ProfileBuilder;
use crate::probes::Probes;
use crate::process::ProcessTable;
use crate::profile_kind::ProfileKind;
use crate::publish::Publisher;
use crate::push::queue::finish_all;
use crate::push::{Pusher, SHUTDOWN_GRACE};
use crate::retention::Retention;
use crate::symbolize::Symbolizer;
use crate::unwind::{Matched, Unwinder, UnwoundStack};
use crate::waits::{BlockWindow, MutexTable, Weight};
use crate::writer::ProfileWriter;

/// How often the kernel buffers are drained. Short enough that the count
/// and stack maps (16k entries each) stay far from full and the stack-copy
/// ring (about 470 samples) does not overflow at common rates, long enough
/// that draining costs little.
const DRAIN_PERIOD: Duration = Duration::from_secs(1);
/// How long a program that read the old buffer index may still be writing.
const FLIP_GRACE: Duration = Duration::from_millis(2);
/// Bound on process metadata kept at once.
const MAX_PROCESSES: usize = 16_384;

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
    let features = KernelFeatures::probe(crate::probes::tracefs_dir()?);
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
    match crate::kernel_check::skipped_names() {
        "" => tracing::info!("ready: every probe is attached"),
        skipped => tracing::info!(
            "ready: every probe is attached (skipped at best effort on this kernel: {skipped})"
        ),
    }
    if let Err(e) = crate::notify::notify("READY=1") {
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
    let sinks = std::mem::take(&mut publisher.sinks);
    if !sinks.is_empty() {
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        for stats in finish_all(sinks, deadline).await {
            tracing::info!("{}", stats.summary());
        }
    }
    if let Some(mut child) = child {
        // We started it; on our own stop (signal or duration) leave it be as
        // perf does, but reap it if it already finished.
        let _ = child.try_wait();
    }
    Ok(())
}

/// One window: its start time and what it collected.
struct Window {
    start: SystemTime,
    started: Instant,
    cpu: CpuWindow,
}

impl Window {
    fn new() -> Self {
        Window {
            start: SystemTime::now(),
            started: Instant::now(),
            cpu: CpuWindow::default(),
        }
    }
}

/// Waits until the kernel's log ring has records; forever when the kernel
/// does not log.
async fn kernel_log_readable(
    log: &mut Option<AsyncFd<KernelLog>>,
) -> std::io::Result<AsyncFdReadyMutGuard<'_, KernelLog>> {
    match log {
        Some(log) => log.readable_mut().await,
        None => std::future::pending().await,
    }
}

/// Registers a ring buffer with the runtime so that its data wakes us.
fn watch_ring(ring: Option<RingBuf<MapData>>, what: &str) -> Result<AsyncFd<RingBuf<MapData>>> {
    let ring = ring.with_context(|| format!("the {what} ring buffer was already taken"))?;
    // SAFETY: the ring buffer owns its map fd for as long as the AsyncFd
    // owns the ring buffer, and always reports that same fd.
    unsafe { AsyncFd::register(ring) }
        .map_err(|e| e.into_parts().1)
        .with_context(|| format!("watching the {what} ring buffer"))
}

async fn drain_once(probes: &mut Probes, procs: &ProcessTable, cpu: &mut CpuWindow) {
    let buffer = match probes.flip() {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!("cannot switch sample buffers: {e}");
            return;
        }
    };
    tokio::time::sleep(FLIP_GRACE).await;
    match probes.drain(buffer) {
        Ok(drained) => cpu.absorb(drained, |tgid, since| match since {
            0 => procs.generation(tgid),
            since => procs.generation_at(tgid, since),
        }),
        Err(e) => tracing::warn!("{e}"),
    }
}

/// Reads and applies the process events, new images under known pids (an
/// exec, or a new process reusing the pid of one that exited) last, once
/// the batch has said which of them exited already. Every record of a
/// process carries the kernel time it was taken (ring records) or the
/// start of the image it ran (aggregated CPU counts), and is given the
/// image that ran then, whenever it is read.
fn take_proc_events(
    ring: &mut RingBuf<MapData>,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    heap: &mut HeapTable,
    exec_rescan: &mut Vec<u32>,
    unwind: UnwindMode,
) {
    let mut new_images: Vec<NewImage> = Vec::new();
    let mut anchors: Vec<ImageAnchors> = Vec::new();
    while let Some(item) = ring.next() {
        let Some(event) = read_record::<ProcEvent>(&item) else {
            continue;
        };
        match event.kind {
            proc_event::ANCHORS => {
                if let Some(record) = read_record::<ImageAnchors>(&item)
                    && anchors.len() < MAX_PROCESSES
                {
                    anchors.push(record);
                }
            }
            proc_event::NEW | proc_event::EXEC => {
                let known = procs.peek(event.tgid);
                let replaces = match event.kind {
                    proc_event::EXEC => known.is_some(),
                    _ => known.is_some_and(|info| info.is_exited()),
                };
                if replaces {
                    if new_images.len() < MAX_PROCESSES {
                        new_images.push(NewImage {
                            event,
                            exited: false,
                        });
                    }
                    continue;
                }
                new_image(event, procs, probes, exec_rescan, unwind);
            }
            proc_event::FORK => {
                // The child maps what its parent maps now: a new image of
                // the parent waiting in this batch comes first.
                if new_images.iter().any(|i| i.event.tgid == event.parent) {
                    let images = std::mem::take(&mut new_images);
                    apply_new_images(images, procs, probes, heap, exec_rescan, unwind);
                }
                procs.note_fork(event.tgid, event.parent);
            }
            proc_event::FORGET_FORK => procs.forget_fork(event.tgid),
            proc_event::EXIT => {
                // A new image that exited already: not to be probed or read.
                for image in new_images.iter_mut().filter(|i| i.event.tgid == event.tgid) {
                    image.exited = true;
                }
                procs.mark_exited(event.tgid);
                let gone = heap.forget_process(event.tgid);
                probes.forget_live(event.tgid, &gone);
                for links in probes.uprobe_links() {
                    links.forget_process(event.tgid);
                }
                if unwind == UnwindMode::Auto {
                    probes.unmark_frame_pointer_process(event.tgid);
                }
            }
            _ => {}
        }
    }
    apply_new_images(new_images, procs, probes, heap, exec_rescan, unwind);
    // After the images they name are known.
    for record in &anchors {
        procs.anchor_image(record);
    }
}

/// Applies new images under known pids (see [`take_proc_events`]): the
/// old image's snapshot is kept for its samples, and its live heap set is
/// forgotten, as at an exit (its address space is gone).
/// A new image under a known pid, waiting for the samples of the old one
/// to be read.
struct NewImage {
    event: ProcEvent,
    /// Its exit came in the same batch of events.
    exited: bool,
}

fn apply_new_images(
    images: Vec<NewImage>,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    heap: &mut HeapTable,
    exec_rescan: &mut Vec<u32>,
    unwind: UnwindMode,
) {
    for NewImage { event, exited } in images {
        let gone = heap.forget_process(event.tgid);
        probes.forget_live(event.tgid, &gone);
        procs.retire(event.tgid, event.time_ns);
        if !exited {
            new_image(event, procs, probes, exec_rescan, unwind);
        }
    }
}

/// A process seen for the first time, or a new image under its pid.
fn new_image(
    event: ProcEvent,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    exec_rescan: &mut Vec<u32>,
    unwind: UnwindMode,
) {
    if probes.uprobe_links().next().is_some() {
        // A followed fork reports threads too; they share their process's
        // probes.
        if event.kind == proc_event::NEW && !is_process(event.tgid) {
            return;
        }
        for links in probes.uprobe_links() {
            links.attach_process(event.tgid);
        }
        if event.kind == proc_event::EXEC && exec_rescan.len() < MAX_PROCESSES {
            exec_rescan.push(event.tgid);
        }
    }
    if event.kind == proc_event::EXEC {
        procs.forget_fork(event.tgid);
    }
    procs.snapshot(event.tgid);
    // Go keeps frame pointers and has no .eh_frame: in auto mode the
    // kernel walks its stacks.
    if unwind == UnwindMode::Auto && crate::process::is_go_executable(event.tgid) {
        probes.mark_frame_pointer_process(event.tgid);
    }
}

/// A ring-buffer record as `T`, borrowed in place: None when the record is
/// too short or misaligned (ring buffer records are 8-byte aligned; check
/// rather than trust).
fn record<T: Pod>(item: &[u8]) -> Option<&T> {
    if item.len() < std::mem::size_of::<T>()
        || item.as_ptr().align_offset(std::mem::align_of::<T>()) != 0
    {
        return None;
    }
    // SAFETY: size and alignment checked; T is plain data.
    Some(unsafe { &*item.as_ptr().cast::<T>() })
}

/// A small ring-buffer record copied out as `T`, at any alignment; None
/// when the record is too short.
fn read_record<T: Pod>(item: &[u8]) -> Option<T> {
    if item.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: size checked; T is plain data, valid for any bytes.
    Some(unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) })
}

/// The frames of a brief wait record, which is as long as its room for
/// them (`BRIEF_FRAME_CLASSES`); None when the record is shorter than
/// the frames it says it holds, or holds more than a walk hint has.
fn brief_frames(item: &[u8]) -> Option<&[u64]> {
    let len = read_record::<u64>(item.get(std::mem::offset_of!(WaitBrief, frames_len)..)?)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&n| n <= WALK_HINT_WORDS)?;
    let bytes = item.get(BRIEF_FRAMES_OFFSET..BRIEF_FRAMES_OFFSET + len * 8)?;
    if bytes.as_ptr().align_offset(std::mem::align_of::<u64>()) != 0 {
        return None;
    }
    // SAFETY: length and alignment checked; any bytes are valid u64s.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<u64>(), len) })
}

/// The kernel frames a record holds, if any.
fn kernel_stack(frames: &[u64]) -> Stack {
    match frames {
        [] => Stack::None,
        _ => Stack::Frames(Arc::from(frames)),
    }
}

/// CPU samples and sampled allocations received in the short record form
/// (for the exit summary).
static SHORT_RECORDS: AtomicU64 = AtomicU64::new(0);

/// Unwinds every sample that came with a copy of its user stack and adds it
/// to the window.
fn read_stack_samples(
    ring: &mut RingBuf<MapData>,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    cpu: &mut CpuWindow,
) {
    while let Some(item) = ring.next() {
        // Two record forms, told apart by their length (the short one
        // when the thread's stack is known to fit).
        if let Some(sample) = record::<StackSample>(&item) {
            add_stack_sample(sample, procs, unwinder, cpu);
        } else if let Some(sample) = record::<StackSample<SHORT_STACK_BYTES>>(&item) {
            SHORT_RECORDS.fetch_add(1, Ordering::Relaxed);
            add_stack_sample(sample, procs, unwinder, cpu);
        }
    }
}

fn add_stack_sample<const N: usize>(
    sample: &StackSample<N>,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    cpu: &mut CpuWindow,
) {
    procs.ensure(sample.tgid);
    let generation = procs.generation_at(sample.tgid, sample.time_ns);
    let stack_len = (sample.stack_len as usize).min(N);
    let user = match procs.get_image(sample.tgid, generation) {
        Some(info) => {
            let (unwound, _) = unwinder.unwind_hinted(
                info,
                sample.tid,
                sample.ip,
                sample.sp,
                sample.bp,
                &sample.stack[..stack_len],
            );
            if unwound.truncated {
                Stack::Truncated(unwound.frames)
            } else {
                Stack::Frames(unwound.frames)
            }
        }
        None => Stack::Truncated(Arc::from(vec![sample.ip])),
    };
    let kernel = kernel_stack(&sample.kernel[..(sample.kernel_len as usize).min(MAX_STACK_DEPTH)]);
    cpu.add(SampleId {
        tgid: sample.tgid,
        generation,
        tid: sample.tid,
        thread: sample.comm,
        user,
        kernel,
        object: 0,
        cond: 0,
    });
}

/// Adds the sampled allocations and frees that the heap probes reported.
fn read_heap_events(
    ring: &mut RingBuf<MapData>,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    unwinder: &mut Unwinder,
    heap: &mut HeapTable,
) {
    while let Some(item) = ring.next() {
        // Every heap event starts with its kind.
        match read_record::<u32>(&item) {
            Some(heap_event::FREE) => {
                if let Some(free) = read_record::<HeapFree>(&item) {
                    heap.freed(free.tgid, free.addr);
                }
                continue;
            }
            Some(heap_event::ALLOC) => {}
            _ => continue,
        }
        // Two record forms, told apart by their length.
        if let Some(alloc) = record::<HeapAlloc>(&item) {
            add_heap_alloc(alloc, procs, probes, unwinder, heap);
        } else if let Some(alloc) = record::<HeapAlloc<SHORT_STACK_BYTES>>(&item) {
            SHORT_RECORDS.fetch_add(1, Ordering::Relaxed);
            add_heap_alloc(alloc, procs, probes, unwinder, heap);
        }
    }
}

fn add_heap_alloc<const N: usize>(
    alloc: &HeapAlloc<N>,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    unwinder: &mut Unwinder,
    heap: &mut HeapTable,
) {
    procs.ensure(alloc.tgid);
    let generation = procs.generation_at(alloc.tgid, alloc.time_ns);
    // The registers are those at the allocator's return: the leaf is the
    // call site, one byte back from the return address.
    let user = event_user_stack(
        procs,
        unwinder,
        Thread {
            tgid: alloc.tgid,
            generation,
            tid: alloc.tid,
        },
        (alloc.ip.saturating_sub(1), alloc.sp, alloc.bp),
        &alloc.stack[..(alloc.stack_len as usize).min(N)],
        &alloc.frames[..(alloc.frames_len as usize).min(MAX_STACK_DEPTH)],
        true,
    );
    let id = SampleId {
        tgid: alloc.tgid,
        generation,
        tid: alloc.tid,
        thread: alloc.comm,
        user,
        kernel: Stack::None,
        object: 0,
        cond: 0,
    };
    // An allocation read after its image was replaced or its process
    // exited is no longer in use: that address space is gone (its live
    // set was forgotten then), so it is counted as allocated only. (A
    // process that could not be read is taken as live.)
    let mut live = alloc.live != 0;
    if live
        && (generation != procs.generation(alloc.tgid)
            || procs.peek(alloc.tgid).is_some_and(|info| info.is_exited()))
    {
        live = false;
        probes.forget_live(alloc.tgid, &[alloc.addr]);
    }
    heap.allocated(id, alloc.addr, alloc.size, live);
}

/// The thread a record came from, and the image its process ran then.
#[derive(Clone, Copy)]
struct Thread {
    tgid: u32,
    generation: u32,
    tid: u32,
}

/// The user stack of an event that carries either a stack copy (unwound
/// here from `regs`) or frame-pointer frames. `at_return`: the registers
/// are at a return address, so the kernel's first frame is one past the
/// call.
fn event_user_stack(
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    thread: Thread,
    regs: (u64, u64, u64),
    stack: &[u8],
    frames: &[u64],
    at_return: bool,
) -> Stack {
    hinted_user_stack(
        procs, unwinder, thread, regs, stack, frames, at_return, None,
    )
    .0
}

/// How a record's stack is given to the daemon: its flags, and the frames
/// it carries (a frame-pointer walk, or with `HINT_MATCHED` a remembered
/// walk's frames after the ip; `frames_len` as sent).
fn matched_walk(flags: u32, hint_id: u64, frames: &[u64], frames_len: u64) -> Option<Matched<'_>> {
    (flags & wait_flags::HINT_MATCHED != 0).then(|| Matched {
        id: hint_id,
        frames: usize::try_from(frames_len)
            .ok()
            .filter(|&n| n <= WALK_HINT_WORDS)
            .and_then(|n| frames.get(..n)),
        truncated: flags & wait_flags::WALK_TRUNCATED != 0,
    })
}

/// As [`event_user_stack`], for an event whose stack the kernel may have
/// matched against a walk hint (`matched`: the frames the record carries;
/// a brief event has no copy); also returns a hint for the kernel (see
/// [`Unwinder::unwind_hinted`]).
#[allow(clippy::too_many_arguments)]
fn hinted_user_stack(
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    Thread {
        tgid,
        generation,
        tid,
    }: Thread,
    (ip, sp, bp): (u64, u64, u64),
    stack: &[u8],
    frames: &[u64],
    at_return: bool,
    matched: Option<Matched<'_>>,
) -> (Stack, Option<(WalkHintKey, WalkHint)>) {
    let as_stack = |unwound: UnwoundStack| match unwound.truncated {
        true => Stack::Truncated(unwound.frames),
        false => Stack::Frames(unwound.frames),
    };
    if let Some(matched) = matched {
        return (as_stack(unwinder.matched(ip, matched)), None);
    }
    if !stack.is_empty() {
        return match procs.get_image(tgid, generation) {
            Some(info) => {
                let (unwound, hint) = unwinder.unwind_hinted(info, tid, ip, sp, bp, stack);
                (as_stack(unwound), hint)
            }
            None => (Stack::Truncated(Arc::from(vec![ip])), None),
        };
    }
    let mut frames = frames.to_vec();
    if at_return && let Some(first) = frames.first_mut() {
        *first = first.saturating_sub(1);
    }
    let stack = match frames.is_empty() {
        true => Stack::Lost,
        false => Stack::FramePointer(Arc::from(frames)),
    };
    (stack, None)
}

/// What the block and mutex profiles collect.
struct Waits {
    block: BlockWindow,
    offcpu: BlockWindow,
    mutex: MutexTable,
    block_rate_ns: u64,
    /// The kernel's walk hints, given each walk remembered for a wait.
    walk_hints: Option<AyaHashMap<MapData, WalkHintKey, WalkHint>>,
}

impl Waits {
    fn new(
        settings: &Settings,
        walk_hints: Option<AyaHashMap<MapData, WalkHintKey, WalkHint>>,
    ) -> Self {
        Waits {
            block: BlockWindow::default(),
            offcpu: BlockWindow::default(),
            mutex: MutexTable::new(settings.mutex_fraction),
            block_rate_ns: settings.block_rate.as_nanos() as u64,
            walk_hints,
        }
    }

    /// The user stack of a wait or off-CPU event (`flags`, `hint_id`: its
    /// `wait_flags` and the walk hint the kernel matched; `frames`: the
    /// frames it carries, `frames_len` as sent); a walk newly remembered is
    /// handed to the kernel as a hint.
    #[allow(clippy::too_many_arguments)]
    fn user_stack(
        &mut self,
        procs: &mut ProcessTable,
        unwinder: &mut Unwinder,
        thread: Thread,
        regs: (u64, u64, u64),
        stack: &[u8],
        (frames, frames_len): (&[u64], u64),
        (flags, hint_id): (u32, u64),
    ) -> Stack {
        let matched = matched_walk(flags, hint_id, frames, frames_len);
        // A goroutine's frames start with the return address it parked at.
        let at_return = flags & wait_flags::RETURN_ADDRESS != 0;
        let walked = &frames[..(frames_len as usize).min(frames.len())];
        let (user, hint) = hinted_user_stack(
            procs, unwinder, thread, regs, stack, walked, at_return, matched,
        );
        if let Some((key, hint)) = hint {
            self.hint(key, hint);
        }
        user
    }

    /// Gives the kernel a remembered walk's hint. A failed insert only
    /// means the kernel cannot vouch for that walk: the copy is checked
    /// here instead.
    fn hint(&mut self, key: WalkHintKey, hint: WalkHint) {
        if let Some(map) = &mut self.walk_hints
            && let Err(e) = map.insert(key, hint, 0)
        {
            tracing::debug!("walk hint for process {} not stored: {e}", key.tgid);
        }
    }

    /// Takes back from the kernel the hints of walks about to be
    /// forgotten, so that it stops sending brief records for them.
    fn retire_hints(&mut self, unwinder: &mut Unwinder) {
        let retired = unwinder.take_retired_hints();
        if let Some(map) = &mut self.walk_hints {
            for key in &retired {
                // Gone already (evicted, or never stored): nothing to do.
                let _ = map.remove(key);
            }
        }
    }
}

/// Adds the kept waits, wake-ups and delays that the futex probes reported.
fn read_wait_events(
    ring: &mut RingBuf<MapData>,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    waits: &mut Waits,
) {
    while let Some(item) = ring.next() {
        // Every wait event starts with its kind.
        let Some(kind) = read_record::<u32>(&item) else {
            continue;
        };
        match kind {
            wait_event::OFFCPU => {
                if let Some(event) = record::<OffcpuRecord>(&item) {
                    read_offcpu_event(event, procs, unwinder, waits);
                }
                continue;
            }
            wait_event::MUTEX_DELAY => {
                if let Some(delay) = read_record::<MutexDelay>(&item) {
                    waits.mutex.delay(delay.wake_id, delay.delay_ns);
                }
                continue;
            }
            wait_event::BLOCK | wait_event::MUTEX_WAKE => {}
            _ => continue,
        }
        let Some(head) = read_record::<WaitHead>(&item) else {
            continue;
        };
        // A brief record (its walk hint matched) carries the walk's frames
        // instead of a copy.
        let (stack, frames, frames_len): (&[u8], &[u64], u64) =
            if head.flags & wait_flags::BRIEF != 0 {
                let Some(frames) = brief_frames(&item) else {
                    continue;
                };
                (&[], frames, frames.len() as u64)
            } else {
                let Some(event) = record::<WaitStack>(&item) else {
                    continue;
                };
                (
                    &event.stack[..(event.stack_len as usize).min(STACK_COPY_BYTES)],
                    &event.frames,
                    event.frames_len.min(MAX_STACK_DEPTH as u64),
                )
            };
        let event = head;
        procs.ensure(event.tgid);
        let generation = procs.generation_at(event.tgid, event.time_ns);
        // Registers saved at the system call: an exact instruction pointer;
        // a goroutine's frames start with the return address it parked at.
        let user = waits.user_stack(
            procs,
            unwinder,
            Thread {
                tgid: event.tgid,
                generation,
                tid: event.tid,
            },
            (event.ip, event.sp, event.bp),
            stack,
            (frames, frames_len),
            (event.flags, event.hint_id),
        );
        let id = SampleId {
            tgid: event.tgid,
            generation,
            tid: event.tid,
            thread: event.comm,
            user,
            kernel: Stack::None,
            object: event.uaddr,
            cond: event.cond,
        };
        if kind == wait_event::BLOCK {
            waits.mutex.note_cond_word(&id);
            waits.block.add(id, event.value, waits.block_rate_ns);
        } else {
            waits.mutex.wake(event.value, id);
        }
    }
    waits.retire_hints(unwinder);
}

/// A kept off-CPU interval: the stacks at the thread's switch-out.
fn read_offcpu_event(
    event: &OffcpuRecord,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    waits: &mut Waits,
) {
    procs.ensure(event.tgid);
    // The stacks are those at the switch-out.
    let generation = procs.generation_at(event.tgid, event.start_ns);
    let user = match event.sp {
        // A kernel thread.
        0 => Stack::None,
        _ => waits.user_stack(
            procs,
            unwinder,
            Thread {
                tgid: event.tgid,
                generation,
                tid: event.tid,
            },
            (event.ip, event.sp, event.bp),
            &event.stack[..(event.stack_len as usize).min(OFFCPU_STACK_BYTES)],
            (&event.frames, event.frames_len.min(MAX_STACK_DEPTH as u64)),
            (event.flags, event.hint_id),
        ),
    };
    let kernel =
        kernel_stack(&event.kernel[..(event.kernel_len as usize).min(OFFCPU_KERNEL_DEPTH)]);
    let id = SampleId {
        tgid: event.tgid,
        generation,
        tid: event.tid,
        thread: event.comm,
        user,
        kernel,
        object: 0,
        cond: 0,
    };
    waits.offcpu.add(id, event.duration_ns, waits.block_rate_ns);
}

/// Symbolizes, builds and writes every enabled profile of a closed window.
fn write_window(
    settings: &Settings,
    publisher: &Publisher,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    heap: &mut HeapTable,
    waits: &mut Waits,
    window: Window,
) {
    let duration = window.started.elapsed();
    let time_nanos = window
        .start
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    for &kind in &settings.profiles {
        let began = Instant::now();
        let profile = match kind {
            ProfileKind::Cpu => build_cpu_profile(
                settings,
                symbolizer,
                procs,
                &window.cpu,
                time_nanos,
                duration.as_nanos() as i64,
            ),
            ProfileKind::Heap => build_heap_profile(
                settings,
                symbolizer,
                procs,
                heap,
                time_nanos,
                duration.as_nanos() as i64,
            ),
            ProfileKind::Block | ProfileKind::Mutex | ProfileKind::Offcpu => {
                let rows = match kind {
                    ProfileKind::Block => waits.block.close(),
                    ProfileKind::Offcpu => waits.offcpu.close(),
                    _ => waits.mutex.close(),
                };
                build_wait_profile(
                    kind,
                    settings,
                    symbolizer,
                    procs,
                    &rows,
                    time_nanos,
                    duration.as_nanos() as i64,
                )
            }
        };
        let built = began.elapsed();
        // A failure is logged by the publisher, once per window.
        if let Ok(path) = publisher.publish(kind, window.start, &profile) {
            tracing::info!(
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
    release_free_memory();
}

/// Returns the allocator's free memory to the kernel. A window frees what
/// it built (stacks, symbols, the encoded profile) in many small blocks
/// that glibc keeps in its arenas; without this, resident memory creeps up
/// window after window under churn.
fn release_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn build_cpu_profile(
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    cpu: &CpuWindow,
    time_nanos: i64,
    duration_nanos: i64,
) -> pprof_proto::Profile {
    let period = 1_000_000_000 / settings.cpu_frequency.max(1) as i64;
    let mut builder = ProfileBuilder::new(ProfileKind::Cpu, period, time_nanos, duration_nanos);
    let mut frames: Vec<Frame> = Vec::with_capacity(256);
    for (id, &count) in &cpu.samples {
        frames.clear();
        procs.ensure(id.tgid);
        push_stack(&mut frames, &id.kernel, "kernel", |ips| {
            symbolizer.kernel_stack(ips)
        });
        push_stack(&mut frames, &id.user, "user", |ips| {
            symbolizer.user_stack_of(procs, (id.tgid, id.generation), ips)
        });
        let count = count as i64;
        let labels = sample_labels(settings, procs, id);
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        builder.add_sample(&frames, &[count, count * period], &labels);
    }
    builder.build()
}

fn build_heap_profile(
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    heap: &mut HeapTable,
    time_nanos: i64,
    duration_nanos: i64,
) -> pprof_proto::Profile {
    let rate = settings.heap_sample_bytes;
    let mut builder =
        ProfileBuilder::new(ProfileKind::Heap, rate as i64, time_nanos, duration_nanos);
    let mut frames: Vec<Frame> = Vec::with_capacity(256);
    for row in heap.close_window() {
        let id = &row.id;
        frames.clear();
        procs.ensure(id.tgid);
        push_stack(&mut frames, &id.user, "user", |ips| {
            symbolizer.user_stack_of(procs, (id.tgid, id.generation), ips)
        });
        let (alloc_objects, alloc_space) = row.alloc.scaled(rate);
        let (inuse_objects, inuse_space) = row.inuse.scaled(rate);
        let labels = sample_labels(settings, procs, id);
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        builder.add_sample(
            &frames,
            &[alloc_objects, alloc_space, inuse_objects, inuse_space],
            &labels,
        );
    }
    builder.build()
}

fn build_wait_profile(
    kind: ProfileKind,
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    rows: &[(Arc<SampleId>, Weight)],
    time_nanos: i64,
    duration_nanos: i64,
) -> pprof_proto::Profile {
    let mut builder = ProfileBuilder::new(kind, 1, time_nanos, duration_nanos);
    let mut frames: Vec<Frame> = Vec::with_capacity(256);
    for (id, weight) in rows {
        frames.clear();
        procs.ensure(id.tgid);
        push_stack(&mut frames, &id.kernel, "kernel", |ips| {
            symbolizer.kernel_stack(ips)
        });
        // The switch-out stack starts inside the tracepoint that recorded
        // it; the thread blocked in the scheduler below.
        let tracing = frames.iter().take_while(|f| is_tracing_frame(f)).count();
        frames.drain(..tracing);
        push_stack(&mut frames, &id.user, "user", |ips| {
            symbolizer.user_stack_of(procs, (id.tgid, id.generation), ips)
        });
        let labels = sample_labels(settings, procs, id);
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        builder.add_sample(
            &frames,
            &[
                weight.contentions.round() as i64,
                weight.delay_ns.round() as i64,
            ],
            &labels,
        );
    }
    builder.build()
}

fn push_stack(
    frames: &mut Vec<Frame>,
    stack: &Stack,
    what: &str,
    resolve: impl FnOnce(&[u64]) -> Vec<Frame>,
) {
    match stack {
        Stack::Frames(ips) => frames.extend(resolve(ips)),
        // Visible at the root end rather than silently shorter.
        Stack::Truncated(ips) => {
            frames.extend(resolve(ips));
            frames.push(marker_frame("[truncated]".to_string()));
        }
        Stack::FramePointer(ips) => {
            let mut resolved = resolve(ips);
            // Cut what follows the entry point (a frame-pointer walk runs on
            // through garbage when the entry code keeps no frame pointer);
            // without an entry point the walk broke off early: say so.
            match resolved.iter().position(is_stack_root) {
                Some(root) => resolved.truncate(root + 1),
                None => resolved.push(marker_frame("[truncated]".to_string())),
            }
            frames.extend(resolved);
        }
        Stack::None => {}
        // Visible rather than silently shorter: the sample still counts.
        Stack::Lost => frames.push(marker_frame(format!("[lost {what} stack]"))),
    }
}

/// Functions at which a thread's stack begins: a complete walk ends here.
fn is_stack_root(frame: &Frame) -> bool {
    const ROOTS: [&str; 8] = [
        "_start",
        "__libc_start_call_main",
        "__libc_start_main",
        "start_thread",
        "clone",
        "clone3",
        "__clone",
        "thread_start",
    ];
    // Go: goroutines start at runtime.goexit, system threads at mstart.
    const GO_ROOTS: [&str; 3] = ["runtime.goexit", "runtime.mstart", "runtime.rt0_go"];
    frame.lines.last().is_some_and(|line| {
        let name = line.function.as_str();
        ROOTS.iter().any(|r| {
            name == *r
                || name
                    .strip_prefix(r)
                    .is_some_and(|rest| rest.starts_with('@'))
        }) || name.starts_with("__libc_start_main")
            || name.ends_with("_clone3")
            || name.ends_with("_clone")
            || GO_ROOTS.iter().any(|r| name.starts_with(r))
    })
}

/// Kernel frames of the tracing machinery that ran the probe.
fn is_tracing_frame(frame: &Frame) -> bool {
    frame.lines.last().is_some_and(|line| {
        let name = line.function.as_str();
        name.starts_with("__traceiter_")
            || name.starts_with("__bpf_trace_")
            || name.starts_with("bpf_trace_run")
            || name.starts_with("trace_call_bpf")
            || name.starts_with("bpf_prog_")
    })
}

/// A frame that names a condition rather than code.
fn marker_frame(function: String) -> Frame {
    Frame {
        address: 0,
        mapping: None,
        lines: Arc::from(vec![Line {
            function,
            file: None,
            line: 0,
        }]),
    }
}

fn sample_labels(
    settings: &Settings,
    procs: &ProcessTable,
    id: &SampleId,
) -> Vec<(String, String)> {
    let comm = procs
        .get_image(id.tgid, id.generation)
        .map(|p| p.comm.clone())
        // Empty for an image placed from anchors: its name was never read.
        .filter(|comm| !comm.is_empty())
        .unwrap_or_else(|| {
            if id.tgid == id.tid {
                id.thread_name()
            } else {
                String::new()
            }
        });
    let mut labels = vec![
        ("pid".to_string(), id.tgid.to_string()),
        ("tid".to_string(), id.tid.to_string()),
        ("comm".to_string(), comm),
        ("thread".to_string(), id.thread_name()),
    ];
    if id.object != 0 {
        // Which lock or condition: the futex word's address (a mutex's own
        // address; inside a condition variable).
        labels.push(("lock".to_string(), format!("{:#x}", id.object)));
    }
    if id.cond != 0 {
        // The pthread_cond_t itself, which the futex word lies in.
        labels.push(("cond".to_string(), format!("{:#x}", id.cond)));
    }
    labels.extend(
        procs
            .image_labels(id.tgid, id.generation)
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    labels.extend(settings.labels.iter().cloned());
    labels
}

/// Kernel-side losses already logged. Each kind is logged once, when it
/// first happens: a full map stays full under the same load, and a line per
/// window would flood the log. Later losses are counted in `/metrics` and in
/// the exit summary.
#[derive(Default)]
struct Losses {
    logged: [bool; counter::COUNT as usize],
}

/// Every kernel loss counter and what its loss means, for the log.
const LOSSES: [(u32, &str); 14] = [
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

impl Losses {
    fn report(&mut self, probes: &Probes) {
        let now = probes.counters();
        for (index, what) in LOSSES {
            let i = index as usize;
            if now[i] > 0 && !self.logged[i] {
                self.logged[i] = true;
                tracing::warn!(
                    "{what}: {} so far (logged once; see the exit summary and /metrics)",
                    now[i]
                );
            }
        }
        tracing::debug!(samples = now[counter::SAMPLES as usize], "kernel counters");
    }
}

/// One line at exit with what was collected and every loss, so that a run
/// can be judged from its log.
fn log_summary(
    probes: &mut Probes,
    unwinder: &Unwinder,
    symbolizer: &Symbolizer,
    procs: &ProcessTable,
    heap: &HeapTable,
    waits: &Waits,
) {
    if let Some(conds) = probes.cond_parks() {
        let a = conds.stats();
        tracing::info!(
            condition_links = a.links,
            condition_attach_failures = a.failures,
            mutex_orphan_delays = waits.mutex.orphan_delays,
            cond_words_cleared = waits.mutex.cond_words_cleared,
            "wait summary"
        );
    }
    if let Some(allocators) = probes.allocators() {
        let a = allocators.stats();
        let c = probes.counters();
        tracing::info!(
            heap_samples = c[counter::HEAP_SAMPLES as usize],
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
    tracing::info!(
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
        unwinds = u.unwinds,
        unwinds_truncated = u.truncated,
        unwinds_remembered = u.memo.hits + u.memo.matched_in_kernel,
        unwinds_matched_in_kernel = u.memo.matched_in_kernel,
        unwinds_matched_but_forgotten = u.memo.matched_but_forgotten,
        walk_memo_generations = u.memo.clears,
        stack_copy_count = c[counter::STACK_COPIES as usize],
        stack_copy_bytes = c[counter::STACK_BYTES_COPIED as usize],
        stack_tops_sent = u.tops.sent,
        records_short_form = SHORT_RECORDS.load(Ordering::Relaxed),
        stack_tops_taken_back = u.tops.taken_back,
        unwind_object_failures = u.object_load_failures,
        frames_unsymbolized = s.failures,
        frames_in_plt_stubs = s.plt_stubs,
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
        processes = p.processes,
        open_handles = p.open_handles,
        handle_limit_hits = p.handle_limit_hits,
        uprobe_links_closed_inline = probes.links_closed_inline(),
        symbol_cache_evictions = s.cache_evictions,
        unwind_evictions = u.evictions,
        profiles_unavailable = %match crate::kernel_check::skipped_names() {
            "" => "none",
            names => names,
        },
        "summary"
    );
}

/// The metrics, the `/metrics` server, the push and the OTLP export, as
/// configured.
/// The server binds here, so that a port in use stops the start.
async fn start_outputs(settings: &Settings, writer: ProfileWriter) -> Result<Publisher> {
    let metrics = Arc::new(Metrics::new()?);
    if let Some(addr) = settings.metrics_addr {
        let (bound, _) = crate::metrics::serve(addr, metrics.clone()).await?;
        tracing::info!("serving metrics at http://{bound}/metrics");
    }
    let mut sinks = Vec::new();
    if let Some(push) = &settings.push {
        let pusher = Pusher::start(push.clone())?;
        metrics.watch_push(pusher.stats());
        tracing::info!("pushing every profile to {}", pusher.url());
        sinks.push(pusher);
    }
    if let Some(otlp) = &settings.otlp {
        let exporter = crate::otlp::start(otlp.clone())?;
        metrics.watch_otlp(exporter.stats());
        tracing::warn!(
            "exporting every profile to {} as OTLP profiles ({}, alpha: the format may change)",
            exporter.url(),
            crate::otlp::PINNED
        );
        sinks.push(exporter);
    }
    Ok(Publisher::new(writer, metrics, sinks))
}

/// Mirrors the session's counters into the metrics.
fn observe(
    metrics: &Metrics,
    probes: &mut Probes,
    unwinder: &Unwinder,
    symbolizer: &Symbolizer,
    procs: &ProcessTable,
) {
    let p = procs.stats();
    metrics.observe(&Observed {
        kernel: probes.counters(),
        symbolization_failures: symbolizer.stats().failures,
        unwinds_truncated: unwinder.stats().truncated,
        attach_errors: probes.uprobe_links().map(|l| l.stats().failures).sum(),
        processes: p.processes as u64,
        process_snapshots: p.snapshots,
        process_snapshot_failures: p.failures,
    });
}

fn log_run_stats(probes: &Probes) {
    for (name, runs, time) in probes.run_stats() {
        if runs > 0 {
            tracing::info!(
                "bpf program {name}: {runs} runs, {:.0} ns per run",
                time.as_nanos() as f64 / runs as f64
            );
        }
    }
}

fn describe(settings: &Settings) -> String {
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

/// Loading eBPF needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN. Checking
/// first turns the kernel's bare EPERM into a message that says what is
/// missing.
fn check_privileges() -> Result<()> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    bail!("not allowed to load eBPF programs: run as root or with CAP_BPF and CAP_PERFMON")
}

/// Every process id in /proc.
fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `id` is a process (thread group leader) rather than a thread.
fn is_process(id: u32) -> bool {
    crate::text::read_proc_text(format!("/proc/{id}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
        .is_some_and(|tgid| tgid == id)
}

/// The start time (clock ticks after boot) of `pid` if it is running; a
/// zombie has a /proc entry but will never run again.
fn process_start(pid: u32) -> Option<u64> {
    // Read lossily: a command name need not be UTF-8.
    let stat = crate::text::read_proc_text(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, from the state (field 3) on;
    // the start time is field 22.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

async fn wait_child(
    child: &mut Option<tokio::process::Child>,
) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

/// Starts the command so that its first instruction is already profiled:
/// between fork and exec the child adds its own pid to the kernel's target
/// set. (`spawn` returns only after the exec, so the parent cannot do it in
/// time.)
fn start_command(
    command: &[OsString],
    probes: &mut Probes,
    procs: &mut ProcessTable,
) -> Result<tokio::process::Child> {
    let targets = probes.targets_fd().as_raw_fd();
    // Heap probes for the allocators known before the exec, made by the
    // child itself (see PreExecLinks).
    let pre_exec_links = match (probes.allocators(), resolve_program(&command[0])) {
        (Some(allocators), Some(program)) => Some(Arc::new(
            PreExecLinks::prepare(allocators, &program).context("preparing the heap probes")?,
        )),
        _ => None,
    };
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    let in_child = pre_exec_links.clone();
    // SAFETY: between fork and exec only getpid, bpf, sendmsg and close
    // run; nothing allocates or takes a lock.
    unsafe {
        cmd.pre_exec(move || {
            let pid = libc::getpid() as u32;
            crate::map_syscalls::update_elem_raw(targets, &pid, &1u8)?;
            if let Some(links) = &in_child {
                links.in_child();
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start command {}", command[0].to_string_lossy()))?;
    if let Some(pid) = child.id() {
        procs.ensure(pid);
        if let (Some(links), Some(allocators)) = (pre_exec_links, probes.allocators()) {
            // The closure's copy went with the command object.
            drop(cmd);
            if let Ok(links) = Arc::try_unwrap(links) {
                links.collect(pid, allocators);
            }
        }
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(names: &[&str]) -> Frame {
        Frame {
            address: 0x1000,
            mapping: None,
            lines: names
                .iter()
                .map(|n| Line {
                    function: n.to_string(),
                    file: None,
                    line: 0,
                })
                .collect::<Vec<_>>()
                .into(),
        }
    }

    #[test]
    fn stack_roots() {
        for root in [
            "_start",
            "__libc_start_call_main",
            "__libc_start_main_impl",
            "__libc_start_main@@GLIBC_2.34",
            "start_thread",
            "__GI___clone3",
            "runtime.goexit.abi0",
            "runtime.mstart",
        ] {
            assert!(is_stack_root(&frame(&[root])), "{root}");
        }
        for other in ["main", "clone_this", "run", "_start_server"] {
            assert!(!is_stack_root(&frame(&[other])), "{other}");
        }
        // The outermost of inlined lines decides.
        assert!(is_stack_root(&frame(&["inlined_helper", "start_thread"])));
        assert!(!is_stack_root(&frame(&[])));
    }

    #[test]
    fn frame_pointer_stacks_are_cut_at_the_root_or_marked() {
        let walked = Stack::FramePointer(Arc::from(vec![1u64, 2, 3, 4]));
        let mut out = Vec::new();
        push_stack(&mut out, &walked, "user", |_| {
            vec![
                frame(&["leaf"]),
                frame(&["main"]),
                frame(&["__libc_start_call_main"]),
                frame(&[]),
            ]
        });
        let names: Vec<_> = out
            .iter()
            .map(|f| f.lines.last().map(|l| l.function.clone()))
            .collect();
        assert_eq!(names.len(), 3, "garbage after the root is cut: {names:?}");
        let mut out = Vec::new();
        push_stack(&mut out, &walked, "user", |_| {
            vec![frame(&["leaf"]), frame(&[])]
        });
        assert_eq!(out.last().unwrap().lines[0].function, "[truncated]");
    }

    /// A brief record as the kernel sends it: its room for frames, the
    /// frames in use first, in 8-byte-aligned memory as ring records are.
    fn brief_record<const N: usize>(frames: &[u64]) -> Vec<u64> {
        let mut record = WaitBrief::<N> {
            // SAFETY: plain data, any bytes valid.
            head: unsafe { std::mem::zeroed() },
            frames_len: frames.len() as u64,
            frames: [0xdead; N],
        };
        record.frames[..frames.len()].copy_from_slice(frames);
        let words = std::mem::size_of::<WaitBrief<N>>() / 8;
        // SAFETY: repr(C) of u64-aligned fields, read as words.
        unsafe { std::slice::from_raw_parts((&raw const record).cast::<u64>(), words) }.to_vec()
    }

    fn bytes(words: &[u64]) -> &[u8] {
        // SAFETY: the words' own memory.
        unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) }
    }

    #[test]
    fn brief_records_are_read_by_their_length_in_every_room() {
        let frames: Vec<u64> = (1..=32).map(|i| 0x4000 + i).collect();
        for n in [0, 1, 8] {
            let r = brief_record::<8>(&frames[..n]);
            assert_eq!(brief_frames(bytes(&r)), Some(&frames[..n]));
            assert_eq!(bytes(&r).len(), BRIEF_FRAMES_OFFSET + 8 * 8);
        }
        for n in [9, 16] {
            let r = brief_record::<16>(&frames[..n]);
            assert_eq!(brief_frames(bytes(&r)), Some(&frames[..n]));
        }
        for n in [17, 32] {
            let r = brief_record::<32>(&frames[..n]);
            assert_eq!(brief_frames(bytes(&r)), Some(&frames[..n]));
        }
    }

    #[test]
    fn brief_records_shorter_than_their_frames_are_refused() {
        let frames: Vec<u64> = (1..=9).collect();
        let mut r = brief_record::<16>(&frames);
        // Nine frames said, eight frames' room.
        r.truncate(BRIEF_FRAMES_OFFSET / 8 + 8);
        assert_eq!(brief_frames(bytes(&r)), None);
        let mut r = brief_record::<32>(&frames);
        r[BRIEF_FRAMES_OFFSET / 8 - 1] = WALK_HINT_WORDS as u64 + 1;
        assert_eq!(brief_frames(bytes(&r)), None);
        assert_eq!(brief_frames(&bytes(&r)[..BRIEF_FRAMES_OFFSET - 1]), None);
    }
}
