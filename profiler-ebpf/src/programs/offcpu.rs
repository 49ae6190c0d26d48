//! `sched_switch`, for off-CPU profiles: the user stack of a targeted
//! thread that blocks (and a CPython thread's Python frames) is parked
//! until it runs again, when the interval is kept by Go's block rule and
//! sent with its kernel stack.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, task_struct},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid,
        generated::{
            bpf_get_current_task, bpf_get_prandom_u32, bpf_get_task_stack, bpf_ktime_get_ns,
        },
    },
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use profiler_common::{
    COMM_LEN, DeepStack, LONG_STACK_BYTES, MAX_STACK_DEPTH, OFFCPU_DEEP_ENTRIES,
    OFFCPU_KERNEL_DEPTH, OFFCPU_PARKED_ENTRIES, OFFCPU_PY_FRAMES, OFFCPU_STACK_BYTES, OffcpuRecord,
    PyFrame, WALK_HINT_WORDS, WalkHintKey, counter, sampling::keep_block_event, wait_event,
    wait_flags,
};

use crate::{
    counters::count,
    globals::{
        BLOCK_RATE_NS, BRIEF_RECORDS, OFFCPU_ON, SELF_TGID, WAIT_EVENTS_RING, global, global_u8,
    },
    go_labels::go_label_set,
    klog::{self, klog, why},
    maps::wake_flag,
    process::{forked_parent, is_target},
    python::{python_frames, python_process},
    stack::{
        copy::{counted_copy_stack, needs_long_copy},
        fp_process,
        hints::{
            HINT_SCRATCH, HintMatch, WALK_HINTS, copy_frames, hint_key, hinted_walk,
            matching_walk_hint,
        },
        record_user_stack, task_user_regs, use_dwarf,
    },
    waits::WAIT_EVENTS,
};

/// Stacks of blocked threads, by task (the task_struct's address: the
/// switch-in knows the task, not its id), until they run again.
#[map]
pub(crate) static OFFCPU_PARKED: HashMap<u64, OffcpuRecord> =
    HashMap::with_max_entries(OFFCPU_PARKED_ENTRIES, BPF_F_NO_PREALLOC);

/// A zeroed record to create a thread's parked slot from (far larger than
/// the BPF stack).
#[map]
static OFFCPU_SCRATCH: PerCpuArray<OffcpuRecord> = PerCpuArray::with_max_entries(1, 0);

/// The switch-out stack copies of threads marked deep (`DEEP_THREADS`),
/// by task, beside their parked records (`wait_flags::LONG_STACK`): a
/// long copy in every thread's slot would quadruple the parked memory.
#[map]
pub(crate) static OFFCPU_DEEP_STACKS: HashMap<u64, DeepStack> =
    HashMap::with_max_entries(OFFCPU_DEEP_ENTRIES, BPF_F_NO_PREALLOC);

/// A blank to create a deep slot from; never written (one for all CPUs).
#[map]
static OFFCPU_DEEP_BLANK: Array<DeepStack> = Array::with_max_entries(1, 0);

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
    klog::run(ctx, try_sched_switch)
}

#[inline(always)]
fn try_sched_switch(ctx: BtfTracePointContext) -> Result<u32, u32> {
    if global_u8(&OFFCPU_ON) == 0 {
        return Ok(0);
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
    Ok(0)
}

/// `__state` of a task's final switch (include/linux/sched.h).
const TASK_DEAD: u32 = 0x80;

#[inline(always)]
pub(crate) fn park(ctx: &BtfTracePointContext, task: u64, now: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if tid == 0 || tgid == global(&SELF_TGID) || !is_target(tgid) {
        return;
    }
    count(counter::OFFCPU_SWITCHES);
    // The thread's slot stays in the map from one switch to the next (it
    // goes at the thread's exit), and is written in place: a new ~10 KiB
    // map element per switch would cost an allocation and a copy each.
    let Some(record) = thread_slot(
        &OFFCPU_PARKED,
        task,
        OFFCPU_SCRATCH.get_ptr(0),
        (counter::OFFCPU_PARKED_FULL, why::OFFCPU_PARKED_FULL),
        (tgid, tid),
    ) else {
        return;
    };
    let regs = task_user_regs();
    let (ip, sp, bp) = regs.map_or((0, 0, 0), |r| (r.ip, r.sp, r.bp));
    // A Go thread's goroutine at the switch-out (R14 holds its g in Go
    // code and in the system calls Go makes); none for an idle thread.
    let go_labels = match (regs, fp_process(tgid)) {
        (Some(regs), Some(process)) => {
            // SAFETY: a map value, valid during this run.
            go_label_set::<true>(unsafe { &(*process).go }, tgid, regs.r14, regs.sp)
        }
        _ => 0,
    };
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
        (*record).go_labels = go_labels;
        // A CPython thread's frames, read where it blocked.
        match python_process(tgid) {
            Some(py) => python_frames(&*py, tid, &mut (*record).python),
            None => (*record).python.len = 0,
        }
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
                None => match deep_slot(task, tgid, tid, sp) {
                    // A deep thread: the long copy, beside the record.
                    Some(deep) => {
                        (*record).stack_len =
                            counted_copy_stack::<LONG_STACK_BYTES>((*deep).stack.as_mut_ptr(), sp);
                        (*record).flags = wait_flags::LONG_STACK;
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
            },
        }
    }
}

/// The deep-stack slot of thread `tid` (task `task`), blocking at `sp`,
/// when its stack is copied for the daemon and the thread is marked deep;
/// None for any other thread, or when no slot is free (counted: it parks
/// the usual copy).
#[inline(always)]
fn deep_slot(task: u64, tgid: u32, tid: u32, sp: u64) -> Option<*mut DeepStack> {
    if !use_dwarf(tgid) || !needs_long_copy(tid, sp, OFFCPU_STACK_BYTES) {
        return None;
    }
    thread_slot(
        &OFFCPU_DEEP_STACKS,
        task,
        OFFCPU_DEEP_BLANK.get_ptr(0),
        (counter::OFFCPU_DEEP_FULL, why::OFFCPU_DEEP_FULL),
        (tgid, tid),
    )
}

/// Thread `task`'s slot in `map`, made from `blank` (a map value, only
/// read) when it has none yet; None when the map is full (counted in
/// `full.0`, logged as `full.1`).
#[inline(always)]
fn thread_slot<V>(
    map: &HashMap<u64, V>,
    task: u64,
    blank: Option<*const V>,
    full: (u32, u32),
    (tgid, tid): (u32, u32),
) -> Option<*mut V> {
    if let Some(slot) = map.get_ptr_mut(task) {
        return Some(slot);
    }
    // SAFETY: a map value, read-only here.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if map.insert(task, unsafe { &*blank? }, 0).is_err() {
        count(full.0);
        klog!(full.1, tgid, tid);
        return None;
    }
    map.get_ptr_mut(task)
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
        // SAFETY: a field of a map value.
        let sent = if unsafe { (*parked).flags } & wait_flags::LONG_STACK != 0 {
            match OFFCPU_DEEP_STACKS.get_ptr(next as u64) {
                // SAFETY: the thread's own slot (its exit removes it).
                Some(deep) => send_unparked::<LONG_STACK_BYTES>(next, parked, off, unsafe {
                    (*deep).stack.as_ptr()
                }),
                // Not reached: a deep slot goes only at its thread's exit.
                None => {
                    // SAFETY: as above.
                    unsafe {
                        (*parked).stack_len = 0;
                        (*parked).flags &= !wait_flags::LONG_STACK;
                    }
                    send_unparked::<OFFCPU_STACK_BYTES>(next, parked, off, core::ptr::null())
                }
            }
        } else {
            // SAFETY: as above.
            send_unparked::<OFFCPU_STACK_BYTES>(next, parked, off, unsafe {
                (*parked).stack.as_ptr()
            })
        };
        if !sent {
            count(counter::WAIT_EVENTS_LOST);
            // SAFETY: fields of a map value.
            let (tgid, tid) = unsafe { ((*parked).tgid, (*parked).tid) };
            klog!(why::OFFCPU_LOST, tgid, tid, off);
        }
    }
    // SAFETY: as above; the slot is kept for the thread's next switch.
    unsafe { (*parked).start_ns = 0 };
}

/// Sends a kept off-CPU interval of `off` ns in the record form with an
/// N-byte stack copy, taken from `stack` (the parked record's or the
/// thread's deep slot, `stack_len` bytes of it in use; null: none). False
/// when the ring is full.
#[inline(always)]
fn send_unparked<const N: usize>(
    next: *mut task_struct,
    parked: *const OffcpuRecord,
    off: u64,
    stack: *const u8,
) -> bool {
    let Some(mut entry) = WAIT_EVENTS.reserve::<OffcpuRecord<N>>(0) else {
        return false;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: copies the parked record (a map value) into the reserved
    // entry: everything before the stack copy, then only the bytes of it
    // in use (a whole record is 9 KiB; most copies are far shorter).
    if unsafe { copy_parked::<N>(out, parked, stack) } != 0 {
        entry.discard(0);
        return true;
    }
    // SAFETY: the entry is ours until submitted; `next` is the task the
    // tracepoint hands over, blocked since it was parked.
    unsafe {
        (*out).duration_ns = off;
        // Asked now: the task is alive, being switched in.
        (*out).parent = forked_parent((*out).tgid);
        (*out)._pad = 0;
        // Long copies are not matched: no hint spans them.
        if N == OFFCPU_STACK_BYTES
            && (*out).flags & wait_flags::HINT_MATCHED == 0
            && (*out).stack_len != 0
            && global_u8(&BRIEF_RECORDS) != 0
            && let key = hint_key((*out).tgid, (*out).ip, (*out).sp, (*out).bp)
            && let Some(hint) = WALK_HINTS.get(key)
            && let Some(found) = matching_walk_hint::<N>(
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
    true
}

/// Copies a parked off-CPU record into the N-byte form `out`: its head,
/// the `frames_len` frames of a frame-pointer walk, its Python frames,
/// and the `stack_len` bytes of its stack copy from `stack` (its own, or
/// its thread's deep slot); not the kernel frames, which the caller walks
/// itself. Only what is in use is written: the ring's memory is cold in
/// this CPU's cache. 0 on success.
#[inline(always)]
unsafe fn copy_parked<const N: usize>(
    out: *mut OffcpuRecord<N>,
    parked: *const OffcpuRecord,
    stack: *const u8,
) -> i64 {
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
    // A CPython thread's Python frames (the ring's memory is not zeroed:
    // the count is written for every record).
    // SAFETY: as above.
    let python = bounded(
        u64::from(unsafe { (*parked).python.len }),
        OFFCPU_PY_FRAMES as u64,
    );
    // SAFETY: `out` is the caller's entry.
    unsafe {
        (*out).python.len = python as u32;
        (*out).python.truncated = (*parked).python.truncated;
    }
    if python > 0 {
        // SAFETY: python <= the frame arrays' length.
        let copied = unsafe {
            read_kernel(
                (*out).python.frames.as_mut_ptr().cast(),
                (python * core::mem::size_of::<PyFrame>() as u64) as u32,
                (*parked).python.frames.as_ptr().cast(),
            )
        };
        if copied != 0 {
            return copied;
        }
    }
    // SAFETY: as above.
    let len = bounded(unsafe { (*parked).stack_len }, N as u64);
    if len == 0 || stack.is_null() {
        return 0;
    }
    // SAFETY: len <= N, the length of `out`'s stack and of `stack` (the
    // caller's word).
    unsafe { read_kernel((*out).stack.as_mut_ptr().cast(), len as u32, stack.cast()) }
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
