//! Empty BPF programs on uprobes of one process, attached the way bpftrace
//! attaches its uprobes (a perf uprobe event per probe point, a KPROBE-type
//! program set on it) but at any instruction: Debian's bpftrace 0.17 refuses
//! a probe inside a function ("compiled without (k|u)probe offset support"),
//! so it cannot probe glibc's `free` past its first instruction.

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use anyhow::{Context, Result, bail};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
/// `_IO('$', 0)` and `_IOW('$', 8, u32)` from linux/perf_event.h.
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// The leading fields of `union bpf_attr` for BPF_PROG_LOAD.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `struct perf_event_attr` up to `config2` (PERF_ATTR_SIZE_VER1).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
}

/// One probe point: an empty program of its own (so that the kernel's run
/// statistics are per probe) on a perf uprobe event of the target.
struct Probe {
    name: String,
    prog: OwnedFd,
    _event: OwnedFd,
}

/// Probes that stay attached until dropped (closing the fds detaches them).
pub struct EmptyProbes {
    probes: Vec<Probe>,
}

/// Kernel run statistics of one probe's program.
pub struct ProbeStats {
    pub name: String,
    pub runs: u64,
    pub run_time_ns: u64,
}

impl EmptyProbes {
    /// Attaches, in process `pid`, one empty program at each
    /// `(name, file offset, return probe)` of the ELF file `path`.
    pub fn attach(pid: u32, path: &Path, points: &[(String, u64, bool)]) -> Result<Self> {
        let pmu = fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")
            .context("reading the uprobe PMU type")?;
        let pmu: u32 = pmu.trim().parse().context("parsing the uprobe PMU type")?;
        let path_c = CString::new(path.as_os_str().as_encoded_bytes())?;
        let mut probes = Vec::new();
        for (name, offset, ret) in points {
            let prog = load_empty(name)?;
            let attr = PerfEventAttr {
                kind: pmu,
                size: std::mem::size_of::<PerfEventAttr>() as u32,
                // Bit 0 is `retprobe` (/sys/bus/event_source/devices/uprobe/format).
                config: u64::from(*ret),
                sample_period: 1,
                // `disabled`: enabled only once the program is set.
                flags: 1,
                wakeup_events: 1,
                config1: path_c.as_ptr() as u64,
                config2: *offset,
                ..Default::default()
            };
            // SAFETY: attr is a valid perf_event_attr prefix of the size it
            // declares; path_c outlives the call.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    &attr as *const PerfEventAttr,
                    pid as libc::pid_t,
                    -1 as libc::c_int,
                    -1 as libc::c_int,
                    PERF_FLAG_FD_CLOEXEC,
                )
            };
            if fd < 0 {
                bail!(
                    "perf_event_open of a uprobe at {}:{offset:#x}: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                );
            }
            // SAFETY: a new fd that nothing else owns.
            let event = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            // SAFETY: ioctls on our own perf event fd.
            let set =
                unsafe { libc::ioctl(event.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd()) };
            if set < 0 {
                bail!(
                    "PERF_EVENT_IOC_SET_BPF: {}",
                    std::io::Error::last_os_error()
                );
            }
            // SAFETY: as above.
            if unsafe { libc::ioctl(event.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } < 0 {
                bail!("PERF_EVENT_IOC_ENABLE: {}", std::io::Error::last_os_error());
            }
            probes.push(Probe {
                name: name.clone(),
                prog,
                _event: event,
            });
        }
        Ok(EmptyProbes { probes })
    }

    /// Run counts and times so far (kernel.bpf_stats_enabled must be on).
    pub fn stats(&self) -> Vec<ProbeStats> {
        self.probes
            .iter()
            .map(|p| {
                let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", p.prog.as_raw_fd()))
                    .unwrap_or_default();
                let field = |key: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(key))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0)
                };
                ProbeStats {
                    name: p.name.clone(),
                    runs: field("run_cnt:"),
                    run_time_ns: field("run_time_ns:"),
                }
            })
            .collect()
    }
}

/// Loads `r0 = 0; exit`.
fn load_empty(name: &str) -> Result<OwnedFd> {
    let insns: [u64; 2] = [
        0xb7, // BPF_ALU64 | BPF_MOV | BPF_K, dst r0, imm 0
        0x95, // BPF_JMP | BPF_EXIT
    ];
    let license = c"GPL";
    let mut prog_name = [0u8; 16];
    // The kernel accepts [A-Za-z0-9_.] in program names.
    for (dst, src) in prog_name[..15].iter_mut().zip(
        name.bytes()
            .map(|b| if b.is_ascii_alphanumeric() { b } else { b'_' }),
    ) {
        *dst = src;
    }
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name,
        ..Default::default()
    };
    // SAFETY: attr is a valid bpf_attr prefix; the pointers outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &attr as *const ProgLoadAttr,
            std::mem::size_of::<ProgLoadAttr>() as u32,
        )
    };
    if fd < 0 {
        bail!(
            "loading an empty BPF program: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
