//! The six profile types: their names, sample types and period types as
//! the product contract (docs/SPEC.md, "Output files") lists them.

use std::fmt;
use std::str::FromStr;

/// One profile type that profilerd can write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProfileKind {
    Cpu,
    Heap,
    Block,
    Mutex,
    Offcpu,
    /// Live goroutines of Go processes, by stack and wait reason, read
    /// from their memory at each window's end.
    Goroutine,
}

/// A pprof `ValueType`: (type, unit).
pub type ValueType = (&'static str, &'static str);

impl ProfileKind {
    pub const ALL: [ProfileKind; 6] = [
        ProfileKind::Cpu,
        ProfileKind::Heap,
        ProfileKind::Block,
        ProfileKind::Mutex,
        ProfileKind::Offcpu,
        ProfileKind::Goroutine,
    ];

    /// The name used on the command line and as the output file prefix.
    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "cpu",
            ProfileKind::Heap => "heap",
            ProfileKind::Block => "block",
            ProfileKind::Mutex => "mutex",
            ProfileKind::Offcpu => "offcpu",
            ProfileKind::Goroutine => "goroutine",
        }
    }

    /// Sample types in the order the contract fixes.
    pub fn sample_types(self) -> &'static [ValueType] {
        match self {
            ProfileKind::Cpu => &[("samples", "count"), ("cpu", "nanoseconds")],
            ProfileKind::Heap => &[
                ("alloc_objects", "count"),
                ("alloc_space", "bytes"),
                ("inuse_objects", "count"),
                ("inuse_space", "bytes"),
            ],
            ProfileKind::Block | ProfileKind::Mutex => {
                &[("contentions", "count"), ("delay", "nanoseconds")]
            }
            ProfileKind::Offcpu => &[("events", "count"), ("offcpu", "nanoseconds")],
            ProfileKind::Goroutine => &[("goroutine", "count")],
        }
    }

    /// The period type of the profile.
    pub fn period_type(self) -> ValueType {
        match self {
            ProfileKind::Cpu => ("cpu", "nanoseconds"),
            ProfileKind::Heap => ("space", "bytes"),
            ProfileKind::Block | ProfileKind::Mutex => ("contentions", "count"),
            ProfileKind::Offcpu => ("offcpu", "nanoseconds"),
            ProfileKind::Goroutine => ("goroutine", "count"),
        }
    }
}

impl fmt::Display for ProfileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProfileKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProfileKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("unknown profile type '{s}' (expected cpu, heap, block, mutex, offcpu or goroutine)")
            })
    }
}
