//! A batched forward pass as one span: the model thread hands each pass of several requests
//! to every member with its outputs ([`SharedPass`], plain timings); the first member that
//! asks attaches a [`PassSpan`] to it ([`PassSpan::of`]: its ids); each sampled member, once
//! answered and recorded, adds a link to its SERVER span ([`PassSpan::link`]); when the last
//! member lets go of the pass, the pass's `forward` span is queued for export with those
//! links (none sampled: nothing). Its trace is a new one of its
//! own (a root span): the OpenTelemetry specification's model of a batch, a span "initiated
//! by multiple initiating spans" that links to each of them
//! (<https://github.com/open-telemetry/opentelemetry-specification/blob/main/specification/overview.md#links-between-spans>),
//! so that no member's trace is credited with the others' work.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::runner::SharedPass;

use super::export::Exporter;
use super::otlp::{self, Value};

/// One batched pass: its ids, its time, and the links its members add.
pub struct PassSpan {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    start: SystemTime,
    took: Duration,
    requests: u32,
    rows: u32,
    sink: Mutex<Sink>,
}

/// A member's SERVER span: its trace and span ids, and its request id.
type Member = ([u8; 16], [u8; 8], String);

#[derive(Default)]
struct Sink {
    links: Vec<Member>,
    /// Where the span goes: set by the first member that links to it.
    exporter: Option<Arc<Exporter>>,
}

impl PassSpan {
    /// The span of `pass`, made the first time a member asks.
    pub fn of(pass: &SharedPass) -> &PassSpan {
        pass.attached(|p| PassSpan::new(p.start, p.took, p.requests, p.rows))
    }

    /// A pass of `requests` requests and `rows` rows that started at `start` and took `took`.
    fn new(start: SystemTime, took: Duration, requests: u32, rows: u32) -> PassSpan {
        let id = || crate::request_id::unique().max(1).to_be_bytes();
        let mut trace_id = [0u8; 16];
        trace_id[..8].copy_from_slice(&id());
        trace_id[8..].copy_from_slice(&id());
        PassSpan {
            trace_id,
            span_id: id(),
            start,
            took,
            requests,
            rows,
            sink: Mutex::new(Sink::default()),
        }
    }

    /// Its trace id and span id.
    pub fn ids(&self) -> (&[u8; 16], &[u8; 8]) {
        (&self.trace_id, &self.span_id)
    }

    /// A member's SERVER span (`trace_id`, `span_id` as bytes), to link to.
    pub(super) fn link(
        &self,
        trace_id: [u8; 16],
        span_id: [u8; 8],
        request_id: &str,
        exporter: &Arc<Exporter>,
    ) {
        let mut s = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        s.links.push((trace_id, span_id, request_id.to_string()));
        s.exporter.get_or_insert_with(|| exporter.clone());
    }
}

impl Drop for PassSpan {
    /// Its pass's last member is done with it: its span goes to the exporter, if any member
    /// linked.
    fn drop(&mut self) {
        let s = std::mem::take(self.sink.get_mut().unwrap_or_else(|p| p.into_inner()));
        let Some(exporter) = s.exporter else {
            return;
        };
        let span = otlp::Span {
            trace_id: &self.trace_id,
            span_id: &self.span_id,
            parent: &[],
            name: &["forward"],
            kind: otlp::KIND_INTERNAL,
            start_unix_nano: otlp::unix_nanos(self.start),
            end_unix_nano: otlp::unix_nanos(self.start + self.took),
            error: false,
        };
        let mut body = Vec::with_capacity(160 + 64 * s.links.len());
        otlp::span_body(&mut body, &span, |b| {
            let a = otlp::SPAN_ATTRIBUTES;
            otlp::attribute(
                b,
                a,
                "vramfork.batch.size",
                Value::Int(self.requests.into()),
            );
            otlp::attribute(b, a, "vramfork.batch.rows", Value::Int(self.rows.into()));
            otlp::attribute(b, a, "vramfork.inline", Value::Bool(false));
            for (trace_id, span_id, request_id) in &s.links {
                otlp::link(b, trace_id, span_id, "vramfork.request_id", request_id);
            }
        });
        exporter.push(body);
    }
}

impl std::fmt::Debug for PassSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassSpan")
            .field("span_id", &otlp::hex_str(&self.span_id, &mut [0u8; 16]))
            .field("requests", &self.requests)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_not_zero_and_differ_between_passes_and_a_pass_has_one_span() {
        let pass = SharedPass::new(SystemTime::now(), Duration::from_millis(1), 4, 4);
        let p = PassSpan::of(&pass);
        let (t, s) = p.ids();
        assert!(t.iter().any(|b| *b != 0) && s.iter().any(|b| *b != 0));
        assert_eq!(PassSpan::of(&pass).ids(), (t, s), "one span per pass");
        let other = SharedPass::new(SystemTime::now(), Duration::ZERO, 2, 2);
        let q = PassSpan::of(&other);
        assert_ne!(t, q.ids().0);
        assert_ne!(s, q.ids().1);
    }
}
