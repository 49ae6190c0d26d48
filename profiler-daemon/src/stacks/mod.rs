//! From recorded stacks to named frames: unwinding stack copies with
//! DWARF CFI (`unwind`), the walks remembered for walk hints
//! (`walk_memo`), threads' stack tops, symbolizing addresses (`symbolize`,
//! `plt`).

pub mod plt;
pub mod stack_tops;
pub mod symbolize;
pub mod unwind;
pub mod walk_memo;
