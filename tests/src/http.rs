//! HTTP on the tests' side: a receiver that stands in for a Pyroscope
//! server (records every request, answers 503 to the first N), a plain GET
//! for scraping `/metrics`, and a reader of the Prometheus text format.
//!
//! Requests are parsed with `httparse` and query strings with
//! `form_urlencoded`. The multipart body and the metrics text are split by
//! hand: both are a few lines here, strict (anything unexpected fails the
//! test), and a crate for either would bring an async stack or a metrics
//! model into the test crate for that.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Bound on reading one request or response.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request the receiver takes (profiles are far smaller).
const MAX_REQUEST: usize = 64 << 20;

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Decoded query parameters (a repeated key keeps its last value).
    pub query: BTreeMap<String, String>,
    pub content_type: String,
    /// Multipart fields by name: the bytes of each part.
    pub parts: BTreeMap<String, Vec<u8>>,
    /// The status the receiver answered.
    pub status: u16,
}

/// A local HTTP server in a thread that records each request and answers
/// 503 to the first `fail_first`, 200 after. Stopped when dropped.
pub struct Receiver {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Received>>>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    pub fn start(fail_first: usize) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the receiver");
        let addr = listener.local_addr().expect("receiver address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (req, err, halt) = (requests.clone(), errors.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("receiver".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if halt.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(mut stream) = stream else { continue };
                    let served = req.lock().unwrap().len();
                    let status = if served < fail_first { 503 } else { 200 };
                    match read_request(&mut stream) {
                        Ok(mut r) => {
                            r.status = status;
                            req.lock().unwrap().push(r);
                            let reason = if status == 200 { "OK" } else { "Service Unavailable" };
                            let body = if status == 200 { "" } else { "try later\n" };
                            let _ = write!(
                                stream,
                                "HTTP/1.1 {status} {reason}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                                body.len()
                            );
                        }
                        Err(e) => {
                            err.lock().unwrap().push(e);
                            let _ = stream.write_all(
                                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                            );
                        }
                    }
                }
            })
            .expect("spawning the receiver");
        Receiver {
            addr,
            requests,
            errors,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT` (no path: the daemon adds `/ingest`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.requests.lock().unwrap().clone()
    }

    /// Requests that could not be parsed, with why.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A local port that nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a port");
    listener.local_addr().expect("port").port()
}

fn read_request(stream: &mut TcpStream) -> Result<Received, String> {
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(head_len) = req
            .parse(&buf)
            .map_err(|e| format!("bad request head: {e}"))?
        {
            let header = |name: &str| {
                req.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned())
            };
            let len: usize = header("content-length")
                .ok_or("no Content-Length")?
                .trim()
                .parse()
                .map_err(|_| "bad Content-Length")?;
            if len > MAX_REQUEST {
                return Err(format!("request of {len} bytes"));
            }
            let content_type = header("content-type").unwrap_or_default();
            let target = req.path.ok_or("no path")?.to_owned();
            let method = req.method.ok_or("no method")?.to_owned();
            while buf.len() < head_len + len {
                let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("body cut short".into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = &buf[head_len..head_len + len];
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            let query = form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect();
            let parts = match content_type.strip_prefix("multipart/form-data; boundary=") {
                Some(boundary) => multipart_fields(body, boundary.trim_matches('"'))?,
                None => BTreeMap::new(),
            };
            return Ok(Received {
                method,
                path: path.to_owned(),
                query,
                content_type,
                parts,
                status: 0,
            });
        }
        if buf.len() > 64 * 1024 {
            return Err("request head too long".into());
        }
        let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed in the head".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The fields of a multipart/form-data body (RFC 7578): parts between
/// `--boundary` lines, each with headers (the field's name in
/// Content-Disposition), a blank line and the content.
fn multipart_fields(body: &[u8], boundary: &str) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let delimiter = format!("--{boundary}");
    let d = delimiter.as_bytes();
    let find = |from: usize| {
        body[from..]
            .windows(d.len())
            .position(|w| w == d)
            .map(|p| p + from)
    };
    let mut fields = BTreeMap::new();
    let mut at = find(0).ok_or("no first boundary")?;
    loop {
        let after = at + d.len();
        if body[after..].starts_with(b"--") {
            return Ok(fields);
        }
        let start = after + 2; // CRLF after the boundary
        let head_end = body[start..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("part without headers")?
            + start;
        let head = String::from_utf8_lossy(&body[start..head_end]);
        let name = head
            .lines()
            .find(|l| {
                l.to_ascii_lowercase()
                    .starts_with("content-disposition: form-data;")
            })
            .and_then(|l| l.split("name=\"").nth(1))
            .and_then(|rest| rest.split('"').next())
            .ok_or_else(|| format!("part without a name: {head}"))?
            .to_owned();
        let next = find(head_end + 4).ok_or("part without an end")?;
        // The content ends with the CRLF before the next boundary.
        let content = body[head_end + 4..next]
            .strip_suffix(b"\r\n")
            .ok_or("part content without CRLF")?;
        fields.insert(name, content.to_vec());
        at = next;
    }
}

/// GET `path` from `addr` with a one-shot HTTP/1.1 request: the status, the
/// headers (names lowercased) and the body.
pub fn get(addr: SocketAddr, path: &str) -> (u16, BTreeMap<String, String>, String) {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("reading from {addr}: {e}"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head: {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

/// One sample line of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition: `# HELP` and `# TYPE` per metric name, and the
/// samples.
#[derive(Debug, Default)]
pub struct Exposition {
    pub help: BTreeMap<String, String>,
    pub types: BTreeMap<String, String>,
    pub samples: Vec<MetricSample>,
}

impl Exposition {
    /// The value of `name` with exactly these labels; panics if absent.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
            .unwrap_or_else(|| panic!("no sample {name}{want:?} in the exposition"))
    }
}

/// Parses Prometheus text format 0.0.4 as profilerd writes it: label values
/// without escaped quotes, no timestamps. Panics on a line it cannot read.
pub fn parse_exposition(text: &str) -> Exposition {
    let mut out = Exposition::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.help.insert(name.to_owned(), help.to_owned());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .unwrap_or_else(|| panic!("bad TYPE line {line:?}"));
            out.types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line:?}");
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("bad labels in {line:?}"));
                let labels = inner
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|pair| {
                        let (k, v) = pair
                            .split_once('=')
                            .unwrap_or_else(|| panic!("bad label in {line:?}"));
                        (k.to_owned(), v.trim_matches('"').to_owned())
                    })
                    .collect();
                (name, labels)
            }
            None => (series, BTreeMap::new()),
        };
        out.samples.push(MetricSample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    out
}
