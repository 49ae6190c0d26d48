//! User stacks of code built without frame pointers (`--unwind`): in the
//! default `auto` mode and in `dwarf` mode the daemon unwinds a copy of the
//! sampled thread's user stack with `.eh_frame`, so that gcc -O2, Rust
//! release builds and Debian's glibc give complete stacks; `--unwind fp`
//! keeps the kernel's frame-pointer walk. A stack that cannot be unwound to
//! its root ends with a `[truncated]` frame instead of being silently
//! shorter. `perf record --call-graph dwarf` is the reference.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use profiler_tests::daemon::{Daemon, profilerd_bin, require_root};
use profiler_tests::pprof_tool::go_binary;
use profiler_tests::process::{Guarded, Lines, mkfifo, run_with_timeout, wait_until};
use profiler_tests::profiles::{
    FlatSample, Frame, ProfileFile, assert_only_profiles, flatten_all, function_matches, of_pid,
    read_profiles, summary, total_count, total_cpu,
};
use profiler_tests::workloads::{Running, compile, field, parse_report};
use profiler_tests::{check_cpu_files, pprof_tops, temp_dir};

/// Sampling rate: a few seconds give well over a thousand samples.
const HZ: u64 = 499;
/// How long the workloads burn.
const BURN_SECONDS: &str = "3";
/// The function name of the frame that ends a stack that could not be
/// unwound to its root.
const TRUNCATED: &str = "[truncated]";
/// How much of a sampled thread's user stack the kernel copies, from the
/// stack pointer up.
const STACK_COPY_BYTES: u64 = 16 * 1024;
/// The long copy of a thread marked deep (`profiler_common::LONG_STACK_BYTES`).
const LONG_STACK_BYTES: u64 = 32 * 1024;
/// Bound on a workload's run once released.
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on the daemon's exit once its target has exited.
const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// The crate name of the Rust workload, so that its main is
/// `unwind_nofp_rs::main`.
const RUST_CRATE: &str = "unwind_nofp_rs";

// ---------------------------------------------------------------------------
// Building the workloads: like `profiler_tests::workloads`, but deliberately
// without frame pointers.

fn workload_source(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(file)
}

/// `gcc -O2 -g` (gcc's default: no frame pointers on x86-64) of
/// `tests/workloads/SOURCE` into `dir/exe_name`.
fn build_c(dir: &Path, source: &str, exe_name: &str) -> PathBuf {
    let mut cmd = Command::new("gcc");
    cmd.args(["-O2", "-g", "-Wall"]).current_dir(dir);
    compile(cmd, &workload_source(source), &dir.join(exe_name))
}

/// `rustc -C opt-level=3 -g` (no forced frame pointers) of
/// `tests/workloads/SOURCE` into `dir/exe_name`.
fn build_rust(dir: &Path, source: &str, exe_name: &str) -> PathBuf {
    let mut cmd = Command::new("rustc");
    cmd.args([
        "--edition",
        "2024",
        "--crate-name",
        RUST_CRATE,
        "-C",
        "opt-level=3",
        "-g",
    ])
    .current_dir(dir);
    compile(cmd, &workload_source(source), &dir.join(exe_name))
}

// ---------------------------------------------------------------------------
// Running a workload under the daemon.

/// Fails early, with a clear message, if the daemon has no `--unwind`.
fn require_unwind_option() {
    let mut cmd = Command::new(profilerd_bin());
    cmd.arg("--help");
    let out = run_with_timeout(cmd, "profilerd --help", Duration::from_secs(10));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--unwind"),
        "profilerd --help does not mention --unwind (the feature under test):\n{help}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One profiled run of a workload: the files, the samples of the workload's
/// process, its report, its pid and the daemon (for its logs).
struct Profiled {
    files: Vec<ProfileFile>,
    samples: Vec<FlatSample>,
    report: BTreeMap<String, u64>,
    pid: u32,
    daemon: Daemon,
}

/// Runs `exe BURN_SECONDS --wait-stdin` under
/// `profilerd --pid PID --cpu-frequency HZ EXTRA...`, profiling its whole
/// run: the workload waits until the daemon is ready. `before_release` runs
/// with the workload's pid after the daemon is ready and before the workload
/// starts burning (to start another profiler over the same seconds); its
/// result is returned alongside.
fn profile_with<T>(
    exe: &Path,
    extra: &[&str],
    out: &Path,
    before_release: impl FnOnce(u32) -> T,
) -> (Profiled, T) {
    let mut workload = Running::start(exe, &[BURN_SECONDS, "--wait-stdin"]);
    let pid = workload.pid();
    let pid_arg = pid.to_string();
    let hz = HZ.to_string();
    let mut args = vec![
        "--pid",
        &pid_arg,
        "--output-dir",
        out.to_str().expect("temporary paths are UTF-8"),
        "--interval",
        "60s",
        "--cpu-frequency",
        &hz,
    ];
    args.extend_from_slice(extra);
    let mut daemon = Daemon::start(&args);
    daemon.wait_ready();
    let side = before_release(pid);
    workload.release();
    let report = parse_report(&workload.finish(WORKLOAD_TIMEOUT), "pid");
    // Reaped, as its parent would do; the daemon then sees its target gone,
    // writes the last window and exits 0.
    workload.kill();
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);
    assert_eq!(
        report.get("pid").copied(),
        Some(u64::from(pid)),
        "the workload's report names another pid: {report:?}"
    );
    let files = read_profiles(out, "cpu");
    assert_only_profiles(out, "cpu");
    check_cpu_files(&files, HZ);
    let all = flatten_all(&files);
    let samples = of_pid(&all, pid);
    assert_eq!(
        samples.len(),
        all.len(),
        "--pid {pid}: the profile holds samples of other processes\n{}",
        summary(&all)
    );
    let profiled = Profiled {
        files,
        samples,
        report,
        pid,
        daemon,
    };
    assert!(
        total_count(&profiled.samples) >= 300,
        "a {BURN_SECONDS} s burn at {HZ} Hz gave only {} samples{}",
        total_count(&profiled.samples),
        profiled.diag(|_| true)
    );
    (profiled, side)
}

fn profile(exe: &Path, extra: &[&str], out: &Path) -> Profiled {
    profile_with(exe, extra, out, |_| ()).0
}

impl Profiled {
    /// Everything a failed assertion should show: the samples digest,
    /// examples of the samples for which `ok` fails (with mappings and
    /// addresses), `go tool pprof -top` and `-traces`, and the daemon's logs.
    fn diag(&self, ok: impl Fn(&FlatSample) -> bool) -> String {
        format!(
            "\n{}\n{}\n{}\n{}\n{}",
            summary(&self.samples),
            examples(&self.samples, ok),
            // Unfiltered: under --pid the files hold this process only.
            pprof_tops(&self.files, None),
            traces(&self.files, self.pid),
            self.daemon.describe()
        )
    }
}

// ---------------------------------------------------------------------------
// Reading stacks.

fn frame_text(f: &Frame) -> String {
    let mapping = Path::new(&f.mapping)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = if f.unsymbolized {
        "?".to_string()
    } else {
        f.function.clone()
    };
    format!("{name} ({mapping} {:#x})", f.address)
}

/// Up to 8 distinct stacks (with mapping and address of each frame) of the
/// samples for which `ok` fails, heaviest first.
fn examples(samples: &[FlatSample], ok: impl Fn(&FlatSample) -> bool) -> String {
    let mut bad: BTreeMap<String, i64> = BTreeMap::new();
    for s in samples.iter().filter(|s| !ok(s)) {
        let text: Vec<String> = s.frames.iter().map(frame_text).collect();
        *bad.entry(text.join("\n        <- ")).or_default() += s.count;
    }
    if bad.is_empty() {
        return "no sample fails the check".to_string();
    }
    let failing: i64 = bad.values().sum();
    let mut bad: Vec<(String, i64)> = bad.into_iter().collect();
    bad.sort_by_key(|(_, n)| -n);
    let mut out = format!("{failing} samples fail the check; the heaviest of their stacks:\n");
    for (stack, n) in bad.iter().take(8) {
        out.push_str(&format!("  {n} samples:\n        {stack}\n"));
    }
    out
}

/// The first lines of `go tool pprof -traces -tagfocus=pid=^PID$` of every
/// file (for failure messages; never panics).
fn traces(files: &[ProfileFile], pid: u32) -> String {
    let mut out = String::new();
    for f in files {
        let mut cmd = Command::new(go_binary());
        cmd.args(["tool", "pprof", "-traces"])
            // A regular expression: a bare number would be taken as a range
            // of a numeric label, and pid is a string label.
            .arg(format!("-tagfocus=pid=^{pid}$"))
            .arg(&f.path);
        if std::env::var_os("HOME").is_none() {
            cmd.env("HOME", std::env::temp_dir());
        }
        let res = run_with_timeout(cmd, "go tool pprof -traces", Duration::from_secs(60));
        let text = String::from_utf8_lossy(&res.stdout);
        let lines: Vec<&str> = text.lines().collect();
        out.push_str(&format!(
            "== go tool pprof -traces {} (first 80 of {} lines)\n{}\n{}",
            f.path.display(),
            lines.len(),
            lines[..lines.len().min(80)].join("\n"),
            String::from_utf8_lossy(&res.stderr)
        ));
    }
    out
}

/// Fraction of the cpu of `samples` for which `pred` holds.
fn share(samples: &[FlatSample], pred: impl Fn(&FlatSample) -> bool) -> f64 {
    let total = total_cpu(samples);
    let with: i64 = samples.iter().filter(|s| pred(s)).map(|s| s.cpu_ns).sum();
    with as f64 / total.max(1) as f64
}

fn has_main(s: &FlatSample) -> bool {
    s.has_function("main")
}

/// Whether the frames from the leaf-most frame of `chain[0]` on are
/// exactly `chain` (nearest caller first), frame after frame.
fn has_chain(s: &FlatSample, chain: &[&str]) -> bool {
    let Some(start) = s.position(chain[0]) else {
        return false;
    };
    s.frames.len() >= start + chain.len()
        && chain
            .iter()
            .zip(&s.frames[start..])
            .all(|(want, f)| function_matches(&f.function, want))
}

/// Among the samples containing `chain[0]`, the fraction (by cpu) that
/// [`has_chain`] `chain`.
fn chain_share(samples: &[FlatSample], chain: &[&str]) -> f64 {
    let with: Vec<FlatSample> = samples
        .iter()
        .filter(|s| s.has_function(chain[0]))
        .cloned()
        .collect();
    share(&with, |s| has_chain(s, chain))
}

fn ends_truncated(s: &FlatSample) -> bool {
    s.frames.last().is_some_and(|f| f.function == TRUNCATED)
}

fn is_libc(f: &Frame) -> bool {
    Path::new(&f.mapping)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
}

/// The first frame that is not a kernel frame.
fn user_leaf(s: &FlatSample) -> Option<&Frame> {
    s.frames.iter().find(|f| !f.is_kernel())
}

/// Prints (informative) how the stacks continue below main: which frame
/// follows main (glibc's __libc_start_call_main) and which is last (_start).
fn print_below_main(samples: &[FlatSample]) {
    let mut below: BTreeMap<String, i64> = BTreeMap::new();
    let mut roots: BTreeMap<String, i64> = BTreeMap::new();
    for s in samples {
        if let Some(i) = s.position("main") {
            let next = s.frames.get(i + 1).map_or("<none>".to_string(), frame_text);
            *below.entry(next).or_default() += s.count;
            *roots
                .entry(s.frames.last().map(frame_text).unwrap_or_default())
                .or_default() += s.count;
        }
    }
    println!("  frames below main (caller of main: samples): {below:?}");
    println!("  last frames of stacks with main: {roots:?}");
}

// ---------------------------------------------------------------------------
// perf, the reference.

/// `perf` if it runs here.
fn perf_binary() -> Option<PathBuf> {
    let mut cmd = Command::new("perf");
    cmd.arg("--version");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match cmd.status() {
        Ok(status) if status.success() => Some(PathBuf::from("perf")),
        _ => None,
    }
}

/// A `perf record` started with its events disabled and enabled through its
/// control FIFO, so that the test knows when it is recording.
struct PerfRecord {
    proc: Guarded,
    stderr: Lines,
    data: PathBuf,
    // Held open so that the FIFOs outlive perf's use of them.
    _ctl: File,
    _ack: File,
}

/// `perf record -e cpu-clock -F HZ --call-graph dwarf -p PID`, recording
/// when this returns.
fn start_perf(perf: &Path, pid: u32, dir: &Path) -> PerfRecord {
    let data = dir.join("perf.data");
    let (ctl_path, ack_path) = (dir.join("perf-ctl"), dir.join("perf-ack"));
    mkfifo(&ctl_path);
    mkfifo(&ack_path);
    // Read+write opens of a FIFO do not wait for the other end.
    let mut ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&ctl_path)
        .expect("opening perf's control FIFO");
    let mut ack = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&ack_path)
        .expect("opening perf's ack FIFO");
    let mut cmd = Command::new(perf);
    cmd.args(["record", "-e", "cpu-clock", "-F"])
        .arg(HZ.to_string())
        .args(["--call-graph", "dwarf", "-N", "-D", "-1", "-p"])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&data)
        .arg("--control")
        .arg(format!(
            "fifo:{},{}",
            ctl_path.display(),
            ack_path.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut proc = Guarded::spawn(cmd, "perf record");
    let stderr = proc.take_stderr().expect("stderr is piped");
    ctl.write_all(b"enable\n")
        .expect("writing to perf's control FIFO");
    let mut acked = String::new();
    let ok = wait_until(Duration::from_secs(15), || {
        let mut buf = [0u8; 64];
        match ack.read(&mut buf) {
            Ok(n) => acked.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading perf's ack FIFO: {e}"),
        }
        acked.contains("ack") || proc.try_wait().is_some()
    });
    if !(ok && acked.contains("ack")) {
        let status = proc.try_wait();
        proc.kill();
        panic!(
            "perf record did not acknowledge \"enable\" (exit status {status:?}):\n{}",
            stderr.text()
        );
    }
    PerfRecord {
        proc,
        stderr,
        data,
        _ctl: ctl,
        _ack: ack,
    }
}

/// Waits for perf record to finish (it stops when its target exits) and
/// returns the stacks of `perf script`: per sample, its symbols, leaf first.
fn finish_perf(mut rec: PerfRecord, perf: &Path) -> Vec<Vec<String>> {
    let Some(status) = rec.proc.wait_timeout(Duration::from_secs(20)) else {
        rec.proc.kill();
        panic!(
            "perf record did not stop after its target exited:\n{}",
            rec.stderr.text()
        );
    };
    let log = rec.stderr.finish(Duration::from_secs(2)).join("\n");
    assert!(status.success(), "perf record failed ({status}):\n{log}");
    println!("perf record: {}", log.replace('\n', " | "));
    let mut cmd = Command::new(perf);
    cmd.arg("script")
        .arg("-i")
        .arg(&rec.data)
        .args(["-F", "pid,ip,sym", "--no-inline"]);
    let out = run_with_timeout(cmd, "perf script", Duration::from_secs(60));
    assert!(
        out.status.success(),
        "perf script failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    parse_perf_script(&String::from_utf8_lossy(&out.stdout))
}

/// `perf script -F pid,ip,sym` output: a sample is a line with the pid
/// (right-aligned, so it may start with spaces), then one tab-indented
/// `IP SYMBOL` line per frame.
fn parse_perf_script(text: &str) -> Vec<Vec<String>> {
    let mut samples: Vec<Vec<String>> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with('\t') {
            samples.push(Vec::new());
            continue;
        }
        let mut fields = line.split_whitespace();
        let _ip = fields.next();
        let sym = fields.collect::<Vec<_>>().join(" ");
        if let Some(sample) = samples.last_mut() {
            sample.push(sym);
        }
    }
    samples
}

// ---------------------------------------------------------------------------
// The tests.

/// gcc -O2 code without frame pointers, default unwinding (auto): the whole
/// chain to main and below it into glibc.
#[test]
fn c_without_frame_pointers_reaches_main() {
    require_root();
    require_unwind_option();
    let tmp = temp_dir();
    let exe = build_c(tmp.path(), "unwind_nofp.c", "unwind_nofp_c");
    let run = profile(&exe, &[], &tmp.path().join("out"));
    let s = &run.samples;

    let main_share = share(s, has_main);
    let chain_a = chain_share(s, &["work_a", "run", "main"]);
    let chain_b = chain_share(s, &["work_b", "run", "main"]);
    let workers = share(s, |x| {
        user_leaf(x).is_some_and(|f| {
            function_matches(&f.function, "work_a") || function_matches(&f.function, "work_b")
        })
    });
    println!(
        "C -O2 (no frame pointers), --unwind auto: {} samples; main in {main_share:.4}; \
         work_a <- run <- main in {chain_a:.4} of work_a's, work_b <- run <- main in {chain_b:.4} \
         of work_b's; leaf in a worker {workers:.3}",
        total_count(s)
    );
    print_below_main(s);
    assert!(
        main_share >= 0.99,
        "main is in only {main_share:.4} of the cpu of code without frame pointers (expected ≥ 0.99){}",
        run.diag(has_main)
    );
    assert!(
        workers >= 0.9,
        "work_a/work_b are the leaf of only {workers:.3} of the cpu (expected ≥ 0.9){}",
        run.diag(|_| true)
    );
    // Complete walks tell the kernel where the thread's stack ends, so its
    // later copies stop there instead of reading the environment above
    // main; the chains below show that they still hold every frame.
    let (copies, bytes, tops, taken_back) = (
        run.daemon.summary_field("stack_copy_count"),
        run.daemon.summary_field("stack_copy_bytes"),
        run.daemon.summary_field("stack_tops_sent"),
        run.daemon.summary_field("stack_tops_taken_back"),
    );
    println!(
        "stack copies: {copies}, {} bytes each on average; stack tops sent {tops}, taken back {taken_back}",
        bytes / copies.max(1)
    );
    assert!(
        tops >= 1 && taken_back == 0,
        "stack tops sent {tops} (expected ≥ 1), taken back {taken_back} (expected 0){}",
        run.diag(|_| true)
    );
    for (leaf, chain, got) in [
        ("work_a", ["work_a", "run", "main"], chain_a),
        ("work_b", ["work_b", "run", "main"], chain_b),
    ] {
        assert!(
            got >= 0.99,
            "{leaf} <- run <- main, frame after frame, in only {got:.4} of {leaf}'s samples (expected ≥ 0.99){}",
            run.diag(|x| !x.has_function(leaf) || has_chain(x, &chain))
        );
    }
}

/// The same binary with `--unwind dwarf` and with `--unwind fp`: frame
/// pointer walking loses the callers, .eh_frame unwinding finds them.
#[test]
fn fp_mode_loses_what_dwarf_mode_finds() {
    require_root();
    require_unwind_option();
    let tmp = temp_dir();
    let exe = build_c(tmp.path(), "unwind_nofp.c", "unwind_fp_vs_dw");
    let dwarf = profile(&exe, &["--unwind", "dwarf"], &tmp.path().join("dwarf"));
    let fp = profile(&exe, &["--unwind", "fp"], &tmp.path().join("fp"));
    let dwarf_share = share(&dwarf.samples, has_main);
    let fp_share = share(&fp.samples, has_main);
    println!(
        "C -O2 (no frame pointers): main in {dwarf_share:.4} of {} samples with --unwind dwarf, \
         in {fp_share:.4} of {} samples with --unwind fp",
        total_count(&dwarf.samples),
        total_count(&fp.samples)
    );
    assert!(
        dwarf_share >= 0.99,
        "--unwind dwarf: main in only {dwarf_share:.4} of the cpu (expected ≥ 0.99){}",
        dwarf.diag(has_main)
    );
    // The premise of the comparison: the workload really has no frame
    // pointers, so the kernel's frame-pointer walk cannot reach main.
    assert!(
        fp_share < 0.9,
        "--unwind fp reaches main in {fp_share:.4} of the cpu: the workload keeps frame \
         pointers and is no test of .eh_frame unwinding{}",
        fp.diag(|_| true)
    );
    assert!(
        fp_share < dwarf_share,
        "--unwind fp reaches main in {fp_share:.4} of the cpu, not less than dwarf's {dwarf_share:.4}{}",
        fp.diag(|_| true)
    );
    // fp mode does not unwind copies of the stack; its samples still have
    // their leaf.
    let fp_leaf = share(&fp.samples, |x| {
        user_leaf(x).is_some_and(|f| {
            function_matches(&f.function, "work_a") || function_matches(&f.function, "work_b")
        })
    });
    println!("--unwind fp: leaf in work_a/work_b in {fp_leaf:.3} of the cpu");
    assert!(
        fp_leaf >= 0.9,
        "--unwind fp: work_a/work_b are the leaf of only {fp_leaf:.3} of the cpu{}",
        fp.diag(|_| true)
    );
    // A frame-pointer walk that broke off is marked, never silently short.
    let fp_marked = share(&fp.samples, |x| has_main(x) || ends_truncated(x));
    println!("--unwind fp: reaching main or ending in [truncated]: {fp_marked:.4} of the cpu");
    assert!(
        fp_marked >= 0.999,
        "--unwind fp: only {fp_marked:.4} of the cpu reaches main or ends in [truncated]{}",
        fp.diag(|x| !(has_main(x) || ends_truncated(x)))
    );
}

/// A Rust release build without forced frame pointers: its main is found.
#[test]
fn rust_release_build_reaches_main() {
    require_root();
    require_unwind_option();
    let tmp = temp_dir();
    let exe = build_rust(tmp.path(), "unwind_nofp.rs", "unwind_nofp_rs");
    let run = profile(&exe, &[], &tmp.path().join("out"));
    let s = &run.samples;
    let main_fn = format!("{RUST_CRATE}::main");
    let run_fn = format!("{RUST_CRATE}::run");
    let reaches = |x: &FlatSample| x.has_function(&main_fn);
    let main_share = share(s, reaches);
    let chain_a = chain_share(s, &["work_a", &run_fn, &main_fn]);
    let chain_b = chain_share(s, &["work_b", &run_fn, &main_fn]);
    println!(
        "Rust opt-level=3 (no frame pointers), --unwind auto: {} samples; {main_fn} in \
         {main_share:.4}; work_a <- run <- main in {chain_a:.4} of work_a's, work_b <- run <- \
         main in {chain_b:.4} of work_b's",
        total_count(s)
    );
    assert!(
        main_share >= 0.99,
        "{main_fn} is in only {main_share:.4} of the cpu of a Rust release build (expected ≥ 0.99){}",
        run.diag(reaches)
    );
}

/// A comparator called back from inside glibc's qsort: the unwinder must go
/// through glibc's frames (no frame pointers there either) back into the
/// executable.
#[test]
fn callback_through_glibc_qsort() {
    require_root();
    require_unwind_option();
    let tmp = temp_dir();
    let exe = build_c(tmp.path(), "qsort_cmp.c", "qsort_cmp");
    let run = profile(&exe, &[], &tmp.path().join("out"));
    let in_cmp =
        |x: &FlatSample| user_leaf(x).is_some_and(|f| function_matches(&f.function, "cmp_slow"));
    // cmp_slow, one or more frames of libc.so.6 (qsort's internals, however
    // they are named), sort_many, main.
    let through_libc = |x: &FlatSample| {
        let Some(i) = x.position("cmp_slow") else {
            return false;
        };
        let rest = &x.frames[i + 1..];
        let libc = rest.iter().take_while(|f| is_libc(f)).count();
        libc >= 1
            && rest
                .get(libc)
                .is_some_and(|f| function_matches(&f.function, "sort_many"))
            && rest
                .get(libc + 1)
                .is_some_and(|f| function_matches(&f.function, "main"))
    };
    let cmp_samples: Vec<FlatSample> = run.samples.iter().filter(|x| in_cmp(x)).cloned().collect();
    let cmp_share = share(&run.samples, in_cmp);
    let chain = share(&cmp_samples, through_libc);
    let mut libc_names: BTreeMap<String, i64> = BTreeMap::new();
    for x in cmp_samples.iter().filter(|x| through_libc(x)) {
        let i = x.position("cmp_slow").unwrap_or(0);
        for f in x.frames[i + 1..].iter().take_while(|f| is_libc(f)) {
            *libc_names.entry(f.function.clone()).or_default() += 1;
        }
    }
    println!(
        "qsort: {} samples, cmp_slow is the leaf of {cmp_share:.3}; cmp_slow <- libc.so.6... <- \
         sort_many <- main in {chain:.4} of them; libc frames seen: {libc_names:?}; sorts {:?}",
        total_count(&run.samples),
        run.report.get("sorts")
    );
    assert!(
        total_count(&cmp_samples) >= 200,
        "only {} samples have cmp_slow as their leaf{}",
        total_count(&cmp_samples),
        run.diag(|_| true)
    );
    assert!(
        chain >= 0.9,
        "cmp_slow <- libc.so.6 frame(s) <- sort_many <- main in only {chain:.4} of cmp_slow's samples (expected ≥ 0.9){}",
        run.diag(|x| !in_cmp(x) || through_libc(x))
    );
}

/// Side by side with `perf record --call-graph dwarf` over the same seconds
/// of the same process: we reach main at least as often as perf does, give
/// or take 0.02.
#[test]
fn as_complete_as_perf_dwarf() {
    require_root();
    require_unwind_option();
    let perf = perf_binary().unwrap_or_else(|| {
        panic!("`perf` does not run here: `cargo xtask test` installs it (Debian's linux-perf)")
    });
    let tmp = temp_dir();
    let exe = build_c(tmp.path(), "unwind_nofp.c", "unwind_vs_perf");
    let perf_dir = tmp.path().to_path_buf();
    let (run, rec) = profile_with(&exe, &[], &tmp.path().join("out"), |pid| {
        start_perf(&perf, pid, &perf_dir)
    });
    let perf_samples = finish_perf(rec, &perf);
    let perf_total = perf_samples.len();
    let perf_main = perf_samples
        .iter()
        .filter(|stack| stack.iter().any(|sym| function_matches(sym, "main")))
        .count();
    let perf_share = perf_main as f64 / perf_total.max(1) as f64;
    let ours = share(&run.samples, has_main);
    println!(
        "reaching main: profilerd {ours:.4} of {} samples, perf --call-graph dwarf {perf_share:.4} \
         ({perf_main} of {perf_total} samples)",
        total_count(&run.samples)
    );
    assert!(
        perf_total >= 300,
        "perf recorded only {perf_total} samples of a {BURN_SECONDS} s burn at {HZ} Hz"
    );
    assert!(
        ours >= perf_share - 0.02,
        "profilerd reaches main in {ours:.4} of the samples, perf in {perf_share:.4} (allowed: 0.02 less){}",
        run.diag(has_main)
    );
}

/// A stack deeper than the 16 KiB copy: the samples that do not reach main
/// say so with a final `[truncated]` frame and keep every frame the copy
/// holds; once the thread is marked deep, every frame the 32 KiB copy
/// holds; stacks that fit are complete.
#[test]
fn too_deep_stacks_end_with_truncated() {
    require_root();
    require_unwind_option();
    let tmp = temp_dir();
    let exe = build_c(tmp.path(), "deep_stack.c", "deep_stack");
    let run = profile(&exe, &[], &tmp.path().join("out"));
    let s = &run.samples;
    let leaf_is =
        |x: &FlatSample, f: &str| user_leaf(x).is_some_and(|l| function_matches(&l.function, f));
    let deep: Vec<FlatSample> = s
        .iter()
        .filter(|x| leaf_is(x, "burn_deep"))
        .cloned()
        .collect();
    let shallow: Vec<FlatSample> = s
        .iter()
        .filter(|x| leaf_is(x, "burn_shallow"))
        .cloned()
        .collect();
    let truncated: Vec<FlatSample> = s.iter().filter(|x| ends_truncated(x)).cloned().collect();
    let descend_frames = |x: &FlatSample| {
        x.frames
            .iter()
            .filter(|f| function_matches(&f.function, "descend"))
            .count()
    };
    // How many levels of the recursion a copy of STACK_COPY_BYTES from the
    // stack pointer holds (a little is left for burn_deep's own frame and
    // the return address).
    let frame_bytes = field(&run.report, "frame_bytes");
    assert!(
        (1024..=2048).contains(&frame_bytes),
        "the workload measured {frame_bytes} bytes of stack per level; expected a little more \
         than its 1 KiB array"
    );
    let fit = ((STACK_COPY_BYTES - 64) / frame_bytes) as usize;
    let mut depths: BTreeMap<usize, i64> = BTreeMap::new();
    for x in deep.iter().filter(|x| ends_truncated(x)) {
        *depths.entry(descend_frames(x)).or_default() += x.count;
    }
    println!(
        "deep stacks: {} samples; {} end with {TRUNCATED} ({:.3} of the cpu); burn_deep: {} \
         samples, {:.3} truncated; descend frames kept when truncated (frames: samples) \
         {depths:?}, {fit} expected for {frame_bytes}-byte levels in a {STACK_COPY_BYTES}-byte \
         copy; burn_deep's stack pointer at offset {:?} of its page; burn_shallow: {} samples, \
         main in {:.4}; rounds {:?}",
        total_count(s),
        total_count(&truncated),
        share(s, ends_truncated),
        total_count(&deep),
        share(&deep, ends_truncated),
        run.report.get("leaf_sp_page_offset"),
        total_count(&shallow),
        share(&shallow, has_main),
        run.report.get("rounds")
    );

    // Never silently shorter: complete to main, or marked.
    let complete_or_marked = |x: &FlatSample| has_main(x) || ends_truncated(x);
    let silent = s.iter().filter(|x| !complete_or_marked(x)).count();
    assert_eq!(
        silent,
        0,
        "{silent} samples neither reach main nor end with {TRUNCATED}{}",
        run.diag(complete_or_marked)
    );
    // The marker is the root-most frame, once.
    let misplaced = |x: &FlatSample| {
        let n = x.frames.iter().filter(|f| f.function == TRUNCATED).count();
        n > 1 || (n == 1 && !ends_truncated(x))
    };
    assert!(
        !s.iter().any(misplaced),
        "{TRUNCATED} is not (only) the last frame of some samples{}",
        run.diag(|x| !misplaced(x))
    );
    assert!(
        !truncated.is_empty(),
        "no sample ends with {TRUNCATED}, yet burn_deep runs 64 frames of more than 1 KiB \
         below main, beyond a 16 KiB copy of the stack{}",
        run.diag(|x| !leaf_is(x, "burn_deep") || ends_truncated(x))
    );
    // What fits in the copy is kept: a truncated stack has every frame the
    // copy holds.
    let short = depths.range(..fit).map(|(_, n)| n).sum::<i64>();
    assert_eq!(
        short,
        0,
        "{short} truncated burn_deep samples keep fewer than {fit} descend frames (frames: \
         samples {depths:?}), though a {STACK_COPY_BYTES}-byte copy from the stack pointer \
         holds {fit} levels of {frame_bytes} bytes (burn_deep's stack pointer is at offset \
         {:?} of its page){}",
        run.report.get("leaf_sp_page_offset"),
        run.diag(|x| !leaf_is(x, "burn_deep") || descend_frames(x) >= fit)
    );
    // Its thread is marked deep once its walks run past the usual copy:
    // later copies take the long form, and truncated stacks keep what it
    // holds; beyond it, the cut is counted.
    let long_fit = ((LONG_STACK_BYTES - 64) / frame_bytes) as usize;
    let long_kept: i64 = depths.range(long_fit..).map(|(_, n)| n).sum();
    let (long_records, cut_past_long) = (
        run.daemon.summary_field("records_long_form"),
        run.daemon.summary_field("unwinds_cut_past_long_copy"),
    );
    println!(
        "{long_kept} truncated burn_deep samples keep at least {long_fit} descend frames (a \
         {LONG_STACK_BYTES}-byte copy); {long_records} long records, {cut_past_long} walks cut \
         past a long copy"
    );
    assert!(
        long_kept > 0 && long_records > 0 && cut_past_long > 0,
        "no long copies of a thread whose walks ran past the usual copy ({long_kept} samples \
         with {long_fit} frames, {long_records} long records, {cut_past_long} walks cut past \
         one){}",
        run.diag(|x| !leaf_is(x, "burn_deep") || descend_frames(x) >= long_fit)
    );
    // The truncation is about depth: the shallow descent is complete.
    let shallow_main = share(&shallow, has_main);
    assert!(
        total_count(&shallow) >= 100 && shallow_main >= 0.99,
        "burn_shallow ({} samples, 3 frames of 1 KiB) reaches main in only {shallow_main:.4} \
         of its samples (expected ≥ 0.99){}",
        total_count(&shallow),
        run.diag(|x| !leaf_is(x, "burn_shallow") || has_main(x))
    );
}

/// The same deep recursion blocking in a futex wait at its bottom
/// (`--futex-wait`, block profile) and allocating there (`--malloc`, heap
/// profile of every allocation): the records of its thread, once marked
/// deep, keep what a 32 KiB copy holds, as its CPU samples do.
#[test]
fn too_deep_waits_and_allocations_take_the_long_copy() {
    require_root();
    let tmp = temp_dir();
    let exe = build_c(tmp.path(), "deep_stack.c", "deep_stack");
    for (flag, kind, extra) in [
        ("--futex-wait", "block", &[][..]),
        ("--malloc", "heap", &["--heap-sample-bytes", "1"][..]),
    ] {
        let out = tmp.path().join(kind);
        let mut workload = Running::start(&exe, &[BURN_SECONDS, "--wait-stdin", flag]);
        let pid = workload.pid().to_string();
        let mut args = vec![
            "--pid",
            &pid,
            "--profiles",
            kind,
            "--output-dir",
            out.to_str().expect("temporary paths are UTF-8"),
        ];
        args.extend_from_slice(extra);
        let mut daemon = Daemon::start(&args);
        daemon.wait_ready();
        workload.release();
        let report = parse_report(&workload.finish(WORKLOAD_TIMEOUT), "pid");
        workload.kill();
        daemon.wait_success(DAEMON_EXIT_TIMEOUT);
        let frame_bytes = field(&report, "frame_bytes");
        let long_fit = ((LONG_STACK_BYTES - 64) / frame_bytes) as usize;
        let samples = flatten_all(&read_profiles(&out, kind));
        let mut depths: BTreeMap<usize, i64> = BTreeMap::new();
        for x in samples.iter().filter(|x| x.has_function("burn_deep")) {
            let descend = x
                .frames
                .iter()
                .filter(|f| function_matches(&f.function, "descend"))
                .count();
            *depths.entry(descend).or_default() += x.count;
        }
        let long_records = daemon.summary_field("records_long_form");
        let kept: i64 = depths.range(long_fit..).map(|(_, n)| n).sum();
        let all: i64 = depths.values().sum();
        println!(
            "{kind}: burn_deep's records, descend frames kept (frames: count) {depths:?}; \
             {kept} of {all} keep at least {long_fit} (a {LONG_STACK_BYTES}-byte copy); \
             {long_records} long records"
        );
        assert!(
            kept > 0 && long_records > 0 && kept * 2 >= all,
            "{kind}: burn_deep's records do not take the long copy once its thread is marked \
             deep: {depths:?}, {long_records} long records\n{}",
            daemon.describe()
        );
    }
}

/// Threads blocked inside glibc, captured where they left the CPU
/// (sched_switch, `--profiles offcpu`) and at their futex wait
/// (`--profiles block`): the stacks go on through glibc's wrappers to the
/// calling functions (the frame-pointer walk stops inside glibc), and the
/// blocked times match what the threads measured.
#[test]
fn blocked_threads_show_their_callers() {
    require_root();
    let tmp = temp_dir();
    let mut gcc = Command::new("gcc");
    gcc.args(["-O2", "-g", "-Wall", "-pthread"])
        .current_dir(tmp.path());
    let exe = compile(
        gcc,
        &workload_source("blocked_threads.c"),
        &tmp.path().join("blocked_threads"),
    );
    let out = tmp.path().join("out");
    let mut workload = Running::start(&exe, &["--wait-stdin"]);
    let pid = workload.pid();
    let pid_arg = pid.to_string();
    let mut daemon = Daemon::start(&[
        "--pid",
        &pid_arg,
        "--profiles",
        "offcpu,block",
        "--block-rate",
        "100us",
        "--interval",
        "60s",
        "--output-dir",
        out.to_str().expect("temporary paths are UTF-8"),
    ]);
    daemon.wait_ready();
    workload.release();
    let report = parse_report(&workload.finish(WORKLOAD_TIMEOUT), "pid");
    workload.kill();
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);
    let (lock_ns, sleep_ns) = (field(&report, "lock_ns"), field(&report, "sleep_ns"));

    let offcpu = read_profiles(&out, "offcpu");
    let block = read_profiles(&out, "block");
    for file in offcpu.iter().chain(&block) {
        profiler_tests::pprof_tool::check_readable(&file.path, !file.profile.sample.is_empty());
    }
    let offcpu = of_pid(&flatten_all(&offcpu), pid);
    let block = of_pid(&flatten_all(&block), pid);
    let delay = |samples: &[FlatSample], pred: &dyn Fn(&FlatSample) -> bool| -> i64 {
        samples.iter().filter(|s| pred(s)).map(|s| s.cpu_ns).sum()
    };
    let diag = || {
        let show = |samples: &[FlatSample]| {
            samples
                .iter()
                .map(|s| format!("{} ns: {}", s.cpu_ns, s.stack_text()))
                .collect::<Vec<_>>()
                .join("\n")
        };
        format!(
            "\n--- offcpu ---\n{}\n--- block ---\n{}\n{}",
            show(&offcpu),
            show(&block),
            daemon.describe()
        )
    };
    // The user part of each stack: the wait's glibc wrappers, then the
    // caller, its thread function and the thread's start.
    let slept = |s: &FlatSample| has_chain(s, &["usleep", "sleep_site", "sleeper", "start_thread"]);
    // glibc's lock under the name perf prints (its default version's), or
    // its DWARF names where the debug file's table is not read.
    let locked = |s: &FlatSample| {
        [
            "pthread_mutex_lock",
            "___pthread_mutex_lock",
            "__pthread_mutex_lock",
        ]
        .iter()
        .any(|lock| has_chain(s, &[lock, "lock_site", "locker", "start_thread"]))
    };
    let sleep_seen = delay(&offcpu, &|s| s.has_function("usleep"));
    let sleep_chained = delay(&offcpu, &slept);
    let lock_seen = delay(&offcpu, &|s| {
        s.has_function("lock_site") || s.has_function("locker")
    });
    let lock_chained = delay(&offcpu, &locked);
    let block_lock = delay(&block, &locked);
    println!(
        "measured: lock {lock_ns} ns, sleep {sleep_ns} ns; offcpu: sleep {sleep_chained}/{sleep_seen}, \
         lock {lock_chained}/{lock_seen}; block: lock {block_lock}"
    );
    let within = |got: i64, want: u64| (got as f64 / want as f64 - 1.0).abs() <= 0.2;
    assert!(
        within(sleep_chained, sleep_ns),
        "off-CPU time in usleep <- sleep_site <- sleeper <- start_thread: {sleep_chained} ns, \
         the thread measured {sleep_ns} ns{}",
        diag()
    );
    assert!(
        within(lock_chained, lock_ns),
        "off-CPU time in pthread_mutex_lock <- lock_site <- locker <- start_thread: \
         {lock_chained} ns, the thread measured {lock_ns} ns{}",
        diag()
    );
    assert!(
        within(block_lock, lock_ns),
        "futex wait in pthread_mutex_lock <- lock_site <- locker <- start_thread: {block_lock} ns, \
         the thread measured {lock_ns} ns{}",
        diag()
    );
    // The off-CPU stacks carry the kernel side too, from the scheduler down.
    assert!(
        offcpu
            .iter()
            .filter(|s| slept(s))
            .all(|s| s.frames.first().is_some_and(|f| f.is_kernel())),
        "off-CPU stacks of the sleeper do not start in the kernel{}",
        diag()
    );
}

/// Every stack optimization off (`[debug]`, `[limits] walk_memo_entries`):
/// no walk memo or hints, no short records, no stack tops.
const OPTIMIZATIONS_OFF: &str = "[limits]\nwalk_memo_entries = 0\n\n[debug]\nwalk_hints = false\nbrief_records = false\nshort_records = false\nstack_tops = false\n";

/// The same C program without frame pointers with every stack optimization
/// on and off: short records and copies that stop at the learned stack
/// top make CPU samples cheaper, never different. Both runs reach main in
/// every sample with every frame of the chains, and split their CPU
/// between work_a and work_b alike (each share has a standard deviation
/// of about 1.1 points over ~1500 samples; the bound is 5 of the
/// difference's).
#[test]
fn stack_optimizations_do_not_change_cpu_stacks() {
    require_root();
    require_unwind_option();
    let tmp = temp_dir();
    let exe = build_c(tmp.path(), "unwind_nofp.c", "unwind_nofp_c");
    let config = tmp.path().join("off.toml");
    std::fs::write(&config, OPTIMIZATIONS_OFF).expect("writing the config file");
    let on = profile(&exe, &["--unwind", "dwarf"], &tmp.path().join("on"));
    let off = profile(
        &exe,
        &[
            "--unwind",
            "dwarf",
            "--config",
            config.to_str().expect("UTF-8 path"),
        ],
        &tmp.path().join("off"),
    );
    let measure = |run: &Profiled| {
        let s = &run.samples;
        (
            share(s, has_main),
            chain_share(s, &["work_a", "run", "main"]),
            chain_share(s, &["work_b", "run", "main"]),
            share(s, |x| x.has_function("work_a")),
        )
    };
    let counters = |run: &Profiled| {
        [
            "records_short_form",
            "stack_tops_sent",
            "stack_tops_taken_back",
        ]
        .map(|c| run.daemon.summary_field(c))
    };
    let (m_on, m_off) = (measure(&on), measure(&off));
    let (c_on, c_off) = (counters(&on), counters(&off));
    let bytes = |run: &Profiled| {
        run.daemon.summary_field("stack_copy_bytes")
            / run.daemon.summary_field("stack_copy_count").max(1)
    };
    println!(
        "optimizations on: main {:.4}, chains {:.4} / {:.4}, work_a {:.3}; short records, tops sent, taken back {c_on:?}; {} bytes a copy",
        m_on.0,
        m_on.1,
        m_on.2,
        m_on.3,
        bytes(&on)
    );
    println!(
        "optimizations off: main {:.4}, chains {:.4} / {:.4}, work_a {:.3}; short records, tops sent, taken back {c_off:?}; {} bytes a copy",
        m_off.0,
        m_off.1,
        m_off.2,
        m_off.3,
        bytes(&off)
    );
    for (what, m, run) in [("on", m_on, &on), ("off", m_off, &off)] {
        assert!(
            m.0 >= 0.99 && m.1 >= 0.99 && m.2 >= 0.99,
            "optimizations {what}: main in {:.4} of the cpu, work_a <- run <- main in {:.4}, work_b <- run <- main in {:.4} (expected ≥ 0.99){}",
            m.0,
            m.1,
            m.2,
            run.diag(has_main)
        );
    }
    assert!(
        (m_on.3 - m_off.3).abs() <= 0.08,
        "work_a's share of the cpu: {:.3} with the optimizations, {:.3} without{}",
        m_on.3,
        m_off.3,
        off.diag(|_| true)
    );
    assert!(
        c_on[0] > 0 && c_on[1] > 0 && c_on[2] == 0 && c_off == [0; 3],
        "short records, stack tops sent and taken back: {c_on:?} on (expected some, some, none), {c_off:?} off (expected none){}",
        on.diag(|_| true)
    );
}
