//! What a goroutine parked for: the text of each `waitReason` number
//! (gopark's third argument) by Go release, as `runtime.waitReasonStrings`
//! has it, and which of them Go's own block profile counts. The numbers
//! come from the DWARF constants of binaries built by go1.19.8, 1.21.13,
//! 1.22.10, 1.23.9, 1.24.11, 1.25.5, 1.26.6 and 1.27.3, the texts from
//! each one's `runtime.waitReasonStrings` (checked against each by
//! `model/go_dwarf.rs`); 1.18 and 1.20 are assumed to number them as 1.19
//! does, no binary of theirs read. Releases add reasons at the end (1.21
//! to 1.23, 1.26 to 1.27), insert one (1.25), rename some (1.25: 1.24's
//! synctest channel waits became "durable") or reorder them (1.26), so
//! each table covers the releases whose list it is a prefix of.

/// Every table, in the order [`reason_key`] numbers them.
const TABLES: [&[&str]; 5] = [&GO_1_19, &GO_1_21, &GO_1_24, &GO_1_25, &GO_1_26];

/// The table of Go release 1.`minor`.
fn table_of(minor: u32) -> Option<usize> {
    Some(match minor {
        18..=20 => 0,
        21..=23 => 1,
        24 => 2,
        25 => 3,
        26..=27 => 4,
        _ => return None,
    })
}

/// A park's reason as a sample keeps it (never 0, which is "no park"):
/// which table and which entry, so that its text needs no more reading of
/// the process; for a release not in the tables (`minor` None or
/// unknown), the bare number.
pub fn reason_key(minor: Option<u32>, number: u8) -> u16 {
    match minor.and_then(table_of) {
        Some(table) => 1 + ((table as u16) << 8 | u16::from(number)),
        None => UNKNOWN_RELEASE | u16::from(number),
    }
}

/// The text of a [`reason_key`]; None where the release or the number is
/// not known.
pub fn key_text(key: u16) -> Option<&'static str> {
    if key == 0 || key & UNKNOWN_RELEASE != 0 {
        return None;
    }
    let key = key - 1;
    TABLES
        .get(usize::from(key >> 8))?
        .get(usize::from(key & 0xff))
        .copied()
        .filter(|t| !t.is_empty())
}

/// The bare number of a [`reason_key`].
pub fn key_number(key: u16) -> u8 {
    match key & UNKNOWN_RELEASE {
        0 => (key.saturating_sub(1) & 0xff) as u8,
        _ => (key & 0xff) as u8,
    }
}

/// Marks a [`reason_key`] of a release not in the tables.
const UNKNOWN_RELEASE: u16 = 0x8000;

/// The number of the reason `text` in `table`.
fn reason_number(table: &[&str], text: &str) -> Option<u8> {
    table
        .iter()
        .position(|t| *t == text)
        .and_then(|n| u8::try_from(n).ok())
}

/// The reasons sync.Mutex and sync.RWMutex waiters of Go release
/// 1.`minor` park with (Go's mutex profile counts their release):
/// `sync.Mutex.Lock`, `sync.RWMutex.RLock` and `sync.RWMutex.Lock` from
/// 1.21; before, `semacquire`, which other semaphores (sync.WaitGroup)
/// share. None for a release not in the tables.
pub fn mutex_reasons(minor: u32) -> Option<[u8; 3]> {
    let table = TABLES[table_of(minor)?];
    let number = |text| reason_number(table, text);
    match number("sync.Mutex.Lock") {
        Some(lock) => Some([
            lock,
            number("sync.RWMutex.RLock")?,
            number("sync.RWMutex.Lock")?,
        ]),
        None => number("semacquire").map(|n| [n; 3]),
    }
}

/// The reasons of Go release 1.`minor`'s other semaphore waits (those
/// `runtime.semacquire1` parks that are not a mutex's): `semacquire`
/// (sync.WaitGroup before 1.24, `internal/poll`) and `sync.WaitGroup.Wait`
/// (from 1.24); 0 for one the release does not have. None for a release
/// not in the tables.
pub fn sema_reasons(minor: u32) -> Option<[u8; 2]> {
    let table = TABLES[table_of(minor)?];
    let number = |text| reason_number(table, text).unwrap_or(0);
    Some([number("semacquire"), number("sync.WaitGroup.Wait")])
}

/// Whether Go's block profile counts a park for `reason`: channel
/// operations, select, and the sync package's waits (semaphores,
/// sync.Cond, sync.Mutex, sync.RWMutex, sync.WaitGroup), as the runtime
/// calls `blockevent` for them; not sleeps, I/O, the collector's or the
/// scheduler's own waits, nor parks that never end (a nil channel, an
/// empty select). A channel wait inside a `testing/synctest` bubble is
/// named "(synctest)" in Go 1.24 and "(durable)" from 1.25, and counts.
pub fn counts_as_blocking(reason: &str) -> bool {
    matches!(
        reason,
        "chan receive"
            | "chan send"
            | "select"
            | "semacquire"
            | "sync.Cond.Wait"
            | "sync.Mutex.Lock"
            | "sync.RWMutex.RLock"
            | "sync.RWMutex.Lock"
            | "sync.WaitGroup.Wait"
            | "chan receive (synctest)"
            | "chan send (synctest)"
            | "select (synctest)"
            | "chan receive (durable)"
            | "chan send (durable)"
            | "select (durable)"
            | "sync.WaitGroup.Wait (durable)"
    )
}

/// Go 1.19 (and 1.18 and 1.20, assumed).
const GO_1_19: [&str; 27] = [
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "timer goroutine (idle)",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "preempted",
    "debug call",
];

/// Go 1.21 to 1.23.
const GO_1_21: [&str; 38] = [
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
];

/// Go 1.24.
const GO_1_24: [&str; 44] = [
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "sync.WaitGroup.Wait",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
    "synctest.Run",
    "synctest.Wait",
    "chan receive (synctest)",
    "chan send (synctest)",
    "select (synctest)",
];

/// Go 1.25.
const GO_1_25: [&str; 47] = [
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "GOMAXPROCS updater (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "sync.WaitGroup.Wait",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
    "synctest.Run",
    "synctest.Wait",
    "chan receive (durable)",
    "chan send (durable)",
    "select (durable)",
    "sync.WaitGroup.Wait (durable)",
    "cleanup wait",
];

/// Go 1.26 and 1.27.
const GO_1_26: [&str; 47] = [
    "",
    "GC assist marking",
    "IO wait",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "finalizer wait",
    "force gc (idle)",
    "GOMAXPROCS updater (idle)",
    "semacquire",
    "sleep",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "select (no cases)",
    "select",
    "chan receive",
    "chan send",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "sync.WaitGroup.Wait",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
    "synctest.Run",
    "synctest.Wait",
    "chan receive (durable)",
    "chan send (durable)",
    "select (durable)",
    "sync.WaitGroup.Wait (durable)",
    "cleanup wait",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn reason_text(minor: u32, number: u8) -> Option<&'static str> {
        key_text(reason_key(Some(minor), number))
    }

    #[test]
    fn numbers_move_between_releases() {
        // The DWARF constants: ChanReceive 14 until 1.25, 19 from 1.26;
        // Semacquire 18, 19 in 1.25, 13 from 1.26; Sleep 19, 20, 14.
        assert_eq!(reason_text(19, 14), Some("chan receive"));
        assert_eq!(reason_text(24, 14), Some("chan receive"));
        assert_eq!(reason_text(27, 19), Some("chan receive"));
        assert_eq!(reason_text(19, 18), Some("semacquire"));
        assert_eq!(reason_text(25, 19), Some("semacquire"));
        assert_eq!(reason_text(26, 13), Some("semacquire"));
        assert_eq!(reason_text(19, 19), Some("sleep"));
        assert_eq!(reason_text(25, 20), Some("sleep"));
        assert_eq!(reason_text(27, 14), Some("sleep"));
        assert_eq!(reason_text(21, 21), Some("sync.Mutex.Lock"));
        assert_eq!(reason_text(19, 21), Some("timer goroutine (idle)"));
        assert_eq!(reason_text(27, 0), None, "zero is no reason");
        assert_eq!(reason_text(27, 200), None);
        assert_eq!(reason_text(40, 1), None, "an unknown release");
    }

    #[test]
    fn keys_name_their_reason_without_the_process() {
        let key = reason_key(Some(27), 19);
        assert_ne!(key, 0);
        assert_eq!(key_text(key), Some("chan receive"));
        assert_eq!(key_number(key), 19);
        let unknown = reason_key(None, 7);
        assert_ne!(unknown, 0);
        assert_eq!(key_text(unknown), None);
        assert_eq!(key_number(unknown), 7);
        assert_ne!(reason_key(Some(19), 0), 0, "reason 0 is still a park");
        assert_eq!(key_text(reason_key(Some(19), 0)), None);
    }

    #[test]
    fn mutex_waits_have_their_own_reasons_from_go_1_21() {
        assert_eq!(mutex_reasons(19), Some([18; 3]), "semacquire");
        assert_eq!(mutex_reasons(21), Some([21, 22, 23]));
        let [lock, rlock, wlock] = mutex_reasons(27).expect("known");
        assert_eq!(reason_text(27, lock), Some("sync.Mutex.Lock"));
        assert_eq!(reason_text(27, rlock), Some("sync.RWMutex.RLock"));
        assert_eq!(reason_text(27, wlock), Some("sync.RWMutex.Lock"));
        assert_eq!(mutex_reasons(40), None);
        let [sema, wait_group] = sema_reasons(27).expect("known");
        assert_eq!(reason_text(27, sema), Some("semacquire"));
        assert_eq!(reason_text(27, wait_group), Some("sync.WaitGroup.Wait"));
        assert_eq!(sema_reasons(19), Some([18, 0]), "WaitGroup is a semacquire");
    }

    /// Each release read numbers its reasons as its table does: the
    /// runtime's own texts (`runtime.waitReasonStrings` in the program's
    /// data) are a prefix of the table, and the DWARF constants
    /// (`runtime.waitReason*`) number exactly that list. Each table is the
    /// whole list of a release read, and no other release has one.
    #[test]
    fn tables_are_each_release_s_own_list() {
        use crate::model::go_dwarf;
        go_dwarf::assert_only_releases_read("the wait reason tables", |minor| {
            table_of(minor).is_some()
        });
        let mut whole = [false; TABLES.len()];
        for release in go_dwarf::releases() {
            let version = &release.version;
            let at = table_of(release.minor).expect("a table");
            let (table, texts) = (TABLES[at], &release.wait_reason_strings);
            println!(
                "{version}: {} reasons, table {at} of {}",
                texts.len(),
                table.len()
            );
            assert!(
                texts.len() <= table.len() && table[..texts.len()] == texts[..],
                "{version}: waitReasonStrings {texts:?}, the table {table:?}"
            );
            whole[at] |= texts.len() == table.len();
            let mut numbers: Vec<i64> = release
                .constants
                .iter()
                .filter(|(name, _)| name.starts_with("runtime.waitReason"))
                .map(|(_, &number)| number)
                .collect();
            numbers.sort_unstable();
            numbers.dedup();
            assert_eq!(
                numbers,
                (0..texts.len() as i64).collect::<Vec<_>>(),
                "{version}: the waitReason constants"
            );
        }
        assert_eq!(
            whole,
            [true; TABLES.len()],
            "tables whole in a release read"
        );
    }

    #[test]
    fn the_block_profile_counts_sync_and_channels_not_sleeps() {
        assert!(counts_as_blocking("chan receive"));
        assert!(counts_as_blocking("sync.Mutex.Lock"));
        assert!(!counts_as_blocking("sleep"));
        assert!(!counts_as_blocking("IO wait"));
        assert!(!counts_as_blocking("chan receive (nil chan)"));
    }
}
