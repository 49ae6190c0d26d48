//! Probes of a capture's own (design 019, fifth part). A capture of a
//! profile type the daemon does not collect, or at a rate other than the
//! daemon's, loads the eBPF object once more with that type alone, at
//! that rate, filtered to the capture's processes: what a second profilerd
//! with `--pid` would attach, inside this one. Its records go to tables of
//! its own, which the builders of the scheduled files turn into the
//! capture's profile; the daemon's probes, windows and files never see
//! them. Dropped at the capture's end (or when its client goes away), its
//! programs, links and maps go with it.

use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::unix::AsyncFd;

use crate::bpf::check::probe_config;
use crate::bpf::drain::CpuWindow;
use crate::bpf::features::KernelFeatures;
use crate::bpf::probes::{ProbeError, Probes};
use crate::bpf::ring::Ring;
use crate::config::{Settings, UnwindMode};
use crate::model::profile_kind::ProfileKind;
use crate::output::pprof_http::AskedRate;
use crate::procs::go_runtime::GoExecutables;
use crate::procs::process::ProcessTable;
use crate::profiles::cpu::{WaitingSamples, drain_once, read_stack_samples};
use crate::profiles::heap::{HeapTable, read_heap_events};
use crate::profiles::waits::{Waits, read_wait_events};
use crate::session::summary::LOSSES;
use crate::session::tapped::Tapped;
use crate::session::targets::watch_ring;
use crate::stacks::symbolize::python::PythonCodes;
use crate::stacks::unwind::Unwinder;

/// Bytes of a capture's wait and stack-copy rings at most: they carry
/// the records of the processes named, not of the node as the daemon's
/// do (a 16 MiB wait ring was 16 of the 40 MiB a block capture held).
const CAPTURE_RING_BYTES: u32 = 4 << 20;
/// Bytes of a capture's heap ring: a capture at a rate of its own may
/// sample far more often than the daemon. A 64 KiB capture of a Python
/// loop allocating 800 MB/s (12,000 records a second), its rings read
/// every 25 ms, lost 7-18% from 4 MiB, none from 8 MiB.
const CAPTURE_HEAP_RING_BYTES: u32 = 8 << 20;

/// Maps kept per thread, process or parked goroutine, held to what the
/// processes of a capture need (its CPU events cover 4,096 threads at
/// most): at the node's sizes they were 24 of those 40 MiB. An entry
/// evicted from these LRU maps costs a longer stack copy (`STACK_TOPS`),
/// a fresh sampling draw (`HEAP_THREADS`, unbiased), a new look-up
/// (`PY_THREADS`), a wait not charged (`GO_PARKED`, `FUTEX_WAKERS`) or
/// timed from its park rather than its semaphore call (`GO_SEMA_CALLS`).
const CAPTURE_MAP_CAPS: [(&str, u32); 8] = [
    ("STACK_TOPS", 4096),
    ("HEAP_THREADS", 4096),
    ("PY_THREADS", 4096),
    ("SEEN", 4096),
    ("FORKED", 4096),
    ("FUTEX_WAKERS", 4096),
    ("GO_PARKED", 16384),
    ("GO_SEMA_CALLS", 4096),
];

/// What loading a capture's probes looks up: the kernel's features, and
/// how the processes' stacks are walked (Go's frame pointers, CPython's
/// frames), as the daemon's own probes were told.
pub(crate) struct LoadContext<'a> {
    pub(crate) features: &'a KernelFeatures,
    pub(crate) go_exes: &'a mut GoExecutables,
    pub(crate) python: &'a PythonCodes,
}

/// A capture's probes and the tables its records go to.
pub(crate) struct OwnProbes {
    /// The daemon's settings with the capture's type, processes and rate:
    /// its profile is built (and rescaled) by them.
    pub(crate) settings: Settings,
    probes: Probes,
    /// Process events: read and let go, the daemon's own probes keeping
    /// the process table.
    events: Ring,
    /// Watched, as the daemon's are (read on a 25 ms timer instead, a
    /// 32 KiB heap capture of heap_sites lost 4,161 records from an 8 MiB
    /// ring, when the daemon's woken ring at 16 KiB lost none).
    stack_samples: AsyncFd<Ring>,
    heap_events: AsyncFd<Ring>,
    wait_events: AsyncFd<Ring>,
    cpu: CpuWindow,
    heap: HeapTable,
    waits: Waits,
    waiting: WaitingSamples,
    /// How long the load and attach took (said in the log; the
    /// benchmark's figure).
    pub(crate) load_ms: f64,
}

impl OwnProbes {
    /// Loads `kind`'s programs for `pids` at `rate` (the daemon's where
    /// none), attached and live when this returns.
    pub(crate) fn load(
        settings: &Settings,
        kind: ProfileKind,
        pids: &[u32],
        rate: Option<AskedRate>,
        context: LoadContext<'_>,
    ) -> anyhow::Result<Self> {
        let started = Instant::now();
        let settings = capture_settings(settings, kind, pids, rate);
        let mut config = probe_config(&settings, context.features, &[kind]);
        // The daemon's own programs say why they skip or drop; these are
        // the same programs.
        config.kernel_log = false;
        // Not derived from the node's CPUs and rate, as the daemon's are.
        let limits = &mut config.limits;
        for (bytes, derived) in [
            (
                &mut limits.stack_samples_bytes,
                &mut limits.derived.stack_samples,
            ),
            (
                &mut limits.wait_events_bytes,
                &mut limits.derived.wait_events,
            ),
        ] {
            *bytes = match std::mem::replace(derived, false) {
                true => CAPTURE_RING_BYTES,
                false => (*bytes).min(CAPTURE_RING_BYTES),
            };
        }
        limits.derived.heap_events = false;
        limits.heap_events_bytes = CAPTURE_HEAP_RING_BYTES;
        config.map_caps = CAPTURE_MAP_CAPS.to_vec();
        let mut probes = Probes::load(&config)?;
        for &pid in pids {
            probes.add_target(pid)?;
            if settings.unwind == UnwindMode::Auto
                && let Some(go) = context.go_exes.get(pid)
            {
                probes.mark_frame_pointer_process(pid, context.go_exes.fp_process(pid, go));
            }
            if settings.stack_switches.python_frames
                && let Some(runtime) = context.python.runtime_of(pid)
            {
                probes.mark_python_process(pid, runtime);
            }
            probes.attach_files_of(pid);
        }
        let events = probes
            .take_proc_events()
            .ok_or(ProbeError::MissingMap("PROC_EVENTS"))?;
        let stack_samples = watch_ring(probes.take_stack_samples(), "capture's stack sample")?;
        let heap_events = watch_ring(probes.take_heap_events(), "capture's heap event")?;
        let wait_events = watch_ring(probes.take_wait_events(), "capture's wait event")?;
        let waits = Waits::new(&settings, probes.take_walk_hints());
        Ok(OwnProbes {
            settings,
            probes,
            events,
            stack_samples,
            heap_events,
            wait_events,
            cpu: CpuWindow::default(),
            heap: HeapTable::default(),
            waits,
            waiting: WaitingSamples::default(),
            load_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Reads what the probes hold into the tables (every tick, and at the
    /// capture's end); `last`: the capture ends, and samples still waiting
    /// for their image's event are taken as of the image known.
    pub(crate) async fn read(
        &mut self,
        python: &mut PythonCodes,
        procs: &mut ProcessTable,
        unwinder: &mut Unwinder,
        last: bool,
    ) {
        while self.events.next().is_some() {}
        drain_once(&mut self.probes, procs, &mut self.cpu).await;
        self.read_rings(python, procs, unwinder);
        if last {
            self.waiting.add_known(procs, unwinder, &mut self.cpu, true);
        }
    }

    /// Reads the records in its rings into the tables (when one is
    /// readable).
    pub(crate) fn read_rings(
        &mut self,
        python: &mut PythonCodes,
        procs: &mut ProcessTable,
        unwinder: &mut Unwinder,
    ) {
        read_stack_samples(
            self.stack_samples.get_mut(),
            python,
            procs,
            unwinder,
            &mut self.cpu,
            &mut self.waiting,
        );
        read_heap_events(
            self.heap_events.get_mut(),
            python,
            procs,
            &mut self.probes,
            unwinder,
            &mut self.heap,
        );
        read_wait_events(
            self.wait_events.get_mut(),
            python,
            procs,
            unwinder,
            &mut self.waits,
        );
    }

    /// Ready when one of its rings has records to read (its readiness
    /// cleared: they are read next).
    pub(crate) fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<()> {
        for ring in [&self.stack_samples, &self.heap_events, &self.wait_events] {
            if let Poll::Ready(Ok(mut guard)) = ring.poll_read_ready(cx) {
                guard.clear_ready();
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }

    /// Its settings and tables, where the capture's tap is opened and
    /// built from.
    pub(crate) fn parts(&mut self) -> (&Settings, Tapped<'_>) {
        (
            &self.settings,
            Tapped {
                probes: &mut self.probes,
                cpu: &mut self.cpu,
                heap: &mut self.heap,
                waits: &mut self.waits,
            },
        )
    }
}

impl OwnProbes {
    /// Lets capture `id`'s probes go: what they lost is logged, and they
    /// are detached and freed off the session's thread (closing a uprobe
    /// or tracepoint link waits for the kernel: 0.5-0.8 s for the futex
    /// programs', during which the session would read no ring).
    pub(crate) fn let_go(self: Box<Self>, id: u64) {
        for lost in self.losses() {
            tracing::warn!(target: "profilerd::session", "on-demand capture {id}: {lost}");
        }
        tokio::task::spawn_blocking(move || drop(self));
    }

    /// What its programs lost, one line each ("<what>: <count>"): the
    /// capture's profile carries them as comments (`go tool pprof
    /// -comments`), as a sampling it could not keep up with is no answer
    /// to take at its word.
    pub(crate) fn losses(&self) -> Vec<String> {
        let counters = self.probes.counters();
        LOSSES
            .iter()
            .filter(|&&(index, _)| counters[index as usize] > 0)
            .map(|&(index, what)| format!("{what}: {}", counters[index as usize]))
            .collect()
    }
}

impl Drop for OwnProbes {
    /// Detaches every probe before the programs and maps are let go: the
    /// uprobe links are closed off the session's thread, as the daemon's.
    fn drop(&mut self) {
        self.probes.stop_sampling();
    }
}

/// The daemon's `settings` as a capture of `kind` of `pids` at `rate`
/// would have them.
fn capture_settings(
    settings: &Settings,
    kind: ProfileKind,
    pids: &[u32],
    rate: Option<AskedRate>,
) -> Settings {
    let mut own = settings.clone();
    own.profiles = vec![kind];
    own.pids = pids.to_vec();
    own.command = Vec::new();
    match rate {
        Some(AskedRate::Hz(hz)) => own.cpu_frequency = hz,
        Some(AskedRate::HeapBytes(bytes)) => own.heap_sample_bytes = bytes,
        Some(AskedRate::Block(rate)) => own.block_rate = rate,
        Some(AskedRate::MutexFraction(n)) => own.mutex_fraction = n,
        None => {}
    }
    own
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_capture_is_built_by_its_own_type_processes_and_rate() {
        let daemon = Settings::parse_from(["profilerd", "--profiles", "cpu"]).expect("settings");
        let own = capture_settings(
            &daemon,
            ProfileKind::Block,
            &[7, 9],
            Some(AskedRate::Block(Duration::from_millis(1))),
        );
        assert_eq!(own.profiles, vec![ProfileKind::Block]);
        assert_eq!(own.pids, vec![7, 9]);
        assert!(own.command.is_empty());
        assert_eq!(own.block_rate, Duration::from_millis(1));
        assert_eq!(own.heap_sample_bytes, daemon.heap_sample_bytes);
        let heap = capture_settings(&daemon, ProfileKind::Heap, &[7], None);
        assert_eq!(heap.heap_sample_bytes, daemon.heap_sample_bytes);
        let cpu = capture_settings(&daemon, ProfileKind::Cpu, &[7], Some(AskedRate::Hz(999)));
        assert_eq!(cpu.cpu_frequency, 999);
    }
}
