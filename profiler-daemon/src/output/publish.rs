//! Where a finished profile goes: gzipped once, written to its file (always),
//! counted in the metrics, and handed to each sink that is set (the push to
//! Pyroscope, push/mod.rs; the OTLP export, otlp/), which makes its own
//! uploads of it.
//!
//! A failed write (full disk, vanished directory) is logged once per window,
//! not once per profile type, and the first successful write after failures
//! says how many windows were lost: a full disk must not flood the log that
//! may live on the same disk.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Result;
use tokio::sync::{mpsc, watch};

use crate::config::Settings;
use crate::model::profile_kind::ProfileKind;
use crate::output::metrics::Metrics;
use crate::output::pprof_http::{Capture, MAX_CAPTURES, PprofServer, Rates, Targets};
use crate::output::push::Pusher;
use crate::output::writer::{ProfileWriter, WriteError};

/// The outputs of the session's windows.
pub struct Publisher {
    pub writer: ProfileWriter,
    pub metrics: Arc<Metrics>,
    /// The push and the OTLP export, those that are set.
    pub sinks: Vec<Pusher>,
    failures: Mutex<Failures>,
}

/// Windows whose profiles could not be written, since the last success.
#[derive(Debug, Default)]
struct Failures {
    /// Start of the last window that had a failed write.
    last_window: Option<SystemTime>,
    /// Windows with a failed write since the last successful one.
    windows: u32,
}

impl Publisher {
    pub fn new(writer: ProfileWriter, metrics: Arc<Metrics>, sinks: Vec<Pusher>) -> Self {
        Publisher {
            writer,
            metrics,
            sinks,
            failures: Mutex::default(),
        }
    }

    /// The metrics every output reports to.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Writes `profile` of the window that started at `start`, then hands
    /// it to the sinks (never waits for them). Logs
    /// the failure (once per window) or a recovery.
    pub fn publish(
        &self,
        kind: ProfileKind,
        start: SystemTime,
        profile: &pprof_proto::Profile,
    ) -> Result<PathBuf, WriteError> {
        let bytes = pprof_proto::encode_gzip(profile);
        let path = match self.writer.write_gzipped(kind, start, &bytes) {
            Ok(path) => path,
            Err(e) => {
                self.metrics.write_failed(kind);
                self.failed(kind, start, &e);
                return Err(e);
            }
        };
        self.succeeded();
        self.metrics
            .profile_written(kind, profile.sample.len(), bytes.len());
        if !self.sinks.is_empty() {
            let file = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            for sink in &self.sinks {
                sink.push(kind, profile, &file);
            }
        }
        Ok(path)
    }
}

impl Publisher {
    fn failures(&self) -> std::sync::MutexGuard<'_, Failures> {
        // The counts stay meaningful even if a writer panicked holding them.
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failed(&self, kind: ProfileKind, start: SystemTime, e: &WriteError) {
        let mut f = self.failures();
        if f.last_window == Some(start) {
            return;
        }
        f.last_window = Some(start);
        f.windows += 1;
        tracing::error!(
            "writing the profiles of this window failed (first: {kind}): {e}; \
             the window is lost, writing is retried next window"
        );
    }

    fn succeeded(&self) {
        let mut f = self.failures();
        if f.windows > 0 {
            tracing::info!(
                "writing profiles recovered after {} failed window(s)",
                f.windows
            );
            *f = Failures::default();
        }
    }
}

/// The session's ends of `/debug/pprof/`: the captures asked for, and
/// what the index page lists.
pub(crate) struct PprofChannels {
    pub(crate) captures: mpsc::Receiver<Capture>,
    pub(crate) targets: watch::Sender<Targets>,
}

/// The metrics, the `/metrics` server, the push and the OTLP export, as
/// configured.
/// The server binds here, so that a port in use stops the start.
/// With `--http-addr`, also the session's ends of `/debug/pprof/`.
pub(crate) async fn start_outputs(
    settings: &Settings,
    writer: ProfileWriter,
) -> Result<(Publisher, Option<PprofChannels>)> {
    let metrics = Arc::new(Metrics::new()?);
    let (pprof, channels) = match settings.http_addr {
        Some(_) => {
            let (tx, rx) = mpsc::channel(MAX_CAPTURES);
            let (targets_tx, targets_rx) = watch::channel(None);
            let server = PprofServer {
                targets: targets_rx,
                captures: tx,
                rates: Rates::of(settings),
                profiles: settings.profiles.clone(),
                token: settings.http_token.clone(),
                metrics_without_token: settings.http_metrics_without_token,
            };
            let channels = PprofChannels {
                captures: rx,
                targets: targets_tx,
            };
            (Some(server), Some(channels))
        }
        None => (None, None),
    };
    if let Some(addr) = settings.metrics_addr {
        let serves_pprof = pprof.is_some();
        let (bound, _) = crate::output::metrics::serve(addr, metrics.clone(), pprof).await?;
        tracing::info!(target: "profilerd::session", "serving metrics at http://{bound}/metrics");
        if serves_pprof {
            tracing::info!(target: "profilerd::session", "serving profiles on demand at http://{bound}/debug/pprof/");
        }
    }
    let mut sinks = Vec::new();
    if let Some(push) = &settings.push {
        let pusher = Pusher::start(push.clone())?;
        metrics.watch_push(pusher.stats());
        tracing::info!(target: "profilerd::session", "pushing every profile to {}", pusher.url());
        sinks.push(pusher);
    }
    if let Some(otlp) = &settings.otlp {
        let exporter = crate::output::otlp::start(otlp.clone())?;
        metrics.watch_otlp(exporter.stats());
        tracing::warn!(
            target: "profilerd::session",
            "exporting every profile to {} as OTLP profiles ({}, alpha: the format may change)",
            exporter.url(),
            crate::output::otlp::PINNED
        );
        sinks.push(exporter);
    }
    Ok((Publisher::new(writer, metrics, sinks), channels))
}
