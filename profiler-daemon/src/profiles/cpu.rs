//! The CPU profile: drains the double-buffered counts and stacks of
//! frame-pointer samples and reads the stack-copy samples into the window,
//! then builds the window's profile.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use profiler_common::{
    LONG_STACK_BYTES, MAX_STACK_DEPTH, PySample, SHORT_STACK_BYTES, STACK_COPY_BYTES, StackSample,
};

use crate::bpf::drain::{CpuWindow, SampleId, Stack};
use crate::bpf::go_labels::add_go_labels;
use crate::bpf::probes::Probes;
use crate::bpf::ring::Ring;
use crate::config::Settings;
use crate::model::frames::Frame;
use crate::model::profile_kind::ProfileKind;
use crate::procs::process::ProcessTable;
use crate::profiles::pprof::ProfileBuilder;
use crate::profiles::records::{kernel_stack, record};
use crate::profiles::samples::{
    PythonFrames, prefetch_user_stack, push_stack, python_frames, sample_labels, user_frames,
};
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::symbolize::python::PythonCodes;
use crate::stacks::unwind::Unwinder;

/// How long a program that read the old buffer index may still be writing.
pub(crate) const FLIP_GRACE: Duration = Duration::from_millis(2);

pub(crate) async fn drain_once(probes: &mut Probes, procs: &ProcessTable, cpu: &mut CpuWindow) {
    let buffer = match probes.flip() {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(target: "profilerd::session", "cannot switch sample buffers: {e}");
            return;
        }
    };
    tokio::time::sleep(FLIP_GRACE).await;
    match probes.drain(buffer) {
        Ok(drained) => cpu.absorb(drained, |tgid, since| match since {
            0 => procs.generation(tgid),
            // An image whose event is not read yet (see WaitingSamples):
            // the next one, which its event will retire the current for;
            // the stacks are symbolized at the window's end.
            since if !procs.knows_image(tgid, since) => {
                COUNTS_AHEAD_OF_IMAGE.fetch_add(1, Ordering::Relaxed);
                procs.generation(tgid).wrapping_add(1)
            }
            since => procs.generation_at(tgid, since),
        }),
        Err(e) => tracing::warn!(target: "profilerd::session", "{e}"),
    }
}

/// Keys of kernel-counted samples (one per thread and stack, each with
/// its count) drained before the event of their image (for the exit
/// summary).
pub(crate) static COUNTS_AHEAD_OF_IMAGE: AtomicU64 = AtomicU64::new(0);

/// CPU samples and sampled allocations received in the short record form
/// (for the exit summary).
pub(crate) static SHORT_RECORDS: AtomicU64 = AtomicU64::new(0);

/// CPU samples, sampled allocations and off-CPU records received in the
/// long record form, of threads marked deep (for the exit summary).
pub(crate) static LONG_RECORDS: AtomicU64 = AtomicU64::new(0);

/// Unwinds every sample that came with a copy of its user stack and adds it
/// to the window; one of an image whose event is not read yet waits in
/// `waiting` for it.
pub(crate) fn read_stack_samples(
    ring: &mut Ring,
    codes: &mut PythonCodes,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    cpu: &mut CpuWindow,
    waiting: &mut WaitingSamples,
) {
    waiting.add_known(procs, unwinder, cpu, false);
    while let Some(item) = ring.next() {
        // Two record forms, told apart by their length (the short one
        // when the thread's stack is known to fit).
        // A CPython process's samples add the thread's Python frames.
        // Largest form first: a record is taken as the first form it is
        // at least as long as.
        if let Some(py) = record::<PySample<LONG_STACK_BYTES>>(&item) {
            LONG_RECORDS.fetch_add(1, Ordering::Relaxed);
            let python = python_frames(codes, py.sample.tgid, &py.python);
            take_stack_sample(&py.sample, python, procs, unwinder, cpu, waiting);
        } else if let Some(sample) = record::<StackSample<LONG_STACK_BYTES>>(&item) {
            LONG_RECORDS.fetch_add(1, Ordering::Relaxed);
            take_stack_sample(sample, None, procs, unwinder, cpu, waiting);
        } else if let Some(py) = record::<PySample<STACK_COPY_BYTES>>(&item) {
            let python = python_frames(codes, py.sample.tgid, &py.python);
            take_stack_sample(&py.sample, python, procs, unwinder, cpu, waiting);
        } else if let Some(sample) = record::<StackSample>(&item) {
            take_stack_sample(sample, None, procs, unwinder, cpu, waiting);
        } else if let Some(py) = record::<PySample<SHORT_STACK_BYTES>>(&item) {
            SHORT_RECORDS.fetch_add(1, Ordering::Relaxed);
            let python = python_frames(codes, py.sample.tgid, &py.python);
            take_stack_sample(&py.sample, python, procs, unwinder, cpu, waiting);
        } else if let Some(sample) = record::<StackSample<SHORT_STACK_BYTES>>(&item) {
            SHORT_RECORDS.fetch_add(1, Ordering::Relaxed);
            take_stack_sample(sample, None, procs, unwinder, cpu, waiting);
        }
    }
}

/// Samples held until the event of their image is read, at most this
/// many (about 1.1 MiB); a sample beyond them is added at once, as of the
/// image known.
pub(crate) const MAX_WAITING_SAMPLES: usize = 64;

/// Samples that waited for the event of their image (an exec read after
/// them), and those added without it (it never came before the window
/// closed, or too many waited): for the exit summary.
pub(crate) static SAMPLES_WAITED_FOR_IMAGE: AtomicU64 = AtomicU64::new(0);
pub(crate) static SAMPLES_IMAGE_UNHEARD: AtomicU64 = AtomicU64::new(0);

/// Stack samples of images the daemon has not heard of yet. An exec gives
/// the thread its new name some 100 us before its event is sent, and a
/// sample taken in between can be read first: it is unwound once the
/// event has named the new image's mappings, never with the old one's.
#[derive(Default)]
pub(crate) struct WaitingSamples {
    samples: Vec<(Box<StackSample>, PythonFrames)>,
}

impl WaitingSamples {
    /// Adds the waiting samples whose image is known now; every one when
    /// `all` (the window closes: one whose event never came is taken as
    /// of the image known).
    pub(crate) fn add_known(
        &mut self,
        procs: &mut ProcessTable,
        unwinder: &mut Unwinder,
        cpu: &mut CpuWindow,
        all: bool,
    ) {
        if self.samples.is_empty() {
            return;
        }
        for (sample, python) in std::mem::take(&mut self.samples) {
            let known = procs.knows_image(sample.tgid, sample.image_since);
            if known || all {
                if !known {
                    SAMPLES_IMAGE_UNHEARD.fetch_add(1, Ordering::Relaxed);
                }
                add_stack_sample(&sample, python, procs, unwinder, cpu);
            } else {
                self.samples.push((sample, python));
            }
        }
    }
}

fn take_stack_sample<const N: usize>(
    sample: &StackSample<N>,
    python: PythonFrames,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    cpu: &mut CpuWindow,
    waiting: &mut WaitingSamples,
) {
    if !procs.knows_image(sample.tgid, sample.image_since) {
        if waiting.samples.len() < MAX_WAITING_SAMPLES {
            SAMPLES_WAITED_FOR_IMAGE.fetch_add(1, Ordering::Relaxed);
            waiting.samples.push((widen(sample), python));
            return;
        }
        SAMPLES_IMAGE_UNHEARD.fetch_add(1, Ordering::Relaxed);
    }
    add_stack_sample(sample, python, procs, unwinder, cpu);
}

/// A copy of a sample in the long form, on the heap.
fn widen<const N: usize>(sample: &StackSample<N>) -> Box<StackSample> {
    let len = N.min(STACK_COPY_BYTES);
    let mut wide = Box::new(StackSample {
        tgid: sample.tgid,
        tid: sample.tid,
        time_ns: sample.time_ns,
        image_since: sample.image_since,
        tap: sample.tap,
        ip: sample.ip,
        sp: sample.sp,
        bp: sample.bp,
        stack_len: sample.stack_len.min(len as u64),
        kernel_len: sample.kernel_len,
        comm: sample.comm,
        kernel: sample.kernel,
        stack: [0; STACK_COPY_BYTES],
    });
    wide.stack[..len].copy_from_slice(&sample.stack[..len]);
    wide
}

pub(crate) fn add_stack_sample<const N: usize>(
    sample: &StackSample<N>,
    python: PythonFrames,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    cpu: &mut CpuWindow,
) {
    procs.ensure(sample.tgid);
    let generation = procs.generation_at(sample.tgid, sample.time_ns);
    let stack_len = (sample.stack_len as usize).min(N);
    let mut jit_quarter = 0;
    let user = match procs.get_image(sample.tgid, generation) {
        Some(info) => {
            if info.has_anonymous_code() {
                jit_quarter = SampleId::jit_quarter_of(sample.time_ns);
            }
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
    let id = SampleId {
        tgid: sample.tgid,
        generation,
        tid: sample.tid,
        thread: sample.comm,
        user,
        kernel,
        object: 0,
        cond: 0,
        go_labels: 0,
        go_wait: 0,
        python,
        jit_quarter,
    };
    cpu.add(id, sample.tap);
}

/// The CPU profile of `cpu`'s samples, taken at `frequency` per second,
/// over `(time_nanos, duration_nanos)`.
pub(crate) fn build_cpu_profile(
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    cpu: &mut CpuWindow,
    frequency: u64,
    (time_nanos, duration_nanos): (i64, i64),
) -> pprof_proto::Profile {
    let period = 1_000_000_000 / frequency.max(1) as i64;
    let mut builder = ProfileBuilder::new(ProfileKind::Cpu, period, time_nanos, duration_nanos);
    let mut frames: Vec<Frame> = Vec::with_capacity(256);
    for id in cpu.samples.keys() {
        procs.ensure(id.tgid);
        prefetch_user_stack(symbolizer, procs, id);
    }
    symbolizer.resolve_prefetched();
    for (id, &count) in &cpu.samples {
        frames.clear();
        procs.ensure(id.tgid);
        push_stack(&mut frames, &id.kernel, "kernel", |ips, _| {
            symbolizer.kernel_stack(ips)
        });
        push_stack(&mut frames, &id.user, "user", |ips, leaf_words| {
            user_frames(symbolizer, procs, id, ips, leaf_words)
        });
        let count = count as i64;
        let mut labels = sample_labels(settings, procs, id);
        if id.go_labels != 0 {
            add_go_labels(&mut labels, &mut cpu.go_labels, id.go_labels);
        }
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        builder.add_sample(&frames, &[count, count * period], &labels);
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample of `tgid` at kernel time `time_ns` of the image that
    /// started at `image_since`, with no stack copy.
    fn sample(tgid: u32, time_ns: u64, image_since: u64) -> StackSample<SHORT_STACK_BYTES> {
        StackSample {
            tgid,
            tid: tgid,
            time_ns,
            image_since,
            tap: 0,
            ip: sample as fn(u32, u64, u64) -> StackSample<SHORT_STACK_BYTES> as usize as u64,
            sp: 0,
            bp: 0,
            stack_len: 0,
            kernel_len: 0,
            comm: [0; profiler_common::COMM_LEN],
            kernel: [0; MAX_STACK_DEPTH],
            stack: [0; SHORT_STACK_BYTES],
        }
    }

    fn generations(cpu: &CpuWindow) -> Vec<u32> {
        let mut g: Vec<u32> = cpu.samples.keys().map(|id| id.generation).collect();
        g.sort();
        g
    }

    /// A sample read before its exec's event waits for it and is given
    /// the new image; one whose event never comes is added, as of the
    /// image known, when the window closes.
    #[test]
    fn a_sample_read_before_its_exec_waits_for_it() {
        let pid = std::process::id();
        let mut procs = ProcessTable::new(8);
        let mut unwinder = Unwinder::new();
        let mut cpu = CpuWindow::default();
        let mut waiting = WaitingSamples::default();
        assert!(procs.snapshot(pid));
        procs.note_start(pid, 100);
        let (waited, unheard) = (
            SAMPLES_WAITED_FOR_IMAGE.load(Ordering::Relaxed),
            SAMPLES_IMAGE_UNHEARD.load(Ordering::Relaxed),
        );

        take_stack_sample(
            &sample(pid, 150, 100),
            None,
            &mut procs,
            &mut unwinder,
            &mut cpu,
            &mut waiting,
        );
        // The exec at 300: a sample of the new image read before its event.
        take_stack_sample(
            &sample(pid, 310, 300),
            None,
            &mut procs,
            &mut unwinder,
            &mut cpu,
            &mut waiting,
        );
        assert_eq!(generations(&cpu), [0]);
        assert_eq!(waiting.samples.len(), 1);
        waiting.add_known(&mut procs, &mut unwinder, &mut cpu, false);
        assert_eq!(waiting.samples.len(), 1, "still no event");

        // The exec's event, as take_proc_events applies it.
        procs.note_start(pid, 300);
        procs.retire(pid, 300);
        assert!(procs.snapshot(pid));
        waiting.add_known(&mut procs, &mut unwinder, &mut cpu, false);
        assert_eq!(generations(&cpu), [0, 1]);
        assert!(waiting.samples.is_empty());

        // An exec whose event never comes: added when the window closes.
        take_stack_sample(
            &sample(pid, 410, 400),
            None,
            &mut procs,
            &mut unwinder,
            &mut cpu,
            &mut waiting,
        );
        assert_eq!(waiting.samples.len(), 1);
        waiting.add_known(&mut procs, &mut unwinder, &mut cpu, true);
        assert!(waiting.samples.is_empty());
        assert_eq!(cpu.samples.values().sum::<u64>(), 3);
        assert_eq!(SAMPLES_WAITED_FOR_IMAGE.load(Ordering::Relaxed) - waited, 2);
        assert_eq!(SAMPLES_IMAGE_UNHEARD.load(Ordering::Relaxed) - unheard, 1);

        // Bounded: beyond MAX_WAITING_SAMPLES, a sample is added at once.
        for _ in 0..MAX_WAITING_SAMPLES + 1 {
            take_stack_sample(
                &sample(pid, 510, 500),
                None,
                &mut procs,
                &mut unwinder,
                &mut cpu,
                &mut waiting,
            );
        }
        assert_eq!(waiting.samples.len(), MAX_WAITING_SAMPLES);
        assert_eq!(SAMPLES_IMAGE_UNHEARD.load(Ordering::Relaxed) - unheard, 2);
    }
}
