//! `--push-url`: every profile also goes to a Grafana Pyroscope server
//! through its push API. A stand-in server (profiler_tests::pyroscope)
//! decodes each request with Pyroscope's published `.proto`, checks it by
//! the server's own rules and answers as the server does; the files the
//! daemon wrote are the truth the pushes are checked against (every window
//! of every type arrives, its values summed into bounded series). Then a
//! server that answers 503 and 429 at first (retries deliver everything),
//! one that refuses with 400 (dropped, counted, not retried), one that is
//! down (the daemon carries on), and settings refused at start.
//!
//! `PROFILERD_SAVE_GOLDEN=DIR` saves one accepted request per profile type
//! as golden files (tests/golden/push/ holds the committed ones).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::http::closed_port;
use profiler_tests::pprof_tool::check_readable;
use profiler_tests::profiles::{ProfileFile, dir_entries};
use profiler_tests::pyroscope::{Behaviour, Pyroscope, Received, save_golden};
use profiler_tests::sinks::{
    RUN_TIMEOUT, check_common_headers, check_refused_settings, files_of, mixed_run_files,
    run_daemon, sink_args, summary_count, totals, window_carriers,
};
use profiler_tests::workloads::{Running, Workload};
use profiler_tests::{pause, temp_dir};

/// The contract: SIGINT/SIGTERM → exit 0 within 5 s.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);
const KINDS: [&str; 5] = ["cpu", "heap", "block", "mutex", "offcpu"];
const TOKEN: &str = "tok-e2e-6f1c";

/// Pyroscope's `__name__` of each profile type.
fn profile_name(kind: &str) -> &'static str {
    match kind {
        "cpu" => "process_cpu",
        "heap" => "memory",
        "block" => "block",
        "mutex" => "mutex",
        "offcpu" => "offcpu",
        other => panic!("unknown kind {other}"),
    }
}

/// One accepted profile: its series labels and the profile.
struct Pushed {
    labels: BTreeMap<String, String>,
    profile: pprof_proto::Profile,
    raw: Vec<u8>,
    split: usize,
}

fn accepted(received: &[Received]) -> Vec<Pushed> {
    received
        .iter()
        .filter(|r| r.status == 200)
        .flat_map(|r| &r.stored)
        .map(|s| Pushed {
            labels: s.labels.iter().cloned().collect(),
            profile: s.profile.clone(),
            raw: s.raw.clone(),
            split: s.split.len(),
        })
        .collect()
}

/// Checks that `file`'s window arrived: the pushed profiles of its type
/// and window add up to the file's values, with the same sample and period
/// types; returns how many uploads carried it.
fn check_window_arrived(kind: &str, file: &ProfileFile, pushed: &[Pushed], diag: &str) -> usize {
    let name = profile_name(kind);
    let mine: Vec<&Pushed> = pushed
        .iter()
        .filter(|p| p.labels.get("__name__").map(String::as_str) == Some(name))
        .filter(|p| p.profile.time_nanos == file.profile.time_nanos)
        .collect();
    let Some(mine) = window_carriers(file, mine, diag) else {
        return 0;
    };
    let mut sum = vec![0i64; file.profile.sample_type.len()];
    for p in &mine {
        let types = |q: &pprof_proto::Profile| profiler_tests::profiles::sample_types(q);
        assert_eq!(types(&p.profile), types(&file.profile), "{}", file.name());
        assert_eq!(p.profile.period, file.profile.period, "{}", file.name());
        assert_eq!(p.profile.duration_nanos, file.profile.duration_nanos);
        for (a, v) in sum.iter_mut().zip(totals(&p.profile)) {
            *a += v;
        }
    }
    assert_eq!(
        sum,
        totals(&file.profile),
        "{}: pushed values differ from the file's{diag}",
        file.name()
    );
    mine.len()
}

fn args(
    out: &Path,
    config: Option<&Path>,
    url: &str,
    profiles: &str,
    interval: &str,
) -> Vec<String> {
    sink_args(out, config, ("--push-url", url), profiles, interval)
}

fn push_summary(daemon: &Daemon) -> String {
    profiler_tests::sinks::sink_summary(daemon, "push")
}

/// `go tool pprof -raw` reads every pushed profile.
fn check_with_pprof(pushed: &[Pushed], dir: &Path) {
    for (i, p) in pushed.iter().enumerate() {
        let path = dir.join(format!("pushed-{i}.pb.gz"));
        std::fs::write(&path, &p.raw).unwrap();
        check_readable(&path, true);
    }
}

/// A real run (CPU, malloc and a contended mutex) with all five profile
/// types every 2 s,
/// a tenant, a bearer token from a file, an extra header and at most 4
/// samples per upload: every request is one the server accepts (its
/// protobuf, its label and profile rules), every window of every type
/// arrives with its values, in one series per type (threads and locks
/// summed away), and the token is never logged.
#[test]
fn every_profile_type_reaches_pyroscope() {
    require_root();
    let tmp = temp_dir();
    let (exe, out, config) = mixed_run_files(tmp.path(), "push_mixed", TOKEN, |token| {
        format!(
            "[push]\ntenant = \"team-e2e\"\nbearer_token_file = {token:?}\n\
             max_samples = 4\nheaders = {{ \"X-Route\" = \"e2e\" }}\n"
        )
    });
    let pyroscope = Pyroscope::start(Behaviour {
        tenant: Some("team-e2e".into()),
        authorization: Some(format!("Bearer {TOKEN}")),
        ..Behaviour::default()
    });
    let mut args = args(
        &out,
        Some(&config),
        &pyroscope.url(),
        "cpu,heap,block,mutex,offcpu",
        "2s",
    );
    // About 5 s: three windows or more, with samples of every type.
    args.extend(
        ["--mutex-fraction", "1", "--", exe.to_str().unwrap(), "5"]
            .iter()
            .map(|s| s.to_string()),
    );
    let daemon = run_daemon(&args);

    let files = files_of(&out, &KINDS);
    let received = pyroscope.received();
    let diag = format!(
        "\nfiles: {:?}\nrefused: {:?}\nerrors: {:?}\n{}",
        dir_entries(&out),
        received
            .iter()
            .filter_map(|r| r.refusal.clone())
            .collect::<Vec<_>>(),
        pyroscope.errors(),
        daemon.describe()
    );
    assert!(pyroscope.errors().is_empty(), "{diag}");
    assert!(received.iter().all(|r| r.status == 200), "{diag}");
    for r in &received {
        check_common_headers(&r.http);
    }
    let pushed = accepted(&received);
    for kind in KINDS {
        let n = files.iter().filter(|(k, _)| k == kind).count();
        assert!(n >= 2, "expected at least 2 {kind} files, got {n}{diag}");
        let with_samples = files
            .iter()
            .filter(|(k, f)| k == kind && !f.profile.sample.is_empty())
            .count();
        assert!(with_samples >= 1, "no {kind} file with samples{diag}");
    }
    let mut uploads = 0;
    for (kind, file) in &files {
        uploads += check_window_arrived(kind, file, &pushed, &diag);
    }
    assert_eq!(uploads, pushed.len(), "pushes that match no file{diag}");
    assert_eq!(
        received.len(),
        pushed.len(),
        "one profile per request{diag}"
    );
    // The series: bounded labels, one series per type for one process.
    let mut series: BTreeMap<String, BTreeSet<Vec<(String, String)>>> = BTreeMap::new();
    for p in &pushed {
        assert!(
            p.profile.sample.len() <= 4,
            "max_samples: {}",
            p.profile.sample.len()
        );
        assert!(
            p.profile.sample.iter().all(|s| s.label.is_empty()),
            "sample labels pushed"
        );
        assert_eq!(p.split, 1, "the server would split {:?}", p.labels);
        for gone in [
            "pid",
            "tid",
            "comm",
            "thread",
            "lock",
            "cond",
            "container_id",
            "pod_uid",
        ] {
            assert!(!p.labels.contains_key(gone), "{gone} in {:?}", p.labels);
        }
        assert_eq!(p.labels.get("env").map(String::as_str), Some("e2e"));
        assert_eq!(
            p.labels.get("team_name").map(String::as_str),
            Some("profiling")
        );
        assert!(p.labels.get("service_name").is_some_and(|s| !s.is_empty()));
        let name = p.labels["__name__"].clone();
        assert_eq!(
            p.labels.get("__delta__").map(String::as_str),
            (name == "memory").then_some("false"),
            "{:?}",
            p.labels
        );
        series
            .entry(name)
            .or_default()
            .insert(p.labels.clone().into_iter().collect());
    }
    for kind in KINDS {
        let sets = series.get(profile_name(kind)).map_or(0, BTreeSet::len);
        assert_eq!(
            sets,
            1,
            "{kind}: series {:?}{diag}",
            series.get(profile_name(kind))
        );
    }
    // Chunks: some window was cut into several uploads.
    assert!(
        pushed.len()
            > files
                .iter()
                .filter(|(_, f)| !f.profile.sample.is_empty())
                .count()
    );
    check_with_pprof(&pushed, tmp.path());
    assert!(
        daemon.stderr_lines().iter().all(|l| !l.contains(TOKEN)),
        "the token was logged\n{}",
        daemon.describe()
    );
    let summary = push_summary(&daemon);
    assert_eq!(summary_count(&summary, "uploads sent"), pushed.len() as u64);
    assert_eq!(summary_count(&summary, "dropped"), 0, "{summary}");
    if let Some(dir) = std::env::var_os("PROFILERD_SAVE_GOLDEN") {
        save_goldens(Path::new(&dir), &received);
    }
    println!(
        "{} files, {} uploads in {} series accepted; {summary}",
        files.len(),
        pushed.len(),
        series.values().map(BTreeSet::len).sum::<usize>()
    );
}

/// The smallest accepted request of each profile type, as golden files.
fn save_goldens(dir: &Path, received: &[Received]) {
    for kind in KINDS {
        let name = profile_name(kind);
        let smallest = received
            .iter()
            .filter(|r| r.status == 200)
            .filter(|r| {
                r.stored[0]
                    .labels
                    .iter()
                    .any(|(k, v)| k == "__name__" && v == name)
            })
            .min_by_key(|r| r.http.body.len())
            .unwrap_or_else(|| panic!("no {kind} request"));
        save_golden(dir, kind, smallest);
    }
}

/// A server that answers 503, then 429 (Connect's unavailable and
/// resource_exhausted): the daemon retries with backoff and every window
/// still arrives once; each failure is logged once.
#[test]
fn retries_after_server_errors() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "push_retry_burner");
    let out = tmp.path().join("out");
    let pyroscope = Pyroscope::start(Behaviour {
        fail_first: vec!["unavailable", "resource_exhausted", "unavailable"],
        ..Behaviour::default()
    });
    let mut args = args(&out, None, &pyroscope.url(), "cpu", "1s");
    args.extend(
        ["--", exe.to_str().unwrap(), "4"]
            .iter()
            .map(|s| s.to_string()),
    );
    let daemon = run_daemon(&args);

    let files = files_of(&out, &["cpu"]);
    let received = pyroscope.received();
    let diag = format!(
        "\n{:?}\n{}",
        received.iter().map(|r| r.status).collect::<Vec<_>>(),
        daemon.describe()
    );
    assert!(files.len() >= 3, "{} files{diag}", files.len());
    let statuses: Vec<u16> = received.iter().take(3).map(|r| r.status).collect();
    assert_eq!(statuses, [503, 429, 503], "{diag}");
    assert!(received[3..].iter().all(|r| r.status == 200), "{diag}");
    let pushed = accepted(&received);
    let mut uploads = 0;
    for (kind, file) in &files {
        uploads += check_window_arrived(kind, file, &pushed, &diag);
    }
    assert_eq!(uploads, pushed.len(), "{diag}");
    let lines = daemon.stderr_lines();
    for status in ["server answered 503", "server answered 429"] {
        let n = lines.iter().filter(|l| l.contains(status)).count();
        assert_eq!(n, 1, "'{status}' should be logged once{diag}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("unavailable: scripted failure")),
        "the Connect error is read{diag}"
    );
    let summary = push_summary(&daemon);
    assert_eq!(summary_count(&summary, "uploads sent"), pushed.len() as u64);
    assert_eq!(summary_count(&summary, "dropped"), 0, "{summary}");
    assert_eq!(summary_count(&summary, "failed requests"), 3, "{summary}");
    println!("{} files, 3 refused then accepted; {summary}", files.len());
}

/// A 400 (invalid_argument) is the server's final word: that upload is
/// dropped, counted and logged, never retried; the others arrive, with
/// basic auth from the URL's userinfo, whose password is never logged.
#[test]
fn refusals_are_not_retried() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "push_refused_burner");
    let out = tmp.path().join("out");
    // Basic auth from the URL's userinfo: "user:hunter2".
    let pyroscope = Pyroscope::start(Behaviour {
        fail_first: vec!["invalid_argument"],
        authorization: Some("Basic dXNlcjpodW50ZXIy".into()),
        ..Behaviour::default()
    });
    let url = pyroscope.url().replace("http://", "http://user:hunter2@");
    let mut args = args(&out, None, &url, "cpu", "1s");
    args.extend(
        ["--", exe.to_str().unwrap(), "3"]
            .iter()
            .map(|s| s.to_string()),
    );
    let daemon = run_daemon(&args);

    let received = pyroscope.received();
    let files = files_of(&out, &["cpu"]);
    let with_samples = files
        .iter()
        .filter(|(_, f)| !f.profile.sample.is_empty())
        .count();
    let diag = format!("\n{}", daemon.describe());
    assert_eq!(received[0].status, 400, "{diag}");
    assert_eq!(
        received.len(),
        with_samples,
        "one request per window, none retried{diag}"
    );
    assert!(received[1..].iter().all(|r| r.status == 200), "{diag}");
    let summary = push_summary(&daemon);
    assert_eq!(summary_count(&summary, "rejected"), 1, "{summary}");
    assert_eq!(summary_count(&summary, "dropped"), 1, "{summary}");
    let logged = daemon
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("server answered 400") && l.contains("invalid_argument"))
        .count();
    assert_eq!(logged, 1, "{diag}");
    // The password is sent, never shown.
    let lines = daemon.stderr_lines();
    assert!(lines.iter().all(|l| !l.contains("hunter2")), "{diag}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("pushing every profile to {}", pyroscope.url()))),
        "{diag}"
    );
}

/// Nobody listens at the push URL: the daemon runs as usual, writes every
/// file, drops each upload (counted), logs the failures once per kind, and
/// on SIGINT still exits 0 within the contract's 5 s, queue and all.
#[test]
fn server_down_drops_and_carries_on() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "push_down_burner");
    let out = tmp.path().join("out");
    let url = format!("http://127.0.0.1:{}", closed_port());
    let mut burner = Running::start(&exe, &["30"]);
    let mut args = args(&out, None, &url, "cpu", "1s");
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
    let with_samples = files
        .iter()
        .filter(|(_, f)| !f.profile.sample.is_empty())
        .count();
    assert!(
        files.len() >= 4,
        "{} files\n{}",
        files.len(),
        daemon.describe()
    );
    assert!(with_samples > 0, "no samples at all\n{}", daemon.describe());
    let summary = push_summary(&daemon);
    assert_eq!(summary_count(&summary, "uploads sent"), 0, "{summary}");
    // One process: one upload per window with samples.
    assert_eq!(
        summary_count(&summary, "dropped"),
        with_samples as u64,
        "every upload is counted as dropped: {summary}"
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

/// Push settings the daemon cannot use are a one-line error and exit
/// status 2 before anything is written; a password is never echoed.
#[test]
fn bad_push_settings_are_rejected() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let config = |name: &str, text: &str| -> PathBuf {
        let path = tmp.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let missing = tmp.path().join("no-such-token");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--push-url".into(), "ftp://example.com/".into()],
            "--push-url",
        ),
        (
            vec!["--push-url".into(), "localhost:4040".into()],
            "--push-url",
        ),
        (
            vec!["--push-url".into(), "ftp://u:hunter2@h/".into()],
            "--push-url",
        ),
        (
            vec![
                "--push-url".into(),
                "http://h".into(),
                "--config".into(),
                config(
                    "a.toml",
                    &format!("[push]\nbearer_token_file = {missing:?}\n"),
                )
                .display()
                .to_string(),
            ],
            "push.bearer_token_file",
        ),
        (
            vec![
                "--push-url".into(),
                "http://h".into(),
                "--config".into(),
                config("b.toml", "[push]\nheaders = { \"Bad Name\" = \"x\" }\n")
                    .display()
                    .to_string(),
            ],
            "push.headers",
        ),
        (
            vec![
                "--push-url".into(),
                "http://h".into(),
                "--interval".into(),
                "1h".into(),
            ],
            "push.reject_older_than",
        ),
    ];
    check_refused_settings(&out, &cases, "hunter2");
}
