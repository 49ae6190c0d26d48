//! Copies of user stack memory, stopped at each thread's known stack top
//! (`STACK_TOPS`), and the choice of the record form: the short one for a
//! stack known to fit it, the long one for a thread the daemon marked deep
//! (`DEEP_THREADS`).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated::bpf_probe_read_user},
    macros::map,
    maps::LruHashMap,
};
use profiler_common::{DEEP_THREADS_ENTRIES, STACK_TOPS_ENTRIES, counter};

use crate::{
    counters::{count, count_n},
    globals::{LONG_RECORDS, SHORT_RECORDS, USE_STACK_TOPS, global_u8},
    klog::{self, klog, why},
};

/// The top of each thread's stack mapping, learned by the first stack copy
/// that reached it (see copy_stack).
#[map]
pub(crate) static STACK_TOPS: LruHashMap<u32, u64> =
    LruHashMap::with_max_entries(STACK_TOPS_ENTRIES, 0);

/// Threads whose walks ran past the end of their usual copy, marked by the
/// daemon: their copies use the long record form (LONG_STACK_BYTES). The
/// value is unused. An entry goes at the thread's exit.
#[map]
pub(crate) static DEEP_THREADS: LruHashMap<u32, u8> =
    LruHashMap::with_max_entries(DEEP_THREADS_ENTRIES, 0);

/// Whether thread `tid`'s copy from `sp` takes the long record form: the
/// daemon marked the thread deep, and no known top says its stack fits in
/// the usual `n` bytes.
#[inline(always)]
pub(crate) fn needs_long_copy(tid: u32, sp: u64, n: usize) -> bool {
    if global_u8(&LONG_RECORDS) == 0 {
        return false;
    }
    // SAFETY: only the entry's presence is read.
    if unsafe { DEEP_THREADS.get(tid) }.is_none() {
        return false;
    }
    let top = stack_top(tid);
    !(top > sp && top - sp <= n as u64)
}

/// Whether thread `tid`'s stack from `sp` to its known top (STACK_TOPS)
/// fits in N bytes: then a record with an N-byte copy holds all of it.
#[inline(always)]
pub(crate) fn stack_fits(tid: u32, sp: u64, n: usize) -> bool {
    if global_u8(&SHORT_RECORDS) == 0 {
        return false;
    }
    let top = stack_top(tid);
    top > sp && top - sp < n as u64
}

/// Where thread `tid`'s stack ends, if known (0: not known, or stack tops
/// are off).
#[inline(always)]
fn stack_top(tid: u32) -> u64 {
    if global_u8(&USE_STACK_TOPS) == 0 {
        return 0;
    }
    // SAFETY: the value is copied out.
    unsafe { STACK_TOPS.get(tid) }.copied().unwrap_or(0)
}

/// [`copy_stack`], counted in STACK_COPIES and STACK_BYTES_COPIED.
#[inline(always)]
pub(crate) unsafe fn counted_copy_stack<const N: usize>(dst: *mut u8, sp: u64) -> u64 {
    // SAFETY: as the caller's.
    let copied = unsafe { copy_stack::<N>(dst, sp) };
    count(counter::STACK_COPIES);
    count_n(counter::STACK_BYTES_COPIED, copied);
    copied
}

/// Copies up to N bytes of user stack from `sp` into `dst` (N long, a
/// multiple of the page size), stopping at the top of the thread's stack.
///
/// A read that runs past the top of the stack faults, and a faulting read
/// costs about a microsecond: more than the copy. So the top, found once
/// per thread by copying page by page, is remembered in STACK_TOPS and
/// later copies read exactly up to it.
#[inline(always)]
unsafe fn copy_stack<const N: usize>(dst: *mut u8, sp: u64) -> u64 {
    const PAGE: u64 = 4096;
    let tid = bpf_get_current_pid_tgid() as u32;
    let top = stack_top(tid);
    if top > sp && top - sp < N as u64 {
        let len = (top - sp) as u32;
        // The bounds the verifier needs for the length.
        if len > 0 && len <= N as u32 {
            // SAFETY: len <= N, the length of dst.
            if unsafe { bpf_probe_read_user(dst.cast(), len, sp as *const _) } == 0 {
                return u64::from(len);
            }
        }
    } else {
        // Deep in the stack (or its top not known yet): all of it at once.
        // SAFETY: dst is N long.
        if unsafe { bpf_probe_read_user(dst.cast(), N as u32, sp as *const _) } == 0 {
            return N as u64;
        }
    }
    // Up to the end of sp's page first, then whole pages, until a page
    // cannot be read: the top of the stack.
    let first = PAGE - (sp & (PAGE - 1));
    // SAFETY: first <= PAGE <= N.
    if unsafe { bpf_probe_read_user(dst.cast(), first as u32, sp as *const _) } != 0 {
        klog!(why::STACK_FAULT, klog::tgid(), tid, sp);
        return 0;
    }
    let mut copied = first;
    for _ in 0..(N as u64 / PAGE - 1) {
        // Bounds the offset for the verifier: copied + PAGE must fit.
        if copied > N as u64 - PAGE {
            break;
        }
        // SAFETY: copied + PAGE <= N.
        let ok = unsafe {
            bpf_probe_read_user(
                dst.add(copied as usize).cast(),
                PAGE as u32,
                (sp + copied) as *const _,
            )
        };
        if ok != 0 {
            klog!(why::STACK_SHORTENED, klog::tgid(), tid, sp, copied);
            if global_u8(&USE_STACK_TOPS) != 0 {
                let _ = STACK_TOPS.insert(tid, sp + copied, 0);
            }
            break;
        }
        copied += PAGE;
    }
    copied
}
