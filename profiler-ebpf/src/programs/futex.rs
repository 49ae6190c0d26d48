//! The futex system call tracepoints of the block and mutex profiles: a
//! wait's start and end (kept by Go's block rule), and kept wake-ups
//! (one in MUTEX_FRACTION) with the delay they ended.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    },
    macros::{btf_map, map, tracepoint},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::TracePointContext,
};
use profiler_common::{
    FUTEX_WAKERS_ENTRIES, FutexCall, FutexWaker, LiveKey as FutexKey, MutexDelay, WAKER_TIME_SLOTS,
    counter, futex_call, futex_op,
    sampling::{keep_block_event, keep_mutex_event},
    wait_event,
};

use crate::{
    counters::count,
    globals::{
        BLOCK_ON, BLOCK_RATE_NS, FUTEX_UADDR_OFFSET, MUTEX_FRACTION, MUTEX_ON, SELF_TGID,
        SYSCALL_RET_OFFSET, WAIT_EVENTS_RING, global, global_u8,
    },
    klog::{self, klog, why},
    maps::wake_flag,
    process::is_target,
    stack::{fp_process, task_user_ip},
    task_storage::TaskStorage,
    waits::{WAIT_EVENTS, send_wait_stack},
};

/// The futex call each thread is in (waits, and kept wake-ups), in the
/// thread's own storage: a wait only writes it in place and its end marks
/// it done, where a hash map cost an insert and a delete per wait. A
/// thread's value is made at its first targeted futex call and freed with
/// the thread, so the map holds at most one per live targeted thread.
#[btf_map]
static FUTEX_CALLS: TaskStorage<FutexCall> = TaskStorage::new();

/// The latest kept wake-up per futex word (process, address).
#[map]
static FUTEX_WAKERS: LruHashMap<FutexKey, FutexWaker> =
    LruHashMap::with_max_entries(FUTEX_WAKERS_ENTRIES, 0);

/// When a kept wake-up last entered, by a hash of its futex word: a wait
/// that started after that time cannot have been ended by a kept wake-up,
/// so it skips the FUTEX_WAKERS lookup (most waits, at the default
/// fraction). A collision only costs the lookup.
#[map]
static WAKER_TIMES: Array<u64> = Array::with_max_entries(WAKER_TIME_SLOTS, 0);

/// Per-CPU sequence numbers that make wake-up ids unique.
#[map]
static WAKE_SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// sys_enter_futex: a wait starts, or a wake-up is drawn for the mutex
/// profile (one in MUTEX_FRACTION).
#[tracepoint]
pub fn futex_enter(ctx: TracePointContext) -> u32 {
    klog::run(ctx, try_futex_enter)
}

#[inline(always)]
fn try_futex_enter(ctx: TracePointContext) -> Result<u32, u32> {
    let offset = global(&FUTEX_UADDR_OFFSET) as usize;
    // The word and the operation in one read: two adjacent arguments.
    // SAFETY: fields of the tracepoint record, offset from its format file.
    let [uaddr, op]: [u64; 2] = unsafe { ctx.read_at(offset) }.unwrap_or([0, u64::MAX]);
    match op & futex_op::CMD_MASK {
        futex_op::WAIT
        | futex_op::WAIT_BITSET
        | futex_op::LOCK_PI
        | futex_op::LOCK_PI2
        | futex_op::WAIT_REQUEUE_PI => begin_wait(uaddr),
        futex_op::WAKE
        | futex_op::WAKE_BITSET
        | futex_op::WAKE_OP
        | futex_op::UNLOCK_PI
        | futex_op::REQUEUE
        | futex_op::CMP_REQUEUE
        | futex_op::CMP_REQUEUE_PI => begin_wake(uaddr),
        _ => {}
    }
    Ok(0)
}

/// sys_enter_futex_wait and sys_enter_futex_waitv (whose first argument,
/// the waiter array, stands for the futex word).
#[tracepoint]
pub fn futex_wait_enter(ctx: TracePointContext) -> u32 {
    klog::run(ctx, try_futex_wait_enter)
}

#[inline(always)]
fn try_futex_wait_enter(ctx: TracePointContext) -> Result<u32, u32> {
    begin_wait(futex_uaddr(&ctx));
    Ok(0)
}

/// sys_enter_futex_wake.
#[tracepoint]
pub fn futex_wake_enter(ctx: TracePointContext) -> u32 {
    klog::run(ctx, try_futex_wake_enter)
}

#[inline(always)]
fn try_futex_wake_enter(ctx: TracePointContext) -> Result<u32, u32> {
    begin_wake(futex_uaddr(&ctx));
    Ok(0)
}

/// The process of the current system call, if it is targeted.
#[inline(always)]
fn futex_caller() -> Option<u32> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == global(&SELF_TGID) || !is_target(tgid) {
        return None;
    }
    Some(tgid)
}

#[inline(always)]
fn futex_uaddr(ctx: &TracePointContext) -> u64 {
    let offset = global(&FUTEX_UADDR_OFFSET) as usize;
    // SAFETY: a field of the tracepoint record, offset from its format file.
    unsafe { ctx.read_at(offset) }.unwrap_or(0)
}

#[inline(always)]
fn begin_wait(uaddr: u64) {
    if global_u8(&BLOCK_ON) == 0 && global_u8(&MUTEX_ON) == 0 {
        return;
    }
    if futex_caller().is_none() {
        return;
    }
    let call = FutexCall {
        // SAFETY: plain helper.
        start_ns: unsafe { bpf_ktime_get_ns() },
        uaddr,
        wake_id: 0,
        kind: futex_call::WAIT,
        _pad: 0,
    };
    set_futex_call(call);
}

#[inline(always)]
fn begin_wake(uaddr: u64) {
    if global_u8(&MUTEX_ON) == 0 {
        return;
    }
    // SAFETY: plain helper.
    if !keep_mutex_event(global(&MUTEX_FRACTION), unsafe { bpf_get_prandom_u32() }) {
        return;
    }
    let Some(tgid) = futex_caller() else {
        return;
    };
    if in_go_runtime_futex(tgid) {
        return;
    }
    // SAFETY: plain helpers.
    let (now, cpu) = unsafe { (bpf_ktime_get_ns(), bpf_get_smp_processor_id()) };
    let Some(wake_id) = next_wake_id(cpu) else {
        return;
    };
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: uaddr,
    };
    let waker = FutexWaker {
        wake_id,
        time_ns: now,
        claimed: 0,
        woken: 0,
    };
    let _ = FUTEX_WAKERS.insert(key, waker, 0);
    // After the insert: a wait that finds this time finds the entry too.
    if let Some(slot) = WAKER_TIMES.get_ptr_mut(waker_slot(tgid, uaddr)) {
        // SAFETY: an array slot; a racing store of a kept wake-up that
        // entered at nearly the same time leaves a time just as late.
        unsafe { *slot = now };
    }
    let call = FutexCall {
        start_ns: now,
        uaddr,
        wake_id,
        kind: futex_call::WAKE,
        _pad: 0,
    };
    set_futex_call(call);
}

/// A new wake-up id, unique across CPUs (`cpu`: the current one).
#[inline(always)]
pub(crate) fn next_wake_id(cpu: u32) -> Option<u64> {
    let seq = WAKE_SEQ.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot; programs do not nest on a CPU.
    unsafe {
        *seq += 1;
        Some((u64::from(cpu) << 48) | (*seq & 0xffff_ffff_ffff))
    }
}

/// Notes the futex call the current thread is entering.
#[inline(always)]
fn set_futex_call(call: FutexCall) {
    match FUTEX_CALLS.current(true) {
        // SAFETY: the current thread's value; only its own programs touch it.
        Some(slot) => unsafe { *slot = call },
        None => {
            count(counter::FUTEX_CALLS_FULL);
            klog!(why::FUTEX_CALLS_FULL, klog::tgid(), klog::tid(), call.uaddr);
        }
    }
}

/// sys_exit of every futex call: a wait ends (block profile, and its delay
/// for the mutex profile if a kept wake-up ended it), or a kept wake-up
/// reports its stack when it woke someone.
#[tracepoint]
pub fn futex_exit(ctx: TracePointContext) -> u32 {
    klog::run(ctx, try_futex_exit)
}

#[inline(always)]
fn try_futex_exit(ctx: TracePointContext) -> Result<u32, u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let slot = FUTEX_CALLS.current(false).ok_or(0u32)?;
    // SAFETY: the current thread's value; copied out, then marked done.
    let call = unsafe {
        let call = *slot;
        (*slot).kind = futex_call::NONE;
        call
    };
    if call.kind == futex_call::NONE {
        return Ok(0);
    }
    // SAFETY: plain helper.
    let now = unsafe { bpf_ktime_get_ns() };
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: call.uaddr,
    };
    if call.kind == futex_call::WAIT {
        count(counter::FUTEX_WAITS);
        let waited = now.saturating_sub(call.start_ns);
        // SAFETY: plain helper.
        let random = unsafe { bpf_get_prandom_u32() };
        if global_u8(&BLOCK_ON) != 0
            && keep_block_event(waited, global(&BLOCK_RATE_NS), random)
            && !in_go_runtime_futex(tgid)
        {
            send_wait_stack(&ctx, wait_event::BLOCK, tgid, tid, waited, call.uaddr);
        }
        if global_u8(&MUTEX_ON) != 0
            && woken_after(call.start_ns, tgid, call.uaddr)
            && let Some(waker) = FUTEX_WAKERS.get_ptr_mut(key)
        {
            // SAFETY: a map value, valid during this run; a lost update
            // between two waiters only loosens the claim bound.
            let waker = unsafe { &mut *waker };
            if waker.time_ns >= call.start_ns && (waker.woken == 0 || waker.claimed < waker.woken) {
                waker.claimed += 1;
                let event = MutexDelay {
                    kind: wait_event::MUTEX_DELAY,
                    tgid,
                    wake_id: waker.wake_id,
                    delay_ns: waker.time_ns - call.start_ns,
                };
                if WAIT_EVENTS
                    .output::<MutexDelay>(&event, wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING))
                    .is_err()
                {
                    count(counter::WAIT_EVENTS_LOST);
                    klog!(why::MUTEX_DELAY_LOST, tgid, tid, event.delay_ns);
                }
            }
        }
        return Ok(0);
    }
    let offset = global(&SYSCALL_RET_OFFSET) as usize;
    // SAFETY: a field of the tracepoint record, offset from its format file.
    let ret: i64 = unsafe { ctx.read_at(offset) }.unwrap_or(0);
    match FUTEX_WAKERS.get_ptr_mut(key) {
        // SAFETY: as above.
        Some(waker) if unsafe { (*waker).wake_id } == call.wake_id => {
            if ret <= 0 {
                // It woke nobody: no wait may claim it.
                let _ = FUTEX_WAKERS.remove(key);
                return Ok(0);
            }
            // SAFETY: as above.
            unsafe { (*waker).woken = ret.min(i64::from(u32::MAX)) as u32 };
        }
        _ => {}
    }
    if ret > 0 {
        send_wait_stack(
            &ctx,
            wait_event::MUTEX_WAKE,
            tgid,
            tid,
            call.wake_id,
            call.uaddr,
        );
    }
    Ok(0)
}

/// Whether the current thread's futex call is made in its Go process's
/// `runtime.futex` (an idle M's sleep, or the wake-up that hands it work):
/// the runtime's own, which the daemon drops by that leaf frame and Go's
/// profiles never show. Asked only of what is about to cost a stack (a
/// kept wait, a kept wake-up), so that other calls pay nothing; counted.
#[inline(always)]
fn in_go_runtime_futex(tgid: u32) -> bool {
    let Some(process) = fp_process(tgid) else {
        return false;
    };
    // SAFETY: a map value, valid during this run.
    let (start, end) = unsafe { ((*process).futex_start, (*process).futex_end) };
    if end <= start {
        return false;
    }
    let skip = task_user_ip().is_some_and(|ip| ip >= start && ip < end);
    if skip {
        count(counter::GO_RUNTIME_FUTEXES_SKIPPED);
    }
    skip
}

/// The WAKER_TIMES slot of a futex word.
#[inline(always)]
fn waker_slot(tgid: u32, uaddr: u64) -> u32 {
    ((uaddr >> 2) as u32 ^ tgid.wrapping_mul(0x9e37_79b9)) & (WAKER_TIME_SLOTS - 1)
}

/// Whether a kept wake-up of this word's slot entered at or after `start`.
#[inline(always)]
fn woken_after(start: u64, tgid: u32, uaddr: u64) -> bool {
    WAKER_TIMES
        .get(waker_slot(tgid, uaddr))
        .is_some_and(|&time| time >= start)
}
