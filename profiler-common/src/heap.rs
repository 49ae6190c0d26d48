//! Heap profiles: allocator functions, per-thread sampling state, live
//! allocations and the alloc and free records.

use crate::{COMM_LEN, MAX_STACK_DEPTH, STACK_COPY_BYTES};

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
    /// Not a probed function: `HeapAlloc::function` of an allocation the
    /// Go runtime sampled (see `go_heap_fn`).
    pub const GO_RUNTIME: u64 = 10;
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

/// The Go runtime's points of heap profiles, where it records the
/// allocations it samples by its own `MemProfileRate` and their frees (the
/// uprobe cookie of `go_heap_probe`).
pub mod go_heap_fn {
    /// `runtime.mProf_Malloc(p, size)` (Go 1.18 to 1.22): a sampled
    /// allocation, `p` and `size` in RAX and RBX.
    pub const MALLOC: u64 = 0;
    /// `runtime.mProf_Malloc(mp, p, size)` (Go 1.23 and later): `p` and
    /// `size` in RBX and RCX.
    pub const MALLOC_WITH_M: u64 = 1;
    /// `runtime.freeSpecial(s, p, size)`: a swept object's special record
    /// `s` (RAX) is freed. With the record's layout in the cookie
    /// ([`special_layout`]), a profile record's object `p` (RBX) is
    /// retired at once; without it (a release whose layout is not known),
    /// `p` is kept for the thread until `mProf_Free`.
    pub const FREE_SPECIAL: u64 = 2;
    /// `runtime.mProf_Free`: the special being freed was a profiled
    /// allocation's, so the object at the thread's kept `p` is freed.
    pub const PROFILE_FREE: u64 = 3;
    /// The cookie's bits that name the function.
    pub const FUNCTION: u64 = 0xff;
    /// The symbol names, indexed by the constants above.
    pub const NAMES: [&str; 4] = [
        "runtime.mProf_Malloc",
        "runtime.mProf_Malloc",
        "runtime.freeSpecial",
        "runtime.mProf_Free",
    ];

    /// The cookie of `freeSpecial` for a release whose `special.kind`
    /// lies at byte `kind_offset` and whose `_KindSpecialProfile` is
    /// `profile_kind`.
    pub const fn special_layout(kind_offset: u8, profile_kind: u8) -> u64 {
        FREE_SPECIAL | (kind_offset as u64) << 8 | (profile_kind as u64) << 16
    }

    /// The (kind offset, profile kind) a `freeSpecial` cookie carries
    /// (0, 0 when none).
    pub const fn special_layout_of(cookie: u64) -> (u64, u8) {
        ((cookie >> 8) & 0xff, (cookie >> 16) as u8)
    }
}

/// Threads in the Go runtime's sweep between `freeSpecial` and
/// `mProf_Free` (a least-recently-used map by thread id).
pub const GO_FREEING_ENTRIES: u32 = 4096;

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

/// Code ranges of allocator functions a process maps, in its address
/// space, each `[start, end)`: at most this many per process (the rest are
/// left out, and counted by the daemon).
pub const ALLOC_CALLER_RANGES: usize = 32;

/// Processes with allocator-caller ranges at once: only those that map two
/// or more allocator files (an interposer such as heaptrack's preload
/// library beside libc) get an entry.
pub const ALLOC_CALLERS_ENTRIES: u32 = 4096;

/// A process's allocator functions (every probed entry point of every
/// allocator file it maps), by address: an allocator call whose return
/// address lies in one of them was made by another allocator (a wrapper
/// calling the allocator it wraps) and is counted by that outer call only.
/// The value of the kernel's `ALLOC_CALLERS` map, by process id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocCallers {
    /// Ranges in use, from the first.
    pub len: u32,
    pub _pad: u32,
    pub ranges: [[u64; 2]; ALLOC_CALLER_RANGES],
}

/// Python frames a heap sample of a CPython thread carries (nearest the
/// leaf kept): as many as a CPU sample's, since heap samples are few and
/// their records long already.
pub const HEAP_PY_FRAMES: usize = crate::PY_FRAMES_MAX;

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
    /// 1 when the record is a CPython thread's: it is the `record` of a
    /// `WithPython<HeapAlloc<N>, HEAP_PY_FRAMES>`, its Python frames
    /// after it.
    pub python: u32,
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
