//! Go's park points for the block and mutex profiles (runtime.gopark,
//! runtime.ready, runtime.readyWithTime and runtime.semacquire1):
//! goroutine waits that never reach a futex, timed and charged by the
//! rules of the Go release that built the program (design 016, "Contention
//! by Go's rules").

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_user as read_user,
        generated::{
            bpf_get_attach_cookie, bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        },
    },
    macros::map,
    maps::LruHashMap,
    programs::ProbeContext,
};
use profiler_common::{
    COMM_LEN, GO_PARK_CALL_BEFORE_WINDOW, GO_PARK_GATE_ENTRIES, GO_PARKED_ENTRIES,
    GO_SEMA_CALLS_ENTRIES, GO_SEMA_ROOTS_ENTRIES, GoPark, GoSemaCall, GoSemaRoot,
    LiveKey as FutexKey, MAX_STACK_DEPTH, MutexDelay, ParkGate, STACK_COPY_BYTES, WaitHead,
    WaitStack, counter, go_fn, probe_cookie,
    sampling::{keep_block_event, keep_mutex_event},
    wait_event, wait_flags,
};

use crate::{
    counters::count,
    globals::{
        BLOCK_ON, BLOCK_RATE_NS, MUTEX_FRACTION, MUTEX_ON, SELF_TGID, SHORT_RECORDS,
        WAIT_EVENTS_RING, global, global_u8,
    },
    go_labels::goroutine_label_set,
    klog::{self, klog, why},
    maps::wake_flag,
    process::{forked_parent, is_target},
    programs::futex::next_wake_id,
    stack::{fp_process, walk_user_stack},
    waits::WAIT_EVENTS,
};

/// Parked goroutines by (process, g address).
#[map]
static GO_PARKED: LruHashMap<FutexKey, GoPark> = LruHashMap::with_max_entries(GO_PARKED_ENTRIES, 0);

/// Goroutines' semaphore waits in progress by (process, g address): when
/// their `semacquire1` call began.
#[map]
static GO_SEMA_CALLS: LruHashMap<FutexKey, GoSemaCall> =
    LruHashMap::with_max_entries(GO_SEMA_CALLS_ENTRIES, 0);

/// Semaphore roots' queues of mutex waiters by (process, root lock).
#[map]
static GO_SEMA_ROOTS: LruHashMap<FutexKey, GoSemaRoot> =
    LruHashMap::with_max_entries(GO_SEMA_ROOTS_ENTRIES, 0);

/// Each Go process's park-probe gate and run count (see `ParkGate`).
#[map]
static GO_PARK_GATES: LruHashMap<u32, ParkGate> =
    LruHashMap::with_max_entries(GO_PARK_GATE_ENTRIES, 0);

/// Go's park points for the block and mutex profiles, attached to
/// runtime.gopark, runtime.ready and runtime.readyWithTime of Go
/// executables (the cookie says which). A goroutine
/// that parks (channel, select, sync) is remembered by its `g` (R14 in
/// Go's register ABI) with its stack registers; when another goroutine
/// readies it (`gp` in RAX), the wait is kept by Go's block rule and its
/// stack walked by frame pointers (Go keeps them) through the parked
/// goroutine's memory, which lies in the same address space. Entry probes
/// only: a return probe would move a return address that Go's stack
/// copying must find.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn go_park_probe(ctx: *mut core::ffi::c_void) -> u32 {
    klog::run(ProbeContext::new(ctx), try_go_park)
}

#[inline(always)]
fn try_go_park(ctx: ProbeContext) -> Result<u32, u32> {
    let (block_on, mutex_on) = (global_u8(&BLOCK_ON) != 0, global_u8(&MUTEX_ON) != 0);
    if !block_on && !mutex_on {
        return Ok(0);
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == global(&SELF_TGID) || !is_target(tgid) {
        return Ok(0);
    }
    let regs = ctx.regs;
    // SAFETY: plain helpers; checked context loads of the user's pt_regs.
    let (cookie, now, r14, rax, rbx, rcx, sp, bp) = unsafe {
        (
            bpf_get_attach_cookie(ctx.regs.cast()) & probe_cookie::FUNCTION,
            bpf_ktime_get_ns(),
            (*regs).r14,
            (*regs).rax,
            (*regs).rbx,
            (*regs).rcx,
            (*regs).rsp,
            (*regs).rbp,
        )
    };
    let function = cookie & go_fn::FUNCTION;
    let Some(since) = gate(tgid, now) else {
        return Ok(0);
    };
    if function == go_fn::READY_WITH_TIME {
        if mutex_on {
            // readyWithTime(s *sudog, ...): the waiter is s.g, the first
            // field of a sudog in every release.
            // SAFETY: a checked read of user memory.
            let g = unsafe { read_user(rax as *const u64) }.map_err(|_| 0u32)?;
            on_release(&ctx, tgid, pid_tgid as u32, cookie, (g, rax), (since, now));
        }
        return Ok(0);
    }
    if function == go_fn::SEMACQUIRE {
        // semacquire1(addr, lifo, ...) on the goroutine in R14: Go's
        // block profile times the call from here to the release that
        // ends it.
        let key = FutexKey {
            tgid,
            _pad: 0,
            addr: r14,
        };
        let call = GoSemaCall {
            start_ns: now,
            last_ready_ns: 0,
            addr: rax,
            acquire_ns: now,
            lifo: (rbx & 0xff) as u32,
            _pad: 0,
        };
        let _ = GO_SEMA_CALLS.insert(key, call, 0);
        return Ok(0);
    }
    if function == go_fn::GOPARK {
        // gopark(unlockf, lock, reason waitReason, ...): a uint8 in RCX on
        // every release read (1.19 to 1.27); `lock` in RBX, for a
        // semaphore wait the lock of its root.
        let reason = (rcx & 0xff) as u32;
        let root = match mutex_on && go_fn::is_mutex_reason(cookie, reason as u8) {
            true => {
                let call = FutexKey {
                    tgid,
                    _pad: 0,
                    addr: r14,
                };
                // The semaphore's own queue where its call was seen (a
                // root holds the queues of many addresses), else the
                // root's.
                // SAFETY: copied out at once.
                let (queue, acquire, lifo) = match unsafe { GO_SEMA_CALLS.get(call) } {
                    Some(c) if since <= c.start_ns && c.start_ns <= now && c.addr != 0 => {
                        (c.addr, c.acquire_ns, c.lifo != 0)
                    }
                    _ => (rbx, now, false),
                };
                queue_on(tgid, queue, (now, since), acquire, lifo);
                queue
            }
            false => 0,
        };
        let park = GoPark {
            start_ns: now,
            sp,
            bp,
            root,
            tid: pid_tgid as u32,
            reason: reason | call_before_window(tgid, r14, cookie, reason, since),
            comm: bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]),
        };
        let key = FutexKey {
            tgid,
            _pad: 0,
            addr: r14,
        };
        let _ = GO_PARKED.insert(key, park, 0);
        return Ok(0);
    }
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: rax,
    };
    // SAFETY: copied out before the entry is removed.
    let park = (unsafe { GO_PARKED.get(key) }).copied().ok_or(0u32)?;
    let _ = GO_PARKED.remove(key);
    if park.root != 0 {
        leave_queue(tgid, park.root);
    }
    // Parked before this window opened: the goroutine may have been
    // readied and parked again while the probes were detached. Or a
    // semaphore wait whose call began before it.
    if park.start_ns < since || park.reason & GO_PARK_CALL_BEFORE_WINDOW != 0 {
        count(counter::GO_WAITS_OUTLASTING_WINDOWS);
        return Ok(0);
    }
    if !block_on {
        return Ok(0);
    }
    count(counter::FUTEX_WAITS);
    let waited = now.saturating_sub(wait_start(tgid, rax, &park, cookie, (since, now)));
    // SAFETY: plain helper.
    let random = unsafe { bpf_get_prandom_u32() };
    if keep_block_event(waited, global(&BLOCK_RATE_NS), random) {
        // The readied goroutine's labels, read now: a set recorded at the
        // park would be gone from the daemon's table after a long wait.
        let labels = match fp_process(tgid) {
            // SAFETY: a map value, valid during this run.
            Some(process) => goroutine_label_set(unsafe { &(*process).go }, tgid, rax),
            None => 0,
        };
        send_go_block(tgid, &park, waited, labels);
    }
    Ok(0)
}

/// The start of process `tgid`'s open window, None when `now` lies outside
/// it (the daemon's duty cycle: see `ParkGate`); a run inside it is
/// counted. A process seen the first time is open.
#[inline(always)]
fn gate(tgid: u32, now: u64) -> Option<u64> {
    match GO_PARK_GATES.get_ptr_mut(tgid) {
        Some(gate) => {
            // SAFETY: a map value, valid during this run.
            let (since, until) = unsafe { ((*gate).since_ns, (*gate).until_ns) };
            if now < since || now >= until {
                return None;
            }
            // SAFETY: as above; the count is added atomically (BPF's
            // atomic add: the target has no compare-and-swap, so core's
            // atomic types lack `fetch_add`), as every CPU's runs add to it.
            unsafe {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*gate).runs, 1)
            };
            Some(since)
        }
        None => {
            let open = ParkGate {
                runs: 1,
                ..ParkGate::OPEN
            };
            // Full, or another CPU added it first: this run is uncounted.
            let _ = GO_PARK_GATES.insert(tgid, open, BPF_NOEXIST as u64);
            Some(0)
        }
    }
}

/// A semaphore's release readies goroutine `g` (parked, with a reason the
/// cookie names as a mutex wait): one in MUTEX_FRACTION such releases is
/// kept, as Go's mutex profile keeps them, charging the waiter's delay to
/// the releasing goroutine's stack (`sync.(*Mutex).Unlock` and its
/// caller), which is the current one.
#[inline(always)]
fn on_release(
    ctx: &ProbeContext,
    tgid: u32,
    tid: u32,
    cookie: u64,
    (g, s): (u64, u64),
    (since, now): (u64, u64),
) {
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: g,
    };
    // SAFETY: copied out; `ready` removes the entry after this.
    let Some(park) = (unsafe { GO_PARKED.get(key) }).copied() else {
        return;
    };
    if park.start_ns < since || !go_fn::is_mutex_reason(cookie, park.reason as u8) {
        return;
    }
    // Charged as the release's runtime charges it, whether kept or not:
    // the queue's state moves on at every release.
    let charged = release_charge(tgid, (g, s), &park, cookie, now);
    // SAFETY: plain helpers.
    let (random, cpu) = unsafe { (bpf_get_prandom_u32(), bpf_get_smp_processor_id()) };
    if !keep_mutex_event(global(&MUTEX_FRACTION), random) {
        return;
    }
    let Some(wake_id) = next_wake_id(cpu) else {
        return;
    };
    if global_u8(&SHORT_RECORDS) != 0 {
        send_release::<0>(ctx, (tgid, tid), &park, wake_id, (charged, now));
    } else {
        send_release::<STACK_COPY_BYTES>(ctx, (tgid, tid), &park, wake_id, (charged, now));
    }
}

/// Sends a kept release (its stack walked now) and the delay charged to
/// it, in a record with room for `N` stack bytes (none are copied).
#[inline(always)]
fn send_release<const N: usize>(
    ctx: &ProbeContext,
    (tgid, tid): (u32, u32),
    park: &GoPark,
    wake_id: u64,
    (charged, now): (u64, u64),
) {
    let Some(mut entry) = WAIT_EVENTS.reserve::<WaitStack<N>>(0) else {
        count(counter::WAIT_EVENTS_LOST);
        klog!(why::GO_WAIT_LOST, tgid, tid, wake_id);
        return;
    };
    let out = entry.as_mut_ptr();
    let regs = ctx.regs;
    // SAFETY: the entry is ours until submitted; register reads are
    // context loads.
    unsafe {
        (*out).head = WaitHead {
            kind: wait_event::MUTEX_WAKE,
            tgid,
            tid,
            flags: wait_flags::GO_WAIT_REASON | park.reason << wait_flags::GO_REASON_SHIFT,
            parent: forked_parent(tgid),
            _pad: 0,
            value: wake_id,
            uaddr: 0,
            ip: (*regs).rip,
            sp: (*regs).rsp,
            bp: (*regs).rbp,
            hint_id: 0,
            time_ns: now,
            cond: 0,
            go_labels: 0,
            comm: bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]),
        };
        (*out).stack_len = 0;
        (*out).frames_len = walk_user_stack(regs.cast(), (*out).frames.as_mut_ptr());
    }
    entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
    let delay = MutexDelay {
        kind: wait_event::MUTEX_DELAY,
        tgid,
        wake_id,
        delay_ns: charged,
    };
    if WAIT_EVENTS
        .output::<MutexDelay>(&delay, wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING))
        .is_err()
    {
        count(counter::WAIT_EVENTS_LOST);
        klog!(why::GO_WAIT_LOST, tgid, tid, wake_id);
    }
}

/// [`GO_PARK_CALL_BEFORE_WINDOW`] when goroutine `g` parks on a semaphore
/// (`reason`) inside a window opened at `since` and its `semacquire1`
/// call was not seen in it; else 0. Never set while a process is not
/// cycled (`since` 0).
#[inline(always)]
fn call_before_window(tgid: u32, g: u64, cookie: u64, reason: u32, since: u64) -> u32 {
    if since == 0 || !go_fn::is_sema_reason(cookie, reason as u8) {
        return 0;
    }
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: g,
    };
    // SAFETY: read at once.
    match unsafe { GO_SEMA_CALLS.get(key) } {
        Some(call) if call.start_ns >= since => 0,
        _ => GO_PARK_CALL_BEFORE_WINDOW,
    }
}

/// Where a readied goroutine's wait began, by Go's block rule: a
/// semaphore wait from its `semacquire1` call's start (or its last
/// readying in that call: a woken waiter that finds the semaphore taken
/// parks again, and Go times the call as one wait, charged once), any
/// other from its park.
#[inline(always)]
fn wait_start(tgid: u32, g: u64, park: &GoPark, cookie: u64, (since, now): (u64, u64)) -> u64 {
    if !go_fn::is_sema_reason(cookie, park.reason as u8) {
        return park.start_ns;
    }
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: g,
    };
    let Some(call) = GO_SEMA_CALLS.get_ptr_mut(key) else {
        return park.start_ns;
    };
    // SAFETY: a map value, valid during this run.
    unsafe {
        let (start, last) = ((*call).start_ns, (*call).last_ready_ns);
        (*call).last_ready_ns = now;
        // An entry left by an earlier call (its goroutine parked on no
        // semaphore since), or by a call before this window opened: while
        // the probes were detached the goroutine may have made other
        // calls, and that entry would time this wait from then.
        if start == 0 || start > park.start_ns || start < since {
            return park.start_ns;
        }
        if last > start { last } else { start }
    }
}

/// A mutex waiter whose wait began at `acquire` (as the runtime keeps
/// it) parks on the semaphore `queue`, at the head if `lifo`: the queue
/// grows, as the runtime's `semaRoot.queue` keeps it. `since`: the start
/// of the process's probe window; a queue last touched before it is taken
/// as new (its waiters' readies may have gone unseen).
#[inline(always)]
fn queue_on(tgid: u32, queue: u64, (now, since): (u64, u64), acquire: u64, lifo: bool) {
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: queue,
    };
    match GO_SEMA_ROOTS.get_ptr_mut(key) {
        // SAFETY: a map value, valid during this run.
        Some(entry) => unsafe {
            let waiting = (*entry).waiting;
            if waiting == 0 || waiting > MAX_QUEUE || (*entry).touched_ns < since {
                // Alone: head and tail.
                (*entry).waiting = 0;
                (*entry).head_ns = acquire;
                (*entry).tail_ns = acquire;
            } else if !lifo {
                (*entry).tail_ns = acquire;
            }
            // At the head, the waiter takes the head's time. Counted
            // atomically: the queue's waiters park and leave on every CPU.
            atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(&raw mut (*entry).waiting, 1);
            (*entry).touched_ns = now;
        },
        None => {
            let entry = GoSemaRoot {
                waiting: 1,
                _pad: 0,
                head_ns: acquire,
                tail_ns: acquire,
                touched_ns: now,
            };
            let _ = GO_SEMA_ROOTS.insert(key, entry, 0);
        }
    }
}

/// A mutex waiter queued on `queue` was readied: the queue shrinks.
#[inline(always)]
fn leave_queue(tgid: u32, queue: u64) {
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: queue,
    };
    if let Some(entry) = GO_SEMA_ROOTS.get_ptr_mut(key) {
        // SAFETY: a map value, valid during this run.
        unsafe {
            if (*entry).waiting > 0 {
                atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(
                    &raw mut (*entry).waiting,
                    u32::MAX,
                );
            }
        }
    }
}

/// More waiters than a queue holds: a count that went below 0 in a race
/// (checked, then taken, on two CPUs), read as empty.
const MAX_QUEUE: u32 = 1 << 20;

/// The mutex delay Go charges a release, at `now`, that readies goroutine
/// `g` parked as `park` (its `sudog` at `s`), from its queue as the
/// probes followed it (`semrelease1` and `semaRoot.dequeue`):
/// - the head's wait, dt0 = now - the head's `acquiretime`; the next
///   waiter's is reset to now, so a queue's wait is counted once, not once
///   per waiter (every release);
/// - from Go 1.22, plus the waiters behind the head (`w`, `sudog.waiters`,
///   read as the runtime keeps it) times the mean of dt0 and the tail's
///   wait: `dt0 + (dtail + dt0) / 2 * w`, the tail's wait 0 when it is the
///   only one left (the runtime reads its time after resetting it) and dt0
///   when none is; the tail's time is reset to now too.
///
/// The released waiter keeps the head's time: if it finds the semaphore
/// taken and queues again in the same call, the runtime starts it there.
#[inline(always)]
fn release_charge(tgid: u32, (g, s): (u64, u64), park: &GoPark, cookie: u64, now: u64) -> u64 {
    let key = FutexKey {
        tgid,
        _pad: 0,
        addr: park.root,
    };
    let Some(entry) = GO_SEMA_ROOTS.get_ptr_mut(key) else {
        return now.saturating_sub(park.start_ns);
    };
    // SAFETY: a map value, valid during this run.
    let (waiting, head, tail) = unsafe {
        let read = ((*entry).waiting, (*entry).head_ns, (*entry).tail_ns);
        if read.0 > 1 {
            (*entry).head_ns = now;
            (*entry).tail_ns = now;
        }
        (*entry).touched_ns = now;
        read
    };
    let call = FutexKey {
        tgid,
        _pad: 0,
        addr: g,
    };
    if let Some(call) = GO_SEMA_CALLS.get_ptr_mut(call) {
        // SAFETY: a map value, valid during this run.
        unsafe { (*call).acquire_ns = head };
    }
    let dt0 = now.saturating_sub(head);
    let at = go_fn::waiters_at(cookie);
    if at == 0 {
        return dt0;
    }
    // SAFETY: a checked read of user memory.
    let w = match unsafe { read_user((s + at) as *const u16) } {
        Ok(w) => u64::from(w),
        Err(_) => return dt0,
    };
    if w == 0 {
        // No one queued behind the head: the queue empties now, whatever
        // the count (a park or release the probes missed) says.
        // SAFETY: as above.
        unsafe { (*entry).waiting = 1 };
        return dt0;
    }
    let waiting = if waiting > MAX_QUEUE { 1 } else { waiting };
    let dtail = match waiting.saturating_sub(1) {
        0 => dt0,
        1 => 0,
        _ => now.saturating_sub(tail),
    };
    dt0 + (dtail + dt0) / 2 * w
}

/// Sends a kept goroutine wait with its frames (the return address at
/// gopark's entry, then the frame-pointer chain) and its label set.
#[inline(always)]
fn send_go_block(tgid: u32, park: &GoPark, waited: u64, labels: u64) {
    // Frames only (a goroutine's stack is walked here, never copied): the
    // ring holds some 16 times as many as in the copy form, which `[debug]
    // short_records = false` keeps.
    if global_u8(&SHORT_RECORDS) != 0 {
        send_go_block_in::<0>(tgid, park, waited, labels);
    } else {
        send_go_block_in::<STACK_COPY_BYTES>(tgid, park, waited, labels);
    }
}

/// [`send_go_block`] in a record with room for `N` stack bytes.
#[inline(always)]
fn send_go_block_in<const N: usize>(tgid: u32, park: &GoPark, waited: u64, labels: u64) {
    let Some(mut entry) = WAIT_EVENTS.reserve::<WaitStack<N>>(0) else {
        count(counter::WAIT_EVENTS_LOST);
        klog!(why::GO_WAIT_LOST, tgid, park.tid, waited);
        return;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: the entry is ours until submitted; user memory is read
    // through the checked helper.
    unsafe {
        (*out).head = WaitHead {
            kind: wait_event::BLOCK,
            tgid,
            tid: park.tid,
            flags: wait_flags::RETURN_ADDRESS
                | wait_flags::GO_WAIT_REASON
                | park.reason << wait_flags::GO_REASON_SHIFT,
            parent: forked_parent(tgid),
            _pad: 0,
            value: waited,
            uaddr: 0,
            ip: 0,
            sp: park.sp,
            bp: park.bp,
            hint_id: 0,
            time_ns: park.start_ns + waited,
            cond: 0,
            go_labels: labels,
            comm: park.comm,
        };
        (*out).stack_len = 0;
        let mut len = 0u64;
        if let Ok(ret) = read_user(park.sp as *const u64) {
            (*out).frames[0] = ret;
            len = 1;
            let mut bp = park.bp;
            for i in 1..MAX_STACK_DEPTH {
                if bp == 0 {
                    break;
                }
                let Ok(ret) = read_user((bp + 8) as *const u64) else {
                    break;
                };
                let Ok(next) = read_user(bp as *const u64) else {
                    break;
                };
                if ret == 0 {
                    break;
                }
                (*out).frames[i] = ret;
                len = i as u64 + 1;
                // Frames lie at increasing addresses towards the root.
                if next <= bp {
                    break;
                }
                bp = next;
            }
        }
        (*out).frames_len = len;
    }
    entry.submit(wake_flag(&WAIT_EVENTS, &WAIT_EVENTS_RING));
}
