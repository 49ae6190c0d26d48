//! The windows in which a duty-cycled Go process's park probes were open
//! (`bpf::park_budget`), and the weight of a goroutine wait that began
//! inside one. The kernel keeps the waits that begin and end inside a
//! window; those still waiting when it closes are followed in memory to
//! their end (`procs::go_parked`). So every wait that begins in a window
//! is seen, whatever its length; a window of length W opens once per
//! period P at a random offset, so a wait is seen with probability W / P
//! and stands for P / W waits (Horvitz–Thompson). A wait outside every
//! window (its process not cycled) weighs 1.
//!
//! The mutex profile's contentions are charged at their release, which
//! the kernel sees only inside a window: a release is seen with
//! probability (W − L) / P for a wait of length L, and weighs the inverse
//! (`window_weight`), waits of half the window or more left out.

use super::*;
use crate::bpf::park_budget::OpenWindow;

/// Windows remembered per process: a wait is read within a second or two
/// of its end, and a window opens every 100 ms at most.
const WINDOWS_PER_PROCESS: usize = 64;
/// Processes whose windows are remembered (all are let go when full).
const MAX_PROCESSES: usize = 4096;

#[derive(Default)]
pub struct ParkWindows {
    by_process: HashMap<u32, VecDeque<OpenWindow>>,
    /// Per process, the windows opened since the profiles last said so:
    /// (count, length and period of the last, in ns).
    since_told: HashMap<u32, (u64, u64, u64)>,
}

impl ParkWindows {
    pub fn open(&mut self, window: OpenWindow) {
        if self.by_process.len() >= MAX_PROCESSES && !self.by_process.contains_key(&window.tgid) {
            self.by_process.clear();
        }
        if self.since_told.len() < MAX_PROCESSES || self.since_told.contains_key(&window.tgid) {
            let told = self.since_told.entry(window.tgid).or_default();
            *told = (
                told.0 + 1,
                window.until_ns - window.since_ns,
                window.period_ns,
            );
        }
        let windows = self.by_process.entry(window.tgid).or_default();
        if windows.len() >= WINDOWS_PER_PROCESS {
            windows.pop_front();
        }
        windows.push_back(window);
    }

    /// What the block and mutex profiles of a window say of the processes
    /// whose park probes were on a duty cycle in it (their comments): that
    /// their goroutines' values are estimates, and of what. Starts the
    /// next window's account.
    pub fn take_notes(&mut self) -> Vec<String> {
        let mut told: Vec<(u32, (u64, u64, u64))> = self.since_told.drain().collect();
        told.sort_unstable_by_key(|&(tgid, _)| tgid);
        told.into_iter()
            .map(|(tgid, (windows, length, period))| {
                format!(
                    "pid {tgid}: Go park probes on a duty cycle ([limits] go_park_runs_per_second): \
                     {windows} windows of {:.0} ms, one every {:.0} ms; its goroutines' waits are \
                     estimates: each that began in a window weighted by its chance to begin in one \
                     (those still waiting at its close followed to their end), and in the mutex \
                     profile each release seen weighted by its chance to be seen (waits of \
                     {:.0} ms or more not seen there)",
                    length as f64 / 1e6,
                    period as f64 / 1e6,
                    length as f64 / 2e6,
                )
            })
            .collect()
    }

    /// The (period, length) of the window of process `tgid` that holds
    /// kernel time `at_ns`, if any.
    pub fn window_at(&self, tgid: u32, at_ns: u64) -> Option<(u64, u64)> {
        self.by_process
            .get(&tgid)?
            .iter()
            .find(|w| w.since_ns <= at_ns && at_ns < w.until_ns)
            .map(|w| (w.period_ns, w.until_ns - w.since_ns))
    }

    /// The weight of a goroutine's wait of `waited_ns` in process `tgid`
    /// that ended at `end_ns`: period over window for one that began in a
    /// window, 1 for one that did not (its process was not cycled).
    pub fn weight(&self, tgid: u32, end_ns: u64, waited_ns: u64) -> f64 {
        self.window_at(tgid, end_ns.saturating_sub(waited_ns))
            .map_or(1.0, |(period_ns, length_ns)| {
                period_ns as f64 / length_ns.max(1) as f64
            })
    }
}

/// Mutex releases left out because their waits lasted half their window or
/// more (their weight would be unbounded as they near its length).
pub static GO_WAITS_PAST_HALF_WINDOW: AtomicU64 = AtomicU64::new(0);

/// What a wait of `waited_ns` seen in a window of (period, length) stands
/// for: 0 (left out, counted) when it lasted half the window or more. A
/// wait nearly as long as its window is seen with a chance near 0, and one
/// seen would stand for thousands: in a benchmark suite, a few such waits
/// made a site 48% of the block profile where Go's own had 9%. Bounded at
/// twice the period over the window, waits shorter than half the window
/// stay estimated without bias, and longer ones are not seen, as those
/// longer than the window are not.
pub fn window_weight((period_ns, length_ns): (u64, u64), waited_ns: u64) -> f64 {
    if waited_ns.saturating_mul(2) >= length_ns {
        GO_WAITS_PAST_HALF_WINDOW.fetch_add(1, Ordering::Relaxed);
        return 0.0;
    }
    period_ns as f64 / length_ns.saturating_sub(waited_ns).max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(tgid: u32, since_ns: u64, until_ns: u64) -> OpenWindow {
        OpenWindow {
            tgid,
            since_ns,
            until_ns,
            period_ns: 1_000_000_000,
        }
    }

    #[test]
    fn a_wait_weighs_the_inverse_of_its_chance_to_be_seen() {
        let mut w = ParkWindows::default();
        // A 20 ms window of each second.
        w.open(window(7, 5_000_000_000, 5_020_000_000));
        // Waits that began in it, ended in it or after it closed: each
        // began in a window with probability 20/1000.
        assert_eq!(w.weight(7, 5_010_000_000, 1_000_000), 50.0);
        assert_eq!(w.weight(7, 5_015_000_000, 15_000_000), 50.0);
        assert_eq!(w.weight(7, 6_000_000_000, 995_000_000), 50.0);
        // Another process, or one that began outside it: weight 1.
        assert_eq!(w.weight(8, 5_010_000_000, 1_000_000), 1.0);
        assert_eq!(w.weight(7, 5_030_000_000, 9_000_000), 1.0);
        // A release of a wait of half the window or more: left out.
        assert_eq!(window_weight((1_000_000_000, 20_000_000), 10_000_000), 0.0);
        // The profiles say so once.
        let notes = w.take_notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("pid 7: ") && notes[0].contains("1 windows of 20 ms"));
        assert!(w.take_notes().is_empty());
    }

    /// Waits of many lengths, shorter and far longer than the window,
    /// started uniformly over many periods with a window at a random offset
    /// in each: the weighted sum of those that began in a window (the
    /// kernel's and those followed past it) estimates their number and
    /// total length.
    #[test]
    fn weighted_waits_estimate_every_wait() {
        let period = 1_000_000_000u64;
        let length = 25_000_000u64;
        let mut rng = fastrand::Rng::with_seed(20261127);
        let (mut count, mut delay) = (0.0, 0.0);
        let (mut true_count, mut true_delay) = (0.0, 0.0);
        for k in 0..4000u64 {
            let mut windows = ParkWindows::default();
            let since = k * period + rng.u64(0..period - length);
            windows.open(window(1, since, since + length));
            // 200 waits a period, 0.1 to 200 ms long.
            for _ in 0..200 {
                let start = k * period + rng.u64(0..period);
                let waited = rng.u64(100_000..200_000_000);
                true_count += 1.0;
                true_delay += waited as f64;
                if start >= since && start < since + length {
                    let weight = windows.weight(1, start + waited, waited);
                    count += weight;
                    delay += weight * waited as f64;
                }
            }
        }
        assert!(
            (count / true_count - 1.0).abs() < 0.03,
            "{count} vs {true_count}"
        );
        assert!(
            (delay / true_delay - 1.0).abs() < 0.03,
            "{delay} vs {true_delay}"
        );
    }
}
