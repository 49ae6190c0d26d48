//! Kernel-side probes of profilerd: one file per program family under
//! `programs/`, the maps and load-time globals several of them share, and
//! the stack helpers they use.
//!
//! - `programs/cpu.rs`: `cpu_sample`, on every CPU-clock tick; its counts
//!   and frame-pointer stacks are double-buffered (the daemon flips
//!   `CONTROL[ACTIVE_BUFFER]` and drains the buffer the kernel no longer
//!   writes), or the sample goes to the daemon with a stack copy to unwind;
//!   a Go process's sample is tail-called to `go_sample` (leaf callers'
//!   words, goroutine labels), which the daemon loads at the first Go
//!   process, and a CPython process's to `py_sample` (its Python frames,
//!   `python.rs`), loaded at the first Python process.
//! - `programs/heap.rs`: `heap_probe`, the allocator uprobe session.
//! - `programs/futex.rs`, `cond_wait.rs`, `go_park.rs`: block and mutex
//!   waits; `programs/offcpu.rs`: `sched_switch`.
//! - `programs/proc_events.rs`: fork, exec and exit, so that the daemon
//!   follows descendants and snapshots a process's mappings while it lives.
//! - `globals.rs`: the read-only globals the daemon sets before loading;
//!   `maps.rs`: maps several programs use; `counters.rs`: loss and event
//!   counters; `process.rs`: process events and image anchors;
//!   `go_labels.rs`: a Go goroutine's pprof labels at a CPU sample;
//!   `python.rs`: a CPython thread's frames; `python_records.rs`: those
//!   of heap samples and wait records; `user_memory.rs`: their checked
//!   reads of user memory.
//! - `stack/`: user-stack copies (`copy.rs`), walk hints (`hints.rs`) and
//!   the choice between a copy and a frame-pointer walk; `waits.rs`: the
//!   wait record ring and its senders.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
// For `atomic_xadd` (see `programs::go_park::gate`).
#![allow(internal_features)]

mod counters;
mod globals;
mod go_labels;
mod klog;
mod maps;
mod process;
mod programs;
mod python;
mod python_records;
mod stack;
mod task_storage;
mod user_memory;
mod waits;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach a panic.
    unsafe { core::hint::unreachable_unchecked() }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
