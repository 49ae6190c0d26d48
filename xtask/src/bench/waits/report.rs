//! The waits benchmark's report: every figure side by side, with the
//! targets it is judged by.

use super::*;

pub(super) fn report(
    cpu: usize,
    results: &Results,
    pid_filter: &str,
    rates: &[RateRun],
    pingpong_secs: f64,
) -> String {
    let command: Vec<String> = std::env::args().skip(1).collect();
    let mut out = format!(
        "# Futex wait/wake and context-switch cost (block, mutex, offcpu)\n\n\
         | run | |\n|---|---|\n\
         | command | `cargo xtask {}` |\n\
         | machine | kernel {}, {} CPUs |\n\
         | workload | xtask/bench/waits.c: two threads pass a token through a futex word \
         (FUTEX_WAIT_PRIVATE / FUTEX_WAKE_PRIVATE), or through a pthread mutex and condition \
         variable (the condition variable rows), both pinned to CPU {cpu} under SCHED_BATCH |\n",
        command.join(" "),
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    if rates.iter().any(|r| r.build == Build::Baseline) {
        out += &baseline::section(results, rates);
    }

    out += &format!(
        "\n## Ping-pong\n\n\
         A round trip: thread A stores 1 and wakes B, then waits; B wakes, stores 0 and \
         wakes A, then waits. So it is two wait/wake pairs and two voluntary context \
         switches, and every wait sleeps: under SCHED_BATCH a woken thread does not \
         preempt its waker, which goes on to its own wait (under SCHED_OTHER most wakes \
         preempt the waker and its wait then returns at once). Pinned to one CPU because \
         free threads wake each other across CPUs, which in this VM costs an idle vCPU's \
         wake-up per wait and varies several-fold (the \"not pinned\" row).\n\n\
         Medians over {ROUNDS} rounds × {REPS} batches of {BATCH_MS} ms (min–max in \
         brackets); each round runs every setup once, in rotating order, with a fresh \
         process. A pair is half a round trip. The timed rounds run with \
         kernel.bpf_stats_enabled=0; BPF runs and times come from one more round with it on \
         ({pingpong_secs:.0} s in all). The programs run on every futex call and context \
         switch of the system and filter in the kernel, so their runs per round trip \
         include other processes' events (the workload makes 4 futex calls and 2 voluntary \
         switches per round trip).\n\n\
         | setup | ns per round trip | ns per wait/wake pair | added per pair vs no profiler \
         | added per pair vs its floor | sleeping waits / voluntary switches / involuntary \
         switches per round trip | BPF runs per round trip | BPF ns per round trip |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for (case, f) in results.iter() {
        let (setup, label) = (case.setup, case.label());
        if let Some(reason) = &f.unavailable {
            out += &format!("| {label} | not available: {reason} | | | | | | |\n");
            continue;
        }
        let trips: Vec<f64> = f.batches.iter().map(|b| b.ns_per_trip).collect();
        let trip = median(&trips);
        let added = |base: Option<f64>| match base {
            Some(b) if !setup.is_bare() => {
                format!("{:+.0}", (trip - b) / 2.0)
            }
            _ => "–".into(),
        };
        let floor = case.floor().and_then(|c| results.trip(c));
        let (runs, bpf_ns) = f.bpf.as_ref().map_or(("–".into(), "–".into()), |b| {
            (
                format!("{:.2}", b.runs_per_trip()),
                format!("{:.0}", b.ns_per_trip()),
            )
        });
        out += &format!(
            "| {label} | {} | {:.0} | {} | {} | {:.2} / {:.2} / {:.3} | {runs} | {bpf_ns} |\n",
            spread(&trips),
            trip / 2.0,
            added(results.trip(case.unprofiled())),
            added(floor),
            f.of(|b| b.woken_per_trip),
            f.of(|b| b.vcsw_per_trip),
            f.of(|b| b.ivcsw_per_trip),
        );
    }

    let pair = |s: Setup, base: Setup| results.per_pair(Case::current(s), Case::current(base));
    let switch = |s: Setup, base: Setup| results.per_switch(Case::current(s), Case::current(base));
    let ns = |v: Option<f64>| v.map_or("not measured".into(), |v| format!("{v:.0} ns"));
    let target = match pair(Setup::BlockMutex, Setup::Bare) {
        Some(v) if v <= TARGET_PAIR_NS => "met",
        Some(_) => "missed",
        None => "not measured",
    };
    out += &format!(
        "\n| measure | value |\n|---|---|\n\
         | block+mutex: added per wait/wake pair vs no profiler (target ≤ {TARGET_PAIR_NS:.0} ns) \
         | {} ({target}) |\n\
         | block+mutex: added per pair vs empty futex tracepoints | {} |\n\
         | empty futex tracepoints: added per pair vs no profiler | {} |\n\
         | offcpu: added per context switch vs no profiler | {} |\n\
         | offcpu: added per context switch vs empty sched_switch | {} |\n\
         | empty sched_switch: added per context switch vs no profiler | {} |\n\
         | block+mutex+offcpu: added per pair (one wait, one wake, one switch) vs no profiler \
         | {} |\n\
         | block+mutex+offcpu: added per pair vs empty programs on all three | {} |\n\
         | block+mutex, condition variable: added per pthread_cond_wait/signal pair vs no \
         profiler (the futex pair and the probe at pthread_cond_wait) | {} |\n",
        ns(pair(Setup::BlockMutex, Setup::Bare)),
        ns(pair(Setup::BlockMutex, Setup::TraceFutex)),
        ns(pair(Setup::TraceFutex, Setup::Bare)),
        ns(switch(Setup::Offcpu, Setup::Bare)),
        ns(switch(Setup::Offcpu, Setup::TraceSwitch)),
        ns(switch(Setup::TraceSwitch, Setup::Bare)),
        ns(pair(Setup::All, Setup::Bare)),
        ns(pair(Setup::All, Setup::TraceBoth)),
        ns(pair(Setup::CondBlockMutex, Setup::CondBare)),
    );
    out += "\nThe daemon meanwhile (every thread, from \"go\" to the last batch; medians over \
            the timed processes). Its own context switches also run the sched_switch program.\n\n\
            | setup | daemon CPU per round trip | daemon context switches per round trip |\n\
            |---|---|---|\n";
    for (case, f) in results.iter() {
        if case.setup.profiles().is_some() && !f.daemon_cpu.is_empty() {
            out += &format!(
                "| {} | {:.0} ns | {:.3} |\n",
                case.label(),
                median(&f.daemon_cpu),
                median(&f.daemon_switches)
            );
        }
    }
    let disturbed: Vec<String> = results
        .iter()
        .filter(|(_, f)| f.disturbed > 0)
        .map(|(c, f)| format!("{} ({} of {})", c.label(), f.disturbed, f.processes))
        .collect();
    out += &if disturbed.is_empty() {
        "\nNo other profilerd, bpftrace or perf ran during the timed rounds.\n".to_string()
    } else {
        format!(
            "\nAnother profilerd, bpftrace or perf ran during some timed processes (its \
             programs run on the same events; included in the medians): {}.\n",
            disturbed.join(", ")
        )
    };
    out += &format!("\n{pid_filter}\n");
    for (case, f) in results.iter() {
        if let Some(b) = f.bpf.as_ref().filter(|b| !b.programs.is_empty()) {
            out += &format!(
                "\nBPF programs, {} ({} round trips, {} futex calls in the process):\n",
                case.label(),
                b.trips,
                b.calls
            );
            for p in &b.programs {
                out += &format!(
                    "- {}: {} runs ({:.2} per round trip), {:.0} ns per run\n",
                    p.name,
                    p.runs,
                    p.runs as f64 / b.trips.max(1) as f64,
                    p.ns_per_run
                );
            }
        }
    }

    out += &format!(
        "\n## The daemon under {RATE_CALLS} futex calls per second\n\n\
         The same two threads, paced to {RATE_CALLS} futex calls a second (a burst of round \
         trips every millisecond) for {RATE_SECS} s, under `profilerd --profiles LIST --pid PID` \
         at the default rates and interval. Daemon CPU (user+sys of every thread, from \
         schedstat) from the moment the program starts to the end of its load; the window \
         built and written at exit is amortized over the default {DEFAULT_INTERVAL_S:.0} s \
         interval. kernel.bpf_stats_enabled=1 here. At the default --block-rate 10us a wait \
         of d < 10 µs is kept with probability d/10 µs (Go's rule), so waits of a few µs are \
         mostly kept and each kept one is a stack the daemon unwinds.\n\n\
         | profiles | futex calls per second (sleeping waits) | daemon CPU during the load \
         | + window build/write per {DEFAULT_INTERVAL_S:.0} s | total, % of one core \
         (target ≤ {TARGET_DAEMON_SHARE}%) | daemon CPU per stack unwound | daemon context \
         switches per second | daemon RSS at ready / peak |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for run in rates {
        let profiles = run.label();
        match &run.outcome {
            RateOutcome::Refused(reason) => {
                out += &format!("| {profiles} | not available: {reason} | | | | | | |\n")
            }
            RateOutcome::Done(r) => {
                let (load, windows, total) = (r.load_share(), r.window_share(), r.share());
                out += &format!(
                    "| {profiles} | {:.0} ({:.0}) | {:.1} ms in {:.1} s = {load:.2}% | {:.1} ms = \
                     {windows:.3}% | {total:.2}% ({}) | {} | {:.0} | {:.1} / {:.1} MiB |\n",
                    r.calls as f64 / r.secs,
                    r.woken as f64 / r.secs,
                    r.cpu_ns as f64 / 1e6,
                    r.secs,
                    r.window_ms,
                    if total <= TARGET_DAEMON_SHARE {
                        "met"
                    } else {
                        "missed"
                    },
                    // Over its life, nearly all of which is the load.
                    r.per_stack()
                        .zip(r.unwinds)
                        .map_or("–".into(), |(ns, n)| format!(
                            "{ns:.0} ns ({n} stacks, {:.2} per sleeping wait)",
                            n as f64 / r.woken.max(1) as f64
                        )),
                    r.switches as f64 / r.secs,
                    r.rss_ready_kib as f64 / 1024.0,
                    r.hwm_kib as f64 / 1024.0,
                );
            }
        }
    }
    for run in rates {
        if let RateOutcome::Done(r) = &run.outcome
            && (r.calls as f64 / r.secs) < 0.95 * RATE_CALLS as f64
        {
            let profiles = run.label();
            out += &format!(
                "\nUnder {profiles} the workload fell short of {RATE_CALLS} calls a second: its \
                 round trips, slowed by the probes, no longer fit in the pace (one CPU).\n"
            );
        }
    }
    for run in rates {
        let RateOutcome::Done(r) = &run.outcome else {
            continue;
        };
        let profiles = run.label();
        let others = if r.others.is_empty() {
            vec![]
        } else {
            vec![r.others.join(", ")]
        };
        for (title, lines) in [
            ("Windows", &r.writes),
            ("BPF programs", &r.bpf),
            ("Daemon warnings", &r.warnings),
            ("Daemon summary at exit", &r.summary),
            ("Other tracers running meanwhile", &others),
        ] {
            if !lines.is_empty() {
                out += &format!("\n{title}, {profiles}:\n");
                for line in lines {
                    out += &format!("- {line}\n");
                }
            }
        }
    }
    out
}
