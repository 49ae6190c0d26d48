//! The other tracers in a waits run: bpftrace with empty tracepoints as
//! the baseline of what any probe costs, and the BPF programs and
//! tracepoints attached while it runs.

use super::*;

/// A bpftrace child and the file its errors go to.
pub(super) struct Bpftrace {
    pub(super) child: Reaped,
    pub(super) errors: std::path::PathBuf,
}

impl Bpftrace {
    /// Waits until a program is attached to each of `tracepoints`
    /// ("category:name"); returns (tracepoint name, program id) pairs.
    pub(super) fn wait_attached(&mut self, tracepoints: &[&str]) -> Result<Vec<(String, u32)>> {
        let by = Instant::now() + ATTACH_TIMEOUT;
        loop {
            let attached = attached_tracepoints(self.child.0.id());
            let all = tracepoints.iter().all(|tp| {
                let name = tp.rsplit(':').next().unwrap_or(tp);
                attached.iter().any(|(n, _)| n == name)
            });
            if all {
                return Ok(attached);
            }
            if let Some(status) = self.child.0.try_wait()? {
                let text = fs::read_to_string(&self.errors).unwrap_or_default();
                let error: Vec<&str> = text
                    .lines()
                    .filter(|l| l.starts_with("ERROR") && !l.contains("RLIMIT_MEMLOCK"))
                    .collect();
                bail!("bpftrace exited with {status}: {}", error.join(" "));
            }
            if Instant::now() >= by {
                bail!("bpftrace's programs were not attached within {ATTACH_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub(super) fn spawn_bpftrace(args: &[String], work: &Path) -> Result<Bpftrace> {
    let errors = work.join("bpftrace.err");
    let child = Command::new("bpftrace")
        .args(args)
        .stdout(Stdio::null())
        .stderr(fs::File::create(&errors)?)
        .spawn()
        .context("starting bpftrace")?;
    Ok(Bpftrace {
        child: Reaped(child),
        errors,
    })
}

pub(super) const BPF_TASK_FD_QUERY: libc::c_long = 20;

pub(super) const BPF_FD_TYPE_TRACEPOINT: u32 = 1;

/// `union bpf_attr` for BPF_TASK_FD_QUERY.
#[repr(C)]
#[derive(Default)]
pub(super) struct TaskFdQuery {
    pub(super) pid: u32,
    pub(super) fd: u32,
    pub(super) flags: u32,
    pub(super) buf_len: u32,
    pub(super) buf: u64,
    pub(super) prog_id: u32,
    pub(super) fd_type: u32,
    pub(super) probe_offset: u64,
    pub(super) probe_addr: u64,
}

/// The tracepoints that `pid`'s perf event fds carry a BPF program on, with
/// the program's id. The kernel's own answer: attached, and where.
pub(super) fn attached_tracepoints(pid: u32) -> Vec<(String, u32)> {
    let mut found = Vec::new();
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return found;
    };
    for entry in fds.flatten() {
        let is_perf = fs::read_link(entry.path())
            .is_ok_and(|t| t.as_os_str().as_bytes() == b"anon_inode:[perf_event]");
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if !is_perf {
            continue;
        }
        let mut name = [0u8; 128];
        let mut attr = TaskFdQuery {
            pid,
            fd,
            buf_len: name.len() as u32,
            buf: name.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: attr is a valid bpf_attr for this command; buf outlives
        // the call and is as long as buf_len says.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_TASK_FD_QUERY,
                &mut attr as *mut TaskFdQuery,
                std::mem::size_of::<TaskFdQuery>() as u32,
            )
        };
        // Perf events without a program (bpftrace's output buffers) fail.
        if ret == 0 && attr.fd_type == BPF_FD_TYPE_TRACEPOINT {
            let name = CStr::from_bytes_until_nul(&name)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            found.push((name, attr.prog_id));
        }
    }
    found
}

/// Run count and time of each BPF program that `pid` holds an fd of, by
/// program id (kernel.bpf_stats_enabled must be on).
pub(super) fn program_stats(pid: u32) -> Vec<(u32, u64, u64)> {
    let mut out = Vec::new();
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return out;
    };
    for entry in fds.flatten() {
        let text = fs::read_to_string(entry.path()).unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(runs), Some(ns)) =
            (field("prog_id:"), field("run_cnt:"), field("run_time_ns:"))
        {
            out.push((id as u32, runs, ns));
        }
    }
    out
}

/// Other processes that attach BPF programs (an end-to-end test's daemon,
/// another bpftrace or perf): their programs run on the same events.
pub(super) fn other_tracers(ours: &[u32]) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if ours.contains(&pid) {
            continue;
        }
        let comm = fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        // A copy of the daemon under another name still starts so.
        if comm.starts_with("profilerd") || matches!(comm, "bpftrace" | "perf") {
            found.push(format!("{comm} ({pid})"));
        }
    }
    found
}

/// Parses "bpf program NAME: N runs, X ns per run".
pub(super) fn parse_program(line: &str) -> Option<Program> {
    let rest = line.split("bpf program ").nth(1)?;
    let (name, rest) = rest.split_once(": ")?;
    let (runs, rest) = rest.split_once(" runs, ")?;
    let ns = rest.split_whitespace().next()?;
    Some(Program {
        name: name.to_string(),
        runs: runs.trim().parse().ok()?,
        ns_per_run: ns.parse().ok()?,
    })
}

/// Parses "pingpong TRIPS NS WOKEN EAGAIN WAKES_HIT VCSW IVCSW".
pub(super) fn parse_batch(line: &str) -> Option<Batch> {
    let f: Vec<f64> = line
        .strip_prefix("pingpong ")?
        .split_whitespace()
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let [trips, ns, woken, _eagain, _hits, vcsw, ivcsw] = f[..] else {
        return None;
    };
    let trips = trips.max(1.0);
    Some(Batch {
        ns_per_trip: ns / trips,
        woken_per_trip: woken / trips,
        vcsw_per_trip: vcsw / trips,
        ivcsw_per_trip: ivcsw / trips,
    })
}

/// Whether bpftrace's `-p PID` restricts a tracepoint program to PID: an
/// empty program on sys_enter_futex with -p naming an idle process, while
/// another process makes futex calls.
pub(super) fn bpftrace_pid_filter(exe: &Path, work: &Path, cpu: usize) -> Result<String> {
    let args = |ms: u64| {
        [
            "pingpong".to_string(),
            ms.to_string(),
            "1".into(),
            cpu.to_string(),
        ]
    };
    let idle = Bench::spawn(exe, &args(100))?;
    let mut bpftrace = spawn_bpftrace(
        &[
            "-p".into(),
            idle.pid().to_string(),
            "-e".into(),
            "tracepoint:syscalls:sys_enter_futex {}".into(),
        ],
        work,
    )?;
    let ids = bpftrace.wait_attached(&FUTEX_TPS[..1])?;
    let mut busy = Bench::spawn(exe, &args(100))?;
    busy.go()?;
    let calls = loop {
        let line = busy.line(OUTPUT_TIMEOUT)?;
        if let Some(total) = line.strip_prefix("total ") {
            break total
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    };
    let runs: u64 = program_stats(bpftrace.child.0.id())
        .iter()
        .filter(|(id, _, _)| ids.iter().any(|(_, i)| i == id))
        .map(|(_, runs, _)| runs)
        .sum();
    busy.finish()?;
    drop(idle);
    Ok(if runs >= calls {
        format!(
            "bpftrace's `-p PID` does not restrict tracepoint programs: with -p naming an \
             idle process, an empty program on sys_enter_futex ran {runs} times while another \
             process made {calls} futex calls. So the floors filter with a `/pid == N/` \
             predicate, which (like profilerd's filter) runs on every event of the system \
             and returns early for other processes."
        )
    } else {
        format!(
            "bpftrace's `-p PID` restricted a tracepoint program: with -p naming an idle \
             process, an empty program on sys_enter_futex ran {runs} times while another \
             process made {calls} futex calls. The floors still filter with a `/pid == N/` \
             predicate, which runs on every event of the system like profilerd's filter."
        )
    })
}
