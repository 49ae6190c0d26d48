//! What the running kernel offers the probes, and what each profile type
//! can do with it: ready, degraded (and why), or unavailable (the missing
//! feature and the first Linux release that has it).
//!
//! Features are found by trying them (a link of each uprobe_multi kind is
//! asked for and refused harmlessly), or by what the kernel publishes
//! (its BTF, its tracepoints), never by the version number: distribution
//! kernels backport features, and version checks would then refuse what
//! works. The session refuses to start a profile type that cannot run
//! unless it was asked for at best effort (`heap?`), and
//! `profilerd --check` prints the whole table.

use std::fmt;
use std::path::Path;

use crate::bpf::perf_uprobe::UprobePmu;
use crate::bpf::raw_programs::{BPF_TRACE_UPROBE_MULTI, BPF_TRACE_UPROBE_SESSION, kernel_supports};
use crate::model::profile_kind::ProfileKind;

/// Environment variable naming features to treat as missing (for tests of
/// what older kernels get; see [`KernelFeatures::pretend_missing`]).
pub const PRETEND_MISSING: &str = "PROFILERD_PRETEND_MISSING";

/// The kernel's type information, which typed (tp_btf) programs need.
const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// What this kernel offers, as far as the probes care.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    /// /sys/kernel/btf/vmlinux is there.
    pub btf: bool,
    /// The sys_enter_futex and sys_exit_futex tracepoints are there.
    pub futex_tracepoints: bool,
    /// The futex_wait, futex_wake and futex_waitv system calls have
    /// tracepoints (Linux 6.7; waits through them are missed without).
    pub futex2_tracepoints: bool,
    /// uprobe_multi links (`BPF_TRACE_UPROBE_MULTI`).
    pub uprobe_multi: bool,
    /// Uprobe sessions (`BPF_TRACE_UPROBE_SESSION`).
    pub uprobe_session: bool,
    /// The perf `uprobe` PMU, to which BPF programs link with a cookie
    /// (one probe per function: what older kernels offer).
    pub uprobe_pmu: bool,
}

/// A kernel feature a profile type needs, and the first Linux release
/// that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub feature: &'static str,
    pub since: &'static str,
}

const UPROBE_SESSION: Need = Need {
    feature: "uprobe sessions (BPF_TRACE_UPROBE_SESSION)",
    since: "6.13",
};
const PERF_UPROBES: Need = Need {
    feature: "perf-event uprobes with BPF cookies (the uprobe PMU, CONFIG_UPROBE_EVENTS)",
    since: "5.15",
};
const BTF: Need = Need {
    feature: "kernel BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)",
    since: "5.5",
};
const FUTEX_TRACEPOINTS: Need = Need {
    feature: "system call tracepoints for futex (CONFIG_FTRACE_SYSCALLS)",
    since: "2.6.33",
};

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, Linux {}", self.feature, self.since)
    }
}

/// What a profile type can do on this kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    Ready,
    /// Runs, without what each line says.
    Degraded(Vec<String>),
    /// Cannot run: needs this.
    Unavailable(Need),
}

impl fmt::Display for Availability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Availability::Ready => write!(f, "ready"),
            Availability::Degraded(why) => write!(f, "degraded ({})", why.join("; ")),
            Availability::Unavailable(need) => write!(f, "unavailable (needs {need})"),
        }
    }
}

impl KernelFeatures {
    /// Probes the running kernel (a few bpf(2) calls and file checks; no
    /// probe stays attached). `tracefs` is where tracepoints are listed.
    pub fn probe(tracefs: &Path) -> KernelFeatures {
        let event = |name: &str| tracefs.join("events/syscalls").join(name).is_dir();
        let mut features = KernelFeatures {
            release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".to_string()),
            btf: Path::new(KERNEL_BTF).exists(),
            futex_tracepoints: event("sys_enter_futex") && event("sys_exit_futex"),
            futex2_tracepoints: event("sys_enter_futex_wait"),
            uprobe_multi: kernel_supports(BPF_TRACE_UPROBE_MULTI),
            uprobe_session: kernel_supports(BPF_TRACE_UPROBE_SESSION),
            uprobe_pmu: UprobePmu::read().is_ok(),
        };
        if let Ok(names) = std::env::var(PRETEND_MISSING) {
            features.pretend_missing(&names);
        }
        features
    }

    /// Turns off the features named (comma-separated: `btf`,
    /// `futex_tracepoints`, `futex2_tracepoints`, `uprobe_multi`,
    /// `uprobes`), so that what an older kernel gets can be seen
    /// and tested on a newer one. Unknown names are ignored.
    fn pretend_missing(&mut self, names: &str) {
        for name in names.split(',').map(str::trim) {
            match name {
                "btf" => self.btf = false,
                "futex_tracepoints" => self.futex_tracepoints = false,
                "futex2_tracepoints" => self.futex2_tracepoints = false,
                "uprobe_multi" => self.uprobe_multi = false,
                "uprobe_session" => self.uprobe_session = false,
                "uprobe_pmu" => self.uprobe_pmu = false,
                _ => {}
            }
        }
    }

    /// What `kind` can do here.
    pub fn assess(&self, kind: ProfileKind) -> Availability {
        let mut degraded = Vec::new();
        match kind {
            // The goroutine profile reads process memory: no probe.
            ProfileKind::Cpu | ProfileKind::Goroutine => {}
            ProfileKind::Heap => {
                if !self.uprobe_session {
                    if !self.uprobe_pmu {
                        return Availability::Unavailable(UPROBE_SESSION);
                    }
                    degraded.push(format!(
                        "every allocator call also runs a return probe (perf-event uprobes), \
                         where {UPROBE_SESSION} return only from sampled calls"
                    ));
                }
            }
            ProfileKind::Block | ProfileKind::Mutex => {
                if !self.futex_tracepoints {
                    return Availability::Unavailable(FUTEX_TRACEPOINTS);
                }
                if kind == ProfileKind::Block && !self.uprobe_multi && !self.uprobe_pmu {
                    degraded.push(format!(
                        "goroutines parked by the Go runtime and condition-variable names need {PERF_UPROBES}"
                    ));
                }
            }
            ProfileKind::Offcpu => {
                if !self.btf {
                    return Availability::Unavailable(BTF);
                }
            }
        }
        match degraded.is_empty() {
            true => Availability::Ready,
            false => Availability::Degraded(degraded),
        }
    }
}

/// The line that stops a start for a profile type that cannot run here.
pub fn refusal(kind: ProfileKind, need: Need, release: &str) -> String {
    format!(
        "the {} profile cannot run on this kernel ({release}): it needs {need}; \
         ask for '{}?' in --profiles to skip it where it cannot run",
        kind.name(),
        kind.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(uprobe_multi: bool, uprobe_session: bool, btf: bool) -> KernelFeatures {
        KernelFeatures {
            release: "test".to_string(),
            btf,
            futex_tracepoints: true,
            futex2_tracepoints: false,
            uprobe_multi,
            uprobe_session,
            uprobe_pmu: true,
        }
    }

    #[test]
    fn heap_without_uprobe_sessions_runs_on_perf_event_uprobes() {
        assert_eq!(
            kernel(true, true, true).assess(ProfileKind::Heap),
            Availability::Ready
        );
        let Availability::Degraded(why) = kernel(true, false, true).assess(ProfileKind::Heap)
        else {
            panic!("heap without sessions should run, at a cost");
        };
        assert!(why[0].contains("return probe") && why[0].contains("6.13"));
        let mut no_pmu = kernel(false, false, true);
        no_pmu.uprobe_pmu = false;
        assert_eq!(
            no_pmu.assess(ProfileKind::Heap),
            Availability::Unavailable(UPROBE_SESSION)
        );
    }

    #[test]
    fn block_without_uprobe_multi_probes_each_function() {
        let mut k = kernel(false, false, true);
        assert_eq!(k.assess(ProfileKind::Block), Availability::Ready);
        k.uprobe_pmu = false;
        assert!(matches!(
            k.assess(ProfileKind::Block),
            Availability::Degraded(_)
        ));
        assert_eq!(k.assess(ProfileKind::Mutex), Availability::Ready);
        assert_eq!(k.assess(ProfileKind::Cpu), Availability::Ready);
    }

    #[test]
    fn offcpu_needs_btf() {
        assert_eq!(
            kernel(true, true, false).assess(ProfileKind::Offcpu),
            Availability::Unavailable(BTF)
        );
    }

    #[test]
    fn refusals_name_the_feature_the_release_and_the_way_out() {
        let line = refusal(ProfileKind::Heap, UPROBE_SESSION, "6.1.0-50-cloud-amd64");
        assert!(line.contains("uprobe sessions") && line.contains("Linux 6.13"));
        assert!(line.contains("6.1.0-50-cloud-amd64") && line.contains("'heap?'"));
        assert!(!line.contains('\n'));
    }

    /// Upstream kernels from 6.13 have both uprobe_multi kinds: probed as
    /// root on one, the probe must find them (elsewhere the bpf(2) calls
    /// are refused, and older kernels may or may not have backports).
    #[test]
    fn this_kernel_is_probed() {
        let started = std::time::Instant::now();
        let features = KernelFeatures::probe(Path::new("/sys/kernel/tracing"));
        println!("probed in {:?}: {features:?}", started.elapsed());
        let version: Vec<u32> = features
            .release
            .split(|c: char| !c.is_ascii_digit())
            .take(2)
            .filter_map(|n| n.parse().ok())
            .collect();
        if nix_is_root() && version.as_slice() >= [6, 13].as_slice() {
            assert!(
                features.uprobe_multi && features.uprobe_session && features.uprobe_pmu,
                "{features:?}"
            );
        }
    }

    fn nix_is_root() -> bool {
        // SAFETY: plain system call.
        unsafe { libc::geteuid() == 0 }
    }
}
