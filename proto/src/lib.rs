//! pprof's `perftools.profiles` messages (generated from `profile.proto` at
//! build time) and the gzip framing that pprof files use on disk.

use std::io::{Read, Write};

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use prost::Message;

/// The generated messages, under the protobuf package path.
pub mod perftools {
    pub mod profiles {
        include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
    }
}

pub use perftools::profiles::{
    Function, Label, Line, Location, Mapping, Profile, Sample, ValueType,
};

/// Why a pprof file could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("gzip: {0}")]
    Gzip(#[from] std::io::Error),
    #[error("protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
}

/// The two magic bytes every gzip stream starts with.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Serializes `profile` and gzips it, as pprof files are stored.
pub fn encode_gzip(profile: &Profile) -> Vec<u8> {
    let raw = profile.encode_to_vec();
    // Profiles compress well; reserve a fraction up front to avoid regrowth.
    let mut enc = GzEncoder::new(
        Vec::with_capacity(raw.len() / 4 + 64),
        Compression::default(),
    );
    // Writing into a Vec cannot fail, so neither can the encoder.
    enc.write_all(&raw).expect("gzip into a Vec cannot fail");
    enc.finish().expect("gzip into a Vec cannot fail")
}

/// Decodes a profile from gzipped or plain serialized bytes; pprof readers
/// accept both, so this does too.
pub fn decode(bytes: &[u8]) -> Result<Profile, DecodeError> {
    if bytes.starts_with(&GZIP_MAGIC) {
        let mut raw = Vec::with_capacity(bytes.len() * 4);
        GzDecoder::new(bytes).read_to_end(&mut raw)?;
        Ok(Profile::decode(raw.as_slice())?)
    } else {
        Ok(Profile::decode(bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_profile() -> Profile {
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            sample: vec![Sample {
                location_id: vec![1],
                value: vec![42],
                label: vec![Label {
                    key: 3,
                    str: 4,
                    num: 0,
                    num_unit: 0,
                }],
            }],
            mapping: vec![Mapping {
                id: 1,
                memory_start: 0x1000,
                memory_limit: 0x2000,
                filename: 5,
                has_functions: true,
                ..Default::default()
            }],
            location: vec![Location {
                id: 1,
                mapping_id: 1,
                address: 0x1234,
                line: vec![Line {
                    function_id: 1,
                    line: 7,
                    column: 3,
                }],
                is_folded: false,
            }],
            function: vec![Function {
                id: 1,
                name: 6,
                system_name: 6,
                filename: 0,
                start_line: 0,
            }],
            string_table: ["", "samples", "count", "pid", "1", "/bin/x", "main"]
                .map(String::from)
                .to_vec(),
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 60_000_000_000,
            period_type: Some(ValueType { r#type: 1, unit: 2 }),
            period: 10_000_000,
            default_sample_type: 1,
            doc_url: 0,
            ..Default::default()
        }
    }

    #[test]
    fn gzip_round_trip() {
        let p = sample_profile();
        let bytes = encode_gzip(&p);
        assert!(bytes.starts_with(&GZIP_MAGIC));
        assert_eq!(decode(&bytes).expect("decode gzip"), p);
    }

    #[test]
    fn plain_bytes_decode() {
        let p = sample_profile();
        assert_eq!(decode(&p.encode_to_vec()).expect("decode plain"), p);
    }

    #[test]
    fn corrupt_gzip_is_an_error() {
        let mut bytes = encode_gzip(&sample_profile());
        bytes.truncate(bytes.len() / 2);
        assert!(matches!(decode(&bytes), Err(DecodeError::Gzip(_))));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(matches!(
            decode(&[0xff, 0xff, 0xff]),
            Err(DecodeError::Protobuf(_))
        ));
    }
}
