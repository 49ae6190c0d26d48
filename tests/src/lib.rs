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
