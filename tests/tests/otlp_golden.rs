//! The golden OTLP requests in tests/golden/otlp/ (one per profile type,
//! captured from the stand-in receiver during a real run; see otlp.rs)
//! still decode with OpenTelemetry's published `v1development` proto and
//! pass the receiver's rules. They pin the wire format: a change to the
//! daemon's messages or to the tests' `.proto` that breaks it fails here,
//! without root or a kernel.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use profiler_tests::otlp::flat::flatten;
use profiler_tests::otlp::rules::{HttpRequest, check, decode_gzipped};
use profiler_tests::standin::read_golden;

const KINDS: [&str; 5] = ["cpu", "heap", "block", "mutex", "offcpu"];

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/otlp")
}

#[test]
fn golden_requests_decode_and_pass_the_rules() {
    for kind in KINDS {
        let (method, path, headers, body) = read_golden(&golden_dir(), kind);
        let request = HttpRequest {
            method: &method,
            path: &path,
            headers: &headers,
            body: &body,
        };
        // Checked as of their own time first (to read it), then as of just
        // after their window: the time rule would refuse them today.
        let decoded = decode_gzipped(&body).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let time = flatten(&decoded)
            .first()
            .map(|s| s.time_unix_nano)
            .unwrap_or_else(|| panic!("{kind}: no sample"));
        let now = UNIX_EPOCH + Duration::from_nanos(time) + Duration::from_secs(60);
        let request = check(&request, now).unwrap_or_else(|r| panic!("{kind}: refused: {r:?}"));
        let samples = flatten(&request);
        assert!(!samples.is_empty(), "{kind}");
        for s in &samples {
            assert_eq!(s.profile_type, kind);
            assert!(s.resource.contains_key("service.name"), "{kind}");
            assert!(!s.functions.is_empty(), "{kind}: a sample without a stack");
            assert_ne!(s.value, 0, "{kind}");
        }
        let scopes: Vec<&str> = request
            .resource_profiles
            .iter()
            .flat_map(|r| &r.scope_profiles)
            .filter_map(|s| s.scope.as_ref().map(|s| s.name.as_str()))
            .collect();
        assert!(
            scopes.iter().all(|s| *s == "profilerd"),
            "{kind}: {scopes:?}"
        );
    }
}
