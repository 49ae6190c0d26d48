//! Helpers shared by the end-to-end tests of `profilerd`.
//!
//! The tests run the real daemon as root against small workloads whose truth
//! is known (they measure their own CPU time per function), read the pprof
//! files it writes, and compare. The pieces:
//!
//! - [`process`]: child processes that are always killed and reaped (guards
//!   with `Drop`), hard timeouts, line-by-line capture of their output;
//! - [`daemon`]: locating and running `profilerd`, waiting for it to be ready
//!   and for it to exit within a bound;
//! - [`workloads`]: compiling `tests/workloads/*` into a temporary directory
//!   and running them;
//! - [`profiles`]: reading, validating and analysing the profile files;
//! - [`pprof_tool`]: checking every file with `go tool pprof -raw`.
//!
//! Every test needs root (see [`daemon::require_root`]) and the suite is meant
//! to run serially: `cargo test -p profiler-tests --release -- --test-threads=1`.

pub mod daemon;
pub mod pprof_tool;
pub mod process;
pub mod profiles;
pub mod workloads;

pub use pprof_proto::Profile;

use std::time::Duration;

use profiles::ProfileFile;

/// A fresh temporary directory for one test (removed when dropped).
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("profilerd-e2e-")
        .tempdir()
        .expect("creating a temporary directory")
}

/// Checks every cpu profile file of a run: the contract's structure (see
/// [`profiles::check_cpu_profile`]) and that `go tool pprof -raw` reads it
/// and, when the file holds samples, prints them.
pub fn check_cpu_files(files: &[ProfileFile], hz: u64) {
    for file in files {
        profiles::check_cpu_profile(file, hz);
        pprof_tool::check_readable(&file.path, !file.profile.sample.is_empty());
    }
}

/// Checks every heap profile file of a run: the contract's structure with
/// period = `rate` (see [`profiles::check_heap_profile`]), and that
/// `go tool pprof -raw` reads it, prints its samples, and shows the same
/// period and the same total of each sample type as our own decoder.
pub fn check_heap_files(files: &[ProfileFile], rate: u64) {
    for file in files {
        profiles::check_heap_profile(file, rate);
        let raw = pprof_tool::check_readable(&file.path, !file.profile.sample.is_empty());
        let name = file.path.display();
        let (period_type, period) = pprof_tool::raw_period(&raw);
        assert_eq!(
            (period_type.as_deref(), period),
            (Some("space bytes"), Some(rate as i64)),
            "{name}: period type and period as `go tool pprof -raw` reads them:\n{raw}"
        );
        if file.profile.sample.is_empty() {
            continue;
        }
        let (header, sums) = pprof_tool::raw_totals(&raw);
        let want_header: Vec<String> = profiles::sample_types(&file.profile)
            .iter()
            .map(|(t, u)| format!("{t}/{u}"))
            .collect();
        assert_eq!(
            header, want_header,
            "{name}: sample types as `go tool pprof -raw` reads them:\n{raw}"
        );
        let ours: Vec<i64> = profiles::HEAP_SAMPLE_TYPES
            .iter()
            .map(|t| profiles::total_of(&file.profile, t))
            .collect();
        assert_eq!(
            sums,
            ours,
            "{name}: totals of {:?} from `go tool pprof -raw` differ from our decoder's",
            profiles::HEAP_SAMPLE_TYPES
        );
    }
}

/// `go tool pprof -top` of every heap file by allocated and by in-use
/// bytes, for failure messages.
pub fn pprof_heap_tops(files: &[ProfileFile]) -> String {
    let mut out = Vec::new();
    for f in files {
        for index in ["alloc_space", "inuse_space"] {
            out.push(format!(
                "== go tool pprof -top -sample_index={index} {}\n{}",
                f.path.display(),
                pprof_tool::top_of_index(&f.path, index)
            ));
        }
    }
    out.join("\n")
}

/// `go tool pprof -top` of every file, for failure messages.
pub fn pprof_tops(files: &[ProfileFile], pid: Option<u32>) -> String {
    files
        .iter()
        .map(|f| {
            format!(
                "== go tool pprof -top {}\n{}",
                f.path.display(),
                pprof_tool::top(&f.path, pid)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sleeps; a named helper so tests read as a timeline.
pub fn pause(d: Duration) {
    std::thread::sleep(d);
}
