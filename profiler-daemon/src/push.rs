//! Sends every written profile to a Pyroscope-compatible ingest endpoint
//! (`--push-url`), in addition to the file, from its own task so that a slow
//! or absent server never holds up the drain and write loop.
//!
//! The request is Pyroscope's `POST /ingest` with `format=pprof`: the query
//! carries `name` (the application name `profilerd` with the static labels in
//! Pyroscope's `app{k=v,...}` syntax), `from` and `until` (the window's Unix
//! seconds), and the body is a `multipart/form-data` form whose `profile`
//! field holds the gzipped pprof bytes exactly as written to the file.
//! Pyroscope names a pprof upload's profile type after its sample types:
//! `cpu` files become `process_cpu` and heap files `memory` on their own
//! (`alloc_*`, `inuse_*`); off-CPU files land in `process_cpu` too (the
//! name `offcpu` contains "cpu") but keep their own sample type
//! (`offcpu:nanoseconds`), so they are never mixed with CPU samples; block
//! and mutex files, whose sample types
//! (`contentions`, `delay`) are the same, add a `sample_type_config` field
//! naming them `block_count`/`block_duration` and
//! `mutex_count`/`mutex_duration`, which Pyroscope files under `block` and
//! `mutex`.
//!
//! Bounds: a queue of [`QUEUE_CAPACITY`] profiles (a profile that finds it
//! full is dropped and counted), a request timeout, [`MAX_ATTEMPTS`] tries
//! with exponential backoff for connection errors, timeouts and 5xx/429
//! answers, none for other answers (4xx: the server will not take it), and
//! at shutdown [`SHUTDOWN_GRACE`] to empty the queue. Each kind of failure is
//! logged the first time it happens; later ones are only counted.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use reqwest::Url;
use reqwest::multipart::{Form, Part};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::profile_kind::ProfileKind;

/// Profiles waiting to be sent. At the default 60 s interval and five
/// profile types this is about 13 minutes of an unreachable server, at a few
/// hundred KiB per profile a few tens of MiB at most.
pub const QUEUE_CAPACITY: usize = 64;
/// Tries per profile, the first included.
pub const MAX_ATTEMPTS: u32 = 6;
/// Wait before the first retry; doubled after each failed retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Whole request, connection to answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the daemon waits at exit for queued profiles to go out: short,
/// as the daemon must exit within 5 s of a signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// The application name in `name=`; Pyroscope appends the profile type.
pub const APP_NAME: &str = "profilerd";

/// Checks a `--push-url` value and returns the ingest URL to post to: http
/// or https with a host; a URL without a path (or `/`) gets `/ingest`. The
/// error is one line, for the config error message.
pub fn parse_url(raw: &str) -> Result<String, String> {
    let mut url = Url::parse(raw.trim()).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "the scheme must be http or https, not {}",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".to_owned());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("the URL must not have a query or fragment".to_owned());
    }
    if url.path().is_empty() || url.path() == "/" {
        url.set_path("/ingest");
    }
    Ok(url.to_string())
}

/// `profilerd{k=v,...}`: Pyroscope's application name syntax. Label names
/// keep letters, digits and '_' (Pyroscope's rule, like Prometheus'); in
/// values the name syntax's own characters (`{},=`) and anything outside
/// letters, digits and `_.-/:` become '_'.
pub fn app_name(labels: &[(String, String)]) -> String {
    let clean = |s: &str, extra: &[char]| -> String {
        s.chars()
            .map(
                |c| match c.is_ascii_alphanumeric() || c == '_' || extra.contains(&c) {
                    true => c,
                    false => '_',
                },
            )
            .collect()
    };
    let mut name = format!("{APP_NAME}{{");
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            name.push(',');
        }
        let _ = write!(
            name,
            "{}={}",
            clean(k, &[]),
            clean(v, &['.', '-', '/', ':'])
        );
    }
    name.push('}');
    name
}

/// The `sample_type_config` field for profile types that Pyroscope cannot
/// tell apart by their sample types alone (see the module doc).
fn sample_type_config(kind: ProfileKind) -> Option<&'static str> {
    match kind {
        ProfileKind::Block => Some(
            r#"{"contentions":{"units":"lock_samples","aggregation":"sum","display-name":"block_count","sampled":false},"delay":{"units":"lock_nanoseconds","aggregation":"sum","display-name":"block_duration","sampled":false}}"#,
        ),
        ProfileKind::Mutex => Some(
            r#"{"contentions":{"units":"lock_samples","aggregation":"sum","display-name":"mutex_count","sampled":false},"delay":{"units":"lock_nanoseconds","aggregation":"sum","display-name":"mutex_duration","sampled":false}}"#,
        ),
        ProfileKind::Cpu | ProfileKind::Heap | ProfileKind::Offcpu => None,
    }
}

/// One written profile to send.
#[derive(Debug, Clone)]
pub struct Upload {
    pub kind: ProfileKind,
    /// The gzipped pprof bytes, as in the file.
    pub body: Bytes,
    /// Window start and end, Unix seconds (end rounded up).
    pub from: u64,
    pub until: u64,
    /// The file's name, for log messages.
    pub file: String,
}

/// Why the push client could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the push client: {0}")]
pub struct PushError(#[from] reqwest::Error);

/// What the push task did, shared with the metrics and the exit summary.
#[derive(Debug, Default)]
pub struct PushStats {
    /// Profiles the server accepted (2xx).
    pub sent: AtomicU64,
    /// Requests that failed (connection, timeout or a non-2xx answer).
    pub failed_requests: AtomicU64,
    /// Profiles dropped because the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Profiles the server refused with an answer that a retry would not
    /// change (4xx other than 408 and 429, 3xx).
    pub dropped_rejected: AtomicU64,
    /// Profiles dropped after [`MAX_ATTEMPTS`] failed tries.
    pub dropped_retries: AtomicU64,
    /// Profiles still queued or in flight when the shutdown grace ran out.
    pub dropped_shutdown: AtomicU64,
    /// Profiles queued now, the one being sent included.
    pub queued: AtomicU64,
    queue_full_logged: AtomicBool,
}

impl PushStats {
    /// All dropped profiles, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full.load(Ordering::Relaxed)
            + self.dropped_rejected.load(Ordering::Relaxed)
            + self.dropped_retries.load(Ordering::Relaxed)
            + self.dropped_shutdown.load(Ordering::Relaxed)
    }

    /// One line for the exit log.
    pub fn summary(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "push: {} profiles sent, {} dropped ({} queue full, {} rejected, {} after {MAX_ATTEMPTS} tries, {} at shutdown), {} failed requests",
            get(&self.sent),
            self.dropped(),
            get(&self.dropped_queue_full),
            get(&self.dropped_rejected),
            get(&self.dropped_retries),
            get(&self.dropped_shutdown),
            get(&self.failed_requests),
        )
    }
}

/// The push queue and the task that empties it.
pub struct Pusher {
    tx: mpsc::Sender<Upload>,
    stats: Arc<PushStats>,
    task: JoinHandle<()>,
    url: String,
}

impl Pusher {
    /// Starts the push task on the current runtime. `url` comes from
    /// [`parse_url`].
    pub fn start(url: &str, labels: &[(String, String)]) -> Result<Pusher, PushError> {
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            // A redirected POST would turn into a GET; say so instead.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("profilerd/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stats = Arc::new(PushStats::default());
        let sender = Sender {
            client,
            url: url.to_owned(),
            app: app_name(labels),
            stats: stats.clone(),
            logged: HashSet::new(),
        };
        let task = tokio::spawn(sender.run(rx));
        Ok(Pusher {
            tx,
            stats,
            task,
            url: url.to_owned(),
        })
    }

    /// Queues a profile; never waits. A full queue drops it (counted).
    pub fn push(&self, upload: Upload) {
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.tx.try_send(upload) {
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            self.stats
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            if !self.stats.queue_full_logged.swap(true, Ordering::Relaxed) {
                let file = match &e {
                    mpsc::error::TrySendError::Full(u) | mpsc::error::TrySendError::Closed(u) => {
                        u.file.clone()
                    }
                };
                tracing::warn!(
                    "pushing to {}: queue of {QUEUE_CAPACITY} profiles full, dropped {file} \
                     (further drops are counted, not logged)",
                    self.url
                );
            }
        }
    }

    pub fn stats(&self) -> Arc<PushStats> {
        self.stats.clone()
    }

    /// Closes the queue and waits up to `grace` for it to empty; what is
    /// left then is dropped and counted. Returns the statistics.
    pub async fn finish(self, grace: Duration) -> Arc<PushStats> {
        let Pusher {
            tx,
            stats,
            mut task,
            url,
        } = self;
        drop(tx);
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            task.abort();
            let left = stats.queued.swap(0, Ordering::Relaxed);
            stats.dropped_shutdown.fetch_add(left, Ordering::Relaxed);
            tracing::warn!(
                "pushing to {url}: {left} profiles not sent within the {} s shutdown grace",
                grace.as_secs()
            );
        }
        stats
    }
}

/// How one try ended.
enum Outcome {
    Sent,
    /// Worth another try: what went wrong, and a key for log-once.
    Retry {
        key: String,
        what: String,
    },
    /// Not worth another try.
    Rejected {
        key: String,
        what: String,
    },
}

/// The push task's state.
struct Sender {
    client: reqwest::Client,
    url: String,
    app: String,
    stats: Arc<PushStats>,
    /// Failure kinds already logged.
    logged: HashSet<String>,
}

impl Sender {
    async fn run(mut self, mut rx: mpsc::Receiver<Upload>) {
        while let Some(upload) = rx.recv().await {
            self.deliver(&upload).await;
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    async fn deliver(&mut self, upload: &Upload) {
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1..=MAX_ATTEMPTS {
            match self.send_once(upload).await {
                Outcome::Sent => {
                    self.stats.sent.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("pushed {} (try {attempt})", upload.file);
                    return;
                }
                Outcome::Rejected { key, what } => {
                    self.stats.failed_requests.fetch_add(1, Ordering::Relaxed);
                    self.stats.dropped_rejected.fetch_add(1, Ordering::Relaxed);
                    self.log_once(key, || format!("{what}; dropped {}", upload.file));
                    return;
                }
                Outcome::Retry { key, what } => {
                    self.stats.failed_requests.fetch_add(1, Ordering::Relaxed);
                    if attempt == MAX_ATTEMPTS {
                        self.stats.dropped_retries.fetch_add(1, Ordering::Relaxed);
                        self.log_once("gave up".to_owned(), || {
                            format!("{what}; dropped {} after {MAX_ATTEMPTS} tries", upload.file)
                        });
                        return;
                    }
                    self.log_once(key, || format!("{what}; retrying with backoff"));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    fn log_once(&mut self, key: String, message: impl FnOnce() -> String) {
        if self.logged.insert(key) {
            tracing::warn!(
                "pushing to {}: {} (further failures of this kind are counted, not logged)",
                self.url,
                message()
            );
        }
    }

    async fn send_once(&self, upload: &Upload) -> Outcome {
        let mut url = match Url::parse(&self.url) {
            Ok(url) => url,
            // parse_url checked it; keep the task alive all the same.
            Err(e) => {
                return Outcome::Rejected {
                    key: "url".to_owned(),
                    what: format!("bad URL: {e}"),
                };
            }
        };
        url.query_pairs_mut()
            .append_pair("name", &self.app)
            .append_pair("from", &upload.from.to_string())
            .append_pair("until", &upload.until.to_string())
            .append_pair("format", "pprof")
            .append_pair("spyName", APP_NAME);
        let profile = Part::bytes(upload.body.to_vec()).file_name("profile.pprof");
        let mut form = Form::new().part("profile", profile);
        if let Some(config) = sample_type_config(upload.kind) {
            form = form.part(
                "sample_type_config",
                Part::text(config).file_name("sample_type_config.json"),
            );
        }
        let response = match self.client.post(url).multipart(form).send().await {
            Ok(r) => r,
            Err(e) => {
                let key = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "connect"
                } else {
                    "request"
                };
                // The URL with its query is in the log line already.
                return Outcome::Retry {
                    key: key.to_owned(),
                    what: error_chain(&e.without_url()),
                };
            }
        };
        let status = response.status();
        if status.is_success() {
            return Outcome::Sent;
        }
        let body = response.text().await.unwrap_or_default();
        let reason = body.lines().next().unwrap_or("").trim();
        let what = match reason.is_empty() {
            true => format!("server answered {status}"),
            false => format!("server answered {status}: {:.200}", reason),
        };
        let key = format!("status {}", status.as_u16());
        let retry = status.is_server_error()
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::REQUEST_TIMEOUT;
        match retry {
            true => Outcome::Retry { key, what },
            false => Outcome::Rejected { key, what },
        }
    }
}

/// An error and its causes on one line, each said once.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}

/// The window's Unix seconds: start rounded down, end rounded up, so that
/// `from..until` covers it.
pub fn window_seconds(start: std::time::SystemTime, duration: Duration) -> (u64, u64) {
    let start = start
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // Saturating: a clock or interval at the end of its range must not
    // take the daemon down.
    let end = start.saturating_add(duration);
    let until = end
        .as_secs()
        .saturating_add(u64::from(end.subsec_nanos() > 0));
    (
        start.as_secs(),
        until.max(start.as_secs().saturating_add(1)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    mod properties {
        use super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;
        use std::time::{Duration, UNIX_EPOCH};

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            /// `from..until` covers the window, whatever its start and
            /// length.
            #[test]
            fn window_covers_the_interval(
                secs in prop_oneof![0..4_000_000_000u64, any::<u64>()],
                nanos in 0..1_000_000_000u32,
                duration in prop_oneof![
                    Just(Duration::ZERO),
                    Just(Duration::MAX),
                    any::<(u64, u32)>().prop_map(|(s, n)| Duration::new(s, n % 1_000_000_000)),
                ],
            ) {
                let Some(start) = UNIX_EPOCH.checked_add(Duration::new(secs, nanos)) else {
                    return Ok(());
                };
                let (from, until) = window_seconds(start, duration);
                prop_assert_eq!(from, secs);
                prop_assert!(until > from || from == u64::MAX);
                let end = Duration::new(secs, nanos).saturating_add(duration);
                prop_assert!(Duration::from_secs(until) >= end || until == u64::MAX);
            }

            /// The application name is `profilerd{k=v,...}` with every
            /// label, in order, and no character of the name syntax inside
            /// a key or value.
            #[test]
            fn app_name_is_well_formed(labels in vec((".{0,6}", ".{0,6}"), 0..4)) {
                let name = app_name(&labels);
                let inner = name
                    .strip_prefix("profilerd{")
                    .and_then(|n| n.strip_suffix('}'))
                    .expect("profilerd{...}");
                let pairs: Vec<&str> = if labels.is_empty() {
                    Vec::new()
                } else {
                    inner.split(',').collect()
                };
                prop_assert_eq!(pairs.len(), labels.len());
                for (pair, (k, v)) in pairs.iter().zip(&labels) {
                    let (key, value) = pair.split_once('=').expect("key=value");
                    prop_assert_eq!(key.chars().count(), k.chars().count());
                    prop_assert_eq!(value.chars().count(), v.chars().count());
                    prop_assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
                    prop_assert!(
                        value.chars().all(|c| c.is_ascii_alphanumeric() || "_.-/:".contains(c))
                    );
                }
            }

            /// Any text as a push URL: an error, or an http(s) URL that
            /// keeps the path given, or gets /ingest when none was, and
            /// that parses again to itself.
            #[test]
            fn push_url_is_checked(raw in prop_oneof![
                ".{0,24}",
                "(http|https|ftp)://[a-z0-9.:\\[\\]@/?#%-]{0,20}",
            ]) {
                if let Ok(url) = parse_url(&raw) {
                    prop_assert!(url.starts_with("http://") || url.starts_with("https://"), "{}", url);
                    let given = Url::parse(raw.trim()).expect("accepted, so a URL");
                    let path = Url::parse(&url).expect("a URL").path().to_owned();
                    if matches!(given.path(), "" | "/") {
                        prop_assert_eq!(path, "/ingest");
                    } else {
                        prop_assert_eq!(path, given.path());
                    }
                    prop_assert_eq!(parse_url(&url), Ok(url.clone()));
                }
            }
        }
    }

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("http://localhost:4040").unwrap(),
            "http://localhost:4040/ingest"
        );
        assert_eq!(
            parse_url("https://p.example/").unwrap(),
            "https://p.example/ingest"
        );
        assert_eq!(
            parse_url("http://10.0.0.1:8080/proxy/ingest").unwrap(),
            "http://10.0.0.1:8080/proxy/ingest"
        );
        for bad in [
            "",
            "localhost:4040",
            "ftp://x/",
            "http://",
            "http://h/ingest?x=1",
            "http://a b/",
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(app_name(&[]), "profilerd{}");
        let labels = vec![
            ("env".to_owned(), "prod".to_owned()),
            ("k8s.ns-x".to_owned(), "a,b}=c v/1:2.x-y".to_owned()),
        ];
        assert_eq!(
            app_name(&labels),
            "profilerd{env=prod,k8s_ns_x=a_b__c_v/1:2.x-y}"
        );
    }

    #[test]
    fn window_bounds() {
        let start = std::time::UNIX_EPOCH + Duration::from_millis(1_000_500);
        assert_eq!(
            window_seconds(start, Duration::from_millis(9_500)),
            (1000, 1010)
        );
        assert_eq!(
            window_seconds(start, Duration::from_millis(9_600)),
            (1000, 1011)
        );
        // Never an empty range.
        let whole = std::time::UNIX_EPOCH + Duration::from_secs(5);
        assert_eq!(window_seconds(whole, Duration::ZERO), (5, 6));
    }

    #[test]
    fn configs_name_block_and_mutex() {
        for (kind, prefix) in [
            (ProfileKind::Block, "block_"),
            (ProfileKind::Mutex, "mutex_"),
        ] {
            let config = sample_type_config(kind).unwrap();
            assert!(config.contains(&format!("\"{prefix}count\"")));
            assert!(config.contains(&format!("\"{prefix}duration\"")));
        }
        assert!(sample_type_config(ProfileKind::Cpu).is_none());
    }

    /// A server on a local port that answers each request with the next of
    /// `statuses` (with a one-line body), then stops listening.
    async fn answering(
        statuses: &'static [&'static str],
    ) -> (std::net::SocketAddr, JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            for status in statuses {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 65536];
                let mut got = Vec::new();
                // Read the head and the announced body.
                loop {
                    let n = s.read(&mut buf).await.unwrap();
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got);
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len: usize = text[..end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap();
                        if got.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let body = "because\n";
                let reply = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        (addr, server)
    }

    /// A server that answers 503 then 200, one that answers 400, and a
    /// closed port: the queue, retries, drops and the shutdown grace.
    #[tokio::test(flavor = "current_thread")]
    async fn retries_and_drops() {
        let upload = Upload {
            kind: ProfileKind::Cpu,
            body: Bytes::from_static(b"\x1f\x8bnot really"),
            from: 1,
            until: 2,
            file: "cpu-x.pb.gz".to_owned(),
        };
        // A 4xx is not retried: dropped at once.
        let (addr, server) = answering(&["400 Bad Request"]).await;
        let pusher = Pusher::start(&parse_url(&format!("http://{addr}")).unwrap(), &[]).unwrap();
        pusher.push(upload.clone());
        let stats = pusher.finish(Duration::from_secs(5)).await;
        server.await.unwrap();
        assert_eq!(stats.sent.load(Ordering::Relaxed), 0);
        assert_eq!(stats.failed_requests.load(Ordering::Relaxed), 1);
        assert_eq!(stats.dropped_rejected.load(Ordering::Relaxed), 1);
        assert_eq!(stats.dropped(), 1);

        let (addr, server) = answering(&["503 Service Unavailable", "200 OK"]).await;
        let url = parse_url(&format!("http://{addr}")).unwrap();
        let pusher = Pusher::start(&url, &[]).unwrap();
        pusher.push(upload.clone());
        let stats = pusher.finish(Duration::from_secs(5)).await;
        server.await.unwrap();
        assert_eq!(stats.sent.load(Ordering::Relaxed), 1);
        assert_eq!(stats.failed_requests.load(Ordering::Relaxed), 1);
        assert_eq!(stats.dropped(), 0);

        // Nothing listens on the port any more.
        let pusher = Pusher::start(&url, &[]).unwrap();
        for _ in 0..QUEUE_CAPACITY + 3 {
            pusher.push(upload.clone());
        }
        let stats = pusher.finish(Duration::from_millis(200)).await;
        assert_eq!(stats.sent.load(Ordering::Relaxed), 0);
        // The task may have taken one off the queue before the rest came.
        let full = stats.dropped_queue_full.load(Ordering::Relaxed);
        assert!((2..=3).contains(&full), "{}", stats.summary());
        assert_eq!(
            stats.dropped(),
            QUEUE_CAPACITY as u64 + 3,
            "{}",
            stats.summary()
        );
        assert_eq!(stats.queued.load(Ordering::Relaxed), 0);
    }
}
