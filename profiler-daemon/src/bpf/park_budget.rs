//! Go's park probes on a budget. A probe on `runtime.gopark` and `ready`
//! costs a Go process a uprobe trap on every goroutine hand-off (some
//! 1.5 µs on the development VM), which made a channel ping-pong 20 times
//! slower. Each second this reads how often each process ran them
//! (`ParkGate::runs`, counted in the kernel inside open windows); a
//! process above `[limits] go_park_runs_per_second` gets its link put on a
//! duty cycle: attached for one window of W = duty × P at a random offset
//! in each period P, detached the rest of the time. The kernel keeps the
//! waits that began and ended inside a window (the gate); when a window
//! closes, the parks it recorded whose ready it did not see (`GO_PARKED`,
//! read in batches and left as it is) are handed on, and
//! `procs::go_parked` follows those goroutines to their wait's end. So
//! every wait that begins in a window is seen, with probability W / P, and
//! the block profile weighs it by the inverse
//! (`profiles::waits::ParkWindows`): the estimate stays Go's, at a cost
//! the budget bounds. The mutex profile sees a release only inside a
//! window (probability (W − L) / P for a wait of length L). Windows are
//! short and frequent (`MIN_WINDOW` every `MIN_PERIOD` to `MAX_PERIOD`),
//! so that every phase of a program is seen; waits that began before
//! their window are counted (`GO_WAITS_OUTLASTING_WINDOWS`); the profiles
//! say which processes were cycled, in their comments
//! (docs/design/016-go-from-outside.md, "Park probes on a budget").
//!
//! A link probes a file: per target process (`--pid`), or for every
//! process of that executable, so every process of a cycled link is
//! gated with it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::os::fd::AsFd;

use aya::maps::{HashMap as AyaHashMap, IterableMap, MapData};
use profiler_common::{GO_PARK_CALL_BEFORE_WINDOW, GoPark, LiveKey, ParkGate};

use crate::bpf::map_syscalls;
use crate::bpf::uprobes::{LinkKey, UprobeLinks};

/// How often the processes' rates are read.
pub const CHECK: Duration = Duration::from_secs(1);
/// When the rates are first read after the start: the processes running
/// then would otherwise pay a whole second of every park probed.
const FIRST_CHECK: Duration = Duration::from_millis(100);
/// The shortest window. Short, so that windows come often: a program that
/// changes phase every few tens of milliseconds (a benchmark suite, a
/// batch job) is seen in every phase, and its estimate gathers many
/// windows (the waits that outlast theirs are followed to their end).
/// One window of 100 ms every 2.5 s saw three phases of a 5 s run; one of
/// 20 ms every 400 ms left the sync benchmarks' estimate of each site
/// 20-30 points from Go's from one run to the next (design 016, "Park
/// probes on a budget").
const MIN_WINDOW: Duration = Duration::from_millis(5);
/// The shortest period: at a duty of MIN_WINDOW / MIN_PERIOD (20%) or
/// more, forty windows a second (each an attach and a detach).
const MIN_PERIOD: Duration = Duration::from_millis(25);
/// The longest period: below a duty of MIN_WINDOW / MAX_PERIOD (1%), a
/// process pays that duty, above its budget.
const MAX_PERIOD: Duration = Duration::from_millis(500);
/// A cycled link goes back to always attached when its rate in the open
/// windows falls below this share of the budget (hysteresis).
const LEAVE_SHARE: f64 = 0.5;
/// A gate that is shut: nothing is recorded or counted.
const SHUT: (u64, u64) = (u64::MAX, u64::MAX);

/// A window opened for a process: its waits are weighted by
/// `period_ns / (until_ns − since_ns − wait)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenWindow {
    pub tgid: u32,
    pub since_ns: u64,
    pub until_ns: u64,
    pub period_ns: u64,
}

/// A park the kernel recorded in a window that closed before its ready.
#[derive(Clone, Copy, Debug)]
pub struct LeftOpen {
    pub tgid: u32,
    /// The goroutine (its `g`).
    pub g: u64,
    pub park: GoPark,
    /// When the window closed (kernel monotonic time): the goroutine was
    /// still waiting then, as the kernel saw no ready before.
    pub window_end_ns: u64,
}

/// One link on the duty cycle.
struct Cycle {
    /// Its period and the window in each, for the duty last measured.
    period: Duration,
    window: Duration,
    /// When the current period ends (and the next one's window is drawn).
    period_end: Instant,
    /// When this period's window opens; None once it has.
    opens_at: Option<Instant>,
    /// While open: when to detach, and the gate's `[since, until)`.
    closes_at: Option<Instant>,
    gate: (u64, u64),
    /// Runs and open time since the rate was last measured.
    runs: u64,
    open: Duration,
}

impl Cycle {
    fn new(duty: f64, now: Instant) -> Self {
        let mut cycle = Cycle {
            period: MIN_PERIOD,
            window: MIN_WINDOW,
            period_end: now,
            opens_at: None,
            closes_at: None,
            gate: SHUT,
            runs: 0,
            open: Duration::ZERO,
        };
        cycle.set_duty(duty);
        cycle.next_period(now);
        cycle
    }

    /// The period and window for `duty`: windows of MIN_WINDOW as often
    /// as the duty allows (every MIN_PERIOD at most, longer windows
    /// then), never rarer than every MAX_PERIOD.
    fn set_duty(&mut self, duty: f64) {
        let duty = duty.clamp(1e-6, 1.0);
        self.period = MIN_WINDOW.div_f64(duty).clamp(MIN_PERIOD, MAX_PERIOD);
        self.window = self
            .period
            .mul_f64(duty)
            .clamp(MIN_WINDOW, self.period - Duration::from_millis(3));
    }

    /// Draws the window of the period that starts now: uniformly at
    /// random where it fits, so that every wait's chance to be seen is
    /// (W − L) / P.
    fn next_period(&mut self, now: Instant) {
        let room = self
            .period
            .saturating_sub(self.window + Duration::from_millis(2));
        self.opens_at = Some(now + room.mul_f64(fastrand::f64()));
        self.period_end = now + self.period;
    }
}

/// What the duty cycles did, for the exit summary.
#[derive(Clone, Copy, Debug, Default)]
pub struct BudgetStats {
    /// Windows opened.
    pub windows: u64,
    /// Links that went on a duty cycle (each time).
    pub links_cycled: u64,
    /// Most links on a duty cycle at once.
    pub most_cycled: u64,
    /// Windows that could not attach though their process lived.
    pub resume_failures: u64,
    /// Parks read from the kernel's map when windows closed that would not
    /// read.
    pub parks_unread: u64,
}

/// What one step did: the windows it opened, and the parks of those it
/// closed that were still waiting (when block profiles follow them).
#[derive(Default)]
pub struct Step {
    pub opened: Vec<OpenWindow>,
    pub left_open: Vec<LeftOpen>,
}

pub struct ParkBudget {
    gates: AyaHashMap<MapData, u32, ParkGate>,
    /// The kernel's parks, read when a window closes: None when nothing
    /// follows them (no block profile, or `[debug] follow_parked = false`).
    parked: Option<AyaHashMap<MapData, LiveKey, GoPark>>,
    runs_per_second: u64,
    /// Run counts last read, by process.
    runs: HashMap<u32, u64>,
    cycles: HashMap<LinkKey, Cycle>,
    /// The link of each process in the kernel's map, as of the last check.
    owners: HashMap<u32, LinkKey>,
    next_check: Instant,
    last_check: Instant,
    stats: BudgetStats,
}

impl ParkBudget {
    /// `runs_per_second` 0: no budget (the probes are never detached).
    pub fn new(
        gates: AyaHashMap<MapData, u32, ParkGate>,
        parked: Option<AyaHashMap<MapData, LiveKey, GoPark>>,
        runs_per_second: u64,
    ) -> Self {
        let now = Instant::now();
        ParkBudget {
            gates,
            parked,
            runs_per_second,
            runs: HashMap::new(),
            cycles: HashMap::new(),
            owners: HashMap::new(),
            next_check: now + FIRST_CHECK,
            last_check: now,
            stats: BudgetStats::default(),
        }
    }

    pub fn stats(&self) -> BudgetStats {
        self.stats
    }

    /// When [`Self::step`] has something to do; None without a budget.
    pub fn next_due(&self) -> Option<Instant> {
        if self.runs_per_second == 0 {
            return None;
        }
        self.cycles
            .values()
            .filter_map(|c| c.closes_at.or(c.opens_at).or(Some(c.period_end)))
            .chain([self.next_check])
            .min()
    }

    /// Opens and closes the windows due by now, and every second measures
    /// each process's rate and puts links on or off the cycle. Returns the
    /// windows opened and the parks of those closed still waiting.
    pub fn step(&mut self, links: &mut UprobeLinks) -> Step {
        let mut step = Step::default();
        if self.runs_per_second == 0 {
            return step;
        }
        let now = Instant::now();
        let keys: Vec<LinkKey> = self.cycles.keys().copied().collect();
        let mut closed = Vec::new();
        for key in keys {
            self.turn(key, now, links, &mut step.opened, &mut closed);
        }
        if !closed.is_empty() {
            step.left_open = self.left_open(&closed);
        }
        if now >= self.next_check {
            self.check(now, links);
        }
        step
    }

    /// The parks recorded in the windows `closed` (process, gate) whose
    /// ready the kernel did not see inside them.
    fn left_open(&mut self, closed: &[(u32, (u64, u64))]) -> Vec<LeftOpen> {
        let Some(parked) = &self.parked else {
            return Vec::new();
        };
        let parks = match map_syscalls::lookup_all::<LiveKey, GoPark>(parked.map().fd().as_fd()) {
            Ok(parks) => parks,
            Err(e) => {
                if self.stats.parks_unread == 0 {
                    tracing::warn!(
                        "reading the goroutines parked in a closed window failed: {e}; their waits go unseen (counted as go_parks_unread)"
                    );
                }
                self.stats.parks_unread += 1;
                return Vec::new();
            }
        };
        let windows: HashMap<u32, (u64, u64)> = closed.iter().copied().collect();
        parks
            .into_iter()
            .filter_map(|(key, park)| {
                let &(since, until) = windows.get(&key.tgid)?;
                // A semaphore wait whose call began before the window began
                // before it by Go's rule.
                let began_in = since <= park.start_ns
                    && park.start_ns < until
                    && park.reason & GO_PARK_CALL_BEFORE_WINDOW == 0;
                began_in.then_some(LeftOpen {
                    tgid: key.tgid,
                    g: key.addr,
                    park,
                    window_end_ns: until,
                })
            })
            .collect()
    }

    /// Closes, opens or draws one cycled link's window when due.
    fn turn(
        &mut self,
        key: LinkKey,
        now: Instant,
        links: &mut UprobeLinks,
        opened: &mut Vec<OpenWindow>,
        closed: &mut Vec<(u32, (u64, u64))>,
    ) {
        let tgids = self.processes_of(key);
        let Some(cycle) = self.cycles.get_mut(&key) else {
            return;
        };
        if let Some(closes_at) = cycle.closes_at {
            if now >= closes_at {
                cycle.closes_at = None;
                if let Some(&tgid) = tgids.first() {
                    links.suspend(key, exe_of(tgid));
                }
                for &tgid in &tgids {
                    set_gate(&mut self.gates, tgid, SHUT);
                    closed.push((tgid, cycle.gate));
                }
            }
            return;
        }
        if cycle.opens_at.is_none() {
            if now >= cycle.period_end {
                cycle.next_period(now);
            }
            return;
        }
        if cycle.opens_at.is_some_and(|at| now < at) {
            return;
        }
        cycle.opens_at = None;
        if !links.resume(key, tgids.first().map(|&t| exe_of(t))) {
            // A process that exited is no failure: its link goes with it.
            // Either way the link is gone, and so is its cycle (a process
            // of that file seen later is attached anew).
            if tgids.iter().any(|&t| exe_of(t).exists()) {
                self.stats.resume_failures += 1;
            }
            self.cycles.remove(&key);
            return;
        }
        // Open from the moment the probes are in: every park and ready
        // inside [since, until) is seen.
        let since = monotonic_ns();
        let until = since + cycle.window.as_nanos() as u64;
        for &tgid in &tgids {
            set_gate(&mut self.gates, tgid, (since, until));
            opened.push(OpenWindow {
                tgid,
                since_ns: since,
                until_ns: until,
                period_ns: cycle.period.as_nanos() as u64,
            });
        }
        cycle.open += cycle.window;
        cycle.gate = (since, until);
        // Detached a little after the gate shuts, so that nothing inside
        // the window is missed.
        cycle.closes_at = Some(Instant::now() + cycle.window + Duration::from_millis(1));
        self.stats.windows += 1;
    }

    /// Every second: each link's runs since the last check, over the time
    /// its probes were open, decide which links cycle and how much.
    fn check(&mut self, now: Instant, links: &mut UprobeLinks) {
        let elapsed = now.duration_since(self.last_check);
        self.last_check = now;
        self.next_check = now + CHECK;
        let gates: Vec<(u32, ParkGate)> = self.gates.iter().filter_map(Result::ok).collect();
        let present: std::collections::HashSet<u32> = gates.iter().map(|&(t, _)| t).collect();
        self.owners.retain(|tgid, _| present.contains(tgid));
        self.runs.retain(|tgid, _| present.contains(tgid));
        // Runs since the last check, by link.
        let mut runs: HashMap<LinkKey, u64> = HashMap::new();
        for (tgid, gate) in gates {
            let before = self.runs.insert(tgid, gate.runs).unwrap_or(0);
            let delta = gate.runs.checked_sub(before).unwrap_or(gate.runs);
            let key = match self.owners.get(&tgid) {
                Some(&key) => key,
                None => match links.link_of(tgid) {
                    Some(key) => *self.owners.entry(tgid).or_insert(key),
                    None => continue,
                },
            };
            *runs.entry(key).or_default() += delta;
        }
        let budget = self.runs_per_second as f64;
        for (key, delta) in runs {
            let Some(cycle) = self.cycles.get_mut(&key) else {
                let rate = delta as f64 / elapsed.as_secs_f64().max(1e-3);
                if rate > budget {
                    self.start_cycle(key, rate, now, links);
                }
                continue;
            };
            cycle.runs += delta;
            // Measured once a window has closed since the last measure.
            if cycle.open.is_zero() || cycle.closes_at.is_some() {
                continue;
            }
            let rate = cycle.runs as f64 / cycle.open.as_secs_f64();
            (cycle.runs, cycle.open) = (0, Duration::ZERO);
            if rate >= budget * LEAVE_SHARE {
                cycle.set_duty(budget / rate.max(1.0));
                continue;
            }
            self.cycles.remove(&key);
            let tgids = self.processes_of(key);
            links.resume(key, tgids.first().map(|&t| exe_of(t)));
            // Parks from before are stale: the goroutines may have been
            // readied while the probes were detached.
            let since = monotonic_ns();
            for tgid in tgids {
                set_gate(&mut self.gates, tgid, (since, u64::MAX));
            }
        }
        self.stats.most_cycled = self.stats.most_cycled.max(self.cycles.len() as u64);
    }

    /// Puts link `key`, whose processes ran the probes `rate` times a
    /// second, on the duty cycle: detached now, its first window drawn.
    fn start_cycle(&mut self, key: LinkKey, rate: f64, now: Instant, links: &mut UprobeLinks) {
        let tgids = self.processes_of(key);
        let Some(&first) = tgids.first() else {
            return;
        };
        if !links.suspend(key, exe_of(first)) {
            return;
        }
        for &tgid in &tgids {
            set_gate(&mut self.gates, tgid, SHUT);
        }
        let budget = self.runs_per_second as f64;
        let cycle = Cycle::new(budget / rate, now);
        tracing::info!(
            "Go park probes of process {first} ({}) run {rate:.0} times a second, above the budget of {budget:.0} ([limits] go_park_runs_per_second): from now on attached {:?} of every {:?} (waits weighted by their chance to be seen; longer waits not seen, counted as go_waits_outlasting_windows)",
            std::fs::read_link(exe_of(first))
                .map_or_else(|_| "?".to_string(), |p| p.display().to_string()),
            cycle.window,
            cycle.period,
        );
        self.cycles.insert(key, cycle);
        self.stats.links_cycled += 1;
    }

    /// Forgets a process that exited or exec'd (its gate too: a new image
    /// starts open, and its pid may be reused).
    pub fn forget(&mut self, tgid: u32) {
        self.runs.remove(&tgid);
        self.owners.remove(&tgid);
        // Gone already (evicted, or never there): nothing to do.
        let _ = self.gates.remove(&tgid);
    }

    /// The processes whose gates follow link `key`: its target, or those
    /// in the kernel's map whose executable it probes (as of the last
    /// check; bounded by the kernel's map).
    fn processes_of(&self, key: LinkKey) -> Vec<u32> {
        if key.1 != 0 {
            return vec![key.1];
        }
        self.owners
            .iter()
            .filter(|&(_, &owner)| owner == key)
            .map(|(&tgid, _)| tgid)
            .collect()
    }
}

fn exe_of(tgid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{tgid}/exe"))
}

/// Sets process `tgid`'s gate to `[since, until)`, keeping its run count.
fn set_gate(gates: &mut AyaHashMap<MapData, u32, ParkGate>, tgid: u32, (since, until): (u64, u64)) {
    let runs = gates.get(&tgid, 0).map_or(0, |g| g.runs);
    let gate = ParkGate {
        since_ns: since,
        until_ns: until,
        runs,
    };
    if let Err(e) = gates.insert(tgid, gate, 0) {
        tracing::debug!("setting the park gate of process {tgid} failed: {e}");
    }
}

/// The kernel's monotonic clock (`bpf_ktime_get_ns`), in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duty_gets_a_window_of_at_least_the_shortest() {
        let now = Instant::now();
        // Half: forty windows of 12.5 ms a second.
        let c = Cycle::new(0.5, now);
        assert_eq!(
            (c.period, c.window),
            (MIN_PERIOD, Duration::from_micros(12_500))
        );
        // 5%: the period grows so that the window is 5 ms.
        let c = Cycle::new(0.05, now);
        assert_eq!(
            (c.period, c.window),
            (Duration::from_millis(100), MIN_WINDOW)
        );
        // Below 1%: the longest period, the shortest window.
        let c = Cycle::new(0.001, now);
        assert_eq!((c.period, c.window), (MAX_PERIOD, MIN_WINDOW));
        // The window lies inside its period.
        for _ in 0..100 {
            let c = Cycle::new(0.5, now);
            let opens = c.opens_at.expect("drawn");
            assert!(opens >= now && opens + c.window <= c.period_end);
        }
    }
}
