//! Builds one pprof `Profile` from symbolized samples. All five profile
//! types share this builder: it owns the string table and the interning of
//! mappings, functions and locations, and merges samples with the same
//! stack and labels.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use pprof_proto as pb;

use crate::model::frames::{Frame, Line, Mapping};
use crate::model::profile_kind::ProfileKind;

/// Strings of the profile, each stored once; index 0 is "" as pprof requires.
struct StringTable {
    strings: Vec<String>,
    index: HashMap<String, i64>,
}

impl StringTable {
    fn new() -> Self {
        let mut index = HashMap::new();
        index.insert(String::new(), 0);
        Self {
            strings: vec![String::new()],
            index,
        }
    }

    fn intern(&mut self, s: &str) -> i64 {
        // Look up by &str first so a hit allocates nothing.
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// A location is the same if it has the same mapping, address and lines.
/// The lines are shared with the frame (`Arc`), so the key costs no copy.
type LocationKey = (u64, u64, Arc<[Line]>);

/// Accumulates samples of one profile type for one window.
pub struct ProfileBuilder {
    kind: ProfileKind,
    period: i64,
    time_nanos: i64,
    duration_nanos: i64,
    strings: StringTable,
    mappings: Vec<pb::Mapping>,
    mapping_ids: HashMap<Mapping, u64>,
    functions: Vec<pb::Function>,
    function_ids: HashMap<(i64, i64), u64>,
    locations: Vec<pb::Location>,
    location_ids: HashMap<LocationKey, u64>,
    samples: Vec<pb::Sample>,
    /// Sample key -> index into `samples`. The key is one flat vector,
    /// `[location count, location ids.., (label key, label value)..]`, so
    /// a lookup can borrow a reused scratch buffer as `&[u64]`.
    sample_index: HashMap<Vec<u64>, usize>,
    scratch: Vec<u64>,
}

impl ProfileBuilder {
    /// Starts an empty profile of `kind` for the window that begins at
    /// `time_nanos` (since the Unix epoch) and lasts `duration_nanos`.
    pub fn new(kind: ProfileKind, period: i64, time_nanos: i64, duration_nanos: i64) -> Self {
        Self {
            kind,
            period,
            time_nanos,
            duration_nanos,
            strings: StringTable::new(),
            mappings: Vec::new(),
            mapping_ids: HashMap::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
            samples: Vec::new(),
            sample_index: HashMap::new(),
            scratch: Vec::new(),
        }
    }

    /// Adds one sample. `frames`: the stack, leaf first. `values`: one per
    /// sample type of the profile kind. `labels`: string labels (key, value).
    /// A sample with the same stack and labels as an earlier one is merged
    /// into it by adding the values.
    pub fn add_sample(&mut self, frames: &[Frame], values: &[i64], labels: &[(&str, &str)]) {
        let n_types = self.kind.sample_types().len();
        debug_assert_eq!(
            values.len(),
            n_types,
            "{} profile takes {n_types} values per sample",
            self.kind
        );

        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        key.push(frames.len() as u64);
        for frame in frames {
            let id = self.location_id(frame);
            key.push(id);
        }
        for (k, v) in labels {
            let k = self.strings.intern(k);
            let v = self.strings.intern(v);
            key.push(k as u64);
            key.push(v as u64);
        }

        if let Some(&i) = self.sample_index.get(key.as_slice()) {
            for (acc, v) in self.samples[i].value.iter_mut().zip(values) {
                *acc = acc.saturating_add(*v);
            }
            self.scratch = key;
            return;
        }

        // Keep the profile well-formed even if a caller passed the wrong
        // number of values: pprof rejects samples of the wrong width.
        let mut value = values.to_vec();
        value.resize(n_types, 0);
        let location_id = key[1..=frames.len()].to_vec();
        let label = key[frames.len() + 1..]
            .chunks_exact(2)
            .map(|kv| pb::Label {
                key: kv[0] as i64,
                str: kv[1] as i64,
                ..Default::default()
            })
            .collect();
        self.sample_index.insert(key, self.samples.len());
        self.samples.push(pb::Sample {
            location_id,
            value,
            label,
        });
    }

    /// Number of distinct samples (after merging) added so far.
    #[cfg(test)]
    pub fn sample_count(&self) -> usize {
        self.samples.len()
    }

    /// Finishes the profile.
    pub fn build(mut self) -> pb::Profile {
        let sample_type = self
            .kind
            .sample_types()
            .iter()
            .map(|&vt| value_type(&mut self.strings, vt))
            .collect();
        let period_type = Some(value_type(&mut self.strings, self.kind.period_type()));
        self.put_main_binary_first();
        pb::Profile {
            sample_type,
            sample: self.samples,
            mapping: self.mappings,
            location: self.locations,
            function: self.functions,
            string_table: self.strings.strings,
            time_nanos: self.time_nanos,
            duration_nanos: self.duration_nanos,
            period_type,
            period: self.period,
            ..Default::default()
        }
    }

    /// pprof tools present mapping 1 as the profile's main binary ("File:").
    /// Make it the user-space object in which most of the first value was
    /// spent (the leaf frames' mapping), rather than whichever came first.
    fn put_main_binary_first(&mut self) {
        let mut weight = vec![0i64; self.mappings.len() + 1];
        for sample in &self.samples {
            let leaf_mapping = sample
                .location_id
                .iter()
                .map(|&id| self.locations[(id - 1) as usize].mapping_id)
                .find(|&m| {
                    m != 0
                        && !self.strings.strings[self.mappings[(m - 1) as usize].filename as usize]
                            .starts_with('[')
                });
            // Saturating: a sample's values are the kernel's counts, summed.
            if let (Some(m), Some(&v)) = (leaf_mapping, sample.value.first()) {
                weight[m as usize] = weight[m as usize].saturating_add(v);
            }
        }
        let Some((main, _)) = weight
            .iter()
            .enumerate()
            .skip(1)
            .filter(|&(_, &w)| w > 0)
            .max_by_key(|&(m, &w)| (w, std::cmp::Reverse(m)))
        else {
            return;
        };
        let main = main as u64;
        if main == 1 {
            return;
        }
        self.mappings.swap(0, (main - 1) as usize);
        self.mappings[0].id = 1;
        self.mappings[(main - 1) as usize].id = main;
        for location in &mut self.locations {
            if location.mapping_id == main {
                location.mapping_id = 1;
            } else if location.mapping_id == 1 {
                location.mapping_id = main;
            }
        }
    }

    /// The id of the location for `frame`, creating it on first sight.
    fn location_id(&mut self, frame: &Frame) -> u64 {
        let mapping_id = match &frame.mapping {
            Some(m) => self.mapping_id(m),
            None => 0,
        };
        let key = (mapping_id, frame.address, Arc::clone(&frame.lines));
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }

        let line = frame
            .lines
            .iter()
            .map(|l| pb::Line {
                function_id: self.function_id(l),
                line: i64::from(l.line),
                column: 0,
            })
            .collect();
        if mapping_id != 0 && !frame.lines.is_empty() {
            // Tell pprof the mapping is symbolized so it does not try again.
            let m = &mut self.mappings[(mapping_id - 1) as usize];
            m.has_functions = true;
            m.has_filenames |= frame.lines.iter().any(|l| l.file.is_some());
            m.has_line_numbers |= frame.lines.iter().any(|l| l.line != 0);
            m.has_inline_frames |= frame.lines.len() > 1;
        }

        let id = self.locations.len() as u64 + 1;
        self.locations.push(pb::Location {
            id,
            mapping_id,
            address: frame.address,
            line,
            is_folded: false,
        });
        self.location_ids.insert(key, id);
        id
    }

    fn mapping_id(&mut self, m: &Mapping) -> u64 {
        if let Some(&id) = self.mapping_ids.get(m) {
            return id;
        }
        let id = self.mappings.len() as u64 + 1;
        let filename = self.strings.intern(&m.path);
        let build_id = m.build_id.as_deref().map_or(0, |b| self.strings.intern(b));
        self.mappings.push(pb::Mapping {
            id,
            memory_start: m.start,
            memory_limit: m.limit,
            file_offset: m.file_offset,
            filename,
            build_id,
            ..Default::default()
        });
        self.mapping_ids.insert(m.clone(), id);
        id
    }

    fn function_id(&mut self, l: &Line) -> u64 {
        let name = self.strings.intern(&l.function);
        let filename = l.file.as_deref().map_or(0, |f| self.strings.intern(f));
        match self.function_ids.entry((name, filename)) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                let id = self.functions.len() as u64 + 1;
                self.functions.push(pb::Function {
                    id,
                    name,
                    // The symbolizer gives demangled names only: the
                    // system's name is the same, unless pprof would cut it.
                    system_name: match cut_by_pprof(&l.function) {
                        true => 0,
                        false => name,
                    },
                    filename,
                    start_line: 0,
                });
                *e.insert(id)
            }
        }
    }
}

/// Whether `go tool pprof` would cut `name` to nothing: a function whose
/// system name equals its name is "demangled" again for display, and a
/// name that looks like demangled C++ (it holds `<`) loses every `<…>`,
/// so Python's `<module>`, `<lambda>` and `<listcomp>` read `<unknown>`.
/// With no system name pprof shows the name as it is.
fn cut_by_pprof(name: &str) -> bool {
    name.strip_prefix('<')
        .and_then(|n| n.strip_suffix('>'))
        .is_some_and(|inner| {
            !inner.is_empty()
                && inner
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ' ')
        })
}

fn value_type(strings: &mut StringTable, (ty, unit): (&str, &str)) -> pb::ValueType {
    pb::ValueType {
        r#type: strings.intern(ty),
        unit: strings.intern(unit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(path: &str) -> Arc<Mapping> {
        Arc::new(Mapping {
            start: 0x40_0000,
            limit: 0x50_0000,
            file_offset: 0,
            path: path.to_owned(),
            build_id: Some("abcdef0123".to_owned()),
        })
    }

    fn line(function: &str, file: &str, line: u32) -> Line {
        Line {
            function: function.to_owned(),
            file: Some(file.to_owned()),
            line,
        }
    }

    fn frame(address: u64, m: Option<&Arc<Mapping>>, lines: Vec<Line>) -> Frame {
        Frame {
            address,
            mapping: m.cloned(),
            lines: lines.into(),
        }
    }

    fn round_trip(b: ProfileBuilder) -> pb::Profile {
        let p = b.build();
        let decoded = pprof_proto::decode(&pprof_proto::encode_gzip(&p)).expect("decode");
        assert_eq!(decoded, p);
        decoded
    }

    fn s(p: &pb::Profile, i: i64) -> &str {
        &p.string_table[i as usize]
    }

    #[test]
    fn heaviest_user_binary_is_mapping_one() {
        let kernel = mapping("[kernel.kallsyms]");
        let libc = mapping("/usr/lib/libc.so.6");
        let app = mapping("/opt/app");
        let mut b = ProfileBuilder::new(ProfileKind::Cpu, 10, 0, 1);
        // First seen: kernel and libc; most of the time: the app.
        b.add_sample(
            &[
                frame(
                    0xffff_0001,
                    Some(&kernel),
                    vec![line("ksys_write", "k.c", 1)],
                ),
                frame(0x1000, Some(&libc), vec![line("write", "w.c", 2)]),
                frame(0x2000, Some(&app), vec![line("main", "a.c", 3)]),
            ],
            &[1, 10],
            &[],
        );
        b.add_sample(
            &[frame(0x2100, Some(&app), vec![line("work", "a.c", 9)])],
            &[5, 50],
            &[],
        );
        let p = round_trip(b);
        assert_eq!(s(&p, p.mapping[0].filename), "/opt/app");
        assert_eq!(p.mapping[0].id, 1);
        for (i, m) in p.mapping.iter().enumerate() {
            assert_eq!(m.id, i as u64 + 1);
        }
        // Every location still points at its own object.
        for l in &p.location {
            let m = &p.mapping[(l.mapping_id - 1) as usize];
            let name = s(&p, p.function[(l.line[0].function_id - 1) as usize].name);
            let expected = match name {
                "ksys_write" => "[kernel.kallsyms]",
                "write" => "/usr/lib/libc.so.6",
                _ => "/opt/app",
            };
            assert_eq!(s(&p, m.filename), expected, "{name}");
        }
    }

    #[test]
    fn header_and_string_table() {
        let b = ProfileBuilder::new(ProfileKind::Cpu, 10_101_010, 1_000, 60_000_000_000);
        let p = round_trip(b);
        assert_eq!(p.string_table[0], "");
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|vt| (s(&p, vt.r#type), s(&p, vt.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let pt = p.period_type.as_ref().expect("period type");
        assert_eq!((s(&p, pt.r#type), s(&p, pt.unit)), ("cpu", "nanoseconds"));
        assert_eq!(p.period, 10_101_010);
        assert_eq!(p.time_nanos, 1_000);
        assert_eq!(p.duration_nanos, 60_000_000_000);
        assert!(p.sample.is_empty());
        // "nanoseconds" appears in both sample and period type, stored once.
        let mut sorted = p.string_table.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), p.string_table.len());
    }

    #[test]
    fn dedup_and_merge() {
        let exe = mapping("/usr/bin/app");
        let leaf = frame(0x40_1000, Some(&exe), vec![line("work", "app.c", 10)]);
        let main = frame(0x40_2000, Some(&exe), vec![line("main", "app.c", 20)]);
        let other = frame(0x40_1004, Some(&exe), vec![line("work", "app.c", 11)]);
        let mut b = ProfileBuilder::new(ProfileKind::Cpu, 1, 0, 0);
        let labels = [("pid", "7"), ("comm", "app")];
        b.add_sample(&[leaf.clone(), main.clone()], &[1, 100], &labels);
        b.add_sample(&[leaf.clone(), main.clone()], &[2, 200], &labels);
        b.add_sample(&[other, main.clone()], &[1, 100], &labels);
        b.add_sample(&[leaf, main], &[1, 100], &[("pid", "8"), ("comm", "app")]);
        assert_eq!(b.sample_count(), 3);
        let p = round_trip(b);

        assert_eq!(p.mapping.len(), 1);
        let m = &p.mapping[0];
        assert_eq!(m.id, 1);
        assert_eq!(s(&p, m.filename), "/usr/bin/app");
        assert_eq!(s(&p, m.build_id), "abcdef0123");
        assert_eq!((m.memory_start, m.memory_limit), (0x40_0000, 0x50_0000));
        assert!(m.has_functions && m.has_filenames && m.has_line_numbers);
        assert!(!m.has_inline_frames);

        // Three distinct addresses; "work" in app.c is one function.
        assert_eq!(p.location.len(), 3);
        assert_eq!(
            p.location.iter().map(|l| l.id).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(p.function.len(), 2);
        let f = &p.function[0];
        assert_eq!((s(&p, f.name), s(&p, f.filename)), ("work", "app.c"));
        assert_eq!(f.system_name, f.name);

        assert_eq!(p.sample[0].location_id, [1, 2]);
        assert_eq!(p.sample[0].value, [3, 300]);
        assert_eq!(p.sample[1].location_id, [3, 2]);
        assert_eq!(p.sample[1].value, [1, 100]);
        let labels: Vec<_> = p.sample[2]
            .label
            .iter()
            .map(|l| (s(&p, l.key), s(&p, l.str)))
            .collect();
        assert_eq!(labels, [("pid", "8"), ("comm", "app")]);

        let mut sorted = p.string_table.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), p.string_table.len());
    }

    #[test]
    fn inlined_frames_are_one_location() {
        let exe = mapping("/usr/bin/app");
        let inlined = frame(
            0x40_1000,
            Some(&exe),
            vec![line("inner", "a.h", 3), line("outer", "a.c", 30)],
        );
        let mut b = ProfileBuilder::new(ProfileKind::Heap, 524_288, 0, 0);
        b.add_sample(&[inlined], &[1, 2, 3, 4], &[]);
        let p = round_trip(b);
        assert_eq!(p.location.len(), 1);
        let lines: Vec<_> = p.location[0]
            .line
            .iter()
            .map(|l| {
                let f = &p.function[(l.function_id - 1) as usize];
                (s(&p, f.name), l.line)
            })
            .collect();
        assert_eq!(lines, [("inner", 3), ("outer", 30)]);
        assert!(p.mapping[0].has_inline_frames);
        assert_eq!(p.sample[0].value, [1, 2, 3, 4]);
    }

    #[test]
    fn unsymbolized_and_unmapped_frames() {
        let lib = mapping("/lib/libc.so.6");
        let bare = frame(0x7f00, Some(&lib), vec![]);
        let nomap = frame(0xdead, None, vec![line("mystery", "?.c", 0)]);
        let mut b = ProfileBuilder::new(ProfileKind::Offcpu, 1, 0, 0);
        b.add_sample(&[bare, nomap], &[1, 5], &[]);
        let p = round_trip(b);
        assert_eq!(p.location.len(), 2);
        let bare = &p.location[0];
        assert_eq!((bare.address, bare.mapping_id), (0x7f00, 1));
        assert!(bare.line.is_empty());
        let m = &p.mapping[0];
        assert!(!m.has_functions && !m.has_filenames && !m.has_line_numbers);
        let nomap = &p.location[1];
        assert_eq!((nomap.address, nomap.mapping_id), (0xdead, 0));
        assert_eq!(nomap.line.len(), 1);
    }

    mod properties {
        use super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;
        use std::collections::HashMap;

        /// A frame as the test compares it: mapping path, address, and
        /// (function, file, line) of each line.
        type Resolved = (Option<String>, u64, Vec<(String, Option<String>, u32)>);

        fn frame_pool() -> impl Strategy<Value = Vec<Frame>> {
            let mappings = [
                mapping("[kernel.kallsyms]"),
                mapping("/usr/lib/libc.so.6"),
                mapping("/opt/app"),
            ];
            let line = ("[a-c]", proptest::option::of("[xy]\\.c"), 0..3u32).prop_map(
                |(function, file, line)| Line {
                    function,
                    file,
                    line,
                },
            );
            vec((0..4usize, 0..4u64, vec(line, 0..3)), 1..8).prop_map(move |frames| {
                frames
                    .into_iter()
                    .map(|(m, address, lines)| Frame {
                        address,
                        mapping: mappings.get(m).cloned(),
                        lines: lines.into(),
                    })
                    .collect()
            })
        }

        fn value() -> impl Strategy<Value = i64> {
            prop_oneof![0..100i64, Just(i64::MAX), any::<i64>()]
        }

        fn resolve(p: &pb::Profile, location_id: u64) -> Resolved {
            let s = |i: i64| p.string_table[i as usize].clone();
            let l = &p.location[(location_id - 1) as usize];
            assert_eq!(l.id, location_id);
            let mapping = (l.mapping_id != 0).then(|| {
                let m = &p.mapping[(l.mapping_id - 1) as usize];
                assert_eq!(m.id, l.mapping_id);
                s(m.filename)
            });
            let lines = l
                .line
                .iter()
                .map(|line| {
                    let f = &p.function[(line.function_id - 1) as usize];
                    assert_eq!(f.id, line.function_id);
                    let file = (f.filename != 0).then(|| s(f.filename));
                    (s(f.name), file, line.line as u32)
                })
                .collect();
            (mapping, l.address, lines)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(32))]

            /// Build, encode, gzip and our decoder keep every sample's
            /// stack, labels and (merged, saturating) values.
            #[test]
            fn round_trip_keeps_samples(
                pool in frame_pool(),
                samples in vec(
                    (
                        vec(any::<prop::sample::Index>(), 0..6),
                        (value(), value()),
                        vec(("[pc]", "[12]"), 0..3),
                    ),
                    0..16,
                ),
            ) {
                let mut b = ProfileBuilder::new(ProfileKind::Cpu, 10, 0, 1);
                type Key = (Vec<Resolved>, Vec<(String, String)>);
                let mut expected: HashMap<Key, [i64; 2]> = HashMap::new();
                for (stack, (v0, v1), labels) in &samples {
                    let frames: Vec<Frame> =
                        stack.iter().map(|i| i.get(&pool).clone()).collect();
                    let label_refs: Vec<(&str, &str)> =
                        labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    b.add_sample(&frames, &[*v0, *v1], &label_refs);
                    let key = (
                        frames
                            .iter()
                            .map(|f| {
                                (
                                    f.mapping.as_ref().map(|m| m.path.clone()),
                                    f.address,
                                    f.lines
                                        .iter()
                                        .map(|l| (l.function.clone(), l.file.clone(), l.line))
                                        .collect(),
                                )
                            })
                            .collect(),
                        labels.clone(),
                    );
                    let acc = expected.entry(key).or_insert([0, 0]);
                    acc[0] = acc[0].saturating_add(*v0);
                    acc[1] = acc[1].saturating_add(*v1);
                }
                let p = round_trip(b);
                prop_assert_eq!(&p.string_table[0], "");
                for (i, m) in p.mapping.iter().enumerate() {
                    prop_assert_eq!(m.id, i as u64 + 1);
                }
                let mut got: HashMap<Key, [i64; 2]> = HashMap::new();
                for sample in &p.sample {
                    let frames = sample.location_id.iter().map(|&id| resolve(&p, id)).collect();
                    let labels = sample
                        .label
                        .iter()
                        .map(|l| (s(&p, l.key).to_owned(), s(&p, l.str).to_owned()))
                        .collect();
                    prop_assert_eq!(sample.value.len(), 2);
                    let old = got.insert((frames, labels), [sample.value[0], sample.value[1]]);
                    prop_assert!(old.is_none(), "equal samples were not merged");
                }
                prop_assert_eq!(got, expected);
            }
        }
    }

    #[test]
    fn same_frame_content_in_different_mappings_differs() {
        let a = mapping("/a");
        let b_map = mapping("/b");
        let lines = vec![line("f", "f.c", 1)];
        let mut b = ProfileBuilder::new(ProfileKind::Block, 1, 0, 0);
        b.add_sample(&[frame(0x10, Some(&a), lines.clone())], &[1, 1], &[]);
        b.add_sample(&[frame(0x10, Some(&b_map), lines)], &[1, 1], &[]);
        let p = round_trip(b);
        assert_eq!(p.mapping.len(), 2);
        assert_eq!(p.location.len(), 2);
        assert_eq!(p.function.len(), 1);
        assert_eq!(p.sample.len(), 2);
    }

    /// Python's `<module>`, `<lambda>`, `<listcomp>` carry no system name,
    /// so that pprof shows them as they are; C++ and Rust names keep
    /// theirs (pprof simplifies those as it always has).
    #[test]
    fn names_pprof_would_cut_carry_no_system_name() {
        for name in ["<module>", "<lambda>", "<listcomp>", "<genexpr>"] {
            assert!(cut_by_pprof(name), "{name}");
        }
        for name in [
            "work",
            "f.<locals>.g",
            "std::vector<int>::push_back",
            "<alloc::vec::Vec<T> as core::ops::Drop>::drop",
            "<>",
            "[truncated]",
        ] {
            assert!(!cut_by_pprof(name), "{name}");
        }
    }
}
