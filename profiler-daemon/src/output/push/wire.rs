//! The push API's messages, as Pyroscope publishes them in
//! `api/push/v1/push.proto` and `api/types/v1/types.proto` (package
//! `push.v1`, service `PusherService`, unchanged from release 1.0 to 2.2),
//! written here with prost's derive: the field numbers are the contract.
//! The tests' receiver decodes them from its own `.proto` files, so a
//! mistake here shows there.
//!
//! Errors come back in the Connect protocol's unary error form: an HTTP
//! status and a JSON body `{"code": "...", "message": "..."}`.

use prost::Message;

/// `push.v1.PushRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<RawProfileSeries>,
}

/// `push.v1.RawProfileSeries`. Field 3 (annotations) is dropped by the
/// server and not sent.
#[derive(Clone, PartialEq, Message)]
pub struct RawProfileSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// `types.v1.LabelPair`.
#[derive(Clone, PartialEq, Message)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `push.v1.RawSample`: a pprof profile, gzipped or not.
#[derive(Clone, PartialEq, Message)]
pub struct RawSample {
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
    /// A UUID naming this profile.
    #[prost(string, tag = "2")]
    pub id: String,
}

/// One series with one profile, encoded: the body of one push.
pub fn encode(labels: &[(String, String)], raw_profile: Vec<u8>, id: String) -> Vec<u8> {
    PushRequest {
        series: vec![RawProfileSeries {
            labels: labels
                .iter()
                .map(|(name, value)| LabelPair {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            samples: vec![RawSample { raw_profile, id }],
        }],
    }
    .encode_to_vec()
}

/// A profile serialized and gzipped at the fastest level: the server
/// only inflates it, and pushing must cost the node little CPU.
pub fn gzip(profile: &pprof_proto::Profile) -> Vec<u8> {
    gzip_bytes(&profile.encode_to_vec())
}

/// `raw` gzipped at the fastest level.
pub fn gzip_bytes(raw: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(raw.len() / 3 + 64),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(raw);
    enc.finish().unwrap_or_default()
}

/// A random (version 4) UUID in its usual text form.
pub fn uuid() -> String {
    let mut b = fastrand::u128(..).to_be_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A Connect error body, as far as it is read.
#[derive(Debug, serde::Deserialize)]
struct ConnectError {
    code: Option<String>,
    message: Option<String>,
}

/// The reason an error answer gives, on one line: `code: message` from a
/// Connect JSON body, else the body's first line; at most 300 characters.
pub fn error_reason(body: &[u8]) -> String {
    let text = match serde_json::from_slice::<ConnectError>(body) {
        Ok(ConnectError { code, message }) => {
            let parts: Vec<String> = [code, message].into_iter().flatten().collect();
            parts.join(": ")
        }
        Err(_) => String::from_utf8_lossy(body)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_owned(),
    };
    one_line(&text)
}

/// `text` on one line (control characters as spaces), at most 300
/// characters: what a server says, fit for a log line.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bytes_follow_the_field_numbers() {
        let body = encode(&[("a".into(), "b".into())], vec![0x1f, 0x8b], "id".into());
        // series (1, len) { labels (1, len) { name (1) "a", value (2) "b" },
        // samples (2, len) { raw_profile (1) 1f 8b, ID (2) "id" } }
        let want = [
            0x0a, 0x12, //
            0x0a, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b', //
            0x12, 0x08, 0x0a, 0x02, 0x1f, 0x8b, 0x12, 0x02, b'i', b'd',
        ];
        assert_eq!(body, want);
        assert_eq!(
            PushRequest::decode(body.as_slice()).unwrap().series.len(),
            1
        );
    }

    #[test]
    fn uuids_are_version_4() {
        let a = uuid();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!("89ab".contains(&a[19..20]));
        assert_ne!(a, uuid());
    }

    #[test]
    fn reasons() {
        assert_eq!(
            error_reason(br#"{"code":"invalid_argument","message":"too old\nreally"}"#),
            "invalid_argument: too old really"
        );
        assert_eq!(error_reason(b"plain text\nmore"), "plain text");
        assert_eq!(error_reason(b""), "");
        assert_eq!(error_reason(&[b'x'; 1000]).len(), 300);
    }
}
