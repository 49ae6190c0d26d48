//! Where a CPython process keeps its threads' frames: the interpreter's
//! object (the executable, or a mapped `libpython3.N.so`) that defines
//! `_PyRuntime`, its release (`Py_Version`, else the file's name), and
//! the release's layout of the structures walked: the thread states and
//! interpreter frames the kernel follows (`PyRuntime`), and the code
//! objects and strings the daemon reads to name a frame (`CodeLayout`).
//!
//! The layouts are per-release tables, taken with `offsetof` from each
//! release's own headers (`Include/internal`, `Py_BUILD_CORE`): 3.11.2
//! (Debian) and 3.9.18, 3.10.13, 3.11.7, 3.12.1 and 3.13.0 (pyenv);
//! 3.11's two agree. A release not in the table is said once and
//! profiled natively. For 3.13 the offsets the interpreter gives of
//! itself (`_Py_DebugOffsets`, `python_debug_offsets`) replace the
//! table's where they are found and check out; what they do not give
//! (how much of a frame to read, `sizeof(PyCompactUnicodeObject)`, how
//! lines are told) stays the table's, and a file whose struct does not
//! check out is profiled with the table alone ([`LayoutSource`]).
//!
//! 3.14 is refused though it has the struct: its frames hold tagged
//! `_PyStackRef`s (the code object's pointer with flag bits), which the
//! kernel's walk does not untag.
//!
//! 3.9 and 3.10 thread states have no kernel thread id, only the
//! thread's `pthread_t`: with glibc, the address of its `struct pthread`,
//! which holds the id at an offset that this daemon finds in its own
//! threads (`pthread_tid_offset`).

use std::sync::OnceLock;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use profiler_common::{PY_FRAME_BYTES, PY_FRAME_OBJECT_BYTES, PY_NO_FIELD, PyRuntime};

use crate::procs::memory::Memory;
use crate::procs::objects::MappedObject;
use crate::procs::python_debug_offsets::{self as debug_offsets, DebugOffsets, Rejected};

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

/// How a release tells where a frame is in its code, and maps that to a
/// line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineForm {
    /// 3.11+: the frame's instruction pointer, into the code object's
    /// `co_code_adaptive`; the location table of `model::python_lines`.
    Positions,
    /// 3.10: `f_lasti` counts code units; `co_linetable` holds
    /// (bytes, line delta) pairs.
    Linetable310,
    /// 3.9: `f_lasti` counts bytes; `co_lnotab`.
    Lnotab,
}

/// Offsets of the fields of code objects, strings and bytes objects read
/// to name a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub lines: LineForm,
    /// `PyCodeObject.co_code_adaptive`: where its instructions begin
    /// (3.11+).
    pub code_start: u64,
    pub filename: u64,
    /// `co_qualname` (3.11+), else `co_name`.
    pub qualname: u64,
    pub firstlineno: u64,
    /// `co_linetable` (`co_lnotab` in 3.9).
    pub linetable: u64,
    /// `sizeof(PyASCIIObject)`: an ASCII string's text follows it.
    pub ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: other compact strings' text.
    pub compact_size: u64,
}

/// Bytes of a code object read at once: every field used lies in them.
pub const CODE_HEAD: usize = 144;

/// `PyObject.ob_type`.
pub const OB_TYPE: u64 = 8;
/// `PyTypeObject.tp_name`, after the object and size headers.
pub const TP_NAME: u64 = 24;
/// `PyVarObject.ob_size`.
pub const OB_SIZE: u64 = 16;
/// `PyASCIIObject.state` (the kind, compact and ascii bits) and `length`.
pub const STR_STATE: u64 = 32;
pub const STR_LENGTH: u64 = 16;
/// `PyBytesObject.ob_sval`.
pub const BYTES_DATA: u64 = 32;

/// The layouts of CPython 3.`minor`, if known. `pthread_tid` is where
/// glibc's `struct pthread` holds the thread's id (needed before 3.11).
pub fn layout(minor: u32, pthread_tid: Option<u16>) -> Option<(PyRuntime, CodeLayout)> {
    let runtime =
        |threads_head, native, cframe, current, code, previous, owner, is_entry| PyRuntime {
            runtime: 0,
            pid_ns_dev: 0,
            pid_ns_ino: 0,
            interpreters_head: match minor {
                ..=10 => 32,
                11 | 12 => 40,
                _ => 632,
            },
            threads_head,
            thread_next: 8,
            thread_native_id: native,
            thread_id_in_pthread: PY_NO_FIELD,
            thread_cframe: cframe,
            current_frame: current,
            frame_bytes: PY_FRAME_BYTES as u16,
            frame_code: code,
            frame_previous: previous,
            frame_instr: 56,
            frame_owner: owner,
            frame_is_entry: is_entry,
            flags: 0,
            _pad: 0,
        };
    let code = |code_start, firstlineno, ascii_size, compact_size| CodeLayout {
        lines: LineForm::Positions,
        code_start,
        filename: 112,
        qualname: 128,
        firstlineno,
        linetable: 136,
        ascii_size,
        compact_size,
    };
    // Frame objects (3.9, 3.10): `thread_id` is a `pthread_t`, `frame`
    // the current frame; `f_back` and `f_code` at 24 and 32.
    let objects = |lasti, lines| {
        let runtime = PyRuntime {
            thread_id_in_pthread: pthread_tid?,
            frame_bytes: PY_FRAME_OBJECT_BYTES as u16,
            frame_instr: lasti,
            ..runtime(8, 176, PY_NO_FIELD, 24, 32, 24, PY_NO_FIELD, PY_NO_FIELD)
        };
        let code = CodeLayout {
            lines,
            code_start: 0,
            filename: 104,
            qualname: 112,
            firstlineno: 40,
            linetable: 120,
            ..code(0, 0, 48, 72)
        };
        Some((runtime, code))
    };
    match minor {
        9 => objects(104, LineForm::Lnotab),
        10 => objects(96, LineForm::Linetable310),
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

/// Where glibc's `struct pthread` (the object a `pthread_t` points to)
/// holds the thread's kernel id, found once in this daemon's own threads:
/// the first 4-byte word past `pthread_self()` equal to `gettid()`, the
/// same in two threads. None when they disagree or it is not found (not
/// glibc): then 3.9 and 3.10 are profiled natively. A process built with
/// another C library holds its id elsewhere, and its threads are counted
/// as without a thread state.
pub fn pthread_tid_offset() -> Option<u16> {
    static FOUND: OnceLock<Option<u16>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let here = tid_offset_in_this_thread();
        let there = std::thread::spawn(tid_offset_in_this_thread)
            .join()
            .ok()
            .flatten();
        here.filter(|&offset| Some(offset) == there)
    })
}

/// Bytes of a `struct pthread` searched for the id.
const PTHREAD_SEARCHED: usize = 2048;

fn tid_offset_in_this_thread() -> Option<u16> {
    // SAFETY: plain calls without arguments.
    let (me, tid) = unsafe { (libc::pthread_self() as u64, libc::gettid()) };
    let mem = Memory::open(std::process::id())?;
    let mut bytes = vec![0u8; PTHREAD_SEARCHED];
    if !mem.read(me, &mut bytes) {
        return None;
    }
    let tid = u32::try_from(tid).ok()?.to_le_bytes();
    let at = bytes.chunks_exact(4).position(|word| word == tid)?;
    u16::try_from(at * 4).ok()
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

/// A CPython interpreter found in a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    pub process: PythonProcess,
    /// The file that holds it, as the process maps it.
    pub path: String,
    /// Where its layout came from.
    pub source: LayoutSource,
}

/// Where a process's layout came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutSource {
    /// The release's table: it has no debug offsets that this build
    /// reads (before 3.13).
    Table,
    /// 3.13's `_Py_DebugOffsets`, and the table for what they do not give.
    DebugOffsets,
    /// The table, the file's debug offsets refused (why).
    Rejected(Rejected),
}

/// The CPython interpreter process `tgid` runs, from its executable
/// mappings: None when none of them is an interpreter; `Err` when it is
/// one this daemon cannot walk. The executable of a shared build
/// (`python3.12` linking `libpython3.12.so`) has a CPython name but not
/// the interpreter: the first candidate that defines `_PyRuntime` is.
pub fn python_process(
    tgid: u32,
    mappings: &[MappedObject],
) -> Option<Result<Interpreter, NotWalked>> {
    mappings
        .iter()
        .filter(|m| m.object.is_some() && is_interpreter_name(&m.mapping.path))
        .find_map(|mapped| interpreter_in(tgid, mapped))
}

fn interpreter_in(tgid: u32, mapped: &MappedObject) -> Option<Result<Interpreter, NotWalked>> {
    let file = std::fs::File::open(format!(
        "/proc/{tgid}/map_files/{:x}-{:x}",
        mapped.mapping.start, mapped.mapping.limit
    ))
    .ok()?;
    // SAFETY: a read-only private mapping of a mapped object file, which is
    // replaced rather than rewritten while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    let found = interpreter_file(&elf)?;
    let path = &mapped.mapping.path;
    let minor = found
        .version
        .map(|version| (version >> 16) & 0xff)
        .or_else(|| minor_of_name(path))?;
    let pthread_tid = if minor < 11 {
        pthread_tid_offset()
    } else {
        None
    };
    let Some((mut runtime, code, source)) =
        file_layout(minor, pthread_tid, found.version, found.runtime_head)
    else {
        return Some(Err(NotWalked::Release(minor)));
    };
    let bias = load_bias(&elf, mapped.mapping.start, mapped.mapping.file_offset)?;
    runtime.runtime = found.runtime_at.checked_add(bias)?;
    (runtime.pid_ns_dev, runtime.pid_ns_ino) = pid_namespace(tgid)?;
    Some(Ok(Interpreter {
        process: PythonProcess {
            minor,
            runtime,
            code,
        },
        path: path.clone(),
        source,
    }))
}

/// What an interpreter's file says of itself.
struct InterpreterFile<'d> {
    /// `_PyRuntime`'s address in the file.
    runtime_at: u64,
    /// `Py_Version` (3.11+): PY_VERSION_HEX, 0x030b02f0 for 3.11.2.
    version: Option<u32>,
    /// The first bytes of `_PyRuntime` as the file initializes them
    /// (3.13's debug offsets), when it holds that many.
    runtime_head: Option<&'d [u8]>,
}

/// The file's `_PyRuntime` and release; None when it defines no
/// `_PyRuntime` (not the interpreter).
fn interpreter_file<'d>(elf: &object::File<'d>) -> Option<InterpreterFile<'d>> {
    let symbol = |name: &str| {
        elf.dynamic_symbols()
            .chain(elf.symbols())
            .find(|s| s.name() == Ok(name))
    };
    // A symbol's bytes in the file: None in a section without data
    // (`.bss`) or past its end.
    let data = |s: &object::Symbol<'d, '_>, len: usize| {
        let section = elf.section_by_index(s.section_index()?).ok()?;
        section.data_range(s.address(), len as u64).ok()?
    };
    let runtime = symbol("_PyRuntime")?;
    let version = symbol("Py_Version")
        .and_then(|s| data(&s, 4))
        .and_then(|bytes| Some(u32::from_le_bytes(bytes.try_into().ok()?)));
    Some(InterpreterFile {
        runtime_at: runtime.address(),
        version,
        runtime_head: data(&runtime, debug_offsets::BYTES),
    })
}

/// The layouts of 3.`minor` for a file whose `Py_Version` is `version`
/// and whose `_PyRuntime` begins with `runtime_head`: for 3.13 its debug
/// offsets over the table when they check out, else the table; None
/// without a table.
fn file_layout(
    minor: u32,
    pthread_tid: Option<u16>,
    version: Option<u32>,
    runtime_head: Option<&[u8]>,
) -> Option<(PyRuntime, CodeLayout, LayoutSource)> {
    let (runtime, code) = layout(minor, pthread_tid)?;
    if minor != 13 {
        return Some((runtime, code, LayoutSource::Table));
    }
    let read = debug_offsets::read(runtime_head.unwrap_or_default(), version)
        .and_then(|offsets| over_table(&offsets, (runtime, code)));
    Some(match read {
        Ok((runtime, code)) => (runtime, code, LayoutSource::DebugOffsets),
        Err(why) => (runtime, code, LayoutSource::Rejected(why)),
    })
}

/// The table's layouts with each offset the debug offsets give in place
/// of the table's, checked against what is read: a frame's fields within
/// the bytes of it the kernel reads, a code object's within
/// [`CODE_HEAD`], the kernel's offsets within a `u16`, an ASCII string's
/// text before other strings' (`compact_size` is the table's), and the
/// fields read at fixed offsets where this build reads them.
fn over_table(
    offsets: &DebugOffsets,
    (runtime, code): (PyRuntime, CodeLayout),
) -> Result<(PyRuntime, CodeLayout), Rejected> {
    let d = offsets;
    d.ob_type.is(OB_TYPE)?;
    d.tp_name.is(TP_NAME)?;
    d.bytes_size.is(OB_SIZE)?;
    d.bytes_data.is(BYTES_DATA)?;
    d.str_state.is(STR_STATE)?;
    d.str_length.is(STR_LENGTH)?;
    let kernel = |offset: debug_offsets::Offset, limit: u64| {
        let limit = limit.min(u64::from(PY_NO_FIELD));
        offset.within(limit).and_then(|at| {
            u16::try_from(at).map_err(|_| Rejected::Beyond {
                field: offset.name,
                offset: at,
                limit,
            })
        })
    };
    let anywhere = u64::from(PY_NO_FIELD);
    let frame = u64::from(runtime.frame_bytes);
    let head = CODE_HEAD as u64;
    Ok((
        PyRuntime {
            interpreters_head: kernel(d.interpreters_head, anywhere)?,
            threads_head: kernel(d.threads_head, anywhere)?,
            thread_next: kernel(d.thread_next, anywhere)?,
            thread_native_id: kernel(d.native_thread_id, anywhere)?,
            current_frame: kernel(d.current_frame, anywhere)?,
            frame_code: kernel(d.frame_executable, frame)?,
            frame_previous: kernel(d.frame_previous, frame)?,
            frame_instr: kernel(d.frame_instr_ptr, frame)?,
            frame_owner: kernel(d.frame_owner, frame)?,
            ..runtime
        },
        CodeLayout {
            code_start: d.code_adaptive.within(u64::MAX)?,
            filename: d.code_filename.within(head)?,
            qualname: d.code_qualname.within(head)?,
            firstlineno: d.code_firstlineno.within(head)?,
            linetable: d.code_linetable.within(head)?,
            ascii_size: d.ascii_size.within(code.compact_size)?,
            ..code
        },
    ))
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
        let (r11, c11) = layout(11, None).expect("3.11");
        assert_eq!((r11.frame_code, r11.frame_is_entry), (32, 68));
        let (r12, c12) = layout(12, None).expect("3.12");
        assert_eq!((r12.threads_head, r12.frame_is_entry), (72, PY_NO_FIELD));
        assert_eq!((c11.ascii_size, c12.ascii_size), (48, 40));
        let (r13, _) = layout(13, None).expect("3.13");
        assert_eq!((r13.thread_cframe, r13.current_frame), (PY_NO_FIELD, 72));
        let (r10, c10) = layout(10, Some(720)).expect("3.10");
        assert_eq!((r10.frame_instr, r10.thread_id_in_pthread), (96, 720));
        assert_eq!(usize::from(r10.frame_bytes), PY_FRAME_OBJECT_BYTES);
        assert_eq!((c10.lines, c10.qualname), (LineForm::Linetable310, 112));
        let (r9, c9) = layout(9, Some(720)).expect("3.9");
        assert_eq!((r9.frame_instr, c9.lines), (104, LineForm::Lnotab));
        // f_lasti and f_lineno lie in the bytes read.
        assert!(usize::from(r9.frame_instr) + 8 <= PY_FRAME_OBJECT_BYTES);
        assert!(layout(10, None).is_none() && layout(8, Some(720)).is_none());
        assert!(layout(14, None).is_none());
    }

    /// The newest pyenv release of 3.`minor` installed (its prefix).
    fn pyenv_release(minor: u32) -> std::path::PathBuf {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let versions = std::path::Path::new(&home).join(".pyenv/versions");
        std::fs::read_dir(&versions)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&format!("3.{minor}.")))
            })
            .max()
            .unwrap_or_else(|| panic!("no CPython 3.{minor} under {}", versions.display()))
    }

    /// Every field of a layout, named.
    fn fields(runtime: &PyRuntime, code: &CodeLayout) -> Vec<(&'static str, u64)> {
        let r = |v: u16| u64::from(v);
        vec![
            ("interpreters_head", r(runtime.interpreters_head)),
            ("threads_head", r(runtime.threads_head)),
            ("thread_next", r(runtime.thread_next)),
            ("thread_native_id", r(runtime.thread_native_id)),
            ("thread_id_in_pthread", r(runtime.thread_id_in_pthread)),
            ("thread_cframe", r(runtime.thread_cframe)),
            ("current_frame", r(runtime.current_frame)),
            ("frame_bytes", r(runtime.frame_bytes)),
            ("frame_code", r(runtime.frame_code)),
            ("frame_previous", r(runtime.frame_previous)),
            ("frame_instr", r(runtime.frame_instr)),
            ("frame_owner", r(runtime.frame_owner)),
            ("frame_is_entry", r(runtime.frame_is_entry)),
            ("flags", r(runtime.flags)),
            ("code_start", code.code_start),
            ("filename", code.filename),
            ("qualname", code.qualname),
            ("firstlineno", code.firstlineno),
            ("linetable", code.linetable),
            ("ascii_size", code.ascii_size),
            ("compact_size", code.compact_size),
        ]
    }

    /// The installed 3.13's `libpython`: its layout, read from its own
    /// debug offsets as a process's would be, is the table's, field by
    /// field (a table and a struct that both come from the headers).
    #[test]
    fn debug_offsets_of_the_installed_3_13_are_the_table() {
        let path = pyenv_release(13).join("lib/libpython3.13.so.1.0");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let elf = object::File::parse(&*bytes).expect("an ELF file");
        let found = interpreter_file(&elf).expect("_PyRuntime");
        assert_eq!(found.version.map(|v| v >> 16), Some(0x030d));
        let (runtime, code, source) =
            file_layout(13, None, found.version, found.runtime_head).expect("3.13");
        assert_eq!(source, LayoutSource::DebugOffsets, "{}", path.display());
        let (table_runtime, table_code) = layout(13, None).expect("3.13's table");
        let table = fields(&table_runtime, &table_code);
        let read = fields(&runtime, &code);
        for ((name, ours), (_, theirs)) in read.iter().zip(&table) {
            assert_eq!(ours, theirs, "{name}: debug offsets against the table");
        }
        assert_eq!((runtime, code), (table_runtime, table_code));
        assert_eq!(code.lines, LineForm::Positions);
    }

    /// A struct that does not check out leaves the table's layout, and
    /// says why; other releases never read one.
    #[test]
    fn refused_debug_offsets_leave_the_table() {
        use crate::procs::python_debug_offsets::tests::{set_word, struct_3_13_0};
        let version = Some(0x030d_00f0);
        let (runtime, code) = layout(13, None).expect("3.13's table");
        let good = struct_3_13_0();
        let from = |bytes: &[u8], version| {
            let (r, c, source) = file_layout(13, None, version, Some(bytes)).expect("3.13");
            assert_eq!((r, c), (runtime, code), "{source:?}");
            source
        };
        assert_eq!(from(&good, version), LayoutSource::DebugOffsets);
        // A byte buffer equal to the table's offsets tells nothing of
        // where they came from: one moved shows it.
        // `thread_state.next` is word 21.
        let mut moved = good.clone();
        set_word(&mut moved, 21, 16);
        let (moved_runtime, _, source) =
            file_layout(13, None, version, Some(&moved)).expect("3.13");
        assert_eq!(
            (source, moved_runtime.thread_next),
            (LayoutSource::DebugOffsets, 16)
        );

        let mut cookie = good.clone();
        cookie[..8].copy_from_slice(b"xdebugpz");
        assert!(matches!(
            from(&cookie, version),
            LayoutSource::Rejected(Rejected::Cookie(_))
        ));
        assert!(matches!(
            from(&good, Some(0x030d_01f0)),
            LayoutSource::Rejected(Rejected::Version { .. })
        ));
        assert_eq!(
            file_layout(13, None, version, None).map(|l| l.2),
            Some(LayoutSource::Rejected(Rejected::Missing))
        );
        // `interpreter_frame.owner` (word 33) past the 72 bytes of a frame
        // the kernel reads, though within the frame's 80.
        let mut owner = good.clone();
        set_word(&mut owner, 33, 72);
        assert_eq!(
            from(&owner, version),
            LayoutSource::Rejected(Rejected::Beyond {
                field: "interpreter_frame.owner",
                offset: 72,
                limit: 72
            })
        );
        // `code_object.linetable` (word 38) past the code object's bytes
        // read, though within its 208.
        let mut linetable = good.clone();
        set_word(&mut linetable, 38, 144);
        assert!(matches!(
            from(&linetable, version),
            LayoutSource::Rejected(Rejected::Beyond {
                field: "code_object.linetable",
                ..
            })
        ));
        // A free-threaded build's `PyObject` is longer (32 bytes, word
        // 44): `ob_type` at 24 (word 45), where this build reads it at 8.
        let mut free_threaded = good.clone();
        set_word(&mut free_threaded, 44, 32);
        set_word(&mut free_threaded, 45, 24);
        assert_eq!(
            from(&free_threaded, version),
            LayoutSource::Rejected(Rejected::Elsewhere {
                field: "pyobject.ob_type",
                offset: 24,
                expected: 8
            })
        );
        // Before 3.13 the struct is not looked for.
        let (_, _, source) = file_layout(12, None, Some(0x030c_01f0), Some(&good)).expect("3.12");
        assert_eq!(source, LayoutSource::Table);
    }

    /// The tables against each installed release's own headers: Debian's
    /// 3.11 and pyenv's 3.9 to 3.13, compiled with
    /// `testdata/python_layout.c`, every offset read compared.
    #[test]
    fn tables_agree_with_the_headers() {
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/python_layout.c");
        let mut includes = vec![(11, "/usr/include/python3.11".to_string())];
        for minor in [9, 10, 11, 12, 13] {
            let found = pyenv_release(minor);
            includes.push((
                minor,
                format!("{}/include/python3.{minor}", found.display()),
            ));
        }
        let dir = std::env::temp_dir().join(format!("python-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        for (minor, include) in includes {
            let exe = dir.join(format!("layout-3.{minor}"));
            let built = std::process::Command::new("cc")
                .arg(format!("-I{include}"))
                .arg(format!("-I{include}/internal"))
                .arg(source)
                .arg("-o")
                .arg(&exe)
                .output()
                .expect("running cc");
            assert!(
                built.status.success(),
                "{include}: {}",
                String::from_utf8_lossy(&built.stderr)
            );
            let out = std::process::Command::new(&exe)
                .output()
                .expect("running it");
            let text = String::from_utf8(out.stdout).expect("UTF-8");
            let (runtime, code) = layout(minor, Some(0x2d0)).expect("a table");
            let ours = |name: &str| -> u64 {
                match name {
                    "interpreters_head" => u64::from(runtime.interpreters_head),
                    "threads_head" => u64::from(runtime.threads_head),
                    "thread_next" => u64::from(runtime.thread_next),
                    "thread_native_id" => u64::from(runtime.thread_native_id),
                    "thread_cframe" => u64::from(runtime.thread_cframe),
                    "current_frame" => u64::from(runtime.current_frame),
                    "frame_code" => u64::from(runtime.frame_code),
                    "frame_previous" => u64::from(runtime.frame_previous),
                    "frame_instr" => u64::from(runtime.frame_instr),
                    "frame_owner" => u64::from(runtime.frame_owner),
                    "frame_is_entry" => u64::from(runtime.frame_is_entry),
                    "code_start" => code.code_start,
                    "filename" => code.filename,
                    "qualname" => code.qualname,
                    "firstlineno" => code.firstlineno,
                    "linetable" => code.linetable,
                    "ascii_size" => code.ascii_size,
                    "compact_size" => code.compact_size,
                    other => panic!("unknown field {other}"),
                }
            };
            let mut compared = 0;
            for line in text.lines() {
                let (name, value) = line.split_once(' ').expect("name value");
                let value: u64 = value.parse().expect("a number");
                assert_eq!(ours(name), value, "3.{minor} ({include}): {name}");
                compared += 1;
            }
            assert!(compared >= 14, "3.{minor}: only {compared} fields");
            // Fields the release has not are marked so.
            if minor != 11 {
                assert_eq!(runtime.frame_is_entry, PY_NO_FIELD, "3.{minor}");
            }
            if !(11..13).contains(&minor) {
                assert_eq!(runtime.thread_cframe, PY_NO_FIELD, "3.{minor}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Found in the daemon's own threads, and right for a third.
    #[test]
    fn the_thread_id_is_found_in_struct_pthread() {
        let offset = pthread_tid_offset().expect("glibc");
        let (id, tid) = std::thread::spawn(move || {
            let mem = Memory::open(std::process::id()).expect("own memory");
            // SAFETY: plain calls without arguments.
            let (me, tid) = unsafe { (libc::pthread_self() as u64, libc::gettid()) };
            let mut word = [0u8; 4];
            assert!(mem.read(me + u64::from(offset), &mut word));
            (u32::from_le_bytes(word), tid as u32)
        })
        .join()
        .expect("thread");
        assert_eq!(id, tid, "offset {offset:#x}");
    }
}
