//! The vocabulary every stage shares: profile kinds, symbolized frames,
//! text helpers, the reader of Go's function table and the names of
//! goroutines' wait reasons, and of CPython's location tables. Uses nothing else in the crate.

pub mod frames;
pub mod go_buildinfo;
pub mod go_pclntab;
pub mod go_wait_reasons;
pub mod profile_kind;
pub mod python_lines;
pub mod text;
