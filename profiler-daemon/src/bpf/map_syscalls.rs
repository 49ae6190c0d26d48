//! BPF map system calls that aya does not offer:
//! - batched reads: `BPF_MAP_LOOKUP_AND_DELETE_BATCH` empties a map with one
//!   system call per chunk of entries, where aya's per-element API takes
//!   three (next key, lookup, delete) per entry. The drain runs every
//!   second, so this is most of its cost. `BPF_MAP_LOOKUP_BATCH` reads a
//!   map the same way and leaves it as it is.
//! - an element update that allocates nothing, for use between fork and
//!   exec;
//! - what each map of this process costs the kernel (`map_memory`).

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use aya::Pod;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_map_info};
use thiserror::Error;

/// Entries asked for per system call.
const CHUNK: usize = 1024;

#[derive(Debug, Error)]
pub enum BatchError {
    #[error("BPF_MAP_LOOKUP_AND_DELETE_BATCH failed: {0}")]
    Syscall(io::Error),
    #[error("BPF_MAP_LOOKUP_BATCH failed: {0}")]
    Lookup(io::Error),
}

/// Reads every entry of a hash map of V values, leaving it as it is.
/// Entries that writers add or delete meanwhile may or may not be
/// included.
pub fn lookup_all<K: Pod, V: Pod>(map: BorrowedFd<'_>) -> Result<Vec<(K, V)>, BatchError> {
    let entries =
        batch_all::<K, V>(map, 1, bpf_cmd::BPF_MAP_LOOKUP_BATCH).map_err(|e| match e {
            BatchError::Syscall(e) | BatchError::Lookup(e) => BatchError::Lookup(e),
        })?;
    Ok(entries
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.into_iter().next()?)))
        .collect())
}

/// Reads and deletes every entry of a hash map whose values are arrays of
/// `values_per_key` elements of V (1 for a plain hash map, the number of
/// possible CPUs for a per-CPU one). Entries that writers add meanwhile may
/// or may not be included; callers drain maps that nobody writes.
pub fn lookup_and_delete_all<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    values_per_key: usize,
) -> Result<Vec<(K, Vec<V>)>, BatchError> {
    batch_all(
        map,
        values_per_key,
        bpf_cmd::BPF_MAP_LOOKUP_AND_DELETE_BATCH,
    )
}

/// Every entry of the map, by batches of `command`.
fn batch_all<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    values_per_key: usize,
    command: bpf_cmd,
) -> Result<Vec<(K, Vec<V>)>, BatchError> {
    // The kernel lays per-CPU values out in 8-byte slots.
    let value_stride = size_of::<V>().next_multiple_of(8) * values_per_key;
    let mut chunk = CHUNK;
    let mut out = Vec::new();
    let mut token: u64 = 0;
    let mut first = true;
    loop {
        // Not zeroed: the kernel writes the entries it returns, and only
        // those are read. A chunk of stacks is over a MiB, which zeroing
        // would touch whole at every drain.
        let mut keys: Vec<u8> = Vec::with_capacity(chunk * size_of::<K>());
        let mut values: Vec<u8> = Vec::with_capacity(chunk * value_stride);
        let mut out_token: u64 = 0;
        // SAFETY: bpf_attr is plain data; all-zero is its documented default.
        let mut attr: bpf_attr = unsafe { zeroed() };
        // Writing a union field is safe; the kernel reads `batch` for this command.
        attr.batch.in_batch = if first {
            0
        } else {
            &token as *const u64 as u64
        };
        attr.batch.out_batch = &mut out_token as *mut u64 as u64;
        attr.batch.keys = keys.as_mut_ptr() as u64;
        attr.batch.values = values.as_mut_ptr() as u64;
        attr.batch.count = chunk as u32;
        attr.batch.map_fd = map.as_raw_fd() as u32;
        // SAFETY: the attr and every buffer it points to outlive the call and
        // are as large as `count` entries need.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                command as libc::c_long,
                &mut attr as *mut bpf_attr,
                size_of::<bpf_attr>() as libc::c_uint,
            )
        };
        let err = (ret < 0).then(io::Error::last_os_error);
        // SAFETY: the kernel wrote back how many entries it returned.
        let n = (unsafe { attr.batch.count } as usize).min(chunk);
        // SAFETY: the kernel wrote n keys and n value strides at the start
        // of the buffers, whose capacities hold `chunk` of each.
        unsafe {
            keys.set_len(n * size_of::<K>());
            values.set_len(n * value_stride);
        }
        for i in 0..n {
            // SAFETY: the kernel filled n keys and n value strides; Pod
            // types accept any bytes, and read_unaligned copes with
            // alignment.
            let key: K =
                unsafe { std::ptr::read_unaligned(keys.as_ptr().add(i * size_of::<K>()).cast()) };
            let base = i * value_stride;
            let vals = (0..values_per_key)
                .map(|c| {
                    let at = base + c * size_of::<V>().next_multiple_of(8);
                    // SAFETY: as above.
                    unsafe { std::ptr::read_unaligned(values.as_ptr().add(at).cast()) }
                })
                .collect();
            out.push((key, vals));
        }
        match err {
            None => {}
            // ENOENT: the map has been walked to its end.
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            // ENOSPC: one hash bucket holds more entries than the chunk.
            Some(e) if e.raw_os_error() == Some(libc::ENOSPC) && n == 0 && chunk < 1 << 20 => {
                chunk *= 2;
                continue;
            }
            Some(e) => return Err(BatchError::Syscall(e)),
        }
        token = out_token;
        first = false;
    }
}

/// Sets `key` to `value` in the map behind `map_fd` (`BPF_MAP_UPDATE_ELEM`,
/// BPF_ANY). Allocates nothing and calls only `syscall`, so it may run in a
/// forked child before exec.
pub fn update_elem_raw<K, V>(map_fd: RawFd, key: &K, value: &V) -> io::Result<()> {
    // SAFETY: bpf_attr is plain data; all-zero is its documented default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    attr.__bindgen_anon_2.map_fd = map_fd as u32;
    attr.__bindgen_anon_2.key = key as *const K as u64;
    attr.__bindgen_anon_2.__bindgen_anon_1.value = value as *const V as u64;
    // SAFETY: attr points at a key and value of the map's sizes (the caller
    // passes the map's key and value types), both alive during the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_MAP_UPDATE_ELEM as libc::c_long,
            &mut attr as *mut bpf_attr,
            size_of::<bpf_attr>() as libc::c_uint,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The memory the kernel charges for each BPF map this process holds, by
/// map name: the `memlock` of its descriptors in /proc/self/fdinfo, each
/// map (by `map_id`) once, as a map may have several descriptors. Ring
/// buffers count their data pages; hash maps allocated on use count what
/// they hold. Maps of the same name (none today) add up.
pub fn map_memory() -> Vec<(String, u64)> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fdinfo") else {
        return Vec::new();
    };
    let mut seen = std::collections::HashSet::new();
    let mut by_name: std::collections::BTreeMap<String, u64> = Default::default();
    for entry in fds.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let (Some(id), Some(bytes)) = (field("map_id:"), field("memlock:")) else {
            continue;
        };
        if !seen.insert(id) {
            continue;
        }
        let name = entry
            .file_name()
            .to_str()
            .and_then(|fd| fd.parse::<RawFd>().ok())
            .and_then(map_name)
            .unwrap_or_else(|| format!("id {id}"));
        *by_name.entry(name).or_default() += bytes;
    }
    by_name.into_iter().collect()
}

/// A map's name (`BPF_OBJ_GET_INFO_BY_FD`), as the kernel keeps it (at
/// most 15 bytes).
fn map_name(fd: RawFd) -> Option<String> {
    // SAFETY: plain data; all-zero is valid.
    let mut info: bpf_map_info = unsafe { zeroed() };
    // SAFETY: as above.
    let mut attr: bpf_attr = unsafe { zeroed() };
    attr.info.bpf_fd = fd as u32;
    attr.info.info_len = size_of::<bpf_map_info>() as u32;
    attr.info.info = &mut info as *mut bpf_map_info as u64;
    // SAFETY: `attr` and `info` outlive the call; a descriptor that is not
    // a map (or has closed meanwhile) only makes the call fail.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &mut attr as *mut bpf_attr,
            size_of::<bpf_attr>() as libc::c_uint,
        )
    };
    if ret < 0 {
        return None;
    }
    let bytes: Vec<u8> = info
        .name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}
