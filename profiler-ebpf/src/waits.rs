//! The wait record ring (`WAIT_EVENTS`, shared by the block, mutex and
//! off-CPU programs) and the sender of a kept futex wait or wake-up with
//! its stack: a brief record when a walk hint matches, else one with a
//! stack copy; either followed by a CPython thread's Python frames.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_comm, generated::bpf_ktime_get_ns},
    macros::map,
    maps::RingBuf,
    programs::TracePointContext,
};
use profiler_common::{
    BRIEF_FRAME_CLASSES, COMM_LEN, LONG_STACK_BYTES, PyFrames, STACK_COPY_BYTES, WAIT_EVENTS_BYTES,
    WAIT_PY_FRAMES, WaitBrief, WaitHead, WaitStack, WithPython, counter, wait_event, wait_flags,
};

use crate::{
    counters::count,
    globals::{BRIEF_RECORDS, WAIT_EVENTS_RING, global_u8},
    klog::{klog, why},
    maps::wake_flag,
    process::forked_parent,
    programs::cond_wait::cond_of,
    python_records::{copy_python_frames, wait_python_frames},
    stack::{
        copy::needs_long_copy,
        hints::{HINT_SCRATCH, HintScratch, copy_frames, hint_key, hinted_walk},
        record_user_stack, task_user_regs, use_dwarf,
    },
};

#[map]
pub(crate) static WAIT_EVENTS: RingBuf = RingBuf::with_byte_size(WAIT_EVENTS_BYTES, 0);

/// Sends a kept wait or wake-up with the thread's user stack: a brief
/// record when the daemon's walk hint for these registers matches the
/// stack in user memory, else the record with a stack copy.
///
/// Most of a kept wait's cost was writing its copy into the ring: the
/// ring's memory was last touched by the daemon on another CPU, so every
/// cache line written misses. A matched hint is checked in a per-CPU
/// scratch buffer that stays in this CPU's cache, and the ring gets only
/// the head.
///
/// A CPython thread's record of either form ends with its Python frames
/// (`wait_flags::PYTHON`): a brief record shows the same Python frames as
/// a full one would.
#[inline(always)]
pub(crate) fn send_wait_stack(
    ctx: &TracePointContext,
    kind: u32,
    tgid: u32,
    tid: u32,
    value: u64,
    uaddr: u64,
) {
    let (ip, sp, bp) = task_user_regs().map_or((0, 0, 0), |r| (r.ip, r.sp, r.bp));
    let mut head = WaitHead {
        kind,
        tgid,
        tid,
        flags: 0,
        parent: forked_parent(tgid),
        _pad: 0,
        value,
        uaddr,
        ip,
        sp,
        bp,
        hint_id: 0,
        // SAFETY: plain helper.
        time_ns: unsafe { bpf_ktime_get_ns() },
        cond: 0,
        go_labels: 0,
        comm: bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]),
    };
    if kind == wait_event::BLOCK {
        head.cond = cond_of(uaddr);
    }
    let python = wait_python_frames(tgid, tid);
    if python.is_some() {
        head.flags = wait_flags::PYTHON;
    }
    if global_u8(&BRIEF_RECORDS) != 0
        && let Some(scratch) = HINT_SCRATCH.get_ptr_mut(0)
        // SAFETY: this CPU's scratch buffer (programs do not nest on a
        // CPU).
        && let Some(found) = unsafe { hinted_walk(hint_key(tgid, ip, sp, bp), tid, scratch) }
    {
        head.flags |= wait_flags::HINT_MATCHED | wait_flags::BRIEF | found.flags;
        head.hint_id = found.id;
        // The smallest room that holds the frames (BRIEF_FRAME_CLASSES).
        // SAFETY: the scratch frames were written by hinted_walk above,
        // found.frames of them.
        let sent = unsafe {
            if found.frames as usize <= BRIEF_FRAME_CLASSES[0] {
                send_brief::<{ BRIEF_FRAME_CLASSES[0] }>(&head, scratch, found.frames, python)
            } else if found.frames as usize <= BRIEF_FRAME_CLASSES[1] {
                send_brief::<{ BRIEF_FRAME_CLASSES[1] }>(&head, scratch, found.frames, python)
            } else {
                send_brief::<{ BRIEF_FRAME_CLASSES[2] }>(&head, scratch, found.frames, python)
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
    // A thread marked deep whose stack is copied: the long form.
    let sent = if sp != 0 && use_dwarf(tgid) && needs_long_copy(tid, sp, STACK_COPY_BYTES) {
        send_wait_copy::<LONG_STACK_BYTES>(ctx, &head, python)
    } else {
        send_wait_copy::<STACK_COPY_BYTES>(ctx, &head, python)
    };
    if sent.is_none() {
        count(counter::WAIT_EVENTS_LOST);
        klog!(why::WAIT_LOST, tgid, tid, kind);
    }
}

/// Sends a full wait record with an N-byte stack copy (or a
/// frame-pointer walk), and `python`'s frames after it when there are.
/// None when the ring is full.
#[inline(always)]
fn send_wait_copy<const N: usize>(
    ctx: &TracePointContext,
    head: &WaitHead,
    python: Option<*const PyFrames<WAIT_PY_FRAMES>>,
) -> Option<()> {
    match python {
        None => WAIT_EVENTS.reserve::<WaitStack<N>>(0).map(|mut entry| {
            // SAFETY: the entry is ours until submitted.
            unsafe { write_wait_stack::<N>(ctx, entry.as_mut_ptr(), head) };
            entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
        }),
        Some(python) => WAIT_EVENTS
            .reserve::<WithPython<WaitStack<N>, WAIT_PY_FRAMES>>(0)
            .map(|mut entry| {
                let out = entry.as_mut_ptr();
                // SAFETY: the entry is ours until submitted; `python` is
                // this CPU's scratch, walked by the caller.
                unsafe {
                    write_wait_stack::<N>(ctx, &raw mut (*out).record, head);
                    copy_python_frames(&raw mut (*out).python, python);
                }
                entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
            }),
    }
}

/// Writes a wait record with an N-byte copy of the user stack into `out`,
/// in place.
///
/// # Safety
/// `out` is a reserved ring entry of the caller's.
#[inline(always)]
unsafe fn write_wait_stack<const N: usize>(
    ctx: &TracePointContext,
    out: *mut WaitStack<N>,
    head: &WaitHead,
) {
    // SAFETY: the caller's entry.
    unsafe {
        (*out).head = *head;
        ((*out).stack_len, (*out).frames_len) = record_user_stack::<N>(
            ctx.as_ptr(),
            head.tgid,
            head.sp,
            (*out).stack.as_mut_ptr(),
            (*out).frames.as_mut_ptr(),
        );
    }
}

/// Sends a brief wait record with room for N frames, the first `n` of
/// the scratch buffer's (n <= N), and `python`'s frames after it when
/// there are. False when the ring is full.
///
/// # Safety
/// `scratch` is this CPU's scratch buffer, its first `n` frames written;
/// `python`, this CPU's Python scratch, walked.
#[inline(always)]
unsafe fn send_brief<const N: usize>(
    head: &WaitHead,
    scratch: *const HintScratch,
    n: u32,
    python: Option<*const PyFrames<WAIT_PY_FRAMES>>,
) -> bool {
    let Some(python) = python else {
        let Some(mut entry) = WAIT_EVENTS.reserve::<WaitBrief<N>>(0) else {
            return false;
        };
        // SAFETY: the caller's word; the entry is ours until submitted.
        unsafe { write_brief(entry.as_mut_ptr(), head, scratch, n) };
        entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
        return true;
    };
    let Some(mut entry) = WAIT_EVENTS.reserve::<WithPython<WaitBrief<N>, WAIT_PY_FRAMES>>(0) else {
        return false;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: as above.
    unsafe {
        write_brief(&raw mut (*out).record, head, scratch, n);
        copy_python_frames(&raw mut (*out).python, python);
    }
    entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
    true
}

/// Writes a brief wait record into `out`.
///
/// # Safety
/// As [`send_brief`]; `out` is a reserved ring entry of the caller's.
#[inline(always)]
unsafe fn write_brief<const N: usize>(
    out: *mut WaitBrief<N>,
    head: &WaitHead,
    scratch: *const HintScratch,
    n: u32,
) {
    // SAFETY: the entry is the caller's; the scratch buffer holds
    // WALK_HINT_WORDS >= N frames.
    unsafe {
        (*out).head = *head;
        (*out).frames_len = u64::from(n);
        copy_frames::<N>((*out).frames.as_mut_ptr(), (*scratch).frames.as_ptr(), n);
    }
}
