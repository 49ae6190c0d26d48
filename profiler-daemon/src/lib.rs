//! profilerd: a system-wide continuous profiler. The folders follow the data
//! flow, and each uses only those listed before it (`cargo xtask layout`
//! checks): the shared vocabulary, the configuration, the kernel side,
//! the processes, their stacks, the profiles built from them, where the
//! profiles go, and the session that schedules it all. `report` reads
//! profile files. docs/ARCHITECTURE.md maps them.

pub mod model;

pub mod config;

pub mod kernel;

pub mod procs;

pub mod stacks;

pub mod profiles;

pub mod output;

pub mod session;

pub mod report;
