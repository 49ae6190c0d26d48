//! One request to a profile server, and what its answer means: sent (with
//! the items a partial success refused), worth another try, or refused for
//! good. What differs between servers is a [`Protocol`]: Pyroscope's push
//! over Connect ([`CONNECT`]: `POST <base>/push.v1.PusherService/Push`,
//! `Content-Type: application/proto`, `Connect-Protocol-Version: 1`;
//! connection errors, timeouts, 408, 429 and 5xx but 501 retried) or
//! OTLP/HTTP (crate::output::otlp). Every request carries the tenant
//! (`X-Scope-OrgID`), the credentials and the extra headers it is set with.
//!
//! Secret files are re-read when they change (tokens are rotated in place);
//! if a re-read fails, the last good value is used and the failure logged
//! once. No secret and no URL userinfo is ever put in a log line.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use super::wire;
use crate::config::push::{Auth, Secret, SecretSource, read_secret};

/// Whole request, connection to answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of an error answer read for the log line.
const MAX_ERROR_BODY: usize = 4096;
/// Bytes of a success answer read, when the protocol reads it: a partial
/// success is a count and a message. A larger answer is an error that a
/// retry would not change (OTLP/HTTP: the client MUST bound it).
const MAX_SUCCESS_BODY: usize = 64 << 10;
/// Longest `Retry-After` honoured; the backoff's own bound.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Reads a success answer's body: the items it refused, and its message.
pub type ReadAccepted = fn(&[u8]) -> (u64, String);

/// What sets one server's protocol apart.
pub struct Protocol {
    /// The request body's content type.
    pub content_type: &'static str,
    /// Other headers every request carries (lowercase names).
    pub headers: &'static [(&'static str, &'static str)],
    /// Error answers that another try may change.
    pub retryable: fn(StatusCode) -> bool,
    /// The reason an error answer's body gives, on one line.
    pub error_reason: fn(&[u8]) -> String,
    /// Added to a 404 or 501 answer's log line.
    pub not_found_hint: &'static str,
    /// Reads a success answer's body: the items it says were refused and
    /// its message. `None`: the body is not read.
    pub accepted: Option<ReadAccepted>,
}

/// Pyroscope's push API over the Connect protocol's unary form.
pub const CONNECT: Protocol = Protocol {
    content_type: "application/proto",
    headers: &[
        ("connect-protocol-version", "1"),
        ("connect-timeout-ms", "10000"),
    ],
    retryable,
    error_reason: wire::error_reason,
    not_found_hint: " (no push API at this URL: Pyroscope 1.0 or later serves it)",
    accepted: None,
};

/// Where requests go and with what credentials.
#[derive(Clone, Debug)]
pub struct Target {
    /// The full URL, without userinfo (safe to log).
    pub url: String,
    /// `X-Scope-OrgID`.
    pub tenant: Option<String>,
    pub auth: Option<Auth>,
    /// Extra headers; values may be secrets and are never logged.
    pub headers: Vec<(String, Secret)>,
}

/// How one try ended.
#[derive(Debug)]
pub enum Outcome {
    /// Accepted; `refused` items of it were not taken (a partial success),
    /// and `note` is what the server said about it, if anything.
    Sent { refused: u64, note: String },
    /// Worth another try: a key for log-once, what happened, and how long
    /// the server asked to wait, if it did.
    Retry {
        key: String,
        what: String,
        after: Option<Duration>,
    },
    /// Not worth another try.
    Rejected { key: String, what: String },
}

/// A secret and where it is refreshed from.
struct Refreshing {
    source: SecretSource,
    current: Secret,
    modified: Option<SystemTime>,
    /// A failed re-read was logged.
    complained: bool,
}

impl Refreshing {
    fn new(source: SecretSource) -> Self {
        let (current, modified) = match &source {
            SecretSource::Url(s) => (s.clone(), None),
            SecretSource::File { path, first } => (first.clone(), modified(path)),
        };
        Refreshing {
            source,
            current,
            modified,
            complained: false,
        }
    }

    /// The secret, re-read first if its file changed since last read.
    fn get(&mut self) -> &str {
        if let SecretSource::File { path, .. } = &self.source {
            let now = modified(path);
            if now != self.modified {
                match read_secret(path) {
                    Ok(secret) => {
                        self.current = secret;
                        self.modified = now;
                        self.complained = false;
                    }
                    Err(why) if !self.complained => {
                        self.complained = true;
                        tracing::warn!(
                            "push credentials in {}: {why}; using the last value read",
                            path.display()
                        );
                    }
                    Err(_) => {}
                }
            }
        }
        self.current.expose()
    }
}

fn modified(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

enum Credentials {
    Basic { user: String, password: Refreshing },
    Bearer(Refreshing),
}

/// Sends push requests to one server.
pub struct Client {
    http: reqwest::Client,
    url: String,
    credentials: Option<Credentials>,
    /// Content type, the protocol's own, the tenant and the extra headers.
    headers: HeaderMap,
    protocol: &'static Protocol,
}

/// Why the client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The HTTP client could not be built (its TLS backend, for one); the
    /// chain of causes, without URLs.
    #[error("cannot set up the push client: {0}")]
    Http(String),
    /// A configured value is not a valid HTTP header part.
    #[error("cannot set up the push client: {what} cannot be sent as a header")]
    Header { what: &'static str },
    /// The thread that prepares uploads could not be started.
    #[error("cannot set up the push client: cannot start its thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl Client {
    pub fn new(settings: &Target, protocol: &'static Protocol) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            // A redirected POST would turn into a GET; say so instead.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("profilerd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Http(error_chain(&e.without_url())))?;
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static(protocol.content_type),
        );
        for (name, value) in protocol.headers {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let bad = |what: &'static str| ClientError::Header { what };
        if let Some(tenant) = &settings.tenant {
            headers.insert(
                HeaderName::from_static("x-scope-orgid"),
                HeaderValue::from_str(tenant).map_err(|_| bad("the tenant"))?,
            );
        }
        for (name, value) in &settings.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("a header name"))?;
            let mut value =
                HeaderValue::from_str(value.expose()).map_err(|_| bad("a header value"))?;
            value.set_sensitive(true);
            headers.append(name, value);
        }
        let credentials = settings.auth.clone().map(|auth| match auth {
            Auth::Basic { user, password } => Credentials::Basic {
                user,
                password: Refreshing::new(password),
            },
            Auth::Bearer(token) => Credentials::Bearer(Refreshing::new(token)),
        });
        Ok(Client {
            http,
            url: settings.url.clone(),
            credentials,
            headers,
            protocol,
        })
    }

    /// The URL requests go to (no userinfo: safe to log).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends one encoded request body.
    pub async fn send(&mut self, body: Bytes) -> Outcome {
        let mut request = self
            .http
            .post(&self.url)
            .headers(self.headers.clone())
            .body(body);
        request = match &mut self.credentials {
            None => request,
            Some(Credentials::Basic { user, password }) => {
                request.basic_auth(user.as_str(), Some(password.get()))
            }
            Some(Credentials::Bearer(token)) => request.bearer_auth(token.get()),
        };
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                let key = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "connect"
                } else {
                    "request"
                };
                return Outcome::Retry {
                    key: key.to_owned(),
                    what: error_chain(&e.without_url()),
                    after: None,
                };
            }
        };
        let status = response.status();
        let mut response = response;
        if status.is_success() {
            let Some(accepted) = self.protocol.accepted else {
                return Outcome::Sent {
                    refused: 0,
                    note: String::new(),
                };
            };
            let (body, whole) = read_at_most(&mut response, MAX_SUCCESS_BODY).await;
            if !whole {
                return Outcome::Rejected {
                    key: "answer too large".to_owned(),
                    what: format!(
                        "server answered {status} with more than {} KiB",
                        MAX_SUCCESS_BODY >> 10
                    ),
                };
            }
            let (refused, note) = accepted(&body);
            return Outcome::Sent { refused, note };
        }
        let after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, SystemTime::now()))
            .map(|d| d.min(MAX_BACKOFF));
        // Read at most a few KiB of the body, for the log line: a server
        // that answers with a flood must not take the daemon's memory.
        let (body, _) = read_at_most(&mut response, MAX_ERROR_BODY).await;
        let reason = (self.protocol.error_reason)(&body);
        let mut what = match reason.is_empty() {
            true => format!("server answered {status}"),
            false => format!("server answered {status}: {reason}"),
        };
        if matches!(status, StatusCode::NOT_FOUND | StatusCode::NOT_IMPLEMENTED) {
            what.push_str(self.protocol.not_found_hint);
        }
        let key = format!("status {}", status.as_u16());
        if (self.protocol.retryable)(status) {
            Outcome::Retry { key, what, after }
        } else {
            Outcome::Rejected { key, what }
        }
    }
}

/// At most `limit` bytes of `response`'s body, and whether that was all of
/// it (a body cut short by an error counts as whole: it is all there is).
async fn read_at_most(response: &mut reqwest::Response, limit: usize) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > limit {
                    body.truncate(limit);
                    return (body, false);
                }
            }
            Ok(None) | Err(_) => return (body, true),
        }
    }
}

/// A `Retry-After` value: seconds, or an HTTP date (RFC 9110), as the wait
/// from `now`; a date in the past is no wait.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or_default())
}

/// Answers that another try may change: the server is busy or failing
/// (429 is Connect's resource_exhausted, 503 unavailable, 500 internal or
/// unknown), or the request timed out. 501 (unimplemented) stays so.
pub fn retryable(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || (status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED)
}

/// An error and its causes on one line, each said once.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_answers_are_retried() {
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [301, 400, 401, 403, 404, 413, 415, 422, 501] {
            assert!(!retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn a_rotated_token_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "one\n").unwrap();
        let first = read_secret(&path).unwrap();
        let mut token = Refreshing::new(SecretSource::File {
            path: path.clone(),
            first,
        });
        assert_eq!(token.get(), "one");
        // A later mtime, as a rotation gives.
        std::fs::write(&path, "two\n").unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(token.get(), "two");
        // Gone: the last value stays.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(token.get(), "two");
    }
}
