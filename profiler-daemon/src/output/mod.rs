//! Where finished profiles go: files (`writer`, `retention`), the push to
//! a Pyroscope server (`push`), the metrics and `/metrics` server
//! (`metrics`), and `publish`, which hands each profile to all of them.

pub(crate) mod metrics;
pub(crate) mod otlp;
pub(crate) mod pprof_http;
pub(crate) mod publish;
pub(crate) mod push;
pub(crate) mod retention;
pub mod writer;
