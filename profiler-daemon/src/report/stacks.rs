//! Reads pprof files and merges them into one set of function-name stacks
//! for one sample type: what `top` and `flamegraph` both draw from.
//!
//! The rules are pprof's: files merge when their sample types and period
//! type are equal, values are summed, the default sample type is the
//! profile's `default_sample_type` or else its last one, and a location
//! with several lines (inlined calls) stands for several frames, the
//! innermost first.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use pprof_proto::Profile;

use super::ReportError;
use crate::model::profile_kind::ProfileKind;

/// A stack of frames, leaf first, and its summed value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    pub frames: Vec<Frame>,
    pub value: i64,
}

/// One function in a stack: its interned name, and whether it was inlined
/// into its caller (not the last line of its location).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    pub name: u32,
    pub inline: bool,
}

/// The merged samples of one or more files, for one sample type.
#[derive(Debug)]
pub struct Stacks {
    /// The files, as given.
    pub files: Vec<PathBuf>,
    /// The profile type: `cpu`, `heap`, ... for profilerd's types (and
    /// Go's, which use the same sample types), else the period type.
    pub profile_type: String,
    /// The sample type shown (`cpu`, `alloc_space`, ...) and its unit.
    pub sample_type: String,
    pub unit: String,
    /// Earliest start and summed duration of the files (pprof's merge).
    pub time_nanos: i64,
    pub duration_nanos: i64,
    /// Function names, indexed by the frames of `stacks`.
    pub names: Vec<String>,
    /// Distinct stacks with non-zero values.
    pub stacks: Vec<Stack>,
    /// Sum of the absolute values: what percentages are of.
    pub total: i64,
}

impl Stacks {
    pub fn name(&self, frame: u32) -> &str {
        self.names.get(frame as usize).map_or("", String::as_str)
    }
}

/// Reads `files` and merges them for `sample_type` (by name or index; the
/// profile's default when `None`).
pub fn load(files: &[PathBuf], sample_type: Option<&str>) -> Result<Stacks, ReportError> {
    load_with(files, sample_type, |path| {
        std::fs::read(path).map_err(|source| ReportError::Read {
            path: path.to_owned(),
            source,
        })
    })
}

/// [`load`] with the files' bytes from `read`, one file at a time: the
/// entry point for input that is not on disk.
pub fn load_with(
    files: &[PathBuf],
    sample_type: Option<&str>,
    mut read: impl FnMut(&Path) -> Result<Vec<u8>, ReportError>,
) -> Result<Stacks, ReportError> {
    let mut merged: Option<(Merger, Shape)> = None;
    for path in files {
        let profile = decode(path, &read(path)?)?;
        let shape = Shape::of(&profile, path)?;
        match &mut merged {
            None => {
                let index = shape.select(sample_type)?;
                let mut merger = Merger::new(files, &shape, index);
                merger.add(&profile, path)?;
                merged = Some((merger, shape));
            }
            Some((merger, first)) => {
                if !shape.merges_with(first) {
                    return Err(ReportError::Incompatible {
                        path: path.clone(),
                        this: shape.describe(),
                        first_path: first.path.clone(),
                        first: first.describe(),
                    });
                }
                merger.add(&profile, path)?;
            }
        }
    }
    match merged {
        Some((merger, _)) => Ok(merger.finish()),
        None => Err(ReportError::Usage("no profile files given".into())),
    }
}

/// Decodes one file's bytes (gzipped or plain).
fn decode(path: &Path, bytes: &[u8]) -> Result<Profile, ReportError> {
    let profile = pprof_proto::decode(bytes).map_err(|e| ReportError::NotPprof {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    // An empty or unrelated file can decode as an empty message.
    if profile.sample_type.is_empty() {
        return Err(ReportError::NotPprof {
            path: path.to_owned(),
            reason: "no sample types".into(),
        });
    }
    Ok(profile)
}

/// What decides whether two files merge: sample types, period type and
/// the profile type.
struct Shape {
    path: PathBuf,
    sample_types: Vec<(String, String)>,
    period_type: Option<(String, String)>,
    default_sample_type: Option<String>,
    profile_type: String,
}

impl Shape {
    fn of(p: &Profile, path: &Path) -> Result<Shape, ReportError> {
        let s = |i: i64| string(p, i, path);
        let sample_types = p
            .sample_type
            .iter()
            .map(|vt| Ok((s(vt.r#type)?.to_owned(), s(vt.unit)?.to_owned())))
            .collect::<Result<Vec<_>, ReportError>>()?;
        let period_type = match &p.period_type {
            Some(vt) => Some((s(vt.r#type)?.to_owned(), s(vt.unit)?.to_owned())),
            None => None,
        };
        let default_sample_type = match s(p.default_sample_type)? {
            "" => None,
            name => Some(name.to_owned()),
        };
        let profile_type = profile_type(&sample_types, period_type.as_ref(), path);
        Ok(Shape {
            path: path.to_owned(),
            sample_types,
            period_type,
            default_sample_type,
            profile_type,
        })
    }

    fn merges_with(&self, other: &Shape) -> bool {
        self.sample_types == other.sample_types
            && self.period_type == other.period_type
            && self.profile_type == other.profile_type
    }

    fn describe(&self) -> String {
        let types: Vec<String> = self
            .sample_types
            .iter()
            .map(|(t, u)| format!("{t}/{u}"))
            .collect();
        format!("{} profile: {}", self.profile_type, types.join(", "))
    }

    /// The index of the sample type to show: a name, an index, or
    /// pprof's default.
    fn select(&self, wanted: Option<&str>) -> Result<usize, ReportError> {
        let names = || {
            self.sample_types
                .iter()
                .map(|(t, _)| t.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some(wanted) = wanted else {
            let default = self
                .default_sample_type
                .as_ref()
                .and_then(|d| self.sample_types.iter().position(|(t, _)| t == d));
            return Ok(default.unwrap_or(self.sample_types.len() - 1));
        };
        if let Ok(i) = wanted.parse::<usize>()
            && i < self.sample_types.len()
        {
            return Ok(i);
        }
        // pprof's legacy names: inuse_space for a type named "space".
        let no_inuse = wanted.strip_prefix("inuse_").unwrap_or(wanted);
        self.sample_types
            .iter()
            .position(|(t, _)| t == wanted || t == no_inuse)
            .ok_or_else(|| ReportError::UnknownSampleType {
                name: wanted.to_owned(),
                available: names(),
            })
    }
}

/// The profile type of a file: the profilerd type with these sample and
/// period types (block and mutex share them: the file name's `block-` or
/// `mutex-` prefix tells them apart), else the period type's name.
fn profile_type(
    sample_types: &[(String, String)],
    period_type: Option<&(String, String)>,
    path: &Path,
) -> String {
    let matching: Vec<ProfileKind> = ProfileKind::ALL
        .into_iter()
        .filter(|k| {
            k.sample_types()
                .iter()
                .map(|&(t, u)| (t, u))
                .eq(sample_types.iter().map(|(t, u)| (t.as_str(), u.as_str())))
                && period_type.is_some_and(|(t, u)| (t.as_str(), u.as_str()) == k.period_type())
        })
        .collect();
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match matching.as_slice() {
        [one] => one.name().to_owned(),
        [] => period_type
            .map(|(t, _)| t.clone())
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "unknown".to_owned()),
        several => several
            .iter()
            .find(|k| file_name.starts_with(&format!("{}-", k.name())))
            .map(|k| k.name().to_owned())
            .unwrap_or_else(|| {
                let names: Vec<&str> = several.iter().map(|k| k.name()).collect();
                names.join("/")
            }),
    }
}

/// `string_table[i]`, or an error naming the file.
fn string<'p>(p: &'p Profile, i: i64, path: &Path) -> Result<&'p str, ReportError> {
    usize::try_from(i)
        .ok()
        .and_then(|i| p.string_table.get(i))
        .map(String::as_str)
        .ok_or_else(|| ReportError::Corrupt {
            path: path.to_owned(),
            what: format!("string index {i} is outside the string table"),
        })
}

/// Accumulates stacks of interned names across files.
struct Merger {
    stacks: Stacks,
    index: usize,
    name_ids: HashMap<String, u32>,
    by_stack: HashMap<Vec<Frame>, i64>,
}

impl Merger {
    fn new(files: &[PathBuf], shape: &Shape, index: usize) -> Merger {
        let (sample_type, unit) = shape.sample_types[index].clone();
        Merger {
            stacks: Stacks {
                files: files.to_vec(),
                profile_type: shape.profile_type.clone(),
                sample_type,
                unit,
                time_nanos: 0,
                duration_nanos: 0,
                names: Vec::new(),
                stacks: Vec::new(),
                total: 0,
            },
            index,
            name_ids: HashMap::new(),
            by_stack: HashMap::new(),
        }
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        let id = self.stacks.names.len() as u32;
        self.stacks.names.push(name.to_owned());
        self.name_ids.insert(name.to_owned(), id);
        id
    }

    /// Adds the samples of one file.
    fn add(&mut self, p: &Profile, path: &Path) -> Result<(), ReportError> {
        let corrupt = |what: String| ReportError::Corrupt {
            path: path.to_owned(),
            what,
        };
        if p.time_nanos != 0
            && (self.stacks.time_nanos == 0 || p.time_nanos < self.stacks.time_nanos)
        {
            self.stacks.time_nanos = p.time_nanos;
        }
        self.stacks.duration_nanos = self.stacks.duration_nanos.saturating_add(p.duration_nanos);

        let mut functions: HashMap<u64, u32> = HashMap::with_capacity(p.function.len());
        for f in &p.function {
            let id = self.intern(string(p, f.name, path)?);
            functions.insert(f.id, id);
        }
        let mut mappings: HashMap<u64, &str> = HashMap::with_capacity(p.mapping.len());
        for m in &p.mapping {
            mappings.insert(m.id, string(p, m.filename, path)?);
        }
        // Each location's frames, innermost inlined function first.
        let mut locations: HashMap<u64, Vec<Frame>> = HashMap::with_capacity(p.location.len());
        for loc in &p.location {
            let frames = if loc.line.is_empty() {
                // Unsymbolized: pprof names the object file, else nothing.
                let name = match mappings.get(&loc.mapping_id) {
                    Some(file) if !file.is_empty() => format!("[{}]", base_name(file)),
                    _ => "<unknown>".to_owned(),
                };
                vec![Frame {
                    name: self.intern(&name),
                    inline: false,
                }]
            } else {
                let last = loc.line.len() - 1;
                loc.line
                    .iter()
                    .enumerate()
                    .map(|(i, l)| {
                        let name = functions.get(&l.function_id).copied().ok_or_else(|| {
                            corrupt(format!(
                                "location {} names missing function {}",
                                loc.id, l.function_id
                            ))
                        })?;
                        Ok(Frame {
                            name,
                            inline: i != last,
                        })
                    })
                    .collect::<Result<_, ReportError>>()?
            };
            locations.insert(loc.id, frames);
        }

        for sample in &p.sample {
            let value = *sample.value.get(self.index).ok_or_else(|| {
                corrupt(format!(
                    "a sample has {} values for {} sample types",
                    sample.value.len(),
                    p.sample_type.len()
                ))
            })?;
            if value == 0 {
                continue;
            }
            let mut frames = Vec::with_capacity(sample.location_id.len());
            for id in &sample.location_id {
                let loc = locations
                    .get(id)
                    .ok_or_else(|| corrupt(format!("a sample names missing location {id}")))?;
                frames.extend_from_slice(loc);
            }
            self.stacks.total = self.stacks.total.saturating_add(value.saturating_abs());
            let sum = self.by_stack.entry(frames).or_insert(0);
            *sum = sum.saturating_add(value);
        }
        Ok(())
    }

    fn finish(mut self) -> Stacks {
        let mut stacks: Vec<Stack> = self
            .by_stack
            .into_iter()
            .filter(|&(_, value)| value != 0)
            .map(|(frames, value)| Stack { frames, value })
            .collect();
        // Deterministic output regardless of hash order.
        stacks.sort_by(|a, b| a.frames.cmp(&b.frames));
        self.stacks.stacks = stacks;
        self.stacks
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pprof_proto::{Function, Line, Location, Mapping, Sample, ValueType};

    /// A small cpu-shaped profile: `stacks` are (function names leaf first,
    /// samples, nanoseconds). A name "a+b" is one location with `a` inlined
    /// into `b`; "?" is an unsymbolized location in /bin/app.
    pub(crate) fn profile(stacks: &[(&[&str], i64, i64)]) -> Profile {
        let mut strings: Vec<String> = ["", "samples", "count", "cpu", "nanoseconds", "/bin/app"]
            .map(String::from)
            .to_vec();
        let mut intern = |s: &str| -> i64 {
            if let Some(i) = strings.iter().position(|x| x == s) {
                return i as i64;
            }
            strings.push(s.to_owned());
            (strings.len() - 1) as i64
        };
        let mut functions: Vec<Function> = Vec::new();
        let mut locations: Vec<Location> = Vec::new();
        let mut samples = Vec::new();
        for (names, count, ns) in stacks {
            let mut ids = Vec::new();
            for &frame in names.iter() {
                let lines = if frame == "?" {
                    Vec::new()
                } else {
                    frame
                        .split('+')
                        .map(|name| {
                            let name_idx = intern(name);
                            let fid = match functions.iter().find(|f| f.name == name_idx) {
                                Some(f) => f.id,
                                None => {
                                    let id = functions.len() as u64 + 1;
                                    functions.push(Function {
                                        id,
                                        name: name_idx,
                                        system_name: name_idx,
                                        ..Default::default()
                                    });
                                    id
                                }
                            };
                            Line {
                                function_id: fid,
                                line: 1,
                                column: 0,
                            }
                        })
                        .collect()
                };
                let id = locations.len() as u64 + 1;
                locations.push(Location {
                    id,
                    mapping_id: 1,
                    address: 0x1000 + id,
                    line: lines,
                    is_folded: false,
                });
                ids.push(id);
            }
            samples.push(Sample {
                location_id: ids,
                value: vec![*count, *ns],
                label: Vec::new(),
            });
        }
        Profile {
            sample_type: vec![
                ValueType { r#type: 1, unit: 2 },
                ValueType { r#type: 3, unit: 4 },
            ],
            sample: samples,
            mapping: vec![Mapping {
                id: 1,
                memory_start: 0x1000,
                memory_limit: 0x9000,
                filename: 5,
                ..Default::default()
            }],
            location: locations,
            function: functions,
            string_table: strings,
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 2_000_000_000,
            period_type: Some(ValueType { r#type: 3, unit: 4 }),
            period: 10_000_000,
            ..Default::default()
        }
    }

    pub(crate) fn write(dir: &Path, name: &str, p: &Profile) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, pprof_proto::encode_gzip(p)).unwrap();
        path
    }

    fn names(s: &Stacks) -> Vec<(Vec<&str>, i64)> {
        s.stacks
            .iter()
            .map(|st| (st.frames.iter().map(|f| s.name(f.name)).collect(), st.value))
            .collect()
    }

    #[test]
    fn files_are_merged_and_summed() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(
            dir.path(),
            "cpu-1.pb.gz",
            &profile(&[(&["f", "main"], 3, 30), (&["g", "main"], 1, 10)]),
        );
        let mut second = profile(&[(&["f", "main"], 2, 20)]);
        second.time_nanos -= 5;
        let b = write(dir.path(), "cpu-2.pb.gz", &second);
        let s = load(&[a, b], None).unwrap();
        assert_eq!(s.profile_type, "cpu");
        // The last sample type is pprof's default.
        assert_eq!(
            (s.sample_type.as_str(), s.unit.as_str()),
            ("cpu", "nanoseconds")
        );
        assert_eq!(s.total, 60);
        assert_eq!(s.time_nanos, 1_700_000_000_000_000_000 - 5);
        assert_eq!(s.duration_nanos, 4_000_000_000);
        let mut got = names(&s);
        got.sort();
        assert_eq!(got, vec![(vec!["f", "main"], 50), (vec!["g", "main"], 10)]);
    }

    #[test]
    fn uncompressed_files_read_too() {
        use prost::Message;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain.pb");
        std::fs::write(&path, profile(&[(&["f"], 1, 10)]).encode_to_vec()).unwrap();
        assert_eq!(names(&load(&[path], None).unwrap()), vec![(vec!["f"], 10)]);
    }

    #[test]
    fn sample_type_by_name_index_or_default() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = profile(&[(&["f"], 3, 30)]);
        let f = write(dir.path(), "x.pb", &p);
        assert_eq!(
            load(std::slice::from_ref(&f), Some("samples"))
                .unwrap()
                .total,
            3
        );
        assert_eq!(load(std::slice::from_ref(&f), Some("0")).unwrap().total, 3);
        assert_eq!(load(std::slice::from_ref(&f), Some("1")).unwrap().total, 30);
        let err = load(&[f], Some("alloc_space")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown sample type 'alloc_space' (this profile has: samples, cpu)"
        );
        assert_eq!(err.exit_code(), 2);
        // default_sample_type wins over "the last".
        p.default_sample_type = 1;
        let f = write(dir.path(), "y.pb", &p);
        assert_eq!(load(&[f], None).unwrap().sample_type, "samples");
    }

    #[test]
    fn inlined_frames_and_unsymbolized_locations() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "x.pb.gz",
            &profile(&[(&["leaf+mid", "?", "main"], 1, 10)]),
        );
        let s = load(&[f], None).unwrap();
        assert_eq!(names(&s), vec![(vec!["leaf", "mid", "[app]", "main"], 10)]);
    }

    #[test]
    fn different_types_do_not_merge() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = write(dir.path(), "cpu.pb.gz", &profile(&[(&["f"], 1, 10)]));
        let mut heap = profile(&[(&["f"], 1, 10)]);
        heap.string_table[3] = "alloc_space".into();
        heap.string_table[4] = "bytes".into();
        heap.period_type = None;
        let heap = write(dir.path(), "heap.pb.gz", &heap);
        let err = load(&[cpu, heap.clone()], None).unwrap_err();
        assert_eq!(err.exit_code(), 1);
        let msg = err.to_string();
        assert!(
            msg.contains("cannot merge") && msg.contains("heap.pb.gz"),
            "{msg}"
        );
        assert!(msg.contains("samples/count, alloc_space/bytes"), "{msg}");
    }

    #[test]
    fn block_and_mutex_files_do_not_merge() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = profile(&[(&["f"], 1, 10)]);
        p.string_table[1] = "contentions".into();
        p.string_table[3] = "delay".into();
        p.period_type = Some(pprof_proto::ValueType { r#type: 1, unit: 2 });
        let block = write(dir.path(), "block-1.pb.gz", &p);
        let mutex = write(dir.path(), "mutex-1.pb.gz", &p);
        assert_eq!(
            load(std::slice::from_ref(&block), None)
                .unwrap()
                .profile_type,
            "block"
        );
        let err = load(&[block, mutex], None).unwrap_err();
        assert!(err.to_string().contains("mutex profile"), "{err}");
    }

    #[test]
    fn bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pb.gz");
        let err = load(&[missing], None).unwrap_err();
        assert_eq!(err.exit_code(), 1);
        assert!(err.to_string().contains("nope.pb.gz"), "{err}");

        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "hello, this is not a profile\n").unwrap();
        let err = load(&[text], None).unwrap_err();
        assert!(err.to_string().starts_with("not a pprof profile"), "{err}");

        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").unwrap();
        assert!(matches!(
            load(&[empty], None),
            Err(ReportError::NotPprof { .. })
        ));

        let mut p = profile(&[(&["f"], 1, 10)]);
        p.sample[0].location_id.push(99);
        let bad = write(dir.path(), "bad.pb.gz", &p);
        let err = load(&[bad], None).unwrap_err();
        assert!(err.to_string().contains("missing location 99"), "{err}");
    }
}
