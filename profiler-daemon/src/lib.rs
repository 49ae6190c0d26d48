//! profilerd: a system-wide continuous profiler. The folders follow the data
//! flow, and each uses only those listed before it (`cargo xtask layout`
//! checks): the shared vocabulary, the configuration, the kernel side,
//! the processes, their stacks, the profiles built from them, where the
//! profiles go, and the session that schedules it all. `report` reads
//! profile files. docs/ARCHITECTURE.md maps them.

pub(crate) mod model;

/// The daemon's allocator, set up by `main`.
pub use model::own_heap;

pub mod config;

pub mod bpf;

pub mod procs;

pub(crate) mod stacks;

pub(crate) mod profiles;

pub mod output;

pub mod session;

pub mod report;
