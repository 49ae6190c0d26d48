//! Go stacks the kernel walked by frame pointers: the caller a walk from
//! inside a leaf without its frame pointer left out, put back from the
//! words the kernel read at the stack pointer and the leaf's SP delta in
//! the binary's pclntab (docs/design/016).

use super::*;

impl Symbolizer {
    /// As [`Self::user_stack_of`], for a stack the kernel walked by frame
    /// pointers, with the words it read at the stack pointer
    /// (`SampleKey::leaf_words`). A Go leaf sampled before its frame
    /// pointer was set up (a function without a frame, or one in its
    /// prologue or epilogue) leaves its caller out of the walk: the
    /// pclntab's SP delta at the leaf says which word is its return
    /// address (`[sp]` at 0, `[sp+8]` after the frame pointer's push), and
    /// that caller is put back unless the walk has it already.
    pub fn user_walk_of(
        &mut self,
        procs: &mut ProcessTable,
        image: (u32, u32),
        ips: &[u64],
        leaf_words: [u64; 2],
        at: Option<u64>,
    ) -> Vec<Frame> {
        match self.with_leaf_caller(procs, image, ips, leaf_words) {
            Some(fixed) => {
                self.stats.go_leaf_callers += 1;
                self.user_stack_of(procs, image, &fixed, at)
            }
            None => self.user_stack_of(procs, image, ips, at),
        }
    }

    /// `ips` with the leaf's caller put back, if the walk left it out.
    pub(super) fn with_leaf_caller(
        &mut self,
        procs: &mut ProcessTable,
        image: (u32, u32),
        ips: &[u64],
        leaf_words: [u64; 2],
    ) -> Option<Vec<u64>> {
        let caller = self.leaf_caller(procs, image, ips, leaf_words)?;
        let mut fixed = Vec::with_capacity(ips.len() + 1);
        fixed.push(ips[0]);
        fixed.push(caller);
        fixed.extend_from_slice(&ips[1..]);
        Some(fixed)
    }

    /// The return address of the leaf of `ips` that the walk left out, if
    /// it left one out (see [`Self::user_walk_of`]).
    fn leaf_caller(
        &mut self,
        procs: &mut ProcessTable,
        image: (u32, u32),
        ips: &[u64],
        leaf_words: [u64; 2],
    ) -> Option<u64> {
        if leaf_words == [0; 2] {
            return None;
        }
        let &leaf = ips.first()?;
        let delta = self.go_sp_delta(procs, image, leaf)?;
        missing_leaf_caller(ips, leaf_words, delta)
    }

    /// The pclntab's SP delta at `pc` of a process image (None outside Go
    /// code), cached per (object, offset).
    fn go_sp_delta(&mut self, procs: &mut ProcessTable, image: (u32, u32), pc: u64) -> Option<u64> {
        let MappedObject { mapping, object } = locate(procs, image, &[pc]).pop()??;
        let object = object?;
        let offset = pc
            .wrapping_sub(mapping.start)
            .wrapping_add(mapping.file_offset);
        let key = (ObjKey::of(&object), offset);
        if let Some(delta) = self.sp_deltas.get(&key) {
            return *delta;
        }
        let path = object.elf_path();
        let delta = layout_of(&mut self.layouts, &key.0, &object, &path).and_then(|layout| {
            let section = layout.go_pclntab()?;
            let addr = layout.addr_of_offset(offset)?;
            go_pclntab::sp_delta_in_file(&path, section, addr)
        });
        self.sp_deltas.insert(key, delta, 0);
        self.shed(false);
        delta
    }
}

/// The return address of a frame-pointer walk's leaf that the walk left
/// out, from the words at the stack pointer and the leaf's SP delta: with
/// nothing pushed yet the return address is at `[sp]`, after the frame
/// pointer's push at `[sp+8]`; with a frame set up the walk has the caller.
/// None when the word was not a code address (0) or the walk has it.
fn missing_leaf_caller(ips: &[u64], leaf_words: [u64; 2], sp_delta: u64) -> Option<u64> {
    let word = match sp_delta {
        0 => leaf_words[0],
        8 => leaf_words[1],
        _ => return None,
    };
    (word != 0 && ips.get(1) != Some(&word)).then_some(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leaf's caller comes back from the word its SP delta names, and
    /// only when the walk lacks it.
    #[test]
    fn a_leaf_without_its_frame_gets_its_caller_back() {
        // leaf, then the caller's caller (the walk skipped the caller).
        let walk = [0x1010, 0x3030];
        assert_eq!(missing_leaf_caller(&walk, [0x2020, 0], 0), Some(0x2020));
        assert_eq!(
            missing_leaf_caller(&walk, [0x9999, 0x2020], 8),
            Some(0x2020)
        );
        // A frame set up: the walk is right, whatever the words.
        assert_eq!(missing_leaf_caller(&walk, [0x2020, 0x2020], 0x28), None);
        // At delta 8 with the frame pointer already moved, the walk has
        // the caller the word names.
        assert_eq!(missing_leaf_caller(&[0x1010, 0x2020], [0, 0x2020], 8), None);
        // No code address at the word.
        assert_eq!(missing_leaf_caller(&walk, [0, 0x2020], 0), None);
        assert_eq!(missing_leaf_caller(&[0x1010], [0x2020, 0], 0), Some(0x2020));
    }
}
