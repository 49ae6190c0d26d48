//! What a Grafana Pyroscope server accepts on its push API, as its source
//! says (releases 1.0 to 2.2, default limits), so that the tests check the
//! daemon against the server and not against the daemon's own idea of it:
//!
//! - the Connect unary protocol: `POST /push.v1.PusherService/Push`,
//!   `Content-Type: application/proto`, `Connect-Protocol-Version: 1` if
//!   sent; errors as an HTTP status and a JSON `{code, message}`;
//! - the distributor's `Push`: each raw profile gzipped or not, at most
//!   4 MiB uncompressed (`validation.max-profile-size-bytes`); no series is
//!   "no profiles received";
//! - its rate limiter: a profile (with its labels) larger than the burst
//!   (`distributor.ingestion-burst-size-mb`, 2 MiB) is refused with 429
//!   however long one waits;
//! - `ValidateProfile` (pkg/validation): sample types present, the time
//!   within the ingestion window (1 h back, 10 min ahead), at most 16,000
//!   samples and 100 labels per sample, no location or function id 0,
//!   values as many as sample types, string 0 empty and every index in
//!   range, no `-` in a sample type, UTF-8 strings;
//! - the split into series by string sample labels (pkg/model/pprofsplit:
//!   a sample label joins the series labels unless the series has it), and
//!   `ValidateLabels` on each: at least one label, at most 30 names,
//!   `__name__` a metric name, `service_name` present, names of at most
//!   1024 bytes in Prometheus' legacy syntax (1.x refuses anything else;
//!   2.x also takes UTF-8), values of at most 2048 bytes, no duplicates.
//!   Names starting with `__` other than `__name__` and `__delta__` are the
//!   server's own (`__profile_type__`, `__type__`, ...): refused here too,
//!   as a client's would clash with them.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;

use super::api::push::v1::{PushRequest, RawProfileSeries};
use pprof_proto::Profile;

pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
pub const MAX_PROFILE_BYTES: usize = 4 << 20;
pub const BURST_BYTES: usize = 2 << 20;
pub const MAX_SAMPLES: usize = 16_000;
pub const MAX_SAMPLE_LABELS: usize = 100;
pub const MAX_LABEL_NAMES: usize = 30;
pub const MAX_NAME_BYTES: usize = 1024;
pub const MAX_VALUE_BYTES: usize = 2048;
pub const REJECT_OLDER_THAN: Duration = Duration::from_secs(3600);
pub const REJECT_NEWER_THAN: Duration = Duration::from_secs(600);

/// A refusal: the Connect code (its HTTP status follows) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status of the Connect code.
    pub fn status(&self) -> u16 {
        connect_status(self.code)
    }

    /// The Connect error body.
    pub fn body(&self) -> String {
        serde_json::json!({"code": self.code, "message": self.message}).to_string()
    }
}

/// The Connect protocol's HTTP status for an error code.
pub fn connect_status(code: &str) -> u16 {
    match code {
        "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
        "unauthenticated" => 401,
        "permission_denied" => 403,
        "not_found" => 404,
        "aborted" | "already_exists" => 409,
        "resource_exhausted" => 429,
        "canceled" => 499,
        "unimplemented" => 501,
        "unavailable" => 503,
        "deadline_exceeded" => 504,
        _ => 500,
    }
}

/// One profile of an accepted request, as the server would store it.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The request series' labels, as sent.
    pub labels: Vec<(String, String)>,
    /// The raw bytes, as sent.
    pub raw: Vec<u8>,
    pub profile: Profile,
    /// The series the server makes of it: its labels (sorted) for each
    /// distinct set of string sample labels.
    pub split: Vec<Vec<(String, String)>>,
}

/// The request as far as the HTTP layer goes.
pub struct HttpRequest<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// Header names lowercased.
    pub headers: &'a BTreeMap<String, String>,
    pub body: &'a [u8],
}

/// Checks a request as the server would at `now`: the stored profiles, or
/// the refusal.
pub fn check(request: &HttpRequest, now: SystemTime) -> Result<Vec<Stored>, Refusal> {
    if request.path != PUSH_PATH {
        return Err(Refusal::new(
            "not_found",
            format!("404 page not found: {}", request.path),
        ));
    }
    if request.method != "POST" {
        return Err(Refusal::new("unimplemented", "HTTP method must be POST"));
    }
    let header = |n: &str| request.headers.get(n).map(String::as_str);
    match header("content-type") {
        Some("application/proto") => {}
        other => {
            return Err(Refusal::new(
                "unimplemented",
                format!("content type {other:?} is not the Connect unary protobuf one"),
            ));
        }
    }
    if let Some(v) = header("connect-protocol-version")
        && v != "1"
    {
        return Err(Refusal::new(
            "invalid_argument",
            format!("connect-protocol-version must be \"1\": got {v:?}"),
        ));
    }
    if header("content-encoding").is_some_and(|e| e != "identity" && e != "gzip") {
        return Err(Refusal::new("unimplemented", "unknown content encoding"));
    }
    let push = PushRequest::decode(request.body).map_err(|e| {
        Refusal::new(
            "invalid_argument",
            format!("unmarshal into push.v1.PushRequest: {e}"),
        )
    })?;
    let mut stored = Vec::new();
    for series in &push.series {
        stored.extend(check_series(series, now)?);
    }
    if stored.is_empty() {
        return Err(Refusal::new("invalid_argument", "no profiles received"));
    }
    Ok(stored)
}

fn check_series(series: &RawProfileSeries, now: SystemTime) -> Result<Vec<Stored>, Refusal> {
    let labels: Vec<(String, String)> = series
        .labels
        .iter()
        .map(|l| (l.name.clone(), l.value.clone()))
        .collect();
    let mut out = Vec::new();
    for sample in &series.samples {
        if !sample.id.is_empty() && !is_uuid(&sample.id) {
            return Err(Refusal::new(
                "invalid_argument",
                format!("invalid UUID {:?}", sample.id),
            ));
        }
        let raw = uncompressed(&sample.raw_profile)?;
        let profile = Profile::decode(raw.as_slice())
            .map_err(|e| Refusal::new("invalid_argument", format!("malformed profile: {e}")))?;
        let size = raw.len() + labels.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if size > BURST_BYTES {
            return Err(Refusal::new(
                "resource_exhausted",
                format!("push rate limit exceeded while adding {size} bytes (burst {BURST_BYTES})"),
            ));
        }
        check_profile(&profile, raw.len(), now)?;
        let split = split_series(&profile, &labels);
        for set in &split {
            check_labels(set)?;
        }
        out.push(Stored {
            labels: labels.clone(),
            raw: sample.raw_profile.clone(),
            profile,
            split,
        });
    }
    Ok(out)
}

/// The `time_nanos` of a request's first profile, if it decodes.
pub fn first_profile_time(body: &[u8]) -> Option<i64> {
    let push = PushRequest::decode(body).ok()?;
    let raw = &push.series.first()?.samples.first()?.raw_profile;
    Some(
        Profile::decode(uncompressed(raw).ok()?.as_slice())
            .ok()?
            .time_nanos,
    )
}

fn is_uuid(id: &str) -> bool {
    id.len() == 36
        && id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The profile's bytes, gunzipped if gzipped, within the size limit.
fn uncompressed(raw: &[u8]) -> Result<Vec<u8>, Refusal> {
    let too_big = || {
        Refusal::new(
            "invalid_argument",
            format!("uncompressed profile payload size exceeds limit of {MAX_PROFILE_BYTES} B"),
        )
    };
    if !raw.starts_with(&[0x1f, 0x8b]) {
        if raw.len() > MAX_PROFILE_BYTES {
            return Err(too_big());
        }
        return Ok(raw.to_vec());
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(raw)
        .take(MAX_PROFILE_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Refusal::new("invalid_argument", format!("gzip: {e}")))?;
    if out.len() > MAX_PROFILE_BYTES {
        return Err(too_big());
    }
    Ok(out)
}

/// `ValidateProfile`.
pub fn check_profile(p: &Profile, size: usize, now: SystemTime) -> Result<(), Refusal> {
    let malformed = |m: &str| {
        Err(Refusal::new(
            "invalid_argument",
            format!("malformed profile: {m}"),
        ))
    };
    if p.sample_type.is_empty() {
        return malformed("empty profile");
    }
    if p.time_nanos > 0 {
        let t = UNIX_EPOCH + Duration::from_nanos(p.time_nanos as u64);
        if t <= now - REJECT_OLDER_THAN || t >= now + REJECT_NEWER_THAN {
            return Err(Refusal::new(
                "invalid_argument",
                format!(
                    "profile is outside of ingestion window (profile timestamp: {} ns)",
                    p.time_nanos
                ),
            ));
        }
    }
    if size > MAX_PROFILE_BYTES {
        return Err(Refusal::new("invalid_argument", "exceeds the size limit"));
    }
    if p.sample.len() > MAX_SAMPLES {
        return Err(Refusal::new(
            "invalid_argument",
            format!(
                "the profile exceeds the samples count limit (actual: {}, limit: {MAX_SAMPLES})",
                p.sample.len()
            ),
        ));
    }
    let strings = p.string_table.len() as i64;
    let in_range = |i: i64| (0..strings).contains(&i);
    for s in &p.sample {
        if s.label.len() > MAX_SAMPLE_LABELS {
            return Err(Refusal::new(
                "invalid_argument",
                "exceeds the sample labels limit",
            ));
        }
        if s.value.len() != p.sample_type.len() {
            return malformed("sample value length mismatch");
        }
        if s.label.iter().any(|l| !in_range(l.key) || !in_range(l.str)) {
            return malformed("sample label string index out of range");
        }
    }
    if p.location.iter().any(|l| l.id == 0) {
        return malformed("location id is 0");
    }
    if p.function.iter().any(|f| f.id == 0) {
        return malformed("function id is 0");
    }
    if p.string_table.first().is_none_or(|s| !s.is_empty()) {
        return malformed("string 0 should be empty string");
    }
    let indices = p
        .sample_type
        .iter()
        .map(|t| t.r#type)
        .chain(
            p.function
                .iter()
                .flat_map(|f| [f.name, f.system_name, f.filename]),
        )
        .chain(p.mapping.iter().flat_map(|m| [m.filename, m.build_id]));
    for i in indices {
        if !in_range(i) {
            return malformed("string index out of range");
        }
    }
    if p.sample_type
        .iter()
        .any(|t| p.string_table[t.r#type as usize].contains('-'))
    {
        return malformed("sample type contains -");
    }
    Ok(())
}

/// The label sets the server makes of a profile: one per distinct set of
/// string sample labels, each the series labels plus those sample labels
/// whose names the series does not have; sorted by name.
pub fn split_series(p: &Profile, labels: &[(String, String)]) -> Vec<Vec<(String, String)>> {
    let mut sets: Vec<Vec<(String, String)>> = Vec::new();
    for s in &p.sample {
        let mut set = labels.to_vec();
        for l in &s.label {
            if l.str <= 0 {
                continue;
            }
            let name = &p.string_table[l.key as usize];
            if !set.iter().any(|(k, _)| k == name) {
                set.push((name.clone(), p.string_table[l.str as usize].clone()));
            }
        }
        set.sort();
        if !sets.contains(&set) {
            sets.push(set);
        }
    }
    sets
}

/// `ValidateLabels`, with the names in their strictest (1.x) syntax.
pub fn check_labels(labels: &[(String, String)]) -> Result<(), Refusal> {
    let shown = || {
        let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        format!("{{{}}}", pairs.join(", "))
    };
    let invalid = |why: String| {
        Err(Refusal::new(
            "invalid_argument",
            format!("invalid labels '{}' with error: {why}", shown()),
        ))
    };
    if labels.is_empty() {
        return invalid("at least one label pair is required per profile".into());
    }
    let mut sorted = labels.to_vec();
    sorted.sort();
    if sorted.len() > MAX_LABEL_NAMES {
        return Err(Refusal::new(
            "invalid_argument",
            format!(
                "profile series '{}' has {} label names; limit {MAX_LABEL_NAMES}",
                shown(),
                sorted.len()
            ),
        ));
    }
    let get = |n: &str| sorted.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    if !metric_name(get("__name__").unwrap_or("")) {
        return invalid("invalid metric name".into());
    }
    if get("service_name").is_none_or(str::is_empty) {
        return invalid("service name is not provided".into());
    }
    let mut last = "";
    for (name, value) in &sorted {
        if name.len() > MAX_NAME_BYTES {
            return invalid(format!("label name too long: '{name}'"));
        }
        if value.len() > MAX_VALUE_BYTES {
            return invalid(format!("label value too long: '{value}'"));
        }
        if !legacy_label_name(name) {
            return invalid(format!("invalid label name '{name}'"));
        }
        if name.starts_with("__") && name != "__name__" && name != "__delta__" {
            return invalid(format!("label name '{name}' is reserved by the server"));
        }
        if name == last {
            return Err(Refusal::new(
                "invalid_argument",
                format!(
                    "profile with labels '{}' has duplicate label name: '{name}'",
                    shown()
                ),
            ));
        }
        last = name;
    }
    Ok(())
}

/// Prometheus' legacy label name: `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn legacy_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Prometheus' legacy metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The rules refuse what the server refuses: each case must fail, or
    /// the validator would let the daemon's mistakes through.
    #[test]
    fn label_rules_refuse() {
        let ok = pairs(&[("__name__", "process_cpu"), ("service_name", "a")]);
        assert_eq!(check_labels(&ok), Ok(()));
        let mut many = ok.clone();
        for i in 0..29 {
            many.push((format!("l{i}"), "v".into()));
        }
        for bad in [
            vec![],
            pairs(&[("service_name", "a")]),
            pairs(&[("__name__", "process-cpu"), ("service_name", "a")]),
            pairs(&[("__name__", "process_cpu")]),
            pairs(&[("__name__", "process_cpu"), ("service_name", "")]),
            pairs(&[("__name__", "m"), ("service_name", "a"), ("k.8s", "v")]),
            pairs(&[("__name__", "m"), ("service_name", "a"), ("1a", "v")]),
            pairs(&[("__name__", "m"), ("service_name", "a"), ("__type__", "v")]),
            pairs(&[
                ("__name__", "m"),
                ("service_name", "a"),
                ("x", "1"),
                ("x", "2"),
            ]),
            pairs(&[("__name__", "m"), ("service_name", &"v".repeat(2049))]),
            many,
        ] {
            assert!(check_labels(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sample_labels_make_series() {
        let p = Profile {
            sample_type: vec![pprof_proto::ValueType { r#type: 1, unit: 2 }],
            string_table: ["", "cpu", "ns", "tid", "1", "2", "service_name", "x"]
                .map(String::from)
                .to_vec(),
            sample: vec![
                pprof_proto::Sample {
                    location_id: vec![],
                    value: vec![1],
                    label: vec![pprof_proto::Label {
                        key: 3,
                        str: 4,
                        ..Default::default()
                    }],
                },
                pprof_proto::Sample {
                    location_id: vec![],
                    value: vec![1],
                    label: vec![
                        pprof_proto::Label {
                            key: 3,
                            str: 5,
                            ..Default::default()
                        },
                        pprof_proto::Label {
                            key: 6,
                            str: 7,
                            ..Default::default()
                        },
                    ],
                },
            ],
            ..Default::default()
        };
        let sets = split_series(&p, &pairs(&[("service_name", "s")]));
        assert_eq!(
            sets,
            [
                pairs(&[("service_name", "s"), ("tid", "1")]),
                pairs(&[("service_name", "s"), ("tid", "2")]),
            ]
        );
    }

    #[test]
    fn profile_rules_refuse() {
        let now = SystemTime::now();
        let t = now.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64;
        let good = Profile {
            sample_type: vec![pprof_proto::ValueType { r#type: 1, unit: 2 }],
            string_table: ["", "cpu", "ns"].map(String::from).to_vec(),
            time_nanos: t,
            ..Default::default()
        };
        assert_eq!(check_profile(&good, 10, now), Ok(()));
        let old = Profile {
            time_nanos: t - 3601 * 1_000_000_000,
            ..good.clone()
        };
        let dash = Profile {
            string_table: ["", "cpu-x", "ns"].map(String::from).to_vec(),
            ..good.clone()
        };
        let many = Profile {
            sample: vec![
                pprof_proto::Sample {
                    value: vec![1],
                    ..Default::default()
                };
                MAX_SAMPLES + 1
            ],
            ..good.clone()
        };
        let mismatch = Profile {
            sample: vec![pprof_proto::Sample {
                value: vec![1, 2],
                ..Default::default()
            }],
            ..good.clone()
        };
        let zero_location = Profile {
            location: vec![pprof_proto::Location::default()],
            ..good.clone()
        };
        for bad in [old, dash, many, mismatch, zero_location] {
            assert!(check_profile(&bad, 10, now).is_err(), "{bad:?}");
        }
        assert!(check_profile(&good, MAX_PROFILE_BYTES + 1, now).is_err());
    }
}
