//! Walk hints: the daemon's remembered walks as the kernel checks them,
//! sealed against torn reads.

/// Words a walk hint checks: a remembered walk that read more is not
/// hinted.
pub const WALK_HINT_WORDS: usize = 32;

/// Walk hints the kernel holds (least recently used go first).
pub const WALK_HINTS_ENTRIES: u32 = 4096;

/// Where a remembered walk starts: the key of the kernel's `WALK_HINTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WalkHintKey {
    pub tgid: u32,
    pub _pad: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// A remembered walk as the kernel holds it: the stack words it read, so
/// that the kernel, which reads them in the thread's memory, can tell that
/// the walk applies, and its frames (as indices of those words: every
/// return address a walk finds is a word it read), so that a record sent
/// without a stack copy carries its own stack. The daemon then never reads
/// a copy, and never needs to remember a walk to answer a record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WalkHint {
    /// The daemon's id of the remembered walk.
    pub id: u64,
    /// [`WalkHint::seal`] of the rest: the kernel recomputes it over what
    /// it read and trusts the hint only if the two agree, so a value the
    /// daemon replaced while a program read it (LRU map elements are
    /// reused at once) is never taken for a match.
    pub check: u64,
    /// Words in use.
    pub len: u32,
    /// Bytes from `sp` that hold every word read (the last offset + 8):
    /// all the kernel copies when it finds this hint, as the walk needs
    /// nothing beyond, however far the thread's stack goes on.
    pub span: u32,
    /// Frames of the walk after its first (the instruction pointer).
    pub frames_len: u32,
    /// `wait_flags::WALK_TRUNCATED` when the walk stopped before the root.
    pub flags: u32,
    /// Byte offsets from `sp` (multiples of 8) of the words read.
    pub offsets: [u16; WALK_HINT_WORDS],
    /// For each frame after the first, the index in `words` of its return
    /// address.
    pub frame_words: [u8; WALK_HINT_WORDS],
    /// The word the walk found at each offset.
    pub words: [u64; WALK_HINT_WORDS],
}

/// One step of [`WalkHint::seal`]; the kernel folds the same values in the
/// same order as it checks a hint.
#[inline(always)]
pub const fn hint_mix(h: u64, value: u64) -> u64 {
    (h ^ value)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(29)
}

/// Where [`WalkHint::seal`] starts.
pub const HINT_SEAL_SEED: u64 = 0x5157_a1b0_c0de_f00d;

impl WalkHint {
    /// The check value of this hint: its id, each (offset, word) in use,
    /// each frame's word, then the frame count and flags, folded with
    /// [`hint_mix`].
    pub fn seal(&self) -> u64 {
        let mut h = hint_mix(HINT_SEAL_SEED, self.id);
        let len = (self.len as usize).min(WALK_HINT_WORDS);
        for i in 0..len {
            h = hint_mix(h, self.words[i] ^ u64::from(self.offsets[i]));
        }
        let frames = (self.frames_len as usize).min(WALK_HINT_WORDS);
        for i in 0..frames {
            let index = self.frame_words[i] as usize & (WALK_HINT_WORDS - 1);
            h = hint_mix(h, self.words[index]);
        }
        hint_mix(h, u64::from(self.frames_len) | u64::from(self.flags) << 32)
    }
}
