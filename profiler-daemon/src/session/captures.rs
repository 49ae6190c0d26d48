//! On-demand captures (`/debug/pprof/...`, output/pprof_http.rs): each
//! gathers its processes' samples of one profile type beside the windows
//! (a tap: `model::taps`) for the seconds asked, then is built into a
//! profile the way a window's is and sent to the waiting request. The
//! windows and their files are untouched. A capture of a type the daemon
//! does not collect, or at a rate of its own, taps the tables of probes of
//! its own instead (own_probes.rs).

use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;

use crate::bpf::capture_events::CaptureEvents;
use crate::bpf::drain::CpuWindow;
use crate::bpf::probes::Probes;
use crate::config::Settings;
use crate::model::profile_kind::ProfileKind;
use crate::output::pprof_http::{AskedRate, Capture, MAX_CAPTURES, Rates, Refusal};
use crate::procs::go_runtime::GoExecutables;
use crate::procs::goroutines::GoroutineReader;
use crate::procs::process::ProcessTable;
use crate::profiles::cpu::build_cpu_profile;
use crate::profiles::goroutine::build_goroutine_profile;
use crate::profiles::heap::heap_profile_of;
use crate::profiles::waits::build_wait_profile;
use crate::session::own_probes::{LoadContext, OwnProbes};
use crate::session::tapped::Tapped;
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::symbolize::python::PythonCodes;
use crate::stacks::unwind::Unwinder;

/// A capture under way.
struct Running {
    id: u64,
    kind: ProfileKind,
    /// CPU samples per second its samples were taken at.
    hz: u64,
    /// Its own CPU-clock events (a rate, or processes, the schedule's
    /// events do not cover).
    events: Option<CaptureEvents>,
    /// The processes it had the probes cover, which the schedule does not
    /// profile (heap and wait captures under `--pid`).
    guests: Vec<u32>,
    /// Probes of its own (a type the daemon does not collect, or a rate
    /// other than the daemon's), with the tables its records go to.
    own: Option<Box<OwnProbes>>,
    started: SystemTime,
    started_at: Instant,
    ends: Instant,
    reply: oneshot::Sender<Result<Vec<u8>, Refusal>>,
}

/// The captures under way (at most MAX_CAPTURES).
#[derive(Default)]
pub(crate) struct Captures {
    running: Vec<Running>,
    next_id: u64,
}

impl Captures {
    /// Every guest of the running captures.
    fn guests(&self) -> Vec<u32> {
        let mut guests: Vec<u32> = self.running.iter().flat_map(|r| r.guests.clone()).collect();
        guests.sort_unstable();
        guests.dedup();
        guests
    }

    /// Lets go of the guests of captures that ended (`released`) that no
    /// running capture holds.
    fn release_guests(&self, mut released: Vec<u32>, tapped: &mut Tapped<'_>) {
        let held = self.guests();
        released.sort_unstable();
        released.dedup();
        released.retain(|pid| !held.contains(pid));
        if released.is_empty() {
            return;
        }
        for &pid in &released {
            tapped.release_guest(pid);
        }
        tapped.set_guests(&held);
    }
}

impl Captures {
    /// Starts `capture` (a tap of its type), or refuses it: goroutines
    /// (answered at once, `goroutines_now`), MAX_CAPTURES running already, or
    /// probes that cannot be had. A capture of a type the daemon does not
    /// collect, or at a rate other than the daemon's (heap, block, mutex),
    /// loads probes of its own for its processes (`own_probes.rs`); those
    /// must be named. A CPU capture at a rate other than the daemon's, or
    /// of processes it does not profile (`targets`: the `--pid` targets
    /// and the command's processes; none when it profiles every process),
    /// gets CPU-clock events of its own on those processes' threads; a
    /// capture of another type of processes the daemon does not profile
    /// has the probes cover them (guests) for its time, their records kept
    /// out of the windows.
    pub(crate) fn start(
        &mut self,
        capture: Capture,
        settings: &Settings,
        targets: Option<&[u32]>,
        mut tapped: Tapped<'_>,
        context: LoadContext<'_>,
    ) {
        let kind = capture.kind;
        let own_probes = needs_own_probes(&capture, settings);
        let uncovered = capture
            .pids
            .iter()
            .find(|pid| targets.is_some_and(|targets| !targets.contains(pid)));
        let asked_hz = match capture.rate {
            Some(AskedRate::Hz(hz)) => Some(hz),
            _ => None,
        };
        let own_events = !own_probes
            && kind == ProfileKind::Cpu
            && !capture.pids.is_empty()
            && (asked_hz.is_some_and(|hz| hz != settings.cpu_frequency) || uncovered.is_some());
        let refusal = if kind == ProfileKind::Goroutine {
            Some(Refusal::Unavailable(
                "goroutine profiles are answered at once (goroutines_now), not captured".into(),
            ))
        } else if self.running.len() >= MAX_CAPTURES {
            let first = self.running.iter().map(|r| r.ends).min();
            let retry_after = first.map_or(1, |at| {
                at.saturating_duration_since(Instant::now()).as_secs() + 1
            });
            Some(Refusal::Busy { retry_after })
        } else if own_probes && capture.pids.is_empty() {
            Some(Refusal::Unavailable(format!(
                "this daemon does not collect {} profiles (--profiles): name the processes to \
                 probe for the capture (pid)",
                kind.name()
            )))
        } else if own_probes && capture.seconds == 0 {
            Some(Refusal::Unavailable(format!(
                "this daemon does not collect {} profiles (--profiles), so it holds no in-use \
                 set: add seconds to probe the processes for that long",
                kind.name()
            )))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            let _ = capture.reply.send(Err(refusal));
            return;
        }
        let id = self.next_id + 1;
        let hz = asked_hz.unwrap_or(settings.cpu_frequency);
        let mut own = match own_probes {
            true => match OwnProbes::load(settings, kind, &capture.pids, capture.rate, context) {
                Ok(own) => Some(Box::new(own)),
                Err(e) => {
                    let why = format!("{e:#}");
                    let why = why.lines().next().unwrap_or_default().to_owned();
                    let _ = capture.reply.send(Err(Refusal::Unavailable(format!(
                        "cannot load {} probes for the capture: {why}",
                        kind.name()
                    ))));
                    return;
                }
            },
            false => None,
        };
        let events = match own_events {
            true => match open_events(tapped.probes, id, hz, &capture.pids) {
                Ok(events) => Some(events),
                Err(refusal) => {
                    let _ = capture.reply.send(Err(refusal));
                    return;
                }
            },
            false => None,
        };
        // Processes the schedule does not profile, for a type other than
        // CPU: the probes cover them for the capture.
        let guests: Vec<u32> = match (own_events || own_probes, targets) {
            (false, Some(targets)) => capture
                .pids
                .iter()
                .copied()
                .filter(|pid| !targets.contains(pid))
                .collect(),
            _ => Vec::new(),
        };
        for (i, &pid) in guests.iter().enumerate() {
            if let Err(refusal) = tapped.add_guest(pid) {
                let held = self.guests();
                for &added in guests[..i].iter().filter(|p| !held.contains(p)) {
                    tapped.release_guest(added);
                }
                let _ = capture.reply.send(Err(refusal));
                return;
            }
        }
        self.next_id = id;
        let now = Instant::now();
        // Who was profiled, and when, is in the log.
        let whose: Vec<String> = capture.pids.iter().map(u32::to_string).collect();
        tracing::info!(target: "profilerd::session",
            "on-demand capture {id} started: {} of {} for {} s{}",
            kind.name(),
            match whose.is_empty() {
                true => "every process".to_owned(),
                false => format!("pid {}", whose.join(",")),
            },
            capture.seconds,
            match (&events, &own) {
                (Some(events), _) => format!(" at {hz} Hz on {} threads", events.threads()),
                (None, Some(own)) => format!(
                    " on probes of its own{} (loaded in {:.0} ms)",
                    capture
                        .rate
                        .map_or(String::new(), |rate| format!(" at {}", rate.describe())),
                    own.load_ms
                ),
                (None, None) => String::new(),
            },
        );
        match (&events, own.as_deref_mut()) {
            (Some(_), _) => tapped.cpu.taps.open_own(id),
            (None, Some(own)) => own.parts().1.open(kind, id, capture.pids),
            (None, None) => tapped.open(kind, id, capture.pids),
        }
        let has_guests = !guests.is_empty();
        self.running.push(Running {
            id,
            kind,
            hz,
            events,
            guests,
            own,
            started: SystemTime::now(),
            started_at: now,
            ends: now + Duration::from_secs(capture.seconds),
            reply: capture.reply,
        });
        if has_guests {
            tapped.set_guests(&self.guests());
        }
    }

    /// Ready when a ring of a capture's own probes has records to read
    /// (never, when no capture has probes of its own).
    pub(crate) async fn own_readable(&self) {
        std::future::poll_fn(|cx| {
            for own in self.running.iter().filter_map(|r| r.own.as_deref()) {
                if own.poll_readable(cx).is_ready() {
                    return std::task::Poll::Ready(());
                }
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// Reads the records in the rings of the captures' own probes.
    pub(crate) fn read_own_rings(
        &mut self,
        python: &mut PythonCodes,
        procs: &mut ProcessTable,
        unwinder: &mut Unwinder,
    ) {
        for own in self.running.iter_mut().filter_map(|r| r.own.as_deref_mut()) {
            own.read_rings(python, procs, unwinder);
        }
    }

    /// When the next capture ends.
    pub(crate) fn next_end(&self) -> Option<Instant> {
        self.running.iter().map(|r| r.ends).min()
    }

    /// Every tick: ends the captures whose client went away (their taps
    /// and events go), and gives the others' events the threads started
    /// since.
    pub(crate) fn tick(&mut self, tapped: Tapped<'_>) {
        if let Some(prog) = tapped.probes.cpu_program() {
            for events in self.running.iter_mut().filter_map(|r| r.events.as_mut()) {
                // A thread gone before its event opened is counted there.
                let _ = events.rescan(prog);
            }
        }
        self.drop_abandoned(tapped);
    }

    /// Reads the records of the captures' own probes into their tables
    /// (every tick, and before captures end: then with every sample).
    pub(crate) async fn read_own(
        &mut self,
        python: &mut PythonCodes,
        procs: &mut ProcessTable,
        unwinder: &mut Unwinder,
    ) {
        let now = Instant::now();
        for running in &mut self.running {
            let last = running.ends <= now;
            if let Some(own) = running.own.as_deref_mut() {
                own.read(python, procs, unwinder, last).await;
            }
        }
    }

    /// Ends the captures whose client went away: their taps go.
    fn drop_abandoned(&mut self, mut tapped: Tapped<'_>) {
        let gone: Vec<u64> = self
            .running
            .iter()
            .filter(|r| r.reply.is_closed())
            .map(|r| r.id)
            .collect();
        if gone.is_empty() {
            return;
        }
        tracing::debug!(
            "{} on-demand capture(s) ended: their clients went away",
            gone.len()
        );
        let released: Vec<u32> = self
            .running
            .iter()
            .filter(|r| gone.contains(&r.id))
            .flat_map(|r| r.guests.clone())
            .collect();
        for running in std::mem::take(&mut self.running) {
            match (gone.contains(&running.id), running.own) {
                (true, Some(own)) => own.let_go(running.id),
                (true, None) => {}
                (false, own) => self.running.push(Running { own, ..running }),
            }
        }
        tapped.drop_ids(&gone);
        self.release_guests(released, &mut tapped);
    }

    /// Builds and sends every capture that has ended (call after a drain,
    /// so that they hold the samples taken until now).
    pub(crate) fn finish_due(
        &mut self,
        settings: &Settings,
        symbolizer: &mut Symbolizer,
        procs: &mut ProcessTable,
        mut tapped: Tapped<'_>,
    ) {
        let now = Instant::now();
        let (due, running): (Vec<Running>, Vec<Running>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|r| r.ends <= now);
        self.running = running;
        let released: Vec<u32> = due.iter().flat_map(|r| r.guests.clone()).collect();
        for mut capture in due {
            if capture.reply.is_closed() {
                tapped.drop_ids(&[capture.id]);
                if let Some(own) = capture.own.take() {
                    own.let_go(capture.id);
                }
                continue;
            }
            let mut own = capture.own.take();
            let lost = own.as_deref().map(OwnProbes::losses).unwrap_or_default();
            let (settings, tables) = match own.as_deref_mut() {
                Some(own) => own.parts(),
                None => (settings, tapped.reborrow()),
            };
            let profile = build(&capture, settings, symbolizer, procs, tables);
            if let Some(mut profile) = profile {
                for line in lost {
                    profile.comment.push(profile.string_table.len() as i64);
                    profile.string_table.push(line);
                }
                let _ = capture.reply.send(Ok(pprof_proto::encode_gzip(&profile)));
            }
            if let Some(own) = own {
                own.let_go(capture.id);
            }
        }
        self.release_guests(released, &mut tapped);
    }
}

/// Builds ended `capture`'s profile from its tap in `tables` (the
/// daemon's, or its own probes'), as `settings` build the files.
fn build(
    capture: &Running,
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    tables: Tapped<'_>,
) -> Option<pprof_proto::Profile> {
    let Tapped {
        cpu, heap, waits, ..
    } = tables;
    let time_nanos = capture
        .started
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let span = (time_nanos, capture.started_at.elapsed().as_nanos() as i64);
    let profile = match capture.kind {
        ProfileKind::Cpu => {
            let tap = cpu.taps.take(capture.id)?;
            // A window of the tap's samples, with the label sets they name.
            let mut window = CpuWindow {
                samples: tap.rows,
                ..CpuWindow::default()
            };
            std::mem::swap(&mut window.go_labels, &mut cpu.go_labels);
            if let Some(events) = &capture.events {
                tracing::debug!(target: "profilerd::session",
                    "on-demand capture {} ended: {} threads sampled, {} missed",
                    capture.id, events.threads(), events.threads_missed);
            }
            let profile =
                build_cpu_profile(settings, symbolizer, procs, &mut window, capture.hz, span);
            std::mem::swap(&mut window.go_labels, &mut cpu.go_labels);
            profile
        }
        ProfileKind::Heap => {
            let rows = heap.take_tap(capture.id);
            heap_profile_of(settings, symbolizer, procs, heap, rows, span)
        }
        kind @ (ProfileKind::Block | ProfileKind::Mutex | ProfileKind::Offcpu) => {
            let rows = match kind {
                ProfileKind::Block => waits.block.take_tap(capture.id),
                ProfileKind::Offcpu => waits.offcpu.take_tap(capture.id),
                _ => waits.mutex.take_tap(capture.id),
            };
            build_wait_profile(
                kind,
                settings,
                symbolizer,
                procs,
                &mut cpu.go_labels,
                &rows,
                span.0,
                span.1,
            )
        }
        ProfileKind::Goroutine => return None,
    };
    Some(profile)
}

/// Whether `capture` needs probes of its own: a type the daemon does not
/// collect, or a heap, block or mutex rate other than the daemon's (a CPU
/// rate of its own is had on events of its own, `open_events`).
fn needs_own_probes(capture: &Capture, settings: &Settings) -> bool {
    let other_rate = capture.rate.is_some_and(|rate| {
        !matches!(rate, AskedRate::Hz(_)) && !rate.is_daemons(&Rates::of(settings))
    });
    capture.kind != ProfileKind::Goroutine
        && (!settings.profiles.contains(&capture.kind) || other_rate)
}

/// Opens capture `id`'s own CPU-clock events at `hz` on the threads of
/// `pids`, or says why it cannot.
fn open_events(probes: &Probes, id: u64, hz: u64, pids: &[u32]) -> Result<CaptureEvents, Refusal> {
    let Some(prog) = probes.cpu_program() else {
        return Err(Refusal::Unavailable(
            "this daemon does not take CPU samples (--profiles)".into(),
        ));
    };
    CaptureEvents::open(prog, id, hz, pids.to_vec()).map_err(|e| match e.raw_os_error() {
        Some(libc::ESRCH) => Refusal::NotProfiled(format!(
            "no thread of {pids:?} could be sampled: the processes exited"
        )),
        _ => Refusal::Unavailable(format!("cannot sample {pids:?} at {hz} Hz: {e}")),
    })
}

/// Answers `/debug/pprof/goroutine` at once: the goroutines of the Go
/// processes `capture` names (of `every` process profiled when none),
/// read now from their memory as the goroutine files are; a named
/// process that is not Go is refused.
pub(crate) fn goroutines_now(
    capture: Capture,
    every: Vec<u32>,
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    (reader, go_exes): (&mut GoroutineReader, &mut GoExecutables),
) {
    if let Some(pid) = capture
        .pids
        .iter()
        .copied()
        .find(|&pid| go_exes.get(pid).is_none())
    {
        let _ = capture.reply.send(Err(Refusal::Unavailable(format!(
            "process {pid} runs no Go runtime this daemon reads: it has no goroutines to list"
        ))));
        return;
    }
    let pids = match capture.pids.is_empty() {
        true => every,
        false => capture.pids,
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let profile = build_goroutine_profile(settings, symbolizer, procs, reader, &pids, now, 0);
    let _ = capture.reply.send(Ok(pprof_proto::encode_gzip(&profile)));
}
