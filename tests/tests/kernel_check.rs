//! What profilerd says and does about the kernel it runs on: `--check`
//! tells each profile type's state, a required type the kernel cannot run
//! stops the start with one line naming the missing feature and the first
//! Linux that has it, and a type asked for at best effort (`heap?`) is
//! skipped with a warning, in `/metrics` and in the summary, while the
//! others run.
//!
//! The development kernel has every feature; an older kernel's lack of
//! one is shown with `PROFILERD_PRETEND_MISSING`, which turns probed
//! features off (the same decisions then run as on that kernel; the
//! kernel matrix runs them on real older kernels).

use std::process::Command;
use std::time::Duration;

use profiler_tests::daemon::{Daemon, profilerd_bin, require_root};
use profiler_tests::http::{get, parse_exposition};
use profiler_tests::process::run_with_timeout;
use profiler_tests::profiles::{dir_entries, read_profiles};
use profiler_tests::temp_dir;

const PRETEND: &str = "PROFILERD_PRETEND_MISSING";
/// `--check` loads each type's programs once; this only bounds a hang.
const CHECK_BOUND: Duration = Duration::from_secs(60);
const EXIT_BOUND: Duration = Duration::from_secs(20);
const TYPES: [&str; 5] = ["cpu", "heap", "block", "mutex", "offcpu"];

/// `profilerd --check ARGS` with features pretended missing: (exit code,
/// stdout).
fn check(args: &[&str], missing: &str) -> (i32, String) {
    require_root();
    let mut cmd = Command::new(profilerd_bin());
    cmd.arg("--check")
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("PROFILERD_LOG");
    if !missing.is_empty() {
        cmd.env(PRETEND, missing);
    }
    let out = run_with_timeout(cmd, "profilerd --check", CHECK_BOUND);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The state `--check` printed for one profile type.
fn state<'a>(report: &'a str, kind: &str) -> &'a str {
    report
        .lines()
        .find_map(|l| {
            l.strip_prefix(kind)
                .filter(|rest| rest.starts_with(' '))
                .map(str::trim)
        })
        .unwrap_or_else(|| panic!("no line for {kind} in:\n{report}"))
}

#[test]
fn check_finds_every_type_ready_here() {
    let (code, report) = check(&["--profiles", &TYPES.join(",")], "");
    assert_eq!(code, 0, "{report}");
    for kind in TYPES {
        assert_eq!(state(&report, kind), "ready", "{report}");
    }
    assert!(report.starts_with("kernel "), "{report}");
    for mode in ["fp", "dwarf", "auto"] {
        assert!(report.contains(&format!("unwind {mode}")), "{report}");
    }
}

/// The programs that take Go and Python processes' CPU samples are loaded
/// only at the first such process: `--check` loads them, so that the
/// kernel matrix verifies them on every kernel (it runs this test).
#[test]
fn check_loads_the_go_and_python_sample_programs() {
    let (code, report) = check(&["--profiles", "cpu"], "");
    assert_eq!(code, 0, "{report}");
    for kind in ["cpu", "go", "python"] {
        assert!(
            state(&report, kind).starts_with("ready"),
            "{kind}:\n{report}"
        );
    }
}

#[test]
fn check_names_what_an_older_kernel_lacks() {
    let missing = "uprobe_session,uprobe_multi,uprobe_pmu,btf";
    let (code, report) = check(&["--profiles", "cpu,block,mutex"], missing);
    assert_eq!(code, 0, "every requested type can run:\n{report}");
    assert_eq!(state(&report, "cpu"), "ready");
    assert_eq!(state(&report, "mutex"), "ready");
    let heap = state(&report, "heap");
    assert!(
        heap.starts_with("unavailable")
            && heap.contains("uprobe sessions")
            && heap.contains("Linux 6.13"),
        "{report}"
    );
    let offcpu = state(&report, "offcpu");
    assert!(
        offcpu.starts_with("unavailable") && offcpu.contains("BTF") && offcpu.contains("Linux 5.5"),
        "{report}"
    );
    let block = state(&report, "block");
    assert!(
        block.starts_with("degraded")
            && block.contains("perf-event uprobes")
            && block.contains("Linux 5.15"),
        "{report}"
    );
    let (code, report) = check(&["--profiles", "cpu,heap"], missing);
    assert_eq!(code, 1, "heap cannot run:\n{report}");
}

/// Linux 6.6 to 6.12: no uprobe sessions, but perf-event uprobes. Heap
/// runs, at a cost the line names; Go parks and condition variables are
/// probed per function, so block is ready.
#[test]
fn check_without_uprobe_links_runs_heap_and_block_on_perf_event_uprobes() {
    let (code, report) = check(
        &["--profiles", "cpu,heap,block,mutex"],
        "uprobe_session,uprobe_multi",
    );
    assert_eq!(code, 0, "every requested type can run:\n{report}");
    assert_eq!(state(&report, "block"), "ready", "{report}");
    let heap = state(&report, "heap");
    assert!(
        heap.starts_with("degraded")
            && heap.contains("return probe")
            && heap.contains("Linux 6.13"),
        "{report}"
    );
}

#[test]
fn a_required_type_the_kernel_lacks_stops_the_start() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let mut cmd = Command::new(profilerd_bin());
    cmd.args(["--profiles", "cpu,heap", "--duration", "2s", "--output-dir"])
        .arg(&out)
        .env("NO_COLOR", "1")
        .env_remove("PROFILERD_LOG")
        .env(PRETEND, "uprobe_session,uprobe_pmu");
    let output = run_with_timeout(cmd, "profilerd", EXIT_BOUND);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line:\n{stderr}");
    for word in ["heap profile", "uprobe sessions", "Linux 6.13", "'heap?'"] {
        assert!(stderr.contains(word), "{word:?} missing from: {stderr}");
    }
    assert!(
        dir_entries(&out).is_empty(),
        "nothing may be written when the start is refused"
    );
}

#[test]
fn a_best_effort_type_is_skipped_and_reported() {
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let mut cmd = Command::new(profilerd_bin());
    cmd.args([
        "--profiles",
        "cpu,heap?",
        "--duration",
        "3s",
        "--interval",
        "1s",
        "--metrics-addr",
        "127.0.0.1:0",
        "--output-dir",
    ])
    .arg(&out)
    .env(PRETEND, "uprobe_session,uprobe_pmu");
    let mut daemon = Daemon::start_command(cmd);
    daemon.wait_ready();
    let lines = daemon.stderr_lines();
    let ready = lines
        .iter()
        .find(|l| l.contains("ready"))
        .cloned()
        .unwrap_or_default();
    assert!(
        ready.contains("skipped") && ready.contains("heap"),
        "the ready line must say what was skipped: {ready}\n{}",
        daemon.describe()
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("WARN") && l.contains("heap"))
            .count(),
        1,
        "one warning for the skipped type\n{}",
        daemon.describe()
    );
    let addr = daemon.metrics_addr();
    let (status, _, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    let metrics = parse_exposition(&body);
    assert_eq!(
        metrics.value("profilerd_profile_unavailable", &[("type", "heap")]),
        1.0
    );
    assert_eq!(
        metrics.value("profilerd_profile_unavailable", &[("type", "cpu")]),
        0.0
    );
    daemon.wait_success(EXIT_BOUND);
    let summary = daemon
        .stderr_lines()
        .into_iter()
        .find(|l| l.contains("session: summary "))
        .unwrap_or_default();
    assert!(
        summary.contains("profiles_unavailable=heap"),
        "summary: {summary}"
    );
    assert!(
        !read_profiles(&out, "cpu").is_empty(),
        "{}",
        daemon.describe()
    );
    assert!(
        read_profiles(&out, "heap").is_empty(),
        "no heap file for a skipped heap profile"
    );
}
