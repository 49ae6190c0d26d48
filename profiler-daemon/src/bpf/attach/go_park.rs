//! Go's park points for the block profile: where in a Go executable (or Go
//! shared library) runtime.gopark and runtime.ready begin, so that parked
//! goroutines (channels, select, sync) show in the block profile as Go's
//! own block profile shows them, stripped binaries included. The links are
//! kept by `uprobes::UprobeLinks`; the probe is `go_park_probe`.

use std::path::Path;

use profiler_common::go_fn;

use crate::bpf::attach::go_functions;
use crate::bpf::uprobes::ProbePoints;

/// The probe points of `path`: None unless it defines both Go functions.
pub fn find(path: &Path) -> Result<Option<ProbePoints>, String> {
    let data = super::map_file(path)?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    if !go_functions::is_go(&file) {
        return Ok(None);
    }
    Ok(go_functions::probe_points(
        &file,
        &data,
        &go_fn::NAMES,
        |i| i as u64,
    ))
}
