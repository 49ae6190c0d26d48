//! Process events (new, fork, exec, exit) and image anchors, and the
//! tables of targets and known processes.

/// Processes that may be targeted at once (`--pid`, `-- COMMAND` and descendants).
pub const TARGETS_ENTRIES: u32 = 8_192;

/// What a process in the target table is there for (its value).
pub mod target_kind {
    /// Profiled by the schedule (`--pid`, the command, their children):
    /// its children are followed.
    pub const PROFILED: u8 = 1;
    /// Only for an on-demand capture of a process the schedule does not
    /// profile: its records go to that capture alone, and its children
    /// are not followed.
    pub const CAPTURED: u8 = 2;
}

/// Processes whose first appearance has been reported to the daemon.
pub const SEEN_ENTRIES: u32 = 32_768;

/// Processes forked by known processes that have not exec'd yet, each with
/// its parent (LRU: the oldest are forgotten first; the daemon trusts a
/// fork record for a few seconds only).
pub const FORKED_ENTRIES: u32 = 16_384;

/// Bytes in the process-event ring buffer.
pub const PROC_EVENTS_BYTES: u32 = 256 * 1024;

/// What a [`ProcEvent`] reports.
pub mod proc_event {
    /// A process was seen for the first time: snapshot its metadata now,
    /// while it lives. `parent` is the process that forked it if the
    /// kernel knows it for a child of that process that has not exec'd
    /// since (its [`FORK`] was sent), else 0: only then may the parent's
    /// snapshot stand in for it. A fork record of its id that names
    /// another parent, or none, is of an earlier task under that id.
    pub const NEW: u32 = 1;
    /// A process called exec: its mappings changed.
    pub const EXEC: u32 = 2;
    /// A process's main thread exited.
    pub const EXIT: u32 = 3;
    /// A known (already sampled) process forked a new process: `tgid` is
    /// the child's id and `parent` the forking process. Until it execs, a
    /// child maps what its parent mapped. New threads are not reported:
    /// their ids are never a process's.
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
    /// The forking process for [`proc_event::FORK`], and for
    /// [`proc_event::NEW`] of a child that has not exec'd since its fork
    /// was reported; else 0.
    pub parent: u32,
    pub _pad: u32,
    /// When it happened (ns, CLOCK_MONOTONIC, as the records' `time_ns`):
    /// a record of the process taken before an [`proc_event::EXEC`] ran
    /// the old image.
    pub time_ns: u64,
}
