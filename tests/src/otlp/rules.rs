//! What an OTLP/HTTP profiles receiver accepts, from the published
//! contract (opentelemetry-proto v1.11.0: docs/specification.md and the
//! `v1development` profiles.proto's field rules), so that the tests check
//! the daemon against the proto and not against the daemon's own idea of
//! it:
//!
//! - OTLP/HTTP: `POST /v1development/profiles` (the signal's default
//!   path), `Content-Type: application/x-protobuf`, the body gzipped only
//!   with `Content-Encoding: gzip`, at most 64 MiB before compression;
//!   errors as an HTTP status and a `google.rpc.Status`;
//! - the dictionary: present; every table's entry 0 present and its zero
//!   value (`string_table[0] == ""`; the link table's 16/8 zero bytes or
//!   empty ids); every index in range; a function has a name, system name
//!   or file; attribute keys non-empty; no string twice (SHOULD);
//! - the resources: at least one; attribute keys non-empty and unique,
//!   `service.name` set (the semantic conventions' required resource
//!   attribute); scopes and profiles present;
//! - each profile: its sample type and period type in range, its time
//!   plausible (within the hour before now, at most 10 minutes ahead), a
//!   duration under a day, a 16-byte id not all zero when set, the original
//!   payload and its format set together, attribute keys unique;
//! - each sample: stack and link in range, at least one value or
//!   timestamp, as many values as timestamps when both are given (one
//!   sample type per profile), attribute keys unique.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;

use super::api::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceRequest;
use super::api::opentelemetry::proto::common::v1::{AnyValue, any_value};
use super::api::opentelemetry::proto::profiles::v1development::{
    Function, KeyValueAndUnit, Location, Mapping, ProfilesDictionary, Stack,
};

pub const PROFILES_PATH: &str = "/v1development/profiles";
pub const MAX_REQUEST_BYTES: u64 = 64 << 20;
pub const OLDEST: Duration = Duration::from_secs(3600);
pub const NEWEST: Duration = Duration::from_secs(600);

/// The parts of a request the rules look at.
pub struct HttpRequest<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a BTreeMap<String, String>,
    pub body: &'a [u8],
}

/// The request, decoded and valid, or the status and reason a receiver
/// would answer with.
pub fn check(
    r: &HttpRequest,
    now: SystemTime,
) -> Result<ExportProfilesServiceRequest, (u16, String)> {
    if r.method != "POST" {
        return Err((405, format!("method {}", r.method)));
    }
    if r.path != PROFILES_PATH {
        return Err((404, format!("no signal at {}", r.path)));
    }
    let content_type = r.headers.get("content-type").map(String::as_str);
    if content_type != Some("application/x-protobuf") {
        return Err((415, format!("content type {content_type:?}")));
    }
    let raw = match r.headers.get("content-encoding").map(String::as_str) {
        None => r.body.to_vec(),
        Some("gzip") => gunzip(r.body).map_err(|e| (400, e))?,
        Some(other) => return Err((415, format!("content encoding {other}"))),
    };
    let request = ExportProfilesServiceRequest::decode(raw.as_slice())
        .map_err(|e| (400, format!("not an ExportProfilesServiceRequest: {e}")))?;
    validate(&request, now).map_err(|why| (400, why))?;
    Ok(request)
}

/// A gzipped request body decoded.
pub fn decode_gzipped(body: &[u8]) -> Result<ExportProfilesServiceRequest, String> {
    let raw = gunzip(body)?;
    ExportProfilesServiceRequest::decode(raw.as_slice())
        .map_err(|e| format!("not an ExportProfilesServiceRequest: {e}"))
}

/// The body inflated, at most [`MAX_REQUEST_BYTES`].
pub fn gunzip(body: &[u8]) -> Result<Vec<u8>, String> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(MAX_REQUEST_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(|e| format!("gzip: {e}"))?;
    if raw.len() as u64 > MAX_REQUEST_BYTES {
        return Err("larger than 64 MiB inflated".into());
    }
    Ok(raw)
}

/// The proto's rules for a request, as of `now`.
pub fn validate(request: &ExportProfilesServiceRequest, now: SystemTime) -> Result<(), String> {
    let d = request
        .dictionary
        .as_ref()
        .ok_or("no dictionary (profiles refer to it)")?;
    check_dictionary(d)?;
    if request.resource_profiles.is_empty() {
        return Err("no resource profiles".into());
    }
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    for (ri, rp) in request.resource_profiles.iter().enumerate() {
        let resource = rp.resource.as_ref().ok_or(format!("resource {ri}: none"))?;
        let mut keys = HashSet::new();
        for a in &resource.attributes {
            if a.key.is_empty() || !keys.insert(a.key.as_str()) {
                return Err(format!(
                    "resource {ri}: attribute key {:?} empty or twice",
                    a.key
                ));
            }
        }
        if !keys.contains("service.name") {
            return Err(format!("resource {ri}: no service.name"));
        }
        if rp.scope_profiles.is_empty() {
            return Err(format!("resource {ri}: no scope profiles"));
        }
        for sp in &rp.scope_profiles {
            if sp.profiles.is_empty() {
                return Err(format!("resource {ri}: a scope without profiles"));
            }
            for p in &sp.profiles {
                let at = |what: String| format!("resource {ri}: {what}");
                let t = p.sample_type.as_ref().ok_or(at("no sample type".into()))?;
                index(t.type_strindex, d.string_table.len(), "sample type")?;
                index(t.unit_strindex, d.string_table.len(), "sample unit")?;
                if t.type_strindex == 0 {
                    return Err(at("a sample type without a name".into()));
                }
                if let Some(pt) = &p.period_type {
                    index(pt.type_strindex, d.string_table.len(), "period type")?;
                    index(pt.unit_strindex, d.string_table.len(), "period unit")?;
                }
                let time = Duration::from_nanos(p.time_unix_nano);
                if time + OLDEST < now || time > now + NEWEST {
                    return Err(at(format!("time {} ns is implausible", p.time_unix_nano)));
                }
                if p.duration_nano == 0 || p.duration_nano > 86_400_000_000_000 {
                    return Err(at(format!("duration {} ns", p.duration_nano)));
                }
                if !p.profile_id.is_empty()
                    && (p.profile_id.len() != 16 || p.profile_id.iter().all(|&b| b == 0))
                {
                    return Err(at(format!("profile id {:?}", p.profile_id)));
                }
                if p.original_payload_format.is_empty() != p.original_payload.is_empty() {
                    return Err(at(
                        "original payload without its format, or the reverse".into()
                    ));
                }
                unique_keys(&p.attribute_indices, d, "profile")?;
                if p.samples.is_empty() {
                    return Err(at("a profile without samples".into()));
                }
                for s in &p.samples {
                    index(s.stack_index, d.stack_table.len(), "stack")?;
                    index(s.link_index, d.link_table.len(), "link")?;
                    unique_keys(&s.attribute_indices, d, "sample")?;
                    match (s.values.len(), s.timestamps_unix_nano.len()) {
                        (0, 0) => return Err(at("a sample without values or timestamps".into())),
                        (v, t) if v > 0 && t > 0 && v != t => {
                            return Err(at(format!("{v} values but {t} timestamps")));
                        }
                        (v, 0) if v != 1 => {
                            return Err(at(format!("{v} values for one sample type")));
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(())
}

fn index(i: i32, len: usize, what: &str) -> Result<(), String> {
    match usize::try_from(i) {
        Ok(i) if i < len => Ok(()),
        _ => Err(format!("{what} index {i} out of range (table of {len})")),
    }
}

/// Attributes `indices` in range, their keys unique.
fn unique_keys(indices: &[i32], d: &ProfilesDictionary, what: &str) -> Result<(), String> {
    let mut keys = HashSet::new();
    for &a in indices {
        index(a, d.attribute_table.len(), &format!("{what} attribute"))?;
        let key = d.attribute_table[a as usize].key_strindex;
        if !keys.insert(key) {
            return Err(format!("{what}: attribute key {key} twice"));
        }
    }
    Ok(())
}

fn check_dictionary(d: &ProfilesDictionary) -> Result<(), String> {
    let strings = d.string_table.len();
    if d.string_table.first().map(String::as_str) != Some("") {
        return Err("string_table[0] is not \"\"".into());
    }
    let zero = [
        (
            d.mapping_table.first() == Some(&Mapping::default()),
            "mapping",
        ),
        (
            d.location_table.first() == Some(&Location::default()),
            "location",
        ),
        (
            d.function_table.first() == Some(&Function::default()),
            "function",
        ),
        (d.stack_table.first() == Some(&Stack::default()), "stack"),
        (
            d.attribute_table.first() == Some(&KeyValueAndUnit::default()),
            "attribute",
        ),
    ];
    for (ok, table) in zero {
        if !ok {
            return Err(format!("{table}_table[0] is missing or not the zero value"));
        }
    }
    let link = d.link_table.first().ok_or("link_table[0] missing")?;
    let zero_id =
        |id: &[u8], len: usize| id.iter().all(|&b| b == 0) && (id.is_empty() || id.len() == len);
    if !zero_id(&link.trace_id, 16) || !zero_id(&link.span_id, 8) {
        return Err("link_table[0] is not the zero link".into());
    }
    let mut seen = HashSet::new();
    for s in &d.string_table {
        if !seen.insert(s) {
            return Err(format!("string {s:?} twice in the table"));
        }
    }
    for (i, m) in d.mapping_table.iter().enumerate().skip(1) {
        index(
            m.filename_strindex,
            strings,
            &format!("mapping {i} filename"),
        )?;
        unique_keys(&m.attribute_indices, d, "mapping")?;
    }
    for (i, l) in d.location_table.iter().enumerate().skip(1) {
        index(
            l.mapping_index,
            d.mapping_table.len(),
            &format!("location {i} mapping"),
        )?;
        unique_keys(&l.attribute_indices, d, "location")?;
        for line in &l.lines {
            index(line.function_index, d.function_table.len(), "line function")?;
        }
    }
    for (i, f) in d.function_table.iter().enumerate().skip(1) {
        for s in [f.name_strindex, f.system_name_strindex, f.filename_strindex] {
            index(s, strings, &format!("function {i} string"))?;
        }
        if f.name_strindex == 0 && f.system_name_strindex == 0 && f.filename_strindex == 0 {
            return Err(format!("function {i} has no name, system name or file"));
        }
    }
    for s in &d.stack_table {
        for &l in &s.location_indices {
            index(l, d.location_table.len(), "stack location")?;
        }
    }
    for (i, a) in d.attribute_table.iter().enumerate().skip(1) {
        index(a.key_strindex, strings, &format!("attribute {i} key"))?;
        index(a.unit_strindex, strings, &format!("attribute {i} unit"))?;
        if d.string_table[a.key_strindex as usize].is_empty() {
            return Err(format!("attribute {i} has an empty key"));
        }
        if let Some(AnyValue {
            value: Some(any_value::Value::StringValueStrindex(s)),
        }) = &a.value
        {
            index(*s, strings, &format!("attribute {i} value"))?;
        }
    }
    Ok(())
}
