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

use std::path::Path;
use std::time::SystemTime;

use crate::standin::{Reply, Request, Server};
use rules::{HttpRequest, Refusal, Stored};

/// One request the stand-in got, and its answer.
#[derive(Debug, Clone)]
pub struct Received {
    pub http: Request,
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
    server: Server<Received>,
}

impl Pyroscope {
    pub fn start(behaviour: Behaviour) -> Pyroscope {
        let server = Server::start("pyroscope", move |served, request: Request| {
            let mut r = Received {
                http: request,
                status: 0,
                refusal: None,
                stored: Vec::new(),
            };
            answer(&behaviour, served, &mut r);
            let reply = reply(&r);
            (r, reply)
        });
        Pyroscope { server }
    }

    /// `http://127.0.0.1:PORT`, the server's base URL.
    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn received(&self) -> Vec<Received> {
        self.server.received()
    }

    /// Requests that were not HTTP the stand-in could read, with why.
    pub fn errors(&self) -> Vec<String> {
        self.server.errors()
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
    } else if b.tenant.is_some() && r.http.headers.get("x-scope-orgid") != b.tenant.as_ref() {
        Some(Refusal {
            code: "unauthenticated",
            message: "no org id".into(),
        })
    } else if b.authorization.is_some()
        && r.http.headers.get("authorization") != b.authorization.as_ref()
    {
        Some(Refusal {
            code: "unauthenticated",
            message: "authentication required".into(),
        })
    } else {
        let (method, path, headers, body) = r.http.parts();
        let request = HttpRequest {
            method,
            path,
            headers,
            body,
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

fn reply(r: &Received) -> Reply {
    match &r.refusal {
        None => Reply {
            status: 200,
            headers: vec![("content-type".into(), "application/proto".into())],
            body: Vec::new(),
        },
        Some(refusal) => Reply {
            status: refusal.status(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: refusal.body().into_bytes(),
        },
    }
}

/// Saves `r` as a golden request (standin::save_golden) with the headers
/// that make it a push.
pub fn save_golden(dir: &Path, name: &str, r: &Received) {
    crate::standin::save_golden(
        dir,
        name,
        &r.http,
        &["content-type", "connect-protocol-version"],
    );
}

pub use crate::standin::read_golden;
