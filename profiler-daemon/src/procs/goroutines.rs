//! The live goroutines of a Go process, read from its memory at a window's
//! end, as Go's own goroutine profile lists them
//! (`runtime.goroutineProfileWithLabels`): every goroutine of `runtime.allgs`
//! that is not dead and not one of the runtime's own, with its stack, its
//! state, the reason it waits and its pprof labels.
//!
//! Read from outside, without stopping the process: a parked goroutine's
//! saved registers (`g.sched`) do not change while it stays parked, so its
//! stack is exact; a goroutine running at that moment has no saved stack
//! (Go clears it, or keeps the registers of its last system call, which
//! are not its stack) and is reported as running, without frames. A
//! goroutine in a system call keeps the registers it entered it with; Go
//! 1.22 and before save no frame pointer there, so it is found from the
//! SP delta of the function that made the call (the pclntab).
//!
//! Where things are comes from the executable: `runtime.allgs` from its
//! symbol table, or in a stripped binary from the code of
//! `runtime.forEachG` (found through the pclntab), which loads the slice's
//! pointer and length from two adjacent words; the runtime's functions,
//! whose goroutines Go leaves out, from the pclntab. The `g` fields are
//! per Go release, from the DWARF of a binary built by each release read.

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use foldhash::HashMap;
use object::{Object, ObjectSymbol};
use profiler_common::go_labels_form;

use crate::model::go_buildinfo;
use crate::model::go_pclntab::{Pclntab, PclntabSection, sp_delta_in_file};
use crate::model::text::display_name;
use crate::procs::go_code;
use crate::procs::go_runtime::{first_segment, g_status, load_bias_of, runtime_layout};
use crate::procs::memory::Memory;

/// Goroutines read at most per process and window; the rest are counted
/// (`GoroutineStats::not_read`).
pub const MAX_GOROUTINES: usize = 65_536;
/// Frames read at most per goroutine.
pub const MAX_FRAMES: usize = 128;
/// Labels read at most per goroutine, and bytes per key or value.
const MAX_LABELS: usize = 64;
const MAX_LABEL_BYTES: usize = 1024;
/// Go executables whose facts are kept (the table is emptied when full):
/// a few KiB each (their runtime functions' entries).
const EXECUTABLES_KEPT: usize = 256;
/// Executables known not to be Go (16 bytes each; emptied when full), so
/// that a node's other software is looked at once, not every window.
const NOT_GO_KEPT: usize = 16_384;

/// `_Gscan`: set on a status while the collector scans the goroutine.
const G_SCAN: u32 = 0x1000;
/// Goroutine states (`runtime/runtime2.go`).
pub mod status {
    pub const IDLE: u32 = 0;
    pub const RUNNABLE: u32 = 1;
    pub const RUNNING: u32 = 2;
    pub const SYSCALL: u32 = 3;
    pub const WAITING: u32 = 4;
    pub const DEAD: u32 = 6;
    pub const COPYSTACK: u32 = 8;
    pub const PREEMPTED: u32 = 9;
}

/// Where a release keeps what is read of a goroutine (`runtime.g`), in
/// bytes from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoroutineLayout {
    pub status: usize,
    pub wait_reason: usize,
    /// `g.trackingSeq`: a byte the runtime adds one to each time the
    /// goroutine stops running (`casgstatus`), so each park has its own.
    pub tracking_seq: usize,
    pub start_pc: usize,
    pub labels: usize,
    pub labels_form: u8,
    /// `g.sched.sp`, `.pc` and `.bp`.
    pub sched_sp: usize,
    pub sched_pc: usize,
    pub sched_bp: usize,
}

impl GoroutineLayout {
    /// Bytes of a `g` read: up to the last field used.
    pub fn span(&self) -> usize {
        [
            self.status + 4,
            self.wait_reason + 1,
            self.tracking_seq + 1,
            self.start_pc + 8,
            self.labels + 8,
            self.sched_bp + 8,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }
}

/// The layout of release 1.`minor`, from the DWARF of a binary built by
/// each of go1.19.8, 1.21.13, 1.22.10, 1.23.9, 1.24.11, 1.25.5, 1.26.6 and
/// 1.27.3 (`g.sched` at 56 in all; `gobuf.bp` at 48 until 1.24 and at 40
/// from 1.25, which dropped `gobuf.ret`; checked against each by
/// `model/go_dwarf.rs`). None for a release not read, 1.18 and 1.20
/// included.
pub fn goroutine_layout(minor: u32) -> Option<GoroutineLayout> {
    let status = usize::from(g_status(minor)?);
    let (wait_reason, tracking_seq, start_pc, sched_bp) = match minor {
        19 => (176, 189, 312, 48),
        21 => (176, 188, 296, 48),
        22 => (176, 191, 296, 48),
        23..=24 => (184, 199, 304, 48),
        25 => (176, 191, 296, 40),
        26..=27 => (176, 191, 304, 40),
        _ => return None,
    };
    let labels = runtime_layout(minor);
    Some(GoroutineLayout {
        status,
        wait_reason,
        tracking_seq,
        start_pc,
        labels: usize::from(labels.g_labels),
        labels_form: labels.labels_form,
        sched_sp: 56,
        sched_pc: 56 + 8,
        sched_bp: 56 + sched_bp,
    })
}

/// A goroutine's pprof labels, sorted by key.
pub type Labels = Arc<Vec<(String, String)>>;

/// One goroutine as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Goroutine {
    /// One of [`status`] (without `_Gscan`).
    pub status: u32,
    /// The `waitReason` number (meaningful while waiting).
    pub wait_reason: u8,
    /// Its stack, leaf first, as a frame-pointer walk gives it: the leaf
    /// within its instruction, then return addresses; empty while it runs.
    pub frames: Vec<u64>,
    /// Its pprof labels, sorted by key (None: it has none).
    pub labels: Option<Labels>,
}

/// Why a process's goroutines were not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unread {
    /// Not a Go executable (or it cannot be read).
    NotGo,
    /// A Go release whose layout is not known.
    UnknownRelease,
    /// `runtime.allgs` was not found.
    NoGoroutineList,
    /// Its memory could not be read (it exited).
    Gone,
}

/// What the reader counts, for the exit summary.
#[derive(Clone, Copy, Debug, Default)]
pub struct GoroutineStats {
    /// Goroutines read (counted in a profile).
    pub read: u64,
    /// Goroutines beyond [`MAX_GOROUTINES`], or whose `g` could not be read.
    pub not_read: u64,
    /// Windows in which a Go process went unread: its release's layout is
    /// not known.
    pub unknown_release: u64,
    /// Windows in which a Go process went unread: its goroutine list was
    /// not found.
    pub no_goroutine_list: u64,
}

/// What is read once per executable.
struct Executable {
    /// The Go release's minor number.
    release: u32,
    layout: GoroutineLayout,
    /// `runtime.allgs` in the file's addresses.
    allgs: u64,
    /// Where the pclntab is, for a release whose goroutines in a system
    /// call have no frame pointer saved ([`SYSCALL_BP_SAVED`]).
    pclntab: Option<PclntabSection>,
    /// The address of the segment that maps the start of the file.
    first_segment: u64,
    /// Entries of the runtime's own functions (`runtime.*` but
    /// `runtime.main`), sorted: a goroutine started at one is the
    /// runtime's, and Go's profile leaves it out.
    runtime_starts: Vec<u64>,
}

/// Reads the goroutines of Go processes; keeps each executable's facts.
#[derive(Default)]
pub struct GoroutineReader {
    executables: HashMap<(u64, u64), Result<Arc<Executable>, Unread>>,
    not_go: foldhash::HashSet<(u64, u64)>,
    pub stats: GoroutineStats,
}

impl GoroutineReader {
    /// The goroutines of process `tgid` now, at most [`MAX_GOROUTINES`],
    /// with the minor number of the Go release that built it.
    pub fn read(&mut self, tgid: u32) -> Result<(u32, Vec<Goroutine>), Unread> {
        let exe = self.executable(tgid)?;
        let bias = load_bias_of(tgid, exe.first_segment).ok_or(Unread::Gone)?;
        let mem = Memory::open(tgid).ok_or(Unread::Gone)?;
        let (list, len) = mem.pair(exe.allgs.wrapping_add(bias)).ok_or(Unread::Gone)?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let wanted = len.min(MAX_GOROUTINES);
        self.stats.not_read += (len - wanted) as u64;
        let mut pointers = vec![0u8; wanted * 8];
        if wanted > 0 && !mem.read(list, &mut pointers) {
            return Err(Unread::Gone);
        }
        let pointers: Vec<u64> = pointers
            .chunks_exact(8)
            .map(|p| u64::from_le_bytes(p.try_into().unwrap_or_default()))
            .collect();
        let mut labels = LabelCache::default();
        let mut out = Vec::new();
        // A goroutine in a system call before Go 1.23: its frame pointer
        // from its function's SP delta, in the file's pclntab (read for
        // each such goroutine).
        let path = std::path::PathBuf::from(format!("/proc/{tgid}/exe"));
        let sp_delta = |pc: u64| sp_delta_in_file(&path, exe.pclntab?, pc.wrapping_sub(bias));
        for batch in pointers.chunks(BATCH) {
            self.stats.not_read +=
                read_batch(&mem, &exe, bias, batch, &mut labels, &sp_delta, &mut out);
        }
        self.stats.read += out.len() as u64;
        Ok((exe.release, out))
    }

    /// Where process `tgid`'s release keeps a goroutine's fields.
    pub fn layout(&mut self, tgid: u32) -> Result<GoroutineLayout, Unread> {
        Ok(self.executable(tgid)?.layout)
    }

    /// The facts of process `tgid`'s executable, read once per file.
    fn executable(&mut self, tgid: u32) -> Result<Arc<Executable>, Unread> {
        let meta = std::fs::metadata(format!("/proc/{tgid}/exe")).map_err(|_| Unread::Gone)?;
        let key = (meta.dev(), meta.ino());
        if self.not_go.contains(&key) {
            return Err(Unread::NotGo);
        }
        let exe = match self.executables.get(&key) {
            Some(exe) => exe.clone(),
            None => {
                let exe = read_executable(tgid);
                // Gone before its file was read: nothing learnt of it.
                if exe.as_ref().err() == Some(&Unread::Gone) {
                    return Err(Unread::Gone);
                }
                if exe.as_ref().err() == Some(&Unread::NotGo) {
                    if self.not_go.len() >= NOT_GO_KEPT {
                        self.not_go.clear();
                    }
                    self.not_go.insert(key);
                    return Err(Unread::NotGo);
                }
                if self.executables.len() >= EXECUTABLES_KEPT {
                    self.executables.clear();
                }
                self.executables.insert(key, exe.clone());
                exe
            }
        };
        exe.inspect_err(|why| match why {
            Unread::UnknownRelease => self.stats.unknown_release += 1,
            Unread::NoGoroutineList => self.stats.no_goroutine_list += 1,
            _ => {}
        })
    }
}

/// The labels of a goroutine whose `g.labels` holds `at`, read now.
pub fn labels_at(mem: &Memory, layout: &GoroutineLayout, at: u64) -> Option<Labels> {
    LabelCache::default().get(mem, layout, at)
}

/// Goroutines read per batch: their `g`s in one system call, then their
/// stacks in as few as the byte bound allows.
const BATCH: usize = 256;
/// Bytes of a goroutine's stack read in one piece, from its saved stack
/// pointer up: a walk that leaves them reads word by word.
const STACK_PIECE: usize = 16 * 1024;
/// Bytes of stacks read per system call at most.
const STACKS_PER_READ: usize = 1024 * 1024;

/// A goroutine's registers as its `g` saved them.
struct Parked {
    status: u32,
    wait_reason: u8,
    start: u64,
    sp: u64,
    pc: u64,
    bp: u64,
    /// The top of its stack (`g.stack.hi`).
    stack_hi: u64,
    labels: Option<Labels>,
}

/// From Go 1.23, a goroutine entering a system call saves its frame
/// pointer with its stack pointer and pc (`save(pc, sp, bp)`); before,
/// `g.sched.bp` is whatever its last park left there.
const SYSCALL_BP_SAVED: u32 = 23;

/// The frame pointer of the function that entered a system call at
/// return address `pc` with stack pointer `sp`, its SP delta there being
/// `delta`: Go saves the caller's frame pointer just below the return
/// address, and points its own there. None for a function without a frame.
fn syscall_frame_pointer(sp: u64, delta: Option<u64>) -> Option<u64> {
    sp.checked_add(delta.filter(|&d| d >= 8)?)?.checked_sub(8)
}

/// Reads the goroutines at `pointers` into `out` (those dead or the
/// runtime's left out); returns how many could not be read. `sp_delta`
/// gives the SP delta at a pc of the process, for goroutines in a system
/// call whose frame pointer was not saved.
fn read_batch(
    mem: &Memory,
    exe: &Executable,
    bias: u64,
    pointers: &[u64],
    labels: &mut LabelCache,
    sp_delta: &dyn Fn(u64) -> Option<u64>,
    out: &mut Vec<Goroutine>,
) -> u64 {
    let layout = &exe.layout;
    let span = layout.span();
    let mut bytes = Vec::new();
    let ranges: Vec<(u64, usize)> = pointers.iter().map(|&at| (at, span)).collect();
    let read = mem.read_many(&ranges, &mut bytes);
    let mut lost = read.iter().filter(|ok| !**ok).count() as u64;
    let mut parked = Vec::with_capacity(pointers.len());
    for (g, _) in bytes.chunks_exact(span).zip(&read).filter(|(_, ok)| **ok) {
        match parse_g(mem, exe, bias, g, labels) {
            Some(Ok(mut p)) => {
                match p.status {
                    // Running: Go keeps no registers for it, or those saved
                    // when it last entered a system call (left as they were
                    // when it came back without being descheduled), which
                    // are not its stack.
                    status::RUNNING => p.sp = 0,
                    status::SYSCALL if exe.release < SYSCALL_BP_SAVED => {
                        p.bp = syscall_frame_pointer(p.sp, sp_delta(p.pc)).unwrap_or(0);
                    }
                    _ => {}
                }
                parked.push(p)
            }
            Some(Err(())) => lost += 1,
            None => {}
        }
    }
    // Their stacks, each from its saved stack pointer up.
    let mut from = 0;
    while from < parked.len() {
        let mut ranges = Vec::new();
        let mut total = 0;
        for p in &parked[from..] {
            let len = match p.sp {
                0 => 0,
                sp => usize::try_from(p.stack_hi.saturating_sub(sp))
                    .unwrap_or(0)
                    .min(STACK_PIECE),
            };
            if total + len > STACKS_PER_READ && !ranges.is_empty() {
                break;
            }
            total += len;
            ranges.push((p.sp, len));
        }
        let mut stacks = Vec::new();
        let read = mem.read_many(&ranges, &mut stacks);
        let mut at = 0;
        for ((p, &(sp, len)), ok) in parked[from..].iter().zip(&ranges).zip(read) {
            let piece = StackPiece {
                base: sp,
                bytes: if ok { &stacks[at..at + len] } else { &[] },
            };
            at += len;
            let frames = match p.sp {
                // Running (above).
                0 => Vec::new(),
                _ => walk(mem, &piece, p.pc, p.sp, p.bp, p.pc == p.start),
            };
            out.push(Goroutine {
                status: p.status,
                wait_reason: p.wait_reason,
                frames,
                labels: p.labels.clone(),
            });
        }
        from += ranges.len();
    }
    lost
}

/// The registers of the goroutine in `g`'s bytes: None when it is dead or
/// the runtime's; an error when its fields cannot be read.
fn parse_g(
    mem: &Memory,
    exe: &Executable,
    bias: u64,
    g: &[u8],
    labels: &mut LabelCache,
) -> Option<Result<Parked, ()>> {
    let layout = &exe.layout;
    let field = |at| u64_at(g, at).ok_or(());
    let status = match u32_at(g, layout.status) {
        Some(status) => status & !G_SCAN,
        None => return Some(Err(())),
    };
    if matches!(status, status::DEAD | status::IDLE) {
        return None;
    }
    let start = match field(layout.start_pc) {
        Ok(start) => start,
        Err(()) => return Some(Err(())),
    };
    if exe
        .runtime_starts
        .binary_search(&start.wrapping_sub(bias))
        .is_ok()
    {
        return None;
    }
    Some((|| {
        Ok(Parked {
            status,
            wait_reason: g.get(layout.wait_reason).copied().ok_or(())?,
            start,
            sp: field(layout.sched_sp)?,
            pc: field(layout.sched_pc)?,
            bp: field(layout.sched_bp)?,
            stack_hi: field(G_STACK_HI)?,
            labels: labels.get(mem, layout, field(layout.labels)?),
        })
    })())
}

/// `g.stack.hi`: the first field of every release's `g` is its stack's
/// bounds (lo, hi).
const G_STACK_HI: usize = 8;

/// A goroutine's stack as read in one piece from `base` up.
struct StackPiece<'a> {
    base: u64,
    bytes: &'a [u8],
}

impl StackPiece<'_> {
    /// Two adjacent words at `at`, from the piece when it holds them, else
    /// from the process.
    fn pair(&self, mem: &Memory, at: u64) -> Option<(u64, u64)> {
        let inside = at
            .checked_sub(self.base)
            .and_then(|off| usize::try_from(off).ok())
            .filter(|&off| off + 16 <= self.bytes.len());
        match inside {
            Some(off) => Some((u64_at(self.bytes, off)?, u64_at(self.bytes, off + 8)?)),
            None => mem.pair(at),
        }
    }
}

/// The stack of a goroutine parked with `pc`, `sp` and `bp` saved, leaf
/// first: `pc` (a return address, into the function that saved it, unless
/// the goroutine never ran: then its function's entry, and its return
/// address, into `runtime.goexit`, at `sp`), then the return addresses of
/// the frame-pointer chain.
fn walk(
    mem: &Memory,
    piece: &StackPiece<'_>,
    pc: u64,
    sp: u64,
    bp: u64,
    at_entry: bool,
) -> Vec<u64> {
    let mut frames = Vec::with_capacity(32);
    if at_entry {
        frames.push(pc);
        if let Some((ret, _)) = piece.pair(mem, sp) {
            frames.push(ret);
        }
        return frames;
    }
    frames.push(pc.saturating_sub(1));
    push_fp_chain(&mut frames, MAX_FRAMES, bp, |at| piece.pair(mem, at));
    frames
}

/// Appends to `frames`, up to `max` in all, the return addresses of the
/// frame-pointer chain from `bp`: each frame's saved frame pointer and
/// return address, two adjacent words read by `pair`.
pub(crate) fn push_fp_chain(
    frames: &mut Vec<u64>,
    max: usize,
    mut bp: u64,
    pair: impl Fn(u64) -> Option<(u64, u64)>,
) {
    while frames.len() < max && bp != 0 {
        let Some((next, ret)) = pair(bp) else {
            break;
        };
        if ret == 0 {
            break;
        }
        frames.push(ret);
        // The chain runs up the stack; anything else is not a frame.
        if next <= bp {
            break;
        }
        bp = next;
    }
}

/// Label sets by the address `g.labels` holds: goroutines that share a set
/// (those started under one `pprof.Do`) share one reading.
#[derive(Default)]
struct LabelCache {
    sets: HashMap<u64, Option<Labels>>,
}

impl LabelCache {
    fn get(&mut self, mem: &Memory, layout: &GoroutineLayout, at: u64) -> Option<Labels> {
        if at == 0 {
            return None;
        }
        self.sets
            .entry(at)
            .or_insert_with(|| {
                let mut labels = match layout.labels_form {
                    go_labels_form::LIST => list_labels(mem, at),
                    go_labels_form::MAP => map_labels(mem, at),
                    _ => None,
                }?;
                labels.sort();
                Some(Arc::new(labels))
            })
            .clone()
    }
}

/// Go 1.24 and later: `labels` points to a slice of `{key, value string}`.
fn list_labels(mem: &Memory, at: u64) -> Option<Vec<(String, String)>> {
    let (list, len) = mem.pair(at)?;
    let len = usize::try_from(len).ok()?.min(MAX_LABELS);
    let mut entries = vec![0u8; len * 32];
    if !mem.read(list, &mut entries) {
        return None;
    }
    entries
        .chunks_exact(32)
        .map(|entry| {
            Some((
                go_string(mem, u64_at(entry, 0)?, u64_at(entry, 8)?)?,
                go_string(mem, u64_at(entry, 16)?, u64_at(entry, 24)?)?,
            ))
        })
        .collect()
}

/// Go 1.19 to 1.23: `labels` points to a `map[string]string`, itself the
/// address of the map's header (`hmap`: the bucket count's log at 9, the
/// buckets at 16; a bucket holds 8 top hashes, 8 keys, 8 values and the
/// overflow bucket's address, 272 bytes).
fn map_labels(mem: &Memory, at: u64) -> Option<Vec<(String, String)>> {
    /// A slot whose top hash is below this is empty (`minTopHash`).
    const MIN_TOP_HASH: u8 = 5;
    const BUCKET: usize = 272;
    let hmap = mem.u64(at)?;
    let mut header = [0u8; 24];
    if !mem.read(hmap, &mut header) {
        return None;
    }
    // Label maps are small; a larger count is not a label map.
    let log_buckets = header[9].min(4);
    let buckets = u64_at(&header, 16)?;
    let mut labels = Vec::new();
    let mut bucket = [0u8; BUCKET];
    for index in 0..1u64 << log_buckets {
        let mut next = buckets.checked_add(index * BUCKET as u64)?;
        // A bucket and at most a few overflow buckets.
        for _ in 0..4 {
            if next == 0 || !mem.read(next, &mut bucket) {
                break;
            }
            for slot in 0..8 {
                if bucket[slot] < MIN_TOP_HASH || labels.len() >= MAX_LABELS {
                    continue;
                }
                let key = 8 + 16 * slot;
                let value = 8 + 128 + 16 * slot;
                labels.push((
                    go_string(mem, u64_at(&bucket, key)?, u64_at(&bucket, key + 8)?)?,
                    go_string(mem, u64_at(&bucket, value)?, u64_at(&bucket, value + 8)?)?,
                ));
            }
            next = u64_at(&bucket, BUCKET - 8)?;
        }
    }
    Some(labels)
}

/// The facts of process `tgid`'s executable.
fn read_executable(tgid: u32) -> Result<Arc<Executable>, Unread> {
    let file = std::fs::File::open(format!("/proc/{tgid}/exe")).map_err(|_| Unread::Gone)?;
    // SAFETY: a read-only private mapping of an executable file, which is
    // replaced rather than rewritten while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|_| Unread::Gone)?;
    let file = object::File::parse(&*map).map_err(|_| Unread::NotGo)?;
    if !go_buildinfo::is_go(&file) {
        return Err(Unread::NotGo);
    }
    let release = go_buildinfo::go_release(&file).ok_or(Unread::UnknownRelease)?;
    let layout = goroutine_layout(release).ok_or(Unread::UnknownRelease)?;
    let table = Pclntab::of_file(&file).ok_or(Unread::NoGoroutineList)?;
    let allgs = file
        .symbols()
        .find(|s| s.name() == Ok("runtime.allgs"))
        .map(|s| s.address())
        .or_else(|| go_code::allgs(&file, &table))
        .ok_or(Unread::NoGoroutineList)?;
    let mut runtime_starts: Vec<u64> = table
        .functions()
        .filter(|(_, name)| name.starts_with("runtime.") && *name != "runtime.main")
        .map(|(entry, _)| entry)
        .collect();
    runtime_starts.sort_unstable();
    Ok(Arc::new(Executable {
        release,
        layout,
        allgs,
        pclntab: (release < SYSCALL_BP_SAVED)
            .then(|| PclntabSection::of_file(&file))
            .flatten(),
        first_segment: first_segment(&file).ok_or(Unread::NotGo)?,
        runtime_starts,
    }))
}

/// A Go string's text (at most `MAX_LABEL_BYTES`), as every label value
/// is shown.
fn go_string(mem: &Memory, at: u64, len: u64) -> Option<String> {
    let len = usize::try_from(len).ok()?.min(MAX_LABEL_BYTES);
    let mut bytes = vec![0u8; len];
    if len > 0 && !mem.read(at, &mut bytes) {
        return None;
    }
    Some(display_name(&bytes))
}

fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_of_the_releases_read() {
        let l19 = goroutine_layout(19).expect("1.19");
        assert_eq!((l19.status, l19.sched_bp, l19.labels), (144, 104, 360));
        let l25 = goroutine_layout(25).expect("1.25");
        assert_eq!((l25.start_pc, l25.sched_bp), (296, 96));
        assert_eq!(
            goroutine_layout(27).expect("1.27").labels_form,
            go_labels_form::LIST
        );
        assert!(goroutine_layout(20).is_none());
        assert!(goroutine_layout(28).is_none());
        // A read covers the last field.
        assert_eq!(l19.span(), 368);
    }

    /// The layouts are the DWARF of a program built by each release read
    /// (`model/go_dwarf.rs`): the `g` fields, `g.sched` and the `gobuf`'s
    /// sp, pc and bp; no other release has one.
    #[test]
    fn layouts_are_each_release_s_dwarf() {
        use crate::model::go_dwarf;
        go_dwarf::assert_only_releases_read("goroutine_layout", |minor| {
            goroutine_layout(minor).is_some()
        });
        for release in go_dwarf::releases() {
            let at = |ty: &str, member: &str| {
                usize::try_from(release.offset(ty, member)).expect("an offset")
            };
            let sched = at("runtime.g", "sched");
            let dwarf = GoroutineLayout {
                status: at("runtime.g", "atomicstatus"),
                wait_reason: at("runtime.g", "waitreason"),
                tracking_seq: at("runtime.g", "trackingSeq"),
                start_pc: at("runtime.g", "startpc"),
                labels: at("runtime.g", "labels"),
                labels_form: runtime_layout(release.minor).labels_form,
                sched_sp: sched + at("runtime.gobuf", "sp"),
                sched_pc: sched + at("runtime.gobuf", "pc"),
                sched_bp: sched + at("runtime.gobuf", "bp"),
            };
            println!("{}: {dwarf:?}", release.version);
            assert_eq!(
                goroutine_layout(release.minor),
                Some(dwarf),
                "{}",
                release.version
            );
        }
    }

    /// A live process of each release read (`model/go_dwarf.rs`'s program,
    /// parked): its goroutine in a system call and its goroutine on a
    /// channel, each read with its state, its whole stack (to
    /// `runtime.goexit`) and the labels it was started under. Before Go
    /// 1.23 the one in a system call has no frame pointer saved: its
    /// function's SP delta gives it.
    #[test]
    fn each_release_s_goroutines_are_read_live() {
        use std::io::{BufRead, BufReader};
        use std::os::unix::fs::PermissionsExt;
        use std::process::{Command, Stdio};
        use std::time::{Duration, Instant};

        use crate::model::go_dwarf;
        let dir = tempfile::tempdir().expect("a temporary directory");
        for release in go_dwarf::releases() {
            let version = &release.version;
            let exe = dir.path().join(format!("park-1.{}", release.minor));
            std::fs::write(&exe, &release.binary).expect("the program");
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))
                .expect("an executable");
            let mut child = Command::new(&exe)
                .arg("park")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("the program runs");
            let mut line = String::new();
            BufReader::new(child.stdout.take().expect("its output"))
                .read_line(&mut line)
                .expect("its line");
            assert_eq!(line, "ready\n", "{version}");
            let file = object::File::parse(&*release.binary).expect("an ELF file");
            let table = Pclntab::of_file(&file).expect("a pclntab");
            let names = |frames: &[u64]| -> Vec<String> {
                frames
                    .iter()
                    .map(|&pc| {
                        table
                            .lookup_inlined(pc, None)
                            .pop()
                            .map_or_else(|| format!("{pc:#x}"), |line| line.function)
                    })
                    .collect()
            };
            let mut reader = GoroutineReader::default();
            // Started before `ready`, parked soon after.
            let by = Instant::now() + Duration::from_secs(10);
            let (syscall, waiter) = loop {
                let (minor, goroutines) = reader.read(child.id()).expect("its goroutines");
                assert_eq!(minor, release.minor);
                let read: Vec<(u32, Vec<String>, Option<Labels>)> = goroutines
                    .iter()
                    .map(|g| (g.status, names(&g.frames), g.labels.clone()))
                    .collect();
                let at = |function: &str, state: u32| {
                    read.iter()
                        .find(|(status, names, _)| {
                            *status == state && names.iter().any(|n| n == function)
                        })
                        .cloned()
                };
                match (
                    at("main.blockedRead", status::SYSCALL),
                    at("main.chanWait", status::WAITING),
                ) {
                    (Some(syscall), Some(waiter)) => break (syscall, waiter),
                    _ => assert!(Instant::now() < by, "{version}: {read:?}"),
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            println!("{version}: {syscall:?}\n{version}: {waiter:?}");
            drop(child.stdin.take());
            child.wait().expect("the program exits");
            for (_, names, _) in [&syscall, &waiter] {
                assert_eq!(
                    names.last().map(String::as_str),
                    Some("runtime.goexit"),
                    "{version}: {names:?}"
                );
            }
            assert!(
                syscall.1.iter().any(|n| n.starts_with("syscall.")),
                "{version}"
            );
            assert_eq!(syscall.2, None, "{version}: no labels");
            assert_eq!(
                waiter.2.as_deref().map(Vec::as_slice),
                Some(&[("role".to_string(), "waiter".to_string())][..]),
                "{version}"
            );
        }
    }

    #[test]
    fn a_syscall_s_frame_pointer_is_below_its_return_address() {
        // A frame of 0x28 bytes: the caller's frame pointer saved at
        // sp + 0x20, just below the return address at sp + 0x28.
        assert_eq!(syscall_frame_pointer(0x1000, Some(0x28)), Some(0x1020));
        assert_eq!(syscall_frame_pointer(0x1000, Some(0)), None, "no frame");
        assert_eq!(syscall_frame_pointer(0x1000, None), None, "not known");
    }

    #[test]
    fn a_process_that_is_not_go_is_said_so() {
        let mut reader = GoroutineReader::default();
        assert_eq!(reader.read(std::process::id()).err(), Some(Unread::NotGo));
        // Remembered as not Go, apart from the Go executables' facts.
        assert_eq!((reader.not_go.len(), reader.executables.len()), (1, 0));
        assert_eq!(reader.read(std::process::id()).err(), Some(Unread::NotGo));
        assert_eq!(reader.read(u32::MAX - 1).err(), Some(Unread::Gone));
        assert_eq!((reader.not_go.len(), reader.executables.len()), (1, 0));
    }
}
