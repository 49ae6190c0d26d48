//! The CPU profile against workloads whose truth is known: the split of CPU
//! time between functions, the total CPU time, labels, stacks (user and
//! kernel), `--pid`, `-- COMMAND` with descendants, and system-wide runs.

use std::path::Path;
use std::time::Duration;

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::profiles::{
    FlatSample, KERNEL_MAPPING, ProfileFile, assert_only_profiles, flatten_all, group_by_label,
    of_pid, read_profiles, share_with, summary, total_count, total_cpu,
};
use profiler_tests::workloads::{
    Running, WholeLife, Workload, comm_of, field, parse_report, profile_whole_life,
};
use profiler_tests::{check_cpu_files, pprof_tops, temp_dir};

/// Sampling rate of the accuracy tests: high enough that the sampling error
/// of a few seconds of CPU is well inside the tolerances below.
/// The sampling rate, unless the environment lowers it (see
/// [`profiler_tests::cpu_hz`]).
const DEFAULT_HZ: u64 = 499;

fn hz() -> u64 {
    profiler_tests::cpu_hz(DEFAULT_HZ)
}
/// |profiled share of burn_a among burn_a+burn_b - measured share| bound.
const RATIO_TOLERANCE: f64 = 0.05;
/// |profiled total CPU / measured total CPU - 1| bound.
const TOTAL_TOLERANCE: f64 = 0.15;
/// How long the ratio workloads burn.
const BURN_SECONDS: &str = "4";

/// Everything a failed assertion should show: the samples digest and
/// `go tool pprof -top` of every file for the pid.
fn diag(
    samples: &[FlatSample],
    files: &[ProfileFile],
    pid: Option<u32>,
    daemon: &Daemon,
) -> String {
    format!(
        "\n{}\n{}\n{}",
        summary(samples),
        pprof_tops(files, pid),
        daemon.describe()
    )
}

/// Share of burn_a in the CPU of burn_a + burn_b samples.
/// The bound on |profiled share - measured share| for a share `p` taken
/// from `samples`: RATIO_TOLERANCE, or four standard deviations of a
/// sampled share where that is wider (a few hundred samples, as a slow
/// emulated kernel gives, wander by ±0.018 per standard deviation).
fn ratio_tolerance(p: f64, samples: &[FlatSample], coverage: f64) -> f64 {
    let n = (total_count(samples) as f64 * coverage).max(1.0);
    RATIO_TOLERANCE.max(4.0 * (p * (1.0 - p) / n).sqrt())
}

fn a_share(samples: &[FlatSample]) -> (f64, f64) {
    let a = share_with(samples, "burn_a");
    let b = share_with(samples, "burn_b");
    (a / (a + b).max(f64::MIN_POSITIVE), a + b)
}

/// burn_a's share of burn_a+burn_b within `ratio_tolerance` of the share the
/// workload measured with its thread CPU clock, and the two functions
/// holding nearly all of its CPU.
fn assert_burn_split(
    samples: &[FlatSample],
    report: &std::collections::BTreeMap<String, u64>,
    extra: impl Fn() -> String,
) {
    let (a_ns, b_ns) = (field(report, "a_ns") as f64, field(report, "b_ns") as f64);
    let truth = a_ns / (a_ns + b_ns);
    let (share, coverage) = a_share(samples);
    let tolerance = ratio_tolerance(truth, samples, coverage);
    println!(
        "burn_a share: profiled {share:.4}, measured {truth:.4} (±{tolerance:.3}); burn_a+burn_b cover {coverage:.3}"
    );
    assert!(
        (share - truth).abs() <= tolerance,
        "burn_a share of burn_a+burn_b: profiled {share:.3}, measured {truth:.3} (allowed ±{tolerance:.3}){}",
        extra()
    );
    assert!(
        coverage >= 0.85,
        "burn_a+burn_b hold only {coverage:.3} of the cpu (expected ≥ 0.85){}",
        extra()
    );
}

fn assert_total(what: &str, profiled_ns: i64, measured_ns: u64, extra: impl Fn() -> String) {
    let ratio = profiled_ns as f64 / measured_ns as f64;
    println!("{what}: profiled cpu {profiled_ns} ns, measured {measured_ns} ns, ratio {ratio:.3}");
    assert!(
        (ratio - 1.0).abs() <= TOTAL_TOLERANCE,
        "{what}: profiled cpu {:.3} s vs measured {:.3} s (ratio {ratio:.3}, allowed ±{TOTAL_TOLERANCE}){}",
        profiled_ns as f64 / 1e9,
        measured_ns as f64 / 1e9,
        extra()
    );
}

/// Checks the frames of `burn_a` in `samples`: symbolized with the source
/// file and a line, the executable as mapping with a build ID, an address.
fn assert_symbolized(samples: &[FlatSample], exe: &Path, source: &str, extra: impl Fn() -> String) {
    let exe_name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let frame = samples
        .iter()
        .find_map(|s| s.position("burn_a").map(|i| s.frames[i].clone()))
        .unwrap_or_else(|| panic!("no frame of burn_a at all{}", extra()));
    assert!(
        frame.file.ends_with(source) && frame.line > 0,
        "burn_a should be symbolized with file {source} and a line; got {frame:?}{}",
        extra()
    );
    assert!(
        frame.mapping.ends_with(&exe_name),
        "burn_a's mapping should be the executable {exe_name}; got {frame:?}{}",
        extra()
    );
    assert!(
        !frame.build_id.is_empty(),
        "burn_a's mapping has no build ID: {frame:?}{}",
        extra()
    );
    assert!(
        frame.address != 0,
        "burn_a's location has no address: {frame:?}{}",
        extra()
    );
}

/// Fraction (by cpu) of the samples containing `leaf` in which the frames
/// after it contain `callers` in this order (nearest caller first).
fn caller_chain_share(samples: &[FlatSample], leaf: &str, callers: &[&str]) -> f64 {
    let with: Vec<&FlatSample> = samples.iter().filter(|s| s.has_function(leaf)).collect();
    let total: i64 = with.iter().map(|s| s.cpu_ns).sum();
    let good: i64 = with
        .iter()
        .filter(|s| {
            let mut rest = &s.frames[s.position(leaf).unwrap() + 1..];
            callers.iter().all(|c| {
                match rest
                    .iter()
                    .position(|f| profiler_tests::profiles::function_matches(&f.function, c))
                {
                    Some(i) => {
                        rest = &rest[i + 1..];
                        true
                    }
                    None => false,
                }
            })
        })
        .map(|s| s.cpu_ns)
        .sum();
    good as f64 / total.max(1) as f64
}

/// Runs a ratio workload under `--pid`, profiling its whole life: the
/// workload waits on stdin until the daemon is ready. Returns the files, the
/// samples, the workload's report, its pid and the daemon.
fn profile_ratio_workload(
    exe: &Path,
    out: &Path,
) -> (
    Vec<ProfileFile>,
    Vec<FlatSample>,
    std::collections::BTreeMap<String, u64>,
    u32,
    Daemon,
) {
    let WholeLife {
        pid,
        report,
        daemon,
    } = profile_whole_life(exe, &[BURN_SECONDS], out, hz(), &[]);
    let files = read_profiles(out, "cpu");
    let samples = flatten_all(&files);
    // Checks every run of this kind shares: only cpu files, one per window
    // of the 4 s run at --interval 2s, each well formed.
    assert_only_profiles(out, "cpu");
    assert!(
        files.len() >= 2,
        "a 4 s run with --interval 2s should give at least 2 files, got {}{}",
        files.len(),
        diag(&samples, &files, Some(pid), &daemon)
    );
    check_cpu_files(&files, hz());
    (files, samples, report, pid, daemon)
}

#[test]
fn c_workload_under_pid() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "cpu_ratio_c_workload");
    let out = tmp.path().join("out");
    let (files, samples, report, pid, daemon) = profile_ratio_workload(&exe, &out);
    let d = || diag(&samples, &files, Some(pid), &daemon);

    assert_eq!(field(&report, "pid"), u64::from(pid));

    // Filtering: only the target.
    let others: Vec<&FlatSample> = samples.iter().filter(|s| s.pid() != pid).collect();
    assert!(
        others.is_empty(),
        "--pid {pid}: {} samples of other processes{}",
        others.len(),
        summary(&others.into_iter().cloned().collect::<Vec<_>>())
    );
    assert!(total_count(&samples) > 0, "no samples for pid {pid}{}", d());

    // Labels: single-threaded, comm and thread are the executable's name.
    let comm = comm_of(&exe);
    assert_eq!(comm, "cpu_ratio_c_wor");
    for s in &samples {
        assert_eq!(
            s.tid(),
            pid,
            "single-threaded workload: tid must be the pid; labels {:?}",
            s.labels
        );
        assert_eq!(
            s.label("comm"),
            Some(comm.as_str()),
            "comm label; labels {:?}",
            s.labels
        );
        assert_eq!(
            s.label("thread"),
            Some(comm.as_str()),
            "thread label; labels {:?}",
            s.labels
        );
    }

    // Total CPU over the whole life, against getrusage.
    assert_total(
        "C workload",
        total_cpu(&samples),
        field(&report, "cpu_ns"),
        d,
    );

    // The split between burn_a and burn_b, against the workload's own
    // measurement with its thread CPU clock.
    assert_burn_split(&samples, &report, d);

    // Stacks: the whole chain to main.
    let main_share = share_with(&samples, "main");
    assert!(
        main_share >= 0.9,
        "main is in only {main_share:.3} of the cpu (expected ≥ 0.9){}",
        d()
    );
    for leaf in ["burn_a", "burn_b"] {
        let chain = caller_chain_share(&samples, leaf, &["run_workload", "main"]);
        assert!(
            chain >= 0.95,
            "{leaf} <- run_workload <- main in only {chain:.3} of {leaf}'s samples{}",
            d()
        );
    }
    assert_symbolized(&samples, &exe, "cpu_ratio.c", d);
}

#[test]
fn rust_workload_under_pid() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioRust.build(tmp.path(), "cpu_ratio_rs_workload");
    let out = tmp.path().join("out");
    let (files, samples, report, pid, daemon) = profile_ratio_workload(&exe, &out);
    let d = || diag(&samples, &files, Some(pid), &daemon);

    let others: Vec<&FlatSample> = samples.iter().filter(|s| s.pid() != pid).collect();
    assert!(
        others.is_empty(),
        "--pid {pid}: {} samples of other processes{}",
        others.len(),
        d()
    );

    // Labels: two threads; the main thread is named like the process, the
    // helper thread has its own name.
    let comm = comm_of(&exe);
    let main_tid = field(&report, "main_tid") as u32;
    let helper_tid = field(&report, "helper_tid") as u32;
    assert_eq!(main_tid, pid);
    for s in &samples {
        assert_eq!(
            s.label("comm"),
            Some(comm.as_str()),
            "comm label; labels {:?}",
            s.labels
        );
        let want_thread = match s.tid() {
            t if t == main_tid => comm.as_str(),
            t if t == helper_tid => "rs-helper",
            t => panic!(
                "sample of unknown thread {t} (threads: main {main_tid}, helper {helper_tid}); labels {:?}",
                s.labels
            ),
        };
        assert_eq!(
            s.label("thread"),
            Some(want_thread),
            "thread label of tid {}; labels {:?}",
            s.tid(),
            s.labels
        );
    }
    let by_tid = group_by_label(&samples, "tid");
    for tid in [main_tid, helper_tid] {
        let cpu = by_tid.get(&tid.to_string()).map_or(0, |g| g.1);
        assert!(
            cpu > 1_000_000_000,
            "thread {tid} burned for 4 s but has only {:.3} s of cpu{}",
            cpu as f64 / 1e9,
            d()
        );
    }

    assert_total(
        "Rust workload",
        total_cpu(&samples),
        field(&report, "cpu_ns"),
        d,
    );

    assert_burn_split(&samples, &report, d);

    // The main thread's stacks reach main; the helper's reach run_workload.
    let main_thread: Vec<FlatSample> = samples
        .iter()
        .filter(|s| s.tid() == main_tid)
        .cloned()
        .collect();
    let helper: Vec<FlatSample> = samples
        .iter()
        .filter(|s| s.tid() == helper_tid)
        .cloned()
        .collect();
    let main_share = share_with(&main_thread, "main");
    assert!(
        main_share >= 0.9,
        "main is in only {main_share:.3} of the main thread's cpu (expected ≥ 0.9){}",
        d()
    );
    for leaf in ["burn_a", "burn_b"] {
        let chain = caller_chain_share(&main_thread, leaf, &["run_workload", "main"]);
        assert!(
            chain >= 0.95,
            "main thread: {leaf} <- run_workload <- main in only {chain:.3} of {leaf}'s samples{}",
            d()
        );
        let chain = caller_chain_share(&helper, leaf, &["run_workload"]);
        assert!(
            chain >= 0.95,
            "helper thread: {leaf} <- run_workload in only {chain:.3} of {leaf}'s samples{}",
            d()
        );
    }
    assert_symbolized(&samples, &exe, "cpu_ratio.rs", d);
}

#[test]
fn kernel_frames_of_system_calls() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::Syscalls.build(tmp.path(), "syscalls_workload");
    let out = tmp.path().join("out");
    let mut workload = Running::start(&exe, &["3", "--wait-stdin"]);
    let pid = workload.pid();
    let mut daemon = Daemon::start(&[
        "--pid",
        &pid.to_string(),
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "60s",
        "--cpu-frequency",
        &hz().to_string(),
    ]);
    daemon.wait_ready();
    workload.release();
    workload.finish(Duration::from_secs(15));
    workload.kill();
    daemon.wait_success(Duration::from_secs(10));

    let files = read_profiles(&out, "cpu");
    assert_only_profiles(&out, "cpu");
    check_cpu_files(&files, hz());
    let samples = of_pid(&flatten_all(&files), pid);
    let d = || diag(&samples, &files, Some(pid), &daemon);
    assert!(
        total_count(&samples) >= 100,
        "too few samples of the syscall workload{}",
        d()
    );

    // It spends most of its time in the kernel (about 3/4 on this VM).
    let kernel: Vec<FlatSample> = samples
        .iter()
        .filter(|s| s.has_kernel_frame())
        .cloned()
        .collect();
    let kernel_share = total_cpu(&kernel) as f64 / total_cpu(&samples) as f64;
    println!(
        "syscalls: {} samples, {kernel_share:.3} of the cpu with kernel frames",
        total_count(&samples)
    );
    assert!(
        kernel_share >= 0.3,
        "only {kernel_share:.3} of the cpu has kernel frames (mapping {KERNEL_MAPPING}){}",
        d()
    );

    // Kernel frames come first (leaf side), then the user frames.
    for s in &samples {
        let first_user = s
            .frames
            .iter()
            .position(|f| !f.is_kernel())
            .unwrap_or(s.frames.len());
        assert!(
            s.frames[first_user..].iter().all(|f| !f.is_kernel()),
            "kernel frames after user frames: {}",
            s.stack_text()
        );
    }
    // The kernel frames are system call paths.
    let syscall_path = |s: &FlatSample| {
        s.frames.iter().any(|f| {
            f.is_kernel() && (f.function.contains("sys_") || f.function.contains("entry_SYSCALL"))
        })
    };
    let with_path: i64 = kernel
        .iter()
        .filter(|s| syscall_path(s))
        .map(|s| s.cpu_ns)
        .sum();
    let path_share = with_path as f64 / total_cpu(&kernel).max(1) as f64;
    assert!(
        path_share >= 0.9,
        "only {path_share:.3} of the kernel samples show a sys_*/entry_SYSCALL frame{}",
        d()
    );
    for s in &kernel {
        for f in s.frames.iter().filter(|f| f.is_kernel()) {
            assert!(
                !f.function.is_empty() && !f.unsymbolized,
                "unsymbolized kernel frame {f:?} in {}",
                s.stack_text()
            );
        }
    }
    // The user half of a kernel sample continues where the system call was
    // made: in do_syscalls, called from main.
    let user_chain = caller_chain_share(&kernel, "do_syscalls", &["main"]);
    let with_user = share_with(&kernel, "do_syscalls");
    assert!(
        with_user >= 0.8 && user_chain >= 0.95,
        "kernel samples: do_syscalls in {with_user:.3} of them (expected ≥ 0.8), followed by main in {user_chain:.3} (expected ≥ 0.95){}",
        d()
    );
}

#[test]
fn command_and_its_descendants() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "cmd_workload");
    let out = tmp.path().join("out");
    let mut daemon = Daemon::start(&[
        "--output-dir".as_ref(),
        out.as_os_str(),
        "--interval".as_ref(),
        "60s".as_ref(),
        "--cpu-frequency".as_ref(),
        hz().to_string().as_ref(),
        "--".as_ref(),
        exe.as_os_str(),
        "3".as_ref(),
        "--fork".as_ref(),
    ]);
    daemon.wait_ready();
    // The daemon stops by itself when the command exits.
    daemon.wait_success(Duration::from_secs(20));
    let report = parse_report(&daemon.stdout_text(), "pid");
    let (pid, child) = (
        field(&report, "pid") as u32,
        field(&report, "child_pid") as u32,
    );

    let files = read_profiles(&out, "cpu");
    assert_only_profiles(&out, "cpu");
    assert_eq!(
        files.len(),
        1,
        "one window (--interval 60s): expected one file, got {}",
        files.len()
    );
    check_cpu_files(&files, hz());
    let samples = flatten_all(&files);
    let d = || diag(&samples, &files, None, &daemon);

    let strangers: Vec<u32> = group_by_label(&samples, "pid")
        .keys()
        .filter_map(|p| p.parse().ok())
        .filter(|p| *p != pid && *p != child)
        .collect();
    assert!(
        strangers.is_empty(),
        "samples of processes other than the command {pid} and its child {child}: {strangers:?}{}",
        d()
    );

    let parent = of_pid(&samples, pid);
    let forked = of_pid(&samples, child);
    assert_total("command", total_cpu(&parent), field(&report, "cpu_ns"), d);
    assert_total(
        "forked child of the command",
        total_cpu(&forked),
        field(&report, "child_cpu_ns"),
        d,
    );

    let child_share = share_with(&forked, "child_burn");
    assert!(
        child_share >= 0.85,
        "child_burn is in only {child_share:.3} of the child's cpu{}",
        d()
    );
    let (a_ns, b_ns) = (field(&report, "a_ns") as f64, field(&report, "b_ns") as f64);
    let truth = a_ns / (a_ns + b_ns);
    let (share, coverage) = a_share(&parent);
    let tolerance = ratio_tolerance(truth, &parent, coverage);
    println!(
        "command: burn_a share profiled {share:.4}, measured {truth:.4} (±{tolerance:.3}); child_burn share {child_share:.3}"
    );
    assert!(
        (share - truth).abs() <= tolerance,
        "command: burn_a share profiled {share:.3}, measured {truth:.3} (allowed ±{tolerance:.3}){}",
        d()
    );
    let comm = comm_of(&exe);
    for s in parent
        .iter()
        .chain(&forked)
        .filter(|s| s.has_function("main"))
    {
        assert_eq!(
            s.label("comm"),
            Some(comm.as_str()),
            "comm of a sample in main; labels {:?}",
            s.labels
        );
        assert_eq!(
            s.tid(),
            s.pid(),
            "single-threaded processes; labels {:?}",
            s.labels
        );
    }
}

#[test]
fn system_wide_sees_every_process() {
    require_root();
    let tmp = temp_dir();
    let alpha_exe = Workload::CpuRatioC.build(tmp.path(), "sw_alpha_c");
    let beta_exe = Workload::CpuRatioRust.build(tmp.path(), "sw_beta_rs");
    let out = tmp.path().join("out");
    let mut alpha = Running::start(&alpha_exe, &["20"]);
    let mut beta = Running::start(&beta_exe, &["20"]);
    let mut daemon = Daemon::start(&[
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "60s",
        "--duration",
        "3s",
        "--label",
        "suite=e2e",
    ]);
    daemon.wait_ready();
    daemon.wait_success(Duration::from_secs(15));
    alpha.kill();
    beta.kill();

    let files = read_profiles(&out, "cpu");
    assert_only_profiles(&out, "cpu");
    assert_eq!(
        files.len(),
        1,
        "--duration 3s --interval 60s: expected one file, got {}",
        files.len()
    );
    // Default frequency: 99 Hz.
    check_cpu_files(&files, 99);
    let samples = flatten_all(&files);
    let d = || diag(&samples, &files, None, &daemon);

    for (w, exe) in [(&alpha, &alpha_exe), (&beta, &beta_exe)] {
        let mine = of_pid(&samples, w.pid());
        let comm = comm_of(exe);
        assert!(
            total_count(&mine) >= 20,
            "{comm} (pid {}) burned for the whole 3 s but has {} samples{}",
            w.pid(),
            total_count(&mine),
            d()
        );
        for s in &mine {
            assert_eq!(
                s.label("comm"),
                Some(comm.as_str()),
                "comm label of pid {}; labels {:?}",
                w.pid(),
                s.labels
            );
        }
        let (_, coverage) = a_share(&mine);
        assert!(
            coverage >= 0.8,
            "{comm}: burn_a+burn_b in only {coverage:.3} of its cpu (unsymbolized?){}",
            d()
        );
    }
    // The static --label is on every sample, of every process.
    for s in &samples {
        assert_eq!(
            s.label("suite"),
            Some("e2e"),
            "--label suite=e2e missing; labels {:?}",
            s.labels
        );
    }
    let beta_threads = group_by_label(&of_pid(&samples, beta.pid()), "thread");
    assert!(
        beta_threads.contains_key("rs-helper"),
        "the Rust workload's helper thread is missing: {beta_threads:?}{}",
        d()
    );
}
