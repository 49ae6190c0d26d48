//! `cargo xtask vm --costs`: what each mechanism costs the profiled program
//! on each kernel of the matrix, where the mechanism differs from the
//! host's: the heap profile on perf-event uprobes (no uprobe sessions
//! before 6.13), condition variables and Go parks on per-function
//! perf-event uprobes (no uprobe_multi before 6.6), futex waits without the
//! futex2 tracepoints (before 6.7). Inside one VM the programs of
//! `xtask/bench/` (heap.c: malloc+free pairs; waits.c: futex and condition
//! variable round trips) are timed with nothing attached and under each
//! setup, with the kernel's BPF run-time statistics on; emulation makes the
//! absolute figures meaningless, so the report gives ratios to the bare run
//! of the same VM and the BPF time per run side by side.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;

/// Where the cost programs go in the VM.
const BENCH_DIR: &str = "/bench";
/// malloc(64)+free pairs per timed batch, and batches.
const HEAP_PAIRS: u32 = 20_000;
/// Milliseconds of round trips per timed batch.
const TRIP_MS: u32 = 500;
const REPS: u32 = 5;

/// The BPF programs whose time per run the report gives.
const MECHANISM_PROGRAMS: &[&str] = &[
    "heap_probe:",
    "futex_enter:",
    "futex_exit:",
    "sched_switch:",
    "cond_wait_probe:",
    "go_park_probe:",
];

/// One setup: its name, the environment profilerd runs with, its profile
/// types (`none`: no profilerd) and the program with its arguments.
struct Setup {
    name: &'static str,
    env: &'static str,
    profiles: &'static str,
    program: &'static str,
}

const SETUPS: &[Setup] = &[
    Setup {
        name: "heap bare",
        env: "",
        profiles: "none",
        program: "heap pairs",
    },
    Setup {
        name: "heap profiled",
        env: "",
        profiles: "heap",
        program: "heap pairs",
    },
    Setup {
        name: "futex bare",
        env: "",
        profiles: "none",
        program: "waits pingpong",
    },
    Setup {
        name: "futex block,mutex",
        env: "",
        profiles: "block,mutex",
        program: "waits pingpong",
    },
    Setup {
        name: "futex block,mutex without futex2 tracepoints",
        env: "PROFILERD_PRETEND_MISSING=futex2_tracepoints",
        profiles: "block,mutex",
        program: "waits pingpong",
    },
    Setup {
        name: "futex offcpu",
        env: "",
        profiles: "offcpu",
        program: "waits pingpong",
    },
    Setup {
        name: "cond bare",
        env: "",
        profiles: "none",
        program: "waits condpingpong",
    },
    Setup {
        name: "cond block,mutex",
        env: "",
        profiles: "block,mutex",
        program: "waits condpingpong",
    },
    Setup {
        name: "cond block,mutex on perf-event uprobes",
        env: "PROFILERD_PRETEND_MISSING=uprobe_multi",
        profiles: "block,mutex",
        program: "waits condpingpong",
    },
];

/// Builds the cost programs statically into `target/vm/bench/`; returns
/// the files for the VM and the script.
pub fn prepare(root: &Path) -> Result<(Vec<(PathBuf, PathBuf)>, String)> {
    let out = root.join("target/vm/bench");
    std::fs::create_dir_all(&out)?;
    let mut files = Vec::new();
    for name in ["heap", "waits"] {
        let exe = out.join(name);
        crate::run(
            std::process::Command::new("gcc")
                .args(["-O2", "-pthread", "-static", "-o"])
                .arg(&exe)
                .arg(root.join(format!("xtask/bench/{name}.c"))),
        )?;
        files.push((exe, Path::new(BENCH_DIR).join(name)));
    }
    Ok((files, script()))
}

/// The script: BPF statistics on, then each setup in turn between markers;
/// profilerd (system-wide) is started first and must say it is ready, the
/// program is released a few seconds later (attaching to a new process
/// takes a moment under emulation), and profilerd's exit log gives the BPF
/// time per run of each program.
pub fn script() -> String {
    let mut s = String::from(
        "echo 1 > /proc/sys/kernel/bpf_stats_enabled\n\
         run() {\n\
         \x20 name=$1; env=$2; profiles=$3; shift 3\n\
         \x20 d=\n\
         \x20 if [ \"$profiles\" != none ]; then\n\
         \x20   env $env profilerd --profiles \"$profiles\" --interval 60s --output-dir /tmp/costs >/tmp/costs.log 2>&1 &\n\
         \x20   d=$!\n\
         \x20   i=0\n\
         \x20   until grep -q 'ready:' /tmp/costs.log || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done\n\
         \x20 fi\n\
         \x20 echo \"@@cost begin $name\"\n\
         \x20 (sleep 3; echo go) | \"$@\"\n\
         \x20 if [ -n \"$d\" ]; then kill -TERM $d; wait $d; grep 'bpf program' /tmp/costs.log; fi\n\
         \x20 echo \"@@cost end $name\"\n\
         \x20 rm -rf /tmp/costs /tmp/costs.log\n\
         }\n",
    );
    for setup in SETUPS {
        let args = if setup.program.starts_with("heap") {
            format!("{HEAP_PAIRS} 0 {REPS}")
        } else {
            format!("{TRIP_MS} {REPS} -1")
        };
        let _ = writeln!(
            s,
            "run '{}' '{}' '{}' {BENCH_DIR}/{} {args}",
            setup.name, setup.env, setup.profiles, setup.program
        );
    }
    s
}

/// What one setup measured.
#[derive(Debug, Default, PartialEq)]
pub struct Measured {
    pub name: String,
    /// ns per operation (malloc+free pair, or round trip) of each batch.
    pub per_op_ns: Vec<f64>,
    /// `bpf program NAME: N runs, M ns per run` lines of profilerd's log.
    pub programs: Vec<String>,
}

/// The setups' figures in the script's output.
pub fn parse(output: &str) -> Vec<Measured> {
    let mut all = Vec::new();
    let mut current: Option<Measured> = None;
    for line in output.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("@@cost begin ") {
            current = Some(Measured {
                name: name.to_string(),
                ..Measured::default()
            });
        } else if line.starts_with("@@cost end ") {
            all.extend(current.take());
        } else if let Some(m) = current.as_mut() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                // heap.c: "64 NS" per batch (ns per pair).
                ["64", ns] => m.per_op_ns.extend(ns.parse::<f64>().ok()),
                // waits.c: "pingpong TRIPS NS ...": elapsed ns of the batch.
                ["pingpong", trips, ns, ..] => {
                    if let (Ok(t), Ok(ns)) = (trips.parse::<f64>(), ns.parse::<f64>())
                        && t > 0.0
                    {
                        m.per_op_ns.push(ns / t);
                    }
                }
                _ => {
                    if let Some(at) = line.find("bpf program ") {
                        m.programs.push(line[at..].to_string());
                    }
                }
            }
        }
    }
    all
}

/// A markdown table of one kernel's figures: per setup, the median ns per
/// operation, its ratio to the bare run of the same program, and the BPF
/// programs' time per run.
pub fn table(measured: &[Measured]) -> String {
    let median = |v: &[f64]| crate::bench::harness::median(v);
    let mut t = String::from(
        "| setup | ns per op (median of batches) | × bare | BPF programs (runs, ns per run) |\n\
         |---|---|---|---|\n",
    );
    for m in measured {
        let family = m.name.split(' ').next().unwrap_or_default();
        let bare = measured
            .iter()
            .find(|b| b.name == format!("{family} bare"))
            .map(|b| median(&b.per_op_ns));
        let own = median(&m.per_op_ns);
        let ratio = bare.map_or("".to_string(), |b| format!("{:.2}", own / b));
        // The programs of the mechanisms compared; the process-tracking ones
        // run a few times per setup.
        let programs: Vec<String> = m
            .programs
            .iter()
            .map(|p| p.trim_start_matches("bpf program ").to_string())
            .filter(|p| MECHANISM_PROGRAMS.iter().any(|name| p.starts_with(name)))
            .collect();
        let _ = writeln!(
            t,
            "| {} | {own:.0} | {ratio} | {} |",
            m.name,
            programs.join("; ")
        );
    }
    t
}

/// The setups the script runs, by name (for checking that each reported).
pub fn missing(measured: &[Measured]) -> Vec<&'static str> {
    SETUPS
        .iter()
        .map(|s| s.name)
        .filter(|n| {
            !measured
                .iter()
                .any(|m| m.name == *n && !m.per_op_ns.is_empty())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_read_back_per_setup() {
        let out = "@@cost begin heap bare\nready\n64 100.0\n64 110.0\n64 90.0\n@@cost end heap bare\n\
                   @@cost begin heap profiled\n64 300.0\n[ 1.0] x INFO profilerd::session: bpf program heap_probe: 40 runs, 900 ns per run\n@@cost end heap profiled\n\
                   @@cost begin futex bare\npingpong 1000 2000000 1 2 3 4 5\n@@cost end futex bare\n";
        let m = parse(out);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].per_op_ns, [100.0, 110.0, 90.0]);
        assert_eq!(
            m[1].programs,
            ["bpf program heap_probe: 40 runs, 900 ns per run"]
        );
        assert_eq!(m[2].per_op_ns, [2000.0]);
        let t = table(&m);
        assert!(
            t.contains("| heap profiled | 300 | 3.00 | heap_probe: 40 runs, 900 ns per run |"),
            "{t}"
        );
        assert!(missing(&m).contains(&"cond bare"));
        assert!(!missing(&m).contains(&"heap bare"));
    }

    #[test]
    fn the_script_runs_every_setup() {
        let s = script();
        for setup in SETUPS {
            assert!(
                s.contains(&format!("run '{}'", setup.name)),
                "{}",
                setup.name
            );
        }
        assert!(s.starts_with("echo 1 > /proc/sys/kernel/bpf_stats_enabled"));
    }
}
