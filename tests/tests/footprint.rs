//! What profilerd holds for the profile types that are on, and no more:
//! the ring buffer of a profile type that is off is one page, so that a
//! cpu-only daemon does not map the heap and wait rings it never reads,
//! and a ring's pages are resident once.
//!
//! The rings are told apart by size: `[limits]` gives each a size no
//! other map of the daemon has, and the daemon's descriptors
//! (/proc/PID/fdinfo) list every map it holds with its type and size.

use std::time::{Duration, Instant};

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

/// Resident bytes of process `pid`'s BPF map mappings (the rings'
/// consumer, producer and data pages; `anon_inode:bpf-map` or
/// `bpf-ringbuf` in /proc/PID/smaps).
fn ring_resident_bytes(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("reading smaps");
    let mut total = 0;
    let mut in_ring = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            in_ring = line.contains("bpf-map") || line.contains("bpf-ringbuf");
        } else if in_ring && let Some(rest) = line.strip_prefix("Rss:") {
            let kib: u64 = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .expect("an Rss line in kB");
            total += kib * 1024;
        }
    }
    total
}

/// What a ready daemon holds.
struct Held {
    ring_sizes: Vec<u64>,
    threads: Vec<String>,
    ring_resident: u64,
}

/// Starts the daemon with `profiles` and the distinctive ring sizes, and
/// returns the ring sizes it holds once ready.
fn rings_with(profiles: &str) -> Vec<u64> {
    held_with(profiles, "").ring_sizes
}

/// What the daemon holds once ready, with `profiles`, the distinctive
/// ring sizes and config text `more` after them.
fn held_with(profiles: &str, more: &str) -> Held {
    require_root();
    let tmp = temp_dir();
    let config = tmp.path().join("profilerd.toml");
    std::fs::write(
        &config,
        format!(
            "[limits]\nstack_samples_bytes = {STACK_SAMPLES}\nheap_events_bytes = {HEAP_EVENTS}\nwait_events_bytes = {WAIT_EVENTS}\n{more}"
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
    let held = Held {
        ring_sizes: ring_sizes(daemon.pid()),
        threads: thread_names(daemon.pid()),
        ring_resident: ring_resident_bytes(daemon.pid()),
    };
    daemon.wait_success(EXIT_BOUND);
    held
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

/// A ring's data pages are resident once in the daemon, not twice (the
/// kernel's layout repeats them so that a consumer may map both copies;
/// `[debug] rings_mapped_once = false` does, to compare): with all five
/// types on, the rings' mappings hold at most their sizes plus the
/// position pages, and about twice as much with the switch off.
#[test]
fn ring_pages_are_resident_once() {
    let all = "cpu,heap,block,mutex,offcpu";
    let once = held_with(all, "");
    let twice = held_with(all, "\n[debug]\nrings_mapped_once = false\n");
    let data: u64 = once.ring_sizes.iter().sum();
    let pages = 2 * 4096 * once.ring_sizes.len() as u64;
    eprintln!(
        "figure: rings of {data} bytes ({:?}): resident {} bytes mapped once, {} mapped twice",
        once.ring_sizes, once.ring_resident, twice.ring_resident
    );
    let sorted = |held: &Held| {
        let mut sizes = held.ring_sizes.clone();
        sizes.sort_unstable();
        sizes
    };
    assert_eq!(sorted(&once), sorted(&twice));
    assert!(
        once.ring_resident <= data + pages,
        "mapped once, the rings' mappings hold {} bytes; their data is {data} bytes (+{pages} of position pages)",
        once.ring_resident
    );
    // Not every ring is mapped (the kernel log's is read only when on),
    // so the comparison is between the two runs.
    assert!(
        twice.ring_resident as f64 >= 1.8 * once.ring_resident as f64,
        "mapped twice, the rings' mappings hold {} bytes, mapped once {}: twice should be about double",
        twice.ring_resident,
        once.ring_resident
    );
}

/// Threads a ready daemon may run: the event loop and a few helpers. The
/// pool that closes uprobe links starts only when a link is let go.
const MAX_THREADS: usize = 8;

#[test]
fn a_ready_daemon_runs_few_threads() {
    for profiles in ["cpu", "cpu,heap,block,mutex,offcpu"] {
        let threads = held_with(profiles, "").threads;
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
        // Maps allocated on use (HEAP_LIVE, OFFCPU_PARKED, the stack maps)
        // are charged as they fill, and the gauge is the daemon's reading
        // at its last tick (up to a second before the scrape): the kernel's
        // figure is read every 20 ms over the 1.2 s before the scrape and
        // once after it, and the gauge must lie within what was seen (a
        // single reading before the scrape missed it by one 80-byte
        // element once in CI).
        let mut seen = Vec::new();
        let until = Instant::now() + Duration::from_millis(1200);
        while Instant::now() < until {
            seen.push(bpf_memlock(daemon.pid()));
            std::thread::sleep(Duration::from_millis(20));
        }
        let (status, _, body) = get(addr, "/metrics");
        assert_eq!(status, 200, "{body}");
        let metrics = parse_exposition(&body);
        let reported = metrics.value("profilerd_bpf_memory_bytes", &[]) as u64;
        seen.push(bpf_memlock(daemon.pid()));
        let (before, after) = (seen[0], seen[seen.len() - 1]);
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
        let outside = *seen.iter().min().expect("read")..=*seen.iter().max().expect("read");
        daemon.wait_success(EXIT_BOUND);
        eprintln!(
            "figure: --profiles {profiles}: BPF memory {reported} bytes (fdinfo: {before}, then {after})"
        );
        assert!(
            outside.contains(&reported),
            "--profiles {profiles}: /metrics says {reported} bytes of BPF memory, the kernel {outside:?} over the 1.2 s before the scrape"
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
