//! Which profile types a run collects on this kernel, decided before any
//! probe is attached: a type the kernel cannot run stops the start with
//! one line (the missing feature and the first Linux that has it), unless
//! it was asked for at best effort (`heap?`), when it is skipped with one
//! warning and reported in `/metrics` and the exit summary. `profilerd
//! --check` prints the same decisions for every type.
//!
//! The kernel's features (kernel_features.rs) say what is missing; a trial
//! load of a type's programs (verified and attached to nothing but an
//! empty target set, then dropped) says whether this kernel's verifier
//! takes them, which no feature check can.

use std::process::ExitCode;
use std::sync::OnceLock;

use anyhow::{Result, bail};
use profiler_common::unwind_mode;

use crate::bpf::features::{Availability, KernelFeatures, refusal};
use crate::bpf::probes::{ProbeConfig, ProbeError, Probes};
use crate::config::{Settings, UnwindMode};
use crate::model::profile_kind::ProfileKind;

/// Profile types skipped on this kernel, for the exit summary ("" when
/// none): `heap,offcpu`.
static SKIPPED: OnceLock<String> = OnceLock::new();

/// The profile types skipped on this kernel, comma-separated.
pub fn skipped_names() -> &'static str {
    SKIPPED.get().map_or("", String::as_str)
}

/// What the kernel side loads for `kinds` under `settings`.
pub fn probe_config(
    settings: &Settings,
    features: &KernelFeatures,
    kinds: &[ProfileKind],
) -> ProbeConfig {
    let command_mode = !settings.command.is_empty();
    let on = |kind| kinds.contains(&kind);
    ProbeConfig {
        filter_targets: command_mode || !settings.pids.is_empty(),
        follow_forks: command_mode,
        cpu_frequency: settings.cpu_frequency,
        unwind_mode: match settings.unwind {
            UnwindMode::Fp => unwind_mode::FP,
            UnwindMode::Dwarf => unwind_mode::DWARF,
            UnwindMode::Auto => unwind_mode::AUTO,
        },
        cpu: on(ProfileKind::Cpu),
        heap_sample_bytes: on(ProfileKind::Heap).then_some(settings.heap_sample_bytes),
        block: on(ProfileKind::Block),
        offcpu: on(ProfileKind::Offcpu),
        wait_rate_ns: settings.block_rate.as_nanos() as u64,
        mutex_fraction: on(ProfileKind::Mutex).then_some(settings.mutex_fraction),
        limits: settings.limits,
        stack_switches: settings.stack_switches,
        kernel_log: crate::bpf::log::wanted(settings.kernel_log),
        uprobe_multi: features.uprobe_multi,
        uprobe_session: features.uprobe_session,
        futex2_tracepoints: features.futex2_tracepoints,
        map_caps: Vec::new(),
    }
}

/// Whether this kernel loads `kind`'s programs: None when it does, else
/// the first line of why not. Nothing stays attached.
fn trial_load(settings: &Settings, features: &KernelFeatures, kind: ProfileKind) -> Option<String> {
    trial_probes(settings, features, kind).err()
}

/// `kind`'s programs loaded as `trial_load` loads them.
fn trial_probes(
    settings: &Settings,
    features: &KernelFeatures,
    kind: ProfileKind,
) -> Result<Probes, String> {
    let mut config = probe_config(settings, features, &[kind]);
    // An empty target set: the programs run and return at once.
    config.filter_targets = true;
    config.follow_forks = false;
    let why = |e: ProbeError| reason(&format!("{:#}", anyhow::Error::from(e)));
    let mut probes = Probes::load(&config).map_err(why)?;
    // Go's uprobe programs wait for the first Go executable: load them now,
    // as that executable would.
    for links in probes.uprobe_links() {
        links.load_now().map_err(|e| why(e.into()))?;
    }
    Ok(probes)
}

/// The CPU samples of Go and Python processes, taken by programs of their
/// own (loaded at the first such process): whether this kernel loads
/// them, one line each.
fn check_sample_programs(settings: &Settings, features: &KernelFeatures) {
    let Ok(mut probes) = trial_probes(settings, features, ProfileKind::Cpu) else {
        return;
    };
    for (runtime, loaded) in probes.load_sample_programs() {
        let what = match runtime {
            "go" => "Go leaf callers and labels on CPU samples",
            _ => "Python frames on CPU samples",
        };
        match loaded {
            Ok(()) => println!("{runtime:<8} ready ({what})"),
            Err(e) => println!(
                "{runtime:<8} unavailable ({what}: {})",
                reason(&format!("{:#}", anyhow::Error::from(e)))
            ),
        }
    }
}

/// One line of why a load failed. A verifier's log (one line in the
/// error) says why at its end, just before its statistics: that end is
/// kept, after what precedes the log.
fn reason(error: &str) -> String {
    const TAIL: usize = 120;
    let line = error.lines().next().unwrap_or("loading failed");
    // The log runs over many lines: its reason is on the last ones.
    let Some((head, log)) = error.split_once(" Verifier output: ") else {
        return line.to_string();
    };
    let log = log.split_whitespace().collect::<Vec<_>>().join(" ");
    let log = log
        .split(" verification time")
        .next()
        .unwrap_or(&log)
        .trim_end();
    let start = log
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| log.len() - i <= TAIL)
        .unwrap_or(0);
    format!("{head} The verifier: ...{}", &log[start..])
}

/// Removes from `settings.profiles` the best-effort types this kernel
/// cannot run and returns them with the reason; fails on the first
/// required type it cannot run. Warns once per degraded type.
pub fn settle_profiles(
    settings: &mut Settings,
    features: &KernelFeatures,
) -> Result<Vec<(ProfileKind, String)>> {
    let mut skipped = Vec::new();
    for kind in settings.profiles.clone() {
        let best_effort = settings.best_effort.contains(&kind);
        let why = match features.assess(kind) {
            Availability::Ready => None,
            Availability::Degraded(lines) => {
                for line in lines {
                    tracing::warn!(
                        "{} profile on this kernel ({}): {line}",
                        kind.name(),
                        features.release
                    );
                }
                None
            }
            Availability::Unavailable(need) if best_effort => Some(format!("needs {need}")),
            Availability::Unavailable(need) => bail!(refusal(kind, need, &features.release)),
        };
        // A required type that fails to load stops the start when the
        // probes load; a best-effort one is tried alone first.
        let why = why.or_else(|| {
            best_effort
                .then(|| trial_load(settings, features, kind))
                .flatten()
        });
        if let Some(why) = why {
            tracing::warn!(
                "skipping the {} profile, asked for at best effort: this kernel ({}) cannot run it: {why}",
                kind.name(),
                features.release
            );
            skipped.push((kind, why));
        }
    }
    settings
        .profiles
        .retain(|k| !skipped.iter().any(|(s, _)| s == k));
    if settings.profiles.is_empty() {
        bail!(
            "no profile type asked for can run on this kernel ({}); see 'profilerd --check'",
            features.release
        );
    }
    let names: Vec<&str> = skipped.iter().map(|(k, _)| k.name()).collect();
    let _ = SKIPPED.set(names.join(","));
    Ok(skipped)
}

/// `profilerd --check`: each profile type and unwinding mode on this
/// kernel; exit 0 when every requested type can run, 1 otherwise.
pub fn run_check(settings: &Settings) -> ExitCode {
    let features = match crate::bpf::tracefs::tracefs_dir() {
        Ok(tracefs) => KernelFeatures::probe(tracefs),
        Err(e) => {
            eprintln!("profilerd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!(
        "kernel {}: BTF {}, perf uprobes {}, uprobe_multi {}, uprobe sessions {}, futex_wait/futex_wake tracepoints {}",
        features.release,
        yes(features.btf),
        yes(features.uprobe_pmu),
        yes(features.uprobe_multi),
        yes(features.uprobe_session),
        yes(features.futex2_tracepoints),
    );
    let mut all_requested_run = true;
    for kind in ProfileKind::ALL {
        let state = features.assess(kind);
        if !matches!(state, Availability::Unavailable(_))
            && let Some(why) = trial_load(settings, &features, kind)
        {
            println!(
                "{:<8} unavailable (its programs do not load here: {why})",
                kind.name()
            );
            if settings.profiles.contains(&kind) {
                all_requested_run = false;
            }
            continue;
        }
        if matches!(state, Availability::Unavailable(_)) && settings.profiles.contains(&kind) {
            all_requested_run = false;
        }
        println!("{:<8} {state}", kind.name());
    }
    check_sample_programs(settings, &features);
    // Frame pointers are walked in the kernel and .eh_frame from stack
    // copies in the daemon: both need only bpf_probe_read_user (5.5).
    for mode in ["fp", "dwarf", "auto"] {
        println!("unwind {mode:<5} ready");
    }
    match all_requested_run {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_refusal_keeps_the_verifiers_reason() {
        let error = "eBPF program sched_switch: the BPF_PROG_LOAD syscall returned Permission denied (os error 13). Verifier output: reg type unsupported for arg#0 function sched_switch#57 0: R1=ctx() 306: (85) call bpf_probe_read_kernel#113 R2 min value is negative, either use unsigned or 'var &= const' verification time 155795 usec stack depth 288";
        let r = reason(error);
        assert!(
            r.starts_with("eBPF program sched_switch: the BPF_PROG_LOAD"),
            "{r}"
        );
        assert!(
            r.ends_with("R2 min value is negative, either use unsigned or 'var &= const'"),
            "{r}"
        );
        assert!(
            !r.contains("verification time") && !r.contains("reg type unsupported"),
            "{r}"
        );
        assert_eq!(reason("tracefs missing\nmore"), "tracefs missing");
        // As the kernel writes it: one instruction a line.
        let r = reason(&error.replace(" 0: ", "\n0: ").replace(" 306: ", "\n306: "));
        assert!(r.ends_with("use unsigned or 'var &= const'"), "{r}");
    }
}
