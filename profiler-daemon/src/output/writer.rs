//! Writes finished profiles into the output directory: the directory's
//! safety check, file naming (`<type>-<UTC window start>[-N].pb.gz`) and the
//! atomic publish (hidden temporary file, fsync, mode 0640, no-replace
//! rename) that keeps readers from ever seeing a partial or overwritten file.
//!
//! The daemon runs as root, so the output path must not let anyone else
//! steer its writes: every directory on the path (and on the target of each
//! symlink on it) must be owned by root or the daemon's user and must not be
//! writable by group or others unless sticky; a symlink is followed only if
//! it is owned by root or the daemon's user too. Directories it creates are
//! 0750. Once checked, the directory is opened and every file is created and
//! renamed through that handle, never through the path again.

use std::collections::VecDeque;
use std::ffi::{CStr, CString, OsString};
use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::model::profile_kind::ProfileKind;

/// Profiles hold stacks and command names: readable by the owner's group
/// (for collectors), not by everyone.
const FILE_MODE: u32 = 0o640;
/// Mode of the directories the daemon creates on the output path.
const DIR_MODE: u32 = 0o750;
/// Symlinks followed while resolving the output path, as the kernel's
/// own limit (MAXSYMLINKS): more is a loop.
const MAX_SYMLINKS: u32 = 40;

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
    #[error(
        "output directory {} is not safe: {} {reason}; it must be owned by root or \
         the daemon's user and not writable by others",
        dir.display(), crate::model::text::escape_controls(&at.to_string_lossy())
    )]
    Unsafe {
        dir: PathBuf,
        at: PathBuf,
        reason: String,
    },
    #[error("cannot write profile {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("no free file name for {} after {tries} attempts", path.display())]
    NoFreeName { path: PathBuf, tries: u32 },
}

/// Publishes profiles into one output directory.
#[derive(Debug)]
pub struct ProfileWriter {
    /// The directory's path with every symlink resolved.
    dir: PathBuf,
    /// The directory itself: files are created and renamed relative to it.
    dir_fd: File,
    /// Makes temporary names unique among concurrent writes of this process.
    counter: AtomicU32,
    max_suffix: u32,
}

impl ProfileWriter {
    /// Resolves `dir` under the safety rule (see the module doc), creating
    /// missing directories (0750), opens it and proves it is writable by
    /// creating and removing a temporary file in it; the error names the
    /// directory and the reason.
    pub fn open(dir: &Path) -> Result<Self, WriteError> {
        let resolved = resolve_safe(dir)?;
        let dir_fd = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&resolved)
            .map_err(|source| WriteError::NotWritable {
                dir: dir.to_owned(),
                source,
            })?;
        // Checking permission bits is not enough (read-only mounts, ACLs,
        // root): only an actual file creation proves the directory works.
        let probe = cstring(format!(".profilerd-probe-{}", std::process::id()));
        // A leftover probe (or a planted symlink) is removed, not followed.
        let _ = unlink_at(&dir_fd, &probe);
        let created = create_at(&dir_fd, &probe).and_then(|_| unlink_at(&dir_fd, &probe));
        if let Err(source) = created {
            let _ = unlink_at(&dir_fd, &probe);
            return Err(WriteError::NotWritable {
                dir: dir.to_owned(),
                source,
            });
        }
        Ok(Self {
            dir: resolved,
            dir_fd,
            counter: AtomicU32::new(0),
            max_suffix: MAX_SUFFIX,
        })
    }

    /// The output directory, symlinks resolved.
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
        let tmp_name = format!(
            ".{}.tmp-{}-{}",
            name(0),
            std::process::id(),
            self.counter.fetch_add(1, Ordering::Relaxed)
        );
        let tmp = TempFile {
            dir: &self.dir_fd,
            name: cstring(&tmp_name),
        };
        let write_err = |source| WriteError::Write {
            path: self.dir.join(&tmp_name),
            source,
        };
        // O_EXCL | O_NOFOLLOW: never write through a stale file or symlink.
        let mut file = create_at(&self.dir_fd, &tmp.name).map_err(write_err)?;
        // Set the mode explicitly: the umask may have removed bits at open.
        file.set_permissions(Permissions::from_mode(FILE_MODE))
            .and_then(|()| file.write_all(bytes))
            .and_then(|()| file.sync_all())
            .map_err(write_err)?;
        drop(file);
        if let Some(delay) = test_rename_delay() {
            std::thread::sleep(delay);
        }

        for n in 0..=self.max_suffix {
            let final_name = name(n);
            let path = self.dir.join(&final_name);
            match rename_noreplace(&self.dir_fd, &tmp.name, &cstring(&final_name)) {
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
        if let Err(e) = self.dir_fd.sync_all() {
            tracing::warn!("fsync of {}: {e}", self.dir.display());
        }
    }
}

impl ProfileWriter {
    /// Removes the temporary files (`.<name>.pb.gz.tmp-<pid>-<n>`) left by
    /// writers that died mid-write (SIGKILL, power loss): their pid is no
    /// longer running (or a zombie), or is our own (a dead instance's pid reused by us).
    /// Temporary files of a live writer sharing the directory are kept.
    /// Returns how many were removed.
    pub fn remove_stale_temp_files(&self) -> usize {
        // Listed and removed through the directory's handle, like every
        // other file operation here.
        let listing = PathBuf::from(format!("/proc/self/fd/{}", self.dir_fd.as_raw_fd()));
        let Ok(entries) = fs::read_dir(&listing) else {
            return 0;
        };
        let own = std::process::id();
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = temp_file_pid(&name.to_string_lossy()) else {
                continue;
            };
            let stale = pid == own || !writer_alive(pid);
            // file_type does not follow symlinks: a planted link is removed,
            // its target left alone; directories are not ours.
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if stale && !is_dir {
                // The name parsed as ours, so it is plain ASCII.
                let Ok(cname) = CString::new(name.as_encoded_bytes()) else {
                    continue;
                };
                match unlink_at(&self.dir_fd, &cname) {
                    Ok(()) => removed += 1,
                    Err(e) => tracing::warn!(
                        "cannot remove stale temporary file {}: {e}",
                        self.dir.join(&name).display()
                    ),
                }
            }
        }
        removed
    }
}

/// Whether `pid` is a running process. A zombie counts as dead: it never
/// writes again, and its parent may take long to reap it.
fn writer_alive(pid: u32) -> bool {
    // Read lossily: a command name need not be UTF-8.
    crate::model::text::read_proc_text(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// The writer's pid in a temporary file name `.<name>.pb.gz.tmp-<pid>-<n>`.
fn temp_file_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let (_, suffix) = rest.rsplit_once(".pb.gz.tmp-")?;
    let (pid, n) = suffix.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// Test hook: `PROFILERD_TEST_RENAME_DELAY_MS` holds every finished
/// temporary file this long before its rename, so that a test can kill the
/// daemon mid-write. Unset (always, outside tests): no delay.
fn test_rename_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var("PROFILERD_TEST_RENAME_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(std::time::Duration::from_millis)
    })
}

/// Removes the temporary file on drop unless the rename published it.
struct TempFile<'a> {
    dir: &'a File,
    name: CString,
}

impl TempFile<'_> {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        let _ = unlink_at(self.dir, &self.name);
    }
}

/// `dir` made absolute with every symlink resolved, each directory on the
/// way (and on every symlink's target) checked by [`check_dir`] and every
/// symlink by [`check_owner`]; missing directories are created with
/// [`DIR_MODE`].
fn resolve_safe(dir: &Path) -> Result<PathBuf, WriteError> {
    let absolute = if dir.is_absolute() {
        dir.to_owned()
    } else {
        std::env::current_dir()
            .map_err(|source| WriteError::CreateDir {
                dir: dir.to_owned(),
                source,
            })?
            .join(dir)
    };
    let unsafe_at = |at: &Path, reason: String| WriteError::Unsafe {
        dir: dir.to_owned(),
        at: at.to_owned(),
        reason,
    };
    let root = PathBuf::from("/");
    check_dir(&fs::symlink_metadata(&root).map_err(|source| create_err(dir, source))?)
        .map_err(|r| unsafe_at(&root, r))?;
    let mut current = root.clone();
    let mut todo: VecDeque<OsString> = components(&absolute);
    let mut symlinks = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            current.pop();
            continue;
        }
        let next = current.join(&name);
        let meta = match fs::symlink_metadata(&next) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match DirBuilder::new().mode(DIR_MODE).create(&next) {
                    // Someone else created it meanwhile: checked below.
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                        return Err(create_err(dir, e));
                    }
                    _ => {}
                }
                fs::symlink_metadata(&next).map_err(|e| create_err(dir, e))?
            }
            Err(e) => return Err(create_err(dir, e)),
        };
        if meta.file_type().is_symlink() {
            check_owner(&meta).map_err(|r| unsafe_at(&next, format!("is a symlink {r}")))?;
            symlinks += 1;
            if symlinks > MAX_SYMLINKS {
                return Err(create_err(dir, io::Error::from_raw_os_error(libc::ELOOP)));
            }
            let target = fs::read_link(&next).map_err(|e| create_err(dir, e))?;
            let mut rest = components(&target);
            rest.extend(todo);
            todo = rest;
            if target.is_absolute() {
                current = root.clone();
            }
            continue;
        }
        if !meta.is_dir() {
            return Err(create_err(
                dir,
                io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!(
                        "{} is not a directory",
                        crate::model::text::escape_controls(&next.to_string_lossy())
                    ),
                ),
            ));
        }
        check_dir(&meta).map_err(|r| unsafe_at(&next, r))?;
        current = next;
    }
    Ok(current)
}

fn create_err(dir: &Path, source: io::Error) -> WriteError {
    WriteError::CreateDir {
        dir: dir.to_owned(),
        source,
    }
}

/// The names of `path` in order, `.` dropped and `..` kept.
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Owned by root or the daemon's user: nobody else can replace it.
fn check_owner(meta: &fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() == 0 || meta.uid() == euid {
        Ok(())
    } else {
        Err(format!(
            "owned by uid {}, not root or the daemon's user (uid {euid})",
            meta.uid()
        ))
    }
}

/// A directory nobody but root and the daemon's user can change entries
/// of: owned by one of them, and not group/other-writable unless sticky
/// (then others can only remove or rename their own entries).
fn check_dir(meta: &fs::Metadata) -> Result<(), String> {
    check_owner(meta).map_err(|r| format!("is {r}"))?;
    let mode = meta.mode();
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(format!(
            "is writable by {} (mode {:o}) and not sticky",
            if mode & 0o002 != 0 {
                "others"
            } else {
                "its group"
            },
            mode & 0o7777
        ));
    }
    Ok(())
}

fn cstring(name: impl AsRef<str>) -> CString {
    // Our own names never hold a NUL.
    CString::new(name.as_ref().as_bytes()).unwrap_or_default()
}

/// Creates `name` in `dir` for writing: never an existing file, never
/// through a symlink.
fn create_at(dir: &File, name: &CStr) -> io::Result<File> {
    // SAFETY: valid directory fd and NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            FILE_MODE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn unlink_at(dir: &File, name: &CStr) -> io::Result<()> {
    // SAFETY: valid directory fd and NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Renames `from` to `to` within `dir` unless `to` exists (then
/// `AlreadyExists`).
fn rename_noreplace(dir: &File, from: &CStr, to: &CStr) -> io::Result<()> {
    let fd = dir.as_raw_fd();
    // SAFETY: valid directory fd and NUL-terminated names.
    let rc = unsafe { libc::renameat2(fd, from.as_ptr(), fd, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        // Filesystems without RENAME_NOREPLACE (and old kernels): a hard
        // link also fails with EEXIST instead of replacing.
        Some(libc::EINVAL | libc::ENOSYS) => {
            // SAFETY: as above.
            if unsafe { libc::linkat(fd, from.as_ptr(), fd, to.as_ptr(), 0) } != 0 {
                return Err(io::Error::last_os_error());
            }
            unlink_at(dir, from)
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
    fn stale_temp_files_of_dead_writers_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = ProfileWriter::open(dir.path()).expect("open");
        // pid 1 is always running; no process has a pid above pid_max (4M).
        let live = ".cpu-20261122T021541Z.pb.gz.tmp-1-0";
        let dead = ".cpu-20261122T021541Z.pb.gz.tmp-99999999-3";
        let own = format!(".heap-20261122T021541Z.pb.gz.tmp-{}-0", std::process::id());
        let other = ".notes.tmp-99999999-1";
        for name in [live, dead, &own, other, "cpu-20261122T021541Z.pb.gz"] {
            fs::write(dir.path().join(name), b"x").expect("write");
        }
        assert_eq!(w.remove_stale_temp_files(), 2);
        assert_eq!(
            entries(dir.path()),
            [live, other, "cpu-20261122T021541Z.pb.gz"]
        );
        assert_eq!(temp_file_pid(dead), Some(99_999_999));
        assert_eq!(temp_file_pid("cpu.pb.gz.tmp-1-0"), None);
        assert_eq!(temp_file_pid(".cpu.pb.gz.tmp-1-x"), None);
    }

    #[test]
    fn open_creates_missing_dirs_and_leaves_no_probe() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("a/b/c");
        let w = ProfileWriter::open(&out).expect("open");
        assert_eq!(w.dir(), out);
        assert!(entries(&out).is_empty());
    }

    fn chown(path: &Path, uid: u32) {
        std::os::unix::fs::lchown(path, Some(uid), None).expect("lchown");
    }

    fn is_root() -> bool {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn created_dirs_are_0750_and_files_0640() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("a/b");
        let w = ProfileWriter::open(&out).expect("open");
        for d in [dir.path().join("a"), out.clone()] {
            let mode = fs::metadata(&d).expect("metadata").permissions().mode();
            assert_eq!(mode & 0o777 & !0o750, 0, "{}: {mode:o}", d.display());
        }
        let p = w.write(ProfileKind::Cpu, at(0), &profile()).expect("write");
        let mode = fs::metadata(&p).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
    }

    #[test]
    fn safe_symlinks_are_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real");
        fs::create_dir(&real).expect("mkdir");
        std::os::unix::fs::symlink("real/../real", dir.path().join("link")).expect("symlink");
        let w = ProfileWriter::open(&dir.path().join("link/sub")).expect("open");
        assert_eq!(w.dir(), real.join("sub"));
        let p = w.write(ProfileKind::Cpu, at(0), &profile()).expect("write");
        assert!(p.starts_with(&real), "{}", p.display());
    }

    #[test]
    fn writable_by_others_is_refused_unless_sticky() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open = dir.path().join("open");
        fs::create_dir(&open).expect("mkdir");
        fs::set_permissions(&open, Permissions::from_mode(0o777)).expect("chmod");
        let err = ProfileWriter::open(&open.join("out")).expect_err("world-writable parent");
        let msg = err.to_string();
        assert!(matches!(err, WriteError::Unsafe { .. }), "{msg}");
        assert!(msg.contains("writable by others"), "{msg}");
        assert!(!open.join("out").exists(), "nothing is created under it");

        fs::set_permissions(&open, Permissions::from_mode(0o1777)).expect("chmod");
        ProfileWriter::open(&open.join("out")).expect("sticky parent");

        let group = dir.path().join("group");
        fs::create_dir(&group).expect("mkdir");
        fs::set_permissions(&group, Permissions::from_mode(0o770)).expect("chmod");
        let err = ProfileWriter::open(&group).expect_err("group-writable");
        assert!(err.to_string().contains("its group"), "{err}");
    }

    #[test]
    fn foreign_owners_are_refused() {
        if !is_root() {
            return; // Only root can give a file away.
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let theirs = dir.path().join("theirs");
        fs::create_dir(&theirs).expect("mkdir");
        chown(&theirs, 4242);
        let err = ProfileWriter::open(&theirs).expect_err("foreign directory");
        assert!(err.to_string().contains("owned by uid 4242"), "{err}");

        // A symlink someone else planted, even to a safe directory.
        let mine = dir.path().join("mine");
        fs::create_dir(&mine).expect("mkdir");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&mine, &link).expect("symlink");
        chown(&link, 4242);
        let err = ProfileWriter::open(&link).expect_err("foreign symlink");
        let msg = err.to_string();
        assert!(msg.contains("is a symlink owned by uid 4242"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }

    #[test]
    fn symlink_loops_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink("b", dir.path().join("a")).expect("symlink");
        std::os::unix::fs::symlink("a", dir.path().join("b")).expect("symlink");
        let err = ProfileWriter::open(&dir.path().join("a")).expect_err("loop");
        assert!(matches!(err, WriteError::CreateDir { .. }), "{err}");
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
