//! Where finished profiles go: files (`writer`, `retention`), the push to
//! a Pyroscope server (`push`), the metrics and `/metrics` server
//! (`metrics`, with the on-demand profiles of `pprof_http` and the symbol
//! look-ups of `pprof_symbol`), and `publish`, which hands each profile to
//! all of them.

pub(crate) mod metrics;
pub(crate) mod otlp;
pub(crate) mod pprof_http;
pub(crate) mod pprof_symbol;
pub(crate) mod publish;
pub(crate) mod push;
pub(crate) mod retention;
pub mod writer;
