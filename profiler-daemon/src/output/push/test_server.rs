//! A local HTTP server for the sinks' unit tests: answers each request as
//! scripted and keeps what it got.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

/// One request as the server saw it: head lines and body.
pub struct Seen {
    pub head: String,
    pub body: Vec<u8>,
}

/// A server on a local port that answers each request with the next of
/// `answers` (status line, body), then stops listening.
pub async fn answering(
    answers: Vec<(&'static str, &'static [u8])>,
) -> (std::net::SocketAddr, JoinHandle<Vec<Seen>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        for (status, body) in answers {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 65536];
            let (head, len) = loop {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).into_owned();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len: usize = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap();
                    break (text[..end].to_owned(), (end + 4, len));
                }
            };
            while got.len() < len.0 + len.1 {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            seen.push(Seen {
                head,
                body: got[len.0..len.0 + len.1].to_vec(),
            });
            let kind = match body.first() {
                Some(b'{') => "application/json",
                _ => "application/x-protobuf",
            };
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            s.write_all(body).await.unwrap();
        }
        seen
    });
    (addr, server)
}

/// A local port nothing listens on.
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
