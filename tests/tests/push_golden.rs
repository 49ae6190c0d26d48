//! The golden push requests in tests/golden/push/ (one per profile type,
//! captured from the stand-in Pyroscope during a real run; see push.rs)
//! still decode with Pyroscope's published push API and pass the server's
//! rules, and `go tool pprof` still reads their profiles. They pin the
//! wire format: a change to the daemon's messages or to the tests' `.proto`
//! that breaks it fails here, without root or a kernel.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use profiler_tests::pprof_tool::check_readable;
use profiler_tests::pyroscope::read_golden;
use profiler_tests::pyroscope::rules::{HttpRequest, check};

const KINDS: [(&str, &str); 5] = [
    ("cpu", "process_cpu"),
    ("heap", "memory"),
    ("block", "block"),
    ("mutex", "mutex"),
    ("offcpu", "offcpu"),
];

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/push")
}

#[test]
fn golden_requests_decode_and_pass_the_server_rules() {
    let tmp = tempfile::tempdir().unwrap();
    for (kind, name) in KINDS {
        let (method, path, headers, body) = read_golden(&golden_dir(), kind);
        // Checked as of just after their window: the age rule would refuse
        // them today.
        let first = profiler_tests::pyroscope::rules::first_profile_time(&body)
            .unwrap_or_else(|| panic!("{kind}: no profile"));
        let now = UNIX_EPOCH + Duration::from_nanos(first as u64) + Duration::from_secs(60);
        let request = HttpRequest {
            method: &method,
            path: &path,
            headers: &headers,
            body: &body,
        };
        let stored = check(&request, now).unwrap_or_else(|r| panic!("{kind}: refused: {r:?}"));
        assert!(!stored.is_empty(), "{kind}");
        for (i, s) in stored.iter().enumerate() {
            let label = |n: &str| {
                s.labels
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(label("__name__"), Some(name), "{kind}");
            assert_eq!(
                label("__delta__"),
                (kind == "heap").then_some("false"),
                "{kind}"
            );
            assert!(
                label("service_name").is_some_and(|v| !v.is_empty()),
                "{kind}"
            );
            assert_eq!(s.split.len(), 1, "{kind}: the server would split it");
            assert!(!s.profile.sample.is_empty(), "{kind}");
            let file = tmp.path().join(format!("{kind}-{i}.pb.gz"));
            std::fs::write(&file, &s.raw).unwrap();
            check_readable(&file, true);
        }
    }
}

/// The rules are not a rubber stamp: a golden request altered in a way the
/// server refuses is refused.
#[test]
fn altered_golden_requests_are_refused() {
    let (method, path, headers, body) = read_golden(&golden_dir(), "cpu");
    let first = profiler_tests::pyroscope::rules::first_profile_time(&body).unwrap();
    let now = UNIX_EPOCH + Duration::from_nanos(first as u64) + Duration::from_secs(60);
    let ok = HttpRequest {
        method: &method,
        path: &path,
        headers: &headers,
        body: &body,
    };
    assert!(check(&ok, now).is_ok());
    // Too late: past the ingestion window.
    assert!(check(&ok, now + Duration::from_secs(3600)).is_err());
    // Another path, another content type, a truncated body.
    let wrong_path = HttpRequest {
        path: "/ingest",
        ..ok
    };
    assert!(check(&wrong_path, now).is_err());
    let mut json = headers.clone();
    json.insert("content-type".into(), "application/json".into());
    let wrong_type = HttpRequest {
        headers: &json,
        ..ok
    };
    assert!(check(&wrong_type, now).is_err());
    let cut = HttpRequest {
        body: &body[..body.len() / 2],
        ..ok
    };
    assert!(check(&cut, now).is_err());
}
