//! Kernel-side diagnostics: why the eBPF programs skip, drop, shorten or
//! fall back (a stack copy that faulted, a walk hint that did not match, a
//! full map or ring, a brief record sent), read from aya-log's `AYA_LOGS`
//! ring and logged with target `profilerd::kernel` at debug level.
//!
//! Off by default: the kernel then drops every log site at load time
//! (`profiler-ebpf/src/klog.rs`). On with `[debug] kernel_log = true`, or
//! when the log filter shows debug lines of that target
//! (`PROFILERD_LOG=debug`, or `PROFILERD_LOG=info,profilerd::kernel=debug`
//! for these alone). The kernel sends at most a few lines of each kind per
//! CPU per second and counts the rest (`kernel_logs_dropped`).

use std::os::fd::{AsRawFd, RawFd};

use aya::Ebpf;
use aya_log::EbpfLogger;

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
        let message = record.args();
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
