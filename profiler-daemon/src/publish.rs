//! Where a finished profile goes: gzipped once, written to its file (always),
//! counted in the metrics, and queued for the push endpoint when one is
//! set. The push gets the file's exact bytes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::metrics::Metrics;
use crate::profile_kind::ProfileKind;
use crate::push::{Pusher, Upload, window_seconds};
use crate::writer::{ProfileWriter, WriteError};

/// The outputs of the session's windows.
pub struct Publisher {
    pub writer: ProfileWriter,
    pub metrics: Arc<Metrics>,
    pub pusher: Option<Pusher>,
}

impl Publisher {
    /// Writes `profile` of the window that started at `start` and lasted
    /// `duration`, then queues it for the push (never waits for it).
    pub fn publish(
        &self,
        kind: ProfileKind,
        start: SystemTime,
        duration: Duration,
        profile: &pprof_proto::Profile,
    ) -> Result<PathBuf, WriteError> {
        let bytes = Bytes::from(pprof_proto::encode_gzip(profile));
        let path = match self.writer.write_gzipped(kind, start, &bytes) {
            Ok(path) => path,
            Err(e) => {
                self.metrics.write_failed(kind);
                return Err(e);
            }
        };
        self.metrics
            .profile_written(kind, profile.sample.len(), bytes.len());
        if let Some(pusher) = &self.pusher {
            let (from, until) = window_seconds(start, duration);
            pusher.push(Upload {
                kind,
                body: bytes,
                from,
                until,
                file: path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            });
        }
        Ok(path)
    }
}
