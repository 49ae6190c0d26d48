//! Records shared by the kernel programs (`profiler-ebpf`) and the daemon.
//!
//! Everything here is `#[repr(C)]` plain data: the kernel writes it into BPF
//! maps and the daemon reads the same bytes back. The `user` feature adds
//! `aya::Pod` so the daemon can use the types as map keys and values.
#![no_std]

pub mod sampling;

/// Length of a task's `comm` in the kernel (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Deepest stack the kernel records (kernel.perf_event_max_stack default).
pub const MAX_STACK_DEPTH: usize = 127;

/// Entries in each of the two count maps (double-buffered).
pub const COUNTS_ENTRIES: u32 = 16_384;
/// Entries in each of the two stack maps (double-buffered; allocated as
/// used, so an idle system pays little for a large bound).
pub const STACKS_ENTRIES: u32 = 16_384;
/// Processes that may be targeted at once (`--pid`, `-- COMMAND` and descendants).
pub const TARGETS_ENTRIES: u32 = 8_192;
/// Processes whose first appearance has been reported to the daemon.
pub const SEEN_ENTRIES: u32 = 32_768;
/// Children of known processes that have not exec'd yet (LRU: the oldest
/// are forgotten first; the daemon trusts a fork record for a few seconds
/// only).
pub const FORKED_ENTRIES: u32 = 16_384;
/// Bytes in the process-event ring buffer.
pub const PROC_EVENTS_BYTES: u32 = 256 * 1024;

/// Identity of a recorded stack: a 64-bit hash of its frames, the key of
/// the stack map. Two values are reserved.
pub type StackHash = u64;
/// There is no stack of this kind (a kernel thread has no user stack; a
/// sample taken in user mode has no kernel stack).
pub const STACK_NONE: StackHash = 0;
/// The stack could not be recorded (stack map full, or the kernel failed to
/// walk it); the sample still counts.
pub const STACK_LOST: StackHash = 1;

/// One recorded stack: `len` instruction pointers, leaf first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Stack {
    pub len: u64,
    pub ips: [u64; MAX_STACK_DEPTH],
}

/// Bytes of user stack copied per sample for unwinding in the daemon
/// (from the stack pointer upwards; fewer near the top of the stack).
pub const STACK_COPY_BYTES: usize = 16 * 1024;
/// Stack bytes of the short form of a CPU sample or heap allocation
/// record, used when the thread's known stack top is this close to sp
/// (most threads, once the daemon has told the kernel where their stacks
/// end): a ring then holds about four times as many records. The daemon
/// tells the two forms apart by their length.
pub const SHORT_STACK_BYTES: usize = 4096;
/// Threads whose stack top is remembered at once (least recently used go).
pub const STACK_TOPS_ENTRIES: u32 = 65_536;
/// Bytes in the ring buffer of stack samples (about 470 samples in the
/// long form, 1600 in the short one).
pub const STACK_SAMPLES_BYTES: u32 = 8 * 1024 * 1024;

/// How user stacks are unwound (the `UNWIND_MODE` global).
pub mod unwind_mode {
    /// Frame pointers, walked by the kernel.
    pub const FP: u8 = 0;
    /// The daemon unwinds a copy of the stack with .eh_frame.
    pub const DWARF: u8 = 1;
    /// DWARF, except for processes the daemon marks as frame-pointer ones.
    pub const AUTO: u8 = 2;
}

/// One CPU sample whose user stack the daemon unwinds: the user registers,
/// a copy of the user stack, and the kernel stack. Sent through the
/// `STACK_SAMPLES` ring buffer, one record per sample.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackSample<const N: usize = STACK_COPY_BYTES> {
    pub tgid: u32,
    pub tid: u32,
    /// When the sample was taken (ns, CLOCK_MONOTONIC): tells the daemon
    /// which image of the process ran, against the time of its exec.
    pub time_ns: u64,
    /// User registers at the sample (from the interrupted context, or the
    /// task's saved user registers when the sample hit kernel code).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Bytes of `stack` that hold memory from `sp` upwards.
    pub stack_len: u64,
    /// Frames of `kernel` in use (0 for a sample taken in user mode).
    pub kernel_len: u64,
    pub comm: [u8; COMM_LEN],
    pub kernel: [u64; MAX_STACK_DEPTH],
    pub stack: [u8; N],
}

/// Key of one aggregated CPU sample: who ran, and where.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Process id (thread group id).
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// The user stack, or [`STACK_NONE`] / [`STACK_LOST`].
    pub user_stack: StackHash,
    /// The kernel stack, or [`STACK_NONE`] / [`STACK_LOST`].
    pub kernel_stack: StackHash,
    /// The thread's name at the time of the sample.
    pub comm: [u8; COMM_LEN],
    /// When the process's image started (ns, CLOCK_MONOTONIC, as the
    /// NEW or EXEC event of that image has it; 0: unknown): tells the
    /// daemon which image ran, whenever the counts are drained.
    pub image_since: u64,
}

/// What a [`ProcEvent`] reports.
pub mod proc_event {
    /// A process was seen for the first time: snapshot its metadata now,
    /// while it lives.
    pub const NEW: u32 = 1;
    /// A process called exec: its mappings changed.
    pub const EXEC: u32 = 2;
    /// A process's main thread exited.
    pub const EXIT: u32 = 3;
    /// A known (already sampled) process forked: `tgid` is the new task's
    /// id (a process, or a thread the daemon never sees as a tgid) and
    /// `parent` the forking process. Until it execs, a child maps what its
    /// parent mapped.
    pub const FORK: u32 = 4;
    /// A child reported by [`FORK`] exec'd (sent when [`EXEC`] is not):
    /// its parent's mappings no longer stand for it.
    pub const FORGET_FORK: u32 = 5;
    /// An [`super::ImageAnchors`] record: where some of a young image's
    /// files are mapped, for when its mappings cannot be read.
    pub const ANCHORS: u32 = 6;
}

/// Frames of an [`ImageAnchors`] record.
pub const ANCHOR_FRAMES: usize = 8;

/// How long after an image starts (its first sample, or its exec) its CPU
/// samples and sampled allocations send [`ImageAnchors`]: the daemon reads
/// the mappings of a new image within milliseconds, unless the process is
/// gone by then.
pub const ANCHOR_WINDOW_NS: u64 = 100_000_000;

/// One frame as `bpf_get_stack` gives it with `BPF_F_USER_BUILD_ID`
/// (`struct bpf_stack_build_id`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildIdFrame {
    /// `BPF_STACK_BUILD_ID_VALID` (1) when `build_id` and `offset` hold.
    pub status: i32,
    /// The mapped file's GNU build ID, zero-padded.
    pub build_id: [u8; 20],
    /// The frame's file offset in that file (its address if not valid).
    pub offset: u64,
}

/// `BuildIdFrame::status` of a frame whose file and offset are known.
pub const BUILD_ID_VALID: i32 = 1;

/// The first user frames of a CPU sample or a sampled allocation twice
/// over: as addresses and as (build ID, file offset) pairs, which together
/// place each file in the process. Sent through the process event ring
/// during an image's first [`ANCHOR_WINDOW_NS`], so that a process gone
/// before its mappings could be read is still symbolized with files the
/// daemon knows by build ID. The header matches [`ProcEvent`]'s.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageAnchors {
    /// [`proc_event::ANCHORS`].
    pub kind: u32,
    pub tgid: u32,
    /// Entries of `ips` and `frames` in use.
    pub len: u32,
    pub _pad: u32,
    /// When the image started (as [`ProcEvent::time_ns`]).
    pub time_ns: u64,
    pub ips: [u64; ANCHOR_FRAMES],
    pub frames: [BuildIdFrame; ANCHOR_FRAMES],
}

/// A process life-cycle event sent to the daemon through the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcEvent {
    /// One of the [`proc_event`] constants.
    pub kind: u32,
    /// Process id.
    pub tgid: u32,
    /// The forking process for [`proc_event::FORK`], else 0.
    pub parent: u32,
    pub _pad: u32,
    /// When it happened (ns, CLOCK_MONOTONIC, as the records' `time_ns`):
    /// a record of the process taken before an [`proc_event::EXEC`] ran
    /// the old image.
    pub time_ns: u64,
}

/// Indices into the per-CPU `COUNTERS` array: every loss the kernel side
/// sees is counted here.
pub mod counter {
    /// CPU samples taken (after filtering).
    pub const SAMPLES: u32 = 0;
    /// Samples dropped because the count map was full.
    pub const COUNTS_FULL: u32 = 1;
    /// User stacks lost (stack map full, or the walk failed).
    pub const USER_STACK_LOST: u32 = 2;
    /// Kernel stacks lost (stack map full, or the walk failed).
    pub const KERNEL_STACK_LOST: u32 = 3;
    /// Process events dropped because the ring buffer was full.
    pub const PROC_EVENTS_LOST: u32 = 4;
    /// Descendants added to the target set (`-- COMMAND` mode).
    pub const FORKS_FOLLOWED: u32 = 5;
    /// Descendants not followed because the target map was full.
    pub const TARGETS_FULL: u32 = 6;
    /// Stack samples that found the ring buffer full and fell back to a
    /// frame-pointer stack.
    pub const STACK_SAMPLES_FULL: u32 = 7;
    /// Stack samples sent for unwinding in the daemon.
    pub const STACK_SAMPLES: u32 = 8;
    /// Allocations sampled by the heap probes.
    pub const HEAP_SAMPLES: u32 = 9;
    /// Sampled allocations lost: the heap event ring buffer was full.
    pub const HEAP_ALLOCS_LOST: u32 = 10;
    /// Frees of sampled allocations lost: the ring buffer was full (the
    /// allocation stays in use in the daemon's view).
    pub const HEAP_FREES_LOST: u32 = 11;
    /// Sampled allocations not tracked as live: the live map was full.
    pub const HEAP_LIVE_FULL: u32 = 12;
    /// Threads whose sampling state was lost to the thread map's bound.
    pub const HEAP_THREADS_FULL: u32 = 13;
    /// Futex waits ended (targets only).
    pub const FUTEX_WAITS: u32 = 14;
    /// Kept waits and wake-ups lost: the wait event ring was full.
    pub const WAIT_EVENTS_LOST: u32 = 15;
    /// Futex calls not tracked: the thread's storage could not be allocated.
    pub const FUTEX_CALLS_FULL: u32 = 16;
    /// Blocking switch-outs of targeted threads.
    pub const OFFCPU_SWITCHES: u32 = 17;
    /// Blocked threads not tracked: the parked-stack map was full.
    pub const OFFCPU_PARKED_FULL: u32 = 18;
    /// Bytes of user stack copied for the daemon to unwind (all events).
    pub const STACK_BYTES_COPIED: u32 = 19;
    /// Stack copies made (all events).
    pub const STACK_COPIES: u32 = 20;
    /// Image anchor records dropped: the process event ring was half full.
    pub const ANCHORS_LOST: u32 = 21;
    /// Wait and off-CPU records sent with a matched walk hint's frames
    /// instead of a stack copy.
    pub const BRIEF_RECORDS: u32 = 22;
    /// Walk hints whose words matched but whose seal did not (the daemon
    /// replaced the hint while it was read): a full record was sent.
    pub const HINTS_TORN: u32 = 23;
    /// Kernel diagnostics not sent: over the rate limit (at most a burst
    /// of each kind per CPU per second).
    pub const KERNEL_LOGS_DROPPED: u32 = 24;
    /// Number of counters.
    pub const COUNT: u32 = 25;
}

/// Index of the one-element `CONTROL` array entries.
pub mod control {
    /// Which of the two count/stack buffers the kernel writes (0 or 1).
    pub const ACTIVE_BUFFER: u32 = 0;
    /// Number of control words.
    pub const COUNT: u32 = 1;
}

/// Allocator entry points that heap profiles probe; the uprobe cookie of
/// each probe names its function.
pub mod alloc_fn {
    pub const MALLOC: u64 = 0;
    pub const CALLOC: u64 = 1;
    pub const REALLOC: u64 = 2;
    pub const REALLOCARRAY: u64 = 3;
    pub const POSIX_MEMALIGN: u64 = 4;
    pub const ALIGNED_ALLOC: u64 = 5;
    pub const MEMALIGN: u64 = 6;
    pub const VALLOC: u64 = 7;
    pub const PVALLOC: u64 = 8;
    pub const FREE: u64 = 9;
    /// The symbol names, indexed by the constants above.
    pub const NAMES: [&str; 10] = [
        "malloc",
        "calloc",
        "realloc",
        "reallocarray",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "pvalloc",
        "free",
    ];
}

/// Per-thread state of the heap probes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HeapThread {
    /// Bytes still to allocate before the next sample.
    pub remaining: u64,
    /// Stack pointer at the entry of the outermost allocator call whose
    /// return is awaited (0: none). A call entered at or below it is
    /// nested inside that call (glibc's realloc(NULL, n) calls malloc) and
    /// is not counted twice; its return is recognised by the stack pointer
    /// one word above it.
    pub pending_sp: u64,
    /// When the pending call was entered (ns, CLOCK_MONOTONIC).
    pub pending_ns: u64,
    /// Bytes requested by the pending call.
    pub pending_size: u64,
    /// posix_memalign's result pointer.
    pub pending_out: u64,
    /// The pending call's `alloc_fn`.
    pub pending_fn: u32,
    /// Whether the pending call is sampled.
    pub pending_sampled: u32,
}

/// Live sampled allocation: the key of the kernel's `HEAP_LIVE` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub tgid: u32,
    pub _pad: u32,
    pub addr: u64,
}

/// Sampled live allocations the kernel remembers (drops are counted).
pub const HEAP_LIVE_ENTRIES: u32 = 2 * 1024 * 1024;
/// Threads with heap-probe state at once (least recently used go first).
pub const HEAP_THREADS_ENTRIES: u32 = 65_536;
/// Bytes in the ring buffer of heap events (about 950 sampled allocations
/// with stack copies in the long form, 3200 in the short one).
pub const HEAP_EVENTS_BYTES: u32 = 16 * 1024 * 1024;

/// What a heap event reports (its first word).
pub mod heap_event {
    /// A sampled allocation ([`super::HeapAlloc`]).
    pub const ALLOC: u32 = 1;
    /// A sampled allocation was freed ([`super::HeapFree`]).
    pub const FREE: u32 = 2;
}

/// A sampled allocation, recorded when the allocator returns: the address,
/// the size, and the caller's stack (a copy for unwinding in the daemon, or
/// frame-pointer frames walked by the kernel).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HeapAlloc<const N: usize = STACK_COPY_BYTES> {
    /// `heap_event::ALLOC`.
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    /// The `alloc_fn` called.
    pub function: u32,
    /// 1 when the kernel tracks the address as live (its free is reported).
    pub live: u32,
    pub _pad: u32,
    /// When the allocator returned (ns, CLOCK_MONOTONIC).
    pub time_ns: u64,
    pub addr: u64,
    pub size: u64,
    /// User registers at the allocator's return (in its caller).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Bytes of `stack` copied from `sp` up (0: frames were walked instead).
    pub stack_len: u64,
    /// Frames of `frames` in use (frame-pointer walk).
    pub frames_len: u64,
    pub comm: [u8; COMM_LEN],
    pub frames: [u64; MAX_STACK_DEPTH],
    pub stack: [u8; N],
}

/// A sampled allocation was freed (or moved by realloc).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HeapFree {
    /// `heap_event::FREE`.
    pub kind: u32,
    pub tgid: u32,
    pub addr: u64,
}

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
}

/// Words a walk hint checks: a remembered walk that read more is not
/// hinted.
pub const WALK_HINT_WORDS: usize = 32;
/// Walk hints the kernel holds (least recently used go first).
pub const WALK_HINTS_ENTRIES: u32 = 4096;

/// Where a remembered walk starts: the key of the kernel's `WALK_HINTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WalkHintKey {
    pub tgid: u32,
    pub _pad: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// A remembered walk as the kernel holds it: the stack words it read, so
/// that the kernel, which reads them in the thread's memory, can tell that
/// the walk applies, and its frames (as indices of those words: every
/// return address a walk finds is a word it read), so that a record sent
/// without a stack copy carries its own stack. The daemon then never reads
/// a copy, and never needs to remember a walk to answer a record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WalkHint {
    /// The daemon's id of the remembered walk.
    pub id: u64,
    /// [`WalkHint::seal`] of the rest: the kernel recomputes it over what
    /// it read and trusts the hint only if the two agree, so a value the
    /// daemon replaced while a program read it (LRU map elements are
    /// reused at once) is never taken for a match.
    pub check: u64,
    /// Words in use.
    pub len: u32,
    /// Bytes from `sp` that hold every word read (the last offset + 8):
    /// all the kernel copies when it finds this hint, as the walk needs
    /// nothing beyond, however far the thread's stack goes on.
    pub span: u32,
    /// Frames of the walk after its first (the instruction pointer).
    pub frames_len: u32,
    /// `wait_flags::WALK_TRUNCATED` when the walk stopped before the root.
    pub flags: u32,
    /// Byte offsets from `sp` (multiples of 8) of the words read.
    pub offsets: [u16; WALK_HINT_WORDS],
    /// For each frame after the first, the index in `words` of its return
    /// address.
    pub frame_words: [u8; WALK_HINT_WORDS],
    /// The word the walk found at each offset.
    pub words: [u64; WALK_HINT_WORDS],
}

/// One step of [`WalkHint::seal`]; the kernel folds the same values in the
/// same order as it checks a hint.
#[inline(always)]
pub const fn hint_mix(h: u64, value: u64) -> u64 {
    (h ^ value)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(29)
}

/// Where [`WalkHint::seal`] starts.
pub const HINT_SEAL_SEED: u64 = 0x5157_a1b0_c0de_f00d;

impl WalkHint {
    /// The check value of this hint: its id, each (offset, word) in use,
    /// each frame's word, then the frame count and flags, folded with
    /// [`hint_mix`].
    pub fn seal(&self) -> u64 {
        let mut h = hint_mix(HINT_SEAL_SEED, self.id);
        let len = (self.len as usize).min(WALK_HINT_WORDS);
        for i in 0..len {
            h = hint_mix(h, self.words[i] ^ u64::from(self.offsets[i]));
        }
        let frames = (self.frames_len as usize).min(WALK_HINT_WORDS);
        for i in 0..frames {
            let index = self.frame_words[i] as usize & (WALK_HINT_WORDS - 1);
            h = hint_mix(h, self.words[index]);
        }
        hint_mix(h, u64::from(self.frames_len) | u64::from(self.flags) << 32)
    }
}

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
pub mod go_fn {
    /// `runtime.gopark`: the current goroutine parks.
    pub const GOPARK: u64 = 0;
    /// `runtime.ready`: a parked goroutine is made runnable.
    pub const READY: u64 = 1;
    /// Symbol names, indexed by the constants above.
    pub const NAMES: [&str; 2] = ["runtime.gopark", "runtime.ready"];
}

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
    pub tid: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
}

/// Goroutines parked at once whose park points are remembered.
pub const GO_PARKED_ENTRIES: u32 = 65_536;

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
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WaitStack {
    pub head: WaitHead,
    /// Bytes of `stack` copied from `sp` up (0: frames were walked instead).
    pub stack_len: u64,
    /// Frames of `frames` in use (frame-pointer walk).
    pub frames_len: u64,
    pub frames: [u64; MAX_STACK_DEPTH],
    pub stack: [u8; STACK_COPY_BYTES],
}

/// Bytes of user stack kept per blocked thread for the off-CPU profile
/// (copied at every blocking switch-out, so smaller than CPU samples' copy).
pub const OFFCPU_STACK_BYTES: usize = 8 * 1024;
/// Kernel frames kept per off-CPU event.
pub const OFFCPU_KERNEL_DEPTH: usize = 64;
/// Threads with a slot for their switch-out stacks at once (a slot lives
/// until its thread exits; allocated as used).
pub const OFFCPU_PARKED_ENTRIES: u32 = 8192;

/// A thread that left the CPU blocked: its stacks at the switch-out, parked
/// in `OFFCPU_PARKED` until it runs again; sent (with `duration_ns`) as a
/// `wait_event::OFFCPU` event when kept.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OffcpuRecord {
    /// `wait_event::OFFCPU`.
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    /// `wait_flags` (`HINT_MATCHED`, `BRIEF`).
    pub flags: u32,
    /// When it left the CPU (ns, CLOCK_MONOTONIC).
    pub start_ns: u64,
    /// How long it was off the CPU (set when it is switched in).
    pub duration_ns: u64,
    /// User registers saved on entering the kernel.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// With `wait_flags::HINT_MATCHED`: the walk hint the stack matched.
    pub hint_id: u64,
    /// Bytes of `stack` copied from `sp` up (0: frames were walked instead,
    /// or a hint matched).
    pub stack_len: u64,
    /// Frames of `frames` in use: a frame-pointer walk, or with
    /// `wait_flags::HINT_MATCHED` the remembered walk's frames after `ip`.
    pub frames_len: u64,
    /// Frames of `kernel` in use.
    pub kernel_len: u64,
    pub comm: [u8; COMM_LEN],
    pub kernel: [u64; OFFCPU_KERNEL_DEPTH],
    pub frames: [u64; MAX_STACK_DEPTH],
    pub stack: [u8; OFFCPU_STACK_BYTES],
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

#[cfg(feature = "user")]
mod user {
    // SAFETY: as below.
    unsafe impl<const N: usize> aya::Pod for super::HeapAlloc<N> {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::HeapFree {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::WaitStack {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::WaitHead {}
    // SAFETY: as below.
    unsafe impl<const N: usize> aya::Pod for super::WaitBrief<N> {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::MutexDelay {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::OffcpuRecord {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::FutexCall {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::FutexWaker {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::HeapThread {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::LiveKey {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::WalkHintKey {}
    // SAFETY: as below.
    unsafe impl aya::Pod for super::WalkHint {}
    // SAFETY: plain `repr(C)` data without padding or pointers.
    unsafe impl aya::Pod for super::SampleKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ImageAnchors {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Stack {}
    // SAFETY: as above.
    unsafe impl<const N: usize> aya::Pod for super::StackSample<N> {}
}
