//! Booting a kernel and an initramfs under QEMU's TCG with the serial
//! console on stdout, within a deadline: the console is read as it comes
//! (the command's part echoed live if asked), and a VM that overstays is
//! killed, the QEMU process this module started and no other.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::console::{Finished, Markers, clean};

/// The emulator (Debian's qemu-system-x86).
pub const QEMU: &str = "qemu-system-x86_64";

/// One boot.
pub struct Boot<'a> {
    /// What the errors call the VM, e.g. "Linux 6.1".
    pub label: &'a str,
    pub vmlinuz: &'a Path,
    pub initrd: &'a Path,
    /// From starting QEMU until it must have powered off.
    pub timeout: Duration,
    /// Print the command's output to stdout as it arrives.
    pub echo_output: bool,
    /// Print every console line (kernel messages too) to stderr.
    pub echo_console: bool,
}

/// A boot that ran its command to the end.
pub struct Outcome {
    pub finished: Finished,
    /// From starting QEMU to the begin marker: kernel boot, unpacking the
    /// initramfs and init's mounts.
    pub boot: Duration,
    /// From starting QEMU to its exit.
    pub total: Duration,
}

/// Kills the child if it is still running when dropped (an error on the
/// way out, a panic), so that no QEMU outlives the task.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The QEMU command line: TCG (nested KVM on the CI machines opens
/// `/dev/kvm` but fails the first instruction it must emulate), no
/// display, no network, no reboot (a panic or a reboot ends QEMU).
/// One vCPU: with two, one may run a stale translation of kernel text the
/// other is patching, as attaching a tracepoint does (a 6.12 smoke
/// panicked in `__schedule` with its RIP inside the 5-byte NOP of a static
/// key, "Fatal exception in interrupt"); single-threaded TCG over two
/// vCPUs avoids that but runs each vCPU in turn while the guest's clocks
/// go on, which skewed the workloads' own CPU measures (burn_a's share
/// read 0.68 to 0.71 where it is 0.75).
fn command(boot: &Boot) -> Command {
    let mut cmd = Command::new(QEMU);
    cmd.args(["-accel", "tcg", "-m", "2G", "-smp", "1"])
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(boot.vmlinuz)
        .arg("-initrd")
        .arg(boot.initrd)
        // `panic=-1`: reboot at once on a panic, which -no-reboot turns
        // into QEMU's exit.
        .args(["-append", "console=ttyS0 panic=-1 quiet"]);
    cmd
}

/// Boots, waits for the power-off and returns what the command left on the
/// console. Fails with one line if the deadline passes (QEMU is killed) or
/// the console does not show the command's end.
pub fn run(boot: &Boot, markers: &Markers) -> Result<Outcome> {
    let started = Instant::now();
    let mut cmd = command(boot);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = Guard(cmd.spawn().with_context(|| format!("starting {QEMU}"))?);
    let pid = child.0.id();
    let stdout = child.0.stdout.take().context("QEMU's stdout is piped")?;
    let mut stderr = child.0.stderr.take().context("QEMU's stderr is piped")?;
    let (lines_tx, lines) = mpsc::channel::<String>();
    let reader = thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match stdout.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if lines_tx
                        .send(String::from_utf8_lossy(&buf).into_owned())
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    let errors = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    let deadline = started + boot.timeout;
    let mut console = String::new();
    let mut boot_time = None;
    let mut in_command = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                if boot.echo_console {
                    // Labelled: the consoles of VMs booted at once
                    // interleave.
                    eprintln!("[{}] {}", boot.label, clean(&line));
                }
                if markers.is_begin(&line) {
                    boot_time.get_or_insert_with(|| started.elapsed());
                    in_command = true;
                } else if markers.is_end(&line) {
                    in_command = false;
                    let before = line.split(&markers.end_prefix()).next().unwrap_or("");
                    if boot.echo_output && !boot.echo_console && !before.is_empty() {
                        println!("{before}");
                    }
                } else if in_command && boot.echo_output && !boot.echo_console {
                    println!("{}", clean(&line));
                }
                console.push_str(&line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Killing our own child by its pid; the reader then sees
                // end of file.
                let _ = child.0.kill();
                let _ = child.0.wait();
                bail!(
                    "{}: the VM did not power off within {} s; killed QEMU (pid {pid}){}",
                    boot.label,
                    boot.timeout.as_secs(),
                    last_line_hint(&console)
                );
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = child.0.wait().context("waiting for QEMU")?;
    let total = started.elapsed();
    let _ = reader.join();
    let qemu_errors = errors.join().unwrap_or_default();
    let finished = markers.parse(&console).with_context(|| {
        format!(
            "{}: QEMU exited ({status}); last console lines:\n{}{}",
            boot.label,
            tail(&console, 25),
            if qemu_errors.trim().is_empty() {
                String::new()
            } else {
                format!("\nQEMU said: {}", qemu_errors.trim())
            }
        )
    })?;
    Ok(Outcome {
        finished,
        boot: boot_time.unwrap_or(total),
        total,
    })
}

/// The console's last `n` lines.
fn tail(console: &str, n: usize) -> String {
    let lines: Vec<&str> = console.lines().map(clean).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

/// ` (last console line: ...)`, or nothing for an empty console.
fn last_line_hint(console: &str) -> String {
    console
        .lines()
        .map(clean)
        .rfind(|l| !l.trim().is_empty())
        .map(|l| format!(" (last console line: {l:?})"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_uses_tcg_and_the_serial_console() {
        let boot = Boot {
            label: "Linux 6.1",
            vmlinuz: Path::new("/k"),
            initrd: Path::new("/i"),
            timeout: Duration::from_secs(1),
            echo_output: false,
            echo_console: false,
        };
        let args: Vec<String> = command(&boot)
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let line = args.join(" ");
        assert!(line.contains("-accel tcg -m 2G -smp 1"), "{line}");
        assert!(line.contains("-kernel /k -initrd /i"), "{line}");
        assert!(line.contains("-no-reboot"), "{line}");
        assert!(line.contains("console=ttyS0"), "{line}");
    }

    #[test]
    fn tails_and_hints_skip_carriage_returns() {
        let console = "a\r\nb\r\n\r\n";
        assert_eq!(tail(console, 2), "b\n");
        assert_eq!(last_line_hint(console), " (last console line: \"b\")");
        assert_eq!(last_line_hint(""), "");
    }
}
