//! The goroutine profile: at each window's end, the live goroutines of
//! every Go process profiled, counted by stack, state, wait reason and
//! pprof labels, as Go's own goroutine profile (`/debug/pprof/goroutine`)
//! counts them. The goroutines are read from the processes' memory
//! (`procs::goroutines`); nothing runs in the kernel for this profile.

use std::sync::Arc;

use foldhash::HashMap;

use crate::bpf::drain::{SampleId, Stack};
use crate::bpf::go_labels::push_go_labels;
use crate::config::Settings;
use crate::model::frames::Frame;
use crate::model::go_wait_reasons;
use crate::model::profile_kind::ProfileKind;
use crate::procs::goroutines::{Goroutine, GoroutineReader, Labels, Unread, status};
use crate::procs::process::ProcessTable;
use crate::profiles::pprof::ProfileBuilder;
use crate::profiles::samples::{marker_frame, prefetch_user_stack, push_stack, sample_labels};
use crate::stacks::symbolize::Symbolizer;

/// Goroutines that share a stack, a state, a wait reason and labels.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Group {
    tgid: u32,
    generation: u32,
    frames: Arc<[u64]>,
    status: u32,
    /// `go_wait_reasons::reason_key` of a waiting goroutine, else 0.
    wait: u16,
    labels: Option<Labels>,
}

/// Builds the goroutine profile of Go processes `pids` (others are passed
/// over), read now.
pub(crate) fn build_goroutine_profile(
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    reader: &mut GoroutineReader,
    pids: &[u32],
    time_nanos: i64,
    duration_nanos: i64,
) -> pprof_proto::Profile {
    let mut groups: HashMap<Group, i64> = HashMap::default();
    for &tgid in pids {
        let (release, goroutines) = match reader.read(tgid) {
            Ok(read) => read,
            Err(Unread::NotGo | Unread::Gone) => continue,
            Err(why) => {
                tracing::debug!(target: "profilerd::session", "goroutines of process {tgid} not read: {why:?}");
                continue;
            }
        };
        procs.ensure(tgid);
        let generation = procs.generation(tgid);
        for goroutine in goroutines {
            *groups
                .entry(group(tgid, generation, release, goroutine))
                .or_insert(0) += 1;
        }
    }
    let ids: Vec<(SampleId, &Group, i64)> = groups
        .iter()
        .map(|(group, &count)| (sample_id(procs, group), group, count))
        .collect();
    for (id, _, _) in &ids {
        prefetch_user_stack(symbolizer, procs, id);
    }
    symbolizer.resolve_prefetched();
    let mut builder = ProfileBuilder::new(ProfileKind::Goroutine, 1, time_nanos, duration_nanos);
    let mut frames: Vec<Frame> = Vec::with_capacity(128);
    for (id, group, count) in &ids {
        frames.clear();
        match group.frames.is_empty() {
            // Running: its stack is the thread's, not saved anywhere.
            true => frames.push(marker_frame("[running]".to_string())),
            false => push_stack(&mut frames, &id.user, "user", |ips, leaf_words| {
                symbolizer.user_walk_of(procs, (id.tgid, id.generation), ips, leaf_words, None)
            }),
        }
        let mut labels = sample_labels(settings, procs, id);
        labels.push(("state".to_string(), state_name(group.status).to_string()));
        if group.wait != 0 {
            let text = go_wait_reasons::key_text(group.wait).map_or_else(
                || go_wait_reasons::key_number(group.wait).to_string(),
                str::to_owned,
            );
            labels.push(("wait_reason".to_string(), text));
        }
        if let Some(set) = &group.labels {
            push_go_labels(&mut labels, set);
        }
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        builder.add_sample(&frames, &[*count], &labels);
    }
    builder.build()
}

fn group(tgid: u32, generation: u32, release: u32, goroutine: Goroutine) -> Group {
    let wait = match goroutine.status {
        status::WAITING => go_wait_reasons::reason_key(Some(release), goroutine.wait_reason),
        _ => 0,
    };
    Group {
        tgid,
        generation,
        frames: Arc::from(goroutine.frames),
        status: goroutine.status,
        wait,
        labels: goroutine.labels,
    }
}

/// The sample of a group: a parked goroutine runs on no thread, so its
/// `tid` is the process's and its `thread` the process's name.
fn sample_id(procs: &ProcessTable, group: &Group) -> SampleId {
    let mut thread = [0u8; profiler_common::COMM_LEN];
    if let Some(image) = procs.get_image(group.tgid, group.generation) {
        let name = image.comm.as_bytes();
        let n = name.len().min(thread.len() - 1);
        thread[..n].copy_from_slice(&name[..n]);
    }
    SampleId {
        tgid: group.tgid,
        generation: group.generation,
        tid: group.tgid,
        thread,
        user: match group.frames.is_empty() {
            true => Stack::None,
            false => Stack::FramePointer(Arc::clone(&group.frames), [0; 2]),
        },
        kernel: Stack::None,
        object: 0,
        cond: 0,
        go_labels: 0,
        go_wait: group.wait,
        python: None,
        jit_quarter: 0,
    }
}

/// A goroutine state as Go's own goroutine dump names it.
fn state_name(status: u32) -> &'static str {
    match status {
        status::RUNNABLE => "runnable",
        status::RUNNING => "running",
        status::SYSCALL => "syscall",
        status::WAITING => "waiting",
        status::COPYSTACK => "copystack",
        status::PREEMPTED => "preempted",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_goroutines_keep_their_reason_and_others_do_not() {
        let parked = |status, reason| Goroutine {
            status,
            wait_reason: reason,
            frames: vec![1, 2],
            labels: None,
        };
        // Go 1.19: waitReason 14 is "chan receive".
        let waiting = group(1, 0, 19, parked(status::WAITING, 14));
        assert_eq!(
            go_wait_reasons::key_text(waiting.wait),
            Some("chan receive")
        );
        assert_eq!(group(1, 0, 19, parked(status::RUNNABLE, 14)).wait, 0);
        assert_eq!(state_name(status::SYSCALL), "syscall");
    }
}
