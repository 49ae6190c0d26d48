//! Go's park points for the block profile: where in a Go executable (or Go
//! shared library) runtime.gopark and runtime.ready begin, so that parked
//! goroutines (channels, select, sync) show in the block profile as Go's
//! own block profile shows them. The links are kept by
//! `uprobes::UprobeLinks`; the probe is `go_park_probe`.

use std::path::Path;

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use profiler_common::go_fn;

use crate::bpf::attach::placement;
use crate::bpf::uprobes::ProbePoints;

/// The probe points of `path`: None unless it defines both Go functions.
pub fn find(path: &Path) -> Result<Option<ProbePoints>, String> {
    let data = super::map_file(path)?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    // Cheap first: most files are not Go.
    if file.section_by_name(".gopclntab").is_none()
        && file.section_by_name(".go.buildinfo").is_none()
    {
        return Ok(None);
    }
    let mut points = ProbePoints {
        offsets: Vec::new(),
        cookies: Vec::new(),
        single_stepped: Vec::new(),
    };
    for (cookie, name) in go_fn::NAMES.iter().enumerate() {
        let Some(symbol) = file
            .symbols()
            .find(|s| s.kind() == SymbolKind::Text && s.name() == Ok(name))
        else {
            // Stripped (or a runtime without these functions).
            return Ok(None);
        };
        let (address, size) = (symbol.address(), symbol.size().clamp(16, 4096));
        let Some((offset, code)) = file.segments().find_map(|segment| {
            let (file_start, file_size) = segment.file_range();
            let start = segment.address();
            if address < start || address >= start + file_size {
                return None;
            }
            let offset = address - start + file_start;
            let end = (offset + size)
                .min(file_start + file_size)
                .min(data.len() as u64);
            Some((offset, data.get(offset as usize..end as usize)?))
        }) else {
            return Ok(None);
        };
        // Go's prologue compares the stack bound first (`cmp`, which the
        // kernel single-steps); the `jbe` after it is emulated.
        let placement = placement::choose(code, address);
        if !placement.emulated {
            points.single_stepped.push(cookie as u64);
        }
        points.offsets.push(offset + placement.offset);
        points.cookies.push(cookie as u64);
    }
    Ok(Some(points))
}
