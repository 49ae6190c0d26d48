//! The heap profile against a workload whose allocations are known
//! (`heap_sites.c`): per allocation site, the allocated objects and bytes
//! (rescaled from Poisson samples) against the numbers it printed, the
//! in-use objects and bytes of a live leak and of freed sites, every
//! allocation at rate 1, a process that exits in the middle of a window,
//! and the same program on jemalloc. The tests of rates, commands and
//! system-wide probes run twice: on uprobe sessions and on the perf-event
//! uprobes of kernels before 6.13, which must give the same answer.
//!
//! A sample belongs to a site when the site's function is in its stack, so
//! the checks hold however the leaf is symbolized.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::process::process_alive;
use profiler_tests::profiles::{
    FlatSample, ProfileFile, assert_only_profiles, flatten, flatten_all, function_matches, of_pid,
    read_profiles,
};
use profiler_tests::workloads::{
    HEAP_LEAK, HEAP_SITES, HeapSiteLine, JEMALLOC_LIB, Running, Workload, comm_of, field,
    parse_heap_site_lines, parse_report,
};
use profiler_tests::{check_heap_files, pprof_heap_tops, temp_dir};

/// --heap-sample-bytes of the accuracy tests: small enough that a few
/// million calls give every site over a thousand samples, and spanning
/// every regime of the rescaling, from 16 B objects (scale ~1000) to
/// 512 KiB ones (always sampled, scale 1).
const RATE: u64 = 16384;
/// |estimated / true - 1| bound for sites with enough expected samples.
const TOLERANCE: f64 = 0.10;
/// Below this many expected samples a site's estimate is too noisy for
/// TOLERANCE; it is only required to be present.
const MIN_EXPECTED_SAMPLES: f64 = 1000.0;
/// In-use bytes (and objects) of a site whose objects are all freed, as a
/// fraction of what it allocated: about zero.
const FREED_INUSE_MAX: f64 = 0.02;
/// How long after the workload's "holding" line a window must end to be
/// read as the leak's live window: time for the daemon to have drained
/// every event before it.
const SETTLE: Duration = Duration::from_millis(250);
/// Bound on the workload's work under the probes (a few seconds expected).
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on the daemon's exit once its targets are gone.
const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(10);
const LEAK: &str = HEAP_LEAK;
/// |estimated / true - 1| bound per site under heaptrack: each site has
/// 700 expected samples or more there (a standard deviation of 4% at most).
const WRAPPED_TOLERANCE: f64 = 0.2;
/// Debian's heaptrack, an allocator interposer.
const HEAPTRACK: &str = "/usr/bin/heaptrack";
const SITES: [&str; 12] = HEAP_SITES;
type Site = HeapSiteLine;

fn expected_samples(calls: u64, size: u64, rate: u64) -> f64 {
    calls as f64 * (1.0 - (-(size as f64) / rate as f64).exp())
}

/// The `site` lines of the workload's stdout; every site of [`SITES`] must
/// be there.
fn parse_sites(stdout: &str) -> Vec<Site> {
    parse_heap_site_lines(stdout)
}

// ---------------------------------------------------------------------------
// What the profile says about a site.

/// Heap values summed over samples.
#[derive(Clone, Copy, Debug, Default)]
struct Heap {
    alloc_objects: i64,
    alloc_space: i64,
    inuse_objects: i64,
    inuse_space: i64,
    /// How many samples (stack and labels) contributed.
    samples: usize,
}

fn heap_of<'a>(samples: impl IntoIterator<Item = &'a FlatSample>) -> Heap {
    let mut h = Heap::default();
    for s in samples {
        h.alloc_objects += s.values[0];
        h.alloc_space += s.values[1];
        h.inuse_objects += s.values[2];
        h.inuse_space += s.values[3];
        h.samples += 1;
    }
    h
}

/// The samples whose stack holds the site's function.
fn of_site<'a>(samples: &'a [FlatSample], site: &'a str) -> impl Iterator<Item = &'a FlatSample> {
    samples.iter().filter(move |s| s.has_function(site))
}

fn site_heap(samples: &[FlatSample], site: &str) -> Heap {
    heap_of(of_site(samples, site))
}

fn in_some_site(s: &FlatSample) -> bool {
    SITES.iter().any(|site| s.has_function(site))
}

fn ratio(measured: i64, truth: u64) -> f64 {
    measured as f64 / truth.max(1) as f64
}

/// Truth and profile side by side, one site a line: `samples` are the
/// allocations (summed over windows), `inuse` the samples of the window
/// whose in-use values are shown, if any.
fn site_table(
    sites: &[Site],
    samples: &[FlatSample],
    inuse: Option<&[FlatSample]>,
    rate: u64,
) -> String {
    let mut out = format!(
        "{:<20} {:>15} {:>9} {:>9} {:>11} {:>6} {:>12} {:>12} {:>6} {:>8} {:>11} {:>11}\n",
        "site",
        "size",
        "calls",
        "exp.samp",
        "alloc_obj",
        "ratio",
        "bytes",
        "alloc_space",
        "ratio",
        "live",
        "inuse_obj",
        "inuse_space"
    );
    for site in sites {
        let h = site_heap(samples, &site.name);
        let live = inuse.map(|w| site_heap(w, &site.name)).unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<20} {:>15} {:>9} {:>9.0} {:>11} {:>6.3} {:>12} {:>12} {:>6.3} {:>8} {:>11} {:>11}",
            site.name,
            if site.min_size == site.max_size {
                site.min_size.to_string()
            } else {
                format!("{}-{}", site.min_size, site.max_size)
            },
            site.calls,
            site.expected_samples(rate),
            h.alloc_objects,
            ratio(h.alloc_objects, site.calls),
            site.bytes,
            h.alloc_space,
            ratio(h.alloc_space, site.bytes),
            site.live,
            live.inuse_objects,
            live.inuse_space
        );
    }
    out
}

/// The heaviest stacks by allocated bytes, and those in no site.
fn heap_summary(samples: &[FlatSample]) -> String {
    let mut stacks: BTreeMap<String, Heap> = BTreeMap::new();
    for s in samples {
        let h = stacks.entry(s.stack_text()).or_default();
        h.alloc_objects += s.values[0];
        h.alloc_space += s.values[1];
        h.inuse_objects += s.values[2];
        h.inuse_space += s.values[3];
        h.samples += 1;
    }
    let mut stacks: Vec<(String, Heap)> = stacks.into_iter().collect();
    stacks.sort_by_key(|(_, h)| -h.alloc_space);
    let mut out = format!(
        "{} samples, {} stacks; heaviest stacks by alloc_space (leaf first):\n",
        samples.len(),
        stacks.len()
    );
    for (stack, h) in stacks.iter().take(16) {
        let _ = writeln!(
            out,
            "  alloc {}/{} B inuse {}/{} B ({} samples): {stack}",
            h.alloc_objects, h.alloc_space, h.inuse_objects, h.inuse_space, h.samples
        );
    }
    let outside: Vec<&(String, Heap)> = stacks
        .iter()
        .filter(|(stack, _)| !SITES.iter().any(|site| stack.contains(site)))
        .collect();
    let _ = writeln!(out, "{} stacks in no site; the heaviest:", outside.len());
    for (stack, h) in outside.iter().take(8) {
        let _ = writeln!(
            out,
            "  alloc {}/{} B inuse {}/{} B: {stack}",
            h.alloc_objects, h.alloc_space, h.inuse_objects, h.inuse_space
        );
    }
    out
}

// ---------------------------------------------------------------------------
// A profiled run.

/// The files of a run, the samples of the workload's process, its truth
/// and the daemon (for its logs).
struct HeapRun {
    rate: u64,
    files: Vec<ProfileFile>,
    samples: Vec<FlatSample>,
    sites: Vec<Site>,
    pid: u32,
    daemon: Daemon,
}

impl HeapRun {
    /// Reads and checks the files in `out` (structure, `go tool pprof -raw`
    /// against our decoder) and the workload's truth from `stdout`.
    fn read(out: &Path, rate: u64, stdout: &str, daemon: Daemon) -> HeapRun {
        assert_only_profiles(out, "heap");
        let files = read_profiles(out, "heap");
        assert!(
            !files.is_empty(),
            "no heap profile written in {}\n{}",
            out.display(),
            daemon.describe()
        );
        check_heap_files(&files, rate);
        let work = parse_report(stdout, "start_ns");
        let pid = field(&work, "pid") as u32;
        let sites = parse_sites(stdout);
        let samples = of_pid(&flatten_all(&files), pid);
        HeapRun {
            rate,
            files,
            samples,
            sites,
            pid,
            daemon,
        }
    }

    /// Everything a failed assertion should show.
    fn diag(&self) -> String {
        format!(
            "\n--- per site, over all {} files (rate {}) ---\n{}\n{}\n{}\n{}",
            self.files.len(),
            self.rate,
            site_table(&self.sites, &self.samples, None, self.rate),
            heap_summary(&self.samples),
            pprof_heap_tops(&self.files),
            self.daemon.describe()
        )
    }

    /// The samples of the workload's process in one file.
    fn samples_in(&self, file: &ProfileFile) -> Vec<FlatSample> {
        of_pid(&flatten(&file.profile), self.pid)
    }

    fn site(&self, name: &str) -> &Site {
        self.sites
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no site {name}"))
    }
}

/// The daemon's arguments. Its config file (written next to `out`) gives
/// the heap event ring 64 MiB: the workload's realloc sites make 2800
/// sampled allocations of 128–512 KiB in a burst of milliseconds, more
/// than the default 16 MiB ring holds (about 960 records) if the daemon is
/// not scheduled at once. These tests measure sampling and rescaling; what
/// a full ring does (losses counted and logged) is faults.rs's.
fn heap_args(rate: u64, interval: &str, out: &Path) -> Vec<String> {
    let config = out.with_extension("toml");
    std::fs::write(&config, "[limits]\nheap_events_bytes = 67108864\n")
        .expect("write the daemon's config file");
    [
        "--config",
        config.to_str().expect("temporary paths are UTF-8"),
        "--profiles",
        "heap",
        "--heap-sample-bytes",
        &rate.to_string(),
        "--interval",
        interval,
        "--output-dir",
        out.to_str().expect("temporary paths are UTF-8"),
    ]
    .map(str::to_string)
    .to_vec()
}

/// How the allocator probes attach: uprobe sessions (Linux 6.13), or the
/// perf-event uprobes of older kernels (an entry and a return probe per
/// function), chosen here by pretending sessions are missing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probes {
    /// What the kernel offers: uprobe sessions from Linux 6.13, else
    /// perf-event uprobes.
    Best,
    /// Perf-event uprobes whatever the kernel offers.
    PerfEvent,
}

impl Probes {
    /// Starts the daemon with `args` and waits until it is ready.
    fn start(self, args: &[String]) -> Daemon {
        let mut cmd = std::process::Command::new(profiler_tests::daemon::profilerd_bin());
        cmd.args(args);
        if self == Probes::PerfEvent {
            cmd.env("PROFILERD_PRETEND_MISSING", "uprobe_session");
        }
        let mut daemon = Daemon::start_command(cmd);
        daemon.wait_ready();
        daemon
    }

    /// The daemon's log names the kind of probe it attached.
    fn assert_used(self, daemon: &Daemon) {
        let kind = match self {
            Probes::Best if profiler_tests::daemon::kernel_at_least(6, 13) => {
                "a uprobe session per file"
            }
            Probes::Best | Probes::PerfEvent => "perf-event uprobes",
        };
        let lines = daemon.stderr_lines();
        let allocator: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("probes: allocator in"))
            .collect();
        assert!(
            !allocator.is_empty() && allocator.iter().all(|l| l.contains(kind)),
            "every allocator probe line should say {kind}:\n{}",
            daemon.describe()
        );
    }
}

/// Starts `profilerd --profiles heap ... --pid P...` and waits until it is
/// ready.
fn heap_daemon_for(pids: &[u32], rate: u64, interval: &str, out: &Path) -> Daemon {
    heap_daemon_with(Probes::Best, pids, rate, interval, out)
}

fn heap_daemon_with(probes: Probes, pids: &[u32], rate: u64, interval: &str, out: &Path) -> Daemon {
    let mut args = heap_args(rate, interval, out);
    for pid in pids {
        args.extend(["--pid".to_string(), pid.to_string()]);
    }
    probes.start(&args)
}

/// Starts `exe ARGS` (ARGS with `--wait-stdin`) and waits for its "ready"
/// line: its libraries, the allocator among them, are mapped, and it waits
/// on stdin.
fn start_ready(exe: &Path, args: &[&str]) -> Running {
    let workload = Running::start(exe, args);
    workload.wait_line(Duration::from_secs(10), |l| l.starts_with("ready "));
    workload
}

fn realtime_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos() as i64
}

fn window_end(f: &ProfileFile) -> i64 {
    f.profile.time_nanos + f.profile.duration_nanos
}

fn covers(f: &ProfileFile, t: i64) -> bool {
    f.profile.time_nanos <= t && t < window_end(f)
}

/// Waits (at most `timeout`) for a heap file in `out` whose window ends at
/// or after `t_ns` (Unix time), and returns its name. Panics if the daemon
/// exits first.
fn wait_for_window_end(out: &Path, t_ns: i64, daemon: &Daemon, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(f) = read_profiles(out, "heap")
            .into_iter()
            .find(|f| window_end(f) >= t_ns)
        {
            return f.name();
        }
        assert!(
            process_alive(daemon.pid()),
            "profilerd exited while a window ending after {t_ns} was awaited\n{}",
            daemon.describe()
        );
        assert!(
            Instant::now() < deadline,
            "no heap window ending after {t_ns} ns within {timeout:?}; files: {:?}\n{}",
            read_profiles(out, "heap")
                .iter()
                .map(|f| (f.name(), f.profile.time_nanos, f.profile.duration_nanos))
                .collect::<Vec<_>>(),
            daemon.describe()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn file_named<'a>(files: &'a [ProfileFile], name: &str) -> &'a ProfileFile {
    files
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("no file {name} among the run's files"))
}

// ---------------------------------------------------------------------------
// The checks.

/// Per site: alloc_objects and alloc_space summed over `samples` (every
/// window of the run) within TOLERANCE of the truth where the site expects
/// at least MIN_EXPECTED_SAMPLES samples; every site that allocated present.
/// With `exact` (rate 1: every allocation recorded), equal up to rounding.
fn assert_alloc_per_site(run: &HeapRun, samples: &[FlatSample], exact: bool) {
    let mut failures = Vec::new();
    for site in &run.sites {
        let h = site_heap(samples, &site.name);
        let expected = site.expected_samples(run.rate);
        if site.calls > 0 && (h.samples == 0 || h.alloc_objects <= 0) {
            failures.push(format!(
                "{}: {} calls ({expected:.0} expected samples) but no allocation in the profile",
                site.name, site.calls
            ));
            continue;
        }
        for (what, measured, truth) in [
            ("alloc_objects", h.alloc_objects, site.calls),
            ("alloc_space", h.alloc_space, site.bytes),
        ] {
            let bad = if exact {
                // One unit of rounding per window.
                (measured - truth as i64).unsigned_abs() > run.files.len() as u64
            } else {
                expected >= MIN_EXPECTED_SAMPLES && (ratio(measured, truth) - 1.0).abs() > TOLERANCE
            };
            if bad {
                failures.push(format!(
                    "{}: {what} {measured}, true {truth} (ratio {:.3}; {expected:.0} expected samples, {} sample entries; allowed {})",
                    site.name,
                    ratio(measured, truth),
                    h.samples,
                    if exact {
                        format!("±{} (rounding)", run.files.len())
                    } else {
                        format!("±{TOLERANCE}")
                    }
                ));
            }
        }
    }
    let table = site_table(&run.sites, samples, None, run.rate);
    println!("allocations per site (rate {}):\n{table}", run.rate);
    assert!(
        failures.is_empty(),
        "allocations per site differ from the truth:\n  {}{}",
        failures.join("\n  "),
        run.diag()
    );
}

/// The in-use values of one window (`file`): a site whose objects are all
/// freed has about none (at most FREED_INUSE_MAX of what it allocated; none
/// at all with `exact`); with `leak_live`, the leak's in-use objects and
/// bytes are its live objects, within TOLERANCE (equal up to rounding with
/// `exact`).
fn assert_inuse(run: &HeapRun, file: &ProfileFile, leak_live: bool, exact: bool, when: &str) {
    let window = run.samples_in(file);
    let mut failures = Vec::new();
    for site in &run.sites {
        let h = site_heap(&window, &site.name);
        if site.name == LEAK && leak_live {
            let expected = expected_samples(site.live, site.min_size, run.rate);
            assert!(
                exact || expected >= MIN_EXPECTED_SAMPLES,
                "the leak's {} live objects give only {expected:.0} expected samples at rate {}: the test cannot judge them",
                site.live,
                run.rate
            );
            for (what, measured, truth) in [
                ("inuse_objects", h.inuse_objects, site.live),
                ("inuse_space", h.inuse_space, site.live_bytes),
            ] {
                let bad = if exact {
                    (measured - truth as i64).abs() > 1
                } else {
                    (ratio(measured, truth) - 1.0).abs() > TOLERANCE
                };
                if bad {
                    failures.push(format!(
                        "{}: {what} {measured}, live {truth} (ratio {:.3}; {expected:.0} expected samples; allowed {})",
                        site.name,
                        ratio(measured, truth),
                        if exact { "±1".to_string() } else { format!("±{TOLERANCE}") }
                    ));
                }
            }
        } else {
            let (max_objects, max_space) = if exact {
                (0.0, 0.0)
            } else {
                (
                    FREED_INUSE_MAX * site.calls as f64,
                    FREED_INUSE_MAX * site.bytes as f64,
                )
            };
            if h.inuse_objects as f64 > max_objects || h.inuse_space as f64 > max_space {
                failures.push(format!(
                    "{}: all freed, yet inuse_objects {} and inuse_space {} (of {} objects, {} bytes allocated; allowed {max_objects:.0} and {max_space:.0})",
                    site.name, h.inuse_objects, h.inuse_space, site.calls, site.bytes
                ));
            }
        }
    }
    println!(
        "in use at the end of {} ({when}):\n{}",
        file.name(),
        site_table(&run.sites, &run.samples, Some(&window), run.rate)
    );
    assert!(
        failures.is_empty(),
        "in-use values of window {} ({when}) are wrong:\n  {}\n--- that window ---\n{}{}",
        file.name(),
        failures.join("\n  "),
        site_table(&run.sites, &run.samples, Some(&window), run.rate),
        run.diag()
    );
}

/// Stacks: every site's samples have the site's function as their leaf
/// (the allocator's own frames are not in the stack) and reach main.
fn assert_site_stacks(run: &HeapRun) {
    let mut failures = Vec::new();
    for site in run.sites.iter().filter(|s| s.calls > 0) {
        let mine: Vec<&FlatSample> = of_site(&run.samples, &site.name).collect();
        let weight = |pred: &dyn Fn(&FlatSample) -> bool| -> f64 {
            let total: i64 = mine.iter().map(|s| s.values[0]).sum();
            let with: i64 = mine.iter().filter(|s| pred(s)).map(|s| s.values[0]).sum();
            with as f64 / total.max(1) as f64
        };
        let leaf = weight(&|s| {
            s.frames
                .first()
                .is_some_and(|f| function_matches(&f.function, &site.name))
        });
        let main = weight(&|s| s.has_function("main"));
        if leaf < 0.95 || main < 0.95 {
            let example = mine
                .iter()
                .find(|s| {
                    !s.frames
                        .first()
                        .is_some_and(|f| function_matches(&f.function, &site.name))
                        || !s.has_function("main")
                })
                .map(|s| s.stack_text())
                .unwrap_or_default();
            failures.push(format!(
                "{}: leaf is the site in {leaf:.3}, main in the stack in {main:.3} of its allocations (expected ≥ 0.95 each); e.g. {example}",
                site.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "stacks of the allocation sites:\n  {}{}",
        failures.join("\n  "),
        run.diag()
    );
}

/// Labels of a single-threaded workload: comm and thread are the
/// executable's name, tid the pid.
fn assert_labels(run: &HeapRun, exe: &Path) {
    let comm = comm_of(exe);
    for s in &run.samples {
        assert!(
            s.label("comm") == Some(comm.as_str())
                && s.label("thread") == Some(comm.as_str())
                && s.tid() == run.pid,
            "labels of a sample of the single-threaded {comm} (pid {}): {:?}",
            run.pid,
            s.labels
        );
    }
}

// ---------------------------------------------------------------------------
// The tests.

/// `-- COMMAND`: the probes are attached before the command's first
/// instruction, so the whole run is profiled. Windows of 2 s: the sums over
/// the windows must match the truth per site.
#[test]
fn alloc_per_site_under_command() {
    alloc_per_site_under_command_with(Probes::Best);
}

/// The same, with the probes of kernels before 6.13 (made by the command
/// itself between fork and exec, one per function and direction): the
/// same answer.
#[test]
fn alloc_per_site_under_command_on_perf_event_uprobes() {
    alloc_per_site_under_command_with(Probes::PerfEvent);
}

fn alloc_per_site_under_command_with(probes: Probes) {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::HeapSites.build(tmp.path(), "heap_sites_cmd");
    let out = tmp.path().join("out");
    let mut args = heap_args(RATE, "2s", &out);
    args.extend(["--".to_string(), exe.to_string_lossy().into_owned()]);
    let mut daemon = probes.start(&args);
    // The daemon stops by itself when the command exits.
    daemon.wait_success(WORKLOAD_TIMEOUT);
    let stdout = daemon.stdout_text();
    let run = HeapRun::read(&out, RATE, &stdout, daemon);
    probes.assert_used(&run.daemon);
    println!(
        "{} heap files; work {:?}",
        run.files.len(),
        parse_report(&stdout, "start_ns")
    );

    let strangers: Vec<String> = flatten_all(&run.files)
        .iter()
        .filter(|s| s.pid() != run.pid)
        .map(|s| format!("{:?}", s.labels))
        .collect();
    assert!(
        strangers.is_empty(),
        "samples of processes other than the command {}: {strangers:?}{}",
        run.pid,
        run.diag()
    );
    assert_labels(&run, &exe);
    assert_alloc_per_site(&run, &run.samples, false);
    assert_site_stacks(&run);
    // Once the daemon has told the kernel where the thread's stack ends,
    // sampled allocations come in the short record form; the accuracy and
    // stack checks above cover both forms.
    let short = run.daemon.summary_field("records_short_form");
    println!("sampled allocations in the short record form: {short}");
    assert!(short > 0, "no record came in the short form{}", run.diag());

    // Nearly every allocated byte is in a site (the rest: the C runtime's
    // start and the workload's own bookkeeping).
    let total = heap_of(&run.samples).alloc_space;
    let in_sites = heap_of(run.samples.iter().filter(|s| in_some_site(s))).alloc_space;
    assert!(
        in_sites as f64 >= 0.95 * total as f64,
        "only {in_sites} of {total} allocated bytes are in the sites{}",
        run.diag()
    );

    // Sites that free what they allocate have about nothing in use at the
    // end of any window.
    for file in &run.files {
        for site in run.sites.iter().filter(|s| s.name != LEAK) {
            let h = site_heap(&run.samples_in(file), &site.name);
            assert!(
                (h.inuse_space as f64) <= FREED_INUSE_MAX * site.bytes as f64,
                "{}: {} of its {} bytes in use at the end of {}, though it frees everything (allowed {FREED_INUSE_MAX} of it){}",
                site.name,
                h.inuse_space,
                site.bytes,
                file.name(),
                run.diag()
            );
        }
    }
}

/// `--pid` of a running process that holds its leak: the window that ends
/// while the leak is live shows it in use, within TOLERANCE, and nothing
/// in use for the freed sites; once the leak is freed, the last window
/// shows nothing in use at all.
#[test]
fn inuse_of_a_live_leak_under_pid() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::HeapSites.build(tmp.path(), "heap_sites_hold");
    let out = tmp.path().join("out");
    let mut workload = start_ready(&exe, &["--wait-stdin", "--hold"]);
    let pid = workload.pid();
    let mut daemon = heap_daemon_for(&[pid], RATE, "2s", &out);
    workload.poke();
    let holding = workload.wait_line(WORKLOAD_TIMEOUT, |l| l.starts_with("holding "));
    let hold_ns = field(&parse_report(&holding, "realtime_ns"), "realtime_ns") as i64;
    let live_name = wait_for_window_end(
        &out,
        hold_ns + SETTLE.as_nanos() as i64,
        &daemon,
        Duration::from_secs(20),
    );
    let released_ns = realtime_ns();
    workload.release();
    let stdout = workload.finish(Duration::from_secs(20));
    // Reaped, as its parent would do; the daemon then sees its target gone,
    // writes the last window and exits 0.
    workload.kill();
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);
    let run = HeapRun::read(&out, RATE, &stdout, daemon);
    assert_eq!(run.pid, pid, "the workload's report names another pid");
    assert_labels(&run, &exe);
    assert_alloc_per_site(&run, &run.samples, false);

    let live = file_named(&run.files, &live_name);
    println!(
        "leak live from {hold_ns}; window {live_name} ends {}",
        window_end(live)
    );
    assert_inuse(&run, live, true, false, "the leak is live");

    let last = run.files.last().expect("files were read");
    assert!(
        window_end(last) > released_ns,
        "the last window {} ends at {}, before the leak was released at {released_ns}{}",
        last.name(),
        window_end(last),
        run.diag()
    );
    assert_inuse(
        &run,
        last,
        false,
        false,
        "the leak was freed, then the process exited",
    );
    let leak = run.site(LEAK);
    assert!(
        stdout.contains(&format!("freed={}", leak.live)),
        "the workload did not free its {} leaked objects:\n{stdout}",
        leak.live
    );
}

/// --heap-sample-bytes 1 records every allocation: per site, the
/// allocations are the true numbers and bytes exactly (up to rounding), the
/// live leak exactly its objects, and freed sites nothing in use.
#[test]
fn rate_one_records_every_allocation() {
    rate_one_records_every_allocation_with(Probes::Best);
}

/// The same on the probes of kernels before 6.13: the return probe of
/// every call must find its own entry (nested and tail calls included).
#[test]
fn rate_one_records_every_allocation_on_perf_event_uprobes() {
    rate_one_records_every_allocation_with(Probes::PerfEvent);
}

fn rate_one_records_every_allocation_with(probes: Probes) {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::HeapSites.build(tmp.path(), "heap_sites_all");
    let out = tmp.path().join("out");
    // A fiftieth of the calls: every one of them is an event.
    let mut workload = start_ready(&exe, &["--wait-stdin", "--hold", "--scale", "0.02"]);
    let pid = workload.pid();
    let mut daemon = heap_daemon_with(probes, &[pid], 1, "2s", &out);
    workload.poke();
    let holding = workload.wait_line(WORKLOAD_TIMEOUT, |l| l.starts_with("holding "));
    let hold_ns = field(&parse_report(&holding, "realtime_ns"), "realtime_ns") as i64;
    let live_name = wait_for_window_end(
        &out,
        hold_ns + SETTLE.as_nanos() as i64,
        &daemon,
        Duration::from_secs(15),
    );
    workload.release();
    let stdout = workload.finish(Duration::from_secs(20));
    workload.kill();
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);
    let run = HeapRun::read(&out, 1, &stdout, daemon);
    probes.assert_used(&run.daemon);
    assert_eq!(run.pid, pid, "the workload's report names another pid");

    assert_alloc_per_site(&run, &run.samples, true);
    assert_inuse(
        &run,
        file_named(&run.files, &live_name),
        true,
        true,
        "the leak is live",
    );
    let last = run.files.last().expect("files were read");
    assert_inuse(&run, last, false, true, "everything was freed");
}

/// A process that exits in the middle of a window while the daemon goes on
/// (it also profiles an idle second process): the window it exited in is
/// written after it is gone, still holds its allocations, symbolized, and
/// the daemon carries on and exits 0 at the end.
#[test]
fn process_exiting_mid_window() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::HeapSites.build(tmp.path(), "heap_sites_exit");
    let out = tmp.path().join("out");
    // A shorter life, inside a 5 s window; still over a thousand expected
    // samples at most sites.
    let mut short = start_ready(&exe, &["--wait-stdin", "--scale", "0.6"]);
    let mut idle = start_ready(&exe, &["--wait-stdin", "--scale", "0"]);
    let (pid, idle_pid) = (short.pid(), idle.pid());
    let mut daemon = heap_daemon_for(&[pid, idle_pid], RATE, "5s", &out);
    short.release();
    let stdout = short.finish(WORKLOAD_TIMEOUT);
    let exited_ns = realtime_ns();
    short.kill();
    let work = parse_report(&stdout, "start_ns");
    let end_ns = field(&work, "end_ns") as i64;
    // The window the process exited in is written after it is gone.
    wait_for_window_end(&out, exited_ns, &daemon, Duration::from_secs(20));
    assert!(
        process_alive(daemon.pid()),
        "profilerd is gone after its target {pid} exited while {idle_pid} lives\n{}",
        daemon.describe()
    );
    idle.release();
    idle.finish(Duration::from_secs(20));
    idle.kill();
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);
    let run = HeapRun::read(&out, RATE, &stdout, daemon);
    assert_eq!(run.pid, pid, "the workload's report names another pid");

    let strangers: Vec<u32> = flatten_all(&run.files)
        .iter()
        .map(FlatSample::pid)
        .filter(|p| *p != pid && *p != idle_pid)
        .collect();
    assert!(
        strangers.is_empty(),
        "samples of processes other than {pid} and {idle_pid}: {strangers:?}{}",
        run.diag()
    );
    assert_alloc_per_site(&run, &run.samples, false);

    // The window in which its last allocations were made: the one it
    // exited in, unless that one began less than 300 ms before the end of
    // the work (and after its start), then the one before.
    let anchor = (end_ns - 300_000_000).max(field(&work, "start_ns") as i64);
    let window = run
        .files
        .iter()
        .find(|f| covers(f, end_ns) && f.profile.time_nanos <= anchor)
        .or_else(|| run.files.iter().find(|f| covers(f, anchor)))
        .unwrap_or_else(|| {
            panic!(
                "no window covers the last allocations of pid {pid} (work {work:?}); windows: {:?}{}",
                run.files
                    .iter()
                    .map(|f| (f.name(), f.profile.time_nanos, window_end(f)))
                    .collect::<Vec<_>>(),
                run.diag()
            )
        });
    let in_window = run.samples_in(window);
    let at_sites = heap_of(in_window.iter().filter(|s| in_some_site(s)));
    println!(
        "work ended {end_ns}, process reaped by {exited_ns}; window {} [{}, {}) holds {} samples of it, {} at its sites",
        window.name(),
        window.profile.time_nanos,
        window_end(window),
        in_window.len(),
        at_sites.samples
    );
    assert!(
        at_sites.samples > 0 && at_sites.alloc_objects > 0,
        "window {} (in which pid {pid} made its last allocations and exited) has no allocations of it at its sites ({} samples of it in all){}",
        window.name(),
        in_window.len(),
        run.diag()
    );
}

/// The same program on jemalloc: jemalloc's malloc, calloc, realloc, ...
/// are probed, and the estimates per site are as good.
#[test]
fn jemalloc_alloc_per_site() {
    require_root();
    assert!(
        Path::new(JEMALLOC_LIB).exists(),
        "{JEMALLOC_LIB} is absent: `cargo xtask test` installs it (Debian's libjemalloc-dev)"
    );
    let tmp = temp_dir();
    let exe = Workload::HeapSitesJemalloc.build(tmp.path(), "heap_sites_je");
    let out = tmp.path().join("out");
    let mut workload = start_ready(&exe, &["--wait-stdin"]);
    let pid = workload.pid();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    assert!(
        maps.contains("libjemalloc"),
        "the jemalloc build of the workload has no libjemalloc mapped:\n{maps}"
    );
    let mut daemon = heap_daemon_for(&[pid], RATE, "60s", &out);
    workload.release();
    let stdout = workload.finish(WORKLOAD_TIMEOUT);
    workload.kill();
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);
    let run = HeapRun::read(&out, RATE, &stdout, daemon);
    assert_eq!(run.pid, pid, "the workload's report names another pid");
    assert_labels(&run, &exe);
    assert_alloc_per_site(&run, &run.samples, false);
    assert_site_stacks(&run);
    // Everything but the leak was freed before the process exited.
    let last = run.files.last().expect("files were read");
    for site in run.sites.iter().filter(|s| s.name != LEAK) {
        let h = site_heap(&run.samples_in(last), &site.name);
        assert!(
            (h.inuse_space as f64) <= FREED_INUSE_MAX * site.bytes as f64,
            "{}: {} of its {} bytes in use at the end, though it frees everything{}",
            site.name,
            h.inuse_space,
            site.bytes,
            run.diag()
        );
    }
}

/// heaptrack, an allocator interposer (LD_PRELOAD) whose malloc, calloc,
/// realloc, ... record each call and call libc's: both files are probed,
/// and each allocation is counted once, at the outer call (before, 1.75
/// times the bytes and twice the allocations). Checked per site against
/// the workload's own count, and in all against heaptrack's own.
#[test]
fn allocator_wrapper_counted_once() {
    require_root();
    let heaptrack = Path::new(HEAPTRACK);
    assert!(
        heaptrack.exists(),
        "{HEAPTRACK} is absent: `cargo xtask test` installs it (Debian's heaptrack)"
    );
    let tmp = temp_dir();
    let exe = Workload::HeapSites.build(tmp.path(), "heap_sites_wrapped");
    let out = tmp.path().join("out");
    let trace = tmp.path().join("trace");
    let mut args = heap_args(RATE, "60s", &out);
    args.push("--".to_string());
    for arg in [
        HEAPTRACK,
        "-o",
        trace.to_str().expect("temporary paths are UTF-8"),
        exe.to_str().expect("temporary paths are UTF-8"),
        // Every call traps twice (heaptrack's function and libc's): half
        // the calls, some 10 s, and still 700 expected samples a site.
        "--scale",
        "0.5",
    ] {
        args.push(arg.to_string());
    }
    let mut daemon = Probes::Best.start(&args);
    daemon.wait_success(WORKLOAD_TIMEOUT);
    let stdout = daemon.stdout_text();
    let run = HeapRun::read(&out, RATE, &stdout, daemon);
    let nested = run.daemon.summary_field("heap_nested_calls");
    let processes = run.daemon.summary_field("allocator_caller_processes");
    println!(
        "calls made by another allocator, not counted again: {nested} in {processes} processes"
    );
    assert!(
        nested > 0 && processes >= 1,
        "no allocator call was told nested{}",
        run.diag()
    );
    assert_alloc_per_site(&run, &run.samples, false);
    assert_site_stacks(&run);
    // Fewer samples a site than assert_alloc_per_site holds to its bound;
    // counted twice would read 2.
    for site in &run.sites {
        let r = ratio(site_heap(&run.samples, &site.name).alloc_space, site.bytes);
        assert!(
            (r - 1.0).abs() <= WRAPPED_TOLERANCE,
            "{}: alloc_space {r:.3} of the truth (allowed ±{WRAPPED_TOLERANCE}){}",
            site.name,
            run.diag()
        );
    }

    // heaptrack's own count of the same run's allocation calls.
    let print = std::process::Command::new("heaptrack_print")
        .arg("-f")
        .arg(tmp.path().join("trace.zst"))
        .output()
        .expect("run heaptrack_print");
    let text = String::from_utf8_lossy(&print.stdout);
    let calls: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("calls to allocation functions: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("heaptrack_print gave no call count:\n{text}"));
    let ours = heap_of(&run.samples).alloc_objects;
    let r = ours as f64 / calls as f64;
    println!("allocations: profilerd {ours}, heaptrack {calls} (ratio {r:.3})");
    assert!(
        (r - 1.0).abs() <= 0.15,
        "profilerd counted {ours} allocations, heaptrack {calls} (ratio {r:.3}, allowed ±0.15){}",
        run.diag()
    );
}

/// System-wide: the allocator is probed by file for every process, so a
/// program started after the daemon is profiled from its first allocation
/// without being named.
#[test]
fn system_wide_covers_a_process_started_later() {
    system_wide_covers_a_process_started_later_with(Probes::Best);
}

/// The same with perf-event uprobes of no process (every process that
/// maps the allocator, on one CPU's event).
#[test]
fn system_wide_covers_a_process_started_later_on_perf_event_uprobes() {
    system_wide_covers_a_process_started_later_with(Probes::PerfEvent);
}

fn system_wide_covers_a_process_started_later_with(probes: Probes) {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::HeapSites.build(tmp.path(), "heap_sites_sw");
    let out = tmp.path().join("out");
    let mut args = heap_args(RATE, "60s", &out);
    args.extend(["--duration".to_string(), "60s".to_string()]);
    let mut daemon = probes.start(&args);
    // No --wait-stdin: it allocates from its first instruction on.
    let mut workload = Running::start::<&str>(&exe, &[]);
    let stdout = workload.finish(WORKLOAD_TIMEOUT);
    daemon.signal(libc::SIGINT);
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);
    let run = HeapRun::read(&out, RATE, &stdout, daemon);
    probes.assert_used(&run.daemon);
    assert_alloc_per_site(&run, &run.samples, false);
}
