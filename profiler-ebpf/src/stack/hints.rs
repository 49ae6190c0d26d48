//! Walk hints: the daemon's remembered walks (`WALK_HINTS`), checked word
//! by word against the thread's stack in a per-CPU scratch buffer. A match
//! yields the walk's frames, so the record needs no stack copy (see
//! docs/design/001-walk-hints-and-brief-records.md).

use aya_ebpf::{
    helpers::generated::bpf_probe_read_user,
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use profiler_common::{
    HINT_SEAL_SEED, STACK_COPY_BYTES, WALK_HINT_WORDS, WALK_HINTS_ENTRIES, WalkHint, WalkHintKey,
    counter, hint_mix, wait_flags,
};

use crate::{
    counters::count,
    klog::{klog, why},
    stack::use_dwarf,
};

/// A per-CPU buffer for the stack words a walk hint is checked against,
/// and the frames of a matched hint.
#[repr(C)]
pub(crate) struct HintScratch {
    pub(crate) bytes: [u8; STACK_COPY_BYTES],
    pub(crate) frames: [u64; WALK_HINT_WORDS],
}

#[map]
pub(crate) static HINT_SCRATCH: PerCpuArray<HintScratch> = PerCpuArray::with_max_entries(1, 0);

/// The stack words of the daemon's remembered walks, by where they start
/// (written by the daemon).
#[map]
pub(crate) static WALK_HINTS: LruHashMap<WalkHintKey, WalkHint> =
    LruHashMap::with_max_entries(WALK_HINTS_ENTRIES, 0);

/// Where a walk starts, as walk hints are keyed.
#[inline(always)]
pub(crate) fn hint_key(tgid: u32, ip: u64, sp: u64, bp: u64) -> WalkHintKey {
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
pub(crate) struct HintMatch {
    /// The daemon's id of the walk.
    pub(crate) id: u64,
    /// Frames written after the instruction pointer.
    pub(crate) frames: u32,
    /// `wait_flags::WALK_TRUNCATED` or 0.
    pub(crate) flags: u32,
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
pub(crate) unsafe fn hinted_walk(
    key: WalkHintKey,
    tid: u32,
    scratch: *mut HintScratch,
) -> Option<HintMatch> {
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
pub(crate) unsafe fn matching_walk_hint<const N: usize>(
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
pub(crate) unsafe fn copy_frames<const N: usize>(dst: *mut u64, src: *const u64, n: u32) {
    for i in 0..N {
        if i as u32 >= n {
            break;
        }
        // SAFETY: the caller's buffers hold N frames.
        unsafe { *dst.add(i) = *src.add(i) };
    }
}
