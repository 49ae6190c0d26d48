//! The OTLP profiles messages the export sends and reads, as
//! opentelemetry-proto publishes them at [`super::PINNED`]
//! (`opentelemetry/proto/collector/profiles/v1development/profiles_service.proto`,
//! `profiles/v1development/profiles.proto`, `common/v1/common.proto`,
//! `resource/v1/resource.proto`), written here with prost's derive: the
//! field numbers are the contract. Fields the export never sets (schema
//! URLs, entity refs, links' use, original payloads, timestamps per
//! sample) are left out; a decoder skips what it does not know, and an
//! absent field reads as its zero value. The tests' receiver decodes with
//! code generated from the published files, so a mistake here shows there.
//!
//! Error answers carry a `google.rpc.Status` (code 1, message 2, details 3).

use prost::Message;

/// `collector.profiles.v1development.ExportProfilesServiceRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct ExportProfilesServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_profiles: Vec<ResourceProfiles>,
    #[prost(message, optional, tag = "2")]
    pub dictionary: Option<ProfilesDictionary>,
}

/// `collector.profiles.v1development.ExportProfilesServiceResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct ExportProfilesServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportProfilesPartialSuccess>,
}

/// `collector.profiles.v1development.ExportProfilesPartialSuccess`.
#[derive(Clone, PartialEq, Message)]
pub struct ExportProfilesPartialSuccess {
    #[prost(int64, tag = "1")]
    pub rejected_profiles: i64,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

/// `profiles.v1development.ProfilesDictionary`: every table's entry 0 is
/// its zero value.
#[derive(Clone, PartialEq, Message)]
pub struct ProfilesDictionary {
    #[prost(message, repeated, tag = "1")]
    pub mapping_table: Vec<Mapping>,
    #[prost(message, repeated, tag = "2")]
    pub location_table: Vec<Location>,
    #[prost(message, repeated, tag = "3")]
    pub function_table: Vec<Function>,
    #[prost(message, repeated, tag = "4")]
    pub link_table: Vec<Link>,
    #[prost(string, repeated, tag = "5")]
    pub string_table: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub attribute_table: Vec<KeyValueAndUnit>,
    #[prost(message, repeated, tag = "7")]
    pub stack_table: Vec<Stack>,
}

/// `profiles.v1development.ResourceProfiles`.
#[derive(Clone, PartialEq, Message)]
pub struct ResourceProfiles {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_profiles: Vec<ScopeProfiles>,
}

/// `profiles.v1development.ScopeProfiles`.
#[derive(Clone, PartialEq, Message)]
pub struct ScopeProfiles {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub profiles: Vec<Profile>,
}

/// `profiles.v1development.Profile`: one sample type.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, optional, tag = "1")]
    pub sample_type: Option<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    #[prost(uint64, tag = "4")]
    pub duration_nano: u64,
    #[prost(message, optional, tag = "5")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "6")]
    pub period: i64,
    /// 16 bytes, not all zero.
    #[prost(bytes = "vec", tag = "7")]
    pub profile_id: Vec<u8>,
    #[prost(uint32, tag = "8")]
    pub dropped_attributes_count: u32,
    #[prost(int32, repeated, tag = "11")]
    pub attribute_indices: Vec<i32>,
}

/// `profiles.v1development.Link`.
#[derive(Clone, PartialEq, Message)]
pub struct Link {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
}

/// `profiles.v1development.ValueType`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub struct ValueType {
    #[prost(int32, tag = "1")]
    pub type_strindex: i32,
    #[prost(int32, tag = "2")]
    pub unit_strindex: i32,
}

/// `profiles.v1development.Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(int32, tag = "1")]
    pub stack_index: i32,
    #[prost(int32, repeated, tag = "2")]
    pub attribute_indices: Vec<i32>,
    #[prost(int32, tag = "3")]
    pub link_index: i32,
    #[prost(int64, repeated, tag = "4")]
    pub values: Vec<i64>,
}

/// `profiles.v1development.Mapping`.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub memory_start: u64,
    #[prost(uint64, tag = "2")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "3")]
    pub file_offset: u64,
    #[prost(int32, tag = "4")]
    pub filename_strindex: i32,
    #[prost(int32, repeated, tag = "5")]
    pub attribute_indices: Vec<i32>,
}

/// `profiles.v1development.Stack`: leaf first.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Stack {
    #[prost(int32, repeated, tag = "1")]
    pub location_indices: Vec<i32>,
}

/// `profiles.v1development.Location`.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Location {
    #[prost(int32, tag = "1")]
    pub mapping_index: i32,
    #[prost(uint64, tag = "2")]
    pub address: u64,
    #[prost(message, repeated, tag = "3")]
    pub lines: Vec<Line>,
    #[prost(int32, repeated, tag = "4")]
    pub attribute_indices: Vec<i32>,
}

/// `profiles.v1development.Line`.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Line {
    #[prost(int32, tag = "1")]
    pub function_index: i32,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// `profiles.v1development.Function`.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Function {
    #[prost(int32, tag = "1")]
    pub name_strindex: i32,
    #[prost(int32, tag = "2")]
    pub system_name_strindex: i32,
    #[prost(int32, tag = "3")]
    pub filename_strindex: i32,
    #[prost(int64, tag = "4")]
    pub start_line: i64,
}

/// `profiles.v1development.KeyValueAndUnit`.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValueAndUnit {
    #[prost(int32, tag = "1")]
    pub key_strindex: i32,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
    #[prost(int32, tag = "3")]
    pub unit_strindex: i32,
}

/// `common.v1.AnyValue`, the two kinds the export sends.
#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 3")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    /// `common.v1.AnyValue.value`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(int64, tag = "3")]
        IntValue(i64),
    }
}

/// `common.v1.KeyValue` (the `key` form, not `key_strindex`).
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `common.v1.InstrumentationScope`.
#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `resource.v1.Resource`.
#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

/// `google.rpc.Status`, as far as it is read.
#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

impl AnyValue {
    pub fn string(s: impl Into<String>) -> AnyValue {
        AnyValue {
            value: Some(any_value::Value::StringValue(s.into())),
        }
    }

    pub fn int(i: i64) -> AnyValue {
        AnyValue {
            value: Some(any_value::Value::IntValue(i)),
        }
    }
}

/// What a 200 answer says: the profiles it refused, and its message (a
/// refusal's reason or a warning). An empty or unreadable body is a full
/// success (the request was taken).
pub fn accepted(body: &[u8]) -> (u64, String) {
    match ExportProfilesServiceResponse::decode(body) {
        Ok(ExportProfilesServiceResponse {
            partial_success: Some(p),
        }) => (
            u64::try_from(p.rejected_profiles).unwrap_or(0),
            crate::output::push::wire::one_line(&p.error_message),
        ),
        _ => (0, String::new()),
    }
}

/// The reason an error answer gives, on one line: the `google.rpc.Status`
/// message (with its code when set), else the body as text.
pub fn error_reason(body: &[u8]) -> String {
    match Status::decode(body) {
        Ok(Status { code, message }) if !message.is_empty() => {
            let text = match code {
                0 => message,
                code => format!("code {code}: {message}"),
            };
            crate::output::push::wire::one_line(&text)
        }
        _ => crate::output::push::wire::error_reason(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read() {
        let body = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 3,
                error_message: "too\nmany".into(),
            }),
        }
        .encode_to_vec();
        assert_eq!(accepted(&body), (3, "too many".to_owned()));
        assert_eq!(accepted(b""), (0, String::new()));
        let status = Status {
            code: 3,
            message: "bad dictionary".into(),
        }
        .encode_to_vec();
        assert_eq!(error_reason(&status), "code 3: bad dictionary");
        assert_eq!(error_reason(b"plain text"), "plain text");
    }

    #[test]
    fn field_numbers() {
        let p = Profile {
            time_unix_nano: 1,
            ..Default::default()
        };
        // time_unix_nano is field 3, fixed64: tag 0x19 then 8 bytes.
        assert_eq!(p.encode_to_vec(), [0x19, 1, 0, 0, 0, 0, 0, 0, 0]);
    }
}
