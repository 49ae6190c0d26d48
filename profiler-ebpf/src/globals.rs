//! The read-only globals the daemon sets before it loads the object
//! (`EbpfLoader::override_global`): which profiles are on, their rates,
//! tracepoint record offsets of this kernel, ring sizes and the stack
//! optimizations' switches. Read through [`global`] and [`global_u8`], so
//! that the compiler does not fold in the defaults written here.

use profiler_common::{HEAP_EVENTS_BYTES, STACK_SAMPLES_BYTES, WAIT_EVENTS_BYTES};

/// 1 when only processes in `TARGETS` are sampled (`--pid`, `-- COMMAND`).
#[unsafe(no_mangle)]
pub(crate) static FILTER_TARGETS: u8 = 0;

/// 1 when children of targets become targets (`-- COMMAND` mode).
#[unsafe(no_mangle)]
pub(crate) static FOLLOW_FORKS: u8 = 0;

/// Offsets of `pid` and `clone_flags` in the task_newtask record, read by
/// the daemon from the tracepoint's format file (they may differ between
/// kernels).
#[unsafe(no_mangle)]
pub(crate) static NEW_TASK_PID_OFFSET: u32 = 8;

#[unsafe(no_mangle)]
pub(crate) static NEW_TASK_FLAGS_OFFSET: u32 = 32;

/// How user stacks are unwound (`unwind_mode`).
#[unsafe(no_mangle)]
pub(crate) static UNWIND_MODE: u8 = 0;

/// Mean bytes between heap samples (`--heap-sample-bytes`).
#[unsafe(no_mangle)]
pub(crate) static HEAP_SAMPLE_BYTES: u64 = 524_288;

/// The daemon's own process id: its allocations are not profiled.
#[unsafe(no_mangle)]
pub(crate) static SELF_TGID: u32 = 0;

/// 1 when the execs of all targets and their followed forks are reported
/// (heap profiles look for allocators in new programs), not only those of
/// processes already seen.
#[unsafe(no_mangle)]
pub(crate) static REPORT_PROCESS_EVENTS: u8 = 0;

/// Block profile on, and its rate (`--block-rate`, ns).
#[unsafe(no_mangle)]
pub(crate) static BLOCK_ON: u8 = 0;

#[unsafe(no_mangle)]
pub(crate) static BLOCK_RATE_NS: u64 = 10_000;

/// Mutex profile on, and 1 in how many contended wake-ups it keeps.
#[unsafe(no_mangle)]
pub(crate) static MUTEX_ON: u8 = 0;

#[unsafe(no_mangle)]
pub(crate) static MUTEX_FRACTION: u64 = 100;

/// Off-CPU profile on (its rate is BLOCK_RATE_NS).
#[unsafe(no_mangle)]
pub(crate) static OFFCPU_ON: u8 = 0;

/// Offsets in the syscall tracepoint records, from their format files
/// (futex's `op` follows `uaddr`: the daemon checks).
#[unsafe(no_mangle)]
pub(crate) static FUTEX_UADDR_OFFSET: u32 = 16;

#[unsafe(no_mangle)]
pub(crate) static SYSCALL_RET_OFFSET: u32 = 16;

/// Byte sizes of the rings as loaded (`[limits]` may change them), for the
/// wake-up threshold.
#[unsafe(no_mangle)]
pub(crate) static STACK_SAMPLES_RING: u32 = STACK_SAMPLES_BYTES;

#[unsafe(no_mangle)]
pub(crate) static HEAP_EVENTS_RING: u32 = HEAP_EVENTS_BYTES;

#[unsafe(no_mangle)]
pub(crate) static WAIT_EVENTS_RING: u32 = WAIT_EVENTS_BYTES;

/// Stack optimizations, each on (1) unless the daemon turns it off to
/// compare (`[debug]` in its config): a matched walk hint sends a record
/// without a stack copy; a stack known to fit in SHORT_STACK_BYTES goes in
/// the short record form; copies stop at the thread's known stack top.
#[unsafe(no_mangle)]
pub(crate) static BRIEF_RECORDS: u8 = 1;

#[unsafe(no_mangle)]
pub(crate) static SHORT_RECORDS: u8 = 1;

#[unsafe(no_mangle)]
pub(crate) static USE_STACK_TOPS: u8 = 1;

/// Threads the daemon marked deep get copies of up to LONG_STACK_BYTES (a
/// feature, not an optimization: off, their stacks stay cut at the usual
/// copy's end, to compare).
#[unsafe(no_mangle)]
pub(crate) static LONG_RECORDS: u8 = 1;

/// A goroutine read at once from its start through `g.labels`, and told
/// running by its own stack bounds and status (go_labels.rs): the same
/// labels for two or three reads fewer per sample; 0 reads the goroutine,
/// its M and the M's goroutine one by one, to compare.
#[unsafe(no_mangle)]
pub(crate) static GO_LABELS_ONE_READ: u8 = 1;

/// A Go 1.23-and-before label map's id remembered per CPU by its address
/// and header (go_labels.rs): the same id for one read fewer and no hash;
/// 0 reads its bucket every time, to compare.
#[unsafe(no_mangle)]
pub(crate) static GO_LABEL_MAP_CACHE: u8 = 1;

/// 1: CPU samples time their reading of a goroutine's labels
/// (`GO_LABEL_READ_NS`), to measure it apart from the rest of the sample.
#[unsafe(no_mangle)]
pub(crate) static TIME_GO_LABELS: u8 = 0;

#[inline(always)]
pub(crate) fn global<T: Copy>(v: &T) -> T {
    // SAFETY: as for global_u8.
    unsafe { core::ptr::read_volatile(v) }
}

#[inline(always)]
pub(crate) fn global_u8(v: &u8) -> u8 {
    // SAFETY: the daemon patches these read-only globals before loading;
    // a volatile read keeps the compiler from folding the default value.
    unsafe { core::ptr::read_volatile(v) }
}
