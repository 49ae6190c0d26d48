//! What the daemon tells the kernel about a Go process: that it is one (Go
//! keeps frame pointers and ships no `.eh_frame`, so the kernel walks its
//! stacks), the range of its code (for the words a frameless leaf's caller
//! may be in), and where its goroutines' pprof labels are, which depends
//! on the Go release that built it (read from the binary's build
//! information, `.go.buildinfo`, which stripping keeps).

use std::os::unix::fs::MetadataExt;

use object::{Object, ObjectSegment};
use procfs::process::{MMPermissions, MMapPath, MemoryMaps, Process};
use profiler_common::{FpProcess, GoRuntime, go_labels_form};

use crate::model::go_buildinfo;
use crate::model::go_pclntab::Pclntab;

/// `g.m`, the same in every release read.
const G_M: u16 = 48;
/// The runtime layout of the Go executable process `tgid` runs: None when
/// it is not a Go executable; labels not read (`NONE`) for a release whose
/// layout is not known. What [`GoExecutables::get`] answers, read anew
/// (the tests' reference).
#[cfg(test)]
pub fn go_executable(tgid: u32) -> Option<GoRuntime> {
    read_executable(tgid).and_then(layout_of)
}

/// The runtime layout of an executable that [`read_executable`] read.
fn layout_of((is_go, minor): (bool, Option<u32>)) -> Option<GoRuntime> {
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

/// Executables already read by [`go_executable`], by file identity: a busy
/// node starts the same few executables over and over (and every fork
/// without exec runs its parent's), and reading one's headers, section
/// names and build information costs as much as the rest of a new
/// process's handling. A file is known by device, inode, size and
/// modification time, so one rewritten in place is read again. Bounded:
/// emptied when full. `[debug] executable_cache = false` reads every time.
#[derive(Debug)]
pub struct GoExecutables {
    known: foldhash::HashMap<ExecutableId, Option<GoRuntime>>,
    cached: bool,
    /// Where executables keep `runtime.futex` (its code in the file's
    /// addresses, and the file's first segment), by (device, inode); None
    /// when `[debug] go_runtime_futexes_in_kernel = false`.
    futex_ranges: Option<foldhash::HashMap<(u64, u64), Option<FutexRange>>>,
    pub stats: GoExecutableStats,
}

/// `runtime.futex`'s start and end, and the first segment's address, in
/// an executable's own addresses.
type FutexRange = (u64, u64, u64);

/// Executables whose `runtime.futex` is kept (emptied when full).
const FUTEX_RANGES_KEPT: usize = 256;

/// (device, inode, size, modification time in ns)
type ExecutableId = (u64, u64, u64, i128);

/// Executables kept in [`GoExecutables`].
const EXECUTABLES_KEPT: usize = 1024;

#[derive(Debug, Default, Clone, Copy)]
pub struct GoExecutableStats {
    /// Executables read (headers, sections, build information).
    pub reads: u64,
    /// Answers taken from what an earlier read found.
    pub hits: u64,
    /// Go executables read whose release has no label layout here (before
    /// 1.18, or newer than the table): their goroutines' labels are not
    /// read. Each is logged once, when read.
    pub labels_unknown: u64,
}

impl GoExecutables {
    /// `cached`: `[debug] executable_cache`; `futexes_in_kernel`: `[debug]
    /// go_runtime_futexes_in_kernel` (the kernel told where each Go
    /// process's `runtime.futex` is, so that it sends none of its waits).
    pub fn new(cached: bool, futexes_in_kernel: bool) -> Self {
        Self {
            known: Default::default(),
            cached,
            futex_ranges: futexes_in_kernel.then(Default::default),
            stats: GoExecutableStats::default(),
        }
    }

    /// [`go_executable`] of process `tgid`, from an earlier read of the
    /// same file when there is one.
    pub fn get(&mut self, tgid: u32) -> Option<GoRuntime> {
        if !self.cached {
            self.stats.reads += 1;
            let read = read_executable(tgid);
            self.note_unknown_layout(tgid, read);
            return read.and_then(layout_of);
        }
        let meta = std::fs::metadata(format!("/proc/{tgid}/exe")).ok()?;
        let id = (
            meta.dev(),
            meta.ino(),
            meta.size(),
            i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        );
        if let Some(&known) = self.known.get(&id) {
            self.stats.hits += 1;
            return known;
        }
        self.stats.reads += 1;
        // Not kept when unreadable (the process went): another process may
        // read it.
        let read = read_executable(tgid);
        self.note_unknown_layout(tgid, read);
        let found = layout_of(read?);
        if self.known.len() >= EXECUTABLES_KEPT {
            self.known.clear();
        }
        self.known.insert(id, found);
        found
    }
}

impl GoExecutables {
    /// Counts and logs a Go executable whose labels have no layout here.
    fn note_unknown_layout(&mut self, tgid: u32, read: Option<(bool, Option<u32>)>) {
        let Some((true, minor)) = read else {
            return;
        };
        if minor.is_some_and(|minor| runtime_layout(minor) != GoRuntime::default()) {
            return;
        }
        self.stats.labels_unknown += 1;
        let release = minor.map_or("a Go release before 1.18".to_string(), |m| {
            format!("go1.{m}")
        });
        tracing::info!(
            "pid {tgid}: built by {release}, whose goroutine layout is not known here \
             (1.{KNOWN_FIRST} to 1.{KNOWN_LAST} are): its CPU samples carry no pprof labels"
        );
    }
}

/// The first and last Go releases [`runtime_layout`] knows.
const KNOWN_FIRST: u32 = 18;
const KNOWN_LAST: u32 = 27;

/// Where release 1.`minor` keeps a goroutine's labels: `m.curg` and
/// `g.labels` as the DWARF of a binary built by each of go1.19.8,
/// 1.21.13, 1.22.10, 1.23.9, 1.24.11, 1.25.5, 1.26.6 and 1.27.3 gives them
/// (checked against each by `model/go_dwarf.rs`); 1.18 and 1.20 are
/// assumed to be as 1.19, as the OpenTelemetry profiler's table has them,
/// no binary of theirs read. The labels changed from a map to a sorted
/// list in Go 1.24.
pub fn runtime_layout(minor: u32) -> GoRuntime {
    let (m_curg, g_labels, labels_form) = match minor {
        KNOWN_FIRST..=20 => (192, 360, go_labels_form::MAP),
        21..=22 => (192, 344, go_labels_form::MAP),
        23 => (192, 352, go_labels_form::MAP),
        24 => (192, 352, go_labels_form::LIST),
        25 => (184, 344, go_labels_form::LIST),
        26..=KNOWN_LAST => (184, 352, go_labels_form::LIST),
        _ => return GoRuntime::default(),
    };
    GoRuntime {
        g_m: G_M,
        m_curg,
        g_labels,
        g_status: g_status(minor).unwrap_or(0),
        labels_form,
        _pad: 0,
    }
}

/// Where release 1.`minor` keeps `g.atomicstatus`, from the DWARF of the
/// binaries `runtime_layout` names (the goroutine profile's layout reads
/// it too); None for a release not read (1.18 and 1.20 included: their
/// goroutines are not read, and their CPU samples are told running through
/// their M only).
pub fn g_status(minor: u32) -> Option<u16> {
    match minor {
        19 | 21 | 22 | 25..=27 => Some(144),
        23 | 24 => Some(152),
        _ => None,
    }
}

/// What `find` reads in process `tgid`'s executable, mapped and parsed.
pub(crate) fn in_executable<T>(
    tgid: u32,
    find: impl FnOnce(&object::File<'_, &[u8]>) -> Option<T>,
) -> Option<T> {
    let exe = std::fs::File::open(format!("/proc/{tgid}/exe")).ok()?;
    // SAFETY: a read-only private mapping of an executable file, which is
    // replaced rather than rewritten while mapped.
    let map = unsafe { memmap2::Mmap::map(&exe) }.ok()?;
    let file = object::File::parse(&*map).ok()?;
    find(&file)
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
    bias_in(&maps, exe.ino(), first)
}

/// [`load_bias_of`] from the process's memory maps `maps`, its executable
/// being inode `ino`: the mapping of the file's start against `first`.
fn bias_in(maps: &MemoryMaps, ino: u64, first: u64) -> Option<u64> {
    let start = maps
        .iter()
        .find(|map| {
            map.inode == ino && map.offset == 0 && matches!(map.pathname, MMapPath::Path(_))
        })?
        .address
        .0;
    start.checked_sub(first & !0xfff)
}

impl GoExecutables {
    /// The kernel's entry for Go process `tgid`, of runtime layout `go`:
    /// its code range (from its first to its last executable mapping of
    /// the file /proc/PID/exe names) and, unless switched off, where its
    /// `runtime.futex` is; each empty when not known.
    pub fn fp_process(&mut self, tgid: u32, go: GoRuntime) -> FpProcess {
        let mut process = FpProcess {
            go,
            ..FpProcess::default()
        };
        let Ok(exe) = std::fs::metadata(format!("/proc/{tgid}/exe")) else {
            return process;
        };
        let futex = self.futex_ranges.as_mut().and_then(|ranges| {
            if ranges.len() >= FUTEX_RANGES_KEPT {
                ranges.clear();
            }
            *ranges
                .entry((exe.dev(), exe.ino()))
                .or_insert_with(|| futex_range_in_file(tgid))
        });
        let Some(maps) = Process::new(tgid as i32).ok().and_then(|p| p.maps().ok()) else {
            return process;
        };
        let ours = |map: &&procfs::process::MemoryMap| {
            map.inode == exe.ino() && matches!(map.pathname, MMapPath::Path(_))
        };
        let (start, end) = maps
            .iter()
            .filter(ours)
            .filter(|map| map.perms.contains(MMPermissions::EXECUTE))
            .fold((u64::MAX, 0), |(lo, hi), map| {
                (lo.min(map.address.0), hi.max(map.address.1))
            });
        if start < end {
            (process.text_start, process.text_end) = (start, end);
        }
        if let Some((futex_start, futex_end, first)) = futex
            && let Some(bias) = bias_in(&maps, exe.ino(), first)
        {
            process.futex_start = futex_start.wrapping_add(bias);
            process.futex_end = futex_end.wrapping_add(bias);
        }
        process
    }
}

/// `runtime.futex`'s code in process `tgid`'s executable (from the
/// pclntab, which stripping keeps), and the file's first segment.
fn futex_range_in_file(tgid: u32) -> Option<FutexRange> {
    in_executable(tgid, |file| {
        let (start, len) = Pclntab::of_file(file)?.function_named("runtime.futex")?;
        Some((start, start.checked_add(len)?, first_segment(file)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache gives every process the answer a read of its executable
    /// gives, and reads each distinct executable once. A Go process is
    /// among them when the tools' Go is there (gofmt, waiting on stdin).
    #[test]
    fn known_executables_answer_as_a_read_does() {
        let lib =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/go-current/lib");
        let gofmt = std::fs::read_dir(lib)
            .into_iter()
            .flatten()
            .flatten()
            .map(|python| python.path().join("site-packages/go/bin/gofmt"))
            .find(|path| path.exists());
        let mut go_child = gofmt.and_then(|gofmt| {
            std::process::Command::new(gofmt)
                .stdin(std::process::Stdio::piped())
                .spawn()
                .ok()
        });
        let mut pids: Vec<u32> = procfs::process::all_processes()
            .unwrap()
            .filter_map(|p| p.ok().map(|p| p.pid as u32))
            .collect();
        pids.push(std::process::id());
        // Kernel threads have no executable.
        pids.retain(|pid| std::fs::metadata(format!("/proc/{pid}/exe")).is_ok());
        let mut cached = GoExecutables::new(true, true);
        let mut uncached = GoExecutables::new(false, true);
        for round in 0..2 {
            for &pid in &pids {
                let direct = go_executable(pid);
                assert_eq!(cached.get(pid), direct, "pid {pid}, round {round}");
                assert_eq!(uncached.get(pid), direct, "pid {pid}, round {round}");
            }
        }
        assert!(cached.stats.hits >= pids.len() as u64, "{:?}", cached.stats);
        assert!(cached.stats.reads < pids.len() as u64, "{:?}", cached.stats);
        assert_eq!(uncached.stats.hits, 0);
        if let Some(child) = go_child.as_mut() {
            let go = cached.get(child.id()).expect("gofmt read as Go");
            // Its runtime.futex lies in its code; switched off, unknown.
            let process = cached.fp_process(child.id(), go);
            assert!(
                process.text_start <= process.futex_start
                    && process.futex_start < process.futex_end
                    && process.futex_end <= process.text_end,
                "{process:?}"
            );
            let unknown = GoExecutables::new(true, false).fp_process(child.id(), go);
            assert_eq!((unknown.futex_start, unknown.futex_end), (0, 0));
            assert_eq!(unknown.text_start, process.text_start);
            assert!(go_executable(child.id()).is_some(), "gofmt read as Go");
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }

    /// A Go executable of a release without a label layout is counted;
    /// one with a layout, or not Go, is not.
    #[test]
    fn releases_without_a_layout_are_counted() {
        let mut exes = GoExecutables::new(true, true);
        for read in [
            Some((true, Some(19))),
            Some((true, Some(KNOWN_LAST))),
            Some((false, None)),
            None,
        ] {
            exes.note_unknown_layout(1, read);
        }
        assert_eq!(exes.stats.labels_unknown, 0);
        for read in [
            Some((true, Some(17))),
            Some((true, Some(KNOWN_LAST + 1))),
            Some((true, None)),
        ] {
            exes.note_unknown_layout(1, read);
        }
        assert_eq!(exes.stats.labels_unknown, 3);
    }

    /// The table is the DWARF of a program built by each release read
    /// (`model/go_dwarf.rs`): `g.m`, `m.curg`, `g.labels`,
    /// `g.atomicstatus`, and the form of `runtime/pprof.labelMap`; it names
    /// no other release but those assumed (1.18 and 1.20).
    #[test]
    fn layouts_are_each_release_s_dwarf() {
        use crate::model::go_dwarf::{self, KIND_MAP, KIND_STRUCT};
        go_dwarf::assert_only_releases_read("runtime_layout", |minor| {
            runtime_layout(minor) != GoRuntime::default()
        });
        go_dwarf::assert_only_releases_read("g_status", |minor| g_status(minor).is_some());
        for release in go_dwarf::releases() {
            let at = |ty: &str, member: &str| {
                u16::try_from(release.offset(ty, member)).expect("a small offset")
            };
            let dwarf = GoRuntime {
                g_m: at("runtime.g", "m"),
                m_curg: at("runtime.m", "curg"),
                g_labels: at("runtime.g", "labels"),
                g_status: at("runtime.g", "atomicstatus"),
                labels_form: match release.label_map_kind {
                    KIND_MAP => go_labels_form::MAP,
                    KIND_STRUCT => go_labels_form::LIST,
                    other => panic!("{}: labelMap of kind {other}", release.version),
                },
                _pad: 0,
            };
            println!("{}: {dwarf:?}", release.version);
            assert_eq!(runtime_layout(release.minor), dwarf, "{}", release.version);
            assert_eq!(g_status(release.minor), Some(dwarf.g_status));
        }
    }

    #[test]
    fn layouts_change_with_the_release() {
        assert_eq!(runtime_layout(19).g_labels, 360);
        assert_eq!(runtime_layout(19).labels_form, go_labels_form::MAP);
        assert_eq!(runtime_layout(27).m_curg, 184);
        assert_eq!(runtime_layout(27).labels_form, go_labels_form::LIST);
        // The status moved with 1.23's g.syscallbp; 1.20's was not read,
        // so its goroutines are told running through their M only.
        assert_eq!(runtime_layout(19).g_status, 144);
        assert_eq!(runtime_layout(24).g_status, 152);
        assert_eq!(runtime_layout(20).g_status, 0);
        assert_eq!(
            runtime_layout(40),
            GoRuntime::default(),
            "unknown: not read"
        );
    }
}
