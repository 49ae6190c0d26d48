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
//! words) that the daemon gives the kernel; the kernel checks the words
//! while the copy is in its cache and flags the event, and
//! [`WalkMemo::lookup_matched`] then answers from the id alone.

use std::sync::Arc;

use foldhash::HashMap;
use profiler_common::{STACK_COPY_BYTES, WALK_HINT_WORDS, WalkHint};

/// Default bound of remembered walks.
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
    reads: Box<[Read]>,
    frames: Arc<[u64]>,
    truncated: bool,
}

/// Counters of the memo.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoStats {
    /// Walks answered from memory.
    pub hits: u64,
    /// Lookups that had to walk.
    pub misses: u64,
    /// Times the table was emptied because it was full.
    pub clears: u64,
    /// Of the hits, those the kernel had checked (the copy was not read).
    pub matched_in_kernel: u64,
}

/// Bounded table of remembered walks.
pub struct WalkMemo {
    walks: HashMap<WalkStart, Walk>,
    max_walks: usize,
    next_id: u64,
    stats: MemoStats,
}

impl WalkMemo {
    /// A memo of at most `max_walks` walks (0 disables it).
    pub fn new(max_walks: usize) -> Self {
        Self {
            walks: HashMap::default(),
            max_walks,
            next_id: 0,
            stats: MemoStats::default(),
        }
    }

    /// The frames, and whether they were truncated, of a remembered walk
    /// from `start` whose every read finds the same value in `stack` (the
    /// copy taken from `start.sp` upwards).
    pub fn lookup(&mut self, start: &WalkStart, stack: &[u8]) -> Option<(Arc<[u64]>, bool)> {
        let found = self.walks.get(start).filter(|walk| {
            walk.reads
                .iter()
                .all(|&(addr, value)| read_word(stack, start.sp, addr) == value)
        });
        match found {
            Some(walk) => {
                self.stats.hits += 1;
                Some((walk.frames.clone(), walk.truncated))
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// The remembered walk from `start` with id `id`, whose words the
    /// kernel found in the copy (a walk hint it matched): no word is read.
    /// `None` if that walk is gone (the table was emptied, the process's
    /// unwinder rebuilt); the caller then looks up with the copy.
    pub fn lookup_matched(&mut self, start: &WalkStart, id: u64) -> Option<(Arc<[u64]>, bool)> {
        let walk = self.walks.get(start).filter(|walk| walk.id == id)?;
        self.stats.hits += 1;
        self.stats.matched_in_kernel += 1;
        Some((walk.frames.clone(), walk.truncated))
    }

    /// Remembers a walk from `start` that read `reads` and gave `frames`;
    /// returns its id, or `None` if it is not remembered.
    pub fn remember(
        &mut self,
        start: WalkStart,
        reads: &[Read],
        frames: Arc<[u64]>,
        truncated: bool,
    ) -> Option<u64> {
        if self.max_walks == 0 || reads.len() > MAX_READS {
            return None;
        }
        if self.walks.len() >= self.max_walks && !self.walks.contains_key(&start) {
            self.walks.clear();
            self.stats.clears += 1;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.walks.insert(
            start,
            Walk {
                id,
                reads: reads.into(),
                frames,
                truncated,
            },
        );
        Some(id)
    }

    /// Counters so far.
    pub fn stats(&self) -> MemoStats {
        self.stats
    }

    /// Walks remembered now.
    pub fn len(&self) -> usize {
        self.walks.len()
    }

    /// Whether no walk is remembered.
    pub fn is_empty(&self) -> bool {
        self.walks.is_empty()
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
        _pad: 0,
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

    const START: WalkStart = WalkStart {
        unwinder: 1,
        ip: 0x1000,
        sp: 0x7000,
        bp: 0,
    };

    #[test]
    fn a_walk_is_reused_only_when_every_read_word_matches() {
        let mut memo = WalkMemo::new(8);
        let copy = stack(&[1, 0x2000, 3, 0x3000]);
        let reads = [
            (0x7008, Some(0x2000)),
            (0x7018, Some(0x3000)),
            (0x7020, None),
        ];
        memo.remember(START, &reads, Arc::from(vec![0x1000, 0x2000, 0x3000]), true);

        // Words the walk never read may change.
        let other_locals = stack(&[9, 0x2000, 9, 0x3000]);
        let (frames, truncated) = memo.lookup(&START, &other_locals).expect("hit");
        assert_eq!(&*frames, &[0x1000, 0x2000, 0x3000]);
        assert!(truncated);
        assert!(memo.lookup(&START, &copy).is_some());

        // A changed return address, or a longer copy that now holds a word
        // the walk found missing, means walking again.
        assert!(
            memo.lookup(&START, &stack(&[1, 0x2000, 3, 0x4000]))
                .is_none()
        );
        assert!(
            memo.lookup(&START, &stack(&[1, 0x2000, 3, 0x3000, 5]))
                .is_none()
        );
        // So does another start.
        let moved = WalkStart { bp: 8, ..START };
        assert!(memo.lookup(&moved, &copy).is_none());
        let rebuilt = WalkStart {
            unwinder: 2,
            ..START
        };
        assert!(memo.lookup(&rebuilt, &copy).is_none());
        assert_eq!(
            memo.stats(),
            MemoStats {
                hits: 2,
                misses: 4,
                clears: 0,
                matched_in_kernel: 0,
            }
        );
    }

    #[test]
    fn a_walk_the_kernel_matched_is_answered_by_its_id() {
        let mut memo = WalkMemo::new(8);
        let reads = [(0x7008, Some(0x2000)), (0x7018, Some(0x3000))];
        let id = memo
            .remember(START, &reads, Arc::from(vec![0x1000, 0x2000]), false)
            .expect("remembered");
        let (frames, truncated) = memo.lookup_matched(&START, id).expect("hit");
        assert_eq!((&*frames, truncated), (&[0x1000, 0x2000][..], false));
        // A stale id (the walk was replaced) or another start is no answer.
        let newer = memo
            .remember(START, &reads, Arc::from(vec![0x1000]), false)
            .expect("remembered");
        assert_ne!(newer, id);
        assert!(memo.lookup_matched(&START, id).is_none());
        let moved = WalkStart {
            sp: 0x7010,
            ..START
        };
        assert!(memo.lookup_matched(&moved, newer).is_none());
        assert_eq!(memo.stats().matched_in_kernel, 1);

        let hint = walk_hint(id, START.sp, &reads).expect("hintable");
        assert_eq!((hint.id, hint.len), (id, 2));
        assert_eq!(&hint.offsets[..2], &[8, 0x18]);
        assert_eq!(&hint.words[..2], &[0x2000, 0x3000]);
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
    fn the_table_is_bounded() {
        let mut memo = WalkMemo::new(2);
        for ip in 0..5 {
            let start = WalkStart { ip, ..START };
            memo.remember(start, &[], Arc::from(vec![ip]), false);
            assert!(memo.len() <= 2);
        }
        assert_eq!(memo.stats().clears, 2);
        let too_many: Vec<Read> = (0..=MAX_READS as u64).map(|a| (a, None)).collect();
        let mut memo = WalkMemo::new(2);
        memo.remember(START, &too_many, Arc::from(vec![1]), false);
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
