//! Command line and config file: turns argv (and an optional TOML file named
//! by `--config`) into validated [`Settings`], per docs/SPEC.md, "Command line".
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
//! [push]                      # series, limits, tenant and auth of the push (config/push.rs)
//! tenant = "team-a"
//!
//! [otlp]                      # service name, auth, headers of the OTLP export (config/otlp.rs)
//! headers = { "X-Scope-OrgID" = "team-a" }
//!
//! [limits]                    # sizes of the kernel maps (config/limits.rs); file only
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

mod cli;
mod file;
pub mod limits;
mod merge;
pub mod otlp;
pub mod push;
pub mod stack_switches;

use cli::Cli;
use file::read_config_file;
use merge::merge;

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

use crate::config::limits::{LimitsTable, MapLimits};
use crate::config::stack_switches::{DebugTable, StackSwitches};
use crate::model::profile_kind::ProfileKind;
use otlp::{OtlpSettings, OtlpTable};
use push::{PushSettings, PushTable};

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
    /// What is done with Go programs whose runtime samples nothing.
    pub go_heap_sampling: GoHeapSampling,
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
    /// Where `/debug/pprof/` is served (and `/metrics`, at the same
    /// address): `--http-addr`.
    pub http_addr: Option<std::net::SocketAddr>,
    /// The token every request to `--http-addr` must carry as `Bearer`
    /// (`--http-token-file`; none: no token asked).
    pub http_token: Option<push::Secret>,
    /// `/metrics` is served without the token (`--http-metrics-without-token`).
    pub http_metrics_without_token: bool,
    /// Sizes of the kernel maps (`[limits]` in the config file).
    pub limits: MapLimits,
    /// Which stack optimizations are on (`[debug]` in the config file).
    pub stack_switches: StackSwitches,
    /// The eBPF programs' diagnostics are logged (`[debug] kernel_log`;
    /// `PROFILERD_LOG=debug` turns them on too, see kernel_log.rs).
    pub kernel_log: bool,
}

/// What is done with a Go program whose runtime samples no allocations
/// (`runtime.MemProfileRate` 0: it links no heap profiler, or set the rate
/// to 0): `--go-heap-sampling`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GoHeapSampling {
    /// Leave the program as it is, and say why its heap profile is empty
    /// (the log, the counters, the profile's comments).
    #[default]
    Report,
    /// Set its `runtime.MemProfileRate` to `--heap-sample-bytes`: a write
    /// into the process's memory, so only when asked for.
    Force,
}

impl std::str::FromStr for GoHeapSampling {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "report" => Ok(GoHeapSampling::Report),
            "force" => Ok(GoHeapSampling::Force),
            _ => Err(()),
        }
    }
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
    crate::model::text::escape_controls(text).into_owned()
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
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
                go_heap_sampling: GoHeapSampling::Report,
                block_rate: Duration::from_micros(10),
                mutex_fraction: 100,
                labels: vec![],
                unwind: UnwindMode::Auto,
                retention: Some(Duration::from_secs(24 * 3600)),
                push: None,
                otlp: None,
                metrics_addr: None,
                http_addr: None,
                http_token: None,
                http_metrics_without_token: false,
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
    fn go_heap_sampling_is_report_unless_forced() {
        assert_eq!(parse(&[]).unwrap().go_heap_sampling, GoHeapSampling::Report);
        let s = parse(&["--go-heap-sampling", "force"]).unwrap();
        assert_eq!(s.go_heap_sampling, GoHeapSampling::Force);
        error(&["--go-heap-sampling", "always"], "'always'");
        let f = config_file("go_heap_sampling = \"force\"\n");
        let s = parse(&["--config", path_str(&f)]).unwrap();
        assert_eq!(s.go_heap_sampling, GoHeapSampling::Force);
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
    fn http_addr_serves_metrics_too() {
        let s = parse(&["--http-addr", "127.0.0.1:6060"]).unwrap();
        let addr = Some("127.0.0.1:6060".parse().unwrap());
        assert_eq!((s.http_addr, s.metrics_addr), (addr, addr));
        let s = parse(&[
            "--http-addr",
            "127.0.0.1:6060",
            "--metrics-addr",
            "127.0.0.1:6060",
        ])
        .unwrap();
        assert_eq!((s.http_addr, s.metrics_addr), (addr, addr));
        // --metrics-addr alone serves no profiles.
        let s = parse(&["--metrics-addr", "127.0.0.1:9464"]).unwrap();
        assert_eq!(s.http_addr, None);
        error(
            &[
                "--http-addr",
                "127.0.0.1:6060",
                "--metrics-addr",
                "127.0.0.1:9464",
            ],
            "the same address as --http-addr",
        );
        error(&["--http-addr", "nope"], "'nope' for --http-addr");
        let f = config_file("http_addr = \"[::1]:0\"\n");
        let s = parse(&["--config", path_str(&f)]).unwrap();
        assert_eq!(s.http_addr, Some("[::1]:0".parse().unwrap()));
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
