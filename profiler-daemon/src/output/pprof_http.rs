//! `/debug/pprof/`: profiles of chosen processes on demand (CPU, heap,
//! block, mutex, off-CPU), served the way Go's `net/http/pprof` serves
//! them, so that
//! `go tool pprof http://HOST:PORT/debug/pprof/profile?seconds=10&pid=1234`
//! works against a daemon already profiling the whole node.
//!
//! A request asks the session for a capture ([`Capture`]): the session
//! gathers the samples of those processes beside its windows for the
//! seconds asked (`model::taps`), builds the profile as it builds its
//! files (symbols, labels, rescaling) and answers with the gzipped pprof.
//! `/debug/pprof/heap` without `seconds` answers at once with the in-use
//! set, as Go's does. The scheduled files stay as they would be without it. Bad
//! parameters get a 400, an unknown process a 404, each with a one-line
//! reason; beyond [`MAX_CAPTURES`] at once, a 429 with `Retry-After`. A
//! client that goes away ends its capture (the session sees the reply
//! channel closed).
//!
//! Served only under `--http-addr` (`--metrics-addr` serves `/metrics`
//! alone, as it always did: an address already open for metrics does not
//! start showing stacks). With `--http-token-file`, every request there
//! carries `Authorization: Bearer TOKEN` or gets a 401 (`/metrics` too,
//! unless `--http-metrics-without-token`). `format=svg` answers with the
//! flame graph `profilerd flamegraph` draws of the same profile.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{mpsc, oneshot, watch};

use crate::model::profile_kind::ProfileKind;

/// Highest CPU sampling rate a request may ask for.
pub const MAX_CAPTURE_HZ: u64 = 1000;
/// Longest capture a request may ask for.
pub const MAX_CAPTURE_SECONDS: u64 = 300;
/// A capture's length when the request names none (Go's default).
pub const DEFAULT_CAPTURE_SECONDS: u64 = 30;
/// Captures at once; more are refused with a 429.
pub const MAX_CAPTURES: usize = 4;
/// Processes the index page lists at most (by pid); the rest are counted.
pub const MAX_INDEX_PROCESSES: usize = 4096;
/// The length of the captures the index page links to.
const INDEX_CAPTURE_SECONDS: u64 = 10;

/// The processes the daemon profiles, as the session last said: `None`
/// when it profiles every process on the node.
pub type Targets = Option<Arc<[u32]>>;

/// A request for a profile of type `kind` of `pids` (none: every process
/// the daemon profiles) over the next `seconds` (0: now, the heap's in-use
/// set only).
#[derive(Debug)]
pub struct Capture {
    pub kind: ProfileKind,
    pub pids: Vec<u32>,
    pub seconds: u64,
    /// The rate asked for, if any (of `kind`'s kind).
    pub rate: Option<AskedRate>,
    pub reply: oneshot::Sender<Result<Vec<u8>, Refusal>>,
}

/// A rate a request names, one per profile type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskedRate {
    /// CPU samples per second (`hz`).
    Hz(u64),
    /// Mean bytes between heap samples (`heap_sample_bytes`).
    HeapBytes(u64),
    /// Waits kept in proportion to their length below this
    /// (`block_rate`, block and off-CPU).
    Block(Duration),
    /// 1 in this many contended wake-ups (`mutex_fraction`).
    MutexFraction(u64),
}

impl AskedRate {
    /// The parameter that names it.
    fn name(self) -> &'static str {
        match self {
            AskedRate::Hz(_) => "hz",
            AskedRate::HeapBytes(_) => "heap_sample_bytes",
            AskedRate::Block(_) => "block_rate",
            AskedRate::MutexFraction(_) => "mutex_fraction",
        }
    }

    /// Whether it is the daemon's own rate (`rates`).
    pub fn is_daemons(self, rates: &Rates) -> bool {
        match self {
            AskedRate::Hz(hz) => hz == rates.cpu_frequency,
            AskedRate::HeapBytes(bytes) => bytes == rates.heap_sample_bytes,
            AskedRate::Block(rate) => rate == rates.block_rate,
            AskedRate::MutexFraction(n) => n == rates.mutex_fraction,
        }
    }

    /// As a flame graph's subtitle and the log say it.
    pub fn describe(self) -> String {
        match self {
            AskedRate::Hz(hz) => format!("{hz} Hz"),
            AskedRate::HeapBytes(bytes) => format!("1 sample per {bytes} B"),
            AskedRate::Block(rate) => format!("block rate {}", humantime::format_duration(rate)),
            AskedRate::MutexFraction(n) => format!("1 in {n} contentions"),
        }
    }
}

/// Why the session did not capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The processes are not ones the daemon profiles (404).
    NotProfiled(String),
    /// The daemon does not take what was asked (400).
    Unavailable(String),
    /// [`MAX_CAPTURES`] are running; the first ends in `retry_after`
    /// seconds (429).
    Busy { retry_after: u64 },
}

/// The rates the daemon samples by: a request at another rate (with
/// `pid`) gets probes of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rates {
    /// CPU samples per second (`--cpu-frequency`).
    pub cpu_frequency: u64,
    /// `--heap-sample-bytes`.
    pub heap_sample_bytes: u64,
    /// `--block-rate`.
    pub block_rate: Duration,
    /// `--mutex-fraction`.
    pub mutex_fraction: u64,
}

impl Rates {
    /// The rates `settings` sample by.
    pub fn of(settings: &crate::config::Settings) -> Rates {
        Rates {
            cpu_frequency: settings.cpu_frequency,
            heap_sample_bytes: settings.heap_sample_bytes,
            block_rate: settings.block_rate,
            mutex_fraction: settings.mutex_fraction,
        }
    }
}

/// What the HTTP side needs: where captures go, and the daemon's rates and
/// profile types.
#[derive(Clone, Debug)]
pub struct PprofServer {
    pub captures: mpsc::Sender<Capture>,
    pub rates: Rates,
    /// The profile types the daemon collects (`--profiles`).
    pub profiles: Vec<ProfileKind>,
    /// The bearer token requests must carry (`--http-token-file`).
    pub token: Option<crate::config::push::Secret>,
    /// `/metrics` is served without it.
    pub metrics_without_token: bool,
    /// What the index page lists (session/mod.rs keeps it).
    pub targets: watch::Receiver<Targets>,
}

pub(crate) type Reply = Response<Full<Bytes>>;

/// A response with `status`, `content_type` and `body` (`/metrics`'s too).
pub(crate) fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// A one-line reason, as text.
pub(crate) fn refuse(status: StatusCode, why: &str) -> Reply {
    reply(status, "text/plain; charset=utf-8", format!("{why}\n"))
}

/// With a token: `None` when `req` carries it (or asks for `/metrics`,
/// left open), else the 401 to answer with.
pub fn check_token<B>(server: &PprofServer, req: &Request<B>) -> Option<Reply> {
    let token = server.token.as_ref()?;
    if server.metrics_without_token && req.uri().path() == "/metrics" {
        return None;
    }
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .filter(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
        .map(|v| &v[7..]);
    if given.is_some_and(|given| same_secret(given, token.expose().as_bytes())) {
        return None;
    }
    let mut response = refuse(
        StatusCode::UNAUTHORIZED,
        "this server asks for Authorization: Bearer <token> (--http-token-file)",
    );
    if let Ok(value) = "Bearer realm=\"profilerd\"".parse() {
        response
            .headers_mut()
            .insert(hyper::header::WWW_AUTHENTICATE, value);
    }
    Some(response)
}

/// Whether `given` is `token`, in a time that depends on the token's
/// length only: every byte is compared, whichever differs first.
fn same_secret(given: &[u8], token: &[u8]) -> bool {
    let mut differ = u8::from(given.len() != token.len());
    for (i, &byte) in token.iter().enumerate() {
        differ |= byte ^ given.get(i).copied().unwrap_or(!byte);
    }
    std::hint::black_box(differ) == 0
}

/// Answers a request under `/debug/pprof`.
pub async fn respond<B>(server: &PprofServer, req: &Request<B>) -> Reply {
    if req.method() != Method::GET {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "use GET");
    }
    match req.uri().path() {
        "/debug/pprof" | "/debug/pprof/" => {
            let targets = server.targets.borrow().clone();
            // /proc is read off the session's thread.
            let listed = tokio::task::spawn_blocking(move || list_processes(targets.as_deref()))
                .await
                .unwrap_or_default();
            reply(
                StatusCode::OK,
                "text/html; charset=utf-8",
                index(server, &listed),
            )
        }
        "/debug/pprof/allocs" => allocs(server, req.uri().query().unwrap_or("")).await,
        path => match path.strip_prefix("/debug/pprof/").and_then(kind_of_path) {
            Some(kind) => profile(server, kind, req.uri().query().unwrap_or("")).await,
            None => refuse(
                StatusCode::NOT_FOUND,
                "not found: see /debug/pprof/ for what is served",
            ),
        },
    }
}

/// The profile type an endpoint serves (`profile` is CPU, as in Go).
fn kind_of_path(name: &str) -> Option<ProfileKind> {
    match name {
        "profile" => Some(ProfileKind::Cpu),
        "heap" => Some(ProfileKind::Heap),
        "block" => Some(ProfileKind::Block),
        "mutex" => Some(ProfileKind::Mutex),
        "offcpu" => Some(ProfileKind::Offcpu),
        "goroutine" => Some(ProfileKind::Goroutine),
        _ => None,
    }
}

/// The endpoint of profile type `kind`.
fn path_of(kind: ProfileKind) -> &'static str {
    match kind {
        ProfileKind::Cpu => "profile",
        other => other.name(),
    }
}

/// The parameters of a profile request.
#[derive(Debug, PartialEq, Eq)]
struct ProfileQuery {
    seconds: u64,
    pids: Vec<u32>,
    format: Format,
    /// The rate of `kind`, if given.
    rate: Option<AskedRate>,
}

/// What a profile is answered as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// Gzipped pprof (`format=proto`, the default).
    Proto,
    /// The flame graph (`format=svg`).
    Svg,
}

/// Reads `seconds`, `pid` (repeatable or comma-separated), `format` and
/// the rate of `kind`: `hz` up to [`MAX_CAPTURE_HZ`], `heap_sample_bytes`,
/// `block_rate` or `mutex_fraction`, each as its command-line option takes
/// it; a rate other than the daemon's only with `pid` (and, for the heap,
/// `seconds`), as it loads probes of its own for those processes.
fn parse_query(kind: ProfileKind, query: &str, rates: &Rates) -> Result<ProfileQuery, String> {
    let mut seconds = None;
    let mut rate = None;
    let mut pids = Vec::new();
    let mut format = Format::Proto;
    let whole = |name: &str, value: &str, min: u64, max: u64| -> Result<u64, String> {
        let n: u64 = value
            .parse()
            .map_err(|_| format!("{name}: expected a whole number, got {value:?}"))?;
        match (min..=max).contains(&n) {
            true => Ok(n),
            false => Err(format!("{name}: {n} is out of range ({min} to {max})")),
        }
    };
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match (&*key, kind) {
            ("seconds", ProfileKind::Goroutine) => {
                return Err(
                    "seconds: the goroutine profile is of the goroutines now (a difference \
                     over seconds is not taken)"
                        .into(),
                );
            }
            ("seconds", _) => {
                seconds = Some(whole("seconds", &value, 1, MAX_CAPTURE_SECONDS)?);
            }
            ("pid", _) => {
                for part in value.split(',').filter(|p| !p.is_empty()) {
                    let pid: u32 = part
                        .trim()
                        .parse()
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or_else(|| format!("pid: expected a process id, got {part:?}"))?;
                    if !pids.contains(&pid) {
                        pids.push(pid);
                    }
                }
            }
            ("hz", ProfileKind::Cpu) => {
                rate = Some(AskedRate::Hz(whole("hz", &value, 1, MAX_CAPTURE_HZ)?));
            }
            ("heap_sample_bytes", ProfileKind::Heap) => {
                let bytes = whole("heap_sample_bytes", &value, 1, u64::MAX)?;
                rate = Some(AskedRate::HeapBytes(bytes));
            }
            ("block_rate", ProfileKind::Block | ProfileKind::Offcpu) => {
                let asked = humantime::parse_duration(value.trim())
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        format!("block_rate: expected a duration such as 10us, got {value:?}")
                    })?;
                rate = Some(AskedRate::Block(asked));
            }
            ("mutex_fraction", ProfileKind::Mutex) => {
                let n = whole("mutex_fraction", &value, 1, u64::MAX)?;
                rate = Some(AskedRate::MutexFraction(n));
            }
            ("format", _) => {
                format = match &*value {
                    "proto" => Format::Proto,
                    "svg" => Format::Svg,
                    _ => return Err(format!("format: expected proto or svg, got {value:?}")),
                };
            }
            (other, _) => {
                let rate = match rate_name(kind) {
                    Some(name) => format!(", {name}"),
                    None => String::new(),
                };
                return Err(format!(
                    "unknown parameter {other:?} (seconds, pid, format{rate} are taken here)"
                ));
            }
        }
    }
    if let Some(own) = rate.filter(|r| !r.is_daemons(rates)) {
        if pids.is_empty() {
            return Err(format!(
                "{}: a rate other than the daemon's ({}) is taken for chosen processes only, \
                 on probes of their own: add pid",
                own.name(),
                daemons_rate(kind, rates),
            ));
        }
        if kind == ProfileKind::Heap && seconds.is_none() {
            return Err(
                "heap_sample_bytes: a rate of its own samples from now on: add seconds".into(),
            );
        }
    }
    // Go's heap and goroutine endpoints without `seconds` answer at once.
    let default = match kind {
        ProfileKind::Heap | ProfileKind::Goroutine => 0,
        _ => DEFAULT_CAPTURE_SECONDS,
    };
    Ok(ProfileQuery {
        seconds: seconds.unwrap_or(default),
        pids,
        format,
        rate,
    })
}

/// The parameter that sets `kind`'s rate.
fn rate_name(kind: ProfileKind) -> Option<&'static str> {
    match kind {
        ProfileKind::Cpu => Some("hz"),
        ProfileKind::Heap => Some("heap_sample_bytes"),
        ProfileKind::Block | ProfileKind::Offcpu => Some("block_rate"),
        ProfileKind::Mutex => Some("mutex_fraction"),
        ProfileKind::Goroutine => None,
    }
}

/// The daemon's rate of `kind`, as its option says it.
fn daemons_rate(kind: ProfileKind, rates: &Rates) -> String {
    match kind {
        ProfileKind::Cpu => format!("{} Hz", rates.cpu_frequency),
        ProfileKind::Heap => format!("{} bytes", rates.heap_sample_bytes),
        ProfileKind::Block | ProfileKind::Offcpu => {
            humantime::format_duration(rates.block_rate).to_string()
        }
        ProfileKind::Mutex => format!("1 in {}", rates.mutex_fraction),
        ProfileKind::Goroutine => String::new(),
    }
}

/// Go's `allocs`: the heap profile, read by its allocations
/// (`default_sample_type` alloc_space). Go counts them from the program's
/// start, which the daemon does not keep: over `seconds`, by default as
/// long as the other profiles over time.
async fn allocs(server: &PprofServer, query: &str) -> Reply {
    let mut parsed = match parse_query(ProfileKind::Heap, query, &server.rates) {
        Ok(query) => query,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, &why),
    };
    let has_seconds = query
        .split('&')
        .any(|part| part.split('=').next() == Some("seconds"));
    if !has_seconds {
        parsed.seconds = DEFAULT_CAPTURE_SECONDS;
    }
    captured(server, ProfileKind::Heap, parsed, Some("alloc_space")).await
}

async fn profile(server: &PprofServer, kind: ProfileKind, query: &str) -> Reply {
    let query = match parse_query(kind, query, &server.rates) {
        Ok(query) => query,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, &why),
    };
    captured(server, kind, query, None).await
}

/// The capture `query` of `kind`, answered; read by `default_type` if
/// given.
async fn captured(
    server: &PprofServer,
    kind: ProfileKind,
    query: ProfileQuery,
    default_type: Option<&str>,
) -> Reply {
    if let Some(pid) = query
        .pids
        .iter()
        .find(|&&pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
    {
        return refuse(StatusCode::NOT_FOUND, &format!("no process {pid}"));
    }
    let (tx, rx) = oneshot::channel();
    let what = describe(kind, &query);
    let format = query.format;
    let capture = Capture {
        kind,
        pids: query.pids,
        seconds: query.seconds,
        rate: query.rate,
        reply: tx,
    };
    if server.captures.try_send(capture).is_err() {
        return busy(1);
    }
    let rx = async {
        let answer = rx.await;
        match (answer, default_type) {
            (Ok(Ok(bytes)), Some(ty)) => Ok(Ok(with_default_type(&bytes, ty).unwrap_or(bytes))),
            (answer, _) => answer,
        }
    };
    match rx.await {
        Ok(Ok(bytes)) if format == Format::Svg => flame_graph(&bytes, &what),
        Ok(Ok(bytes)) => {
            let mut response = reply(StatusCode::OK, "application/octet-stream", bytes);
            let name = format!("attachment; filename=\"{}.pb.gz\"", path_of(kind));
            if let Ok(value) = name.parse() {
                response
                    .headers_mut()
                    .insert(hyper::header::CONTENT_DISPOSITION, value);
            }
            response
        }
        Ok(Err(Refusal::NotProfiled(why))) => refuse(StatusCode::NOT_FOUND, &why),
        Ok(Err(Refusal::Unavailable(why))) => refuse(StatusCode::BAD_REQUEST, &why),
        Ok(Err(Refusal::Busy { retry_after })) => busy(retry_after),
        // The session stopped before the capture ended.
        Err(_) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the daemon is stopping; the capture was not finished",
        ),
    }
}

/// Gzipped profile `bytes` with its `default_sample_type` set to `ty`
/// (pprof shows that type first); None if it cannot be read.
fn with_default_type(bytes: &[u8], ty: &str) -> Option<Vec<u8>> {
    use prost::Message as _;
    use std::io::Read as _;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut raw)
        .ok()?;
    let mut profile = pprof_proto::Profile::decode(raw.as_slice()).ok()?;
    let at = match profile.string_table.iter().position(|s| s == ty) {
        Some(at) => at,
        None => {
            profile.string_table.push(ty.to_string());
            profile.string_table.len() - 1
        }
    };
    profile.default_sample_type = at as i64;
    Some(crate::output::push::wire::gzip(&profile))
}

/// The capture as a flame graph's subtitle names it.
fn describe(kind: ProfileKind, query: &ProfileQuery) -> String {
    let pids: Vec<String> = query.pids.iter().map(u32::to_string).collect();
    let whose = match pids.is_empty() {
        true => "every process".to_owned(),
        false => format!("pid {}", pids.join(",")),
    };
    let rate = query
        .rate
        .map_or(String::new(), |rate| format!(", {}", rate.describe()));
    match query.seconds {
        0 => format!("{} now, {whose}", kind.name()),
        s => format!("{}, {whose}, {s} s{rate}", kind.name()),
    }
}

/// The flame graph of profile `bytes` (gzipped pprof), drawn as
/// `profilerd flamegraph` draws a file; a capture without samples gets a
/// picture that says so.
fn flame_graph(bytes: &[u8], what: &str) -> Reply {
    use crate::report::{ReportError, flamegraph, stacks};
    let name = PathBuf::from(what);
    let drawn = stacks::load_with(std::slice::from_ref(&name), None, |_| Ok(bytes.to_vec()))
        .and_then(|stacks| flamegraph::render(&stacks));
    match drawn {
        Ok(svg) => reply(StatusCode::OK, "image/svg+xml", svg),
        Err(ReportError::NoSamples { .. }) => reply(
            StatusCode::OK,
            "image/svg+xml",
            format!(
                "<?xml version=\"1.0\" standalone=\"no\"?>\n\
                 <svg version=\"1.1\" width=\"600\" height=\"40\" \
                 xmlns=\"http://www.w3.org/2000/svg\"><text x=\"10\" y=\"25\">\
                 no samples ({})</text></svg>\n",
                escape_html(what)
            ),
        ),
        Err(e) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot draw the flame graph: {e}"),
        ),
    }
}

/// `text` safe inside an HTML or SVG element or attribute.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn busy(retry_after: u64) -> Reply {
    let mut response = refuse(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("{MAX_CAPTURES} captures are running; try again in {retry_after} s"),
    );
    if let Ok(value) = retry_after.max(1).to_string().parse() {
        response
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, value);
    }
    response
}

/// The processes the daemon profiles (`targets`, or every process under
/// /proc but the daemon itself) with their command names, by pid: at most
/// [`MAX_INDEX_PROCESSES`], and how many more there were. A process gone
/// meanwhile is left out.
fn list_processes(targets: Option<&[u32]>) -> (Vec<(u32, String)>, usize) {
    let mut pids: Vec<u32> = match targets {
        Some(targets) => targets.to_vec(),
        None => crate::procs::process::all_pids(),
    };
    let own = std::process::id();
    pids.retain(|&pid| pid != own);
    pids.sort_unstable();
    pids.dedup();
    let more = pids.len().saturating_sub(MAX_INDEX_PROCESSES);
    pids.truncate(MAX_INDEX_PROCESSES);
    let listed = pids
        .into_iter()
        .filter_map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            Some((pid, comm.trim_end().to_owned()))
        })
        .collect();
    (listed, more)
}

/// The profile types served on demand: those the daemon collects, and
/// the others for chosen processes, on probes of their own; goroutines,
/// read from memory, always.
fn served(_server: &PprofServer) -> impl Iterator<Item = ProfileKind> {
    ProfileKind::ALL.into_iter()
}

/// Whether the daemon collects `kind` (`--profiles`), or, for
/// goroutines, needs nothing collected to answer.
fn collected(server: &PprofServer, kind: ProfileKind) -> bool {
    kind == ProfileKind::Goroutine || server.profiles.contains(&kind)
}

/// The query of a link to a capture of `kind` (the heap's: the in-use set
/// now, as Go's default, where the daemon collects it; goroutines now).
fn link_query(server: &PprofServer, kind: ProfileKind) -> String {
    let now = match kind {
        ProfileKind::Heap => collected(server, kind),
        ProfileKind::Goroutine => true,
        _ => false,
    };
    match now {
        true => String::new(),
        false => format!("seconds={INDEX_CAPTURE_SECONDS}&amp;"),
    }
}

/// The index page: what is served, and the processes, with links.
fn index(server: &PprofServer, (listed, more): &(Vec<(u32, String)>, usize)) -> String {
    let mut rows = String::new();
    // The flame graph of the CPU profile, or of the first type collected.
    let drawn = served(server).find(|&kind| collected(server, kind));
    for (pid, comm) in listed {
        let mut links = String::new();
        // Goroutines are listed once, for every Go process.
        for kind in served(server).filter(|&k| k != ProfileKind::Goroutine) {
            links += &format!(
                "<a href=\"/debug/pprof/{path}?{q}pid={pid}\">{name}</a> ",
                path = path_of(kind),
                q = link_query(server, kind),
                name = kind.name(),
            );
        }
        let graph = match drawn {
            Some(kind) => format!(
                "<a href=\"/debug/pprof/{path}?{q}pid={pid}&amp;format=svg\">flame graph</a>",
                path = path_of(kind),
                q = link_query(server, kind),
            ),
            None => String::new(),
        };
        rows += &format!(
            "<tr><td>{pid}</td><td>{comm}</td><td>{links}</td><td>{graph}</td></tr>\n",
            comm = escape_html(comm),
            links = links.trim_end(),
        );
    }
    let more_line = match more {
        0 => String::new(),
        n => format!("<p>and {n} more, not listed.</p>\n"),
    };
    let header = header(server);
    format!(
        "{header}<h2>Processes ({count})</h2>\n\
         <p>Each link captures {s} s of that process (the heap's, where it is collected: its \
         in-use set now; the goroutines': those now).</p>\n\
         <table id=\"processes\">\n<tr><th>pid</th><th>command</th><th>profiles</th><th></th></tr>\n\
         {rows}</table>\n{more_line}</body></html>\n",
        count = listed.len() + more,
        s = INDEX_CAPTURE_SECONDS,
    )
}

/// The index page's head and its table of endpoints.
fn header(server: &PprofServer) -> String {
    let rates = &server.rates;
    let mut endpoints = String::new();
    for kind in served(server) {
        let what = match kind {
            ProfileKind::Cpu => "CPU profile",
            ProfileKind::Heap => {
                "sampled allocations over <code>seconds</code> and the in-use set at their end \
                 (without <code>seconds</code>: the in-use set now)"
            }
            ProfileKind::Block => "time blocked in waits",
            ProfileKind::Offcpu => "time off the CPU",
            ProfileKind::Goroutine => {
                endpoints += "<tr><td><a href=\"/debug/pprof/goroutine?format=svg\">goroutine</a>\
                              </td><td>the live goroutines of Go processes now, by stack, state, \
                              wait reason and labels (no <code>seconds</code>; read from their \
                              memory, whatever <code>--profiles</code> says)</td></tr>\n";
                continue;
            }
            ProfileKind::Mutex => "delay charged to the waker",
        };
        let rate = format!(
            "<code>{name}</code> (the daemon's {own}; another with <code>pid</code>{max})",
            name = rate_name(kind).unwrap_or_default(),
            own = escape_html(&daemons_rate(kind, rates)),
            max = match kind {
                ProfileKind::Cpu => format!(", up to {MAX_CAPTURE_HZ} Hz"),
                _ => String::new(),
            },
        );
        endpoints += &match collected(server, kind) {
            true => format!(
                "<tr><td><a href=\"/debug/pprof/{path}?{q}format=svg\">{path}</a></td><td>{what}; \
                 the rate {rate}</td></tr>\n",
                path = path_of(kind),
                q = link_query(server, kind),
            ),
            // Every process at once is not probed for a request.
            false => format!(
                "<tr><td>{path}</td><td>{what}; the rate {rate}. Not collected by this daemon: \
                 probes of its own are loaded for the processes a request names \
                 (<code>pid</code>), for its <code>seconds</code></td></tr>\n",
                path = path_of(kind),
            ),
        };
        if kind == ProfileKind::Heap {
            endpoints += &format!(
                "<tr><td>allocs</td><td>the heap profile over <code>seconds</code> (default \
                 {DEFAULT_CAPTURE_SECONDS}; Go's counts from the program's start, which this \
                 daemon does not keep), shown by <code>alloc_space</code></td></tr>\n"
            );
        }
    }
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>profilerd: /debug/pprof/</title></head>\n<body>\n\
         <h1>profilerd: /debug/pprof/</h1>\n\
         <p>Profiles on demand, from the samples this daemon takes. \
         Open one with <code>go tool pprof http://HOST:PORT/debug/pprof/profile?seconds=10&amp;pid=PID</code>. \
         Every endpoint takes <code>seconds</code> (default {default}, at most {max}), \
         <code>pid</code> (repeatable or comma-separated; every process when absent), \
         <code>format=svg</code> for the flame graph (the links below draw {s} s of every process), \
         and its rate.</p>\n\
         <table>\n\
         <tr><th>endpoint</th><th>what</th></tr>\n\
         {endpoints}\
         <tr><td><a href=\"/metrics\">/metrics</a></td><td>the daemon's metrics</td></tr>\n\
         </table>\n",
        default = DEFAULT_CAPTURE_SECONDS,
        max = MAX_CAPTURE_SECONDS,
        s = INDEX_CAPTURE_SECONDS,
    )
}

/// How long a connection may take: the longest capture, and the time to
/// build its profile.
pub const CAPTURE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(MAX_CAPTURE_SECONDS + 60);

#[cfg(test)]
mod tests {
    use super::*;

    fn rates() -> Rates {
        Rates {
            cpu_frequency: 99,
            heap_sample_bytes: 524_288,
            block_rate: Duration::from_micros(10),
            mutex_fraction: 100,
        }
    }

    #[test]
    fn parameters_are_read_or_refused_with_a_reason() {
        let q = |s: &str| parse_query(ProfileKind::Cpu, s, &rates());
        assert_eq!(
            q(""),
            Ok(ProfileQuery {
                seconds: DEFAULT_CAPTURE_SECONDS,
                pids: vec![],
                format: Format::Proto,
                rate: None,
            })
        );
        assert_eq!(
            q("seconds=10&pid=12,13&pid=12&hz=99&format=svg"),
            Ok(ProfileQuery {
                seconds: 10,
                pids: vec![12, 13],
                format: Format::Svg,
                rate: Some(AskedRate::Hz(99)),
            })
        );
        assert_eq!(
            q("pid=7&hz=999").map(|q| q.rate),
            Ok(Some(AskedRate::Hz(999)))
        );
        for (bad, why) in [
            ("seconds=abc", "seconds: expected"),
            ("seconds=0", "out of range"),
            ("seconds=301", "out of range"),
            ("pid=abc", "pid: expected"),
            ("pid=0", "pid: expected"),
            ("pid=-1", "pid: expected"),
            ("hz=499", "add pid"),
            ("hz=1001&pid=7", "out of range"),
            ("hz=0&pid=7", "out of range"),
            ("hz=x", "hz: expected"),
            ("debug=1", "unknown parameter"),
            ("format=png", "format: expected proto or svg"),
            ("heap_sample_bytes=524288", "unknown parameter"),
        ] {
            let err = q(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
            assert!(!err.contains('\n'), "{bad}: one line: {err}");
        }
    }

    #[test]
    fn each_type_takes_its_own_rate_and_the_heap_answers_at_once() {
        let q = |kind, s: &str| parse_query(kind, s, &rates());
        let heap = q(ProfileKind::Heap, "pid=5&heap_sample_bytes=524288").expect("heap");
        assert_eq!(
            (heap.seconds, heap.pids),
            (0, vec![5]),
            "the in-use set now"
        );
        assert_eq!(q(ProfileKind::Heap, "seconds=3").map(|q| q.seconds), Ok(3));
        for kind in [ProfileKind::Block, ProfileKind::Offcpu] {
            let query = q(kind, "block_rate=10us").expect("block_rate");
            assert_eq!(query.seconds, DEFAULT_CAPTURE_SECONDS);
        }
        assert!(q(ProfileKind::Mutex, "mutex_fraction=100").is_ok());
        // Rates of their own, for chosen processes.
        for (kind, asked, rate) in [
            (
                ProfileKind::Heap,
                "seconds=5&pid=3&heap_sample_bytes=1",
                AskedRate::HeapBytes(1),
            ),
            (
                ProfileKind::Offcpu,
                "pid=3&block_rate=1ms",
                AskedRate::Block(Duration::from_millis(1)),
            ),
            (
                ProfileKind::Mutex,
                "pid=3&mutex_fraction=5",
                AskedRate::MutexFraction(5),
            ),
        ] {
            assert_eq!(q(kind, asked).map(|q| q.rate), Ok(Some(rate)), "{asked}");
        }
        for (kind, bad, why) in [
            (ProfileKind::Heap, "heap_sample_bytes=1", "add pid"),
            (
                ProfileKind::Heap,
                "pid=3&heap_sample_bytes=1",
                "add seconds",
            ),
            (ProfileKind::Heap, "heap_sample_bytes=0", "out of range"),
            (ProfileKind::Heap, "hz=99", "unknown parameter"),
            (ProfileKind::Block, "block_rate=1ms", "(10us"),
            (ProfileKind::Block, "block_rate=0s", "block_rate: expected"),
            (
                ProfileKind::Block,
                "block_rate=soon",
                "block_rate: expected",
            ),
            (
                ProfileKind::Offcpu,
                "mutex_fraction=100",
                "unknown parameter",
            ),
            (ProfileKind::Mutex, "mutex_fraction=5", "(1 in 100)"),
            (ProfileKind::Mutex, "mutex_fraction=0", "out of range"),
            (ProfileKind::Mutex, "seconds=0", "out of range"),
        ] {
            let err = q(kind, bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
            assert!(!err.contains('\n'), "{bad}: one line: {err}");
        }
        assert_eq!(kind_of_path("profile"), Some(ProfileKind::Cpu));
        for kind in [ProfileKind::Cpu, ProfileKind::Heap, ProfileKind::Mutex] {
            assert_eq!(kind_of_path(path_of(kind)), Some(kind));
        }
        assert_eq!(kind_of_path("goroutine"), Some(ProfileKind::Goroutine));
        let goroutines = q(ProfileKind::Goroutine, "pid=4").expect("goroutines");
        assert_eq!((goroutines.seconds, goroutines.rate), (0, None), "now");
        let err = q(ProfileKind::Goroutine, "seconds=5").expect_err("seconds");
        assert!(err.contains("goroutines now"), "{err}");
    }

    #[test]
    fn the_token_is_asked_for_on_every_path_but_an_open_metrics() {
        let (tx, _rx) = mpsc::channel(1);
        let (_targets_tx, targets) = watch::channel(None);
        let mut server = PprofServer {
            captures: tx,
            rates: rates(),
            profiles: vec![ProfileKind::Cpu],
            token: None,
            metrics_without_token: false,
            targets,
        };
        let request = |path: &str, auth: Option<&str>| {
            let mut builder = Request::get(path);
            if let Some(auth) = auth {
                builder = builder.header(hyper::header::AUTHORIZATION, auth);
            }
            builder.body(()).expect("request")
        };
        assert!(check_token(&server, &request("/debug/pprof/", None)).is_none());
        server.token = Some(crate::config::push::Secret::for_tests("s3cret"));
        for path in [
            "/debug/pprof/",
            "/debug/pprof/profile",
            "/metrics",
            "/other",
        ] {
            for auth in [
                None,
                Some("Bearer s3cre"),
                Some("Bearer s3cret!"),
                Some("Basic s3cret"),
                Some("s3cret"),
            ] {
                let denied = check_token(&server, &request(path, auth)).expect("refused");
                assert_eq!(denied.status(), StatusCode::UNAUTHORIZED, "{path} {auth:?}");
                assert!(
                    denied
                        .headers()
                        .contains_key(hyper::header::WWW_AUTHENTICATE)
                );
            }
            for auth in ["Bearer s3cret", "bearer s3cret"] {
                assert!(
                    check_token(&server, &request(path, Some(auth))).is_none(),
                    "{path} {auth}"
                );
            }
        }
        server.metrics_without_token = true;
        assert!(check_token(&server, &request("/metrics", None)).is_none());
        assert!(check_token(&server, &request("/debug/pprof/", None)).is_some());
    }

    #[test]
    fn secrets_compare_by_every_byte() {
        assert!(same_secret(b"abc", b"abc"));
        for other in [&b""[..], b"ab", b"abd", b"abcd", b"xbc"] {
            assert!(!same_secret(other, b"abc"), "{other:?}");
        }
    }

    /// `allocs` is the heap profile read by its allocations: pprof shows
    /// `alloc_space` first.
    #[test]
    fn allocs_are_the_heap_read_by_alloc_space() {
        use prost::Message as _;
        use std::io::Read as _;
        let profile = pprof_proto::Profile {
            string_table: vec![String::new(), "inuse_space".into(), "bytes".into()],
            default_sample_type: 1,
            ..Default::default()
        };
        let bytes = crate::output::push::wire::gzip(&profile);
        let out = with_default_type(&bytes, "alloc_space").expect("a profile");
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(out.as_slice())
            .read_to_end(&mut raw)
            .expect("gzip");
        let p = pprof_proto::Profile::decode(raw.as_slice()).expect("pprof");
        assert_eq!(
            p.string_table[p.default_sample_type as usize],
            "alloc_space"
        );
        assert!(with_default_type(b"not gzip", "alloc_space").is_none());
    }
}
