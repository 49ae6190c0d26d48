//! Program loads, BTF loads and uprobe_multi links through the raw
//! `bpf` system call, for the uprobe programs that aya 0.14 cannot load
//! with a uprobe_multi or session attach type (see `uprobes`), and the
//! probe that tells whether this kernel has those links.

use std::ffi::CStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type};

/// `BPF_TRACE_UPROBE_SESSION` in `enum bpf_attach_type` (newer than the
/// bindings of aya-obj 0.3).
pub const BPF_TRACE_UPROBE_SESSION: u32 = 57;
/// `BPF_TRACE_UPROBE_MULTI`: entry probes only.
pub const BPF_TRACE_UPROBE_MULTI: u32 = 48;

/// The parts of an object's BTF that a program loaded here passes to the
/// kernel: the object's types (fixed up for this kernel) and the
/// program's function and line records. The verifier needs the function
/// records to check a call through a function pointer (`bpf_loop`'s
/// callbacks, which walk Python frames); the line records name source
/// lines in its log. The types are loaded into the kernel with the
/// program, not before: a program deferred to its first file pays
/// nothing for them until then.
pub struct ProgramBtf {
    pub types: Vec<u8>,
    pub func_info: Vec<u8>,
    pub func_info_rec_size: u32,
    pub line_info: Vec<u8>,
    pub line_info_rec_size: u32,
}

/// The number of records of `rec_size` bytes in `records`.
fn record_count(records: &[u8], rec_size: u32) -> u32 {
    match rec_size {
        0 => 0,
        size => (records.len() / size as usize) as u32,
    }
}

/// Loads an object's BTF (`BPF_BTF_LOAD`).
fn load_btf(bytes: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: bpf_attr is plain data; all-zero is its documented default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: writing plain fields of the BPF_BTF_LOAD member; `bytes`
    // outlives the call.
    unsafe {
        let load = &mut attr.__bindgen_anon_7;
        load.btf = bytes.as_ptr() as u64;
        load.btf_size = bytes.len() as u32;
    }
    let fd = sys_bpf(bpf_cmd::BPF_BTF_LOAD as libc::c_long, &mut attr)?;
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Loads a kprobe-type program (`BPF_PROG_LOAD`), with `btf` where the
/// object has it. On a refusal, the error and the tail of the verifier's
/// log.
pub fn load_program(
    name: &str,
    insns: &[bpf_insn],
    license: &CStr,
    attach_type: u32,
    btf: Option<&ProgramBtf>,
) -> Result<OwnedFd, (io::Error, String)> {
    // The kernel keeps the types as long as the program: the descriptor
    // is needed only for the load. Without them the load goes on, and a
    // program that needs them says why in the verifier's log.
    let types = btf.and_then(|btf| {
        load_btf(&btf.types)
            .inspect_err(|e| tracing::debug!(program = name, error = %e, "BTF not loaded"))
            .ok()
    });
    let mut log = vec![0u8; 1 << 20];
    let mut attempt = |with_log: bool| {
        // SAFETY: bpf_attr is plain data; all-zero is its documented default.
        let mut attr: bpf_attr = unsafe { zeroed() };
        // SAFETY: writing plain fields of the BPF_PROG_LOAD member; the
        // buffers pointed to outlive the call.
        unsafe {
            let load = &mut attr.__bindgen_anon_3;
            load.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
            load.insn_cnt = insns.len() as u32;
            load.insns = insns.as_ptr() as u64;
            load.license = license.as_ptr() as u64;
            load.expected_attach_type = attach_type;
            for (dst, src) in load.prog_name.iter_mut().zip(name.bytes().take(15)) {
                *dst = src as libc::c_char;
            }
            if let (Some(btf), Some(types)) = (btf, &types) {
                load.prog_btf_fd = types.as_raw_fd() as u32;
                let funcs = record_count(&btf.func_info, btf.func_info_rec_size);
                if funcs > 0 {
                    load.func_info = btf.func_info.as_ptr() as u64;
                    load.func_info_cnt = funcs;
                    load.func_info_rec_size = btf.func_info_rec_size;
                }
                let lines = record_count(&btf.line_info, btf.line_info_rec_size);
                if lines > 0 {
                    load.line_info = btf.line_info.as_ptr() as u64;
                    load.line_info_cnt = lines;
                    load.line_info_rec_size = btf.line_info_rec_size;
                }
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

/// `BPF_LINK_CREATE` of a uprobe_multi link (`attach_type`: session or
/// entry-only, as the program was loaded). Allocates nothing and
/// calls only `syscall`, so it may run in a forked child before exec.
pub fn create_link(
    prog_fd: RawFd,
    attach_type: u32,
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
        link.attach_type = attach_type;
        let multi = &mut link.__bindgen_anon_3.uprobe_multi;
        multi.path = path.as_ptr() as u64;
        multi.offsets = offsets.as_ptr() as u64;
        multi.cookies = cookies.as_ptr() as u64;
        multi.cnt = offsets.len() as u32;
        multi.pid = pid;
    }
    sys_bpf(bpf_cmd::BPF_LINK_CREATE as libc::c_long, &mut attr)
}

/// `BPF_LINK_CREATE` of program `prog_fd` to perf event `event_fd` with
/// `cookie` (`BPF_PERF_EVENT`, Linux 5.15), which the program reads with
/// `bpf_get_attach_cookie`. The link holds its own reference to the event.
/// Allocates nothing and calls only `syscall`, so it may run in a forked
/// child before exec.
pub fn link_perf_event(prog_fd: RawFd, event_fd: RawFd, cookie: u64) -> io::Result<RawFd> {
    // SAFETY: bpf_attr is plain data; all-zero is its documented default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: writing plain fields of the BPF_LINK_CREATE member.
    unsafe {
        let create = &mut attr.link_create;
        create.__bindgen_anon_1.prog_fd = prog_fd as u32;
        create.__bindgen_anon_2.target_fd = event_fd as u32;
        create.attach_type = bpf_attach_type::BPF_PERF_EVENT as u32;
        create.__bindgen_anon_3.perf_event.bpf_cookie = cookie;
    }
    sys_bpf(bpf_cmd::BPF_LINK_CREATE as libc::c_long, &mut attr)
}

/// Whether this kernel creates uprobe_multi links of `attach_type`: a
/// program that does nothing is loaded with it and linked to "/", which a
/// kernel that knows the link refuses as not a regular file (EBADF) and
/// one that does not refuses as invalid (EINVAL, at the load or the link).
/// Nothing is attached either way.
pub fn kernel_supports(attach_type: u32) -> bool {
    // r0 = 0 (BPF_ALU64 | BPF_MOV | BPF_K, r0); exit (BPF_JMP | BPF_EXIT).
    // SAFETY: bpf_insn is plain data; all-zero is r0 and no offset.
    let mut insns: [bpf_insn; 2] = unsafe { zeroed() };
    insns[0].code = 0xb7;
    insns[1].code = 0x95;
    let Ok(prog) = load_program("feature_probe", &insns, c"GPL", attach_type, None) else {
        return false;
    };
    match create_link(prog.as_raw_fd(), attach_type, c"/", &[0], &[0], 0) {
        Ok(fd) => {
            // Not expected ("/" is no file to probe), but then it works.
            // SAFETY: a new descriptor that nothing else owns.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            true
        }
        Err(e) => e.raw_os_error() == Some(libc::EBADF),
    }
}

pub fn sys_bpf(cmd: libc::c_long, attr: &mut bpf_attr) -> io::Result<RawFd> {
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
