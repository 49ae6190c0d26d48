//! The mutex table: kept wake-ups by id, the delays of the waits they
//! ended (before or after their own event), weighted by Go's mutex
//! fraction (`rescale::mutex_event`), and the futex words known to lie in a
//! condition variable.

use super::park_windows::window_weight;
use super::*;

/// Kept wake-ups remembered for delays that arrive late (their waits end
/// after the window that saw the wake-up closed).
const MAX_WAKES: usize = 16_384;
/// Delays kept while their wake-up's own event has not arrived yet.
const MAX_EARLY_DELAYS: usize = 16_384;
/// Futex words known to lie in a condition variable.
const MAX_COND_WORDS: usize = 16_384;

/// Mutex profile: kept wake-ups and the delays of the waits they ended.
pub struct MutexTable {
    fraction: u64,
    /// Wake-up id → the waker's stack identity.
    wakes: HashMap<u64, Arc<SampleId>>,
    wake_order: VecDeque<u64>,
    /// Delays whose wake-up has not been seen yet.
    early: HashMap<u64, u64>,
    /// The park-probe window (period, length) of each kept wake-up seen
    /// in one (`ParkWindows`): its contention is counted with its delay,
    /// weighted by it.
    windows: HashMap<u64, (u64, u64)>,
    window: HashMap<Arc<SampleId>, Weight>,
    /// The condition variable of each futex word that waits inside
    /// `pthread_cond_*wait` were seen on, by (process, image, word): a
    /// wake-up on such a word is a signal or broadcast of that condition.
    cond_words: HashMap<(u32, u32, u64), u64>,
    /// On-demand captures (`/debug/pprof/mutex`): each gets a copy of the
    /// wake-ups of its processes, beside the window.
    pub taps: Taps<Arc<SampleId>, Weight>,
    /// Delays whose wake-up was never seen (dropped by a full ring).
    pub orphan_delays: u64,
    /// Times the table of condition words was full and started afresh.
    pub cond_words_cleared: u64,
}

impl MutexTable {
    pub fn new(fraction: u64) -> Self {
        MutexTable {
            fraction: fraction.max(1),
            wakes: HashMap::default(),
            wake_order: VecDeque::new(),
            early: HashMap::default(),
            windows: HashMap::default(),
            window: HashMap::default(),
            cond_words: HashMap::default(),
            taps: Taps::default(),
            orphan_delays: 0,
            cond_words_cleared: 0,
        }
    }

    /// A wait on futex word `id.object` was made inside a wait on condition
    /// `id.cond` (the waker's side names no condition: it calls
    /// pthread_cond_signal or _broadcast, which are not probed, as they
    /// are often called with nobody waiting).
    pub fn note_cond_word(&mut self, id: &SampleId) {
        if id.cond == 0 || id.object == 0 {
            return;
        }
        if self.cond_words.len() >= MAX_COND_WORDS {
            self.cond_words.clear();
            self.cond_words_cleared += 1;
        }
        self.cond_words
            .insert((id.tgid, id.generation, id.object), id.cond);
    }

    /// A kept wake-up that woke someone, made at `id`'s stack.
    #[cfg(test)]
    pub fn wake(&mut self, wake_id: u64, id: SampleId) {
        self.wake_in_window(wake_id, id, None);
    }

    /// A kept wake-up seen in a park-probe window of (period, length),
    /// if `window`: its contention is counted when its delay arrives (the
    /// kernel sends that right after), weighted by that delay's chance
    /// to be seen (`window_weight`).
    pub fn wake_in_window(&mut self, wake_id: u64, id: SampleId, window: Option<(u64, u64)>) {
        let id = Arc::new(id);
        match window {
            Some(window) => {
                self.charge(&id, |_| {});
                self.windows.insert(wake_id, window);
            }
            None => {
                // Counted once, with whatever delays arrived before it.
                let early = self.early.remove(&wake_id).unwrap_or(0);
                let added = mutex_event(early, self.fraction);
                self.charge(&id, |w| w.add(added));
            }
        }
        if self.wakes.len() >= MAX_WAKES
            && let Some(old) = self.wake_order.pop_front()
        {
            self.wakes.remove(&old);
            self.windows.remove(&old);
        }
        self.wakes.insert(wake_id, id);
        self.wake_order.push_back(wake_id);
    }

    /// A wait of `delay_ns` ended by kept wake-up `wake_id`.
    pub fn delay(&mut self, wake_id: u64, delay_ns: u64) {
        match self.wakes.get(&wake_id).cloned() {
            Some(id) => match self.windows.remove(&wake_id) {
                Some(window) => {
                    let weight = window_weight(window, delay_ns);
                    let (contentions, delay) = mutex_event(delay_ns, self.fraction);
                    self.charge(&id, |w| w.add((contentions * weight, delay * weight)));
                }
                None => {
                    let (_, delay) = mutex_event(delay_ns, self.fraction);
                    self.charge(&id, |w| w.delay_ns += delay);
                }
            },
            None => {
                if self.early.len() >= MAX_EARLY_DELAYS {
                    self.orphan_delays += self.early.len() as u64;
                    self.early.clear();
                }
                *self.early.entry(wake_id).or_default() += delay_ns;
            }
        }
    }

    /// Applies `f` to `id`'s weight in the window and in every tap that
    /// gathers its process.
    fn charge(&mut self, id: &Arc<SampleId>, mut f: impl FnMut(&mut Weight)) {
        self.taps.add(id.tgid, id, &mut f);
        if self.taps.window_wants(id.tgid) {
            f(self.window.entry(Arc::clone(id)).or_default());
        }
    }

    /// The window's wake-ups, each on a condition's word labelled with
    /// that condition.
    pub fn close(&mut self) -> Vec<(Arc<SampleId>, Weight)> {
        let window = std::mem::take(&mut self.window);
        self.labelled(window)
    }

    /// Ends capture `id`'s tap: the wake-ups it gathered, labelled as the
    /// window's are.
    pub fn take_tap(&mut self, id: u64) -> Vec<(Arc<SampleId>, Weight)> {
        match self.taps.take(id) {
            Some(tap) => self.labelled(tap.rows),
            None => Vec::new(),
        }
    }

    /// `rows`, each wake-up on a condition's word labelled with that
    /// condition.
    fn labelled(&self, rows: HashMap<Arc<SampleId>, Weight>) -> Vec<(Arc<SampleId>, Weight)> {
        let cond_words = &self.cond_words;
        rows.into_iter()
            .map(|(id, weight)| {
                let cond = cond_words.get(&(id.tgid, id.generation, id.object));
                match cond {
                    Some(&cond) if id.cond == 0 => (
                        Arc::new(SampleId {
                            cond,
                            go_labels: 0,
                            go_wait: 0,
                            ..(*id).clone()
                        }),
                        weight,
                    ),
                    _ => (id, weight),
                }
            })
            .collect()
    }
}
