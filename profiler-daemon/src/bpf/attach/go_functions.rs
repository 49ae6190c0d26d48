//! Where functions of Go's runtime begin in a Go executable (or Go shared
//! library), and the probe points there: from the symbol table when the
//! file has one, else from Go's own function table, which stripping
//! (`-ldflags='-s -w'`) keeps. Used by the park points of block profiles
//! and the sampled-allocation points of heap profiles.

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::bpf::attach::placement;
use crate::bpf::uprobes::ProbePoints;
use crate::model::go_pclntab::Pclntab;

/// The code of each of `names` in `file`, in order, as (entry address,
/// length); None unless every one is found.
pub(crate) fn functions(file: &object::File<'_>, names: &[&str]) -> Option<Vec<(u64, u64)>> {
    let by_symbol: Option<Vec<(u64, u64)>> = names
        .iter()
        .map(|name| {
            file.symbols()
                .find(|s| s.kind() == SymbolKind::Text && s.name() == Ok(name))
                .map(|s| (s.address(), s.size()))
        })
        .collect();
    if by_symbol.is_some() {
        return by_symbol;
    }
    let table = Pclntab::of_file(file)?;
    names
        .iter()
        .map(|name| table.function_named(name))
        .collect()
}

/// The probe points at the functions of `names` in the Go file `data`
/// (parsed as `file`), each with its cookie (`cookie(index)`): None unless
/// every function is found. Each probe goes on the first instruction the
/// kernel emulates (Go's prologue compares the stack bound first, a `cmp`
/// the kernel would single-step; the `jbe` after it is emulated).
pub(crate) fn probe_points(
    file: &object::File<'_>,
    data: &[u8],
    names: &[&str],
    cookie: impl Fn(usize) -> u64,
) -> Option<ProbePoints> {
    let mut points = ProbePoints {
        offsets: Vec::new(),
        cookies: Vec::new(),
        single_stepped: Vec::new(),
        functions: Vec::new(),
    };
    for (index, (address, size)) in functions(file, names)?.into_iter().enumerate() {
        let (offset, code) = code_at(file, data, address, size)?;
        let placement = placement::choose(code, address);
        let cookie = cookie(index);
        if !placement.emulated {
            points.single_stepped.push(cookie);
        }
        points.offsets.push(offset + placement.offset);
        points.cookies.push(cookie);
    }
    Some(points)
}

/// The file offset of `address` and the function's code from there (its
/// `size`, bounded: the placement reads the prologue and the branches
/// back to it from the function's end).
fn code_at<'d>(
    file: &object::File<'_>,
    data: &'d [u8],
    address: u64,
    size: u64,
) -> Option<(u64, &'d [u8])> {
    file.segments().find_map(|segment| {
        let (file_start, file_size) = segment.file_range();
        let start = segment.address();
        if address < start || address >= start + file_size {
            return None;
        }
        let offset = address - start + file_start;
        let end = (offset + size.clamp(16, 4096))
            .min(file_start + file_size)
            .min(data.len() as u64);
        Some((offset, data.get(offset as usize..end as usize)?))
    })
}
