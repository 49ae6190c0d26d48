//! Per-process metadata that symbolization needs: the process name and its
//! executable mappings, each with an open handle to the mapped file and the
//! file's build ID. It is snapshotted while the process lives, so that a
//! process that exits (or whose files are deleted) before the profile window
//! closes can still be symbolized. The table is bounded; handles and build IDs
//! are shared across processes by (device, inode). Each snapshot also keeps
//! the process's environment labels (container, pod, service; see
//! `environment`), resolved at first sight and at exec. Also here: every
//! process id in /proc (`all_pids`), for the session and the index page.

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// x86_64 page size: the loader maps each PT_LOAD from its page-aligned
/// file offset.
pub const PAGE_SIZE: u64 = 4096;

use procfs::ProcError;
use procfs::process::{MMPermissions, MMapPath, MemoryMap, MemoryMaps, Process};
use tracing::{debug, warn};

use crate::model::frames::Mapping;
use crate::procs::environment::Environment;
use crate::procs::objects::*;

/// Every process id in /proc.
pub(crate) fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Minimum time between two re-reads of one process's mappings.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// A snapshot taken right after exec sees only the executable and the
/// dynamic loader; libraries are mapped (or dlopened) moments later. Each
/// snapshot is re-read once after each of these delays while the process
/// lives, so that a short-lived process still has its libraries recorded.
const SETTLE_DELAYS: [Duration; 2] = [Duration::from_millis(20), Duration::from_millis(500)];
/// `PF_KTHREAD` in /proc/PID/stat flags.
const PF_KTHREAD: u32 = 0x0020_0000;
/// Bytes of the vDSO compared to tell whether a process maps our vDSO image.
pub(super) const ELF_HEADER_LEN: usize = 64;
/// Name given to executable memory that no file backs (JIT code), as perf does.
pub(crate) const ANON_NAME: &str = "//anon";
const DELETED_SUFFIX: &str = " (deleted)";

/// Why a process could not be snapshotted.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("process {0} is gone")]
    Gone(u32),
    #[error("reading /proc/{pid}: {source}")]
    Proc {
        pid: u32,
        #[source]
        source: ProcError,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn proc_error(pid: u32, err: ProcError) -> ProcessError {
    match err {
        ProcError::NotFound(_) => ProcessError::Gone(pid),
        ProcError::Io(e, _) if e.raw_os_error() == Some(libc::ESRCH) => ProcessError::Gone(pid),
        source => ProcessError::Proc { pid, source },
    }
}

/// Counters of the process table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessStats {
    /// Successful snapshots (first sight, exec, refresh).
    pub snapshots: u64,
    /// Snapshots that failed, almost always because the process was gone.
    pub failures: u64,
    /// Processes dropped because the table was full.
    pub evictions: u64,
    /// Re-reads of mappings after an address fell in no known mapping.
    pub refreshes: u64,
    /// Re-reads of mappings shortly after a snapshot (see `settle`).
    pub settles: u64,
    /// Objects that got no file handle because the handle budget was spent;
    /// they can be symbolized only while their process lives.
    pub handle_limit_hits: u64,
    /// Label lookup cache entries dropped because the cache was full.
    pub label_cache_drops: u64,
    /// Forked children gone before their mappings were read, symbolized
    /// with their parent's snapshot (they had not exec'd).
    pub inherited: u64,
    /// Fork records (child to parent) dropped because the table was full.
    pub fork_evictions: u64,
    /// Fork records dropped unused because the kernel did not name their
    /// parent at the process's first sight: they were of an earlier task
    /// under its id (a child gone unsampled, its id since reused), whose
    /// parent's mappings and name are not the process's.
    pub forks_unconfirmed: u64,
    /// Reads of a pid that was by then a thread of another process (its
    /// id reused by a thread): not taken for the process.
    pub not_processes: u64,
    /// Processes gone before their mappings were read, placed instead from
    /// the kernel's image anchors and files known by build ID.
    pub anchored: u64,
    /// Anchored files whose build ID matched no file the daemon holds.
    pub anchor_files_unknown: u64,
    /// Processes in the table now.
    pub processes: usize,
    /// File handles held now.
    pub open_handles: usize,
}

/// What is known about one process.
#[derive(Debug)]
pub struct ProcessInfo {
    pub tgid: u32,
    /// Process name from /proc/PID/comm.
    pub comm: String,
    /// Executable mappings sorted by start address.
    pub(super) mappings: Vec<MappedObject>,
    /// Environment labels (container, pod, service), only those known.
    pub(super) labels: Vec<(&'static str, String)>,
    /// Tick of the exit mark, if the process exited.
    pub(super) exited: Option<u64>,
    /// Tick of the last lookup; drives LRU eviction and pruning.
    pub(super) last_used: Cell<u64>,
    pub(super) snapshot_at: Instant,
    /// Where the mappings came from.
    pub(super) origin: Origin,
}

/// Where a snapshot's mappings came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// The process's own /proc/PID/maps.
    Read,
    /// A copy of the parent's snapshot, for a forked child gone before its
    /// own could be read.
    Parent,
    /// Placed from image anchors (see [`ProcessTable::anchor_image`]), for
    /// an image gone before its mappings could be read.
    Anchors,
}

impl ProcessInfo {
    /// The mapping that contains `addr`.
    pub fn find(&self, addr: u64) -> Option<&MappedObject> {
        let idx = self.mappings.partition_point(|m| m.mapping.start <= addr);
        let found = self.mappings.get(idx.checked_sub(1)?)?;
        (addr < found.mapping.limit).then_some(found)
    }

    /// All executable mappings, sorted by start address.
    pub fn mappings(&self) -> &[MappedObject] {
        &self.mappings
    }

    /// When this snapshot of the mappings was taken: a new snapshot of
    /// the same process has a later time.
    pub fn snapshot_at(&self) -> Instant {
        self.snapshot_at
    }

    /// Whether it has anonymous executable memory (JIT code).
    pub fn has_anonymous_code(&self) -> bool {
        self.mappings
            .iter()
            .any(|m| m.object.is_none() && m.mapping.path == ANON_NAME)
    }

    /// Whether the process was marked exited.
    pub fn is_exited(&self) -> bool {
        self.exited.is_some()
    }
}

/// Whether `new` still has every file mapping of `old` (libraries loaded
/// since, not another image). Anonymous code (JIT) comes and goes.
fn keeps_every_mapping(old: &[MappedObject], new: &[MappedObject]) -> bool {
    old.iter().filter(|o| o.object.is_some()).all(|o| {
        new.iter().any(|n| {
            let (a, b) = (&o.mapping, &n.mapping);
            (a.start, a.limit, a.file_offset, &a.path) == (b.start, b.limit, b.file_offset, &b.path)
        })
    })
}

/// Bounded table of process snapshots, keyed by tgid.
#[derive(Debug)]
pub struct ProcessTable {
    pub(super) max_processes: usize,
    /// A process's maps read already for its next snapshot
    /// ([`Self::offer_maps`]).
    offered_maps: Option<(u32, MemoryMaps)>,
    pub(super) procs: HashMap<u32, ProcessInfo>,
    pub(super) objects: OpenFiles,
    pub(super) vdso: Vdso,
    /// Logical clock for LRU order and "used since the last prune".
    pub(super) tick: Cell<u64>,
    pub(super) last_prune: u64,
    /// Snapshots waiting for their re-read, one queue per settle delay.
    pub(super) settling: [VecDeque<(Instant, u32)>; SETTLE_DELAYS.len()],
    /// Recent forks of known processes: child to (parent, when), oldest
    /// first in `fork_order`; bounded by `max_processes`.
    pub(super) forks: HashMap<u32, (u32, Instant)>,
    pub(super) fork_order: VecDeque<(u32, Instant)>,
    pub(super) environment: Environment,
    /// The image generation of each process that exec'd or whose pid was
    /// reused (absent: 0), with the kernel time its image started (0:
    /// unknown).
    pub(super) generations: HashMap<u32, (u32, u64)>,
    /// Snapshots of replaced images, by (tgid, generation), with the tick
    /// they were replaced at and the kernel time they started: samples
    /// taken before an exec are symbolized with them at the window's end.
    /// Pruned like exited processes.
    pub(super) retired: HashMap<(u32, u32), Retired>,
    /// The latest image start (kernel ns) each process's events told of:
    /// its first sight or its last exec. Pruned with the processes.
    pub(super) starts: HashMap<u32, u64>,
    pub(super) stats: ProcessStats,
}

/// A replaced image kept for the samples it ran.
#[derive(Debug)]
pub(super) struct Retired {
    pub(super) info: ProcessInfo,
    /// The tick it was replaced at.
    pub(super) replaced: u64,
    /// When it started (kernel ns; 0: unknown).
    pub(super) since_ns: u64,
}

/// How long a fork record may stand in for a child's own snapshot: the
/// child's first event follows its fork within a drain period or two; an
/// older record may name a pid that has since been reused.
pub(super) const FORK_RECORD_TTL: Duration = Duration::from_secs(5);

impl ProcessTable {
    /// A table of at most `max_processes` processes. The file-handle budget
    /// is a third of the soft RLIMIT_NOFILE at this moment (the rest is left
    /// to blazesym, which opens each file it reads once more, and to the
    /// daemon); raise the limit before calling this to keep more handles.
    pub fn new(max_processes: usize) -> Self {
        Self::with_handle_limit(max_processes, default_handle_limit())
    }

    /// Like [`ProcessTable::new`] with an explicit file-handle budget.
    pub fn with_handle_limit(max_processes: usize, max_handles: usize) -> Self {
        Self {
            max_processes: max_processes.max(1),
            offered_maps: None,
            procs: HashMap::new(),
            objects: OpenFiles {
                by_inode: HashMap::new(),
                by_build_id: HashMap::new(),
                open_handles: Arc::new(AtomicUsize::new(0)),
                max_handles,
                sweep_at: 1024,
            },
            vdso: Vdso::Unknown,
            tick: Cell::new(0),
            last_prune: 0,
            settling: Default::default(),
            forks: HashMap::new(),
            fork_order: VecDeque::new(),
            environment: Environment::from_env(),
            generations: HashMap::new(),
            retired: HashMap::new(),
            starts: HashMap::new(),
            stats: ProcessStats::default(),
        }
    }

    pub(super) fn bump(&self) -> u64 {
        let tick = self.tick.get() + 1;
        self.tick.set(tick);
        tick
    }

    /// Snapshot now: comm, executable mappings with build IDs and a handle to
    /// each mapped file. Replaces an older snapshot of the same pid (exec).
    /// Returns false if the process is gone (or cannot be read).
    pub fn snapshot(&mut self, tgid: u32) -> bool {
        self.settle();
        let taken = self.take_snapshot(tgid, 0, None);
        self.offered_maps = None;
        taken
    }

    /// Hands the next snapshot of `tgid` its maps, read already (by the
    /// uprobe links, which look at the same file a moment before): one
    /// read of /proc/PID/maps where there were two.
    pub fn offer_maps(&mut self, tgid: u32, maps: MemoryMaps) {
        self.offered_maps = Some((tgid, maps));
    }

    /// [`Self::snapshot`] at a process's first sight (its NEW event).
    /// `parent` is the process the kernel says forked it and whose image
    /// it still runs (0: none known). If it is gone already, a fork record
    /// of that same parent lets the parent's snapshot stand in for it. A
    /// record of another parent, or of none, is of an earlier task under
    /// the same id (a process gone unsampled, whose id was reused since):
    /// it is dropped, so that its parent's name and mappings are never
    /// given to the process.
    pub fn snapshot_new(&mut self, tgid: u32, parent: u32) -> bool {
        let confirmed = self.confirmed_fork(tgid, parent);
        if confirmed.is_none() && self.forks.remove(&tgid).is_some() {
            // The events come in order: no later task under the id has
            // been told of yet, so the record is of an earlier one.
            self.stats.forks_unconfirmed += 1;
        }
        self.settle();
        let taken = self.take_snapshot(tgid, 0, confirmed);
        self.offered_maps = None;
        taken
    }

    /// [`Self::ensure`] for a record (a wait, an off-CPU interval) that
    /// names `parent` as the process that forked `tgid` (0: none known),
    /// as the kernel knew it when it sent the record: a process gone
    /// before it is read takes its parent's snapshot as in
    /// [`Self::snapshot_new`]. A fork record that names another parent is
    /// kept: the record read may be of an earlier task under the id than
    /// the fork record.
    pub fn ensure_child(&mut self, tgid: u32, parent: u32) {
        self.settle();
        if !self.procs.contains_key(&tgid) {
            let confirmed = self.confirmed_fork(tgid, parent);
            self.take_snapshot(tgid, 0, confirmed);
        }
    }

    /// `parent`, if the kernel named it (not 0) and the fork record of
    /// `tgid` names it too.
    fn confirmed_fork(&self, tgid: u32, parent: u32) -> Option<u32> {
        let recorded = self.forks.get(&tgid).map(|&(recorded, _)| recorded);
        (parent != 0 && recorded == Some(parent)).then_some(parent)
    }

    /// Re-reads, once per settle delay, the mappings of processes
    /// snapshotted that long ago, while they live. Runs from `snapshot`,
    /// `ensure`, `refresh` and `prune`; call it also from the event loop
    /// (every few milliseconds) so that it runs when no events come.
    /// When the next snapshot is due for its re-read (see `settle`).
    pub fn next_settle_at(&self) -> Option<Instant> {
        SETTLE_DELAYS
            .iter()
            .zip(&self.settling)
            .filter_map(|(delay, queue)| queue.front().map(|&(at, _)| at + *delay))
            .min()
    }

    pub fn settle(&mut self) {
        for (stage, delay) in SETTLE_DELAYS.iter().enumerate() {
            while let Some(&(at, tgid)) = self.settling[stage].front() {
                if at.elapsed() < *delay {
                    break;
                }
                self.settling[stage].pop_front();
                // Skip it if the process exited or was re-read since.
                let due = self
                    .procs
                    .get(&tgid)
                    .is_some_and(|info| info.exited.is_none() && info.snapshot_at == at);
                if due {
                    self.stats.settles += 1;
                    self.take_snapshot(tgid, stage + 1, None);
                }
            }
        }
    }

    /// Reads the process and, if `settle_stage` names a settle delay, queues
    /// the re-read after it. A process gone before it is read takes the
    /// snapshot of `forked_by` (see [`Self::snapshot_new`]), if given.
    fn take_snapshot(&mut self, tgid: u32, settle_stage: usize, forked_by: Option<u32>) -> bool {
        match self.read_process(tgid) {
            Ok((comm, mappings)) => {
                let replaced = settle_stage > 0
                    && self
                        .procs
                        .get(&tgid)
                        .is_some_and(|info| !keeps_every_mapping(&info.mappings, &mappings));
                if replaced {
                    // Another image: an exec. Samples taken before it must
                    // keep the old snapshot. A settling re-read leaves it to
                    // the exec event, which reads those samples first; a
                    // refresh (at a window's end, every sample read) keeps
                    // the old snapshot under its generation, as the event
                    // would (it may have been lost).
                    if settle_stage < SETTLE_DELAYS.len() {
                        return false;
                    }
                    self.retire(tgid, 0);
                }
                self.stats.snapshots += 1;
                let tick = self.bump();
                let now = Instant::now();
                if let Some(queue) = self.settling.get_mut(settle_stage) {
                    if queue.len() >= self.max_processes {
                        queue.pop_front();
                    }
                    queue.push_back((now, tgid));
                }
                // Labels change only at exec (or pid reuse): not on re-reads.
                let labels = (settle_stage == 0 || !self.procs.contains_key(&tgid))
                    .then(|| self.read_labels(tgid));
                if let Some(info) = self.procs.get_mut(&tgid) {
                    info.comm = comm;
                    if let Some(labels) = labels {
                        info.labels = labels;
                    }
                    info.mappings = mappings;
                    // A live process under a known pid: exec, or pid reuse.
                    info.exited = None;
                    info.origin = Origin::Read;
                    info.last_used.set(tick);
                    info.snapshot_at = now;
                } else {
                    self.admit(ProcessInfo {
                        tgid,
                        comm,
                        mappings,
                        labels: labels.unwrap_or_default(),
                        exited: None,
                        last_used: Cell::new(tick),
                        snapshot_at: now,
                        origin: Origin::Read,
                    });
                }
                true
            }
            Err(err) => {
                self.stats.failures += 1;
                debug!(tgid, %err, "process snapshot failed");
                if matches!(err, ProcessError::Gone(_)) {
                    self.mark_exited(tgid);
                    if let Some(parent) = forked_by {
                        return self.inherit_from_parent(tgid, parent);
                    }
                }
                false
            }
        }
    }

    /// The generation of `tgid`'s current image: 0, then one more at each
    /// [`Self::replace`]. Samples carry it, so that those taken before an
    /// exec or a pid's reuse resolve against the image they ran.
    pub fn generation(&self, tgid: u32) -> u32 {
        self.generations.get(&tgid).map_or(0, |&(g, _)| g)
    }

    /// The generation of the image `tgid` ran at kernel time `time_ns`
    /// (CLOCK_MONOTONIC, as the kernel's records carry it). The records of
    /// a process and its exec event come through different rings, so a
    /// record taken just before an exec can be read after it, and one
    /// taken just after it before; the times tell them apart.
    pub fn generation_at(&self, tgid: u32, time_ns: u64) -> u32 {
        let Some(&(mut generation, mut since)) = self.generations.get(&tgid) else {
            return 0;
        };
        // Walk back over the images that started after the record. One
        // whose snapshot is gone (pruned) still names the right image: its
        // records are then left unsymbolized, never given another image's
        // frames.
        while time_ns < since && generation > 0 {
            generation -= 1;
            since = self
                .retired
                .get(&(tgid, generation))
                .map_or(0, |r| r.since_ns);
        }
        generation
    }

    /// The kernel told of an image of `tgid` that started at `since_ns`
    /// (its first sight or an exec).
    pub fn note_start(&mut self, tgid: u32, since_ns: u64) {
        if self.starts.len() >= 4 * self.max_processes && !self.starts.contains_key(&tgid) {
            self.forget_starts();
        }
        let start = self.starts.entry(tgid).or_default();
        *start = (*start).max(since_ns);
    }

    /// Whether the events read so far told of the image of `tgid` that the
    /// kernel says started at `since_ns` (0: unknown, taken as told). A
    /// sample is taken from the moment the exec's new name is set, some
    /// 100 us before the exec's event is sent; one read in between names
    /// an image not heard of yet. A process of no event (one lost to a
    /// full ring, or pruned) has nothing to wait for.
    pub fn knows_image(&self, tgid: u32, since_ns: u64) -> bool {
        since_ns == 0
            || self
                .starts
                .get(&tgid)
                .is_none_or(|&start| since_ns <= start)
    }

    /// Keeps the starts of the processes still held (live or replaced).
    fn forget_starts(&mut self) {
        let retired: HashSet<u32> = self.retired.keys().map(|&(tgid, _)| tgid).collect();
        let procs = &self.procs;
        self.starts
            .retain(|tgid, _| procs.contains_key(tgid) || retired.contains(tgid));
    }

    /// A new image under `tgid` (exec, or a new process reusing the pid),
    /// started at kernel time `since_ns` (0: unknown, then every record
    /// read from now on is taken as the new image's): the old snapshot is
    /// kept for the records taken before, under its generation, and the
    /// generation moves on. Snapshot the new image next.
    pub fn retire(&mut self, tgid: u32, since_ns: u64) {
        if let Some(old) = self.procs.remove(&tgid) {
            let (generation, old_since) = self.generations.get(&tgid).copied().unwrap_or((0, 0));
            if self.retired.len() >= self.max_processes
                && let Some(&oldest) = self
                    .retired
                    .iter()
                    .min_by_key(|(_, r)| r.replaced)
                    .map(|(key, _)| key)
            {
                self.retired.remove(&oldest);
                self.stats.evictions += 1;
            }
            let tick = self.bump();
            self.retired.insert(
                (tgid, generation),
                Retired {
                    info: old,
                    replaced: tick,
                    since_ns: old_since,
                },
            );
            self.generations
                .insert(tgid, (generation.wrapping_add(1), since_ns));
            if self.generations.len() > 4 * self.max_processes {
                // Only processes that exec'd are here; forget those gone.
                let procs = &self.procs;
                let retired = &self.retired;
                self.generations.retain(|tgid, (generation, _)| {
                    procs.contains_key(tgid)
                        || retired.contains_key(&(*tgid, generation.wrapping_sub(1)))
                });
            }
        }
    }

    /// The current snapshot of `tgid`, if any; not a use for eviction.
    pub fn peek(&self, tgid: u32) -> Option<&ProcessInfo> {
        self.procs.get(&tgid)
    }

    /// The snapshot of image `generation` of `tgid`: the current one (a use
    /// for eviction), or a replaced one kept for its samples.
    pub fn get_image(&self, tgid: u32, generation: u32) -> Option<&ProcessInfo> {
        if generation == self.generation(tgid) {
            self.get(tgid)
        } else {
            self.retired.get(&(tgid, generation)).map(|r| &r.info)
        }
    }

    /// The live processes (pid, generation) that have anonymous executable
    /// memory (JIT code), whose perf maps are worth reading while they
    /// live.
    pub fn live_with_anonymous_code(&self) -> Vec<(u32, u32)> {
        self.procs
            .iter()
            .filter(|(_, info)| !info.is_exited() && info.has_anonymous_code())
            .map(|(&tgid, _)| (tgid, self.generation(tgid)))
            .collect()
    }

    /// The live processes' current snapshots, with their generations.
    pub fn live_images(&self) -> impl Iterator<Item = (u32, u32, &ProcessInfo)> {
        self.procs
            .iter()
            .filter(|(_, info)| !info.is_exited())
            .map(|(&tgid, info)| (tgid, self.generation(tgid), info))
    }

    /// Snapshot if not known yet.
    pub fn ensure(&mut self, tgid: u32) {
        self.settle();
        if !self.procs.contains_key(&tgid) {
            self.snapshot(tgid);
        }
    }

    /// The snapshot of `tgid`; counts as a use for eviction and pruning.
    pub fn get(&self, tgid: u32) -> Option<&ProcessInfo> {
        let info = self.procs.get(&tgid)?;
        info.last_used.set(self.bump());
        Some(info)
    }

    /// Re-read the mappings of a live process, e.g. after a dlopen. At most
    /// once per second per process; unknown processes are snapshotted.
    /// Returns whether a new snapshot was taken.
    pub fn refresh(&mut self, tgid: u32) -> bool {
        self.settle();
        match self.procs.get(&tgid) {
            None => self.take_snapshot(tgid, 0, None),
            Some(info) if info.exited.is_some() => false,
            Some(info) if info.snapshot_at.elapsed() < REFRESH_INTERVAL => false,
            Some(_) => {
                self.stats.refreshes += 1;
                self.take_snapshot(tgid, SETTLE_DELAYS.len(), None)
            }
        }
    }

    /// Mark exited (from the exit event); kept until `prune`.
    pub fn mark_exited(&mut self, tgid: u32) {
        let tick = self.bump();
        if let Some(info) = self.procs.get_mut(&tgid) {
            info.exited.get_or_insert(tick);
        }
    }

    /// Drop exited processes not used since the last prune; call at each
    /// window end, after the window's stacks are symbolized. A process marked
    /// exited since the last prune is kept one more window, so samples that
    /// race its exit event are still symbolized.
    pub fn prune(&mut self) {
        self.settle();
        let last = self.last_prune;
        // An exit event can be lost (ring buffer full): find idle processes
        // that are gone, so they do not stay until evicted.
        let tick = self.bump();
        for info in self.procs.values_mut() {
            // A pid given to a thread since has a /proc entry too.
            if info.exited.is_none() && info.last_used.get() <= last && !is_process(info.tgid) {
                info.exited = Some(tick);
            }
        }
        self.procs.retain(|_, info| {
            let stale = info.exited.is_some_and(|t| t <= last) && info.last_used.get() <= last;
            !stale
        });
        // A replaced image is kept one window more, like an exited process.
        self.retired.retain(|_, r| r.replaced > last);
        self.forget_starts();
        self.objects.sweep();
        self.last_prune = self.bump();
    }

    /// The environment labels of `tgid` if known, then the node's; not a use
    /// for eviction.
    #[cfg(test)]
    pub fn environment_labels(&self, tgid: u32) -> impl Iterator<Item = (&'static str, &str)> {
        self.image_labels(tgid, self.generation(tgid))
    }

    /// As [`Self::environment_labels`], of image `generation` of `tgid`.
    pub fn image_labels(
        &self,
        tgid: u32,
        generation: u32,
    ) -> impl Iterator<Item = (&'static str, &str)> {
        let known = match generation == self.generation(tgid) {
            true => self.procs.get(&tgid),
            false => self.retired.get(&(tgid, generation)).map(|r| &r.info),
        }
        .map(|info| info.labels.as_slice());
        known
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .chain(self.environment.node().map(|node| ("node", node)))
    }

    /// Environment labels of a live process; none if its cgroups cannot be
    /// read (it may be gone already).
    fn read_labels(&mut self, tgid: u32) -> Vec<(&'static str, String)> {
        let cgroups = i32::try_from(tgid)
            .ok()
            .and_then(|pid| Process::new(pid).ok())
            .map(|proc| proc.cgroups());
        match cgroups {
            Some(Ok(cgroups)) => self.environment.labels(&cgroups.0),
            Some(Err(err)) => {
                debug!(tgid, %err, "cannot read the cgroups");
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    pub fn stats(&self) -> ProcessStats {
        ProcessStats {
            label_cache_drops: self.environment.cache_drops(),
            processes: self.procs.len(),
            open_handles: self.objects.open_handles.load(Ordering::Relaxed),
            ..self.stats
        }
    }

    /// Adds a process not in the table, making room first if it is full.
    pub(super) fn admit(&mut self, info: ProcessInfo) {
        if self.procs.len() >= self.max_processes {
            self.evict_one();
        }
        self.procs.insert(info.tgid, info);
    }

    /// Drops the process that exited first, else the least recently used.
    fn evict_one(&mut self) {
        let victim = self
            .procs
            .values()
            .filter_map(|info| info.exited.map(|t| (t, info.tgid)))
            .min()
            .or_else(|| {
                self.procs
                    .values()
                    .map(|info| (info.last_used.get(), info.tgid))
                    .min()
            });
        if let Some((_, tgid)) = victim {
            self.procs.remove(&tgid);
            self.stats.evictions += 1;
            debug!(tgid, "process table full, evicted");
        }
    }

    fn read_process(&mut self, tgid: u32) -> Result<(String, Vec<MappedObject>), ProcessError> {
        let pid = i32::try_from(tgid).map_err(|_| ProcessError::Gone(tgid))?;
        let proc = Process::new(pid).map_err(|e| proc_error(tgid, e))?;
        // /proc/ID opens for a thread's id too, with the thread's name and
        // its process's mappings: a pid read after its process exited and
        // the id went to a thread would give the process another's.
        // Bytes: the file starts with the task's name, which need not be
        // UTF-8.
        let mut status = Vec::new();
        proc.open_relative("status")
            .map_err(|e| proc_error(tgid, e))?
            .read_to_end(&mut status)
            .map_err(|e| proc_error(tgid, ProcError::Io(e, None)))?;
        if status_tgid(&String::from_utf8_lossy(&status)) != Some(tgid) {
            self.stats.not_processes += 1;
            return Err(ProcessError::Gone(tgid));
        }
        // Bytes, not a String: a process may name itself with anything
        // but NUL (invalid UTF-8, newlines), and must be profiled all the same.
        let mut comm = Vec::new();
        proc.open_relative("comm")
            .map_err(|e| proc_error(tgid, e))?
            .read_to_end(&mut comm)
            .map_err(|e| proc_error(tgid, ProcError::Io(e, None)))?;
        // The kernel ends the file with one newline of its own.
        let comm = crate::model::text::display_name(comm.strip_suffix(b"\n").unwrap_or(&comm));
        let maps = match self.offered_maps.take_if(|(pid, _)| *pid == tgid) {
            Some((_, maps)) => maps,
            None => proc.maps().map_err(|e| proc_error(tgid, e))?,
        };
        if maps.len() == 0 {
            // Only kernel threads have no mappings; a user process without
            // any is exiting (its memory is already released).
            let stat = proc.stat().map_err(|e| proc_error(tgid, e))?;
            if stat.flags & PF_KTHREAD == 0 {
                return Err(ProcessError::Gone(tgid));
            }
        }
        let mut mappings: Vec<MappedObject> = maps
            .iter()
            .filter(|map| map.perms.contains(MMPermissions::EXECUTE))
            .map(|map| self.mapped_object(&proc, tgid, map))
            .collect();
        mappings.sort_by_key(|m| m.mapping.start);
        Ok((comm, mappings))
    }

    fn mapped_object(&mut self, proc: &Process, tgid: u32, map: &MemoryMap) -> MappedObject {
        let (start, limit) = map.address;
        let (path, object) = match &map.pathname {
            MMapPath::Path(path) => {
                let shown = path.to_string_lossy();
                let (shown, deleted) = match shown.strip_suffix(DELETED_SUFFIX) {
                    Some(stripped) => (stripped.to_owned(), true),
                    None => (shown.into_owned(), false),
                };
                let object = (map.inode != 0)
                    .then(|| self.file_object(proc, tgid, map, Path::new(&shown), deleted))
                    .flatten();
                (shown, object)
            }
            MMapPath::Vdso => ("[vdso]".to_owned(), self.vdso_object(proc, start, limit)),
            MMapPath::Vsyscall => ("[vsyscall]".to_owned(), None),
            MMapPath::Other(name) => (format!("[{name}]"), None),
            _ => (ANON_NAME.to_owned(), None),
        };
        if let Some(object) = &object {
            self.objects.note_build_id(object, &path);
        }
        let mapping = Mapping {
            start,
            limit,
            file_offset: map.offset,
            path,
            build_id: object
                .as_ref()
                .and_then(|o| o.build_id.as_deref().map(str::to_owned)),
        };
        MappedObject {
            mapping: Arc::new(mapping),
            object,
        }
    }

    /// The object for a file-backed mapping: shared if already open, else a
    /// new handle through map_files (needs CAP_SYS_ADMIN; works for deleted
    /// files), else through the process's root (same mount namespace view).
    fn file_object(
        &mut self,
        proc: &Process,
        tgid: u32,
        map: &MemoryMap,
        path: &Path,
        deleted: bool,
    ) -> Option<Arc<ObjectFile>> {
        let (major, minor) = map.dev;
        let key = (((major as u64) << 32) | minor as u64, map.inode);
        if let Some(object) = self.objects.get(key) {
            return Some(object);
        }
        let relative = path.strip_prefix("/").unwrap_or(path);
        let Some(guard) = self.objects.reserve() else {
            self.stats.handle_limit_hits += 1;
            if deleted {
                return None;
            }
            // Readable only while the process lives; not shared for that reason.
            let live = PathBuf::from(format!("/proc/{tgid}/root")).join(relative);
            return Some(Arc::new(ObjectFile::new(
                ObjectSource::LivePath(live),
                None,
            )));
        };
        let (start, limit) = map.address;
        let file = match proc.open_relative(format!("map_files/{start:x}-{limit:x}")) {
            Ok(file) => Some(file),
            Err(err) if deleted => {
                debug!(tgid, path = %crate::model::text::escape_controls(&path.to_string_lossy()), %err, "cannot open deleted mapped file");
                None
            }
            Err(err) => {
                debug!(tgid, path = %crate::model::text::escape_controls(&path.to_string_lossy()), %err, "map_files failed, trying the process root");
                proc.open_relative(Path::new("root").join(relative))
                    .ok()
                    // The path may name a newer file than the one mapped.
                    .filter(|f| f.metadata().is_ok_and(|m| m.ino() == map.inode))
            }
        }?;
        let object = Arc::new(ObjectFile::new(ObjectSource::Handle(file), Some(guard)));
        self.objects.insert(key, &object);
        Some(object)
    }

    /// The daemon's own vDSO image, if `proc` maps the same one (the kernel
    /// has one image per ABI; a 32-bit process maps another).
    fn vdso_object(&mut self, proc: &Process, start: u64, limit: u64) -> Option<Arc<ObjectFile>> {
        if matches!(self.vdso, Vdso::Unknown) {
            self.vdso = match load_own_vdso() {
                Ok(vdso) => vdso,
                Err(err) => {
                    warn!(%err, "cannot copy the vDSO; its frames stay unsymbolized");
                    Vdso::Unavailable
                }
            };
        }
        let Vdso::Ready {
            object,
            header,
            len,
        } = &self.vdso
        else {
            return None;
        };
        if limit.checked_sub(start) != Some(*len) {
            return None;
        }
        let mut theirs = [0u8; ELF_HEADER_LEN];
        proc.open_relative("mem")
            .ok()?
            .read_exact_at(&mut theirs, start)
            .ok()?;
        (theirs[..] == header[..]).then(|| Arc::clone(object))
    }
}

/// Whether `id` is a live process (a thread group's leader), not a thread
/// of another process nor gone.
pub(crate) fn is_process(id: u32) -> bool {
    crate::model::text::read_proc_text(format!("/proc/{id}/status"))
        .ok()
        .and_then(|status| status_tgid(&status))
        .is_some_and(|tgid| tgid == id)
}

/// Process `tgid`'s /proc/PID/maps, parsed; None when it has gone.
pub(crate) fn read_maps(tgid: u32) -> Option<MemoryMaps> {
    Process::new(i32::try_from(tgid).ok()?).ok()?.maps().ok()
}

/// The `Tgid:` of a /proc/ID/status text: the process the task belongs to.
pub(crate) fn status_tgid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

pub(super) fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> ProcessError {
    move |source| ProcessError::Io {
        what: what.to_owned(),
        source,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use profiler_common::{ANCHOR_FRAMES, BUILD_ID_VALID, ImageAnchors};

    use super::*;
    use std::process::{Command, Stdio};

    fn code_addr(f: fn() -> u64) -> u64 {
        f as usize as u64
    }

    fn getpid_addr() -> u64 {
        let getpid: unsafe extern "C" fn() -> libc::pid_t = libc::getpid;
        getpid as usize as u64
    }

    #[inline(never)]
    fn marker_fn() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn table_can_move_between_threads() {
        fn assert_send<T: Send>() {}
        assert_send::<ProcessTable>();
    }

    #[test]
    fn snapshot_self() {
        let pid = std::process::id();
        let mut table = ProcessTable::new(16);
        assert!(table.snapshot(pid));
        let info = table.get(pid).expect("own snapshot");
        assert!(!info.comm.is_empty());
        let addr = code_addr(marker_fn);
        let found = info.find(addr).expect("own code is mapped");
        let exe = std::env::current_exe().unwrap();
        assert_eq!(Path::new(&found.mapping.path), exe);
        let object = found.object.as_ref().expect("handle to own executable");
        assert!(object.has_handle());
        assert!(found.mapping.build_id.is_some(), "{:?}", found.mapping);
        let libc_map = info.find(getpid_addr()).expect("libc is mapped");
        assert!(
            libc_map.mapping.path.contains("libc"),
            "{:?}",
            libc_map.mapping
        );
        assert_eq!(
            libc_map.mapping.build_id.as_ref().map(String::len),
            Some(40),
            "{:?}",
            libc_map.mapping
        );
        assert!(info.find(0).is_none());
        assert!(info.mappings().iter().any(|m| m.mapping.path == "[vdso]"));
        // A second snapshot shares the open files.
        let handles = table.stats().open_handles;
        assert!(table.snapshot(pid));
        assert_eq!(table.stats().open_handles, handles);
        assert_eq!(table.stats().snapshots, 2);
    }

    /// The pid of a process that has exited and been reaped.
    fn gone_pid() -> u32 {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn vanished_forked_child_takes_its_parents_snapshot_until_it_execs() {
        let pid = gone_pid();
        let me = std::process::id();
        let mut table = ProcessTable::new(8);
        assert!(table.snapshot(me));
        table.note_fork(pid, me);
        // Only at its first sight, which names its parent: a snapshot
        // taken for a record of it (its first sight was lost) does not
        // know which task under the id the record is of.
        assert!(!table.snapshot(pid));
        assert!(table.get(pid).is_none());
        assert!(
            table.snapshot_new(pid, me),
            "the parent's snapshot stands in"
        );
        let (mine, inherited) = (table.get(me).unwrap(), table.get(pid).unwrap());
        assert_eq!(inherited.mappings().len(), mine.mappings().len());
        assert!(inherited.is_exited());
        assert_eq!(table.stats().inherited, 1);
        // An exec: the parent's mappings no longer hold.
        table.forget_fork(pid);
        assert!(table.get(pid).is_none());
        assert!(!table.snapshot_new(pid, me));
        // Fork records are bounded; the oldest go first.
        for child in 0..20 {
            table.note_fork(1_000_000 + child, me);
        }
        assert_eq!(table.stats().fork_evictions, 12);
    }

    /// A thread's id recorded as a fork (as the kernel reported new
    /// threads once), the thread gone, and the id taken by a process whose
    /// fork was not seen and which is gone before it is read: the process
    /// must not take the name and mappings of the thread's process.
    #[test]
    fn a_fork_record_of_an_earlier_task_under_the_id_is_not_inherited() {
        let pid = gone_pid();
        let me = std::process::id();
        let mut table = ProcessTable::new(8);
        assert!(table.snapshot(me));
        table.note_fork(pid, me);
        // The new process's first sight names no parent: the kernel knows
        // of no fork of it by a known process.
        assert!(!table.snapshot_new(pid, 0));
        assert!(table.get(pid).is_none(), "inherited {:?}", table.get(pid));
        assert_eq!(table.stats().inherited, 0);
        assert_eq!(table.stats().forks_unconfirmed, 1);
        // The record is gone: nothing later under the id inherits it.
        assert!(!table.snapshot_new(pid, me));
        table.ensure(pid);
        assert!(table.get(pid).is_none());
        // Nor does a process forked by another known process than the
        // record's (its own fork event lost).
        table.note_fork(pid, me);
        assert!(!table.snapshot_new(pid, me.wrapping_add(1)));
        assert!(table.get(pid).is_none());
        assert_eq!(table.stats().forks_unconfirmed, 2);
        // The id reused as a process at once in the same batch of events:
        // an exit, and a first sight that names no parent, after the
        // record. The old process's snapshot is kept for its own samples;
        // the new one has none.
        table.note_fork(pid, me);
        assert!(table.snapshot_new(pid, me));
        table.mark_exited(pid);
        table.retire(pid, 1);
        assert!(!table.snapshot_new(pid, 0));
        assert!(table.get(pid).is_none());
        let my_comm = table.get(me).unwrap().comm.clone();
        assert_eq!(table.get_image(pid, 0).unwrap().comm, my_comm);
        assert_eq!(table.stats().inherited, 1);
        assert_eq!(table.stats().forks_unconfirmed, 3);
    }

    /// A wait or off-CPU record names the process that forked its task
    /// (0: none), as the kernel knew it when it sent the record: the
    /// parent's snapshot stands in for a child gone before it is read only
    /// when that parent is the fork record's. The record may be of an
    /// earlier task under the id than the fork record, which is kept.
    #[test]
    fn a_record_naming_the_forking_parent_inherits_and_no_other() {
        let pid = gone_pid();
        let me = std::process::id();
        let mut table = ProcessTable::new(8);
        assert!(table.snapshot(me));
        table.note_fork(pid, me);
        table.ensure_child(pid, 0);
        assert!(table.get(pid).is_none());
        table.ensure_child(pid, me.wrapping_add(1));
        assert!(table.get(pid).is_none());
        assert_eq!(table.stats().inherited, 0);
        assert_eq!(table.stats().forks_unconfirmed, 0);
        table.ensure_child(pid, me);
        assert!(table.get(pid).is_some_and(|p| p.is_exited()));
        assert_eq!(table.stats().inherited, 1);
        // No fork record: nothing to confirm.
        let other = gone_pid();
        table.ensure_child(other, me);
        assert!(table.get(other).is_none());
        assert_eq!(table.stats().inherited, 1);
    }

    /// A pid read after its id went to a thread: /proc/ID opens for a
    /// thread's id too, with the thread's name and its process's mappings,
    /// which are not the process's the id named.
    #[test]
    fn a_thread_id_is_not_read_as_a_process() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("not_a_process".into())
            .spawn(move || {
                // SAFETY: plain syscall.
                let tid = unsafe { libc::gettid() } as u32;
                tid_tx.send(tid).unwrap();
                let _ = stop_rx.recv();
            })
            .unwrap();
        let tid = tid_rx.recv().unwrap();
        let me = std::process::id();
        let mut table = ProcessTable::new(8);
        assert!(table.snapshot(me));
        assert!(!table.snapshot(tid));
        assert!(table.get(tid).is_none());
        assert_eq!(table.stats().not_processes, 1);
        assert!(!is_process(tid));
        assert!(is_process(me));
        stop_tx.send(()).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn status_gives_the_thread_group() {
        let status = "Name:\tp/a\\nb\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\nPid:\t4243\n";
        assert_eq!(status_tgid(status), Some(4242));
        assert_eq!(status_tgid("Name:\tx\n"), None);
    }

    #[test]
    fn vanished_image_is_placed_from_its_anchors() {
        use profiler_common::{BuildIdFrame, proc_event};
        let pid = gone_pid();
        let me = std::process::id();
        let mut table = ProcessTable::new(8);
        assert!(table.snapshot(me));
        // This test's own text, as a gone image running the same file
        // elsewhere would give it.
        let own = table
            .get(me)
            .unwrap()
            .mappings()
            .iter()
            .find(|m| m.object.as_ref().is_some_and(|o| o.build_id().is_some()))
            .cloned()
            .expect("a mapping with a build ID");
        let hex_id = own.object.as_ref().unwrap().build_id().unwrap().to_string();
        let mut build_id = [0u8; 20];
        for (i, byte) in build_id.iter_mut().enumerate().take(hex_id.len() / 2) {
            *byte = u8::from_str_radix(&hex_id[2 * i..2 * i + 2], 16).unwrap();
        }
        let shift = 0x10_0000_0000;
        let ip = own.mapping.start + 0x10 + shift;
        let offset = own.file_offset(ip - shift);
        let unplaced = BuildIdFrame {
            status: 2,
            build_id: [0; 20],
            offset: 0,
        };
        let mut frames = [unplaced; ANCHOR_FRAMES];
        frames[0] = BuildIdFrame {
            status: BUILD_ID_VALID,
            build_id,
            offset,
        };
        let mut anchors = ImageAnchors {
            kind: proc_event::ANCHORS,
            tgid: pid,
            len: 2,
            _pad: 0,
            time_ns: 0,
            ips: [ip, 0x1000, 0, 0, 0, 0, 0, 0],
            frames,
        };
        table.anchor_image(&anchors);
        let placed = table.get(pid).expect("placed from the anchors");
        assert!(placed.is_exited());
        assert_eq!(placed.mappings().len(), 1);
        let found = placed.find(ip).expect("the anchored frame's file");
        assert_eq!(found.file_offset(ip), offset);
        assert_eq!(
            found.object.as_ref().unwrap().id(),
            own.object.as_ref().unwrap().id()
        );
        assert_eq!(table.stats().anchored, 1);
        // A process read from /proc keeps its own mappings.
        anchors.tgid = me;
        let before = table.get(me).unwrap().mappings().len();
        table.anchor_image(&anchors);
        assert_eq!(table.get(me).unwrap().mappings().len(), before);
        // A build ID no held file has places nothing, and is counted.
        anchors.tgid = pid + 1_000_000;
        anchors.frames[0].build_id = [0xee; 20];
        table.anchor_image(&anchors);
        assert!(
            table
                .get(pid + 1_000_000)
                .is_none_or(|i| i.mappings().is_empty())
        );
        assert_eq!(table.stats().anchor_files_unknown, 1);
    }

    #[test]
    fn vanished_and_kernel_thread() {
        let pid = gone_pid();
        let mut table = ProcessTable::new(4);
        assert!(!table.snapshot(pid));
        assert!(!table.refresh(pid));
        assert!(table.get(pid).is_none());
        assert_eq!(table.stats().failures, 2);
        assert!(!table.snapshot(u32::MAX));
        // kthreadd: no mappings, but a process.
        assert!(table.snapshot(2));
        let info = table.get(2).unwrap();
        assert!(info.mappings().is_empty());
        assert_eq!(info.comm, "kthreadd");
    }

    #[test]
    fn eviction_prefers_exited_then_lru() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let other = child.id();
        let mut table = ProcessTable::new(2);
        let pid = std::process::id();
        assert!(table.snapshot(pid));
        assert!(table.snapshot(2));
        table.mark_exited(2);
        assert!(table.snapshot(other));
        assert!(table.get(2).is_none(), "the exited process goes first");
        assert_eq!(table.stats().evictions, 1);
        table.get(pid);
        assert!(table.snapshot(2));
        assert!(table.get(other).is_none(), "then the least recently used");
        assert!(table.get(pid).is_some());
        assert_eq!(table.stats().evictions, 2);
        assert_eq!(table.stats().processes, 2);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn prune_keeps_exited_process_one_window() {
        let mut table = ProcessTable::new(8);
        let pid = std::process::id();
        assert!(table.snapshot(pid));
        table.mark_exited(pid);
        table.prune();
        assert!(table.get(pid).is_some(), "used after exit: kept");
        table.prune();
        assert!(table.get(pid).is_some(), "used in the last window: kept");
        table.prune();
        table.prune();
        assert!(table.get(pid).is_none(), "unused for a window: dropped");
    }

    #[test]
    fn a_replaced_image_is_kept_for_its_samples() {
        let mut table = ProcessTable::new(8);
        let pid = std::process::id();
        assert!(table.snapshot(pid));
        assert_eq!(table.generation(pid), 0);
        let getpid = getpid_addr();
        let old_comm = table.get(pid).unwrap().comm.clone();
        // An exec: the old image is retired under generation 0, and the
        // new one (here the same process, read again) is generation 1.
        table.retire(pid, 0);
        assert_eq!(table.generation(pid), 1);
        assert!(table.get_image(pid, 1).is_none(), "not snapshotted yet");
        assert!(table.snapshot(pid));
        let old = table.get_image(pid, 0).expect("the retired image");
        assert_eq!(old.comm, old_comm);
        assert!(old.find(getpid).is_some());
        assert!(table.get_image(pid, 1).is_some());
        assert_eq!(
            table.image_labels(pid, 0).count(),
            table.image_labels(pid, 1).count()
        );
        // Kept through the window it was replaced in and the next.
        table.prune();
        assert!(table.get_image(pid, 0).is_some());
        table.prune();
        assert!(table.get_image(pid, 0).is_none());
        assert!(table.get_image(pid, 1).is_some());
    }

    #[test]
    fn a_record_keeps_the_image_that_ran_at_its_time() {
        let mut table = ProcessTable::new(8);
        let pid = std::process::id();
        assert!(table.snapshot(pid));
        assert_eq!(table.generation_at(pid, 5), 0);
        // Two execs, at kernel times 100 and 200.
        table.retire(pid, 100);
        assert!(table.snapshot(pid));
        table.retire(pid, 200);
        assert!(table.snapshot(pid));
        assert_eq!(table.generation(pid), 2);
        assert_eq!(table.generation_at(pid, 99), 0);
        assert_eq!(table.generation_at(pid, 100), 1);
        assert_eq!(table.generation_at(pid, 199), 1);
        assert_eq!(table.generation_at(pid, 200), 2);
        assert_eq!(table.generation_at(pid, u64::MAX), 2);
        // A replacement of unknown time (its event lost): every record
        // read from then on is the new image's.
        table.retire(pid, 0);
        assert_eq!(table.generation_at(pid, 150), 3);
        // Unknown processes have one image.
        assert_eq!(table.generation_at(u32::MAX, 1), 0);
    }

    #[test]
    fn an_image_is_known_once_its_event_is_read() {
        let mut table = ProcessTable::new(2);
        let pid = std::process::id();
        // No event of the process: nothing to wait for.
        assert!(table.knows_image(pid, 500));
        table.note_start(pid, 100);
        assert!(table.knows_image(pid, 100));
        assert!(table.knows_image(pid, 0), "0: the kernel knew of no start");
        // The kernel's exec at 300, its event not read yet.
        assert!(!table.knows_image(pid, 300));
        table.note_start(pid, 300);
        assert!(table.knows_image(pid, 300));
        assert!(table.knows_image(pid, 100), "the old image stays known");
        // An event older than the one read does not move the start back.
        table.note_start(pid, 200);
        assert!(!table.knows_image(pid, 301));
        assert!(table.knows_image(pid, 300));
        // Pruned with the processes: a start of a process not held goes.
        let gone = u32::MAX;
        table.note_start(gone, 100);
        assert!(!table.knows_image(gone, 200));
        assert!(table.snapshot(pid));
        table.prune();
        assert!(table.knows_image(gone, 200));
        assert!(
            !table.knows_image(pid, 301),
            "a held process keeps its start"
        );
        // Bounded: at four times the process limit, the unheld go first.
        for tgid in 1..=8 {
            table.note_start(u32::MAX - tgid, 100);
        }
        table.note_start(u32::MAX - 9, 100);
        assert!(table.starts.len() <= 8);
        assert!(!table.knows_image(pid, 301));
    }

    /// Waits until the process maps a file whose path contains `name`.
    pub(crate) fn wait_for_mapping(pid: u32, name: &str) {
        for _ in 0..400 {
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            if maps.contains(name) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("{pid} never mapped {name}");
    }

    #[test]
    fn settle_records_libraries_mapped_after_exec() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id();
        let mut table = ProcessTable::new(8);
        assert!(table.snapshot(pid));
        wait_for_mapping(pid, "libc.so");
        std::thread::sleep(SETTLE_DELAYS[0]);
        table.settle();
        assert_eq!(table.stats().settles, 1);
        child.kill().unwrap();
        child.wait().unwrap();
        let info = table.get(pid).unwrap();
        assert!(
            info.mappings()
                .iter()
                .any(|m| m.mapping.path.contains("libc.so")),
            "{:?}",
            info.mappings()
        );
        // The second re-read finds the process gone and marks it exited.
        std::thread::sleep(SETTLE_DELAYS[1]);
        table.settle();
        assert!(table.get(pid).unwrap().is_exited());
    }

    #[test]
    fn environment_labels_end_with_the_node() {
        let mut table = ProcessTable::new(4);
        let pid = std::process::id();
        let node = table.environment.node().map(str::to_owned);
        let want_node: Vec<_> = node.iter().map(|n| ("node", n.as_str())).collect();
        // Unknown process: the node's label only.
        assert_eq!(table.environment_labels(pid).collect::<Vec<_>>(), want_node);
        assert!(table.snapshot(pid));
        let labels: Vec<_> = table.environment_labels(pid).collect();
        assert!(labels.ends_with(&want_node), "{labels:?}");
        assert!(labels.iter().all(|(_, v)| !v.is_empty()), "{labels:?}");
    }

    #[test]
    fn refresh_is_rate_limited() {
        let mut table = ProcessTable::new(8);
        let pid = std::process::id();
        assert!(table.refresh(pid), "unknown: snapshot");
        assert!(!table.refresh(pid), "too soon");
        assert_eq!(table.stats().refreshes, 0);
    }

    #[test]
    fn deleted_executable_keeps_handle() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("sleep-copy");
        std::fs::copy("/bin/sleep", &copy).unwrap();
        // Another test thread forking right now may briefly hold the copy's
        // write descriptor, which makes exec fail with ETXTBSY: retry.
        let mut attempts = 0;
        let mut child = loop {
            match Command::new(&copy).arg("5").stdout(Stdio::null()).spawn() {
                Ok(child) => break child,
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 50 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("spawning the copy: {e}"),
            }
        };
        // Wait for the exec to replace the forked image.
        let mut exe_mapped = false;
        for _ in 0..200 {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
            if maps.contains("sleep-copy") {
                exe_mapped = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(exe_mapped);
        std::fs::remove_file(&copy).unwrap();
        let mut table = ProcessTable::new(8);
        assert!(table.snapshot(child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        let info = table.get(child.id()).unwrap();
        let exe = info
            .mappings()
            .iter()
            .find(|m| m.mapping.path.ends_with("sleep-copy"))
            .expect("the deleted file is listed without its suffix");
        let object = exe.object.as_ref().expect("a handle to the deleted file");
        assert!(object.has_handle());
        assert!(exe.mapping.build_id.is_some());
        assert!(std::fs::metadata(object.elf_path()).is_ok());
    }
}
