//! Closes uprobe links off the event loop. Releasing a uprobe_multi link
//! waits for an RCU tasks-trace grace period in the kernel (about 40 ms a
//! link on this VM), so one thread closes only about 25 links a second:
//! under `-- COMMAND` or `--pid`, where each process has links of its own,
//! 50 processes a second starting and exiting (two links each) kept the
//! event loop blocked in close(2) and left thousands of links to close at
//! exit. Closes made at once from several threads share grace periods, so
//! a small pool keeps up.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

/// Threads closing at once.
const WORKERS: usize = 32;
/// Links waiting to be closed; past that they are closed where dropped.
const QUEUE: usize = 16_384;

/// A pool of threads that close the link descriptors given to it. The
/// threads start with the first link given, so a daemon that never lets a
/// link go (no heap or park-point probes, or none released before the
/// stop) pays for none of them.
pub struct LinkCloser {
    pool: OnceLock<Pool>,
    /// Set by [`LinkCloser::finish`]: later links are closed where given.
    finished: AtomicBool,
    /// Links closed on the caller's thread because the queue was full (or
    /// the pool could not start).
    closed_inline: AtomicU64,
}

/// The closing threads and the queue that feeds them.
struct Pool {
    tx: Mutex<Option<SyncSender<OwnedFd>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    fn start() -> Self {
        let (tx, rx) = sync_channel::<OwnedFd>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..WORKERS)
            .filter_map(|i| {
                let rx = Arc::clone(&rx);
                std::thread::Builder::new()
                    .name(format!("link-close-{i}"))
                    .stack_size(64 * 1024)
                    .spawn(move || close_from(&rx))
                    .ok()
            })
            .collect::<Vec<_>>();
        let tx = (!workers.is_empty()).then_some(tx);
        Pool {
            tx: Mutex::new(tx),
            workers: Mutex::new(workers),
        }
    }
}

impl LinkCloser {
    pub fn new() -> Arc<Self> {
        Arc::new(LinkCloser {
            pool: OnceLock::new(),
            finished: AtomicBool::new(false),
            closed_inline: AtomicU64::new(0),
        })
    }

    /// Closes `link` on a pool thread (here, when the queue is full).
    pub fn close(&self, link: OwnedFd) {
        if self.finished.load(Ordering::Acquire) {
            self.closed_inline.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let pool = self.pool.get_or_init(Pool::start);
        let tx = pool.tx.lock().ok().and_then(|tx| tx.clone());
        let Some(tx) = tx else {
            self.closed_inline.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match tx.try_send(link) {
            Ok(()) => {}
            Err(TrySendError::Full(link) | TrySendError::Disconnected(link)) => {
                self.closed_inline.fetch_add(1, Ordering::Relaxed);
                drop(link);
            }
        }
    }

    /// Waits until every link given so far is closed; later ones are
    /// closed where they are given.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::Release);
        let Some(pool) = self.pool.get() else {
            return;
        };
        if let Ok(mut tx) = pool.tx.lock() {
            tx.take();
        }
        let workers = match pool.workers.lock() {
            Ok(mut w) => std::mem::take(&mut *w),
            Err(_) => return,
        };
        for worker in workers {
            let _ = worker.join();
        }
    }

    /// Closes each descriptor of one file's probes (see [`Self::close`]).
    pub fn close_all(&self, links: Vec<OwnedFd>) {
        for link in links {
            self.close(link);
        }
    }

    pub fn closed_inline(&self) -> u64 {
        self.closed_inline.load(Ordering::Relaxed)
    }

    /// Whether the closing threads were started.
    #[cfg(test)]
    pub fn started(&self) -> bool {
        self.pool.get().is_some()
    }
}

fn close_from(rx: &Mutex<Receiver<OwnedFd>>) {
    loop {
        // The lock is held only to take one: the close runs without it.
        let next = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        match next {
            Ok(link) => drop(link),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::time::{Duration, Instant};

    #[test]
    fn every_link_given_is_closed_by_finish() {
        // Write ends of a pipe stand for links: once all are closed, a
        // read of the read end sees the end of the file.
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors pipe2 writes.
        assert_eq!(
            unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) },
            0
        );
        // SAFETY: both are ours, just made.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let closer = LinkCloser::new();
        assert!(!closer.started(), "no thread before the first link");
        for _ in 0..100 {
            closer.close(write.try_clone().unwrap());
        }
        drop(write);
        closer.finish();
        // A test elsewhere in this process may fork meanwhile, its child
        // holding copies until its exec (close-on-exec): wait a little.
        let by = Instant::now() + Duration::from_secs(5);
        let mut byte = 0u8;
        loop {
            // SAFETY: one byte into a local.
            let n = unsafe { libc::read(read.as_raw_fd(), (&raw mut byte).cast(), 1) };
            if n == 0 {
                break;
            }
            assert!(Instant::now() < by, "a write end is still open");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(closer.closed_inline(), 0);
        // After finish, links are closed where they are given.
        closer.close(read);
        assert_eq!(closer.closed_inline(), 1);
    }
}
