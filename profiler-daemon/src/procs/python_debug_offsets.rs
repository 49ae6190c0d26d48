//! CPython 3.13's own account of its layout: `_Py_DebugOffsets`, the
//! struct at the very start of `_PyRuntime`, which the interpreter fills
//! at build time with `offsetof` and `sizeof` of its structures for
//! out-of-process readers. This module owns the struct's 3.13 form (a
//! row of 8-byte words, in the order of 3.13.0's
//! `Include/internal/pycore_runtime.h`), reading it from the initialized
//! bytes of `_PyRuntime` and checking it: its cookie, its version
//! against `Py_Version`, and each offset the daemon reads against the
//! size the struct gives the structure holding it. What the daemon
//! reads besides (how much of a frame, of a code object) is checked
//! where the layout is made (`python_runtime`).
//!
//! The struct is not kept between minor releases (3.14 adds fields in
//! its middle), so only 3.13's is read; 3.13's pre-releases had other
//! forms and are refused.

/// `_Py_Debug_Cookie`, the struct's first 8 bytes.
pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// The first release whose struct has the form read: 3.13.0 final.
const FIRST_VERSION: u64 = 0x030d_00f0;
/// The first release past 3.13.
const NEXT_MINOR: u64 = 0x030e_0000;

// Where each of the struct's groups begins, in words: the cookie, then
// `version` and `free_threaded`, then one group per structure, each
// opening with that structure's `sizeof`. The fields each group has
// are listed beside it (3.13.0).
/// `size, finalizing, interpreters_head`.
const RUNTIME_STATE: usize = 3;
/// `size, id, next, threads_head, gc, imports_modules, sysdict,
/// builtins, ceval_gil, gil_runtime_state, gil_runtime_state_enabled,
/// gil_runtime_state_locked, gil_runtime_state_holder`.
const INTERPRETER_STATE: usize = 6;
/// `size, prev, next, interp, current_frame, thread_id,
/// native_thread_id, datastack_chunk, status`.
const THREAD_STATE: usize = 19;
/// `size, previous, executable, instr_ptr, localsplus, owner`.
const INTERPRETER_FRAME: usize = 28;
/// `size, filename, name, qualname, linetable, firstlineno, argcount,
/// localsplusnames, localspluskinds, co_code_adaptive`.
const CODE_OBJECT: usize = 34;
/// `size, ob_type`.
const PYOBJECT: usize = 44;
/// `size, tp_name, tp_repr, tp_flags`; then the tuple (3 words), list
/// (3), dict (3), float (2) and long (3) objects' groups.
const TYPE_OBJECT: usize = 46;
/// `size, ob_size, ob_sval`.
const BYTES_OBJECT: usize = 64;
/// `size, state, length, asciiobject_size`; then `gc` (2 words).
const UNICODE_OBJECT: usize = 67;
/// Words up to the end of the unicode group: all that is read.
const WORDS: usize = 71;

/// Bytes of `_PyRuntime` read: the struct up to its last group used.
pub const BYTES: usize = WORDS * 8;

/// A field the struct gives: its group's first word, its word in the
/// group, and how many bytes of it are read.
struct Field {
    name: &'static str,
    group: usize,
    word: usize,
    width: u64,
}

const fn field(name: &'static str, group: usize, word: usize, width: u64) -> Field {
    Field {
        name,
        group,
        word,
        width,
    }
}

/// An offset the struct gives, with what it is (for messages) and the
/// bytes of the field read there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offset {
    pub name: &'static str,
    pub at: u64,
    pub width: u64,
}

impl Offset {
    /// The offset, when the field lies within the first `limit` bytes.
    pub fn within(self, limit: u64) -> Result<u64, Rejected> {
        match self.at.checked_add(self.width) {
            Some(end) if end <= limit => Ok(self.at),
            _ => Err(Rejected::Beyond {
                field: self.name,
                offset: self.at,
                limit,
            }),
        }
    }

    /// Whether it is where the daemon reads the field without asking.
    pub fn is(self, expected: u64) -> Result<(), Rejected> {
        match self.at == expected {
            true => Ok(()),
            false => Err(Rejected::Elsewhere {
                field: self.name,
                offset: self.at,
                expected,
            }),
        }
    }
}

/// Why a file's debug offsets were not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("_PyRuntime's initialized data is shorter than the debug offsets ({BYTES} bytes)")]
    Missing,
    #[error("its cookie is \"{}\", not \"xdebugpy\"", .0.escape_ascii())]
    Cookie([u8; 8]),
    #[error("the file has no Py_Version to check the debug offsets' version against")]
    NoVersion,
    #[error("the debug offsets' version {found:#x} is not the file's Py_Version {expected:#x}")]
    Version { found: u64, expected: u32 },
    #[error("version {0:#x} is not a 3.13 release, whose debug offsets this build reads")]
    Release(u64),
    #[error("{field} is {offset}, past the {limit} bytes it must lie in")]
    Beyond {
        field: &'static str,
        offset: u64,
        limit: u64,
    },
    #[error("{field} is {offset}, where this build reads it at {expected}")]
    Elsewhere {
        field: &'static str,
        offset: u64,
        expected: u64,
    },
}

/// What 3.13's `_Py_DebugOffsets` says of the fields the daemon reads,
/// each checked to lie within the size the struct gives its structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugOffsets {
    pub interpreters_head: Offset,
    pub threads_head: Offset,
    pub thread_next: Offset,
    pub current_frame: Offset,
    pub native_thread_id: Offset,
    pub frame_previous: Offset,
    pub frame_executable: Offset,
    pub frame_instr_ptr: Offset,
    pub frame_owner: Offset,
    pub code_filename: Offset,
    pub code_qualname: Offset,
    pub code_linetable: Offset,
    pub code_firstlineno: Offset,
    /// `co_code_adaptive`: where the instructions begin.
    pub code_adaptive: Offset,
    pub ob_type: Offset,
    pub tp_name: Offset,
    pub bytes_size: Offset,
    pub bytes_data: Offset,
    pub str_state: Offset,
    pub str_length: Offset,
    /// `sizeof(PyASCIIObject)`: a size, checked as a field of no width.
    pub ascii_size: Offset,
}

/// Reads 3.13's struct from the first bytes of `_PyRuntime`, for a file
/// whose `Py_Version` is `py_version`.
pub fn read(runtime: &[u8], py_version: Option<u32>) -> Result<DebugOffsets, Rejected> {
    let bytes = runtime.get(..BYTES).ok_or(Rejected::Missing)?;
    let mut words = [0u64; WORDS];
    for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut le = [0u8; 8];
        le.copy_from_slice(chunk);
        *word = u64::from_le_bytes(le);
    }
    let mut cookie = [0u8; 8];
    cookie.copy_from_slice(&bytes[..8]);
    if &cookie != COOKIE {
        return Err(Rejected::Cookie(cookie));
    }
    let expected = py_version.ok_or(Rejected::NoVersion)?;
    let found = words[1];
    if found != u64::from(expected) {
        return Err(Rejected::Version { found, expected });
    }
    if !(FIRST_VERSION..NEXT_MINOR).contains(&found) {
        return Err(Rejected::Release(found));
    }
    // Each field within its structure's size, as the struct gives it.
    let get = |f: Field| {
        let offset = Offset {
            name: f.name,
            at: words[f.group + f.word],
            width: f.width,
        };
        offset.within(words[f.group]).map(|_| offset)
    };
    Ok(DebugOffsets {
        interpreters_head: get(field(
            "runtime_state.interpreters_head",
            RUNTIME_STATE,
            2,
            8,
        ))?,
        threads_head: get(field(
            "interpreter_state.threads_head",
            INTERPRETER_STATE,
            3,
            8,
        ))?,
        thread_next: get(field("thread_state.next", THREAD_STATE, 2, 8))?,
        current_frame: get(field("thread_state.current_frame", THREAD_STATE, 4, 8))?,
        native_thread_id: get(field("thread_state.native_thread_id", THREAD_STATE, 6, 8))?,
        frame_previous: get(field("interpreter_frame.previous", INTERPRETER_FRAME, 1, 8))?,
        frame_executable: get(field(
            "interpreter_frame.executable",
            INTERPRETER_FRAME,
            2,
            8,
        ))?,
        frame_instr_ptr: get(field(
            "interpreter_frame.instr_ptr",
            INTERPRETER_FRAME,
            3,
            8,
        ))?,
        frame_owner: get(field("interpreter_frame.owner", INTERPRETER_FRAME, 5, 1))?,
        code_filename: get(field("code_object.filename", CODE_OBJECT, 1, 8))?,
        code_qualname: get(field("code_object.qualname", CODE_OBJECT, 3, 8))?,
        code_linetable: get(field("code_object.linetable", CODE_OBJECT, 4, 8))?,
        code_firstlineno: get(field("code_object.firstlineno", CODE_OBJECT, 5, 4))?,
        code_adaptive: get(field("code_object.co_code_adaptive", CODE_OBJECT, 9, 1))?,
        ob_type: get(field("pyobject.ob_type", PYOBJECT, 1, 8))?,
        tp_name: get(field("type_object.tp_name", TYPE_OBJECT, 1, 8))?,
        bytes_size: get(field("bytes_object.ob_size", BYTES_OBJECT, 1, 8))?,
        bytes_data: get(field("bytes_object.ob_sval", BYTES_OBJECT, 2, 1))?,
        str_state: get(field("unicode_object.state", UNICODE_OBJECT, 1, 4))?,
        str_length: get(field("unicode_object.length", UNICODE_OBJECT, 2, 8))?,
        ascii_size: get(field(
            "unicode_object.asciiobject_size",
            UNICODE_OBJECT,
            3,
            0,
        ))?,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A 3.13.0 struct as the pyenv build's `libpython3.13.so.1.0` holds
    /// it, from the cookie to the end of the unicode group.
    pub(crate) fn struct_3_13_0() -> Vec<u8> {
        let words: [u64; WORDS - 1] = [
            0x030d_00f0,
            0,
            // runtime_state
            283_320,
            608,
            632,
            // interpreter_state
            194_968,
            7272,
            7264,
            7344,
            7400,
            7656,
            7640,
            7648,
            16,
            7752,
            0,
            7768,
            7760,
            // thread_state
            304,
            0,
            8,
            16,
            72,
            152,
            160,
            232,
            32,
            // interpreter_frame
            80,
            8,
            0,
            56,
            72,
            70,
            // code_object
            208,
            112,
            120,
            128,
            136,
            68,
            52,
            96,
            104,
            200,
            // pyobject
            16,
            8,
            // type_object
            416,
            24,
            88,
            168,
            // tuple, list, dict, float, long objects
            32,
            24,
            16,
            40,
            24,
            16,
            48,
            32,
            40,
            24,
            16,
            32,
            16,
            24,
            // bytes_object
            40,
            16,
            32,
            // unicode_object
            64,
            32,
            16,
            40,
        ];
        let mut bytes = COOKIE.to_vec();
        for word in words {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    /// Sets the struct's `word`th 8-byte word (the cookie is word 0).
    pub(crate) fn set_word(bytes: &mut [u8], word: usize, value: u64) {
        bytes[word * 8..][..8].copy_from_slice(&value.to_le_bytes());
    }

    #[test]
    fn reads_the_fields_where_the_struct_gives_them() {
        let offsets = read(&struct_3_13_0(), Some(0x030d_00f0)).expect("3.13.0's struct");
        let at = |o: Offset| o.at;
        assert_eq!(
            [
                at(offsets.interpreters_head),
                at(offsets.threads_head),
                at(offsets.thread_next),
                at(offsets.current_frame),
                at(offsets.native_thread_id),
            ],
            [632, 7344, 8, 72, 160]
        );
        assert_eq!(
            [
                at(offsets.frame_previous),
                at(offsets.frame_executable),
                at(offsets.frame_instr_ptr),
                at(offsets.frame_owner),
            ],
            [8, 0, 56, 70]
        );
        assert_eq!(
            [
                at(offsets.code_filename),
                at(offsets.code_qualname),
                at(offsets.code_linetable),
                at(offsets.code_firstlineno),
                at(offsets.code_adaptive),
            ],
            [112, 128, 136, 68, 200]
        );
        assert_eq!(
            [
                at(offsets.ob_type),
                at(offsets.tp_name),
                at(offsets.bytes_size),
                at(offsets.bytes_data),
                at(offsets.str_state),
                at(offsets.str_length),
                at(offsets.ascii_size),
            ],
            [8, 24, 16, 32, 32, 16, 40]
        );
        // A longer read (the whole of `_PyRuntime`) reads the same.
        let mut longer = struct_3_13_0();
        longer.extend_from_slice(&[0xff; 64]);
        assert_eq!(read(&longer, Some(0x030d_00f0)), Ok(offsets));
    }

    #[test]
    fn refuses_what_is_not_3_13s_struct() {
        let good = struct_3_13_0();
        assert_eq!(
            read(&good[..BYTES - 1], Some(0x030d_00f0)),
            Err(Rejected::Missing)
        );
        let mut cookie = good.clone();
        cookie[7] = b'z';
        let refused = read(&cookie, Some(0x030d_00f0)).expect_err("a wrong cookie");
        assert_eq!(
            refused.to_string(),
            "its cookie is \"xdebugpz\", not \"xdebugpy\""
        );
        assert_eq!(read(&good, None), Err(Rejected::NoVersion));
        assert_eq!(
            read(&good, Some(0x030d_01f0)),
            Err(Rejected::Version {
                found: 0x030d_00f0,
                expected: 0x030d_01f0
            })
        );
        // 3.13.0b1 had another form; 3.14's is not this one.
        for version in [0x030d_00b1u32, 0x030e_00f0] {
            let mut other = good.clone();
            set_word(&mut other, 1, u64::from(version));
            assert_eq!(
                read(&other, Some(version)),
                Err(Rejected::Release(u64::from(version)))
            );
        }
        // Later 3.13 releases keep the form.
        let mut later = good.clone();
        set_word(&mut later, 1, 0x030d_07f0);
        assert!(read(&later, Some(0x030d_07f0)).is_ok());
        // `thread_state.next` at the end of its structure, and past the
        // end of the arithmetic.
        for next in [304, u64::MAX - 4] {
            let mut beyond = good.clone();
            set_word(&mut beyond, THREAD_STATE + 2, next);
            assert_eq!(
                read(&beyond, Some(0x030d_00f0)),
                Err(Rejected::Beyond {
                    field: "thread_state.next",
                    offset: next,
                    limit: 304
                })
            );
        }
        // A structure's size too small for a field.
        let mut small = good.clone();
        set_word(&mut small, INTERPRETER_FRAME, 64);
        assert!(matches!(
            read(&small, Some(0x030d_00f0)),
            Err(Rejected::Beyond {
                field: "interpreter_frame.owner",
                ..
            })
        ));
    }
}
