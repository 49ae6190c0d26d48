//! The block, mutex and off-CPU profiles: their records decoded from the
//! wait ring (full, brief, delays, off-CPU), kept waits by the waiter's
//! stack (block.rs, for block and off-CPU), kept contended wake-ups by the
//! waker's stack with the delays of the waits they ended (mutex.rs), and
//! each window's profiles built. Rescaling follows Go
//! (`rescale::block_event`, `rescale::mutex_event`), and a goroutine wait
//! seen in a duty-cycled park-probe window is weighted by its chance to
//! be seen (park_windows.rs).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aya::maps::{HashMap as AyaHashMap, MapData};
use foldhash::HashMap;
use profiler_common::sampling::keep_block_event;
use profiler_common::{
    LONG_STACK_BYTES, MAX_STACK_DEPTH, MutexDelay, OFFCPU_KERNEL_DEPTH, OffcpuRecord,
    STACK_COPY_BYTES, WAIT_PY_FRAMES, WaitHead, WaitStack, WalkHint, WalkHintKey, wait_event,
    wait_flags,
};

use crate::bpf::drain::{SampleId, Stack};
use crate::bpf::go_labels::{GoLabelSets, add_go_labels};
use crate::bpf::ring::Ring;
use crate::config::Settings;
use crate::model::frames::Frame;
use crate::model::go_wait_reasons;
use crate::model::profile_kind::ProfileKind;
use crate::model::taps::Taps;
use crate::procs::go_parked::{Ended, ParkedFollower};
use crate::procs::go_runtime;
use crate::procs::process::ProcessTable;
use crate::profiles::cpu::{LONG_RECORDS, SHORT_RECORDS};
use crate::profiles::pprof::ProfileBuilder;
use crate::profiles::records::{
    Thread, brief_frames, hinted_user_stack, kernel_stack, matched_walk, python_tail, read_record,
    record,
};
use crate::profiles::rescale::{block_event, mutex_event};
use crate::profiles::samples::{
    PythonFrames, hide_go_park, hide_go_runtime, hide_go_wrappers, hide_sync_release,
    is_go_mutex_release, is_tracing_frame, prefetch_user_stack, push_stack, python_frames,
    sample_labels, user_frames,
};
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::symbolize::python::PythonCodes;
use crate::stacks::unwind::Unwinder;

mod block;
mod mutex;
mod park_windows;

pub use block::{BlockWindow, Weight};
pub use mutex::MutexTable;
pub use park_windows::{GO_WAITS_PAST_HALF_WINDOW, ParkWindows};

/// What the block and mutex profiles collect.
pub(crate) struct Waits {
    pub(crate) block: BlockWindow,
    pub(crate) offcpu: BlockWindow,
    pub(crate) mutex: MutexTable,
    pub(crate) block_rate_ns: u64,
    /// The kernel's walk hints, given each walk remembered for a wait.
    pub(crate) walk_hints: Option<AyaHashMap<MapData, WalkHintKey, WalkHint>>,
    /// The Go release of each process whose goroutines parked (read once;
    /// bounded by `GO_RELEASES_KEPT`).
    go_releases: HashMap<u32, Option<u32>>,
    /// The windows of duty-cycled Go park probes, by which the goroutine
    /// waits seen in them are weighted.
    pub(crate) park_windows: ParkWindows,
    /// Goroutines still parked when their window closed, followed to
    /// their wait's end.
    pub(crate) go_parked: ParkedFollower,
}

impl Waits {
    pub(crate) fn new(
        settings: &Settings,
        walk_hints: Option<AyaHashMap<MapData, WalkHintKey, WalkHint>>,
    ) -> Self {
        Waits {
            block: BlockWindow::default(),
            offcpu: BlockWindow::default(),
            mutex: MutexTable::new(settings.mutex_fraction),
            block_rate_ns: settings.block_rate.as_nanos() as u64,
            walk_hints,
            go_releases: HashMap::default(),
            park_windows: ParkWindows::default(),
            go_parked: ParkedFollower::default(),
        }
    }

    /// The user stack of a wait or off-CPU event (`flags`, `hint_id`: its
    /// `wait_flags` and the walk hint the kernel matched; `frames`: the
    /// frames it carries, `frames_len` as sent); a walk newly remembered is
    /// handed to the kernel as a hint.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn user_stack(
        &mut self,
        procs: &mut ProcessTable,
        unwinder: &mut Unwinder,
        thread: Thread,
        regs: (u64, u64, u64),
        stack: &[u8],
        (frames, frames_len): (&[u64], u64),
        (flags, hint_id): (u32, u64),
    ) -> Stack {
        let matched = matched_walk(flags, hint_id, frames, frames_len);
        // A goroutine's frames start with the return address it parked at.
        let at_return = flags & wait_flags::RETURN_ADDRESS != 0;
        let walked = &frames[..(frames_len as usize).min(frames.len())];
        let (user, hint) = hinted_user_stack(
            procs, unwinder, thread, regs, stack, walked, at_return, matched,
        );
        if let Some((key, hint)) = hint {
            self.hint(key, hint);
        }
        user
    }

    /// Gives the kernel a remembered walk's hint. A failed insert only
    /// means the kernel cannot vouch for that walk: the copy is checked
    /// here instead.
    pub(crate) fn hint(&mut self, key: WalkHintKey, hint: WalkHint) {
        if let Some(map) = &mut self.walk_hints
            && let Err(e) = map.insert(key, hint, 0)
        {
            tracing::debug!(target: "profilerd::session", "walk hint for process {} not stored: {e}", key.tgid);
        }
    }

    /// Takes back from the kernel the hints of walks about to be
    /// forgotten, so that it stops sending brief records for them.
    pub(crate) fn retire_hints(&mut self, unwinder: &mut Unwinder) {
        let retired = unwinder.take_retired_hints();
        if let Some(map) = &mut self.walk_hints {
            for key in &retired {
                // Gone already (evicted, or never stored): nothing to do.
                let _ = map.remove(key);
            }
        }
    }
}

/// Adds the kept waits, wake-ups and delays that the futex probes reported.
pub(crate) fn read_wait_events(
    ring: &mut Ring,
    codes: &mut PythonCodes,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    waits: &mut Waits,
) {
    while let Some(item) = ring.next() {
        // Every wait event starts with its kind.
        let Some(kind) = read_record::<u32>(&item) else {
            continue;
        };
        match kind {
            wait_event::OFFCPU => {
                // Two forms, told apart by their length, largest first.
                if let Some(event) = record::<OffcpuRecord<LONG_STACK_BYTES>>(&item) {
                    LONG_RECORDS.fetch_add(1, Ordering::Relaxed);
                    read_offcpu_event(event, codes, procs, unwinder, waits);
                } else if let Some(event) = record::<OffcpuRecord>(&item) {
                    read_offcpu_event(event, codes, procs, unwinder, waits);
                }
                continue;
            }
            wait_event::MUTEX_DELAY => {
                if let Some(delay) = read_record::<MutexDelay>(&item) {
                    waits.mutex.delay(delay.wake_id, delay.delay_ns);
                }
                continue;
            }
            wait_event::BLOCK | wait_event::MUTEX_WAKE => {}
            _ => continue,
        }
        let Some(head) = read_record::<WaitHead>(&item) else {
            continue;
        };
        // A CPython thread's record (full or brief) ends with its Python
        // frames, settled now, while the process lives.
        let has_python = head.flags & wait_flags::PYTHON != 0;
        let Some((item, python)) = python_tail::<WAIT_PY_FRAMES>(&item, has_python) else {
            continue;
        };
        let python = python.and_then(|p| python_frames(codes, head.tgid, p));
        // A brief record (its walk hint matched) carries the walk's frames
        // instead of a copy.
        let (stack, frames, frames_len): (&[u8], &[u64], u64) =
            if head.flags & wait_flags::BRIEF != 0 {
                let Some(frames) = brief_frames(item) else {
                    continue;
                };
                (&[], frames, frames.len() as u64)
            } else if let Some(event) = record::<WaitStack<LONG_STACK_BYTES>>(item) {
                // The long form of a thread marked deep.
                LONG_RECORDS.fetch_add(1, Ordering::Relaxed);
                (
                    &event.stack[..(event.stack_len as usize).min(LONG_STACK_BYTES)],
                    &event.frames,
                    event.frames_len.min(MAX_STACK_DEPTH as u64),
                )
            } else if let Some(event) = record::<WaitStack>(item) {
                (
                    &event.stack[..(event.stack_len as usize).min(STACK_COPY_BYTES)],
                    &event.frames,
                    event.frames_len.min(MAX_STACK_DEPTH as u64),
                )
            } else if let Some(event) = record::<WaitStack<0>>(item) {
                // Frames only: a goroutine's wait or release, walked in the
                // kernel (`[debug] short_records`).
                SHORT_RECORDS.fetch_add(1, Ordering::Relaxed);
                (
                    &[],
                    &event.frames,
                    event.frames_len.min(MAX_STACK_DEPTH as u64),
                )
            } else {
                continue;
            };
        add_wait(
            kind,
            &head,
            stack,
            (frames, frames_len),
            python,
            procs,
            unwinder,
            waits,
        );
    }
    waits.retire_hints(unwinder);
}

/// Adds one kept wait or wake-up (`kind`), its record's head and stack as
/// read from the ring.
#[allow(clippy::too_many_arguments)]
fn add_wait(
    kind: u32,
    event: &WaitHead,
    stack: &[u8],
    (frames, frames_len): (&[u64], u64),
    python: PythonFrames,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    waits: &mut Waits,
) {
    procs.ensure_child(event.tgid, event.parent);
    let generation = procs.generation_at(event.tgid, event.time_ns);
    // Registers saved at the system call: an exact instruction pointer;
    // a goroutine's frames start with the return address it parked at.
    let user = waits.user_stack(
        procs,
        unwinder,
        Thread {
            tgid: event.tgid,
            generation,
            tid: event.tid,
        },
        (event.ip, event.sp, event.bp),
        stack,
        (frames, frames_len),
        (event.flags, event.hint_id),
    );
    let id = SampleId {
        tgid: event.tgid,
        generation,
        tid: event.tid,
        thread: event.comm,
        user,
        kernel: Stack::None,
        object: event.uaddr,
        cond: event.cond,
        go_labels: event.go_labels,
        go_wait: go_wait_of(&mut waits.go_releases, event.tgid, event.flags),
        python,
        jit_quarter: 0,
    };
    if kind == wait_event::BLOCK
        && let Some(reason) = go_wait_reasons::key_text(id.go_wait)
        && !go_wait_reasons::counts_as_blocking(reason)
    {
        GO_PARKS_NOT_BLOCKING.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // A goroutine's wait seen in a duty-cycled window of its park
    // probes stands for the waits the window could not see.
    let go = event.flags & wait_flags::GO_WAIT_REASON != 0;
    if kind == wait_event::BLOCK {
        waits.mutex.note_cond_word(&id);
        let weight = match go {
            true => waits
                .park_windows
                .weight(id.tgid, event.time_ns, event.value),
            false => 1.0,
        };
        if weight == 0.0 {
            return;
        }
        waits
            .block
            .add_weighted(id, event.value, waits.block_rate_ns, weight);
    } else {
        let window = go
            .then(|| waits.park_windows.window_at(id.tgid, event.time_ns))
            .flatten();
        waits.mutex.wake_in_window(event.value, id, window);
    }
}

/// Goroutine waits followed past their park-probe window
/// (`procs::go_parked`), each added as the kernel's record of it would
/// have been: the same stack, reason, labels and weight.
pub(crate) fn add_followed_waits(
    ended: Vec<Ended>,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    waits: &mut Waits,
    go_labels: &mut GoLabelSets,
) {
    for wait in ended {
        let park = wait.park;
        // Kept as the kernel keeps a wait: one shorter than the block rate
        // with probability its length over the rate.
        let waited = wait.end_ns.saturating_sub(park.start_ns);
        if !keep_block_event(waited, waits.block_rate_ns, fastrand::u32(..)) {
            continue;
        }
        let head = WaitHead {
            kind: wait_event::BLOCK,
            tgid: wait.tgid,
            tid: park.tid,
            flags: wait_flags::RETURN_ADDRESS
                | wait_flags::GO_WAIT_REASON
                | park.reason << wait_flags::GO_REASON_SHIFT,
            parent: 0,
            _pad: 0,
            value: waited,
            uaddr: 0,
            ip: 0,
            sp: park.sp,
            bp: park.bp,
            hint_id: 0,
            time_ns: wait.end_ns,
            cond: 0,
            go_labels: wait.labels.map_or(0, |set| go_labels.insert_read(&set)),
            comm: park.comm,
        };
        let frames = (&wait.frames[..], wait.frames.len() as u64);
        add_wait(
            wait_event::BLOCK,
            &head,
            &[],
            frames,
            None,
            procs,
            unwinder,
            waits,
        );
    }
}

/// A kept off-CPU interval: the stacks at the thread's switch-out.
pub(crate) fn read_offcpu_event<const N: usize>(
    event: &OffcpuRecord<N>,
    codes: &mut PythonCodes,
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    waits: &mut Waits,
) {
    procs.ensure_child(event.tgid, event.parent);
    // The stacks are those at the switch-out.
    let generation = procs.generation_at(event.tgid, event.start_ns);
    let user = match event.sp {
        // A kernel thread.
        0 => Stack::None,
        _ => waits.user_stack(
            procs,
            unwinder,
            Thread {
                tgid: event.tgid,
                generation,
                tid: event.tid,
            },
            (event.ip, event.sp, event.bp),
            &event.stack[..(event.stack_len as usize).min(N)],
            (&event.frames, event.frames_len.min(MAX_STACK_DEPTH as u64)),
            (event.flags, event.hint_id),
        ),
    };
    let kernel =
        kernel_stack(&event.kernel[..(event.kernel_len as usize).min(OFFCPU_KERNEL_DEPTH)]);
    let id = SampleId {
        tgid: event.tgid,
        generation,
        tid: event.tid,
        thread: event.comm,
        user,
        kernel,
        object: 0,
        cond: 0,
        go_labels: event.go_labels,
        go_wait: 0,
        python: python_frames(codes, event.tgid, &event.python),
        jit_quarter: 0,
    };
    waits.offcpu.add(id, event.duration_ns, waits.block_rate_ns);
}

/// A goroutine park's reason from a wait record's flags, as
/// `SampleId::go_wait` keeps it (`go_wait_reasons::reason_key`; 0: not a
/// park), the process's Go release read once (`releases`).
fn go_wait_of(releases: &mut HashMap<u32, Option<u32>>, tgid: u32, flags: u32) -> u16 {
    if flags & wait_flags::GO_WAIT_REASON == 0 {
        return 0;
    }
    if releases.len() >= GO_RELEASES_KEPT {
        releases.clear();
    }
    let release = *releases
        .entry(tgid)
        .or_insert_with(|| go_runtime::go_release(tgid));
    go_wait_reasons::reason_key(release, (flags >> wait_flags::GO_REASON_SHIFT) as u8)
}

/// Processes whose Go release is remembered (the map is emptied when full).
const GO_RELEASES_KEPT: usize = 4096;

/// Futex waits and wake-ups of Go's runtime itself left out of block and
/// mutex profiles.
pub static GO_RUNTIME_FUTEXES: AtomicU64 = AtomicU64::new(0);

/// Whether a futex wait's or wake-up's stack (leaf first) is the Go
/// runtime's own futex call.
fn is_go_runtime_futex(frames: &[Frame]) -> bool {
    frames
        .iter()
        .find(|f| !f.lines.is_empty() || f.mapping.is_some())
        .and_then(|f| f.lines.last())
        .is_some_and(|line| line.function == "runtime.futex")
}

/// Goroutine releases left out of mutex profiles: a Go 1.19 or 1.20
/// semaphore release (whose waiters all park as `semacquire`) that is not
/// a sync.Mutex's or sync.RWMutex's unlock (a WaitGroup's, a poller's).
pub static GO_RELEASES_NOT_MUTEX: AtomicU64 = AtomicU64::new(0);

/// Goroutine parks left out of block profiles: their reason is one Go's
/// own block profile does not count (a sleep, I/O, the runtime's own).
pub static GO_PARKS_NOT_BLOCKING: AtomicU64 = AtomicU64::new(0);

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_wait_profile(
    kind: ProfileKind,
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    go_labels: &mut GoLabelSets,
    rows: &[(Arc<SampleId>, Weight)],
    time_nanos: i64,
    duration_nanos: i64,
) -> pprof_proto::Profile {
    let mut builder = ProfileBuilder::new(kind, 1, time_nanos, duration_nanos);
    let mut frames: Vec<Frame> = Vec::with_capacity(256);
    for (id, _) in rows {
        procs.ensure(id.tgid);
        prefetch_user_stack(symbolizer, procs, id);
    }
    symbolizer.resolve_prefetched();
    for (id, weight) in rows {
        frames.clear();
        procs.ensure(id.tgid);
        push_stack(&mut frames, &id.kernel, "kernel", |ips, _| {
            symbolizer.kernel_stack(ips)
        });
        // The switch-out stack starts inside the tracepoint that recorded
        // it; the thread blocked in the scheduler below.
        let tracing = frames.iter().take_while(|f| is_tracing_frame(f)).count();
        frames.drain(..tracing);
        push_stack(&mut frames, &id.user, "user", |ips, leaf_words| {
            user_frames(symbolizer, procs, id, ips, leaf_words)
        });
        if id.go_wait == 0 && is_go_runtime_futex(&frames) {
            // The Go runtime's own futex (an idle thread's sleep, or the
            // wake-up that lends it a goroutine readied elsewhere): not a
            // wait of the program's, and never in Go's own profiles.
            GO_RUNTIME_FUTEXES.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if kind == ProfileKind::Mutex && id.go_wait != 0 {
            // A goroutine's release, recorded inside the runtime's
            // semaphore code: from the exported sync method on, as Go's
            // mutex profile shows it.
            hide_go_runtime(&mut frames);
            hide_sync_release(&mut frames);
            hide_go_wrappers(&mut frames);
            // Before Go 1.21 every semaphore waiter parks alike: only the
            // unlocks Go's mutex profile counts stay.
            if go_wait_reasons::key_text(id.go_wait) == Some("semacquire")
                && !is_go_mutex_release(&frames)
            {
                GO_RELEASES_NOT_MUTEX.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        } else if id.go_wait != 0 {
            // A goroutine's park: from where Go's block profile starts.
            hide_go_park(&mut frames);
            hide_go_wrappers(&mut frames);
        }
        let mut labels = sample_labels(settings, procs, id);
        if id.go_wait != 0 {
            // As Go's goroutine profile names it; the number where the
            // release's table does not have it.
            let text = go_wait_reasons::key_text(id.go_wait).map_or_else(
                || go_wait_reasons::key_number(id.go_wait).to_string(),
                str::to_owned,
            );
            labels.push(("wait_reason".to_string(), text));
        }
        if id.go_labels != 0 {
            add_go_labels(&mut labels, go_labels, id.go_labels);
        }
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        builder.add_sample(
            &frames,
            &[
                weight.contentions.round() as i64,
                weight.delay_ns.round() as i64,
            ],
            &labels,
        );
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::drain::Stack;

    fn id(frame: u64) -> SampleId {
        SampleId {
            tgid: 1,
            generation: 0,
            tid: 1,
            thread: [0; 16],
            user: Stack::Frames(Arc::from(vec![frame])),
            kernel: Stack::None,
            object: 0,
            cond: 0,
            go_labels: 0,
            go_wait: 0,
            python: None,
            jit_quarter: 0,
        }
    }

    #[test]
    fn block_waits_are_rescaled() {
        let mut w = BlockWindow::default();
        // 1 ms waits at a 2.5 ms rate stand for 2.5 waits and 2.5 ms each.
        w.add(id(1), 1_000_000, 2_500_000);
        w.add(id(1), 1_000_000, 2_500_000);
        w.add(id(2), 5_000_000, 2_500_000);
        let rows: HashMap<u64, Weight> = w
            .close()
            .into_iter()
            .map(|(id, weight)| match &id.user {
                Stack::Frames(f) => (f[0], weight),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(rows[&1].contentions, 5.0);
        assert_eq!(rows[&1].delay_ns, 5_000_000.0);
        assert_eq!(rows[&2].contentions, 1.0);
        assert_eq!(rows[&2].delay_ns, 5_000_000.0);
        assert!(w.close().is_empty());
    }

    #[test]
    fn wakes_on_a_condition_word_name_the_condition() {
        let mut m = MutexTable::new(1);
        let word = |frame, object, cond| SampleId {
            object,
            cond,
            go_labels: 0,
            go_wait: 0,
            python: None,
            ..id(frame)
        };
        // A wait inside pthread_cond_wait on word 0x1008 of condition
        // 0x1000; wake-ups on that word and on another.
        m.note_cond_word(&word(1, 0x1008, 0x1000));
        m.wake(1, word(2, 0x1008, 0));
        m.wake(2, word(3, 0x2000, 0));
        let mut rows: Vec<(u64, u64)> = m
            .close()
            .iter()
            .map(|(id, _)| (id.object, id.cond))
            .collect();
        rows.sort();
        assert_eq!(rows, [(0x1008, 0x1000), (0x2000, 0)]);
    }

    #[test]
    fn waits_seen_in_a_park_window_are_weighted() {
        // A 100 ms window of each second: a 20 ms wait was seen with
        // probability 80/1000, and stands for 12.5 waits.
        let window = (1_000_000_000, 100_000_000);
        let mut m = MutexTable::new(2);
        m.wake_in_window(1, id(4), Some(window));
        m.delay(1, 20_000_000);
        let rows = m.close();
        assert_eq!(rows[0].1.contentions, 2.0 * 12.5);
        assert_eq!(rows[0].1.delay_ns, 2.0 * 12.5 * 20_000_000.0);
        let mut b = BlockWindow::default();
        b.add_weighted(id(5), 20_000_000, 1, 12.5);
        let rows = b.close();
        assert_eq!(rows[0].1.contentions, 12.5);
        assert_eq!(rows[0].1.delay_ns, 12.5 * 20_000_000.0);
    }

    #[test]
    fn delays_join_their_wake_in_any_order() {
        let mut m = MutexTable::new(10);
        // A delay that arrives before its wake-up, one after, and one in
        // the next window.
        m.delay(7, 1_000);
        m.wake(7, id(3));
        m.delay(7, 2_000);
        let rows = m.close();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].1.contentions, 10.0);
        assert_eq!(rows[0].1.delay_ns, 30_000.0);
        m.delay(7, 500);
        let rows = m.close();
        assert_eq!(rows[0].1.contentions, 0.0);
        assert_eq!(rows[0].1.delay_ns, 5_000.0);
    }

    #[test]
    fn taps_gather_what_their_windows_gather_from_their_opening() {
        let mut b = BlockWindow::default();
        b.add(id(1), 5_000_000, 2_500_000);
        b.taps.open(1, vec![1]);
        b.taps.open(2, vec![99]);
        b.add(id(1), 5_000_000, 2_500_000);
        let window = b.close();
        assert_eq!(window[0].1.delay_ns, 10_000_000.0);
        let tapped = b.take_tap(1);
        assert_eq!(tapped.len(), 1);
        assert_eq!(tapped[0].1.delay_ns, 5_000_000.0, "since its opening only");
        assert!(b.take_tap(2).is_empty(), "another process's tap");

        // A mutex tap: the wake-up and a delay that arrives after it, on a
        // condition's word, labelled as the window's rows are.
        let mut m = MutexTable::new(1);
        m.taps.open(3, vec![]);
        let word = SampleId {
            object: 0x1008,
            ..id(2)
        };
        m.note_cond_word(&SampleId {
            cond: 0x1000,
            ..word.clone()
        });
        m.wake(9, word);
        m.delay(9, 4_000);
        let window = m.close();
        let tapped = m.take_tap(3);
        assert_eq!(tapped.len(), 1);
        assert_eq!(tapped[0].1, window[0].1);
        assert_eq!((tapped[0].0.object, tapped[0].0.cond), (0x1008, 0x1000));
        assert_eq!(tapped[0].1.delay_ns, 4_000.0);
    }
}
