//! Python frames: which processes run CPython (and where the kernel finds
//! their threads' frames, `procs::python_runtime`), the code objects the
//! kernel's frames point to, read from the process's memory once each
//! (qualified name, file, first line and location table) when the
//! sample's record is read, while the process lives, and the
//! placing of a sample's Python frames among its native ones: each call
//! of the evaluator (`_PyEval_EvalFrameDefault`) on the native stack is
//! replaced by the Python frames it ran, as `py-spy --native` shows them.
//! Under `-X perf` (3.12+) each of those calls is entered through a
//! trampoline that the process's perf map names `py::f:file`: the same
//! function again, so such frames are left out where Python frames are
//! placed.
//!
//! Bounded: at most `MAX_PROCESSES` processes and `MAX_CODES` code
//! objects per process (the process's cache is emptied when full), each
//! string and table capped. A code object freed and its memory reused by
//! another between two reads of the same address keeps the first name
//! until the process's cache is emptied: code objects live as long as
//! their functions, which is mostly as long as the program.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use profiler_common::{PyFrame, PyRuntime};

use crate::model::frames::{Frame, Line, PyFunction, PyLoc};
use crate::model::python_lines::{line_of, line_of_linetable310, line_of_lnotab};
use crate::procs::memory::Memory;
use crate::procs::process::ProcessTable;
use crate::procs::python_runtime::{
    BYTES_DATA, CODE_HEAD, CodeLayout, Interpreter, LayoutSource, LineForm, NotWalked, OB_SIZE,
    OB_TYPE, PythonProcess, STR_LENGTH, STR_STATE, TP_NAME, python_process,
};

/// Python processes followed at once (the kernel's `PY_PROCESSES`).
const MAX_PROCESSES: usize = profiler_common::PY_PROCESSES_ENTRIES as usize;
/// Code objects kept per process.
const MAX_CODES: usize = 16_384;
/// Longest name or file name read, in characters.
const MAX_TEXT: usize = 1024;
/// Longest location table read, in bytes.
const MAX_TABLE: usize = 64 * 1024;

/// The evaluator whose calls Python frames take the place of.
const EVALUATOR: &str = "_PyEval_EvalFrameDefault";

/// A change to the kernel's table of Python processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PythonMark {
    Mark(u32, PyRuntime),
    Unmark(u32),
}

/// What is known of a code object.
#[derive(Debug)]
struct Code {
    function: Arc<PyFunction>,
    first_line: u32,
    table: Vec<u8>,
    /// Address of its first instruction.
    start: u64,
}

#[derive(Debug)]
struct Process {
    generation: u32,
    /// When the snapshot looked at was taken.
    seen: Instant,
    python: Option<PythonProcess>,
    /// The address of the code type, once a code object had it.
    code_type: Option<u64>,
    codes: HashMap<u64, Option<Arc<Code>>>,
}

/// Counts for the exit summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonStats {
    /// CPython processes whose frames the kernel reads.
    pub processes: u64,
    /// Python frames named.
    pub frames: u64,
    /// Python frames whose code object could not be read.
    pub frames_unread: u64,
    /// Code objects read from processes' memory.
    pub code_reads: u64,
    /// Samples with more Python evaluator segments than evaluator calls
    /// on their native stack (a native stack cut short): the rest are
    /// placed at its root end.
    pub segments_unplaced: u64,
    /// `-X perf` trampolines left out beside the Python frames they
    /// enter.
    pub trampolines_folded: u64,
    /// Processes whose layout came from their interpreter's debug
    /// offsets (3.13).
    pub layouts_from_debug_offsets: u64,
    /// Processes whose interpreter's debug offsets were refused (the
    /// table used instead).
    pub debug_offsets_rejected: u64,
}

#[derive(Debug, Default)]
pub struct PythonCodes {
    procs: HashMap<u32, Process>,
    warned: HashSet<u32>,
    /// Interpreter files whose debug offsets were refused, said once each.
    warned_files: HashSet<String>,
    /// Caches off (`[debug] python_caches = false`): code objects read
    /// at every frame (the last read standing in once the process is
    /// gone), thread states searched at every sample.
    uncached: bool,
    pub stats: PythonStats,
}

impl PythonCodes {
    /// Whether code objects (here) and thread states (in the kernel) are
    /// remembered: off only to compare.
    pub fn set_caches(&mut self, on: bool) {
        self.uncached = !on;
    }

    /// Looks at the processes whose snapshot is new since the last call
    /// for a CPython interpreter, and forgets those gone; returns what the
    /// kernel's table must learn. Every second.
    pub fn watch(&mut self, procs: &ProcessTable) -> Vec<PythonMark> {
        let mut marks = Vec::new();
        self.procs.retain(|&tgid, known| {
            let live = procs.peek(tgid).is_some_and(|info| {
                !info.is_exited() && procs.generation(tgid) == known.generation
            });
            if !live && known.python.is_some() {
                marks.push(PythonMark::Unmark(tgid));
            }
            live
        });
        for (tgid, generation, info) in procs.live_images() {
            let seen = info.snapshot_at();
            if let Some(known) = self.procs.get(&tgid)
                && known.generation == generation
                && (known.seen == seen || known.python.is_some())
            {
                continue;
            }
            if self.procs.len() >= MAX_PROCESSES && !self.procs.contains_key(&tgid) {
                continue;
            }
            let python = match python_process(tgid, info.mappings()) {
                Some(Ok(found)) => Some(self.layout_found(tgid, found)),
                Some(Err(NotWalked::Release(minor))) => {
                    if self.warned.len() < 64 && self.warned.insert(minor) {
                        tracing::info!(
                            "process {tgid} runs CPython 3.{minor}, whose frames this build does not read: it is profiled natively"
                        );
                    }
                    None
                }
                None => None,
            };
            if let Some(python) = &python {
                tracing::debug!("process {tgid} runs CPython 3.{}", python.minor);
                marks.push(PythonMark::Mark(tgid, self.kernel_runtime(python)));
                self.stats.processes += 1;
            }
            self.procs.insert(
                tgid,
                Process {
                    generation,
                    seen,
                    python,
                    code_type: None,
                    codes: HashMap::new(),
                },
            );
        }
        marks
    }

    /// What the kernel is told of CPython process `python`.
    fn kernel_runtime(&self, python: &PythonProcess) -> PyRuntime {
        let mut runtime = python.runtime;
        if self.uncached {
            runtime.flags |= profiler_common::py_flags::NO_THREAD_CACHE;
        }
        runtime
    }

    /// The mark `watch` gave process `tgid`, if it runs a CPython whose
    /// frames are read (for probes loaded later, such as a capture's own).
    pub fn runtime_of(&self, tgid: u32) -> Option<PyRuntime> {
        let python = self.procs.get(&tgid)?.python.as_ref()?;
        Some(self.kernel_runtime(python))
    }

    /// Counts where a found interpreter's layout came from, and says once
    /// per file why its debug offsets were refused.
    fn layout_found(&mut self, tgid: u32, found: Interpreter) -> PythonProcess {
        match found.source {
            LayoutSource::Table => {}
            LayoutSource::DebugOffsets => self.stats.layouts_from_debug_offsets += 1,
            LayoutSource::Rejected(why) => {
                self.stats.debug_offsets_rejected += 1;
                if self.warned_files.len() < 64 && self.warned_files.insert(found.path.clone()) {
                    tracing::warn!(
                        "process {tgid}: the debug offsets of {} are not used ({why}): its layout is this build's table for CPython 3.{}",
                        found.path,
                        found.process.minor
                    );
                }
            }
        }
        found.process
    }

    /// Settles the Python frames of a sample of `tgid` (see [`PyLoc`]),
    /// reading the code objects not known yet.
    pub fn settle(&mut self, tgid: u32, frames: &[PyFrame]) -> Arc<[PyLoc]> {
        let Some(process) = self.procs.get_mut(&tgid) else {
            return Arc::from(Vec::new());
        };
        let Some(python) = process.python else {
            return Arc::from(Vec::new());
        };
        // Opened at the first code object not known yet.
        let mut mem: Option<Option<Memory>> = None;
        let mut locs = Vec::with_capacity(frames.len());
        for frame in frames {
            if frame.code == 0 {
                locs.push(PyLoc::Boundary);
                continue;
            }
            let address = frame.code & !7;
            if process.codes.len() >= MAX_CODES {
                process.codes.clear();
            }
            let known = process.codes.get(&address);
            let code = if known.is_some() && !self.uncached {
                known.cloned().flatten()
            } else {
                // Uncached, read again at every frame while the process
                // lives; what was read last stands in once it is gone.
                let fresh = mem
                    .get_or_insert_with(|| Memory::open(tgid))
                    .as_ref()
                    .and_then(|mem| {
                        self.stats.code_reads += 1;
                        read_code(mem, &python.code, address, &mut process.code_type)
                    })
                    .map(Arc::new);
                let code = fresh.or_else(|| known.cloned().flatten());
                process.codes.insert(address, code.clone());
                code
            };
            let line = code.as_ref().map_or(0, |code| {
                line_at(python.code.lines, code, frame.instr).unwrap_or(code.first_line)
            });
            locs.push(PyLoc::Frame {
                function: code.map(|code| Arc::clone(&code.function)),
                line,
                // Before 3.11 each frame has an evaluator call of its own.
                first_of_call: frame.code & 1 != 0 || python.code.lines != LineForm::Positions,
            });
        }
        Arc::from(locs)
    }

    /// A sample's Python frames as segments (leaf first), one per
    /// evaluator call, the innermost first.
    pub fn segments(&mut self, locs: &[PyLoc]) -> Vec<Vec<Frame>> {
        let mut segments = vec![Vec::new()];
        for loc in locs {
            let PyLoc::Frame {
                function,
                line,
                first_of_call,
            } = loc
            else {
                segments.push(Vec::new());
                continue;
            };
            let named = match function {
                Some(function) => {
                    self.stats.frames += 1;
                    python_frame(&function.name, Some(&function.file), *line)
                }
                None => {
                    self.stats.frames_unread += 1;
                    python_frame("[unknown Python code]", None, 0)
                }
            };
            if let Some(last) = segments.last_mut() {
                last.push(named);
            }
            if *first_of_call {
                segments.push(Vec::new());
            }
        }
        if segments.last().is_some_and(Vec::is_empty) {
            segments.pop();
        }
        segments
    }

    /// Replaces each evaluator frame of `native` (leaf first, one
    /// process's user frames) with the Python frames it ran; segments
    /// left over (the native stack ended first) go at the root end.
    pub fn interleave(&mut self, native: Vec<Frame>, segments: Vec<Vec<Frame>>) -> Vec<Frame> {
        if segments.is_empty() {
            return native;
        }
        let mut out =
            Vec::with_capacity(native.len() + segments.iter().map(Vec::len).sum::<usize>());
        let mut segments = segments.into_iter();
        for frame in native {
            if is_trampoline(&frame) {
                self.stats.trampolines_folded += 1;
                continue;
            }
            if is_evaluator(&frame)
                && let Some(segment) = segments.next()
            {
                out.extend(segment);
                continue;
            }
            out.push(frame);
        }
        let mut rest = segments.peekable();
        if rest.peek().is_some() {
            self.stats.segments_unplaced += 1;
            out.extend(rest.flatten());
        }
        out
    }
}

/// The line a frame of `code` is at, from the kernel's `instr`: an
/// instruction pointer (3.11+), or a word whose low half is `f_lasti`
/// (-1 before the first instruction).
fn line_at(form: LineForm, code: &Code, instr: u64) -> Option<u32> {
    let lasti = u64::try_from((instr as u32 as i32).max(0)).unwrap_or(0);
    match form {
        LineForm::Positions => line_of(
            &code.table,
            code.first_line,
            instr.wrapping_sub(code.start) / 2,
        ),
        LineForm::Linetable310 => line_of_linetable310(&code.table, code.first_line, lasti * 2),
        LineForm::Lnotab => Some(line_of_lnotab(&code.table, code.first_line, lasti)),
    }
}

/// Whether `frame` is CPython's perf trampoline (JIT code the perf map
/// names `py::function:file`).
fn is_trampoline(frame: &Frame) -> bool {
    frame
        .mapping
        .as_ref()
        .is_none_or(|m| super::is_anonymous(&m.path))
        && frame.lines.len() == 1
        && frame.lines[0].function.starts_with("py::")
}

fn is_evaluator(frame: &Frame) -> bool {
    frame
        .lines
        .last()
        .is_some_and(|line| line.function.starts_with(EVALUATOR))
}

/// A Python frame: no address of its own (one location per function and
/// line).
fn python_frame(function: &str, file: Option<&str>, line: u32) -> Frame {
    Frame {
        address: 0,
        mapping: None,
        lines: Arc::from(vec![Line {
            function: function.to_owned(),
            file: file.map(str::to_owned),
            line,
        }]),
    }
}

/// Reads the code object at `address`; None when it is not one (its type
/// is not `code`) or cannot be read.
fn read_code(
    mem: &Memory,
    layout: &CodeLayout,
    address: u64,
    code_type: &mut Option<u64>,
) -> Option<Code> {
    let mut head = [0u8; CODE_HEAD];
    if !mem.read(address, &mut head) {
        return None;
    }
    let word = |at: u64| -> Option<u64> {
        let at = usize::try_from(at).ok()?;
        Some(u64::from_le_bytes(head.get(at..at + 8)?.try_into().ok()?))
    };
    let ob_type = word(OB_TYPE)?;
    match *code_type {
        Some(known) if known != ob_type => return None,
        Some(_) => {}
        None => {
            let name = mem.u64(ob_type.checked_add(TP_NAME)?)?;
            let mut text = [0u8; 5];
            if !mem.read(name, &mut text) || &text != b"code\0" {
                return None;
            }
            *code_type = Some(ob_type);
        }
    }
    let first_line = {
        let at = usize::try_from(layout.firstlineno).ok()?;
        i32::from_le_bytes(head.get(at..at + 4)?.try_into().ok()?)
    };
    Some(Code {
        function: Arc::new(PyFunction {
            name: read_str(mem, layout, word(layout.qualname)?)?,
            file: read_str(mem, layout, word(layout.filename)?)?,
        }),
        first_line: u32::try_from(first_line).unwrap_or(0),
        table: read_bytes(mem, word(layout.linetable)?)?,
        start: address.checked_add(layout.code_start)?,
    })
}

/// The text of a compact `str` (names and file names are).
fn read_str(mem: &Memory, layout: &CodeLayout, at: u64) -> Option<String> {
    let mut head = [0u8; 40];
    if !mem.read(at, &mut head) {
        return None;
    }
    let length = u64::from_le_bytes(head[STR_LENGTH as usize..][..8].try_into().ok()?);
    let state = u32::from_le_bytes(head[STR_STATE as usize..][..4].try_into().ok()?);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 {
        return None;
    }
    let chars = usize::try_from(length).ok()?.min(MAX_TEXT);
    if ascii == 1 {
        let mut text = vec![0u8; chars];
        return mem
            .read(at.checked_add(layout.ascii_size)?, &mut text)
            .then(|| String::from_utf8_lossy(&text).into_owned());
    }
    let width = usize::try_from(kind)
        .ok()
        .filter(|k| matches!(k, 1 | 2 | 4))?;
    let mut data = vec![0u8; chars * width];
    if !mem.read(at.checked_add(layout.compact_size)?, &mut data) {
        return None;
    }
    Some(
        data.chunks_exact(width)
            .map(|c| {
                let mut word = [0u8; 4];
                word[..width].copy_from_slice(c);
                char::from_u32(u32::from_le_bytes(word)).unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    )
}

/// The bytes of a `bytes` object (a location table).
fn read_bytes(mem: &Memory, at: u64) -> Option<Vec<u8>> {
    let size = mem.u64(at.checked_add(OB_SIZE)?)?;
    let size = usize::try_from(size).ok()?.min(MAX_TABLE);
    let mut bytes = vec![0u8; size];
    mem.read(at.checked_add(BYTES_DATA)?, &mut bytes)
        .then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(function: &str) -> Frame {
        python_frame(function, None, 0)
    }

    fn names(frames: &[Frame]) -> Vec<&str> {
        frames
            .iter()
            .map(|f| f.lines[0].function.as_str())
            .collect()
    }

    #[test]
    fn evaluator_calls_take_their_python_frames() {
        let mut codes = PythonCodes::default();
        let native = ["leaf_c", EVALUATOR, "PyObject_Call", EVALUATOR, "main"]
            .map(named)
            .to_vec();
        let segments = vec![
            vec![named("inner"), named("outer")],
            vec![named("<module>")],
        ];
        let stack = codes.interleave(native, segments);
        assert_eq!(
            names(&stack),
            [
                "leaf_c",
                "inner",
                "outer",
                "PyObject_Call",
                "<module>",
                "main"
            ]
        );
        assert_eq!(codes.stats.segments_unplaced, 0);
    }

    /// `-X perf`: a trampoline per evaluator call, named by the perf map;
    /// the Python frames stand for it.
    #[test]
    fn perf_trampolines_are_left_out_beside_python_frames() {
        let mut codes = PythonCodes::default();
        let native = [
            "leaf_c",
            EVALUATOR,
            "py::inner:/app/m.py",
            "_PyEval_Vector",
            EVALUATOR,
            "py::<module>:/app/m.py",
            "main",
        ]
        .map(named)
        .to_vec();
        let segments = vec![vec![named("inner")], vec![named("<module>")]];
        let stack = codes.interleave(native.clone(), segments);
        assert_eq!(
            names(&stack),
            ["leaf_c", "inner", "_PyEval_Vector", "<module>", "main"]
        );
        assert_eq!(codes.stats.trampolines_folded, 2);
        // Without Python frames (not read) the trampolines name the calls.
        assert_eq!(codes.interleave(native.clone(), Vec::new()).len(), 7);
    }

    #[test]
    fn segments_beyond_the_native_stack_go_at_its_root() {
        let mut codes = PythonCodes::default();
        let native = [EVALUATOR, "PyObject_Call"].map(named).to_vec();
        let segments = vec![vec![named("a")], vec![named("b")]];
        let stack = codes.interleave(native, segments);
        assert_eq!(names(&stack), ["a", "PyObject_Call", "b"]);
        assert_eq!(codes.stats.segments_unplaced, 1);
        // No Python frames: the native stack as it was.
        let native = [EVALUATOR].map(named).to_vec();
        assert_eq!(names(&codes.interleave(native, Vec::new())), [EVALUATOR]);
    }

    /// This process's own memory stands in for a Python process's: a
    /// compact ASCII string, a UCS-2 one, and a bytes object, laid out as
    /// CPython 3.12 lays them out.
    #[test]
    fn strings_and_bytes_are_read_from_memory() {
        let (_, layout) = crate::procs::python_runtime::layout(12, None).expect("3.12");
        let mem = Memory::open(std::process::id()).expect("own memory");
        let mut ascii = [0u8; 64];
        ascii[16..24].copy_from_slice(&5u64.to_le_bytes());
        ascii[32..36].copy_from_slice(&((1u32 << 2) | (1 << 5) | (1 << 6)).to_le_bytes());
        ascii[40..45].copy_from_slice(b"spin_");
        assert_eq!(
            read_str(&mem, &layout, ascii.as_ptr() as u64).as_deref(),
            Some("spin_")
        );
        let mut wide = [0u8; 80];
        wide[16..24].copy_from_slice(&2u64.to_le_bytes());
        wide[32..36].copy_from_slice(&((2u32 << 2) | (1 << 5)).to_le_bytes());
        wide[56..60].copy_from_slice(&[0xb1, 0x03, 0xb2, 0x03]);
        assert_eq!(
            read_str(&mem, &layout, wide.as_ptr() as u64).as_deref(),
            Some("αβ")
        );
        let mut bytes = [0u8; 40];
        bytes[16..24].copy_from_slice(&3u64.to_le_bytes());
        bytes[32..35].copy_from_slice(&[1, 2, 3]);
        assert_eq!(read_bytes(&mem, bytes.as_ptr() as u64), Some(vec![1, 2, 3]));
        // Not compact: not read.
        ascii[32..36].copy_from_slice(&(1u32 << 2).to_le_bytes());
        assert_eq!(read_str(&mem, &layout, ascii.as_ptr() as u64), None);
    }
}
