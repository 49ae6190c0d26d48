//! The heap profile's state between the kernel's events and the pprof file:
//! the sampled allocations of the current window (`alloc_*`) and the sampled
//! allocations still live (`inuse_*`), by process and address.
//!
//! Rescaling (Go's rule, `rescale::heap_scale`) happens when the window's
//! profile is built, per stack and separately for alloc and inuse, as Go's
//! pprof does.

use foldhash::{HashMap, HashSet};
use std::sync::Arc;

use crate::kernel::drain::SampleId;
use crate::profiles::rescale::heap_scale;

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
    /// Frees of addresses the table did not know (their allocation was
    /// lost, or made before the probes were attached).
    pub unknown_frees: u64,
}

/// One row of a window's heap profile, before rescaling.
#[derive(Debug, PartialEq, Eq)]
pub struct HeapRow {
    pub id: Arc<SampleId>,
    pub alloc: Tally,
    pub inuse: Tally,
}

impl HeapTable {
    /// A sampled allocation of `size` bytes at `addr`; `live`: the kernel
    /// tracks it and will report its free.
    pub fn allocated(&mut self, id: SampleId, addr: u64, size: u64, live: bool) {
        let id = match self.ids.get(&id) {
            Some(shared) => Arc::clone(shared),
            None => {
                let shared = Arc::new(id);
                self.ids.insert(Arc::clone(&shared));
                shared
            }
        };
        self.window.entry(Arc::clone(&id)).or_default().add(size);
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
        let mut rows: HashMap<Arc<SampleId>, (Tally, Tally)> = HashMap::default();
        for (id, tally) in self.window.drain() {
            rows.entry(id).or_default().0 = tally;
        }
        for alloc in self.live.values() {
            rows.entry(Arc::clone(&alloc.id))
                .or_default()
                .1
                .add(alloc.size);
        }
        // Identities that neither the live set nor the rows hold any more.
        self.ids.retain(|id| Arc::strong_count(id) > 1);
        let mut out: Vec<HeapRow> = rows
            .into_iter()
            .map(|(id, (alloc, inuse))| HeapRow { id, alloc, inuse })
            .collect();
        // Deterministic order for the file.
        out.sort_by(|a, b| {
            (a.id.tgid, a.id.tid, b.alloc.bytes).cmp(&(b.id.tgid, b.id.tid, a.alloc.bytes))
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::drain::Stack;

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
        }
    }

    #[test]
    fn alloc_is_per_window_and_inuse_carries_over() {
        let mut t = HeapTable::default();
        t.allocated(id(1, &[10, 20]), 0x1000, 100, true);
        t.allocated(id(1, &[10, 20]), 0x2000, 100, true);
        t.allocated(id(1, &[30]), 0x3000, 50, true);
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
    fn untracked_allocations_count_only_as_allocated() {
        let mut t = HeapTable::default();
        t.allocated(id(2, &[1]), 0x10, 64, false);
        let rows = t.close_window();
        assert_eq!(rows[0].alloc.count, 1);
        assert_eq!(rows[0].inuse.count, 0);
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
