//! OpenTelemetry spans of the requests this worker answers (issue 58), exported over
//! OTLP/HTTP when the standard `OTEL_*` variables ask for it (`vramfork::otel`; off by
//! default). Built on the answering thread when a sampled request is answered, from what the
//! access log's record holds (a few small allocations), then pushed into the exporter's
//! queue; encoding and sending are the exporter thread's:
//!
//! - a SERVER span per request (`POST /`, `POST /v2/models/{model_name}/infer`, the gRPC
//!   method's full name …), child of the caller's span when it sent a `traceparent`, with the
//!   id the answer's `traceparent` names;
//! - for a model request, its children: `queue` (from arrival to the start of its pass:
//!   the listen queue and the model queue), `forward` (the pass, when it ran alone) and
//!   `answer` (from the end of the pass to the answer);
//! - a batched pass: one `forward` span of its own trace linking to its members' SERVER
//!   spans (`pass.rs`), each member's SERVER span naming it (`vramfork.pass.*`);
//! - attributes of the HTTP and RPC conventions, the request id, the worker's pid and slot
//!   — never a payload (the path without its query, never a body);
//! - an answer of 400 or more has the ERROR status and `error.type` its status code.
//!
//! | file | owns |
//! |---|---|
//! | `otlp.rs` | OTLP's trace messages (protobuf) |
//! | `export.rs` | the bounded queue, the exporter thread, the POST, the drop counter |
//! | `pass.rs` | a batched pass's one span and its links |

mod export;
mod otlp;
pub mod pass;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use hyper::header::HeaderMap;

use crate::access_log::Record;
use crate::trace_context::TraceContext;
use export::Exporter;
use otlp::{kv, Value};
use vramfork::otel::Sampler;

/// This worker's spans: the sampler, and the exporter they go to.
pub struct Spans {
    sampler: Sampler,
    exporter: Arc<Exporter>,
    pid: u32,
    slot: u32,
}

impl Spans {
    /// From the `OTEL_*` variables this worker inherited (the master checked them): `None`
    /// when export is off.
    pub fn from_env(slot: u32) -> Option<Spans> {
        let env = |k: &str| std::env::var(k).ok();
        let config = match vramfork::otel::from_env(&env) {
            Ok((Some(c), _)) => c,
            Ok((None, _)) => return None,
            Err(e) => {
                tracing::warn!(
                    event = "trace_export_setting_ignored",
                    "{e}; spans are not exported"
                );
                return None;
            }
        };
        let pid = std::process::id();
        let resource = vec![
            kv("process.pid", Value::Int(pid.into())),
            kv("vramfork.worker.slot", Value::Int(slot.into())),
        ];
        Some(Spans {
            sampler: config.sampler.clone(),
            exporter: Exporter::start(config, resource),
            pid,
            slot,
        })
    }

    /// A request's trace context, sampled by this worker's sampler.
    pub fn context(spans: Option<&Spans>, headers: &HeaderMap) -> TraceContext {
        let mut t = TraceContext::of(headers);
        if let Some(s) = spans {
            t.sample(&s.sampler);
        }
        t
    }

    /// The spans of an answered request, when its trace is sampled.
    pub fn record(&self, r: &Record) {
        if !r.context.sampled() {
            return;
        }
        self.exporter.push(spans_of(r, self.pid, self.slot));
        if let Some(pass) = r
            .trace
            .as_ref()
            .and_then(|t| t.timing())
            .and_then(|t| t.pass)
        {
            let ctx = &r.context;
            pass.link(
                otlp::hex_bytes(ctx.trace_id()),
                otlp::hex_bytes(ctx.span_id()),
                &r.request_id,
                &self.exporter,
            );
        }
    }

    /// The span of a gRPC call this worker handed to the sibling on `seat` (which records
    /// the call and its pass as children of this span), when its trace is sampled.
    pub fn handed(&self, r: &Record, seat: u32) {
        if r.context.sampled() {
            let mut spans = spans_of(r, self.pid, self.slot);
            spans[0]
                .attributes
                .push(kv("vramfork.handoff.seat", Value::Int(seat.into())));
            self.exporter.push(spans);
        }
    }

    /// Spans dropped so far (`vramfork_trace_spans_dropped_total`).
    pub fn dropped(&self) -> u64 {
        self.exporter.dropped()
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The span's name and its protocol's attributes: the HTTP method and route (the path with
/// the model's name and version as templates), or the gRPC service and method.
fn name_and_protocol(r: &Record) -> (String, Vec<otlp::KeyValue>) {
    let path = r.target.split('?').next().unwrap_or("");
    if let Some(full) = path.strip_prefix("/inference.") {
        let (service, method) = full.split_once('/').unwrap_or((full, ""));
        let attrs = vec![
            kv("rpc.system", Value::String("grpc".into())),
            kv("rpc.service", Value::String(format!("inference.{service}"))),
            kv("rpc.method", Value::String(method.into())),
        ];
        return (path.trim_start_matches('/').to_string(), attrs);
    }
    let route = route(path);
    let attrs = vec![
        kv("http.request.method", Value::String(r.method.clone())),
        kv("url.path", Value::String(path.to_string())),
        kv("http.route", Value::String(route.clone())),
        kv("http.response.status_code", Value::Int(r.status.into())),
    ];
    (format!("{} {route}", r.method), attrs)
}

/// `/v2/models/NAME[/versions/V]/…` with the name and version as templates; other paths as
/// they are (they name no data).
fn route(path: &str) -> String {
    let Some(rest) = path.strip_prefix("/v2/models/") else {
        return path.to_string();
    };
    let mut parts: Vec<&str> = rest.split('/').collect();
    if !parts.is_empty() {
        parts[0] = "{model_name}";
    }
    if parts.len() > 2 && parts[1] == "versions" {
        parts[2] = "{model_version}";
    }
    format!("/v2/models/{}", parts.join("/"))
}

/// The SERVER span of `r` and, for a model request, its queue, forward and answer spans.
fn spans_of(r: &Record, pid: u32, slot: u32) -> Vec<otlp::Span> {
    let ctx = &r.context;
    let trace_id = otlp::hex_bytes(ctx.trace_id());
    let server_id = otlp::hex_bytes(ctx.span_id());
    let end = r.time;
    let start = end.checked_sub(r.total).unwrap_or(end);
    let (name, mut attributes) = name_and_protocol(r);
    attributes.push(kv(
        "vramfork.request_id",
        Value::String(r.request_id.clone()),
    ));
    attributes.push(kv("process.pid", Value::Int(pid.into())));
    attributes.push(kv("vramfork.worker.slot", Value::Int(slot.into())));
    let timing = r.trace.as_ref().and_then(|t| t.timing());
    if let Some(t) = &timing {
        attributes.push(kv("vramfork.batch.size", Value::Int(t.batch.into())));
        if let Some(p) = &t.pass {
            attributes.push(kv("vramfork.pass.trace_id", Value::String(p.trace_hex())));
            attributes.push(kv("vramfork.pass.span_id", Value::String(p.span_hex())));
        }
    }
    let status = (r.status >= 400).then(|| {
        attributes.push(kv("error.type", Value::String(r.status.to_string())));
        otlp::Status {
            message: String::new(),
            code: otlp::STATUS_ERROR,
        }
    });
    let span =
        |id: Vec<u8>, parent: Vec<u8>, name: &str, kind, from, to, attributes, status| otlp::Span {
            trace_id: trace_id.clone(),
            span_id: id,
            trace_state: String::new(),
            parent_span_id: parent,
            name: name.to_string(),
            kind,
            start_time_unix_nano: nanos(from),
            end_time_unix_nano: nanos(to),
            attributes,
            links: Vec::new(),
            status,
            flags: 1,
        };
    let parent = ctx
        .parent_span_id()
        .map(otlp::hex_bytes)
        .unwrap_or_default();
    let mut out = vec![span(
        server_id.clone(),
        parent,
        &name,
        otlp::KIND_SERVER,
        start,
        end,
        attributes,
        status,
    )];
    if let Some(t) = timing {
        let ran = start + t.waited;
        let done = (ran + t.took).min(end);
        let child = |name: &str, from, to, attributes| {
            span(
                otlp::hex_bytes(&format!("{:016x}", crate::request_id::unique().max(1))),
                server_id.clone(),
                name,
                otlp::KIND_INTERNAL,
                from,
                to,
                attributes,
                None,
            )
        };
        out.push(child("queue", start, ran.min(end), Vec::new()));
        // A batched pass is one span of its own (`pass.rs`), not a child of each member.
        if t.pass.is_none() {
            out.push(child(
                "forward",
                ran.min(end),
                done,
                vec![
                    kv("vramfork.batch.size", Value::Int(t.batch.into())),
                    kv("vramfork.inline", Value::Bool(t.inline)),
                ],
            ));
        }
        out.push(child("answer", done, end, Vec::new()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_no_model_and_no_query() {
        assert_eq!(route("/"), "/");
        assert_eq!(
            route("/v2/models/mlp/infer"),
            "/v2/models/{model_name}/infer"
        );
        assert_eq!(
            route("/v2/models/mlp/versions/3/infer"),
            "/v2/models/{model_name}/versions/{model_version}/infer"
        );
        assert_eq!(route("/v1/embeddings"), "/v1/embeddings");
    }
}
