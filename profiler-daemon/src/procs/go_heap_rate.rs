//! The rate each Go process's runtime samples its allocations by
//! (`runtime.MemProfileRate`), read from its memory: kept for the
//! process's life, so that a window built after it exited is rescaled by
//! the rate its samples were taken at; and the Go processes whose runtime
//! samples nothing (rate 0: a program that links no heap profiler, whose
//! linker sets `runtime.disableMemoryProfiling`, or one that set the rate
//! to 0 itself), told in the log, the counters and the heap profile's
//! comments, or, only where the operator asked for it
//! (`--go-heap-sampling force`), made to sample by writing the rate into
//! the process (design 016, "Go heaps that the runtime does not sample").

use std::collections::VecDeque;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use object::{Object, ObjectSection, ObjectSymbol};

use crate::config::GoHeapSampling as GoSampling;
use crate::model::go_pclntab::Pclntab;
use crate::procs::go_code;
use crate::procs::go_runtime::{first_segment, in_executable, load_bias_of};
use crate::procs::memory::Memory;

/// Go's default `runtime.MemProfileRate`: a sample per 512 KiB allocated,
/// on average.
pub const DEFAULT_MEM_PROFILE_RATE: u64 = 512 * 1024;

/// How long after a Go process's exec its rate is first read: its
/// runtime sets the rate to 0 in `schedinit` (where the linker disabled
/// profiling) and `main` may set its own, both within milliseconds.
pub const CHECK_DELAY: Duration = Duration::from_millis(250);

/// A rate read longer ago than this is read again at the process's next
/// sample (the program may change it while it runs).
const REREAD_AFTER: Duration = Duration::from_secs(1);

/// Go processes whose first check is pending, at most (more are counted
/// in `checks_dropped` and not checked).
const PENDING_MAX: usize = 4096;
/// Processes whose rate is kept, at most (emptied when full: a rate is
/// then read again, or assumed for a process gone).
const RATES_KEPT: usize = 16_384;
/// Unsampled processes named in the heap profile's comments, at most.
const UNSAMPLED_KEPT: usize = 256;
/// Executables whose rate's address is kept (emptied when full).
const ADDRESSES_KEPT: usize = 256;

/// Where an executable keeps `runtime.MemProfileRate` (an address in the
/// file's space), the file's first segment's address, and whether its
/// linker turned memory profiling off (`runtime.disableMemoryProfiling`,
/// known only where the symbol table is kept).
#[derive(Debug, Clone, Copy)]
struct RateAddress {
    rate: u64,
    first: u64,
    disabled: Option<bool>,
}

/// A rate read from a process.
#[derive(Debug, Clone, Copy)]
struct Reading {
    rate: u64,
    at: Instant,
}

/// Counters of what was found (the exit summary and `/metrics`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GoHeapRateStats {
    /// Go processes checked after their start.
    pub checked: u64,
    /// Go processes whose runtime samples nothing, left so (each logged
    /// once).
    pub unsampled: u64,
    /// Go processes whose rate was set to `--heap-sample-bytes`.
    pub forced: u64,
    /// Go processes whose rate could not be set (logged once each).
    pub force_failed: u64,
    /// Windows of Go processes rescaled by Go's default rate because
    /// their rate was never read (its address not found, or the process
    /// gone before any read).
    pub rates_assumed: u64,
    /// Go processes not checked: too many pending at once.
    pub checks_dropped: u64,
}

/// Go processes' heap sampling rates (see the module's documentation).
#[derive(Debug)]
pub struct GoHeapRates {
    /// Whether Go processes are checked at all (heap profiles are on).
    watching: bool,
    sampling: GoSampling,
    /// The rate `Force` sets.
    force_rate: u64,
    addresses: HashMap<(u64, u64), Option<RateAddress>>,
    rates: HashMap<u32, Reading>,
    pending: VecDeque<(u32, Instant)>,
    /// Unsampled processes still running, with the line their heap
    /// profiles carry.
    unsampled: HashMap<u32, String>,
    pub stats: GoHeapRateStats,
}

impl Default for GoHeapRates {
    fn default() -> Self {
        Self::new(false, GoSampling::Report, DEFAULT_MEM_PROFILE_RATE)
    }
}

impl GoHeapRates {
    /// `watching`: heap profiles are on; `sampling`, `force_rate`: what
    /// to do with a process that samples nothing.
    pub fn new(watching: bool, sampling: GoSampling, force_rate: u64) -> Self {
        Self {
            watching,
            sampling,
            force_rate: force_rate.max(1),
            addresses: HashMap::default(),
            rates: HashMap::default(),
            pending: VecDeque::new(),
            unsampled: HashMap::default(),
            stats: GoHeapRateStats::default(),
        }
    }

    /// Whether Go processes are to be noted ([`GoHeapRates::note`]).
    pub fn watching(&self) -> bool {
        self.watching
    }

    /// Go process `tgid` started (or was found running): its rate is read
    /// `after` from now.
    pub fn note(&mut self, tgid: u32, after: Duration) {
        if !self.watching {
            return;
        }
        if self.pending.len() >= PENDING_MAX {
            self.stats.checks_dropped += 1;
            return;
        }
        // A new image under the pid: what was known is the old one's.
        self.rates.remove(&tgid);
        self.unsampled.remove(&tgid);
        self.pending.push_back((tgid, Instant::now() + after));
    }

    /// When the next pending check is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending.front().map(|&(_, due)| due)
    }

    /// Checks the processes whose time has come: reads each one's rate,
    /// keeps it, and handles a rate of 0 as `sampling` says.
    pub fn check_due(&mut self) {
        let now = Instant::now();
        while let Some(&(tgid, due)) = self.pending.front() {
            if due > now {
                break;
            }
            self.pending.pop_front();
            self.check(tgid);
        }
    }

    fn check(&mut self, tgid: u32) {
        let Some(address) = self.address_of(tgid) else {
            return;
        };
        let Some(rate) = read_rate(tgid, address) else {
            return;
        };
        self.stats.checked += 1;
        if rate > 0 {
            self.keep(tgid, rate);
            return;
        }
        let comm = comm_of(tgid);
        let why = match address.disabled {
            Some(true) => {
                "it links no heap profiler (neither runtime/pprof nor net/http/pprof), so Go's \
                 linker turned sampling off (runtime.disableMemoryProfiling)"
            }
            Some(false) => "the program set runtime.MemProfileRate = 0",
            None => {
                "the program set runtime.MemProfileRate = 0, or links no heap profiler \
                 (runtime.disableMemoryProfiling)"
            }
        };
        if self.sampling == GoSampling::Force {
            match write_rate(tgid, address, self.force_rate) {
                Ok(()) => {
                    self.stats.forced += 1;
                    self.keep(tgid, self.force_rate);
                    tracing::info!(
                        "pid {tgid} ({comm}): Go's runtime sampled no allocations ({why}); \
                         set its runtime.MemProfileRate to {} as --go-heap-sampling force asks",
                        self.force_rate
                    );
                    return;
                }
                Err(e) => {
                    self.stats.force_failed += 1;
                    tracing::warn!(
                        "pid {tgid} ({comm}): no Go heap profile: its runtime samples no \
                         allocations ({why}), and setting its runtime.MemProfileRate failed: {e}"
                    );
                }
            }
        } else {
            self.stats.unsampled += 1;
            tracing::warn!(
                "pid {tgid} ({comm}): no Go heap profile: its runtime samples no allocations \
                 (runtime.MemProfileRate is 0: {why}); --go-heap-sampling force sets the rate \
                 in the process"
            );
        }
        if self.unsampled.len() < UNSAMPLED_KEPT {
            self.unsampled.insert(
                tgid,
                format!(
                    "pid {tgid} ({comm}): no Go heap samples: runtime.MemProfileRate is 0 ({why})"
                ),
            );
        }
    }

    /// The rate of Go process `tgid` at one of its samples: read once, and
    /// again when the reading is older than a second, so that a window
    /// built after the process exited has the rate of its last samples.
    pub fn at_sample(&mut self, tgid: u32) {
        let fresh = self
            .rates
            .get(&tgid)
            .is_some_and(|r| r.at.elapsed() < REREAD_AFTER);
        if !fresh
            && let Some(address) = self.address_of(tgid)
            && let Some(rate) = read_rate(tgid, address)
        {
            self.keep(tgid, rate);
        }
    }

    /// The rate by which a window's samples of Go process `tgid` are
    /// rescaled: read now if it runs, else the last reading; Go's default
    /// where there was none (counted).
    pub fn for_window(&mut self, tgid: u32) -> u64 {
        self.at_sample(tgid);
        match self.rates.get(&tgid) {
            // A rate of 0 set after the samples were taken: the last
            // positive one is not known, the default is assumed.
            Some(reading) if reading.rate > 0 => reading.rate,
            _ => {
                self.stats.rates_assumed += 1;
                DEFAULT_MEM_PROFILE_RATE
            }
        }
    }

    /// After a window: forgets what is known of processes that are gone
    /// (`running` tells), and returns the comment lines of the unsampled
    /// ones still running.
    pub fn end_window(&mut self, running: impl Fn(u32) -> bool) {
        self.rates.retain(|&tgid, _| running(tgid));
        self.unsampled.retain(|&tgid, _| running(tgid));
    }

    /// The lines the heap profile carries for Go processes whose runtime
    /// samples nothing (sorted by process).
    pub fn comments(&self) -> Vec<String> {
        let mut lines: Vec<(u32, &String)> = self.unsampled.iter().map(|(&p, l)| (p, l)).collect();
        lines.sort_unstable_by_key(|&(p, _)| p);
        lines.into_iter().map(|(_, l)| l.clone()).collect()
    }

    fn keep(&mut self, tgid: u32, rate: u64) {
        if self.rates.len() >= RATES_KEPT {
            self.rates.clear();
        }
        self.rates.insert(
            tgid,
            Reading {
                rate,
                at: Instant::now(),
            },
        );
    }

    /// Where process `tgid`'s executable keeps the rate (read once per
    /// executable).
    fn address_of(&mut self, tgid: u32) -> Option<RateAddress> {
        let exe = std::fs::metadata(format!("/proc/{tgid}/exe")).ok()?;
        if self.addresses.len() >= ADDRESSES_KEPT {
            self.addresses.clear();
        }
        *self
            .addresses
            .entry((exe.dev(), exe.ino()))
            .or_insert_with(|| rate_address(tgid))
    }
}

/// `runtime.MemProfileRate`'s address in process `tgid`'s executable:
/// from the symbol table, or in a stripped one from the runtime's code
/// (`go_code::mem_profile_rate`).
fn rate_address(tgid: u32) -> Option<RateAddress> {
    in_executable(tgid, |file| {
        let mut rate = None;
        let mut disabled = None;
        for symbol in file.symbols() {
            match symbol.name() {
                Ok("runtime.MemProfileRate") => rate = Some(symbol.address()),
                Ok("runtime.disableMemoryProfiling") => disabled = initial_byte(file, &symbol),
                _ => {}
            }
        }
        let rate = rate.or_else(|| go_code::mem_profile_rate(file, &Pclntab::of_file(file)?))?;
        Some(RateAddress {
            rate,
            first: first_segment(file)?,
            disabled: disabled.map(|byte| byte != 0),
        })
    })
}

/// The byte a data symbol starts with in the file (its value before the
/// program runs): None for one in a section without file data.
fn initial_byte<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    symbol: &object::Symbol<'d, '_, R>,
) -> Option<u8> {
    let section = file.section_by_index(symbol.section_index()?).ok()?;
    let offset = symbol.address().checked_sub(section.address())?;
    section
        .data()
        .ok()?
        .get(usize::try_from(offset).ok()?)
        .copied()
}

/// The word at the rate's address in process `tgid`.
fn rate_word_at(tgid: u32, address: RateAddress) -> Option<u64> {
    address.rate.checked_add(load_bias_of(tgid, address.first)?)
}

fn read_rate(tgid: u32, address: RateAddress) -> Option<u64> {
    let word = Memory::open(tgid)?.u64(rate_word_at(tgid, address)?)?;
    // An int: a negative rate is read as none.
    u64::try_from(word as i64).ok()
}

/// Sets process `tgid`'s `runtime.MemProfileRate` to `rate`, if it is
/// still 0: one aligned word, which the runtime reads at each allocation
/// (every `mcache` drew a sampling distance of 0 while the rate was 0, so
/// each samples its next allocation and draws a new distance then).
fn write_rate(tgid: u32, address: RateAddress, rate: u64) -> Result<(), String> {
    let at = rate_word_at(tgid, address).ok_or("the process's executable mapping is gone")?;
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{tgid}/mem"))
        .map_err(|e| format!("opening its memory: {e}"))?;
    let mut word = [0u8; 8];
    mem.read_exact_at(&mut word, at)
        .map_err(|e| format!("reading the rate: {e}"))?;
    if u64::from_le_bytes(word) != 0 {
        return Err("the rate changed meanwhile".into());
    }
    mem.write_all_at(&rate.to_le_bytes(), at)
        .map_err(|e| format!("writing the rate: {e}"))
}

/// The command name of process `tgid`, for log lines.
fn comm_of(tgid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{tgid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process whose rate was never read is rescaled by Go's default,
    /// counted; a kept reading outlives the process until the window
    /// after it.
    #[test]
    fn rates_outlive_their_process_until_the_window_ends() {
        let mut rates = GoHeapRates::new(true, GoSampling::Report, 4096);
        // No such process: nothing read, the default assumed and counted.
        let gone = u32::MAX - 7;
        assert_eq!(rates.for_window(gone), DEFAULT_MEM_PROFILE_RATE);
        assert_eq!(rates.stats.rates_assumed, 1);
        rates.keep(gone, 65_536);
        assert_eq!(rates.for_window(gone), 65_536);
        assert_eq!(rates.stats.rates_assumed, 1);
        rates.end_window(|_| false);
        assert_eq!(rates.for_window(gone), DEFAULT_MEM_PROFILE_RATE);
        assert_eq!(rates.stats.rates_assumed, 2);
    }

    #[test]
    fn checks_are_bounded_and_off_unless_watching() {
        let mut off = GoHeapRates::default();
        off.note(1, Duration::ZERO);
        assert!(off.pending.is_empty());
        let mut on = GoHeapRates::new(true, GoSampling::Report, 4096);
        for pid in 0..(PENDING_MAX as u32 + 3) {
            on.note(pid, Duration::from_secs(60));
        }
        assert_eq!(on.pending.len(), PENDING_MAX);
        assert_eq!(on.stats.checks_dropped, 3);
        // None is due yet.
        on.check_due();
        assert_eq!(on.pending.len(), PENDING_MAX);
    }
}
