//! Condition variable park points for the block profile: where a file
//! (glibc's libc.so.6 or libpthread, or a static executable) defines
//! `pthread_cond_wait`, `pthread_cond_timedwait` and
//! `pthread_cond_clockwait`. A thread entering one notes the condition, so
//! that its futex wait is labelled with the condition's address (`cond`)
//! where the futex word alone is a word inside it that changes between
//! waits. (musl's waiters wait on a word of their own stack frame, which
//! the kernel cannot tie to the condition: their waits keep only `lock`.)
//! The links are kept by `uprobes::UprobeLinks`; the probe is
//! `cond_wait_probe`.

use std::path::Path;

use object::{Object, ObjectSymbol, SymbolKind};
use profiler_common::cond_fn;

use crate::bpf::attach::allocators::code_at;
use crate::bpf::attach::placement;
use crate::bpf::uprobes::ProbePoints;

/// The probe points of `path`: None unless it defines pthread_cond_wait.
pub fn find(path: &Path) -> Result<Option<ProbePoints>, String> {
    let data = super::map_file(path)?;
    find_in(&data).map_err(|e| format!("{}: {e}", path.display()))
}

/// [`find`] on the bytes of a file, whatever they hold.
pub fn find_in(data: &[u8]) -> Result<Option<ProbePoints>, String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    // Every definition: glibc exports two versions of each (GLIBC_2.2.5
    // for the old condition layout, GLIBC_2.3.2), and a static executable
    // has them in its full symbol table.
    let mut found: Vec<(u64, u64, u64)> = Vec::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        if symbol.is_undefined() || symbol.kind() != SymbolKind::Text {
            continue;
        }
        // As bytes, as allocators::find_in does.
        let Ok(name) = symbol.name_bytes() else {
            continue;
        };
        let Some(cookie) = cond_fn::NAMES.iter().position(|n| n.as_bytes() == name) else {
            continue;
        };
        if !found
            .iter()
            .any(|&(address, ..)| address == symbol.address())
        {
            found.push((symbol.address(), symbol.size(), cookie as u64));
        }
    }
    if !found.iter().any(|&(.., cookie)| cookie == cond_fn::WAIT) {
        return Ok(None);
    }
    let mut points = ProbePoints {
        offsets: Vec::new(),
        cookies: Vec::new(),
        single_stepped: Vec::new(),
        functions: Vec::new(),
    };
    for (address, size, cookie) in found {
        let Some((offset, code)) = code_at(&file, data, address, size) else {
            continue;
        };
        let placement = placement::choose(code, address);
        // The probe reads the first two arguments, which no instruction
        // before the chosen one may have changed: where none can be
        // emulated, the kernel single-steps the first.
        if !placement.emulated && !points.single_stepped.contains(&cookie) {
            points.single_stepped.push(cookie);
        }
        let Some(offset) = offset.checked_add(placement.offset) else {
            continue;
        };
        points.offsets.push(offset);
        points.cookies.push(cookie);
    }
    Ok((!points.offsets.is_empty()).then_some(points))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C library this test links finds its condition waits (glibc has
    /// them in libc.so.6 since 2.34, in libpthread before).
    #[test]
    fn the_c_library_has_condition_waits() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("libc.so") || p.contains("libpthread"))
            .expect("this test maps a C library");
        let points = find(Path::new(libc))
            .unwrap()
            .expect("pthread_cond_wait is defined there");
        assert!(points.cookies.contains(&cond_fn::WAIT));
        assert!(points.cookies.contains(&cond_fn::TIMEDWAIT));
        assert_eq!(points.offsets.len(), points.cookies.len());
    }

    #[test]
    fn files_without_condition_waits_have_no_points() {
        assert_eq!(find_in(b"not an ELF file").ok().flatten(), None);
        let me = std::env::current_exe().unwrap();
        // A Rust test binary links the C library dynamically: no
        // definition of its own.
        assert_eq!(find(&me).unwrap(), None);
    }
}
