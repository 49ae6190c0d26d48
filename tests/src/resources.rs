//! The daemon's resources over time: a sampler thread reads its resident
//! memory (VmRSS, RssAnon) and counts its open file descriptors once a
//! second until it is stopped or dropped, so churn and soak runs can bound
//! them and print the series on failure.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often the sampler reads the process.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One reading of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Time since sampling started.
    pub at: Duration,
    /// Resident set size (VmRSS), KiB.
    pub rss_kib: u64,
    /// Anonymous resident memory (RssAnon), KiB: the heap, without the
    /// mapped files that the kernel can drop and re-read.
    pub anon_kib: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Of those, BPF links (each probe attachment holds one).
    pub links: u64,
}

/// Reads `pid`'s memory and descriptor count now; None once it is gone.
pub fn read_usage(pid: u32, at: Duration) -> Option<Usage> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    let (mut fds, mut links) = (0, 0);
    for entry in fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        fds += 1;
        if fs::read_link(entry.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:bpf_link") {
            links += 1;
        }
    }
    Some(Usage {
        at,
        rss_kib: kib("VmRSS:")?,
        anon_kib: kib("RssAnon:")?,
        fds,
        links,
    })
}

/// A background thread sampling one process every [`SAMPLE_EVERY`]; it
/// stops when the process is gone, on [`Sampler::stop`], or when dropped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Usage>>>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, samples) = (Arc::clone(&stop), Arc::clone(&samples));
            thread::spawn(move || {
                let started = Instant::now();
                let mut next = started;
                while !stop.load(Ordering::Relaxed) {
                    let Some(usage) = read_usage(pid, started.elapsed()) else {
                        break;
                    };
                    samples
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(usage);
                    next += SAMPLE_EVERY;
                    // Short sleeps, so that stop() returns promptly.
                    while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                        thread::sleep(Duration::from_millis(50));
                    }
                }
            })
        };
        Sampler {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// The readings so far.
    pub fn samples(&self) -> Vec<Usage> {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops sampling and returns every reading.
    pub fn stop(mut self) -> Vec<Usage> {
        self.halt();
        self.samples()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The largest of `f` over the readings taken at or after `from`.
pub fn max_after(samples: &[Usage], from: Duration, f: impl Fn(&Usage) -> u64) -> Option<u64> {
    samples.iter().filter(|u| u.at >= from).map(f).max()
}

/// The mean of `f` over the readings in `[from, to)`.
pub fn mean_between(
    samples: &[Usage],
    from: Duration,
    to: Duration,
    f: impl Fn(&Usage) -> u64,
) -> Option<f64> {
    let values: Vec<u64> = samples
        .iter()
        .filter(|u| u.at >= from && u.at < to)
        .map(f)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<u64>() as f64 / values.len() as f64)
}

/// The readings as a table (one line per reading), for failure messages
/// and reports.
pub fn table(samples: &[Usage]) -> String {
    let mut out = String::from("    s   rss_kib  anon_kib   fds links\n");
    for u in samples {
        let _ = writeln!(
            out,
            "{:>5} {:>9} {:>9} {:>5} {:>5}",
            u.at.as_secs(),
            u.rss_kib,
            u.anon_kib,
            u.fds,
            u.links
        );
    }
    out
}

/// What `pid`'s open descriptors point to, grouped: files by path, and
/// sockets, pipes and anonymous inodes by kind, with their counts.
pub fn fd_kinds(pid: u32) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return kinds;
    };
    for entry in entries.flatten() {
        let Ok(target) = fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        // socket:[123], pipe:[456], anon_inode:bpf-map ...: the kind only.
        let kind = match target.split_once(":[") {
            Some((kind, _)) => kind.to_string(),
            None => target.into_owned(),
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    kinds
}
