//! The vocabulary every stage shares: profile kinds, symbolized frames,
//! text helpers and the reader of Go's function table. Uses nothing else
//! in the crate.

pub mod frames;
pub mod go_buildinfo;
pub mod go_pclntab;
pub mod profile_kind;
pub mod text;
