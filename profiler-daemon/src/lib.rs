//! profilerd: a system-wide continuous profiler. The modules follow the data
//! flow; docs/ARCHITECTURE.md maps them.

pub mod allocators;
pub mod cond_park;
pub mod config;
pub mod drain;
pub mod environment;
pub mod frames;
pub mod go_park;
pub mod heap;
pub mod kernel_log;
pub mod limits;
pub mod link_closer;
pub mod map_syscalls;
pub mod metrics;
pub mod notify;
pub mod plt;
pub mod pprof;
pub mod probe_placement;
pub mod probes;
pub mod process;
pub mod profile_kind;
pub mod publish;
pub mod push;
pub mod report;
pub mod rescale;
pub mod retention;
pub mod session;
pub mod stack_switches;
pub mod stack_tops;
pub mod symbolize;
pub mod text;
pub mod unwind;
pub mod uprobe_session;
pub mod waits;
pub mod walk_memo;
pub mod writer;
