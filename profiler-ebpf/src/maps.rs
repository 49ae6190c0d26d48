//! Maps that several program families use (the targeted processes, the
//! processes the daemon knows), and the wake-up policy of every ring.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{HashMap, LruHashMap, RingBuf},
};
use profiler_common::{FORKED_ENTRIES, SEEN_ENTRIES, TARGETS_ENTRIES};

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

/// Processes forked by a known process that have not exec'd, each with
/// the process that forked it: their exec must reach the daemon, which
/// symbolizes them with their parent's mappings until then, and the
/// records sent of them name the parent (`forked_parent`), which the
/// daemon's fork record must match. Cleared for every new task's id and
/// written for a new process of a known parent, removed at its exec and
/// exit: it always speaks of the task that holds the id now.
#[map]
pub(crate) static FORKED: LruHashMap<u32, u32> = LruHashMap::with_max_entries(FORKED_ENTRIES, 0);

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
