//! The export against a local server answering as an OTLP/HTTP receiver
//! does: the request's path and headers, a partial success counted and not
//! retried, 503 retried, 400 (with a `google.rpc.Status`) final, and the
//! request-size bound.

use std::sync::atomic::Ordering;
use std::time::Duration;

use prost::Message;

use super::*;
use crate::push::test_server::answering;

fn settings(url: &str) -> OtlpSettings {
    settings::build(url, None, &[("env".to_owned(), "test".to_owned())]).unwrap()
}

fn profile() -> pprof_proto::Profile {
    let mut p = crate::push::series::tests_profile(&[
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
