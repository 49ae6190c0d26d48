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
//! The queue, its bounds, retries and drop counters are queue.rs's, shared
//! with the OTLP export (crate::output::otlp): [`queue::PREPARE_CAPACITY`] profiles
//! waiting to be split, [`queue::QUEUE_CAPACITY`] profiles and at most `[push]
//! queue_bytes` of uploads, [`queue::MAX_ATTEMPTS`] tries for connection errors,
//! timeouts, 408, 429 and 5xx but 501 (connect.rs), none for other answers;
//! an upload whose window the server would refuse as too old (`[push]
//! reject_older_than`) is not sent; [`SHUTDOWN_GRACE`] at exit.

pub mod chunks;
pub mod connect;
pub mod queue;
pub mod series;
pub mod wire;

use bytes::Bytes;

pub use crate::config::push::PushSettings;
use crate::model::profile_kind::ProfileKind;
pub use connect::ClientError as PushError;
use connect::{Client, Target};
pub use queue::{Prepared, PushStats, Pusher, QueueSettings, SHUTDOWN_GRACE, Upload};

impl Pusher {
    /// Starts the push to Pyroscope on the current runtime, and its
    /// preparing thread.
    pub fn start(settings: PushSettings) -> Result<Pusher, PushError> {
        let target = Target {
            url: settings.url.clone(),
            tenant: settings.tenant.clone(),
            auth: settings.auth.clone(),
            headers: settings.headers.clone(),
        };
        let client = Client::new(&target, &connect::CONNECT)?;
        let queue = QueueSettings {
            name: "push",
            verb: "pushing",
            queue_bytes: settings.queue_bytes,
            reject_older_than: settings.reject_older_than,
            size_setting: "push.max_profile_bytes",
        };
        Pusher::new(
            queue,
            client,
            Box::new(move |kind, profile| {
                let (uploads, too_large) = prepare(kind, profile, &settings);
                Prepared { uploads, too_large }
            }),
        )
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

#[cfg(test)]
mod properties;
#[cfg(test)]
pub(crate) mod test_server;
#[cfg(test)]
mod tests;
