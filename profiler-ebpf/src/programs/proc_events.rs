//! The process tracepoints: task_newtask (forks of known processes, and
//! following descendants in `-- COMMAND` mode), exec (a new image; its
//! start from its point of no return) and exit (the daemon drops its
//! probes and state), sent on the process event ring.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_get_current_task, bpf_ktime_get_ns},
    },
    macros::{btf_map, tracepoint},
    programs::TracePointContext,
};
use profiler_common::{counter, proc_event, target_kind};

use crate::{
    counters::count,
    globals::{
        FOLLOW_FORKS, NEW_TASK_FLAGS_OFFSET, NEW_TASK_PID_OFFSET, REPORT_PROCESS_EVENTS, global,
        global_u8,
    },
    klog::{self, klog, why},
    maps::{FORKED, SEEN, TARGETS},
    process::{
        EXITED, is_target, note_image, send_proc_event, send_proc_event_at, send_proc_event_from,
    },
    programs::{
        heap::HEAP_THREADS,
        offcpu::{OFFCPU_DEEP_STACKS, OFFCPU_PARKED},
    },
    stack::copy::{DEEP_THREADS, STACK_TOPS},
    task_storage::TaskStorage,
};

/// `CLONE_THREAD` (include/uapi/linux/sched.h): the new task joins the
/// forking thread's process.
const CLONE_THREAD: u64 = 0x0001_0000;

/// Where the thread's exec is (ns), from its point of no return until it
/// completes: when it passed that point, then when the thread took the
/// new program's name. The EXEC event carries the latter: records taken
/// from then on show the new name, as `perf` charges samples after an
/// exec's COMM event to the new program; the exec's own end comes some
/// 100 us later.
#[btf_map]
static EXEC_STARTS: TaskStorage<u64> = TaskStorage::new();

/// Every new task, thread or process, in the forking thread before the
/// new task can run (copy_process's end, as sched_process_fork, whose
/// record does not tell a thread from a process; this one carries the
/// clone flags).
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    klog::run(ctx, try_task_newtask)
}

#[inline(always)]
fn try_task_newtask(ctx: TracePointContext) -> Result<u32, u32> {
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let pid_offset = global(&NEW_TASK_PID_OFFSET) as usize;
    let flags_offset = global(&NEW_TASK_FLAGS_OFFSET) as usize;
    // SAFETY: reading fields of the tracepoint record, at the offsets of
    // this kernel's format file.
    let child = unsafe { ctx.read_at::<i32>(pid_offset) }.map_err(|_| 0u32)? as u32;
    // SAFETY: as above.
    let flags: u64 = unsafe { ctx.read_at(flags_offset) }.map_err(|_| 0u32)?;
    // The id of a task that exited is someone else's from now on: a new
    // process under it is not the one marked exited, nor a child that
    // some earlier fork recorded.
    let _ = SEEN.remove(child);
    let _ = FORKED.remove(child);
    if flags & CLONE_THREAD != 0 {
        // A thread shares its process's mappings, probes and target
        // status; its id is never a process's. Reported as a fork (as it
        // once was), it left a fork record under its id in the daemon,
        // and a later process under that id, forked by a process the
        // daemon did not know, took that record's parent's name.
        return Ok(0);
    }
    // SAFETY: presence check only.
    let parent_seen = unsafe { SEEN.get(parent_tgid).is_some() };
    // A process there only for an on-demand capture is not followed.
    let follow = global_u8(&FOLLOW_FORKS) != 0
        // SAFETY: the value is copied out.
        && unsafe { TARGETS.get(parent_tgid) }.copied() == Some(target_kind::PROFILED);
    if !parent_seen && !follow {
        return Ok(0);
    }
    let recorded = parent_seen && FORKED.insert(child, parent_tgid, 0).is_ok();
    if recorded {
        // Sent before the child can run, so before its NEW event: a child
        // that is gone before the daemon reads its mappings is symbolized
        // with its parent's, which it shares until it execs.
        send_proc_event_from(proc_event::FORK, child, parent_tgid);
    }
    if !follow {
        return Ok(0);
    }
    if TARGETS.insert(child, target_kind::PROFILED, 0).is_ok() {
        count(counter::FORKS_FOLLOWED);
        if global_u8(&REPORT_PROCESS_EVENTS) != 0 {
            // The daemon attaches heap probes for the child.
            let parent = if recorded { parent_tgid } else { 0 };
            send_proc_event_from(proc_event::NEW, child, parent);
        }
    } else {
        count(counter::TARGETS_FULL);
        klog!(why::TARGETS_FULL, parent_tgid, klog::tid(), child);
    }
    Ok(0)
}

/// Notes when an exec passed its point of no return (Linux 6.10+; older
/// kernels lack the tracepoint, and the EXEC event then carries its own
/// time).
#[tracepoint]
pub fn sched_prepare_exec(_ctx: TracePointContext) -> u32 {
    if let Some(start) = EXEC_STARTS.current(true) {
        // SAFETY: the current thread's value.
        unsafe { *start = bpf_ktime_get_ns() };
    }
    0
}

/// Notes when an exec in progress gave the thread its new name. Renames
/// outside an exec (prctl, /proc/PID/comm) find no exec to note.
#[tracepoint]
pub fn task_rename(_ctx: TracePointContext) -> u32 {
    if let Some(start) = EXEC_STARTS.current(false) {
        // SAFETY: the current thread's value.
        let renamed = unsafe {
            if *start == 0 {
                return 0;
            }
            *start = bpf_ktime_get_ns();
            *start
        };
        note_image((bpf_get_current_pid_tgid() >> 32) as u32, renamed);
    }
    0
}

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    klog::run(_ctx, try_sched_process_exec)
}

#[inline(always)]
fn try_sched_process_exec(_ctx: TracePointContext) -> Result<u32, u32> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let forked = FORKED.remove(tgid).is_ok();
    // SAFETY: plain helper.
    let mut started = unsafe { bpf_ktime_get_ns() };
    if let Some(start) = EXEC_STARTS.current(false) {
        // SAFETY: the current thread's value; taken, so that a later exec
        // on a kernel without the prepare tracepoint cannot reuse it.
        unsafe {
            if *start != 0 && *start <= started {
                started = *start;
            }
            *start = 0;
        }
    }
    note_image(tgid, started);
    // SAFETY: presence check only.
    if (global_u8(&REPORT_PROCESS_EVENTS) != 0 && is_target(tgid))
        || unsafe { SEEN.get(tgid).is_some() }
    {
        send_proc_event_at(proc_event::EXEC, tgid, 0, started);
    } else if forked {
        send_proc_event(proc_event::FORGET_FORK, tgid);
    }
    Ok(0)
}

#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    klog::run(_ctx, try_sched_process_exit)
}

#[inline(always)]
fn try_sched_process_exit(_ctx: TracePointContext) -> Result<u32, u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let _ = HEAP_THREADS.remove(tid);
    // SAFETY: plain helper; the address is only a key.
    let task = unsafe { bpf_get_current_task() };
    let _ = OFFCPU_PARKED.remove(task);
    let _ = OFFCPU_DEEP_STACKS.remove(task);
    let _ = STACK_TOPS.remove(tid);
    let _ = DEEP_THREADS.remove(tid);
    let _ = FORKED.remove(tid);
    if tid != tgid {
        // A thread: its process lives on. (Thread ids are never targets:
        // task_newtask follows new processes only.)
        return Ok(0);
    }
    // The process is gone: a new process that gets its pid is someone else,
    // not a target (the daemon's own clean-up comes up to a second later).
    let was_target = TARGETS.remove(tgid).is_ok();
    // SAFETY: the value is copied out.
    let seen = unsafe { SEEN.get(tgid) }.copied();
    // A target the daemon heard of (it holds probes for it) is reported even
    // if it was never sampled, or its probes would outlive it.
    let reported_target = was_target && global_u8(&REPORT_PROCESS_EVENTS) != 0;
    if seen.is_some_and(|v| v != EXITED) || (seen.is_none() && reported_target) {
        // Marked, so that the samples of its exit path are not taken for a
        // new process.
        let _ = SEEN.insert(tgid, EXITED, 0);
        send_proc_event(proc_event::EXIT, tgid);
    }
    Ok(0)
}
