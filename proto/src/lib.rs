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
    #[error("gzip: decompresses to more than {} bytes", limit)]
    TooLarge { limit: u64 },
}

/// The most a gzipped profile may decompress to. Real profiles are a few
/// MiB; past this a file is a gzip bomb, refused before it takes the
/// reader's memory.
pub const MAX_DECOMPRESSED: u64 = 256 << 20;

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
    decode_limited(bytes, MAX_DECOMPRESSED)
}

/// [`decode`] with `limit` on the decompressed size.
fn decode_limited(bytes: &[u8], limit: u64) -> Result<Profile, DecodeError> {
    if bytes.starts_with(&GZIP_MAGIC) {
        let hint = bytes
            .len()
            .saturating_mul(4)
            .min(usize::try_from(limit).unwrap_or(usize::MAX));
        let mut raw = Vec::with_capacity(hint);
        // One byte past the limit tells "exactly at" from "beyond".
        GzDecoder::new(bytes)
            .take(limit.saturating_add(1))
            .read_to_end(&mut raw)?;
        if raw.len() as u64 > limit {
            return Err(DecodeError::TooLarge { limit });
        }
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

    /// `len` zero bytes, gzipped: a few KiB that inflate a thousandfold.
    fn zeros_gzipped(len: usize) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        let chunk = vec![0u8; 64 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            enc.write_all(&chunk[..n]).expect("gzip into a Vec");
            left -= n;
        }
        enc.finish().expect("gzip into a Vec")
    }

    #[test]
    fn gzip_bomb_is_refused_past_the_limit() {
        assert_eq!(MAX_DECOMPRESSED, 256 << 20);
        // The same code path as `decode`, with a limit a unit test can
        // reach quickly. Zeros inflate fine and then fail as protobuf.
        let limit = 1 << 20;
        let at = zeros_gzipped(limit as usize);
        assert!(at.len() < 8 * 1024, "{}", at.len());
        assert!(
            matches!(decode_limited(&at, limit), Err(DecodeError::Protobuf(_))),
            "at the limit"
        );
        let past = zeros_gzipped(limit as usize + 1);
        match decode_limited(&past, limit) {
            Err(e @ DecodeError::TooLarge { .. }) => {
                assert_eq!(
                    e.to_string(),
                    "gzip: decompresses to more than 1048576 bytes"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    mod properties {
        use super::super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;

        fn value_type() -> impl Strategy<Value = ValueType> {
            (0..64i64, 0..64i64).prop_map(|(r#type, unit)| ValueType { r#type, unit })
        }

        fn label() -> impl Strategy<Value = Label> {
            (any::<i64>(), any::<i64>(), any::<i64>(), any::<i64>()).prop_map(
                |(key, str, num, num_unit)| Label {
                    key,
                    str,
                    num,
                    num_unit,
                },
            )
        }

        fn sample() -> impl Strategy<Value = Sample> {
            (
                vec(any::<u64>(), 0..8),
                vec(any::<i64>(), 0..4),
                vec(label(), 0..4),
            )
                .prop_map(|(location_id, value, label)| Sample {
                    location_id,
                    value,
                    label,
                })
        }

        fn location() -> impl Strategy<Value = Location> {
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                vec((any::<u64>(), any::<i64>(), any::<i64>()), 0..4),
                any::<bool>(),
            )
                .prop_map(|(id, mapping_id, address, lines, is_folded)| Location {
                    id,
                    mapping_id,
                    address,
                    line: lines
                        .into_iter()
                        .map(|(function_id, line, column)| Line {
                            function_id,
                            line,
                            column,
                        })
                        .collect(),
                    is_folded,
                })
        }

        fn mapping() -> impl Strategy<Value = Mapping> {
            (any::<[u64; 4]>(), any::<[i64; 2]>(), any::<[bool; 4]>()).prop_map(
                |([id, memory_start, memory_limit, file_offset], [filename, build_id], flags)| {
                    Mapping {
                        id,
                        memory_start,
                        memory_limit,
                        file_offset,
                        filename,
                        build_id,
                        has_functions: flags[0],
                        has_filenames: flags[1],
                        has_line_numbers: flags[2],
                        has_inline_frames: flags[3],
                    }
                },
            )
        }

        fn function() -> impl Strategy<Value = Function> {
            (any::<u64>(), any::<[i64; 4]>()).prop_map(
                |(id, [name, system_name, filename, start_line])| Function {
                    id,
                    name,
                    system_name,
                    filename,
                    start_line,
                },
            )
        }

        fn profile() -> impl Strategy<Value = Profile> {
            (
                vec(value_type(), 0..4),
                vec(sample(), 0..16),
                vec(mapping(), 0..4),
                vec(location(), 0..16),
                vec(function(), 0..8),
                vec(".{0,12}", 0..12),
                any::<[i64; 4]>(),
                proptest::option::of(value_type()),
            )
                .prop_map(
                    |(
                        sample_type,
                        sample,
                        mapping,
                        location,
                        function,
                        strings,
                        nums,
                        period_type,
                    )| {
                        let [time_nanos, duration_nanos, period, default_sample_type] = nums;
                        // pprof's first string is always "".
                        let string_table = std::iter::once(String::new()).chain(strings).collect();
                        Profile {
                            sample_type,
                            sample,
                            mapping,
                            location,
                            function,
                            string_table,
                            time_nanos,
                            duration_nanos,
                            period_type,
                            period,
                            default_sample_type,
                            ..Default::default()
                        }
                    },
                )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// Every field survives encode, gzip and decode.
            #[test]
            fn round_trip(p in profile()) {
                let bytes = encode_gzip(&p);
                prop_assert_eq!(decode(&bytes).expect("decode"), p.clone());
                prop_assert_eq!(decode(&p.encode_to_vec()).expect("decode plain"), p);
            }

            /// A cut or altered file is an error or some profile, never a
            /// panic.
            #[test]
            fn damaged_files_do_not_panic(
                p in profile(),
                cut in any::<prop::sample::Index>(),
                flips in vec((any::<prop::sample::Index>(), 1..=255u8), 0..4),
            ) {
                let bytes = encode_gzip(&p);
                let _ = decode(&bytes[..cut.index(bytes.len())]);
                let mut damaged = bytes.clone();
                for (at, x) in &flips {
                    damaged[at.index(bytes.len())] ^= x;
                }
                let _ = decode(&damaged);
                let plain = p.encode_to_vec();
                if !plain.is_empty() {
                    let _ = decode(&plain[..cut.index(plain.len())]);
                }
            }

            #[test]
            fn arbitrary_bytes_do_not_panic(bytes in vec(any::<u8>(), 0..512), gzip in any::<bool>()) {
                let mut input = bytes;
                if gzip {
                    input.splice(0..0, GZIP_MAGIC);
                }
                let _ = decode(&input);
            }
        }
    }
}
