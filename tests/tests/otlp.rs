//! `--otlp-endpoint`: every profile is also exported as OpenTelemetry's
//! profiles signal (OTLP/HTTP, `v1development`). A stand-in receiver
//! (profiler_tests::otlp) decodes each request with code generated from the
//! published `.proto` files, checks it by the proto's and the protocol's
//! rules and answers as an OTLP/HTTP server does; the files the daemon
//! wrote in the same run are the truth the exports are checked against
//! (every window of every type arrives with its values; the workload's
//! functions hold the same shares). Then a receiver that throttles (503,
//! 429 with `Retry-After`, 502: retried), one that refuses with 400 (not
//! retried) and answers a partial success (counted), and settings refused
//! at start.
//!
//! `PROFILERD_SAVE_GOLDEN=DIR` saves one accepted request per profile type
//! as golden files (tests/golden/otlp/ holds the committed ones).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::otlp::flat::{FlatSample, flatten};
use profiler_tests::otlp::{Behaviour, Received, Receiver};
use profiler_tests::profiles::{ProfileFile, dir_entries, function_matches, sample_types};
use profiler_tests::sinks::{
    check_common_headers, check_refused_settings, files_of, mixed_run_files, run_daemon, sink_args,
    sink_summary, summary_count, totals, window_carriers,
};
use profiler_tests::standin::save_golden;
use profiler_tests::temp_dir;
use profiler_tests::workloads::Workload;

const KINDS: [&str; 5] = ["cpu", "heap", "block", "mutex", "offcpu"];
const TOKEN: &str = "tok-otlp-9b2e";
/// |share of a function in the export − its share in the files|.
const SHARE_TOLERANCE: f64 = 0.01;

fn args(
    out: &Path,
    config: Option<&Path>,
    url: &str,
    profiles: &str,
    interval: &str,
) -> Vec<String> {
    sink_args(out, config, ("--otlp-endpoint", url), profiles, interval)
}

fn with_command(mut args: Vec<String>, command: &[&str]) -> Vec<String> {
    args.push("--".into());
    args.extend(command.iter().map(|s| s.to_string()));
    args
}

/// The samples of every accepted request.
fn exported(received: &[Received]) -> Vec<FlatSample> {
    received
        .iter()
        .filter_map(|r| r.request.as_ref())
        .flat_map(flatten)
        .collect()
}

/// Checks that `file`'s window arrived: the exported samples of its type
/// and window add up, per sample type, to the file's values, with its
/// period and duration; returns how many requests carried it.
fn check_window_arrived(
    kind: &str,
    file: &ProfileFile,
    received: &[Received],
    diag: &str,
) -> usize {
    let time = file.profile.time_nanos as u64;
    let requests: Vec<Vec<FlatSample>> = received
        .iter()
        .filter_map(|r| r.request.as_ref())
        .map(flatten)
        .filter(|s| {
            s.iter()
                .any(|s| s.profile_type == kind && s.time_unix_nano == time)
        })
        .collect();
    let Some(requests) = window_carriers(file, requests, diag) else {
        return 0;
    };
    let samples: Vec<&FlatSample> = requests.iter().flatten().collect();
    let types = sample_types(&file.profile);
    let want = totals(&file.profile);
    for (t, total) in types.iter().zip(want) {
        let got: i64 = samples
            .iter()
            .filter(|s| s.sample_type == *t)
            .map(|s| s.value)
            .sum();
        assert_eq!(
            got,
            total,
            "{}: {t:?} differs from the file's{diag}",
            file.name()
        );
    }
    for s in &samples {
        assert!(types.contains(&s.sample_type), "{:?}", s.sample_type);
        assert_eq!(s.period, file.profile.period, "{}", file.name());
        assert_eq!(s.duration_nano as i64, file.profile.duration_nanos);
    }
    requests.len()
}

fn diag(out: &Path, receiver: &Receiver, daemon: &Daemon) -> String {
    format!(
        "\nfiles: {:?}\nrefused: {:?}\nerrors: {:?}\n{}",
        dir_entries(out),
        receiver
            .received()
            .iter()
            .filter_map(|r| r.refusal.clone())
            .collect::<Vec<_>>(),
        receiver.errors(),
        daemon.describe()
    )
}

/// A real run (CPU, malloc and a contended mutex) with all five profile
/// types every 2 s, a bearer token from a file and an extra header: every
/// request is one the published proto's rules accept, every window of
/// every type arrives with its values, a resource per process carries the
/// process and the static labels, and the token is never logged.
#[test]
fn every_profile_type_reaches_the_receiver() {
    require_root();
    let tmp = temp_dir();
    let (exe, out, config) = mixed_run_files(tmp.path(), "otlp_mixed", TOKEN, |token| {
        format!("[otlp]\nbearer_token_file = {token:?}\nheaders = {{ \"X-Route\" = \"e2e\" }}\n")
    });
    let receiver = Receiver::start(Behaviour {
        authorization: Some(format!("Bearer {TOKEN}")),
        ..Behaviour::default()
    });
    let args = args(&out, Some(&config), &receiver.url(), &KINDS.join(","), "2s");
    let args = with_command(
        [args, vec!["--mutex-fraction".into(), "1".into()]].concat(),
        &[exe.to_str().unwrap(), "5"],
    );
    let daemon = run_daemon(&args);

    let files = files_of(&out, &KINDS);
    let received = receiver.received();
    let diag = diag(&out, &receiver, &daemon);
    assert!(receiver.errors().is_empty(), "{diag}");
    assert!(received.iter().all(|r| r.status == 200), "{diag}");
    for r in &received {
        check_common_headers(&r.http);
        assert_eq!(
            r.http.headers.get("content-encoding").map(String::as_str),
            Some("gzip")
        );
    }
    let mut requests = 0;
    for kind in KINDS {
        let with_samples = files
            .iter()
            .filter(|(k, f)| k == kind && !f.profile.sample.is_empty())
            .count();
        assert!(with_samples >= 1, "no {kind} file with samples{diag}");
    }
    for (kind, file) in &files {
        requests += check_window_arrived(kind, file, &received, &diag);
    }
    assert_eq!(
        requests,
        received.len(),
        "one request per window and type{diag}"
    );
    let samples = exported(&received);
    for s in &samples {
        let r = &s.resource;
        assert!(
            r.get("service.name").is_some_and(|v| !v.is_empty()),
            "{r:?}"
        );
        assert_eq!(r.get("env").map(String::as_str), Some("e2e"), "{r:?}");
        assert_eq!(r.get("team.name").map(String::as_str), Some("profiling"));
        for gone in ["pid", "tid", "comm", "thread"] {
            assert!(
                !s.attributes.contains_key(gone),
                "{gone} in {:?}",
                s.attributes
            );
        }
    }
    // The workload's process is a resource of its own.
    let pids: std::collections::BTreeSet<&str> = samples
        .iter()
        .filter_map(|s| s.resource.get("process.pid").map(String::as_str))
        .collect();
    assert!(!pids.is_empty(), "no process.pid{diag}");
    assert!(
        samples
            .iter()
            .any(|s| s.profile_type == "cpu" && s.attributes.contains_key("thread.id")),
        "no thread.id on cpu samples{diag}"
    );
    assert!(
        daemon.stderr_lines().iter().all(|l| !l.contains(TOKEN)),
        "the token was logged\n{}",
        daemon.describe()
    );
    let summary = sink_summary(&daemon, "otlp");
    assert_eq!(
        summary_count(&summary, "uploads sent"),
        received.len() as u64
    );
    assert_eq!(summary_count(&summary, "dropped"), 0, "{summary}");
    if let Some(dir) = std::env::var_os("PROFILERD_SAVE_GOLDEN") {
        save_goldens(Path::new(&dir), &received);
    }
    println!(
        "{} files, {} requests, {} samples accepted; {summary}",
        files.len(),
        received.len(),
        samples.len()
    );
}

/// The smallest accepted request of each profile type, as golden files.
fn save_goldens(dir: &Path, received: &[Received]) {
    for kind in KINDS {
        let smallest = received
            .iter()
            .filter(|r| {
                r.request
                    .as_ref()
                    .is_some_and(|q| flatten(q).iter().any(|s| s.profile_type == kind))
            })
            .min_by_key(|r| r.http.body.len())
            .unwrap_or_else(|| panic!("no {kind} request"));
        save_golden(
            dir,
            kind,
            &smallest.http,
            &["content-type", "content-encoding"],
        );
    }
}

/// A run of the CPU burner for `seconds`, cpu profiles every second,
/// exported to a receiver that behaves as `behaviour` at the endpoint
/// `endpoint` makes of its base URL: the files, what the receiver got, the
/// daemon and a diagnosis for failures.
struct BurnerRun {
    files: Vec<(String, ProfileFile)>,
    received: Vec<Received>,
    receiver: Receiver,
    daemon: Daemon,
    diag: String,
    _tmp: tempfile::TempDir,
}

fn burner_run(
    name: &str,
    behaviour: Behaviour,
    seconds: &str,
    endpoint: impl Fn(&str) -> String,
) -> BurnerRun {
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), name);
    let out = tmp.path().join("out");
    let receiver = Receiver::start(behaviour);
    let args = with_command(
        args(&out, None, &endpoint(&receiver.url()), "cpu", "1s"),
        &[exe.to_str().unwrap(), seconds],
    );
    let daemon = run_daemon(&args);
    let files = files_of(&out, &["cpu"]);
    let received = receiver.received();
    let diag = diag(&out, &receiver, &daemon);
    BurnerRun {
        files,
        received,
        receiver,
        daemon,
        diag,
        _tmp: tmp,
    }
}

/// Each function's share of the CPU time (samples that hold it, over all).
fn shares<'a>(samples: impl Iterator<Item = (&'a [String], i64)>, names: &[&str]) -> Vec<f64> {
    let mut total = 0i64;
    let mut with = vec![0i64; names.len()];
    for (functions, value) in samples {
        total += value;
        for (i, name) in names.iter().enumerate() {
            if functions.iter().any(|f| function_matches(f, name)) {
                with[i] += value;
            }
        }
    }
    with.iter()
        .map(|&v| v as f64 / total.max(1) as f64)
        .collect()
}

/// The CPU burner's functions (burn_a and burn_b, 3:1) hold the same share
/// of the exported CPU time as of the files' over the same windows, and
/// its samples carry its pid as `process.pid`.
#[test]
fn cpu_shares_match_the_files() {
    require_root();
    let BurnerRun {
        files,
        received,
        diag,
        ..
    } = burner_run(
        "otlp_ratio_burner",
        Behaviour::default(),
        "4",
        str::to_owned,
    );
    assert!(received.iter().all(|r| r.status == 200), "{diag}");
    let names = ["burn_a", "burn_b", "main"];
    let flat_files: Vec<(Vec<String>, i64)> = files
        .iter()
        .flat_map(|(_, f)| profiler_tests::profiles::flatten(&f.profile))
        .map(|s| {
            (
                s.frames.iter().map(|f| f.function.clone()).collect(),
                s.cpu_ns,
            )
        })
        .collect();
    let want = shares(flat_files.iter().map(|(f, v)| (f.as_slice(), *v)), &names);
    let samples: Vec<FlatSample> = exported(&received)
        .into_iter()
        .filter(|s| s.sample_type == ("cpu".to_owned(), "nanoseconds".to_owned()))
        .collect();
    let got = shares(
        samples.iter().map(|s| (s.functions.as_slice(), s.value)),
        &names,
    );
    println!("shares of {names:?}: files {want:.4?}, export {got:.4?}");
    assert!(
        want[0] > 0.3,
        "burn_a is {:.3} of the files' cpu{diag}",
        want[0]
    );
    for ((name, w), g) in names.iter().zip(&want).zip(&got) {
        assert!(
            (w - g).abs() <= SHARE_TOLERANCE,
            "{name}: {g:.4} of the export, {w:.4} of the files{diag}"
        );
    }
    // burn_a's samples are the burner's: its resource has its pid.
    let burner: BTreeMap<String, usize> = samples
        .iter()
        .filter(|s| s.functions.iter().any(|f| function_matches(f, "burn_a")))
        .filter_map(|s| s.resource.get("process.pid").cloned())
        .fold(BTreeMap::new(), |mut m, pid| {
            *m.entry(pid).or_default() += 1;
            m
        });
    assert_eq!(
        burner.len(),
        1,
        "burn_a in several processes: {burner:?}{diag}"
    );
    let burner_exe = samples
        .iter()
        .find(|s| s.functions.iter().any(|f| function_matches(f, "burn_a")))
        .and_then(|s| s.resource.get("process.executable.name").cloned());
    assert!(burner_exe.is_some(), "no process.executable.name{diag}");
}

/// A receiver that throttles (503 and 429 with `Retry-After: 1`, then a
/// 502): the daemon retries and every window still arrives once; each
/// failure is logged once and counted.
#[test]
fn retries_after_throttling() {
    require_root();
    let behaviour = Behaviour {
        fail_first: vec![503, 429, 502],
        ..Behaviour::default()
    };
    let BurnerRun {
        files,
        received,
        daemon,
        diag,
        ..
    } = burner_run("otlp_retry_burner", behaviour, "4", str::to_owned);
    let statuses: Vec<u16> = received.iter().take(3).map(|r| r.status).collect();
    assert_eq!(statuses, [503, 429, 502], "{diag}");
    assert!(received[3..].iter().all(|r| r.status == 200), "{diag}");
    let mut requests = 0;
    for (kind, file) in &files {
        requests += check_window_arrived(kind, file, &received, &diag);
    }
    assert_eq!(requests, received.len() - 3, "{diag}");
    let lines = daemon.stderr_lines();
    for status in [
        "server answered 503",
        "server answered 429",
        "server answered 502",
    ] {
        let n = lines.iter().filter(|l| l.contains(status)).count();
        assert_eq!(n, 1, "'{status}' should be logged once{diag}");
    }
    assert!(
        lines.iter().any(|l| l.contains("scripted failure")),
        "the google.rpc.Status message is read{diag}"
    );
    let summary = sink_summary(&daemon, "otlp");
    assert_eq!(summary_count(&summary, "uploads sent"), requests as u64);
    assert_eq!(summary_count(&summary, "dropped"), 0, "{summary}");
    assert_eq!(summary_count(&summary, "failed requests"), 3, "{summary}");
}

/// A 400 is final: that request is dropped, counted and logged, never
/// retried; a partial success is not retried either, and the profiles it
/// refused are counted. Basic auth comes from the URL's userinfo, whose
/// password is never logged.
#[test]
fn refusals_and_partial_successes_are_not_retried() {
    require_root();
    // "user:hunter2".
    let behaviour = Behaviour {
        fail_first: vec![400],
        partial: BTreeMap::from([(0, 1)]),
        authorization: Some("Basic dXNlcjpodW50ZXIy".into()),
    };
    let BurnerRun {
        files,
        received,
        receiver,
        daemon,
        diag,
        ..
    } = burner_run("otlp_refused_burner", behaviour, "3", |url| {
        url.replace("http://", "http://user:hunter2@")
    });
    let with_samples = files
        .iter()
        .filter(|(_, f)| !f.profile.sample.is_empty())
        .count();
    assert_eq!(received[0].status, 400, "{diag}");
    assert_eq!(
        received.len(),
        with_samples,
        "one request per window, none retried{diag}"
    );
    assert!(received[1..].iter().all(|r| r.status == 200), "{diag}");
    let summary = sink_summary(&daemon, "otlp");
    assert_eq!(summary_count(&summary, "rejected"), 1, "{summary}");
    assert_eq!(summary_count(&summary, "dropped"), 1, "{summary}");
    assert_eq!(summary_count(&summary, "profiles refused"), 1, "{summary}");
    let lines = daemon.stderr_lines();
    let logged = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    assert_eq!(logged("server answered 400"), 1, "{diag}");
    assert_eq!(logged("scripted: 1 profiles refused"), 1, "{diag}");
    assert!(lines.iter().all(|l| !l.contains("hunter2")), "{diag}");
    let shown = format!(
        "exporting every profile to {}/v1development/profiles",
        receiver.url()
    );
    assert_eq!(logged(&shown), 1, "{diag}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("v1development") && l.contains("alpha")),
        "the start names the alpha signal{diag}"
    );
}

/// OTLP settings the daemon cannot use are a one-line error and exit
/// status 2 before anything is written; a password is never echoed.
#[test]
fn bad_otlp_settings_are_rejected() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let config = |name: &str, text: &str| -> String {
        let path: PathBuf = tmp.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let missing = tmp.path().join("no-such-token");
    let endpoint = |url: &str| vec!["--otlp-endpoint".to_string(), url.to_string()];
    let with_config = |text: &str, name: &str| {
        [
            endpoint("http://h"),
            vec!["--config".into(), config(name, text)],
        ]
        .concat()
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (endpoint("ftp://example.com/"), "--otlp-endpoint"),
        (endpoint("localhost:4318"), "--otlp-endpoint"),
        (endpoint("ftp://u:hunter2@h/"), "--otlp-endpoint"),
        (
            with_config(
                &format!("[otlp]\nbearer_token_file = {missing:?}\n"),
                "a.toml",
            ),
            "otlp.bearer_token_file",
        ),
        (
            with_config("[otlp]\nheaders = { \"Bad Name\" = \"x\" }\n", "b.toml"),
            "otlp.headers",
        ),
        (
            with_config("[otlp]\nmax_request_bytes = 1\n", "c.toml"),
            "otlp.max_request_bytes",
        ),
    ];
    check_refused_settings(&out, &cases, "hunter2");
}
