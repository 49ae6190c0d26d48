//! The heap profile's state between the kernel's events and the pprof file:
//! the sampled allocations of the current window (`alloc_*`) and the sampled
//! allocations still live (`inuse_*`), by process and address.
//!
//! Rescaling (Go's rule, `rescale::heap_scale`) happens when the window's
//! profile is built, per stack and separately for alloc and inuse, as Go's
//! pprof does.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use foldhash::{HashMap, HashSet};
use profiler_common::{
    HEAP_PY_FRAMES, HeapAlloc, HeapFree, LONG_STACK_BYTES, MAX_STACK_DEPTH, SHORT_STACK_BYTES,
    alloc_fn, heap_event,
};

use crate::bpf::drain::{SampleId, Stack};
use crate::bpf::probes::Probes;
use crate::bpf::ring::Ring;
use crate::config::Settings;
use crate::model::frames::Frame;
use crate::model::profile_kind::ProfileKind;
use crate::model::taps::Taps;
use crate::procs::go_heap_rate::GoHeapRates;
use crate::procs::process::ProcessTable;
use crate::profiles::cpu::{LONG_RECORDS, SHORT_RECORDS};
use crate::profiles::pprof::ProfileBuilder;
use crate::profiles::records::{Thread, event_user_stack, python_tail, read_record, record};
use crate::profiles::rescale::heap_scale;
use crate::profiles::samples::{
    PythonFrames, hide_go_runtime, prefetch_user_stack, push_stack, python_frames, sample_labels,
    user_frames,
};
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::symbolize::python::PythonCodes;
use crate::stacks::unwind::Unwinder;

/// Sampled allocations: how many and how many bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub count: u64,
    pub bytes: u64,
}

impl Tally {
    fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes += bytes;
    }

    /// The estimate of all allocations this sampled tally stands for:
    /// (objects, bytes).
    pub fn scaled(self, rate: u64) -> (i64, i64) {
        let scale = heap_scale(self.count, self.bytes, rate);
        (
            (self.count as f64 * scale).round() as i64,
            (self.bytes as f64 * scale).round() as i64,
        )
    }
}

#[derive(Debug)]
struct LiveAlloc {
    id: Arc<SampleId>,
    size: u64,
}

/// Sampled allocations of the current window and the live set.
#[derive(Default)]
pub struct HeapTable {
    window: HashMap<Arc<SampleId>, Tally>,
    live: HashMap<(u32, u64), LiveAlloc>,
    /// One shared copy of each stack identity.
    ids: HashSet<Arc<SampleId>>,
    /// The identities of allocations the Go runtime sampled (by its own
    /// rate), not profilerd's allocator probes.
    go_runtime: HashSet<Arc<SampleId>>,
    /// Each Go process's `MemProfileRate`, kept for its life, and the Go
    /// processes whose runtime samples nothing.
    pub go_rates: GoHeapRates,
    /// Frees of addresses the table did not know (their allocation was
    /// lost, or made before the probes were attached).
    pub unknown_frees: u64,
    /// On-demand captures (`/debug/pprof/heap`): each gets a copy of the
    /// allocations of its processes, beside the window.
    pub taps: Taps<Arc<SampleId>, Tally>,
}

/// One row of a window's heap profile, before rescaling.
#[derive(Debug, PartialEq, Eq)]
pub struct HeapRow {
    pub id: Arc<SampleId>,
    pub alloc: Tally,
    pub inuse: Tally,
    /// Sampled by the Go runtime, at the process's `MemProfileRate`.
    pub go_runtime: bool,
}

impl HeapTable {
    /// An empty table, Go processes' rates kept by `go_rates`.
    pub fn with_go_rates(go_rates: GoHeapRates) -> Self {
        HeapTable {
            go_rates,
            ..HeapTable::default()
        }
    }

    /// A sampled allocation of `size` bytes at `addr`; `live`: the kernel
    /// tracks it and will report its free; `go_runtime`: the Go runtime
    /// sampled it.
    pub fn allocated(&mut self, id: SampleId, addr: u64, size: u64, live: bool, go_runtime: bool) {
        let id = match self.ids.get(&id) {
            Some(shared) => Arc::clone(shared),
            None => {
                let shared = Arc::new(id);
                self.ids.insert(Arc::clone(&shared));
                shared
            }
        };
        if go_runtime {
            self.go_rates.at_sample(id.tgid);
            if !self.go_runtime.contains(&id) {
                self.go_runtime.insert(Arc::clone(&id));
            }
        }
        self.taps.add(id.tgid, &id, |tally| tally.add(size));
        if self.taps.window_wants(id.tgid) {
            self.window.entry(Arc::clone(&id)).or_default().add(size);
        }
        if live {
            self.live.insert((id.tgid, addr), LiveAlloc { id, size });
        }
    }

    /// A sampled allocation was freed.
    pub fn freed(&mut self, tgid: u32, addr: u64) {
        if self.live.remove(&(tgid, addr)).is_none() {
            self.unknown_frees += 1;
        }
    }

    /// Forgets a process's live set (it exited); returns the addresses.
    pub fn forget_process(&mut self, tgid: u32) -> Vec<u64> {
        let mut gone = Vec::new();
        self.live.retain(|&(pid, addr), _| {
            if pid == tgid {
                gone.push(addr);
                false
            } else {
                true
            }
        });
        gone
    }

    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Closes the window: every stack with allocations in it or live
    /// allocations now, with both tallies. The live set carries over.
    pub fn close_window(&mut self) -> Vec<HeapRow> {
        let window = std::mem::take(&mut self.window);
        // A capture's guest's allocations are tracked for the capture.
        let rows = self.rows(window, |tgid| self.taps.window_wants(tgid));
        // Identities that neither the live set, the rows nor a tap hold
        // any more (a Go runtime identity is also held by `ids`).
        self.go_runtime.retain(|id| Arc::strong_count(id) > 2);
        self.ids.retain(|id| Arc::strong_count(id) > 1);
        rows
    }

    /// Ends capture `id`'s tap: the allocations it gathered, and the live
    /// allocations of its processes now (Go's `/debug/pprof/heap?seconds=N`
    /// gives the same allocations and the in-use set at its end).
    pub fn take_tap(&mut self, id: u64) -> Vec<HeapRow> {
        let Some(mut tap) = self.taps.take(id) else {
            return Vec::new();
        };
        let allocated = std::mem::take(&mut tap.rows);
        // The live set of the processes its allocations came from: a
        // guest's only if the tap names it.
        self.rows(allocated, |tgid| self.taps.gathers(&tap, tgid))
    }

    /// The rows of `allocated` and of the live allocations of the
    /// processes `wanted`, sorted.
    fn rows(
        &self,
        allocated: HashMap<Arc<SampleId>, Tally>,
        wanted: impl Fn(u32) -> bool,
    ) -> Vec<HeapRow> {
        let mut rows: HashMap<Arc<SampleId>, (Tally, Tally)> = HashMap::default();
        for (id, tally) in allocated {
            rows.entry(id).or_default().0 = tally;
        }
        for alloc in self.live.values().filter(|a| wanted(a.id.tgid)) {
            rows.entry(Arc::clone(&alloc.id))
                .or_default()
                .1
                .add(alloc.size);
        }
        let mut out: Vec<HeapRow> = rows
            .into_iter()
            .map(|(id, (alloc, inuse))| HeapRow {
                go_runtime: self.go_runtime.contains(&id),
                id,
                alloc,
                inuse,
            })
            .collect();
        // Deterministic order for the file.
        out.sort_by(|a, b| {
            (a.id.tgid, a.id.tid, b.alloc.bytes).cmp(&(b.id.tgid, b.id.tid, a.alloc.bytes))
        });
        out
    }
}

/// Adds the sampled allocations and frees that the heap probes reported.
pub(crate) fn read_heap_events(
    ring: &mut Ring,
    codes: &mut PythonCodes,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    unwinder: &mut Unwinder,
    heap: &mut HeapTable,
) {
    while let Some(item) = ring.next() {
        // Every heap event starts with its kind.
        match read_record::<u32>(&item) {
            Some(heap_event::FREE) => {
                if let Some(free) = read_record::<HeapFree>(&item) {
                    heap.freed(free.tgid, free.addr);
                }
                continue;
            }
            Some(heap_event::ALLOC) => {}
            _ => continue,
        }
        // A CPython thread's record ends with its Python frames.
        let field = |offset: usize| item.get(offset..).and_then(read_record::<u32>);
        let (Some(tgid), Some(python)) = (
            field(std::mem::offset_of!(HeapAlloc<0>, tgid)),
            field(std::mem::offset_of!(HeapAlloc<0>, python)),
        ) else {
            continue;
        };
        let Some((item, python)) = python_tail::<HEAP_PY_FRAMES>(&item, python != 0) else {
            continue;
        };
        // Settled now, while the process lives.
        let python = python.and_then(|p| python_frames(codes, tgid, p));
        // Four record forms, told apart by their length, largest first.
        if let Some(alloc) = record::<HeapAlloc<LONG_STACK_BYTES>>(item) {
            LONG_RECORDS.fetch_add(1, Ordering::Relaxed);
            add_heap_alloc(alloc, python, procs, probes, unwinder, heap);
        } else if let Some(alloc) = record::<HeapAlloc>(item) {
            add_heap_alloc(alloc, python, procs, probes, unwinder, heap);
        } else if let Some(alloc) = record::<HeapAlloc<SHORT_STACK_BYTES>>(item) {
            SHORT_RECORDS.fetch_add(1, Ordering::Relaxed);
            add_heap_alloc(alloc, python, procs, probes, unwinder, heap);
        } else if let Some(alloc) = record::<HeapAlloc<0>>(item) {
            // Frames walked by the kernel, no stack bytes.
            SHORT_RECORDS.fetch_add(1, Ordering::Relaxed);
            add_heap_alloc(alloc, python, procs, probes, unwinder, heap);
        }
    }
}

pub(crate) fn add_heap_alloc<const N: usize>(
    alloc: &HeapAlloc<N>,
    python: PythonFrames,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    unwinder: &mut Unwinder,
    heap: &mut HeapTable,
) {
    procs.ensure(alloc.tgid);
    let generation = procs.generation_at(alloc.tgid, alloc.time_ns);
    // The registers are those at the allocator's return: the leaf is the
    // call site, one byte back from the return address.
    let user = event_user_stack(
        procs,
        unwinder,
        Thread {
            tgid: alloc.tgid,
            generation,
            tid: alloc.tid,
        },
        (alloc.ip.saturating_sub(1), alloc.sp, alloc.bp),
        &alloc.stack[..(alloc.stack_len as usize).min(N)],
        &alloc.frames[..(alloc.frames_len as usize).min(MAX_STACK_DEPTH)],
        true,
    );
    let id = SampleId {
        tgid: alloc.tgid,
        generation,
        tid: alloc.tid,
        thread: alloc.comm,
        user,
        kernel: Stack::None,
        object: 0,
        cond: 0,
        go_labels: 0,
        go_wait: 0,
        python,
        jit_quarter: 0,
    };
    // An allocation read after its image was replaced or its process
    // exited is no longer in use: that address space is gone (its live
    // set was forgotten then), so it is counted as allocated only. (A
    // process that could not be read is taken as live.)
    let mut live = alloc.live != 0;
    if live
        && (generation != procs.generation(alloc.tgid)
            || procs.peek(alloc.tgid).is_some_and(|info| info.is_exited()))
    {
        live = false;
        probes.forget_live(alloc.tgid, &[alloc.addr]);
    }
    let go_runtime = u64::from(alloc.function) == alloc_fn::GO_RUNTIME;
    heap.allocated(id, alloc.addr, alloc.size, live, go_runtime);
}

/// The window's heap profile (it closes the window).
pub(crate) fn build_heap_profile(
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    heap: &mut HeapTable,
    time_nanos: i64,
    duration_nanos: i64,
) -> pprof_proto::Profile {
    let rows = heap.close_window();
    let mut profile = heap_profile_of(
        settings,
        symbolizer,
        procs,
        heap,
        rows,
        (time_nanos, duration_nanos),
    );
    // Go processes whose runtime samples nothing are named, with why, in
    // every window while they run (`go tool pprof -comments`).
    for line in heap.go_rates.comments() {
        profile.comment.push(profile.string_table.len() as i64);
        profile.string_table.push(line);
    }
    heap.go_rates.end_window(|tgid| match procs.peek(tgid) {
        Some(info) => !info.is_exited(),
        None => std::path::Path::new(&format!("/proc/{tgid}")).exists(),
    });
    profile
}

/// The heap profile of `rows` (a window's or a capture's), starting at
/// `time_nanos` and lasting `duration_nanos`.
pub(crate) fn heap_profile_of(
    settings: &Settings,
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    heap: &mut HeapTable,
    rows: Vec<HeapRow>,
    (time_nanos, duration_nanos): (i64, i64),
) -> pprof_proto::Profile {
    let rate = settings.heap_sample_bytes;
    let mut builder =
        ProfileBuilder::new(ProfileKind::Heap, rate as i64, time_nanos, duration_nanos);
    let mut frames: Vec<Frame> = Vec::with_capacity(256);
    for row in &rows {
        procs.ensure(row.id.tgid);
        prefetch_user_stack(symbolizer, procs, &row.id);
    }
    symbolizer.resolve_prefetched();
    // Each Go process's own rate, read once per window.
    let mut go_rates: HashMap<u32, u64> = HashMap::default();
    for row in rows {
        let id = &row.id;
        frames.clear();
        procs.ensure(id.tgid);
        push_stack(&mut frames, &id.user, "user", |ips, leaf_words| {
            user_frames(symbolizer, procs, id, ips, leaf_words)
        });
        let rate = match row.go_runtime {
            true => {
                hide_go_runtime(&mut frames);
                *go_rates
                    .entry(id.tgid)
                    .or_insert_with(|| heap.go_rates.for_window(id.tgid))
            }
            false => rate,
        };
        let (alloc_objects, alloc_space) = row.alloc.scaled(rate);
        let (inuse_objects, inuse_space) = row.inuse.scaled(rate);
        let labels = sample_labels(settings, procs, id);
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        builder.add_sample(
            &frames,
            &[alloc_objects, alloc_space, inuse_objects, inuse_space],
            &labels,
        );
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::drain::Stack;

    fn id(tgid: u32, frames: &[u64]) -> SampleId {
        SampleId {
            tgid,
            generation: 0,
            tid: tgid,
            thread: [0; 16],
            user: Stack::Frames(Arc::from(frames)),
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
    fn alloc_is_per_window_and_inuse_carries_over() {
        let mut t = HeapTable::default();
        t.allocated(id(1, &[10, 20]), 0x1000, 100, true, false);
        t.allocated(id(1, &[10, 20]), 0x2000, 100, true, false);
        t.allocated(id(1, &[30]), 0x3000, 50, true, false);
        t.freed(1, 0x2000);
        let first = t.close_window();
        let a = first
            .iter()
            .find(|r| r.id.user == id(1, &[10, 20]).user)
            .unwrap();
        assert_eq!(
            a.alloc,
            Tally {
                count: 2,
                bytes: 200
            }
        );
        assert_eq!(
            a.inuse,
            Tally {
                count: 1,
                bytes: 100
            }
        );
        // Next window: nothing allocated, the live ones still in use.
        let rows = t.close_window();
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.alloc == Tally::default()));
        assert_eq!(rows.iter().map(|r| r.inuse.bytes).sum::<u64>(), 150);
        assert_eq!(t.forget_process(1).len(), 2);
        drop((first, rows));
        assert!(t.close_window().is_empty());
        assert!(t.ids.is_empty(), "identities are released");
        t.freed(1, 0x9999);
        assert_eq!(t.unknown_frees, 1);
    }

    #[test]
    fn a_tap_holds_its_processes_allocations_and_their_live_set_at_its_end() {
        let mut t = HeapTable::default();
        // Live before the tap: in use at its end, not allocated in it.
        t.allocated(id(1, &[1]), 0x10, 100, true, false);
        t.taps.open(5, vec![1]);
        t.allocated(id(1, &[2]), 0x20, 200, true, false);
        t.allocated(id(1, &[2]), 0x30, 200, true, false);
        t.allocated(id(2, &[3]), 0x40, 300, true, false);
        t.freed(1, 0x30);
        // A window closing meanwhile leaves the tap as it was.
        let window = t.close_window();
        assert_eq!(window.len(), 3);
        t.allocated(id(1, &[4]), 0x50, 400, false, false);
        let rows = t.take_tap(5);
        let row = |frame: u64| rows.iter().find(|r| r.id.user == id(1, &[frame]).user);
        assert!(rows.iter().all(|r| r.id.tgid == 1), "{rows:?}");
        assert_eq!(rows.len(), 3);
        let first = row(1).expect("the earlier live one");
        assert_eq!((first.alloc.count, first.inuse.bytes), (0, 100));
        let second = row(2).expect("allocated in the tap");
        assert_eq!((second.alloc.bytes, second.inuse.bytes), (400, 200));
        let fourth = row(4).expect("not tracked");
        assert_eq!((fourth.alloc.bytes, fourth.inuse.bytes), (400, 0));
        assert!(t.take_tap(5).is_empty(), "taken once");
        // The window saw everything, the tap's allocations too.
        let next = t.close_window();
        assert_eq!(next.iter().map(|r| r.alloc.bytes).sum::<u64>(), 400);
        // A guest's live allocations: in a tap that names it, not in one
        // of every process, nor in the window.
        t.taps.set_guests(&[9]);
        t.taps.open(6, vec![]);
        t.taps.open(7, vec![9]);
        t.allocated(id(9, &[5]), 0x60, 500, true, false);
        assert!(t.take_tap(6).iter().all(|r| r.id.tgid != 9));
        assert_eq!(
            t.take_tap(7).iter().map(|r| r.inuse.bytes).sum::<u64>(),
            500
        );
        assert!(t.close_window().iter().all(|r| r.id.tgid != 9));
    }

    #[test]
    fn untracked_allocations_count_only_as_allocated() {
        let mut t = HeapTable::default();
        t.allocated(id(2, &[1]), 0x10, 64, false, false);
        let rows = t.close_window();
        assert_eq!(rows[0].alloc.count, 1);
        assert_eq!(rows[0].inuse.count, 0);
    }

    #[test]
    fn go_runtime_samples_are_told_apart_and_released() {
        let mut t = HeapTable::default();
        t.allocated(id(3, &[7]), 0x10, 64, true, true);
        t.allocated(id(3, &[8]), 0x20, 64, false, false);
        let rows = t.close_window();
        let by_stack = |frame: u64| {
            rows.iter()
                .find(|r| r.id.user == id(3, &[frame]).user)
                .expect("row")
                .go_runtime
        };
        assert!(by_stack(7));
        assert!(!by_stack(8));
        t.freed(3, 0x10);
        drop(rows);
        assert!(t.close_window().is_empty());
        assert!(t.go_runtime.is_empty() && t.ids.is_empty());
    }

    #[test]
    fn scaling_follows_go() {
        // Every allocation sampled: no scaling.
        assert_eq!(
            Tally {
                count: 3,
                bytes: 300
            }
            .scaled(1),
            (3, 300)
        );
        // 64-byte objects at a 512 KiB mean: each sampled with p ~ 64/524288.
        let (objects, bytes) = Tally {
            count: 1,
            bytes: 64,
        }
        .scaled(524_288);
        assert!((8190..8196).contains(&objects), "{objects}");
        assert!((bytes - objects * 64).abs() < 64, "{bytes}");
    }
}
