//! A process's memory as the daemon reads it: through `/proc/PID/mem`
//! and, many pieces at once, `process_vm_readv`.

use std::os::unix::fs::FileExt;

/// A process's memory, read through `/proc/PID/mem` and, many pieces at
/// once, `process_vm_readv`.
pub(crate) struct Memory {
    pid: libc::pid_t,
    file: std::fs::File,
}

/// Pieces per `process_vm_readv` (the kernel's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

impl Memory {
    pub(crate) fn open(tgid: u32) -> Option<Memory> {
        Some(Memory {
            pid: libc::pid_t::try_from(tgid).ok()?,
            file: std::fs::File::open(format!("/proc/{tgid}/mem")).ok()?,
        })
    }

    /// Reads every (address, length) of `ranges` into `out`, one after the
    /// other; returns, per range, whether it was read (a range that was not
    /// is left zero). The kernel stops a call at the first range it cannot
    /// read: the rest are asked again.
    pub(crate) fn read_many(&self, ranges: &[(u64, usize)], out: &mut Vec<u8>) -> Vec<bool> {
        let total = ranges.iter().map(|r| r.1).sum();
        out.clear();
        out.resize(total, 0);
        let mut ok = vec![false; ranges.len()];
        let mut starts = Vec::with_capacity(ranges.len());
        let mut at = 0;
        for r in ranges {
            starts.push(at);
            at += r.1;
        }
        let mut next = 0;
        while next < ranges.len() {
            let end = (next + IOV_MAX).min(ranges.len());
            let mut local = Vec::with_capacity(end - next);
            let mut remote = Vec::with_capacity(end - next);
            for i in next..end {
                let (address, len) = ranges[i];
                local.push(libc::iovec {
                    // SAFETY: within `out`, which is `total` long.
                    iov_base: unsafe { out.as_mut_ptr().add(starts[i]) }.cast(),
                    iov_len: len,
                });
                remote.push(libc::iovec {
                    iov_base: address as *mut libc::c_void,
                    iov_len: len,
                });
            }
            // SAFETY: every local piece is writable memory of `out`; the
            // kernel checks the remote ones.
            let got = unsafe {
                libc::process_vm_readv(
                    self.pid,
                    local.as_ptr(),
                    local.len() as libc::c_ulong,
                    remote.as_ptr(),
                    remote.len() as libc::c_ulong,
                    0,
                )
            };
            let mut got = usize::try_from(got).unwrap_or(0);
            let mut i = next;
            // Whole ranges first: the call stops at a range boundary.
            while i < end && ranges[i].1 <= got {
                got -= ranges[i].1;
                ok[i] = ranges[i].0 >= 4096;
                i += 1;
            }
            // Range i failed (or was cut): skip it.
            next = i + 1;
        }
        ok
    }

    pub(crate) fn read(&self, at: u64, buf: &mut [u8]) -> bool {
        // The first page is never mapped: a null or tiny pointer is none.
        at >= 4096 && self.file.read_exact_at(buf, at).is_ok()
    }

    pub(crate) fn u64(&self, at: u64) -> Option<u64> {
        let mut word = [0u8; 8];
        self.read(at, &mut word).then(|| u64::from_le_bytes(word))
    }

    /// Two adjacent words.
    pub(crate) fn pair(&self, at: u64) -> Option<(u64, u64)> {
        let mut words = [0u8; 16];
        if !self.read(at, &mut words) {
            return None;
        }
        Some((u64_at(&words, 0)?, u64_at(&words, 8)?))
    }
}

fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
}
