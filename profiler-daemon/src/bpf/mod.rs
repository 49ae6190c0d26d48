//! Everything that touches bpf(2): loading the eBPF object and attaching
//! its programs (`probes`), what the running kernel offers (`features`)
//! and the refusals that follow from it (`check`), typed ring and map
//! reads (`drain`, `map_syscalls`, and Go label sets: `go_labels`),
//! user-space probes and their links
//! (`uprobes`, `perf_uprobe`; the raw loads and links aya lacks:
//! `raw_programs`) and link closing, the CPU-clock events of on-demand
//! captures (`capture_events`), Go park probes on a duty
//! cycle (`park_budget`), allocator wrappers told apart
//! (`allocator_callers`), the
//! kernel programs' own log (`log`), and where user-space probes go
//! (`attach/`: allocators, Go and pthread park points, probe placement).

pub(crate) mod allocator_callers;
pub mod attach;
pub(crate) mod capture_events;
pub mod check;
pub(crate) mod drain;
pub(crate) mod features;
pub(crate) mod go_labels;
pub(crate) mod link_closer;
pub mod log;
pub(crate) mod map_syscalls;
pub(crate) mod park_budget;
pub(crate) mod perf_uprobe;
pub(crate) mod probes;
pub(crate) mod raw_programs;
pub(crate) mod ring;
pub(crate) mod tracefs;
pub(crate) mod uprobes;
