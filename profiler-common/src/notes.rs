//! Kernel notes: why a program skipped, dropped, shortened or fell back.
//! The kernel sends a note's kind, thread and up to four numbers through
//! aya-log as `note KIND TGID TID A B C D`; the daemon has each kind's text,
//! so the programs carry one small log call, not one per text.

/// What a note says.
pub mod why {
    pub const PROC_EVENT_LOST: u32 = 0;
    pub const ANCHORS_HALF_FULL: u32 = 1;
    pub const ANCHORS_LOST: u32 = 2;
    pub const COUNTS_FULL: u32 = 3;
    pub const USER_STACK_WALK_FAILED: u32 = 4;
    pub const KERNEL_STACK_WALK_FAILED: u32 = 5;
    pub const USER_STACK_MAP_FULL: u32 = 6;
    pub const KERNEL_STACK_MAP_FULL: u32 = 7;
    pub const FRAME_POINTER_FALLBACK: u32 = 8;
    pub const STACK_FAULT: u32 = 9;
    pub const STACK_SHORTENED: u32 = 10;
    pub const HEAP_THREADS_FULL: u32 = 11;
    pub const HEAP_LIVE_FULL: u32 = 12;
    pub const HEAP_ALLOC_LOST: u32 = 13;
    pub const HEAP_FREE_LOST: u32 = 14;
    pub const FUTEX_CALLS_FULL: u32 = 15;
    pub const MUTEX_DELAY_LOST: u32 = 16;
    pub const WAIT_LOST: u32 = 17;
    pub const BRIEF_LOST: u32 = 18;
    pub const OFFCPU_PARKED_FULL: u32 = 19;
    pub const OFFCPU_LOST: u32 = 20;
    pub const GO_WAIT_LOST: u32 = 21;
    pub const TARGETS_FULL: u32 = 22;
    pub const HINT_UNREADABLE: u32 = 23;
    pub const HINT_PAST_COPY: u32 = 24;
    pub const HINT_MISMATCH: u32 = 25;
    pub const HINT_TORN: u32 = 26;
    pub const BRIEF_SENT: u32 = 27;
    pub const BRIEF_PARKED: u32 = 28;
    pub const OFFCPU_DEEP_FULL: u32 = 29;
    /// Number of kinds.
    pub const COUNT: u32 = 30;
}
