//! The user stack of an event: a copy of stack memory for the daemon to
//! unwind (`copy.rs`), or a frame-pointer walk by the kernel for processes
//! unwound that way; and walk hints (`hints.rs`), which let a wait record
//! name a walk the daemon already made instead of carrying a copy.

pub(crate) mod copy;
pub(crate) mod hints;

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, pt_regs},
    helpers::{
        bpf_probe_read_kernel, bpf_probe_read_user,
        generated::{bpf_get_current_task_btf, bpf_get_stack, bpf_task_pt_regs},
    },
    macros::map,
    maps::HashMap,
};
use profiler_common::{FpProcess, MAX_STACK_DEPTH, TARGETS_ENTRIES, unwind_mode};

use crate::{
    globals::{UNWIND_MODE, global_u8},
    stack::copy::counted_copy_stack,
};

/// Processes to unwind with frame pointers in `AUTO` mode (set by the daemon,
/// e.g. for Go binaries), with the range of their executable's code.
#[map]
static FP_PROCESSES: HashMap<u32, FpProcess> = HashMap::with_max_entries(TARGETS_ENTRIES, 0);

#[inline(always)]
pub(crate) fn use_dwarf(tgid: u32) -> bool {
    match global_u8(&UNWIND_MODE) {
        unwind_mode::FP => false,
        unwind_mode::DWARF => true,
        // SAFETY: presence check only.
        _ => unsafe { FP_PROCESSES.get(tgid).is_none() },
    }
}

/// The frame-pointer process entry of `tgid`, if it is marked (a pointer
/// into the map: copying it onto the BPF stack on one path only would
/// keep the verifier from merging that path's states with the others').
#[inline(always)]
pub(crate) fn fp_process(tgid: u32) -> Option<*const FpProcess> {
    FP_PROCESSES.get_ptr(tgid)
}

/// The words at the user stack pointer, `[sp]` and `[sp+8]`, each kept
/// only where it points into the code of a process marked in
/// `FP_PROCESSES` with a code range (else 0): one of them is the return
/// address of a leaf that has not set up its frame pointer, whose caller
/// the kernel's frame-pointer walk skips (see `SampleKey::leaf_words`).
/// Words that are not code addresses are dropped so that a framed leaf's
/// changing data does not split its samples.
#[inline(always)]
pub(crate) fn leaf_words(process: &FpProcess, sp: u64) -> [u64; 2] {
    if process.text_end <= process.text_start || sp == 0 {
        return [0; 2];
    }
    // SAFETY: a checked read of user memory.
    let words: [u64; 2] = unsafe { bpf_probe_read_user(sp as *const [u64; 2]) }.unwrap_or([0; 2]);
    [
        if process.holds(words[0]) { words[0] } else { 0 },
        if process.holds(words[1]) { words[1] } else { 0 },
    ]
}

/// Records the current thread's user stack for an event: a copy of up to
/// N bytes from `sp` (into `stack`, N long) for unwinding in the daemon,
/// or frame-pointer frames (into `frames`, MAX_STACK_DEPTH long) walked by
/// the kernel. Returns (bytes copied, frames walked).
#[inline(always)]
pub(crate) unsafe fn record_user_stack<const N: usize>(
    ctx: *mut core::ffi::c_void,
    tgid: u32,
    sp: u64,
    stack: *mut u8,
    frames: *mut u64,
) -> (u64, u64) {
    if sp != 0 && use_dwarf(tgid) {
        // SAFETY: the caller's buffer is N long.
        return (unsafe { counted_copy_stack::<N>(stack, sp) }, 0);
    }
    // SAFETY: as the caller's.
    (0, unsafe { walk_user_stack(ctx, frames) })
}

/// Walks the current thread's user stack by frame pointers into `frames`
/// (MAX_STACK_DEPTH long); returns the frames walked.
#[inline(always)]
pub(crate) unsafe fn walk_user_stack(ctx: *mut core::ffi::c_void, frames: *mut u64) -> u64 {
    // SAFETY: the caller's buffer holds MAX_STACK_DEPTH frames.
    let bytes = unsafe {
        bpf_get_stack(
            ctx,
            frames.cast(),
            (MAX_STACK_DEPTH * 8) as u32,
            BPF_F_USER_STACK as u64,
        )
    };
    if bytes > 0 {
        (bytes as u64 / 8).min(MAX_STACK_DEPTH as u64)
    } else {
        0
    }
}

/// The user registers a program reads: instruction, stack and frame
/// pointers, and R14, which Go code keeps the running goroutine in.
#[derive(Clone, Copy)]
pub(crate) struct UserRegs {
    pub(crate) ip: u64,
    pub(crate) sp: u64,
    pub(crate) bp: u64,
    pub(crate) r14: u64,
}

/// The current task's user instruction pointer as saved on entering the
/// kernel (in a system call: just past its `syscall` instruction).
#[inline(always)]
pub(crate) fn task_user_ip() -> Option<u64> {
    // SAFETY: plain helpers; the pointer is only read through
    // bpf_probe_read_kernel.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs };
    // SAFETY: the address of a field, read by the helper, which checks it.
    unsafe { bpf_probe_read_kernel(core::ptr::addr_of!((*regs).rip)) }.ok()
}

/// The current task's user registers as saved on entering the kernel.
#[inline(always)]
pub(crate) fn task_user_regs() -> Option<UserRegs> {
    // SAFETY: plain helpers; the pointer is only read through
    // bpf_probe_read_kernel.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs };
    // One read of the whole structure costs less than three of a word.
    // SAFETY: a read of a pt_regs, checked by the helper.
    let regs = unsafe { bpf_probe_read_kernel(regs) }.ok()?;
    Some(UserRegs {
        ip: regs.rip,
        sp: regs.rsp,
        bp: regs.rbp,
        r14: regs.r14,
    })
}
