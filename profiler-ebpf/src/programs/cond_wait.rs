//! The entry probe of `pthread_cond_*wait`: which condition variable a
//! thread's next futex wait belongs to (the `cond` label of block
//! samples).

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::btf_map, programs::ProbeContext};
use profiler_common::{COND_BYTES, CondWait};

use crate::{
    globals::{BLOCK_ON, SELF_TGID, global, global_u8},
    process::is_target,
    task_storage::TaskStorage,
};

/// The condition variable each thread last entered a wait on (the
/// `cond_wait_probe` at `pthread_cond_*wait`); made at a thread's first
/// such wait and freed with the thread.
#[btf_map]
static COND_WAITS: TaskStorage<CondWait> = TaskStorage::new();

/// `pthread_cond_wait`, `pthread_cond_timedwait` and
/// `pthread_cond_clockwait` (every symbol version), entry only.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn cond_wait_probe(ctx: *mut core::ffi::c_void) -> u32 {
    let (Ok(ret) | Err(ret)) = try_cond_wait(ProbeContext::new(ctx));
    ret
}

/// At `pthread_cond_*wait`'s entry: the thread notes the condition and
/// mutex it is about to wait with (the first two arguments).
#[inline(always)]
fn try_cond_wait(ctx: ProbeContext) -> Result<u32, u32> {
    if global_u8(&BLOCK_ON) == 0 {
        return Ok(0);
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == global(&SELF_TGID) || !is_target(tgid) {
        return Ok(0);
    }
    let regs = ctx.regs;
    // SAFETY: checked context loads of the user's pt_regs.
    let wait = unsafe {
        CondWait {
            cond: (*regs).rdi,
            mutex: (*regs).rsi,
        }
    };
    if let Some(slot) = COND_WAITS.current(true) {
        // SAFETY: the current thread's value; only its own programs touch it.
        unsafe { *slot = wait };
    }
    Ok(0)
}

/// The condition variable a wait on futex word `uaddr` belongs to: the one
/// the thread last entered a wait on, when the word lies within it (the
/// wait to take its mutex again, or any later wait elsewhere, does not).
#[inline(always)]
pub(crate) fn cond_of(uaddr: u64) -> u64 {
    let Some(slot) = COND_WAITS.current(false) else {
        return 0;
    };
    // SAFETY: the current thread's value.
    let cond = unsafe { (*slot).cond };
    if cond != 0 && uaddr >= cond && uaddr - cond < COND_BYTES {
        cond
    } else {
        0
    }
}
