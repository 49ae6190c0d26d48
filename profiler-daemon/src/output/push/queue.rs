//! What every sink that sends profiles to a server shares (the Pyroscope
//! push, the OTLP export): the hand-over to a preparing thread, the bounded
//! queue of encoded uploads, and the task that sends them one at a time
//! with retries, backoff and counted drops. What a sink sends and how a
//! server answers is the sink's: a prepare function (profile → uploads) and
//! a [`Client`] set up with its [`super::connect::Protocol`].
//!
//! Bounds: [`PREPARE_CAPACITY`] profiles waiting to be prepared, a queue of
//! [`QUEUE_CAPACITY`] profiles and at most `queue_bytes` of uploads (a
//! profile that does not fit is dropped and counted), [`MAX_ATTEMPTS`]
//! tries with exponential backoff and jitter (or the server's
//! `Retry-After`) for what the protocol calls retryable; when an upload's
//! tries run out the rest of its profile is dropped too (the server has
//! been failing for a minute). An upload the server would refuse as too old
//! (`reject_older_than`) is not sent. At shutdown, a grace to empty the
//! queue. Each kind of failure is logged the first time it happens; later
//! ones are only counted.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::connect::{Client, ClientError, MAX_BACKOFF, Outcome, REQUEST_TIMEOUT};
use crate::model::profile_kind::ProfileKind;

/// Profiles waiting to be sent. At the default 60 s interval and five
/// profile types this is about 13 minutes of an unreachable server.
pub const QUEUE_CAPACITY: usize = 64;
/// Profiles waiting to be prepared: a few windows' worth; more means the
/// preparing thread cannot keep up.
pub const PREPARE_CAPACITY: usize = 8;
/// Tries per upload, the first included.
pub const MAX_ATTEMPTS: u32 = 6;
/// Wait before the first retry; doubled after each failed retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// How long the daemon waits at exit for queued uploads to go out: short,
/// as the daemon must exit within 5 s of a signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// One request body, encoded.
#[derive(Debug, Clone)]
pub struct Upload {
    pub body: Bytes,
    /// The profile's `time_nanos` (window start), for the age check.
    pub time_nanos: i64,
    /// What the upload holds (a series' service, a profile type), for log
    /// lines.
    pub service: String,
}

/// What a sink made of one profile.
#[derive(Debug, Default)]
pub struct Prepared {
    pub uploads: Vec<Upload>,
    /// Samples left out, each alone (or with its request) over the sink's
    /// size limit.
    pub too_large: usize,
}

/// Turns a profile into uploads; runs on the preparing thread.
pub type PrepareFn = Box<dyn FnMut(ProfileKind, &pprof_proto::Profile) -> Prepared + Send>;

/// How a sink's queue is bounded and named.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// The sink's name in the summary (`push`, `otlp`), also the config
    /// table its settings come from.
    pub name: &'static str,
    /// What its log lines say it does: "pushing", "exporting".
    pub verb: &'static str,
    /// Bytes of uploads waiting in memory.
    pub queue_bytes: usize,
    /// `None`: every window is sent, whatever its age.
    pub reject_older_than: Option<Duration>,
    /// The setting that bounds an upload's size, for the too-large log.
    pub size_setting: &'static str,
}

/// The uploads of one profile.
#[derive(Debug)]
struct Batch {
    /// The file's name, for log lines.
    file: String,
    uploads: Vec<Upload>,
}

/// What a sink did, shared with the metrics and the exit summary. The unit
/// is the upload (one request) unless named.
#[derive(Debug, Default)]
pub struct PushStats {
    /// The sink's name (`push`, `otlp`).
    pub name: &'static str,
    /// What its log lines say it does ("pushing").
    pub verb: &'static str,
    /// Profiles handed to the sink (windows × types).
    pub profiles: AtomicU64,
    /// Uploads the server accepted (2xx).
    pub sent: AtomicU64,
    /// Requests that failed (connection, timeout or a non-2xx answer).
    pub failed_requests: AtomicU64,
    /// Dropped because the queue was full (in profiles or bytes); a
    /// profile dropped before it was prepared counts as one.
    pub dropped_queue_full: AtomicU64,
    /// Profiles dropped before they were prepared (of `dropped_queue_full`).
    pub unprepared: AtomicU64,
    /// Refused with an answer that a retry would not change.
    pub dropped_rejected: AtomicU64,
    /// Dropped after [`MAX_ATTEMPTS`] failed tries, with the rest of their
    /// profile's uploads.
    pub dropped_retries: AtomicU64,
    /// Not sent: older than `reject_older_than` when their turn came.
    pub dropped_too_old: AtomicU64,
    /// Still queued or in flight when the shutdown grace ran out.
    pub dropped_shutdown: AtomicU64,
    /// Samples left out because they were over the size limit.
    pub samples_too_large: AtomicU64,
    /// Items (OTLP: profiles) that accepted requests said they refused (a
    /// partial success); the request is not retried.
    pub refused_items: AtomicU64,
    /// Uploads queued now, the one being sent included.
    pub queued: AtomicU64,
    /// Bytes of the uploads queued now.
    pub queued_bytes: AtomicU64,
}

/// The reasons an upload is dropped, as the metrics name them.
pub const DROP_REASONS: [&str; 5] = ["queue_full", "rejected", "retries", "too_old", "shutdown"];

impl PushStats {
    /// All dropped uploads, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_reasons().iter().map(|(_, n)| n).sum()
    }

    /// Dropped uploads by reason, as the metrics name them.
    pub fn dropped_reasons(&self) -> [(&'static str, u64); 5] {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counts = [
            get(&self.dropped_queue_full),
            get(&self.dropped_rejected),
            get(&self.dropped_retries),
            get(&self.dropped_too_old),
            get(&self.dropped_shutdown),
        ];
        std::array::from_fn(|i| (DROP_REASONS[i], counts[i]))
    }

    /// One line for the exit log.
    pub fn summary(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut line = format!(
            "{}: {} uploads sent of {} profiles, {} dropped ({} queue full, {} rejected, \
             {} after {MAX_ATTEMPTS} tries, {} too old, {} at shutdown), {} failed requests, \
             {} samples too large",
            self.name,
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
        );
        let refused = get(&self.refused_items);
        if refused > 0 {
            line.push_str(&format!(
                ", {refused} profiles refused in accepted requests"
            ));
        }
        line
    }
}

/// A sink: a thread that turns profiles into uploads (off the session's
/// thread: converting and gzipping a large profile takes a few hundred
/// milliseconds), the upload queue, and the task that empties it.
pub struct Pusher {
    jobs: std::sync::mpsc::SyncSender<Job>,
    stats: Arc<PushStats>,
    task: JoinHandle<()>,
    url: String,
    full_logged: AtomicBool,
}

/// A profile waiting to be prepared.
struct Job {
    kind: ProfileKind,
    profile: pprof_proto::Profile,
    file: String,
}

impl Pusher {
    /// Starts the sending task on the current runtime, and the preparing
    /// thread that feeds it with `prepare`.
    pub fn new(
        settings: QueueSettings,
        client: Client,
        prepare: PrepareFn,
    ) -> Result<Pusher, ClientError> {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stats = Arc::new(PushStats {
            name: settings.name,
            verb: settings.verb,
            ..PushStats::default()
        });
        let url = client.url().to_owned();
        let sender = Sender {
            client,
            stats: stats.clone(),
            reject_older_than: settings.reject_older_than,
            name: settings.name,
            verb: settings.verb,
            logged: HashSet::new(),
        };
        let task = tokio::spawn(sender.run(rx));
        let (jobs, incoming) = std::sync::mpsc::sync_channel(PREPARE_CAPACITY);
        let mut preparer = Preparer {
            tx,
            stats: stats.clone(),
            settings: settings.clone(),
            url: url.clone(),
            prepare,
            full_logged: false,
            too_large_logged: false,
        };
        std::thread::Builder::new()
            .name(format!("{}-prepare", settings.name))
            .spawn(move || {
                while let Ok(job) = incoming.recv() {
                    preparer.enqueue(job);
                }
                // Dropping `tx` here ends the sender task's queue.
            })
            .map_err(ClientError::Thread)?;
        Ok(Pusher {
            jobs,
            stats,
            task,
            url,
            full_logged: AtomicBool::new(false),
        })
    }

    /// The URL sent to (no userinfo: safe to log).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Hands `profile` over to be prepared and queued; never waits. A
    /// profile without samples gives none (the server would store
    /// nothing). When [`PREPARE_CAPACITY`] profiles already wait, it is
    /// dropped and counted (as one upload: it was never prepared). `file`
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
                    "{} to {}: {PREPARE_CAPACITY} profiles already wait to be prepared, \
                     dropped {file} (further drops are counted, not logged)",
                    self.stats.verb,
                    self.url
                );
            }
        }
    }

    pub fn stats(&self) -> Arc<PushStats> {
        self.stats.clone()
    }

    /// Closes the queue and waits up to `grace` for the profiles handed
    /// over to be prepared and sent; what is left then is dropped and
    /// counted. Returns the statistics.
    #[cfg(test)]
    pub async fn finish(self, grace: Duration) -> Arc<PushStats> {
        let deadline = tokio::time::Instant::now() + grace;
        finish_all(vec![self], deadline).await.remove(0)
    }
}

/// Closes the queues of `pushers` at once and waits for all of them until
/// `deadline` (one grace for all: the daemon's exit bound is shared).
pub async fn finish_all(
    pushers: Vec<Pusher>,
    deadline: tokio::time::Instant,
) -> Vec<Arc<PushStats>> {
    let mut open = Vec::new();
    for Pusher {
        jobs,
        stats,
        task,
        url,
        ..
    } in pushers
    {
        // The preparing thread ends when it has prepared what it holds,
        // and with it the task's queue.
        drop(jobs);
        open.push((stats, task, url));
    }
    let mut out = Vec::new();
    for (stats, mut task, url) in open {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            task.abort();
            let left = stats.queued.swap(0, Ordering::Relaxed);
            stats.queued_bytes.store(0, Ordering::Relaxed);
            stats.dropped_shutdown.fetch_add(left, Ordering::Relaxed);
            tracing::warn!(
                "{} to {url}: {left} uploads not sent within the shutdown grace",
                stats.verb
            );
        }
        out.push(stats);
    }
    out
}

/// The preparing thread's state: prepares profiles and queues their
/// uploads.
struct Preparer {
    tx: mpsc::Sender<Batch>,
    stats: Arc<PushStats>,
    settings: QueueSettings,
    url: String,
    prepare: PrepareFn,
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
        let Prepared { uploads, too_large } = (self.prepare)(kind, &profile);
        drop(profile);
        if too_large > 0 {
            self.stats
                .samples_too_large
                .fetch_add(too_large as u64, Ordering::Relaxed);
            if !std::mem::replace(&mut self.too_large_logged, true) {
                tracing::warn!(
                    "{} {file}: {too_large} samples left out, larger than {} \
                     (further ones are counted, not logged)",
                    self.settings.verb,
                    self.settings.size_setting
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
                "{} to {}: queue full ({QUEUE_CAPACITY} profiles or {} bytes), dropped \
                 the {n} uploads of {} (further drops are counted, not logged)",
                self.settings.verb,
                self.url,
                self.settings.queue_bytes,
                batch.file
            );
        }
    }
}

/// The sending task's state.
struct Sender {
    client: Client,
    stats: Arc<PushStats>,
    reject_older_than: Option<Duration>,
    name: &'static str,
    verb: &'static str,
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
                let name = self.name;
                self.log_once("too old".to_owned(), || {
                    format!(
                        "an upload of {file} ({}) is older than {name}.reject_older_than and \
                         would be refused; not sent",
                        upload.service
                    )
                });
                return Delivered::Done;
            }
            match self.client.send(upload.body.clone()).await {
                Outcome::Sent { refused, note } => {
                    self.stats.sent.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("sent {file} ({}, try {attempt})", upload.service);
                    if refused > 0 || !note.is_empty() {
                        self.stats
                            .refused_items
                            .fetch_add(refused, Ordering::Relaxed);
                        self.log_once("partial success".to_owned(), || {
                            format!(
                                "the server took {file} ({}) but refused {refused} profiles \
                                 of it: {note}",
                                upload.service
                            )
                        });
                    }
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
                    tokio::time::sleep(after.unwrap_or_else(|| jittered(backoff))).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        Delivered::Done
    }

    fn log_once(&mut self, key: String, message: impl FnOnce() -> String) {
        if self.logged.insert(key) {
            tracing::warn!(
                "{} to {}: {} (further failures of this kind are counted, not logged)",
                self.verb,
                self.client.url(),
                message()
            );
        }
    }
}

/// `backoff` less up to a quarter, at random: senders that failed together
/// do not all retry at the same instant (OTLP/HTTP asks for jitter).
fn jittered(backoff: Duration) -> Duration {
    backoff.mul_f64(1.0 - fastrand::f64() / 4.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_quarter() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(4));
            assert!(
                d > Duration::from_secs(3) && d <= Duration::from_secs(4),
                "{d:?}"
            );
        }
    }
}
