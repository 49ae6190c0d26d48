//! The wait record ring (`WAIT_EVENTS`, shared by the block, mutex and
//! off-CPU programs) and the sender of a kept futex wait or wake-up with
//! its stack: a brief record when a walk hint matches, else one with a
//! stack copy.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_comm, generated::bpf_ktime_get_ns},
    macros::map,
    maps::RingBuf,
    programs::TracePointContext,
};
use profiler_common::{
    BRIEF_FRAME_CLASSES, COMM_LEN, STACK_COPY_BYTES, WAIT_EVENTS_BYTES, WaitBrief, WaitHead,
    WaitStack, counter, wait_event, wait_flags,
};

use crate::{
    counters::count,
    globals::{BRIEF_RECORDS, WAIT_EVENTS_RING, global_u8},
    klog::{klog, why},
    maps::wake_flag,
    process::forked_parent,
    programs::cond_wait::cond_of,
    stack::{
        hints::{HINT_SCRATCH, HintScratch, copy_frames, hint_key, hinted_walk},
        record_user_stack, task_user_regs,
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
