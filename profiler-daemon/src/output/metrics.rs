//! The daemon's own metrics and the `/metrics` endpoint (`--metrics-addr`):
//! Prometheus text exposition format 0.0.4, every name prefixed with
//! `profilerd_`.
//!
//! The session updates the metrics as it works (profiles written) and
//! mirrors its counters into them after every drain (kernel counters, lost
//! events, symbolization, process table); the push's and the OTLP export's
//! counters, their queue lengths, the resident memory and the BPF maps' memory are read at each
//! scrape. Counters
//! that mirror a total kept elsewhere only ever move forward.
//!
//! Serving is hyper's HTTP/1 server (already built for the push client),
//! with at most [`MAX_CONNECTIONS`] connections at once, each closed after
//! [`CONNECTION_TIMEOUT`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use profiler_common::counter;
use prometheus::{
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TEXT_FORMAT,
    TextEncoder,
};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::model::profile_kind::ProfileKind;
use crate::output::pprof_http::{self, CAPTURE_CONNECTION_TIMEOUT, PprofServer, reply};
use crate::output::push::PushStats;
use crate::procs::go_heap_rate::GoHeapRateStats;

/// Scrapes served at once; more connections are closed at accept.
pub const MAX_CONNECTIONS: usize = 8;
/// A connection's whole life; a scrape takes milliseconds.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Kernel counters that count work done, as `event` labels of
/// `profilerd_bpf_events_total`.
const BPF_EVENTS: [(u32, &str); 8] = [
    (counter::SAMPLES, "cpu_samples"),
    (counter::STACK_SAMPLES, "stack_copies"),
    (counter::HEAP_SAMPLES, "heap_samples"),
    (counter::FUTEX_WAITS, "futex_waits"),
    (counter::OFFCPU_SWITCHES, "offcpu_switches"),
    (counter::FORKS_FOLLOWED, "forks_followed"),
    // Wait and off-CPU records sent with a remembered walk's frames, and
    // hints found replaced while read (a full record was sent instead).
    (counter::BRIEF_RECORDS, "brief_records"),
    (counter::HINTS_TORN, "walk_hints_torn"),
];

/// Kernel counters of losses, as (`map`, `lost`) labels of
/// `profilerd_bpf_dropped_total`: the map or ring that was full (or the
/// stack walk), and what was lost.
const BPF_DROPS: [(u32, &str, &str); 17] = [
    (counter::ANCHORS_LOST, "proc_events", "image_anchors"),
    (counter::COUNTS_FULL, "counts", "cpu_samples"),
    (counter::USER_STACK_LOST, "stacks", "user_stacks"),
    (counter::KERNEL_STACK_LOST, "stacks", "kernel_stacks"),
    (counter::PROC_EVENTS_LOST, "proc_events", "process_events"),
    (counter::TARGETS_FULL, "targets", "descendants"),
    // Not lost: such a sample falls back to a frame-pointer stack.
    (counter::STACK_SAMPLES_FULL, "stack_samples", "stack_copies"),
    // Not lost: such an interval keeps the usual, shorter copy.
    (
        counter::OFFCPU_DEEP_FULL,
        "offcpu_deep_stacks",
        "long_copies",
    ),
    (counter::HEAP_ALLOCS_LOST, "heap_events", "allocations"),
    (counter::HEAP_FREES_LOST, "heap_events", "frees"),
    (counter::HEAP_LIVE_FULL, "heap_live", "live_allocations"),
    (counter::HEAP_THREADS_FULL, "heap_threads", "thread_states"),
    (counter::WAIT_EVENTS_LOST, "wait_events", "wait_events"),
    (counter::FUTEX_CALLS_FULL, "futex_calls", "futex_calls"),
    (
        counter::OFFCPU_PARKED_FULL,
        "offcpu_parked",
        "offcpu_switches",
    ),
    // Kernel diagnostics over their rate limit (`[debug] kernel_log`).
    (counter::KERNEL_LOGS_DROPPED, "kernel_log", "log_lines"),
    // The samples keep their stacks, without their labels.
    (
        counter::GO_LABEL_SETS_FULL,
        "go_label_sets",
        "go_label_sets",
    ),
];

/// What the session mirrors into the metrics after a drain.
#[derive(Debug, Default)]
pub struct Observed {
    /// The kernel's `COUNTERS`, summed over CPUs.
    /// (A vector: arrays longer than 32 have no `Default`.)
    pub kernel: Vec<u64>,
    /// Frames that found no symbol.
    pub symbolization_failures: u64,
    /// User stacks whose unwinding stopped before the root.
    pub unwinds_truncated: u64,
    /// Uprobe links that could not be made.
    pub attach_errors: u64,
    /// Processes with metadata kept now.
    pub processes: u64,
    pub process_snapshots: u64,
    pub process_snapshot_failures: u64,
    /// Each cache drawing on the memory budget: its name, the bytes it
    /// holds now and the entries it dropped so far.
    pub caches: Vec<(&'static str, u64, u64)>,
    /// `[limits] memory_bytes`.
    pub cache_budget_bytes: u64,
    /// Go processes by what their heap sampling rate was found to be.
    pub go_heaps: GoHeapRateStats,
}

/// The outcomes of `profilerd_go_heap_processes_total`.
const GO_HEAP_OUTCOMES: [&str; 4] = ["unsampled", "forced", "force_failed", "rate_assumed"];

/// Why the metrics could not be set up or served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot register metric: {0}")]
    Register(#[from] prometheus::Error),
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    samples: IntCounterVec,
    files: IntCounterVec,
    bytes: IntCounterVec,
    write_errors: IntCounterVec,
    bpf_events: IntCounterVec,
    bpf_dropped: IntCounterVec,
    symbolization_failures: IntCounter,
    unwinds_truncated: IntCounter,
    attach_errors: IntCounter,
    processes: IntGauge,
    process_snapshots: IntCounter,
    process_snapshot_failures: IntCounter,
    push: SinkMetrics,
    otlp: SinkMetrics,
    resident: IntGauge,
    heap: IntGauge,
    bpf_memory: IntGauge,
    bpf_map_bytes: IntGaugeVec,
    unavailable: IntGaugeVec,
    cache_bytes: IntGaugeVec,
    cache_evictions: IntCounterVec,
    cache_budget: IntGauge,
    go_heaps: IntCounterVec,
}

/// The metrics of one sink (the push, the OTLP export), named
/// `profilerd_<sink>_*`, and the counters they are read from at a scrape.
struct SinkMetrics {
    sent: IntCounter,
    failed: IntCounter,
    dropped: IntCounterVec,
    queue: IntGauge,
    too_large: IntCounter,
    /// For a protocol with partial successes (OTLP).
    refused: Option<IntCounter>,
    stats: std::sync::Mutex<Option<Arc<PushStats>>>,
}

impl SinkMetrics {
    /// Registers the metrics of the sink `name`, whose uploads are
    /// `what` (for the help texts), whose size limit is `limit`, and whose
    /// server may take part of a request (`partial`).
    fn new(
        registry: &Registry,
        name: &str,
        what: &str,
        limit: &str,
        partial: bool,
    ) -> Result<SinkMetrics, prometheus::Error> {
        let register = |c: Box<dyn prometheus::core::Collector>| registry.register(c);
        let counter = |suffix: &str, help: String| {
            let c = IntCounter::new(format!("profilerd_{name}_{suffix}"), help)?;
            register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let dropped = IntCounterVec::new(
            Opts::new(
                format!("profilerd_{name}_dropped_total"),
                format!(
                    "{what} not sent, by reason (queue_full, rejected, retries, too_old, shutdown)."
                ),
            ),
            &["reason"],
        )?;
        register(Box::new(dropped.clone()))?;
        for reason in crate::output::push::queue::DROP_REASONS {
            dropped.with_label_values(&[reason]);
        }
        let queue = IntGauge::new(
            format!("profilerd_{name}_queue_length"),
            format!("{what} waiting to be sent, the one being sent included."),
        )?;
        register(Box::new(queue.clone()))?;
        Ok(SinkMetrics {
            sent: counter("sent_total", format!("{what} the endpoint accepted."))?,
            failed: counter(
                "failed_total",
                "Requests that failed (connection, timeout or an error answer).".to_owned(),
            )?,
            dropped,
            queue,
            too_large: counter(
                "samples_too_large_total",
                format!("Samples left out, over {limit}."),
            )?,
            refused: match partial {
                true => Some(counter(
                    "refused_profiles_total",
                    "Profiles the endpoint refused in requests it accepted (partial success)."
                        .to_owned(),
                )?),
                false => None,
            },
            stats: std::sync::Mutex::new(None),
        })
    }

    fn watch(&self, stats: Arc<PushStats>) {
        if let Ok(mut watched) = self.stats.lock() {
            *watched = Some(stats);
        }
    }

    /// Reads the sink's counters now.
    fn read(&self) {
        let Some(stats) = self.stats.lock().ok().and_then(|p| p.clone()) else {
            return;
        };
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        mirror(&self.sent, get(&stats.sent));
        mirror(&self.failed, get(&stats.failed_requests));
        for (reason, value) in stats.dropped_reasons() {
            mirror(&self.dropped.with_label_values(&[reason]), value);
        }
        self.queue.set(get(&stats.queued) as i64);
        mirror(&self.too_large, get(&stats.samples_too_large));
        if let Some(refused) = &self.refused {
            mirror(refused, get(&stats.refused_items));
        }
    }
}

impl Metrics {
    pub fn new() -> Result<Metrics, MetricsError> {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let metrics = Metrics {
            samples: counter_vec(
                "profilerd_samples_total",
                "Samples (pprof sample entries) in the profiles written, by profile type.",
                &["type"],
            )?,
            files: counter_vec(
                "profilerd_files_written_total",
                "Profile files written, by profile type.",
                &["type"],
            )?,
            bytes: counter_vec(
                "profilerd_written_bytes_total",
                "Bytes of profile files written (gzipped), by profile type.",
                &["type"],
            )?,
            write_errors: counter_vec(
                "profilerd_write_errors_total",
                "Profiles that could not be written, by profile type.",
                &["type"],
            )?,
            bpf_events: counter_vec(
                "profilerd_bpf_events_total",
                "Events the eBPF programs recorded, by kind.",
                &["event"],
            )?,
            bpf_dropped: counter_vec(
                "profilerd_bpf_dropped_total",
                "Records the eBPF programs lost, by the map or ring that was full and what was lost.",
                &["map", "lost"],
            )?,
            symbolization_failures: counter(
                "profilerd_symbolization_failures_total",
                "Frames that could not be symbolized.",
            )?,
            unwinds_truncated: counter(
                "profilerd_unwinds_truncated_total",
                "User stacks whose unwinding stopped before the thread's root.",
            )?,
            attach_errors: counter(
                "profilerd_attach_errors_total",
                "Uprobe links (allocator or Go runtime probes) that could not be attached.",
            )?,
            processes: gauge(
                "profilerd_processes",
                "Processes whose metadata the daemon keeps now.",
            )?,
            process_snapshots: counter(
                "profilerd_process_snapshots_total",
                "Snapshots of process mappings taken.",
            )?,
            process_snapshot_failures: counter(
                "profilerd_process_snapshot_failures_total",
                "Snapshots of process mappings that failed.",
            )?,
            push: SinkMetrics::new(
                &registry,
                "push",
                "Uploads (one series' profile each)",
                "push.max_profile_bytes",
                false,
            )?,
            otlp: SinkMetrics::new(
                &registry,
                "otlp",
                "OTLP export requests (one window's profile of one type each)",
                "otlp.max_request_bytes",
                true,
            )?,
            resident: gauge(
                "profilerd_resident_memory_bytes",
                "Resident memory of the daemon.",
            )?,
            heap: gauge(
                "profilerd_heap_bytes",
                "Bytes the daemon's allocator has handed out and not taken back, its caches (profilerd_cache_bytes) included.",
            )?,
            bpf_memory: gauge(
                "profilerd_bpf_memory_bytes",
                "Memory the kernel charges for the daemon's BPF maps and rings (memlock), each map counted once.",
            )?,
            bpf_map_bytes: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "profilerd_bpf_map_bytes",
                        "Memory the kernel charges for each of the daemon's BPF maps and rings (memlock), by map name.",
                    ),
                    &["map"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            unavailable: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "profilerd_profile_unavailable",
                        "1 for a profile type asked for at best effort that this kernel cannot run (skipped), by profile type.",
                    ),
                    &["type"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            cache_bytes: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "profilerd_cache_bytes",
                        "Bytes held by each cache of the memory budget ([limits] memory_bytes), by cache (an estimate per entry).",
                    ),
                    &["cache"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            cache_evictions: counter_vec(
                "profilerd_cache_evictions_total",
                "Cache entries dropped to stay within the memory budget or an entry bound, by cache.",
                &["cache"],
            )?,
            cache_budget: gauge(
                "profilerd_cache_budget_bytes",
                "The memory budget the caches draw on ([limits] memory_bytes).",
            )?,
            go_heaps: counter_vec(
                "profilerd_go_heap_processes_total",
                "Go processes whose heap profile is not what their runtime samples at its own \
                 rate: unsampled (runtime.MemProfileRate 0, left so), forced (the rate set by \
                 --go-heap-sampling force), force_failed; rate_assumed counts windows rescaled by \
                 Go's default rate because the process's could not be read.",
                &["outcome"],
            )?,
            registry,
        };
        // Every series exists from the start, so that rates work from the
        // first scrape.
        for kind in ProfileKind::ALL {
            for vec in [
                &metrics.samples,
                &metrics.files,
                &metrics.bytes,
                &metrics.write_errors,
            ] {
                vec.with_label_values(&[kind.name()]);
            }
            metrics.unavailable.with_label_values(&[kind.name()]);
        }
        for (_, event) in BPF_EVENTS {
            metrics.bpf_events.with_label_values(&[event]);
        }
        for (_, map, lost) in BPF_DROPS {
            metrics.bpf_dropped.with_label_values(&[map, lost]);
        }
        for cache in crate::stacks::budget::Cache::ALL {
            metrics.cache_bytes.with_label_values(&[cache.name()]);
            metrics.cache_evictions.with_label_values(&[cache.name()]);
        }
        for outcome in GO_HEAP_OUTCOMES {
            metrics.go_heaps.with_label_values(&[outcome]);
        }
        Ok(metrics)
    }

    /// A profile type asked for at best effort is skipped on this kernel.
    pub fn profile_unavailable(&self, kind: ProfileKind) {
        self.unavailable.with_label_values(&[kind.name()]).set(1);
    }

    /// The memory budget the caches draw on, known from the start.
    pub fn cache_budget(&self, bytes: u64) {
        self.cache_budget
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Reads the push task's counters at each scrape from now on.
    pub fn watch_push(&self, stats: Arc<PushStats>) {
        self.push.watch(stats);
    }

    /// Reads the OTLP export's counters at each scrape from now on.
    pub fn watch_otlp(&self, stats: Arc<PushStats>) {
        self.otlp.watch(stats);
    }

    /// A profile file was written.
    pub fn profile_written(&self, kind: ProfileKind, samples: usize, bytes: usize) {
        let kind = [kind.name()];
        self.files.with_label_values(&kind).inc();
        self.samples.with_label_values(&kind).inc_by(samples as u64);
        self.bytes.with_label_values(&kind).inc_by(bytes as u64);
    }

    /// A profile could not be written.
    pub fn write_failed(&self, kind: ProfileKind) {
        self.write_errors.with_label_values(&[kind.name()]).inc();
    }

    /// Mirrors the session's counters.
    pub fn observe(&self, o: &Observed) {
        for (index, event) in BPF_EVENTS {
            mirror(
                &self.bpf_events.with_label_values(&[event]),
                o.kernel.get(index as usize).copied().unwrap_or(0),
            );
        }
        for (index, map, lost) in BPF_DROPS {
            mirror(
                &self.bpf_dropped.with_label_values(&[map, lost]),
                o.kernel.get(index as usize).copied().unwrap_or(0),
            );
        }
        mirror(&self.symbolization_failures, o.symbolization_failures);
        mirror(&self.unwinds_truncated, o.unwinds_truncated);
        mirror(&self.attach_errors, o.attach_errors);
        mirror(&self.process_snapshots, o.process_snapshots);
        mirror(&self.process_snapshot_failures, o.process_snapshot_failures);
        self.processes.set(o.processes as i64);
        for &(cache, bytes, evictions) in &o.caches {
            self.cache_bytes
                .with_label_values(&[cache])
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            mirror(&self.cache_evictions.with_label_values(&[cache]), evictions);
        }
        self.cache_budget(o.cache_budget_bytes);
        let g = &o.go_heaps;
        for (outcome, total) in GO_HEAP_OUTCOMES.into_iter().zip([
            g.unsampled,
            g.forced,
            g.force_failed,
            g.rates_assumed,
        ]) {
            mirror(&self.go_heaps.with_label_values(&[outcome]), total);
        }
    }

    /// The exposition text, with the push counters and the resident memory
    /// read now.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        self.push.read();
        self.otlp.read();
        if let Some(rss) = resident_bytes() {
            self.resident.set(rss as i64);
        }
        self.heap
            .set(i64::try_from(crate::model::own_heap::heap_in_use()).unwrap_or(i64::MAX));
        let maps = crate::bpf::map_syscalls::map_memory();
        let total: u64 = maps.iter().map(|(_, bytes)| bytes).sum();
        self.bpf_memory
            .set(i64::try_from(total).unwrap_or(i64::MAX));
        self.bpf_map_bytes.reset();
        for (name, bytes) in &maps {
            self.bpf_map_bytes
                .with_label_values(&[name.as_str()])
                .set(i64::try_from(*bytes).unwrap_or(i64::MAX));
        }
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// Moves a counter up to `total` (a total counted elsewhere).
fn mirror(counter: &IntCounter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

/// The daemon's resident set size, from /proc/self/statm.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// Binds `addr` now (so that a bad address or a port in use fails the
/// start) and serves `/metrics` from a task on the current runtime.
/// Returns the bound address (port 0 picks one) and the task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    pprof: Option<PprofServer>,
) -> Result<(SocketAddr, JoinHandle<()>), MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let task = tokio::spawn(accept_loop(listener, metrics, pprof));
    Ok((bound, task))
}

async fn accept_loop(listener: TcpListener, metrics: Arc<Metrics>, pprof: Option<PprofServer>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut accept_error_logged = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                if !accept_error_logged {
                    tracing::warn!("metrics endpoint: accept failed: {e} (logged once)");
                    accept_error_logged = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let metrics = metrics.clone();
        let pprof = pprof.clone();
        // A capture holds its connection for its seconds; without
        // /debug/pprof a connection has CONNECTION_TIMEOUT.
        let timeout = match pprof {
            Some(_) => CAPTURE_CONNECTION_TIMEOUT,
            None => CONNECTION_TIMEOUT,
        };
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let (metrics, pprof) = (metrics.clone(), pprof.clone());
                async move {
                    let denied = pprof
                        .as_ref()
                        .and_then(|server| pprof_http::check_token(server, &req));
                    let response = match (&pprof, denied) {
                        (_, Some(denied)) => denied,
                        (Some(_), None) if req.uri().path() == "/debug/pprof/symbol" => {
                            crate::output::pprof_symbol::symbol(req).await
                        }
                        (Some(server), None) if req.uri().path().starts_with("/debug/pprof") => {
                            pprof_http::respond(server, &req).await
                        }
                        _ => respond(&metrics, &req),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .timer(TokioTimer::new())
                .header_read_timeout(CONNECTION_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(timeout, connection).await;
            drop(slot);
        });
    }
}

fn respond<B>(metrics: &Metrics, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: metrics are at /metrics\n".to_owned(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET\n".to_owned(),
        );
    }
    match metrics.render() {
        Ok(text) => reply(StatusCode::OK, TEXT_FORMAT, text),
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("encoding metrics failed: {e}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_help_type_and_values() {
        let m = Metrics::new().unwrap();
        m.profile_written(ProfileKind::Cpu, 7, 1000);
        m.profile_written(ProfileKind::Cpu, 3, 24);
        let mut o = Observed {
            kernel: vec![0; counter::COUNT as usize],
            ..Observed::default()
        };
        o.kernel[counter::SAMPLES as usize] = 42;
        o.kernel[counter::COUNTS_FULL as usize] = 2;
        o.processes = 5;
        o.caches = vec![("symbols", 1000, 3), ("walk_memo", 20, 0)];
        o.cache_budget_bytes = 4096;
        m.observe(&o);
        // A total going back (it never should) leaves the counter alone.
        o.kernel[counter::SAMPLES as usize] = 40;
        m.observe(&o);
        let text = m.render().unwrap();
        for line in [
            "# HELP profilerd_samples_total ",
            "# TYPE profilerd_samples_total counter",
            "profilerd_samples_total{type=\"cpu\"} 10",
            "profilerd_samples_total{type=\"heap\"} 0",
            "profilerd_written_bytes_total{type=\"cpu\"} 1024",
            "profilerd_files_written_total{type=\"cpu\"} 2",
            "profilerd_bpf_events_total{event=\"cpu_samples\"} 42",
            "profilerd_bpf_dropped_total{lost=\"cpu_samples\",map=\"counts\"} 2",
            "# TYPE profilerd_processes gauge",
            "profilerd_processes 5",
            "# TYPE profilerd_resident_memory_bytes gauge",
            "# TYPE profilerd_heap_bytes gauge",
            "# TYPE profilerd_bpf_memory_bytes gauge",
            "profilerd_cache_bytes{cache=\"symbols\"} 1000",
            "profilerd_cache_bytes{cache=\"unwind_objects\"} 0",
            "profilerd_cache_evictions_total{cache=\"symbols\"} 3",
            "profilerd_cache_budget_bytes 4096",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"));
    }
}
