//! `cargo xtask bench --waits`: what the block, mutex and off-CPU profiles
//! cost a program that waits on futexes, against empty bpftrace programs on
//! the same tracepoints, and what the daemon costs under 100k futex calls a
//! second.
//!
//! A C program (xtask/bench/waits.c) has two threads hand a token back and
//! forth through a futex word, both pinned to one CPU under SCHED_BATCH, so
//! that each round trip is two waits that really sleep, two wakes that wake
//! them and two voluntary context switches. Batches of fixed length are
//! timed under each setup; the setups alternate over several rounds, in
//! rotating order, a fresh process each time:
//! - nothing attached (also with the threads free to run on any CPU, to
//!   show why they are pinned);
//! - bpftrace's empty programs on sys_enter_futex and sys_exit_futex, on
//!   sched_switch, and on all three, each filtered to the benchmark by a
//!   `/pid == N/` predicate (like profilerd's in-kernel filter, it runs on
//!   every event of the system): the floors;
//! - profilerd --profiles block,mutex, offcpu, and block,mutex,offcpu, at
//!   the default rates;
//! - the same ping-pong through a pthread condition variable, bare and
//!   under profilerd --profiles block,mutex (which then also runs its
//!   probe at pthread_cond_wait's entry).
//!
//! With `--baseline BIN`, every profilerd setup also runs with that binary
//! (an earlier build) in the same rounds, and the report compares the two
//! (see the `baseline` module).
//!
//! Timed rounds run with kernel.bpf_stats_enabled off, as its clock reads
//! add to every program run; one more round with it on gives the BPF run
//! counts and times. Then the daemon's CPU and memory are measured while
//! the program makes a steady 100k futex calls a second.

use std::ffi::CStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench::harness::{
    Bench, Daemon, bpf_program_lines, median, message, set_bpf_stats, spread,
};
use crate::bench::harness::{Reaped, status_field, task_cpu_ns};

mod baseline;
mod report;
mod tracers;

use baseline::{Build, Case, Daemons, RateRun};
use report::report;
use tracers::*;

const SOURCE: &str = include_str!("../../bench/waits.c");
/// Timed rounds; each runs every setup once.
const ROUNDS: usize = 7;
/// Timed batches per process, and their length.
const REPS: usize = 4;
const BATCH_MS: u64 = 250;
/// The load under which the daemon's CPU is measured, and with which
/// profiles.
const RATE_CALLS: u64 = 100_000;
const RATE_PROFILES: [&str; 2] = ["block,mutex", "block,mutex,offcpu"];
const RATE_SECS: u64 = 10;
/// profilerd's default --interval: window builds are amortized over it.
const DEFAULT_INTERVAL_S: f64 = 60.0;
/// Targets from the issue.
const TARGET_PAIR_NS: f64 = 1500.0;
const TARGET_DAEMON_SHARE: f64 = 1.0;
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
const OUTPUT_TIMEOUT: Duration = Duration::from_secs(120);

const FUTEX_TPS: [&str; 2] = ["syscalls:sys_enter_futex", "syscalls:sys_exit_futex"];
const SWITCH_TPS: [&str; 1] = ["sched:sched_switch"];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Bare,
    BareFree,
    TraceFutex,
    TraceSwitch,
    TraceBoth,
    BlockMutex,
    Offcpu,
    All,
    CondBare,
    CondBlockMutex,
}

const SETUPS: [Setup; 10] = [
    Setup::Bare,
    Setup::BareFree,
    Setup::TraceFutex,
    Setup::TraceSwitch,
    Setup::TraceBoth,
    Setup::BlockMutex,
    Setup::Offcpu,
    Setup::All,
    Setup::CondBare,
    Setup::CondBlockMutex,
];

impl Setup {
    fn label(self) -> &'static str {
        match self {
            Setup::Bare => "no profiler",
            Setup::BareFree => "no profiler, threads not pinned",
            Setup::TraceFutex => "bpftrace, empty: sys_enter_futex, sys_exit_futex",
            Setup::TraceSwitch => "bpftrace, empty: sched_switch",
            Setup::TraceBoth => "bpftrace, empty: sys_enter_futex, sys_exit_futex, sched_switch",
            Setup::BlockMutex => "profilerd --profiles block,mutex",
            Setup::Offcpu => "profilerd --profiles offcpu",
            Setup::All => "profilerd --profiles block,mutex,offcpu",
            Setup::CondBare => "no profiler, condition variable",
            Setup::CondBlockMutex => "profilerd --profiles block,mutex, condition variable",
        }
    }

    /// The workload's mode: a bare futex word, or a condition variable.
    fn mode(self) -> &'static str {
        match self {
            Setup::CondBare | Setup::CondBlockMutex => "condpingpong",
            _ => "pingpong",
        }
    }

    /// The setup without any profiler for the same workload mode.
    fn unprofiled(self) -> Setup {
        match self.mode() {
            "condpingpong" => Setup::CondBare,
            _ => Setup::Bare,
        }
    }

    fn is_bare(self) -> bool {
        matches!(self, Setup::Bare | Setup::BareFree | Setup::CondBare)
    }

    fn tracepoints(self) -> Vec<&'static str> {
        match self {
            Setup::TraceFutex => FUTEX_TPS.to_vec(),
            Setup::TraceSwitch => SWITCH_TPS.to_vec(),
            Setup::TraceBoth => [FUTEX_TPS.as_slice(), &SWITCH_TPS].concat(),
            _ => Vec::new(),
        }
    }

    fn profiles(self) -> Option<&'static str> {
        match self {
            Setup::BlockMutex | Setup::CondBlockMutex => Some("block,mutex"),
            Setup::Offcpu => Some("offcpu"),
            Setup::All => Some("block,mutex,offcpu"),
            _ => None,
        }
    }

    /// The empty programs on the same tracepoints.
    fn floor(self) -> Option<Setup> {
        match self {
            Setup::BlockMutex => Some(Setup::TraceFutex),
            Setup::Offcpu => Some(Setup::TraceSwitch),
            Setup::All => Some(Setup::TraceBoth),
            _ => None,
        }
    }
}

/// One timed batch.
struct Batch {
    ns_per_trip: f64,
    woken_per_trip: f64,
    vcsw_per_trip: f64,
    ivcsw_per_trip: f64,
}

#[derive(Default)]
struct Figures {
    batches: Vec<Batch>,
    /// Processes that ran while another tracer was running.
    disturbed: usize,
    processes: usize,
    /// The daemon's CPU ns and context switches per round trip, per process.
    daemon_cpu: Vec<f64>,
    daemon_switches: Vec<f64>,
    bpf: Option<Bpf>,
    unavailable: Option<String>,
}

impl Figures {
    fn trip(&self) -> f64 {
        median(
            &self
                .batches
                .iter()
                .map(|b| b.ns_per_trip)
                .collect::<Vec<_>>(),
        )
    }
    fn of(&self, f: fn(&Batch) -> f64) -> f64 {
        median(&self.batches.iter().map(f).collect::<Vec<_>>())
    }
}

/// Every case of the ping-pong rounds and its figures, in report order.
struct Results {
    cases: Vec<Case>,
    figures: Vec<Figures>,
}

impl Results {
    fn iter(&self) -> impl Iterator<Item = (Case, &Figures)> {
        self.cases.iter().copied().zip(&self.figures)
    }

    /// The case's figures, if it ran.
    fn get(&self, case: Case) -> Option<&Figures> {
        self.cases
            .iter()
            .position(|c| *c == case)
            .map(|i| &self.figures[i])
            .filter(|f| f.unavailable.is_none() && !f.batches.is_empty())
    }

    fn trip(&self, case: Case) -> Option<f64> {
        self.get(case).map(Figures::trip)
    }

    /// Time added per wait/wake pair (half a round trip) over `base`.
    fn per_pair(&self, case: Case, base: Case) -> Option<f64> {
        Some((self.trip(case)? - self.trip(base)?) / 2.0)
    }

    /// Time added per context switch over `base`: the round trip's added
    /// time over its voluntary switches.
    fn per_switch(&self, case: Case, base: Case) -> Option<f64> {
        let f = self.get(case)?;
        Some((f.trip() - self.trip(base)?) / f.of(|b| b.vcsw_per_trip))
    }
}

/// BPF run statistics of one process's life.
struct Bpf {
    trips: u64,
    calls: u64,
    programs: Vec<Program>,
}

struct Program {
    name: String,
    runs: u64,
    ns_per_run: f64,
}

impl Bpf {
    fn runs_per_trip(&self) -> f64 {
        self.programs.iter().map(|p| p.runs).sum::<u64>() as f64 / self.trips.max(1) as f64
    }
    fn ns_per_trip(&self) -> f64 {
        self.programs
            .iter()
            .map(|p| p.runs as f64 * p.ns_per_run)
            .sum::<f64>()
            / self.trips.max(1) as f64
    }
}

enum Outcome {
    Done {
        batches: Vec<Batch>,
        bpf: Option<Bpf>,
        disturbed: bool,
        /// The daemon's CPU ns and context switches per round trip.
        daemon: Option<(f64, f64)>,
    },
    Refused(String),
}

pub fn measure(bin: &Path, baseline: Option<&Path>, work: &Path) -> Result<String> {
    let daemons = Daemons {
        current: bin,
        baseline,
    };
    let exe = work.join("waits");
    let source = work.join("waits.c");
    fs::write(&source, SOURCE)?;
    let built = Command::new("gcc")
        .args(["-O2", "-Wall", "-pthread", "-o"])
        .arg(&exe)
        .arg(&source)
        .status()
        .context("running gcc")?;
    if !built.success() {
        bail!("building the futex benchmark failed");
    }
    // The last CPU: whatever else runs tends to start on CPU 0.
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;

    let cases = baseline::cases(&daemons);
    let mut figures: Vec<Figures> = cases.iter().map(|_| Figures::default()).collect();
    let started = Instant::now();
    for round in 0..=ROUNDS {
        let stats_round = round == ROUNDS;
        set_bpf_stats(stats_round)?;
        for k in 0..cases.len() {
            // Rotating the order spreads drifts over every setup.
            let i = (k + round) % cases.len();
            let setup = cases[i].setup;
            let bare = setup.is_bare();
            if (stats_round && bare) || figures[i].unavailable.is_some() {
                continue;
            }
            eprintln!(
                "waits bench: round {}/{}, {}",
                round + 1,
                ROUNDS + 1,
                cases[i].label()
            );
            let pin = if setup == Setup::BareFree {
                -1
            } else {
                cpu as i64
            };
            let bin = daemons.bin(cases[i].build);
            match run_pingpong(setup, &exe, bin, work, pin, stats_round)? {
                Outcome::Refused(reason) => figures[i].unavailable = Some(reason),
                Outcome::Done { bpf, .. } if stats_round => figures[i].bpf = bpf,
                Outcome::Done {
                    batches,
                    disturbed,
                    daemon,
                    ..
                } => {
                    if let Some((cpu, switches)) = daemon {
                        figures[i].daemon_cpu.push(cpu);
                        figures[i].daemon_switches.push(switches);
                    }
                    figures[i].processes += 1;
                    figures[i].disturbed += usize::from(disturbed);
                    figures[i].batches.extend(batches);
                }
            }
        }
    }
    let pingpong_secs = started.elapsed().as_secs_f64();
    // Stats stay on: the daemon logs its programs' run times at exit.
    let pid_filter = bpftrace_pid_filter(&exe, work, cpu)?;
    let rates = baseline::rate_runs(&daemons, |profiles, bin| {
        rate(&exe, bin, work, cpu, profiles)
    })?;
    let results = Results { cases, figures };
    Ok(report(cpu, &results, &pid_filter, &rates, pingpong_secs))
}

enum Attached {
    Nothing,
    Bpftrace(Bpftrace, Vec<(String, u32)>),
    Daemon(Daemon),
}

fn run_pingpong(
    setup: Setup,
    exe: &Path,
    bin: &Path,
    work: &Path,
    cpu: i64,
    stats: bool,
) -> Result<Outcome> {
    let mut bench = Bench::spawn(
        exe,
        &[
            setup.mode().into(),
            BATCH_MS.to_string(),
            REPS.to_string(),
            cpu.to_string(),
        ],
    )?;
    let pid = bench.pid();
    let attached = if let Some(profiles) = setup.profiles() {
        let out = work.join("profiles");
        let mut daemon = Daemon::start(
            bin,
            &[
                "--profiles".into(),
                profiles.into(),
                "--pid".into(),
                pid.to_string(),
                "--output-dir".into(),
                out.to_string_lossy().into_owned(),
            ],
        )?;
        if let Some(reason) = daemon.wait_ready()? {
            return Ok(Outcome::Refused(reason));
        }
        Attached::Daemon(daemon)
    } else if setup.tracepoints().is_empty() {
        Attached::Nothing
    } else {
        let tps = setup.tracepoints();
        let script: Vec<String> = tps
            .iter()
            .map(|tp| format!("tracepoint:{tp} /pid == {pid}/ {{}}"))
            .collect();
        let mut bpftrace = spawn_bpftrace(&["-e".into(), script.join(" ")], work)?;
        let ids = bpftrace.wait_attached(&tps)?;
        Attached::Bpftrace(bpftrace, ids)
    };
    let ours = match &attached {
        Attached::Nothing => vec![],
        Attached::Bpftrace(b, _) => vec![b.child.0.id()],
        Attached::Daemon(d) => vec![d.pid()],
    };
    let before = other_tracers(&ours);
    let daemon_before = match &attached {
        Attached::Daemon(d) => Some((task_cpu_ns(d.pid())?, task_switches(d.pid())?)),
        _ => None,
    };

    bench.go()?;
    let mut batches = Vec::new();
    for _ in 0..REPS {
        let line = bench.line(OUTPUT_TIMEOUT)?;
        let batch =
            parse_batch(&line).with_context(|| format!("unexpected benchmark output {line:?}"))?;
        eprintln!(
            "waits bench: {setup:?}: {:.0} ns per round trip",
            batch.ns_per_trip
        );
        batches.push(batch);
    }
    let line = bench.line(OUTPUT_TIMEOUT)?;
    let total: Vec<u64> = line
        .strip_prefix("total ")
        .and_then(|t| t.split_whitespace().map(|v| v.parse().ok()).collect())
        .with_context(|| format!("unexpected benchmark output {line:?}"))?;
    let (calls, trips) = match total[..] {
        [calls, trips, _] => (calls, trips),
        _ => bail!("unexpected benchmark output {line:?}"),
    };
    let disturbed = !before.is_empty() || !other_tracers(&ours).is_empty();
    // From "go" to the end of the batches, as are the process's round trips
    // (warm-up included).
    let daemon = match (&attached, daemon_before) {
        (Attached::Daemon(d), Some((cpu, switches))) => {
            let per_trip = |n: u64| n as f64 / trips.max(1) as f64;
            Some((
                per_trip(task_cpu_ns(d.pid())?.saturating_sub(cpu)),
                per_trip(task_switches(d.pid())?.saturating_sub(switches)),
            ))
        }
        _ => None,
    };
    // Read while the programs are attached and the process still waits.
    let mut bpf = match (&attached, stats) {
        (Attached::Bpftrace(b, ids), true) => {
            let runs = program_stats(b.child.0.id());
            let programs = ids
                .iter()
                .filter_map(|(name, id)| {
                    let (_, n, ns) = runs.iter().find(|(i, _, _)| i == id)?;
                    Some(Program {
                        name: name.clone(),
                        runs: *n,
                        ns_per_run: *ns as f64 / (*n).max(1) as f64,
                    })
                })
                .collect();
            Some(Bpf {
                trips,
                calls,
                programs,
            })
        }
        _ => None,
    };
    bench.finish()?;
    if let Attached::Daemon(daemon) = attached {
        let (status, log) = daemon.finish(Duration::from_secs(10))?;
        if !status.success() {
            bail!("profilerd exited with {status}");
        }
        if stats {
            bpf = Some(Bpf {
                trips,
                calls,
                programs: log.iter().filter_map(|l| parse_program(l)).collect(),
            });
        }
    }
    Ok(Outcome::Done {
        batches,
        bpf,
        disturbed,
        daemon,
    })
}

enum RateOutcome {
    Refused(String),
    Done(Rate),
}

struct Rate {
    calls: u64,
    secs: f64,
    woken: u64,
    cpu_ns: u64,
    /// The daemon's context switches (every thread) during the load.
    switches: u64,
    /// Stacks the daemon unwound over its life (its summary's `unwinds`).
    unwinds: Option<u64>,
    rss_ready_kib: u64,
    hwm_kib: u64,
    /// Window build + write times at exit, in ms, and the files' lines.
    window_ms: f64,
    writes: Vec<String>,
    bpf: Vec<String>,
    warnings: Vec<String>,
    summary: Vec<String>,
    others: Vec<String>,
}

impl Rate {
    /// The daemon's CPU during the load, % of one core.
    fn load_share(&self) -> f64 {
        self.cpu_ns as f64 / (self.secs * 1e9) * 100.0
    }

    /// Window builds and writes at exit, amortized over the default
    /// interval, % of one core.
    fn window_share(&self) -> f64 {
        self.window_ms / (DEFAULT_INTERVAL_S * 1e3) * 100.0
    }

    fn share(&self) -> f64 {
        self.load_share() + self.window_share()
    }

    /// The daemon's CPU per stack it unwound, if it unwound any.
    fn per_stack(&self) -> Option<f64> {
        self.unwinds
            .filter(|&n| n > 0)
            .map(|n| self.cpu_ns as f64 / n as f64)
    }
}

/// The daemon under a steady RATE_CALLS futex calls a second.
fn rate(exe: &Path, bin: &Path, work: &Path, cpu: usize, profiles: &str) -> Result<RateOutcome> {
    let mut bench = Bench::spawn(
        exe,
        &[
            "rate".into(),
            RATE_CALLS.to_string(),
            RATE_SECS.to_string(),
            cpu.to_string(),
        ],
    )?;
    let out = work.join(format!("rate-{}", profiles.replace(',', "-")));
    let mut daemon = Daemon::start(
        bin,
        &[
            "--profiles".into(),
            profiles.into(),
            "--pid".into(),
            bench.pid().to_string(),
            "--output-dir".into(),
            out.to_string_lossy().into_owned(),
        ],
    )?;
    if let Some(reason) = daemon.wait_ready()? {
        return Ok(RateOutcome::Refused(reason));
    }
    let dpid = daemon.pid();
    let rss_ready_kib = status_field(dpid, "VmRSS:")?;
    let cpu_ready = task_cpu_ns(dpid)?;
    let switches_ready = task_switches(dpid)?;
    let mut others = other_tracers(&[dpid]);
    bench.go()?;
    let by = Instant::now() + Duration::from_secs(RATE_SECS) + OUTPUT_TIMEOUT;
    let line = loop {
        if let Ok(line) = bench.lines.try_recv() {
            break line;
        }
        if Instant::now() >= by {
            bail!("the futex rate benchmark did not finish");
        }
        daemon.drain(Duration::from_millis(100));
    };
    // The workload times itself: the daemon's CPU over the same span.
    let cpu_end = task_cpu_ns(dpid)?;
    let switches_end = task_switches(dpid)?;
    let hwm_kib = status_field(dpid, "VmHWM:")?;
    for o in other_tracers(&[dpid]) {
        if !others.contains(&o) {
            others.push(o);
        }
    }
    let f: Vec<u64> = line
        .strip_prefix("rate ")
        .and_then(|r| r.split_whitespace().map(|v| v.parse().ok()).collect())
        .with_context(|| format!("unexpected benchmark output {line:?}"))?;
    let [calls, ns, woken, _] = f[..] else {
        bail!("unexpected benchmark output {line:?}");
    };
    bench.finish()?;
    let (log, hwm_kib) = daemon.finish_with_peak(Duration::from_secs(15), hwm_kib)?;
    let writes: Vec<String> = log
        .iter()
        .filter(|l| l.contains("wrote "))
        .map(|l| {
            message(l)
                .split_whitespace()
                .map(|w| w.rsplit('/').next().unwrap_or(w))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let window_ms = writes.iter().map(|w| window_times(w)).sum();
    let summary: Vec<String> = log
        .iter()
        .filter(|l| l.contains("summary"))
        .map(|l| message(l))
        .collect();
    Ok(RateOutcome::Done(Rate {
        calls,
        secs: ns as f64 / 1e9,
        woken,
        cpu_ns: cpu_end - cpu_ready,
        switches: switches_end.saturating_sub(switches_ready),
        unwinds: summary.iter().find_map(|l| summary_field(l, "unwinds")),
        rss_ready_kib,
        hwm_kib,
        window_ms,
        writes,
        bpf: bpf_program_lines(&log),
        warnings: log
            .iter()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .map(|l| message(l))
            .collect(),
        summary,
        others,
    }))
}

/// Voluntary and involuntary context switches of every thread of `pid`.
fn task_switches(pid: u32) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
        let status = fs::read_to_string(entry?.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .filter_map(|l| {
                let (key, value) = l.split_once(':')?;
                key.ends_with("ctxt_switches")
                    .then(|| value.trim().parse::<u64>().ok())?
            })
            .sum::<u64>();
    }
    Ok(total)
}

/// `key=N` of a summary line.
pub(super) fn summary_field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// "built in X ms, written in Y ms" of a "wrote" line: X + Y.
fn window_times(line: &str) -> f64 {
    ["built in ", "written in "]
        .iter()
        .filter_map(|key| {
            line.split(key)
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_lines() {
        let p = parse_program(
            "2026-11-22T03:27:24Z  INFO profilerd::session: bpf program futex_exit: \
             1241193 runs, 2042 ns per run",
        )
        .unwrap();
        assert_eq!(p.name, "futex_exit");
        assert_eq!(p.runs, 1_241_193);
        assert_eq!(p.ns_per_run, 2042.0);
        assert!(parse_program("ready: every probe is attached").is_none());
    }

    #[test]
    fn batch_lines() {
        let b = parse_batch("pingpong 1000 5000000 2000 0 2000 2000 3").unwrap();
        assert_eq!(b.ns_per_trip, 5000.0);
        assert_eq!(b.woken_per_trip, 2.0);
        assert_eq!(b.vcsw_per_trip, 2.0);
        assert_eq!(b.ivcsw_per_trip, 0.003);
        assert!(parse_batch("pingpong 1 2").is_none());
        assert!(parse_batch("total 1 2 3").is_none());
    }

    #[test]
    fn summary_fields() {
        let line = "summary samples=0 unwinds=493493 unwinds_truncated=0";
        assert_eq!(summary_field(line, "unwinds"), Some(493_493));
        assert_eq!(summary_field(line, "frames"), None);
    }

    #[test]
    fn window_build_and_write_times() {
        let line = "wrote block-20261122T032624Z.pb.gz (4 samples, built in 31.3 ms, \
                    written in 1.1 ms)";
        assert!((window_times(line) - 32.4).abs() < 1e-9);
        assert_eq!(window_times("wrote x.pb.gz"), 0.0);
    }

    #[test]
    fn a_tracer_is_seen_attached() {
        // This process holds no perf events: nothing is attached.
        assert!(attached_tracepoints(std::process::id()).is_empty());
    }
}
