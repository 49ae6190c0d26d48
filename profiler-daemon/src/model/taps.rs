//! Taps: for an on-demand capture (`/debug/pprof/...`), a copy of some
//! processes' rows gathered beside a profile's window, from when the tap
//! is opened until it is taken. Whatever adds a row to the window adds it
//! to every tap that wants its process too; the window itself stays as it
//! would be without them. One kind of tap serves every profile type: the
//! rows' key (a sample's identity) and value (a count, a tally of bytes, a
//! weight) are the profile's own.

use std::hash::Hash;

use foldhash::HashMap;

/// The rows of one capture.
#[derive(Debug)]
pub struct Tap<K, V> {
    /// Which capture it is.
    pub id: u64,
    /// The processes it gathers (none: all).
    pids: Vec<u32>,
    /// It takes only the rows its own events produce ([`Taps::add_own`]),
    /// none of the window's: CPU samples at a rate of its own.
    own_events: bool,
    pub rows: HashMap<K, V>,
}

impl<K, V> Tap<K, V> {
    /// Whether the tap gathers process `tgid`'s rows of the window, guests
    /// aside ([`Taps::gathers`]).
    fn wants(&self, tgid: u32) -> bool {
        !self.own_events && (self.pids.is_empty() || self.pids.contains(&tgid))
    }
}

/// The taps of one profile's window (at most a handful: one per capture),
/// and the processes that are there for captures only.
#[derive(Debug)]
pub struct Taps<K, V> {
    taps: Vec<Tap<K, V>>,
    /// Processes the schedule does not profile, sampled for a capture
    /// that names them: their rows go to the taps that name them, never
    /// to the window.
    guests: Vec<u32>,
}

impl<K, V> Default for Taps<K, V> {
    fn default() -> Self {
        Taps {
            taps: Vec::new(),
            guests: Vec::new(),
        }
    }
}

impl<K, V> Taps<K, V> {
    /// The processes there for captures only, from now on.
    pub fn set_guests(&mut self, guests: &[u32]) {
        self.guests.clear();
        self.guests.extend_from_slice(guests);
    }

    /// Whether process `tgid`'s rows belong in the window (it is not
    /// there for a capture only).
    pub fn window_wants(&self, tgid: u32) -> bool {
        !self.guests.contains(&tgid)
    }

    /// Whether `tap` gathers process `tgid`'s rows of the window: a
    /// guest's only if the tap names it.
    pub fn gathers(&self, tap: &Tap<K, V>, tgid: u32) -> bool {
        gathers(&self.guests, tap, tgid)
    }
}

fn gathers<K, V>(guests: &[u32], tap: &Tap<K, V>, tgid: u32) -> bool {
    tap.wants(tgid) && !(tap.pids.is_empty() && guests.contains(&tgid))
}

impl<K: Hash + Eq + Clone, V: Default> Taps<K, V> {
    /// Starts gathering `pids` (none: all) for capture `id`.
    pub fn open(&mut self, id: u64, pids: Vec<u32>) {
        self.taps.push(Tap {
            id,
            pids,
            own_events: false,
            rows: HashMap::default(),
        });
    }

    /// Starts gathering what capture `id`'s own events produce.
    pub fn open_own(&mut self, id: u64) {
        self.taps.push(Tap {
            id,
            pids: Vec::new(),
            own_events: true,
            rows: HashMap::default(),
        });
    }

    /// Applies `f` to `key`'s row in tap `id`, which its own events
    /// produced; false if no such tap is open (it ended: the row is for
    /// nobody).
    pub fn add_own(&mut self, id: u64, key: &K, f: impl FnOnce(&mut V)) -> bool {
        match self.taps.iter_mut().find(|t| t.id == id) {
            Some(tap) => {
                f(tap.rows.entry(key.clone()).or_default());
                true
            }
            None => false,
        }
    }

    /// Ends capture `id`'s tap and hands over what it gathered.
    pub fn take(&mut self, id: u64) -> Option<Tap<K, V>> {
        let at = self.taps.iter().position(|t| t.id == id)?;
        Some(self.taps.swap_remove(at))
    }

    /// Ends the taps of the captures `gone` names.
    pub fn drop_ids(&mut self, gone: &[u64]) {
        self.taps.retain(|t| !gone.contains(&t.id));
    }

    /// Applies `f` to `key`'s row in every tap that gathers process
    /// `tgid` (the row made first if new): a guest's only in the taps that
    /// name it.
    pub fn add(&mut self, tgid: u32, key: &K, mut f: impl FnMut(&mut V)) {
        let guests = &self.guests;
        for tap in self.taps.iter_mut().filter(|t| gathers(guests, t, tgid)) {
            f(tap.rows.entry(key.clone()).or_default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tap_gathers_its_processes_from_its_opening_to_its_taking() {
        let mut taps: Taps<&str, u64> = Taps::default();
        taps.add(1, &"before", |v| *v += 1);
        taps.open(7, vec![1]);
        taps.open(8, vec![]);
        taps.add(1, &"a", |v| *v += 2);
        taps.add(2, &"b", |v| *v += 3);
        taps.add(1, &"a", |v| *v += 1);
        let seven = taps.take(7).expect("tap 7");
        assert_eq!(seven.rows.len(), 1);
        assert_eq!(seven.rows[&"a"], 3);
        assert!(taps.take(7).is_none());
        taps.add(1, &"a", |v| *v += 10);
        let eight = taps.take(8).expect("tap 8");
        assert_eq!((eight.rows[&"a"], eight.rows[&"b"]), (13, 3));
        assert!(!eight.rows.contains_key(&"before"));
        taps.open(9, vec![]);
        taps.drop_ids(&[9]);
        assert!(taps.take(9).is_none());
        // A tap of its own events takes none of the window's rows.
        taps.open_own(10);
        taps.add(1, &"a", |v| *v += 1);
        assert!(taps.add_own(10, &"own", |v| *v += 4));
        assert!(!taps.add_own(11, &"own", |v| *v += 4), "no tap 11");
        let ten = taps.take(10).expect("tap 10");
        assert_eq!(ten.rows.len(), 1);
        assert_eq!(ten.rows[&"own"], 4);
        // A guest's rows: only for the taps that name it.
        taps.set_guests(&[5]);
        taps.open(11, vec![5]);
        taps.open(12, vec![]);
        taps.add(5, &"guest", |v| *v += 1);
        assert!(!taps.window_wants(5) && taps.window_wants(1));
        assert_eq!(taps.take(11).expect("tap 11").rows[&"guest"], 1);
        let twelve = taps.take(12).expect("tap 12");
        assert!(twelve.rows.is_empty());
        assert!(!taps.gathers(&twelve, 5) && taps.gathers(&twelve, 1));
    }
}
