//! Retention (`--retention`): deletes the daemon's own profile files that
//! are older than the retention from the output directory, at start and
//! after every window.
//!
//! Only names that writer.rs produces are touched: `<type>-<UTC stamp>.pb.gz`
//! or `<type>-<UTC stamp>-N.pb.gz`, checked by parsing the name and writing
//! it again with [`writer::file_name`], so a name that differs in any byte
//! (another suffix, a leading zero, an impossible date, upper case) is not
//! ours. Only regular files are deleted: symlinks (which are never
//! followed) and directories stay, whatever their name.
//!
//! A file's age is the window start in its name, not its mtime: the name is
//! what the daemon wrote and what a reader sorts by, while the mtime changes
//! when a collector touches or copies the file back, and a file restored
//! with a fresh mtime would otherwise live a second retention. A name in the
//! future (the clock was stepped back) is kept.
//!
//! Deleting is best effort: a failure is logged once (the first), counted,
//! and never stops the daemon.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::model::profile_kind::ProfileKind;
use crate::output::writer;

/// Deletes old profile files from one output directory.
#[derive(Debug)]
pub struct Retention {
    dir: PathBuf,
    max_age: Duration,
    deleted: u64,
    failures: u64,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    /// Files deleted.
    pub deleted: u64,
    /// Files (or the directory listing) that could not be deleted or read.
    pub failures: u64,
}

impl Retention {
    /// Deletes, in `dir`, the daemon's files whose window started more than
    /// `max_age` ago.
    pub fn new(dir: &Path, max_age: Duration) -> Self {
        Self {
            dir: dir.to_owned(),
            max_age,
            deleted: 0,
            failures: 0,
        }
    }

    /// Files deleted since start.
    #[cfg(test)]
    pub fn deleted(&self) -> u64 {
        self.deleted
    }

    /// Failed deletions (and failed directory listings) since start.
    #[cfg(test)]
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// One pass over the directory: deletes every file of ours that is older
    /// than the retention at `now`. Streams the listing (nothing grows with
    /// the number of files).
    pub fn sweep(&mut self, now: SystemTime) -> Sweep {
        let mut sweep = Sweep::default();
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => {
                self.failed(&mut sweep, &self.dir.clone(), "listing", &e);
                return sweep;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    self.failed(&mut sweep, &self.dir.clone(), "listing", &e);
                    break;
                }
            };
            let name = entry.file_name();
            let Some(start) = name.to_str().and_then(window_start) else {
                continue;
            };
            // A future stamp gives Err: not expired.
            if now
                .duration_since(start)
                .map_or(true, |age| age <= self.max_age)
            {
                continue;
            }
            // DirEntry::file_type does not follow symlinks.
            match entry.file_type() {
                Ok(t) if t.is_file() => {}
                Ok(_) => continue,
                Err(e) => {
                    self.failed(&mut sweep, &entry.path(), "checking", &e);
                    continue;
                }
            }
            // unlink(2) removes a name; it never follows a symlink that
            // took the file's place since the check.
            match fs::remove_file(entry.path()) {
                Ok(()) => {
                    sweep.deleted += 1;
                    self.deleted += 1;
                    tracing::debug!("retention: deleted {}", entry.path().display());
                }
                // Someone else deleted it first: nothing to do.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => self.failed(&mut sweep, &entry.path(), "deleting", &e),
            }
        }
        sweep
    }

    /// Sweeps now; what it deleted goes to the debug log.
    pub fn run(&mut self) {
        let sweep = self.sweep(SystemTime::now());
        if sweep != Sweep::default() {
            tracing::debug!(
                deleted = sweep.deleted,
                failures = sweep.failures,
                "retention: deleted profile files older than {}",
                humantime::format_duration(self.max_age)
            );
        }
    }

    /// Totals since start, for the summary at exit.
    pub fn log_totals(&self) {
        tracing::info!(
            deleted = self.deleted,
            failures = self.failures,
            "retention summary (files older than {})",
            humantime::format_duration(self.max_age)
        );
    }

    fn failed(&mut self, sweep: &mut Sweep, path: &Path, what: &str, err: &io::Error) {
        if self.failures == 0 {
            tracing::warn!(
                "retention: {what} {} failed: {err} (further failures are only counted)",
                path.display()
            );
        }
        self.failures += 1;
        sweep.failures += 1;
    }
}

/// The window start of `name` if it is exactly a name that writer.rs
/// produces for some profile type, window start and suffix; else `None`.
pub fn window_start(name: &str) -> Option<SystemTime> {
    let rest = name.strip_suffix(".pb.gz")?;
    let (kind, rest) = rest.split_once('-')?;
    let kind: ProfileKind = kind.parse().ok()?;
    // YYYYMMDDTHHMMSSZ, then nothing or -N.
    let stamp = rest.get(..16)?;
    let n = match &rest[16..] {
        "" => 0,
        suffix => suffix.strip_prefix('-')?.parse::<u32>().ok()?,
    };
    if !stamp.is_ascii() {
        return None;
    }
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &stamp[0..4],
        &stamp[4..6],
        &stamp[6..8],
        &stamp[9..11],
        &stamp[11..13],
        &stamp[13..15]
    );
    let start = humantime::parse_rfc3339(&rfc3339).ok()?;
    // Writing the name again proves the parse saw exactly writer.rs's format
    // (the 'T' and 'Z', no '+' or leading zeros in N, no -0 suffix).
    (writer::file_name(kind, start, n) == name).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::time::UNIX_EPOCH;

    const HOUR: Duration = Duration::from_secs(3600);

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn parses_every_name_the_writer_produces() {
        for kind in ProfileKind::ALL {
            for secs in [0, 951_782_400, 1_795_313_741, 4_000_000_000] {
                for n in [0, 1, 9, 10, 10_000] {
                    let name = writer::file_name(kind, at(secs), n);
                    assert_eq!(window_start(&name), Some(at(secs)), "{name}");
                }
            }
        }
    }

    #[test]
    fn rejects_similar_names() {
        for name in [
            "cpu-20261122T021541Z.pb",
            "cpu-20261122T021541Z.pb.gz.bak",
            "cpu-20261122T021541Z.pb.gz~",
            ".cpu-20261122T021541Z.pb.gz.tmp-12-0",
            "CPU-20261122T021541Z.pb.gz",
            "gpu-20261122T021541Z.pb.gz",
            "cpu_20261122T021541Z.pb.gz",
            "cpu-20261122T021541.pb.gz",
            "cpu-20261122t021541z.pb.gz",
            "cpu-20261122T0215Z.pb.gz",
            "cpu-2026-11-22T02:15:41Z.pb.gz",
            "cpu-20261322T021541Z.pb.gz",
            "cpu-20261131T021541Z.pb.gz",
            "cpu-20261122T241541Z.pb.gz",
            "cpu-20261122T021541Z-0.pb.gz",
            "cpu-20261122T021541Z-01.pb.gz",
            "cpu-20261122T021541Z-+1.pb.gz",
            "cpu-20261122T021541Z-1-1.pb.gz",
            "cpu-20261122T021541Z-x.pb.gz",
            "cpu-20261122T021541Z-.pb.gz",
            "cpu-20261122T021541Z1.pb.gz",
            "cpu-20261122T021541Z.pb.gz.pb.gz",
            "heap-cpu-20261122T021541Z.pb.gz",
            "cpu-2026112２T021541Z.pb.gz",
            "cpu-",
            "",
        ] {
            assert_eq!(window_start(name), None, "{name:?} was taken for ours");
        }
    }

    #[test]
    fn deletes_only_old_regular_files_of_ours() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("out");
        fs::create_dir(&dir).expect("mkdir");
        let now = at(1_795_313_741);
        let old = now - 2 * HOUR;
        let fresh = now - HOUR / 2;
        let write = |name: String| fs::write(dir.join(name), b"x").expect("write");
        write(writer::file_name(ProfileKind::Cpu, old, 0));
        write(writer::file_name(ProfileKind::Heap, old, 3));
        write(writer::file_name(ProfileKind::Offcpu, fresh, 0));
        write(writer::file_name(ProfileKind::Mutex, now + HOUR, 0));
        write("cpu-20000101T000000Z.pb.gz.bak".into());
        write("notes.txt".into());
        // Our name, but a directory and a symlink to a file outside.
        let sub = dir.join(writer::file_name(ProfileKind::Block, old, 0));
        fs::create_dir(&sub).expect("mkdir");
        fs::write(sub.join(writer::file_name(ProfileKind::Cpu, old, 0)), b"x").expect("write");
        let target = tmp.path().join("target");
        fs::write(&target, b"keep").expect("write");
        symlink(
            &target,
            dir.join(writer::file_name(ProfileKind::Cpu, old, 1)),
        )
        .expect("symlink");

        let mut r = Retention::new(&dir, HOUR);
        assert_eq!(
            r.sweep(now),
            Sweep {
                deleted: 2,
                failures: 0
            }
        );
        assert_eq!(
            names(&dir),
            [
                "block-20261122T001541Z.pb.gz",
                "cpu-20000101T000000Z.pb.gz.bak",
                "cpu-20261122T001541Z-1.pb.gz",
                "mutex-20261122T031541Z.pb.gz",
                "notes.txt",
                "offcpu-20261122T014541Z.pb.gz",
            ]
        );
        assert_eq!(names(&sub), ["cpu-20261122T001541Z.pb.gz"]);
        assert_eq!(fs::read(&target).expect("read"), b"keep");
        // Nothing more to do a second time; the total is kept.
        assert_eq!(r.sweep(now), Sweep::default());
        assert_eq!((r.deleted(), r.failures()), (2, 0));
    }

    #[test]
    fn age_is_exclusive_of_the_retention() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let now = at(1_795_313_741);
        let name = writer::file_name(ProfileKind::Cpu, now - HOUR, 0);
        fs::write(tmp.path().join(&name), b"x").expect("write");
        let mut r = Retention::new(tmp.path(), HOUR);
        assert_eq!(r.sweep(now).deleted, 0);
        assert_eq!(r.sweep(now + Duration::from_secs(1)).deleted, 1);
    }

    #[test]
    fn failures_are_counted_not_fatal() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("gone");
        let mut r = Retention::new(&missing, HOUR);
        assert_eq!(r.sweep(at(0)).failures, 1);
        assert_eq!(r.sweep(at(0)).failures, 1);
        assert_eq!((r.deleted(), r.failures()), (0, 2));
    }
}
