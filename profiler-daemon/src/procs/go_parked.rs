//! Goroutines still parked when their process's park-probe window closed
//! (`bpf::park_budget`), followed in the process's memory until they run
//! again. Under the park budget the probes are detached between windows,
//! so the kernel sees only the waits that begin and end inside one; a
//! wait longer than what is left of its window would go unseen, and the
//! long waits of a program (a test driver waiting for its benchmark, a
//! worker waiting for work) would be missing from its block profile.
//! Followed here, every wait that begins in a window is seen to its end,
//! and weighs the period over the window whatever its length
//! (`profiles::waits::ParkWindows`).
//!
//! A parked goroutine's `g` keeps its state (`atomicstatus`) and the
//! reason it waits (`waitreason`) until it is readied, and the runtime
//! adds one to its `trackingSeq` byte each time it stops running, so a
//! goroutine readied and parked again between two readings is told from
//! one that never ran (unless it parked a multiple of 256 times between
//! them). It is read every 1/[`POLL_SHARE`] of the time it has waited so
//! far (at least [`MIN_POLL`]), and its wait ends halfway between the
//! last reading that found it waiting and the first that did not, within
//! that share of its length.
//! Its stack, return address at the park and frame-pointer chain, is read
//! once when it is taken, as the kernel reads it at the ready: a parked
//! goroutine's stack does not change. A goroutine whose process exits
//! is let go at the next reading, which fails (counted as `gone`).

use std::time::Duration;

use foldhash::HashMap;
use profiler_common::{GoPark, MAX_STACK_DEPTH};

use crate::bpf::park_budget::LeftOpen;
use crate::procs::goroutines::{
    GoroutineLayout, GoroutineReader, Labels, labels_at, push_fp_chain, status,
};
use crate::procs::memory::Memory;

/// Goroutines followed at once, over every process; more are counted
/// (`FollowStats::not_followed`) and their waits go unseen.
pub const MAX_FOLLOWED: usize = 8192;
/// The shortest time between two readings of a goroutine.
const MIN_POLL: Duration = Duration::from_millis(1);
/// A goroutine is read again after 1/POLL_SHARE of the time it has
/// waited: its wait's end is known within that share of its length, and
/// a wait of length L costs some POLL_SHARE × ln(L / MIN_POLL) readings.
const POLL_SHARE: u64 = 16;
/// `_Gscan`: set on a state while the collector scans the goroutine.
const G_SCAN: u32 = 0x1000;

/// A followed wait that ended.
#[derive(Clone, Debug)]
pub struct Ended {
    pub tgid: u32,
    pub park: GoPark,
    /// When it ended (kernel monotonic time).
    pub end_ns: u64,
    /// Its stack as the kernel sends a goroutine's wait: the return
    /// address at its park, then the frame-pointer chain.
    pub frames: Vec<u64>,
    /// Its pprof labels when it was taken.
    pub labels: Option<Labels>,
}

/// What the follower did, for the exit summary.
#[derive(Clone, Copy, Debug, Default)]
pub struct FollowStats {
    /// Goroutines taken to follow.
    pub followed: u64,
    /// Waits followed to their end.
    pub ended: u64,
    /// Goroutines not followed: too many at once, a release whose layout
    /// is not known, or a `g` that could not be read.
    pub not_followed: u64,
    /// Goroutines whose process exited while they waited.
    pub gone: u64,
    /// Most goroutines followed at once.
    pub most: u64,
}

struct Followed {
    open: LeftOpen,
    layout: GoroutineLayout,
    wait_reason: u8,
    tracking_seq: u8,
    frames: Vec<u64>,
    labels: Option<Labels>,
    /// The last reading that found it waiting, and the next one due.
    waiting_at_ns: u64,
    next_ns: u64,
}

/// The goroutines followed, and the layouts of their releases.
#[derive(Default)]
pub struct ParkedFollower {
    reader: GoroutineReader,
    followed: Vec<Followed>,
    pub stats: FollowStats,
}

impl ParkedFollower {
    /// Takes the parks of a window that closed at `now_ns`; those readied
    /// since end now.
    pub fn take(&mut self, parks: Vec<LeftOpen>, now_ns: u64) -> Vec<Ended> {
        let mut ended = Vec::new();
        let mut memories: HashMap<u32, Option<Memory>> = HashMap::default();
        for open in parks {
            if self.followed.len() >= MAX_FOLLOWED {
                self.stats.not_followed += 1;
                continue;
            }
            let Ok(layout) = self.reader.layout(open.tgid) else {
                self.stats.not_followed += 1;
                continue;
            };
            let Some(mem) = memories
                .entry(open.tgid)
                .or_insert_with(|| Memory::open(open.tgid))
            else {
                self.stats.gone += 1;
                continue;
            };
            let Some(state) = read_state(mem, &layout, open.g) else {
                self.stats.not_followed += 1;
                continue;
            };
            self.stats.followed += 1;
            // Followed from an earlier window, it ran and parked again
            // since: that wait ended before this one began.
            if let Some(at) = self
                .followed
                .iter()
                .position(|f| (f.open.tgid, f.open.g) == (open.tgid, open.g))
            {
                let earlier = self.followed.swap_remove(at);
                let end = ended_at(earlier.waiting_at_ns, open.park.start_ns);
                ended.push(self.end(earlier, end));
            }
            let followed = Followed {
                frames: park_frames(mem, &open.park),
                labels: labels_at(mem, &layout, state.labels),
                layout,
                wait_reason: state.wait_reason,
                tracking_seq: state.tracking_seq,
                waiting_at_ns: open.window_end_ns,
                next_ns: now_ns,
                open,
            };
            if state.waiting && u32::from(state.wait_reason) == open.park.reason {
                self.followed.push(followed);
            } else {
                let end = ended_at(followed.waiting_at_ns, now_ns);
                ended.push(self.end(followed, end));
            }
        }
        for f in &mut self.followed {
            f.next_ns = f.next_ns.max(next_reading(f.open.park.start_ns, now_ns));
        }
        self.stats.most = self.stats.most.max(self.followed.len() as u64);
        ended
    }

    /// When the next goroutine is due to be read (kernel monotonic time).
    pub fn next_due_ns(&self) -> Option<u64> {
        self.followed.iter().map(|f| f.next_ns).min()
    }

    /// Reads the goroutines due by `now_ns`; returns the waits that ended.
    pub fn poll(&mut self, now_ns: u64) -> Vec<Ended> {
        let mut ended = Vec::new();
        let mut memories: HashMap<u32, Option<Memory>> = HashMap::default();
        let mut kept = Vec::with_capacity(self.followed.len());
        for mut f in std::mem::take(&mut self.followed) {
            if f.next_ns > now_ns {
                kept.push(f);
                continue;
            }
            let state = memories
                .entry(f.open.tgid)
                .or_insert_with(|| Memory::open(f.open.tgid))
                .as_ref()
                .and_then(|mem| read_state(mem, &f.layout, f.open.g));
            match state {
                // Gone with its process: Go never reports that wait either.
                None => self.stats.gone += 1,
                Some(s)
                    if s.waiting
                        && (s.wait_reason, s.tracking_seq) == (f.wait_reason, f.tracking_seq) =>
                {
                    f.waiting_at_ns = now_ns;
                    f.next_ns = next_reading(f.open.park.start_ns, now_ns);
                    kept.push(f);
                }
                Some(_) => {
                    let end = ended_at(f.waiting_at_ns, now_ns);
                    ended.push(self.end(f, end));
                }
            }
        }
        self.followed = kept;
        ended
    }

    /// The wait of `f`, ended at `end_ns`.
    fn end(&mut self, f: Followed, end_ns: u64) -> Ended {
        self.stats.ended += 1;
        Ended {
            tgid: f.open.tgid,
            park: f.open.park,
            end_ns: end_ns.max(f.open.park.start_ns),
            frames: f.frames,
            labels: f.labels,
        }
    }
}

/// Where a wait found over at `now_ns`, and waiting at `waiting_at_ns`,
/// ended: halfway, so that the readings' delay is no bias.
fn ended_at(waiting_at_ns: u64, now_ns: u64) -> u64 {
    waiting_at_ns.min(now_ns) + now_ns.saturating_sub(waiting_at_ns) / 2
}

/// When a goroutine parked at `start_ns` is next read, at `now_ns`.
fn next_reading(start_ns: u64, now_ns: u64) -> u64 {
    let waited = now_ns.saturating_sub(start_ns);
    now_ns + (waited / POLL_SHARE).max(MIN_POLL.as_nanos() as u64)
}

/// What is read of a `g` at each reading.
struct State {
    waiting: bool,
    wait_reason: u8,
    tracking_seq: u8,
    /// `g.labels`.
    labels: u64,
}

fn read_state(mem: &Memory, layout: &GoroutineLayout, g: u64) -> Option<State> {
    let mut bytes = vec![0u8; layout.span()];
    if !mem.read(g, &mut bytes) {
        return None;
    }
    let u64_at = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
    let state = u32::from_le_bytes(
        bytes
            .get(layout.status..layout.status + 4)?
            .try_into()
            .ok()?,
    );
    Some(State {
        waiting: state & !G_SCAN == status::WAITING,
        wait_reason: *bytes.get(layout.wait_reason)?,
        tracking_seq: *bytes.get(layout.tracking_seq)?,
        labels: u64_at(layout.labels).unwrap_or(0),
    })
}

/// A parked goroutine's frames as the kernel's record of its wait holds
/// them: the return address at `runtime.gopark`'s entry, then the return
/// addresses of the frame-pointer chain from its caller's frame pointer.
fn park_frames(mem: &Memory, park: &GoPark) -> Vec<u64> {
    let mut frames = Vec::with_capacity(32);
    let Some(ret) = mem.u64(park.sp) else {
        return frames;
    };
    frames.push(ret);
    push_fp_chain(&mut frames, MAX_STACK_DEPTH, park.bp, |at| mem.pair(at));
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_halfway_between_two_readings() {
        assert_eq!(ended_at(1_000, 3_000), 2_000);
        // Found over at once: at the reading.
        assert_eq!(ended_at(5_000, 5_000), 5_000);
    }

    #[test]
    fn readings_thin_out_as_a_wait_grows() {
        let ms = 1_000_000;
        // Early on, every millisecond.
        assert_eq!(next_reading(0, 4 * ms), 5 * ms);
        // After 1.6 s, every 100 ms.
        assert_eq!(next_reading(0, 1_600 * ms), 1_700 * ms);
        // Readings of a wait of 10 s from 10 ms on: some POLL_SHARE ×
        // ln(1000) of them.
        let (mut at, mut readings) = (10 * ms, 0);
        while at < 10_000 * ms {
            at = next_reading(0, at);
            readings += 1;
        }
        assert!((100..=130).contains(&readings), "{readings}");
    }
}
