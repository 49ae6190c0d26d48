//! Reading the profile files a run wrote, checking them against the
//! contract (docs/SPEC.md, "Output files"), and flattening them into samples with
//! resolved labels and frames for the tests' comparisons.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use pprof_proto::Profile;

/// The mapping name of kernel frames.
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// One decoded profile file.
pub struct ProfileFile {
    pub path: PathBuf,
    pub profile: Profile,
}

impl ProfileFile {
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Whether `name` is a final profile file name of `kind`:
/// `<kind>-YYYYMMDDTHHMMSSZ[-N].pb.gz`. Returns the time stamp part.
pub fn parse_file_name<'a>(name: &'a str, kind: &str) -> Option<&'a str> {
    let rest = name
        .strip_prefix(kind)?
        .strip_prefix('-')?
        .strip_suffix(".pb.gz")?;
    let (stamp, suffix) = match rest.split_once('-') {
        Some((stamp, n)) => (stamp, Some(n)),
        None => (rest, None),
    };
    let b = stamp.as_bytes();
    let stamp_ok = b.len() == 16
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'T'
        && b[9..15].iter().all(u8::is_ascii_digit)
        && b[15] == b'Z';
    let suffix_ok = suffix.is_none_or(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()));
    (stamp_ok && suffix_ok).then_some(stamp)
}

/// Every entry of `dir` (names only), sorted; none if `dir` does not exist
/// or is not a directory.
pub fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| {
                e.expect("reading the output directory")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect(),
        // Absent, or not a directory at all: nothing was written into it.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            Vec::new()
        }
        Err(e) => panic!("reading {}: {e}", dir.display()),
    };
    names.sort();
    names
}

/// Asserts that `dir` holds only final profile files of `kind`: no
/// temporary (dot) files or anything else left behind.
pub fn assert_only_profiles(dir: &Path, kind: &str) {
    let stray: Vec<String> = dir_entries(dir)
        .into_iter()
        .filter(|n| parse_file_name(n, kind).is_none())
        .collect();
    assert!(
        stray.is_empty(),
        "unexpected entries in the output directory {} (temporary or misnamed files): {stray:?}; all: {:?}",
        dir.display(),
        dir_entries(dir)
    );
}

/// Reads and decodes every `kind` profile in `dir`, ordered by window start
/// (then name). Panics naming the file if one does not decode.
/// The `.cpuprofile` that `node --cpu-prof --cpu-prof-dir DIR` wrote into
/// `dir` (Node's own profiler), as JSON.
pub fn read_node_cpu_profile(dir: &Path) -> serde_json::Value {
    let file = std::fs::read_dir(dir)
        .expect("node --cpu-prof's directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "cpuprofile"))
        .expect("a .cpuprofile from node --cpu-prof");
    serde_json::from_slice(&std::fs::read(&file).expect("reading the .cpuprofile"))
        .expect("the .cpuprofile is JSON")
}

pub fn read_profiles(dir: &Path, kind: &str) -> Vec<ProfileFile> {
    let mut files: Vec<ProfileFile> = dir_entries(dir)
        .into_iter()
        .filter(|n| parse_file_name(n, kind).is_some())
        .map(|n| {
            let path = dir.join(&n);
            let bytes =
                std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            assert!(
                bytes.starts_with(&[0x1f, 0x8b]),
                "{} is not gzipped (first bytes {:02x?})",
                path.display(),
                &bytes[..bytes.len().min(4)]
            );
            let profile = pprof_proto::decode(&bytes)
                .unwrap_or_else(|e| panic!("decoding {}: {e}", path.display()));
            ProfileFile { path, profile }
        })
        .collect();
    files.sort_by_key(|f| (f.profile.time_nanos, f.name()));
    files
}

/// The samples of a profile file another profiler wrote (a Go program's
/// own runtime/pprof profile: gzipped or not, any file name), flattened;
/// panics naming the file if it cannot be read or decoded.
pub fn flatten_file(path: &Path) -> Vec<FlatSample> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let profile =
        pprof_proto::decode(&bytes).unwrap_or_else(|e| panic!("decoding {}: {e}", path.display()));
    flatten(&profile)
}

/// Formats Unix time in nanoseconds as `YYYYMMDDTHHMMSSZ` (UTC).
pub fn utc_stamp(time_nanos: i64) -> String {
    let secs = time_nanos.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar),
    // counting in 400-year eras that start on March 1st.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

fn string(p: &Profile, index: i64, what: &str) -> String {
    usize::try_from(index)
        .ok()
        .and_then(|i| p.string_table.get(i))
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{what}: string index {index} outside the string table ({} entries)",
                p.string_table.len()
            )
        })
}

/// The (type, unit) names of the profile's sample types.
pub fn sample_types(p: &Profile) -> Vec<(String, String)> {
    p.sample_type
        .iter()
        .map(|vt| {
            (
                string(p, vt.r#type, "sample type"),
                string(p, vt.unit, "sample unit"),
            )
        })
        .collect()
}

/// The sum of one sample type's values over a profile.
pub fn total_of(p: &Profile, sample_type: &str) -> i64 {
    let i = sample_types(p)
        .iter()
        .position(|(t, _)| t == sample_type)
        .unwrap_or_else(|| panic!("the profile has no sample type {sample_type}"));
    p.sample.iter().map(|s| s.value[i]).sum()
}

/// Checks a cpu profile against the contract: sample and period types,
/// period = 1e9/hz, a window, and per sample: both values, the second the
/// first times the period, the four labels with numeric pid/tid, and every
/// id resolving. Panics naming the file and the problem.
pub fn check_cpu_profile(file: &ProfileFile, hz: u64) {
    let p = &file.profile;
    let name = file.path.display();
    check_structure(
        file,
        "cpu",
        &[("samples", "count"), ("cpu", "nanoseconds")],
        ("cpu", "nanoseconds"),
    );
    let period = 1_000_000_000 / hz as i64;
    assert!(
        (p.period - period).abs() <= 1,
        "{name}: period {} for {hz} Hz, expected {period}",
        p.period
    );
    for (i, s) in p.sample.iter().enumerate() {
        assert!(
            s.value[0] > 0,
            "{name}: sample {i} has count {}",
            s.value[0]
        );
        assert_eq!(
            s.value[1],
            s.value[0] * p.period,
            "{name}: sample {i}: cpu/nanoseconds must be samples * period"
        );
    }
}

/// The sample types of a heap profile, in the contract's order.
pub const HEAP_SAMPLE_TYPES: [&str; 4] = [
    "alloc_objects",
    "alloc_space",
    "inuse_objects",
    "inuse_space",
];

/// Checks a heap profile against the contract: the four sample types
/// (alloc_objects/count, alloc_space/bytes, inuse_objects/count,
/// inuse_space/bytes), period type space/bytes with period = the
/// heap-sample-bytes `rate`, a window, and per sample: four non-negative
/// values (no space without objects), the four labels with numeric pid/tid,
/// and every id resolving. Panics naming the file and the problem.
pub fn check_heap_profile(file: &ProfileFile, rate: u64) {
    let p = &file.profile;
    let name = file.path.display();
    check_structure(
        file,
        "heap",
        &[
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ],
        ("space", "bytes"),
    );
    assert_eq!(
        p.period, rate as i64,
        "{name}: period must be the heap-sample-bytes {rate}"
    );
    for (i, s) in p.sample.iter().enumerate() {
        assert!(
            s.value.iter().all(|v| *v >= 0),
            "{name}: sample {i} has a negative value: {:?}",
            s.value
        );
        for (objects, space) in [(0, 1), (2, 3)] {
            assert!(
                s.value[space] == 0 || s.value[objects] > 0,
                "{name}: sample {i} has {} {} but {} {}",
                s.value[space],
                HEAP_SAMPLE_TYPES[space],
                s.value[objects],
                HEAP_SAMPLE_TYPES[objects]
            );
        }
    }
}

/// The sample types of the block and mutex profiles, in the contract's
/// order.
pub const WAIT_SAMPLE_TYPES: [&str; 2] = ["contentions", "delay"];

/// The two profiles of futex waits, which share their format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// Waits, charged to the waiter's stack.
    Block,
    /// Wake-ups that ended waits, charged to the waker's stack, one in
    /// `fraction` kept (--mutex-fraction).
    Mutex { fraction: u64 },
}

impl WaitKind {
    /// The profile type's name, as in file names and `--profiles`.
    pub fn name(self) -> &'static str {
        match self {
            WaitKind::Block => "block",
            WaitKind::Mutex { .. } => "mutex",
        }
    }
}

/// Checks a block or mutex profile against the contract: sample types
/// contentions/count and delay/nanoseconds, period type contentions/count
/// with period 1, a window, the four labels with numeric pid/tid, every id
/// resolving, and per sample what the rescaling rules allow. A block sample
/// holds at least one kept wait, which counts at least once (1, or rate/d
/// for a wait d shorter than the rate) and adds a positive delay (d, or the
/// rate). A mutex sample's contentions are a multiple of the fraction (each
/// kept wake-up adds exactly that many); its delay may come without
/// contentions (waits that ended in the window after their wake-up's) but
/// not neither. Panics naming the file and the problem.
pub fn check_wait_profile(file: &ProfileFile, kind: WaitKind) {
    let p = &file.profile;
    let name = file.path.display();
    check_structure(
        file,
        kind.name(),
        &[("contentions", "count"), ("delay", "nanoseconds")],
        ("contentions", "count"),
    );
    assert_eq!(p.period, 1, "{name}: period must be 1 (contention)");
    for (i, s) in p.sample.iter().enumerate() {
        let (contentions, delay) = (s.value[0], s.value[1]);
        match kind {
            WaitKind::Block => assert!(
                contentions >= 1 && delay >= 1,
                "{name}: block sample {i} has {contentions} contentions and {delay} ns of delay; a kept wait adds at least 1 and a positive delay"
            ),
            WaitKind::Mutex { fraction } => assert!(
                contentions >= 0
                    && delay >= 0
                    && contentions + delay > 0
                    && contentions % fraction as i64 == 0,
                "{name}: mutex sample {i} has {contentions} contentions and {delay} ns of delay; expected non-negative values, not both 0, contentions a multiple of the fraction {fraction}"
            ),
        }
    }
}

/// What every profile file must satisfy (docs/SPEC.md, "Output files"): the
/// string table, the sample and period types, a window, a name stamped
/// with the window start, unique ids that resolve, and per sample one value
/// per sample type and exactly one pid, tid, comm and thread label, all
/// string labels, pid and tid numeric.
fn check_structure(
    file: &ProfileFile,
    kind: &str,
    want_types: &[(&str, &str)],
    want_period_type: (&str, &str),
) {
    let p = &file.profile;
    let name = file.path.display();
    assert_eq!(
        p.string_table.first().map(String::as_str),
        Some(""),
        "{name}: string_table[0] must be \"\""
    );
    let types = sample_types(p);
    let want: Vec<(String, String)> = want_types
        .iter()
        .map(|(t, u)| (t.to_string(), u.to_string()))
        .collect();
    assert_eq!(types, want, "{name}: sample types");
    let period_type = p
        .period_type
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: no period_type"));
    assert_eq!(
        (
            string(p, period_type.r#type, "period type"),
            string(p, period_type.unit, "period unit")
        ),
        (
            want_period_type.0.to_string(),
            want_period_type.1.to_string()
        ),
        "{name}: period type"
    );
    assert!(
        p.time_nanos > 1_500_000_000_000_000_000,
        "{name}: time_nanos {} is not a current time",
        p.time_nanos
    );
    assert!(
        p.duration_nanos > 0,
        "{name}: duration_nanos {} is not positive",
        p.duration_nanos
    );

    let file_name = file.name();
    let stamp = parse_file_name(&file_name, kind)
        .unwrap_or_else(|| panic!("{name}: not a {kind} profile name"));
    assert_eq!(
        stamp,
        utc_stamp(p.time_nanos),
        "{name}: the name's time stamp is not the window start time_nanos {}",
        p.time_nanos
    );

    let locations: BTreeMap<u64, &pprof_proto::Location> =
        p.location.iter().map(|l| (l.id, l)).collect();
    let functions: BTreeMap<u64, &pprof_proto::Function> =
        p.function.iter().map(|f| (f.id, f)).collect();
    let mappings: BTreeMap<u64, &pprof_proto::Mapping> =
        p.mapping.iter().map(|m| (m.id, m)).collect();
    assert_eq!(
        locations.len(),
        p.location.len(),
        "{name}: duplicate location ids"
    );
    assert_eq!(
        functions.len(),
        p.function.len(),
        "{name}: duplicate function ids"
    );
    assert_eq!(
        mappings.len(),
        p.mapping.len(),
        "{name}: duplicate mapping ids"
    );
    for l in &p.location {
        assert!(l.id != 0, "{name}: location id 0");
        assert!(
            l.mapping_id == 0 || mappings.contains_key(&l.mapping_id),
            "{name}: location {} has unknown mapping {}",
            l.id,
            l.mapping_id
        );
        for line in &l.line {
            assert!(
                functions.contains_key(&line.function_id),
                "{name}: location {} has unknown function {}",
                l.id,
                line.function_id
            );
        }
    }
    for f in &p.function {
        string(p, f.name, "function name");
        string(p, f.filename, "function file name");
    }
    for m in &p.mapping {
        string(p, m.filename, "mapping file name");
        string(p, m.build_id, "mapping build id");
    }
    for (i, s) in p.sample.iter().enumerate() {
        assert_eq!(
            s.value.len(),
            want_types.len(),
            "{name}: sample {i} has {} values",
            s.value.len()
        );
        for id in &s.location_id {
            assert!(
                locations.contains_key(id),
                "{name}: sample {i} has unknown location {id}"
            );
        }
        let mut keys: Vec<String> = Vec::new();
        for l in &s.label {
            let key = string(p, l.key, "label key");
            assert!(
                l.str != 0 || l.num == 0,
                "{name}: sample {i}: label {key} is numeric; labels must be strings"
            );
            string(p, l.str, "label value");
            keys.push(key);
        }
        for want in ["pid", "tid", "comm", "thread"] {
            assert_eq!(
                keys.iter().filter(|k| *k == want).count(),
                1,
                "{name}: sample {i} must have exactly one {want} label; has {keys:?}"
            );
        }
    }
    for s in flatten(p) {
        for key in ["pid", "tid"] {
            let v = s.label(key).unwrap_or_default();
            assert!(
                v.parse::<u32>().is_ok(),
                "{name}: {key} label {v:?} is not a number"
            );
        }
    }
}

/// A frame of a flattened sample: one line of a location (an inlined
/// location gives several frames, leaf first).
#[derive(Clone, Debug)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: i64,
    pub mapping: String,
    pub build_id: String,
    pub address: u64,
    /// Whether the location has no line at all (not symbolized).
    pub unsymbolized: bool,
}

impl Frame {
    pub fn is_kernel(&self) -> bool {
        self.mapping == KERNEL_MAPPING
    }
}

/// A sample with its labels and frames resolved.
#[derive(Clone, Debug)]
pub struct FlatSample {
    pub labels: BTreeMap<String, String>,
    /// The first value (samples/count of a cpu profile).
    pub count: i64,
    /// The second value (cpu/nanoseconds of a cpu profile).
    pub cpu_ns: i64,
    /// Every value, in the order of the profile's sample types.
    pub values: Vec<i64>,
    /// Leaf first.
    pub frames: Vec<Frame>,
}

impl FlatSample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    pub fn pid(&self) -> u32 {
        self.label("pid").and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    pub fn tid(&self) -> u32 {
        self.label("tid").and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// Index of the first (leaf-most) frame of function `f`.
    pub fn position(&self, f: &str) -> Option<usize> {
        self.frames
            .iter()
            .position(|fr| function_matches(&fr.function, f))
    }

    pub fn has_function(&self, f: &str) -> bool {
        self.position(f).is_some()
    }

    pub fn has_kernel_frame(&self) -> bool {
        self.frames.iter().any(Frame::is_kernel)
    }

    /// The stack as one line, leaf first.
    pub fn stack_text(&self) -> String {
        let names: Vec<String> = self
            .frames
            .iter()
            .map(|f| {
                if f.unsymbolized {
                    format!("{:#x}@{}", f.address, f.mapping)
                } else {
                    f.function.clone()
                }
            })
            .collect();
        names.join(" <- ")
    }
}

/// Whether a symbolized function name is the function `want`: the same
/// name, a compiler clone of it (`want.cold`, `want.isra.0`), or a Rust path
/// ending in `::want` (with or without the legacy `::h<hash>` suffix).
pub fn function_matches(name: &str, want: &str) -> bool {
    let name = strip_rust_hash(name);
    name == want
        || name
            .strip_prefix(want)
            .is_some_and(|rest| rest.starts_with('.'))
        || name
            .strip_suffix(want)
            .is_some_and(|head| head.ends_with("::"))
}

fn strip_rust_hash(name: &str) -> &str {
    match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.bytes().all(|c| c.is_ascii_hexdigit()) => {
            head
        }
        _ => name,
    }
}

/// The samples of a profile with labels and frames resolved.
pub fn flatten(p: &Profile) -> Vec<FlatSample> {
    let s = |i: i64| string(p, i, "profile string");
    let functions: BTreeMap<u64, &pprof_proto::Function> =
        p.function.iter().map(|f| (f.id, f)).collect();
    let mappings: BTreeMap<u64, &pprof_proto::Mapping> =
        p.mapping.iter().map(|m| (m.id, m)).collect();
    let mut frames_of: BTreeMap<u64, Vec<Frame>> = BTreeMap::new();
    for l in &p.location {
        let (mapping, build_id) = mappings
            .get(&l.mapping_id)
            .map(|m| (s(m.filename), s(m.build_id)))
            .unwrap_or_default();
        let frames = if l.line.is_empty() {
            vec![Frame {
                function: String::new(),
                file: String::new(),
                line: 0,
                mapping,
                build_id,
                address: l.address,
                unsymbolized: true,
            }]
        } else {
            l.line
                .iter()
                .map(|line| {
                    let f = functions.get(&line.function_id);
                    Frame {
                        function: f.map(|f| s(f.name)).unwrap_or_default(),
                        file: f.map(|f| s(f.filename)).unwrap_or_default(),
                        line: line.line,
                        mapping: mapping.clone(),
                        build_id: build_id.clone(),
                        address: l.address,
                        unsymbolized: false,
                    }
                })
                .collect()
        };
        frames_of.insert(l.id, frames);
    }
    p.sample
        .iter()
        .map(|sample| FlatSample {
            labels: sample.label.iter().map(|l| (s(l.key), s(l.str))).collect(),
            count: sample.value.first().copied().unwrap_or(0),
            cpu_ns: sample.value.get(1).copied().unwrap_or(0),
            values: sample.value.clone(),
            frames: sample
                .location_id
                .iter()
                .flat_map(|id| frames_of.get(id).cloned().unwrap_or_default())
                .collect(),
        })
        .collect()
}

/// The samples of every file, in file order.
pub fn flatten_all(files: &[ProfileFile]) -> Vec<FlatSample> {
    files.iter().flat_map(|f| flatten(&f.profile)).collect()
}

/// Samples of one process.
pub fn of_pid(samples: &[FlatSample], pid: u32) -> Vec<FlatSample> {
    samples.iter().filter(|s| s.pid() == pid).cloned().collect()
}

/// Sum of cpu/nanoseconds.
pub fn total_cpu(samples: &[FlatSample]) -> i64 {
    samples.iter().map(|s| s.cpu_ns).sum()
}

/// Sum of cpu/nanoseconds of the samples `keep` keeps.
pub fn cpu_where(samples: &[FlatSample], keep: impl Fn(&FlatSample) -> bool) -> i64 {
    samples.iter().filter(|s| keep(s)).map(|s| s.cpu_ns).sum()
}

/// Sum of samples/count.
pub fn total_count(samples: &[FlatSample]) -> i64 {
    samples.iter().map(|s| s.count).sum()
}

/// (samples, cpu ns) per value of label `key`.
pub fn group_by_label(samples: &[FlatSample], key: &str) -> BTreeMap<String, (i64, i64)> {
    let mut groups: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for s in samples {
        let g = groups
            .entry(s.label(key).unwrap_or("<none>").to_string())
            .or_default();
        g.0 += s.count;
        g.1 += s.cpu_ns;
    }
    groups
}

/// Fraction of the cpu value of `samples` whose stack contains `f` (in any
/// frame).
pub fn share_with(samples: &[FlatSample], f: &str) -> f64 {
    let total = total_cpu(samples);
    if total == 0 {
        return 0.0;
    }
    let with: i64 = samples
        .iter()
        .filter(|s| s.has_function(f))
        .map(|s| s.cpu_ns)
        .sum();
    with as f64 / total as f64
}

/// Of the CPU of `samples` under go_handlers.go's handlers (main.checkout,
/// main.search): the share labeled handler=checkout among those labeled
/// with a handler, and the share that carries a handler label at all.
pub fn handler_label_shares(samples: &[FlatSample]) -> (f64, f64) {
    let (mut checkout, mut labeled, mut all) = (0i64, 0i64, 0i64);
    for s in samples {
        if !(s.has_function("main.checkout") || s.has_function("main.search")) {
            continue;
        }
        all += s.cpu_ns;
        match s.label("handler") {
            Some("checkout") => {
                checkout += s.cpu_ns;
                labeled += s.cpu_ns;
            }
            Some(_) => labeled += s.cpu_ns,
            None => {}
        }
    }
    (
        checkout as f64 / labeled.max(1) as f64,
        labeled as f64 / all.max(1) as f64,
    )
}

/// For the samples of process `pid`: the fraction of their cpu value whose
/// stack contains function `f` (in any frame).
pub fn function_share(samples: &[FlatSample], pid: u32, f: &str) -> f64 {
    share_with(&of_pid(samples, pid), f)
}

/// A readable digest of samples for failure messages: totals, the labels
/// seen, the heaviest leaf functions and the heaviest stacks.
pub fn summary(samples: &[FlatSample]) -> String {
    let total = total_cpu(samples).max(1) as f64;
    let mut out = format!(
        "{} samples, {} counted, {:.3} s of cpu\n",
        samples.len(),
        total_count(samples),
        total_cpu(samples) as f64 / 1e9
    );
    for key in ["pid", "tid", "comm", "thread"] {
        let groups = group_by_label(samples, key);
        let mut groups: Vec<(String, (i64, i64))> = groups.into_iter().collect();
        groups.sort_by_key(|(_, (_, cpu))| -cpu);
        let shown: Vec<String> = groups
            .iter()
            .take(8)
            .map(|(v, (n, _))| format!("{v}:{n}"))
            .collect();
        let _ = writeln!(
            out,
            "  {key}: {}{}",
            shown.join(" "),
            if groups.len() > 8 { " ..." } else { "" }
        );
    }
    let mut leaves: BTreeMap<String, i64> = BTreeMap::new();
    let mut stacks: BTreeMap<String, i64> = BTreeMap::new();
    for s in samples {
        let leaf = s.frames.first().map(|f| {
            if f.unsymbolized {
                format!("{:#x}@{}", f.address, f.mapping)
            } else {
                f.function.clone()
            }
        });
        *leaves
            .entry(leaf.unwrap_or_else(|| "<empty stack>".into()))
            .or_default() += s.cpu_ns;
        *stacks.entry(s.stack_text()).or_default() += s.cpu_ns;
    }
    let mut leaves: Vec<(String, i64)> = leaves.into_iter().collect();
    leaves.sort_by_key(|(_, v)| -v);
    out.push_str("  top leaf functions:\n");
    for (name, v) in leaves.iter().take(12) {
        let _ = writeln!(out, "    {:6.2}%  {name}", *v as f64 * 100.0 / total);
    }
    let mut stacks: Vec<(String, i64)> = stacks.into_iter().collect();
    stacks.sort_by_key(|(_, v)| -v);
    out.push_str("  top stacks (leaf first):\n");
    for (stack, v) in stacks.iter().take(8) {
        let _ = writeln!(out, "    {:6.2}%  {stack}", *v as f64 * 100.0 / total);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        // 2000-02-29T12:34:56Z
        assert_eq!(utc_stamp(951_827_696_000_000_000), "20000229T123456Z");
        // 2024-12-31T23:59:59.9Z
        assert_eq!(utc_stamp(1_735_689_599_900_000_000), "20241231T235959Z");
        // 2026-03-01T00:00:00Z
        assert_eq!(utc_stamp(1_772_323_200_000_000_000), "20260301T000000Z");
    }

    #[test]
    fn file_names() {
        assert_eq!(
            parse_file_name("cpu-20260520T001122Z.pb.gz", "cpu"),
            Some("20260520T001122Z")
        );
        assert_eq!(
            parse_file_name("cpu-20260520T001122Z-3.pb.gz", "cpu"),
            Some("20260520T001122Z")
        );
        assert_eq!(
            parse_file_name(".cpu-20260520T001122Z.pb.gz.tmp", "cpu"),
            None
        );
        assert_eq!(parse_file_name("heap-20260520T001122Z.pb.gz", "cpu"), None);
        assert_eq!(parse_file_name("cpu-20260520T001122Z-.pb.gz", "cpu"), None);
        assert_eq!(parse_file_name("cpu-2026052T001122Z.pb.gz", "cpu"), None);
    }

    #[test]
    fn function_names() {
        assert!(function_matches("burn_a", "burn_a"));
        assert!(function_matches("burn_a.cold", "burn_a"));
        assert!(!function_matches("burn_ab", "burn_a"));
        assert!(!function_matches("xburn_a", "burn_a"));
        assert!(function_matches("cpu_ratio::burn_a", "burn_a"));
        assert!(function_matches(
            "cpu_ratio::burn_a::h0123456789abcdef",
            "burn_a"
        ));
        assert!(!function_matches("cpu_ratio::main", "burn_a"));
        assert!(function_matches("main", "main"));
        assert!(!function_matches("__libc_start_main", "main"));
    }
}
