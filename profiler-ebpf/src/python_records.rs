//! The Python frames that CPU samples (`PySample`), heap samples and wait
//! records (`WithPython`) of a CPython process carry: walked once per
//! record into a per-CPU scratch, then copied after the record's own
//! bytes. The walk is the costliest part to verify, and each of those
//! senders has several record forms: walked once, it is verified once
//! per sender. Each sender has a scratch of its own: a CPU sample's
//! program runs in NMI context and may interrupt a tracepoint's on the
//! same CPU.

use aya_ebpf::{helpers::generated::bpf_probe_read_kernel, macros::map, maps::PerCpuArray};
use profiler_common::{HEAP_PY_FRAMES, PyFrame, PyFrames, PyRuntime, WAIT_PY_FRAMES};

use crate::python::{python_frames, python_process};

/// Per-CPU room for a CPU sample's Python frames.
#[map]
static CPU_PY_SCRATCH: PerCpuArray<PyFrames> = PerCpuArray::with_max_entries(1, 0);

/// The Python frames of thread `tid` of the CPython process `py` for a
/// CPU sample, in this CPU's scratch.
#[inline(always)]
pub(crate) fn cpu_python_frames(py: &PyRuntime, tid: u32) -> Option<*const PyFrames> {
    let scratch = CPU_PY_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch (a perf-event program does not nest).
    unsafe { python_frames(py, tid, &mut *scratch) };
    Some(scratch)
}

/// Per-CPU room for a heap sample's Python frames.
#[map]
static HEAP_PY_SCRATCH: PerCpuArray<PyFrames<HEAP_PY_FRAMES>> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU room for a wait record's Python frames.
#[map]
static WAIT_PY_SCRATCH: PerCpuArray<PyFrames<WAIT_PY_FRAMES>> = PerCpuArray::with_max_entries(1, 0);

/// The Python frames of thread `tid` of `tgid` for a heap sample, in
/// this CPU's scratch; None when `tgid` is not a marked CPython process.
#[inline(always)]
pub(crate) fn heap_python_frames(tgid: u32, tid: u32) -> Option<*const PyFrames<HEAP_PY_FRAMES>> {
    let py = python_process(tgid)?;
    let scratch = HEAP_PY_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: a map value, valid during this run; this CPU's scratch
    // (programs do not nest on a CPU).
    unsafe { python_frames(&*py, tid, &mut *scratch) };
    Some(scratch)
}

/// As [`heap_python_frames`], for a wait record.
#[inline(always)]
pub(crate) fn wait_python_frames(tgid: u32, tid: u32) -> Option<*const PyFrames<WAIT_PY_FRAMES>> {
    let py = python_process(tgid)?;
    let scratch = WAIT_PY_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: as above.
    unsafe { python_frames(&*py, tid, &mut *scratch) };
    Some(scratch)
}

/// Copies the frames of `src` in use into `dst` (a ring entry: only the
/// bytes in use are written, as the ring's memory is cold in this CPU's
/// cache). M is a power of two.
///
/// # Safety
/// `dst` and `src` point to whole `PyFrames<M>`.
#[inline(always)]
pub(crate) unsafe fn copy_python_frames<const M: usize>(
    dst: *mut PyFrames<M>,
    src: *const PyFrames<M>,
) {
    const { assert!(M.is_power_of_two()) };
    // SAFETY: both whole records (the caller's word).
    let len = unsafe { (*src).len };
    // SAFETY: as above.
    unsafe { (*dst).truncated = (*src).truncated };
    if len == 0 || len as usize > M {
        // SAFETY: as above.
        unsafe { (*dst).len = 0 };
        return;
    }
    // SAFETY: a read of a local, hiding its bound from the compiler so
    // that the mask below is applied to the register passed: Linux 6.1's
    // verifier does not carry a bound checked on one register to a copy.
    let len = unsafe { core::ptr::read_volatile(&len) };
    // 1..=M frames whatever `len` is.
    let frames = ((len as usize - 1) & (M - 1)) + 1;
    // SAFETY: `frames` <= M, the arrays' length; checked reads.
    let copied = unsafe {
        bpf_probe_read_kernel(
            (*dst).frames.as_mut_ptr().cast(),
            (frames * core::mem::size_of::<PyFrame>()) as u32,
            (*src).frames.as_ptr().cast(),
        )
    };
    // SAFETY: as above.
    unsafe { (*dst).len = if copied == 0 { frames as u32 } else { 0 } };
}
