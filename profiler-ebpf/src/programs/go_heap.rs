//! `go_heap_probe`, the Go runtime's points of heap profiles: Go allocates
//! without malloc and samples its allocations itself, by its own
//! `MemProfileRate`; these probes record what it samples and when the
//! collector frees it, into the same live set and ring as `heap_probe`.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user as read_user,
        generated::bpf_get_attach_cookie,
    },
    macros::map,
    maps::LruHashMap,
    programs::ProbeContext,
};
use profiler_common::{GO_FREEING_ENTRIES, alloc_fn, counter, go_heap_fn, probe_cookie};

use crate::{
    counters::count,
    globals::{SELF_TGID, global},
    klog,
    programs::heap::{keep_sample, retire},
};

/// The object whose special record each sweeping thread is freeing (by
/// thread id), from `freeSpecial`'s entry to `mProf_Free`'s.
#[map]
static GO_FREEING: LruHashMap<u32, u64> = LruHashMap::with_max_entries(GO_FREEING_ENTRIES, 0);

/// Attached to `runtime.mProf_Malloc`, `runtime.freeSpecial` and, for a
/// release whose special records' layout is not known, `runtime.mProf_Free`
/// of Go executables (the cookie says which, and where `mProf_Malloc`'s
/// arguments and a special record's kind are in the release that built it).
/// Entry probes only: a return probe would move a return address that
/// Go's stack copying must find.
///
/// The runtime calls `mProf_Malloc` for each allocation it samples, on
/// the allocating goroutine's stack; it frees a sampled object's profile
/// record in the sweep after the object died, in `freeSpecial` (which
/// frees every kind of special record): the record's kind tells a profile
/// record. Where the kind cannot be read, `freeSpecial` keeps the object's
/// address for the thread and `mProf_Free`, which the runtime calls only
/// for a profile record, retires it: one probe more per free.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn go_heap_probe(ctx: *mut core::ffi::c_void) -> u32 {
    klog::run(ProbeContext::new(ctx), try_go_heap)
}

#[inline(always)]
fn try_go_heap(ctx: ProbeContext) -> Result<u32, u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tgid == global(&SELF_TGID) {
        return Ok(0);
    }
    let regs = ctx.regs;
    // SAFETY: plain helper on our own context; checked context loads of
    // the user's pt_regs (Go's register ABI: RAX, RBX, RCX, ...).
    let (cookie, rax, rbx, rcx) = unsafe {
        (
            bpf_get_attach_cookie(ctx.as_ptr()) & probe_cookie::FUNCTION,
            (*regs).rax,
            (*regs).rbx,
            (*regs).rcx,
        )
    };
    let (addr, size) = match cookie & go_heap_fn::FUNCTION {
        go_heap_fn::MALLOC => (rax, rbx),
        go_heap_fn::MALLOC_WITH_M => (rbx, rcx),
        go_heap_fn::FREE_SPECIAL => {
            let (kind_offset, profile_kind) = go_heap_fn::special_layout_of(cookie);
            if kind_offset == 0 {
                let _ = GO_FREEING.insert(tid, rbx, 0);
            } else if special_kind(rax, kind_offset) == Some(profile_kind) {
                retire(tgid, rbx);
            }
            return Ok(0);
        }
        go_heap_fn::PROFILE_FREE => {
            // SAFETY: the value is copied out.
            if let Some(&addr) = unsafe { GO_FREEING.get(tid) } {
                let _ = GO_FREEING.remove(tid);
                count(counter::GO_FREES_AT_PROFILE_FREE);
                retire(tgid, addr);
            }
            return Ok(0);
        }
        _ => return Ok(0),
    };
    if addr == 0 {
        return Ok(0);
    }
    count(counter::GO_HEAP_SAMPLES);
    keep_sample(&ctx, tgid, tid, alloc_fn::GO_RUNTIME as u32, addr, size);
    Ok(0)
}

/// The kind byte of the special record at `special`, `kind_offset` bytes
/// in.
#[inline(always)]
fn special_kind(special: u64, kind_offset: u64) -> Option<u8> {
    // SAFETY: a checked read of user memory.
    unsafe { read_user((special + kind_offset) as *const u8) }.ok()
}
