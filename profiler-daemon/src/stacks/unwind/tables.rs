//! Unwind tables per object: the `.eh_frame`, `.eh_frame_hdr` or
//! `.debug_frame` bytes and load segments of each mapped file, read once
//! with bounds on what a corrupt header can make us read, and kept in a
//! cache that draws on the memory budget (budget.rs), shared by build ID
//! by every process that maps the file.

use super::*;

/// A larger section is not read: a corrupt header must not make us allocate
/// gigabytes, and real unwind sections are far smaller.
pub(super) const MAX_SECTION_BYTES: u64 = 128 << 20;
/// Bound of section headers read; real files have at most a few thousand.
pub(super) const MAX_SECTION_HEADERS: usize = 1 << 16;
/// Bound of the distinct files remembered as users of one cached object.
pub(super) const MAX_USERS: usize = 64;

/// Section data handed to framehop: shared, so one read serves every
/// process that maps the object.
pub(super) type SectionData = Arc<[u8]>;

/// Why an object's unwind information could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("not an ELF file")]
    NotElf,
    #[error("unsupported ELF file: {0}")]
    Unsupported(&'static str),
    #[error("malformed ELF file: {0}")]
    Malformed(&'static str),
    #[error("no .eh_frame or .debug_frame section")]
    NoUnwindInfo,
}

impl LoadError {
    /// Whether the failure comes from the file's content, so that retrying
    /// with the same object is pointless (an I/O error may be transient).
    pub(super) fn is_permanent(&self) -> bool {
        !matches!(self, LoadError::Io { .. })
    }
}

/// One PT_LOAD segment, enough to place the object in a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LoadSegment {
    pub(super) offset: u64,
    pub(super) vaddr: u64,
    pub(super) filesz: u64,
    pub(super) executable: bool,
}

impl LoadSegment {
    /// Whether a mapping at file offset `file_offset` maps this segment.
    pub(super) fn maps_offset(&self, file_offset: u64) -> bool {
        let first = self.offset & !(PAGE_SIZE - 1);
        first <= file_offset && file_offset < self.offset.saturating_add(self.filesz.max(1))
    }
}

/// The address the object's virtual address 0 has in a process (the load
/// bias), given a mapping of it at `start` from file offset `file_offset`.
/// The mapping may begin anywhere in its segment (not at file offset 0 for
/// the text of most executables and libraries), so it is placed through the
/// segment that contains its file offset, preferring executable ones.
pub(super) fn load_bias(segments: &[LoadSegment], start: u64, file_offset: u64) -> Option<u64> {
    let segment = segments
        .iter()
        .filter(|s| s.maps_offset(file_offset))
        .max_by_key(|s| s.executable)?;
    // Within a segment, file offsets and virtual addresses move together.
    let svma = segment
        .vaddr
        .wrapping_sub(segment.offset)
        .wrapping_add(file_offset);
    Some(start.wrapping_sub(svma))
}

/// A section framehop may ask for.
#[derive(Debug)]
pub(super) struct Section {
    pub(super) name: &'static [u8],
    pub(super) svma: Range<u64>,
    /// Only the sections framehop reads are kept; the others give addresses.
    pub(super) data: Option<SectionData>,
}

/// Sections whose address ranges framehop uses (relative pointers in CFI).
pub(super) const RANGE_SECTIONS: [&[u8]; 2] = [b".text", b".got"];
/// Sections whose bytes framehop reads.
pub(super) const DATA_SECTIONS: [&[u8]; 3] = [b".eh_frame", b".eh_frame_hdr", b".debug_frame"];

/// What one object contributes to unwinding, shared by all processes.
#[derive(Debug)]
pub(super) struct ObjectUnwindInfo {
    pub(super) segments: Vec<LoadSegment>,
    /// The lowest PT_LOAD address: framehop works with addresses relative
    /// to it, which must fit 32 bits even for non-PIE executables.
    pub(super) base_svma: u64,
    pub(super) sections: Vec<Section>,
    pub(super) bytes: usize,
}

impl ObjectUnwindInfo {
    /// Reads the headers and unwind sections of the ELF file at `path`,
    /// without reading the rest of it.
    pub(super) fn load(path: &Path) -> Result<Self, LoadError> {
        let file = File::open(path).map_err(io_error("the object file"))?;
        let file_len = file
            .metadata()
            .map_err(io_error("the object's metadata"))?
            .len();
        let reader = ElfReader {
            file: &file,
            file_len,
        };
        let e = LittleEndian;
        let header_bytes = reader.read(
            0,
            size_of::<FileHeader64<LittleEndian>>() as u64,
            "the ELF header",
        )?;
        let (header, _) = object::pod::from_bytes::<FileHeader64<LittleEndian>>(&header_bytes)
            .map_err(|()| LoadError::NotElf)?;
        let ident = header.e_ident();
        if ident.magic != object::elf::ELFMAG {
            return Err(LoadError::NotElf);
        }
        if ident.class != object::elf::ELFCLASS64 || ident.data != object::elf::ELFDATA2LSB {
            return Err(LoadError::Unsupported("not 64-bit little-endian"));
        }
        if header.e_machine(e) != object::elf::EM_X86_64 {
            return Err(LoadError::Unsupported("not x86_64"));
        }

        let segments = reader.load_segments(header)?;
        let base_svma = segments
            .iter()
            .map(|s| s.vaddr)
            .min()
            .ok_or(LoadError::Malformed("no PT_LOAD segment"))?;
        let sections = reader.unwind_sections(header)?;
        if !sections
            .iter()
            .any(|s| s.data.is_some() && s.name != b".eh_frame_hdr")
        {
            return Err(LoadError::NoUnwindInfo);
        }
        let bytes = sections
            .iter()
            .filter_map(|s| s.data.as_ref())
            .map(|d| d.len())
            .sum();
        Ok(Self {
            segments,
            base_svma,
            sections,
            bytes,
        })
    }

    pub(super) fn section(&self, name: &[u8]) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// Heap bytes it holds: the section bytes, its segment and section
    /// lists, and itself behind its `Arc`.
    pub(super) fn heap_bytes(&self) -> usize {
        self.bytes
            + self.segments.capacity() * size_of::<LoadSegment>()
            + self.sections.capacity() * size_of::<Section>()
            + size_of::<ObjectUnwindInfo>()
            + 2 * size_of::<usize>()
    }
}

/// Positioned reads of an ELF file, bounds-checked against its length.
pub(super) struct ElfReader<'a> {
    pub(super) file: &'a File,
    pub(super) file_len: u64,
}

impl ElfReader<'_> {
    pub(super) fn read(
        &self,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<Vec<u8>, LoadError> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.file_len)
            .ok_or(LoadError::Malformed(
                "a header or section lies past the end of the file",
            ))?;
        let len = usize::try_from(end - offset).map_err(|_| LoadError::Malformed("size"))?;
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(io_error(what))?;
        Ok(buf)
    }

    pub(super) fn load_segments(
        &self,
        header: &FileHeader64<LittleEndian>,
    ) -> Result<Vec<LoadSegment>, LoadError> {
        let e = LittleEndian;
        let count = usize::from(header.e_phnum(e));
        if usize::from(header.e_phentsize(e)) != size_of::<ProgramHeader64<LittleEndian>>() {
            return Err(LoadError::Malformed("program header size"));
        }
        let size = (count * size_of::<ProgramHeader64<LittleEndian>>()) as u64;
        let bytes = self.read(header.e_phoff(e), size, "program headers")?;
        let (headers, _) =
            object::pod::slice_from_bytes::<ProgramHeader64<LittleEndian>>(&bytes, count)
                .map_err(|()| LoadError::Malformed("program headers"))?;
        Ok(headers
            .iter()
            .filter(|ph| ph.p_type(e) == object::elf::PT_LOAD)
            .map(|ph| LoadSegment {
                offset: ph.p_offset(e),
                vaddr: ph.p_vaddr(e),
                filesz: ph.p_filesz(e),
                executable: ph.p_flags(e) & object::elf::PF_X != 0,
            })
            .collect())
    }

    /// The sections framehop uses; `.debug_frame` only when there is no
    /// `.eh_frame` (framehop ignores it then).
    pub(super) fn unwind_sections(
        &self,
        header: &FileHeader64<LittleEndian>,
    ) -> Result<Vec<Section>, LoadError> {
        let e = LittleEndian;
        let shoff = header.e_shoff(e);
        if shoff == 0 {
            // Section headers stripped: nothing names the unwind sections.
            return Err(LoadError::NoUnwindInfo);
        }
        let entry = size_of::<SectionHeader64<LittleEndian>>();
        if usize::from(header.e_shentsize(e)) != entry {
            return Err(LoadError::Malformed("section header size"));
        }
        let first = self.read(shoff, entry as u64, "section headers")?;
        let (first, _) = object::pod::from_bytes::<SectionHeader64<LittleEndian>>(&first)
            .map_err(|()| LoadError::Malformed("section headers"))?;
        // With many sections, the count and the string table index live in
        // the first section header.
        let count = match header.e_shnum(e) {
            0 => usize::try_from(first.sh_size(e)).unwrap_or(usize::MAX),
            n => usize::from(n),
        };
        if count > MAX_SECTION_HEADERS {
            return Err(LoadError::Unsupported("too many sections"));
        }
        let strtab_index = match header.e_shstrndx(e) {
            object::elf::SHN_XINDEX => first.sh_link(e) as usize,
            n => usize::from(n),
        };
        let bytes = self.read(shoff, (count * entry) as u64, "section headers")?;
        let (headers, _) =
            object::pod::slice_from_bytes::<SectionHeader64<LittleEndian>>(&bytes, count)
                .map_err(|()| LoadError::Malformed("section headers"))?;
        let strtab = headers
            .get(strtab_index)
            .ok_or(LoadError::Malformed("section name table index"))?;
        let names = self
            .section_bytes(strtab, "section names")?
            .unwrap_or_default();
        let name_of = |sh: &SectionHeader64<LittleEndian>| -> Option<&[u8]> {
            let rest = names.get(usize::try_from(sh.sh_name(e)).ok()?..)?;
            rest.split(|&b| b == 0).next()
        };

        let mut sections = Vec::new();
        for sh in headers {
            let Some(name) = name_of(sh) else { continue };
            let Some(&wanted) = RANGE_SECTIONS
                .iter()
                .chain(&DATA_SECTIONS)
                .find(|&&w| w == name)
            else {
                continue;
            };
            if sections.iter().any(|s: &Section| s.name == wanted) {
                continue;
            }
            let data = if DATA_SECTIONS.contains(&wanted) {
                self.section_bytes(sh, "an unwind section")?.map(Arc::from)
            } else {
                None
            };
            let addr = sh.sh_addr(e);
            sections.push(Section {
                name: wanted,
                svma: addr..addr.saturating_add(sh.sh_size(e)),
                data,
            });
        }
        if sections
            .iter()
            .any(|s| s.name == b".eh_frame" && s.data.is_some())
        {
            sections.retain(|s| s.name != b".debug_frame");
        }
        Ok(sections)
    }

    /// A section's bytes; `None` when the file does not hold them (NOBITS,
    /// compressed, absurdly large).
    pub(super) fn section_bytes(
        &self,
        sh: &SectionHeader64<LittleEndian>,
        what: &'static str,
    ) -> Result<Option<Vec<u8>>, LoadError> {
        let e = LittleEndian;
        let size = sh.sh_size(e);
        if sh.sh_type(e) == object::elf::SHT_NOBITS
            || sh.sh_flags(e) & u64::from(object::elf::SHF_COMPRESSED) != 0
            || size == 0
            || size > MAX_SECTION_BYTES
        {
            return Ok(None);
        }
        self.read(sh.sh_offset(e), size, what).map(Some)
    }
}

pub(super) fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> LoadError {
    move |source| LoadError::Io { what, source }
}

/// Gives framehop one cached object's sections.
pub(super) struct Sections<'a>(pub(super) &'a ObjectUnwindInfo);

impl ModuleSectionInfo<SectionData> for Sections<'_> {
    fn base_svma(&self) -> u64 {
        self.0.base_svma
    }

    fn section_svma_range(&mut self, name: &[u8]) -> Option<Range<u64>> {
        self.0.section(name).map(|s| s.svma.clone())
    }

    fn section_data(&mut self, name: &[u8]) -> Option<SectionData> {
        self.0.section(name)?.data.clone()
    }
}

/// Objects are shared by build ID, so the same library in many processes
/// (or containers) is read once; without one, by the opened file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum ObjectKey {
    BuildId(Arc<str>),
    File(u64),
}

impl ObjectKey {
    pub(super) fn of(object: &ObjectFile) -> Self {
        match object.build_id() {
            Some(id) => ObjectKey::BuildId(Arc::clone(id)),
            None => ObjectKey::File(object.id()),
        }
    }
}

pub(super) struct ObjectEntry {
    /// `None` remembers a load that failed for good.
    pub(super) info: Option<Arc<ObjectUnwindInfo>>,
    /// The opened files this entry serves; when all are gone, no process
    /// snapshot maps the object any more.
    pub(super) users: Vec<Weak<ObjectFile>>,
}

impl ObjectEntry {
    /// Heap bytes of the entry: its unwind information (none for a
    /// failure) and the list of its users at its bound.
    pub(super) fn heap_bytes(&self) -> usize {
        self.info.as_ref().map_or(0, |i| i.heap_bytes()) + MAX_USERS * size_of::<Weak<()>>()
    }

    /// Whether a cached process unwinder holds it: dropping it from the
    /// cache would free nothing.
    pub(super) fn held(&self) -> bool {
        self.info.as_ref().is_some_and(|i| Arc::strong_count(i) > 1)
    }

    pub(super) fn add_user(&mut self, object: &Arc<ObjectFile>) {
        if self.users.iter().any(|u| u.as_ptr() == Arc::as_ptr(object)) {
            return;
        }
        if self.users.len() >= MAX_USERS {
            self.users.retain(|u| u.strong_count() > 0);
            if self.users.len() >= MAX_USERS {
                self.users.remove(0);
            }
        }
        self.users.push(Arc::downgrade(object));
    }
}

/// Per-object unwind information, counted in bytes, least recently used
/// first out; bounded in entries too.
pub(super) struct UnwindTableCache {
    pub(super) entries: Lru<ObjectKey, ObjectEntry>,
    pub(super) max_entries: usize,
    /// An object whose tables are larger is not loaded (half the
    /// budget): holding it would push out every other object.
    pub(super) max_object_bytes: usize,
}

impl UnwindTableCache {
    /// The unwind information of `object`, read on first use.
    pub(super) fn get_or_load(
        &mut self,
        object: &Arc<ObjectFile>,
        path: &str,
        stats: &mut UnwindStats,
        budget: &MemoryBudget,
    ) -> Option<Arc<ObjectUnwindInfo>> {
        let key = ObjectKey::of(object);
        if let Some(entry) = self.entries.get(&key) {
            entry.add_user(object);
            return entry.info.clone();
        }
        let info = match ObjectUnwindInfo::load(&object.elf_path()) {
            Ok(info) if info.heap_bytes() > self.max_object_bytes => {
                stats.object_load_failures += 1;
                stats.objects_too_large += 1;
                debug!(
                    path,
                    bytes = info.bytes,
                    "unwind tables larger than half the memory budget; walks stop in this object"
                );
                None
            }
            Ok(info) => {
                stats.objects_loaded += 1;
                Some(Arc::new(info))
            }
            Err(err) => {
                stats.object_load_failures += 1;
                debug!(path, %err, "no unwind information for a mapped object");
                if !err.is_permanent() {
                    // Not remembered: another process may read it later.
                    return None;
                }
                // Remembered as a failure, so it is not read again.
                None
            }
        };
        let entry = ObjectEntry {
            info: info.clone(),
            users: vec![Arc::downgrade(object)],
        };
        // At the entry bound a held object goes too, if it must: it stays
        // with its process unwinders and is read again after them.
        while self.entries.len() >= self.max_entries
            && (self.evict_one().is_some() || self.entries.pop_lru().is_some())
        {
            stats.evictions += 1;
            budget.evicted(Cache::UnwindObjects, 1, false);
        }
        let bytes = entry.heap_bytes();
        self.entries.insert(key, entry, bytes);
        info
    }

    /// Drops the least recently used entry that no cached process
    /// unwinder holds (dropping it frees its memory now); `None` if every
    /// entry is held.
    pub(super) fn evict_one(&mut self) -> Option<ObjectEntry> {
        self.entries
            .pop_lru_where(|_, entry| !entry.held())
            .map(|(_, entry)| entry)
    }

    /// Drops entries whose files no process snapshot holds any more.
    pub(super) fn release_unused(&mut self) {
        self.entries.retain(|_, entry| {
            entry.users.retain(|u| u.strong_count() > 0);
            !entry.users.is_empty()
        });
    }
}
