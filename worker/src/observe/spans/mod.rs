//! OpenTelemetry spans of the requests this worker answers, exported over
//! OTLP/HTTP when the standard `OTEL_*` variables ask for it (`vramfork::otel`, read by the
//! master and handed over in the worker's configuration; off by default). A sampled request's record (what its access line is made of) is queued when it
//! is answered; the exporter thread builds its spans, encodes and sends them:
//!
//! - a SERVER span per request (`POST /`, `POST /v2/models/{model_name}/infer`, the gRPC
//!   method's full name …), child of the caller's span when it sent a `traceparent`, with the
//!   id the answer's `traceparent` names;
//! - for a model request, its children: `tokenize` (`/v1/embeddings`' tokenizing, with its
//!   counts), `preprocess` (its documents tokenized or decoded by the pipeline, on
//!   `POST /`, v2 and gRPC, with their counts), `queue` (its wait, the listen queue and the model queue, ending at the start of
//!   its pass), `forward` (the pass, when it ran alone) and `answer` (from the end of the
//!   pass to the answer);
//! - a batched pass: one `forward` span of its own trace linking to its members' SERVER
//!   spans (`pass.rs`), each member's SERVER span naming it (`vramfork.pass.*`);
//! - attributes of the HTTP and RPC conventions, the request id, the worker's pid and slot
//!   — never a payload (the path without its query, never a body);
//! - an answer of 400 or more has the ERROR status and `error.type` its status code;
//! - a gRPC call handed to a sibling: this worker's SERVER span with
//!   `vramfork.handoff.seat`, the parent of the sibling's (it sends its own `traceparent`);
//! - health and readiness probes ([`is_probe`]): nothing.
//!
//! | file | owns |
//! |---|---|
//! | `otlp.rs` | OTLP's trace messages, written straight into protobuf bytes |
//! | `export.rs` | the bounded queue, the exporter thread, the drop counter |
//! | `transport.rs` | one export's trip: the connection kept open, or a new one (each address in turn) |
//! | `connection.rs` | a kept connection (TCP or TLS): its exchange, whether it is still open |
//! | `answer.rs` | the collector's answer read whole (its length known, or the connection closed) |
//! | `pass.rs` | a batched pass's one span and its links |

mod answer;
mod connection;
mod export;
mod otlp;
mod pass;
mod transport;

use std::sync::Arc;
use std::time::SystemTime;

use hyper::header::HeaderMap;

use crate::observe::access_log::{Record, Trace};
use crate::observe::trace_context::TraceContext;
use export::Exporter;
use otlp::Value;
use vramfork::otel::{OtelConfig, Sampler};

/// This worker's spans: the sampler, and the exporter they go to.
pub struct Spans {
    sampler: Sampler,
    exporter: Arc<Exporter>,
    pid: u32,
    slot: u32,
}

impl Spans {
    /// The export the master read from the `OTEL_*` variables and handed over in the
    /// worker's configuration: `None` when export is off.
    pub fn new(config: Option<OtelConfig>, slot: u32) -> Option<Spans> {
        let config = config?;
        let pid = std::process::id();
        let resource = vec![
            ("process.pid", i64::from(pid)),
            ("vramfork.worker.slot", i64::from(slot)),
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

    /// Whether an answered request's spans are exported: its trace is sampled, and it is
    /// no probe.
    pub fn wants(&self, r: &Record) -> bool {
        r.context.sampled() && !is_probe(&r.target)
    }

    /// Queues the spans of an answered request that [`Spans::wants`], built on the
    /// exporter thread.
    pub fn record(&self, r: Record) {
        self.queue(r, None);
    }

    /// The span of a gRPC call this worker handed to the sibling on `seat` (which records
    /// the call and its pass as children of this span), when its trace is sampled.
    pub fn handed(&self, r: Record, seat: u32) {
        if r.context.sampled() {
            self.queue(r, Some(seat));
        }
    }

    fn queue(&self, record: Record, handoff: Option<u32>) {
        self.exporter.later(Box::new(Answered {
            record,
            handoff,
            pid: self.pid,
            slot: self.slot,
            exporter: self.exporter.clone(),
        }));
    }

    /// Spans dropped so far (`vramfork_trace_spans_dropped_total`).
    pub fn dropped(&self) -> u64 {
        self.exporter.dropped()
    }
}

/// An answered request as the exporter thread makes its spans of it.
struct Answered {
    record: Record,
    /// The sibling's seat, when this worker handed the call to it.
    handoff: Option<u32>,
    pid: u32,
    slot: u32,
    /// Where its batched pass's span goes, once it links to it.
    exporter: Arc<Exporter>,
}

impl export::Build for Answered {
    fn count(&self) -> usize {
        let Some(trace) = self.record.trace.as_ref() else {
            return 1;
        };
        // Each pass's queue, and its forward when it ran alone; one answer after the last.
        let (passes, alone) = trace.pass_counts();
        1 + passes
            + alone
            + usize::from(passes > 0)
            + usize::from(trace.tokenize().is_some())
            + usize::from(trace.preprocess().is_some())
    }

    fn build(self: Box<Self>, into: &mut Vec<u8>) -> usize {
        let r = &self.record;
        let passes = r.trace.as_ref().map(|t| t.passes()).unwrap_or_default();
        let ids = Ids {
            trace: otlp::hex_bytes(r.context.trace_id()),
            server: otlp::hex_bytes(r.context.span_id()),
        };
        let n = spans_of(r, &passes, &ids, (self.pid, self.slot, self.handoff), into);
        for pass in passes.into_iter().filter_map(|t| t.pass) {
            pass::PassSpan::of(&pass).link(ids.trace, ids.server, &r.request_id, &self.exporter);
        }
        n
    }
}

/// Whether `target` (a path, with its query or not) is a probe of the serving port: health
/// and readiness, HTTP's and gRPC's, which orchestrators ask every few seconds. Their spans
/// are never exported (and their context is not sampled here: a new trace is `00`, a
/// caller's flags come back as sent), as without an export.
pub fn is_probe(target: &str) -> bool {
    let path = target.split('?').next().unwrap_or("");
    matches!(
        path,
        "/healthz"
            | "/v2/health/live"
            | "/v2/health/ready"
            | "/inference.GRPCInferenceService/ServerLive"
            | "/inference.GRPCInferenceService/ServerReady"
            | "/inference.GRPCInferenceService/ModelReady"
    ) || (path.starts_with("/v2/models/") && path.ends_with("/ready"))
}

/// The SERVER span's name (in parts) and, written by the returned closure, its protocol's
/// attributes: the HTTP method and route (the path with the model's name and version as
/// templates), or the gRPC service and method.
fn name_and_protocol<'a>(
    r: &'a Record,
    route: &'a str,
) -> ([&'a str; 3], impl Fn(&mut Vec<u8>) + 'a) {
    let path = r.target.split('?').next().unwrap_or("");
    let a = otlp::SPAN_ATTRIBUTES;
    let grpc = path
        .strip_prefix("/inference.")
        .map(|full| full.split_once('/').unwrap_or((full, "")))
        .map(|(service, method)| (&path[1.."/inference.".len() + service.len()], method));
    let name = match grpc {
        Some(_) => [path.trim_start_matches('/'), "", ""],
        None => [r.method.as_str(), " ", route],
    };
    let write = move |b: &mut Vec<u8>| match grpc {
        Some((service, method)) => {
            otlp::attribute(b, a, "rpc.system", Value::Str("grpc"));
            otlp::attribute(b, a, "rpc.service", Value::Str(service));
            otlp::attribute(b, a, "rpc.method", Value::Str(method));
        }
        None => {
            otlp::attribute(b, a, "http.request.method", Value::Str(&r.method));
            otlp::attribute(b, a, "url.path", Value::Str(path));
            otlp::attribute(b, a, "http.route", Value::Str(route));
            let status = Value::Int(r.status.into());
            otlp::attribute(b, a, "http.response.status_code", status);
        }
    };
    (name, write)
}

/// `/v2/models/NAME[/versions/V]/…` with the name and version as templates; other paths as
/// they are (they name no data).
fn route(path: &str) -> std::borrow::Cow<'_, str> {
    let Some(rest) = path.strip_prefix("/v2/models/") else {
        return path.into();
    };
    let mut parts: Vec<&str> = rest.split('/').collect();
    if !parts.is_empty() {
        parts[0] = "{model_name}";
    }
    if parts.len() > 2 && parts[1] == "versions" {
        parts[2] = "{model_version}";
    }
    format!("/v2/models/{}", parts.join("/")).into()
}

/// A request's trace id and its SERVER span's id.
struct Ids {
    trace: [u8; 16],
    server: [u8; 8],
}

/// The SERVER span of `r` and, for a model request, its tokenize or preprocess span and
/// each pass's queue and forward spans, then its answer span, written into `out` as an
/// export's entries; how many. `worker`: this worker's pid and slot, and the sibling's seat
/// when the call was handed to it.
fn spans_of(
    r: &Record,
    passes: &[crate::observe::access_log::Timing],
    ids: &Ids,
    worker: (u32, u32, Option<u32>),
    out: &mut Vec<u8>,
) -> usize {
    let end = r.time;
    let start = end.checked_sub(r.total).unwrap_or(end);
    server_span(r, passes, ids, worker, (start, end), out);
    1 + children(r, passes, ids, (start, end), out)
}

/// The SERVER span of `r`, from `start` to `end`.
fn server_span(
    r: &Record,
    passes: &[crate::observe::access_log::Timing],
    ids: &Ids,
    worker: (u32, u32, Option<u32>),
    (start, end): (SystemTime, SystemTime),
    out: &mut Vec<u8>,
) {
    let (pid, slot, handoff) = worker;
    let path = r.target.split('?').next().unwrap_or("");
    let route = route(path);
    let (name, protocol) = name_and_protocol(r, &route);
    let parent: Option<[u8; 8]> = r.context.parent_span_id().map(otlp::hex_bytes);
    let server = otlp::Span {
        trace_id: &ids.trace,
        span_id: &ids.server,
        parent: parent.as_ref().map_or(&[], |p| p),
        name: &name,
        kind: otlp::KIND_SERVER,
        start_unix_nano: otlp::unix_nanos(start),
        end_unix_nano: otlp::unix_nanos(end),
        error: r.status >= 400,
    };
    otlp::span(out, &server, |b| {
        let a = otlp::SPAN_ATTRIBUTES;
        protocol(b);
        otlp::attribute(b, a, "vramfork.request_id", Value::Str(&r.request_id));
        otlp::attribute(b, a, "process.pid", Value::Int(pid.into()));
        otlp::attribute(b, a, "vramfork.worker.slot", Value::Int(slot.into()));
        if let Some(lane) = r.trace.as_deref().and_then(Trace::lane_name) {
            otlp::attribute(b, a, "vramfork.priority.lane", Value::Str(lane));
        }
        if let Some(t) = passes.last() {
            otlp::attribute(b, a, "vramfork.batch.size", Value::Int(t.batch.into()));
            if let Some(p) = &t.pass {
                let (mut th, mut sh) = ([0u8; 32], [0u8; 16]);
                let (trace, span) = pass::PassSpan::of(p).ids();
                let trace = Value::Str(otlp::hex_str(trace, &mut th));
                otlp::attribute(b, a, "vramfork.pass.trace_id", trace);
                let span = Value::Str(otlp::hex_str(span, &mut sh));
                otlp::attribute(b, a, "vramfork.pass.span_id", span);
            }
        }
        if r.status >= 400 {
            let code = r.status.to_string();
            otlp::attribute(b, a, "error.type", Value::Str(&code));
        }
        if let Some(seat) = handoff {
            otlp::attribute(b, a, "vramfork.handoff.seat", Value::Int(seat.into()));
        }
    });
}

/// The children of `r`'s SERVER span (`start` to `end`): its tokenize or preprocess span,
/// each pass's queue and forward spans, then its answer span; how many.
fn children(
    r: &Record,
    passes: &[crate::observe::access_log::Timing],
    ids: &Ids,
    (start, end): (SystemTime, SystemTime),
    out: &mut Vec<u8>,
) -> usize {
    let mut n = 0;
    let mut child = |name: &str, from: SystemTime, to: SystemTime, attributes: &[(&str, Value)]| {
        let id = crate::request_id::unique().max(1).to_be_bytes();
        let span = otlp::Span {
            trace_id: &ids.trace,
            span_id: &id,
            parent: &ids.server,
            name: &[name],
            kind: otlp::KIND_INTERNAL,
            start_unix_nano: otlp::unix_nanos(from.min(end)),
            end_unix_nano: otlp::unix_nanos(to.min(end)),
            error: false,
        };
        otlp::span(out, &span, |b| {
            for (k, v) in attributes {
                otlp::attribute(b, otlp::SPAN_ATTRIBUTES, k, *v);
            }
        });
        n += 1;
    };
    if let Some(t) = r.trace.as_ref().and_then(|t| t.tokenize()) {
        let from = start + t.after;
        let counts = [
            ("vramfork.tokenize.inputs", Value::Int(t.inputs.into())),
            ("vramfork.tokenize.tokens", Value::Int(t.tokens as i64)),
            (
                "vramfork.tokenize.truncated",
                Value::Int(t.truncated.into()),
            ),
        ];
        child("tokenize", from, from + t.took, &counts);
    }
    if let Some(p) = r.trace.as_ref().and_then(|t| t.preprocess()) {
        let from = start + p.after;
        let counts = [
            ("vramfork.preprocess.texts", Value::Int(p.texts.into())),
            ("vramfork.preprocess.images", Value::Int(p.images.into())),
        ];
        child("preprocess", from, from + p.took, &counts);
    }
    let mut done = None;
    for t in passes {
        // The pass began `began` after arrival; its wait (listen and model queue, less
        // reading, parsing and pre-processing the body) ends there.
        let ran = (start + t.began).min(end);
        let ended = (ran + t.took).min(end);
        let queued = ran.checked_sub(t.waited).unwrap_or(start).max(start);
        child("queue", queued, ran, &[]);
        // A batched pass is one span of its own (`pass.rs`), not a child of each member.
        if t.pass.is_none() {
            let mut attributes = vec![
                ("vramfork.batch.size", Value::Int(t.batch.into())),
                ("vramfork.inline", Value::Bool(t.inline)),
            ];
            if let Some((real, padded)) = t.tokens {
                attributes.extend([
                    ("vramfork.pass.tokens", Value::Int(real as i64)),
                    ("vramfork.pass.padded_tokens", Value::Int(padded as i64)),
                    (
                        "vramfork.pass.padding_efficiency",
                        Value::Double(real as f64 / padded.max(1) as f64),
                    ),
                ]);
            }
            child("forward", ran, ended, &attributes);
        }
        done = Some(ended);
    }
    if let Some(done) = done {
        child("answer", done, end, &[]);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_health_and_readiness_only() {
        for p in [
            "/healthz",
            "/healthz?x=1",
            "/v2/health/live",
            "/v2/health/ready",
            "/v2/models/mlp/ready",
            "/v2/models/mlp/versions/3/ready",
            "/inference.GRPCInferenceService/ServerLive",
            "/inference.GRPCInferenceService/ServerReady",
            "/inference.GRPCInferenceService/ModelReady",
        ] {
            assert!(is_probe(p), "{p}");
        }
        for p in [
            "/",
            "/v2/models/mlp/infer",
            "/v2/models/mlp",
            "/v2",
            "/v1/embeddings",
            "/metrics",
            "/inference.GRPCInferenceService/ModelInfer",
        ] {
            assert!(!is_probe(p), "{p}");
        }
    }

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
