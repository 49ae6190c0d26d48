//! The CPU profile: drains the double-buffered counts and stacks of
//! frame-pointer samples and reads the stack-copy samples into the window,
//! then builds the window's profile.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use profiler_common::{MAX_STACK_DEPTH, SHORT_STACK_BYTES, StackSample};

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
use crate::profiles::samples::{prefetch_user_stack, push_stack, sample_labels};
use crate::stacks::symbolize::Symbolizer;
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
            since => procs.generation_at(tgid, since),
        }),
        Err(e) => tracing::warn!(target: "profilerd::session", "{e}"),
    }
}

/// CPU samples and sampled allocations received in the short record form
/// (for the exit summary).
pub(crate) static SHORT_RECORDS: AtomicU64 = AtomicU64::new(0);

/// Unwinds every sample that came with a copy of its user stack and adds it
/// to the window.
pub(crate) fn read_stack_samples(
    ring: &mut Ring,
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

pub(crate) fn add_stack_sample<const N: usize>(
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
        go_labels: 0,
        go_wait: 0,
    });
}

pub(crate) fn build_cpu_profile(
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    cpu: &mut CpuWindow,
    time_nanos: i64,
    duration_nanos: i64,
) -> pprof_proto::Profile {
    let period = 1_000_000_000 / settings.cpu_frequency.max(1) as i64;
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
            symbolizer.user_walk_of(procs, (id.tgid, id.generation), ips, leaf_words)
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
