//! `--push-url`: every profile file also goes to a Pyroscope-style
//! `/ingest` endpoint. A receiver in this test stands in for the server and
//! records each request; the files the daemon wrote are the truth the
//! requests are checked against (same bytes, window times, name, form
//! fields). Then a server that answers 503 at first (retries deliver
//! everything) and one that is down (the daemon carries on, writes its
//! files, counts the drops).

use std::path::Path;
use std::time::{Duration, Instant};

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::http::{Received, Receiver, closed_port};
use profiler_tests::profiles::{ProfileFile, dir_entries, read_profiles, sample_types};
use profiler_tests::workloads::{Running, Workload};
use profiler_tests::{pause, temp_dir};

/// Bound on a run whose command works for a few seconds, shutdown grace
/// included.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// The contract: SIGINT/SIGTERM → exit 0 within 5 s.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);
const LABELS: [&str; 2] = ["env=e2e", "team=profiling"];
const APP_NAME: &str = "profilerd{env=e2e,team=profiling}";
const KINDS: [&str; 5] = ["cpu", "heap", "block", "mutex", "offcpu"];

/// Every profile file in `dir` of the given kinds.
fn files_of(dir: &Path, kinds: &[&str]) -> Vec<(String, ProfileFile)> {
    let mut all = Vec::new();
    for kind in kinds {
        for f in read_profiles(dir, kind) {
            all.push((kind.to_string(), f));
        }
    }
    all
}

/// The window's Unix seconds as the daemon must send them: start rounded
/// down, end rounded up.
fn window_seconds(f: &ProfileFile) -> (u64, u64) {
    let start = f.profile.time_nanos as u64;
    let end = start + f.profile.duration_nanos as u64;
    let from = start / 1_000_000_000;
    let until = end.div_ceil(1_000_000_000).max(from + 1);
    (from, until)
}

/// Checks that `file` arrived exactly once, accepted, as a well-formed
/// ingest request, and returns that request.
fn check_received(kind: &str, file: &ProfileFile, requests: &[Received], diag: &str) -> Received {
    let bytes = std::fs::read(&file.path).unwrap();
    let name = file.name();
    let accepted: Vec<&Received> = requests
        .iter()
        .filter(|r| r.status == 200 && r.parts.get("profile") == Some(&bytes))
        .collect();
    assert_eq!(
        accepted.len(),
        1,
        "{name} ({} bytes) should have been accepted exactly once with the same bytes{diag}",
        bytes.len()
    );
    let r = accepted[0].clone();
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/ingest"));
    assert!(
        r.content_type.starts_with("multipart/form-data; boundary="),
        "{name}: content type {}",
        r.content_type
    );
    let (from, until) = window_seconds(file);
    let q = |k: &str| r.query.get(k).map(String::as_str);
    assert_eq!(q("format"), Some("pprof"), "{name}: {:?}", r.query);
    assert_eq!(q("name"), Some(APP_NAME), "{name}: {:?}", r.query);
    assert_eq!(
        (q("from"), q("until")),
        (
            Some(from.to_string().as_str()),
            Some(until.to_string().as_str())
        ),
        "{name}: from/until against the file's window ({} ns + {} ns)",
        file.profile.time_nanos,
        file.profile.duration_nanos
    );
    // The body decodes as the same pprof (gunzip + protobuf).
    let pushed = pprof_proto::decode(&r.parts["profile"]).expect("pushed body decodes");
    assert_eq!(pushed, file.profile, "{name}: decoded body");
    // Block and mutex share their sample types: the form names them.
    let config = r
        .parts
        .get("sample_type_config")
        .map(|c| String::from_utf8_lossy(c).into_owned());
    match kind {
        "block" | "mutex" => {
            let config = config.unwrap_or_else(|| panic!("{name}: no sample_type_config"));
            for field in ["count", "duration"] {
                assert!(
                    config.contains(&format!("\"display-name\":\"{kind}_{field}\"")),
                    "{name}: sample_type_config {config}"
                );
            }
        }
        _ => assert!(config.is_none(), "{name}: unexpected config {config:?}"),
    }
    r
}

fn run_daemon(args: &[String]) -> Daemon {
    let mut daemon = Daemon::start(args);
    daemon.wait_ready();
    let status = daemon.wait_exit(RUN_TIMEOUT);
    assert!(
        status.success(),
        "profilerd exited with {status}\n{}",
        daemon.describe()
    );
    daemon
}

fn base_args(out: &Path, url: &str, profiles: &str, interval: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "--output-dir",
        out.to_str().unwrap(),
        "--profiles",
        profiles,
        "--interval",
        interval,
        "--push-url",
        url,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for l in LABELS {
        args.extend(["--label".to_string(), l.to_string()]);
    }
    args
}

/// The exit summary's line about the push.
fn push_summary(daemon: &Daemon) -> String {
    daemon
        .stderr_lines()
        .into_iter()
        .find(|l| l.contains("push: ") && l.contains("profiles sent"))
        .unwrap_or_else(|| panic!("no push summary\n{}", daemon.describe()))
}

/// A number that the summary gives before `what`: "... 3 profiles sent".
fn summary_count(summary: &str, what: &str) -> u64 {
    let at = summary
        .find(what)
        .unwrap_or_else(|| panic!("no '{what}' in {summary:?}"));
    summary[..at]
        .split_whitespace()
        .last()
        .and_then(|n| n.trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("no count before '{what}' in {summary:?}"))
}

/// A real run (a mutex ping-pong) with all five profile types every 2 s:
/// every file written arrives byte-identical, once, with the window's
/// from/until and the labels in the name, and the form that tells
/// Pyroscope its type.
#[test]
fn every_written_profile_is_pushed() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::MutexHold.build(tmp.path(), "push_mutex_hold");
    let out = tmp.path().join("out");
    let receiver = Receiver::start(0);
    let mut args = base_args(&out, &receiver.url(), "cpu,heap,block,mutex,offcpu", "2s");
    args.extend(
        ["--mutex-fraction", "1", "--", exe.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string()),
    );
    // 2500 holds of 2 ms: about 5 s, three windows or more.
    args.extend(["--iterations".to_string(), "2500".to_string()]);
    let daemon = run_daemon(&args);

    let files = files_of(&out, &KINDS);
    let requests = receiver.requests();
    let diag = format!(
        "\nfiles: {:?}\nrequests: {:?}\nreceiver errors: {:?}\n{}",
        dir_entries(&out),
        requests
            .iter()
            .map(|r| (
                r.status,
                r.query.clone(),
                r.parts.keys().collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>(),
        receiver.errors(),
        daemon.describe()
    );
    assert!(receiver.errors().is_empty(), "{diag}");
    for kind in KINDS {
        let n = files.iter().filter(|(k, _)| k == kind).count();
        assert!(n >= 2, "expected at least 2 {kind} files, got {n}{diag}");
    }
    assert_eq!(
        requests.len(),
        files.len(),
        "one request per file, no retries against a healthy server{diag}"
    );
    for (kind, file) in &files {
        let r = check_received(kind, file, &requests, &diag);
        // The pushed profile is the kind it claims.
        let first = sample_types(&pprof_proto::decode(&r.parts["profile"]).unwrap())[0].clone();
        let want = match kind.as_str() {
            "cpu" => "samples",
            "heap" => "alloc_objects",
            "offcpu" => "events",
            _ => "contentions",
        };
        assert_eq!(first.0, want, "{}", file.name());
    }
    let with_samples = files
        .iter()
        .filter(|(k, f)| k == "mutex" && !f.profile.sample.is_empty())
        .count();
    assert!(with_samples >= 1, "no mutex file with samples{diag}");
    let summary = push_summary(&daemon);
    assert_eq!(summary_count(&summary, "profiles sent"), files.len() as u64);
    assert_eq!(summary_count(&summary, "dropped"), 0, "{summary}");
    println!(
        "{} files pushed byte-identical ({} bytes in all); {summary}",
        files.len(),
        files
            .iter()
            .map(|(_, f)| std::fs::metadata(&f.path).unwrap().len())
            .sum::<u64>()
    );
}

/// A server that answers 503 to its first 3 requests: the daemon retries
/// with backoff and every file still arrives, once accepted; the failure is
/// logged once, not per request.
#[test]
fn retries_after_server_errors() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "push_retry_burner");
    let out = tmp.path().join("out");
    let receiver = Receiver::start(3);
    let mut args = base_args(&out, &receiver.url(), "cpu", "1s");
    args.extend(
        ["--", exe.to_str().unwrap(), "4"]
            .iter()
            .map(|s| s.to_string()),
    );
    let daemon = run_daemon(&args);

    let files = files_of(&out, &["cpu"]);
    let requests = receiver.requests();
    let diag = format!(
        "\nrequests: {:?}\n{}",
        requests
            .iter()
            .map(|r| (r.status, r.query.clone()))
            .collect::<Vec<_>>(),
        daemon.describe()
    );
    assert!(files.len() >= 3, "{} files{diag}", files.len());
    let refused = requests.iter().filter(|r| r.status == 503).count();
    assert_eq!(refused, 3, "{diag}");
    for (kind, file) in &files {
        check_received(kind, file, &requests, &diag);
    }
    assert_eq!(requests.len(), files.len() + 3, "{diag}");
    let warnings = daemon
        .stderr_lines()
        .into_iter()
        // Not just "503": file names carry the time, which can hold it.
        .filter(|l| l.contains("server answered 503"))
        .count();
    assert_eq!(warnings, 1, "the 503s should be logged once{diag}");
    let summary = push_summary(&daemon);
    assert_eq!(summary_count(&summary, "profiles sent"), files.len() as u64);
    assert_eq!(summary_count(&summary, "dropped"), 0, "{summary}");
    assert_eq!(summary_count(&summary, "failed requests"), 3, "{summary}");
    println!("{} files, 3 refused then accepted; {summary}", files.len());
}

/// Nobody listens at the push URL: the daemon runs as usual, writes every
/// file, drops each profile (counted), logs the failures once per kind, and
/// on SIGINT still exits 0 within the contract's 5 s, queue and all.
#[test]
fn server_down_drops_and_carries_on() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "push_down_burner");
    let out = tmp.path().join("out");
    let url = format!("http://127.0.0.1:{}", closed_port());
    let mut burner = Running::start(&exe, &["30"]);
    let mut args = base_args(&out, &url, "cpu", "1s");
    args.extend(["--pid".to_string(), burner.pid().to_string()]);
    let mut daemon = Daemon::start(&args);
    daemon.wait_ready();
    pause(Duration::from_millis(4500));
    daemon.signal(libc::SIGINT);
    let signalled = Instant::now();
    let status = daemon.wait_exit(RUN_TIMEOUT);
    let took = signalled.elapsed();
    burner.kill();
    assert!(status.success(), "exit {status}\n{}", daemon.describe());
    assert!(
        took <= SHUTDOWN_BOUND,
        "exit took {took:?} after SIGINT (bound {SHUTDOWN_BOUND:?})\n{}",
        daemon.describe()
    );

    let files = files_of(&out, &["cpu"]);
    assert!(
        files.len() >= 4,
        "{} files\n{}",
        files.len(),
        daemon.describe()
    );
    assert!(
        files.iter().any(|(_, f)| !f.profile.sample.is_empty()),
        "no samples at all\n{}",
        daemon.describe()
    );
    let summary = push_summary(&daemon);
    assert_eq!(summary_count(&summary, "profiles sent"), 0, "{summary}");
    assert_eq!(
        summary_count(&summary, "dropped"),
        files.len() as u64,
        "every written profile is counted as dropped: {summary}"
    );
    let warnings = daemon
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("WARN") && l.contains("pushing to"))
        .collect::<Vec<_>>();
    assert!(
        !warnings.is_empty() && warnings.len() <= 3,
        "failures are logged once per kind (connection, give-up, shutdown): {warnings:#?}"
    );
    println!(
        "{} files written, exit {took:?} after SIGINT; {summary}",
        files.len()
    );
}

/// A URL the daemon cannot use is a one-line error and exit status 2,
/// before anything is written.
#[test]
fn bad_push_url_is_rejected() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    for url in ["ftp://example.com/", "localhost:4040", "http://"] {
        let mut daemon = Daemon::start(&[
            "--output-dir",
            out.to_str().unwrap(),
            "--push-url",
            url,
            "--duration",
            "1s",
        ]);
        let status = daemon.wait_exit(Duration::from_secs(10));
        let lines = daemon.stderr_lines();
        assert_eq!(status.code(), Some(2), "{url}: {}", daemon.describe());
        assert_eq!(lines.len(), 1, "{url}: {lines:?}");
        assert!(
            lines[0].contains("--push-url") && lines[0].contains(url),
            "{url}: {lines:?}"
        );
        assert!(!out.exists(), "{url}: the output directory was created");
    }
}
