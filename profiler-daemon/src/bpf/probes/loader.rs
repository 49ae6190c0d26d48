//! The `EbpfLoader`, made without reading the kernel's BTF.
//!
//! aya 0.14's `EbpfLoader::new` reads and parses /sys/kernel/btf/vmlinux
//! (about 5 MB) before `btf(None)` can say it is not wanted: a third of a
//! `--profiles cpu` start's CPU. The programs take no CO-RE relocation
//! (they read kernel structures at offsets from tracefs), so the loader is
//! made on a short-lived thread whose file opens fail: a seccomp filter on
//! that thread alone (no capability needed: the thread sets its own
//! no_new_privs, and both go with it), through prctl, which the shipped
//! unit's system call filter and a container runtime's default profile
//! allow. Where the filter cannot be set, the loader is made as aya makes
//! it. Either way the caller then sets `btf(None)`, so what loads is the
//! same; only the start's cost differs.

use aya::EbpfLoader;

/// A loader holding no kernel BTF, made without reading it where this
/// thread can forbid itself file opens.
pub(super) fn loader_without_kernel_btf() -> EbpfLoader<'static> {
    match without_file_opens(EbpfLoader::new) {
        Some(loader) => loader,
        None => {
            tracing::debug!("the eBPF loader reads the kernel's BTF");
            EbpfLoader::new()
        }
    }
}

/// Runs `f` on a new thread on which opening a file fails with ENOENT;
/// `None` when such a thread cannot be had.
fn without_file_opens<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    std::thread::Builder::new()
        .name("bpf-loader".into())
        .spawn(move || forbid_file_opens().then(f))
        .ok()?
        .join()
        .ok()
        .flatten()
}

/// The audit architecture of the system calls this build makes.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// The system calls that open files by name.
#[cfg(target_arch = "x86_64")]
const OPENS: &[libc::c_long] = &[libc::SYS_openat, libc::SYS_open, libc::SYS_openat2];
#[cfg(target_arch = "aarch64")]
const OPENS: &[libc::c_long] = &[libc::SYS_openat, libc::SYS_openat2];

/// Makes the calling thread's opens fail with ENOENT, for the rest of the
/// thread's life. False if the kernel refused.
fn forbid_file_opens() -> bool {
    let statement = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    // seccomp_data: nr at offset 0, arch at offset 4.
    let mut filter = vec![
        statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4, 0, 0),
        // Another architecture's calls (none here): allow.
        statement(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            AUDIT_ARCH,
            0,
            OPENS.len() as u8 + 1,
        ),
        statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
    ];
    for (i, &nr) in OPENS.iter().enumerate() {
        // To the last statement (ENOENT) if equal, else on.
        let to_deny = (OPENS.len() - i) as u8;
        filter.push(statement(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            nr as u32,
            to_deny,
            0,
        ));
    }
    filter.push(statement(
        libc::BPF_RET | libc::BPF_K,
        libc::SECCOMP_RET_ALLOW,
        0,
        0,
    ));
    filter.push(statement(
        libc::BPF_RET | libc::BPF_K,
        libc::SECCOMP_RET_ERRNO | libc::ENOENT as u32,
        0,
        0,
    ));
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: prctl with a valid filter program that outlives the call;
    // both settings are the calling thread's own (no TSYNC).
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog,
            ) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_fail_on_the_loader_thread_only() {
        let inside = without_file_opens(|| std::fs::read("/proc/self/status").map(|_| ()));
        let Some(inside) = inside else {
            // A kernel without seccomp filters: the loader reads the BTF.
            return;
        };
        let err = inside.expect_err("an open on the loader thread failed");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        // Other calls go on there, and this thread still opens files.
        assert_eq!(
            without_file_opens(std::process::id),
            Some(std::process::id())
        );
        assert!(std::fs::read("/proc/self/status").is_ok());
        // A second thread of the same process opens files as before.
        let other = std::thread::spawn(|| std::fs::read("/proc/self/status").is_ok());
        assert!(other.join().expect("thread"));
    }
}
