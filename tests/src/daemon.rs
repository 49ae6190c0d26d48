//! Running `profilerd` under test: where the binary is, starting it with its
//! output captured, waiting for its "ready" log line and for its exit, each
//! with a hard bound.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Guarded, Lines};

/// How long the daemon may take to load and attach its probes.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_path_buf()
}

/// The daemon binary: `$PROFILERD_BIN`, else
/// `<workspace>/target/release/profilerd`. Panics with instructions if it is
/// missing.
pub fn profilerd_bin() -> PathBuf {
    let (path, origin) = match std::env::var_os("PROFILERD_BIN") {
        Some(p) => (PathBuf::from(p), "$PROFILERD_BIN"),
        None => (
            workspace_root().join("target/release/profilerd"),
            "the default location",
        ),
    };
    if !path.is_file() {
        panic!(
            "profilerd not found at {} ({origin}). Build it first with \
             `cargo build --release -p profiler-daemon` (or `cargo xtask build --release`), \
             or set PROFILERD_BIN to the binary.",
            path.display()
        );
    }
    path
}

/// The end-to-end tests load eBPF programs: they need root.
pub fn require_root() {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the end-to-end tests must run as root (they load eBPF programs); euid is {euid}"
    );
}

/// Whether the running kernel's version is at least `major.minor`, by its
/// release string: what the tests expect of the daemon follows the first
/// version of each kernel feature (the kernel matrix runs 6.1 and 6.12).
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("reading /proc/sys/kernel/osrelease");
    release_at_least(&release, major, minor)
}

/// [`kernel_at_least`] of a release string such as `6.1.0-50-cloud-amd64`.
pub fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    have >= (major, minor)
}

/// A `profilerd` process with stdout and stderr captured, killed (with its
/// process group, so also a command it started) when dropped.
pub struct Daemon {
    proc: Guarded,
    stdout: Lines,
    stderr: Lines,
    started: Instant,
    args: Vec<String>,
}

impl Daemon {
    /// Starts `profilerd ARGS` as root with stdin closed and logs at info.
    pub fn start<S: AsRef<OsStr>>(args: &[S]) -> Daemon {
        require_root();
        let mut cmd = Command::new(profilerd_bin());
        cmd.args(args);
        Self::start_command(cmd)
    }

    /// Starts a prepared command that runs the daemon (for example under
    /// `setpriv`). Its stdio is replaced by pipes (stdin: /dev/null).
    pub fn start_command(mut cmd: Command) -> Daemon {
        let args: Vec<String> = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        // The test's own environment must not change the daemon's logging or
        // make it notify a service manager; a NOTIFY_SOCKET set on `cmd` is
        // kept.
        let own_notify = cmd
            .get_envs()
            .any(|(k, v)| k == "NOTIFY_SOCKET" && v.is_some());
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .env_remove("PROFILERD_LOG");
        if !own_notify {
            cmd.env_remove("NOTIFY_SOCKET");
        }
        let mut proc = Guarded::spawn(cmd, "profilerd");
        let stdout = proc.take_stdout().expect("stdout is piped");
        let stderr = proc.take_stderr().expect("stderr is piped");
        Daemon {
            proc,
            stdout,
            stderr,
            started: Instant::now(),
            args,
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Waits until the daemon logs that every probe is attached (a line with
    /// the word "ready"). Panics with its stderr if it exits or stays silent.
    pub fn wait_ready(&mut self) {
        let found = self.stderr.wait_for(READY_TIMEOUT, |line| {
            line.to_ascii_lowercase()
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|word| word == "ready")
        });
        if let Err(why) = found {
            let status = self.proc.try_wait();
            panic!(
                "profilerd did not log \"ready\" ({why}); exit status: {status:?}\n{}",
                self.describe()
            );
        }
    }

    /// Waits at most `timeout` for a line of the daemon's log (not seen by
    /// an earlier wait) that satisfies `pred`; panics with its stderr if
    /// none comes.
    pub fn wait_log(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        self.stderr.wait_for(timeout, pred).unwrap_or_else(|why| {
            panic!(
                "profilerd did not log the awaited line ({why})\n{}",
                self.describe()
            )
        })
    }

    /// Waits at most `timeout` for the daemon to exit by itself. On overrun
    /// it is killed and the test fails with its stderr.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match self.proc.wait_timeout(timeout) {
            Some(status) => {
                // Everything it wrote is in the pipes by now.
                self.stderr.finish(Duration::from_secs(2));
                self.stdout.finish(Duration::from_secs(2));
                status
            }
            None => {
                self.proc.kill();
                panic!(
                    "profilerd did not exit within {timeout:?} (killed it)\n{}",
                    self.describe()
                );
            }
        }
    }

    /// Waits for the exit like [`Daemon::wait_exit`] and asserts status 0.
    pub fn wait_success(&mut self, timeout: Duration) {
        let status = self.wait_exit(timeout);
        assert!(
            status.success(),
            "profilerd exited with {status}\n{}",
            self.describe()
        );
    }

    /// Sends a signal to the daemon.
    pub fn signal(&self, signal: i32) {
        self.proc.signal(signal);
    }

    /// Time since the daemon was started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lines()
    }

    /// A counter of the daemon's exit summary line (`summary ... name=value`).
    pub fn summary_field(&self, name: &str) -> u64 {
        let key = format!("{name}=");
        self.stderr_lines()
            .iter()
            .filter(|l| l.contains("summary"))
            .flat_map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .find_map(|field| field.strip_prefix(&key).and_then(|v| v.parse().ok()))
            .unwrap_or_else(|| {
                panic!(
                    "no {name}= in the daemon's summary:
{}",
                    self.describe()
                )
            })
    }

    /// The address the daemon logged it serves metrics on
    /// (`serving metrics at http://ADDR/metrics`); panics without one.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.stderr_lines()
            .iter()
            .find_map(|l| l.split("serving metrics at http://").nth(1))
            .and_then(|rest| rest.trim().trim_end_matches("/metrics").parse().ok())
            .unwrap_or_else(|| panic!("no 'serving metrics' address\n{}", self.describe()))
    }

    pub fn stdout_text(&self) -> String {
        self.stdout.text()
    }

    /// The command line and everything it logged, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "command: {}\n--- profilerd stderr ---\n{}\n--- profilerd stdout ---\n{}\n---",
            self.args.join(" "),
            self.stderr.text(),
            self.stdout.text()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::release_at_least;

    #[test]
    fn releases_compare_by_major_then_minor() {
        assert!(release_at_least("6.1.0-50-cloud-amd64", 6, 1));
        assert!(!release_at_least("6.1.0-50-cloud-amd64", 6, 6));
        assert!(release_at_least("6.12.100+deb12-cloud-amd64", 6, 6));
        assert!(!release_at_least("6.12.100+deb12-cloud-amd64", 6, 13));
        assert!(release_at_least("6.18.0\n", 6, 13));
        assert!(release_at_least("7.0", 6, 13));
    }
}
