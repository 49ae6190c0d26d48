//! User-space probe programs and their links, in the best form this
//! kernel offers ([`AttachMode`]):
//! - uprobe sessions: one program that runs at a function's entry and,
//!   only when the entry asks for it (returns 0), at the function's return
//!   (`BPF_TRACE_UPROBE_SESSION`, Linux 6.13+). The heap probes use them so
//!   that an unsampled allocation pays no return probe;
//! - uprobe_multi links (6.6+): entry probes of many functions in one link;
//! - perf-event uprobes (`perf_uprobe`): one probe per function and
//!   direction, on older kernels; a program that needs returns then gets a
//!   return probe on every call.
//!
//! aya 0.14 neither loads a program with a uprobe_multi/session attach type nor
//! creates those links, so this module does both with the raw `bpf`
//! system call: it relocates the program's instructions with aya-obj against
//! the maps aya has already created, and loads them itself.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use procfs::process::{MMPermissions, MMapPath, MemoryMaps, Process};
use std::ffi::CStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use aya::Ebpf;
use aya::maps::Map;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_insn, bpf_prog_info};
use thiserror::Error;

use crate::bpf::link_closer::LinkCloser;
use crate::bpf::perf_uprobe::UprobePmu;
pub use crate::bpf::raw_programs::{BPF_TRACE_UPROBE_MULTI, BPF_TRACE_UPROBE_SESSION};
use crate::bpf::raw_programs::{ProgramBtf, create_link, load_program, sys_bpf};
use profiler_common::probe_cookie;

/// Files whose probe points are remembered (found or not).
const MAX_FILES: usize = 4096;
/// Links kept at once (files times target processes).
const MAX_LINKS: usize = 8192;
/// Distinct causes of attach failures logged, each once.
const MAX_CAUSES_LOGGED: usize = 16;

/// The files a process maps executable, read once from /proc/PID/maps for
/// every set of links (allocators, Go's heap and park points, condition
/// variables): each set looks at the same mappings.
#[derive(Debug, Default)]
pub struct ExecMappings {
    pid: u32,
    files: Vec<ExecFile>,
}

#[derive(Debug)]
struct ExecFile {
    id: FileId,
    start: u64,
    end: u64,
    /// The file offset mapped at `start`.
    offset: u64,
    path: PathBuf,
}

impl ExecFile {
    /// The mapping's own file as process `pid` maps it, whichever mount
    /// namespace or deleted state it is in.
    fn via(&self, pid: u32) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            self.start, self.end
        ))
    }
}

impl ExecMappings {
    /// The process the mappings are of.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Process `pid`'s executable file mappings; None when it has gone (or
    /// cannot be read).
    pub fn read(pid: u32) -> Option<Self> {
        let maps = Process::new(i32::try_from(pid).ok()?).ok()?.maps().ok()?;
        Some(Self::of(pid, &maps))
    }

    /// The executable file mappings among process `pid`'s `maps`.
    pub fn of(pid: u32, maps: &MemoryMaps) -> Self {
        let files = maps
            .iter()
            .filter(|map| map.perms.contains(MMPermissions::EXECUTE))
            .filter_map(|map| match &map.pathname {
                MMapPath::Path(path) => Some(ExecFile {
                    id: (map.dev.0 as u64 * 256 + map.dev.1 as u64, map.inode),
                    start: map.address.0,
                    end: map.address.1,
                    offset: map.offset,
                    path: path.clone(),
                }),
                _ => None,
            })
            .collect();
        Self { pid, files }
    }
}

#[derive(Debug, Error)]
pub enum SessionError {
    /// The embedded object does not parse.
    #[error("parsing the eBPF object: {0}")]
    Parse(#[source] aya_obj::ParseError),
    /// The object has no such program (or no code for it).
    #[error("eBPF program {0} is missing from the object")]
    MissingProgram(&'static str),
    /// The program's map references could not be bound to the loaded maps.
    #[error("relocating eBPF program {name}: {source}")]
    RelocateMaps {
        name: &'static str,
        #[source]
        source: aya_obj::relocation::EbpfRelocationError,
    },
    /// The program's calls could not be linked.
    #[error("relocating eBPF program {name}: {source}")]
    RelocateCalls {
        name: &'static str,
        #[source]
        source: aya_obj::relocation::EbpfRelocationError,
    },
    #[error("loading eBPF program {name} as {mode} failed: {source}\n{log}")]
    Load {
        name: &'static str,
        mode: &'static str,
        #[source]
        source: io::Error,
        log: String,
    },
    /// A deferred program the kernel refused when it was first needed
    /// (that refusal was logged then).
    #[error("the kernel refused the program when it was first needed")]
    Refused,
}

/// How a program's probes are attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// One uprobe session link per file: entries, and the returns the
    /// entries ask for (Linux 6.13).
    Session,
    /// One uprobe_multi link per file, entries only (Linux 6.6).
    Multi,
    /// A perf-event uprobe per probe point: entries with
    /// `probe_cookie::AT_ENTRY` in the cookie and, for the functions
    /// whose returns the program needs, returns with `AT_RETURN`.
    PerfEvent(UprobePmu),
}

impl AttachMode {
    /// What the probes are, in logs.
    pub fn describe(&self) -> &'static str {
        match self {
            AttachMode::Session => "a uprobe session per file",
            AttachMode::Multi => "a uprobe_multi link per file",
            AttachMode::PerfEvent(_) => "perf-event uprobes",
        }
    }
}

/// A loaded uprobe program and the way its probes attach.
pub struct UprobeProgram {
    fd: OwnedFd,
    mode: AttachMode,
    /// In [`AttachMode::PerfEvent`]: whether the function a cookie names
    /// also gets a return probe (a session asks at run time instead).
    wants_return: fn(u64) -> bool,
}

/// The descriptors that keep one file's probes attached: one link, or in
/// [`AttachMode::PerfEvent`] one per probe.
pub type Link = Vec<OwnedFd>;

/// The probe points of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePoints {
    /// File offsets of the probed instructions.
    pub offsets: Vec<u64>,
    /// The function of each offset (the uprobe cookie).
    pub cookies: Vec<u64>,
    /// Cookies of the probes the kernel must single-step (no emulated
    /// instruction before an argument changes; glibc's reallocarray).
    pub single_stepped: Vec<u64>,
    /// File offsets `[start, end)` of the probed functions' code, where a
    /// call returning into them must be told from the program's own
    /// (allocators: a wrapper calling the allocator it wraps); else empty.
    pub functions: Vec<(u64, u64)>,
}

/// Finds the probe points of an ELF file.
pub type Finder = fn(&Path) -> Result<Option<ProbePoints>, String>;

/// A uprobe program relocated against the daemon's maps but not loaded
/// yet: the kernel's verifier walks it only when its first file is found
/// ([`LinkProgram::AtFirstFile`]), so that a node without such files never
/// pays for it.
pub struct PreparedProgram {
    name: &'static str,
    instructions: Vec<bpf_insn>,
    license: CString,
    attach_type: u32,
    mode: AttachMode,
    wants_return: fn(u64) -> bool,
    /// The object's BTF and the program's records of it; None when this
    /// kernel takes no BTF or the object's is unfit (a program that calls
    /// through a function pointer is then refused, and says why).
    btf: Option<ProgramBtf>,
}

impl PreparedProgram {
    /// Relocates program `name` of `object` (the same bytes `ebpf` was
    /// loaded from) so that its map references point at `ebpf`'s maps.
    /// Call it before any map is taken out of `ebpf`.
    pub fn prepare(
        object: &[u8],
        ebpf: &Ebpf,
        name: &'static str,
        mode: AttachMode,
        wants_return: fn(u64) -> bool,
    ) -> Result<Self, SessionError> {
        let attach_type = match mode {
            AttachMode::Session => BPF_TRACE_UPROBE_SESSION,
            AttachMode::Multi => BPF_TRACE_UPROBE_MULTI,
            // A plain kprobe-type program, linked to perf events.
            AttachMode::PerfEvent(_) => 0,
        };
        let mut obj = aya_obj::Object::parse(object).map_err(SessionError::Parse)?;
        // As aya loads its own programs: the object's BTF, made fit for
        // this kernel (loaded with the program).
        let types = match aya::features().btf().map(|f| obj.fixup_and_sanitize_btf(f)) {
            Some(Ok(Some(btf))) => Some(btf.to_bytes()),
            Some(Err(e)) => {
                tracing::debug!(program = name, error = %e, "the eBPF object's BTF is unfit");
                None
            }
            _ => None,
        };
        let objects: Vec<(String, aya_obj::Map)> = obj.maps.drain().collect();
        let mut maps = Vec::with_capacity(objects.len());
        for (map_name, map_obj) in &objects {
            // Maps the kernel does not need (none today) are simply absent;
            // FUTEX_CALLS (task storage) is one aya leaves unwrapped.
            if let Some(fd) = ebpf.map(map_name).and_then(map_fd) {
                maps.push((map_name.as_str(), fd, map_obj));
            }
        }
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        obj.relocate_maps(maps.into_iter(), &text_sections)
            .map_err(|source| SessionError::RelocateMaps { name, source })?;
        obj.relocate_calls(&text_sections)
            .map_err(|source| SessionError::RelocateCalls { name, source })?;
        let program = obj
            .programs
            .get(name)
            .ok_or(SessionError::MissingProgram(name))?;
        let function = obj
            .functions
            .get(&program.function_key())
            .ok_or(SessionError::MissingProgram(name))?;
        let btf = types.map(|types| ProgramBtf {
            types,
            func_info: function.func_info.func_info_bytes(),
            func_info_rec_size: function.func_info_rec_size as u32,
            line_info: function.line_info.line_info_bytes(),
            line_info_rec_size: function.line_info_rec_size as u32,
        });
        Ok(PreparedProgram {
            name,
            instructions: function.instructions.clone(),
            license: obj.license.clone(),
            attach_type,
            mode,
            wants_return,
            btf,
        })
    }

    /// Has the kernel verify and load it.
    pub fn load(self) -> Result<UprobeProgram, SessionError> {
        let PreparedProgram {
            name,
            instructions,
            license,
            attach_type,
            mode,
            wants_return,
            btf,
        } = self;
        let fd = load_program(name, &instructions, &license, attach_type, btf.as_ref()).map_err(
            |(source, log)| SessionError::Load {
                name,
                mode: match mode {
                    AttachMode::Session => "a uprobe session (Linux 6.13)",
                    AttachMode::Multi => "a uprobe_multi program (Linux 6.6)",
                    AttachMode::PerfEvent(_) => "a perf-event uprobe",
                },
                source,
                log,
            },
        )?;
        Ok(UprobeProgram {
            fd,
            mode,
            wants_return,
        })
    }
}

impl UprobeProgram {
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Run count and run time (kernel BPF stats; zero unless
    /// kernel.bpf_stats_enabled is set).
    pub fn run_stats(&self) -> Option<(u64, std::time::Duration)> {
        // SAFETY: plain data; all-zero is valid.
        let mut info: bpf_prog_info = unsafe { zeroed() };
        // SAFETY: as above.
        let mut attr: bpf_attr = unsafe { zeroed() };
        // `info` outlives the call.
        attr.info.bpf_fd = self.fd() as u32;
        attr.info.info_len = size_of::<bpf_prog_info>() as u32;
        attr.info.info = &mut info as *mut bpf_prog_info as u64;
        sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long, &mut attr).ok()?;
        Some((
            info.run_cnt,
            std::time::Duration::from_nanos(info.run_time_ns),
        ))
    }

    /// Attaches the program to `offsets` (file offsets of instructions) in
    /// the ELF file at `path`, each with its cookie, in process `pid` only
    /// (0: every process that maps the file, now or later). Detached when
    /// the returned link is dropped.
    pub fn attach(&self, path: &CStr, probes: &ProbePoints, pid: u32) -> io::Result<Link> {
        let mut link = Vec::new();
        self.attach_each(path, probes, pid, |fd| {
            link.push(fd);
            true
        })?;
        Ok(link)
    }

    /// Attaches as [`Self::attach`] does and hands each descriptor made to
    /// `take` (which returns false to stop). Allocates nothing itself and
    /// calls only `syscall` and `close`, so it may run in a forked child
    /// before exec. In [`AttachMode::PerfEvent`] a probe the kernel
    /// refuses fails the whole file (its descriptors made so far are
    /// handed over all the same, to be dropped with the rest).
    pub fn attach_each(
        &self,
        path: &CStr,
        probes: &ProbePoints,
        pid: u32,
        mut take: impl FnMut(OwnedFd) -> bool,
    ) -> io::Result<()> {
        let (offsets, cookies) = (&probes.offsets, &probes.cookies);
        match self.mode {
            AttachMode::Session | AttachMode::Multi => {
                let attach_type = match self.mode {
                    AttachMode::Session => BPF_TRACE_UPROBE_SESSION,
                    _ => BPF_TRACE_UPROBE_MULTI,
                };
                let fd = create_link(self.fd(), attach_type, path, offsets, cookies, pid)?;
                // SAFETY: a new descriptor that nothing else owns.
                take(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            AttachMode::PerfEvent(pmu) => {
                for (&offset, &cookie) in offsets.iter().zip(cookies) {
                    let entry = cookie | probe_cookie::AT_ENTRY;
                    if !take(pmu.attach(self.fd(), path, offset, false, entry, pid)?) {
                        return Ok(());
                    }
                    if (self.wants_return)(cookie) {
                        let ret = cookie | probe_cookie::AT_RETURN;
                        if !take(pmu.attach(self.fd(), path, offset, true, ret, pid)?) {
                            return Ok(());
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Identity of a file: device and inode.
type FileId = (u64, u64);

/// A link's file and owner (a target process, or 0: every process).
pub type LinkKey = (FileId, u32);

/// Counts of what attaching did, for the exit summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct AttachStats {
    pub links: usize,
    pub failures: u64,
    pub single_stepped: usize,
    /// Files whose probe points were forgotten to keep the cache bounded
    /// (found again if a process maps them later).
    pub files_forgotten: u64,
}

/// One uprobe program's links, made as processes and files appear: one per
/// file for every process (system-wide), or one per file and target
/// process, so that other processes pay nothing.
pub struct UprobeLinks {
    program: ProgramState,
    /// What the probes are for, in logs ("allocator", "Go runtime").
    what: &'static str,
    /// Finds the probe points of a file (None: nothing to probe there).
    find: Finder,
    /// Function names by cookie, for logs.
    names: &'static [&'static str],
    /// Links per target process (true) or per file for every process.
    per_process: bool,
    files: HashMap<FileId, Option<Arc<ProbePoints>>>,
    links: HashMap<(FileId, u32), Link>,
    /// Links detached for a while (a duty cycle: `park_budget`), with the
    /// path to attach them again by; not attached anew meanwhile.
    suspended: HashMap<LinkKey, PathBuf>,
    /// Where dropped links go to be closed (see `link_closer`).
    closer: Arc<LinkCloser>,
    stats: AttachStats,
    /// Causes of failures already logged (each once; bounded).
    causes_logged: HashSet<String>,
}

/// A set of links' program as it is handed over: loaded, or loaded only
/// when the first file to probe is found (Go's heap and park points,
/// which a node without Go programs never needs; design 020).
pub enum LinkProgram {
    Loaded(UprobeProgram),
    AtFirstFile(PreparedProgram),
}

/// A set of links' program: loaded, waiting for its first file, or
/// refused by the kernel when that came (logged once).
enum ProgramState {
    Loaded(Arc<UprobeProgram>),
    Deferred(Box<PreparedProgram>),
    Refused(AttachMode),
}

impl UprobeLinks {
    pub fn new(
        program: LinkProgram,
        (what, find, names): (&'static str, Finder, &'static [&'static str]),
        per_process: bool,
        closer: Arc<LinkCloser>,
    ) -> Self {
        let program = match program {
            LinkProgram::Loaded(program) => ProgramState::Loaded(Arc::new(program)),
            LinkProgram::AtFirstFile(prepared) => ProgramState::Deferred(Box::new(prepared)),
        };
        UprobeLinks {
            program,
            what,
            find,
            names,
            per_process,
            files: HashMap::new(),
            links: HashMap::new(),
            suspended: HashMap::new(),
            closer,
            stats: AttachStats::default(),
            causes_logged: HashSet::new(),
        }
    }

    /// The program, once loaded.
    pub fn program(&self) -> Option<Arc<UprobeProgram>> {
        match &self.program {
            ProgramState::Loaded(program) => Some(Arc::clone(program)),
            _ => None,
        }
    }

    fn mode(&self) -> AttachMode {
        match &self.program {
            ProgramState::Loaded(program) => program.mode(),
            ProgramState::Deferred(prepared) => prepared.mode,
            ProgramState::Refused(mode) => *mode,
        }
    }

    /// Loads a deferred program now; the program, or why not.
    pub fn load_now(&mut self) -> Result<Arc<UprobeProgram>, SessionError> {
        let mode = self.mode();
        match std::mem::replace(&mut self.program, ProgramState::Refused(mode)) {
            ProgramState::Loaded(program) => {
                self.program = ProgramState::Loaded(Arc::clone(&program));
                Ok(program)
            }
            ProgramState::Deferred(prepared) => {
                let name = prepared.name;
                match prepared.load() {
                    Ok(program) => {
                        tracing::debug!("{name} loaded at its first file");
                        let program = Arc::new(program);
                        self.program = ProgramState::Loaded(Arc::clone(&program));
                        Ok(program)
                    }
                    Err(e) => {
                        // Once: the state stays refused.
                        tracing::warn!("{} probes unavailable: {e:#}", self.what);
                        Err(e)
                    }
                }
            }
            ProgramState::Refused(_) => Err(SessionError::Refused),
        }
    }

    pub fn stats(&self) -> AttachStats {
        AttachStats {
            links: self.links.len(),
            ..self.stats
        }
    }

    /// Attaches to every allocator file of `mappings` (one process's) that
    /// is not attached yet (for this process, or for everyone).
    pub fn attach_mappings(&mut self, mappings: &ExecMappings) {
        let pid = mappings.pid;
        for map in &mappings.files {
            let owner = if self.per_process { pid } else { 0 };
            if self.links.contains_key(&(map.id, owner))
                || self.suspended.contains_key(&(map.id, owner))
            {
                continue;
            }
            let via = map.via(pid);
            let Some(probes) = self.probes_of(map.id, &via, &map.path) else {
                continue;
            };
            self.attach(map.id, owner, &via, &probes);
        }
    }

    /// Where the probed functions' code lies in the address space of
    /// `mappings`' process: `[start, end)` per function, and how many
    /// distinct probed files the process maps.
    pub fn probed_code(&mut self, mappings: &ExecMappings) -> (usize, Vec<(u64, u64)>) {
        let mut files: Vec<FileId> = Vec::new();
        let mut ranges = Vec::new();
        for map in &mappings.files {
            let Some(probes) = self.probes_of(map.id, &map.via(mappings.pid), &map.path) else {
                continue;
            };
            if !files.contains(&map.id) {
                files.push(map.id);
            }
            let mapped = map.offset..map.offset.saturating_add(map.end - map.start);
            for &(start, end) in &probes.functions {
                if mapped.contains(&start) {
                    let at = map.start + (start - map.offset);
                    ranges.push((at, at.saturating_add(end - start)));
                }
            }
        }
        (files.len(), ranges)
    }

    /// Attaches to a file by path for one process (or all: pid 0), before
    /// the process maps it.
    pub fn attach_file(&mut self, path: &Path, pid: u32) {
        let Ok(meta) = fs::metadata(path) else { return };
        let id = (meta.dev(), meta.ino());
        if self.links.contains_key(&(id, pid)) || self.suspended.contains_key(&(id, pid)) {
            return;
        }
        if let Some(probes) = self.probes_of(id, path, path) {
            self.attach(id, pid, path, &probes);
        }
    }

    /// The allocator probes of one file, from the cache or found now.
    fn probes_of(&mut self, id: FileId, open: &Path, shown: &Path) -> Option<Arc<ProbePoints>> {
        if let Some(known) = self.files.get(&id) {
            return known.clone();
        }
        if self.files.len() >= MAX_FILES {
            self.stats.files_forgotten += self.files.len() as u64;
            self.files.clear();
        }
        let found = match (self.find)(open) {
            Ok(found) => found.map(Arc::new),
            Err(e) => {
                tracing::debug!("looking for the {} in {}: {e}", self.what, shown.display());
                None
            }
        };
        if let Some(p) = &found {
            tracing::info!(
                "probes: {} in {} ({} entry points, {}{})",
                self.what,
                shown.display(),
                p.offsets.len(),
                self.mode().describe(),
                if p.single_stepped.is_empty() {
                    String::new()
                } else {
                    let names: Vec<&str> = p
                        .single_stepped
                        .iter()
                        // The low byte names the function; Go's cookies
                        // carry a release's facts above it.
                        .map(|&f| self.names.get((f & 0xff) as usize).copied().unwrap_or("?"))
                        .collect();
                    format!("; single-stepped: {}", names.join(", "))
                }
            );
            self.stats.single_stepped += p.single_stepped.len();
        }
        self.files.insert(id, found.clone());
        found
    }

    fn attach(&mut self, id: FileId, pid: u32, path: &Path, probes: &ProbePoints) {
        if self.links.len() >= MAX_LINKS {
            self.note_failure(path, "too many links");
            return;
        }
        let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
            return;
        };
        let Ok(program) = self.load_now() else {
            // Logged once, where the kernel refused it.
            self.stats.failures += 1;
            return;
        };
        match program.attach(&c_path, probes, pid) {
            Ok(link) => {
                if let Some(old) = self.links.insert((id, pid), link) {
                    self.closer.close_all(old);
                }
            }
            // The process may have exited meanwhile (ESRCH, ENOENT).
            Err(e) => self.note_failure(path, &e.to_string()),
        }
    }

    /// Takes the descriptors that a child made for itself before exec, for
    /// one file.
    pub fn adopt(&mut self, path: &Path, pid: u32, link: Link) {
        if let Ok(meta) = fs::metadata(path)
            && let Some(old) = self.links.insert(((meta.dev(), meta.ino()), pid), link)
        {
            self.closer.close_all(old);
        }
    }

    /// Counts a failure to attach, and logs it the first time its cause
    /// (`reason`) is seen: a process that exited meanwhile and a kernel
    /// that refuses the probe are told apart.
    pub fn note_failure(&mut self, path: &Path, reason: &str) {
        self.stats.failures += 1;
        if self.causes_logged.len() < MAX_CAUSES_LOGGED
            && self.causes_logged.insert(reason.to_string())
        {
            tracing::warn!(
                "attaching {} probes to {} failed: {reason} (further failures of this cause are counted)",
                self.what,
                path.display()
            );
        }
    }

    /// Drops the links of a process that exited.
    pub fn forget_process(&mut self, pid: u32) {
        if pid != 0 {
            for (_, link) in self.links.extract_if(|&(_, owner), _| owner == pid) {
                self.closer.close_all(link);
            }
            self.suspended.retain(|&(_, owner), _| owner != pid);
        }
    }

    /// The link that probes process `tgid`'s executable: its own (per
    /// process), else the one of that file for every process; None when
    /// neither is attached or suspended.
    pub fn link_of(&self, tgid: u32) -> Option<LinkKey> {
        let meta = fs::metadata(format!("/proc/{tgid}/exe")).ok()?;
        let id = (meta.dev(), meta.ino());
        [(id, tgid), (id, 0)]
            .into_iter()
            .find(|key| self.links.contains_key(key) || self.suspended.contains_key(key))
    }

    /// Detaches link `key` until [`Self::resume`], which attaches it again
    /// through `path` (a live process's `/proc/PID/exe`). False when it
    /// was not attached.
    pub fn suspend(&mut self, key: LinkKey, path: PathBuf) -> bool {
        match self.links.remove(&key) {
            Some(link) => {
                self.closer.close_all(link);
                self.suspended.insert(key, path);
                true
            }
            None => false,
        }
    }

    /// Attaches a suspended link again, through `path` where given (the
    /// one it was suspended with may be a process's that exited since);
    /// false when it was not suspended or the attach failed (counted).
    pub fn resume(&mut self, key: LinkKey, path: Option<PathBuf>) -> bool {
        let Some(suspended_with) = self.suspended.remove(&key) else {
            return false;
        };
        let path = path.unwrap_or(suspended_with);
        // The probe points are the file's offsets: never attach them to
        // another file (the process exec'd since, or the pid was reused).
        match fs::metadata(&path) {
            Ok(meta) if (meta.dev(), meta.ino()) == key.0 => {}
            _ => return false,
        }
        let Some(Some(probes)) = self.files.get(&key.0).cloned() else {
            return false;
        };
        self.attach(key.0, key.1, &path, &probes);
        self.links.contains_key(&key)
    }

    /// Detaches everything (the links are closed by the closer: see
    /// [`LinkCloser::finish`]).
    pub fn detach_all(&mut self) {
        self.suspended.clear();
        for (_, link) in self.links.drain() {
            self.closer.close_all(link);
        }
    }
}

/// The descriptor of a map aya created.
fn map_fd(map: &Map) -> Option<RawFd> {
    let data = match map {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::RingBuf(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d) => d,
        _ => return None,
    };
    Some(data.fd().as_fd().as_raw_fd())
}
