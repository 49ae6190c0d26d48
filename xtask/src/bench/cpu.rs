//! The CPU profile's cost (`cargo xtask bench`): see the module above.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::BenchArgs;
use super::harness::{
    Reaped, bpftrace_figures, build_c, parse_bpf_line, status_field, task_cpu_ns,
};

/// Builds the CPU burner (a loop in two frame-pointer functions, no
/// system calls) into `work`.
pub(super) fn build_burner(work: &Path) -> Result<std::path::PathBuf> {
    build_c(
        work,
        "burn",
        BURNER,
        &["-O2", "-fno-omit-frame-pointer"],
        "the CPU burner",
    )
}

pub fn measure(bin: &Path, work: &Path, out_dir: &Path, args: &BenchArgs) -> Result<String> {
    // Two busy CPUs.
    let burner = build_burner(work)?;
    let burners: Vec<Reaped> = (0..2)
        .map(|_| Command::new(&burner).spawn().map(Reaped))
        .collect::<std::io::Result<_>>()?;

    let window = Duration::from_secs(args.seconds);
    let mut daemon = Reaped(
        Command::new(bin)
            .args([
                "--output-dir",
                &out_dir.to_string_lossy(),
                "--interval",
                &format!("{}s", args.interval),
                "--cpu-frequency",
                "99",
                "--unwind",
                &args.unwind,
            ])
            .stderr(Stdio::piped())
            .spawn()
            .context("starting profilerd")?,
    );
    let pid = daemon.0.id();
    let stderr = daemon.0.stderr.take().context("daemon stderr")?;
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let ready_by = Instant::now() + Duration::from_secs(30);
    loop {
        let line = rx
            .recv_timeout(ready_by.saturating_duration_since(Instant::now()))
            .context("profilerd did not become ready within 30 s")?;
        eprintln!("profilerd: {line}");
        if line.contains("ready") {
            break;
        }
    }
    let daemon_cpu_ready = task_cpu_ns(pid)?;

    let perf_data = work.join("perf.data");
    let perf = Command::new("perf")
        .args(["record", "-F", "99", "-a", "-q"])
        .args(match args.unwind.as_str() {
            "dwarf" => ["--call-graph", "dwarf"],
            _ => ["--call-graph", "fp"],
        })
        .arg("-o")
        .arg(&perf_data)
        .args(["--", "sleep", &args.seconds.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf record")?;
    let perf_pid = perf.id();
    std::mem::forget(perf); // reaped by wait4 below, which gives its rusage
    let bpftrace = Command::new("bpftrace")
        .args(["-e", "profile:hz:99 { @[kstack, ustack] = count(); }"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting bpftrace")?;
    let bpftrace = Reaped(bpftrace);
    let started = Instant::now();
    // The first window pays one-off costs (parsing kallsyms and the debug
    // info of every binary seen); the CPU after it is closed shows the
    // steady state.
    let first_window_by = started + Duration::from_secs(args.interval + 5);
    let mut after_first = None;
    while after_first.is_none() {
        let Ok(line) = rx.recv_timeout(first_window_by.saturating_duration_since(Instant::now()))
        else {
            break;
        };
        eprintln!("profilerd: {line}");
        if line.contains("wrote") {
            after_first = Some((Instant::now(), task_cpu_ns(pid)?));
        }
    }
    std::thread::sleep(window.saturating_sub(started.elapsed()));
    let daemon_cpu_end = task_cpu_ns(pid)?;
    let peak_rss_kib = status_field(pid, "VmHWM:")?;
    let (bt_cpu_ns, bt_runs, bt_ns_per_run) = bpftrace_figures(bpftrace.0.id())?;
    drop(bpftrace); // killed and reaped: nothing is left running
    let perf_cpu_ns = wait_rusage(perf_pid)?;
    let elapsed = started.elapsed();

    // SIGTERM: the daemon writes its last window and logs BPF run stats.
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let mut bpf_line = None;
    let stop_by = Instant::now() + Duration::from_secs(10);
    while let Ok(line) = rx.recv_timeout(stop_by.saturating_duration_since(Instant::now())) {
        if line.contains("bpf program cpu_sample") {
            bpf_line = Some(line.clone());
        }
        eprintln!("profilerd: {line}");
    }
    let status = daemon.0.wait()?;
    let _ = reader.join();
    if !status.success() {
        bail!("profilerd exited with {status}");
    }
    drop(burners);
    let daemon_total_ns = daemon_cpu_end; // whole life until the end of the window
    let files = fs::read_dir(out_dir)?.count();

    let secs = elapsed.as_secs_f64();
    let daemon_ns = (daemon_cpu_end - daemon_cpu_ready) as f64;
    let (after_secs, after_ns) = match after_first {
        Some((at, cpu)) => (
            elapsed.saturating_sub(at - started).as_secs_f64(),
            (daemon_cpu_end - cpu) as f64,
        ),
        None => (0.0, 0.0),
    };
    let daemon_share = daemon_ns / (secs * 1e9) * 100.0;
    let perf_share = perf_cpu_ns as f64 / (secs * 1e9) * 100.0;
    let (runs, ns_per_run) = bpf_line
        .as_deref()
        .and_then(parse_bpf_line)
        .unwrap_or((0, f64::NAN));
    let perf_size = fs::metadata(&perf_data).map(|m| m.len()).unwrap_or(0);
    Ok(format!(
        "| measure | value |\n|---|---|\n\
         | window | {secs:.1} s, 2 busy CPUs, 99 Hz, system-wide, profile every {interval} s, --unwind {unwind} |\n\
         | profilerd CPU, steady state (ready → end of window) | {daemon_ms:.1} ms = {daemon_share:.3}% of one core |\n\
         | profilerd CPU, whole life incl. start-up | {total_ms:.1} ms |\n\
         | perf record -F 99 -a --call-graph {callgraph} CPU (same window, incl. its exit processing) | {perf_ms:.1} ms = {perf_share:.3}% of one core |\n\
         | profilerd / perf record CPU | {ratio:.2} |\n\
         | profilerd peak RSS (VmHWM) | {rss:.1} MiB |\n\
         | BPF cpu_sample runs / time per run | {runs} / {ns_per_run:.0} ns |\n\
         | profilerd CPU per sample, ready → end (drain, unwind, symbolize, write) | {daemon_per_sample:.0} ns |\n\
         | profilerd CPU after the first window ({after_secs:.0} s) | {after_ms:.1} ms = {after_share:.3}% of one core, {after_per_sample:.0} ns per sample |\n\
         | bpftrace `profile:hz:99 {{ @[kstack, ustack] = count(); }}`: CPU / BPF time per run | {bt_ms:.1} ms / {bt_ns_per_run:.0} ns ({bt_runs} runs) |\n\
         | profiles written / perf.data size | {files} / {perf_mib:.1} MiB |\n",
        interval = args.interval,
        unwind = args.unwind,
        callgraph = if args.unwind == "dwarf" {
            "dwarf"
        } else {
            "fp"
        },
        daemon_ms = daemon_ns / 1e6,
        total_ms = daemon_total_ns as f64 / 1e6,
        perf_ms = perf_cpu_ns as f64 / 1e6,
        ratio = daemon_ns / perf_cpu_ns.max(1) as f64,
        rss = peak_rss_kib as f64 / 1024.0,
        daemon_per_sample = daemon_ns / runs.max(1) as f64,
        after_ms = after_ns / 1e6,
        after_share = after_ns / (after_secs.max(1e-9) * 1e9) * 100.0,
        after_per_sample = after_ns / (runs as f64 * after_secs / secs).max(1.0),
        bt_ms = bt_cpu_ns as f64 / 1e6,
        perf_mib = perf_size as f64 / (1024.0 * 1024.0),
    ))
}

/// Waits for a child and returns its user+sys CPU time in ns.
pub(super) fn wait_rusage(pid: u32) -> Result<u64> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers; pid is our own child.
    let ret = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
    if ret < 0 {
        bail!(
            "wait4 on a child failed: {}",
            std::io::Error::last_os_error()
        );
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    Ok(tv(usage.ru_utime) + tv(usage.ru_stime))
}

const BURNER: &str = r#"
#include <stdint.h>
__attribute__((noinline)) uint64_t leaf(uint64_t x) {
    for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}
__attribute__((noinline)) uint64_t mid(uint64_t x) { return leaf(x) ^ leaf(x + 1); }
int main(void) { volatile uint64_t s = 0; for (;;) s += mid(s); }
"#;
