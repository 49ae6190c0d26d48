//! The Python frames of a CPython thread, read at a CPU sample: the
//! thread's `PyThreadState` (found in the main interpreter's thread list
//! by its kernel thread id, as the process's pid namespace numbers it,
//! then remembered), its current frame (a `_PyInterpreterFrame`, or in
//! 3.9 and 3.10 a `PyFrameObject`), and each frame's code object and
//! instruction (pointer, or `f_lasti`) down the chain of callers. Offsets
//! come from the daemon per process (`PyRuntime`), by CPython release.

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
    let mut thread: u64 = read(interpreter.wrapping_add(u64::from(py.threads_head)))?;
    for _ in 0..PY_THREADS_SEARCHED {
        if thread == 0 {
            return None;
        }
        if thread_id(py, thread) == Some(ns_tid) {
            // A full map drops its least recently used thread.
            if cached {
                let _ = PY_THREADS.insert(tid, thread, 0);
            }
            return Some(thread);
        }
        thread = read(thread.wrapping_add(u64::from(py.thread_next)))?;
    }
    None
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
#[inline(always)]
fn walk<const N: usize>(py: &PyRuntime, mut frame: u64, out: &mut PyFrames<N>) {
    let Some(scratch) = PY_FRAME_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch slot; nothing else uses it meanwhile.
    let bytes = unsafe { &mut *scratch };
    // Two constant sizes, not the daemon's number: the verifier checks
    // each read's size against the slot.
    let size = if usize::from(py.frame_bytes) > PY_FRAME_BYTES {
        PY_FRAME_OBJECT_BYTES
    } else {
        PY_FRAME_BYTES
    };
    let mut len = 0u32;
    for slot in 0..N {
        if frame < 4096 {
            break;
        }
        // SAFETY: a checked read of user memory into the scratch slot,
        // which has at least the size passed.
        let read = unsafe {
            generated::bpf_probe_read_user(
                bytes.as_mut_ptr().cast(),
                size as u32,
                frame as *const _,
            )
        };
        if read != 0 {
            break;
        }
        let owner = byte_at(bytes, py.frame_owner);
        let mut code = word_at(bytes, py.frame_code);
        let mut instr = word_at(bytes, py.frame_instr);
        if owner == PY_FRAME_OWNED_BY_CSTACK {
            (code, instr) = (0, 0);
        } else if py.frame_is_entry != PY_NO_FIELD && byte_at(bytes, py.frame_is_entry) != 0 {
            code |= 1;
        }
        if let Some(out) = out.frames.get_mut(slot) {
            *out = PyFrame { code, instr };
        }
        len += 1;
        frame = word_at(bytes, py.frame_previous);
    }
    out.len = len;
    // Counted by the daemon.
    if len as usize == N && frame >= 4096 {
        out.truncated = 1;
    }
}
