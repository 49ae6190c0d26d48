//! Kernel probes: loads the embedded eBPF object, sets its globals, attaches
//! its programs and owns its maps. Everything that touches the kernel's BPF
//! interface lives here; the rest of the daemon sees plain Rust values.
//!
//! Here: the load (globals of every program family, maps sized, programs
//! attached) and the handles it keeps. Beside it: the marks of processes
//! whose samples the Go and Python programs take (`runtime_marks.rs`), the
//! CPU buffers' drain and the kernel's counters and run-time statistics
//! (`drain.rs`), the target table (`targets.rs`), the loader made without
//! the kernel's BTF (`loader.rs`),
//! the small steps of loading (`load.rs`) and the errors (`error.rs`).
//! A little over the ~800 lines a file should hold: the load and the
//! handles it keeps are one state; the uprobe link sets and what is kept
//! per process beside them (park gates, allocator callers) are the next
//! part to go to a file of their own.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use aya::Btf;
use aya::Ebpf;
use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, ProgramArray};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{BtfTracePoint, PerfEvent, TracePoint};
use profiler_common::{
    FpProcess, GoLabels, LiveKey, PyRuntime, SampleKey, StackHash, WalkHint, WalkHintKey,
};

use crate::bpf::allocator_callers::{AllocatorCallers, CallerStats};
use crate::bpf::link_closer::LinkCloser;
use crate::bpf::log::KernelLog;
use crate::bpf::park_budget::{BudgetStats, ParkBudget, Step};
use crate::bpf::ring::Ring;
use crate::bpf::uprobes::{AttachMode, ExecMappings, LinkProgram, PreparedProgram, UprobeLinks};

mod drain;
mod error;
mod load;
mod loader;
mod runtime_marks;
mod targets;

pub use error::ProbeError;
use load::{
    UNUSED_MAP_ENTRIES, hash, load_perf_event, load_tail_program, map_limits, per_cpu_hash,
    raise_memlock_limit, ring, take_map, typed_map, uprobe_mode,
};
use loader::loader_without_kernel_btf;

use crate::bpf::tracefs::{
    ensure_tracefs, tracefs_root, tracepoint_field_offset, tracepoint_format_path,
};

/// A change to the kernel's table of stack tops (stacks/stack_tops.rs
/// decides them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopUpdate {
    /// Copies of thread `tid` stop at `top`.
    Set { tid: u32, top: u64 },
    /// Copies of thread `tid` read as far as they can again.
    Clear { tid: u32 },
    /// Thread `tid`'s copies take the long form (`DEEP_THREADS`).
    Deep { tid: u32 },
}

/// The eBPF object, built by build.rs from the `profiler-ebpf` crate.
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf.o"));

/// How the kernel side should behave.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// Sample only processes in the target set.
    pub filter_targets: bool,
    /// Children of targets become targets.
    pub follow_forks: bool,
    /// CPU-clock samples per second per CPU.
    pub cpu_frequency: u64,
    /// How user stacks are unwound (`profiler_common::unwind_mode`).
    pub unwind_mode: u8,
    /// Whether CPU samples are taken.
    pub cpu: bool,
    /// Heap probes with this mean sampling distance in bytes, if enabled.
    pub heap_sample_bytes: Option<u64>,
    /// Block profile on.
    pub block: bool,
    /// Off-CPU profile on.
    pub offcpu: bool,
    /// Rate of the block and off-CPU profiles (ns).
    pub wait_rate_ns: u64,
    /// Mutex profile keeping 1 in this many contended wake-ups, if enabled.
    pub mutex_fraction: Option<u64>,
    /// Sizes of the maps and rings (`[limits]`).
    pub limits: crate::config::limits::MapLimits,
    /// Which stack optimizations the kernel uses (`[debug]`).
    pub stack_switches: crate::config::stack_switches::StackSwitches,
    /// The programs log why they skip, drop, shorten or fall back
    /// (kernel_log.rs); without it their log sites are removed at load.
    pub kernel_log: bool,
    /// The kernel makes uprobe_multi links (features.rs): without them the
    /// Go park and condition-variable probes are perf-event uprobes.
    pub uprobe_multi: bool,
    /// The kernel makes uprobe sessions: without them the allocator probes
    /// are perf-event uprobes, with a return probe on every call.
    pub uprobe_session: bool,
    /// The futex_wait, futex_wake and futex_waitv system calls have
    /// tracepoints (Linux 6.7).
    pub futex2_tracepoints: bool,
    /// Maps held to fewer entries than the object gives them (a capture's
    /// own probes: sized for its processes, not the node's).
    pub map_caps: Vec<(&'static str, u32)>,
}

/// One buffer's worth of drained data.
#[derive(Default, Debug)]
pub struct Drained {
    /// Aggregated counts, summed over CPUs.
    pub counts: Vec<(SampleKey, u64)>,
    /// Stack hash -> instruction pointers, leaf first.
    pub stacks: std::collections::HashMap<StackHash, Vec<u64>>,
    /// Go label sets recorded since the last drain, by id.
    pub go_label_sets: Vec<(u64, GoLabels)>,
}

/// Loaded and attached probes with the maps the daemon reads.
pub struct Probes {
    ebpf: Ebpf,
    targets: HashMap<MapData, u32, u8>,
    /// A second descriptor of TARGETS (typed aya maps do not expose theirs).
    targets_fd: OwnedFd,
    control: Array<MapData, u32>,
    counters: PerCpuArray<MapData, u64>,
    /// Per-CPU hash maps SampleKey -> u64, drained in batches.
    counts: [MapData; 2],
    /// Hash maps StackHash -> Stack, drained in batches.
    stacks: [MapData; 2],
    /// Hash map id -> GoLabels, taken at every drain.
    go_label_sets: MapData,
    /// `cpu_sample`'s tail call to `go_sample`; the program is loaded (and
    /// put in slot 0) at the first Go process marked. Held open: the
    /// kernel empties a program array whose last descriptor closes.
    go_programs: ProgramArray<MapData>,
    /// Whether `go_sample` is loaded (or failed to, said once); set from
    /// the start when CPU samples are off, as only `cpu_sample` calls it.
    go_sample_tried: bool,
    /// Whether Go processes' labels are read (`[debug] go_labels`).
    go_labels: bool,
    /// `cpu_sample`'s tail call to `py_sample`, loaded at the first
    /// CPython process marked (as `go_programs`).
    py_programs: ProgramArray<MapData>,
    py_sample_tried: bool,
    /// CPython processes and where their interpreter keeps its frames.
    py_processes: HashMap<MapData, u32, PyRuntime>,
    possible_cpus: usize,
    proc_events: Option<Ring>,
    stack_samples: Option<Ring>,
    fp_processes: HashMap<MapData, u32, FpProcess>,
    active: u32,
    cpu_attached: bool,
    heap_events: Option<Ring>,
    wait_events: Option<Ring>,
    walk_hints: Option<HashMap<MapData, WalkHintKey, WalkHint>>,
    /// Where the kernel's copies of each thread's stack stop.
    stack_tops: HashMap<MapData, u32, u64>,
    /// Threads whose copies take the long form.
    deep_threads: HashMap<MapData, u32, u8>,
    heap_live: HashMap<MapData, LiveKey, u64>,
    /// The heap probes' program and links (when heap profiles are on).
    allocators: Option<UprobeLinks>,
    /// The allocator functions of processes with two allocators (likewise).
    allocator_callers: Option<AllocatorCallers>,
    /// The Go runtime's heap probes (likewise).
    go_heap: Option<UprobeLinks>,
    /// The Go park probes' program and links (when block profiles are on).
    go_parks: Option<UprobeLinks>,
    /// Their duty cycles, for processes above the budget (likewise).
    park_budget: Option<ParkBudget>,
    /// The condition variable probes' program and links (likewise).
    cond_parks: Option<UprobeLinks>,
    /// Closes the uprobe links that are let go.
    closer: Arc<LinkCloser>,
    /// The reader of the programs' diagnostics, when they are on.
    kernel_log: Option<KernelLog>,
}

impl Probes {
    /// Loads the object and attaches every program. The probes are live
    /// when this returns.
    pub fn load(config: &ProbeConfig) -> Result<Self, ProbeError> {
        raise_memlock_limit();
        ensure_tracefs()?;
        let new_task_pid = tracepoint_field_offset("task", "task_newtask", "pid")?;
        let new_task_flags = tracepoint_field_offset("task", "task_newtask", "clone_flags")?;
        let filter = u8::from(config.filter_targets);
        let follow = u8::from(config.follow_forks);
        let heap_bytes = config.heap_sample_bytes.unwrap_or(0);
        // Heap and Go park probes (block and mutex profiles) look for files
        // to probe in new programs.
        let report_execs = u8::from(
            config.heap_sample_bytes.is_some() || config.block || config.mutex_fraction.is_some(),
        );
        let self_tgid = std::process::id();
        let futex_on = config.block || config.mutex_fraction.is_some();
        let (uaddr_offset, ret_offset) = if futex_on {
            let uaddr = tracepoint_field_offset("syscalls", "sys_enter_futex", "uaddr")?;
            let op = tracepoint_field_offset("syscalls", "sys_enter_futex", "op")?;
            // The kernel side reads both in one go.
            if op != uaddr + 8 {
                return Err(ProbeError::FutexLayout {
                    path: tracepoint_format_path("syscalls", "sys_enter_futex"),
                    uaddr,
                    op,
                });
            }
            (
                uaddr,
                tracepoint_field_offset("syscalls", "sys_exit_futex", "ret")?,
            )
        } else {
            (16, 16)
        };
        let block_on = u8::from(config.block);
        let block_rate = config.wait_rate_ns;
        let offcpu_on = u8::from(config.offcpu);
        let mutex_on = u8::from(config.mutex_fraction.is_some());
        let mutex_fraction = config.mutex_fraction.unwrap_or(1);
        let switches = config.stack_switches;
        let brief_records = u8::from(switches.brief_records);
        let short_records = u8::from(switches.short_records && switches.stack_tops);
        let stack_tops = u8::from(switches.stack_tops);
        let long_records = u8::from(switches.long_records);
        let go_labels_one_read = u8::from(switches.go_labels_one_read);
        let go_label_map_cache = u8::from(switches.go_label_map_cache);
        let time_go_labels = u8::from(switches.time_go_labels);
        // Off, both are 0, and the verifier drops every log site.
        let kernel_log = u8::from(config.kernel_log);
        let log_level = match config.kernel_log {
            true => aya_log::Level::Trace as u8,
            false => 0,
        };
        let waits_on = futex_on || config.offcpu;
        let limits = map_limits(config, waits_on);
        // The programs read kernel structures at offsets from tracefs, not
        // by CO-RE relocation, so the kernel's BTF is not needed to load
        // them; the off-CPU program's tp_btf attach reads it itself.
        let mut loader = loader_without_kernel_btf();
        loader.btf(None);
        // FUTEX_CALLS is task-local storage, which aya creates but does not
        // wrap; only the kernel reads and writes it.
        loader.allow_unsupported_maps();
        for (name, size) in limits.map_sizes() {
            loader.map_max_entries(name, size);
        }
        for &(name, size) in &config.map_caps {
            loader.map_max_entries(name, size);
        }
        // Preallocated maps of profile types that are off: nothing uses
        // them, and their elements are allocated when they are created.
        for (name, on) in [
            ("HEAP_THREADS", config.heap_sample_bytes.is_some()),
            ("FUTEX_WAKERS", config.mutex_fraction.is_some()),
            // Parks are remembered for the mutex profile's releases too.
            ("GO_PARKED", config.block || config.mutex_fraction.is_some()),
            (
                "GO_PARK_GATES",
                config.block || config.mutex_fraction.is_some(),
            ),
            (
                "GO_SEMA_CALLS",
                config.block || config.mutex_fraction.is_some(),
            ),
            // Only the mutex profile follows semaphores' queues.
            ("GO_SEMA_ROOTS", config.mutex_fraction.is_some()),
            ("GO_FREEING", config.heap_sample_bytes.is_some()),
            ("WALK_HINTS", waits_on),
        ] {
            if !on {
                loader.map_max_entries(name, UNUSED_MAP_ENTRIES);
            }
        }
        let mut ebpf = loader
            .override_global("FILTER_TARGETS", &filter, true)
            .override_global("FOLLOW_FORKS", &follow, true)
            .override_global("NEW_TASK_PID_OFFSET", &new_task_pid, true)
            .override_global("NEW_TASK_FLAGS_OFFSET", &new_task_flags, true)
            .override_global("UNWIND_MODE", &config.unwind_mode, true)
            .override_global("HEAP_SAMPLE_BYTES", &heap_bytes, true)
            .override_global("SELF_TGID", &self_tgid, true)
            .override_global("REPORT_PROCESS_EVENTS", &report_execs, true)
            .override_global("BLOCK_ON", &block_on, true)
            .override_global("BLOCK_RATE_NS", &block_rate, true)
            .override_global("OFFCPU_ON", &offcpu_on, true)
            .override_global("MUTEX_ON", &mutex_on, true)
            .override_global("MUTEX_FRACTION", &mutex_fraction, true)
            .override_global("FUTEX_UADDR_OFFSET", &uaddr_offset, true)
            .override_global("SYSCALL_RET_OFFSET", &ret_offset, true)
            .override_global("STACK_SAMPLES_RING", &limits.stack_samples_bytes, true)
            .override_global("HEAP_EVENTS_RING", &limits.heap_events_bytes, true)
            .override_global("WAIT_EVENTS_RING", &limits.wait_events_bytes, true)
            .override_global("BRIEF_RECORDS", &brief_records, true)
            .override_global("SHORT_RECORDS", &short_records, true)
            .override_global("USE_STACK_TOPS", &stack_tops, true)
            .override_global("LONG_RECORDS", &long_records, true)
            .override_global("GO_LABELS_ONE_READ", &go_labels_one_read, true)
            .override_global("GO_LABEL_MAP_CACHE", &go_label_map_cache, true)
            .override_global("TIME_GO_LABELS", &time_go_labels, true)
            .override_global("KERNEL_LOG", &kernel_log, true)
            .override_global(aya_log::LEVEL, &log_level, true)
            .load(EBPF_OBJECT)
            .map_err(ProbeError::Load)?;
        // Before any map is taken out of `ebpf`: the program refers to them.
        let closer = LinkCloser::new();
        let allocators = match config.heap_sample_bytes {
            Some(_) => Some(UprobeLinks::new(
                LinkProgram::Loaded(
                    PreparedProgram::prepare(
                        EBPF_OBJECT,
                        &ebpf,
                        "heap_probe",
                        uprobe_mode(config.uprobe_session, AttachMode::Session)?,
                        |function| function != profiler_common::alloc_fn::FREE,
                    )?
                    .load()?,
                ),
                (
                    "allocator",
                    crate::bpf::attach::allocators::find,
                    &profiler_common::alloc_fn::NAMES,
                ),
                config.filter_targets,
                Arc::clone(&closer),
            )),
            None => None,
        };
        // System-wide, Go's programs are verified at the first Go
        // executable found, not at the start (design 020): a node without
        // Go never pays for them. Under --pid or a command, whose
        // processes are probed from their exec, at once, as the condition
        // variables' always are.
        let defer_go = !config.filter_targets;
        let entry_only = |program, what, find, names, deferred: bool| -> Result<_, ProbeError> {
            let prepared = PreparedProgram::prepare(
                EBPF_OBJECT,
                &ebpf,
                program,
                uprobe_mode(config.uprobe_multi, AttachMode::Multi)?,
                |_| false,
            )?;
            let program = match deferred {
                true => LinkProgram::AtFirstFile(prepared),
                false => LinkProgram::Loaded(prepared.load()?),
            };
            Ok(UprobeLinks::new(
                program,
                (what, find, names),
                config.filter_targets,
                Arc::clone(&closer),
            ))
        };
        let go_heap = match config.heap_sample_bytes {
            Some(_) => Some(entry_only(
                "go_heap_probe",
                "Go heap",
                match config.stack_switches.go_special_kinds {
                    true => crate::bpf::attach::go_heap::find,
                    false => crate::bpf::attach::go_heap::find_without_kinds,
                },
                &profiler_common::go_heap_fn::NAMES,
                defer_go,
            )?),
            None => None,
        };
        let go_parks = match config.block || config.mutex_fraction.is_some() {
            true => Some(entry_only(
                "go_park_probe",
                "Go runtime",
                crate::bpf::attach::go_park::find,
                &profiler_common::go_fn::NAMES,
                defer_go,
            )?),
            false => None,
        };
        let cond_parks = match config.block {
            true => Some(entry_only(
                "cond_wait_probe",
                "condition variable",
                crate::bpf::attach::cond_park::find,
                &profiler_common::cond_fn::NAMES,
                false,
            )?),
            false => None,
        };
        // After the uprobe programs, which refer to the log ring.
        let kernel_log = match config.kernel_log {
            true => Some(KernelLog::take(&mut ebpf).map_err(ProbeError::KernelLog)?),
            false => None,
        };

        let targets = hash(take_map(&mut ebpf, "TARGETS")?, "TARGETS")?;
        let targets_fd = targets
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(ProbeError::Dup)?;
        let targets =
            HashMap::try_from(Map::HashMap(targets)).map_err(|source| ProbeError::Map {
                name: "TARGETS",
                source,
            })?;
        let control = typed_map(&mut ebpf, "CONTROL")?;
        let counters = typed_map(&mut ebpf, "COUNTERS")?;
        let counts = [
            per_cpu_hash(take_map(&mut ebpf, "COUNTS_0")?, "COUNTS_0")?,
            per_cpu_hash(take_map(&mut ebpf, "COUNTS_1")?, "COUNTS_1")?,
        ];
        let stacks = [
            hash(take_map(&mut ebpf, "STACKS_0")?, "STACKS_0")?,
            hash(take_map(&mut ebpf, "STACKS_1")?, "STACKS_1")?,
        ];
        let go_label_sets = hash(take_map(&mut ebpf, "GO_LABEL_SETS")?, "GO_LABEL_SETS")?;
        let go_programs = typed_map(&mut ebpf, "GO_PROGRAMS")?;
        let py_programs = typed_map(&mut ebpf, "PY_PROGRAMS")?;
        let py_processes = typed_map(&mut ebpf, "PY_PROCESSES")?;
        let possible_cpus =
            aya::util::nr_cpus().map_err(|(path, e)| ProbeError::Cpus { path, source: e })?;
        let twice = !switches.rings_mapped_once;
        let proc_events = ring(&mut ebpf, "PROC_EVENTS", twice)?;
        let stack_samples = ring(&mut ebpf, "STACK_SAMPLES", twice)?;
        let fp_processes = typed_map(&mut ebpf, "FP_PROCESSES")?;
        let heap_events = ring(&mut ebpf, "HEAP_EVENTS", twice)?;
        let wait_events = ring(&mut ebpf, "WAIT_EVENTS", twice)?;
        let walk_hints = typed_map(&mut ebpf, "WALK_HINTS")?;
        let stack_tops = typed_map(&mut ebpf, "STACK_TOPS")?;
        let deep_threads = typed_map(&mut ebpf, "DEEP_THREADS")?;
        let heap_live = typed_map(&mut ebpf, "HEAP_LIVE")?;
        let allocator_callers = match allocators {
            Some(_) => Some(AllocatorCallers::new(
                typed_map(&mut ebpf, "ALLOC_CALLERS")?,
                typed_map(&mut ebpf, "ALLOC_CALLERS_ON")?,
            )),
            None => None,
        };
        let park_budget = match go_parks {
            Some(_) => Some(ParkBudget::new(
                typed_map(&mut ebpf, "GO_PARK_GATES")?,
                // Waits that outlast their window are followed for the
                // block profile only (the mutex profile's are charged at
                // their release, which a detached probe cannot see).
                match config.block {
                    true => Some(typed_map(&mut ebpf, "GO_PARKED")?),
                    false => None,
                },
                config.limits.go_park_runs_per_second,
            )),
            None => None,
        };
        let mut probes = Probes {
            ebpf,
            targets,
            targets_fd,
            control,
            counters,
            counts,
            stacks,
            go_label_sets,
            go_programs,
            // Its verification (15 ms here, seconds on Linux 6.1 under
            // emulation, during which the wait rings were not read) is paid
            // only where it is used.
            go_sample_tried: !config.cpu,
            go_labels: config.stack_switches.go_labels,
            py_programs,
            py_sample_tried: !config.cpu,
            py_processes,
            possible_cpus,
            proc_events: Some(proc_events),
            stack_samples: Some(stack_samples),
            fp_processes,
            active: 0,
            cpu_attached: false,
            heap_events: Some(heap_events),
            wait_events: Some(wait_events),
            walk_hints: Some(walk_hints),
            stack_tops,
            deep_threads,
            heap_live,
            allocators,
            allocator_callers,
            go_heap,
            go_parks,
            park_budget,
            cond_parks,
            closer,
            kernel_log,
        };
        // New tasks from task_newtask rather than sched_process_fork: its
        // record has the clone flags, which tell a new thread (never to be
        // taken for a process) from a new process.
        probes.attach_tracepoint("task_newtask", &[("task", "task_newtask")])?;
        for name in ["sched_process_exec", "sched_process_exit"] {
            probes.attach_tracepoint(name, &[("sched", name)])?;
        }
        // Where an exec gives the thread its new name, which records from
        // then on show (sched_prepare_exec is Linux 6.10+): without them,
        // records are told apart at the exec's end, ~100 us later.
        let tracefs = Path::new(tracefs_root());
        if tracefs.join("events/sched/sched_prepare_exec").is_dir() {
            probes.attach_tracepoint("sched_prepare_exec", &[("sched", "sched_prepare_exec")])?;
            if tracefs.join("events/task/task_rename").is_dir() {
                probes.attach_tracepoint("task_rename", &[("task", "task_rename")])?;
            }
        }
        if config.offcpu {
            probes.attach_btf_tracepoint("sched_switch", "sched_switch")?;
        }
        if futex_on {
            probes.attach_tracepoint("futex_enter", &[("syscalls", "sys_enter_futex")])?;
            // futex_waitv is Linux 5.16, futex_wait and futex_wake 6.7:
            // older kernels have no waits through them to miss.
            if config.futex2_tracepoints {
                probes.attach_tracepoint(
                    "futex_wait_enter",
                    &[
                        ("syscalls", "sys_enter_futex_wait"),
                        ("syscalls", "sys_enter_futex_waitv"),
                    ],
                )?;
                probes.attach_tracepoint(
                    "futex_wake_enter",
                    &[("syscalls", "sys_enter_futex_wake")],
                )?;
            } else if tracefs
                .join("events/syscalls/sys_enter_futex_waitv")
                .is_dir()
            {
                probes.attach_tracepoint(
                    "futex_wait_enter",
                    &[("syscalls", "sys_enter_futex_waitv")],
                )?;
            }
            probes.attach_tracepoint(
                "futex_exit",
                &[
                    ("syscalls", "sys_exit_futex"),
                    ("syscalls", "sys_exit_futex_wait"),
                    ("syscalls", "sys_exit_futex_waitv"),
                    ("syscalls", "sys_exit_futex_wake"),
                ],
            )?;
        }
        if config.cpu {
            probes.attach_cpu(config.cpu_frequency)?;
        }
        Ok(probes)
    }

    /// Loads tracepoint program `name` and attaches it to each tracepoint
    /// of `points` that this kernel has (the first must exist; newer
    /// system calls such as futex_waitv may not).
    /// Loads and attaches a BTF tracepoint program (tp_btf), typed against
    /// the running kernel's BTF.
    fn attach_btf_tracepoint(&mut self, name: &'static str, point: &str) -> Result<(), ProbeError> {
        let btf = Btf::from_sys_fs().map_err(ProbeError::KernelBtf)?;
        let program: &mut BtfTracePoint = self
            .ebpf
            .program_mut(name)
            .ok_or(ProbeError::MissingProgram(name))?
            .try_into()
            .map_err(|source| ProbeError::Program { name, source })?;
        program
            .load(point, &btf)
            .map_err(|source| ProbeError::Program { name, source })?;
        program
            .attach()
            .map_err(|source| ProbeError::Program { name, source })?;
        Ok(())
    }

    fn attach_tracepoint(
        &mut self,
        name: &'static str,
        points: &[(&str, &str)],
    ) -> Result<(), ProbeError> {
        let program: &mut TracePoint = self
            .ebpf
            .program_mut(name)
            .ok_or(ProbeError::MissingProgram(name))?
            .try_into()
            .map_err(|source| ProbeError::Program { name, source })?;
        program
            .load()
            .map_err(|source| ProbeError::Program { name, source })?;
        for (i, (category, point)) in points.iter().enumerate() {
            let exists = Path::new(tracefs_root())
                .join("events")
                .join(category)
                .join(point)
                .is_dir();
            if i > 0 && !exists {
                tracing::debug!("tracepoint {category}:{point} does not exist here");
                continue;
            }
            program
                .attach(category, point)
                .map_err(|source| ProbeError::Program { name, source })?;
        }
        Ok(())
    }

    fn attach_cpu(&mut self, frequency: u64) -> Result<(), ProbeError> {
        const NAME: &str = "cpu_sample";
        let cpus =
            aya::util::online_cpus().map_err(|(path, e)| ProbeError::Cpus { path, source: e })?;
        let program = load_perf_event(&mut self.ebpf, NAME)?;
        // A fixed period in nanoseconds of CPU clock, not a frequency: each
        // sample then stands for exactly 1e9/HZ ns, which is what the cpu
        // profile's period says.
        let period = 1_000_000_000 / frequency.max(1);
        for cpu in cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Period(period),
                    false,
                )
                .map_err(|source| ProbeError::Program { name: NAME, source })?;
        }
        self.cpu_attached = true;
        Ok(())
    }

    /// Stops sampling (detaches the perf events, the heap probes and the
    /// futex tracepoints); the maps stay readable.
    pub fn stop_sampling(&mut self) {
        for links in self.uprobe_links() {
            links.detach_all();
        }
        self.closer.finish();
        for name in [
            "futex_enter",
            "futex_wait_enter",
            "futex_wake_enter",
            "futex_exit",
        ] {
            if let Some(program) = self.ebpf.program_mut(name)
                && let Ok(program) = <&mut TracePoint>::try_from(program)
                && program.fd().is_ok()
                && let Err(e) = program.unload()
            {
                tracing::warn!("detaching {name} failed: {e}");
            }
        }
        if !self.cpu_attached {
            return;
        }
        if let Some(program) = self.ebpf.program_mut("cpu_sample")
            && let Ok(program) = <&mut PerfEvent>::try_from(program)
            // Unloading detaches every link of the program.
            && let Err(e) = program.unload()
        {
            tracing::warn!("detaching the CPU sampler failed: {e}");
        }
        self.cpu_attached = false;
    }

    /// The CPU sampler, for the events of on-demand captures to link to;
    /// None when the CPU profile is off (the sampler is not loaded then).
    pub fn cpu_program(&self) -> Option<BorrowedFd<'_>> {
        if !self.cpu_attached {
            return None;
        }
        let program: &PerfEvent = self.ebpf.program("cpu_sample")?.try_into().ok()?;
        program.fd().ok().map(|fd| fd.as_fd())
    }

    /// The ring buffer of process events, taken once by the caller.
    pub fn take_proc_events(&mut self) -> Option<Ring> {
        self.proc_events.take()
    }

    /// The ring buffer of samples with stack copies, taken once by the caller.
    pub fn take_stack_samples(&mut self) -> Option<Ring> {
        self.stack_samples.take()
    }

    /// The ring buffer of heap events, taken once by the caller.
    pub fn take_heap_events(&mut self) -> Option<Ring> {
        self.heap_events.take()
    }

    /// The ring buffer of wait events, taken once by the caller.
    pub fn take_wait_events(&mut self) -> Option<Ring> {
        self.wait_events.take()
    }

    /// The reader of the programs' diagnostics (when on), taken once by the
    /// caller.
    pub fn take_kernel_log(&mut self) -> Option<KernelLog> {
        self.kernel_log.take()
    }

    /// The kernel's walk hints (see walk_memo.rs), taken once by the caller
    /// that reads wait events.
    pub fn take_walk_hints(&mut self) -> Option<HashMap<MapData, WalkHintKey, WalkHint>> {
        self.walk_hints.take()
    }

    /// Applies stack tops learned from complete walks (see stack_tops.rs).
    /// A failed update only leaves that thread's copies as they were.
    pub fn update_stack_tops(&mut self, updates: &[TopUpdate]) {
        for update in updates {
            let result = match *update {
                TopUpdate::Set { tid, top } => self.stack_tops.insert(tid, top, 0),
                TopUpdate::Clear { tid } => self.stack_tops.remove(&tid),
                TopUpdate::Deep { tid } => self.deep_threads.insert(tid, 0, 0),
            };
            if let Err(e) = result {
                tracing::debug!("stack top update {update:?} not applied: {e}");
            }
        }
    }

    /// The heap probes' links, when heap profiles are on.
    pub fn allocators(&mut self) -> Option<&mut UprobeLinks> {
        self.allocators.as_mut()
    }

    /// Uprobe links closed on the event loop's thread, the closer's queue
    /// being full.
    pub fn links_closed_inline(&self) -> u64 {
        self.closer.closed_inline()
    }

    /// When the Go park probes' duty cycles have something to do.
    pub fn park_budget_due(&self) -> Option<std::time::Instant> {
        self.park_budget.as_ref()?.next_due()
    }

    /// Opens and closes the Go park probes' windows that are due, and
    /// measures the processes' park rates once a period: the windows
    /// opened, by which their waits are weighted.
    pub fn park_budget_step(&mut self) -> Step {
        match (&mut self.park_budget, &mut self.go_parks) {
            (Some(budget), Some(links)) => budget.step(links),
            _ => Step::default(),
        }
    }

    /// Forgets the park-probe gate of a process that exited or exec'd.
    fn forget_park_gate(&mut self, tgid: u32) {
        if let Some(budget) = &mut self.park_budget {
            budget.forget(tgid);
        }
    }

    pub fn park_budget_stats(&self) -> BudgetStats {
        self.park_budget
            .as_ref()
            .map(ParkBudget::stats)
            .unwrap_or_default()
    }

    /// The condition variable probes' links, when block profiles are on.
    pub fn cond_parks(&mut self) -> Option<&mut UprobeLinks> {
        self.cond_parks.as_mut()
    }

    /// Every set of uprobe links (heap allocators, Go's heap points, Go and condition
    /// variable park points) that is on: each looks at new processes and
    /// files.
    pub fn uprobe_links(&mut self) -> impl Iterator<Item = &mut UprobeLinks> {
        self.allocators
            .iter_mut()
            .chain(self.go_heap.iter_mut())
            .chain(self.go_parks.iter_mut())
            .chain(self.cond_parks.iter_mut())
    }

    /// Attaches every set of uprobe links to the files in `mappings`
    /// that they probe.
    pub fn attach_files(&mut self, mappings: &ExecMappings) {
        for links in self.uprobe_links() {
            links.attach_mappings(mappings);
        }
        if let (Some(links), Some(callers)) = (&mut self.allocators, &mut self.allocator_callers) {
            let (files, ranges) = links.probed_code(mappings);
            callers.set(mappings.pid(), files, &ranges);
        }
    }

    /// Forgets what the kernel keeps of a process that exited or exec'd:
    /// its park-probe gate and its allocator callers.
    pub fn forget_process_state(&mut self, tgid: u32) {
        self.forget_park_gate(tgid);
        if let Some(callers) = &mut self.allocator_callers {
            callers.forget(tgid);
        }
    }

    pub fn allocator_caller_stats(&self) -> CallerStats {
        self.allocator_callers
            .as_ref()
            .map(AllocatorCallers::stats)
            .unwrap_or_default()
    }

    /// The same for the files process `pid` maps now (none if it is gone).
    pub fn attach_files_of(&mut self, pid: u32) {
        if let Some(mappings) = ExecMappings::read(pid) {
            self.attach_files(&mappings);
        }
    }

    /// Removes a process's sampled addresses from the kernel's live map
    /// (the process exited; its pid may be reused).
    pub fn forget_live(&mut self, tgid: u32, addrs: &[u64]) {
        for &addr in addrs {
            let _ = self.heap_live.remove(&LiveKey {
                tgid,
                _pad: 0,
                addr,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names the daemon and users know the kernel side by: every
    /// program with its section, every map with its type and sizes, every
    /// load-time global. A change to how the eBPF crate is laid out must not
    /// change any of them; a change meant to is made by rewriting the file
    /// (`PROFILERD_UPDATE_GOLDEN=1`) and shows in review.
    #[test]
    fn object_programs_maps_and_globals_are_as_recorded() {
        use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
        let obj = aya_obj::Object::parse(EBPF_OBJECT).expect("parse the eBPF object");
        let mut lines = Vec::new();
        for (name, program) in &obj.programs {
            lines.push(format!("program {name} {:?}", program.section));
        }
        for (name, map) in &obj.maps {
            lines.push(format!(
                "map {name} type={} key={} value={} max_entries={} flags={:#x}",
                map.map_type(),
                map.key_size(),
                map.value_size(),
                map.max_entries(),
                map.map_flags()
            ));
        }
        let elf = object::File::parse(EBPF_OBJECT).expect("parse the eBPF object as ELF");
        for symbol in elf.symbols() {
            let Some(section) = symbol
                .section_index()
                .and_then(|i| elf.section_by_index(i).ok())
            else {
                continue;
            };
            let section = section.name().unwrap_or("?");
            if matches!(section, ".rodata" | ".data" | ".bss") && symbol.is_global() {
                let name = symbol.name().unwrap_or("?");
                lines.push(format!("global {name} {section} size={}", symbol.size()));
            }
        }
        lines.sort();
        let text = lines.join("\n") + "\n";
        let golden = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/golden/ebpf-object.txt"
        );
        if std::env::var_os("PROFILERD_UPDATE_GOLDEN").is_some() {
            std::fs::write(golden, &text).expect("write the golden file");
        }
        let recorded = std::fs::read_to_string(golden).unwrap_or_default();
        assert!(
            recorded == text,
            "the eBPF object's programs, maps or globals changed; if that is meant, \
             rerun with PROFILERD_UPDATE_GOLDEN=1 and review {golden}:\n{}",
            line_diff(&recorded, &text)
        );
    }

    /// The lines only one of two texts has, marked `-` (recorded) or `+`.
    fn line_diff(recorded: &str, now: &str) -> String {
        let old: std::collections::BTreeSet<&str> = recorded.lines().collect();
        let new: std::collections::BTreeSet<&str> = now.lines().collect();
        let gone = old.difference(&new).map(|l| format!("- {l}"));
        let came = new.difference(&old).map(|l| format!("+ {l}"));
        gone.chain(came).collect::<Vec<_>>().join("\n")
    }
}
