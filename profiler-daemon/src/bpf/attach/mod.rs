//! Where user-space probes go: allocator entry points of heap profiles,
//! Go's and pthread's park points of block profiles, and the placement of
//! a probe within a function's first instructions.

pub mod allocators;
pub(crate) mod cond_park;
pub(crate) mod go_functions;
pub(crate) mod go_heap;
pub(crate) mod go_park;
pub mod placement;

use std::fs::File;
use std::path::Path;

/// The bytes of an ELF file to look for probe points in, mapped read-only
/// rather than read: the finders touch its headers, symbol tables and a
/// few instructions, not the whole code of a library (reading libLLVM's
/// 150 MB whole, once per process mapping it, was most of a start-up's
/// time on a node running compilers).
///
/// The mapping is private and read-only. A file truncated while mapped
/// would fault on access; files probed are executables and libraries that
/// processes have mapped, which are replaced, not rewritten in place (the
/// symbolizer maps the same files).
pub(crate) fn map_file(path: &Path) -> Result<memmap2::Mmap, String> {
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let file = File::open(path).map_err(fail)?;
    if file.metadata().map_err(fail)?.len() == 0 {
        return Err(format!("{}: empty file", path.display()));
    }
    // SAFETY: read-only private mapping of a file opened here; see above
    // for what a file changed under it would do.
    unsafe { memmap2::Mmap::map(&file) }.map_err(fail)
}
