//! Go's park points for the block and mutex profiles: where in a Go
//! executable (or Go shared library) runtime.gopark, runtime.ready and
//! runtime.readyWithTime begin, so that parked goroutines (channels,
//! select, sync) show in the block profile, and the releases of sync
//! mutexes in the mutex profile, as Go's own profiles show them, stripped
//! binaries included. The links are
//! kept by `uprobes::UprobeLinks`; the probe is `go_park_probe`.

use std::path::Path;

use profiler_common::go_fn;

use crate::bpf::attach::go_functions;
use crate::bpf::uprobes::ProbePoints;
use crate::model::go_buildinfo::{go_release, is_go};
use crate::model::go_wait_reasons::mutex_reasons;

/// The probe points of `path`: None unless it defines gopark and ready;
/// readyWithTime too where it is a function of its own and the release's
/// mutex wait reasons are known (the mutex profile of goroutines).
pub fn find(path: &Path) -> Result<Option<ProbePoints>, String> {
    let data = super::map_file(path)?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    if !is_go(&file) {
        return Ok(None);
    }
    let parks = [
        go_fn::NAMES[go_fn::GOPARK as usize],
        go_fn::NAMES[go_fn::READY as usize],
    ];
    let Some(mut points) = go_functions::probe_points(&file, &data, &parks, |i| i as u64) else {
        return Ok(None);
    };
    let reasons = go_release(&file).and_then(mutex_reasons);
    if let Some(reasons) = reasons
        && let Some(release) = go_functions::probe_points(
            &file,
            &data,
            &[go_fn::NAMES[go_fn::READY_WITH_TIME as usize]],
            |_| go_fn::mutex_reasons(reasons),
        )
    {
        points.offsets.extend(release.offsets);
        points.cookies.extend(release.cookies);
        points.single_stepped.extend(release.single_stepped);
    }
    Ok(Some(points))
}
