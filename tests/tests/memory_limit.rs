//! The shipped memory limit holds on a busy node: profilerd with all five
//! profile types, in a cgroup whose `memory.max` is the limit `deploy/`
//! ships (the unit's `MemoryMax=`, the DaemonSet's memory limit), through
//! the load of `tests/workloads/busy_node.sh` (large programs, two at a
//! time, over and over): never OOM-killed, every profile type still
//! written, its cache budget held and its losses counted. The cgroup
//! charges what the daemon's memory really is: its heap, its file pages,
//! and its BPF maps and rings (charged to the creator's cgroup since 5.11).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use profiler_tests::cgroups::{
    TestCgroups, in_cgroups_args, random_uuid, v1_memory_mount, v2_mount,
};
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

/// `256M` (systemd) or `256Mi` (Kubernetes) in bytes; both are binary.
fn bytes_of(text: &str) -> u64 {
    let text = text.trim().trim_matches('"');
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let number: u64 = digits
        .parse()
        .unwrap_or_else(|_| panic!("{text:?} is not a memory size"));
    let shift = match &text[digits.len()..] {
        "" => 0,
        "K" | "Ki" => 10,
        "M" | "Mi" => 20,
        "G" | "Gi" => 30,
        unit => panic!("{text:?}: unknown unit {unit:?}"),
    };
    number << shift
}

/// A memory cgroup made for the test: cgroup v2's memory controller where
/// the host enables it, else v1's (hybrid hosts).
enum MemoryCgroup {
    V2(PathBuf),
    V1(PathBuf),
}

/// What the cgroup recorded of a run.
struct MemoryRecord {
    oom_kills: u64,
    /// Times usage reached the limit (and reclaim ran).
    limit_hits: u64,
    peak: Option<u64>,
    anon: u64,
    file: u64,
}

impl MemoryCgroup {
    /// Creates the cgroup with `limit` bytes and no swap; returns it and
    /// its `cgroup.procs`.
    fn create(cgroups: &mut TestCgroups, limit: u64) -> (MemoryCgroup, PathBuf) {
        let name = format!("profilerd-e2e-memory-{}", random_uuid());
        let v2 = v2_mount();
        let v2_memory = std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c == "memory");
        let (cgroup, procs) = if v2_memory {
            let procs = cgroups.create(&v2, &name);
            let dir: PathBuf = procs
                .parent()
                .expect("cgroup.procs is in its cgroup")
                .into();
            std::fs::write(dir.join("memory.max"), limit.to_string()).expect("setting memory.max");
            // Swap would hide an overrun; not every kernel has the file.
            let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            (MemoryCgroup::V2(dir), procs)
        } else {
            let mount = v1_memory_mount().unwrap_or_else(|| {
                panic!(
                    "no memory controller: not enabled under {} and no v1 hierarchy",
                    v2.display()
                )
            });
            let procs = cgroups.create(&mount, &name);
            let dir: PathBuf = procs
                .parent()
                .expect("cgroup.procs is in its cgroup")
                .into();
            std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string())
                .expect("setting memory.limit_in_bytes");
            // Memory plus swap at the same limit: no swap (absent without
            // swap accounting).
            let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
            (MemoryCgroup::V1(dir), procs)
        };
        (cgroup, procs)
    }

    fn record(&self) -> MemoryRecord {
        match self {
            MemoryCgroup::V2(dir) => MemoryRecord {
                oom_kills: keyed(dir, "memory.events", "oom_kill "),
                limit_hits: keyed(dir, "memory.events", "max "),
                peak: read_number(&dir.join("memory.peak")),
                anon: keyed(dir, "memory.stat", "anon "),
                file: keyed(dir, "memory.stat", "file "),
            },
            MemoryCgroup::V1(dir) => MemoryRecord {
                oom_kills: keyed(dir, "memory.oom_control", "oom_kill "),
                limit_hits: read_number(&dir.join("memory.failcnt")).unwrap_or(0),
                peak: read_number(&dir.join("memory.max_usage_in_bytes")),
                anon: keyed(dir, "memory.stat", "rss "),
                file: keyed(dir, "memory.stat", "cache "),
            },
        }
    }
}

/// A number from a cgroup's flat-keyed file (`memory.events`), 0 when
/// absent.
fn keyed(dir: &Path, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or(0)
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
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
