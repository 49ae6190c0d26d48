//! HTTP on the tests' side: a plain GET for scraping `/metrics` (and a
//! POST, for `/debug/pprof/symbol`), a reader
//! of the Prometheus text format, and a port nobody listens on. (The
//! stand-in Pyroscope server is in pyroscope/.)
//!
//! The metrics text is split by hand: a few lines here, strict (anything
//! unexpected fails the test), where a crate would bring a metrics model
//! into the test crate.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Bound on reading one response.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A local port that nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a port");
    listener.local_addr().expect("port").port()
}

/// GET `path` from `addr` with a one-shot HTTP/1.1 request: the status, the
/// headers (names lowercased) and the body.
pub fn get(addr: SocketAddr, path: &str) -> (u16, BTreeMap<String, String>, String) {
    get_with(addr, path, &[])
}

/// [`get`] with request `headers` (name, value) added.
pub fn get_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, BTreeMap<String, String>, String) {
    request(addr, "GET", path, headers, "")
}

/// POST `body` (text) to `path` at `addr`, as [`get`] does a GET.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, BTreeMap<String, String>, String) {
    request(addr, "POST", path, &[], body)
}

fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, BTreeMap<String, String>, String) {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let length = match method {
        "GET" => String::new(),
        _ => format!("content-length: {}\r\n", body.len()),
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{extra}{length}connection: close\r\n\r\n{body}"
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
