//! The pprof label sets of Go goroutines, as the kernel recorded them at
//! CPU samples (`GO_LABEL_SETS`, taken at every drain), by the id the
//! samples carry. A set is kept through the window after the one that
//! recorded or used it (a sample drained later may name a set recorded at
//! an earlier drain, as the kernel records a set once per drain); the
//! table is bounded, and a set that finds it full is
//! counted and its samples go without their labels.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use profiler_common::{GO_LABEL_KEY_BYTES, GO_LABEL_VALUE_BYTES, GO_LABELS_MAX, GoLabels};

use crate::model::text::display_name;

/// Label sets kept at most.
pub const MAX_LABEL_SETS: usize = 4096;
/// The top bit of the id of a set the daemon read itself.
const READ_SET: u64 = 1 << 63;

/// One label set: (key, value) pairs, and whether the kernel cut it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelSet {
    pub labels: Vec<(String, String)>,
    pub cut: bool,
}

/// Label sets by id.
#[derive(Debug, Default)]
pub struct GoLabelSets {
    sets: HashMap<u64, Arc<LabelSet>>,
    /// Ids recorded or used in this window.
    used: HashSet<u64>,
    /// Sets not kept because the table was full.
    pub dropped: u64,
    /// Sets the kernel recorded with fewer labels, or shorter keys or
    /// values, than the goroutine had.
    pub cut: u64,
    /// Samples whose label set was not in the table.
    pub missing: u64,
}

impl GoLabelSets {
    /// Keeps the kernel's record of set `id` (a newer record of a known id
    /// replaces it).
    pub fn insert(&mut self, id: u64, record: &GoLabels) {
        if self.sets.len() >= MAX_LABEL_SETS && !self.sets.contains_key(&id) {
            self.dropped += 1;
            return;
        }
        let set = decode(record);
        self.cut += u64::from(set.cut);
        self.sets.insert(id, Arc::new(set));
        self.used.insert(id);
    }

    /// Keeps a set read from the goroutine's memory by the daemon (not
    /// recorded by the kernel); returns its id: a hash of its labels with
    /// the top bit set (the kernel's ids are 64-bit hashes of its records:
    /// one equal to it is as unlikely as two of them equal).
    pub fn insert_read(&mut self, labels: &[(String, String)]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        labels.hash(&mut hasher);
        let id = hasher.finish() | READ_SET;
        if !self.sets.contains_key(&id) {
            if self.sets.len() >= MAX_LABEL_SETS {
                self.dropped += 1;
                return id;
            }
            let set = LabelSet {
                labels: labels.to_vec(),
                cut: false,
            };
            self.sets.insert(id, Arc::new(set));
        }
        self.used.insert(id);
        id
    }

    /// The set `id`, noted as used by this window.
    pub fn get(&mut self, id: u64) -> Option<Arc<LabelSet>> {
        let set = self.sets.get(&id)?;
        self.used.insert(id);
        Some(Arc::clone(set))
    }

    /// Ends a window: sets it neither recorded nor used are let go of.
    pub fn end_window(&mut self) {
        let used = std::mem::take(&mut self.used);
        self.sets.retain(|id, _| used.contains(id));
    }

    pub fn len(&self) -> usize {
        self.sets.len()
    }
}

/// Adds the labels of Go label set `id` to a sample's labels, as Go's own
/// profiles carry them; a key that one of profilerd's own labels already
/// has (`pid`, `thread`, ...) is kept under `go.` + key. A set the table
/// does not have (dropped, or recorded before the daemon knew it) adds
/// nothing.
pub fn add_go_labels(labels: &mut Vec<(String, String)>, sets: &mut GoLabelSets, id: u64) {
    let Some(set) = sets.get(id) else {
        sets.missing += 1;
        return;
    };
    push_go_labels(labels, &set.labels);
}

/// Adds a goroutine's labels `set` to a sample's labels; a key that one of
/// profilerd's own labels already has is kept under `go.` + key.
pub fn push_go_labels(labels: &mut Vec<(String, String)>, set: &[(String, String)]) {
    for (key, value) in set {
        let key = match labels.iter().any(|(k, _)| k == key) {
            true => format!("go.{key}"),
            false => key.clone(),
        };
        labels.push((key, value.clone()));
    }
}

/// The text of a kernel record: lossy UTF-8 with control characters
/// escaped, as every label value is.
pub fn decode(record: &GoLabels) -> LabelSet {
    let count = usize::from(record.count).min(GO_LABELS_MAX);
    let labels = (0..count)
        .map(|i| {
            let key = &record.keys[i][..usize::from(record.key_len[i]).min(GO_LABEL_KEY_BYTES)];
            let value =
                &record.values[i][..usize::from(record.value_len[i]).min(GO_LABEL_VALUE_BYTES)];
            (display_name(key), display_name(value))
        })
        .filter(|(key, _)| !key.is_empty())
        .collect();
    LabelSet {
        labels,
        cut: record.cut != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pairs: &[(&str, &str)], cut: bool) -> GoLabels {
        // SAFETY: plain data; all-zero is a valid record.
        let mut r: GoLabels = unsafe { std::mem::zeroed() };
        for (i, (k, v)) in pairs.iter().enumerate() {
            let k = &k.as_bytes()[..k.len().min(GO_LABEL_KEY_BYTES)];
            let v = &v.as_bytes()[..v.len().min(GO_LABEL_VALUE_BYTES)];
            r.keys[i][..k.len()].copy_from_slice(k);
            r.values[i][..v.len()].copy_from_slice(v);
            r.key_len[i] = k.len() as u8;
            r.value_len[i] = v.len() as u8;
        }
        r.count = pairs.len() as u8;
        r.cut = u8::from(cut);
        r
    }

    #[test]
    fn records_decode_to_their_pairs() {
        let set = decode(&record(&[("handler", "checkout"), ("region", "eu")], false));
        assert_eq!(
            set.labels,
            vec![
                ("handler".to_string(), "checkout".to_string()),
                ("region".to_string(), "eu".to_string())
            ]
        );
        assert!(!set.cut);
        let long = "v".repeat(100);
        let set = decode(&record(&[("k", &long)], true));
        assert_eq!(set.labels[0].1.len(), GO_LABEL_VALUE_BYTES);
        assert!(set.cut);
    }

    #[test]
    fn go_labels_join_a_sample_without_hiding_its_own() {
        let mut sets = GoLabelSets::default();
        sets.insert(7, &record(&[("handler", "search"), ("pid", "x")], false));
        let mut labels = vec![("pid".to_string(), "12".to_string())];
        add_go_labels(&mut labels, &mut sets, 7);
        assert_eq!(
            labels,
            vec![
                ("pid".to_string(), "12".to_string()),
                ("handler".to_string(), "search".to_string()),
                ("go.pid".to_string(), "x".to_string()),
            ]
        );
        add_go_labels(&mut labels, &mut sets, 8);
        assert_eq!(sets.missing, 1);
    }

    #[test]
    fn sets_live_a_window_past_their_use_and_are_bounded() {
        let mut sets = GoLabelSets::default();
        sets.insert(1, &record(&[("a", "1")], false));
        sets.insert(2, &record(&[("b", "2")], false));
        // Recorded in window 1: kept through window 2.
        sets.end_window();
        assert!(sets.get(1).is_some());
        sets.end_window();
        assert!(
            sets.get(2).is_none(),
            "neither recorded nor used in window 2"
        );
        assert!(sets.get(1).is_some(), "used in window 2");
        sets.end_window();
        sets.end_window();
        assert_eq!(sets.len(), 0, "unused for a window: gone");
        for id in 0..MAX_LABEL_SETS as u64 + 5 {
            sets.insert(id, &record(&[("a", "1")], false));
        }
        assert_eq!(sets.len(), MAX_LABEL_SETS);
        assert_eq!(sets.dropped, 5);
    }
}
