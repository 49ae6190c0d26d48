//! Keeps every uploaded profile under the server's limits: a series'
//! samples are cut into chunks of at most `max_samples` samples whose
//! profile (uncompressed) is at most `max_profile_bytes`, each chunk a
//! complete pprof with only the locations, functions, mappings and strings
//! its samples use. Chunks of one series share its labels and window, and
//! the server adds them up like any profiles of one series and time.
//!
//! A chunk too large is halved until it fits; a single sample that alone is
//! larger than the limit cannot be sent and is counted.

use std::collections::HashMap;

use pprof_proto as pb;
use prost::Message;

/// Lookups into a source profile by id, built once per profile.
pub struct Index<'a> {
    source: &'a pb::Profile,
    locations: HashMap<u64, usize>,
    functions: HashMap<u64, usize>,
    mappings: HashMap<u64, usize>,
}

impl<'a> Index<'a> {
    pub fn new(source: &'a pb::Profile) -> Self {
        let by_id = |ids: &mut dyn Iterator<Item = u64>| -> HashMap<u64, usize> {
            ids.enumerate().map(|(i, id)| (id, i)).collect()
        };
        Index {
            source,
            locations: by_id(&mut source.location.iter().map(|l| l.id)),
            functions: by_id(&mut source.function.iter().map(|f| f.id)),
            mappings: by_id(&mut source.mapping.iter().map(|m| m.id)),
        }
    }
}

/// What cutting one series gave.
#[derive(Debug, Default)]
pub struct Cut {
    pub profiles: Vec<pb::Profile>,
    /// Samples left out: each alone larger than the size limit.
    pub oversized_samples: usize,
}

/// Cuts `samples` (of `index`'s profile) into profiles within the limits.
pub fn cut(index: &Index, samples: &[pb::Sample], max_samples: usize, max_bytes: usize) -> Cut {
    let mut out = Cut::default();
    for chunk in samples.chunks(max_samples.max(1)) {
        fit(index, chunk, max_bytes, &mut out);
    }
    out
}

fn fit(index: &Index, samples: &[pb::Sample], max_bytes: usize, out: &mut Cut) {
    let profile = subset(index, samples);
    if profile.encoded_len() <= max_bytes {
        out.profiles.push(profile);
    } else if samples.len() == 1 {
        out.oversized_samples += 1;
    } else {
        let (a, b) = samples.split_at(samples.len() / 2);
        fit(index, a, max_bytes, out);
        fit(index, b, max_bytes, out);
    }
}

/// A profile with `samples` and the source's header (types, period, time),
/// and just the symbols they use. Ids are kept; strings are renumbered.
pub fn subset(index: &Index, samples: &[pb::Sample]) -> pb::Profile {
    let src = index.source;
    let mut strings = Strings::new(&src.string_table);
    let mut location_seen = vec![false; src.location.len()];
    let mut function_seen = vec![false; src.function.len()];
    let mut mapping_seen = vec![false; src.mapping.len()];
    for sample in samples {
        for id in &sample.location_id {
            if let Some(&i) = index.locations.get(id) {
                location_seen[i] = true;
            }
        }
    }
    let mut location = Vec::new();
    for (i, l) in src.location.iter().enumerate() {
        if !location_seen[i] {
            continue;
        }
        if let Some(&m) = index.mappings.get(&l.mapping_id) {
            mapping_seen[m] = true;
        }
        for line in &l.line {
            if let Some(&f) = index.functions.get(&line.function_id) {
                function_seen[f] = true;
            }
        }
        location.push(l.clone());
    }
    let function = src
        .function
        .iter()
        .zip(&function_seen)
        .filter(|(_, seen)| **seen)
        .map(|(f, _)| pb::Function {
            name: strings.map(f.name),
            system_name: strings.map(f.system_name),
            filename: strings.map(f.filename),
            ..*f
        })
        .collect();
    let mapping = src
        .mapping
        .iter()
        .zip(&mapping_seen)
        .filter(|(_, seen)| **seen)
        .map(|(m, _)| pb::Mapping {
            filename: strings.map(m.filename),
            build_id: strings.map(m.build_id),
            ..*m
        })
        .collect();
    let mut value_type = |v: &pb::ValueType| pb::ValueType {
        r#type: strings.map(v.r#type),
        unit: strings.map(v.unit),
    };
    let sample_type = src.sample_type.iter().map(&mut value_type).collect();
    let period_type = src.period_type.as_ref().map(&mut value_type);
    let sample = samples
        .iter()
        .map(|s| pb::Sample {
            location_id: s.location_id.clone(),
            value: s.value.clone(),
            label: s
                .label
                .iter()
                .map(|l| pb::Label {
                    key: strings.map(l.key),
                    str: strings.map(l.str),
                    num_unit: strings.map(l.num_unit),
                    ..*l
                })
                .collect(),
        })
        .collect();
    let comment = src.comment.iter().map(|&c| strings.map(c)).collect();
    pb::Profile {
        sample_type,
        sample,
        mapping,
        location,
        function,
        drop_frames: strings.map(src.drop_frames),
        keep_frames: strings.map(src.keep_frames),
        time_nanos: src.time_nanos,
        duration_nanos: src.duration_nanos,
        period_type,
        period: src.period,
        comment,
        default_sample_type: strings.map(src.default_sample_type),
        string_table: strings.table,
        ..Default::default()
    }
}

/// A new string table holding the source strings used, in first-use order.
struct Strings<'a> {
    source: &'a [String],
    new_index: HashMap<i64, i64>,
    table: Vec<String>,
}

impl<'a> Strings<'a> {
    fn new(source: &'a [String]) -> Self {
        Strings {
            source,
            new_index: HashMap::from([(0, 0)]),
            table: vec![String::new()],
        }
    }

    /// The new index of source string `i`; an index out of the source's
    /// range (a foreign profile) becomes the empty string.
    fn map(&mut self, i: i64) -> i64 {
        if let Some(&n) = self.new_index.get(&i) {
            return n;
        }
        let Some(text) = usize::try_from(i).ok().and_then(|i| self.source.get(i)) else {
            return 0;
        };
        let n = self.table.len() as i64;
        self.table.push(text.clone());
        self.new_index.insert(i, n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile of `n` samples, each with its own location, function and
    /// a name of `name_len` bytes, all in one mapping.
    fn wide(n: u64, name_len: usize) -> pb::Profile {
        let mut string_table = vec![String::new(), "samples".into(), "count".into()];
        let mut location = Vec::new();
        let mut function = Vec::new();
        let mut sample = Vec::new();
        string_table.push("/bin/app".into());
        for i in 1..=n {
            string_table.push(format!("{i:0>name_len$}"));
            function.push(pb::Function {
                id: i,
                name: string_table.len() as i64 - 1,
                filename: 3,
                ..Default::default()
            });
            location.push(pb::Location {
                id: i,
                mapping_id: 1,
                address: 0x1000 + i,
                line: vec![pb::Line {
                    function_id: i,
                    line: 1,
                    column: 0,
                }],
                is_folded: false,
            });
            sample.push(pb::Sample {
                location_id: vec![i],
                value: vec![i as i64],
                label: Vec::new(),
            });
        }
        pb::Profile {
            sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
            sample,
            mapping: vec![pb::Mapping {
                id: 1,
                filename: 3,
                ..Default::default()
            }],
            location,
            function,
            string_table,
            time_nanos: 7,
            duration_nanos: 9,
            ..Default::default()
        }
    }

    /// The chunks' samples, by their leaf function's name, with values.
    fn flatten(profiles: &[pb::Profile]) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for p in profiles {
            for s in &p.sample {
                let loc = p
                    .location
                    .iter()
                    .find(|l| l.id == s.location_id[0])
                    .unwrap();
                let f = p
                    .function
                    .iter()
                    .find(|f| f.id == loc.line[0].function_id)
                    .unwrap();
                out.push((p.string_table[f.name as usize].clone(), s.value[0]));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn chunks_keep_every_sample_within_both_limits() {
        let p = wide(1000, 40);
        let index = Index::new(&p);
        let whole = cut(&index, &p.sample, usize::MAX, usize::MAX);
        assert_eq!(whole.profiles.len(), 1);
        let size = whole.profiles[0].encoded_len();
        for (max_samples, max_bytes) in [(300, usize::MAX), (usize::MAX, size / 5), (77, size / 3)]
        {
            let c = cut(&index, &p.sample, max_samples, max_bytes);
            assert_eq!(c.oversized_samples, 0);
            assert!(c.profiles.len() > 1);
            for chunk in &c.profiles {
                assert!(chunk.sample.len() <= max_samples);
                assert!(chunk.encoded_len() <= max_bytes);
                assert_eq!((chunk.time_nanos, chunk.duration_nanos), (7, 9));
                assert_eq!(chunk.string_table[0], "");
                // Only what its samples use.
                assert_eq!(chunk.location.len(), chunk.sample.len());
                assert_eq!(chunk.function.len(), chunk.sample.len());
                assert_eq!(chunk.mapping.len(), 1);
                assert_eq!(chunk.string_table.len(), chunk.sample.len() + 4);
            }
            assert_eq!(flatten(&c.profiles), flatten(std::slice::from_ref(&p)));
        }
    }

    #[test]
    fn a_sample_larger_than_the_limit_is_counted() {
        let p = wide(3, 5000);
        let index = Index::new(&p);
        let c = cut(&index, &p.sample, 16_000, 4096);
        assert_eq!((c.profiles.len(), c.oversized_samples), (0, 3));
    }
}
