//! Reading what the kernel holds: the CPU samples' double buffers (flip,
//! then drain the one no longer written) and the Go label sets recorded
//! meanwhile, the kernel's counters, and each program's run-time
//! statistics.

use std::os::fd::AsFd;
use std::time::Duration;

use profiler_common::{GoLabels, SampleKey, Stack, StackHash, control, counter};

use super::{Drained, ProbeError, Probes};
use crate::bpf::map_syscalls;

impl Probes {
    /// Makes the kernel write the other buffer; returns the one to drain.
    /// The caller waits a moment before draining so that a program that
    /// read the old index just before the flip has finished its update.
    pub fn flip(&mut self) -> Result<usize, ProbeError> {
        let old = self.active;
        let new = 1 - old;
        self.control
            .set(control::ACTIVE_BUFFER, new, 0)
            .map_err(|source| ProbeError::Map {
                name: "CONTROL",
                source,
            })?;
        self.active = new;
        Ok(old as usize)
    }

    /// Reads and clears one buffer that the kernel no longer writes, with
    /// one batch system call per few thousand entries rather than three per
    /// entry.
    pub fn drain(&mut self, buffer: usize) -> Result<Drained, ProbeError> {
        let names = [("COUNTS_0", "STACKS_0"), ("COUNTS_1", "STACKS_1")][buffer];
        let cpus = self.possible_cpus;
        let mut out = Drained::default();
        let counts = map_syscalls::lookup_and_delete_all::<SampleKey, u64>(
            self.counts[buffer].fd().as_fd(),
            cpus,
        )
        .map_err(|source| ProbeError::Drain {
            name: names.0,
            source,
        })?;
        out.counts = counts
            .into_iter()
            .map(|(key, per_cpu)| (key, per_cpu.iter().sum()))
            .filter(|&(_, total)| total > 0)
            .collect();
        let stacks = map_syscalls::lookup_and_delete_all::<StackHash, Stack>(
            self.stacks[buffer].fd().as_fd(),
            1,
        )
        .map_err(|source| ProbeError::Drain {
            name: names.1,
            source,
        })?;
        out.stacks = stacks
            .into_iter()
            .filter_map(|(hash, stack)| {
                let stack = stack.first()?;
                let len = (stack.len as usize).min(stack.ips.len());
                Some((hash, stack.ips[..len].to_vec()))
            })
            .collect();
        // Written while taken: a set recorded meanwhile is either taken
        // now or stays for the next drain.
        let sets = map_syscalls::lookup_and_delete_all::<u64, GoLabels>(
            self.go_label_sets.fd().as_fd(),
            1,
        )
        .map_err(|source| ProbeError::Drain {
            name: "GO_LABEL_SETS",
            source,
        })?;
        out.go_label_sets = sets
            .into_iter()
            .filter_map(|(id, mut set)| Some((id, set.pop()?)))
            .collect();
        Ok(out)
    }

    /// Kernel-side counters, summed over CPUs, indexed by `counter::*`.
    pub fn counters(&self) -> [u64; counter::COUNT as usize] {
        let mut out = [0u64; counter::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            if let Ok(values) = self.counters.get(&(i as u32), 0) {
                *slot = values.iter().sum();
            }
        }
        out
    }

    /// Run count and run time of each program (kernel BPF stats; zero
    /// unless kernel.bpf_stats_enabled is set).
    pub fn run_stats(&self) -> Vec<(String, u64, Duration)> {
        let mut stats: Vec<(String, u64, Duration)> = self
            .ebpf
            .programs()
            .filter_map(|(name, program)| {
                // The heap probe is loaded by `uprobes`, not by aya.
                let info = program.info().ok()?;
                Some((name.to_string(), info.run_count(), info.run_time()))
            })
            .collect();
        for (name, links) in [
            ("heap_probe", &self.allocators),
            ("go_heap_probe", &self.go_heap),
            ("go_park_probe", &self.go_parks),
            ("cond_wait_probe", &self.cond_parks),
        ] {
            if let Some((runs, time)) = links.as_ref().and_then(|a| a.program()?.run_stats()) {
                stats.push((name.to_string(), runs, time));
            }
        }
        stats
    }
}
