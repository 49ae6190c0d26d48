//! The kernel's `ALLOC_CALLERS` map: the allocator functions of each
//! process that maps two allocator files or more (an interposer such as
//! heaptrack's preload library beside libc), by address, so that the heap
//! probes count a wrapper's call of the allocator it wraps once, at the
//! outer call (design 025). Processes with one allocator get no entry and
//! pay one failed lookup per allocator call.

use std::collections::HashSet;

use aya::maps::{Array, HashMap, MapData};
use profiler_common::{ALLOC_CALLER_RANGES, ALLOC_CALLERS_ENTRIES, AllocCallers};

/// What the table did, for the exit summary.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallerStats {
    /// Processes given allocator-caller ranges.
    pub processes: u64,
    /// Ranges left out: a process mapped more allocator functions than an
    /// entry holds (calls from them are counted again).
    pub ranges_cut: u64,
    /// Processes left without ranges: the map was full.
    pub full: u64,
}

pub struct AllocatorCallers {
    map: HashMap<MapData, u32, AllocCallers>,
    /// `ALLOC_CALLERS_ON[0]`: 1 while `map` has an entry, so that the
    /// probes of every other process skip the lookup.
    on: Array<MapData, u32>,
    /// Processes with an entry.
    written: HashSet<u32>,
    stats: CallerStats,
}

impl AllocatorCallers {
    pub fn new(map: HashMap<MapData, u32, AllocCallers>, on: Array<MapData, u32>) -> Self {
        AllocatorCallers {
            map,
            on,
            written: HashSet::new(),
            stats: CallerStats::default(),
        }
    }

    /// Process `pid` maps `files` allocator files whose functions lie at
    /// `ranges`: written when there are two files or more, else forgotten.
    pub fn set(&mut self, pid: u32, files: usize, ranges: &[(u64, u64)]) {
        if files < 2 || ranges.is_empty() {
            self.forget(pid);
            return;
        }
        let value = entry(ranges);
        if ranges.len() > ALLOC_CALLER_RANGES {
            let cut = (ranges.len() - ALLOC_CALLER_RANGES) as u64;
            if self.stats.ranges_cut == 0 {
                tracing::warn!(
                    "process {pid} maps {files} allocators with {} functions; the {cut} past \
                     {ALLOC_CALLER_RANGES} are not told apart from the program's own callers \
                     (counted as allocator_caller_ranges_cut)",
                    ranges.len()
                );
            }
            self.stats.ranges_cut += cut;
        }
        let new = !self.written.contains(&pid);
        if new && self.written.len() >= ALLOC_CALLERS_ENTRIES as usize {
            self.note_full(pid);
            return;
        }
        match self.map.insert(pid, value, 0) {
            Ok(()) => {
                if new {
                    if self.written.is_empty() {
                        self.switch(true);
                    }
                    self.written.insert(pid);
                    self.stats.processes += 1;
                    tracing::debug!(
                        "process {pid} maps {files} allocators: calls between them counted once"
                    );
                }
            }
            Err(e) => {
                tracing::debug!("allocator callers of process {pid} not written: {e}");
                self.note_full(pid);
            }
        }
    }

    fn note_full(&mut self, pid: u32) {
        if self.stats.full == 0 {
            tracing::warn!(
                "process {pid}: the allocator-caller map is full; its wrapped allocator calls \
                 are counted twice (counted as allocator_callers_full)"
            );
        }
        self.stats.full += 1;
    }

    /// Process `pid` exited or exec'd.
    pub fn forget(&mut self, pid: u32) {
        if self.written.remove(&pid) {
            let _ = self.map.remove(&pid);
            if self.written.is_empty() {
                self.switch(false);
            }
        }
    }

    /// Turns the probes' lookup on (before the first entry counts) or off
    /// (after the last is gone).
    fn switch(&mut self, on: bool) {
        if let Err(e) = self.on.set(0, u32::from(on), 0) {
            tracing::debug!(
                "allocator callers not switched {}: {e}",
                if on { "on" } else { "off" }
            );
        }
    }

    pub fn stats(&self) -> CallerStats {
        self.stats
    }
}

/// The map value for `ranges`, the first [`ALLOC_CALLER_RANGES`] kept.
fn entry(ranges: &[(u64, u64)]) -> AllocCallers {
    let mut value = AllocCallers::default();
    for (slot, &(start, end)) in value.ranges.iter_mut().zip(ranges) {
        *slot = [start, end];
    }
    value.len = ranges.len().min(ALLOC_CALLER_RANGES) as u32;
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_keeps_the_first_ranges() {
        let ranges: Vec<(u64, u64)> = (0..40).map(|i| (i * 100, i * 100 + 50)).collect();
        let value = entry(&ranges);
        assert_eq!(value.len as usize, ALLOC_CALLER_RANGES);
        assert_eq!(value.ranges[0], [0, 50]);
        assert_eq!(value.ranges[ALLOC_CALLER_RANGES - 1], [3100, 3150]);
        let value = entry(&ranges[..3]);
        assert_eq!(value.len, 3);
        assert_eq!(value.ranges[3], [0, 0]);
    }
}
