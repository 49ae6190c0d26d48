//! On-demand CPU captures (`/debug/pprof/profile`, output/pprof_http.rs):
//! each gathers its processes' samples beside the windows
//! (`bpf::drain::CpuTap`) for the seconds asked, then is built into a
//! profile the way a window's is and sent to the waiting request. The
//! windows and their files are untouched.

use std::time::{Instant, SystemTime};

use tokio::sync::oneshot;

use crate::bpf::drain::{CpuTap, CpuWindow};
use crate::config::Settings;
use crate::model::profile_kind::ProfileKind;
use crate::output::pprof_http::{Capture, MAX_CAPTURES, Refusal};
use crate::procs::process::ProcessTable;
use crate::profiles::cpu::build_cpu_profile;
use crate::stacks::symbolize::Symbolizer;

/// A capture under way.
struct Running {
    id: u64,
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
    /// Starts `capture` (a tap in `cpu`), or refuses it: the CPU profile
    /// is off, a process is not one the daemon profiles (`targets`: the
    /// `--pid` targets and the command's processes; none when it profiles
    /// every process), or MAX_CAPTURES run already.
    pub(crate) fn start(
        &mut self,
        capture: Capture,
        settings: &Settings,
        targets: Option<&[u32]>,
        cpu: &mut CpuWindow,
    ) {
        let refusal = if !settings.profiles.contains(&ProfileKind::Cpu) {
            Some(Refusal::Unavailable(
                "this daemon does not take CPU samples (--profiles); on-demand probes are not \
                 attached yet"
                    .into(),
            ))
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
        cpu.taps.push(CpuTap {
            id: self.next_id,
            pids: capture.pids,
            ..CpuTap::default()
        });
        self.running.push(Running {
            id: self.next_id,
            started: SystemTime::now(),
            started_at: now,
            ends: now + std::time::Duration::from_secs(capture.seconds),
            reply: capture.reply,
        });
    }

    /// When the next capture ends.
    pub(crate) fn next_end(&self) -> Option<Instant> {
        self.running.iter().map(|r| r.ends).min()
    }

    /// Ends the captures whose client went away: their taps go.
    pub(crate) fn drop_abandoned(&mut self, cpu: &mut CpuWindow) {
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
        cpu.taps.retain(|t| !gone.contains(&t.id));
    }

    /// Builds and sends every capture that has ended (call after a drain,
    /// so that they hold the samples taken until now).
    pub(crate) fn finish_due(
        &mut self,
        settings: &Settings,
        symbolizer: &mut Symbolizer,
        procs: &mut ProcessTable,
        cpu: &mut CpuWindow,
    ) {
        let now = Instant::now();
        let (due, running): (Vec<Running>, Vec<Running>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|r| r.ends <= now);
        self.running = running;
        for capture in due {
            let Some(at) = cpu.taps.iter().position(|t| t.id == capture.id) else {
                continue;
            };
            let tap = cpu.taps.swap_remove(at);
            if capture.reply.is_closed() {
                continue;
            }
            // A window of the tap's samples, with the label sets they name.
            let mut window = CpuWindow {
                samples: tap.samples,
                ..CpuWindow::default()
            };
            std::mem::swap(&mut window.go_labels, &mut cpu.go_labels);
            let time_nanos = capture
                .started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            let profile = build_cpu_profile(
                settings,
                symbolizer,
                procs,
                &mut window,
                time_nanos,
                capture.started_at.elapsed().as_nanos() as i64,
            );
            std::mem::swap(&mut window.go_labels, &mut cpu.go_labels);
            let _ = capture.reply.send(Ok(pprof_proto::encode_gzip(&profile)));
        }
    }
}
