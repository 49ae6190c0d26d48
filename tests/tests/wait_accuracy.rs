//! Block and off-CPU profiles against a workload that times its own waits,
//! in the cases that tempt the stack optimizations to be wrong
//! (`wait_sites.c`): three wait sites whose waits start from the same
//! registers (the same ip, sp and bp: only a return address in the stack
//! tells them apart), several threads at the same sites, sites that
//! change from one window to the next, one-second windows, rates at which
//! most waits are sampled and at which every wait is kept, a walk memo far
//! smaller than the walks in play, and every optimization turned off.
//!
//! Per site, both profiles must read the delay and the number of waits
//! the workload measured within ±10% (the delay's lower bound less the
//! longest wait's excess over its nominal length: a stall outside the
//! system call), less than 0.5% of the delay may sit
//! on a stack that is cut (`[truncated]`) or never reaches the thread's
//! root, and no record may reach the daemon for a walk it can no longer
//! answer (`unwinds_matched_but_forgotten`). Each run's sample counts are
//! sized so that ±10% is at least 3.5 standard deviations of the sampling.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::profiles::{FlatSample, WaitKind, flatten_all, read_profiles};
use profiler_tests::workloads::{Running, SiteLine, Workload, parse_site_lines};
use profiler_tests::{check_offcpu_files, check_wait_files, temp_dir};

/// The workload's sites, in the order it reports them.
const SITES: [&str; 3] = ["wait_a", "wait_b", "wait_c"];
/// |estimate / truth - 1| bound per site, delay and contentions.
const TOLERANCE: f64 = 0.10;
/// Largest share of a profile's delay on stacks cut or short of the root.
const CUT_SHARE: f64 = 0.005;
/// A stack reaches its thread's root when it holds one of these.
const ROOTS: [&str; 2] = ["main", "start_thread"];
const TRUNCATED: &str = "[truncated]";
/// Bound on a workload's run under the daemon.
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(60);
const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Every optimization on, with a wait ring small enough (4 MiB) that
/// records wrap past its end many times in a run.
const ALL_ON: &str = "[limits]\nwait_events_bytes = 4194304\n";

/// Every optimization off: no memo (so no walk hints), no brief or short
/// records, no stack tops, the rings' data pages mapped twice; the same
/// small wait ring.
const ALL_OFF: &str = "[limits]\nwait_events_bytes = 4194304\nwalk_memo_entries = 0\n\n[debug]\nwalk_hints = false\nbrief_records = false\nshort_records = false\nstack_tops = false\nrings_mapped_once = false\nrelease_file_pages = false\n";

/// One profiled run of wait_sites.
struct Setup {
    /// `--block-rate`.
    rate: &'static str,
    threads: u32,
    rounds: u32,
    /// 0: every round visits every site.
    phase_ms: u32,
    /// Frames of `descend` added between each thread's root and its waits.
    depth: u32,
    /// Config file text (`[limits]`, `[debug]`), if any.
    config: &'static str,
}

struct Run {
    sites: Vec<SiteLine>,
    block: Vec<FlatSample>,
    offcpu: Vec<FlatSample>,
    windows: usize,
    stdout: String,
    daemon: Daemon,
}

/// Runs wait_sites under `profilerd --pid` with block and off-CPU
/// profiles in one-second windows, from its first wait to its exit.
fn profile(setup: &Setup) -> Run {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::WaitSites.build(tmp.path(), "wait_sites");
    let out = tmp.path().join("out");
    let mut workload = Running::start(
        &exe,
        &[
            "--wait-stdin".to_string(),
            "--rounds".to_string(),
            setup.rounds.to_string(),
            "--threads".to_string(),
            setup.threads.to_string(),
            "--phase-ms".to_string(),
            setup.phase_ms.to_string(),
            "--depth".to_string(),
            setup.depth.to_string(),
        ],
    );
    workload.wait_line(Duration::from_secs(10), |l| l.starts_with("ready "));
    let pid = workload.pid();
    let mut args: Vec<String> = [
        "--profiles",
        "block,offcpu",
        "--block-rate",
        setup.rate,
        "--interval",
        "1s",
        "--output-dir",
        out.to_str().expect("temporary paths are UTF-8"),
        "--pid",
        &pid.to_string(),
    ]
    .map(str::to_string)
    .to_vec();
    if !setup.config.is_empty() {
        let path = tmp.path().join("profilerd.toml");
        std::fs::write(&path, setup.config).expect("writing the config file");
        args.extend(["--config".to_string(), path.display().to_string()]);
    }
    let mut daemon = Daemon::start(&args);
    daemon.wait_ready();
    workload.release();
    let stdout = workload.finish(WORKLOAD_TIMEOUT);
    workload.kill();
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);

    let block_files = read_profiles(&out, "block");
    let offcpu_files = read_profiles(&out, "offcpu");
    assert!(
        !block_files.is_empty() && !offcpu_files.is_empty(),
        "no block or off-CPU profile in {}\n{}",
        out.display(),
        daemon.describe()
    );
    check_wait_files(&block_files, WaitKind::Block);
    check_offcpu_files(&offcpu_files);
    let of_target = |samples: Vec<FlatSample>| -> Vec<FlatSample> {
        samples.into_iter().filter(|s| s.pid() == pid).collect()
    };
    Run {
        sites: parse_site_lines(&stdout, &SITES),
        block: of_target(flatten_all(&block_files)),
        offcpu: of_target(flatten_all(&offcpu_files)),
        windows: block_files.len(),
        stdout,
        daemon,
    }
}

/// (contentions, delay) of the samples whose stack holds `site`.
fn at_site(samples: &[FlatSample], site: &str) -> (i64, i64) {
    samples
        .iter()
        .filter(|s| s.has_function(site))
        .fold((0, 0), |(c, d), s| (c + s.values[0], d + s.values[1]))
}

fn ratio(measured: i64, truth: u64) -> f64 {
    measured as f64 / truth.max(1) as f64
}

/// Whether a stack is whole: it reaches its thread's root and is not cut.
fn whole(s: &FlatSample) -> bool {
    ROOTS.iter().any(|r| s.has_function(r)) && !s.has_function(TRUNCATED)
}

/// The share of the delay on stacks that are not whole, with an example.
fn cut_share(samples: &[FlatSample]) -> (f64, String) {
    let total: i64 = samples.iter().map(|s| s.values[1]).sum();
    let cut: i64 = samples
        .iter()
        .filter(|s| !whole(s))
        .map(|s| s.values[1])
        .sum();
    let example = samples
        .iter()
        .find(|s| !whole(s))
        .map(FlatSample::stack_text)
        .unwrap_or_default();
    (cut as f64 / total.max(1) as f64, example)
}

impl Run {
    /// Per site and profile: contentions and delay against the truth.
    fn table(&self) -> String {
        let mut out = format!(
            "{:<8} {:>6} {:>10} | {:>14} {:>14} | {:>14} {:>14}\n",
            "site",
            "waits",
            "blocked",
            "block cont.",
            "block delay",
            "offcpu events",
            "offcpu delay"
        );
        for site in &self.sites {
            let (bc, bd) = at_site(&self.block, &site.name);
            let (oc, od) = at_site(&self.offcpu, &site.name);
            let _ = writeln!(
                out,
                "{:<8} {:>6} {:>8.1}ms | {:>7} {:>6.3} {:>7.1}ms {:>4.3} | {:>7} {:>6.3} {:>7.1}ms {:>4.3}",
                site.name,
                site.waits,
                site.total_ns as f64 / 1e6,
                bc,
                ratio(bc, site.waits),
                bd as f64 / 1e6,
                ratio(bd, site.total_ns),
                oc,
                ratio(oc, site.waits),
                od as f64 / 1e6,
                ratio(od, site.offcpu_ns()),
            );
        }
        for (what, samples) in [("block", &self.block), ("offcpu", &self.offcpu)] {
            let (share, _) = cut_share(samples);
            let _ = writeln!(
                out,
                "{what}: {share:.4} of the delay on stacks cut or short of the root"
            );
        }
        out
    }

    fn counter(&self, name: &str) -> u64 {
        self.daemon.summary_field(name)
    }

    fn diag(&self) -> String {
        let mut stacks = String::new();
        for (what, samples) in [("block", &self.block), ("offcpu", &self.offcpu)] {
            let _ = writeln!(stacks, "{what}: {} samples; cut or short:", samples.len());
            for s in samples.iter().filter(|s| !whole(s)).take(5) {
                let _ = writeln!(stacks, "  [{}] {}", s.values[1], s.stack_text());
            }
        }
        format!(
            "\n{} windows\n{stacks}--- workload stdout ---\n{}\n{}",
            self.windows,
            self.stdout,
            self.daemon.describe()
        )
    }

    /// Every check of the module docs; panics with all failures.
    fn check(&self, what: &str) {
        let table = self.table();
        println!("{what}:\n{table}");
        let mut failures = Vec::new();
        for site in &self.sites {
            // Block delay is the time in the system call; off-CPU delay
            // the part of it spent off CPU (the rest, entering, leaving and
            // the probes, is small on hardware and is not under emulation).
            for (profile, samples, delay_truth) in [
                ("block", &self.block, site.total_ns),
                ("offcpu", &self.offcpu, site.offcpu_ns()),
            ] {
                let (contentions, delay) = at_site(samples, &site.name);
                // The workload times each wait around its system call: a
                // stall between its clock read and the call (an emulated
                // CPU held up for 40 ms, once in CI) is in its total and in
                // no profile. The longest wait's excess over its nominal
                // length is forgiven below the truth; a systematic loss
                // is not.
                let stall = site.max_ns.saturating_sub(site.wait_ns);
                for (value, truth, name, forgiven) in [
                    (delay, delay_truth, "delay", stall),
                    (contentions, site.waits, "contentions", 0),
                ] {
                    let low = truth.saturating_sub(forgiven) as f64 * (1.0 - TOLERANCE);
                    let high = truth as f64 * (1.0 + TOLERANCE);
                    if !(low..=high).contains(&(value as f64)) {
                        failures.push(format!(
                            "{profile} {}: {name} {value} against {truth} measured (ratio {:.3}, allowed ±{TOLERANCE}, less {forgiven} ns of the longest wait's stall)",
                            site.name,
                            ratio(value, truth)
                        ));
                    }
                }
            }
        }
        for (profile, samples) in [("block", &self.block), ("offcpu", &self.offcpu)] {
            let (share, example) = cut_share(samples);
            if share >= CUT_SHARE {
                failures.push(format!(
                    "{profile}: {share:.4} of the delay on stacks cut or short of the root (allowed < {CUT_SHARE}), e.g. {example}"
                ));
            }
        }
        let lost = self.counter("wait_events_lost");
        if lost != 0 {
            failures.push(format!("{lost} wait records lost to a full ring"));
        }
        let forgotten = self.counter("unwinds_matched_but_forgotten");
        if forgotten != 0 {
            failures.push(format!(
                "{forgotten} records matched walks whose frames the daemon could not read"
            ));
        }
        assert!(
            failures.is_empty(),
            "{what}:\n  {}\n{table}{}",
            failures.join("\n  "),
            self.diag()
        );
    }
}

/// Go's bias example with waits of 1, 2 and 3 ms at a rate of 2.5 ms
/// (about 40% and 80% of the shorter waits kept), two threads at the same
/// sites, and sites that come and go between one-second windows. The
/// sites' waits start from the same registers, so the kernel's walk hint
/// for them keeps changing hands: records it matched must keep their own
/// site's stack whatever hint the daemon holds when it reads them.
#[test]
fn sites_sharing_registers_keep_their_stacks_across_windows() {
    let run = profile(&Setup {
        rate: "2500us",
        threads: 2,
        rounds: 220,
        phase_ms: 700,
        depth: 0,
        config: "",
    });
    run.check("rate 2.5 ms, 2 threads, sites changing every 0.7 s");
    let matched = run.counter("unwinds_matched_in_kernel");
    assert!(
        matched > 0 && run.windows >= 3,
        "{matched} records matched a walk hint in the kernel over {} windows: the test must drive the brief records it is about{}",
        run.windows,
        run.diag()
    );
}

/// Every wait below the rate (4 ms): each is kept with probability d/rate
/// and counted as rate/d waits.
#[test]
fn waits_below_the_rate_are_rescaled_per_site() {
    profile(&Setup {
        rate: "4ms",
        threads: 4,
        rounds: 160,
        phase_ms: 0,
        depth: 0,
        config: "",
    })
    .check("rate 4 ms, every wait below it, 4 threads");
}

/// Every wait at or above the rate (0.5 ms): each is kept, as itself.
#[test]
fn waits_above_the_rate_are_all_kept() {
    profile(&Setup {
        rate: "500us",
        threads: 1,
        rounds: 60,
        phase_ms: 0,
        depth: 0,
        config: "",
    })
    .check("rate 0.5 ms, every wait above it");
}

/// A walk memo of 1 walk per generation, fewer than the walks in play
/// (the sites of a thread share one start, and there are 2 threads):
/// walks are forgotten and their hints taken back all the time, while
/// records the kernel matched against them are still in the ring.
#[test]
fn a_memo_smaller_than_the_walks_in_play_loses_no_stack() {
    let run = profile(&Setup {
        rate: "2500us",
        threads: 2,
        rounds: 150,
        phase_ms: 0,
        depth: 0,
        config: "[limits]\nwalk_memo_entries = 1\n",
    });
    run.check("rate 2.5 ms, a memo of 1 walk");
    let (generations, matched) = (
        run.counter("walk_memo_generations"),
        run.counter("unwinds_matched_in_kernel"),
    );
    assert!(
        generations > 100 && matched > 0,
        "{generations} memo generations and {matched} records matched in the kernel: the test must drive both{}",
        run.diag()
    );
}

/// Brief records come in rooms for 8, 16 and 32 frames, each as long as
/// the walk it carries needs. Waits on two threads at the sites (a walk
/// of 7 frames: the 8-frame room), on the main thread 5 frames of
/// `descend` deeper (14: the 16-frame room), and 12 deeper (a walk that
/// reads more stack words than a hint holds: full records) must all
/// arrive whole, every `descend` frame in its place.
#[test]
fn brief_records_of_every_length_keep_their_frames() {
    for (threads, depth, brief_expected) in [(2, 0, true), (1, 5, true), (1, 12, false)] {
        let run = profile(&Setup {
            rate: "500us",
            threads,
            rounds: 40,
            phase_ms: 0,
            depth,
            config: "",
        });
        let what = format!("rate 0.5 ms, {threads} threads, waits {depth} frames deeper");
        run.check(&what);
        let brief = run.counter("brief_records");
        let descend = depth as usize + 1;
        let wrong: Vec<String> = [&run.block, &run.offcpu]
            .into_iter()
            .flatten()
            .filter(|s| SITES.iter().any(|site| s.has_function(site)))
            .filter(|s| s.frames.iter().filter(|f| f.function == "descend").count() != descend)
            .take(3)
            .map(FlatSample::stack_text)
            .collect();
        assert!(
            (brief > 0) == brief_expected && wrong.is_empty(),
            "{what}: {brief} brief records (expected some: {brief_expected}); stacks without {descend} descend frames: {wrong:#?}{}",
            run.diag()
        );
    }
}

/// The same workload with every optimization on and off: each run within
/// the bounds of the truth, and the two runs' per-site delays within
/// sampling noise of each other. Off, no record is brief, short or cut at
/// a learned top, and none wrapped (both copies of the ring's pages are
/// mapped); on, some did and were read whole.
#[test]
fn stack_optimizations_do_not_change_the_answer() {
    let setup = |config| Setup {
        rate: "2500us",
        threads: 2,
        rounds: 150,
        phase_ms: 0,
        depth: 0,
        config,
    };
    let on = profile(&setup(ALL_ON));
    on.check("every stack optimization on");
    let off = profile(&setup(ALL_OFF));
    off.check("every stack optimization off");
    let counters = |run: &Run| {
        [
            "unwinds_matched_in_kernel",
            "brief_records",
            "records_short_form",
            "stack_tops_sent",
            "ring_records_wrapped",
        ]
        .map(|c| run.counter(c))
    };
    let (with, without) = (counters(&on), counters(&off));
    assert!(
        with[0] > 0 && with[1] > 0 && with[4] > 0 && without == [0; 5],
        "matched, brief, short records, stack tops sent and ring records wrapped: {with:?} on, {without:?} off (expected some matched, brief and wrapped on, none of any off){}",
        off.diag()
    );
    // Both runs measured the same waits in their own run; compare their
    // per-site ratios to the truth. Each is within 3.5 sd of 1 by the
    // module's sizing, so their difference is within 5 sd (√2 · 3.5).
    let mut table = String::new();
    let mut failures = Vec::new();
    for (a, b) in on.sites.iter().zip(&off.sites) {
        for (profile, on_samples, off_samples, truth_on, truth_off) in [
            ("block", &on.block, &off.block, a.total_ns, b.total_ns),
            (
                "offcpu",
                &on.offcpu,
                &off.offcpu,
                a.offcpu_ns(),
                b.offcpu_ns(),
            ),
        ] {
            let r_on = ratio(at_site(on_samples, &a.name).1, truth_on);
            let r_off = ratio(at_site(off_samples, &b.name).1, truth_off);
            let _ = writeln!(
                table,
                "{profile} {}: delay/truth {r_on:.3} on, {r_off:.3} off",
                a.name
            );
            if (r_on - r_off).abs() > TOLERANCE * std::f64::consts::SQRT_2 {
                failures.push(format!(
                    "{profile} {}: {r_on:.3} on against {r_off:.3} off",
                    a.name
                ));
            }
        }
    }
    println!("{table}");
    assert!(
        failures.is_empty(),
        "the optimizations changed the answer:\n  {}\n{table}",
        failures.join("\n  ")
    );
}

/// The daemon's config file must name only what it knows: a typo in a
/// switch stops the start with one line naming it.
#[test]
fn unknown_debug_keys_are_refused() {
    require_root();
    let tmp = temp_dir();
    let path = tmp.path().join("bad.toml");
    std::fs::write(&path, "[debug]\nbrief_record = false\n").expect("writing the config");
    let out = std::process::Command::new(profiler_tests::daemon::profilerd_bin())
        .args([
            "--config",
            path.to_str().expect("UTF-8 path"),
            "--duration",
            "1s",
        ])
        .arg("--output-dir")
        .arg(Path::new(tmp.path()).join("out"))
        .output()
        .expect("running profilerd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("brief_record") && stderr.lines().count() == 1,
        "status {}, stderr:\n{stderr}",
        out.status
    );
}
