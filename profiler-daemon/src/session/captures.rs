//! On-demand captures (`/debug/pprof/...`, output/pprof_http.rs): each
//! gathers its processes' samples of one profile type beside the windows
//! (a tap: `model::taps`) for the seconds asked, then is built into a
//! profile the way a window's is and sent to the waiting request. The
//! windows and their files are untouched.

use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;

use crate::bpf::drain::CpuWindow;
use crate::config::Settings;
use crate::model::profile_kind::ProfileKind;
use crate::output::pprof_http::{Capture, MAX_CAPTURES, Refusal};
use crate::procs::process::ProcessTable;
use crate::profiles::cpu::build_cpu_profile;
use crate::profiles::heap::{HeapTable, heap_profile_of};
use crate::profiles::waits::{Waits, build_wait_profile};
use crate::stacks::symbolize::Symbolizer;

/// A capture under way.
struct Running {
    id: u64,
    kind: ProfileKind,
    started: SystemTime,
    started_at: Instant,
    ends: Instant,
    reply: oneshot::Sender<Result<Vec<u8>, Refusal>>,
}

/// Where the taps of each profile type are.
pub(crate) struct Tapped<'a> {
    pub(crate) cpu: &'a mut CpuWindow,
    pub(crate) heap: &'a mut HeapTable,
    pub(crate) waits: &'a mut Waits,
}

impl Tapped<'_> {
    /// Opens capture `id`'s tap of type `kind` on `pids`.
    fn open(&mut self, kind: ProfileKind, id: u64, pids: Vec<u32>) {
        match kind {
            ProfileKind::Cpu => self.cpu.taps.open(id, pids),
            ProfileKind::Heap => self.heap.taps.open(id, pids),
            ProfileKind::Block => self.waits.block.taps.open(id, pids),
            ProfileKind::Offcpu => self.waits.offcpu.taps.open(id, pids),
            ProfileKind::Mutex => self.waits.mutex.taps.open(id, pids),
            // Refused before (`Captures::start`).
            ProfileKind::Goroutine => {}
        }
    }

    /// Ends the taps of the captures `gone` names, of every type.
    fn drop_ids(&mut self, gone: &[u64]) {
        self.cpu.taps.drop_ids(gone);
        self.heap.taps.drop_ids(gone);
        self.waits.block.taps.drop_ids(gone);
        self.waits.offcpu.taps.drop_ids(gone);
        self.waits.mutex.taps.drop_ids(gone);
    }
}

/// The captures under way (at most MAX_CAPTURES).
#[derive(Default)]
pub(crate) struct Captures {
    running: Vec<Running>,
    next_id: u64,
}

impl Captures {
    /// Starts `capture` (a tap of its type), or refuses it: the daemon
    /// does not collect that type, a process is not one the daemon
    /// profiles (`targets`: the `--pid` targets and the command's
    /// processes; none when it profiles every process), or MAX_CAPTURES
    /// run already.
    pub(crate) fn start(
        &mut self,
        capture: Capture,
        settings: &Settings,
        targets: Option<&[u32]>,
        mut tapped: Tapped<'_>,
    ) {
        let kind = capture.kind;
        let refusal = if !settings.profiles.contains(&kind) || kind == ProfileKind::Goroutine {
            Some(Refusal::Unavailable(format!(
                "this daemon does not collect {} profiles (--profiles); on-demand probes are not \
                 attached yet",
                kind.name()
            )))
        } else if let Some(pid) = capture
            .pids
            .iter()
            .find(|pid| targets.is_some_and(|targets| !targets.contains(pid)))
        {
            Some(Refusal::NotProfiled(format!(
                "process {pid} is not one this daemon profiles (--pid or its command)"
            )))
        } else if self.running.len() >= MAX_CAPTURES {
            let first = self.running.iter().map(|r| r.ends).min();
            let retry_after = first.map_or(1, |at| {
                at.saturating_duration_since(Instant::now()).as_secs() + 1
            });
            Some(Refusal::Busy { retry_after })
        } else {
            None
        };
        if let Some(refusal) = refusal {
            let _ = capture.reply.send(Err(refusal));
            return;
        }
        self.next_id += 1;
        let now = Instant::now();
        // Who was profiled, and when, is in the log.
        let whose: Vec<String> = capture.pids.iter().map(u32::to_string).collect();
        tracing::info!(target: "profilerd::session",
            "on-demand capture {} started: {} of {} for {} s",
            self.next_id,
            kind.name(),
            match whose.is_empty() {
                true => "every process".to_owned(),
                false => format!("pid {}", whose.join(",")),
            },
            capture.seconds,
        );
        tapped.open(kind, self.next_id, capture.pids);
        self.running.push(Running {
            id: self.next_id,
            kind,
            started: SystemTime::now(),
            started_at: now,
            ends: now + Duration::from_secs(capture.seconds),
            reply: capture.reply,
        });
    }

    /// When the next capture ends.
    pub(crate) fn next_end(&self) -> Option<Instant> {
        self.running.iter().map(|r| r.ends).min()
    }

    /// Ends the captures whose client went away: their taps go.
    pub(crate) fn drop_abandoned(&mut self, mut tapped: Tapped<'_>) {
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
        self.running.retain(|r| !gone.contains(&r.id));
        tapped.drop_ids(&gone);
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
        for capture in due {
            if capture.reply.is_closed() {
                tapped.drop_ids(&[capture.id]);
                continue;
            }
            let Tapped { cpu, heap, waits } = &mut tapped;
            let time_nanos = capture
                .started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            let span = (time_nanos, capture.started_at.elapsed().as_nanos() as i64);
            let profile = match capture.kind {
                ProfileKind::Cpu => {
                    let Some(tap) = cpu.taps.take(capture.id) else {
                        continue;
                    };
                    // A window of the tap's samples, with the label sets
                    // they name.
                    let mut window = CpuWindow {
                        samples: tap.rows,
                        ..CpuWindow::default()
                    };
                    std::mem::swap(&mut window.go_labels, &mut cpu.go_labels);
                    let profile =
                        build_cpu_profile(settings, symbolizer, procs, &mut window, span.0, span.1);
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
                ProfileKind::Goroutine => continue,
            };
            let _ = capture.reply.send(Ok(pprof_proto::encode_gzip(&profile)));
        }
    }
}
