//! What the kernel reads of a Go process's runtime: where the running
//! goroutine's pprof labels are ([`GoRuntime`], set by the daemon per
//! process from the binary's Go version), and the label sets it records
//! ([`GoLabels`], in `GO_LABEL_SETS`, keyed by the id CPU samples carry).

/// Entries of `GO_LABEL_SETS`: distinct label sets seen between two
/// drains (the daemon takes them all every second).
pub const GO_LABEL_SETS_ENTRIES: u32 = 1024;
/// Labels recorded per set; more are counted as cut.
pub const GO_LABELS_MAX: usize = 8;
/// Bytes recorded of a label's key and of its value; longer ones are cut.
pub const GO_LABEL_KEY_BYTES: usize = 32;
pub const GO_LABEL_VALUE_BYTES: usize = 64;

/// How a Go release stores a goroutine's labels (`g.labels`).
pub mod go_labels_form {
    /// Not read.
    pub const NONE: u8 = 0;
    /// Go 1.23 and before: `*labelMap`, a `map[string]string`.
    pub const MAP: u8 = 1;
    /// Go 1.24 and later: `*labelMap`, a struct whose first field is a
    /// slice of `{key, value string}`, sorted by key.
    pub const LIST: u8 = 2;
}

/// Offsets in a Go release's runtime structures (all 0: labels not read).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoRuntime {
    /// `g.m`.
    pub g_m: u16,
    /// `m.curg`: the goroutine an M runs (the labels are its).
    pub m_curg: u16,
    /// `g.labels`.
    pub g_labels: u16,
    /// `g.atomicstatus` (0: not known, and a goroutine is not told running
    /// by its own words).
    pub g_status: u16,
    /// One of [`go_labels_form`].
    pub labels_form: u8,
    pub _pad: u8,
}

/// A goroutine's label set as the kernel recorded it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GoLabels {
    /// Labels recorded (at most [`GO_LABELS_MAX`]).
    pub count: u8,
    /// 1 when the set had more labels, or longer keys or values, than
    /// recorded.
    pub cut: u8,
    pub _pad: [u8; 6],
    pub key_len: [u8; GO_LABELS_MAX],
    pub value_len: [u8; GO_LABELS_MAX],
    pub keys: [[u8; GO_LABEL_KEY_BYTES]; GO_LABELS_MAX],
    pub values: [[u8; GO_LABEL_VALUE_BYTES]; GO_LABELS_MAX],
}
