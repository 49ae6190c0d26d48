//! Turns what the kernel buffers held into one window's CPU samples: counts
//! keyed by process, thread and resolved stacks, merged across drains.

use foldhash::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use profiler_common::{COMM_LEN, STACK_LOST, STACK_NONE, SampleKey, StackHash};

use crate::bpf::go_labels::GoLabelSets;
use crate::bpf::probes::Drained;
use crate::model::frames::PyLoc;
use crate::model::taps::Taps;

/// What became of one of the two stacks of a sample.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stack {
    /// Instruction pointers, leaf first.
    Frames(Arc<[u64]>),
    /// Instruction pointers, leaf first, of a walk that stopped before the
    /// root.
    Truncated(Arc<[u64]>),
    /// A user stack the kernel walked by frame pointers: whether it reached
    /// the root is only known once it is symbolized. With the words at the
    /// stack pointer that may hold a leaf's return address
    /// (`SampleKey::leaf_words`; zeros where there are none).
    FramePointer(Arc<[u64]>, [u64; 2]),
    /// There is none (kernel thread, or a sample taken in user mode).
    None,
    /// The kernel could not record it (stack map full, or the walk failed),
    /// or it was gone when drained.
    Lost,
}

/// The time unit of [`SampleId::jit_quarter`].
const JIT_QUARTER_NS: u64 = 250_000_000;

/// Identity of an aggregated sample within a window.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SampleId {
    pub tgid: u32,
    /// Which image of the process ran (`ProcessTable::generation`).
    pub generation: u32,
    pub tid: u32,
    pub thread: [u8; COMM_LEN],
    pub user: Stack,
    pub kernel: Stack,
    /// The futex word a block or mutex event was about (0: none).
    pub object: u64,
    /// The condition variable a block event waited on (0: none).
    pub cond: u64,
    /// The goroutine's pprof label set (an id of `GoLabelSets`; 0: none).
    pub go_labels: u64,
    /// A goroutine's park: its `waitReason` number plus one (0: none).
    pub go_wait: u16,
    /// The Python frames of a CPython thread, leaf first, settled (see
    /// `PyLoc`), when the kernel read them.
    pub python: Option<Arc<[PyLoc]>>,
    /// For a process with JIT code, the quarter second (of
    /// CLOCK_MONOTONIC, plus one) in which the sample was taken, by which
    /// its JIT frames are named (`Symbolizer::user_stack_of`); 0: unknown,
    /// or no JIT code. Coarser than the sample's time so that samples of
    /// one stack stay one key, finer than the maps' reads (each second).
    pub jit_quarter: u32,
}

impl SampleId {
    /// The thread name as label text, up to its NUL: lossy, with control
    /// characters escaped (see `text::display_name`).
    pub fn thread_name(&self) -> String {
        crate::model::text::display_name(&self.thread)
    }

    /// The quarter second of kernel time `time_ns`, for
    /// [`Self::jit_quarter`].
    pub fn jit_quarter_of(time_ns: u64) -> u32 {
        u32::try_from(time_ns / JIT_QUARTER_NS + 1).unwrap_or(u32::MAX)
    }

    /// The end of [`Self::jit_quarter`] (kernel time, ns), if known: its
    /// JIT code is named as it was by then.
    pub fn jit_time(&self) -> Option<u64> {
        (self.jit_quarter != 0).then(|| u64::from(self.jit_quarter) * JIT_QUARTER_NS)
    }
}

/// Samples of an on-demand capture's own events drained after it ended
/// (taken between its last drain and the closing of its events).
pub static SAMPLES_AFTER_CAPTURE: AtomicU64 = AtomicU64::new(0);

/// One window's CPU samples.
#[derive(Default, Debug)]
pub struct CpuWindow {
    pub samples: HashMap<SampleId, u64>,
    /// Stacks lost between the kernel recording them and the drain.
    pub missing_stacks: u64,

    /// Go label sets by id; carried from window to window (see
    /// `GoLabelSets::end_window`).
    pub go_labels: GoLabelSets,
    /// On-demand captures (`/debug/pprof/profile`): each gets a copy of
    /// the samples of its processes, beside the window, which stays as it
    /// would be without them.
    pub taps: Taps<SampleId, u64>,
}

impl CpuWindow {
    /// Merges one drained buffer into the window.
    /// Adds drained counts; `generation(tgid, image_since)` names the image
    /// each key's process ran (see `ProcessTable::generation_at`).
    pub fn absorb(&mut self, drained: Drained, generation: impl Fn(u32, u64) -> u32) {
        let Drained {
            counts,
            stacks,
            go_label_sets,
        } = drained;
        for (id, set) in go_label_sets {
            self.go_labels.insert(id, &set);
        }
        // Stacks shared by several keys are shared in memory too.
        let stacks: HashMap<StackHash, Arc<[u64]>> = stacks
            .into_iter()
            .map(|(hash, ips)| (hash, Arc::from(ips)))
            .collect();
        let mut missing = 0;
        let mut resolve = |hash: StackHash| -> Stack {
            match hash {
                STACK_NONE => Stack::None,
                STACK_LOST => Stack::Lost,
                _ => match stacks.get(&hash) {
                    Some(ips) if ips.is_empty() => Stack::None,
                    Some(ips) => Stack::Frames(ips.clone()),
                    None => {
                        missing += 1;
                        Stack::Lost
                    }
                },
            }
        };
        for (key, count) in counts {
            let user = match resolve(key.user_stack) {
                Stack::Frames(ips) => Stack::FramePointer(ips, key.leaf_words),
                other => other,
            };
            let kernel = resolve(key.kernel_stack);
            let mut id = sample_id(&key, user, kernel);
            id.generation = generation(key.tgid, key.image_since);
            self.add_counted(id, key.tap, count);
        }
        self.missing_stacks += missing;
    }

    /// Adds one sample whose stacks were resolved in the daemon, taken by
    /// the events of capture `tap` (0: the schedule's).
    pub fn add(&mut self, id: SampleId, tap: u64) {
        self.add_counted(id, tap, 1);
    }

    /// Adds `count` samples of `id`: those of the schedule's events to the
    /// window and the taps that share it, those of a capture's own events
    /// (`tap`) to that capture only.
    fn add_counted(&mut self, id: SampleId, tap: u64, count: u64) {
        if tap != 0 {
            if !self.taps.add_own(tap, &id, |n| *n += count) {
                // Its capture ended between the sample and the drain.
                SAMPLES_AFTER_CAPTURE.fetch_add(count, Ordering::Relaxed);
            }
            return;
        }
        self.taps.add(id.tgid, &id, |n| *n += count);
        if self.taps.window_wants(id.tgid) {
            *self.samples.entry(id).or_insert(0) += count;
        }
    }

    /// Total samples in the window.
    #[cfg(test)]
    pub fn total(&self) -> u64 {
        self.samples.values().sum()
    }
}

fn sample_id(key: &SampleKey, user: Stack, kernel: Stack) -> SampleId {
    SampleId {
        tgid: key.tgid,
        generation: 0,
        tid: key.tid,
        thread: key.comm,
        user,
        kernel,
        object: 0,
        cond: 0,
        go_labels: key.go_labels,
        go_wait: 0,
        python: None,
        jit_quarter: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user: StackHash, kernel: StackHash) -> SampleKey {
        let mut comm = [0u8; COMM_LEN];
        comm[..4].copy_from_slice(b"work");
        SampleKey {
            tgid: 10,
            tid: 11,
            user_stack: user,
            kernel_stack: kernel,
            comm,
            image_since: 0,
            leaf_words: [0; 2],
            go_labels: 0,
            tap: 0,
        }
    }

    #[test]
    fn merges_drains_and_resolves_stacks() {
        let mut window = CpuWindow::default();
        for _ in 0..2 {
            let mut stacks = std::collections::HashMap::new();
            stacks.insert(3, vec![0x1000, 0x2000]);
            window.absorb(
                Drained {
                    go_label_sets: Vec::new(),
                    counts: vec![
                        (key(3, STACK_NONE), 5),
                        (key(STACK_LOST, STACK_NONE), 1),
                        (key(9, 3), 2),
                    ],
                    stacks,
                },
                |_, _| 0,
            );
        }
        assert_eq!(window.total(), 16);
        let ok = SampleId {
            tgid: 10,
            generation: 0,
            tid: 11,
            thread: key(0, 0).comm,
            user: Stack::FramePointer(Arc::from(vec![0x1000u64, 0x2000]), [0; 2]),
            kernel: Stack::None,
            object: 0,
            cond: 0,
            go_labels: 0,
            go_wait: 0,
            python: None,
            jit_quarter: 0,
        };
        assert_eq!(window.samples[&ok], 10);
        assert_eq!(ok.thread_name(), "work");
        let lost = SampleId {
            user: Stack::Lost,
            ..ok.clone()
        };
        assert_eq!(window.samples[&lost], 2);
        // Stack 9 was not in the map: lost, while stack 3 resolves.
        assert_eq!(window.missing_stacks, 2);
        let partly = SampleId {
            user: Stack::Lost,
            kernel: Stack::Frames(Arc::from(vec![0x1000u64, 0x2000])),
            ..ok
        };
        assert_eq!(window.samples[&partly], 4);
    }
}
