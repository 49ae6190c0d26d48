//! Processes whose CPU samples a program of their runtime takes: Go's
//! (frame pointers walked in the kernel, `go_sample`) and CPython's (its
//! frames read, `py_sample`), and the loading of those programs, once,
//! where `cpu_sample` tail-calls them.

use profiler_common::{FpProcess, PyRuntime};

use super::{ProbeError, Probes, load_tail_program};

impl Probes {
    /// In `auto` unwinding, lets the kernel walk this process's frame
    /// pointers instead of sending stack copies; `process` gives the range
    /// of its executable's code, for the words a leaf's caller may be in
    /// (`SampleKey::leaf_words`).
    pub fn mark_frame_pointer_process(&mut self, tgid: u32, mut process: FpProcess) {
        if !self.go_labels {
            process.go.labels_form = profiler_common::go_labels_form::NONE;
        }
        if let Err(e) = self.fp_processes.insert(tgid, process, 0) {
            tracing::debug!("marking process {tgid} for frame-pointer unwinding failed: {e}");
        }
        // After the mark: loading takes some 15 ms, during which the
        // process's samples are walked already.
        self.enable_go_sample();
    }

    /// Loads `go_sample` and puts it where `cpu_sample` tail-calls it,
    /// once: until then (and if it fails, which is logged once), a Go
    /// sample is counted as walked, without its leaf's caller or its
    /// labels. Loading it only when a Go process is there keeps its
    /// verification (some 15 ms) out of the start.
    fn enable_go_sample(&mut self) {
        if std::mem::replace(&mut self.go_sample_tried, true) {
            return;
        }
        match load_tail_program(
            &mut self.ebpf,
            "go_sample",
            (&mut self.go_programs, "GO_PROGRAMS"),
        ) {
            Ok(()) => tracing::debug!("Go samples get their leaf callers and labels"),
            Err(e) => tracing::warn!("Go samples go without their leaf callers and labels: {e}"),
        }
    }

    /// Has the kernel record the Python frames of CPython process `tgid`'s
    /// CPU samples, read with `runtime`'s layout; loads `py_sample` at the
    /// first (as `go_sample`).
    pub fn mark_python_process(&mut self, tgid: u32, runtime: PyRuntime) {
        if let Err(e) = self.py_processes.insert(tgid, runtime, 0) {
            tracing::debug!("marking process {tgid} as a Python process failed: {e}");
        }
        self.enable_py_sample();
    }

    /// Loads `py_sample` and puts it where `cpu_sample` tail-calls it,
    /// once (some 50-80 ms): at the first Python process, or ahead of
    /// the processes that start later (`session::run`).
    pub fn enable_py_sample(&mut self) {
        if std::mem::replace(&mut self.py_sample_tried, true) {
            return;
        }
        match load_tail_program(
            &mut self.ebpf,
            "py_sample",
            (&mut self.py_programs, "PY_PROGRAMS"),
        ) {
            Ok(()) => tracing::debug!("Python processes' samples get their Python frames"),
            Err(e) => tracing::warn!("Python processes' samples go without Python frames: {e}"),
        }
    }

    /// Forgets a process marked with `mark_python_process`.
    pub fn unmark_python_process(&mut self, tgid: u32) {
        let _ = self.py_processes.remove(&tgid);
    }

    /// Loads `go_sample` and `py_sample` now, as their first process
    /// would (for `--check`): whether each loads on this kernel.
    pub fn load_sample_programs(&mut self) -> [(&'static str, Result<(), ProbeError>); 2] {
        self.go_sample_tried = true;
        self.py_sample_tried = true;
        [
            (
                "go",
                load_tail_program(
                    &mut self.ebpf,
                    "go_sample",
                    (&mut self.go_programs, "GO_PROGRAMS"),
                ),
            ),
            (
                "python",
                load_tail_program(
                    &mut self.ebpf,
                    "py_sample",
                    (&mut self.py_programs, "PY_PROGRAMS"),
                ),
            ),
        ]
    }

    /// Forgets a process marked with `mark_frame_pointer_process`.
    pub fn unmark_frame_pointer_process(&mut self, tgid: u32) {
        let _ = self.fp_processes.remove(&tgid);
    }
}
