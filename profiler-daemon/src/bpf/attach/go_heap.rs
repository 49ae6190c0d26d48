//! The Go runtime's points of heap profiles: where `runtime.mProf_Malloc`,
//! `runtime.freeSpecial` and `runtime.mProf_Free` begin in a Go
//! executable (stripped or not), with the cookie that tells
//! `go_heap_probe` where `mProf_Malloc`'s arguments are in the release
//! that built it (it gained an `*m` first argument in Go 1.23, read from
//! the binary's DWARF of each release).

use std::path::Path;

use object::{Object, ObjectSection};
use profiler_common::go_heap_fn;

use crate::bpf::attach::go_functions;
use crate::bpf::uprobes::ProbePoints;
use crate::model::go_buildinfo::go_version;

/// The functions probed, in `go_heap_fn` order but for the two forms of
/// `mProf_Malloc`, which are one function.
const FUNCTIONS: [&str; 3] = [
    go_heap_fn::NAMES[go_heap_fn::MALLOC as usize],
    go_heap_fn::NAMES[go_heap_fn::FREE_SPECIAL as usize],
    go_heap_fn::NAMES[go_heap_fn::PROFILE_FREE as usize],
];

/// The probe points of `path`: None unless it is Go code of a release
/// from Go 1.18 (whose version it names) that defines all three.
pub fn find(path: &Path) -> Result<Option<ProbePoints>, String> {
    let data = super::map_file(path)?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    if !go_functions::is_go(&file) {
        return Ok(None);
    }
    let Some((1, minor)) = file
        .section_by_name(".go.buildinfo")
        .and_then(|s| s.data().ok())
        .and_then(go_version)
    else {
        return Ok(None);
    };
    let malloc = malloc_form(minor);
    Ok(go_functions::probe_points(
        &file,
        &data,
        &FUNCTIONS,
        |i| match i {
            0 => malloc,
            1 => go_heap_fn::FREE_SPECIAL,
            _ => go_heap_fn::PROFILE_FREE,
        },
    ))
}

/// Which form of `mProf_Malloc` release 1.`minor` has.
fn malloc_form(minor: u32) -> u64 {
    if minor >= 23 {
        go_heap_fn::MALLOC_WITH_M
    } else {
        go_heap_fn::MALLOC
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mprof_malloc_gained_its_m_in_go_1_23() {
        assert_eq!(malloc_form(19), go_heap_fn::MALLOC);
        assert_eq!(malloc_form(22), go_heap_fn::MALLOC);
        assert_eq!(malloc_form(23), go_heap_fn::MALLOC_WITH_M);
        assert_eq!(malloc_form(27), go_heap_fn::MALLOC_WITH_M);
    }
}
