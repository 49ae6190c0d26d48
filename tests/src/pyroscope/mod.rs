//! A stand-in Grafana Pyroscope server for the push tests: it decodes each
//! request with Pyroscope's published push API (`proto/`, compiled by
//! build.rs), checks it by the server's rules ([`rules`]), and answers as
//! the server does: 200 with an empty `PushResponse`, or a Connect error
//! (HTTP status and JSON `{code, message}`). It can also answer a scripted
//! error first (503, 429, ...), require a tenant and credentials (401
//! without them), and save what it got as golden files.

pub mod rules;

/// Pyroscope's push API messages, generated from `proto/`, under their
/// package paths (the generated code refers to `types.v1` by its path).
pub mod api {
    pub mod push {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
        }
    }
    pub mod types {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/types.v1.rs"));
        }
    }
}

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use rules::{HttpRequest, Refusal, Stored};

/// Bound on reading one request.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request read (the server's body limit is far larger, but the
/// daemon's uploads are a few MiB at most).
const MAX_REQUEST: usize = 64 << 20;

/// One request the stand-in got, and its answer.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names lowercased.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    pub status: u16,
    /// The refusal, when not 200.
    pub refusal: Option<Refusal>,
    /// What the server would store, when accepted.
    pub stored: Vec<Stored>,
}

/// How the stand-in behaves.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// Connect codes answered to the first requests, whatever they hold
    /// (`unavailable`: 503, `resource_exhausted`: 429, ...).
    pub fail_first: Vec<&'static str>,
    /// `X-Scope-OrgID` required, as with multitenancy on.
    pub tenant: Option<String>,
    /// The `Authorization` header required (as a gateway in front would).
    pub authorization: Option<String>,
}

/// The stand-in server, in a thread; stopped when dropped.
pub struct Pyroscope {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pyroscope {
    pub fn start(behaviour: Behaviour) -> Pyroscope {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the stand-in");
        let addr = listener.local_addr().expect("stand-in address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (got, err, halt) = (received.clone(), errors.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("pyroscope".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if halt.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(mut stream) = stream else { continue };
                    // One request per connection (the answer says
                    // `connection: close`).
                    match read_request(&mut stream) {
                        Ok(None) => {}
                        Ok(Some(mut r)) => {
                            let served = got.lock().unwrap().len();
                            answer(&behaviour, served, &mut r);
                            let _ = reply(&mut stream, &r);
                            got.lock().unwrap().push(r);
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
            .expect("spawning the stand-in");
        Pyroscope {
            addr,
            received,
            errors,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`, the server's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Requests that were not HTTP the stand-in could read, with why.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }
}

impl Drop for Pyroscope {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Decides the answer: a scripted failure, a missing tenant or credentials
/// (401, as the server's auth middleware), else the server's rules.
fn answer(b: &Behaviour, served: usize, r: &mut Received) {
    let refusal = if let Some(&code) = b.fail_first.get(served) {
        Some(Refusal {
            code,
            message: "scripted failure".into(),
        })
    } else if b.tenant.is_some() && r.headers.get("x-scope-orgid") != b.tenant.as_ref() {
        Some(Refusal {
            code: "unauthenticated",
            message: "no org id".into(),
        })
    } else if b.authorization.is_some()
        && r.headers.get("authorization") != b.authorization.as_ref()
    {
        Some(Refusal {
            code: "unauthenticated",
            message: "authentication required".into(),
        })
    } else {
        let request = HttpRequest {
            method: &r.method,
            path: &r.path,
            headers: &r.headers,
            body: &r.body,
        };
        match rules::check(&request, SystemTime::now()) {
            Ok(stored) => {
                r.stored = stored;
                None
            }
            Err(refusal) => Some(refusal),
        }
    };
    r.status = refusal.as_ref().map_or(200, Refusal::status);
    r.refusal = refusal;
}

fn reply(stream: &mut TcpStream, r: &Received) -> std::io::Result<()> {
    match &r.refusal {
        None => write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/proto\r\ncontent-length: 0\r\n\
             connection: close\r\n\r\n"
        ),
        Some(refusal) => {
            let body = refusal.body();
            write!(
                stream,
                "HTTP/1.1 {} Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                refusal.status(),
                body.len()
            )
        }
    }
}

/// Reads one request; `None` when the peer closed the connection first.
fn read_request(stream: &mut TcpStream) -> Result<Option<Received>, String> {
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
            let headers: BTreeMap<String, String> = req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let len: usize = headers
                .get("content-length")
                .ok_or("no Content-Length")?
                .trim()
                .parse()
                .map_err(|_| "bad Content-Length")?;
            if len > MAX_REQUEST {
                return Err(format!("request of {len} bytes"));
            }
            let path = req.path.ok_or("no path")?.to_owned();
            let method = req.method.ok_or("no method")?.to_owned();
            while buf.len() < head_len + len {
                let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("body cut short".into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(Some(Received {
                method,
                path,
                headers,
                body: buf[head_len..head_len + len].to_vec(),
                status: 0,
                refusal: None,
                stored: Vec::new(),
            }));
        }
        if buf.len() > 64 * 1024 {
            return Err("request head too long".into());
        }
        let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return match buf.is_empty() {
                true => Ok(None),
                false => Err("connection closed in the head".into()),
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A golden request on disk: the body (`NAME.bin`) and the headers that
/// make it a push (`NAME.headers`, `name: value` lines, credentials left
/// out).
pub fn save_golden(dir: &Path, name: &str, r: &Received) {
    std::fs::create_dir_all(dir).expect("creating the golden directory");
    std::fs::write(dir.join(format!("{name}.bin")), &r.body).expect("writing a golden body");
    let mut head = format!("{} {}\n", r.method, r.path);
    for (k, v) in &r.headers {
        if matches!(k.as_str(), "content-type" | "connect-protocol-version") {
            head.push_str(&format!("{k}: {v}\n"));
        }
    }
    std::fs::write(dir.join(format!("{name}.headers")), head).expect("writing golden headers");
}

/// Reads a golden request saved by [`save_golden`]: (method, path,
/// headers, body).
pub fn read_golden(dir: &Path, name: &str) -> (String, String, BTreeMap<String, String>, Vec<u8>) {
    let body = std::fs::read(dir.join(format!("{name}.bin"))).expect("reading a golden body");
    let head = std::fs::read_to_string(dir.join(format!("{name}.headers")))
        .expect("reading golden headers");
    let mut lines = head.lines();
    let (method, path) = lines
        .next()
        .and_then(|l| l.split_once(' '))
        .expect("METHOD PATH line");
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    (method.to_owned(), path.to_owned(), headers, body)
}
