//! The processes the daemon profiles: their table (mapped objects, images,
//! lifetimes, fed by process events), the labels their environment
//! gives them (container, pod, systemd unit), and what the kernel needs
//! to read of a Go process (`go_runtime`) and the rate its runtime samples
//! its heap by (`go_heap_rate`), and the goroutines read from
//! a Go process's memory (`goroutines`), those parked past a park-probe
//! window followed to their wait's end (`go_parked`); reading a process's memory
//! (`memory`); and where a CPython process keeps its threads' frames
//! (`python_runtime`), from 3.13 on as the interpreter says itself
//! (`python_debug_offsets`).

pub mod environment;
pub(crate) mod go_code;
pub(crate) mod go_heap_rate;
pub(crate) mod go_parked;
pub(crate) mod go_runtime;
pub(crate) mod goroutines;
mod lineage;
pub(crate) mod memory;
pub(crate) mod objects;
pub(crate) mod process;
pub(crate) mod python_debug_offsets;
pub(crate) mod python_runtime;
