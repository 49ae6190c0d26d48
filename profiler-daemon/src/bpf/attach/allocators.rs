//! Allocator discovery for the heap probes: which files implement malloc
//! and friends (glibc's libc.so.6, jemalloc, tcmalloc, mimalloc, or an
//! allocator linked into the executable) and where in them to put each
//! probe; and the links a command makes for itself before its exec. The
//! links themselves are kept by `uprobes::UprobeLinks`.

use std::collections::HashMap;
use std::ffi::CString;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use procfs::process::{MMPermissions, MMapPath, Process};
use profiler_common::alloc_fn;

use crate::bpf::attach::placement;
use crate::bpf::uprobes::{ProbePoints, UprobeLinks, UprobeProgram};

/// Finds the allocator entry points that `path` defines. None when it does
/// not define both malloc and free (most files).
pub fn find(path: &Path) -> Result<Option<ProbePoints>, String> {
    let data = super::map_file(path)?;
    find_in(&data).map_err(|e| format!("{}: {e}", path.display()))
}

/// [`find`] on the bytes of a file: any bytes, as a file on disk may be
/// truncated, corrupt or not ELF at all.
pub fn find_in(data: &[u8]) -> Result<Option<ProbePoints>, String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    // Defined functions by name; dynamic symbols first (what callers bind
    // to), then the full table of a static executable.
    let mut by_name: HashMap<&str, (u64, u64)> = HashMap::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        if symbol.is_undefined() || symbol.kind() != SymbolKind::Text {
            continue;
        }
        // Compared as bytes: a UTF-8 check of every name of a large
        // symbol table was a tenth of a start's CPU.
        let Ok(bytes) = symbol.name_bytes() else {
            continue;
        };
        if let Some(name) = alloc_fn::NAMES.iter().find(|n| n.as_bytes() == bytes) {
            by_name
                .entry(name)
                .or_insert((symbol.address(), symbol.size()));
        }
    }
    if !by_name.contains_key("malloc") || !by_name.contains_key("free") {
        return Ok(None);
    }
    let mut probes = ProbePoints {
        offsets: Vec::new(),
        cookies: Vec::new(),
        single_stepped: Vec::new(),
        functions: Vec::new(),
    };
    let mut seen_addresses = Vec::new();
    for (cookie, name) in alloc_fn::NAMES.iter().enumerate() {
        let Some(&(address, size)) = by_name.get(name) else {
            continue;
        };
        // Aliases (glibc's memalign and aligned_alloc) share one probe: two
        // would count each call twice.
        if seen_addresses.contains(&address) {
            continue;
        }
        seen_addresses.push(address);
        let Some((offset, code)) = code_at(&file, data, address, size) else {
            continue;
        };
        // A symbol without a size gives no range: a call from it is taken
        // for the program's own.
        if size > 0 {
            probes.functions.push((offset, offset.saturating_add(size)));
        }
        let placement = placement::choose(code, address);
        if !placement.emulated {
            probes.single_stepped.push(cookie as u64);
        }
        // Within the file by construction, but the numbers come from it.
        let Some(offset) = offset.checked_add(placement.offset) else {
            continue;
        };
        probes.offsets.push(offset);
        probes.cookies.push(cookie as u64);
    }
    Ok(Some(probes))
}

/// The file offset of `address` and the function's bytes (`size`, or a
/// bounded prefix when the symbol has no size).
pub(crate) fn code_at<'d>(
    file: &object::File<'d>,
    data: &'d [u8],
    address: u64,
    size: u64,
) -> Option<(u64, &'d [u8])> {
    let segments = file.segments().map(|segment| {
        let (file_start, file_size) = segment.file_range();
        (segment.address(), file_start, file_size)
    });
    code_in(segments, data, address, size)
}

/// [`code_at`] over `(address, file offset, file size)` of each segment.
/// Checked arithmetic throughout: a corrupt file's numbers may be anything.
fn code_in(
    mut segments: impl Iterator<Item = (u64, u64, u64)>,
    data: &[u8],
    address: u64,
    size: u64,
) -> Option<(u64, &[u8])> {
    let size = if size == 0 { 64 } else { size.min(64 * 1024) };
    segments.find_map(|(start, file_start, file_size)| {
        let offset_in = address.checked_sub(start)?;
        if offset_in >= file_size {
            return None;
        }
        let offset = file_start.checked_add(offset_in)?;
        let end = offset
            .saturating_add(size)
            .min(file_start.saturating_add(file_size))
            .min(data.len() as u64);
        let code = data.get(usize::try_from(offset).ok()?..usize::try_from(end).ok()?)?;
        // A symbol at the very end of the file's bytes has no code to place
        // a probe in.
        (!code.is_empty()).then_some((offset, code))
    })
}

/// Allocator files a command will map that can be known before it starts:
/// its executable, when it has an allocator of its own, and the allocators
/// this daemon maps (the system's libc). Others are attached once the
/// process maps them.
pub fn files_before_exec(program: &Path) -> Vec<(PathBuf, ProbePoints)> {
    let mut out: Vec<(PathBuf, ProbePoints)> = Vec::new();
    let mut candidates = vec![program.to_path_buf()];
    if let Ok(me) = Process::myself()
        && let Ok(maps) = me.maps()
    {
        for map in maps {
            if let MMapPath::Path(path) = map.pathname
                && map.perms.contains(MMPermissions::EXECUTE)
                && !candidates.contains(&path)
            {
                candidates.push(path);
            }
        }
    }
    for path in candidates {
        if let Ok(Some(probes)) = find(&path) {
            out.push((path, probes));
        }
    }
    out
}

/// Resolves a command name as execvp does (a name without '/' is looked up
/// in PATH).
pub fn resolve_program(name: &std::ffi::OsStr) -> Option<PathBuf> {
    let path = Path::new(name);
    if name.as_bytes().contains(&b'/') {
        return Some(path.to_path_buf());
    }
    let dirs = std::env::var_os("PATH")?;
    std::env::split_paths(&dirs)
        .map(|d| d.join(path))
        .find(|p| p.is_file())
}

/// Heap-probe links that a command makes for itself between fork and exec,
/// so that its first allocation is already seen: the daemon cannot, since
/// `spawn` returns only after the exec. The child creates one link per
/// allocator file with its own pid and passes each descriptor back over a
/// socket (SCM_RIGHTS).
pub struct PreExecLinks {
    program: Arc<UprobeProgram>,
    files: Vec<(PathBuf, CString, ProbePoints)>,
    parent: UnixDatagram,
    child: UnixDatagram,
}

impl PreExecLinks {
    pub fn prepare(links: &UprobeLinks, program: &Path) -> std::io::Result<Self> {
        let (parent, child) = UnixDatagram::pair()?;
        parent.set_nonblocking(true)?;
        let files: Vec<_> = files_before_exec(program)
            .into_iter()
            .filter_map(|(path, probes)| {
                let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
                Some((path, c_path, probes))
            })
            .collect();
        // The allocators' program is loaded at the start, never deferred.
        let program = links
            .program()
            .ok_or_else(|| std::io::Error::other("the allocator program is not loaded"))?;
        for (path, _, probes) in &files {
            tracing::info!(
                "probes: allocator in {} ({} entry points, {}; made by the command before its exec)",
                path.display(),
                probes.offsets.len(),
                program.mode().describe()
            );
        }
        Ok(PreExecLinks {
            program,
            files,
            parent,
            child,
        })
    }

    /// Runs in the forked child before exec: allocates nothing, calls only
    /// getpid, perf_event_open, bpf, sendmsg and close. A failure leaves
    /// the command unprobed but running; the daemon notices the missing
    /// links.
    pub fn in_child(&self) {
        // SAFETY: plain system call.
        let pid = unsafe { libc::getpid() } as u32;
        for (index, (_, path, probes)) in self.files.iter().enumerate() {
            let _ = self.program.attach_each(path, probes, pid, |fd| {
                send_fd(self.child.as_raw_fd(), index as u8, fd.as_raw_fd());
                // Dropping ours closes it; the daemon now holds a copy.
                true
            });
        }
    }

    /// In the daemon after the spawn: adopts the links the child sent.
    pub fn collect(self, pid: u32, links: &mut UprobeLinks) {
        let mut received: Vec<Vec<OwnedFd>> = self.files.iter().map(|_| Vec::new()).collect();
        while let Some((index, fd)) = recv_fd(self.parent.as_raw_fd()) {
            if let Some(fds) = received.get_mut(index as usize) {
                fds.push(fd);
            }
        }
        let mut adopted = 0;
        for ((path, _, _), fds) in self.files.iter().zip(received) {
            if !fds.is_empty() {
                links.adopt(path, pid, fds);
                adopted += 1;
            }
        }
        if adopted < self.files.len() {
            links.note_failure(
                Path::new("the command"),
                &format!("{} of {} links made before exec", adopted, self.files.len()),
            );
        }
    }
}

/// Sends one descriptor with a one-byte tag. Stack buffers only.
fn send_fd(socket: RawFd, tag: u8, fd: RawFd) {
    let mut byte = [tag];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr carrying one int, 8-byte aligned.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; the buffers outlive the call and the
    // CMSG macros stay within `control`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        libc::sendmsg(socket, &msg, 0);
    }
}

/// Receives one tagged descriptor; None when no more are queued.
fn recv_fd(socket: RawFd) -> Option<(u8, OwnedFd)> {
    let mut byte = [0u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    // SAFETY: as in send_fd; the received descriptor is new and ours.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        if libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) <= 0 {
            return None;
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return None;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
        Some((byte[0], OwnedFd::from_raw_fd(fd)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    mod properties {
        use super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;

        fn number() -> impl Strategy<Value = u64> {
            prop_oneof![0..256u64, Just(u64::MAX), Just(u64::MAX - 1), any::<u64>()]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            /// Whatever a file's segments and symbols say, the code found
            /// lies in the file, at the offset reported, within the segment.
            #[test]
            fn code_is_inside_the_file(
                segments in vec((number(), number(), number()), 0..4),
                data in vec(any::<u8>(), 0..128),
                address in number(),
                size in number(),
            ) {
                if let Some((offset, code)) = code_in(segments.iter().copied(), &data, address, size) {
                    prop_assert!(!code.is_empty());
                    let at = usize::try_from(offset).expect("offset inside the data");
                    prop_assert!(at + code.len() <= data.len());
                    prop_assert_eq!(&data[at..at + code.len()], code);
                    prop_assert!(code.len() as u64 <= size.clamp(1, 64 * 1024).max(64));
                    let in_a_segment = segments.iter().any(|&(start, file_start, file_size)| {
                        address >= start
                            && address - start < file_size
                            && file_start.checked_add(address - start) == Some(offset)
                    });
                    prop_assert!(in_a_segment);
                }
            }

            /// Any bytes as a file: an error or probe points, never a panic.
            #[test]
            fn any_bytes_as_a_file(data in vec(any::<u8>(), 0..256)) {
                let _ = find_in(&data);
            }
        }
    }

    #[test]
    fn finds_glibc_allocator_with_emulated_probes() {
        let Some(libc) = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists()) else {
            return;
        };
        let probes = find(libc).expect("readable").expect("libc has malloc");
        let has = |f: u64| probes.cookies.contains(&f);
        for f in [
            alloc_fn::MALLOC,
            alloc_fn::FREE,
            alloc_fn::CALLOC,
            alloc_fn::REALLOC,
        ] {
            assert!(has(f), "{}", alloc_fn::NAMES[f as usize]);
        }
        // memalign and aligned_alloc are one function in glibc: one probe.
        let mut sorted = probes.offsets.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), probes.offsets.len(), "no offset twice");
        // Every frequent entry point is emulated; only reallocarray (a
        // multiply of its arguments first) may be single-stepped.
        assert!(
            probes
                .single_stepped
                .iter()
                .all(|&f| f == alloc_fn::REALLOCARRAY),
            "{probes:?}"
        );
        // Each probe lies in its function's code, which a call returning
        // into it is told by (allocator_callers).
        assert_eq!(probes.functions.len(), probes.offsets.len(), "{probes:?}");
        for (&offset, &(start, end)) in probes.offsets.iter().zip(&probes.functions) {
            assert!(
                start <= offset && offset < end,
                "{offset:#x} in {start:#x}..{end:#x}"
            );
        }
    }

    #[test]
    fn ordinary_files_have_no_allocator() {
        let exe = std::env::current_exe().expect("test executable");
        // A Rust test binary calls malloc but does not define it.
        assert_eq!(find(&exe).expect("readable"), None);
    }
}
