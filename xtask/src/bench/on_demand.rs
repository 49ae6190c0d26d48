//! `cargo xtask bench --on-demand`: what profiles on demand cost, side by
//! side in one run. A counting burner (one busy thread that reports the
//! loops it made) runs `--seconds` under each setup, in alternated rounds:
//!
//! - bare: no profiler;
//! - daemon: profilerd profiling the node at 99 Hz, no HTTP server;
//! - idle server: the same with `--http-addr`, nobody asking;
//! - 999 Hz capture: the same, with `/debug/pprof/profile?hz=999&pid=P`
//!   over the burner's run (its own CPU-clock events, beside the 99 Hz);
//! - perf 999 Hz: the idle-server daemon, and `perf record -F 999 -g -p P`
//!   over the burner's run, the outside reference for a 999 Hz look.
//!
//! Reported per setup (median, min and max of the rounds): the burner's
//! loops per second against bare, the daemon's CPU over the run (for the
//! capture: until its profile is answered), its BPF programs' runs and
//! time (the kernel's run-time statistics, from its programs' fdinfo),
//! and perf record's CPU (user+sys, from wait4).
//!
//! Then what probes of a capture's own cost (a type the daemon does not
//! collect): a daemon taking CPU samples only is asked, in turn, for a
//! 2 s heap, block, mutex and off-CPU capture of a sleeping process;
//! per type, the load as the daemon logs it, the time to the answer, and
//! during the capture against before it: BPF descriptors, the BPF maps'
//! memory (memlock) and the daemon's resident set; and that each comes
//! back after.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::footprint::bpf_memlock;
use super::harness::{Bench, Daemon, bpftrace_figures, build_c, median, spread};

const ROUNDS: usize = 3;
/// The capture's rate: the highest a request may ask for is 1000.
const CAPTURE_HZ: u64 = 999;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    Bare,
    Daemon,
    IdleServer,
    Capture,
    Perf,
}

impl Setup {
    const ALL: [Setup; 5] = [
        Setup::Bare,
        Setup::Daemon,
        Setup::IdleServer,
        Setup::Capture,
        Setup::Perf,
    ];

    fn name(self) -> &'static str {
        match self {
            Setup::Bare => "bare",
            Setup::Daemon => "daemon, 99 Hz, no server",
            Setup::IdleServer => "daemon, idle server",
            Setup::Capture => "daemon, 999 Hz capture of the burner",
            Setup::Perf => "daemon, idle server; perf record -F 999 -g -p",
        }
    }
}

/// One run's figures.
#[derive(Default, Clone, Copy)]
struct Run {
    loops_per_s: f64,
    /// The daemon's CPU over the run, ms.
    daemon_ms: f64,
    /// Its BPF programs' runs and time over the run.
    bpf_runs: u64,
    bpf_ms: f64,
    /// perf record's CPU, ms.
    perf_ms: f64,
    /// Samples in the capture's profile.
    captured: u64,
}

pub fn measure(bin: &Path, work: &Path, seconds: u64) -> Result<String> {
    let burner = build_counter(work)?;
    let mut runs: Vec<(Setup, Run)> = Vec::new();
    for round in 0..ROUNDS {
        for setup in Setup::ALL {
            eprintln!("round {}/{ROUNDS}: {}", round + 1, setup.name());
            let run = run_once(bin, &burner, work, setup, seconds)?;
            runs.push((setup, run));
        }
    }
    let mut out = report(&runs, seconds);
    out += &measure_own_probes(bin, work)?;
    Ok(out)
}

/// The types a capture loads probes of its own for, in the second table.
const OWN_KINDS: [&str; 4] = ["heap", "block", "mutex", "offcpu"];
/// The length of those captures.
const OWN_SECONDS: u64 = 2;

/// One own-probes capture's figures.
#[derive(Default, Clone, Copy)]
struct OwnRun {
    load_ms: f64,
    answer_ms: f64,
    /// BPF descriptors, map memory (bytes) and RSS (KiB): before, during
    /// and after the capture.
    fds: [u64; 3],
    memlock: [u64; 3],
    rss_kib: [u64; 3],
}

fn measure_own_probes(bin: &Path, work: &Path) -> Result<String> {
    let out = work.join("profiles");
    let args: Vec<String> = [
        "--output-dir",
        &out.display().to_string(),
        "--cpu-frequency",
        "99",
        "--profiles",
        "cpu",
        "--http-addr",
        "127.0.0.1:0",
    ]
    .map(str::to_owned)
    .to_vec();
    let mut daemon = Daemon::start(bin, &args)?;
    if let Some(why) = daemon.wait_ready()? {
        bail!("profilerd exited: {why}");
    }
    let addr = server_address(&mut daemon)?.context("the daemon logged no address")?;
    let mut sleeper = Command::new("sleep")
        .arg("600")
        .spawn()
        .context("starting sleep")?;
    let pid = sleeper.id();
    let mut runs: Vec<(&str, OwnRun)> = Vec::new();
    let result = (|| -> Result<()> {
        for round in 0..ROUNDS {
            for kind in OWN_KINDS {
                eprintln!("round {}/{ROUNDS}: {kind} on probes of its own", round + 1);
                runs.push((kind, own_once(&mut daemon, addr, kind, pid)?));
            }
        }
        Ok(())
    })();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let (status, _) = daemon.finish(Duration::ZERO)?;
    let _ = fs::remove_dir_all(&out);
    result?;
    if !status.success() {
        bail!("profilerd exited with {status}");
    }
    Ok(own_report(&runs))
}

fn own_once(daemon: &mut Daemon, addr: SocketAddr, kind: &str, pid: u32) -> Result<OwnRun> {
    let figures = |daemon: &Daemon| -> Result<(u64, u64, u64)> {
        let pid = daemon.pid();
        let fds = fs::read_dir(format!("/proc/{pid}/fd"))?
            .flatten()
            .filter(|fd| {
                fs::read_link(fd.path())
                    .is_ok_and(|t| t.to_string_lossy().starts_with("anon_inode:bpf"))
            })
            .count() as u64;
        let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        Ok((fds, bpf_memlock(pid)?, rss))
    };
    let before = figures(daemon)?;
    let asked = Instant::now();
    let path = format!("/debug/pprof/{kind}?seconds={OWN_SECONDS}&pid={pid}");
    let capture = std::thread::spawn(move || http_get(addr, &path));
    let started = format!("{kind} of pid {pid} for {OWN_SECONDS} s on probes of its own");
    let by = Instant::now() + Duration::from_secs(10);
    let line = loop {
        if let Some(line) = daemon
            .drain(Duration::from_millis(20))
            .into_iter()
            .find(|l| l.contains(&started))
        {
            break line;
        }
        if Instant::now() > by {
            bail!("the {kind} capture did not start on probes of its own");
        }
    };
    let load_ms: f64 = line
        .split("loaded in ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .context("no load time in the log")?;
    let during = figures(daemon)?;
    let body = capture
        .join()
        .map_err(|_| anyhow::anyhow!("the capture thread panicked"))??;
    let answer_ms = asked.elapsed().as_secs_f64() * 1e3;
    pprof_proto::decode(&body).context("decoding the capture")?;
    // The probes are let go off the session's thread: until their
    // descriptors are back to where they were (5 s at most).
    let by = Instant::now() + Duration::from_secs(5);
    let mut after = figures(daemon)?;
    while after.0 > before.0 && Instant::now() < by {
        std::thread::sleep(Duration::from_millis(50));
        after = figures(daemon)?;
    }
    Ok(OwnRun {
        load_ms,
        answer_ms,
        fds: [before.0, during.0, after.0],
        memlock: [before.1, during.1, after.1],
        rss_kib: [before.2, during.2, after.2],
    })
}

fn own_report(runs: &[(&str, OwnRun)]) -> String {
    let mut out = format!(
        "\n# Probes of a capture's own: a {OWN_SECONDS} s capture of a type the daemon does not \
         collect\n\n\
         A daemon taking CPU samples only (99 Hz, every process), asked for each type in turn \
         of a sleeping process, {ROUNDS} rounds; median (min–max). During: the figure while \
         the capture runs, less the one before it; after: the same once it answered.\n\n\
         | type | load and attach (ms) | answer after (ms) | BPF descriptors during / after | \
         BPF maps during / after (KiB) | daemon RSS during / after (KiB) |\n\
         |---|---|---|---|---|---|\n"
    );
    for kind in OWN_KINDS {
        let of = |f: &dyn Fn(&OwnRun) -> f64| -> Vec<f64> {
            runs.iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, r)| f(r))
                .collect()
        };
        let delta = |v: [u64; 3], i: usize| v[i] as f64 - v[0] as f64;
        let _ = writeln!(
            out,
            "| {kind} | {} | {} | +{:.0} / {:+.0} | +{:.0} / {:+.0} | +{:.0} / {:+.0} |",
            spread(&of(&|r| r.load_ms)),
            spread(&of(&|r| r.answer_ms)),
            median(&of(&|r| delta(r.fds, 1))),
            median(&of(&|r| delta(r.fds, 2))),
            median(&of(&|r| delta(r.memlock, 1) / 1024.0)),
            median(&of(&|r| delta(r.memlock, 2) / 1024.0)),
            median(&of(&|r| delta(r.rss_kib, 1))),
            median(&of(&|r| delta(r.rss_kib, 2))),
        );
    }
    out
}

fn run_once(bin: &Path, burner: &Path, work: &Path, setup: Setup, seconds: u64) -> Result<Run> {
    let out = work.join("profiles");
    let mut args: Vec<String> = vec![
        "--output-dir".into(),
        out.display().to_string(),
        "--cpu-frequency".into(),
        "99".into(),
        "--interval".into(),
        "10s".into(),
    ];
    if !matches!(setup, Setup::Bare | Setup::Daemon) {
        args.extend(["--http-addr".into(), "127.0.0.1:0".into()]);
    }
    let mut daemon = match setup {
        Setup::Bare => None,
        _ => {
            let mut daemon = Daemon::start(bin, &args)?;
            if let Some(why) = daemon.wait_ready()? {
                bail!("profilerd exited: {why}");
            }
            Some(daemon)
        }
    };
    let addr = daemon.as_mut().map(server_address).transpose()?.flatten();
    if setup == Setup::Capture && addr.is_none() {
        bail!("the daemon logged no /debug/pprof address");
    }
    let mut bench = Bench::spawn(burner, &[seconds.to_string()])?;
    let pid = bench.pid();
    let before = daemon
        .as_ref()
        .map(|d| bpftrace_figures(d.pid()))
        .transpose()?;
    let capture = match (setup, addr) {
        (Setup::Capture, Some(addr)) => Some(std::thread::spawn(move || {
            http_get(
                addr,
                &format!("/debug/pprof/profile?seconds={seconds}&pid={pid}&hz={CAPTURE_HZ}"),
            )
        })),
        _ => None,
    };
    if capture.is_some() {
        // Its events open when the session takes the request.
        let opened = format!("pid {pid} for {seconds} s at {CAPTURE_HZ} Hz");
        let by = Instant::now() + Duration::from_secs(10);
        while !daemon
            .as_mut()
            .map(|d| d.drain(Duration::from_millis(50)))
            .unwrap_or_default()
            .iter()
            .any(|l| l.contains(&opened))
        {
            if Instant::now() > by {
                bail!("the capture did not start");
            }
        }
    }
    let perf = match setup {
        Setup::Perf => Some(
            Command::new("perf")
                .args(["record", "-F", &CAPTURE_HZ.to_string(), "-g", "-q", "-o"])
                .arg(work.join("perf.data"))
                .args(["-p", &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting perf record")?,
        ),
        _ => None,
    };
    if perf.is_some() {
        // perf attaches in a few ms; give it the start.
        std::thread::sleep(Duration::from_millis(200));
    }
    bench.go()?;
    let line = bench.line(Duration::from_secs(seconds + 30))?;
    let loops_per_s = parse_loops(&line)?;
    bench.finish()?;
    let captured = match capture {
        Some(handle) => {
            let body = handle
                .join()
                .map_err(|_| anyhow::anyhow!("the capture thread panicked"))??;
            let profile = pprof_proto::decode(&body).context("decoding the capture")?;
            profile
                .sample
                .iter()
                .map(|s| s.value[0].max(0) as u64)
                .sum()
        }
        None => 0,
    };
    let after = daemon
        .as_ref()
        .map(|d| bpftrace_figures(d.pid()))
        .transpose()?;
    let perf_ms = match perf {
        Some(child) => wait_cpu_ms(child.id())?,
        None => 0.0,
    };
    if let Some(daemon) = daemon {
        let (status, _) = daemon.finish(Duration::ZERO)?;
        if !status.success() {
            bail!("profilerd exited with {status}");
        }
    }
    let _ = fs::remove_dir_all(&out);
    let _ = fs::remove_file(work.join("perf.data"));
    let (daemon_ms, bpf_runs, bpf_ms) = match (before, after) {
        (Some(b), Some(a)) => (
            (a.0 - b.0) as f64 / 1e6,
            a.1 - b.1,
            (a.1 as f64 * a.2 - b.1 as f64 * b.2) / 1e6,
        ),
        _ => (0.0, 0, 0.0),
    };
    Ok(Run {
        loops_per_s,
        daemon_ms,
        bpf_runs,
        bpf_ms,
        perf_ms,
        captured,
    })
}

/// The daemon's /debug/pprof address, from its log (logged before it is
/// ready).
fn server_address(daemon: &mut Daemon) -> Result<Option<SocketAddr>> {
    for line in daemon.log() {
        if let Some(rest) = line.split("serving profiles on demand at http://").nth(1) {
            let addr = rest.trim().trim_end_matches("/debug/pprof/");
            return Ok(Some(addr.parse().context("the server's address")?));
        }
    }
    Ok(None)
}

/// GET `path` (HTTP/1.1, the connection closed after): the body of a 200.
fn http_get(addr: SocketAddr, path: &str) -> Result<Vec<u8>> {
    let mut stream = TcpStream::connect(addr)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let head_end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of the response head")?;
    let head = String::from_utf8_lossy(&response[..head_end]);
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(response[head_end + 4..].to_vec())
}

/// Waits for child `pid` and returns its CPU time (user+sys), ms.
fn wait_cpu_ms(pid: u32) -> Result<f64> {
    let mut status = 0;
    // SAFETY: plain data, filled by wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child.
    let ret = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
    if ret < 0 {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    Ok(ms(usage.ru_utime) + ms(usage.ru_stime))
}

/// "loops N seconds S" → loops per second.
fn parse_loops(line: &str) -> Result<f64> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["loops", loops, "seconds", secs] => {
            let (loops, secs): (f64, f64) = (loops.parse()?, secs.parse()?);
            Ok(loops / secs.max(1e-9))
        }
        _ => bail!("unexpected burner output {line:?}"),
    }
}

fn report(runs: &[(Setup, Run)], seconds: u64) -> String {
    let of = |setup: Setup, f: &dyn Fn(&Run) -> f64| -> Vec<f64> {
        runs.iter()
            .filter(|(s, _)| *s == setup)
            .map(|(_, r)| f(r))
            .collect()
    };
    let bare = median(&of(Setup::Bare, &|r| r.loops_per_s));
    let mut out = format!(
        "# Profiles on demand: what a 999 Hz capture costs\n\n\
         One busy thread (a counting burner) for {seconds} s per run, {ROUNDS} rounds of \
         every setup alternated; median (min–max) of the rounds.\n\n\
         | setup | burner's work against bare | daemon CPU (ms) | BPF runs | BPF time (ms) | \
         BPF per run (ns) | perf record CPU (ms) | samples captured |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for setup in Setup::ALL {
        let work = of(setup, &|r| r.loops_per_s / bare.max(1e-9));
        let cpu = of(setup, &|r| r.daemon_ms);
        let runs_ = of(setup, &|r| r.bpf_runs as f64);
        let bpf = of(setup, &|r| r.bpf_ms);
        let per_run = of(setup, &|r| r.bpf_ms * 1e6 / (r.bpf_runs.max(1) as f64));
        let perf = of(setup, &|r| r.perf_ms);
        let captured = of(setup, &|r| r.captured as f64);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {:.0} | {} | {:.0} |",
            setup.name(),
            spread3(&work),
            spread(&cpu),
            median(&runs_),
            spread(&bpf),
            median(&per_run),
            spread(&perf),
            median(&captured),
        );
    }
    out
}

/// `median (min–max)` with three decimals, for ratios near 1.
fn spread3(values: &[f64]) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.3} ({min:.3}–{max:.3})", median(values))
}

/// Builds the counting burner into `work`: after "ready", it waits for a
/// line on stdin, then burns one thread for SECONDS and prints "loops N
/// seconds S".
fn build_counter(work: &Path) -> Result<std::path::PathBuf> {
    build_c(
        work,
        "count_burn",
        COUNTER,
        &["-O2", "-fno-omit-frame-pointer"],
        "the counting burner",
    )
}

const COUNTER: &str = r#"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
__attribute__((noinline)) uint64_t leaf(uint64_t x) {
    for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}
__attribute__((noinline)) uint64_t mid(uint64_t x) { return leaf(x) ^ leaf(x + 1); }
static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    char line[64];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    volatile uint64_t s = 0;
    unsigned long long loops = 0;
    for (;;) {
        for (int k = 0; k < 100; k++) s += mid(s);
        loops += 100;
        double e = since(&t0);
        if (e >= seconds) {
            printf("loops %llu seconds %.6f\n", loops, e);
            fflush(stdout);
            return 0;
        }
    }
}
"#;
