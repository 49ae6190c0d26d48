//! Names of JIT-compiled code from the process's perf map: the text file
//! `/tmp/perf-PID.map` that runtimes write for perf (Node's
//! `--perf-basic-prof`, Python 3.12's `-X perf`, .NET's
//! `DOTNET_PerfMapEnabled=1`, the JVM's perf-map agents), one line per
//! code region, `START SIZE name` with START and SIZE in hex. It is found
//! through the process's own root and under its pid in its own pid
//! namespace, so that a container's map is read where the container wrote
//! it. A map is read again from where it was left when it has grown (the
//! runtimes append), and from the start when it was replaced or shrank.
//! Bounded: at most `MAX_ENTRIES` regions per process and `MAX_PROCESSES`
//! processes; a line that does not parse is skipped and counted.
//!
//! A runtime frees code and writes other code over it: a sample is named
//! by the region that was there when it was taken. Lines carry no time, so
//! each region is taken as written halfway between the read that found it
//! and the one before; a sample whose time is known takes, of the regions
//! over its address, the last written by then. The maps of live JIT
//! processes are read every second.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::info;

use crate::model::frames::{Frame, Line};

/// Regions kept per process (a long-running Node service writes some
/// tens of thousands): the map's lines past it are left unread.
const MAX_ENTRIES: usize = 200_000;
/// Processes whose maps are kept (least recently used first out).
const MAX_PROCESSES: usize = 256;
/// How often a map is looked at again for new lines, at most.
const RECHECK: Duration = Duration::from_millis(500);

/// What the perf maps did, for the exit summary.
#[derive(Clone, Copy, Debug, Default)]
pub struct PerfMapStats {
    /// Frames named from a perf map.
    pub frames: u64,
    /// Lines that did not parse.
    pub bad_lines: u64,
    /// Maps that had more regions than are kept.
    pub truncated: u64,
    /// Frames of processes with a map in V8's shared interpreter
    /// trampoline: JavaScript functions the map cannot tell apart.
    pub interpreted_unnamed: u64,
}

/// The code every interpreted function of V8 runs in, unless Node is
/// started with `--interpreted-frames-native-stack` (then each has a copy,
/// named in the map).
const V8_INTERPRETER: &str = "Builtins_InterpreterEntryTrampoline";

/// One process's map.
struct PerfMap {
    /// Where it is read, and the file it was (device, inode).
    path: PathBuf,
    file: (u64, u64),
    /// Bytes read so far (lines are added from there).
    read: u64,
    /// Regions sorted by start.
    regions: Vec<Region>,
    /// When it was last read (CLOCK_MONOTONIC ns; 0: not yet).
    read_at: u64,
    /// Lines taken so far.
    lines: u64,
    /// Regions appended since the last sort.
    unsorted: bool,
    checked: Instant,
    used: u64,
    full: bool,
    /// Whether the log said that its interpreted frames share a name.
    told_interpreted: bool,
}

/// A code region of a map.
struct Region {
    start: u64,
    end: u64,
    name: Arc<[Line]>,
    /// The line's place in the map.
    place: u64,
    /// Kernel time (CLOCK_MONOTONIC ns) at which it is taken as written:
    /// halfway between the read that found it and the one before (0: it
    /// was there at the first).
    since: u64,
}

/// A process image: its pid and generation (`ProcessTable::generation`),
/// so that an exec's new program has its map looked for afresh.
type Image = (u32, u32);

#[derive(Default)]
pub struct PerfMaps {
    /// Each image's map, or when it was last looked for and not found.
    maps: HashMap<Image, Result<PerfMap, Instant>>,
    tick: u64,
    pub stats: PerfMapStats,
}

impl PerfMaps {
    /// The name of the JIT code at `address` in process image `image`,
    /// if its perf map has one: by the region there at kernel time `at`
    /// (see the module's doc), or the last written (None).
    pub fn lookup(&mut self, image: Image, address: u64, at: Option<u64>) -> Option<Arc<[Line]>> {
        self.tick += 1;
        if !self.maps.contains_key(&image) && self.maps.len() >= MAX_PROCESSES {
            self.evict();
        }
        let tick = self.tick;
        let stats = &mut self.stats;
        let slot = self
            .maps
            .entry(image)
            .or_insert_with(|| PerfMap::open(image.0).ok_or_else(Instant::now));
        if let Err(tried) = slot {
            // Runtimes create the file at their start, maybe after the
            // first sample: looked for again now and then.
            if tried.elapsed() < RECHECK {
                return None;
            }
            *slot = PerfMap::open(image.0).ok_or_else(Instant::now);
        }
        let map = slot.as_mut().ok()?;
        map.used = tick;
        if map.checked.elapsed() >= RECHECK || map.regions.is_empty() {
            map.update(stats);
        }
        let found = map.find(address, at);
        if found.is_some() {
            stats.frames += 1;
        }
        found
    }

    /// Reads what was added to the maps of `images` (live processes with
    /// JIT code) since the last read: a process's map must be read while
    /// it lives, as its own root goes with it, and its stacks are named at
    /// the window's end.
    pub fn watch(&mut self, images: &[Image]) {
        for &image in images {
            self.lookup(image, 0, None);
        }
    }

    /// Counts the frames of a stack of `image` (named) that lie in V8's
    /// shared interpreter trampoline, if the process has a perf map (it
    /// asked for its JavaScript to be named), and says once per process
    /// how to name them: a Node run with `--perf-basic-prof` alone names
    /// none of its interpreted functions, most of a program's cold code
    /// (in a TypeScript compiler run, the trampoline was in 97% of the
    /// main thread's samples). With `--interpreted-frames-native-stack`
    /// the functions of Node's own startup snapshot (its module loader)
    /// still run in it.
    pub fn note_interpreted(&mut self, image: Image, frames: &[Frame]) {
        let Some(Ok(map)) = self.maps.get_mut(&image) else {
            return;
        };
        let unnamed = frames
            .iter()
            .filter(|f| f.lines.last().is_some_and(|l| l.function == V8_INTERPRETER))
            .count() as u64;
        if unnamed == 0 {
            return;
        }
        self.stats.interpreted_unnamed += unnamed;
        if !map.told_interpreted {
            map.told_interpreted = true;
            info!(
                pid = image.0,
                "frames in V8's one {V8_INTERPRETER} are interpreted JavaScript functions the perf map cannot tell apart \
                 (counted as v8_interpreted_frames_unnamed): Node names each with --interpreted-frames-native-stack \
                 besides --perf-basic-prof, all but those of its own startup snapshot"
            );
        }
    }

    fn evict(&mut self) {
        if let Some((&oldest, _)) = self
            .maps
            .iter()
            .min_by_key(|(_, map)| map.as_ref().map_or(0, |m| m.used))
        {
            self.maps.remove(&oldest);
        }
    }
}

impl PerfMap {
    /// The map of process `tgid`, if it has one now (through its own
    /// root: a file left behind by an earlier process of the same pid is
    /// never taken for it).
    fn open(tgid: u32) -> Option<PerfMap> {
        let ns_pid = ns_pid(tgid)?;
        let path = PathBuf::from(format!("/proc/{tgid}/root/tmp/perf-{ns_pid}.map"));
        PerfMap::at(path)
    }

    /// The map at `path`, nothing read yet; None when there is no file.
    fn at(path: PathBuf) -> Option<PerfMap> {
        let meta = std::fs::metadata(&path).ok()?;
        Some(PerfMap {
            path,
            file: (meta.dev(), meta.ino()),
            read: 0,
            regions: Vec::new(),
            read_at: 0,
            lines: 0,
            unsorted: false,
            checked: Instant::now(),
            used: 0,
            full: false,
            told_interpreted: false,
        })
    }

    /// Reads the lines added since the last read (all of them if the file
    /// was replaced or shrank).
    fn update(&mut self, stats: &mut PerfMapStats) {
        self.checked = Instant::now();
        let now = crate::bpf::park_budget::monotonic_ns();
        // Written between the last read and now: taken as written halfway.
        let since = match self.read_at {
            0 => 0,
            last => last + now.saturating_sub(last) / 2,
        };
        self.read_at = now;
        let Ok(file) = File::open(&self.path) else {
            return;
        };
        let Ok(meta) = file.metadata() else { return };
        if (meta.dev(), meta.ino()) != self.file || meta.len() < self.read {
            self.file = (meta.dev(), meta.ino());
            self.read = 0;
            self.regions.clear();
            self.lines = 0;
            self.read_at = 0;
            self.full = false;
        }
        if meta.len() == self.read || self.full {
            return;
        }
        let mut reader = BufReader::new(file);
        if reader.seek(SeekFrom::Start(self.read)).is_err() {
            return;
        }
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                // A line still being written: read it next time.
                Ok(_) if !line.ends_with('\n') => break,
                Ok(n) => self.read += n as u64,
            }
            if self.regions.len() >= MAX_ENTRIES {
                self.full = true;
                stats.truncated += 1;
                break;
            }
            match parse_line(&line) {
                Some((start, size, name)) => {
                    self.unsorted |= self.regions.last().is_some_and(|r| r.start > start);
                    self.lines += 1;
                    self.regions.push(Region {
                        start,
                        end: start.saturating_add(size),
                        name: Arc::from([Line {
                            function: name.to_owned(),
                            file: None,
                            line: 0,
                        }]),
                        place: self.lines,
                        since,
                    });
                }
                None => stats.bad_lines += 1,
            }
        }
        if self.unsorted {
            self.regions.sort_by_key(|r| r.start);
            self.unsorted = false;
        }
    }

    /// Of the regions that cover `address`, the one written last, of
    /// those taken as written before kernel time `at` if it is given
    /// (the first written, if none may have): a region written later over
    /// the same addresses replaces the earlier (code freed, and other code
    /// put there), whether it starts at, before or after the earlier one's
    /// start. Only the 64 regions that start nearest below `address` are
    /// looked at.
    fn find(&self, address: u64, at: Option<u64>) -> Option<Arc<[Line]>> {
        let after = self.regions.partition_point(|r| r.start <= address);
        let covering = || {
            self.regions[..after]
                .iter()
                .rev()
                .take(64)
                .filter(move |r| address < r.end)
        };
        let live = covering()
            .filter(|r| at.is_none_or(|at| r.since < at))
            .max_by_key(|r| r.place);
        live.or_else(|| covering().min_by_key(|r| r.place))
            .map(|r| Arc::clone(&r.name))
    }
}

/// `START SIZE name`: hex numbers (with or without `0x`), the name the
/// rest of the line.
fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let line = line.trim_end_matches(['\n', '\r']);
    let (start, rest) = line.split_once(' ')?;
    let (size, name) = rest.split_once(' ')?;
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    Some((hex(start)?, hex(size)?, name))
}

/// The process's pid in its own pid namespace (the last `NSpid` field),
/// under which it names its map.
fn ns_pid(tgid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tgid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_as_runtimes_write_them() {
        assert_eq!(
            parse_line("7f3a2c00a0c0 1a8 JS:*spinHeavy /app/x.js:16:19\n"),
            Some((0x7f3a_2c00_a0c0, 0x1a8, "JS:*spinHeavy /app/x.js:16:19"))
        );
        assert_eq!(
            parse_line("0x1000 0x20 py::f:/app/m.py"),
            Some((0x1000, 0x20, "py::f:/app/m.py"))
        );
        for bad in ["", "zz 10 f", "1000 10", "1000 10  ", "1000"] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_map_is_read_as_it_grows_and_from_the_start_when_replaced() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("perf-map-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("perf-1.map");
        let mut f = File::create(&path).expect("create");
        writeln!(f, "1000 100 first").expect("write");
        write!(f, "garbage line\n2000 10 second\n3000 10 half").expect("write");
        let mut map = PerfMap::at(path.clone()).expect("the map");
        let mut stats = PerfMapStats::default();
        map.update(&mut stats);
        let name = |map: &PerfMap, a: u64| map.find(a, None).map(|l| l[0].function.clone());
        assert_eq!(name(&map, 0x1050).as_deref(), Some("first"));
        assert_eq!(name(&map, 0x2005).as_deref(), Some("second"));
        assert_eq!(name(&map, 0x1100), None);
        // The unfinished line is read once it ends; a later region for
        // the same code replaces the earlier.
        assert_eq!(name(&map, 0x3005), None);
        writeln!(f, "\n1000 100 recompiled").expect("write");
        map.update(&mut stats);
        assert_eq!(name(&map, 0x3005).as_deref(), Some("half"));
        assert_eq!(name(&map, 0x1050).as_deref(), Some("recompiled"));
        assert_eq!(stats.bad_lines, 1);
        // Code freed and other code written over part of it, starting
        // before it (as Node's map had it): the later wins where they
        // overlap, the earlier is left where they do not.
        writeln!(f, "4100 100 first_there\n4040 100 written_over").expect("write");
        map.update(&mut stats);
        assert_eq!(name(&map, 0x4120).as_deref(), Some("written_over"));
        assert_eq!(name(&map, 0x4150).as_deref(), Some("first_there"));
        assert_eq!(name(&map, 0x4050).as_deref(), Some("written_over"));
        // By time: a sample taken before the rewrite (halfway between the
        // reads) is named by what was there then.
        let before = map.read_at;
        std::thread::sleep(Duration::from_millis(2));
        writeln!(f, "4100 100 third").expect("write");
        map.update(&mut stats);
        let at =
            |map: &PerfMap, a: u64, t: u64| map.find(a, Some(t)).map(|l| l[0].function.clone());
        let halfway = before + (map.read_at - before) / 2;
        assert_eq!(at(&map, 0x4150, halfway).as_deref(), Some("first_there"));
        assert_eq!(at(&map, 0x4150, halfway + 1).as_deref(), Some("third"));
        assert_eq!(name(&map, 0x4150).as_deref(), Some("third"));
        // Before every region there: the first written.
        assert_eq!(at(&map, 0x4150, 0).as_deref(), Some("first_there"));
        // Replaced: read from the start.
        drop(f);
        std::fs::remove_file(&path).expect("remove");
        std::fs::write(&path, "5000 10 fresh\n").expect("write");
        map.update(&mut stats);
        assert_eq!(name(&map, 0x1050), None);
        assert_eq!(name(&map, 0x5000).as_deref(), Some("fresh"));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
