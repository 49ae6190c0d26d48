//! What can go wrong loading, attaching and reading the kernel probes.

use std::path::PathBuf;

use aya::BtfError;
use thiserror::Error;

use crate::bpf::map_syscalls::BatchError;
use crate::bpf::tracefs::TracefsError;
use crate::bpf::uprobes::SessionError;

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("loading the eBPF programs failed: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("eBPF program {0} is missing from the object")]
    MissingProgram(&'static str),
    #[error("eBPF map {0} is missing from the object")]
    MissingMap(&'static str),
    #[error("reading the kernel's BTF (/sys/kernel/btf/vmlinux) for the off-CPU probe: {0}")]
    KernelBtf(#[source] BtfError),
    #[error("eBPF program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("duplicating the target map's descriptor: {0}")]
    Dup(std::io::Error),
    #[error("eBPF map {0} has an unexpected type")]
    MapType(&'static str),
    #[error("eBPF ring buffer {name}: {source}")]
    Ring {
        name: &'static str,
        #[source]
        source: crate::bpf::ring::RingError,
    },
    #[error("draining eBPF map {name}: {source}")]
    Drain {
        name: &'static str,
        #[source]
        source: BatchError,
    },
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The kernel's list of CPUs (`/sys/devices/system/cpu/...`) could not
    /// be read.
    #[error("cannot list online CPUs: {path}: {source}")]
    Cpus {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    /// `sys_enter_futex`'s `op` does not follow `uaddr`, which the program
    /// reads in one go.
    #[error(
        "cannot read tracepoint format {path}: 'op' at offset {op} does not follow 'uaddr' at {uaddr}"
    )]
    FutexLayout { path: PathBuf, uaddr: u32, op: u32 },
    #[error("reading the kernel's diagnostics: {0}")]
    KernelLog(#[source] aya_log::Error),
    /// Neither the link kind wanted nor the perf uprobe PMU is there.
    #[error("user-space probes need the perf uprobe PMU on this kernel: {0}")]
    UprobePmu(#[source] std::io::Error),
}
