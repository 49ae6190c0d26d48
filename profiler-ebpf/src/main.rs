//! Kernel-side probes of profilerd.
//!
//! `cpu_sample` runs on every CPU-clock tick of every online CPU; it keeps
//! the sample only for targeted processes (when filtering is on), records
//! the user and kernel stacks in a stack map keyed by a 64-bit hash of the
//! frames, and adds one to the sample's count in a per-CPU hash map. (The
//! kernel's own stack-trace map is not used: it has one slot per hash
//! bucket and loses a stack whenever two stacks share a bucket.) Counts and stacks are
//! double-buffered: the daemon flips `CONTROL[ACTIVE_BUFFER]` and drains the
//! buffer that the kernel no longer writes, so draining never races a
//! writer and per-CPU counts never lose an update.
//!
//! `heap_probe` runs at the allocator entry points of targeted processes
//! (and, as a uprobe session, at the return of the calls it asks for); see
//! its comment.
//!
//! The process tracepoints follow descendants in `-- COMMAND` mode and tell
//! the daemon when a process first appears, execs or exits, so that it can
//! snapshot the process's mappings while the process still lives.
#![no_std]
#![no_main]

mod klog;
mod task_storage;

use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_F_NO_PREALLOC, BPF_F_USER_STACK, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP,
        BPF_RB_NO_WAKEUP, bpf_perf_event_data, pt_regs, task_struct,
    },
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        bpf_probe_read_user as read_user,
        generated::{
            bpf_get_attach_cookie, bpf_get_current_task, bpf_get_current_task_btf, bpf_get_func_ip,
            bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_get_stack, bpf_get_task_stack,
            bpf_ktime_get_ns, bpf_probe_read_user, bpf_task_pt_regs,
        },
    },
    macros::{btf_map, btf_tracepoint, map, perf_event, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePointContext, PerfEventContext, ProbeContext, TracePointContext},
};
use klog::{klog, why};
use profiler_common::{
    ANCHOR_FRAMES, ANCHOR_WINDOW_NS, BRIEF_FRAME_CLASSES, BuildIdFrame, COMM_LEN, COND_BYTES,
    COUNTS_ENTRIES, CondWait, FORKED_ENTRIES, FUTEX_WAKERS_ENTRIES, FutexCall, FutexWaker,
    GO_PARKED_ENTRIES, GoPark, HEAP_EVENTS_BYTES, HEAP_LIVE_ENTRIES, HEAP_THREADS_ENTRIES,
    HINT_SEAL_SEED, HeapAlloc, HeapFree, HeapThread, ImageAnchors, LiveKey as FutexKey, LiveKey,
    MAX_STACK_DEPTH, MutexDelay, OFFCPU_KERNEL_DEPTH, OFFCPU_PARKED_ENTRIES, OFFCPU_STACK_BYTES,
    OffcpuRecord, PROC_EVENTS_BYTES, ProcEvent, SEEN_ENTRIES, SHORT_STACK_BYTES, STACK_COPY_BYTES,
    STACK_LOST, STACK_NONE, STACK_SAMPLES_BYTES, STACK_TOPS_ENTRIES, STACKS_ENTRIES, SampleKey,
    Stack, StackHash, StackSample, TARGETS_ENTRIES, WAIT_EVENTS_BYTES, WAKER_TIME_SLOTS,
    WALK_HINT_WORDS, WALK_HINTS_ENTRIES, WaitBrief, WaitHead, WaitStack, WalkHint, WalkHintKey,
    alloc_fn, control, counter, futex_call, futex_op, go_fn, heap_event, hint_mix, proc_event,
    sampling::{keep_block_event, keep_mutex_event, next_sample_distance},
    unwind_mode, wait_event, wait_flags,
};
use task_storage::TaskStorage;

/// -EFAULT from bpf_get_stack: no stack of that kind for this sample.
const EFAULT: i64 = -14;

/// 1 when only processes in `TARGETS` are sampled (`--pid`, `-- COMMAND`).
#[unsafe(no_mangle)]
static FILTER_TARGETS: u8 = 0;
/// 1 when children of targets become targets (`-- COMMAND` mode).
#[unsafe(no_mangle)]
static FOLLOW_FORKS: u8 = 0;
/// Offset of `child_pid` in the sched_process_fork record, read by the
/// daemon from the tracepoint's format file (it differs between kernels).
#[unsafe(no_mangle)]
static FORK_CHILD_PID_OFFSET: u32 = 44;

/// How user stacks are unwound (`unwind_mode`).
#[unsafe(no_mangle)]
static UNWIND_MODE: u8 = 0;

/// Mean bytes between heap samples (`--heap-sample-bytes`).
#[unsafe(no_mangle)]
static HEAP_SAMPLE_BYTES: u64 = 524_288;
/// The daemon's own process id: its allocations are not profiled.
#[unsafe(no_mangle)]
static SELF_TGID: u32 = 0;
/// 1 when the execs of all targets and their followed forks are reported
/// (heap profiles look for allocators in new programs), not only those of
/// processes already seen.
#[unsafe(no_mangle)]
static REPORT_PROCESS_EVENTS: u8 = 0;

/// Block profile on, and its rate (`--block-rate`, ns).
#[unsafe(no_mangle)]
static BLOCK_ON: u8 = 0;
#[unsafe(no_mangle)]
static BLOCK_RATE_NS: u64 = 10_000;
/// Mutex profile on, and 1 in how many contended wake-ups it keeps.
#[unsafe(no_mangle)]
static MUTEX_ON: u8 = 0;
#[unsafe(no_mangle)]
static MUTEX_FRACTION: u64 = 100;
/// Off-CPU profile on (its rate is BLOCK_RATE_NS).
#[unsafe(no_mangle)]
static OFFCPU_ON: u8 = 0;
/// Offsets in the syscall tracepoint records, from their format files
/// (futex's `op` follows `uaddr`: the daemon checks).
#[unsafe(no_mangle)]
static FUTEX_UADDR_OFFSET: u32 = 16;
#[unsafe(no_mangle)]
static SYSCALL_RET_OFFSET: u32 = 16;
/// Byte sizes of the rings as loaded (`[limits]` may change them), for the
/// wake-up threshold.
#[unsafe(no_mangle)]
static STACK_SAMPLES_RING: u32 = STACK_SAMPLES_BYTES;
#[unsafe(no_mangle)]
static HEAP_EVENTS_RING: u32 = HEAP_EVENTS_BYTES;
#[unsafe(no_mangle)]
static WAIT_EVENTS_RING: u32 = WAIT_EVENTS_BYTES;
/// Stack optimizations, each on (1) unless the daemon turns it off to
/// compare (`[debug]` in its config): a matched walk hint sends a record
/// without a stack copy; a stack known to fit in SHORT_STACK_BYTES goes in
/// the short record form; copies stop at the thread's known stack top.
#[unsafe(no_mangle)]
static BRIEF_RECORDS: u8 = 1;
#[unsafe(no_mangle)]
static SHORT_RECORDS: u8 = 1;
#[unsafe(no_mangle)]
static USE_STACK_TOPS: u8 = 1;

#[map]
static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(TARGETS_ENTRIES, 0);
/// Processes the daemon knows, each with the kernel time its current image
/// started (its first sample, or its latest exec's rename): aggregated CPU
/// counts carry it, as they carry no time of their own. A process whose
/// main thread exited is kept as [`EXITED`] until its pid is given to a
/// new task, so that the last samples of its exit are not taken for a new
/// process under the same pid.
#[map]
static SEEN: LruHashMap<u32, u64> = LruHashMap::with_max_entries(SEEN_ENTRIES, 0);

/// Anchor records sent for a young image (see [`anchor_young_image`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct AnchorsSent {
    /// The image's start, as in `SEEN`.
    since: u64,
    sent: u64,
}

/// Anchor records sent per image: the first samples name its main files,
/// and a burst of new images must not fill the process event ring.
const ANCHORS_PER_IMAGE: u64 = 3;

/// Anchor records sent per young image, by process.
#[map]
static ANCHORS_SENT: LruHashMap<u32, AnchorsSent> = LruHashMap::with_max_entries(4096, 0);
/// Tasks forked by a known process that have not exec'd: their exec must
/// reach the daemon, which symbolizes them with their parent's mappings
/// until then.
#[map]
static FORKED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(FORKED_ENTRIES, 0);
#[map]
static CONTROL: Array<u32> = Array::with_max_entries(control::COUNT, 0);
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);
#[map]
static COUNTS_0: PerCpuHashMap<SampleKey, u64> = PerCpuHashMap::with_max_entries(COUNTS_ENTRIES, 0);
#[map]
static COUNTS_1: PerCpuHashMap<SampleKey, u64> = PerCpuHashMap::with_max_entries(COUNTS_ENTRIES, 0);
#[map]
static STACKS_0: HashMap<StackHash, Stack> =
    HashMap::with_max_entries(STACKS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static STACKS_1: HashMap<StackHash, Stack> =
    HashMap::with_max_entries(STACKS_ENTRIES, BPF_F_NO_PREALLOC);
/// Per-CPU scratch space for the stack being recorded (too big for the
/// 512-byte BPF stack).
#[map]
static SCRATCH: PerCpuArray<Stack> = PerCpuArray::with_max_entries(1, 0);
/// Processes to unwind with frame pointers in `AUTO` mode (set by the daemon,
/// e.g. for Go binaries).
#[map]
static FP_PROCESSES: HashMap<u32, u8> = HashMap::with_max_entries(TARGETS_ENTRIES, 0);
/// The top of each thread's stack mapping, learned by the first stack copy
/// that reached it (see copy_stack).
#[map]
static STACK_TOPS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(STACK_TOPS_ENTRIES, 0);
#[map]
static STACK_SAMPLES: RingBuf = RingBuf::with_byte_size(STACK_SAMPLES_BYTES, 0);
#[map]
static PROC_EVENTS: RingBuf = RingBuf::with_byte_size(PROC_EVENTS_BYTES, 0);
/// Heap sampling state per thread id.
#[map]
static HEAP_THREADS: LruHashMap<u32, HeapThread> =
    LruHashMap::with_max_entries(HEAP_THREADS_ENTRIES, 0);
/// Sampled allocations still live, by process and address.
#[map]
static HEAP_LIVE: HashMap<LiveKey, u64> =
    HashMap::with_max_entries(HEAP_LIVE_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static HEAP_EVENTS: RingBuf = RingBuf::with_byte_size(HEAP_EVENTS_BYTES, 0);
/// The futex call each thread is in (waits, and kept wake-ups), in the
/// thread's own storage: a wait only writes it in place and its end marks
/// it done, where a hash map cost an insert and a delete per wait. A
/// thread's value is made at its first targeted futex call and freed with
/// the thread, so the map holds at most one per live targeted thread.
#[btf_map]
static FUTEX_CALLS: TaskStorage<FutexCall> = TaskStorage::new();
/// Where the thread's exec is (ns), from its point of no return until it
/// completes: when it passed that point, then when the thread took the
/// new program's name. The EXEC event carries the latter: records taken
/// from then on show the new name, as `perf` charges samples after an
/// exec's COMM event to the new program; the exec's own end comes some
/// 100 us later.
#[btf_map]
static EXEC_STARTS: TaskStorage<u64> = TaskStorage::new();
/// The condition variable each thread last entered a wait on (the
/// `cond_wait_probe` at `pthread_cond_*wait`); made at a thread's first
/// such wait and freed with the thread.
#[btf_map]
static COND_WAITS: TaskStorage<CondWait> = TaskStorage::new();
/// The latest kept wake-up per futex word (process, address).
#[map]
static FUTEX_WAKERS: LruHashMap<FutexKey, FutexWaker> =
    LruHashMap::with_max_entries(FUTEX_WAKERS_ENTRIES, 0);
/// When a kept wake-up last entered, by a hash of its futex word: a wait
/// that started after that time cannot have been ended by a kept wake-up,
/// so it skips the FUTEX_WAKERS lookup (most waits, at the default
/// fraction). A collision only costs the lookup.
#[map]
static WAKER_TIMES: Array<u64> = Array::with_max_entries(WAKER_TIME_SLOTS, 0);
/// Per-CPU sequence numbers that make wake-up ids unique.
#[map]
static WAKE_SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Stacks of blocked threads, by task (the task_struct's address: the
/// switch-in knows the task, not its id), until they run again.
#[map]
static OFFCPU_PARKED: HashMap<u64, OffcpuRecord> =
    HashMap::with_max_entries(OFFCPU_PARKED_ENTRIES, BPF_F_NO_PREALLOC);
/// A zeroed record to create a thread's parked slot from (far larger than
/// the BPF stack).
#[map]
static OFFCPU_SCRATCH: PerCpuArray<OffcpuRecord> = PerCpuArray::with_max_entries(1, 0);
/// Parked goroutines by (process, g address).
#[map]
static GO_PARKED: LruHashMap<FutexKey, GoPark> = LruHashMap::with_max_entries(GO_PARKED_ENTRIES, 0);
#[map]
static WAIT_EVENTS: RingBuf = RingBuf::with_byte_size(WAIT_EVENTS_BYTES, 0);
/// A per-CPU buffer for the stack words a walk hint is checked against,
/// and the frames of a matched hint.
#[repr(C)]
pub struct HintScratch {
    bytes: [u8; STACK_COPY_BYTES],
    frames: [u64; WALK_HINT_WORDS],
}

#[map]
static HINT_SCRATCH: PerCpuArray<HintScratch> = PerCpuArray::with_max_entries(1, 0);
/// The stack words of the daemon's remembered walks, by where they start
/// (written by the daemon).
#[map]
static WALK_HINTS: LruHashMap<WalkHintKey, WalkHint> =
    LruHashMap::with_max_entries(WALK_HINTS_ENTRIES, 0);

#[inline(always)]
fn global<T: Copy>(v: &T) -> T {
    // SAFETY: as for global_u8.
    unsafe { core::ptr::read_volatile(v) }
}

#[inline(always)]
fn global_u8(v: &u8) -> u8 {
    // SAFETY: the daemon patches these read-only globals before loading;
    // a volatile read keeps the compiler from folding the default value.
    unsafe { core::ptr::read_volatile(v) }
}

#[inline(always)]
fn count(index: u32) {
    count_n(index, 1);
}

#[inline(always)]
fn count_n(index: u32, n: u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; a program does not nest with itself on a CPU.
        unsafe { *c += n };
    }
}

#[inline(always)]
fn is_target(tgid: u32) -> bool {
    // SAFETY: the value is not used, only its presence.
    global_u8(&FILTER_TARGETS) == 0 || unsafe { TARGETS.get(tgid).is_some() }
}

#[inline(always)]
fn send_proc_event(kind: u32, tgid: u32) {
    send_proc_event_from(kind, tgid, 0);
}

#[inline(always)]
fn send_proc_event_from(kind: u32, tgid: u32, parent: u32) {
    // SAFETY: plain helper.
    send_proc_event_at(kind, tgid, parent, unsafe { bpf_ktime_get_ns() });
}

#[inline(always)]
fn send_proc_event_at(kind: u32, tgid: u32, parent: u32, time_ns: u64) {
    let event = ProcEvent {
        kind,
        tgid,
        parent,
        _pad: 0,
        time_ns,
    };
    if PROC_EVENTS.output::<ProcEvent>(&event, 0).is_err() {
        count(counter::PROC_EVENTS_LOST);
        klog!(why::PROC_EVENT_LOST, klog::tgid(), klog::tid(), kind, tgid);
    }
}

/// The value of a `SEEN` process whose main thread exited.
const EXITED: u64 = u64::MAX;

/// Tells the daemon about a process the first time it is sampled; returns
/// when its current image started (the NEW event's time, or its exec's; 0
/// for a process on its way out, whose image the daemon knows).
#[inline(always)]
fn note_process(tgid: u32) -> u64 {
    // SAFETY: the value is copied out.
    if let Some(&since) = unsafe { SEEN.get(tgid) } {
        return if since == EXITED { 0 } else { since };
    }
    // SAFETY: plain helper.
    let now = unsafe { bpf_ktime_get_ns() };
    // BPF_NOEXIST: when two CPUs race here, only one sends the event.
    if SEEN.insert(tgid, now, BPF_NOEXIST as u64).is_ok() {
        send_proc_event_at(proc_event::NEW, tgid, 0, now);
        return now;
    }
    // SAFETY: the value is copied out.
    unsafe { SEEN.get(tgid) }.copied().unwrap_or(0)
}

/// During the first [`ANCHOR_WINDOW_NS`] of an image that started at
/// `since` (0: none known), sends anchors of the current user stack, at
/// most [`ANCHORS_PER_IMAGE`] times.
#[inline(always)]
fn anchor_young_image(ctx: *mut core::ffi::c_void, tgid: u32, since: u64) {
    // SAFETY: plain helper.
    if since == 0 || unsafe { bpf_ktime_get_ns() }.wrapping_sub(since) >= ANCHOR_WINDOW_NS {
        return;
    }
    match ANCHORS_SENT.get_ptr_mut(tgid) {
        // SAFETY: a value of the map; a race between CPUs only sends one
        // record more.
        Some(sent) if unsafe { (*sent).since } == since => unsafe {
            if (*sent).sent >= ANCHORS_PER_IMAGE {
                return;
            }
            (*sent).sent += 1;
        },
        _ => {
            let _ = ANCHORS_SENT.insert(tgid, AnchorsSent { since, sent: 1 }, 0);
        }
    }
    send_anchors(ctx, tgid, since);
}

/// Sends the first user frames of `ctx`'s stack as addresses and as (build
/// ID, file offset) pairs: see [`ImageAnchors`]. The kernel walks the
/// frame-pointer chain twice over the same memory, so both lists name the
/// same frames.
#[inline(always)]
fn send_anchors(ctx: *mut core::ffi::c_void, tgid: u32, since: u64) {
    /// `BPF_F_USER_BUILD_ID`.
    const USER_BUILD_ID: u64 = 1 << 11;
    // Anchors must never crowd out the process events themselves (an exit
    // lost leaves probes behind): they use at most half of the ring.
    if PROC_EVENTS.query(BPF_RB_AVAIL_DATA as u64) > u64::from(PROC_EVENTS_BYTES / 2) {
        count(counter::ANCHORS_LOST);
        klog!(why::ANCHORS_HALF_FULL, tgid, klog::tid());
        return;
    }
    let Some(mut entry) = PROC_EVENTS.reserve::<ImageAnchors>(0) else {
        count(counter::ANCHORS_LOST);
        klog!(why::ANCHORS_LOST, tgid, klog::tid());
        return;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: the entry is ours until submitted or discarded.
    let (ips, frames) = unsafe {
        (*out).kind = proc_event::ANCHORS;
        (*out).tgid = tgid;
        (*out)._pad = 0;
        (*out).time_ns = since;
        let ips = bpf_get_stack(
            ctx,
            (*out).ips.as_mut_ptr().cast(),
            (ANCHOR_FRAMES * 8) as u32,
            BPF_F_USER_STACK as u64,
        );
        let frames = bpf_get_stack(
            ctx,
            (*out).frames.as_mut_ptr().cast(),
            (ANCHOR_FRAMES * core::mem::size_of::<BuildIdFrame>()) as u32,
            BPF_F_USER_STACK as u64 | USER_BUILD_ID,
        );
        (ips, frames)
    };
    if ips <= 0 || frames <= 0 {
        entry.discard(0);
        return;
    }
    let len = (ips as u64 / 8).min(frames as u64 / core::mem::size_of::<BuildIdFrame>() as u64);
    // SAFETY: as above.
    unsafe { (*out).len = len as u32 };
    entry.submit(0);
}

/// A known process's image started at `since` (its exec). A process whose
/// old main thread exited (an exec from another thread) lives on.
#[inline(always)]
fn note_image(tgid: u32, since: u64) {
    // SAFETY: presence check only.
    if unsafe { SEEN.get(tgid).is_some() } {
        let _ = SEEN.insert(tgid, since, 0);
    }
}

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    klog::run(ctx, cpu_sample_run)
}

#[inline(always)]
fn cpu_sample_run(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    // The idle task: the CPU did no work for anyone.
    if tid == 0 || !is_target(tgid) {
        return 0;
    }
    count(counter::SAMPLES);
    let image_since = note_process(tgid);
    anchor_young_image(ctx.as_ptr(), tgid, image_since);

    let comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
    if use_dwarf(tgid) && send_stack_sample(&ctx, tgid, tid, &comm) {
        return 0;
    }
    let active = CONTROL.get(control::ACTIVE_BUFFER).copied().unwrap_or(0);
    let (stacks, counts) = if active == 0 {
        (&STACKS_0, &COUNTS_0)
    } else {
        (&STACKS_1, &COUNTS_1)
    };
    let user_stack = record_stack(
        &ctx,
        stacks,
        BPF_F_USER_STACK as u64,
        counter::USER_STACK_LOST,
    );
    // A sample taken in user mode has no kernel stack: skip the helper.
    let kernel_stack = if in_user_mode(&ctx) {
        STACK_NONE
    } else {
        record_stack(&ctx, stacks, 0, counter::KERNEL_STACK_LOST)
    };
    let key = SampleKey {
        tgid,
        tid,
        user_stack,
        kernel_stack,
        comm,
        image_since,
    };
    match counts.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of a per-CPU map; no other writer.
        Some(v) => unsafe { *v += 1 },
        None => {
            // Inserting from a program zeroes the other CPUs' slots.
            if counts.insert(key, 1u64, BPF_NOEXIST as u64).is_err() {
                // Another CPU inserted the key first: add to our slot.
                match counts.get_ptr_mut(key) {
                    // SAFETY: as above.
                    Some(v) => unsafe { *v += 1 },
                    None => {
                        count(counter::COUNTS_FULL);
                        klog!(why::COUNTS_FULL, tgid, tid);
                    }
                }
            }
        }
    }
    0
}

/// Ring buffer wake-up policy: waking the daemon for every record would
/// cost a context switch each; it reads the rings every second anyway and
/// is woken early only when a ring is a quarter full.
#[inline(always)]
fn wake_flag(ring: &RingBuf, bytes: &u32) -> u64 {
    // SAFETY: as global_u8: a read-only global patched before loading.
    let bytes = unsafe { core::ptr::read_volatile(bytes) };
    if ring.query(BPF_RB_AVAIL_DATA as u64) > u64::from(bytes / 4) {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

#[inline(always)]
fn use_dwarf(tgid: u32) -> bool {
    match global_u8(&UNWIND_MODE) {
        unwind_mode::FP => false,
        unwind_mode::DWARF => true,
        // SAFETY: presence check only.
        _ => unsafe { FP_PROCESSES.get(tgid).is_none() },
    }
}

/// The user registers (ip, sp, bp) of the current task: those of the
/// interrupted context when the sample hit user code, else the ones the
/// task saved on entering the kernel. None for kernel threads.
#[inline(always)]
fn user_regs(ctx: &PerfEventContext) -> Option<(u64, u64, u64)> {
    let (ip, sp, bp) = if in_user_mode(ctx) {
        let data = ctx.as_ptr() as *const bpf_perf_event_data;
        // SAFETY: direct context loads, which the verifier rewrites to the
        // sampled registers (a probe read of the context would read the
        // kernel's own, different structure).
        unsafe { ((*data).regs.rip, (*data).regs.rsp, (*data).regs.rbp) }
    } else {
        task_user_regs()?
    };
    if ip == 0 || sp == 0 {
        return None;
    }
    Some((ip, sp, bp))
}

/// Sends the sample with a copy of the user stack for unwinding in the
/// daemon. Returns false (the caller records a frame-pointer sample
/// instead) for kernel threads and when the ring buffer is full.
#[inline(always)]
fn send_stack_sample(ctx: &PerfEventContext, tgid: u32, tid: u32, comm: &[u8; COMM_LEN]) -> bool {
    let Some((ip, sp, bp)) = user_regs(ctx) else {
        return false;
    };
    let sent = if stack_fits(tid, sp, SHORT_STACK_BYTES) {
        send_stack_sample_in::<SHORT_STACK_BYTES>(ctx, tgid, tid, comm, (ip, sp, bp))
    } else {
        send_stack_sample_in::<STACK_COPY_BYTES>(ctx, tgid, tid, comm, (ip, sp, bp))
    };
    if sent {
        count(counter::STACK_SAMPLES);
    } else {
        count(counter::STACK_SAMPLES_FULL);
        klog!(why::FRAME_POINTER_FALLBACK, tgid, tid);
    }
    sent
}

/// Sends a CPU sample in the record form with an N-byte stack copy.
#[inline(always)]
fn send_stack_sample_in<const N: usize>(
    ctx: &PerfEventContext,
    tgid: u32,
    tid: u32,
    comm: &[u8; COMM_LEN],
    (ip, sp, bp): (u64, u64, u64),
) -> bool {
    let Some(mut entry) = STACK_SAMPLES.reserve::<StackSample<N>>(0) else {
        return false;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: the entry is ours until submitted; fields are written in
    // place because the record is far larger than the BPF stack.
    unsafe {
        (*out).tgid = tgid;
        (*out).tid = tid;
        (*out).time_ns = bpf_ktime_get_ns();
        (*out).ip = ip;
        (*out).sp = sp;
        (*out).bp = bp;
        (*out).comm = *comm;
        let mut kernel_len = 0u64;
        if !in_user_mode(ctx) {
            let bytes = bpf_get_stack(
                ctx.as_ptr(),
                (*out).kernel.as_mut_ptr().cast(),
                (MAX_STACK_DEPTH * 8) as u32,
                0,
            );
            if bytes > 0 {
                kernel_len = (bytes as u64 / 8).min(MAX_STACK_DEPTH as u64);
            }
        }
        (*out).kernel_len = kernel_len;
        (*out).stack_len = counted_copy_stack::<N>((*out).stack.as_mut_ptr(), sp);
    }
    entry.submit(wake_flag(&STACK_SAMPLES, &STACK_SAMPLES_RING));
    true
}

/// Whether thread `tid`'s stack from `sp` to its known top (STACK_TOPS)
/// fits in N bytes: then a record with an N-byte copy holds all of it.
#[inline(always)]
fn stack_fits(tid: u32, sp: u64, n: usize) -> bool {
    if global_u8(&SHORT_RECORDS) == 0 {
        return false;
    }
    let top = stack_top(tid);
    top > sp && top - sp < n as u64
}

/// Where thread `tid`'s stack ends, if known (0: not known, or stack tops
/// are off).
#[inline(always)]
fn stack_top(tid: u32) -> u64 {
    if global_u8(&USE_STACK_TOPS) == 0 {
        return 0;
    }
    // SAFETY: the value is copied out.
    unsafe { STACK_TOPS.get(tid) }.copied().unwrap_or(0)
}

/// [`copy_stack`], counted in STACK_COPIES and STACK_BYTES_COPIED.
#[inline(always)]
unsafe fn counted_copy_stack<const N: usize>(dst: *mut u8, sp: u64) -> u64 {
    // SAFETY: as the caller's.
    let copied = unsafe { copy_stack::<N>(dst, sp) };
    count(counter::STACK_COPIES);
    count_n(counter::STACK_BYTES_COPIED, copied);
    copied
}

/// Copies up to N bytes of user stack from `sp` into `dst` (N long, a
/// multiple of the page size), stopping at the top of the thread's stack.
///
/// A read that runs past the top of the stack faults, and a faulting read
/// costs about a microsecond: more than the copy. So the top, found once
/// per thread by copying page by page, is remembered in STACK_TOPS and
/// later copies read exactly up to it.
#[inline(always)]
unsafe fn copy_stack<const N: usize>(dst: *mut u8, sp: u64) -> u64 {
    const PAGE: u64 = 4096;
    let tid = bpf_get_current_pid_tgid() as u32;
    let top = stack_top(tid);
    if top > sp && top - sp < N as u64 {
        let len = (top - sp) as u32;
        // The bounds the verifier needs for the length.
        if len > 0 && len <= N as u32 {
            // SAFETY: len <= N, the length of dst.
            if unsafe { bpf_probe_read_user(dst.cast(), len, sp as *const _) } == 0 {
                return u64::from(len);
            }
        }
    } else {
        // Deep in the stack (or its top not known yet): all of it at once.
        // SAFETY: dst is N long.
        if unsafe { bpf_probe_read_user(dst.cast(), N as u32, sp as *const _) } == 0 {
            return N as u64;
        }
    }
    // Up to the end of sp's page first, then whole pages, until a page
    // cannot be read: the top of the stack.
    let first = PAGE - (sp & (PAGE - 1));
    // SAFETY: first <= PAGE <= N.
    if unsafe { bpf_probe_read_user(dst.cast(), first as u32, sp as *const _) } != 0 {
        klog!(why::STACK_FAULT, klog::tgid(), tid, sp);
        return 0;
    }
    let mut copied = first;
    for _ in 0..(N as u64 / PAGE - 1) {
        // Bounds the offset for the verifier: copied + PAGE must fit.
        if copied > N as u64 - PAGE {
            break;
        }
        // SAFETY: copied + PAGE <= N.
        let ok = unsafe {
            bpf_probe_read_user(
                dst.add(copied as usize).cast(),
                PAGE as u32,
                (sp + copied) as *const _,
            )
        };
        if ok != 0 {
            klog!(why::STACK_SHORTENED, klog::tgid(), tid, sp, copied);
            if global_u8(&USE_STACK_TOPS) != 0 {
                let _ = STACK_TOPS.insert(tid, sp + copied, 0);
            }
            break;
        }
        copied += PAGE;
    }
    copied
}

/// Whether the interrupted code ran in user mode (CPL 3 in CS).
#[inline(always)]
fn in_user_mode(ctx: &PerfEventContext) -> bool {
    let data = ctx.as_ptr() as *const bpf_perf_event_data;
    // SAFETY: the context of a perf_event program is bpf_perf_event_data;
    // reading its registers is a checked context access.
    let cs = unsafe { (*data).regs.cs };
    cs & 3 == 3
}

/// Records the current user (`flags` = BPF_F_USER_STACK) or kernel stack
/// and returns its hash, or STACK_NONE / STACK_LOST.
#[inline(always)]
fn record_stack(
    ctx: &PerfEventContext,
    stacks: &HashMap<StackHash, Stack>,
    flags: u64,
    lost: u32,
) -> StackHash {
    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        count(lost);
        return STACK_LOST;
    };
    // SAFETY: this CPU's scratch slot; nothing else uses it meanwhile.
    let buf = unsafe { &mut *buf };
    // SAFETY: the buffer is a map value of exactly the size passed.
    let bytes = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            buf.ips.as_mut_ptr().cast(),
            (MAX_STACK_DEPTH * 8) as u32,
            flags,
        )
    };
    if bytes <= 0 {
        // -EFAULT or nothing: a kernel thread has no user stack, and a
        // sample taken in user mode has no kernel stack.
        if bytes == 0 || bytes == EFAULT {
            return STACK_NONE;
        }
        count(lost);
        let why = match flags {
            0 => why::KERNEL_STACK_WALK_FAILED,
            _ => why::USER_STACK_WALK_FAILED,
        };
        klog!(why, klog::tgid(), klog::tid(), bytes);
        return STACK_LOST;
    }
    let len = (bytes as usize / 8).min(MAX_STACK_DEPTH);
    buf.len = len as u64;
    // FxHash-style mixing of every frame; 64 bits keep collisions between
    // the few thousand stacks of a window improbable.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ len as u64;
    for i in 0..MAX_STACK_DEPTH {
        if i >= len {
            break;
        }
        hash = (hash.rotate_left(5) ^ buf.ips[i]).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    if hash <= STACK_LOST {
        hash += 2;
    }
    // SAFETY: presence check only.
    if unsafe { stacks.get(hash).is_none() } {
        // -EEXIST: another CPU stored the same stack first, which is fine.
        // By reference: a copy of the 1 KiB stack would not fit the
        // 512-byte BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        let stored = stacks.insert(hash, &*buf, BPF_NOEXIST as u64);
        if let Err(e) = stored
            && e != -17
        {
            count(lost);
            let why = match flags {
                0 => why::KERNEL_STACK_MAP_FULL,
                _ => why::USER_STACK_MAP_FULL,
            };
            klog!(why, klog::tgid(), klog::tid(), e);
            return STACK_LOST;
        }
    }
    hash
}

/// The allocator probes of heap profiles, attached as a uprobe session to
/// every allocator entry point (the cookie names the function). The same
/// program runs at a call's entry and, when the entry returned 0, at its
/// return.
///
/// At entry an unsampled malloc or calloc only counts its bytes down and
/// returns 1, so that its return costs nothing. A call that exhausts the
/// thread's byte budget is sampled: its return records the address, the
/// size and the caller's stack. The other allocation functions always ask
/// for their return, because some allocators implement them with a call to
/// malloc (glibc's realloc(NULL, n), memalign with a small alignment): a
/// call entered while another is pending, deeper on the same stack, is
/// nested and not counted again. free, and realloc of a sampled address,
/// retire the address.
///
/// Written without aya's `#[uprobe]` macro, which returns 0 whatever the
/// function returns: in a session that would ask for every return.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn heap_probe(ctx: *mut core::ffi::c_void) -> u32 {
    klog::run(ProbeContext::new(ctx), heap_probe_run)
}

#[inline(always)]
fn heap_probe_run(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tgid == global(&SELF_TGID) {
        return 1;
    }
    let regs = ctx.regs;
    // SAFETY: the context of a uprobe is the user's pt_regs; these are
    // checked context loads.
    let (sp, arg0, arg1, arg2) = unsafe { ((*regs).rsp, (*regs).rdi, (*regs).rsi, (*regs).rdx) };
    // SAFETY: plain helper on our own context.
    let function = unsafe { bpf_get_attach_cookie(ctx.regs.cast()) };
    if function == alloc_fn::FREE {
        retire(tgid, arg0);
        return 1;
    }
    let Some(state) = heap_thread(tid) else {
        return 1;
    };
    // SAFETY: the map value stays valid for this program run; a thread
    // runs one program at a time.
    let state = unsafe { &mut *state };
    // At a return the registers are the caller's, past the call; at an
    // entry the instruction pointer is the probe's.
    // SAFETY: plain helper on our own context; checked context load.
    let is_return = unsafe { bpf_get_func_ip(ctx.regs.cast()) != (*regs).rip };
    if is_return {
        // Only the pending call's own return counts: `ret` popped its
        // return address. (A call tail-called by the pending one may
        // report a return of its own at the same point.)
        if state.pending_sp != 0
            && sp == state.pending_sp + 8
            && function == u64::from(state.pending_fn)
        {
            on_return(&ctx, state, tgid, tid);
        }
        return 0;
    }
    if state.pending_sp != 0 {
        // Nested in the pending call, counted by it: deeper on the stack, or
        // at the same depth when the pending call tail-calls (glibc's
        // realloc(NULL, n) jumps to malloc).
        // SAFETY: plain helper.
        if sp <= state.pending_sp
            && unsafe { bpf_ktime_get_ns() } - state.pending_ns < PENDING_STALE_NS
        {
            return 1;
        }
        // A pending call that never returned (longjmp out of it): forget it.
        state.pending_sp = 0;
    }
    let (size, out, old) = match function {
        alloc_fn::MALLOC | alloc_fn::VALLOC => (arg0, 0, 0),
        alloc_fn::CALLOC => (mul_or_zero(arg0, arg1), 0, 0),
        alloc_fn::REALLOC => (arg1, 0, arg0),
        alloc_fn::REALLOCARRAY => (mul_or_zero(arg1, arg2), 0, arg0),
        alloc_fn::POSIX_MEMALIGN => (arg2, arg0, 0),
        alloc_fn::ALIGNED_ALLOC | alloc_fn::MEMALIGN => (arg1, 0, 0),
        alloc_fn::PVALLOC => ((arg0 + 4095) & !4095, 0, 0),
        _ => return 1,
    };
    if old != 0 {
        retire(tgid, old);
    }
    let sampled = size > 0 && take_sample(state, size);
    let composite = function != alloc_fn::MALLOC && function != alloc_fn::CALLOC;
    if !sampled && !composite {
        return 1;
    }
    state.pending_sp = sp;
    // SAFETY: plain helper.
    state.pending_ns = unsafe { bpf_ktime_get_ns() };
    state.pending_size = size;
    state.pending_out = out;
    state.pending_fn = function as u32;
    state.pending_sampled = u32::from(sampled);
    0
}

/// n * size as calloc computes it; a request that overflows fails and
/// allocates nothing. (An overflow check by division or checked_mul makes
/// LLVM emit a 128-bit multiply, which BPF lacks; factors below 2^32 cannot
/// overflow, and larger ones are only plausible times one.)
#[inline(always)]
fn mul_or_zero(n: u64, size: u64) -> u64 {
    if (n | size) >> 32 == 0 {
        n * size
    } else if n == 1 {
        size
    } else if size == 1 {
        n
    } else {
        0
    }
}

/// Allocator calls return within microseconds; a pending call older than
/// this was left without a return (longjmp) and is forgotten.
const PENDING_STALE_NS: u64 = 1_000_000_000;

/// The thread's heap state, created with a fresh byte budget on first use.
#[inline(always)]
fn heap_thread(tid: u32) -> Option<*mut HeapThread> {
    if let Some(state) = HEAP_THREADS.get_ptr_mut(tid) {
        return Some(state);
    }
    let fresh = HeapThread {
        remaining: draw_sample_distance(),
        ..HeapThread::default()
    };
    if HEAP_THREADS.insert(tid, fresh, 0).is_err() {
        count(counter::HEAP_THREADS_FULL);
        klog!(why::HEAP_THREADS_FULL, klog::tgid(), tid);
        return None;
    }
    HEAP_THREADS.get_ptr_mut(tid)
}

#[inline(always)]
fn draw_sample_distance() -> u64 {
    // SAFETY: plain helper.
    let random = unsafe { bpf_get_prandom_u32() };
    next_sample_distance(random, global(&HEAP_SAMPLE_BYTES))
}

/// Go's rule (runtime/malloc.go): an allocation smaller than what is left
/// of the budget only counts it down; one that reaches it is sampled and a
/// new budget is drawn.
#[inline(always)]
fn take_sample(state: &mut HeapThread, size: u64) -> bool {
    if size < state.remaining {
        state.remaining -= size;
        return false;
    }
    state.remaining = draw_sample_distance();
    true
}

/// The pending call returned: record it if it was sampled.
#[inline(always)]
fn on_return(ctx: &ProbeContext, state: &mut HeapThread, tgid: u32, tid: u32) {
    state.pending_sp = 0;
    if state.pending_sampled == 0 {
        return;
    }
    let function = state.pending_fn;
    // SAFETY: checked context load.
    let ret = unsafe { (*ctx.regs).rax };
    let addr = if u64::from(function) == alloc_fn::POSIX_MEMALIGN {
        // It returns an error number and stores the pointer through `out`.
        if ret as u32 != 0 {
            return;
        }
        // SAFETY: a user pointer, read through the checked helper.
        match unsafe { read_user(state.pending_out as *const u64) } {
            Ok(addr) => addr,
            Err(_) => return,
        }
    } else {
        ret
    };
    if addr == 0 {
        return;
    }
    count(counter::HEAP_SAMPLES);
    // So that the daemon snapshots the process and hears of its exit.
    let image_since = note_process(tgid);
    anchor_young_image(ctx.as_ptr(), tgid, image_since);
    let key = LiveKey {
        tgid,
        _pad: 0,
        addr,
    };
    let live = HEAP_LIVE.insert(key, state.pending_size, 0).is_ok();
    if !live {
        count(counter::HEAP_LIVE_FULL);
        klog!(why::HEAP_LIVE_FULL, tgid, tid, addr);
    }
    if !send_heap_alloc(ctx, tgid, tid, function, addr, state.pending_size, live) {
        count(counter::HEAP_ALLOCS_LOST);
        klog!(why::HEAP_ALLOC_LOST, tgid, tid, addr, state.pending_size);
        if live {
            let _ = HEAP_LIVE.remove(key);
        }
    }
}

/// A freed address: if it was a sampled live allocation, tell the daemon.
#[inline(always)]
fn retire(tgid: u32, addr: u64) {
    if addr == 0 {
        return;
    }
    let key = LiveKey {
        tgid,
        _pad: 0,
        addr,
    };
    // A lookup first: it takes no lock, where a delete locks its bucket
    // even for the absent keys of nearly every free.
    // SAFETY: presence check only.
    if unsafe { HEAP_LIVE.get(key).is_none() } || HEAP_LIVE.remove(key).is_err() {
        return;
    }
    let event = HeapFree {
        kind: heap_event::FREE,
        tgid,
        addr,
    };
    if HEAP_EVENTS
        .output::<HeapFree>(&event, wake_flag(&HEAP_EVENTS, &HEAP_EVENTS_RING))
        .is_err()
    {
        count(counter::HEAP_FREES_LOST);
        klog!(why::HEAP_FREE_LOST, tgid, klog::tid(), addr);
    }
}

#[inline(always)]
fn send_heap_alloc(
    ctx: &ProbeContext,
    tgid: u32,
    tid: u32,
    function: u32,
    addr: u64,
    size: u64,
    live: bool,
) -> bool {
    // SAFETY: a context load of the user's stack pointer.
    let sp = unsafe { (*ctx.regs).rsp };
    let event = (tgid, tid, function, addr, size, live);
    if stack_fits(tid, sp, SHORT_STACK_BYTES) {
        send_heap_alloc_in::<SHORT_STACK_BYTES>(ctx, event)
    } else {
        send_heap_alloc_in::<STACK_COPY_BYTES>(ctx, event)
    }
}

/// Sends a sampled allocation in the record form with an N-byte stack
/// copy.
#[inline(always)]
fn send_heap_alloc_in<const N: usize>(
    ctx: &ProbeContext,
    (tgid, tid, function, addr, size, live): (u32, u32, u32, u64, u64, bool),
) -> bool {
    let Some(mut entry) = HEAP_EVENTS.reserve::<HeapAlloc<N>>(0) else {
        return false;
    };
    let out = entry.as_mut_ptr();
    let regs = ctx.regs;
    // SAFETY: the entry is ours until submitted; written in place (it is
    // far larger than the BPF stack). Register reads are context loads.
    unsafe {
        (*out).kind = heap_event::ALLOC;
        (*out).tgid = tgid;
        (*out).tid = tid;
        (*out).function = function;
        (*out).live = u32::from(live);
        (*out)._pad = 0;
        (*out).time_ns = bpf_ktime_get_ns();
        (*out).addr = addr;
        (*out).size = size;
        (*out).ip = (*regs).rip;
        (*out).sp = (*regs).rsp;
        (*out).bp = (*regs).rbp;
        (*out).comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
        ((*out).stack_len, (*out).frames_len) = record_user_stack::<N>(
            regs.cast(),
            tgid,
            (*regs).rsp,
            (*out).stack.as_mut_ptr(),
            (*out).frames.as_mut_ptr(),
        );
    }
    entry.submit(wake_flag(&HEAP_EVENTS, &HEAP_EVENTS_RING));
    true
}

/// sys_enter_futex: a wait starts, or a wake-up is drawn for the mutex
/// profile (one in MUTEX_FRACTION).
#[tracepoint]
pub fn futex_enter(ctx: TracePointContext) -> u32 {
    klog::run(ctx, futex_enter_run)
}

#[inline(always)]
fn futex_enter_run(ctx: TracePointContext) -> u32 {
    let offset = global(&FUTEX_UADDR_OFFSET) as usize;
    // The word and the operation in one read: two adjacent arguments.
    // SAFETY: fields of the tracepoint record, offset from its format file.
    let [uaddr, op]: [u64; 2] = unsafe { ctx.read_at(offset) }.unwrap_or([0, u64::MAX]);
    match op & futex_op::CMD_MASK {
        futex_op::WAIT
        | futex_op::WAIT_BITSET
        | futex_op::LOCK_PI
        | futex_op::LOCK_PI2
        | futex_op::WAIT_REQUEUE_PI => begin_wait(uaddr),
        futex_op::WAKE
        | futex_op::WAKE_BITSET
        | futex_op::WAKE_OP
        | futex_op::UNLOCK_PI
        | futex_op::REQUEUE
        | futex_op::CMP_REQUEUE
        | futex_op::CMP_REQUEUE_PI => begin_wake(uaddr),
        _ => {}
    }
    0
}

/// sys_enter_futex_wait and sys_enter_futex_waitv (whose first argument,
/// the waiter array, stands for the futex word).
#[tracepoint]
pub fn futex_wait_enter(ctx: TracePointContext) -> u32 {
    klog::run(ctx, futex_wait_enter_run)
}

#[inline(always)]
fn futex_wait_enter_run(ctx: TracePointContext) -> u32 {
    begin_wait(futex_uaddr(&ctx));
    0
}

/// sys_enter_futex_wake.
#[tracepoint]
pub fn futex_wake_enter(ctx: TracePointContext) -> u32 {
    klog::run(ctx, futex_wake_enter_run)
}

#[inline(always)]
fn futex_wake_enter_run(ctx: TracePointContext) -> u32 {
    begin_wake(futex_uaddr(&ctx));
    0
}

/// The process of the current system call, if it is targeted.
#[inline(always)]
fn futex_caller() -> Option<u32> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == global(&SELF_TGID) || !is_target(tgid) {
        return None;
    }
    Some(tgid)
}

#[inline(always)]
fn futex_uaddr(ctx: &TracePointContext) -> u64 {
    let offset = global(&FUTEX_UADDR_OFFSET) as usize;
    // SAFETY: a field of the tracepoint record, offset from its format file.
    unsafe { ctx.read_at(offset) }.unwrap_or(0)
}

#[inline(always)]
fn begin_wait(uaddr: u64) {
    if global_u8(&BLOCK_ON) == 0 && global_u8(&MUTEX_ON) == 0 {
        return;
    }
    if futex_caller().is_none() {
        return;
    }
    let call = FutexCall {
        // SAFETY: plain helper.
        start_ns: unsafe { bpf_ktime_get_ns() },
        uaddr,
        wake_id: 0,
        kind: futex_call::WAIT,
        _pad: 0,
    };
    set_futex_call(call);
}

#[inline(always)]
fn begin_wake(uaddr: u64) {
    if global_u8(&MUTEX_ON) == 0 {
        return;
    }
    // SAFETY: plain helper.
    if !keep_mutex_event(global(&MUTEX_FRACTION), unsafe { bpf_get_prandom_u32() }) {
        return;
    }
    let Some(tgid) = futex_caller() else {
        return;
    };
    // SAFETY: plain helpers.
    let (now, cpu) = unsafe { (bpf_ktime_get_ns(), bpf_get_smp_processor_id()) };
    let Some(seq) = WAKE_SEQ.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; programs do not nest on a CPU.
    let wake_id = unsafe {
        *seq += 1;
        (u64::from(cpu) << 48) | (*seq & 0xffff_ffff_ffff)
    };
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: uaddr,
    };
    let waker = FutexWaker {
        wake_id,
        time_ns: now,
        claimed: 0,
        woken: 0,
    };
    let _ = FUTEX_WAKERS.insert(key, waker, 0);
    // After the insert: a wait that finds this time finds the entry too.
    if let Some(slot) = WAKER_TIMES.get_ptr_mut(waker_slot(tgid, uaddr)) {
        // SAFETY: an array slot; a racing store of a kept wake-up that
        // entered at nearly the same time leaves a time just as late.
        unsafe { *slot = now };
    }
    let call = FutexCall {
        start_ns: now,
        uaddr,
        wake_id,
        kind: futex_call::WAKE,
        _pad: 0,
    };
    set_futex_call(call);
}

/// Notes the futex call the current thread is entering.
#[inline(always)]
fn set_futex_call(call: FutexCall) {
    match FUTEX_CALLS.current(true) {
        // SAFETY: the current thread's value; only its own programs touch it.
        Some(slot) => unsafe { *slot = call },
        None => {
            count(counter::FUTEX_CALLS_FULL);
            klog!(why::FUTEX_CALLS_FULL, klog::tgid(), klog::tid(), call.uaddr);
        }
    }
}

/// sys_exit of every futex call: a wait ends (block profile, and its delay
/// for the mutex profile if a kept wake-up ended it), or a kept wake-up
/// reports its stack when it woke someone.
#[tracepoint]
pub fn futex_exit(ctx: TracePointContext) -> u32 {
    klog::run(ctx, futex_exit_run)
}

#[inline(always)]
fn futex_exit_run(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let Some(slot) = FUTEX_CALLS.current(false) else {
        return 0;
    };
    // SAFETY: the current thread's value; copied out, then marked done.
    let call = unsafe {
        let call = *slot;
        (*slot).kind = futex_call::NONE;
        call
    };
    if call.kind == futex_call::NONE {
        return 0;
    }
    // SAFETY: plain helper.
    let now = unsafe { bpf_ktime_get_ns() };
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: call.uaddr,
    };
    if call.kind == futex_call::WAIT {
        count(counter::FUTEX_WAITS);
        let waited = now.saturating_sub(call.start_ns);
        // SAFETY: plain helper.
        let random = unsafe { bpf_get_prandom_u32() };
        if global_u8(&BLOCK_ON) != 0 && keep_block_event(waited, global(&BLOCK_RATE_NS), random) {
            send_wait_stack(&ctx, wait_event::BLOCK, tgid, tid, waited, call.uaddr);
        }
        if global_u8(&MUTEX_ON) != 0
            && woken_after(call.start_ns, tgid, call.uaddr)
            && let Some(waker) = FUTEX_WAKERS.get_ptr_mut(key)
        {
            // SAFETY: a map value, valid during this run; a lost update
            // between two waiters only loosens the claim bound.
            let waker = unsafe { &mut *waker };
            if waker.time_ns >= call.start_ns && (waker.woken == 0 || waker.claimed < waker.woken) {
                waker.claimed += 1;
                let event = MutexDelay {
                    kind: wait_event::MUTEX_DELAY,
                    tgid,
                    wake_id: waker.wake_id,
                    delay_ns: waker.time_ns - call.start_ns,
                };
                if WAIT_EVENTS
                    .output::<MutexDelay>(&event, wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING))
                    .is_err()
                {
                    count(counter::WAIT_EVENTS_LOST);
                    klog!(why::MUTEX_DELAY_LOST, tgid, tid, event.delay_ns);
                }
            }
        }
        return 0;
    }
    let offset = global(&SYSCALL_RET_OFFSET) as usize;
    // SAFETY: a field of the tracepoint record, offset from its format file.
    let ret: i64 = unsafe { ctx.read_at(offset) }.unwrap_or(0);
    match FUTEX_WAKERS.get_ptr_mut(key) {
        // SAFETY: as above.
        Some(waker) if unsafe { (*waker).wake_id } == call.wake_id => {
            if ret <= 0 {
                // It woke nobody: no wait may claim it.
                let _ = FUTEX_WAKERS.remove(key);
                return 0;
            }
            // SAFETY: as above.
            unsafe { (*waker).woken = ret.min(i64::from(u32::MAX)) as u32 };
        }
        _ => {}
    }
    if ret > 0 {
        send_wait_stack(
            &ctx,
            wait_event::MUTEX_WAKE,
            tgid,
            tid,
            call.wake_id,
            call.uaddr,
        );
    }
    0
}

/// The WAKER_TIMES slot of a futex word.
#[inline(always)]
fn waker_slot(tgid: u32, uaddr: u64) -> u32 {
    ((uaddr >> 2) as u32 ^ tgid.wrapping_mul(0x9e37_79b9)) & (WAKER_TIME_SLOTS - 1)
}

/// Whether a kept wake-up of this word's slot entered at or after `start`.
#[inline(always)]
fn woken_after(start: u64, tgid: u32, uaddr: u64) -> bool {
    WAKER_TIMES
        .get(waker_slot(tgid, uaddr))
        .is_some_and(|&time| time >= start)
}

/// Sends a kept wait or wake-up with the thread's user stack: a brief
/// record when the daemon's walk hint for these registers matches the
/// stack in user memory, else the record with a stack copy.
///
/// Most of a kept wait's cost was writing its copy into the ring: the
/// ring's memory was last touched by the daemon on another CPU, so every
/// cache line written misses. A matched hint is checked in a per-CPU
/// scratch buffer that stays in this CPU's cache, and the ring gets only
/// the head.
#[inline(always)]
fn send_wait_stack(
    ctx: &TracePointContext,
    kind: u32,
    tgid: u32,
    tid: u32,
    value: u64,
    uaddr: u64,
) {
    let (ip, sp, bp) = task_user_regs().unwrap_or((0, 0, 0));
    let mut head = WaitHead {
        kind,
        tgid,
        tid,
        flags: 0,
        value,
        uaddr,
        ip,
        sp,
        bp,
        hint_id: 0,
        // SAFETY: plain helper.
        time_ns: unsafe { bpf_ktime_get_ns() },
        cond: 0,
        comm: bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]),
    };
    if kind == wait_event::BLOCK {
        head.cond = cond_of(uaddr);
    }
    if global_u8(&BRIEF_RECORDS) != 0
        && let Some(scratch) = HINT_SCRATCH.get_ptr_mut(0)
        // SAFETY: this CPU's scratch buffer (programs do not nest on a
        // CPU).
        && let Some(found) = unsafe { hinted_walk(hint_key(tgid, ip, sp, bp), tid, scratch) }
    {
        head.flags = wait_flags::HINT_MATCHED | wait_flags::BRIEF | found.flags;
        head.hint_id = found.id;
        // The smallest room that holds the frames (BRIEF_FRAME_CLASSES).
        // SAFETY: the scratch frames were written by hinted_walk above,
        // found.frames of them.
        let sent = unsafe {
            if found.frames as usize <= BRIEF_FRAME_CLASSES[0] {
                send_brief::<{ BRIEF_FRAME_CLASSES[0] }>(&head, scratch, found.frames)
            } else if found.frames as usize <= BRIEF_FRAME_CLASSES[1] {
                send_brief::<{ BRIEF_FRAME_CLASSES[1] }>(&head, scratch, found.frames)
            } else {
                send_brief::<{ BRIEF_FRAME_CLASSES[2] }>(&head, scratch, found.frames)
            }
        };
        if sent {
            count(counter::BRIEF_RECORDS);
            klog!(why::BRIEF_SENT, tgid, tid, found.frames, found.id, sp);
        } else {
            count(counter::WAIT_EVENTS_LOST);
            klog!(why::BRIEF_LOST, tgid, tid, kind);
        }
        return;
    }
    let Some(mut entry) = WAIT_EVENTS.reserve::<WaitStack>(0) else {
        count(counter::WAIT_EVENTS_LOST);
        klog!(why::WAIT_LOST, tgid, tid, kind);
        return;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: the entry is ours until submitted; written in place.
    unsafe {
        (*out).head = head;
        ((*out).stack_len, (*out).frames_len) = record_user_stack::<STACK_COPY_BYTES>(
            ctx.as_ptr(),
            tgid,
            sp,
            (*out).stack.as_mut_ptr(),
            (*out).frames.as_mut_ptr(),
        );
    }
    entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
}

/// Where a walk starts, as walk hints are keyed.
#[inline(always)]
fn hint_key(tgid: u32, ip: u64, sp: u64, bp: u64) -> WalkHintKey {
    WalkHintKey {
        tgid,
        _pad: 0,
        ip,
        sp,
        bp,
    }
}

/// A walk hint that matched a thread's stack.
#[derive(Clone, Copy)]
struct HintMatch {
    /// The daemon's id of the walk.
    id: u64,
    /// Frames written after the instruction pointer.
    frames: u32,
    /// `wait_flags::WALK_TRUNCATED` or 0.
    flags: u32,
}

/// The daemon's walk hint for these registers if the thread's stack holds
/// every word it lists, with its frames written to `scratch.frames`. Only
/// the hint's span (the bytes from sp up to its last word) is copied, into
/// the per-CPU scratch buffer: far less than a full copy, which for most
/// threads reads all STACK_COPY_BYTES (memory above a thread's stack is
/// usually readable, so the copy does not stop at its top).
///
/// # Safety
/// `scratch` is this CPU's scratch buffer, used by nothing else meanwhile.
#[inline(always)]
unsafe fn hinted_walk(key: WalkHintKey, tid: u32, scratch: *mut HintScratch) -> Option<HintMatch> {
    if key.sp == 0 || !use_dwarf(key.tgid) {
        return None;
    }
    // SAFETY: a map value, read during this run only.
    let hint = unsafe { WALK_HINTS.get(key) }?;
    // SAFETY: a field of that value.
    let span = unsafe { core::ptr::read_volatile(&hint.span) };
    // The bounds the verifier needs for the length.
    if span == 0 || span > STACK_COPY_BYTES as u32 {
        return None;
    }
    // SAFETY: the caller's scratch buffer, STACK_COPY_BYTES long; span <=
    // that.
    unsafe {
        let bytes = (*scratch).bytes.as_mut_ptr();
        if bpf_probe_read_user(bytes.cast(), span, key.sp as *const _) != 0 {
            klog!(why::HINT_UNREADABLE, key.tgid, tid, span, key.sp);
            return None;
        }
        matching_walk_hint::<STACK_COPY_BYTES>(
            hint,
            key,
            tid,
            bytes,
            u64::from(span),
            (*scratch).frames.as_mut_ptr(),
        )
    }
}

/// `hint` (the daemon's remembered walk from the registers of `key`) if
/// the stack just copied (`len` bytes at `stack`, still in this CPU's
/// cache) holds every word that walk read; its frames after the
/// instruction pointer are written to `frames` (WALK_HINT_WORDS long). The
/// hint's seal is checked over everything read from it: a hint the daemon
/// replaced meanwhile is no match, and the caller sends a full record.
#[inline(always)]
unsafe fn matching_walk_hint<const N: usize>(
    hint: &WalkHint,
    key: WalkHintKey,
    tid: u32,
    stack: *const u8,
    len: u64,
    frames: *mut u64,
) -> Option<HintMatch> {
    // Volatile reads: each field is read once, and what is checked is what
    // is sealed and sent.
    // SAFETY: fields of a map value.
    let (id, used) = unsafe {
        (
            core::ptr::read_volatile(&hint.id),
            core::ptr::read_volatile(&hint.len) as usize,
        )
    };
    let mut seal = hint_mix(HINT_SEAL_SEED, id);
    for i in 0..WALK_HINT_WORDS {
        if i >= used {
            break;
        }
        // SAFETY: fields of a map value.
        let (offset, expected) = unsafe {
            (
                core::ptr::read_volatile(hint.offsets.get(i)?),
                core::ptr::read_volatile(hint.words.get(i)?),
            )
        };
        if u64::from(offset) + 8 > len {
            klog!(why::HINT_PAST_COPY, key.tgid, tid, key.sp, offset, len);
            return None;
        }
        // The daemon sends 8-aligned offsets; the mask keeps the read
        // inside the N-byte buffer (N a power of two) for the verifier.
        let at = offset as usize & (N - 8);
        // SAFETY: within the copy's buffer, as masked above.
        let word = unsafe { core::ptr::read_unaligned(stack.add(at).cast::<u64>()) };
        if word != expected {
            klog!(
                why::HINT_MISMATCH,
                key.tgid,
                tid,
                key.sp,
                offset,
                word,
                expected
            );
            return None;
        }
        seal = hint_mix(seal, expected ^ u64::from(offset));
    }
    // SAFETY: as above.
    let (nframes, flags) = unsafe {
        (
            core::ptr::read_volatile(&hint.frames_len),
            core::ptr::read_volatile(&hint.flags),
        )
    };
    for i in 0..WALK_HINT_WORDS {
        if i as u32 >= nframes {
            break;
        }
        // SAFETY: fields of a map value; the index is masked into `words`.
        let word = unsafe {
            let index = core::ptr::read_volatile(hint.frame_words.get(i)?) as usize;
            core::ptr::read_volatile(hint.words.get(index & (WALK_HINT_WORDS - 1))?)
        };
        // SAFETY: the caller's buffer holds WALK_HINT_WORDS frames.
        unsafe { *frames.add(i) = word };
        seal = hint_mix(seal, word);
    }
    seal = hint_mix(seal, u64::from(nframes) | u64::from(flags) << 32);
    // SAFETY: as above.
    if seal != unsafe { core::ptr::read_volatile(&hint.check) } || nframes > WALK_HINT_WORDS as u32
    {
        count(counter::HINTS_TORN);
        klog!(why::HINT_TORN, key.tgid, tid, id, key.sp);
        return None;
    }
    Some(HintMatch {
        id,
        frames: nframes,
        flags: flags & wait_flags::WALK_TRUNCATED,
    })
}

/// Copies `n` (at most WALK_HINT_WORDS) frames.
#[inline(always)]
unsafe fn copy_frames<const N: usize>(dst: *mut u64, src: *const u64, n: u32) {
    for i in 0..N {
        if i as u32 >= n {
            break;
        }
        // SAFETY: the caller's buffers hold N frames.
        unsafe { *dst.add(i) = *src.add(i) };
    }
}

/// Sends a brief wait record with room for N frames, the first `n` of
/// the scratch buffer's (n <= N). False when the ring is full.
///
/// # Safety
/// `scratch` is this CPU's scratch buffer, its first `n` frames written.
#[inline(always)]
unsafe fn send_brief<const N: usize>(head: &WaitHead, scratch: *const HintScratch, n: u32) -> bool {
    let Some(mut entry) = WAIT_EVENTS.reserve::<WaitBrief<N>>(0) else {
        return false;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: the entry is ours until submitted; the scratch buffer holds
    // WALK_HINT_WORDS >= N frames.
    unsafe {
        (*out).head = *head;
        (*out).frames_len = u64::from(n);
        copy_frames::<N>((*out).frames.as_mut_ptr(), (*scratch).frames.as_ptr(), n);
    }
    entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
    true
}

/// Records the current thread's user stack for an event: a copy of up to
/// N bytes from `sp` (into `stack`, N long) for unwinding in the daemon,
/// or frame-pointer frames (into `frames`, MAX_STACK_DEPTH long) walked by
/// the kernel. Returns (bytes copied, frames walked).
#[inline(always)]
unsafe fn record_user_stack<const N: usize>(
    ctx: *mut core::ffi::c_void,
    tgid: u32,
    sp: u64,
    stack: *mut u8,
    frames: *mut u64,
) -> (u64, u64) {
    if sp != 0 && use_dwarf(tgid) {
        // SAFETY: the caller's buffer is N long.
        return (unsafe { counted_copy_stack::<N>(stack, sp) }, 0);
    }
    // SAFETY: the caller's buffer holds MAX_STACK_DEPTH frames.
    let bytes = unsafe {
        bpf_get_stack(
            ctx,
            frames.cast(),
            (MAX_STACK_DEPTH * 8) as u32,
            BPF_F_USER_STACK as u64,
        )
    };
    let walked = if bytes > 0 {
        (bytes as u64 / 8).min(MAX_STACK_DEPTH as u64)
    } else {
        0
    };
    (0, walked)
}

/// The current task's user registers as saved on entering the kernel.
#[inline(always)]
fn task_user_regs() -> Option<(u64, u64, u64)> {
    // SAFETY: plain helpers; the pointer is only read through
    // bpf_probe_read_kernel.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs };
    // One read of the whole structure costs less than three of a word.
    // SAFETY: a read of a pt_regs, checked by the helper.
    let regs = unsafe { bpf_probe_read_kernel(regs) }.ok()?;
    Some((regs.rip, regs.rsp, regs.rbp))
}

/// sched_switch (the BTF tracepoint: it hands over both tasks): parks the
/// user stack of a targeted thread that leaves the CPU blocked (not one
/// that was preempted: it stays runnable), and when a parked thread is
/// switched back in, keeps the interval by Go's block rule (BLOCK_RATE_NS)
/// and sends it. The switch-out runs in the blocked thread's own context,
/// so its user stack can be copied there. Its kernel stack is walked only
/// for a kept interval, at the switch-in: the thread has not run since, so
/// its kernel stack is still the one it blocked with, and the walk (the
/// costliest part) is not paid for the intervals the rule drops.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> u32 {
    klog::run(ctx, sched_switch_run)
}

#[inline(always)]
fn sched_switch_run(ctx: BtfTracePointContext) -> u32 {
    if global_u8(&OFFCPU_ON) == 0 {
        return 0;
    }
    // sched_switch(bool preempt, struct task_struct *prev,
    //              struct task_struct *next, unsigned int prev_state)
    let preempt: u64 = ctx.arg(0);
    let next: *mut task_struct = ctx.arg(2);
    let state: u64 = ctx.arg(3);
    // SAFETY: plain helpers.
    let (now, prev) = unsafe { (bpf_ktime_get_ns(), bpf_get_current_task()) };
    // A task's last switch (TASK_DEAD) is no wait: its task_struct is freed
    // after it and may come back as a new task, which must not find a slot.
    if preempt & 0xff == 0 && state as u32 != 0 && state as u32 & TASK_DEAD == 0 {
        park(&ctx, prev, now);
    }
    unpark(next, now);
    0
}

/// `__state` of a task's final switch (include/linux/sched.h).
const TASK_DEAD: u32 = 0x80;

#[inline(always)]
fn park(ctx: &BtfTracePointContext, task: u64, now: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if tid == 0 || tgid == global(&SELF_TGID) || !is_target(tgid) {
        return;
    }
    count(counter::OFFCPU_SWITCHES);
    // The thread's slot stays in the map from one switch to the next (it
    // goes at the thread's exit), and is written in place: a new ~10 KiB
    // map element per switch would cost an allocation and a copy each.
    let record = match OFFCPU_PARKED.get_ptr_mut(task) {
        Some(slot) => slot,
        None => {
            let Some(blank) = OFFCPU_SCRATCH.get_ptr(0) else {
                return;
            };
            // SAFETY: the per-CPU scratch value, read-only here.
            #[allow(clippy::needless_borrows_for_generic_args)]
            if OFFCPU_PARKED.insert(task, unsafe { &*blank }, 0).is_err() {
                count(counter::OFFCPU_PARKED_FULL);
                klog!(why::OFFCPU_PARKED_FULL, tgid, tid);
                return;
            }
            match OFFCPU_PARKED.get_ptr_mut(task) {
                Some(slot) => slot,
                None => return,
            }
        }
    };
    let (ip, sp, bp) = task_user_regs().unwrap_or((0, 0, 0));
    // SAFETY: the thread's own map value (only this thread's switches and
    // its exit touch it), written in place.
    unsafe {
        (*record).kind = wait_event::OFFCPU;
        (*record).tgid = tgid;
        (*record).tid = tid;
        (*record).start_ns = now;
        (*record).duration_ns = 0;
        (*record).ip = ip;
        (*record).sp = sp;
        (*record).bp = bp;
        (*record).comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
        (*record).kernel_len = 0;
        (*record).flags = 0;
        (*record).hint_id = 0;
        (*record).frames_len = 0;
        // A kernel thread (sp 0) has no user stack.
        match sp {
            0 => (*record).stack_len = 0,
            _ => match parked_hint_match(hint_key(tgid, ip, sp, bp), record) {
                // The stack does not change while the thread is off CPU:
                // the match stands at its switch-in, and no copy is kept.
                Some(found) => {
                    (*record).stack_len = 0;
                    (*record).flags = wait_flags::HINT_MATCHED | wait_flags::BRIEF | found.flags;
                    (*record).hint_id = found.id;
                    (*record).frames_len = u64::from(found.frames);
                    klog!(why::BRIEF_PARKED, tgid, tid, found.frames, found.id, sp);
                }
                None => {
                    ((*record).stack_len, (*record).frames_len) =
                        record_user_stack::<OFFCPU_STACK_BYTES>(
                            ctx.as_ptr(),
                            tgid,
                            sp,
                            (*record).stack.as_mut_ptr(),
                            (*record).frames.as_mut_ptr(),
                        );
                }
            },
        }
    }
}

/// A walk hint matched at a switch-out, its frames written to the parked
/// record's `frames` (MAX_STACK_DEPTH long): the record then keeps no copy.
/// None when brief records are off.
///
/// # Safety
/// `record` is the thread's own parked record.
#[inline(always)]
unsafe fn parked_hint_match(key: WalkHintKey, record: *mut OffcpuRecord) -> Option<HintMatch> {
    if global_u8(&BRIEF_RECORDS) == 0 {
        return None;
    }
    let scratch = HINT_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch buffer; the record is the caller's.
    unsafe {
        let found = hinted_walk(key, (*record).tid, scratch)?;
        copy_frames::<WALK_HINT_WORDS>(
            (*record).frames.as_mut_ptr(),
            (*scratch).frames.as_ptr(),
            found.frames,
        );
        Some(found)
    }
}

#[inline(always)]
fn unpark(next: *mut task_struct, now: u64) {
    let Some(parked) = OFFCPU_PARKED.get_ptr_mut(next as u64) else {
        return;
    };
    // SAFETY: a map value, valid during this run.
    let start = unsafe { (*parked).start_ns };
    if start == 0 {
        // Not parked since it last ran.
        return;
    }
    let off = now.saturating_sub(start);
    // SAFETY: plain helper.
    let random = unsafe { bpf_get_prandom_u32() };
    if keep_block_event(off, global(&BLOCK_RATE_NS), random) {
        match WAIT_EVENTS.reserve::<OffcpuRecord>(0) {
            Some(mut entry) => {
                let out = entry.as_mut_ptr();
                // SAFETY: copies the parked record (a map value) into the
                // reserved entry of the same type: everything before the
                // stack copy, then only the bytes of it in use (a whole
                // record is 9 KiB; most copies are far shorter).
                let copied = unsafe { copy_parked(out, parked) };
                if copied == 0 {
                    // SAFETY: the entry is ours until submitted; `next`
                    // is the task the tracepoint hands over, blocked
                    // since it was parked.
                    unsafe {
                        (*out).duration_ns = off;
                        if (*out).flags & wait_flags::HINT_MATCHED == 0
                            && (*out).stack_len != 0
                            && global_u8(&BRIEF_RECORDS) != 0
                            && let key = hint_key((*out).tgid, (*out).ip, (*out).sp, (*out).bp)
                            && let Some(hint) = WALK_HINTS.get(key)
                            && let Some(found) = matching_walk_hint::<OFFCPU_STACK_BYTES>(
                                hint,
                                key,
                                (*out).tid,
                                (*out).stack.as_ptr(),
                                (*out).stack_len,
                                (*out).frames.as_mut_ptr(),
                            )
                        {
                            (*out).flags = wait_flags::HINT_MATCHED | found.flags;
                            (*out).hint_id = found.id;
                            (*out).frames_len = u64::from(found.frames);
                        }
                        let bytes = bpf_get_task_stack(
                            next,
                            (*out).kernel.as_mut_ptr().cast(),
                            (OFFCPU_KERNEL_DEPTH * 8) as u32,
                            0,
                        );
                        (*out).kernel_len = if bytes > 0 {
                            (bytes as u64 / 8).min(OFFCPU_KERNEL_DEPTH as u64)
                        } else {
                            0
                        };
                    }
                    entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
                } else {
                    entry.discard(0);
                }
            }
            None => {
                count(counter::WAIT_EVENTS_LOST);
                // SAFETY: fields of a map value.
                let (tgid, tid) = unsafe { ((*parked).tgid, (*parked).tid) };
                klog!(why::OFFCPU_LOST, tgid, tid, off);
            }
        }
    }
    // SAFETY: as above; the slot is kept for the thread's next switch.
    unsafe { (*parked).start_ns = 0 };
}

/// Copies a parked off-CPU record: its head, the `frames_len` frames of a
/// frame-pointer walk, and the `stack_len` bytes of its stack copy; not
/// the kernel frames, which the caller walks itself. Only what is in use
/// is written: the ring's memory is cold in this CPU's cache. 0 on
/// success.
#[inline(always)]
unsafe fn copy_parked(out: *mut OffcpuRecord, parked: *const OffcpuRecord) -> i64 {
    use aya_ebpf::helpers::generated::bpf_probe_read_kernel as read_kernel;
    const HEAD: usize = core::mem::offset_of!(OffcpuRecord, kernel);
    // SAFETY: both point to whole records; HEAD is inside them.
    let head = unsafe { read_kernel(out.cast(), HEAD as u32, parked.cast()) };
    if head != 0 {
        return head;
    }
    // SAFETY: as above.
    let frames = bounded(unsafe { (*parked).frames_len }, MAX_STACK_DEPTH as u64);
    if frames > 0 {
        // SAFETY: frames <= the frame arrays' length.
        let copied = unsafe {
            read_kernel(
                (*out).frames.as_mut_ptr().cast(),
                (frames * 8) as u32,
                (*parked).frames.as_ptr().cast(),
            )
        };
        if copied != 0 {
            return copied;
        }
    }
    // SAFETY: as above.
    let len = bounded(unsafe { (*parked).stack_len }, OFFCPU_STACK_BYTES as u64);
    if len == 0 {
        return 0;
    }
    // SAFETY: len <= the stack arrays' length.
    unsafe {
        read_kernel(
            (*out).stack.as_mut_ptr().cast(),
            len as u32,
            (*parked).stack.as_ptr().cast(),
        )
    }
}

/// `value`, at most `max`, in a register whose bounds the verifier knows
/// where it is used as a length. The compiler tests a range such as
/// `0 < n <= max` on `n - 1` and passes `n` on; older verifiers (those of
/// Linux 6.1 and 6.12) do not carry that bound from one register to the
/// other and refuse the length ("min value is negative"). The volatile
/// read hides the value from the compiler, so the comparison here is made
/// on the register that is used.
#[inline(always)]
fn bounded(value: u64, max: u64) -> u64 {
    // SAFETY: a read of a local.
    let value = unsafe { core::ptr::read_volatile(&value) };
    if value > max { max } else { value }
}

/// `pthread_cond_wait`, `pthread_cond_timedwait` and
/// `pthread_cond_clockwait` (every symbol version), entry only.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn cond_wait_probe(ctx: *mut core::ffi::c_void) -> u32 {
    cond_wait_run(ProbeContext::new(ctx));
    0
}

/// At `pthread_cond_*wait`'s entry: the thread notes the condition and
/// mutex it is about to wait with (the first two arguments).
#[inline(always)]
fn cond_wait_run(ctx: ProbeContext) {
    if global_u8(&BLOCK_ON) == 0 {
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == global(&SELF_TGID) || !is_target(tgid) {
        return;
    }
    let regs = ctx.regs;
    // SAFETY: checked context loads of the user's pt_regs.
    let wait = unsafe {
        CondWait {
            cond: (*regs).rdi,
            mutex: (*regs).rsi,
        }
    };
    if let Some(slot) = COND_WAITS.current(true) {
        // SAFETY: the current thread's value; only its own programs touch it.
        unsafe { *slot = wait };
    }
}

/// The condition variable a wait on futex word `uaddr` belongs to: the one
/// the thread last entered a wait on, when the word lies within it (the
/// wait to take its mutex again, or any later wait elsewhere, does not).
#[inline(always)]
fn cond_of(uaddr: u64) -> u64 {
    let Some(slot) = COND_WAITS.current(false) else {
        return 0;
    };
    // SAFETY: the current thread's value.
    let cond = unsafe { (*slot).cond };
    if cond != 0 && uaddr >= cond && uaddr - cond < COND_BYTES {
        cond
    } else {
        0
    }
}

/// Go's park points for the block profile, attached to runtime.gopark and
/// runtime.ready of Go executables (the cookie says which). A goroutine
/// that parks (channel, select, sync) is remembered by its `g` (R14 in
/// Go's register ABI) with its stack registers; when another goroutine
/// readies it (`gp` in RAX), the wait is kept by Go's block rule and its
/// stack walked by frame pointers (Go keeps them) through the parked
/// goroutine's memory, which lies in the same address space. Entry probes
/// only: a return probe would move a return address that Go's stack
/// copying must find.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn go_park_probe(ctx: *mut core::ffi::c_void) -> u32 {
    klog::run(ProbeContext::new(ctx), go_park_probe_run)
}

#[inline(always)]
fn go_park_probe_run(ctx: ProbeContext) -> u32 {
    go_park_run(ctx);
    0
}

#[inline(always)]
fn go_park_run(ctx: ProbeContext) {
    if global_u8(&BLOCK_ON) == 0 {
        return;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == global(&SELF_TGID) || !is_target(tgid) {
        return;
    }
    let regs = ctx.regs;
    // SAFETY: plain helpers; checked context loads of the user's pt_regs.
    let (function, now, r14, rax, sp, bp) = unsafe {
        (
            bpf_get_attach_cookie(ctx.regs.cast()),
            bpf_ktime_get_ns(),
            (*regs).r14,
            (*regs).rax,
            (*regs).rsp,
            (*regs).rbp,
        )
    };
    if function == go_fn::GOPARK {
        let park = GoPark {
            start_ns: now,
            sp,
            bp,
            tid: pid_tgid as u32,
            _pad: 0,
            comm: bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]),
        };
        let key = FutexKey {
            tgid,
            _pad: 0,
            addr: r14,
        };
        let _ = GO_PARKED.insert(key, park, 0);
        return;
    }
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: rax,
    };
    // SAFETY: copied out before the entry is removed.
    let Some(park) = (unsafe { GO_PARKED.get(key) }).copied() else {
        return;
    };
    let _ = GO_PARKED.remove(key);
    count(counter::FUTEX_WAITS);
    let waited = now.saturating_sub(park.start_ns);
    // SAFETY: plain helper.
    let random = unsafe { bpf_get_prandom_u32() };
    if keep_block_event(waited, global(&BLOCK_RATE_NS), random) {
        send_go_block(tgid, &park, waited);
    }
}

/// Sends a kept goroutine wait with its frames: the return address at
/// gopark's entry, then the frame-pointer chain.
#[inline(always)]
fn send_go_block(tgid: u32, park: &GoPark, waited: u64) {
    let Some(mut entry) = WAIT_EVENTS.reserve::<WaitStack>(0) else {
        count(counter::WAIT_EVENTS_LOST);
        klog!(why::GO_WAIT_LOST, tgid, park.tid, waited);
        return;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: the entry is ours until submitted; user memory is read
    // through the checked helper.
    unsafe {
        (*out).head = WaitHead {
            kind: wait_event::BLOCK,
            tgid,
            tid: park.tid,
            flags: wait_flags::RETURN_ADDRESS,
            value: waited,
            uaddr: 0,
            ip: 0,
            sp: park.sp,
            bp: park.bp,
            hint_id: 0,
            time_ns: park.start_ns + waited,
            cond: 0,
            comm: park.comm,
        };
        (*out).stack_len = 0;
        let mut len = 0u64;
        if let Ok(ret) = read_user(park.sp as *const u64) {
            (*out).frames[0] = ret;
            len = 1;
            let mut bp = park.bp;
            for i in 1..MAX_STACK_DEPTH {
                if bp == 0 {
                    break;
                }
                let Ok(ret) = read_user((bp + 8) as *const u64) else {
                    break;
                };
                let Ok(next) = read_user(bp as *const u64) else {
                    break;
                };
                if ret == 0 {
                    break;
                }
                (*out).frames[i] = ret;
                len = i as u64 + 1;
                // Frames lie at increasing addresses towards the root.
                if next <= bp {
                    break;
                }
                bp = next;
            }
        }
        (*out).frames_len = len;
    }
    entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
}

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    klog::run(ctx, sched_process_fork_run)
}

#[inline(always)]
fn sched_process_fork_run(ctx: TracePointContext) -> u32 {
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: the offset comes from this kernel's format file.
    let offset = unsafe { core::ptr::read_volatile(&FORK_CHILD_PID_OFFSET) } as usize;
    // SAFETY: reading a field of the tracepoint record.
    let child: i32 = match unsafe { ctx.read_at(offset) } {
        Ok(c) => c,
        Err(_) => return 0,
    };
    // The pid of a process that exited is someone else's from now on.
    let _ = SEEN.remove(child as u32);
    // SAFETY: presence check only.
    let parent_seen = unsafe { SEEN.get(parent_tgid).is_some() };
    let follow = global_u8(&FOLLOW_FORKS) != 0
        // SAFETY: presence check only.
        && unsafe { TARGETS.get(parent_tgid).is_some() };
    if !parent_seen && !follow {
        return 0;
    }
    if parent_seen && child as u32 != parent_tgid && FORKED.insert(child as u32, 1u8, 0).is_ok() {
        // Sent before the child can run, so before its NEW event: a child
        // that is gone before the daemon reads its mappings is symbolized
        // with its parent's, which it shares until it execs.
        send_proc_event_from(proc_event::FORK, child as u32, parent_tgid);
    }
    if !follow {
        return 0;
    }
    // A new thread's id lands here too; sched_process_exit removes it.
    if TARGETS.insert(child as u32, 1u8, 0).is_ok() {
        count(counter::FORKS_FOLLOWED);
        if global_u8(&REPORT_PROCESS_EVENTS) != 0 {
            // The daemon attaches heap probes for the child (it ignores
            // the event for a new thread).
            send_proc_event(proc_event::NEW, child as u32);
        }
    } else {
        count(counter::TARGETS_FULL);
        klog!(why::TARGETS_FULL, parent_tgid, klog::tid(), child);
    }
    0
}

/// Notes when an exec passed its point of no return (Linux 6.10+; older
/// kernels lack the tracepoint, and the EXEC event then carries its own
/// time).
#[tracepoint]
pub fn sched_prepare_exec(_ctx: TracePointContext) -> u32 {
    if let Some(start) = EXEC_STARTS.current(true) {
        // SAFETY: the current thread's value.
        unsafe { *start = bpf_ktime_get_ns() };
    }
    0
}

/// Notes when an exec in progress gave the thread its new name. Renames
/// outside an exec (prctl, /proc/PID/comm) find no exec to note.
#[tracepoint]
pub fn task_rename(_ctx: TracePointContext) -> u32 {
    if let Some(start) = EXEC_STARTS.current(false) {
        // SAFETY: the current thread's value.
        let renamed = unsafe {
            if *start == 0 {
                return 0;
            }
            *start = bpf_ktime_get_ns();
            *start
        };
        note_image((bpf_get_current_pid_tgid() >> 32) as u32, renamed);
    }
    0
}

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    klog::run(_ctx, sched_process_exec_run)
}

#[inline(always)]
fn sched_process_exec_run(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let forked = FORKED.remove(tgid).is_ok();
    // SAFETY: plain helper.
    let mut started = unsafe { bpf_ktime_get_ns() };
    if let Some(start) = EXEC_STARTS.current(false) {
        // SAFETY: the current thread's value; taken, so that a later exec
        // on a kernel without the prepare tracepoint cannot reuse it.
        unsafe {
            if *start != 0 && *start <= started {
                started = *start;
            }
            *start = 0;
        }
    }
    note_image(tgid, started);
    // SAFETY: presence check only.
    if (global_u8(&REPORT_PROCESS_EVENTS) != 0 && is_target(tgid))
        || unsafe { SEEN.get(tgid).is_some() }
    {
        send_proc_event_at(proc_event::EXEC, tgid, 0, started);
    } else if forked {
        send_proc_event(proc_event::FORGET_FORK, tgid);
    }
    0
}

#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    klog::run(_ctx, sched_process_exit_run)
}

#[inline(always)]
fn sched_process_exit_run(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let _ = HEAP_THREADS.remove(tid);
    // SAFETY: plain helper; the address is only a key.
    let _ = OFFCPU_PARKED.remove(unsafe { bpf_get_current_task() });
    let _ = STACK_TOPS.remove(tid);
    let _ = FORKED.remove(tid);
    if tid != tgid {
        // A thread of a followed process; its id may be reused by an
        // unrelated process later.
        if global_u8(&FOLLOW_FORKS) != 0 {
            let _ = TARGETS.remove(tid);
        }
        return 0;
    }
    // The process is gone: a new process that gets its pid is someone else,
    // not a target (the daemon's own clean-up comes up to a second later).
    let was_target = TARGETS.remove(tgid).is_ok();
    // SAFETY: the value is copied out.
    let seen = unsafe { SEEN.get(tgid) }.copied();
    // A target the daemon heard of (it holds probes for it) is reported even
    // if it was never sampled, or its probes would outlive it.
    let reported_target = was_target && global_u8(&REPORT_PROCESS_EVENTS) != 0;
    if seen.is_some_and(|v| v != EXITED) || (seen.is_none() && reported_target) {
        // Marked, so that the samples of its exit path are not taken for a
        // new process.
        let _ = SEEN.insert(tgid, EXITED, 0);
        send_proc_event(proc_event::EXIT, tgid);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach a panic.
    unsafe { core::hint::unreachable_unchecked() }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
