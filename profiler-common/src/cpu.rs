//! CPU samples: the frame-pointer stack map and per-CPU counts (double
//! buffered), and the stack-copy record the daemon unwinds.

use crate::{COMM_LEN, MAX_STACK_DEPTH};

/// Entries in each of the two count maps (double-buffered).
pub const COUNTS_ENTRIES: u32 = 16_384;

/// Entries in each of the two stack maps (double-buffered; allocated as
/// used, so an idle system pays little for a large bound).
pub const STACKS_ENTRIES: u32 = 16_384;

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

/// Stack bytes of the long form of a CPU sample, heap allocation or
/// off-CPU record, used for a thread the daemon marked deep
/// (`DEEP_THREADS`): one whose walk ran past the end of its usual copy,
/// such as an event loop's that keeps a large buffer on the stack (libuv
/// keeps 12 KiB of epoll events in `uv__io_poll`'s frame).
pub const LONG_STACK_BYTES: usize = 32 * 1024;

/// Threads marked deep at once (least recently used go; the daemon marks a
/// thread again when its walk is cut again).
pub const DEEP_THREADS_ENTRIES: u32 = 1024;

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
    /// When the image the kernel knew the process to run started (ns,
    /// CLOCK_MONOTONIC; 0: unknown): an exec's start is known to the
    /// kernel before its event reaches the daemon, which holds a sample
    /// of an image it has not heard of until it has.
    pub image_since: u64,
    /// The on-demand capture whose own events took the sample (the perf
    /// link's cookie, [`SampleKey::tap`]); 0: the schedule's events.
    pub tap: u64,
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
    /// The words at the user stack pointer and above it (`[sp]`,
    /// `[sp+8]`) where they point into the process's code, else 0: the
    /// return address of a leaf that has not pushed its frame pointer yet
    /// (a frameless leaf, or one sampled in its prologue or epilogue),
    /// whose caller a frame-pointer walk skips. Only for processes marked
    /// with a code range ([`FpProcess`]); the daemon decides from the
    /// leaf's frame size which word, if any, is the return address.
    pub leaf_words: [u64; 2],
    /// The pprof label set of the goroutine that ran (an id of
    /// `GO_LABEL_SETS`; 0: none, or not a Go process).
    pub go_labels: u64,
    /// The on-demand capture whose own CPU-clock events took the sample
    /// (their perf links' cookie: a rate, or processes, of its own); 0:
    /// the schedule's events. Such a sample belongs to that capture only.
    pub tap: u64,
}

/// A process whose stacks the kernel walks by frame pointers (value of
/// `FP_PROCESSES`): the address range of its executable's code, for
/// [`SampleKey::leaf_words`] (both 0: no range, no words), and for a Go
/// process where its goroutines' pprof labels are, and the code of its
/// `runtime.futex` (both 0: none), whose futex calls are the runtime's
/// own and never in a block or mutex profile.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FpProcess {
    pub text_start: u64,
    pub text_end: u64,
    pub go: crate::GoRuntime,
    pub futex_start: u64,
    pub futex_end: u64,
}

impl FpProcess {
    /// Whether `addr` lies in the code range.
    #[inline(always)]
    pub fn holds(&self, addr: u64) -> bool {
        addr >= self.text_start && addr < self.text_end
    }
}
