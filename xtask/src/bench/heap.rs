//! `cargo xtask bench --heap`: what heap profiling costs the profiled
//! program, against empty uprobes on the same instructions, and what the
//! daemon costs with a million sampled live allocations.
//!
//! A C program (xtask/bench/heap.c) times malloc+free pairs, 64 B and a
//! fixed mix of 16..4096 B, under each setup in turn; the setups alternate
//! over several rounds, a fresh process each time:
//! - nothing attached;
//! - empty uprobes on malloc and on free at the instructions profilerd
//!   probes (the first that the kernel emulates): the floor any uprobe-based
//!   heap profiler pays; and the same with return probes on malloc, and on
//!   malloc and free, to tell what a profiler's return probes cost;
//! - bpftrace's empty probes on both entries, where free's first
//!   instruction is single-stepped (what placement saves);
//! - profilerd --profiles heap at the default rate, on uprobe sessions
//!   (Linux 6.13) and on the perf-event uprobes of older kernels (an entry
//!   and a return probe on every allocation function), told to pretend
//!   sessions are missing.
//!
//! Timed rounds run with kernel.bpf_stats_enabled off, as its clock reads
//! add to every probe hit; one more round with it on gives the BPF run
//! counts and times.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench::harness::{
    Bench, Daemon, Reaped, bpf_program_lines, bpftrace_figures, median, message, set_bpf_stats,
    spread, status_field, task_cpu_ns,
};
use crate::empty_uprobe::EmptyProbes;

mod report;

use report::*;

const SOURCE: &str = include_str!("../../bench/heap.c");
/// Timed rounds; each runs every setup once.
const ROUNDS: usize = 7;
/// Timed batches per process and workload.
const REPS: usize = 3;
const LIVE_OBJECTS: u64 = 1_000_000;
const LIVE_INTERVAL_S: u64 = 5;
/// profilerd's default --heap-sample-bytes (Go's MemProfileRate).
const DEFAULT_RATE: u64 = 524_288;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const OUTPUT_TIMEOUT: Duration = Duration::from_secs(120);
/// Makes the daemon attach as on a kernel without uprobe sessions.
const PRETEND: &str = "PROFILERD_PRETEND_MISSING";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Bare,
    Empty,
    EmptyRetMalloc,
    EmptyRetBoth,
    BpftraceOffset,
    BpftraceEntry,
    Profilerd,
    ProfilerdPerfEvent,
}

impl Setup {
    fn label(self, libc: &Libc, bpftrace_free: &str) -> String {
        let free_n = libc.free.delta();
        match self {
            Setup::Bare => "no profiler".into(),
            Setup::Empty => format!("empty uprobes: malloc+0, free+{free_n}"),
            Setup::EmptyRetMalloc => {
                format!("empty uprobes: malloc+0, free+{free_n}; uretprobe on malloc")
            }
            Setup::EmptyRetBoth => format!(
                "empty uprobes: malloc+0, free+{free_n}; uretprobes on malloc and free \
                 (free's at +{free_n})"
            ),
            Setup::BpftraceOffset => {
                format!("bpftrace `uprobe:LIBC:malloc {{}} uprobe:LIBC:{bpftrace_free} {{}}`")
            }
            Setup::BpftraceEntry => {
                "bpftrace `uprobe:LIBC:malloc {} uprobe:LIBC:free {}` (free+0, single-stepped)"
                    .into()
            }
            Setup::Profilerd => format!(
                "profilerd --profiles heap (--heap-sample-bytes {DEFAULT_RATE}, the default)"
            ),
            Setup::ProfilerdPerfEvent => format!(
                "profilerd --profiles heap on perf-event uprobes, as before Linux 6.13 \
                 ({PRETEND}=uprobe_session)"
            ),
        }
    }

    /// Pairs per timed batch (64 B, mixed): 0.05 to 0.3 s each.
    fn pairs(self) -> (u64, u64) {
        match self {
            Setup::Bare => (10_000_000, 4_000_000),
            // About 15 us per pair: free's entry is single-stepped.
            Setup::BpftraceEntry => (10_000, 10_000),
            _ => (150_000, 150_000),
        }
    }
}

/// Allocator entry points in the libc the benchmark loads.
struct Libc {
    path: PathBuf,
    malloc: Point,
    free: Point,
}

/// A function's entry and the probe point chosen in it (file offsets),
/// and the probe point's address in the ELF file.
struct Point {
    entry: u64,
    probe: u64,
    probe_vaddr: u64,
    entry_insn: String,
    probe_insn: String,
}

impl Point {
    fn delta(&self) -> u64 {
        self.probe - self.entry
    }
}

#[derive(Default)]
struct Figures {
    v64: Vec<f64>,
    vmix: Vec<f64>,
    /// Whether its probes were also in processes other than the target.
    elsewhere: bool,
    bpf: Option<Bpf>,
    unavailable: Option<String>,
}

/// BPF run statistics of one process's run.
struct Bpf {
    runs: u64,
    run_time_ns: u64,
    /// malloc+free pairs the process made, timed or not.
    pairs: u64,
    /// Per program, where known.
    detail: Vec<String>,
}

impl Bpf {
    fn runs_per_pair(&self) -> f64 {
        self.runs as f64 / self.pairs.max(1) as f64
    }
    fn ns_per_run(&self) -> f64 {
        self.run_time_ns as f64 / self.runs.max(1) as f64
    }
}

enum Attached {
    Nothing,
    Probes(EmptyProbes),
    Bpftrace(Reaped),
    Daemon(Daemon),
}

enum Outcome {
    Done {
        v64: Vec<f64>,
        vmix: Vec<f64>,
        bpf: Option<Bpf>,
        elsewhere: bool,
    },
    Refused(String),
}

pub fn measure(bin: &Path, work: &Path) -> Result<String> {
    let exe = super::harness::build_c(
        work,
        "heap",
        SOURCE,
        &["-O2", "-Wall"],
        "the allocator benchmark",
    )?;
    let libc = find_libc(&exe)?;
    let forms = bpftrace_forms(&exe, &libc, work)?;
    // The first form bpftrace accepts for free's probe point, if any.
    let bpftrace_free = forms
        .iter()
        .find(|(_, result)| result.is_ok())
        .map(|(form, _)| form.clone());

    let mut setups = vec![
        Setup::Bare,
        Setup::Empty,
        Setup::EmptyRetMalloc,
        Setup::EmptyRetBoth,
    ];
    if bpftrace_free.is_some() {
        setups.push(Setup::BpftraceOffset);
    }
    setups.extend([
        Setup::BpftraceEntry,
        Setup::Profilerd,
        Setup::ProfilerdPerfEvent,
    ]);
    let bpftrace_free = bpftrace_free.unwrap_or_default();
    let mut figures: Vec<Figures> = setups.iter().map(|_| Figures::default()).collect();
    let started = Instant::now();
    for round in 0..=ROUNDS {
        let stats_round = round == ROUNDS;
        set_bpf_stats(stats_round)?;
        for k in 0..setups.len() {
            // Rotating the order spreads drifts over every setup.
            let i = (k + round) % setups.len();
            let setup = setups[i];
            if (stats_round && setup == Setup::Bare) || figures[i].unavailable.is_some() {
                continue;
            }
            eprintln!("heap bench: round {}/{}, {setup:?}", round + 1, ROUNDS + 1);
            match run_pairs(setup, &exe, bin, &libc, &bpftrace_free, work, stats_round)? {
                Outcome::Refused(reason) => figures[i].unavailable = Some(reason),
                Outcome::Done { bpf, .. } if stats_round => figures[i].bpf = bpf,
                Outcome::Done {
                    v64,
                    vmix,
                    elsewhere,
                    ..
                } => {
                    figures[i].elsewhere |= elsewhere;
                    figures[i].v64.extend(v64);
                    figures[i].vmix.extend(vmix);
                }
            }
        }
    }
    let pairs_secs = started.elapsed().as_secs_f64();
    let refused = setups
        .iter()
        .zip(&figures)
        .find(|(s, _)| **s == Setup::Profilerd)
        .and_then(|(_, f)| f.unavailable.clone());
    // bpf stats stay on: the daemon logs its programs' run times at exit.
    let live = match refused {
        Some(reason) => LiveOutcome::Refused(reason),
        None => live(&exe, bin, work)?,
    };
    Ok(report(
        &libc,
        &setups,
        &figures,
        &forms,
        &bpftrace_free,
        &live,
        pairs_secs,
    ))
}

fn run_pairs(
    setup: Setup,
    exe: &Path,
    bin: &Path,
    libc: &Libc,
    bpftrace_free: &str,
    work: &Path,
    stats: bool,
) -> Result<Outcome> {
    let (n64, nmix) = setup.pairs();
    let mut bench = Bench::spawn(
        exe,
        &[
            "pairs".into(),
            n64.to_string(),
            nmix.to_string(),
            REPS.to_string(),
        ],
    )?;
    let pid = bench.pid();
    let lib = libc.path.to_string_lossy().into_owned();
    let attached = match setup {
        Setup::Bare => {
            for (what, off) in [
                ("malloc", libc.malloc.probe),
                ("free", libc.free.entry),
                ("free", libc.free.probe),
            ] {
                if probe_in_place(pid, &libc.path, off)? {
                    bail!(
                        "a uprobe is already on {what} in an untraced process: another \
                         tracer is attached to {lib}; stop it for a clean measurement"
                    );
                }
            }
            Attached::Nothing
        }
        Setup::Empty | Setup::EmptyRetMalloc | Setup::EmptyRetBoth => {
            let free = format!("free+{}", libc.free.delta());
            let mut points = vec![
                ("malloc".to_string(), libc.malloc.probe, false),
                (free.clone(), libc.free.probe, false),
            ];
            if setup != Setup::Empty {
                points.push(("malloc_ret".to_string(), libc.malloc.probe, true));
            }
            // At free+N too: [rsp] still holds the return address there.
            if setup == Setup::EmptyRetBoth {
                points.push((format!("{free}_ret"), libc.free.probe, true));
            }
            let probes = EmptyProbes::attach(pid, &libc.path, &points)?;
            wait_probes(pid, libc, &[libc.malloc.probe, libc.free.probe], None)?;
            Attached::Probes(probes)
        }
        Setup::BpftraceOffset | Setup::BpftraceEntry => {
            let (script, at) = if setup == Setup::BpftraceOffset {
                (
                    format!("uprobe:{lib}:malloc {{}} uprobe:{lib}:{bpftrace_free} {{}}"),
                    [libc.malloc.probe, libc.free.probe],
                )
            } else {
                (
                    format!("uprobe:{lib}:malloc {{}} uprobe:{lib}:free {{}}"),
                    [libc.malloc.entry, libc.free.entry],
                )
            };
            let errors = work.join("bpftrace.err");
            let mut bpftrace = spawn_bpftrace(pid, &script, &errors)?;
            wait_probes(pid, libc, &at, Some((&mut bpftrace, &errors)))?;
            Attached::Bpftrace(bpftrace)
        }
        Setup::Profilerd | Setup::ProfilerdPerfEvent => {
            let out = work.join("heap-profiles");
            let env: &[(&str, &str)] = match setup {
                Setup::ProfilerdPerfEvent => &[(PRETEND, "uprobe_session")],
                _ => &[],
            };
            let mut daemon = Daemon::start_with_env(
                bin,
                &[
                    "--profiles".into(),
                    "heap".into(),
                    "--pid".into(),
                    pid.to_string(),
                    "--output-dir".into(),
                    out.to_string_lossy().into_owned(),
                ],
                env,
            )?;
            if let Some(reason) = daemon.wait_ready()? {
                return Ok(Outcome::Refused(reason));
            }
            Attached::Daemon(daemon)
        }
    };

    // This process maps the same libc: a breakpoint in it means probes on
    // every process, which also slow everything else down.
    let mut elsewhere = false;
    if setup != Setup::Bare {
        for off in [libc.malloc.entry, libc.free.entry, libc.free.probe] {
            elsewhere |= probe_in_place(std::process::id(), &libc.path, off)?;
        }
    }
    bench.go()?;
    let (mut v64, mut vmix) = (Vec::new(), Vec::new());
    for _ in 0..2 * REPS {
        let line = bench.line(OUTPUT_TIMEOUT)?;
        let (kind, value) = line
            .split_once(' ')
            .with_context(|| format!("unexpected benchmark output {line:?}"))?;
        let value: f64 = value.trim().parse()?;
        eprintln!("heap bench: {setup:?}, {kind}: {value:.1} ns per pair");
        match kind {
            "64" => v64.push(value),
            "mix" => vmix.push(value),
            _ => bail!("unexpected benchmark output {line:?}"),
        }
    }
    let pairs = REPS as u64 * (n64 + nmix) + (n64 / 10 + 1) + (nmix / 10 + 1);
    // Read while the probes are attached and the process still waits.
    let mut bpf = match (&attached, stats) {
        (Attached::Probes(p), true) => {
            let stats = p.stats();
            Some(Bpf {
                runs: stats.iter().map(|s| s.runs).sum(),
                run_time_ns: stats.iter().map(|s| s.run_time_ns).sum(),
                pairs,
                detail: stats
                    .iter()
                    .map(|s| {
                        format!(
                            "{}: {} runs, {:.0} ns per run",
                            s.name,
                            s.runs,
                            s.run_time_ns as f64 / s.runs.max(1) as f64
                        )
                    })
                    .collect(),
            })
        }
        (Attached::Bpftrace(b), true) | (Attached::Daemon(Daemon { child: b, .. }), true) => {
            let (_, runs, ns_per_run) = bpftrace_figures(b.0.id())?;
            Some(Bpf {
                runs,
                run_time_ns: (ns_per_run * runs as f64) as u64,
                pairs,
                detail: Vec::new(),
            })
        }
        _ => None,
    };
    bench.finish()?;
    match attached {
        Attached::Daemon(daemon) => {
            let (status, log) = daemon.finish(Duration::from_secs(10))?;
            if !status.success() {
                bail!("profilerd exited with {status}");
            }
            if let Some(bpf) = bpf.as_mut() {
                bpf.detail = bpf_program_lines(&log);
            }
        }
        // Dropped: killed and reaped, or the fds closed.
        Attached::Bpftrace(_) | Attached::Probes(_) | Attached::Nothing => {}
    }
    Ok(Outcome::Done {
        v64,
        vmix,
        bpf,
        elsewhere,
    })
}

fn spawn_bpftrace(pid: u32, script: &str, errors: &Path) -> Result<Reaped> {
    Ok(Reaped(
        Command::new("bpftrace")
            .args(["-p", &pid.to_string(), "-e", script])
            .stdout(Stdio::null())
            .stderr(fs::File::create(errors)?)
            .spawn()
            .context("starting bpftrace")?,
    ))
}

/// The error bpftrace printed, without its memlock warning (harmless:
/// the kernel charges BPF memory to the cgroup).
fn bpftrace_error(errors: &Path) -> String {
    fs::read_to_string(errors)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("ERROR") && !l.contains("RLIMIT_MEMLOCK"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Waits until every file offset in `offsets` carries a breakpoint in
/// `pid`: the probes are attached, and where they were asked to be.
fn wait_probes(
    pid: u32,
    libc: &Libc,
    offsets: &[u64],
    mut tracer: Option<(&mut Reaped, &Path)>,
) -> Result<()> {
    let by = Instant::now() + READY_TIMEOUT;
    loop {
        let mut all = true;
        for &off in offsets {
            all &= probe_in_place(pid, &libc.path, off)?;
        }
        if all {
            return Ok(());
        }
        if let Some((child, errors)) = tracer.as_mut()
            && let Some(status) = child.0.try_wait()?
        {
            bail!("bpftrace exited with {status}: {}", bpftrace_error(errors));
        }
        if Instant::now() >= by {
            bail!("the probes were not in place within {READY_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the byte at file offset `off` of `path`, as mapped in `pid`, is
/// the int3 that a uprobe writes.
fn probe_in_place(pid: u32, path: &Path, off: u64) -> Result<bool> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let path_str = path.to_string_lossy();
    let addr = maps
        .lines()
        .filter(|l| l.ends_with(path_str.as_ref()))
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let (start, end) = f.next()?.split_once('-')?;
            let (start, end) = (
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            );
            let map_off = u64::from_str_radix(f.nth(1)?, 16).ok()?;
            (off >= map_off && off < map_off + (end - start)).then(|| start + off - map_off)
        })
        .with_context(|| format!("offset {off:#x} of {path_str} is not mapped in {pid}"))?;
    let mut mem = fs::File::open(format!("/proc/{pid}/mem"))?;
    mem.seek(SeekFrom::Start(addr))?;
    let mut byte = [0u8];
    mem.read_exact(&mut byte)?;
    Ok(byte[0] == 0xcc)
}

/// libc as the benchmark maps it, and where to probe malloc and free.
fn find_libc(exe: &Path) -> Result<Libc> {
    let bench = Bench::spawn(exe, &["pairs".into(), "1".into(), "1".into(), "1".into()])?;
    let maps = fs::read_to_string(format!("/proc/{}/maps", bench.pid()))?;
    drop(bench); // killed and reaped
    let path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .map(PathBuf::from)
        .context("libc is not mapped in the benchmark")?;
    let elf = fs::read(&path).with_context(|| path.display().to_string())?;
    let symbols = crate::output(Command::new("nm").args(["-D", "--defined-only"]).arg(&path))
        .context("running nm -D on libc")?;
    let point = |name: &str| -> Result<Point> {
        let vaddr = symbols
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && matches!(f[1], "T" | "W") && f[2].split('@').next() == Some(name))
                    .then(|| u64::from_str_radix(f[0], 16).ok())?
            })
            .with_context(|| format!("no {name} in {}", path.display()))?;
        let insns = disassemble(&path, vaddr)?;
        let (at, insn) = placement(&insns);
        let entry = file_offset(&elf, vaddr)?;
        Ok(Point {
            entry,
            probe: entry + (at - vaddr),
            probe_vaddr: at,
            entry_insn: insns.first().map(|i| i.1.clone()).unwrap_or_default(),
            probe_insn: insn,
        })
    };
    Ok(Libc {
        malloc: point("malloc")?,
        free: point("free")?,
        path,
    })
}

/// The first instructions at `vaddr`: (address, text).
fn disassemble(path: &Path, vaddr: u64) -> Result<Vec<(u64, String)>> {
    let text = crate::output(
        Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(format!("--start-address={vaddr:#x}"))
            .arg(format!("--stop-address={:#x}", vaddr + 24))
            .arg(path),
    )
    .context("running objdump")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (addr, insn) = l.split_once(":\t")?;
            let addr = u64::from_str_radix(addr.trim(), 16).ok()?;
            let insn = insn
                .split('#')
                .next()?
                .split_whitespace()
                .collect::<Vec<_>>();
            (!insn.is_empty()).then(|| (addr, insn.join(" ")))
        })
        .collect())
}

/// The first instruction from the entry that the x86 uprobe code emulates
/// (push of a register, relative jmp, call or jcc), skipping only
/// instructions that write nothing but flags; else the entry, which is then
/// single-stepped. profilerd also checks that no branch lands inside the
/// skipped run; glibc's allocators have none there.
fn placement(insns: &[(u64, String)]) -> (u64, String) {
    for (addr, insn) in insns.iter().take(4) {
        let (op, args) = insn.split_once(' ').unwrap_or((insn, ""));
        let emulated = match op {
            "push" | "pushq" => args.starts_with('%'),
            "jmp" | "call" | "callq" | "jmpq" => !args.starts_with('*'),
            _ => op.starts_with('j'),
        };
        if emulated {
            return (*addr, insn.clone());
        }
        let flags_only = matches!(
            op,
            "test"
                | "testb"
                | "testw"
                | "testl"
                | "testq"
                | "cmp"
                | "cmpb"
                | "cmpw"
                | "cmpl"
                | "cmpq"
                | "endbr64"
        );
        if !flags_only {
            break;
        }
    }
    insns
        .first()
        .cloned()
        .unwrap_or((0, "(no disassembly)".into()))
}

/// The file offset of virtual address `vaddr` in the ELF64 file `elf`,
/// from its PT_LOAD program headers.
fn file_offset(elf: &[u8], vaddr: u64) -> Result<u64> {
    let u16_at = |at: usize| -> Option<u64> {
        Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?) as u64)
    };
    let u32_at = |at: usize| -> Option<u64> {
        Some(u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?) as u64)
    };
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(elf.get(at..at + 8)?.try_into().ok()?))
    };
    if elf.get(..5) != Some(b"\x7fELF\x02") {
        bail!("libc is not a 64-bit ELF file");
    }
    let phoff = u64_at(0x20).context("ELF header")? as usize;
    let phentsize = u16_at(0x36).context("ELF header")? as usize;
    let phnum = u16_at(0x38).context("ELF header")? as usize;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let (Some(kind), Some(offset), Some(start), Some(size)) =
            (u32_at(ph), u64_at(ph + 8), u64_at(ph + 16), u64_at(ph + 32))
        else {
            bail!("truncated ELF program headers");
        };
        if kind == 1 && vaddr >= start && vaddr < start + size {
            return Ok(vaddr - start + offset);
        }
    }
    bail!("address {vaddr:#x} is in no loaded segment of libc")
}

/// Tries once each form of free's probe point in bpftrace: `free+N` and
/// the address in the file; each with Ok or bpftrace's error.
fn bpftrace_forms(
    exe: &Path,
    libc: &Libc,
    work: &Path,
) -> Result<Vec<(String, std::result::Result<(), String>)>> {
    let mut forms = Vec::new();
    for form in [
        format!("free+{}", libc.free.delta()),
        format!("{:#x}", libc.free.probe_vaddr),
    ] {
        let bench = Bench::spawn(exe, &["pairs".into(), "1".into(), "1".into(), "1".into()])?;
        let script = format!("uprobe:{}:{form} {{}}", libc.path.display());
        let errors = work.join("bpftrace-form.err");
        let mut bpftrace = spawn_bpftrace(bench.pid(), &script, &errors)?;
        let result = wait_probes(
            bench.pid(),
            libc,
            &[libc.free.probe],
            Some((&mut bpftrace, &errors)),
        )
        .map_err(|e| format!("{e:#}"));
        drop(bpftrace);
        forms.push((form, result));
    }
    Ok(forms)
}

enum LiveOutcome {
    Refused(String),
    Done(Live),
}

struct Live {
    ns_per_malloc: f64,
    secs: f64,
    cpu_ns: u64,
    rss_ready_kib: u64,
    hwm_kib: u64,
    writes: Vec<String>,
    inuse_objects: String,
    bpf: Vec<String>,
    warnings: Vec<String>,
    summary: Vec<String>,
}

/// A million live 64-byte allocations, every one sampled, held over two
/// profile windows.
fn live(exe: &Path, bin: &Path, work: &Path) -> Result<LiveOutcome> {
    let mut bench = Bench::spawn(exe, &["live".into(), LIVE_OBJECTS.to_string()])?;
    let out = work.join("live-profiles");
    let mut daemon = Daemon::start(
        bin,
        &[
            "--profiles".into(),
            "heap".into(),
            "--heap-sample-bytes".into(),
            "1".into(),
            "--interval".into(),
            format!("{LIVE_INTERVAL_S}s"),
            "--pid".into(),
            bench.pid().to_string(),
            "--output-dir".into(),
            out.to_string_lossy().into_owned(),
        ],
    )?;
    if let Some(reason) = daemon.wait_ready()? {
        return Ok(LiveOutcome::Refused(reason));
    }
    let dpid = daemon.pid();
    let rss_ready_kib = status_field(dpid, "VmRSS:")?;
    let cpu_ready = task_cpu_ns(dpid)?;
    let started = Instant::now();
    bench.go()?;
    let by = started + OUTPUT_TIMEOUT;
    let live_line = loop {
        if let Ok(line) = bench.lines.try_recv() {
            break line;
        }
        if Instant::now() >= by {
            bail!("the live-allocation benchmark did not finish allocating");
        }
        daemon.drain(Duration::from_millis(50));
    };
    let ns_per_malloc = live_line
        .strip_prefix("live ")
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("unexpected benchmark output {live_line:?}"))?;
    // Two windows that end after the last allocation: the second spans a
    // whole window with every object live.
    let mut writes = Vec::new();
    let by = Instant::now() + Duration::from_secs(2 * LIVE_INTERVAL_S + 15);
    while writes.len() < 2 && Instant::now() < by {
        for line in daemon.drain(Duration::from_millis(100)) {
            if line.contains("wrote") {
                writes.push(line);
            }
        }
    }
    let cpu_end = task_cpu_ns(dpid)?;
    let secs = started.elapsed().as_secs_f64();
    let hwm_kib = status_field(dpid, "VmHWM:")?;
    let inuse_objects = writes
        .last()
        .and_then(|l| l.split_whitespace().find(|w| w.ends_with(".pb.gz")))
        .map(|file| pprof_total(Path::new(file), "inuse_objects"))
        .unwrap_or_else(|| "no profile written".into());
    bench.finish()?;
    let (log, hwm_kib) = daemon.finish_with_peak(Duration::from_secs(15), hwm_kib)?;
    let warnings = log
        .iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .map(|l| message(l))
        .collect();
    let summary = log
        .iter()
        .filter(|l| l.contains("summary"))
        .map(|l| message(l))
        .collect();
    Ok(LiveOutcome::Done(Live {
        ns_per_malloc,
        secs,
        cpu_ns: cpu_end - cpu_ready,
        rss_ready_kib,
        hwm_kib,
        // The files are gone with the work directory: their names suffice.
        writes: writes
            .iter()
            .map(|l| {
                message(l)
                    .split_whitespace()
                    .map(|w| w.rsplit('/').next().unwrap_or(w))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect(),
        inuse_objects,
        bpf: bpf_program_lines(&log),
        warnings,
        summary,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::harness::strip_ansi;

    fn insns(list: &[(u64, &str)]) -> Vec<(u64, String)> {
        list.iter().map(|(a, s)| (*a, s.to_string())).collect()
    }

    #[test]
    fn placement_skips_a_flag_test_to_the_jump() {
        let free = insns(&[
            (0x98ef0, "test %rdi,%rdi"),
            (0x98ef3, "je 98fb8 <__libc_free@@GLIBC_2.2.5+0xc8>"),
            (0x98ef9, "push %rbp"),
        ]);
        assert_eq!(placement(&free).0, 0x98ef3);
        let malloc = insns(&[(0x98930, "push %r12"), (0x98932, "push %rbp")]);
        assert_eq!(placement(&malloc).0, 0x98930);
    }

    #[test]
    fn placement_stays_at_the_entry_otherwise() {
        let f = insns(&[(0x10, "mov %rdi,%rax"), (0x13, "jmp 20 <x>")]);
        assert_eq!(placement(&f).0, 0x10);
        let f = insns(&[(0x10, "test %rdi,%rdi"), (0x13, "jmp *%rax")]);
        assert_eq!(placement(&f).0, 0x10);
    }

    #[test]
    fn daemon_log_lines() {
        let raw = "\x1b[2m2026-11-22T02:52:07Z\x1b[0m \x1b[33m WARN\x1b[0m \
                   \x1b[2mprofilerd::session\x1b[0m\x1b[2m:\x1b[0m ring full: 5 (total 5)";
        let line = strip_ansi(raw);
        assert_eq!(
            line,
            "2026-11-22T02:52:07Z  WARN profilerd::session: ring full: 5 (total 5)"
        );
        assert_eq!(message(&line), "ring full: 5 (total 5)");
    }

    fn sh(script: &str) -> Daemon {
        Daemon::start(Path::new("sh"), &["-c".into(), script.into()]).unwrap()
    }

    #[test]
    fn a_refusal_is_a_reason_not_an_error() {
        let mut d = sh("echo \"profilerd: profile type 'heap' is not supported\" >&2; exit 2");
        let reason = d.wait_ready().unwrap().expect("refused");
        assert!(reason.contains("'heap' is not supported"), "{reason}");
        assert!(reason.contains("exit status: 2"), "{reason}");
    }

    #[test]
    fn a_ready_daemon_is_waited_for() {
        let mut d =
            sh("echo 'ready: every probe is attached' >&2; echo 'bpf program p: 1 runs' >&2");
        assert_eq!(d.wait_ready().unwrap(), None);
        let (status, log) = d.finish(Duration::from_secs(5)).unwrap();
        assert!(status.success());
        assert_eq!(bpf_program_lines(&log), ["bpf program p: 1 runs"]);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
