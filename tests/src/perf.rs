//! `perf record` beside the daemon: started with its events off, switched
//! on and off through its control FIFOs (so that both tools cover the same
//! stretch of time), and its samples read back with `perf script`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Guarded, Lines, mkfifo, run_with_timeout};

/// How long perf may take to answer a control command.
const ACK_TIMEOUT: Duration = Duration::from_secs(20);
/// How long perf may take to write its data and exit after SIGINT.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one `perf script` run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

/// A running `perf record`, killed (with its process group) when dropped.
pub struct PerfRecord {
    proc: Guarded,
    stderr: Lines,
    ctl: File,
    ack: File,
    data: PathBuf,
}

impl PerfRecord {
    /// Starts `perf record ARGS -o DIR/perf.data` with its events off
    /// (`-D -1`) and its control FIFOs in `dir`.
    pub fn start(dir: &Path, args: &[&str]) -> PerfRecord {
        let (ctl_path, ack_path) = (dir.join("perf-ctl"), dir.join("perf-ack"));
        mkfifo(&ctl_path);
        mkfifo(&ack_path);
        // Opened read-write, a FIFO's open never blocks, and perf's own
        // opens (read for ctl, write for ack) find the other end open.
        let open = |path: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
        };
        let (ctl, ack) = (open(&ctl_path), open(&ack_path));
        let data = dir.join("perf.data");
        let mut cmd = Command::new("perf");
        cmd.arg("record")
            .args(args)
            .args(["-D", "-1", "--control"])
            .arg(format!(
                "fifo:{},{}",
                ctl_path.display(),
                ack_path.display()
            ))
            .arg("-o")
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut proc = Guarded::spawn(cmd, "perf record");
        let stderr = proc.take_stderr().expect("stderr is piped");
        PerfRecord {
            proc,
            stderr,
            ctl,
            ack,
            data,
        }
    }

    /// Switches the events on; returns once perf acknowledged it.
    pub fn enable(&mut self) {
        self.command("enable");
    }

    /// Switches the events off; returns once perf acknowledged it.
    pub fn disable(&mut self) {
        self.command("disable");
    }

    fn command(&mut self, what: &str) {
        self.ctl
            .write_all(format!("{what}\n").as_bytes())
            .unwrap_or_else(|e| panic!("writing {what:?} to perf's control FIFO: {e}"));
        let deadline = Instant::now() + ACK_TIMEOUT;
        let mut got = Vec::new();
        // perf writes "ack\n" and a NUL.
        while !got.windows(4).any(|w| w == b"ack\n") {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut poll = libc::pollfd {
                fd: self.ack.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut poll, 1, left.as_millis() as i32) };
            if ready <= 0 {
                let status = self.proc.try_wait();
                panic!(
                    "perf did not acknowledge {what:?} within {ACK_TIMEOUT:?} (exit status {status:?}); stderr:\n{}",
                    self.stderr.text()
                );
            }
            let mut buf = [0u8; 64];
            let n = self
                .ack
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("reading perf's ack FIFO: {e}"));
            got.extend_from_slice(&buf[..n]);
        }
    }

    /// Stops perf with SIGINT and waits for it to write its data; returns
    /// the data file.
    pub fn stop(mut self) -> PathBuf {
        use std::os::unix::process::ExitStatusExt;
        self.proc.signal(libc::SIGINT);
        let status = self.proc.wait_timeout(STOP_TIMEOUT);
        self.stderr.finish(Duration::from_secs(2));
        // perf record ends by raising the SIGINT again once its data is
        // written.
        assert!(
            status.is_some_and(|s| s.success() || s.signal() == Some(libc::SIGINT)),
            "perf record did not exit cleanly after SIGINT ({status:?}); stderr:\n{}",
            self.stderr.text()
        );
        self.proc.kill();
        self.data.clone()
    }
}

/// One sample of `perf script`: where it was taken and perf's name for it.
#[derive(Clone, Debug)]
pub struct PerfSample {
    pub comm: String,
    pub pid: u32,
    pub tid: u32,
    /// The sampled instruction pointer, as the process saw it.
    pub ip: u64,
    /// perf's symbol, `None` for `[unknown]`.
    pub sym: Option<String>,
    /// The object file perf found the address in (`[kernel.kallsyms]` for
    /// the kernel, `[unknown]` for none).
    pub dso: String,
}

/// What `perf script` reads from a data file: the samples, and the
/// processes forked meanwhile as (child pid, parent pid).
pub struct PerfScript {
    pub samples: Vec<PerfSample>,
    pub forks: Vec<(u32, u32)>,
}

/// Runs `perf script` on `data` (samples with comm, pid/tid, ip, symbol and
/// object, and the task events) and parses it.
pub fn script(data: &Path) -> PerfScript {
    let mut cmd = Command::new("perf");
    cmd.arg("script").arg("-i").arg(data).args([
        "--show-task-events",
        "-F",
        "comm,pid,tid,ip,sym,dso",
    ]);
    let out = run_with_timeout(cmd, "perf script", SCRIPT_TIMEOUT);
    assert!(
        out.status.success(),
        "perf script failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    parse_script(&String::from_utf8_lossy(&out.stdout))
}

/// Parses `perf script -F comm,pid,tid,ip,sym,dso --show-task-events`.
/// A sample line is `COMM PID/TID IP SYM (DSO)`, where the comm and the
/// symbol may hold spaces; a fork is `COMM PID/TID
/// PERF_RECORD_FORK(CHILD:CTID):(PARENT:PTID)`.
pub fn parse_script(text: &str) -> PerfScript {
    let mut samples = Vec::new();
    let mut forks = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| pid_tid(w).is_some()) else {
            continue;
        };
        let Some((pid, tid)) = pid_tid(words[at]) else {
            continue;
        };
        let rest = &words[at + 1..];
        if let Some(fork) = rest
            .first()
            .and_then(|w| w.strip_prefix("PERF_RECORD_FORK("))
        {
            let numbers: Vec<u32> = fork
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse().ok())
                .collect();
            if let [child, _, parent, _] = numbers[..] {
                forks.push((child, parent));
            }
            continue;
        }
        if rest.first().is_some_and(|w| w.starts_with("PERF_RECORD_")) {
            continue;
        }
        let Some(ip) = rest.first().and_then(|w| u64::from_str_radix(w, 16).ok()) else {
            continue;
        };
        let tail = rest[1..].join(" ");
        let Some((sym, dso)) = tail.rsplit_once(" (").or_else(|| {
            // No symbol at all: only "(DSO)".
            tail.strip_prefix('(').map(|dso| ("", dso))
        }) else {
            continue;
        };
        let dso = dso.strip_suffix(')').unwrap_or(dso).to_string();
        let sym = match sym.trim() {
            "" | "[unknown]" => None,
            s => Some(s.to_string()),
        };
        samples.push(PerfSample {
            comm: words[..at].join(" "),
            pid,
            tid,
            ip,
            sym,
            dso,
        });
    }
    PerfScript { samples, forks }
}

fn pid_tid(word: &str) -> Option<(u32, u32)> {
    let (pid, tid) = word.split_once('/')?;
    Some((pid.parse().ok()?, tid.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_and_forks() {
        let text = "\
         swapper     0/0     PERF_RECORD_FORK(1:1):(0:0)
              sh  5974/5974  PERF_RECORD_FORK(5975:5975):(5974:5974)
             cc1  5975/5975  PERF_RECORD_COMM exec: cc1:5975/5975
             cc1  5975/5975  ffffffff8158c3e1 next_uptodate_folio ([kernel.kallsyms])
             cc1  5975/5975            eba54f wi::divmod_internal (/usr/lib/gcc/x86_64-linux-gnu/12/cc1)
     my thread  10/11            be7910 [unknown] (/usr/lib/gcc/x86_64-linux-gnu/12/cc1)
         python3  20/20      55d0c0a1b2c3 operator new(unsigned long)@plt (/usr/bin/x y)
";
        let s = parse_script(text);
        assert_eq!(s.forks, vec![(1, 0), (5975, 5974)]);
        assert_eq!(s.samples.len(), 4);
        assert_eq!(s.samples[0].sym.as_deref(), Some("next_uptodate_folio"));
        assert_eq!(s.samples[0].dso, "[kernel.kallsyms]");
        assert_eq!(s.samples[1].ip, 0xeba54f);
        assert_eq!(s.samples[1].sym.as_deref(), Some("wi::divmod_internal"));
        assert_eq!(
            (
                s.samples[2].comm.as_str(),
                s.samples[2].pid,
                s.samples[2].tid
            ),
            ("my thread", 10, 11)
        );
        assert_eq!(s.samples[2].sym, None);
        assert_eq!(
            s.samples[3].sym.as_deref(),
            Some("operator new(unsigned long)@plt")
        );
        assert_eq!(s.samples[3].dso, "/usr/bin/x y");
    }
}
