//! `[limits] memory_bytes`: the daemon's caches (symbols, parsed files,
//! unwind tables, process unwinders, walks) stay within one budget over
//! many distinct binaries, count what they drop, and the profile's answer
//! does not change: frames are symbolized after their entries were
//! dropped and read again.
//!
//! The binaries are copies of cpu_ratio.c linked with distinct build IDs,
//! so that no cache can share one copy's entries with another's; they run
//! at once under `-- COMMAND`, a window every 2 s, with a budget the
//! copies' symbols and unwind tables do not fit in.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::http::{Exposition, get, parse_exposition};
use profiler_tests::profiles::{flatten_all, read_profiles};
use profiler_tests::workloads::compile;
use profiler_tests::{pause, temp_dir};

/// Distinct binaries run at once.
const COPIES: usize = 32;
/// Seconds each copy burns.
const BURN_SECONDS: u64 = 8;
/// The budget: 1 MiB, the smallest accepted. What the copies need is
/// several times that (printed by the test: a roomy run holds about
/// 4 MiB for them, docs/design/015-memory-budget.md).
const BUDGET: u64 = 1 << 20;
const HZ: u64 = 499;
const CACHES: [&str; 6] = [
    "symbols",
    "layouts",
    "symbol_files",
    "unwind_objects",
    "unwinders",
    "walk_memo",
];

/// `count` builds of cpu_ratio.c, each with its own build ID.
fn build_copies(dir: &Path, count: usize) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/cpu_ratio.c");
    (0..count)
        .map(|i| {
            let mut cmd = Command::new("gcc");
            cmd.args(["-O2", "-fno-omit-frame-pointer", "-g", "-Wall"])
                .arg(format!(
                    "-Wl,--build-id=0x{:040x}",
                    0x00b0_d9e7_0000_u64 + i as u64
                ))
                .current_dir(dir);
            compile(cmd, &src, &dir.join(format!("budget_{i:02}")))
        })
        .collect()
}

fn scrape(addr: SocketAddr) -> Option<Exposition> {
    let (status, _, body) = get(addr, "/metrics");
    (status == 200).then(|| parse_exposition(&body))
}

fn cache_bytes(m: &Exposition) -> f64 {
    CACHES
        .iter()
        .map(|c| m.value("profilerd_cache_bytes", &[("cache", c)]))
        .sum()
}

fn cache_evictions(m: &Exposition) -> f64 {
    CACHES
        .iter()
        .map(|c| m.value("profilerd_cache_evictions_total", &[("cache", c)]))
        .sum()
}

/// Starts the daemon over `exes` run at once (each as many times as it
/// is listed) for `BURN_SECONDS`, with `budget` if given, serving metrics.
fn start_over(dir: &Path, exes: &[PathBuf], budget: Option<u64>) -> Daemon {
    let config = dir.join("profilerd.toml");
    let limits = budget.map_or(String::new(), |b| format!("[limits]\nmemory_bytes = {b}\n"));
    std::fs::write(&config, limits).expect("writing the config");
    // All at once, from one shell the daemon follows.
    let script: Vec<String> = exes
        .iter()
        .map(|exe| format!("{} {BURN_SECONDS} >/dev/null &", exe.display()))
        .collect();
    let script = format!("{}\nwait\n", script.join("\n"));
    let out = dir.join("out");
    Daemon::start(&[
        "--config",
        config.to_str().expect("UTF-8 path"),
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
        "--interval",
        "2s",
        "--cpu-frequency",
        &HZ.to_string(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--",
        "/bin/sh",
        "-c",
        &script,
    ])
}

#[test]
fn caches_stay_within_the_budget_and_profiles_stay_right() {
    require_root();
    let tmp = temp_dir();
    let copies = build_copies(tmp.path(), COPIES);
    let out = tmp.path().join("out");
    let mut daemon = start_over(tmp.path(), &copies, Some(BUDGET));
    daemon.wait_ready();
    let addr = daemon.metrics_addr();

    // Every scrape while the copies run (the daemon exits with them):
    // within the budget.
    let mut scrapes = 0;
    let mut most: f64 = 0.0;
    let mut last = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(BURN_SECONDS - 2) {
        let m = scrape(addr).expect("a scrape");
        scrapes += 1;
        assert_eq!(
            m.value("profilerd_cache_budget_bytes", &[]),
            BUDGET as f64,
            "the budget gauge"
        );
        let held = cache_bytes(&m);
        most = most.max(held);
        assert!(
            held <= BUDGET as f64,
            "the caches hold {held} bytes, over the budget of {BUDGET}\n{}",
            daemon.describe()
        );
        last = Some(m);
        pause(Duration::from_millis(250));
    }
    daemon.wait_success(Duration::from_secs(60));
    // The copies keep both CPUs busy: a scrape takes a while.
    assert!(scrapes >= 3, "only {scrapes} scrapes");

    // Drops are counted: in the metrics, the summary, and said once.
    let evicted = daemon.summary_field("cache_evictions");
    let peak = daemon.summary_field("cache_peak_bytes");
    println!(
        "{COPIES} binaries, budget {BUDGET}: at most {most} bytes scraped, peak {peak}, {evicted} evictions"
    );
    assert!(evicted > 0, "nothing was evicted\n{}", daemon.describe());
    if let Some(m) = last {
        assert!(
            cache_evictions(&m) > 0.0,
            "no evictions in the metrics\n{}",
            daemon.describe()
        );
    }
    assert!(peak <= BUDGET, "summary peak {peak} over {BUDGET}");
    let full = daemon
        .stderr_lines()
        .iter()
        .filter(|l| l.contains("memory budget ([limits] memory_bytes) is full"))
        .count();
    assert_eq!(
        full,
        1,
        "the budget's first eviction is logged once\n{}",
        daemon.describe()
    );

    // The answer: every copy's burn_a and burn_b named, 3:1.
    let files = read_profiles(&out, "cpu");
    assert!(files.len() >= 3, "{} cpu files", files.len());
    let samples = flatten_all(&files);
    let mut a = 0i64;
    let mut b = 0i64;
    let mut unnamed = 0i64;
    let mut copies_seen = 0;
    for exe in &copies {
        let comm = profiler_tests::workloads::comm_of(exe);
        let mine: Vec<_> = samples
            .iter()
            .filter(|s| s.label("comm") == Some(comm.as_str()))
            .collect();
        let count = |f: &str| -> i64 {
            mine.iter()
                .filter(|s| s.has_function(f))
                .map(|s| s.values[0])
                .sum()
        };
        let (ca, cb) = (count("burn_a"), count("burn_b"));
        let all: i64 = mine.iter().map(|s| s.values[0]).sum();
        if all > 0 {
            copies_seen += 1;
        }
        a += ca;
        b += cb;
        // Samples in the copy's own code that name no function of it.
        unnamed += mine
            .iter()
            .filter(|s| {
                !s.has_function("burn_a") && !s.has_function("burn_b") && !s.has_function("main")
            })
            .map(|s| s.values[0])
            .sum::<i64>();
    }
    let total = a + b;
    assert!(
        copies_seen >= COPIES * 9 / 10,
        "samples of {copies_seen} of {COPIES} copies"
    );
    assert!(total > 1000, "{total} samples in burn_a and burn_b");
    let share = a as f64 / total as f64;
    println!("burn_a {a}, burn_b {b}: {share:.3} (0.75 measured by the workload); {unnamed} other");
    assert!(
        (share - 0.75).abs() < 0.06,
        "burn_a's share {share:.3} is not the workload's 0.75"
    );
    assert!(
        (unnamed as f64) < 0.05 * (total + unnamed) as f64,
        "{unnamed} of {} samples name neither burn_a, burn_b nor main",
        total + unnamed
    );
}

/// Bytes per cache once every workload runs and has been sampled: the
/// last scrape before the workloads end.
fn held_by_caches(dir: &Path, exes: &[PathBuf]) -> Vec<f64> {
    let mut daemon = start_over(dir, exes, None);
    daemon.wait_ready();
    let addr = daemon.metrics_addr();
    // Past the first windows: every process sampled, its stacks symbolized.
    pause(Duration::from_secs(BURN_SECONDS - 2));
    let m = scrape(addr).expect("a scrape");
    daemon.wait_success(Duration::from_secs(60));
    CACHES
        .iter()
        .map(|c| m.value("profilerd_cache_bytes", &[("cache", c)]))
        .collect()
}

/// Figures for docs/BENCHMARKS.md: the cache bytes of one process, of
/// `COPIES` processes of one binary, and of `COPIES` distinct binaries,
/// under the default budget. Run with `--ignored --nocapture`.
#[test]
#[ignore]
fn cost_per_binary_and_process() {
    require_root();
    let tmp = temp_dir();
    let copies = build_copies(tmp.path(), COPIES);
    let one = std::slice::from_ref(&copies[0]);
    let same = vec![copies[0].clone(); COPIES];
    let runs = [
        ("1 binary, 1 process", held_by_caches(tmp.path(), one)),
        (
            "1 binary, many processes",
            held_by_caches(tmp.path(), &same),
        ),
        (
            "distinct binaries, as many processes",
            held_by_caches(tmp.path(), &copies),
        ),
    ];
    println!("| run | {} | total |", CACHES.join(" | "));
    for (what, bytes) in &runs {
        let cells: Vec<String> = bytes.iter().map(|b| format!("{b:.0}")).collect();
        println!(
            "| {what} | {} | {:.0} |",
            cells.join(" | "),
            bytes.iter().sum::<f64>()
        );
    }
    let per = |a: &[f64], b: &[f64]| -> Vec<String> {
        a.iter()
            .zip(b)
            .map(|(x, y)| format!("{:.0}", (x - y) / (COPIES - 1) as f64))
            .collect()
    };
    println!(
        "per tracked process: {:?}\nper distinct binary (besides its process): {:?}",
        per(&runs[1].1, &runs[0].1),
        per(&runs[2].1, &runs[1].1)
    );
}
