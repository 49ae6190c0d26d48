//! Process events from the kernel (new, fork, exec, exit, image anchors)
//! applied to the process table, the probes and the heap's live table.

use profiler_common::{ImageAnchors, ProcEvent, proc_event};

use crate::bpf::probes::Probes;
use crate::bpf::ring::Ring;
use crate::bpf::uprobes::ExecMappings;
use crate::config::UnwindMode;
use crate::procs::go_heap_rate::CHECK_DELAY;
use crate::procs::go_runtime::GoExecutables;
use crate::procs::process::{ProcessTable, is_process, read_maps};
use crate::profiles::heap::HeapTable;
use crate::profiles::records::read_record;
use crate::session::MAX_PROCESSES;

/// Reads and applies the process events, new images under known pids (an
/// exec, or a new process reusing the pid of one that exited) last, once
/// the batch has said which of them exited already. Every record of a
/// process carries the kernel time it was taken (ring records) or the
/// start of the image it ran (aggregated CPU counts), and is given the
/// image that ran then, whenever it is read.
pub(crate) fn take_proc_events(
    ring: &mut Ring,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    heap: &mut HeapTable,
    exec_rescan: &mut Vec<u32>,
    unwind: UnwindMode,
    go_exes: &mut GoExecutables,
) {
    let mut new_images: Vec<NewImage> = Vec::new();
    let mut anchors: Vec<ImageAnchors> = Vec::new();
    while let Some(item) = ring.next() {
        let Some(event) = read_record::<ProcEvent>(&item) else {
            continue;
        };
        match event.kind {
            proc_event::ANCHORS => {
                if let Some(record) = read_record::<ImageAnchors>(&item)
                    && anchors.len() < MAX_PROCESSES
                {
                    anchors.push(record);
                }
            }
            proc_event::NEW | proc_event::EXEC => {
                procs.note_start(event.tgid, event.time_ns);
                let known = procs.peek(event.tgid);
                let replaces = match event.kind {
                    proc_event::EXEC => known.is_some(),
                    _ => known.is_some_and(|info| info.is_exited()),
                };
                if replaces {
                    if new_images.len() < MAX_PROCESSES {
                        new_images.push(NewImage {
                            event,
                            exited: false,
                        });
                    }
                    continue;
                }
                new_image(event, procs, probes, heap, exec_rescan, unwind, go_exes);
            }
            proc_event::FORK => {
                // The child maps what its parent maps now: a new image of
                // the parent waiting in this batch comes first.
                if new_images.iter().any(|i| i.event.tgid == event.parent) {
                    let images = std::mem::take(&mut new_images);
                    apply_new_images(images, procs, probes, heap, exec_rescan, unwind, go_exes);
                }
                procs.note_fork(event.tgid, event.parent);
            }
            proc_event::FORGET_FORK => procs.forget_fork(event.tgid),
            proc_event::EXIT => {
                // A new image that exited already: not to be probed or read.
                for image in new_images.iter_mut().filter(|i| i.event.tgid == event.tgid) {
                    image.exited = true;
                }
                procs.mark_exited(event.tgid);
                let gone = heap.forget_process(event.tgid);
                probes.forget_live(event.tgid, &gone);
                for links in probes.uprobe_links() {
                    links.forget_process(event.tgid);
                }
                probes.forget_process_state(event.tgid);
                if unwind == UnwindMode::Auto {
                    probes.unmark_frame_pointer_process(event.tgid);
                }
            }
            _ => {}
        }
    }
    apply_new_images(
        new_images,
        procs,
        probes,
        heap,
        exec_rescan,
        unwind,
        go_exes,
    );
    // After the images they name are known.
    for record in &anchors {
        procs.anchor_image(record);
    }
}

/// Applies new images under known pids (see [`take_proc_events`]): the
/// old image's snapshot is kept for its samples, and its live heap set is
/// forgotten, as at an exit (its address space is gone).
/// A new image under a known pid, waiting for the samples of the old one
/// to be read.
pub(crate) struct NewImage {
    pub(crate) event: ProcEvent,
    /// Its exit came in the same batch of events.
    pub(crate) exited: bool,
}

pub(crate) fn apply_new_images(
    images: Vec<NewImage>,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    heap: &mut HeapTable,
    exec_rescan: &mut Vec<u32>,
    unwind: UnwindMode,
    go_exes: &mut GoExecutables,
) {
    for NewImage { event, exited } in images {
        let gone = heap.forget_process(event.tgid);
        probes.forget_live(event.tgid, &gone);
        probes.forget_process_state(event.tgid);
        procs.retire(event.tgid, event.time_ns);
        if !exited {
            new_image(event, procs, probes, heap, exec_rescan, unwind, go_exes);
        }
    }
}

/// A process seen for the first time, or a new image under its pid.
pub(crate) fn new_image(
    event: ProcEvent,
    procs: &mut ProcessTable,
    probes: &mut Probes,
    heap: &mut HeapTable,
    exec_rescan: &mut Vec<u32>,
    unwind: UnwindMode,
    go_exes: &mut GoExecutables,
) {
    // A process gone by now (or whose id went to a thread since, which
    // shares its own process's probes) has nothing to probe; it is still
    // snapshotted, which may let its parent's snapshot stand in for it.
    if probes.uprobe_links().next().is_some()
        && (event.kind != proc_event::NEW || is_process(event.tgid))
    {
        // Read once, for every set of links and then the snapshot.
        if let Some(maps) = read_maps(event.tgid) {
            probes.attach_files(&ExecMappings::of(event.tgid, &maps));
            procs.offer_maps(event.tgid, maps);
        }
        if event.kind == proc_event::EXEC && exec_rescan.len() < MAX_PROCESSES {
            exec_rescan.push(event.tgid);
        }
    }
    if event.kind == proc_event::EXEC {
        procs.forget_fork(event.tgid);
        procs.snapshot(event.tgid);
    } else {
        // The kernel names the parent of a child that has not exec'd: its
        // snapshot may stand in for the child's, and only then.
        procs.snapshot_new(event.tgid, event.parent);
    }
    // Go keeps frame pointers and has no .eh_frame: in auto mode the
    // kernel walks its stacks. Its heap sampling rate is read once its
    // runtime has set it.
    let heaps = heap.go_rates.watching();
    if (unwind == UnwindMode::Auto || heaps)
        && let Some(go) = go_exes.get(event.tgid)
    {
        if unwind == UnwindMode::Auto {
            probes.mark_frame_pointer_process(event.tgid, go_exes.fp_process(event.tgid, go));
        }
        heap.go_rates.note(event.tgid, CHECK_DELAY);
    }
}
