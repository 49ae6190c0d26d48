//! Remembered stack walks, so that a thread waiting again and again at the
//! same place is unwound once.
//!
//! A CFI walk is a pure function of the registers it starts from and of the
//! stack words it reads: the rules come from the process's (unchanged)
//! module set, and every decision after that depends only on values read.
//! So a walk that starts from the same ip, sp and bp and finds the same
//! values at every address the remembered walk read (or finds the same
//! addresses outside the copy) would take the same path and give the same
//! frames. Checking those few words is much cheaper than walking again,
//! and never returns a stack that a fresh walk would not.
//!
//! Entries belong to one process unwinder (one mapping set); a rebuilt
//! unwinder has a new id, so stale entries never match. The table is
//! bounded and forgets in two generations: a full table becomes the
//! previous one, and a walk found again there moves back. Its bytes are
//! counted for the memory budget (budget.rs), which may make it forget a
//! generation early ([`WalkMemo::shed`]).
//!
//! Checking the words means reading the copy, whose cache lines the kernel
//! wrote on another CPU: most of the daemon's cost per wait event. So each
//! remembered walk also has a [`WalkHint`] that the daemon gives the
//! kernel: its read offsets and words, and its frames as indices of those
//! words (every return address a walk finds is a word it read). The kernel
//! checks the words in the thread's memory and, when they match, sends the
//! frames instead of a copy. Such a record carries its own stack: the
//! daemon needs no memory of the walk to read it, so a record is never
//! lost to a walk forgotten, replaced or retired while it sat in the ring
//! (design doc 001). The hints of walks that leave the current table are
//! taken back from the kernel ([`WalkMemo::take_retired`]) so that its
//! table follows the memo's.

use std::sync::Arc;

use foldhash::HashMap;
use profiler_common::{STACK_COPY_BYTES, WALK_HINT_WORDS, WalkHint, WalkHintKey, wait_flags};

/// A walk reading more words than this is not remembered: checking it would
/// cost nearly as much as walking.
const MAX_READS: usize = 256;

/// Where a walk starts.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct WalkStart {
    /// Id of the process unwinder (mapping set) that walked.
    pub unwinder: u64,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// One stack-word read of a walk: the address and what was there (`None`:
/// outside the copied stack).
pub type Read = (u64, Option<u64>);

struct Walk {
    id: u64,
    tgid: u32,
    reads: Box<[Read]>,
    frames: Arc<[u64]>,
    truncated: bool,
    /// Whether the kernel can check it (it was given a hint).
    hintable: bool,
}

impl Walk {
    /// Bytes a remembered walk holds: its slot in the table (at the
    /// table's 7/8 load, with a control byte), its reads and its frames
    /// (shared with the stacks that use them, counted here all the same).
    fn bytes(&self) -> usize {
        (size_of::<(WalkStart, Walk)>() + 1) * 8 / 7
            + size_of_val::<[Read]>(&self.reads)
            + 2 * size_of::<usize>()
            + size_of_val::<[u64]>(&self.frames)
    }
}

/// A remembered walk's answer.
#[derive(Clone, Debug)]
pub struct Remembered {
    pub frames: Arc<[u64]>,
    pub truncated: bool,
    /// A hint the kernel should be given (again): the walk was found by
    /// reading the copy, so the kernel did not hold its hint.
    pub hint: Option<(WalkHintKey, WalkHint)>,
}

/// Counters of the memo.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoStats {
    /// Walks answered from memory.
    pub hits: u64,
    /// Lookups that had to walk.
    pub misses: u64,
    /// Times a full table became the previous generation.
    pub clears: u64,
    /// Records whose stack the kernel matched against a hint and sent as
    /// the walk's frames (the copy, if any, was not read).
    pub matched_in_kernel: u64,
    /// Of those, records whose frames could not be read (a frame count
    /// beyond the hint's bound): only the instruction pointer is kept.
    /// The kernel never sends one; counted so that a test can say so.
    pub matched_but_forgotten: u64,
    /// Walks forgotten when a generation was dropped at the entry bound.
    pub forgotten: u64,
}

/// Bounded table of remembered walks, in two generations.
pub struct WalkMemo {
    current: HashMap<WalkStart, Walk>,
    previous: HashMap<WalkStart, Walk>,
    /// Hints the kernel should drop: their walks left the current table.
    retired: Vec<WalkHintKey>,
    max_walks: usize,
    next_id: u64,
    /// Bytes of the walks in `current` and in `previous`.
    current_bytes: usize,
    previous_bytes: usize,
    stats: MemoStats,
}

impl WalkMemo {
    /// A memo of at most `max_walks` walks per generation (0 disables it).
    pub fn new(max_walks: usize) -> Self {
        Self {
            current: HashMap::default(),
            previous: HashMap::default(),
            retired: Vec::new(),
            max_walks,
            next_id: 0,
            current_bytes: 0,
            previous_bytes: 0,
            stats: MemoStats::default(),
        }
    }

    /// The remembered walk from `start` whose every read finds the same
    /// value in `stack` (the copy taken from `start.sp` upwards).
    pub fn lookup(&mut self, start: &WalkStart, stack: &[u8]) -> Option<Remembered> {
        let same = |walk: &Walk| {
            walk.reads
                .iter()
                .all(|&(addr, value)| read_word(stack, start.sp, addr) == value)
        };
        let found = if self.current.get(start).is_some_and(same) {
            self.current.get(start)
        } else if self.previous.get(start).is_some_and(same) {
            // Back into the current table (and the kernel's hints).
            let walk = self.previous.remove(start)?;
            self.previous_bytes -= walk.bytes();
            self.make_room();
            self.current_bytes += walk.bytes();
            self.current.insert(*start, walk);
            self.current.get(start)
        } else {
            None
        };
        let Some(walk) = found else {
            self.stats.misses += 1;
            return None;
        };
        self.stats.hits += 1;
        let hint = walk
            .hintable
            .then(|| walk_hint(walk.id, start, &walk.reads, &walk.frames, walk.truncated))
            .flatten()
            .map(|hint| (hint_key(walk.tgid, start), hint));
        Some(Remembered {
            frames: walk.frames.clone(),
            truncated: walk.truncated,
            hint,
        })
    }

    /// Counts a record whose stack the kernel matched against a hint:
    /// `readable` when its frames could be read.
    pub fn note_matched(&mut self, readable: bool) {
        self.stats.matched_in_kernel += 1;
        if !readable {
            self.stats.matched_but_forgotten += 1;
        }
    }

    /// Remembers a walk of a thread of `tgid` from `start` that read
    /// `reads` and gave `frames`; returns the hint for the kernel, if the
    /// walk is remembered and the kernel can check it.
    pub fn remember(
        &mut self,
        tgid: u32,
        start: WalkStart,
        reads: &[Read],
        frames: Arc<[u64]>,
        truncated: bool,
    ) -> Option<(WalkHintKey, WalkHint)> {
        if self.max_walks == 0 || reads.len() > MAX_READS {
            return None;
        }
        if !self.current.contains_key(&start) {
            self.make_room();
        }
        self.next_id += 1;
        let id = self.next_id;
        let hint = walk_hint(id, &start, reads, &frames, truncated);
        let walk = Walk {
            id,
            tgid,
            reads: reads.into(),
            frames,
            truncated,
            hintable: hint.is_some(),
        };
        self.current_bytes += walk.bytes();
        if let Some(old) = self.current.insert(start, walk) {
            self.current_bytes -= old.bytes();
        }
        if let Some(old) = self.previous.remove(&start) {
            self.previous_bytes -= old.bytes();
        }
        hint.map(|hint| (hint_key(tgid, &start), hint))
    }

    /// Hints the kernel should drop now (their walks left the current
    /// table); each is given once.
    pub fn take_retired(&mut self) -> Vec<WalkHintKey> {
        std::mem::take(&mut self.retired)
    }

    /// Makes room for one more walk in the current table: a full table
    /// becomes the previous generation, and the one before is dropped.
    fn make_room(&mut self) {
        if self.current.len() < self.max_walks {
            return;
        }
        self.stats.forgotten += self.previous.len() as u64;
        self.rotate();
    }

    /// The current table becomes the previous one; the one before is
    /// forgotten, and the hints of the walks leaving the current table
    /// are retired.
    fn rotate(&mut self) {
        self.previous = std::mem::take(&mut self.current);
        self.previous_bytes = std::mem::replace(&mut self.current_bytes, 0);
        // Taken after every drain; the bound only guards a caller that
        // never takes them.
        if self.retired.len() > 2 * self.max_walks {
            self.retired.clear();
        }
        self.retired.extend(
            self.previous
                .iter()
                .filter(|(_, walk)| walk.hintable)
                .map(|(start, walk)| hint_key(walk.tgid, start)),
        );
        self.stats.clears += 1;
    }

    /// Counters so far.
    pub fn stats(&self) -> MemoStats {
        self.stats
    }

    /// Bytes of the walks remembered now.
    pub fn bytes(&self) -> usize {
        self.current_bytes + self.previous_bytes
    }

    /// Gives memory back to the budget: forgets the previous generation,
    /// or, when there is none, makes the current one the previous (its
    /// hints retired; it is forgotten at the next call). Returns how many
    /// walks were forgotten, `None` when there was nothing to give.
    pub fn shed(&mut self) -> Option<usize> {
        if !self.previous.is_empty() {
            let forgotten = std::mem::take(&mut self.previous).len();
            self.previous_bytes = 0;
            return Some(forgotten);
        }
        if self.current.is_empty() {
            return None;
        }
        self.rotate();
        Some(0)
    }

    /// Walks remembered now, in both generations.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// Whether no walk is remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The kernel's key of a walk of a thread of `tgid`.
fn hint_key(tgid: u32, start: &WalkStart) -> WalkHintKey {
    WalkHintKey {
        tgid,
        _pad: 0,
        ip: start.ip,
        sp: start.sp,
        bp: start.bp,
    }
}

/// The kernel's form of remembered walk `id` from `start` that read
/// `reads` and gave `frames` (`start.ip` first): `None` when the kernel
/// could not check it (a read outside the copy, unaligned or beyond the
/// largest copy, or too many reads) or a frame is no word it read.
pub fn walk_hint(
    id: u64,
    start: &WalkStart,
    reads: &[Read],
    frames: &[u64],
    truncated: bool,
) -> Option<WalkHint> {
    if reads.len() > WALK_HINT_WORDS || frames.first() != Some(&start.ip) {
        return None;
    }
    let mut hint = WalkHint {
        id,
        check: 0,
        len: reads.len() as u32,
        span: 0,
        frames_len: 0,
        flags: if truncated {
            wait_flags::WALK_TRUNCATED
        } else {
            0
        },
        offsets: [0; WALK_HINT_WORDS],
        frame_words: [0; WALK_HINT_WORDS],
        words: [0; WALK_HINT_WORDS],
    };
    for (i, &(addr, word)) in reads.iter().enumerate() {
        let offset = addr.checked_sub(start.sp)?;
        if offset % 8 != 0 || offset + 8 > STACK_COPY_BYTES as u64 {
            return None;
        }
        hint.offsets[i] = u16::try_from(offset).ok()?;
        hint.words[i] = word?;
        hint.span = hint.span.max(offset as u32 + 8);
    }
    // Each return address is the first word with its value read after the
    // one before it: walks read the stack upwards, frame by frame. (Any
    // word with that value would do: the frame is the value.)
    let returns = &frames[1..];
    if returns.len() > WALK_HINT_WORDS {
        return None;
    }
    let mut from = 0;
    for (i, &frame) in returns.iter().enumerate() {
        let at = from + reads[from..].iter().position(|&(_, w)| w == Some(frame))?;
        hint.frame_words[i] = u8::try_from(at).ok()?;
        from = at + 1;
    }
    hint.frames_len = returns.len() as u32;
    hint.check = hint.seal();
    Some(hint)
}

/// The little-endian word at `addr` of a stack copied from `sp`, if the copy
/// holds all of it.
pub fn read_word(stack: &[u8], sp: u64, addr: u64) -> Option<u64> {
    let offset = usize::try_from(addr.checked_sub(sp)?).ok()?;
    let bytes = stack.get(offset..offset.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    const TGID: u32 = 42;
    const START: WalkStart = WalkStart {
        unwinder: 1,
        ip: 0x1000,
        sp: 0x7000,
        bp: 0,
    };

    fn frames(memo: &mut WalkMemo, start: &WalkStart, copy: &[u8]) -> Option<Vec<u64>> {
        memo.lookup(start, copy).map(|hit| hit.frames.to_vec())
    }

    #[test]
    fn a_walk_is_reused_only_when_every_read_word_matches() {
        let mut memo = WalkMemo::new(8);
        let copy = stack(&[1, 0x2000, 3, 0x3000]);
        let reads = [
            (0x7008, Some(0x2000)),
            (0x7018, Some(0x3000)),
            (0x7020, None),
        ];
        let hint = memo.remember(
            TGID,
            START,
            &reads,
            Arc::from(vec![0x1000, 0x2000, 0x3000]),
            true,
        );
        // A read outside the copy: the kernel could not check it.
        assert!(hint.is_none());

        // Words the walk never read may change.
        let other_locals = stack(&[9, 0x2000, 9, 0x3000]);
        let hit = memo.lookup(&START, &other_locals).expect("hit");
        assert_eq!(&*hit.frames, &[0x1000, 0x2000, 0x3000]);
        assert!(hit.truncated);
        assert!(hit.hint.is_none());
        assert!(memo.lookup(&START, &copy).is_some());

        // A changed return address, or a longer copy that now holds a word
        // the walk found missing, means walking again.
        assert!(frames(&mut memo, &START, &stack(&[1, 0x2000, 3, 0x4000])).is_none());
        assert!(frames(&mut memo, &START, &stack(&[1, 0x2000, 3, 0x3000, 5])).is_none());
        // So does another start.
        let moved = WalkStart { bp: 8, ..START };
        assert!(frames(&mut memo, &moved, &copy).is_none());
        let rebuilt = WalkStart {
            unwinder: 2,
            ..START
        };
        assert!(frames(&mut memo, &rebuilt, &copy).is_none());
        assert_eq!(
            memo.stats(),
            MemoStats {
                hits: 2,
                misses: 4,
                ..MemoStats::default()
            }
        );
    }

    #[test]
    fn a_hint_carries_its_walks_frames() {
        let mut memo = WalkMemo::new(8);
        // A saved frame pointer, then two return addresses.
        let reads = [
            (0x7000, Some(0x7040)),
            (0x7008, Some(0x2000)),
            (0x7018, Some(0x3000)),
        ];
        let (key, hint) = memo
            .remember(
                TGID,
                START,
                &reads,
                Arc::from(vec![0x1000, 0x2000, 0x3000]),
                true,
            )
            .expect("remembered and hinted");
        assert_eq!(
            (key.tgid, key.ip, key.sp, key.bp),
            (TGID, START.ip, START.sp, START.bp)
        );
        assert_eq!(hint.len, 3);
        assert_eq!(&hint.offsets[..3], &[0, 8, 0x18]);
        assert_eq!(&hint.words[..3], &[0x7040, 0x2000, 0x3000]);
        // The frames after the ip, as the words the kernel sends.
        assert_eq!(hint.frames_len, 2);
        let sent: Vec<u64> = hint.frame_words[..2]
            .iter()
            .map(|&i| hint.words[i as usize])
            .collect();
        assert_eq!(sent, [0x2000, 0x3000]);
        assert_eq!(hint.flags, wait_flags::WALK_TRUNCATED);
        // The seal covers every field the kernel reads.
        assert_eq!(hint.check, hint.seal());
        for change in [
            |h: &mut WalkHint| h.id += 1,
            |h: &mut WalkHint| h.words[1] ^= 1,
            |h: &mut WalkHint| h.offsets[2] += 8,
            |h: &mut WalkHint| h.frame_words[0] = 0,
            |h: &mut WalkHint| h.frames_len = 1,
            |h: &mut WalkHint| h.flags = 0,
        ] {
            let mut torn = hint;
            change(&mut torn);
            assert_ne!(torn.seal(), hint.check);
        }
        // Records the kernel matched are counted.
        memo.note_matched(true);
        memo.note_matched(false);
        let stats = memo.stats();
        assert_eq!(
            (stats.matched_in_kernel, stats.matched_but_forgotten),
            (2, 1)
        );

        // The kernel copies only up to the last word read, in any order.
        assert_eq!(hint.span, 0x20);
        let two = [0x1000, 0x2000];
        let hinted = |reads: &[Read], frames: &[u64]| walk_hint(1, &START, reads, frames, false);
        assert_eq!(
            hinted(&[reads[2], reads[1]], &two).map(|h| h.span),
            Some(0x20)
        );
        // What the kernel cannot check or send is not hinted: a word
        // outside the copy, an unaligned or out-of-reach offset, too many
        // words, a frame that is no word read (or not in walk order), a
        // first frame that is not the ip.
        assert!(hinted(&[(0x7008, None)], &[0x1000]).is_none());
        assert!(hinted(&[(0x7004, Some(1))], &[0x1000]).is_none());
        assert!(hinted(&[(0x6ff8, Some(1))], &[0x1000]).is_none());
        let far = START.sp + STACK_COPY_BYTES as u64;
        assert!(hinted(&[(far, Some(1))], &[0x1000]).is_none());
        let many: Vec<Read> = (0..=WALK_HINT_WORDS as u64)
            .map(|i| (START.sp + 8 * i, Some(i)))
            .collect();
        assert!(hinted(&many, &[0x1000]).is_none());
        assert!(hinted(&many[..WALK_HINT_WORDS], &[0x1000]).is_some());
        assert!(hinted(&reads, &[0x1000, 0x4000]).is_none());
        assert!(hinted(&reads, &[0x1000, 0x3000, 0x2000]).is_none());
        assert!(hinted(&reads, &[0x1001, 0x2000]).is_none());
    }

    #[test]
    fn hints_are_taken_back_when_their_walks_leave_the_table() {
        let mut memo = WalkMemo::new(2);
        let start = |ip| WalkStart { ip, ..START };
        let reads = [(0x7000, Some(7))];
        let copy = stack(&[7]);
        let mut ids = Vec::new();
        for ip in 0..2 {
            let (_, hint) = memo
                .remember(TGID, start(ip), &reads, Arc::from(vec![ip]), false)
                .expect("hinted");
            ids.push(hint.id);
        }
        assert!(memo.take_retired().is_empty());
        // A third walk: the first two become the previous generation, and
        // the kernel is told to drop their hints, once.
        memo.remember(TGID, start(2), &reads, Arc::from(vec![2]), false);
        let mut retired: Vec<u64> = memo.take_retired().iter().map(|k| k.ip).collect();
        retired.sort_unstable();
        assert_eq!(retired, [0, 1]);
        assert!(memo.take_retired().is_empty());
        // Found again through a copy, a walk moves back, with its hint
        // handed to the kernel again.
        let hit = memo
            .lookup(&start(1), &copy)
            .expect("in the previous generation");
        assert_eq!(
            hit.hint.map(|(key, hint)| (key.ip, hint.id)),
            Some((1, ids[1]))
        );
        // Two more walks fill the table again: the walk at ip 0, two
        // generations old now, is forgotten.
        memo.remember(TGID, start(3), &reads, Arc::from(vec![3]), false);
        assert!(frames(&mut memo, &start(0), &copy).is_none());
        assert_eq!(frames(&mut memo, &start(1), &copy), Some(vec![1]));
        assert!(memo.len() <= 4);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut memo = WalkMemo::new(2);
        for ip in 0..9 {
            let start = WalkStart { ip, ..START };
            memo.remember(TGID, start, &[], Arc::from(vec![ip]), false);
            assert!(memo.len() <= 4);
        }
        assert_eq!(memo.stats().clears, 4);
        let too_many: Vec<Read> = (0..=MAX_READS as u64).map(|a| (a, None)).collect();
        let mut memo = WalkMemo::new(2);
        memo.remember(TGID, START, &too_many, Arc::from(vec![1]), false);
        assert!(memo.is_empty());
        assert!(WalkMemo::new(0).lookup(&START, &[]).is_none());
    }

    #[test]
    fn words_are_read_only_inside_the_copy() {
        let copy = stack(&[7, 8]);
        assert_eq!(read_word(&copy, 0x100, 0x100), Some(7));
        assert_eq!(read_word(&copy, 0x100, 0x108), Some(8));
        assert_eq!(read_word(&copy, 0x100, 0x10c), None);
        assert_eq!(read_word(&copy, 0x100, 0xf8), None);
        assert_eq!(read_word(&copy, 0x100, u64::MAX), None);
    }
}
