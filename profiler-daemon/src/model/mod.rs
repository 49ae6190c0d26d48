//! The vocabulary every stage shares: profile kinds, symbolized frames,
//! text helpers, the reader of Go's function table and the names of
//! goroutines' wait reasons, of CPython's location tables, the daemon's own
//! heap (its allocator) and the taps of on-demand captures. Uses nothing
//! else in the crate.

pub mod frames;
pub mod go_buildinfo;
#[cfg(test)]
pub mod go_dwarf;
pub mod go_pclntab;
pub mod go_wait_reasons;
pub mod own_heap;
pub mod profile_kind;
pub mod python_lines;
pub mod taps;
pub mod text;
