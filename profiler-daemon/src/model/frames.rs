//! Symbolized stack frames: what the symbolizer produces and the pprof
//! builder consumes.

use std::sync::Arc;

/// A mapped object (executable, shared library, or the kernel image).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// First address of the mapping in the process.
    pub start: u64,
    /// One past the last address of the mapping.
    pub limit: u64,
    /// File offset that `start` maps.
    pub file_offset: u64,
    /// File name as the process sees it (`[kernel.kallsyms]` for the kernel).
    pub path: String,
    /// Hex GNU build ID, if the object has one.
    pub build_id: Option<String>,
}

/// One source line of a location; inlined frames give several, leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Line {
    /// Demangled function name.
    pub function: String,
    /// Source file, when debug info names it.
    pub file: Option<String>,
    /// Source line, 0 when unknown.
    pub line: u32,
}

/// One frame of a stack: an address with what is known about it. An
/// unsymbolized frame has no lines but keeps its address and mapping.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub address: u64,
    pub mapping: Option<Arc<Mapping>>,
    pub lines: Arc<[Line]>,
}
