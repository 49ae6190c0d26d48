//! The files that processes map, opened once and shared: each ELF file
//! (or the vDSO image) with its build ID and a handle that stays readable
//! after the process exits or the file is deleted, held by (device, inode)
//! and by build ID (`OpenFiles`) under a budget of open handles.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use procfs::process::{LimitValue, MMapPath, Process};
use tracing::debug;

use super::process::*;
use crate::model::frames::Mapping;

/// Object identities are unique for the daemon's lifetime, so a cache keyed
/// by them can never confuse a file with a later one that reuses its inode.
pub(crate) static NEXT_OBJECT_ID: AtomicU64 = AtomicU64::new(1);

/// Decrements the open-handle count when an object's handle is closed.
#[derive(Debug)]
pub(crate) struct HandleGuard(pub(crate) Arc<AtomicUsize>);

impl Drop for HandleGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
pub(crate) enum ObjectSource {
    /// An open handle: readable after the process exits or the file is deleted.
    Handle(File),
    /// A path through the live process's root; readable only while it lives.
    LivePath(PathBuf),
}

/// A mapped ELF file (or the vDSO image) that can be read for symbols.
#[derive(Debug)]
pub struct ObjectFile {
    pub(crate) id: u64,
    pub(crate) build_id: Option<Arc<str>>,
    pub(crate) source: ObjectSource,
    pub(crate) _guard: Option<HandleGuard>,
}

impl ObjectFile {
    pub(crate) fn new(source: ObjectSource, guard: Option<HandleGuard>) -> Self {
        let mut object = Self {
            id: NEXT_OBJECT_ID.fetch_add(1, Ordering::Relaxed),
            build_id: None,
            source,
            _guard: guard,
        };
        object.build_id = object.read_build_id().map(Arc::from);
        object
    }

    /// Identity unique to this opened file for the daemon's lifetime.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Hex GNU build ID, if the file has one.
    pub fn build_id(&self) -> Option<&Arc<str>> {
        self.build_id.as_ref()
    }

    /// Whether the file stays readable after its process exits.
    #[cfg(test)]
    pub fn has_handle(&self) -> bool {
        matches!(self.source, ObjectSource::Handle(_))
    }

    /// A path that opens this file now: `/proc/self/fd/N` for a held handle
    /// (works for deleted files too), else the live process's root path.
    pub fn elf_path(&self) -> PathBuf {
        match &self.source {
            ObjectSource::Handle(file) => {
                PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
            }
            ObjectSource::LivePath(path) => path.clone(),
        }
    }

    pub(crate) fn read_build_id(&self) -> Option<String> {
        let path = self.elf_path();
        match blazesym::helper::read_elf_build_id(&path) {
            Ok(Some(bytes)) => Some(hex(&bytes)),
            Ok(None) => None,
            Err(err) => {
                debug!(path = %crate::model::text::escape_controls(&path.to_string_lossy()), %err, "no build ID");
                None
            }
        }
    }
}

/// Lower-case hex, as build IDs are written.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// One executable mapping of a process and the file behind it, if any.
#[derive(Clone, Debug)]
pub struct MappedObject {
    pub mapping: Arc<Mapping>,
    /// `None` for anonymous (JIT) code or a file that could not be opened.
    pub object: Option<Arc<ObjectFile>>,
}

impl MappedObject {
    /// File offset of `addr`, which must lie in the mapping.
    #[cfg(test)]
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr.wrapping_sub(self.mapping.start)
            .wrapping_add(self.mapping.file_offset)
    }
}

/// File handles shared by (device, inode). It holds weak references, so a
/// file stays open exactly as long as some process snapshot maps it.
#[derive(Debug)]
pub(crate) struct OpenFiles {
    pub(crate) by_inode: HashMap<(u64, u64), Weak<ObjectFile>>,
    /// The same files by build ID, with the path a process mapped them
    /// under: image anchors name files this way.
    pub(crate) by_build_id: HashMap<Arc<str>, (Weak<ObjectFile>, String)>,
    pub(crate) open_handles: Arc<AtomicUsize>,
    pub(crate) max_handles: usize,
    pub(crate) sweep_at: usize,
}

impl OpenFiles {
    pub(crate) fn get(&self, key: (u64, u64)) -> Option<Arc<ObjectFile>> {
        self.by_inode.get(&key)?.upgrade()
    }

    pub(crate) fn insert(&mut self, key: (u64, u64), object: &Arc<ObjectFile>) {
        if self.by_inode.len() >= self.sweep_at {
            self.sweep();
        }
        self.by_inode.insert(key, Arc::downgrade(object));
    }

    /// Notes that `object`, which has a build ID, is mapped as `path`.
    pub(crate) fn note_build_id(&mut self, object: &Arc<ObjectFile>, path: &str) {
        let Some(id) = object.build_id() else {
            return;
        };
        if self
            .by_build_id
            .get(id)
            .is_some_and(|(known, _)| known.strong_count() > 0)
        {
            return;
        }
        if self.by_build_id.len() >= self.sweep_at {
            self.sweep();
        }
        self.by_build_id
            .insert(Arc::clone(id), (Arc::downgrade(object), path.to_owned()));
    }

    /// A held file with this build ID (the kernel's zero-padded bytes; GNU
    /// build IDs are 20, 16 or 8 bytes long), and the path it was mapped as.
    pub(crate) fn by_build_id(&self, padded: &[u8; 20]) -> Option<(Arc<ObjectFile>, &str)> {
        [20, 16, 8].into_iter().find_map(|len| {
            let (known, path) = self.by_build_id.get(hex(&padded[..len]).as_str())?;
            Some((known.upgrade()?, path.as_str()))
        })
    }

    pub(crate) fn sweep(&mut self) {
        self.by_inode.retain(|_, object| object.strong_count() > 0);
        self.by_build_id
            .retain(|_, (object, _)| object.strong_count() > 0);
        self.sweep_at = (self.by_inode.len().max(self.by_build_id.len()) * 2).max(1024);
    }

    /// Takes one unit of the handle budget, if any is left.
    pub(crate) fn reserve(&self) -> Option<HandleGuard> {
        let open = self.open_handles.fetch_add(1, Ordering::Relaxed);
        let guard = HandleGuard(Arc::clone(&self.open_handles));
        (open < self.max_handles).then_some(guard)
    }
}

#[derive(Debug)]
pub(crate) enum Vdso {
    Unknown,
    Unavailable,
    Ready {
        object: Arc<ObjectFile>,
        header: Vec<u8>,
        len: u64,
    },
}

pub(crate) fn default_handle_limit() -> usize {
    let soft = Process::myself()
        .and_then(|me| me.limits())
        .map(|limits| limits.max_open_files.soft_limit);
    match soft {
        Ok(LimitValue::Value(n)) => usize::try_from(n / 3).unwrap_or(usize::MAX).max(16),
        Ok(LimitValue::Unlimited) => 1 << 20,
        Err(_) => 256,
    }
}

/// Copies the daemon's vDSO into a memfd so blazesym can read it as a file.
pub(crate) fn load_own_vdso() -> Result<Vdso, ProcessError> {
    let pid = std::process::id();
    let me = Process::myself().map_err(|source| ProcessError::Proc { pid, source })?;
    let maps = me
        .maps()
        .map_err(|source| ProcessError::Proc { pid, source })?;
    let Some((start, limit)) = maps
        .iter()
        .find(|m| matches!(m.pathname, MMapPath::Vdso))
        .map(|m| m.address)
    else {
        return Ok(Vdso::Unavailable);
    };
    let len = limit - start;
    let mut image = vec![0u8; usize::try_from(len).unwrap_or(0)];
    me.open_relative("mem")
        .map_err(|source| ProcessError::Proc { pid, source })?
        .read_exact_at(&mut image, start)
        .map_err(io_error("reading the vDSO"))?;
    let mut file = memfd(c"profilerd-vdso").map_err(io_error("memfd_create"))?;
    file.write_all(&image)
        .map_err(io_error("writing the vDSO copy"))?;
    let header = image.get(..ELF_HEADER_LEN).unwrap_or(&image).to_vec();
    let object = ObjectFile::new(ObjectSource::Handle(file), None);
    Ok(Vdso::Ready {
        object: Arc::new(object),
        header,
        len,
    })
}

pub(crate) fn memfd(name: &CStr) -> io::Result<File> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}
