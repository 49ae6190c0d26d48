//! What an object's section headers and relocation tables say about its
//! code that its symbol tables do not: where its PLT stubs are and which
//! function each one jumps to, and which code section an address lies in.
//!
//! Symbol tables have no entry for PLT stubs, so a symbolizer charges a
//! stub to the nearest symbol before it (typically `_init`). perf and
//! objdump name a stub after the function it reaches: `memcpy@plt`.
//!
//! On x86-64 a stub is an indirect jump through a GOT slot,
//! `jmp *slot(%rip)`, after an `endbr64` and a `bnd` prefix in IBT
//! layouts; the dynamic relocation that fills the slot names the target.
//! That is how binutils labels stubs in `objdump -d`. perf (since 6.3)
//! pairs `.plt` / `.plt.sec` stubs with the `.rela.plt` entries sorted by
//! slot address and reads `.plt.got` stubs by their slot, which comes to the
//! same. As in perf: a slot filled by an IRELATIVE relocation (no symbol)
//! takes the name of the IFUNC symbol at the resolver's address; the
//! lazy-binding header of `.plt` and, in IBT layouts (the stubs that run
//! are in `.plt.sec`, and `.plt` holds only lazy-binding code), all of
//! `.plt` are named `.plt`; a stub whose slot has no named relocation is
//! named `offset_0x<file offset>@plt`.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;

use object::elf::{self, FileHeader64, SectionHeader64};
use object::read::elf::{FileHeader as _, Rela as _, SectionHeader as _, SectionTable, Sym as _};
use object::{Endianness, ReadCache, SectionIndex, SymbolIndex};

use crate::model::go_pclntab::PclntabSection;
use crate::stacks::symbol_aliases::SymbolAliases;

/// Stubs kept per object: more than any real PLT (libpython has ~500).
const MAX_STUBS: usize = 1 << 16;
/// Relocation sections larger than this are not read (a slot they fill
/// gets the `offset_` name).
const MAX_RELOCATION_BYTES: u64 = 32 << 20;
/// Symbol tables larger than this are not searched for IFUNC names.
const MAX_SYMTAB_BYTES: u64 = 64 << 20;
/// x86-64 relocation types (elf.h).
const R_X86_64_IRELATIVE: u32 = 37;
/// `endbr64`, which starts every stub of an IBT layout.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("opening the file: {0}")]
    Open(#[source] std::io::Error),
    #[error("reading its ELF headers: {0}")]
    Elf(#[source] object::Error),
    #[error("not an x86-64 ELF file")]
    NotX86_64,
}

impl From<object::Error> for LayoutError {
    fn from(err: object::Error) -> Self {
        Self::Elf(err)
    }
}

/// The PLT sections, each with its own stub layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PltKind {
    /// `.plt`: lazy-binding header, then stubs (or, when `.plt.sec`
    /// exists, lazy-binding code only).
    Plt,
    /// `.plt.sec`: the stubs of an IBT layout.
    PltSec,
    /// `.plt.got`: stubs of functions whose address is also taken.
    PltGot,
}

impl PltKind {
    fn of(name: &[u8]) -> Option<Self> {
        match name {
            b".plt" => Some(Self::Plt),
            b".plt.sec" => Some(Self::PltSec),
            b".plt.got" => Some(Self::PltGot),
            _ => None,
        }
    }
}

/// An executable section with file data.
#[derive(Clone, Debug)]
struct CodeSection {
    index: usize,
    addr: u64,
    size: u64,
    offset: u64,
    plt: Option<PltKind>,
}

/// A named stretch of a PLT section, by file offset.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stub {
    offset: u64,
    size: u64,
    name: Box<str>,
}

/// Where a file offset lies, as far as the section headers tell.
#[derive(Debug, PartialEq, Eq)]
pub enum Placement<'a> {
    /// In a PLT section, in the stub (or header) of this name.
    Stub(&'a str),
    /// In a PLT section but in no stub that could be named.
    UnnamedPlt,
    /// Anywhere else.
    Other,
}

/// The code sections of one object and, once an address in a PLT section
/// was asked for, its named stubs.
#[derive(Debug)]
pub struct ObjectLayout {
    /// Sorted by file offset.
    sections: Vec<CodeSection>,
    /// Sorted by file offset; read at the first lookup in a PLT section.
    stubs: Option<Vec<Stub>>,
    /// A Go binary's function table (model/go_pclntab.rs).
    go_pclntab: Option<PclntabSection>,
    /// The names perf gives aliased functions; read at the first lookup.
    aliases: Option<SymbolAliases>,
}

impl ObjectLayout {
    /// Reads the section headers of the ELF file at `path`.
    pub fn read(path: &Path) -> Result<Self, LayoutError> {
        let cache = ReadCache::new(File::open(path).map_err(LayoutError::Open)?);
        let (endian, table) = section_table(&cache)?;
        let mut sections: Vec<CodeSection> = table
            .enumerate()
            .filter(|(_, sh)| {
                let flags = sh.sh_flags(endian);
                flags & u64::from(elf::SHF_ALLOC) != 0
                    && flags & u64::from(elf::SHF_EXECINSTR) != 0
                    && sh.sh_type(endian) != elf::SHT_NOBITS
            })
            .map(|(index, sh)| CodeSection {
                index: index.0,
                addr: sh.sh_addr(endian),
                size: sh.sh_size(endian),
                offset: sh.sh_offset(endian),
                plt: table.section_name(endian, sh).ok().and_then(PltKind::of),
            })
            .collect();
        sections.sort_by_key(|s| s.offset);
        let named = |wanted: &[&[u8]]| {
            table.iter().find(|sh| {
                table
                    .section_name(endian, sh)
                    .is_ok_and(|n| wanted.contains(&n))
            })
        };
        let go_pclntab = named(&[b".gopclntab", b".data.rel.ro.gopclntab"])
            .filter(|sh| sh.sh_type(endian) == elf::SHT_PROGBITS)
            .map(|sh| PclntabSection {
                offset: sh.sh_offset(endian),
                size: sh.sh_size(endian),
                text_addr: named(&[b".text"]).map_or(0, |t| t.sh_addr(endian)),
            });
        Ok(Self {
            sections,
            stubs: None,
            go_pclntab,
            aliases: None,
        })
    }

    /// Where `offset` lies. The first lookup in a PLT section reads the
    /// stubs from `path` (the same file); if that fails, addresses in PLT
    /// sections stay unnamed.
    pub fn placement(&mut self, path: &Path, offset: u64) -> Placement<'_> {
        let in_plt = self
            .section_at_offset(offset)
            .is_some_and(|s| s.plt.is_some());
        if !in_plt {
            return Placement::Other;
        }
        if self.stubs.is_none() {
            let stubs = read_stubs(path, &self.sections).unwrap_or_else(|err| {
                tracing::debug!(%err, "cannot read PLT stubs; their frames stay unnamed");
                Vec::new()
            });
            self.stubs = Some(stubs);
        }
        let stubs = self.stubs.as_deref().unwrap_or_default();
        let at = stubs.partition_point(|s| s.offset <= offset);
        match at.checked_sub(1).and_then(|i| stubs.get(i)) {
            Some(stub) if offset - stub.offset < stub.size => Placement::Stub(&stub.name),
            _ => Placement::UnnamedPlt,
        }
    }

    /// Reads the names of the file's aliased functions, once
    /// (`stacks::symbol_aliases`).
    pub fn load_aliases(&mut self, path: &Path, build_id: Option<&str>) {
        if self.aliases.is_none() {
            self.aliases = Some(SymbolAliases::read(path, build_id));
        }
    }

    /// perf's name of the function at `addr` (the file's address space)
    /// that blazesym named `found`, when it is another.
    pub fn perf_name(&self, addr: u64, found: &str) -> Option<&str> {
        self.aliases.as_ref()?.perf_name(addr, found)
    }

    /// The Go function table, if the file is a Go binary that has one.
    pub fn go_pclntab(&self) -> Option<PclntabSection> {
        self.go_pclntab
    }

    /// The address of the code at file offset `offset`, in the file's
    /// address space (None outside its code sections).
    pub fn addr_of_offset(&self, offset: u64) -> Option<u64> {
        self.section_at_offset(offset)
            .map(|s| s.addr + (offset - s.offset))
    }

    /// Whether two addresses of the file's address space lie in the same
    /// code section; true when the headers cannot tell (an address in no
    /// code section, or a file without section headers).
    pub fn same_section(&self, a: u64, b: u64) -> bool {
        match (self.section_at_addr(a), self.section_at_addr(b)) {
            (Some(x), Some(y)) => x.index == y.index,
            _ => true,
        }
    }

    /// Heap bytes this layout holds: its sections and, once read, its
    /// stubs with their names.
    pub fn heap_bytes(&self) -> usize {
        let stubs = self.stubs.as_deref().unwrap_or_default();
        self.sections.capacity() * std::mem::size_of::<CodeSection>()
            + size_of_val(stubs)
            + stubs.iter().map(|s| s.name.len()).sum::<usize>()
            + self.aliases.as_ref().map_or(0, SymbolAliases::heap_bytes)
    }

    fn section_at_offset(&self, offset: u64) -> Option<&CodeSection> {
        let at = self.sections.partition_point(|s| s.offset <= offset);
        let s = self.sections.get(at.checked_sub(1)?)?;
        (offset - s.offset < s.size).then_some(s)
    }

    fn section_at_addr(&self, addr: u64) -> Option<&CodeSection> {
        self.sections
            .iter()
            .find(|s| addr.wrapping_sub(s.addr) < s.size)
    }
}

/// The section headers of a file read through `cache`.
type Sections<'a> = SectionTable<'a, FileHeader64<Endianness>, &'a ReadCache<File>>;

fn section_table(cache: &ReadCache<File>) -> Result<(Endianness, Sections<'_>), LayoutError> {
    let header = FileHeader64::<Endianness>::parse(cache)?;
    let endian = header.endian()?;
    if header.e_machine(endian) != elf::EM_X86_64 {
        return Err(LayoutError::NotX86_64);
    }
    Ok((endian, header.sections(endian, cache)?))
}

/// The GOT slot that a stub at `addr` jumps through: `jmp *disp(%rip)`,
/// after an optional `endbr64` and an optional `bnd` prefix.
fn got_slot(code: &[u8], addr: u64) -> Option<u64> {
    let mut at = if code.starts_with(&ENDBR64) { 4 } else { 0 };
    if code.get(at) == Some(&0xf2) {
        at += 1;
    }
    if code.get(at..at + 2)? != [0xff, 0x25] {
        return None;
    }
    let disp = i32::from_le_bytes(code.get(at + 2..at + 6)?.try_into().ok()?);
    // The displacement counts from the end of the 6-byte jump.
    Some(
        addr.wrapping_add((at + 6) as u64)
            .wrapping_add_signed(disp.into()),
    )
}

/// perf's and binutils' stub size for a PLT section: its entry size when
/// that is 8 or 16, else what its alignment suggests.
fn entry_size(sh: &SectionHeader64<Endianness>, endian: Endianness) -> u64 {
    match sh.sh_entsize(endian) {
        size @ (8 | 16) => size,
        _ if sh.sh_addralign(endian) == 8 => 8,
        _ => 16,
    }
}

/// A stub found in a PLT section, before its slot is named.
struct PendingStub {
    offset: u64,
    size: u64,
    slot: Option<u64>,
    /// Fixed names (`.plt`) need no slot.
    name: Option<Box<str>>,
}

/// Reads and names every stub of the PLT sections of the file at `path`.
fn read_stubs(path: &Path, sections: &[CodeSection]) -> Result<Vec<Stub>, LayoutError> {
    let cache = ReadCache::new(File::open(path).map_err(LayoutError::Open)?);
    let (endian, table) = section_table(&cache)?;
    let has_plt_sec = sections.iter().any(|s| s.plt == Some(PltKind::PltSec));
    let mut pending = Vec::new();
    for section in sections {
        let Some(kind) = section.plt else { continue };
        let sh = table.section(SectionIndex(section.index))?;
        if kind == PltKind::Plt && has_plt_sec {
            // Only lazy-binding code: no stub a call goes through.
            pending.push(PendingStub {
                offset: section.offset,
                size: section.size,
                slot: None,
                name: Some(".plt".into()),
            });
            continue;
        }
        let data = sh.data(endian, &cache).map_err(LayoutError::Elf)?;
        let step = entry_size(sh, endian);
        for (i, code) in data.chunks(step as usize).enumerate() {
            if pending.len() >= MAX_STUBS {
                break;
            }
            let at = i as u64 * step;
            match got_slot(code, section.addr + at) {
                Some(slot) => pending.push(PendingStub {
                    offset: section.offset + at,
                    size: step,
                    slot: Some(slot),
                    name: None,
                }),
                // The lazy-binding header (`push GOT+8; jmp *GOT+16`).
                None if kind == PltKind::Plt && i == 0 => pending.push(PendingStub {
                    offset: section.offset,
                    size: step,
                    slot: None,
                    name: Some(".plt".into()),
                }),
                None => {}
            }
        }
    }
    let slots: Vec<u64> = pending.iter().filter_map(|p| p.slot).collect();
    let names = slot_names(&cache, endian, &table, &slots)?;
    let mut stubs: Vec<Stub> = pending
        .into_iter()
        .map(|p| {
            let name = p
                .name
                .unwrap_or_else(|| match p.slot.and_then(|slot| names.get(&slot)) {
                    Some(target) => format!("{target}@plt").into(),
                    None => format!("offset_{:#x}@plt", p.offset).into(),
                });
            Stub {
                offset: p.offset,
                size: p.size,
                name,
            }
        })
        .collect();
    stubs.sort_by_key(|s| s.offset);
    Ok(stubs)
}

/// What fills each slot: the demangled name of the relocation's symbol,
/// or for an IRELATIVE relocation the IFUNC symbol at its resolver.
/// Slots that no allocated relocation section fills are left out.
fn slot_names<'a>(
    cache: &'a ReadCache<File>,
    endian: Endianness,
    table: &Sections<'a>,
    slots: &[u64],
) -> Result<HashMap<u64, String>, LayoutError> {
    let wanted: HashSet<u64> = slots.iter().copied().collect();
    let mut names = HashMap::new();
    let mut resolvers: Vec<(u64, u64)> = Vec::new();
    for (_, sh) in table.enumerate() {
        if sh.sh_flags(endian) & u64::from(elf::SHF_ALLOC) == 0
            || sh.sh_size(endian) > MAX_RELOCATION_BYTES
        {
            continue;
        }
        // A section that cannot be read leaves its slots to the
        // `offset_` name rather than every stub of the file unnamed.
        let Ok(Some((relas, link))) = sh.rela(endian, cache) else {
            continue;
        };
        let symbols = table.symbol_table_by_index(endian, cache, link).ok();
        for rela in relas {
            let slot = rela.r_offset(endian);
            if !wanted.contains(&slot) || names.contains_key(&slot) {
                continue;
            }
            let sym = rela.r_sym(endian, false);
            if sym == 0 {
                if rela.r_type(endian, false) == R_X86_64_IRELATIVE {
                    resolvers.push((slot, rela.r_addend(endian) as u64));
                }
                continue;
            }
            let Some(symbols) = &symbols else { continue };
            let Ok(symbol) = symbols.symbol(SymbolIndex(sym as usize)) else {
                continue;
            };
            let name = symbols.symbol_name(endian, symbol).unwrap_or_default();
            if !name.is_empty() {
                names.insert(slot, demangle(&String::from_utf8_lossy(name)));
            }
        }
    }
    if !resolvers.is_empty() {
        let ifuncs = ifunc_names(cache, endian, table, &resolvers).unwrap_or_default();
        for (slot, addr) in resolvers {
            if let Some(name) = ifuncs.get(&addr) {
                names.entry(slot).or_insert_with(|| demangle(name));
            }
        }
    }
    Ok(names)
}

/// A candidate name at an IFUNC resolver's address, ranked as perf ranks
/// symbols that share an address.
struct Candidate {
    name: String,
    sized: bool,
    typed: bool,
    weak: bool,
    global: bool,
    ifunc: bool,
}

impl Candidate {
    /// perf's preference: a size, a type, not weak, global, fewer leading
    /// underscores, a longer name; then the smaller name, to be stable.
    fn rank(&self) -> impl Ord + '_ {
        let underscores = self.name.bytes().take_while(|&b| b == b'_').count();
        (
            self.sized,
            self.typed,
            !self.weak,
            self.global,
            std::cmp::Reverse(underscores),
            self.name.len(),
            std::cmp::Reverse(&self.name),
        )
    }
}

/// The best name at each resolver address that has an IFUNC symbol, from
/// `.symtab` if the file has one (perf reads it first), else `.dynsym`.
fn ifunc_names<'a>(
    cache: &'a ReadCache<File>,
    endian: Endianness,
    table: &Sections<'a>,
    resolvers: &[(u64, u64)],
) -> Result<HashMap<u64, String>, LayoutError> {
    let addrs: HashSet<u64> = resolvers.iter().map(|&(_, a)| a).collect();
    let pick = |kind: u32| {
        table
            .enumerate()
            .find(|(_, sh)| sh.sh_type(endian) == kind)
            .filter(|(_, sh)| sh.sh_size(endian) <= MAX_SYMTAB_BYTES)
            .map(|(index, _)| index)
    };
    let Some(index) = pick(elf::SHT_SYMTAB).or_else(|| pick(elf::SHT_DYNSYM)) else {
        return Ok(HashMap::new());
    };
    let symbols = table.symbol_table_by_index(endian, cache, index)?;
    let mut best: HashMap<u64, Candidate> = HashMap::new();
    let mut has_ifunc: HashSet<u64> = HashSet::new();
    for symbol in symbols.iter() {
        let addr = symbol.st_value(endian);
        if !addrs.contains(&addr) || symbol.st_shndx(endian) == elf::SHN_UNDEF {
            continue;
        }
        let kind = symbol.st_type();
        if !matches!(kind, elf::STT_FUNC | elf::STT_GNU_IFUNC | elf::STT_NOTYPE) {
            continue;
        }
        let name = symbols.symbol_name(endian, symbol).unwrap_or_default();
        if name.is_empty() {
            continue;
        }
        let candidate = Candidate {
            name: String::from_utf8_lossy(name).into_owned(),
            sized: symbol.st_size(endian) > 0,
            typed: kind != elf::STT_NOTYPE,
            weak: symbol.st_bind() == elf::STB_WEAK,
            global: symbol.st_bind() == elf::STB_GLOBAL,
            ifunc: kind == elf::STT_GNU_IFUNC,
        };
        if candidate.ifunc {
            has_ifunc.insert(addr);
        }
        match best.get(&addr) {
            Some(old) if old.rank() >= candidate.rank() => {}
            _ => {
                best.insert(addr, candidate);
            }
        }
    }
    Ok(best
        .into_iter()
        .filter(|(addr, _)| has_ifunc.contains(addr))
        .map(|(addr, c)| (addr, c.name))
        .collect())
}

/// Demangles as the symbolizer does for names from ELF symbol tables:
/// Rust (without the hash), then C++, else the name as it is.
pub fn demangle(name: &str) -> String {
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return format!("{rust:#}");
    }
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|sym| sym.demangle().ok())
        .unwrap_or_else(|| name.to_owned())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::process::Command;

    /// A library whose calls go through the PLT (`memcpy`, `strlen`,
    /// `malloc`) and the `.plt.got` (`__cxa_finalize`).
    const LIB_C: &str = r#"
#include <stdlib.h>
#include <string.h>
int lib_work(char *d, const char *s, int n) { memcpy(d, s, n); return (int)strlen(d) + abs(n); }
void *lib_alloc(size_t n) { void *p = malloc(n); free(p); return malloc(n); }
"#;

    /// A program that calls the library and libc through its PLT, then
    /// waits until killed.
    pub(crate) const MAIN_C: &str = r#"
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int lib_work(char *d, const char *s, int n);
int main(int argc, char **argv) {
    char b[64] = {0};
    printf("%d\n", lib_work(b, argv[0], 3));
    fflush(stdout);
    for (;;) pause();
}
"#;

    /// The ways gcc and ld lay out PLTs: lazy `.plt`, IBT (`.plt` plus
    /// `.plt.sec`), eager binding, no PLT for calls (`-fno-plt`), IBT with
    /// eager binding.
    pub(crate) const VARIANTS: [(&str, &[&str]); 5] = [
        ("lazy", &[]),
        ("ibt", &["-fcf-protection=full", "-Wl,-z,ibtplt"]),
        ("now", &["-Wl,-z,now"]),
        ("noplt", &["-fno-plt", "-Wl,-z,now"]),
        (
            "ibtnow",
            &["-fcf-protection=full", "-Wl,-z,ibt", "-Wl,-z,now"],
        ),
    ];

    fn gcc(args: &[&str]) {
        let out = Command::new("gcc")
            .args(args)
            .output()
            .expect("running gcc (install it: the tests build C programs)");
        assert!(
            out.status.success(),
            "gcc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Builds `lib<name>.so` and the program `main-<name>` (linked to it,
    /// with an rpath to `dir`) with the variant's flags; returns their paths.
    pub(crate) fn build_variant(dir: &Path, name: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
        let lib_c = dir.join("lib.c");
        let main_c = dir.join("main.c");
        std::fs::write(&lib_c, LIB_C).unwrap();
        std::fs::write(&main_c, MAIN_C).unwrap();
        let lib = dir.join(format!("lib{name}.so"));
        let main = dir.join(format!("main-{name}"));
        let mut args = vec!["-O1", "-fPIC", "-shared", "-o", lib.to_str().unwrap()];
        args.extend(flags);
        args.push(lib_c.to_str().unwrap());
        gcc(&args);
        let rpath = format!("-Wl,-rpath,{}", dir.display());
        let libdir = format!("-L{}", dir.display());
        let link = format!("-l{name}");
        let mut args = vec!["-O1", "-o", main.to_str().unwrap()];
        args.extend(flags);
        args.extend([main_c.to_str().unwrap(), &libdir, &link, &rpath]);
        gcc(&args);
        (lib, main)
    }

    /// What objdump calls the code at one file offset of a PLT section.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub(crate) enum Label {
        /// `<memcpy@plt>`.
        Stub(String),
        /// The lazy-binding header: `<.plt>`, or `<first@plt-0x10>`.
        Header,
        /// `<*ABS*+0x9f550@plt>`: an IRELATIVE slot with that resolver.
        Ifunc(u64),
    }

    /// objdump's label for the first byte of every instruction in the PLT
    /// sections of `path`, by file offset.
    pub(crate) fn objdump_plt_labels(path: &Path) -> Vec<(u64, Label)> {
        let out = Command::new("objdump")
            .args(["-d", "-F", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got"])
            .arg(path)
            .output()
            .expect("running objdump (binutils)");
        assert!(out.status.success(), "objdump {}", path.display());
        let text = String::from_utf8_lossy(&out.stdout);
        let mut labels = Vec::new();
        // (address, file offset, label) of the current label.
        let mut current: Option<(u64, u64, Label)> = None;
        for line in text.lines() {
            if let Some((head, rest)) = line.split_once(" <")
                && let Ok(addr) = u64::from_str_radix(head, 16)
            {
                let (label, rest) = rest.split_once("> (File Offset: 0x").expect(line);
                let offset = u64::from_str_radix(rest.trim_end_matches("):"), 16).expect(line);
                let label = if label == ".plt" || label.contains("@plt-0x") {
                    Label::Header
                } else if let Some(resolver) = label.strip_prefix("*ABS*+0x") {
                    let resolver = resolver.strip_suffix("@plt").expect(line);
                    Label::Ifunc(u64::from_str_radix(resolver, 16).expect(line))
                } else {
                    Label::Stub(demangle(label.strip_suffix("@plt").expect(line)) + "@plt")
                };
                current = Some((addr, offset, label));
            } else if let Some((addr, _)) = line.trim_start().split_once(":\t")
                && let Ok(addr) = u64::from_str_radix(addr, 16)
                && let Some((start, offset, label)) = &current
            {
                labels.push((offset + (addr - start), label.clone()));
            }
        }
        labels
    }

    /// Names of the IFUNC symbols at `addr` in the file's symbol tables.
    fn ifunc_symbols_at(path: &Path, addr: u64) -> Vec<String> {
        let data = std::fs::read(path).unwrap();
        let file = object::read::elf::ElfFile64::<Endianness>::parse(&*data).unwrap();
        use object::{Object as _, ObjectSymbol as _};
        file.symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.address() == addr)
            .filter(|s| {
                matches!(s.flags(), object::SymbolFlags::Elf { st_info, .. } if st_info & 0xf == elf::STT_GNU_IFUNC)
            })
            .filter_map(|s| s.name().ok().map(str::to_owned))
            .collect()
    }

    /// Checks our name of every PLT instruction of `path` against objdump's
    /// labels; returns how many instructions and distinct stubs it checked.
    pub(crate) fn check_against_objdump(path: &Path) -> (usize, usize) {
        let labels = objdump_plt_labels(path);
        let mut layout = ObjectLayout::read(path).unwrap();
        let mut stubs = HashSet::new();
        for (offset, label) in &labels {
            let got = match layout.placement(path, *offset) {
                Placement::Stub(name) => name.to_owned(),
                other => panic!("{}: {offset:#x} ({label:?}) gave {other:?}", path.display()),
            };
            match label {
                Label::Stub(name) => assert_eq!(&got, name, "{}: {offset:#x}", path.display()),
                Label::Header => assert_eq!(got, ".plt", "{}: {offset:#x}", path.display()),
                Label::Ifunc(resolver) => {
                    let names = ifunc_symbols_at(path, *resolver);
                    let target = got.strip_suffix("@plt").unwrap_or_default();
                    assert!(
                        names.iter().any(|n| n == target)
                            || (names.is_empty() && target.starts_with("offset_0x")),
                        "{}: {offset:#x}: {got} for the IFUNC at {resolver:#x}, which is {names:?}",
                        path.display()
                    );
                }
            }
            stubs.insert(got);
        }
        (labels.len(), stubs.len())
    }

    #[test]
    fn gcc_layouts_match_objdump() {
        let dir = tempfile::tempdir().unwrap();
        let mut seen = HashSet::new();
        for (name, flags) in VARIANTS {
            let (lib, main) = build_variant(dir.path(), name, flags);
            for path in [&lib, &main] {
                let (instructions, stubs) = check_against_objdump(path);
                assert!(instructions > 0, "{}: no PLT instructions", path.display());
                let layout = ObjectLayout::read(path).unwrap();
                for s in &layout.sections {
                    seen.insert((name, s.plt));
                }
                // Every variant but -fno-plt has stubs besides the header.
                if name != "noplt" {
                    assert!(stubs >= 3, "{}: {stubs} stubs", path.display());
                }
            }
            // The names themselves, for the library.
            let mut layout = ObjectLayout::read(&lib).unwrap();
            let names: HashSet<String> = objdump_plt_labels(&lib)
                .iter()
                .filter_map(|(offset, _)| match layout.placement(&lib, *offset) {
                    Placement::Stub(name) => Some(name.to_owned()),
                    _ => None,
                })
                .collect();
            let want: &[&str] = if name == "noplt" {
                &[".plt", "__cxa_finalize@plt"]
            } else {
                &[
                    "memcpy@plt",
                    "strlen@plt",
                    "malloc@plt",
                    "__cxa_finalize@plt",
                ]
            };
            for want in want {
                assert!(names.contains(*want), "{name}: {want} not in {names:?}");
            }
        }
        // Both layouts appeared.
        assert!(seen.contains(&("ibt", Some(PltKind::PltSec))), "{seen:?}");
        assert!(seen.contains(&("lazy", Some(PltKind::Plt))), "{seen:?}");
        assert!(!seen.contains(&("lazy", Some(PltKind::PltSec))), "{seen:?}");
    }

    #[test]
    fn system_objects_match_objdump() {
        let candidates = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
            "/usr/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
            "/usr/bin/python3.11",
            "/usr/bin/bash",
            "/usr/bin/xz",
            "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0",
        ];
        let mut checked = 0;
        for path in candidates.iter().map(Path::new).filter(|p| p.exists()) {
            let (instructions, stubs) = check_against_objdump(path);
            assert!(stubs > 1, "{}: {stubs} stubs", path.display());
            println!(
                "{}: {instructions} instructions in {stubs} stubs",
                path.display()
            );
            checked += 1;
        }
        assert!(checked > 0, "none of {candidates:?} exists");
    }

    #[test]
    fn libc_ifunc_stubs_take_perfs_names() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        if !libc.exists() {
            return;
        }
        let mut layout = ObjectLayout::read(libc).unwrap();
        let labels = objdump_plt_labels(libc);
        let mut ifuncs = 0;
        for (offset, label) in &labels {
            if let Label::Ifunc(_) = label
                && let Placement::Stub(name) = layout.placement(libc, *offset)
            {
                // Weak and more underscored aliases lose, as in perf.
                assert!(
                    !["bcmp@plt", "mempcpy@plt", "index@plt"].contains(&name),
                    "{name}"
                );
                ifuncs += 1;
            }
        }
        assert!(ifuncs > 0, "libc has IRELATIVE PLT slots");
    }

    #[test]
    fn stub_jumps() {
        // jmp *0x2fe2(%rip) at 0x1030: slot 0x1030 + 6 + 0x2fe2.
        let plain = [0xff, 0x25, 0xe2, 0x2f, 0, 0, 0x68, 0, 0, 0, 0];
        assert_eq!(got_slot(&plain, 0x1030), Some(0x4018));
        // endbr64; bnd jmp *0x2f75(%rip) at 0x1070.
        let ibt = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x75, 0x2f, 0, 0, 0x0f, 0x1f, 0x44, 0, 0,
        ];
        assert_eq!(got_slot(&ibt, 0x1070), Some(0x1070 + 11 + 0x2f75));
        // A negative displacement.
        let back = [0xff, 0x25, 0xf0, 0xff, 0xff, 0xff];
        assert_eq!(got_slot(&back, 0x1000), Some(0x1000 + 6 - 16));
        // The lazy-binding header (push, then jmp) and IBT lazy entries.
        let header = [0xff, 0x35, 0xe2, 0x2f, 0, 0, 0xff, 0x25, 0xe4, 0x2f, 0, 0];
        assert_eq!(got_slot(&header, 0x1020), None);
        let lazy = [0xf3, 0x0f, 0x1e, 0xfa, 0x68, 0, 0, 0, 0, 0xf2, 0xe9];
        assert_eq!(got_slot(&lazy, 0x1030), None);
        assert_eq!(got_slot(&[0xff, 0x25, 0], 0), None);
        assert_eq!(got_slot(&[], 0), None);
    }

    #[test]
    fn perf_prefers_strong_global_short_prefixed_names() {
        let c = |name: &str, weak: bool, global: bool| Candidate {
            name: name.to_owned(),
            sized: true,
            typed: true,
            weak,
            global,
            ifunc: true,
        };
        let pick = |a: Candidate, b: Candidate| {
            if a.rank() >= b.rank() { a.name } else { b.name }
        };
        assert_eq!(
            pick(c("mempcpy", true, false), c("__mempcpy", false, true)),
            "__mempcpy"
        );
        assert_eq!(
            pick(c("memcmp", false, true), c("bcmp", true, false)),
            "memcmp"
        );
        assert_eq!(
            pick(c("__strchr", false, true), c("strchr", false, true)),
            "strchr"
        );
        assert_eq!(
            pick(c("strchr", false, true), c("index", false, true)),
            "strchr"
        );
    }

    #[test]
    fn demangles_like_the_symbolizer() {
        assert_eq!(demangle("memcpy"), "memcpy");
        assert_eq!(demangle("_ZdlPv"), "operator delete(void*)");
        assert_eq!(
            demangle("_ZN3std2io5stdio6_print17h0123456789abcdefE"),
            "std::io::stdio::_print"
        );
    }
}
