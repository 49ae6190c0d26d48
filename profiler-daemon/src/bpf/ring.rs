//! The consumer side of a BPF ring buffer, mapping the data pages once.
//!
//! The kernel lays a ring's data pages out twice, back to back, so that a
//! consumer that maps both copies sees every record in one piece; aya's
//! consumer does, which makes each ring byte two bytes of resident memory
//! (the pages are inserted at mmap time, all of them). This consumer maps
//! them once and copies the rare record that wraps past the end into a
//! buffer of its own: the memory of a ring is its size, not twice it
//! (design 014). `[debug] rings_mapped_once = false` maps both copies, to
//! compare.
//!
//! The layout, from the kernel's `kernel/bpf/ringbuf.c` and the UAPI
//! (`BPF_RINGBUF_*`): page 0 holds the consumer position (the only page a
//! consumer may map writable), page 1 the producer position, the data
//! pages follow; each record starts on an 8-byte boundary with an 8-byte
//! header whose first word is the length with two flag bits (busy: not
//! committed yet; discard: skip it).

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};

use aya::maps::MapData;
use memmap2::{Mmap, MmapMut, MmapOptions};

const BUSY: u32 = 1 << 31;
const DISCARD: u32 = 1 << 30;
const HEADER: usize = 8;

/// Records that wrapped past the end of their ring's single mapping and
/// were copied out (for the exit summary: proof that the path ran).
pub(crate) static WRAPPED_RECORDS: AtomicU64 = AtomicU64::new(0);

/// Why a ring could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// Its size is not a power-of-two number of pages.
    #[error("ring buffer of {0} bytes: not a power-of-two multiple of the page size")]
    Size(usize),
    /// The kernel refused a mapping.
    #[error("mapping the ring buffer's {what}: {source}")]
    Map {
        what: &'static str,
        source: std::io::Error,
    },
}

/// A ring buffer map and its consumer mappings.
pub struct Ring {
    pages: Pages,
    page: usize,
    size: usize,
    twice: bool,
    /// A record that wrapped, put back together (u64 words: records hold
    /// 8-byte aligned structures).
    scratch: Vec<u64>,
    /// The most bytes seen waiting to be read (the ring's high-water
    /// mark, by which its size is judged).
    peak_fill: usize,
}

impl Ring {
    /// Maps ring buffer `map` of `size` data bytes; `twice` maps both
    /// copies of the data pages as aya does.
    pub fn new(map: MapData, size: usize, twice: bool) -> Result<Ring, RingError> {
        let page = page_size();
        if !size.is_power_of_two() || size < page {
            return Err(RingError::Size(size));
        }
        let fd = map.fd().as_fd().as_raw_fd();
        let mapped = |what, source| RingError::Map { what, source };
        // SAFETY: the consumer page is shared with the kernel, which
        // only reads it; it is accessed through an atomic below.
        let consumer = unsafe { MmapOptions::new().len(page).map_mut(fd) }
            .map_err(|e| mapped("consumer page", e))?;
        let data = if twice { 2 * size } else { size };
        // SAFETY: read-only pages the kernel writes; they are read through
        // atomics (positions, headers) or after an acquire load that
        // orders the record's bytes before them.
        let producer = unsafe {
            MmapOptions::new()
                .offset(page as u64)
                .len(page + data)
                .map(fd)
        }
        .map_err(|e| mapped("data pages", e))?;
        Ok(Ring {
            pages: Pages::Mapped {
                map,
                consumer,
                producer,
            },
            page,
            size,
            twice,
            scratch: Vec::new(),
            peak_fill: 0,
        })
    }

    /// Its data size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The most bytes that were waiting to be read at one time, as seen
    /// when reading.
    pub fn peak_fill(&self) -> usize {
        self.peak_fill
    }

    fn consumer_pos(&self) -> &AtomicUsize {
        // SAFETY: page-aligned, inside the consumer page, lives as long
        // as self.
        unsafe { &*self.pages.consumer().as_ptr().cast::<AtomicUsize>() }
    }

    fn producer_pos(&self) -> usize {
        // SAFETY: as above, in the producer page.
        unsafe { &*self.pages.producer().as_ptr().cast::<AtomicUsize>() }.load(Ordering::Acquire)
    }

    /// The next committed record, or None when the ring holds no more;
    /// its room is given back to the kernel when the record is dropped.
    pub fn next(&mut self) -> Option<RingRecord<'_>> {
        let mask = self.size - 1;
        let mut fenced = false;
        loop {
            let cons = self.consumer_pos().load(Ordering::Relaxed);
            let prod = self.producer_pos();
            self.peak_fill = self.peak_fill.max(prod.wrapping_sub(cons));
            let header = (cons != prod).then(|| {
                let at = self.page + (cons & mask);
                // SAFETY: `cons & mask` is 8-aligned and at least a
                // header's length before the end of the (first) data copy.
                unsafe { &*self.pages.producer().as_ptr().add(at).cast::<AtomicU32>() }
                    .load(Ordering::Acquire)
            });
            let Some(header) = header.filter(|h| h & BUSY == 0) else {
                // Nothing more, or a record reserved and not committed
                // yet. The kernel wakes a consumer only when a record lands
                // (or is committed) at the position it has reached: make
                // that position visible before looking a last time.
                if fenced {
                    return None;
                }
                fence(Ordering::SeqCst);
                fenced = true;
                continue;
            };
            let len = (header & !(BUSY | DISCARD)) as usize;
            let next = cons.wrapping_add((len + HEADER + 7) & !7);
            if header & DISCARD != 0 || len > self.size {
                self.consumer_pos().store(next, Ordering::Release);
                continue;
            }
            let start = (cons & mask) + HEADER;
            let data: &[u8] = if start + len <= self.size || self.twice {
                &self.pages.producer()[self.page + start..self.page + start + len]
            } else {
                WRAPPED_RECORDS.fetch_add(1, Ordering::Relaxed);
                let start = start & mask;
                let first = (self.size - start).min(len);
                self.scratch.clear();
                self.scratch.resize(len.div_ceil(8), 0);
                // SAFETY: u64 words viewed as their bytes.
                let bytes: &mut [u8] = unsafe {
                    std::slice::from_raw_parts_mut(
                        self.scratch.as_mut_ptr().cast::<u8>(),
                        self.scratch.len() * 8,
                    )
                };
                let data = &self.pages.producer()[self.page..self.page + self.size];
                bytes[..first].copy_from_slice(&data[start..start + first]);
                bytes[first..len].copy_from_slice(&data[..len - first]);
                &bytes[..len]
            };
            // SAFETY: as in consumer_pos.
            let consumer = unsafe { &*self.pages.consumer().as_ptr().cast::<AtomicUsize>() };
            return Some(RingRecord {
                data,
                consumer,
                next,
            });
        }
    }
}

impl AsRawFd for Ring {
    fn as_raw_fd(&self) -> RawFd {
        match &self.pages {
            Pages::Mapped { map, .. } => map.fd().as_fd().as_raw_fd(),
            #[cfg(test)]
            Pages::Memory { .. } => -1,
        }
    }
}

/// Where the consumer and producer pages are.
enum Pages {
    /// A ring buffer map's pages; the map keeps its descriptor open while
    /// they are mapped.
    Mapped {
        map: MapData,
        /// Page 0: the consumer position, ours to advance.
        consumer: MmapMut,
        /// The producer page, then the data pages (once, or twice).
        producer: Mmap,
    },
    /// The same layout in memory, written by a test as the kernel would.
    #[cfg(test)]
    Memory {
        consumer: Box<[u64]>,
        producer: Box<[u64]>,
    },
}

impl Pages {
    fn consumer(&self) -> &[u8] {
        match self {
            Pages::Mapped { consumer, .. } => consumer,
            #[cfg(test)]
            Pages::Memory { consumer, .. } => words_as_bytes(consumer),
        }
    }

    fn producer(&self) -> &[u8] {
        match self {
            Pages::Mapped { producer, .. } => producer,
            #[cfg(test)]
            Pages::Memory { producer, .. } => words_as_bytes(producer),
        }
    }
}

#[cfg(test)]
fn words_as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u64 words viewed as their bytes.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) }
}

/// One record, read in place (or from the copy of a wrapped one).
pub struct RingRecord<'a> {
    data: &'a [u8],
    consumer: &'a AtomicUsize,
    next: usize,
}

impl std::ops::Deref for RingRecord<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data
    }
}

impl Drop for RingRecord<'_> {
    fn drop(&mut self) {
        self.consumer.store(self.next, Ordering::Release);
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;
    const SIZE: usize = 4096;

    /// A one-page ring in memory, written as the kernel writes one.
    struct Fake {
        ring: Ring,
        produced: usize,
    }

    impl Fake {
        fn new(twice: bool) -> Fake {
            let data = if twice { 2 * SIZE } else { SIZE };
            Fake {
                ring: Ring {
                    pages: Pages::Memory {
                        consumer: vec![0; PAGE / 8].into_boxed_slice(),
                        producer: vec![0; (PAGE + data) / 8].into_boxed_slice(),
                    },
                    page: PAGE,
                    size: SIZE,
                    twice,
                    scratch: Vec::new(),
                    peak_fill: 0,
                },
                produced: 0,
            }
        }

        fn producer_bytes(&mut self) -> &mut [u8] {
            let Pages::Memory { producer, .. } = &mut self.ring.pages else {
                unreachable!()
            };
            // SAFETY: u64 words viewed as their bytes.
            unsafe {
                std::slice::from_raw_parts_mut(
                    producer.as_mut_ptr().cast::<u8>(),
                    producer.len() * 8,
                )
            }
        }

        /// Writes a record of `payload` with header flags `flags`, as the
        /// kernel does (into both copies when there are two), and
        /// publishes it.
        fn produce(&mut self, payload: &[u8], flags: u32) {
            let (pos, twice) = (self.produced, self.ring.twice);
            let mut record = (payload.len() as u32 | flags).to_le_bytes().to_vec();
            record.extend_from_slice(&[0; 4]);
            record.extend_from_slice(payload);
            let bytes = self.producer_bytes();
            for (i, b) in record.iter().enumerate() {
                let at = (pos + i) % SIZE;
                bytes[PAGE + at] = *b;
                if twice {
                    bytes[PAGE + SIZE + at] = *b;
                }
            }
            self.produced += (record.len() + 7) & !7;
            let produced = self.produced;
            self.producer_bytes()[..8].copy_from_slice(&produced.to_le_bytes());
        }

        fn read_all(&mut self) -> Vec<Vec<u8>> {
            let mut out = Vec::new();
            while let Some(r) = self.ring.next() {
                assert_eq!(r.as_ptr().align_offset(8), 0, "records are 8-byte aligned");
                out.push(r.to_vec());
            }
            out
        }
    }

    fn payload(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    #[test]
    fn records_that_wrap_read_whole_from_one_copy_or_two() {
        for twice in [false, true] {
            let mut fake = Fake::new(twice);
            let mut expected = Vec::new();
            // Round after round of odd lengths, so that records start
            // everywhere and many cross the end.
            for round in 0..40u8 {
                let mut batch = Vec::new();
                for k in 0..5u8 {
                    let p = payload(round ^ k, 37 + 211 * k as usize + round as usize);
                    fake.produce(&p, 0);
                    batch.push(p);
                }
                assert_eq!(fake.read_all(), batch, "round {round}, twice {twice}");
                let bytes: usize = batch.iter().map(|p| (p.len() + HEADER + 7) & !7).sum();
                assert!(fake.ring.peak_fill() >= bytes, "the batch waited whole");
                expected.extend(batch);
            }
            assert!(!expected.is_empty());
        }
        assert!(WRAPPED_RECORDS.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn discarded_records_are_skipped_and_busy_ones_wait() {
        let mut fake = Fake::new(false);
        fake.produce(&payload(1, 16), DISCARD);
        fake.produce(&payload(2, 24), 0);
        fake.produce(&payload(3, 8), BUSY);
        assert_eq!(fake.read_all(), vec![payload(2, 24)]);
        // Committed: the busy bit cleared in place.
        let at = PAGE + 56;
        fake.producer_bytes()[at + 3] &= 0x7f;
        assert_eq!(fake.read_all(), vec![payload(3, 8)]);
    }
}
