//! `/debug/pprof/`: CPU profiles of chosen processes on demand, served the
//! way Go's `net/http/pprof` serves them, so that
//! `go tool pprof http://HOST:PORT/debug/pprof/profile?seconds=10&pid=1234`
//! works against a daemon already profiling the whole node.
//!
//! A request asks the session for a capture ([`Capture`]): the session
//! gathers the samples of those processes beside its windows for the
//! seconds asked (`bpf::drain::CpuTap`), builds the profile as it builds
//! its files (symbols, labels, rescaling) and answers with the gzipped
//! pprof. The scheduled files stay as they would be without it. Bad
//! parameters get a 400, an unknown process a 404, each with a one-line
//! reason; beyond [`MAX_CAPTURES`] at once, a 429 with `Retry-After`. A
//! client that goes away ends its capture (the session sees the reply
//! channel closed).
//!
//! Served only under `--http-addr` (`--metrics-addr` serves `/metrics`
//! alone, as it always did: an address already open for metrics does not
//! start showing stacks).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{mpsc, oneshot};

/// Longest capture a request may ask for.
pub const MAX_CAPTURE_SECONDS: u64 = 300;
/// A capture's length when the request names none (Go's default).
pub const DEFAULT_CAPTURE_SECONDS: u64 = 30;
/// Captures at once; more are refused with a 429.
pub const MAX_CAPTURES: usize = 4;

/// A request for a CPU profile of `pids` (none: every process the daemon
/// profiles) over the next `seconds`.
#[derive(Debug)]
pub struct Capture {
    pub pids: Vec<u32>,
    pub seconds: u64,
    pub reply: oneshot::Sender<Result<Vec<u8>, Refusal>>,
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

/// What the HTTP side needs: where captures go, and the daemon's rate.
#[derive(Clone, Debug)]
pub struct PprofServer {
    pub captures: mpsc::Sender<Capture>,
    /// CPU samples per second the daemon takes (`--cpu-frequency`).
    pub cpu_frequency: u64,
}

type Reply = Response<Full<Bytes>>;

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
fn refuse(status: StatusCode, why: &str) -> Reply {
    reply(status, "text/plain; charset=utf-8", format!("{why}\n"))
}

/// Answers a request under `/debug/pprof`.
pub async fn respond<B>(server: &PprofServer, req: &Request<B>) -> Reply {
    if req.method() != Method::GET {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "use GET");
    }
    match req.uri().path() {
        "/debug/pprof" | "/debug/pprof/" => {
            reply(StatusCode::OK, "text/html; charset=utf-8", index(server))
        }
        "/debug/pprof/profile" => profile(server, req.uri().query().unwrap_or("")).await,
        "/debug/pprof/heap"
        | "/debug/pprof/block"
        | "/debug/pprof/mutex"
        | "/debug/pprof/offcpu"
        | "/debug/pprof/goroutine" => refuse(
            StatusCode::NOT_FOUND,
            "not served yet: only CPU profiles are served on demand (/debug/pprof/profile)",
        ),
        _ => refuse(
            StatusCode::NOT_FOUND,
            "not found: see /debug/pprof/ for what is served",
        ),
    }
}

/// The parameters of a profile request.
#[derive(Debug, PartialEq, Eq)]
struct ProfileQuery {
    seconds: u64,
    pids: Vec<u32>,
}

/// Reads `seconds`, `pid` (repeatable or comma-separated) and `hz` (only
/// the daemon's own rate: per-request rates are not taken yet).
fn parse_query(query: &str, cpu_frequency: u64) -> Result<ProfileQuery, String> {
    let mut seconds = None;
    let mut pids = Vec::new();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "seconds" => {
                let n: u64 = value
                    .parse()
                    .map_err(|_| format!("seconds: expected a whole number, got {value:?}"))?;
                if !(1..=MAX_CAPTURE_SECONDS).contains(&n) {
                    return Err(format!(
                        "seconds: {n} is out of range (1 to {MAX_CAPTURE_SECONDS})"
                    ));
                }
                seconds = Some(n);
            }
            "pid" => {
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
            "hz" => {
                let hz: u64 = value
                    .parse()
                    .map_err(|_| format!("hz: expected a whole number, got {value:?}"))?;
                if hz != cpu_frequency {
                    return Err(format!(
                        "hz: this daemon samples at {cpu_frequency} Hz; a rate of its own per \
                         request is not taken yet"
                    ));
                }
            }
            other => {
                return Err(format!(
                    "unknown parameter {other:?} (seconds, pid and hz are taken)"
                ));
            }
        }
    }
    Ok(ProfileQuery {
        seconds: seconds.unwrap_or(DEFAULT_CAPTURE_SECONDS),
        pids,
    })
}

async fn profile(server: &PprofServer, query: &str) -> Reply {
    let query = match parse_query(query, server.cpu_frequency) {
        Ok(query) => query,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, &why),
    };
    if let Some(pid) = query
        .pids
        .iter()
        .find(|&&pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
    {
        return refuse(StatusCode::NOT_FOUND, &format!("no process {pid}"));
    }
    let (tx, rx) = oneshot::channel();
    let capture = Capture {
        pids: query.pids,
        seconds: query.seconds,
        reply: tx,
    };
    if server.captures.try_send(capture).is_err() {
        return busy(1);
    }
    match rx.await {
        Ok(Ok(bytes)) => {
            let mut response = reply(StatusCode::OK, "application/octet-stream", bytes);
            if let Ok(value) = "attachment; filename=\"profile.pb.gz\"".parse() {
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

/// The index page: what is served, with links.
fn index(server: &PprofServer) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>profilerd: /debug/pprof/</title></head>\n<body>\n\
         <h1>profilerd: /debug/pprof/</h1>\n\
         <p>Profiles on demand, from the samples this daemon takes ({hz} Hz). \
         Open one with <code>go tool pprof http://HOST:PORT/debug/pprof/profile?seconds=10&amp;pid=PID</code>.</p>\n\
         <table>\n\
         <tr><th>endpoint</th><th>what</th></tr>\n\
         <tr><td><a href=\"profile?seconds=5\">profile</a></td><td>CPU profile over <code>seconds</code> \
         (default {default}, at most {max}) of the processes <code>pid</code> (repeatable or comma-separated; \
         all when absent)</td></tr>\n\
         <tr><td><a href=\"/metrics\">/metrics</a></td><td>the daemon's metrics</td></tr>\n\
         </table>\n</body></html>\n",
        hz = server.cpu_frequency,
        default = DEFAULT_CAPTURE_SECONDS,
        max = MAX_CAPTURE_SECONDS,
    )
}

/// How long a connection may take: the longest capture, and the time to
/// build its profile.
pub const CAPTURE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(MAX_CAPTURE_SECONDS + 60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_read_or_refused_with_a_reason() {
        let q = |s: &str| parse_query(s, 99);
        assert_eq!(
            q(""),
            Ok(ProfileQuery {
                seconds: DEFAULT_CAPTURE_SECONDS,
                pids: vec![]
            })
        );
        assert_eq!(
            q("seconds=10&pid=12,13&pid=12&hz=99"),
            Ok(ProfileQuery {
                seconds: 10,
                pids: vec![12, 13]
            })
        );
        for (bad, why) in [
            ("seconds=abc", "seconds: expected"),
            ("seconds=0", "out of range"),
            ("seconds=301", "out of range"),
            ("pid=abc", "pid: expected"),
            ("pid=0", "pid: expected"),
            ("pid=-1", "pid: expected"),
            ("hz=499", "samples at 99 Hz"),
            ("hz=x", "hz: expected"),
            ("debug=1", "unknown parameter"),
        ] {
            let err = q(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
            assert!(!err.contains('\n'), "{bad}: one line: {err}");
        }
    }
}
