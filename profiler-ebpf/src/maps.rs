//! Maps that several program families use (the targeted processes, the
//! processes the daemon knows), and the wake-up policy of every ring.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{HashMap, LruHashMap, RingBuf},
};
use profiler_common::{SEEN_ENTRIES, TARGETS_ENTRIES};

#[map]
pub(crate) static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(TARGETS_ENTRIES, 0);

/// Processes the daemon knows, each with the kernel time its current image
/// started (its first sample, or its latest exec's rename): aggregated CPU
/// counts carry it, as they carry no time of their own. A process whose
/// main thread exited is kept as [`EXITED`] until its pid is given to a
/// new task, so that the last samples of its exit are not taken for a new
/// process under the same pid.
#[map]
pub(crate) static SEEN: LruHashMap<u32, u64> = LruHashMap::with_max_entries(SEEN_ENTRIES, 0);

/// Ring buffer wake-up policy: waking the daemon for every record would
/// cost a context switch each; it reads the rings every second anyway and
/// is woken early only when a ring is a quarter full.
#[inline(always)]
pub(crate) fn wake_flag(ring: &RingBuf, bytes: &u32) -> u64 {
    // SAFETY: as global_u8: a read-only global patched before loading.
    let bytes = unsafe { core::ptr::read_volatile(bytes) };
    if ring.query(BPF_RB_AVAIL_DATA as u64) > u64::from(bytes / 4) {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}
