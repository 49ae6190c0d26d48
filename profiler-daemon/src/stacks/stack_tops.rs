//! Where each thread's stack ends, learned from complete walks, so that the
//! kernel's stack copies stop there.
//!
//! The kernel copies a thread's stack from sp up to the top it knows for
//! the thread (`STACK_TOPS`), else STACK_COPY_BYTES. Memory above a
//! thread's stack is usually readable (the thread's TLS, a library,
//! another thread's stack), so without a known top every copy reads all of
//! it: 9–13 KiB per copy in the benchmark, where the walk reads a few
//! hundred bytes. A complete walk reads up to the outermost frame
//! (`_start`, `clone3`), which stays where it is for the thread's life, so
//! the highest word it read bounds every later walk of that thread.
//!
//! Within a window a thread's top is only raised. A walk cut short by the
//! end of its copy (a top learned too low, from a walk that ended early)
//! takes the top back, and the thread is not learned again until the
//! window ends. Tops are sent again each window, as the kernel drops a
//! thread's entry when it exits and its id may come back.
//!
//! A walk cut by the end of a whole usual copy (not one stopped at a top)
//! marks its thread deep (`DEEP_THREADS`): the kernel then copies up to
//! LONG_STACK_BYTES of it, in the long record form. An event loop keeps
//! such a thread there for its life: libuv's `uv__io_poll` holds 12 KiB of
//! epoll events in its frame, so a Node main thread's walks from inside
//! it ran out of the copy before reaching `main`. A mark is sent once a
//! window, like a top; a walk cut even in a long copy is counted.

use crate::bpf::probes::TopUpdate;
use profiler_common::LONG_STACK_BYTES;
use std::collections::{HashMap, HashSet};

/// Counters of learned tops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopStats {
    /// Tops given to the kernel.
    pub sent: u64,
    /// Tops taken back: a walk needed more than the copy held.
    pub taken_back: u64,
    /// Updates dropped because too many were pending.
    pub dropped: u64,
    /// Threads marked deep (a mark per thread and window).
    pub deep_marked: u64,
    /// Walks cut by the end of a long copy: deeper than it holds.
    pub cut_past_long: u64,
}

/// Marks a thread whose top was taken back this window.
const TAKEN_BACK: u64 = u64::MAX;

/// The tops learned and not yet given to the kernel; see the module docs.
pub struct StackTops {
    /// Tops sent this window, by thread.
    sent: HashMap<u32, u64>,
    /// Threads marked deep this window.
    deep: HashSet<u32>,
    pending: Vec<TopUpdate>,
    max_threads: usize,
    stats: TopStats,
}

impl StackTops {
    /// Remembers at most `max_threads` threads per window.
    pub fn new(max_threads: usize) -> Self {
        Self {
            sent: HashMap::new(),
            deep: HashSet::new(),
            pending: Vec::new(),
            max_threads: max_threads.max(1),
            stats: TopStats::default(),
        }
    }

    /// A complete walk of thread `tid` read nothing at or above `top`.
    pub fn learned(&mut self, tid: u32, top: u64) {
        if tid == 0 || self.sent.get(&tid).is_some_and(|&known| known >= top) {
            return;
        }
        if self.sent.len() >= self.max_threads && !self.sent.contains_key(&tid) {
            // Sending a top again costs one map update: forget them all.
            self.sent.clear();
        }
        self.sent.insert(tid, top);
        self.push(TopUpdate::Set { tid, top });
    }

    /// A walk of thread `tid` needed a word beyond the end of its copy.
    pub fn cut_short(&mut self, tid: u32) {
        match self.sent.get(&tid) {
            Some(&TAKEN_BACK) | None => {}
            Some(_) => {
                self.sent.insert(tid, TAKEN_BACK);
                self.stats.taken_back += 1;
                self.push(TopUpdate::Clear { tid });
            }
        }
    }

    /// A walk of thread `tid` was cut by the end of a copy of `copied`
    /// bytes that no top had shortened: the thread is marked deep, or,
    /// when the copy was already a long one, the cut is counted.
    pub fn cut_at_copy_end(&mut self, tid: u32, copied: usize) {
        if copied >= LONG_STACK_BYTES {
            self.stats.cut_past_long += 1;
            return;
        }
        if tid == 0 || self.deep.contains(&tid) {
            return;
        }
        if self.deep.len() >= self.max_threads {
            self.deep.clear();
        }
        self.deep.insert(tid);
        self.stats.deep_marked += 1;
        self.push(TopUpdate::Deep { tid });
    }

    fn push(&mut self, update: TopUpdate) {
        if self.pending.len() >= self.max_threads {
            self.stats.dropped += 1;
            return;
        }
        if matches!(update, TopUpdate::Set { .. }) {
            self.stats.sent += 1;
        }
        self.pending.push(update);
    }

    /// The updates for the kernel, each given once.
    pub fn take(&mut self) -> Vec<TopUpdate> {
        std::mem::take(&mut self.pending)
    }

    /// A new window: every thread may be learned (and sent) again.
    pub fn new_window(&mut self) {
        self.sent.clear();
        self.deep.clear();
    }

    pub fn stats(&self) -> TopStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_top_is_sent_once_and_only_raised() {
        let mut tops = StackTops::new(8);
        tops.learned(7, 0x7000);
        tops.learned(7, 0x7000);
        tops.learned(7, 0x6ff0);
        assert_eq!(
            tops.take(),
            [TopUpdate::Set {
                tid: 7,
                top: 0x7000
            }]
        );
        tops.learned(7, 0x7010);
        assert_eq!(
            tops.take(),
            [TopUpdate::Set {
                tid: 7,
                top: 0x7010
            }]
        );
        assert!(tops.take().is_empty());
        // No thread id: nothing to key the kernel's entry by.
        tops.learned(0, 0x7000);
        assert!(tops.take().is_empty());
        // Each window sends again.
        tops.new_window();
        tops.learned(7, 0x7010);
        assert_eq!(tops.take().len(), 1);
        assert_eq!(tops.stats().sent, 3);
    }

    #[test]
    fn a_walk_cut_short_takes_the_top_back_for_the_window() {
        let mut tops = StackTops::new(8);
        // Nothing was sent for this thread: its copies are not cut.
        tops.cut_short(3);
        assert!(tops.take().is_empty());
        tops.learned(3, 0x5000);
        tops.cut_short(3);
        assert_eq!(
            tops.take(),
            [
                TopUpdate::Set {
                    tid: 3,
                    top: 0x5000
                },
                TopUpdate::Clear { tid: 3 }
            ]
        );
        tops.learned(3, 0x6000);
        tops.cut_short(3);
        assert!(tops.take().is_empty());
        tops.new_window();
        tops.learned(3, 0x6000);
        assert_eq!(
            tops.take(),
            [TopUpdate::Set {
                tid: 3,
                top: 0x6000
            }]
        );
        assert_eq!(tops.stats().taken_back, 1);
    }

    #[test]
    fn a_walk_cut_at_a_whole_copy_marks_its_thread_deep_once_a_window() {
        let mut tops = StackTops::new(8);
        tops.cut_at_copy_end(5, 16 * 1024);
        tops.cut_at_copy_end(5, 8 * 1024);
        assert_eq!(tops.take(), [TopUpdate::Deep { tid: 5 }]);
        // Cut again in a long copy: deeper than it holds, counted.
        tops.cut_at_copy_end(5, LONG_STACK_BYTES);
        assert!(tops.take().is_empty());
        // No thread id: nothing to key the kernel's entry by.
        tops.cut_at_copy_end(0, 16 * 1024);
        assert!(tops.take().is_empty());
        tops.new_window();
        tops.cut_at_copy_end(5, 16 * 1024);
        assert_eq!(tops.take(), [TopUpdate::Deep { tid: 5 }]);
        let stats = tops.stats();
        assert_eq!((stats.deep_marked, stats.cut_past_long), (2, 1));
    }

    #[test]
    fn bounded() {
        let mut tops = StackTops::new(4);
        for tid in 1..=10 {
            tops.learned(tid, 0x1000);
            assert!(tops.sent.len() <= 4);
        }
        assert_eq!(tops.take().len(), 4);
        assert_eq!(tops.stats().dropped, 6);
    }
}
