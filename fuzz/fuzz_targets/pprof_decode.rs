//! Any bytes as a pprof file: an error or a profile, and a profile that
//! decodes survives encode, gzip and decode unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(profile) = pprof_proto::decode(data) else {
        return;
    };
    let again = pprof_proto::decode(&pprof_proto::encode_gzip(&profile)).expect("re-decode");
    assert_eq!(again, profile);
    let plain = pprof_proto::decode(&profile.encode_to_vec()).expect("re-decode plain");
    assert_eq!(plain, profile);
});
