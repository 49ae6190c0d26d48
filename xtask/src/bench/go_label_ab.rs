//! `cargo xtask bench --go --go-tables labels`: what reading a goroutine's
//! pprof labels costs a CPU sample, measured in one run of one process.
//! Separate daemons' runs of the same program differ by more than the
//! reading costs (the CPU sample program's mean time per run moved 2.8 to
//! 11.4 µs between identical runs on this VM), so here one daemon profiles
//! one `go_handlers.go` and the labels are switched on and off under it,
//! half-second by half-second (A B B A, so that a drift counts for both
//! alike), by
//! rewriting the process's entry in the daemon's `FP_PROCESSES` map (its
//! label form, `NONE` when off) with bpftool; the CPU sample program's
//! run count and time (the kernel's run-time statistics) are read at
//! every switch. The difference of the two conditions' time per run,
//! over the labeled samples' share of the runs, is the reading's cost per
//! labeled sample.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::harness::{Daemon, median, spread};

/// Seconds before the first phase (the daemon marks the process, the
/// workload warms up), labels off.
const WARM_UP_S: u64 = 2;
/// One phase's length: short, so that the pairs compared lie close in
/// time (the program's time per run drifts by a factor of two over
/// seconds here), long enough for some 250 samples per CPU.
const PHASE_MS: u64 = 500;
/// Offset of `labels_form` in `FpProcess` (text_start, text_end, then
/// `GoRuntime`'s g_m, m_curg, g_labels, g_status: u16 each). xtask does
/// not build profiler-common; the bench fails if samples are labeled with
/// this byte cleared, so a move shows.
const LABELS_FORM_AT: usize = 24;

/// The table: per Go, the time per `cpu_sample` run with the labels read
/// and not, and the difference per labeled sample.
pub fn measure(
    root: &Path,
    bin: &Path,
    work: &Path,
    seconds: u64,
    gos: &[(&str, std::path::PathBuf)],
) -> Result<String> {
    crate::apt_install(&["bpftool"])?;
    let phases = (seconds * 1000 / PHASE_MS).max(8) / 4 * 4;
    let mut out = format!(
        "\nLabel reading in one run: `go_handlers.go` under `profilerd --pid P \
         --cpu-frequency {hz}`, its labels read and not read in {phases} alternated \
         phases of {PHASE_MS} ms (A B B A; the process's `FP_PROCESSES` entry rewritten with \
         bpftool), `cpu_sample`'s run count and time read at each switch. Time per \
         run over each condition's phases together; the difference per run, and per \
         labeled sample (the difference times the runs with labels on over the \
         samples labeled); beside it the median (min–max) of the differences of \
         adjacent on and off phases.\n\n\
         | Go | ns/run, labels read | ns/run, not read | difference per run | runs with labels on | labeled samples | difference per labeled sample | adjacent phases' differences per run | timed in the kernel: per labeled sample | per Go sample, labels not read | reading's own time |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        hz = super::go::HZ,
    );
    // Each run also times the reading in the kernel (`[debug]
    // time_go_labels`): its own time, apart from the rest of the sample.
    // And the labels' words read one by one (the goroutine, its M, the M's
    // goroutine; a label map's bucket every time) rather than the
    // goroutine at once and a map known by its header: what that saves.
    let config = |name: &str, text: &str| -> Result<String> {
        let path = work.join(name);
        std::fs::write(&path, text).context("writing a config")?;
        Ok(path.to_string_lossy().into_owned())
    };
    let timed = config("go-labels-timed.toml", "[debug]\ntime_go_labels = true\n")?;
    let one_by_one = config(
        "go-labels-timed-one-by-one.toml",
        "[debug]\ntime_go_labels = true\ngo_labels_one_read = false\ngo_label_map_cache = false\n",
    )?;
    for (version, go) in gos {
        for (how, extra) in [
            ("", &["--config", timed.as_str()][..]),
            (", read one by one", &["--config", one_by_one.as_str()][..]),
        ] {
            let version = format!("{version}{how}");
            eprintln!("bench --go: label reading A/B, {version}");
            let exe = super::go::build(go, root, work, "go_handlers.go")?;
            let run = one_run(&exe, bin, work, phases, extra)?;
            let per_run = |(runs, ns): (u64, u64)| ns as f64 / runs.max(1) as f64;
            let (on, off) = (per_run(run.on), per_run(run.off));
            let labeled_share = run.labeled as f64 / run.on.0.max(1) as f64;
            // Timed: with labels on, every Go sample's reading (the
            // labeled ones and any of goroutines without labels); with
            // them off, the timer's own cost and the form check.
            let timed = |(ns, reads): (u64, u64)| ns as f64 / reads.max(1) as f64;
            let (timed_on, timed_off) = (timed(run.timed_on), timed(run.timed_off));
            let timed_per_labeled = run.timed_on.0 as f64 / run.labeled.max(1) as f64;
            out += &format!(
                "| {version} | {on:.0} | {off:.0} | {:+.0} ns | {} | {} | {:+.0} ns | {} ns | {timed_per_labeled:.0} ns | {timed_off:.0} ns | {:.0} ns |\n",
                on - off,
                run.on.0,
                run.labeled,
                (on - off) / labeled_share.max(f64::MIN_POSITIVE),
                spread(&run.pair_differences),
                timed_on - timed_off,
            );
            eprintln!(
                "bench --go: {version}: {on:.0} against {off:.0} ns per run, pairs {:.0}",
                median(&run.pair_differences)
            );
        }
    }
    Ok(out)
}

/// What one A/B run measured.
struct AbRun {
    /// (runs, ns) summed over the phases with labels read.
    on: (u64, u64),
    /// The same with labels not read.
    off: (u64, u64),
    /// Samples the kernel labeled in the phases with labels on.
    labeled: u64,
    /// Per pair of adjacent phases, on minus off, ns per run.
    pair_differences: Vec<f64>,
    /// (ns, readings) the kernel timed with labels on, and off.
    timed_on: (u64, u64),
    timed_off: (u64, u64),
}

fn one_run(exe: &Path, bin: &Path, work: &Path, phases: u64, extra: &[&str]) -> Result<AbRun> {
    let own = work.join("own.pprof");
    let seconds = WARM_UP_S + 2 + phases * (PHASE_MS + 50) / 1000;
    let own_arg = own.to_string_lossy().into_owned();
    let (mut child, mut stdout) = super::go::start_workload(exe, seconds, &[&own_arg], None)?;
    let pid = child.0.id();
    let out = work.join("go-profiles");
    let args: Vec<String> = [
        "--pid",
        &pid.to_string(),
        "--interval",
        "10s",
        "--cpu-frequency",
        super::go::HZ,
        "--output-dir",
        &out.to_string_lossy(),
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    let mut daemon = Daemon::start(bin, &args)?;
    if let Some(reason) = daemon.wait_ready()? {
        bail!("profilerd did not start: {reason}");
    }
    // The daemon marks the Go processes that ran before it after READY,
    // and may mark one again meanwhile: the entry is read once it has.
    std::thread::sleep(Duration::from_secs(1));
    let ids = DaemonObjects::find(daemon.pid())?;
    let key = pid.to_le_bytes();
    let mut entry = ids.lookup(&key)?;
    let form = entry[LABELS_FORM_AT];
    if form == 0 {
        bail!("the workload's FP_PROCESSES entry has no label form: not read as Go");
    }
    let mut set_labels = |on: bool| -> Result<()> {
        entry[LABELS_FORM_AT] = if on { form } else { 0 };
        ids.update(&key, &entry)
    };
    set_labels(false)?;
    child
        .0
        .stdin
        .take()
        .context("workload stdin")?
        .write_all(b"g")?;
    std::thread::sleep(Duration::from_secs(WARM_UP_S));
    let (mut on, mut off) = ((0u64, 0u64), (0u64, 0u64));
    let mut by_phase = Vec::new();
    let (mut labeled, mut labeled_off) = (0, 0);
    let (mut timed_on, mut timed_off) = ((0, 0), (0, 0));
    let read_counters = || -> Result<[u64; 3]> {
        Ok([
            ids.counter(GO_LABELED_SAMPLES)?,
            ids.counter(GO_LABEL_READ_NS)?,
            ids.counter(GO_LABEL_READS)?,
        ])
    };
    for phase in 0..phases {
        // A B B A: on, off, off, on. A phase counts from after its switch
        // to its end, so that no sample of one condition counts for the
        // other.
        let labels = matches!(phase % 4, 0 | 3);
        set_labels(labels)?;
        let before = (ids.cpu_sample_stats()?, read_counters()?);
        std::thread::sleep(Duration::from_millis(PHASE_MS));
        let now = (ids.cpu_sample_stats()?, read_counters()?);
        let delta = (now.0.0 - before.0.0, now.0.1 - before.0.1);
        let [l, ns, reads] = [0, 1, 2].map(|i| now.1[i] - before.1[i]);
        if labels {
            labeled += l;
            timed_on = (timed_on.0 + ns, timed_on.1 + reads);
        } else {
            labeled_off += l;
            timed_off = (timed_off.0 + ns, timed_off.1 + reads);
        }
        let sum = if labels { &mut on } else { &mut off };
        sum.0 += delta.0;
        sum.1 += delta.1;
        eprintln!(
            "bench --go: phase {phase}, labels {}: {} runs, {} ns",
            if labels { "on" } else { "off" },
            delta.0,
            delta.1
        );
        by_phase.push((labels, delta.1 as f64 / delta.0.max(1) as f64));
    }
    set_labels(false)?;
    let mut report = String::new();
    stdout.read_line(&mut report)?;
    let status = child.0.wait()?;
    if !status.success() {
        bail!("{} exited with {status}", exe.display());
    }
    let (status, _) = daemon.finish(Duration::from_secs(20))?;
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_file(&own);
    if !status.success() {
        bail!("profilerd exited with {status}");
    }
    if labeled == 0 || labeled_off > 0 {
        bail!(
            "{labeled} samples labeled with the labels on, {labeled_off} with them off \
             (expected some and none)"
        );
    }
    // Adjacent phases: (0, 1) and (2, 3) of each A B B A.
    let pair_differences = by_phase
        .chunks(2)
        .filter_map(|pair| match pair {
            [(true, a), (false, b)] => Some(a - b),
            [(false, b), (true, a)] => Some(a - b),
            _ => None,
        })
        .collect();
    Ok(AbRun {
        on,
        off,
        labeled,
        pair_differences,
        timed_on,
        timed_off,
    })
}

/// The daemon's CPU sample program and `FP_PROCESSES` map, by id: found
/// among the descriptors the daemon holds, so that another profiler's
/// programs of the same names are left alone.
struct DaemonObjects {
    cpu_sample: u64,
    fp_processes: u64,
    counters: u64,
}

impl DaemonObjects {
    fn find(daemon: u32) -> Result<Self> {
        let (mut progs, mut maps) = (Vec::new(), Vec::new());
        for entry in std::fs::read_dir(format!("/proc/{daemon}/fdinfo"))? {
            let text = std::fs::read_to_string(entry?.path()).unwrap_or_default();
            for line in text.lines() {
                if let Some(id) = line.strip_prefix("prog_id:") {
                    progs.extend(id.trim().parse::<u64>().ok());
                } else if let Some(id) = line.strip_prefix("map_id:") {
                    maps.extend(id.trim().parse::<u64>().ok());
                }
            }
        }
        let named = |kind: &str, ids: &[u64], name: &str| -> Result<u64> {
            for &id in ids {
                let shown = bpftool(&[kind, "show", "id", &id.to_string()])?;
                if shown["name"] == name {
                    return Ok(id);
                }
            }
            bail!("profilerd (pid {daemon}) holds no {kind} named {name}")
        };
        Ok(Self {
            cpu_sample: named("prog", &progs, "cpu_sample")?,
            fp_processes: named("map", &maps, "FP_PROCESSES")?,
            counters: named("map", &maps, "COUNTERS")?,
        })
    }

    /// (runs, ns) of the CPU sample program so far.
    fn cpu_sample_stats(&self) -> Result<(u64, u64)> {
        let shown = bpftool(&["prog", "show", "id", &self.cpu_sample.to_string()])?;
        let field = |name: &str| {
            shown[name]
                .as_u64()
                .with_context(|| format!("bpftool shows no {name} (kernel.bpf_stats_enabled?)"))
        };
        Ok((field("run_cnt")?, field("run_time_ns")?))
    }

    /// The kernel's counter `index` so far (`COUNTERS`, summed over the
    /// CPUs). Labeled samples are counted by phase, not from the daemon's
    /// summary: a new thread of the workload has the daemon mark its
    /// process again, labels on, outside the phases.
    fn counter(&self, index: u32) -> Result<u64> {
        let found = map_lookup(self.counters, &index.to_le_bytes())?;
        let mut total = 0;
        for cpu in found["values"]
            .as_array()
            .context("bpftool's lookup has no values")?
        {
            let bytes = byte_list(&cpu["value"])?;
            total += u64::from_le_bytes(bytes.try_into().ok().context("a counter's 8 bytes")?);
        }
        Ok(total)
    }

    fn lookup(&self, key: &[u8]) -> Result<Vec<u8>> {
        byte_list(&map_lookup(self.fp_processes, key)?["value"])
    }

    fn update(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let id = self.fp_processes.to_string();
        let (key, value) = (hex_words(key), hex_words(value));
        let mut args = vec!["map", "update", "id", &id, "key", "hex"];
        args.extend(key.iter().map(String::as_str));
        args.push("value");
        args.push("hex");
        args.extend(value.iter().map(String::as_str));
        let status = Command::new("bpftool")
            .args(&args)
            .status()
            .context("running bpftool")?;
        if !status.success() {
            bail!("bpftool map update failed ({status})");
        }
        Ok(())
    }
}

/// `profiler_common::counter`'s GO_LABELED_SAMPLES, GO_LABEL_READ_NS and
/// GO_LABEL_READS (xtask does not depend on the shared crate; the bench
/// fails if no sample is labeled, which a moved index would show as).
const GO_LABELED_SAMPLES: u32 = 25;
const GO_LABEL_READ_NS: u32 = 33;
const GO_LABEL_READS: u32 = 34;

/// bpftool's answer for `key` in map `id`.
fn map_lookup(id: u64, key: &[u8]) -> Result<serde_json::Value> {
    let id = id.to_string();
    let key = hex_words(key);
    let mut args = vec!["map", "lookup", "id", &id, "key", "hex"];
    args.extend(key.iter().map(String::as_str));
    bpftool(&args)
}

/// bpftool's bytes ("0x1f", ...) of a key or value.
fn byte_list(value: &serde_json::Value) -> Result<Vec<u8>> {
    value
        .as_array()
        .context("bpftool's lookup has no bytes")?
        .iter()
        .map(|b| {
            let b = b.as_str().context("a byte")?;
            u8::from_str_radix(b.trim_start_matches("0x"), 16).context("a byte")
        })
        .collect()
}

fn hex_words(bytes: &[u8]) -> Vec<String> {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `bpftool -j ARGS`, its JSON answer.
fn bpftool(args: &[&str]) -> Result<serde_json::Value> {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .context("running bpftool")?;
    if !out.status.success() {
        bail!(
            "bpftool {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("reading bpftool's JSON")
}
