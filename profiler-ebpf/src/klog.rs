//! Kernel-side diagnostics: the programs say why they skip, drop, shorten
//! or fall back, through aya-log into the daemon's log (target
//! `profilerd::kernel`), when the daemon asks for it (`PROFILERD_LOG=debug`
//! or `[debug] kernel_log = true`).
//!
//! Off by default, at almost no cost: the daemon then sets [`KERNEL_LOG`]
//! (and aya-log's own `AYA_LOG_LEVEL`) to 0 before loading. Both are
//! read-only globals, so the verifier knows that every note and every log
//! call is unreachable and removes them; what stays is the load-time walk
//! over [`emit`]'s few hundred instructions, which is why it sends numbers
//! and the daemon has the texts.
//!
//! On, a site only notes what happened ([`klog!`]: a kind from [`why`], the
//! thread and up to four values) in a per-CPU list, and [`run`] sends the
//! notes when the program's body returns, from [`flush`], a function of its
//! own. An aya-log call keeps its record's fields on the BPF stack: at the
//! sites, inside the largest programs (futex_exit, sched_switch,
//! cpu_sample), they would not fit in the 512 bytes; after the body they
//! take some 50 bytes on top of the program's own. Each kind goes out at
//! most [`BURST`] times per CPU per second, and at most [`NOTES`] notes per
//! program run; the rest are counted in `counter::KERNEL_LOGS_DROPPED`.

use aya_ebpf::{helpers::generated::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use aya_log_ebpf::debug;
use profiler_common::counter;

/// 1 when the daemon reads the kernel's diagnostics.
#[unsafe(no_mangle)]
static KERNEL_LOG: u8 = 0;

/// Messages of one kind sent per CPU per second, at most.
const BURST: u64 = 8;
/// Notes kept per program run. The verifier checks every message for each
/// (some 100k instructions each, the limit being 1M per program).
const NOTES: usize = 2;

/// What a note says: the kinds are shared with the daemon, which has the
/// text of each (`profiler-daemon/src/bpf/log.rs`).
pub use profiler_common::why;

/// One thing a program noted.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Note {
    kind: u32,
    tgid: u32,
    tid: u32,
    _pad: u32,
    values: [u64; 4],
}

/// The notes of the program running on this CPU.
#[repr(C)]
pub struct Notes {
    len: u64,
    notes: [Note; NOTES],
}

/// Messages of one kind sent in the current second, on this CPU.
#[repr(C)]
pub struct Budget {
    second: u64,
    sent: u64,
}

#[map]
static LOG_NOTES: PerCpuArray<Notes> = PerCpuArray::with_max_entries(1, 0);
#[map]
static LOG_BUDGETS: PerCpuArray<Budget> = PerCpuArray::with_max_entries(why::COUNT, 0);

/// Whether kernel diagnostics are on.
#[inline(always)]
pub fn on() -> bool {
    crate::globals::global_u8(&KERNEL_LOG) != 0
}

/// Runs a program's body (an `#[inline(always)]` function of its context,
/// which returns `Err` to leave early; both carry the program's return
/// value), then sends what it noted. The log calls run after the body,
/// with none of its stack in use: their records' fields would not fit
/// beside the largest programs' stack (futex_exit, sched_switch,
/// cpu_sample).
#[inline(always)]
pub fn run<C>(ctx: C, body: impl FnOnce(C) -> Result<u32, u32>) -> u32 {
    let (Ok(ret) | Err(ret)) = body(ctx);
    if on() {
        flush();
    }
    ret
}

/// `klog!(kind, tgid, tid, values...)`: notes a [`why`] kind for thread
/// `tid` of process `tgid` with up to four values, when diagnostics are
/// on. The arguments are evaluated only then.
macro_rules! klog {
    ($kind:expr, $tgid:expr, $tid:expr) => {
        $crate::klog::klog!($kind, $tgid, $tid, 0, 0, 0, 0)
    };
    ($kind:expr, $tgid:expr, $tid:expr, $a:expr) => {
        $crate::klog::klog!($kind, $tgid, $tid, $a, 0, 0, 0)
    };
    ($kind:expr, $tgid:expr, $tid:expr, $a:expr, $b:expr) => {
        $crate::klog::klog!($kind, $tgid, $tid, $a, $b, 0, 0)
    };
    ($kind:expr, $tgid:expr, $tid:expr, $a:expr, $b:expr, $c:expr) => {
        $crate::klog::klog!($kind, $tgid, $tid, $a, $b, $c, 0)
    };
    ($kind:expr, $tgid:expr, $tid:expr, $a:expr, $b:expr, $c:expr, $d:expr) => {
        if $crate::klog::on() {
            $crate::klog::note(
                $kind,
                $tgid as u32,
                $tid as u32,
                [$a as u64, $b as u64, $c as u64, $d as u64],
            );
        }
    };
}
pub(crate) use klog;

/// Keeps a note for [`flush`], if the kind's budget and the list allow.
#[inline(always)]
pub fn note(kind: u32, tgid: u32, tid: u32, values: [u64; 4]) {
    if !allowed(kind) {
        return;
    }
    let Some(notes) = LOG_NOTES.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's list; a program that interrupts another on the
    // same CPU sends the other's notes with its own.
    unsafe {
        let len = (*notes).len as usize;
        match (*notes).notes.get_mut(len) {
            Some(slot) => {
                *slot = Note {
                    kind,
                    tgid,
                    tid,
                    _pad: 0,
                    values,
                };
                (*notes).len = len as u64 + 1;
            }
            None => crate::counters::count(counter::KERNEL_LOGS_DROPPED),
        }
    }
}

/// Whether a message of `kind` may go out now; counts it dropped if not.
#[inline(always)]
fn allowed(kind: u32) -> bool {
    let Some(budget) = LOG_BUDGETS.get_ptr_mut(kind) else {
        return false;
    };
    // SAFETY: plain helper.
    let second = unsafe { bpf_ktime_get_ns() } / 1_000_000_000;
    // SAFETY: this CPU's slot; a program that interrupts another on the
    // same CPU can only send one message more.
    unsafe {
        if (*budget).second != second {
            (*budget).second = second;
            (*budget).sent = 0;
        }
        if (*budget).sent >= BURST {
            crate::counters::count(counter::KERNEL_LOGS_DROPPED);
            return false;
        }
        (*budget).sent += 1;
    }
    true
}

/// Sends this CPU's notes through aya-log and empties the list.
#[inline(never)]
fn flush() {
    let Some(notes) = LOG_NOTES.get_ptr_mut(0) else {
        return;
    };
    for i in 0..NOTES {
        // SAFETY: this CPU's list (see note); read in place, as a copy
        // would take stack.
        let Some(note) = (unsafe { (*notes).notes.get(i) }) else {
            break;
        };
        // SAFETY: as above.
        if i as u64 >= unsafe { (*notes).len } {
            break;
        }
        emit(note);
    }
    // SAFETY: as above.
    unsafe { (*notes).len = 0 };
}

/// Sends one note: its kind and numbers only. The daemon writes the text
/// (`profiler-daemon/src/bpf/log.rs`): one log call with a text per kind
/// made this function 16,000 instructions, which the verifier walked in
/// every program that calls it, logging on or off (2.5 ms of each small
/// program's load, about 3 of cpu_sample's). A function of its own, so that the
/// verifier meets the same state after every note and checks the next
/// note once.
#[inline(never)]
fn emit(note: &Note) {
    let [a, b, c, d] = note.values;
    debug!(
        &(),
        "note {} {} {} {} {} {} {}", note.kind, note.tgid, note.tid, a, b, c, d
    );
}

/// The current task's process id.
#[inline(always)]
pub fn tgid() -> u32 {
    (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32
}

/// The current task's thread id.
#[inline(always)]
pub fn tid() -> u32 {
    aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32
}
