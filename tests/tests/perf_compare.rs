//! profilerd beside perf, on programs nobody here wrote: both profile the
//! whole machine over the same stretch of a load of python3, xz, zstd,
//! sqlite3, bash and gcc, and must agree, per process and function, on the
//! flat (leaf) share of CPU samples and on the name of every address both
//! sampled.
//!
//! Why `perf record -e cpu-clock -c PERIOD -a` without a call graph: a flat
//! share depends only on the sampled instruction pointer, so how perf would
//! unwind (frame pointers with `-g`, or 8 KiB stack copies with
//! `--call-graph dwarf`) cannot change it, while DWARF copies would slow
//! every sample and make `perf script` minutes long. `cpu-clock` with the
//! daemon's period is the same hrtimer event the daemon samples with (a
//! hardware cycles event would sample a different clock, with its own
//! skid), so the two tools draw from the same distribution.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use profiler_tests::daemon::{Daemon, require_root, workspace_root};
use profiler_tests::perf::{self, PerfRecord, PerfSample};
use profiler_tests::process::{Guarded, run_with_timeout};
use profiler_tests::profiles::{KERNEL_MAPPING, ProfileFile, assert_only_profiles, read_profiles};
use profiler_tests::{Profile, check_cpu_files, pause, pprof_tool, temp_dir};

/// Samples per second per CPU, both tools.
const HZ: u64 = 999;
/// How long the load runs.
const LOAD: Duration = Duration::from_secs(20);
/// Functions at or above this share in either tool are compared.
const MIN_SHARE: f64 = 0.01;
/// A process (or a comm of a process tree) is compared when both tools
/// have this many samples of it: at 1,000, a 1% function has ~10 samples
/// and the bound below is under 3 points. On a quiet 2-CPU machine each
/// program gets ~5,500; under a concurrent build, ~2,000.
const MIN_SAMPLES: u64 = 1000;
/// Allowed difference of two shares, in standard deviations of the
/// difference of two binomial proportions (pooled). Each tool's count of a
/// function is binomial: n samples, each in the function with probability
/// p. Five sigmas put a false alarm under 1e-6 per comparison, about 1e-4
/// for the ~100 comparisons of a run.
const SIGMAS: f64 = 5.0;
/// Allowed difference on top of the sampling bound, as a share: the two
/// tools' timers are not in phase, and a hot loop of a few instructions can
/// favour one of them by a little.
const SLACK: f64 = 0.005;
/// Share of a process's samples that perf names and profilerd does not, at
/// addresses both sampled in a mapping profilerd knew, above which the test
/// fails.
const MAX_UNNAMED_SHARE: f64 = 0.005;
/// The same for samples of processes whose mappings profilerd never read:
/// compilers that live a few milliseconds and exit before the daemon reads
/// /proc/PID/maps (perf reads them from its mmap records). 0.03% of gcc's
/// samples on a quiet run; 0.55% in a run on a clean checkout, where the
/// first reads of each binary come from disk.
const MAX_UNMAPPED_SHARE: f64 = 0.02;

/// The Python program: JSON encoding and decoding, which calls through the
/// PLT of python3.11 (memcpy, memset) and of its `_json` module.
const PYTHON_JSON: &str = r#"
import json
doc = {"k%d" % i: [i, str(i) * 3, {"x": i * 1.5, "y": [1, 2, 3], "z": None}] for i in range(400)}
while True:
    text = json.dumps(doc)
    json.loads(text)
"#;

/// sqlite3: an endless recursive query with string formatting.
const SQLITE_QUERY: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
     SELECT count(*) FROM c WHERE printf('%08d-%x', x, x * 7) LIKE '%77%';";

/// bash: arithmetic and string builtins, no forks.
const BASH_LOOP: &str = r#"i=0; s=; while :; do i=$((i * 7 + 3 & 65535)); s="${s:0:48}$i"; case $s in *999*) s=;; esac; done"#;

/// A program the test runs, by the name it is reported under.
struct Load {
    name: String,
    cmd: Command,
}

fn load(name: &str, program: &str, args: &[&str]) -> Load {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Load {
        name: name.to_string(),
        cmd,
    }
}

/// Files to compress: large system files every machine with gcc has.
fn compress_inputs() -> Vec<String> {
    let inputs: Vec<String> = [
        "/usr/lib/gcc/x86_64-linux-gnu/12/cc1",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/bin/python3.11",
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    ]
    .iter()
    .filter(|p| Path::new(p).is_file())
    .map(|p| p.to_string())
    .collect();
    assert!(!inputs.is_empty(), "no large system file to compress");
    inputs
}

fn require(program: &str, package: &str) -> String {
    let path = format!("/usr/bin/{program}");
    assert!(
        Path::new(&path).is_file(),
        "{path} is missing: install {package} (`cargo xtask test` installs it)"
    );
    path
}

/// The load: Debian's own programs, each in a process of its own (gcc and
/// its cc1 and as in a loop). Also the `python3` on PATH when it is
/// another interpreter with a shared libpython (a pyenv build keeps its
/// symbol table: its `_init` is what PLT calls were charged to).
fn loads(dir: &Path) -> Vec<Load> {
    let python = require("python3", "python3");
    let xz = require("xz", "xz-utils");
    let zstd = require("zstd", "zstd");
    let sqlite = require("sqlite3", "sqlite3");
    let bash = require("bash", "bash");
    require("gcc", "gcc");
    require("perf", "linux-perf");
    require("objdump", "binutils");
    let inputs = compress_inputs();
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let source = workspace_root().join("tests/workloads/mixed.c");
    let gcc_loop = format!(
        "while :; do gcc -O2 -g -c '{}' -o '{}'; done",
        source.display(),
        dir.join("mixed.o").display()
    );
    let mut loads = vec![
        load("python3", &python, &["-c", PYTHON_JSON]),
        load(
            "xz",
            &xz,
            &[&["-T1", "-9", "-c", "--"], &inputs[..]].concat(),
        ),
        load(
            "zstd",
            &zstd,
            &[&["-T1", "-19", "-q", "-c", "--"], &inputs[..]].concat(),
        ),
        load("sqlite3", &sqlite, &[":memory:", SQLITE_QUERY]),
        load("bash", &bash, &["-c", BASH_LOOP]),
        load("gcc", "/bin/sh", &["-c", &gcc_loop]),
    ];
    if let Some(other) = other_python(&python) {
        loads.push(load("python3 (PATH)", &other, &["-c", PYTHON_JSON]));
    }
    loads
}

/// The interpreter `python3` on PATH runs, if it is not `debian` and was
/// built with a shared libpython.
fn other_python(debian: &str) -> Option<String> {
    let on_path = std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("python3"))
        .find(|p| p.is_file())?;
    let mut cmd = Command::new(on_path);
    cmd.args([
        "-c",
        "import os, sys, sysconfig; print(os.path.realpath(sys.executable), sysconfig.get_config_var('Py_ENABLE_SHARED'))",
    ]);
    let out = run_with_timeout(cmd, "python3 -c", Duration::from_secs(20));
    let text = String::from_utf8_lossy(&out.stdout);
    let (exe, shared) = text.trim().rsplit_once(' ')?;
    let debian = std::fs::canonicalize(debian).ok()?;
    (out.status.success() && shared == "1" && Path::new(exe) != debian).then(|| exe.to_string())
}

/// One leaf as profilerd recorded it: process, thread name, address, and
/// the names of its location (leaf first; several when inlined) or none,
/// with its mapping.
struct Leaf {
    pid: u32,
    comm: String,
    address: u64,
    lines: Vec<String>,
    mapping: Option<MappingInfo>,
    count: u64,
}

#[derive(Clone)]
struct MappingInfo {
    path: String,
    start: u64,
    file_offset: u64,
}

fn label<'a>(p: &'a Profile, sample: &pprof_proto::Sample, key: &str) -> Option<&'a str> {
    sample.label.iter().find_map(|l| {
        (p.string_table.get(l.key as usize)? == key)
            .then(|| p.string_table.get(l.str as usize).map(String::as_str))?
    })
}

/// CPython's evaluator, whose calls the daemon replaces by the Python
/// frames they ran.
const PYTHON_EVALUATOR: &str = "_PyEval_EvalFrameDefault";

/// The leaf of every sample of every file.
fn our_leaves(files: &[ProfileFile]) -> Vec<Leaf> {
    let mut leaves = Vec::new();
    for file in files {
        let p = &file.profile;
        let s = |i: i64| p.string_table[i as usize].clone();
        let locations: HashMap<u64, &pprof_proto::Location> =
            p.location.iter().map(|l| (l.id, l)).collect();
        let functions: HashMap<u64, &pprof_proto::Function> =
            p.function.iter().map(|f| (f.id, f)).collect();
        let mappings: HashMap<u64, &pprof_proto::Mapping> =
            p.mapping.iter().map(|m| (m.id, m)).collect();
        for sample in &p.sample {
            let Some(location) = sample.location_id.first().and_then(|id| locations.get(id)) else {
                continue;
            };
            let pid = label(p, sample, "pid")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let comm = label(p, sample, "thread").unwrap_or_default().to_string();
            // A Python frame (no address, no mapping) at the leaf stands for
            // the evaluator call it ran in, whose place the daemon gives
            // it as `py-spy --native` does: perf names that call, in the
            // interpreter's object (the executable or libpython, which
            // the stack's native frames below it are in).
            let python_leaf =
                location.address == 0 && location.mapping_id == 0 && !location.line.is_empty();
            let interpreter = |id: &u64| {
                let mapping = mappings.get(&locations.get(id)?.mapping_id)?;
                let name = s(mapping.filename);
                let name = basename(&name);
                (name.starts_with("python") || name.starts_with("libpython")).then_some(mapping.id)
            };
            let mapped = match python_leaf {
                true => sample.location_id.iter().find_map(interpreter).unwrap_or(0),
                false => location.mapping_id,
            };
            leaves.push(Leaf {
                pid,
                comm,
                address: location.address,
                lines: match python_leaf {
                    true => vec![PYTHON_EVALUATOR.to_string()],
                    false => location
                        .line
                        .iter()
                        .filter_map(|l| functions.get(&l.function_id).map(|f| s(f.name)))
                        .collect(),
                },
                mapping: mappings.get(&mapped).map(|m| MappingInfo {
                    path: s(m.filename),
                    start: m.memory_start,
                    file_offset: m.file_offset,
                }),
                count: sample.value[0] as u64,
            });
        }
    }
    leaves
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A C++ name as perf prints it by default (libiberty without
/// DMGL_PARAMS): without its final parameter list and what follows it
/// (`const`), without the return type a template function's name starts
/// with (`void va_gc::reserve<...>(...)`: perf `va_gc::reserve<...>`),
/// and with integer template arguments as libiberty writes them
/// (`poly_int<(unsigned int)1, ...>`: perf `poly_int<1u, ...>`); a `@plt`
/// suffix stays. Other names are left as they are.
fn perf_style(name: &str) -> String {
    let stripped = without_parameters(name);
    if stripped == name {
        return stripped;
    }
    libiberty_literals(without_return_type(&stripped))
}

/// `name` from its last space outside brackets on, when what comes before
/// is a return type (not `operator`, as in `operator new`).
fn without_return_type(name: &str) -> &str {
    let mut depth = 0i32;
    let mut last = None;
    for (i, c) in name.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            ' ' if depth == 0 => last = Some(i),
            _ => {}
        }
    }
    match last {
        Some(i) if !name[..i].ends_with("operator") && !name[i + 1..].starts_with("operator") => {
            &name[i + 1..]
        }
        _ => name,
    }
}

/// Integer template arguments written with a cast (`(unsigned int)1`,
/// `(long)-3`), as libiberty writes them (`1u`, `-3l`); `(int)4` is `4`.
fn libiberty_literals(name: &str) -> String {
    const CASTS: [(&str, &str); 6] = [
        ("(unsigned int)", "u"),
        ("(unsigned long)", "ul"),
        ("(unsigned long long)", "ull"),
        ("(long)", "l"),
        ("(long long)", "ll"),
        ("(int)", ""),
    ];
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    'outer: while !rest.is_empty() {
        for (cast, suffix) in CASTS {
            if let Some(after) = rest.strip_prefix(cast) {
                let digits = after
                    .char_indices()
                    .take_while(|&(i, c)| c.is_ascii_digit() || (i == 0 && c == '-'))
                    .count();
                if digits > 0 && after[..digits].chars().any(|c| c.is_ascii_digit()) {
                    out.push_str(&after[..digits]);
                    out.push_str(suffix);
                    rest = &after[digits..];
                    continue 'outer;
                }
            }
        }
        let c = rest.chars().next().expect("not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// A C++ name without its final parameter list and what follows it.
fn without_parameters(name: &str) -> String {
    let (base, plt) = match name.strip_suffix("@plt") {
        Some(base) => (base, "@plt"),
        None => (name, ""),
    };
    let Some(close) = base.rfind(')') else {
        return name.to_string();
    };
    let qualifiers = &base[close + 1..];
    if !qualifiers
        .split_whitespace()
        .all(|q| matches!(q, "const" | "volatile" | "&" | "&&" | "noexcept"))
    {
        return name.to_string();
    }
    let mut depth = 0;
    for (i, c) in base[..=close].char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    // A C++ parameter list follows a name directly.
                    return if i == 0 || base[..i].ends_with(' ') {
                        name.to_string()
                    } else {
                        format!("{}{plt}", &base[..i])
                    };
                }
            }
            _ => {}
        }
    }
    name.to_string()
}

/// The function a leaf is charged to in the flat comparison, and the
/// name to show for it: the outermost function of the location (perf
/// names the symbol, not the inlined call), or `[unknown] (object)`.
fn our_key(leaf: &Leaf, aliases: &mut Aliases) -> (String, String) {
    let path = leaf
        .mapping
        .as_ref()
        .map_or("[unknown]", |m| m.path.as_str());
    match leaf.lines.last() {
        Some(name) => (aliases.key(path, name), normalize(name)),
        None => {
            let key = format!("[unknown] ({})", basename(path));
            (key.clone(), key)
        }
    }
}

fn perf_key(s: &PerfSample, aliases: &mut Aliases) -> (String, String) {
    match &s.sym {
        Some(sym) => (aliases.key(&s.dso, sym), normalize(sym)),
        None => {
            let key = format!("[unknown] ({})", basename(&s.dso));
            (key.clone(), key)
        }
    }
}

/// The load a process belongs to: its own, or its nearest ancestor's.
fn owner<'a>(
    pid: u32,
    roots: &'a HashMap<u32, String>,
    parents: &HashMap<u32, u32>,
) -> Option<&'a str> {
    let mut pid = pid;
    for _ in 0..64 {
        if let Some(name) = roots.get(&pid) {
            return Some(name);
        }
        pid = *parents.get(&pid)?;
    }
    None
}

/// Counts per (load, comm) and function.
type Flat = BTreeMap<(String, String), BTreeMap<String, u64>>;

/// The binomial bound on the difference of two shares `k1/n1`, `k2/n2`.
fn allowed(k1: u64, n1: u64, k2: u64, n2: u64) -> f64 {
    let p = (k1 + k2) as f64 / (n1 + n2) as f64;
    SIGMAS * (p * (1.0 - p) * (1.0 / n1 as f64 + 1.0 / n2 as f64)).sqrt() + SLACK
}

/// A name reduced to what both tools agree on for one function: perf's
/// C++ form (no parameters), without a symbol version (`cfree@GLIBC_2.2.5`)
/// and without GCC's clone suffixes (`.isra.0`, `.constprop.0`, `.cold`;
/// profilerd names a clone by its DWARF name, perf by its symbol).
fn normalize(name: &str) -> String {
    if name.starts_with('.') || name.starts_with('[') {
        return name.to_string();
    }
    let (base, plt) = match name.strip_suffix("@plt") {
        Some(base) => (base, "@plt"),
        None => (name, ""),
    };
    let base = base.split(" [clone ").next().unwrap_or(base);
    let base = perf_style(base);
    let base = base.split('@').next().unwrap_or(&base);
    let base = if base.contains("::") || base.contains('(') {
        base
    } else {
        base.split('.').next().unwrap_or(base)
    };
    format!("{base}{plt}")
}

/// The addresses each (normalized) name has in an object's symbol tables,
/// its `.symtab` and `.dynsym` and those of its detached debug file (found
/// by build ID under /usr/lib/debug, where both tools look): names that
/// share an address are aliases of one function (glibc's `malloc` and
/// `__GI___libc_malloc`, `__memmove_avx_unaligned` and
/// `__memcpy_avx_unaligned`), and the two tools pick among aliases by
/// different rules.
struct Aliases {
    objects: HashMap<String, HashMap<String, Vec<u64>>>,
}

impl Aliases {
    fn of(&mut self, path: &str) -> &HashMap<String, Vec<u64>> {
        self.objects.entry(path.to_string()).or_insert_with(|| {
            let mut names: HashMap<String, Vec<u64>> = HashMap::new();
            if path == KERNEL_MAPPING {
                // The kernel's aliases (`memcpy` and `__pi_memcpy`) share an
                // address in kallsyms; either tool may pick either.
                let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
                for line in text.lines() {
                    let mut fields = line.split_whitespace();
                    if let (Some(addr), Some(_), Some(name)) =
                        (fields.next(), fields.next(), fields.next())
                        && let Ok(addr) = u64::from_str_radix(addr, 16)
                        && addr != 0
                    {
                        let addrs = names.entry(normalize(name)).or_default();
                        if !addrs.contains(&addr) {
                            addrs.push(addr);
                        }
                    }
                }
                return names;
            }
            let Ok(data) = std::fs::read(path) else {
                return names;
            };
            let mut add = |data: &[u8]| -> Option<Vec<u8>> {
                use object::{Object as _, ObjectSymbol as _};
                let file = object::File::parse(data).ok()?;
                for symbol in file.symbols().chain(file.dynamic_symbols()) {
                    // Not `is_definition`, which leaves out IFUNC symbols:
                    // glibc's `memmove` is an IFUNC at the address of its
                    // resolver `__libc_memmove_ifunc`.
                    if !symbol.is_undefined()
                        && symbol.section_index().is_some()
                        && let Ok(name) = symbol.name()
                    {
                        let addrs = names.entry(normalize(name)).or_default();
                        if !addrs.contains(&symbol.address()) {
                            addrs.push(symbol.address());
                        }
                    }
                }
                file.build_id().ok().flatten().map(<[u8]>::to_vec)
            };
            if let Some(id) = add(&data).filter(|id| id.len() > 1) {
                let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
                let debug = format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
                if let Ok(data) = std::fs::read(debug) {
                    add(&data);
                }
            }
            names
        })
    }

    /// Whether `a` and `b` name one function of the object at `path`.
    fn same(&mut self, path: &str, a: &str, b: &str) -> bool {
        let (a, b) = (normalize(a), normalize(b));
        if a == b {
            return true;
        }
        let names = self.of(path);
        match (names.get(&a), names.get(&b)) {
            (Some(x), Some(y)) => x.iter().any(|addr| y.contains(addr)),
            _ => false,
        }
    }

    /// The key a function is counted under in the flat comparison: its
    /// object and address when its name has one address there, else its
    /// normalized name.
    fn key(&mut self, path: &str, name: &str) -> String {
        let name = normalize(name);
        if path != KERNEL_MAPPING
            && !name.starts_with('[')
            && let Some([addr]) = self.of(path).get(&name).map(Vec::as_slice)
        {
            return format!("{}+{addr:#x}", basename(path));
        }
        name
    }
}

/// objdump's PLT labels of a file, by file offset (see
/// [`plt_label_matches`]).
struct PltLabels {
    cache: HashMap<String, Vec<(u64, String)>>,
}

impl PltLabels {
    /// The label of the PLT code at `offset` of `path`, if it is PLT code.
    fn at(&mut self, path: &str, offset: u64) -> Option<String> {
        let labels = self.cache.entry(path.to_string()).or_insert_with(|| {
            let mut cmd = Command::new("objdump");
            cmd.args(["-d", "-F", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got"])
                .arg(path);
            let out = run_with_timeout(cmd, "objdump -d", Duration::from_secs(60));
            let text = String::from_utf8_lossy(&out.stdout);
            let mut labels = Vec::new();
            for line in text.lines() {
                if let Some((_, rest)) = line.split_once(" <")
                    && let Some((name, offset)) = rest.split_once("> (File Offset: 0x")
                    && let Ok(offset) = u64::from_str_radix(offset.trim_end_matches("):"), 16)
                {
                    labels.push((offset, name.to_string()));
                }
            }
            labels.sort();
            labels
        });
        let at = labels.partition_point(|(o, _)| *o <= offset);
        let (start, name) = labels.get(at.checked_sub(1)?)?;
        // Stubs are at most 16 bytes; the header of .plt up to 16.
        (offset - start < 16 || name == ".plt").then(|| name.clone())
    }
}

/// Whether our name for PLT code is objdump's label for it: `memcpy@plt`
/// as is; the lazy-binding header (`<first@plt-0x10>` or `<.plt>`) as
/// `.plt`; an IRELATIVE slot (`<*ABS*+0x9be70@plt>`), which objdump does
/// not name, as some `name@plt`.
fn plt_label_matches(ours: &str, label: &str) -> bool {
    if label == ".plt" || label.contains("@plt-0x") {
        return ours == ".plt";
    }
    if label.starts_with("*ABS*+0x") && label.ends_with("@plt") {
        // An IRELATIVE slot: neither objdump nor perf 6.1 names its stub;
        // profilerd names it by the IFUNC symbol at the resolver (perf
        // 6.3's rule, checked against the symbol tables in plt.rs's
        // tests), or `offset_0x...@plt` when none is there.
        return ours
            .strip_suffix("@plt")
            .is_some_and(|target| !target.is_empty());
    }
    normalize(ours) == normalize(label)
}

#[test]
fn flat_profiles_and_names_agree_with_perf() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let period = 1_000_000_000 / HZ;
    let loads = loads(tmp.path());
    let mut daemon = Daemon::start(&[
        "--profiles",
        "cpu",
        "--cpu-frequency",
        &HZ.to_string(),
        "--interval",
        "120s",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    daemon.wait_ready();
    let mut perf = PerfRecord::start(
        tmp.path(),
        &[
            "-e",
            "cpu-clock",
            "-c",
            &period.to_string(),
            "-a",
            "--quiet",
        ],
    );
    perf.enable();

    let mut roots: HashMap<u32, String> = HashMap::new();
    let mut running: Vec<Guarded> = Vec::new();
    for load in loads {
        let guard = Guarded::spawn(load.cmd, &load.name);
        roots.insert(guard.pid(), load.name);
        running.push(guard);
    }
    pause(LOAD);
    for guard in &mut running {
        let status = guard.try_wait();
        assert!(
            status.is_none(),
            "{} exited before the end of the load: {status:?}",
            guard.name()
        );
    }
    // Killed with their process groups (gcc's cc1 and as too), then reaped.
    for mut guard in running {
        guard.kill();
    }
    perf.disable();
    let data = perf.stop();
    daemon.signal(libc::SIGINT);
    daemon.wait_success(Duration::from_secs(30));

    let files = read_profiles(&out, "cpu");
    assert_only_profiles(&out, "cpu");
    assert!(
        !files.is_empty(),
        "no cpu profile written\n{}",
        daemon.describe()
    );
    check_cpu_files(&files, HZ);
    // `go tool pprof -raw` counts the same samples as our decoder.
    for file in &files {
        let raw = pprof_tool::check_readable(&file.path, true);
        let (_, sums) = pprof_tool::raw_totals(&raw);
        let ours: i64 = file.profile.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(
            sums.first().copied(),
            Some(ours),
            "{}: sample totals",
            file.name()
        );
    }

    let script = perf::script(&data);
    let parents: HashMap<u32, u32> = script
        .forks
        .iter()
        .filter(|(child, parent)| child != parent)
        .copied()
        .collect();
    let leaves = our_leaves(&files);

    // Flat counts per (load, comm) and function; the name shown for a
    // function is perf's when perf has it.
    let mut aliases = Aliases {
        objects: HashMap::new(),
    };
    let mut shown: HashMap<String, String> = HashMap::new();
    let mut ours: Flat = BTreeMap::new();
    let mut theirs: Flat = BTreeMap::new();
    for leaf in &leaves {
        if let Some(name) = owner(leaf.pid, &roots, &parents) {
            let (key, display) = our_key(leaf, &mut aliases);
            shown.entry(key.clone()).or_insert(display);
            *ours
                .entry((name.to_string(), leaf.comm.clone()))
                .or_default()
                .entry(key)
                .or_default() += leaf.count;
        }
    }
    // perf's name (and object) at each (pid, address) it sampled.
    let mut perf_at: HashMap<(u32, u64), &PerfSample> = HashMap::new();
    for sample in &script.samples {
        if let Some(name) = owner(sample.pid, &roots, &parents) {
            let (key, display) = perf_key(sample, &mut aliases);
            shown.insert(key.clone(), display);
            *theirs
                .entry((name.to_string(), sample.comm.clone()))
                .or_default()
                .entry(key)
                .or_default() += 1;
            perf_at.insert((sample.pid, sample.ip), sample);
        }
    }

    let mut report = String::new();
    let mut failures = Vec::new();
    let mut compared_groups = 0;
    let groups: Vec<&(String, String)> = ours.keys().chain(theirs.keys()).collect();
    let groups: std::collections::BTreeSet<_> = groups.into_iter().collect();
    for group in groups {
        let empty = BTreeMap::new();
        let (a, b) = (
            ours.get(group).unwrap_or(&empty),
            theirs.get(group).unwrap_or(&empty),
        );
        let (n1, n2): (u64, u64) = (a.values().sum(), b.values().sum());
        let _ = writeln!(
            report,
            "\n{} / {}: profilerd {n1} samples, perf {n2}",
            group.0, group.1
        );
        if n1 < MIN_SAMPLES || n2 < MIN_SAMPLES {
            let _ = writeln!(report, "  (not compared: under {MIN_SAMPLES} samples)");
            continue;
        }
        compared_groups += 1;
        let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
        names.sort();
        names.dedup();
        let mut rows: Vec<(f64, f64, f64, &String)> = names
            .into_iter()
            .map(|name| {
                let (k1, k2) = (
                    a.get(name).copied().unwrap_or(0),
                    b.get(name).copied().unwrap_or(0),
                );
                (
                    k1 as f64 / n1 as f64,
                    k2 as f64 / n2 as f64,
                    allowed(k1, n1, k2, n2),
                    name,
                )
            })
            .filter(|(p1, p2, _, _)| p1.max(*p2) >= MIN_SHARE)
            .collect();
        rows.sort_by(|x, y| (y.0 + y.1).total_cmp(&(x.0 + x.1)));
        for (p1, p2, bound, key) in rows {
            let name = shown.get(key).unwrap_or(key);
            let ok = (p1 - p2).abs() <= bound;
            let _ = writeln!(
                report,
                "  {:>6.2}% {:>6.2}%  ±{:.2}  {}{name}",
                p1 * 100.0,
                p2 * 100.0,
                bound * 100.0,
                if ok { "" } else { "MISMATCH " }
            );
            if !ok {
                failures.push(format!(
                    "{} / {}: {name}: profilerd {:.2}%, perf {:.2}% (allowed ±{:.2})",
                    group.0,
                    group.1,
                    p1 * 100.0,
                    p2 * 100.0,
                    bound * 100.0
                ));
            }
        }
    }

    // Names at the addresses both tools sampled.
    let mut labels = PltLabels {
        cache: HashMap::new(),
    };
    let mut checked: HashSet<(u32, u64)> = HashSet::new();
    let (mut agreed, mut plt_by_objdump) = (0, 0);
    // By load: samples perf names and profilerd does not in a mapping it
    // knew, the same in no mapping it knew, and all samples.
    let mut unnamed: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let mut unnamed_examples: Vec<(u64, String)> = Vec::new();
    for leaf in &leaves {
        let Some(load) = owner(leaf.pid, &roots, &parents) else {
            continue;
        };
        let entry = unnamed.entry(load.to_string()).or_default();
        entry.2 += leaf.count;
        let Some(theirs) = perf_at.get(&(leaf.pid, leaf.address)) else {
            continue;
        };
        let their_name = theirs.sym.as_deref();
        let Some(our_name) = leaf.lines.last() else {
            if let Some(name) = their_name {
                match leaf.mapping {
                    Some(_) => entry.0 += leaf.count,
                    None => entry.1 += leaf.count,
                }
                unnamed_examples.push((
                    leaf.count,
                    format!(
                        "pid {} {:#x} ({}), {} samples: perf {name:?}, profilerd none (mapping {:?})",
                        leaf.pid,
                        leaf.address,
                        theirs.dso,
                        leaf.count,
                        leaf.mapping.as_ref().map(|m| m.path.as_str())
                    ),
                ));
            }
            continue;
        };
        if !checked.insert((leaf.pid, leaf.address)) {
            continue;
        }
        let path = leaf
            .mapping
            .as_ref()
            .map_or(KERNEL_MAPPING, |m| m.path.as_str());
        if their_name.is_some_and(|theirs| aliases.same(path, our_name, theirs)) {
            agreed += 1;
            continue;
        }
        // perf before 6.3 names the PLT stubs of an object whose .rela.plt
        // is not in slot order (libc's IRELATIVE entries) one off, names
        // IRELATIVE stubs "@plt" and leaves .plt.got stubs unnamed:
        // objdump's label decides for PLT code.
        let plt_code = leaf
            .mapping
            .as_ref()
            .filter(|m| m.path != KERNEL_MAPPING)
            .and_then(|m| {
                let offset = leaf.address - m.start + m.file_offset;
                labels.at(&m.path, offset)
            });
        match plt_code {
            Some(label) if plt_label_matches(our_name, &label) => {
                plt_by_objdump += 1;
                let _ = writeln!(
                    report,
                    "PLT code at pid {} {:#x} ({}): profilerd {our_name}, perf {their_name:?}, objdump <{label}>",
                    leaf.pid, leaf.address, theirs.dso
                );
            }
            Some(label) => failures.push(format!(
                "pid {} {:#x}: profilerd names it {our_name}, perf {their_name:?}, objdump <{label}>",
                leaf.pid, leaf.address
            )),
            None => failures.push(format!(
                "pid {} {:#x} ({}): profilerd names it {our_name:?} (inlined: {:?}), perf {their_name:?}",
                leaf.pid,
                leaf.address,
                theirs.dso,
                &leaf.lines[..leaf.lines.len() - 1]
            )),
        }
    }
    let _ = writeln!(
        report,
        "\naddresses sampled by both: {agreed} named alike, {plt_by_objdump} in PLT stubs that perf misnames or leaves unnamed and objdump labels as profilerd names them"
    );
    unnamed_examples.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, example) in unnamed_examples.iter().take(10) {
        let _ = writeln!(report, "named by perf only: {example}");
    }
    for (load, (missing, unmapped, total)) in &unnamed {
        let share = |n: u64| n as f64 / (*total).max(1) as f64;
        let _ = writeln!(
            report,
            "{load}: {:.2}% of profilerd's samples at addresses perf names and profilerd does not in a mapping it knew, {:.2}% in none it knew",
            share(*missing) * 100.0,
            share(*unmapped) * 100.0
        );
        for (n, allowed, what) in [
            (*missing, MAX_UNNAMED_SHARE, "in mappings profilerd knew"),
            (
                *unmapped,
                MAX_UNMAPPED_SHARE,
                "of processes whose mappings profilerd never read",
            ),
        ] {
            if share(n) > allowed {
                failures.push(format!(
                    "{load}: {:.2}% of the samples are at addresses that perf names and profilerd leaves unnamed, {what} (allowed {:.2}%)",
                    share(n) * 100.0,
                    allowed * 100.0
                ));
            }
        }
    }
    let plt_frames: u64 = leaves
        .iter()
        .filter(|l| owner(l.pid, &roots, &parents).is_some())
        .filter(|l| {
            l.lines
                .last()
                .is_some_and(|n| n.ends_with("@plt") || n == ".plt")
        })
        .map(|l| l.count)
        .sum();
    let _ = writeln!(report, "profilerd leaf samples in PLT stubs: {plt_frames}");
    println!("{report}");

    assert!(
        compared_groups >= 5,
        "only {compared_groups} processes had {MIN_SAMPLES} samples in both tools{report}"
    );
    assert!(
        agreed >= 500,
        "only {agreed} addresses were sampled by both tools and named alike{report}"
    );
    assert!(
        failures.is_empty(),
        "profilerd and perf disagree:\n  {}\n{report}",
        failures.join("\n  ")
    );
}

#[test]
fn perf_style_names() {
    assert_eq!(perf_style("memcpy"), "memcpy");
    assert_eq!(
        perf_style("wi::divmod_internal(long*, unsigned int*)"),
        "wi::divmod_internal"
    );
    assert_eq!(
        perf_style("operator new(unsigned long)@plt"),
        "operator new@plt"
    );
    assert_eq!(perf_style("A::f(int) const"), "A::f");
    assert_eq!(
        perf_style("(anonymous namespace)::g(char)"),
        "(anonymous namespace)::g"
    );
    assert_eq!(perf_style("X::operator()(int)"), "X::operator()");
    assert_eq!(perf_style("[unknown] (cc1)"), "[unknown] (cc1)");
    assert_eq!(perf_style("f(int) [clone .cold]"), "f(int) [clone .cold]");
    assert_eq!(
        perf_style(
            "void va_gc::reserve<dw_attr_struct, va_gc>(vec<dw_attr_struct, va_gc, vl_embed>*&, unsigned int, bool)"
        ),
        "va_gc::reserve<dw_attr_struct, va_gc>"
    );
    assert_eq!(
        perf_style(
            "bool wi::fits_to_tree_p<poly_int<(unsigned int)1, generic_wide_int<wide_int_ref_storage<false, true> > > >(poly_int<(unsigned int)1, generic_wide_int<wide_int_ref_storage<false, true> > > const&, tree_node const*)"
        ),
        "wi::fits_to_tree_p<poly_int<1u, generic_wide_int<wide_int_ref_storage<false, true> > > >"
    );
    assert_eq!(
        perf_style(
            "hash_table<int_hash<unsigned int, (unsigned int)4294967295, (int)-1>, false>::find(unsigned int const&)"
        ),
        "hash_table<int_hash<unsigned int, 4294967295u, -1>, false>::find"
    );
    assert_eq!(perf_style("operator delete(void*)"), "operator delete");
    assert_eq!(perf_style("std::vector<int> const& f<int>(int)"), "f<int>");
    assert_eq!(normalize("cfree@GLIBC_2.2.5"), "cfree");
    assert_eq!(
        normalize("pthread_mutex_lock@@GLIBC_2.2.5"),
        "pthread_mutex_lock"
    );
    assert_eq!(
        normalize("encoder_listencode_obj.isra.0"),
        "encoder_listencode_obj"
    );
    assert_eq!(normalize("f.cold"), "f");
    assert_eq!(normalize("memcpy@plt"), "memcpy@plt");
    assert_eq!(normalize(".plt"), ".plt");
    assert_eq!(normalize("ns::f(int) [clone .isra.0]"), "ns::f");
}

#[test]
fn plt_labels() {
    assert!(plt_label_matches(".plt", "memcpy@plt-0x10"));
    assert!(plt_label_matches(".plt", ".plt"));
    assert!(plt_label_matches("memcpy@plt", "memcpy@plt"));
    assert!(!plt_label_matches("_init", "memcpy@plt"));
    assert!(!plt_label_matches("_init", ".plt"));
    // An IRELATIVE stub, which objdump does not name: some name@plt.
    let label = "*ABS*+0x9be70@plt";
    assert!(plt_label_matches("memcpy@plt", label));
    assert!(plt_label_matches("offset_0x9be70@plt", label));
    assert!(!plt_label_matches("@plt", label));
    assert!(!plt_label_matches("memcpy", label));
    assert!(!plt_label_matches("_init", label));
}
