//! `cpu_sample`, on every CPU-clock tick of every online CPU: keeps the
//! sample only for targeted processes (when filtering is on) and either
//! sends it with a copy of the user stack for the daemon to unwind, or
//! records frame-pointer stacks in a stack map keyed by a 64-bit hash of
//! the frames and adds one to the sample's per-CPU count. (The kernel's
//! own stack-trace map is not used: it has one slot per hash bucket and
//! loses a stack whenever two stacks share a bucket.) Counts and stacks
//! are double-buffered: the daemon flips `CONTROL[ACTIVE_BUFFER]` and
//! drains the buffer the kernel no longer writes, so draining never races
//! a writer and per-CPU counts never lose an update.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, BPF_F_USER_STACK, BPF_NOEXIST, bpf_perf_event_data},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid,
        generated::{bpf_get_attach_cookie, bpf_get_stack, bpf_ktime_get_ns},
    },
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, ProgramArray, RingBuf},
    programs::PerfEventContext,
};
use profiler_common::{
    COMM_LEN, COUNTS_ENTRIES, FpProcess, LONG_STACK_BYTES, MAX_STACK_DEPTH, PyFrames, PySample,
    SHORT_STACK_BYTES, STACK_COPY_BYTES, STACK_LOST, STACK_NONE, STACK_SAMPLES_BYTES,
    STACKS_ENTRIES, SampleKey, Stack, StackHash, StackSample, control, counter,
};

use crate::{
    counters::{count, count_n},
    globals::{STACK_SAMPLES_RING, TIME_GO_LABELS, global_u8},
    go_labels::go_label_set,
    klog::{self, klog, why},
    maps::wake_flag,
    process::{anchor_young_image, is_target, note_process},
    python::{is_python, python_process},
    python_records::{copy_python_frames, cpu_python_frames},
    stack::{
        UserRegs,
        copy::{counted_copy_stack, needs_long_copy, stack_fits},
        fp_process, leaf_words, task_user_regs, use_dwarf,
    },
};

/// -EFAULT from bpf_get_stack: no stack of that kind for this sample.
const EFAULT: i64 = -14;

#[map]
static CONTROL: Array<u32> = Array::with_max_entries(control::COUNT, 0);

#[map]
static COUNTS_0: PerCpuHashMap<SampleKey, u64> = PerCpuHashMap::with_max_entries(COUNTS_ENTRIES, 0);

#[map]
static COUNTS_1: PerCpuHashMap<SampleKey, u64> = PerCpuHashMap::with_max_entries(COUNTS_ENTRIES, 0);

#[map]
static STACKS_0: HashMap<StackHash, Stack> =
    HashMap::with_max_entries(STACKS_ENTRIES, BPF_F_NO_PREALLOC);

#[map]
static STACKS_1: HashMap<StackHash, Stack> =
    HashMap::with_max_entries(STACKS_ENTRIES, BPF_F_NO_PREALLOC);

/// Per-CPU scratch space for the stack being recorded (too big for the
/// 512-byte BPF stack).
#[map]
static SCRATCH: PerCpuArray<Stack> = PerCpuArray::with_max_entries(1, 0);

#[map]
static STACK_SAMPLES: RingBuf = RingBuf::with_byte_size(STACK_SAMPLES_BYTES, 0);

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    klog::run(ctx, try_cpu_sample)
}

#[inline(always)]
fn try_cpu_sample(ctx: PerfEventContext) -> Result<u32, u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    // The idle task: the CPU did no work for anyone. An on-demand
    // capture's own events are opened on its processes' threads, which
    // need not be targets.
    if tid == 0 || (tap(&ctx) == 0 && !is_target(tgid)) {
        return Ok(0);
    }
    count(counter::SAMPLES);
    let image_since = note_process(tgid);
    anchor_young_image(ctx.as_ptr(), tgid, image_since);

    let comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
    if use_dwarf(tgid) {
        // A CPython process's sample is taken by a program of its own,
        // which adds the thread's Python frames; loaded once a Python
        // process is marked. Until then (or if the call fails), it is
        // taken here, native frames only.
        if is_python(tgid)
            && let Some(pending) = PENDING_SAMPLE.get_ptr_mut(0)
        {
            // SAFETY: this CPU's slot; the tail-called program reads it next.
            unsafe {
                (*pending).tgid = tgid;
                (*pending).tid = tid;
                (*pending).image_since = image_since;
                (*pending).comm = comm;
                PY_PROGRAMS.tail_call(&ctx, 0);
            }
        }
        if send_stack_sample(&ctx, (tgid, tid, image_since), &comm) {
            return Ok(0);
        }
    }
    // A Go process's sample is taken by a program of its own, which adds
    // the words a frameless leaf's caller may be in and the goroutine's
    // labels; it is loaded only once a Go process is marked, so that its
    // verification does not delay the start. Until then (or if the call
    // fails), the sample is taken here, as walked.
    if let Some(process) = fp_process(tgid)
        && let Some(pending) = PENDING_SAMPLE.get_ptr_mut(0)
    {
        // SAFETY: this CPU's slot; the tail-called program reads it next.
        unsafe {
            (*pending).tgid = tgid;
            (*pending).tid = tid;
            (*pending).image_since = image_since;
            (*pending).comm = comm;
            core::ptr::copy_nonoverlapping(process, &mut (*pending).process, 1);
            GO_PROGRAMS.tail_call(&ctx, 0);
        }
    }
    let key = walked_sample(&ctx, tgid, tid, comm, image_since);
    add_count(key.0, &key.1);
    Ok(0)
}

/// Records the frame-pointer stacks of a sample in the buffer the kernel
/// writes now; returns that buffer and the sample's key.
#[inline(always)]
fn walked_sample(
    ctx: &PerfEventContext,
    tgid: u32,
    tid: u32,
    comm: [u8; COMM_LEN],
    image_since: u64,
) -> (u32, SampleKey) {
    let active = CONTROL.get(control::ACTIVE_BUFFER).copied().unwrap_or(0);
    let stacks = if active == 0 { &STACKS_0 } else { &STACKS_1 };
    let user_stack = record_stack(
        ctx,
        stacks,
        BPF_F_USER_STACK as u64,
        counter::USER_STACK_LOST,
    );
    // A sample taken in user mode has no kernel stack: skip the helper.
    let kernel_stack = if in_user_mode(ctx) {
        STACK_NONE
    } else {
        record_stack(ctx, stacks, 0, counter::KERNEL_STACK_LOST)
    };
    let key = SampleKey {
        tgid,
        tid,
        user_stack,
        kernel_stack,
        comm,
        image_since,
        leaf_words: [0; 2],
        go_labels: 0,
        tap: tap(ctx),
    };
    (active, key)
}

/// The on-demand capture whose own events fired (their links' cookie);
/// 0 for the schedule's events, linked without one.
#[inline(always)]
fn tap(ctx: &PerfEventContext) -> u64 {
    // SAFETY: a perf_event program's context; the helper reads its event.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// What `cpu_sample` hands to `go_sample`: the sample's thread and image,
/// and the process's entry.
#[repr(C)]
struct PendingSample {
    tgid: u32,
    tid: u32,
    image_since: u64,
    comm: [u8; COMM_LEN],
    process: FpProcess,
}

#[map]
static PENDING_SAMPLE: PerCpuArray<PendingSample> = PerCpuArray::with_max_entries(1, 0);

/// The sample `cpu_sample` handed over (tgid, tid, comm, image start), in
/// the program it tail-called.
#[inline(always)]
fn pending_sample() -> Result<(u32, u32, [u8; COMM_LEN], u64), u32> {
    let pending = PENDING_SAMPLE.get_ptr(0).ok_or(0u32)?;
    // SAFETY: this CPU's slot, written by cpu_sample just before.
    let pending = unsafe { &*pending };
    Ok((pending.tgid, pending.tid, pending.comm, pending.image_since))
}

/// Slot 0: `go_sample`, set by the daemon when it loads it.
#[map]
static GO_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Slot 0: `py_sample`, set by the daemon when it loads it.
#[map]
static PY_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// `go_sample`, tail-called by `cpu_sample` for a sample of a Go process:
/// records its frame-pointer stacks as `cpu_sample` does, adds the words
/// a frameless leaf's caller may be in and the goroutine's label set, and
/// counts the sample.
#[perf_event]
pub fn go_sample(ctx: PerfEventContext) -> u32 {
    klog::run(ctx, try_go_sample)
}

#[inline(always)]
fn try_go_sample(ctx: PerfEventContext) -> Result<u32, u32> {
    let (tgid, tid, comm, image_since) = pending_sample()?;
    let (active, mut key) = walked_sample(&ctx, tgid, tid, comm, image_since);
    if key.user_stack != STACK_NONE
        && key.user_stack != STACK_LOST
        && let Some(regs) = user_regs(&ctx)
    {
        // SAFETY: this CPU's slot, written by cpu_sample before the tail call
        // and read after the walk, unchanged.
        let process = unsafe { &*PENDING_SAMPLE.get_ptr(0).ok_or(0u32)? }.process;
        key.leaf_words = leaf_words(&process, regs.sp);
        key.go_labels = timed_label_set(&process.go, tgid, regs.r14, regs.sp);
    }
    add_count(active, &key);
    Ok(0)
}

/// [`go_label_set`], timed under `[debug] time_go_labels`.
#[inline(always)]
fn timed_label_set(go: &profiler_common::GoRuntime, tgid: u32, g: u64, sp: u64) -> u64 {
    if global_u8(&TIME_GO_LABELS) == 0 {
        return go_label_set::<true>(go, tgid, g, sp);
    }
    // SAFETY: a helper without arguments.
    let start = unsafe { bpf_ktime_get_ns() };
    let id = go_label_set::<true>(go, tgid, g, sp);
    // SAFETY: as above.
    let took = unsafe { bpf_ktime_get_ns() }.wrapping_sub(start);
    count_n(counter::GO_LABEL_READ_NS, took);
    count(counter::GO_LABEL_READS);
    id
}

/// `py_sample`, tail-called by `cpu_sample` for a sample of a CPython
/// process: sends it with its stack copy, as `cpu_sample` does, and the
/// Python frames of the thread.
#[perf_event]
pub fn py_sample(ctx: PerfEventContext) -> u32 {
    klog::run(ctx, try_py_sample)
}

#[inline(always)]
fn try_py_sample(ctx: PerfEventContext) -> Result<u32, u32> {
    let (tgid, tid, comm, image_since) = pending_sample()?;
    // Nested, not a tuple of options: a tuple's None carries an undefined
    // payload that the compiler may store from an unset register, which
    // the verifier refuses.
    let sent = match user_regs(&ctx) {
        Some(UserRegs { ip, sp, bp, .. }) => {
            let Some(py) = python_process(tgid) else {
                return finish_py_sample(&ctx, false, (tgid, tid, comm, image_since));
            };
            // SAFETY: a map value, read in place.
            let py = unsafe { &*py };
            let (who, regs) = ((tgid, tid, image_since), (ip, sp, bp));
            let py = cpu_python_frames(py, tid);
            if stack_fits(tid, sp, SHORT_STACK_BYTES) {
                send_py_sample_in::<SHORT_STACK_BYTES>(&ctx, who, &comm, regs, py)
            } else if needs_long_copy(tid, sp, STACK_COPY_BYTES) {
                send_py_sample_in::<LONG_STACK_BYTES>(&ctx, who, &comm, regs, py)
            } else {
                send_py_sample_in::<STACK_COPY_BYTES>(&ctx, who, &comm, regs, py)
            }
        }
        None => false,
    };
    finish_py_sample(&ctx, sent, (tgid, tid, comm, image_since))
}

/// Counts a Python process's CPU sample, sent with its stack, or (not
/// sent) records it as a walked sample.
#[inline(always)]
fn finish_py_sample(
    ctx: &PerfEventContext,
    sent: bool,
    (tgid, tid, comm, image_since): (u32, u32, [u8; COMM_LEN], u64),
) -> Result<u32, u32> {
    if sent {
        count(counter::STACK_SAMPLES);
    } else {
        count(counter::STACK_SAMPLES_FULL);
        let (active, key) = walked_sample(ctx, tgid, tid, comm, image_since);
        add_count(active, &key);
    }
    Ok(0)
}

/// Sends a CPU sample of a CPython process, with an N-byte stack copy and
/// the thread's Python frames.
#[inline(always)]
fn send_py_sample_in<const N: usize>(
    ctx: &PerfEventContext,
    who: (u32, u32, u64),
    comm: &[u8; COMM_LEN],
    regs: (u64, u64, u64),
    python: Option<*const PyFrames>,
) -> bool {
    let Some(mut entry) = STACK_SAMPLES.reserve::<PySample<N>>(0) else {
        return false;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: the entry is ours until submitted; written in place.
    // `python` is this CPU's scratch, walked by the caller.
    unsafe {
        fill_stack_sample::<N>(ctx, &mut (*out).sample, who, comm, regs);
        match python {
            Some(python) => copy_python_frames(&raw mut (*out).python, python),
            None => {
                (*out).python.len = 0;
                (*out).python.truncated = 0;
            }
        }
    }
    entry.submit(wake_flag(&STACK_SAMPLES, &STACK_SAMPLES_RING));
    true
}

/// Adds one to the count of `key` in buffer `active`.
#[inline(always)]
fn add_count(active: u32, key: &SampleKey) {
    let counts = if active == 0 { &COUNTS_0 } else { &COUNTS_1 };
    let key = *key;
    let (tgid, tid) = (key.tgid, key.tid);
    match counts.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of a per-CPU map; no other writer.
        Some(v) => unsafe { *v += 1 },
        None => {
            // Inserting from a program zeroes the other CPUs' slots.
            if counts.insert(key, 1u64, BPF_NOEXIST as u64).is_err() {
                // Another CPU inserted the key first: add to our slot.
                match counts.get_ptr_mut(key) {
                    // SAFETY: as above.
                    Some(v) => unsafe { *v += 1 },
                    None => {
                        count(counter::COUNTS_FULL);
                        klog!(why::COUNTS_FULL, tgid, tid);
                    }
                }
            }
        }
    }
}

/// The user registers (ip, sp, bp) of the current task: those of the
/// interrupted context when the sample hit user code, else the ones the
/// task saved on entering the kernel. None for kernel threads.
#[inline(always)]
fn user_regs(ctx: &PerfEventContext) -> Option<UserRegs> {
    let regs = if in_user_mode(ctx) {
        let data = ctx.as_ptr() as *const bpf_perf_event_data;
        // SAFETY: direct context loads, which the verifier rewrites to the
        // sampled registers (a probe read of the context would read the
        // kernel's own, different structure).
        unsafe {
            UserRegs {
                ip: (*data).regs.rip,
                sp: (*data).regs.rsp,
                bp: (*data).regs.rbp,
                r14: (*data).regs.r14,
            }
        }
    } else {
        task_user_regs()?
    };
    if regs.ip == 0 || regs.sp == 0 {
        return None;
    }
    Some(regs)
}

/// Sends the sample with a copy of the user stack for unwinding in the
/// daemon. Returns false (the caller records a frame-pointer sample
/// instead) for kernel threads and when the ring buffer is full.
#[inline(always)]
fn send_stack_sample(
    ctx: &PerfEventContext,
    (tgid, tid, image_since): (u32, u32, u64),
    comm: &[u8; COMM_LEN],
) -> bool {
    let Some(UserRegs { ip, sp, bp, .. }) = user_regs(ctx) else {
        return false;
    };
    let sent = if stack_fits(tid, sp, SHORT_STACK_BYTES) {
        send_stack_sample_in::<SHORT_STACK_BYTES>(ctx, (tgid, tid, image_since), comm, (ip, sp, bp))
    } else if needs_long_copy(tid, sp, STACK_COPY_BYTES) {
        send_stack_sample_in::<LONG_STACK_BYTES>(ctx, (tgid, tid, image_since), comm, (ip, sp, bp))
    } else {
        send_stack_sample_in::<STACK_COPY_BYTES>(ctx, (tgid, tid, image_since), comm, (ip, sp, bp))
    };
    if sent {
        count(counter::STACK_SAMPLES);
    } else {
        count(counter::STACK_SAMPLES_FULL);
        klog!(why::FRAME_POINTER_FALLBACK, tgid, tid);
    }
    sent
}

/// Sends a CPU sample in the record form with an N-byte stack copy.
#[inline(always)]
fn send_stack_sample_in<const N: usize>(
    ctx: &PerfEventContext,
    (tgid, tid, image_since): (u32, u32, u64),
    comm: &[u8; COMM_LEN],
    (ip, sp, bp): (u64, u64, u64),
) -> bool {
    let Some(mut entry) = STACK_SAMPLES.reserve::<StackSample<N>>(0) else {
        return false;
    };
    // SAFETY: the entry is ours until submitted.
    unsafe {
        fill_stack_sample::<N>(
            ctx,
            &mut *entry.as_mut_ptr(),
            (tgid, tid, image_since),
            comm,
            (ip, sp, bp),
        )
    };
    entry.submit(wake_flag(&STACK_SAMPLES, &STACK_SAMPLES_RING));
    true
}

/// Writes a CPU sample with an N-byte stack copy into `out`, in place:
/// the record is far larger than the BPF stack.
#[inline(always)]
fn fill_stack_sample<const N: usize>(
    ctx: &PerfEventContext,
    out: &mut StackSample<N>,
    (tgid, tid, image_since): (u32, u32, u64),
    comm: &[u8; COMM_LEN],
    (ip, sp, bp): (u64, u64, u64),
) {
    let out: *mut StackSample<N> = out;
    // SAFETY: `out` is a ring entry the caller owns.
    unsafe {
        (*out).tgid = tgid;
        (*out).tid = tid;
        (*out).time_ns = bpf_ktime_get_ns();
        (*out).image_since = image_since;
        (*out).tap = tap(ctx);
        (*out).ip = ip;
        (*out).sp = sp;
        (*out).bp = bp;
        (*out).comm = *comm;
        let mut kernel_len = 0u64;
        if !in_user_mode(ctx) {
            let bytes = bpf_get_stack(
                ctx.as_ptr(),
                (*out).kernel.as_mut_ptr().cast(),
                (MAX_STACK_DEPTH * 8) as u32,
                0,
            );
            if bytes > 0 {
                kernel_len = (bytes as u64 / 8).min(MAX_STACK_DEPTH as u64);
            }
        }
        (*out).kernel_len = kernel_len;
        (*out).stack_len = counted_copy_stack::<N>((*out).stack.as_mut_ptr(), sp);
    }
}

/// Whether the interrupted code ran in user mode (CPL 3 in CS).
#[inline(always)]
fn in_user_mode(ctx: &PerfEventContext) -> bool {
    let data = ctx.as_ptr() as *const bpf_perf_event_data;
    // SAFETY: the context of a perf_event program is bpf_perf_event_data;
    // reading its registers is a checked context access.
    let cs = unsafe { (*data).regs.cs };
    cs & 3 == 3
}

/// Frames hashed per step of [`record_stack`]'s loop.
const HASH_STEP: usize = 8;

/// Records the current user (`flags` = BPF_F_USER_STACK) or kernel stack
/// and returns its hash, or STACK_NONE / STACK_LOST.
#[inline(always)]
fn record_stack(
    ctx: &PerfEventContext,
    stacks: &HashMap<StackHash, Stack>,
    flags: u64,
    lost: u32,
) -> StackHash {
    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        count(lost);
        return STACK_LOST;
    };
    // SAFETY: this CPU's scratch slot; nothing else uses it meanwhile.
    let buf = unsafe { &mut *buf };
    // SAFETY: the buffer is a map value of exactly the size passed.
    let bytes = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            buf.ips.as_mut_ptr().cast(),
            (MAX_STACK_DEPTH * 8) as u32,
            flags,
        )
    };
    if bytes <= 0 {
        // -EFAULT or nothing: a kernel thread has no user stack, and a
        // sample taken in user mode has no kernel stack.
        if bytes == 0 || bytes == EFAULT {
            return STACK_NONE;
        }
        count(lost);
        let why = match flags {
            0 => why::KERNEL_STACK_WALK_FAILED,
            _ => why::USER_STACK_WALK_FAILED,
        };
        klog!(why, klog::tgid(), klog::tid(), bytes);
        return STACK_LOST;
    }
    let len = (bytes as usize / 8).min(MAX_STACK_DEPTH);
    buf.len = len as u64;
    // FxHash-style mixing of every frame; 64 bits keep collisions between
    // the few thousand stacks of a window improbable. Eight frames per
    // step, those past the end masked to zero without a branch: a branch
    // per frame had the verifier walk the loop once per possible length
    // (14,400 of cpu_sample's 16,600 checked instructions); in steps of
    // eight the load takes about 10 ms instead of 13.5.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ len as u64;
    // The length read back through the stack, so that LLVM knows nothing
    // of its range and keeps the mask below as arithmetic: knowing it, it
    // turns the mask into a comparison, which BPF has only as a branch.
    // SAFETY: a local.
    let opaque_len = unsafe { core::ptr::read_volatile(&(len as u64)) };
    for step in 0..MAX_STACK_DEPTH.div_ceil(HASH_STEP) {
        let first = step * HASH_STEP;
        if first >= len {
            break;
        }
        for i in first..first + HASH_STEP {
            // All ones for a frame of the stack (i < len: the difference
            // wraps), zero past its end.
            let keep = 0u64.wrapping_sub((i as u64).wrapping_sub(opaque_len) >> 63);
            let ip = buf.ips.get(i).copied().unwrap_or(0);
            hash = (hash.rotate_left(5) ^ (ip & keep)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    if hash <= STACK_LOST {
        hash += 2;
    }
    // SAFETY: presence check only.
    if unsafe { stacks.get(hash).is_none() } {
        // -EEXIST: another CPU stored the same stack first, which is fine.
        // By reference: a copy of the 1 KiB stack would not fit the
        // 512-byte BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        let stored = stacks.insert(hash, &*buf, BPF_NOEXIST as u64);
        if let Err(e) = stored
            && e != -17
        {
            count(lost);
            let why = match flags {
                0 => why::KERNEL_STACK_MAP_FULL,
                _ => why::USER_STACK_MAP_FULL,
            };
            klog!(why, klog::tgid(), klog::tid(), e);
            return STACK_LOST;
        }
    }
    hash
}
