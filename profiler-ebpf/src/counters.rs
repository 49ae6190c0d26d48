//! The per-CPU event and loss counters (`profiler_common::counter`), which
//! the daemon sums into its metrics and exit summary.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use profiler_common::counter;

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[inline(always)]
pub(crate) fn count(index: u32) {
    count_n(index, 1);
}

#[inline(always)]
pub(crate) fn count_n(index: u32, n: u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; a program does not nest with itself on a CPU.
        unsafe { *c += n };
    }
}
