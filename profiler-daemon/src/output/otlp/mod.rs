//! Exports every written profile as OpenTelemetry's profiles signal
//! (`--otlp-endpoint`): OTLP/HTTP, `POST <endpoint>/v1development/profiles`
//! with a gzipped protobuf `ExportProfilesServiceRequest`, the messages of
//! opentelemetry-proto at [`PINNED`]. The signal is alpha: giving the flag
//! is the opt-in, the start is logged as a warning naming the version, and
//! a receiver that has moved on answers 404 at that path (logged with a
//! hint).
//!
//! A profile (one window of one type) becomes one request on the export's
//! preparing thread (convert.rs); a request larger than
//! `[otlp] max_request_bytes` before compression is not made (its samples
//! are counted as too large), as OTLP/HTTP asks. The queue, its bounds,
//! retries and drop counters are the push's (output/push/queue.rs); what differs
//! is the protocol ([`OTLP_HTTP`]): 429, 502, 503 and 504 and connection
//! errors are retried (with `Retry-After` when given), every other error
//! answer is final; a 200 with a partial success is not retried, and the
//! profiles it refused are counted.

pub mod convert;
pub mod wire;

use bytes::Bytes;
use prost::Message;
use reqwest::StatusCode;

pub use crate::config::otlp::OtlpSettings;
use crate::model::profile_kind::ProfileKind;
use crate::output::push::connect::{Client, Protocol, Target};
use crate::output::push::{Prepared, PushError, Pusher, QueueSettings, Upload};

/// The opentelemetry-proto release whose `v1development` profiles messages
/// the export sends.
pub const PINNED: &str = "opentelemetry-proto v1.11.0 (790608c4d51e6ffc12210b541e8514cbed9e91a4), \
                          profiles v1development";

/// OTLP/HTTP with binary protobuf, gzipped.
pub const OTLP_HTTP: Protocol = Protocol {
    content_type: "application/x-protobuf",
    headers: &[("content-encoding", "gzip")],
    retryable,
    error_reason: wire::error_reason,
    not_found_hint: " (no OTLP profiles receiver at this URL: it must serve the \
                     v1development signal over OTLP/HTTP)",
    accepted: Some(wire::accepted),
};

/// The answers OTLP/HTTP says to retry; all other error answers are final.
pub fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503 | 504)
}

/// Starts the export on the current runtime, and its preparing thread.
pub fn start(settings: OtlpSettings) -> Result<Pusher, PushError> {
    let target = Target {
        url: settings.url.clone(),
        tenant: None,
        auth: settings.auth.clone(),
        headers: settings.headers.clone(),
    };
    let client = Client::new(&target, &OTLP_HTTP)?;
    let queue = QueueSettings {
        name: "otlp",
        verb: "exporting",
        queue_bytes: settings.queue_bytes,
        // OTLP sets no age limit; a receiver that has one refuses with 400.
        reject_older_than: None,
        size_setting: "otlp.max_request_bytes",
    };
    Pusher::new(
        queue,
        client,
        Box::new(move |kind, profile| prepare(kind, profile, &settings)),
    )
}

/// The request of `profile`, gzipped; none when it has no samples or is
/// over `max_request_bytes` (then its samples are counted as too large).
pub fn prepare(
    kind: ProfileKind,
    profile: &pprof_proto::Profile,
    settings: &OtlpSettings,
) -> Prepared {
    let mut id = random_id;
    let mut cx = convert::Context {
        service_name: settings.service_name.as_deref(),
        static_labels: &settings.static_labels,
        profile_id: &mut id,
    };
    let request = convert::convert(kind, profile, &mut cx);
    if request.resource_profiles.is_empty() {
        return Prepared::default();
    }
    let raw = request.encode_to_vec();
    if raw.len() > settings.max_request_bytes {
        return Prepared {
            uploads: Vec::new(),
            too_large: profile.sample.len(),
        };
    }
    Prepared {
        uploads: vec![Upload {
            body: Bytes::from(crate::output::push::wire::gzip_bytes(&raw)),
            time_nanos: profile.time_nanos,
            service: kind.name().to_owned(),
        }],
        too_large: 0,
    }
}

/// A random profile id: 16 bytes, never all zero (the proto's invalid id).
fn random_id() -> [u8; 16] {
    fastrand::u128(1..).to_be_bytes()
}

#[cfg(test)]
mod tests;
