//! CPython: where the interpreter keeps a thread's frames (the offsets the
//! daemon gives the kernel per process, by CPython release), and the
//! Python frames a CPU sample, heap sample or wait record of such a
//! process carries besides its native stack.

use crate::StackSample;

/// Python processes marked at once (`PY_PROCESSES`).
pub const PY_PROCESSES_ENTRIES: u32 = 4096;

/// Threads whose `PyThreadState` is remembered at once (`PY_THREADS`,
/// least recently used go).
pub const PY_THREADS_ENTRIES: u32 = 16_384;

/// Thread states looked at per sample when a thread's is not remembered:
/// a process with more Python threads than this may go without the
/// frames of the later ones.
pub const PY_THREADS_SEARCHED: usize = 32;

/// Python frames recorded per sample, boundaries included (the frames
/// nearest the leaf are kept).
pub const PY_FRAMES_MAX: usize = 64;

/// Bytes of an interpreter frame read at once: every field used lies in
/// them, in every release handled (3.11+: `_PyInterpreterFrame` up to
/// its `localsplus`).
pub const PY_FRAME_BYTES: usize = 72;

/// Bytes of a frame object read at once in releases whose frames are
/// objects (3.9, 3.10: `PyFrameObject` up to `f_lasti` and `f_lineno`;
/// the object is larger). A release's `PyRuntime::frame_bytes` is one of
/// the two sizes: the larger is not read where the smaller will do, as an
/// interpreter frame may end where the memory does.
pub const PY_FRAME_OBJECT_BYTES: usize = 112;

/// A field of [`PyRuntime`] that the release does not have.
pub const PY_NO_FIELD: u16 = u16::MAX;

/// Where process's interpreter keeps its threads and their frames (value
/// of `PY_PROCESSES`): the address of `_PyRuntime` and, for its release,
/// the offsets of the fields walked. Frame fields are offsets into the
/// first [`PY_FRAME_BYTES`] of a `_PyInterpreterFrame`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyRuntime {
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// The process's pid namespace (`st_dev` and `st_ino` of
    /// `/proc/PID/ns/pid`) when it is not the daemon's, else 0: the
    /// thread states hold thread ids as the process sees them, in its
    /// namespace (a container's).
    pub pid_ns_dev: u64,
    pub pid_ns_ino: u64,
    /// `_PyRuntimeState.interpreters.head`: the main interpreter.
    pub interpreters_head: u16,
    /// `PyInterpreterState.threads.head`.
    pub threads_head: u16,
    /// `PyThreadState.next`.
    pub thread_next: u16,
    /// `PyThreadState.native_thread_id` (the thread's kernel id), or
    /// `PyThreadState.thread_id` (its `pthread_t`) where there is no
    /// native id (3.9, 3.10).
    pub thread_native_id: u16,
    /// Where the thread's kernel id lies in the object `thread_native_id`
    /// points to (glibc's `struct pthread.tid`), or [`PY_NO_FIELD`] when
    /// `thread_native_id` is the id itself.
    pub thread_id_in_pthread: u16,
    /// `PyThreadState.cframe` (3.11, 3.12), or [`PY_NO_FIELD`] when the
    /// thread state holds its current frame itself (3.9, 3.10, 3.13).
    pub thread_cframe: u16,
    /// `_PyCFrame.current_frame`, `PyThreadState.current_frame` (3.13),
    /// or `PyThreadState.frame` (3.9, 3.10).
    pub current_frame: u16,
    /// [`PY_FRAME_BYTES`] or [`PY_FRAME_OBJECT_BYTES`]: how much of a
    /// frame to read.
    pub frame_bytes: u16,
    /// `_PyInterpreterFrame.f_code` (`f_executable` in 3.13,
    /// `PyFrameObject.f_code` in 3.9 and 3.10).
    pub frame_code: u16,
    /// `_PyInterpreterFrame.previous` (`PyFrameObject.f_back`).
    pub frame_previous: u16,
    /// `_PyInterpreterFrame.prev_instr` (`instr_ptr` in 3.13), or
    /// `PyFrameObject.f_lasti` (an `int`: the word read holds `f_lineno`
    /// above it, which the daemon masks off).
    pub frame_instr: u16,
    /// `_PyInterpreterFrame.owner` (one byte), or [`PY_NO_FIELD`].
    pub frame_owner: u16,
    /// `_PyInterpreterFrame.is_entry` (one byte, 3.11), or
    /// [`PY_NO_FIELD`]: later releases mark an evaluator's entry with a
    /// frame owned by the C stack instead.
    pub frame_is_entry: u16,
    /// [`py_flags`].
    pub flags: u16,
    pub _pad: u16,
}

/// Bits of [`PyRuntime::flags`].
pub mod py_flags {
    /// Each sample searches the thread list for the thread's state
    /// instead of using the one remembered in `PY_THREADS` (to compare:
    /// the same frames, at more reads per sample).
    pub const NO_THREAD_CACHE: u16 = 1;
}

/// `_PyInterpreterFrame.owner` of the frame an evaluator call keeps on
/// the C stack for itself (3.12 and later): the boundary between the
/// Python frames of two evaluator calls.
pub const PY_FRAME_OWNED_BY_CSTACK: u8 = 3;

/// One recorded Python frame: its code object and where in it the frame
/// is (the frame's instruction pointer). A frame whose `code` is 0 is a
/// boundary: the frames before it (nearer the leaf) ran in one call of
/// the evaluator, those after it in the calls below.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyFrame {
    pub code: u64,
    pub instr: u64,
}

/// Python frames recorded per off-CPU interval, boundaries included: the
/// record of every interval (Python or not) has room for them, and the
/// wait ring is the busiest, so fewer than a CPU sample's.
pub const OFFCPU_PY_FRAMES: usize = 32;

/// The Python frames of a sample, leaf first (at most N).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyFrames<const N: usize = PY_FRAMES_MAX> {
    /// Frames of `frames` in use.
    pub len: u32,
    /// Nonzero when the walk stopped at N frames before the thread's
    /// first frame.
    pub truncated: u32,
    pub frames: [PyFrame; N],
}

/// A CPU sample of a Python process: the native sample with its stack
/// copy, and the Python frames of the thread. Sent through the same ring
/// as [`StackSample`]; the daemon tells the forms apart by their length.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PySample<const N: usize> {
    pub sample: StackSample<N>,
    pub python: PyFrames,
}

// The daemon tells the six CPU record forms apart by length, largest
// first: each Python form must be shorter than the next larger native one.
const _: () = assert!(
    core::mem::size_of::<PySample<{ crate::SHORT_STACK_BYTES }>>()
        < core::mem::size_of::<StackSample<{ crate::STACK_COPY_BYTES }>>()
);
const _: () = assert!(
    core::mem::size_of::<PySample<{ crate::STACK_COPY_BYTES }>>()
        < core::mem::size_of::<StackSample<{ crate::LONG_STACK_BYTES }>>()
);

/// A heap sample's or wait record's kernel form for a CPython process:
/// the record of any process, then the thread's Python frames (the
/// record says so: `HeapAlloc::python`, `wait_flags::PYTHON`). Other
/// processes' records stay as long as they were; the daemon finds the
/// frames at the record's end.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WithPython<T, const M: usize> {
    pub record: T,
    pub python: PyFrames<M>,
}
