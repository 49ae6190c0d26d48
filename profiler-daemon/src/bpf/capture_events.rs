//! The CPU-clock events of one on-demand capture that samples at a rate
//! of its own, or processes the schedule does not cover: one perf event
//! per thread of its processes (`perf record -p`'s way), each linked to
//! the CPU sampler with the capture's id as cookie. The sampler puts the
//! cookie in the sample's key (`SampleKey::tap`), so those samples go to
//! that capture alone and the windows stay as they were. Threads started
//! later are found at each tick; closing the links ends the sampling.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

use aya_obj::generated::{perf_event_attr, perf_sw_ids, perf_type_id};
use foldhash::HashMap;

use crate::bpf::perf_uprobe::open_event;
use crate::bpf::raw_programs::link_perf_event;

/// Threads one capture samples at most; more are counted, not sampled.
pub const MAX_CAPTURE_THREADS: usize = 4096;

/// The events of one capture.
#[derive(Debug)]
pub struct CaptureEvents {
    cookie: u64,
    period_ns: u64,
    pids: Vec<u32>,
    /// The link of each thread's event, by thread id.
    links: HashMap<u32, OwnedFd>,
    /// Threads not sampled: past [`MAX_CAPTURE_THREADS`], or their event
    /// could not be opened (the thread exited meanwhile, or a limit).
    pub threads_missed: u64,
}

impl CaptureEvents {
    /// Samples the threads of `pids` every `1e9 / hz` ns of CPU time,
    /// linked to program `prog` with `cookie`. Fails when no thread could
    /// be sampled (the first error).
    pub fn open(prog: BorrowedFd<'_>, cookie: u64, hz: u64, pids: Vec<u32>) -> io::Result<Self> {
        let mut events = CaptureEvents {
            cookie,
            period_ns: 1_000_000_000 / hz.max(1),
            pids,
            links: HashMap::default(),
            threads_missed: 0,
        };
        let first_error = events.rescan(prog);
        match (events.links.is_empty(), first_error) {
            (true, Some(e)) => Err(e),
            (true, None) => Err(io::Error::from_raw_os_error(libc::ESRCH)),
            _ => Ok(events),
        }
    }

    /// Opens events for threads started since, and forgets those of
    /// threads gone; returns the first error met, if any.
    pub fn rescan(&mut self, prog: BorrowedFd<'_>) -> Option<io::Error> {
        let mut first_error = None;
        let mut alive = Vec::new();
        for &pid in &self.pids {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            alive.extend(
                tasks
                    .flatten()
                    .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok()),
            );
        }
        // Up to MAX_CAPTURE_THREADS threads, every tick: looked up sorted.
        alive.sort_unstable();
        self.links.retain(|tid, _| alive.binary_search(tid).is_ok());
        for tid in alive {
            if self.links.contains_key(&tid) {
                continue;
            }
            if self.links.len() >= MAX_CAPTURE_THREADS {
                self.threads_missed += 1;
                continue;
            }
            match self.open_thread(prog, tid) {
                Ok(link) => {
                    self.links.insert(tid, link);
                }
                Err(e) => {
                    self.threads_missed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error
    }

    /// Threads sampled now.
    pub fn threads(&self) -> usize {
        self.links.len()
    }

    fn open_thread(&self, prog: BorrowedFd<'_>, tid: u32) -> io::Result<OwnedFd> {
        // SAFETY: plain data; all-zero is perf_event_attr's default.
        let mut attr: perf_event_attr = unsafe { zeroed() };
        attr.type_ = perf_type_id::PERF_TYPE_SOFTWARE as u32;
        attr.size = size_of::<perf_event_attr>() as u32;
        attr.config = perf_sw_ids::PERF_COUNT_SW_CPU_CLOCK as u64;
        // A fixed period of CPU time, as the schedule's events have: each
        // sample stands for exactly that long.
        attr.__bindgen_anon_1.sample_period = self.period_ns;
        let event = open_event(&attr, tid as i32, -1)?;
        let link = link_perf_event(prog.as_raw_fd(), event.as_raw_fd(), self.cookie)?;
        // SAFETY: a new descriptor that nothing else owns; it holds its
        // own reference to the event.
        Ok(unsafe { OwnedFd::from_raw_fd(link) })
    }
}
