//! The schedule: starts the probes (and the command, if any), drains the
//! kernel buffers every second, closes a window every `--interval` (and at
//! exit) by symbolizing, building and writing its profiles, and decides when
//! to stop.

mod captures;
mod events;
mod notify;
mod own_probes;
mod rings;
mod summary;
mod tapped;
mod targets;
mod window;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use crate::bpf::check::{probe_config, settle_profiles};
use crate::bpf::features::KernelFeatures;
use crate::bpf::park_budget::{LeftOpen, monotonic_ns};
use crate::bpf::probes::Probes;
use crate::bpf::ring::Ring;
use crate::config::{Settings, UnwindMode};
use crate::model::profile_kind::ProfileKind;
use crate::output::pprof_http::{Capture, Targets};
use crate::output::publish::{Publisher, start_outputs};
use crate::output::push::SHUTDOWN_GRACE;
use crate::output::push::queue::finish_all;
use crate::output::retention::Retention;
use crate::output::writer::ProfileWriter;
use crate::procs::go_heap_rate::GoHeapRates;
use crate::procs::go_runtime::GoExecutables;
use crate::procs::goroutines::GoroutineReader;
use crate::procs::process::{ProcessTable, all_pids};
use crate::profiles::cpu::{WaitingSamples, drain_once, read_stack_samples};
use crate::profiles::heap::{HeapTable, read_heap_events};
use crate::profiles::waits::{Waits, add_followed_waits, read_wait_events};
use crate::session::captures::{Captures, goroutines_now};
use crate::session::events::take_proc_events;
use crate::session::own_probes::LoadContext;
use crate::session::rings::Rings;
use crate::session::summary::{
    Losses, describe, log_go_summary, log_run_stats, log_summary, observe,
};
use crate::session::tapped::Tapped;
use crate::session::targets::{
    check_privileges, kernel_log_readable, process_start, recv_opt, sleep_opt, start_command,
    wait_child, watch_ring,
};
use crate::session::window::{Sources, Window, write_window};
use crate::stacks::budget::MemoryBudget;
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::symbolize::python::PythonMark;
use crate::stacks::unwind::Unwinder;

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
pub async fn run(settings: Settings) -> Result<()> {
    let (mut s, mut rings) = Session::start(settings).await?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    tracing::info!("{}", describe(&s.settings));
    // `py_sample` (CPU samples' Python frames; the other records'
    // programs read them themselves) takes 50-80 ms to load: under a
    // command, loaded before the command starts (delaying it, not READY),
    // so that a CPython process there has its frames from its first
    // moments; on the whole node, at the first Python process.
    if !s.settings.command.is_empty()
        && s.python_frames_wanted()
        && s.settings.profiles.contains(&ProfileKind::Cpu)
    {
        s.probes.enable_py_sample();
    }
    let mut child = s.start_command()?;
    // The targets of --pid before READY: a Python target's samples carry
    // its frames from the first (loading `py_sample` paid only when a
    // target runs CPython). On the whole node, after READY, not a second
    // later at the first tick.
    let targets = !s.settings.pids.is_empty();
    if targets {
        s.watch_python();
    }
    s.announce_ready();
    s.mark_running_go_processes();
    if !targets {
        s.watch_python();
    }

    let deadline = s.settings.duration.map(|d| s.window.started + d);
    let mut drain_tick =
        tokio::time::interval_at(tokio::time::Instant::now() + DRAIN_PERIOD, DRAIN_PERIOD);
    // From the window's start (at READY), not from here: marking the Go
    // processes took up to a third of a second on a busy node, and the
    // first window lasted that much longer than the others.
    let mut window_end = tokio::time::Instant::from_std(s.window.started) + s.settings.interval;
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
            guard = rings.events.readable_mut() => {
                let mut guard = guard.context("waiting for process events")?;
                s.take_proc_events(guard.get_inner_mut());
                guard.clear_ready();
            }
            guard = rings.wait_events.readable_mut() => {
                let mut guard = guard.context("waiting for wait events")?;
                s.take_proc_events(rings.events.get_mut());
                s.read_wait_events(guard.get_inner_mut());
                guard.clear_ready();
            }
            guard = rings.heap_events.readable_mut() => {
                let mut guard = guard.context("waiting for heap events")?;
                s.take_proc_events(rings.events.get_mut());
                s.read_heap_events(guard.get_inner_mut());
                guard.clear_ready();
            }
            guard = rings.stack_samples.readable_mut() => {
                let mut guard = guard.context("waiting for stack samples")?;
                s.take_proc_events(rings.events.get_mut());
                s.read_stack_samples(guard.get_inner_mut());
                guard.clear_ready();
            }
            guard = kernel_log_readable(&mut rings.kernel_log) => {
                let mut guard = guard.context("waiting for the kernel's log")?;
                guard.get_inner_mut().read();
                guard.clear_ready();
            }
            _ = drain_tick.tick() => {
                if let Some(stop) = s.tick(&mut rings).await {
                    break stop;
                }
            }
            // A new image's libraries (a shared CPython's `libpython`)
            // are recorded 20 ms after its exec, not at the next tick:
            // its Python frames are read from then on. For a command's
            // or the targets' processes only: on the whole node, under
            // process churn, every child's maps would be read again
            // while it lives, and the Python watch run per child.
            _ = sleep_opt(s.prompt_settle().then(|| s.procs.next_settle_at()).flatten().map(|at| at.saturating_duration_since(Instant::now()))) => {
                s.procs.settle();
                s.watch_python();
            }
            // A Go process's heap sampling rate, read once its runtime has
            // set it (some 250 ms after its exec).
            _ = sleep_opt(s.heap.go_rates.next_due().map(|at| at.saturating_duration_since(Instant::now()))) => {
                s.heap.go_rates.check_due();
            }
            _ = sleep_opt(s.probes.park_budget_due().map(|at| at.saturating_duration_since(Instant::now()))) => {
                s.park_budget_step();
            }
            // Goroutines parked past their window, read until they run.
            _ = sleep_opt(s.waits.go_parked.next_due_ns().map(|at| Duration::from_nanos(at.saturating_sub(monotonic_ns())))) => {
                s.follow_parked(Vec::new());
            }
            Some(capture) = recv_opt(&mut s.capture_requests) => {
                s.start_capture(capture);
            }
            _ = s.captures.own_readable() => {
                s.captures.read_own_rings(&mut s.symbolizer.python, &mut s.procs, &mut s.unwinder);
                s.settle_budget();
            }
            _ = sleep_opt(s.captures.next_end().map(|at| at.saturating_duration_since(Instant::now()))) => {
                s.finish_captures(&mut rings).await;
            }
            _ = tokio::time::sleep_until(window_end) => {
                window_end += s.settings.interval;
                s.close_window(&mut rings).await;
            }
        }
    };
    s.finish(&mut rings, stop).await;
    if let Some(mut child) = child {
        // We started it; on our own stop (signal or duration) leave it be as
        // perf does, but reap it if it already finished.
        let _ = child.try_wait();
    }
    Ok(())
}

/// Everything the session keeps between events, apart from its rings.
struct Session {
    settings: Settings,
    probes: Probes,
    procs: ProcessTable,
    unwinder: Unwinder,
    symbolizer: Symbolizer,
    /// What the unwinder's and the symbolizer's caches may hold.
    budget: MemoryBudget,
    heap: HeapTable,
    waits: Waits,
    window: Window,
    publisher: Publisher,
    retention: Option<Retention>,
    /// Processes that exec'd: their mappings are complete only once the
    /// dynamic loader has run, so they are looked at again a tick later.
    exec_rescan: Vec<u32>,
    /// Executables read to tell whether they are Go, by file identity.
    go_exes: GoExecutables,
    /// Stack samples read before the event of the image they ran.
    waiting: WaitingSamples,
    /// Each target with its start time: a new process that reuses the pid
    /// of an exited target is not that target.
    live_targets: HashMap<u32, Option<u64>>,
    /// Reads Go processes' goroutines for the goroutine profile.
    goroutines: GoroutineReader,
    reported: Losses,
    /// `/debug/pprof/` captures asked for (with `--http-addr`), and those
    /// under way.
    capture_requests: Option<mpsc::Receiver<Capture>>,
    /// What `/debug/pprof/` lists: the processes profiled, unless every
    /// one is (kept at each tick).
    index_targets: Option<watch::Sender<Targets>>,
    captures: Captures,
    /// What this kernel offers, for the probes captures load of their own.
    features: KernelFeatures,
}

impl Session {
    /// Settles the profiles this kernel can run, opens the outputs, loads
    /// and attaches the probes, and watches their rings.
    async fn start(mut settings: Settings) -> Result<(Session, Rings)> {
        check_privileges()?;
        let features = KernelFeatures::probe(crate::bpf::tracefs::tracefs_dir()?);
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
        let (publisher, pprof) = start_outputs(&settings, writer).await?;
        let (capture_requests, index_targets) = match pprof {
            Some(channels) => (Some(channels.captures), Some(channels.targets)),
            None => (None, None),
        };
        for (kind, _) in &skipped {
            publisher.metrics().profile_unavailable(*kind);
        }
        let budget =
            MemoryBudget::new(usize::try_from(settings.limits.memory_bytes).unwrap_or(usize::MAX));
        publisher
            .metrics()
            .cache_budget(settings.limits.memory_bytes);
        let mut symbolizer =
            Symbolizer::with_budget(budget.clone()).context("preparing the symbolizer")?;
        symbolizer.set_release_file_pages(settings.stack_switches.release_file_pages);
        symbolizer
            .python
            .set_caches(settings.stack_switches.python_caches);
        let mut procs = ProcessTable::new(MAX_PROCESSES);

        let command_mode = !settings.command.is_empty();
        let mut probes = Probes::load(&probe_config(&settings, &features, &settings.profiles))?;
        let mut unwinder = Unwinder::with_budget(budget.clone());
        let switches = settings.stack_switches;
        unwinder.set_stack_options(settings.limits.walk_memo_entries as usize, &switches);
        for &pid in &settings.pids {
            probes.add_target(pid)?;
            procs.ensure(pid);
        }
        let system_wide = settings.pids.is_empty() && !command_mode;
        let every_pid = match system_wide {
            true => all_pids(),
            false => Vec::new(),
        };
        // System-wide: every file to probe that is mapped now; later ones
        // as processes exec.
        if probes.uprobe_links().next().is_some() {
            for &pid in every_pid.iter().chain(&settings.pids) {
                probes.attach_files_of(pid);
            }
        }
        let events = watch_ring(probes.take_proc_events(), "process events")?;
        let stack_samples = watch_ring(probes.take_stack_samples(), "stack samples")?;
        let heap_events = watch_ring(probes.take_heap_events(), "heap events")?;
        let wait_events = watch_ring(probes.take_wait_events(), "wait events")?;
        let waits = Waits::new(&settings, probes.take_walk_hints());
        let kernel_log = match probes.take_kernel_log() {
            // SAFETY: the reader owns the ring's fd for as long as the AsyncFd
            // owns the reader, and always reports that same fd.
            Some(log) => Some(
                unsafe { AsyncFd::register(log) }
                    .map_err(|e| e.into_parts().1)
                    .context("watching the kernel's log ring")?,
            ),
            None => None,
        };
        let live_targets = settings
            .pids
            .iter()
            .map(|&pid| (pid, process_start(pid)))
            .collect();
        let rings = Rings {
            events,
            stack_samples,
            heap_events,
            wait_events,
            kernel_log,
        };
        let go_exes = GoExecutables::new(
            settings.stack_switches.executable_cache,
            settings.stack_switches.go_runtime_futexes_in_kernel,
        );
        let go_rates = GoHeapRates::new(
            settings.profiles.contains(&ProfileKind::Heap),
            settings.go_heap_sampling,
            settings.heap_sample_bytes,
        );
        let session = Session {
            settings,
            probes,
            procs,
            unwinder,
            symbolizer,
            budget,
            heap: HeapTable::with_go_rates(go_rates),
            waits,
            window: Window::new(),
            publisher,
            retention,
            exec_rescan: Vec::new(),
            go_exes,
            waiting: WaitingSamples::default(),
            live_targets,
            goroutines: GoroutineReader::default(),
            reported: Losses::default(),
            capture_requests,
            index_targets,
            captures: Captures::default(),
            features,
        };
        Ok((session, rings))
    }

    /// Starts `-- COMMAND`, if given.
    fn start_command(&mut self) -> Result<Option<tokio::process::Child>> {
        if self.settings.command.is_empty() {
            return Ok(None);
        }
        start_command(&self.settings.command, &mut self.probes, &mut self.procs).map(Some)
    }

    /// Says ready, in the log and to the service manager; the first
    /// window starts here.
    fn announce_ready(&mut self) {
        // The index page lists the targets from the first request on.
        self.publish_targets();
        match crate::bpf::check::skipped_names() {
            "" => tracing::info!("ready: every probe is attached"),
            skipped => tracing::info!(
                "ready: every probe is attached (skipped at best effort on this kernel: {skipped})"
            ),
        }
        if let Err(e) = crate::session::notify::notify("READY=1") {
            tracing::warn!("could not notify the service manager: {e}");
        }
        self.window = Window::new();
    }

    /// Has the kernel walk the stacks of the Go processes that ran
    /// before the session (those started later are marked at their exec):
    /// Go keeps frame pointers, and a stripped Go binary has no CFI at all.
    /// After READY, so that start-up does not wait for it; each distinct
    /// executable is read once.
    /// Their heap sampling rates are read too (heap profiles on).
    fn mark_running_go_processes(&mut self) {
        let mark = self.settings.unwind == UnwindMode::Auto;
        let heaps = self.heap.go_rates.watching();
        if (!mark && !heaps) || !self.settings.command.is_empty() {
            return;
        }
        let pids = match self.settings.pids.is_empty() {
            true => all_pids(),
            false => self.settings.pids.clone(),
        };
        for pid in pids {
            if let Some(go) = self.go_exes.get(pid) {
                if mark {
                    let process = self.go_exes.fp_process(pid, go);
                    self.probes.mark_frame_pointer_process(pid, process);
                }
                self.heap.go_rates.note(pid, Duration::ZERO);
            }
        }
        self.heap.go_rates.check_due();
    }

    /// Whether snapshots are re-read when due, on a timer (see `run`):
    /// under a command or `--pid`, whose processes are few.
    fn prompt_settle(&self) -> bool {
        !self.settings.command.is_empty() || !self.settings.pids.is_empty()
    }

    /// Whether a profile on carries Python frames (every profile type's
    /// records but goroutines'), and they are read.
    fn python_frames_wanted(&self) -> bool {
        let kinds = [
            ProfileKind::Cpu,
            ProfileKind::Heap,
            ProfileKind::Block,
            ProfileKind::Mutex,
            ProfileKind::Offcpu,
        ];
        self.settings.stack_switches.python_frames
            && kinds.iter().any(|k| self.settings.profiles.contains(k))
    }

    /// Tells the kernel which processes run CPython, and where their
    /// threads' frames are (see `symbolize::python::PythonCodes::watch`).
    fn watch_python(&mut self) {
        if !self.python_frames_wanted() {
            return;
        }
        for mark in self.symbolizer.python.watch(&self.procs) {
            match mark {
                PythonMark::Mark(tgid, runtime) => self.probes.mark_python_process(tgid, runtime),
                PythonMark::Unmark(tgid) => self.probes.unmark_python_process(tgid),
            }
        }
    }

    fn take_proc_events(&mut self, ring: &mut Ring) {
        take_proc_events(
            ring,
            &mut self.procs,
            &mut self.probes,
            &mut self.heap,
            &mut self.exec_rescan,
            self.settings.unwind,
            &mut self.go_exes,
        );
    }

    fn read_wait_events(&mut self, ring: &mut Ring) {
        read_wait_events(
            ring,
            &mut self.symbolizer.python,
            &mut self.procs,
            &mut self.unwinder,
            &mut self.waits,
        );
        self.settle_budget();
    }

    fn read_heap_events(&mut self, ring: &mut Ring) {
        read_heap_events(
            ring,
            &mut self.symbolizer.python,
            &mut self.procs,
            &mut self.probes,
            &mut self.unwinder,
            &mut self.heap,
        );
        self.settle_budget();
    }

    fn read_stack_samples(&mut self, ring: &mut Ring) {
        read_stack_samples(
            ring,
            &mut self.symbolizer.python,
            &mut self.procs,
            &mut self.unwinder,
            &mut self.window.cpu,
            &mut self.waiting,
        );
        self.settle_budget();
    }

    /// Adds the samples still waiting for their image's event, before the
    /// window is written.
    fn add_waiting_samples(&mut self) {
        self.waiting.add_known(
            &mut self.procs,
            &mut self.unwinder,
            &mut self.window.cpu,
            true,
        );
    }

    /// Opens and closes the park probes' windows that are due; the
    /// goroutines still parked in those closed are followed from now on.
    fn park_budget_step(&mut self) {
        let step = self.probes.park_budget_step();
        for window in step.opened {
            self.waits.park_windows.open(window);
        }
        self.follow_parked(step.left_open);
    }

    /// Takes goroutines `left_open` to follow, reads those due, and adds
    /// the waits that ended to the block profile.
    fn follow_parked(&mut self, left_open: Vec<LeftOpen>) {
        let now = monotonic_ns();
        let mut ended = match left_open.is_empty() {
            true => Vec::new(),
            false => self.waits.go_parked.take(left_open, now),
        };
        ended.extend(self.waits.go_parked.poll(now));
        if !ended.is_empty() {
            add_followed_waits(
                ended,
                &mut self.procs,
                &mut self.unwinder,
                &mut self.waits,
                &mut self.window.cpu.go_labels,
            );
        }
    }

    /// Has each owner of caches give back room it borrowed from the
    /// other: the unwinder grows as records are read, the symbolizer as a
    /// window is written, each within its own caches (stacks/budget.rs).
    fn settle_budget(&mut self) {
        self.symbolizer.enforce_budget();
        self.unwinder.enforce_budget();
        self.budget.settle();
    }

    async fn drain_once(&mut self) {
        drain_once(&mut self.probes, &self.procs, &mut self.window.cpu).await;
    }

    /// Every second: drains what the kernel holds, passes stack tops and
    /// new images to the probes, and notices targets that are gone.
    async fn tick(&mut self, rings: &mut Rings) -> Option<Stop> {
        self.take_proc_events(rings.events.get_mut());
        self.drain_once().await;
        // The kernel wakes us for stack samples only when their ring fills
        // up; collect the rest here.
        self.read_stack_samples(rings.stack_samples.get_mut());
        self.read_heap_events(rings.heap_events.get_mut());
        self.read_wait_events(rings.wait_events.get_mut());
        self.heap.go_rates.check_due();
        self.probes
            .update_stack_tops(&self.unwinder.take_stack_tops());
        self.read_own().await;
        self.captures.tick(Tapped {
            probes: &mut self.probes,
            cpu: &mut self.window.cpu,
            heap: &mut self.heap,
            waits: &mut self.waits,
        });
        self.publish_targets();
        for pid in self.exec_rescan.drain(..) {
            self.probes.attach_files_of(pid);
        }
        self.procs.settle();
        self.symbolizer.watch_perf_maps(&self.procs);
        self.watch_python();
        self.observe();
        if !self.live_targets.is_empty() {
            self.live_targets
                .retain(|&pid, start| start.is_some() && process_start(pid) == *start);
            for pid in self.settings.pids.iter() {
                if !self.live_targets.contains_key(pid) {
                    self.probes.remove_target(*pid);
                }
            }
            if self.live_targets.is_empty() {
                return Some(Stop::TargetsGone);
            }
        }
        None
    }

    /// Every `--interval`: drains, and writes the window's profiles.
    async fn close_window(&mut self, rings: &mut Rings) {
        self.take_proc_events(rings.events.get_mut());
        self.drain_once().await;
        self.read_stack_samples(rings.stack_samples.get_mut());
        self.read_heap_events(rings.heap_events.get_mut());
        self.read_wait_events(rings.wait_events.get_mut());
        self.add_waiting_samples();
        // The kernel's counters, read after the drain, cover every sample
        // the window's files hold.
        self.observe();
        self.write_window();
        self.retention.as_mut().map(Retention::run);
        self.unwinder.release_unused();
        self.settle_budget();
        self.reported.report(&self.probes);
    }

    /// Tells `/debug/pprof/` the processes profiled, when it is served and
    /// they are not every process.
    fn publish_targets(&self) {
        let Some(targets) = &self.index_targets else {
            return;
        };
        let Some(mut pids) = self.targets() else {
            return;
        };
        // The table's order is its hashing's: compared sorted.
        pids.sort_unstable();
        targets.send_if_modified(|known| {
            let same = known.as_deref() == Some(&pids[..]);
            if !same {
                *known = Some(pids.into());
            }
            !same
        });
    }

    /// Starts a `/debug/pprof/profile` capture, or refuses it (see
    /// captures.rs).
    fn start_capture(&mut self, capture: Capture) {
        if capture.kind == ProfileKind::Goroutine {
            self.goroutines_now(capture);
            return;
        }
        let targets = self.targets();
        // Known, with their runtimes, before probes of a capture's own
        // are told how to walk them.
        for &pid in &capture.pids {
            self.procs.ensure(pid);
        }
        self.watch_python();
        self.captures.start(
            capture,
            &self.settings,
            targets.as_deref(),
            Tapped {
                probes: &mut self.probes,
                cpu: &mut self.window.cpu,
                heap: &mut self.heap,
                waits: &mut self.waits,
            },
            LoadContext {
                features: &self.features,
                go_exes: &mut self.go_exes,
                python: &self.symbolizer.python,
            },
        );
    }

    /// Reads the records of the captures' own probes.
    async fn read_own(&mut self) {
        self.captures
            .read_own(
                &mut self.symbolizer.python,
                &mut self.procs,
                &mut self.unwinder,
            )
            .await;
        self.settle_budget();
    }

    /// Answers `/debug/pprof/goroutine` (captures.rs).
    fn goroutines_now(&mut self, capture: Capture) {
        let every = match capture.pids.is_empty() {
            true => self.targets().unwrap_or_else(all_pids),
            false => Vec::new(),
        };
        goroutines_now(
            capture,
            every,
            &self.settings,
            &mut self.symbolizer,
            &mut self.procs,
            (&mut self.goroutines, &mut self.go_exes),
        );
    }

    /// Ends the captures that are due, with every sample taken until now.
    async fn finish_captures(&mut self, rings: &mut Rings) {
        self.take_proc_events(rings.events.get_mut());
        self.drain_once().await;
        self.read_stack_samples(rings.stack_samples.get_mut());
        self.add_waiting_samples();
        self.read_heap_events(rings.heap_events.get_mut());
        self.read_wait_events(rings.wait_events.get_mut());
        self.read_own().await;
        self.captures.finish_due(
            &self.settings,
            &mut self.symbolizer,
            &mut self.procs,
            Tapped {
                probes: &mut self.probes,
                cpu: &mut self.window.cpu,
                heap: &mut self.heap,
                waits: &mut self.waits,
            },
        );
    }

    fn write_window(&mut self) {
        let mut closed = std::mem::replace(&mut self.window, Window::new());
        let goroutine_pids = self.goroutine_pids();
        write_window(
            &self.settings,
            &self.publisher,
            &mut self.symbolizer,
            &mut self.procs,
            Sources {
                heap: &mut self.heap,
                waits: &mut self.waits,
                goroutines: &mut self.goroutines,
                goroutine_pids: &goroutine_pids,
            },
            &mut closed,
        );
        // Label sets live on into the next window (a sample drained then
        // may name a set recorded in this one).
        self.window.cpu.go_labels = std::mem::take(&mut closed.cpu.go_labels);
        self.window.cpu.go_labels.end_window();
        // On-demand captures go on across windows.
        self.window.cpu.taps = std::mem::take(&mut closed.cpu.taps);
    }

    /// The processes whose goroutines the goroutine profile reads: the
    /// targets (`--pid`, or the command and its children), else every
    /// process (those not Go are passed over, each executable looked at
    /// once).
    fn goroutine_pids(&self) -> Vec<u32> {
        if !self.settings.profiles.contains(&ProfileKind::Goroutine) {
            return Vec::new();
        }
        self.targets().unwrap_or_else(all_pids)
    }

    /// The processes profiled: the `--pid` targets, or the command and
    /// its children; `None` when every process is.
    fn targets(&self) -> Option<Vec<u32>> {
        let system_wide = self.settings.pids.is_empty() && self.settings.command.is_empty();
        (!system_wide).then(|| self.probes.target_pids())
    }

    fn observe(&mut self) {
        self.settle_budget();
        observe(
            &self.publisher.metrics,
            &mut self.probes,
            &self.unwinder,
            &self.symbolizer,
            &self.procs,
            &self.budget,
            self.heap.go_rates.stats,
        );
    }

    /// Stops sampling, writes the last window, and reports.
    async fn finish(mut self, rings: &mut Rings, stop: Stop) {
        // Stop sampling first so that the last window is complete and closed.
        log_run_stats(&self.probes);
        self.probes.stop_sampling();
        tracing::info!("stopping ({stop:?}): writing the last window");
        self.take_proc_events(rings.events.get_mut());
        self.read_heap_events(rings.heap_events.get_mut());
        self.read_wait_events(rings.wait_events.get_mut());
        self.drain_once().await;
        self.read_stack_samples(rings.stack_samples.get_mut());
        // The active buffer may hold samples written during the grace period.
        self.drain_once().await;
        self.add_waiting_samples();
        self.write_window();
        self.settle_budget();
        if let Some(r) = self.retention.as_mut() {
            r.run();
            r.log_totals();
        }
        self.reported.report(&self.probes);
        if let Some(log) = rings.kernel_log.as_mut() {
            log.get_mut().read();
        }
        rings.log_fill();
        log_summary(
            &mut self.probes,
            &self.unwinder,
            &self.symbolizer,
            &self.procs,
            &self.heap,
            &self.waits,
            &self.budget,
        );
        log_go_summary(
            &self.probes,
            &self.window.cpu.go_labels,
            self.goroutines.stats,
            self.heap.go_rates.stats,
            self.go_exes.stats,
            self.waits.go_parked.stats,
        );
        self.observe();
        let sinks = std::mem::take(&mut self.publisher.sinks);
        if !sinks.is_empty() {
            let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
            for stats in finish_all(sinks, deadline).await {
                tracing::info!("{}", stats.summary());
            }
        }
    }
}
