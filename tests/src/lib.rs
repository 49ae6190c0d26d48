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
//! - [`pprof_tool`]: checking every file with `go tool pprof -raw`;
//! - [`cgroups`]: cgroups a test creates and removes, workloads put in them.
//! - [`http`]: `/metrics` scrapes.
//! - [`flame_graph`]: flame graph SVGs read back.
//! - [`pyroscope`]: a stand-in Pyroscope server that decodes pushes with
//!   Pyroscope's published API and checks them by the server's rules.
//! - [`otlp`]: a stand-in OTLP profiles receiver that decodes exports with
//!   OpenTelemetry's published `v1development` proto and checks them by its
//!   rules; [`standin`]: the HTTP side both stand-ins share; [`sinks`]:
//!   running the daemon and reading its files and summaries for both.
//! - [`perf`]: `perf record` over the same stretch as the daemon, and its
//!   samples read back with `perf script`.
//! - [`resources`]: the daemon's memory and open descriptors over time.
//! - [`sandbox`]: the sandbox of `deploy/profilerd.service` applied as
//!   systemd applies it, with the launcher `src/bin/sandbox_exec.rs`.
//!
//! Every test needs root (see [`daemon::require_root`]) and the suite is meant
//! to run serially: `cargo test -p profiler-tests --release -- --test-threads=1`.

pub mod cgroups;
pub mod daemon;
pub mod flame_graph;
pub mod http;
pub mod node;
pub mod otlp;
pub mod perf;
pub mod pprof_tool;
pub mod process;
pub mod profiles;
pub mod py_spy;
pub mod pyroscope;
pub mod resources;
pub mod sandbox;
pub mod sinks;
pub mod standin;
pub mod workloads;

pub use pprof_proto::Profile;

use std::time::Duration;

use profiles::ProfileFile;

/// Names a CPU sampling rate (Hz) that replaces the tests' own where every
/// sample costs far more than on hardware: under QEMU's emulation the
/// kernel matrix sets 199, so that the sample handler and the timers it
/// rides on do not crowd out the work being measured.
pub const CPU_HZ_ENV: &str = "PROFILERD_TEST_CPU_HZ";

/// The CPU sampling rate a test uses: `$PROFILERD_TEST_CPU_HZ`, else
/// `default`.
pub fn cpu_hz(default: u64) -> u64 {
    match std::env::var(CPU_HZ_ENV) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{CPU_HZ_ENV}={v:?} is not a rate in Hz")),
        Err(_) => default,
    }
}

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
        check_raw_agrees(
            file,
            "space bytes",
            rate as i64,
            &profiles::HEAP_SAMPLE_TYPES,
        );
    }
}

/// Checks every block or mutex profile file of a run: the contract's
/// structure and rescaling invariants (see
/// [`profiles::check_wait_profile`]), and that `go tool pprof -raw` reads
/// it, prints its samples, and shows period type contentions/count with
/// period 1 and the same totals of contentions and delay as our decoder.
pub fn check_wait_files(files: &[ProfileFile], kind: profiles::WaitKind) {
    for file in files {
        profiles::check_wait_profile(file, kind);
        check_raw_agrees(file, "contentions count", 1, &profiles::WAIT_SAMPLE_TYPES);
    }
}

/// Checks off-CPU files as `go tool pprof -raw` reads them: readable, with
/// the sample types and totals of our decoder.
pub fn check_offcpu_files(files: &[ProfileFile]) {
    for file in files {
        check_raw_agrees(file, "offcpu nanoseconds", 1, &["events", "offcpu"]);
    }
}

/// `go tool pprof -raw` reads `file` and, when it holds samples, prints
/// them; its period type (`"type unit"`) and period are the given ones,
/// and its sample types and their totals those of our decoder.
fn check_raw_agrees(
    file: &ProfileFile,
    period_type: &str,
    period: i64,
    sample_type_names: &[&str],
) {
    let raw = pprof_tool::check_readable(&file.path, !file.profile.sample.is_empty());
    let name = file.path.display();
    let (raw_period_type, raw_period) = pprof_tool::raw_period(&raw);
    assert_eq!(
        (raw_period_type.as_deref(), raw_period),
        (Some(period_type), Some(period)),
        "{name}: period type and period as `go tool pprof -raw` reads them:\n{raw}"
    );
    if file.profile.sample.is_empty() {
        return;
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
    let ours: Vec<i64> = sample_type_names
        .iter()
        .map(|t| profiles::total_of(&file.profile, t))
        .collect();
    assert_eq!(
        sums, ours,
        "{name}: totals of {sample_type_names:?} from `go tool pprof -raw` differ from our decoder's"
    );
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

/// `go tool pprof -top` of every block or mutex file by delay, for
/// failure messages.
pub fn pprof_wait_tops(files: &[ProfileFile]) -> String {
    files
        .iter()
        .map(|f| {
            format!(
                "== go tool pprof -top -sample_index=delay {}\n{}",
                f.path.display(),
                pprof_tool::top_of_index(&f.path, "delay")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
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
