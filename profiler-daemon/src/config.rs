//! Command line and config file: turns argv (and an optional TOML file named
//! by `--config`) into validated [`Settings`], per SPEC.md "Command line".
//!
//! Flags are parsed with clap into a struct where every option is optional,
//! so that a value missing on the command line can come from the file; then
//! both are merged (a flag wins over the file) and validated here, once, so a
//! flag and the same key in the file give the same checks and messages.
//!
//! Every failure is a [`ConfigError`] whose `Display` is one line naming the
//! problem and the offending value, because the contract is "a one-line error"
//! for bad input. `--help` and `--version` are [`ConfigError::Help`]: not
//! failures, but they must stop the program too, with the text on stdout and
//! exit status 0.
//!
//! # Config file
//!
//! TOML, keys are the long flags in snake_case; unknown keys are errors so a
//! typo does not silently fall back to a default. An unknown key or a value
//! of the wrong type is named with its line; a file that is not UTF-8 or is
//! larger than 1 MiB is refused before parsing:
//!
//! ```toml
//! pid = [1234, 5678]          # or a single integer: pid = 1234
//! command = ["myapp", "--serve"]
//! profiles = ["cpu"]          # or a comma string: profiles = "cpu"
//! duration = "1h"             # durations are strings: "30s", "5m", "10us"
//! interval = "60s"
//! output_dir = "/var/lib/profilerd"   # relative paths: to the working directory
//! cpu_frequency = 99
//! heap_sample_bytes = 524288
//! block_rate = "10us"
//! mutex_fraction = 100
//! retention = "24h"          # or "off" (also "0"): keep every file
//! push_url = "http://pyroscope:4040"   # Pyroscope's base URL
//! otlp_endpoint = "http://collector:4318"   # OTLP profiles (alpha), base URL
//! metrics_addr = "127.0.0.1:9464"
//!
//! [labels]                    # `label` is accepted too, after the flag's name
//! env = "prod"
//!
//! [push]                      # series, limits, tenant and auth of the push (push/settings.rs)
//! tenant = "team-a"
//!
//! [otlp]                      # service name, auth, headers of the OTLP export (otlp/settings.rs)
//! headers = { "X-Scope-OrgID" = "team-a" }
//!
//! [limits]                    # sizes of the kernel maps (limits.rs); file only
//! stack_samples_bytes = 8388608
//!
//! [debug]                     # stack optimizations off, to compare (stack_switches.rs)
//! brief_records = false
//! kernel_log = true           # kernel diagnostics in the log (kernel_log.rs)
//! ```
//!
//! The target (`pid` or `command`) is one setting: if the command line names
//! a target (`--pid` or `-- COMMAND`), it replaces the file's target entirely,
//! so `--pid` on the command line is not rejected for a `command` in the file.
//! Labels are merged: a `--label` with the same key as a file label replaces it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use clap::error::ErrorKind;
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use crate::limits::{LimitsTable, MapLimits};
use crate::otlp::{OtlpSettings, OtlpTable};
use crate::profile_kind::ProfileKind;
use crate::push::{PushSettings, PushTable};
use crate::stack_switches::{DebugTable, StackSwitches};

/// Default for `--interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Default for `--output-dir`.
pub const DEFAULT_OUTPUT_DIR: &str = "/var/lib/profilerd";
/// Default for `--cpu-frequency`.
pub const DEFAULT_CPU_FREQUENCY: u64 = 99;
/// Upper bound for `--cpu-frequency`. The kernel refuses perf events faster
/// than `kernel.perf_event_max_sample_rate` and lowers that limit on its own
/// when sampling interrupts take too long (its default is 100000, often
/// throttled to a few 10000s), so a rate far below it keeps perf_event_open
/// from failing mid-attach and keeps the profiler's overhead small.
pub const MAX_CPU_FREQUENCY: u64 = 10_000;
/// Default for `--heap-sample-bytes` (Go's default MemProfileRate).
pub const DEFAULT_HEAP_SAMPLE_BYTES: u64 = 512 * 1024;
/// Default for `--block-rate`.
pub const DEFAULT_BLOCK_RATE: Duration = Duration::from_micros(10);
/// Default for `--mutex-fraction`.
pub const DEFAULT_MUTEX_FRACTION: u64 = 100;
/// Default for `--retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Shortest `--interval`: shorter windows would mostly measure the writer.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Labels that profilerd sets on every sample itself; a `--label` with one of
/// these names would make two labels with the same key. The last seven are
/// `environment::LABELS`.
pub const RESERVED_LABELS: [&str; 13] = [
    "pid",
    "tid",
    "comm",
    "thread",
    "container_id",
    "container",
    "pod",
    "namespace",
    "pod_uid",
    "systemd_unit",
    "node",
    // The futex word of block and mutex samples, and the condition
    // variable a block sample waited on.
    "lock",
    "cond",
];

const DURATION_EXPECTED: &str = "expected a duration like 30s, 5m or 1h";

/// Validated settings of one profilerd run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Processes (thread-group ids) to profile; empty means all processes.
    /// Deduplicated, in the order given.
    pub pids: Vec<u32>,
    /// Command to start and profile (program and arguments); empty if none.
    pub command: Vec<OsString>,
    /// Profile types to collect, deduplicated, in the order given.
    pub profiles: Vec<ProfileKind>,
    /// Of `profiles`, those asked for at best effort (`heap?`): skipped
    /// with a warning where this kernel cannot run them, not refused.
    pub best_effort: Vec<ProfileKind>,
    /// `--check`: print what this kernel offers each profile type, and exit.
    pub check: bool,
    /// Stop after this long; `None` runs until signalled (or targets exit).
    pub duration: Option<Duration>,
    /// How often profiles are written; at least [`MIN_INTERVAL`].
    pub interval: Duration,
    /// Where profiles go. Not checked here: writer.rs creates and tests it.
    pub output_dir: PathBuf,
    /// CPU-clock samples per second per CPU, 1..=[`MAX_CPU_FREQUENCY`].
    pub cpu_frequency: u64,
    /// Mean bytes between heap samples, at least 1.
    pub heap_sample_bytes: u64,
    /// Block and off-CPU sampling rate, greater than zero.
    pub block_rate: Duration,
    /// Record 1 in this many contended wake-ups, at least 1.
    pub mutex_fraction: u64,
    /// Static labels for every sample, file labels first, then `--label`s.
    pub labels: Vec<(String, String)>,
    /// How user stacks are unwound.
    pub unwind: UnwindMode,
    /// Delete own profile files older than this (retention.rs); `None`
    /// (`off` or `0`) keeps every file. Longer than `interval`.
    pub retention: Option<Duration>,
    /// Where and how every written profile is also pushed to Pyroscope
    /// (`--push-url` and `[push]`, checked by `push::settings::build`).
    pub push: Option<PushSettings>,
    /// Where and how every written profile is also exported as OTLP
    /// profiles (`--otlp-endpoint` and `[otlp]`, checked by
    /// `otlp::settings::build`).
    pub otlp: Option<OtlpSettings>,
    /// Where `/metrics` is served.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Sizes of the kernel maps (`[limits]` in the config file).
    pub limits: MapLimits,
    /// Which stack optimizations are on (`[debug]` in the config file).
    pub stack_switches: StackSwitches,
    /// The eBPF programs' diagnostics are logged (`[debug] kernel_log`;
    /// `PROFILERD_LOG=debug` turns them on too, see kernel_log.rs).
    pub kernel_log: bool,
}

/// How user stacks are unwound (`--unwind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnwindMode {
    /// `.eh_frame` unwinding in the daemon, except for processes known to
    /// keep frame pointers (Go binaries), which the kernel walks.
    #[default]
    Auto,
    /// Frame pointers, walked by the kernel, for every process.
    Fp,
    /// `.eh_frame` unwinding in the daemon for every process.
    Dwarf,
}

impl std::str::FromStr for UnwindMode {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "auto" => Ok(UnwindMode::Auto),
            "fp" => Ok(UnwindMode::Fp),
            "dwarf" => Ok(UnwindMode::Dwarf),
            _ => Err(()),
        }
    }
}

/// Why the command line or config file was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--help` or `--version` was given: not a failure. The text is meant for
    /// stdout, followed by exit status 0. It is the only multi-line variant.
    #[error("{0}")]
    Help(String),
    /// The command line does not fit the grammar (unknown option, missing
    /// value, ...): clap's first message line.
    #[error("{0} (see 'profilerd --help')")]
    Usage(String),
    /// A value that does not parse or is out of range. `option` names where it
    /// came from: a flag, or a key in the config file.
    #[error("invalid value '{value}' for {option}: {expected}")]
    InvalidValue {
        option: String,
        value: String,
        expected: String,
    },
    /// A `--pid` (or file `pid`) that names no process.
    #[error("process {pid} given with {option} does not exist")]
    NoSuchProcess { pid: u32, option: String },
    /// /proc could not tell whether a pid exists.
    #[error("cannot check process {pid} given with {option}: {reason}")]
    ProcessLookup {
        pid: u32,
        option: String,
        reason: String,
    },
    /// Both a pid list and a command were given in the same place.
    #[error("{}", pid_with_command_message(.config_file.as_deref()))]
    PidWithCommand { config_file: Option<PathBuf> },
    /// The config file could not be read.
    #[error("cannot read config file {}: {reason}", printable(&.path.display().to_string()))]
    ReadConfig { path: PathBuf, reason: String },
    /// The config file is not valid TOML or has unknown keys or wrong types.
    #[error(
        "config file {}: {message}{}",
        printable(&.path.display().to_string()),
        line_suffix(*.line)
    )]
    ConfigFile {
        path: PathBuf,
        message: String,
        line: Option<usize>,
    },
}

fn pid_with_command_message(config_file: Option<&Path>) -> String {
    match config_file {
        None => "--pid and -- COMMAND cannot be used together: profile running processes or \
                 start a command, not both"
            .to_owned(),
        Some(path) => format!(
            "config file {}: 'pid' and 'command' cannot both be set",
            printable(&path.display().to_string())
        ),
    }
}

/// `text` with control characters escaped (`\u{1b}`, `\t`): an error
/// message echoes values from the command line and the file, and a
/// terminal must not act on them (escape sequences, carriage returns).
fn printable(text: &str) -> String {
    crate::text::escape_controls(text).into_owned()
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
}

/// The flags as clap sees them. Everything is optional (defaults are applied
/// after merging with the config file) and values are kept as strings so that
/// validation and its messages are shared with the file. Numeric options
/// take a negative number as their value, so that `--pid -3` is reported as a
/// bad pid rather than as an unknown option `-3`; other values starting with
/// '-' are left to clap, so that `--duration --pid 1` says that --duration
/// lacks its value.
#[derive(Debug, Parser)]
#[command(
    name = "profilerd",
    version,
    about = "System-wide continuous profiler: samples stacks with eBPF and writes pprof files",
    override_usage = "profilerd [OPTIONS] [-- COMMAND [ARGS...]]\n       \
                      profilerd top [OPTIONS] FILE...\n       \
                      profilerd flamegraph [OPTIONS] -o OUT.svg FILE...",
    after_help = "Reading profiles: 'profilerd top' prints the heaviest functions (like \
                  go tool pprof -top), 'profilerd flamegraph' draws an SVG; see \
                  'profilerd top --help'."
)]
struct Cli {
    /// Profile only these processes and their threads (repeatable or
    /// comma-separated) [default: all processes]
    #[arg(
        long = "pid",
        value_name = "PID",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    pids: Vec<String>,

    /// Comma list of cpu, heap, block, mutex, offcpu; a trailing '?'
    /// (heap?) skips that type where the kernel cannot run it [default: cpu]
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    profiles: Vec<String>,

    /// Print, for this kernel, whether each profile type is ready, degraded
    /// or unavailable (and what it needs), then exit: 0 when every
    /// requested type can run
    #[arg(long)]
    check: bool,

    /// Stop after DUR (30s, 5m, 1h) [default: run until signalled]
    #[arg(long, value_name = "DUR")]
    duration: Option<String>,

    /// How often profiles are written [default: 60s]
    #[arg(long, value_name = "DUR")]
    interval: Option<String>,

    /// Where profiles go, created if missing [default: /var/lib/profilerd]
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,

    /// CPU-clock samples per second per CPU, 1 to 10000 [default: 99]
    #[arg(long, value_name = "HZ", allow_negative_numbers = true)]
    cpu_frequency: Option<String>,

    /// Mean bytes between heap samples; 1 records every allocation
    /// [default: 524288]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    heap_sample_bytes: Option<String>,

    /// Block and off-CPU sampling rate [default: 10us]
    #[arg(long, value_name = "DUR")]
    block_rate: Option<String>,

    /// Record 1 in N contended wake-ups [default: 100]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    mutex_fraction: Option<String>,

    /// Static label added to every sample (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,

    /// How user stacks are unwound: auto, fp (frame pointers) or dwarf
    /// (.eh_frame) [default: auto]
    #[arg(long, value_name = "MODE")]
    unwind: Option<String>,

    /// Delete own profile files older than DUR; off (or 0) keeps all
    /// [default: 24h]
    #[arg(long, value_name = "DUR")]
    retention: Option<String>,

    /// TOML file with the same keys in snake_case; flags override it
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Also send every profile to this Pyroscope server (its base URL; the
    /// push API, series and auth set in the config file's [push] table)
    #[arg(long, value_name = "URL")]
    push_url: Option<String>,

    /// Also export every profile as OpenTelemetry profiles to this OTLP/HTTP
    /// receiver (its base URL; /v1development/profiles is added). Alpha, as
    /// the signal is: the format may change between releases
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,

    /// Serve Prometheus metrics at http://ADDR:PORT/metrics
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_addr: Option<String>,

    /// Command to start once every probe is attached; profiled with its
    /// descendants until it exits
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// The config file as written. Types are as loose as the TOML allows and the
/// checks are the flags' ones, done in [`merge`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    pid: Option<PidList>,
    command: Option<Vec<String>>,
    profiles: Option<ProfileList>,
    duration: Option<String>,
    interval: Option<String>,
    output_dir: Option<PathBuf>,
    cpu_frequency: Option<u64>,
    heap_sample_bytes: Option<u64>,
    block_rate: Option<String>,
    mutex_fraction: Option<u64>,
    unwind: Option<String>,
    retention: Option<String>,
    // `label` is the flag's name (SPEC: "the same keys"), `labels` reads
    // better for a table; accept both.
    #[serde(alias = "label")]
    labels: Option<BTreeMap<String, String>>,
    push_url: Option<String>,
    otlp_endpoint: Option<String>,
    metrics_addr: Option<String>,
    push: Option<PushTable>,
    otlp: Option<OtlpTable>,
    limits: Option<LimitsTable>,
    debug: Option<DebugTable>,
}

/// `pid = 1234` or `pid = [1234, 5678]`. Kept as i64 (TOML's integer) so an
/// out-of-range pid gets the same message as on the command line.
#[derive(Debug)]
struct PidList(Vec<i64>);

impl<'de> Deserialize<'de> for PidList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PidVisitor;
        impl<'de> Visitor<'de> for PidVisitor {
            type Value = PidList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a process ID or a list of process IDs")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PidList, E> {
                Ok(PidList(vec![v]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PidList, E> {
                i64::try_from(v)
                    .map(|v| PidList(vec![v]))
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PidList, A::Error> {
                let mut pids = Vec::new();
                while let Some(pid) = seq.next_element::<i64>()? {
                    pids.push(pid);
                }
                Ok(PidList(pids))
            }
        }
        deserializer.deserialize_any(PidVisitor)
    }
}

/// `profiles = "cpu,heap"` (like the flag) or `profiles = ["cpu", "heap"]`.
#[derive(Debug)]
struct ProfileList(Vec<String>);

impl<'de> Deserialize<'de> for ProfileList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ProfileVisitor;
        impl<'de> Visitor<'de> for ProfileVisitor {
            type Value = ProfileList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a comma-separated string or a list of profile type names")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ProfileList, E> {
                Ok(ProfileList(v.split(',').map(str::to_owned).collect()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ProfileList, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(ProfileList(names))
            }
        }
        deserializer.deserialize_any(ProfileVisitor)
    }
}

impl Settings {
    /// Parses argv (including argv[0]) and, if `--config FILE` is given, the
    /// TOML file; flags override the file. Checks that `--pid` processes exist
    /// (a thread id is replaced by its process id). Does not touch the output
    /// directory.
    pub fn parse_from<I, T>(args: I) -> Result<Settings, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args).map_err(from_clap)?;
        let file = match &cli.config {
            Some(path) => Some((path.clone(), read_config_file(path)?)),
            None => None,
        };
        merge(cli, file)
    }
}

/// Turns clap's error into a one-line [`ConfigError::Usage`], or into
/// [`ConfigError::Help`] for `--help`/`--version`.
fn from_clap(err: clap::Error) -> ConfigError {
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ConfigError::Help(err.to_string()),
        kind => {
            // The rendered error is "error: MESSAGE", then tips, usage and a
            // pointer to --help on further lines; the first line names the
            // problem and the offending argument, the rest is dropped.
            let rendered = err.render().to_string();
            let first = rendered
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map(|l| l.strip_prefix("error:").unwrap_or(l).trim().to_owned());
            ConfigError::Usage(printable(&first.unwrap_or_else(|| kind.to_string())))
        }
    }
}

/// Largest config file read: a real one is a few hundred bytes, and a
/// bound keeps a wrong path (a log, a device) from being read whole.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

fn read_config_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let read_err = |reason: String| ConfigError::ReadConfig {
        path: path.to_owned(),
        reason,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| read_err(io_reason(&e)))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(read_err(format!(
            "larger than {} KiB, not a config file",
            MAX_CONFIG_BYTES / 1024
        )));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        read_err(format!(
            "not UTF-8 text (invalid byte at line {})",
            line_of(&String::from_utf8_lossy(&e.as_bytes()[..at]), at)
        ))
    })?;
    toml::from_str(&text).map_err(|e| {
        // toml's Display draws the offending line with a caret over several
        // lines; keep its message, the key and the line number only.
        let line = e.span().map(|span| line_of(&text, span.start));
        let message = toml_message(e.message());
        let message = match error_key(&e) {
            Some(key) if !message.contains(&format!("'{key}'")) => {
                format!("key '{key}': {message}")
            }
            _ => message,
        };
        ConfigError::ConfigFile {
            path: path.to_owned(),
            message,
            line,
        }
    })
}

/// The dotted key a toml error is about (control characters escaped), if
/// it says: toml only prints it (as "in `a.b`") when it has no input to
/// point into.
fn error_key(error: &toml::de::Error) -> Option<String> {
    let mut bare = error.clone();
    bare.set_input(None);
    bare.to_string()
        .lines()
        .find_map(|l| l.strip_prefix("in `")?.strip_suffix('`').map(printable))
}

/// One-line form of a toml/serde message, in TOML's words ("key"), with
/// control characters (from the file's own strings) escaped.
fn toml_message(message: &str) -> String {
    let one_line = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    // serde says "unknown field `foo`, expected one of `a`, `b`"; a file
    // author thinks in keys and quotes with ''.
    let message = match one_line.strip_prefix("unknown field `") {
        Some(rest) => format!("unknown key '{}", rest.replace('`', "'")),
        None => one_line,
    };
    printable(&message)
}

/// 1-based line of byte offset `pos` in `text`.
fn line_of(text: &str, pos: usize) -> usize {
    let pos = pos.min(text.len());
    text.as_bytes()[..pos]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// An io::Error's description without std's " (os error N)" suffix, which
/// means nothing to a user.
fn io_reason(err: &io::Error) -> String {
    let text = err.to_string();
    match err.raw_os_error() {
        Some(code) => text
            .strip_suffix(&format!(" (os error {code})"))
            .map(str::to_owned)
            .unwrap_or(text),
        None => text,
    }
}

/// Where a value came from, for error messages: `--flag` or the file key.
fn origin(flag: &str, key: &str, file: Option<&Path>) -> String {
    match file {
        Some(path) => format!(
            "'{key}' in config file {}",
            printable(&path.display().to_string())
        ),
        None => format!("--{flag}"),
    }
}

/// Picks the flag's value if given, else the file's, with its origin.
fn pick<T>(
    flag_value: Option<T>,
    file_value: Option<T>,
    flag: &str,
    key: &str,
    file: Option<&Path>,
) -> Option<(T, String)> {
    match (flag_value, file_value) {
        (Some(v), _) => Some((v, origin(flag, key, None))),
        (None, Some(v)) => Some((v, origin(flag, key, file))),
        (None, None) => None,
    }
}

/// A push or OTLP setting refused: the URL under the option it came from
/// (`url_key` names it), a table key under the file it is in, or quoted
/// alone when it is a default (no file).
fn sink_error(
    e: crate::push::settings::SettingError,
    url_key: &str,
    opt: &str,
    path: Option<&Path>,
) -> ConfigError {
    match e.key {
        key if key == url_key => invalid(opt, e.value, e.expected),
        key if path.is_none() => invalid(&format!("'{key}'"), e.value, e.expected),
        key => invalid(&origin("", key, path), e.value, e.expected),
    }
}

fn invalid(option: &str, value: impl fmt::Display, expected: impl Into<String>) -> ConfigError {
    ConfigError::InvalidValue {
        option: printable(option),
        value: printable(&value.to_string()),
        expected: printable(&expected.into()),
    }
}

fn merge(cli: Cli, file: Option<(PathBuf, FileConfig)>) -> Result<Settings, ConfigError> {
    let (path, fc) = match file {
        Some((path, fc)) => (Some(path), fc),
        None => (None, FileConfig::default()),
    };
    let path = path.as_deref();

    let (pids, command) = merge_target(&cli, &fc, path)?;
    let (profiles, best_effort) = merge_profiles(cli.profiles, fc.profiles, path)?;

    let duration = match pick(cli.duration, fc.duration, "duration", "duration", path) {
        Some((raw, opt)) => {
            let d = parse_duration(&raw, &opt)?;
            if d.is_zero() {
                return Err(invalid(&opt, raw, "the duration must be longer than 0s"));
            }
            Some(d)
        }
        None => None,
    };

    let interval = match pick(cli.interval, fc.interval, "interval", "interval", path) {
        Some((raw, opt)) => {
            let d = parse_duration(&raw, &opt)?;
            if d < MIN_INTERVAL {
                return Err(invalid(&opt, raw, "the interval must be at least 1s"));
            }
            d
        }
        None => DEFAULT_INTERVAL,
    };

    let output_dir = match pick(
        cli.output_dir,
        fc.output_dir,
        "output-dir",
        "output_dir",
        path,
    ) {
        Some((dir, opt)) => {
            if dir.as_os_str().is_empty() {
                return Err(invalid(&opt, "", "expected a directory path"));
            }
            dir
        }
        None => PathBuf::from(DEFAULT_OUTPUT_DIR),
    };

    let cpu_frequency = number(
        cli.cpu_frequency,
        fc.cpu_frequency,
        ("cpu-frequency", "cpu_frequency", path),
        1..=MAX_CPU_FREQUENCY,
        "expected samples per second from 1 to 10000",
    )?
    .unwrap_or(DEFAULT_CPU_FREQUENCY);

    let heap_sample_bytes = number(
        cli.heap_sample_bytes,
        fc.heap_sample_bytes,
        ("heap-sample-bytes", "heap_sample_bytes", path),
        1..=u64::MAX,
        "expected a number of bytes, at least 1",
    )?
    .unwrap_or(DEFAULT_HEAP_SAMPLE_BYTES);

    let block_rate = match pick(
        cli.block_rate,
        fc.block_rate,
        "block-rate",
        "block_rate",
        path,
    ) {
        Some((raw, opt)) => {
            let d = parse_duration(&raw, &opt)?;
            if d.is_zero() {
                return Err(invalid(&opt, raw, "the rate must be longer than 0s"));
            }
            d
        }
        None => DEFAULT_BLOCK_RATE,
    };

    let mutex_fraction = number(
        cli.mutex_fraction,
        fc.mutex_fraction,
        ("mutex-fraction", "mutex_fraction", path),
        1..=u64::MAX,
        "expected a whole number, at least 1",
    )?
    .unwrap_or(DEFAULT_MUTEX_FRACTION);

    let labels = merge_labels(&cli.labels, fc.labels, path)?;

    let unwind = match pick(cli.unwind, fc.unwind, "unwind", "unwind", path) {
        Some((raw, opt)) => raw
            .parse()
            .map_err(|()| invalid(&opt, &raw, "expected auto, fp or dwarf"))?,
        None => UnwindMode::Auto,
    };

    let retention = match pick(cli.retention, fc.retention, "retention", "retention", path) {
        Some((raw, opt)) => parse_retention(&raw, &opt, interval)?,
        None if DEFAULT_RETENTION > interval => Some(DEFAULT_RETENTION),
        // An interval of a day or more with no retention given: keep all
        // rather than refuse a setting the user did not make.
        None => None,
    };
    let push = match pick(cli.push_url, fc.push_url, "push-url", "push_url", path) {
        Some((raw, opt)) => Some(
            crate::push::settings::build(&raw, fc.push.as_ref(), &labels, interval)
                .map_err(|e| sink_error(e, "push_url", &opt, path))?,
        ),
        None => None,
    };
    let otlp = match pick(
        cli.otlp_endpoint,
        fc.otlp_endpoint,
        "otlp-endpoint",
        "otlp_endpoint",
        path,
    ) {
        Some((raw, opt)) => Some(
            crate::otlp::settings::build(&raw, fc.otlp.as_ref(), &labels)
                .map_err(|e| sink_error(e, "otlp_endpoint", &opt, path))?,
        ),
        None => None,
    };
    let metrics_addr = match pick(
        cli.metrics_addr,
        fc.metrics_addr,
        "metrics-addr",
        "metrics_addr",
        path,
    ) {
        Some((raw, opt)) => Some(raw.trim().parse().map_err(|_| {
            invalid(
                &opt,
                &raw,
                "expected ADDRESS:PORT, like 127.0.0.1:9464 or [::]:9464",
            )
        })?),
        None => None,
    };

    let limits = match &fc.limits {
        Some(table) => table.validate().map_err(|e| {
            invalid(
                &origin("", &format!("limits.{}", e.key), path),
                e.value,
                e.expected,
            )
        })?,
        None => MapLimits::default(),
    };
    let stack_switches = fc
        .debug
        .as_ref()
        .map(DebugTable::switches)
        .unwrap_or_default();
    let kernel_log = fc.debug.as_ref().is_some_and(DebugTable::kernel_log);

    Ok(Settings {
        pids,
        command,
        profiles,
        best_effort,
        check: cli.check,
        duration,
        interval,
        output_dir,
        cpu_frequency,
        heap_sample_bytes,
        block_rate,
        mutex_fraction,
        labels,
        unwind,
        retention,
        push,
        otlp,
        metrics_addr,
        limits,
        stack_switches,
        kernel_log,
    })
}

/// `off` or a zero duration: keep every file. Otherwise the retention must
/// be longer than the interval, or every profile would be deleted as soon
/// as it is written (its window started one interval ago).
fn parse_retention(
    raw: &str,
    opt: &str,
    interval: Duration,
) -> Result<Option<Duration>, ConfigError> {
    if raw.trim() == "off" {
        return Ok(None);
    }
    let d = parse_duration(raw, opt)?;
    if d.is_zero() {
        return Ok(None);
    }
    if d <= interval {
        return Err(invalid(
            opt,
            raw,
            format!(
                "the retention must be longer than the interval ({}), or off",
                humantime::format_duration(interval)
            ),
        ));
    }
    Ok(Some(d))
}

/// The target: `--pid`s or a command. A target named on the command line
/// replaces the file's target as a whole (see the module doc).
fn merge_target(
    cli: &Cli,
    fc: &FileConfig,
    path: Option<&Path>,
) -> Result<(Vec<u32>, Vec<OsString>), ConfigError> {
    let cli_has_target = !cli.pids.is_empty() || !cli.command.is_empty();
    let (raw_pids, command, pid_origin, from_file) = if cli_has_target {
        let raw: Vec<String> = cli.pids.clone();
        (raw, cli.command.clone(), origin("pid", "pid", None), None)
    } else {
        let raw = fc
            .pid
            .as_ref()
            .map(|p| p.0.iter().map(i64::to_string).collect())
            .unwrap_or_default();
        let command = fc
            .command
            .as_ref()
            .map(|c| c.iter().map(OsString::from).collect())
            .unwrap_or_default();
        (raw, command, origin("pid", "pid", path), path)
    };

    if !raw_pids.is_empty() && !command.is_empty() {
        return Err(ConfigError::PidWithCommand {
            config_file: from_file.map(Path::to_owned),
        });
    }
    if command.first().is_some_and(|program| program.is_empty()) {
        let opt = match from_file {
            Some(p) => format!("'command' in config file {}", p.display()),
            None => "-- COMMAND".to_owned(),
        };
        return Err(invalid(&opt, "", "expected a program to run"));
    }

    let mut pids = Vec::with_capacity(raw_pids.len());
    for raw in &raw_pids {
        let pid = parse_pid(raw, &pid_origin)?;
        let tgid = process_tgid(pid, &pid_origin)?;
        if !pids.contains(&tgid) {
            pids.push(tgid);
        }
    }
    Ok((pids, command))
}

fn parse_pid(raw: &str, opt: &str) -> Result<u32, ConfigError> {
    match raw.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(invalid(
            opt,
            raw,
            "expected a process ID (a positive integer)",
        )),
    }
}

/// The thread-group id of `pid`, which must exist. A thread id is accepted
/// and mapped to its process rather than refused: /proc resolves thread ids
/// too, tools like `top -H` show them, and the kernel filter works on whole
/// processes, so a tid can only mean "the process of this thread".
fn process_tgid(pid: u32, opt: &str) -> Result<u32, ConfigError> {
    // Lossy: the Name line holds the process's own name, which need not be UTF-8.
    let status = match crate::text::read_proc_text(format!("/proc/{pid}/status")) {
        Ok(status) => status,
        // ESRCH: it exited between the open and the read.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            return Err(ConfigError::NoSuchProcess {
                pid,
                option: opt.to_owned(),
            });
        }
        Err(e) => {
            return Err(ConfigError::ProcessLookup {
                pid,
                option: opt.to_owned(),
                reason: io_reason(&e),
            });
        }
    };
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .ok_or_else(|| ConfigError::ProcessLookup {
            pid,
            option: opt.to_owned(),
            reason: "no Tgid in /proc status".to_owned(),
        })?;
    if tgid != pid {
        tracing::info!(
            tid = pid,
            pid = tgid,
            "thread {pid} belongs to process {tgid}; profiling process {tgid}"
        );
    }
    Ok(tgid)
}

/// The profile types asked for, and those of them asked for at best
/// effort (a trailing `?`).
fn merge_profiles(
    cli: Vec<String>,
    file: Option<ProfileList>,
    path: Option<&Path>,
) -> Result<(Vec<ProfileKind>, Vec<ProfileKind>), ConfigError> {
    let cli = (!cli.is_empty()).then_some(cli);
    let Some((names, opt)) = pick(cli, file.map(|f| f.0), "profiles", "profiles", path) else {
        return Ok((vec![ProfileKind::Cpu], vec![]));
    };
    let mut profiles = Vec::new();
    let mut best_effort = Vec::new();
    for name in &names {
        let name = name.trim();
        let (bare, optional) = match name.strip_suffix('?') {
            Some(bare) => (bare, true),
            None => (name, false),
        };
        let kind: ProfileKind = bare.parse().map_err(|_| {
            invalid(
                &opt,
                name,
                "expected a comma list of cpu, heap, block, mutex, offcpu (each may end in '?')",
            )
        })?;
        if !profiles.contains(&kind) {
            profiles.push(kind);
            if optional {
                best_effort.push(kind);
            }
        } else if !optional {
            // Asked for plainly once: required.
            best_effort.retain(|&k| k != kind);
        }
    }
    if profiles.is_empty() {
        return Err(invalid(&opt, "", "expected at least one profile type"));
    }
    Ok((profiles, best_effort))
}

/// A numeric setting from a flag (a string) or the file (a TOML integer),
/// checked against `range`.
fn number(
    flag_value: Option<String>,
    file_value: Option<u64>,
    (flag, key, path): (&str, &str, Option<&Path>),
    range: std::ops::RangeInclusive<u64>,
    expected: &str,
) -> Result<Option<u64>, ConfigError> {
    let value = match (flag_value, file_value) {
        (Some(raw), _) => {
            let opt = origin(flag, key, None);
            let v = raw
                .trim()
                .parse::<u64>()
                .map_err(|_| invalid(&opt, &raw, expected))?;
            (v, opt)
        }
        (None, Some(v)) => (v, origin(flag, key, path)),
        (None, None) => return Ok(None),
    };
    let (v, opt) = value;
    if !range.contains(&v) {
        return Err(invalid(&opt, v, expected));
    }
    Ok(Some(v))
}

fn parse_duration(raw: &str, opt: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(raw.trim()).map_err(|_| invalid(opt, raw, DURATION_EXPECTED))
}

/// File labels first (sorted by key, as a TOML table has no useful order),
/// then `--label`s in order; a flag replaces a file label with the same key.
fn merge_labels(
    flags: &[String],
    file: Option<BTreeMap<String, String>>,
    path: Option<&Path>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut labels = Vec::new();
    if let Some(table) = file {
        let opt = origin("label", "labels", path);
        for (key, value) in table {
            check_label(&key, &value, &format!("{key} = \"{value}\""), &opt)?;
            labels.push((key, value));
        }
    }
    let file_count = labels.len();
    for raw in flags {
        let Some((key, value)) = raw.split_once('=') else {
            return Err(invalid("--label", raw, "expected KEY=VALUE"));
        };
        check_label(key, value, raw, "--label")?;
        if let Some(i) = labels.iter().position(|(k, _)| k == key) {
            if i >= file_count {
                return Err(invalid(
                    "--label",
                    raw,
                    format!("label '{key}' is given more than once"),
                ));
            }
            labels[i].1 = value.to_owned();
        } else {
            labels.push((key.to_owned(), value.to_owned()));
        }
    }
    Ok(labels)
}

fn check_label(key: &str, value: &str, raw: &str, opt: &str) -> Result<(), ConfigError> {
    let mut chars = key.chars();
    let valid_name = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !valid_name {
        return Err(invalid(
            opt,
            raw,
            "the label name must start with a letter or '_' and contain only letters, \
             digits, '_', '.' and '-'",
        ));
    }
    if RESERVED_LABELS.contains(&key) {
        return Err(invalid(
            opt,
            raw,
            format!(
                "'{key}' is set by profilerd itself (reserved: {})",
                RESERVED_LABELS.join(", ")
            ),
        ));
    }
    // An empty value is almost always an unset shell variable (`env=$ENV`).
    if value.is_empty() {
        return Err(invalid(
            opt,
            raw,
            format!("label '{key}' has an empty value"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod properties;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn parse(args: &[&str]) -> Result<Settings, ConfigError> {
        Settings::parse_from(std::iter::once("profilerd").chain(args.iter().copied()))
    }

    /// Parses, expects an error, checks it is one line and contains `needle`.
    fn error(args: &[&str], needle: &str) -> String {
        let err = match parse(args) {
            Ok(s) => panic!("{args:?} was accepted: {s:?}"),
            Err(e) => e,
        };
        assert!(
            !matches!(err, ConfigError::Help(_)),
            "{args:?} gave help: {err}"
        );
        let msg = err.to_string();
        assert!(
            !msg.contains('\n'),
            "multi-line message for {args:?}: {msg:?}"
        );
        assert!(
            msg.contains(needle),
            "message for {args:?} does not mention {needle:?}: {msg}"
        );
        msg
    }

    fn my_pid() -> String {
        std::process::id().to_string()
    }

    /// A pid that cannot exist: one above the kernel's pid_max.
    fn missing_pid() -> String {
        std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|max| (max + 1).to_string())
            .unwrap_or_else(|| "4000000000".to_owned())
    }

    fn config_file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new()
            .suffix(".toml")
            .tempfile()
            .expect("temp file");
        f.write_all(text.as_bytes()).expect("write temp file");
        f
    }

    fn path_str(f: &tempfile::NamedTempFile) -> &str {
        f.path().to_str().expect("temp path is UTF-8")
    }

    #[test]
    fn defaults() {
        let s = parse(&[]).unwrap();
        assert_eq!(
            s,
            Settings {
                pids: vec![],
                command: vec![],
                profiles: vec![ProfileKind::Cpu],
                best_effort: vec![],
                check: false,
                duration: None,
                interval: Duration::from_secs(60),
                output_dir: PathBuf::from("/var/lib/profilerd"),
                cpu_frequency: 99,
                heap_sample_bytes: 524_288,
                block_rate: Duration::from_micros(10),
                mutex_fraction: 100,
                labels: vec![],
                unwind: UnwindMode::Auto,
                retention: Some(Duration::from_secs(24 * 3600)),
                push: None,
                otlp: None,
                metrics_addr: None,
                limits: MapLimits::default(),
                stack_switches: StackSwitches::default(),
                kernel_log: false,
            }
        );
    }

    #[test]
    fn retention() {
        let r = |args: &[&str]| parse(args).unwrap().retention;
        assert_eq!(r(&["--retention", "2h"]), Some(Duration::from_secs(7200)));
        assert_eq!(r(&["--retention", "off"]), None);
        assert_eq!(r(&["--retention", "0"]), None);
        assert_eq!(r(&["--retention", "0s"]), None);
        // A day-long interval without a retention given keeps every file.
        assert_eq!(r(&["--interval", "24h"]), None);
        assert_eq!(r(&["--interval", "1h"]), Some(Duration::from_secs(86_400)));
        error(&["--retention", "soon"], "--retention");
        error(
            &["--retention", "60s"],
            "the retention must be longer than the interval (1m), or off",
        );
        error(
            &["--interval", "10s", "--retention", "5s"],
            "longer than the interval (10s)",
        );
        let f = config_file("retention = \"3h\"\ninterval = \"10s\"\n");
        assert_eq!(
            r(&["--config", path_str(&f)]),
            Some(Duration::from_secs(3 * 3600))
        );
        assert_eq!(r(&["--config", path_str(&f), "--retention", "off"]), None);
        let f = config_file("retention = \"1s\"\n");
        error(&["--config", path_str(&f)], "'retention' in config file");
    }

    #[test]
    fn unwind_modes() {
        assert_eq!(parse(&["--unwind", "fp"]).unwrap().unwind, UnwindMode::Fp);
        assert_eq!(
            parse(&["--unwind", "dwarf"]).unwrap().unwind,
            UnwindMode::Dwarf
        );
        let f = config_file("unwind = \"dwarf\"\n");
        let s = parse(&["--config", f.path().to_str().unwrap()]).unwrap();
        assert_eq!(s.unwind, UnwindMode::Dwarf);
        let msg = parse(&["--unwind", "lbr"]).unwrap_err().to_string();
        assert_eq!(
            msg,
            "invalid value 'lbr' for --unwind: expected auto, fp or dwarf"
        );
    }

    #[test]
    fn every_flag() {
        let pid = my_pid();
        let s = parse(&[
            "--pid",
            &pid,
            "--profiles",
            "cpu",
            "--duration",
            "5m",
            "--interval",
            "10s",
            "--output-dir",
            "/tmp/out",
            "--cpu-frequency",
            "1000",
            "--heap-sample-bytes",
            "1",
            "--block-rate",
            "1ms",
            "--mutex-fraction",
            "5",
            "--label",
            "env=prod",
            "--label=team=a=b",
        ])
        .unwrap();
        assert_eq!(s.pids, vec![std::process::id()]);
        assert!(s.command.is_empty());
        assert_eq!(s.profiles, vec![ProfileKind::Cpu]);
        assert_eq!(s.duration, Some(Duration::from_secs(300)));
        assert_eq!(s.interval, Duration::from_secs(10));
        assert_eq!(s.output_dir, PathBuf::from("/tmp/out"));
        assert_eq!(s.cpu_frequency, 1000);
        assert_eq!(s.heap_sample_bytes, 1);
        assert_eq!(s.block_rate, Duration::from_millis(1));
        assert_eq!(s.mutex_fraction, 5);
        assert_eq!(
            s.labels,
            vec![
                ("env".to_owned(), "prod".to_owned()),
                ("team".to_owned(), "a=b".to_owned()),
            ]
        );
    }

    #[test]
    fn limits_are_accepted() {
        let s = parse(&[
            "--cpu-frequency",
            "10000",
            "--interval",
            "1s",
            "--duration",
            "1ns",
        ])
        .unwrap();
        assert_eq!(s.cpu_frequency, 10_000);
        assert_eq!(s.interval, Duration::from_secs(1));
        assert_eq!(s.duration, Some(Duration::from_nanos(1)));
        assert_eq!(parse(&["--cpu-frequency", "1"]).unwrap().cpu_frequency, 1);
    }

    #[test]
    fn pids_comma_separated_and_repeated_are_deduplicated() {
        let me = my_pid();
        let init = "1";
        let list = format!("{me},{init}");
        let s = parse(&["--pid", &list, "--pid", &me, "--pid", init]).unwrap();
        assert_eq!(s.pids, vec![std::process::id(), 1]);
        let s = parse(&["--pid", init, "--pid", &me]).unwrap();
        assert_eq!(s.pids, vec![1, std::process::id()]);
    }

    #[test]
    fn thread_id_maps_to_its_process() {
        let (tid, result) = std::thread::spawn(|| {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            (tid, parse(&["--pid", &tid.to_string()]))
        })
        .join()
        .unwrap();
        assert_ne!(tid as u32, std::process::id());
        assert_eq!(result.unwrap().pids, vec![std::process::id()]);
    }

    #[test]
    fn command_after_double_dash() {
        let s = parse(&["--interval", "5s", "--", "sleep", "--pid", "1", "-x", "--"]).unwrap();
        let expected: Vec<OsString> = ["sleep", "--pid", "1", "-x", "--"]
            .into_iter()
            .map(OsString::from)
            .collect();
        assert_eq!(s.command, expected);
        assert!(s.pids.is_empty());
        assert_eq!(s.interval, Duration::from_secs(5));
    }

    #[test]
    fn command_keeps_non_utf8_arguments() {
        use std::os::unix::ffi::OsStringExt;
        let odd = OsString::from_vec(vec![b'a', 0xff]);
        let args: Vec<OsString> = vec!["profilerd".into(), "--".into(), "cat".into(), odd.clone()];
        let s = Settings::parse_from(args).unwrap();
        assert_eq!(s.command, vec![OsString::from("cat"), odd]);
    }

    #[test]
    fn profiles_are_deduplicated() {
        let s = parse(&["--profiles", "cpu,cpu", "--profiles", " cpu"]).unwrap();
        assert_eq!(s.profiles, vec![ProfileKind::Cpu]);
    }

    #[test]
    fn a_question_mark_asks_for_best_effort() {
        let s = parse(&["--profiles", "cpu,heap?,offcpu?", "--check"]).unwrap();
        assert_eq!(
            s.profiles,
            vec![ProfileKind::Cpu, ProfileKind::Heap, ProfileKind::Offcpu]
        );
        assert_eq!(s.best_effort, vec![ProfileKind::Heap, ProfileKind::Offcpu]);
        assert!(s.check);
        // Asked for plainly as well: required.
        let s = parse(&["--profiles", "heap?,heap"]).unwrap();
        assert_eq!(
            (s.profiles, s.best_effort),
            (vec![ProfileKind::Heap], vec![])
        );
        error(&["--profiles", "heap??"], "'heap??'");
        error(&["--profiles", "?"], "'?'");
    }

    #[test]
    fn help_and_version() {
        for flag in ["--help", "-h"] {
            match parse(&[flag]) {
                Err(ConfigError::Help(text)) => {
                    assert!(text.contains("--cpu-frequency"), "{text}");
                    assert!(text.contains("Usage: profilerd"), "{text}");
                }
                other => panic!("{flag}: {other:?}"),
            }
        }
        match parse(&["--version"]) {
            Err(ConfigError::Help(text)) => {
                assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}")
            }
            other => panic!("--version: {other:?}"),
        }
    }

    #[test]
    fn usage_errors_are_one_line() {
        error(&["--frobnicate"], "--frobnicate");
        error(&["stray"], "stray");
        error(&["--duration"], "--duration");
        error(&["--interval", "1s", "--interval", "2s"], "--interval");
    }

    #[test]
    fn bad_durations() {
        let msg = error(&["--duration", "abc"], "--duration");
        assert_eq!(
            msg,
            "invalid value 'abc' for --duration: expected a duration like 30s, 5m or 1h"
        );
        error(&["--duration", "30"], "'30'");
        error(&["--duration", "0s"], "'0s'");
        error(&["--interval", "0s"], "--interval");
        error(&["--interval", "999ms"], "'999ms'");
        error(&["--interval", "-5s"], "-5");
        error(&["--duration", "--pid", "1"], "--duration");
        error(&["--block-rate", "0ns"], "--block-rate");
        error(&["--block-rate", "fast"], "'fast'");
    }

    #[test]
    fn bad_numbers() {
        error(&["--cpu-frequency", "0"], "--cpu-frequency");
        error(&["--cpu-frequency", "10001"], "'10001'");
        error(&["--cpu-frequency", "99hz"], "'99hz'");
        error(&["--cpu-frequency", "-1"], "'-1' for --cpu-frequency");
        error(&["--heap-sample-bytes", "0"], "--heap-sample-bytes");
        error(&["--heap-sample-bytes", "512k"], "'512k'");
        error(&["--mutex-fraction", "0"], "--mutex-fraction");
        error(&["--mutex-fraction", "1.5"], "'1.5'");
        error(&["--output-dir", ""], "--output-dir");
    }

    #[test]
    fn bad_pids() {
        let missing = missing_pid();
        let msg = error(&["--pid", &missing], &missing);
        assert_eq!(
            msg,
            format!("process {missing} given with --pid does not exist")
        );
        error(&["--pid", "4000000000"], "4000000000");
        error(&["--pid", "abc"], "'abc'");
        error(&["--pid", "0"], "'0'");
        error(&["--pid", "-3"], "'-3' for --pid");
        let me = my_pid();
        error(&["--pid", &format!("{me},,{me}")], "--pid");
        error(&["--pid", &format!("{me},{missing}")], &missing);
    }

    #[test]
    fn pid_with_command_is_an_error() {
        let msg = error(&["--pid", &my_pid(), "--", "sleep", "1"], "--pid");
        assert!(msg.contains("COMMAND"), "{msg}");
        error(&["--", ""], "COMMAND");
    }

    #[test]
    fn bad_profiles() {
        error(&["--profiles", "cpu,gpu"], "'gpu'");
        error(&["--profiles", "cpu,"], "--profiles");
        error(&["--profiles", ""], "--profiles");
    }

    #[test]
    fn bad_labels() {
        error(&["--label", "novalue"], "'novalue'");
        error(&["--label", "=x"], "'=x'");
        error(&["--label", "1abc=x"], "'1abc=x'");
        error(&["--label", "a b=x"], "'a b=x'");
        error(&["--label", "env="], "'env='");
        for reserved in RESERVED_LABELS {
            error(&["--label", &format!("{reserved}=x")], reserved);
        }
        error(&["--label", "a=1", "--label", "a=2"], "'a=2'");
        let s = parse(&["--label", "_a.b-c=1", "--label", "Z9=2"]).unwrap();
        assert_eq!(s.labels.len(), 2);
    }

    #[test]
    fn config_file_values() {
        let f = config_file(&format!(
            r#"
pid = {}
profiles = "cpu"
duration = "1h"
interval = "30s"
output_dir = "/tmp/profiles"
cpu_frequency = 49
heap_sample_bytes = 4096
block_rate = "1us"
mutex_fraction = 10

[labels]
env = "prod"
region = "eu"
"#,
            std::process::id()
        ));
        let s = parse(&["--config", path_str(&f)]).unwrap();
        assert_eq!(s.pids, vec![std::process::id()]);
        assert_eq!(s.profiles, vec![ProfileKind::Cpu]);
        assert_eq!(s.duration, Some(Duration::from_secs(3600)));
        assert_eq!(s.interval, Duration::from_secs(30));
        assert_eq!(s.output_dir, PathBuf::from("/tmp/profiles"));
        assert_eq!(s.cpu_frequency, 49);
        assert_eq!(s.heap_sample_bytes, 4096);
        assert_eq!(s.block_rate, Duration::from_micros(1));
        assert_eq!(s.mutex_fraction, 10);
        assert_eq!(
            s.labels,
            vec![
                ("env".to_owned(), "prod".to_owned()),
                ("region".to_owned(), "eu".to_owned()),
            ]
        );
    }

    #[test]
    fn config_file_lists_and_command() {
        let f = config_file(&format!(
            "pid = [{0}, 1, {0}]\nprofiles = [\"cpu\", \"cpu\"]\n[label]\nk = \"v\"\n",
            std::process::id()
        ));
        let s = parse(&["--config", path_str(&f)]).unwrap();
        assert_eq!(s.pids, vec![std::process::id(), 1]);
        assert_eq!(s.profiles, vec![ProfileKind::Cpu]);
        assert_eq!(s.labels, vec![("k".to_owned(), "v".to_owned())]);

        let f = config_file("command = [\"sleep\", \"10\"]\n");
        let s = parse(&["--config", path_str(&f)]).unwrap();
        assert_eq!(
            s.command,
            vec![OsString::from("sleep"), OsString::from("10")]
        );
    }

    #[test]
    fn flags_override_config_file() {
        let f = config_file(
            "command = [\"sleep\", \"10\"]\ninterval = \"30s\"\ncpu_frequency = 49\n\
             output_dir = \"/tmp/a\"\n[labels]\nenv = \"prod\"\nregion = \"eu\"\n",
        );
        let me = my_pid();
        let s = parse(&[
            "--config",
            path_str(&f),
            "--interval",
            "2m",
            "--pid",
            &me,
            "--output-dir",
            "/tmp/b",
            "--label",
            "env=dev",
            "--label",
            "zone=z1",
        ])
        .unwrap();
        // The command line's target (--pid) replaces the file's command.
        assert_eq!(s.pids, vec![std::process::id()]);
        assert!(s.command.is_empty());
        assert_eq!(s.interval, Duration::from_secs(120));
        assert_eq!(s.cpu_frequency, 49);
        assert_eq!(s.output_dir, PathBuf::from("/tmp/b"));
        assert_eq!(
            s.labels,
            vec![
                ("env".to_owned(), "dev".to_owned()),
                ("region".to_owned(), "eu".to_owned()),
                ("zone".to_owned(), "z1".to_owned()),
            ]
        );

        let s = parse(&["--config", path_str(&f), "--", "true"]).unwrap();
        assert_eq!(s.command, vec![OsString::from("true")]);
    }

    #[test]
    fn limits_table() {
        let f = config_file("[limits]\nstack_samples_bytes = 4096\ncounts_entries = 8\n");
        let limits = parse(&["--config", path_str(&f)]).unwrap().limits;
        assert_eq!(limits.stack_samples_bytes, 4096);
        assert_eq!(limits.counts_entries, 8);
        assert_eq!(
            limits.heap_live_entries,
            MapLimits::default().heap_live_entries
        );

        let f = config_file("[limits]\nwait_events_bytes = 5000\n");
        let msg = error(
            &["--config", path_str(&f)],
            "'limits.wait_events_bytes' in config file",
        );
        assert!(
            msg.contains("'5000'") && msg.contains("power of two"),
            "{msg}"
        );
        let f = config_file("[limits]\ncounts_entries = 0\n");
        error(&["--config", path_str(&f)], "'limits.counts_entries'");
        let f = config_file("[limits]\nring = 4096\n");
        error(&["--config", path_str(&f)], "unknown key 'ring'");
    }

    #[test]
    fn debug_table() {
        let plain = parse(&[]).unwrap();
        assert!(!plain.kernel_log);
        let f = config_file("[debug]\nkernel_log = true\nstack_tops = false\n");
        let s = parse(&["--config", path_str(&f)]).unwrap();
        assert!(s.kernel_log);
        assert!(!s.stack_switches.stack_tops);
        assert!(s.stack_switches.brief_records);
    }

    #[test]
    fn config_file_errors() {
        let msg = error(&["--config", "/nonexistent/x.toml"], "/nonexistent/x.toml");
        assert_eq!(
            msg,
            "cannot read config file /nonexistent/x.toml: No such file or directory"
        );

        let f = config_file("interval = \"30s\"\n\nfoo = 1\n");
        let msg = error(&["--config", path_str(&f)], "'foo'");
        assert!(msg.starts_with(&format!("config file {}: unknown key 'foo'", path_str(&f))));
        assert!(msg.ends_with("(line 3)"), "{msg}");

        let f = config_file("interval = \n");
        error(&["--config", path_str(&f)], "(line 1)");
        let f = config_file("cpu_frequency = \"fast\"\n");
        error(&["--config", path_str(&f)], "(line 1)");
        let f = config_file("cpu_frequency = -1\n");
        error(&["--config", path_str(&f)], path_str(&f));
        let f = config_file("pid = \"12\"\n");
        error(&["--config", path_str(&f)], "process ID");

        let f = config_file("interval = \"0s\"\n");
        let msg = error(&["--config", path_str(&f)], "'interval' in config file");
        assert!(msg.contains("'0s'"), "{msg}");
        let f = config_file("cpu_frequency = 20000\n");
        error(&["--config", path_str(&f)], "'20000'");
        let f = config_file("profiles = \"cpu,gpu\"\n");
        error(&["--config", path_str(&f)], "'gpu'");
        let f = config_file(&format!("pid = {}\n", missing_pid()));
        error(&["--config", path_str(&f)], "'pid' in config file");
        let f = config_file(&format!("pid = {}\ncommand = [\"ls\"]\n", my_pid()));
        error(&["--config", path_str(&f)], "'command'");
        let f = config_file("[labels]\ncomm = \"x\"\n");
        error(&["--config", path_str(&f)], "comm");
        let f = config_file("[labels]\n\"a b\" = \"x\"\n");
        error(&["--config", path_str(&f)], "a b");

        let dir = tempfile::tempdir().expect("temp dir");
        error(
            &["--config", dir.path().to_str().expect("UTF-8")],
            "cannot read config file",
        );
    }

    #[test]
    fn config_file_errors_name_the_key_and_line() {
        let f = config_file("interval = \"30s\"\ncpu_frequency = \"fast\"\n");
        let msg = error(&["--config", path_str(&f)], "key 'cpu_frequency'");
        assert!(msg.ends_with("(line 2)"), "{msg}");
        let f = config_file("[labels]\nenv = 3\n");
        let msg = error(&["--config", path_str(&f)], "key 'labels.env'");
        assert!(msg.ends_with("(line 2)"), "{msg}");
        let f = config_file("\n\ninterval = 5\n");
        let msg = error(&["--config", path_str(&f)], "key 'interval'");
        assert!(msg.ends_with("(line 3)"), "{msg}");
        // A string value with a newline escape stays on one line.
        let f = config_file("cpu_frequency = \"a\\nb\"\n");
        error(&["--config", path_str(&f)], "cpu_frequency");

        let mut f = config_file("interval = \"30s\"\n# caf");
        f.write_all(b"\xe9\n").expect("write");
        let msg = error(&["--config", path_str(&f)], "not UTF-8 text");
        assert!(msg.contains("line 2"), "{msg}");

        let big = "# padding\n".repeat(120_000);
        let f = config_file(&big);
        error(&["--config", path_str(&f)], "larger than 1024 KiB");
    }

    #[test]
    fn push_url_and_metrics_addr() {
        let s = parse(&[]).unwrap();
        assert_eq!((s.push, s.metrics_addr), (None, None));
        let s = parse(&[
            "--push-url",
            "http://localhost:4040",
            "--metrics-addr",
            "127.0.0.1:9464",
        ])
        .unwrap();
        assert_eq!(
            s.push.map(|p| p.url).as_deref(),
            Some("http://localhost:4040/push.v1.PusherService/Push")
        );
        assert_eq!(s.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        let f = config_file(
            "push_url = \"https://p.example/x\"\nmetrics_addr = \"[::]:0\"\n\
             [push]\ntenant = \"t1\"\n",
        );
        let s = parse(&["--config", path_str(&f)]).unwrap();
        let push = s.push.unwrap();
        assert_eq!(push.url, "https://p.example/x/push.v1.PusherService/Push");
        assert_eq!(push.tenant.as_deref(), Some("t1"));
        assert_eq!(s.metrics_addr, Some("[::]:0".parse().unwrap()));

        error(&["--push-url", "ftp://x/"], "'ftp://x/' for --push-url");
        error(&["--push-url", "localhost:4040"], "--push-url");
        error(&["--push-url", "http://"], "--push-url");
        // A password in the URL is not echoed.
        let e = parse(&["--push-url", "ftp://u:hunter2@x/"]).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let f = config_file("push_url = \"http://h\"\n[push]\ntenant = \"a b\"\n");
        error(&["--config", path_str(&f)], "'push.tenant' in config file");
        // Every window would be too old for the server.
        error(
            &["--push-url", "http://h", "--interval", "2h"],
            "'push.reject_older_than'",
        );
        error(
            &["--metrics-addr", "localhost"],
            "'localhost' for --metrics-addr",
        );
        error(&["--metrics-addr", "127.0.0.1:99999"], "--metrics-addr");
        let f = config_file("metrics_addr = \"nope\"\n");
        error(&["--config", path_str(&f)], "'metrics_addr' in config file");
    }

    #[test]
    fn config_file_overridden_value_is_not_checked() {
        // The flag wins and the file's value is never used, so it is not
        // range-checked; TOML-level errors (types, unknown keys) still are.
        let f = config_file("interval = \"0s\"\n");
        let s = parse(&["--config", path_str(&f), "--interval", "5s"]).unwrap();
        assert_eq!(s.interval, Duration::from_secs(5));
    }
}
