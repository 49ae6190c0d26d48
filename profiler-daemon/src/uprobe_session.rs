//! Uprobe sessions: one program that runs at a function's entry and, only
//! when the entry asks for it (returns 0), at the function's return
//! (`BPF_TRACE_UPROBE_SESSION`, Linux 6.13+). The heap probes use them so
//! that an unsampled allocation pays no return probe.
//!
//! aya 0.14 neither loads a program with this expected attach type nor
//! creates uprobe_multi links, so this module does both with the raw `bpf`
//! system call: it relocates the program's instructions with aya-obj against
//! the maps aya has already created, and loads them itself.

use std::collections::HashSet;
use std::ffi::CStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use aya::Ebpf;
use aya::maps::Map;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_insn, bpf_prog_info, bpf_prog_type};
use thiserror::Error;

/// `BPF_TRACE_UPROBE_SESSION` in `enum bpf_attach_type` (newer than the
/// bindings of aya-obj 0.3).
const BPF_TRACE_UPROBE_SESSION: u32 = 57;

#[derive(Debug, Error)]
pub enum SessionError {
    #[error("parsing the eBPF object: {0}")]
    Parse(String),
    #[error("eBPF program {0} is missing from the object")]
    MissingProgram(String),
    #[error("relocating eBPF program {name}: {reason}")]
    Relocate { name: String, reason: String },
    #[error(
        "loading eBPF program {name} as a uprobe session failed (needs Linux 6.13 or later): {source}\n{log}"
    )]
    Load {
        name: String,
        #[source]
        source: io::Error,
        log: String,
    },
}

/// A loaded uprobe-session program.
pub struct SessionProgram {
    fd: OwnedFd,
}

impl SessionProgram {
    /// Loads program `name` of `object` (the same bytes `ebpf` was loaded
    /// from), with its map references pointing at `ebpf`'s maps. Call it
    /// before any map is taken out of `ebpf`.
    pub fn load(object: &[u8], ebpf: &Ebpf, name: &str) -> Result<Self, SessionError> {
        let mut obj =
            aya_obj::Object::parse(object).map_err(|e| SessionError::Parse(e.to_string()))?;
        let relocate = |reason: String| SessionError::Relocate {
            name: name.to_string(),
            reason,
        };
        let objects: Vec<(String, aya_obj::Map)> = obj.maps.drain().collect();
        let mut maps = Vec::with_capacity(objects.len());
        for (map_name, map_obj) in &objects {
            // Maps the kernel does not need (none today) are simply absent.
            if let Some(fd) = ebpf.map(map_name).and_then(map_fd) {
                maps.push((map_name.as_str(), fd, map_obj));
            }
        }
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        obj.relocate_maps(maps.into_iter(), &text_sections)
            .map_err(|e| relocate(e.to_string()))?;
        obj.relocate_calls(&text_sections)
            .map_err(|e| relocate(e.to_string()))?;
        let program = obj
            .programs
            .get(name)
            .ok_or_else(|| SessionError::MissingProgram(name.to_string()))?;
        let function = obj
            .functions
            .get(&program.function_key())
            .ok_or_else(|| SessionError::MissingProgram(name.to_string()))?;
        let fd =
            load_program(name, &function.instructions, &obj.license).map_err(|(source, log)| {
                SessionError::Load {
                    name: name.to_string(),
                    source,
                    log,
                }
            })?;
        Ok(SessionProgram { fd })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
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
    pub fn attach(
        &self,
        path: &CStr,
        offsets: &[u64],
        cookies: &[u64],
        pid: u32,
    ) -> io::Result<OwnedFd> {
        let fd = create_link(self.fd(), path, offsets, cookies, pid)?;
        // SAFETY: a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
        | Map::StackTraceMap(d) => d,
        _ => return None,
    };
    Some(data.fd().as_fd().as_raw_fd())
}

fn load_program(
    name: &str,
    insns: &[bpf_insn],
    license: &CStr,
) -> Result<OwnedFd, (io::Error, String)> {
    let mut log = vec![0u8; 1 << 20];
    let mut attempt = |with_log: bool| {
        // SAFETY: bpf_attr is plain data; all-zero is its documented default.
        let mut attr: bpf_attr = unsafe { zeroed() };
        // SAFETY: writing plain fields of the BPF_PROG_LOAD member.
        unsafe {
            let load = &mut attr.__bindgen_anon_3;
            load.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
            load.insn_cnt = insns.len() as u32;
            load.insns = insns.as_ptr() as u64;
            load.license = license.as_ptr() as u64;
            load.expected_attach_type = BPF_TRACE_UPROBE_SESSION;
            for (dst, src) in load.prog_name.iter_mut().zip(name.bytes().take(15)) {
                *dst = src as libc::c_char;
            }
            if with_log {
                load.log_level = 1;
                load.log_size = log.len() as u32;
                load.log_buf = log.as_mut_ptr() as u64;
            }
        }
        sys_bpf(bpf_cmd::BPF_PROG_LOAD as libc::c_long, &mut attr)
    };
    match attempt(false) {
        // SAFETY: a new descriptor that nothing else owns.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(first) => {
            // Again with the verifier's log, to say why.
            let _ = attempt(true);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            Err((first, tail.into_iter().rev().collect::<Vec<_>>().join("\n")))
        }
    }
}

/// `BPF_LINK_CREATE` of a uprobe_multi session link. Allocates nothing and
/// calls only `syscall`, so it may run in a forked child before exec.
pub fn create_link(
    prog_fd: RawFd,
    path: &CStr,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
) -> io::Result<RawFd> {
    if offsets.len() != cookies.len() || offsets.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: bpf_attr is plain data; all-zero is its documented default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: writing plain fields of the BPF_LINK_CREATE member.
    unsafe {
        let link = &mut attr.link_create;
        link.__bindgen_anon_1.prog_fd = prog_fd as u32;
        link.attach_type = BPF_TRACE_UPROBE_SESSION;
        let multi = &mut link.__bindgen_anon_3.uprobe_multi;
        multi.path = path.as_ptr() as u64;
        multi.offsets = offsets.as_ptr() as u64;
        multi.cookies = cookies.as_ptr() as u64;
        multi.cnt = offsets.len() as u32;
        multi.pid = pid;
    }
    sys_bpf(bpf_cmd::BPF_LINK_CREATE as libc::c_long, &mut attr)
}

fn sys_bpf(cmd: libc::c_long, attr: &mut bpf_attr) -> io::Result<RawFd> {
    // SAFETY: attr is a valid bpf_attr whose pointers stay alive for the
    // call (the callers' borrows outlive it).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut bpf_attr,
            size_of::<bpf_attr>() as libc::c_uint,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as RawFd)
}
