//! Reading a traced process's memory: the one checked read of a value at a
//! user address that the runtime readers (`go_labels.rs`, `python.rs`)
//! share.

use aya_ebpf::helpers::bpf_probe_read_user;

/// The `T` at user address `addr`; None when it cannot be read. The first
/// page is never mapped: a zero or tiny pointer is no object.
#[inline(always)]
pub(crate) fn read<T>(addr: u64) -> Option<T> {
    if addr < 4096 {
        return None;
    }
    // SAFETY: a checked read of user memory.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}
