//! From recorded stacks to named frames: unwinding stack copies with
//! DWARF CFI (`unwind`), the walks remembered for walk hints
//! (`walk_memo`), threads' stack tops, symbolizing addresses (`symbolize`,
//! `plt`, and Go's own function table, `model::go_pclntab`), letting go of the
//! pages of the files symbolized (`file_pages`), and the memory budget all
//! their caches draw on (`budget`).

pub mod budget;
pub mod file_pages;
pub mod plt;
pub mod stack_tops;
pub mod symbol_aliases;
pub mod symbolize;
pub mod unwind;
pub mod walk_memo;
