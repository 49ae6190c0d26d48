//! What the daemon must hear about a process from the programs that
//! sample it: its first sample (a NEW event, so that it snapshots the
//! mappings), image starts, and anchors (the first user frames of a young
//! image as addresses and as build ID and file offset), through the
//! process event ring.

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST, BPF_RB_AVAIL_DATA},
    helpers::generated::{bpf_get_stack, bpf_ktime_get_ns},
    macros::map,
    maps::{LruHashMap, RingBuf},
};
use profiler_common::{
    ANCHOR_FRAMES, ANCHOR_WINDOW_NS, BuildIdFrame, ImageAnchors, PROC_EVENTS_BYTES, ProcEvent,
    counter, proc_event,
};

use crate::{
    counters::count,
    globals::{FILTER_TARGETS, global_u8},
    klog::{self, klog, why},
    maps::{FORKED, SEEN, TARGETS},
};

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

#[map]
static PROC_EVENTS: RingBuf = RingBuf::with_byte_size(PROC_EVENTS_BYTES, 0);

#[inline(always)]
pub(crate) fn is_target(tgid: u32) -> bool {
    // SAFETY: the value is not used, only its presence.
    global_u8(&FILTER_TARGETS) == 0 || unsafe { TARGETS.get(tgid).is_some() }
}

#[inline(always)]
pub(crate) fn send_proc_event(kind: u32, tgid: u32) {
    send_proc_event_from(kind, tgid, 0);
}

#[inline(always)]
pub(crate) fn send_proc_event_from(kind: u32, tgid: u32, parent: u32) {
    // SAFETY: plain helper.
    send_proc_event_at(kind, tgid, parent, unsafe { bpf_ktime_get_ns() });
}

#[inline(always)]
pub(crate) fn send_proc_event_at(kind: u32, tgid: u32, parent: u32, time_ns: u64) {
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

/// The process that forked `tgid`, if `tgid` is a child of a known
/// process that has not exec'd (in `FORKED`), else 0; asked while the
/// process lives, so of the task that has the id now. The daemon lets the
/// parent's snapshot stand in for a child gone before it is read only
/// when a record names the parent: a fork record it holds may be of an
/// earlier task that had the id.
#[inline(always)]
pub(crate) fn forked_parent(tgid: u32) -> u32 {
    // SAFETY: the value is copied out.
    unsafe { FORKED.get(tgid) }.copied().unwrap_or(0)
}

/// The value of a `SEEN` process whose main thread exited.
pub(crate) const EXITED: u64 = u64::MAX;

/// Tells the daemon about a process the first time it is sampled; returns
/// when its current image started (the NEW event's time, or its exec's; 0
/// for a process on its way out, whose image the daemon knows).
#[inline(always)]
pub(crate) fn note_process(tgid: u32) -> u64 {
    // SAFETY: the value is copied out.
    if let Some(&since) = unsafe { SEEN.get(tgid) } {
        return if since == EXITED { 0 } else { since };
    }
    // SAFETY: plain helper.
    let now = unsafe { bpf_ktime_get_ns() };
    // BPF_NOEXIST: when two CPUs race here, only one sends the event.
    if SEEN.insert(tgid, now, BPF_NOEXIST as u64).is_ok() {
        send_proc_event_at(proc_event::NEW, tgid, forked_parent(tgid), now);
        return now;
    }
    // SAFETY: the value is copied out.
    unsafe { SEEN.get(tgid) }.copied().unwrap_or(0)
}

/// During the first [`ANCHOR_WINDOW_NS`] of an image that started at
/// `since` (0: none known), sends anchors of the current user stack, at
/// most [`ANCHORS_PER_IMAGE`] times.
#[inline(always)]
pub(crate) fn anchor_young_image(ctx: *mut core::ffi::c_void, tgid: u32, since: u64) {
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
pub(crate) fn note_image(tgid: u32, since: u64) {
    // SAFETY: presence check only.
    if unsafe { SEEN.get(tgid).is_some() } {
        let _ = SEEN.insert(tgid, since, 0);
    }
}
