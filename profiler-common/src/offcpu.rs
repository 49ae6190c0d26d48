//! Off-CPU profiles: the parked record of a blocked thread.

use crate::{COMM_LEN, MAX_STACK_DEPTH};

/// Bytes of user stack kept per blocked thread for the off-CPU profile
/// (copied at every blocking switch-out, so smaller than CPU samples' copy).
pub const OFFCPU_STACK_BYTES: usize = 8 * 1024;

/// Kernel frames kept per off-CPU event.
pub const OFFCPU_KERNEL_DEPTH: usize = 64;

/// Threads with a slot for their switch-out stacks at once (a slot lives
/// until its thread exits; allocated as used).
pub const OFFCPU_PARKED_ENTRIES: u32 = 8192;

/// Threads marked deep whose switch-out stacks are parked at once in the
/// long form (`OFFCPU_DEEP_STACKS`, allocated as used; a slot lives until
/// its thread exits). Beyond it, a deep thread's copies are the usual
/// ones.
pub const OFFCPU_DEEP_ENTRIES: u32 = 256;

/// A thread that left the CPU blocked: its stacks at the switch-out, parked
/// in `OFFCPU_PARKED` until it runs again; sent (with `duration_ns`) as a
/// `wait_event::OFFCPU` event when kept. A thread marked deep
/// (`DEEP_THREADS`) parks its stack copy in `OFFCPU_DEEP_STACKS` instead
/// (`wait_flags::LONG_STACK`) and is sent in the long form, N =
/// LONG_STACK_BYTES; the daemon tells the forms apart by their length.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OffcpuRecord<const N: usize = OFFCPU_STACK_BYTES> {
    /// `wait_event::OFFCPU`.
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    /// `wait_flags` (`HINT_MATCHED`, `BRIEF`).
    pub flags: u32,
    /// The process that forked this one, when the kernel knows it for a
    /// child of a known process that has not exec'd (set when the record
    /// is sent); else 0.
    pub parent: u32,
    pub _pad: u32,
    /// When it left the CPU (ns, CLOCK_MONOTONIC).
    pub start_ns: u64,
    /// How long it was off the CPU (set when it is switched in).
    pub duration_ns: u64,
    /// User registers saved on entering the kernel.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// With `wait_flags::HINT_MATCHED`: the walk hint the stack matched.
    pub hint_id: u64,
    /// Bytes of `stack` copied from `sp` up (0: frames were walked instead,
    /// or a hint matched); parked with `wait_flags::LONG_STACK`, bytes of
    /// the thread's `OFFCPU_DEEP_STACKS` slot.
    pub stack_len: u64,
    /// Frames of `frames` in use: a frame-pointer walk, or with
    /// `wait_flags::HINT_MATCHED` the remembered walk's frames after `ip`.
    pub frames_len: u64,
    /// Frames of `kernel` in use.
    pub kernel_len: u64,
    /// A Go thread's: the id of the pprof label set of the goroutine it
    /// ran when it blocked (a `GO_LABEL_SETS` key; 0: none).
    pub go_labels: u64,
    pub comm: [u8; COMM_LEN],
    pub kernel: [u64; OFFCPU_KERNEL_DEPTH],
    pub frames: [u64; MAX_STACK_DEPTH],
    pub stack: [u8; N],
    /// A CPython thread's Python frames at the switch-out (none for other
    /// processes; copied from the parked record only when there are).
    pub python: crate::PyFrames<{ crate::OFFCPU_PY_FRAMES }>,
}

/// A deep thread's switch-out stack copy, parked beside its record.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DeepStack {
    pub stack: [u8; crate::LONG_STACK_BYTES],
}
