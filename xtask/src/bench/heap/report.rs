//! The heap benchmark's report: the cost per call of each setup side by
//! side, and the live-set run's figures.

use super::*;

pub(super) fn report(
    libc: &Libc,
    setups: &[Setup],
    figures: &[Figures],
    forms: &[(String, std::result::Result<(), String>)],
    bpftrace_free: &str,
    live: &LiveOutcome,
    pairs_secs: f64,
) -> String {
    let get = |s: Setup| setups.iter().position(|x| *x == s).map(|i| &figures[i]);
    let free_n = libc.free.delta();
    let command: Vec<String> = std::env::args().skip(1).collect();
    let mut out = format!(
        "# Heap profiling cost\n\n\
         | run | |\n|---|---|\n\
         | command | `cargo xtask {}` |\n\
         | machine | kernel {}, {} CPUs |\n\
         | libc (LIBC below) | {} |\n\
         | probe points | malloc+0 `{}`; free+{free_n} `{}` (free+0 is `{}`) |\n",
        command.join(" "),
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        libc.path.display(),
        libc.malloc.probe_insn,
        libc.free.probe_insn,
        libc.free.entry_insn,
    );

    out += &format!(
        "\n## malloc+free pairs\n\n\
         ns per pair, median over {ROUNDS} rounds × {REPS} batches (min–max in brackets); \
         each round runs every setup once, in rotating order, with a fresh process. \
         64 B: malloc(64)+free. Mixed: sizes 16..4096 B from a fixed pseudo-random \
         sequence of 1024. The timed rounds run with kernel.bpf_stats_enabled=0; BPF runs \
         and ns per run come from one more round with it on ({pairs_secs:.0} s in all).\n\n\
         | setup | 64 B | mixed | BPF runs per pair | BPF ns per run | probes in other processes |\n\
         |---|---|---|---|---|---|\n"
    );
    for (setup, f) in setups.iter().zip(figures) {
        let label = setup.label(libc, bpftrace_free);
        if let Some(reason) = &f.unavailable {
            out += &format!("| {label} | not available: {reason} | | | | |\n");
            continue;
        }
        let (runs, ns) = f.bpf.as_ref().map_or(("–".into(), "–".into()), |b| {
            (
                format!("{:.3}", b.runs_per_pair()),
                format!("{:.0}", b.ns_per_run()),
            )
        });
        let elsewhere = match (setup, f.elsewhere) {
            (Setup::Bare, _) => "–",
            (_, true) => "yes (their calls count in the BPF runs)",
            (_, false) => "no",
        };
        out += &format!(
            "| {label} | {} | {} | {runs} | {ns} | {elsewhere} |\n",
            spread(&f.v64),
            spread(&f.vmix)
        );
    }

    let ratio = |a: Option<&Figures>, b: Option<&Figures>, mixed: bool| -> Option<f64> {
        let pick = |f: &Figures| {
            if mixed {
                median(&f.vmix)
            } else {
                median(&f.v64)
            }
        };
        let r = pick(a?) / pick(b?);
        r.is_finite().then_some(r)
    };
    let cell = |r: Option<f64>| r.map_or("not available".into(), |r| format!("{r:.2}"));
    let pair = |a: Setup, b: Setup| {
        format!(
            "{} | {}",
            cell(ratio(get(a), get(b), false)),
            cell(ratio(get(a), get(b), true))
        )
    };
    let profilerd = get(Setup::Profilerd);
    let target = |mixed: bool| match ratio(profilerd, get(Setup::Empty), mixed) {
        Some(r) if r <= 1.25 => "met",
        Some(_) => "missed",
        None => "not measured",
    };
    out += &format!(
        "\n| ratio of medians | 64 B | mixed |\n|---|---|---|\n\
         | profilerd / empty uprobes on malloc+0, free+{free_n} (target ≤ 1.25) | {} |\n\
         | empty uprobes / no profiler | {} |\n\
         | uretprobe on malloc added / entry probes only | {} |\n\
         | uretprobes on malloc and free added / entry probes only | {} |\n\
         | bpftrace, free probed at free+0 / empty uprobes at free+{free_n} | {} |\n\
         | profilerd on perf-event uprobes (before 6.13) / on uprobe sessions | {} |\n\
         | profilerd on perf-event uprobes / empty uprobes with a uretprobe on malloc | {} |\n",
        pair(Setup::Profilerd, Setup::Empty),
        pair(Setup::Empty, Setup::Bare),
        pair(Setup::EmptyRetMalloc, Setup::Empty),
        pair(Setup::EmptyRetBoth, Setup::Empty),
        pair(Setup::BpftraceEntry, Setup::Empty),
        pair(Setup::ProfilerdPerfEvent, Setup::Profilerd),
        pair(Setup::ProfilerdPerfEvent, Setup::EmptyRetMalloc),
    );
    // The floor with as many program runs per pair as profilerd makes tells
    // its probes' placement and number from its programs' own cost.
    let runs = |s: Setup| get(s).and_then(|f| f.bpf.as_ref()).map(Bpf::runs_per_pair);
    if let Some(ours) = runs(Setup::Profilerd) {
        let like = [Setup::Empty, Setup::EmptyRetMalloc, Setup::EmptyRetBoth]
            .into_iter()
            .filter_map(|s| Some((s, (runs(s)? - ours).abs())))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(s, _)| s);
        if let Some(like) = like {
            out += &format!(
                "| profilerd / {} (as many BPF runs per pair: {ours:.3}) | {} |\n",
                like.label(libc, bpftrace_free),
                pair(Setup::Profilerd, like),
            );
        }
    }
    out += &format!(
        "\nTarget (profilerd at most 1.25 times the empty probes): 64 B {}, mixed {}.\n",
        target(false),
        target(true)
    );
    out += "\nbpftrace and free's probe point:\n";
    for (form, result) in forms {
        out += &match result {
            Ok(()) => format!("- `uprobe:LIBC:{form}`: accepted\n"),
            Err(e) => format!("- `uprobe:LIBC:{form}`: refused ({e})\n"),
        };
    }
    if forms.iter().all(|(_, r)| r.is_err()) {
        out += "\nSo the empty uprobes are attached by the benchmark itself: a perf uprobe \
                event per point with a BPF program `r0 = 0; exit`, as bpftrace attaches \
                its own, but limited to the benchmark process.\n";
    }
    for (setup, f) in setups.iter().zip(figures) {
        if let Some(b) = f.bpf.as_ref().filter(|b| !b.detail.is_empty()) {
            out += &format!(
                "\nBPF programs, {} ({} pairs in the process):\n",
                setup.label(libc, bpftrace_free),
                b.pairs
            );
            for line in &b.detail {
                out += &format!("- {line}\n");
            }
        }
    }

    out += &format!(
        "\n## A million sampled live allocations\n\n\
         {LIVE_OBJECTS} malloc(64) kept live under `profilerd --profiles heap \
         --heap-sample-bytes 1 --interval {LIVE_INTERVAL_S}s --pid PID` (every allocation \
         sampled), held until two windows have been written after the last one; \
         kernel.bpf_stats_enabled=1 here.\n\n"
    );
    match live {
        LiveOutcome::Refused(reason) => out += &format!("not available: {reason}\n"),
        LiveOutcome::Done(l) => {
            out += &format!(
                "| measure | value |\n|---|---|\n\
                 | malloc(64) under profilerd, every call sampled | {:.0} ns per call |\n\
                 | daemon CPU, ready → second window written ({:.1} s) | {:.0} ms = {:.1}% of one core |\n\
                 | daemon RSS at ready / peak (VmHWM) | {:.1} / {:.1} MiB |\n\
                 | peak RSS growth per live allocation | {:.0} B |\n\
                 | inuse_objects in the second window (go tool pprof) | {} |\n",
                l.ns_per_malloc,
                l.secs,
                l.cpu_ns as f64 / 1e6,
                l.cpu_ns as f64 / (l.secs * 1e9) * 100.0,
                l.rss_ready_kib as f64 / 1024.0,
                l.hwm_kib as f64 / 1024.0,
                (l.hwm_kib.saturating_sub(l.rss_ready_kib) * 1024) as f64 / LIVE_OBJECTS as f64,
                l.inuse_objects,
            );
            for (title, lines) in [
                ("Windows", &l.writes),
                ("BPF programs", &l.bpf),
                ("Daemon warnings", &l.warnings),
                ("Daemon summary at exit", &l.summary),
            ] {
                if !lines.is_empty() {
                    out += &format!("\n{title}:\n");
                    for line in lines {
                        out += &format!("- {line}\n");
                    }
                }
            }
        }
    }
    out
}

/// The total of one sample type in a profile, as `go tool pprof` reads it.
pub(super) fn pprof_total(file: &Path, index: &str) -> String {
    let go = if Path::new("/usr/lib/go/bin/go").exists() {
        "/usr/lib/go/bin/go"
    } else {
        "go"
    };
    let Some(top) = crate::output(
        Command::new(go)
            .args(["tool", "pprof", "-top"])
            .arg(format!("-sample_index={index}"))
            .arg(file),
    ) else {
        return "go tool pprof failed".into();
    };
    top.lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("% of ")?;
            Some(rest.split(" total").next()?.trim().to_string())
        })
        .unwrap_or_else(|| "no total in go tool pprof -top".into())
}
