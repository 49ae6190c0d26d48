//! Turns raw stack addresses into [`Frame`]s. User addresses are resolved
//! through the snapshots of a [`ProcessTable`]: by file offset in the mapped
//! ELF file (read through the handle kept in the snapshot, so it works after
//! the process exited), with DWARF lines, inlined functions and demangled
//! names. Kernel addresses are resolved through /proc/kallsyms.
//!
//! Three caches draw on the memory budget (budget.rs), each dropping its
//! least recently used entries when the budget asks: results per (object,
//! offset), shared by build ID; section layouts and PLT stubs per build
//! ID; and the files blazesym has parsed (symbol tables, DWARF units, and
//! kallsyms), each charged the growth of the heap its parsing caused.
//!
//! `go_leaf.rs` puts back the caller a frame-pointer walk skipped under a
//! Go leaf; `prefetch.rs` resolves a window's misses one object at a time;
//! `perf_map.rs` names JIT code; `python.rs` names Python frames and
//! places them among the native ones; `lookup.rs` names a running
//! process's addresses once, outside the caches (`/debug/pprof/symbol`).
//! A little over the ~800 lines a file should hold: user and kernel
//! lookups and the three caches they share are one state; the caches'
//! eviction (`shed`) is the next part to go to a file of its own.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::mem::size_of;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use blazesym::MaybeDefault;
use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{self as bz, CodeInfo, Input, Reason, Symbolized, evict};
use object::elf::{ELF_NOTE_GNU, FileHeader64, NT_GNU_BUILD_ID};
use object::read::elf::NoteIterator;
use tracing::{debug, warn};

use crate::model::frames::{Frame, Line, Mapping};
use crate::model::go_pclntab;
use crate::procs::objects::{MappedObject, ObjectFile, hex};
use crate::procs::process::ProcessTable;
use crate::stacks::budget::{Cache, Lru, MemoryBudget, heap_in_use};
use crate::stacks::file_pages::FilePages;
use crate::stacks::plt::{ObjectLayout, Placement};

mod go_leaf;
pub mod lookup;
mod perf_map;
mod prefetch;
pub mod python;

use perf_map::PerfMaps;

/// Mapping name of kernel frames, as perf and pprof tools expect.
pub const KERNEL_MAPPING_NAME: &str = "[kernel.kallsyms]";
const KALLSYMS: &str = "/proc/kallsyms";
const KERNEL_NOTES: &str = "/sys/kernel/notes";
/// Kernel addresses that kallsyms does not know (a module or BPF program
/// loaded since) reload it, at most this often.
const KALLSYMS_RELOAD_INTERVAL: Duration = Duration::from_secs(60);
/// Every this many user stacks, files of dropped objects are released.
const RELEASE_EVERY: u64 = 1024;
/// Bound of the set of objects already warned about.
const MAX_WARNED: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    #[error("cannot read /proc/kallsyms: {0}")]
    Kallsyms(#[source] std::io::Error),
}

/// Counters of the symbolizer; frames are counted once each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolizeStats {
    /// Frames asked for (user and kernel).
    pub lookups: u64,
    /// Frames answered from the cache.
    pub cache_hits: u64,
    /// Frames left without lines (includes `unmapped`).
    pub failures: u64,
    /// User frames in no known mapping.
    pub unmapped: u64,
    /// Batch lookups that failed for a whole object (unreadable, not ELF).
    pub object_errors: u64,
    /// Cached results dropped to stay within the memory budget.
    pub cache_evictions: u64,
    /// Cached results now.
    pub cached: usize,
    /// Frames named after the PLT stub they are in (`memcpy@plt`).
    pub plt_stubs: u64,
    /// Frames named from a Go binary's function table.
    pub go_pclntab: u64,
    /// Callers put back under a Go leaf whose frame pointer was not set
    /// up yet at the sample (once per distinct stack and window).
    pub go_leaf_callers: u64,
    /// Times the pages of mapped symbol files were let go of.
    pub file_page_releases: u64,
    /// Frames of JIT code named from their process's perf map.
    pub perf_map_frames: u64,
    /// Perf-map lines that did not parse, and maps with more regions
    /// than are kept.
    pub perf_map_bad_lines: u64,
    pub perf_maps_truncated: u64,
    /// Frames in V8's shared interpreter trampoline of processes with a
    /// perf map (see `perf_map::PerfMaps::note_interpreted`).
    pub v8_interpreted_frames_unnamed: u64,
    /// Frames left unsymbolized because the symbol found before them does
    /// not cover them (its size ends before, or it lies in another section).
    pub uncovered: u64,
}

/// Which symbol source a cached result came from. Objects with a build ID
/// share results across files and processes.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum ObjKey {
    Kernel,
    BuildId(Arc<str>),
    Object(u64),
}

impl ObjKey {
    fn of(object: &ObjectFile) -> Self {
        match object.build_id() {
            Some(id) => Self::BuildId(Arc::clone(id)),
            None => Self::Object(object.id()),
        }
    }
}

type CacheKey = (ObjKey, u64);

/// An object a window's stacks pass through, the mapping it was found in,
/// and the file offsets to look up in it.
type Prefetched = (Arc<ObjectFile>, Arc<Mapping>, Vec<u64>);

/// An object and the (frame index, file offset) pairs to look up in it.
type Pending = (Arc<ObjectFile>, Vec<(usize, u64)>);

/// A source blazesym has parsed: kallsyms, or an object's file.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum FileKey {
    Kernel,
    Object(u64),
}

/// A parsed file, and what its parsing added to the heap.
struct ParsedFile {
    /// The object whose file it is (none for kallsyms): when no process
    /// snapshot holds it any more, its parsed state is released.
    object: Option<(Weak<ObjectFile>, PathBuf)>,
    heap: usize,
}

/// Symbolizes user and kernel stacks. Not `Send` (blazesym is not): create
/// it on the thread that uses it.
pub struct Symbolizer {
    user: bz::Symbolizer,
    kernel: bz::Symbolizer,
    kernel_source: Source<'static>,
    kernel_mapping: Arc<Mapping>,
    kallsyms_loaded: Instant,
    /// Whether kallsyms was read yet (at the first kernel frame).
    kallsyms_checked: bool,
    /// Whether kallsyms has been parsed (and charged) since the kernel
    /// symbolizer was made.
    kernel_parsed: bool,
    /// Lines per (object, offset).
    cache: Lru<CacheKey, Arc<[Line]>>,
    /// Section layouts and PLT stubs per object (`None`: unreadable).
    layouts: Lru<ObjKey, Option<ObjectLayout>>,
    /// SP deltas of Go code per (object, offset) (`None`: not Go code, or
    /// not in its function table); charged with the layouts.
    sp_deltas: Lru<CacheKey, Option<u64>>,
    /// A window's cache misses per object, from [`Self::prefetch_user`].
    prefetched: HashMap<u64, Prefetched>,
    /// Releases the pages of mapped symbol files (None: switched off).
    file_pages: Option<FilePages>,
    /// Files blazesym has parsed, to release them once their object is
    /// gone or when the budget asks.
    files: Lru<FileKey, ParsedFile>,
    budget: MemoryBudget,
    warned: HashSet<ObjKey>,
    empty: Arc<[Line]>,
    user_calls: u64,
    /// Names of JIT code, from the processes' perf maps.
    perf_maps: PerfMaps,
    /// CPython processes and their code objects.
    pub python: python::PythonCodes,
    stats: SymbolizeStats,
}

impl Symbolizer {
    /// [`Symbolizer::with_budget`] with a budget of its own, of the
    /// default size.
    #[cfg(test)]
    pub fn new() -> Result<Self, SymbolizeError> {
        let bytes = crate::config::limits::DEFAULT_MEMORY_BYTES as usize;
        Self::with_budget(MemoryBudget::new(bytes))
    }

    /// A symbolizer whose caches draw on `budget`. Checks that kallsyms
    /// can be opened (it is read at the first kernel frame); reads the
    /// kernel build ID from /sys/kernel/notes.
    pub fn with_budget(budget: MemoryBudget) -> Result<Self, SymbolizeError> {
        File::open(KALLSYMS).map_err(SymbolizeError::Kallsyms)?;
        let kernel_source = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Some(PathBuf::from(KALLSYMS)),
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        });
        // kallsyms is parsed at the first kernel frame, not here: it takes
        // about 50 ms of kernel time to list, which a start need not wait
        // for.
        let kernel = kernel_symbolizer();
        let kernel_mapping = Arc::new(Mapping {
            start: 0,
            limit: u64::MAX,
            file_offset: 0,
            path: KERNEL_MAPPING_NAME.to_owned(),
            build_id: kernel_build_id(),
        });
        // Auto-reload makes blazesym stat the path on each batch: a
        // /proc/self/fd/N path can name another file once N is reused.
        let user = bz::Symbolizer::builder()
            .enable_auto_reload(true)
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            .build();
        Ok(Self {
            user,
            kernel,
            kernel_source,
            kernel_mapping,
            kallsyms_loaded: Instant::now(),
            kallsyms_checked: false,
            kernel_parsed: false,
            cache: Lru::new(),
            layouts: Lru::new(),
            sp_deltas: Lru::new(),
            prefetched: HashMap::new(),
            file_pages: Some(FilePages::new()),
            files: Lru::new(),
            budget,
            warned: HashSet::new(),
            empty: Arc::from(Vec::new()),
            user_calls: 0,
            perf_maps: PerfMaps::default(),
            python: python::PythonCodes::default(),
            stats: SymbolizeStats::default(),
        })
    }

    /// Symbolizes a user stack of `tgid`: `addrs` leaf first, as recorded.
    /// Every address but the first is a return address and is looked up
    /// (and reported in [`Frame::address`]) as `addr - 1`, the call. Returns
    /// one frame per address, leaf first.
    #[cfg(test)]
    pub fn user_stack(&mut self, procs: &mut ProcessTable, tgid: u32, addrs: &[u64]) -> Vec<Frame> {
        let generation = procs.generation(tgid);
        self.user_stack_of(procs, (tgid, generation), addrs, None)
    }

    /// As [`Self::user_stack`], for the process image `generation` of
    /// `tgid` (see [`ProcessTable::generation`]): a sample taken before an
    /// exec resolves against the image it ran. JIT code is named by the
    /// perf-map region that may have been written by kernel time `at`
    /// (see `perf_map::PerfMaps::lookup`); None: the last written.
    pub fn user_stack_of(
        &mut self,
        procs: &mut ProcessTable,
        (tgid, generation): (u32, u32),
        addrs: &[u64],
        at: Option<u64>,
    ) -> Vec<Frame> {
        self.user_calls += 1;
        if self.user_calls.is_multiple_of(RELEASE_EVERY) {
            self.release_unused();
        }
        self.stats.lookups += addrs.len() as u64;
        let lookup = call_sites(addrs);
        let located = locate(procs, (tgid, generation), &lookup);

        let mut frames = Vec::with_capacity(lookup.len());
        // Cache misses, grouped per object for one blazesym call each.
        let mut misses: HashMap<u64, Pending> = HashMap::new();
        for (idx, (&address, found)) in lookup.iter().zip(located).enumerate() {
            let Some(MappedObject { mapping, object }) = found else {
                // JIT code mapped since the last snapshot, maybe.
                let lines = self.perf_maps.lookup((tgid, generation), address, at);
                if lines.is_none() {
                    self.stats.unmapped += 1;
                    self.stats.failures += 1;
                }
                frames.push(Frame {
                    address,
                    mapping: None,
                    lines: lines.unwrap_or_else(|| Arc::clone(&self.empty)),
                });
                continue;
            };
            let offset = address
                .wrapping_sub(mapping.start)
                .wrapping_add(mapping.file_offset);
            let mut lines = Arc::clone(&self.empty);
            match object {
                None => match is_anonymous(&mapping.path)
                    .then(|| self.perf_maps.lookup((tgid, generation), address, at))
                    .flatten()
                {
                    Some(named) => lines = named,
                    None => self.stats.failures += 1,
                },
                Some(object) => match self.cached(&object, offset) {
                    Some(cached) => {
                        self.stats.cache_hits += 1;
                        if cached.is_empty() {
                            self.stats.failures += 1;
                        }
                        lines = cached;
                    }
                    None => misses
                        .entry(object.id())
                        .or_insert_with(|| (object, Vec::new()))
                        .1
                        .push((idx, offset)),
                },
            }
            frames.push(Frame {
                address,
                mapping: Some(mapping),
                lines,
            });
        }
        for (object, pending) in misses.into_values() {
            self.resolve_in_object(&object, &pending, &mut frames);
        }
        self.perf_maps.note_interpreted((tgid, generation), &frames);
        self.shed(false);
        frames
    }

    /// The cached result for `offset` in `object`: symbols found in any
    /// file with its build ID, else a miss in this very file.
    fn cached(&mut self, object: &ObjectFile, offset: u64) -> Option<Arc<[Line]>> {
        let shared = ObjKey::of(object);
        let own = ObjKey::Object(object.id());
        if let Some(lines) = self.cache.get(&(shared.clone(), offset)) {
            return Some(Arc::clone(lines));
        }
        if shared == own {
            return None;
        }
        self.cache
            .get(&(own, offset))
            .map(|lines| Arc::clone(lines))
    }

    /// Looks up `pending` (frame index, file offset) in one object: offsets
    /// in PLT sections by the object's stubs, the others with blazesym.
    fn resolve_in_object(
        &mut self,
        object: &Arc<ObjectFile>,
        pending: &[(usize, u64)],
        frames: &mut [Frame],
    ) {
        let mut offsets: Vec<u64> = pending.iter().map(|&(_, offset)| offset).collect();
        offsets.sort_unstable();
        offsets.dedup();
        let mapped = pending
            .first()
            .and_then(|&(idx, _)| frames.get(idx)?.mapping.clone());
        let results = self.resolve_offsets(object, &offsets, mapped.as_deref());
        for &(idx, offset) in pending {
            let lines = offsets
                .binary_search(&offset)
                .ok()
                .and_then(|i| results.get(i));
            match (lines, frames.get_mut(idx)) {
                (Some(lines), Some(frame)) if !lines.is_empty() => frame.lines = Arc::clone(lines),
                _ => self.stats.failures += 1,
            }
        }
    }

    /// Looks up `offsets` (sorted, distinct) in one object and caches the
    /// answers: offsets in PLT sections by the object's stubs, the others
    /// with blazesym, and what blazesym leaves unnamed in a Go binary from
    /// its pclntab. `mapped` names the file in a warning.
    fn resolve_offsets(
        &mut self,
        object: &Arc<ObjectFile>,
        offsets: &[u64],
        mapped: Option<&Mapping>,
    ) -> Vec<Arc<[Line]>> {
        let path = object.elf_path();
        let mut results: Vec<Option<Arc<[Line]>>> = vec![None; offsets.len()];
        let layout_key = ObjKey::of(object);
        let mut layout = layout_of(&mut self.layouts, &layout_key, object, &path);
        let mut asked: Vec<(usize, u64)> = Vec::with_capacity(offsets.len());
        for (i, &offset) in offsets.iter().enumerate() {
            match layout
                .as_mut()
                .map(|layout| layout.placement(&path, offset))
            {
                Some(Placement::Stub(name)) => {
                    self.stats.plt_stubs += 1;
                    results[i] = Some(Arc::from([Line {
                        function: name.to_owned(),
                        file: None,
                        line: 0,
                    }]));
                }
                Some(Placement::UnnamedPlt) => results[i] = Some(Arc::clone(&self.empty)),
                _ => asked.push((i, offset)),
            }
        }
        // PLT stubs are read at the first lookup in a PLT section.
        let layout_bytes = layout.as_deref().map_or(0, ObjectLayout::heap_bytes);
        let source = Source::Elf(Elf::new(path.clone()));
        let lookup: Vec<u64> = asked.iter().map(|&(_, offset)| offset).collect();
        let mut parsed = 0;
        let result = if lookup.is_empty() {
            Ok(Vec::new())
        } else {
            // What blazesym keeps of the file (its symbol table index, the
            // DWARF units it parsed) is what the heap grew by, less the
            // answer it returns.
            if let Some(layout) = layout.as_mut() {
                layout.load_aliases(&path, object.build_id().map(|id| &**id));
            }
            let before = heap_in_use();
            let answer = self.user.symbolize(&source, Input::FileOffset(&lookup));
            let grown = heap_in_use().saturating_sub(before);
            parsed = grown.saturating_sub(answer.as_deref().map_or(0, answer_bytes));
            answer.map(|syms| {
                syms.iter()
                    .map(|sym| {
                        if covers(sym, layout.as_deref()) {
                            let perf_name = match sym {
                                Symbolized::Sym(sym) => layout
                                    .as_deref()
                                    .and_then(|l| l.perf_name(sym.addr, &sym.name)),
                                _ => None,
                            };
                            named_as(lines_of(sym, &self.empty), perf_name)
                        } else {
                            self.stats.uncovered += 1;
                            Arc::clone(&self.empty)
                        }
                    })
                    .collect::<Vec<_>>()
            })
        };
        // Where a Go binary's function table may name what blazesym
        // does not: the table, and each asked offset's address.
        let go_places = layout.as_deref().and_then(|layout| {
            let section = layout.go_pclntab()?;
            let places: Vec<(usize, u64)> = asked
                .iter()
                .filter_map(|&(i, offset)| Some((i, layout.addr_of_offset(offset)?)))
                .collect();
            Some((section, places))
        });
        self.layouts.recharge(&layout_key, layout_bytes);
        match result {
            Ok(found) => {
                for (&(i, _), lines) in asked.iter().zip(found) {
                    results[i] = Some(lines);
                }
            }
            Err(err) => {
                self.stats.object_errors += 1;
                if self.warn_once(&ObjKey::of(object)) {
                    warn!(
                        path = mapped.map(|m| m.path.as_str()),
                        build_id = object.build_id().map(|id| &**id),
                        %err,
                        "cannot symbolize in a mapped file; its frames stay unsymbolized"
                    );
                }
            }
        }
        // A Go binary names what blazesym could not (a stripped one:
        // everything) from its own function table.
        if let Some((section, places)) = go_places {
            let missed: Vec<(usize, u64)> = places
                .into_iter()
                .filter(|&(i, _)| results[i].as_ref().is_none_or(|l| l.is_empty()))
                .collect();
            let addrs: Vec<u64> = missed.iter().map(|&(_, addr)| addr).collect();
            // A Go binary with symbols is named by blazesym: its file is
            // not opened again.
            let named = match addrs.is_empty() {
                true => Vec::new(),
                false => go_pclntab::lookup_file(&path, section, &addrs),
            };
            for (&(i, _), lines) in missed.iter().zip(named) {
                if !lines.is_empty() {
                    self.stats.go_pclntab += 1;
                    results[i] = Some(Arc::from(lines));
                }
            }
        }
        if !lookup.is_empty() {
            let key = FileKey::Object(object.id());
            let heap = match self.files.get(&key) {
                Some(file) => {
                    file.heap += parsed;
                    file.heap
                }
                None => {
                    let file = ParsedFile {
                        object: Some((Arc::downgrade(object), path)),
                        heap: parsed,
                    };
                    self.files.insert(key.clone(), file, parsed);
                    parsed
                }
            };
            self.files.recharge(&key, heap);
        }
        let results: Vec<Arc<[Line]>> = results
            .into_iter()
            .map(|lines| lines.unwrap_or_else(|| Arc::clone(&self.empty)))
            .collect();
        let key = ObjKey::of(object);
        for (&offset, lines) in offsets.iter().zip(&results) {
            // A miss belongs to this file only: a stripped copy shares the
            // build ID of its original, and must not hide the original's
            // symbols by caching its own misses under that ID.
            let cache_key = if lines.is_empty() {
                ObjKey::Object(object.id())
            } else {
                key.clone()
            };
            self.cache
                .insert((cache_key, offset), Arc::clone(lines), lines_bytes(lines));
        }
        results
    }

    /// Symbolizes a kernel stack: `addrs` leaf first, adjusted like
    /// [`Symbolizer::user_stack`]. Every frame carries the kernel mapping.
    pub fn kernel_stack(&mut self, addrs: &[u64]) -> Vec<Frame> {
        self.stats.lookups += addrs.len() as u64;
        let lookup = call_sites(addrs);
        let mut frames: Vec<Frame> = lookup
            .iter()
            .map(|&address| Frame {
                address,
                mapping: Some(Arc::clone(&self.kernel_mapping)),
                lines: Arc::clone(&self.empty),
            })
            .collect();
        let mut pending = Vec::new();
        for (frame, &address) in frames.iter_mut().zip(&lookup) {
            match self.cache.get(&(ObjKey::Kernel, address)) {
                Some(lines) => {
                    self.stats.cache_hits += 1;
                    frame.lines = Arc::clone(lines);
                }
                None => pending.push(address),
            }
        }
        pending.sort_unstable();
        pending.dedup();
        if !pending.is_empty() {
            self.files.get(&FileKey::Kernel);
        }
        let mut resolved = self.resolve_kernel(&pending);
        // Only kernel-half addresses are worth a reload; others are junk.
        let unknown: Vec<u64> = pending
            .iter()
            .copied()
            .filter(|addr| addr >> 63 == 1 && !resolved.contains_key(addr))
            .collect();
        if !unknown.is_empty() && self.kallsyms_loaded.elapsed() >= KALLSYMS_RELOAD_INTERVAL {
            debug!(
                count = unknown.len(),
                "unknown kernel addresses, reloading kallsyms"
            );
            self.kernel = kernel_symbolizer();
            self.kernel_parsed = false;
            self.kallsyms_loaded = Instant::now();
            resolved.extend(self.resolve_kernel(&unknown));
        }
        for frame in &mut frames {
            if frame.lines.is_empty() {
                match resolved.get(&frame.address) {
                    Some(lines) => frame.lines = Arc::clone(lines),
                    None => self.stats.failures += 1,
                }
            }
        }
        self.shed(false);
        frames
    }

    /// Symbolizes kernel addresses and caches what kallsyms knows. Unknown
    /// addresses are left out and not cached, so that a reload can find them.
    fn resolve_kernel(&mut self, addrs: &[u64]) -> HashMap<u64, Arc<[Line]>> {
        let mut resolved = HashMap::new();
        if addrs.is_empty() {
            return resolved;
        }
        if !self.kernel_parsed {
            self.kernel_parsed = true;
            if !self.kallsyms_checked {
                self.kallsyms_loaded = Instant::now();
            }
            // A probe address parses kallsyms and tells whether it hides
            // its addresses; the heap's growth is what the parsed symbols
            // hold (some 64 bytes per symbol).
            let before = heap_in_use();
            let probe = self
                .kernel
                .symbolize_single(&self.kernel_source, Input::AbsAddr(u64::MAX));
            let parsed = heap_in_use().saturating_sub(before);
            let file = ParsedFile {
                object: None,
                heap: parsed,
            };
            self.files.insert(FileKey::Kernel, file, parsed);
            let hidden = matches!(probe, Ok(Symbolized::Unknown(Reason::MissingSyms)));
            if hidden && !self.kallsyms_checked {
                warn!(
                    "{KALLSYMS} lists no addresses (kernel.kptr_restrict?); kernel frames stay unsymbolized"
                );
            }
            self.kallsyms_checked = true;
        }
        let result = self
            .kernel
            .symbolize(&self.kernel_source, Input::AbsAddr(addrs))
            .map(|syms| {
                syms.iter()
                    .map(|sym| lines_of(sym, &self.empty))
                    .collect::<Vec<_>>()
            });
        match result {
            Ok(results) => {
                for (&addr, lines) in addrs.iter().zip(results) {
                    if !lines.is_empty() {
                        let bytes = lines_bytes(&lines);
                        self.cache
                            .insert((ObjKey::Kernel, addr), Arc::clone(&lines), bytes);
                        resolved.insert(addr, lines);
                    }
                }
            }
            Err(err) => {
                self.stats.object_errors += 1;
                if self.warn_once(&ObjKey::Kernel) {
                    warn!(%err, "cannot symbolize kernel addresses");
                }
            }
        }
        resolved
    }

    fn warn_once(&mut self, key: &ObjKey) -> bool {
        if self.warned.len() >= MAX_WARNED {
            self.warned.clear();
        }
        self.warned.insert(key.clone())
    }

    /// Releases what blazesym holds (open file, parsed symbols) for objects
    /// that no process snapshot uses any more. Runs by itself every
    /// 1024 user stacks; call it after [`ProcessTable::prune`]
    /// to release promptly.
    pub fn release_unused(&mut self) {
        let mut dead = Vec::new();
        self.files.retain(|_, file| match &file.object {
            Some((object, path)) if object.strong_count() == 0 => {
                dead.push(path.clone());
                false
            }
            _ => true,
        });
        for path in dead {
            self.release_file(path);
        }
        self.publish();
    }

    fn release_file(&mut self, path: PathBuf) {
        if let Err(err) = self.user.evict(&evict::Evict::Elf(evict::Elf::new(path))) {
            debug!(%err, "releasing a symbol source failed");
        }
    }

    /// Publishes the caches' bytes to the budget.
    fn publish(&self) {
        self.budget.set(Cache::Symbols, self.cache.bytes());
        self.budget.set(
            Cache::Layouts,
            self.layouts.bytes() + self.sp_deltas.bytes(),
        );
        self.budget.set(Cache::SymbolFiles, self.files.bytes());
    }

    /// Gives back, least recently used first, what the budget asks of the
    /// symbolizer's caches: those over their floor while the budget is
    /// full, the one furthest over first. The session calls it after each
    /// window is written and after each batch of records, so that room
    /// borrowed while the unwinder grew is returned.
    pub fn enforce_budget(&mut self) {
        self.shed(true);
    }

    /// [`Self::enforce_budget`]; after each stack without the parsed
    /// files (`files` false): the stacks of a window come in no order of
    /// object, and a file dropped between two of them would be parsed
    /// again for the next (libc's debug file is some 20 MB of parsing).
    /// The files a window needs stay until it is written.
    fn shed(&mut self, files: bool) {
        loop {
            self.publish();
            let over = [Cache::Symbols, Cache::Layouts, Cache::SymbolFiles]
                .into_iter()
                .filter(|&cache| files || cache != Cache::SymbolFiles)
                .filter(|&cache| self.budget.must_shed(cache))
                .max_by_key(|&cache| self.budget.bytes(cache) - self.budget.floor(cache));
            let Some(cache) = over else {
                return;
            };
            let dropped = match cache {
                Cache::Symbols => {
                    let dropped = self.cache.pop_lru().is_some();
                    self.stats.cache_evictions += u64::from(dropped);
                    dropped
                }
                Cache::Layouts => {
                    self.sp_deltas.pop_lru().is_some() || self.layouts.pop_lru().is_some()
                }
                _ => match self.files.pop_lru() {
                    Some((FileKey::Kernel, _)) => {
                        // Parsed again at the next kernel frame.
                        self.kernel = kernel_symbolizer();
                        self.kernel_parsed = false;
                        true
                    }
                    Some((FileKey::Object(_), file)) => {
                        if let Some((_, path)) = file.object {
                            self.release_file(path);
                        }
                        true
                    }
                    None => false,
                },
            };
            if !dropped {
                return;
            }
            self.budget.evicted(cache, 1, true);
        }
    }

    pub fn stats(&self) -> SymbolizeStats {
        let maps = self.perf_maps.stats;
        SymbolizeStats {
            cached: self.cache.len(),
            perf_map_frames: maps.frames,
            perf_map_bad_lines: maps.bad_lines,
            perf_maps_truncated: maps.truncated,
            v8_interpreted_frames_unnamed: maps.interpreted_unnamed,
            ..self.stats
        }
    }
}

impl Symbolizer {
    /// Reads the perf maps of the live processes with JIT code (see
    /// `perf_map::PerfMaps::watch`); every second.
    pub fn watch_perf_maps(&mut self, procs: &ProcessTable) {
        self.perf_maps.watch(&procs.live_with_anonymous_code());
    }
}

/// Whether a mapping's name is anonymous memory (JIT code lives there):
/// unnamed, or named by the program (`[anon:NAME]`, Linux 5.17+).
pub(crate) fn is_anonymous(path: &str) -> bool {
    path == crate::procs::process::ANON_NAME || path.starts_with("[anon:")
}

/// Heap bytes of cached lines: the shared empty answer holds none.
fn lines_bytes(lines: &Arc<[Line]>) -> usize {
    if lines.is_empty() {
        return 0;
    }
    // The Arc's counts, the lines, and their strings.
    2 * size_of::<usize>()
        + size_of_val::<[Line]>(lines)
        + lines
            .iter()
            .map(|l| l.function.capacity() + l.file.as_ref().map_or(0, String::capacity))
            .sum::<usize>()
}

/// Heap bytes of blazesym's answer to a lookup (not kept by blazesym).
fn answer_bytes(syms: &[Symbolized<'_>]) -> usize {
    syms.iter()
        .map(|sym| {
            size_of::<Symbolized<'_>>()
                + match sym {
                    Symbolized::Sym(sym) => {
                        sym.name.len()
                            + sym
                                .code_info
                                .as_ref()
                                .map_or(0, |_| size_of::<CodeInfo<'_>>())
                            + sym.inlined.len() * size_of::<bz::InlinedFn<'_>>()
                    }
                    Symbolized::Unknown(_) => 0,
                }
        })
        .sum()
}

/// Lookup addresses: the first as recorded, the others (return addresses)
/// minus one so that they fall in the call instruction.
fn call_sites(addrs: &[u64]) -> Vec<u64> {
    addrs
        .iter()
        .enumerate()
        .map(|(i, &addr)| if i == 0 { addr } else { addr.saturating_sub(1) })
        .collect()
}

/// The mapping of each address; re-reads the process's mappings once if
/// some address falls in none (a library loaded since the snapshot).
fn locate(
    procs: &mut ProcessTable,
    (tgid, generation): (u32, u32),
    addrs: &[u64],
) -> Vec<Option<MappedObject>> {
    procs.ensure(tgid);
    let find =
        |procs: &ProcessTable, addr: u64| procs.get_image(tgid, generation)?.find(addr).cloned();
    let mut found: Vec<_> = addrs.iter().map(|&addr| find(procs, addr)).collect();
    let missing = found
        .iter()
        .zip(addrs)
        .any(|(found, &addr)| found.is_none() && addr != 0);
    // Only the current image can be read again.
    if missing && generation == procs.generation(tgid) && procs.refresh(tgid) {
        for (slot, &addr) in found.iter_mut().zip(addrs) {
            if slot.is_none() {
                *slot = find(procs, addr);
            }
        }
    }
    found
}

fn kernel_symbolizer() -> bz::Symbolizer {
    bz::Symbolizer::builder()
        .enable_code_info(false)
        .enable_demangling(true)
        .build()
}

/// The section layout of `object`, read at its first lookup (`None` when
/// the file's headers cannot be read: no PLT names then, and no section
/// check of symbols without a size).
fn layout_of<'a>(
    layouts: &'a mut Lru<ObjKey, Option<ObjectLayout>>,
    key: &ObjKey,
    object: &ObjectFile,
    path: &Path,
) -> Option<&'a mut ObjectLayout> {
    if layouts.get(key).is_none() {
        let layout = ObjectLayout::read(path)
            .inspect_err(|err| {
                debug!(%err, build_id = object.build_id().map(|id| &**id), "no section layout")
            })
            .ok();
        let bytes = layout.as_ref().map_or(0, ObjectLayout::heap_bytes);
        layouts.insert(key.clone(), layout, bytes);
    }
    layouts.get(key)?.as_mut()
}

/// Whether the symbol blazesym found covers the address asked for: within
/// its size when it has one; else (a symbol without a size, which blazesym
/// stretches up to the next symbol) in the same code section, so that
/// `_init` never takes the addresses of the sections after `.init`.
fn covers(sym: &Symbolized<'_>, layout: Option<&ObjectLayout>) -> bool {
    let Symbolized::Sym(sym) = sym else {
        return true;
    };
    match sym.size {
        Some(size) if size > 0 => sym.offset < size,
        _ => layout.is_none_or(|layout| {
            layout.same_section(sym.addr, sym.addr.wrapping_add(sym.offset as u64))
        }),
    }
}

/// Lines of one symbolized address, innermost inlined function first.
fn lines_of(sym: &Symbolized<'_>, empty: &Arc<[Line]>) -> Arc<[Line]> {
    let Symbolized::Sym(sym) = sym else {
        return Arc::clone(empty);
    };
    // blazesym lists the function first, then inlined calls outermost
    // first, each with the location inside that function.
    let outer = std::iter::once(line(&sym.name, sym.code_info.as_deref()));
    let inlined = sym
        .inlined
        .iter()
        .map(|inlined| line(&inlined.name, inlined.code_info.as_ref()));
    let mut lines: Vec<Line> = outer.chain(inlined).collect();
    lines.reverse();
    lines.into()
}

/// `lines` with their outermost function (the symbol's, not one inlined
/// in it) named `name`, if given.
fn named_as(lines: Arc<[Line]>, name: Option<&str>) -> Arc<[Line]> {
    let Some(name) = name else {
        return lines;
    };
    let mut lines = lines.to_vec();
    if let Some(outer) = lines.last_mut() {
        outer.function = name.to_string();
    }
    lines.into()
}

fn line(function: &str, code_info: Option<&CodeInfo<'_>>) -> Line {
    Line {
        function: function.to_owned(),
        file: code_info.map(|info| info.to_path().to_string_lossy().into_owned()),
        line: code_info.and_then(|info| info.line).unwrap_or(0),
    }
}

/// Hex GNU build ID of the running kernel, from its ELF notes.
fn kernel_build_id() -> Option<String> {
    let notes = match std::fs::read(KERNEL_NOTES) {
        Ok(notes) => notes,
        Err(err) => {
            debug!(%err, "no kernel build ID: cannot read {KERNEL_NOTES}");
            return None;
        }
    };
    let endian = object::Endianness::default();
    let mut iter = NoteIterator::<FileHeader64<object::Endianness>>::new(endian, 4, &notes).ok()?;
    while let Ok(Some(note)) = iter.next() {
        if note.name() == ELF_NOTE_GNU && note.n_type(endian) == NT_GNU_BUILD_ID {
            return Some(hex(note.desc()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn code_addr(f: fn() -> u64) -> u64 {
        f as usize as u64
    }

    fn getpid_addr() -> u64 {
        let getpid: unsafe extern "C" fn() -> libc::pid_t = libc::getpid;
        getpid as usize as u64
    }

    #[inline(never)]
    fn symbolize_marker() -> u64 {
        std::hint::black_box(7)
    }

    /// The address of an instruction inside an inlined function.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn inlined_probe() -> u64 {
        let ip: u64;
        // SAFETY: reads the instruction pointer; touches no memory.
        unsafe { std::arch::asm!("lea {0}, [rip]", out(reg) ip) };
        std::hint::black_box(ip)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn inlining_caller() -> u64 {
        inlined_probe()
    }

    /// The address of `name` in kallsyms and every name at that address.
    fn kallsyms_entry(name: &str) -> Option<(u64, Vec<String>)> {
        let text = std::fs::read_to_string(KALLSYMS).ok()?;
        let entries: Vec<(u64, &str)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
                let _kind = fields.next()?;
                Some((addr, fields.next()?))
            })
            .collect();
        let addr = entries.iter().find(|(_, n)| *n == name)?.0;
        let names = entries
            .iter()
            .filter(|(a, _)| *a == addr)
            .map(|(_, n)| (*n).to_owned())
            .collect();
        Some((addr, names))
    }

    fn outermost(frame: &Frame) -> &Line {
        frame.lines.last().expect("symbolized")
    }

    #[test]
    fn own_function_has_name_file_and_line() {
        let pid = std::process::id();
        let mut procs = ProcessTable::new(16);
        let mut sym = Symbolizer::new().unwrap();
        let addr = code_addr(symbolize_marker);
        let frames = sym.user_stack(&mut procs, pid, &[addr, addr + 1]);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].address, addr);
        assert_eq!(
            frames[1].address, addr,
            "return addresses are looked up minus one"
        );
        let line = outermost(&frames[0]);
        assert!(line.function.contains("symbolize_marker"), "{line:?}");
        assert!(
            line.file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbolize/mod.rs")),
            "{line:?}"
        );
        assert!(line.line > 0);
        let mapping = frames[0].mapping.as_ref().unwrap();
        assert!(mapping.build_id.is_some());
        // The same offset again comes from the cache.
        let hits = sym.stats().cache_hits;
        let again = sym.user_stack(&mut procs, pid, &[addr]);
        assert_eq!(again[0].lines, frames[0].lines);
        assert_eq!(sym.stats().cache_hits, hits + 1);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn inlined_frames_come_leaf_first() {
        let pid = std::process::id();
        let mut procs = ProcessTable::new(16);
        let mut sym = Symbolizer::new().unwrap();
        let ip = inlining_caller();
        let frames = sym.user_stack(&mut procs, pid, &[ip]);
        let names: Vec<&str> = frames[0]
            .lines
            .iter()
            .map(|l| l.function.as_str())
            .collect();
        assert!(names.len() >= 2, "{names:?}");
        assert!(names[0].contains("inlined_probe"), "{names:?}");
        assert!(
            names[names.len() - 1].contains("inlining_caller"),
            "{names:?}"
        );
        assert!(
            frames[0]
                .lines
                .iter()
                .all(|l| l.line > 0 && l.file.is_some())
        );
    }

    #[test]
    fn libc_function() {
        let pid = std::process::id();
        let mut procs = ProcessTable::new(16);
        let mut sym = Symbolizer::new().unwrap();
        let addr = getpid_addr();
        let frames = sym.user_stack(&mut procs, pid, &[addr]);
        assert!(
            outermost(&frames[0]).function.contains("getpid"),
            "{:?}",
            frames[0]
        );
        let mapping = frames[0].mapping.as_ref().unwrap();
        assert!(mapping.path.contains("libc"), "{mapping:?}");
    }

    /// glibc's allocator has several names at one address (`malloc`,
    /// `__libc_malloc`, and in its debug file `__GI___libc_malloc`): each
    /// is named as perf names it (`perf report --sort sym` of a loop of
    /// malloc, free and calloc on Debian 12's glibc 2.36 with its debug
    /// file: `malloc`, `cfree@GLIBC_2.2.5`, `__libc_calloc`), among the
    /// names a user writes: `free`, not the versioned compatibility name.
    #[test]
    fn aliased_functions_get_perf_s_name() {
        let pid = std::process::id();
        let mut procs = ProcessTable::new(16);
        let mut sym = Symbolizer::new().unwrap();
        let addrs = [
            libc::malloc as *const () as u64 + 1,
            libc::free as *const () as u64 + 1,
            libc::calloc as *const () as u64 + 1,
        ];
        let frames = sym.user_stack(&mut procs, pid, &addrs);
        let names: Vec<&str> = frames
            .iter()
            .map(|f| outermost(f).function.as_str())
            .collect();
        assert!(
            names[0] == "malloc" && names[1] == "free" && names[2] == "__libc_calloc",
            "{names:?}: {frames:?}"
        );
    }

    #[test]
    fn vdso_functions() {
        let pid = std::process::id();
        let mut procs = ProcessTable::new(16);
        let mut sym = Symbolizer::new().unwrap();
        procs.ensure(pid);
        let vdso = procs
            .get(pid)
            .unwrap()
            .mappings()
            .iter()
            .find(|m| m.mapping.path == "[vdso]")
            .expect("a vDSO")
            .clone();
        assert!(vdso.object.is_some() && vdso.mapping.build_id.is_some());
        let addrs: Vec<u64> = (vdso.mapping.start..vdso.mapping.limit)
            .step_by(16)
            .collect();
        let mut names = HashSet::new();
        for chunk in addrs.chunks(100) {
            for frame in sym.user_stack(&mut procs, pid, chunk) {
                names.extend(frame.lines.iter().map(|l| l.function.clone()));
            }
        }
        assert!(
            names.iter().any(|n| n.contains("clock_gettime")),
            "{names:?}"
        );
    }

    #[test]
    fn unknown_addresses_and_processes() {
        let pid = std::process::id();
        let mut procs = ProcessTable::new(16);
        let mut sym = Symbolizer::new().unwrap();
        let frames = sym.user_stack(&mut procs, pid, &[0, 8, u64::MAX]);
        assert_eq!(frames.len(), 3);
        assert!(
            frames
                .iter()
                .all(|f| f.mapping.is_none() && f.lines.is_empty())
        );
        let frames = sym.user_stack(&mut procs, u32::MAX, &[0x1000]);
        assert!(frames[0].mapping.is_none());
        assert!(sym.user_stack(&mut procs, pid, &[]).is_empty());
        assert_eq!(sym.stats().unmapped, 4);
    }

    #[test]
    fn kernel_function() {
        let mut sym = Symbolizer::new().unwrap();
        let (addr, names) = kallsyms_entry("__x64_sys_getpid")
            .or_else(|| kallsyms_entry("do_sys_openat2"))
            .expect("a known kernel symbol");
        // Aliases share an address (__do_sys_getpid); any of them will do.
        let frames = sym.kernel_stack(&[addr + 1, addr + 2]);
        assert_eq!(frames.len(), 2);
        for frame in &frames {
            let name = &outermost(frame).function;
            assert!(names.contains(name), "{name} not in {names:?}");
            assert_eq!(frame.mapping.as_ref().unwrap().path, KERNEL_MAPPING_NAME);
        }
        assert_eq!(frames[1].address, addr + 1);
        let hits = sym.stats().cache_hits;
        sym.kernel_stack(&[addr + 1]);
        assert_eq!(sym.stats().cache_hits, hits + 1);
    }

    #[test]
    fn after_the_process_exited() {
        let me = std::process::id();
        let mut procs = ProcessTable::new(16);
        assert!(procs.snapshot(me));
        let getpid = getpid_addr();
        let own = procs.get(me).unwrap().find(getpid).unwrap().clone();
        let offset = own.file_offset(getpid);

        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let child_pid = child.id();
        crate::procs::process::tests::wait_for_mapping(child_pid, "libc.so");
        let mut children = ProcessTable::new(16);
        assert!(children.snapshot(child_pid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!std::path::Path::new(&format!("/proc/{child_pid}")).exists());

        // The same libc file, mapped in the child: the segment holding `offset`.
        let info = children.get(child_pid).unwrap();
        let theirs = info
            .mappings()
            .iter()
            .find(|m| {
                m.mapping.path == own.mapping.path
                    && m.mapping.file_offset <= offset
                    && offset - m.mapping.file_offset < m.mapping.limit - m.mapping.start
            })
            .expect("the child maps the same libc");
        let addr = theirs.mapping.start + (offset - theirs.mapping.file_offset);
        children.mark_exited(child_pid);

        let mut sym = Symbolizer::new().unwrap();
        let frames = sym.user_stack(&mut children, child_pid, &[addr]);
        assert!(
            outermost(&frames[0]).function.contains("getpid"),
            "{:?}",
            frames[0]
        );
    }

    #[test]
    fn releases_files_of_dropped_processes() {
        let pid = std::process::id();
        let mut sym = Symbolizer::new().unwrap();
        {
            let mut procs = ProcessTable::new(4);
            let frames = sym.user_stack(&mut procs, pid, &[getpid_addr()]);
            assert!(!frames[0].lines.is_empty());
            sym.release_unused();
            assert_eq!(sym.files.len(), 1, "still mapped by a snapshot");
        }
        sym.release_unused();
        assert!(sym.files.is_empty());
    }

    /// A child killed and reaped when the test ends, also when it fails.
    struct KillOnDrop(std::process::Child);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Addresses in PLT stubs of a live process, in every layout gcc and
    /// ld make, are named as objdump labels them (`memcpy@plt`), not
    /// charged to `_init`, the symbol before the PLT.
    #[test]
    fn plt_stubs_of_a_process_are_named() {
        use crate::stacks::plt::tests::{Label, VARIANTS, build_variant, objdump_plt_labels};
        use std::io::BufRead as _;
        let dir = tempfile::tempdir().unwrap();
        let mut sym = Symbolizer::new().unwrap();
        let mut named = 0;
        for (variant, flags) in VARIANTS {
            let (lib, main) = build_variant(dir.path(), variant, flags);
            let mut child = KillOnDrop(
                Command::new(&main)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            // It prints once the library is loaded and called.
            let mut line = String::new();
            std::io::BufReader::new(child.0.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let pid = child.0.id();
            let mut procs = ProcessTable::new(16);
            assert!(procs.snapshot(pid));
            for path in [&lib, &main] {
                let path = path.canonicalize().unwrap();
                let mappings: Vec<MappedObject> = procs
                    .get(pid)
                    .unwrap()
                    .mappings()
                    .iter()
                    .filter(|m| std::path::Path::new(&m.mapping.path) == path)
                    .cloned()
                    .collect();
                for (offset, label) in objdump_plt_labels(&path) {
                    let m = mappings
                        .iter()
                        .find(|m| {
                            offset.wrapping_sub(m.mapping.file_offset)
                                < m.mapping.limit - m.mapping.start
                        })
                        .unwrap_or_else(|| panic!("{offset:#x} of {} is mapped", path.display()));
                    let addr = m.mapping.start + offset - m.mapping.file_offset;
                    let frames = sym.user_stack(&mut procs, pid, &[addr]);
                    let got = frames[0].lines.first().map(|l| l.function.as_str());
                    let want = match &label {
                        Label::Stub(name) => name.as_str(),
                        Label::Header => ".plt",
                        Label::Ifunc(_) => continue,
                    };
                    assert_eq!(
                        got,
                        Some(want),
                        "{variant}: {} at {offset:#x}",
                        path.display()
                    );
                    named += 1;
                }
            }
        }
        assert!(named > 40, "{named} PLT addresses named");
        assert!(sym.stats().plt_stubs > 0);
    }

    /// A symbol covers an address within its size; one without a size
    /// only in its own section.
    #[test]
    fn symbols_cover_only_what_they_span() {
        use blazesym::symbolize::Sym;
        let sym = |addr: u64, offset: usize, size: Option<usize>| {
            Symbolized::Sym(Sym {
                name: "f".into(),
                module: None,
                addr,
                offset,
                size,
                code_info: None,
                inlined: Box::new([]),
                _non_exhaustive: (),
            })
        };
        assert!(covers(&sym(0x1000, 0, Some(16)), None));
        assert!(covers(&sym(0x1000, 15, Some(16)), None));
        assert!(!covers(&sym(0x1000, 16, Some(16)), None));
        assert!(!covers(&sym(0x1000, 4096, Some(16)), None));
        assert!(
            covers(&sym(0x1000, 4096, None), None),
            "no layout: no check"
        );
        assert!(covers(&Symbolized::Unknown(Reason::MissingSyms), None));

        // `_init` (no size, in .init) stretched into .plt.
        let dir = tempfile::tempdir().unwrap();
        let (lib, _) = crate::stacks::plt::tests::build_variant(dir.path(), "lazy", &[]);
        let data = std::fs::read(&lib).unwrap();
        let file = object::File::parse(&*data).unwrap();
        use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
        let init = file.symbols().find(|s| s.name() == Ok("_init")).unwrap();
        let plt = file.section_by_name(".plt").unwrap();
        let text = file.section_by_name(".text").unwrap();
        let layout = ObjectLayout::read(&lib).unwrap();
        let into = |target: u64| (target - init.address()) as usize;
        assert_eq!(init.size(), 0);
        assert!(covers(&sym(init.address(), 4, None), Some(&layout)));
        assert!(!covers(
            &sym(init.address(), into(plt.address() + 16), None),
            Some(&layout)
        ));
        assert!(!covers(
            &sym(init.address(), into(text.address()), None),
            Some(&layout)
        ));
        assert!(covers(&sym(text.address(), 8, None), Some(&layout)));
    }

    /// A small budget: the caches stay within it, entries are dropped
    /// least recently used first and counted, and every answer after
    /// eviction and reload is the answer before.
    #[test]
    fn caches_stay_within_the_budget_and_answers_do_not_change() {
        let pid = std::process::id();
        let mut procs = ProcessTable::new(16);
        procs.ensure(pid);
        let libc = procs.get(pid).unwrap().find(getpid_addr()).unwrap().clone();
        let step = (libc.mapping.limit - libc.mapping.start) / 400;
        let addrs: Vec<u64> = (0..400).map(|i| libc.mapping.start + step * i).collect();
        let names = |sym: &mut Symbolizer, procs: &mut ProcessTable| -> Vec<Vec<Line>> {
            addrs
                .chunks(20)
                .flat_map(|a| sym.user_stack(procs, pid, a))
                .map(|frame| frame.lines.to_vec())
                .collect()
        };
        let mut roomy = Symbolizer::with_budget(MemoryBudget::new(1 << 40)).unwrap();
        let want = names(&mut roomy, &mut procs);
        let stats = roomy.budget.stats();
        assert_eq!(stats.total_evictions(), 0, "{stats:?}");
        assert!(want.iter().filter(|lines| !lines.is_empty()).count() > 300);

        // Half of what the results need (and less than the parsed file):
        // both are dropped by use.
        let budget = MemoryBudget::new(stats.bytes[0] as usize / 2);
        let mut small = Symbolizer::with_budget(budget.clone()).unwrap();
        for round in 0..2 {
            let got = names(&mut small, &mut procs);
            assert_eq!(got, want, "round {round}: answers changed under eviction");
            // The parsed files a window used go when it is written.
            small.enforce_budget();
            assert!(
                budget.total() <= budget.limit(),
                "{} over {}",
                budget.total(),
                budget.limit()
            );
        }
        let stats = budget.stats();
        assert!(stats.evictions[0] > 0, "{stats:?}");
        assert!(stats.evictions[2] > 0, "{stats:?}");
        assert_eq!(small.stats().cache_evictions, stats.evictions[0]);
        assert_eq!(stats.bytes[0] as usize, small.cache.bytes());
        assert_eq!(stats.bytes[2] as usize, small.files.bytes());
        // The most recently used result is still cached.
        let last = addrs[addrs.len() - 1] - 1;
        let hits = small.stats().cache_hits;
        small.user_stack(&mut procs, pid, &[last]);
        assert_eq!(small.stats().cache_hits, hits + 1);
    }

    /// Parsed files are charged and let go: evicting one frees blazesym's
    /// state, and it is parsed again when needed.
    #[test]
    fn parsed_files_are_charged_and_evicted_by_use() {
        let pid = std::process::id();
        let mut procs = ProcessTable::new(16);
        let mut sym = Symbolizer::new().unwrap();
        let frames = sym.user_stack(&mut procs, pid, &[getpid_addr()]);
        assert!(!frames[0].lines.is_empty());
        assert_eq!(sym.files.len(), 1);
        let frames = sym.user_stack(&mut procs, pid, &[code_addr(symbolize_marker)]);
        assert!(!frames[0].lines.is_empty());
        assert_eq!(sym.files.len(), 2);
        // libc was used first: it goes first.
        let (key, _) = sym.files.pop_lru().unwrap();
        let libc_id = procs.get(pid).unwrap().find(getpid_addr()).unwrap();
        assert_eq!(key, FileKey::Object(libc_id.object.as_ref().unwrap().id()));
    }

    #[test]
    fn kernel_build_id_is_hex() {
        if let Some(id) = kernel_build_id() {
            assert!(
                id.len() >= 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
                "{id}"
            );
        }
    }

    /// Costs; run with `--ignored --nocapture`.
    #[test]
    #[ignore]
    fn measure_costs() {
        fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
            let start = Instant::now();
            let out = f();
            println!("{what}: {:?}", start.elapsed());
            out
        }
        fn spread(m: &MappedObject, shift: u64) -> Vec<u64> {
            let step = (m.mapping.limit - m.mapping.start) / 1000;
            (0..1000)
                .map(|i| m.mapping.start + step * i + shift)
                .collect()
        }
        fn run(sym: &mut Symbolizer, procs: &mut ProcessTable, pid: u32, addrs: &[u64]) {
            for chunk in addrs.chunks(20) {
                sym.user_stack(procs, pid, chunk);
            }
        }

        let pid = std::process::id();
        let mut procs = ProcessTable::new(64);
        timed("first snapshot of self", || assert!(procs.snapshot(pid)));
        timed("100 re-snapshots of self (files shared)", || {
            for _ in 0..100 {
                assert!(procs.snapshot(pid));
            }
        });
        let info = procs.get(pid).unwrap();
        println!("executable mappings: {}", info.mappings().len());
        let exe = info.find(code_addr(symbolize_marker)).unwrap().clone();
        let libc = info.find(getpid_addr()).unwrap().clone();

        let mut sym = Symbolizer::new().unwrap();
        for (name, m) in [("test binary", &exe), ("libc", &libc)] {
            let addrs = spread(m, 0);
            timed(&format!("{name}: first lookup (opens and indexes)"), || {
                sym.user_stack(&mut procs, pid, &addrs[..1])
            });
            timed(&format!("{name}: 1000 uncached, stacks of 20"), || {
                run(&mut sym, &mut procs, pid, &addrs)
            });
            timed(&format!("{name}: 1000 cached, stacks of 20"), || {
                run(&mut sym, &mut procs, pid, &addrs)
            });
            let near = spread(m, 8);
            timed(&format!("{name}: 1000 uncached in parsed units"), || {
                run(&mut sym, &mut procs, pid, &near)
            });
            println!("{:?}", sym.stats());
        }

        let text = std::fs::read_to_string(KALLSYMS).unwrap();
        let kaddrs: Vec<u64> = text
            .lines()
            .filter_map(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
            .step_by(100)
            .take(1000)
            .collect();
        let mut sym = timed("Symbolizer::new (loads kallsyms)", || {
            Symbolizer::new().unwrap()
        });
        for what in ["kernel: 1000 uncached", "kernel: 1000 cached"] {
            timed(what, || {
                for chunk in kaddrs.chunks(20) {
                    sym.kernel_stack(chunk);
                }
            });
        }
        println!("{:?} {:?}", sym.stats(), procs.stats());
        // kallsyms parsed, and nothing else: what the parsed files hold.
        println!(
            "kallsyms parsed: {} bytes",
            sym.budget.bytes(Cache::SymbolFiles)
        );
    }
}
