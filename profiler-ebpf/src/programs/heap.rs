//! `heap_probe`, the allocator uprobe session of heap profiles: Go's
//! Poisson sampling by bytes, sampled allocations kept live by address
//! until freed, records with the allocating stack (and a CPython
//! thread's Python frames).

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_F_NO_PREALLOC,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_user as read_user,
        generated::{
            bpf_get_attach_cookie, bpf_get_func_ip, bpf_get_prandom_u32, bpf_ktime_get_ns,
        },
    },
    macros::map,
    maps::{Array, HashMap, LruHashMap, RingBuf},
    programs::ProbeContext,
};
use profiler_common::{
    ALLOC_CALLER_RANGES, ALLOC_CALLERS_ENTRIES, AllocCallers, COMM_LEN, HEAP_EVENTS_BYTES,
    HEAP_LIVE_ENTRIES, HEAP_PY_FRAMES, HEAP_THREADS_ENTRIES, HeapAlloc, HeapFree, HeapThread,
    LONG_STACK_BYTES, LiveKey, PyFrames, SHORT_STACK_BYTES, STACK_COPY_BYTES, WithPython, alloc_fn,
    counter, heap_event, probe_cookie, sampling::next_sample_distance,
};

use crate::{
    counters::count,
    globals::{HEAP_EVENTS_RING, HEAP_SAMPLE_BYTES, SELF_TGID, SHORT_RECORDS, global, global_u8},
    klog::{self, klog, why},
    maps::wake_flag,
    process::{anchor_young_image, note_process},
    python_records::{copy_python_frames, heap_python_frames},
    stack::{
        copy::{needs_long_copy, stack_fits},
        record_user_stack, use_dwarf, walk_user_stack,
    },
};

/// Heap sampling state per thread id.
#[map]
pub(crate) static HEAP_THREADS: LruHashMap<u32, HeapThread> =
    LruHashMap::with_max_entries(HEAP_THREADS_ENTRIES, 0);

/// Sampled allocations still live, by process and address.
#[map]
static HEAP_LIVE: HashMap<LiveKey, u64> =
    HashMap::with_max_entries(HEAP_LIVE_ENTRIES, BPF_F_NO_PREALLOC);

/// The allocator functions of each process that maps two allocator files
/// or more (the daemon writes them; other processes have no entry).
#[map]
static ALLOC_CALLERS: HashMap<u32, AllocCallers> =
    HashMap::with_max_entries(ALLOC_CALLERS_ENTRIES, BPF_F_NO_PREALLOC);

/// 1 while any process has an `ALLOC_CALLERS` entry: until then (on most
/// nodes, always) an allocator call costs no hash lookup, only this
/// array's, which the verifier inlines.
#[map]
static ALLOC_CALLERS_ON: Array<u32> = Array::with_max_entries(1, 0);

#[map]
static HEAP_EVENTS: RingBuf = RingBuf::with_byte_size(HEAP_EVENTS_BYTES, 0);

/// The allocator probes of heap profiles, attached as a uprobe session to
/// every allocator entry point (the cookie names the function). The same
/// program runs at a call's entry and, when the entry returned 0, at its
/// return.
///
/// At entry an unsampled malloc or calloc only counts its bytes down and
/// returns 1, so that its return costs nothing. A call that exhausts the
/// thread's byte budget is sampled: its return records the address, the
/// size and the caller's stack. The other allocation functions always ask
/// for their return, because some allocators implement them with a call to
/// malloc (glibc's realloc(NULL, n), memalign with a small alignment): a
/// call entered while another is pending, deeper on the same stack, is
/// nested and not counted again. free, and realloc of a sampled address,
/// retire the address.
///
/// On kernels without uprobe sessions the same program is attached as two
/// perf-event uprobes per function, one at its entry and one at its
/// return, told apart by the cookie (`probe_cookie`); every call then runs
/// the return probe, and the pending state below decides, as in a session,
/// which return is recorded.
///
/// Written without aya's `#[uprobe]` macro, which returns 0 whatever the
/// function returns: in a session that would ask for every return.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn heap_probe(ctx: *mut core::ffi::c_void) -> u32 {
    klog::run(ProbeContext::new(ctx), |ctx| {
        // SAFETY: plain helper on our own context.
        let cookie = unsafe { bpf_get_attach_cookie(ctx.regs.cast()) };
        let result = try_heap_probe(ctx, cookie);
        if cookie & (probe_cookie::AT_ENTRY | probe_cookie::AT_RETURN) != 0 {
            // A perf-event uprobe: anything but 0 would also write a perf
            // sample, which nobody reads.
            return Ok(0);
        }
        result
    })
}

#[inline(always)]
fn try_heap_probe(ctx: ProbeContext, cookie: u64) -> Result<u32, u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tgid == global(&SELF_TGID) {
        return Ok(1);
    }
    let regs = ctx.regs;
    // SAFETY: the context of a uprobe is the user's pt_regs; these are
    // checked context loads.
    let (sp, arg0, arg1, arg2) = unsafe { ((*regs).rsp, (*regs).rdi, (*regs).rsi, (*regs).rdx) };
    let function = cookie & probe_cookie::FUNCTION;
    if function == alloc_fn::FREE {
        retire(tgid, arg0);
        return Ok(1);
    }
    let state = heap_thread(tid).ok_or(1u32)?;
    // SAFETY: the map value stays valid for this program run; a thread
    // runs one program at a time.
    let state = unsafe { &mut *state };
    // A perf-event uprobe says which it is. In a session, at a return the
    // registers are the caller's, past the call; at an entry the
    // instruction pointer is the probe's.
    let is_return = if cookie & probe_cookie::AT_RETURN != 0 {
        true
    } else if cookie & probe_cookie::AT_ENTRY != 0 {
        false
    } else {
        // SAFETY: plain helper on our own context; checked context load.
        unsafe { bpf_get_func_ip(ctx.regs.cast()) != (*regs).rip }
    };
    if is_return {
        // Only the pending call's own return counts: `ret` popped its
        // return address. (A call tail-called by the pending one may
        // report a return of its own at the same point.)
        if state.pending_sp != 0
            && sp == state.pending_sp + 8
            && function == u64::from(state.pending_fn)
        {
            on_return(&ctx, state, tgid, tid);
        }
        return Ok(0);
    }
    if state.pending_sp != 0 {
        // Nested in the pending call, counted by it: deeper on the stack, or
        // at the same depth when the pending call tail-calls (glibc's
        // realloc(NULL, n) jumps to malloc).
        // SAFETY: plain helper.
        if sp <= state.pending_sp
            && unsafe { bpf_ktime_get_ns() } - state.pending_ns < PENDING_STALE_NS
        {
            return Ok(1);
        }
        // A pending call that never returned (longjmp out of it): forget it.
        state.pending_sp = 0;
    }
    if made_by_an_allocator(tgid, sp) {
        // A wrapper's call of the allocator it wraps (heaptrack's preload
        // library calls libc's malloc): its outer call counts it.
        count(counter::HEAP_NESTED_CALLS);
        return Ok(1);
    }
    let (size, out, old) = match function {
        alloc_fn::MALLOC | alloc_fn::VALLOC => (arg0, 0, 0),
        alloc_fn::CALLOC => (mul_or_zero(arg0, arg1), 0, 0),
        alloc_fn::REALLOC => (arg1, 0, arg0),
        alloc_fn::REALLOCARRAY => (mul_or_zero(arg1, arg2), 0, arg0),
        alloc_fn::POSIX_MEMALIGN => (arg2, arg0, 0),
        alloc_fn::ALIGNED_ALLOC | alloc_fn::MEMALIGN => (arg1, 0, 0),
        alloc_fn::PVALLOC => ((arg0 + 4095) & !4095, 0, 0),
        _ => return Ok(1),
    };
    if old != 0 {
        retire(tgid, old);
    }
    let sampled = size > 0 && take_sample(state, size);
    let composite = function != alloc_fn::MALLOC && function != alloc_fn::CALLOC;
    if !sampled && !composite {
        return Ok(1);
    }
    state.pending_sp = sp;
    // SAFETY: plain helper.
    state.pending_ns = unsafe { bpf_ktime_get_ns() };
    state.pending_size = size;
    state.pending_out = out;
    state.pending_fn = function as u32;
    state.pending_sampled = u32::from(sampled);
    Ok(0)
}

/// Whether the call entered at `sp` returns into one of process `tgid`'s
/// allocator functions, i.e. another allocator made it. Only processes
/// that map two allocator files have ranges; while none has, no call pays
/// more than one inlined array read, and then the others one lookup.
#[inline(always)]
fn made_by_an_allocator(tgid: u32, sp: u64) -> bool {
    if ALLOC_CALLERS_ON.get(0).copied().unwrap_or(0) == 0 {
        return false;
    }
    // SAFETY: the value is only read during this run.
    let Some(callers) = (unsafe { ALLOC_CALLERS.get(tgid) }) else {
        return false;
    };
    // The probe sees an entry's state (attach/placement.rs): the return
    // address is at [sp].
    // SAFETY: a user pointer, read through the checked helper.
    let Ok(ret) = (unsafe { read_user(sp as *const u64) }) else {
        return false;
    };
    let len = callers.len as usize;
    // Unrolled by hand, each range at a constant offset: Linux 6.1's
    // verifier lost the bound of a loop's index into the map value and
    // refused the program (invalid access at offset 528 of 520).
    macro_rules! range {
        ($($k:literal)*) => {$(
            if len <= $k {
                return false;
            }
            let [start, end] = callers.ranges[$k];
            if ret >= start && ret < end {
                return true;
            }
        )*};
    }
    range!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
    false
}

// The unrolled checks above cover every slot.
const _: () = assert!(ALLOC_CALLER_RANGES == 32);

/// n * size as calloc computes it; a request that overflows fails and
/// allocates nothing. (An overflow check by division or checked_mul makes
/// LLVM emit a 128-bit multiply, which BPF lacks; factors below 2^32 cannot
/// overflow, and larger ones are only plausible times one.)
#[inline(always)]
fn mul_or_zero(n: u64, size: u64) -> u64 {
    if (n | size) >> 32 == 0 {
        n * size
    } else if n == 1 {
        size
    } else if size == 1 {
        n
    } else {
        0
    }
}

/// Allocator calls return within microseconds; a pending call older than
/// this was left without a return (longjmp) and is forgotten.
const PENDING_STALE_NS: u64 = 1_000_000_000;

/// The thread's heap state, created with a fresh byte budget on first use.
#[inline(always)]
fn heap_thread(tid: u32) -> Option<*mut HeapThread> {
    if let Some(state) = HEAP_THREADS.get_ptr_mut(tid) {
        return Some(state);
    }
    let fresh = HeapThread {
        remaining: draw_sample_distance(),
        ..HeapThread::default()
    };
    if HEAP_THREADS.insert(tid, fresh, 0).is_err() {
        count(counter::HEAP_THREADS_FULL);
        klog!(why::HEAP_THREADS_FULL, klog::tgid(), tid);
        return None;
    }
    HEAP_THREADS.get_ptr_mut(tid)
}

#[inline(always)]
fn draw_sample_distance() -> u64 {
    // SAFETY: plain helper.
    let random = unsafe { bpf_get_prandom_u32() };
    next_sample_distance(random, global(&HEAP_SAMPLE_BYTES))
}

/// Go's rule (runtime/malloc.go): an allocation smaller than what is left
/// of the budget only counts it down; one that reaches it is sampled and a
/// new budget is drawn.
#[inline(always)]
fn take_sample(state: &mut HeapThread, size: u64) -> bool {
    if size < state.remaining {
        state.remaining -= size;
        return false;
    }
    state.remaining = draw_sample_distance();
    true
}

/// The pending call returned: record it if it was sampled.
#[inline(always)]
fn on_return(ctx: &ProbeContext, state: &mut HeapThread, tgid: u32, tid: u32) {
    state.pending_sp = 0;
    if state.pending_sampled == 0 {
        return;
    }
    let function = state.pending_fn;
    // SAFETY: checked context load.
    let ret = unsafe { (*ctx.regs).rax };
    let addr = if u64::from(function) == alloc_fn::POSIX_MEMALIGN {
        // It returns an error number and stores the pointer through `out`.
        if ret as u32 != 0 {
            return;
        }
        // SAFETY: a user pointer, read through the checked helper.
        match unsafe { read_user(state.pending_out as *const u64) } {
            Ok(addr) => addr,
            Err(_) => return,
        }
    } else {
        ret
    };
    if addr == 0 {
        return;
    }
    keep_sample(ctx, tgid, tid, function, addr, state.pending_size);
}

/// A sampled allocation of `size` bytes at `addr` (by `function`, an
/// `alloc_fn`): kept in the live set, and sent with the current thread's
/// stack; a loss is counted and the address forgotten.
#[inline(always)]
pub(crate) fn keep_sample(
    ctx: &ProbeContext,
    tgid: u32,
    tid: u32,
    function: u32,
    addr: u64,
    size: u64,
) {
    count(counter::HEAP_SAMPLES);
    // So that the daemon snapshots the process and hears of its exit.
    let image_since = note_process(tgid);
    anchor_young_image(ctx.as_ptr(), tgid, image_since);
    let key = LiveKey {
        tgid,
        _pad: 0,
        addr,
    };
    let live = HEAP_LIVE.insert(key, size, 0).is_ok();
    if !live {
        count(counter::HEAP_LIVE_FULL);
        klog!(why::HEAP_LIVE_FULL, tgid, tid, addr);
    }
    if !send_heap_alloc(ctx, tgid, tid, function, addr, size, live) {
        count(counter::HEAP_ALLOCS_LOST);
        klog!(why::HEAP_ALLOC_LOST, tgid, tid, addr, size);
        if live {
            let _ = HEAP_LIVE.remove(key);
        }
    }
}

/// A freed address: if it was a sampled live allocation, tell the daemon.
#[inline(always)]
pub(crate) fn retire(tgid: u32, addr: u64) {
    if addr == 0 {
        return;
    }
    let key = LiveKey {
        tgid,
        _pad: 0,
        addr,
    };
    // A lookup first: it takes no lock, where a delete locks its bucket
    // even for the absent keys of nearly every free.
    // SAFETY: presence check only.
    if unsafe { HEAP_LIVE.get(key).is_none() } || HEAP_LIVE.remove(key).is_err() {
        return;
    }
    let event = HeapFree {
        kind: heap_event::FREE,
        tgid,
        addr,
    };
    if HEAP_EVENTS
        .output::<HeapFree>(&event, wake_flag(&HEAP_EVENTS, &HEAP_EVENTS_RING))
        .is_err()
    {
        count(counter::HEAP_FREES_LOST);
        klog!(why::HEAP_FREE_LOST, tgid, klog::tid(), addr);
    }
}

/// Sends a sampled allocation with the stack of the current thread (and
/// a CPython thread's Python frames).
#[inline(always)]
fn send_heap_alloc(
    ctx: &ProbeContext,
    tgid: u32,
    tid: u32,
    function: u32,
    addr: u64,
    size: u64,
    live: bool,
) -> bool {
    // SAFETY: a context load of the user's stack pointer.
    let sp = unsafe { (*ctx.regs).rsp };
    let event = (tgid, tid, function, addr, size, live);
    let python = heap_python_frames(tgid, tid);
    if global_u8(&SHORT_RECORDS) != 0 && !use_dwarf(tgid) {
        // Walked by frame pointers: no stack bytes to carry.
        send_heap_alloc_in::<0>(ctx, event, python)
    } else if stack_fits(tid, sp, SHORT_STACK_BYTES) {
        send_heap_alloc_in::<SHORT_STACK_BYTES>(ctx, event, python)
    } else if needs_long_copy(tid, sp, STACK_COPY_BYTES) {
        send_heap_alloc_in::<LONG_STACK_BYTES>(ctx, event, python)
    } else {
        send_heap_alloc_in::<STACK_COPY_BYTES>(ctx, event, python)
    }
}

/// Sends a sampled allocation in the record form with an N-byte stack
/// copy (0: the frames-only form of a stack walked by frame pointers),
/// followed by `python`'s frames when there are (a CPython thread's).
#[inline(always)]
fn send_heap_alloc_in<const N: usize>(
    ctx: &ProbeContext,
    event: (u32, u32, u32, u64, u64, bool),
    python: Option<*const PyFrames<HEAP_PY_FRAMES>>,
) -> bool {
    let Some(python) = python else {
        let Some(mut entry) = HEAP_EVENTS.reserve::<HeapAlloc<N>>(0) else {
            return false;
        };
        // SAFETY: the entry is ours until submitted.
        unsafe { write_heap_alloc(ctx, entry.as_mut_ptr(), event, 0) };
        entry.submit(wake_flag(&HEAP_EVENTS, &HEAP_EVENTS_RING));
        return true;
    };
    let Some(mut entry) = HEAP_EVENTS.reserve::<WithPython<HeapAlloc<N>, HEAP_PY_FRAMES>>(0) else {
        return false;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: the entry is ours until submitted; `python` is this CPU's
    // scratch, walked above.
    unsafe {
        write_heap_alloc(ctx, &raw mut (*out).record, event, 1);
        copy_python_frames(&raw mut (*out).python, python);
    }
    entry.submit(wake_flag(&HEAP_EVENTS, &HEAP_EVENTS_RING));
    true
}

/// Writes a sampled allocation's record with an N-byte stack copy into
/// `out`, in place (it is far larger than the BPF stack).
///
/// # Safety
/// `out` is a reserved ring entry of the caller's.
#[inline(always)]
unsafe fn write_heap_alloc<const N: usize>(
    ctx: &ProbeContext,
    out: *mut HeapAlloc<N>,
    (tgid, tid, function, addr, size, live): (u32, u32, u32, u64, u64, bool),
    python: u32,
) {
    let regs = ctx.regs;
    // SAFETY: the caller's entry; register reads are context loads.
    unsafe {
        (*out).kind = heap_event::ALLOC;
        (*out).tgid = tgid;
        (*out).tid = tid;
        (*out).function = function;
        (*out).live = u32::from(live);
        (*out).python = python;
        (*out).time_ns = bpf_ktime_get_ns();
        (*out).addr = addr;
        (*out).size = size;
        (*out).ip = (*regs).rip;
        (*out).sp = (*regs).rsp;
        (*out).bp = (*regs).rbp;
        (*out).comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
        ((*out).stack_len, (*out).frames_len) = if N == 0 {
            (0, walk_user_stack(regs.cast(), (*out).frames.as_mut_ptr()))
        } else {
            record_user_stack::<N>(
                regs.cast(),
                tgid,
                (*regs).rsp,
                (*out).stack.as_mut_ptr(),
                (*out).frames.as_mut_ptr(),
            )
        };
    }
}
