//! One memory budget for the daemon's user-space caches (`[limits]
//! memory_bytes`): symbol results, object layouts and PLT stubs, the files
//! blazesym has parsed, unwind sections, per-process unwinders and the
//! walk memo.
//!
//! Each cache counts its own bytes (an estimate per entry, said where the
//! entry is made) and publishes the sum here; [`MemoryBudget`] adds them
//! up. Every cache has a floor, a share of the budget it may always fill
//! ([`Cache::floor_percent`]; the floors add up to the whole budget), and
//! may borrow what the others leave free. When the total is over the
//! budget, a cache holding more than its floor gives back its least
//! recently used entries, so a cache that borrowed returns what it took
//! and one within its floor is never starved by the others.
//!
//! The caches live in two owners, the symbolizer and the unwinder, each
//! of which sheds its own caches after every stack
//! ([`MemoryBudget::must_shed`]). Room one of them borrowed is given back
//! when the session settles the budget after each batch of records, each
//! tick and each window ([`MemoryBudget::settle`]). In between, the total
//! can pass the budget by the floor of the cache that grew, and while a
//! window is symbolized by the parsed files it needs (dropping one
//! between two stacks of the window would parse it again for the next);
//! the metrics and the summary's peak are read when the budget is
//! settled.
//!
//! [`Lru`] is the byte-counted, least-recently-used map most caches use.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::mem::size_of;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The caches that draw on the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cache {
    /// Symbolized (object, offset) results: functions, files, lines.
    Symbols,
    /// Code-section layouts and PLT stubs per object.
    Layouts,
    /// What blazesym holds per parsed file (symbol tables, DWARF units).
    SymbolFiles,
    /// `.eh_frame`/`.debug_frame` bytes and load segments per object.
    UnwindObjects,
    /// Per-process framehop unwinders and their rule caches.
    Unwinders,
    /// Remembered stack walks.
    WalkMemo,
}

impl Cache {
    pub const ALL: [Cache; 6] = [
        Cache::Symbols,
        Cache::Layouts,
        Cache::SymbolFiles,
        Cache::UnwindObjects,
        Cache::Unwinders,
        Cache::WalkMemo,
    ];

    /// The `cache` label of the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Cache::Symbols => "symbols",
            Cache::Layouts => "layouts",
            Cache::SymbolFiles => "symbol_files",
            Cache::UnwindObjects => "unwind_objects",
            Cache::Unwinders => "unwinders",
            Cache::WalkMemo => "walk_memo",
        }
    }

    /// The share of the budget the cache may always fill, in percent.
    /// Unwind sections and parsed symbol files are the large ones: a busy
    /// node's libraries need megabytes of each (docs/design/015); symbol
    /// results are many but small; a process unwinder is a few KiB, and
    /// the memo's default bound of 4096 walks twice over holds about
    /// 2 MiB.
    pub fn floor_percent(self) -> usize {
        match self {
            Cache::Symbols => 15,
            Cache::Layouts => 3,
            Cache::SymbolFiles => 30,
            Cache::UnwindObjects => 37,
            Cache::Unwinders => 10,
            Cache::WalkMemo => 5,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

const CACHES: usize = Cache::ALL.len();

/// The budget shared by every cache; clones share it.
#[derive(Clone, Debug)]
pub struct MemoryBudget(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    limit: usize,
    bytes: [AtomicUsize; CACHES],
    evictions: [AtomicU64; CACHES],
    /// The largest total seen when the budget was settled.
    peak: AtomicUsize,
    /// Whether the budget has forced an eviction yet (logged once).
    pressed: AtomicBool,
}

/// The budget's figures now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetStats {
    pub limit: u64,
    /// Bytes per cache, in [`Cache::ALL`] order.
    pub bytes: [u64; CACHES],
    /// Entries dropped per cache to stay within the budget or an entry
    /// bound, in [`Cache::ALL`] order.
    pub evictions: [u64; CACHES],
    /// The largest total seen when the budget was settled.
    pub peak: u64,
}

impl BudgetStats {
    pub fn total_bytes(&self) -> u64 {
        self.bytes.iter().sum()
    }

    pub fn total_evictions(&self) -> u64 {
        self.evictions.iter().sum()
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self(Arc::new(Shared {
            limit,
            bytes: Default::default(),
            evictions: Default::default(),
            peak: AtomicUsize::new(0),
            pressed: AtomicBool::new(false),
        }))
    }

    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// The bytes `cache` may always hold.
    pub fn floor(&self, cache: Cache) -> usize {
        self.0.limit / 100 * cache.floor_percent()
    }

    /// Publishes the bytes `cache` holds now.
    pub fn set(&self, cache: Cache, bytes: usize) {
        self.0.bytes[cache.index()].store(bytes, Ordering::Relaxed);
    }

    pub fn bytes(&self, cache: Cache) -> usize {
        self.0.bytes[cache.index()].load(Ordering::Relaxed)
    }

    /// Bytes held by all caches now.
    pub fn total(&self) -> usize {
        self.0.bytes.iter().fold(0usize, |sum, b| {
            sum.saturating_add(b.load(Ordering::Relaxed))
        })
    }

    /// Whether `cache` must give back an entry now: the total is over the
    /// budget and the cache holds more than its floor.
    pub fn must_shed(&self, cache: Cache) -> bool {
        self.bytes(cache) > self.floor(cache) && self.total() > self.0.limit
    }

    /// Counts `count` entries of `cache` dropped; `by_budget` when the
    /// budget forced it (said once in the log), not an entry bound.
    pub fn evicted(&self, cache: Cache, count: u64, by_budget: bool) {
        if count == 0 {
            return;
        }
        self.0.evictions[cache.index()].fetch_add(count, Ordering::Relaxed);
        if by_budget && !self.0.pressed.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "profilerd::session",
                cache = cache.name(),
                budget_bytes = self.0.limit,
                cache_bytes = self.total(),
                "the memory budget ([limits] memory_bytes) is full: least recently used cache entries are dropped from now on (logged once; see profilerd_cache_evictions_total and the exit summary)"
            );
        }
    }

    /// Notes the total once every owner has shed what it must.
    pub fn settle(&self) {
        self.0.peak.fetch_max(self.total(), Ordering::Relaxed);
    }

    pub fn stats(&self) -> BudgetStats {
        let mut stats = BudgetStats {
            limit: self.0.limit as u64,
            peak: self.0.peak.load(Ordering::Relaxed) as u64,
            ..BudgetStats::default()
        };
        for cache in Cache::ALL {
            let i = cache.index();
            stats.bytes[i] = self.0.bytes[i].load(Ordering::Relaxed) as u64;
            stats.evictions[i] = self.0.evictions[i].load(Ordering::Relaxed);
        }
        stats
    }
}

pub use crate::model::own_heap::heap_in_use;

/// A map that counts its entries' bytes and drops the least recently used
/// first. Each entry is charged the heap bytes its maker estimates plus
/// the map's own cost of holding it ([`Lru::entry_overhead`]).
///
/// A use only stamps the entry (a lookup per frame must stay cheap); the
/// use order is mended when entries are dropped: an entry found in the
/// order under an older stamp than its last use is queued again there.
pub struct Lru<K, V> {
    map: HashMap<K, Slot<V>>,
    /// Each entry under the stamp it was queued at, oldest first; an
    /// entry's queued stamp is never later than its last use.
    order: BTreeMap<u64, K>,
    clock: u64,
    bytes: usize,
}

struct Slot<V> {
    value: V,
    bytes: usize,
    used: u64,
    queued: u64,
}

impl<K: Clone + Hash + Eq, V> Default for Lru<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Hash + Eq, V> Lru<K, V> {
    pub fn new() -> Self {
        Self {
            map: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
            bytes: 0,
        }
    }

    /// What holding one entry costs the map itself: its hash-table slot
    /// (at the table's 7/8 load, with a control byte) and its place in the
    /// use order (a B-tree entry, its nodes about two-thirds full).
    pub fn entry_overhead() -> usize {
        let slot = size_of::<(K, Slot<V>)>() + 1;
        let order = size_of::<(u64, K)>();
        slot * 8 / 7 + order * 3 / 2
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes charged for every entry now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The entry of `key`, now the most recently used.
    pub fn get(&mut self, key: &K) -> Option<&mut V> {
        let now = self.clock + 1;
        let slot = self.map.get_mut(key)?;
        self.clock = now;
        slot.used = now;
        Some(&mut slot.value)
    }

    /// The entry of `key`, made by `make` (the value and the heap bytes it
    /// holds) if there is none; now the most recently used.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> (V, usize)) -> &mut V {
        let now = self.tick();
        let overhead = Self::entry_overhead();
        let Self {
            map, order, bytes, ..
        } = self;
        match map.entry(key) {
            Entry::Occupied(found) => {
                let slot = found.into_mut();
                slot.used = now;
                &mut slot.value
            }
            Entry::Vacant(vacant) => {
                let (value, heap_bytes) = make();
                let charged = heap_bytes.saturating_add(overhead);
                *bytes = bytes.saturating_add(charged);
                order.insert(now, vacant.key().clone());
                let slot = vacant.insert(Slot {
                    value,
                    bytes: charged,
                    used: now,
                    queued: now,
                });
                &mut slot.value
            }
        }
    }

    /// The entry of `key`, leaving the use order alone.
    #[cfg(test)]
    pub fn peek(&self, key: &K) -> Option<&V> {
        self.map.get(key).map(|slot| &slot.value)
    }

    /// Inserts (or replaces) `key` as the most recently used entry, whose
    /// value holds `heap_bytes` on the heap.
    pub fn insert(&mut self, key: K, value: V, heap_bytes: usize) {
        self.remove(&key);
        let now = self.tick();
        let bytes = heap_bytes.saturating_add(Self::entry_overhead());
        self.bytes = self.bytes.saturating_add(bytes);
        self.order.insert(now, key.clone());
        self.map.insert(
            key,
            Slot {
                value,
                bytes,
                used: now,
                queued: now,
            },
        );
    }

    /// Charges `key` anew after its value changed: it now holds
    /// `heap_bytes` on the heap.
    pub fn recharge(&mut self, key: &K, heap_bytes: usize) {
        let overhead = Self::entry_overhead();
        if let Some(slot) = self.map.get_mut(key) {
            let bytes = heap_bytes.saturating_add(overhead);
            self.bytes = self.bytes - slot.bytes + bytes;
            slot.bytes = bytes;
        }
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        let slot = self.map.remove(key)?;
        self.order.remove(&slot.queued);
        self.bytes -= slot.bytes;
        Some(slot.value)
    }

    /// Drops the least recently used entry; returns it.
    pub fn pop_lru(&mut self) -> Option<(K, V)> {
        self.pop_lru_where(|_, _| true)
    }

    /// Drops the least recently used entry that `pick` accepts.
    pub fn pop_lru_where(&mut self, mut pick: impl FnMut(&K, &V) -> bool) -> Option<(K, V)> {
        let mut passed = Vec::new();
        let found = loop {
            let Some((stamp, key)) = self.order.pop_first() else {
                break None;
            };
            let Some(slot) = self.map.get_mut(&key) else {
                continue;
            };
            if slot.used != stamp {
                // Used since it was queued: its place is at that use.
                slot.queued = slot.used;
                self.order.insert(slot.used, key);
                continue;
            }
            if pick(&key, &slot.value) {
                break Some(key);
            }
            passed.push((stamp, key));
        };
        self.order.extend(passed);
        let key = found?;
        let slot = self.map.remove(&key)?;
        self.bytes -= slot.bytes;
        Some((key, slot.value))
    }

    /// Keeps the entries `keep` accepts; returns how many were dropped.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) -> usize {
        let mut dropped = 0;
        let Self {
            map, order, bytes, ..
        } = self;
        map.retain(|key, slot| {
            let kept = keep(key, &mut slot.value);
            if !kept {
                order.remove(&slot.queued);
                *bytes -= slot.bytes;
                dropped += 1;
            }
            kept
        });
        dropped
    }

    #[cfg(test)]
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values().map(|slot| &slot.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn floors_add_up_to_the_budget() {
        let sum: usize = Cache::ALL.iter().map(|c| c.floor_percent()).sum();
        assert_eq!(sum, 100);
        let budget = MemoryBudget::new(100 << 20);
        let floors: usize = Cache::ALL.iter().map(|&c| budget.floor(c)).sum();
        assert!(floors <= budget.limit());
    }

    #[test]
    fn only_a_cache_over_its_floor_sheds_and_only_over_budget() {
        let budget = MemoryBudget::new(1000);
        budget.set(Cache::Symbols, 100);
        assert!(!budget.must_shed(Cache::Symbols), "under budget");
        budget.set(Cache::UnwindObjects, 950);
        // 1050 in all: the borrower gives back, the other keeps its floor.
        assert!(budget.must_shed(Cache::UnwindObjects));
        assert!(!budget.must_shed(Cache::Symbols));
        budget.set(Cache::UnwindObjects, 900);
        assert!(!budget.must_shed(Cache::UnwindObjects));
        budget.settle();
        let stats = budget.stats();
        assert_eq!(stats.total_bytes(), 1000);
        assert_eq!(stats.peak, 1000);
        budget.evicted(Cache::Symbols, 3, true);
        budget.evicted(Cache::Symbols, 2, false);
        assert_eq!(budget.stats().evictions[0], 5);
        assert_eq!(budget.stats().total_evictions(), 5);
    }

    #[test]
    fn lru_counts_bytes_and_drops_the_least_recently_used() {
        let mut lru: Lru<u32, &str> = Lru::new();
        let o = Lru::<u32, &str>::entry_overhead();
        assert!(o > size_of::<u32>());
        lru.insert(1, "a", 10);
        lru.insert(2, "b", 20);
        lru.insert(3, "c", 30);
        assert_eq!(lru.bytes(), 60 + 3 * o);
        // 1 used again: 2 is now the oldest.
        assert_eq!(lru.get(&1).copied(), Some("a"));
        assert_eq!(lru.pop_lru(), Some((2, "b")));
        assert_eq!(lru.bytes(), 40 + 2 * o);
        // Peeking does not count as a use.
        assert_eq!(lru.peek(&3).copied(), Some("c"));
        assert_eq!(lru.pop_lru(), Some((3, "c")));
        lru.recharge(&1, 100);
        assert_eq!(lru.bytes(), 100 + o);
        lru.insert(1, "a2", 5);
        assert_eq!((lru.len(), lru.bytes()), (1, 5 + o));
        lru.insert(4, "d", 0);
        assert_eq!(*lru.get_or_insert_with(5, || ("e", 7)), "e");
        assert_eq!(*lru.get_or_insert_with(4, || ("x", 7)), "d");
        // 4 was used last: 1, then 5, go first.
        assert_eq!(lru.pop_lru().map(|(k, _)| k), Some(1));
        assert_eq!(lru.bytes(), 7 + 2 * o);
        assert_eq!(lru.pop_lru_where(|k, _| *k == 4), Some((4, "d")));
        assert_eq!(lru.pop_lru(), Some((5, "e")));
        lru.insert(4, "d", 0);
        assert_eq!(lru.retain(|_, _| false), 1);
        assert!(lru.is_empty());
        assert_eq!(lru.bytes(), 0);
        assert!(lru.pop_lru().is_none());
    }

    /// A cache that sheds whenever the budget says so.
    fn shedding_insert(
        lru: &mut Lru<u64, u64>,
        budget: &MemoryBudget,
        cache: Cache,
        key: u64,
        bytes: usize,
    ) {
        lru.insert(key, key, bytes);
        budget.set(cache, lru.bytes());
        while budget.must_shed(cache) && lru.pop_lru().is_some() {
            budget.set(cache, lru.bytes());
            budget.evicted(cache, 1, true);
        }
    }

    proptest! {
        /// Whatever is inserted and used, two caches of one owner that
        /// shed as they insert never hold more than the budget between
        /// calls (entries are at most a floor's size), and what each holds
        /// is its most recently used entries.
        #[test]
        fn never_over_budget(ops in prop::collection::vec((0u64..64, 1usize..400, any::<bool>(), any::<bool>()), 1..400)) {
            let budget = MemoryBudget::new(20_000);
            let mut a: Lru<u64, u64> = Lru::new();
            let mut b: Lru<u64, u64> = Lru::new();
            let mut last_use: HashMap<(bool, u64), usize> = HashMap::new();
            for (step, &(key, bytes, which, read)) in ops.iter().enumerate() {
                let (lru, cache) = if which { (&mut a, Cache::Symbols) } else { (&mut b, Cache::UnwindObjects) };
                if read && lru.get(&key).is_some() {
                    last_use.insert((which, key), step);
                } else {
                    shedding_insert(lru, &budget, cache, key, bytes);
                    last_use.insert((which, key), step);
                    // The other cache gives back what it borrowed.
                    let (other, other_cache) = if which { (&mut b, Cache::UnwindObjects) } else { (&mut a, Cache::Symbols) };
                    while budget.must_shed(other_cache) && other.pop_lru().is_some() {
                        budget.set(other_cache, other.bytes());
                    }
                }
                prop_assert!(budget.total() <= budget.limit(), "{} over {}", budget.total(), budget.limit());
                // Evicted entries were used before every kept one.
                for (lru, which) in [(&a, true), (&b, false)] {
                    let kept_oldest = last_use.iter().filter(|((w, k), _)| *w == which && lru.peek(k).is_some()).map(|(_, &s)| s).min();
                    let dropped_newest = last_use.iter().filter(|((w, k), _)| *w == which && lru.peek(k).is_none()).map(|(_, &s)| s).max();
                    if let (Some(kept), Some(dropped)) = (kept_oldest, dropped_newest) {
                        prop_assert!(dropped < kept, "dropped an entry used at {dropped}, kept one used at {kept}");
                    }
                }
            }
        }
    }
}
