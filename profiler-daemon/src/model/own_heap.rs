//! The daemon's own heap: which allocator serves it, how many bytes it has
//! handed out, and giving free memory back to the kernel.
//!
//! With the `own-allocator` feature (the default) the daemon allocates
//! through mimalloc, linked in, not through the C library's malloc. A
//! heap profile puts uprobes on libc.so.6's malloc and free, and a uprobe
//! traps in every process that maps the file, the daemon's own included:
//! each of its allocations cost a trip into the kernel, and the daemon
//! allocates most when a busy node starts processes (design 020).
//!
//! The bytes in use are counted as they are allocated: one atomic add a
//! call, where glibc's `mallinfo2` walked the allocator's free lists.

#[cfg(feature = "own-allocator")]
mod counted {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Bytes handed out and not given back, as callers asked for them.
    pub(super) static IN_USE: AtomicUsize = AtomicUsize::new(0);

    /// An allocator that counts the bytes it hands out.
    pub struct Counted<A>(pub A);

    // SAFETY: every call is passed to the inner allocator unchanged; the
    // count is only a statistic.
    unsafe impl<A: GlobalAlloc> GlobalAlloc for Counted<A> {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let p = unsafe { self.0.alloc(layout) };
            if !p.is_null() {
                IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let p = unsafe { self.0.alloc_zeroed(layout) };
            if !p.is_null() {
                IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.dealloc(ptr, layout) };
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let p = unsafe { self.0.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                // Wrapping: a shrink subtracts.
                IN_USE.fetch_add(new_size.wrapping_sub(layout.size()), Ordering::Relaxed);
            }
            p
        }
    }

    #[global_allocator]
    static GLOBAL: Counted<mimalloc::MiMalloc> = Counted(mimalloc::MiMalloc);
}

/// `mi_option_purge_delay` in mimalloc 2's `mi_option_e` (mimalloc.h);
/// libmimalloc-sys names no constant for it.
#[cfg(feature = "own-allocator")]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets the allocator up, first thing in `main`: freed pages go back to
/// the kernel at once rather than 10 ms later. Measured (design 020): the
/// delay kept the daemon's peak resident memory 7 to 35 MiB above glibc's
/// malloc, and purging at once brings it within 2 to 3 MiB of it.
/// `MIMALLOC_PURGE_DELAY` in the environment, mimalloc's own setting,
/// is left to win.
pub fn configure() {
    #[cfg(feature = "own-allocator")]
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of the allocator's own options.
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
        }
    }
}

/// Bytes the daemon's allocator has handed out now and not taken back.
#[cfg(feature = "own-allocator")]
pub fn heap_in_use() -> usize {
    counted::IN_USE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Bytes the daemon's allocator has handed out now and not taken back:
/// glibc's `mallinfo2`, in use in its arenas plus its mapped chunks. Walks
/// the allocator's free lists: for one-off measurements (a file parsed),
/// not for every lookup.
#[cfg(not(feature = "own-allocator"))]
pub fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's own statistics.
    let info = unsafe { libc::mallinfo2() };
    info.uordblks.saturating_add(info.hblkhd)
}

/// Returns the allocator's free memory to the kernel. A window frees what
/// it built (stacks, symbols, the encoded profile) in many small blocks
/// that the allocator would otherwise keep; without this, resident memory
/// creeps up window after window under churn.
pub fn release_free_memory() {
    #[cfg(feature = "own-allocator")]
    // SAFETY: mi_collect only walks the allocator's own free pages.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    #[cfg(not(feature = "own-allocator"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes asked for in one block: zeroed, so the allocator takes fresh
    /// pages that are never touched. The count is global and the other
    /// tests allocate and free meanwhile, in far less than the slack.
    const BLOCK: usize = 512 << 20;
    const SLACK: usize = 64 << 20;

    /// The daemon's allocations do not go through the C library's malloc
    /// (whose entry points a heap profile probes), and are counted.
    #[cfg(feature = "own-allocator")]
    #[test]
    fn allocations_bypass_the_c_librarys_malloc() {
        let libc_in_use = || {
            // SAFETY: mallinfo2 only reads the allocator's own statistics.
            let info = unsafe { libc::mallinfo2() };
            info.uordblks.saturating_add(info.hblkhd)
        };
        let (libc_before, ours_before) = (libc_in_use(), heap_in_use());
        let block = vec![0u8; BLOCK];
        let (libc_after, ours_after) = (libc_in_use(), heap_in_use());
        assert_eq!(block.len(), BLOCK);
        // Had the block gone through glibc, its heap would have grown by
        // all of it.
        assert!(
            libc_after.abs_diff(libc_before) < SLACK,
            "glibc's heap moved by {} bytes",
            libc_after.abs_diff(libc_before)
        );
        assert!(
            ours_after.saturating_sub(ours_before) >= BLOCK - SLACK,
            "counted {} bytes",
            ours_after.saturating_sub(ours_before)
        );
        drop(block);
        release_free_memory();
    }

    #[test]
    fn in_use_grows_and_shrinks_with_a_block() {
        let before = heap_in_use();
        let block = vec![0u8; BLOCK];
        let during = heap_in_use();
        assert_eq!(block.len(), BLOCK);
        drop(block);
        let after = heap_in_use();
        assert!(during >= before + BLOCK - SLACK, "{before} -> {during}");
        assert!(after + BLOCK - SLACK <= during, "{during} -> {after}");
    }
}
