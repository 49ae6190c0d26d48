//! The goroutine profile of Go programs read from outside: at each window,
//! the program's live goroutines by stack, wait reason and pprof labels,
//! held against the goroutine profile Go's runtime/pprof wrote of the same
//! moment (counts per site exact) and against Go's own goroutine dump
//! (`debug=2`: each goroutine's wait reason), on Go 1.19 and a current Go,
//! as built and stripped (`-s -w`: the goroutine list found from the
//! runtime's code).

use std::collections::{BTreeMap, BTreeSet};

use std::path::Path;
use std::time::{Duration, Instant};

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::http::get;
use profiler_tests::pprof_tool::{current_go_binary, fetch_with_pprof};
use profiler_tests::profiles::{FlatSample, flatten, flatten_file, read_profiles};
use profiler_tests::temp_dir;
use profiler_tests::workloads::{
    GoBuild, Running, WholeLife, Workload, field, go_builds, profile_whole_life,
};

/// The workload's parked goroutines: (site, count, wait reason on Go 1.19,
/// on current Go).
const SITES: [(&str, i64, &str, &str); 7] = [
    ("main.recvWait", 3, "chan receive", "chan receive"),
    ("main.sendWait", 2, "chan send", "chan send"),
    ("main.lockWait", 5, "semacquire", "sync.Mutex.Lock"),
    ("main.selectWait", 4, "select", "select"),
    ("main.condWait", 2, "sync.Cond.Wait", "sync.Cond.Wait"),
    ("main.groupWait", 3, "semacquire", "sync.WaitGroup.Wait"),
    ("main.sleeper", 6, "sleep", "sleep"),
];

/// The first `main.` function of a sample's stack (leaf first), but for
/// the main goroutine's (it writes Go's profile in one, sleeps in the
/// other): its site.
fn site(sample: &FlatSample) -> Option<&str> {
    if is_main(sample) {
        return None;
    }
    sample
        .frames
        .iter()
        .map(|f| f.function.as_str())
        .find(|name| name.starts_with("main."))
}

/// Per site, the stacks from the leaf to the site's function (inlined
/// frames included): Go's own end differently below it (Go leaves out
/// `runtime.goexit` and the wrappers of `go` statements).
fn site_stacks(samples: &[FlatSample]) -> BTreeMap<String, BTreeSet<Vec<String>>> {
    let mut stacks: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    for s in samples {
        let Some(name) = site(s) else {
            continue;
        };
        let to_site: Vec<String> = s
            .frames
            .iter()
            .map(|f| f.function.clone())
            .take_while(|f| f != name)
            .chain([name.to_string()])
            .collect();
        stacks.entry(name.to_string()).or_default().insert(to_site);
    }
    stacks
}

/// Goroutines per site.
fn per_site(samples: &[FlatSample]) -> BTreeMap<String, i64> {
    let mut sites = BTreeMap::new();
    for s in samples {
        let name = site(s).unwrap_or("<other>");
        *sites.entry(name.to_string()).or_default() += s.values[0];
    }
    sites
}

/// Go's own dump (`debug=2`): per site, the wait reasons of its
/// goroutines (`goroutine 7 [chan receive]:` then the stack, leaf first).
fn dump_reasons(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut reasons: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for block in text.split("\n\n") {
        let Some(header) = block.lines().next() else {
            continue;
        };
        let Some(reason) = header
            .split_once('[')
            .and_then(|(_, rest)| rest.split([',', ']']).next())
        else {
            continue;
        };
        let site = block
            .lines()
            .skip(1)
            .step_by(2)
            .filter_map(|line| line.split('(').next())
            .find(|name| name.starts_with("main."));
        if let Some(site) = site
            && !block.contains("main.main(")
        {
            reasons
                .entry(site.to_string())
                .or_default()
                .push(reason.to_string());
        }
    }
    reasons
}

#[test]
fn goroutines_agree_with_go_to_the_goroutine() {
    require_root();
    let tmp = temp_dir();
    for GoBuild {
        what: version,
        tag,
        go,
        workload,
    } in go_builds(Workload::GoGoroutines, Workload::GoGoroutinesStripped)
    {
        let exe = workload.build_with_go(tmp.path(), &format!("goroutines_{tag}"), &go);
        check_goroutines(&version, &tag, &exe, tmp.path());
    }
}

/// The same program built beforehand with the default Go (in the VMs, where
/// no Go toolchain is): its goroutines read on each kernel as Go counts
/// them, with its wait reasons, stacks and labels.
#[test]
fn goroutines_of_a_program_built_beforehand() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::GoGoroutines.build(tmp.path(), "goroutines_prebuilt");
    check_goroutines("prebuilt", "prebuilt", &exe, tmp.path());
}

/// Profiles `exe` (go_goroutines.go, labelled `version`, its files under
/// `tag` in `dir`) under `--profiles goroutine` and holds each of two
/// windows against runtime/pprof's own goroutine profile and dump of the
/// same moment.
fn check_goroutines(version: &str, tag: &str, exe: &Path, dir: &Path) {
    let own = dir.join(format!("own-{tag}.pprof"));
    let out = dir.join(format!("out-{tag}"));
    let WholeLife {
        pid,
        report,
        daemon,
    } = profile_whole_life(
        exe,
        &["5", own.to_str().expect("UTF-8 path")],
        &out,
        99,
        &["--profiles", "goroutine"],
    );
    let theirs = flatten_file(&own);
    let dump = std::fs::read_to_string(own.with_extension("pprof.txt")).expect("Go's dump");
    let go_sites = per_site(&theirs);
    let go_reasons = dump_reasons(&dump);
    let diag = format!("\n{}", daemon.describe());
    // Go's profile of the moment its goroutines were parked.
    for &(site, count, _, _) in &SITES {
        assert_eq!(
            go_sites.get(site).copied(),
            Some(count),
            "{version}: runtime/pprof's own count at {site} ({go_sites:?})"
        );
    }
    let files = read_profiles(&out, "goroutine");
    let windows: Vec<Vec<FlatSample>> = files
        .iter()
        .map(|f| {
            flatten(&f.profile)
                .into_iter()
                .filter(|s| s.pid() == pid)
                .collect::<Vec<_>>()
        })
        .filter(|w| !w.is_empty())
        .collect();
    println!(
        "{version}: {} windows with the program's goroutines; runtime/pprof {go_sites:?}; NumGoroutine {}",
        windows.len(),
        field(&report, "goroutines")
    );
    // Parked from 0.3 s to 5.3 s after the daemon's start: the windows
    // that close at 2 s and 4 s see every one of them.
    assert!(
        windows.len() >= 2,
        "{version}: {} goroutine windows with pid {pid}, expected at least 2{diag}",
        windows.len()
    );
    for (i, window) in windows.iter().take(2).enumerate() {
        let ours = per_site(window);
        println!("{version}: window {i}: {ours:?}");
        let stacks: Vec<String> = window
            .iter()
            .map(|s| format!("{} x{} {:?}", s.stack_text(), s.values[0], s.labels))
            .collect();
        let stacks = stacks.join("\n  ");
        for &(site, count, reason_19, reason_now) in &SITES {
            assert_eq!(
                ours.get(site).copied(),
                Some(count),
                "{version}: window {i}: goroutines at {site}, against runtime/pprof's {count}:\n  {stacks}{diag}"
            );
            // Each with Go's own wait reason, as its dump gives it.
            let want = if field(&report, "go_minor") == 19 {
                reason_19
            } else {
                reason_now
            };
            let dumped = &go_reasons[site];
            assert!(
                dumped.iter().all(|r| r == want),
                "{version}: Go's dump gives {site} the reasons {dumped:?}, expected {want}"
            );
            let reasons: Vec<&str> = window
                .iter()
                .filter(|s| site_is(s, site))
                .map(|s| s.label("wait_reason").unwrap_or("<none>"))
                .collect();
            assert!(
                reasons.iter().all(|&r| r == want),
                "{version}: window {i}: {site} has the wait reasons {reasons:?}, Go's dump {want}{diag}"
            );
        }
        // The same stacks as Go's, frame for frame (a stripped
        // binary's inlined frames from the pclntab's inline tree).
        let (ours_stacks, go_stacks) = (site_stacks(window), site_stacks(&theirs));
        for &(site, ..) in &SITES {
            assert_eq!(
                ours_stacks.get(site),
                go_stacks.get(site),
                "{version}: window {i}: the stacks of {site}, against runtime/pprof's"
            );
        }
        // Every goroutine but main's is at a site: the runtime's own
        // goroutines are left out, as Go leaves them out.
        let total: i64 = window.iter().map(|s| s.values[0]).sum();
        let main: i64 = window
            .iter()
            .filter(|s| is_main(s))
            .map(|s| s.values[0])
            .sum();
        let expected: i64 = SITES.iter().map(|s| s.1).sum();
        assert_eq!(
            (total, main),
            (expected + 1, 1),
            "{version}: window {i}: goroutines in all and in main.main:\n  {stacks}{diag}"
        );
        // The labels pprof.Do set, per goroutine.
        let mut shards: Vec<&str> = window
            .iter()
            .filter(|s| site_is(s, "main.recvWait"))
            .map(|s| {
                assert_eq!(s.label("role"), Some("receiver"), "{version}: {stacks}");
                s.label("shard").unwrap_or("<none>")
            })
            .collect();
        shards.sort();
        assert_eq!(shards, ["0", "1", "2"], "{version}: the shard labels");
        assert!(
            window
                .iter()
                .filter(|s| !site_is(s, "main.recvWait"))
                .all(|s| s.label("role").is_none()),
            "{version}: labels on goroutines that have none:\n  {stacks}"
        );
        // Every stack reaches runtime.goexit (or runtime.main), as Go's
        // do.
        assert!(
            window.iter().all(|s| !s.has_function("[truncated]")),
            "{version}: truncated goroutine stacks:\n  {stacks}"
        );
    }
    assert!(
        daemon.summary_field("goroutines_read")
            >= 2 * (SITES.iter().map(|s| s.1).sum::<i64>() as u64 + 1),
        "{version}: goroutines read{diag}"
    );
}

/// `/debug/pprof/goroutine?pid=P` (`go tool pprof` fetching it) from a
/// daemon that does not collect goroutine profiles: the goroutines of a
/// stripped current-Go program, per site exactly as runtime/pprof counted
/// them the same moment; a process that is not Go gets a one-line 400.
#[test]
fn goroutines_on_demand_agree_with_runtime_pprof() {
    require_root();
    let tmp = temp_dir();
    let go = current_go_binary();
    let exe = Workload::GoGoroutinesStripped.build_with_go(tmp.path(), "goroutines_demand", &go);
    let own = tmp.path().join("own.pprof");
    let out = tmp.path().join("out");
    let mut daemon = Daemon::start(&[
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
        "--profiles",
        "cpu",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    daemon.wait_ready();
    let addr = daemon.metrics_addr();
    let mut program = Running::start(
        &exe,
        &["4", own.to_str().expect("UTF-8 path"), "--wait-stdin"],
    );
    let pid = program.pid();
    program.release();
    // Its goroutines are parked once it has written Go's own profile
    // (then its dump), and stay so for its 4 s.
    let dump = own.with_extension("pprof.txt");
    let by = Instant::now() + Duration::from_secs(20);
    while !dump.exists() {
        assert!(
            Instant::now() < by,
            "the program wrote no profile of its own"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ours = flatten(&fetch_with_pprof(
        &format!("http://{addr}/debug/pprof/goroutine?pid={pid}"),
        tmp.path(),
    ));
    let theirs = flatten_file(&own);
    let (status, _, body) = get(
        addr,
        &format!("/debug/pprof/goroutine?pid={}", std::process::id()),
    );
    let report = program.finish(Duration::from_secs(30));
    let (ours, theirs) = (per_site(&ours), per_site(&theirs));
    println!("goroutines on demand: {ours:?}; runtime/pprof {theirs:?}; {report}");
    for &(site, count, _, _) in &SITES {
        assert_eq!(
            (ours.get(site).copied(), theirs.get(site).copied()),
            (Some(count), Some(count)),
            "goroutines at {site} on demand, and runtime/pprof's\n{}",
            daemon.describe()
        );
    }
    assert_eq!(status, 400, "a process that is not Go: {body}");
    assert_eq!(body.trim_end().lines().count(), 1, "{body}");
    daemon.signal(libc::SIGINT);
    daemon.wait_success(Duration::from_secs(20));
}

/// Whether it is the main goroutine's sample (`main.main` itself, not a
/// function literal of it).
fn is_main(sample: &FlatSample) -> bool {
    sample.frames.iter().any(|f| f.function == "main.main")
}

fn site_is(sample: &FlatSample, want: &str) -> bool {
    site(sample) == Some(want)
}
