//! `cargo xtask vm --tests`: the end-to-end tests, a representative subset
//! of every profile type's accuracy tests and of the ways profilerd is
//! started, run inside the VM as they run on the host. This module owns the
//! choice of tests, what they need in the VM (their binaries, the workloads
//! built beforehand, the pprof reader, the sources they read), the script
//! that runs them and the report of their results.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The tests run in the VMs: (test file, test name). Each profile type's
/// accuracy against what the workload measured of itself, under `--pid`
/// and under `-- COMMAND`, the Go runtime's park points, its goroutines,
/// environment labels, a process started after the daemon, process churn (with a
/// thread's id taken by a new process), and `--check` (which loads every
/// program, those of Go and Python samples too).
pub const SUITE: &[(&str, &str)] = &[
    ("cpu_profile", "c_workload_under_pid"),
    ("cpu_profile", "command_and_its_descendants"),
    ("heap_profile", "alloc_per_site_under_command"),
    ("heap_profile", "inuse_of_a_live_leak_under_pid"),
    ("heap_profile", "system_wide_covers_a_process_started_later"),
    ("block_mutex", "block_rate_corrects_the_bias_of_short_waits"),
    ("block_mutex", "mutex_held_every_wakeup"),
    ("block_mutex", "condition_waits_name_their_condition"),
    ("block_mutex", "go_goroutines_blocked_on_a_channel"),
    // Go's semaphore queues followed in the park probe, the mutex profile
    // on: what each kernel's verifier takes, and Go's own profiles agree.
    ("go_waits", "queued_contention_on_this_kernel"),
    // Goroutines read from a Go program's memory, as its runtime counts
    // them.
    ("go_goroutines", "goroutines_of_a_program_built_beforehand"),
    // One waiting thread: under emulation the daemon's unwinding runs tens
    // of times slower while waits keep their length, so the tests with two
    // and four waiting threads outrun its drain (222 and 930 wait events
    // lost, counted, and the profile short by as much).
    ("wait_accuracy", "waits_above_the_rate_are_all_kept"),
    ("labels", "pid_mode_carries_the_environment"),
    ("churn", "process_churn_briefly"),
    // New threads are told from new processes by task_newtask's clone
    // flags, whose record each kernel lays out its own way.
    (
        "churn",
        "thread_id_reused_by_a_new_process_keeps_its_own_name",
    ),
    // Every program verifies on this kernel, those loaded only at the
    // first Go or Python process too.
    (
        "kernel_check",
        "check_loads_the_go_and_python_sample_programs",
    ),
];

/// Where the test binaries go in the VM.
const TESTS_DIR: &str = "/tests";
/// Where the workloads built beforehand go in the VM.
const PREBUILT_DIR: &str = "/test-workloads";
/// Where the pprof reader goes in the VM.
const PPROF: &str = "/bin/pprof";
/// The CPU tests' sampling rate in the VMs: each sample costs tens of times
/// what it does on hardware under emulation.
const VM_CPU_HZ: u32 = 199;
/// Lines the script prints around each test; the closing one carries its
/// exit status.
const BEGIN: &str = "@@vm-test-begin ";
const END: &str = "@@vm-test-end ";
/// The line the script prints before running a failed test again.
const RETRY: &str = "@@vm-test-retry ";

/// What the tests need in the VM, built here.
pub struct Prepared {
    /// Files: path here, path in the VM.
    pub files: Vec<(PathBuf, PathBuf)>,
    /// The script that runs the tests.
    pub script: String,
}

/// Builds the test binaries of `tests` (file, name) and every workload,
/// and finds the pprof reader; returns what goes into the VM.
pub fn prepare(root: &Path, tests: &[(&str, &str)]) -> Result<Prepared> {
    let binaries = test_binaries(root)?;
    let prebuilt = root.join("target/vm/test-workloads");
    crate::run(
        crate::cargo()
            .args([
                "run",
                "--release",
                "--quiet",
                "--package",
                "profiler-tests",
                "--bin",
                "prebuild_workloads",
                "--",
            ])
            .arg(&prebuilt)
            .env_remove("PROFILERD_TEST_WORKLOADS")
            .stdout(std::process::Stdio::null()),
    )?;
    let mut files = Vec::new();
    let mut seen = BTreeSet::new();
    for (file, _) in tests {
        if !seen.insert(*file) {
            continue;
        }
        let exe = binaries
            .get(*file)
            .with_context(|| format!("cargo built no test binary named {file}"))?;
        files.push((exe.clone(), Path::new(TESTS_DIR).join(file)));
    }
    for entry in
        std::fs::read_dir(&prebuilt).with_context(|| format!("reading {}", prebuilt.display()))?
    {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            files.push((
                entry.path(),
                Path::new(PREBUILT_DIR).join(entry.file_name()),
            ));
        }
    }
    // The tests read the workloads' sources (line numbers, site names) at
    // the path they were built from.
    let sources = root.join("tests/workloads");
    for entry in
        std::fs::read_dir(&sources).with_context(|| format!("reading {}", sources.display()))?
    {
        let path = entry?.path();
        files.push((path.clone(), path));
    }
    files.push((pprof_reader()?, PathBuf::from(PPROF)));
    Ok(Prepared {
        files,
        script: script(tests),
    })
}

/// The script that runs each test alone, one after the other, between
/// markers, and exits 1 if any failed. Tests ignored on the host for the
/// VMs' sake (`process_churn_briefly`) run too. A test that fails is run
/// once more: under emulation a VM sharing two host cores with another
/// can stall for tens of milliseconds, which the accuracy tests' waits
/// cannot tell from a loss. The report says which passed only on the
/// second run, with the first run's failure.
pub fn script(tests: &[(&str, &str)]) -> String {
    let mut s = format!(
        "export PROFILERD_BIN=/bin/profilerd PROFILERD_TEST_WORKLOADS={PREBUILT_DIR} \
         PROFILERD_TEST_PPROF={PPROF} PROFILERD_TEST_CPU_HZ={VM_CPU_HZ} RUST_BACKTRACE=1\n\
         failed=0\n"
    );
    for (file, name) in tests {
        let _ = writeln!(
            s,
            "echo '{BEGIN}{file}::{name}'; start=$(date +%s)\n\
             {TESTS_DIR}/{file} --exact {name} --include-ignored --test-threads=1 --nocapture; rc=$?\n\
             if [ $rc != 0 ]; then echo '{RETRY}{file}::{name}'; \
             {TESTS_DIR}/{file} --exact {name} --include-ignored --test-threads=1 --nocapture; rc=$?; fi\n\
             echo \"{END}{file}::{name} $rc $(( $(date +%s) - start ))\"\n\
             [ $rc = 0 ] || failed=1"
        );
    }
    s.push_str("exit $failed\n");
    s
}

/// One test's result in the VM.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub test: String,
    /// Exit status of the test binary; None when the VM stopped first.
    pub status: Option<i32>,
    pub seconds: u64,
    /// It failed once and was run again.
    pub retried: bool,
    /// The test binary said it passed one test (`--exact` with a name that
    /// matches none runs nothing and exits 0).
    pub ran: bool,
}

/// What libtest prints when exactly one test ran and passed.
const ONE_PASSED: &str = "test result: ok. 1 passed";

/// The results in the script's output, in order; a test begun and never
/// ended (the deadline struck) has no status.
pub fn parse(output: &str) -> Vec<Outcome> {
    let mut results: Vec<Outcome> = Vec::new();
    for line in output.lines() {
        if let Some(test) = line.find(BEGIN).map(|at| &line[at + BEGIN.len()..]) {
            results.push(Outcome {
                test: test.trim().to_string(),
                status: None,
                seconds: 0,
                retried: false,
                ran: false,
            });
        } else if line.contains(ONE_PASSED) {
            if let Some(last) = results.last_mut().filter(|r| r.status.is_none()) {
                last.ran = true;
            }
        } else if let Some(test) = line.find(RETRY).map(|at| line[at + RETRY.len()..].trim()) {
            if let Some(last) = results.iter_mut().rev().find(|r| r.test == test) {
                last.retried = true;
            }
        } else if let Some(rest) = line.find(END).map(|at| &line[at + END.len()..]) {
            let mut words = rest.split_whitespace();
            let (Some(test), Some(status), Some(seconds)) =
                (words.next(), words.next(), words.next())
            else {
                continue;
            };
            if let Some(last) = results.iter_mut().rev().find(|r| r.test == test) {
                last.status = status.parse().ok();
                last.seconds = seconds.parse().unwrap_or(0);
            }
        }
    }
    results
}

/// A markdown table of the results.
pub fn table(results: &[Outcome]) -> String {
    let mut t = String::from("| test | result | seconds |\n|---|---|---|\n");
    for r in results {
        let result = match r.status {
            Some(0) if !r.ran => "**ran no test** (no test of that name)".to_string(),
            Some(0) if r.retried => "passed on the second run".to_string(),
            Some(0) => "passed".to_string(),
            Some(s) => format!("**failed** (exit {s})"),
            None => "**did not finish**".to_string(),
        };
        let _ = writeln!(t, "| {} | {result} | {} |", r.test, r.seconds);
    }
    t
}

/// The tests that passed only on their second run.
pub fn retried(results: &[Outcome]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.retried && r.status == Some(0) && r.ran)
        .map(|r| r.test.clone())
        .collect()
}

/// The tests of `tests` that did not pass, or were never reached.
pub fn failures(tests: &[(&str, &str)], results: &[Outcome]) -> Vec<String> {
    tests
        .iter()
        .map(|(file, name)| format!("{file}::{name}"))
        .filter(|t| {
            !results
                .iter()
                .any(|r| &r.test == t && r.status == Some(0) && r.ran)
        })
        .collect()
}

/// Lines of a failed test's panic message shown in the report: enough for
/// its failures and the start of its diagnosis.
const EXCERPT_LINES: usize = 60;

/// What `test` printed from its panic on, up to its backtrace (at most
/// [`EXCERPT_LINES`] lines), so that a failure in a VM is read in the
/// report itself and not only in a log left on the machine that ran it.
pub fn failure_excerpt(output: &str, test: &str) -> Option<String> {
    let begin = format!("{BEGIN}{test}");
    let end = format!("{END}{test} ");
    let section = output
        .lines()
        .skip_while(|l| !l.trim_end().ends_with(&begin))
        .skip(1)
        .take_while(|l| !l.contains(&end));
    let lines: Vec<&str> = section
        .skip_while(|l| !l.contains("panicked at"))
        .take_while(|l| {
            !l.starts_with("stack backtrace:")
                && !l.starts_with("note: run with")
                && !l.contains(RETRY)
        })
        .take(EXCERPT_LINES)
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The tests chosen by `filters` (substrings of `file::name`), all when
/// there are none.
pub fn chosen(filters: &[String]) -> Result<Vec<(&'static str, &'static str)>> {
    let tests: Vec<_> = SUITE
        .iter()
        .copied()
        .filter(|(file, name)| {
            filters.is_empty()
                || filters
                    .iter()
                    .any(|f| format!("{file}::{name}").contains(f.as_str()))
        })
        .collect();
    if tests.is_empty() {
        bail!("no test of the VM suite matches {filters:?}");
    }
    Ok(tests)
}

/// The release test binaries of profiler-tests by test file, as cargo
/// reports them.
fn test_binaries(root: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let out = Command::new("cargo")
        .current_dir(root)
        .args([
            "test",
            "--release",
            "--package",
            "profiler-tests",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the end-to-end tests failed: {}", out.status);
    }
    let mut binaries = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        if let (true, Some(name), Some(exe)) = (
            is_test,
            msg["target"]["name"].as_str(),
            msg["executable"].as_str(),
        ) {
            binaries.insert(name.to_string(), PathBuf::from(exe));
        }
    }
    Ok(binaries)
}

/// The pprof that `go tool pprof` runs: a static Go program, so it runs in
/// the VM without the toolchain.
fn pprof_reader() -> Result<PathBuf> {
    let goroot = crate::output(Command::new(go_binary()).args(["env", "GOROOT"]))
        .context("`go env GOROOT` failed: install golang-go")?;
    let goarch = crate::output(Command::new(go_binary()).args(["env", "GOHOSTARCH"]))
        .unwrap_or_else(|| "amd64".to_string());
    let pprof = Path::new(goroot.trim())
        .join("pkg/tool")
        .join(format!("linux_{}", goarch.trim()))
        .join("pprof");
    if !pprof.is_file() {
        bail!(
            "{} is missing: the Go toolchain has no pprof",
            pprof.display()
        );
    }
    Ok(pprof)
}

/// The `go` command, where the tests look for it.
fn go_binary() -> PathBuf {
    if crate::have("go") {
        PathBuf::from("go")
    } else {
        PathBuf::from("/usr/lib/go/bin/go")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_read_back_from_the_script_output() {
        let out = format!(
            "noise\n{BEGIN}a::x\nrunning 1 test\n{ONE_PASSED}; 0 failed\n[  1.0] kernel {END}a::x 0 12\n\
             {BEGIN}r::s\nthread 'r' panicked at r.rs:1:1:\nslow\n{RETRY}r::s\n{ONE_PASSED}\n{END}r::s 0 9\n\
             {BEGIN}n::m\nrunning 0 tests\ntest result: ok. 0 passed\n{END}n::m 0 1\n\
             {BEGIN}b::y\nok\nthread 't' panicked at t.rs:1:2:\nratio 0.8\nstack backtrace:\n  0: f\n\
             {END}b::y 101 30\n{BEGIN}c::z\npanicked\n"
        );
        let results = parse(&out);
        assert_eq!(
            results,
            [
                Outcome {
                    test: "a::x".into(),
                    status: Some(0),
                    seconds: 12,
                    retried: false,
                    ran: true,
                },
                Outcome {
                    test: "r::s".into(),
                    status: Some(0),
                    seconds: 9,
                    retried: true,
                    ran: true,
                },
                Outcome {
                    test: "n::m".into(),
                    status: Some(0),
                    seconds: 1,
                    retried: false,
                    ran: false,
                },
                Outcome {
                    test: "b::y".into(),
                    status: Some(101),
                    seconds: 30,
                    retried: false,
                    ran: false,
                },
                Outcome {
                    test: "c::z".into(),
                    status: None,
                    seconds: 0,
                    retried: false,
                    ran: false,
                },
            ]
        );
        assert_eq!(failure_excerpt(&out, "c::z"), None);
        assert_eq!(retried(&results), ["r::s"]);
        assert!(table(&results).contains("| r::s | passed on the second run | 9 |"));
        assert_eq!(
            failure_excerpt(&out, "r::s").as_deref(),
            Some("thread 'r' panicked at r.rs:1:1:\nslow")
        );
        assert_eq!(failure_excerpt(&out, "a::x"), None);
        assert_eq!(
            failure_excerpt(&out, "b::y").as_deref(),
            Some("thread 't' panicked at t.rs:1:2:\nratio 0.8")
        );
        let tests = [("a", "x"), ("b", "y"), ("c", "z"), ("d", "w"), ("n", "m")];
        assert_eq!(failures(&tests, &results), ["b::y", "c::z", "d::w", "n::m"]);
        assert!(table(&results).contains("| n::m | **ran no test**"));
        assert!(table(&results).contains("| c::z | **did not finish** | 0 |"));
    }

    #[test]
    fn the_script_runs_each_test_exactly_and_fails_if_any_fails() {
        let s = script(&[("cpu_profile", "c_workload_under_pid")]);
        assert!(s.contains(
            "/tests/cpu_profile --exact c_workload_under_pid --include-ignored --test-threads=1"
        ));
        assert!(s.contains("PROFILERD_TEST_WORKLOADS=/test-workloads"));
        assert!(s.ends_with("exit $failed\n"));
    }

    #[test]
    fn filters_choose_tests_and_an_empty_choice_is_refused() {
        assert_eq!(chosen(&[]).unwrap().len(), SUITE.len());
        let heap = chosen(&["heap_profile::".to_string()]).unwrap();
        assert!(heap.iter().all(|(f, _)| *f == "heap_profile"));
        assert!(chosen(&["no_such_test".to_string()]).is_err());
    }
}
