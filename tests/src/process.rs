//! Child processes for tests: every child is killed and reaped when its
//! guard is dropped (also while a failed assertion unwinds), waits have hard
//! bounds, and stdout/stderr are read line by line on background threads so
//! a test can wait for a given line while the child runs.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;

/// How often a bounded wait polls the child.
const POLL: Duration = Duration::from_millis(20);

/// A running child in a process group of its own. Dropping the guard kills
/// the whole group with SIGKILL (so descendants go too) and reaps the child.
///
/// Waiting looks at the child's exit without reaping it (`waitid` with
/// `WNOWAIT`): until the guard reaps it at the end, the zombie keeps its pid
/// and process group id from being reused, so signals can never reach an
/// unrelated process.
pub struct Guarded {
    child: Child,
    name: String,
    status: Option<ExitStatus>,
    reaped: bool,
}

impl Guarded {
    /// Spawns `cmd` as the leader of a new process group. `name` appears in
    /// messages.
    pub fn spawn(mut cmd: Command, name: &str) -> Self {
        cmd.process_group(0);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Guarded {
            child,
            name: name.to_string(),
            status: None,
            reaped: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's stdin, if it was piped and not yet taken.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// A reader of the child's piped stdout, started once.
    pub fn take_stdout(&mut self) -> Option<Lines> {
        self.child
            .stdout
            .take()
            .map(|s| Lines::start(s, &format!("{} stdout", self.name)))
    }

    /// A reader of the child's piped stderr, started once.
    pub fn take_stderr(&mut self) -> Option<Lines> {
        self.child
            .stderr
            .take()
            .map(|s| Lines::start(s, &format!("{} stderr", self.name)))
    }

    /// The exit status if the child has exited. The child stays a zombie
    /// (not reaped) until the guard is dropped or [`Guarded::kill`]ed.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() && !self.reaped {
            self.status = peek_exit(self.child.id())
                .unwrap_or_else(|e| panic!("waiting for {}: {e}", self.name));
        }
        self.status
    }

    /// Waits at most `timeout` for the child to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(POLL);
        }
    }

    /// Sends `signal` to the child (not to its group).
    pub fn signal(&self, signal: i32) {
        assert!(!self.reaped, "{} is already reaped", self.name);
        // SAFETY: plain syscall on our own child, not reaped, so its pid
        // cannot belong to another process.
        if unsafe { libc::kill(self.child.id() as i32, signal) } != 0 {
            panic!(
                "kill({}, {signal}) for {}: {}",
                self.child.id(),
                self.name,
                std::io::Error::last_os_error()
            );
        }
    }

    /// Kills the child's process group (the child and whatever it started
    /// that stayed in the group) and reaps the child. Idempotent.
    pub fn kill(&mut self) {
        if self.reaped {
            return;
        }
        let pid = self.child.id() as i32;
        // SAFETY: plain syscalls. The child is not reaped yet, so its pid and
        // its process group id (the same number) are still ours.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
        let status = self.child.wait().ok();
        self.status = self.status.or(status);
        self.reaped = true;
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether `pid` (our child) has exited, without reaping it.
fn peek_exit(pid: u32) -> std::io::Result<Option<ExitStatus>> {
    use std::os::unix::process::ExitStatusExt;
    // SAFETY: all-zero is a valid siginfo_t; waitid fills it in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid out-pointer; WNOWAIT leaves the child waitable.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    // SAFETY: waitid filled the SIGCHLD fields (or left them zero).
    let (child, code, status) = unsafe { (info.si_pid(), info.si_code, info.si_status()) };
    if child == 0 {
        return Ok(None);
    }
    // Rebuild the wait(2) status word that ExitStatus wraps.
    let raw = match code {
        libc::CLD_EXITED => (status & 0xff) << 8,
        libc::CLD_DUMPED => (status & 0x7f) | 0x80,
        _ => status & 0x7f,
    };
    Ok(Some(ExitStatus::from_raw(raw)))
}

/// Lines of one output stream of a child, read on a background thread:
/// every line is kept (for messages) and also delivered in order to
/// [`Lines::wait_for`].
pub struct Lines {
    all: Arc<Mutex<Vec<String>>>,
    rx: Receiver<String>,
    reader: Option<JoinHandle<()>>,
}

impl Lines {
    pub fn start(stream: impl Read + Send + 'static, what: &str) -> Self {
        let all = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let keep = Arc::clone(&all);
        let reader = thread::Builder::new()
            .name(format!("read {what}"))
            .spawn(move || {
                let mut stream = BufReader::new(stream);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match stream.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let line = strip_ansi(
                                String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r']),
                            );
                            keep.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(line.clone());
                            // The receiver may be gone; the line is kept anyway.
                            let _ = tx.send(line);
                        }
                    }
                }
            })
            .expect("spawning an output reader thread");
        Lines {
            all,
            rx,
            reader: Some(reader),
        }
    }

    /// Waits up to `timeout` for a line (not seen by an earlier wait) that
    /// satisfies `pred`. Err: the stream ended (the child closed it or
    /// exited) or the time ran out, with which of the two.
    pub fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) if pred(&line) => return Ok(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("no such line within {timeout:?}"));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err("the stream ended first".to_string());
                }
            }
        }
    }

    /// Every line read so far.
    pub fn lines(&self) -> Vec<String> {
        self.all.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every line read so far, joined.
    pub fn text(&self) -> String {
        self.lines().join("\n")
    }

    /// Waits (at most `timeout`) until the stream is closed, then returns
    /// every line. Used after the child exited, so that no line is missed.
    pub fn finish(&mut self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        if let Some(reader) = self.reader.take() {
            while !reader.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
            if reader.is_finished() {
                let _ = reader.join();
            } else {
                // A descendant still holds the pipe; keep what was read.
                self.reader = Some(reader);
            }
        }
        self.lines()
    }
}

/// Removes terminal colour escapes (`ESC [ ... letter`) from a log line.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs `cmd` to completion with stdin closed and its output captured;
/// kills it and panics if it runs longer than `timeout`.
pub fn run_with_timeout(mut cmd: Command, what: &str, timeout: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = Guarded::spawn(cmd, what);
    let mut stdout = child.take_stdout().expect("stdout is piped");
    let mut stderr = child.take_stderr().expect("stderr is piped");
    let Some(status) = child.wait_timeout(timeout) else {
        child.kill();
        panic!(
            "{what} did not finish within {timeout:?}; killed it.\nstdout:\n{}\nstderr:\n{}",
            stdout.text(),
            stderr.text()
        );
    };
    let join = |lines: Vec<String>| {
        let mut text = lines.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        text.into_bytes()
    };
    Output {
        status,
        stdout: join(stdout.finish(Duration::from_secs(2))),
        stderr: join(stderr.finish(Duration::from_secs(2))),
    }
}

/// Waits until `pred` holds, polling, for at most `timeout`.
pub fn wait_until(timeout: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if pred() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
}

/// Whether `pid` is a live (not zombie) process.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Creates a FIFO at `path` (mode 0600).
pub fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .expect("no NUL in temporary paths");
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        panic!(
            "mkfifo {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
}

/// The one child of process `pid` (as `unshare --fork`'s forked child).
pub fn child_of(pid: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_else(|e| panic!("children of {pid}: {e}"));
    children
        .split_whitespace()
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("process {pid} has no child: {children:?}"))
}
