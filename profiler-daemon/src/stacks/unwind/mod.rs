//! DWARF (CFI) unwinding of user stacks copied by the kernel, for code built
//! without frame pointers.
//!
//! For each sample of a process in "dwarf" mode the kernel sends the user
//! registers (ip, sp, bp) and a copy of the stack from sp upwards. The
//! [`Unwinder`] walks that copy with framehop, using the `.eh_frame` /
//! `.eh_frame_hdr` sections (or `.debug_frame` when an object has no
//! `.eh_frame`) of the objects the process maps.
//!
//! Caching, in two levels, both counted in bytes against the memory budget
//! (budget.rs) and dropped least recently used first:
//! - per object (keyed by build ID, else by the opened file's identity): the
//!   section bytes and load segments, read once and shared by all processes
//!   through `Arc`s;
//! - per process (keyed by tgid and checked against the mapping set): a
//!   framehop unwinder whose modules are added lazily, the first time a walk
//!   reaches an address in them, and framehop's rule cache.
//!
//! Walks themselves are remembered (walk_memo.rs): a thread that waits at
//! the same place again is answered by checking the words its last walk
//! read. The memo draws on the budget too.
//!
//! Only x86_64 ELF objects are unwound.

use std::fs::File;
use std::io;
use std::mem::size_of;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Instant;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{FrameAddress, Module, ModuleSectionInfo, Unwinder as _};
use object::LittleEndian;
use object::elf::{FileHeader64, ProgramHeader64, SectionHeader64};
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _};
use profiler_common::{WalkHint, WalkHintKey};
use tracing::{debug, trace};

use crate::bpf::probes::TopUpdate;
use crate::config::limits::{DEFAULT_MAX_WALKS, DEFAULT_MEMORY_BYTES};
use crate::config::stack_switches::StackSwitches;
use crate::procs::objects::{MappedObject, ObjectFile};
use crate::procs::process::PAGE_SIZE;
use crate::procs::process::ProcessInfo;
use crate::stacks::budget::{Cache, Lru, MemoryBudget};
use crate::stacks::stack_tops::{StackTops, TopStats};
use crate::stacks::walk_memo::{MemoStats, Read, WalkMemo, WalkStart, read_word};

/// Most frames in one unwound stack, the limit of the kernel's stacks.
pub const MAX_FRAMES: usize = profiler_common::MAX_STACK_DEPTH;
/// Bound of cached per-process unwinders, besides the memory budget.
pub const DEFAULT_MAX_PROCESSES: usize = 512;
/// Threads whose stack top is sent to the kernel per window (its table
/// holds STACK_TOPS_ENTRIES).
const DEFAULT_MAX_THREAD_TOPS: usize = 65_536;
/// Bound of cached objects (including failed ones), besides the memory
/// budget.
pub const DEFAULT_MAX_OBJECTS: usize = 1024;
/// The smallest copy the kernel makes whole (the off-CPU form; CPU
/// samples, allocations and waits copy STACK_COPY_BYTES): a walk cut by
/// the end of a shorter copy was cut at a learned top, not by its depth.
const MIN_USUAL_COPY: usize = profiler_common::OFFCPU_STACK_BYTES;
/// framehop's rule cache of a process: 509 slots of 24 bytes.
const RULE_CACHE_BYTES: usize = 509 * 24;
/// framehop's DWARF evaluation context of a process (its stacks of rules
/// grow with the deepest CFI program run; a few hundred bytes is typical).
const UNWIND_CONTEXT_BYTES: usize = 1024;
/// framehop's record of one module added to a process unwinder, besides
/// its name (the mapping's path) and, for an object without
/// `.eh_frame_hdr`, the index it builds.
const MODULE_BYTES: usize = 256;
mod tables;

use tables::*;

/// Counters of the unwinder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Stacks unwound.
    pub unwinds: u64,
    /// Stacks whose walk stopped before the outermost frame.
    pub truncated: u64,
    /// Frames of JIT code stepped over by their frame pointers.
    pub jit_frames: u64,
    /// Leaves in a file's code without unwind information (V8's builtins
    /// inside Node's text) whose caller was found by the frame pointer:
    /// the rule for such code, a return address on top of the stack, gave
    /// an address in no code.
    pub leaves_by_frame_pointer: u64,
    /// Objects whose unwind information was read from their file.
    pub objects_loaded: u64,
    /// Object loads that failed (not ELF, no unwind sections, I/O, or
    /// tables over half the memory budget).
    pub object_load_failures: u64,
    /// Of those, objects whose tables were over half the budget.
    pub objects_too_large: u64,
    /// Cached objects and process unwinders dropped to stay within the
    /// memory budget or their entry bounds.
    pub evictions: u64,
    /// Objects in the cache now (including remembered failures).
    pub cached_objects: usize,
    /// Bytes held by the object cache now (sections and bookkeeping).
    pub cached_bytes: usize,
    /// Process unwinders cached now.
    pub cached_processes: usize,
    /// Walks answered by the walk memo.
    pub memo: MemoStats,
    /// Stack tops learned for the kernel's copies.
    pub tops: TopStats,
}

/// A stack unwound from a sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwoundStack {
    /// Leaf first: the sampled ip, then return addresses.
    pub frames: Arc<[u64]>,
    /// The walk stopped before the outermost frame: no unwind information
    /// for an address, a read outside the copied stack, an unwinding error,
    /// or [`MAX_FRAMES`] reached.
    pub truncated: bool,
}

/// Identity of one executable mapping: a process's unwinder is rebuilt when
/// any of these change (exec, dlopen, pid reuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MappingKey {
    start: u64,
    limit: u64,
    file_offset: u64,
    object: u64,
}

impl MappingKey {
    fn of(mapped: &MappedObject) -> Self {
        Self {
            start: mapped.mapping.start,
            limit: mapped.mapping.limit,
            file_offset: mapped.mapping.file_offset,
            object: mapped.object.as_ref().map_or(0, |o| o.id()),
        }
    }
}

#[derive(Debug)]
enum ModuleState {
    /// Not needed by a walk yet.
    Pending,
    /// Holds the object so that the object cache sees it in use (its
    /// section bytes live on in framehop's module anyway).
    Loaded(#[allow(dead_code)] Arc<ObjectUnwindInfo>),
    /// No unwind information: walks stop here.
    Unavailable,
}

/// The framehop unwinder of one process (one mapping set).
struct ProcessUnwinder {
    /// Tells this unwinder's remembered walks from those of one it replaced.
    id: u64,
    /// The process snapshot last found to have these mappings: the same
    /// snapshot needs no comparison.
    checked: Instant,
    /// Sorted by start, parallel to the process's mappings and to `modules`.
    keys: Vec<MappingKey>,
    modules: Vec<ModuleState>,
    unwinder: UnwinderX86_64<SectionData>,
    /// Per process rather than shared: framehop tells unwinders apart in a
    /// shared cache by a global 16-bit generation that wraps, which could
    /// hand a rule of another process's module set to this one.
    cache: CacheX86_64,
    last_used: u64,
    /// Heap bytes of the modules added to `unwinder`.
    module_bytes: usize,
}

impl ProcessUnwinder {
    fn new(process: &ProcessInfo, id: u64, tick: u64) -> Self {
        let keys: Vec<MappingKey> = process.mappings().iter().map(MappingKey::of).collect();
        let modules = keys.iter().map(|_| ModuleState::Pending).collect();
        Self {
            id,
            checked: process.snapshot_at(),
            keys,
            modules,
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            last_used: tick,
            module_bytes: 0,
        }
    }

    /// Heap bytes it holds (an estimate: framehop's caches at their size,
    /// its modules as added, the mapping lists).
    fn heap_bytes(&self) -> usize {
        size_of::<Self>()
            + RULE_CACHE_BYTES
            + UNWIND_CONTEXT_BYTES
            + self.keys.capacity() * size_of::<MappingKey>()
            + self.modules.capacity() * size_of::<ModuleState>()
            + self.module_bytes
    }

    fn matches(&mut self, process: &ProcessInfo) -> bool {
        if self.checked == process.snapshot_at() {
            return true;
        }
        let mappings = process.mappings();
        let same = self.keys.len() == mappings.len()
            && self
                .keys
                .iter()
                .zip(mappings)
                .all(|(key, m)| *key == MappingKey::of(m));
        if same {
            self.checked = process.snapshot_at();
        }
        same
    }

    /// Whether framehop has unwind information for `addr`; adds the module
    /// of its mapping on first use.
    fn ensure_module(
        &mut self,
        addr: u64,
        process: &ProcessInfo,
        objects: &mut UnwindTableCache,
        stats: &mut UnwindStats,
        budget: &MemoryBudget,
    ) -> bool {
        let Some(idx) = self
            .keys
            .partition_point(|k| k.start <= addr)
            .checked_sub(1)
        else {
            return false;
        };
        let (Some(key), Some(state)) = (self.keys.get(idx), self.modules.get_mut(idx)) else {
            return false;
        };
        if addr >= key.limit {
            return false;
        }
        match state {
            ModuleState::Loaded(_) => return true,
            ModuleState::Unavailable => return false,
            ModuleState::Pending => {}
        }
        *state = ModuleState::Unavailable;
        // `keys` matched the process's mappings when this walk began.
        let Some(mapped) = process.mappings().get(idx) else {
            return false;
        };
        let Some(object) = &mapped.object else {
            return false;
        };
        let mapping = &mapped.mapping;
        let Some(info) = objects.get_or_load(object, &mapping.path, stats, budget) else {
            return false;
        };
        let Some(bias) = load_bias(&info.segments, mapping.start, mapping.file_offset) else {
            debug!(path = mapping.path, "no load segment covers the mapping");
            return false;
        };
        // Without `.eh_frame_hdr` framehop indexes the FDEs itself: eight
        // bytes per FDE, which take some 32 bytes or more of `.eh_frame`.
        let has_hdr = info
            .section(b".eh_frame_hdr")
            .is_some_and(|s| s.data.is_some());
        let index_bytes = match has_hdr {
            true => 0,
            false => info.bytes / 4,
        };
        self.module_bytes += MODULE_BYTES + mapping.path.len() + index_bytes;
        let module = Module::new(
            mapping.path.clone(),
            mapping.start..mapping.limit,
            bias.wrapping_add(info.base_svma),
            Sections(&info),
        );
        self.unwinder.add_module(module);
        *state = ModuleState::Loaded(info);
        true
    }
}

/// The frames of a remembered walk that the kernel matched, as a record
/// carries them.
#[derive(Clone, Copy, Debug)]
pub struct Matched<'a> {
    /// The walk's id in the hint the kernel matched.
    pub id: u64,
    /// The walk's frames after the instruction pointer; `None` when the
    /// record's frame count is beyond the hint's bound (never sent).
    pub frames: Option<&'a [u64]>,
    /// The walk stopped before the root.
    pub truncated: bool,
}

/// Slots of [`HintedFrames`] (a power of two).
const HINTED_SLOTS: usize = 1024;

/// The frames of walks lately hinted to the kernel, in slots by id: a
/// brief record of one of them shares its frames instead of allocating a
/// copy. Bounded; a newer walk takes its slot.
struct HintedFrames {
    slots: Box<[Option<HintedWalk>]>,
}

/// A hinted walk's id and frames.
type HintedWalk = (u64, Arc<[u64]>);

impl Default for HintedFrames {
    fn default() -> Self {
        Self {
            slots: vec![None; HINTED_SLOTS].into_boxed_slice(),
        }
    }
}

impl HintedFrames {
    fn insert(&mut self, id: u64, frames: &Arc<[u64]>) {
        self.slots[id as usize & (HINTED_SLOTS - 1)] = Some((id, frames.clone()));
    }

    /// The frames `ip` then `rest` of a record that matched the hint of
    /// walk `id`. A hint's frames are those of its walk, and ids are never
    /// reused, so the frames remembered under `id` are the record's: they
    /// are shared without reading the record's copy of them (in ring
    /// memory another CPU wrote, cold in this one's cache). Otherwise the
    /// record's frames are taken.
    fn get(&mut self, id: u64, ip: u64, rest: &[u64]) -> Arc<[u64]> {
        let slot = &mut self.slots[id as usize & (HINTED_SLOTS - 1)];
        if let Some((known, frames)) = slot
            && *known == id
            && frames.first() == Some(&ip)
        {
            return frames.clone();
        }
        let frames: Arc<[u64]> = std::iter::once(ip).chain(rest.iter().copied()).collect();
        *slot = Some((id, frames.clone()));
        frames
    }
}

/// Unwinds user stacks with DWARF CFI; see the module documentation.
pub struct Unwinder {
    processes: Lru<u32, ProcessUnwinder>,
    max_processes: usize,
    budget: MemoryBudget,
    objects: UnwindTableCache,
    memo: WalkMemo,
    /// Where threads' stacks end, for the kernel's copies.
    tops: StackTops,
    /// Whether remembered walks are handed to the kernel as hints.
    give_hints: bool,
    /// Whether stack tops are learned from complete walks.
    learn_tops: bool,
    /// Whether threads whose walks run past their copies are marked deep.
    mark_deep: bool,
    /// The frames of walks lately given to the kernel as hints, by id.
    hinted: HintedFrames,
    /// Id of the last process unwinder made.
    next_id: u64,
    /// The memo's forgotten walks already counted as evictions.
    memo_forgotten: u64,
    /// Logical clock for LRU order and "used since the last release".
    tick: u64,
    last_release: u64,
    stats: UnwindStats,
}

impl Default for Unwinder {
    fn default() -> Self {
        Self::new()
    }
}

impl Unwinder {
    /// An unwinder with the default bounds and budget.
    pub fn new() -> Self {
        Self::with_budget(MemoryBudget::new(DEFAULT_MEMORY_BYTES as usize))
    }

    /// An unwinder whose caches draw on `budget`.
    pub fn with_budget(budget: MemoryBudget) -> Self {
        Self::with_limits(DEFAULT_MAX_PROCESSES, DEFAULT_MAX_OBJECTS, budget)
    }

    /// An unwinder caching at most `max_processes` process unwinders and
    /// `max_objects` objects, within `budget`.
    pub fn with_limits(max_processes: usize, max_objects: usize, budget: MemoryBudget) -> Self {
        Self {
            processes: Lru::new(),
            max_processes: max_processes.max(1),
            objects: UnwindTableCache {
                entries: Lru::new(),
                max_entries: max_objects.max(1),
                max_object_bytes: budget.limit() / 2,
            },
            budget,
            memo: WalkMemo::new(DEFAULT_MAX_WALKS),
            tops: StackTops::new(DEFAULT_MAX_THREAD_TOPS),
            give_hints: true,
            learn_tops: true,
            mark_deep: true,
            hinted: HintedFrames::default(),
            next_id: 0,
            memo_forgotten: 0,
            tick: 0,
            last_release: 0,
            stats: UnwindStats::default(),
        }
    }

    /// Unwinds one sample of `process`. `ip`, `sp`, `bp` are the user
    /// registers at the sample; `stack` is the user stack memory copied from
    /// `sp` upwards. Frames are leaf first: `ip`, then return addresses (as
    /// the kernel's frame-pointer stacks are).
    #[cfg(test)]
    pub fn unwind(
        &mut self,
        process: &ProcessInfo,
        ip: u64,
        sp: u64,
        bp: u64,
        stack: &[u8],
    ) -> UnwoundStack {
        self.unwind_hinted(process, 0, ip, sp, bp, stack).0
    }

    /// The stack of an event whose stack the kernel found to match one of
    /// the walk hints: the walk's frames after `ip`, which the record
    /// carries. The kernel checked every word the walk read in the
    /// thread's memory: the walk applies as it is, whatever the daemon
    /// remembers now, and no process metadata is needed.
    pub fn matched(
        &mut self,
        ip: u64,
        Matched {
            id,
            frames,
            truncated,
        }: Matched<'_>,
    ) -> UnwoundStack {
        self.tick += 1;
        self.stats.unwinds += 1;
        self.memo.note_matched(frames.is_some());
        let (frames, truncated) = match frames {
            // The frames of a walk hinted lately are shared, not copied
            // from the record: most brief records repeat a few walks.
            Some(rest) => (self.hinted.get(id, ip, rest), truncated),
            None => (Arc::from([ip]), true),
        };
        if truncated {
            self.stats.truncated += 1;
        }
        UnwoundStack { frames, truncated }
    }

    /// As [`Self::unwind`]; also returns a hint for the kernel: of a walk
    /// newly remembered, or of a remembered walk found by reading the copy
    /// (the kernel did not hold its hint). A walk of thread `tid` (0:
    /// unknown) also tells where its stack ends ([`Self::take_stack_tops`]).
    pub fn unwind_hinted(
        &mut self,
        process: &ProcessInfo,
        tid: u32,
        ip: u64,
        sp: u64,
        bp: u64,
        stack: &[u8],
    ) -> (UnwoundStack, Option<(WalkHintKey, WalkHint)>) {
        let walked = self.walk(process, tid, ip, sp, bp, stack);
        self.enforce_budget();
        walked
    }

    /// [`Self::unwind_hinted`] before the budget is enforced.
    fn walk(
        &mut self,
        process: &ProcessInfo,
        tid: u32,
        ip: u64,
        sp: u64,
        bp: u64,
        stack: &[u8],
    ) -> (UnwoundStack, Option<(WalkHintKey, WalkHint)>) {
        self.tick += 1;
        self.stats.unwinds += 1;
        let tick = self.tick;
        let Self {
            processes,
            max_processes,
            objects,
            memo,
            tops,
            stats,
            next_id,
            give_hints,
            learn_tops,
            mark_deep,
            hinted,
            budget,
            ..
        } = self;
        let entry = process_unwinder(
            processes,
            *max_processes,
            process,
            (tick, next_id),
            stats,
            budget,
        );
        let start = WalkStart {
            unwinder: entry.id,
            ip,
            sp,
            bp,
        };
        if let Some(found) = memo.lookup(&start, stack) {
            if found.truncated {
                stats.truncated += 1;
            }
            let unwound = UnwoundStack {
                frames: found.frames,
                truncated: found.truncated,
            };
            let hint = found.hint.filter(|_| *give_hints);
            if let Some((_, h)) = &hint {
                hinted.insert(h.id, &unwound.frames);
            }
            return (unwound, hint);
        }

        let mut reads: Vec<Read> = Vec::with_capacity(64);
        let mut read_stack = |addr: u64| {
            let word = read_word(stack, sp, addr);
            reads.push((addr, word));
            word.ok_or(())
        };
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut frames = Vec::with_capacity(32);
        frames.push(ip);
        let mut address = FrameAddress::from_instruction_pointer(ip);
        let truncated = loop {
            let lookup = address.address_for_lookup();
            // framehop would fall back to the frame pointer for an address
            // outside its modules; without CFI that guess is often wrong,
            // so the walk stops there.
            if !entry.ensure_module(lookup, process, objects, stats, budget) {
                // JIT code (anonymous executable memory) has no CFI; the
                // runtimes that write perf maps for it keep frame pointers
                // there (V8, CPython's perf trampolines), so its frames
                // are stepped over by them.
                if is_jit_code(process, lookup)
                    && let Some((return_address, next)) =
                        frame_pointer_step(regs.sp(), regs.bp(), &mut read_stack).or_else(|| {
                            // Not at the leaf: its stack pointer is only
                            // known to sit at a call there.
                            (frames.len() > 1)
                                .then(|| fresh_frame_step(regs.sp(), &mut read_stack))
                                .flatten()
                                .filter(|&(ret, _)| is_file_code(process, ret.wrapping_sub(1)))
                        })
                {
                    if frames.len() >= MAX_FRAMES {
                        break true;
                    }
                    stats.jit_frames += 1;
                    frames.push(return_address);
                    regs = next;
                    match FrameAddress::from_return_address(return_address) {
                        Some(next) => {
                            address = next;
                            continue;
                        }
                        None => break false,
                    }
                }
                trace!(
                    tgid = process.tgid,
                    addr = lookup,
                    sp = regs.sp(),
                    bp = regs.bp(),
                    "no unwind information"
                );
                break true;
            }
            let leaf_regs = (frames.len() == 1).then_some(regs);
            match entry
                .unwinder
                .unwind_frame(address, &mut regs, &mut entry.cache, &mut read_stack)
            {
                // The outermost frame: no return address (_start, clone).
                Ok(None) | Ok(Some(0)) => break false,
                Ok(Some(mut return_address)) => {
                    if frames.len() >= MAX_FRAMES {
                        break true;
                    }
                    if let Some(leaf) = leaf_regs
                        && let Some((by_fp, next)) = leaf_caller_by_frame_pointer(
                            process,
                            &leaf,
                            return_address,
                            &mut read_stack,
                        )
                    {
                        stats.leaves_by_frame_pointer += 1;
                        return_address = by_fp;
                        regs = next;
                    }
                    frames.push(return_address);
                    match FrameAddress::from_return_address(return_address) {
                        Some(next) => address = next,
                        None => break false,
                    }
                }
                Err(err) => {
                    trace!(tgid = process.tgid, addr = lookup, %err, "unwinding stopped");
                    break true;
                }
            }
        };
        if truncated {
            stats.truncated += 1;
        }
        // Modules added in the walk.
        let bytes = entry.heap_bytes();
        processes.recharge(&process.tgid, bytes);
        let copy_end = sp.saturating_add(stack.len() as u64);
        match (truncated, reads.last()) {
            // A complete walk: nothing at or above its highest read is
            // needed by any later walk of this thread.
            (false, Some(_)) if *learn_tops => {
                if let Some(top) = reads.iter().map(|&(addr, _)| addr.saturating_add(8)).max() {
                    tops.learned(tid, top);
                }
            }
            // Stopped by the end of the copy: the copy may have been cut
            // at a top learned too low, or the stack is deeper than the
            // usual copy (the thread is marked deep, see stack_tops.rs).
            (true, Some(&(addr, None))) if addr >= copy_end => {
                tops.cut_short(tid);
                if *mark_deep && stack.len() >= MIN_USUAL_COPY {
                    tops.cut_at_copy_end(tid, stack.len());
                }
            }
            _ => {}
        }
        let frames: Arc<[u64]> = Arc::from(frames);
        let hint = memo.remember(process.tgid, start, &reads, frames.clone(), truncated);
        (
            UnwoundStack { frames, truncated },
            hint.filter(|_| *give_hints),
        )
    }

    /// Turns the stack optimizations on or off (`[debug]` and
    /// `[limits] walk_memo_entries` in the config): a memo of at most
    /// `memo_walks` walks per generation (0: none), hints for the kernel,
    /// stack tops learned from walks. Off, the answers must be the same.
    /// And threads whose walks ran past their copies marked deep
    /// (`long_records`), which makes their stacks whole.
    pub fn set_stack_options(&mut self, memo_walks: usize, switches: &StackSwitches) {
        self.memo = WalkMemo::new(memo_walks);
        self.memo_forgotten = 0;
        // The new memo numbers its walks afresh.
        self.hinted = HintedFrames::default();
        self.give_hints = switches.walk_hints;
        self.learn_tops = switches.stack_tops;
        self.mark_deep = switches.long_records;
    }

    /// What the kernel should change in its table of stack tops (see
    /// stack_tops.rs); each update is given once.
    pub fn take_stack_tops(&mut self) -> Vec<TopUpdate> {
        self.tops.take()
    }

    /// Hints the kernel should drop: their walks are on the way to being
    /// forgotten (see walk_memo.rs).
    pub fn take_retired_hints(&mut self) -> Vec<WalkHintKey> {
        self.memo.take_retired()
    }

    /// Drops process unwinders unused since the last call and objects that
    /// no process snapshot maps any more. Call at each window end, after the
    /// process table's prune.
    pub fn release_unused(&mut self) {
        self.tops.new_window();
        let since = self.last_release;
        self.processes.retain(|_, e| e.last_used > since);
        self.objects.release_unused();
        self.last_release = self.tick;
        self.publish();
    }

    /// Publishes the caches' bytes to the budget, and the walks the memo
    /// forgot at its entry bound as evictions.
    fn publish(&mut self) {
        self.budget
            .set(Cache::UnwindObjects, self.objects.entries.bytes());
        self.budget.set(Cache::Unwinders, self.processes.bytes());
        self.budget.set(Cache::WalkMemo, self.memo.bytes());
        let forgotten = self.memo.stats().forgotten;
        self.budget
            .evicted(Cache::WalkMemo, forgotten - self.memo_forgotten, false);
        self.memo_forgotten = forgotten;
    }

    /// Gives back, least recently used first, what the budget asks of the
    /// unwinder's caches: those over their floor while the budget is
    /// full, the one furthest over first. An object that a process
    /// unwinder holds would stay in memory, so the least recently used
    /// process unwinder goes before it. Runs after every walk; the
    /// session calls it too, so that room borrowed while the symbolizer
    /// grew is returned.
    pub fn enforce_budget(&mut self) {
        loop {
            self.publish();
            let over = [Cache::UnwindObjects, Cache::Unwinders, Cache::WalkMemo]
                .into_iter()
                .filter(|&cache| self.budget.must_shed(cache))
                .max_by_key(|&cache| self.budget.bytes(cache) - self.budget.floor(cache));
            let Some(mut cache) = over else {
                return;
            };
            let dropped = match cache {
                Cache::UnwindObjects if self.objects.evict_one().is_some() => true,
                Cache::UnwindObjects | Cache::Unwinders => {
                    cache = Cache::Unwinders;
                    self.processes.pop_lru().is_some()
                }
                _ => match self.memo.shed() {
                    Some(walks) => {
                        self.budget.evicted(cache, walks as u64, true);
                        true
                    }
                    None => false,
                },
            };
            if !dropped {
                return;
            }
            if cache != Cache::WalkMemo {
                self.stats.evictions += 1;
                self.budget.evicted(cache, 1, true);
            }
        }
    }

    /// Counters, and the cache sizes now.
    pub fn stats(&self) -> UnwindStats {
        UnwindStats {
            cached_objects: self.objects.entries.len(),
            cached_bytes: self.objects.entries.bytes(),
            cached_processes: self.processes.len(),
            memo: self.memo.stats(),
            tops: self.tops.stats(),
            ..self.stats
        }
    }
}

/// The cached unwinder of `process`, rebuilt if its mappings changed.
fn process_unwinder<'a>(
    processes: &'a mut Lru<u32, ProcessUnwinder>,
    max_processes: usize,
    process: &ProcessInfo,
    (tick, next_id): (u64, &mut u64),
    stats: &mut UnwindStats,
    budget: &MemoryBudget,
) -> &'a mut ProcessUnwinder {
    let tgid = process.tgid;
    let fresh = processes.get(&tgid).is_some_and(|e| e.matches(process));
    if !fresh {
        processes.remove(&tgid);
        while processes.len() >= max_processes && processes.pop_lru().is_some() {
            stats.evictions += 1;
            budget.evicted(Cache::Unwinders, 1, false);
        }
    }
    let entry = processes.get_or_insert_with(tgid, || {
        *next_id += 1;
        let made = ProcessUnwinder::new(process, *next_id, tick);
        let bytes = made.heap_bytes();
        (made, bytes)
    });
    entry.last_used = tick;
    entry
}

// The tests capture their own registers with x86_64 assembly.
/// Whether `addr` may be JIT code: in anonymous executable memory of the
/// process (no file, so no unwind information), or in no mapping of its
/// snapshot at all (runtimes map JIT code as they go: CPython its perf
/// trampolines at a function's first call, after the snapshot).
fn is_jit_code(process: &ProcessInfo, addr: u64) -> bool {
    process
        .find(addr)
        .is_none_or(|m| m.object.is_none() && m.mapping.path == crate::procs::process::ANON_NAME)
}

/// The caller of a leaf by its frame pointer, where the module's rule gave
/// `return_address` in no code and the frame pointer gives one in code.
/// framehop takes code of a file that no unwind entry covers for a leaf
/// without a frame (a return address on top of the stack); V8's builtins,
/// which lie in Node's text without unwind entries, mostly set up a frame
/// (`push rbp; mov rbp, rsp`), so that word is one of their locals (0x3ff,
/// a heap pointer) and their caller would follow an `<unknown>` frame.
fn leaf_caller_by_frame_pointer(
    process: &ProcessInfo,
    leaf: &UnwindRegsX86_64,
    return_address: u64,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<(u64, UnwindRegsX86_64)> {
    let in_code = |addr: u64| process.find(addr.wrapping_sub(1)).is_some();
    if in_code(return_address) {
        return None;
    }
    frame_pointer_step(leaf.sp(), leaf.bp(), read).filter(|&(by_fp, _)| in_code(by_fp))
}

/// Whether `addr` lies in a file's code (which has unwind information).
fn is_file_code(process: &ProcessInfo, addr: u64) -> bool {
    process.find(addr).is_some_and(|m| m.object.is_some())
}

/// The step out of a frame that is only its pushed frame pointer under
/// its return address (`push rbp; mov rbp, rsp; call ...`: CPython's
/// perf trampolines), for when `bp` no longer points at it: its callee
/// was built without frame pointers and used the register, and its CFI
/// did not give it back. Taken only where the return address lies in a
/// file's code, whose CFI then goes on.
fn fresh_frame_step(
    sp: u64,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<(u64, UnwindRegsX86_64)> {
    let saved_bp = read(sp).ok()?;
    let return_address = read(sp.checked_add(8)?).ok()?;
    (return_address != 0).then(|| {
        (
            return_address,
            UnwindRegsX86_64::new(return_address, sp + 16, saved_bp),
        )
    })
}

/// One frame-pointer step from a frame whose `bp` holds its saved frame
/// pointer (below the return address): the return address and the
/// caller's registers. None where `bp` is not a frame of this stack (below
/// `sp`, unaligned, outside the copy) or the return address is zero. The
/// saved frame pointer is the caller's `bp`, whatever it is: a caller
/// built without frame pointers (CPython's evaluator, which calls its
/// perf trampolines) is unwound by its CFI, which does not need it.
fn frame_pointer_step(
    sp: u64,
    bp: u64,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<(u64, UnwindRegsX86_64)> {
    if bp < sp || !bp.is_multiple_of(8) {
        return None;
    }
    let saved_bp = read(bp).ok()?;
    let return_address = read(bp.checked_add(8)?).ok()?;
    if return_address == 0 {
        return None;
    }
    Some((
        return_address,
        UnwindRegsX86_64::new(return_address, bp + 16, saved_bp),
    ))
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// A stack read from (address, word) pairs; other addresses fail.
    fn stack_of(words: &[(u64, u64)]) -> impl FnMut(u64) -> Result<u64, ()> + '_ {
        |addr| {
            words
                .iter()
                .find(|&&(a, _)| a == addr)
                .map(|&(_, w)| w)
                .ok_or(())
        }
    }

    #[test]
    fn jit_frames_are_stepped_by_their_frame_pointers() {
        // A frame at bp 0x1000 (saved bp 0x1040, return address 0x5000),
        // its caller's at 0x1040 (saved 0, the end).
        let words = [
            (0x1000, 0x1040),
            (0x1008, 0x5000),
            (0x1040, 0),
            (0x1048, 0x6000),
        ];
        let mut read = stack_of(&words);
        let (ret, next) = frame_pointer_step(0xff0, 0x1000, &mut read).expect("a step");
        assert_eq!((ret, next.sp(), next.bp()), (0x5000, 0x1010, 0x1040));
        let (ret, next) = frame_pointer_step(next.sp(), next.bp(), &mut read).expect("a step");
        assert_eq!((ret, next.bp()), (0x6000, 0));
        // Not up the stack, unaligned, or unreadable: no step.
        assert!(frame_pointer_step(0x1010, 0x1000, &mut read).is_none());
        assert!(frame_pointer_step(0xff0, 0x1004, &mut read).is_none());
        assert!(frame_pointer_step(0xff0, 0x2000, &mut read).is_none());
        // A caller without frame pointers: its bp is whatever it held.
        let mut any = |addr: u64| Ok(if addr == 0x1000 { 7 } else { 0x5000 });
        let (ret, next) = frame_pointer_step(0xff0, 0x1000, &mut any).expect("a step");
        assert_eq!((ret, next.bp()), (0x5000, 7));
    }
    use crate::procs::process::ProcessTable;
    use crate::stacks::symbolize::Symbolizer;
    use std::time::Instant;

    #[test]
    fn matched_frames_are_those_of_the_record_or_of_the_same_walk() {
        let mut unwinder = Unwinder::new();
        let matched = |id, frames| Matched {
            id,
            frames: Some(frames),
            truncated: false,
        };
        let first = unwinder.matched(0x10, matched(7, &[0x20, 0x30]));
        assert_eq!(&*first.frames, &[0x10, 0x20, 0x30]);
        // The same walk again shares its frames.
        let again = unwinder.matched(0x10, matched(7, &[0x20, 0x30]));
        assert!(Arc::ptr_eq(&first.frames, &again.frames));
        // Another id in its slot gives the record's frames.
        let slot_mate = unwinder.matched(0x11, matched(7 + HINTED_SLOTS as u64, &[0x50]));
        assert_eq!(&*slot_mate.frames, &[0x11, 0x50]);
        // Frames that could not be read: the ip alone, truncated.
        let lost = unwinder.matched(
            0x12,
            Matched {
                id: 9,
                frames: None,
                truncated: false,
            },
        );
        assert_eq!((&*lost.frames, lost.truncated), (&[0x12][..], true));
        let stats = unwinder.stats();
        assert_eq!(
            (
                stats.memo.matched_in_kernel,
                stats.memo.matched_but_forgotten
            ),
            (4, 1)
        );
    }

    const COPY_BYTES: u64 = 16 * 1024;

    /// Registers and stack of a thread, as the kernel would send them.
    struct Sample {
        ip: u64,
        sp: u64,
        bp: u64,
        stack: Vec<u8>,
        /// The copy reaches the top of the thread's stack mapping.
        whole_stack: bool,
    }

    /// End of the mapping that contains `addr`, from /proc/self/maps.
    fn mapping_end(addr: u64) -> u64 {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|line| {
                let (start, end) = line.split_whitespace().next()?.split_once('-')?;
                let start = u64::from_str_radix(start, 16).ok()?;
                let end = u64::from_str_radix(end, 16).ok()?;
                (start..end).contains(&addr).then_some(end)
            })
            .next()
            .expect("the stack is mapped")
    }

    #[inline(never)]
    fn unwind_test_capture(limit: u64) -> Sample {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: only reads registers.
        unsafe {
            core::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
                options(nomem, nostack, preserves_flags),
            );
        }
        // The frames above sp (this function's and its callers') do not
        // change while it runs; what it calls uses the stack below sp.
        let len = (mapping_end(sp) - sp).min(limit);
        // SAFETY: [sp, sp + len) lies in this thread's mapped stack.
        let stack =
            unsafe { std::slice::from_raw_parts(sp as usize as *const u8, len as usize) }.to_vec();
        Sample {
            ip,
            sp,
            bp,
            stack,
            whole_stack: len < limit,
        }
    }

    // Each caller uses the callee's result afterwards, so no call is a tail
    // call that would drop the caller's frame.
    #[inline(never)]
    fn unwind_test_inner() -> Sample {
        let sample = unwind_test_capture(COPY_BYTES);
        std::hint::black_box(sample)
    }

    #[inline(never)]
    fn unwind_test_middle() -> Sample {
        let sample = unwind_test_inner();
        std::hint::black_box(sample)
    }

    #[inline(never)]
    fn unwind_test_outer() -> Sample {
        let sample = unwind_test_middle();
        std::hint::black_box(sample)
    }

    /// A sample taken on a fresh thread, so the whole stack fits the copy.
    fn thread_sample() -> Sample {
        std::thread::spawn(unwind_test_outer).join().unwrap()
    }

    fn own_table() -> (ProcessTable, u32) {
        let pid = std::process::id();
        let mut table = ProcessTable::new(4);
        assert!(table.snapshot(pid));
        (table, pid)
    }

    /// Function names of each frame (the outermost inlined one last).
    fn function_names(table: &mut ProcessTable, pid: u32, frames: &[u64]) -> Vec<String> {
        let mut symbolizer = Symbolizer::new().unwrap();
        symbolizer
            .user_stack(table, pid, frames)
            .iter()
            .map(|f| {
                f.lines
                    .iter()
                    .map(|l| l.function.as_str())
                    .collect::<Vec<_>>()
                    .join(" < ")
            })
            .collect()
    }

    #[test]
    fn unwinds_own_thread_through_known_functions() {
        let sample = thread_sample();
        let (mut table, pid) = own_table();
        let mut unwinder = Unwinder::new();
        let info = table.get(pid).unwrap();
        let unwound = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        let names = function_names(&mut table, pid, &unwound.frames);
        eprintln!("{:#x?}\n{names:#?}", unwound);
        assert_eq!(unwound.frames[0], sample.ip);
        let chain = [
            "unwind_test_capture",
            "unwind_test_inner",
            "unwind_test_middle",
            "unwind_test_outer",
        ];
        for (i, want) in chain.iter().enumerate() {
            assert!(
                names
                    .get(i)
                    .is_some_and(|n| n.ends_with(&format!("tests::{want}"))),
                "frame {i} should be {want}: {names:#?}"
            );
        }
        // The thread is started by libc: its frames were found through its
        // CFI too, down to clone's end of stack.
        assert!(sample.whole_stack, "a fresh thread's stack fits the copy");
        assert!(!unwound.truncated, "{names:#?}");
        assert!(
            names.iter().any(|n| n.contains("start_thread")),
            "{names:#?}"
        );
        assert!(
            names.last().is_some_and(|n| n.contains("clone")),
            "{names:#?}"
        );
        let stats = unwinder.stats();
        assert_eq!(stats.unwinds, 1);
        assert_eq!(stats.truncated, 0);
    }

    #[test]
    fn a_repeated_walk_is_remembered_and_checked() {
        let sample = thread_sample();
        let (table, pid) = own_table();
        let mut unwinder = Unwinder::new();
        let info = table.get(pid).unwrap();
        let first = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        assert!(first.frames.len() >= 5, "{first:#x?}");
        let again = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        assert_eq!(again, first);
        assert_eq!(unwinder.stats().memo.hits, 1);

        // Another caller's return address in the copy: walked again, and
        // the walk follows the new value.
        let slot = (sample.sp..sample.sp + sample.stack.len() as u64)
            .step_by(8)
            .find(|&a| read_word(&sample.stack, sample.sp, a) == Some(first.frames[1]))
            .expect("the first return address is in the copy");
        let mut changed = sample.stack.clone();
        let at = (slot - sample.sp) as usize;
        changed[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
        let other = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &changed);
        assert_ne!(other.frames, first.frames);
        let stats = unwinder.stats();
        assert_eq!((stats.memo.hits, stats.memo.misses), (1, 2));
        assert_eq!(stats.unwinds, 3);
    }

    #[test]
    fn unwinds_test_thread_at_least_to_the_test() {
        // The test harness's thread: deeper, maybe deeper than the copy.
        let sample = unwind_test_outer();
        let (mut table, pid) = own_table();
        let mut unwinder = Unwinder::new();
        let info = table.get(pid).unwrap();
        let unwound = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        let names = function_names(&mut table, pid, &unwound.frames);
        assert!(
            names
                .iter()
                .any(|n| n.ends_with("unwinds_test_thread_at_least_to_the_test")),
            "{names:#?}"
        );
        if sample.whole_stack {
            assert!(!unwound.truncated, "{names:#?}");
        }
    }

    #[test]
    fn short_copy_truncates() {
        let sample = thread_sample();
        let (table, pid) = own_table();
        let mut unwinder = Unwinder::new();
        let info = table.get(pid).unwrap();
        let full = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        let short = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack[..64]);
        assert!(short.truncated);
        assert_eq!(short.frames[0], sample.ip);
        assert!(short.frames.len() < full.frames.len());
        assert_eq!(short.frames[..], full.frames[..short.frames.len()]);
        assert_eq!(unwinder.stats().truncated, 1);
    }

    #[test]
    fn complete_walks_tell_where_the_stack_ends() {
        let sample = thread_sample();
        let (table, pid) = own_table();
        let mut unwinder = Unwinder::new();
        let info = table.get(pid).unwrap();
        let tid = 77;
        let walk = |unwinder: &mut Unwinder, stack: &[u8]| {
            unwinder
                .unwind_hinted(info, tid, sample.ip, sample.sp, sample.bp, stack)
                .0
        };
        let full = walk(&mut unwinder, &sample.stack);
        assert!(!full.truncated);
        let updates = unwinder.take_stack_tops();
        let [TopUpdate::Set { tid: 77, top }] = updates[..] else {
            panic!("expected one top for thread 77: {updates:?}");
        };
        // The walk needs nothing above the top: a copy cut there gives the
        // same frames (a fresh walk: the memo forgets between unwinders).
        let needed = usize::try_from(top - sample.sp).unwrap();
        assert!(
            needed < sample.stack.len(),
            "{needed} of {}",
            sample.stack.len()
        );
        let mut fresh = Unwinder::new();
        let cut = walk(&mut fresh, &sample.stack[..needed]);
        assert_eq!(
            (cut.frames.clone(), cut.truncated),
            (full.frames.clone(), false)
        );
        // One word less, and the walk runs off its copy: the top is taken
        // back (it was sent by this unwinder).
        let short = walk(&mut fresh, &sample.stack[..needed - 8]);
        assert!(short.truncated);
        let updates = fresh.take_stack_tops();
        assert_eq!(
            updates.last(),
            Some(&TopUpdate::Clear { tid }),
            "{updates:?}"
        );
    }

    #[test]
    fn unknown_ip_truncates() {
        let sample = thread_sample();
        let (table, pid) = own_table();
        let mut unwinder = Unwinder::new();
        let info = table.get(pid).unwrap();
        // Code in no mapping may be JIT code mapped since the snapshot:
        // stepped by its frame pointer where that points into the stack,
        // else the walk stops there.
        let unwound = unwinder.unwind(info, 0x1000, sample.sp, 0, &sample.stack);
        assert_eq!(
            unwound,
            UnwoundStack {
                frames: Arc::from(vec![0x1000]),
                truncated: true
            }
        );
        let stepped = unwinder.unwind(info, 0x1000, sample.sp, sample.bp, &sample.stack);
        assert!(stepped.frames.len() > 1, "{stepped:?}");
        assert_eq!(unwinder.stats().jit_frames, 1);
        // No stack at all.
        let unwound = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &[]);
        assert!(unwound.truncated);
        assert_eq!(&*unwound.frames, &[sample.ip]);
    }

    #[test]
    fn a_leaf_whose_rule_gives_no_code_is_left_by_its_frame_pointer() {
        let (table, pid) = own_table();
        let info = table.get(pid).unwrap();
        // A return address in this test's own code.
        let code = a_leaf_whose_rule_gives_no_code_is_left_by_its_frame_pointer as *const () as u64;
        // The leaf's frame at bp 0x1000: saved bp 0x1040, its caller's
        // return address in code; the word on top of the stack (sp
        // 0xfe0) is one of its locals.
        let words = [(0xfe0, 0x3ff), (0x1000, 0x1040), (0x1008, code + 4)];
        let mut read = stack_of(&words);
        let leaf = UnwindRegsX86_64::new(code, 0xfe0, 0x1000);
        let (ret, next) = leaf_caller_by_frame_pointer(info, &leaf, 0x3ff, &mut read)
            .expect("by the frame pointer");
        assert_eq!((ret, next.sp(), next.bp()), (code + 4, 0x1010, 0x1040));
        // A return address in code is kept, and a frame pointer that gives
        // none is not taken.
        assert!(leaf_caller_by_frame_pointer(info, &leaf, code + 8, &mut read).is_none());
        let stray = UnwindRegsX86_64::new(code, 0xfe0, 0xfe0);
        assert!(leaf_caller_by_frame_pointer(info, &stray, 0x3ff, &mut read).is_none());
    }

    #[test]
    fn depth_limit_truncates() {
        // Debug-build frames are large: copy more than the kernel would.
        #[inline(never)]
        fn recurse(depth: u32) -> Sample {
            if depth == 0 {
                return unwind_test_capture(1 << 20);
            }
            let sample = recurse(depth - 1);
            std::hint::black_box(sample)
        }
        let sample = std::thread::spawn(|| recurse(MAX_FRAMES as u32 + 10))
            .join()
            .unwrap();
        let (table, pid) = own_table();
        let mut unwinder = Unwinder::new();
        let info = table.get(pid).unwrap();
        let unwound = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        assert!(unwound.truncated);
        assert_eq!(unwound.frames.len(), MAX_FRAMES);
    }

    #[test]
    fn objects_are_cached_and_released() {
        let sample = thread_sample();
        let (table, pid) = own_table();
        let mut unwinder = Unwinder::new();
        let info = table.get(pid).unwrap();
        let first = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        let loaded = unwinder.stats();
        assert!(loaded.objects_loaded >= 2, "{loaded:?}");
        assert_eq!(loaded.cached_processes, 1);
        assert!(loaded.cached_bytes > 0);
        let second = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        assert_eq!(first, second);
        let stats = unwinder.stats();
        assert_eq!(stats.objects_loaded, loaded.objects_loaded);
        assert_eq!(stats.object_load_failures, loaded.object_load_failures);
        assert_eq!(stats.unwinds, 2);

        // Another process unwinder (a re-snapshot under the same mappings
        // keeps it; a new one shares the objects).
        let mut other = ProcessTable::new(4);
        assert!(other.snapshot(pid));
        let again = unwinder.unwind(
            other.get(pid).unwrap(),
            sample.ip,
            sample.sp,
            sample.bp,
            &sample.stack,
        );
        assert_eq!(again, first);
        assert_eq!(unwinder.stats().objects_loaded, loaded.objects_loaded);

        // Used in this window: kept.
        unwinder.release_unused();
        assert_eq!(unwinder.stats().cached_processes, 1);
        assert!(unwinder.stats().cached_objects > 0);
        // Once no snapshot maps the objects and no unwind used the process
        // for a window, everything goes.
        drop(table);
        drop(other);
        unwinder.release_unused();
        let stats = unwinder.stats();
        assert_eq!(stats.cached_processes, 0);
        assert_eq!(stats.cached_objects, 0, "{stats:?}");
        assert_eq!(stats.cached_bytes, 0);
    }

    #[test]
    fn bounded_object_cache_evicts() {
        let sample = thread_sample();
        let (table, pid) = own_table();
        let mut unwinder =
            Unwinder::with_limits(4, 1, MemoryBudget::new(DEFAULT_MEMORY_BYTES as usize));
        let info = table.get(pid).unwrap();
        let unwound = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        assert!(!unwound.truncated);
        let stats = unwinder.stats();
        assert_eq!(stats.cached_objects, 1);
        assert!(stats.evictions >= 1, "{stats:?}");
    }

    /// Under a budget the symbolizer has filled, the unwinder gives back
    /// down to its floors after every walk: objects no process unwinder
    /// holds first, then the least recently used process unwinder and
    /// what it held. The walks stay the same, their objects read again.
    #[test]
    fn a_full_budget_evicts_by_use_and_walks_do_not_change() {
        let sample = thread_sample();
        let (table, pid) = own_table();
        let info = table.get(pid).unwrap();
        let mut roomy = Unwinder::new();
        let want = roomy.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        assert!(!want.truncated);
        let largest = roomy
            .objects
            .entries
            .values()
            .map(ObjectEntry::heap_bytes)
            .max()
            .unwrap();

        // Room for the largest object, not for all of them with the rest.
        let budget = MemoryBudget::new(2 * largest + 1);
        let mut unwinder = Unwinder::with_budget(budget.clone());
        budget.set(Cache::Symbols, budget.limit());
        for round in 0..3 {
            let got = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
            assert_eq!(got, want, "round {round}");
            for cache in [Cache::UnwindObjects, Cache::Unwinders, Cache::WalkMemo] {
                assert!(
                    budget.bytes(cache) <= budget.floor(cache),
                    "round {round}: {cache:?} holds {} over its floor {}",
                    budget.bytes(cache),
                    budget.floor(cache)
                );
            }
        }
        let stats = budget.stats();
        assert!(stats.evictions[3] > 0, "objects evicted: {stats:?}");
        assert!(
            stats.evictions[4] > 0,
            "process unwinders evicted: {stats:?}"
        );
        assert!(
            unwinder.stats().objects_loaded > roomy.stats().objects_loaded,
            "objects read again"
        );
        assert_eq!(
            stats.bytes[3] as usize,
            unwinder.stats().cached_bytes,
            "published bytes"
        );

        // The symbolizer gives its room back: nothing more is evicted.
        budget.set(Cache::Symbols, 0);
        unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        let before = budget.stats().total_evictions();
        let again = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        assert_eq!(again, want);
        assert_eq!(budget.stats().total_evictions(), before);
        assert!(budget.total() <= budget.limit());
    }

    /// An object whose tables are over half the budget is not loaded.
    #[test]
    fn objects_over_half_the_budget_are_refused() {
        let sample = thread_sample();
        let (table, pid) = own_table();
        let info = table.get(pid).unwrap();
        let mut roomy = Unwinder::new();
        roomy.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        let largest = roomy
            .objects
            .entries
            .values()
            .map(ObjectEntry::heap_bytes)
            .max()
            .unwrap();
        let mut unwinder = Unwinder::with_budget(MemoryBudget::new(largest));
        unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        assert!(unwinder.stats().objects_too_large >= 1);
    }

    #[test]
    fn load_bias_places_segments() {
        let exec = |offset, vaddr, filesz| LoadSegment {
            offset,
            vaddr,
            filesz,
            executable: true,
        };
        let data = |offset, vaddr, filesz| LoadSegment {
            offset,
            vaddr,
            filesz,
            executable: false,
        };
        // Non-PIE executable: text from offset 0 at its link address.
        let non_pie = [exec(0, 0x40_0000, 0x5000), data(0x5e10, 0x60_5e10, 0x300)];
        assert_eq!(load_bias(&non_pie, 0x40_0000, 0), Some(0));
        // Shared library with a separate text segment at file offset
        // 0x28000 (vaddr 0x28000), mapped at 0x7f00_0002_8000.
        let lib = [
            data(0, 0, 0x27f00),
            exec(0x28000, 0x28000, 0x15_0000),
            data(0x17_8000, 0x17_8000, 0x5_0000),
            data(0x1c_e8f0, 0x1c_f8f0, 0x6000),
        ];
        assert_eq!(
            load_bias(&lib, 0x7f00_0002_8000, 0x28000),
            Some(0x7f00_0000_0000)
        );
        // lld-style PIE: text segment's vaddr is one page past its offset.
        let pie = [data(0, 0, 0x1_2345), exec(0x1_2350, 0x1_3350, 0x8_0000)];
        assert_eq!(
            load_bias(&pie, 0x5555_5556_7000, 0x1_2000),
            Some(0x5555_5555_4000)
        );
        // A mapping that no segment covers.
        assert_eq!(load_bias(&lib, 0x7f00_0000_0000, 0x100_0000), None);
    }

    #[test]
    fn load_rejects_non_elf_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-elf");
        std::fs::write(&path, b"#!/bin/sh\necho hello\n").unwrap();
        assert!(matches!(
            ObjectUnwindInfo::load(&path),
            Err(LoadError::Malformed(_) | LoadError::NotElf)
        ));
        let err = ObjectUnwindInfo::load(&dir.path().join("missing")).unwrap_err();
        assert!(!err.is_permanent());
    }

    #[test]
    fn loads_the_vdso() {
        let (table, pid) = own_table();
        let info = table.get(pid).unwrap();
        let Some(vdso) = info.mappings().iter().find(|m| m.mapping.path == "[vdso]") else {
            return;
        };
        // The table gives the vDSO a copy of the daemon's own image.
        let object = vdso.object.as_ref().expect("own vDSO image");
        let loaded = ObjectUnwindInfo::load(&object.elf_path()).unwrap();
        assert!(
            loaded
                .section(b".eh_frame_hdr")
                .is_some_and(|s| s.data.is_some())
        );
        let bias = load_bias(
            &loaded.segments,
            vdso.mapping.start,
            vdso.mapping.file_offset,
        );
        assert_eq!(bias, Some(vdso.mapping.start));
    }

    /// Figures for the report: run with --nocapture.
    #[test]
    fn timings() {
        let sample = thread_sample();
        let (table, pid) = own_table();
        let info = table.get(pid).unwrap();
        let mut unwinder = Unwinder::new();
        let started = Instant::now();
        let first = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
        let first_time = started.elapsed();
        const ROUNDS: u32 = 1000;
        let started = Instant::now();
        for _ in 0..ROUNDS {
            let unwound = unwinder.unwind(info, sample.ip, sample.sp, sample.bp, &sample.stack);
            assert_eq!(unwound.frames.len(), first.frames.len());
        }
        let cached = started.elapsed() / ROUNDS;

        let libc = info
            .mappings()
            .iter()
            .find(|m| m.mapping.path.contains("libc.so"))
            .and_then(|m| m.object.clone())
            .expect("libc is mapped");
        let started = Instant::now();
        let loaded = ObjectUnwindInfo::load(&libc.elf_path()).unwrap();
        let libc_load = started.elapsed();
        eprintln!(
            "{} frames: first unwind (loads {} objects) {first_time:?}, cached {cached:?} per unwind; \
             libc unwind info load {libc_load:?} ({} bytes of sections)",
            first.frames.len(),
            unwinder.stats().objects_loaded,
            loaded.bytes,
        );
    }
}
