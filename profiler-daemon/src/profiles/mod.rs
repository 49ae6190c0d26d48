//! Per profile type, decoding its records into the window's samples
//! (`heap`, `waits` for block, mutex and off-CPU; `goroutine` reads Go
//! processes' goroutines instead), Go's rescaling rules
//! (`rescale`) and building the pprof profile (`pprof`).

pub mod cpu;
pub mod goroutine;
pub mod heap;
pub mod pprof;
pub mod records;
pub mod rescale;
pub mod samples;
pub mod waits;
