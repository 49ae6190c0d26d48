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
