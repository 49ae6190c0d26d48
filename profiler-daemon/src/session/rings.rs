//! The daemon's rings the session waits on, and how full they got.

use tokio::io::unix::AsyncFd;

use crate::bpf::log::KernelLog;
use crate::bpf::ring::Ring;

/// The rings the session waits on.
pub(crate) struct Rings {
    pub(crate) events: AsyncFd<Ring>,
    pub(crate) stack_samples: AsyncFd<Ring>,
    pub(crate) heap_events: AsyncFd<Ring>,
    pub(crate) wait_events: AsyncFd<Ring>,
    pub(crate) kernel_log: Option<AsyncFd<KernelLog>>,
}

impl Rings {
    /// The size and high-water mark of each ring, by which its default
    /// size is judged (docs/BENCHMARKS.md, "Ring sizes").
    pub(crate) fn log_fill(&self) {
        let fill = |ring: &AsyncFd<Ring>| {
            format!("{}/{}", ring.get_ref().peak_fill(), ring.get_ref().size())
        };
        tracing::info!(target: "profilerd::session",
            process_events = fill(&self.events),
            stack_samples = fill(&self.stack_samples),
            heap_events = fill(&self.heap_events),
            wait_events = fill(&self.wait_events),
            "ring peak fill (bytes waiting at most / size)"
        );
    }
}
