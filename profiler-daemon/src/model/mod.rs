//! The vocabulary every stage shares: profile kinds, symbolized frames and
//! text helpers. Uses nothing else in the crate.

pub mod frames;
pub mod profile_kind;
pub mod text;
