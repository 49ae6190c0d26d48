//! Where the taps of each profile type are (`Tapped`): the daemon's
//! windows, or a capture's own probes' tables (own_probes.rs), and what
//! opens, feeds and ends taps of any type there, with the processes
//! there for captures only (guests).

use crate::bpf::drain::CpuWindow;
use crate::bpf::probes::Probes;
use crate::model::profile_kind::ProfileKind;
use crate::output::pprof_http::Refusal;
use crate::profiles::heap::HeapTable;
use crate::profiles::waits::Waits;

/// Where the taps of each profile type are.
pub(crate) struct Tapped<'a> {
    /// The CPU sampler's program, for captures' own events.
    pub(crate) probes: &'a mut Probes,
    pub(crate) cpu: &'a mut CpuWindow,
    pub(crate) heap: &'a mut HeapTable,
    pub(crate) waits: &'a mut Waits,
}

impl Tapped<'_> {
    /// The same tables, borrowed again.
    pub(crate) fn reborrow(&mut self) -> Tapped<'_> {
        Tapped {
            probes: self.probes,
            cpu: self.cpu,
            heap: self.heap,
            waits: self.waits,
        }
    }

    /// Opens capture `id`'s tap of type `kind` on `pids`.
    pub(crate) fn open(&mut self, kind: ProfileKind, id: u64, pids: Vec<u32>) {
        match kind {
            ProfileKind::Cpu => self.cpu.taps.open(id, pids),
            ProfileKind::Heap => self.heap.taps.open(id, pids),
            ProfileKind::Block => self.waits.block.taps.open(id, pids),
            ProfileKind::Offcpu => self.waits.offcpu.taps.open(id, pids),
            ProfileKind::Mutex => self.waits.mutex.taps.open(id, pids),
            // Refused before (`Captures::start`).
            ProfileKind::Goroutine => {}
        }
    }

    /// Makes `guests` (processes there for captures only) known to every
    /// window: their rows go to the taps that name them alone.
    pub(crate) fn set_guests(&mut self, guests: &[u32]) {
        self.cpu.taps.set_guests(guests);
        self.heap.taps.set_guests(guests);
        self.waits.block.taps.set_guests(guests);
        self.waits.offcpu.taps.set_guests(guests);
        self.waits.mutex.taps.set_guests(guests);
    }

    /// Has the probes cover `pid`, which the schedule does not profile,
    /// for a capture: in the target table as `CAPTURED`, its allocator and
    /// condition-wait files attached.
    pub(crate) fn add_guest(&mut self, pid: u32) -> Result<(), Refusal> {
        self.probes.add_captured(pid).map_err(|e| {
            Refusal::Unavailable(format!("cannot follow process {pid} for the capture: {e}"))
        })?;
        self.probes.attach_files_of(pid);
        Ok(())
    }

    /// Lets go of guest `pid`: out of the target table, its own probes
    /// and its live allocations forgotten.
    pub(crate) fn release_guest(&mut self, pid: u32) {
        self.probes.remove_captured(pid);
        let gone = self.heap.forget_process(pid);
        self.probes.forget_live(pid, &gone);
        for links in self.probes.uprobe_links() {
            links.forget_process(pid);
        }
    }

    /// Ends the taps of the captures `gone` names, of every type.
    pub(crate) fn drop_ids(&mut self, gone: &[u64]) {
        self.cpu.taps.drop_ids(gone);
        self.heap.taps.drop_ids(gone);
        self.waits.block.taps.drop_ids(gone);
        self.waits.offcpu.taps.drop_ids(gone);
        self.waits.mutex.taps.drop_ids(gone);
    }
}
