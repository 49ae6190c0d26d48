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

/// A Python function as its code object names it.
#[derive(Debug, PartialEq, Eq)]
pub struct PyFunction {
    /// `co_qualname`.
    pub name: String,
    /// `co_filename`.
    pub file: String,
}

/// A Python frame of a sample, settled when its record is read (while the
/// process lives, so that its code objects can still be read). Samples at
/// different instructions of the same line are one.
#[derive(Clone, Debug)]
pub enum PyLoc {
    Frame {
        /// None: its code object could not be read.
        function: Option<Arc<PyFunction>>,
        line: u32,
        /// The first frame of an evaluator call (3.11's `is_entry`): the
        /// frames after it ran in the calls below.
        first_of_call: bool,
    },
    /// The boundary between the frames of two evaluator calls (3.12+).
    Boundary,
}

/// Equal when of the same function object (one per code object read, so
/// comparing the pointers is comparing the functions) and line.
impl PartialEq for PyLoc {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                PyLoc::Frame {
                    function: a,
                    line: la,
                    first_of_call: fa,
                },
                PyLoc::Frame {
                    function: b,
                    line: lb,
                    first_of_call: fb,
                },
            ) => {
                let same = match (a, b) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                };
                same && la == lb && fa == fb
            }
            (PyLoc::Boundary, PyLoc::Boundary) => true,
            _ => false,
        }
    }
}

impl Eq for PyLoc {}

impl std::hash::Hash for PyLoc {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            PyLoc::Frame {
                function,
                line,
                first_of_call,
            } => {
                function.as_ref().map(Arc::as_ptr).hash(state);
                line.hash(state);
                first_of_call.hash(state);
            }
            PyLoc::Boundary => 0u8.hash(state),
        }
    }
}
