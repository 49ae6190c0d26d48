//! The push task against a local server that answers as scripted: the
//! request's shape, retries, drops and their counts, the age check and the
//! shutdown grace.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::queue::QUEUE_CAPACITY;
use super::test_server::{answering, closed_port};
use super::*;
use crate::config::push as settings;
use prost::Message;

fn settings(url: &str, table: &str) -> PushSettings {
    settings::build(
        url,
        Some(&toml::from_str(table).unwrap()),
        &[("env".to_owned(), "test".to_owned())],
        Duration::from_secs(10),
    )
    .unwrap()
}

/// A cpu profile of the window that started `age` ago: two processes of
/// one container, one of another.
fn profile(age: Duration) -> pprof_proto::Profile {
    let start = SystemTime::now() - age;
    let mut p = series::tests_profile(&[
        (
            &[1],
            5,
            &[("pid", "1"), ("container", "a"), ("env", "test")],
        ),
        (
            &[1],
            6,
            &[("pid", "2"), ("container", "a"), ("env", "test")],
        ),
        (
            &[1],
            7,
            &[("pid", "3"), ("container", "b"), ("env", "test")],
        ),
    ]);
    p.time_nanos = start.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64;
    p.duration_nanos = 10_000_000_000;
    p.location.push(pprof_proto::Location {
        id: 1,
        ..Default::default()
    });
    p
}

const OK: (&str, &[u8]) = ("200 OK", b"");
const UNAVAILABLE: (&str, &[u8]) = (
    "503 Service Unavailable",
    br#"{"code":"unavailable","message":"ingesters busy"}"#,
);
const INVALID: (&str, &[u8]) = (
    "400 Bad Request",
    br#"{"code":"invalid_argument","message":"no"}"#,
);

#[tokio::test(flavor = "current_thread")]
async fn requests_are_connect_pushes_with_tenant_and_auth() {
    let (addr, server) = answering(vec![OK, OK]).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let s = settings(
        &format!("http://{addr}/base"),
        &format!(
            "tenant = \"team-a\"\nbearer_token_file = {token:?}\nheaders = {{ \"X-Route\" = \"eu\" }}"
        ),
    );
    let pusher = Pusher::start(s).unwrap();
    pusher.push(ProfileKind::Cpu, &profile(Duration::ZERO), "cpu-x.pb.gz");
    let stats = pusher.finish(Duration::from_secs(5)).await;
    let seen = server.await.unwrap();
    assert_eq!(stats.sent.load(Ordering::Relaxed), 2, "{}", stats.summary());
    assert_eq!(stats.dropped(), 0);
    let mut services = Vec::new();
    for r in &seen {
        let head = r.head.to_ascii_lowercase();
        assert!(
            head.starts_with("post /base/push.v1.pusherservice/push http/1.1"),
            "{head}"
        );
        for line in [
            "content-type: application/proto",
            "connect-protocol-version: 1",
            "x-scope-orgid: team-a",
            "authorization: bearer s3cret",
            "x-route: eu",
        ] {
            assert!(head.lines().any(|l| l == line), "{line} in {head}");
        }
        let request = wire::PushRequest::decode(r.body.as_slice()).unwrap();
        assert_eq!(request.series.len(), 1);
        let series = &request.series[0];
        assert_eq!(series.samples.len(), 1);
        let p = pprof_proto::decode(&series.samples[0].raw_profile).unwrap();
        assert!(p.sample.iter().all(|s| s.label.is_empty()));
        let label = |name: &str| {
            series
                .labels
                .iter()
                .find(|l| l.name == name)
                .map(|l| l.value.clone())
        };
        assert_eq!(label("__name__").as_deref(), Some("process_cpu"));
        assert_eq!(label("env").as_deref(), Some("test"));
        assert_eq!(label("pid"), None);
        services.push((label("service_name").unwrap(), p.sample[0].value[0]));
    }
    services.sort();
    assert_eq!(services, [("a".to_owned(), 11), ("b".to_owned(), 7)]);
}

/// 503 then 200: retried; 400: dropped at once; a closed port: the tries
/// run out and take the rest of the profile with them.
#[tokio::test(flavor = "current_thread")]
async fn retries_and_drops() {
    let fresh = profile(Duration::ZERO);
    let (addr, server) = answering(vec![UNAVAILABLE, OK, INVALID]).await;
    let url = format!("http://{addr}");
    let pusher = Pusher::start(settings(&url, "")).unwrap();
    pusher.push(ProfileKind::Cpu, &fresh, "cpu-x.pb.gz");
    let stats = pusher.finish(Duration::from_secs(5)).await;
    server.await.unwrap();
    assert_eq!(stats.sent.load(Ordering::Relaxed), 1, "{}", stats.summary());
    assert_eq!(stats.failed_requests.load(Ordering::Relaxed), 2);
    assert_eq!(stats.dropped_rejected.load(Ordering::Relaxed), 1);
    assert_eq!(stats.dropped(), 1);

    // Nothing listens on the port any more; two uploads per profile.
    let pusher = Pusher::start(settings(&url, "")).unwrap();
    for _ in 0..QUEUE_CAPACITY + 3 {
        pusher.push(ProfileKind::Cpu, &fresh, "cpu-x.pb.gz");
    }
    let stats = pusher.finish(Duration::from_millis(300)).await;
    assert_eq!(stats.sent.load(Ordering::Relaxed), 0);
    let full = stats.dropped_queue_full.load(Ordering::Relaxed);
    let unprepared = stats.unprepared.load(Ordering::Relaxed);
    // The task may have taken one profile off the queue before the rest
    // came; a profile dropped before it was split counts once.
    assert!(full >= 4, "{}", stats.summary());
    assert_eq!(
        stats.dropped(),
        2 * (QUEUE_CAPACITY as u64 + 3 - unprepared) + unprepared,
        "{}",
        stats.summary()
    );
    assert_eq!(stats.queued.load(Ordering::Relaxed), 0);
}

/// The byte bound drops a profile that does not fit, whole.
#[tokio::test(flavor = "current_thread")]
async fn the_queue_is_bounded_in_bytes() {
    let url = format!("http://127.0.0.1:{}", closed_port());
    let mut s = settings(&url, "");
    s.queue_bytes = 1;
    let pusher = Pusher::start(s).unwrap();
    pusher.push(ProfileKind::Cpu, &profile(Duration::ZERO), "cpu-x.pb.gz");
    let stats = pusher.finish(Duration::from_millis(100)).await;
    assert_eq!(stats.dropped_queue_full.load(Ordering::Relaxed), 2);
    assert_eq!(stats.failed_requests.load(Ordering::Relaxed), 0);
}

/// A window older than reject_older_than is never sent.
#[tokio::test(flavor = "current_thread")]
async fn too_old_windows_are_not_sent() {
    let url = format!("http://127.0.0.1:{}", closed_port());
    let pusher = Pusher::start(settings(&url, "reject_older_than = \"1m\"")).unwrap();
    pusher.push(
        ProfileKind::Cpu,
        &profile(Duration::from_secs(55)),
        "cpu-x.pb.gz",
    );
    let stats = pusher.finish(Duration::from_secs(2)).await;
    assert_eq!(stats.dropped_too_old.load(Ordering::Relaxed), 2);
    assert_eq!(stats.failed_requests.load(Ordering::Relaxed), 0);
    assert_eq!(stats.dropped(), 2, "{}", stats.summary());
}
