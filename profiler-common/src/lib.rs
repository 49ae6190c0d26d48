//! Records shared by the kernel programs (`profiler-ebpf`) and the daemon.
//!
//! Everything here is `#[repr(C)]` plain data: the kernel writes it into BPF
//! maps and the daemon reads the same bytes back. The `user` feature adds
//! `aya::Pod` so the daemon can use the types as map keys and values.
//!
//! One module per record family, re-exported here so that paths stay short
//! (`profiler_common::HeapAlloc`).
#![no_std]

mod counters;
mod cpu;
mod go;
mod heap;
mod hints;
mod notes;
mod offcpu;
mod proc_events;
mod python;
pub mod sampling;
mod waits;

pub use counters::*;
pub use cpu::*;
pub use go::*;
pub use heap::*;
pub use hints::*;
pub use notes::*;
pub use offcpu::*;
pub use proc_events::*;
pub use python::*;
pub use waits::*;

/// Length of a task's `comm` in the kernel (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Deepest stack the kernel records (kernel.perf_event_max_stack default).
pub const MAX_STACK_DEPTH: usize = 127;

/// The cookie of a uprobe: the probed function in its low 32 bits and, on
/// kernels without uprobe_multi links (before 6.6) or uprobe sessions
/// (before 6.13), where each probe point is a perf-event uprobe of its own
/// and a function's entry and return are two probes, which of the two this
/// one is. A uprobe_multi or session cookie has neither bit: the program
/// then tells a return from the instruction pointer.
pub mod probe_cookie {
    /// The probed function (`alloc_fn`, `go_fn`, `cond_fn`).
    pub const FUNCTION: u64 = 0xffff_ffff;
    /// A perf-event uprobe at the function's entry.
    pub const AT_ENTRY: u64 = 1 << 32;
    /// A perf-event uprobe at the function's return (a uretprobe).
    pub const AT_RETURN: u64 = 1 << 33;
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: as below.
    unsafe impl<const N: usize> aya::Pod for super::HeapAlloc<N> {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::HeapFree {}
    // SAFETY: as below.
    unsafe impl<const N: usize> aya::Pod for super::WaitStack<N> {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::WaitHead {}
    // SAFETY: as below.
    unsafe impl<const N: usize> aya::Pod for super::WaitBrief<N> {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::MutexDelay {}
    // SAFETY: as below.
    unsafe impl<const N: usize> aya::Pod for super::OffcpuRecord<N> {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::FutexCall {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::FutexWaker {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::HeapThread {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::LiveKey {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::AllocCallers {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::WalkHintKey {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::WalkHint {}
    // SAFETY: plain `repr(C)` data without padding or pointers.
    unsafe impl aya::Pod for super::SampleKey {}
    // SAFETY: plain `repr(C)` data without padding or pointers.
    unsafe impl aya::Pod for super::FpProcess {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ParkGate {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::GoPark {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::GoLabels {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ImageAnchors {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Stack {}
    // SAFETY: as above.
    unsafe impl<const N: usize> aya::Pod for super::StackSample<N> {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PyRuntime {}
    // SAFETY: as above.
    unsafe impl<const N: usize> aya::Pod for super::PySample<N> {}
    // SAFETY: as above.
    unsafe impl<const N: usize> aya::Pod for super::PyFrames<N> {}
}
