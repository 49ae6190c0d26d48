//! Sends every written profile to a Grafana Pyroscope server (`--push-url`)
//! through its push API (`push.v1.PusherService/Push`, Connect unary,
//! protobuf), beside the file and from its own task, so that a slow or
//! absent server never holds up the drain and write loop.
//!
//! A profile becomes uploads on a preparing thread of its own: its samples are
//! split into series (series.rs: bounded labels, per-thread and per-object
//! labels summed away), each series is cut into profiles under the
//! server's sample and size limits (chunks.rs), and each chunk is encoded,
//! gzipped, as one `PushRequest` of one series (wire.rs). One series per
//! request keeps a refusal or a retry to that series: the server takes or
//! refuses the series of a request one by one, so a retried request of
//! several would store again those it had taken.
//!
//! Bounds: [`PREPARE_CAPACITY`] profiles waiting to be split, a queue of
//! [`QUEUE_CAPACITY`] profiles and at most `[push]
//! queue_bytes` of uploads (a profile that does not fit is dropped and
//! counted), a request timeout, [`MAX_ATTEMPTS`] tries with exponential
//! backoff (or the server's `Retry-After`) for connection errors, timeouts,
//! 408, 429 and 5xx, none for other answers (the server will not take it);
//! when an upload's tries run out the rest of its profile is dropped too
//! (the server has been failing for a minute). An upload whose window the
//! server would refuse as too old (`[push] reject_older_than`) is not sent.
//! At shutdown [`SHUTDOWN_GRACE`] to empty the queue. Each kind of failure
//! is logged the first time it happens; later ones are only counted.

pub mod chunks;
pub mod connect;
pub mod series;
pub mod wire;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub use crate::config::push::PushSettings;
use crate::model::profile_kind::ProfileKind;
pub use connect::ClientError as PushError;
use connect::{Client, MAX_BACKOFF, Outcome, REQUEST_TIMEOUT};

/// Profiles waiting to be sent. At the default 60 s interval and five
/// profile types this is about 13 minutes of an unreachable server.
pub const QUEUE_CAPACITY: usize = 64;
/// Profiles waiting to be split into uploads: a few windows' worth; more
/// means the preparing thread cannot keep up.
pub const PREPARE_CAPACITY: usize = 8;
/// Tries per upload, the first included.
pub const MAX_ATTEMPTS: u32 = 6;
/// Wait before the first retry; doubled after each failed retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// How long the daemon waits at exit for queued uploads to go out: short,
/// as the daemon must exit within 5 s of a signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// One request: an encoded `PushRequest` of one series and one profile.
#[derive(Debug, Clone)]
pub struct Upload {
    pub body: Bytes,
    /// The profile's `time_nanos` (window start), for the age check.
    pub time_nanos: i64,
    /// The series' service name, for log lines.
    pub service: String,
}

/// The uploads of one profile.
#[derive(Debug)]
struct Batch {
    /// The file's name, for log lines.
    file: String,
    uploads: Vec<Upload>,
}

/// What the push did, shared with the metrics and the exit summary. The
/// unit is the upload (one series' profile, one request) unless named.
#[derive(Debug, Default)]
pub struct PushStats {
    /// Profiles handed to the push (windows × types).
    pub profiles: AtomicU64,
    /// Uploads the server accepted (2xx).
    pub sent: AtomicU64,
    /// Requests that failed (connection, timeout or a non-2xx answer).
    pub failed_requests: AtomicU64,
    /// Dropped because the queue was full (in profiles or bytes); a
    /// profile dropped before it was split counts as one.
    pub dropped_queue_full: AtomicU64,
    /// Profiles dropped before they were split (of `dropped_queue_full`).
    pub unprepared: AtomicU64,
    /// Refused with an answer that a retry would not change (4xx other
    /// than 408 and 429, 501, 3xx).
    pub dropped_rejected: AtomicU64,
    /// Dropped after [`MAX_ATTEMPTS`] failed tries, with the rest of their
    /// profile's uploads.
    pub dropped_retries: AtomicU64,
    /// Not sent: older than `reject_older_than` when their turn came.
    pub dropped_too_old: AtomicU64,
    /// Still queued or in flight when the shutdown grace ran out.
    pub dropped_shutdown: AtomicU64,
    /// Samples left out because each alone was over `max_profile_bytes`.
    pub samples_too_large: AtomicU64,
    /// Uploads queued now, the one being sent included.
    pub queued: AtomicU64,
    /// Bytes of the uploads queued now.
    pub queued_bytes: AtomicU64,
}

impl PushStats {
    /// All dropped uploads, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_reasons().iter().map(|(_, n)| n).sum()
    }

    /// Dropped uploads by reason, as the metrics name them.
    pub fn dropped_reasons(&self) -> [(&'static str, u64); 5] {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("queue_full", get(&self.dropped_queue_full)),
            ("rejected", get(&self.dropped_rejected)),
            ("retries", get(&self.dropped_retries)),
            ("too_old", get(&self.dropped_too_old)),
            ("shutdown", get(&self.dropped_shutdown)),
        ]
    }

    /// One line for the exit log.
    pub fn summary(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "push: {} uploads sent of {} profiles, {} dropped ({} queue full, {} rejected, \
             {} after {MAX_ATTEMPTS} tries, {} too old, {} at shutdown), {} failed requests, \
             {} samples too large",
            get(&self.sent),
            get(&self.profiles),
            self.dropped(),
            get(&self.dropped_queue_full),
            get(&self.dropped_rejected),
            get(&self.dropped_retries),
            get(&self.dropped_too_old),
            get(&self.dropped_shutdown),
            get(&self.failed_requests),
            get(&self.samples_too_large),
        )
    }
}

/// The push: a thread that turns profiles into uploads (off the session's
/// thread: splitting and gzipping a large profile takes a few hundred
/// milliseconds), the upload queue, and the task that empties it.
pub struct Pusher {
    jobs: std::sync::mpsc::SyncSender<Job>,
    stats: Arc<PushStats>,
    task: JoinHandle<()>,
    url: String,
    full_logged: AtomicBool,
}

/// A profile waiting to be split into uploads.
struct Job {
    kind: ProfileKind,
    profile: pprof_proto::Profile,
    file: String,
}

impl Pusher {
    /// Starts the push task on the current runtime, and its preparing
    /// thread.
    pub fn start(settings: PushSettings) -> Result<Pusher, PushError> {
        let client = Client::new(&settings)?;
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stats = Arc::new(PushStats::default());
        let sender = Sender {
            client,
            stats: stats.clone(),
            reject_older_than: settings.reject_older_than,
            logged: HashSet::new(),
        };
        let task = tokio::spawn(sender.run(rx));
        let (jobs, incoming) = std::sync::mpsc::sync_channel(PREPARE_CAPACITY);
        let url = settings.url.clone();
        let mut preparer = Preparer {
            tx,
            stats: stats.clone(),
            settings,
            full_logged: false,
            too_large_logged: false,
        };
        std::thread::Builder::new()
            .name("push-prepare".into())
            .spawn(move || {
                while let Ok(job) = incoming.recv() {
                    preparer.enqueue(job);
                }
                // Dropping `tx` here ends the sender task's queue.
            })
            .map_err(|e| PushError::new(format!("cannot start its thread: {e}")))?;
        Ok(Pusher {
            jobs,
            stats,
            task,
            url,
            full_logged: AtomicBool::new(false),
        })
    }

    /// The URL pushed to (no userinfo: safe to log).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Hands `profile` over to be split into uploads and queued; never
    /// waits. A profile without samples gives none (the server would store
    /// nothing). When [`PREPARE_CAPACITY`] profiles already wait, it is
    /// dropped and counted (as one upload: it was never split). `file`
    /// names it in log lines.
    pub fn push(&self, kind: ProfileKind, profile: &pprof_proto::Profile, file: &str) {
        self.stats.profiles.fetch_add(1, Ordering::Relaxed);
        if profile.sample.is_empty() {
            return;
        }
        let job = Job {
            kind,
            profile: profile.clone(),
            file: file.to_owned(),
        };
        if self.jobs.try_send(job).is_err() {
            self.stats.unprepared.fetch_add(1, Ordering::Relaxed);
            self.stats
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            if !self.full_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "pushing to {}: {PREPARE_CAPACITY} profiles already wait to be split, \
                     dropped {file} (further drops are counted, not logged)",
                    self.url
                );
            }
        }
    }

    pub fn stats(&self) -> Arc<PushStats> {
        self.stats.clone()
    }

    /// Closes the queue and waits up to `grace` for the profiles handed
    /// over to be split and sent; what is left then is dropped and
    /// counted. Returns the statistics.
    pub async fn finish(self, grace: Duration) -> Arc<PushStats> {
        let Pusher {
            jobs,
            stats,
            mut task,
            url,
            ..
        } = self;
        // The preparing thread ends when it has split what it holds, and
        // with it the task's queue.
        drop(jobs);
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            task.abort();
            let left = stats.queued.swap(0, Ordering::Relaxed);
            stats.queued_bytes.store(0, Ordering::Relaxed);
            stats.dropped_shutdown.fetch_add(left, Ordering::Relaxed);
            tracing::warn!(
                "pushing to {url}: {left} uploads not sent within the {} s shutdown grace",
                grace.as_secs()
            );
        }
        stats
    }
}

/// The preparing thread's state: splits profiles and queues their uploads.
struct Preparer {
    tx: mpsc::Sender<Batch>,
    stats: Arc<PushStats>,
    settings: PushSettings,
    full_logged: bool,
    too_large_logged: bool,
}

impl Preparer {
    fn enqueue(&mut self, job: Job) {
        let Job {
            kind,
            profile,
            file,
        } = job;
        let (uploads, too_large) = prepare(kind, &profile, &self.settings);
        drop(profile);
        if too_large > 0 {
            self.stats
                .samples_too_large
                .fetch_add(too_large as u64, Ordering::Relaxed);
            if !std::mem::replace(&mut self.too_large_logged, true) {
                tracing::warn!(
                    "pushing {file}: {too_large} samples left out, each alone larger than \
                     push.max_profile_bytes ({}) (further ones are counted, not logged)",
                    self.settings.max_profile_bytes
                );
            }
        }
        if uploads.is_empty() {
            return;
        }
        let n = uploads.len() as u64;
        let bytes: u64 = uploads.iter().map(|u| u.body.len() as u64).sum();
        let queued_bytes = self.stats.queued_bytes.load(Ordering::Relaxed);
        let fits = queued_bytes + bytes <= self.settings.queue_bytes as u64;
        let batch = Batch { file, uploads };
        self.stats.queued.fetch_add(n, Ordering::Relaxed);
        self.stats.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        let refused = match fits {
            true => self.tx.try_send(batch).err().map(|e| match e {
                mpsc::error::TrySendError::Full(b) => (b, false),
                mpsc::error::TrySendError::Closed(b) => (b, true),
            }),
            false => Some((batch, false)),
        };
        let Some((batch, closed)) = refused else {
            return;
        };
        self.stats.queued.fetch_sub(n, Ordering::Relaxed);
        self.stats.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        if closed {
            // The task was stopped at the end of the shutdown grace.
            self.stats.dropped_shutdown.fetch_add(n, Ordering::Relaxed);
            return;
        }
        self.stats
            .dropped_queue_full
            .fetch_add(n, Ordering::Relaxed);
        if !std::mem::replace(&mut self.full_logged, true) {
            tracing::warn!(
                "pushing to {}: queue full ({QUEUE_CAPACITY} profiles or {} bytes), dropped \
                 the {n} uploads of {} (further drops are counted, not logged)",
                self.settings.url,
                self.settings.queue_bytes,
                batch.file
            );
        }
    }
}

/// The uploads of `profile`, and how many samples were too large to send.
pub fn prepare(
    kind: ProfileKind,
    profile: &pprof_proto::Profile,
    settings: &PushSettings,
) -> (Vec<Upload>, usize) {
    let index = chunks::Index::new(profile);
    let mut uploads = Vec::new();
    let mut too_large = 0;
    for s in series::series_of(kind, profile, settings) {
        let cut = chunks::cut(
            &index,
            &s.samples,
            settings.max_samples,
            settings.max_profile_bytes,
        );
        too_large += cut.oversized_samples;
        let service = s
            .labels
            .iter()
            .find(|(k, _)| k == "service_name")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        for chunk in cut.profiles {
            let raw = wire::gzip(&chunk);
            uploads.push(Upload {
                body: Bytes::from(wire::encode(&s.labels, raw, wire::uuid())),
                time_nanos: chunk.time_nanos,
                service: service.clone(),
            });
        }
    }
    (uploads, too_large)
}

/// The push task's state.
struct Sender {
    client: Client,
    stats: Arc<PushStats>,
    reject_older_than: Option<Duration>,
    /// Failure kinds already logged.
    logged: HashSet<String>,
}

/// How one upload ended.
enum Delivered {
    Done,
    /// Its tries ran out: the server has been failing.
    GaveUp,
}

impl Sender {
    async fn run(mut self, mut rx: mpsc::Receiver<Batch>) {
        while let Some(batch) = rx.recv().await {
            let mut uploads = batch.uploads.into_iter();
            while let Some(upload) = uploads.next() {
                let outcome = self.deliver(&upload, &batch.file).await;
                self.dequeued(1, upload.body.len() as u64);
                if let Delivered::GaveUp = outcome {
                    let rest: Vec<Upload> = uploads.by_ref().collect();
                    let bytes = rest.iter().map(|u| u.body.len() as u64).sum();
                    self.stats
                        .dropped_retries
                        .fetch_add(rest.len() as u64, Ordering::Relaxed);
                    self.dequeued(rest.len() as u64, bytes);
                }
            }
        }
    }

    fn dequeued(&self, uploads: u64, bytes: u64) {
        self.stats.queued.fetch_sub(uploads, Ordering::Relaxed);
        self.stats.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Whether the server would refuse `upload` as too old by the time it
    /// arrives.
    fn too_old(&self, upload: &Upload) -> bool {
        let Some(limit) = self.reject_older_than else {
            return false;
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let start = u128::try_from(upload.time_nanos).unwrap_or(0);
        now.saturating_sub(start) + REQUEST_TIMEOUT.as_nanos() >= limit.as_nanos()
    }

    async fn deliver(&mut self, upload: &Upload, file: &str) -> Delivered {
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1..=MAX_ATTEMPTS {
            if self.too_old(upload) {
                self.stats.dropped_too_old.fetch_add(1, Ordering::Relaxed);
                self.log_once("too old".to_owned(), || {
                    format!(
                        "an upload of {file} ({}) is older than push.reject_older_than and \
                         would be refused; not sent",
                        upload.service
                    )
                });
                return Delivered::Done;
            }
            match self.client.send(upload.body.clone()).await {
                Outcome::Sent => {
                    self.stats.sent.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("pushed {file} ({}, try {attempt})", upload.service);
                    return Delivered::Done;
                }
                Outcome::Rejected { key, what } => {
                    self.stats.failed_requests.fetch_add(1, Ordering::Relaxed);
                    self.stats.dropped_rejected.fetch_add(1, Ordering::Relaxed);
                    self.log_once(key, || {
                        format!("{what}; dropped an upload of {file} ({})", upload.service)
                    });
                    return Delivered::Done;
                }
                Outcome::Retry { key, what, after } => {
                    self.stats.failed_requests.fetch_add(1, Ordering::Relaxed);
                    if attempt == MAX_ATTEMPTS {
                        self.stats.dropped_retries.fetch_add(1, Ordering::Relaxed);
                        self.log_once("gave up".to_owned(), || {
                            format!(
                                "{what}; dropped an upload of {file} after {MAX_ATTEMPTS} tries, \
                                 and the rest of that profile"
                            )
                        });
                        return Delivered::GaveUp;
                    }
                    self.log_once(key, || format!("{what}; retrying with backoff"));
                    tokio::time::sleep(after.unwrap_or(backoff)).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        Delivered::Done
    }

    fn log_once(&mut self, key: String, message: impl FnOnce() -> String) {
        if self.logged.insert(key) {
            tracing::warn!(
                "pushing to {}: {} (further failures of this kind are counted, not logged)",
                self.client.url(),
                message()
            );
        }
    }
}

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
