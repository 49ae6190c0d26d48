//! What the daemon tells the kernel about a Go process: that it is one (Go
//! keeps frame pointers and ships no `.eh_frame`, so the kernel walks its
//! stacks), the range of its code (for the words a frameless leaf's caller
//! may be in), and where its goroutines' pprof labels are, which depends
//! on the Go release that built it (read from the binary's build
//! information, `.go.buildinfo`, which stripping keeps).

use std::os::unix::fs::MetadataExt;

use object::{Object, ObjectSegment, ObjectSymbol};
use procfs::process::{MMPermissions, MMapPath, Process};
use profiler_common::{FpProcess, GoRuntime, go_labels_form};

use crate::model::go_buildinfo;
use crate::model::go_pclntab::Pclntab;
use crate::procs::go_code;

/// `g.m`, the same in every release read.
const G_M: u16 = 48;
/// The runtime layout of the Go executable process `tgid` runs: None when
/// it is not a Go executable; labels not read (`NONE`) for a release whose
/// layout is not known.
pub fn go_executable(tgid: u32) -> Option<GoRuntime> {
    let (is_go, minor) = read_executable(tgid)?;
    is_go.then(|| minor.map_or_else(GoRuntime::default, runtime_layout))
}

/// The minor number of the Go release that built process `tgid`'s
/// executable; None when it is not Go (1.18 or later) or cannot be read.
pub fn go_release(tgid: u32) -> Option<u32> {
    read_executable(tgid)?.1
}

/// Whether process `tgid`'s executable is Go, and the minor number of the
/// Go release that built it (Go 1.18 and later name it). Reads only the
/// headers, the section names and the build information.
fn read_executable(tgid: u32) -> Option<(bool, Option<u32>)> {
    let exe = std::fs::File::open(format!("/proc/{tgid}/exe")).ok()?;
    let cache = object::ReadCache::new(exe);
    let file = object::File::parse(&cache).ok()?;
    Some((go_buildinfo::is_go(&file), go_buildinfo::go_release(&file)))
}

/// Where release 1.`minor` keeps a goroutine's labels: `m.curg` and
/// `g.labels` as the DWARF of a binary built by each of go1.19.8,
/// 1.21.13, 1.22.10, 1.23.9, 1.24.11, 1.25.5, 1.26.6 and 1.27.3 gives them
/// (1.18 and 1.20 as 1.19, as the OpenTelemetry profiler's table has
/// them); the labels changed from a map to a sorted list in Go 1.24.
pub fn runtime_layout(minor: u32) -> GoRuntime {
    let (m_curg, g_labels, labels_form) = match minor {
        18..=20 => (192, 360, go_labels_form::MAP),
        21..=22 => (192, 344, go_labels_form::MAP),
        23 => (192, 352, go_labels_form::MAP),
        24 => (192, 352, go_labels_form::LIST),
        25 => (184, 344, go_labels_form::LIST),
        26..=27 => (184, 352, go_labels_form::LIST),
        _ => return GoRuntime::default(),
    };
    GoRuntime {
        g_m: G_M,
        m_curg,
        g_labels,
        labels_form,
        _pad: [0; 3],
    }
}

/// Go's default `runtime.MemProfileRate`: a sample per 512 KiB allocated,
/// on average.
pub const DEFAULT_MEM_PROFILE_RATE: u64 = 512 * 1024;

/// Where executables keep `runtime.MemProfileRate` (an address in the
/// file's space, and the file's first segment's), by (device, inode):
/// each is read once.
pub type RateAddresses = foldhash::HashMap<(u64, u64), Option<(u64, u64)>>;

/// Executables whose rate's address is kept (emptied when full).
const RATE_ADDRESSES_KEPT: usize = 256;

/// The `runtime.MemProfileRate` Go process `tgid` samples its allocations
/// by now, read from its memory at the variable's address: from the
/// executable's symbol table, or in a stripped one from the runtime's
/// code (`go_code::mem_profile_rate`). None when neither gives it or the
/// process cannot be read.
pub fn mem_profile_rate(tgid: u32, known: &mut RateAddresses) -> Option<u64> {
    let exe = std::fs::metadata(format!("/proc/{tgid}/exe")).ok()?;
    if known.len() >= RATE_ADDRESSES_KEPT {
        known.clear();
    }
    let (address, first) = (*known
        .entry((exe.dev(), exe.ino()))
        .or_insert_with(|| rate_address(tgid)))?;
    let address = address.checked_add(load_bias_of(tgid, first)?)?;
    let mem = std::fs::File::open(format!("/proc/{tgid}/mem")).ok()?;
    let mut word = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut word, address).ok()?;
    u64::try_from(i64::from_le_bytes(word)).ok()
}

/// `runtime.MemProfileRate`'s address in process `tgid`'s executable, and
/// the executable's first segment's.
fn rate_address(tgid: u32) -> Option<(u64, u64)> {
    let exe = std::fs::File::open(format!("/proc/{tgid}/exe")).ok()?;
    // SAFETY: a read-only private mapping of an executable file, which is
    // replaced rather than rewritten while mapped.
    let map = unsafe { memmap2::Mmap::map(&exe) }.ok()?;
    let file = object::File::parse(&*map).ok()?;
    let address = file
        .symbols()
        .find(|s| s.name() == Ok("runtime.MemProfileRate"))
        .map(|s| s.address())
        .or_else(|| go_code::mem_profile_rate(&file, &Pclntab::of_file(&file)?))?;
    Some((address, first_segment(&file)?))
}

/// The address of the segment that maps the start of `file`.
pub(crate) fn first_segment<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> Option<u64> {
    Some(
        file.segments()
            .find(|segment| segment.file_range().0 == 0)?
            .address(),
    )
}

/// What process `tgid` added to its executable's addresses when it mapped
/// it (0 for Go's default, not position-independent, executables), given
/// the address of the executable's first segment.
pub(crate) fn load_bias_of(tgid: u32, first: u64) -> Option<u64> {
    let exe = std::fs::metadata(format!("/proc/{tgid}/exe")).ok()?;
    let maps = Process::new(tgid as i32).ok()?.maps().ok()?;
    let start = maps
        .iter()
        .find(|map| map.inode == exe.ino() && map.offset == 0)?
        .address
        .0;
    start.checked_sub(first & !0xfff)
}

/// The kernel's entry for Go process `tgid`: its code range (from its
/// first to its last executable mapping of the file /proc/PID/exe names;
/// empty when the mappings cannot be read) and its runtime layout.
pub fn fp_process(tgid: u32, go: GoRuntime) -> FpProcess {
    let (text_start, text_end) = executable_code_range(tgid).unwrap_or((0, 0));
    FpProcess {
        text_start,
        text_end,
        go,
    }
}

fn executable_code_range(tgid: u32) -> Option<(u64, u64)> {
    let exe = std::fs::metadata(format!("/proc/{tgid}/exe")).ok()?;
    let maps = Process::new(tgid as i32).ok()?.maps().ok()?;
    let (start, end) = maps
        .iter()
        .filter(|map| {
            map.perms.contains(MMPermissions::EXECUTE)
                && map.inode == exe.ino()
                && matches!(map.pathname, MMapPath::Path(_))
        })
        .fold((u64::MAX, 0), |(lo, hi), map| {
            (lo.min(map.address.0), hi.max(map.address.1))
        });
    (start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_change_with_the_release() {
        assert_eq!(runtime_layout(19).g_labels, 360);
        assert_eq!(runtime_layout(19).labels_form, go_labels_form::MAP);
        assert_eq!(runtime_layout(27).m_curg, 184);
        assert_eq!(runtime_layout(27).labels_form, go_labels_form::LIST);
        assert_eq!(
            runtime_layout(40),
            GoRuntime::default(),
            "unknown: not read"
        );
    }
}
