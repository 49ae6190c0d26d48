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
        self.samples
            .entry(id)
            .or_default()
            .add((contentions * weight, delay_ns * weight));
    }

    pub fn close(&mut self) -> Vec<(Arc<SampleId>, Weight)> {
        self.samples
            .drain()
            .map(|(id, weight)| (Arc::new(id), weight))
            .collect()
    }
}
