//! Observability beside the model thread, not under it: what a request leaves behind once it
//! is answered. The one record they share is the access log's [`access_log::Record`] (with
//! its [`access_log::Trace`] of queue, pre-processing and pass timings); `access_log` writes
//! it as a line, `spans` as OTLP spans, and `trace_context` carries the W3C context a
//! request arrives with. The runner hands back plain timings (`runner::SharedPass`); nothing
//! here is imported by the model's code.

pub mod access_log;
pub mod spans;
pub mod trace_context;
