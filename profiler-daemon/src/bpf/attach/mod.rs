//! Where user-space probes go: allocator entry points of heap profiles,
//! Go's and pthread's park points of block profiles, and the placement of
//! a probe within a function's first instructions.

pub mod allocators;
pub(crate) mod cond_park;
pub(crate) mod go_park;
pub mod placement;
