//! The daemon's life: signals mid-window, targets that exit, the window
//! schedule, and windows without samples.

use std::time::{Duration, Instant};

use profiler_tests::daemon::{Daemon, require_root};
use profiler_tests::process::Guarded;
use profiler_tests::profiles::{
    FlatSample, ProfileFile, assert_only_profiles, flatten, flatten_all, of_pid, read_profiles,
    share_with, summary, total_count,
};
use profiler_tests::workloads::{Running, Workload, comm_of};
use profiler_tests::{check_cpu_files, pause, pprof_tops, temp_dir};

/// The contract: SIGINT/SIGTERM → exit 0 within 5 s.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

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

/// Sends `signal` after `after` and checks the contract: exit 0 within 5 s,
/// exactly one complete file holding samples (with the burner's), no
/// temporary files left.
fn signal_mid_window(signal: i32, by_pid: bool) {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "signal_burner");
    let out = tmp.path().join("out");
    let mut burner = Running::start(&exe, &["20"]);
    let pid = burner.pid().to_string();
    let mut args = vec!["--output-dir", out.to_str().unwrap(), "--interval", "60s"];
    if by_pid {
        args.extend(["--pid", &pid]);
    }
    let mut daemon = Daemon::start(&args);
    daemon.wait_ready();
    let ready_at = Instant::now();
    pause(Duration::from_secs(3));
    daemon.signal(signal);
    let sent = Instant::now();
    // Allow a little for our own polling, none for the daemon.
    let status = daemon.wait_exit(SHUTDOWN_BOUND + Duration::from_secs(5));
    let took = sent.elapsed();
    let window = ready_at.elapsed();
    burner.kill();
    assert!(
        status.success(),
        "after signal {signal}: exit status {status}\n{}",
        daemon.describe()
    );
    assert!(
        took <= SHUTDOWN_BOUND,
        "after signal {signal} the daemon took {took:?} to exit (bound {SHUTDOWN_BOUND:?})\n{}",
        daemon.describe()
    );

    assert_only_profiles(&out, "cpu");
    let files = read_profiles(&out, "cpu");
    assert_eq!(
        files.len(),
        1,
        "one partial window: expected exactly one file, got {:?}\n{}",
        files.iter().map(ProfileFile::name).collect::<Vec<_>>(),
        daemon.describe()
    );
    check_cpu_files(&files, 99);
    let samples = flatten_all(&files);
    let d = || diag(&samples, &files, None, &daemon);
    let p = &files[0].profile;
    let duration = Duration::from_nanos(p.duration_nanos as u64);
    assert!(
        duration >= Duration::from_millis(2500) && duration <= window + Duration::from_millis(500),
        "the partial window lasted about 3 s (signal after 3 s, exit {took:?} later), but duration_nanos says {duration:?}{}",
        d()
    );
    let burner_samples = of_pid(&samples, burner.pid());
    assert!(
        total_count(&burner_samples) >= 30,
        "the burner ran for the whole window but has {} samples{}",
        total_count(&burner_samples),
        d()
    );
    let share = share_with(&burner_samples, "burn_a") + share_with(&burner_samples, "burn_b");
    assert!(
        share >= 0.8,
        "the burner's samples are in burn_a/burn_b for only {share:.3} of its cpu{}",
        d()
    );
}

#[test]
fn sigterm_mid_window_writes_the_partial_window() {
    signal_mid_window(libc::SIGTERM, false);
}

#[test]
fn sigint_mid_window_writes_the_partial_window() {
    signal_mid_window(libc::SIGINT, true);
}

#[test]
fn target_that_exits_ends_the_run_and_is_symbolized() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::ShortLived.build(tmp.path(), "short_lived_workload");
    let out = tmp.path().join("out");
    let mut workload = Running::start(&exe, &["1", "--wait-stdin"]);
    let pid = workload.pid();
    let mut daemon = Daemon::start(&[
        "--pid",
        &pid.to_string(),
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "30s",
    ]);
    daemon.wait_ready();
    workload.release();
    workload.finish(Duration::from_secs(10));
    // Gone for good (reaped) before the window is written.
    workload.kill();
    let exited = Instant::now();
    // The daemon notices on its own (no signal, no --duration).
    let status = daemon.wait_exit(Duration::from_secs(10));
    let took = exited.elapsed();
    assert!(
        status.success(),
        "exit status {status} after the target exited\n{}",
        daemon.describe()
    );
    assert!(
        took <= Duration::from_secs(5),
        "the daemon took {took:?} to stop after its only target exited\n{}",
        daemon.describe()
    );

    assert_only_profiles(&out, "cpu");
    let files = read_profiles(&out, "cpu");
    assert_eq!(
        files.len(),
        1,
        "one window (--interval 30s): expected one file, got {}",
        files.len()
    );
    check_cpu_files(&files, 99);
    let samples = of_pid(&flatten_all(&files), pid);
    let d = || diag(&samples, &files, Some(pid), &daemon);
    assert!(
        total_count(&samples) >= 50,
        "a 1 s burn at 99 Hz should give about 99 samples, got {}{}",
        total_count(&samples),
        d()
    );
    let comm = comm_of(&exe);
    for s in &samples {
        assert_eq!(
            s.label("comm"),
            Some(comm.as_str()),
            "comm label; labels {:?}",
            s.labels
        );
    }
    // Symbolized although the process was gone when the file was written.
    let burn = share_with(&samples, "short_lived_burn");
    assert!(
        burn >= 0.8,
        "short_lived_burn is in only {burn:.3} of the cpu (symbolized after exit?){}",
        d()
    );
    let main = share_with(&samples, "main");
    assert!(main >= 0.8, "main is in only {main:.3} of the cpu{}", d());
    let frame = samples
        .iter()
        .find_map(|s| s.position("short_lived_burn").map(|i| s.frames[i].clone()))
        .expect("checked above");
    assert!(
        frame.file.ends_with("short_lived.c") && frame.line > 0,
        "short_lived_burn without file and line: {frame:?}{}",
        d()
    );
}

#[test]
fn interval_schedule_full_and_partial_windows() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::CpuRatioC.build(tmp.path(), "interval_burner");
    let out = tmp.path().join("out");
    let mut burner = Running::start(&exe, &["20"]);
    let mut daemon = Daemon::start(&[
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "2s",
        "--duration",
        "5s",
    ]);
    daemon.wait_ready();
    daemon.wait_success(Duration::from_secs(15));
    burner.kill();

    assert_only_profiles(&out, "cpu");
    let files = read_profiles(&out, "cpu");
    let names: Vec<String> = files.iter().map(ProfileFile::name).collect();
    let windows: Vec<(i64, i64)> = files
        .iter()
        .map(|f| (f.profile.time_nanos, f.profile.duration_nanos))
        .collect();
    let ctx = || {
        format!(
            "files {names:?}, windows (time_nanos, duration_nanos) {windows:?}\n{}",
            daemon.describe()
        )
    };
    assert_eq!(
        files.len(),
        3,
        "--interval 2s --duration 5s: expected 2 full windows and 1 partial; {}",
        ctx()
    );
    check_cpu_files(&files, 99);

    let ms = |ns: i64| ns as f64 / 1e6;
    let expected = [2000.0, 2000.0, 1000.0];
    for (i, ((_, dur), want)) in windows.iter().zip(expected).enumerate() {
        assert!(
            (ms(*dur) - want).abs() <= 300.0,
            "window {i} lasted {:.0} ms, expected about {want} ms; {}",
            ms(*dur),
            ctx()
        );
    }
    for i in 1..windows.len() {
        let gap = ms(windows[i].0 - (windows[i - 1].0 + windows[i - 1].1));
        assert!(
            gap.abs() <= 100.0,
            "window {i} starts {gap:.0} ms after window {} ends: windows must follow each other; {}",
            i - 1,
            ctx()
        );
    }
    let total = ms(windows.iter().map(|w| w.1).sum());
    assert!(
        (total - 5000.0).abs() <= 400.0,
        "the windows cover {total:.0} ms of a 5 s run; {}",
        ctx()
    );
    for f in &files {
        let burner_samples = of_pid(&flatten(&f.profile), burner.pid());
        assert!(
            total_count(&burner_samples) > 0,
            "{}: no samples of the burner, which ran throughout; {}",
            f.name(),
            ctx()
        );
    }
}

#[test]
fn windows_without_samples_still_give_files() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("30");
    let sleeper = Guarded::spawn(cmd, "sleep");
    let mut daemon = Daemon::start(&[
        "--pid",
        &sleeper.pid().to_string(),
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "2s",
        "--duration",
        "3s",
    ]);
    daemon.wait_ready();
    daemon.wait_success(Duration::from_secs(12));
    assert_only_profiles(&out, "cpu");
    let files = read_profiles(&out, "cpu");
    assert_eq!(
        files.len(),
        2,
        "--interval 2s --duration 3s of an idle process: one full and one partial window, also without samples; got {:?}\n{}",
        files.iter().map(ProfileFile::name).collect::<Vec<_>>(),
        daemon.describe()
    );
    check_cpu_files(&files, 99);
    for f in &files {
        let others: Vec<FlatSample> = flatten(&f.profile)
            .into_iter()
            .filter(|s| s.pid() != sleeper.pid())
            .collect();
        assert!(
            others.is_empty(),
            "{}: samples of processes other than the target:\n{}",
            f.name(),
            summary(&others)
        );
    }
}

#[test]
fn ready_is_sent_to_the_notify_socket() {
    require_root();
    let tmp = temp_dir();
    let socket_path = tmp.path().join("notify.sock");
    let socket =
        std::os::unix::net::UnixDatagram::bind(&socket_path).expect("binding the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let out = tmp.path().join("out");
    let mut cmd = std::process::Command::new(profiler_tests::daemon::profilerd_bin());
    cmd.args([
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "60s",
        "--duration",
        "2s",
    ])
    .env("NOTIFY_SOCKET", &socket_path);
    let mut daemon = Daemon::start_command(cmd);
    daemon.wait_ready();
    let mut buf = [0u8; 512];
    let mut messages = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline
        && !messages
            .iter()
            .any(|m: &String| m.lines().any(|l| l == "READY=1"))
    {
        if let Ok(n) = socket.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    daemon.wait_success(Duration::from_secs(10));
    assert!(
        messages.iter().any(|m| m.lines().any(|l| l == "READY=1")),
        "no READY=1 on NOTIFY_SOCKET after the daemon logged ready; got {messages:?}\n{}",
        daemon.describe()
    );
}
