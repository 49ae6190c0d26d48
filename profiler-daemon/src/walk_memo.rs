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
//! bounded and emptied when full.
//!
//! Checking the words means reading the copy, whose cache lines the kernel
//! wrote on another CPU: most of the daemon's cost per wait event. So each
//! remembered walk also has an id and a [`WalkHint`] (its read offsets and
//! words) that the daemon gives the kernel; the kernel checks the words in
//! the thread's memory and, when they match, sends a brief record without
//! a copy, which [`WalkMemo::lookup_matched`] answers from the id alone.
//!
//! A brief record can only be answered while its walk is remembered, so
//! walks are forgotten in two steps: a full table becomes the previous
//! generation, whose hints the kernel is told to drop
//! ([`WalkMemo::take_retired`]), and is dropped itself only when the next
//! table fills. Records the kernel matched before it dropped a hint are
//! still answered. A walk found again in the previous generation moves
//! back, and its hint is handed to the kernel again.

use std::sync::Arc;

use foldhash::HashMap;
use profiler_common::{STACK_COPY_BYTES, WALK_HINT_WORDS, WalkHint, WalkHintKey};

/// Default bound of remembered walks per generation.
pub const DEFAULT_MAX_WALKS: usize = 4096;
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

/// A remembered walk as found by its id.
struct ById {
    tgid: u32,
    regs: (u64, u64, u64),
    frames: Arc<[u64]>,
    truncated: bool,
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
    /// Of the hits, those the kernel had checked (the copy was not read).
    pub matched_in_kernel: u64,
    /// Brief records whose walk was no longer remembered: their stack is
    /// lost (only the instruction pointer is known).
    pub matched_but_forgotten: u64,
}

/// Bounded table of remembered walks, in two generations.
pub struct WalkMemo {
    current: HashMap<WalkStart, Walk>,
    previous: HashMap<WalkStart, Walk>,
    /// Each remembered walk (of either generation) by id, with what a
    /// brief record needs: one lookup answers it.
    ids: HashMap<u64, ById>,
    /// Hints the kernel should drop: their walks left the current table.
    retired: Vec<WalkHintKey>,
    max_walks: usize,
    next_id: u64,
    stats: MemoStats,
}

impl WalkMemo {
    /// A memo of at most `max_walks` walks per generation (0 disables it).
    pub fn new(max_walks: usize) -> Self {
        Self {
            current: HashMap::default(),
            previous: HashMap::default(),
            ids: HashMap::default(),
            retired: Vec::new(),
            max_walks,
            next_id: 0,
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
            self.make_room();
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
            .then(|| walk_hint(walk.id, start.sp, &walk.reads))
            .flatten()
            .map(|hint| (hint_key(walk.tgid, start), hint));
        Some(Remembered {
            frames: walk.frames.clone(),
            truncated: walk.truncated,
            hint,
        })
    }

    /// The remembered walk with id `id`, which the kernel found to apply to
    /// a thread of `tgid` at these registers (a walk hint it matched): no
    /// word is read. The walk may belong to an older unwinder of the same
    /// process: the kernel checked every word it read. `None` if the walk
    /// is forgotten.
    pub fn lookup_matched(
        &mut self,
        tgid: u32,
        ip: u64,
        sp: u64,
        bp: u64,
        id: u64,
    ) -> Option<(Arc<[u64]>, bool)> {
        let found = self
            .ids
            .get(&id)
            .filter(|walk| walk.tgid == tgid && walk.regs == (ip, sp, bp))
            .map(|walk| (walk.frames.clone(), walk.truncated));
        match found {
            Some(answer) => {
                self.stats.hits += 1;
                self.stats.matched_in_kernel += 1;
                Some(answer)
            }
            None => {
                self.stats.matched_but_forgotten += 1;
                None
            }
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
        let hint = walk_hint(id, start.sp, reads);
        let walk_frames = frames.clone();
        let walk = Walk {
            id,
            tgid,
            reads: reads.into(),
            frames,
            truncated,
            hintable: hint.is_some(),
        };
        if let Some(old) = self.current.insert(start, walk) {
            self.ids.remove(&old.id);
        }
        if let Some(old) = self.previous.remove(&start) {
            self.ids.remove(&old.id);
        }
        self.ids.insert(
            id,
            ById {
                tgid,
                regs: (start.ip, start.sp, start.bp),
                frames: walk_frames,
                truncated,
            },
        );
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
        for walk in self.previous.values() {
            self.ids.remove(&walk.id);
        }
        self.previous = std::mem::take(&mut self.current);
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

    /// Walks remembered now, in both generations.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// Whether no walk is remembered.
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

/// The kernel's form of remembered walk `id` from `sp` that read `reads`:
/// `None` when the kernel could not check it (a read outside the copy,
/// unaligned or beyond the largest copy, or too many reads).
pub fn walk_hint(id: u64, sp: u64, reads: &[Read]) -> Option<WalkHint> {
    if reads.len() > WALK_HINT_WORDS {
        return None;
    }
    let mut hint = WalkHint {
        id,
        len: reads.len() as u32,
        span: 0,
        offsets: [0; WALK_HINT_WORDS],
        words: [0; WALK_HINT_WORDS],
    };
    for (i, &(addr, word)) in reads.iter().enumerate() {
        let offset = addr.checked_sub(sp)?;
        if offset % 8 != 0 || offset + 8 > STACK_COPY_BYTES as u64 {
            return None;
        }
        hint.offsets[i] = u16::try_from(offset).ok()?;
        hint.words[i] = word?;
        hint.span = hint.span.max(offset as u32 + 8);
    }
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
    fn a_walk_the_kernel_matched_is_answered_by_its_id() {
        let mut memo = WalkMemo::new(8);
        let reads = [(0x7008, Some(0x2000)), (0x7018, Some(0x3000))];
        let (key, hint) = memo
            .remember(TGID, START, &reads, Arc::from(vec![0x1000, 0x2000]), false)
            .expect("remembered and hinted");
        assert_eq!(
            (key.tgid, key.ip, key.sp, key.bp),
            (TGID, START.ip, START.sp, START.bp)
        );
        let id = hint.id;
        let at = |memo: &mut WalkMemo, tgid, sp, id| {
            memo.lookup_matched(tgid, START.ip, sp, START.bp, id)
        };
        let (frames, truncated) = at(&mut memo, TGID, START.sp, id).expect("hit");
        assert_eq!((&*frames, truncated), (&[0x1000, 0x2000][..], false));
        // A stale id (the walk was replaced), another process or other
        // registers are no answer.
        let (_, newer) = memo
            .remember(TGID, START, &reads, Arc::from(vec![0x1000]), false)
            .expect("remembered");
        assert_ne!(newer.id, id);
        assert!(at(&mut memo, TGID, START.sp, id).is_none());
        assert!(at(&mut memo, TGID + 1, START.sp, newer.id).is_none());
        assert!(at(&mut memo, TGID, 0x7010, newer.id).is_none());
        // The process's unwinder was rebuilt (its mappings changed): the
        // kernel checked every word, so the walk still applies.
        assert!(at(&mut memo, TGID, START.sp, newer.id).is_some());
        let stats = memo.stats();
        assert_eq!(
            (stats.matched_in_kernel, stats.matched_but_forgotten),
            (2, 3)
        );

        assert_eq!((hint.id, hint.len), (id, 2));
        assert_eq!(&hint.offsets[..2], &[8, 0x18]);
        assert_eq!(&hint.words[..2], &[0x2000, 0x3000]);
        // The kernel copies only up to the last word read, in any order.
        assert_eq!(hint.span, 0x20);
        let reversed = [reads[1], reads[0]];
        assert_eq!(
            walk_hint(id, START.sp, &reversed).map(|h| h.span),
            Some(0x20)
        );
        // What the kernel cannot check is not hinted: a word outside the
        // copy, an unaligned or out-of-reach offset, too many words.
        assert!(walk_hint(id, START.sp, &[(0x7008, None)]).is_none());
        assert!(walk_hint(id, START.sp, &[(0x7004, Some(1))]).is_none());
        assert!(walk_hint(id, START.sp, &[(0x6ff8, Some(1))]).is_none());
        let far = START.sp + STACK_COPY_BYTES as u64;
        assert!(walk_hint(id, START.sp, &[(far, Some(1))]).is_none());
        let many: Vec<Read> = (0..=WALK_HINT_WORDS as u64)
            .map(|i| (START.sp + 8 * i, Some(i)))
            .collect();
        assert!(walk_hint(id, START.sp, &many).is_none());
        assert!(walk_hint(id, START.sp, &many[..WALK_HINT_WORDS]).is_some());
    }

    #[test]
    fn walks_are_forgotten_a_generation_after_their_hints_are_retired() {
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
        // Brief records the kernel matched before dropping them are still
        // answered.
        assert!(
            memo.lookup_matched(TGID, 0, START.sp, START.bp, ids[0])
                .is_some()
        );
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
        assert!(
            memo.lookup_matched(TGID, 0, START.sp, START.bp, ids[0])
                .is_none()
        );
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
            assert!(memo.ids.len() <= 4);
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
