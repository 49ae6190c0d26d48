//! A task-local storage map (BPF_MAP_TYPE_TASK_STORAGE), which aya-ebpf
//! does not wrap: a value per thread, found through the task itself
//! rather than by hashing a key, and freed by the kernel when the thread
//! exits. Defined as a BTF map (`.maps` section): the kernel needs the key
//! and value types of a local-storage map.

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, bpf_map_type, task_struct},
    helpers::generated::{bpf_get_current_task_btf, bpf_task_storage_get},
};

/// The map definition the loader reads from BTF: each field's type
/// carries one attribute (the array length encodes the number).
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are never dereferenced; the kernel owns the values,
// and each thread's value is only touched from that thread's programs.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        Self {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The current thread's value, created (zeroed) if `create` and it has
    /// none; `None` if it has none or it could not be allocated.
    #[inline(always)]
    pub fn current(&self, create: bool) -> Option<*mut T> {
        let flags = if create {
            u64::from(BPF_LOCAL_STORAGE_GET_F_CREATE)
        } else {
            0
        };
        // SAFETY: the task pointer is the current task's (a trusted BTF
        // pointer); the map pointer is this definition, relocated by the
        // loader.
        let value = unsafe {
            bpf_task_storage_get(
                core::ptr::from_ref(self).cast_mut().cast(),
                bpf_get_current_task_btf().cast::<task_struct>(),
                core::ptr::null_mut(),
                flags,
            )
        };
        (!value.is_null()).then_some(value.cast())
    }
}
