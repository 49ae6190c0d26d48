//! `--http-addr`: CPU profiles on demand at `/debug/pprof/profile`, the
//! way Go's `net/http/pprof` serves them, from a daemon already profiling
//! the whole node. `go tool pprof` fetches them by URL; they hold only the
//! processes asked for, in the split the workload measured; the scheduled
//! files are written as before; bad parameters, unknown processes, too
//! many captures at once and clients that go away get their answers.

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::http::get;
use profiler_tests::pprof_tool::{check_readable, go_binary};
use profiler_tests::profiles::{FlatSample, flatten, flatten_all, of_pid, read_profiles};
use profiler_tests::temp_dir;
use profiler_tests::workloads::{Running, Workload, field, parse_report};

/// |profiled share of burn_a - measured share| bound.
const SHARE_TOLERANCE: f64 = 0.05;

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

#[test]
fn a_process_profile_on_demand_from_a_daemon_profiling_the_node() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "pprof_burner");
    let noise_exe = Workload::CpuRatioC.build(tmp.path(), "pprof_noise");
    let out = tmp.path().join("out");
    let mut daemon = Daemon::start(&[
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
        "--cpu-frequency",
        "99",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    daemon.wait_ready();
    let addr = pprof_addr(&daemon);
    assert_eq!(daemon.metrics_addr(), addr, "one server for both");

    let mut target = Running::start(&exe, &["6", "--wait-stdin"]);
    let mut noise = Running::start(&noise_exe, &["6", "--wait-stdin"]);
    let pid = target.pid();
    target.release();
    noise.release();
    // What go tool pprof fetches (-proto: the profile as fetched, to read
    // here too; PPROF_TMPDIR: its own copy stays in the temporary dir).
    let url = format!("http://{addr}/debug/pprof/profile?seconds=4&pid={pid}");
    let fetched = Command::new(go_binary())
        .args(["tool", "pprof", "-proto", &url])
        .env("PPROF_TMPDIR", tmp.path())
        .env("HOME", tmp.path())
        .output()
        .expect("running go tool pprof");
    assert!(
        fetched.status.success(),
        "go tool pprof {url}: {}\n{}",
        String::from_utf8_lossy(&fetched.stderr),
        daemon.describe()
    );
    let file = tmp.path().join("fetched.pb.gz");
    std::fs::write(&file, &fetched.stdout).expect("writing the fetched profile");
    check_readable(&file, true);
    let profile = pprof_proto::decode(&fetched.stdout).expect("decoding the fetched profile");
    let samples = flatten(&profile);
    let report = parse_report(&target.finish(Duration::from_secs(20)), "pid");
    let _ = noise.finish(Duration::from_secs(20));

    let others: Vec<u32> = samples
        .iter()
        .map(FlatSample::pid)
        .filter(|&p| p != pid)
        .collect();
    let (a, b) = (cpu_in(&samples, "burn_a"), cpu_in(&samples, "burn_b"));
    let share = a as f64 / (a + b).max(1) as f64;
    let (measured_a, measured_b) = (field(&report, "a_ns") as f64, field(&report, "b_ns") as f64);
    let measured = measured_a / (measured_a + measured_b);
    let duration_s = profile.duration_nanos as f64 / 1e9;
    println!(
        "on demand, pid {pid}, 4 s: {} samples, burn_a's share {share:.3} (the program measured \
         {measured:.3}); {duration_s:.2} s long; {} samples of other processes",
        samples.len(),
        others.len()
    );
    assert!(others.is_empty(), "samples of other processes: {others:?}");
    assert!(
        (share - measured).abs() <= SHARE_TOLERANCE,
        "burn_a's share {share:.3}, measured {measured:.3}\n{}",
        daemon.describe()
    );
    assert!(
        (3.9..5.0).contains(&duration_s),
        "a 4 s capture lasted {duration_s:.2} s"
    );
    assert_eq!(
        profile.period,
        1_000_000_000 / 99,
        "the daemon's rate, as its files have it"
    );

    // Bad input: a one-line reason and the status.
    for (path, status) in [
        ("/debug/pprof/profile?seconds=abc", 400),
        ("/debug/pprof/profile?seconds=0", 400),
        ("/debug/pprof/profile?seconds=100000", 400),
        ("/debug/pprof/profile?pid=abc", 400),
        ("/debug/pprof/profile?hz=1000", 400),
        ("/debug/pprof/profile?debug=1", 400),
        ("/debug/pprof/profile?pid=999999999", 404),
        ("/debug/pprof/nothing", 404),
    ] {
        let (got, _, body) = get(addr, path);
        assert_eq!(got, status, "{path}: {body}");
        assert_eq!(
            body.trim_end().lines().count(),
            1,
            "{path}: one line: {body:?}"
        );
    }
    let (status, headers, body) = get(addr, "/debug/pprof/");
    assert_eq!(status, 200, "{body}");
    assert!(
        headers
            .get("content-type")
            .is_some_and(|t| t.starts_with("text/html")),
        "{headers:?}"
    );
    assert!(body.contains("href=\"profile?seconds="), "{body}");

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

    // The scheduled file holds the target's whole run as before.
    daemon.signal(libc::SIGINT);
    daemon.wait_success(Duration::from_secs(20));
    let scheduled = of_pid(&flatten_all(&read_profiles(&out, "cpu")), pid);
    let scheduled_ns: i64 = scheduled.iter().map(|s| s.cpu_ns).sum();
    println!("the scheduled file: {scheduled_ns} ns of pid {pid}");
    assert!(
        scheduled_ns as f64 >= 0.8 * 6e9,
        "the scheduled file holds {scheduled_ns} ns of the target's 6 s\n{}",
        daemon.describe()
    );
}
