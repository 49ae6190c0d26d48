//! Property tests of the report readers: whatever the files hold, `top`
//! and `flamegraph` give a report or an error, never a panic, and the
//! merged values are the files' values.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use pprof_proto::Profile;
use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message;

use super::stacks::tests::profile;
use super::stacks::{self, Stacks};
use super::{ReportError, flamegraph, top};

/// Values near the ends of i64 as well as ordinary ones.
fn value() -> impl Strategy<Value = i64> {
    prop_oneof![
        -1000..1000i64,
        Just(i64::MAX),
        Just(i64::MIN),
        Just(i64::MAX / 2 + 1),
        any::<i64>(),
    ]
}

/// Stacks of names from a small set (so that stacks and frames repeat),
/// with "a+b" inlined frames and "?" unsymbolized ones.
fn samples() -> impl Strategy<Value = Vec<(Vec<String>, i64, i64)>> {
    let name = prop_oneof![
        Just("main".to_owned()),
        Just("f".to_owned()),
        Just("g+h".to_owned()),
        Just("?".to_owned()),
        "[a-z;\\n ]{0,6}",
    ];
    vec((vec(name, 0..6), value(), value()), 0..12)
}

fn build(samples: &[(Vec<String>, i64, i64)]) -> Profile {
    let refs: Vec<Vec<&str>> = samples
        .iter()
        .map(|(names, _, _)| names.iter().map(String::as_str).collect())
        .collect();
    let stacks: Vec<(&[&str], i64, i64)> = refs
        .iter()
        .zip(samples)
        .map(|(names, &(_, count, ns))| (names.as_slice(), count, ns))
        .collect();
    profile(&stacks)
}

/// Loads `files` (name and bytes) as `profilerd top` would read them.
fn load(files: &[(&str, Vec<u8>)], sample_type: Option<&str>) -> Result<Stacks, ReportError> {
    let paths: Vec<PathBuf> = files.iter().map(|(n, _)| PathBuf::from(n)).collect();
    let by_path: HashMap<&Path, &[u8]> = files
        .iter()
        .map(|(n, b)| (Path::new(*n), b.as_slice()))
        .collect();
    stacks::load_with(&paths, sample_type, |p| Ok(by_path[p].to_vec()))
}

/// Every report the readers make of `stacks`; each must not panic.
fn render_all(s: &Stacks) {
    for order in [top::Order::Flat, top::Order::Cum] {
        for n in [0, 1, 20] {
            let text = top::render(s, order, n);
            assert!(text.starts_with("File: ") || text.starts_with("Files: "));
        }
    }
    match flamegraph::render(s) {
        Ok(svg) => assert!(svg.starts_with(b"<?xml"), "not an SVG"),
        Err(ReportError::NoSamples { .. }) => {}
        Err(e) => panic!("flame graph: {e}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Values are summed per stack (saturating) and the total is the sum
    /// of their magnitudes; the reports of any values render.
    #[test]
    fn merged_values_are_the_files_values(
        a in samples(),
        b in samples(),
        index in 0..2usize,
    ) {
        let files = [
            ("cpu-1.pb.gz", pprof_proto::encode_gzip(&build(&a))),
            ("cpu-2.pb", build(&b).encode_to_vec()),
        ];
        let s = load(&files, Some(&index.to_string())).expect("well-formed files load");
        let mut expected: HashMap<Vec<String>, i64> = HashMap::new();
        let mut total = 0i64;
        for (names, count, ns) in a.iter().chain(&b) {
            let v = if index == 0 { *count } else { *ns };
            if v == 0 {
                continue;
            }
            total = total.saturating_add(v.saturating_abs());
            let frames: Vec<String> = names
                .iter()
                .flat_map(|n| match n.as_str() {
                    "?" => vec!["[app]".to_owned()],
                    n => n.split('+').map(str::to_owned).collect(),
                })
                .collect();
            let sum = expected.entry(frames).or_insert(0);
            *sum = sum.saturating_add(v);
        }
        expected.retain(|_, v| *v != 0);
        let got: HashMap<Vec<String>, i64> = s
            .stacks
            .iter()
            .map(|st| (st.frames.iter().map(|f| s.name(f.name).to_owned()).collect(), st.value))
            .collect();
        prop_assert_eq!(got, expected);
        prop_assert_eq!(s.total, total);
        render_all(&s);
    }

    /// A cut or altered file is an error naming it, or a profile whose
    /// reports render.
    #[test]
    fn damaged_files_are_errors_or_reports(
        a in samples(),
        cut in any::<prop::sample::Index>(),
        flips in vec((any::<prop::sample::Index>(), 1..=255u8), 0..6),
        gzip in any::<bool>(),
    ) {
        let p = build(&a);
        let mut bytes = if gzip { pprof_proto::encode_gzip(&p) } else { p.encode_to_vec() };
        let len = bytes.len();
        for (at, x) in &flips {
            bytes[at.index(len)] ^= x;
        }
        bytes.truncate(cut.index(len + 1));
        match load(&[("cpu-x.pb.gz", bytes)], None) {
            Ok(s) => render_all(&s),
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("cpu-x.pb.gz"), "{}", msg);
                prop_assert!(!msg.contains('\n'), "{}", msg);
            }
        }
    }

    /// Profiles with any ids and string indices: dangling references are
    /// errors, not panics.
    #[test]
    fn arbitrary_references_are_errors_or_reports(
        a in samples(),
        edits in vec((0..6u8, any::<prop::sample::Index>(), -2..40i64), 0..6),
    ) {
        let mut p = build(&a);
        for (what, at, to) in edits {
            match what {
                0 if !p.sample.is_empty() => {
                    let s = at.get_mut(&mut p.sample);
                    s.location_id.push(to as u64);
                }
                1 if !p.location.is_empty() => {
                    let l = at.get_mut(&mut p.location);
                    l.mapping_id = to as u64;
                    if let Some(line) = l.line.first_mut() {
                        line.function_id = to as u64;
                    }
                }
                2 if !p.function.is_empty() => at.get_mut(&mut p.function).name = to,
                3 => p.default_sample_type = to,
                4 if !p.sample.is_empty() => at.get_mut(&mut p.sample).value.truncate(1),
                5 => p.period_type = None,
                _ => {}
            }
        }
        match load(&[("cpu-x.pb.gz", pprof_proto::encode_gzip(&p))], None) {
            Ok(s) => render_all(&s),
            Err(e) => prop_assert!(e.to_string().contains("cpu-x.pb.gz"), "{}", e),
        }
    }

    #[test]
    fn arbitrary_bytes_are_errors_or_reports(bytes in vec(any::<u8>(), 0..256)) {
        if let Ok(s) = load(&[("x.pb", bytes)], None) {
            render_all(&s);
        }
    }
}
