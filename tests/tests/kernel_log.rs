//! Kernel-side diagnostics: with `PROFILERD_LOG=debug` (or `[debug]
//! kernel_log = true`) the eBPF programs say why they skip, drop, shorten
//! or fall back, and the daemon logs it under the target
//! `profilerd::kernel`; without, the programs are loaded with every log
//! site removed and nothing of the kind is logged.
//!
//! The workload is wait_sites.c with two threads: its three wait sites
//! start from the same registers, so walk hints keep matching (brief
//! records) and failing to match (another site's hint), and each thread's
//! first stack copy stops at the top of its stack. Every run loads every
//! program (all five profiles), so that the verifier accepts each with its
//! log sites on and off.

use std::process::Command;
use std::time::Duration;

use profiler_tests::daemon::{Daemon, profilerd_bin, require_root};
use profiler_tests::temp_dir;
use profiler_tests::workloads::{Running, Workload};

const KERNEL: &str = "profilerd::kernel:";
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(60);
const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// How the daemon is asked for the kernel's diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ask {
    Not,
    /// `PROFILERD_LOG=debug`.
    LogLevel,
    /// `[debug] kernel_log = true`, the log at its default level.
    ConfigKey,
}

struct Run {
    pid: u32,
    daemon: Daemon,
}

impl Run {
    fn kernel_lines(&self) -> Vec<String> {
        self.daemon
            .stderr_lines()
            .into_iter()
            .filter(|l| l.contains(KERNEL))
            .collect()
    }
}

/// Runs wait_sites (two threads) under `profilerd --pid` with every
/// profile, from its first wait to its exit.
fn profile(ask: Ask) -> Run {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::WaitSites.build(tmp.path(), "wait_sites");
    let out = tmp.path().join("out");
    let mut workload = Running::start(&exe, &["--wait-stdin", "--rounds", "100", "--threads", "2"]);
    workload.wait_line(Duration::from_secs(10), |l| l.starts_with("ready "));
    let pid = workload.pid();
    // The daemon's helper clears PROFILERD_LOG from the daemon's
    // environment, so it is set by `env` on the way.
    let mut cmd = Command::new("env");
    if ask == Ask::LogLevel {
        cmd.arg("PROFILERD_LOG=debug");
    }
    cmd.arg(profilerd_bin()).args([
        "--profiles",
        "cpu,heap,block,mutex,offcpu",
        "--block-rate",
        "500us",
        "--interval",
        "2s",
        "--output-dir",
        out.to_str().expect("temporary paths are UTF-8"),
        "--pid",
        &pid.to_string(),
    ]);
    if ask == Ask::ConfigKey {
        let config = tmp.path().join("profilerd.toml");
        std::fs::write(&config, "[debug]\nkernel_log = true\n").expect("writing the config file");
        cmd.arg("--config").arg(&config);
    }
    let mut daemon = Daemon::start_command(cmd);
    daemon.wait_ready();
    workload.release();
    workload.finish(WORKLOAD_TIMEOUT);
    workload.kill();
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);
    Run { pid, daemon }
}

/// The kernel lines that say `what`, of the workload's threads.
fn saying<'a>(lines: &'a [String], pid: u32, what: &str) -> Vec<&'a String> {
    let thread = format!("tgid {pid} tid ");
    lines
        .iter()
        .filter(|l| l.contains(what) && l.contains(&thread))
        .collect()
}

fn assert_says(run: &Run, lines: &[String], what: &str) {
    let found = saying(lines, run.pid, what);
    assert!(
        !found.is_empty(),
        "no kernel line saying {what:?} for process {}; kernel lines:\n{}\n{}",
        run.pid,
        lines.join("\n"),
        run.daemon.describe()
    );
    eprintln!(
        "figure: {} kernel lines say {what:?}, e.g. {}",
        found.len(),
        found[0]
    );
}

#[test]
fn the_kernel_says_why_with_debug_logs() {
    let run = profile(Ask::LogLevel);
    let lines = run.kernel_lines();
    for what in [
        "brief record sent:",
        "walk hint did not match at sp",
        "stopped at a fault after",
    ] {
        assert_says(&run, &lines, what);
    }
    // Each line names the thread and its values: a brief record the
    // frames and the walk, a mismatch the word that differed.
    let brief = saying(&lines, run.pid, "brief record sent:")[0];
    assert!(
        brief.contains(" frames of walk ") && brief.contains(" at sp "),
        "{brief}"
    );
    let mismatch = saying(&lines, run.pid, "walk hint did not match at sp")[0];
    assert!(
        mismatch.contains("word at +") && mismatch.contains("the hint's"),
        "{mismatch}"
    );
    assert!(
        lines.iter().all(|l| l.contains(" DEBUG ")),
        "kernel lines are debug lines:\n{}",
        lines.join("\n")
    );
    // Every kept wait is a candidate line: most are over the rate limit.
    let dropped = run.daemon.summary_field("kernel_logs_dropped");
    let brief_records = run.daemon.summary_field("brief_records");
    eprintln!(
        "figure: {} kernel lines, {dropped} over the rate limit, {brief_records} brief records",
        lines.len()
    );
    assert!(dropped > 0, "{}", run.daemon.describe());
}

#[test]
fn the_config_key_shows_kernel_lines_alone() {
    let run = profile(Ask::ConfigKey);
    let lines = run.kernel_lines();
    assert_says(&run, &lines, "brief record sent:");
    // The log stays at info otherwise.
    let other_debug: Vec<String> = run
        .daemon
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains(" DEBUG ") && !l.contains(KERNEL))
        .collect();
    assert!(
        other_debug.is_empty(),
        "debug lines besides the kernel's:\n{}",
        other_debug.join("\n")
    );
}

#[test]
fn nothing_is_said_by_default() {
    let run = profile(Ask::Not);
    let lines = run.kernel_lines();
    assert!(
        lines.is_empty(),
        "kernel lines without asking:\n{}",
        lines.join("\n")
    );
    assert_eq!(run.daemon.summary_field("kernel_logs_dropped"), 0);
    // The same waits, with the same stack optimizations at work.
    assert!(
        run.daemon.summary_field("brief_records") > 0,
        "{}",
        run.daemon.describe()
    );
}
