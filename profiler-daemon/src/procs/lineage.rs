//! Images the daemon could not read while they lived: a forked child that
//! is gone before its snapshot takes its parent's (it maps what its parent
//! maps until it execs), and an image gone within milliseconds is placed
//! from its anchors (the build IDs and offsets of its first frames) onto
//! files other processes map (design 007).

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use profiler_common::{ANCHOR_FRAMES, BUILD_ID_VALID, ImageAnchors};

use super::objects::*;
use super::process::*;
use crate::model::frames::Mapping;

impl ProcessTable {
    /// Records that `parent` forked the process `child`. Until the child
    /// execs, it maps what its parent maps: if it is gone before its own
    /// snapshot, the parent's stands in for it (see
    /// [`ProcessTable::snapshot_new`]).
    pub fn note_fork(&mut self, child: u32, parent: u32) {
        let now = Instant::now();
        while self.fork_order.len() >= self.max_processes {
            let Some((old, at)) = self.fork_order.pop_front() else {
                break;
            };
            if self.forks.get(&old).is_some_and(|&(_, t)| t == at) {
                self.forks.remove(&old);
                self.stats.fork_evictions += 1;
            }
        }
        self.forks.insert(child, (parent, now));
        self.fork_order.push_back((child, now));
    }

    /// The process exec'd (or exited): its parent's mappings no longer
    /// stand for it. A snapshot taken from the parent is dropped too.
    pub fn forget_fork(&mut self, tgid: u32) {
        self.forks.remove(&tgid);
        if self
            .procs
            .get(&tgid)
            .is_some_and(|info| info.origin == Origin::Parent)
        {
            self.procs.remove(&tgid);
        }
    }

    /// For a child gone before its snapshot, of which the kernel named
    /// `parent` as the process that forked it: a copy of its parent's
    /// snapshot, marked exited, if the fork is recorded, recent, and not
    /// followed by an exec.
    pub(super) fn inherit_from_parent(&mut self, tgid: u32, parent: u32) -> bool {
        let Some(&(recorded, at)) = self.forks.get(&tgid) else {
            return false;
        };
        if recorded != parent || at.elapsed() > FORK_RECORD_TTL || self.procs.contains_key(&tgid) {
            return false;
        }
        let Some(from) = self.procs.get(&parent) else {
            return false;
        };
        let tick = self.bump();
        let info = ProcessInfo {
            tgid,
            comm: from.comm.clone(),
            mappings: from.mappings.clone(),
            labels: from.labels.clone(),
            exited: Some(tick),
            last_used: Cell::new(tick),
            snapshot_at: from.snapshot_at,
            origin: Origin::Parent,
        };
        self.admit(info);
        self.stats.inherited += 1;
        true
    }

    /// Places the files named by an image's anchors (see
    /// [`profiler_common::ImageAnchors`]) when that image is gone before its
    /// own mappings could be read: each anchored frame's address less its
    /// file offset is where its file lies, and a file known by build ID
    /// from another process's snapshot is read for its symbols. Only the
    /// current image of the pid is placed, and only if nothing better is
    /// known of it; anchors of a live process take a snapshot instead.
    pub fn anchor_image(&mut self, anchors: &ImageAnchors) {
        let tgid = anchors.tgid;
        if self.generation_at(tgid, anchors.time_ns) != self.generation(tgid) {
            return;
        }
        match self.procs.get(&tgid).map(|info| info.origin) {
            Some(Origin::Anchors) => {}
            Some(_) => return,
            None => {
                if self.snapshot(tgid) || self.procs.contains_key(&tgid) {
                    return;
                }
            }
        }
        // Objects already placed by earlier anchors of this image.
        let known: Vec<u64> = self
            .procs
            .get(&tgid)
            .map(|info| {
                info.mappings
                    .iter()
                    .filter_map(|m| m.object.as_ref().map(|o| o.id()))
                    .collect()
            })
            .unwrap_or_default();
        let len = (anchors.len as usize).min(ANCHOR_FRAMES);
        let mut placed: Vec<MappedObject> = Vec::new();
        for (ip, frame) in anchors.ips[..len].iter().zip(&anchors.frames[..len]) {
            if frame.status != BUILD_ID_VALID || frame.offset > *ip {
                continue;
            }
            let Some((object, path)) = self.objects.by_build_id(&frame.build_id) else {
                self.stats.anchor_files_unknown += 1;
                continue;
            };
            if known.contains(&object.id())
                || placed
                    .iter()
                    .any(|m| m.object.as_ref().is_some_and(|o| o.id() == object.id()))
            {
                continue;
            }
            // Where the file's offset 0 lies; the mapping starts at the
            // frame's page, so that the unwinder places the object through
            // the segment that holds the frame.
            let bias = ip - frame.offset;
            let file_offset = frame.offset & !(PAGE_SIZE - 1);
            let size = std::fs::metadata(object.elf_path()).map_or(0, |m| m.len());
            if size <= file_offset {
                continue;
            }
            let mapping = Mapping {
                start: bias + file_offset,
                limit: bias.saturating_add(size),
                file_offset,
                path: path.to_owned(),
                build_id: object.build_id().map(|id| id.to_string()),
            };
            placed.push(MappedObject {
                mapping: Arc::new(mapping),
                object: Some(object),
            });
        }
        // Kept even if empty: the process is gone, and its next anchors
        // need not try to read it again.
        let tick = self.bump();
        if !self.procs.contains_key(&tgid) {
            self.admit(ProcessInfo {
                tgid,
                comm: String::new(),
                mappings: Vec::new(),
                labels: Vec::new(),
                exited: Some(tick),
                last_used: Cell::new(tick),
                snapshot_at: Instant::now(),
                origin: Origin::Anchors,
            });
        }
        if let Some(info) = self.procs.get_mut(&tgid)
            && !placed.is_empty()
        {
            if info.mappings.is_empty() {
                self.stats.anchored += 1;
            }
            info.mappings.extend(placed);
            info.mappings.sort_by_key(|m| m.mapping.start);
            // Placed from file sizes: keep them from overlapping.
            for i in 1..info.mappings.len() {
                let next = info.mappings[i].mapping.start;
                let previous = &mut info.mappings[i - 1].mapping;
                if previous.limit > next {
                    Arc::make_mut(previous).limit = next;
                }
            }
            info.snapshot_at = Instant::now();
        }
    }
}
