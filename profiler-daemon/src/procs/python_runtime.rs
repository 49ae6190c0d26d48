//! Where a CPython process keeps its threads' frames: the interpreter's
//! object (the executable, or a mapped `libpython3.N.so`) that defines
//! `_PyRuntime`, its release (`Py_Version`, else the file's name), and
//! the release's layout of the structures walked: the thread states and
//! interpreter frames the kernel follows (`PyRuntime`), and the code
//! objects and strings the daemon reads to name a frame (`CodeLayout`).
//!
//! The layouts are per-release tables, taken with `offsetof` from each
//! release's own headers (`Include/internal`, `Py_BUILD_CORE`): 3.11.2
//! (Debian) and 3.11.7, 3.12.1 and 3.13.0 (pyenv) agree within a minor
//! release. A release not in the table is said once and profiled
//! natively.

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use profiler_common::{PY_NO_FIELD, PyRuntime};

use crate::procs::objects::MappedObject;

/// What the daemon needs of a CPython process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonProcess {
    /// The release, as 3.`minor`.
    pub minor: u32,
    /// For the kernel: `_PyRuntime`'s address and the walk's offsets.
    pub runtime: PyRuntime,
    /// For naming frames.
    pub code: CodeLayout,
}

/// Offsets of the fields of code objects, strings and bytes objects read
/// to name a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    /// `PyCodeObject.co_code_adaptive`: where its instructions begin.
    pub code_start: u64,
    pub filename: u64,
    pub qualname: u64,
    pub firstlineno: u64,
    pub linetable: u64,
    /// `sizeof(PyASCIIObject)`: an ASCII string's text follows it.
    pub ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: other compact strings' text.
    pub compact_size: u64,
}

/// `PyObject.ob_type`.
pub const OB_TYPE: u64 = 8;
/// `PyVarObject.ob_size`.
pub const OB_SIZE: u64 = 16;
/// `PyASCIIObject.state` (the kind, compact and ascii bits) and `length`.
pub const STR_STATE: u64 = 32;
pub const STR_LENGTH: u64 = 16;
/// `PyBytesObject.ob_sval`.
pub const BYTES_DATA: u64 = 32;

/// The layouts of CPython 3.`minor`, if known.
pub fn layout(minor: u32) -> Option<(PyRuntime, CodeLayout)> {
    let runtime =
        |threads_head, native, cframe, current, code, previous, owner, is_entry| PyRuntime {
            runtime: 0,
            pid_ns_dev: 0,
            pid_ns_ino: 0,
            interpreters_head: if minor >= 13 { 632 } else { 40 },
            threads_head,
            thread_next: 8,
            thread_native_id: native,
            thread_cframe: cframe,
            current_frame: current,
            frame_code: code,
            frame_previous: previous,
            frame_instr: 56,
            frame_owner: owner,
            frame_is_entry: is_entry,
            _pad: 0,
        };
    let code = |code_start, firstlineno, ascii_size, compact_size| CodeLayout {
        code_start,
        filename: 112,
        qualname: 128,
        firstlineno,
        linetable: 136,
        ascii_size,
        compact_size,
    };
    match minor {
        11 => Some((
            runtime(16, 160, 56, 8, 32, 48, 69, 68),
            code(184, 72, 48, 72),
        )),
        12 => Some((
            runtime(72, 144, 56, 0, 0, 8, 70, PY_NO_FIELD),
            code(192, 68, 40, 56),
        )),
        13 => Some((
            runtime(7344, 160, PY_NO_FIELD, 72, 0, 8, 70, PY_NO_FIELD),
            code(200, 68, 40, 56),
        )),
        _ => None,
    }
}

/// Why a process that runs CPython is not walked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotWalked {
    /// A release without a layout in the table (3.`minor`).
    Release(u32),
}

/// Whether a mapped file's name is CPython's: `python3.N` (a static
/// build: the executable holds the interpreter) or `libpython3.N*.so*`.
pub fn is_interpreter_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libpython3.") || name.starts_with("python3")
}

/// The CPython interpreter process `tgid` runs, from its executable
/// mappings: None when none of them is an interpreter; `Err` when it is
/// one this daemon cannot walk. The executable of a shared build
/// (`python3.12` linking `libpython3.12.so`) has a CPython name but not
/// the interpreter: the first candidate that defines `_PyRuntime` is.
pub fn python_process(
    tgid: u32,
    mappings: &[MappedObject],
) -> Option<Result<PythonProcess, NotWalked>> {
    mappings
        .iter()
        .filter(|m| m.object.is_some() && is_interpreter_name(&m.mapping.path))
        .find_map(|mapped| interpreter_in(tgid, mapped))
}

fn interpreter_in(tgid: u32, mapped: &MappedObject) -> Option<Result<PythonProcess, NotWalked>> {
    let file = std::fs::File::open(format!(
        "/proc/{tgid}/map_files/{:x}-{:x}",
        mapped.mapping.start, mapped.mapping.limit
    ))
    .ok()?;
    // SAFETY: a read-only private mapping of a mapped object file, which is
    // replaced rather than rewritten while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    let symbol = |name: &str| {
        elf.dynamic_symbols()
            .chain(elf.symbols())
            .find(|s| s.name() == Ok(name))
    };
    let runtime_at = symbol("_PyRuntime")?.address();
    // `Py_Version` (3.11+): PY_VERSION_HEX, 0x030b02f0 for 3.11.2.
    let minor = symbol("Py_Version")
        .and_then(|s| {
            let section = elf.section_by_index(s.section_index()?).ok()?;
            let bytes = section.data_range(s.address(), 4).ok()??;
            Some((u32::from_le_bytes(bytes.try_into().ok()?) >> 16) & 0xff)
        })
        .or_else(|| minor_of_name(&mapped.mapping.path))?;
    let Some((mut runtime, code)) = layout(minor) else {
        return Some(Err(NotWalked::Release(minor)));
    };
    let bias = load_bias(&elf, mapped.mapping.start, mapped.mapping.file_offset)?;
    runtime.runtime = runtime_at.checked_add(bias)?;
    (runtime.pid_ns_dev, runtime.pid_ns_ino) = pid_namespace(tgid)?;
    Some(Ok(PythonProcess {
        minor,
        runtime,
        code,
    }))
}

/// Process `tgid`'s pid namespace (device, inode), or zeros when it is the
/// daemon's own.
fn pid_namespace(tgid: u32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let theirs = std::fs::metadata(format!("/proc/{tgid}/ns/pid")).ok()?;
    let ours = std::fs::metadata("/proc/self/ns/pid").ok()?;
    Some(
        match (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
            true => (0, 0),
            false => (theirs.dev(), theirs.ino()),
        },
    )
}

/// The minor release in a name such as `libpython3.11.so.1.0`.
fn minor_of_name(path: &str) -> Option<u32> {
    let name = path.rsplit('/').next()?;
    let rest = name.split("python3.").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// What the process added to the file's addresses, from one mapping of
/// it: the mapping's start less the address the file's segment gives the
/// mapped file offset.
fn load_bias<'d, R: object::ReadRef<'d>>(
    elf: &object::File<'d, R>,
    start: u64,
    file_offset: u64,
) -> Option<u64> {
    let segment = elf.segments().find(|s| {
        let (offset, size) = s.file_range();
        offset <= file_offset && file_offset < offset + size
    })?;
    let address = segment.address() + (file_offset - segment.file_range().0);
    start.checked_sub(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_interpreters() {
        assert!(is_interpreter_name("/usr/bin/python3.11"));
        assert!(is_interpreter_name(
            "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0"
        ));
        assert!(!is_interpreter_name("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(minor_of_name("/x/libpython3.12.so.1.0"), Some(12));
        assert_eq!(minor_of_name("/usr/bin/python3.11"), Some(11));
        assert_eq!(minor_of_name("/usr/bin/python3"), None);
    }

    #[test]
    fn layouts_differ_by_release() {
        let (r11, c11) = layout(11).expect("3.11");
        assert_eq!((r11.frame_code, r11.frame_is_entry), (32, 68));
        let (r12, c12) = layout(12).expect("3.12");
        assert_eq!((r12.threads_head, r12.frame_is_entry), (72, PY_NO_FIELD));
        assert_eq!((c11.ascii_size, c12.ascii_size), (48, 40));
        let (r13, _) = layout(13).expect("3.13");
        assert_eq!((r13.thread_cframe, r13.current_frame), (PY_NO_FIELD, 72));
        assert!(layout(10).is_none() && layout(14).is_none());
    }
}
