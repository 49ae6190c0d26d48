//! The pprof labels of the goroutine a Go thread runs, read at a CPU sample
//! as Go's own profiler reads them (and those of a parked goroutine that
//! is readied, for its block sample): the goroutine in R14 (where Go code
//! keeps it), its M, the M's current goroutine (`m.curg`, the one a
//! system-stack sample is charged to), and that goroutine's `labels`.
//! Offsets and the labels' form come from the daemon per process
//! (`GoRuntime`). R14 holds the goroutine only in Go code: the reading is
//! trusted only when the goroutine's own words say it runs here (the
//! sample's stack pointer within its stack, its status running or in a
//! system call), or when the M's current goroutine points back to the
//! same M.
//!
//! A sample carries an id of its label set, a hash of the process and of
//! the labels' string headers (their addresses and lengths); the set's
//! text is recorded in
//! `GO_LABEL_SETS` at the first sample that carries the id, and the daemon
//! takes (and so deletes) the recorded sets every second, so a text is
//! never older than a second.

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::generated,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::{
    GO_LABEL_KEY_BYTES, GO_LABEL_SETS_ENTRIES, GO_LABEL_VALUE_BYTES, GO_LABELS_MAX, GoLabels,
    GoRuntime, counter, go_labels_form,
};

use crate::counters::count;
use crate::globals::{GO_LABEL_MAP_CACHE, GO_LABELS_ONE_READ, global_u8};
use crate::user_memory::read;

/// -EEXIST: another CPU recorded the same set first.
const EEXIST: i32 = -17;

/// Go's `minTopHash`: a map slot whose top hash is below it is empty.
const MIN_TOP_HASH: u64 = 5;

/// Go's goroutine states `_Grunning` and `_Gsyscall`, and `_Gscan`, the
/// bit the collector adds while it scans a goroutine. A thread's `g0` and
/// signal goroutine stay `_Gidle` (0): never taken for the running one.
const G_RUNNING: u32 = 2;
const G_SYSCALL: u32 = 3;
const G_SCAN: u32 = 0x1000;

/// Label maps remembered per CPU (a power of two).
const MAP_CACHE_SLOTS: usize = 16;

/// Label sets by id, as recorded at their first sample since the daemon
/// last took them.
#[map]
static GO_LABEL_SETS: HashMap<u64, GoLabels> =
    HashMap::with_max_entries(GO_LABEL_SETS_ENTRIES, BPF_F_NO_PREALLOC);

/// Per-CPU room for one reading (too big for the 512-byte BPF stack).
#[repr(C)]
struct Scratch {
    /// Per label: key address, key length, value address, value length.
    headers: [[u64; 4]; GO_LABELS_MAX],
    /// One bucket of a `map[string]string`: the top hashes (8 bytes),
    /// 8 keys and 8 values (16 bytes each).
    bucket: [u64; 33],
    /// A goroutine's words from its start through `g.labels` (see
    /// `running_labels`); 64 words of room, `G_SPAN_BYTES` read.
    g_span: [u64; 64],
    /// Label maps (Go 1.23 and before) whose id is known, by the map's
    /// address (see `map_headers`): the process, the map's address, its
    /// header's three words, the id.
    map_cache: [[u64; 6]; MAP_CACHE_SLOTS],
    record: GoLabels,
}

/// Bytes of a goroutine read at once from its start: `g.labels` lies at
/// 344 to 360 in every release the daemon has a layout for.
const G_SPAN_BYTES: u64 = 368;

#[map]
static GO_LABEL_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Reads `len` (at most `room`) bytes of user memory at `src` into `dst`.
///
/// `MASKED` (every read of a length the program was given): the size is
/// also masked into `1..=room` (`room` a power of two) just before the
/// call. Inlined, LLVM compared one copy of the length and passed
/// another, spilled to the stack, and Linux 6.1's verifier, which lost the
/// spilled copy's bounds, refused the program ("R2 min value is
/// negative"): `go_park_probe` first, and `go_sample` too (found when
/// `profilerd --check` began loading it in the 6.1 VM). A mask bounds the
/// register the call takes. Unmasked only for reads of a constant size.
#[inline(always)]
fn read_into<const MASKED: bool>(dst: *mut u8, room: u64, src: u64, len: u64) -> bool {
    let len = if len > room { room } else { len };
    let size = if MASKED {
        // Without a branch: 0 becomes `room`, a read whose bytes count for
        // nothing (the caller keeps `len` of them), where a branch per read
        // multiplied the verifier's paths.
        (len.wrapping_sub(1) & (room - 1)) + 1
    } else {
        len
    };
    // SAFETY: `dst` has `room` bytes and `size` is at most that; the
    // helper checks the source.
    unsafe { generated::bpf_probe_read_user(dst.cast(), size as u32, src as *const _) == 0 }
}

/// The id of the label set of the goroutine that thread-local goroutine
/// `g` (R14) runs for, in process `tgid` at user stack pointer `sp`,
/// recording the set's text if it is new; 0 when there is none or it
/// cannot be read.
///
/// `MASKED` as for [`read_into`] (every caller masks: Linux 6.1's
/// verifier).
#[inline(always)]
pub(crate) fn go_label_set<const MASKED: bool>(go: &GoRuntime, tgid: u32, g: u64, sp: u64) -> u64 {
    if go.labels_form == go_labels_form::NONE {
        return 0;
    }
    try_label_set::<MASKED>(go, tgid, g, sp).unwrap_or(0)
}

#[inline(always)]
fn try_label_set<const MASKED: bool>(go: &GoRuntime, tgid: u32, g: u64, sp: u64) -> Option<u64> {
    // SAFETY: this CPU's scratch slot; nothing else uses it meanwhile.
    let scratch = unsafe { &mut *GO_LABEL_SCRATCH.get_ptr_mut(0)? };
    // One place reads the set, whichever way the goroutine was found: each
    // copy of it would be verified again (Linux 6.1 refused go_sample as
    // too large with three).
    let labels = running_labels(go, g, sp, scratch)?;
    let id = label_set_of::<MASKED>(go, tgid, labels, scratch)?;
    count(counter::GO_LABELED_SAMPLES);
    Some(id)
}

/// The `g.labels` of the goroutine thread-local goroutine `g` runs for.
#[inline(always)]
fn running_labels(go: &GoRuntime, g: u64, sp: u64, scratch: &mut Scratch) -> Option<u64> {
    // One read of R14's goroutine from its start through `g.labels`. Mostly
    // it is the goroutine running here, and its own words say so: the
    // sample's stack pointer lies within its stack and its status is
    // running (or in a system call); then no word of its M is read. On
    // the system stack R14 is the thread's `g0`, which is never running,
    // and the M's current goroutine is the one charged, as Go's profiler
    // charges it. `[debug] go_labels_one_read = false` reads the goroutine,
    // its M and the M's goroutine one by one.
    let (g_m, g_labels, g_status) = (
        u64::from(go.g_m),
        u64::from(go.g_labels),
        u64::from(go.g_status),
    );
    let room = core::mem::size_of_val(&scratch.g_span) as u64;
    if global_u8(&GO_LABELS_ONE_READ) != 0
        && g >= 4096
        && g_m % 8 == 0
        && g_labels % 8 == 0
        && g_labels + 8 <= G_SPAN_BYTES
        && g_status + 4 <= G_SPAN_BYTES
        && read_into::<false>(scratch.g_span.as_mut_ptr().cast(), room, g, G_SPAN_BYTES)
    {
        // Masked, on offsets loaded again (volatile): from the checks above
        // LLVM would drop the masks and index with a copy spilled before
        // them, whose bounds Linux 6.1's verifier does not know ("R2 max
        // value is outside of the allowed memory range").
        // SAFETY: reads of fields of the process's entry.
        let (m_at, labels_at, status_at) = unsafe {
            (
                core::ptr::read_volatile(&go.g_m),
                core::ptr::read_volatile(&go.g_labels),
                core::ptr::read_volatile(&go.g_status),
            )
        };
        let word = |at: u16| scratch.g_span[usize::from(at / 8) & 63];
        let (lo, hi) = (scratch.g_span[0], scratch.g_span[1]);
        let (m, labels, status_word) = (word(m_at), word(labels_at), word(status_at));
        let status = (status_word >> ((g_status % 8) * 8)) as u32 & !G_SCAN;
        if g_status != 0 && lo <= sp && sp < hi && (status == G_RUNNING || status == G_SYSCALL) {
            count(counter::GO_LABELS_OWN_STACK);
            return Some(labels);
        }
        let curg: u64 = read(m.wrapping_add(u64::from(go.m_curg)))?;
        if curg == g {
            return Some(labels);
        }
        return curg_labels(go, m, curg);
    }
    let m: u64 = read(g.wrapping_add(g_m))?;
    let curg: u64 = read(m.wrapping_add(u64::from(go.m_curg)))?;
    curg_labels(go, m, curg)
}

/// The `g.labels` of `curg`, M `m`'s current goroutine, found through R14.
/// R14 may hold anything outside Go code: `curg` is trusted only when it
/// belongs to that M.
#[inline(always)]
fn curg_labels(go: &GoRuntime, m: u64, curg: u64) -> Option<u64> {
    let curg_m: u64 = read(curg.wrapping_add(u64::from(go.g_m)))?;
    if curg_m != m {
        return None;
    }
    read(curg.wrapping_add(u64::from(go.g_labels)))
}

/// The id of the label set of goroutine `g` (a `*g` the runtime passed, of
/// a goroutine parked or about to run), recording the set's text if it is
/// new; 0 when it has none or it cannot be read. For `go_park_probe`.
#[inline(always)]
pub(crate) fn goroutine_label_set(go: &GoRuntime, tgid: u32, g: u64) -> u64 {
    if go.labels_form == go_labels_form::NONE {
        return 0;
    }
    label_set_at::<true>(go, tgid, g).unwrap_or(0)
}

/// The label set of goroutine `g` (see `try_label_set`); `MASKED` as for
/// [`read_into`].
#[inline(always)]
fn label_set_at<const MASKED: bool>(go: &GoRuntime, tgid: u32, g: u64) -> Option<u64> {
    let labels: u64 = read(g.wrapping_add(u64::from(go.g_labels)))?;
    // SAFETY: this CPU's scratch slot; nothing else uses it meanwhile.
    let scratch = unsafe { &mut *GO_LABEL_SCRATCH.get_ptr_mut(0)? };
    label_set_of::<MASKED>(go, tgid, labels, scratch)
}

/// The label set whose `labels` (a goroutine's `g.labels`) is given.
#[inline(always)]
fn label_set_of<const MASKED: bool>(
    go: &GoRuntime,
    tgid: u32,
    labels: u64,
    scratch: &mut Scratch,
) -> Option<u64> {
    if labels == 0 {
        return None;
    }
    // One place hashes and records the headers, whichever form they came
    // in (each copy of it is verified again). The map cache's slot to
    // complete with the id, if any (`MAP_CACHE_SLOTS`: none).
    let (cut, fill) = if go.labels_form == go_labels_form::LIST {
        (list_headers::<MASKED>(labels, scratch)?, MAP_CACHE_SLOTS)
    } else {
        match map_headers(tgid, labels, scratch)? {
            MapRead::Known(id) => return Some(id),
            MapRead::Headers { cut, slot } => (cut, slot),
        }
    };
    let id = known_set::<MASKED>(tgid, scratch, cut)?;
    if fill < MAP_CACHE_SLOTS {
        scratch.map_cache[fill & (MAP_CACHE_SLOTS - 1)][5] = id;
    }
    Some(id)
}

/// What [`map_headers`] found.
enum MapRead {
    /// A map known by its header: its set's id (recorded).
    Known(u64),
    /// The map's first bucket in the headers, whether the set is cut, and
    /// the cache slot that awaits its id (`MAP_CACHE_SLOTS`: none).
    Headers { cut: bool, slot: usize },
}

/// Go 1.23 and before: `labels` points to a `map[string]string`. Up to
/// 8 labels the map has one bucket, whose slots map to the header slots
/// (an empty one zeroed; the daemon skips those); a larger map is read
/// from its first bucket only, and counted as cut. None when the bucket
/// holds no label.
///
/// A label map is built once and never changed, so its set's id is
/// remembered by the map's address, and known again by its header (its
/// count, its seed, which the runtime draws at random for each map, and
/// its bucket's address): one read instead of the bucket's, and no hash.
/// `[debug] go_label_map_cache = false` reads the bucket every time.
#[inline(always)]
fn map_headers(tgid: u32, labels: u64, scratch: &mut Scratch) -> Option<MapRead> {
    let hmap: u64 = read(labels)?;
    // count, then flags (byte 8), B (byte 9) and the seed (bytes 12-15),
    // then the buckets.
    let header: [u64; 3] = read(hmap)?;
    if header[0] == 0 {
        return None;
    }
    let mut fill = MAP_CACHE_SLOTS;
    if global_u8(&GO_LABEL_MAP_CACHE) != 0 {
        let slot = ((hmap >> 4) ^ (hmap >> 10)) as usize & (MAP_CACHE_SLOTS - 1);
        let key = [u64::from(tgid), hmap, header[0], header[1], header[2]];
        let entry = &mut scratch.map_cache[slot];
        // One branch for the five words (each compared alone would fork
        // the verifier's states).
        let differ = (entry[0] ^ key[0])
            | (entry[1] ^ key[1])
            | (entry[2] ^ key[2])
            | (entry[3] ^ key[3])
            | (entry[4] ^ key[4]);
        let id = entry[5];
        // SAFETY: presence check only.
        if differ == 0 && unsafe { GO_LABEL_SETS.get(id).is_some() } {
            count(counter::GO_LABEL_MAP_CACHE_HITS);
            return Some(MapRead::Known(id));
        }
        // The id comes when the set is read; until then 0, which no set
        // has.
        *entry = [key[0], key[1], key[2], key[3], key[4], 0];
        fill = slot;
    }
    let (b, buckets) = ((header[1] >> 8) & 0xff, header[2]);
    let room = core::mem::size_of_val(&scratch.bucket) as u64;
    if !read_into::<false>(scratch.bucket.as_mut_ptr().cast(), room, buckets, room) {
        return None;
    }
    let tophash = scratch.bucket[0];
    let mut live_slots = 0u64;
    for slot in 0..GO_LABELS_MAX {
        let live = (tophash >> (8 * slot)) & 0xff >= MIN_TOP_HASH;
        let keep = u64::from(live).wrapping_neg();
        live_slots |= keep;
        scratch.headers[slot][0] = scratch.bucket[1 + 2 * slot] & keep;
        scratch.headers[slot][1] = scratch.bucket[2 + 2 * slot] & keep;
        scratch.headers[slot][2] = scratch.bucket[17 + 2 * slot] & keep;
        scratch.headers[slot][3] = scratch.bucket[18 + 2 * slot] & keep;
    }
    if live_slots == 0 {
        return None;
    }
    Some(MapRead::Headers {
        cut: b != 0 || header[0] > GO_LABELS_MAX as u64,
        slot: fill,
    })
}

/// The id of the set in the scratch slot's headers (of process `tgid`),
/// its text recorded if `GO_LABEL_SETS` does not hold it.
#[inline(always)]
fn known_set<const MASKED: bool>(tgid: u32, scratch: &mut Scratch, cut: bool) -> Option<u64> {
    // Every slot is filled (an empty one with zeros) and every loop below
    // runs its full count: no branch depends on how many labels there
    // are, which keeps the verifier's work (and the daemon's start) small.
    // The process is hashed in: equal headers in two processes are two
    // sets.
    let mut id: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(tgid);
    for slot in 0..GO_LABELS_MAX {
        for w in 0..4 {
            // Volatile: one word at a time, not all 32 hoisted into
            // registers and spilled past the BPF stack.
            // SAFETY: a read of the scratch slot's own memory.
            let word = unsafe { core::ptr::read_volatile(&scratch.headers[slot][w]) };
            id = (id.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    let id = id.max(1);
    // SAFETY: presence check only.
    if unsafe { GO_LABEL_SETS.get(id).is_none() } {
        record::<MASKED>(scratch, cut);
        // By reference: the record does not fit the BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        if let Err(e) = GO_LABEL_SETS.insert(id, &scratch.record, BPF_NOEXIST as u64)
            && e != EEXIST
        {
            count(counter::GO_LABEL_SETS_FULL);
            return None;
        }
    }
    Some(id)
}

/// Go 1.24 and later: `labels` points to a struct whose first field is a
/// slice of `{key, value string}`, laid out as the headers are. Returns
/// whether the list had more labels than the slots; None when it has none.
#[inline(always)]
fn list_headers<const MASKED: bool>(labels: u64, scratch: &mut Scratch) -> Option<bool> {
    let list: [u64; 2] = read(labels)?;
    let (ptr, len) = (list[0], list[1]);
    if ptr < 4096 || len == 0 {
        return None;
    }
    for header in scratch.headers.iter_mut() {
        for word in header.iter_mut() {
            *word = 0;
        }
    }
    let room = core::mem::size_of_val(&scratch.headers) as u64;
    if !read_into::<MASKED>(scratch.headers.as_mut_ptr().cast(), room, ptr, len * 32) {
        return None;
    }
    Some(len > GO_LABELS_MAX as u64)
}

/// Fills the scratch record with the text of every slot (an empty slot
/// reads nothing).
#[inline(always)]
fn record<const MASKED: bool>(scratch: &mut Scratch, cut: bool) {
    let mut cut = cut;
    let record = &mut scratch.record;
    let key_room = GO_LABEL_KEY_BYTES as u64;
    let value_room = GO_LABEL_VALUE_BYTES as u64;
    for i in 0..GO_LABELS_MAX {
        let (key, key_len) = (scratch.headers[i][0], scratch.headers[i][1]);
        let (value, value_len) = (scratch.headers[i][2], scratch.headers[i][3]);
        let got_key = read_into::<MASKED>(record.keys[i].as_mut_ptr(), key_room, key, key_len);
        let got_value =
            read_into::<MASKED>(record.values[i].as_mut_ptr(), value_room, value, value_len);
        record.key_len[i] = (key_len.min(key_room) as u8) * u8::from(got_key);
        record.value_len[i] = (value_len.min(value_room) as u8) * u8::from(got_value);
        cut |= key_len > key_room || value_len > value_room;
    }
    record.count = GO_LABELS_MAX as u8;
    record.cut = u8::from(cut);
}
