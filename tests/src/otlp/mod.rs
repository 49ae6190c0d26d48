//! A stand-in OpenTelemetry profiles receiver (OTLP/HTTP) for the export
//! tests: it decodes each request with code generated from the published
//! `.proto` files (`proto/opentelemetry/`, opentelemetry-proto v1.11.0,
//! `v1development`), checks it by the proto's and the protocol's rules
//! ([`rules`]), and answers as an OTLP/HTTP server does: 200 with an
//! `ExportProfilesServiceResponse` (a partial success if scripted), or an
//! error status with a `google.rpc.Status` body (`Retry-After` on the
//! scripted 429 and 503). It can require an `Authorization` header (401
//! without it), and save what it got as golden files (pyroscope's format).

pub mod flat;
pub mod rules;

/// The published messages, generated from `proto/`, under their package
/// paths (the generated code refers to the others by their paths).
pub mod api {
    pub mod opentelemetry {
        pub mod proto {
            pub mod common {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.common.v1.rs"
                    ));
                }
            }
            pub mod resource {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.resource.v1.rs"
                    ));
                }
            }
            pub mod profiles {
                pub mod v1development {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.profiles.v1development.rs"
                    ));
                }
            }
            pub mod collector {
                pub mod profiles {
                    pub mod v1development {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/opentelemetry.proto.collector.profiles.v1development.rs"
                        ));
                    }
                }
            }
        }
    }
    pub mod google {
        pub mod rpc {
            include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
        }
    }
}

use std::collections::BTreeMap;
use std::time::SystemTime;

use prost::Message;

use crate::standin::{Reply, Request, Server};
use api::opentelemetry::proto::collector::profiles::v1development::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};

/// One request the stand-in got, and its answer.
#[derive(Debug, Clone)]
pub struct Received {
    /// As sent (the body gzipped when the request says so).
    pub http: Request,
    pub status: u16,
    /// Why it was refused, when not 200.
    pub refusal: Option<String>,
    /// The decoded request, when it passed the rules.
    pub request: Option<ExportProfilesServiceRequest>,
}

/// How the stand-in behaves.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// HTTP statuses answered to the first requests, whatever they hold;
    /// 429 and 503 come with `Retry-After: 1`.
    pub fail_first: Vec<u16>,
    /// Accepted requests (by their order among accepted ones) answered
    /// with a partial success refusing this many profiles.
    pub partial: BTreeMap<usize, i64>,
    /// The `Authorization` header required.
    pub authorization: Option<String>,
}

/// The stand-in receiver, in a thread; stopped when dropped.
pub struct Receiver {
    server: Server<Received>,
}

impl Receiver {
    pub fn start(behaviour: Behaviour) -> Receiver {
        let mut accepted = 0usize;
        let server = Server::start("otlp", move |served, request: Request| {
            let (received, reply) = answer(&behaviour, served, &mut accepted, request);
            (received, reply)
        });
        Receiver { server }
    }

    /// `http://127.0.0.1:PORT`, the receiver's base URL.
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

fn answer(
    b: &Behaviour,
    served: usize,
    accepted: &mut usize,
    request: Request,
) -> (Received, Reply) {
    let mut r = Received {
        http: request,
        status: 200,
        refusal: None,
        request: None,
    };
    let refused = if let Some(&status) = b.fail_first.get(served) {
        Some((status, "scripted failure".to_owned()))
    } else if b.authorization.is_some()
        && r.http.headers.get("authorization") != b.authorization.as_ref()
    {
        Some((401, "authentication required".to_owned()))
    } else {
        let (method, path, headers, body) = r.http.parts();
        let http = rules::HttpRequest {
            method,
            path,
            headers,
            body,
        };
        match rules::check(&http, SystemTime::now()) {
            Ok(request) => {
                r.request = Some(request);
                None
            }
            Err((status, why)) => Some((status, why)),
        }
    };
    let reply = match refused {
        Some((status, why)) => {
            r.status = status;
            let mut headers = vec![("content-type".into(), "application/x-protobuf".into())];
            if matches!(status, 429 | 503) {
                headers.push(("retry-after".into(), "1".into()));
            }
            let body = api::google::rpc::Status {
                code: 0,
                message: why.clone(),
                details: Vec::new(),
            }
            .encode_to_vec();
            r.refusal = Some(why);
            Reply {
                status,
                headers,
                body,
            }
        }
        None => {
            let partial_success = b
                .partial
                .get(accepted)
                .map(|&n| ExportProfilesPartialSuccess {
                    rejected_profiles: n,
                    error_message: format!("scripted: {n} profiles refused"),
                });
            *accepted += 1;
            Reply {
                status: 200,
                headers: vec![("content-type".into(), "application/x-protobuf".into())],
                body: ExportProfilesServiceResponse { partial_success }.encode_to_vec(),
            }
        }
    };
    (r, reply)
}
