//! Small steps of loading the eBPF object: the maps' sizes for the
//! profile types that are on, typed map handles taken from it, rings
//! mapped, tail-called and perf-event programs loaded, the uprobe attach
//! mode chosen, the memlock limit raised.

use aya::Ebpf;
use aya::maps::{Map, MapData, ProgramArray};
use aya::programs::PerfEvent;

use super::{ProbeConfig, ProbeError};
use crate::bpf::perf_uprobe::UprobePmu;
use crate::bpf::ring::Ring;
use crate::bpf::uprobes::AttachMode;
use crate::config::limits::MapLimits;

/// Entries of a preallocated map that nothing uses (a few, not none: the
/// kernel refuses a map of 0).
pub(super) const UNUSED_MAP_ENTRIES: u32 = 64;

/// The size of a ring that nothing writes: one page, the least a ring
/// buffer map takes.
fn unused_ring_bytes() -> u32 {
    // SAFETY: plain libc call.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// The maps' sizes: `config.limits`, with what was not set derived from
/// the rate, the CPUs and the node's memory, and the rings and sample
/// maps of profile types that are off (`waits_on`: block, mutex or
/// off-CPU) at their least. Those get the smallest size the kernel takes,
/// one page: nothing writes them, and each ring's pages are mapped into
/// the daemon (twice over for its data).
pub(super) fn map_limits(config: &ProbeConfig, waits_on: bool) -> MapLimits {
    let mut limits = config.limits;
    if let Ok(cpus) = aya::util::online_cpus() {
        limits.size_for_rate(config.cpu_frequency, cpus.len());
    }
    if let (Some(rate), Ok(memory)) = (
        config.heap_sample_bytes,
        <procfs::Meminfo as procfs::Current>::current(),
    ) {
        limits.size_for_memory(rate, memory.mem_total);
    }
    let unused = unused_ring_bytes();
    if !config.cpu {
        limits.stack_samples_bytes = unused;
        limits.counts_entries = UNUSED_MAP_ENTRIES;
        limits.stacks_entries = UNUSED_MAP_ENTRIES;
    }
    if config.heap_sample_bytes.is_none() {
        limits.heap_events_bytes = unused;
        limits.heap_live_entries = UNUSED_MAP_ENTRIES;
    }
    if !waits_on {
        limits.wait_events_bytes = unused;
    }
    limits
}

/// `preferred` where the kernel has it, else a perf-event uprobe per probe.
pub(super) fn uprobe_mode(
    has_preferred: bool,
    preferred: AttachMode,
) -> Result<AttachMode, ProbeError> {
    match has_preferred {
        true => Ok(preferred),
        false => Ok(AttachMode::PerfEvent(
            UprobePmu::read().map_err(ProbeError::UprobePmu)?,
        )),
    }
}

pub(super) fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, ProbeError> {
    ebpf.take_map(name).ok_or(ProbeError::MissingMap(name))
}

/// Takes a map out of the object as the typed aya map `T`.
pub(super) fn typed_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, ProbeError>
where
    T: TryFrom<Map, Error = aya::maps::MapError>,
{
    T::try_from(take_map(ebpf, name)?).map_err(|source| ProbeError::Map { name, source })
}

/// Takes ring buffer `name` out of the object and maps it for reading,
/// its data pages `twice` or once (bpf/ring.rs).
pub(super) fn ring(ebpf: &mut Ebpf, name: &'static str, twice: bool) -> Result<Ring, ProbeError> {
    let data = match take_map(ebpf, name)? {
        Map::RingBuf(data) => data,
        _ => return Err(ProbeError::MapType(name)),
    };
    let size = data
        .info()
        .map_err(|source| ProbeError::Map { name, source })?
        .max_entries() as usize;
    Ring::new(data, size, twice).map_err(|source| ProbeError::Ring { name, source })
}

pub(super) fn per_cpu_hash(map: Map, name: &'static str) -> Result<MapData, ProbeError> {
    match map {
        Map::PerCpuHashMap(data) => Ok(data),
        _ => Err(ProbeError::MapType(name)),
    }
}

/// Loads perf-event program `name` of the object (not attached).
/// Loads perf-event program `name` and puts it in slot 0 of `array`,
/// where a program tail-calls it.
pub(super) fn load_tail_program(
    ebpf: &mut Ebpf,
    name: &'static str,
    (array, array_name): (&mut ProgramArray<MapData>, &'static str),
) -> Result<(), ProbeError> {
    let fd = load_perf_event(ebpf, name)?
        .fd()
        .map_err(|source| ProbeError::Program { name, source })?;
    array.set(0, fd, 0).map_err(|source| ProbeError::Map {
        name: array_name,
        source,
    })
}

pub(super) fn load_perf_event<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut PerfEvent, ProbeError> {
    let program: &mut PerfEvent = ebpf
        .program_mut(name)
        .ok_or(ProbeError::MissingProgram(name))?
        .try_into()
        .map_err(|source| ProbeError::Program { name, source })?;
    program
        .load()
        .map_err(|source| ProbeError::Program { name, source })?;
    Ok(program)
}

pub(super) fn hash(map: Map, name: &'static str) -> Result<MapData, ProbeError> {
    match map {
        Map::HashMap(data) => Ok(data),
        _ => Err(ProbeError::MapType(name)),
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; newer ones use the
/// memory cgroup and ignore it. Raising it is harmless either way.
pub(super) fn raise_memlock_limit() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
    if ret != 0 {
        tracing::debug!(
            "raising RLIMIT_MEMLOCK failed: {}",
            std::io::Error::last_os_error()
        );
    }
}
