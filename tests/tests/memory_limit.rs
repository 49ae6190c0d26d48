//! The shipped memory limit holds on a busy node: profilerd with all five
//! profile types, in a cgroup whose `memory.max` is the limit `deploy/`
//! ships (the unit's `MemoryMax=`, the DaemonSet's memory limit), through
//! the load of `tests/workloads/busy_node.sh` (large programs, two at a
//! time, over and over): never OOM-killed, every profile type still
//! written, its cache budget held and its losses counted. The cgroup
//! charges what the daemon's memory really is: its heap, its file pages,
//! and its BPF maps and rings (charged to the creator's cgroup since 5.11).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use profiler_tests::cgroups::{MemoryCgroup, MemoryRecord, TestCgroups, bytes_of, in_cgroups_args};
use profiler_tests::daemon::{Daemon, profilerd_bin, require_root, workspace_root};
use profiler_tests::process::Guarded;
use profiler_tests::profiles::read_profiles;
use profiler_tests::{pause, temp_dir};

const ALL_PROFILES: &str = "cpu,heap,block,mutex,offcpu";
/// How long the daemon runs through the load: three 10 s windows.
const RUN: Duration = Duration::from_secs(30);

/// The memory limit `deploy/` ships, in bytes: the unit's `MemoryMax=`,
/// which must equal the DaemonSet's `limits: memory:`.
fn shipped_limit(root: &Path) -> u64 {
    let unit = std::fs::read_to_string(root.join("deploy/profilerd.service"))
        .expect("reading deploy/profilerd.service");
    let unit_max = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("MemoryMax="))
        .expect("deploy/profilerd.service sets MemoryMax=");
    let manifest = std::fs::read_to_string(root.join("deploy/daemonset.yaml"))
        .expect("reading deploy/daemonset.yaml");
    // The memory line after `limits:` (the one after `requests:` is the
    // request).
    let limits_at = manifest
        .find("limits:")
        .expect("deploy/daemonset.yaml sets resource limits");
    let pod_max = manifest[limits_at..]
        .lines()
        .find_map(|l| l.trim().strip_prefix("memory:"))
        .expect("deploy/daemonset.yaml limits memory");
    let (unit_bytes, pod_bytes) = (bytes_of(unit_max), bytes_of(pod_max));
    assert_eq!(
        unit_bytes, pod_bytes,
        "the unit's MemoryMax={unit_max} and the DaemonSet's limit {pod_max} differ"
    );
    unit_bytes
}

#[test]
fn all_profiles_stay_under_the_shipped_limit_on_a_busy_node() {
    require_root();
    let root = workspace_root();
    let limit = shipped_limit(&root);
    let mut cgroups = TestCgroups::new();
    let (cgroup, procs) = MemoryCgroup::create(&mut cgroups, limit);

    let mut load_cmd = Command::new("sh");
    load_cmd
        .arg(root.join("tests/workloads/busy_node.sh"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let _load = Guarded::spawn(load_cmd, "busy_node.sh");
    // Every program of the load has run once before the daemon starts.
    pause(Duration::from_secs(10));

    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let mut cmd = Command::new("/bin/sh");
    cmd.args(in_cgroups_args(
        &[procs.as_path()],
        &profilerd_bin(),
        &[
            "--profiles",
            ALL_PROFILES,
            "--interval",
            "10s",
            "--output-dir",
            out.to_str().expect("a UTF-8 temporary path"),
        ],
    ));
    let mut daemon = Daemon::start_command(cmd);
    daemon.wait_ready();
    pause(RUN);
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(30));

    let MemoryRecord {
        oom_kills,
        limit_hits,
        peak,
        anon,
        file,
    } = cgroup.record();
    println!(
        "memory limit {} MiB: peak {} (the cgroup's), at exit anon {:.1} MiB, file {:.1} MiB; \
         the limit reached {limit_hits} times, OOM kills {oom_kills}",
        limit >> 20,
        peak.map_or("unknown".to_string(), |p| format!(
            "{:.1} MiB",
            p as f64 / 1048576.0
        )),
        anon as f64 / 1048576.0,
        file as f64 / 1048576.0,
    );
    let d = || daemon.describe();
    assert_eq!(
        oom_kills,
        0,
        "profilerd was OOM-killed under the shipped limit\n{}",
        d()
    );
    assert!(status.success(), "profilerd exited with {status}\n{}", d());
    for kind in ALL_PROFILES.split(',') {
        let files = read_profiles(&out, kind);
        assert!(
            files.len() >= 3,
            "{kind}: {} files in a {} s run with 10 s windows\n{}",
            files.len(),
            RUN.as_secs(),
            d()
        );
    }
    // The caches held their budget (settled peak) and said what they
    // dropped; every loss counter is in the summary.
    let budget = daemon.summary_field("cache_budget_bytes");
    let cache_peak = daemon.summary_field("cache_peak_bytes");
    let evictions = daemon.summary_field("cache_evictions");
    println!("caches: peak {cache_peak} bytes of a {budget}-byte budget, {evictions} evictions");
    assert!(
        cache_peak <= budget,
        "the caches' settled peak {cache_peak} passed their budget {budget}\n{}",
        d()
    );
    for key in [
        "stack_copies_dropped",
        "wait_events_lost",
        "process_snapshot_failures",
        "frames_unsymbolized",
        "bpf_map_bytes",
        "peak_resident_bytes",
    ] {
        daemon.summary_field(key);
    }
    let resident = daemon.summary_field("peak_resident_bytes");
    println!(
        "daemon: peak resident {:.1} MiB, BPF maps {:.1} MiB",
        resident as f64 / 1048576.0,
        daemon.summary_field("bpf_map_bytes") as f64 / 1048576.0
    );
    assert!(
        resident < limit,
        "peak resident {resident} bytes reached the limit {limit}\n{}",
        d()
    );
}

#[test]
fn memory_sizes_read_as_deploy_writes_them() {
    assert_eq!(bytes_of("256M"), 256 << 20);
    assert_eq!(bytes_of("256Mi"), 256 << 20);
    assert_eq!(bytes_of("\"1Gi\""), 1 << 30);
    assert_eq!(bytes_of("4096"), 4096);
}
