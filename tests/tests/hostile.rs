//! Hostile input through the real daemon: processes and threads whose names
//! hold '/', a newline and bytes that are not UTF-8; a binary deleted after
//! it started; a stripped copy of a binary (same build ID as the original);
//! a stack thousands of frames deep; config files with unknown keys, wrong
//! types, bytes that are not UTF-8 or megabytes of text; output directories
//! behind symlinks, owned by others or writable by others.

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use profiler_tests::daemon::{Daemon, profilerd_bin, require_root};
use profiler_tests::process::run_with_timeout;
use profiler_tests::profiles::{
    FlatSample, assert_only_profiles, dir_entries, flatten_all, function_matches, of_pid,
    read_profiles, summary, total_count,
};
use profiler_tests::workloads::{Running, compile};
use profiler_tests::{check_cpu_files, temp_dir};

/// Sampling rate: a few seconds give hundreds of samples per process.
const HZ: u64 = 499;
/// Levels of the workload's recursion: far more than any unwinder keeps.
const DEPTH: &str = "3000";
/// How long the released workloads burn.
const BURN_SECONDS: &str = "3";
/// How long only the stripped copy runs before the others start.
const STRIPPED_FIRST: Duration = Duration::from_millis(2500);
/// Bound on a workload's run once released.
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on the daemon's exit once its targets are gone.
const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(15);
/// Bad input must fail at once; this only bounds a hang.
const REJECT_BOUND: Duration = Duration::from_secs(15);
/// The function name of the frame that ends a stack that could not be
/// unwound to its root.
const TRUNCATED: &str = "[truncated]";
/// The names hostile_names.c gives its process and its worker thread, as
/// labels show them: invalid UTF-8 replaced by U+FFFD, control characters
/// escaped.
const PROC_LABEL: &str = "p/a\\nb\u{fffd}";
const THREAD_LABEL: &str = "t/\\n\u{fffd}(x";
/// A uid that owns nothing on a test machine.
const STRANGER: u32 = 4242;

fn build_workload(dir: &Path, exe_name: &str) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/hostile_names.c");
    let mut cmd = Command::new("gcc");
    cmd.args(["-O2", "-fno-omit-frame-pointer", "-g", "-Wall", "-pthread"])
        .current_dir(dir);
    compile(cmd, &src, &dir.join(exe_name))
}

fn run_tool(mut cmd: Command, what: &str) -> Output {
    cmd.env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .env_remove("PROFILERD_LOG");
    run_with_timeout(cmd, what, REJECT_BOUND)
}

/// Runs `profilerd ARGS` and checks the bad-input contract: exit `code`,
/// exactly one line on stderr that contains every one of `mentions`, and
/// nothing in `out`.
fn assert_rejected<S: AsRef<OsStr>>(args: &[S], code: i32, mentions: &[&str], out: &Path) {
    let mut cmd = Command::new(profilerd_bin());
    cmd.args(args);
    let what = format!("{cmd:?}");
    let output = run_tool(cmd, &what);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let ctx = format!("`{what}`: status {}, stderr:\n{stderr}", output.status);
    assert_eq!(output.status.code(), Some(code), "{ctx}\nexit status");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{ctx}\nexpected exactly one line on stderr");
    for m in mentions {
        assert!(lines[0].contains(m), "{ctx}\nthe line must mention {m:?}");
    }
    let left = dir_entries(out);
    assert!(left.is_empty(), "{ctx}\nnothing may be written: {left:?}");
}

fn ends_truncated(s: &FlatSample) -> bool {
    s.frames.last().is_some_and(|f| f.function == TRUNCATED)
}

fn user_leaf_is(s: &FlatSample, f: &str) -> bool {
    s.frames
        .iter()
        .find(|fr| !fr.is_kernel())
        .is_some_and(|fr| function_matches(&fr.function, f))
}

/// One run of the daemon on three copies of hostile_names (each naming
/// itself and its worker thread with '/', '\n' and invalid UTF-8, and
/// burning at the bottom of a 3000-level recursion), all given with
/// `--pid`: the original, a copy deleted before the daemon starts, and a
/// stripped copy with the same build ID that runs alone first. Every
/// process is profiled with its names shown escaped; the original and the
/// deleted copy are fully symbolized (the stripped copy's misses must not
/// hide the original's symbols); deep stacks end in `[truncated]`.
#[test]
fn hostile_names_deleted_and_stripped_binaries_deep_stacks() {
    require_root();
    let tmp = temp_dir();
    let original = build_workload(tmp.path(), "hostile_names");
    let deleted = tmp.path().join("deleted_copy");
    std::fs::copy(&original, &deleted).expect("copying the workload");
    let stripped = tmp.path().join("stripped_copy");
    std::fs::copy(&original, &stripped).expect("copying the workload");
    let strip = run_tool(
        {
            let mut c = Command::new("strip");
            c.arg("--strip-all").arg(&stripped);
            c
        },
        "strip",
    );
    assert!(strip.status.success(), "strip failed: {strip:?}");

    // The stripped copy burns from the start; the others wait for stdin.
    let stripped_run = Running::start(&stripped, &["60", DEPTH]);
    let mut original_run = Running::start(&original, &[BURN_SECONDS, DEPTH, "--wait-stdin"]);
    let mut deleted_run = Running::start(&deleted, &[BURN_SECONDS, DEPTH, "--wait-stdin"]);
    let mut stripped_run = stripped_run;
    for w in [&stripped_run, &original_run, &deleted_run] {
        w.wait_line(WORKLOAD_TIMEOUT, |l| l.starts_with("named "));
    }
    std::fs::remove_file(&deleted).expect("deleting the running copy");
    for w in [&stripped_run, &original_run, &deleted_run] {
        let comm = std::fs::read(format!("/proc/{}/comm", w.pid())).expect("reading comm");
        assert_eq!(comm, b"p/a\nb\xff\n", "the workload did not name itself");
    }

    let out = tmp.path().join("out");
    let pids = format!(
        "{},{},{}",
        stripped_run.pid(),
        original_run.pid(),
        deleted_run.pid()
    );
    let mut daemon = Daemon::start(&[
        "--pid",
        &pids,
        "--profiles",
        "cpu",
        "--interval",
        "1s",
        "--cpu-frequency",
        &HZ.to_string(),
        "--output-dir",
        out.to_str().expect("UTF-8 temp path"),
    ]);
    daemon.wait_ready();
    std::thread::sleep(STRIPPED_FIRST);
    original_run.release();
    deleted_run.release();
    original_run.finish(WORKLOAD_TIMEOUT);
    deleted_run.finish(WORKLOAD_TIMEOUT);
    stripped_run.kill();
    // Every target is gone: the daemon writes its last window and exits.
    daemon.wait_success(DAEMON_EXIT_TIMEOUT);

    assert_only_profiles(&out, "cpu");
    let files = read_profiles(&out, "cpu");
    check_cpu_files(&files, HZ);
    let samples = flatten_all(&files);
    let diag = || format!("{}\n{}", summary(&samples), daemon.describe());

    // Names: every process is there under its escaped name, and its worker
    // thread under the thread's.
    for (what, pid) in [
        ("original", original_run.pid()),
        ("deleted copy", deleted_run.pid()),
        ("stripped copy", stripped_run.pid()),
    ] {
        let mine = of_pid(&samples, pid);
        assert!(
            total_count(&mine) >= 20,
            "{what} (pid {pid}): only {} samples\n{}",
            total_count(&mine),
            diag()
        );
        let bad_comm: Vec<_> = mine
            .iter()
            .filter_map(|s| s.label("comm"))
            .filter(|c| *c != PROC_LABEL)
            .collect();
        assert!(
            bad_comm.is_empty(),
            "{what}: comm labels {bad_comm:?}, expected {PROC_LABEL:?}"
        );
        let threads: std::collections::BTreeSet<_> =
            mine.iter().filter_map(|s| s.label("thread")).collect();
        assert!(
            threads.contains(THREAD_LABEL) && threads.contains(PROC_LABEL),
            "{what}: thread labels {threads:?}, expected {THREAD_LABEL:?} and {PROC_LABEL:?}"
        );
    }

    // Symbols: the original and the deleted copy name their functions,
    // though the stripped copy (same build ID, no symbols) ran first.
    for (what, pid) in [
        ("original", original_run.pid()),
        ("deleted copy", deleted_run.pid()),
    ] {
        let mine = of_pid(&samples, pid);
        for f in ["deep_burn", "thread_burn"] {
            let with = total_count(
                &mine
                    .iter()
                    .filter(|s| user_leaf_is(s, f))
                    .cloned()
                    .collect::<Vec<_>>(),
            );
            assert!(
                with * 4 >= total_count(&mine),
                "{what} (pid {pid}): only {with} of {} samples have {f} as their user leaf\n{}",
                total_count(&mine),
                diag()
            );
        }
    }

    // Deep stacks: never silently short, never a crash. Thousands of
    // levels cannot all be kept, so every deep_burn stack is marked.
    let deep: Vec<FlatSample> = [original_run.pid(), deleted_run.pid()]
        .iter()
        .flat_map(|&pid| of_pid(&samples, pid))
        .filter(|s| user_leaf_is(s, "deep_burn"))
        .collect();
    let unmarked: Vec<&FlatSample> = deep.iter().filter(|s| !ends_truncated(s)).collect();
    assert!(
        unmarked.is_empty(),
        "{} of {} deep_burn samples do not end in {TRUNCATED}; first: {}",
        unmarked.len(),
        deep.len(),
        unmarked[0].stack_text()
    );
    let longest = deep.iter().map(|s| s.frames.len()).max().unwrap_or(0);
    println!(
        "deep_burn samples: {}, all ending in {TRUNCATED}; longest stack kept: {longest} frames",
        total_count(&deep)
    );

    // Logs: a name cannot split a log line (each starts with its time).
    for line in daemon.stderr_lines() {
        assert!(
            line.is_empty() || line.starts_with(|c: char| c.is_ascii_digit()),
            "a log line does not start with a time stamp: {line:?}\n{}",
            daemon.describe()
        );
    }
}

/// Config files with unknown keys, wrong types, bytes that are not UTF-8
/// and a size no config file has: one line naming the key and the line,
/// exit 2, nothing written.
#[test]
fn hostile_config_files() {
    require_root();
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let out_str = out.to_str().expect("UTF-8 temp path");
    let cases: [(&str, &[u8], &[&str]); 6] = [
        (
            "unknown.toml",
            b"interval = \"5s\"\n\nfrobnicate = 1\n",
            &["unknown key 'frobnicate'", "(line 3)"],
        ),
        (
            "wrong_type.toml",
            b"\ncpu_frequency = \"fast\"\n",
            &["key 'cpu_frequency'", "(line 2)"],
        ),
        (
            "wrong_label.toml",
            b"[labels]\nenv = 3\n",
            &["key 'labels.env'", "(line 2)"],
        ),
        (
            "table_for_string.toml",
            b"interval = { seconds = 5 }\n",
            &["key 'interval'", "(line 1)"],
        ),
        (
            "newline_in_value.toml",
            b"cpu_frequency = \"9\\n9\"\n",
            &["key 'cpu_frequency'", "(line 1)"],
        ),
        (
            "latin1.toml",
            b"interval = \"5s\"\n# caf\xe9\n",
            &["not UTF-8", "line 2"],
        ),
    ];
    for (name, text, mentions) in cases {
        let path = tmp.path().join(name);
        std::fs::write(&path, text).expect("writing the config file");
        let path_str = path.to_str().expect("UTF-8 temp path");
        assert_rejected(
            &["--config", path_str, "--output-dir", out_str],
            2,
            mentions,
            &out,
        );
    }

    // 2 MiB of comments: refused by its size, not read whole.
    let huge = tmp.path().join("huge.toml");
    std::fs::write(&huge, "# padding\n".repeat(200_000)).expect("writing");
    assert_rejected(
        &[
            "--config",
            huge.to_str().expect("UTF-8"),
            "--output-dir",
            out_str,
        ],
        2,
        &["larger than"],
        &out,
    );
}

/// Output directories: a symlink (owned by root) to a safe directory, in a
/// temporary directory under the sticky, world-writable /tmp, is followed and the files land in its target with mode 0640 even under
/// umask 0, and the directories the daemon creates are 0750; a parent
/// writable by others (not sticky), a directory owned by someone else and a
/// symlink planted by someone else are refused with one line and exit 1,
/// before anything is created.
#[test]
fn output_dir_symlinks_owners_and_modes() {
    require_root();
    let tmp = temp_dir();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink("real", &link).expect("symlink");
    let out = link.join("profiles");

    let workload = build_workload(tmp.path(), "hostile_names");
    let mut cmd = Command::new(profilerd_bin());
    cmd.args(["--profiles", "cpu", "--duration", "3s", "--output-dir"])
        .arg(&out)
        .arg("--")
        .arg(&workload)
        .args(["2", "10"]);
    // SAFETY: umask is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let mut daemon = Daemon::start_command(cmd);
    daemon.wait_success(Duration::from_secs(30));
    let landed = real.join("profiles");
    let dir_mode = std::fs::metadata(&landed)
        .expect("the daemon created the directory under the symlink's target")
        .permissions()
        .mode();
    assert_eq!(
        dir_mode & 0o7777,
        0o750,
        "created directory mode {dir_mode:o}"
    );
    assert_only_profiles(&landed, "cpu");
    let files = read_profiles(&landed, "cpu");
    assert!(
        !files.is_empty(),
        "no profile written\n{}",
        daemon.describe()
    );
    for f in &files {
        let mode = std::fs::metadata(&f.path).expect("metadata").mode();
        assert_eq!(mode & 0o7777, 0o640, "{}: mode {mode:o}", f.path.display());
    }
    check_cpu_files(&files, 99);

    // A parent anyone can write (not sticky): refused, nothing created.
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let under_open = open.join("profiles");
    assert_rejected(
        &[OsStr::new("--output-dir"), under_open.as_os_str()],
        1,
        &["not safe", "writable by others"],
        &under_open,
    );
    assert!(!under_open.exists(), "created a directory under {open:?}");

    // A directory owned by someone else.
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    std::os::unix::fs::lchown(&theirs, Some(STRANGER), None).expect("chown");
    assert_rejected(
        &[OsStr::new("--output-dir"), theirs.as_os_str()],
        1,
        &["not safe", &format!("owned by uid {STRANGER}")],
        &theirs,
    );

    // A symlink someone else planted, pointing at a safe directory.
    let planted = tmp.path().join("planted");
    std::os::unix::fs::symlink("real", &planted).expect("symlink");
    std::os::unix::fs::lchown(&planted, Some(STRANGER), None).expect("lchown");
    assert_rejected(
        &[OsStr::new("--output-dir"), planted.join("x").as_os_str()],
        1,
        &["not safe", "symlink", &format!("owned by uid {STRANGER}")],
        &planted.join("x"),
    );
    assert!(!real.join("x").exists(), "created a directory through it");
}
