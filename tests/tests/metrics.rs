//! `--metrics-addr`: the daemon's Prometheus endpoint during a real run.
//! Scrapes over HTTP, parses the text format, and checks the counters
//! against the profile files the daemon wrote (the truth): files, bytes and
//! samples per type, and that counters move between two scrapes. Then the
//! start-up errors: a port in use, a bad address.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::http::{Exposition, get, parse_exposition};
use profiler_tests::profiles::read_profiles;
use profiler_tests::workloads::Workload;
use profiler_tests::{pause, temp_dir};

/// Every metric the daemon exports, with its type.
const EXPECTED: [(&str, &str); 23] = [
    ("profilerd_samples_total", "counter"),
    ("profilerd_files_written_total", "counter"),
    ("profilerd_written_bytes_total", "counter"),
    ("profilerd_write_errors_total", "counter"),
    ("profilerd_bpf_events_total", "counter"),
    ("profilerd_bpf_dropped_total", "counter"),
    ("profilerd_symbolization_failures_total", "counter"),
    ("profilerd_unwinds_truncated_total", "counter"),
    ("profilerd_attach_errors_total", "counter"),
    ("profilerd_processes", "gauge"),
    ("profilerd_process_snapshots_total", "counter"),
    ("profilerd_process_snapshot_failures_total", "counter"),
    ("profilerd_push_sent_total", "counter"),
    ("profilerd_push_failed_total", "counter"),
    ("profilerd_push_dropped_total", "counter"),
    ("profilerd_push_queue_length", "gauge"),
    ("profilerd_push_samples_too_large_total", "counter"),
    ("profilerd_resident_memory_bytes", "gauge"),
    ("profilerd_bpf_memory_bytes", "gauge"),
    ("profilerd_bpf_map_bytes", "gauge"),
    ("profilerd_cache_bytes", "gauge"),
    ("profilerd_cache_evictions_total", "counter"),
    ("profilerd_cache_budget_bytes", "gauge"),
];

fn scrape(addr: SocketAddr) -> Exposition {
    let (status, headers, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("text/plain; version=0.0.4"),
        "{headers:?}"
    );
    parse_exposition(&body)
}

/// A CPU burner profiled with cpu and heap every 2 s, the push pointed at a
/// closed port: scrape twice, check the names, types and help, that work
/// counters grew, and that files, bytes and samples per type equal what is
/// on disk.
#[test]
fn metrics_match_the_written_profiles() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "metrics_burner");
    let out = tmp.path().join("out");
    let closed = profiler_tests::http::closed_port();
    let push_url = format!("http://127.0.0.1:{closed}");
    let mut daemon = Daemon::start(&[
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "2s",
        "--metrics-addr",
        "127.0.0.1:0",
        "--push-url",
        &push_url,
        "--",
        exe.to_str().unwrap(),
        "9",
    ]);
    daemon.wait_ready();
    let addr = daemon.metrics_addr();

    pause(Duration::from_secs(3));
    let first = scrape(addr);
    pause(Duration::from_secs(3));
    let second = scrape(addr);
    let diag = || daemon.describe();

    for (name, kind) in EXPECTED {
        assert_eq!(
            second.types.get(name).map(String::as_str),
            Some(kind),
            "TYPE of {name}{}",
            diag()
        );
        assert!(
            second.help.get(name).is_some_and(|h| !h.is_empty()),
            "HELP of {name}"
        );
        assert!(
            second.samples.iter().any(|s| s.name == name),
            "no sample of {name}"
        );
    }
    for s in &second.samples {
        assert!(s.name.starts_with("profilerd_"), "{s:?}");
        assert!(s.value >= 0.0, "{s:?}");
    }
    // Counters grow between scrapes on a busy run.
    let grew = |name: &str, labels: &[(&str, &str)]| {
        let (a, b) = (first.value(name, labels), second.value(name, labels));
        assert!(b > a, "{name}{labels:?}: {a} then {b}{}", diag());
        (a, b)
    };
    let samples = grew("profilerd_bpf_events_total", &[("event", "cpu_samples")]);
    let files = grew("profilerd_files_written_total", &[("type", "cpu")]);
    grew("profilerd_written_bytes_total", &[("type", "cpu")]);
    grew("profilerd_push_failed_total", &[]);
    // Nothing reaches the closed port; nothing is dropped yet either
    // (retries are under way) or only what gave up.
    assert_eq!(second.value("profilerd_push_sent_total", &[]), 0.0);
    let rss = second.value("profilerd_resident_memory_bytes", &[]);
    assert!(rss > 1e6 && rss < 4e9, "resident memory {rss}");
    assert!(second.value("profilerd_processes", &[]) >= 1.0);
    // The caches hold the burner's symbols and tables, within the default
    // budget.
    let budget = second.value("profilerd_cache_budget_bytes", &[]);
    assert_eq!(budget, (64u64 << 20) as f64);
    let held: f64 = second
        .samples
        .iter()
        .filter(|s| s.name == "profilerd_cache_bytes")
        .map(|s| s.value)
        .sum();
    assert!(held > 0.0 && held <= budget, "cache bytes {held}");
    assert_eq!(
        second.value("profilerd_write_errors_total", &[("type", "cpu")]),
        0.0
    );

    // Counters against the files on disk: a window may close between the
    // scrape and the listing, so take a scrape that agrees on the count.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = scrape(addr);
        let on_disk = read_profiles(&out, "cpu");
        let written = m.value("profilerd_files_written_total", &[("type", "cpu")]);
        if written as usize == on_disk.len() {
            let rows: usize = on_disk.iter().map(|f| f.profile.sample.len()).sum();
            let bytes: u64 = on_disk
                .iter()
                .map(|f| std::fs::metadata(&f.path).unwrap().len())
                .sum();
            assert_eq!(
                m.value("profilerd_samples_total", &[("type", "cpu")]),
                rows as f64,
                "samples in {} files{}",
                on_disk.len(),
                diag()
            );
            assert_eq!(
                m.value("profilerd_written_bytes_total", &[("type", "cpu")]),
                bytes as f64
            );
            assert_eq!(
                m.value("profilerd_files_written_total", &[("type", "heap")]),
                0.0
            );
            let counted: i64 = on_disk
                .iter()
                .flat_map(|f| &f.profile.sample)
                .map(|s| s.value[0])
                .sum();
            let kernel = m.value("profilerd_bpf_events_total", &[("event", "cpu_samples")]);
            assert!(
                counted as f64 <= kernel,
                "the files hold {counted} cpu samples, the kernel counted {kernel}"
            );
            println!(
                "{} files, {rows} sample rows, {bytes} bytes, {counted} of {kernel} kernel samples; \
                 cpu samples {} -> {}, files {} -> {}, rss {rss}",
                on_disk.len(),
                samples.0,
                samples.1,
                files.0,
                files.1
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the metrics never agreed with the files on disk{}",
            diag()
        );
        pause(Duration::from_millis(100));
    }
    let (status, _, _) = get(addr, "/other");
    assert_eq!(status, 404);
    daemon.wait_success(Duration::from_secs(30));
}

/// A port already in use stops the start with one line and a non-zero
/// status, before any profile is written.
#[test]
fn metrics_port_in_use_fails_at_start() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut daemon = Daemon::start(&[
        "--output-dir",
        out.to_str().unwrap(),
        "--metrics-addr",
        &addr,
        "--duration",
        "5s",
    ]);
    let status = daemon.wait_exit(Duration::from_secs(20));
    let lines = daemon.stderr_lines();
    assert!(!status.success(), "{}", daemon.describe());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("profilerd: ")
            && lines[0].contains(&addr)
            && lines[0].to_lowercase().contains("in use"),
        "{lines:?}"
    );
    assert!(read_profiles(&out, "cpu").is_empty());
}

/// An address that does not parse is a config error: exit 2, one line.
#[test]
fn bad_metrics_address_is_rejected() {
    require_root();
    for addr in ["localhost", "127.0.0.1", "127.0.0.1:70000", ":9464"] {
        let mut daemon = Daemon::start(&["--metrics-addr", addr, "--duration", "1s"]);
        let status = daemon.wait_exit(Duration::from_secs(10));
        let lines = daemon.stderr_lines();
        assert_eq!(status.code(), Some(2), "{addr}: {}", daemon.describe());
        assert_eq!(lines.len(), 1, "{addr}: {lines:?}");
        assert!(lines[0].contains("--metrics-addr"), "{lines:?}");
    }
}
