//! `cargo xtask bench-kernel-log --baseline BIN`: the BPF time per run of
//! each program with the kernel's diagnostics compiled in but off (this
//! build, the default), on (`[debug] kernel_log = true`), and in a build
//! without them (BIN), side by side: the three daemons profile the same
//! workload at once, each with its own programs on the same tracepoints
//! and perf events, started in a rotating order (the program attached
//! first meets the colder caches). Two workloads: wait_sites (two threads,
//! block and off-CPU profiles: futex_enter, futex_exit, sched_switch) and
//! two unwind_nofp CPU burners (cpu profile at 999 Hz: cpu_sample, with
//! stack copies). BPF time comes from the kernel's statistics, turned on
//! with BPF_ENABLE_STATS for the run (the sysctl is left as it is); the
//! size of each program as the kernel runs it (after the verifier removed
//! what it proved unreachable) from BPF_OBJ_GET_INFO_BY_FD, as `bpftool
//! prog` shows it. Writes target/bench-kernel-log.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench::harness::Reaped;
use crate::bench::harness::{line_channel, median};

#[derive(clap::Args)]
pub struct KernelLogArgs {
    /// A daemon built without the kernel's diagnostics (an earlier build).
    #[arg(long, value_name = "BIN")]
    baseline: PathBuf,
    /// Rounds per workload; the start order of the daemons rotates.
    #[arg(long, default_value_t = 6)]
    rounds: usize,
}

/// The daemons compared, in report order.
const BUILDS: [&str; 3] = ["without log sites", "log sites, off", "log sites, on"];
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Seconds each CPU burner runs.
const BURN_SECONDS: &str = "6";

pub fn run(root: &Path, args: KernelLogArgs) -> Result<()> {
    let this = root.join("target/release/profilerd");
    let baseline = fs::canonicalize(&args.baseline)
        .with_context(|| format!("baseline daemon {}", args.baseline.display()))?;
    let work = root
        .join("target")
        .join(format!("bench-kernel-log-{}", std::process::id()));
    fs::create_dir_all(&work)?;
    let result = measure(root, &[&baseline, &this, &this], &work, args.rounds);
    let _ = fs::remove_dir_all(&work);
    let report = result?;
    let path = root.join("target/bench-kernel-log.md");
    fs::write(&path, &report)?;
    print!("{report}");
    eprintln!("report written to {}", path.display());
    Ok(())
}

/// Runs and BPF time of one program, summed over rounds, with each
/// round's ns per run.
#[derive(Default)]
struct Tally {
    runs: u64,
    ns: f64,
    per_round: Vec<f64>,
}

/// (workload, program) -> one tally per build.
type Tallies = BTreeMap<(&'static str, String), [Tally; 3]>;

/// Program -> (translated, JIT-compiled) bytes, per build.
type Sizes = BTreeMap<String, [(u32, u32); 3]>;

fn measure(root: &Path, bins: &[&Path; 3], work: &Path, rounds: usize) -> Result<String> {
    let _stats = enable_bpf_stats()?;
    let workloads = root.join("tests/workloads");
    let waits = work.join("wait_sites");
    compile(
        &workloads.join("wait_sites.c"),
        &waits,
        &[
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-inline",
            "-pthread",
        ],
    )?;
    let burner = work.join("unwind_nofp");
    compile(&workloads.join("unwind_nofp.c"), &burner, &["-O2", "-g"])?;
    let config = work.join("kernel-log.toml");
    fs::write(&config, "[debug]\nkernel_log = true\n")?;

    let mut tallies = Tallies::new();
    let mut sizes = Sizes::new();
    let load_before = load_average();
    for round in 0..rounds {
        let order: Vec<usize> = (0..3).map(|i| (i + round) % 3).collect();
        eprintln!("round {}/{rounds}: start order {order:?}", round + 1);
        let wait_args = ["--wait-stdin", "--rounds", "300", "--threads", "2"];
        let stats = profile(
            bins,
            &order,
            &config,
            work,
            &[(&waits, &wait_args[..])],
            &["--profiles", "block,offcpu", "--block-rate", "500us"],
            &mut sizes,
        )?;
        add(&mut tallies, "wait_sites", stats);
        let burn_args = [BURN_SECONDS, "--wait-stdin"];
        let stats = profile(
            bins,
            &order,
            &config,
            work,
            &[(&burner, &burn_args[..]), (&burner, &burn_args[..])],
            &["--profiles", "cpu", "--cpu-frequency", "999"],
            &mut sizes,
        )?;
        add(&mut tallies, "unwind_nofp ×2", stats);
    }
    let load = format!("{load_before} before, {} after", load_average());
    Ok(report(&tallies, &sizes, bins, rounds, &load))
}

/// The 1-minute load average: the futex and scheduler programs run for
/// every process, so other work on the machine blurs the figures.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The BPF statistics of each daemon (by build) of one run of the
/// workloads: (program, runs, ns per run).
type RunStats = [Vec<(String, u64, f64)>; 3];

fn profile(
    bins: &[&Path; 3],
    order: &[usize],
    config: &Path,
    work: &Path,
    workloads: &[(&Path, &[&str])],
    profiles: &[&str],
    sizes: &mut Sizes,
) -> Result<RunStats> {
    let mut targets = Vec::new();
    for (exe, args) in workloads {
        let child = Command::new(exe)
            .args(*args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        targets.push(Reaped(child));
    }
    let pids: Vec<String> = targets.iter().map(|t| t.0.id().to_string()).collect();
    let mut daemons: Vec<Option<Daemon>> = (0..3).map(|_| None).collect();
    for &build in order {
        let out = work.join(format!("profiles-{build}"));
        let mut args: Vec<String> = profiles.iter().map(|s| s.to_string()).collect();
        args.extend(
            [
                "--interval",
                "60s",
                "--output-dir",
                &out.display().to_string(),
                "--pid",
                &pids.join(","),
            ]
            .map(str::to_string),
        );
        if build == 2 {
            args.extend(["--config".to_string(), config.display().to_string()]);
        }
        let mut daemon = Daemon::start(bins[build], &args)?;
        daemon.wait_ready()?;
        for (name, translated, jited) in program_sizes(daemon.child.0.id()) {
            sizes.entry(name).or_default()[build] = (translated, jited);
        }
        daemons[build] = Some(daemon);
    }
    for target in &mut targets {
        // One byte lets it go; the pipe closes when the child is reaped.
        use std::io::Write as _;
        target.0.stdin.take().context("stdin")?.write_all(b"g")?;
    }
    for target in &mut targets {
        let status = target.0.wait()?;
        if !status.success() {
            bail!("a workload exited with {status}");
        }
    }
    let mut stats: RunStats = Default::default();
    for (build, daemon) in daemons.into_iter().enumerate() {
        let log = daemon.context("every daemon started")?.finish()?;
        stats[build] = log.iter().filter_map(|l| parse_program(l)).collect();
    }
    Ok(stats)
}

fn add(tallies: &mut Tallies, workload: &'static str, stats: RunStats) {
    for (build, programs) in stats.into_iter().enumerate() {
        for (name, runs, ns) in programs {
            let tally = &mut tallies.entry((workload, name)).or_default()[build];
            tally.runs += runs;
            tally.ns += runs as f64 * ns;
            tally.per_round.push(ns);
        }
    }
}

fn report(
    tallies: &Tallies,
    sizes: &Sizes,
    bins: &[&Path; 3],
    rounds: usize,
    load: &str,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Kernel diagnostics: BPF time per run, compiled in vs not\n\n\
         Builds: {} = {}; {} and {} = {} (on: `[debug] kernel_log = true`).\n\
         {rounds} rounds per workload, the three daemons at once in a rotating \
         start order; ns per run over all rounds (runs summed), and the median \
         and range of the rounds' ratios. The futex and scheduler programs run \
         for every process (those of other processes return early): load \
         average {load}.\n",
        BUILDS[0],
        bins[0].display(),
        BUILDS[1],
        BUILDS[2],
        bins[1].display(),
    );
    let _ = writeln!(
        out,
        "| workload | program | runs | ns/run, {} | ns/run, {} | off / without | ns/run, {} | on / without |",
        BUILDS[0], BUILDS[1], BUILDS[2]
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for ((workload, program), t) in tallies {
        if t.iter().any(|t| t.runs < 1000) {
            continue;
        }
        let mean = |t: &Tally| t.ns / t.runs as f64;
        let ratios = |b: usize| -> String {
            let r: Vec<f64> = t[b]
                .per_round
                .iter()
                .zip(&t[0].per_round)
                .map(|(x, base)| x / base)
                .collect();
            let (lo, hi) = r
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                });
            format!(
                "**{:.3}** (rounds {:.2}, {lo:.2}–{hi:.2})",
                mean(&t[b]) / mean(&t[0]),
                median(&r)
            )
        };
        let _ = writeln!(
            out,
            "| {workload} | {program} | {} | {:.0} | {:.0} | {} | {:.0} | {} |",
            t[0].runs,
            mean(&t[0]),
            mean(&t[1]),
            ratios(1),
            mean(&t[2]),
            ratios(2)
        );
    }
    let _ = writeln!(
        out,
        "\nProgram sizes as loaded (translated / JIT-compiled bytes, after the verifier's \
         removal of unreachable code):\n\n\
         | program | {} | {} | {} |\n|---|---|---|---|",
        BUILDS[0], BUILDS[1], BUILDS[2]
    );
    for (program, s) in sizes {
        let cell = |(translated, jited): (u32, u32)| format!("{translated} / {jited}");
        let _ = writeln!(
            out,
            "| {program} | {} | {} | {} |",
            cell(s[0]),
            cell(s[1]),
            cell(s[2])
        );
    }
    out
}

/// (name, translated bytes, JIT-compiled bytes) of each BPF program that
/// process `pid` holds a descriptor of.
fn program_sizes(pid: u32) -> Vec<(String, u32, u32)> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u32, u32)> = Vec::new();
    for fd in fds.flatten() {
        let Ok(text) = fs::read_to_string(fd.path()) else {
            continue;
        };
        let Some(id) = text
            .lines()
            .find_map(|l| l.strip_prefix("prog_id:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(info) = program_info(id)
            && !out.iter().any(|(name, ..)| *name == info.0)
        {
            out.push(info);
        }
    }
    out
}

/// A loaded program's name and sizes, by id (BPF_PROG_GET_FD_BY_ID, then
/// BPF_OBJ_GET_INFO_BY_FD).
fn program_info(id: u32) -> Option<(String, u32, u32)> {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    // union bpf_attr: { prog_id, next_id, open_flags }.
    let attr = [id, 0, 0, 0];
    // SAFETY: a valid attribute buffer of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_GET_FD_BY_ID,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // struct bpf_prog_info, of which the kernel fills what fits: jited_prog_len
    // at byte 16, xlated_prog_len at 20, name[16] at 64.
    let mut info = [0u8; 256];
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: `info` outlives the call and is info_len bytes long.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &attr as *const InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    if ret != 0 {
        return None;
    }
    let word = |at: usize| u32::from_ne_bytes(info[at..at + 4].try_into().expect("4 bytes"));
    let name = &info[64..80];
    let name = String::from_utf8_lossy(&name[..name.iter().position(|&b| b == 0).unwrap_or(16)])
        .into_owned();
    (!name.is_empty()).then(|| (name, word(20), word(16)))
}

/// "bpf program NAME: N runs, X ns per run" -> (NAME, N, X).
fn parse_program(line: &str) -> Option<(String, u64, f64)> {
    let rest = &line[line.find("bpf program ")? + "bpf program ".len()..];
    let (name, rest) = rest.split_once(": ")?;
    let (runs, rest) = rest.split_once(" runs, ")?;
    let ns = rest.strip_suffix(" ns per run")?;
    Some((name.to_string(), runs.parse().ok()?, ns.parse().ok()?))
}

fn compile(source: &Path, out: &Path, flags: &[&str]) -> Result<()> {
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(source)
        .status()
        .context("running gcc")?;
    if !status.success() {
        bail!("compiling {} failed", source.display());
    }
    Ok(())
}

/// Keeps the kernel's BPF run-time statistics on while the descriptor
/// lives (BPF_ENABLE_STATS: independent of the sysctl, which other tools
/// may turn off meanwhile).
fn enable_bpf_stats() -> Result<OwnedFd> {
    const BPF_ENABLE_STATS: libc::c_long = 32;
    // union bpf_attr { struct { __u32 type; } enable_stats; }, type
    // BPF_STATS_RUN_TIME = 0; padded as the kernel reads it.
    let attr = [0u64; 2];
    // SAFETY: a valid attribute buffer of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_ENABLE_STATS,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("BPF_ENABLE_STATS");
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A daemon whose log is kept (not echoed: with diagnostics on it is long).
struct Daemon {
    child: Reaped,
    lines: Receiver<String>,
    log: Vec<String>,
}

impl Daemon {
    fn start(bin: &Path, args: &[String]) -> Result<Daemon> {
        let mut child = Command::new(bin)
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("PROFILERD_LOG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("daemon stderr")?;
        Ok(Daemon {
            child: Reaped(child),
            lines: line_channel(stderr),
            log: Vec::new(),
        })
    }

    fn wait_ready(&mut self) -> Result<()> {
        let by = Instant::now() + READY_TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(by.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let ready = line.contains("ready: every probe is attached");
                    self.log.push(line);
                    if ready {
                        return Ok(());
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!(
                        "profilerd exited before it was ready:\n{}",
                        self.log.join("\n")
                    )
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!("profilerd was not ready within {READY_TIMEOUT:?}")
                }
            }
        }
    }

    /// Waits for it to exit (its targets are gone) and returns its log.
    fn finish(mut self) -> Result<Vec<String>> {
        let by = Instant::now() + EXIT_TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(by.saturating_duration_since(Instant::now()))
            {
                Ok(line) => self.log.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    bail!("profilerd did not exit within {EXIT_TIMEOUT:?} of its targets")
                }
            }
        }
        let status = self.child.0.wait()?;
        if !status.success() {
            bail!("profilerd exited with {status}:\n{}", self.log.join("\n"));
        }
        Ok(self.log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_lines() {
        let line = "2026-11-25T13:00:00Z  INFO profilerd::session: bpf program futex_exit: 12345 runs, 87 ns per run";
        assert_eq!(
            parse_program(line),
            Some(("futex_exit".to_string(), 12345, 87.0))
        );
        assert_eq!(parse_program("summary samples=3"), None);
    }
}
