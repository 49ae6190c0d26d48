//! Indices of the kernel's loss and event counters and of the control
//! array.

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
    /// CPU samples and off-CPU switch-outs of Go threads that carry a
    /// label set.
    pub const GO_LABELED_SAMPLES: u32 = 25;
    /// Label sets not recorded: `GO_LABEL_SETS` was full.
    pub const GO_LABEL_SETS_FULL: u32 = 26;
    /// Allocations the Go runtime sampled, recorded by `go_heap_probe`
    /// (also counted in `HEAP_SAMPLES`).
    pub const GO_HEAP_SAMPLES: u32 = 27;
    /// Go objects whose free was seen at `runtime.mProf_Free` (their
    /// release's special records not read: see `go_heap_fn`).
    pub const GO_FREES_AT_PROFILE_FREE: u32 = 28;
    /// Goroutine waits not seen because they outlasted the park probes'
    /// window they began in (a duty-cycled process's: `ParkGate`): their
    /// ready found a park from before its window opened.
    pub const GO_WAITS_OUTLASTING_WINDOWS: u32 = 29;
    /// CPU samples and off-CPU switch-outs of Python processes' threads
    /// recorded with their Python frames.
    pub const PY_SAMPLES: u32 = 30;
    /// Those whose thread had no thread state among those searched (a
    /// thread that never ran Python, or one past `PY_THREADS_SEARCHED`):
    /// recorded with native frames only.
    pub const PY_THREADS_UNFOUND: u32 = 31;
    /// Off-CPU switch-outs of threads marked deep that found no slot in
    /// `OFFCPU_DEEP_STACKS`: parked with the usual copy instead.
    pub const OFFCPU_DEEP_FULL: u32 = 32;
    /// Under `[debug] time_go_labels`: the ns CPU samples spent reading
    /// goroutines' label sets (`bpf_ktime_get_ns` around it), and the
    /// readings timed. 0 otherwise.
    pub const GO_LABEL_READ_NS: u32 = 33;
    pub const GO_LABEL_READS: u32 = 34;
    /// Go runtime futex calls (made in the process's `runtime.futex`) whose
    /// kept wait or wake-up the kernel did not send: the daemon would drop
    /// them (`go_runtime_futexes`).
    pub const GO_RUNTIME_FUTEXES_SKIPPED: u32 = 35;
    /// Go samples whose goroutine was told running by its own words (the
    /// sample's stack pointer within its stack, its status running or in a
    /// system call), without reading its M.
    pub const GO_LABELS_OWN_STACK: u32 = 36;
    /// Labeled samples (Go 1.23 and before) whose label map was known by
    /// its header, its bucket not read again.
    pub const GO_LABEL_MAP_CACHE_HITS: u32 = 37;
    /// Allocator calls made by another allocator function (a wrapper's
    /// malloc calling libc's): not counted again, the outer call counts
    /// the allocation once.
    pub const HEAP_NESTED_CALLS: u32 = 38;
    /// Number of counters (at most 64: the daemon logs each loss once by a
    /// bit of a `u64`).
    pub const COUNT: u32 = 39;
}

/// Index of the one-element `CONTROL` array entries.
pub mod control {
    /// Which of the two count/stack buffers the kernel writes (0 or 1).
    pub const ACTIVE_BUFFER: u32 = 0;
    /// Number of control words.
    pub const COUNT: u32 = 1;
}
