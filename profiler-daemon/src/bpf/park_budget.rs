//! Go's park probes on a budget. A probe on `runtime.gopark` and `ready`
//! costs a Go process a uprobe trap on every goroutine hand-off (some
//! 1.5 µs on the development VM), which made a channel ping-pong 20 times
//! slower. Each second this reads how often each process ran them
//! (`ParkGate::runs`, counted in the kernel inside open windows); a
//! process above `[limits] go_park_runs_per_second` gets its link put on a
//! duty cycle: attached for one window of `duty × PERIOD` at a random
//! offset in each period, detached the rest of the time. The kernel keeps
//! only the waits that began and ended inside a window (the gate), so a
//! wait of length L is seen with probability (W − L) / PERIOD, and the
//! block and mutex profiles weigh it by the inverse
//! (`profiles::waits::ParkWindows`): the estimate stays Go's, at a cost
//! the budget bounds. Waits as long as a window are not seen at all while
//! a process is on the cycle; that is what the budget buys
//! (docs/design/016-go-from-outside.md, "Park probes on a budget").
//!
//! A link probes a file: per target process (`--pid`), or for every
//! process of that executable, so every process of a cycled link is
//! gated with it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as AyaHashMap, MapData};
use profiler_common::ParkGate;

use crate::bpf::uprobes::{LinkKey, UprobeLinks};

/// Length of a duty cycle's period; one window opens in each.
pub const PERIOD: Duration = Duration::from_secs(1);
/// When the rates are first read after the start.
const FIRST_CHECK: Duration = Duration::from_millis(100);
/// The shortest window: attaching costs some 100 µs, and waits longer
/// than a window are not seen.
const MIN_WINDOW: Duration = Duration::from_millis(5);
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

/// One link on the duty cycle.
struct Cycle {
    /// Share of each period the link is attached.
    duty: f64,
    /// When this period's window opens; None once it has.
    opens_at: Option<Instant>,
    /// While open: when to detach.
    closes_at: Option<Instant>,
    /// How long the last window was open (the rate's denominator).
    last_open: Duration,
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
    /// Windows that could not attach (the process gone meanwhile).
    pub resume_failures: u64,
}

pub struct ParkBudget {
    gates: AyaHashMap<MapData, u32, ParkGate>,
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
    pub fn new(gates: AyaHashMap<MapData, u32, ParkGate>, runs_per_second: u64) -> Self {
        let now = Instant::now();
        ParkBudget {
            gates,
            runs_per_second,
            runs: HashMap::new(),
            cycles: HashMap::new(),
            owners: HashMap::new(),
            // A first look soon: the processes running at the start would
            // otherwise pay a whole period of every park probed.
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
            .filter_map(|c| c.closes_at.or(c.opens_at))
            .chain([self.next_check])
            .min()
    }

    /// Opens and closes the windows due by now, and once a period measures
    /// each process's rate and puts links on or off the cycle. Returns the
    /// windows opened.
    pub fn step(&mut self, links: &mut UprobeLinks) -> Vec<OpenWindow> {
        let mut opened = Vec::new();
        if self.runs_per_second == 0 {
            return opened;
        }
        let now = Instant::now();
        let keys: Vec<LinkKey> = self.cycles.keys().copied().collect();
        for key in keys {
            self.turn(key, now, links, &mut opened);
        }
        if now >= self.next_check {
            self.check(now, links);
        }
        opened
    }

    /// Opens or closes one cycled link's window when due.
    fn turn(
        &mut self,
        key: LinkKey,
        now: Instant,
        links: &mut UprobeLinks,
        opened: &mut Vec<OpenWindow>,
    ) {
        let tgids = self.processes_of(key);
        let Some(cycle) = self.cycles.get_mut(&key) else {
            return;
        };
        if let Some(closes_at) = cycle.closes_at
            && now >= closes_at
        {
            cycle.closes_at = None;
            if let Some(&tgid) = tgids.first() {
                links.suspend(key, exe_of(tgid));
            }
            for &tgid in &tgids {
                set_gate(&mut self.gates, tgid, SHUT);
            }
            return;
        }
        let Some(opens_at) = cycle.opens_at else {
            return;
        };
        if now < opens_at {
            return;
        }
        cycle.opens_at = None;
        let window = cycle_window(cycle.duty);
        if !links.resume(key, tgids.first().map(|&t| exe_of(t))) {
            // A process that exited is no failure: its link goes with it.
            if tgids.iter().any(|&t| exe_of(t).exists()) {
                self.stats.resume_failures += 1;
            }
            return;
        }
        // Open from the moment the probes are in: every park and ready
        // inside [since, until) is seen.
        let since = monotonic_ns();
        let until = since + window.as_nanos() as u64;
        for &tgid in &tgids {
            set_gate(&mut self.gates, tgid, (since, until));
            opened.push(OpenWindow {
                tgid,
                since_ns: since,
                until_ns: until,
                period_ns: PERIOD.as_nanos() as u64,
            });
        }
        cycle.last_open = window;
        // Detached a little after the gate shuts, so that nothing inside
        // the window is missed.
        cycle.closes_at = Some(Instant::now() + window + Duration::from_millis(1));
        self.stats.windows += 1;
    }

    /// Once a period: each process's runs since the last check, over the
    /// time its probes were open, decide which links cycle and how much.
    fn check(&mut self, now: Instant, links: &mut UprobeLinks) {
        let elapsed = now.duration_since(self.last_check);
        self.last_check = now;
        self.next_check = now + PERIOD;
        let mut rates: HashMap<LinkKey, f64> = HashMap::new();
        let gates: Vec<(u32, ParkGate)> = self.gates.iter().filter_map(Result::ok).collect();
        self.owners
            .retain(|tgid, _| gates.iter().any(|(t, _)| t == tgid));
        self.runs
            .retain(|tgid, _| gates.iter().any(|(t, _)| t == tgid));
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
            if delta == 0 {
                continue;
            }
            let open = match self.cycles.get(&key) {
                Some(cycle) => cycle.last_open,
                None => elapsed,
            };
            let rate = delta as f64 / open.as_secs_f64().max(1e-3);
            let entry = rates.entry(key).or_default();
            *entry = entry.max(rate);
        }
        let budget = self.runs_per_second as f64;
        for (key, rate) in rates {
            match self.cycles.get_mut(&key) {
                None if rate > budget => {
                    let path = match self.processes_of(key).first() {
                        Some(&tgid) => exe_of(tgid),
                        None => continue,
                    };
                    if !links.suspend(key, path) {
                        continue;
                    }
                    for tgid in self.processes_of(key) {
                        set_gate(&mut self.gates, tgid, SHUT);
                    }
                    self.cycles.insert(
                        key,
                        Cycle {
                            duty: budget / rate,
                            opens_at: None,
                            closes_at: None,
                            last_open: Duration::ZERO,
                        },
                    );
                    self.stats.links_cycled += 1;
                    tracing::info!(
                        "Go park probes of {key:?} run {rate:.0} times a second, above the budget of {budget:.0} ([limits] go_park_runs_per_second): attached {:.1}% of the time from now on, waits weighted by the time they could be seen",
                        100.0 * budget / rate
                    );
                }
                Some(cycle) if rate < budget * LEAVE_SHARE => {
                    let was_closed = cycle.closes_at.is_none();
                    self.cycles.remove(&key);
                    let tgids = self.processes_of(key);
                    if was_closed {
                        links.resume(key, tgids.first().map(|&t| exe_of(t)));
                    }
                    // Parks from before are stale: the goroutines may have
                    // been readied while the probes were detached.
                    let since = monotonic_ns();
                    for tgid in tgids {
                        set_gate(&mut self.gates, tgid, (since, u64::MAX));
                    }
                }
                Some(cycle) => cycle.duty = (budget / rate).min(1.0),
                None => {}
            }
        }
        // A link whose processes ran nothing (they parked nowhere, or
        // exited) keeps its duty; every cycle gets this period's window.
        for cycle in self.cycles.values_mut() {
            let window = cycle_window(cycle.duty);
            let room = PERIOD.saturating_sub(window + Duration::from_millis(2));
            cycle.opens_at =
                Some(now + room.mul_f64(fastrand::f64()).max(Duration::from_millis(1)));
        }
        self.stats.most_cycled = self.stats.most_cycled.max(self.cycles.len() as u64);
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

/// A window's length for `duty` of a period.
fn cycle_window(duty: f64) -> Duration {
    PERIOD
        .mul_f64(duty.clamp(0.0, 1.0))
        .clamp(MIN_WINDOW, PERIOD - Duration::from_millis(3))
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
