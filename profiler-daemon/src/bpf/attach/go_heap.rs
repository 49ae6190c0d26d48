//! The Go runtime's points of heap profiles: where `runtime.mProf_Malloc`,
//! `runtime.freeSpecial` and `runtime.mProf_Free` begin in a Go
//! executable (stripped or not), with the cookie that tells
//! `go_heap_probe` where `mProf_Malloc`'s arguments are in the release
//! that built it (it gained an `*m` first argument in Go 1.23) and where a
//! special record's kind is (both read from the DWARF of each release).

use std::path::Path;

use profiler_common::go_heap_fn;

use crate::bpf::attach::go_functions;
use crate::bpf::uprobes::ProbePoints;
use crate::model::go_buildinfo::{go_release, is_go};

/// `mProf_Malloc` and `freeSpecial`, always probed.
const FUNCTIONS: [&str; 2] = [
    go_heap_fn::NAMES[go_heap_fn::MALLOC as usize],
    go_heap_fn::NAMES[go_heap_fn::FREE_SPECIAL as usize],
];

/// The same and `mProf_Free`, for a release whose special records are not
/// known.
const FUNCTIONS_AND_PROFILE_FREE: [&str; 3] = [
    go_heap_fn::NAMES[go_heap_fn::MALLOC as usize],
    go_heap_fn::NAMES[go_heap_fn::FREE_SPECIAL as usize],
    go_heap_fn::NAMES[go_heap_fn::PROFILE_FREE as usize],
];

/// The probe points of `path`: None unless it is Go code of a release
/// from Go 1.18 (whose version it names) that defines the functions.
pub fn find(path: &Path) -> Result<Option<ProbePoints>, String> {
    find_with(path, true)
}

/// [`find`] without reading special records' kinds: `mProf_Free` is
/// probed whatever the release (`[debug] go_special_kinds = false`).
pub fn find_without_kinds(path: &Path) -> Result<Option<ProbePoints>, String> {
    find_with(path, false)
}

fn find_with(path: &Path, kinds: bool) -> Result<Option<ProbePoints>, String> {
    let data = super::map_file(path)?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    if !is_go(&file) {
        return Ok(None);
    }
    let Some(minor) = go_release(&file) else {
        return Ok(None);
    };
    let malloc = malloc_form(minor);
    let (names, free_special): (&[&str], u64) = match special_layout(minor).filter(|_| kinds) {
        Some(layout) => (&FUNCTIONS, layout),
        None => (&FUNCTIONS_AND_PROFILE_FREE, go_heap_fn::FREE_SPECIAL),
    };
    Ok(go_functions::probe_points(
        &file,
        &data,
        names,
        |i| match i {
            0 => malloc,
            1 => free_special,
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

/// The `freeSpecial` cookie of release 1.`minor`: where a special
/// record's `kind` byte is and the kind of a profile record, as the DWARF
/// of binaries built by go1.19.8, 1.21.13, 1.22.10, 1.23.9, 1.24.11,
/// 1.25.5, 1.26.6 and 1.27.3 gives them (`runtime.special.kind`,
/// `runtime._KindSpecialProfile`; checked against each by
/// `model/go_dwarf.rs`); 1.18 and 1.20 are assumed to be as 1.19, no
/// binary of theirs read. None for another release.
fn special_layout(minor: u32) -> Option<u64> {
    let (kind_offset, profile_kind) = match minor {
        18..=22 => (10, 2),
        23 => (10, 3),
        24 => (16, 3),
        25..=27 => (16, 4),
        _ => return None,
    };
    Some(go_heap_fn::special_layout(kind_offset, profile_kind))
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

    #[test]
    fn special_records_change_with_the_release() {
        let layout = |minor| special_layout(minor).map(go_heap_fn::special_layout_of);
        assert_eq!(layout(19), Some((10, 2)));
        assert_eq!(layout(23), Some((10, 3)));
        assert_eq!(layout(24), Some((16, 3)));
        assert_eq!(layout(27), Some((16, 4)));
        assert_eq!(layout(40), None, "unknown: mProf_Free is probed too");
        let cookie = special_layout(27).expect("known");
        assert_eq!(cookie & go_heap_fn::FUNCTION, go_heap_fn::FREE_SPECIAL);
    }

    /// The cookies are the DWARF of a program built by each release read
    /// (`model/go_dwarf.rs`): `special.kind` and `_KindSpecialProfile`;
    /// `mProf_Malloc`'s object and size in RAX and RBX, or RBX and RCX
    /// behind an `*m`; `freeSpecial`'s record in RAX and object in RBX.
    #[test]
    fn cookies_are_each_release_s_dwarf() {
        use crate::model::go_dwarf;
        go_dwarf::assert_only_releases_read("special_layout", |minor| {
            special_layout(minor).is_some()
        });
        for release in go_dwarf::releases() {
            let version = &release.version;
            let kind_offset = release.offset("runtime.special", "kind");
            let profile_kind = release.constant("runtime._KindSpecialProfile");
            println!(
                "{version}: special.kind at {kind_offset}, _KindSpecialProfile {profile_kind}; mProf_Malloc{:?}, freeSpecial{:?}",
                release.params("runtime.mProf_Malloc"),
                release.params("runtime.freeSpecial")
            );
            assert_eq!(
                special_layout(release.minor),
                Some(go_heap_fn::special_layout(
                    u8::try_from(kind_offset).expect("a small offset"),
                    u8::try_from(profile_kind).expect("a small kind")
                )),
                "{version}"
            );
            let (form, first) = match release.params("runtime.mProf_Malloc")[..] {
                ["p", "size", ..] => (go_heap_fn::MALLOC, None),
                [mp, "p", "size", ..] => (go_heap_fn::MALLOC_WITH_M, Some(mp)),
                ref other => panic!("{version}: mProf_Malloc{other:?}"),
            };
            assert_eq!(malloc_form(release.minor), form, "{version}: {first:?}");
            assert!(
                matches!(release.params("runtime.freeSpecial")[..], ["s", "p", ..]),
                "{version}"
            );
        }
    }
}
