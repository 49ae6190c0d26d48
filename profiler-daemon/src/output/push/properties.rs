//! Property tests of the push's preparation: whatever the samples and
//! labels, the uploads hold every value, carry labels a Pyroscope server
//! accepts, and stay within the limits; any URL text is refused or becomes
//! the push path, and its userinfo never shows.

use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message;

use super::{chunks, prepare, series, wire};
use crate::config::push::{self as settings, PUSH_PATH, parse_url, redact, valid_label_name};
use crate::model::profile_kind::ProfileKind;

/// Label keys a sample may have: ours, a static one, odd ones.
const KEYS: [&str; 10] = [
    "pid",
    "tid",
    "thread",
    "lock",
    "container",
    "namespace",
    "systemd_unit",
    "node",
    "env",
    "team.x",
];

/// Stack, value, and labels as (index into [`KEYS`], value).
type Drawn = (Vec<u64>, i64, Vec<(usize, String)>);

fn sample() -> impl Strategy<Value = Drawn> {
    (
        vec(1u64..6, 1..4),
        // Sums that cannot saturate (pprof.rs tests saturation).
        -(1i64 << 40)..(1i64 << 40),
        vec((0..KEYS.len(), "[a-z0-9é/ -]{0,5}"), 0..6),
    )
}

fn build_profile(samples: &[Drawn]) -> pprof_proto::Profile {
    type Labelled<'a> = (Vec<u64>, i64, Vec<(&'a str, &'a str)>);
    let labelled: Vec<Labelled> = samples
        .iter()
        .map(|(stack, v, labels)| {
            let mut seen = Vec::new();
            let labels = labels
                .iter()
                .filter(|(k, _)| {
                    let fresh = !seen.contains(k);
                    seen.push(*k);
                    fresh
                })
                .map(|(k, v)| (KEYS[*k], v.as_str()))
                .collect();
            (stack.clone(), *v, labels)
        })
        .collect();
    let refs: Vec<series::TestSample> = labelled
        .iter()
        .map(|(s, v, l)| (s.as_slice(), *v, l.as_slice()))
        .collect();
    let mut p = series::tests_profile(&refs);
    for id in 1..6 {
        p.location.push(pprof_proto::Location {
            id,
            ..Default::default()
        });
    }
    p
}

fn push_settings(table: &str) -> settings::PushSettings {
    settings::build(
        "http://h",
        Some(&toml::from_str(table).unwrap()),
        &[
            ("env".to_owned(), "e".to_owned()),
            ("team.x".to_owned(), "t".to_owned()),
        ],
        Duration::from_secs(10),
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Series hold every value, no sample label, and
    /// labels the strictest server takes: sorted, unique, legacy names,
    /// `__name__` and `service_name` set, at most 30.
    #[test]
    fn series_keep_values_and_valid_labels(
        samples in vec(sample(), 0..24),
        keep_pid in any::<bool>(),
    ) {
        let p = build_profile(&samples);
        let s = push_settings(if keep_pid { "labels = [\"pid\", \"node\"]" } else { "" });
        let all = series::series_of(ProfileKind::Heap, &p, &s);
        let total: i64 = p.sample.iter().map(|x| x.value[0]).sum();
        let pushed: i64 = all.iter().flat_map(|x| &x.samples).map(|x| x.value[0]).sum();
        prop_assert_eq!(pushed, total);
        for x in &all {
            prop_assert!(x.samples.iter().all(|s| s.label.is_empty()));
            let names: Vec<&str> = x.labels.iter().map(|(k, _)| k.as_str()).collect();
            let mut sorted = names.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(&sorted, &names);
            prop_assert!(names.len() <= 30);
            prop_assert!(names.contains(&"__name__") && names.contains(&"service_name"));
            prop_assert!(names.contains(&"__delta__"));
            prop_assert!(!keep_pid || !names.contains(&"tid"));
            for (k, v) in &x.labels {
                prop_assert!(valid_label_name(k), "{}", k);
                prop_assert!(!v.is_empty(), "{}", k);
            }
        }
    }

    /// Every upload decodes as one series with one profile within the
    /// limits, and together they hold every sample.
    #[test]
    fn uploads_stay_within_the_limits(
        samples in vec(sample(), 1..40),
        max_samples in 1i64..8,
    ) {
        let p = build_profile(&samples);
        let mut s = push_settings(&format!("max_samples = {max_samples}"));
        s.max_profile_bytes = 4096;
        let (uploads, too_large) = prepare(ProfileKind::Cpu, &p, &s);
        prop_assert_eq!(too_large, 0);
        let series = series::series_of(ProfileKind::Cpu, &p, &s);
        let mut count = 0;
        for u in &uploads {
            let request = wire::PushRequest::decode(u.body.as_ref()).unwrap();
            prop_assert_eq!(request.series.len(), 1);
            prop_assert_eq!(request.series[0].samples.len(), 1);
            let profile = pprof_proto::decode(&request.series[0].samples[0].raw_profile).unwrap();
            prop_assert!(profile.sample.len() <= max_samples as usize);
            prop_assert!(profile.encoded_len() <= 4096);
            count += profile.sample.len();
        }
        prop_assert_eq!(count, series.iter().map(|x| x.samples.len()).sum::<usize>());
        let index = chunks::Index::new(&p);
        let whole = chunks::subset(&index, &p.sample);
        prop_assert_eq!(whole.sample.len(), p.sample.len());
    }

    /// Any text as a push URL: an error, or an http(s) URL ending in the
    /// push path, without userinfo, that parses again to itself; the
    /// redacted text never holds the password.
    #[test]
    fn push_url_is_checked(raw in prop_oneof![
        ".{0,24}",
        "(http|https|ftp)://([a-z]{1,4}:[a-z]{1,4}@)?[a-z0-9.:\\[\\]/?#%-]{0,20}",
    ]) {
        if let Ok(e) = parse_url(&raw) {
            prop_assert!(e.url.starts_with("http://") || e.url.starts_with("https://"), "{}", e.url);
            prop_assert!(e.url.ends_with(PUSH_PATH), "{}", e.url);
            prop_assert!(!e.url.contains('@') || !e.url.split('/').nth(2).unwrap_or("").contains('@'));
            prop_assert_eq!(parse_url(&e.url).map(|x| x.url), Ok(e.url.clone()));
            if let Some((_, password)) = &e.userinfo
                && !password.expose().is_empty()
            {
                let shown = format!(":{}@", password.expose());
                prop_assert!(!redact(&raw).contains(&shown), "{}", redact(&raw));
            }
        }
    }
}
