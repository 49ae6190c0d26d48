//! The command line, as clap parses it (`profilerd --help`).

use super::*;

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
pub(super) struct Cli {
    /// Profile only these processes and their threads (repeatable or
    /// comma-separated) [default: all processes]
    #[arg(
        long = "pid",
        value_name = "PID",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    pub(super) pids: Vec<String>,

    /// Comma list of cpu, heap, block, mutex, offcpu; a trailing '?'
    /// (heap?) skips that type where the kernel cannot run it [default: cpu]
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub(super) profiles: Vec<String>,

    /// Print, for this kernel, whether each profile type is ready, degraded
    /// or unavailable (and what it needs), then exit: 0 when every
    /// requested type can run
    #[arg(long)]
    pub(super) check: bool,

    /// Stop after DUR (30s, 5m, 1h) [default: run until signalled]
    #[arg(long, value_name = "DUR")]
    pub(super) duration: Option<String>,

    /// How often profiles are written [default: 60s]
    #[arg(long, value_name = "DUR")]
    pub(super) interval: Option<String>,

    /// Where profiles go, created if missing [default: /var/lib/profilerd]
    #[arg(long, value_name = "DIR")]
    pub(super) output_dir: Option<PathBuf>,

    /// CPU-clock samples per second per CPU, 1 to 10000 [default: 99]
    #[arg(long, value_name = "HZ", allow_negative_numbers = true)]
    pub(super) cpu_frequency: Option<String>,

    /// Mean bytes between heap samples; 1 records every allocation
    /// [default: 524288]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) heap_sample_bytes: Option<String>,

    /// Go programs whose runtime samples no allocations (they link no heap
    /// profiler): report (say why their heap profile is empty) or force
    /// (set their runtime.MemProfileRate to --heap-sample-bytes, a write
    /// into the process) [default: report]
    #[arg(long, value_name = "MODE")]
    pub(super) go_heap_sampling: Option<String>,

    /// Block and off-CPU sampling rate [default: 10us]
    #[arg(long, value_name = "DUR")]
    pub(super) block_rate: Option<String>,

    /// Record 1 in N contended wake-ups [default: 100]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) mutex_fraction: Option<String>,

    /// Static label added to every sample (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub(super) labels: Vec<String>,

    /// How user stacks are unwound: auto, fp (frame pointers) or dwarf
    /// (.eh_frame) [default: auto]
    #[arg(long, value_name = "MODE")]
    pub(super) unwind: Option<String>,

    /// Delete own profile files older than DUR; off (or 0) keeps all
    /// [default: 24h]
    #[arg(long, value_name = "DUR")]
    pub(super) retention: Option<String>,

    /// TOML file with the same keys in snake_case; flags override it
    #[arg(long, value_name = "FILE")]
    pub(super) config: Option<PathBuf>,

    /// Also send every profile to this Pyroscope server (its base URL; the
    /// push API, series and auth set in the config file's [push] table)
    #[arg(long, value_name = "URL")]
    pub(super) push_url: Option<String>,

    /// Also export every profile as OpenTelemetry profiles to this OTLP/HTTP
    /// receiver (its base URL; /v1development/profiles is added). Alpha, as
    /// the signal is: the format may change between releases
    #[arg(long, value_name = "URL")]
    pub(super) otlp_endpoint: Option<String>,

    /// Serve Prometheus metrics at http://ADDR:PORT/metrics
    #[arg(long, value_name = "ADDR:PORT")]
    pub(super) metrics_addr: Option<String>,

    /// Serve CPU profiles on demand at http://ADDR:PORT/debug/pprof/ (go
    /// tool pprof http://ADDR:PORT/debug/pprof/profile?seconds=10&pid=PID),
    /// and /metrics
    #[arg(long, value_name = "ADDR:PORT")]
    pub(super) http_addr: Option<String>,

    /// With --http-addr: require `Authorization: Bearer TOKEN`, TOKEN the
    /// file's text, on every path (/metrics too, unless
    /// --http-metrics-without-token)
    #[arg(long, value_name = "PATH")]
    pub(super) http_token_file: Option<std::path::PathBuf>,

    /// With --http-token-file: serve /metrics without the token
    #[arg(long)]
    pub(super) http_metrics_without_token: bool,

    /// Command to start once every probe is attached; profiled with its
    /// descendants until it exits
    #[arg(last = true, value_name = "COMMAND")]
    pub(super) command: Vec<OsString>,
}
