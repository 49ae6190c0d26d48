//! Perf-event uprobes: one probe point per perf event of the kernel's
//! `uprobe` PMU, with a BPF program linked to it and a cookie
//! (`BPF_LINK_CREATE` with `BPF_PERF_EVENT`, Linux 5.15). The way to probe
//! a function's entry, or its return, on kernels without uprobe_multi
//! links (6.6) or uprobe sessions (6.13): one event per function and
//! direction, where those take one link per file.

use std::ffi::CStr;
use std::fs;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use aya_obj::generated::perf_event_attr;

/// `PERF_FLAG_FD_CLOEXEC` of perf_event_open(2) (not in the libc crate).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// Where the kernel describes its uprobe PMU.
const PMU_DIR: &str = "/sys/bus/event_source/devices/uprobe";

/// The kernel's uprobe PMU: its perf event type and the `config` bit that
/// makes a probe a return probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UprobePmu {
    pmu_type: u32,
    retprobe: u64,
}

impl UprobePmu {
    /// Reads the PMU's type and the retprobe bit (`format/retprobe`,
    /// `config:N`) from sysfs.
    pub fn read() -> io::Result<Self> {
        let pmu_type = fs::read_to_string(format!("{PMU_DIR}/type"))?;
        let retprobe = fs::read_to_string(format!("{PMU_DIR}/format/retprobe"))?;
        Self::parse(&pmu_type, &retprobe).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{PMU_DIR}: unexpected type {:?} or retprobe format {:?}",
                    pmu_type.trim(),
                    retprobe.trim()
                ),
            )
        })
    }

    fn parse(pmu_type: &str, retprobe: &str) -> Option<Self> {
        let pmu_type = pmu_type.trim().parse().ok()?;
        let bit: u32 = retprobe.trim().strip_prefix("config:")?.parse().ok()?;
        Some(UprobePmu {
            pmu_type,
            retprobe: 1u64.checked_shl(bit)?,
        })
    }

    /// Probes the instruction at file offset `offset` of the ELF file at
    /// `path` (its entry, or the return of the function it starts when
    /// `at_return`), in process `pid` (0: every process that maps the
    /// file, now or later), and links program `prog_fd` to it with
    /// `cookie`. The returned link holds the perf event; closing it
    /// removes the probe. Allocates nothing and calls only `syscall` and
    /// `close`, so it may run in a forked child before exec.
    pub fn attach(
        &self,
        prog_fd: RawFd,
        path: &CStr,
        offset: u64,
        at_return: bool,
        cookie: u64,
        pid: u32,
    ) -> io::Result<OwnedFd> {
        // SAFETY: plain data; all-zero is perf_event_attr's default.
        let mut attr: perf_event_attr = unsafe { zeroed() };
        attr.type_ = self.pmu_type;
        attr.size = size_of::<perf_event_attr>() as u32;
        attr.config = if at_return { self.retprobe } else { 0 };
        attr.__bindgen_anon_1.sample_period = 1;
        attr.__bindgen_anon_2.wakeup_events = 1;
        attr.__bindgen_anon_3.uprobe_path = path.as_ptr() as u64;
        attr.__bindgen_anon_4.probe_offset = offset;
        // A probe in every process is an event of no task on one CPU; the
        // program runs wherever the probe hits.
        let (task, cpu) = if pid == 0 { (-1, 0) } else { (pid as i32, -1) };
        let event = open_event(&attr, task, cpu)?;
        let fd = crate::bpf::raw_programs::link_perf_event(
            prog_fd,
            std::os::fd::AsRawFd::as_raw_fd(&event),
            cookie,
        )?;
        // The link holds its own reference to the event.
        drop(event);
        // SAFETY: a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }
}

/// perf_event_open(2) of `attr` on `task` (-1: any) and `cpu` (-1: any),
/// close-on-exec. Allocates nothing and calls only `syscall`.
pub fn open_event(attr: &perf_event_attr, task: i32, cpu: i32) -> io::Result<OwnedFd> {
    // SAFETY: `attr` and whatever it points to outlive the call.
    let event = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const perf_event_attr,
            task,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if event < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(event as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pmu_description_is_read_from_sysfs_text() {
        assert_eq!(
            UprobePmu::parse("9\n", "config:0\n"),
            Some(UprobePmu {
                pmu_type: 9,
                retprobe: 1
            })
        );
        assert_eq!(UprobePmu::parse("9", "config:64"), None);
        assert_eq!(UprobePmu::parse("x", "config:0"), None);
        assert_eq!(UprobePmu::parse("9", "config1:0"), None);
    }

    #[test]
    fn this_kernel_describes_its_uprobe_pmu() {
        // Every kernel with CONFIG_UPROBE_EVENTS has it.
        let pmu = UprobePmu::read().expect("the uprobe PMU in sysfs");
        assert_eq!(pmu.retprobe, 1);
    }
}
