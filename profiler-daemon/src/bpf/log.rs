//! Kernel-side diagnostics: why the eBPF programs skip, drop, shorten or
//! fall back (a stack copy that faulted, a walk hint that did not match, a
//! full map or ring, a brief record sent), read from aya-log's `AYA_LOGS`
//! ring and logged with target `profilerd::kernel` at debug level. The
//! kernel sends a note as its kind and numbers; the text is written here
//! (`Note`).
//!
//! Off by default: the kernel then drops every log site at load time
//! (`profiler-ebpf/src/klog.rs`). On with `[debug] kernel_log = true`, or
//! when the log filter shows debug lines of that target
//! (`PROFILERD_LOG=debug`, or `PROFILERD_LOG=info,profilerd::kernel=debug`
//! for these alone). The kernel sends at most a few lines of each kind per
//! CPU per second and counts the rest (`kernel_logs_dropped`).

use std::fmt;
use std::os::fd::{AsRawFd, RawFd};

use aya::Ebpf;
use aya_log::EbpfLogger;
use profiler_common::why;

/// The `tracing` target of kernel lines.
pub const TARGET: &str = "profilerd::kernel";

/// Whether the kernel should log: the `[debug]` key, or a log filter that
/// shows debug lines of [`TARGET`].
pub fn wanted(setting: bool) -> bool {
    setting || tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// A `log::Log` that hands aya-log's records to `tracing`, under
/// [`TARGET`] at the record's level.
#[derive(Clone, Copy, Debug, Default)]
pub struct Forward;

impl log::Log for Forward {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let raw = record.args().to_string();
        let message = match Note::parse(&raw) {
            Some(note) => note.to_string(),
            None => raw,
        };
        match record.level() {
            log::Level::Error => tracing::error!(target: TARGET, "{message}"),
            log::Level::Warn => tracing::warn!(target: TARGET, "{message}"),
            log::Level::Info => tracing::info!(target: TARGET, "{message}"),
            log::Level::Debug => tracing::debug!(target: TARGET, "{message}"),
            log::Level::Trace => tracing::trace!(target: TARGET, "{message}"),
        }
    }

    fn flush(&self) {}
}

/// A kernel note (`profiler-ebpf/src/klog.rs`): the kernel sends its kind
/// and numbers, `note KIND TGID TID A B C D`, and the text is written here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Note {
    kind: u32,
    tgid: u32,
    tid: u32,
    values: [u64; 4],
}

impl Note {
    /// The note in a kernel line, or `None` for any other line.
    fn parse(line: &str) -> Option<Note> {
        let mut words = line.strip_prefix("note ")?.split(' ');
        let mut next = || words.next()?.parse::<u64>().ok();
        let (kind, tgid, tid) = (next()?, next()?, next()?);
        let values = [next()?, next()?, next()?, next()?];
        Some(Note {
            kind: u32::try_from(kind).ok()?,
            tgid: u32::try_from(tgid).ok()?,
            tid: u32::try_from(tid).ok()?,
            values,
        })
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.values;
        // Walk errors are the helpers' negative errnos, sent as u64.
        let errno = a as i64;
        write!(f, "tgid {} tid {}: ", self.tgid, self.tid)?;
        match self.kind {
            why::PROC_EVENT_LOST => write!(
                f,
                "process event {a} of process {b} dropped: process event ring full"
            ),
            why::ANCHORS_HALF_FULL => {
                write!(f, "image anchors not sent: process event ring half full")
            }
            why::ANCHORS_LOST => write!(f, "image anchors dropped: process event ring full"),
            why::COUNTS_FULL => write!(f, "CPU sample dropped: count map full"),
            why::USER_STACK_WALK_FAILED => write!(f, "user stack lost: walk failed ({errno})"),
            why::KERNEL_STACK_WALK_FAILED => {
                write!(f, "kernel stack lost: walk failed ({errno})")
            }
            why::USER_STACK_MAP_FULL => write!(f, "user stack lost: stack map full ({errno})"),
            why::KERNEL_STACK_MAP_FULL => {
                write!(f, "kernel stack lost: stack map full ({errno})")
            }
            why::FRAME_POINTER_FALLBACK => write!(
                f,
                "CPU sample falls back to a frame-pointer stack: stack sample ring full"
            ),
            why::STACK_FAULT => write!(f, "stack copy faulted at sp {a:x}: nothing copied"),
            why::STACK_SHORTENED => write!(
                f,
                "stack copy from sp {a:x} stopped at a fault after {b} bytes"
            ),
            why::HEAP_THREADS_FULL => write!(f, "allocations not sampled: heap thread map full"),
            why::HEAP_LIVE_FULL => write!(
                f,
                "allocation {a:x} not tracked as live: heap live map full"
            ),
            why::HEAP_ALLOC_LOST => write!(
                f,
                "sampled allocation {a:x} of {b} bytes dropped: heap event ring full"
            ),
            why::HEAP_FREE_LOST => write!(
                f,
                "free of sampled allocation {a:x} dropped: heap event ring full"
            ),
            why::FUTEX_CALLS_FULL => write!(
                f,
                "futex call on {a:x} not tracked: futex call storage full"
            ),
            why::MUTEX_DELAY_LOST => {
                write!(f, "mutex delay of {a} ns dropped: wait event ring full")
            }
            why::WAIT_LOST => write!(
                f,
                "wait record (event kind {a}) dropped: wait event ring full"
            ),
            why::BRIEF_LOST => write!(
                f,
                "brief wait record (event kind {a}) dropped: wait event ring full"
            ),
            why::OFFCPU_PARKED_FULL => {
                write!(f, "blocked thread not tracked: off-CPU parked map full")
            }
            why::OFFCPU_DEEP_FULL => write!(
                f,
                "deep thread's switch-out parked with the usual copy: off-CPU deep stack map full"
            ),
            why::OFFCPU_LOST => write!(
                f,
                "off-CPU interval of {a} ns dropped: wait event ring full"
            ),
            why::GO_WAIT_LOST => {
                write!(f, "goroutine wait of {a} ns dropped: wait event ring full")
            }
            why::TARGETS_FULL => write!(f, "descendant {a} not followed: target map full"),
            why::HINT_UNREADABLE => write!(
                f,
                "walk hint did not match: its {a} bytes at sp {b:x} cannot be read"
            ),
            why::HINT_PAST_COPY => write!(
                f,
                "walk hint did not match at sp {a:x}: its word at +{b} is past the {c} bytes copied"
            ),
            why::HINT_MISMATCH => write!(
                f,
                "walk hint did not match at sp {a:x}: word at +{b} is {c:x}, the hint's {d:x}"
            ),
            why::HINT_TORN => write!(
                f,
                "walk hint {a:x} at sp {b:x} torn (replaced while read): full record sent"
            ),
            why::BRIEF_SENT => write!(f, "brief record sent: {a} frames of walk {b:x} at sp {c:x}"),
            why::BRIEF_PARKED => write!(
                f,
                "brief off-CPU record parked: {a} frames of walk {b:x} at sp {c:x}"
            ),
            kind => write!(f, "note of unknown kind {kind}: {a} {b} {c} {d}"),
        }
    }
}

/// The reader of the kernel's log ring.
pub struct KernelLog(EbpfLogger<Forward>);

impl KernelLog {
    /// Takes the log ring out of `ebpf`. Call it after every program that
    /// refers to the ring has been loaded.
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, aya_log::Error> {
        EbpfLogger::init_with_logger(ebpf, Forward).map(KernelLog)
    }

    /// Logs every record in the ring.
    pub fn read(&mut self) {
        self.0.flush();
    }
}

impl AsRawFd for KernelLog {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn forwarded(filter: &str, level: log::Level, message: &str) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            log::Log::log(
                &Forward,
                &log::Record::builder()
                    .args(format_args!("{message}"))
                    .level(level)
                    .target("profiler_ebpf")
                    .module_path_static(Some("profiler_ebpf::klog"))
                    .build(),
            );
        });
        String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8")
    }

    #[test]
    fn records_go_to_tracing_under_the_kernel_target() {
        let line = forwarded(
            "debug",
            log::Level::Debug,
            "tgid 12 tid 13: brief record sent: 5 frames of walk 7 at sp 7ffd0000",
        );
        assert!(line.contains("DEBUG"), "{line}");
        assert!(line.contains("profilerd::kernel:"), "{line}");
        assert!(
            line.contains("tgid 12 tid 13: brief record sent: 5 frames"),
            "{line}"
        );
        let warning = forwarded("info", log::Level::Warn, "something odd");
        assert!(
            warning.contains("WARN profilerd::kernel: something odd"),
            "{warning}"
        );
    }

    #[test]
    fn notes_get_their_text_here() {
        let line = forwarded(
            "debug",
            log::Level::Debug,
            &format!("note {} 12 13 5 7 140733193388032 0", why::BRIEF_SENT),
        );
        assert!(
            line.contains(
                "tgid 12 tid 13: brief record sent: 5 frames of walk 7 at sp 7fff00000000"
            ),
            "{line}"
        );
        let failed = Note::parse(&format!(
            "note {} 1 2 {} 0 0 0",
            why::USER_STACK_WALK_FAILED,
            -14i64 as u64
        ))
        .expect("a note");
        assert_eq!(
            failed.to_string(),
            "tgid 1 tid 2: user stack lost: walk failed (-14)"
        );
        assert_eq!(
            Note::parse("note 999 1 2 3 4 5 6").map(|n| n.to_string()),
            Some("tgid 1 tid 2: note of unknown kind 999: 3 4 5 6".to_string())
        );
        // Other lines pass through as they are.
        assert_eq!(Note::parse("note 1 2"), None);
        assert_eq!(Note::parse("something odd"), None);
        assert!(forwarded("debug", log::Level::Debug, "note x").contains("note x"));
    }

    #[test]
    fn the_filter_applies_to_kernel_lines() {
        assert_eq!(forwarded("info", log::Level::Debug, "hidden"), "");
        let shown = forwarded("info,profilerd::kernel=debug", log::Level::Debug, "shown");
        assert!(shown.contains("shown"), "{shown}");
    }

    #[test]
    fn wanted_follows_the_setting_and_the_filter() {
        let quiet = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .finish();
        tracing::subscriber::with_default(quiet, || {
            assert!(!wanted(false));
            assert!(wanted(true));
        });
        for filter in ["debug", "info,profilerd::kernel=debug", "trace"] {
            let verbose = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .finish();
            tracing::subscriber::with_default(verbose, || assert!(wanted(false), "{filter}"));
        }
    }
}
