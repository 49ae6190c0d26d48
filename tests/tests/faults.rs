//! Faults: a full disk, SIGKILL in the middle of a write, maps too small for
//! the load, and targets that die, exec another binary, or whose pid is
//! reused by a new process.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use profiler_tests::daemon::{Daemon, profilerd_bin, require_root};
use profiler_tests::http::{Exposition, get, parse_exposition};
use profiler_tests::process::{Guarded, mkfifo, process_alive, run_with_timeout, wait_until};
use profiler_tests::profiles::{
    FlatSample, ProfileFile, dir_entries, flatten_all, of_pid, parse_file_name, read_profiles,
    share_with, summary, total_count,
};
use profiler_tests::workloads::{Running, Workload, comm_of, compile};
use profiler_tests::{check_cpu_files, check_heap_files, pause, pprof_tops, temp_dir};

/// Name of the log line of a window whose profiles could not be written.
const WRITE_FAILED: &str = "writing the profiles of this window failed";
/// Name of the log line of the first written window after failures.
const RECOVERED: &str = "writing profiles recovered after";

fn diag(samples: &[FlatSample], files: &[ProfileFile], daemon: &Daemon) -> String {
    format!(
        "\n{}\n{}\n{}",
        summary(samples),
        pprof_tops(files, None),
        daemon.describe()
    )
}

/// Compiles `tests/workloads/<source>` with frame pointers into `dir/exe`.
fn build_c(source: &str, dir: &Path, exe: &str) -> PathBuf {
    let mut cmd = Command::new("gcc");
    cmd.args(["-O2", "-fno-omit-frame-pointer", "-g", "-Wall", "-Werror"]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(source);
    compile(cmd, &src, &dir.join(exe))
}

/// A process that does nothing for a minute, to keep a `--pid` run alive.
fn idle_process() -> Guarded {
    let mut cmd = Command::new("sleep");
    cmd.arg("60");
    Guarded::spawn(cmd, "sleep")
}

/// The lines the daemon logged so far that contain `needle`.
fn lines_with(daemon: &Daemon, needle: &str) -> Vec<String> {
    daemon
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains(needle))
        .collect()
}

/// The value of `key=N` in the last logged line containing `line_has`.
fn logged_field(daemon: &Daemon, line_has: &str, key: &str) -> u64 {
    let line = lines_with(daemon, line_has)
        .pop()
        .unwrap_or_else(|| panic!("no line with {line_has:?}\n{}", daemon.describe()));
    let prefix = format!("{key}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}=N in {line:?}"))
}

// ---------------------------------------------------------------- disk full

/// A tmpfs mounted for one test, unmounted (lazily if still busy) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(at).expect("creating the mount point");
        let mut cmd = Command::new("mount");
        cmd.args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0755"),
            "tmpfs",
        ])
        .arg(at);
        let out = run_with_timeout(cmd, "mount", Duration::from_secs(10));
        assert!(
            out.status.success(),
            "mounting a tmpfs at {}: {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let mut cmd = Command::new("umount");
        cmd.arg("-l").arg(&self.0);
        let _ = run_with_timeout(cmd, "umount", Duration::from_secs(10));
    }
}

/// Writes `path` until the filesystem is full; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("creating the filler file");
    let block = [0u8; 4096];
    let mut written = 0u64;
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    written
}

/// A full output disk: every window fails with one error line (although
/// two profile types fail in it), no partial file is ever visible, and when
/// space returns writing resumes by itself with one recovery line whose
/// count matches the error lines.
#[test]
fn full_disk_logs_one_error_per_window_and_recovers() {
    require_root();
    let tmp = temp_dir();
    let mnt = tmp.path().join("disk");
    let disk = Tmpfs::mount(&mnt, "256k");
    let out = mnt.join("out");
    fs::create_dir(&out).expect("creating the output directory");
    let filler = mnt.join("filler");
    assert!(fill(&filler) > 0, "the tmpfs took no bytes");
    let target = idle_process();
    let pid = target.pid().to_string();

    let mut daemon = Daemon::start(&[
        "--pid",
        &pid,
        "--profiles",
        "cpu,block",
        "--interval",
        "1s",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    daemon.wait_ready();
    // Whatever is in the directory while the disk is full: never a profile
    // under a final name, not even for a moment.
    let mut seen_while_full = Vec::new();
    let three_failed = wait_until(Duration::from_secs(15), || {
        seen_while_full.extend(dir_entries(&out));
        lines_with(&daemon, WRITE_FAILED).len() >= 3
    });
    assert!(
        three_failed,
        "no three failed windows on a full disk\n{}",
        daemon.describe()
    );
    seen_while_full.sort();
    seen_while_full.dedup();
    assert!(
        seen_while_full.iter().all(|n| n.starts_with('.')),
        "visible entries while the disk was full: {seen_while_full:?}"
    );

    fs::remove_file(&filler).expect("freeing space");
    let freed = Instant::now();
    let recovered = wait_until(Duration::from_secs(10), || {
        !lines_with(&daemon, RECOVERED).is_empty()
    });
    assert!(
        recovered,
        "no recovery line after space returned\n{}",
        daemon.describe()
    );
    eprintln!(
        "figure: writing recovered {:?} after space returned",
        freed.elapsed()
    );
    pause(Duration::from_millis(1500));
    daemon.signal(libc::SIGTERM);
    daemon.wait_success(Duration::from_secs(10));

    let errors = lines_with(&daemon, WRITE_FAILED);
    let recovery = lines_with(&daemon, RECOVERED);
    assert_eq!(recovery.len(), 1, "{recovery:?}\n{}", daemon.describe());
    let failed_windows: usize = recovery[0]
        .split(RECOVERED)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {:?}", recovery[0]));
    assert_eq!(
        errors.len(),
        failed_windows,
        "one error line per failed window (two profile types each)\n{}",
        daemon.describe()
    );
    assert!(
        errors.iter().all(|l| l.contains("No space left on device")),
        "{errors:?}"
    );

    let entries = dir_entries(&out);
    let stray: Vec<&String> = entries
        .iter()
        .filter(|n| parse_file_name(n, "cpu").is_none() && parse_file_name(n, "block").is_none())
        .collect();
    assert!(stray.is_empty(), "left in the output directory: {stray:?}");
    let cpu = read_profiles(&out, "cpu");
    let block = read_profiles(&out, "block");
    assert!(
        !cpu.is_empty() && !block.is_empty(),
        "no profiles after recovery: {entries:?}\n{}",
        daemon.describe()
    );
    check_cpu_files(&cpu, 99);
    drop(target);
    drop(disk);
}

// ---------------------------------------------------------- SIGKILL mid-write

/// IDs of the BPF programs a process holds open (its fdinfo `prog_id`).
fn bpf_prog_ids_of(pid: u32) -> Vec<u32> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    let mut ids: Vec<u32> = fds
        .flatten()
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:"))
                .filter_map(|v| v.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// IDs of every BPF program loaded in the kernel (BPF_PROG_GET_NEXT_ID).
fn loaded_bpf_prog_ids() -> Vec<u32> {
    const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
    let mut ids = Vec::new();
    let mut attr = [0u32; 3]; // start_id, next_id, open_flags
    loop {
        // SAFETY: attr is a valid bpf_attr prefix of the size passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_GET_NEXT_ID,
                attr.as_mut_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        if rc != 0 {
            break; // ENOENT: no more programs
        }
        ids.push(attr[1]);
        attr = [attr[1], 0, 0];
    }
    ids
}

/// SIGKILL while a profile is being written (the write is held open by a
/// test hook): no file appears under a final name, the dead instance's BPF
/// programs are released by the kernel, and a restart on the same
/// directory removes the dead writer's temporary file and works.
#[test]
fn sigkill_mid_write_leaves_no_final_file_and_restart_works() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let target = idle_process();
    let pid = target.pid().to_string();

    let mut cmd = Command::new(profilerd_bin());
    cmd.args(["--pid", &pid, "--interval", "1s", "--output-dir"])
        .arg(&out)
        .env("PROFILERD_TEST_RENAME_DELAY_MS", "20000");
    let mut daemon = Daemon::start_command(cmd);
    daemon.wait_ready();
    let progs = bpf_prog_ids_of(daemon.pid());
    assert!(
        !progs.is_empty(),
        "the daemon holds no BPF programs\n{}",
        daemon.describe()
    );
    let mid_write = wait_until(Duration::from_secs(10), || {
        dir_entries(&out).iter().any(|n| n.contains(".pb.gz.tmp-"))
    });
    assert!(
        mid_write,
        "no temporary file appeared\n{}",
        daemon.describe()
    );
    daemon.signal(libc::SIGKILL);
    let status = daemon.wait_exit(Duration::from_secs(5));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    let left = dir_entries(&out);
    assert!(
        left.iter().all(|n| n.starts_with('.')),
        "a file under a final name after SIGKILL mid-write: {left:?}"
    );
    assert!(
        left.iter().any(|n| n.contains(".pb.gz.tmp-")),
        "the killed write's temporary file: {left:?}"
    );
    let killed = Instant::now();
    let released = wait_until(Duration::from_secs(10), || {
        let loaded = loaded_bpf_prog_ids();
        progs.iter().all(|id| !loaded.contains(id))
    });
    let loaded = loaded_bpf_prog_ids();
    assert!(
        released,
        "programs {progs:?} of the killed daemon are still loaded: {loaded:?}"
    );
    eprintln!(
        "figure: {} BPF programs of the killed daemon released within {:?}",
        progs.len(),
        killed.elapsed()
    );

    let mut restarted = Daemon::start(&[
        "--pid",
        &pid,
        "--interval",
        "1s",
        "--duration",
        "2s",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    restarted.wait_ready();
    restarted.wait_success(Duration::from_secs(15));
    assert_eq!(
        lines_with(&restarted, "removed 1 temporary file").len(),
        1,
        "{}",
        restarted.describe()
    );
    profiler_tests::profiles::assert_only_profiles(&out, "cpu");
    let files = read_profiles(&out, "cpu");
    assert!(!files.is_empty(), "{}", restarted.describe());
    check_cpu_files(&files, 99);
    drop(target);
}

// ------------------------------------------------------------------ full maps

fn scrape(addr: SocketAddr) -> Exposition {
    let (status, _, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    parse_exposition(&body)
}

/// Maps and rings far too small for the load (`[limits]`): the drops are
/// counted in /metrics and in the exit summary, each kind is logged once
/// over several windows, and every window's profiles are still written and
/// readable.
#[test]
fn tiny_maps_count_drops_and_profiles_are_still_written() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::Mixed.build(tmp.path(), "tiny_maps_mixed");
    let out = tmp.path().join("out");
    let config = tmp.path().join("profilerd.toml");
    // A ring of one page cannot hold one stack copy (16 KiB) or one heap
    // event; one count entry and one stack entry overflow at once.
    fs::write(
        &config,
        "[limits]\nstack_samples_bytes = 4096\nheap_events_bytes = 4096\n\
         counts_entries = 1\nstacks_entries = 1\nheap_live_entries = 1\n",
    )
    .expect("writing the config file");
    let mut daemon = Daemon::start(&[
        "--config",
        config.to_str().unwrap(),
        "--profiles",
        "cpu,heap",
        "--heap-sample-bytes",
        "1",
        "--interval",
        "1s",
        "--metrics-addr",
        "127.0.0.1:0",
        "--output-dir",
        out.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
        "4",
    ]);
    daemon.wait_ready();
    let addr = daemon.metrics_addr();
    let dropped = |m: &Exposition, map: &str, lost: &str| {
        m.value(
            "profilerd_bpf_dropped_total",
            &[("map", map), ("lost", lost)],
        )
    };
    let mut last = Exposition::default();
    let counted = wait_until(Duration::from_secs(8), || {
        last = scrape(addr);
        dropped(&last, "counts", "cpu_samples") > 0.0
            && dropped(&last, "stack_samples", "stack_copies") > 0.0
            && dropped(&last, "heap_events", "allocations") > 0.0
    });
    assert!(
        counted,
        "drops not counted in /metrics: {:?}\n{}",
        last.samples
            .iter()
            .filter(|s| s.name == "profilerd_bpf_dropped_total")
            .collect::<Vec<_>>(),
        daemon.describe()
    );
    daemon.wait_success(Duration::from_secs(15));
    eprintln!(
        "figure: tiny maps: {}",
        lines_with(&daemon, "session: summary ")
            .iter()
            .chain(&lines_with(&daemon, "heap summary"))
            .map(|l| l.split_once("summary").map_or(l.as_str(), |(_, r)| r))
            .collect::<Vec<_>>()
            .join(" |")
    );

    for key in ["count_map_full", "stack_copies_dropped"] {
        assert!(
            logged_field(&daemon, "session: summary ", key) > 0,
            "{key} in the exit summary\n{}",
            daemon.describe()
        );
    }
    assert!(
        logged_field(&daemon, "heap summary", "heap_allocs_lost") > 0,
        "{}",
        daemon.describe()
    );
    for what in [
        "samples dropped: count map full",
        "stack copies dropped",
        "sampled allocations dropped: heap event ring full",
    ] {
        assert_eq!(
            lines_with(&daemon, what).len(),
            1,
            "{what:?} is logged once over the run\n{}",
            daemon.describe()
        );
    }
    let cpu = read_profiles(&out, "cpu");
    let heap = read_profiles(&out, "heap");
    assert!(
        cpu.len() >= 3 && cpu.len() == heap.len(),
        "a cpu and a heap file per window: {:?}\n{}",
        dir_entries(&out),
        daemon.describe()
    );
    check_cpu_files(&cpu, 99);
    check_heap_files(&heap, 1);
    assert!(
        cpu.iter().any(|f| !f.profile.sample.is_empty()),
        "the kept samples are written\n{}",
        daemon.describe()
    );
}

// ------------------------------------------------------------- dying targets

/// One of two `--pid` targets is SIGKILLed mid-window: the daemon carries
/// on, and the last file holds the dead target's samples, symbolized; when
/// the other target exits too, the run ends with status 0.
#[test]
fn target_killed_mid_window_keeps_its_samples() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::ShortLived.build(tmp.path(), "killed_target");
    let out = tmp.path().join("out");
    let mut victim = Running::start(&exe, &["30"]);
    let victim_pid = victim.pid();
    let mut other = idle_process();
    let mut daemon = Daemon::start(&[
        "--pid",
        &format!("{victim_pid},{}", other.pid()),
        "--interval",
        "60s",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    daemon.wait_ready();
    pause(Duration::from_secs(2));
    victim.kill();
    pause(Duration::from_secs(2));
    assert!(
        process_alive(daemon.pid()),
        "the daemon stopped although a target lives\n{}",
        daemon.describe()
    );
    other.kill();
    let killed = Instant::now();
    daemon.wait_success(Duration::from_secs(10));
    assert!(
        killed.elapsed() <= Duration::from_secs(5),
        "the run took {:?} to end after the last target died",
        killed.elapsed()
    );

    let files = read_profiles(&out, "cpu");
    assert_eq!(files.len(), 1, "{}", daemon.describe());
    check_cpu_files(&files, 99);
    let samples = of_pid(&flatten_all(&files), victim_pid);
    let d = || diag(&samples, &files, &daemon);
    assert!(
        total_count(&samples) >= 30,
        "about 2 s at 99 Hz before the kill (less on a busy machine), got {}{}",
        total_count(&samples),
        d()
    );
    let burn = share_with(&samples, "short_lived_burn");
    assert!(
        burn >= 0.8,
        "short_lived_burn in {burn:.3} of the dead target's cpu{}",
        d()
    );
}

/// Children that exec a binary and are gone before the daemon can read
/// their mappings (it is stopped meanwhile) are symbolized all the same:
/// their first samples tell where the binary lies, and the daemon reads it
/// through a live process that maps it. A forked child that has not exec'd
/// takes its parent's mappings instead (see churn.rs).
#[test]
fn exec_and_exit_before_the_snapshot_is_symbolized() {
    require_root();
    let tmp = temp_dir();
    let exe = Workload::ShortLived.build(tmp.path(), "gone_unread");
    let out = tmp.path().join("out");
    let go = tmp.path().join("go");
    let holder = tmp.path().join("holder");
    mkfifo(&go);
    // The holder outlives the stop, so the daemon reads it and holds the
    // binary; each child burns 50 ms and exits while the daemon is stopped.
    let script = format!(
        "read go < '{go}'; '{exe}' 4 > '{holder}' & i=0; \
         while [ $i -lt {CHILDREN} ]; do '{exe}' 0.05 > /dev/null; i=$((i+1)); done; wait",
        go = go.display(),
        exe = exe.display(),
        holder = holder.display(),
    );
    let mut daemon = Daemon::start(&[
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "60s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    daemon.wait_ready();
    // The children's 0.5 s of burning, with room for their start-up.
    let stopped_for = with_the_daemon_stopped(&daemon, &go, Duration::from_millis(1500));
    daemon.wait_success(Duration::from_secs(30));

    let holder_pid: u32 = fs::read_to_string(&holder)
        .ok()
        .and_then(|t| t.trim().strip_prefix("pid=")?.parse().ok())
        .unwrap_or_else(|| panic!("the holder printed no pid\n{}", daemon.describe()));
    let files = read_profiles(&out, "cpu");
    let comm = comm_of(&exe);
    let children: Vec<FlatSample> = flatten_all(&files)
        .into_iter()
        .filter(|s| s.label("comm") == Some(comm.as_str()) && s.pid() != holder_pid)
        .collect();
    let d = || diag(&children, &files, &daemon);
    let pids: std::collections::BTreeSet<u32> = children.iter().map(|s| s.pid()).collect();
    assert!(
        pids.len() >= CHILDREN / 2 && total_count(&children) >= 15,
        "{} samples of {} children (of {CHILDREN} run while the daemon was stopped for {stopped_for:?}){}",
        total_count(&children),
        pids.len(),
        d()
    );
    let burn = share_with(&children, "short_lived_burn");
    assert!(
        burn >= 0.7,
        "short_lived_burn in {burn:.3} of the cpu of children gone before they were read{}",
        d()
    );
    let anchored = daemon.summary_field("processes_anchored");
    println!(
        "gone before read: {} samples of {} children, short_lived_burn in {burn:.3}, {anchored} placed from anchors",
        total_count(&children),
        pids.len()
    );
    assert!(
        anchored >= pids.len() as u64 / 2,
        "{anchored} processes placed from anchors for {} children{}",
        pids.len(),
        d()
    );
}

/// Stops the daemon (SIGSTOP), lets a script go by writing to its FIFO
/// `go`, and resumes the daemon after `stopped`: what the script runs
/// meanwhile is read only after. Returns how long the daemon was stopped.
fn with_the_daemon_stopped(daemon: &Daemon, go: &Path, stopped: Duration) -> Duration {
    daemon.signal(libc::SIGSTOP);
    let _resume = Resume(daemon.pid());
    let started = Instant::now();
    fs::write(go, "go\n").expect("the script reads the FIFO");
    pause(stopped);
    started.elapsed()
}

/// The same for heap samples of children too short-lived for any CPU
/// sample: `churn procs` forks children that allocate in churn_alloc and
/// exit within a few milliseconds, every other one after an exec of the
/// program. A forked child takes its parent's mappings; an exec'd one is
/// placed from the anchors its sampled allocations send.
#[test]
fn heap_of_exec_and_exit_before_the_snapshot_is_symbolized() {
    require_root();
    let tmp = temp_dir();
    let churn = Workload::Churn.build(tmp.path(), "gone_heap");
    let out = tmp.path().join("out");
    let go = tmp.path().join("go");
    mkfifo(&go);
    // System-wide, so that the allocator probes cover every child without
    // the daemon. 1.5 s of children; the daemon runs again while the parent
    // still lives, so that it reads the parent and holds the program.
    let script = format!(
        "read go < '{go}'; exec '{churn}' procs 100 1.5 > /dev/null",
        go = go.display(),
        churn = churn.display(),
    );
    let mut daemon = Daemon::start(&[
        "--output-dir",
        out.to_str().unwrap(),
        "--interval",
        "60s",
        "--profiles",
        "cpu,heap",
        "--heap-sample-bytes",
        "16384",
    ]);
    daemon.wait_ready();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]);
    let mut run = Guarded::spawn(cmd, "churn script");
    let stopped_for = with_the_daemon_stopped(&daemon, &go, Duration::from_millis(800));
    run.wait_timeout(Duration::from_secs(30));
    daemon.signal(libc::SIGTERM);
    daemon.wait_success(Duration::from_secs(30));
    let files = read_profiles(&out, "heap");
    let comm = comm_of(&churn);
    let samples: Vec<FlatSample> = flatten_all(&files)
        .into_iter()
        .filter(|s| s.label("thread") == Some(comm.as_str()))
        .collect();
    let parent = samples
        .iter()
        .map(|s| s.pid())
        .min()
        .unwrap_or_else(|| panic!("no heap samples of {comm}\n{}", daemon.describe()));
    // Children's allocations: 24 blocks of 1-16 KiB each, in churn_alloc.
    let children: Vec<&FlatSample> = samples.iter().filter(|s| s.pid() != parent).collect();
    let with_alloc = children
        .iter()
        .filter(|s| s.has_function("churn_alloc"))
        .count();
    let anchored = daemon.summary_field("processes_anchored");
    println!(
        "heap gone before read: {with_alloc} of {} children's samples in churn_alloc, {anchored} placed from anchors (stopped for {stopped_for:?})",
        children.len()
    );
    assert!(
        children.len() >= 40,
        "{} heap samples of children\n{}",
        children.len(),
        daemon.describe()
    );
    assert!(
        with_alloc as f64 >= 0.85 * children.len() as f64,
        "{with_alloc} of {} heap samples of children in churn_alloc\n{}\n{}",
        children.len(),
        summary(&samples),
        daemon.describe()
    );
    assert!(
        anchored >= 10,
        "{anchored} processes placed from anchors\n{}",
        daemon.describe()
    );
}

/// Children of [`exec_and_exit_before_the_snapshot_is_symbolized`].
const CHILDREN: usize = 10;

/// Sends SIGCONT to a stopped process when dropped, a failing test
/// included.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: plain syscall; the pid is the test's own daemon, which
        // is not reaped while this guard lives.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// A `--pid` target that execs another binary: the samples taken after the
/// exec are symbolized with the new binary's functions and carry its name,
/// those before it with the old one's. The exec falls in a later window
/// than the old binary's samples (see RELIABILITY.md for why).
#[test]
fn target_that_execs_is_symbolized_with_the_new_binary() {
    // Windows of 1 s, and a pause before the exec: the old image's last
    // window closes before the new image runs.
    exec_run("apart", "2.5", "1s", &[]);
}

/// An exec inside a window: that window's samples taken before the exec
/// keep the old binary's name and symbols, those after get the new one's.
/// Both ways of capturing stacks: copies unwound in the daemon (auto), and
/// frame-pointer stacks counted in the kernel (fp), which are drained
/// before the exec is applied.
#[test]
fn exec_inside_a_window_keeps_each_image_apart() {
    exec_run("window_auto", "0", "60s", &[]);
    exec_run("window_fp", "0", "60s", &["--unwind", "fp"]);
}

/// Profiles `exec_burn` (1 s in before_exec_burn, `pause` seconds, then an
/// exec of short_lived, 1.5 s in short_lived_burn) under `--pid` with
/// `--interval interval`, and checks that every sample names the binary
/// it ran, with that binary's symbols.
fn exec_run(tag: &str, pause: &str, interval: &str, extra: &[&str]) {
    require_root();
    let tmp = temp_dir();
    let first = build_c("exec_burn.c", tmp.path(), &format!("exec_burn_{tag}"));
    let second = Workload::ShortLived.build(tmp.path(), &format!("exec2_{tag}"));
    let out = tmp.path().join("out");
    let mut target = Running::start(
        &first,
        &[
            "1",
            pause,
            "--wait-stdin",
            "--",
            second.to_str().unwrap(),
            "1.5",
        ],
    );
    let pid = target.pid();
    let mut args = vec![
        "--pid".to_string(),
        pid.to_string(),
        "--interval".to_string(),
        interval.to_string(),
        "--output-dir".to_string(),
        out.to_str().unwrap().to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let mut daemon = Daemon::start(&args);
    daemon.wait_ready();
    target.release();
    let stdout = target.finish(Duration::from_secs(20));
    assert!(
        stdout.lines().all(|l| l == format!("pid={pid}")),
        "the exec kept the pid: {stdout}"
    );
    daemon.wait_success(Duration::from_secs(10));

    let files = read_profiles(&out, "cpu");
    check_cpu_files(&files, 99);
    let samples = of_pid(&flatten_all(&files), pid);
    let d = || {
        format!(
            "\n{tag}: {} files{}",
            files.len(),
            diag(&samples, &files, &daemon)
        )
    };
    let (before, after) = check_two_images(
        tag,
        &samples,
        (&first, "before_exec_burn"),
        (&second, "short_lived_burn"),
        d,
    );
    assert_eq!(
        total_count(&before) + total_count(&after),
        total_count(&samples),
        "every sample of the pid names one of the two binaries{}",
        d()
    );
    // Copies carry their time, counts the start of their image: none is
    // given the other image.
    check_images_match_threads(tag, &samples, d);
    check_every_image_heard_of(tag, &daemon);
}

/// Every sample's process name (`comm`, from the image the daemon gave the
/// sample) is its thread's name when it was taken (`thread`, from the
/// kernel): for a single-threaded program that execs, the two differ only
/// when a sample was given the wrong image.
fn check_images_match_threads(tag: &str, samples: &[FlatSample], d: impl Fn() -> String) {
    let wrong: Vec<String> = samples
        .iter()
        .filter(|s| s.label("comm") != s.label("thread"))
        .map(|s| {
            format!(
                "{} x{}: {}",
                s.label("comm").unwrap_or("-"),
                s.count,
                s.label("thread").unwrap_or("-")
            )
        })
        .collect();
    println!(
        "{tag}: {} samples, {} given another image than the one that ran",
        total_count(samples),
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "samples given another image than the one that ran (comm x count: thread): {wrong:?}{}",
        d()
    );
}

/// A chain of 12 execs, 0.15 s apart, alternating between two names of
/// one program, sampled at 999 Hz: each exec is read by the daemon a few
/// milliseconds after it happened, while samples of the new image keep
/// coming; every one of them must get the image that ran. Both ways of
/// capturing stacks: copies, which carry the kernel's time of the sample
/// (auto), and counts aggregated in the kernel, which carry the start of
/// the image they ran (fp).
#[test]
fn exec_chain_gives_every_sample_the_image_that_ran() {
    exec_chain_run("auto", &[]);
    exec_chain_run("fp", &["--unwind", "fp"]);
}

fn exec_chain_run(tag: &str, extra: &[&str]) {
    require_root();
    let tmp = temp_dir();
    let a = build_c("exec_burn.c", tmp.path(), "exec_chain_a");
    let b = tmp.path().join("exec_chain_b");
    fs::copy(&a, &b).expect("copying the program");
    let last = Workload::ShortLived.build(tmp.path(), "exec_chain_end");
    let out = tmp.path().join("out");
    let (a, b, last) = (
        a.to_str().unwrap().to_string(),
        b.to_str().unwrap().to_string(),
        last.to_str().unwrap().to_string(),
    );
    // exec_chain_a 0.15 0 --wait-stdin -- exec_chain_b 0.15 0 -- ... -- exec_chain_end 0.3
    let mut args: Vec<String> = vec!["0.15".into(), "0".into(), "--wait-stdin".into()];
    for link in 1..12 {
        let next = if link % 2 == 1 { &b } else { &a };
        args.extend(["--".into(), next.clone(), "0.15".into(), "0".into()]);
    }
    args.extend(["--".into(), last, "0.3".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut target = Running::start(Path::new(&a), &args);
    let pid = target.pid();
    let pid_arg = pid.to_string();
    let mut args = vec![
        "--pid",
        pid_arg.as_str(),
        "--cpu-frequency",
        "999",
        "--interval",
        "60s",
        "--output-dir",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    let mut daemon = Daemon::start(&args);
    daemon.wait_ready();
    target.release();
    let stdout = target.finish(Duration::from_secs(30));
    // Each of the 12 links and the last program print their pid.
    assert_eq!(
        stdout
            .lines()
            .filter(|l| *l == format!("pid={pid}"))
            .count(),
        13,
        "every exec kept the pid: {stdout}"
    );
    daemon.wait_success(Duration::from_secs(10));

    let files = read_profiles(&out, "cpu");
    check_cpu_files(&files, 999);
    let samples = of_pid(&flatten_all(&files), pid);
    let d = || {
        format!(
            "\nchain {tag}: {} files{}",
            files.len(),
            diag(&samples, &files, &daemon)
        )
    };
    // About 0.15 s x 12 + 0.3 s at 999 Hz: far more than needed to see
    // the samples right after each exec.
    assert!(
        total_count(&samples) >= 500,
        "only {} samples of the chain{}",
        total_count(&samples),
        d()
    );
    for name in ["exec_chain_a", "exec_chain_b", "exec_chain_end"] {
        assert!(
            samples.iter().any(|s| s.label("comm") == Some(name)),
            "no sample of {name}{}",
            d()
        );
    }
    check_images_match_threads(&format!("chain {tag}"), &samples, d);
    check_every_image_heard_of(&format!("chain {tag}"), &daemon);
}

/// A sample read before its exec's event waited for it (the fresh name
/// is set some 100 us before the event is sent): none was added without
/// its image's event.
fn check_every_image_heard_of(tag: &str, daemon: &Daemon) {
    let waited = daemon.summary_field("samples_waited_for_image");
    let ahead = daemon.summary_field("counts_ahead_of_image");
    let unheard = daemon.summary_field("samples_image_unheard");
    println!(
        "{tag}: {waited} samples waited for their exec's event, {ahead} counts drained ahead of it, {unheard} added without it"
    );
    assert_eq!(
        unheard, 0,
        "{tag}: samples added without their image's event"
    );
}

/// A new process that gets the pid of one that exited (forced with clone3's
/// set_tid) is symbolized with its own mappings, not the old process's.
#[test]
fn reused_pid_is_symbolized_with_the_new_process() {
    // Windows of 1 s, and a pause: the old process's windows close first.
    reuse_run("apart", 2500, "1s");
}

/// A pid reused inside a window: the old and the new process each keep
/// their own name and symbols in that window's profile.
#[test]
fn reused_pid_inside_a_window_keeps_each_process_apart() {
    reuse_run("window", 0, "60s");
}

/// Runs short_lived (1 s) to its end, then forces its pid on pid_reuse
/// (1.5 s in reuse_burn) after `pause_ms`, under a system-wide daemon
/// with `--interval interval`, and checks each process's samples.
fn reuse_run(tag: &str, pause_ms: u64, interval: &str) {
    require_root();
    let tmp = temp_dir();
    let old_exe = Workload::ShortLived.build(tmp.path(), &format!("old_owner_{tag}"));
    let new_exe = build_c("pid_reuse.c", tmp.path(), &format!("pid_reuser_{tag}"));
    let out = tmp.path().join("out");
    let mut daemon = Daemon::start(&[
        "--interval",
        interval,
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    daemon.wait_ready();
    let mut old = Running::start(&old_exe, &["1", "--wait-stdin"]);
    let pid = old.pid();
    old.release();
    old.finish(Duration::from_secs(10));
    old.kill(); // reaped: the pid is free
    pause(Duration::from_millis(pause_ms));
    let mut cmd = Command::new(&new_exe);
    cmd.args([&pid.to_string(), "1.5"]);
    let reuse = run_with_timeout(cmd, "pid_reuse", Duration::from_secs(15));
    assert!(
        reuse.status.success(),
        "starting a process with pid {pid}: {} {}",
        reuse.status,
        String::from_utf8_lossy(&reuse.stderr)
    );
    pause(Duration::from_millis(1500));
    daemon.signal(libc::SIGTERM);
    daemon.wait_success(Duration::from_secs(10));

    let files = read_profiles(&out, "cpu");
    let samples = of_pid(&flatten_all(&files), pid);
    let d = || {
        format!(
            "\n{tag}: {} files{}",
            files.len(),
            diag(&samples, &files, &daemon)
        )
    };
    let (_, new_samples) = check_two_images(
        tag,
        &samples,
        (&old_exe, "short_lived_burn"),
        (&new_exe, "reuse_burn"),
        d,
    );
    assert!(
        share_with(&new_samples, "short_lived_burn") == 0.0,
        "the new process's samples show the old one's function{}",
        d()
    );
}

/// Splits the samples of one pid between two programs that ran under it,
/// by their `comm` label, and checks each: at least 10 samples of the
/// first and 20 of the second (1 s and 1.5 s at 99 Hz, less on a busy
/// machine), each at least 0.8 in its own function.
fn check_two_images(
    tag: &str,
    samples: &[FlatSample],
    (first, first_fn): (&Path, &str),
    (second, second_fn): (&Path, &str),
    d: impl Fn() -> String,
) -> (Vec<FlatSample>, Vec<FlatSample>) {
    let of = |exe: &Path| -> Vec<FlatSample> {
        let comm = comm_of(exe);
        samples
            .iter()
            .filter(|s| s.label("comm") == Some(comm.as_str()))
            .cloned()
            .collect()
    };
    let (one, two) = (of(first), of(second));
    println!(
        "{tag}: first program {} samples, {first_fn} in {:.3}; second {} samples, {second_fn} in {:.3}",
        total_count(&one),
        share_with(&one, first_fn),
        total_count(&two),
        share_with(&two, second_fn),
    );
    for (what, part, function, least) in [
        ("first", &one, first_fn, 10),
        ("second", &two, second_fn, 20),
    ] {
        let share = share_with(part, function);
        assert!(
            total_count(part) >= least && share >= 0.8,
            "{what} program: {} samples (expected ≥ {least}), {function} in {share:.3} (expected ≥ 0.8){}",
            total_count(part),
            d()
        );
    }
    (one, two)
}

/// A `--pid` target exits and a new process takes its pid at once: the new
/// process is not profiled, and the run ends as for any exited target
/// instead of following the newcomer.
#[test]
fn reused_pid_of_a_target_is_not_a_target() {
    require_root();
    let tmp = temp_dir();
    let old_exe = Workload::ShortLived.build(tmp.path(), "old_target");
    let new_exe = build_c("pid_reuse.c", tmp.path(), "pid_taker");
    let out = tmp.path().join("out");
    let mut old = Running::start(&old_exe, &["0.5", "--wait-stdin"]);
    let pid = old.pid();
    let mut daemon = Daemon::start(&[
        "--pid",
        &pid.to_string(),
        "--interval",
        "60s",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    daemon.wait_ready();
    old.release();
    old.finish(Duration::from_secs(10));
    old.kill(); // reaped: the pid is free
    let exited = Instant::now();
    let mut cmd = Command::new(&new_exe);
    cmd.args([&pid.to_string(), "6"]);
    let mut taker = Guarded::spawn(cmd, "pid_reuse");
    let status = daemon.wait_exit(Duration::from_secs(10));
    let took = exited.elapsed();
    let taker_status = taker.try_wait();
    taker.kill();
    assert!(status.success(), "{}", daemon.describe());
    assert!(
        took <= Duration::from_secs(4),
        "the run ended {took:?} after its target exited (the new owner of pid {pid} runs 6 s)\n{}",
        daemon.describe()
    );
    assert!(
        taker_status.is_none(),
        "the new process ended early ({taker_status:?}): was pid {pid} free?"
    );

    let files = read_profiles(&out, "cpu");
    check_cpu_files(&files, 99);
    let samples = of_pid(&flatten_all(&files), pid);
    let d = || diag(&samples, &files, &daemon);
    assert_eq!(
        share_with(&samples, "reuse_burn"),
        0.0,
        "the new owner of the pid was profiled{}",
        d()
    );
    assert!(
        total_count(&samples) >= 10 && share_with(&samples, "short_lived_burn") >= 0.8,
        "the old target's samples{}",
        d()
    );
}
