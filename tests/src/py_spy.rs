//! py-spy, CPython's own sampling profiler (from PyPI, installed by
//! `cargo xtask test` under `target/tools/py-spy`), run beside the daemon
//! on the same process, and its raw output read back.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// One frame of a py-spy stack: function, file (as py-spy shows it) and
/// line.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpyFrame {
    pub function: String,
    pub file: String,
    pub line: u32,
}

/// The py-spy binary (`PROFILERD_TEST_PY_SPY`, else the one the test
/// command installs).
pub fn py_spy() -> PathBuf {
    std::env::var_os("PROFILERD_TEST_PY_SPY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/py-spy/bin/py-spy")
        })
}

/// Starts py-spy on `pid` at `hz` for the workload's run, without pausing
/// it, writing its raw (collapsed) stacks to `output`.
pub fn start_py_spy(pid: u32, hz: u64, output: &Path) -> Child {
    spy(pid, hz, output, &["--nonblocking"])
}

/// The same, with py-spy stopping the process at each sample (its
/// default): slower for the program, but no stack is read while it
/// changes (`--nonblocking` left some 7% of sympy's samples without their
/// outer frames).
pub fn start_py_spy_blocking(pid: u32, hz: u64, output: &Path) -> Child {
    spy(pid, hz, output, &[])
}

fn spy(pid: u32, hz: u64, output: &Path, extra: &[&str]) -> Child {
    Command::new(py_spy())
        .args(["record", "--format", "raw"])
        .args(extra)
        .arg("--rate")
        .arg(hz.to_string())
        .arg("--pid")
        .arg(pid.to_string())
        .arg("--output")
        .arg(output)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", py_spy().display()))
}

/// py-spy's collapsed stacks (root first), with their sample counts, once
/// it has exited. A sample of no Python frame (py-spy writes an empty
/// stack when it stops a thread outside Python code) has none.
pub fn py_spy_stacks(child: Child, output: &Path) -> Vec<(Vec<SpyFrame>, u64)> {
    let done = child.wait_with_output().expect("py-spy");
    let text = std::fs::read_to_string(output).unwrap_or_else(|e| {
        panic!(
            "py-spy wrote no {} ({e}): {}",
            output.display(),
            String::from_utf8_lossy(&done.stderr)
        )
    });
    text.lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            let frames = stack
                .split(';')
                .filter(|f| !f.trim().is_empty())
                .map(|f| {
                    let (function, place) = f.rsplit_once(" (").unwrap_or((f, ""));
                    let place = place.trim_end_matches(')');
                    let (file, line) = place.rsplit_once(':').unwrap_or((place, ""));
                    SpyFrame {
                        function: function.to_string(),
                        file: file.to_string(),
                        line: line.parse().unwrap_or(0),
                    }
                })
                .collect();
            Some((frames, count.parse().ok()?))
        })
        .collect()
}
