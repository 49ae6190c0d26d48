//! The Python frames of a CPython thread, read at a CPU sample: the
//! thread's `PyThreadState` (found in the main interpreter's thread list
//! by its kernel thread id, as the process's pid namespace numbers it,
//! then remembered), its current frame (a `_PyInterpreterFrame`, or in
//! 3.9 and 3.10 a `PyFrameObject`), and each frame's code object and
//! instruction (pointer, or `f_lasti`) down the chain of callers. Offsets
//! come from the daemon per process (`PyRuntime`), by CPython release.
//! The frame walk and the thread-list search run under `bpf_loop`, so
//! that the verifier checks one step of each rather than every step
//! (design 021).

use aya_ebpf::{
    bindings::bpf_pidns_info,
    helpers::generated,
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use profiler_common::{
    PY_FRAME_BYTES, PY_FRAME_OBJECT_BYTES, PY_FRAME_OWNED_BY_CSTACK, PY_NO_FIELD,
    PY_PROCESSES_ENTRIES, PY_THREADS_ENTRIES, PY_THREADS_SEARCHED, PyFrame, PyFrames, PyRuntime,
    counter, py_flags,
};

use crate::counters::count;
use crate::user_memory::read;

/// CPython processes, marked by the daemon with their runtime's address
/// and layout.
#[map]
static PY_PROCESSES: HashMap<u32, PyRuntime> = HashMap::with_max_entries(PY_PROCESSES_ENTRIES, 0);

/// Thread id -> its `PyThreadState`, as last found (checked at each use
/// against the state's own thread id).
#[map]
static PY_THREADS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(PY_THREADS_ENTRIES, 0);

/// Per-CPU room for one frame's first bytes.
#[map]
static PY_FRAME_SCRATCH: PerCpuArray<[u8; PY_FRAME_OBJECT_BYTES]> =
    PerCpuArray::with_max_entries(1, 0);

/// Whether `tgid` is a marked CPython process.
#[inline(always)]
pub(crate) fn is_python(tgid: u32) -> bool {
    // SAFETY: presence check only.
    unsafe { PY_PROCESSES.get(tgid).is_some() }
}

/// The entry of CPython process `tgid` (a pointer into the map).
#[inline(always)]
pub(crate) fn python_process(tgid: u32) -> Option<*const PyRuntime> {
    PY_PROCESSES.get_ptr(tgid)
}

/// Fills `out` with the Python frames of thread `tid`, leaf first; none
/// when the thread has no thread state (it never ran Python) or its
/// memory cannot be read.
#[inline(always)]
pub(crate) fn python_frames<const N: usize>(py: &PyRuntime, tid: u32, out: &mut PyFrames<N>) {
    out.len = 0;
    out.truncated = 0;
    let Some(thread) = thread_state(py, tid, thread_id_in_namespace(py, tid)) else {
        count(counter::PY_THREADS_UNFOUND);
        return;
    };
    count(counter::PY_SAMPLES);
    let frame = if py.thread_cframe == PY_NO_FIELD {
        read::<u64>(thread.wrapping_add(u64::from(py.current_frame)))
    } else {
        read::<u64>(thread.wrapping_add(u64::from(py.thread_cframe)))
            .and_then(|cframe| read::<u64>(cframe.wrapping_add(u64::from(py.current_frame))))
    };
    if let Some(frame) = frame {
        walk(py, frame, out);
    }
}

/// The current thread's id in the process's pid namespace (`tid`, the
/// host's, when it is the daemon's or cannot be read).
#[inline(always)]
fn thread_id_in_namespace(py: &PyRuntime, tid: u32) -> u32 {
    if py.pid_ns_ino == 0 {
        return tid;
    }
    let mut ids = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: the helper writes `ids`, of the size passed.
    let got = unsafe {
        generated::bpf_get_ns_current_pid_tgid(
            py.pid_ns_dev,
            py.pid_ns_ino,
            &mut ids,
            core::mem::size_of::<bpf_pidns_info>() as u32,
        )
    };
    if got == 0 { ids.pid } else { tid }
}

/// The `PyThreadState` of thread `tid` (`ns_tid` in the process's pid
/// namespace, as the thread state has it): the remembered one if it still
/// names the thread, else the first of the main interpreter's thread list
/// that does (remembered for the next sample).
#[inline(always)]
fn thread_state(py: &PyRuntime, tid: u32, ns_tid: u32) -> Option<u64> {
    let cached = py.flags & py_flags::NO_THREAD_CACHE == 0;
    // SAFETY: a copy of the value.
    if cached
        && let Some(&known) = unsafe { PY_THREADS.get(tid) }
        && thread_id(py, known) == Some(ns_tid)
    {
        return Some(known);
    }
    let interpreter: u64 = read(py.runtime.wrapping_add(u64::from(py.interpreters_head)))?;
    let mut search = Search {
        py,
        thread: read(interpreter.wrapping_add(u64::from(py.threads_head)))?,
        ns_tid: u64::from(ns_tid),
        found: 0,
    };
    // SAFETY: as in `walk`.
    unsafe {
        generated::bpf_loop(
            PY_THREADS_SEARCHED as u32,
            search_step as *const () as *mut core::ffi::c_void,
            (&raw mut search).cast(),
            0,
        )
    };
    if search.found == 0 {
        return None;
    }
    // A full map drops its least recently used thread.
    if cached {
        let _ = PY_THREADS.insert(tid, search.found, 0);
    }
    Some(search.found)
}

/// The thread list's search between steps, on the caller's BPF stack.
#[repr(C)]
struct Search {
    py: *const PyRuntime,
    /// The thread state to look at next (0: the list's end).
    thread: u64,
    ns_tid: u64,
    /// The thread state found, or 0.
    found: u64,
}

/// One thread state of the search in [`thread_state`]: 0 to go on, 1 to
/// stop.
#[inline(never)]
extern "C" fn search_step(_index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `ctx` is the `Search` the caller passed to bpf_loop; `py`
    // is a map value, valid meanwhile.
    let search = unsafe { &mut *ctx.cast::<Search>() };
    let thread = search.thread;
    if thread == 0 {
        return 1;
    }
    // SAFETY: as above.
    let py = unsafe { &*search.py };
    if thread_id(py, thread).map(u64::from) == Some(search.ns_tid) {
        search.found = thread;
        return 1;
    }
    match read::<u64>(thread.wrapping_add(u64::from(py.thread_next))) {
        Some(next) => {
            search.thread = next;
            0
        }
        None => 1,
    }
}

/// The kernel id of the thread whose state is `thread`: its native id,
/// or (3.9, 3.10) the id its `pthread_t` holds.
#[inline(always)]
fn thread_id(py: &PyRuntime, thread: u64) -> Option<u32> {
    let id: u64 = read(thread.wrapping_add(u64::from(py.thread_native_id)))?;
    if py.thread_id_in_pthread == PY_NO_FIELD {
        return u32::try_from(id).ok();
    }
    read::<u32>(id.wrapping_add(u64::from(py.thread_id_in_pthread)))
}

/// A word of the frame's bytes at `at` (an offset from the daemon), or 0
/// when it lies outside them.
#[inline(always)]
fn word_at(bytes: &[u8; PY_FRAME_OBJECT_BYTES], at: u16) -> u64 {
    let at = usize::from(at);
    if at > PY_FRAME_OBJECT_BYTES - 8 {
        return 0;
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

#[inline(always)]
fn byte_at(bytes: &[u8; PY_FRAME_OBJECT_BYTES], at: u16) -> u8 {
    bytes.get(usize::from(at)).copied().unwrap_or(0)
}

/// Follows `previous` (`f_back`) from `frame`, recording each frame (one
/// read of its first bytes each). A frame the evaluator keeps on the C stack (3.12+)
/// is recorded as a boundary (code 0); the first frame of an evaluator
/// call in 3.11 (`is_entry`) has bit 0 of its code set.
///
/// The steps run under `bpf_loop` (Linux 5.17+), whose body the verifier
/// checks once rather than once per frame: an unrolled walk of 32 frames
/// was most of what the kernel verified of each program that reads Python
/// frames (design 021).
#[inline(always)]
fn walk<const N: usize>(py: &PyRuntime, frame: u64, out: &mut PyFrames<N>) {
    const { assert!(N.is_power_of_two()) };
    let Some(scratch) = PY_FRAME_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let mut state = Walk::<N> {
        py,
        out,
        bytes: scratch,
        frame,
        len: 0,
    };
    // SAFETY: the callback is a BPF function of the expected signature;
    // `state` outlives the call.
    unsafe {
        generated::bpf_loop(
            N as u32,
            walk_step::<N> as *const () as *mut core::ffi::c_void,
            (&raw mut state).cast(),
            0,
        )
    };
    let len = state.len.min(N as u64) as u32;
    out.len = len;
    // Counted by the daemon.
    if len as usize == N && state.frame >= 4096 {
        out.truncated = 1;
    }
}

/// The walk's state between steps, on the caller's BPF stack.
#[repr(C)]
struct Walk<const N: usize> {
    py: *const PyRuntime,
    out: *mut PyFrames<N>,
    /// This CPU's scratch for one frame's first bytes.
    bytes: *mut [u8; PY_FRAME_OBJECT_BYTES],
    /// The frame to read next.
    frame: u64,
    /// Frames recorded.
    len: u64,
}

/// One frame of [`walk`]: 0 to go on, 1 to stop. `index` is the frame's
/// slot; the verifier knows nothing of it but its type, so the slot is
/// masked, and the recorded count comes from it.
#[inline(never)]
extern "C" fn walk_step<const N: usize>(index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `ctx` is the `Walk<N>` the caller passed to bpf_loop; its
    // pointers are a map value and this CPU's scratch, valid meanwhile.
    let state = unsafe { &mut *ctx.cast::<Walk<N>>() };
    let frame = state.frame;
    if frame < 4096 {
        return 1;
    }
    // SAFETY: as above.
    let (py, bytes, out) = unsafe { (&*state.py, &mut *state.bytes, &mut *state.out) };
    // Two constant sizes, not the daemon's number: the verifier checks
    // each read's size against the slot.
    let size = if usize::from(py.frame_bytes) > PY_FRAME_BYTES {
        PY_FRAME_OBJECT_BYTES
    } else {
        PY_FRAME_BYTES
    };
    // SAFETY: a checked read of user memory into the scratch slot, which
    // has at least the size passed.
    let read = unsafe {
        generated::bpf_probe_read_user(bytes.as_mut_ptr().cast(), size as u32, frame as *const _)
    };
    if read != 0 {
        return 1;
    }
    let owner = byte_at(bytes, py.frame_owner);
    let mut code = word_at(bytes, py.frame_code);
    let mut instr = word_at(bytes, py.frame_instr);
    if owner == PY_FRAME_OWNED_BY_CSTACK {
        (code, instr) = (0, 0);
    } else if py.frame_is_entry != PY_NO_FIELD && byte_at(bytes, py.frame_is_entry) != 0 {
        code |= 1;
    }
    let slot = (index as usize) & (N - 1);
    if let Some(out) = out.frames.get_mut(slot) {
        *out = PyFrame { code, instr };
    }
    state.len = index + 1;
    state.frame = word_at(bytes, py.frame_previous);
    0
}
