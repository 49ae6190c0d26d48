//! Everything that touches bpf(2): loading the eBPF object and attaching
//! its programs (`probes`), what the running kernel offers (`features`)
//! and the refusals that follow from it (`check`), typed ring and map
//! reads (`drain`, `map_syscalls`), uprobe sessions and link closing, the
//! kernel programs' own log (`log`), and where user-space probes go
//! (`attach/`: allocators, Go and pthread park points, probe placement).

pub mod attach;
pub mod check;
pub mod drain;
pub mod features;
pub mod link_closer;
pub mod log;
pub mod map_syscalls;
pub mod probes;
pub mod uprobe_session;
