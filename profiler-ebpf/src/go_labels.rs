//! The pprof labels of the goroutine a Go thread runs, read at a CPU sample
//! as Go's own profiler reads them (and those of a parked goroutine that
//! is readied, for its block sample): the goroutine in R14 (where Go code
//! keeps it), its M, the M's current goroutine (`m.curg`, the one a
//! system-stack sample is charged to), and that goroutine's `labels`.
//! Offsets and the labels' form come from the daemon per process
//! (`GoRuntime`). R14 holds the goroutine only in Go code: the reading is
//! trusted only when the M's current goroutine points back to the same M.
//!
//! A sample carries an id of its label set, a hash of the labels' string
//! headers (their addresses and lengths); the set's text is recorded in
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
use crate::globals::{GO_LABELS_ONE_READ, global_u8};
use crate::user_memory::read;

/// -EEXIST: another CPU recorded the same set first.
const EEXIST: i32 = -17;
/// The id of eight empty slots (the hash below over 32 zero words).
const NO_LABELS_ID: u64 = no_labels_id();

const fn no_labels_id() -> u64 {
    let mut id: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < GO_LABELS_MAX * 4 {
        id = id.rotate_left(5).wrapping_mul(0x517c_c1b7_2722_0a95);
        i += 1;
    }
    id
}

/// Go's `minTopHash`: a map slot whose top hash is below it is empty.
const MIN_TOP_HASH: u64 = 5;

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
    /// A goroutine's words from `g.m` on, through `g.labels` (see
    /// `try_label_set`); 64 words of room, `G_SPAN_BYTES` read.
    g_span: [u64; 64],
    record: GoLabels,
}

/// Bytes of a goroutine read from its `g.m` at once: `g.labels` lies 296
/// to 312 bytes past `g.m` in every release the daemon has a layout for.
const G_SPAN_BYTES: u64 = 320;

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
/// `g` (R14) runs for, recording the set's text if it is new; 0 when there
/// is none or it cannot be read.
///
/// `MASKED` as for [`read_into`] (every caller masks: Linux 6.1's
/// verifier).
#[inline(always)]
pub(crate) fn go_label_set<const MASKED: bool>(go: &GoRuntime, g: u64) -> u64 {
    if go.labels_form == go_labels_form::NONE {
        return 0;
    }
    try_label_set::<MASKED>(go, g).unwrap_or(0)
}

#[inline(always)]
fn try_label_set<const MASKED: bool>(go: &GoRuntime, g: u64) -> Option<u64> {
    // Mostly R14's goroutine is the one its M runs: then one read of the
    // goroutine from `g.m` through `g.labels` gives both, and `m.curg`
    // naming it again is the check below, two reads fewer (of six or
    // seven) per sample. `[debug] go_labels_one_read = false` reads them
    // one by one.
    let span = u64::from(go.g_labels).wrapping_sub(u64::from(go.g_m));
    if global_u8(&GO_LABELS_ONE_READ) != 0 && span % 8 == 0 && span + 8 <= G_SPAN_BYTES {
        // SAFETY: this CPU's scratch slot; nothing else uses it meanwhile.
        let scratch = unsafe { &mut *GO_LABEL_SCRATCH.get_ptr_mut(0)? };
        let room = core::mem::size_of_val(&scratch.g_span) as u64;
        let start = g.wrapping_add(u64::from(go.g_m));
        if g >= 4096
            && read_into::<false>(
                scratch.g_span.as_mut_ptr().cast(),
                room,
                start,
                G_SPAN_BYTES,
            )
        {
            let m = scratch.g_span[0];
            // Masked: the verifier sees the index within the room.
            let labels = scratch.g_span[(span / 8) as usize & 63];
            let curg: u64 = read(m.wrapping_add(u64::from(go.m_curg)))?;
            if curg == g {
                let id = label_set_of::<MASKED>(go, labels, scratch)?;
                count(counter::GO_LABELED_SAMPLES);
                return Some(id);
            }
        }
    }
    let m: u64 = read(g.wrapping_add(u64::from(go.g_m)))?;
    let curg: u64 = read(m.wrapping_add(u64::from(go.m_curg)))?;
    // R14 may hold anything outside Go code: trust it only when its M's
    // running goroutine belongs to that M.
    let curg_m: u64 = read(curg.wrapping_add(u64::from(go.g_m)))?;
    if curg_m != m {
        return None;
    }
    let id = label_set_at::<MASKED>(go, curg)?;
    count(counter::GO_LABELED_SAMPLES);
    Some(id)
}

/// The id of the label set of goroutine `g` (a `*g` the runtime passed, of
/// a goroutine parked or about to run), recording the set's text if it is
/// new; 0 when it has none or it cannot be read. For `go_park_probe`.
#[inline(always)]
pub(crate) fn goroutine_label_set(go: &GoRuntime, g: u64) -> u64 {
    if go.labels_form == go_labels_form::NONE {
        return 0;
    }
    label_set_at::<true>(go, g).unwrap_or(0)
}

/// The label set of goroutine `g` (see `try_label_set`); `MASKED` as for
/// [`read_into`].
#[inline(always)]
fn label_set_at<const MASKED: bool>(go: &GoRuntime, g: u64) -> Option<u64> {
    let labels: u64 = read(g.wrapping_add(u64::from(go.g_labels)))?;
    // SAFETY: this CPU's scratch slot; nothing else uses it meanwhile.
    let scratch = unsafe { &mut *GO_LABEL_SCRATCH.get_ptr_mut(0)? };
    label_set_of::<MASKED>(go, labels, scratch)
}

/// The label set whose `labels` (a goroutine's `g.labels`) is given.
#[inline(always)]
fn label_set_of<const MASKED: bool>(
    go: &GoRuntime,
    labels: u64,
    scratch: &mut Scratch,
) -> Option<u64> {
    if labels == 0 {
        return None;
    }
    // Every slot is filled (an empty one with zeros) and every loop below
    // runs its full count: no branch depends on how many labels there
    // are, which keeps the verifier's work (and the daemon's start) small.
    let cut = match go.labels_form {
        go_labels_form::LIST => list_headers::<MASKED>(labels, scratch)?,
        _ => map_headers(labels, scratch)?,
    };
    let mut id: u64 = 0xcbf2_9ce4_8422_2325;
    for slot in 0..GO_LABELS_MAX {
        for w in 0..4 {
            // Volatile: one word at a time, not all 32 hoisted into
            // registers and spilled past the BPF stack.
            // SAFETY: a read of the scratch slot's own memory.
            let word = unsafe { core::ptr::read_volatile(&scratch.headers[slot][w]) };
            id = (id.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    if id == NO_LABELS_ID {
        // Every slot empty: no label.
        return None;
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
/// whether the list had more labels than the slots.
#[inline(always)]
fn list_headers<const MASKED: bool>(labels: u64, scratch: &mut Scratch) -> Option<bool> {
    let list: [u64; 2] = read(labels)?;
    let (ptr, len) = (list[0], list[1]);
    for header in scratch.headers.iter_mut() {
        for word in header.iter_mut() {
            *word = 0;
        }
    }
    let room = core::mem::size_of_val(&scratch.headers) as u64;
    // An empty list reads nothing: a masked read would fill the slots.
    if ptr >= 4096
        && len > 0
        && !read_into::<MASKED>(scratch.headers.as_mut_ptr().cast(), room, ptr, len * 32)
    {
        return None;
    }
    Some(len > GO_LABELS_MAX as u64)
}

/// Go 1.23 and before: `labels` points to a `map[string]string`. Up to
/// 8 labels the map has one bucket, whose slots map to the header slots
/// (an empty one zeroed; the daemon skips those); a larger map is read
/// from its first bucket only, and counted as cut.
#[inline(always)]
fn map_headers(labels: u64, scratch: &mut Scratch) -> Option<bool> {
    let hmap: u64 = read(labels)?;
    // count, then flags (byte 8) and B (byte 9), then the buckets.
    let header: [u64; 3] = read(hmap)?;
    let (b, buckets) = ((header[1] >> 8) & 0xff, header[2]);
    let room = core::mem::size_of_val(&scratch.bucket) as u64;
    if !read_into::<false>(scratch.bucket.as_mut_ptr().cast(), room, buckets, room) {
        return None;
    }
    let tophash = scratch.bucket[0];
    for slot in 0..GO_LABELS_MAX {
        let live = (tophash >> (8 * slot)) & 0xff >= MIN_TOP_HASH;
        let keep = u64::from(live).wrapping_neg();
        scratch.headers[slot][0] = scratch.bucket[1 + 2 * slot] & keep;
        scratch.headers[slot][1] = scratch.bucket[2 + 2 * slot] & keep;
        scratch.headers[slot][2] = scratch.bucket[17 + 2 * slot] & keep;
        scratch.headers[slot][3] = scratch.bucket[18 + 2 * slot] & keep;
    }
    Some(b != 0 || header[0] > GO_LABELS_MAX as u64)
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
