//! Node's command line for a profile named from its perf map, shared by
//! the tests that run Node (`jit.rs`, `realworld.rs`).

use std::path::Path;

/// V8's `--logfile` argument for a log in `dir`: with `--perf-basic-prof`
/// Node also writes a V8 log, by default into its working directory.
pub fn v8_log_in(dir: &Path) -> String {
    format!("--logfile={}", dir.join("v8.log").display())
}

/// Node's arguments for a perf map, its V8 log kept at `v8_log` (see
/// [`v8_log_in`]), then `rest`.
pub fn node_args<'a>(v8_log: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--perf-basic-prof", "--no-logfile-per-isolate", v8_log];
    args.extend_from_slice(rest);
    args
}
