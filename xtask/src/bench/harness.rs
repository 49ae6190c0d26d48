//! What every benchmark shares: processes reaped on drop, CPU time and
//! status fields of a task, BPF run-time stats, a daemon run with its log,
//! and the statistics the reports print.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long a daemon may take to say it is ready.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Kills and reaps a child on drop, so the bench leaves nothing running.
pub(crate) struct Reaped(pub(crate) Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes C `source` to `work/NAME.c` and builds it with gcc and `flags`
/// into `work/NAME` (`what` names it in the error).
pub(crate) fn build_c(
    work: &Path,
    name: &str,
    source: &str,
    flags: &[&str],
    what: &str,
) -> Result<std::path::PathBuf> {
    let exe = work.join(name);
    let file = work.join(format!("{name}.c"));
    fs::write(&file, source)?;
    let built = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&file)
        .status()
        .context("running gcc")?;
    if !built.success() {
        bail!("building {what} failed");
    }
    Ok(exe)
}

/// On-CPU time of every thread of `pid`, in ns (schedstat: exact, unlike
/// the 10 ms ticks of /proc/PID/stat).
pub(crate) fn task_cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = entry?.path().join("schedstat");
        let text = fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        total += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

pub(crate) fn status_field(pid: u32, field: &str) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Parses "bpf program cpu_sample: N runs, X ns per run".
pub(crate) fn parse_bpf_line(line: &str) -> Option<(u64, f64)> {
    parse_bpf_line_of(line, "cpu_sample")
}

/// As [`parse_bpf_line`], for the program named `program`.
pub(crate) fn parse_bpf_line_of(line: &str, program: &str) -> Option<(u64, f64)> {
    let rest = line.split(&format!("{program}:")).nth(1)?;
    let mut words = rest.split_whitespace();
    let runs = words.next()?.parse().ok()?;
    let ns = rest
        .split(", ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((runs, ns))
}

/// bpftrace's own CPU time and its program's BPF run statistics, read from
/// /proc while it still runs.
pub(crate) fn bpftrace_figures(pid: u32) -> Result<(u64, u64, f64)> {
    let cpu = task_cpu_ns(pid)?;
    let (mut runs, mut time) = (0u64, 0u64);
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let text = fs::read_to_string(entry?.path()).unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let (Some(t), Some(c)) = (field("run_time_ns:"), field("run_cnt:")) {
            runs += c;
            time += t;
        }
    }
    Ok((cpu, runs, time as f64 / runs.max(1) as f64))
}

pub(crate) fn set_bpf_stats(on: bool) -> Result<()> {
    fs::write(
        "/proc/sys/kernel/bpf_stats_enabled",
        if on { "1" } else { "0" },
    )
    .context("setting kernel.bpf_stats_enabled")
}

/// A benchmark process waiting for "go" on its stdin.
pub(crate) struct Bench {
    pub(crate) child: Reaped,
    stdin: Option<ChildStdin>,
    pub(crate) lines: Receiver<String>,
    /// The program's name, for messages.
    what: String,
}

impl Bench {
    pub(crate) fn spawn(exe: &Path, args: &[String]) -> Result<Bench> {
        let what = exe
            .file_name()
            .map_or("benchmark".into(), |n| n.to_string_lossy().into_owned());
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting the {what} benchmark"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("benchmark stdout")?;
        let bench = Bench {
            child: Reaped(child),
            stdin,
            lines: line_channel(stdout),
            what,
        };
        let line = bench.line(READY_TIMEOUT)?;
        if line != "ready" {
            bail!("unexpected benchmark output {line:?}");
        }
        Ok(bench)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.0.id()
    }

    pub(crate) fn go(&mut self) -> Result<()> {
        let stdin = self.stdin.as_mut().context("benchmark stdin")?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        Ok(())
    }

    pub(crate) fn line(&self, timeout: Duration) -> Result<String> {
        self.lines
            .recv_timeout(timeout)
            .with_context(|| format!("the {} benchmark stopped answering", self.what))
    }

    /// Closes its stdin, so it ends, and waits for it.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.stdin = None;
        let status = self.child.0.wait()?;
        if !status.success() {
            bail!("the {} benchmark exited with {status}", self.what);
        }
        Ok(())
    }
}

/// A profilerd child and its log.
pub(crate) struct Daemon {
    pub(crate) child: Reaped,
    lines: Receiver<String>,
    log: Vec<String>,
}

impl Daemon {
    pub(crate) fn start(bin: &Path, args: &[String]) -> Result<Daemon> {
        Self::start_with_env(bin, args, &[])
    }

    /// [`Self::start`] with environment variables set for the daemon.
    pub(crate) fn start_with_env(
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Daemon> {
        let mut child = Command::new(bin)
            .args(args)
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("daemon stderr")?;
        Ok(Daemon {
            child: Reaped(child),
            lines: line_channel(stderr),
            log: Vec::new(),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn keep(&mut self, line: String) {
        let line = strip_ansi(&line);
        eprintln!("profilerd: {line}");
        self.log.push(line);
    }

    /// Waits until it logs that it is ready; `Some(reason)` if it exited
    /// first (it refuses what it does not support).
    pub(crate) fn wait_ready(&mut self) -> Result<Option<String>> {
        let by = Instant::now() + READY_TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(by.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let ready = line.contains("ready");
                    self.keep(line);
                    if ready {
                        return Ok(None);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.0.wait()?;
                    let last = self
                        .log
                        .iter()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .cloned()
                        .unwrap_or_default();
                    return Ok(Some(format!("{} ({status})", last.trim())));
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!("profilerd did not become ready within {READY_TIMEOUT:?}")
                }
            }
        }
    }

    /// The log lines kept so far.
    pub(crate) fn log(&self) -> &[String] {
        &self.log
    }

    /// Takes the log lines that have arrived, for up to `wait`.
    pub(crate) fn drain(&mut self, wait: Duration) -> Vec<String> {
        let mut new = Vec::new();
        if let Ok(line) = self.lines.recv_timeout(wait) {
            new.push(line);
            new.extend(self.lines.try_iter());
        }
        let start = self.log.len();
        for line in new {
            self.keep(line);
        }
        self.log[start..].to_vec()
    }

    /// Waits for it to exit (it does once its targets have gone), with
    /// SIGTERM after `grace`; returns its status and whole log.
    pub(crate) fn finish(mut self, grace: Duration) -> Result<(ExitStatus, Vec<String>)> {
        let mut by = Instant::now() + grace;
        let mut termed = false;
        loop {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => self.keep(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() >= by {
                if termed {
                    bail!("profilerd did not exit within 10 s of SIGTERM");
                }
                // SAFETY: kill(2) on our own child.
                unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
                termed = true;
                by = Instant::now() + Duration::from_secs(10);
            }
        }
        let status = self.child.0.wait()?;
        Ok((status, std::mem::take(&mut self.log)))
    }

    /// [`Daemon::finish`] for a daemon that must exit successfully, while
    /// its peak RSS is watched to the end (its last window is built at
    /// exit, so the peak may still grow); returns its log and the peak in
    /// KiB, at least `peak_kib`.
    pub(crate) fn finish_with_peak(
        self,
        grace: Duration,
        peak_kib: u64,
    ) -> Result<(Vec<String>, u64)> {
        let pid = self.pid();
        let watch = std::thread::spawn(move || {
            let mut peak = 0;
            while let Ok(kib) = status_field(pid, "VmHWM:") {
                peak = kib;
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        let (status, log) = self.finish(grace)?;
        let peak = peak_kib.max(watch.join().unwrap_or(0));
        if !status.success() {
            bail!("profilerd exited with {status}");
        }
        Ok((log, peak))
    }
}

/// Lines of `reader`, read on a thread of their own so that waits can time
/// out; the channel disconnects at end of file.
pub(crate) fn line_channel(reader: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `line` without terminal colour sequences (ESC [ ... final byte).
pub(crate) fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The message of a daemon log line, without time, level and target.
pub(crate) fn message(line: &str) -> String {
    match line.find(" profilerd") {
        Some(at) => line[at..]
            .split_once(": ")
            .map_or(line, |(_, m)| m)
            .to_string(),
        None => line.to_string(),
    }
}

/// "bpf program NAME: N runs, X ns per run" lines of a daemon log.
pub(crate) fn bpf_program_lines(log: &[String]) -> Vec<String> {
    log.iter()
        .filter_map(|l| l.find("bpf program ").map(|at| l[at..].to_string()))
        .collect()
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(crate) fn spread(values: &[f64]) -> String {
    if values.is_empty() {
        return "not available".into();
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.1} ({min:.1}–{max:.1})", median(values))
}
