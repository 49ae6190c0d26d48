//! `profilerd top` and `profilerd flamegraph` on profiles the daemon wrote
//! of a workload whose split is known (cpu_ratio: burn_a takes 3 parts of
//! CPU, burn_b 1, measured by the workload itself), checked against that
//! truth and against `go tool pprof -top` of the same files; and their bad
//! input: one line, the contract's exit status, nothing written.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use profiler_tests::daemon::{Daemon, profilerd_bin, require_root};
use profiler_tests::pprof_tool::go_binary;
use profiler_tests::process::{mkfifo, run_with_timeout};
use profiler_tests::profiles::{dir_entries, read_profiles};
use profiler_tests::temp_dir;
use profiler_tests::workloads::{Running, Workload, field, parse_report};

/// Sampling rate: high enough that a few seconds of CPU split well.
const HZ: u64 = 499;
/// |reported share of burn_a among burn_a+burn_b - measured share| bound.
const RATIO_TOLERANCE: f64 = 0.05;
/// Bound on one report command (they take milliseconds).
const BOUND: Duration = Duration::from_secs(60);

fn profilerd(args: &[&str]) -> Output {
    let mut cmd = Command::new(profilerd_bin());
    cmd.args(args).env("NO_COLOR", "1");
    run_with_timeout(cmd, &format!("profilerd {}", args.join(" ")), BOUND)
}

fn go_pprof(args: &[&str], files: &[&str]) -> String {
    let mut cmd = Command::new(go_binary());
    cmd.args(["tool", "pprof"]).args(args).args(files);
    if std::env::var_os("HOME").is_none() {
        cmd.env("HOME", std::env::temp_dir());
    }
    let out = run_with_timeout(cmd, "go tool pprof", BOUND);
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// stdout of a successful run, else a panic with everything it printed.
fn success(args: &[&str]) -> String {
    let out = profilerd(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "profilerd {} exited with {}:\n{}\n{stdout}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The lines of a `-top` report from "Duration:" on: everything but the
/// lines naming the files and the local time, which pprof words its own
/// way (pprof also ends its Duration line with a space when it has no ratio).
fn from_duration(text: &str) -> Vec<&str> {
    text.lines()
        .skip_while(|l| !l.starts_with("Duration:"))
        .map(str::trim_end)
        .collect()
}

/// A table row: flat%, cum% and the function name.
#[derive(Debug)]
struct Row {
    flat_pct: f64,
    cum_pct: f64,
    name: String,
}

fn rows(text: &str) -> Vec<Row> {
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat  flat%"))
        .skip(1)
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let pct = |s: &str| -> f64 {
                s.trim_end_matches('%')
                    .parse()
                    .unwrap_or_else(|_| panic!("percentage {s:?} in {l:?}"))
            };
            Row {
                flat_pct: pct(fields[1]),
                cum_pct: pct(fields[4]),
                name: fields[5..].join(" "),
            }
        })
        .collect()
}

/// Profiles the C cpu_ratio workload for its whole life (4 s, a file
/// every 2 s). Returns the cpu files and burn_a's measured share of
/// burn_a + burn_b.
fn profile_cpu_ratio(dir: &Path) -> (Vec<PathBuf>, f64) {
    let exe = Workload::CpuRatioC.build(dir, "cpu_ratio_report");
    let out = dir.join("out");
    let mut workload = Running::start(&exe, &["4", "--wait-stdin"]);
    let pid = workload.pid();
    let mut daemon = Daemon::start(&[
        "--pid",
        &pid.to_string(),
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "2s",
        "--cpu-frequency",
        &HZ.to_string(),
    ]);
    daemon.wait_ready();
    workload.release();
    let report = parse_report(&workload.finish(Duration::from_secs(20)), "pid");
    workload.kill();
    daemon.wait_success(Duration::from_secs(10));
    let files: Vec<PathBuf> = read_profiles(&out, "cpu")
        .into_iter()
        .map(|f| f.path)
        .collect();
    assert!(
        files.len() >= 2,
        "a 4 s run at --interval 2s should give at least 2 files, got {files:?}\n{}",
        daemon.describe()
    );
    let (a, b) = (field(&report, "a_ns") as f64, field(&report, "b_ns") as f64);
    (files, a / (a + b))
}

#[test]
fn top_and_flamegraph_of_a_real_cpu_profile() {
    require_root();
    let tmp = temp_dir();
    let (files, truth) = profile_cpu_ratio(tmp.path());
    let names: Vec<&str> = files.iter().map(|f| f.to_str().unwrap()).collect();

    // The whole table, merged over the files, is pprof's: same values,
    // units, percentages, order and inline marks, for both sample types
    // and both orders.
    for (ours, theirs) in [
        (vec!["-n", "0"], vec!["-top", "-nodefraction=0"]),
        (
            vec!["-n", "0", "--sample-type", "samples"],
            vec!["-top", "-nodefraction=0", "-sample_index=samples"],
        ),
        (
            vec!["-n", "0", "--cum"],
            vec!["-top", "-nodefraction=0", "-cum"],
        ),
    ] {
        let args: Vec<&str> = ["top"]
            .into_iter()
            .chain(ours.iter().copied())
            .chain(names.iter().copied())
            .collect();
        let text = success(&args);
        let reference = go_pprof(&theirs, &names);
        assert_eq!(
            from_duration(&text),
            from_duration(&reference),
            "profilerd {} differs from go tool pprof {}:\n{text}\n---\n{reference}",
            args.join(" "),
            theirs.join(" ")
        );
        println!("profilerd {}:\n{text}", ours.join(" "));
    }

    // The default report: header, the two burners on top, the 3:1 split.
    let text = success(&[&["top"], &names[..]].concat());
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("Files: "), "{text}");
    assert!(
        lines.contains(&"Profile: cpu") && lines.contains(&"Type: cpu"),
        "{text}"
    );
    let table = rows(&text);
    assert!(table.len() <= 20, "20 rows by default:\n{text}");
    let top2: Vec<&str> = table.iter().take(2).map(|r| r.name.as_str()).collect();
    assert_eq!(top2, ["burn_a", "burn_b"], "{text}");
    let (a, b) = (table[0].flat_pct, table[1].flat_pct);
    let share = a / (a + b);
    println!("top: burn_a flat {a}%, burn_b flat {b}%: share {share:.4}, measured {truth:.4}");
    assert!(
        (share - truth).abs() <= RATIO_TOLERANCE,
        "burn_a's share by `profilerd top`: {share:.3}, measured {truth:.3}:\n{text}"
    );
    assert!(
        a + b >= 85.0,
        "burn_a + burn_b hold only {}%:\n{text}",
        a + b
    );

    // The flame graph: well-formed SVG, titled with the types, burn_a and
    // burn_b frames as wide as their cumulative shares.
    let svg_path = tmp.path().join("out").join("flame.svg");
    let svg_arg = svg_path.to_str().unwrap();
    success(&[&["flamegraph", "-o", svg_arg], &names[..]].concat());
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let graph = profiler_tests::flame_graph::FlameGraph::parse(&svg);
    assert_eq!(graph.title(), "cpu profile: cpu (nanoseconds)");
    let (wa, wb) = (graph.width_of("burn_a"), graph.width_of("burn_b"));
    let svg_share = wa / (wa + wb);
    let (ca, cb) = (cum_of(&table, "burn_a"), cum_of(&table, "burn_b"));
    let top_cum_share = ca / (ca + cb);
    println!(
        "flamegraph: burn_a {wa:.2}%, burn_b {wb:.2}% wide: share {svg_share:.4}; \
         top's cum share {top_cum_share:.4}; measured {truth:.4}"
    );
    assert!(
        wa > 0.0 && wb > 0.0,
        "no burn_a or burn_b frames in {}",
        svg_path.display()
    );
    assert!(
        (svg_share - truth).abs() <= RATIO_TOLERANCE,
        "burn_a's share of the flame graph width: {svg_share:.3}, measured {truth:.3}"
    );
    assert!(
        (svg_share - top_cum_share).abs() <= 0.002,
        "flame graph widths ({svg_share:.4}) and top's cum% ({top_cum_share:.4}) disagree"
    );
    // Only the profiles and the SVG: no temporary file left.
    let mut expected: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .chain(["flame.svg".to_owned()])
        .collect();
    expected.sort();
    assert_eq!(dir_entries(&tmp.path().join("out")), expected);
}

/// Every sample type of a real heap profile (a command that allocates at
/// known sites, two files merged) reads as in `go tool pprof -top`: bytes
/// in pprof's B/kB/MB, counts without unit. The flame graph of allocated
/// bytes is titled with both types.
#[test]
fn top_and_flamegraph_of_a_real_heap_profile() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::HeapSites.build(tmp.path(), "heap_sites_report");
    let out = tmp.path().join("out");
    let out_arg = out.to_str().unwrap();
    let mut daemon = Daemon::start(&[
        "--profiles",
        "heap",
        "--heap-sample-bytes",
        "16384",
        "--interval",
        "1s",
        "--output-dir",
        out_arg,
        "--",
        exe.to_str().unwrap(),
    ]);
    daemon.wait_ready();
    daemon.wait_success(Duration::from_secs(90));
    let files: Vec<PathBuf> = read_profiles(&out, "heap")
        .into_iter()
        .map(|f| f.path)
        .collect();
    assert!(!files.is_empty(), "no heap files\n{}", daemon.describe());
    let names: Vec<&str> = files.iter().map(|f| f.to_str().unwrap()).collect();
    for sample_type in [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ] {
        let args: Vec<&str> = ["top", "-n", "0", "--sample-type", sample_type]
            .into_iter()
            .chain(names.iter().copied())
            .collect();
        let text = success(&args);
        let index = format!("-sample_index={sample_type}");
        let reference = go_pprof(&["-top", "-nodefraction=0", &index], &names);
        assert_eq!(
            from_duration(&text),
            from_duration(&reference),
            "profilerd {} differs from go tool pprof:\n{text}\n---\n{reference}",
            args.join(" ")
        );
        if sample_type == "alloc_space" {
            println!("{text}");
            assert!(rows(&text).iter().any(|r| r.name == "site_leak"), "{text}");
        }
    }
    // The default is the last sample type, as in pprof.
    assert!(success(&[&["top"], &names[..]].concat()).contains("\nType: inuse_space\n"));

    let svg_path = tmp.path().join("heap.svg");
    let svg_arg = svg_path.to_str().unwrap();
    success(
        &[
            &["flamegraph", "--sample-type", "alloc_space", "-o", svg_arg],
            &names[..],
        ]
        .concat(),
    );
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let graph = profiler_tests::flame_graph::FlameGraph::parse(&svg);
    assert_eq!(graph.title(), "heap profile: alloc_space (bytes)");
    assert!(graph.width_of("site_leak") > 0.0, "no site_leak frame");
}

fn cum_of(table: &[Row], name: &str) -> f64 {
    table
        .iter()
        .find(|r| r.name == name)
        .map_or(0.0, |r| r.cum_pct)
}

/// A tiny cpu- or heap-shaped profile: main → f with the given values.
fn write_profile(path: &Path, heap: bool, values: Vec<i64>) {
    use pprof_proto::{Function, Line, Location, Profile, Sample, ValueType};
    let mut strings: Vec<String> = ["", "f", "main"].map(String::from).to_vec();
    let types: &[(&str, &str)] = if heap {
        &[
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ]
    } else {
        &[("samples", "count"), ("cpu", "nanoseconds")]
    };
    let mut vt = |(t, u): (&str, &str)| {
        strings.push(t.to_owned());
        strings.push(u.to_owned());
        ValueType {
            r#type: strings.len() as i64 - 2,
            unit: strings.len() as i64 - 1,
        }
    };
    let sample_type: Vec<ValueType> = types.iter().map(|&t| vt(t)).collect();
    let period_type = Some(vt(if heap {
        ("space", "bytes")
    } else {
        ("cpu", "nanoseconds")
    }));
    let profile = Profile {
        sample_type,
        sample: vec![Sample {
            location_id: vec![1, 2],
            value: values,
            label: vec![],
        }],
        location: (1..=2)
            .map(|id| Location {
                id,
                line: vec![Line {
                    function_id: id,
                    line: 1,
                    column: 0,
                }],
                ..Default::default()
            })
            .collect(),
        function: (1..=2)
            .map(|id| Function {
                id,
                name: id as i64,
                system_name: id as i64,
                ..Default::default()
            })
            .collect(),
        string_table: strings,
        period_type,
        period: 1,
        ..Default::default()
    };
    std::fs::write(path, pprof_proto::encode_gzip(&profile)).unwrap();
}

/// Runs a report that must fail: one line on stderr naming `mentions`,
/// nothing on stdout, exit status `code`.
fn assert_fails(args: &[&str], code: i32, mentions: &str) {
    let out = profilerd(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ctx = format!("profilerd {}: {} {stderr:?}", args.join(" "), out.status);
    assert_eq!(out.status.code(), Some(code), "{ctx}");
    assert_eq!(stderr.lines().count(), 1, "{ctx}");
    assert!(stderr.contains(mentions), "{ctx}: should name {mentions:?}");
    let sub = args[0];
    assert!(stderr.starts_with(&format!("profilerd {sub}: ")), "{ctx}");
    assert!(out.stdout.is_empty(), "{ctx}: stdout {:?}", out.stdout);
}

#[test]
fn bad_input_is_one_line_and_writes_nothing() {
    let tmp = temp_dir();
    let p = |name: &str| tmp.path().join(name).to_str().unwrap().to_owned();
    let (cpu, heap, empty_heap, text, missing) = (
        p("cpu-1.pb.gz"),
        p("heap-1.pb.gz"),
        p("heap-2.pb.gz"),
        p("notes.txt"),
        p("missing.pb.gz"),
    );
    write_profile(Path::new(&cpu), false, vec![3, 30_000_000]);
    write_profile(Path::new(&heap), true, vec![1, 100, 1, 100]);
    write_profile(Path::new(&empty_heap), true, vec![1, 100, 0, 0]);
    std::fs::write(&text, "not a profile\n").unwrap();
    let out_dir = tmp.path().join("svg");
    std::fs::create_dir(&out_dir).unwrap();
    let svg = out_dir.join("f.svg");
    let svg = svg.to_str().unwrap();

    // Files that cannot be read, decoded or merged: status 1.
    assert_fails(&["top", &missing], 1, "missing.pb.gz");
    assert_fails(&["top", &text], 1, "not a pprof profile");
    assert_fails(&["top", &cpu, &heap], 1, "cannot merge");
    assert_fails(&["flamegraph", "-o", svg, &missing], 1, "missing.pb.gz");
    assert_fails(&["flamegraph", "-o", svg, &cpu, &heap], 1, "cannot merge");
    // A heap profile with nothing in use: nothing to draw.
    assert_fails(&["flamegraph", "-o", svg, &empty_heap], 1, "no samples");
    let nowhere = p("no/such/dir/f.svg");
    assert_fails(
        &["flamegraph", "-o", &nowhere, &cpu],
        1,
        "no/such/dir/f.svg",
    );
    // Only a regular file is replaced: not a directory, a FIFO (or a
    // device: as root a rename would put the SVG in place of /dev/null)
    // nor a symlink, whose target stays as it was.
    let out_dir_arg = out_dir.to_str().unwrap();
    assert_fails(
        &["flamegraph", "-o", out_dir_arg, &cpu],
        1,
        "not a regular file",
    );
    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo);
    assert_fails(
        &["flamegraph", "-o", fifo.to_str().unwrap(), &cpu],
        1,
        "not a regular file",
    );
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    let link = tmp.path().join("link.svg");
    std::os::unix::fs::symlink(&text, &link).unwrap();
    assert_fails(
        &["flamegraph", "-o", link.to_str().unwrap(), &cpu],
        1,
        "not a regular file",
    );
    assert_eq!(std::fs::read_to_string(&text).unwrap(), "not a profile\n");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // Command-line mistakes: status 2.
    assert_fails(&["top"], 2, "<FILE>");
    assert_fails(
        &["top", "--sample-type", "alloc_space", &cpu],
        2,
        "alloc_space",
    );
    assert_fails(&["top", "-n", "many", &cpu], 2, "many");
    assert_fails(&["flamegraph", &cpu], 2, "--output");
    assert_fails(
        &["flamegraph", "--sample-type", "nope", "-o", svg, &cpu],
        2,
        "nope",
    );
    assert_eq!(dir_entries(&out_dir), Vec::<String>::new());
    assert!(dir_entries(tmp.path()).iter().all(|n| !n.contains(".tmp")));

    // The same inputs done right.
    let text = success(&["top", "--sample-type", "alloc_space", &heap]);
    assert!(
        text.contains("Profile: heap\nType: alloc_space\n"),
        "{text}"
    );
    assert!(
        text.contains("100B   100%   100%       100B   100%  f\n"),
        "{text}"
    );
    success(&["flamegraph", "-o", svg, &cpu]);
    assert_eq!(dir_entries(&out_dir), ["f.svg"]);
    let to_stdout = success(&["flamegraph", "-o", "-", &cpu]);
    let in_file = std::fs::read_to_string(svg).unwrap();
    // The test's capture of stdout ends each line, the last one included.
    assert!(
        to_stdout.trim_end() == in_file.trim_end(),
        "-o - printed {} bytes, not the {} bytes of the SVG file",
        to_stdout.len(),
        in_file.len()
    );

    // The daemon's own help names the subcommands; theirs exit 0.
    let help = success(&["--help"]);
    assert!(
        help.contains("profilerd top") && help.contains("profilerd flamegraph"),
        "{help}"
    );
    assert!(success(&["top", "--help"]).contains("--nodecount"));
    assert!(success(&["flamegraph", "--help"]).contains("--output"));
}
