//! tracefs: where it is (mounted if need be), and the field offsets of
//! tracepoint records, read from their format files (they differ between
//! kernels).

use std::fs;
use std::path::{Path, PathBuf};

/// Why tracefs or a tracepoint's format could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// Neither tracefs mount point has events, and mounting failed.
    #[error("tracefs is not available at {TRACEFS} and mounting it failed: {0}")]
    Unavailable(#[source] std::io::Error),
    /// A tracepoint's format file could not be read.
    #[error("cannot read tracepoint format {path}: {source}")]
    FormatUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A tracepoint's format file lacks a field the programs read.
    #[error("cannot read tracepoint format {path}: no field '{field}'")]
    FormatField { path: PathBuf, field: String },
}

pub(crate) const TRACEFS: &str = "/sys/kernel/tracing";

/// Tracepoints need tracefs; mount it where the kernel expects it when the
/// system has not.
pub(crate) fn ensure_tracefs() -> Result<(), TracefsError> {
    if Path::new(TRACEFS).join("events").is_dir()
        || Path::new("/sys/kernel/debug/tracing/events").is_dir()
    {
        return Ok(());
    }
    let target =
        std::ffi::CString::new(TRACEFS).map_err(|e| TracefsError::Unavailable(e.into()))?;
    let fstype = c"tracefs";
    let source = c"nodev";
    // SAFETY: valid NUL-terminated strings; no data argument.
    let ret = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if ret != 0 {
        return Err(TracefsError::Unavailable(std::io::Error::last_os_error()));
    }
    tracing::info!("mounted tracefs at {TRACEFS}");
    Ok(())
}

/// Where tracepoints are listed, mounting tracefs if it is not.
pub fn tracefs_dir() -> Result<&'static Path, TracefsError> {
    ensure_tracefs()?;
    Ok(Path::new(tracefs_root()))
}

pub(crate) fn tracefs_root() -> &'static str {
    if Path::new(TRACEFS).join("events").is_dir() {
        TRACEFS
    } else {
        "/sys/kernel/debug/tracing"
    }
}

/// Offset of one field of a tracepoint record, from its format file:
/// `field:pid_t pid; offset:8; size:4; signed:1;` (tab-separated).
pub fn tracepoint_field_offset(
    category: &str,
    name: &str,
    field: &str,
) -> Result<u32, TracefsError> {
    let path = tracepoint_format_path(category, name);
    let text = fs::read_to_string(&path).map_err(|source| TracefsError::FormatUnreadable {
        path: path.clone(),
        source,
    })?;
    parse_field_offset(&text, field).ok_or_else(|| TracefsError::FormatField {
        path,
        field: field.to_string(),
    })
}

pub(crate) fn tracepoint_format_path(category: &str, name: &str) -> PathBuf {
    Path::new(tracefs_root())
        .join("events")
        .join(category)
        .join(name)
        .join("format")
}

pub(crate) fn parse_field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let line = line.trim();
        let decl = line.strip_prefix("field:")?.split(';').next()?;
        let declared = decl.split_whitespace().last()?;
        if declared.trim_start_matches('*') != field {
            return None;
        }
        let offset = line.split("offset:").nth(1)?.split(';').next()?;
        offset.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fork_format() {
        let format = "name: sched_process_fork\nID: 300\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;\n\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;\n\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;\n";
        assert_eq!(parse_field_offset(format, "child_pid"), Some(44));
        assert_eq!(parse_field_offset(format, "parent_pid"), Some(24));
        assert_eq!(parse_field_offset(format, "nope"), None);
    }

    #[test]
    fn parses_new_task_format() {
        // Linux 6.1's (and 6.12's) task_newtask.
        let format = "name: task_newtask\nID: 131\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;\n\tfield:unsigned long clone_flags;\toffset:32;\tsize:8;\tsigned:0;\n\tfield:short oom_score_adj;\toffset:40;\tsize:2;\tsigned:1;\n";
        assert_eq!(parse_field_offset(format, "pid"), Some(8));
        assert_eq!(parse_field_offset(format, "clone_flags"), Some(32));
    }
}
