//! The `[debug]` table of the config file: switches that turn the stack
//! optimizations off, one by one, so that a profile taken with them can be
//! compared with one taken without. Each optimization may make a profile
//! cheaper, never different; every one is on by default. And `kernel_log`,
//! off by default, which has the eBPF programs say why they skip, drop,
//! shorten or fall back (kernel_log.rs).
//!
//! ```toml
//! [debug]
//! walk_hints = true      # the daemon gives the kernel the words of remembered walks
//! brief_records = true   # a matched hint sends the walk's frames instead of a stack copy
//! short_records = true   # a stack known to fit in 4 KiB goes in the short record form
//! stack_tops = true      # copies stop at the thread's stack top learned from walks
//! long_records = true    # a thread whose walks ran past its copy's end gets copies of up to 32 KiB
//! rings_mapped_once = true  # ring buffers' data pages mapped once, not twice (bpf/ring.rs)
//! release_file_pages = true # a window's objects symbolized one at a time, their files' pages let go of after each
//! go_special_kinds = true   # a Go object's free seen at freeSpecial by its record's kind, not also at mProf_Free
//! go_labels = true       # Go goroutines' pprof labels read in the kernel (off: to measure what reading them costs)
//! go_labels_one_read = true  # a goroutine read at once and told running by its own stack, not through its M
//! go_label_map_cache = true  # a Go 1.23-and-before label map's id known by its header, its bucket not read again
//! time_go_labels = false # CPU samples time their reading of goroutine labels (go_label_read_ns in the summary)
//! go_runtime_futexes_in_kernel = true  # the kernel sends no kept wait or wake-up made in a Go process's runtime.futex
//! python_frames = true   # CPython's frames read in the kernel (off: its processes profiled natively, as perf sees them)
//! python_caches = true   # a thread's state remembered by the kernel, code objects by the daemon
//! executable_cache = true  # a new process's executable known by file identity, not read again to tell if it is Go
//! kernel_log = false     # kernel diagnostics in the log (also PROFILERD_LOG=debug)
//! ```
//!
//! The walk memo itself is sized (0: off) by `[limits] walk_memo_entries`.

use serde::Deserialize;

/// Which stack optimizations are on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackSwitches {
    /// Remembered walks are handed to the kernel as walk hints.
    pub walk_hints: bool,
    /// The kernel sends a matched walk's frames instead of a stack copy.
    pub brief_records: bool,
    /// CPU samples and allocations whose stack fits use the short form.
    pub short_records: bool,
    /// Stack copies stop at each thread's known stack top.
    pub stack_tops: bool,
    /// A thread whose walk ran past the end of its usual copy is marked
    /// deep, and its later copies take the long form (32 KiB). A
    /// feature, not an optimization: off, such stacks stay cut, to
    /// compare.
    pub long_records: bool,
    /// Ring buffers' data pages are mapped once (a record that wraps is
    /// copied out) rather than twice: the same records for half the
    /// rings' resident memory. Not a stack optimization, but switched
    /// off here like one, to compare.
    pub rings_mapped_once: bool,
    /// A window's stacks are symbolized one object at a time, and the
    /// pages of the files read are let go of after each
    /// (stacks/file_pages.rs): the same names for less resident memory.
    pub release_file_pages: bool,
    /// A Go profiled object's free is told at `runtime.freeSpecial` by the
    /// kind of its special record (a per-release layout), rather than by
    /// also probing `runtime.mProf_Free`: the same frees for one probe
    /// fewer. Not a stack optimization either.
    pub go_special_kinds: bool,
    /// Go goroutines' pprof labels are read at CPU samples. A
    /// feature, not an optimization: switched off only to measure what
    /// reading them costs (`cargo xtask bench --go`).
    pub go_labels: bool,
    /// A goroutine is read at once from its start through `g.labels`, and
    /// told running by its own stack bounds and status (go_labels.rs in
    /// the kernel): the same labels for two or three reads fewer per
    /// sample than reading it, its M and the M's goroutine one by one.
    pub go_labels_one_read: bool,
    /// A label map (Go 1.23 and before) is known again by its address and
    /// header, and its id remembered per CPU: the same id for one read
    /// fewer and no hash per sample.
    pub go_label_map_cache: bool,
    /// CPU samples time their reading of a goroutine's labels
    /// (`go_label_read_ns` and `go_label_reads` in the summary): an
    /// instrument, off by default, to measure that reading apart from
    /// the rest of a sample (`cargo xtask bench --go --go-tables labels`).
    pub time_go_labels: bool,
    /// The kernel knows each Go process's `runtime.futex` and sends none
    /// of the waits and wake-ups made in it (the runtime's own, which the
    /// daemon drops by that leaf frame): the same profiles without their
    /// stacks' cost. Off, they are sent and dropped by the daemon.
    pub go_runtime_futexes_in_kernel: bool,
    /// CPython processes' Python frames are read. A feature: switched
    /// off to measure what reading them costs, or to see such a process
    /// as a native profiler does (with `-X perf`, by its trampolines).
    pub python_frames: bool,
    /// The kernel remembers each Python thread's state (`PY_THREADS`)
    /// rather than searching the thread list at every sample, and the
    /// daemon each code object it read rather than reading it again.
    pub python_caches: bool,
    /// A new process's executable is looked up by file identity (device,
    /// inode, size, modification time) among those read before, rather
    /// than read again to tell whether it is Go. Not a stack optimization.
    pub executable_cache: bool,
}

impl Default for StackSwitches {
    fn default() -> Self {
        StackSwitches {
            walk_hints: true,
            brief_records: true,
            short_records: true,
            stack_tops: true,
            long_records: true,
            rings_mapped_once: true,
            release_file_pages: true,
            go_special_kinds: true,
            go_labels: true,
            go_labels_one_read: true,
            go_label_map_cache: true,
            time_go_labels: false,
            go_runtime_futexes_in_kernel: true,
            python_frames: true,
            python_caches: true,
            executable_cache: true,
        }
    }
}

/// The `[debug]` table as written; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebugTable {
    walk_hints: Option<bool>,
    brief_records: Option<bool>,
    short_records: Option<bool>,
    stack_tops: Option<bool>,
    long_records: Option<bool>,
    rings_mapped_once: Option<bool>,
    release_file_pages: Option<bool>,
    go_special_kinds: Option<bool>,
    go_labels: Option<bool>,
    go_labels_one_read: Option<bool>,
    go_label_map_cache: Option<bool>,
    time_go_labels: Option<bool>,
    go_runtime_futexes_in_kernel: Option<bool>,
    python_frames: Option<bool>,
    python_caches: Option<bool>,
    executable_cache: Option<bool>,
    kernel_log: Option<bool>,
}

impl DebugTable {
    /// The switches, missing keys on.
    pub fn switches(&self) -> StackSwitches {
        let d = StackSwitches::default();
        StackSwitches {
            walk_hints: self.walk_hints.unwrap_or(d.walk_hints),
            brief_records: self.brief_records.unwrap_or(d.brief_records),
            short_records: self.short_records.unwrap_or(d.short_records),
            stack_tops: self.stack_tops.unwrap_or(d.stack_tops),
            long_records: self.long_records.unwrap_or(d.long_records),
            rings_mapped_once: self.rings_mapped_once.unwrap_or(d.rings_mapped_once),
            release_file_pages: self.release_file_pages.unwrap_or(d.release_file_pages),
            go_special_kinds: self.go_special_kinds.unwrap_or(d.go_special_kinds),
            go_labels: self.go_labels.unwrap_or(d.go_labels),
            go_labels_one_read: self.go_labels_one_read.unwrap_or(d.go_labels_one_read),
            go_label_map_cache: self.go_label_map_cache.unwrap_or(d.go_label_map_cache),
            time_go_labels: self.time_go_labels.unwrap_or(d.time_go_labels),
            go_runtime_futexes_in_kernel: self
                .go_runtime_futexes_in_kernel
                .unwrap_or(d.go_runtime_futexes_in_kernel),
            python_frames: self.python_frames.unwrap_or(d.python_frames),
            python_caches: self.python_caches.unwrap_or(d.python_caches),
            executable_cache: self.executable_cache.unwrap_or(d.executable_cache),
        }
    }

    /// Whether the kernel's diagnostics are logged (off unless set).
    pub fn kernel_log(&self) -> bool {
        self.kernel_log.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Result<DebugTable, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn everything_is_on_unless_turned_off() {
        assert_eq!(
            table("").expect("parse").switches(),
            StackSwitches::default()
        );
        let off = table("walk_hints = false\nstack_tops = false")
            .expect("parse")
            .switches();
        assert_eq!(
            off,
            StackSwitches {
                walk_hints: false,
                stack_tops: false,
                ..StackSwitches::default()
            }
        );
    }

    #[test]
    fn go_labels_can_be_turned_off() {
        let off = table("go_labels = false").expect("parse").switches();
        assert!(!off.go_labels);
        assert_eq!(
            off,
            StackSwitches {
                go_labels: false,
                ..StackSwitches::default()
            }
        );
    }

    #[test]
    fn python_frames_can_be_turned_off() {
        let off = table("python_frames = false\npython_caches = false")
            .expect("parse")
            .switches();
        assert_eq!(
            off,
            StackSwitches {
                python_frames: false,
                python_caches: false,
                ..StackSwitches::default()
            }
        );
    }

    #[test]
    fn kernel_log_is_off_unless_turned_on() {
        assert!(!table("").expect("parse").kernel_log());
        assert!(!table("kernel_log = false").expect("parse").kernel_log());
        let on = table("kernel_log = true").expect("parse");
        assert!(on.kernel_log());
        // It is no stack optimization: those stay on.
        assert_eq!(on.switches(), StackSwitches::default());
        assert!(table("kernel_log = 1").is_err());
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_refused() {
        let err = table("hints = false").expect_err("unknown key");
        assert!(err.to_string().contains("hints"), "{err}");
        assert!(table("walk_hints = 0").is_err());
    }
}
