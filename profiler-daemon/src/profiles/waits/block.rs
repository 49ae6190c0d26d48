//! The block and off-CPU windows: kept waits by stack, each weighted by
//! Go's block rule (`rescale::block_event`).

use super::*;

/// Estimated contentions and delay (ns) of one stack.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Weight {
    pub contentions: f64,
    pub delay_ns: f64,
}

impl Weight {
    pub(super) fn add(&mut self, (contentions, delay_ns): (f64, f64)) {
        self.contentions += contentions;
        self.delay_ns += delay_ns;
    }
}

/// Block profile: kept waits of the current window.
#[derive(Default)]
pub struct BlockWindow {
    samples: HashMap<SampleId, Weight>,
    /// On-demand captures (`/debug/pprof/block`, `/debug/pprof/offcpu`):
    /// each gets a copy of the waits of its processes, beside the window.
    pub taps: Taps<SampleId, Weight>,
}

impl BlockWindow {
    /// A kept wait of `waited_ns`, sampled at `rate_ns`.
    pub fn add(&mut self, id: SampleId, waited_ns: u64, rate_ns: u64) {
        self.add_weighted(id, waited_ns, rate_ns, 1.0);
    }

    /// A kept wait that stands for `weight` waits beyond Go's rule (seen
    /// in a park-probe window: `ParkWindows`).
    pub fn add_weighted(&mut self, id: SampleId, waited_ns: u64, rate_ns: u64, weight: f64) {
        let (contentions, delay_ns) = block_event(waited_ns, rate_ns);
        let added = (contentions * weight, delay_ns * weight);
        self.taps.add(id.tgid, &id, |w| w.add(added));
        if self.taps.window_wants(id.tgid) {
            self.samples.entry(id).or_default().add(added);
        }
    }

    pub fn close(&mut self) -> Vec<(Arc<SampleId>, Weight)> {
        rows_of(std::mem::take(&mut self.samples))
    }

    /// Ends capture `id`'s tap: the waits it gathered.
    pub fn take_tap(&mut self, id: u64) -> Vec<(Arc<SampleId>, Weight)> {
        self.taps
            .take(id)
            .map(|t| rows_of(t.rows))
            .unwrap_or_default()
    }
}

fn rows_of(samples: HashMap<SampleId, Weight>) -> Vec<(Arc<SampleId>, Weight)> {
    samples
        .into_iter()
        .map(|(id, weight)| (Arc::new(id), weight))
        .collect()
}
