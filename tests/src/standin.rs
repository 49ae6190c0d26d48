//! The HTTP side of the tests' stand-in servers (Pyroscope, an OTLP
//! receiver): a thread that accepts connections on a local port, reads one
//! request from each, lets the server's handler decide the answer, writes
//! it, and keeps what the handler made of each request. Stopped when
//! dropped.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Bound on reading one request.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request read (OTLP/HTTP's recommended server limit; the
/// daemon's requests are a few MiB at most).
const MAX_REQUEST: usize = 64 << 20;

/// One request as read.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Header names lowercased.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    /// The parts the rules of a stand-in look at.
    pub fn parts(&self) -> (&str, &str, &BTreeMap<String, String>, &[u8]) {
        (&self.method, &self.path, &self.headers, &self.body)
    }
}

/// An answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    /// Headers besides the length and `connection: close`.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// A stand-in server keeping a `T` per request.
pub struct Server<T> {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<T>>>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Clone + Send + 'static> Server<T> {
    /// Starts serving; `handle` gets how many requests were answered
    /// before and the request, and gives what to keep and the answer.
    pub fn start(
        name: &str,
        mut handle: impl FnMut(usize, Request) -> (T, Reply) + Send + 'static,
    ) -> Server<T> {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the stand-in");
        let addr = listener.local_addr().expect("stand-in address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (got, err, halt) = (received.clone(), errors.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(name.into())
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
                        Ok(Some(request)) => {
                            let served = got.lock().unwrap().len();
                            let (kept, reply) = handle(served, request);
                            let _ = write_reply(&mut stream, &reply);
                            got.lock().unwrap().push(kept);
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
        Server {
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

    pub fn received(&self) -> Vec<T> {
        self.received.lock().unwrap().clone()
    }

    /// Requests that were not HTTP the stand-in could read, with why.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }
}

impl<T> Drop for Server<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn write_reply(stream: &mut TcpStream, reply: &Reply) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} Answer\r\n", reply.status);
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n",
        reply.body.len()
    ));
    stream.write_all(head.as_bytes())?;
    stream.write_all(&reply.body)
}

/// Reads one request; `None` when the peer closed the connection first.
fn read_request(stream: &mut TcpStream) -> Result<Option<Request>, String> {
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
            return Ok(Some(Request {
                method,
                path,
                headers,
                body: buf[head_len..head_len + len].to_vec(),
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

/// A golden request on disk: the body (`NAME.bin`) and, in
/// `NAME.headers`, the method and path, then the headers named in `keep`
/// (`name: value` lines; credentials are never kept).
pub fn save_golden(dir: &Path, name: &str, request: &Request, keep: &[&str]) {
    let Request {
        method,
        path,
        headers,
        body,
    } = request;
    std::fs::create_dir_all(dir).expect("creating the golden directory");
    std::fs::write(dir.join(format!("{name}.bin")), body).expect("writing a golden body");
    let mut head = format!("{method} {path}\n");
    for (k, v) in headers {
        if keep.contains(&k.as_str()) {
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
