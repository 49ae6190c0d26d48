//! What profilerd holds for the profile types that are on, and no more:
//! the ring buffer of a profile type that is off is one page, so that a
//! cpu-only daemon does not map the heap and wait rings (16 MiB each,
//! mapped twice over) it never reads.
//!
//! The rings are told apart by size: `[limits]` gives each a size no
//! other map of the daemon has, and the daemon's descriptors
//! (/proc/PID/fdinfo) list every map it holds with its type and size.

use std::time::Duration;

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::http::{get, parse_exposition};
use profiler_tests::temp_dir;

/// `BPF_MAP_TYPE_RINGBUF`.
const RINGBUF: u32 = 27;
const STACK_SAMPLES: u64 = 2 << 20;
const HEAP_EVENTS: u64 = 4 << 20;
const WAIT_EVENTS: u64 = 1 << 20;
const EXIT_BOUND: Duration = Duration::from_secs(20);

/// The BPF map fields of each of process `pid`'s descriptors that is a
/// map (/proc/PID/fdinfo), one entry per descriptor.
struct MapFd {
    map_id: u64,
    map_type: Option<u64>,
    max_entries: Option<u64>,
    memlock: Option<u64>,
}

fn map_fds(pid: u32) -> Vec<MapFd> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut maps = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("reading the daemon's fdinfo") {
        let Ok(text) = std::fs::read_to_string(entry.expect("an fdinfo entry").path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let Some(map_id) = field("map_id:") {
            maps.push(MapFd {
                map_id,
                map_type: field("map_type:"),
                max_entries: field("max_entries:"),
                memlock: field("memlock:"),
            });
        }
    }
    maps
}

/// The sizes of the ring buffers process `pid` holds.
fn ring_sizes(pid: u32) -> Vec<u64> {
    map_fds(pid)
        .into_iter()
        .filter(|m| m.map_type == Some(u64::from(RINGBUF)))
        .filter_map(|m| m.max_entries)
        .collect()
}

/// The names of process `pid`'s threads.
fn thread_names(pid: u32) -> Vec<String> {
    let dir = format!("/proc/{pid}/task");
    std::fs::read_dir(&dir)
        .expect("reading the daemon's tasks")
        .filter_map(|entry| {
            let path = entry.ok()?.path().join("comm");
            Some(std::fs::read_to_string(path).ok()?.trim().to_string())
        })
        .collect()
}

/// Starts the daemon with `profiles` and the distinctive ring sizes, and
/// returns the ring sizes it holds once ready.
fn rings_with(profiles: &str) -> Vec<u64> {
    held_with(profiles).0
}

/// As [`rings_with`], with the names of the daemon's threads once ready.
fn held_with(profiles: &str) -> (Vec<u64>, Vec<String>) {
    require_root();
    let tmp = temp_dir();
    let config = tmp.path().join("profilerd.toml");
    std::fs::write(
        &config,
        format!(
            "[limits]\nstack_samples_bytes = {STACK_SAMPLES}\nheap_events_bytes = {HEAP_EVENTS}\nwait_events_bytes = {WAIT_EVENTS}\n"
        ),
    )
    .expect("writing the config");
    let out = tmp.path().join("out");
    let mut daemon = Daemon::start(&[
        "--profiles",
        profiles,
        "--duration",
        "2s",
        "--config",
        config.to_str().expect("UTF-8 path"),
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
    ]);
    daemon.wait_ready();
    let sizes = ring_sizes(daemon.pid());
    let threads = thread_names(daemon.pid());
    daemon.wait_success(EXIT_BOUND);
    (sizes, threads)
}

#[test]
fn rings_exist_only_for_the_profile_types_that_are_on() {
    for (profiles, on) in [
        ("cpu", vec![STACK_SAMPLES]),
        ("heap", vec![HEAP_EVENTS]),
        ("block,mutex,offcpu", vec![WAIT_EVENTS]),
        (
            "cpu,heap,block",
            vec![STACK_SAMPLES, HEAP_EVENTS, WAIT_EVENTS],
        ),
    ] {
        let sizes = rings_with(profiles);
        for ring in [STACK_SAMPLES, HEAP_EVENTS, WAIT_EVENTS] {
            assert_eq!(
                sizes.contains(&ring),
                on.contains(&ring),
                "--profiles {profiles}: a ring of {ring} bytes {} (rings held: {sizes:?})",
                if on.contains(&ring) {
                    "is missing"
                } else {
                    "is held though its profile is off"
                }
            );
        }
        let page = 4096;
        assert_eq!(
            sizes.iter().filter(|&&s| s == page).count(),
            3 - on.len(),
            "--profiles {profiles}: every ring of a type that is off is one page (rings held: {sizes:?})"
        );
    }
}

/// Threads a ready daemon may run: the event loop and a few helpers. The
/// pool that closes uprobe links starts only when a link is let go.
const MAX_THREADS: usize = 8;

#[test]
fn a_ready_daemon_runs_few_threads() {
    for profiles in ["cpu", "cpu,heap,block,mutex,offcpu"] {
        let (_, threads) = held_with(profiles);
        eprintln!(
            "figure: --profiles {profiles}: {} threads: {threads:?}",
            threads.len()
        );
        assert!(
            threads.len() <= MAX_THREADS,
            "--profiles {profiles}: {} threads once ready, at most {MAX_THREADS} allowed: {threads:?}",
            threads.len()
        );
        assert!(
            !threads.iter().any(|t| t.starts_with("link-close")),
            "--profiles {profiles}: the link-closing pool runs before any link is let go: {threads:?}"
        );
    }
}

/// The memory the kernel charges for process `pid`'s BPF maps: each map's
/// `memlock` once (by `map_id`), from /proc/PID/fdinfo.
fn bpf_memlock(pid: u32) -> u64 {
    let mut seen = std::collections::HashSet::new();
    map_fds(pid)
        .into_iter()
        .filter(|m| seen.insert(m.map_id))
        .filter_map(|m| m.memlock)
        .sum()
}

/// `/metrics` says what the daemon's BPF maps and rings cost, as the
/// kernel counts it: the gauge equals the sum read from outside, and it
/// follows the profiles that are on.
#[test]
fn metrics_count_the_bpf_maps_memory() {
    require_root();
    let mut figures = Vec::new();
    for profiles in ["cpu", "cpu,heap,block,mutex,offcpu"] {
        let tmp = temp_dir();
        let out = tmp.path().join("out");
        let mut daemon = Daemon::start(&[
            "--profiles",
            profiles,
            "--duration",
            "3s",
            "--metrics-addr",
            "127.0.0.1:0",
            "--output-dir",
            out.to_str().expect("UTF-8 path"),
        ]);
        daemon.wait_ready();
        let addr = daemon.metrics_addr();
        // Maps allocated on use (HEAP_LIVE, OFFCPU_PARKED) are charged as
        // they fill, so the kernel's figure is read on both sides of the
        // scrape: the gauge lies between the two (equal when nothing moved).
        let before = bpf_memlock(daemon.pid());
        let (status, _, body) = get(addr, "/metrics");
        assert_eq!(status, 200, "{body}");
        let metrics = parse_exposition(&body);
        let reported = metrics.value("profilerd_bpf_memory_bytes", &[]) as u64;
        let after = bpf_memlock(daemon.pid());
        // The same memory by map: the rings and maps named, adding up to
        // the total of the same scrape.
        let per_map: u64 = ["STACK_SAMPLES", "HEAP_EVENTS", "WAIT_EVENTS", "COUNTS_0"]
            .iter()
            .map(|map| {
                let bytes = metrics.value("profilerd_bpf_map_bytes", &[("map", map)]);
                assert!(
                    bytes > 0.0,
                    "--profiles {profiles}: no bytes for map {map}:\n{body}"
                );
                bytes as u64
            })
            .sum();
        let all_maps: f64 = body
            .lines()
            .filter(|l| l.starts_with("profilerd_bpf_map_bytes{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(
            all_maps as u64, reported,
            "--profiles {profiles}: the maps' bytes add up to {all_maps}, the total says {reported}"
        );
        assert!(per_map <= reported);
        let outside = before.min(after)..=before.max(after);
        daemon.wait_success(EXIT_BOUND);
        eprintln!(
            "figure: --profiles {profiles}: BPF memory {reported} bytes (fdinfo: {before}, then {after})"
        );
        assert!(
            outside.contains(&reported),
            "--profiles {profiles}: /metrics says {reported} bytes of BPF memory, the kernel {before}, then {after}"
        );
        assert!(
            reported > 0,
            "--profiles {profiles}: no BPF memory reported"
        );
        figures.push(reported);
    }
    assert!(
        figures[1] > figures[0],
        "all five profiles hold more BPF memory than cpu alone: {figures:?}"
    );
}
