//! Names Go code from the binary's own function table (the pclntab), which
//! the Go runtime needs and so every Go binary keeps, stripped or not: a
//! binary linked with `-ldflags='-s -w'` has no symbol table and no DWARF,
//! and without this its frames had no names (and its stacks, missing the
//! `runtime.goexit` they end in, read as cut short).
//!
//! Read-only, from the mapped file; the layout is the Go linker's for Go
//! 1.18 and later (header magic 0xfffffff0, and 0xfffffff1 from Go 1.20),
//! as `runtime/symtab.go` and `debug/gosym` define it: a header of table
//! offsets, a function table of (entry, record) pairs relative to the
//! start of the text, each record naming its function and giving its
//! pc-value tables for the file and line. Older layouts are not read
//! (their frames stay unnamed). Inlined calls (the pclntab's inline tree)
//! are not expanded yet: a frame is named by the function whose code it is.
//!
//! The same table gives each pc's SP delta (the bytes the function has
//! pushed below its return address there), which tells where a leaf's
//! return address is while its frame pointer is not yet set up, and
//! where a function begins by its name, for the probes placed on Go's
//! runtime in binaries without a symbol table. Read by the symbolizer and
//! by the probe finders, so it lives with the shared vocabulary.

use std::path::Path;

use crate::model::frames::Line;

const MAGIC_118: u32 = 0xffff_fff0;
const MAGIC_120: u32 = 0xffff_fff1;
/// `_func` fields used (the same offsets in both layouts).
const FUNC_NAMEOFF: usize = 4;
const FUNC_PCSP: usize = 16;
const FUNC_PCFILE: usize = 20;
const FUNC_PCLN: usize = 24;
const FUNC_NPCDATA: usize = 28;
const FUNC_CUOFFSET: usize = 32;
/// The pc-value table (`_PCDATA_InlTreeIndex`) that gives, per pc, the
/// entry of the inline tree inlined there (-1: none).
const PCDATA_INL_TREE_INDEX: usize = 2;
/// The function data (`_FUNCDATA_InlTree`) that is the inline tree.
const FUNCDATA_INL_TREE: usize = 3;
/// Levels of inlining followed at most.
const MAX_INLINE_DEPTH: usize = 32;

/// The data Go's inline trees are in: a binary's `go:func.*` data, from
/// `runtime.firstmoduledata.gofunc` (each function's tree is an offset
/// from it).
pub struct InlineTrees<'a> {
    data: &'a [u8],
}

impl<'a> InlineTrees<'a> {
    /// The inline trees of the Go binary `file`: found through the module
    /// data, the record (in `.go.module` from Go 1.27, else `.noptrdata`)
    /// that starts with the pclntab's address and names `gofunc` at an
    /// offset per release ([`gofunc_offset`]; the word before it,
    /// `rodata`, is checked to be `.rodata`'s address). None for other
    /// releases or a layout that does not check.
    pub fn find(file: &object::File<'a>) -> Option<InlineTrees<'a>> {
        use object::{Object, ObjectSection};
        let gofunc_at = gofunc_offset(crate::model::go_buildinfo::go_release(file)?)?;
        let pclntab = pclntab_section(file)?.address();
        let ro_start = file.section_by_name(".rodata")?.address();
        // Its own section from Go 1.27, in `.noptrdata` before.
        let gofunc = [".go.module", ".noptrdata"]
            .iter()
            .filter_map(|name| file.section_by_name(name)?.data().ok())
            .find_map(|module| gofunc_in(module, pclntab, gofunc_at, ro_start))?;
        // In `.rodata` up to Go 1.26, in the pclntab's section from 1.27.
        file.sections().find_map(|section| {
            let from = gofunc.checked_sub(section.address())?;
            if from >= section.size() {
                return None;
            }
            let data = section.data().ok()?;
            Some(InlineTrees {
                data: data.get(usize::try_from(from).ok()?..)?,
            })
        })
    }
}

/// Where release 1.`minor`'s module data (`runtime.moduledata`) keeps
/// `gofunc`, from the DWARF of a program built by each of go1.19.8,
/// 1.21.13, 1.22.10, 1.23.9, 1.24.11, 1.25.5, 1.26.6 and 1.27.3 (checked
/// by `model/go_dwarf.rs`); 1.18 is assumed to keep it where 1.19 does and
/// 1.20 where 1.21 does, no binary of theirs read. None for another
/// release.
fn gofunc_offset(minor: u32) -> Option<usize> {
    Some(match minor {
        18..=19 => 304,
        20..=26 => 320,
        27 => 344,
        _ => return None,
    })
}

/// `gofunc` of the module data in `module` (the record that starts with
/// the pclntab's address, with `.rodata`'s address just before `gofunc`).
fn gofunc_in(module: &[u8], pclntab: u64, gofunc_at: usize, ro_start: u64) -> Option<u64> {
    (0..module.len().saturating_sub(gofunc_at + 7))
        .step_by(8)
        .filter(|&at| u64_at(module, at) == Some(pclntab))
        .find_map(|at| {
            (u64_at(module, at + gofunc_at - 8)? == ro_start)
                .then(|| u64_at(module, at + gofunc_at))
                .flatten()
        })
}

/// Where a Go binary's function table is: the section's file offset and
/// size, and the address of the text its entries are relative to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PclntabSection {
    pub offset: u64,
    pub size: u64,
    pub text_addr: u64,
}

impl PclntabSection {
    /// Where the pclntab of the Go binary `file` is.
    pub fn of_file(file: &object::File<'_>) -> Option<PclntabSection> {
        use object::{Object, ObjectSection};
        let (offset, size) = pclntab_section(file)?.file_range()?;
        Some(PclntabSection {
            offset,
            size,
            text_addr: file.section_by_name(".text").map_or(0, |t| t.address()),
        })
    }
}

/// A parsed pclntab over the section's bytes.
pub struct Pclntab<'a> {
    data: &'a [u8],
    /// The Go 1.18/1.19 layout (magic 0xfffffff0): a `_func` header of 40
    /// bytes and 20-byte inline-tree entries, else 44 and 16.
    old: bool,
    quantum: u64,
    nfunc: usize,
    text_start: u64,
    funcname: usize,
    cu: usize,
    filetab: usize,
    pctab: usize,
    pcln: usize,
}

/// The section of the Go binary `file` that holds its pclntab.
fn pclntab_section<'a, 'f>(file: &'f object::File<'a>) -> Option<object::Section<'a, 'f>> {
    use object::Object;
    file.section_by_name(".gopclntab")
        .or_else(|| file.section_by_name(".data.rel.ro.gopclntab"))
}

impl<'a> Pclntab<'a> {
    /// The pclntab of the Go binary `file`, relative to its `.text`.
    pub fn of_file(file: &object::File<'a>) -> Option<Pclntab<'a>> {
        use object::{Object, ObjectSection};
        let text = file.section_by_name(".text").map_or(0, |t| t.address());
        Pclntab::parse(pclntab_section(file)?.data().ok()?, text)
    }

    /// Parses the header of a pclntab section; None for a layout it does
    /// not read or a header that does not fit the section.
    pub fn parse(data: &'a [u8], text_addr: u64) -> Option<Pclntab<'a>> {
        let magic = u32_at(data, 0)?;
        if (magic != MAGIC_118 && magic != MAGIC_120) || *data.get(7)? != 8 {
            return None;
        }
        let word = |i: usize| -> Option<usize> { usize::try_from(u64_at(data, 8 + 8 * i)?).ok() };
        let header_text = u64_at(data, 24)?;
        let table = Pclntab {
            data,
            old: magic == MAGIC_118,
            quantum: u64::from(*data.get(6)?).max(1),
            nfunc: word(0)?,
            // The section's text address when the header's is not set
            // (newer linkers leave it 0).
            text_start: if header_text != 0 {
                header_text
            } else {
                text_addr
            },
            funcname: word(3)?,
            cu: word(4)?,
            filetab: word(5)?,
            pctab: word(6)?,
            pcln: word(7)?,
        };
        let ordered = table.funcname <= table.cu
            && table.cu <= table.filetab
            && table.filetab <= table.pctab
            && table.pctab <= table.pcln
            && table.pcln + (2 * table.nfunc + 1) * 4 <= data.len();
        ordered.then_some(table)
    }

    /// The functions at address `pc`, innermost first: those inlined there
    /// (from the function's inline tree in `trees`), then the function
    /// whose code it is; empty when no function holds `pc`.
    pub fn lookup_inlined(&self, pc: u64, trees: Option<&InlineTrees<'_>>) -> Vec<Line> {
        let Some((func, start, mut rel)) = self.func_at(pc) else {
            return Vec::new();
        };
        let mut lines = Vec::new();
        for _ in 0..MAX_INLINE_DEPTH {
            let (file, line) = self.place(func, start, rel);
            match trees.and_then(|trees| self.inlined_call(func, start, rel, trees)) {
                Some((function, parent_pc)) => {
                    lines.push(Line {
                        function: function.to_owned(),
                        file,
                        line,
                    });
                    // The call's place in its caller.
                    rel = start + parent_pc;
                }
                None => break,
            }
        }
        let (file, line) = self.place(func, start, rel);
        if let Some(function) = self.func_name(func) {
            lines.push(Line {
                function: function.to_owned(),
                file,
                line,
            });
        }
        lines
    }

    /// The name of the function of `_func` record `func`.
    fn func_name(&self, func: usize) -> Option<&'a str> {
        let name_off = usize::try_from(i32_at(self.data, func + FUNC_NAMEOFF)?).ok()?;
        c_str(self.data, self.funcname + name_off)
    }

    /// The file and line at `rel` (an offset from the text start) in the
    /// function of record `func` starting at `start`.
    fn place(&self, func: usize, start: u64, rel: u64) -> (Option<String>, u32) {
        let line = u32_at(self.data, func + FUNC_PCLN)
            .and_then(|table| self.pc_value(table, start, rel))
            .and_then(|l| u32::try_from(l).ok())
            .unwrap_or(0);
        let file = u32_at(self.data, func + FUNC_PCFILE)
            .and_then(|table| self.pc_value(table, start, rel))
            .and_then(|fileno| {
                let cu_index = u64::from(u32_at(self.data, func + FUNC_CUOFFSET)?)
                    + u64::try_from(fileno).ok()?;
                let at = self.cu + 4 * usize::try_from(cu_index).ok()?;
                match u32_at(self.data, at)? {
                    u32::MAX => None,
                    off => c_str(self.data, self.filetab + off as usize),
                }
            });
        (file.map(str::to_owned), line)
    }

    /// The call inlined at `rel` in the function of record `func`: the
    /// inlined function's name and the call's offset in its caller (from
    /// the function's entry); None where nothing is inlined.
    fn inlined_call(
        &self,
        func: usize,
        start: u64,
        rel: u64,
        trees: &InlineTrees<'_>,
    ) -> Option<(&'a str, u64)> {
        let header = if self.old { 40 } else { 44 };
        let npcdata = usize::try_from(u32_at(self.data, func + FUNC_NPCDATA)?).ok()?;
        let nfuncdata = usize::from(*self.data.get(func + header - 1)?);
        if npcdata <= PCDATA_INL_TREE_INDEX || nfuncdata <= FUNCDATA_INL_TREE {
            return None;
        }
        let index_table = u32_at(self.data, func + header + 4 * PCDATA_INL_TREE_INDEX)?;
        let index = usize::try_from(self.pc_value(index_table, start, rel)?).ok()?;
        let tree = u32_at(
            self.data,
            func + header + 4 * npcdata + 4 * FUNCDATA_INL_TREE,
        )?;
        if tree == u32::MAX {
            return None;
        }
        // inlinedCall: {parent int16, funcID, _, file, line, func_ (name),
        // parentPc} in Go 1.18/1.19; {funcID, _ [3], nameOff, parentPc,
        // startLine} from 1.20.
        let (size, name_at, parent_at) = if self.old { (20, 12, 16) } else { (16, 4, 8) };
        let entry = usize::try_from(tree).ok()? + index * size;
        let name_off = usize::try_from(i32_at(trees.data, entry + name_at)?).ok()?;
        let parent_pc = u64::try_from(i32_at(trees.data, entry + parent_at)?).ok()?;
        Some((c_str(self.data, self.funcname + name_off)?, parent_pc))
    }

    /// The SP delta at address `pc`: the bytes its function has pushed
    /// below its return address there (0 at the entry and in a function
    /// without a frame).
    pub fn sp_delta(&self, pc: u64) -> Option<u64> {
        let (func, start, rel) = self.func_at(pc)?;
        let delta = self.pc_value(u32_at(self.data, func + FUNC_PCSP)?, start, rel)?;
        u64::try_from(delta).ok()
    }

    /// The code of the function named `name`: its entry address and its
    /// length (a scan of the function table, for the few functions a probe
    /// is placed on).
    pub fn function_named(&self, name: &str) -> Option<(u64, u64)> {
        (0..self.nfunc).find_map(|i| {
            let rel = u32_at(self.data, self.pcln + 8 * i)?;
            let func =
                self.pcln + usize::try_from(u32_at(self.data, self.pcln + 8 * i + 4)?).ok()?;
            let name_off = usize::try_from(i32_at(self.data, func + FUNC_NAMEOFF)?).ok()?;
            if c_str(self.data, self.funcname + name_off)? != name {
                return None;
            }
            // Entry i+1 (or the final end offset) ends function i.
            let end = u32_at(self.data, self.pcln + 8 * (i + 1))?;
            Some((
                self.text_start + u64::from(rel),
                u64::from(end.checked_sub(rel)?),
            ))
        })
    }

    /// Every function of the table: its entry address and its name, in
    /// address order.
    pub fn functions(&self) -> impl Iterator<Item = (u64, &'a str)> + '_ {
        (0..self.nfunc).filter_map(|i| {
            let rel = u32_at(self.data, self.pcln + 8 * i)?;
            let func =
                self.pcln + usize::try_from(u32_at(self.data, self.pcln + 8 * i + 4)?).ok()?;
            let name_off = usize::try_from(i32_at(self.data, func + FUNC_NAMEOFF)?).ok()?;
            let name = c_str(self.data, self.funcname + name_off)?;
            Some((self.text_start + u64::from(rel), name))
        })
    }

    /// The `_func` record (its offset in the data) of the function whose
    /// code holds `pc`, the function's entry and `pc`, both as offsets
    /// from the text start.
    fn func_at(&self, pc: u64) -> Option<(usize, u64, u64)> {
        let rel = u32::try_from(pc.checked_sub(self.text_start)?).ok()?;
        let entry = |i: usize| u32_at(self.data, self.pcln + 8 * i);
        // The last function whose entry is at or before pc.
        let (mut lo, mut hi) = (0, self.nfunc);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if entry(mid)? <= rel {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let i = lo.checked_sub(1)?;
        // Entry i+1 (or the final end offset) ends function i.
        if rel >= entry(i + 1)? {
            return None;
        }
        let func = self.pcln + usize::try_from(u32_at(self.data, self.pcln + 8 * i + 4)?).ok()?;
        Some((func, u64::from(entry(i)?), u64::from(rel)))
    }

    /// The value pc-value table `table` gives at `target` (offsets from
    /// the text start), for the function starting at `entry`; None when
    /// there is no table or it ends before `target`.
    fn pc_value(&self, table: u32, entry: u64, target: u64) -> Option<i64> {
        if table == 0 {
            return None;
        }
        let mut at = self.pctab.checked_add(table as usize)?;
        let (mut value, mut pc, mut first) = (-1i64, entry, true);
        loop {
            let delta = uvarint(self.data, &mut at)?;
            if delta == 0 && !first {
                return None;
            }
            first = false;
            // Zigzag: the low bit is the sign.
            value = value.wrapping_add(((delta >> 1) as i64) ^ -((delta & 1) as i64));
            pc = pc.checked_add(uvarint(self.data, &mut at)?.checked_mul(self.quantum)?)?;
            if target < pc {
                return Some(value);
            }
        }
    }
}

/// Names what it can of `offsets` (file offsets of code, each with its
/// address in the file's address space) from the pclntab of the Go binary
/// at `path`; one answer per offset, None where it has none.
pub fn lookup_file(path: &Path, section: PclntabSection, addrs: &[u64]) -> Vec<Vec<Line>> {
    with_table(path, section, true, |table, trees| {
        addrs
            .iter()
            .map(|&pc| table.lookup_inlined(pc, trees))
            .collect()
    })
    .unwrap_or_else(|| vec![Vec::new(); addrs.len()])
}

/// The SP delta ([`Pclntab::sp_delta`]) at address `pc` of the Go binary
/// at `path`.
pub fn sp_delta_in_file(path: &Path, section: PclntabSection, pc: u64) -> Option<u64> {
    with_table(path, section, false, |table, _| table.sp_delta(pc))?
}

/// Runs `read` over the pclntab of the file at `path` (and its inline
/// trees, when wanted and found); None when the file or its table cannot
/// be read.
fn with_table<T>(
    path: &Path,
    section: PclntabSection,
    want_trees: bool,
    read: impl FnOnce(&Pclntab<'_>, Option<&InlineTrees<'_>>) -> T,
) -> Option<T> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private mapping of an executable file, which
    // is replaced rather than rewritten while mapped; the symbolizer maps
    // the same files.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let start = usize::try_from(section.offset).ok()?;
    let len = usize::try_from(section.size).ok()?;
    let data = map.get(start..start.saturating_add(len))?;
    let table = Pclntab::parse(data, section.text_addr)?;
    let file = match want_trees {
        true => object::File::parse(&*map).ok(),
        false => None,
    };
    let trees = file.as_ref().and_then(InlineTrees::find);
    Some(read(&table, trees.as_ref()))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn i32_at(data: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

fn c_str(data: &[u8], at: usize) -> Option<&str> {
    let bytes = data.get(at..)?;
    let end = bytes.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&bytes[..end]).ok()
}

fn uvarint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pclntab of two functions built as the Go linker lays one out
    /// (1.20 header), with pc-value tables for file and line.
    fn table_bytes() -> Vec<u8> {
        let mut d = vec![0u8; 72];
        d[0..4].copy_from_slice(&MAGIC_120.to_le_bytes());
        d[6] = 1; // quantum
        d[7] = 8; // pointer size
        let put = |d: &mut Vec<u8>, i: usize, v: u64| {
            d[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes())
        };
        put(&mut d, 0, 2); // nfunc
        put(&mut d, 1, 1); // nfiles
        put(&mut d, 2, 0x1000); // textStart
        // funcnametab
        let funcname = d.len();
        d.extend_from_slice(b"main.a\0main.b\0");
        // cutab: file index 0 -> filetab offset 0
        let cu = d.len();
        d.extend_from_slice(&0u32.to_le_bytes());
        let filetab = d.len();
        d.extend_from_slice(b"/src/main.go\0");
        // pctab: offset 0 unused; file table: value 0 over 0x40 bytes;
        // line table: 10 for 0x10 bytes, then 12 for 0x30.
        let pctab = d.len();
        d.push(0);
        let pcfile = d.len() - pctab;
        d.extend_from_slice(&[2, 0x40, 0]); // +1 (zigzag 2) from -1 = 0
        let pcln = d.len() - pctab;
        d.extend_from_slice(&[22, 0x10, 4, 0x30, 0]); // -1+11=10; +2=12
        // SP deltas: 0 for 4 bytes (the entry), 8 for 4 (after the frame
        // pointer's push), then 0x28 for the rest.
        let pcsp = d.len() - pctab;
        d.extend_from_slice(&[2, 4, 16, 4, 64, 0x38, 0]); // -1+1=0; +8; +0x20
        let pcln_off = d.len();
        for (i, v) in [funcname, cu, filetab, pctab, pcln_off].iter().enumerate() {
            put(&mut d, 3 + i, *v as u64);
        }
        // functab: (entry, funcoff) x2, then the end.
        let functab_len = (2 * 2 + 1) * 4;
        let func_a = functab_len;
        let func_b = functab_len + 40;
        for v in [0u32, func_a as u32, 0x40, func_b as u32, 0x80] {
            d.extend_from_slice(&v.to_le_bytes());
        }
        for (name_off, entry) in [(0i32, 0u32), (7, 0x40)] {
            let mut f = vec![0u8; 40];
            f[0..4].copy_from_slice(&entry.to_le_bytes());
            f[4..8].copy_from_slice(&name_off.to_le_bytes());
            f[16..20].copy_from_slice(&(pcsp as u32).to_le_bytes());
            f[20..24].copy_from_slice(&(pcfile as u32).to_le_bytes());
            f[24..28].copy_from_slice(&(pcln as u32).to_le_bytes());
            d.extend_from_slice(&f);
        }
        d
    }

    #[test]
    fn names_file_and_line_of_each_function() {
        let data = table_bytes();
        let t = Pclntab::parse(&data, 0).expect("a 1.20 table");
        let a = t.lookup_inlined(0x1005, None).pop().expect("in main.a");
        assert_eq!(
            (a.function.as_str(), a.file.as_deref(), a.line),
            ("main.a", Some("/src/main.go"), 10)
        );
        assert_eq!(
            t.lookup_inlined(0x1020, None)
                .pop()
                .expect("in main.a")
                .line,
            12
        );
        let b = t.lookup_inlined(0x1040, None).pop().expect("main.b starts");
        assert_eq!(b.function, "main.b");
        assert!(
            t.lookup_inlined(0x1080, None).pop().is_none(),
            "past the last function"
        );
        assert!(
            t.lookup_inlined(0xfff, None).pop().is_none(),
            "before the text"
        );
    }

    #[test]
    fn sp_delta_follows_the_prologue() {
        let data = table_bytes();
        let t = Pclntab::parse(&data, 0).expect("a 1.20 table");
        assert_eq!(t.sp_delta(0x1000), Some(0), "at the entry");
        assert_eq!(t.sp_delta(0x1003), Some(0));
        assert_eq!(t.sp_delta(0x1004), Some(8), "frame pointer pushed");
        assert_eq!(t.sp_delta(0x1008), Some(0x28), "frame made");
        assert_eq!(t.sp_delta(0x103f), Some(0x28));
        assert_eq!(t.sp_delta(0x1080), None, "past the last function");
    }

    #[test]
    fn functions_are_found_by_name() {
        let data = table_bytes();
        let t = Pclntab::parse(&data, 0).expect("a 1.20 table");
        assert_eq!(t.function_named("main.a"), Some((0x1000, 0x40)));
        assert_eq!(t.function_named("main.b"), Some((0x1040, 0x40)));
        assert_eq!(t.function_named("main.c"), None);
        assert_eq!(t.function_named("main."), None, "whole names only");
    }

    /// The module data's layout is the DWARF of a program built by each
    /// release read (`model/go_dwarf.rs`): `pcHeader` first, `rodata` just
    /// before `gofunc`, `gofunc` where [`gofunc_offset`] says; the inline
    /// trees are found through it, and their entries are of the size the
    /// table's magic says (`runtime.inlinedCall`: 20 bytes in 1.18 and
    /// 1.19, 16 from 1.20).
    #[test]
    fn module_data_is_each_release_s_dwarf() {
        use crate::model::go_dwarf;
        go_dwarf::assert_only_releases_read("gofunc_offset", |minor| {
            gofunc_offset(minor).is_some()
        });
        for release in go_dwarf::releases() {
            let version = &release.version;
            let gofunc = release.offset("runtime.moduledata", "gofunc");
            println!(
                "{version}: moduledata.gofunc at {gofunc}, inlinedCall of {} bytes",
                release.size("runtime.inlinedCall")
            );
            assert_eq!(
                gofunc_offset(release.minor),
                Some(gofunc as usize),
                "{version}"
            );
            assert_eq!(
                release.offset("runtime.moduledata", "rodata") + 8,
                gofunc,
                "{version}"
            );
            assert_eq!(release.offset("runtime.moduledata", "pcHeader"), 0);
            let file = object::File::parse(&*release.binary).expect("an ELF file");
            assert!(InlineTrees::find(&file).is_some(), "{version}");
            let table = Pclntab::of_file(&file).expect("a pclntab");
            assert_eq!(
                table.old,
                release.size("runtime.inlinedCall") == 20,
                "{version}"
            );
        }
    }

    #[test]
    fn other_layouts_and_cut_tables_are_refused() {
        let mut data = table_bytes();
        data[0] = 0xfa; // Go 1.16's magic
        assert!(Pclntab::parse(&data, 0).is_none());
        let data = table_bytes();
        assert!(Pclntab::parse(&data[..100], 0).is_none());
    }
}
