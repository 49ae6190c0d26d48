//! Writes finished profiles into the output directory: file naming
//! (`<type>-<UTC window start>[-N].pb.gz`) and the atomic publish (hidden
//! temporary file, fsync, mode 0640, no-replace rename) that keeps readers
//! from ever seeing a partial or overwritten file.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::profile_kind::ProfileKind;

/// Profiles hold stacks and command names: readable by the owner's group
/// (for collectors), not by everyone.
const FILE_MODE: u32 = 0o640;

/// How many `-N` suffixes to try before giving up; only reached if
/// something keeps creating files with our names.
const MAX_SUFFIX: u32 = 10_000;

/// Why the output directory could not be used or a profile not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot create output directory {}: {source}", dir.display())]
    CreateDir { dir: PathBuf, source: io::Error },
    #[error("output directory {} is not writable: {source}", dir.display())]
    NotWritable { dir: PathBuf, source: io::Error },
    #[error("cannot write profile {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("no free file name for {} after {tries} attempts", path.display())]
    NoFreeName { path: PathBuf, tries: u32 },
}

/// Publishes profiles into one output directory.
#[derive(Debug)]
pub struct ProfileWriter {
    dir: PathBuf,
    /// Makes temporary names unique among concurrent writes of this process.
    counter: AtomicU32,
    max_suffix: u32,
}

impl ProfileWriter {
    /// Creates `dir` if missing (create_dir_all) and proves it is writable
    /// by creating and removing a temporary file in it; the error names the
    /// directory and the reason.
    pub fn open(dir: &Path) -> Result<Self, WriteError> {
        fs::create_dir_all(dir).map_err(|source| WriteError::CreateDir {
            dir: dir.to_owned(),
            source,
        })?;
        // Checking permission bits is not enough (read-only mounts, ACLs,
        // root): only an actual file creation proves the directory works.
        let probe = dir.join(format!(".profilerd-probe-{}", std::process::id()));
        // A leftover probe (or a planted symlink) is removed, not followed:
        // the daemon runs as root and must not truncate files elsewhere.
        let _ = fs::remove_file(&probe);
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .and_then(|_| fs::remove_file(&probe));
        if let Err(source) = created {
            let _ = fs::remove_file(&probe);
            return Err(WriteError::NotWritable {
                dir: dir.to_owned(),
                source,
            });
        }
        Ok(Self {
            dir: dir.to_owned(),
            counter: AtomicU32::new(0),
            max_suffix: MAX_SUFFIX,
        })
    }

    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `profile` gzipped as `<type>-<window start>.pb.gz` (or the
    /// first free `-N` variant) and returns the final path. The file
    /// appears complete or not at all, and never replaces an existing file.
    pub fn write(
        &self,
        kind: ProfileKind,
        window_start: SystemTime,
        profile: &pprof_proto::Profile,
    ) -> Result<PathBuf, WriteError> {
        let bytes = pprof_proto::encode_gzip(profile);
        self.write_gzipped(kind, window_start, &bytes)
    }

    /// Like [`ProfileWriter::write`], for a profile already gzipped (so
    /// that the caller can send the same bytes elsewhere).
    pub fn write_gzipped(
        &self,
        kind: ProfileKind,
        window_start: SystemTime,
        bytes: &[u8],
    ) -> Result<PathBuf, WriteError> {
        self.write_bytes(bytes, |n| file_name(kind, window_start, n))
    }

    fn write_bytes(
        &self,
        bytes: &[u8],
        name: impl Fn(u32) -> String,
    ) -> Result<PathBuf, WriteError> {
        let tmp = TempFile(self.dir.join(format!(
            ".{}.tmp-{}-{}",
            name(0),
            std::process::id(),
            self.counter.fetch_add(1, Ordering::Relaxed)
        )));
        let write_err = |source| WriteError::Write {
            path: tmp.0.clone(),
            source,
        };
        // create_new: never write through a stale file or symlink.
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp.0)
            .map_err(write_err)?;
        // Set the mode explicitly: the umask may have removed bits at open.
        file.set_permissions(Permissions::from_mode(FILE_MODE))
            .and_then(|()| file.write_all(bytes))
            .and_then(|()| file.sync_all())
            .map_err(write_err)?;
        drop(file);

        for n in 0..=self.max_suffix {
            let path = self.dir.join(name(n));
            match rename_noreplace(&tmp.0, &path) {
                Ok(()) => {
                    tmp.disarm();
                    self.sync_dir();
                    return Ok(path);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(WriteError::Write { path, source }),
            }
        }
        Err(WriteError::NoFreeName {
            path: self.dir.join(name(0)),
            tries: self.max_suffix + 1,
        })
    }

    /// Makes the rename durable. The file is already in place, so a failure
    /// here is only worth a warning.
    fn sync_dir(&self) {
        if let Err(e) = File::open(&self.dir).and_then(|d| d.sync_all()) {
            tracing::warn!("fsync of {}: {e}", self.dir.display());
        }
    }
}

/// Removes the temporary file on drop unless the rename published it.
struct TempFile(PathBuf);

impl TempFile {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Renames `from` to `to` unless `to` exists (then `AlreadyExists`).
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
    };
    let (cfrom, cto) = (c(from)?, c(to)?);
    // SAFETY: both pointers are valid NUL-terminated strings for the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cfrom.as_ptr(),
            libc::AT_FDCWD,
            cto.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        // Filesystems without RENAME_NOREPLACE (and old kernels): a hard
        // link also fails with EEXIST instead of replacing.
        Some(libc::EINVAL | libc::ENOSYS) => {
            fs::hard_link(from, to)?;
            fs::remove_file(from)
        }
        _ => Err(err),
    }
}

/// `<type>-<window start UTC as YYYYMMDDTHHMMSSZ>.pb.gz`; for `n > 0`,
/// `-N` goes before `.pb.gz`.
pub fn file_name(kind: ProfileKind, window_start: SystemTime, n: u32) -> String {
    let stamp = utc_stamp(window_start);
    if n == 0 {
        format!("{kind}-{stamp}.pb.gz")
    } else {
        format!("{kind}-{stamp}-{n}.pb.gz")
    }
}

/// Formats `t` as `YYYYMMDDTHHMMSSZ` (UTC, whole seconds rounded down).
fn utc_stamp(t: SystemTime) -> String {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => {
            let d = e.duration();
            -(d.as_secs() as i64) - i64::from(d.subsec_nanos() > 0)
        }
    };
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Proleptic Gregorian (year, month, day) of the day `days` after
/// 1970-01-01. Counts in 400-year eras starting on March 1st, so the leap
/// day is the last day of its year and needs no special case.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of year from March 1st
    let mp = (5 * doy + 2) / 153; // month from March, 0..=11
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod properties;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn profile() -> pprof_proto::Profile {
        pprof_proto::Profile {
            string_table: vec![String::new(), "x".into()],
            duration_nanos: 5,
            ..Default::default()
        }
    }

    #[test]
    fn name_format() {
        assert_eq!(
            file_name(ProfileKind::Cpu, at(1_795_313_741), 0),
            "cpu-20261122T021541Z.pb.gz"
        );
        assert_eq!(
            file_name(
                ProfileKind::Offcpu,
                at(1_795_313_741) + Duration::from_millis(999),
                2
            ),
            "offcpu-20261122T021541Z-2.pb.gz"
        );
        assert_eq!(
            file_name(ProfileKind::Heap, at(0), 0),
            "heap-19700101T000000Z.pb.gz"
        );
        assert_eq!(
            file_name(ProfileKind::Mutex, at(951_782_400), 0),
            "mutex-20000229T000000Z.pb.gz"
        );
        assert_eq!(
            file_name(ProfileKind::Block, UNIX_EPOCH - Duration::from_millis(1), 0),
            "block-19691231T235959Z.pb.gz"
        );
    }

    #[test]
    fn stamp_matches_rfc3339() {
        // Cross-check the calendar arithmetic over a range of days.
        for secs in (0..4_000_000_000u64).step_by(7_777_777) {
            let rfc = humantime::format_rfc3339_seconds(at(secs)).to_string();
            let expect: String = rfc.chars().filter(|c| !matches!(c, '-' | ':')).collect();
            assert_eq!(utc_stamp(at(secs)), expect);
        }
    }

    #[test]
    fn writes_with_suffix_mode_and_no_temp_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = ProfileWriter::open(dir.path()).expect("open");
        let start = at(1_795_313_741);
        let p0 = w.write(ProfileKind::Cpu, start, &profile()).expect("write");
        let p1 = w.write(ProfileKind::Cpu, start, &profile()).expect("write");
        let p2 = w.write(ProfileKind::Cpu, start, &profile()).expect("write");
        assert_eq!(p0, dir.path().join("cpu-20261122T021541Z.pb.gz"));
        assert_eq!(p1, dir.path().join("cpu-20261122T021541Z-1.pb.gz"));
        assert_eq!(p2, dir.path().join("cpu-20261122T021541Z-2.pb.gz"));
        assert_eq!(entries(dir.path()).len(), 3, "{:?}", entries(dir.path()));

        let meta = fs::metadata(&p0).expect("metadata");
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        let bytes = fs::read(&p0).expect("read");
        assert_eq!(pprof_proto::decode(&bytes).expect("decode"), profile());
    }

    #[test]
    fn never_overwrites_existing_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = ProfileWriter::open(dir.path()).expect("open");
        let taken = dir.path().join(file_name(ProfileKind::Heap, at(60), 0));
        fs::write(&taken, b"keep me").expect("write");
        let p = w
            .write(ProfileKind::Heap, at(60), &profile())
            .expect("write");
        assert_eq!(p, dir.path().join("heap-19700101T000100Z-1.pb.gz"));
        assert_eq!(fs::read(&taken).expect("read"), b"keep me");
    }

    #[test]
    fn failure_after_temp_file_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = ProfileWriter::open(dir.path()).expect("open");
        w.max_suffix = 2;
        for n in 0..=2 {
            fs::write(dir.path().join(file_name(ProfileKind::Cpu, at(0), n)), b"").expect("write");
        }
        let err = w
            .write(ProfileKind::Cpu, at(0), &profile())
            .expect_err("all names taken");
        assert!(
            matches!(err, WriteError::NoFreeName { tries: 3, .. }),
            "{err}"
        );
        assert_eq!(entries(dir.path()).len(), 3, "{:?}", entries(dir.path()));
    }

    #[test]
    fn failure_when_dir_vanishes_names_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let w = ProfileWriter::open(&out).expect("open");
        // Replace the directory by a regular file: works even as root.
        fs::remove_dir(&out).expect("remove_dir");
        fs::write(&out, b"").expect("write");
        let err = w
            .write(ProfileKind::Cpu, at(0), &profile())
            .expect_err("dir is a file");
        let msg = err.to_string();
        assert!(msg.contains(&*out.to_string_lossy()), "{msg}");
        assert_eq!(entries(dir.path()), ["out"]);
    }

    #[test]
    fn open_creates_missing_dirs_and_leaves_no_probe() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("a/b/c");
        let w = ProfileWriter::open(&out).expect("open");
        assert_eq!(w.dir(), out);
        assert!(entries(&out).is_empty());
    }

    #[test]
    fn open_fails_on_unusable_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("file");
        fs::write(&file, b"").expect("write");
        let bad = file.join("out");
        let err = ProfileWriter::open(&bad).expect_err("parent is a file");
        let msg = err.to_string();
        assert!(msg.contains(&*bad.to_string_lossy()), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");

        // An existing regular file is not a directory either.
        let err = ProfileWriter::open(&file).expect_err("path is a file");
        assert!(err.to_string().contains(&*file.to_string_lossy()), "{err}");
    }
}
