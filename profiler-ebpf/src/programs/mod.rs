//! The kernel programs, one file per family; each holds its own maps.

pub(crate) mod cond_wait;
pub(crate) mod cpu;
pub(crate) mod futex;
pub(crate) mod go_heap;
pub(crate) mod go_park;
pub(crate) mod heap;
pub(crate) mod offcpu;
pub(crate) mod proc_events;
