//! Property test of the output file names: every window start and counter
//! gives a name of the contract's form whose time stamp is the window's.

use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;

use super::file_name;
use crate::model::profile_kind::ProfileKind;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn names_carry_the_window_start(
        kind in prop::sample::select(&ProfileKind::ALL[..]),
        // 1970 to the end of 9999: the stamp's four-digit years.
        secs in 0..253_402_300_800u64,
        nanos in 0..1_000_000_000u32,
        n in prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()],
    ) {
        let start = UNIX_EPOCH + Duration::new(secs, nanos);
        let name = file_name(kind, start, n);
        let rest = name
            .strip_prefix(&format!("{kind}-"))
            .and_then(|r| r.strip_suffix(".pb.gz"))
            .expect("<kind>-...pb.gz");
        let (stamp, suffix) = match rest.split_once('-') {
            Some((stamp, suffix)) => (stamp, Some(suffix)),
            None => (rest, None),
        };
        prop_assert_eq!(suffix.map(|s| s.parse::<u32>().expect("a number")), (n > 0).then_some(n));
        // humantime writes the same instant as RFC 3339; the stamp is its
        // digits.
        let rfc = humantime::format_rfc3339_seconds(start).to_string();
        let digits: String = rfc.chars().filter(char::is_ascii_digit).collect();
        prop_assert_eq!(stamp.len(), 16, "{}", stamp);
        prop_assert_eq!(&stamp[8..9], "T");
        prop_assert_eq!(&stamp[15..], "Z");
        prop_assert_eq!(format!("{}{}", &stamp[..8], &stamp[9..15]), digits);
    }
}
