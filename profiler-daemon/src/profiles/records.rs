//! Reading the kernel's ring records: typed views of their bytes, brief
//! wait records' frames, a CPython thread's Python frames at a record's
//! end, and a record's user stack, unwound from its copy, taken from a
//! matched walk hint, or walked by frame pointers.
//!
//! Each runs once per record, called from the profile types' modules:
//! `#[inline]` lets the compiler inline them there across codegen units,
//! as it did when they shared a module with their callers.

use std::sync::Arc;

use aya::Pod;
use profiler_common::{
    BRIEF_FRAMES_OFFSET, PyFrames, WALK_HINT_WORDS, WaitBrief, WalkHint, WalkHintKey, wait_flags,
};

use crate::bpf::drain::Stack;
use crate::procs::process::ProcessTable;
use crate::stacks::unwind::{Matched, Unwinder, UnwoundStack};

/// A ring-buffer record as `T`, borrowed in place: None when the record is
/// too short or misaligned (ring buffer records are 8-byte aligned; check
/// rather than trust).
#[inline]
pub(crate) fn record<T: Pod>(item: &[u8]) -> Option<&T> {
    if item.len() < std::mem::size_of::<T>()
        || item.as_ptr().align_offset(std::mem::align_of::<T>()) != 0
    {
        return None;
    }
    // SAFETY: size and alignment checked; T is plain data.
    Some(unsafe { &*item.as_ptr().cast::<T>() })
}

/// A small ring-buffer record copied out as `T`, at any alignment; None
/// when the record is too short.
#[inline]
pub(crate) fn read_record<T: Pod>(item: &[u8]) -> Option<T> {
    if item.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: size checked; T is plain data, valid for any bytes.
    Some(unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) })
}

/// A record that may end with a CPython thread's Python frames (the
/// kernel's `WithPython<_, M>`, `python` as the record says): the
/// record's own bytes, and the frames if it has them. None when it says
/// it has them and is too short to.
#[inline]
pub(crate) fn python_tail<const M: usize>(
    item: &[u8],
    python: bool,
) -> Option<(&[u8], Option<&PyFrames<M>>)> {
    if !python {
        return Some((item, None));
    }
    let at = item.len().checked_sub(std::mem::size_of::<PyFrames<M>>())?;
    let (own, tail) = item.split_at(at);
    Some((own, Some(record::<PyFrames<M>>(tail)?)))
}

/// The frames of a brief wait record, which is as long as its room for
/// them (`BRIEF_FRAME_CLASSES`); None when the record is shorter than
/// the frames it says it holds, or holds more than a walk hint has.
#[inline]
pub(crate) fn brief_frames(item: &[u8]) -> Option<&[u64]> {
    let len = read_record::<u64>(item.get(std::mem::offset_of!(WaitBrief, frames_len)..)?)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&n| n <= WALK_HINT_WORDS)?;
    let bytes = item.get(BRIEF_FRAMES_OFFSET..BRIEF_FRAMES_OFFSET + len * 8)?;
    if bytes.as_ptr().align_offset(std::mem::align_of::<u64>()) != 0 {
        return None;
    }
    // SAFETY: length and alignment checked; any bytes are valid u64s.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<u64>(), len) })
}

/// The kernel frames a record holds, if any.
#[inline]
pub(crate) fn kernel_stack(frames: &[u64]) -> Stack {
    match frames {
        [] => Stack::None,
        _ => Stack::Frames(Arc::from(frames)),
    }
}

/// The thread a record came from, and the image its process ran then.
#[derive(Clone, Copy)]
pub(crate) struct Thread {
    pub(crate) tgid: u32,
    pub(crate) generation: u32,
    pub(crate) tid: u32,
}

/// The user stack of an event that carries either a stack copy (unwound
/// here from `regs`) or frame-pointer frames. `at_return`: the registers
/// are at a return address, so the kernel's first frame is one past the
/// call.
#[inline]
pub(crate) fn event_user_stack(
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    thread: Thread,
    regs: (u64, u64, u64),
    stack: &[u8],
    frames: &[u64],
    at_return: bool,
) -> Stack {
    hinted_user_stack(
        procs, unwinder, thread, regs, stack, frames, at_return, None,
    )
    .0
}

/// How a record's stack is given to the daemon: its flags, and the frames
/// it carries (a frame-pointer walk, or with `HINT_MATCHED` a remembered
/// walk's frames after the ip; `frames_len` as sent).
#[inline]
pub(crate) fn matched_walk(
    flags: u32,
    hint_id: u64,
    frames: &[u64],
    frames_len: u64,
) -> Option<Matched<'_>> {
    (flags & wait_flags::HINT_MATCHED != 0).then(|| Matched {
        id: hint_id,
        frames: usize::try_from(frames_len)
            .ok()
            .filter(|&n| n <= WALK_HINT_WORDS)
            .and_then(|n| frames.get(..n)),
        truncated: flags & wait_flags::WALK_TRUNCATED != 0,
    })
}

/// As [`event_user_stack`], for an event whose stack the kernel may have
/// matched against a walk hint (`matched`: the frames the record carries;
/// a brief event has no copy); also returns a hint for the kernel (see
/// [`Unwinder::unwind_hinted`]).
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn hinted_user_stack(
    procs: &mut ProcessTable,
    unwinder: &mut Unwinder,
    Thread {
        tgid,
        generation,
        tid,
    }: Thread,
    (ip, sp, bp): (u64, u64, u64),
    stack: &[u8],
    frames: &[u64],
    at_return: bool,
    matched: Option<Matched<'_>>,
) -> (Stack, Option<(WalkHintKey, WalkHint)>) {
    let as_stack = |unwound: UnwoundStack| match unwound.truncated {
        true => Stack::Truncated(unwound.frames),
        false => Stack::Frames(unwound.frames),
    };
    if let Some(matched) = matched {
        return (as_stack(unwinder.matched(ip, matched)), None);
    }
    if !stack.is_empty() {
        return match procs.get_image(tgid, generation) {
            Some(info) => {
                let (unwound, hint) = unwinder.unwind_hinted(info, tid, ip, sp, bp, stack);
                (as_stack(unwound), hint)
            }
            None => (Stack::Truncated(Arc::from(vec![ip])), None),
        };
    }
    let mut frames = frames.to_vec();
    if at_return && let Some(first) = frames.first_mut() {
        *first = first.saturating_sub(1);
    }
    let stack = match frames.is_empty() {
        true => Stack::Lost,
        false => Stack::FramePointer(Arc::from(frames), [0; 2]),
    };
    (stack, None)
}

#[cfg(test)]
mod tests {
    use profiler_common::WaitBrief;

    use super::*;

    /// A brief record as the kernel sends it: its room for frames, the
    /// frames in use first, in 8-byte-aligned memory as ring records are.
    fn brief_record<const N: usize>(frames: &[u64]) -> Vec<u64> {
        let mut record = WaitBrief::<N> {
            // SAFETY: plain data, any bytes valid.
            head: unsafe { std::mem::zeroed() },
            frames_len: frames.len() as u64,
            frames: [0xdead; N],
        };
        record.frames[..frames.len()].copy_from_slice(frames);
        let words = std::mem::size_of::<WaitBrief<N>>() / 8;
        // SAFETY: repr(C) of u64-aligned fields, read as words.
        unsafe { std::slice::from_raw_parts((&raw const record).cast::<u64>(), words) }.to_vec()
    }

    fn bytes(words: &[u64]) -> &[u8] {
        // SAFETY: the words' own memory.
        unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) }
    }

    #[test]
    fn brief_records_are_read_by_their_length_in_every_room() {
        let frames: Vec<u64> = (1..=32).map(|i| 0x4000 + i).collect();
        for n in [0, 1, 8] {
            let r = brief_record::<8>(&frames[..n]);
            assert_eq!(brief_frames(bytes(&r)), Some(&frames[..n]));
            assert_eq!(bytes(&r).len(), BRIEF_FRAMES_OFFSET + 8 * 8);
        }
        for n in [9, 16] {
            let r = brief_record::<16>(&frames[..n]);
            assert_eq!(brief_frames(bytes(&r)), Some(&frames[..n]));
        }
        for n in [17, 32] {
            let r = brief_record::<32>(&frames[..n]);
            assert_eq!(brief_frames(bytes(&r)), Some(&frames[..n]));
        }
    }

    #[test]
    fn python_frames_are_read_from_a_record_end() {
        use profiler_common::{PyFrame, WithPython};
        let frames: Vec<u64> = (1..=3).collect();
        let plain = brief_record::<8>(&frames);
        let mut python = profiler_common::PyFrames::<4> {
            len: 2,
            truncated: 1,
            frames: [PyFrame::default(); 4],
        };
        python.frames[1] = PyFrame { code: 7, instr: 9 };
        let mut words = plain.clone();
        // SAFETY: repr(C) of u64-aligned fields, read as words.
        words.extend_from_slice(unsafe {
            std::slice::from_raw_parts(
                (&raw const python).cast::<u64>(),
                std::mem::size_of_val(&python) / 8,
            )
        });
        assert_eq!(
            words.len() * 8,
            std::mem::size_of::<WithPython<WaitBrief<8>, 4>>()
        );
        let (own, tail) = python_tail::<4>(bytes(&words), true).unwrap();
        assert_eq!(own, bytes(&plain));
        assert_eq!(brief_frames(own), Some(&frames[..]));
        let tail = tail.unwrap();
        assert_eq!((tail.len, tail.truncated), (2, 1));
        assert_eq!(tail.frames[1], PyFrame { code: 7, instr: 9 });
        // A record without them, or too short to hold them.
        assert!(python_tail::<4>(bytes(&plain), false).unwrap().1.is_none());
        assert!(python_tail::<64>(bytes(&plain), true).is_none());
    }

    #[test]
    fn brief_records_shorter_than_their_frames_are_refused() {
        let frames: Vec<u64> = (1..=9).collect();
        let mut r = brief_record::<16>(&frames);
        // Nine frames said, eight frames' room.
        r.truncate(BRIEF_FRAMES_OFFSET / 8 + 8);
        assert_eq!(brief_frames(bytes(&r)), None);
        let mut r = brief_record::<32>(&frames);
        r[BRIEF_FRAMES_OFFSET / 8 - 1] = WALK_HINT_WORDS as u64 + 1;
        assert_eq!(brief_frames(bytes(&r)), None);
        assert_eq!(brief_frames(&bytes(&r)[..BRIEF_FRAMES_OFFSET - 1]), None);
    }

    /// Records borrowed in place are refused off their alignment, rather
    /// than read through a misaligned reference; copied ones are read.
    #[test]
    fn misaligned_records_are_refused_in_place_and_copied_out() {
        let frames: Vec<u64> = (1..=3).collect();
        let r = brief_record::<8>(&frames);
        // The same bytes one past an 8-byte boundary.
        let mut shifted = vec![0u64; r.len() + 1];
        let at = bytes(&shifted).as_ptr().align_offset(8) + 1;
        let len = bytes(&r).len();
        // SAFETY: within the words' own memory, which is one word longer.
        let moved =
            unsafe { std::slice::from_raw_parts_mut(shifted.as_mut_ptr().cast::<u8>(), len + 8) };
        moved[at..at + len].copy_from_slice(bytes(&r));
        let moved = &moved[at..at + len];
        assert_eq!(brief_frames(bytes(&r)), Some(&frames[..]));
        assert_eq!(brief_frames(moved), None);
        assert!(record::<u64>(moved).is_none());
        assert!(record::<u64>(bytes(&r)).is_some());
        assert_eq!(read_record::<u64>(moved), read_record::<u64>(bytes(&r)));
    }
}
