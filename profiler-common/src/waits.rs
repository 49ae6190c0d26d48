//! Block and mutex profiles: futex calls and kept wake-ups, condition
//! and Go park points, and the wait records (full, brief, delays).

use crate::{COMM_LEN, MAX_STACK_DEPTH, STACK_COPY_BYTES, WALK_HINT_WORDS};

/// futex(2) commands (`op & FUTEX_CMD_MASK`).
pub mod futex_op {
    pub const CMD_MASK: u64 = 0x7f;
    pub const WAIT: u64 = 0;
    pub const WAKE: u64 = 1;
    pub const REQUEUE: u64 = 3;
    pub const CMP_REQUEUE: u64 = 4;
    pub const WAKE_OP: u64 = 5;
    pub const LOCK_PI: u64 = 6;
    pub const UNLOCK_PI: u64 = 7;
    pub const WAIT_BITSET: u64 = 9;
    pub const WAKE_BITSET: u64 = 10;
    pub const WAIT_REQUEUE_PI: u64 = 11;
    pub const CMP_REQUEUE_PI: u64 = 12;
    pub const LOCK_PI2: u64 = 13;
}

/// A futex system call in progress on a thread (the `FUTEX_CALLS` map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FutexCall {
    /// When it was entered (ns, CLOCK_MONOTONIC).
    pub start_ns: u64,
    /// The futex word.
    pub uaddr: u64,
    /// A kept wake-up's id.
    pub wake_id: u64,
    /// 1: a wait; 2: a wake-up kept for the mutex profile.
    pub kind: u32,
    pub _pad: u32,
}

/// Values of [`FutexCall::kind`].
pub mod futex_call {
    /// None in progress (the last one ended).
    pub const NONE: u32 = 0;
    pub const WAIT: u32 = 1;
    pub const WAKE: u32 = 2;
}

/// The latest kept wake-up of a futex word (the `FUTEX_WAKERS` map): the
/// waits it ended report their delays against it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FutexWaker {
    /// Identity of the wake-up (the waker's tid and its entry time).
    pub wake_id: u64,
    /// When the waker entered the wake-up call.
    pub time_ns: u64,
    /// Waits it ended that have reported (bounded by `woken`).
    pub claimed: u32,
    /// How many waiters it woke (0 until the waker's call returns).
    pub woken: u32,
}

/// Futex words with a kept wake-up remembered at once.
pub const FUTEX_WAKERS_ENTRIES: u32 = 16_384;

/// Slots of the times of the latest kept wake-ups, by futex word hash (a
/// power of two).
pub const WAKER_TIME_SLOTS: u32 = 4096;

/// Bytes in the ring buffer of wait events.
pub const WAIT_EVENTS_BYTES: u32 = 16 * 1024 * 1024;

/// What a wait event reports (its first word).
pub mod wait_event {
    /// A kept futex wait (block profile), with the waiter's stack.
    pub const BLOCK: u32 = 1;
    /// A kept contended wake-up (mutex profile), with the waker's stack.
    pub const MUTEX_WAKE: u32 = 2;
    /// A wait ended by a kept wake-up: its delay ([`super::MutexDelay`]).
    pub const MUTEX_DELAY: u32 = 3;
    /// A kept off-CPU interval ([`super::OffcpuRecord`]).
    pub const OFFCPU: u32 = 4;
}

/// Bits of [`WaitHead::flags`] and [`OffcpuRecord::flags`].
pub mod wait_flags {
    /// The first frame is a return address (a Go goroutine's park point),
    /// not the thread's instruction pointer.
    pub const RETURN_ADDRESS: u32 = 1;
    /// The thread's stack holds, at every offset of the daemon's walk hint
    /// `hint_id`, the word the hint expects, and the record carries that
    /// walk's frames (after the instruction pointer): `frames` and
    /// `frames_len` of a [`super::WaitBrief`] or [`super::OffcpuRecord`].
    /// The daemon uses them as they are: it needs no state of its own to
    /// read the record.
    pub const HINT_MATCHED: u32 = 2;
    /// With `HINT_MATCHED`: no stack copy follows (a [`super::WaitBrief`],
    /// or an off-CPU record with an empty copy). The kernel checked the
    /// hinted words in user memory itself.
    pub const BRIEF: u32 = 4;
    /// With `HINT_MATCHED`: the remembered walk stopped before the root
    /// (its stack is shown as truncated, as the walk's was).
    pub const WALK_TRUNCATED: u32 = 8;
    /// A goroutine's park: bits [`GO_REASON_SHIFT`].. hold the `waitReason`
    /// it parked with (gopark's third argument; numbered per Go release).
    pub const GO_WAIT_REASON: u32 = 16;
    /// Where a goroutine park's wait reason lies in the flags.
    pub const GO_REASON_SHIFT: u32 = 8;
    /// A CPython thread's wait or wake-up: the record (full or brief) is
    /// the `record` of a `WithPython<_, WAIT_PY_FRAMES>`, the thread's
    /// Python frames after it.
    pub const PYTHON: u32 = 32;
    /// An off-CPU record of a thread marked deep: parked, its stack copy
    /// is in the thread's `OFFCPU_DEEP_STACKS` slot; sent, the record is
    /// the long form.
    pub const LONG_STACK: u32 = 64;
}

/// Python frames a wait record of a CPython thread carries (nearest the
/// leaf kept): as many as an off-CPU interval's, the same ring.
pub const WAIT_PY_FRAMES: usize = crate::OFFCPU_PY_FRAMES;

/// POSIX condition variable waits probed for the block profile (uprobe
/// cookie): at their entry the thread notes which condition it is about to
/// wait on, so that its futex wait names the condition, not only a word
/// inside it.
pub mod cond_fn {
    pub const WAIT: u64 = 0;
    pub const TIMEDWAIT: u64 = 1;
    pub const CLOCKWAIT: u64 = 2;
    /// Symbol names, indexed by the constants above (every symbol version).
    pub const NAMES: [&str; 3] = [
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "pthread_cond_clockwait",
    ];
}

/// Bytes of a `pthread_cond_t` (x86_64 glibc and musl): a futex wait on a
/// word within this span of the condition a thread entered a wait on is
/// that condition's wait; the wait to take the mutex again is not.
pub const COND_BYTES: u64 = 48;

/// The condition variable wait a thread entered last (the `COND_WAITS`
/// task storage).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CondWait {
    /// The `pthread_cond_t`'s address.
    pub cond: u64,
    /// The mutex given with it.
    pub mutex: u64,
}

/// Go runtime park points probed for the block profile (uprobe cookie).
///
/// Every function's cookie carries, above the function, what the
/// release that built the executable needs (`release_bits`): the wait
/// reasons of sync.Mutex and sync.RWMutex waits, the other reasons of
/// semaphore waits (`semacquire`, `sync.WaitGroup.Wait`), and where a
/// `sudog` keeps its `waiters` count (none before Go 1.22, whose mutex
/// profile counts a queue's wait once).
pub mod go_fn {
    /// `runtime.gopark`: the current goroutine parks.
    pub const GOPARK: u64 = 0;
    /// `runtime.ready`: a parked goroutine is made runnable.
    pub const READY: u64 = 1;
    /// `runtime.readyWithTime(s *sudog, ...)`: a semaphore's releaser
    /// readies the waiter `s.g` (sync.Mutex, RWMutex, WaitGroup, Cond), on
    /// its own goroutine's stack.
    pub const READY_WITH_TIME: u64 = 2;
    /// `runtime.semacquire1`: a goroutine starts a semaphore wait, where
    /// Go's block profile starts timing it (once per call, however often
    /// it parks in it).
    pub const SEMACQUIRE: u64 = 3;
    /// The cookie's bits that name the function.
    pub const FUNCTION: u64 = 0xff;
    /// Symbol names, indexed by the constants above.
    pub const NAMES: [&str; 4] = [
        "runtime.gopark",
        "runtime.ready",
        "runtime.readyWithTime",
        "runtime.semacquire1",
    ];

    /// The cookie bits of a release whose sync.Mutex and sync.RWMutex
    /// waiters park with the `waitReason`s `mutex` (all three the same,
    /// or consecutive), whose other semaphore waits park with `sema` (0:
    /// none), and whose `sudog.waiters` is at byte `waiters_at` (0: the
    /// release has none; else 54 or 62). They fit the 32 bits a cookie
    /// has for the function (`probe_cookie::FUNCTION`): reasons of 6 bits
    /// (bits 8-13, the mutex reasons' count in 14-15, then 16-21 and
    /// 22-27), the `waiters` place in 28-29. None for values that do not
    /// fit.
    pub const fn release_bits(mutex: [u8; 3], sema: [u8; 2], waiters_at: u8) -> Option<u64> {
        let count = if mutex[0] == mutex[1] && mutex[1] == mutex[2] {
            1
        } else if mutex[1] == mutex[0] + 1 && mutex[2] == mutex[0] + 2 {
            3
        } else {
            return None;
        };
        let waiters = match waiters_at {
            0 => 0,
            54 => 1,
            62 => 2,
            _ => return None,
        };
        if mutex[2] >= 64 || sema[0] >= 64 || sema[1] >= 64 {
            return None;
        }
        Some(
            (mutex[0] as u64) << 8
                | count << 14
                | (sema[0] as u64) << 16
                | (sema[1] as u64) << 22
                | waiters << 28,
        )
    }

    /// Whether a cookie names `reason` as a mutex wait.
    pub const fn is_mutex_reason(cookie: u64, reason: u8) -> bool {
        let first = ((cookie >> 8) & 0x3f) as u8;
        let count = ((cookie >> 14) & 0x3) as u8;
        reason != 0 && first != 0 && reason >= first && reason - first < count
    }

    /// Whether a cookie names `reason` as a semaphore wait (a mutex's or
    /// another's: the waits `semacquire1` parks).
    pub const fn is_sema_reason(cookie: u64, reason: u8) -> bool {
        is_mutex_reason(cookie, reason)
            || (reason != 0
                && (((cookie >> 16) & 0x3f) as u8 == reason
                    || ((cookie >> 22) & 0x3f) as u8 == reason))
    }

    /// Where a `sudog` keeps its `waiters` count in the cookie's
    /// release; 0 where it has none (before Go 1.22).
    pub const fn waiters_at(cookie: u64) -> u64 {
        match (cookie >> 28) & 0x3 {
            1 => 54,
            2 => 62,
            _ => 0,
        }
    }
}

/// A goroutine's semaphore wait in progress (the `GO_SEMA_CALLS` map, by
/// process and `g`): when its `semacquire1` call began, and when it was
/// last readied in that call (a woken waiter that finds the semaphore
/// taken parks again in the same call, and Go times the call as one).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GoSemaCall {
    pub start_ns: u64,
    pub last_ready_ns: u64,
    /// The semaphore's address (`semacquire1`'s first argument).
    pub addr: u64,
    /// The wait's start as the runtime's mutex profile keeps it
    /// (`sudog.acquiretime`): the call's start, then what it was when the
    /// waiter was last released in the call (kept if it queues again).
    pub acquire_ns: u64,
    /// The call queues its waiter at the head (`lifo`: a sync.Mutex
    /// waiter woken before that found the lock taken), not at the tail.
    pub lifo: u32,
    pub _pad: u32,
}

/// Goroutines in a semaphore wait whose start is remembered (some 1.7 MB
/// of map; one evicted is timed from its park, as before its call was
/// seen).
pub const GO_SEMA_CALLS_ENTRIES: u32 = 16_384;

/// The queue of mutex waiters on one semaphore (the `GO_SEMA_ROOTS` map,
/// by process and the semaphore's address, or its root's lock where the
/// call was not seen), as far as the probes saw it: what Go's mutex
/// profile needs to charge a release as the runtime does.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GoSemaRoot {
    /// Mutex waiters parked on it now.
    pub waiting: u32,
    pub _pad: u32,
    /// The head's and the tail's `acquiretime` as the runtime keeps them:
    /// a waiter's own start when it queues alone (or at the tail), the
    /// head's kept by a waiter queued in front of it, and both reset to
    /// the release's time by each release that leaves waiters behind.
    pub head_ns: u64,
    pub tail_ns: u64,
    /// When it last changed.
    pub touched_ns: u64,
}

/// Semaphores whose queues are followed (contended at once: an evicted
/// one is charged each waiter's own wait, as before queues were followed).
pub const GO_SEMA_ROOTS_ENTRIES: u32 = 4096;

/// A parked goroutine (the `GO_PARKED` map, by process and `g` address):
/// when and where it parked.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GoPark {
    pub start_ns: u64,
    /// Registers at runtime.gopark's entry: the return address is at
    /// `sp`, the caller's frame pointer in `bp`.
    pub sp: u64,
    pub bp: u64,
    /// For a mutex wait, the semaphore root's lock it queued under
    /// (gopark's `lock`); else 0.
    pub root: u64,
    pub tid: u32,
    /// The `waitReason` it parked with (gopark's third argument).
    pub reason: u32,
    pub comm: [u8; COMM_LEN],
}

/// Set in `GoPark::reason` when a semaphore wait's `semacquire1` call began
/// before its park's window (the duty-cycled probes were detached then):
/// Go times that wait from the call, so by the window's rule it began
/// before the window, and is not the block profile's (the mutex profile
/// still follows its queue).
pub const GO_PARK_CALL_BEFORE_WINDOW: u32 = 1 << 31;

/// Goroutines parked at once whose park points are remembered.
pub const GO_PARKED_ENTRIES: u32 = 65_536;

/// The duty cycle of one Go process's park probes (the `GO_PARK_GATES`
/// map, by process), which the daemon sets when the probes would cost the
/// process more than its budget: the probes record a park, and keep a
/// wait, only inside `[since_ns, until_ns)` (kernel monotonic time), so a
/// wait is kept only when it began and ended in one open window; outside
/// its windows the daemon detaches them. The kernel adds an open entry
/// (`since_ns` 0, `until_ns` `u64::MAX`) the first time a process runs
/// them, and counts every run inside the window in `runs`, by which the
/// daemon measures the process's park rate.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParkGate {
    pub since_ns: u64,
    pub until_ns: u64,
    pub runs: u64,
}

impl ParkGate {
    /// Always open: every park and wait is seen.
    pub const OPEN: ParkGate = ParkGate {
        since_ns: 0,
        until_ns: u64::MAX,
        runs: 0,
    };
}

/// Go processes whose park probes' gates are kept (least recently run
/// first out: an evicted process is re-added open, and the daemon closes
/// it again at its next window).
pub const GO_PARK_GATE_ENTRIES: u32 = 4096;

/// What every kept wait or wake-up reports: the head of a
/// [`WaitStack`], or of a [`WaitBrief`] when the kernel matched the stack
/// against a walk hint.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WaitHead {
    /// `wait_event::BLOCK` or `wait_event::MUTEX_WAKE`.
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    /// `wait_flags`.
    pub flags: u32,
    /// The process that forked this one, when the kernel knows it for a
    /// child of a known process that has not exec'd (as
    /// `proc_event::NEW`'s `parent`); else 0.
    pub parent: u32,
    pub _pad: u32,
    /// BLOCK: how long the wait lasted (ns). MUTEX_WAKE: the wake-up's id.
    pub value: u64,
    /// The futex word.
    pub uaddr: u64,
    /// User registers of the thread (saved on entering the kernel).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// With `wait_flags::HINT_MATCHED`: the walk hint the stack matched.
    pub hint_id: u64,
    /// When the wait ended or the wake-up happened (ns, CLOCK_MONOTONIC).
    pub time_ns: u64,
    /// BLOCK: the condition variable waited on, when the futex word lies
    /// in the one the thread entered `pthread_cond_*wait` with; else 0.
    pub cond: u64,
    /// A goroutine's park: the id of its pprof label set (a
    /// `GO_LABEL_SETS` key; 0: none).
    pub go_labels: u64,
    pub comm: [u8; COMM_LEN],
}

/// A kept wait or wake-up whose stack matched one of the daemon's walk
/// hints (`wait_flags::HINT_MATCHED | BRIEF`): the walk's frames instead of
/// a stack copy. Writing a copy into the ring, whose memory is cold in the
/// writing CPU's cache, was most of a kept wait's cost; a few frames are
/// not.
///
/// A record has room for `N` frames, the smallest of
/// [`BRIEF_FRAME_CLASSES`] that holds its walk's: the ring then carries
/// about the bytes in use (a room for 32 frames is 352 bytes, most walks
/// have fewer than 8), so it fills and wakes the reader no sooner than
/// for a record of the head alone. Readers take the frames from the
/// record's length, not from `N`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WaitBrief<const N: usize = WALK_HINT_WORDS> {
    pub head: WaitHead,
    /// Frames of `frames` in use: the walk's frames after `head.ip`.
    pub frames_len: u64,
    pub frames: [u64; N],
}

/// The rooms for frames brief wait records come in (each a power of two,
/// the last [`WALK_HINT_WORDS`]).
pub const BRIEF_FRAME_CLASSES: [usize; 3] = [8, 16, WALK_HINT_WORDS];

/// Bytes before a brief record's frames.
pub const BRIEF_FRAMES_OFFSET: usize = core::mem::offset_of!(WaitBrief<1>, frames);

/// A kept wait or wake-up with the user stack where it happened (a copy for
/// unwinding in the daemon, or frame-pointer frames walked by the kernel).
/// A thread marked deep sends the long form, N = LONG_STACK_BYTES; the
/// daemon tells the forms apart by their length.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WaitStack<const N: usize = STACK_COPY_BYTES> {
    pub head: WaitHead,
    /// Bytes of `stack` copied from `sp` up (0: frames were walked instead).
    pub stack_len: u64,
    /// Frames of `frames` in use (frame-pointer walk).
    pub frames_len: u64,
    pub frames: [u64; MAX_STACK_DEPTH],
    pub stack: [u8; N],
}

/// A wait ended by a kept wake-up, and how long it waited.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MutexDelay {
    /// `wait_event::MUTEX_DELAY`.
    pub kind: u32,
    pub tgid: u32,
    pub wake_id: u64,
    pub delay_ns: u64,
}
