//! The target table (`TARGETS`): the processes the schedule profiles
//! (`--pid`, the command and the children the kernel follows), and those
//! there for an on-demand capture only (`target_kind`).

use std::os::fd::{AsFd, BorrowedFd};

use profiler_common::target_kind;

use super::{ProbeError, Probes};

impl Probes {
    /// Adds a process to the target set.
    pub fn add_target(&mut self, tgid: u32) -> Result<(), ProbeError> {
        self.targets
            .insert(tgid, target_kind::PROFILED, 0)
            .map_err(|source| ProbeError::Map {
                name: "TARGETS",
                source,
            })
    }

    /// Adds a process the schedule does not profile, for an on-demand
    /// capture only (`target_kind::CAPTURED`); a target stays one.
    pub fn add_captured(&mut self, tgid: u32) -> Result<(), ProbeError> {
        if self.targets.get(&tgid, 0).is_ok() {
            return Ok(());
        }
        self.targets
            .insert(tgid, target_kind::CAPTURED, 0)
            .map_err(|source| ProbeError::Map {
                name: "TARGETS",
                source,
            })
    }

    /// Removes a process added for a capture (not a target).
    pub fn remove_captured(&mut self, tgid: u32) {
        if self.targets.get(&tgid, 0).ok() == Some(target_kind::CAPTURED) {
            let _ = self.targets.remove(&tgid);
        }
    }

    /// The processes in the target set: the `--pid`s, or the command and
    /// the children it forked (not those there for a capture).
    pub fn target_pids(&self) -> Vec<u32> {
        self.targets
            .iter()
            .filter_map(Result::ok)
            .filter(|&(_, kind)| kind == target_kind::PROFILED)
            .map(|(pid, _)| pid)
            .collect()
    }

    /// The target map's descriptor, for a forked child to add itself before
    /// it execs (see `session::start_command`).
    pub fn targets_fd(&self) -> BorrowedFd<'_> {
        self.targets_fd.as_fd()
    }

    /// Removes a process from the target set (it exited).
    pub fn remove_target(&mut self, tgid: u32) {
        let _ = self.targets.remove(&tgid);
    }
}
