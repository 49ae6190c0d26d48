//! `--http-addr`: CPU profiles on demand at `/debug/pprof/profile`, the
//! way Go's `net/http/pprof` serves them, from a daemon already profiling
//! the whole node. `go tool pprof` fetches them by URL; they hold only the
//! processes asked for, in the split the workload measured; the scheduled
//! files are written as before; bad parameters, unknown processes, too
//! many captures at once and clients that go away get their answers. With
//! a token file, nothing is served without the token; `format=svg` draws
//! the capture as `profilerd flamegraph` draws a file.

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::flame_graph::FlameGraph;
use profiler_tests::http::{get, get_with};
use profiler_tests::pprof_tool::fetch_with_pprof;
use profiler_tests::profiles::{FlatSample, flatten, flatten_all, of_pid, read_profiles};
use profiler_tests::temp_dir;
use profiler_tests::workloads::{
    HEAP_LEAK, HEAP_SITES, HeapSiteLine, Running, SiteLine, Workload, field, parse_heap_site_lines,
    parse_report, parse_site_lines,
};

/// |profiled share of burn_a - measured share| bound.
const SHARE_TOLERANCE: f64 = 0.05;
/// The same for the flame graph of a 5 s capture at 99 Hz (about 495
/// samples): 3.5 standard deviations of a 0.75 share drawn from them.
const SVG_SHARE_TOLERANCE: f64 = 0.07;

/// |on-demand estimate / what the program measured - 1| bound, per heap
/// site (issue 20's tolerance for heap sites).
const HEAP_TOLERANCE: f64 = 0.15;
/// A daemon collecting heap and block profiles at rates the sites'
/// figures are compared at.
const HEAP_AND_BLOCK: [&str; 8] = [
    "--profiles",
    "cpu,heap,block",
    "--heap-sample-bytes",
    "16384",
    "--block-rate",
    "2500us",
    "--interval",
    "10s",
];
/// The heap captures' length.
const HEAP_CAPTURE_S: u64 = 7;
/// The same bound per block site, for its delay.
const BLOCK_TOLERANCE: f64 = 0.20;
/// block_sites' sites.
const BLOCK_SITES: [&str; 3] = ["site_wait_1ms", "site_wait_2ms", "site_wait_3ms"];

fn cpu_in(samples: &[FlatSample], f: &str) -> i64 {
    samples
        .iter()
        .filter(|s| s.frames.first().is_some_and(|fr| fr.function == f))
        .map(|s| s.cpu_ns)
        .sum()
}

/// The daemon's /debug/pprof address (it logs the bound port).
fn pprof_addr(daemon: &Daemon) -> SocketAddr {
    daemon
        .stderr_lines()
        .iter()
        .find_map(|l| l.split("serving profiles on demand at http://").nth(1))
        .and_then(|rest| rest.trim().trim_end_matches("/debug/pprof/").parse().ok())
        .unwrap_or_else(|| panic!("no /debug/pprof address\n{}", daemon.describe()))
}

/// A daemon profiling the node at 99 Hz into `out`, serving /debug/pprof
/// on a port of its own (`extra` arguments added), ready; and its address.
fn http_daemon(out: &std::path::Path, extra: &[&str]) -> (Daemon, SocketAddr) {
    let mut args = vec![
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
        "--cpu-frequency",
        "99",
        "--http-addr",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let mut daemon = Daemon::start(&args);
    daemon.wait_ready();
    let addr = pprof_addr(&daemon);
    (daemon, addr)
}

#[test]
fn a_process_profile_on_demand_from_a_daemon_profiling_the_node() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "pprof_burner");
    let noise_exe = Workload::CpuRatioC.build(tmp.path(), "pprof_noise");
    let out = tmp.path().join("out");
    let (mut daemon, addr) = http_daemon(&out, &[]);
    assert_eq!(daemon.metrics_addr(), addr, "one server for both");

    let mut target = Running::start(&exe, &["6", "--wait-stdin"]);
    let mut noise = Running::start(&noise_exe, &["6", "--wait-stdin"]);
    let pid = target.pid();
    target.release();
    noise.release();
    // What go tool pprof fetches (-proto: the profile as fetched, to read
    // here too; PPROF_TMPDIR: its own copy stays in the temporary dir):
    // one capture from the daemon's own samples, and one beside it at a
    // rate of its own, on CPU-clock events of its own.
    let fetch = |query: String, dir: &str| {
        let url = format!("http://{addr}/debug/pprof/profile?{query}");
        let dir = tmp.path().join(dir);
        std::fs::create_dir_all(&dir).expect("a directory");
        std::thread::spawn(move || fetch_with_pprof(&url, &dir))
    };
    let fast = fetch(format!("seconds=4&pid={pid}&hz=499"), "fast");
    let shared = fetch(format!("seconds=4&pid={pid}"), "shared");
    let (profile, fast) = (
        shared.join().expect("the capture at 99 Hz"),
        fast.join().expect("the capture at 499 Hz"),
    );
    let report = parse_report(&target.finish(Duration::from_secs(20)), "pid");
    let _ = noise.finish(Duration::from_secs(20));
    for (hz, profile) in [(99, &profile), (499, &fast)] {
        check_cpu_capture(&daemon, profile, pid, &report, (hz, 4));
    }
    // Bad input: a one-line reason and the status.
    for (path, status) in [
        ("/debug/pprof/profile?seconds=abc", 400),
        ("/debug/pprof/profile?seconds=0", 400),
        ("/debug/pprof/profile?seconds=100000", 400),
        ("/debug/pprof/profile?pid=abc", 400),
        ("/debug/pprof/profile?hz=1000", 400),
        ("/debug/pprof/profile?hz=1001&pid=1", 400),
        ("/debug/pprof/profile?debug=1", 400),
        ("/debug/pprof/profile?pid=999999999", 404),
        ("/debug/pprof/nothing", 404),
        ("/debug/pprof/allocs?hz=99", 400),
    ] {
        let (got, _, body) = get(addr, path);
        assert_eq!(got, status, "{path}: {body}");
        assert_eq!(
            body.trim_end().lines().count(),
            1,
            "{path}: one line: {body:?}"
        );
    }
    // Go's allocs: the heap profile, over a capture, read by its
    // allocations (pprof's default sample type alloc_space).
    let allocs_dir = tmp.path().join("allocs");
    std::fs::create_dir_all(&allocs_dir).expect("a directory");
    // This process allocates during the capture: some 500 MiB in 1 MiB
    // blocks, a thousand samples at the daemon's rate.
    let allocating = std::thread::spawn(|| {
        let until = std::time::Instant::now() + Duration::from_millis(1500);
        while std::time::Instant::now() < until {
            std::hint::black_box(vec![1u8; 1 << 20]);
            std::thread::sleep(Duration::from_millis(3));
        }
    });
    let allocs = fetch_with_pprof(
        &format!(
            "http://{addr}/debug/pprof/allocs?seconds=1&pid={}",
            std::process::id()
        ),
        &allocs_dir,
    );
    let types: Vec<&str> = allocs
        .sample_type
        .iter()
        .map(|t| allocs.string_table[t.r#type as usize].as_str())
        .collect();
    allocating.join().expect("the allocating thread");
    let default = &allocs.string_table[allocs.default_sample_type as usize];
    assert!(
        types.contains(&"alloc_space") && default == "alloc_space",
        "allocs: sample types {types:?}, default {default:?}"
    );
    check_symbol_lookups(addr);
    let (status, headers, body) = get(addr, "/debug/pprof/");
    assert_eq!(status, 200, "{body}");
    assert!(
        headers
            .get("content-type")
            .is_some_and(|t| t.starts_with("text/html")),
        "{headers:?}"
    );
    assert!(
        body.contains("href=\"/debug/pprof/profile?seconds="),
        "{body}"
    );

    // Clients that go away free their captures: four left mid-capture,
    // then four more fit, and a fifth beyond them is told to wait.
    for _ in 0..4 {
        let mut stream = TcpStream::connect(addr).expect("connecting");
        write!(
            stream,
            "GET /debug/pprof/profile?seconds=60 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        .expect("writing a request");
        std::thread::sleep(Duration::from_millis(100));
        drop(stream);
    }
    // The session notices at its next tick (every second).
    std::thread::sleep(Duration::from_millis(2500));
    let running: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || get(addr, "/debug/pprof/profile?seconds=3")))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (status, headers, body) = get(addr, "/debug/pprof/profile?seconds=1");
    assert_eq!(status, 429, "{body}\n{}", daemon.describe());
    assert!(
        headers
            .get("retry-after")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|s| (1..=4).contains(&s)),
        "{headers:?}"
    );
    for handle in running {
        let (status, _, body) = handle.join().expect("a capture thread");
        assert_eq!(status, 200, "{body}");
    }

    // A capture on events of its own closes them when its client goes
    // away: the daemon's BPF links, counted before, during and after.
    let links = || bpf_links(daemon.pid());
    let mut busy = Running::start(&exe, &["30", "--wait-stdin"]);
    busy.release();
    let before = links();
    let mut stream = TcpStream::connect(addr).expect("connecting");
    write!(
        stream,
        "GET /debug/pprof/profile?seconds=60&hz=499&pid={} HTTP/1.1\r\nhost: x\r\n\r\n",
        busy.pid()
    )
    .expect("writing a request");
    let opened = format!("cpu of pid {} for 60 s at 499 Hz", busy.pid());
    daemon.wait_log(Duration::from_secs(10), |l| l.contains(&opened));
    let during = links();
    drop(stream);
    std::thread::sleep(Duration::from_millis(2500));
    let after = links();
    busy.kill();
    println!(
        "BPF links: {before} before a capture of its own, {during} during, {after} after its client left"
    );
    assert!(during > before, "{during} links during, {before} before");
    assert_eq!(after, before, "links left after the client went away");

    // The scheduled file holds the target's whole run as before.
    daemon.signal(libc::SIGINT);
    daemon.wait_success(Duration::from_secs(20));
    let scheduled = of_pid(&flatten_all(&read_profiles(&out, "cpu")), pid);
    let scheduled_ns: i64 = scheduled.iter().map(|s| s.cpu_ns).sum();
    println!("the scheduled file: {scheduled_ns} ns of pid {pid}");
    // Neither more (the 499 Hz events' samples are the capture's alone)
    // nor less than the target's 6 s.
    assert!(
        (0.8 * 6e9..1.15 * 6e9).contains(&(scheduled_ns as f64)),
        "the scheduled file holds {scheduled_ns} ns of the target's 6 s\n{}",
        daemon.describe()
    );
}

/// A CPU capture of burner `pid` at `hz` for `seconds` (`report`: what the
/// burner measured of itself): its samples only, burn_a's share as
/// measured, the capture's length and rate, and the samples of a CPU kept
/// busy that long.
fn check_cpu_capture(
    daemon: &Daemon,
    profile: &pprof_proto::Profile,
    pid: u32,
    report: &std::collections::BTreeMap<String, u64>,
    (hz, seconds): (i64, u64),
) {
    let (measured_a, measured_b) = (field(report, "a_ns") as f64, field(report, "b_ns") as f64);
    let measured = measured_a / (measured_a + measured_b).max(1.0);
    let samples = flatten(profile);
    let others = other_pids(&samples, pid);
    let (a, b) = (cpu_in(&samples, "burn_a"), cpu_in(&samples, "burn_b"));
    let share = a as f64 / (a + b).max(1) as f64;
    let duration_s = profile.duration_nanos as f64 / 1e9;
    let count: i64 = samples.iter().map(|s| s.values[0]).sum();
    println!(
        "on demand at {hz} Hz, pid {pid}, {seconds} s: {count} samples, burn_a's share \
         {share:.3} (the program measured {measured:.3}); {duration_s:.2} s long; {} samples of \
         other processes",
        others.len()
    );
    assert!(
        others.is_empty(),
        "{hz} Hz: samples of other processes: {others:?}"
    );
    // ±5 points, or 3.5 standard deviations of a share drawn from this
    // many samples where that is wider (400 samples at 99 Hz: ±7.6).
    let spread = 3.5 * (measured * (1.0 - measured) / count.max(1) as f64).sqrt();
    let tolerance = SHARE_TOLERANCE.max(spread);
    assert!(
        (share - measured).abs() <= tolerance,
        "{hz} Hz: burn_a's share {share:.3}, measured {measured:.3} (±{tolerance:.3})\n{}",
        daemon.describe()
    );
    let secs = seconds as f64;
    assert!(
        (secs - 0.1..secs + 1.0).contains(&duration_s),
        "a {seconds} s capture lasted {duration_s:.2} s"
    );
    assert_eq!(profile.period, 1_000_000_000 / hz, "the capture's rate");
    // The burner keeps a CPU busy: about `seconds` of samples at that rate.
    let expected = secs * hz as f64;
    assert!(
        (0.8 * expected..1.1 * expected).contains(&(count as f64)),
        "{hz} Hz: {count} samples in {seconds} s"
    );
}

/// The daemon's metrics that count losses, non-zero ones only.
fn losses(addr: SocketAddr) -> String {
    let (_, _, text) = get(addr, "/metrics");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.ends_with(" 0"))
        .filter(|l| {
            ["lost", "dropped", "full", "loss"]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The BPF links process `pid` holds open.
fn bpf_links(pid: u32) -> usize {
    bpf_descriptors(pid, "anon_inode:bpf_link")
}

/// The descriptors of process `pid` whose target starts with `prefix`
/// (`anon_inode:bpf`: its BPF links, programs and maps).
fn bpf_descriptors(pid: u32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the daemon's descriptors")
        .flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with(prefix))
        })
        .count()
}

/// `values[index]` summed over the samples whose stack holds `site`.
fn site_value(samples: &[FlatSample], site: &str, index: usize) -> i64 {
    samples
        .iter()
        .filter(|s| s.has_function(site))
        .map(|s| s.values[index])
        .sum()
}

/// Captures of processes a `--pid` daemon does not profile: CPU, sampled
/// on events of the capture's own, in the split the program measured;
/// heap, with the probes covering those processes for the capture's time,
/// and block, a type the daemon does not collect, on probes loaded for
/// the capture, in what the programs counted. The daemon's BPF links come
/// back to what they were, and the scheduled files hold none of it.
#[test]
fn processes_the_daemon_does_not_profile_are_captured_for_the_capture_only() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "pprof_outsider");
    let out = tmp.path().join("out");
    // The daemon's one target: a process that sleeps.
    let mut target = Command::new("sleep")
        .arg("300")
        .spawn()
        .expect("starting sleep");
    let target_pid = target.id().to_string();
    // Heap and CPU profiles, not block ones.
    let (mut daemon, addr) = http_daemon(
        &out,
        &[
            &["--pid", &target_pid, "--profiles", "cpu,heap"][..],
            &HEAP_AND_BLOCK[2..],
        ]
        .concat(),
    );
    let links_before = bpf_links(daemon.pid());
    let mut outsider = Running::start(&exe, &["4", "--wait-stdin"]);
    let pid = outsider.pid();
    // The processes it profiles: its target, not the outsider.
    let (_, _, index) = get(addr, "/debug/pprof/");
    assert!(index.contains(&format!("<td>{target_pid}</td>")), "{index}");
    assert!(!index.contains(&format!("<td>{pid}</td>")), "{index}");
    outsider.release();
    let profile = fetch_with_pprof(
        &format!("http://{addr}/debug/pprof/profile?seconds=3&pid={pid}"),
        tmp.path(),
    );
    let report = parse_report(&outsider.finish(Duration::from_secs(20)), "pid");
    check_cpu_capture(&daemon, &profile, pid, &report, (99, 3));

    // The guest's own allocator probes, attached for the capture.
    let links_during = std::cell::Cell::new(0);
    let (heap_pid, _) = heap_on_demand(&daemon, addr, tmp.path(), (&[""], false), &|| {
        links_during.set(bpf_links(daemon.pid()));
    });
    // Block probes of the capture's own: programs, maps and links that
    // come and go with it.
    let bpf_before = bpf_descriptors(daemon.pid(), "anon_inode:bpf");
    let bpf_during = std::cell::Cell::new(0);
    let (block_pid, _) = block_on_demand(&daemon, addr, tmp.path(), &[""], &|| {
        bpf_during.set(bpf_descriptors(daemon.pid(), "anon_inode:bpf"));
    });
    assert!(
        daemon.stderr_lines().iter().any(|l| l.contains(&format!(
            "block of pid {block_pid} for 5 s on probes of its own"
        ))),
        "the block capture was not on probes of its own\n{}",
        daemon.describe()
    );
    // The probes the captures attached are let go, links first, then
    // their programs and maps (closed off the session's thread: give it a
    // moment, for both).
    let mut links_after = bpf_links(daemon.pid());
    let mut bpf_after = bpf_descriptors(daemon.pid(), "anon_inode:bpf");
    for _ in 0..50 {
        if links_after == links_before && bpf_after == bpf_before {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        links_after = bpf_links(daemon.pid());
        bpf_after = bpf_descriptors(daemon.pid(), "anon_inode:bpf");
    }
    let links_during = links_during.get();
    let bpf_during = bpf_during.get();
    println!(
        "BPF links: {links_before} before the captures, {links_during} during the heap \
         capture, {links_after} after; BPF descriptors: {bpf_before} before the block capture, \
         {bpf_during} during, {bpf_after} after"
    );
    assert!(
        bpf_during > bpf_before,
        "no programs or maps loaded for the block capture"
    );
    assert_eq!(
        bpf_after, bpf_before,
        "BPF descriptors left after the block capture"
    );
    assert!(
        links_during > links_before,
        "no probes attached for the heap capture"
    );
    assert_eq!(links_after, links_before, "links left after the captures");

    let _ = target.kill();
    let _ = target.wait();
    daemon.wait_success(Duration::from_secs(20));
    assert!(
        read_profiles(&out, "block").is_empty(),
        "block files from a daemon that does not collect them (capture of {block_pid})"
    );
    for (kind, outsider) in [("cpu", pid), ("heap", heap_pid)] {
        let scheduled = flatten_all(&read_profiles(&out, kind));
        assert!(
            of_pid(&scheduled, outsider).is_empty(),
            "the {kind} files hold samples of {outsider}, which the daemon does not profile"
        );
    }
}

/// Heap captures of heap_sites (built in `tmp`), one per entry of
/// `rates` (a `heap_sample_bytes`, or none for the daemon's), at once,
/// open before it allocates and ending while it holds its leak, fetched
/// from `addr` with `go tool pprof`, beside another heap_sites: per site,
/// each capture's allocations are what the program counted, and its
/// in-use set is the held leak; with `at_once`, so is the in-use set of a
/// capture of no time taken after. `while_open` runs once the captures
/// are open. Returns the program's pid and its lines.
fn heap_on_demand(
    daemon: &Daemon,
    addr: SocketAddr,
    tmp: &Path,
    (rates, at_once): (&[&str], bool),
    while_open: &dyn Fn(),
) -> (u32, Vec<HeapSiteLine>) {
    // The heap: a capture open before the program allocates, which ends
    // while it holds its leak.
    let heap_exe = Workload::HeapSites.build(tmp, "demand_heap");
    let noise_exe = Workload::HeapSites.build(tmp, "demand_noise");
    // Half the calls: every site still expects over 700 samples.
    let mut heap = Running::start(&heap_exe, &["--wait-stdin", "--hold", "--scale", "0.5"]);
    let mut noise = Running::start(&noise_exe, &["--wait-stdin"]);
    let pid = heap.pid();
    // Long enough for the program's work under the probes (a uprobe hit
    // per allocator call: seconds for its 0.9 million calls).
    let captures = fetch_at_rates(
        addr,
        tmp,
        &format!("heap?seconds={HEAP_CAPTURE_S}&pid={pid}"),
        ("heap_sample_bytes", rates),
    );
    let opened = format!("heap of pid {pid} for {HEAP_CAPTURE_S} s");
    let opened_at = std::time::Instant::now();
    // A line each, each taken by one wait.
    for _ in rates {
        daemon.wait_log(Duration::from_secs(30), |l| l.contains(&opened));
    }
    while_open();
    // The daemon attaches its Go probes to `go tool pprof` as it starts;
    // the program's burst of allocations, beside that, can fill the heap
    // ring (a loss it counts, but one these ratios would not survive).
    std::thread::sleep(Duration::from_secs(1));
    heap.poke();
    let held = heap.wait_line(Duration::from_secs(60), |l| l.starts_with("holding"));
    let work_s = opened_at.elapsed().as_secs_f64();
    assert!(
        work_s < HEAP_CAPTURE_S as f64 - 0.5,
        "the program's work ended {work_s:.1} s into a {HEAP_CAPTURE_S} s capture: too late to \
         compare"
    );
    // Another process allocating during the capture, after the program's
    // burst (both at once could fill the heap ring, a loss the daemon
    // counts but these ratios would not survive).
    noise.release();
    let profiles: Vec<_> = captures
        .into_iter()
        .map(|c| c.join().expect("the heap capture"))
        .collect();
    // Now, while the leak is held: the in-use set alone.
    let now = at_once
        .then(|| fetch_with_pprof(&format!("http://{addr}/debug/pprof/heap?pid={pid}"), tmp));
    heap.release();
    let stdout = heap.finish(Duration::from_secs(60));
    let _ = noise.finish(Duration::from_secs(60));
    let truth = parse_heap_site_lines(&stdout);
    for (profile, rate) in profiles.iter().zip(rates) {
        let rate = match rate.is_empty() {
            true => "the daemon's rate".to_owned(),
            false => format!("{rate} B"),
        };
        check_heap_capture(daemon, addr, pid, (profile, &rate), &truth, work_s, &held);
    }
    let leak_live = truth
        .iter()
        .find(|t| t.name == HEAP_LEAK)
        .map_or(0, |t| t.live_bytes);
    let freed_made: u64 = truth
        .iter()
        .filter(|t| t.name != HEAP_LEAK)
        .map(|t| t.bytes)
        .sum();
    let mut in_use: Vec<(String, &pprof_proto::Profile)> = profiles
        .iter()
        .zip(rates)
        .map(|(p, rate)| (format!("at the end of the capture at {rate:?}"), p))
        .collect();
    in_use.extend(now.as_ref().map(|now| ("now".to_owned(), now)));
    for (what, p) in in_use {
        let samples = flatten(p);
        let leak = site_value(&samples, HEAP_LEAK, 3) as f64 / leak_live.max(1) as f64;
        let freed: i64 = HEAP_SITES
            .iter()
            .filter(|&&site| site != HEAP_LEAK)
            .map(|site| site_value(&samples, site, 3))
            .sum();
        println!("  in use {what}: the leak's {leak:.3} of its live bytes; freed sites {freed} B");
        assert!(
            (leak - 1.0).abs() <= HEAP_TOLERANCE,
            "in use {what}: the leak's {leak:.3} of {leak_live} B"
        );
        assert!(
            freed as f64 <= 0.02 * freed_made as f64,
            "in use {what}: {freed} B of sites that freed all {freed_made} B"
        );
    }
    if let Some(now) = &now {
        let allocated_now: i64 = flatten(now).iter().map(|s| s.values[1]).sum();
        assert_eq!(
            allocated_now, 0,
            "nothing allocated in a capture of no time"
        );
    }
    (pid, truth)
}

/// The pids of `samples` other than `pid`.
fn other_pids(samples: &[FlatSample], pid: u32) -> Vec<u32> {
    samples
        .iter()
        .map(FlatSample::pid)
        .filter(|&p| p != pid)
        .collect()
}

/// `/debug/pprof/PATH_QUERY` fetched with `go tool pprof` (each in a
/// directory of its own under `tmp`), once per entry of `rates`: with
/// `NAME=RATE`, or as it is for an empty one; all at once, each on a
/// thread of its own.
fn fetch_at_rates(
    addr: SocketAddr,
    tmp: &Path,
    path_query: &str,
    (name, rates): (&str, &[&str]),
) -> Vec<std::thread::JoinHandle<pprof_proto::Profile>> {
    rates
        .iter()
        .enumerate()
        .map(|(i, rate)| {
            let query = match rate.is_empty() {
                true => String::new(),
                false => format!("&{name}={rate}"),
            };
            let url = format!("http://{addr}/debug/pprof/{path_query}{query}");
            let dir = tmp.join(format!("{name}-{i}"));
            std::fs::create_dir_all(&dir).expect("a directory");
            std::thread::spawn(move || fetch_with_pprof(&url, &dir))
        })
        .collect()
}

/// One heap capture (`profile`, at `rate`) of heap_sites `pid`: nothing
/// of another process, and per site the allocations the program counted
/// (`truth`).
fn check_heap_capture(
    daemon: &Daemon,
    addr: SocketAddr,
    pid: u32,
    (profile, rate): (&pprof_proto::Profile, &str),
    truth: &[HeapSiteLine],
    work_s: f64,
    held: &str,
) {
    let samples = flatten(profile);
    let others = other_pids(&samples, pid);
    assert!(others.is_empty(), "samples of other processes: {others:?}");
    // What the capture's own probes lost, as its comments say.
    let comments: Vec<&str> = profile
        .comment
        .iter()
        .filter_map(|&i| profile.string_table.get(i as usize))
        .map(String::as_str)
        .collect();
    println!(
        "heap on demand at {rate}, pid {pid}, {HEAP_CAPTURE_S} s, the work done {work_s:.1} s in \
         ({held}); comments {comments:?}:"
    );
    let mut worst: f64 = 0.0;
    for HeapSiteLine {
        name, calls, bytes, ..
    } in truth
    {
        let got = site_value(&samples, name, 1);
        let ratio = got as f64 / (*bytes).max(1) as f64;
        println!("  {name}: {calls} calls, {bytes} B; alloc_space {got} ({ratio:.3})");
        worst = worst.max((ratio - 1.0).abs());
    }
    assert!(
        worst <= HEAP_TOLERANCE,
        "at {rate}: a site's allocations are off by {worst:.3}; the capture's losses {comments:?}; \
         the daemon's:\n{}\n{}",
        losses(addr),
        daemon.describe()
    );
}

/// Block captures of block_sites (built in `tmp`) over its whole run, one
/// per entry of `rates` (a `block_rate` parameter, or none for the
/// daemon's), at once, fetched from `addr` with `go tool pprof`: per site,
/// each holds the delay the program timed. Returns its pid and its site
/// lines.
fn block_on_demand(
    daemon: &Daemon,
    addr: SocketAddr,
    tmp: &Path,
    rates: &[&str],
    while_open: &dyn Fn(),
) -> (u32, Vec<SiteLine>) {
    let block_exe = Workload::BlockSites.build(tmp, "demand_block");
    let mut block = Running::start(&block_exe, &["--wait-stdin", "--rounds", "100"]);
    let block_pid = block.pid();
    let captures = fetch_at_rates(
        addr,
        tmp,
        &format!("block?seconds=5&pid={block_pid}"),
        ("block_rate", rates),
    );
    let opened = format!("block of pid {block_pid} for 5 s");
    daemon.wait_log(Duration::from_secs(30), |l| {
        l.contains(&opened) && (rates.len() == 1 || l.contains("probes of its own"))
    });
    while_open();
    block.release();
    let block_out = block.finish(Duration::from_secs(60));
    let sites = parse_site_lines(&block_out, &BLOCK_SITES);
    for (capture, rate) in captures.into_iter().zip(rates) {
        let profile = capture.join().expect("the block capture");
        let samples = flatten(&profile);
        assert!(
            samples.iter().all(|s| s.pid() == block_pid),
            "samples of other processes in the block capture"
        );
        let rate = match rate.is_empty() {
            true => "the daemon's rate",
            false => rate,
        };
        for site in &sites {
            let delay = site_value(&samples, &site.name, 1) as f64 / site.total_ns as f64;
            let contentions = site_value(&samples, &site.name, 0) as f64 / site.waits as f64;
            println!(
                "block on demand at {rate}: {}: {} waits, {} ns; delay {delay:.3}, contentions \
                 {contentions:.3}",
                site.name, site.waits, site.total_ns
            );
            assert!(
                (delay - 1.0).abs() <= BLOCK_TOLERANCE,
                "at {rate}: {}: delay {delay:.3} of what it measured\n{}",
                site.name,
                daemon.describe()
            );
        }
    }
    (block_pid, sites)
}

/// Heap and block profiles on demand, from a daemon that collects them for
/// the node: `go tool pprof` fetches each; per site they hold what the
/// programs measured of themselves (the heap's allocations over the
/// capture and its in-use set at the end; the block profile's delay), and
/// nothing of another process; `/debug/pprof/heap` without `seconds` is
/// the in-use set now; the scheduled files hold the same sites as without
/// the captures.
#[test]
fn heap_and_block_on_demand_agree_with_what_the_programs_measured() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let (mut daemon, addr) = http_daemon(&out, &HEAP_AND_BLOCK);

    // At the daemon's rate, and at a rate of its own beside it.
    let (pid, truth) = heap_on_demand(&daemon, addr, tmp.path(), (&["", "24576"], true), &|| {});
    // At the daemon's rate, and at a rate of its own beside it.
    let (block_pid, sites) = block_on_demand(&daemon, addr, tmp.path(), &["", "1ms"], &|| {});

    // A type the daemon does not collect, of every process: a one-line
    // 400 (its probes are loaded for named processes only).
    let (status, _, body) = get(addr, "/debug/pprof/mutex?seconds=1");
    assert_eq!(status, 400, "{body}");
    assert_eq!(body.trim_end().lines().count(), 1, "{body}");

    // The scheduled files: the same sites, as without the captures.
    daemon.signal(libc::SIGINT);
    daemon.wait_success(Duration::from_secs(20));
    let scheduled = of_pid(&flatten_all(&read_profiles(&out, "heap")), pid);
    for site in truth.iter().filter(|t| t.name != HEAP_LEAK) {
        let ratio = site_value(&scheduled, &site.name, 1) as f64 / site.bytes.max(1) as f64;
        assert!(
            (ratio - 1.0).abs() <= HEAP_TOLERANCE,
            "the scheduled files: {}'s allocations {ratio:.3} of what it made",
            site.name
        );
    }
    let scheduled = of_pid(&flatten_all(&read_profiles(&out, "block")), block_pid);
    for site in &sites {
        let delay = site_value(&scheduled, &site.name, 1) as f64 / site.total_ns as f64;
        println!("the scheduled block files: {}: delay {delay:.3}", site.name);
        assert!(
            (delay - 1.0).abs() <= BLOCK_TOLERANCE,
            "the scheduled files: {}: delay {delay:.3}",
            site.name
        );
    }
}

#[test]
fn a_token_guards_every_path_and_svg_draws_the_capture() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "pprof_svg_burner");
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "t0ken-for-tests\n").expect("writing the token");
    let out = tmp.path().join("out");
    let out_arg = out.to_str().expect("UTF-8 path");
    let token_arg = token_file.to_str().expect("UTF-8 path");

    // A token file without --http-addr, or an empty one: one line, exit 2.
    let empty = tmp.path().join("empty");
    std::fs::write(&empty, "\n").expect("writing an empty token");
    for args in [
        vec!["--output-dir", out_arg, "--http-token-file", token_arg],
        vec![
            "--output-dir",
            out_arg,
            "--http-addr",
            "127.0.0.1:0",
            "--http-token-file",
            empty.to_str().expect("UTF-8 path"),
        ],
        vec![
            "--output-dir",
            out_arg,
            "--http-addr",
            "127.0.0.1:0",
            "--http-metrics-without-token",
        ],
    ] {
        let output = Command::new(profiler_tests::daemon::profilerd_bin())
            .args(&args)
            .output()
            .expect("running profilerd");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains("http-"), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("t0ken"),
            "{args:?}: the token shown: {stderr}"
        );
    }

    let (mut daemon, addr) = http_daemon(&out, &["--http-token-file", token_arg]);
    let bearer = [("authorization", "Bearer t0ken-for-tests")];
    for path in [
        "/debug/pprof/",
        "/debug/pprof/profile?seconds=1",
        "/metrics",
    ] {
        for headers in [
            &[][..],
            &[("authorization", "Bearer t0ken-for-test")][..],
            &[("authorization", "Basic t0ken-for-tests")][..],
        ] {
            let (status, got, body) = get_with(addr, path, headers);
            assert_eq!(status, 401, "{path} {headers:?}: {body}");
            assert_eq!(body.trim_end().lines().count(), 1, "{path}: {body:?}");
            assert!(got.contains_key("www-authenticate"), "{got:?}");
        }
    }
    let (status, _, body) = get_with(addr, "/metrics", &bearer);
    assert_eq!(status, 200, "{body}");
    let (status, _, index) = get_with(addr, "/debug/pprof/", &bearer);
    assert_eq!(status, 200, "{index}");
    assert!(index.contains("format=svg"), "{index}");

    // The flame graph of a capture: burn_a and burn_b in the split the
    // workload measured.
    let mut target = Running::start(&exe, &["7", "--wait-stdin"]);
    let pid = target.pid();
    target.release();
    let path = format!("/debug/pprof/profile?seconds=5&pid={pid}&format=svg");
    let (status, headers, svg) = get_with(addr, &path, &bearer);
    assert_eq!(status, 200, "{svg}\n{}", daemon.describe());
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("image/svg+xml")
    );
    let report = parse_report(&target.finish(Duration::from_secs(20)), "pid");
    let graph = FlameGraph::parse(&svg);
    let (wa, wb) = (graph.width_of("burn_a"), graph.width_of("burn_b"));
    let (measured_a, measured_b) = (field(&report, "a_ns") as f64, field(&report, "b_ns") as f64);
    let measured = measured_a / (measured_a + measured_b);
    let share = wa / (wa + wb).max(f64::MIN_POSITIVE);
    println!(
        "svg on demand: burn_a {wa:.2}%, burn_b {wb:.2}% wide: share {share:.3}, measured {measured:.3}"
    );
    assert_eq!(graph.title(), "cpu profile: cpu (nanoseconds)");
    assert!(wa > 0.0 && wb > 0.0, "no burn_a or burn_b frames:\n{svg}");
    assert!(
        (share - measured).abs() <= SVG_SHARE_TOLERANCE,
        "burn_a's share of the width {share:.3}, measured {measured:.3}"
    );

    // A process that does not run: a picture that says so.
    let mut idle = Command::new("sleep").arg("30").spawn().expect("sleep");
    // Past its exec and loading, which take CPU samples of their own.
    std::thread::sleep(Duration::from_secs(1));
    let path = format!(
        "/debug/pprof/profile?seconds=1&pid={}&format=svg",
        idle.id()
    );
    let (status, _, svg) = get_with(addr, &path, &bearer);
    let _ = idle.kill();
    let _ = idle.wait();
    assert_eq!(status, 200, "{svg}");
    let graph_of_idle = (!svg.contains("no samples")).then(|| FlameGraph::parse(&svg));
    assert!(
        graph_of_idle.is_none(),
        "samples of a sleeping process: {:?}",
        graph_of_idle.map(|g| g.title().to_owned())
    );
    roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("not XML: {e}\n{svg}"));

    daemon.signal(libc::SIGINT);
    daemon.wait_success(Duration::from_secs(20));
}

/// Headless Chromium's DOM of `url` once loaded (`--dump-dom`), with the
/// flags that keep it off the network it does not have.
fn chromium_dom(url: &str, profile_dir: &std::path::Path) -> String {
    let chromium = std::path::Path::new("/usr/bin/chromium");
    assert!(
        chromium.exists(),
        "/usr/bin/chromium is missing (cargo xtask test installs Debian's chromium)"
    );
    let output = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--timeout=30000",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("running chromium");
    assert!(
        output.status.success(),
        "chromium {url}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_index_page_lists_processes_and_its_links_work_in_chromium() {
    require_root();
    let tmp = temp_dir();
    // Its command name (15 bytes at most) is what the page shows.
    let exe = Workload::CpuRatioC.build(tmp.path(), "pprofidxburner");
    let out = tmp.path().join("out");
    let (mut daemon, addr) = http_daemon(&out, &["--profiles", "cpu,heap"]);
    let mut target = Running::start(&exe, &["14", "--wait-stdin"]);
    let pid = target.pid();
    target.release();

    let dom = chromium_dom(
        &format!("http://{addr}/debug/pprof/"),
        &tmp.path().join("chromium"),
    );
    // The page as the browser built it: the endpoints, and a row for the
    // burner with its two links.
    let row = dom
        .split("<tr>")
        .find(|row| row.contains(&format!("<td>{pid}</td>")))
        .unwrap_or_else(|| panic!("no row for pid {pid} in\n{dom}"));
    assert!(row.contains("<td>pprofidxburner</td>"), "{row}");
    assert!(dom.contains("href=\"/metrics\""), "{dom}");
    let links: Vec<&str> = row
        .split("href=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    // A link per profile type the daemon collects, and the flame graph.
    assert!(links.len() >= 2, "{row}");
    assert!(
        links.iter().any(|l| l.starts_with("/debug/pprof/heap?")),
        "no heap link: {row}"
    );
    let svg_link = links
        .iter()
        .find(|l| l.contains("format=svg"))
        .unwrap_or_else(|| panic!("no flame graph link in {row}"))
        .replace("&amp;", "&");
    assert!(svg_link.contains(&format!("pid={pid}")), "{svg_link}");

    // Followed in the browser: the flame graph of the burner.
    let svg = chromium_dom(
        &format!("http://{addr}{svg_link}"),
        &tmp.path().join("chromium"),
    );
    let report = parse_report(&target.finish(Duration::from_secs(30)), "pid");
    assert!(svg.contains("<svg"), "{svg}");
    assert!(
        svg.contains("burn_a") && svg.contains("burn_b"),
        "no burn_a or burn_b frames in the flame graph:\n{svg}"
    );
    println!(
        "index page: {} rows; flame graph of pid {pid} followed ({} bytes); the program \
         burned {} ns in burn_a",
        dom.matches("<tr>").count(),
        svg.len(),
        field(&report, "a_ns")
    );
    // The CPU profile's link is the pprof itself.
    let proto_link = links
        .iter()
        .find(|l| !l.contains("format=svg") && l.starts_with("/debug/pprof/profile?"))
        .expect("a profile link")
        .replace("&amp;", "&");
    assert!(
        proto_link.starts_with(&format!("/debug/pprof/profile?seconds=10&pid={pid}")),
        "{proto_link}"
    );
    daemon.signal(libc::SIGINT);
    daemon.wait_success(Duration::from_secs(20));
}

#[inline(never)]
fn a_function_the_daemon_names() -> u64 {
    std::hint::black_box(42)
}

/// `/debug/pprof/symbol` as Go's handler answers it: `num_symbols: 1`,
/// then the names of a process's addresses (this test's own function)
/// when a pid is given; none without one (pprof's own request); a
/// one-line 4xx for a bad pid, a gone process or a bad address.
fn check_symbol_lookups(addr: std::net::SocketAddr) {
    use profiler_tests::http::post;
    let (status, _, body) = get(addr, "/debug/pprof/symbol");
    assert_eq!((status, body.as_str()), (200, "num_symbols: 1\n"));
    let function = a_function_the_daemon_names as *const () as u64;
    let addresses = format!("{function:#x}+0x1");
    let (status, _, body) = post(
        addr,
        &format!("/debug/pprof/symbol?pid={}", std::process::id()),
        &addresses,
    );
    let mut lines = body.lines();
    assert_eq!(
        (status, lines.next()),
        (200, Some("num_symbols: 1")),
        "{body}"
    );
    let named: Vec<&str> = lines.collect();
    assert!(
        named.len() == 1
            && named[0].starts_with(&format!("{function:#x} "))
            && named[0].contains("a_function_the_daemon_names"),
        "{body}"
    );
    let (status, _, body) = post(addr, "/debug/pprof/symbol", &addresses);
    assert_eq!((status, body.as_str()), (200, "num_symbols: 1\n"));
    for (path, text, want) in [
        ("/debug/pprof/symbol?pid=abc", "0x1", 400),
        ("/debug/pprof/symbol?pid=4194305", "0x1", 404),
        ("/debug/pprof/symbol?pid=1", "0xnope", 400),
        ("/debug/pprof/symbol?seconds=1", "0x1", 400),
    ] {
        let (status, _, body) = post(addr, path, text);
        assert_eq!(status, want, "{path} {text}: {body}");
        assert_eq!(body.trim_end().lines().count(), 1, "one line: {body}");
    }
}

/// Mutex and off-CPU profiles on demand from a daemon that collects CPU
/// only, each on probes loaded for the named process: `go tool pprof`
/// fetches them; the mutex capture charges the holder's unlock with what
/// the waiter had waited (mutex_hold measures it at each unlock), at the
/// capture's own `mutex_fraction=1`; the off-CPU capture holds each of
/// block_sites' sites within BLOCK_TOLERANCE of the time it timed; neither
/// holds another process.
#[test]
fn mutex_and_offcpu_on_demand_agree_with_what_the_programs_measured() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let (daemon, addr) = http_daemon(&out, &["--profiles", "cpu"]);

    let mutex_exe = Workload::MutexHold.build(tmp.path(), "demand_mutex");
    let (stdout, captures) = captured_while_it_runs(
        &daemon,
        addr,
        tmp.path(),
        (&mutex_exe, &["--iterations", "1000"]),
        "mutex",
        ("mutex_fraction", &["1"]),
    );
    let waited = parse_report(&stdout, "holds")["waited_ns"] as f64;
    for samples in captures {
        let delay = site_value(&samples, "holder_unlock", 1) as f64 / waited;
        println!("mutex on demand: holder_unlock delay {delay:.3} of what the waiter waited");
        assert!(
            (delay - 1.0).abs() <= BLOCK_TOLERANCE,
            "mutex on demand: holder_unlock delay {delay:.3} of {waited} ns\n{}",
            daemon.describe()
        );
    }

    let block_exe = Workload::BlockSites.build(tmp.path(), "demand_offcpu");
    let (stdout, captures) = captured_while_it_runs(
        &daemon,
        addr,
        tmp.path(),
        (&block_exe, &["--rounds", "100"]),
        "offcpu",
        ("block_rate", &[""]),
    );
    let sites = parse_site_lines(&stdout, &BLOCK_SITES);
    for samples in captures {
        for site in &sites {
            let off = site_value(&samples, &site.name, 1) as f64 / site.total_ns as f64;
            println!(
                "off-CPU on demand: {}: {off:.3} of what it timed",
                site.name
            );
            assert!(
                (off - 1.0).abs() <= BLOCK_TOLERANCE,
                "off-CPU on demand: {}: {off:.3} of what it timed\n{}",
                site.name,
                daemon.describe()
            );
        }
    }
}

/// `exe ARGS --wait-stdin` captured as `KIND?seconds=5&pid=P` (once per
/// rate of `rates`, see [`fetch_at_rates`]), released once the daemon has
/// opened the capture: the program's output, and each capture's samples,
/// checked to hold none of another process.
fn captured_while_it_runs(
    daemon: &Daemon,
    addr: SocketAddr,
    tmp: &Path,
    (exe, args): (&Path, &[&str]),
    kind: &str,
    rates: (&str, &[&str]),
) -> (String, Vec<Vec<FlatSample>>) {
    let mut all = vec!["--wait-stdin"];
    all.extend_from_slice(args);
    let mut workload = Running::start(exe, &all);
    let pid = workload.pid();
    let captures = fetch_at_rates(addr, tmp, &format!("{kind}?seconds=5&pid={pid}"), rates);
    daemon.wait_log(Duration::from_secs(30), |l| {
        l.contains(&format!("{kind} of pid {pid} for 5 s"))
    });
    workload.release();
    let stdout = workload.finish(Duration::from_secs(60));
    let samples = captures
        .into_iter()
        .map(|capture| {
            let samples = flatten(&capture.join().expect("the capture"));
            assert!(
                other_pids(&samples, pid).is_empty(),
                "samples of other processes in the {kind} capture"
            );
            samples
        })
        .collect();
    (stdout, samples)
}
