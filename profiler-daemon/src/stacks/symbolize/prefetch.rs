//! A window's stacks symbolized one object at a time, with the pages of
//! the files read let go of as resident memory grows (file_pages.rs,
//! docs/design/014).

use super::*;

impl Symbolizer {
    /// Notes the addresses of a user stack (as [`Self::user_walk_of`]
    /// takes it) that the cache cannot answer, for
    /// [`Self::resolve_prefetched`] to look up with the rest of a
    /// window's, one object at a time. Does nothing when file pages are
    /// not released (see [`Self::release_file_pages`]).
    pub fn prefetch_user(
        &mut self,
        procs: &mut ProcessTable,
        image: (u32, u32),
        ips: &[u64],
        leaf_words: [u64; 2],
    ) {
        if self.file_pages.is_none() {
            return;
        }
        let fixed = self.with_leaf_caller(procs, image, ips, leaf_words);
        let lookup = call_sites(fixed.as_deref().unwrap_or(ips));
        for found in locate(procs, image, &lookup).into_iter().zip(&lookup) {
            let (
                Some(MappedObject {
                    mapping,
                    object: Some(object),
                }),
                &address,
            ) = found
            else {
                continue;
            };
            let offset = address
                .wrapping_sub(mapping.start)
                .wrapping_add(mapping.file_offset);
            if self.cached(&object, offset).is_none() {
                self.prefetched
                    .entry(object.id())
                    .or_insert_with(|| (object, mapping, Vec::new()))
                    .2
                    .push(offset);
            }
        }
    }

    /// Looks up what [`Self::prefetch_user`] noted, one object at a time,
    /// letting go of the pages of the files read after any object that
    /// grew resident memory by a large object's worth (and all of them once
    /// the window is written): a window's stacks then hold about one large
    /// object's file pages at a time rather than those of every object
    /// they pass through.
    pub fn resolve_prefetched(&mut self) {
        let prefetched = std::mem::take(&mut self.prefetched);
        for (object, mapping, mut offsets) in prefetched.into_values() {
            offsets.sort_unstable();
            offsets.dedup();
            self.resolve_offsets(&object, &offsets, Some(&mapping));
            if let Some(pages) = self.file_pages.as_mut() {
                pages.release_if_grown();
            }
        }
        self.shed(false);
    }

    /// Lets go of the resident pages of the files blazesym has mapped
    /// (file_pages.rs), when that is on.
    pub fn release_file_pages(&mut self) {
        if let Some(pages) = self.file_pages.as_mut() {
            pages.release();
            self.stats.file_page_releases = pages.releases;
        }
    }

    /// Whether a window's objects are symbolized one at a time with their
    /// files' pages let go of after each (`[debug] release_file_pages`;
    /// on by default).
    pub fn set_release_file_pages(&mut self, on: bool) {
        // The symbolizer starts with it on: its own mappings are not read
        // again at start-up.
        if on != self.file_pages.is_some() {
            self.file_pages = on.then(FilePages::new);
        }
    }
}
