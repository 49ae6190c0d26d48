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
//! profiled natively.
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

/// `PyObject.ob_type`.
pub const OB_TYPE: u64 = 8;
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
    let pthread_tid = if minor < 11 {
        pthread_tid_offset()
    } else {
        None
    };
    let Some((mut runtime, code)) = layout(minor, pthread_tid) else {
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

    /// The tables against each installed release's own headers: Debian's
    /// 3.11 and pyenv's 3.9 to 3.13, compiled with
    /// `testdata/python_layout.c`, every offset read compared.
    #[test]
    fn tables_agree_with_the_headers() {
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/python_layout.c");
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let mut includes = vec![(11, "/usr/include/python3.11".to_string())];
        for minor in [9, 10, 11, 12, 13] {
            let versions = std::path::Path::new(&home).join(".pyenv/versions");
            let found = std::fs::read_dir(&versions)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(&format!("3.{minor}.")))
                })
                .max()
                .unwrap_or_else(|| panic!("no CPython 3.{minor} under {}", versions.display()));
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
