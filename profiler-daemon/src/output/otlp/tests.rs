//! The export against a local server answering as an OTLP/HTTP receiver
//! does: the request's path and headers, a partial success counted and not
//! retried, 503 retried, 400 (with a `google.rpc.Status`) final, and the
//! request-size bound.

use std::sync::atomic::Ordering;
use std::time::Duration;

use prost::Message;

use super::*;
use crate::output::push::test_server::answering;

fn settings(url: &str) -> OtlpSettings {
    crate::config::otlp::build(url, None, &[("env".to_owned(), "test".to_owned())]).unwrap()
}

fn profile() -> pprof_proto::Profile {
    let mut p = crate::output::push::series::tests_profile(&[
        (&[1], 5, &[("pid", "1"), ("env", "test")]),
        (&[1], 7, &[("pid", "2"), ("env", "test")]),
    ]);
    p.location.push(pprof_proto::Location {
        id: 1,
        ..Default::default()
    });
    p.time_nanos = 1;
    p
}

fn partial() -> &'static [u8] {
    let body = wire::ExportProfilesServiceResponse {
        partial_success: Some(wire::ExportProfilesPartialSuccess {
            rejected_profiles: 1,
            error_message: "one too old".into(),
        }),
    }
    .encode_to_vec();
    Box::leak(body.into_boxed_slice())
}

fn status(message: &str) -> &'static [u8] {
    let body = wire::Status {
        code: 3,
        message: message.into(),
    }
    .encode_to_vec();
    Box::leak(body.into_boxed_slice())
}

#[tokio::test(flavor = "current_thread")]
async fn requests_retries_and_refusals() {
    let answers = vec![
        ("503 Service Unavailable\r\nretry-after: 0", status("busy")),
        ("200 OK", partial()),
        ("400 Bad Request", status("bad dictionary")),
    ];
    let (addr, server) = answering(answers).await;
    let exporter = start(settings(&format!("http://{addr}/otlp"))).unwrap();
    exporter.push(ProfileKind::Cpu, &profile(), "cpu-a.pb.gz");
    exporter.push(ProfileKind::Cpu, &profile(), "cpu-b.pb.gz");
    let stats = exporter.finish(Duration::from_secs(5)).await;
    let seen = server.await.unwrap();
    assert_eq!(seen.len(), 3, "{}", stats.summary());
    for r in &seen {
        let head = r.head.to_ascii_lowercase();
        assert!(
            head.starts_with("post /otlp/v1development/profiles http/1.1"),
            "{head}"
        );
        for line in [
            "content-type: application/x-protobuf",
            "content-encoding: gzip",
        ] {
            assert!(head.lines().any(|l| l == line), "{line} in {head}");
        }
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(r.body.as_slice()),
            &mut raw,
        )
        .unwrap();
        let request = wire::ExportProfilesServiceRequest::decode(raw.as_slice()).unwrap();
        assert_eq!(request.resource_profiles.len(), 2);
    }
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    assert_eq!(get(&stats.sent), 1, "{}", stats.summary());
    assert_eq!(get(&stats.refused_items), 1);
    assert_eq!(get(&stats.failed_requests), 2);
    assert_eq!(get(&stats.dropped_rejected), 1);
    assert_eq!(stats.dropped(), 1);
    assert!(
        stats
            .summary()
            .starts_with("otlp: 1 uploads sent of 2 profiles")
    );
    assert!(stats.summary().contains("1 profiles refused"));
}

#[test]
fn oversized_requests_are_not_made() {
    let mut s = settings("http://c");
    let (uploads, too_large) = {
        let p = prepare(ProfileKind::Cpu, &profile(), &s);
        (p.uploads.len(), p.too_large)
    };
    assert_eq!((uploads, too_large), (1, 0));
    s.max_request_bytes = 10;
    let p = prepare(ProfileKind::Cpu, &profile(), &s);
    assert_eq!((p.uploads.len(), p.too_large), (0, 2));
}

#[test]
fn which_answers_are_retried() {
    for code in [429, 502, 503, 504] {
        assert!(retryable(StatusCode::from_u16(code).unwrap()), "{code}");
    }
    for code in [400, 401, 403, 404, 408, 413, 500, 501] {
        assert!(!retryable(StatusCode::from_u16(code).unwrap()), "{code}");
    }
}

/// Sizes and conversion time of the requests made of real profile files:
/// `PROFILERD_MEASURE_DIR=DIR cargo test --release -p profiler-daemon --lib
/// otlp::tests::measure -- --ignored --nocapture` (figures in design 005).
#[test]
#[ignore]
fn measure() {
    let dir = std::env::var("PROFILERD_MEASURE_DIR").expect("PROFILERD_MEASURE_DIR");
    let s = settings("http://c");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    println!(
        "| file | samples | file bytes | request bytes (raw) | request bytes (gzip) | convert + gzip |"
    );
    for path in paths {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(kind) = ProfileKind::ALL
            .into_iter()
            .find(|k| name.starts_with(&format!("{}-", k.name())))
        else {
            continue;
        };
        let bytes = std::fs::read(&path).unwrap();
        let profile = pprof_proto::decode(&bytes).unwrap();
        let start = std::time::Instant::now();
        let prepared = prepare(kind, &profile, &s);
        let took = start.elapsed();
        let gz: usize = prepared.uploads.iter().map(|u| u.body.len()).sum();
        let mut cx = convert::Context {
            service_name: None,
            static_labels: &[],
            profile_id: &mut random_id,
        };
        let raw = convert::convert(kind, &profile, &mut cx).encoded_len();
        println!(
            "| {name} | {} | {} | {raw} | {gz} | {:.1} ms |",
            profile.sample.len(),
            bytes.len(),
            took.as_secs_f64() * 1000.0
        );
    }
}
