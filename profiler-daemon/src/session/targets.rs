//! What the session runs against: privileges, the processes of the node,
//! the command it starts (`-- COMMAND`), and the readiness of its rings.

use std::ffi::OsString;
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tokio::io::unix::{AsyncFd, AsyncFdReadyMutGuard};

use crate::bpf::attach::allocators::{PreExecLinks, resolve_program};
use crate::bpf::log::KernelLog;
use crate::bpf::probes::Probes;
use crate::bpf::ring::Ring;
use crate::procs::process::ProcessTable;

/// Loading eBPF needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN. Checking
/// first turns the kernel's bare EPERM into a message that says what is
/// missing.
pub(crate) fn check_privileges() -> Result<()> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    bail!("not allowed to load eBPF programs: run as root or with CAP_BPF and CAP_PERFMON")
}

/// The start time (clock ticks after boot) of `pid` if it is running; a
/// zombie has a /proc entry but will never run again.
pub(crate) fn process_start(pid: u32) -> Option<u64> {
    // Read lossily: a command name need not be UTF-8.
    let stat = crate::model::text::read_proc_text(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, from the state (field 3) on;
    // the start time is field 22.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

pub(crate) async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The next item of `rx`; pending forever without a channel, or once it
/// is closed.
pub(crate) async fn recv_opt<T>(rx: &mut Option<tokio::sync::mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => match rx.recv().await {
            Some(item) => Some(item),
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

pub(crate) async fn wait_child(
    child: &mut Option<tokio::process::Child>,
) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

/// Starts the command so that its first instruction is already profiled:
/// between fork and exec the child adds its own pid to the kernel's target
/// set. (`spawn` returns only after the exec, so the parent cannot do it in
/// time.)
pub(crate) fn start_command(
    command: &[OsString],
    probes: &mut Probes,
    procs: &mut ProcessTable,
) -> Result<tokio::process::Child> {
    let targets = probes.targets_fd().as_raw_fd();
    // Heap probes for the allocators known before the exec, made by the
    // child itself (see PreExecLinks).
    let pre_exec_links = match (probes.allocators(), resolve_program(&command[0])) {
        (Some(allocators), Some(program)) => Some(Arc::new(
            PreExecLinks::prepare(allocators, &program).context("preparing the heap probes")?,
        )),
        _ => None,
    };
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    let in_child = pre_exec_links.clone();
    // SAFETY: between fork and exec only getpid, bpf, sendmsg and close
    // run; nothing allocates or takes a lock.
    unsafe {
        cmd.pre_exec(move || {
            let pid = libc::getpid() as u32;
            crate::bpf::map_syscalls::update_elem_raw(
                targets,
                &pid,
                &profiler_common::target_kind::PROFILED,
            )?;
            if let Some(links) = &in_child {
                links.in_child();
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start command {}", command[0].to_string_lossy()))?;
    if let Some(pid) = child.id() {
        procs.ensure(pid);
        if let (Some(links), Some(allocators)) = (pre_exec_links, probes.allocators()) {
            // The closure's copy went with the command object.
            drop(cmd);
            if let Ok(links) = Arc::try_unwrap(links) {
                links.collect(pid, allocators);
            }
        }
    }
    Ok(child)
}

/// Waits until the kernel's log ring has records; forever when the kernel
/// does not log.
pub(crate) async fn kernel_log_readable(
    log: &mut Option<AsyncFd<KernelLog>>,
) -> std::io::Result<AsyncFdReadyMutGuard<'_, KernelLog>> {
    match log {
        Some(log) => log.readable_mut().await,
        None => std::future::pending().await,
    }
}

/// Registers a ring buffer with the runtime so that its data wakes us.
pub(crate) fn watch_ring(ring: Option<Ring>, what: &str) -> Result<AsyncFd<Ring>> {
    let ring = ring.with_context(|| format!("the {what} ring buffer was already taken"))?;
    // SAFETY: the ring buffer owns its map fd for as long as the AsyncFd
    // owns the ring buffer, and always reports that same fd.
    unsafe { AsyncFd::register(ring) }
        .map_err(|e| e.into_parts().1)
        .with_context(|| format!("watching the {what} ring buffer"))
}
