//! The deployment contract against the real daemon:
//!
//! - the capabilities that deploy/profilerd.service grants (read from the
//!   unit file) are enough for every profile type, system-wide, with --pid
//!   and with -- COMMAND: the daemon runs as root with exactly that set
//!   (checked in /proc/PID/status) and no-new-privs, as systemd starts it,
//!   and writes non-empty, symbolized profiles of a real workload;
//! - with every other property of the unit's sandbox applied as systemd
//!   applies it (profiler_tests::sandbox), a run of all five types still
//!   writes complete profiles;
//! - without CAP_BPF or CAP_PERFMON it stops at once with one line;
//! - `--retention` deletes exactly the daemon's own old files.

use std::collections::BTreeSet;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profiler_tests::daemon::{Daemon, profilerd_bin, require_root, workspace_root};
use profiler_tests::process::run_with_timeout;
use profiler_tests::profiles::{self, FlatSample, dir_entries, flatten_all, read_profiles};
use profiler_tests::sandbox::{Sandbox, Unit};
use profiler_tests::temp_dir;
use profiler_tests::workloads::{Running, Workload, comm_of};

const KINDS: [&str; 5] = ["cpu", "heap", "block", "mutex", "offcpu"];
/// Bound on one daemon run of these tests.
const RUN_BOUND: Duration = Duration::from_secs(40);

/// Capability numbers (linux/capability.h) of the names the unit may use.
fn cap_number(name: &str) -> u32 {
    match name {
        "CAP_DAC_OVERRIDE" => 1,
        "CAP_DAC_READ_SEARCH" => 2,
        "CAP_IPC_LOCK" => 14,
        "CAP_SYS_PTRACE" => 19,
        "CAP_SYS_ADMIN" => 21,
        "CAP_SYS_RESOURCE" => 24,
        "CAP_SYSLOG" => 34,
        "CAP_PERFMON" => 38,
        "CAP_BPF" => 39,
        "CAP_CHECKPOINT_RESTORE" => 40,
        other => panic!("capability {other} of the unit is not in this test's table"),
    }
}

/// The space-separated values of `key=` in the unit (one line expected).
fn unit_list(text: &str, key: &str) -> BTreeSet<String> {
    let lines: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "deploy/profilerd.service must set {key}= exactly once"
    );
    lines[0].split_whitespace().map(str::to_owned).collect()
}

/// The capability set of deploy/profilerd.service. The ambient set must be
/// the same (it matters only if the unit gets a User=).
fn unit_text() -> String {
    let path = workspace_root().join("deploy/profilerd.service");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn unit_capabilities() -> BTreeSet<String> {
    let text = unit_text();
    let bounding = unit_list(&text, "CapabilityBoundingSet");
    assert_eq!(
        unit_list(&text, "AmbientCapabilities"),
        bounding,
        "AmbientCapabilities and CapabilityBoundingSet differ"
    );
    assert!(
        !bounding.contains("CAP_SYS_ADMIN"),
        "the unit must not need CAP_SYS_ADMIN"
    );
    bounding
}

/// `setpriv` that runs the daemon as root with only `caps` (bounding set,
/// so also permitted and effective after exec) and no-new-privs: what
/// systemd does for CapabilityBoundingSet= and NoNewPrivileges=.
fn daemon_with_caps(caps: &BTreeSet<String>) -> Command {
    let list: Vec<String> = caps
        .iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--bounding-set=-all,{}", list.join(",")))
        .args(["--inh-caps=-all", "--no-new-privs", "--"])
        .arg(profilerd_bin());
    cmd
}

fn mask(caps: &BTreeSet<String>) -> u64 {
    caps.iter().map(|c| 1u64 << cap_number(c)).sum()
}

fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    u64::from_str_radix(value.trim(), 16).expect("a hex capability mask")
}

/// The daemon runs with exactly `caps`, nothing more.
fn assert_exact_caps(daemon: &Daemon, caps: &BTreeSet<String>) {
    let want = mask(caps);
    for field in ["CapEff:", "CapPrm:", "CapBnd:"] {
        assert_eq!(
            status_field(daemon.pid(), field),
            want,
            "{field} of the daemon is not exactly {caps:?}"
        );
    }
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    SystemWide,
    Pid,
    Command,
}

const ALL_KINDS_ARGS: [&str; 4] = [
    "--profiles",
    "cpu,heap,block,mutex,offcpu",
    "--interval",
    "60s",
];

/// Runs the daemon with `caps` on the mixed workload in `mode` and checks
/// every profile type's output.
fn profile_with_unit_caps(mode: Mode) {
    require_root();
    let caps = unit_capabilities();
    let tmp = temp_dir();
    let exe = Workload::Mixed.build(tmp.path(), "mixed");
    let comm = comm_of(&exe);
    let out = tmp.path().join("out");
    let mut cmd = daemon_with_caps(&caps);
    cmd.args(ALL_KINDS_ARGS).arg("--output-dir").arg(&out);
    match mode {
        Mode::SystemWide => {
            let mut work = Running::start(&exe, &["3", "--wait-stdin"]);
            work.wait_line(Duration::from_secs(10), |l| l.starts_with("ready"));
            // Type=notify: READY=1 must arrive with these capabilities too.
            let socket_path = tmp.path().join("notify.sock");
            let socket = std::os::unix::net::UnixDatagram::bind(&socket_path)
                .expect("binding the notify socket");
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            cmd.env("NOTIFY_SOCKET", &socket_path);
            let mut daemon = Daemon::start_command(cmd);
            daemon.wait_ready();
            let mut buf = [0u8; 256];
            let n = socket.recv(&mut buf).expect("READY=1 on NOTIFY_SOCKET");
            assert_eq!(&buf[..n], b"READY=1");
            assert_exact_caps(&daemon, &caps);
            work.release();
            work.finish(Duration::from_secs(20));
            daemon.signal(libc::SIGTERM);
            daemon.wait_success(RUN_BOUND);
            check_outputs(&out, &comm, &daemon);
        }
        Mode::Pid => {
            // Started by the test with every capability: reading it needs
            // CAP_SYS_PTRACE.
            let mut work = Running::start(&exe, &["3", "--wait-stdin"]);
            work.wait_line(Duration::from_secs(10), |l| l.starts_with("ready"));
            cmd.arg("--pid").arg(work.pid().to_string());
            let mut daemon = Daemon::start_command(cmd);
            daemon.wait_ready();
            assert_exact_caps(&daemon, &caps);
            work.release();
            work.finish(Duration::from_secs(20));
            daemon.wait_success(RUN_BOUND);
            check_outputs(&out, &comm, &daemon);
        }
        Mode::Command => {
            cmd.arg("--").arg(&exe).arg("3");
            let mut daemon = Daemon::start_command(cmd);
            daemon.wait_ready();
            assert_exact_caps(&daemon, &caps);
            daemon.wait_success(RUN_BOUND);
            check_outputs(&out, &comm, &daemon);
        }
    }
}

/// Every type has a file with samples of the workload, on its own
/// function; CPU stacks unwind to main (reading the process's mappings);
/// off-CPU kernel frames are symbolized (reading /proc/kallsyms).
fn check_outputs(out: &Path, comm: &str, daemon: &Daemon) {
    let ctx = || format!("files: {:?}\n{}", dir_entries(out), daemon.describe());
    for (kind, function) in [
        ("cpu", "mixed_burn"),
        ("heap", "mixed_alloc"),
        ("block", "mixed_lock"),
        ("mutex", "mixed_lock"),
        ("offcpu", "mixed_lock"),
    ] {
        let files = read_profiles(out, kind);
        assert!(!files.is_empty(), "no {kind} profile written\n{}", ctx());
        for f in &files {
            let size = std::fs::metadata(&f.path).map(|m| m.len()).unwrap_or(0);
            assert!(size > 0, "{} is empty", f.path.display());
        }
        let samples: Vec<FlatSample> = flatten_all(&files)
            .into_iter()
            .filter(|s| s.label("comm") == Some(comm))
            .collect();
        assert!(
            samples.iter().any(|s| s.has_function(function)),
            "{kind}: no sample of {comm} in {function}; its samples:\n{}\n{}",
            profiles::summary(&samples),
            ctx()
        );
        match kind {
            "cpu" => {
                let burn: Vec<&FlatSample> = samples
                    .iter()
                    .filter(|s| s.has_function("mixed_burn"))
                    .collect();
                let to_main = burn.iter().filter(|s| s.has_function("main")).count();
                assert!(
                    to_main * 10 >= burn.len() * 9,
                    "cpu: only {to_main} of {} mixed_burn stacks reach main\n{}",
                    burn.len(),
                    ctx()
                );
            }
            "offcpu" => {
                let named = samples.iter().any(|s| {
                    s.frames
                        .iter()
                        .any(|f| f.is_kernel() && !f.unsymbolized && !f.function.is_empty())
                });
                assert!(
                    named,
                    "offcpu: no symbolized kernel frame in {comm}'s samples\n{}",
                    ctx()
                );
            }
            _ => {}
        }
    }
}

#[test]
fn unit_capabilities_suffice_system_wide() {
    profile_with_unit_caps(Mode::SystemWide);
}

#[test]
fn unit_capabilities_suffice_for_pid() {
    profile_with_unit_caps(Mode::Pid);
}

#[test]
fn unit_capabilities_suffice_for_command() {
    profile_with_unit_caps(Mode::Command);
}

/// Every property of the unit's `[Service]` section applied as systemd
/// applies it (see `profiler_tests::sandbox`: namespaces and mounts, the
/// capability bounding set, every seccomp filter from the system-call sets
/// of `systemd-analyze syscall-filter`, umask, nice, the memory and CPU
/// limits in cgroups), on a run of all five profile types of a workload
/// in a /tmp the daemon cannot see. What is in force is read from the
/// daemon's /proc entries and from the launcher's probes; the profiles
/// must stay complete (every type, stacks to main, named kernel frames)
/// and within the unit's umask, and the daemon must be done within
/// TimeoutStopSec= of the workload's end. A property that is not exercised
/// is printed as such.
#[test]
fn unit_sandbox_keeps_profiles_complete() {
    require_root();
    let started = Instant::now();
    let mut sandbox = Sandbox::new(
        Unit::read(),
        &unit_capabilities(),
        &profilerd_bin(),
        Path::new(env!("CARGO_BIN_EXE_sandbox_exec")),
    );
    sandbox.print_report();
    let tmp = temp_dir();
    let exe = Workload::Mixed.build(tmp.path(), "mixed");
    assert!(
        exe.starts_with("/tmp"),
        "the workload must live in /tmp: {}",
        exe.display()
    );
    let socket = std::os::unix::net::UnixDatagram::bind(&sandbox.notify_socket)
        .expect("binding the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a read timeout");
    let mut work = Running::start(&exe, &["3", "--wait-stdin"]);
    work.wait_line(Duration::from_secs(10), |l| l.starts_with("ready"));
    let mut args: Vec<String> = ALL_KINDS_ARGS.iter().map(|a| a.to_string()).collect();
    // --pid: the daemon's share of the quota goes to this workload alone,
    // whatever else the machine runs (system-wide under the quota, a busy
    // machine costs it stacks; tests/memory_limit.rs loads the limit).
    args.extend([
        "--output-dir".into(),
        sandbox.state.display().to_string(),
        "--pid".into(),
        work.pid().to_string(),
    ]);
    let mut cmd = sandbox.command(&args);
    cmd.env("NOTIFY_SOCKET", &sandbox.notify_socket);
    let mut daemon = Daemon::start_command(cmd);
    daemon.wait_ready();
    println!("sandbox: ready {:?} after the start", daemon.elapsed());
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).expect("READY=1 on NOTIFY_SOCKET");
    assert_eq!(&buf[..n], b"READY=1");
    sandbox.check_probes(&daemon.stderr_lines());
    sandbox.check_process(daemon.pid());
    let hidden = format!("/proc/{}/root{}", daemon.pid(), exe.display());
    assert!(
        !Path::new(&hidden).exists(),
        "the daemon sees the workload's binary in /tmp"
    );
    assert_exact_caps(&daemon, &sandbox.caps);
    work.release();
    work.finish(Duration::from_secs(20));
    // Its target gone, the daemon writes the last window and exits, as on
    // SIGTERM: within the time systemd gives it.
    let stopping = Instant::now();
    daemon.wait_success(sandbox.stop_timeout.unwrap_or(RUN_BOUND));
    println!(
        "sandbox: exit {:?} after the workload's",
        stopping.elapsed()
    );
    check_outputs(&sandbox.state, &comm_of(&exe), &daemon);
    // What the CPU quota cost, if anything.
    let losses: Vec<String> = [
        "stack_copies_dropped",
        "wait_events_lost",
        "process_events_lost",
        "heap_allocs_lost",
    ]
    .iter()
    .map(|k| format!("{k}={}", daemon.summary_field(k)))
    .collect();
    println!("sandbox: losses {}", losses.join(" "));
    sandbox.check_files();
    sandbox.check_resources();
    println!("sandbox: the run took {:?}", started.elapsed());
}

#[test]
fn without_bpf_or_perfmon_one_line_and_nothing_written() {
    require_root();
    for missing in ["CAP_BPF", "CAP_PERFMON"] {
        let mut caps = unit_capabilities();
        assert!(caps.remove(missing), "the unit does not grant {missing}");
        let tmp = temp_dir();
        let out = tmp.path().join("out");
        let mut cmd = daemon_with_caps(&caps);
        cmd.args(ALL_KINDS_ARGS)
            .arg("--output-dir")
            .arg(&out)
            .args(["--duration", "2s"])
            .env("NO_COLOR", "1")
            .env_remove("PROFILERD_LOG")
            .env_remove("RUST_LOG");
        let output = run_with_timeout(cmd, "profilerd", Duration::from_secs(15));
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(output.status.code(), Some(1), "without {missing}: {stderr}");
        assert_eq!(lines.len(), 1, "without {missing}: not one line:\n{stderr}");
        assert!(
            lines[0].starts_with("profilerd: ") && lines[0].contains("CAP_BPF and CAP_PERFMON"),
            "without {missing}: the line must say what is missing: {stderr}"
        );
        assert!(
            dir_entries(&out).iter().all(|n| !n.ends_with(".pb.gz")),
            "without {missing}: files written: {:?}",
            dir_entries(&out)
        );
    }
}

/// `<kind>-<stamp>[-n].pb.gz` for a window that started `age` ago.
fn our_name(kind: &str, now: SystemTime, age: Duration, n: u32) -> String {
    let start = (now - age).duration_since(UNIX_EPOCH).unwrap();
    let stamp = profiles::utc_stamp(start.as_nanos() as i64);
    match n {
        0 => format!("{kind}-{stamp}.pb.gz"),
        n => format!("{kind}-{stamp}-{n}.pb.gz"),
    }
}

/// A file made immutable (`chattr +i`: not even root may delete it) for
/// the guard's life.
struct Immutable(std::path::PathBuf);

impl Immutable {
    fn set(path: &Path) -> Immutable {
        let out = run_with_timeout(
            {
                let mut c = Command::new("chattr");
                c.arg("+i").arg(path);
                c
            },
            "chattr",
            Duration::from_secs(10),
        );
        assert!(
            out.status.success(),
            "chattr +i {} failed (the test needs a file system with immutable files, such as ext4): {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Immutable(path.to_owned())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

fn write_aged(dir: &Path, name: &str, mtime: SystemTime) {
    let path = dir.join(name);
    std::fs::write(&path, b"not a profile").unwrap();
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(mtime).unwrap();
}

#[test]
fn retention_deletes_exactly_its_own_old_files() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    let retention = Duration::from_secs(20);

    // Ours and older than the retention by the name: deleted, even where
    // the mtime is fresh (the name decides).
    let mut expired = Vec::new();
    for (i, kind) in KINDS.iter().enumerate() {
        expired.push(our_name(kind, now, 2 * hour, 0));
        expired.push(our_name(kind, now, hour + Duration::from_secs(i as u64), 3));
    }
    for name in &expired {
        write_aged(&out, name, now);
    }
    // Ours and within the retention by the name: kept, even with an old mtime.
    let fresh = [
        our_name("cpu", now, Duration::from_secs(2), 0),
        our_name("heap", now, Duration::ZERO, 1),
    ];
    for name in &fresh {
        write_aged(&out, name, now - 48 * hour);
    }
    // Not ours, all old by name and mtime: kept.
    let old = now - 2 * hour;
    let old_name = our_name("cpu", now, 2 * hour, 0);
    let stamp = old_name
        .strip_prefix("cpu-")
        .and_then(|s| s.strip_suffix(".pb.gz"))
        .unwrap();
    let foreign = [
        format!("{old_name}.bak"),
        format!("{old_name}~"),
        format!("cpu-{stamp}.pb"),
        format!("CPU-{stamp}.pb.gz"),
        format!("gpu-{stamp}.pb.gz"),
        format!("cpu-{stamp}-0.pb.gz"),
        format!("cpu-{stamp}-01.pb.gz"),
        format!("cpu-{stamp}-x.pb.gz"),
        format!(".{old_name}.tmp-1-0"),
        "cpu-20261399T000000Z.pb.gz".to_owned(),
        "notes.txt".to_owned(),
    ];
    for name in &foreign {
        write_aged(&out, name, old);
    }
    // Our names, old, but a symlink (to a file outside) and a directory.
    let target = tmp.path().join("elsewhere.pb.gz");
    write_aged(tmp.path(), "elsewhere.pb.gz", old);
    let link = our_name("mutex", now, 2 * hour, 5);
    symlink(&target, out.join(&link)).unwrap();
    let subdir = our_name("block", now, 3 * hour, 0);
    std::fs::create_dir(out.join(&subdir)).unwrap();
    write_aged(&out.join(&subdir), &old_name, old);
    // Ours and expired, but it cannot be deleted: one warning, counted at
    // every sweep, and the daemon goes on.
    let stuck = our_name("heap", now, 2 * hour, 9);
    write_aged(&out, &stuck, now);
    let _immutable = Immutable::set(&out.join(&stuck));

    let mut daemon = Daemon::start(&[
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "2s",
        "--retention",
        "20s",
    ]);
    daemon.wait_ready();
    // The sweep at start has run.
    let after_start = dir_entries(&out);
    for name in &expired {
        assert!(
            !after_start.contains(name),
            "{name} is still there after start: {after_start:?}\n{}",
            daemon.describe()
        );
    }
    // A file that expires while the daemon runs goes after a window.
    let late = our_name(
        "offcpu",
        SystemTime::now(),
        retention + Duration::from_secs(1),
        7,
    );
    write_aged(&out, &late, SystemTime::now());
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !dir_entries(&out).contains(&late),
        "{late} was not deleted after a window\n{}",
        daemon.describe()
    );
    daemon.signal(libc::SIGTERM);
    daemon.wait_success(RUN_BOUND);

    let left: BTreeSet<String> = dir_entries(&out).into_iter().collect();
    let mut want: BTreeSet<String> = fresh.iter().cloned().collect();
    want.extend(foreign.iter().cloned());
    want.insert(link.clone());
    want.insert(subdir.clone());
    want.insert(stuck.clone());
    // Plus the daemon's own new cpu profiles, within the retention.
    let written: BTreeSet<String> = left
        .iter()
        .filter(|n| !want.contains(*n) && profiles::parse_file_name(n, "cpu").is_some())
        .cloned()
        .collect();
    assert!(
        written.len() >= 2,
        "expected the run's own cpu profiles: {left:?}"
    );
    want.extend(written);
    assert_eq!(left, want, "\n{}", daemon.describe());
    assert_eq!(std::fs::read(&target).unwrap(), b"not a profile");
    assert!(
        std::fs::symlink_metadata(out.join(&link))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(dir_entries(&out.join(&subdir)), [old_name]);
    let summary = daemon
        .stderr_lines()
        .into_iter()
        .find(|l| l.contains("retention summary"))
        .unwrap_or_default();
    let failures: u64 = summary
        .split_whitespace()
        .find_map(|w| w.strip_prefix("failures="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // At least the sweeps at start, after the first window and at exit.
    assert!(
        summary.contains(&format!("deleted={}", expired.len() + 1)) && failures >= 3,
        "retention summary: {summary:?}\n{}",
        daemon.describe()
    );
    let warnings: Vec<String> = daemon
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("WARN") && l.contains("retention"))
        .collect();
    assert!(
        warnings.len() == 1 && warnings[0].contains(&stuck),
        "one warning naming {stuck} expected, got {warnings:?}"
    );
}
