//! Sizes of the kernel maps and ring buffers (the `[limits]` table of the
//! config file): their defaults, validation, and the names of the maps they
//! size. The sizes are applied when the eBPF object is loaded (bpf/probes).
//!
//! Every map has a bound and a drop counter in the kernel; these settings
//! only move the bounds, for example to fit a small node's memory or, in
//! tests, to make the maps overflow on purpose.
//!
//! ```toml
//! [limits]
//! stack_samples_bytes = 8388608   # ring of user stack copies (power of two, >= 4096; default: from the rate)
//! heap_events_bytes = 16777216    # ring of sampled allocations and frees (default: 4 MiB per CPU)
//! wait_events_bytes = 16777216    # ring of block, mutex and off-CPU events (default: 8 MiB per CPU)
//! heap_live_entries = 2097152     # sampled allocations tracked as live (default: from the node's memory)
//! counts_entries = 16384          # distinct CPU sample keys per drain (default: from the rate)
//! stacks_entries = 16384          # distinct kernel-walked stacks per drain (default: from the rate)
//! walk_memo_entries = 4096        # remembered stack walks per generation (0: none)
//! memory_bytes = 67108864         # the daemon's caches: symbols, unwind tables, walks
//! ```

use serde::Deserialize;

/// Default bound of remembered walks per generation.
pub const DEFAULT_MAX_WALKS: usize = 4096;
/// Default budget of the daemon's user-space caches (stacks/budget.rs):
/// 64 MiB. The shipped unit and DaemonSet cap the daemon at 256 MiB; all
/// five profile types hold about 130 MiB at ready (BPF maps, rings mapped
/// twice, the binary), and the rest (process table, profiles being built,
/// files mapped for symbols) needs the remaining tens of MiB on a busy
/// node (docs/design/015-memory-budget.md).
pub const DEFAULT_MEMORY_BYTES: u64 = 64 << 20;
/// Bounds of `memory_bytes`: below 1 MiB a node's libc and executable
/// alone do not fit; above 1 TiB is a typo.
pub const MEMORY_BYTES_RANGE: (u64, u64) = (1 << 20, 1 << 40);

use profiler_common::{
    COUNTS_ENTRIES, HEAP_EVENTS_BYTES, HEAP_LIVE_ENTRIES, STACK_SAMPLES_BYTES, STACKS_ENTRIES,
    WAIT_EVENTS_BYTES,
};

/// Smallest ring buffer: the kernel wants a power-of-two number of pages.
pub const MIN_RING_BYTES: u32 = 4096;
/// Largest ring buffer accepted (1 GiB): more is a typo, not a setting.
pub const MAX_RING_BYTES: u32 = 1 << 30;
/// Largest number of entries accepted for a hash map.
pub const MAX_ENTRIES: u32 = 1 << 26;

/// Validated sizes of the kernel maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapLimits {
    /// Bytes of the `STACK_SAMPLES` ring (user stack copies for unwinding).
    pub stack_samples_bytes: u32,
    /// Bytes of the `HEAP_EVENTS` ring.
    pub heap_events_bytes: u32,
    /// Bytes of the `WAIT_EVENTS` ring.
    pub wait_events_bytes: u32,
    /// Entries of `HEAP_LIVE` (sampled allocations not yet freed).
    pub heap_live_entries: u32,
    /// Entries of each of `COUNTS_0` and `COUNTS_1`.
    pub counts_entries: u32,
    /// Entries of each of `STACKS_0` and `STACKS_1`.
    pub stacks_entries: u32,
    /// Stack walks the daemon remembers per generation (walk_memo.rs; 0
    /// turns the memo, and with it walk hints, off). Not a kernel map:
    /// the kernel's `WALK_HINTS` holds at most as many as the memo's
    /// current table, and its bound stays.
    pub walk_memo_entries: u32,
    /// Bytes the daemon's caches may hold in all (symbols, object
    /// layouts, parsed symbol files, unwind tables, process unwinders,
    /// the walk memo). Not a kernel map either.
    pub memory_bytes: u64,
    /// Runs of Go's park probes (`runtime.gopark`, `ready`) a second that
    /// one Go process may pay for (0: no limit). Above it the process's
    /// probes are attached for a window of each second and its waits
    /// weighted by the time they could be seen (`bpf::park_budget`). Not a
    /// kernel map.
    pub go_park_runs_per_second: u64,
    /// Which sizes were not set, and so follow the sampling rate and the
    /// CPU count ([`MapLimits::size_for_rate`]).
    pub derived: Derived,
}

/// The sizes left to [`MapLimits::size_for_rate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Derived {
    /// `counts_entries` and `stacks_entries`.
    pub sample_maps: bool,
    pub stack_samples: bool,
    pub heap_events: bool,
    pub wait_events: bool,
    /// `heap_live_entries` ([`MapLimits::size_for_memory`]).
    pub heap_live: bool,
}

impl Derived {
    const ALL: Derived = Derived {
        sample_maps: true,
        stack_samples: true,
        heap_events: true,
        wait_events: true,
        heap_live: true,
    };
}

/// Bounds of the derived `heap_live_entries`: the smallest (a small node,
/// or a coarse sampling rate) and the largest (the fixed default before;
/// more is for `[limits]`).
const DERIVED_HEAP_LIVE_ENTRIES: (u32, u32) = (1 << 16, HEAP_LIVE_ENTRIES);

/// Derived ring sizes, per online CPU (heap and wait events) and their
/// bounds. Each ring wakes the daemon when a quarter full and is read
/// every second anyway; the room per CPU is what a CPU's events fill in
/// well over a second at the rates measured (docs/BENCHMARKS.md,
/// "Footprint"): a sampled allocation is a 4 KiB or 16 KiB record, a kept
/// wait up to 8 KiB.
const HEAP_EVENTS_PER_CPU: u64 = 4 << 20;
const WAIT_EVENTS_PER_CPU: u64 = 8 << 20;
const DERIVED_RING_BYTES: (u32, u32) = (1 << 20, 64 << 20);

/// The power of two at or above `value`, within `low..=high`: how every
/// derived size is rounded.
fn power_of_two_within(value: u64, (low, high): (u32, u32)) -> u32 {
    let rounded = value.checked_next_power_of_two().unwrap_or(u64::MAX);
    u32::try_from(rounded).unwrap_or(high).clamp(low, high)
}

/// Go park-probe runs a second per process before its probes go on a
/// duty cycle: some 1.5 µs each on the development VM (a uprobe's trap
/// and the program), so at most some 1.5% of a core per process
/// (docs/BENCHMARKS.md, "Go's park probes on a budget").
const DEFAULT_GO_PARK_RUNS_PER_SECOND: u64 = 10_000;

/// Bounds of the derived sizes of the sample maps: the smallest (a quiet
/// node's 99 Hz on a few CPUs still gets room for bursts) and the largest
/// (what a fixed default held before; more is for `[limits]`).
const DERIVED_SAMPLE_MAP_ENTRIES: (u32, u32) = (1024, COUNTS_ENTRIES);

impl Default for MapLimits {
    fn default() -> Self {
        MapLimits {
            stack_samples_bytes: STACK_SAMPLES_BYTES,
            heap_events_bytes: HEAP_EVENTS_BYTES,
            wait_events_bytes: WAIT_EVENTS_BYTES,
            heap_live_entries: HEAP_LIVE_ENTRIES,
            counts_entries: COUNTS_ENTRIES,
            stacks_entries: STACKS_ENTRIES,
            walk_memo_entries: DEFAULT_MAX_WALKS as u32,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            go_park_runs_per_second: DEFAULT_GO_PARK_RUNS_PER_SECOND,
            derived: Derived::ALL,
        }
    }
}

impl MapLimits {
    /// Sizes what was not set for `frequency` samples per second on each
    /// of `cpus` CPUs:
    /// - the sample maps: the kernel fills one of each pair per drain
    ///   (every second), with at most one new key and stack per sample, so
    ///   twice a second's samples leaves room for a drain that comes late.
    ///   Their elements are allocated when they are created (per CPU for
    ///   the counts: 8 ms each at 16384 entries on 2 CPUs), so this is
    ///   start-up time and memory as well;
    /// - the stack-sample ring: half a second of samples, each with a full
    ///   stack copy (most are 4 KiB short records);
    /// - the heap and wait event rings: a share per CPU.
    ///
    /// Whatever fills is counted (`count_map_full`, `kernel_stacks_lost`,
    /// `stack_copies_dropped`, the events lost). Ring buffers are mapped
    /// twice in the daemon (the kernel maps a ring's pages back to back),
    /// so each byte here is two of resident memory.
    pub fn size_for_rate(&mut self, frequency: u64, cpus: usize) {
        let cpus = cpus.max(1) as u64;
        if self.derived.sample_maps {
            let per_drain = frequency.saturating_mul(cpus).saturating_mul(2);
            let entries = power_of_two_within(per_drain, DERIVED_SAMPLE_MAP_ENTRIES);
            self.counts_entries = entries;
            self.stacks_entries = entries;
        }
        let ring = |bytes: u64| power_of_two_within(bytes, DERIVED_RING_BYTES);
        if self.derived.stack_samples {
            let half_second = frequency
                .saturating_mul(cpus)
                .saturating_mul(profiler_common::STACK_COPY_BYTES as u64)
                / 2;
            self.stack_samples_bytes = ring(half_second);
        }
        if self.derived.heap_events {
            self.heap_events_bytes = ring(HEAP_EVENTS_PER_CPU.saturating_mul(cpus));
        }
        if self.derived.wait_events {
            self.wait_events_bytes = ring(WAIT_EVENTS_PER_CPU.saturating_mul(cpus));
        }
    }

    /// Sizes `heap_live_entries`, if it was not set, for allocations sampled
    /// every `sample_bytes` on average on a node of `memory_bytes`.
    ///
    /// A live allocation of s bytes is sampled with probability 1 -
    /// exp(-s / sample_bytes), which is at most s / sample_bytes, so the
    /// sampled allocations live at once number at most live bytes /
    /// sample_bytes in expectation, whatever the allocation sizes; twice
    /// the node's memory leaves room for the noise and for allocations
    /// larger than what is resident. The map's bucket table is allocated
    /// (and zeroed) when it is created, 16 bytes an entry: at the fixed
    /// 2 Mi entries that was 32 MiB of kernel memory and 30 ms of the
    /// start on any node (docs/BENCHMARKS.md, "Start-up: the loader").
    /// What does not fit is counted (`heap_live_full`).
    pub fn size_for_memory(&mut self, sample_bytes: u64, memory_bytes: u64) {
        if !self.derived.heap_live {
            return;
        }
        let live = memory_bytes.saturating_mul(2) / sample_bytes.max(1);
        self.heap_live_entries = power_of_two_within(live, DERIVED_HEAP_LIVE_ENTRIES);
    }

    /// (map name in the eBPF object, size) for every map these limits size.
    pub fn map_sizes(&self) -> [(&'static str, u32); 8] {
        [
            ("STACK_SAMPLES", self.stack_samples_bytes),
            ("HEAP_EVENTS", self.heap_events_bytes),
            ("WAIT_EVENTS", self.wait_events_bytes),
            ("HEAP_LIVE", self.heap_live_entries),
            ("COUNTS_0", self.counts_entries),
            ("COUNTS_1", self.counts_entries),
            ("STACKS_0", self.stacks_entries),
            ("STACKS_1", self.stacks_entries),
        ]
    }
}

/// The `[limits]` table as written; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsTable {
    stack_samples_bytes: Option<i64>,
    heap_events_bytes: Option<i64>,
    wait_events_bytes: Option<i64>,
    heap_live_entries: Option<i64>,
    counts_entries: Option<i64>,
    stacks_entries: Option<i64>,
    walk_memo_entries: Option<i64>,
    memory_bytes: Option<i64>,
    go_park_runs_per_second: Option<i64>,
}

/// A `[limits]` value out of range: the key, the value and what is expected.
#[derive(Debug, PartialEq, Eq)]
pub struct LimitError {
    pub key: &'static str,
    pub value: i64,
    pub expected: String,
}

impl LimitsTable {
    /// Checks every key and fills the missing ones with their defaults.
    pub fn validate(&self) -> Result<MapLimits, LimitError> {
        let d = MapLimits::default();
        Ok(MapLimits {
            stack_samples_bytes: ring("stack_samples_bytes", self.stack_samples_bytes)?
                .unwrap_or(d.stack_samples_bytes),
            heap_events_bytes: ring("heap_events_bytes", self.heap_events_bytes)?
                .unwrap_or(d.heap_events_bytes),
            wait_events_bytes: ring("wait_events_bytes", self.wait_events_bytes)?
                .unwrap_or(d.wait_events_bytes),
            heap_live_entries: entries("heap_live_entries", self.heap_live_entries)?
                .unwrap_or(d.heap_live_entries),
            counts_entries: entries("counts_entries", self.counts_entries)?
                .unwrap_or(d.counts_entries),
            stacks_entries: entries("stacks_entries", self.stacks_entries)?
                .unwrap_or(d.stacks_entries),
            derived: Derived {
                sample_maps: self.counts_entries.is_none() && self.stacks_entries.is_none(),
                stack_samples: self.stack_samples_bytes.is_none(),
                heap_events: self.heap_events_bytes.is_none(),
                wait_events: self.wait_events_bytes.is_none(),
                heap_live: self.heap_live_entries.is_none(),
            },
            walk_memo_entries: match self.walk_memo_entries {
                Some(0) => 0,
                other => entries("walk_memo_entries", other)?.unwrap_or(d.walk_memo_entries),
            },
            memory_bytes: memory("memory_bytes", self.memory_bytes)?.unwrap_or(d.memory_bytes),
            go_park_runs_per_second: match self.go_park_runs_per_second {
                None => d.go_park_runs_per_second,
                Some(v) => u64::try_from(v).map_err(|_| LimitError {
                    key: "go_park_runs_per_second",
                    value: v,
                    expected: "expected 0 (no limit) or a number of probe runs a second".into(),
                })?,
            },
        })
    }
}

/// A ring buffer size: a power of two from 4096 to 1 GiB (the kernel would
/// refuse anything else, or aya would round it silently).
fn ring(key: &'static str, value: Option<i64>) -> Result<Option<u32>, LimitError> {
    let Some(v) = value else { return Ok(None) };
    match u32::try_from(v) {
        Ok(n) if (MIN_RING_BYTES..=MAX_RING_BYTES).contains(&n) && n.is_power_of_two() => {
            Ok(Some(n))
        }
        _ => Err(LimitError {
            key,
            value: v,
            expected: format!(
                "expected a power of two number of bytes from {MIN_RING_BYTES} to {MAX_RING_BYTES}"
            ),
        }),
    }
}

/// A hash map size: 1 to [`MAX_ENTRIES`].
fn entries(key: &'static str, value: Option<i64>) -> Result<Option<u32>, LimitError> {
    let Some(v) = value else { return Ok(None) };
    match u32::try_from(v) {
        Ok(n) if (1..=MAX_ENTRIES).contains(&n) => Ok(Some(n)),
        _ => Err(LimitError {
            key,
            value: v,
            expected: format!("expected a number of entries from 1 to {MAX_ENTRIES}"),
        }),
    }
}

/// A memory budget in bytes, within [`MEMORY_BYTES_RANGE`].
fn memory(key: &'static str, value: Option<i64>) -> Result<Option<u64>, LimitError> {
    let Some(v) = value else { return Ok(None) };
    let (low, high) = MEMORY_BYTES_RANGE;
    match u64::try_from(v) {
        Ok(n) if (low..=high).contains(&n) => Ok(Some(n)),
        _ => Err(LimitError {
            key,
            value: v,
            expected: format!("expected a number of bytes from {low} to {high}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Result<LimitsTable, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn empty_table_gives_defaults() {
        let limits = table("").expect("parse").validate().expect("valid");
        assert_eq!(limits, MapLimits::default());
        assert_eq!(limits.stack_samples_bytes, STACK_SAMPLES_BYTES);
    }

    #[test]
    fn the_park_budget_may_be_off_not_negative() {
        let budget = |text: &str| {
            table(text)
                .expect("parse")
                .validate()
                .map(|l| l.go_park_runs_per_second)
        };
        assert_eq!(budget(""), Ok(DEFAULT_GO_PARK_RUNS_PER_SECOND));
        assert_eq!(budget("go_park_runs_per_second = 0"), Ok(0));
        assert_eq!(budget("go_park_runs_per_second = 500"), Ok(500));
        let err = budget("go_park_runs_per_second = -1").expect_err("negative");
        assert_eq!(err.key, "go_park_runs_per_second");
    }

    #[test]
    fn given_keys_replace_defaults() {
        let limits = table("stack_samples_bytes = 4096\ncounts_entries = 1\nheap_live_entries = 8")
            .expect("parse")
            .validate()
            .expect("valid");
        assert_eq!(limits.stack_samples_bytes, 4096);
        assert_eq!(limits.counts_entries, 1);
        assert_eq!(limits.heap_live_entries, 8);
        assert_eq!(limits.wait_events_bytes, WAIT_EVENTS_BYTES);
        // The memo may be off, not negative.
        let memo = |text: &str| table(text).expect("parse").validate();
        assert_eq!(
            memo("walk_memo_entries = 0").map(|l| l.walk_memo_entries),
            Ok(0)
        );
        assert_eq!(
            memo("walk_memo_entries = 3").map(|l| l.walk_memo_entries),
            Ok(3)
        );
        assert!(memo("walk_memo_entries = -1").is_err());
        assert_eq!(
            memo("memory_bytes = 4194304").map(|l| l.memory_bytes),
            Ok(4 << 20)
        );
        assert_eq!(limits.memory_bytes, DEFAULT_MEMORY_BYTES);
        for bad in [0, 4096, -1, 1 << 41] {
            let err = memo(&format!("memory_bytes = {bad}")).expect_err("out of range");
            assert_eq!((err.key, err.value), ("memory_bytes", bad));
        }
        let sizes = limits.map_sizes();
        assert!(sizes.contains(&("COUNTS_1", 1)), "{sizes:?}");
    }

    #[test]
    fn ring_sizes_must_be_powers_of_two_in_range() {
        for bad in [0, -1, 1000, 4095, 6000, 1 << 31, i64::MAX] {
            let err = table(&format!("heap_events_bytes = {bad}"))
                .expect("parse")
                .validate()
                .expect_err("out of range");
            assert_eq!((err.key, err.value), ("heap_events_bytes", bad));
            assert!(err.expected.contains("power of two"), "{}", err.expected);
        }
    }

    #[test]
    fn entries_must_be_positive_and_bounded() {
        for bad in [0, -5, i64::from(MAX_ENTRIES) + 1] {
            let err = table(&format!("stacks_entries = {bad}"))
                .expect("parse")
                .validate()
                .expect_err("out of range");
            assert_eq!(err.key, "stacks_entries");
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = table("ring_bytes = 4096").expect_err("unknown key");
        assert!(err.to_string().contains("ring_bytes"), "{err}");
    }

    #[test]
    fn sizes_follow_the_rate_and_cpus_unless_set() {
        let mut limits = MapLimits::default();
        limits.size_for_rate(99, 2);
        assert_eq!((limits.counts_entries, limits.stacks_entries), (1024, 1024));
        // 99 Hz x 2 CPUs x 16 KiB / 2 = 1.6 MB.
        assert_eq!(limits.stack_samples_bytes, 2 << 20);
        assert_eq!(limits.heap_events_bytes, 8 << 20);
        assert_eq!(limits.wait_events_bytes, 16 << 20);
        limits.size_for_rate(999, 16);
        assert_eq!(limits.counts_entries, 32768_u32.min(COUNTS_ENTRIES));
        assert_eq!(limits.stack_samples_bytes, 64 << 20);
        limits.size_for_rate(99, 1024);
        assert_eq!(limits.counts_entries, COUNTS_ENTRIES);
        assert_eq!(limits.wait_events_bytes, 64 << 20);
        let table: LimitsTable =
            toml::from_str("counts_entries = 8\nstack_samples_bytes = 4096").unwrap();
        let mut set = table.validate().unwrap();
        set.size_for_rate(99, 2);
        assert_eq!(set.counts_entries, 8);
        assert_eq!(set.stack_samples_bytes, 4096);
        assert_eq!(set.heap_events_bytes, 8 << 20, "unset keys still follow");
    }

    #[test]
    fn live_heap_entries_follow_the_nodes_memory_unless_set() {
        let mut limits = MapLimits::default();
        // 24 GiB at 512 KiB: 98,304 expected at most, twice over.
        limits.size_for_memory(512 << 10, 24 << 30);
        assert_eq!(limits.heap_live_entries, 131_072);
        limits.size_for_memory(512 << 10, 1 << 30);
        assert_eq!(limits.heap_live_entries, 65_536, "the floor");
        limits.size_for_memory(1, 24 << 30);
        assert_eq!(limits.heap_live_entries, HEAP_LIVE_ENTRIES, "the ceiling");
        limits.size_for_memory(0, 0);
        assert_eq!(limits.heap_live_entries, 65_536);
        let table: LimitsTable = toml::from_str("heap_live_entries = 8").unwrap();
        let mut set = table.validate().unwrap();
        set.size_for_memory(512 << 10, 24 << 30);
        assert_eq!(set.heap_live_entries, 8);
    }
}
