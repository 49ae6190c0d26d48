//! Go's park points for the block and mutex profiles: where in a Go
//! executable (or Go shared library) runtime.gopark, runtime.ready,
//! runtime.readyWithTime and runtime.semacquire1 begin, so that parked
//! goroutines (channels, select, sync) show in the block profile, and the
//! releases of sync mutexes in the mutex profile, as Go's own profiles
//! show them, stripped binaries included; each probe's cookie carries what
//! the release needs to follow Go's rules (`go_fn::release_bits`). The
//! links are kept by `uprobes::UprobeLinks`; the probe is `go_park_probe`.

use std::path::Path;

use profiler_common::go_fn;

use crate::bpf::attach::go_functions;
use crate::bpf::uprobes::ProbePoints;
use crate::model::go_buildinfo::{go_release, is_go};
use crate::model::go_wait_reasons::{mutex_reasons, sema_reasons};

/// The probe points of `path`: None unless it defines gopark and ready;
/// readyWithTime too where it is a function of its own and the release's
/// mutex wait reasons are known (the mutex profile of goroutines).
pub fn find(path: &Path) -> Result<Option<ProbePoints>, String> {
    let data = super::map_file(path)?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    if !is_go(&file) {
        return Ok(None);
    }
    let minor = go_release(&file);
    let bits = minor.and_then(release_bits).unwrap_or(0);
    let parks = [
        go_fn::NAMES[go_fn::GOPARK as usize],
        go_fn::NAMES[go_fn::READY as usize],
    ];
    let Some(mut points) = go_functions::probe_points(&file, &data, &parks, |i| i as u64 | bits)
    else {
        return Ok(None);
    };
    // The semaphore points, where the release's reasons are known.
    if bits != 0 {
        for function in [go_fn::READY_WITH_TIME, go_fn::SEMACQUIRE] {
            if let Some(more) =
                go_functions::probe_points(&file, &data, &[go_fn::NAMES[function as usize]], |_| {
                    function | bits
                })
            {
                points.offsets.extend(more.offsets);
                points.cookies.extend(more.cookies);
                points.single_stepped.extend(more.single_stepped);
            }
        }
    }
    Ok(Some(points))
}

/// The cookie bits of Go release 1.`minor` (`go_fn::release_bits`): None
/// where its wait reasons are not known.
fn release_bits(minor: u32) -> Option<u64> {
    go_fn::release_bits(
        mutex_reasons(minor)?,
        sema_reasons(minor)?,
        sudog_waiters_at(minor),
    )
}

/// Where a `runtime.sudog` of release 1.`minor` keeps its `waiters`
/// count (a uint16 from Go 1.22; `elem` and `c` grew to 16 bytes in
/// 1.26), from the DWARF of go1.22.10, 1.23.9, 1.24.11, 1.25.5, 1.26.6
/// and 1.27.3 (checked against each by `model/go_dwarf.rs`); 0 before 1.22
/// (no such field in 1.19 and 1.21, nor in the sources of 1.18 and 1.20:
/// the mutex profile counts a queue's wait once).
fn sudog_waiters_at(minor: u32) -> u8 {
    match minor {
        22..=25 => 54,
        26.. => 62,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_carry_their_rules() {
        let bits = |minor| release_bits(minor).expect("known");
        assert_eq!(go_fn::waiters_at(bits(19)), 0);
        assert_eq!(go_fn::waiters_at(bits(21)), 0);
        assert_eq!(go_fn::waiters_at(bits(22)), 54);
        assert_eq!(go_fn::waiters_at(bits(27)), 62);
        // Go 1.19 parks a mutex's waiters and a WaitGroup's alike.
        assert!(go_fn::is_mutex_reason(bits(19), 18));
        assert!(go_fn::is_sema_reason(bits(19), 18));
        let [sema, wait_group] = sema_reasons(27).expect("known");
        assert!(!go_fn::is_mutex_reason(bits(27), wait_group));
        assert!(go_fn::is_sema_reason(bits(27), wait_group));
        assert!(go_fn::is_sema_reason(bits(27), sema));
        assert!(!go_fn::is_sema_reason(bits(27), 0));
        assert_eq!(release_bits(40), None);
        // Every release of the tables fits a cookie's function bits.
        for minor in 18..=27 {
            let bits = bits(minor);
            assert_eq!(
                bits & !profiler_common::probe_cookie::FUNCTION,
                0,
                "1.{minor}"
            );
            let [lock, rlock, wlock] = mutex_reasons(minor).expect("known");
            for reason in [lock, rlock, wlock] {
                assert!(go_fn::is_mutex_reason(bits, reason), "1.{minor}: {reason}");
            }
            assert!(!go_fn::is_mutex_reason(bits, wlock + 1), "1.{minor}");
        }
    }

    /// What the probes read is where the DWARF of a program built by each
    /// release read puts it (`model/go_dwarf.rs`): `sudog.waiters` (none
    /// before 1.22), `sudog.g` first; gopark's `lock` in RBX and `reason`
    /// in RCX, the goroutine or sudog that ready and readyWithTime take in
    /// RAX, semacquire1's `addr` and `lifo` in RAX and RBX.
    #[test]
    fn offsets_and_arguments_are_each_release_s_dwarf() {
        use crate::model::go_dwarf;
        go_dwarf::assert_only_releases_read("release_bits", |minor| release_bits(minor).is_some());
        for release in go_dwarf::releases() {
            let version = &release.version;
            let waiters = release.member("runtime.sudog", "waiters").unwrap_or(0);
            println!(
                "{version}: sudog.waiters at {waiters}; gopark{:?}, ready{:?}, readyWithTime{:?}, semacquire1{:?}",
                release.params("runtime.gopark"),
                release.params("runtime.ready"),
                release.params("runtime.readyWithTime"),
                release.params("runtime.semacquire1"),
            );
            assert_eq!(
                u64::from(sudog_waiters_at(release.minor)),
                waiters,
                "{version}"
            );
            assert_eq!(release.offset("runtime.sudog", "g"), 0, "{version}");
            assert!(
                matches!(
                    release.params("runtime.gopark")[..],
                    ["unlockf", "lock", "reason", ..]
                ),
                "{version}"
            );
            assert!(
                matches!(release.params("runtime.ready")[..], ["gp", ..]),
                "{version}"
            );
            assert!(
                matches!(release.params("runtime.readyWithTime")[..], ["s", ..]),
                "{version}"
            );
            assert!(
                matches!(
                    release.params("runtime.semacquire1")[..],
                    ["addr", "lifo", ..]
                ),
                "{version}"
            );
        }
    }
}
