//! `cargo xtask bench --footprint`: what profilerd costs a node by default,
//! system-wide, with `--profiles cpu` and with all five types, on a quiet
//! node (two CPUs kept busy by one small program) and on a busy one (a load
//! this benchmark starts: many distinct, large programs and their
//! libraries started over and over, as on a node that builds and runs real
//! software), side by side with `perf record -F 99 -a -g` over the same
//! window.
//!
//! Per run: time and CPU from start to ready (the daemon's threads'
//! schedstat), threads at ready, CPU after the first window, peak RSS
//! (VmHWM, ring mappings included) and the part of it in BPF ring
//! mappings, the memory the kernel charges for the daemon's BPF maps
//! (memlock from fdinfo, each map once), and from the daemon's exit
//! summary how full its caches got (`cache_peak_bytes` of
//! `cache_budget_bytes`) and how many processes it snapshotted (the busy
//! node's churn).
//!
//! With `--baseline BIN`, each profile set is also run (without its
//! switched-off variants) by that build, right after this one's run, on
//! the same load.

use std::collections::HashSet;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::harness::{Daemon, Reaped, status_field, task_cpu_ns};

/// The runs per node: the profile set, and a `[debug]` switch turned off
/// to compare its memory with the default in the same run.
const SETS: [(&str, Option<&str>); 3] = [
    ("cpu", None),
    ("cpu,heap,block,mutex,offcpu", None),
    ("cpu,heap,block,mutex,offcpu", Some("release_file_pages")),
];
/// One run's figures.
struct Figures {
    /// "this build" or "baseline".
    build: &'static str,
    load: &'static str,
    profiles: &'static str,
    switched_off: Option<&'static str>,
    ready_wall: Duration,
    ready_cpu_ns: u64,
    threads: usize,
    after_first_ns: u64,
    after_first_secs: f64,
    perf_ns: u64,
    window_secs: f64,
    peak_rss_kib: u64,
    ring_rss_kib: u64,
    bpf_bytes: u64,
    /// The exit summary's `cache_peak_bytes`, `cache_budget_bytes` and
    /// `process_snapshots`.
    cache_peak: u64,
    cache_budget: u64,
    snapshots: u64,
}

pub fn measure(bin: &Path, baseline: Option<&Path>, work: &Path, seconds: u64) -> Result<String> {
    let burner = super::cpu::build_burner(work)?;
    let mut runs = Vec::new();
    for load in ["quiet", "busy"] {
        // Two busy CPUs on both: the quiet node's work, under the busy
        // node's load.
        let burners: Vec<Reaped> = (0..2)
            .map(|_| Command::new(&burner).spawn().map(Reaped))
            .collect::<std::io::Result<_>>()?;
        let busy = match load {
            "busy" => Some(BusyLoad::start(work)?),
            _ => None,
        };
        if busy.is_some() {
            // Every program has run once before the daemon starts.
            std::thread::sleep(Duration::from_secs(10));
        }
        for (profiles, off) in SETS {
            eprintln!("footprint: {load} node, --profiles {profiles}, off: {off:?}");
            runs.push(run_once(
                ("this build", bin),
                work,
                load,
                (profiles, off),
                seconds,
            )?);
            if let Some(base) = baseline.filter(|_| off.is_none()) {
                eprintln!("footprint: the same with the baseline {}", base.display());
                runs.push(run_once(
                    ("baseline", base),
                    work,
                    load,
                    (profiles, off),
                    seconds,
                )?);
            }
        }
        drop(busy);
        drop(burners);
    }
    Ok(report(&runs, seconds))
}

fn run_once(
    (build, bin): (&'static str, &Path),
    work: &Path,
    load: &'static str,
    (profiles, switched_off): (&'static str, Option<&'static str>),
    seconds: u64,
) -> Result<Figures> {
    let out = work.join(format!("footprint-{load}-{}", profiles.len()));
    let mut args: Vec<String> = vec![
        "--profiles".into(),
        profiles.into(),
        "--interval".into(),
        "10s".into(),
        "--output-dir".into(),
        out.to_string_lossy().into_owned(),
    ];
    if let Some(switch) = switched_off {
        let config = work.join(format!("footprint-{switch}.toml"));
        fs::write(&config, format!("[debug]\n{switch} = false\n"))?;
        args.extend(["--config".into(), config.to_string_lossy().into_owned()]);
    }
    let started = Instant::now();
    let mut daemon = Daemon::start(bin, &args)?;
    if let Some(reason) = daemon.wait_ready()? {
        bail!("profilerd --profiles {profiles} did not start: {reason}");
    }
    let ready_wall = started.elapsed();
    let pid = daemon.pid();
    let ready_cpu_ns = task_cpu_ns(pid)?;
    let threads = fs::read_dir(format!("/proc/{pid}/task"))?.count();

    let perf = Command::new("perf")
        .args(["record", "-F", "99", "-a", "-g", "-q", "-o"])
        .arg(work.join("footprint-perf.data"))
        .args(["--", "sleep", &seconds.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf record")?;
    let perf_pid = perf.id();
    // Reaped by wait4 below, which gives its CPU time.
    std::mem::forget(perf);
    let window_start = Instant::now();
    // The first window pays one-off costs (kallsyms, the debug info of each
    // binary seen); the CPU after it is the steady state.
    let mut after_first = None;
    while after_first.is_none() && window_start.elapsed() < Duration::from_secs(seconds) {
        for line in daemon.drain(Duration::from_millis(200)) {
            if after_first.is_none() && line.contains("wrote ") {
                after_first = Some((Instant::now(), task_cpu_ns(pid)?));
            }
        }
    }
    std::thread::sleep(Duration::from_secs(seconds).saturating_sub(window_start.elapsed()));
    let end_cpu = task_cpu_ns(pid)?;
    let window_secs = window_start.elapsed().as_secs_f64();
    let peak_rss_kib = status_field(pid, "VmHWM:")?;
    let ring_rss_kib = ring_rss_kib(pid)?;
    let bpf_bytes = bpf_memlock(pid)?;
    let perf_ns = super::cpu::wait_rusage(perf_pid)?;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let (status, log) = daemon.finish(Duration::from_secs(20))?;
    if !status.success() {
        bail!("profilerd --profiles {profiles} exited with {status}");
    }
    let summary = |key: &str| summary_field(&log, key);
    let (cache_peak, cache_budget, snapshots) = (
        summary("cache_peak_bytes")?,
        summary("cache_budget_bytes")?,
        summary("process_snapshots")?,
    );
    let _ = fs::remove_dir_all(&out);
    let (after_first_ns, after_first_secs) = match after_first {
        Some((at, cpu)) => (end_cpu.saturating_sub(cpu), at.elapsed().as_secs_f64()),
        None => (0, 0.0),
    };
    Ok(Figures {
        build,
        load,
        profiles,
        switched_off,
        ready_wall,
        ready_cpu_ns,
        threads,
        after_first_ns,
        after_first_secs,
        perf_ns,
        window_secs,
        peak_rss_kib,
        ring_rss_kib,
        bpf_bytes,
        cache_peak,
        cache_budget,
        snapshots,
    })
}

/// Field `key=N` of the exit summary in the daemon's `log`.
fn summary_field(log: &[String], key: &str) -> Result<u64> {
    log.iter()
        .rev()
        .filter(|l| l.contains(" summary "))
        .find_map(|l| super::waits::summary_field(l, key))
        .with_context(|| format!("no {key}= in the daemon's exit summary"))
}

/// Resident memory of the daemon's BPF ring mappings (`anon_inode:bpf-map`
/// in smaps).
fn ring_rss_kib(pid: u32) -> Result<u64> {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut total = 0;
    let mut in_ring = false;
    for line in smaps.lines() {
        if let Some(first) = line.split_whitespace().next()
            && first.contains('-')
            && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        {
            in_ring = line.contains("bpf-map") || line.contains("bpf-ringbuf");
            continue;
        }
        if in_ring && let Some(rest) = line.strip_prefix("Rss:") {
            total += rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

/// What the kernel charges for the daemon's BPF maps: memlock of each map
/// (by id) once, from its descriptors' fdinfo.
pub(super) fn bpf_memlock(pid: u32) -> Result<u64> {
    let mut seen = HashSet::new();
    let mut total = 0;
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = fs::read_to_string(entry?.path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(bytes)) = (field("map_id:"), field("memlock:"))
            && seen.insert(id)
        {
            total += bytes;
        }
    }
    Ok(total)
}

/// The busy node's load: `tests/workloads/busy_node.sh` (shared with the
/// memory-limit test), which runs large programs found on the machine two
/// at a time, over and over; stopped (its whole process group) when
/// dropped.
struct BusyLoad {
    shell: Reaped,
}

impl BusyLoad {
    fn start(work: &Path) -> Result<BusyLoad> {
        let script = crate::root().join("tests/workloads/busy_node.sh");
        eprintln!("footprint: busy load {}", script.display());
        let mut cmd = Command::new("sh");
        cmd.arg(&script)
            .current_dir(work)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // Its own process group, so that the whole loop can be stopped.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        Ok(BusyLoad {
            shell: Reaped(cmd.spawn().context("starting the busy load")?),
        })
    }
}

impl Drop for BusyLoad {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this load leads.
        unsafe { libc::kill(-(self.shell.0.id() as i32), libc::SIGKILL) };
    }
}

fn report(runs: &[Figures], seconds: u64) -> String {
    let mut out = format!(
        "# Footprint\n\nCommand: `cargo xtask bench --footprint` ({seconds} s per run). \
         System-wide, default settings (99 Hz), 10 s windows, two CPUs kept busy; \
         the busy node also runs `tests/workloads/busy_node.sh`.\n\n\
         | build | node | --profiles | start → ready | CPU to ready | threads at ready | CPU after the first window | perf record -F 99 -a -g | profilerd / perf | peak RSS (VmHWM) | of which ring mappings | BPF maps (memlock) | caches at most (of budget) | processes snapshotted |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in runs {
        let share = r.after_first_ns as f64 / (r.after_first_secs.max(1e-9) * 1e9) * 100.0;
        let perf_share = r.perf_ns as f64 / (r.window_secs * 1e9) * 100.0;
        out += &format!(
            "| {} | {} | {} | {:.0} ms | {:.1} ms | {} | {:.3}% of a core | {:.3}% | {:.2} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB ({:.0}%) | {} |\n",
            r.build,
            r.load,
            match r.switched_off {
                Some(switch) => format!("{} (`{switch} = false`)", r.profiles),
                None => r.profiles.to_string(),
            },
            r.ready_wall.as_secs_f64() * 1e3,
            r.ready_cpu_ns as f64 / 1e6,
            r.threads,
            share,
            perf_share,
            share / perf_share.max(1e-9),
            r.peak_rss_kib as f64 / 1024.0,
            r.ring_rss_kib as f64 / 1024.0,
            r.bpf_bytes as f64 / (1024.0 * 1024.0),
            r.cache_peak as f64 / (1024.0 * 1024.0),
            r.cache_peak as f64 / r.cache_budget.max(1) as f64 * 100.0,
            r.snapshots,
        );
    }
    out
}
