//! Lets go of the pages of the files the symbolizer has mapped once it is
//! done with a file for the moment. blazesym maps each ELF file (and its
//! debug file) whole and keeps the mapping with its parsed state; every
//! page it touched stays resident in the daemon, so a window that
//! symbolizes many large binaries held all of their touched pages at once
//! (the busy node's peak: some 46 MiB of other programs' files). Dropping
//! a shared read-only file mapping's pages (`MADV_DONTNEED`) changes no
//! byte of it: a later read faults the page back in from the page cache.
//!
//! Which mappings: every shared read-only mapping of a file by the daemon
//! (blazesym maps files so, as do the daemon's own ELF readers; loaded
//! libraries are private mappings) except those it had when the
//! symbolizer was made, read from /proc/self/maps right before: only this
//! thread maps and unmaps such files, so what the read shows is what is
//! mapped at the `madvise`.

use std::collections::HashSet;

use procfs::process::{MMPermissions, MMapPath, Process};
use tracing::debug;

/// (device, inode) of a mapped file.
type FileId = (u64, u64);

/// Growth of resident memory since the last release after which
/// [`FilePages::release_if_grown`] releases: one large object's worth.
/// Releasing after every object costs a read of /proc/self/maps and an
/// `madvise` per mapped file each time (measured: 0.7% of a core more on a
/// quiet node with all five profile types, against 0.27% for the rest).
pub const RELEASE_GROWTH_BYTES: u64 = 4 << 20;

/// The daemon's own file mappings, and what was released since.
pub struct FilePages {
    own: HashSet<FileId>,
    /// Resident bytes after the last release.
    resident_after: u64,
    /// Calls of [`FilePages::release`] that read the mappings.
    pub releases: u64,
    /// Bytes of mappings given back (mapped, not necessarily resident).
    pub bytes_released: u64,
}

impl FilePages {
    /// Notes the daemon's own file mappings (left alone by `release`).
    pub fn new() -> Self {
        let own = file_mappings().into_iter().map(|(id, _, _)| id).collect();
        FilePages {
            own,
            resident_after: resident_bytes(),
            releases: 0,
            bytes_released: 0,
        }
    }

    /// [`Self::release`], when resident memory grew by
    /// [`RELEASE_GROWTH_BYTES`] since the last one.
    pub fn release_if_grown(&mut self) {
        if resident_bytes().saturating_sub(self.resident_after) >= RELEASE_GROWTH_BYTES {
            self.release();
        }
    }

    /// Drops the resident pages of every read-only private file mapping
    /// that is not the daemon's own.
    pub fn release(&mut self) {
        self.releases += 1;
        for (id, start, end) in file_mappings() {
            if self.own.contains(&id) {
                continue;
            }
            let len = (end - start) as usize;
            // SAFETY: a whole shared, read-only file mapping, which this
            // thread alone maps and unmaps; dropping its pages loses
            // nothing, as they are read back from the file.
            let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
            if rc == 0 {
                self.bytes_released += end - start;
            } else {
                debug!(
                    start,
                    end,
                    err = %std::io::Error::last_os_error(),
                    "releasing a symbol file's pages failed"
                );
            }
        }
        self.resident_after = resident_bytes();
    }
}

/// The daemon's resident memory (/proc/self/statm), 0 when unreadable.
fn resident_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// The daemon's shared read-only mappings of files, as blazesym (and the
/// daemon's other readers of ELF files) map them: (file, start, end).
/// Never a loaded library's (those are private), a ring buffer's (an
/// `anon_inode:` path, whose pages would not fault back) or a device's.
fn file_mappings() -> Vec<(FileId, u64, u64)> {
    let Ok(maps) = Process::myself().and_then(|me| me.maps()) else {
        return Vec::new();
    };
    maps.into_iter()
        .filter(|map| {
            let MMapPath::Path(path) = &map.pathname else {
                return false;
            };
            path.is_absolute()
                && !path.starts_with("/dev")
                && map.inode != 0
                && map.perms.contains(MMPermissions::SHARED)
                && map.perms.contains(MMPermissions::READ)
                && !map.perms.contains(MMPermissions::WRITE)
                && !map.perms.contains(MMPermissions::EXECUTE)
        })
        .map(|map| {
            let (major, minor) = map.dev;
            let dev = libc::makedev(major as u32, minor as u32);
            ((dev, map.inode), map.address.0, map.address.1)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Resident pages of the mapping at `addr` (smaps' Rss: the pages the
    /// process maps, not those the page cache holds).
    fn resident_pages(addr: *const u8, _len: usize) -> u64 {
        let smaps = Process::myself().unwrap().smaps().unwrap();
        let map = smaps
            .into_iter()
            .find(|m| m.address.0 == addr as u64)
            .expect("the mapping is listed");
        map.extension.map.get("Rss").copied().unwrap_or(0) / 4096
    }

    /// A file mapped after the start is let go of, and reads the same
    /// afterwards; one mapped before it is left alone.
    #[test]
    fn pages_of_files_mapped_later_are_released_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let early_path = dir.path().join("early");
        let late_path = dir.path().join("late");
        let content: Vec<u8> = (0..64 * 4096u32).map(|i| (i % 251) as u8).collect();
        for path in [&early_path, &late_path] {
            std::fs::File::create(path)
                .unwrap()
                .write_all(&content)
                .unwrap();
        }
        let early = std::fs::File::open(&early_path).unwrap();
        // SAFETY: test files, not changed while mapped.
        let early = unsafe { memmap2::Mmap::map(&early) }.unwrap();
        let mut pages = FilePages::new();
        let late = std::fs::File::open(&late_path).unwrap();
        // SAFETY: as above.
        let late = unsafe { memmap2::Mmap::map(&late) }.unwrap();
        let sum = |m: &[u8]| m.iter().map(|&b| u64::from(b)).sum::<u64>();
        let want = sum(&content);
        assert_eq!(sum(&early), want);
        assert_eq!(sum(&late), want);
        assert_eq!(resident_pages(late.as_ptr(), late.len()), 64);
        pages.release();
        assert_eq!(resident_pages(late.as_ptr(), late.len()), 0);
        assert_eq!(resident_pages(early.as_ptr(), early.len()), 64);
        assert!(pages.bytes_released >= 64 * 4096);
        assert_eq!(sum(&late), want, "the released file reads the same");
    }
}
