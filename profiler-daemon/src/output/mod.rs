//! Where finished profiles go: files (`writer`, `retention`), the push to
//! a Pyroscope server (`push`), the metrics and `/metrics` server
//! (`metrics`), and `publish`, which hands each profile to all of them.

pub mod metrics;
pub mod publish;
pub mod push;
pub mod retention;
pub mod writer;
